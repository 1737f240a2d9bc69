/* Placement: each pool keeps its UP nodes in buckets by free GPU count, so
 * "does an n x g gang fit" is a sum over at most MAXG counters and picking
 * the least fragmenting nodes (the fullest nodes that still fit) walks the
 * buckets from g upwards. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "place_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

int sched__type_hist_grow(sched *s, uint32_t t, size_t n)
{
    struct stpools *tp = &s->plc->tpools[t];
    if (n < tp->hcap) return 0;
    size_t cap = tp->hcap ? tp->hcap : 64;
    while (cap <= n) cap *= 2;
    int *h = calloc((MAXG + 1) * cap, sizeof *h);
    if (!h) return sh_err(SH_ENOMEM, "sched: out of memory");
    for (int g = 0; g <= MAXG; g++)
        if (tp->hcap) memcpy(h + g * cap, tp->ge_hist + g * tp->hcap, tp->hcap * sizeof *h);
        else h[g * cap] = (int)tp->n; /* every pool of the type starts at 0 */
    free(tp->ge_hist);
    tp->ge_hist = h, tp->hcap = cap;
    return 0;
}

/* Pool p's ge[g] moves from `from` to `from + d` (d = +-1). */
static void type_ge_move(struct stpools *tp, int g, int from, int d)
{
    int *h = tp->ge_hist + (size_t)g * tp->hcap;
    h[from]--, h[from + d]++;
    if (d > 0 && from + d > tp->max_ge[g]) tp->max_ge[g] = from + d;
    else if (d < 0 && from == tp->max_ge[g] && !h[from]) tp->max_ge[g] = from - 1;
}

void sched__bucket_insert(sched *s, uint32_t ni)
{
    snode *n = &s->nodes[ni];
    spool *p = &s->pools[n->pool];
    sched__pool_touch(s, n->pool);
    n->prev = NONE;
    n->next = p->head[n->free];
    if (n->next != NONE) s->nodes[n->next].prev = ni;
    p->head[n->free] = ni;
    p->count[n->free]++;
    struct stpools *tp = &s->plc->tpools[p->type];
    for (int g = 0; g <= n->free; g++) type_ge_move(tp, g, p->ge[g]++, 1), s->plc->ge_all[g]++, tp->ge[g]++;
    p->free_total += n->free;
    p->gpus_up += n->gpus;
    s->gpus_up += n->gpus;
    s->gpus_busy += n->gpus - n->free;
    s->busy_ver++; /* fair-share keys moved */
    s->nodes_up++;
}

void sched__bucket_remove(sched *s, uint32_t ni)
{
    snode *n = &s->nodes[ni];
    spool *p = &s->pools[n->pool];
    sched__pool_touch(s, n->pool);
    if (n->prev != NONE) s->nodes[n->prev].next = n->next;
    else p->head[n->free] = n->next;
    if (n->next != NONE) s->nodes[n->next].prev = n->prev;
    p->count[n->free]--;
    struct stpools *tp = &s->plc->tpools[p->type];
    for (int g = 0; g <= n->free; g++) type_ge_move(tp, g, p->ge[g]--, -1), s->plc->ge_all[g]--, tp->ge[g]--;
    p->free_total -= n->free;
    p->gpus_up -= n->gpus;
    s->gpus_up -= n->gpus;
    s->gpus_busy -= n->gpus - n->free;
    s->busy_ver++; /* fair-share keys moved */
    s->nodes_up--;
}

void sched__node_updown(sched *s, uint32_t ni, int d)
{
    snode *n = &s->nodes[ni];
    spool *p = &s->pools[n->pool];
    for (int g = 0; g <= n->gpus && g <= MAXG; g++) p->up_ge[g] += d;
    if (d > 0) sched__bucket_insert(s, ni);
    else sched__bucket_remove(s, ni);
}

/* Changes an UP node's free count, moving it between buckets. */
static void set_free(sched *s, uint32_t ni, int free)
{
    snode *n = &s->nodes[ni];
    n->ver++;
    sched__pool_touch(s, n->pool);
    if (n->state != SCHED_NODE_UP) {
        n->free = free;
        return;
    }
    sched__bucket_remove(s, ni);
    n->free = free;
    sched__bucket_insert(s, ni);
}

static int is_preemptible(const sjob *j) { return j->kind != SCHED_GANG; }

int sched__prios_add(sprios *a, int prio, int delta)
{
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i].prio == prio) return a->v[i].gpus += delta, 0;
    SH_TRY(sched__grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v));
    a->v[a->n++] = (sprio){prio, delta};
    return 0;
}

int sched__prios_below(const sprios *a, int prio)
{
    int g = 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i].prio < prio) g += a->v[i].gpus;
    return g;
}

/* The lowest `gpus` device indices free on n (below 64). */
static uint64_t low_free(const snode *n, int gpus)
{
    uint64_t m = 0, busy = n->gbusy;
    int top = n->gpus < 64 ? n->gpus : 64;
    for (int g = 0; g < top && gpus > 0; g++)
        if (!(busy >> g & 1)) m |= 1ull << g, gpus--;
    return m;
}

int sched__hold(sched *s, uint32_t ji, uint32_t ni, int gpus, double now)
{
    return sched__hold_at(s, ji, ni, gpus, 0, now, now);
}

int sched__hold_at(sched *s, uint32_t ji, uint32_t ni, int gpus, uint64_t mask, double since, double now)
{
    sjob *j = &s->jobs[ji];
    snode *n = &s->nodes[ni];
    if (j->nplaces + 1 > j->capplaces) {
        size_t cap = (size_t)j->capplaces;
        SH_TRY(sched__grow((void **)&j->places, &cap, (size_t)j->nplaces + 1, sizeof *j->places));
        j->capplaces = (int)cap;
    }
    if (n->nrefs + 1 > n->caprefs) {
        size_t cap = (size_t)n->caprefs;
        SH_TRY(sched__grow((void **)&n->refs, &cap, (size_t)n->nrefs + 1, sizeof *n->refs));
        n->caprefs = (int)cap;
    }
    /* Work that will outlast a reservation made this cycle on the node uses
     * up the reservation's spare GPUs there. */
    if (n->resv_stamp == s->stamp && now + sched__est_len(s, j, n->pool) > n->resv_T + 1e-9)
        n->resv_spare -= gpus;
    if (!mask) mask = low_free(n, gpus);
    n->gbusy |= mask;
    j->places[j->nplaces++] = (splace){ni, gpus, since, mask};
    n->refs[n->nrefs++] = (sref){ji, gpus};
    set_free(s, ni, n->free - gpus);
    /* A job being started gets its start (now) after its holds. */
    double end = j->state == SCHED_QUEUED ? now + sched__est_len(s, j, j->pool) : sched__est_end(s, j);
    if (end > s->pools[n->pool].drain) s->pools[n->pool].drain = end;
    s->tenants[j->tenant].gpus_in_use += gpus;
    s->busy_ver++; /* fair-share keys moved */
    if (is_preemptible(j)) {
        spool *pp = &s->pools[n->pool];
        if (!n->pre_gpus) {
            SH_TRY(sched__grow((void **)&pp->pre_nodes, &pp->cappre_nodes, pp->npre_nodes + 1,
                               sizeof *pp->pre_nodes));
            n->pre_pos = (uint32_t)pp->npre_nodes;
            pp->pre_nodes[pp->npre_nodes++] = ni;
        }
        n->pre_gpus += gpus;
        s->preemptible_gpus += gpus;
        SH_TRY(sched__prios_add(&s->pre, j->priority, gpus));
        SH_TRY(sched__prios_add(&s->pools[n->pool].pre, j->priority, gpus));
    }
    return 0;
}

void sched__release_place(sched *s, uint32_t ji, int k, double now)
{
    sjob *j = &s->jobs[ji];
    splace p = j->places[k];
    snode *n = &s->nodes[p.node];
    sched__bill(s, j, &p, now);
    n->gbusy &= ~p.gmask;
    for (int r = 0; r < n->nrefs; r++)
        if (n->refs[r].job == ji && n->refs[r].gpus == p.gpus) {
            n->refs[r] = n->refs[--n->nrefs];
            break;
        }
    set_free(s, p.node, n->free + p.gpus);
    s->pools[n->pool].rel_ver++;
    if (sched__est_end(s, j) >= s->pools[n->pool].drain - 1e-9) s->pools[n->pool].drain_ok = 0;
    if (!n->nrefs) n->idle_since = now;
    j->places[k] = j->places[--j->nplaces];
    s->tenants[j->tenant].gpus_in_use -= p.gpus;
    s->busy_ver++; /* fair-share keys moved */
    if (is_preemptible(j)) {
        spool *pp = &s->pools[n->pool];
        if (!(n->pre_gpus -= p.gpus)) {
            uint32_t last = pp->pre_nodes[--pp->npre_nodes];
            pp->pre_nodes[n->pre_pos] = last;
            s->nodes[last].pre_pos = n->pre_pos;
        }
        s->preemptible_gpus -= p.gpus;
        /* Entries exist: the hold added them. */
        sched__prios_add(&s->pre, j->priority, -p.gpus);
        sched__prios_add(&s->pools[n->pool].pre, j->priority, -p.gpus);
    }
    sched__released(s, n->pool);
}

int sched__released_since(sched *s, uint64_t since, const uint32_t **out)
{
    *out = s->plc->rel.v;
    if (s->plc->rel.since == since && s->plc->rel.epoch == s->release_epoch) return s->plc->rel.n;
    int n = 0;
    if (since > s->release_epoch || s->release_epoch - since >= RLOG) n = -1;
    for (uint64_t e = since + 1; e <= s->release_epoch && n >= 0; e++) {
        uint32_t pi = s->rlog[e % RLOG];
        int seen = 0;
        for (int k = 0; k < n && !seen; k++) seen = s->plc->rel.v[k] == pi;
        if (seen) continue;
        if (pi == NONE || n == RELEASED) n = -1;
        else s->plc->rel.v[n++] = pi;
    }
    s->plc->rel.since = since, s->plc->rel.epoch = s->release_epoch, s->plc->rel.n = n;
    return n;
}

void sched__release_all(sched *s, uint32_t ji, double now)
{
    while (s->jobs[ji].nplaces) sched__release_place(s, ji, s->jobs[ji].nplaces - 1, now);
}

int sched__pool_allowed(const sched *s, const sjob *j, uint32_t pi)
{
    return sched__job_speed(s, j, s->pools[pi].type) > 0;
}

size_t sched__type_pools(const sched *s, uint32_t type, const uint32_t **out)
{
    if (type >= s->plc->ntpools) return *out = NULL, 0;
    *out = s->plc->tpools[type].v;
    return s->plc->tpools[type].n;
}

size_t sched__job_pools(const sched *s, const sjob *j, const uint32_t **out)
{
    if (!j->ntypes) return *out = s->plc->allpools, s->npools;
    if (j->ntypes == 1) return sched__type_pools(s, j->types[0], out);
    sjob *c = (sjob *)j; /* the list is a cache of the job's */
    if (c->jp_ver != s->plc->pools_ver + 1) {
        size_t n = 0;
        for (int t = 0; t < j->ntypes; t++) {
            const uint32_t *v;
            size_t m = sched__type_pools(s, j->types[t], &v);
            if (sched__grow((void **)&c->jp, &c->capjp, n + m + 1, sizeof *c->jp) < 0) return *out = NULL, 0;
            if (m) memcpy(c->jp + n, v, m * sizeof *v); /* v is NULL for a type with no pool yet */
            n += m;
        }
        c->njp = n, c->jp_ver = s->plc->pools_ver + 1;
    }
    *out = c->jp;
    return c->njp;
}

int sched__pool_fits(const spool *p, int n, int g) { return g <= MAXG && p->ge[g] >= n; }

/* Capacity that could ever exist for the job: nodes of each allowed pool
 * (in any state) plus what the quotas may add. */
int sched__never_fits(sched *s, const sjob *j, char *why, size_t cap)
{
    int g = j->gpn, best = 0, total = 0;
    const uint32_t *jp;
    size_t njp = sched__job_pools(s, j, &jp);
    for (size_t k = 0; k < njp; k++) {
        uint32_t pi = jp[k];
        int c = s->pools[pi].maxg_ever[g];
        for (size_t q = 0; q < s->nquotas; q++) {
            squota *qq = &s->quotas[q];
            if (qq->zone == s->pools[pi].zone && qq->fabric == s->pools[pi].fabric &&
                qq->type == s->pools[pi].type && qq->gpus >= g)
                c += qq->max_nodes;
        }
        if (c > best) best = c;
        total += c;
    }
    /* Quotas for a (zone, fabric, type) that has no node yet. */
    for (size_t q = 0; q < s->nquotas; q++) {
        squota *qq = &s->quotas[q];
        int known = 0;
        for (size_t pi = 0; pi < s->npools; pi++)
            known |= qq->zone == s->pools[pi].zone && qq->fabric == s->pools[pi].fabric &&
                     qq->type == s->pools[pi].type;
        if (known || qq->gpus < g || (j->ntypes && sched__job_speed(s, j, qq->type) <= 0)) continue;
        if (qq->max_nodes > best) best = qq->max_nodes;
        total += qq->max_nodes;
    }
    int need = j->nodes;
    /* A node hosts at most MAXG / g replicas: a cheap upper bound. */
    int ok = j->kind == SCHED_GANG ? best >= need : (long)total * (MAXG / g) >= need;
    if (ok) return 0;
    if (j->kind == SCHED_GANG)
        snprintf(why, cap,
                 "needs %d nodes x %d GPUs in one zone, fabric and GPU type; the largest such "
                 "pool (with quotas) has %d nodes with >= %d GPUs",
                 need, g, best, g);
    else
        snprintf(why, cap, "no node or quota of an allowed GPU type has %d free GPUs", g);
    return 1;
}

/* Whether putting `gpus` more GPUs of a job that runs until est_end on node
 * ni would eat into a reservation made this step. */
static int resv_conflict(const sched *s, const snode *n, int gpus, double est_end)
{
    return n->resv_stamp == s->stamp && est_end > n->resv_T + 1e-9 && gpus > n->resv_spare;
}

/* Picks j->nodes distinct nodes of pool pi with >= gpn free GPUs, fullest
 * first (least fragmentation), skipping nodes whose reservation the job
 * would delay.  Returns 1 and fills out when it found them all. */
int sched__pick_gang(sched *s, const sjob *j, uint32_t pi, double est_end, scand *out)
{
    const spool *p = &s->pools[pi];
    int need = j->kind == SCHED_GANG ? j->nodes : 1;
    out->n = 0;
    if (!sched__pool_fits(p, need, j->gpn)) return 0;
    for (int f = j->gpn; f <= MAXG && out->n < need; f++)
        for (uint32_t ni = p->head[f]; ni != NONE && out->n < need; ni = s->nodes[ni].next)
            if (!resv_conflict(s, &s->nodes[ni], j->gpn, est_end)) out->nodes[out->n++] = ni;
    return out->n == need;
}

/* When every node of pool pi would be idle if running work ends at its
 * estimates (work past its estimate at its moved-on end); cached while the
 * pool is unchanged. */
static double pool_drain(sched *s, uint32_t pi, double now)
{
    spool *p = &s->pools[pi];
    if (!p->drain_ok) {
        double t = -INFINITY;
        for (size_t k = 0; k < p->nnodes; k++) {
            const snode *n = &s->nodes[p->nodes[k]];
            for (int r = 0; r < n->nrefs; r++) {
                double e = sched__est_end(s, &s->jobs[n->refs[r].job]);
                if (e > t) t = e;
            }
        }
        p->drain = t, p->drain_ok = 1;
    }
    return p->drain < now ? now : p->drain;
}

/* shoal's pool key for work ending at `end` (smaller is better): a pool
 * whose running work ends no earlier than it does comes first, the one
 * that drains soonest; then the others, the one it delays least. */
static double drain_key(sched *s, uint32_t pi, double now, double end)
{
    double d = pool_drain(s, pi, now);
    return d >= end ? d - 1e12 : end - d; /* 1e12 s: past any time a replay reaches */
}

/* Chooses a pool for a gang (or one pod of any kind).  pack = 1 (shoal):
 * fastest allowed type first, then the pool left fullest after placement, so
 * that emptier pools stay whole for large gangs.  pack = 0: the first pool
 * that fits, in the job's type order, then pool creation order (baselines);
 * shoal (drain_pools) takes, among the pools of that first type where it
 * fits, the one drain_key prefers, so that long work gathers in pools that
 * already run long work and other pools drain whole for a large gang:
 * the job starts now either way, at the same speed. */
int sched__pick_pool(sched *s, const sjob *j, double now, int pack, scand *out, uint32_t *pool)
{
    static __thread scand tmp[2];
    int cur = 0, got = -1;
    uint32_t best = NONE;
    double best_speed = 0, best_key = 0;
    int best_left = 0;
    int nt = j->ntypes ? j->ntypes : 1;
    int drain = !pack && s->cfg.policy == SCHED_POLICY_SHOAL && s->cfg.drain_pools;
    for (int ti = 0; ti < nt && (best == NONE || pack); ti++) {
        const uint32_t *tp;
        size_t ntp = j->ntypes ? sched__type_pools(s, j->types[ti], &tp) : (tp = s->plc->allpools, s->npools);
        for (size_t k = 0; k < ntp; k++) {
            uint32_t pi = tp[k];
            const spool *p = &s->pools[pi];
            double sp = j->ntypes ? j->speed[ti] : 1.0;
            if (best != NONE && sp < best_speed) continue;
            double est_end = now + sched__est_len(s, j, pi);
            int left = p->free_total - j->nodes * j->gpn;
            if (best != NONE && pack && sp == best_speed && left >= best_left) continue;
            if (!sched__pick_gang(s, j, pi, est_end, &tmp[cur])) continue;
            /* Work that shares a node packs in pool order, where the
             * fragments it leaves are: spread by drain time, it left
             * part-used nodes in every pool, fewer whole ones. */
            int whole = j->gpn >= MAXG || p->maxg_ever[j->gpn + 1] == 0;
            double key = drain && whole ? drain_key(s, pi, now, est_end) : -INFINITY;
            if (!pack && best != NONE && key >= best_key) continue;
            best = pi, best_speed = sp, best_left = left, best_key = key;
            got = cur, cur ^= 1;
            if (!pack && (!drain || !whole)) break;
        }
    }
    if (best == NONE) return 0;
    out->n = tmp[got].n;
    memcpy(out->nodes, tmp[got].nodes, (size_t)out->n * sizeof *out->nodes);
    *pool = best;
    return 1;
}

/* ---- Pools ------------------------------------------------------------------ */

static uint32_t pool_make(sched *s, uint32_t z, uint32_t f, uint32_t t)
{
    for (size_t i = 0; i < s->npools; i++)
        if (s->pools[i].zone == z && s->pools[i].fabric == f && s->pools[i].type == t)
            return (uint32_t)i;
    if (GROW(s->pools, s->cappools, s->npools + 1) < 0) return NONE;
    spool *p = &s->pools[s->npools];
    memset(p, 0, sizeof *p);
    p->zone = z, p->fabric = f, p->type = t;
    for (int g = 0; g <= MAXG; g++) p->head[g] = NONE;
    uint32_t pi = (uint32_t)s->npools;
    size_t cap = s->npools;
    if (sched__grow((void **)&s->plc->allpools, &cap, s->npools + 1, sizeof *s->plc->allpools) < 0) return NONE;
    s->plc->allpools[pi] = pi;
    if (t >= s->plc->ntpools) {
        size_t c = s->plc->ntpools;
        if (sched__grow((void **)&s->plc->tpools, &c, (size_t)t + 1, sizeof *s->plc->tpools) < 0) return NONE;
        s->plc->ntpools = c;
    }
    struct stpools *tp = &s->plc->tpools[t];
    if (GROW(tp->v, tp->cap, tp->n + 1) < 0) return NONE;
    tp->v[tp->n++] = pi;
    if (tp->hcap)
        for (int g = 0; g <= MAXG; g++) tp->ge_hist[g * tp->hcap]++; /* the new pool: ge 0 */
    s->npools++;
    return pi;
}

uint32_t sched__pool_of(sched *s, uint32_t z, uint32_t f, uint32_t t)
{
    uint32_t pi = pool_make(s, z, f, t);
    if (pi != NONE) s->plc->pools_ver++;
    return pi;
}

int sched__place_new(sched *s)
{
    return (s->plc = calloc(1, sizeof *s->plc)) ? 0 : SH_ENOMEM;
}

void sched__place_free(sched *s)
{
    if (!s->plc) return;
    for (size_t i = 0; i < s->plc->ntpools; i++) free(s->plc->tpools[i].v), free(s->plc->tpools[i].ge_hist);
    free(s->plc->tpools), free(s->plc->allpools);
    free(s->plc);
}
