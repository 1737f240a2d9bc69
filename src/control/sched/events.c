/* Events between cycles: nodes join, leave, fail and recover; jobs are
 * submitted, cancelled, finished and forgotten. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cycle_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

static uint32_t tenant_of(sched *s, const char *name)
{
    uint32_t ti = sched__map_get(&s->tenant_map, name);
    if (ti != NONE) return ti;
    if (GROW(s->tenants, s->captenants, s->ntenants + 1) < 0) return NONE;
    stenant *t = &s->tenants[s->ntenants];
    memset(t, 0, sizeof *t);
    t->kc_job = NONE;
    if (sched__map_put(&s->tenant_map, name, (uint32_t)s->ntenants, &t->id) < 0) return NONE;
    return (uint32_t)s->ntenants++;
}

static int check_spec(sched *s, const sched_job_spec *js)
{
    if (!js->id || !*js->id || strlen(js->id) >= SCHED_ID_MAX)
        return sh_err(SH_EINVAL, "job id must be 1..%d bytes", SCHED_ID_MAX - 1);
    if ((unsigned)js->kind > SCHED_FUNCTION)
        return sh_err(SH_EINVAL, "job %s: unknown kind %d", js->id, (int)js->kind);
    if (js->kind != SCHED_FUNCTION) {
        if (js->nodes < 1 || js->nodes > SCHED__MAX_GANG)
            return sh_err(SH_EINVAL, "job %s: nodes %d is outside 1..%d", js->id, js->nodes,
                          SCHED__MAX_GANG);
        if (js->gpus_per_node < 1 || js->gpus_per_node > MAXG)
            return sh_err(SH_EINVAL, "job %s: gpus_per_node %d is outside 1..%d", js->id,
                          js->gpus_per_node, MAXG);
    }
    if (js->kind == SCHED_ELASTIC && (js->max_replicas < js->nodes || js->max_replicas > SCHED__MAX_GANG))
        return sh_err(SH_EINVAL, "job %s: max replicas %d must be >= min replicas %d", js->id,
                      js->max_replicas, js->nodes);
    if (js->n_types < 0 || js->n_types > SCHED_MAX_TYPES)
        return sh_err(SH_EINVAL, "job %s: %d GPU types (at most %d)", js->id, js->n_types,
                      SCHED_MAX_TYPES);
    if (!(js->est_s >= 0) || js->replace_wait_s < 0 || js->speed[0] < 0)
        return sh_err(SH_EINVAL, "job %s: estimate and waits must be >= 0", js->id);
    if (sched__map_get(&s->job_map, js->id) != NONE)
        return sh_err(SH_EEXIST, "job %s already exists", js->id);
    return 0;
}

/* Records the job as rejected and returns SH_ERANGE with `why`. */
static int reject(sched *s, uint32_t ji, const char *why)
{
    sjob *j = &s->jobs[ji];
    j->state = SCHED_REJECTED;
    j->reason = strdup(why);
    s->st.rejected++;
    return sh_err(SH_ERANGE, "job %s rejected: %s", j->id, why);
}

int sched_job_submit(sched *s, const sched_job_spec *js, double now)
{
    SH_TRY(check_spec(s, js));
    uint32_t ti = tenant_of(s, js->tenant && *js->tenant ? js->tenant : "default");
    if (ti == NONE) return SH_ENOMEM;
    /* A forgotten job's slot is reused first, so that the job table stays
     * as large as the most jobs known at once, not as all jobs ever. */
    int reuse = s->nfree > 0;
    uint32_t ji;
    if (reuse) ji = s->freejobs[s->nfree - 1];
    else {
        SH_TRY(GROW(s->jobs, s->capjobs, s->njobs + 1));
        ji = (uint32_t)s->njobs;
    }
    sjob *j = &s->jobs[ji];
    memset(j, 0, sizeof *j);
    SH_TRY(sched__map_put(&s->job_map, js->id, ji, &j->id));
    if (reuse) s->nfree--;
    else s->njobs++;
    j->tenant = ti, j->kind = js->kind;
    j->nodes = js->kind == SCHED_FUNCTION ? 1 : js->nodes;
    j->gpn = js->kind == SCHED_FUNCTION ? 1 : js->gpus_per_node;
    j->maxr = js->kind == SCHED_ELASTIC ? js->max_replicas : j->nodes;
    j->est_s = js->est_s > 0 ? js->est_s : s->cfg.default_est_s;
    j->priority = js->priority, j->on_fail = js->on_fail, j->replace_wait_s = js->replace_wait_s;
    j->submit = now, j->first_start = j->start = j->end = -1;
    if (now < s->last_submit) s->submit_unsorted = 1;
    s->last_submit = now;
    j->blocked_since = -1, j->resv_promise = -1, j->pool = NONE;
    j->order = ++s->seq;
    char why[256];
    /* Every type is kept, also one no node or quota has yet: an elastic job
     * grows onto it once its first node joins.  A job none of whose types
     * any node or quota has can never run. */
    int known = 0;
    for (int i = 0; i < js->n_types; i++) {
        if (!js->gpu_types[i]) continue;
        known += sched__intern(s, js->gpu_types[i], 0) != NONE;
        uint32_t t = sched__intern(s, js->gpu_types[i], 1);
        if (t == NONE) continue; /* out of memory naming it */
        j->types[j->ntypes] = t;
        j->speed[j->ntypes++] = js->speed[i] > 0 ? js->speed[i] : 1.0;
    }
    if (js->n_types && !known) {
        snprintf(why, sizeof why, "unknown GPU type%s \"%s\"%s (no node or quota has %s)",
                 js->n_types > 1 ? "s" : "", js->gpu_types[0] ? js->gpu_types[0] : "",
                 js->n_types > 1 ? ", ..." : "", js->n_types > 1 ? "them" : "it");
        return reject(s, ji, why);
    }
    if (sched__never_fits(s, j, why, sizeof why)) return reject(s, ji, why);
    struct { int kind, nodes, gpn, nt; uint32_t t[SCHED_MAX_TYPES]; } key;
    memset(&key, 0, sizeof key);
    key.kind = j->kind, key.nodes = j->nodes, key.gpn = j->gpn, key.nt = j->ntypes;
    memcpy(key.t, j->types, sizeof key.t);
    j->shape = sh_hash64_of(&key, sizeof key) | 1;
    if (j->kind == SCHED_ELASTIC) {
        SH_TRY(sched__grow((void **)&s->cyc->elastic, &s->cyc->capelastic, s->cyc->nelastic + 1, sizeof *s->cyc->elastic));
        s->cyc->elastic[s->cyc->nelastic++] = ji;
    }
    SH_TRY(sched__queue_push(s, ji, now));
    return 0;
}

static int stop_job(sched *s, const char *id, double now, sched_job_state to)
{
    uint32_t ji = NONE;
    SH_TRY(sched__find_job(s, id, &ji));
    sjob *j = &s->jobs[ji];
    if (j->state >= SCHED_DONE)
        return sh_err(SH_EINVAL, "job %s has already ended", id);
    if (j->state == SCHED_QUEUED) sched__queue_remove(s, ji);
    else if (j->state == SCHED_HOLDING) sched__queue_remove(s, ji), sched__release_all(s, ji, now);
    else sched__release_all(s, ji, now), s->running--;
    j->state = to;
    j->end = now;
    return 0;
}

int sched_job_cancel(sched *s, const char *id, double now) { return stop_job(s, id, now, SCHED_CANCELLED); }

int sched_job_finish(sched *s, const char *id, double now)
{
    uint32_t ji = NONE;
    SH_TRY(sched__find_job(s, id, &ji));
    if (s->jobs[ji].state != SCHED_RUNNING && s->jobs[ji].state != SCHED_REPLACING)
        return sh_err(SH_EINVAL, "job %s is not running, it cannot finish", id);
    return stop_job(s, id, now, SCHED_DONE);
}

/* ---- Forgetting ended jobs ------------------------------------------------ */

/* Drops every reference the cycle bookkeeping keeps to job ji: its pending
 * decisions (the caller forgot the job, so their news is moot), its entry
 * in the deadline and elastic lists, and the reservation records of the
 * last cycle (kept for sched_check, which skips a NONE job). */
static void drop_refs(sched *s, uint32_t ji)
{
    size_t w = 0;
    for (size_t i = 0; i < s->npend; i++) {
        if (s->pend[i].job == ji) free(s->pend[i].places);
        else s->pend[w++] = s->pend[i];
    }
    s->npend = w;
    w = 0;
    for (size_t i = 0; i < s->cyc->nwaiting; i++)
        if (s->cyc->waiting[i] != ji) s->cyc->waiting[w++] = s->cyc->waiting[i];
    s->cyc->nwaiting = w;
    if (s->jobs[ji].kind == SCHED_ELASTIC) {
        /* Order kept: the growth pass visits elastic jobs in submit order. */
        w = 0;
        for (size_t i = 0; i < s->cyc->nelastic; i++)
            if (s->cyc->elastic[i] != ji) s->cyc->elastic[w++] = s->cyc->elastic[i];
        s->cyc->nelastic = w;
    }
    for (size_t i = 0; i < s->room->nresv; i++)
        if (s->room->resv[i].job == ji) s->room->resv[i].job = NONE;
}

int sched_job_forget(sched *s, const char *id)
{
    uint32_t ji = NONE;
    SH_TRY(sched__find_job(s, id, &ji));
    sjob *j = &s->jobs[ji];
    if (j->state < SCHED_DONE)
        return sh_err(SH_EINVAL, "job %s has not ended: only a finished, cancelled or rejected job "
                      "can be forgotten (cancel it first)", id);
    SH_TRY(GROW(s->freejobs, s->capfree, s->nfree + 1));
    /* Its final bill stays in the totals for everyone; its tenant's totals
     * already hold it (sched__bill charges job and tenant together). */
    sched__ledger_forget(s, j);
    drop_refs(s, ji);
    free(j->places), free(j->cost_t), free(j->reason), free(j->jp);
    sched__map_del(&s->job_map, j->id); /* frees the id j->id points to */
    memset(j, 0, sizeof *j);
    j->id = NULL, j->state = SCHED_DONE, j->pool = NONE;
    s->freejobs[s->nfree++] = ji;
    s->st.forgotten++;
    return 0;
}

/* ---- Nodes ---------------------------------------------------------------- */

int sched_node_add(sched *s, const sched_node_spec *n, double now)
{
    SH_TRY(sched__check_name("node id", n->id));
    SH_TRY(sched__check_name("node zone", n->zone));
    SH_TRY(sched__check_name("node fabric", n->fabric));
    SH_TRY(sched__check_name("node GPU type", n->gpu_type));
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
    uint32_t pi = sched__pool_of(s, z, f, t); /* a new pool or price: elastic pool orders lapse */
    if (pi == NONE) return SH_ENOMEM;
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

int sched_node_remove(sched *s, const char *id, double now)
{
    uint32_t ni = NONE;
    SH_TRY(sched__find_node(s, id, &ni));
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
    SH_TRY(sched__find_node(s, id, &ni));
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
    SH_TRY(sched__find_node(s, id, &ni));
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

