/* The scheduling cycle: timeouts, the policy passes, reservations with
 * backfill, preemption, elastic growth and autoscaling. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

/* ---- Decisions ------------------------------------------------------------ */

void sched_decisions_free(sched_decisions *d)
{
    if (!d) return;
    free(d->v), free(d->places);
    memset(d, 0, sizeof *d);
}

int sched__emit(sched *s, sched_decisions *d, sched_decision_kind k, uint32_t ji, uint32_t ni)
{
    SH_TRY(GROW(d->v, d->cap, d->n + 1));
    sched_decision *x = &d->v[d->n++];
    memset(x, 0, sizeof *x);
    x->kind = k;
    x->job_ix = ji;
    x->job = ji != NONE ? s->jobs[ji].id : NULL;
    x->node = ni != NONE ? s->nodes[ni].id : NULL;
    x->first = d->n_places;
    return 0;
}

/* Adds a place to the last decision. */
int sched__emit_place(sched_decisions *d, const sched *s, uint32_t ni, int gpus)
{
    SH_TRY(GROW(d->places, d->cap_places, d->n_places + 1));
    d->places[d->n_places++] = (sched_place){s->nodes[ni].id, ni, gpus};
    d->v[d->n - 1].count++;
    return 0;
}

int sched__pend(sched *s, sched_decision_kind k, uint32_t ji, uint32_t ni)
{
    SH_TRY(GROW(s->pend, s->cappend, s->npend + 1));
    s->pend[s->npend++] = (spending){k, ji, ni, NULL, 0};
    return 0;
}

static int wait_add(sched *s, uint32_t ji)
{
    SH_TRY(GROW(s->waiting, s->capwaiting, s->nwaiting + 1));
    s->waiting[s->nwaiting++] = ji;
    return 0;
}

int sched__wait_add(sched *s, uint32_t ji) { return wait_add(s, ji); }

int sched__requeue(sched *s, uint32_t ji, double now, int failed)
{
    sjob *j = &s->jobs[ji];
    if (j->state == SCHED_RUNNING || j->state == SCHED_REPLACING) s->running--;
    sched__release_all(s, ji, now);
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
        SH_TRY(sched__emit_place(d, s, c->nodes[i], j->gpn * per));
    }
    return 0;
}

/* Marks a queued job running (its places are already held). */
static void mark_started(sched *s, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    sched__queue_remove(s, ji);
    j->state = SCHED_RUNNING;
    if (j->first_start < 0) j->first_start = now;
    j->start = now;
    j->wait_acc += now - j->queued_since;
    j->blocked_since = -1;
    j->scale_requested = 0;
    if (j->resv_promise >= 0 && now > j->resv_promise + 1e-6) s->resv_late++;
    j->resv_promise = -1;
    if (s->nresv) j->backfilled = 1;
    s->running++;
    s->st.starts++;
}

/* Places up to max replicas of an elastic job, fastest type first, fullest
 * nodes first; 1 when at least `min` were found (then they are held). */
static int place_elastic(sched *s, sched_decisions *d, uint32_t ji, int min, int max,
                         sched_decision_kind kind, double now)
{
    sjob *j = &s->jobs[ji];
    static __thread scand c;
    static __thread int per[SCHED__MAX_GANG];
    int got = 0, nt = j->ntypes ? j->ntypes : 1;
    c.n = 0;
    for (int ti = 0; ti < nt && got < max; ti++)
        for (size_t pi = 0; pi < s->npools && got < max; pi++) {
            spool *p = &s->pools[pi];
            if (j->ntypes && p->type != j->types[ti]) continue;
            double end = now + j->est_s / (j->ntypes ? j->speed[ti] : 1.0);
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
            SH_TRY(sched__emit_place(d, s, c.nodes[i], j->gpn));
        }
    return 1;
}

/* Tries to start a queued job now; 1 started, 0 not, < 0 error. */
static int try_start(sched *s, sched_decisions *d, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    if (j->kind == SCHED_ELASTIC) {
        int rc = place_elastic(s, d, ji, j->nodes, j->maxr, SCHED_D_START, now);
        if (rc > 0) mark_started(s, ji, now);
        return rc;
    }
    static __thread scand c;
    uint32_t pool;
    if (!sched__pick_pool(s, j, now, s->cfg.policy == SCHED_SHOAL, &c, &pool)) return 0;
    j->pool = pool;
    SH_TRY(start_places(s, d, ji, &c, 1, now));
    mark_started(s, ji, now);
    return 1;
}

/* Whether any allowed pool could hold the job ignoring reservations: when
 * not, the same shape cannot fit anywhere for the rest of this cycle. */
static int raw_fits(const sched *s, const sjob *j)
{
    int need = j->kind == SCHED_GANG ? j->nodes : 1;
    for (size_t pi = 0; pi < s->npools; pi++)
        if (sched__pool_allowed(s, j, (uint32_t)pi) && sched__pool_fits(&s->pools[pi], need, j->gpn))
            return 1;
    return 0;
}

/* ---- Reservations --------------------------------------------------------- */

typedef struct tnode {
    double t;
    uint32_t ni;
} tnode;

static int cmp_tnode(const void *a, const void *b)
{
    double x = ((const tnode *)a)->t, y = ((const tnode *)b)->t;
    return x < y ? -1 : x > y;
}

/* When node ni will have g GPUs free, assuming running work ends at its
 * estimate (work past its estimate is assumed to end now). */
static double node_ready(const sched *s, uint32_t ni, int g, double now)
{
    const snode *n = &s->nodes[ni];
    if (n->free >= g) return now;
    double ends[MAXG * 4];
    int gp[MAXG * 4], m = 0;
    for (int r = 0; r < n->nrefs && m < MAXG * 4; r++) {
        double e = sched__est_end(s, &s->jobs[n->refs[r].job]);
        ends[m] = e < now ? now : e, gp[m++] = n->refs[r].gpus;
    }
    int free = n->free;
    while (m) {
        int b = 0;
        for (int i = 1; i < m; i++)
            if (ends[i] < ends[b]) b = i;
        free += gp[b];
        if (free >= g) return ends[b];
        ends[b] = ends[--m], gp[b] = gp[m];
    }
    return INFINITY;
}

/* GPUs of node ni still busy at time T (held by work estimated to end after
 * T, or already running past its estimate). */
static int busy_at(const sched *s, uint32_t ni, double T, double now)
{
    const snode *n = &s->nodes[ni];
    int b = 0;
    for (int r = 0; r < n->nrefs; r++) {
        double e = sched__est_end(s, &s->jobs[n->refs[r].job]);
        if (e > T + 1e-9 || e < now) b += n->refs[r].gpus;
    }
    return b;
}

/* Reserves, for the blocked gang ji, the nodes of the pool where it can
 * start soonest.  Nodes reserved for earlier gangs this cycle are skipped,
 * so later reservations never take from earlier ones. */
static int make_reservation(sched *s, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    static __thread tnode *tn;
    static __thread size_t captn;
    double bestT = INFINITY;
    uint32_t bestp = NONE;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t pi = 0; pi < s->npools; pi++) {
            if (!sched__pool_allowed(s, j, (uint32_t)pi)) continue;
            if (pass == 1 && pi != bestp) continue;
            spool *p = &s->pools[pi];
            if (p->maxg_ever[j->gpn] < j->nodes) continue;
            SH_TRY(GROW(tn, captn, p->nnodes));
            size_t m = 0;
            for (size_t k = 0; k < p->nnodes; k++) {
                uint32_t ni = p->nodes[k];
                snode *n = &s->nodes[ni];
                if (n->state != SCHED_NODE_UP || n->gpus < j->gpn || n->resv_stamp == s->stamp) continue;
                tn[m++] = (tnode){node_ready(s, ni, j->gpn, now), ni};
            }
            if (m < (size_t)j->nodes) continue;
            qsort(tn, m, sizeof *tn, cmp_tnode);
            double T = tn[j->nodes - 1].t;
            if (pass == 0) {
                if (T < bestT) bestT = T, bestp = (uint32_t)pi;
                continue;
            }
            SH_TRY(GROW(s->resv, s->capresv, s->nresv + 1));
            sresv *r = &s->resv[s->nresv++];
            r->nodes = realloc(r->nodes, (size_t)j->nodes * sizeof *r->nodes);
            if (!r->nodes) return s->nresv--, sh_err(SH_ENOMEM, "sched: out of memory");
            r->job = ji, r->T = T, r->n = j->nodes, r->need = j->gpn;
            for (int k = 0; k < j->nodes; k++) {
                snode *n = &s->nodes[tn[k].ni];
                r->nodes[k] = tn[k].ni;
                n->resv_stamp = s->stamp, n->resv_T = T;
                n->resv_spare = n->gpus - j->gpn - busy_at(s, tn[k].ni, T, now);
                if (n->resv_spare < 0) n->resv_spare = 0;
            }
            if (s->nresv == 1) {
                if (j->resv_promise >= 0 && T > j->resv_promise + 1e-6) s->resv_late++;
                j->resv_promise = T;
            }
        }
        if (bestp == NONE) break;
    }
    return 0;
}

/* ---- Preemption (shoal) ----------------------------------------------------- */

typedef struct vnode {
    int cost;
    uint32_t ni;
} vnode;

static int cmp_vnode(const void *a, const void *b)
{
    return ((const vnode *)a)->cost - ((const vnode *)b)->cost;
}

static int victim_ok(const sched *s, const sjob *j, const sjob *v)
{
    return v->kind != SCHED_GANG && v->priority < j->priority && v->state == SCHED_RUNNING;
}

/* Victims needed on node ni to free g GPUs (largest holdings first), or -1. */
static int node_victims(const sched *s, const sjob *j, uint32_t ni, int g, sref *out)
{
    const snode *n = &s->nodes[ni];
    sref v[MAXG * 4];
    int m = 0, free = n->free, cnt = 0;
    if (free >= g) return 0;
    for (int r = 0; r < n->nrefs && m < MAXG * 4; r++)
        if (victim_ok(s, j, &s->jobs[n->refs[r].job])) v[m++] = n->refs[r];
    while (free < g && m) {
        int b = 0;
        for (int i = 1; i < m; i++)
            if (v[i].gpus > v[b].gpus) b = i;
        free += v[b].gpus;
        if (out) out[cnt] = v[b];
        cnt++;
        v[b] = v[--m];
    }
    return free >= g ? cnt : -1;
}

static int evict(sched *s, sched_decisions *d, const sref *v, uint32_t ni, double now)
{
    sjob *x = &s->jobs[v->job];
    if (x->state != SCHED_RUNNING) return 0; /* already preempted whole */
    int k = 0;
    while (k < x->nplaces && !(x->places[k].node == ni && x->places[k].gpus == v->gpus)) k++;
    if (k == x->nplaces) return 0;
    if (x->kind == SCHED_ELASTIC && x->nplaces - 1 >= x->nodes) {
        sched__release_place(s, v->job, k, now);
        SH_TRY(sched__emit(s, d, SCHED_D_SHRINK, v->job, NONE));
        SH_TRY(sched__emit_place(d, s, ni, v->gpus));
        s->st.shrinks++;
        return 0;
    }
    s->running--;
    sched__release_all(s, v->job, now);
    x->state = SCHED_QUEUED;
    x->preemptions++;
    s->st.preemptions++;
    SH_TRY(GROW(s->deferred, s->capdeferred, s->ndeferred + 1));
    s->deferred[s->ndeferred++] = v->job;
    return sched__emit(s, d, SCHED_D_PREEMPT, v->job, NONE);
}

/* Frees room for gang ji by shrinking or preempting lower-priority elastic
 * and function work: the pool needing the fewest victims, at most
 * max_victims, and only victims on the chosen nodes (each one helps).
 * Returns 1 when room was made. */
static int try_preempt(sched *s, sched_decisions *d, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    static __thread vnode *vn;
    static __thread size_t capvn;
    int best = INT32_MAX;
    uint32_t bestp = NONE;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t pi = 0; pi < s->npools; pi++) {
            if (!sched__pool_allowed(s, j, (uint32_t)pi) || (pass && pi != bestp)) continue;
            spool *p = &s->pools[pi];
            if (p->maxg_ever[j->gpn] < j->nodes) continue;
            SH_TRY(GROW(vn, capvn, p->nnodes));
            size_t m = 0;
            for (size_t k = 0; k < p->nnodes; k++) {
                uint32_t ni = p->nodes[k];
                snode *n = &s->nodes[ni];
                if (n->state != SCHED_NODE_UP || n->gpus < j->gpn || n->resv_stamp == s->stamp) continue;
                int c = node_victims(s, j, ni, j->gpn, NULL);
                if (c >= 0) vn[m++] = (vnode){c, ni};
            }
            if (m < (size_t)j->nodes) continue;
            qsort(vn, m, sizeof *vn, cmp_vnode);
            int total = 0;
            for (int k = 0; k < j->nodes; k++) total += vn[k].cost;
            if (pass == 0) {
                if (total > 0 && total <= s->cfg.max_victims && total < best) best = total, bestp = (uint32_t)pi;
                continue;
            }
            for (int k = 0; k < j->nodes; k++) {
                sref v[MAXG * 4];
                int c = node_victims(s, j, vn[k].ni, j->gpn, v);
                for (int i = 0; i < c; i++) SH_TRY(evict(s, d, &v[i], vn[k].ni, now));
            }
            return 1;
        }
        if (bestp == NONE) return 0;
    }
    return 0;
}

/* ---- Queue order ------------------------------------------------------------ */

/* The next job to consider: the best head among tenant queues.  shoal
 * orders by priority, then by the tenant's GPUs in use (fair share), then by
 * queue order; the baselines by priority and queue order alone. */
static uint32_t next_job(sched *s, uint32_t *tenant)
{
    uint32_t bt = NONE, bj = NONE;
    int fair = s->cfg.policy == SCHED_SHOAL;
    for (size_t ti = 0; ti < s->ntenants; ti++) {
        stenant *t = &s->tenants[ti];
        if (t->cursor >= t->nq) continue;
        uint32_t ji = t->queue[t->cursor];
        if (bj != NONE) {
            const sjob *a = &s->jobs[ji], *b = &s->jobs[bj];
            if (a->priority != b->priority) {
                if (a->priority < b->priority) continue;
            } else if (fair && t->gpus_in_use != s->tenants[bt].gpus_in_use) {
                if (t->gpus_in_use > s->tenants[bt].gpus_in_use) continue;
            } else if (a->order > b->order) continue;
        }
        bt = (uint32_t)ti, bj = ji;
    }
    *tenant = bt;
    return bj;
}

/* ---- Policy passes ---------------------------------------------------------- */

#define MEMO 512
#define MAX_SCAN 4096 /* blocked jobs examined per cycle (Slurm's bf_max_job_test) */

/* fifo, backfill and shoal: walk the queue in policy order, start what fits
 * without delaying a reservation, reserve for the first blocked gangs. */
static int queue_pass(sched *s, sched_decisions *d, double now)
{
    uint64_t memo[MEMO] = {0};
    uint32_t last_preempted = NONE;
    int scanned = 0;
    for (size_t t = 0; t < s->ntenants; t++) s->tenants[t].cursor = 0;
    for (;;) {
        uint32_t ti, ji = next_job(s, &ti);
        if (ji == NONE || scanned >= MAX_SCAN) break;
        sjob *j = &s->jobs[ji];
        if (s->gpus_up - s->gpus_busy <= 0 && (s->nresv >= (size_t)s->cfg.max_reservations))
            break; /* nothing can start and no reservation is left to make */
        int rc = 0;
        if (memo[j->shape % MEMO] != j->shape) {
            if (raw_fits(s, j)) {
                if ((rc = try_start(s, d, ji, now)) < 0) return rc;
            } else memo[j->shape % MEMO] = j->shape;
        }
        if (rc == 1) continue; /* it left the queue: the cursor already points past it */
        s->tenants[ti].cursor++;
        scanned++;
        if (j->blocked_since < 0) j->blocked_since = now;
        if (s->cfg.policy == SCHED_FIFO) break;
        if (j->kind == SCHED_GANG && s->cfg.max_victims && s->preemptible_gpus && last_preempted != ji) {
            if ((rc = try_preempt(s, d, ji, now)) < 0) return rc;
            if (rc) {
                last_preempted = ji;
                memset(memo, 0, sizeof memo);
                s->tenants[ti].cursor--; /* try it again now that room was made */
                continue;
            }
        }
        if (j->kind == SCHED_GANG && s->nresv < (size_t)s->cfg.max_reservations)
            SH_TRY(make_reservation(s, ji, now));
    }
    return 0;
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
        int nt = j->ntypes ? j->ntypes : 1;
        for (int ti = 0; ti < nt && j->pool == NONE; ti++)
            for (size_t pi = 0; pi < s->npools && j->pool == NONE; pi++)
                if ((!j->ntypes || s->pools[pi].type == j->types[ti]) &&
                    sched__pool_fits(&s->pools[pi], 1, j->gpn))
                    j->pool = (uint32_t)pi;
        if (j->pool == NONE) return 0;
    }
    spool *p = &s->pools[j->pool];
    uint64_t mark = ++s->markseq;
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
            SH_TRY(sched__emit_place(d, s, j->places[k].node, j->places[k].gpus));
        mark_started(s, ji, now);
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
            SH_TRY(sched__emit_place(d, s, j->places[k].node, j->places[k].gpus));
    }
    return 0;
}

static int firstfit_pass(sched *s, sched_decisions *d, double now)
{
    for (size_t t = 0; t < s->ntenants; t++) s->tenants[t].cursor = 0;
    int scanned = 0;
    for (;;) {
        uint32_t ti, ji = next_job(s, &ti);
        if (ji == NONE || scanned >= MAX_SCAN || s->gpus_up - s->gpus_busy <= 0) break;
        sjob *j = &s->jobs[ji];
        int rc = j->kind == SCHED_GANG ? firstfit_gang(s, d, ji, now) : try_start(s, d, ji, now);
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
    uint64_t mark = ++s->markseq;
    for (int k = 0; k < j->nplaces; k++) s->nodes[j->places[k].node].mark = mark;
    for (int f = j->gpn; f <= MAXG; f++)
        for (uint32_t ni = p->head[f]; ni != NONE; ni = s->nodes[ni].next)
            if (s->nodes[ni].mark != mark) return (int)ni;
    return -1;
}

static int expire(sched *s, sched_decisions *d, double now)
{
    size_t w = 0;
    for (size_t i = 0; i < s->nwaiting; i++) {
        uint32_t ji = s->waiting[i];
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
                SH_TRY(sched__emit_place(d, s, (uint32_t)ni, j->gpn));
                continue;
            }
            if (now >= j->replace_deadline - 1e-9) {
                SH_TRY(sched__requeue(s, ji, now, 1));
                SH_TRY(sched__emit(s, d, SCHED_D_REQUEUE, ji, NONE));
                continue;
            }
        }
        if (j->state != SCHED_HOLDING && j->state != SCHED_REPLACING) continue;
        s->waiting[w++] = ji;
    }
    s->nwaiting = w;
    return 0;
}

/* ---- Elastic growth and autoscaling --------------------------------------- */

static int grow_pass(sched *s, sched_decisions *d, double now)
{
    if (s->cfg.policy != SCHED_SHOAL && s->queued) return 0; /* only preemptible growth may idle-fill */
    for (size_t i = 0; i < s->nelastic && s->gpus_up > s->gpus_busy; i++) {
        uint32_t ji = s->elastic[i];
        sjob *j = &s->jobs[ji];
        if (j->state != SCHED_RUNNING || j->nplaces >= j->maxr) continue;
        SH_TRY(place_elastic(s, d, ji, 1, j->maxr - j->nplaces, SCHED_D_GROW, now));
    }
    return 0;
}

static int scale_up(sched *s, sched_decisions *d, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    squota *best = NULL;
    for (size_t q = 0; q < s->nquotas; q++) {
        squota *qq = &s->quotas[q];
        if (qq->gpus < j->gpn || qq->max_nodes - qq->provisioned - qq->pending < j->nodes) continue;
        if (j->ntypes && sched__job_speed(s, j, qq->type) <= 0) continue;
        if (!best || qq->price_h < best->price_h) best = qq;
    }
    if (!best) return 0;
    SH_TRY(sched__emit(s, d, SCHED_D_SCALE_UP, ji, NONE));
    sched_decision *x = &d->v[d->n - 1];
    x->zone = s->name[best->zone], x->fabric = s->name[best->fabric];
    x->gpu_type = s->name[best->type];
    x->n = j->nodes, x->ready_s = now + best->delay_s;
    best->pending += j->nodes;
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
            else if (due < s->next_wake) s->next_wake = due;
        }
    }
    for (size_t ni = 0; ni < s->nnodes; ni++) {
        snode *n = &s->nodes[ni];
        if (!n->provisioned || n->state != SCHED_NODE_UP || n->nrefs || n->resv_stamp == s->stamp)
            continue;
        double due = n->idle_since + s->cfg.scale_down_idle_s;
        if (now < due - 1e-9) {
            if (due < s->next_wake) s->next_wake = due;
            continue;
        }
        sched__bucket_remove(s, (uint32_t)ni);
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
    s->nresv = 0;
    s->next_wake = INFINITY;
    int rc = flush_pending(s, d);
    if (!rc) rc = expire(s, d, now);
    if (!rc) rc = s->cfg.policy == SCHED_FIRSTFIT ? firstfit_pass(s, d, now) : queue_pass(s, d, now);
    if (!rc) rc = grow_pass(s, d, now);
    if (!rc && s->cfg.autoscale && s->nquotas) rc = autoscale(s, d, now);
    for (size_t i = 0; i < s->ndeferred && !rc; i++) rc = sched__queue_push(s, s->deferred[i], now);
    s->ndeferred = 0;
    for (size_t i = 0; i < s->nwaiting; i++) {
        const sjob *j = &s->jobs[s->waiting[i]];
        double due = j->state == SCHED_HOLDING ? j->hold_since + s->cfg.hold_timeout_s
                                               : j->replace_deadline;
        if (due < s->next_wake) s->next_wake = due;
    }
    s->st.decisions += d->n;
    return rc < 0 ? rc : (int)d->n;
}

double sched_next_wakeup(const sched *s) { return s->next_wake; }

size_t sched_queue(const sched *s, const char **out, size_t cap)
{
    /* Walk the tenant queues in the policy's order without disturbing the
     * cursors of a running cycle (queries run between cycles). */
    sched *m = (sched *)s;
    for (size_t t = 0; t < m->ntenants; t++) m->tenants[t].cursor = 0;
    size_t n = 0;
    for (;;) {
        uint32_t ti, ji = next_job(m, &ti);
        if (ji == NONE) break;
        if (n < cap) out[n] = m->jobs[ji].id;
        n++;
        m->tenants[ti].cursor++;
    }
    return n;
}
