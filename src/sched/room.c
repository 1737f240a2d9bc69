/* Making room for blocked gangs: reservations (when and where a gang will
 * fit if running work ends at its estimates) and preemption of
 * lower-priority elastic and function work. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

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

/* When node ni will have g GPUs free, assuming running work ends at its
 * estimate (work past its estimate is assumed to end now).  The times for
 * every g are computed together and kept until the node's pods change. */
static double node_ready(sched *s, uint32_t ni, int g, double now)
{
    snode *n = &s->nodes[ni];
    if (n->free >= g) return now;
    if (n->ready_ver != n->ver || !n->ver) {
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
    return n->ready[g] < now ? now : n->ready[g];
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

/* The slot of pool p's reservation-time cache for gangs of n nodes x g
 * GPUs: the entry holding that shape if it is current, else a stale entry,
 * else the next in turn.  Fully associative: the head-of-line gangs that
 * get reservations are few but often share a hash slot (8 x 16, 8 x 32 and
 * 8 x 64 did), and a cache that thrashes rescans whole pools every cycle. */
static int rc_slot(spool *p, int g, int n)
{
    int stale = -1;
    for (int k = 0; k < RC_SLOTS; k++) {
        if (p->rc[k].ver != p->ver + 1) {
            if (stale < 0) stale = k;
            continue;
        }
        if (p->rc[k].g == g && p->rc[k].n == n) return k;
    }
    if (stale >= 0) return stale;
    return (int)(p->rc_next++ % RC_SLOTS);
}

/* Reserves, for the blocked gang ji, the nodes of the pool where it can
 * start soonest.  Nodes reserved for earlier gangs this cycle are skipped,
 * so later reservations never take from earlier ones. */
int sched__make_reservation(sched *s, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    static __thread tnode *tn;
    static __thread size_t captn;
    double bestT = INFINITY;
    uint32_t bestp = NONE;
    for (int pass = 0; pass < 2; pass++) {
        const uint32_t *jp;
        size_t njp = sched__job_pools(s, j, &jp);
        for (size_t q = 0; q < njp; q++) {
            uint32_t pi = jp[q];
            if (pass == 1 && pi != bestp) continue;
            spool *p = &s->pools[pi];
            if (p->maxg_ever[j->gpn] < j->nodes) continue;
            /* Pass 0 only needs the time: reuse it while the pool is
             * unchanged and no reservation took nodes from it this cycle.
             * The n-th smallest of max(ready, now) is max(n-th smallest,
             * now), so the raw time serves any later `now`. */
            int cacheable = p->resv_stamp != s->stamp && !s->plain_cycle;
            int slot = cacheable ? rc_slot(p, j->gpn, j->nodes) : 0;
            if (pass == 0 && cacheable && p->rc[slot].ver == p->ver + 1 && p->rc[slot].g == j->gpn &&
                p->rc[slot].n == j->nodes) {
                double T = p->rc[slot].T < now ? now : p->rc[slot].T;
                if (T < bestT) bestT = T, bestp = pi;
                continue;
            }
            SH_TRY(GROW(tn, captn, p->nnodes));
            size_t m = 0;
            for (size_t k = 0; k < p->nnodes; k++) {
                uint32_t ni = p->nodes[k];
                snode *n = &s->nodes[ni];
                if (n->state != SCHED_NODE_UP || n->gpus < j->gpn || n->resv_stamp == s->stamp) continue;
                tn[m++] = (tnode){node_ready(s, ni, j->gpn, -INFINITY), ni};
            }
            if (m < (size_t)j->nodes) {
                if (cacheable) p->rc[slot].ver = p->ver + 1, p->rc[slot].g = j->gpn, p->rc[slot].n = j->nodes, p->rc[slot].T = INFINITY;
                continue;
            }
            select_k(tn, m, (size_t)j->nodes);
            double T = -INFINITY;
            for (int k = 0; k < j->nodes; k++)
                if (tn[k].t > T) T = tn[k].t;
            if (cacheable) p->rc[slot].ver = p->ver + 1, p->rc[slot].g = j->gpn, p->rc[slot].n = j->nodes, p->rc[slot].T = T;
            if (T < now) T = now;
            if (pass == 0) {
                if (T < bestT) bestT = T, bestp = pi;
                continue;
            }
            p->resv_stamp = s->stamp;
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
int sched__try_preempt(sched *s, sched_decisions *d, uint32_t ji, double now)
{
    sjob *j = &s->jobs[ji];
    static __thread vnode *vn;
    static __thread size_t capvn;
    int best = INT32_MAX;
    uint32_t bestp = NONE;
    for (int pass = 0; pass < 2; pass++) {
        const uint32_t *jp;
        size_t njp = sched__job_pools(s, j, &jp);
        for (size_t q = 0; q < njp; q++) {
            uint32_t pi = jp[q];
            if (pass && pi != bestp) continue;
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
                if (total > 0 && total <= s->cfg.max_victims && total < best) best = total, bestp = pi;
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
