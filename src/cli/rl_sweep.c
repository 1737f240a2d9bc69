/* shoal rl sweep: parses the grid, runs it (src/rl/engine/sweep.c: paced runs,
 * forked a few at a time) and writes DIR/sweep.md, DIR/sweep.json and
 * DIR/sweep.svg (final reward against the staleness bound). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_int.h"
#include "cli_rl_int.h"
#include "app/mainjob/report/report_int.h"

static const char sweep_usage[] =
    "usage: shoal rl sweep [--quick] [--seeds N] [--seed S] [--steps N] [--lags L,..]\n"
    "                      [--losses L,..] [--dtypes D,..] [--target R] [--last-k K]\n"
    "                      [--jobs N] [--out DIR] [--json] [rl train options]\n"
    "Paced RL runs (emulated time: staleness depends on the bound, not on the machine)\n"
    "over staleness bound x loss x rollout dtype x seed; writes DIR/sweep.md, .json and\n"
    ".svg (DIR: rl-sweep).  Every run of a seed starts from one warm start (DIR/warm).\n"
    "  --quick         lags 0,2,8 x losses pg,naive,tis,decoupled x bf16 (fp8 at 0,8), 3 seeds,\n"
    "                  40 steps, 32 held-out problems (full: lags 0,1,2,4,8,16, all six\n"
    "                  losses, 5 seeds, 60 steps, 64 problems)\n"
    "  --seeds N       seeds per cell; --seed S: the first (1), the others S+1, S+2, ...\n"
    "  --lags L,..     staleness bounds, 0 for sync\n"
    "  --losses L,..   of pg, naive, ppo, tis, mis, decoupled\n"
    "  --dtypes D,..   of fp32, bf16, fp8\n"
    "  --fp8-lags L,.. dtypes other than bf16 only at these bounds (0,8)\n"
    "  --steps N --eval-every N --eval-n N   RL steps (equal for every cell), evaluations\n"
    "  --last-k K      final reward: the mean of the last K evaluations (3)\n"
    "  --target-gain G the target reward of a run is its start + G (0.05): seeds' warm\n"
    "                  starts differ by more than RL gains; sync and async of a seed share it\n"
    "  --target R      a fixed target reward instead; the mean of the last 2 evaluations\n"
    "                  must reach it, and its emulated time is reported\n"
    "  --step-s S --seq-cost F --train-s S   emulated decoding step (0.01 s), cost of one\n"
    "                  more sequence in a step (0.1), training step (0.6 s)\n"
    "  --fp8-block N   FP8 scaling block (128; 0: per tensor)\n"
    "  --fp8-embed 0|1 quantise embeddings and output head too (1)\n"
    "  --fp8-act 0|1   FP8 activations too (W8A8, one scale per 128 values of a row) (1)\n"
    "  --jobs N        runs at once (one per core)\n"
    "  --json          print the result as one JSON object instead of markdown\n"
    "  --render FILE   write DIR/sweep.md and .svg again from a sweep.json, run nothing\n"
    "Other rl train options (--lr, --workers, --prompts, --clip, ...) apply to every run;\n"
    "the sweep's learning rate is 3e-4.\n";

typedef struct opts {
    rl_sweep_cfg s;
    int quick, json;
    const char *out, *render;
    char cmdline[2048];
} opts;

/* Parses a comma-separated list with parse_one into out[]; names the option. */
static int parse_list(const char *opt, const char *v, int *out, int *n, int cap,
                      int (*parse_one)(const char *, int *))
{
    char buf[256];
    *n = 0;
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= cap) return sh_err(SH_EINVAL, "%s \"%s\": more than %d entries", opt, v, cap);
        if (parse_one(t, &out[(*n)++]) < 0) return sh_err_wrap(SH_EINVAL, "%s", opt);
    }
    if (!*n) return sh_err(SH_EINVAL, "%s: empty list", opt);
    return 0;
}

static int parse_lag(const char *s, int *out)
{
    int64_t v;
    if (sh_parse_i64(s, &v, "staleness bound") < 0 || v < 0 || v > 64)
        return sh_err(SH_EINVAL, "\"%s\" is not a staleness bound 0..64 (0: sync)", s);
    *out = (int)v;
    return 0;
}

/* Options the grid sets per cell, with what to use instead. */
static const char *const owned[][2] = {
    {"--mode", "--lags (0 is sync)"},          {"--max-lag", "--lags"},
    {"--loss", "--losses"},                    {"--rollout-dtype", "--dtypes"},
    {"--ordered", "nothing: paced runs are not ordered"},
    {"--stop-after-reward", "nothing: every cell runs --steps steps, so rewards compare at equal steps"},
    {"--train-cost", "--train-s (paced runs emulate the trainer's time)"},
    {"--gen-cost", "--step-s and --seq-cost (paced runs emulate the workers' time)"},
    {"--async-steps", "nothing: sync and async run the same --steps"},
};

static int sweep_option(opts *o, const char *k, const char *v, int *used)
{
    int64_t n;
    double d;
    rl_sweep_cfg *s = &o->s;
    *used = 1;
    if (!strcmp(k, "--seeds") || !strcmp(k, "--jobs") || !strcmp(k, "--last-k") ||
        !strcmp(k, "--fp8-block") || !strcmp(k, "--fp8-embed") || !strcmp(k, "--fp8-act")) {
        if (sh_parse_i64(v, &n, k) < 0 || n < 0 || n > 65536)
            return sh_err(SH_EINVAL, "%s \"%s\": expected a count", k, v);
        *(!strcmp(k, "--seeds") ? &s->seeds : !strcmp(k, "--jobs") ? &s->jobs
          : !strcmp(k, "--last-k") ? &s->last_k : !strcmp(k, "--fp8-block") ? &s->base.fp8_block
          : !strcmp(k, "--fp8-act") ? &s->base.fp8_act : &s->base.fp8_embed) = (int)n;
        if ((!strcmp(k, "--fp8-embed") || !strcmp(k, "--fp8-act")) && n > 1)
            return sh_err(SH_EINVAL, "%s %s: expected 0 or 1", k, v);
        return 0;
    }
    if (!strcmp(k, "--seed")) {
        if (sh_parse_i64(v, &n, k) < 0 || n < 0)
            return sh_err(SH_EINVAL, "--seed \"%s\": expected the first seed, >= 0 (the sweep "
                                     "runs seeds S, S+1, ... --seeds of them)", v);
        s->seed0 = (uint64_t)n;
        return 0;
    }
    if (!strcmp(k, "--step-s") || !strcmp(k, "--seq-cost") || !strcmp(k, "--train-s")) {
        if (sh_parse_double(v, &d, k) < 0 || !(d >= 0 && d < 1e6))
            return sh_err(SH_EINVAL, "%s \"%s\": expected seconds >= 0", k, v);
        *(!strcmp(k, "--step-s") ? &s->base.step_s : !strcmp(k, "--seq-cost") ? &s->base.seq_cost
                                                                                : &s->base.train_s) = d;
        return 0;
    }
    if (!strcmp(k, "--target") || !strcmp(k, "--target-gain")) {
        if (sh_parse_double(v, &d, k) < 0 || !(d > 0 && d <= 1))
            return sh_err(SH_EINVAL, "%s \"%s\": expected a reward in (0,1]", k, v);
        int gain = !strcmp(k, "--target-gain");
        s->base.target_reward = gain ? 0 : d;
        s->base.target_gain = gain ? d : 0;
        return 0;
    }
    if (!strcmp(k, "--lags")) return parse_list(k, v, s->lags, &s->nlags, 16, parse_lag);
    if (!strcmp(k, "--losses")) return parse_list(k, v, s->losses, &s->nlosses, RL_LOSS_COUNT, rl_loss_parse);
    if (!strcmp(k, "--fp8-lags")) return parse_list(k, v, s->fp8_lags, &s->nfp8_lags, 16, parse_lag);
    if (!strcmp(k, "--dtypes")) return parse_list(k, v, s->dtypes, &s->ndtypes, 3, rl_dtype_parse);
    if (!strcmp(k, "--out")) return o->out = v, 0;
    if (!strcmp(k, "--render")) return o->render = v, 0;
    *used = 0;
    return 0;
}

/* The sweep's own options (codes SWEEP_OPT + their index go to
 * sweep_option), beside rl train's (cli_rl_opts). */
enum { SWEEP_OPT = 0x4000 };
#define SW(name, i) {name, required_argument, 0, SWEEP_OPT + i}
static const struct option sweep_opts[] = {
    SW("seeds", 0),      SW("jobs", 1),      SW("last-k", 2),     SW("fp8-block", 3),  SW("fp8-embed", 4),
    SW("fp8-act", 5),    SW("seed", 6),      SW("step-s", 7),     SW("seq-cost", 8),   SW("train-s", 9),
    SW("target", 10),    SW("target-gain", 11), SW("lags", 12),   SW("losses", 13),    SW("fp8-lags", 14),
    SW("dtypes", 15),    SW("out", 16),      SW("render", 17),    {"async-steps", required_argument, 0, 'A'},
    {"quick", no_argument, 0, 'q'},          {"json", no_argument, 0, 'j'},           {0}};
#undef SW

/* Parses the options into o: -1, or the status to exit with. */
static int parse_args(int argc, char **argv, opts *o)
{
    snprintf(o->cmdline, sizeof o->cmdline, "shoal rl sweep");
    for (int i = 1; i < argc; i++) {
        size_t len = strlen(o->cmdline);
        snprintf(o->cmdline + len, sizeof o->cmdline - len, " %s", argv[i]);
    }
    /* --quick sets the defaults the other options change: a first pass finds it. */
    cli_args a = {"rl sweep", sweep_usage, sweep_opts, NULL, cli_rl_opts};
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;)
        if (k == CLI_OPT_EXIT) return a.rc;
        else o->quick |= k == 'q';
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    rl_sweep_default(&o->s, o->quick);
    o->s.jobs = cores > 0 ? (int)cores : 1;
    cli_args b = {"rl sweep", sweep_usage, sweep_opts, NULL, cli_rl_opts};
    for (int k, rc; (k = cli_getopt(&b, argc, argv)) != -1;) {
        const char *name = k == 'A' ? "async-steps" : k >= SWEEP_OPT ? sweep_opts[k - SWEEP_OPT].name
                                                                     : cli_rl_opt_name(k);
        char opt[40];
        snprintf(opt, sizeof opt, "--%s", name ? name : "");
        for (size_t j = 0; j < sizeof owned / sizeof owned[0]; j++)
            if (!strcmp(opt, owned[j][0]))
                return cli_usage(b.cmd, "%s: the sweep sets it for each cell; use %s", opt, owned[j][1]);
        int used = 0;
        if (k == 'j') o->json = 1;
        else if (k >= SWEEP_OPT && sweep_option(o, opt, optarg, &used) < 0) return cli_usage(b.cmd, "%s", sh_errmsg());
        else if (k < SWEEP_OPT && k != 'q' && (rc = cli_rl_opt(b.cmd, k, optarg, &o->s.base))) return rc;
    }
    int rc = cli_rl_check(b.cmd, &o->s.base);
    if (rc) return rc;
    o->s.dir = o->out;
    if (rl_sweep_check(&o->s) < 0) return cli_usage(b.cmd, "%s", sh_errmsg());
    return -1;
}

/* ---- Output ------------------------------------------------------------- */

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static double mean(const json_t *o, const char *k) { return num(json_object_get(o, k), "mean"); }
static double se(const json_t *o, const char *k) { return num(json_object_get(o, k), "se"); }
static int ival(const json_t *o, const char *k) { return (int)json_integer_value(json_object_get(o, k)); }
static const char *str(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

/* The row of (lag, loss, dtype); NULL if the grid lacks it. */
static json_t *find(json_t *rows, int lag, const char *loss, const char *dt)
{
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) if (ival(r, "max_lag") == lag && !strcmp(str(r, "loss"), loss) &&
                                       !strcmp(str(r, "rollout_dtype"), dt)) return r;
    return NULL;
}

static void lag_head(sh_buf *md, json_t *lags, const char *first)
{
    size_t i;
    json_t *l;
    sh_buf_printf(md, "| %s |", first);
    json_array_foreach(lags, i, l) {
        if (json_integer_value(l)) sh_buf_printf(md, " η = %lld |", (long long)json_integer_value(l));
        else sh_buf_printf(md, " sync |");
    }
    sh_buf_printf(md, "\n|---|");
    for (i = 0; i < json_array_size(lags); i++) sh_buf_printf(md, "---|");
    sh_buf_printf(md, "\n");
}

/* Final reward per loss x lag for one dtype; in brackets the seeds below
 * the reference (sync for bf16, bf16 for the others). */
static void reward_table(sh_buf *md, json_t *res, const char *dt, int seeds)
{
    json_t *lags = json_object_get(res, "lags"), *losses = json_object_get(res, "losses"), *l, *g;
    size_t i, j;
    int bf = !strcmp(dt, "bf16");
    lag_head(md, lags, "loss");
    json_array_foreach(losses, i, l) {
        sh_buf_printf(md, "| %s |", json_string_value(l));
        json_array_foreach(lags, j, g) {
            json_t *r = find(json_object_get(res, "rows"), (int)json_integer_value(g), json_string_value(l), dt);
            if (!r) { sh_buf_printf(md, " – |"); continue; }
            sh_buf_printf(md, " %.3f ± %.3f", mean(r, "reward_final"), se(r, "reward_final"));
            if (bf && json_integer_value(g))
                sh_buf_printf(md, "; Δ %+.3f ± %.3f (%d/%d below)", mean(r, "vs_sync"), se(r, "vs_sync"),
                              ival(r, "seeds_below_sync"), seeds);
            if (!bf && json_object_get(r, "seeds_below_bf16"))
                sh_buf_printf(md, "; Δ %+.3f ± %.3f (%d/%d below)", mean(r, "vs_bf16"), se(r, "vs_bf16"),
                              ival(r, "seeds_below_bf16"), seeds);
            sh_buf_printf(md, " |");
        }
        sh_buf_printf(md, "\n");
    }
}

static void speedup_table(sh_buf *md, json_t *res, int seeds)
{
    json_t *lags = json_object_get(res, "lags"), *losses = json_object_get(res, "losses"), *l, *g;
    size_t i, j;
    lag_head(md, lags, "loss");
    json_array_foreach(losses, i, l) {
        sh_buf_printf(md, "| %s |", json_string_value(l));
        json_array_foreach(lags, j, g) {
            json_t *r = find(json_object_get(res, "rows"), (int)json_integer_value(g), json_string_value(l), "bf16");
            if (!r) { sh_buf_printf(md, " – |"); continue; }
            if (!json_integer_value(g))
                sh_buf_printf(md, " %.1f s ± %.1f (%d/%d reach) |", mean(r, "time_to_target_s"),
                              se(r, "time_to_target_s"), ival(r, "target_reached"), seeds);
            else if (ival(r, "speedup_seeds_both_reach"))
                sh_buf_printf(md, " %.2fx ± %.2f (%d/%d) |", mean(r, "speedup_vs_sync"), se(r, "speedup_vs_sync"),
                              ival(r, "speedup_seeds_both_reach"), seeds);
            else sh_buf_printf(md, " not reached (%d/%d reach) |", ival(r, "target_reached"), seeds);
        }
        sh_buf_printf(md, "\n");
    }
}

/* The table of every cell: one row per mode, bound, loss and dtype. */
static void cells_table(sh_buf *md, json_t *rows, int seeds)
{
    json_t *r;
    size_t i, j;
    sh_buf_printf(md, "\n**Every cell**: Δ is the paired difference of final reward (in brackets, "
                      "seeds below); staleness = trainer version − the version that generated a "
                      "trajectory, over every trained trajectory of every seed (histogram 0, 1, ...); "
                      "|Δlogp| = mean |log π_old − log μ| of the first step (sync: the rollout dtype's "
                      "precision gap alone) and of all steps.\n\n"
                      "| mode | η | loss | dtype | final reward | Δ vs sync | Δ vs bf16 | time to target (s) "
                      "| staleness mean: histogram | \\|Δlogp\\| first / all |\n"
                      "|---|---|---|---|---|---|---|---|---|---|\n");
    json_array_foreach(rows, i, r) {
        char hist[256] = "", vb[64] = "–", tt[64] = "not reached";
        json_t *h;
        json_array_foreach(json_object_get(r, "staleness_hist"), j, h)
            snprintf(hist + strlen(hist), sizeof hist - strlen(hist), "%s%lld", j ? "/" : "",
                     (long long)json_integer_value(h));
        if (json_object_get(r, "vs_bf16"))
            snprintf(vb, sizeof vb, "%+.3f ± %.3f (%d)", mean(r, "vs_bf16"), se(r, "vs_bf16"), ival(r, "seeds_below_bf16"));
        if (ival(r, "target_reached"))
            snprintf(tt, sizeof tt, "%.1f ± %.1f (%d/%d)", mean(r, "time_to_target_s"), se(r, "time_to_target_s"),
                     ival(r, "target_reached"), seeds);
        sh_buf_printf(md, "| %s | %d | %s | %s | %.3f ± %.3f | %+.3f ± %.3f (%d) | %s | %s | %.2f: %s | %.4f / %.4f |\n",
                      str(r, "mode"), ival(r, "max_lag"), str(r, "loss"), str(r, "rollout_dtype"),
                      mean(r, "reward_final"), se(r, "reward_final"), mean(r, "vs_sync"), se(r, "vs_sync"),
                      ival(r, "seeds_below_sync"), vb, tt, num(r, "staleness_mean"), hist,
                      mean(r, "abs_dlogp_first"), mean(r, "abs_dlogp_mean"));
    }
}

static void write_md(sh_buf *md, json_t *res, const char *cmdline, double wall)
{
    int seeds = ival(res, "seeds");
    json_t *rows = json_object_get(res, "rows");
    size_t i;
    double load = json_number_value(json_array_get(json_object_get(res, "load_average_end"), 0));
    sh_buf_printf(md, "Produced by `%s` (%d paced runs in %.0f s, %d at a time; load average at the "
                      "end %.1f).  Seeds %lld..%lld; %d RL steps for every cell; final reward = "
                      "mean held-out reward of the last %d evaluations (every %d steps, %d problems "
                      "x 8 samples); learning rate %g; emulated decoding step %g s, +%g per extra "
                      "sequence, training step %g s; FP8: e4m3 weights, %s scaling, embeddings and head %s%s.\n\n",
                  cmdline, seeds * (int)json_array_size(rows), wall, ival(res, "jobs"), load,
                  (long long)json_integer_value(json_object_get(res, "seed0")),
                  (long long)json_integer_value(json_object_get(res, "seed0")) + seeds - 1,
                  ival(res, "steps"), ival(res, "last_k"), ival(res, "eval_every"), ival(res, "eval_n"),
                  num(res, "lr"), num(res, "step_s"), num(res, "seq_cost"), num(res, "train_s"),
                  ival(res, "fp8_block") ? "128 x 128 block" : "per-tensor",
                  ival(res, "fp8_embed") ? "quantised too" : "kept in bf16",
                  ival(res, "fp8_act") ? ", activations e4m3 per 1 x 128 tile (W8A8)" : "");
    json_t *dts = json_object_get(res, "dtypes"), *d;
    json_array_foreach(dts, i, d) {
        const char *dt = json_string_value(d);
        sh_buf_printf(md, "**Final held-out reward, %s rollouts** (mean ± standard error over %d seeds; "
                          "Δ: the paired difference to %s, seed by seed, ± its standard error, and the "
                          "seeds where the cell is below)\n\n", dt, seeds,
                      strcmp(dt, "bf16") ? "the bf16 cell of the same loss and bound" : "sync with the same loss");
        reward_table(md, res, dt, seeds);
        sh_buf_printf(md, "\n");
    }
    char tgt[64];
    if (num(res, "target_gain") > 0) snprintf(tgt, sizeof tgt, "start + %.2f", num(res, "target_gain"));
    else snprintf(tgt, sizeof tgt, "%.2f", num(res, "target"));
    sh_buf_printf(md, "**Emulated time to held-out reward %s** (mean of 2 evaluations), bf16: sync "
                      "in seconds, async as the speed-up over sync of the same loss and seed (mean ± "
                      "standard error over the seeds where both reach it, and how many do)\n\n",
                  tgt);
    speedup_table(md, res, seeds);
    cells_table(md, rows, seeds);
}

/* Final reward against the staleness bound, one line per loss (bf16
 * solid, others dashed), with standard-error bars (src/app/mainjob/plot.c). */
static void write_svg(sh_buf *s, json_t *res)
{
    static const char *pal[] = {"#000000", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"};
    json_t *lags = json_object_get(res, "lags"), *losses = json_object_get(res, "losses");
    json_t *dts = json_object_get(res, "dtypes"), *rows = json_object_get(res, "rows"), *l, *d, *r;
    size_t nl = json_array_size(lags), nlo = json_array_size(losses), nd = json_array_size(dts), i, j, k;
    double lo = 1, hi = 0;
    json_array_foreach(rows, i, r) {
        lo = fmin(lo, mean(r, "reward_final") - se(r, "reward_final"));
        hi = fmax(hi, mean(r, "reward_final") + se(r, "reward_final"));
    }
    lo = floor(lo * 10) / 10, hi = ceil(hi * 10) / 10;
    if (hi <= lo) hi = lo + 0.1;
    char (*labs)[32] = calloc(nl ? nl : 1, sizeof *labs);
    const char **cats = calloc(nl ? nl : 1, sizeof *cats);
    size_t nser = nlo * nd, npts = nser * nl;
    mj_series *ser = calloc(nser ? nser : 1, sizeof *ser);
    double *buf = calloc(3 * (npts ? npts : 1), sizeof *buf);
    if (!labs || !cats || !ser || !buf) goto out;
    json_array_foreach(lags, i, l) {
        if (json_integer_value(l)) snprintf(labs[i], sizeof labs[i], "η = %lld", (long long)json_integer_value(l));
        else snprintf(labs[i], sizeof labs[i], "sync");
        cats[i] = labs[i];
    }
    int ns = 0;
    json_array_foreach(dts, k, d) json_array_foreach(losses, j, l) {
        const char *dt = json_string_value(d), *ls = json_string_value(l);
        mj_series *q = &ser[ns];
        double *x = buf + 3 * nl * (size_t)ns, *y = x + nl, *e = y + nl;
        *q = (mj_series){k == 0 ? ls : NULL, pal[j % 6], x, y, 0, e, strcmp(dt, "bf16") != 0, 4.0 * (double)k};
        for (i = 0; i < nl; i++) {
            json_t *c = find(rows, (int)json_integer_value(json_array_get(lags, i)), ls, dt);
            if (!c) continue;
            x[q->n] = (double)i, y[q->n] = mean(c, "reward_final"), e[q->n++] = se(c, "reward_final");
        }
        ns++;
    }
    static const char *const notes[] = {"solid: bf16 rollouts", "dashed: fp8"};
    mj_axes a = {.title = "Final held-out reward against the staleness bound",
                 .xlabel = "staleness bound (paced: realised staleness follows it)",
                 .ylabel = "final held-out reward (± SE)", .ymin = lo, .ymax = hi, .xcats = cats,
                 .ncats = (int)nl, .width = 720, .height = 420, .notes = notes, .nnotes = 2, .standalone = 1};
    mj_plot(s, &a, ser, ns);
out:
    free(labs), free(cats), free(ser), free(buf);
}

/* rendered: res comes from an earlier sweep's JSON (--render), which keeps
 * its own command, time and load. */
static int write_outputs(const opts *o, json_t *res, double wall, int rendered)
{
    if (!rendered) {
        json_object_set_new(res, "command", json_string(o->cmdline));
        json_object_set_new(res, "jobs", json_integer(o->s.jobs));
        json_object_set_new(res, "sweep_wall_s", json_real(wall));
        double load[3] = {0, 0, 0};
        getloadavg(load, 3);
        json_object_set_new(res, "load_average_end", json_pack("[f,f,f]", load[0], load[1], load[2]));
    }
    sh_buf md = {0}, svg = {0};
    write_md(&md, res, str(res, "command"), num(res, "sweep_wall_s"));
    write_svg(&svg, res);
    char p1[4096], p2[4096], p3[4096];
    snprintf(p1, sizeof p1, "%s/sweep.md", o->out);
    snprintf(p2, sizeof p2, "%s/sweep.json", o->out);
    snprintf(p3, sizeof p3, "%s/sweep.svg", o->out);
    int rc = sh_mkdir_p(o->out, 0755);
    if (!rc) rc = sh_write_atomic(p1, md.data, md.len);
    if (!rc && !rendered) rc = sh_json_write_atomic(p2, res);
    if (!rc) rc = sh_write_atomic(p3, svg.data, svg.len);
    if (!rc && o->json) sh_json_print(res);
    else if (!rc) printf("%s\nwrote %s, %s%s%s\n", (char *)md.data, p1, rendered ? "" : p2, rendered ? "" : ", ", p3);
    sh_buf_free(&md), sh_buf_free(&svg);
    return rc;
}

typedef struct bar_ctx {
    sh_progress bar;
    int total;
} bar_ctx;

/* The bar on a terminal; otherwise (make bench, a log) a line every 10 %. */
static void on_progress(int done, int total, void *ctx)
{
    bar_ctx *b = ctx;
    if (total != b->total) b->bar.total = (uint64_t)total, b->total = total;
    sh_progress_update(&b->bar, (uint64_t)done);
}

int cli_rl_sweep(int argc, char **argv)
{
    opts o = {.out = "rl-sweep"};
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    if (o.render) {
        char *text = NULL;
        size_t len;
        json_t *res = NULL;
        rc = sh_read_file(o.render, 1 << 30, &text, &len);
        if (!rc) rc = sh_json_parse(text, len, o.render, &res);
        free(text);
        if (!rc && !json_is_array(json_object_get(res, "rows")))
            rc = sh_err(SH_EFORMAT, "%s: not a sweep.json (no \"rows\")", o.render);
        if (!rc) rc = write_outputs(&o, res, 0, 1);
        json_decref(res);
        return rc ? cli_fail("rl sweep", rc) : 0;
    }
    int total = o.s.seeds * (1 + o.s.nlags * o.s.nlosses * o.s.ndtypes);
    bar_ctx b = {.total = total};
    sh_progress_start(&b.bar, "rl sweep", (uint64_t)total, "runs");
    double t0 = sh_now_mono();
    json_t *res = NULL;
    rc = rl_sweep_run(&o.s, on_progress, &b, &res);
    sh_progress_finish(&b.bar);
    if (!rc) {
        fprintf(stderr, "rl sweep: %d runs in %.0f s, %d at a time\n", total, sh_now_mono() - t0, o.s.jobs);
        rc = write_outputs(&o, res, sh_now_mono() - t0, 0);
    }
    json_decref(res);
    return rc ? cli_fail("rl sweep", rc) : 0;
}
