/* The scheduling core's state: configuration, names, nodes, jobs, tenant
 * queues, billing and queries.  Placement lives in place.c, the scheduling
 * cycle in cycle.c, invariants in check.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

static const char *const policy_names[] = {"fifo", "firstfit", "backfill", "shoal"};

void sched_config_default(sched_config *c, sched_policy policy)
{
    memset(c, 0, sizeof *c);
    c->policy = policy;
    c->hold_timeout_s = 300;
    c->restart_cost_s = 60;
    c->max_victims = policy == SCHED_POLICY_SHOAL ? 8 : 0;
    /* Preempting only where it saves a wait of at least half the gang's
     * run: on the mixed replays preemption for gangs due to start soon
     * cost 2-4 node gangs 1.3x backfill's p99 for no gain on large ones
     * (docs/sched.md, "What costs the small jobs"). */
    c->preempt_wait = 0.5;
    /* One reservation, as EASY backfill: on the mixed replays each further
     * reservation held for a large gang kept 2-16 node gangs waiting 2-4x
     * longer at p99 than under backfill (docs/sched.md, "What costs the
     * small jobs"). */
    c->max_reservations = 1;
    c->default_est_s = 3600;
    c->fair_window_s = 7200;
    c->drain_pools = policy == SCHED_POLICY_SHOAL;
    c->scale_up_wait_s = 600;
    c->scale_down_idle_s = 1800;
}

int sched_policy_parse(const char *name, sched_policy *out)
{
    for (int i = 0; i < 4; i++)
        if (name && !strcmp(name, policy_names[i])) return *out = (sched_policy)i, 0;
    return sh_err(SH_EINVAL, "unknown policy \"%s\" (use fifo, firstfit, backfill or shoal)",
                  name ? name : "");
}

const char *sched_policy_name(sched_policy p)
{
    return (unsigned)p < 4 ? policy_names[p] : "?";
}

int sched__grow(void **v, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *n = realloc(*v, c * elem);
    if (!n) return sh_err(SH_ENOMEM, "sched: out of memory");
    memset((char *)n + *cap * elem, 0, (c - *cap) * elem);
    *v = n, *cap = c;
    return 0;
}
#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

uint32_t sched__intern(sched *s, const char *name, int create)
{
    uint32_t ix = sched__map_get(&s->names, name);
    if (ix != NONE || !create) return ix;
    if (GROW(s->name, s->capname, s->nname + 1) < 0) return NONE;
    const char *stored;
    if (sched__map_put(&s->names, name, (uint32_t)s->nname, &stored) < 0) return NONE;
    s->name[s->nname] = stored;
    return (uint32_t)s->nname++;
}

static int check_name(const char *what, const char *v)
{
    if (!v || !*v) return sh_err(SH_EINVAL, "%s is empty", what);
    if (strlen(v) >= SCHED_ID_MAX)
        return sh_err(SH_EINVAL, "%s \"%.32s...\" is longer than %d bytes", what, v, SCHED_ID_MAX - 1);
    return 0;
}

sched *sched_new(const sched_config *c)
{
    if (!c || (unsigned)c->policy > SCHED_POLICY_SHOAL) {
        sh_err(SH_EINVAL, "sched_new: unknown policy");
        return NULL;
    }
    if (c->max_victims < 0 || c->max_reservations < 0 || c->hold_timeout_s < 0 || !(c->preempt_wait >= 0)) {
        sh_err(SH_EINVAL, "sched_new: negative limit in the configuration");
        return NULL;
    }
    sched *s = calloc(1, sizeof *s);
    if (!s) return sh_err(SH_ENOMEM, "sched: out of memory"), NULL;
    s->cfg = *c;
    s->cfg.quotas = NULL;
    s->plain_cycle = c->reference != 0;
    if (s->cfg.default_est_s <= 0) s->cfg.default_est_s = 3600;
    if (c->policy == SCHED_POLICY_BACKFILL) s->cfg.max_reservations = 1;
    if (c->policy != SCHED_POLICY_SHOAL) s->cfg.max_victims = 0;
    s->quotas = c->n_quotas ? calloc(c->n_quotas, sizeof *s->quotas) : NULL;
    for (size_t i = 0; i < c->n_quotas; i++) {
        const sched_quota *q = &c->quotas[i];
        if (check_name("quota zone", q->zone) || check_name("quota fabric", q->fabric) ||
            check_name("quota GPU type", q->gpu_type) || q->gpus < 1 || q->gpus > MAXG ||
            q->max_nodes < 0 || q->delay_s < 0 || q->price_per_gpu_hour < 0) {
            if (!sh_errmsg()[0] || q->gpus < 1 || q->gpus > MAXG)
                sh_err(SH_EINVAL, "quota %zu: gpus must be 1..%d, counts and delays >= 0", i, MAXG);
            sched_free(s);
            return NULL;
        }
        s->quotas[i] = (squota){sched__intern(s, q->zone, 1), sched__intern(s, q->fabric, 1),
                                sched__intern(s, q->gpu_type, 1), q->gpus, q->max_nodes, 0, 0,
                                q->price_per_gpu_hour, q->delay_s};
    }
    s->nquotas = c->n_quotas;
    return s;
}

void sched_free(sched *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->nnodes; i++) free(s->nodes[i].refs);
    for (size_t i = 0; i < s->npools; i++) {
        spool *p = &s->pools[i];
        free(p->nodes), free(p->pre.v), free(p->pre_nodes);
        for (int k = 0; k < RC_SLOTS; k++) free(p->rc[k].nodes), free(p->rc[k].tk);
    }
    free(s->pre.v);
    for (size_t i = 0; i < s->njobs; i++) {
        free(s->jobs[i].places), free(s->jobs[i].cost_t), free(s->jobs[i].reason), free(s->jobs[i].jp);
    }
    for (size_t i = 0; i < s->ntenants; i++) free(s->tenants[i].queue), free(s->tenants[i].cost_t);
    for (size_t i = 0; i < s->capresv; i++) free(s->resv[i].nodes);
    for (size_t i = 0; i < s->npend; i++) free(s->pend[i].places);
    sched__map_free(&s->names), sched__map_free(&s->node_map);
    sched__map_free(&s->job_map), sched__map_free(&s->tenant_map);
    sched_bills_done(s, s->nbills);
    free(s->bills);
    free(s->name), free(s->nodes), free(s->pools), free(s->jobs), free(s->tenants);
    free(s->resv), free(s->pend), free(s->quotas), free(s->waiting), free(s->deferred), free(s->due);
    for (size_t i = 0; i < s->capshapes; i++) free(s->shapes[i].heap), free(s->shapes[i].pheap), free(s->shapes[i].uheap);
    free(s->elastic), free(s->allpools), free(s->shapes), free(s->live), free(s->touched),
         free(s->bpc.val), free(s->bpc.kind), free(s->bpc.qpos), free(s->freejobs), free(s->forgot_cost_t);
    for (size_t i = 0; i < s->ntpools; i++) free(s->tpools[i].v), free(s->tpools[i].ge_hist);
    for (int i = 0; i < 16; i++) free(s->porder[i].pools);
    struct sscratch *x = &s->scr;
    free(x->pp), free(x->tn_exact), free(x->tn_best), free(x->tn_resv), free(x->pb);
    free(x->vn_best), free(x->vn_in), free(x->vn_try), free(x->bpc.val), free(x->bpc.kind), free(x->bpc.qpos);
    free(x->probe_fit.jp), free(x->probe_fit_in.jp), free(x->probe_preempt.jp), free(x->probe_gang.jp),
        free(x->probe_declined.jp);
    free(s->tpools);
    free(s->plan.slot), free(s->plan.hole), free(s->plan.est), free(s->plan.mark), free(s->plan.order), free(s->plan.tn);
    free(s);
}

/* ---- Nodes ---------------------------------------------------------------- */

static uint32_t pool_of(sched *s, uint32_t z, uint32_t f, uint32_t t)
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
    if (sched__grow((void **)&s->allpools, &cap, s->npools + 1, sizeof *s->allpools) < 0) return NONE;
    s->allpools[pi] = pi;
    if (t >= s->ntpools) {
        size_t c = s->ntpools;
        if (sched__grow((void **)&s->tpools, &c, (size_t)t + 1, sizeof *s->tpools) < 0) return NONE;
        s->ntpools = c;
    }
    struct stpools *tp = &s->tpools[t];
    if (GROW(tp->v, tp->cap, tp->n + 1) < 0) return NONE;
    tp->v[tp->n++] = pi;
    if (tp->hcap)
        for (int g = 0; g <= MAXG; g++) tp->ge_hist[g * tp->hcap]++; /* the new pool: ge 0 */
    s->npools++;
    return pi;
}

int sched_node_add(sched *s, const sched_node_spec *n, double now)
{
    SH_TRY(check_name("node id", n->id));
    SH_TRY(check_name("node zone", n->zone));
    SH_TRY(check_name("node fabric", n->fabric));
    SH_TRY(check_name("node GPU type", n->gpu_type));
    if (n->gpus < 1 || n->gpus > MAXG)
        return sh_err(SH_EINVAL, "node %s: gpus %d is outside 1..%d", n->id, n->gpus, MAXG);
    if (!(n->price_per_gpu_hour >= 0))
        return sh_err(SH_EINVAL, "node %s: price per GPU-hour must be >= 0", n->id);
    uint32_t old = sched__map_get(&s->node_map, n->id);
    if (old != NONE && !s->nodes[old].removed)
        return sh_err(SH_EEXIST, "node %s already exists", n->id);
    uint32_t z = sched__intern(s, n->zone, 1), f = sched__intern(s, n->fabric, 1),
             t = sched__intern(s, n->gpu_type, 1);
    if (z == NONE || f == NONE || t == NONE) return SH_ENOMEM;
    uint32_t pi = pool_of(s, z, f, t);
    if (pi == NONE) return SH_ENOMEM;
    s->pools_ver++; /* a new pool or price: elastic pool orders lapse */
    SH_TRY(GROW(s->nodes, s->capnodes, s->nnodes + 1));
    spool *p = &s->pools[pi];
    SH_TRY(GROW(p->nodes, p->capnodes, p->nnodes + 1));
    SH_TRY(sched__type_hist_grow(s, t, p->nnodes + 1));
    uint32_t ni = (uint32_t)s->nnodes;
    snode *nd = &s->nodes[ni];
    memset(nd, 0, sizeof *nd);
    SH_TRY(sched__map_put(&s->node_map, n->id, ni, &nd->id));
    s->nnodes++;
    nd->pool_pos = (uint32_t)p->nnodes;
    p->nodes[p->nnodes++] = ni;
    nd->pool = pi, nd->gpus = n->gpus, nd->free = n->gpus;
    nd->price_s = n->price_per_gpu_hour / 3600.0;
    nd->state = SCHED_NODE_UP, nd->idle_since = now;
    if (!p->nnodes || p->nnodes == 1 || nd->price_s < p->price_s) p->price_s = nd->price_s;
    for (int g = 0; g <= n->gpus; g++) p->maxg_ever[g]++;
    for (size_t q = 0; q < s->nquotas; q++) {
        squota *qq = &s->quotas[q];
        if (qq->zone == z && qq->fabric == f && qq->type == t && qq->pending > 0) {
            qq->pending--, qq->provisioned++, nd->provisioned = 1;
            break;
        }
    }
    p->rel_ver++;
    sched__released(s, NONE); /* room appeared, perhaps in a new pool */
    sched__node_updown(s, ni, 1);
    return 0;
}

static int find_node(const sched *s, const char *id, uint32_t *out)
{
    uint32_t ni = sched__map_get(&s->node_map, id);
    if (ni == NONE || s->nodes[ni].removed)
        return sh_err(SH_ENOENT, "node %s is not known", id ? id : "(null)");
    *out = ni;
    return 0;
}

int sched_node_remove(sched *s, const char *id, double now)
{
    uint32_t ni = NONE;
    SH_TRY(find_node(s, id, &ni));
    snode *n = &s->nodes[ni];
    if (n->nrefs) return sh_err(SH_EAGAIN, "node %s still runs %d pods: fail or drain it first", id, n->nrefs);
    if (n->state == SCHED_NODE_UP) sched__node_updown(s, ni, -1);
    spool *p = &s->pools[n->pool];
    for (int g = 0; g <= n->gpus; g++) p->maxg_ever[g]--;
    sched__pool_touch(s, n->pool); /* it may never fit a gang it could */
    if (n->provisioned)
        for (size_t q = 0; q < s->nquotas; q++) {
            squota *qq = &s->quotas[q];
            if (qq->zone == p->zone && qq->fabric == p->fabric && qq->type == p->type) {
                qq->provisioned--;
                break;
            }
        }
    n->removed = 1;
    n->state = SCHED_NODE_FAILED;
    return 0;
}

int sched_node_recover(sched *s, const char *id, double now)
{
    uint32_t ni = NONE;
    SH_TRY(find_node(s, id, &ni));
    snode *n = &s->nodes[ni];
    if (n->state == SCHED_NODE_UP) return 0;
    n->state = SCHED_NODE_UP;
    n->free = n->gpus - 0;
    for (int k = 0; k < n->nrefs; k++) n->free -= n->refs[k].gpus;
    n->idle_since = now;
    s->pools[n->pool].rel_ver++;
    sched__released(s, n->pool); /* room appeared */
    sched__node_updown(s, ni, 1);
    return 0;
}

int sched_node_fail(sched *s, const char *id, double now)
{
    uint32_t ni = NONE;
    SH_TRY(find_node(s, id, &ni));
    snode *n = &s->nodes[ni];
    if (n->state == SCHED_NODE_FAILED) return 0;
    if (n->state == SCHED_NODE_UP) sched__node_updown(s, ni, -1);
    n->state = SCHED_NODE_FAILED;
    /* Each job on the node loses its pods there; what happens next is the
     * job's failure policy.  Iterate from the end: releases edit refs. */
    while (n->nrefs) {
        uint32_t ji = n->refs[n->nrefs - 1].job;
        sjob *j = &s->jobs[ji];
        int k = 0;
        while (k < j->nplaces && j->places[k].node != ni) k++;
        if (j->kind == SCHED_GANG && j->state == SCHED_RUNNING && j->on_fail == SCHED_REPLACE &&
            j->replace_wait_s > 0) {
            sched__release_place(s, ji, k, now);
            j->state = SCHED_REPLACING;
            j->replace_deadline = now + j->replace_wait_s;
            SH_TRY(sched__wait_add(s, ji));
            SH_TRY(sched__pend(s, SCHED_D_SHRINK, ji, ni));
        } else if (j->state == SCHED_HOLDING) {
            sched__release_place(s, ji, k, now);
        } else if (j->kind == SCHED_ELASTIC && j->nplaces - 1 >= j->nodes) {
            sched__release_place(s, ji, k, now);
            SH_TRY(sched__pend(s, SCHED_D_SHRINK, ji, ni));
        } else {
            SH_TRY(sched__requeue(s, ji, now, 1));
            SH_TRY(sched__pend(s, SCHED_D_REQUEUE, ji, ni));
        }
    }
    return 0;
}

int sched_node_info_get(const sched *s, const char *id, sched_node_info *out)
{
    uint32_t ni = NONE;
    SH_TRY(find_node(s, id, &ni));
    const snode *n = &s->nodes[ni];
    const spool *p = &s->pools[n->pool];
    *out = (sched_node_info){n->id, s->name[p->zone], s->name[p->fabric], s->name[p->type],
                             n->state, n->gpus, n->state == SCHED_NODE_UP ? n->free : 0,
                             n->price_s * 3600.0};
    return 0;
}
