/* The supervised warm start: cross-entropy on generated demonstrations, so
 * that RL starts from a policy with a non-zero success rate.  Its result
 * depends only on the task, the model shape, the seed and the number of
 * steps; a sweep runs many RL configurations from the same start, so it
 * can be kept in a cache folder and loaded instead of trained again. */
#include <stdio.h>

#include "rl/engine/runtime_int.h"
#include "shoal/ckpt.h"

/* Bumped whenever the warm start's procedure changes, so that a cache made
 * by an older shoal is not mistaken for a current one. */
#define WARM_FORMAT 2

static int train(const rl_config *c, nn_model *m)
{
    nn_adamw opt;
    SH_TRY(nn_adamw_init(&opt, m, 3e-3f));
    rl_problem p[32];
    uint64_t rng = c->seed * 7919 + 17;
    int rc = 0;
    for (int s = 0; s < c->warm_steps && !rc; s++) {
        for (int i = 0; i < 32; i++) rl_problem_draw(c->task, 0, &rng, &p[i]);
        float loss;
        rc = rl_sft_step(m, &opt, p, 32, &loss);
    }
    nn_adamw_free(&opt);
    return rc;
}

static void cache_path(const rl_config *c, char *out, size_t cap)
{
    const nn_config *mc = &c->model;
    char key[256];
    int n = snprintf(key, sizeof key, "warm %d task %d V %d T %d C %d L %d H %d seed %llu steps %d",
                     WARM_FORMAT, c->task, mc->vocab, mc->ctx, mc->width, mc->layers, mc->heads,
                     (unsigned long long)c->seed, c->warm_steps);
    char hex[33];
    sh_hash128_hex(sh_hash128_of(key, (size_t)n), hex);
    snprintf(out, cap, "%s/warm-%s-s%llu.safetensors", c->warm_cache, hex,
             (unsigned long long)c->seed);
}

int rl__warm_start(const rl_config *c, nn_model *m)
{
    if (!c->warm_cache || !c->warm_steps) return train(c, m);
    char path[4096];
    cache_path(c, path, sizeof path);
    if (sh_path_exists(path)) return rl_load_checkpoint(m, path);
    SH_TRY(train(c, m));
    /* F32, so that loading gives back exactly these weights.  Two runs
     * that miss at once both write the same bytes; the rename is atomic. */
    sh_buf img = {0};
    int rc = sh_mkdir_p(c->warm_cache, 0755);
    if (!rc) rc = rl_policy_image(m, 0, &img);
    if (!rc) rc = sh_write_atomic(path, img.data, img.len);
    sh_buf_free(&img);
    return rc ? sh_err_wrap(rc, "warm-start cache %s", c->warm_cache) : 0;
}
