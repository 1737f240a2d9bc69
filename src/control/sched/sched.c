/* sched_new and sched_free: the scheduler made of its layers. */
#include <stdlib.h>
#include <string.h>

#include "query_int.h"

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
    /* Each layer makes its own state, bottom first. */
    if (sched__ledger_new(s) || sched__place_new(s) || sched__room_new(s) || sched__cycle_new(s) ||
        sched__query_new(s)) {
        sched_free(s);
        return sh_err(SH_ENOMEM, "sched: out of memory"), NULL;
    }
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
    sched__query_free(s);
    sched__cycle_free(s);
    sched__room_free(s);
    sched__place_free(s);
    sched__ledger_free(s);
    sched__model_free(s);
}
