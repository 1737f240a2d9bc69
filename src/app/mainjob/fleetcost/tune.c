/* Per-type tuning of a rollout pool under the emulated GPU-time model
 * (src/rl/engine/emulate.c; docs/mainjob.md, "The cost experiment").
 *
 * A GPU type's throughput rises with the sequences it decodes at once, up
 * to what its memory holds, but a larger request also takes longer, and a
 * request that outlives the staleness bound is wasted.  mj_tune picks for
 * each worker the request size (whole prompts) with the highest throughput
 * whose worst-case latency, counted in versions of the pool, is no longer
 * than that of the stalest request of the untuned pool (the slowest GPU
 * type at the default size): the staleness the pool already lives with.
 * The version period depends on the pool's throughput, so it iterates to a
 * fixed point.  Pure. */
#include "fleetcost_int.h"

double mj_req_latency_s(const rl_config *c, const rl_worker_spec *w, int prompts)
{
    return c->sampling.max_new * rl_emu_step_s(c, w, prompts * c->group);
}

double mj_worker_rate(const rl_config *c, const rl_worker_spec *w, int prompts)
{
    double l = mj_req_latency_s(c, w, prompts);
    return l > 0 ? prompts * c->group / l : 0;
}

int mj_default_prompts(const rl_config *c)
{
    return c->req_prompts ? c->req_prompts : (c->prompts_per_step + 3) / 4;
}

double mj_pool_rate(const rl_config *c)
{
    double p = 0;
    for (int i = 0; i < c->nworkers; i++) {
        const rl_worker_spec *w = &c->workers[i];
        p += mj_worker_rate(c, w, w->req_prompts ? w->req_prompts : mj_default_prompts(c));
    }
    return p;
}

/* The best request size for w within a latency budget (1 if none fits). */
static int best_prompts(const rl_config *c, const rl_worker_spec *w, double budget)
{
    int best = 1;
    double rate = 0;
    for (int k = 1; k <= c->prompts_per_step; k++) {
        double r = mj_worker_rate(c, w, k);
        if (mj_req_latency_s(c, w, k) <= budget && r > rate) best = k, rate = r;
    }
    return best;
}

/* Seconds of one version period: a step's trajectories at the pool's rate. */
static double version_s(const rl_config *c)
{
    return c->prompts_per_step * c->group / mj_pool_rate(c);
}

double mj_stalest(const rl_config *c)
{
    double worst = 0;
    for (int i = 0; i < c->nworkers; i++) {
        const rl_worker_spec *w = &c->workers[i];
        double l = mj_req_latency_s(c, w, w->req_prompts ? w->req_prompts : mj_default_prompts(c));
        if (l > worst) worst = l;
    }
    return worst / version_s(c);
}

int mj_tune(rl_config *c)
{
    if (!(c->step_s > 0)) return sh_err(SH_EINVAL, "mj_tune: the pool needs emulated GPU time (step_s > 0)");
    double versions = mj_stalest(c);
    for (int it = 0; it < 32; it++) {
        double budget = versions * version_s(c) * (1 + 1e-9);
        int changed = 0;
        for (int i = 0; i < c->nworkers; i++) {
            int k = best_prompts(c, &c->workers[i], budget);
            changed |= k != c->workers[i].req_prompts;
            c->workers[i].req_prompts = k;
        }
        if (!changed) break;
    }
    return 0;
}
