/* The server's side of a scheduling cycle, above state.c: rebuilding the
 * core from the loaded model (srv__seam_init) and carrying out the
 * decisions sched_step() returns (srv__seam_step) through state.c's
 * transitions and the provider.  seam.c, below state.c, only tells the
 * core about changes and writes its bills. */
#include "srv_int.h"
#include "db_int.h"
#include "seam_int.h"
#include "state_int.h"
#include "provider_int.h"
#include "carry_int.h"

#include <stdlib.h>
#include <string.h>

static void sid(const srv_job *j, char out[24]) { snprintf(out, 24, "%lld", (long long)j->id); }

/* Tells the core where a starting or running job already is, so that it
 * keeps running: its live members' places, or for a gang whose ranks have
 * partly exited, every rank's (a gang holds its nodes until it ends).  A
 * job that cannot be restored (a node gone, a changed fleet) goes the way
 * its failure policy says, and every outcome is an event. */
static int restore(srv *s, srv_job *j, double now)
{
    char sidv[24];
    sid(j, sidv);
    sched_place pl[64];
    sh_buf where = {0};
    int rc = SH_EINVAL;
    for (int all = 0; all < 2 && rc < 0; all++) {
        int n = 0;
        where.len = 0;
        for (int i = 0; i < j->nmem && n < 64; i++)
            if (all || j->mem[i].state <= M_RUNNING) {
                /* Its place keeps its devices and its bill's start (the
                 * wall time placed, moved onto the core's clock). */
                const srv_member *m = &j->mem[i];
                double since = m->t_placed > 0 ? now - (sh_now_wall() - m->t_placed) : 0;
                pl[n++] = (sched_place){s->nodes[m->node].name, 0, j->gpus_per_node, m->gpu_mask,
                                        since > 0 && since <= now ? since : 0};
                sh_buf_printf(&where, "%s%s", n > 1 ? "," : "", s->nodes[j->mem[i].node].name);
            }
        rc = n ? sched_job_restore(s->sc, sidv, pl, (size_t)n, now) : sh_err(SH_EINVAL, "no member left");
    }
    if (rc == SH_OK) {
        sh_buf_append(&where, "", 1);
        /* After an undone cycle nothing happened to the job: no event. */
        if (!s->reloading)
            rc = srv__db_event(s, j->id, NULL, "restored", "server restarted: attempt %d kept %s on %s",
                               j->attempt, srv__job_state_name(j->state), (char *)where.data);
        sh_buf_free(&where);
        return rc;
    }
    sh_buf_free(&where);
    char why[400];
    snprintf(why, sizeof why, "server restarted and could not restore the placement (%s)", sh_errmsg());
    sh_warn("job %lld: %s", (long long)j->id, why);
    if (j->policy == P_FAIL || ++j->failures >= j->max_attempts) return srv__finish(s, j, J_FAILED, -1, why);
    /* The core holds the job as queued: requeue it under a new attempt. */
    return srv__requeue(s, j, why, 1);
}

/* Rebuilds the core from the loaded model (after srv__db_load). */
int srv__seam_init(srv *s)
{
    sched_config c;
    sched_config_default(&c, SCHED_POLICY_SHOAL);
    c.bill_journal = 1; /* the ledger is the durable copy of the core's bills */
    if (s->cfg.default_est_s > 0) c.default_est_s = s->cfg.default_est_s;
    SH_TRY(srv__provider_config(s, &c));
    s->sc = sched_new(&c);
    if (!s->sc) return sh_err(SH_EINVAL, "scheduler: %s", sh_errmsg());
    double now = sh_now_mono();
    for (int i = 0; i < s->nnodes; i++)
        if (s->nodes[i].state != NODE_GONE) {
            SH_TRY(srv__seam_node(s, i, SEAM_UP));
            if (s->nodes[i].state == NODE_DEAD) SH_TRY(srv__seam_node(s, i, SEAM_DEAD));
        }
    for (int64_t id = 1; id <= s->njobs; id++) {
        srv_job *j = srv__job(s, id);
        if (!j || j->state > J_RUNNING) continue;
        char why[300];
        if (srv__seam_submit(s, j, why, sizeof why) != 0) {
            SH_TRY(srv__finish(s, j, J_FAILED, -1, why));
            continue;
        }
        if (j->state == J_PENDING) continue;
        SH_TRY(restore(s, j, now));
    }
    return SH_OK;
}

static srv_job *job_of(srv *s, const sched_decision *d) { return d->job ? srv__job(s, strtoll(d->job, NULL, 10)) : NULL; }

static int places_to_nodes(srv *s, const sched_place *p, size_t n, int *out)
{
    for (size_t i = 0; i < n; i++)
        if ((out[i] = srv__node_find(s, p[i].node)) < 0)
            return sh_err(SH_EINTERNAL, "scheduler placed work on unknown node %s", p[i].node);
    return SH_OK;
}

/* A replace keeps each survivor's rank on its node and gives the lost ranks
 * the replacement nodes. */
static int replace(srv *s, srv_job *j)
{
    char id[24];
    sid(j, id);
    sched_place pl[64];
    size_t n = sched_job_alloc(s->sc, id, pl, 64);
    if (n > 64 || (int)n != j->nprefer) return sh_err(SH_EINTERNAL, "job %s: replace with %zu places for %d ranks", id, n, j->nprefer);
    int nodes[64], used[64] = {0};
    SH_TRY(places_to_nodes(s, pl, n, nodes));
    int out[64];
    uint64_t masks[64];
    for (int r = 0; r < j->nprefer; r++) {
        out[r] = -1;
        for (size_t k = 0; k < n && out[r] < 0; k++)
            if (!used[k] && nodes[k] == j->prefer[r]) out[r] = nodes[k], masks[r] = pl[k].gpu_mask, used[k] = 1;
    }
    for (int r = 0; r < j->nprefer; r++)
        for (size_t k = 0; k < n && out[r] < 0; k++)
            if (!used[k]) out[r] = nodes[k], masks[r] = pl[k].gpu_mask, used[k] = 1;
    j->attempt++;
    return srv__start(s, j, out, masks, j->nprefer);
}

static int apply(srv *s, const sched_decision *d)
{
    srv_job *j = job_of(s, d);
    const sched_place *pl = s->dec.places + d->first;
    int nodes[4096];
    uint64_t masks[4096];
    if (d->count > 4096) return sh_err(SH_EINTERNAL, "decision with %zu places", d->count);
    for (size_t i = 0; i < d->count; i++) masks[i] = pl[i].gpu_mask;
    switch (d->kind) {
    case SCHED_D_START:
        if (!j || j->state != J_PENDING) return SH_OK;
        SH_TRY(places_to_nodes(s, pl, d->count, nodes));
        return srv__start(s, j, nodes, masks, (int)d->count);
    case SCHED_D_GROW:
        if (!j) return SH_OK;
        SH_TRY(places_to_nodes(s, pl, d->count, nodes));
        return srv__grow(s, j, nodes, masks, (int)d->count);
    case SCHED_D_SHRINK:
        if (!j) return SH_OK;
        SH_TRY(places_to_nodes(s, pl, d->count, nodes));
        return srv__shrink(s, j, nodes, masks, (int)d->count);
    case SCHED_D_PREEMPT:
        return j ? srv__requeue(s, j, "preempted by higher-priority work", 0) : SH_OK;
    case SCHED_D_REQUEUE:
        return j ? srv__requeue(s, j, j->reason[0] ? j->reason : "a node failed", 1) : SH_OK;
    case SCHED_D_REPLACE:
        return j && j->state == J_PENDING ? replace(s, j) : SH_OK;
    case SCHED_D_SCALE_UP:
        return srv__provider_create(s, d->zone, d->fabric, d->gpu_type, d->n);
    case SCHED_D_SCALE_DOWN:
        return srv__provider_delete(s, d->node);
    default:
        return SH_OK; /* hold and release belong to the firstfit baseline */
    }
}

int srv__seam_step(srv *s, double now)
{
    srv__heartbeats(s, now);
    int64_t k = 0;
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        if (j && j->state <= J_RUNNING) s->active[k++] = s->active[a];
    }
    s->nactive = k;
    SH_TRY(srv__time_limits(s, sh_now_wall()));
    SH_TRY(srv__settle_failures(s));
    int n = sched_step(s->sc, now, &s->dec);
    if (n < 0) return n;
    /* Before the decisions move attempts on.  A failed ledger write keeps
     * its bills in the core for the next step; the decisions the core has
     * taken are carried out regardless, so that the two never disagree. */
    if (srv__seam_bills(s) < 0) sh_warn("ledger: %s (the bills are kept for the next write)", sh_errmsg());
    for (size_t i = 0; i < s->dec.n; i++) SH_TRY(apply(s, &s->dec.v[i]));
    return SH_OK;
}
