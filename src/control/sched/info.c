/* Queries on jobs and nodes: info, allocations, statistics. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "query_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

/* ---- Queries -------------------------------------------------------------- */

int64_t sched_job_ix(const sched *s, const char *id)
{
    uint32_t ji = sched__map_get(&s->job_map, id);
    return ji == NONE ? -1 : (int64_t)ji;
}

size_t sched_job_count(const sched *s) { return s->njobs; }

static int info_ix(const sched *s, uint32_t ix, double now, sched_job_info *o, int est)
{
    if (ix >= s->njobs || !s->jobs[ix].id) return sh_err(SH_ENOENT, "job handle %u is not known", ix);
    const sjob *j = &s->jobs[ix];
    memset(o, 0, sizeof *o);
    o->id = j->id, o->tenant = s->tenants[j->tenant].id, o->kind = j->kind, o->state = j->state;
    o->priority = j->priority, o->replicas = j->nplaces;
    for (int k = 0; k < j->nplaces; k++) o->gpus += j->places[k].gpus;
    if (j->pool != NONE && j->kind == SCHED_GANG) {
        o->gpu_type = s->name[s->pools[j->pool].type];
        o->speed = sched__job_speed(s, j, s->pools[j->pool].type);
    }
    o->submit_s = j->submit, o->first_start_s = j->first_start, o->start_s = j->start;
    o->end_s = j->end, o->wait_s = j->wait_acc;
    o->expected_end_s = j->state == SCHED_RUNNING ? sched__est_end(s, j) : -1;
    o->restarts = j->restarts, o->preemptions = j->preemptions, o->backfilled = j->backfilled;
    o->cost = sched__job_cost(s, j, NONE, now);
    o->cost_open = sched__open_cost(s, j, NONE, now, 0);
    o->reason = j->reason;
    o->est_start_s = -1;
    if (j->state == SCHED_QUEUED || j->state == SCHED_HOLDING) sched__pending((sched *)s, ix, now, o, est);
    return 0;
}

int sched_job_info_ix(const sched *s, uint32_t ix, double now, sched_job_info *o)
{
    return info_ix(s, ix, now, o, 1);
}

int sched_job_reason_ix(const sched *s, uint32_t ix, double now, sched_job_info *o)
{
    return info_ix(s, ix, now, o, 0);
}

int sched_job_info_get(const sched *s, const char *id, double now, sched_job_info *out)
{
    uint32_t ji = NONE;
    SH_TRY(sched__find_job(s, id, &ji));
    return sched_job_info_ix(s, ji, now, out);
}

size_t sched_job_alloc(const sched *s, const char *id, sched_place *out, size_t cap)
{
    uint32_t ji = sched__map_get(&s->job_map, id);
    if (ji == NONE) return 0;
    const sjob *j = &s->jobs[ji];
    for (int k = 0; k < j->nplaces && (size_t)k < cap; k++)
        out[k] = (sched_place){s->nodes[j->places[k].node].id, j->places[k].node, j->places[k].gpus,
                               j->places[k].gmask, j->places[k].since};
    return (size_t)j->nplaces;
}

void sched_stats_get(const sched *s, sched_stats *o)
{
    *o = s->st;
    o->nodes_up = s->nodes_up, o->gpus_up = s->gpus_up, o->gpus_busy = s->gpus_busy;
    o->queued = s->queued, o->running = s->running;
    o->resv_late = s->resv_late;
}

int sched_node_info_get(const sched *s, const char *id, sched_node_info *out)
{
    uint32_t ni = NONE;
    SH_TRY(sched__find_node(s, id, &ni));
    const snode *n = &s->nodes[ni];
    const spool *p = &s->pools[n->pool];
    *out = (sched_node_info){n->id, s->name[p->zone], s->name[p->fabric], s->name[p->type],
                             n->state, n->gpus, n->state == SCHED_NODE_UP ? n->free : 0,
                             n->price_s * 3600.0};
    return 0;
}
