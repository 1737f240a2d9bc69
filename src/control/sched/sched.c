/* sched_new and sched_free: the scheduler made of its layers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "query_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

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
        if (sched__check_name("quota zone", q->zone) || sched__check_name("quota fabric", q->fabric) ||
            sched__check_name("quota GPU type", q->gpu_type) || q->gpus < 1 || q->gpus > MAXG ||
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
