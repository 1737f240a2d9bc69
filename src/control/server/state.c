/* The server's model: jobs, members and nodes, and the transitions between
 * their states.  Every function here runs with srv.mu held and inside a
 * database transaction opened by its caller. */
#include "srv_int.h"
#include "db_int.h"
#include "seam_int.h"
#include "state_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Wakes agents waiting in long polls and the scheduler thread. */
void srv__changed(srv *s)
{
    s->dirty = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_cond_signal(&s->sched_cv);
}

static void node_touch(srv *s, int idx)
{
    if (idx >= 0 && idx < s->nnodes) s->nodes[idx].version++;
}

static void job_touch(srv *s, srv_job *j)
{
    for (int i = 0; i < j->nmem; i++) node_touch(s, j->mem[i].node);
    srv__changed(s);
}

int srv__start(srv *s, srv_job *j, const int *nodes, const uint64_t *masks, int n)
{
    srv_member *mem = calloc((size_t)n, sizeof *mem);
    if (!mem) return sh_err(SH_ENOMEM, "job %lld: members", (long long)j->id);
    free(j->mem);
    j->mem = mem;
    j->nmem = n;
    sh_buf where = {0};
    for (int r = 0; r < n; r++) {
        srv_node *nd = &s->nodes[nodes[r]];
        mem[r].rank = r;
        mem[r].node = nodes[r];
        mem[r].state = M_ASSIGNED;
        mem[r].exit_code = -1;
        mem[r].gpu_mask = masks[r];
        sh_buf_printf(&where, "%s%s", r ? "," : "", nd->name);
    }
    j->state = J_STARTING;
    j->rdzv_port = 0; /* each attempt rendezvouses on a fresh port (agentapi.c) */
    double now = sh_now_wall();
    for (int r = 0; r < n; r++) mem[r].t_placed = now;
    if (j->attempt == 1 && j->t_placed <= 0) srv__observe_wait(s, n, now - j->t_submit);
    j->t_placed = now;
    j->go = j->kind != K_GANG; /* only gangs wait at the barrier */
    j->nprefer = 0;
    int rc = srv__db_job(s, j);
    if (rc == SH_OK) rc = srv__db_members(s, j);
    if (rc == SH_OK)
        rc = srv__db_event(s, j->id, NULL, "placed", "attempt %d on %s", j->attempt,
                           where.data ? (char *)where.data : "");
    sh_buf_free(&where);
    job_touch(s, j);
    return rc;
}

static int member_live(const srv_member *m) { return m->state <= M_RUNNING; }

/* Ends one member's process.  Its GPUs and its bill are the core's: they
 * are released and billed when the core lets the place go (the job ends,
 * shrinks or is stopped; a gang holds every node until it ends). */
int srv__member_end(srv *s, srv_job *j, srv_member *m, int state, int code)
{
    (void)j;
    if (!member_live(m)) return SH_OK;
    m->state = state;
    m->exit_code = code;
    m->t_end = sh_now_wall();
    node_touch(s, m->node);
    return SH_OK;
}

static int stop_live(srv *s, srv_job *j)
{
    for (int i = 0; i < j->nmem; i++) SH_TRY(srv__member_end(s, j, &j->mem[i], M_STOPPED, -1));
    return SH_OK;
}

int srv__finish(srv *s, srv_job *j, int state, int exit_code, const char *reason)
{
    SH_TRY(stop_live(s, j));
    if (s->defer_seam && s->nseam_queue < (int)(sizeof s->seam_queue / sizeof s->seam_queue[0])) {
        s->seam_queue[s->nseam_queue] = j->id;
        s->seam_queue_t[s->nseam_queue] = sh_now_mono();
        s->seam_queue_billed[s->nseam_queue] = 0;
        s->seam_queue_cancelled[s->nseam_queue++] = state == J_CANCELLED;
    } else srv__seam_end(s, j, state == J_CANCELLED);
    j->state = state;
    j->exit_code = exit_code;
    j->t_end = sh_now_wall();
    if (reason) snprintf(j->reason, sizeof j->reason, "%s", reason);
    SH_TRY(srv__db_job(s, j));
    SH_TRY(srv__db_members(s, j));
    SH_TRY(srv__db_event(s, j->id, NULL, srv__job_state_name(state), "%s", reason ? reason : ""));
    job_touch(s, j);
    return SH_OK;
}

int srv__cancel(srv *s, srv_job *j, const char *who)
{
    if (j->state > J_RUNNING) return SH_OK;
    char why[160];
    snprintf(why, sizeof why, "cancelled by %s", who);
    return srv__finish(s, j, J_CANCELLED, -1, why);
}

/* Carries out a requeue or preemption decided by the core: the job's live
 * members stop and it waits in the queue under a new attempt number. */
int srv__requeue(srv *s, srv_job *j, const char *why, int failed)
{
    if (j->state > J_RUNNING) return SH_OK;
    SH_TRY(stop_live(s, j));
    job_touch(s, j);
    free(j->mem);
    j->mem = NULL;
    j->nmem = 0;
    j->nprefer = 0;
    j->attempt++;
    j->state = J_PENDING;
    j->go = 0;
    char r[256];
    snprintf(r, sizeof r, "%s", why);
    snprintf(j->reason, sizeof j->reason, "%s", r);
    SH_TRY(srv__db_members(s, j));
    SH_TRY(srv__db_job(s, j));
    return srv__db_event(s, j->id, NULL, failed ? "requeue" : "preempted", "%s; attempt %d queued", r, j->attempt);
}

/* Appends elastic replicas the core added. */
int srv__grow(srv *s, srv_job *j, const int *nodes, const uint64_t *masks, int n)
{
    if (j->state < J_STARTING || j->state > J_RUNNING || j->nmem + n > 64) return SH_OK;
    srv_member *nm = realloc(j->mem, (size_t)(j->nmem + n) * sizeof *nm);
    if (!nm) return sh_err(SH_ENOMEM, "job %lld: members", (long long)j->id);
    j->mem = nm;
    for (int i = 0; i < n; i++) {
        srv_member *m = &j->mem[j->nmem];
        memset(m, 0, sizeof *m);
        m->rank = j->nmem++;
        m->node = nodes[i];
        m->state = M_ASSIGNED;
        m->exit_code = -1;
        m->gpu_mask = masks[i];
        m->t_placed = sh_now_wall();
    }
    SH_TRY(srv__db_members(s, j));
    SH_TRY(srv__db_event(s, j->id, NULL, "grow", "%d replica(s) added", n));
    job_touch(s, j);
    return SH_OK;
}

/* Stops one live elastic replica on each node listed. */
int srv__shrink(srv *s, srv_job *j, const int *nodes, const uint64_t *masks, int n)
{
    if (n <= 0) return SH_OK; /* the core reports a failed node's places this way too */
    for (int i = 0; i < n; i++)
        for (int r = j->nmem - 1; r >= 0; r--)
            if (j->mem[r].node == nodes[i] && j->mem[r].gpu_mask == masks[i] && member_live(&j->mem[r])) {
                SH_TRY(srv__member_end(s, j, &j->mem[r], M_STOPPED, -1));
                break;
            }
    SH_TRY(srv__db_members(s, j));
    SH_TRY(srv__db_event(s, j->id, NULL, "shrink", "%d replica(s) removed", n));
    job_touch(s, j);
    return SH_OK;
}

/* A node died under job j: gangs and functions stop at once (survivors
 * included) and wait for the core's requeue or replace; elastic jobs just
 * lose the replica; on_failure "fail" ends the job. */
static int job_lost_node(srv *s, srv_job *j, int idx, const char *why)
{
    if (j->policy == P_FAIL) return srv__finish(s, j, J_FAILED, -1, why);
    if (j->kind == K_ELASTIC) return srv__db_event(s, j->id, s->nodes[idx].name, "replica_lost", "%s", why);
    if (++j->failures >= j->max_attempts) {
        char r[320];
        snprintf(r, sizeof r, "%s; gave up after %d failure(s) (max_attempts)", why, j->failures);
        return srv__finish(s, j, J_FAILED, -1, r);
    }
    j->nprefer = 0;
    if (j->policy == P_REPLACE)
        for (int i = 0; i < j->nmem && i < 64; i++)
            j->prefer[j->nprefer++] = j->mem[i].node == idx ? -1 : j->mem[i].node;
    SH_TRY(stop_live(s, j));
    j->state = J_PENDING;
    j->go = 0;
    snprintf(j->reason, sizeof j->reason, "%s", why);
    SH_TRY(srv__db_members(s, j));
    SH_TRY(srv__db_job(s, j));
    job_touch(s, j);
    return srv__db_event(s, j->id, s->nodes[idx].name, j->policy == P_REPLACE ? "replace" : "stopped",
                         "%s; survivors stopped, waiting for the scheduler to %s", why,
                         j->policy == P_REPLACE ? "replace the node" : "requeue");
}

/* The last lines of member m's output (up to three, control characters
 * shown as spaces), for a failure's reason; "" when it printed nothing. */
static void last_lines(const srv_member *m, char *out, size_t cap)
{
    int end = m->tail_len, start, lines = 0;
    while (end > 0 && (m->tail[end - 1] == '\n' || m->tail[end - 1] == '\r' || m->tail[end - 1] == ' ')) end--;
    for (start = end; start > 0; start--)
        if (m->tail[start - 1] == '\n' && ++lines == 3) break;
    size_t k = 0;
    for (int i = start; i < end && k + 4 < cap; i++) {
        unsigned char c = (unsigned char)m->tail[i];
        if (c == '\n') {
            if (k && out[k - 1] != ' ') out[k++] = ' ';
            out[k++] = '|', out[k++] = ' ';
        } else out[k++] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
    }
    out[k] = 0;
}

/* The failed member to blame: the one whose agent saw it exit first (its
 * server-side end time when the agent did not say), ties to the lower rank. */
static int first_failed(const srv_job *j)
{
    int best = -1;
    double bt = 0;
    for (int i = 0; i < j->nmem; i++) {
        const srv_member *m = &j->mem[i];
        if (m->state != M_EXITED || m->exit_code == 0) continue;
        double t = m->t_exit > 0 ? m->t_exit : m->t_end;
        if (best < 0 || t < bt) best = i, bt = t;
    }
    return best;
}

/* Checks whether a job moved on after a member changed: the barrier opens
 * when every member of a gang is ready, the job runs when every member runs,
 * and it ends with its first failing member (once the others have ended or
 * SRV_FAIL_SETTLE_S has passed) or its last member. */
int srv__job_eval(srv *s, srv_job *j)
{
    if (j->state != J_STARTING && j->state != J_RUNNING) return SH_OK;
    int live = 0, ready = 0, running = 0, ok = 0;
    double failed_at = 0;
    for (int i = 0; i < j->nmem; i++) {
        const srv_member *m = &j->mem[i];
        if (m->state <= M_RUNNING) {
            live++;
            ready += m->state >= M_READY;
            running += m->state == M_RUNNING;
        }
        if (m->state == M_EXITED) {
            ok += m->exit_code == 0;
            if (m->exit_code != 0 && (failed_at == 0 || m->t_end < failed_at)) failed_at = m->t_end;
        }
    }
    if (failed_at > 0) {
        if (live && sh_now_wall() - failed_at < SRV_FAIL_SETTLE_S) return SH_OK; /* srv__settle_failures */
        const srv_member *f = &j->mem[first_failed(j)];
        char r[sizeof j->reason], tail[400];
        last_lines(f, tail, sizeof tail);
        snprintf(r, sizeof r, "rank %d exited with status %d%s%s", f->rank, f->exit_code,
                 *tail ? "; its last lines: " : "", tail);
        return srv__finish(s, j, J_FAILED, f->exit_code, r);
    }
    if (live == 0 && ok > 0) {
        /* Ranks that ended before any report saw them running did start:
         * the gang's start counts, at the latest it can have been. */
        if (j->state == J_STARTING && j->t_placed > 0) srv__observe_start(s, j->nmem, sh_now_wall() - j->t_placed);
        return srv__finish(s, j, J_SUCCEEDED, 0, "every rank exited with status 0");
    }
    int changed = 0;
    if (!j->go && live && ready == live) {
        j->go = 1;
        changed = 1;
        for (int i = 0; i < j->nmem; i++) s->nodes[j->mem[i].node].version++;
        srv__changed(s);
    }
    if (j->state == J_STARTING && live && running == live) {
        j->state = J_RUNNING;
        if (j->t_start <= 0) j->t_start = sh_now_wall();
        if (j->t_placed > 0) srv__observe_start(s, j->nmem, sh_now_wall() - j->t_placed);
        changed = 1;
        SH_TRY(srv__db_event(s, j->id, NULL, "running", "attempt %d: all %d rank(s) running", j->attempt, live));
    }
    if (changed) SH_TRY(srv__db_job(s, j));
    return SH_OK;
}

/* Ends the jobs whose first failed member has waited SRV_FAIL_SETTLE_S for
 * the others (the scheduler thread, every cycle). */
int srv__settle_failures(srv *s)
{
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        int failed = 0;
        for (int i = 0; j && i < j->nmem; i++) failed |= j->mem[i].state == M_EXITED && j->mem[i].exit_code != 0;
        if (failed) SH_TRY(srv__job_eval(s, j));
    }
    return SH_OK;
}

int srv__node_dead(srv *s, int idx, const char *why)
{
    srv_node *n = &s->nodes[idx];
    if (n->state != NODE_ALIVE) return SH_OK;
    n->state = NODE_DEAD;
    SH_TRY(srv__db_node(s, n));
    SH_TRY(srv__db_event(s, 0, n->name, "node_dead", "%s", why));
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        if (!j || j->state > J_RUNNING) continue;
        int hit = 0;
        for (int i = 0; i < j->nmem; i++)
            if (j->mem[i].node == idx && member_live(&j->mem[i])) {
                SH_TRY(srv__member_end(s, j, &j->mem[i], M_LOST, -1));
                hit = 1;
            }
        if (!hit) continue;
        char r[200];
        snprintf(r, sizeof r, "node %s died (%s)", n->name, why);
        SH_TRY(job_lost_node(s, j, idx, r));
    }
    /* The core learns of the failure after the jobs that end here have
     * left it, so that it requeues or replaces only the others. */
    SH_TRY(srv__seam_node(s, idx, SEAM_DEAD));
    srv__changed(s);
    return SH_OK;
}

void srv__heartbeats(srv *s, double now)
{
    for (int i = 0; i < s->nnodes; i++) {
        srv_node *n = &s->nodes[i];
        if (n->state != NODE_ALIVE || now - n->last_seen <= s->cfg.heartbeat_timeout) continue;
        char why[96];
        snprintf(why, sizeof why, "no heartbeat for %.1f s", now - n->last_seen);
        if (srv__node_dead(s, i, why) < 0) sh_warn("node %s: %s", n->name, sh_errmsg());
    }
}

/* Ends every attempt that has run past its job's est_s plus the grace: est_s
 * is the job's time limit, as Slurm's --time is, so that a tenant cannot
 * take a backfill slot with a short estimate and then hold it.  An
 * attempt's clock starts when its first rank ran; a requeue starts a new
 * attempt.  est_s 0 (not given) sets no limit. */
/* When the running attempt of j is ended by its time limit (wall seconds),
 * or 0: no limit, or no rank has started. */
double srv__ends_by(const srv *s, const srv_job *j)
{
    json_t *est = j->state <= J_RUNNING ? json_object_get(j->spec, "est_s") : NULL;
    double limit = est ? json_number_value(est) : 0, start = 0;
    if (!(limit > 0)) return 0;
    for (int i = 0; i < j->nmem; i++) {
        const srv_member *m = &j->mem[i];
        if (m->state == M_RUNNING && m->t_start > 0 && (start == 0 || m->t_start < start)) start = m->t_start;
    }
    return start > 0 ? start + limit + srv__est_grace(s) : 0;
}

double srv__est_grace(const srv *s) { return s->cfg.est_grace_s > 0 ? s->cfg.est_grace_s : SRV_EST_GRACE; }

int srv__time_limits(srv *s, double wall)
{
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        double end = j ? srv__ends_by(s, j) : 0;
        if (end == 0 || wall <= end) continue;
        double limit = json_number_value(json_object_get(j->spec, "est_s")), grace = srv__est_grace(s);
        char why[200];
        snprintf(why, sizeof why, "time limit: ran %.0f s, past its est_s of %g s and %g s of grace",
                 wall - (end - limit - grace), limit, grace);
        SH_TRY(srv__finish(s, j, J_FAILED, -1, why));
    }
    return SH_OK;
}

/* ---- undo: a change is applied only once it is durable ------------------ */

void srv__undo_begin(srv *s, srv_undo *u)
{
    memset(u, 0, sizeof *u);
    s->defer_seam = 1;
    s->nseam_queue = 0;
}

int srv__undo_node(srv *s, srv_undo *u, int idx)
{
    if (idx < 0 || idx >= s->nnodes) return SH_OK;
    for (int i = 0; i < u->nnodes; i++)
        if (u->node_idx[i] == idx) return SH_OK; /* already saved */
    if (u->nnodes == u->cap_nodes) {
        int cap = u->cap_nodes ? 2 * u->cap_nodes : 16;
        int *ni = realloc(u->node_idx, (size_t)cap * sizeof *ni);
        if (ni) u->node_idx = ni;
        srv_node *nn = ni ? realloc(u->nodes, (size_t)cap * sizeof *nn) : NULL;
        if (!nn) return sh_err(SH_ENOMEM, "undo: nodes");
        u->nodes = nn;
        u->cap_nodes = cap;
    }
    u->node_idx[u->nnodes] = idx;
    u->nodes[u->nnodes++] = s->nodes[idx];
    return SH_OK;
}

int srv__undo_job(srv *s, srv_undo *u, srv_job *j)
{
    for (int i = 0; i < u->njobs; i++)
        if (u->jobs[i].j == j) return SH_OK;
    if (u->njobs == u->cap_jobs) {
        int cap = u->cap_jobs ? 2 * u->cap_jobs : 8;
        srv_undo_job *nj = realloc(u->jobs, (size_t)cap * sizeof *nj);
        if (!nj) return sh_err(SH_ENOMEM, "undo: jobs");
        u->jobs = nj;
        u->cap_jobs = cap;
    }
    srv_member *mem = NULL;
    if (j->nmem) {
        mem = malloc((size_t)j->nmem * sizeof *mem);
        if (!mem) return sh_err(SH_ENOMEM, "undo: job %lld", (long long)j->id);
        memcpy(mem, j->mem, (size_t)j->nmem * sizeof *mem);
    }
    u->jobs[u->njobs].j = j;
    u->jobs[u->njobs].copy = *j;
    u->jobs[u->njobs++].mem = mem;
    for (int i = 0; i < j->nmem; i++) SH_TRY(srv__undo_node(s, u, j->mem[i].node));
    return SH_OK;
}

void srv__undo_end(srv *s, srv_undo *u, int committed)
{
    s->defer_seam = 0;
    if (committed) {
        /* Durable: now the scheduling core may forget the jobs that ended. */
        for (int i = 0; i < s->nseam_queue; i++) {
            srv_job *j = srv__job(s, s->seam_queue[i]);
            if (j) srv__seam_end_at(s, j, s->seam_queue_cancelled[i], s->seam_queue_t[i], s->seam_queue_billed[i]);
        }
    } else {
        /* Not durable: the model goes back to what the database holds, so
         * that no agent is told to stop or start anything. */
        for (int i = 0; i < u->njobs; i++) {
            /* The job's array now (the saved one, or one that replaced and
             * freed it) gives way to the saved copy of its members. */
            srv_job *j = u->jobs[i].j;
            free(j->mem);
            *j = u->jobs[i].copy;
            j->mem = u->jobs[i].mem;
            u->jobs[i].mem = NULL;
        }
        for (int i = 0; i < u->nnodes; i++) s->nodes[u->node_idx[i]] = u->nodes[i];
    }
    for (int i = 0; i < u->njobs; i++) free(u->jobs[i].mem);
    free(u->jobs);
    free(u->node_idx);
    free(u->nodes);
    s->nseam_queue = 0;
    memset(u, 0, sizeof *u);
}

/* ---- job files ---------------------------------------------------------- */

static const char *const job_keys[] = {
    "name",   "kind",     "nodes",          "min_nodes",  "max_nodes",    "gpus_per_node",
    "gpus",   "gpu_types", "zone",          "command",    "env",          "on_failure",
    "max_attempts", "priority", "writable", "memory_mb", "pids_max", "disk_mb", "idempotency_key", "est_s",
    "gpu_speeds", "replace_wait_s", "workdir", "run", NULL};

static int pick(const char *v, const char *const *names, int n, const char *field, int *out)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i])) {
            *out = i;
            return SH_OK;
        }
    return sh_err(SH_EFORMAT, "job: field \"%s\": \"%s\" is not one of %s|%s%s%s", field, v,
                  names[0], names[1], n > 2 ? "|" : "", n > 2 ? names[2] : "");
}

static int int_field(const json_t *spec, const char *key, int required, int64_t lo, int64_t hi,
                     int *out)
{
    int64_t v = *out;
    SH_TRY(sh_json_get_i64(spec, key, required, "job", &v));
    if (v < lo || v > hi)
        return sh_err(SH_ERANGE, "job: field \"%s\": %lld is outside %lld..%lld", key, (long long)v,
                      (long long)lo, (long long)hi);
    *out = (int)v;
    return SH_OK;
}

static int str_array(const json_t *spec, const char *key, int min, int abs_paths)
{
    json_t *a = json_object_get(spec, key);
    if (!a) return min ? sh_err(SH_EFORMAT, "job: missing field \"%s\"", key) : SH_OK;
    if (!json_is_array(a) || json_array_size(a) < (size_t)min || json_array_size(a) > 256)
        return sh_err(SH_EFORMAT, "job: field \"%s\": expected an array of %d to 256 strings", key, min);
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (!json_is_string(v) || json_string_length(v) > 4096)
            return sh_err(SH_EFORMAT, "job: field \"%s\"[%zu]: expected a string", key, i);
        if (abs_paths && json_string_value(v)[0] != '/')
            return sh_err(SH_EFORMAT, "job: field \"%s\"[%zu]: \"%s\" is not an absolute path", key,
                          i, json_string_value(v));
    }
    return SH_OK;
}

/* gpu_speeds: {"TYPE": speed > 0, ...}, each TYPE one of gpu_types. */
static int check_speeds(const json_t *spec)
{
    json_t *o = json_object_get(spec, "gpu_speeds"), *types = json_object_get(spec, "gpu_types");
    if (!o) return SH_OK;
    if (!json_is_object(o)) return sh_err(SH_EFORMAT, "job: field \"gpu_speeds\": expected an object");
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (!json_is_number(v) || !(json_number_value(v) > 0))
            return sh_err(SH_EFORMAT, "job: field \"gpu_speeds\".%s: expected a number > 0", k);
        int listed = 0;
        size_t i;
        json_t *t;
        json_array_foreach(types, i, t) listed |= json_is_string(t) && !strcmp(json_string_value(t), k);
        if (!listed)
            return sh_err(SH_EFORMAT, "job: field \"gpu_speeds\": type \"%s\" is not in \"gpu_types\"", k);
    }
    return SH_OK;
}

static int check_env(const json_t *spec)
{
    json_t *e = json_object_get(spec, "env");
    if (!e) return SH_OK;
    if (!json_is_object(e)) return sh_err(SH_EFORMAT, "job: field \"env\": expected an object");
    const char *k;
    json_t *v;
    json_object_foreach(e, k, v) {
        if (!json_is_string(v))
            return sh_err(SH_EFORMAT, "job: env \"%s\": expected a string value", k);
        /* SHOAL_RUN_SECRET is the one a job sets itself: its run's
         * processes prove with it that they belong together. */
        if (!*k || strchr(k, '=') || (!strncmp(k, "SHOAL_", 6) && strcmp(k, "SHOAL_RUN_SECRET")))
            return sh_err(SH_EFORMAT, "job: env \"%s\": names must be non-empty, without '=' and"
                                      " not start with SHOAL_ (reserved; SHOAL_RUN_SECRET excepted)", k);
        if (!strcmp(k, "SHOAL_RUN_SECRET") && (strlen(json_string_value(v)) != 32 ||
                                                strspn(json_string_value(v), "0123456789abcdefABCDEF") != 32))
            return sh_err(SH_EFORMAT, "job: env \"SHOAL_RUN_SECRET\": expected 32 hex digits (128 random bits)");
    }
    return SH_OK;
}

/* Validates a job file and builds the job (not yet numbered).  `spec` is
 * borrowed; the job keeps its own reference. */
int srv__job_from_spec(json_t *spec, const char *tenant, srv_job **out)
{
    if (!json_is_object(spec)) return sh_err(SH_EFORMAT, "job: expected a JSON object");
    SH_TRY(sh_json_check_keys(spec, job_keys, "job"));
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return sh_err(SH_ENOMEM, "job");
    const char *name = NULL, *kind = "gang", *pol = "requeue", *idem = "";
    int rc = sh_json_get_str(spec, "name", 1, "job", &name);
    if (rc == SH_OK && (!*name || strlen(name) >= sizeof j->name))
        rc = sh_err(SH_EFORMAT, "job: field \"name\": must be 1 to 127 characters");
    if (rc == SH_OK && sh_control_at(name) >= 0) /* another tenant's text on the admin's terminal */
        rc = sh_err(SH_EFORMAT, "job: field \"name\": holds a control character (names are shown on terminals;"
                                " use printable text)");
    if (rc == SH_OK) rc = sh_json_get_str(spec, "kind", 0, "job", &kind);
    if (rc == SH_OK) rc = pick(kind, srv__kinds, 3, "kind", &j->kind);
    if (rc == SH_OK) rc = sh_json_get_str(spec, "on_failure", 0, "job", &pol);
    if (rc == SH_OK) rc = pick(pol, srv__policies, 3, "on_failure", &j->policy);
    if (rc == SH_OK) rc = sh_json_get_str(spec, "idempotency_key", 0, "job", &idem);
    if (rc == SH_OK && *idem && !srv__idem_valid(idem))
        rc = sh_err(SH_EFORMAT, "job: field \"idempotency_key\": expected 1 to 127 printable ASCII characters");
    j->gpus_per_node = 1;
    j->nodes = 1;
    j->min_nodes = 1;
    j->max_attempts = 3;
    if (rc == SH_OK && j->kind == K_GANG) rc = int_field(spec, "nodes", 1, 1, 64, &j->nodes);
    if (rc == SH_OK && j->kind == K_ELASTIC) rc = int_field(spec, "max_nodes", 1, 1, 64, &j->nodes);
    if (rc == SH_OK && j->kind == K_ELASTIC) rc = int_field(spec, "min_nodes", 0, 1, j->nodes, &j->min_nodes);
    if (rc == SH_OK && j->kind == K_FUNCTION) rc = int_field(spec, "gpus", 0, 1, 1, &j->gpus_per_node);
    if (rc == SH_OK && j->kind != K_FUNCTION) rc = int_field(spec, "gpus_per_node", 0, 1, SCHED_MAX_NODE_GPUS, &j->gpus_per_node);
    if (rc == SH_OK && j->kind != K_GANG) j->min_nodes = j->kind == K_FUNCTION ? 1 : j->min_nodes;
    if (rc == SH_OK && j->kind == K_GANG) j->min_nodes = j->nodes;
    if (rc == SH_OK) rc = int_field(spec, "max_attempts", 0, 1, 100, &j->max_attempts);
    if (rc == SH_OK) rc = int_field(spec, "priority", 0, -1000, 1000, &j->priority);
    int lim = 1;
    if (rc == SH_OK) rc = int_field(spec, "memory_mb", 0, 1, 1 << 24, &lim);
    if (rc == SH_OK) rc = int_field(spec, "pids_max", 0, 1, 1 << 22, &lim);
    if (rc == SH_OK) rc = int_field(spec, "disk_mb", 0, 1, 1 << 30, &lim);
    double est = 0;
    if (rc == SH_OK) rc = sh_json_get_num(spec, "est_s", 0, "job", &est);
    if (rc == SH_OK && est < 0) rc = sh_err(SH_ERANGE, "job: field \"est_s\": negative");
    double wait = 30;
    if (rc == SH_OK) rc = sh_json_get_num(spec, "replace_wait_s", 0, "job", &wait);
    if (rc == SH_OK && !(wait >= 0 && wait <= 86400))
        rc = sh_err(SH_ERANGE, "job: field \"replace_wait_s\": %g is outside 0..86400 seconds", wait);
    if (rc == SH_OK) rc = str_array(spec, "command", 1, 0);
    if (rc == SH_OK) rc = str_array(spec, "gpu_types", 0, 0);
    if (rc == SH_OK) rc = str_array(spec, "writable", 0, 1);
    if (rc == SH_OK) rc = check_env(spec);
    json_t *run = json_object_get(spec, "run");
    if (rc == SH_OK && run && !srv__run_name_ok(json_string_value(run)))
        rc = sh_err(SH_EFORMAT, "job: field \"run\": expected a run name of 1 to 63 of A-Z a-z 0-9 . _ - (not"
                                " starting with '.')");
    if (rc == SH_OK && run && json_object_get(json_object_get(spec, "env"), "SHOAL_RUN_SECRET"))
        rc = sh_err(SH_EFORMAT, "job: env \"SHOAL_RUN_SECRET\" and field \"run\" together: the run's secret is"
                                " generated by the server and given to its ranks; remove it from env");
    json_t *wd = json_object_get(spec, "workdir");
    if (rc == SH_OK && wd && !srv__workdir_id_ok(json_string_value(wd)))
        rc = sh_err(SH_EFORMAT, "job: field \"workdir\": expected the id of an uploaded work dir (32 hex digits);"
                                " `shoal submit JOB.json --workdir DIR` uploads DIR and sets it");
    if (rc == SH_OK) rc = check_speeds(spec);
    /* The scheduling core cannot pin a job to a zone, so a "zone" field
     * would be a promise the server does not keep: refuse it. */
    if (rc == SH_OK && json_object_get(spec, "zone"))
        rc = sh_err(SH_EFORMAT, "job: field \"zone\" is not supported: placement cannot be pinned to a"
                                " zone; remove it (a gang always runs inside one zone) or narrow"
                                " \"gpu_types\" instead");
    if (rc == SH_OK && tenant && strlen(tenant) >= sizeof j->tenant)
        rc = sh_err(SH_EFORMAT, "job: tenant name too long");
    if (rc < 0) {
        free(j);
        return rc;
    }
    snprintf(j->name, sizeof j->name, "%s", name);
    snprintf(j->idem, sizeof j->idem, "%s", idem);
    snprintf(j->tenant, sizeof j->tenant, "%s", tenant ? tenant : "");
    j->spec = json_incref(spec);
    j->attempt = 1;
    j->exit_code = -1;
    *out = j;
    return SH_OK;
}

/* ---- JSON views ---------------------------------------------------------- */

static json_t *gpu_list(uint64_t mask)
{
    json_t *a = json_array();
    for (int g = 0; g < 64; g++)
        if (mask & (1ull << g)) json_array_append_new(a, json_integer(g));
    return a;
}

/* Dollars the places a job holds now have cost so far, on the core's bill
 * (closed bills are ledger rows in SQLite). */
static double running_cost(srv *s, const srv_job *j)
{
    if (!s->sc || j->state > J_RUNNING) return 0;
    char id[24];
    snprintf(id, sizeof id, "%lld", (long long)j->id);
    return sched_cost_job_open(s->sc, id, NULL, sh_now_mono(), NULL);
}

/* What a job cost and how long it ran: the closed ledger plus its live
 * members, so a finished job keeps its final bill; "replicas" counts the
 * members holding GPUs now, placed or running (an elastic job may run
 * fewer than its maximum); they are billed from their placement. */
static void add_billing(srv *s, const srv_job *j, json_t *o)
{
    double dollars, gpu_s;
    srv__db_job_cost(s, j->id, &dollars, &gpu_s);
    double now = sh_now_wall();
    int live = 0;
    for (int i = 0; i < j->nmem; i++) live += member_live(&j->mem[i]);
    double run = j->t_start > 0 ? (j->t_end > 0 ? j->t_end : now) - j->t_start : 0;
    json_object_set_new(o, "cost", json_real(dollars + running_cost(s, j)));
    json_object_set_new(o, "cost_final", json_boolean(j->state > J_RUNNING));
    json_object_set_new(o, "run_s", json_real(run > 0 ? run : 0));
    json_object_set_new(o, "replicas", json_integer(j->state <= J_RUNNING ? live : 0));
}

/* Why a pending job waits and when it should start, from the core (its
 * clock is monotonic: the estimate is moved onto the wall clock). */
static void add_pending(srv *s, const srv_job *j, json_t *o, const char *viewer)
{
    if ((j->state != J_PENDING && j->state != J_STARTING && j->state != J_RUNNING) || !s->sc) return;
    char id[24];
    snprintf(id, sizeof id, "%lld", (long long)j->id);
    sched_job_info in;
    double mono = sh_now_mono(), wall = sh_now_wall();
    if (sched_job_info_get(s->sc, id, mono, &in) < 0) return;
    /* Running: when the scheduler plans it to end (what it reserves and
     * backfills by), moved on while the job runs past its estimate. */
    if (in.expected_end_s >= 0) json_object_set_new(o, "expected_end", json_real(wall + (in.expected_end_s - mono)));
    if (j->state != J_PENDING || in.wait == SCHED_WAIT_NONE) return;
    json_object_set_new(o, "wait", json_string(sched_wait_name(in.wait)));
    /* Another tenant's job in the way is named to the admin only: its id
     * and when it starts are that tenant's. */
    const srv_job *other = in.wait_job ? srv__job(s, strtoll(in.wait_job, NULL, 10)) : NULL;
    if (viewer && in.wait_job && (!other || strcmp(other->tenant, viewer)))
        snprintf(in.wait_text, sizeof in.wait_text,
                 "blocked behind a reservation for another tenant's job: starting now would delay it");
    json_object_set_new(o, "pending_reason", json_string(in.wait_text));
    json_object_set_new(o, "start_estimate",
                        isfinite(in.est_start_s) ? json_real(wall + (in.est_start_s - mono)) : json_null());
}

/* A job as the database loads it (srv__db_load): its spec, and the state it
 * had reached. */
int srv__job_from_row(srv *s, const srv_job_row *r)
{
    json_t *spec = json_loads(r->spec, 0, NULL);
    /* Databases written before "zone" was refused may hold it; it never
     * affected placement, so dropping it keeps those jobs loadable. */
    if (json_is_object(spec)) json_object_del(spec, "zone");
    srv_job *j = NULL;
    int rc = srv__job_from_spec(spec, r->tenant, &j);
    json_decref(spec);
    if (rc == SH_OK) j->spec_bytes = strlen(r->spec);
    if (rc < 0) return sh_err_wrap(rc, "%s: job %lld", s->db_name, (long long)r->id);
    j->id = r->id;
    snprintf(j->idem, sizeof j->idem, "%s", r->idem);
    j->state = r->state;
    j->attempt = r->attempt;
    j->exit_code = r->exit_code;
    snprintf(j->reason, sizeof j->reason, "%s", r->reason);
    j->t_submit = r->t_submit;
    j->t_start = r->t_start;
    j->t_end = r->t_end;
    j->go = r->go;
    json_t *pa = json_loads(r->prefer, 0, NULL);
    size_t i;
    json_t *v;
    json_array_foreach(pa, i, v) if (j->nprefer < 64) j->prefer[j->nprefer++] = (int)json_integer_value(v);
    json_decref(pa);
    j->nodes = r->nodes;
    j->failures = r->failures;
    return srv__job_add(s, j);
}

json_t *srv__job_json(srv *s, const srv_job *j, int full, const char *viewer)
{
    json_t *o = json_pack("{s:I,s:s,s:s,s:s,s:s,s:i,s:i,s:s,s:i,s:i,s:i,s:i,s:f,s:f,s:f,s:i,s:s,s:f}",
                          "id", (json_int_t)j->id, "name", j->name, "tenant", j->tenant, "kind",
                          srv__kind_name(j->kind), "state", srv__job_state_name(j->state),
                          "attempt", j->attempt, "max_attempts", j->max_attempts, "on_failure",
                          srv__policy_name(j->policy), "nodes", j->nodes, "min_nodes", j->min_nodes,
                          "gpus_per_node", j->gpus_per_node, "priority", j->priority,
                          "submitted_at", j->t_submit, "started_at", j->t_start, "finished_at",
                          j->t_end, "exit_code", j->exit_code, "reason", j->reason,
                          "running_cost", running_cost(s, j));
    json_t *gt = json_object_get(j->spec, "gpu_types");
    json_object_set_new(o, "gpu_types", gt ? json_incref(gt) : json_array());
    add_billing(s, j, o);
    add_pending(s, j, o, viewer);
    double ends = srv__ends_by(s, j);
    if (ends > 0) json_object_set_new(o, "ends_by", json_real(ends));
    json_t *mem = json_array();
    for (int i = 0; i < j->nmem; i++) {
        const srv_member *m = &j->mem[i];
        json_array_append_new(mem, json_pack("{s:i,s:s,s:s,s:i,s:o,s:I}", "rank", m->rank, "node",
                                             s->nodes[m->node].name, "state",
                                             srv__member_state_name(m->state), "exit_code",
                                             m->exit_code, "gpus", gpu_list(m->gpu_mask), "disk_bytes",
                                             (json_int_t)m->disk_bytes));
    }
    json_object_set_new(o, "members", mem);
    if (full) json_object_set(o, "spec", j->spec);
    return o;
}

static const char *const node_states[] = {"alive", "dead", "gone"};

int srv__node_used(srv *s, int idx)
{
    sched_node_info in;
    if (!s->sc || idx < 0 || idx >= s->nnodes || sched_node_info_get(s->sc, s->nodes[idx].name, &in) < 0) return 0;
    return in.gpus - in.free_gpus;
}

static json_t *node_json(const srv_node *n, int used, json_t *jobs)
{
    /* Seconds since the node's last poll (its heartbeat); -1 before the first. */
    double age = n->last_seen > 0 ? sh_now_mono() - n->last_seen : -1;
    return json_pack("{s:s,s:s,s:i,s:i,s:s,s:s,s:s,s:f,s:s,s:s,s:b,s:f,s:o}", "name", n->name,
                     "gpu_type", n->gpu_type, "gpus", n->gpus, "gpus_used", used, "zone",
                     n->zone, "fabric", n->fabric, "addr", n->addr, "price_per_gpu_hour", n->price,
                     "state", node_states[n->state], "sandbox", n->sandbox, "from_provider",
                     n->from_provider, "heartbeat_age_s", age, "jobs", jobs);
}

/* One entry of a node's "jobs" list. */
static json_t *placement_json(const srv_job *j, const srv_member *m, const char *tenant)
{
    int mine = !tenant || !strcmp(tenant, j->tenant);
    /* Other tenants' work shows as busy GPUs, never as a job. */
    return json_pack("{s:I,s:i,s:s,s:s,s:s,s:i}", "job", (json_int_t)(mine ? j->id : 0), "rank",
                     mine ? m->rank : 0, "name", mine ? j->name : "", "tenant", mine ? j->tenant : "",
                     "kind", srv__kind_name(j->kind), "gpus", j->gpus_per_node);
}

/* Every node as JSON, in node order.  The live members of the active jobs
 * are bucketed by node in one pass, so the cost is nodes + members rather
 * than nodes x active jobs. */
json_t *srv__nodes_json(srv *s, const char *tenant)
{
    json_t **per = calloc((size_t)s->nnodes + 1, sizeof *per);
    json_t *out = json_array();
    if (!per || !out) {
        free(per);
        json_decref(out);
        return NULL;
    }
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        if (!j || j->state > J_RUNNING) continue;
        for (int i = 0; i < j->nmem; i++) {
            const srv_member *m = &j->mem[i];
            if (!member_live(m) || m->node < 0 || m->node >= s->nnodes) continue;
            if (!per[m->node]) per[m->node] = json_array();
            json_array_append_new(per[m->node], placement_json(j, m, tenant));
        }
    }
    for (int i = 0; i < s->nnodes; i++) {
        if (s->nodes[i].state == NODE_GONE) {
            json_decref(per[i]);
            continue;
        }
        json_array_append_new(out, node_json(&s->nodes[i], srv__node_used(s, i), per[i] ? per[i] : json_array()));
    }
    free(per);
    return out;
}
