/* shoal bench sched: placement decisions per second of the scheduling core
 * with 10,000 nodes and 10,000 queued jobs, against a naive scan measured
 * in the same run. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli_int.h"
#include "shoal/sched.h"
#include "shoal/sim.h"

const char cli_bench_help_sched[] =
    "scheduler decisions/s with 10k nodes and 10k queued jobs vs a naive scan; --mix: "
    "a mixed replay, shoal vs backfill [--json]";

#define TYPES 3
static const char *const types[TYPES] = {"h100", "a100", "l4"};

/* CPU seconds of this thread: the target is decisions per second of one
 * core, and on a shared machine wall time also counts other programs. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
        double t0 = cpu_now();
        int n = sched_step(s, now, &d);
        double dt = cpu_now() - t0;
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

/* The baseline: the same all-or-nothing, fullest-node-first placement
 * without the scheduler's index -- every node of each allowed pool is
 * examined for every job (what a scheduler that filters and scores all
 * nodes per job does) -- on the same job stream, with a random running job
 * finishing after each attempt so that the fleet stays about as full. */
typedef struct nrun {
    int n, gpn, *nodes;
} nrun;

static int naive_place(int *free_g, int nodes, const bjob *b, int *pick)
{
    int pools = (nodes + TYPES * 100 - 1) / (TYPES * 100);
    for (int f = 0; f < pools; f++)
        for (int t = 0; t < TYPES; t++) {
            if (b->type >= 0 && t != b->type) continue;
            int cnt[9] = {0}, have = 0;
            for (int i = f * TYPES * 100 + t; i < (f + 1) * TYPES * 100 && i < nodes; i += TYPES)
                if (free_g[i] >= b->gpn) cnt[free_g[i]]++, have++;
            if (have < b->nodes) continue;
            int got = 0; /* fullest nodes first: lowest free count that fits */
            for (int want = b->gpn; want <= 8 && got < b->nodes; want++)
                for (int i = f * TYPES * 100 + t; i < (f + 1) * TYPES * 100 && i < nodes && got < b->nodes; i += TYPES)
                    if (free_g[i] == want) pick[got++] = i;
            return got;
        }
    return 0;
}

static void run_naive(int nodes, int jobs, result *out)
{
    int *free_g = malloc((size_t)nodes * sizeof *free_g), pick[64];
    nrun *run = calloc((size_t)jobs, sizeof *run);
    size_t nrun_ = 0;
    for (int i = 0; i < nodes; i++) free_g[i] = 8;
    rng = 88172645463325252ull;
    double t0 = cpu_now();
    uint64_t placed = 0;
    for (int q = 0; q < jobs; q++) {
        bjob b = make_job();
        if (naive_place(free_g, nodes, &b, pick) == b.nodes) {
            nrun *r = &run[nrun_++];
            r->n = b.nodes, r->gpn = b.gpn, r->nodes = malloc((size_t)b.nodes * sizeof(int));
            for (int i = 0; i < b.nodes; i++) free_g[pick[i]] -= b.gpn, r->nodes[i] = pick[i];
            placed++;
        }
        /* Once the fleet is busy, one running job finishes per attempt. */
        if (nrun_ && placed > 2000) {
            size_t k = next_u() % nrun_;
            for (int i = 0; i < run[k].n; i++) free_g[run[k].nodes[i]] += run[k].gpn;
            free(run[k].nodes);
            run[k] = run[--nrun_];
        }
    }
    out->seconds = cpu_now() - t0;
    out->decisions = placed;
    for (size_t i = 0; i < nrun_; i++) free(run[i].nodes);
    free(run), free(free_g);
}

/* One policy's figures of the mixed replay, for --json. */
static json_t *mix_policy_json(const sim_report *r)
{
    json_t *pj = json_pack("{s:I,s:f,s:f,s:f,s:I,s:I}", "decisions", (json_int_t)r->decisions,
                           "sched_cpu_s", r->sched_cpu_s, "decisions_per_s", r->decisions_per_s,
                           "jct_mean_s", r->jct_mean_s, "jobs_completed", (json_int_t)r->jobs_completed,
                           "preemptions", (json_int_t)r->preemptions);
    json_object_set_new(pj, "preemptions_declined", json_integer((json_int_t)r->preempt_declined));
    json_t *p99 = json_object();
    for (int b = 0; b < SIM_BUCKETS; b++)
        json_object_set_new(p99, sim_bucket_names[b], isfinite(r->wait_p99_s_by_nodes[b])
                                                          ? json_real(r->wait_p99_s_by_nodes[b])
                                                          : json_null());
    json_object_set_new(pj, "wait_p99_s_by_nodes", p99);
    char hx[17];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)r->decisions_hash);
    json_object_set_new(pj, "decisions_hash", json_string(hx));
    json_object_set_new(pj, "sched_steps", json_integer((json_int_t)r->sched_steps));
    json_object_set_new(pj, "sched_cpu_raw_s", json_real(r->sched_cpu_raw_s));
    json_object_set_new(pj, "clock_window_s", json_real(r->clock_window_s));
    return pj;
}

/* The mixed replay's ratios (shoal to backfill, and to the reference search
 * when it ran) into out, printed unless json. */
static void mix_ratios(json_t *out, const sim_report *r, int reference, int json)
{
    double ratio = r[0].decisions_per_s > 0 ? r[1].decisions_per_s / r[0].decisions_per_s : 0;
    json_object_set_new(out, "shoal_vs_backfill", json_real(ratio));
    if (reference) {
        double rr = r[2].decisions_per_s > 0 ? r[1].decisions_per_s / r[2].decisions_per_s : 0;
        json_object_set_new(out, "shoal_vs_reference", json_real(rr));
        int same = r[1].decisions_hash == r[2].decisions_hash && r[1].decisions == r[2].decisions;
        int counts = r[1].preemptions == r[2].preemptions && r[1].preempt_declined == r[2].preempt_declined;
        json_object_set_new(out, "same_decisions", json_boolean(same));
        json_object_set_new(out, "same_counts", json_boolean(counts));
        if (!json) printf("shoal/reference search decisions/s: %.2fx (same decision stream: %s; same preemptions "
                          "and turn-downs: %s)\n", rr, same ? "yes" : "NO", counts ? "yes" : "NO");
    }
    if (json) sh_json_print(out);
    else
        printf("shoal/backfill decisions/s: %.2fx\n"
               "(cpu_s: this thread's CPU time in sched_step, less the clock's own cost: %.2f us per\n"
               "step, the empty window between two reads measured in the same run; with it: %.2f s, %.2f s)\n",
               ratio, r[1].clock_window_s * 1e6, r[0].sched_cpu_raw_s, r[1].sched_cpu_raw_s);
}

/* --mix: replays the mixed workload (sim_trace_mixed) on a mixed fleet
 * (sim_fleet_mixed) under backfill and shoal in the same run, and reports
 * each one's decisions per second of scheduling time with what users saw. */
static int bench_mix(int json, int nodes, int jobs, double load, uint64_t seed, int reference)
{
    sim_fleet f;
    sim_trace t = {0};
    int rc = sim_fleet_mixed(&f, nodes, 128);
    if (rc) return cli_fail("bench sched", rc);
    int gpus = 0;
    for (size_t i = 0; i < f.n; i++) gpus += f.nodes[i].gpus;
    if ((rc = sim_trace_mixed(&t, (size_t)jobs, seed, gpus, load))) {
        sim_fleet_free(&f);
        return cli_fail("bench sched", rc);
    }
    static const sched_policy pols[] = {SCHED_POLICY_BACKFILL, SCHED_POLICY_SHOAL, SCHED_POLICY_SHOAL};
    static const char *const names[] = {"backfill", "shoal", "shoal_reference"};
    sim_report r[3];
    json_t *out = json_pack("{s:i,s:i,s:f,s:I}", "nodes", nodes, "jobs", jobs, "load", load,
                            "seed", (json_int_t)seed);
    if (!json)
        printf("mixed replay: %d nodes (H100, A100, L4; 3 zones), %d jobs (45%% functions, 15%% elastic,\n"
               "40%% gangs of 1-64 nodes, priorities 0-2), load %.2f\n"
               "%-9s %10s %9s %12s %8s %9s %9s %9s %9s\n",
               nodes, jobs, load, "policy", "decisions", "cpu_s", "decisions/s", "jct_mean", "p99[1]",
               "p99[2-4]", "p99[5-16]", "p99[17-64]");
    for (int p = 0; p < 2 + (reference != 0) && !rc; p++) {
        sim_opts o;
        memset(&o, 0, sizeof o);
        sched_config_default(&o.cfg, pols[p]);
        o.cfg.reference = p == 2; /* the search without its indexes, memo and bounds */
        o.progress = !json;
        if ((rc = sim_run(&f, &t, &o, &r[p]))) break;
        const char *name = names[p];
        json_object_set_new(out, name, mix_policy_json(&r[p]));
        if (!json)
            printf("%-9s %10llu %9.2f %12.0f %7.0fs %8.0fs %8.0fs %8.0fs %9.0fs\n", name,
                   (unsigned long long)r[p].decisions, r[p].sched_cpu_s, r[p].decisions_per_s,
                   r[p].jct_mean_s, r[p].wait_p99_s_by_nodes[0], r[p].wait_p99_s_by_nodes[1],
                   r[p].wait_p99_s_by_nodes[2], r[p].wait_p99_s_by_nodes[3]);
    }
    if (!rc) mix_ratios(out, r, reference, json);
    json_decref(out);
    sim_trace_free(&t);
    sim_fleet_free(&f);
    return rc ? cli_fail("bench sched", rc) : 0;
}

#define CYCLES 200
#define STR_(x) #x
#define STR(x) STR_(x)
static const char usage_text[] =
    "usage: shoal bench sched [--nodes N] [--batch N] [--json]\n"
    "       shoal bench sched --mix [--nodes N] [--jobs N] [--load L] [--seed S] [--reference] [--json]\n\n"
    "Fills 10,000 8-GPU nodes (3 types, 100-node fabrics) from 10,000 queued jobs,\n"
    "then runs " STR(CYCLES) " cycles that each finish N (default 100) running jobs, refill\n"
    "the queue to 10,000 and schedule; reports START decisions per CPU-second of\n"
    "cycle time for each policy (best of 3 runs), and the same placement done by\n"
    "scanning every node of each allowed pool for each job (the baseline).\n\n"
    "--mix replays a generated mixed workload (default 100,000 jobs: 45% one-GPU\n"
    "functions, 15% elastic, 40% gangs of 1-64 nodes, priorities 0-2, load 0.85)\n"
    "on a mixed fleet (default 10,000 8-GPU nodes of H100, A100 and L4 in 3 zones)\n"
    "under backfill and shoal, and reports each one's decisions per second of\n"
    "scheduling time, their ratio, JCT and p99 waits by gang size.  --reference\n"
    "adds shoal with the reference search (sched_config.reference: no preemption\n"
    "index, memo or reservation bounds), which must decide the same and count\n"
    "the same preemptions and turn-downs (same_counts in --json).\n";

/* Best of three runs of policy p: the machine is shared, and the fastest
 * run is the one least disturbed by others. */
static int best_of_three(sched_policy p, int nodes, int queued, int batch, int cycles, result *r)
{
    *r = (result){0};
    for (int rep = 0; rep < 3; rep++) {
        result one;
        int rc = run_policy(p, nodes, queued, batch, cycles, &one);
        if (rc) return rc;
        if (!rep || one.seconds < r->seconds) *r = one;
    }
    return 0;
}

/* The plain fill: each policy's decisions per CPU-second (best of three
 * runs) beside scanning every node (the baseline). */
static int bench_plain(int json, int nodes, int queued, int batch, int cycles)
{
    result naive = {0};
    for (int rep = 0; rep < 3; rep++) {
        result one;
        run_naive(nodes, 20000, &one);
        if (!rep || one.seconds < naive.seconds) naive = one;
    }
    double naive_rate = naive.decisions / naive.seconds;
    json_t *j = json_pack("{s:i,s:i,s:i,s:f}", "nodes", nodes, "queued", queued, "batch", batch,
                          "naive_decisions_per_s", naive_rate);
    if (!json)
        printf("%d nodes, %d queued jobs, %d finishing per cycle\n%-9s %10s %8s %14s %8s\n", nodes,
               queued, batch, "policy", "decisions", "seconds", "decisions/s", "x naive");
    static const sched_policy pols[] = {SCHED_POLICY_FIFO, SCHED_POLICY_BACKFILL, SCHED_POLICY_SHOAL};
    for (size_t p = 0; p < 3; p++) {
        result r;
        int rc = best_of_three(pols[p], nodes, queued, batch, cycles, &r);
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

int cli_bench_sched(int argc, char **argv)
{
    int json = 0, nodes = 10000, queued = 10000, batch = 100, cycles = CYCLES, mix = 0, mix_jobs = 100000, ref = 0;
    double load = 0.85;
    uint64_t seed = 1;
    const char *mix_only = NULL, *plain_only = NULL; /* an option given for the other mode */
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'},          {"mix", no_argument, 0, 'm'},
        {"reference", no_argument, 0, 'r'},     {"nodes", required_argument, 0, 'n'},
        {"jobs", required_argument, 0, 'J'},    {"seed", required_argument, 0, 's'},
        {"load", required_argument, 0, 'l'},    {"batch", required_argument, 0, 'b'},
        {0}};
    cli_args a = {"bench sched", usage_text, opts, NULL};
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;) {
        int64_t v = 0;
        int rc = 0;
        switch (k) {
        case CLI_OPT_EXIT: return a.rc;
        case 'j': json = 1; break;
        case 'm': mix = 1; break;
        case 'r': ref = 1, mix_only = "--reference"; break;
        case 'n': rc = cli_int(a.cmd, "--nodes", optarg, 100, 1000000, &v), nodes = (int)v; break;
        case 'J': rc = cli_int(a.cmd, "--jobs", optarg, 1, 10000000, &v), mix_jobs = (int)v, mix_only = "--jobs"; break;
        case 's': rc = cli_int(a.cmd, "--seed", optarg, 0, INT64_MAX, &v), seed = (uint64_t)v, mix_only = "--seed"; break;
        case 'b': rc = cli_int(a.cmd, "--batch", optarg, 1, 10000, &v), batch = (int)v, plain_only = "--batch"; break;
        case 'l':
            rc = cli_real(a.cmd, "--load", optarg, DBL_MIN, 10, "a load in (0, 10]", &load);
            mix_only = "--load";
            break;
        }
        if (rc) return rc;
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    if (!mix && mix_only) return cli_usage(a.cmd, "%s applies to the mixed replay: add --mix", mix_only);
    if (mix && plain_only) return cli_usage(a.cmd, "%s applies without --mix only", plain_only);
    if (mix) return bench_mix(json, nodes, mix_jobs, load, seed, ref);
    return bench_plain(json, nodes, queued, batch, cycles);
}
