/* Why a queued job waits, and when it should start.
 *
 * Computed on demand between cycles from the state the last cycle left:
 * the nodes' free GPUs, the estimates of running work and the reservations
 * of the last cycle (still marked on their nodes until the next step).
 * Nothing here changes a decision; the only writes are to the per-node
 * cache of ready times. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

static const char *const wait_names[] = {"", "resources", "reservation", "reserved", "fair_share",
                                         "next_cycle", "nodes_down"};

const char *sched_wait_name(sched_wait w)
{
    return (unsigned)w < sizeof wait_names / sizeof wait_names[0] ? wait_names[w] : "?";
}

static void pool_name(const sched *s, uint32_t pi, char *out, size_t cap)
{
    const spool *p = &s->pools[pi];
    snprintf(out, cap, "%s/%s/%s", s->name[p->zone], s->name[p->fabric], s->name[p->type]);
}

/* When node ni could take a pod of g GPUs under the plan: its running work
 * ends at its estimates, and a node reserved this cycle for another gang
 * is taken until that gang's estimated end. */
static double plan_ready(sched *s, uint32_t ni, int g, uint32_t ji)
{
    const snode *n = &s->nodes[ni];
    double t = sched__node_ready(s, ni, g, -INFINITY);
    if (n->resv_stamp == s->stamp) {
        int mine = 0;
        for (size_t r = 0; r < s->nresv && !mine; r++)
            if (s->resv[r].job == ji)
                for (int k = 0; k < s->resv[r].n && !mine; k++) mine = s->resv[r].nodes[k] == ni;
        if (!mine && n->resv_end > t) t = n->resv_end;
    }
    return t;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The k-th smallest of the plan times of the nodes given; INFINITY when
 * fewer than k can ever hold a pod. */
static double kth_ready(sched *s, const sjob *j, uint32_t ji, const uint32_t *pools, size_t np, int k)
{
    size_t cap = 0, m = 0;
    for (size_t q = 0; q < np; q++) cap += s->pools[pools[q]].nnodes;
    if (cap < (size_t)k) return INFINITY;
    double *t = malloc(cap * sizeof *t);
    if (!t) return INFINITY;
    for (size_t q = 0; q < np; q++) {
        const spool *p = &s->pools[pools[q]];
        for (size_t i = 0; i < p->nnodes; i++) {
            const snode *n = &s->nodes[p->nodes[i]];
            if (n->state != SCHED_NODE_UP || n->gpus < j->gpn) continue;
            t[m++] = plan_ready(s, p->nodes[i], j->gpn, ji);
        }
    }
    double r = INFINITY;
    if (m >= (size_t)k) {
        qsort(t, m, sizeof *t, cmp_dbl);
        r = t[k - 1];
    }
    free(t);
    return r;
}

/* The start estimate: a gang the soonest over its pools, other work its
 * min replicas over every allowed node (one per node: an upper bound). */
static double estimate(sched *s, const sjob *j, uint32_t ji, double now)
{
    const uint32_t *jp;
    size_t njp = sched__job_pools(s, j, &jp);
    uint32_t *pools = malloc((njp + 1) * sizeof *pools);
    if (!pools) return INFINITY;
    if (njp) memcpy(pools, jp, njp * sizeof *pools); /* jp may be NULL when no pool fits */
    double best = INFINITY;
    if (j->kind == SCHED_GANG)
        for (size_t q = 0; q < njp; q++) {
            double t = kth_ready(s, j, ji, &pools[q], 1, j->nodes);
            if (t < best) best = t;
        }
    else best = kth_ready(s, j, ji, pools, njp, j->nodes);
    free(pools);
    return best < now ? now : best;
}

/* Up nodes with >= g GPUs in a pool (busy or not). */
static int up_nodes(const sched *s, const spool *p, int g)
{
    int n = 0;
    for (size_t i = 0; i < p->nnodes; i++) {
        const snode *x = &s->nodes[p->nodes[i]];
        n += x->state == SCHED_NODE_UP && x->gpus >= g;
    }
    return n;
}

/* Fair share: the tenant's fraction of busy GPUs against an equal split
 * among tenants with work queued or running. */
static int over_share(const sched *s, const sjob *j, double *frac, double *fair)
{
    if (s->cfg.policy != SCHED_POLICY_SHOAL || s->gpus_busy <= 0) return 0;
    int active = 0;
    for (size_t t = 0; t < s->ntenants; t++) active += s->tenants[t].nq > 0 || s->tenants[t].gpus_in_use > 0;
    if (active < 2) return 0;
    *frac = (double)s->tenants[j->tenant].gpus_in_use / s->gpus_busy;
    *fair = 1.0 / active;
    return *frac > *fair + 1e-9;
}

void sched__pending(sched *s, uint32_t ji, double now, sched_job_info *o)
{
    sjob *j = &s->jobs[ji];
    const uint32_t *jp;
    size_t njp = sched__job_pools(s, j, &jp);
    int need = j->kind == SCHED_GANG ? j->nodes : 1;
    char pn[3 * SCHED_ID_MAX];
    o->est_start_s = estimate(s, j, ji, now);
    njp = sched__job_pools(s, j, &jp); /* estimate() may have reused the buffer */
    /* Capacity that is up at all, busy or not. */
    int best_up = -1, best_free = -1;
    uint32_t up_pool = NONE, free_pool = NONE, fit_pool = NONE;
    long free_replicas = 0;
    for (size_t q = 0; q < njp; q++) {
        const spool *p = &s->pools[jp[q]];
        int up = up_nodes(s, p, j->gpn), fr = p->ge[j->gpn];
        if (up > best_up) best_up = up, up_pool = jp[q];
        if (fr > best_free) best_free = fr, free_pool = jp[q];
        if (fit_pool == NONE && sched__pool_fits(p, need, j->gpn)) fit_pool = jp[q];
        for (int f = j->gpn; f <= MAXG; f++) free_replicas += (long)p->count[f] * (f / j->gpn);
    }
    int raw = j->kind == SCHED_ELASTIC ? free_replicas >= j->nodes : fit_pool != NONE;
    if (j->kind == SCHED_GANG && best_up < j->nodes) {
        o->wait = SCHED_WAIT_NODES_DOWN;
        o->est_start_s = INFINITY;
        if (up_pool != NONE) pool_name(s, up_pool, pn, sizeof pn);
        snprintf(o->wait_text, sizeof o->wait_text,
                 "never fits while nodes are down: needs %d nodes x %d GPUs in one pool; the largest up (%s) has %d",
                 j->nodes, j->gpn, up_pool != NONE ? pn : "none", best_up < 0 ? 0 : best_up);
        return;
    }
    for (size_t r = 0; r < s->nresv; r++)
        if (s->resv[r].job == ji && s->resv[r].n) {
            pool_name(s, s->nodes[s->resv[r].nodes[0]].pool, pn, sizeof pn);
            o->wait = SCHED_WAIT_RESERVED;
            o->est_start_s = s->resv[r].T < now ? now : s->resv[r].T;
            snprintf(o->wait_text, sizeof o->wait_text,
                     "holds a reservation of %d nodes in %s: starts when running work there ends", s->resv[r].n, pn);
            return;
        }
    if (raw) {
        static __thread scand c;
        uint32_t pool;
        if (j->kind == SCHED_ELASTIC || sched__pick_pool(s, j, now, 0, &c, &pool)) {
            o->wait = SCHED_WAIT_NEXT_CYCLE;
            o->est_start_s = now;
            snprintf(o->wait_text, sizeof o->wait_text,
                     "fits now: the next cycle starts it unless jobs ahead of it take the room");
            return;
        }
        /* It fits only on reserved nodes: name the reservation in its way. */
        for (size_t r = 0; r < s->nresv; r++) {
            const sresv *v = &s->resv[r];
            if (v->job == NONE || !v->n || !sched__pool_allowed(s, j, s->nodes[v->nodes[0]].pool)) continue;
            o->wait = SCHED_WAIT_RESERVATION;
            snprintf(o->wait_text, sizeof o->wait_text,
                     "blocked behind the reservation for job %s (due to start in %.0f s): "
                     "starting now would delay it", s->jobs[v->job].id, v->T > now ? v->T - now : 0.0);
            return;
        }
    }
    o->wait = SCHED_WAIT_RESOURCES;
    int at = 0;
    double frac, fair;
    if (over_share(s, j, &frac, &fair)) {
        o->wait = SCHED_WAIT_FAIR_SHARE;
        at = snprintf(o->wait_text, sizeof o->wait_text,
                      "tenant %s holds %.0f%% of busy GPUs, over its fair share of %.0f%%; ",
                      s->tenants[j->tenant].id, 100 * frac, 100 * fair);
    }
    if (free_pool != NONE) pool_name(s, free_pool, pn, sizeof pn);
    if (j->kind == SCHED_GANG)
        snprintf(o->wait_text + at, sizeof o->wait_text - (size_t)at,
                 "needs %d nodes with %d GPUs free in one pool; the best, %s, has %d", j->nodes, j->gpn,
                 free_pool != NONE ? pn : "none", best_free < 0 ? 0 : best_free);
    else
        snprintf(o->wait_text + at, sizeof o->wait_text - (size_t)at,
                 "needs %d replica%s of %d GPU%s; free GPUs hold %ld", j->nodes, j->nodes > 1 ? "s" : "",
                 j->gpn, j->gpn > 1 ? "s" : "", free_replicas);
}
