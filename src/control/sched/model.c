/* The model: configuration, names, and the decisions list. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"

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

int sched__check_name(const char *what, const char *v)
{
    if (!v || !*v) return sh_err(SH_EINVAL, "%s is empty", what);
    if (strlen(v) >= SCHED_ID_MAX)
        return sh_err(SH_EINVAL, "%s \"%.32s...\" is longer than %d bytes", what, v, SCHED_ID_MAX - 1);
    return 0;
}

int sched__find_node(const sched *s, const char *id, uint32_t *out)
{
    uint32_t ni = sched__map_get(&s->node_map, id);
    if (ni == NONE || s->nodes[ni].removed)
        return sh_err(SH_ENOENT, "node %s is not known", id ? id : "(null)");
    *out = ni;
    return 0;
}

int sched__find_job(const sched *s, const char *id, uint32_t *out)
{
    uint32_t ji = sched__map_get(&s->job_map, id);
    if (ji == NONE) return sh_err(SH_ENOENT, "job %s is not known", id ? id : "(null)");
    *out = ji;
    return 0;
}

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
int sched__emit_place(sched_decisions *d, const sched *s, const splace *p)
{
    SH_TRY(GROW(d->places, d->cap_places, d->n_places + 1));
    d->places[d->n_places++] = (sched_place){s->nodes[p->node].id, p->node, p->gpus, p->gmask, p->since};
    d->v[d->n - 1].count++;
    return 0;
}

int sched__pend(sched *s, sched_decision_kind k, uint32_t ji, uint32_t ni)
{
    SH_TRY(GROW(s->pend, s->cappend, s->npend + 1));
    s->pend[s->npend++] = (spending){k, ji, ni, NULL, 0};
    return 0;
}

/* Frees the model's arrays and s itself (sched_free, after every layer
 * above has freed its own state). */
void sched__model_free(sched *s)
{
    for (size_t i = 0; i < s->nnodes; i++) free(s->nodes[i].refs);
    for (size_t i = 0; i < s->npools; i++) {
        spool *p = &s->pools[i];
        free(p->nodes), free(p->pre.v), free(p->pre_nodes);
        for (int k = 0; k < RC_SLOTS; k++) free(p->rc[k].nodes), free(p->rc[k].tk);
    }
    free(s->pre.v);
    for (size_t i = 0; i < s->njobs; i++)
        free(s->jobs[i].places), free(s->jobs[i].cost_t), free(s->jobs[i].reason), free(s->jobs[i].jp);
    for (size_t i = 0; i < s->ntenants; i++) free(s->tenants[i].queue), free(s->tenants[i].cost_t);
    for (size_t i = 0; i < s->npend; i++) free(s->pend[i].places);
    sched__map_free(&s->names), sched__map_free(&s->node_map);
    sched__map_free(&s->job_map), sched__map_free(&s->tenant_map);
    free(s->name), free(s->nodes), free(s->pools), free(s->jobs), free(s->tenants);
    free(s->pend), free(s->quotas);
    for (size_t i = 0; i < s->capshapes; i++) free(s->shapes[i].heap), free(s->shapes[i].pheap), free(s->shapes[i].uheap);
    free(s->shapes), free(s->live), free(s->touched), free(s->freejobs);
    free(s);
}
