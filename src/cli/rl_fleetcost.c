/* shoal rl fleet-cost: the same training, to the same target reward, on
 * three rollout pools (docs/mainjob.md, "The cost experiment"). (docs/mainjob.md):
 * options and the table; the experiment is src/app/mainjob/fleetcost.c's. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_int.h"
#include "cli_rl_int.h"
#include "app/mainjob/mainjob.h"

static const char usage[] =
    "usage: shoal rl fleet-cost --fleet FLEET.csv --speeds SPEEDS.csv [options] [--json]\n"
    "The same RL training, to the same target held-out reward, on a uniform pool of\n"
    "the training GPU type, on the mixed pool the scheduler would pick (cheapest per\n"
    "unit of throughput first), and on that pool tuned per GPU type (request size\n"
    "and concurrency); cost per accepted trajectory and total cost of each, billed\n"
    "in emulated GPU seconds, mean and spread over seeds.\n\n"
    "  --train-type T      the training GPU type (H100)\n"
    "  --trainer-gpus N    GPUs of the trainer gang, kept out of the pools (2)\n"
    "  --throughput X      rollout throughput of each pool in training GPUs (3)\n"
    "  --target R          held-out reward every run trains to (0.75: where the steps\n"
    "                      to it vary least over seeds; see \"crossings\" in --json)\n"
    "  --max-steps N       step cap of a run that does not reach it (120)\n"
    "  --seeds N --seed S  N seeds from S (16, 1): with 8 the standard error of a\n"
    "                      paired saving is about 7 points, with 16 about 3.5\n"
    "  --max-lag N         staleness bound: versions a trajectory may lag (2)\n"
    "  -j, --jobs N        runs at once, each in its own process (the core count)\n"
    "  --train-s S         emulated seconds of a training step (with making the next\n"
    "                      version) on the trainer's GPUs (0.2)\n"
    "  --warm-cache DIR    keep each seed's warm start there (a temporary folder,\n"
    "                      removed afterwards)\n"
    "  --step-s F          emulated seconds of a one-sequence decoding step on the\n"
    "                      training type (0.008)\n"
    "  --seq-cost F        cost of each further concurrent sequence, relative (0.0625)\n"
    "  --eval-every N      steps between held-out evaluations (2)\n"
    "  --eval-n N          held-out problems per evaluation (96)\n"
    "  --window N          the target is reached when the mean of the last N\n"
    "                      evaluations is at it (3)\n"
    "  --warm N            supervised warm-start steps before RL (70)\n"
    "  --unordered         train on whichever groups arrive first (rl train's default)\n"
    "                      instead of in the run's order: the pools then see different\n"
    "                      data, and the steps to the target vary far more\n";

enum { NPOOL = 3 };

typedef struct opts {
    mj_fleetcost_opts m;
    int json;
} opts;

/* Parses the options into o and c: -1, or the status to exit with. */
/* The options that depend on each other or on a range: -1, or the status
 * to exit with. */
static int check(const opts *o, const rl_config *c)
{
    if (!o->m.fleet || !o->m.speeds) return cli_usage("rl fleet-cost", "--fleet and --speeds are required");
    if (!(o->m.thr > 0) || o->m.tg < 0) return cli_usage("rl fleet-cost", "--throughput must be > 0 and --trainer-gpus >= 0");
    if (!(c->target_reward > 0 && c->target_reward <= 1)) return cli_usage("rl fleet-cost", "--target must be in (0,1]");
    if (!(c->step_s > 0 && c->step_s <= 10) || !(c->seq_cost >= 0 && c->seq_cost <= 1))
        return cli_usage("rl fleet-cost", "--step-s must be in (0,10] and --seq-cost in [0,1]");
    if (!(c->train_s > 0 && c->train_s <= 100)) return cli_usage("rl fleet-cost", "--train-s must be in (0,100]");
    return -1;
}

static int parse(int argc, char **argv, opts *o, rl_config *c)
{
    static const struct option table[] = {
        {"fleet", required_argument, 0, 'f'},      {"speeds", required_argument, 0, 'S'},
        {"train-type", required_argument, 0, 'T'}, {"trainer-gpus", required_argument, 0, 'g'},
        {"throughput", required_argument, 0, 'x'}, {"target", required_argument, 0, 'r'},
        {"max-steps", required_argument, 0, 'm'},  {"seeds", required_argument, 0, 'n'},
        {"jobs", required_argument, 0, 'j'},       {"train-s", required_argument, 0, 'c'},
        {"warm-cache", required_argument, 0, 'w'}, {"max-lag", required_argument, 0, 'l'},
        {"seed", required_argument, 0, 's'},       {"step-s", required_argument, 0, 'd'},
        {"seq-cost", required_argument, 0, 'q'},   {"eval-every", required_argument, 0, 'e'},
        {"eval-n", required_argument, 0, 'E'},     {"window", required_argument, 0, 'W'},
        {"warm", required_argument, 0, 'M'},       {"unordered", no_argument, 0, 'u'},
        {"json", no_argument, 0, 'J'},             {0}};
    /* The integer options: code, name, range and where the value goes. */
    const struct {
        int code;
        const char *name;
        int64_t lo, hi;
        int *to;
    } ints[] = {{'g', "--trainer-gpus", 0, 4096, &o->m.tg}, {'m', "--max-steps", 1, 1000000, &c->steps},
                {'n', "--seeds", 1, 32, &o->m.seeds},       {'j', "--jobs", 1, 64, &o->m.jobs},
                {'l', "--max-lag", 1, 64, &c->max_lag},     {'e', "--eval-every", 1, 1000000, &c->eval_every},
                {'E', "--eval-n", 1, 1024, &c->eval_n},     {'W', "--window", 1, 1000, &c->target_window},
                {'M', "--warm", 0, 100000, &c->warm_steps}};
    cli_args a = {"rl fleet-cost", usage, table, NULL, NULL, "j:"};
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;) {
        int64_t n;
        int rc = 0;
        switch (k) {
        case 'J': o->json = 1; continue;
        case 'u': c->ordered = 0; continue;
        case 'f': o->m.fleet = optarg; continue;
        case 'S': o->m.speeds = optarg; continue;
        case 'T': o->m.ttype = optarg; continue;
        case 'w': o->m.warm_cache = optarg; continue;
        case 'x': rc = sh_parse_double(optarg, &o->m.thr, "--throughput"); break;
        case 'r': rc = sh_parse_double(optarg, &c->target_reward, "--target"); break;
        case 'c': rc = sh_parse_double(optarg, &c->train_s, "--train-s"); break;
        case 'd': rc = sh_parse_double(optarg, &c->step_s, "--step-s"); break;
        case 'q': rc = sh_parse_double(optarg, &c->seq_cost, "--seq-cost"); break;
        case 's':
            if (cli_int(a.cmd, "--seed", optarg, 0, INT64_MAX, &n)) return CLI_USAGE;
            c->seed = (uint64_t)n;
            continue;
        case CLI_OPT_EXIT: return a.rc;
        }
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
            if (ints[i].code == k) {
                if (cli_int(a.cmd, ints[i].name, optarg, ints[i].lo, ints[i].hi, &n)) return CLI_USAGE;
                *ints[i].to = (int)n;
            }
        if (rc < 0) return cli_usage(a.cmd, "%s", sh_errmsg());
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    return check(o, c);
}


static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

static void print_table(const opts *o, const json_t *out)
{
    printf("%s\n%-8s %-20s %-20s %7s %6s %9s %8s %8s %9s %9s %9s\n", json_string_value(json_object_get(out, "setup")),
           "pool", "workers", "prompts/request", "$/h", "steps", "reward", "traj", "emul s", "cost $",
           "$/1k traj", "total $");
    static const char *const names[NPOOL] = {"uniform", "mixed", "tuned"};
    for (int i = 0; i < NPOOL; i++) {
        const json_t *r = json_object_get(out, names[i]), *sp = json_object_get(json_object_get(r, "spread"), "cost");
        char req[64] = "", *q = req;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)json_object_get(r, "per_type"), k, v)
            q += snprintf(q, sizeof req - (size_t)(q - req), "%s%s:%lld", q == req ? "" : " ", k,
                          (long long)json_integer_value(json_object_get(v, "request_prompts")));
        printf("%-8s %-20s %-20s %7.2f %6.1f %9.3f %8.0f %8.1f %9.4f %9.4f %9.4f  (cost %.4f..%.4f, %lld/%d reached, %.1f%% dropped stale)\n",
               names[i], json_string_value(json_object_get(r, "workers")) ?: "", req, num(r, "rollout_per_h"), num(r, "steps"), num(r, "reward_end"), num(r, "trajectories"),
               num(r, "emulated_s"), num(r, "cost"), num(r, "cost_per_1k_trajectories"), num(r, "total_cost"),
               num(sp, "min"), num(sp, "max"), (long long)json_integer_value(json_object_get(r, "reached")), o->m.seeds,
               100 * num(r, "dropped_stale_frac"));
    }
    printf("mixed saving %.1f%% (total %.1f%%), tuned saving %.1f%% (total %.1f%%), tuned vs mixed %.1f%%\n",
           100 * num(out, "mixed_saving"), 100 * num(out, "mixed_saving_total"), 100 * num(out, "tuned_saving"),
           100 * num(out, "tuned_saving_total"), 100 * num(out, "tuned_vs_mixed"));
    static const char *const keys[] = {"mixed_saving", "tuned_saving", "tuned_vs_mixed"};
    for (int i = 0; i < 3; i++) {
        char k[64];
        snprintf(k, sizeof k, "%s_paired", keys[i]);
        const json_t *q = json_object_get(out, k);
        printf("%s paired by seed: mean %.1f%% +- %.1f%% (standard error; sd %.1f%%, %.1f%%..%.1f%%)\n", keys[i],
               100 * num(q, "mean"), 100 * num(q, "se"), 100 * num(q, "sd"), 100 * num(q, "min"), 100 * num(q, "max"));
    }
}

/* The bar on a terminal; otherwise (`make run`, a log) a line every 10 %. */
static void on_progress(void *arg, uint64_t steps) { sh_progress_update(arg, steps); }

int cli_rl_fleet_cost(int argc, char **argv)
{
    opts o = {0};
    rl_config base;
    mj_fleetcost_default(&o.m, &base);
    int rc = parse(argc, argv, &o, &base);
    if (rc >= 0) return rc;
    sh_progress bar;
    sh_progress_start(&bar, "rl fleet-cost", 3 * (uint64_t)o.m.seeds * (uint64_t)base.steps, "steps");
    json_t *out = NULL;
    rc = mj_fleet_cost(&o.m, &base, on_progress, &bar, &out);
    cli_progress_end(&bar, rc);
    if (rc < 0) return cli_fail("rl fleet-cost", rc);
    if (o.json) sh_json_print(out);
    else print_table(&o, out);
    json_decref(out);
    return 0;
}
