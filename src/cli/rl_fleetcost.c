/* shoal rl fleet-cost: the same training on three rollout pools.
 *
 *   uniform  workers of the training GPU type only, enough for the target
 *            rollout throughput (in units of one training GPU);
 *   mixed    the fleet's GPUs taken in order of price per unit of
 *            throughput (price / declared speed: the order in which the
 *            scheduler grows an elastic job, src/sched/cycle.c) until they
 *            add up to the same throughput, the trainer's GPUs excepted;
 *   tuned    the mixed pool with a request size (prompts per batch) per
 *            GPU type, proportional to its speed, so that fast GPUs run
 *            larger batches and slow ones finish theirs within the
 *            staleness bound.
 *
 * Each runs the RL engine (rl_run, forked workers emulating their GPU
 * speed) for the same steps from the same seed.  Costs are the pool's
 * price per hour times the RL wall time (a rented GPU is paid busy or not);
 * the total adds the trainer's GPUs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_rl.h"
#include "shoal/mainjob.h"

static const char usage[] =
    "usage: shoal rl fleet-cost --fleet FLEET.csv --speeds SPEEDS.csv [options] [--json]\n"
    "The same RL training on a uniform pool of the training GPU type, on the\n"
    "mixed pool the scheduler would pick (cheapest per unit of throughput\n"
    "first), and on that pool with per-type request sizes; cost per accepted\n"
    "trajectory and total cost of each.\n\n"
    "  --train-type T      the training GPU type (H100)\n"
    "  --trainer-gpus N    GPUs of the trainer gang, kept out of the pools (2)\n"
    "  --throughput X      rollout throughput of each pool in training GPUs (3)\n"
    "  --steps N --seed S  RL steps (60) and seed (1) of every run\n"
    "  --gen-cost F        emulated GPU time per CPU second of decoding (3)\n";

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

static void add_worker(pool *p, const char *type, double speed, double price)
{
    rl_worker_spec *w = &p->c.workers[p->c.nworkers++];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", type);
    w->speed = speed, w->price = price;
    p->per_h += price;
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

static int build_pools(const mj_fleet *f, const char *ttype, int tgpus, double thr, pool *u, pool *m, pool *t)
{
    double tspeed = mj_fleet_speed(f, ttype), tprice = 0;
    if (tspeed <= 0) return sh_err(SH_ENOENT, "training type %s is not in the fleet", ttype);
    gpu *g = calloc(1024, sizeof *g);
    int ng = 0, skip = tgpus;
    if (!g) return sh_err(SH_ENOMEM, "out of memory");
    for (int i = 0; i < f->n; i++) {
        const mj_node *n = &f->nodes[i];
        if (!strcmp(n->gpu_type, ttype) && (tprice == 0 || n->price < tprice)) tprice = n->price;
        for (int k = 0; k < n->gpus && ng < 1024; k++) {
            if (!strcmp(n->gpu_type, ttype) && skip > 0) { /* the trainer's */
                skip--;
                continue;
            }
            g[ng++] = (gpu){n, n->price / n->speed};
        }
    }
    qsort(g, (size_t)ng, sizeof *g, cmp_gpu);
    double got = 0;
    while (got + 1e-9 < thr && u->c.nworkers < RL_MAX_WORKERS) {
        add_worker(u, ttype, tspeed, tprice);
        got += tspeed;
    }
    got = 0;
    for (int i = 0; i < ng && got + 1e-9 < thr && m->c.nworkers < RL_MAX_WORKERS; i++) {
        add_worker(m, g[i].n->gpu_type, g[i].n->speed, g[i].n->price);
        add_worker(t, g[i].n->gpu_type, g[i].n->speed, g[i].n->price);
        got += g[i].n->speed;
    }
    free(g);
    if (got + 1e-9 < thr)
        return sh_err(SH_ERANGE, "the fleet's GPUs add up to a throughput of %.2f, less than --throughput %.2f",
                      got, thr);
    /* Per-type batches: prompts per request proportional to speed (2 at
     * the training type's speed), at least one. */
    for (int i = 0; i < t->c.nworkers; i++) {
        int rp = (int)lround(2 * t->c.workers[i].speed / tspeed);
        t->c.workers[i].req_prompts = rp < 1 ? 1 : rp > t->c.prompts_per_step ? t->c.prompts_per_step : rp;
    }
    describe(u), describe(m), describe(t);
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

static json_t *run_pool(pool *p, double trainer_per_h, prog *pg, int *rc)
{
    json_t *res = NULL;
    *rc = rl_run(&p->c, on_event, pg, &res);
    if (*rc) return NULL;
    double wall = json_number_value(json_object_get(res, "wall_s"));
    double cost = p->per_h * wall / 3600, total = cost + trainer_per_h * wall / 3600;
    long accepted = (long)json_integer_value(json_object_get(res, "steps")) * p->c.prompts_per_step * p->c.group;
    long generated = 0;
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(res, "workers"), i, w) generated += (long)json_integer_value(json_object_get(w, "trajectories"));
    json_t *o = json_pack("{s:s,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:o}", "workers", p->desc,
                          "rollout_per_h", p->per_h, "wall_s", wall, "reward_start",
                          json_number_value(json_object_get(res, "reward_start")), "reward_end",
                          json_number_value(json_object_get(res, "reward_end")), "trajectories",
                          (json_int_t)accepted, "generated", (json_int_t)generated, "dropped_stale",
                          json_integer_value(json_object_get(res, "dropped_stale")), "cost", cost,
                          "total_cost", total, "cost_per_1k_trajectories", 1000 * cost / (double)accepted,
                          "time_to_target_s", json_number_value(json_object_get(res, "time_to_target_s")),
                          "staleness_hist", json_incref(json_object_get(res, "staleness_hist")));
    json_decref(res);
    return o;
}

static int parse(int argc, char **argv, const char **fleet, const char **speeds, const char **ttype, int *tg,
                 double *thr, rl_config *c, int *json)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t k;
        if (!strcmp(a, "--json")) { *json = 1; continue; }
        if (!v) return cli_usage("rl fleet-cost", "unknown option or missing value \"%s\"", a);
        int rc = 0;
        if (!strcmp(a, "--fleet")) *fleet = v;
        else if (!strcmp(a, "--speeds")) *speeds = v;
        else if (!strcmp(a, "--train-type")) *ttype = v;
        else if (!strcmp(a, "--trainer-gpus")) rc = sh_parse_i64(v, &k, a), *tg = (int)k;
        else if (!strcmp(a, "--throughput")) rc = sh_parse_double(v, thr, a);
        else if (!strcmp(a, "--steps")) rc = sh_parse_i64(v, &k, a), c->steps = (int)k;
        else if (!strcmp(a, "--seed")) rc = sh_parse_i64(v, &k, a), c->seed = (uint64_t)k;
        else if (!strcmp(a, "--gen-cost")) rc = sh_parse_double(v, &c->gen_cost, a);
        else return cli_usage("rl fleet-cost", "unknown option \"%s\"", a);
        if (rc < 0) return cli_usage("rl fleet-cost", "%s", sh_errmsg());
        i++;
    }
    if (!*fleet || !*speeds) return cli_usage("rl fleet-cost", "--fleet and --speeds are required");
    if (!(*thr > 0) || *tg < 0) return cli_usage("rl fleet-cost", "--throughput must be > 0 and --trainer-gpus >= 0");
    return 0;
}

int cli_rl_fleet_cost(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(usage, stdout), 0;
    const char *fleet = NULL, *speeds = NULL, *ttype = "H100";
    int tg = 2, json = 0;
    double thr = 3;
    rl_config base;
    rl_config_default(&base);
    base.steps = 60, base.eval_every = 20, base.eval_n = 64, base.quiet = 1;
    int rc = parse(argc, argv, &fleet, &speeds, &ttype, &tg, &thr, &base, &json);
    if (rc) return rc;
    mj_fleet f;
    if ((rc = mj_fleet_load(fleet, speeds, &f)) < 0) return cli_fail("rl fleet-cost", rc);
    pool p[3] = {{"uniform", base}, {"mixed", base}, {"tuned", base}};
    for (int i = 0; i < 3; i++) p[i].c.nworkers = 0;
    double tprice = 0;
    for (int i = 0; i < f.n; i++)
        if (!strcmp(f.nodes[i].gpu_type, ttype) && (!tprice || f.nodes[i].price < tprice)) tprice = f.nodes[i].price;
    rc = build_pools(&f, ttype, tg, thr, &p[0], &p[1], &p[2]);
    mj_fleet_free(&f);
    if (!rc) rc = rl_config_check(&p[1].c);
    if (rc < 0) return cli_fail("rl fleet-cost", rc);
    sh_progress bar;
    sh_progress_start(&bar, "fleet-cost", 3 * (uint64_t)base.steps, "steps");
    json_t *out = json_object(), *r[3] = {0};
    for (int i = 0; i < 3 && !rc; i++) {
        prog pg = {&bar, (uint64_t)i * base.steps};
        r[i] = run_pool(&p[i], tg * tprice, &pg, &rc);
        if (r[i]) json_object_set_new(out, p[i].name, r[i]);
    }
    sh_progress_finish(&bar);
    if (rc < 0) {
        json_decref(out);
        return cli_fail("rl fleet-cost", rc);
    }
    double cu = json_number_value(json_object_get(r[0], "cost")), tu = json_number_value(json_object_get(r[0], "total_cost"));
    json_object_set_new(out, "mixed_saving", json_real(1 - json_number_value(json_object_get(r[1], "cost")) / cu));
    json_object_set_new(out, "tuned_saving", json_real(1 - json_number_value(json_object_get(r[2], "cost")) / cu));
    json_object_set_new(out, "mixed_saving_total", json_real(1 - json_number_value(json_object_get(r[1], "total_cost")) / tu));
    json_object_set_new(out, "tuned_saving_total", json_real(1 - json_number_value(json_object_get(r[2], "total_cost")) / tu));
    char setup[256];
    snprintf(setup, sizeof setup, "%d steps, seed %llu, rollout throughput %.2f x %s per pool, trainer %d x %s at $%.2f/h",
             base.steps, (unsigned long long)base.seed, thr, ttype, tg, ttype, tprice);
    json_object_set_new(out, "setup", json_string(setup));
    if (json) {
        sh_json_print(out);
    } else {
        printf("%s\n%-8s %-22s %8s %8s %8s %8s %10s %10s %10s\n", setup, "pool", "workers", "$/h", "wall s",
               "reward", "accepted", "cost $", "$/1k traj", "total $");
        for (int i = 0; i < 3; i++)
            printf("%-8s %-22s %8.2f %8.1f %8.3f %8lld %10.4f %10.4f %10.4f\n", p[i].name, p[i].desc, p[i].per_h,
                   json_number_value(json_object_get(r[i], "wall_s")), json_number_value(json_object_get(r[i], "reward_end")),
                   (long long)json_integer_value(json_object_get(r[i], "trajectories")),
                   json_number_value(json_object_get(r[i], "cost")),
                   json_number_value(json_object_get(r[i], "cost_per_1k_trajectories")),
                   json_number_value(json_object_get(r[i], "total_cost")));
        printf("mixed saving %.1f%% (total %.1f%%), tuned saving %.1f%% (total %.1f%%)\n",
               100 * json_number_value(json_object_get(out, "mixed_saving")),
               100 * json_number_value(json_object_get(out, "mixed_saving_total")),
               100 * json_number_value(json_object_get(out, "tuned_saving")),
               100 * json_number_value(json_object_get(out, "tuned_saving_total")));
    }
    json_decref(out);
    return 0;
}
