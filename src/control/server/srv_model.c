/* The server's model in memory: the names of states, kinds and policies,
 * looking jobs and nodes up, and adding a job to the tables.  Nothing here
 * changes a state (state.c does) or calls anything above it, so that the
 * seam and the database may use it. */
#include "srv_int.h"

#include <stdlib.h>
#include <string.h>

static const char *const job_states[] = {"pending",   "starting", "running",
                                         "succeeded", "failed",   "cancelled"};
static const char *const member_states[] = {"assigned", "ready", "running",
                                            "exited",   "lost",  "stopped"};
const char *const srv__kinds[3] = {"gang", "elastic", "function"};
const char *const srv__policies[3] = {"requeue", "replace", "fail"};

const char *srv__job_state_name(int st) { return st >= 0 && st < J_NSTATES ? job_states[st] : "?"; }
const char *srv__member_state_name(int st) { return st >= 0 && st <= M_STOPPED ? member_states[st] : "?"; }
const char *srv__kind_name(int k) { return k >= 0 && k <= K_FUNCTION ? srv__kinds[k] : "?"; }
const char *srv__policy_name(int p) { return p >= 0 && p <= P_FAIL ? srv__policies[p] : "?"; }

srv_job *srv__job(srv *s, int64_t id)
{
    return id > 0 && id <= s->njobs ? s->jobs[id] : NULL;
}

int srv__node_find(srv *s, const char *name)
{
    for (int i = 0; i < s->nnodes; i++)
        if (!strcmp(s->nodes[i].name, name)) return i;
    return -1;
}

void srv__job_free(srv_job *j)
{
    if (!j) return;
    json_decref(j->spec);
    free(j->mem);
    free(j);
}

int srv__active_add(srv *s, int64_t id)
{
    if (s->nactive == s->cap_active) {
        int64_t cap = s->cap_active ? 2 * s->cap_active : 256;
        int64_t *na = realloc(s->active, (size_t)cap * sizeof *na);
        if (!na) return sh_err(SH_ENOMEM, "active job list");
        s->active = na;
        s->cap_active = cap;
    }
    s->active[s->nactive++] = id;
    return SH_OK;
}

/* Takes ownership of j; j->id must be the next id or one loaded from disk. */
int srv__job_add(srv *s, srv_job *j)
{
    if (j->id >= s->cap_jobs) {
        int64_t cap = s->cap_jobs ? s->cap_jobs : 1024;
        while (cap <= j->id) cap *= 2;
        srv_job **nj = realloc(s->jobs, (size_t)cap * sizeof *nj);
        if (!nj) return sh_err(SH_ENOMEM, "job table");
        memset(nj + s->cap_jobs, 0, (size_t)(cap - s->cap_jobs) * sizeof *nj);
        s->jobs = nj;
        s->cap_jobs = cap;
    }
    s->jobs[j->id] = j;
    if (j->id > s->njobs) s->njobs = j->id;
    if (j->idem[0]) {
        char k[sizeof j->tenant + sizeof j->idem + 2];
        snprintf(k, sizeof k, "%s/%s", j->tenant, j->idem);
        if (!s->idem_index) s->idem_index = json_object();
        if (!s->idem_index || json_object_set_new(s->idem_index, k, json_integer(j->id)))
            return sh_err(SH_ENOMEM, "job %lld: the idempotency index", (long long)j->id);
    }
    if (j->state <= J_RUNNING) return srv__active_add(s, j->id);
    return SH_OK;
}
