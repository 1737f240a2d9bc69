/* shoal rl sweep: runs `shoal rl train` over modes (sync, async with several
 * staleness bounds) x losses x rollout dtypes x seeds, each run in its own
 * process so that runs do not share caches or allocator state, several at
 * a time, and writes a markdown table, the same as JSON, and an SVG plot
 * of held-out reward against wall-clock time.
 *
 * Running several at once is sound because a run's emulated GPUs sleep
 * most of the time (worker.c stretches each decoding step to gen_cost
 * times its CPU time, measured in CPU time so that other load does not
 * stretch it further); what the runs share is the CPU their trainers and
 * decoding use, which is why --jobs defaults to a few per core. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_rl.h"

static const char sweep_usage[] =
    "usage: shoal rl sweep [--quick] [--seeds N] [--steps N] [--async-steps N] [--target R]\n"
    "                      [--losses L,..] [--dtypes D,..]\n"
    "                      [--jobs N] [--out DIR] [--json] [rl train options]\n"
    "Runs shoal rl train for sync and async (max lag 1, 2, 4, 8) x loss (ppo, tis, mis,\n"
    "decoupled) x rollout dtype (bf16, fp8), each for N seeds (3), and writes\n"
    "DIR/sweep.md, DIR/sweep.json and DIR/sweep.svg (DIR: rl-sweep).  Every run of a\n"
    "seed starts from the same warm start, trained once and kept in DIR/warm.\n"
    "  --quick        the same grid with 2 seeds, 30 RL steps and a 32-problem\n"
    "                 held-out set evaluated every 5 steps; sync runs go first and\n"
    "                 each async run stops one evaluation after it reaches its sync\n"
    "                 partner's final reward (docs/rl.md)\n"
    "  --steps N      RL steps per sync run (60; quick 30)\n"
    "  --async-steps N  RL steps per async run (twice --steps)\n"
    "  --target R     held-out reward whose wall-clock time is reported (0.7)\n"
    "  --jobs N       runs at once (2 per core): each uses about 0.4 of a core\n"
    "  --losses L,..  --dtypes D,..  only these losses / rollout dtypes (a smaller grid)\n"
    "Every run gets --train-cost 3 (pass another to override) so that runs at once\n"
    "do not slow each other's trainers.\n"
    "  --json         print the table as one JSON object instead of markdown\n"
    "Any other option is passed to every shoal rl train run (see its --help).\n";

typedef struct cfg {
    int async, lag, loss;
    const char *dtype;
    json_t *runs; /* results by seed (null until the run is in) */
} cfg;

typedef struct sweep {
    int quick, seeds, steps, async_steps, json, jobs;
    double target;
    const char *out;
    const char *losses, *dtypes; /* comma-separated subsets of the grid (NULL: all) */
    char extra[2048];
} sweep;

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

static void run_paths(const sweep *sw, int ci, int seed, char *out, char *err, size_t cap)
{
    snprintf(out, cap, "%s/runs/%02d-s%d.json", sw->out, ci, seed);
    snprintf(err, cap, "%s/runs/%02d-s%d.log", sw->out, ci, seed);
}

/* Starts one run: a child shoal process (this executable) whose stdout and
 * stderr go to files, so that any number can run without their pipes
 * filling up.  No shell: the arguments are passed as they are. */
static int start_run(const sweep *sw, const cfg *c, int ci, int seed, double stop, pid_t *pid)
{
    char outp[4096], errp[4096], steps[16], lag[16], seed_s[16], target[32], warm[4096], xbuf[2048];
    char stop_s[40];
    run_paths(sw, ci, seed, outp, errp, sizeof outp);
    snprintf(steps, sizeof steps, "%d", c->async ? sw->async_steps : sw->steps);
    snprintf(lag, sizeof lag, "%d", c->lag);
    snprintf(seed_s, sizeof seed_s, "%d", seed);
    snprintf(target, sizeof target, "%g", sw->target);
    snprintf(warm, sizeof warm, "%s/warm", sw->out);
    char *argv[200] = {"shoal", "rl", "train", "--mode", c->async ? "async" : "sync",
                       "--max-lag", lag, "--loss", (char *)rl_loss_name(c->loss),
                       "--rollout-dtype", (char *)c->dtype, "--steps", steps, "--seed", seed_s,
                       "--target", target, "--warm-cache", warm, "--quiet", "--json"};
    int n = 21;
    /* The trainer is stretched like the workers, so that runs sharing the
     * machine do not slow each other's trainers (rl_config.train_cost). */
    argv[n++] = "--train-cost", argv[n++] = "3";
    if (sw->quick) argv[n++] = "--eval-n", argv[n++] = "32", argv[n++] = "--eval-every", argv[n++] = "5";
    if (stop > 0) { /* %.17g: the very level the speed-up is measured against */
        snprintf(stop_s, sizeof stop_s, "%.17g", stop);
        argv[n++] = "--stop-after-reward", argv[n++] = stop_s;
    }
    snprintf(xbuf, sizeof xbuf, "%s", sw->extra);
    for (char *t = strtok(xbuf, " "); t && n < 198; t = strtok(NULL, " ")) argv[n++] = t;
    argv[n] = NULL;
    fflush(stdout), fflush(stderr);
    pid_t p = fork();
    if (p < 0) return sh_err_errno(errno, "rl sweep: fork");
    if (p == 0) {
        int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0) _exit(126);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    *pid = p;
    return 0;
}

/* Takes a finished run's result into its configuration's row. */
static int finish_run(const sweep *sw, cfg *c, int ci, int seed, int status)
{
    char outp[4096], errp[4096], name[96];
    run_paths(sw, ci, seed, outp, errp, sizeof outp);
    cfg_name(c, name, sizeof name);
    char *text = NULL;
    size_t len = 0;
    json_t *j = NULL;
    int rc = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : SH_EIO;
    if (!rc) rc = sh_read_file(outp, 64 << 20, &text, &len);
    if (!rc) rc = sh_json_parse(text, len, outp, &j);
    free(text);
    if (rc)
        return sh_err(SH_EIO, "rl sweep: run \"%s\" seed %d failed (exit status %d); its output "
                              "is in %s and %s", name, seed, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                      outp, errp);
    json_object_del(j, "step_stats"); /* keep the sweep file readable */
    json_array_set_new(c->runs, (size_t)seed - 1, j);
    unlink(outp), unlink(errp);
    return 0;
}

typedef struct slot {
    pid_t pid;
    int ci, seed;
} slot;

/* The sync configuration with the same loss and dtype as c (c if none). */
static const cfg *sync_ref(const cfg *cf, int ncf, const cfg *c)
{
    for (int k = 0; k < ncf; k++)
        if (!cf[k].async && cf[k].loss == c->loss && !strcmp(cf[k].dtype, c->dtype)) return &cf[k];
    return c;
}

/* The order runs start in, as configuration * seeds + seed - 1: seed-major
 * so that each seed's warm start is made by its first runs; with --quick
 * every sync run first, so that each async run knows its sync partner's
 * final reward when it starts. */
static int *run_order(const sweep *sw, const cfg *cf, int ncf)
{
    int *o = malloc(sizeof *o * (size_t)(ncf * sw->seeds)), n = 0;
    if (!o) return NULL;
    for (int pass = sw->quick ? 0 : 1; pass < 2; pass++)
        for (int s = 0; s < sw->seeds; s++)
            for (int c = 0; c < ncf; c++)
                if (!sw->quick || cf[c].async == pass) o[n++] = c * sw->seeds + s;
    return o;
}

/* With --quick an async run stops one evaluation after it reaches its sync
 * partner's final held-out reward (rl train --stop-after-reward): the rest
 * of its steps cannot change its speed-up.  Returns 0 for no stop, and
 * -1 while the partner is still running. */
static double stop_level(const sweep *sw, const cfg *cf, int ncf, int ci, int seed)
{
    if (!sw->quick || !cf[ci].async) return 0;
    json_t *sr = json_array_get(sync_ref(cf, ncf, &cf[ci])->runs, (size_t)seed - 1);
    return json_is_object(sr) ? json_number_value(json_object_get(sr, "reward_end")) : -1;
}

/* Runs every (configuration, seed), sw->jobs at a time, in run_order.  A
 * failure stops new runs; those already running finish. */
static int run_all(const sweep *sw, cfg *cf, int ncf)
{
    int total = ncf * sw->seeds, next = 0, running = 0, done = 0, rc = 0;
    slot *sl = calloc((size_t)sw->jobs, sizeof *sl);
    int *order = run_order(sw, cf, ncf);
    if (!sl || !order) return free(sl), free(order), sh_err(SH_ENOMEM, "rl sweep: out of memory");
    sh_progress bar;
    sh_progress_start(&bar, "rl sweep", (uint64_t)total, "runs");
    while (running || (next < total && !rc)) {
        for (int k = 0; k < sw->jobs && next < total && !rc; k++) {
            if (sl[k].pid) continue;
            int ci = order[next] / sw->seeds, seed = order[next] % sw->seeds + 1;
            double stop = stop_level(sw, cf, ncf, ci, seed);
            if (stop < 0) break; /* wait for the sync partner */
            sl[k].ci = ci, sl[k].seed = seed;
            rc = start_run(sw, &cf[ci], ci, seed, stop, &sl[k].pid);
            if (!rc) running++, next++;
        }
        if (!running) break;
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0 && errno == EINTR) continue;
        if (p < 0) {
            rc = sh_err_errno(errno, "rl sweep: waitpid");
            break;
        }
        for (int k = 0; k < sw->jobs; k++) {
            if (sl[k].pid != p) continue;
            sl[k].pid = 0, running--, done++;
            int r = finish_run(sw, &cf[sl[k].ci], sl[k].ci, sl[k].seed, st);
            if (r && !rc) rc = r;
        }
        sh_progress_update(&bar, (uint64_t)done);
    }
    sh_progress_finish(&bar);
    free(sl), free(order);
    return rc;
}

/* Per seed, paired with the sync run of the same seed (same warm start):
 * the sync run's wall-clock time over the time this configuration's run
 * takes to reach the sync run's final held-out reward.  Seeds that never
 * reach it are counted apart. */
static json_t *speedups(const cfg *c, const cfg *ref, double *mean, double *sd, int *reached)
{
    json_t *a = json_array();
    double s = 0, q = 0;
    int n = 0;
    for (size_t i = 0; i < json_array_size(c->runs); i++) {
        json_t *sr = json_array_get(ref->runs, i);
        double level = json_number_value(json_object_get(sr, "reward_end"));
        double t = reach_time(json_array_get(c->runs, i), level - 1e-9);
        double sp = t > 0 ? json_number_value(json_object_get(sr, "wall_s")) / t : -1;
        json_array_append_new(a, json_real(sp));
        if (sp > 0) s += sp, q += sp * sp, n++;
    }
    *reached = n;
    *mean = n ? s / n : -1;
    *sd = n > 1 ? sqrt(fmax(0, (q - n * *mean * *mean) / (n - 1))) : 0;
    return a;
}

/* ref: the sync configuration with the same loss and dtype (may be c). */
static json_t *row_json(const cfg *c, const cfg *ref)
{
    double sd1, sd2, sd3, sd4, sps, spm;
    int n1, n2, n3, n4, nsp;
    double r = mean_sd(c->runs, "reward_end", &sd1, &n1, 0);
    double t = mean_sd(c->runs, "time_to_target_s", &sd2, &n2, 1);
    double w = mean_sd(c->runs, "wall_s", &sd3, &n3, 0);
    double tp = mean_sd(c->runs, "tokens_per_s", &sd4, &n4, 0);
    double sdr, level = mean_sd(ref->runs, "reward_end", &sdr, &n3, 0);
    json_t *sp = speedups(c, ref, &spm, &sps, &nsp);
    char name[96];
    cfg_name(c, name, sizeof name);
    return json_pack("{s:f,s:f,s:f,s:i,s:o,s:s,s:s,s:i,s:s,s:s,s:f,s:f,s:f,s:f,s:i,s:i,s:f,s:f,s:f,s:O}",
                     "sync_reward_ref", level, "speedup_vs_sync", spm, "speedup_sd", sps,
                     "speedup_reached", nsp, "speedup_by_seed", sp, "config", name,
                     "mode", c->async ? "async" : "sync", "max_lag", c->lag, "loss",
                     rl_loss_name(c->loss), "rollout_dtype", c->dtype, "reward_end_mean", r,
                     "reward_end_sd", sd1, "time_to_target_mean_s", n2 ? t : -1.0,
                     "time_to_target_sd_s", sd2, "reached", n2, "seeds", n1, "wall_mean_s", w,
                     "wall_sd_s", sd3, "tokens_per_s", tp, "runs", c->runs);
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

static void write_md(sh_buf *md, json_t *rows, double target, const char *cmdline)
{
    sh_buf_printf(md, "Produced by `%s`.\n\n", cmdline);
    sh_buf_printf(md, "| config | held-out reward (end) | time to %.2f (s) | reached | wall (s) | "
                      "tokens/s | speed-up vs sync |\n|---|---|---|---|---|---|---|\n", target);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        int seeds = (int)json_integer_value(json_object_get(r, "seeds"));
        char tt[48] = "not reached", sps[48] = "not reached";
        if (num(r, "time_to_target_mean_s") >= 0)
            snprintf(tt, sizeof tt, "%.1f ± %.1f", num(r, "time_to_target_mean_s"),
                     num(r, "time_to_target_sd_s"));
        int nsp = (int)json_integer_value(json_object_get(r, "speedup_reached"));
        if (nsp == seeds)
            snprintf(sps, sizeof sps, "%.2fx ± %.2f", num(r, "speedup_vs_sync"), num(r, "speedup_sd"));
        else if (nsp) /* the mean is over the seeds that reach, which flatters it */
            snprintf(sps, sizeof sps, "%.2fx (%d/%d seeds reach)", num(r, "speedup_vs_sync"), nsp, seeds);
        sh_buf_printf(md, "| %s | %.3f ± %.3f | %s | %d/%d | %.1f ± %.1f | %.0f | %s |\n",
                      json_string_value(json_object_get(r, "config")), num(r, "reward_end_mean"),
                      num(r, "reward_end_sd"), tt,
                      (int)json_integer_value(json_object_get(r, "reached")), seeds,
                      num(r, "wall_mean_s"), num(r, "wall_sd_s"), num(r, "tokens_per_s"), sps);
    }
    sh_buf_printf(md, "\nMean ± standard deviation over seeds.  Speed-up vs sync, per seed: the "
                      "wall-clock time of the sync run with the same loss, dtype and seed (so the "
                      "same warm start) divided by the time this configuration's run takes to first "
                      "reach that sync run's final held-out reward.\n");
}

/* Reward against wall-clock time, one polyline per run: colour by mode
 * (sync, then each staleness bound), dashed for FP8 rollouts. */
static void write_svg(sh_buf *s, json_t *rows, double target)
{
    static const int lags[] = {0, 1, 2, 4, 8};
    static const char *pal[] = {"#000000", "#1f77b4", "#2ca02c", "#d62728", "#9467bd"};
    double tmax = 1;
    size_t i, k;
    json_t *r, *run, *pt;
    json_array_foreach(rows, i, r) json_array_foreach(json_object_get(r, "runs"), k, run) {
        json_t *curve = json_object_get(run, "curve");
        double t = num(json_array_get(curve, json_array_size(curve) - 1), "wall_s");
        if (t > tmax) tmax = t;
    }
    const double W = 760, H = 440, L = 60, R = 170, T = 20, B = 50, pw = W - L - R, ph = H - T - B;
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
                     "(evaluations included)</text>\n<text x=\"15\" y=\"%.0f\" transform=\"rotate(-90 15 %.0f)\" "
                     "text-anchor=\"middle\">held-out reward</text>\n",
                  L + pw / 2, H - 12, T + ph / 2, T + ph / 2);
    json_array_foreach(rows, i, r) {
        int m = 0, lag = strcmp(json_string_value(json_object_get(r, "mode")), "async")
                             ? 0 : (int)json_integer_value(json_object_get(r, "max_lag"));
        while (m < 4 && lags[m] != lag) m++;
        int fp8 = !strcmp(json_string_value(json_object_get(r, "rollout_dtype")), "fp8");
        json_array_foreach(json_object_get(r, "runs"), k, run) {
            sh_buf_printf(s, "<polyline fill=\"none\" stroke=\"%s\" stroke-opacity=\"0.55\" stroke-width=\"1.2\"%s points=\"",
                          pal[m], fp8 ? " stroke-dasharray=\"5,3\"" : "");
            size_t q;
            json_array_foreach(json_object_get(run, "curve"), q, pt)
                sh_buf_printf(s, "%.1f,%.1f ", L + pw * num(pt, "wall_s") / tmax, T + ph - ph * num(pt, "reward"));
            sh_buf_printf(s, "\"/>\n");
        }
    }
    static const char *names[] = {"sync", "async lag 1", "async lag 2", "async lag 4", "async lag 8",
                                  "bf16 rollouts", "fp8 rollouts"};
    for (int g = 0; g < 7; g++) {
        double ly = T + 10 + 18 * g;
        sh_buf_printf(s, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/>"
                         "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                      W - R + 10, ly, W - R + 35, ly, g < 5 ? pal[g] : "#777",
                      g == 6 ? " stroke-dasharray=\"5,3\"" : "", W - R + 40, ly + 4, names[g]);
    }
    sh_buf_printf(s, "<text x=\"%.0f\" y=\"%.0f\">one line per run (loss x seed)</text>\n", W - R + 10, T + 10 + 18 * 7.5);
    sh_buf_printf(s, "</svg>\n");
}

static int parse_args(int argc, char **argv, sweep *sw)
{
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) return fputs(sweep_usage, stdout), 1;
        else if (!strcmp(o, "--quick")) sw->quick = 1;
        else if (!strcmp(o, "--json")) sw->json = 1;
        else if (!v) return cli_usage("rl sweep", "%s needs a value or is unknown", o);
        else if (!strcmp(o, "--seeds") || !strcmp(o, "--steps") || !strcmp(o, "--async-steps") ||
                 !strcmp(o, "--jobs")) {
            if (sh_parse_i64(v, &n, o) < 0 || n < 1 || n > 1000)
                return cli_usage("rl sweep", "%s \"%s\": expected a count in 1..1000", o, v);
            *(!strcmp(o, "--seeds") ? &sw->seeds : !strcmp(o, "--steps") ? &sw->steps
              : !strcmp(o, "--jobs") ? &sw->jobs : &sw->async_steps) = (int)n;
            i++;
        } else if (!strcmp(o, "--target")) {
            if (sh_parse_double(v, &sw->target, o) < 0 || !(sw->target > 0 && sw->target <= 1))
                return cli_usage("rl sweep", "--target \"%s\": expected a reward in (0,1]", v);
            i++;
        } else if (!strcmp(o, "--out")) sw->out = v, i++;
        else if (!strcmp(o, "--losses")) sw->losses = v, i++;
        else if (!strcmp(o, "--dtypes")) sw->dtypes = v, i++;
        else if (!strncmp(o, "--", 2) && strlen(sw->extra) + strlen(o) + strlen(v) + 8 < sizeof sw->extra) {
            if (strchr(v, ' ') || strchr(o, ' '))
                return cli_usage("rl sweep", "option %s %s: values with spaces cannot be passed on", o, v);
            snprintf(sw->extra + strlen(sw->extra), sizeof sw->extra - strlen(sw->extra), " %s %s", o, v), i++;
        } else return cli_usage("rl sweep", "unexpected argument \"%s\"", o);
    }
    return 0;
}

/* Whether name is in the comma-separated list (NULL: everything is). */
static int in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ',' || !p[n])) return 1;
    return !list;
}

/* Every name in a --losses / --dtypes list is one of the grid's. */
static int check_subset(const char *list, const char *opt)
{
    static const char *names[] = {"ppo", "tis", "mis", "decoupled", "bf16", "fp8"};
    int dt = !strcmp(opt, "--dtypes");
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        size_t n = strcspn(p, ","), ok = 0;
        for (int k = dt ? 4 : 0; k < (dt ? 6 : 4); k++) ok |= strlen(names[k]) == n && !strncmp(p, names[k], n);
        if (!ok)
            return cli_usage("rl sweep", "%s \"%s\": expected a comma-separated list of %s", opt, list,
                             dt ? "bf16, fp8" : "ppo, tis, mis, decoupled");
    }
    return 0;
}

/* The passed-on options are checked once, before any work starts. */
static int check_extra(const sweep *sw)
{
    rl_config c;
    rl_config_default(&c);
    char buf[2048], *args[128];
    int na = 0, js = 0;
    snprintf(buf, sizeof buf, "%s", sw->extra);
    for (char *t = strtok(buf, " "); t && na < 128; t = strtok(NULL, " ")) args[na++] = t;
    return cli_rl_parse("rl sweep", na, args, &c, &js);
}

static int write_outputs(const sweep *sw, json_t *rows, double secs)
{
    char cmdline[2600], as[48] = "", jobs[32];
    if (sw->async_steps != sw->steps) snprintf(as, sizeof as, " --async-steps %d", sw->async_steps);
    snprintf(jobs, sizeof jobs, " --jobs %d", sw->jobs);
    char grid[600] = "";
    if (sw->losses) snprintf(grid, sizeof grid, " --losses %.250s", sw->losses);
    if (sw->dtypes) snprintf(grid + strlen(grid), sizeof grid - strlen(grid), " --dtypes %.250s", sw->dtypes);
    snprintf(cmdline, sizeof cmdline, "shoal rl sweep%s --seeds %d --steps %d%s --target %g%s%s%s",
             sw->quick ? " --quick" : "", sw->seeds, sw->steps, as, sw->target, jobs, grid, sw->extra);
    double load[3] = {0, 0, 0};
    getloadavg(load, 3);
    json_t *res = json_pack("{s:s,s:f,s:i,s:i,s:i,s:f,s:[f,f,f],s:O}", "command", cmdline, "target",
                            sw->target, "seeds", sw->seeds, "steps", sw->steps, "jobs", sw->jobs,
                            "sweep_wall_s", secs, "load_average_end", load[0], load[1], load[2],
                            "rows", rows);
    sh_buf md = {0}, svg = {0};
    write_md(&md, rows, sw->target, cmdline);
    write_svg(&svg, rows, sw->target);
    char p1[4096], p2[4096], p3[4096];
    snprintf(p1, sizeof p1, "%s/sweep.md", sw->out);
    snprintf(p2, sizeof p2, "%s/sweep.json", sw->out);
    snprintf(p3, sizeof p3, "%s/sweep.svg", sw->out);
    int rc = sh_write_atomic(p1, md.data, md.len);
    if (!rc) rc = sh_json_write_atomic(p2, res);
    if (!rc) rc = sh_write_atomic(p3, svg.data, svg.len);
    if (!rc && sw->json) sh_json_print(res);
    else if (!rc) printf("%s\nwrote %s, %s, %s\n", (char *)md.data, p1, p2, p3);
    sh_buf_free(&md), sh_buf_free(&svg);
    json_decref(res);
    return rc;
}

int cli_rl_sweep(int argc, char **argv)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    sweep sw = {.seeds = 0, .steps = 0, .target = 0.7, .out = "rl-sweep",
                .jobs = 2 * (int)(cores > 0 ? cores : 1)};
    int rc = parse_args(argc, argv, &sw);
    if (rc) return rc == 1 ? 0 : rc;
    if (!sw.seeds) sw.seeds = sw.quick ? 2 : 3;
    if (!sw.steps) sw.steps = sw.quick ? 30 : 60;
    /* Async runs get twice the steps: a step of theirs takes about half the
     * time of a sync one, and staleness costs progress per step, so they
     * need room to reach the sync run's final reward. */
    if (!sw.async_steps) sw.async_steps = 2 * sw.steps;
    if ((rc = check_extra(&sw))) return rc;
    static const int lags[] = {0, 1, 2, 4, 8};
    static const char *dts[] = {"bf16", "fp8"};
    if ((rc = check_subset(sw.losses, "--losses")) || (rc = check_subset(sw.dtypes, "--dtypes"))) return rc;
    cfg cf[64];
    int ncf = 0;
    for (int d = 0; d < 2; d++)
        for (int l = 0; l < 5; l++)
            for (int k = RL_LOSS_PPO; k <= RL_LOSS_DECOUPLED; k++) {
                if (!in_list(sw.losses, rl_loss_name(k)) || !in_list(sw.dtypes, dts[d])) continue;
                cf[ncf] = (cfg){.async = lags[l] > 0, .lag = lags[l] > 0 ? lags[l] : 2, .loss = k,
                                .dtype = dts[d], .runs = json_array()};
                for (int s = 0; s < sw.seeds; s++) json_array_append_new(cf[ncf].runs, json_null());
                ncf++;
            }
    char runs_dir[4096];
    snprintf(runs_dir, sizeof runs_dir, "%s/runs", sw.out);
    rc = sh_mkdir_p(runs_dir, 0755);
    double t0 = sh_now_mono();
    if (!rc) rc = run_all(&sw, cf, ncf);
    if (!rc) fprintf(stderr, "rl sweep: %d runs in %.0f s, %d at a time\n", ncf * sw.seeds,
                     sh_now_mono() - t0, sw.jobs);
    /* Rows once every run is in: each compares with its sync counterpart. */
    json_t *rows = json_array();
    for (int i = 0; i < ncf && !rc; i++) {
        json_array_append_new(rows, row_json(&cf[i], sync_ref(cf, ncf, &cf[i])));
    }
    if (!rc) rc = write_outputs(&sw, rows, sh_now_mono() - t0);
    for (int i = 0; i < ncf; i++) json_decref(cf[i].runs);
    json_decref(rows);
    return rc ? cli_fail("rl sweep", rc) : 0;
}
