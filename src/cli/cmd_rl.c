/* shoal rl: train a policy with reinforcement learning (sync or async, with
 * off-policy corrections) and sweep the design space. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_int.h"
#include "cli_rl_int.h"
#include "shoal/rl.h"

const char cli_help_rl[] =
    "reinforcement learning: `rl train` a policy sync/async, `rl sweep` the corrections [--json]";

static const char train_usage[] =
    "usage: shoal rl train [options] [--json]\n"
    "Supervised warm start, then GRPO-style RL with a trainer and rollout worker\n"
    "processes.  Progress goes to stderr; a summary (or with --json one JSON\n"
    "object with reward_start, reward_end, wall_s, steps, tokens_per_s, ...) to stdout.\n\n"
    "  --task code|arith          task (code)\n"
    "  --mode sync|async          runtime (async)\n"
    "  --max-lag N                async staleness bound eta in versions (2)\n"
    "  --ordered                  async: step s trains on exactly the groups s P..(s+1) P - 1\n"
    "                             of the run's sequence, whoever brings them (none dropped)\n"
    "  --loss pg|naive|ppo|tis|mis|decoupled   objective (decoupled)\n"
    "  --rollout-dtype fp32|bf16|fp8     weights the workers sample with (bf16)\n"
    "  --steps N --seed S         RL steps (60), seed (1)\n"
    "  --workers LIST             name:speed:price,... (h100:1:2.5,a100:0.5:1.3,l4:0.25:0.45)\n"
    "  --gen-cost F               a decoding step on a speed-1 worker lasts F x its CPU\n"
    "                             time (24): rollouts dominate, as on GPUs\n"
    "  --train-cost F             a training step lasts F x its CPU time (1: as it comes);\n"
    "                             above 1, timings no longer depend on other load\n"
    "  --prompts N --group G      prompts per step (8), samples per prompt (8)\n"
    "  --minibatches M            optimiser steps per RL step (2)\n"
    "  --request-prompts N        async: prompts per worker request (a quarter step's)\n"
    "  --lr X --warm N            RL learning rate (1e-3), warm-start steps (70)\n"
    "  --warm-cache DIR           keep warm-started weights in DIR and reuse them (a run\n"
    "                             with the same task, shape, seed and --warm loads them)\n"
    "  --temperature T --top-p P --max-new N   sampling (1, 1, 8)\n"
    "  --clip E --tis-cap C --mis-band LO,HI --mis-level token|seq --decoupled-cap C\n"
    "                             loss knobs (0.2, 2, 0.5,2, token, none)\n"
    "  --eval-every N --eval-n N  held-out evaluation cadence (10) and size (64)\n"
    "  --target R                 report wall-clock time to held-out reward R (0.8)\n"
    "  --stop-after-reward R      end the run one evaluation after the held-out reward\n"
    "                             first reaches R (default: run all --steps)\n"
    "  --width C --layers L --heads H --ctx T   model shape (64, 2, 4, 24)\n"
    "  --out DIR --save-every N   write bf16 safetensors policy checkpoints (Hugging Face\n"
    "                             names) to DIR at the end and every N steps\n"
    "  --kill-worker-at STEP      fault injection: SIGKILL worker 0 after STEP\n"
    "  --nan-at STEP              fault injection: a NaN behaviour log-probability in the\n"
    "                             batch of STEP (the step is skipped, the weights kept)\n"
    "  --no-respawn               do not replace a worker that died\n"
    "  --quiet                    no per-evaluation lines on stderr\n"
    "  --verbose                  one line per step: reward, loss, |dlogp|, KL, clipped and\n"
    "                             masked fractions, staleness histogram, gradient norm\n";

static int parse_int(const char *s, int lo, int hi, int *out, const char *what)
{
    int64_t v;
    SH_TRY(sh_parse_i64(s, &v, what));
    if (v < lo || v > hi) return sh_err(SH_ERANGE, "%s %lld: must be %d..%d", what, (long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

static int parse_dtype(const char *s, int *out)
{
    return rl_dtype_parse(s, out) ? sh_err(SH_EINVAL, "--rollout-dtype \"%s\": expected fp32, bf16 or fp8", s) : 0;
}

/* The options that set one number of rl_config: integers within lo..hi,
 * floats, doubles.  offsetof takes a nested member (C11); _Generic makes a
 * field of another type a compile error. */
enum { OPT_INT, OPT_FLOAT, OPT_DOUBLE };
#define FIELD(f, T) _Generic(((rl_config *)0)->f, T: offsetof(rl_config, f))
#define INT_OPT(name, f, lo, hi) {name, OPT_INT, FIELD(f, int), lo, hi}
#define FLOAT_OPT(name, f) {name, OPT_FLOAT, FIELD(f, float), 0, 0}
#define DOUBLE_OPT(name, f) {name, OPT_DOUBLE, FIELD(f, double), 0, 0}
static const struct num_opt {
    const char *name;
    int type;
    size_t off;
    int lo, hi;
} num_opts[] = {
    INT_OPT("--max-lag", max_lag, 0, 64),
    INT_OPT("--steps", steps, 1, 1000000),
    INT_OPT("--prompts", prompts_per_step, 1, 4096),
    INT_OPT("--group", group, 1, 4096),
    INT_OPT("--request-prompts", req_prompts, 0, 4096),
    INT_OPT("--minibatches", minibatches, 1, 4096),
    INT_OPT("--warm", warm_steps, 0, 100000),
    INT_OPT("--max-new", sampling.max_new, 2, RL_MAX_T),
    INT_OPT("--eval-every", eval_every, 1, 1000000),
    INT_OPT("--eval-n", eval_n, 1, 1024),
    INT_OPT("--width", model.width, 1, 8192),
    INT_OPT("--layers", model.layers, 1, 64),
    INT_OPT("--heads", model.heads, 1, 256),
    INT_OPT("--ctx", model.ctx, 1, 4096),
    INT_OPT("--save-every", save_every, 0, 1000000),
    INT_OPT("--kill-worker-at", kill_at_step, 0, 1000000),
    INT_OPT("--nan-at", nan_at_step, 0, 1000000),
    FLOAT_OPT("--lr", lr),
    FLOAT_OPT("--temperature", sampling.temperature),
    FLOAT_OPT("--top-p", sampling.top_p),
    FLOAT_OPT("--clip", loss.clip),
    FLOAT_OPT("--tis-cap", loss.tis_cap),
    FLOAT_OPT("--decoupled-cap", loss.dec_cap),
    DOUBLE_OPT("--target", target_reward),
    DOUBLE_OPT("--gen-cost", gen_cost),
    DOUBLE_OPT("--train-cost", train_cost),
};

/* A number option into its field of c: 1, 0 if o is not one, <0 error. */
static int num_option(rl_config *c, const char *o, const char *v)
{
    for (size_t i = 0; i < sizeof num_opts / sizeof *num_opts; i++) {
        const struct num_opt *n = &num_opts[i];
        if (strcmp(o, n->name)) continue;
        char *field = (char *)c + n->off;
        double d;
        if (n->type == OPT_INT) return parse_int(v, n->lo, n->hi, (int *)(void *)field, o) ?: 1;
        SH_TRY(sh_parse_double(v, &d, o));
        if (n->type == OPT_FLOAT) *(float *)(void *)field = (float)d;
        else *(double *)(void *)field = d;
        return 1;
    }
    return 0;
}

/* The options whose values are words, pairs or checked ranges. */
static int word_option(rl_config *c, const char *o, const char *v)
{
    int64_t seed;
    double d;
    int k;
    if (!strcmp(o, "--task")) return rl_task_parse(v, &c->task) ?: 1;
    if (!strcmp(o, "--mode")) {
        if (strcmp(v, "sync") && strcmp(v, "async")) return sh_err(SH_EINVAL, "--mode \"%s\": expected sync or async", v);
        c->mode = !strcmp(v, "sync") ? RL_MODE_SYNC : RL_MODE_ASYNC;
        return 1;
    }
    if (!strcmp(o, "--loss")) return rl_loss_parse(v, &k) ?: (c->loss.kind = k, 1);
    if (!strcmp(o, "--rollout-dtype")) return parse_dtype(v, &c->dtype) ?: 1;
    if (!strcmp(o, "--seed")) return sh_parse_i64(v, &seed, o) ?: (c->seed = (uint64_t)seed, 1);
    if (!strcmp(o, "--workers")) return rl_workers_parse(v, c) ?: 1;
    if (!strcmp(o, "--mis-band")) {
        if (sscanf(v, "%f,%f", &c->loss.mis_lo, &c->loss.mis_hi) != 2)
            return sh_err(SH_EINVAL, "--mis-band \"%s\": expected LO,HI (e.g. 0.5,2)", v);
        return 1;
    }
    if (!strcmp(o, "--mis-level")) {
        if (strcmp(v, "token") && strcmp(v, "seq")) return sh_err(SH_EINVAL, "--mis-level \"%s\": expected token or seq", v);
        c->loss.mis_seq = !strcmp(v, "seq");
        return 1;
    }
    if (!strcmp(o, "--stop-after-reward")) {
        SH_TRY(sh_parse_double(v, &d, o));
        if (!(d > 0 && d <= 1)) return sh_err(SH_EINVAL, "--stop-after-reward %s: expected a reward in (0,1]", v);
        c->stop_reward = d;
        return 1;
    }
    if (!strcmp(o, "--out")) return c->out_dir = v, 1;
    if (!strcmp(o, "--warm-cache")) return c->warm_cache = v, 1;
    return 0;
}

/* One option with its value; returns 1 if consumed, 0 if unknown, <0 error. */
static int option(rl_config *c, const char *o, const char *v)
{
    int rc = num_option(c, o, v);
    return rc ? rc : word_option(c, o, v);
}

/* The rl train options: codes CLI_RL_OPT + their index; the flags last. */
#define RL_ARG(name) {name, required_argument, 0, CLI_RL_OPT + __COUNTER__ - RL_BASE}
enum { RL_BASE = __COUNTER__ + 1 };
const struct option cli_rl_opts[] = {
    RL_ARG("task"),       RL_ARG("mode"),          RL_ARG("max-lag"),        RL_ARG("loss"),
    RL_ARG("rollout-dtype"), RL_ARG("steps"),      RL_ARG("seed"),           RL_ARG("workers"),
    RL_ARG("prompts"),    RL_ARG("group"),         RL_ARG("request-prompts"), RL_ARG("minibatches"),
    RL_ARG("lr"),         RL_ARG("warm"),          RL_ARG("temperature"),    RL_ARG("top-p"),
    RL_ARG("max-new"),    RL_ARG("clip"),          RL_ARG("tis-cap"),        RL_ARG("decoupled-cap"),
    RL_ARG("mis-band"),   RL_ARG("mis-level"),     RL_ARG("eval-every"),     RL_ARG("eval-n"),
    RL_ARG("target"),     RL_ARG("stop-after-reward"), RL_ARG("width"),      RL_ARG("layers"),
    RL_ARG("heads"),      RL_ARG("ctx"),           RL_ARG("gen-cost"),       RL_ARG("train-cost"),
    RL_ARG("out"),        RL_ARG("warm-cache"),    RL_ARG("save-every"),     RL_ARG("kill-worker-at"),
    RL_ARG("nan-at"),
    {"json", no_argument, 0, CLI_RL_JSON},         {"quiet", no_argument, 0, CLI_RL_QUIET},
    {"no-respawn", no_argument, 0, CLI_RL_NO_RESPAWN}, {"ordered", no_argument, 0, CLI_RL_ORDERED},
    {"verbose", no_argument, 0, CLI_RL_VERBOSE},   {0}};

int cli_rl_opt(const char *cmd, int code, const char *v, rl_config *c)
{
    switch (code) {
    case CLI_RL_JSON: case CLI_RL_VERBOSE: return 0; /* the caller's */
    case CLI_RL_QUIET: c->quiet = 1; return 0;
    case CLI_RL_NO_RESPAWN: c->respawn = 0; return 0;
    case CLI_RL_ORDERED: c->ordered = 1; return 0;
    }
    const char *name = cli_rl_opt_name(code);
    if (!name) return cli_usage(cmd, "option code %d is not one of rl train's", code);
    char o[40];
    snprintf(o, sizeof o, "--%s", name);
    if (option(c, o, v) < 0) return cli_usage(cmd, "%s", sh_errmsg());
    return 0;
}

const char *cli_rl_opt_name(int code)
{
    for (const struct option *p = cli_rl_opts; p->name; p++)
        if (p->val == code) return p->name;
    return NULL;
}

int cli_rl_check(const char *cmd, rl_config *c)
{
    return rl_config_check(c) < 0 ? cli_usage(cmd, "%s", sh_errmsg()) : 0;
}

int cli_rl_parse(const char *cmd, int argc, char **argv, rl_config *c, int *json)
{
    /* getopt reads from argv[1]: a copy with the command in front. */
    char **v = calloc((size_t)argc + 2, sizeof *v);
    if (!v) return cli_fail(cmd, sh_err(SH_ENOMEM, "out of memory"));
    v[0] = (char *)cmd;
    memcpy(v + 1, argv, (size_t)argc * sizeof *v);
    cli_args a = {cmd, train_usage, cli_rl_opts, NULL};
    int rc = 0;
    for (int k; !rc && (k = cli_getopt(&a, argc + 1, v)) != -1;)
        if (k == CLI_OPT_EXIT) rc = a.rc ? a.rc : CLI_USAGE; /* --help here is not a request for it */
        else if (k == CLI_RL_JSON) *json = 1;
        else rc = cli_rl_opt(cmd, k, optarg, c);
    if (!rc && optind < argc + 1) rc = cli_usage(cmd, "unexpected argument \"%s\"", v[optind]);
    free(v);
    return rc ? rc : cli_rl_check(cmd, c);
}

typedef struct progress_ctx {
    const rl_config *c;
    sh_progress bar;
    int verbose;
} progress_ctx;

static double num(const json_t *ev, const char *k) { return json_number_value(json_object_get(ev, k)); }

/* One line per step: the figures the issue asks every step to report. */
static void step_line(const json_t *ev, int step)
{
    char hist[128] = "";
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(ev, "staleness"), i, v)
        snprintf(hist + strlen(hist), sizeof hist - strlen(hist), "%s%lld", i ? "/" : "",
                 (long long)json_integer_value(v));
    fprintf(stderr,
            "rl: step %4d  reward %.3f  loss %+.4f  |dlogp| %.4f  kl %.5f  clipped %.3f  "
            "masked %.3f  staleness %s  grad %.3f  %.1fs\n",
            step, num(ev, "reward"), num(ev, "loss"), num(ev, "abs_dlogp"), num(ev, "kl"),
            num(ev, "clipped_frac"), num(ev, "masked_frac"), hist, num(ev, "grad_norm"),
            num(ev, "wall_s"));
}

static void on_event(const json_t *ev, void *ctx)
{
    progress_ctx *p = ctx;
    const char *kind = json_string_value(json_object_get(ev, "event"));
    int step = (int)json_integer_value(json_object_get(ev, "step"));
    if (!strcmp(kind, "step")) {
        if (json_is_true(json_object_get(ev, "skipped"))) {
            sh_progress_clear(&p->bar);
            fprintf(stderr, "rl: step %d skipped (non-finite loss or gradient); weights kept\n", step);
        }
        if (p->verbose) step_line(ev, step);
        else sh_progress_update(&p->bar, (uint64_t)step);
        return;
    }
    if (p->c->quiet) return;
    sh_progress_clear(&p->bar);
    fprintf(stderr, "rl: step %4d/%d  held-out reward %.3f  %.1fs\n", step, p->c->steps,
            json_number_value(json_object_get(ev, "reward")),
            json_number_value(json_object_get(ev, "wall_s")));
}

static int train(int argc, char **argv)
{
    rl_config c;
    rl_config_default(&c);
    int json = 0, verbose = 0, rc;
    cli_args a = {"rl train", train_usage, cli_rl_opts, NULL};
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;)
        if (k == CLI_OPT_EXIT) return a.rc;
        else if (k == CLI_RL_JSON) json = 1;
        else if (k == CLI_RL_VERBOSE) verbose = 1;
        else if ((rc = cli_rl_opt("rl train", k, optarg, &c))) return rc;
    if (optind < argc) return cli_usage("rl train", "unexpected argument \"%s\"", argv[optind]);
    if ((rc = cli_rl_check("rl train", &c))) return rc;
    progress_ctx p = {.c = &c, .verbose = verbose};
    sh_progress_start(&p.bar, "rl train", (uint64_t)c.steps, "steps");
    json_t *res = NULL;
    rc = rl_run(&c, on_event, &p, &res);
    sh_progress_finish(&p.bar);
    if (rc < 0) return cli_fail("rl train", rc);
    if (json) {
        sh_json_print(res);
    } else {
        double ttt = json_number_value(json_object_get(res, "time_to_target_s"));
        char reach[64];
        if (ttt >= 0) snprintf(reach, sizeof reach, "%.1f s", ttt);
        else snprintf(reach, sizeof reach, "not reached");
        printf("%s %s%s lag %d, loss %s, %s rollouts: held-out reward %.3f -> %.3f in %d steps, "
               "%.1f s, %.0f tokens/s generated, time to %.2f: %s\n",
               rl_task_name(c.task), c.mode ? "async" : "sync", c.ordered ? " ordered" : "",
               c.max_lag, rl_loss_name(c.loss.kind),
               json_string_value(json_object_get(res, "rollout_dtype")),
               json_number_value(json_object_get(res, "reward_start")),
               json_number_value(json_object_get(res, "reward_end")),
               (int)json_integer_value(json_object_get(res, "steps")),
               json_number_value(json_object_get(res, "wall_s")),
               json_number_value(json_object_get(res, "tokens_per_s")), c.target_reward, reach);
    }
    json_decref(res);
    return 0;
}

static const char rl_usage[] =
    "usage: shoal rl train [options]   train a policy (see `shoal rl train --help`)\n"
    "       shoal rl sweep [options]   sweep sync/async x loss x dtype (see `shoal rl sweep --help`)\n"
    "       shoal rl trainer|worker    the main job's gang ranks and rollout workers\n"
    "       shoal rl push-root         the main job's push tree root, as a job\n"
    "       shoal rl report --dir RUN  live progress and the HTML report of a main job\n"
    "       shoal rl fleet-cost        uniform vs mixed vs tuned rollout pools [--json]\n";

int cli_cmd_rl(int argc, char **argv)
{
    static const char *const subs[] = {"train", "sweep", "trainer", "worker", "push-root", "report", "fleet-cost", NULL};
    static int (*const fns[])(int, char **) = {train,          cli_rl_sweep,  cli_rl_trainer,   cli_rl_worker,
                                               cli_rl_push_root, cli_rl_report, cli_rl_fleet_cost};
    int rc, k = cli_subcommand("rl", rl_usage, argc, argv, subs, &rc);
    return k < 0 ? rc : fns[k](argc - 1, argv + 1);
}
