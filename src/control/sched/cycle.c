/* The scheduling cycle: timeouts, the policy passes, reservations with
 * backfill, preemption, elastic growth and autoscaling. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cycle_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))


static int wait_add(sched *s, uint32_t ji)
{
    SH_TRY(GROW(s->cyc->waiting, s->cyc->capwaiting, s->cyc->nwaiting + 1));
    s->cyc->waiting[s->cyc->nwaiting++] = ji;
    return 0;
}

int sched__wait_add(sched *s, uint32_t ji) { return wait_add(s, ji); }

int sched__requeue(sched *s, uint32_t ji, double now, int failed)
{
    sjob *j = &s->jobs[ji];
    if (j->state == SCHED_RUNNING || j->state == SCHED_REPLACING) s->running--;
    sched__release_all(s, ji, now);
    j->over = 0;
    if (failed) {
        j->restarts++;
        s->st.requeues++;
        j->order = --s->head_seq;
    }
    j->pool = NONE;
    return sched__queue_push(s, ji, now);
}

/* ---- Starting work -------------------------------------------------------- */

static int start_places(sched *s, sched_decisions *d, uint32_t ji, const scand *c, int per,
                        double now)
{
    sjob *j = &s->jobs[ji];
    SH_TRY(sched__emit(s, d, SCHED_D_START, ji, NONE));
    for (int i = 0; i < c->n; i++) {
        SH_TRY(sched__hold(s, ji, c->nodes[i], j->gpn * per, now));
        SH_TRY(sched__emit_place(d, s, &j->places[j->nplaces - 1]));
    }
    return 0;
}

/* Marks a queued job running (its places are already held). */
static int mark_started(sched *s, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    sched__queue_remove(s, ji);
    j->state = SCHED_RUNNING;
    if (j->first_start < 0) j->first_start = now;
    j->start = now, j->over = 0;
    for (int k = 0; k < j->nplaces; k++) { /* its estimate moved */
        s->nodes[j->places[k].node].ver++;
        sched__pool_touch(s, s->nodes[j->places[k].node].pool);
    }
    j->wait_acc += now - j->queued_since;
    j->blocked_since = -1;
    j->scale_requested = 0;
    if (j->resv_promise >= 0 && now > j->resv_promise + 1e-6) s->resv_late++;
    j->resv_promise = -1;
    if (s->room->nresv) j->backfilled = 1;
    s->running++;
    s->st.starts++;
    return sched__due_add(s, ji);
}

/* Places up to max replicas of an elastic job, fastest type first, fullest
 * nodes first; 1 when at least `min` were found (then they are held). */
typedef struct ppool {
    double key; /* shoal: price per unit of work; baselines: list order */
    uint32_t pool;
    double speed;
} ppool;

static int cmp_ppool(const void *a, const void *b)
{
    double x = ((const ppool *)a)->key, y = ((const ppool *)b)->key;
    return x < y ? -1 : x > y;
}

/* Places up to max replicas of an elastic job on the fullest nodes that
 * fit; 1 when at least `min` were found (then they are held).  shoal takes
 * pools in order of price per unit of work (GPU price / the type's speed),
 * so a replica goes where its work is cheapest; the baselines take the
 * job's type order. */
static int place_elastic(sched *s, sched_decisions *d, uint32_t ji, int min, int max,
                         sched_decision_kind kind, double now)
{
    sjob *j = &s->jobs[ji];
    static __thread scand c;
    static __thread int per[SCHED__MAX_GANG];
    const uint32_t *jp;
    size_t njp = sched__job_pools(s, j, &jp);
    struct sporder *po = NULL;
    for (int k = 0; k < 16 && !s->plain_cycle && !po; k++) {
        struct sporder *e = &s->cyc->porder[k];
        if (e->ver == s->plc->pools_ver + 1 && e->ntypes == j->ntypes &&
            !memcmp(e->types, j->types, (size_t)j->ntypes * sizeof *j->types) &&
            !memcmp(e->speed, j->speed, (size_t)j->ntypes * sizeof *j->speed))
            po = e;
    }
    if (!po) {
        SH_TRY(sched__grow((void **)&s->cyc->scr.pp, &s->cyc->scr.cappp, njp + 1, sizeof *s->cyc->scr.pp));
        ppool *pp = s->cyc->scr.pp;
        for (size_t q = 0; q < njp; q++) {
            double sp = sched__job_speed(s, j, s->pools[jp[q]].type);
            pp[q] = (ppool){s->cfg.policy == SCHED_POLICY_SHOAL ? s->pools[jp[q]].price_s / sp : (double)q, jp[q], sp};
        }
        qsort(pp, njp, sizeof *pp, cmp_ppool);
        po = &s->cyc->porder[s->cyc->porder_next++ % 16];
        SH_TRY(sched__grow((void **)&po->pools, &po->cap, njp + 1, sizeof *po->pools));
        for (size_t q = 0; q < njp; q++) po->pools[q] = pp[q].pool;
        po->n = njp, po->ntypes = j->ntypes;
        memcpy(po->types, j->types, sizeof po->types), memcpy(po->speed, j->speed, sizeof po->speed);
        po->ver = s->plain_cycle ? 0 : s->plc->pools_ver + 1;
    }
    int got = 0;
    c.n = 0;
    for (size_t q = 0; q < po->n && got < max; q++) {
        spool *p = &s->pools[po->pools[q]];
        double end = now + sched__est_len(s, j, po->pools[q]);
        for (int f = j->gpn; f <= MAXG && got < max; f++)
            for (uint32_t ni = p->head[f]; ni != NONE && got < max; ni = s->nodes[ni].next) {
                snode *n = &s->nodes[ni];
                int k = f / j->gpn;
                if (k > max - got) k = max - got;
                while (k > 0 && n->resv_stamp == s->stamp && end > n->resv_T + 1e-9 &&
                       k * j->gpn > n->resv_spare)
                    k--;
                if (!k || c.n >= SCHED__MAX_GANG) continue;
                c.nodes[c.n] = ni, per[c.n++] = k, got += k;
            }
    }
    if (got < min || !got) return 0;
    SH_TRY(sched__emit(s, d, kind, ji, NONE));
    for (int i = 0; i < c.n; i++)
        for (int k = 0; k < per[i]; k++) {
            SH_TRY(sched__hold(s, ji, c.nodes[i], j->gpn, now));
            SH_TRY(sched__emit_place(d, s, &j->places[j->nplaces - 1]));
        }
    return 1;
}

/* Tries to start a queued job now; 1 started, 0 not, < 0 error. */
static int try_start(sched *s, sched_decisions *d, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    if (j->kind == SCHED_ELASTIC) {
        int rc = place_elastic(s, d, ji, j->nodes, j->maxr, SCHED_D_START, now);
        if (rc > 0) SH_TRY(mark_started(s, ji, now));
        return rc;
    }
    static __thread scand c;
    uint32_t pool;
    if (!sched__pick_pool(s, j, now, s->cfg.policy == SCHED_POLICY_SHOAL && s->cfg.pack_pools, &c, &pool)) return 0;
    j->pool = pool;
    SH_TRY(start_places(s, d, ji, &c, 1, now));
    SH_TRY(mark_started(s, ji, now));
    return 1;
}

/* Whether any allowed pool could hold the job ignoring reservations: when
 * not, the same shape cannot fit anywhere for the rest of this cycle. */
static int raw_fits(const sched *s, const sjob *j)
{
    int need = j->kind == SCHED_GANG ? j->nodes : 1;
    /* Counts over all pools of the job's types: too few such nodes in all
     * rules out every pool, and for one node they are the answer. */
    int total = 0;
    if (!j->ntypes) total = s->plc->ge_all[j->gpn];
    else
        for (int t = 0; t < j->ntypes; t++)
            if (j->types[t] < s->plc->ntpools) total += s->plc->tpools[j->types[t]].ge[j->gpn];
    if (total < need) return 0;
    if (need == 1) return 1;
    if (s->plain_cycle) {
        const uint32_t *jp;
        size_t n = sched__job_pools(s, j, &jp);
        for (size_t k = 0; k < n; k++)
            if (sched__pool_fits(&s->pools[jp[k]], need, j->gpn)) return 1;
        return 0;
    }
    /* The largest pool count of each allowed type answers for all its pools. */
    if (!j->ntypes) {
        for (uint32_t t = 0; t < s->plc->ntpools; t++)
            if (sched__type_fits(s, t, need, j->gpn)) return 1;
        return 0;
    }
    for (int t = 0; t < j->ntypes; t++)
        if (sched__type_fits(s, j->types[t], need, j->gpn)) return 1;
    return 0;
}

/* Whether some queued job of shape sh might start now: its placement with
 * the shortest run time any of them could have (min_len, at speed 1 on
 * every type) finds room.  Elastic shapes are assumed to.  The estimate
 * is a lower bound, so "no" is certain: a job only gets more room with a
 * shorter run. */
static void shape_probe(sched *s, const sshape *sh, sjob *probe)
{
    /* No memset: the probes are the scheduler's (scycle.scr) and only this sets them, and
     * the searches read no other field (clearing a whole sjob twice per
     * shape per sweep showed in perf). */
    probe->kind = sh->kind, probe->nodes = sh->nodes, probe->maxr = sh->nodes, probe->gpn = sh->gpn;
    probe->ntypes = sh->ntypes;
    probe->shape = sh->shape, probe->priority = sched__shape_max_prio(s, (sshape *)sh);
    memcpy(probe->types, sh->types, sizeof probe->types);
    probe->jp_ver = 0; /* its pool list is another shape's */
    for (int k = 0; k < probe->ntypes; k++) probe->speed[k] = 1.0;
    probe->est_s = sched__shape_min_len(s, (sshape *)sh);
}

/* Replicas of gpn GPUs the free GPUs of the job's pools could hold,
 * reservations aside: an upper bound of what place_elastic finds. */
static int free_replicas(const sched *s, const sjob *j)
{
    int r = 0;
    if (s->plain_cycle) {
        const uint32_t *jp;
        size_t n = sched__job_pools(s, j, &jp);
        for (size_t k = 0; k < n; k++)
            for (int f = j->gpn; f <= MAXG; f++) r += s->pools[jp[k]].count[f] * (f / j->gpn);
        return r;
    }
    /* The same from the counts by type (nodes with exactly f free GPUs are
     * ge[f] - ge[f + 1]): a sum over MAXG counters per type, not per pool. */
    for (int t = 0; t < (j->ntypes ? j->ntypes : 1); t++) {
        const int *ge = !j->ntypes ? s->plc->ge_all : j->types[t] < s->plc->ntpools ? s->plc->tpools[j->types[t]].ge : NULL;
        if (!ge) continue;
        for (int f = j->gpn; f <= MAXG; f++) r += (ge[f] - (f < MAXG ? ge[f + 1] : 0)) * (f / j->gpn);
    }
    return r;
}

static int shape_may_fit(sched *s, const sshape *sh, double now)
{
    sjob *const probe = &s->cyc->scr.probe_fit;
    static __thread scand c;
    shape_probe(s, sh, probe);
    if (!isfinite(probe->est_s)) return 0; /* none queued after all */
    if (sh->kind == SCHED_ELASTIC) return free_replicas(s, probe) >= sh->nodes;
    uint32_t pool;
    return raw_fits(s, probe) && sched__pick_pool(s, probe, now, 0, &c, &pool);
}

/* Whether some queued gang of shape sh might free room by preemption: a
 * search for the shape at its highest queued priority (a lower priority
 * has a subset of the victims, so it needs at least as many). */
static int shape_may_preempt(sched *s, const sshape *sh)
{
    sjob *const probe = &s->cyc->scr.probe_preempt;
    if (sh->kind != SCHED_GANG) return 0;
    shape_probe(s, sh, probe);
    return sched__preempt_possible(s, probe);
}

/* Marks dead, for this walk, every live shape no queued job of which can
 * start now.  Without it the walk only learns that a shape is dead when it
 * reaches one of its jobs, and a rare shape (a 64-node gang) sits deep in
 * the queue: with one job finishing per cycle, every cycle walked hundreds
 * of jobs that could not start to reach it.  Placement only gets harder as
 * the walk goes on until a preemption frees room (the walk then starts
 * its marks afresh), so a dead shape stays dead, and the walk's stop
 * changes no decision.  With preemptible work running, each shape is also
 * marked when none of its gangs could preempt. */
/* Whether the shape's jobs may use pool pi. */
static int shape_pool(const sched *s, const sshape *sh, uint32_t pi)
{
    if (!sh->ntypes) return 1;
    for (int k = 0; k < sh->ntypes; k++)
        if (sh->types[k] == s->pools[pi].type) return 1;
    return 0;
}

/* The pools the shape may use where room appeared after epoch `since`
 * and `test` says may now give a yes, into out (at most RELEASED); -1 when
 * the pools are not known.  Inline, so that each caller's test is a
 * direct call (the sweeps make 5 M of these per 100,000-job replay). */
static inline int shape_released(sched *s, const sshape *sh, uint64_t since, int prio, int (*test)(const sched *, const sshape *, uint32_t, int), uint32_t *out)
{
    const uint32_t *v;
    int n = sched__released_since(s, since, &v), m = 0;
    for (int k = 0; k < n; k++)
        if (shape_pool(s, sh, v[k]) && test(s, sh, v[k], prio)) out[m++] = v[k];
    return n < 0 ? -1 : m;
}

/* Pool pi has enough nodes with room for the gang, reservations aside. */
static int pool_may_fit(const sched *s, const sshape *sh, uint32_t pi, int prio)
{
    (void)prio;
    return sched__pool_fits(&s->pools[pi], sh->nodes, sh->gpn);
}

/* Pool pi passes the preemption search's first tests for the gang. */
static int pool_may_preempt(const sched *s, const sshape *sh, uint32_t pi, int prio)
{
    return sched__pool_may_preempt(s, &s->pools[pi], sh->nodes, sh->gpn, prio);
}

/* The probe of gang shape arg (for sched__preempt_possible_in). */
static const sjob *gang_probe(sched *s, void *arg)
{
    sjob *const probe = &s->cyc->scr.probe_gang;
    shape_probe(s, arg, probe);
    return probe;
}

/* shape_may_fit for a gang shape that fitted in none of its pools before,
 * since when room appeared only in pools[0 .. n): the others still have
 * none (see shape_may_fit_kept), so only these need a look. */
static int shape_may_fit_in(sched *s, const sshape *sh, double now, const uint32_t *pools, int n)
{
    sjob *const probe = &s->cyc->scr.probe_fit_in;
    static __thread scand c;
    if (!n) return 0;
    shape_probe(s, sh, probe);
    if (!isfinite(probe->est_s)) return 0;
    for (int k = 0; k < n; k++)
        if (sched__pick_gang(s, probe, pools[k], now + sched__est_len(s, probe, pools[k]), &c)) return 1;
    return 0;
}

/* shape_may_fit with its answer kept across cycles (sshape.nf_*).  A
 * release or a node coming back only adds room in its own pool, so after
 * releases in a few known pools the "no" is checked in those alone. */
static int shape_may_fit_kept(sched *s, sshape *sh, double now)
{
    double len = sched__shape_min_len(s, sh);
    uint64_t epoch = s->release_epoch;
    int keep = s->room->nresv <= 4, same = keep && sh->nf_ok && sh->nf_sig == s->room->resv_sig && len >= sh->nf_len &&
                                     now >= sh->nf_now;
    for (size_t k = 0; k < s->room->nresv && same; k++)
        same = s->room->resv_T[k] <= sh->nf_T[k] && s->room->resv_slack[k] <= sh->nf_slack[k];
    if (same && sh->nf_epoch == epoch) return 0;
    uint32_t rel[RELEASED];
    int nrel = same && sh->kind == SCHED_GANG ? shape_released(s, sh, sh->nf_epoch, 0, pool_may_fit, rel) : -1;
    int r = nrel >= 0 ? shape_may_fit_in(s, sh, now, rel, nrel) : shape_may_fit(s, sh, now);
    if (!r && keep) {
        sh->nf_ok = 1, sh->nf_epoch = epoch, sh->nf_sig = s->room->resv_sig, sh->nf_len = len, sh->nf_now = now;
        memcpy(sh->nf_T, s->room->resv_T, sizeof sh->nf_T), memcpy(sh->nf_slack, s->room->resv_slack, sizeof sh->nf_slack);
    }
    return r;
}

/* shape_may_preempt for a dead shape, its "no" kept across cycles
 * (sshape.np_*), and after releases in known pools checked there alone. */
static int shape_may_preempt_kept(sched *s, sshape *sh)
{
    int prio = sched__shape_max_prio(s, sh);
    uint64_t epoch = s->release_epoch;
    int same = sh->np_ok && sh->np_sig == s->room->resv_sig && prio <= sh->np_prio;
    if (same && sh->np_epoch == epoch) return 0;
    uint32_t rel[RELEASED];
    int nrel = same && sh->kind == SCHED_GANG ? shape_released(s, sh, sh->np_epoch, prio, pool_may_preempt, rel) : -1, r;
    if (nrel >= 0) r = sched__preempt_possible_in(s, sh->shape, prio, gang_probe, sh, rel, nrel);
    else r = shape_may_preempt(s, sh);
    if (!r) sh->np_ok = 1, sh->np_epoch = epoch, sh->np_sig = s->room->resv_sig, sh->np_prio = prio;
    return r;
}

/* Whether every queued gang of shape sh would turn its victims down
 * (preempt_wait): the shape's shortest run (min_len, a lower bound of each
 * job's on any pool) is turned down, and all its gangs share the start
 * time without victims (a gang holding the reservation starts no later).
 * Asked only once every shape is dead and the reservations are made:
 * nothing can start or be preempted for the rest of the walk, so the
 * answer holds until the walk ends; it is not kept across walks (a start
 * elsewhere may move the time later).
 *
 * The walk still visits the shape while one of its gangs that was never
 * turned down has victims (a search at the highest priority among such
 * gangs: fewer for a lower one): that visit turns it down and counts it
 * in preempt_declined, as the reference's walk, which visits every job,
 * does.  A gang is counted once, so passing over gangs already counted
 * leaves the count as the reference's. */
static int shape_declined(sched *s, sshape *sh, double now)
{
    sjob *const probe = &s->cyc->scr.probe_declined;
    if (sh->kind != SCHED_GANG || !(s->cfg.preempt_wait > 0) || !s->room->nresv) return 0;
    shape_probe(s, sh, probe);
    if (!isfinite(probe->est_s)) return 0;
    int no = sched__preempt_declined(s, probe, NONE, now) > 0, prio;
    if (no && sched__shape_undeclined_prio(s, sh, &prio)) {
        probe->priority = prio;
        no = !sched__preempt_possible(s, probe);
    }
    return no;
}

static void sweep_shapes(sched *s, uint64_t walk_id, size_t *dead, size_t *nopre, uint64_t *calm, double now)
{
    for (size_t i = 0; i < s->nshapes_live && *dead < s->nshapes_live; i++) {
        sshape *sh = &s->shapes[s->live[i]];
        if (sh->dead_walk != walk_id && !shape_may_fit_kept(s, sh, now)) sh->dead_walk = walk_id, (*dead)++;
    }
    /* Whether a gang shape's jobs have nothing left to do in this walk:
     * a dead gang shape whose search fails stays so for the rest of the
     * walk (calm_walk marks it): a gang that cannot be placed has too few
     * free unreserved nodes in every pool, and a start never makes its
     * search succeed (a start that takes a free node adds at most one
     * candidate while the gang needs one more, and adding a victim with
     * the GPUs it took never lowers a node's count of victims).  A gang
     * shape that is not dead may fit now and need victims after later
     * starts.  When every gang shape is marked, no queued gang can preempt
     * for the rest of the walk (*calm = walk_id). */
    int all = 1;
    for (size_t i = 0; i < s->nshapes_live; i++) {
        sshape *sh = &s->shapes[s->live[i]];
        if (sh->kind != SCHED_GANG || sh->calm_walk == walk_id || sh->nopre_walk == walk_id) continue;
        if (sh->dead_walk == walk_id && !shape_may_preempt_kept(s, sh)) sh->calm_walk = walk_id;
        else all = 0;
    }
    if (all) *calm = walk_id;
    /* Only when every shape is dead may the walk stop, if none can preempt either. */
    if (*dead < s->nshapes_live || !s->preemptible_gpus) return;
    for (size_t i = 0; i < s->nshapes_live && *nopre < s->nshapes_live; i++) {
        sshape *sh = &s->shapes[s->live[i]];
        if (sh->nopre_walk == walk_id) continue;
        if (sh->calm_walk != walk_id && shape_may_preempt_kept(s, sh) && !shape_declined(s, sh, now)) return;
        sh->nopre_walk = walk_id, (*nopre)++;
    }
}

/* ---- Queue order ------------------------------------------------------------ */

/* The next job to consider: the best head among tenant queues.  shoal
 * orders by priority, then by the tenant's GPUs in use (fair share), then by
 * queue order; the baselines by priority and queue order alone. */
/* The queue key of a job.  Baselines: its queue order.  shoal adds fair
 * share as a bounded handicap: a tenant holding a fraction f of the GPUs in
 * use has its jobs ordered as if submitted f x fair_window_s later.  Tenants
 * alternate within that window, and beyond it age wins, so fair share never
 * starves a job (an unbounded share term would: the heavy tenant's oldest
 * gang waits for as long as lighter tenants keep submitting). */
static double job_key(const sched *s, const sjob *j, int fair)
{
    if (j->order < 0) return j->order - 1e18; /* requeued after a failure: the head */
    if (!fair || s->gpus_busy <= 0) return j->submit;
    double f = (double)s->tenants[j->tenant].gpus_in_use / (double)s->gpus_busy;
    return j->submit + f * s->cfg.fair_window_s;
}

/* The entry of a shape with jobs queued, or NULL (a lookup that adds nothing). */
static const sshape *shape_find(const sched *s, uint64_t shape)
{
    if (!s->capshapes) return NULL;
    size_t k = shape & (s->capshapes - 1);
    while (s->shapes[k].shape && s->shapes[k].shape != shape) k = (k + 1) & (s->capshapes - 1);
    return s->shapes[k].shape ? &s->shapes[k] : NULL;
}

/* shape_find for a queued job, first at the slot it was queued with: a
 * slot that holds the job's shape is that shape's entry (the skip-ahead
 * and the passing over of idle jobs look up every job they reach). */
static const sshape *job_shape(const sched *s, const sjob *j)
{
    if (j->shape_slot < s->capshapes && s->shapes[j->shape_slot].shape == j->shape) return &s->shapes[j->shape_slot];
    return shape_find(s, j->shape);
}

/* Moves tenant t's cursor past the holes that starts left and, when
 * skip_walk is set, past jobs whose shape walk skip_walk marked dead,
 * counting those in *skipped. */
static void advance(const sched *s, stenant *t, uint64_t skip_walk, int *skipped)
{
    while (t->cursor < t->nq) {
        uint32_t q = t->queue[t->cursor];
        if (q != NONE) { /* NONE: started */
            if (!skip_walk || (t->live_pos == t->cursor && t->live_walk == skip_walk)) return;
            const sshape *sh = job_shape(s, &s->jobs[q]);
            if (!sh || sh->dead_walk != skip_walk) {
                t->live_pos = t->cursor, t->live_walk = skip_walk;
                return;
            }
            (*skipped)++;
        }
        t->cursor++;
    }
}

/* Whether job j has nothing to do in walk walk_id once the reservations
 * are made: its shape is dead and, for a gang, cannot preempt. */
static int job_idle(const sched *s, const sjob *j, uint64_t walk_id)
{
    const sshape *sh = job_shape(s, j);
    return sh && sh->dead_walk == walk_id &&
           (sh->kind != SCHED_GANG || sh->calm_walk == walk_id || sh->nopre_walk == walk_id);
}

/* Tenant t's head ahead of tenant u's in next_job's order: priority, then
 * key, then queue order, then the later tenant (the scan's tie rule). */
static int head_before(const stenant *t, const stenant *u)
{
    if (t->kc_prio != u->kc_prio) return t->kc_prio > u->kc_prio;
    if (t->kc_key != u->kc_key) return t->kc_key < u->kc_key;
    if (t->kc_order != u->kc_order) return t->kc_order < u->kc_order;
    return t > u;
}

/* Moves tenant t's cursor to its next head (see advance) and refreshes its
 * cached key; 0 when its queue is exhausted. */
static inline int head(sched *s, stenant *t, uint64_t kver, int fair, uint64_t skip_walk, int *skipped)
{
    if (t->cursor >= t->nq) return 0;
    uint32_t ji = t->queue[t->cursor];
    if (ji == NONE || skip_walk) {
        advance(s, t, skip_walk, skipped);
        if (t->cursor >= t->nq) return 0;
        ji = t->queue[t->cursor];
    }
    if (t->kc_job != ji || t->kc_ver != kver || !kver) {
        const sjob *a = &s->jobs[ji];
        t->kc_job = ji, t->kc_ver = kver;
        t->kc_key = job_key(s, a, fair), t->kc_prio = a->priority, t->kc_order = a->order;
    }
    return 1;
}

/* Empties every tenant's cursor (a new walk over the queue). */
static void cursors_reset(sched *s)
{
    for (size_t t = 0; t < s->ntenants; t++) s->tenants[t].cursor = 0;
    s->cyc->nj_ok = 0;
}

/* skip_walk (0: none) skips, in every tenant queue, the jobs of shapes that
 * walk marked dead; *skipped counts them.  The caller moves the returned
 * tenant's cursor on (by one) or starts its job; while nothing else moved
 * and no key changed, only that tenant's new head is placed among the
 * others' (scycle.nj_ord). */
static uint32_t next_job(sched *s, uint32_t *tenant, int fair, uint64_t skip_walk, int *skipped)
{
    /* The key cache's version: the fair-share state and the order asked
     * for; 0 (never stored) in a plain cycle, which recomputes every key. */
    const uint64_t kver = s->plain_cycle ? 0 : s->busy_ver * 2 + 2 + (fair != 0);
    stenant *ts = s->tenants;
    if (s->cyc->nj_ok && s->cyc->nj_kver == kver && s->cyc->nj_walk == s->cyc->walk_id && !skip_walk && s->cyc->nj_n &&
        ts[s->cyc->nj_ord[0]].cursor == s->cyc->nj_cursor + 1) {
        uint32_t l = s->cyc->nj_ord[0];
        size_t k = 1, n = s->cyc->nj_n;
        if (!head(s, &ts[l], kver, fair, 0, skipped)) {
            memmove(s->cyc->nj_ord, s->cyc->nj_ord + 1, (n - 1) * sizeof *s->cyc->nj_ord);
            s->cyc->nj_n = --n;
        } else {
            for (; k < n && head_before(&ts[s->cyc->nj_ord[k]], &ts[l]); k++) s->cyc->nj_ord[k - 1] = s->cyc->nj_ord[k];
            s->cyc->nj_ord[k - 1] = l;
        }
    } else {
        /* Every tenant's head; kept in order when there are few tenants. */
        int keep = kver && !skip_walk && s->ntenants <= NJ_MAX;
        size_t n = 0;
        uint32_t best = NONE;
        for (uint32_t t = 0; t < s->ntenants; t++) {
            if (!head(s, &ts[t], kver, fair, skip_walk, skipped)) continue;
            if (best == NONE || head_before(&ts[t], &ts[best])) best = t;
            if (keep) {
                size_t k = n++;
                for (; k > 0 && head_before(&ts[t], &ts[s->cyc->nj_ord[k - 1]]); k--) s->cyc->nj_ord[k] = s->cyc->nj_ord[k - 1];
                s->cyc->nj_ord[k] = t;
            }
        }
        if (!keep) {
            s->cyc->nj_ok = 0;
            if (best == NONE) return *tenant = NONE, NONE;
            *tenant = best;
            return ts[best].queue[ts[best].cursor];
        }
        s->cyc->nj_ok = 1, s->cyc->nj_n = n, s->cyc->nj_kver = kver, s->cyc->nj_walk = s->cyc->walk_id;
    }
    if (!s->cyc->nj_n) return *tenant = NONE, NONE;
    stenant *b = &ts[s->cyc->nj_ord[0]];
    s->cyc->nj_cursor = b->cursor;
    *tenant = s->cyc->nj_ord[0];
    return b->queue[b->cursor];
}

/* ---- Policy passes ---------------------------------------------------------- */

#define MEMO 512
#define MAX_SCAN 4096 /* blocked jobs examined per cycle (Slurm's bf_max_job_test) */
#define RESERVE_SCAN 64 /* shoal: oldest jobs examined for reservations */

/* Jobs of one shape that failed to start with estimate >= est will fail
 * again this cycle: placement only gets harder as the cycle goes on (until
 * a preemption frees room, which clears the memo). */
typedef struct smemo {
    uint64_t shape;
    double est;
    uint64_t epoch; /* the entry is empty unless this is the walk's epoch */
} smemo;

static int has_reservation(const sched *s, uint32_t ji)
{
    for (size_t i = 0; i < s->room->nresv; i++)
        if (s->room->resv[i].job == ji) return 1;
    return 0;
}

/* One walk over the queue.  fair: shoal's fair-share order, else priority
 * and age.  reserve_only: stop once the reservations are made (shoal's
 * first walk, which gives them to the oldest blocked gangs rather than to
 * the tenants fair share favours).  Returns < 0 on error. */
static int walk(sched *s, sched_decisions *d, double now, int fair, int reserve_only)
{
    /* Per-thread, emptied by a new epoch rather than cleared: clearing 8 KiB
     * twice per cycle showed in perf. */
    static __thread smemo memo[MEMO];
    static __thread uint64_t memo_epoch;
    uint64_t ep = ++memo_epoch;
    uint32_t last_preempted = NONE;
    int scanned = 0, limit = reserve_only ? RESERVE_SCAN : MAX_SCAN;
    size_t max_resv = (size_t)s->cfg.max_reservations, dead = 0, nopre = 0;
    uint64_t walk_id = ++s->cyc->walk_id;
    /* Sweeps leave the stop to chance when autoscaling: blocked_since is
     * set only on the jobs a walk reaches, and scale-ups read it. */
    int sweep = !s->plain_cycle && !(s->cfg.autoscale && s->nquotas), next_sweep = 0;
    /* Skipping ahead: once the reservations are made and no queued gang
     * can preempt, a job of a dead shape has nothing left to do in this
     * walk (no start, no victim, no reservation), so the tenant queues skip
     * past such jobs without visiting them.  The order of the jobs still
     * visited is the walk's own: each tenant queue is sorted by queue key
     * (while submit times never go back), and taking out jobs the walk
     * would pass over leaves the merge of the rest as it was.  Skipped jobs
     * count as scanned, and the walk only skips while it cannot reach its
     * scan limit. */
    int can_skip = sweep && !reserve_only && s->cfg.policy != SCHED_POLICY_FIFO && !s->submit_unsorted;
    uint64_t calm = 0; /* walk_id when no queued gang can preempt */
    /* Visiting a job whose shape is dead and, for a gang, unable to preempt
     * (sweep_shapes) does nothing once the reservations are made: such a
     * job is passed over where the walk reaches it, before it is tried
     * (with calm, skipping ahead does the same for the rest at once). */
    int idle_walk = can_skip;
    cursors_reset(s);
    for (;;) {
        int quiet = !s->preemptible_gpus || nopre >= s->nshapes_live, skipped = 0;
        uint64_t skip_walk = can_skip && calm == walk_id && s->room->nresv >= max_resv &&
                                     (size_t)scanned + s->queued < (size_t)limit
                                 ? walk_id : 0;
        uint32_t ti, ji = next_job(s, &ti, fair, skip_walk, &skipped);
        scanned += skipped;
        if (ji == NONE || scanned >= limit || (reserve_only && s->room->nresv >= max_resv)) break;
        if (sweep && scanned >= next_sweep && s->room->nresv >= max_resv && (dead < s->nshapes_live || !quiet)) {
            sweep_shapes(s, walk_id, &dead, &nopre, &calm, now);
            next_sweep = scanned * 2 + 16;
            quiet = !s->preemptible_gpus || nopre >= s->nshapes_live;
        }
        /* No shape still queued can start or preempt: the rest of the walk
         * could only make reservations, and those are all made. */
        if (dead >= s->nshapes_live && s->room->nresv >= max_resv && quiet) break;
        sjob *j = &s->jobs[ji];
        if (s->gpus_up - s->gpus_busy <= 0 && s->room->nresv >= max_resv)
            break; /* nothing can start and no reservation is left to make */
        if (idle_walk && s->room->nresv >= max_resv && job_idle(s, j, walk_id)) {
            s->tenants[ti].cursor++, scanned++;
            if (j->blocked_since < 0) j->blocked_since = now;
            continue;
        }
        int rc = 0;
        size_t m = j->shape % MEMO;
        if (memo[m].epoch != ep || memo[m].shape != j->shape || j->est_s < memo[m].est) {
            double est = 0;
            if (raw_fits(s, j)) {
                if ((rc = try_start(s, d, ji, now)) < 0) return rc;
                est = j->est_s;
            }
            if (!rc) {
                if (memo[m].epoch == ep && memo[m].shape == j->shape && memo[m].est < est) est = memo[m].est;
                memo[m].shape = j->shape, memo[m].est = est, memo[m].epoch = ep;
                /* No queued job of the shape has a shorter estimate: the
                 * whole shape is blocked for the rest of the walk. */
                sshape *sh = sched__shape(s, j->shape);
                if (sh && sh->dead_walk != walk_id && est <= sh->min_est) sh->dead_walk = walk_id, dead++;
            }
        }
        if (rc == 1) continue; /* it left the queue: the cursor already points past it */
        s->tenants[ti].cursor++;
        scanned++;
        if (j->blocked_since < 0) j->blocked_since = now;
        if (s->cfg.policy == SCHED_POLICY_FIFO) return 1; /* strict order: nothing passes the head */
        if (j->kind == SCHED_GANG && s->cfg.max_victims && s->preemptible_gpus && last_preempted != ji) {
            if ((rc = sched__try_preempt(s, d, ji, now)) < 0) return rc;
            if (rc) {
                last_preempted = ji;
                ep = ++memo_epoch; /* empties the memo */
                walk_id = ++s->cyc->walk_id, dead = nopre = 0; /* room was freed: marks lapse */
                s->tenants[ti].cursor--; /* try it again now that room was made */
                continue;
            }
        }
        if (j->kind == SCHED_GANG && s->room->nresv < max_resv && !has_reservation(s, ji))
            SH_TRY(sched__make_reservation(s, ji, now));
    }
    return 0;
}

/* fifo, backfill and shoal: start what fits in queue order without
 * delaying a reservation, and reserve for the first blocked gangs.  shoal
 * first reserves for the oldest blocked gangs, then fills in fair-share
 * order. */
static int queue_pass(sched *s, sched_decisions *d, double now)
{
    int fair = s->cfg.policy == SCHED_POLICY_SHOAL, rc = 0;
    s->walking = 1;
    if (fair) rc = walk(s, d, now, 0, 1);
    sched__queue_compact(s);
    if (rc >= 0) rc = walk(s, d, now, fair, 0);
    s->walking = 0;
    sched__queue_compact(s);
    return rc < 0 ? rc : 0;
}

/* firstfit: Kubernetes-style per-pod placement.  Each pod of a gang takes
 * the least allocated node that fits (kube-scheduler's default spreading) in
 * the gang's pool; a gang that cannot place every pod holds the pods it has
 * until hold_timeout_s (the coscheduling Permit wait), then lets them go. */
static int firstfit_gang(sched *s, sched_decisions *d, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    if (j->nplaces == 0) {
        j->pool = NONE;
        const uint32_t *jp;
        size_t njp = sched__job_pools(s, j, &jp);
        for (size_t q = 0; q < njp && j->pool == NONE; q++)
            if (sched__pool_fits(&s->pools[jp[q]], 1, j->gpn)) j->pool = jp[q];
        if (j->pool == NONE) return 0;
    }
    spool *p = &s->pools[j->pool];
    uint64_t mark = ++s->cyc->markseq;
    for (int k = 0; k < j->nplaces; k++) s->nodes[j->places[k].node].mark = mark;
    int first = j->nplaces;
    for (int f = MAXG; f >= j->gpn && j->nplaces < j->nodes; f--)
        for (uint32_t ni = p->head[f]; ni != NONE && j->nplaces < j->nodes;) {
            uint32_t next = s->nodes[ni].next;
            if (s->nodes[ni].mark != mark) {
                s->nodes[ni].mark = mark;
                SH_TRY(sched__hold(s, ji, ni, j->gpn, now));
            }
            ni = next;
        }
    if (j->nplaces == j->nodes) {
        if (j->state == SCHED_HOLDING)
            for (int k = 0; k < j->nplaces; k++) {
                s->st.held_gpu_s += (now - j->places[k].since) * j->places[k].gpus;
                j->places[k].since = now;
            }
        SH_TRY(sched__emit(s, d, SCHED_D_START, ji, NONE));
        for (int k = 0; k < j->nplaces; k++)
            SH_TRY(sched__emit_place(d, s, &j->places[k]));
        SH_TRY(mark_started(s, ji, now));
        return 1;
    }
    if (j->nplaces > first) {
        if (j->state == SCHED_QUEUED) {
            j->state = SCHED_HOLDING;
            j->hold_since = now;
            s->st.partial_gangs++;
            SH_TRY(wait_add(s, ji));
        }
        SH_TRY(sched__emit(s, d, SCHED_D_HOLD, ji, NONE));
        for (int k = first; k < j->nplaces; k++)
            SH_TRY(sched__emit_place(d, s, &j->places[k]));
    }
    return 0;
}

static int firstfit_pass(sched *s, sched_decisions *d, double now)
{
    cursors_reset(s);
    int scanned = 0;
    uint64_t memo[MEMO] = {0}; /* shapes with no room for even one pod */
    for (;;) {
        uint32_t ti, ji = next_job(s, &ti, 0, 0, NULL);
        if (ji == NONE || scanned >= MAX_SCAN || s->gpus_up - s->gpus_busy <= 0) break;
        sjob *j = &s->jobs[ji];
        int rc = 0;
        if (memo[j->shape % MEMO] == j->shape && !j->nplaces) {
            s->tenants[ti].cursor++, scanned++;
            continue;
        }
        if (j->kind == SCHED_GANG) {
            int had = j->nplaces;
            rc = firstfit_gang(s, d, ji, now);
            if (rc == 0 && !had && !j->nplaces) memo[j->shape % MEMO] = j->shape;
        } else rc = try_start(s, d, ji, now);
        if (rc < 0) return rc;
        if (rc == 1) continue;
        s->tenants[ti].cursor++;
        scanned++;
        if (j->blocked_since < 0) j->blocked_since = now;
    }
    return 0;
}

/* ---- Timeouts: held partial gangs and gangs waiting for a spare node ------- */

static int find_spare(sched *s, uint32_t ji)
{
    sjob *j = &s->jobs[ji];
    spool *p = &s->pools[j->pool];
    uint64_t mark = ++s->cyc->markseq;
    for (int k = 0; k < j->nplaces; k++) s->nodes[j->places[k].node].mark = mark;
    for (int f = j->gpn; f <= MAXG; f++)
        for (uint32_t ni = p->head[f]; ni != NONE; ni = s->nodes[ni].next)
            if (s->nodes[ni].mark != mark) return (int)ni;
    return -1;
}

static int expire(sched *s, sched_decisions *d, double now)
{
    size_t w = 0;
    for (size_t i = 0; i < s->cyc->nwaiting; i++) {
        uint32_t ji = s->cyc->waiting[i];
        sjob *j = &s->jobs[ji];
        if (j->state == SCHED_HOLDING && now >= j->hold_since + s->cfg.hold_timeout_s - 1e-9) {
            for (int k = 0; k < j->nplaces; k++)
                s->st.held_gpu_s += (now - j->places[k].since) * j->places[k].gpus;
            sched__release_all(s, ji, now);
            j->state = SCHED_QUEUED; /* it kept its place in the queue */
            s->st.hold_timeouts++;
            SH_TRY(sched__emit(s, d, SCHED_D_RELEASE, ji, NONE));
            continue;
        }
        if (j->state == SCHED_REPLACING) {
            int ni = find_spare(s, ji);
            if (ni >= 0) {
                SH_TRY(sched__hold(s, ji, (uint32_t)ni, j->gpn, now));
                j->state = SCHED_RUNNING;
                s->st.replaces++;
                SH_TRY(sched__emit(s, d, SCHED_D_REPLACE, ji, NONE));
                SH_TRY(sched__emit_place(d, s, &j->places[j->nplaces - 1]));
                continue;
            }
            if (now >= j->replace_deadline - 1e-9) {
                SH_TRY(sched__requeue(s, ji, now, 1));
                SH_TRY(sched__emit(s, d, SCHED_D_REQUEUE, ji, NONE));
                continue;
            }
        }
        if (j->state != SCHED_HOLDING && j->state != SCHED_REPLACING) continue;
        s->cyc->waiting[w++] = ji;
    }
    s->cyc->nwaiting = w;
    return 0;
}

/* ---- Elastic growth and autoscaling --------------------------------------- */

static int grow_pass(sched *s, sched_decisions *d, double now)
{
    /* Growth fills only GPUs no queued job wants: replicas grown while gangs
     * wait hold GPUs that gangs of the same or lower priority cannot take
     * back, and on the mixed replays they cost small gangs more wait at
     * p99 than they gave elastic jobs. */
    if (s->queued && !(s->cfg.policy == SCHED_POLICY_SHOAL && s->cfg.grow_queued)) return 0;
    for (size_t i = 0; i < s->cyc->nelastic && s->gpus_up > s->gpus_busy; i++) {
        uint32_t ji = s->cyc->elastic[i];
        sjob *j = &s->jobs[ji];
        if (j->state != SCHED_RUNNING || j->nplaces >= j->maxr) continue;
        SH_TRY(place_elastic(s, d, ji, 1, j->maxr - j->nplaces, SCHED_D_GROW, now));
    }
    return 0;
}

/* Nodes of the quota's (zone, fabric, type) that could take a pod of the
 * job now: only the shortfall is asked of the provider. */
static int quota_have(const sched *s, const squota *q, int g)
{
    const uint32_t *tp;
    size_t n = sched__type_pools(s, q->type, &tp);
    for (size_t k = 0; k < n; k++) {
        const spool *p = &s->pools[tp[k]];
        if (p->zone != q->zone || p->fabric != q->fabric) continue;
        int have = 0;
        for (int f = g; f <= MAXG; f++) have += p->count[f];
        return have;
    }
    return 0;
}

static int scale_up(sched *s, sched_decisions *d, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    squota *best = NULL;
    int best_need = 0;
    for (size_t q = 0; q < s->nquotas; q++) {
        squota *qq = &s->quotas[q];
        if (qq->gpus < j->gpn || (j->ntypes && sched__job_speed(s, j, qq->type) <= 0)) continue;
        int need = j->nodes - quota_have(s, qq, j->gpn);
        if (need < 1) need = 1;
        if (qq->max_nodes - qq->provisioned - qq->pending < need) continue;
        if (!best || qq->price_h < best->price_h || (qq->price_h == best->price_h && need < best_need))
            best = qq, best_need = need;
    }
    if (!best) return 0;
    SH_TRY(sched__emit(s, d, SCHED_D_SCALE_UP, ji, NONE));
    sched_decision *x = &d->v[d->n - 1];
    x->zone = s->name[best->zone], x->fabric = s->name[best->fabric];
    x->gpu_type = s->name[best->type];
    x->n = best_need, x->ready_s = now + best->delay_s;
    best->pending += best_need;
    j->scale_requested = 1;
    s->st.scale_ups++;
    return 0;
}

static int autoscale(sched *s, sched_decisions *d, double now)
{
    for (size_t t = 0; t < s->ntenants; t++) {
        stenant *tn = &s->tenants[t];
        for (size_t i = 0; i < tn->nq; i++) {
            sjob *j = &s->jobs[tn->queue[i]];
            if (j->kind != SCHED_GANG || j->scale_requested || j->blocked_since < 0) continue;
            double due = j->blocked_since + s->cfg.scale_up_wait_s;
            if (now >= due - 1e-9) SH_TRY(scale_up(s, d, tn->queue[i], now));
            else if (due < s->cyc->next_wake) s->cyc->next_wake = due;
        }
    }
    for (size_t ni = 0; ni < s->nnodes; ni++) {
        snode *n = &s->nodes[ni];
        if (!n->provisioned || n->state != SCHED_NODE_UP || n->nrefs || n->resv_stamp == s->stamp)
            continue;
        double due = n->idle_since + s->cfg.scale_down_idle_s;
        if (now < due - 1e-9) {
            if (due < s->cyc->next_wake) s->cyc->next_wake = due;
            continue;
        }
        sched__node_updown(s, (uint32_t)ni, -1);
        n->state = SCHED_NODE_DRAINING;
        s->st.scale_downs++;
        SH_TRY(sched__emit(s, d, SCHED_D_SCALE_DOWN, NONE, (uint32_t)ni));
    }
    return 0;
}

/* ---- The cycle ---------------------------------------------------------------- */

static int flush_pending(sched *s, sched_decisions *d)
{
    for (size_t i = 0; i < s->npend; i++) {
        spending *p = &s->pend[i];
        SH_TRY(sched__emit(s, d, p->kind, p->job, p->node));
        if (p->kind == SCHED_D_SHRINK && p->node != NONE) s->st.shrinks++;
    }
    s->npend = 0;
    return 0;
}

int sched_step(sched *s, double now, sched_decisions *d)
{
    d->n = d->n_places = 0;
    s->stamp++; /* reservations of the previous cycle lapse */
    sched__room_begin(s);
    s->cyc->next_wake = INFINITY;
    int rc = sched__overdue(s, now);
    if (!rc) rc = flush_pending(s, d);
    if (!rc) rc = expire(s, d, now);
    if (!rc && s->cfg.policy == SCHED_POLICY_FIRSTFIT) {
        s->walking = 1;
        rc = firstfit_pass(s, d, now);
        s->walking = 0;
        sched__queue_compact(s);
    } else if (!rc) rc = queue_pass(s, d, now);
    if (!rc) rc = grow_pass(s, d, now);
    if (!rc && s->cfg.autoscale && s->nquotas) rc = autoscale(s, d, now);
    for (size_t i = 0; i < s->room->ndeferred && !rc; i++) rc = sched__queue_push(s, s->room->deferred[i], now);
    s->room->ndeferred = 0;
    for (size_t i = 0; i < s->cyc->nwaiting; i++) {
        const sjob *j = &s->jobs[s->cyc->waiting[i]];
        double due = j->state == SCHED_HOLDING ? j->hold_since + s->cfg.hold_timeout_s
                                               : j->replace_deadline;
        if (due < s->cyc->next_wake) s->cyc->next_wake = due;
    }
    s->st.decisions += d->n;
    return rc < 0 ? rc : (int)d->n;
}

double sched_next_wakeup(const sched *s) { return s->cyc->next_wake; }

size_t sched__queue_order(sched *s, uint32_t *out, size_t cap)
{
    cursors_reset(s);
    size_t n = 0;
    while (n < cap) {
        uint32_t ti, ji = next_job(s, &ti, s->cfg.policy == SCHED_POLICY_SHOAL, 0, NULL);
        if (ji == NONE) break;
        out[n++] = ji;
        s->tenants[ti].cursor++;
    }
    return n;
}

size_t sched_queue(const sched *s, const char **out, size_t cap)
{
    /* Walk the tenant queues in the policy's order without disturbing the
     * cursors of a running cycle (queries run between cycles). */
    sched *m = (sched *)s;
    cursors_reset(m);
    size_t n = 0;
    for (;;) {
        uint32_t ti, ji = next_job(m, &ti, m->cfg.policy == SCHED_POLICY_SHOAL, 0, NULL);
        if (ji == NONE) break;
        if (n < cap) out[n] = m->jobs[ji].id;
        n++;
        m->tenants[ti].cursor++;
    }
    return n;
}

/* ---- State ---------------------------------------------------------------- */

int sched__cycle_new(sched *s)
{
    return (s->cyc = calloc(1, sizeof *s->cyc)) ? 0 : SH_ENOMEM;
}

void sched__cycle_free(sched *s)
{
    struct scycle *c = s->cyc;
    if (!c) return;
    free(c->waiting), free(c->elastic);
    for (int i = 0; i < 16; i++) free(c->porder[i].pools);
    free(c->scr.pp);
    free(c->scr.probe_fit.jp), free(c->scr.probe_fit_in.jp), free(c->scr.probe_preempt.jp), free(c->scr.probe_gang.jp),
        free(c->scr.probe_declined.jp);
    free(c);
}
