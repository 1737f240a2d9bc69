/* The fleet-cost experiment (`shoal rl fleet-cost`): the same training, to the same target reward, on
 * three rollout pools (docs/mainjob.md, "The cost experiment").
 *
 *   uniform  workers of the training GPU type only, enough for the target
 *            rollout throughput (in units of one training GPU);
 *   mixed    the fleet's GPUs taken in order of price per unit of
 *            throughput (price / declared speed: the order in which the
 *            scheduler grows an elastic job, src/control/sched/cycle.c) until they
 *            add up to the same throughput, the trainer's GPUs excepted;
 *            every worker with the run's request size, as uniform;
 *   tuned    the mixed pool with a request size and so a concurrency per
 *            GPU type (mj_tune: the most throughput within the staleness
 *            bound, each type's memory limiting its concurrent sequences).
 *
 * Each pool runs the RL engine's paced run (rl_paced_run: the trainer and
 * the workers in one process, in emulated time: a request lasts its
 * emulated GPU seconds, a training step train_s) from each seed until the
 * held-out reward reaches the target, or the step cap.  Nothing depends on
 * the clock, the load or the order in which runs finish, so a seed gives
 * the same figures on every run, bit for bit (tests/test_mainjob_cost.c);
 * only the experiment's wall_s varies.  Runs are ordered (rl_config.ordered): from one seed, every
 * pool trains on the same problems with the same sampling streams in the
 * same batches, and differs only in which versions generated them (its
 * staleness), so that comparing pools seed by seed compares the pools,
 * not two draws of an RL run's luck.  Billing uses emulated GPU seconds counted from the work
 * done, never the wall clock: the pool's emulated time is the work its
 * workers did spread over the pool in proportion to their rates (an
 * elastic pool kept busy), and every worker is billed for that time. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fleetcost_int.h"

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

/* In a run's process: each step reported to the fan-out's parent. */
static void on_event(const json_t *ev, void *ctx)
{
    if (!strcmp(json_string_value(json_object_get(ev, "event")) ?: "", "step"))
        sh_fanout_step(*(int *)ctx, (int)json_integer_value(json_object_get(ev, "step")));
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
    if ((*rc = rl_paced_run(&c, on_event, fd, &res))) return NULL;
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
    json_t *o = json_pack("{s:I,s:b,s:I,s:f,s:f,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:o,s:o}", "seed",
                          (json_int_t)seed, "reached", num(res, "time_to_target_s") >= 0, "steps",
                          (json_int_t)steps, "reward_start", num(res, "reward_start"), "reward_end",
                          num(res, "reward_end"), "trajectories", (json_int_t)accepted, "generated",
                          (json_int_t)generated, "dropped_stale",
                          json_integer_value(json_object_get(res, "dropped_stale")), "emulated_s", t,
                          "cost", cost, "total_cost", cost + trainer_per_h * t / 3600,
                          "cost_per_1k_trajectories", 1000 * cost / (double)accepted,
                          "gpu_s_by_type", gpu_s, "staleness_hist",
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
                                       "emulated_s", "cost_per_1k_trajectories", "generated"};
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

typedef struct fc_run {
    const pool *p;
    int seeds;
    uint64_t seed0;
    double trainer_per_h;
} fc_run;

/* Task t of the fan-out: pool t / seeds (pool-major: the uniform runs train
 * each seed's warm start and put it in the cache, the other pools load it),
 * seed t % seeds. */
static json_t *fc_task(void *arg, int t, int fd, int *rc)
{
    const fc_run *f = arg;
    return run_pool(&f->p[t / f->seeds], f->seed0 + (uint64_t)(t % f->seeds), f->trainer_per_h, &fd, rc);
}

void mj_fleetcost_default(mj_fleetcost_opts *o, rl_config *base)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (mj_fleetcost_opts){.ttype = "H100", .tg = 2, .seeds = 16, .thr = 3,
                             .jobs = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int)ncpu};
    rl_config_default(base);
    base->steps = 120, base->eval_every = 2, base->eval_n = 96, base->target_window = 3, base->quiet = 1;
    base->target_reward = 0.75, base->stop_at_target = 1, base->step_s = 0.008, base->seq_cost = 0.0625;
    base->ordered = 1; /* the same data in every pool */
    base->train_s = 0.2;
}

int mj_fleet_cost(const mj_fleetcost_opts *o, const rl_config *base0, sh_units_fn progress, void *parg,
                  json_t **result)
{
    *result = NULL;
    rl_config base = *base0;
    if (o->seeds < 1 || o->seeds > MAX_SEEDS) return sh_err(SH_EINVAL, "fleet cost: seeds must be 1..%d", MAX_SEEDS);
    mj_fleet f;
    int rc = mj_fleet_load(o->fleet, o->speeds, &f);
    if (rc < 0) return rc;
    pool p[NPOOL] = {{"uniform", base}, {"mixed", base}, {"tuned", base}};
    for (int i = 0; i < NPOOL; i++) p[i].c.nworkers = 0;
    double tprice = 0;
    for (int i = 0; i < f.n; i++)
        if (!strcmp(f.nodes[i].gpu_type, o->ttype) && (!tprice || f.nodes[i].price < tprice)) tprice = f.nodes[i].price;
    rc = build_pools(&f, o->ttype, o->tg, o->thr, p);
    mj_fleet_free(&f);
    for (int i = 0; i < NPOOL && !rc; i++) rc = rl_config_check(&p[i].c);
    if (rc < 0) return rc;
    char tmp[4096] = "";
    if (!o->warm_cache) { /* a warm start per seed, made once for the three pools */
        snprintf(tmp, sizeof tmp, "%s/shoal-fleet-cost-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(tmp)) return sh_err_errno(errno, "fleet cost: mkdtemp %s", tmp);
    }
    for (int i = 0; i < NPOOL; i++) p[i].c.warm_cache = o->warm_cache ? o->warm_cache : tmp;
    int total = NPOOL * o->seeds;
    json_t **res = calloc((size_t)total, sizeof *res);
    if (!res) rc = sh_err(SH_ENOMEM, "fleet cost");
    fc_run fr = {p, o->seeds, base.seed, o->tg * tprice};
    double t0 = sh_now_mono();
    if (!rc) rc = sh_fanout(total, o->jobs, base.steps, fc_task, &fr, progress, parg, res);
    double wall_s = sh_now_mono() - t0;
    if (tmp[0]) sh_rm_rf(tmp);
    json_t *out = json_object(), *runs[NPOOL];
    for (int i = 0; i < NPOOL; i++) runs[i] = json_array();
    for (int s = 0; res && s < o->seeds; s++)
        for (int i = 0; i < NPOOL; i++)
            if (res[i * o->seeds + s]) json_array_append_new(runs[i], res[i * o->seeds + s]);
    free(res);
    if (rc < 0) {
        for (int i = 0; i < NPOOL; i++) json_decref(runs[i]);
        json_decref(out);
        return rc;
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
             "max lag %d, training step %.3f s%s",
             base.target_reward, base.steps, (unsigned long long)base.seed,
             (unsigned long long)(base.seed + (uint64_t)o->seeds - 1), o->thr, o->ttype, o->tg, o->ttype, tprice,
             base.step_s, base.seq_cost, base.target_window ? base.target_window : 1, base.eval_every, base.max_lag,
             base.train_s, base.ordered ? "" : ", unordered");
    json_object_set_new(out, "setup", json_string(setup));
    json_object_set_new(out, "target_reward", json_real(base.target_reward));
    static const char *const names[NPOOL] = {"uniform", "mixed", "tuned"};
    json_object_set_new(out, "crossings", crossings(out, names, base.target_reward,
                                                    base.target_window ? base.target_window : 1));
    json_object_set_new(out, "seeds", json_integer(o->seeds));
    json_object_set_new(out, "wall_s", json_real(wall_s)); /* the only figure the machine sets */
    *result = out;
    return 0;
}
