/* Making room for blocked gangs: reservations (when and where a gang will
 * fit if running work ends at its estimates) and preemption of
 * lower-priority elastic and function work. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "room_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

/* ---- Reservations --------------------------------------------------------- */

typedef struct tnode {
    double t;
    uint32_t ni;
} tnode;

/* Moves the k smallest times to v[0..k) (in any order) and v[k-1] holds the
 * k-th smallest: Hoare's selection, O(m) on average, where a full sort of
 * a large pool dominated the cycle. */
static void select_k(tnode *v, size_t m, size_t k)
{
    size_t lo = 0, hi = m - 1, want = k - 1;
    while (lo < hi) {
        double pivot = v[lo + (hi - lo) / 2].t;
        size_t i = lo, j = hi;
        while (i <= j) {
            while (v[i].t < pivot) i++;
            while (v[j].t > pivot) j--;
            if (i <= j) {
                tnode x = v[i];
                v[i] = v[j], v[j] = x;
                i++;
                if (j == 0) break;
                j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    /* v[want] is now the k-th smallest; everything before it is <= it. */
    double T = v[want].t;
    size_t w = 0;
    for (size_t r = 0; r < m && w < k; r++)
        if (v[r].t < T) {
            tnode x = v[w];
            v[w++] = v[r], v[r] = x;
        }
    for (size_t r = w; r < m && w < k; r++)
        if (v[r].t == T) {
            tnode x = v[w];
            v[w++] = v[r], v[r] = x;
        }
}

/* Computes node n's ready[] for every g (see sched__node_ready). */
static void node_ready_fill(sched *s, snode *n);

/* When node ni will have g GPUs free, assuming running work ends at its
 * estimate (work past its estimate at its moved-on end, sched__overdue,
 * and at now when asked past that between cycles).  The times for
 * every g are computed together and kept until the node's pods change. */
double sched__node_ready(sched *s, uint32_t ni, int g, double now)
{
    snode *n = &s->nodes[ni];
    if (n->free >= g) return now;
    if (n->ready_ver != n->ver || !n->ver) node_ready_fill(s, n);
    return n->ready[g] < now ? now : n->ready[g];
}

/* sched__node_ready at -INFINITY, inline for pool_time's scan of a pool. */
static inline double node_ready_raw(sched *s, snode *n, int g)
{
    if (n->free >= g) return -INFINITY;
    if (n->ready_ver != n->ver || !n->ver) node_ready_fill(s, n);
    return n->ready[g];
}

static void node_ready_fill(sched *s, snode *n)
{
    double ends[MAXG * 4];
    int gp[MAXG * 4], m = 0;
    for (int r = 0; r < n->nrefs && m < MAXG * 4; r++) {
        ends[m] = sched__est_end(s, &s->jobs[n->refs[r].job]);
        gp[m++] = n->refs[r].gpus;
    }
    int free = n->free, have = n->free;
    for (int k = 0; k <= MAXG; k++) n->ready[k] = k <= have ? -INFINITY : INFINITY;
    while (m) {
        int b = 0;
        for (int i = 1; i < m; i++)
            if (ends[i] < ends[b]) b = i;
        free += gp[b];
        for (int k = have + 1; k <= free && k <= MAXG; k++) n->ready[k] = ends[b];
        if (free > have) have = free;
        ends[b] = ends[--m], gp[b] = gp[m];
    }
    n->ready_ver = n->ver;
}

/* GPUs of node ni still busy at time T (held by work estimated to end after
 * T, or already running past its estimate).  The fast path keeps the last
 * answer per node: a reserved node is asked again every cycle with the
 * same T while its pods stay (ver), and the answer only changes once now
 * passes an estimated end at or before T that it did not count. */
static int busy_at(sched *s, uint32_t ni, double T, double now)
{
    snode *n = &s->nodes[ni];
    if (!s->plain_cycle && n->ver && n->ba_ver == n->ver && n->ba_T == T && now >= n->ba_now &&
        now <= n->ba_until)
        return n->ba_val;
    int b = 0;
    double until = INFINITY;
    for (int r = 0; r < n->nrefs; r++) {
        double e = sched__est_end(s, &s->jobs[n->refs[r].job]);
        if (e > T + 1e-9 || e < now) b += n->refs[r].gpus;
        else if (e < until) until = e;
    }
    n->ba_ver = n->ver, n->ba_val = b, n->ba_T = T, n->ba_now = now, n->ba_until = until;
    return b;
}

/* ---- Work past its estimate ------------------------------------------------------

 * A job may run past its estimate (est_s, or default_est_s when none was
 * given; nothing in the core ends it).  Taking it to end "now" kept the
 * start estimates behind it at now for as long as it ran, its nodes first
 * for every reservation (they looked free soonest) and a gang's wait too
 * short for preempt_wait ever to take victims.  Instead it is expected
 * to end soon, and the longer it has overrun the less soon: each time now passes its
 * expected end, the end moves on by OVERRUN_STEP_S, then twice that, four
 * times, ...  So a job found past its estimate by d is expected within
 * d + OVERRUN_STEP_S more, never in the past, and the end moves about
 * log2(d / 60) times, not at every cycle.  The moves depend on the job's
 * start and estimate only, not on when the cycles come. */

static void due_up(struct sdue *h, size_t i)
{
    struct sdue x = h[i];
    while (i && h[(i - 1) / 2].t > x.t) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = x;
}

static void due_pop(sched *s)
{
    struct sdue *h = s->room->due, x = h[--s->room->ndue];
    size_t i = 0, n = s->room->ndue;
    if (!n) return;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1].t < h[c].t) c++;
        if (h[c].t >= x.t) break;
        h[i] = h[c], i = c;
    }
    h[i] = x;
}

int sched__due_add(sched *s, uint32_t ji)
{
    SH_TRY(GROW(s->room->due, s->room->capdue, s->room->ndue + 1));
    s->room->due[s->room->ndue] = (struct sdue){sched__est_end(s, &s->jobs[ji]), ji};
    due_up(s->room->due, s->room->ndue++);
    return 0;
}

int sched__overdue(sched *s, double now)
{
    while (s->room->ndue && s->room->due[0].t + 1e-6 < now) {
        struct sdue e = s->room->due[0];
        due_pop(s);
        sjob *j = &s->jobs[e.job];
        /* Ended, restarted or moved on since: a later entry stands for it. */
        if ((j->state != SCHED_RUNNING && j->state != SCHED_REPLACING) || sched__est_end(s, j) != e.t) continue;
        while (sched__est_end(s, j) + 1e-6 < now) j->over = 2 * j->over + OVERRUN_STEP_S;
        double end = sched__est_end(s, j);
        /* Its nodes' times moved later: what was kept of them is redone.
         * Times only rose, so a kept reservation time stays a lower bound
         * (no release counted) and a pool's drain time its maximum. */
        for (int k = 0; k < j->nplaces; k++) {
            snode *n = &s->nodes[j->places[k].node];
            n->ver++;
            sched__pool_touch(s, n->pool);
            if (end > s->pools[n->pool].drain) s->pools[n->pool].drain = end;
        }
        SH_TRY(sched__due_add(s, e.job));
    }
    return 0;
}

/* The slot of pool p's reservation-time cache for gangs of n nodes x g
 * GPUs: the entry of that shape (current or not: a stale one may still
 * give a lower bound), else a stale entry, else the next in turn.  Fully
 * associative: the head-of-line gangs that get reservations are few but
 * often share a hash slot (8 x 16, 8 x 32 and 8 x 64 did), and a cache
 * that thrashes rescans whole pools every cycle. */
static int rc_slot(spool *p, int g, int n)
{
    int h = (int)p->rc_hint;
    if (p->rc[h].g == g && p->rc[h].n == n) return h;
    for (int k = 0; k < RC_SLOTS; k++)
        if (p->rc[k].g == g && p->rc[k].n == n) return (int)(p->rc_hint = (uint32_t)k);
    for (int k = 0; k < RC_SLOTS; k++)
        if (p->rc[k].ver != p->ver + 1) return k;
    return (int)(p->rc_next++ % RC_SLOTS);
}

/* Pool pi's raw reservation time for gang j (the j->nodes-th smallest
 * time at which an unreserved up node has j->gpn GPUs free), with those
 * nodes first in tn; INFINITY when too few nodes exist. */
static double pool_time(sched *s, const sjob *j, uint32_t pi, tnode **tn, size_t *captn, size_t *m)
{
    spool *p = &s->pools[pi];
    *m = 0;
    if (sched__grow((void **)tn, captn, p->nnodes + 1, sizeof **tn) < 0) return NAN;
    for (size_t k = 0; k < p->nnodes; k++) {
        uint32_t ni = p->nodes[k];
        snode *n = &s->nodes[ni];
        if (n->state != SCHED_NODE_UP || n->gpus < j->gpn || n->resv_stamp == s->stamp) continue;
        (*tn)[(*m)++] = (tnode){node_ready_raw(s, n, j->gpn), ni};
    }
    if (*m < (size_t)j->nodes) return INFINITY;
    select_k(*tn, *m, (size_t)j->nodes);
    double T = -INFINITY;
    for (int k = 0; k < j->nodes; k++)
        if ((*tn)[k].t > T) T = (*tn)[k].t;
    return T;
}

/* Records T (and the nodes giving it, first in tn) in pool p's cache. */
static void rc_store(spool *p, const sjob *j, double T, const tnode *tn)
{
    int slot = rc_slot(p, j->gpn, j->nodes);
    p->rc[slot].ver = p->ver + 1, p->rc[slot].rel_ver = p->rel_ver + 1;
    p->rc[slot].g = j->gpn, p->rc[slot].n = j->nodes, p->rc[slot].T = T;
    p->rc[slot].tk_ok = 0;
    if (!isfinite(T)) return;
    if (p->rc[slot].capnodes < j->nodes) {
        uint32_t *v = realloc(p->rc[slot].nodes, (size_t)j->nodes * sizeof *v);
        if (v) p->rc[slot].nodes = v;
        double *t = v ? realloc(p->rc[slot].tk, (size_t)j->nodes * sizeof *t) : NULL;
        if (!t) { /* no memory: the entry keeps no nodes, so it is never used for them */
            p->rc[slot].ver = 0;
            return;
        }
        p->rc[slot].tk = t, p->rc[slot].capnodes = j->nodes;
    }
    double *tk = p->rc[slot].tk;
    for (int k = 0; k < j->nodes; k++) { /* insertion sort: n <= 64 mostly, computed rarely */
        p->rc[slot].nodes[k] = tn[k].ni;
        int i = k;
        for (; i > 0 && tk[i - 1] > tn[k].t; i--) tk[i] = tk[i - 1];
        tk[i] = tn[k].t;
    }
    p->rc[slot].tk_ok = 1;
}

typedef struct pbound {
    double lb;    /* a lower bound of the pool's (clamped) time */
    int exact;    /* lb is the time itself */
    uint32_t q;   /* position in the job's pool list: ties go to the earlier */
} pbound;

static int cmp_pbound(const void *a, const void *b)
{
    const pbound *x = a, *y = b;
    if (x->lb != y->lb) return x->lb < y->lb ? -1 : 1;
    return (x->q > y->q) - (x->q < y->q);
}

/* Pool pi's exact raw time for gang j, kept in its cache when no
 * reservation took nodes there this cycle; NAN without memory. */
static double pool_exact(sched *s, const sjob *j, uint32_t pi)
{
    size_t m;
    double T = pool_time(s, j, pi, &s->room->scr.tn_exact, &s->room->scr.cap_exact, &m);
    if (!isnan(T) && s->pools[pi].resv_stamp != s->stamp) rc_store(&s->pools[pi], j, T, s->room->scr.tn_exact);
    return T;
}

/* What the fast path knows of pool pi's raw time for gang j without a
 * scan where it can: 1 and *v the time (kept while the pool is unchanged),
 * 2 and *v a lower bound (from a kept time of this gang's shape or of a
 * smaller one, when the pool only took work since, or a few releases moved
 * it: see rc.tk), 0 when the pool can never fit the gang, -1 without
 * memory. */
static int pool_answer(sched *s, const sjob *j, uint32_t pi, double *v)
{
    spool *p = &s->pools[pi];
    if (p->maxg_ever[j->gpn] < j->nodes) return 0;
    int slot = rc_slot(p, j->gpn, j->nodes), same = p->rc[slot].g == j->gpn && p->rc[slot].n == j->nodes;
    int fresh = p->resv_stamp != s->stamp; /* no reservation took nodes here this cycle */
    if (same && fresh && p->rc[slot].ver == p->ver + 1) return *v = p->rc[slot].T, 1;
    /* A lower bound from any entry of a gang no larger (g' <= g GPUs on
     * n' <= n nodes): each node has g' GPUs free no later than g, on more
     * nodes, and the n'-th smallest time is no later than the n-th. */
    double lb = -INFINITY;
    int have = 0;
    for (int k = 0; k < RC_SLOTS; k++) {
        int g = p->rc[k].g, n = p->rc[k].n;
        if (!p->rc[k].ver || g < 1 || g > j->gpn || n > j->nodes) continue;
        uint64_t r = p->rel_ver + 1 - p->rc[k].rel_ver;
        double b;
        if (!r) b = p->rc[k].T;
        else if (p->rc[k].tk_ok && r < (uint64_t)n) b = p->rc[k].tk[n - 1 - (int)r];
        else continue;
        if (!have || b > lb) lb = b, have = 1;
    }
    if (have) return *v = lb, 2;
    *v = pool_exact(s, j, pi);
    return isnan(*v) ? -1 : 1;
}

/* The pool answers (val, kind) for the job's pool list jp, from the
 * search before for the same job where only the pools touched since need
 * a new answer (sroom.bpc); NULL without memory. */
static struct sbpc *pool_answers(sched *s, const sjob *j, const uint32_t *jp, size_t njp)
{
    struct sbpc *c = &s->room->bpc;
    uint32_t ji = (uint32_t)(j - s->jobs);
    /* With a reservation made this cycle, answers lean on it: kept apart. */
    int keep = s->room->nresv == 0;
    int hit = keep && !s->touched_lost && c->job == ji && c->order == j->order && c->g == j->gpn &&
              c->n == j->nodes && c->pools_ver == s->plc->pools_ver + 1 && c->gen == s->touch_gen + 1 && c->jp == jp &&
              c->njp == njp;
    if (!keep) c = &s->room->scr.bpc;
    c->pools_ver = 0; /* until it is whole again */
    if (!hit) {
        if (sched__grow((void **)&c->val, &c->cap, njp + 1, sizeof *c->val) < 0 ||
            sched__grow((void **)&c->kind, &c->capk, njp + 1, sizeof *c->kind) < 0)
            return NULL;
        if (keep) {
            if (sched__grow((void **)&c->qpos, &c->capq, s->npools + 1, sizeof *c->qpos) < 0) return NULL;
            for (size_t k = 0; k < s->npools; k++) c->qpos[k] = NONE;
            for (size_t q = 0; q < njp; q++) c->qpos[jp[q]] = (uint32_t)q;
        }
        for (size_t q = 0; q < njp; q++)
            if ((c->kind[q] = (signed char)pool_answer(s, j, jp[q], &c->val[q])) < 0) return NULL;
    } else
        for (size_t k = 0; k < s->ntouched; k++) {
            uint32_t q = s->touched[k] < s->npools ? c->qpos[s->touched[k]] : NONE;
            if (q != NONE && (c->kind[q] = (signed char)pool_answer(s, j, jp[q], &c->val[q])) < 0) return NULL;
        }
    if (keep) { /* later touches are listed afresh */
        c->job = ji, c->order = j->order, c->g = j->gpn, c->n = j->nodes, c->jp = jp, c->njp = njp;
        c->pools_ver = s->plc->pools_ver + 1;
        s->touch_gen++, s->ntouched = 0, s->touched_lost = 0;
        c->gen = s->touch_gen + 1;
    }
    return c;
}

/* The earliest reservation time over the job's pools (ties to the earlier
 * pool in its list), or INFINITY; the pool in *best.  The reference
 * computes every pool's time.  The fast path takes each pool's time from
 * its cache while the pool is unchanged, and a lower bound while it only
 * took work since (pool_answer); it then computes exact times in order of
 * bound and stops once no bound can beat the best time found. */
static double best_pool(sched *s, const sjob *j, double now, uint32_t *best)
{
    const uint32_t *jp;
    size_t njp = sched__job_pools(s, j, &jp), m, npb = 0;
    double bestT = INFINITY;
    uint32_t bestq = UINT32_MAX;
    *best = NONE;
    if (s->plain_cycle) {
        for (size_t q = 0; q < njp; q++) {
            if (s->pools[jp[q]].maxg_ever[j->gpn] < j->nodes) continue;
            double T = pool_time(s, j, jp[q], &s->room->scr.tn_best, &s->room->scr.cap_best, &m);
            if (isnan(T)) return T;
            if (T < now) T = now;
            if (T < bestT) bestT = T, bestq = (uint32_t)q;
        }
        if (bestq != UINT32_MAX) *best = jp[bestq];
        return bestT;
    }
    if (sched__grow((void **)&s->room->scr.pb, &s->room->scr.cappb, njp + 1, sizeof *s->room->scr.pb) < 0) return NAN;
    pbound *pb = s->room->scr.pb;
    struct sbpc *c = pool_answers(s, j, jp, njp);
    if (!c) return NAN;
    /* Bounds are kept only while they could beat the best time so far: it
     * only falls (or keeps its value at an earlier pool) from here on, so
     * a bound that cannot beat it now never will, and the loop below stops
     * at the first such bound in its order anyway. */
    for (size_t q = 0; q < njp; q++) {
        if (!c->kind[q]) continue;
        double T = c->val[q] < now ? now : c->val[q];
        if (c->kind[q] == 1) {
            if (T < bestT) bestT = T, bestq = (uint32_t)q;
        } else if (T < bestT || (T == bestT && q < bestq))
            pb[npb++] = (pbound){T, 0, (uint32_t)q};
    }
    /* The bounds in (lb, q) order, each taken by selection: the loop
     * mostly stops after one or two, where a full sort cost more than the
     * rest of the search. */
    for (size_t i = 0; i < npb; i++) {
        size_t b = i;
        for (size_t k = i + 1; k < npb; k++)
            if (cmp_pbound(&pb[k], &pb[b]) < 0) b = k;
        pbound x = pb[i];
        pb[i] = pb[b], pb[b] = x;
        if (pb[i].lb > bestT || (pb[i].lb == bestT && pb[i].q > bestq)) break; /* nothing left can win */
        double T = pool_exact(s, j, jp[pb[i].q]);
        if (isnan(T)) return T;
        c->val[pb[i].q] = T, c->kind[pb[i].q] = 1;
        if (T < now) T = now;
        if (T < bestT || (T == bestT && pb[i].q < bestq)) bestT = T, bestq = pb[i].q;
    }
    if (bestq != UINT32_MAX) *best = jp[bestq];
    return bestT;
}

/* Reserves, for the blocked gang ji, the nodes of the pool where it can
 * start soonest.  Nodes reserved for earlier gangs this cycle are skipped,
 * so later reservations never take from earlier ones. */
int sched__make_reservation(sched *s, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    uint32_t bestp;
    double T = best_pool(s, j, now, &bestp);
    if (isnan(T)) return sh_err(SH_ENOMEM, "sched: out of memory");
    if (bestp == NONE || !isfinite(T)) return 0;
    spool *p = &s->pools[bestp];
    SH_TRY(GROW(s->room->scr.tn_resv, s->room->scr.cap_resv, (size_t)j->nodes + 1));
    int slot = s->plain_cycle ? -1 : rc_slot(p, j->gpn, j->nodes);
    if (slot >= 0 && p->resv_stamp != s->stamp && p->rc[slot].ver == p->ver + 1 && p->rc[slot].g == j->gpn &&
        p->rc[slot].n == j->nodes && isfinite(p->rc[slot].T)) {
        /* The pool is as it was when its time was computed: the same nodes. */
        for (int k = 0; k < j->nodes; k++) s->room->scr.tn_resv[k].ni = p->rc[slot].nodes[k];
    } else {
        size_t m;
        if (isnan(pool_time(s, j, bestp, &s->room->scr.tn_resv, &s->room->scr.cap_resv, &m)))
            return sh_err(SH_ENOMEM, "sched: out of memory");
    }
    const tnode *tn = s->room->scr.tn_resv;
    p->resv_stamp = s->stamp;
    SH_TRY(GROW(s->room->resv, s->room->capresv, s->room->nresv + 1));
    sresv *r = &s->room->resv[s->room->nresv++];
    r->nodes = realloc(r->nodes, (size_t)j->nodes * sizeof *r->nodes);
    if (!r->nodes) return s->room->nresv--, sh_err(SH_ENOMEM, "sched: out of memory");
    r->job = ji, r->T = T, r->n = j->nodes, r->need = j->gpn;
    double len = sched__est_len(s, j, bestp);
    for (int k = 0; k < j->nodes; k++) {
        snode *n = &s->nodes[tn[k].ni];
        r->nodes[k] = tn[k].ni;
        n->resv_stamp = s->stamp, n->resv_T = T;
        n->resv_end = T + len;
        n->resv_spare = n->gpus - j->gpn - busy_at(s, tn[k].ni, T, now);
        if (n->resv_spare < 0) n->resv_spare = 0;
    }
    struct { uint64_t prev, nodes; uint32_t job; int n, need; } sig = {
        s->room->resv_sig, sh_hash64_of(r->nodes, (size_t)r->n * sizeof *r->nodes), ji, r->n, r->need};
    s->room->resv_sig = sh_hash64_of(&sig, sizeof sig);
    if (s->room->nresv <= 4) s->room->resv_T[s->room->nresv - 1] = T, s->room->resv_slack[s->room->nresv - 1] = T - now;
    if (s->room->nresv == 1) {
        if (j->resv_promise >= 0 && T > j->resv_promise + 1e-6) s->resv_late++;
        j->resv_promise = T;
    }
    return 0;
}

/* ---- Preemption (shoal) ----------------------------------------------------- */

typedef struct vnode {
    int cost;
    uint32_t ni;
    uint32_t pos; /* in the pool's node list: ties go to the earlier node */
} vnode;

static int cmp_vnode(const void *a, const void *b)
{
    const vnode *x = a, *y = b;
    if (x->cost != y->cost) return x->cost - y->cost;
    return (x->pos > y->pos) - (x->pos < y->pos);
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
        splace gone = x->places[k];
        sched__release_place(s, v->job, k, now);
        SH_TRY(sched__emit(s, d, SCHED_D_SHRINK, v->job, NONE));
        SH_TRY(sched__emit_place(d, s, &gone));
        s->st.shrinks++;
        return 0;
    }
    s->running--;
    sched__release_all(s, v->job, now);
    x->state = SCHED_QUEUED, x->over = 0;
    x->preemptions++;
    s->st.preemptions++;
    SH_TRY(GROW(s->room->deferred, s->room->capdeferred, s->room->ndeferred + 1));
    s->room->deferred[s->room->ndeferred++] = v->job;
    return sched__emit(s, d, SCHED_D_PREEMPT, v->job, NONE);
}

/* Nodes of pool p that could take a pod of gang j without victims: up,
 * with gpn GPUs free, not reserved this cycle. */
static int free_nodes(const sched *s, const sjob *j, uint32_t pi)
{
    int n = s->pools[pi].ge[j->gpn];
    for (size_t r = 0; r < s->room->nresv; r++)
        for (int k = 0; k < s->room->resv[r].n; k++) {
            const snode *x = &s->nodes[s->room->resv[r].nodes[k]];
            if (x->pool == pi && x->state == SCHED_NODE_UP && x->free >= j->gpn &&
                x->resv_stamp == s->stamp)
                n--;
        }
    return n;
}

/* The fewest victims that free room for gang j in pool pi (the cheapest
 * j->nodes nodes by victims needed, then pool order), or -1 when that is
 * more than max_victims or impossible; the chosen nodes with victims go to
 * vn[0 .. *m).  The reference scans every node; the fast path first rules
 * the pool out by counts (each node beyond the free ones needs a victim, of
 * a lower priority) and then examines only the nodes short of room. */
static int pool_victims(sched *s, const sjob *j, uint32_t pi, vnode **vn, size_t *capvn, size_t *m)
{
    const spool *p = &s->pools[pi];
    int max = s->cfg.max_victims;
    *m = 0;
    if (p->maxg_ever[j->gpn] < j->nodes) return -1;
    int zero = 0;
    if (!s->plain_cycle) {
        /* Cheapest tests first: no victim in the pool, or too few nodes
         * free even before reservations are taken out. */
        if (!sched__pool_may_preempt(s, p, j->nodes, j->gpn, j->priority)) return -1;
        zero = p->resv_stamp == s->stamp ? free_nodes(s, j, pi) : p->ge[j->gpn];
        if (zero >= j->nodes || j->nodes - zero > max) return -1;
    }
    if (sched__grow((void **)vn, capvn, p->nnodes + 1, sizeof **vn) < 0) return -1;
    /* The fast path visits only nodes holding preemptible work: a node
     * short of room without any has no victim. */
    size_t nscan = s->plain_cycle ? p->nnodes : p->npre_nodes;
    for (size_t k = 0; k < nscan; k++) {
        uint32_t ni = s->plain_cycle ? p->nodes[k] : p->pre_nodes[k];
        snode *n = &s->nodes[ni];
        if (n->state != SCHED_NODE_UP || n->gpus < j->gpn || n->resv_stamp == s->stamp) continue;
        if (!s->plain_cycle && n->free >= j->gpn) continue; /* counted in zero */
        int c = node_victims(s, j, ni, j->gpn, NULL);
        if (c >= 0) (*vn)[(*m)++] = (vnode){c, ni, n->pool_pos};
    }
    int need = j->nodes - zero;
    if (*m < (size_t)need) return -1;
    qsort(*vn, *m, sizeof **vn, cmp_vnode);
    int total = 0;
    for (int k = 0; k < need; k++) total += (*vn)[k].cost;
    *m = (size_t)need;
    return total > 0 && total <= max ? total : -1;
}

static struct spmemo *pmemo_at(sched *s, uint64_t shape, int prio)
{
    return &s->room->pmemo[(shape ^ (uint64_t)(uint32_t)prio * 0x9e3779b97f4a7c15ull) % 256];
}

static struct spmemo *pmemo_slot(sched *s, const sjob *j) { return pmemo_at(s, j->shape, j->priority); }

/* The pool where gang j needs the fewest victims (the first such in its
 * list), or NONE when no pool can be freed with at most max_victims. */
static uint32_t best_victim_pool(sched *s, const sjob *j)
{
    int best = INT32_MAX;
    uint32_t bestp = NONE;
    const uint32_t *jp;
    size_t njp = sched__job_pools(s, j, &jp), m;
    /* Fast path: a pool more than max_victims nodes short of free ones
     * fails pool_victims' first test, so a type whose largest count is
     * that short is skipped whole. */
    int low = j->nodes - s->cfg.max_victims;
    if (!s->plain_cycle && low > 0) {
        int any = 0;
        if (!j->ntypes) {
            for (uint32_t t = 0; t < s->plc->ntpools && !any; t++) any = sched__type_fits(s, t, low, j->gpn);
        } else
            for (int t = 0; t < j->ntypes && !any; t++) any = sched__type_fits(s, j->types[t], low, j->gpn);
        if (!any) return NONE;
    }
    for (size_t q = 0; q < njp; q++) {
        if (!s->plain_cycle && low > 0 && !sched__type_fits(s, s->pools[jp[q]].type, low, j->gpn)) continue;
        int total = pool_victims(s, j, jp[q], &s->room->scr.vn_best, &s->room->scr.cap_vbest, &m);
        if (total >= 0 && total < best) best = total, bestp = jp[q];
    }
    return bestp;
}

int sched__preempt_possible(sched *s, const sjob *j)
{
    if (j->kind != SCHED_GANG || !s->cfg.max_victims || !sched__prios_below(&s->pre, j->priority)) return 0;
    struct spmemo *mo = pmemo_slot(s, j);
    /* A success is kept too: it only keeps the sweeps from ruling the shape
     * out, which is always safe (try_preempt searches again). */
    if (mo->shape == j->shape && mo->prio == j->priority && mo->stamp == s->stamp &&
        mo->epoch == s->release_epoch)
        return mo->ok;
    int ok = best_victim_pool(s, j) != NONE;
    *mo = (struct spmemo){j->shape, s->stamp, s->release_epoch, j->priority, ok};
    return ok;
}

int sched__preempt_possible_in(sched *s, uint64_t shape, int prio, const sjob *(*probe)(sched *, void *),
                               void *arg, const uint32_t *pools, int n)
{
    if (!s->cfg.max_victims || !sched__prios_below(&s->pre, prio)) return 0;
    struct spmemo *mo = pmemo_at(s, shape, prio);
    if (mo->shape == shape && mo->prio == prio && mo->stamp == s->stamp && mo->epoch == s->release_epoch)
        return mo->ok;
    int ok = 0;
    size_t m;
    const sjob *j = n ? probe(s, arg) : NULL;
    for (int k = 0; k < n && !ok; k++) ok = pool_victims(s, j, pools[k], &s->room->scr.vn_in, &s->room->scr.cap_vin, &m) >= 0;
    *mo = (struct spmemo){shape, s->stamp, s->release_epoch, prio, ok};
    return ok;
}

int sched__preempt_declined(sched *s, const sjob *j, uint32_t ji, double now)
{
    if (!(s->cfg.preempt_wait > 0)) return 0;
    uint32_t rp = NONE;
    double T = NAN;
    /* A gang holding this cycle's reservation starts at its time (a
     * search now would skip its own reserved nodes). */
    for (size_t r = 0; r < s->room->nresv && rp == NONE && ji != NONE; r++)
        if (s->room->resv[r].job == ji) T = s->room->resv[r].T, rp = s->nodes[s->room->resv[r].nodes[0]].pool;
    if (rp == NONE) T = best_pool(s, j, now, &rp);
    if (isnan(T)) return sh_err(SH_ENOMEM, "sched: out of memory");
    return rp != NONE && T < now + s->cfg.preempt_wait * sched__est_len(s, j, rp);
}

/* Frees room for gang ji by shrinking or preempting lower-priority elastic
 * and function work: the pool needing the fewest victims, at most
 * max_victims, and only victims on the chosen nodes (each one helps).
 * Returns 1 when room was made. */
int sched__try_preempt(sched *s, sched_decisions *d, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    if (!s->plain_cycle && !sched__prios_below(&s->pre, j->priority)) return 0; /* no victim anywhere */
    struct spmemo *mo = pmemo_slot(s, j);
    if (!s->plain_cycle && mo->shape == j->shape && mo->prio == j->priority && mo->stamp == s->stamp &&
        mo->epoch == s->release_epoch && !mo->ok)
        return 0; /* the same search failed this cycle, and no room was freed since */
    uint32_t bestp = best_victim_pool(s, j);
    if (bestp == NONE) {
        *mo = (struct spmemo){j->shape, s->stamp, s->release_epoch, j->priority, 0};
        return 0;
    }
    /* Worth it only when the gang would otherwise wait long for its run:
     * a check of this job's own (its estimate), after the search (which
     * costs less), so that the search's memo of the shape stays a fact
     * about victims alone.  A gang turned down counts once however many
     * walks turn it down again (how many visit it is the fast path's
     * business, and the reference visits more). */
    int no = sched__preempt_declined(s, j, ji, now);
    if (no < 0) return no;
    if (no) return s->st.preempt_declined += !j->declined, j->declined = 1, 0;
    size_t m;
    pool_victims(s, j, bestp, &s->room->scr.vn_try, &s->room->scr.cap_vtry, &m);
    const vnode *vn = s->room->scr.vn_try;
    for (size_t k = 0; k < m; k++) {
        sref v[MAXG * 4];
        int c = node_victims(s, j, vn[k].ni, j->gpn, v);
        for (int i = 0; i < c; i++) SH_TRY(evict(s, d, &v[i], vn[k].ni, now));
    }
    return 1;
}

/* ---- State ---------------------------------------------------------------- */

int sched__room_new(sched *s)
{
    return (s->room = calloc(1, sizeof *s->room)) ? 0 : SH_ENOMEM;
}

void sched__room_free(sched *s)
{
    struct sroom *r = s->room;
    if (!r) return;
    for (size_t i = 0; i < r->capresv; i++) free(r->resv[i].nodes);
    free(r->resv), free(r->deferred), free(r->due);
    free(r->bpc.val), free(r->bpc.kind), free(r->bpc.qpos);
    free(r->scr.tn_exact), free(r->scr.tn_best), free(r->scr.tn_resv), free(r->scr.pb);
    free(r->scr.vn_best), free(r->scr.vn_in), free(r->scr.vn_try);
    free(r->scr.bpc.val), free(r->scr.bpc.kind), free(r->scr.bpc.qpos);
    free(r);
}
