/* The RL sweep: paced runs (rl_paced_run) over staleness bound x loss x
 * rollout dtype x seed, several processes at a time, and the figures that
 * compare them (docs/rl.md, "The sweep").
 *
 * Every run is a child process (sh_fanout) that computes one paced run and
 * sends its JSON result back, so that runs do not share allocator or BLAS
 * state and a crash costs one run.  Paced runs keep no
 * clock: what the machine's load changes is how long the sweep takes, not
 * any figure in it.
 *
 * Figures, per cell (mode, lag, loss, dtype), over seeds: the final
 * held-out reward (mean of the last k evaluations: equal steps for every
 * cell), its standard error, and the paired difference to the sync cell of
 * the same loss and dtype (same seed, so the same warm start and problems)
 * with the count of seeds where the cell is below; for FP8 the same against
 * bf16; the emulated time to a fixed target reward and the speed-up over
 * sync at that reward, with the count of seeds where both reach it; the
 * realised staleness histogram; and the precision mismatch |log pi_old -
 * log mu| of the first step. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rl/engine/runtime_int.h"

void rl_sweep_default(rl_sweep_cfg *s, int quick)
{
    memset(s, 0, sizeof *s);
    rl_config *c = &s->base;
    rl_config_default(c);
    /* Slower than rl train's 1e-3: at 1e-3 a step moves the policy so far
     * that eight versions apart nothing holds, corrected or not. */
    c->lr = 3e-4f;
    c->step_s = 0.01, c->seq_cost = 0.1, c->train_s = 0.6;
    /* FP8 as serving stacks run it: every matrix, embeddings and head
     * included, and the activations (W8A8). */
    c->fp8_embed = 1, c->fp8_act = 1;
    c->target_window = 2;
    c->target_gain = 0.05;
    c->eval_every = 5;
    static const int lags[] = {0, 1, 2, 4, 8, 16}, qlags[] = {0, 2, 8};
    static const int losses[] = {RL_LOSS_PG, RL_LOSS_NAIVE, RL_LOSS_PPO, RL_LOSS_TIS, RL_LOSS_MIS,
                                 RL_LOSS_DECOUPLED};
    static const int qlosses[] = {RL_LOSS_PG, RL_LOSS_NAIVE, RL_LOSS_TIS, RL_LOSS_DECOUPLED};
    if (quick) {
        memcpy(s->lags, qlags, sizeof qlags), s->nlags = 3;
        memcpy(s->losses, qlosses, sizeof qlosses), s->nlosses = 4;
        s->seeds = 3, c->steps = 40, c->eval_n = 32;
    } else {
        memcpy(s->lags, lags, sizeof lags), s->nlags = 6;
        memcpy(s->losses, losses, sizeof losses), s->nlosses = 6;
        s->seeds = 5, c->steps = 60, c->eval_n = 64;
    }
    s->dtypes[0] = RL_DTYPE_BF16, s->dtypes[1] = RL_DTYPE_FP8, s->ndtypes = 2;
    /* FP8 where its questions are: sync (the precision gap alone) and
     * eta = 8 (with staleness). */
    s->fp8_lags[0] = 0, s->fp8_lags[1] = 8, s->nfp8_lags = 2;
    s->seed0 = 1;
    s->last_k = 3;
    s->jobs = 2;
}

int rl_sweep_check(const rl_sweep_cfg *s)
{
    SH_TRY(rl_config_check(&s->base));
    if (s->seeds < 1 || s->seeds > 1000) return sh_err(SH_EINVAL, "--seeds %d: must be 1..1000", s->seeds);
    if (s->nlags < 1 || s->nlosses < 1 || s->ndtypes < 1)
        return sh_err(SH_EINVAL, "the sweep's grid is empty (--lags, --losses, --dtypes)");
    for (int i = 0; i < s->nlags; i++)
        if (s->lags[i] < 0 || s->lags[i] > 64)
            return sh_err(SH_EINVAL, "--lags: %d is not a staleness bound 0..64 (0: sync)", s->lags[i]);
    if (s->last_k < 1 || s->last_k > 100) return sh_err(SH_EINVAL, "--last-k %d: must be 1..100", s->last_k);
    if (s->last_k > s->base.steps / s->base.eval_every)
        return sh_err(SH_EINVAL, "--last-k %d: a run has only %d evaluations (--steps %d, "
                                 "--eval-every %d)", s->last_k, s->base.steps / s->base.eval_every,
                      s->base.steps, s->base.eval_every);
    int other = 0, sync = 0;
    for (int d = 0; d < s->ndtypes; d++) other |= s->dtypes[d] != RL_DTYPE_BF16;
    for (int i = 0; i < s->nfp8_lags; i++) sync |= !s->fp8_lags[i];
    for (int j = 0; j < s->nlags && s->nfp8_lags && other; j++) {
        if (!s->lags[j] && !sync)
            return sh_err(SH_EINVAL, "--fp8-lags must include 0: other dtypes' async cells compare "
                                     "with their sync cell");
    }
    if (s->jobs < 1 || s->jobs > 256) return sh_err(SH_EINVAL, "--jobs %d: must be 1..256", s->jobs);
    if (!s->dir) return sh_err(SH_EINVAL, "the sweep needs a folder for its runs");
    if (!(s->base.step_s > 0 && s->base.train_s > 0))
        return sh_err(SH_EINVAL, "--step-s %g and --train-s %g must be > 0", s->base.step_s, s->base.train_s);
    return 0;
}

/* Cell k's configuration (k = ((lag * nlosses) + loss) * ndtypes + dtype,
 * in the order of the lists), for seed index i. */
static void cell_config(const rl_sweep_cfg *s, int k, int i, rl_config *c)
{
    *c = s->base;
    int d = k % s->ndtypes, l = k / s->ndtypes % s->nlosses, g = k / s->ndtypes / s->nlosses;
    c->mode = s->lags[g] ? RL_MODE_ASYNC : RL_MODE_SYNC;
    c->max_lag = s->lags[g];
    c->loss = s->base.loss;
    c->loss.kind = s->losses[l];
    c->dtype = s->dtypes[d];
    c->seed = s->seed0 + (uint64_t)i;
    c->quiet = 1;
}

/* One sweep task in its child process (sh_fanout): a paced run, or
 * (k < 0) seed i's warm start only, whose result is an empty object. */
typedef struct sweep_tasks {
    const rl_sweep_cfg *s;
    int warm;
    const int *job; /* task -> job (cell k = job / seeds, seed i = job % seeds) */
    int done0, total; /* for the caller's progress */
    rl_sweep_progress progress;
    void *ctx;
} sweep_tasks;

static json_t *sweep_task(void *arg, int task, int fd, int *rc)
{
    const sweep_tasks *t = arg;
    const rl_sweep_cfg *s = t->s;
    int j = t->job[task], k = t->warm ? -1 : j / s->seeds, i = t->warm ? j : j % s->seeds;
    rl_config c;
    cell_config(s, k < 0 ? 0 : k, i, &c);
    json_t *res = NULL;
    if (k < 0) {
        nn_model *m = NULL;
        *rc = nn_new(&c.model, c.seed, &m);
        if (!*rc) *rc = rl__warm_start(&c, m);
        nn_free(m);
        if (!*rc) res = json_object();
    } else {
        *rc = rl_paced_run(&c, NULL, NULL, &res);
    }
    if (*rc) {
        sh_err_wrap(*rc, "rl sweep: %s %d seed %llu", k < 0 ? "warm start" : "cell", k,
                    (unsigned long long)(s->seed0 + i));
        json_decref(res);
        return NULL;
    }
    return res;
}

static void sweep_units(void *arg, uint64_t units)
{
    const sweep_tasks *t = arg;
    if (t->progress) t->progress(t->done0 + (int)units, t->total, t->ctx);
}

/* Whether cell k is left out: a dtype other than bf16 at a bound not in
 * fp8_lags (when given). */
static int skipped(const rl_sweep_cfg *s, int k)
{
    int d = k % s->ndtypes, g = k / s->ndtypes / s->nlosses;
    if (!s->nfp8_lags || s->dtypes[d] == RL_DTYPE_BF16) return 0;
    for (int i = 0; i < s->nfp8_lags; i++)
        if (s->fp8_lags[i] == s->lags[g]) return 0;
    return 1;
}

/* Runs jobs [0, n) (job j: cell j / seeds, seed j % seeds; warm: seed j's
 * warm start) that are not skipped, at most s->jobs at a time, each in a
 * child process (sh_fanout: runs share no allocator or BLAS state, and a
 * crash costs one run).  A failure stops new starts; the running ones
 * finish. */
static int run_jobs(const rl_sweep_cfg *s, int warm, int n, json_t *runs, int *done, int total,
                    rl_sweep_progress progress, void *ctx)
{
    int *job = calloc((size_t)n + 1, sizeof *job), m = 0;
    json_t **res = calloc((size_t)n + 1, sizeof *res);
    if (!job || !res) return free(job), free(res), sh_err(SH_ENOMEM, "rl sweep: out of memory");
    for (int j = 0; j < n; j++)
        if (warm || !skipped(s, j / s->seeds)) job[m++] = j;
    sweep_tasks t = {s, warm, job, *done, total, progress, ctx};
    int rc = m ? sh_fanout(m, s->jobs, 1, sweep_task, &t, sweep_units, &t, res) : 0;
    for (int q = 0; q < m; q++) {
        if (res[q] && !warm) json_array_set_new(runs, (size_t)job[q], res[q]);
        else json_decref(res[q]);
        *done += res[q] != NULL;
    }
    free(job), free(res);
    return rc;
}

/* ---- Figures ------------------------------------------------------------ */

/* The final held-out reward of a run: the mean of its last k evaluations. */
static double final_reward(json_t *res, int k)
{
    json_t *curve = json_object_get(res, "curve");
    size_t n = json_array_size(curve);
    double s = 0;
    int m = 0;
    for (size_t j = n > (size_t)k ? n - (size_t)k : 1; j < n; j++, m++)
        s += json_number_value(json_object_get(json_array_get(curve, j), "reward"));
    return m ? s / m : NAN;
}

typedef struct stat {
    double sum, sq;
    int n;
} stat;

static void add(stat *a, double v) { a->sum += v, a->sq += v * v, a->n++; }

/* {"mean", "se", "n"}: standard error = sample sd / sqrt(n) (0 for n < 2). */
static json_t *stat_json(const stat *a)
{
    double m = a->n ? a->sum / a->n : 0;
    double var = a->n > 1 ? fmax(0, (a->sq - a->n * m * m) / (a->n - 1)) : 0;
    return json_pack("{s:f,s:f,s:i}", "mean", m, "se", a->n > 1 ? sqrt(var / a->n) : 0.0, "n", a->n);
}

static json_t *cell_runs(json_t *runs, int k, int seeds)
{
    json_t *a = json_array();
    for (int i = 0; i < seeds; i++) json_array_append(a, json_array_get(runs, (size_t)(k * seeds + i)));
    return a;
}

/* The paired difference of a to b (same seeds) and the seeds where a < b. */
static json_t *paired(json_t *a, json_t *b, int k, int *below)
{
    stat d = {0};
    *below = 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        double x = final_reward(json_array_get(a, i), k) - final_reward(json_array_get(b, i), k);
        add(&d, x);
        *below += x < 0;
    }
    return stat_json(&d);
}

/* One row of figures for cell k. */
static json_t *cell_row(const rl_sweep_cfg *s, json_t *runs, int k)
{
    int d = k % s->ndtypes, l = k / s->ndtypes % s->nlosses, g = k / s->ndtypes / s->nlosses;
    int sync_k = (0 * s->nlosses + l) * s->ndtypes + d, bf16_k = -1;
    for (int g0 = 0; g0 < s->nlags; g0++)
        if (!s->lags[g0]) sync_k = (g0 * s->nlosses + l) * s->ndtypes + d;
    for (int d0 = 0; d0 < s->ndtypes; d0++)
        if (s->dtypes[d0] == RL_DTYPE_BF16) bf16_k = (g * s->nlosses + l) * s->ndtypes + d0;
    json_t *mine = cell_runs(runs, k, s->seeds), *sync = cell_runs(runs, sync_k, s->seeds);
    stat fin = {0}, ttt = {0}, sp = {0}, mis = {0}, misall = {0}, start = {0};
    long hist[66] = {0};
    int nh = 0, faster = 0, both = 0;
    for (int i = 0; i < s->seeds; i++) {
        json_t *r = json_array_get(mine, (size_t)i), *sr = json_array_get(sync, (size_t)i);
        add(&fin, final_reward(r, s->last_k));
        add(&start, json_number_value(json_object_get(r, "reward_start")));
        add(&mis, json_number_value(json_object_get(r, "abs_dlogp_first")));
        add(&misall, json_number_value(json_object_get(r, "abs_dlogp_mean")));
        double t = json_number_value(json_object_get(r, "time_to_target_s"));
        double ts = json_number_value(json_object_get(sr, "time_to_target_s"));
        if (t >= 0) add(&ttt, t);
        if (t > 0 && ts > 0) add(&sp, ts / t), both++, faster += ts > t;
        json_t *h = json_object_get(r, "staleness_hist"), *v;
        size_t j;
        json_array_foreach(h, j, v) if (j < 66) hist[j] += (long)json_integer_value(v), nh = (int)j + 1 > nh ? (int)j + 1 : nh;
    }
    json_t *hj = json_array();
    double hs = 0, hn = 0;
    for (int j = 0; j < nh; j++) json_array_append_new(hj, json_integer(hist[j])), hs += (double)j * hist[j], hn += hist[j];
    int below_sync = 0, below_bf16 = 0;
    json_t *row = json_pack("{s:s,s:i,s:s,s:s,s:o,s:o,s:o,s:o,s:i,s:o,s:i,s:i,s:o,s:f,s:o,s:o}",
                            "mode", s->lags[g] ? "async" : "sync", "max_lag", s->lags[g], "loss",
                            rl_loss_name(s->losses[l]), "rollout_dtype", rl_dtype_name(s->dtypes[d]),
                            "reward_start", stat_json(&start), "reward_final", stat_json(&fin),
                            "vs_sync", paired(mine, sync, s->last_k, &below_sync),
                            "time_to_target_s", stat_json(&ttt), "target_reached", ttt.n,
                            "speedup_vs_sync", stat_json(&sp), "speedup_seeds_both_reach", both,
                            "speedup_seeds_faster", faster, "staleness_hist", hj, "staleness_mean",
                            hn ? hs / hn : 0.0, "abs_dlogp_first", stat_json(&mis), "abs_dlogp_mean",
                            stat_json(&misall));
    json_object_set_new(row, "seeds_below_sync", json_integer(below_sync));
    if (bf16_k >= 0 && bf16_k != k) {
        json_t *bf = cell_runs(runs, bf16_k, s->seeds);
        json_object_set_new(row, "vs_bf16", paired(mine, bf, s->last_k, &below_bf16));
        json_object_set_new(row, "seeds_below_bf16", json_integer(below_bf16));
        json_decref(bf);
    }
    json_object_set_new(row, "runs", mine);
    json_decref(sync);
    return row;
}

int rl_sweep_run(const rl_sweep_cfg *s, rl_sweep_progress progress, void *ctx, json_t **out)
{
    SH_TRY(rl_sweep_check(s));
    char warm[4200];
    snprintf(warm, sizeof warm, "%s/warm", s->dir);
    SH_TRY(sh_mkdir_p(s->dir, 0755));
    rl_sweep_cfg sw = *s;
    if (!sw.base.warm_cache) sw.base.warm_cache = warm;
    int ncells = s->nlags * s->nlosses * s->ndtypes, n = ncells * s->seeds, done = 0, total = s->seeds;
    for (int k = 0; k < ncells; k++) total += skipped(s, k) ? 0 : s->seeds;
    json_t *runs = json_array();
    for (int j = 0; j < n; j++) json_array_append_new(runs, json_null());
    /* Each seed's warm start once, before the runs that load it. */
    int rc = run_jobs(&sw, 1, s->seeds, runs, &done, total, progress, ctx);
    if (!rc) rc = run_jobs(&sw, 0, n, runs, &done, total, progress, ctx);
    if (rc) return json_decref(runs), rc;
    json_t *rows = json_array();
    for (int k = 0; k < ncells; k++)
        if (!skipped(s, k)) json_array_append_new(rows, cell_row(s, runs, k));
    json_decref(runs);
    const rl_config *c = &s->base;
    json_t *lags = json_array(), *losses = json_array(), *dts = json_array();
    for (int i = 0; i < s->nlags; i++) json_array_append_new(lags, json_integer(s->lags[i]));
    for (int i = 0; i < s->nlosses; i++) json_array_append_new(losses, json_string(rl_loss_name(s->losses[i])));
    for (int i = 0; i < s->ndtypes; i++) json_array_append_new(dts, json_string(rl_dtype_name(s->dtypes[i])));
    *out = json_pack("{s:o,s:o,s:o,s:i,s:I,s:i,s:i,s:i,s:i,s:f,s:i,s:f,s:f,s:f,s:f,s:i,s:i,s:o}",
                     "lags", lags, "losses", losses, "dtypes", dts, "seeds", s->seeds, "seed0",
                     (json_int_t)s->seed0, "steps", c->steps, "eval_every", c->eval_every, "eval_n",
                     c->eval_n, "last_k", s->last_k, "target", c->target_reward, "target_window",
                     c->target_window > 0 ? c->target_window : 1, "lr", c->lr, "step_s", c->step_s,
                     "seq_cost", c->seq_cost, "train_s", c->train_s, "fp8_block", c->fp8_block,
                     "fp8_embed", c->fp8_embed, "rows", rows);
    json_object_set_new(*out, "target_gain", json_real(c->target_gain));
    json_object_set_new(*out, "fp8_act", json_integer(c->fp8_act));
    return 0;
}
