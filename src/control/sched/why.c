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

#include "query_int.h"

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
        for (size_t r = 0; r < s->room->nresv && !mine; r++)
            if (s->room->resv[r].job == ji)
                for (int k = 0; k < s->room->resv[r].n && !mine; k++) mine = s->room->resv[r].nodes[k] == ni;
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

/* ---- The plan: every queued job in order on a profile of free GPUs ------------

 * Like Slurm's `squeue --start` after a backfill pass: the reservations
 * first, at their times on their nodes, then each queued job in the
 * policy's order at the earliest time its placement rules allow, on the
 * GPUs the jobs before it left, each running until its estimate.  Each
 * node keeps the times its GPUs come free, ascending; a job of g GPUs per
 * node can start on a node at the g-th of them, and takes the g earliest.
 * Holes are not kept: a GPU taken from T was idle before T in the plan
 * even where a shorter job could have run, so the plan does not backfill.
 * It is made once per state (on the first query after a change) and its
 * cost is bounded: at most PLAN_JOBS jobs and PLAN_VISITS node visits; a
 * job past those gets the estimate that ignores the queue. */
#define PLAN_JOBS 256
#define PLAN_VISITS 100000

typedef struct splt splt;

/* Moves the k smallest of v[0..m) to v[0..k) (any order); returns the
 * k-th smallest.  Three-way partitions: many times are equal (every free
 * node reads `now`). */
static double kth_select(splt *v, size_t m, size_t k)
{
    long lo = 0, hi = (long)m - 1, want = (long)k - 1;
    while (lo < hi) {
        double pivot = v[lo + (hi - lo) / 2].t;
        long lt = lo, i = lo, gt = hi;
        while (i <= gt) {
            splt x = v[i];
            if (x.t < pivot) v[i++] = v[lt], v[lt++] = x;
            else if (x.t > pivot) v[i] = v[gt], v[gt--] = x;
            else i++;
        }
        if (want < lt) hi = lt - 1;
        else if (want > gt) lo = gt + 1;
        else break;
    }
    return v[want].t;
}

static void slots_sort(double *v, int n)
{
    for (int i = 1; i < n; i++) {
        double x = v[i];
        int k = i - 1;
        while (k >= 0 && v[k] > x) v[k + 1] = v[k], k--;
        v[k + 1] = x;
    }
}

/* When node ni can start g GPUs for len seconds in the plan (>= now):
 * in its hole when the work ends before the hole does, else when g of its
 * GPUs are free for good.  *in_hole says which. */
static inline double plan_node(const sched *s, uint32_t ni, int g, double len, double now, int *in_hole)
{
    const struct splan *P = s->plan;
    const struct sphole *h = &P->hole[ni];
    double at = h->from < now ? now : h->from;
    *in_hole = h->gpus >= g && at + len <= h->to;
    return *in_hole ? at : P->slot[(size_t)ni * MAXG + g - 1];
}

/* Job takes g GPUs on node ni from T to end in the plan.  Taken from the
 * node's free-for-good GPUs, the time they stood idle before T becomes the
 * node's hole (one per node: a later one replaces it), where shorter work
 * may run as backfill would run it. */
static void plan_take(sched *s, uint32_t ni, int g, double T, double end, int in_hole)
{
    struct splan *P = s->plan;
    struct sphole *h = &P->hole[ni];
    if (in_hole) {
        h->gpus -= g; /* the rest of the hole on those GPUs is given up */
        return;
    }
    double *sl = &P->slot[(size_t)ni * MAXG];
    int gpus = s->nodes[ni].gpus < MAXG ? s->nodes[ni].gpus : MAXG, idle = 0;
    double from = sl[g - 1];
    for (int k = 0; k < gpus; k++) idle += sl[k] <= from;
    if (T > from) *h = (struct sphole){from, T, idle};
    for (int k = 0; k < g && k < gpus; k++) sl[k] = end;
    slots_sort(sl, gpus);
}

/* Plan times of the nodes of job j's group q (a gang: its q-th pool; other
 * work: every allowed pool) in P->tn; returns how many. */
static size_t plan_times(sched *s, const sjob *j, const uint32_t *jp, size_t njp, size_t q, double now, int holes)
{
    struct splan *P = s->plan;
    size_t m = 0, from = j->kind == SCHED_GANG ? q : 0, to = j->kind == SCHED_GANG ? q + 1 : njp;
    int g = j->gpn;
    for (size_t k = from; k < to; k++) {
        const spool *p = &s->pools[jp[k]];
        double len = sched__est_len(s, j, j->kind == SCHED_GANG ? jp[k] : NONE);
        for (size_t i = 0; i < p->nnodes; i++) {
            uint32_t ni = p->nodes[i];
            if (s->nodes[ni].gpus < g) continue;
            int in_hole;
            double t = holes ? plan_node(s, ni, g, len, now, &in_hole) : P->slot[(size_t)ni * MAXG + g - 1];
            if (isfinite(t)) P->tn[m++] = (splt){t, ni};
        }
    }
    return m;
}

/* Whether every node of P->tn[0..need) can run j from T: its GPUs are free
 * for good by then, or its hole lasts until j ends. */
static int plan_fits_at(const sched *s, const sjob *j, uint32_t pool, int need, double T)
{
    const struct splan *P = s->plan;
    double len = sched__est_len(s, j, pool);
    for (int k = 0; k < need; k++) {
        uint32_t ni = P->tn[k].ni;
        const struct sphole *h = &P->hole[ni];
        if (P->slot[(size_t)ni * MAXG + j->gpn - 1] <= T) continue;
        if (!(h->gpus >= j->gpn && h->from <= T && T + len <= h->to)) return 0;
    }
    return 1;
}

/* The earliest plan time (>= now) for job j, taking its nodes when
 * commit; INFINITY when it cannot fit the up nodes.  *visits counts the
 * nodes looked at. */
static double plan_job(sched *s, const sjob *j, double now, int commit, size_t *visits)
{
    struct splan *P = s->plan;
    const uint32_t *jp;
    size_t njp = sched__job_pools(s, j, &jp);
    int g = j->gpn, need = j->nodes;
    if (g < 1 || g > MAXG || need < 1) return INFINITY;
    size_t total = 0;
    for (size_t q = 0; q < njp; q++) total += s->pools[jp[q]].nnodes;
    if (sched__grow((void **)&P->tn, &P->captn, total + 1, sizeof *P->tn) < 0) return NAN;
    double best = INFINITY;
    uint32_t bestq = NONE;
    int best_holes = 0;
    /* A gang takes one pool; other work its replicas across every allowed pool. */
    size_t groups = j->kind == SCHED_GANG ? njp : (njp ? 1 : 0);
    for (size_t q = 0; q < groups; q++) {
        uint32_t pool = j->kind == SCHED_GANG ? jp[q] : NONE;
        for (int holes = 1; holes >= 0; holes--) {
            size_t m = plan_times(s, j, jp, njp, q, now, holes);
            *visits += m;
            if (m < (size_t)need) break;
            double T = kth_select(P->tn, m, (size_t)need);
            if (T < now) T = now;
            /* Replicas need not start together: each node at its own time. */
            if (holes && j->kind == SCHED_GANG && !plan_fits_at(s, j, pool, need, T)) continue;
            if (T < best) best = T, bestq = (uint32_t)q, best_holes = holes;
            break;
        }
    }
    if (!commit || bestq == NONE) return best;
    uint32_t pool = j->kind == SCHED_GANG ? jp[bestq] : NONE;
    double len = sched__est_len(s, j, pool);
    size_t m = plan_times(s, j, jp, njp, bestq, now, best_holes);
    kth_select(P->tn, m, (size_t)need);
    for (int k = 0; k < need; k++) {
        uint32_t ni = P->tn[k].ni;
        double T = j->kind == SCHED_GANG ? best : (P->tn[k].t < now ? now : P->tn[k].t);
        int in_hole = 0;
        if (best_holes) plan_node(s, ni, g, len, now, &in_hole);
        if (in_hole && P->slot[(size_t)ni * MAXG + g - 1] <= T) in_hole = 0;
        plan_take(s, ni, g, T, T + len, in_hole);
    }
    return best;
}

/* Makes the plan for the state now, unless the one kept is for it. */
static int plan_build(sched *s, double now, uint32_t want)
{
    struct splan *P = s->plan;
    if (!P->id || P->stamp != s->stamp || P->busy_ver != s->busy_ver || P->now != now ||
        P->nodes_up != s->nodes_up || P->gpus_up != s->gpus_up) {
        P->id += 2, P->built = 0; /* id + 1 marks the order */
        P->stamp = s->stamp, P->busy_ver = s->busy_ver, P->now = now;
        P->nodes_up = s->nodes_up, P->gpus_up = s->gpus_up;
        if (sched__grow((void **)&P->mark, &P->capmark, s->njobs + 1, sizeof *P->mark) < 0 ||
            sched__grow((void **)&P->order, &P->caporder, PLAN_JOBS, sizeof *P->order) < 0)
            return P->id += 2, sh_err(SH_ENOMEM, "sched: out of memory");
        /* The order first, which is cheap: a job past PLAN_JOBS is not planned at all. */
        P->norder = sched__queue_order(s, P->order, PLAN_JOBS);
        P->order_id = P->id + 1; /* marks "in the order, not planned yet" */
        for (size_t i = 0; i < P->norder; i++) P->mark[P->order[i]] = P->order_id;
        for (size_t r = 0; r < s->room->nresv; r++)
            if (s->room->resv[r].job != NONE) P->mark[s->room->resv[r].job] = P->order_id;
    }
    if (P->built || (P->mark[want] != P->order_id && P->mark[want] != P->id)) return 0;
    P->built = 1;
    if (sched__grow((void **)&P->slot, &P->capslot, s->nnodes * MAXG + 1, sizeof *P->slot) < 0 ||
        sched__grow((void **)&P->hole, &P->caphole, s->nnodes + 1, sizeof *P->hole) < 0 ||
        sched__grow((void **)&P->est, &P->capest, s->njobs + 1, sizeof *P->est) < 0) {
        P->id += 2; /* nothing marked with it: every job falls back */
        return sh_err(SH_ENOMEM, "sched: out of memory");
    }
    for (size_t ni = 0; ni < s->nnodes; ni++) {
        const snode *n = &s->nodes[ni];
        double *sl = &P->slot[ni * MAXG];
        int k = 0, gpus = n->gpus < MAXG ? n->gpus : MAXG;
        if (n->state == SCHED_NODE_UP && !n->removed) {
            for (int f = 0; f < n->free && k < gpus; f++) sl[k++] = now;
            for (int r = 0; r < n->nrefs; r++) {
                double e = sched__est_end(s, &s->jobs[n->refs[r].job]);
                for (int g = 0; g < n->refs[r].gpus && k < gpus; g++) sl[k++] = e < now ? now : e;
            }
        }
        while (k < MAXG) sl[k++] = INFINITY;
        slots_sort(sl, gpus);
        P->hole[ni] = (struct sphole){0, 0, 0};
    }
    /* Reservations hold: their gangs start at their times on their nodes. */
    for (size_t r = 0; r < s->room->nresv; r++) {
        const sresv *v = &s->room->resv[r];
        if (v->job == NONE || !v->n) continue;
        const sjob *j = &s->jobs[v->job];
        double T = v->T < now ? now : v->T;
        double end = T + sched__est_len(s, j, s->nodes[v->nodes[0]].pool);
        for (int k = 0; k < v->n; k++) plan_take(s, v->nodes[k], v->need, T, end, 0);
        P->est[v->job] = T, P->mark[v->job] = P->id;
    }
    size_t n = P->norder, visits = 0;
    for (size_t i = 0; i < n && visits < PLAN_VISITS; i++) {
        uint32_t ji = P->order[i];
        if (P->mark[ji] == P->id) continue; /* reserved */
        double T = plan_job(s, &s->jobs[ji], now, 1, &visits);
        if (isnan(T)) return sh_err(SH_ENOMEM, "sched: out of memory");
        P->est[ji] = T, P->mark[ji] = P->id;
    }
    return 0;
}

/* Up nodes with >= g GPUs in a pool (busy or not). */
static int up_nodes(const spool *p, int g) { return g >= 0 && g <= MAXG ? p->up_ge[g] : 0; }

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

static void pending(sched *s, uint32_t ji, double now, sched_job_info *o, int est);

void sched__pending(sched *s, uint32_t ji, double now, sched_job_info *o, int est)
{
    pending(s, ji, now, o, est);
    if (!est) o->est_start_s = NAN;
}

/* The reason, and with est the estimate; the branches below set est_start_s
 * where the reason gives it (cheap), and the caller drops it without est. */
static void pending(sched *s, uint32_t ji, double now, sched_job_info *o, int est)
{
    sjob *j = &s->jobs[ji];
    const uint32_t *jp;
    size_t njp = sched__job_pools(s, j, &jp);
    int need = j->kind == SCHED_GANG ? j->nodes : 1;
    char pn[3 * SCHED_ID_MAX];
    if (est && !s->cfg.plain_estimates && !plan_build(s, now, ji) && s->plan->mark[ji] == s->plan->id)
        o->est_start_s = s->plan->est[ji];
    else if (est)
        o->est_start_s = estimate(s, j, ji, now);
    njp = sched__job_pools(s, j, &jp); /* estimate() may have reused the buffer */
    /* Capacity that is up at all, busy or not. */
    int best_up = -1, best_free = -1;
    uint32_t up_pool = NONE, free_pool = NONE, fit_pool = NONE;
    long free_replicas = 0;
    for (size_t q = 0; q < njp; q++) {
        const spool *p = &s->pools[jp[q]];
        int up = up_nodes(p, j->gpn), fr = p->ge[j->gpn];
        if (up > best_up) best_up = up, up_pool = jp[q];
        if (fr > best_free) best_free = fr, free_pool = jp[q];
        if (fit_pool == NONE && sched__pool_fits(p, need, j->gpn)) fit_pool = jp[q];
        if (j->kind != SCHED_GANG) /* replicas: said only for other work */
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
    for (size_t r = 0; r < s->room->nresv; r++)
        if (s->room->resv[r].job == ji && s->room->resv[r].n) {
            pool_name(s, s->nodes[s->room->resv[r].nodes[0]].pool, pn, sizeof pn);
            o->wait = SCHED_WAIT_RESERVED;
            o->est_start_s = s->room->resv[r].T < now ? now : s->room->resv[r].T;
            snprintf(o->wait_text, sizeof o->wait_text,
                     "holds a reservation of %d nodes in %s: starts when running work there ends", s->room->resv[r].n, pn);
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
        for (size_t r = 0; r < s->room->nresv; r++) {
            const sresv *v = &s->room->resv[r];
            if (v->job == NONE || !v->n || !sched__pool_allowed(s, j, s->nodes[v->nodes[0]].pool)) continue;
            o->wait = SCHED_WAIT_RESERVATION;
            o->wait_job = s->jobs[v->job].id;
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

/* ---- State ---------------------------------------------------------------- */

int sched__query_new(sched *s)
{
    return (s->plan = calloc(1, sizeof *s->plan)) ? 0 : SH_ENOMEM;
}

void sched__query_free(sched *s)
{
    struct splan *P = s->plan;
    if (!P) return;
    free(P->slot), free(P->hole), free(P->est), free(P->mark), free(P->order), free(P->tn);
    free(P);
}
