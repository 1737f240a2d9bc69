/* shoal bench sched: placement decisions per second of the scheduling core
 * with 10,000 nodes and 10,000 queued jobs, against a naive scan measured
 * in the same run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "shoal/sched.h"

const char cli_bench_help_sched[] =
    "scheduler decisions/s with 10k nodes and 10k queued jobs vs a naive scan [--json]";

#define TYPES 3
static const char *const types[TYPES] = {"h100", "a100", "l4"};

typedef struct bjob {
    int nodes, gpn, type; /* type < 0: any */
    double est;
} bjob;

static uint64_t rng = 88172645463325252ull;
static uint64_t next_u(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* The job mix: mostly single-node jobs, a third small gangs, a tail of
 * large gangs (up to 64 nodes), like the multi-node Philly traces. */
static bjob make_job(void)
{
    bjob b;
    uint64_t r = next_u() % 100;
    if (r < 60) b.nodes = 1, b.gpn = 1 << (next_u() % 4);
    else if (r < 90) b.nodes = 2 + (int)(next_u() % 7), b.gpn = 8;
    else b.nodes = 16 << (next_u() % 3), b.gpn = 8;
    b.type = next_u() % 4 == 0 ? -1 : (int)(next_u() % TYPES);
    b.est = 600 + (double)(next_u() % 36000);
    return b;
}

static void add_fleet(sched *s, int nodes)
{
    for (int i = 0; i < nodes; i++) {
        char id[32], zone[8], fabric[32];
        int t = i % TYPES, f = i / (TYPES * 100); /* fabrics of 100 nodes per type */
        snprintf(id, sizeof id, "n%05d", i);
        snprintf(zone, sizeof zone, "z%d", f % 2);
        snprintf(fabric, sizeof fabric, "%s-f%d", types[t], f);
        sched_node_spec n = {id, zone, fabric, types[t], 8, 2.0};
        sched_node_add(s, &n, 0);
    }
}

static int submit(sched *s, int k, const bjob *b, double now)
{
    char id[32];
    snprintf(id, sizeof id, "j%07d", k);
    sched_job_spec j;
    memset(&j, 0, sizeof j);
    j.id = id, j.kind = SCHED_GANG, j.nodes = b->nodes, j.gpus_per_node = b->gpn, j.est_s = b->est;
    if (b->type >= 0) j.n_types = 1, j.gpu_types[0] = types[b->type];
    j.tenant = k % 3 ? "a" : "b";
    return sched_job_submit(s, &j, now);
}

typedef struct result {
    uint64_t decisions;
    double seconds;
} result;

/* Fills the fleet from a 10k-job queue, then repeatedly finishes `batch`
 * running jobs (soonest estimate first), tops the queue back up to `queued`
 * and runs a cycle; counts START decisions and the time spent in cycles. */
static int run_policy(sched_policy pol, int nodes, int queued, int batch, int cycles, result *out)
{
    sched_config c;
    sched_config_default(&c, pol);
    sched *s = sched_new(&c);
    if (!s) return SH_ENOMEM;
    add_fleet(s, nodes);
    rng = 88172645463325252ull;
    int k = 0;
    for (; k < queued; k++) {
        bjob b = make_job();
        submit(s, k, &b, 0);
    }
    sched_decisions d = {0};
    char **running = calloc((size_t)queued * 4 + 1024, sizeof *running);
    size_t nrun = 0;
    memset(out, 0, sizeof *out);
    double now = 0;
    for (int cyc = 0; cyc <= cycles; cyc++) {
        double t0 = sh_now_mono();
        int n = sched_step(s, now, &d);
        double dt = sh_now_mono() - t0;
        if (n < 0) return n;
        if (cyc) out->seconds += dt; /* cycle 0 fills the empty fleet */
        for (size_t i = 0; i < d.n; i++)
            if (d.v[i].kind == SCHED_D_START) {
                if (cyc) out->decisions++;
                running[nrun++] = strdup(d.v[i].job);
            }
        now += 1;
        /* Finish a batch of running jobs (random picks), then refill. */
        for (int b = 0; b < batch && nrun; b++) {
            size_t pick = next_u() % nrun;
            sched_job_finish(s, running[pick], now);
            free(running[pick]);
            running[pick] = running[--nrun];
        }
        sched_stats st;
        sched_stats_get(s, &st);
        for (size_t q = st.queued; q < (size_t)queued; q++, k++) {
            bjob b = make_job();
            submit(s, k, &b, now);
        }
    }
    for (size_t i = 0; i < nrun; i++) free(running[i]);
    free(running);
    sched_decisions_free(&d);
    sched_free(s);
    return 0;
}

/* The baseline: place each job of the same stream by scanning every node
 * (as a scheduler without pools or free-count buckets would), with the
 * same all-or-nothing rule, on a fleet kept about as full. */
static void run_naive(int nodes, int jobs, result *out)
{
    int *free_g = malloc((size_t)nodes * sizeof *free_g), *pick = malloc(64 * sizeof *pick);
    for (int i = 0; i < nodes; i++) free_g[i] = (int)(next_u() % 9); /* a busy fleet */
    rng = 88172645463325252ull;
    double t0 = sh_now_mono();
    uint64_t placed = 0;
    for (int q = 0; q < jobs; q++) {
        bjob b = make_job();
        int found = 0;
        /* per fabric of 100 nodes of one type: nodes i with i % TYPES == type */
        for (int f0 = 0; f0 < nodes && found < b.nodes; f0 += TYPES * 100) {
            for (int t = 0; t < TYPES && found < b.nodes; t++) {
                if (b.type >= 0 && t != b.type) continue;
                found = 0;
                for (int i = f0 + t; i < f0 + TYPES * 100 && i < nodes && found < b.nodes; i += TYPES)
                    if (free_g[i] >= b.gpn) pick[found++] = i;
            }
        }
        if (found == b.nodes) {
            for (int i = 0; i < found; i++) free_g[pick[i]] -= b.gpn;
            placed++;
        }
        /* Keep the fleet about as full: release GPUs on a random node. */
        int r = (int)(next_u() % (uint64_t)nodes);
        free_g[r] = 8;
    }
    out->seconds = sh_now_mono() - t0;
    out->decisions = placed;
    free(free_g), free(pick);
}

int cli_bench_sched(int argc, char **argv)
{
    int json = 0, nodes = 10000, queued = 10000, batch = 100, cycles = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: shoal bench sched [--json] [--batch N]\n\n"
                   "Fills 10,000 8-GPU nodes (3 types, 100-node fabrics) from 10,000 queued jobs,\n"
                   "then runs %d cycles that each finish N (default 100) running jobs, refill\n"
                   "the queue to 10,000 and schedule; reports START decisions per second of\n"
                   "cycle time for each policy, and a naive every-node scan of the same jobs.\n", cycles);
            return 0;
        } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
            int64_t v;
            if (sh_parse_i64(argv[++i], &v, "--batch") || v < 1 || v > 10000)
                return cli_usage("bench sched", "--batch must be 1..10000");
            batch = (int)v;
        } else return cli_usage("bench sched", "unknown option \"%s\"", argv[i]);
    }
    result naive;
    run_naive(nodes, 20000, &naive);
    double naive_rate = naive.decisions / naive.seconds;
    json_t *j = json_pack("{s:i,s:i,s:i,s:f}", "nodes", nodes, "queued", queued, "batch", batch,
                          "naive_decisions_per_s", naive_rate);
    if (!json)
        printf("%d nodes, %d queued jobs, %d finishing per cycle\n%-9s %10s %8s %14s %8s\n", nodes,
               queued, batch, "policy", "decisions", "seconds", "decisions/s", "x naive");
    static const sched_policy pols[] = {SCHED_FIFO, SCHED_BACKFILL, SCHED_SHOAL};
    for (size_t p = 0; p < 3; p++) {
        result r;
        int rc = run_policy(pols[p], nodes, queued, batch, cycles, &r);
        if (rc) return json_decref(j), cli_fail("bench sched", rc);
        double rate = r.seconds > 0 ? r.decisions / r.seconds : 0;
        const char *name = sched_policy_name(pols[p]);
        json_object_set_new(j, name, json_pack("{s:I,s:f,s:f,s:f}", "decisions", (json_int_t)r.decisions,
                                               "seconds", r.seconds, "decisions_per_s", rate,
                                               "x_naive", rate / naive_rate));
        if (!json)
            printf("%-9s %10llu %8.3f %14.0f %7.1fx\n", name, (unsigned long long)r.decisions, r.seconds,
                   rate, rate / naive_rate);
    }
    if (!json) printf("naive     %10llu %8.3f %14.0f %7.1fx\n", (unsigned long long)naive.decisions,
                      naive.seconds, naive_rate, 1.0);
    else sh_json_print(j);
    json_decref(j);
    return 0;
}
