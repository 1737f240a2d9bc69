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
 * the step cap.  Billing uses emulated GPU seconds counted from the work
 * done, never the wall clock: the pool's emulated time is the work its
 * workers did spread over the pool in proportion to their rates (an
 * elastic pool kept busy), and every worker is billed for that time. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    "  --target R          held-out reward every run trains to (0.7)\n"
    "  --max-steps N       step cap of a run that does not reach it (120)\n"
    "  --seeds N --seed S  N seeds from S (3, 1)\n"
    "  --step-s F          emulated seconds of a one-sequence decoding step on the\n"
    "                      training type (0.008)\n"
    "  --seq-cost F        cost of each further concurrent sequence, relative (0.0625)\n"
    "  --eval-every N      steps between held-out evaluations (2)\n"
    "  --eval-n N          held-out problems per evaluation (96)\n"
    "  --window N          the target is reached when the mean of the last N\n"
    "                      evaluations is at it (3)\n"
    "  --warm N            supervised warm-start steps before RL (70)\n";

enum { NPOOL = 3, MAX_SEEDS = 16 };

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

typedef struct prog {
    sh_progress *bar;
    uint64_t base;
} prog;

static void on_event(const json_t *ev, void *ctx)
{
    prog *p = ctx;
    if (!strcmp(json_string_value(json_object_get(ev, "event")) ?: "", "step"))
        sh_progress_update(p->bar, p->base + (uint64_t)json_integer_value(json_object_get(ev, "step")));
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
static json_t *run_pool(const pool *p, uint64_t seed, double trainer_per_h, prog *pg, int *rc)
{
    rl_config c = p->c;
    c.seed = seed;
    json_t *res = NULL;
    if ((*rc = rl_run(&c, on_event, pg, &res))) return NULL;
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
    json_array_foreach(runs, i, r) reached += json_is_true(json_object_get(r, "reached"));
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
    json_object_set_new(o, "spread", sp);
    json_object_set_new(o, "runs", runs);
    return o;
}

typedef struct opts {
    const char *fleet, *speeds, *ttype;
    int tg, seeds, json;
    double thr;
} opts;

static int parse(int argc, char **argv, opts *o, rl_config *c)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t k = 0;
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
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
        printf("%-8s %-20s %-20s %7.2f %6.1f %9.3f %8.0f %8.1f %9.4f %9.4f %9.4f  (cost %.4f..%.4f, %lld/%d reached)\n",
               p[i].name, p[i].desc, req, p[i].per_h, num(r, "steps"), num(r, "reward_end"), num(r, "trajectories"),
               num(r, "emulated_s"), num(r, "cost"), num(r, "cost_per_1k_trajectories"), num(r, "total_cost"),
               num(sp, "min"), num(sp, "max"), (long long)json_integer_value(json_object_get(r, "reached")), o->seeds);
    }
    printf("mixed saving %.1f%% (total %.1f%%), tuned saving %.1f%% (total %.1f%%), tuned vs mixed %.1f%%\n",
           100 * num(out, "mixed_saving"), 100 * num(out, "mixed_saving_total"), 100 * num(out, "tuned_saving"),
           100 * num(out, "tuned_saving_total"), 100 * num(out, "tuned_vs_mixed"));
}

/* Savings (1 - a/b) of the means and of each seed's pair of runs. */
static void savings(json_t *out, const char *key, const json_t *a, const json_t *b, const char *field)
{
    json_object_set_new(out, key, json_real(1 - num(a, field) / num(b, field)));
    if (strcmp(field, "cost")) return;
    char k[64];
    snprintf(k, sizeof k, "%s_by_seed", key);
    json_t *arr = json_array();
    for (size_t i = 0; i < json_array_size(json_object_get(a, "runs")); i++)
        json_array_append_new(arr, json_real(1 - num(json_array_get(json_object_get(a, "runs"), i), field) /
                                                     num(json_array_get(json_object_get(b, "runs"), i), field)));
    json_object_set_new(out, k, arr);
}

int cli_rl_fleet_cost(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(usage, stdout), 0;
    opts o = {.ttype = "H100", .tg = 2, .seeds = 3, .thr = 3};
    rl_config base;
    rl_config_default(&base);
    base.steps = 120, base.eval_every = 2, base.eval_n = 96, base.target_window = 3, base.quiet = 1, base.target_reward = 0.7;
    base.stop_at_target = 1, base.step_s = 0.008, base.seq_cost = 0.0625;
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
    sh_progress bar;
    sh_progress_start(&bar, "fleet-cost", (uint64_t)NPOOL * o.seeds * base.steps, "steps");
    json_t *out = json_object(), *runs[NPOOL];
    for (int i = 0; i < NPOOL; i++) runs[i] = json_array();
    /* Seed-major, so that a slow stretch of the machine hits every pool. */
    for (int s = 0; s < o.seeds && !rc; s++)
        for (int i = 0; i < NPOOL && !rc; i++) {
            prog pg = {&bar, (uint64_t)(s * NPOOL + i) * base.steps};
            json_t *r = run_pool(&p[i], base.seed + (uint64_t)s, o.tg * tprice, &pg, &rc);
            if (r) json_array_append_new(runs[i], r);
        }
    sh_progress_finish(&bar);
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
             "trainer %d x %s at $%.2f/h, emulated step %.4f s, seq cost %.3f, mean of %d evaluations every %d steps",
             base.target_reward, base.steps, (unsigned long long)base.seed,
             (unsigned long long)(base.seed + (uint64_t)o.seeds - 1), o.thr, o.ttype, o.tg, o.ttype, tprice,
             base.step_s, base.seq_cost, base.target_window ? base.target_window : 1, base.eval_every);
    json_object_set_new(out, "setup", json_string(setup));
    json_object_set_new(out, "target_reward", json_real(base.target_reward));
    json_object_set_new(out, "seeds", json_integer(o.seeds));
    if (o.json) sh_json_print(out);
    else print_table(&o, p, out);
    json_decref(out);
    return 0;
}
