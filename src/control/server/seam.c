/* The seam between the server and the scheduling core (src/control/sched).
 *
 * Every placement decision comes from sched_step(): the server tells the
 * core about nodes and jobs as events happen, then carries out the
 * decisions the core returns (start, grow, shrink, preempt, requeue,
 * replace, scale up and down).  The core is pure and in memory; after a
 * restart the server rebuilds it from SQLite: nodes are added, queued jobs
 * submitted again, and running jobs restored on the places they hold
 * (sched_job_restore), so that nothing running is moved or restarted. */
#include "srv_int.h"

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

int srv__seam_node(srv *s, int idx, int event)
{
    srv_node *n = &s->nodes[idx];
    double now = sh_now_mono();
    sched_node_info info;
    int known = sched_node_info_get(s->sc, n->name, &info) == 0;
    if (event == SEAM_UP) {
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

void srv__seam_free(srv *s)
{
    sched_decisions_free(&s->dec);
    sched_free(s->sc);
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
