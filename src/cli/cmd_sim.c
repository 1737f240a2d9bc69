/* shoal sim: replays a job trace on a fleet in virtual time under one or
 * all scheduling policies and reports what users would see. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_int.h"
#include "shoal/sched.h"
#include "shoal/sim.h"

const char cli_help_sim[] =
    "replay job traces on a fleet under fifo|firstfit|backfill|shoal (or all) [--json]";

static const char usage_text[] =
    "usage: shoal sim --fleet F|mixed:NODES [--fleet-format shoal|alibaba-v2023|alibaba-v2026]\n"
    "                 [--trace T]... [T...] [--format shoal|gavel|alibaba-v2023|kalos|mixed]\n"
    "                 [--policy fifo|firstfit|backfill|shoal|all] [--json]\n"
    "       shoal sim push [options]   (the push tree at scale: `shoal sim push --help`)\n"
    "\n"
    "Replays the traces (several are merged into one workload, one tenant each\n"
    "for gavel) on the fleet in virtual time and reports jobs completed, JCT,\n"
    "queueing delay by gang size (1, 2-4, 5-16, 17-64, 65+ nodes), GPU\n"
    "utilisation, cost, preemptions, failures and decisions per second.\n"
    "\n"
    "fleet:    --zones N (2) --fabric-nodes N (32)   zone/fabric rule for imported node lists\n"
    "          --fleet mixed:N                      N generated 8-GPU nodes: H100, A100, L4 in 3 zones,\n"
    "                                               fabrics of --fabric-nodes (default here 128)\n"
    "trace:    --type-map v100=A|B,k80=C            rename trace GPU types to fleet types\n"
    "          --throughputs FILE                   gavel throughputs (default: beside the trace)\n"
    "          --multi-node K [--node-gpus 8]       scale GPU counts by K, pack into nodes\n"
    "          --jobs N --load L --seed S           kalos, mixed: N synthetic jobs offering L x fleet GPUs\n"
    "                                               (mixed: 45% functions, 15% elastic, 40% gangs of\n"
    "                                               1-64 nodes, priorities 0-2)\n"
    "          --write-trace FILE --write-fleet FILE  save the imported inputs as shoal CSV\n"
    "events:   --failures MTBF_HOURS [--repair-s S]  node failures (per-node MTBF), repairs\n"
    "          --replace-wait S                     gangs wait S for a spare node, else requeue\n"
    "          --autoscale [--quota zone,fabric,type,gpus,max_nodes,price,delay_s]...\n"
    "                                               (no --quota: per GPU type, 64 8-GPU nodes in\n"
    "                                               fabric auto-<type> of its first zone, 300 s)\n"
    "policy:   --hold-timeout S (300) --max-victims N (8) --reservations N (1)\n"
    "          --preempt-wait F                     shoal: preempt only for a gang that would wait\n"
    "                                               over F x its run time without (0.5; 0: always)\n"

    "          --drain-pools 0|1                    shoal: place work where pools drain together (1)\n"
    "          --grow-queued                        shoal: grow elastic work while jobs are queued\n"
    "          --fair-window S (7200) --pack        shoal's fair-share window, pool packing\n"
    "          --restart-cost S (60) --scale-up-wait S (600) --scale-down-idle S (1800)\n"
    "checks:   --check                              sched_check after every event\n"
    "          --jobs-out FILE                      each job's wait, JCT and preemptions as CSV (with\n"
    "                                               --policy all: FILE.POLICY.csv for each policy)\n"
    "          --waits-out FILE                     each job's first pool and its queued seconds by the\n"
    "                                               core's wait reason, as CSV (the same naming; asks\n"
    "                                               every queued job each cycle: slow on fifo's queues)\n"
    "          --no-estimates                       skip checking start estimates against starts\n"
    "                                               (reported as start_estimates in --json)\n"
    "          --plain-estimates                    estimates from running work and reservations alone,\n"
    "                                               not from the plan of every queued job\n";

typedef struct args {
    const char *fleet, *fleet_format, *format, *policy, *type_map, *throughputs;
    const char *write_trace, *write_fleet, *jobs_out, *waits_out;
    const char *traces[512];
    int ntraces;
    sim_fleet_opts fo;
    int multi_k, node_gpus, json, check, autoscale, max_victims, reservations, drain, pack, no_estimates, plain_est, grow_queued;
    double fair_window, preempt_wait;
    double load, mtbf, repair, hold, restart, up_wait, down_idle, replace_wait;
    int64_t jobs;
    uint64_t seed;
    sched_quota quotas[64];
    char quota_text[64][256];
    int nquotas;
} args;

static int parse_quota(args *a, const char *v)
{
    if (a->nquotas == 64) return cli_usage("sim", "at most 64 --quota");
    char *t = a->quota_text[a->nquotas];
    snprintf(t, 256, "%s", v);
    char *f[8];
    int n = 0;
    for (char *p = t; p && n < 8; n++) {
        f[n] = p;
        if ((p = strchr(p, ','))) *p++ = 0;
    }
    sched_quota *q = &a->quotas[a->nquotas];
    if (n != 7) return cli_usage("sim", "--quota \"%s\": expected zone,fabric,type,gpus,max_nodes,price,delay_s", v);
    q->zone = f[0], q->fabric = f[1], q->gpu_type = f[2];
    int64_t gpus, nodes;
    if (cli_int("sim", "--quota gpus", f[3], 1, 1024, &gpus) || cli_int("sim", "--quota max_nodes", f[4], 0, 1000000, &nodes) ||
        cli_real("sim", "--quota price", f[5], 0, DBL_MAX, "a price >= 0", &q->price_per_gpu_hour) ||
        cli_real("sim", "--quota delay_s", f[6], 0, DBL_MAX, "seconds >= 0", &q->delay_s))
        return CLI_USAGE;
    q->gpus = (int)gpus, q->max_nodes = (int)nodes;
    a->nquotas++;
    return 0;
}

/* The options: codes below 256 are flags and strings, the rest numbers
 * (parse_num names each one's field and range). */
enum {
    O_ZONES = 256, O_FABRIC_NODES, O_MULTI_NODE, O_NODE_GPUS, O_MAX_VICTIMS, O_RESERVATIONS, O_DRAIN,
    O_LOAD, O_FAILURES, O_REPAIR, O_REPLACE_WAIT, O_HOLD, O_FAIR_WINDOW, O_PREEMPT_WAIT, O_RESTART,
    O_UP_WAIT, O_DOWN_IDLE, O_JOBS, O_SEED,
};
static const struct option opts[] = {
    {"fleet", required_argument, 0, 'f'},        {"fleet-format", required_argument, 0, 'F'},
    {"format", required_argument, 0, 'm'},       {"policy", required_argument, 0, 'p'},
    {"type-map", required_argument, 0, 'T'},     {"throughputs", required_argument, 0, 'u'},
    {"write-trace", required_argument, 0, 'w'},  {"write-fleet", required_argument, 0, 'W'},
    {"jobs-out", required_argument, 0, 'o'},     {"trace", required_argument, 0, 't'},
    {"waits-out", required_argument, 0, 'R'},
    {"quota", required_argument, 0, 'q'},        {"json", no_argument, 0, 'j'},
    {"check", no_argument, 0, 'c'},              {"autoscale", no_argument, 0, 'a'},
    {"pack", no_argument, 0, 'P'},               {"no-estimates", no_argument, 0, 'n'},
    {"plain-estimates", no_argument, 0, 'e'},    {"grow-queued", no_argument, 0, 'g'},
    {"zones", required_argument, 0, O_ZONES},    {"fabric-nodes", required_argument, 0, O_FABRIC_NODES},
    {"multi-node", required_argument, 0, O_MULTI_NODE}, {"node-gpus", required_argument, 0, O_NODE_GPUS},
    {"max-victims", required_argument, 0, O_MAX_VICTIMS}, {"reservations", required_argument, 0, O_RESERVATIONS},
    {"drain-pools", required_argument, 0, O_DRAIN}, {"load", required_argument, 0, O_LOAD},
    {"failures", required_argument, 0, O_FAILURES}, {"repair-s", required_argument, 0, O_REPAIR},
    {"replace-wait", required_argument, 0, O_REPLACE_WAIT}, {"hold-timeout", required_argument, 0, O_HOLD},
    {"fair-window", required_argument, 0, O_FAIR_WINDOW}, {"preempt-wait", required_argument, 0, O_PREEMPT_WAIT},
    {"restart-cost", required_argument, 0, O_RESTART}, {"scale-up-wait", required_argument, 0, O_UP_WAIT},
    {"scale-down-idle", required_argument, 0, O_DOWN_IDLE}, {"jobs", required_argument, 0, O_JOBS},
    {"seed", required_argument, 0, O_SEED},      {0}};

/* Option k's value v into a: a number option's own range check, or 0 when
 * k is not a number option. */
static int parse_num(args *a, int k, const char *v)
{
    const struct {
        int code;
        const char *name;
        int *to;
        int64_t lo, hi;
    } ints[] = {{O_ZONES, "--zones", &a->fo.zones, 0, 1000000000},
                {O_FABRIC_NODES, "--fabric-nodes", &a->fo.fabric_nodes, 0, 1000000000},
                {O_MULTI_NODE, "--multi-node", &a->multi_k, 0, 1000000000},
                {O_NODE_GPUS, "--node-gpus", &a->node_gpus, 1, 1000000000},
                {O_MAX_VICTIMS, "--max-victims", &a->max_victims, 0, 1000000000},
                {O_RESERVATIONS, "--reservations", &a->reservations, 0, 1000000000},
                {O_DRAIN, "--drain-pools", &a->drain, 0, 1}};
    const struct {
        int code;
        const char *name;
        double *to, lo;
    } reals[] = {{O_LOAD, "--load", &a->load, DBL_MIN},         {O_FAILURES, "--failures", &a->mtbf, 0},
                 {O_REPAIR, "--repair-s", &a->repair, 0},       {O_REPLACE_WAIT, "--replace-wait", &a->replace_wait, 0},
                 {O_HOLD, "--hold-timeout", &a->hold, 0},       {O_FAIR_WINDOW, "--fair-window", &a->fair_window, 0},
                 {O_PREEMPT_WAIT, "--preempt-wait", &a->preempt_wait, 0}, {O_RESTART, "--restart-cost", &a->restart, 0},
                 {O_UP_WAIT, "--scale-up-wait", &a->up_wait, 0}, {O_DOWN_IDLE, "--scale-down-idle", &a->down_idle, 0}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        int64_t x;
        if (ints[i].code != k) continue;
        if (cli_int("sim", ints[i].name, v, ints[i].lo, ints[i].hi, &x)) return CLI_USAGE;
        return *ints[i].to = (int)x, 0;
    }
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
        if (reals[i].code == k)
            return cli_real("sim", reals[i].name, v, reals[i].lo, DBL_MAX,
                            reals[i].lo > 0 ? "a number > 0" : "a number >= 0", reals[i].to);
    int64_t x;
    if (k == O_JOBS && cli_int("sim", "--jobs", v, 1, INT64_MAX, &a->jobs)) return CLI_USAGE;
    if (k == O_SEED) {
        if (cli_int("sim", "--seed", v, 1, INT64_MAX, &x)) return CLI_USAGE;
        a->seed = (uint64_t)x;
    }
    return 0;
}

static int parse(int argc, char **argv, args *a)
{
    memset(a, 0, sizeof *a);
    a->fleet_format = "shoal", a->format = "shoal", a->policy = "shoal";
    a->fo = (sim_fleet_opts){2, 0};
    a->node_gpus = 8, a->jobs = 1000, a->load = 0.9, a->seed = 1;
    a->max_victims = -1, a->reservations = -1, a->drain = -1;
    a->hold = a->restart = a->up_wait = a->down_idle = a->fair_window = a->preempt_wait = -1;
    cli_args c = {"sim", usage_text, opts, NULL};
    for (int k; (k = cli_getopt(&c, argc, argv)) != -1;) {
        int rc = 0;
        switch (k) {
        case CLI_OPT_EXIT: return c.rc ? c.rc : -1;
        case 'f': a->fleet = optarg; break;
        case 'F': a->fleet_format = optarg; break;
        case 'm': a->format = optarg; break;
        case 'p': a->policy = optarg; break;
        case 'T': a->type_map = optarg; break;
        case 'u': a->throughputs = optarg; break;
        case 'w': a->write_trace = optarg; break;
        case 'W': a->write_fleet = optarg; break;
        case 'o': a->jobs_out = optarg; break;
        case 'R': a->waits_out = optarg; break;
        case 't':
            if (a->ntraces == 512) return cli_usage("sim", "at most 512 traces");
            a->traces[a->ntraces++] = optarg;
            break;
        case 'q': rc = parse_quota(a, optarg); break;
        case 'j': a->json = 1; break;
        case 'c': a->check = 1; break;
        case 'a': a->autoscale = 1; break;
        case 'P': a->pack = 1; break;
        case 'n': a->no_estimates = 1; break;
        case 'e': a->plain_est = 1; break;
        case 'g': a->grow_queued = 1; break;
        default: rc = parse_num(a, k, optarg);
        }
        if (rc) return rc;
    }
    for (int i = optind; i < argc; i++) {
        if (a->ntraces == 512) return cli_usage("sim", "at most 512 traces");
        a->traces[a->ntraces++] = argv[i];
    }
    for (int i = 0; i < a->ntraces; i++)
        if (strpbrk(a->traces[i], "*?[") && access(a->traces[i], F_OK))
            return cli_usage("sim", "no trace matches %s (the shell passes a pattern that matches nothing as it is: "
                             "check the folder)", a->traces[i]);
    if (!a->fleet) return cli_usage("sim", "--fleet is required");
    if (!a->ntraces && strcmp(a->format, "kalos") && strcmp(a->format, "mixed"))
        return cli_usage("sim", "give a trace (--trace FILE) or --format kalos|mixed");
    return 0;
}

/* The file a per-job output goes to: the path given, or with several
 * policies (pol >= 0) PATH.POLICY.csv, the policy before the extension. */
static const char *out_name(char *buf, size_t n, const char *path, int pol)
{
    if (pol < 0) {
        snprintf(buf, n, "%s", path);
        return buf;
    }
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    int stem = dot && (!slash || dot > slash) ? (int)(dot - path) : (int)strlen(path);
    snprintf(buf, n, "%.*s.%s%s", stem, path, sched_policy_name((sched_policy)pol),
             stem < (int)strlen(path) ? path + stem : ".csv");
    return buf;
}

static int cmp_submit(const void *x, const void *y)
{
    const sim_job *a = x, *b = y;
    if (a->submit_s != b->submit_s) return a->submit_s < b->submit_s ? -1 : 1;
    return strcmp(a->id, b->id);
}

static int load_inputs(const args *a, sim_fleet *f, sim_trace *t)
{
    if (!strncmp(a->fleet, "mixed:", 6)) {
        int64_t n;
        if (sh_parse_i64(a->fleet + 6, &n, "--fleet mixed:N") || n < 3 || n > 1000000)
            return sh_err(SH_EINVAL, "--fleet %s: give mixed:N with N in 3..1000000 nodes", a->fleet);
        SH_TRY(sim_fleet_mixed(f, (int)n, a->fo.fabric_nodes ? a->fo.fabric_nodes : 128));
    } else {
        sim_fleet_opts fo = a->fo;
        if (!fo.fabric_nodes) fo.fabric_nodes = 32;
        SH_TRY(sim_fleet_load(a->fleet, a->fleet_format, &fo, f));
    }
    memset(t, 0, sizeof *t);
    int gpus = 0;
    for (size_t i = 0; i < f->n; i++) gpus += f->nodes[i].gpus;
    if (!strcmp(a->format, "kalos")) SH_TRY(sim_trace_kalos(t, (size_t)a->jobs, a->seed, gpus, a->load));
    if (!strcmp(a->format, "mixed")) SH_TRY(sim_trace_mixed(t, (size_t)a->jobs, a->seed, gpus, a->load));
    sim_trace_opts to = {a->throughputs, a->type_map};
    for (int i = 0; i < a->ntraces; i++) {
        sim_trace one;
        SH_TRY(sim_trace_load(a->traces[i], a->format, &to, &one));
        sim_job *v = realloc(t->jobs, (t->n + one.n + 1) * sizeof *v);
        if (!v) return sim_trace_free(&one), sh_err(SH_ENOMEM, "sim: out of memory");
        memcpy(v + t->n, one.jobs, one.n * sizeof *v);
        t->jobs = v, t->n += one.n, t->cap = t->n + 1, t->skipped += one.skipped;
        sim_trace_free(&one);
    }
    if (a->multi_k) SH_TRY(sim_trace_multinode(t, a->multi_k, a->node_gpus));
    /* Merged traces replay in submit order. */
    if (t->n) qsort(t->jobs, t->n, sizeof *t->jobs, cmp_submit);
    if (a->write_trace) SH_TRY(sim_trace_write(t, a->write_trace));
    if (a->write_fleet) SH_TRY(sim_fleet_write(f, a->write_fleet));
    return 0;
}

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* Jobs and how long they waited, by gang size. */
static void report_jobs(json_t *j, const sim_report *r)
{
    json_t *p50 = json_object(), *p99 = json_object(), *cnt = json_object();
    for (int b = 0; b < SIM_BUCKETS; b++) {
        json_object_set_new(p50, sim_bucket_names[b], num(r->wait_p50_s_by_nodes[b]));
        json_object_set_new(p99, sim_bucket_names[b], num(r->wait_p99_s_by_nodes[b]));
        json_object_set_new(cnt, sim_bucket_names[b], json_integer((json_int_t)r->bucket_jobs[b]));
    }
    json_object_set_new(j, "jobs_total", json_integer((json_int_t)r->jobs_total));
    json_object_set_new(j, "jobs_completed", json_integer((json_int_t)r->jobs_completed));
    json_object_set_new(j, "jobs_rejected", json_integer((json_int_t)r->jobs_rejected));
    json_object_set_new(j, "jobs_unfinished", json_integer((json_int_t)r->jobs_unfinished));
    json_object_set_new(j, "deadlocked", json_boolean(r->deadlocked));
    json_object_set_new(j, "partial_gangs", json_integer((json_int_t)r->partial_gangs));
    json_object_set_new(j, "hold_timeouts", json_integer((json_int_t)r->hold_timeouts));
    json_object_set_new(j, "held_gpu_hours", num(r->held_gpu_hours));
    json_object_set_new(j, "utilization", num(r->utilization));
    json_object_set_new(j, "jct_mean_s", num(r->jct_mean_s));
    json_object_set_new(j, "jct_p50_s", num(r->jct_p50_s));
    json_object_set_new(j, "jct_p99_s", num(r->jct_p99_s));
    json_object_set_new(j, "wait_p50_s", num(r->wait_p50_s));
    json_object_set_new(j, "wait_p99_s", num(r->wait_p99_s));
    json_object_set_new(j, "wait_p50_s_by_nodes", p50);
    json_object_set_new(j, "wait_p99_s_by_nodes", p99);
    json_object_set_new(j, "jobs_by_nodes", cnt);
    json_object_set_new(j, "gangs_16plus_nodes", json_integer((json_int_t)r->big_jobs));
    json_object_set_new(j, "wait_p50_s_16plus_nodes", num(r->wait_p50_s_big));
    json_object_set_new(j, "wait_p99_s_16plus_nodes", num(r->wait_p99_s_big));
}

/* The bill, by GPU type and tenant, and how good the start estimates were. */
static void report_costs(json_t *j, const sim_report *r)
{
    json_object_set_new(j, "cost", num(r->cost));
    json_t *bt = json_object(), *bn = json_object();
    for (size_t k = 0; k < r->ntypes; k++) json_object_set_new(bt, r->type[k], num(r->cost_by_type[k]));
    for (size_t k = 0; k < r->ntenants; k++) json_object_set_new(bn, r->tenant[k], num(r->cost_by_tenant[k]));
    json_object_set_new(j, "cost_by_gpu_type", bt);
    json_object_set_new(j, "cost_by_tenant", bn);
    if (r->jobs_rejected) json_object_set_new(j, "first_rejection", json_string(r->first_rejection));
    json_object_set_new(j, "makespan_s", num(r->makespan_s));
    json_object_set_new(j, "start_estimates",
                        json_pack("{s:I,s:I,s:o,s:o,s:o,s:o}", "jobs", (json_int_t)r->est_jobs, "no_estimate",
                                  (json_int_t)r->est_infinite, "mean_error_s", num(r->est_mean_error_s),
                                  "mean_abs_error_s", num(r->est_mean_abs_error_s), "p50_abs_error_s",
                                  num(r->est_p50_abs_error_s), "p90_abs_error_s", num(r->est_p90_abs_error_s)));
}

/* What the scheduler did, and what it cost in CPU time. */
static void report_decisions(json_t *j, const sim_report *r)
{
    json_object_set_new(j, "preemptions", json_integer((json_int_t)r->preemptions));
    json_object_set_new(j, "preemptions_declined", json_integer((json_int_t)r->preempt_declined));
    json_object_set_new(j, "failures", json_integer((json_int_t)r->failures));
    json_object_set_new(j, "failures_survived", json_integer((json_int_t)r->failures_survived));
    json_object_set_new(j, "requeues", json_integer((json_int_t)r->requeues));
    json_object_set_new(j, "replaces", json_integer((json_int_t)r->replaces));
    json_object_set_new(j, "restarts", json_integer((json_int_t)r->restarts));
    json_object_set_new(j, "scale_ups", json_integer((json_int_t)r->scale_ups));
    json_object_set_new(j, "scale_downs", json_integer((json_int_t)r->scale_downs));
    json_object_set_new(j, "reservation_delays", json_integer((json_int_t)r->resv_late));
    json_object_set_new(j, "sched_job_slots", json_integer((json_int_t)r->sched_job_slots));
    json_object_set_new(j, "decisions", json_integer((json_int_t)r->decisions));
    json_object_set_new(j, "decisions_per_s", num(r->decisions_per_s));
    char hx[17];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)r->decisions_hash);
    json_object_set_new(j, "decisions_hash", json_string(hx));
    json_object_set_new(j, "sched_steps", json_integer((json_int_t)r->sched_steps));
    json_object_set_new(j, "sched_cpu_raw_s", num(r->sched_cpu_raw_s));
    json_object_set_new(j, "clock_window_s", num(r->clock_window_s));
}

static json_t *report_json(const sim_report *r, const char *policy, double wall)
{
    json_t *j = json_object();
    json_object_set_new(j, "policy", json_string(policy));
    report_jobs(j, r);
    report_costs(j, r);
    report_decisions(j, r);
    json_object_set_new(j, "wall_s", num(wall));
    return j;
}

static void fmt_s(char *b, size_t n, double v)
{
    if (!isfinite(v)) snprintf(b, n, "-");
    else if (v < 100) snprintf(b, n, "%.0fs", v);
    else if (v < 36000) snprintf(b, n, "%.1fh", v / 3600);
    else snprintf(b, n, "%.0fh", v / 3600);
}

static void print_header(void)
{
    printf("%-9s %6s %5s %5s %6s %8s %8s", "policy", "done", "rej", "util", "partl", "jct_mean", "cost");
    for (int b = 0; b < SIM_BUCKETS; b++) printf(" p99[%s]", sim_bucket_names[b]);
    printf(" %8s %9s\n", "p99[16+]", "dec/s");
}

static void print_row(const sim_report *r, const char *policy)
{
    char jm[16];
    fmt_s(jm, sizeof jm, r->jct_mean_s);
    printf("%-9s %6zu %5zu %4.1f%% %6llu %8s %8.0f", policy, r->jobs_completed, r->jobs_rejected,
           100 * r->utilization, (unsigned long long)r->partial_gangs, jm, r->cost);
    for (int b = 0; b < SIM_BUCKETS; b++) {
        char w[16];
        fmt_s(w, sizeof w, r->wait_p99_s_by_nodes[b]);
        printf(" %*s", (int)strlen(sim_bucket_names[b]) + 5, w);
    }
    char big[16];
    fmt_s(big, sizeof big, r->wait_p99_s_big);
    printf(" %8s %9.0f%s\n", big, r->decisions_per_s, r->deadlocked ? "  (deadlocked)" : "");
}

static void default_quotas(args *a, const sim_fleet *f)
{
    /* One quota per GPU type of the fleet, in the zone of its first node:
     * up to 64 more 8-GPU nodes each, ready after 5 minutes. */
    for (size_t i = 0; i < f->n && a->nquotas < 64; i++) {
        int seen = 0;
        for (int q = 0; q < a->nquotas; q++) seen |= !strcmp(a->quotas[q].gpu_type, f->nodes[i].gpu_type);
        if (seen) continue;
        sched_quota *q = &a->quotas[a->nquotas];
        snprintf(a->quota_text[a->nquotas], 256, "auto-%s", f->nodes[i].gpu_type);
        *q = (sched_quota){f->nodes[i].zone, a->quota_text[a->nquotas], f->nodes[i].gpu_type, 8, 64,
                           f->nodes[i].price_per_gpu_hour, 300};
        a->nquotas++;
    }
}

int cli_sim_push(int argc, char **argv); /* src/cli/sim_push.c */

/* The core's configuration for policy p from the options. */
static void sim_options(const args *a, sched_policy p, sim_opts *o)
{
    memset(o, 0, sizeof *o);
    sched_config_default(&o->cfg, p);
    int shoal = p == SCHED_POLICY_SHOAL;
    if (a->hold >= 0) o->cfg.hold_timeout_s = a->hold;
    if (a->restart >= 0) o->cfg.restart_cost_s = a->restart;
    if (a->max_victims >= 0 && shoal) o->cfg.max_victims = a->max_victims;
    if (a->reservations >= 0 && shoal) o->cfg.max_reservations = a->reservations;
    if (a->drain >= 0 && shoal) o->cfg.drain_pools = a->drain != 0;
    if (a->preempt_wait >= 0) o->cfg.preempt_wait = a->preempt_wait;
    if (a->up_wait >= 0) o->cfg.scale_up_wait_s = a->up_wait;
    if (a->fair_window >= 0) o->cfg.fair_window_s = a->fair_window;
    o->cfg.pack_pools = a->pack;
    o->cfg.grow_queued = a->grow_queued;
    o->cfg.plain_estimates = a->plain_est;
    if (a->down_idle >= 0) o->cfg.scale_down_idle_s = a->down_idle;
    o->cfg.autoscale = a->autoscale, o->cfg.quotas = a->quotas, o->cfg.n_quotas = (size_t)a->nquotas;
    o->mtbf_hours = a->mtbf, o->repair_s = a->repair, o->check = a->check, o->seed = a->seed;
    o->replace_wait_s = a->replace_wait;
    o->progress = 1; /* drawn only when stderr is a terminal */
    o->estimates = !a->no_estimates;
}

/* One policy's table row (and start-estimate line). */
static void print_policy(const sim_report *r, sched_policy p, int first)
{
    print_row(r, sched_policy_name(p));
    if (r->est_jobs) {
        char e50[16], e90[16], em[16];
        fmt_s(e50, sizeof e50, r->est_p50_abs_error_s), fmt_s(e90, sizeof e90, r->est_p90_abs_error_s);
        fmt_s(em, sizeof em, fabs(r->est_mean_error_s));
        printf("%9s start estimates of %zu waiting jobs: |error| p50 %s, p90 %s; mean %s %s\n", "", r->est_jobs, e50,
               e90, em, r->est_mean_error_s >= 0 ? "late" : "early");
    }
    if (r->jobs_rejected && first) fprintf(stderr, "rejected (first of %zu): %s\n", r->jobs_rejected, r->first_rejection);
}

/* Replays the trace under policy p (of npol) and prints or collects its report. */
static int run_policy(const args *a, const sim_fleet *f, const sim_trace *t, sched_policy p, int npol, int first,
                      json_t *all)
{
    sim_opts o;
    sim_options(a, p, &o);
    char jobs_out[4096], waits_out[4096];
    if (a->jobs_out) o.jobs_out = out_name(jobs_out, sizeof jobs_out, a->jobs_out, npol > 1 ? (int)p : -1);
    if (a->waits_out) o.waits_out = out_name(waits_out, sizeof waits_out, a->waits_out, npol > 1 ? (int)p : -1);
    sim_report r;
    double w0 = sh_now_mono();
    SH_TRY(sim_run(f, t, &o, &r));
    double wall = sh_now_mono() - w0;
    if (r.jobs_total && r.jobs_rejected == r.jobs_total)
        return sh_err(SH_ERANGE, "all %zu jobs were rejected, none fits the fleet; the first: %s "
                                 "(check the trace's GPU types and sizes against the fleet, or --type-map)",
                      r.jobs_total, r.first_rejection);
    if (!a->json) print_policy(&r, p, first);
    else if (all) json_object_set_new(all, sched_policy_name(p), report_json(&r, sched_policy_name(p), wall));
    else {
        json_t *j = report_json(&r, sched_policy_name(p), wall);
        sh_json_print(j);
        json_decref(j);
    }
    return SH_OK;
}

int cli_cmd_sim(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "push")) return cli_sim_push(argc - 1, argv + 1);
    static args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc; /* < 0: --help or --version answered */
    sched_policy pols[4];
    int npol = 0;
    if (!strcmp(a.policy, "all")) {
        for (int p = 0; p < 4; p++) pols[npol++] = (sched_policy)p;
    } else if (sched_policy_parse(a.policy, &pols[0]))
        return cli_usage("sim", "unknown --policy \"%s\" (use fifo, firstfit, backfill, shoal or all)", a.policy);
    else npol = 1;
    sim_fleet f;
    sim_trace t;
    if ((rc = load_inputs(&a, &f, &t))) return cli_fail("sim", rc);
    if (a.autoscale && !a.nquotas) default_quotas(&a, &f);
    json_t *all = npol > 1 ? json_object() : NULL;
    if (!a.json) {
        printf("%zu jobs (%zu foreign records skipped), %zu nodes\n", t.n, t.skipped, f.n);
        print_header();
    }
    for (int p = 0; p < npol && !rc; p++) rc = run_policy(&a, &f, &t, pols[p], npol, p == 0, all);
    if (!rc && all && a.json) sh_json_print(all);
    json_decref(all);
    sim_fleet_free(&f);
    sim_trace_free(&t);
    return rc ? cli_fail("sim", rc) : 0;
}
