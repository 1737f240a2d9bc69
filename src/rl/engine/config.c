/* Runtime configuration: defaults, checks, the worker list. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/common.h"
#include "shoal/rl.h"

/* Three GPU types standing in for a mixed fleet: speed relative to the
 * fastest, and an on-demand price per hour. */
static const rl_worker_spec default_workers[] = {
    {"h100", 1.0, 2.50},
    {"a100", 0.5, 1.30},
    {"l4", 0.25, 0.45},
};

void rl_config_default(rl_config *c)
{
    memset(c, 0, sizeof *c);
    c->task = RL_TASK_CODE;
    c->mode = RL_MODE_ASYNC;
    c->max_lag = 2;
    c->dtype = RL_DTYPE_BF16;
    c->steps = 60;
    c->seed = 1;
    c->loss = rl_loss_defaults(RL_LOSS_DECOUPLED);
    c->sampling = (rl_sampling){.temperature = 1.0f, .top_p = 1.0f, .max_new = 8};
    c->prompts_per_step = 8;
    c->group = 8;
    c->minibatches = 2;
    c->lr = 1e-3f;
    c->warm_steps = 70;
    c->eval_every = 10;
    c->eval_n = 64;
    c->nworkers = 3;
    memcpy(c->workers, default_workers, sizeof default_workers);
    c->respawn = 1;
    c->gen_cost = 24.0;
    c->train_cost = 1.0;
    c->target_reward = 0.8;
    c->model = nn_config_default(rl_vocab());
    c->fp8_block = 128;
}

int rl_workers_parse(const char *s, rl_config *c)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        if (n >= RL_MAX_WORKERS)
            return sh_err(SH_EINVAL, "--workers: more than %d workers", RL_MAX_WORKERS);
        rl_worker_spec *w = &c->workers[n];
        char name[16];
        int used = 0;
        if (sscanf(p, "%15[^:,]:%lf:%lf%n", name, &w->speed, &w->price, &used) != 3)
            return sh_err(SH_EINVAL,
                          "--workers \"%s\": worker %d is not name:speed:price (e.g. h100:1:2.5)",
                          s, n + 1);
        snprintf(w->name, sizeof w->name, "%s", name);
        n++;
        p += used;
        if (*p == ',') p++;
        else if (*p) return sh_err(SH_EINVAL, "--workers \"%s\": expected ',' after worker %d", s, n);
    }
    if (!n) return sh_err(SH_EINVAL, "--workers: empty list");
    c->nworkers = n;
    return 0;
}

int rl_config_check(const rl_config *c)
{
    SH_TRY(nn_config_check(&c->model));
    if (c->model.vocab != rl_vocab())
        return sh_err(SH_EINVAL, "model vocab %d must be the task alphabet's %d", c->model.vocab,
                      rl_vocab());
    if (c->model.ctx > RL_MAX_T || c->model.ctx < 12 + c->sampling.max_new)
        return sh_err(SH_EINVAL, "--ctx %d must hold a prompt of 12 plus %d new tokens and be at most %d",
                      c->model.ctx, c->sampling.max_new, RL_MAX_T);
    if (c->steps < 1 || c->steps > 1000000) return sh_err(SH_EINVAL, "--steps %d: must be 1..1000000", c->steps);
    if (c->mode == RL_MODE_ASYNC && (c->max_lag < 0 || c->max_lag > 64))
        return sh_err(SH_EINVAL, "--max-lag %d: must be 0..64", c->max_lag);
    if (c->ordered && c->mode != RL_MODE_ASYNC)
        return sh_err(SH_EINVAL, "--ordered is for --mode async (a sync run already trains each "
                                 "step on its own groups in order); drop one of them");
    if (c->nworkers < 1 || c->nworkers > RL_MAX_WORKERS)
        return sh_err(SH_EINVAL, "--workers: %d workers, must be 1..%d", c->nworkers, RL_MAX_WORKERS);
    for (int i = 0; i < c->nworkers; i++)
        if (!(c->workers[i].speed > 0 && c->workers[i].speed <= 1) || c->workers[i].price < 0)
            return sh_err(SH_EINVAL, "--workers: worker %s: speed %g must be in (0,1], price %g >= 0",
                          c->workers[i].name, c->workers[i].speed, c->workers[i].price);
    if (!(c->gen_cost >= 1 && c->gen_cost <= 100))
        return sh_err(SH_EINVAL, "--gen-cost %g: must be in [1,100]", c->gen_cost);
    if (!(c->train_cost >= 1 && c->train_cost <= 100))
        return sh_err(SH_EINVAL, "--train-cost %g: must be in [1,100]", c->train_cost);
    if (c->group < 2 || c->group > 64)
        return sh_err(SH_EINVAL, "--group %d: GRPO needs 2..64 samples per prompt", c->group);
    if (c->prompts_per_step < 1 || c->prompts_per_step * c->group > 4096)
        return sh_err(SH_EINVAL, "--prompts %d: must be >= 1 with at most 4096 trajectories a step",
                      c->prompts_per_step);
    if (c->minibatches < 1 || c->minibatches > c->prompts_per_step * c->group)
        return sh_err(SH_EINVAL, "--minibatches %d: must be 1..%d", c->minibatches,
                      c->prompts_per_step * c->group);
    if (c->req_prompts < 0 || c->req_prompts > c->prompts_per_step)
        return sh_err(SH_EINVAL, "--request-prompts %d: must be 0 (auto) ..%d", c->req_prompts,
                      c->prompts_per_step);
    if (!(c->lr > 0 && c->lr < 1)) return sh_err(SH_EINVAL, "--lr %g: must be in (0,1)", c->lr);
    if (!(c->sampling.temperature > 0 && c->sampling.temperature <= 10))
        return sh_err(SH_EINVAL, "--temperature %g: must be in (0,10]", c->sampling.temperature);
    if (!(c->sampling.top_p > 0 && c->sampling.top_p <= 1))
        return sh_err(SH_EINVAL, "--top-p %g: must be in (0,1]", c->sampling.top_p);
    if (c->sampling.max_new < 2) return sh_err(SH_EINVAL, "--max-new %d: must be >= 2", c->sampling.max_new);
    const rl_loss_cfg *l = &c->loss;
    if (!(l->clip > 0 && l->clip < 1)) return sh_err(SH_EINVAL, "--clip %g: must be in (0,1)", l->clip);
    if (!(l->tis_cap >= 1)) return sh_err(SH_EINVAL, "--tis-cap %g: must be >= 1", l->tis_cap);
    if (!(l->mis_lo > 0 && l->mis_lo < 1 && l->mis_hi > 1))
        return sh_err(SH_EINVAL, "--mis-band %g,%g: need 0 < lo < 1 < hi", l->mis_lo, l->mis_hi);
    if (l->dec_cap < 0) return sh_err(SH_EINVAL, "--decoupled-cap %g: must be >= 0", l->dec_cap);
    if (c->warm_steps < 0 || c->eval_every < 1 || c->eval_n < 1 || c->eval_n > 1024)
        return sh_err(SH_EINVAL, "--warm %d / --eval-every %d / --eval-n %d out of range",
                      c->warm_steps, c->eval_every, c->eval_n);
    if (c->target_window < 0 || c->target_window > RL_TARGET_WINDOW_MAX)
        return sh_err(SH_EINVAL, "target window %d: must be 0..%d evaluations", c->target_window,
                      RL_TARGET_WINDOW_MAX);
    if (!(c->target_gain >= 0 && c->target_gain < 1))
        return sh_err(SH_EINVAL, "--target-gain %g: must be in [0,1)", c->target_gain);
    if (!(c->train_s >= 0) || c->fp8_block < 0 || c->fp8_block > 65536)
        return sh_err(SH_EINVAL, "emulated training step %g s must be >= 0 and the FP8 block %d "
                                 "0..65536", c->train_s, c->fp8_block);
    if (c->step_s < 0 || c->seq_cost < 0)
        return sh_err(SH_EINVAL, "emulated step %g s and sequence cost %g must be >= 0", c->step_s, c->seq_cost);
    return 0;
}

static const char *const dtype_names[] = {"fp32", "bf16", "fp8"};

int rl_dtype_parse(const char *name, int *dtype)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, dtype_names[i])) return *dtype = i, 0;
    return sh_err(SH_EINVAL, "rollout dtype \"%s\": expected fp32, bf16 or fp8", name);
}

const char *rl_dtype_name(int dtype) { return dtype >= 0 && dtype < 3 ? dtype_names[dtype] : "?"; }
