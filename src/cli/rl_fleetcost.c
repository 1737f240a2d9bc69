/* shoal rl fleet-cost: the same training, to the same target reward, on
 * three rollout pools (docs/mainjob.md, "The cost experiment").
 *
 *   uniform  workers of the training GPU type only, enough for the target
 *            rollout throughput (in units of one training GPU);
 *   mixed    the fleet's GPUs taken in order of price per unit of
 *            throughput (price / declared speed: the order in which the
 *            scheduler grows an elastic job, src/sched/cycle.c) until they
 *            add up to the same throughput, the trainer's GPUs excepted;
 *            every worker with the run's request size, as uniform;
 *   tuned    the mixed pool with a request size and so a concurrency per
 *            GPU type (mj_tune: the most throughput within the staleness
 *            bound, each type's memory limiting its concurrent sequences).
 *
 * Each pool runs the RL engine (rl_run, forked workers in emulated GPU
 * time) from each seed until the held-out reward reaches the target, or
 * the step cap.  Runs are ordered (rl_config.ordered): from one seed, every
 * pool trains on the same problems with the same sampling streams in the
 * same batches, and differs only in which versions generated them (its
 * staleness), so that comparing pools seed by seed compares the pools,
 * not two draws of an RL run's luck.  Billing uses emulated GPU seconds counted from the work
 * done, never the wall clock: the pool's emulated time is the work its
 * workers did spread over the pool in proportion to their rates (an
 * elastic pool kept busy), and every worker is billed for that time. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_rl.h"
#include "shoal/mainjob.h"

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
    "  --train-cost F      a training step lasts F times its CPU time, the rest slept,\n"
    "                      so the trainer's pace does not depend on the load (3)\n"
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

enum { NPOOL = 3, MAX_SEEDS = 32 };

typedef struct pool {
    const char *name;
    rl_config c;
    char desc[128];
    double per_h;
} pool;

typedef struct gpu {
    const mj_node *n;
    double key;
} gpu;

static int cmp_gpu(const void *a, const void *b)
{
    double x = ((const gpu *)a)->key, y = ((const gpu *)b)->key;
    return x < y ? -1 : x > y;
}

static void add_worker(pool *p, const mj_node *n)
{
    rl_worker_spec *w = &p->c.workers[p->c.nworkers++];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", n->gpu_type);
    w->speed = n->speed, w->price = n->price, w->max_seqs = n->max_seqs;
    p->per_h += n->price;
}

/* "4xL4+2xL40S+1xA100" */
static void describe(pool *p)
{
    size_t o = 0;
    for (int i = 0; i < p->c.nworkers; i++) {
        if (i && !strcmp(p->c.workers[i].name, p->c.workers[i - 1].name)) continue;
        int k = 0;
        for (int j = i; j < p->c.nworkers && !strcmp(p->c.workers[j].name, p->c.workers[i].name); j++) k++;
        o += (size_t)snprintf(p->desc + o, sizeof p->desc - o, "%s%dx%s", o ? "+" : "", k, p->c.workers[i].name);
        if (o >= sizeof p->desc) break;
    }
}

static int build_pools(const mj_fleet *f, const char *ttype, int tgpus, double thr, pool *p)
{
    const mj_node *tn = NULL;
    gpu *g = calloc(1024, sizeof *g);
    int ng = 0, skip = tgpus;
    if (!g) return sh_err(SH_ENOMEM, "out of memory");
    for (int i = 0; i < f->n; i++) {
        const mj_node *n = &f->nodes[i];
        if (!strcmp(n->gpu_type, ttype) && (!tn || n->price < tn->price)) tn = n;
        for (int k = 0; k < n->gpus && ng < 1024; k++) {
            if (!strcmp(n->gpu_type, ttype) && skip > 0) { /* the trainer's */
                skip--;
                continue;
            }
            g[ng++] = (gpu){n, n->price / n->speed};
        }
    }
    if (!tn) {
        free(g);
        return sh_err(SH_ENOENT, "training type %s is not in the fleet; pass --train-type", ttype);
    }
    qsort(g, (size_t)ng, sizeof *g, cmp_gpu);
    double got = 0;
    while (got + 1e-9 < thr && p[0].c.nworkers < RL_MAX_WORKERS) add_worker(&p[0], tn), got += tn->speed;
    got = 0;
    for (int i = 0; i < ng && got + 1e-9 < thr && p[1].c.nworkers < RL_MAX_WORKERS; i++) {
        add_worker(&p[1], g[i].n), add_worker(&p[2], g[i].n);
        got += g[i].n->speed;
    }
    free(g);
    if (got + 1e-9 < thr)
        return sh_err(SH_ERANGE, "the fleet's GPUs add up to a throughput of %.2f, less than --throughput %.2f",
                      got, thr);
    SH_TRY(mj_tune(&p[2].c));
    for (int i = 0; i < NPOOL; i++) describe(&p[i]);
    return 0;
}

/* In a run's process: each step as a line "S <step>" on the pipe to the
 * parent, which draws the progress bar. */
static void on_event(const json_t *ev, void *ctx)
{
    if (!strcmp(json_string_value(json_object_get(ev, "event")) ?: "", "step"))
        dprintf(*(int *)ctx, "S %lld\n", (long long)json_integer_value(json_object_get(ev, "step")));
}

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

/* The pool's emulated time: each worker's emulated busy seconds times its
 * rate is the work it did; spread over the pool's rate, that work takes
 * the time every worker of the pool is billed for. */
static double pool_time(const rl_config *c, const json_t *res)
{
    double work = 0;
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(res, "workers"), i, w) {
        if ((int)i >= c->nworkers) break;
        const rl_worker_spec *s = &c->workers[i];
        work += num(w, "gpu_s") * mj_worker_rate(c, s, s->req_prompts ? s->req_prompts : mj_default_prompts(c));
    }
    return work / mj_pool_rate(c);
}

/* One run of pool p from seed `seed`: the figures of docs/mainjob.md. */
static json_t *run_pool(const pool *p, uint64_t seed, double trainer_per_h, int *fd, int *rc)
{
    rl_config c = p->c;
    c.seed = seed;
    json_t *res = NULL;
    if ((*rc = rl_run(&c, on_event, fd, &res))) return NULL;
    double t = pool_time(&c, res), cost = p->per_h * t / 3600;
    long steps = (long)json_integer_value(json_object_get(res, "steps"));
    long accepted = steps * c.prompts_per_step * c.group, generated = 0;
    size_t i;
    json_t *w, *gpu_s = json_object();
    json_array_foreach(json_object_get(res, "workers"), i, w) {
        generated += (long)json_integer_value(json_object_get(w, "trajectories"));
        const char *name = json_string_value(json_object_get(w, "name"));
        json_object_set_new(gpu_s, name, json_real(num(w, "gpu_s") + num(gpu_s, name)));
    }
    json_t *o = json_pack("{s:I,s:b,s:I,s:f,s:f,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:o,s:o}", "seed",
                          (json_int_t)seed, "reached", num(res, "time_to_target_s") >= 0, "steps",
                          (json_int_t)steps, "reward_start", num(res, "reward_start"), "reward_end",
                          num(res, "reward_end"), "trajectories", (json_int_t)accepted, "generated",
                          (json_int_t)generated, "dropped_stale",
                          json_integer_value(json_object_get(res, "dropped_stale")), "emulated_s", t,
                          "cost", cost, "total_cost", cost + trainer_per_h * t / 3600,
                          "cost_per_1k_trajectories", 1000 * cost / (double)accepted, "wall_s",
                          num(res, "wall_s"), "gpu_s_by_type", gpu_s, "staleness_hist",
                          json_incref(json_object_get(res, "staleness_hist")));
    json_t *curve = json_array(), *e;
    json_array_foreach(json_object_get(res, "curve"), i, e)
        json_array_append_new(curve, json_pack("[I,f]", json_integer_value(json_object_get(e, "step")), num(e, "reward")));
    json_object_set_new(o, "curve", curve);
    json_decref(res);
    return o;
}

/* Mean, min and max of field k over the runs of one pool: {"mean", "min", "max"}. */
static json_t *spread(const json_t *runs, const char *k, double *mean)
{
    double sum = 0, lo = INFINITY, hi = -INFINITY;
    size_t i, n = json_array_size(runs);
    json_t *r;
    json_array_foreach(runs, i, r) {
        double v = num(r, k);
        sum += v, lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    *mean = n ? sum / (double)n : 0;
    return json_pack("{s:f,s:f,s:f}", "mean", *mean, "min", lo, "max", hi);
}

/* A pool's summary: the means as plain numbers (cost, reward_end,
 * trajectories, ...), the spreads under "spread", the runs, the setup. */
static json_t *summarise(const pool *p, json_t *runs)
{
    static const char *const keys[] = {"cost", "total_cost", "reward_end", "trajectories", "steps",
                                       "emulated_s", "cost_per_1k_trajectories", "wall_s", "generated"};
    json_t *o = json_object(), *sp = json_object(), *per = json_object(), *r;
    double m;
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        json_object_set_new(sp, keys[k], spread(runs, keys[k], &m));
        json_object_set_new(o, keys[k], json_real(m));
    }
    size_t i, reached = 0;
    double dropped = 0, generated = 0;
    json_array_foreach(runs, i, r) {
        reached += json_is_true(json_object_get(r, "reached"));
        dropped += num(r, "dropped_stale"), generated += num(r, "generated");
    }
    for (int w = 0; w < p->c.nworkers; w++) { /* the setting of each GPU type */
        const rl_worker_spec *s = &p->c.workers[w];
        int k = s->req_prompts ? s->req_prompts : mj_default_prompts(&p->c), seqs = k * p->c.group;
        json_object_set_new(per, s->name, json_pack("{s:i,s:i,s:i,s:f}", "request_prompts", k,
                                                    "concurrency", s->max_seqs && s->max_seqs < seqs ? s->max_seqs : seqs,
                                                    "max_seqs", s->max_seqs, "trajs_per_emulated_s",
                                                    mj_worker_rate(&p->c, s, k)));
    }
    json_object_set_new(o, "workers", json_string(p->desc));
    json_object_set_new(o, "rollout_per_h", json_real(p->per_h));
    json_object_set_new(o, "rate_trajs_per_emulated_s", json_real(mj_pool_rate(&p->c)));
    json_object_set_new(o, "per_type", per);
    json_object_set_new(o, "reached", json_integer((json_int_t)reached));
    /* Paid for, not trained on: the waste of the staleness bound. */
    json_object_set_new(o, "dropped_stale_frac", json_real(generated > 0 ? dropped / generated : 0));
    json_object_set_new(o, "spread", sp);
    json_object_set_new(o, "runs", runs);
    return o;
}

typedef struct opts {
    const char *fleet, *speeds, *ttype;
    int tg, seeds, json, jobs;
    const char *warm_cache;
    double thr;
} opts;

static int parse(int argc, char **argv, opts *o, rl_config *c)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t k = 0;
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--unordered")) { c->ordered = 0; continue; }
        if (!v) return cli_usage("rl fleet-cost", "unknown option or missing value \"%s\"", a);
        int rc = 0;
        if (!strcmp(a, "--fleet")) o->fleet = v;
        else if (!strcmp(a, "--speeds")) o->speeds = v;
        else if (!strcmp(a, "--train-type")) o->ttype = v;
        else if (!strcmp(a, "--trainer-gpus")) rc = sh_parse_i64(v, &k, a), o->tg = (int)k;
        else if (!strcmp(a, "--throughput")) rc = sh_parse_double(v, &o->thr, a);
        else if (!strcmp(a, "--target")) rc = sh_parse_double(v, &c->target_reward, a);
        else if (!strcmp(a, "--max-steps")) rc = sh_parse_i64(v, &k, a), c->steps = (int)k;
        else if (!strcmp(a, "--seeds")) rc = sh_parse_i64(v, &k, a), o->seeds = (int)k;
        else if (!strcmp(a, "-j") || !strcmp(a, "--jobs")) rc = sh_parse_i64(v, &k, a), o->jobs = (int)k;
        else if (!strcmp(a, "--train-cost")) rc = sh_parse_double(v, &c->train_cost, a);
        else if (!strcmp(a, "--warm-cache")) o->warm_cache = v;
        else if (!strcmp(a, "--max-lag")) rc = sh_parse_i64(v, &k, a), c->max_lag = (int)k;
        else if (!strcmp(a, "--seed")) rc = sh_parse_i64(v, &k, a), c->seed = (uint64_t)k;
        else if (!strcmp(a, "--step-s")) rc = sh_parse_double(v, &c->step_s, a);
        else if (!strcmp(a, "--seq-cost")) rc = sh_parse_double(v, &c->seq_cost, a);
        else if (!strcmp(a, "--eval-every")) rc = sh_parse_i64(v, &k, a), c->eval_every = (int)k;
        else if (!strcmp(a, "--eval-n")) rc = sh_parse_i64(v, &k, a), c->eval_n = (int)k;
        else if (!strcmp(a, "--window")) rc = sh_parse_i64(v, &k, a), c->target_window = (int)k;
        else if (!strcmp(a, "--warm")) rc = sh_parse_i64(v, &k, a), c->warm_steps = (int)k;
        else return cli_usage("rl fleet-cost", "unknown option \"%s\"", a);
        if (rc < 0) return cli_usage("rl fleet-cost", "%s", sh_errmsg());
        i++;
    }
    if (!o->fleet || !o->speeds) return cli_usage("rl fleet-cost", "--fleet and --speeds are required");
    if (!(o->thr > 0) || o->tg < 0) return cli_usage("rl fleet-cost", "--throughput must be > 0 and --trainer-gpus >= 0");
    if (o->seeds < 1 || o->seeds > MAX_SEEDS) return cli_usage("rl fleet-cost", "--seeds must be 1..%d", MAX_SEEDS);
    if (o->jobs < 1 || o->jobs > 64) return cli_usage("rl fleet-cost", "-j must be 1..64");
    if (c->max_lag < 1 || c->max_lag > 64) return cli_usage("rl fleet-cost", "--max-lag must be 1..64");
    if (!(c->target_reward > 0 && c->target_reward <= 1)) return cli_usage("rl fleet-cost", "--target must be in (0,1]");
    if (!(c->step_s > 0 && c->step_s <= 10) || !(c->seq_cost >= 0 && c->seq_cost <= 1))
        return cli_usage("rl fleet-cost", "--step-s must be in (0,10] and --seq-cost in [0,1]");
    return 0;
}

static void print_table(const opts *o, const pool *p, const json_t *out)
{
    printf("%s\n%-8s %-20s %-20s %7s %6s %9s %8s %8s %9s %9s %9s\n", json_string_value(json_object_get(out, "setup")),
           "pool", "workers", "prompts/request", "$/h", "steps", "reward", "traj", "emul s", "cost $",
           "$/1k traj", "total $");
    for (int i = 0; i < NPOOL; i++) {
        const json_t *r = json_object_get(out, p[i].name), *sp = json_object_get(json_object_get(r, "spread"), "cost");
        char req[64] = "", *q = req;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)json_object_get(r, "per_type"), k, v)
            q += snprintf(q, sizeof req - (size_t)(q - req), "%s%s:%lld", q == req ? "" : " ", k,
                          (long long)json_integer_value(json_object_get(v, "request_prompts")));
        printf("%-8s %-20s %-20s %7.2f %6.1f %9.3f %8.0f %8.1f %9.4f %9.4f %9.4f  (cost %.4f..%.4f, %lld/%d reached, %.1f%% dropped stale)\n",
               p[i].name, p[i].desc, req, p[i].per_h, num(r, "steps"), num(r, "reward_end"), num(r, "trajectories"),
               num(r, "emulated_s"), num(r, "cost"), num(r, "cost_per_1k_trajectories"), num(r, "total_cost"),
               num(sp, "min"), num(sp, "max"), (long long)json_integer_value(json_object_get(r, "reached")), o->seeds,
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

/* Savings (1 - a/b) of the means, and for cost of each seed's pair of
 * runs: `<key>_by_seed`, and `<key>_paired` with the mean of those paired
 * savings, their standard deviation and standard error (sd / sqrt n).  The
 * pairs share a seed (warm start, task draws), so their difference carries
 * less of the seed-to-seed spread than a difference of means does. */
static void savings(json_t *out, const char *key, const json_t *a, const json_t *b, const char *field)
{
    json_object_set_new(out, key, json_real(1 - num(a, field) / num(b, field)));
    if (strcmp(field, "cost")) return;
    char k[64];
    snprintf(k, sizeof k, "%s_by_seed", key);
    json_t *arr = json_array();
    size_t n = json_array_size(json_object_get(a, "runs"));
    double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double v = 1 - num(json_array_get(json_object_get(a, "runs"), i), field) /
                           num(json_array_get(json_object_get(b, "runs"), i), field);
        json_array_append_new(arr, json_real(v));
        sum += v, sq += v * v, lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    json_object_set_new(out, k, arr);
    double mean = n ? sum / (double)n : 0, var = n > 1 ? (sq - (double)n * mean * mean) / (double)(n - 1) : 0;
    double sd = var > 0 ? sqrt(var) : 0;
    snprintf(k, sizeof k, "%s_paired", key);
    json_object_set_new(out, k, json_pack("{s:f,s:f,s:f,s:f,s:f,s:I}", "mean", mean, "sd", sd, "se",
                                          n ? sd / sqrt((double)n) : 0, "min", lo, "max", hi, "n", (json_int_t)n));
}

/* The step at which a run's curve first has the mean of its last w
 * evaluations at tau (the rule the runs stop by), -1 if never. */
static double crossing_step(const json_t *curve, int w, double tau)
{
    size_t n = json_array_size(curve);
    for (size_t i = (size_t)w - 1; i < n; i++) {
        double m = 0;
        for (size_t j = i + 1 - (size_t)w; j <= i; j++) m += json_number_value(json_array_get(json_array_get(curve, j), 1));
        if (m / w >= tau - 1e-12) return json_number_value(json_array_get(json_array_get(curve, i), 0));
    }
    return -1;
}

/* How the steps to a threshold vary over seeds, for thresholds up to the
 * target, read off the runs' curves (a run that stops at the target has
 * crossed every lower threshold on the way): where the learning curve is
 * steep, the crossing steps vary least (a low coefficient of variation),
 * and a target there makes "cost at equal reward" least noisy. */
static json_t *crossings(json_t *out, const char *const *names, double target, int w)
{
    json_t *arr = json_array();
    for (double tau = 0.40; tau <= target + 1e-9; tau += 0.025) {
        json_t *row = json_pack("{s:f}", "threshold", tau);
        for (int p = 0; p < NPOOL; p++) {
            double sum = 0, sq = 0;
            int n = 0;
            size_t i;
            json_t *r;
            json_array_foreach(json_object_get(json_object_get(out, names[p]), "runs"), i, r) {
                double st = crossing_step(json_object_get(r, "curve"), w, tau);
                if (st >= 0) sum += st, sq += st * st, n++;
            }
            double mean = n ? sum / n : 0, var = n > 1 ? (sq - n * mean * mean) / (n - 1) : 0;
            json_object_set_new(row, names[p], json_pack("{s:i,s:f,s:f}", "reached", n, "steps_mean", mean,
                                                         "steps_cv", mean > 0 && var > 0 ? sqrt(var) / mean : 0));
        }
        json_array_append_new(arr, row);
    }
    return arr;
}

/* The runs, NPOOL x seeds of them, each in its own process, up to `jobs`
 * at a time.  Running them side by side does not change the bill (it is
 * counted from the work done, and the emulated workers sleep), and each
 * run's worker processes are its own.  A child sends "S <step>" lines and
 * ends with "R <result JSON>" or "E <message>" on its pipe. */
typedef struct run_slot {
    pid_t pid;
    int fd, pool, seed, step;
    sh_buf in;
} run_slot;

static void run_child(const pool *p, uint64_t seed, double trainer_per_h, int fd)
{
    int rc = 0;
    json_t *r = run_pool(p, seed, trainer_per_h, &fd, &rc);
    char *s = r ? json_dumps(r, JSON_COMPACT) : NULL;
    if (s) dprintf(fd, "R %s\n", s);
    else dprintf(fd, "E %s\n", rc ? sh_errmsg() : "out of memory");
    _exit(s ? 0 : 1);
}

static int start_run(run_slot *sl, const pool *p, uint64_t seed, double trainer_per_h)
{
    int pfd[2];
    if (pipe(pfd)) return sh_err_errno(errno, "rl fleet-cost: pipe");
    fflush(NULL);
    sl->pid = fork();
    if (sl->pid < 0) {
        close(pfd[0]), close(pfd[1]);
        return sh_err_errno(errno, "rl fleet-cost: fork");
    }
    if (!sl->pid) {
        /* A run ends with the command (Ctrl-C, kill): its workers then see
         * their trainer's socket close and exit too. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1) _exit(1);
        close(pfd[0]), run_child(p, seed, trainer_per_h, pfd[1]);
    }
    close(pfd[1]);
    sl->fd = pfd[0], sl->step = 0, sl->in = (sh_buf){0};
    return 0;
}

/* Reads what a run sent; 1 when it has ended (its result in *res, or an
 * error recorded), 0 while it goes on. */
static int read_run(run_slot *sl, json_t **res, int *rc)
{
    char b[65536];
    ssize_t n = read(sl->fd, b, sizeof b);
    if (n < 0 && errno == EINTR) return 0;
    if (n > 0) {
        if (sh_buf_append(&sl->in, b, (size_t)n)) return *rc = SH_ENOMEM, 1;
        char *line = (char *)sl->in.data, *end = line + sl->in.len, *nl;
        while ((nl = memchr(line, '\n', (size_t)(end - line)))) {
            *nl = 0;
            if (line[0] == 'S') sl->step = atoi(line + 2);
            else if (line[0] == 'R') *res = json_loads(line + 2, 0, NULL);
            else if (line[0] == 'E') *rc = sh_err(SH_EIO, "rl fleet-cost: pool run, seed %d: %s", sl->seed, line + 2);
            if (line[0] != 'S') return 1;
            line = nl + 1;
        }
        memmove(sl->in.data, line, (size_t)(end - line));
        sl->in.len = (size_t)(end - line);
        return 0;
    }
    *rc = sh_err(SH_EIO, "rl fleet-cost: the run of seed %d ended without a result", sl->seed);
    return 1;
}

static void end_run(run_slot *sl)
{
    close(sl->fd);
    sh_buf_free(&sl->in);
    waitpid(sl->pid, NULL, 0);
    sl->pid = 0;
}

static int run_all(const pool *p, int seeds, uint64_t seed0, double trainer_per_h, int jobs, json_t **runs)
{
    int total = NPOOL * seeds, next = 0, live = 0, rc = 0, steps = p[0].c.steps;
    run_slot *sl = calloc((size_t)jobs, sizeof *sl);
    json_t **res = calloc((size_t)total, sizeof *res);
    uint64_t done = 0;
    sh_progress bar;
    if (!sl || !res) return free(sl), free(res), sh_err(SH_ENOMEM, "out of memory");
    sh_progress_start(&bar, "fleet-cost", (uint64_t)total * (uint64_t)steps, "steps");
    while ((next < total && !rc) || live) {
        struct pollfd pf[64];
        int np = 0;
        for (int j = 0; j < jobs; j++) {
            /* Pool-major: the uniform runs train each seed's warm start
             * and put it in the cache, the other pools load it.  The
             * order no longer matters to the timing: the trainer is paced
             * (train_cost) and the workers sleep. */
            if (!sl[j].pid && next < total && !rc) {
                sl[j].pool = next / seeds, sl[j].seed = next % seeds;
                if ((rc = start_run(&sl[j], &p[sl[j].pool], seed0 + (uint64_t)sl[j].seed, trainer_per_h))) continue;
                next++, live++;
            }
            if (sl[j].pid) pf[np++] = (struct pollfd){.fd = sl[j].fd, .events = POLLIN};
        }
        if (!np) break;
        if (poll(pf, (nfds_t)np, -1) < 0 && errno != EINTR) {
            rc = sh_err_errno(errno, "rl fleet-cost: poll");
            break;
        }
        uint64_t running = 0;
        for (int j = 0; j < jobs; j++) {
            if (!sl[j].pid) continue;
            json_t *r = NULL;
            int k = 0;
            for (int q = 0; q < np; q++) k |= pf[q].fd == sl[j].fd && pf[q].revents;
            if (k && read_run(&sl[j], &r, &rc)) {
                res[sl[j].seed * NPOOL + sl[j].pool] = r;
                if (!r && !rc) rc = sh_err(SH_EFORMAT, "rl fleet-cost: a run's result is not JSON");
                done += (uint64_t)steps, live--;
                end_run(&sl[j]);
            } else {
                running += (uint64_t)sl[j].step;
            }
        }
        sh_progress_update(&bar, done + running);
    }
    sh_progress_finish(&bar);
    for (int i = 0; i < total; i++)
        if (res[i]) json_array_append_new(runs[i % NPOOL], res[i]);
    free(sl), free(res);
    return rc;
}

int cli_rl_fleet_cost(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(usage, stdout), 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    opts o = {.ttype = "H100", .tg = 2, .seeds = 16, .thr = 3, .jobs = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int)ncpu};
    rl_config base;
    rl_config_default(&base);
    base.steps = 120, base.eval_every = 2, base.eval_n = 96, base.target_window = 3, base.quiet = 1, base.target_reward = 0.75;
    base.stop_at_target = 1, base.step_s = 0.008, base.seq_cost = 0.0625;
    base.ordered = 1; /* the same data in every pool: see usage */
    base.train_cost = 3;
    int rc = parse(argc, argv, &o, &base);
    if (rc) return rc;
    mj_fleet f;
    if ((rc = mj_fleet_load(o.fleet, o.speeds, &f)) < 0) return cli_fail("rl fleet-cost", rc);
    pool p[NPOOL] = {{"uniform", base}, {"mixed", base}, {"tuned", base}};
    for (int i = 0; i < NPOOL; i++) p[i].c.nworkers = 0;
    double tprice = 0;
    for (int i = 0; i < f.n; i++)
        if (!strcmp(f.nodes[i].gpu_type, o.ttype) && (!tprice || f.nodes[i].price < tprice)) tprice = f.nodes[i].price;
    rc = build_pools(&f, o.ttype, o.tg, o.thr, p);
    mj_fleet_free(&f);
    for (int i = 0; i < NPOOL && !rc; i++) rc = rl_config_check(&p[i].c);
    if (rc < 0) return cli_fail("rl fleet-cost", rc);
    char tmp[4096] = "";
    if (!o.warm_cache) { /* a warm start per seed, made once for the three pools */
        snprintf(tmp, sizeof tmp, "%s/shoal-fleet-cost-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(tmp)) return cli_fail("rl fleet-cost", sh_err_errno(errno, "rl fleet-cost: mkdtemp %s", tmp));
    }
    for (int i = 0; i < NPOOL; i++) p[i].c.warm_cache = o.warm_cache ? o.warm_cache : tmp;
    json_t *out = json_object(), *runs[NPOOL];
    for (int i = 0; i < NPOOL; i++) runs[i] = json_array();
    rc = run_all(p, o.seeds, base.seed, o.tg * tprice, o.jobs, runs);
    if (tmp[0]) sh_rm_rf(tmp);
    if (rc < 0) {
        for (int i = 0; i < NPOOL; i++) json_decref(runs[i]);
        json_decref(out);
        return cli_fail("rl fleet-cost", rc);
    }
    for (int i = 0; i < NPOOL; i++) json_object_set_new(out, p[i].name, summarise(&p[i], runs[i]));
    json_t *u = json_object_get(out, "uniform"), *m = json_object_get(out, "mixed"), *t = json_object_get(out, "tuned");
    savings(out, "mixed_saving", m, u, "cost");
    savings(out, "tuned_saving", t, u, "cost");
    savings(out, "tuned_vs_mixed", t, m, "cost");
    savings(out, "mixed_saving_total", m, u, "total_cost");
    savings(out, "tuned_saving_total", t, u, "total_cost");
    char setup[384];
    snprintf(setup, sizeof setup,
             "to held-out reward %.2f (cap %d steps), seeds %llu..%llu, rollout throughput %.2f x %s per pool, "
             "trainer %d x %s at $%.2f/h, emulated step %.4f s, seq cost %.3f, mean of %d evaluations every %d steps, "
             "max lag %d, train cost %.1f",
             base.target_reward, base.steps, (unsigned long long)base.seed,
             (unsigned long long)(base.seed + (uint64_t)o.seeds - 1), o.thr, o.ttype, o.tg, o.ttype, tprice,
             base.step_s, base.seq_cost, base.target_window ? base.target_window : 1, base.eval_every, base.max_lag,
             base.train_cost);
    json_object_set_new(out, "setup", json_string(setup));
    json_object_set_new(out, "target_reward", json_real(base.target_reward));
    static const char *const names[NPOOL] = {"uniform", "mixed", "tuned"};
    json_object_set_new(out, "crossings", crossings(out, names, base.target_reward,
                                                    base.target_window ? base.target_window : 1));
    json_object_set_new(out, "seeds", json_integer(o.seeds));
    if (o.json) sh_json_print(out);
    else print_table(&o, p, out);
    json_decref(out);
    return 0;
}
