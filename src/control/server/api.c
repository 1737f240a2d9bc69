/* The JSON endpoints of docs/server-api.md.  srv__handle() runs with srv.mu
 * held and returns 0 with *status and *reply set, or a negative SH_E* code
 * that http.c turns into a JSON error. */
#include "srv_int.h"
#include "db_int.h"
#include "seam_int.h"
#include "state_int.h"
#include "files_int.h"
#include "handlers_int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <microhttpd.h>

static const char *query(srv_req *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

typedef struct qcheck {
    const char *const *allowed;
    const char *bad;
} qcheck;

static enum MHD_Result qcheck_one(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    qcheck *q = cls;
    for (int i = 0; q->allowed && q->allowed[i]; i++)
        if (!strcmp(key, q->allowed[i])) return MHD_YES;
    q->bad = key;
    return MHD_NO;
}

/* Refuses a query parameter the endpoint does not take: a typo such as
 * "?limt=5" must not silently mean "no limit". */
static int query_only(srv_req *r, const char *const *allowed)
{
    qcheck q = {allowed, NULL};
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, qcheck_one, &q);
    if (!q.bad) return SH_OK;
    sh_buf b = {0};
    for (int i = 0; allowed && allowed[i]; i++) sh_buf_printf(&b, "%s%s", i ? ", " : "", allowed[i]);
    int rc = sh_err(SH_EINVAL, "%s: unknown query parameter \"%s\" (this endpoint takes: %s)", r->path, q.bad,
                    b.data ? (char *)b.data : "none");
    sh_buf_free(&b);
    return rc;
}

/* An integer query parameter within lo..hi; absent: def. */
static int query_i64(srv_req *r, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    const char *v = query(r, key);
    *out = def;
    if (!v) return SH_OK;
    if (sh_parse_i64(v, out, key) < 0 || *out < lo || *out > hi)
        return sh_err(SH_EINVAL, "%s: query parameter %s=\"%s\": expected an integer in %lld..%lld", r->path, key,
                      v, (long long)lo, (long long)hi);
    return SH_OK;
}

/* A tenant sees only its own jobs; others' look like missing ones, so that a
 * job id reveals nothing about another tenant. */
static srv_job *visible_job(srv *s, srv_req *r, int64_t id)
{
    srv_job *j = srv__job(s, id);
    if (!j) return NULL;
    if (r->role == ROLE_TENANT && strcmp(j->tenant, r->tenant)) return NULL;
    return j;
}

static int check_writable(srv *s, const srv_job *j);

/* Bytes a tenant's pending and running jobs hold (their job files plus the
 * server's record of each). */
static uint64_t queued_bytes(srv *s, const char *tenant)
{
    uint64_t n = 0;
    for (int64_t a = 0; a < s->nactive; a++) {
        const srv_job *o = srv__job(s, s->active[a]);
        if (o && o->state <= J_RUNNING && !strcmp(o->tenant, tenant)) n += o->spec_bytes + SRV_JOB_COST;
    }
    return n;
}

static int submit(srv *s, srv_req *r, int *status, json_t **reply)
{
    if (r->role != ROLE_TENANT && r->role != ROLE_ADMIN)
        return sh_err(SH_EPERM, "only tenants and the admin submit jobs");
    srv_job *j = r->job;
    r->job = NULL; /* parsed and validated before the lock was taken */
    if (!j) return sh_err(SH_EINTERNAL, "submit without a parsed job");
    int rc = check_writable(s, j);
    const char *wd = json_string_value(json_object_get(j->spec, "workdir"));
    if (rc == SH_OK && wd && !srv__workdir_exists(s, j->tenant, wd))
        rc = sh_err(SH_EINVAL, "job: field \"workdir\": tenant %s uploaded no work dir %s (`shoal submit --workdir DIR`"
                               " uploads it first)", j->tenant, wd);
    if (rc < 0) {
        srv__job_free(j);
        return rc;
    }
    /* A job of higher priority goes first and may preempt lower-priority
     * work of every tenant: how high a tenant may ask is the operator's
     * (--max-priority; by default 0, the priority of a job that asks for
     * none, so that no tenant preempts another's work by default). */
    if (r->role == ROLE_TENANT) {
        json_t *cap = json_object_get(s->prio_max, j->tenant);
        int max = cap ? (int)json_integer_value(cap) : s->prio_default;
        if (j->priority > max) {
            char msg[300];
            snprintf(msg, sizeof msg, "job: field \"priority\": %d is above tenant %s's limit of %d (set by the"
                                      " operator: shoal server --max-priority); a higher priority may preempt"
                                      " other tenants' work", j->priority, j->tenant, max);
            srv__job_free(j);
            *status = 403;
            *reply = json_pack("{s:s,s:s,s:i}", "error", msg, "reason", "priority_over_limit", "max_priority", max);
            return SH_OK;
        }
    }
    int64_t dup = j->idem[0] ? srv__db_idem(s, j->tenant, j->idem) : 0;
    if (dup && srv__job(s, dup)) {
        /* A retried submit (same idempotency key) gets the job it created. */
        srv__job_free(j);
        *status = 200;
        *reply = srv__job_json(s, srv__job(s, dup), 0, r->tenant);
        json_object_set_new(*reply, "duplicate", json_true());
        return SH_OK;
    }
    /* Every job a tenant queues stays in the server's memory and database:
     * without a bound, one tenant's submits (1 MiB job files at 8 a
     * second) fill both.  The admin's jobs are not counted. */
    uint64_t held = r->role == ROLE_TENANT ? queued_bytes(s, j->tenant) : 0;
    if (r->role == ROLE_TENANT && held + j->spec_bytes + SRV_JOB_COST > s->cfg.max_queued) {
        char msg[300];
        snprintf(msg, sizeof msg, "tenant %s: its pending and running jobs hold %llu bytes, and this one would pass"
                                  " the server's limit of %llu: wait for some to end, or cancel some",
                 j->tenant, (unsigned long long)held, (unsigned long long)s->cfg.max_queued);
        srv__job_free(j);
        *status = 429;
        *reply = json_pack("{s:s,s:s}", "error", msg, "reason", "tenant_queue_full");
        return SH_OK;
    }
    char why[400];
    j->id = s->njobs + 1;
    rc = srv__seam_submit(s, j, why, sizeof why);
    if (rc != 0) {
        /* The core forgot it: the id goes to the next job, which keeps
         * ids dense across a restart (they come from the database). */
        srv__job_free(j);
        if (rc < 0) return rc;
        s->rejects++;
        *status = 422;
        *reply = json_pack("{s:s,s:s}", "error", why, "reason", "never_fits");
        return SH_OK;
    }
    j->state = J_PENDING;
    j->t_submit = sh_now_wall();
    SH_TRY(srv__job_add(s, j));
    srv_new_run nr = {0};
    rc = srv__db_begin(s);
    if (rc == SH_OK) rc = srv__run_prepare(s, j, &nr);
    if (rc == SH_OK && nr.create) rc = srv__db_run(s, nr.tenant, nr.run, nr.secret, nr.token);
    if (rc == SH_OK) rc = srv__db_job(s, j);
    if (rc == SH_OK) rc = srv__db_event(s, j->id, NULL, "submitted", "%s by %s", j->name, j->tenant);
    if (rc == SH_OK) rc = srv__commit(s);
    if (rc < 0) {
        /* Not durable, so not accepted: forget it (it is the newest job). */
        srv__rollback(s);
        srv__seam_end(s, j, 1);
        s->jobs[j->id] = NULL;
        s->njobs--;
        s->nactive--;
        srv__job_free(j);
        return rc;
    }
    srv__run_commit(s, &nr); /* durable now: its ranks get its secret and token */
    s->submits++;
    srv__changed(s);
    *status = 201;
    *reply = srv__job_json(s, j, 0, r->tenant);
    return SH_OK;
}

static int list_jobs(srv *s, srv_req *r, json_t **reply)
{
    static const char *const keys[] = {"state", "limit", NULL};
    SH_TRY(query_only(r, keys));
    const char *state = query(r, "state");
    int64_t limit;
    SH_TRY(query_i64(r, "limit", 100, 1, 100000, &limit));
    int known = !state || !strcmp(state, "active") || !strcmp(state, "finished");
    for (int i = 0; i < J_NSTATES && !known; i++) known = !strcmp(state, srv__job_state_name(i));
    if (!known)
        return sh_err(SH_EINVAL, "/v1/jobs: query parameter state=\"%s\": expected active, finished, pending,"
                                 " starting, running, succeeded, failed or cancelled", state);
    json_t *a = json_array();
    for (int64_t id = s->njobs; id >= 1 && (int64_t)json_array_size(a) < limit; id--) {
        srv_job *j = visible_job(s, r, id);
        if (!j) continue;
        if (state && strcmp(state, srv__job_state_name(j->state)) &&
            !(!strcmp(state, "active") && j->state <= J_RUNNING) &&
            !(!strcmp(state, "finished") && j->state > J_RUNNING))
            continue;
        json_array_append_new(a, srv__job_json(s, j, 0, r->tenant));
    }
    *reply = json_pack("{s:o}", "jobs", a);
    return SH_OK;
}

static int job_logs(srv *s, srv_req *r, srv_job *j, json_t **reply)
{
    static const char *const keys[] = {"rank", "offset", NULL};
    SH_TRY(query_only(r, keys));
    int64_t rank, off;
    SH_TRY(query_i64(r, "rank", 0, 0, 63, &rank));
    SH_TRY(query_i64(r, "offset", 0, 0, INT64_MAX, &off));
    /* A rank the job can never have is a mistake to name, not an empty log
     * (an elastic job's ranks go up to its max_nodes). */
    if (rank >= j->nodes)
        return sh_err(SH_EINVAL, "%s: job %lld has %d rank(s), 0..%d; there is no rank %lld", r->path,
                      (long long)j->id, j->nodes, j->nodes - 1, (long long)rank);
    char path[4200];
    SH_TRY(srv__log_path(s, j->id, (int)rank, path, sizeof path));
    sh_buf b = {0};
    uint64_t next = (uint64_t)off;
    int rc = srv__log_read(path, (uint64_t)off, 1 << 20, &b, &next);
    if (rc < 0) {
        sh_buf_free(&b);
        return rc;
    }
    json_t *data = json_stringn(b.data ? (char *)b.data : "", b.len);
    if (!data) {
        /* Bytes no JSON string holds (a log an older server cut inside a
         * character): shown as '?', never as an empty reply. */
        for (size_t i = 0; i < b.len; i++)
            if (b.data[i] >= 0x80) b.data[i] = '?';
        data = json_stringn((char *)b.data, b.len);
    }
    *reply = json_pack("{s:o,s:I,s:b,s:s}", "data", data, "offset", (json_int_t)next, "done",
                       j->state > J_RUNNING, "state", srv__job_state_name(j->state));
    sh_buf_free(&b);
    return SH_OK;
}

json_t *srv__costs(srv *s, const char *tenant)
{
    json_t *by = srv__db_costs(s, tenant);
    double now = sh_now_mono();
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        if (!j || j->state > J_RUNNING || (tenant && strcmp(tenant, j->tenant))) continue;
        char id[24];
        snprintf(id, sizeof id, "%lld", (long long)j->id);
        sched_place pl[64];
        size_t n = sched_job_alloc(s->sc, id, pl, 64);
        const char *seen[64];
        size_t nseen = 0;
        for (size_t i = 0; i < n && i < 64; i++) {
            int ni = srv__node_find(s, pl[i].node);
            if (ni < 0) continue;
            const char *type = s->nodes[ni].gpu_type;
            size_t k = 0;
            while (k < nseen && strcmp(seen[k], type)) k++;
            if (k < nseen) continue; /* this type of the job is counted */
            seen[nseen++] = type;
            double gs, c = sched_cost_job_open(s->sc, id, type, now, &gs);
            json_t *t = json_object_get(by, j->tenant);
            if (!t) json_object_set_new(by, j->tenant, t = json_object());
            json_t *g = json_object_get(t, type);
            if (!g) json_object_set_new(t, type, g = json_pack("{s:f,s:f}", "dollars", 0.0, "gpu_seconds", 0.0));
            json_object_set_new(g, "dollars", json_real(json_real_value(json_object_get(g, "dollars")) + c));
            json_object_set_new(g, "gpu_seconds", json_real(json_real_value(json_object_get(g, "gpu_seconds")) + gs));
        }
    }
    double total = 0;
    const char *k1, *k2;
    json_t *t, *g;
    json_object_foreach(by, k1, t) json_object_foreach(t, k2, g) total += json_real_value(json_object_get(g, "dollars"));
    return json_pack("{s:o,s:f}", "by_tenant", by, "total_dollars", total);
}

static json_t *nodes_json(srv *s, srv_req *r)
{
    json_t *a = srv__nodes_json(s, r->tenant);
    return a ? a : json_array();
}

static int overview(srv *s, srv_req *r, json_t **reply)
{
    json_t *jobs = json_array();
    int recent = 0;
    for (int64_t id = s->njobs; id >= 1; id--) {
        srv_job *j = visible_job(s, r, id);
        if (!j) continue;
        if (j->state > J_RUNNING && recent++ >= 30) continue;
        if (j->state <= J_RUNNING || recent <= 30) json_array_append_new(jobs, srv__job_json(s, j, 0, r->tenant));
        if (json_array_size(jobs) >= 500) break;
    }
    *reply = json_pack("{s:o,s:o,s:o,s:s,s:f}", "nodes", nodes_json(s, r), "jobs", jobs, "costs",
                       srv__costs(s, r->tenant), "viewer", r->tenant ? r->tenant : "admin", "now", sh_now_wall());
    return SH_OK;
}

static int job_routes(srv *s, srv_req *r, const char *rest, int *status, json_t **reply)
{
    char *end;
    long long id = strtoll(rest, &end, 10);
    if (end == rest || id <= 0) return sh_err(SH_ENOENT, "no such job \"%s\"", rest);
    srv_job *j = visible_job(s, r, id);
    if (!j) return sh_err(SH_ENOENT, "no such job %lld", id);
    int get = !strcmp(r->method, "GET");
    if (!(!strcmp(end, "/logs") && get)) SH_TRY(query_only(r, NULL));
    if (!*end && get) {
        *reply = srv__job_json(s, j, 1, r->tenant);
        return SH_OK;
    }
    if ((!strcmp(end, "/cancel") && !strcmp(r->method, "POST")) || (!*end && !strcmp(r->method, "DELETE"))) {
        SH_TRY(srv__db_begin(s));
        srv_undo u;
        srv__undo_begin(s, &u);
        int rc = srv__undo_job(s, &u, j);
        if (rc == SH_OK) rc = srv__cancel(s, j, r->tenant ? r->tenant : "admin");
        if (rc == SH_OK) rc = srv__seam_prebill(s);
        if (rc == SH_OK) rc = srv__commit(s);
        if (rc < 0) srv__rollback(s);
        srv__undo_end(s, &u, rc == SH_OK);
        if (rc < 0) return sh_err_wrap(rc, "job %lld was not cancelled and its ranks keep running", id);
        *reply = srv__job_json(s, j, 0, r->tenant);
        return SH_OK;
    }
    if (!strcmp(end, "/logs") && get) return job_logs(s, r, j, reply);
    if (!strcmp(end, "/events") && get) {
        *reply = json_pack("{s:o}", "events", srv__db_events(s, 0, NULL, j->id, 1000));
        return SH_OK;
    }
    *status = 405;
    return sh_err(SH_ENOENT, "%s %s: no such endpoint (see docs/server-api.md)", r->method, r->path);
}

static int agent_routes(srv *s, srv_req *r, json_t **reply)
{
    int reg = !strcmp(r->path, "/v1/agent/register"), poll = !strcmp(r->path, "/v1/agent/poll");
    if (reg && r->role != ROLE_JOIN)
        return sh_err(SH_EPERM, "%s: needs the agent token (\"agent\" in the tokens file)%s", r->path,
                      r->role == ROLE_ADMIN ? "; the admin token does not reach the agent API" : "");
    if (poll && r->role != ROLE_NODE)
        return sh_err(SH_EPERM, "%s: needs a node's credential, which its agent gets by registering with the agent token%s", r->path,
                      r->role == ROLE_ADMIN ? "; the admin token does not reach the agent API" : "");
    if (strcmp(r->method, "POST") || (!reg && !poll)) return sh_err(SH_ENOENT, "%s %s: no such endpoint", r->method, r->path);
    SH_TRY(query_only(r, NULL));
    json_t *b;
    SH_TRY(sh_json_parse(r->body, r->body_len, r->path, &b));
    int rc;
    if (reg) {
        rc = srv__db_begin(s);
        if (rc == SH_OK) rc = srv__agent_register(s, b, reply);
        if (rc == SH_OK) rc = srv__commit(s);
        else srv__rollback(s);
    } else rc = srv__agent_poll(s, r->node, b, reply);
    json_decref(b);
    return rc;
}

/* Whether a job of a tenant other than `tenant` (the admin's aside) named
 * in its "writable" the directory p, one inside it or one above it.  The
 * jobs of every state count, the server's whole history: a directory is
 * its first tenant's for good. */
static int writable_taken(srv *s, const char *p, const char *tenant)
{
    for (int64_t id = 1; id <= s->njobs; id++) {
        const srv_job *o = s->jobs[id];
        if (!o || !strcmp(o->tenant, tenant) || !strcmp(o->tenant, "admin")) continue;
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(o->spec, "writable"), i, v) {
            const char *q = json_string_value(v);
            if (q && (srv__path_under(p, q) || srv__path_under(q, p))) return 1;
        }
    }
    return 0;
}

/* Each "writable" path must be absolute and plain (no "." or ".."
 * components, no doubled or trailing '/'), lie under a directory the admin
 * allows (--allow-writable), not lie in the server's state directory, and,
 * for a tenant's job, not be another tenant's: the agent shows the
 * directory's owner as the rank's uid, so a tenant that named another's
 * directory would read and write its files (checkpoints, data) as its
 * owner.  The first tenant to name a directory keeps it, and what lies
 * above and below it. */
static int check_writable(srv *s, const srv_job *j)
{
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(j->spec, "writable"), i, v) {
        const char *p = json_string_value(v);
        size_t n = strlen(p);
        if (p[0] != '/' || strstr(p, "//") || strstr(p, "/./") || strstr(p, "/../") || (n > 1 && p[n - 1] == '/') ||
            (n >= 2 && !strcmp(p + n - 2, "/.")) || (n >= 3 && !strcmp(p + n - 3, "/..")))
            return sh_err(SH_EINVAL, "job: field \"writable\"[%zu]: \"%s\" is not a plain absolute path", i, p);
        /* A directory that holds the state directory is allowed: agents
         * hide the state directory inside it (the "protect" list). */
        if (srv__path_under(p, s->state_dir))
            return sh_err(SH_EPERM, "job: field \"writable\"[%zu]: \"%s\" lies in the server's state directory %s",
                          i, p, s->state_dir);
        /* Under an entry of this tenant's, and holding no other tenant's
         * folder (a shared folder may hold one). */
        int ok = 0, others = 0, inside = 0;
        char allow[8192], mine[8192] = "";
        snprintf(allow, sizeof allow, "%s", s->cfg.writable_allow ? s->cfg.writable_allow : "");
        for (char *sv = NULL, *a = strtok_r(allow, ":", &sv); a; a = strtok_r(NULL, ":", &sv)) {
            if (!srv__allow_applies(&a, j->tenant)) {
                others |= srv__path_under(a, p);
                /* Reached through a shared folder that holds it, another
                 * tenant's folder is still that tenant's. */
                inside |= srv__path_under(p, a) && strcmp(p, a);
                continue;
            }
            ok |= srv__path_under(p, a);
            size_t m = strlen(mine);
            snprintf(mine + m, sizeof mine - m, "%s%s", m ? ":" : "", a);
        }
        if (others)
            return sh_err(SH_EPERM, "job: field \"writable\"[%zu]: \"%s\" holds a folder the admin gave another "
                                    "tenant; name a directory beside it", i, p);
        if (inside)
            return sh_err(SH_EPERM, "job: field \"writable\"[%zu]: \"%s\" lies in a folder the admin gave another "
                                    "tenant", i, p);
        if (!ok)
            return sh_err(SH_EPERM, "job: field \"writable\"[%zu]: \"%s\" is not under a directory the admin allows"
                                    " your jobs (server option --allow-writable; now: %s)", i, p,
                          *mine ? mine : "none");
        /* Which tenant holds it is not said: that is the other tenant's. */
        if (strcmp(j->tenant, "admin") && writable_taken(s, p, j->tenant))
            return sh_err(SH_EPERM, "job: field \"writable\"[%zu]: \"%s\" is another tenant's (its jobs named it, or a"
                                    " directory in or above it, first): use a directory of your own under %s", i, p, mine);
    }
    return SH_OK;
}

/* An --allow-writable entry is DIR (every tenant's) or TENANT=DIR (that
 * tenant's only).  Splits entry in place: returns the directory and sets
 * *owner to the tenant, or NULL for a shared folder. */
char *srv__allow_split(char *entry, const char **owner)
{
    char *eq = entry[0] != '/' ? strchr(entry, '=') : NULL;
    *owner = NULL;
    if (!eq) return entry;
    *eq = 0;
    *owner = entry;
    return eq + 1;
}

/* Whether *entry applies to `tenant` (the admin's jobs may use every
 * entry); it is left pointing at the directory. */
int srv__allow_applies(char **entry, const char *tenant)
{
    const char *a;
    *entry = srv__allow_split(*entry, &a);
    return !a || !strcmp(tenant, "admin") || !strcmp(a, tenant);
}

int srv__path_under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n == 1 && dir[0] == '/') return path[0] == '/';
    return n > 0 && !strncmp(path, dir, n) && (path[n] == '/' || path[n] == 0);
}

static int delete_node(srv *s, srv_req *r, const char *name, json_t **reply)
{
    if (r->role != ROLE_ADMIN) return sh_err(SH_EPERM, "only the admin removes nodes");
    int idx = srv__node_find(s, name);
    if (idx < 0) return sh_err(SH_ENOENT, "no such node \"%s\"", name);
    SH_TRY(srv__db_begin(s));
    int rc = srv__node_dead(s, idx, "removed by the admin");
    if (rc == SH_OK) {
        s->nodes[idx].state = NODE_GONE;
        rc = srv__db_node(s, &s->nodes[idx]);
    }
    if (rc == SH_OK && srv__seam_node(s, idx, SEAM_GONE) < 0) sh_warn("node %s: %s", name, sh_errmsg());
    if (rc == SH_OK) rc = srv__commit(s);
    else srv__rollback(s);
    SH_TRY(rc);
    *reply = json_pack("{s:s,s:s}", "node", name, "state", "gone");
    return SH_OK;
}

/* The part of a submit that needs no lock: parsing and validating the job
 * file, so that concurrent submits contend only for the durable write. */
int srv__presubmit(const srv_config *cfg, srv_req *r)
{
    if (strcmp(r->path, "/v1/jobs") || strcmp(r->method, "POST") || (r->role != ROLE_TENANT && r->role != ROLE_ADMIN))
        return SH_OK;
    json_t *spec;
    SH_TRY(sh_json_parse(r->body, r->body_len, "job", &spec));
    if (r->idem_header && *r->idem_header && json_is_object(spec) && !json_object_get(spec, "idempotency_key"))
        json_object_set_new(spec, "idempotency_key", json_string(r->idem_header));
    int rc = srv__job_from_spec(spec, r->tenant ? r->tenant : "admin", &r->job);
    /* est_s is the job's time limit (srv__time_limits); checked here, not in
     * srv__job_from_spec, so that a database written before the bound still
     * loads. */
    json_t *est = json_object_get(spec, "est_s");
    if (rc == SH_OK && est && json_number_value(est) > SRV_MAX_EST_S)
        rc = sh_err(SH_ERANGE, "job: field \"est_s\": %g s is over 30 days (%g s); it is also the job's "
                               "time limit, so give the longest an attempt may run",
                    json_number_value(est), SRV_MAX_EST_S);
    if (rc == SH_OK && !est && cfg->require_est)
        rc = sh_err(SH_EFORMAT, "job: field \"est_s\" is required by this server (--require-est): give the "
                                "longest an attempt may run, in seconds");
    if (rc < 0 && r->job) {
        srv__job_free(r->job);
        r->job = NULL;
    }
    json_decref(spec);
    if (rc == SH_OK) r->job->spec_bytes = r->body_len;
    return rc;
}

/* /v1/runs/ (runs.c), with the write of a published service here. */
static int run_routes(srv *s, srv_req *r, const char *rest, int *status, json_t **reply)
{
    srv_run_put put;
    int rc = srv__run_routes(s, r, rest, status, reply, &put);
    if (rc < 0 || !put.put) return rc;
    rc = srv__db_begin(s);
    if (rc == SH_OK) rc = srv__db_run_service(s, put.tenant, put.run, put.name, json_string_value(put.value), 0);
    if (rc == SH_OK) rc = srv__commit(s);
    else srv__rollback(s);
    if (rc == SH_OK) srv__run_set(s, &put, reply);
    json_decref(put.value);
    return rc;
}

int srv__handle(srv *s, srv_req *r, int *status, json_t **reply)
{
    const char *p = r->path;
    int get = !strcmp(r->method, "GET");
    *status = 200;
    if (!strncmp(p, "/v1/agent/", 10)) return agent_routes(s, r, reply);
    if (r->role == ROLE_RUN && strncmp(p, "/v1/runs/", 9))
        return sh_err(SH_EPERM, "%s: a run token (SHOAL_RUN_TOKEN) only reaches /v1/runs/%s/", p, r->run);
    if (r->role != ROLE_ADMIN && r->role != ROLE_TENANT && r->role != ROLE_RUN)
        return sh_err(SH_EPERM, "%s: the agent token and node credentials only reach /v1/agent/", p);
    if (!(!strcmp(p, "/v1/jobs") && get) && strncmp(p, "/v1/jobs/", 9) && strcmp(p, "/v1/events"))
        SH_TRY(query_only(r, NULL));
    if (!strncmp(p, "/v1/runs/", 9)) return run_routes(s, r, p + 9, status, reply);
    if (!strcmp(p, "/v1/jobs")) {
        if (!strcmp(r->method, "POST")) return submit(s, r, status, reply);
        if (get) return list_jobs(s, r, reply);
    } else if (!strncmp(p, "/v1/jobs/", 9)) {
        return job_routes(s, r, p + 9, status, reply);
    } else if (!strcmp(p, "/v1/nodes") && get) {
        *reply = json_pack("{s:o}", "nodes", nodes_json(s, r));
        return SH_OK;
    } else if (!strncmp(p, "/v1/nodes/", 10) && !strcmp(r->method, "DELETE")) {
        return delete_node(s, r, p + 10, reply);
    } else if (!strcmp(p, "/v1/events") && get) {
        static const char *const keys[] = {"after", "limit", NULL};
        SH_TRY(query_only(r, keys));
        int64_t limit, after;
        SH_TRY(query_i64(r, "limit", 200, 1, 10000, &limit));
        SH_TRY(query_i64(r, "after", 0, 0, INT64_MAX, &after));
        *reply = json_pack("{s:o}", "events", srv__db_events(s, after, r->tenant, 0, (int)limit));
        return SH_OK;
    } else if (!strcmp(p, "/v1/costs") && get) {
        *reply = srv__costs(s, r->tenant);
        return SH_OK;
    } else if (!strcmp(p, "/v1/overview") && get) {
        return overview(s, r, reply);
    }
    *status = 404;
    return sh_err(SH_ENOENT, "%s %s: no such endpoint (see docs/server-api.md)", r->method, p);
}
