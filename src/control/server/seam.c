/* The seam between the server and the scheduling core (src/control/sched),
 * below state.c: the server tells the core about nodes and jobs as events
 * happen (srv__seam_submit, srv__seam_node, srv__seam_end) and writes the
 * bills it closes to the ledger; commit and rollback settle those bills.
 *
 * Every placement decision comes from sched_step(); carry.c, above
 * state.c, carries them out (start, grow, shrink, preempt, requeue,
 * replace, scale up and down) and rebuilds the core after a restart: nodes
 * are added, queued jobs submitted again, and running jobs restored on the
 * places they hold (sched_job_restore), so that nothing running is moved or
 * restarted. */
#include "srv_int.h"
#include "db_int.h"
#include "seam_int.h"

#include <stdlib.h>
#include <string.h>


static void sid(const srv_job *j, char out[24]) { snprintf(out, 24, "%lld", (long long)j->id); }

static int spec_of(const srv_job *j, char id[24], sched_job_spec *sp)
{
    memset(sp, 0, sizeof *sp);
    sid(j, id);
    sp->id = id;
    sp->tenant = j->tenant;
    sp->kind = j->kind == K_GANG ? SCHED_GANG : j->kind == K_ELASTIC ? SCHED_ELASTIC : SCHED_FUNCTION;
    sp->nodes = j->kind == K_ELASTIC ? j->min_nodes : j->nodes;
    sp->max_replicas = j->nodes;
    sp->gpus_per_node = j->gpus_per_node;
    json_t *types = json_object_get(j->spec, "gpu_types");
    size_t i;
    json_t *v;
    json_t *speeds = json_object_get(j->spec, "gpu_speeds");
    json_array_foreach(types, i, v) if (sp->n_types < SCHED_MAX_TYPES) {
        /* Declared speeds let the core place elastic work by price per unit
         * of throughput (docs/job-format.md, gpu_speeds). */
        json_t *spd = json_object_get(speeds, json_string_value(v));
        sp->speed[sp->n_types] = spd ? json_number_value(spd) : 0;
        sp->gpu_types[sp->n_types++] = json_string_value(v);
    }
    json_t *est = json_object_get(j->spec, "est_s");
    sp->est_s = est ? json_number_value(est) : 0;
    sp->priority = j->priority;
    sp->on_fail = j->policy == P_REPLACE ? SCHED_REPLACE : SCHED_REQUEUE;
    json_t *wait = json_object_get(j->spec, "replace_wait_s");
    sp->replace_wait_s = wait ? json_number_value(wait) : 30;
    return SH_OK;
}

int srv__seam_submit(srv *s, const srv_job *j, char *why, size_t cap)
{
    char id[24];
    sched_job_spec sp;
    spec_of(j, id, &sp);
    int rc = sched_job_submit(s->sc, &sp, sh_now_mono());
    if (rc == SH_ERANGE || rc == SH_EINVAL) {
        /* Without the core's "job ID rejected: ": no job keeps that id. */
        char pre[64];
        snprintf(pre, sizeof pre, "job %s rejected: ", id);
        const char *msg = sh_errmsg();
        if (!strncmp(msg, pre, strlen(pre))) msg += strlen(pre);
        snprintf(why, cap, "can never fit: %s", msg);
        /* A rejected job never runs, so nothing of it is left to bill. */
        sched_job_forget(s->sc, id);
        return 1;
    }
    return rc;
}

/* A bill of the core as a ledger row: its times moved onto the wall clock. */
static int write_bill(srv *s, const sched_bill *x)
{
    double shift = sh_now_wall() - sh_now_mono();
    int64_t job = strtoll(x->job, NULL, 10);
    const srv_job *j = srv__job(s, job);
    int rank = -1, node = srv__node_find(s, x->node);
    for (int i = 0; j && i < j->nmem && rank < 0; i++)
        if (j->mem[i].node == node && j->mem[i].gpu_mask == x->gpu_mask) rank = j->mem[i].rank;
    srv_bill row = {x->tenant, job, j ? j->attempt : 0, rank, x->node, x->gpu_type,
                    x->gpus, x->since + shift, x->until + shift, x->seconds, x->cost};
    return srv__db_ledger(s, &row);
}

/* Writes the bills the core closed to the ledger, oldest first.  Outside a
 * transaction each row is durable once written and its bill is dropped from
 * the core at once; inside one, the written bills are dropped when it
 * commits (srv__seam_bills_end), and a failed write keeps the rest for the
 * next call. */
int srv__seam_bills(srv *s)
{
    const sched_bill *b;
    size_t n = sched_bills(s->sc, &b);
    int rc = SH_OK;
    while (s->bills_staged < n && rc == SH_OK) {
        rc = write_bill(s, &b[s->bills_staged]);
        if (rc == SH_OK) s->bills_staged++;
    }
    if (srv__db_autocommit(s)) srv__seam_bills_end(s, 1);
    return rc;
}

int srv__seam_prebill(srv *s)
{
    for (int i = 0; i < s->nseam_queue; i++) {
        srv_job *j = srv__job(s, s->seam_queue[i]);
        if (!j) continue;
        char id[24];
        sid(j, id);
        sched_bill b[64];
        size_t n = sched_job_closing_bills(s->sc, id, s->seam_queue_t[i], b, 64);
        if (n > 64) return sh_err(SH_EINTERNAL, "job %s: %zu places to bill", id, n);
        for (size_t k = 0; k < n; k++) SH_TRY(write_bill(s, &b[k]));
        s->seam_queue_billed[i] = (int)n;
    }
    return SH_OK;
}

void srv__seam_bills_end(srv *s, int committed)
{
    if (committed && s->bills_staged) sched_bills_done(s->sc, s->bills_staged);
    s->bills_staged = 0;
}

/* The ledger rows a transaction wrote are the core's bills until it
 * commits: dropped from the core then, written again after a failure. */
int srv__commit(srv *s)
{
    int rc = srv__db_commit(s);
    srv__seam_bills_end(s, rc == SH_OK);
    return rc;
}

void srv__rollback(srv *s)
{
    srv__db_rollback(s);
    srv__seam_bills_end(s, 0);
}

/* Called by srv__finish once the job's members are stopped: the core
 * closes the job's places into bills, which go to the ledger in SQLite;
 * then the core forgets the job, so that its memory stays bounded by the
 * jobs alive at once. */
void srv__seam_end(srv *s, const srv_job *j, int cancelled) { srv__seam_end_at(s, j, cancelled, sh_now_mono(), 0); }

void srv__seam_end_at(srv *s, const srv_job *j, int cancelled, double t, int billed)
{
    char id[24];
    sid(j, id);
    sched_job_info info;
    if (sched_job_info_get(s->sc, id, t, &info) < 0) return;
    if (info.state < SCHED_DONE) {
        const sched_bill *b;
        size_t n0 = sched_bills(s->sc, &b);
        if (cancelled) sched_job_cancel(s->sc, id, t);
        else sched_job_finish(s->sc, id, t);
        size_t closed = sched_bills(s->sc, &b) - n0;
        /* The ledger has them from before the commit (srv__seam_prebill). */
        if (billed && (size_t)billed == closed) sched_bills_drop_last(s->sc, closed);
        else if (billed)
            sh_warn("job %s: %d bills written before its end, but it closed %zu: they are written again", id,
                    billed, closed);
    }
    if (srv__seam_bills(s) < 0) sh_warn("job %s: ledger: %s (kept for the next write)", id, sh_errmsg());
    if (sched_job_forget(s->sc, id) < 0) sh_warn("job %s: scheduler: %s", id, sh_errmsg());
}

static int same_node(const sched_node_info *in, const srv_node *n)
{
    return in->gpus == n->gpus && in->price_per_gpu_hour == n->price && !strcmp(in->zone, n->zone) &&
           !strcmp(in->fabric, n->fabric) && !strcmp(in->gpu_type, n->gpu_type);
}

int srv__seam_node(srv *s, int idx, int event)
{
    srv_node *n = &s->nodes[idx];
    double now = sh_now_mono();
    sched_node_info info;
    int known = sched_node_info_get(s->sc, n->name, &info) == 0;
    if (event == SEAM_UP) {
        if (known && !same_node(&info, n)) {
            /* Registered again with other GPUs (or zone, fabric, price):
             * the scheduler must know it by what it has now. */
            if (info.state != SCHED_NODE_FAILED) SH_TRY(sched_node_fail(s->sc, n->name, now));
            SH_TRY(sched_node_remove(s->sc, n->name, now));
            SH_TRY(srv__seam_bills(s));
            known = 0;
        }
        if (!known) {
            sched_node_spec ns = {n->name, n->zone, n->fabric, n->gpu_type, n->gpus, n->price};
            return sched_node_add(s->sc, &ns, now);
        }
        return info.state == SCHED_NODE_FAILED ? sched_node_recover(s->sc, n->name, now) : SH_OK;
    }
    if (!known) return SH_OK;
    if (event == SEAM_DEAD) {
        if (info.state != SCHED_NODE_FAILED) SH_TRY(sched_node_fail(s->sc, n->name, now));
        return srv__seam_bills(s);
    }
    if (info.state != SCHED_NODE_FAILED) SH_TRY(sched_node_fail(s->sc, n->name, now));
    SH_TRY(sched_node_remove(s->sc, n->name, now));
    return srv__seam_bills(s);
}

void srv__seam_free(srv *s)
{
    sched_decisions_free(&s->dec);
    sched_free(s->sc);
}
