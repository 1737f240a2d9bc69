/* shoal rl sweep: runs `shoal rl train` over modes (sync, async with several
 * staleness bounds) x losses x rollout dtypes x seeds, each run in its own
 * process so that runs do not share caches or allocator state, and writes
 * a markdown table, the same as JSON, and an SVG plot of held-out reward
 * against wall-clock time. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_rl.h"

static const char sweep_usage[] =
    "usage: shoal rl sweep [--quick] [--seeds N] [--steps N] [--async-steps N] [--target R]\n"
    "                      [--out DIR] [--json]\n"
    "Runs shoal rl train for sync and async (max lag 1, 2, 4, 8) x loss (ppo, tis, mis,\n"
    "decoupled) x rollout dtype (bf16, fp8), each for N seeds (3), and writes\n"
    "DIR/sweep.md, DIR/sweep.json and DIR/sweep.svg (DIR: rl-sweep).\n"
    "  --quick        sync, async lag 1 and 4 x the four losses in bf16, plus fp8 for\n"
    "                 sync and lag 4 with ppo and decoupled; one seed\n"
    "  --steps N      RL steps per run (60)\n"
    "  --async-steps N  RL steps per async run (--steps): staleness costs progress per\n"
    "                 step, so async may need more steps to reach the sync run's reward\n"
    "  --target R     held-out reward whose wall-clock time is reported (0.7)\n"
    "  --json         print the table as one JSON object instead of markdown\n"
    "Any other option is passed to every shoal rl train run (see its --help).\n";

typedef struct cfg {
    int async, lag, loss;
    const char *dtype;
    json_t *runs; /* results of each seed */
} cfg;

static double mean_sd(json_t *runs, const char *key, double *sd, int *count, int skip_neg)
{
    double s = 0, q = 0;
    int n = 0;
    size_t i;
    json_t *r;
    json_array_foreach(runs, i, r) {
        double v = json_number_value(json_object_get(r, key));
        if (skip_neg && v < 0) continue;
        s += v, q += v * v, n++;
    }
    *count = n;
    double m = n ? s / n : NAN;
    *sd = n > 1 ? sqrt(fmax(0, (q - n * m * m) / (n - 1))) : 0;
    return m;
}

/* Wall-clock time at which a run's held-out curve first reaches `level`,
 * interpolated between evaluations; -1 if it never does. */
static double reach_time(json_t *run, double level)
{
    json_t *curve = json_object_get(run, "curve"), *pt;
    double pt_t = 0, pr = 0;
    size_t i;
    json_array_foreach(curve, i, pt) {
        double t = json_number_value(json_object_get(pt, "wall_s"));
        double r = json_number_value(json_object_get(pt, "reward"));
        if (r >= level) return i ? pt_t + (t - pt_t) * (level - pr) / (r - pr) : t;
        pt_t = t, pr = r;
    }
    return -1;
}

static void cfg_name(const cfg *c, char *out, size_t cap)
{
    if (c->async) snprintf(out, cap, "async lag %d, %s, %s", c->lag, rl_loss_name(c->loss), c->dtype);
    else snprintf(out, cap, "sync, %s, %s", rl_loss_name(c->loss), c->dtype);
}

/* One run: a child shoal process; its JSON result appended to c->runs. */
static int run_one(cfg *c, int seed, int steps, double target, const char *extra)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "/proc/%d/exe rl train --mode %s --max-lag %d --loss %s --rollout-dtype %s "
             "--steps %d --seed %d --target %g --quiet --json%s",
             (int)getpid(), c->async ? "async" : "sync", c->lag, rl_loss_name(c->loss), c->dtype,
             steps, seed, target, extra);
    FILE *p = popen(cmd, "r");
    if (!p) return sh_err_errno(errno, "rl sweep: cannot run %s", cmd);
    sh_buf out = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) sh_buf_append(&out, chunk, n);
    int st = pclose(p);
    json_t *j = NULL;
    int rc = st == 0 && out.len ? sh_json_parse((char *)out.data, out.len, "rl train output", &j)
                                : sh_err(SH_EIO, "rl sweep: `%s` failed (status %d)", cmd, st);
    sh_buf_free(&out);
    if (rc) return rc;
    json_object_del(j, "step_stats"); /* keep the sweep file readable */
    json_array_append_new(c->runs, j);
    return 0;
}

/* ref: the sync configuration with the same loss and dtype (may be c). */
static json_t *row_json(const cfg *c, const cfg *ref)
{
    double sd1, sd2, sd3, sd4;
    int n1, n2, n3, n4;
    double r = mean_sd(c->runs, "reward_end", &sd1, &n1, 0);
    double t = mean_sd(c->runs, "time_to_target_s", &sd2, &n2, 1);
    double w = mean_sd(c->runs, "wall_s", &sd3, &n3, 0);
    double tp = mean_sd(c->runs, "tokens_per_s", &sd4, &n4, 0);
    /* Speed-up: the sync run's mean wall-clock time over the time this
     * configuration takes to reach the sync run's mean final reward. */
    double sdr, sdw, level = mean_sd(ref->runs, "reward_end", &sdr, &n3, 0);
    double ref_wall = mean_sd(ref->runs, "wall_s", &sdw, &n3, 0), tr = 0;
    int nr = 0;
    size_t i;
    json_t *run;
    json_array_foreach(c->runs, i, run) {
        double tt = reach_time(run, level - 1e-9);
        if (tt >= 0) tr += tt, nr++;
    }
    double speedup = nr == (int)json_array_size(c->runs) && tr > 0 ? ref_wall / (tr / nr) : -1;
    char name[96];
    cfg_name(c, name, sizeof name);
    return json_pack("{s:f,s:f,s:s,s:s,s:i,s:s,s:s,s:f,s:f,s:f,s:f,s:i,s:i,s:f,s:f,s:O}",
                     "sync_reward_ref", level, "speedup_vs_sync", speedup, "config", name,
                     "mode", c->async ? "async" : "sync", "max_lag", c->lag, "loss",
                     rl_loss_name(c->loss), "rollout_dtype", c->dtype, "reward_end_mean", r,
                     "reward_end_sd", sd1, "time_to_target_mean_s", n2 ? t : -1.0,
                     "time_to_target_sd_s", sd2, "reached", n2, "seeds", n1, "wall_mean_s", w,
                     "tokens_per_s", tp, "runs", c->runs);
}

static void write_md(sh_buf *md, json_t *rows, double target, const char *cmdline)
{
    sh_buf_printf(md, "Produced by `%s`.\n\n", cmdline);
    sh_buf_printf(md, "| config | held-out reward (end) | time to %.2f (s) | reached | wall (s) | "
                      "tokens/s | speed-up vs sync |\n|---|---|---|---|---|---|---|\n", target);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        double t = json_number_value(json_object_get(r, "time_to_target_mean_s"));
        char tt[48] = "not reached";
        if (t >= 0)
            snprintf(tt, sizeof tt, "%.1f ± %.1f", t,
                     json_number_value(json_object_get(r, "time_to_target_sd_s")));
        double sp = json_number_value(json_object_get(r, "speedup_vs_sync"));
        char sps[32] = "not reached";
        if (sp > 0) snprintf(sps, sizeof sps, "%.2fx", sp);
        sh_buf_printf(md, "| %s | %.3f ± %.3f | %s | %d/%d | %.1f | %.0f | %s |\n",
                      json_string_value(json_object_get(r, "config")),
                      json_number_value(json_object_get(r, "reward_end_mean")),
                      json_number_value(json_object_get(r, "reward_end_sd")), tt,
                      (int)json_integer_value(json_object_get(r, "reached")),
                      (int)json_integer_value(json_object_get(r, "seeds")),
                      json_number_value(json_object_get(r, "wall_mean_s")),
                      json_number_value(json_object_get(r, "tokens_per_s")), sps);
    }
    sh_buf_printf(md, "\nSpeed-up vs sync: the sync run's (same loss and dtype) mean wall-clock "
                      "time divided by the time this configuration takes to first reach the sync "
                      "run's mean final held-out reward.\n");
}

/* Reward against wall-clock time, one polyline per run, one colour per
 * configuration; sync runs dashed. */
static void write_svg(sh_buf *s, json_t *rows, double target)
{
    static const char *pal[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                                "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    double tmax = 1;
    size_t i, k;
    json_t *r, *run, *pt;
    json_array_foreach(rows, i, r) json_array_foreach(json_object_get(r, "runs"), k, run) {
        json_t *curve = json_object_get(run, "curve");
        double t = json_number_value(json_object_get(json_array_get(curve, json_array_size(curve) - 1), "wall_s"));
        if (t > tmax) tmax = t;
    }
    const double W = 720, H = 420, L = 60, R = 250, T = 20, B = 50, pw = W - L - R, ph = H - T - B;
    sh_buf_printf(s, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                     "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    for (int g = 0; g <= 5; g++) {
        double y = T + ph - ph * g / 5.0, x = L + pw * g / 5.0;
        sh_buf_printf(s, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                         "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n",
                      L, y, L + pw, y, L - 5, y + 4, g / 5.0);
        sh_buf_printf(s, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n", x,
                      T + ph + 15, tmax * g / 5.0);
    }
    double ty = T + ph - ph * target;
    sh_buf_printf(s, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#000\" stroke-dasharray=\"2,3\"/>\n", L, ty, L + pw, ty);
    sh_buf_printf(s, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">wall-clock seconds of RL "
                     "(evaluations excluded)</text>\n<text x=\"15\" y=\"%.0f\" transform=\"rotate(-90 15 %.0f)\" "
                     "text-anchor=\"middle\">held-out reward</text>\n",
                  L + pw / 2, H - 12, T + ph / 2, T + ph / 2);
    json_array_foreach(rows, i, r) {
        const char *col = pal[i % 10];
        int dash = !strcmp(json_string_value(json_object_get(r, "mode")), "sync");
        json_array_foreach(json_object_get(r, "runs"), k, run) {
            sh_buf_printf(s, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", col,
                          dash ? " stroke-dasharray=\"6,3\"" : "");
            size_t q;
            json_array_foreach(json_object_get(run, "curve"), q, pt)
                sh_buf_printf(s, "%.1f,%.1f ", L + pw * json_number_value(json_object_get(pt, "wall_s")) / tmax,
                              T + ph - ph * json_number_value(json_object_get(pt, "reward")));
            sh_buf_printf(s, "\"/>\n");
        }
        double ly = T + 10 + 16 * i;
        sh_buf_printf(s, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/>"
                         "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                      W - R + 10, ly, W - R + 35, ly, col, dash ? " stroke-dasharray=\"6,3\"" : "",
                      W - R + 40, ly + 4, json_string_value(json_object_get(r, "config")));
    }
    sh_buf_printf(s, "</svg>\n");
}

int cli_rl_sweep(int argc, char **argv)
{
    int quick = 0, seeds = 3, steps = 60, async_steps = 0, json = 0;
    double target = 0.7;
    const char *out = "rl-sweep";
    char extra[2048] = "";
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) return fputs(sweep_usage, stdout), 0;
        else if (!strcmp(o, "--quick")) quick = 1;
        else if (!strcmp(o, "--json")) json = 1;
        else if (!v) return cli_usage("rl sweep", "%s needs a value or is unknown", o);
        else if (!strcmp(o, "--seeds") || !strcmp(o, "--steps") || !strcmp(o, "--async-steps")) {
            if (sh_parse_i64(v, &n, o) < 0 || n < 1 || n > 100000)
                return cli_usage("rl sweep", "%s \"%s\": expected a count >= 1", o, v);
            *(!strcmp(o, "--seeds") ? &seeds : !strcmp(o, "--steps") ? &steps : &async_steps) = (int)n;
            i++;
        } else if (!strcmp(o, "--target")) {
            if (sh_parse_double(v, &target, o) < 0 || !(target > 0 && target <= 1))
                return cli_usage("rl sweep", "--target \"%s\": expected a reward in (0,1]", v);
            i++;
        } else if (!strcmp(o, "--out")) out = v, i++;
        else if (!strncmp(o, "--", 2) && strlen(extra) + strlen(o) + strlen(v) + 8 < sizeof extra) {
            if (strpbrk(v, "'\"\\$`;|&<> ") || strpbrk(o, "'\"\\$`;|&<> "))
                return cli_usage("rl sweep", "option %s %s: only plain values can be passed on", o, v);
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " %s %s", o, v), i++;
        } else return cli_usage("rl sweep", "unexpected argument \"%s\"", o);
    }
    if (quick && seeds == 3) seeds = 1;
    if (!async_steps) async_steps = steps;
    /* Check the passed-on options once, before any work starts. */
    {
        rl_config c;
        rl_config_default(&c);
        char buf[2048], *args[128];
        int na = 0, js = 0;
        snprintf(buf, sizeof buf, "%s", extra);
        for (char *t = strtok(buf, " "); t && na < 128; t = strtok(NULL, " ")) args[na++] = t;
        int rc = cli_rl_parse("rl sweep", na, args, &c, &js);
        if (rc) return rc;
    }
    static const int lags_full[] = {0, 1, 2, 4, 8}, lags_quick[] = {0, 1, 4};
    const int *lags = quick ? lags_quick : lags_full;
    int nlags = quick ? 3 : 5, ndt = quick ? 1 : 2;
    static const char *dts[] = {"bf16", "fp8"};
    cfg cf[64];
    int ncf = 0;
    for (int d = 0; d < ndt; d++)
        for (int l = 0; l < nlags; l++)
            for (int k = RL_LOSS_PPO; k <= RL_LOSS_DECOUPLED; k++)
                cf[ncf++] = (cfg){.async = lags[l] > 0, .lag = lags[l] > 0 ? lags[l] : 2,
                                  .loss = k, .dtype = dts[d], .runs = json_array()};
    /* The quick sweep adds FP8 rollouts for sync and lag 4, PPO and decoupled:
     * the corners where precision mismatch should matter most and least. */
    for (int l = 0; quick && l < 2; l++)
        for (int k = RL_LOSS_PPO; k <= RL_LOSS_DECOUPLED; k += RL_LOSS_DECOUPLED - RL_LOSS_PPO)
            cf[ncf++] = (cfg){.async = l, .lag = l ? 4 : 2, .loss = k, .dtype = "fp8",
                              .runs = json_array()};
    if (sh_mkdir_p(out, 0755) < 0) return cli_fail("rl sweep", SH_EIO);
    sh_progress bar;
    sh_progress_start(&bar, "rl sweep", (uint64_t)ncf * seeds, "runs");
    json_t *rows = json_array();
    int rc = 0;
    for (int i = 0; i < ncf && !rc; i++) {
        char name[96];
        cfg_name(&cf[i], name, sizeof name);
        for (int s = 1; s <= seeds && !rc; s++) {
            rc = run_one(&cf[i], s, cf[i].async ? async_steps : steps, target, extra);
            sh_progress_update(&bar, (uint64_t)i * seeds + s);
        }
        if (!rc) {
            double sd;
            int n;
            fprintf(stderr, "rl sweep: %-32s held-out reward %.3f, wall %.1f s\n", name,
                    mean_sd(cf[i].runs, "reward_end", &sd, &n, 0), mean_sd(cf[i].runs, "wall_s", &sd, &n, 0));
        }
    }
    /* Rows once every run is in: each compares with its sync counterpart. */
    for (int i = 0; i < ncf && !rc; i++) {
        if (!cf[i].runs) continue;
        const cfg *ref = &cf[i];
        for (int k = 0; k < ncf; k++)
            if (cf[k].runs && !cf[k].async && cf[k].loss == cf[i].loss && !strcmp(cf[k].dtype, cf[i].dtype))
                ref = &cf[k];
        json_array_append_new(rows, row_json(&cf[i], ref));
    }
    for (int i = 0; i < ncf; i++) json_decref(cf[i].runs);
    sh_progress_finish(&bar);
    if (rc) {
        json_decref(rows);
        return cli_fail("rl sweep", rc);
    }
    char cmdline[2600];
    char as[48] = "";
    if (async_steps != steps) snprintf(as, sizeof as, " --async-steps %d", async_steps);
    snprintf(cmdline, sizeof cmdline, "shoal rl sweep%s --seeds %d --steps %d%s --target %g%s",
             quick ? " --quick" : "", seeds, steps, as, target, extra);
    json_t *res = json_pack("{s:s,s:f,s:i,s:i,s:O}", "command", cmdline, "target", target,
                            "seeds", seeds, "steps", steps, "rows", rows);
    sh_buf md = {0}, svg = {0};
    write_md(&md, rows, target, cmdline);
    write_svg(&svg, rows, target);
    char p1[4096], p2[4096], p3[4096];
    snprintf(p1, sizeof p1, "%s/sweep.md", out);
    snprintf(p2, sizeof p2, "%s/sweep.json", out);
    snprintf(p3, sizeof p3, "%s/sweep.svg", out);
    rc = sh_write_atomic(p1, md.data, md.len);
    if (!rc) rc = sh_json_write_atomic(p2, res);
    if (!rc) rc = sh_write_atomic(p3, svg.data, svg.len);
    if (!rc && json) sh_json_print(res);
    else if (!rc) printf("%s\nwrote %s, %s, %s\n", (char *)md.data, p1, p2, p3);
    sh_buf_free(&md), sh_buf_free(&svg);
    json_decref(res), json_decref(rows);
    return rc ? cli_fail("rl sweep", rc) : 0;
}
