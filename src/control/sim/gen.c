/* Workload transforms: single-node traces made multi-node, and a synthetic
 * generator calibrated to the published shape of InternLM's Kalos cluster
 * (26.8 GPUs per job on average, up to 1,024). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/common.h"
#include "shoal/sim.h"

int sim_trace_multinode(sim_trace *t, int k, int node_gpus)
{
    if (k < 1 || node_gpus < 1 || node_gpus > SCHED_MAX_NODE_GPUS)
        return sh_err(SH_EINVAL, "multi-node: factor must be >= 1 and node GPUs 1..%d", SCHED_MAX_NODE_GPUS);
    for (size_t i = 0; i < t->n; i++) {
        sim_job *j = &t->jobs[i];
        if (j->kind != SCHED_GANG) continue;
        long gpus = (long)j->nodes * j->gpus_per_node * k;
        if (gpus <= node_gpus) j->nodes = 1, j->gpus_per_node = (int)gpus;
        else j->nodes = (int)((gpus + node_gpus - 1) / node_gpus), j->gpus_per_node = node_gpus;
        if (j->nodes > 4096) return sh_err(SH_ERANGE, "multi-node: job %s would need %d nodes", j->id, j->nodes);
        j->max_replicas = j->nodes;
    }
    return 0;
}

/* splitmix64: small, fast, and good enough for workload sampling. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0; }

static double rng_normal(uint64_t *s)
{
    return sqrt(-2.0 * log(rng_unit(s))) * cos(2 * M_PI * rng_unit(s));
}

#define KALOS_MEAN 26.8
#define KALOS_SIZES 11 /* 2^0 .. 2^10 GPUs */
#define KALOS_SINGLE 0.5 /* share of single-GPU jobs (evaluation, debugging) */

/* P(2^k GPUs): KALOS_SINGLE for k = 0, and the rest in proportion to r^k;
 * r is found by bisection so that the mean is exactly KALOS_MEAN. */
static void kalos_dist(double p[KALOS_SIZES])
{
    double lo = 0.01, hi = 1.0;
    for (int it = 0; it < 100; it++) {
        double r = (lo + hi) / 2, z = 0, m = 0;
        for (int k = 1; k < KALOS_SIZES; k++) z += pow(r, k), m += pow(r, k) * ldexp(1, k);
        double mean = KALOS_SINGLE + (1 - KALOS_SINGLE) * m / z;
        if (mean < KALOS_MEAN) lo = r;
        else hi = r;
    }
    double r = (lo + hi) / 2, z = 0;
    for (int k = 1; k < KALOS_SIZES; k++) z += pow(r, k);
    p[0] = KALOS_SINGLE;
    for (int k = 1; k < KALOS_SIZES; k++) p[k] = (1 - KALOS_SINGLE) * pow(r, k) / z;
}

int sim_trace_kalos(sim_trace *t, size_t n, uint64_t seed, int fleet_gpus, double load)
{
    if (!n || fleet_gpus < 1 || !(load > 0))
        return sh_err(SH_EINVAL, "kalos: need jobs > 0, fleet GPUs > 0 and load > 0");
    double p[KALOS_SIZES];
    kalos_dist(p);
    if (t->n + n > t->cap) {
        sim_job *v = realloc(t->jobs, (t->n + n) * sizeof *v);
        if (!v) return sh_err(SH_ENOMEM, "kalos: out of memory");
        t->jobs = v, t->cap = t->n + n;
    }
    uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
    double gpu_s = 0;
    sim_job *jobs = t->jobs + t->n;
    for (size_t i = 0; i < n; i++) {
        sim_job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        double u = rng_unit(&s);
        int k = 0;
        while (k < KALOS_SIZES - 1 && u > p[k]) u -= p[k++];
        int gpus = 1 << k;
        snprintf(j->id, SIM_NAME, "kalos-%zu", i);
        snprintf(j->tenant, SIM_NAME, "t%d", (int)(rng_next(&s) % 4));
        j->kind = SCHED_GANG;
        j->nodes = gpus <= 8 ? 1 : gpus / 8;
        j->gpus_per_node = gpus <= 8 ? gpus : 8;
        j->max_replicas = j->nodes;
        /* Log-normal run time, longer for larger jobs (pretraining vs.
         * evaluation), capped at a week. */
        double median = 900.0 * (1 + k);
        j->duration_s = fmin(median * exp(1.2 * rng_normal(&s)), 7 * 86400.0);
        gpu_s += j->duration_s * gpus;
    }
    /* Poisson arrivals at the rate that offers `load` of the fleet. */
    double rate = load * fleet_gpus / (gpu_s / (double)n), now = 0;
    for (size_t i = 0; i < n; i++) {
        now += -log(rng_unit(&s)) / rate;
        jobs[i].submit_s = now;
    }
    t->n += n;
    return 0;
}

/* ---- Mixed fleets and workloads --------------------------------------------- */

/* The GPU types of a mixed fleet, their share of its nodes and their
 * throughput relative to the fastest (what a job lists as its speeds). */
static const struct {
    const char *type;
    double share, speed, price;
} mix_types[] = {{"H100", 0.3, 1.0, 2.50}, {"A100", 0.4, 0.6, 1.50}, {"L4", 0.3, 0.25, 0.80}};
#define MIX_TYPES 3
#define MIX_ZONES 3

int sim_fleet_mixed(sim_fleet *f, int nodes, int fabric_nodes)
{
    if (nodes < MIX_TYPES || fabric_nodes < 1)
        return sh_err(SH_EINVAL, "mixed fleet: need >= %d nodes and >= 1 node per fabric", MIX_TYPES);
    memset(f, 0, sizeof *f);
    f->nodes = calloc((size_t)nodes, sizeof *f->nodes);
    if (!f->nodes) return sh_err(SH_ENOMEM, "mixed fleet: out of memory");
    int done = 0;
    for (int t = 0; t < MIX_TYPES; t++) {
        int n = t == MIX_TYPES - 1 ? nodes - done : (int)(nodes * mix_types[t].share);
        for (int k = 0; k < n; k++) {
            sim_node *x = &f->nodes[f->n++];
            int fab = k / fabric_nodes;
            snprintf(x->id, SIM_NAME, "%s-f%d-n%d", mix_types[t].type, fab, k % fabric_nodes);
            snprintf(x->zone, SIM_NAME, "z%d", (fab + t) % MIX_ZONES);
            snprintf(x->fabric, SIM_NAME, "%s-f%d", mix_types[t].type, fab);
            snprintf(x->gpu_type, SIM_NAME, "%s", mix_types[t].type);
            x->gpus = 8, x->price_per_gpu_hour = mix_types[t].price;
        }
        done += n;
    }
    return 0;
}

static double lognormal(uint64_t *s, double median, double sigma, double cap)
{
    return fmin(median * exp(sigma * rng_normal(s)), cap);
}

/* Lists the types from `first` on (in speed order), each at its speed. */
static void mix_types_from(sim_job *j, int first)
{
    for (int t = first; t < MIX_TYPES; t++) {
        snprintf(j->gpu_types[j->n_types], SIM_NAME, "%s", mix_types[t].type);
        j->speed[j->n_types++] = mix_types[t].speed / mix_types[first].speed;
    }
}

/* Gang sizes in nodes: half single-node, then 2-4, 5-16 and 17-64 with
 * falling weights (uniform within each range). */
static int mix_gang_nodes(uint64_t *s)
{
    double u = rng_unit(s);
    if (u < 0.50) return 1;
    if (u < 0.80) return 2 + (int)(rng_next(s) % 3);
    if (u < 0.94) return 5 + (int)(rng_next(s) % 12);
    return 17 + (int)(rng_next(s) % 48);
}

int sim_trace_mixed(sim_trace *t, size_t n, uint64_t seed, int fleet_gpus, double load)
{
    if (!n || fleet_gpus < 1 || !(load > 0))
        return sh_err(SH_EINVAL, "mixed trace: need jobs > 0, fleet GPUs > 0 and load > 0");
    if (t->n + n > t->cap) {
        sim_job *v = realloc(t->jobs, (t->n + n) * sizeof *v);
        if (!v) return sh_err(SH_ENOMEM, "mixed trace: out of memory");
        t->jobs = v, t->cap = t->n + n;
    }
    /* The seed is hashed into the state: started at seed x golden, seed
     * k + 1's stream was seed k's one draw later, and "another seed" gave
     * the same workload shifted by a job. */
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 3;
    s = rng_next(&s);
    double gpu_s = 0;
    sim_job *jobs = t->jobs + t->n;
    for (size_t i = 0; i < n; i++) {
        sim_job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        double u = rng_unit(&s);
        snprintf(j->id, SIM_NAME, "mix-%zu", i);
        snprintf(j->tenant, SIM_NAME, "t%d", (int)(rng_next(&s) % 6));
        j->priority = (int)(rng_next(&s) % 3);
        if (u < 0.45) { /* a serverless call: one GPU, seconds to minutes, any type */
            j->kind = SCHED_FUNCTION, j->nodes = j->max_replicas = j->gpus_per_node = 1;
            j->duration_s = lognormal(&s, 120, 1.0, 3600);
        } else if (u < 0.60) { /* rollouts or serving: min..max replicas */
            j->kind = SCHED_ELASTIC;
            j->nodes = 1 + (int)(rng_next(&s) % 4);
            j->max_replicas = j->nodes * (2 + (int)(rng_next(&s) % 3));
            j->gpus_per_node = 1 << (rng_next(&s) % 4);
            j->duration_s = lognormal(&s, 3600, 1.0, 2 * 86400.0);
            mix_types_from(j, 0);
        } else {
            j->kind = SCHED_GANG;
            j->nodes = j->max_replicas = mix_gang_nodes(&s);
            j->gpus_per_node = j->nodes > 1 ? 8 : 1 << (rng_next(&s) % 4);
            /* Larger gangs run longer (pretraining vs fine-tuning). */
            j->duration_s = lognormal(&s, 1800.0 * (1 + log2((double)j->nodes)), 1.2, 7 * 86400.0);
            /* The fastest types only for large gangs; smaller ones accept slower. */
            mix_types_from(j, j->nodes > 16 ? 0 : (int)(rng_next(&s) % 2));
        }
        gpu_s += j->duration_s * j->nodes * j->gpus_per_node;
    }
    double rate = load * fleet_gpus / (gpu_s / (double)n), now = 0;
    for (size_t i = 0; i < n; i++) {
        now += -log(rng_unit(&s)) / rate;
        jobs[i].submit_s = now;
    }
    t->n += n;
    return 0;
}
