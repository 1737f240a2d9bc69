/* shoal sim: fleet and trace importers and a virtual-time replay of the
 * scheduling core (include/shoal/sched.h).
 *
 * Formats are specified in docs/sim-formats.md.  Importers read whole files
 * and fail on the first malformed line with "<file>:<line>: field <name>:
 * <rule>".  The replay is deterministic for a given seed. */
#ifndef SHOAL_SIM_H
#define SHOAL_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/sched.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

#define SIM_NAME 64

/* ---- Fleets ------------------------------------------------------------------ */

typedef struct sim_node {
    char id[SIM_NAME], zone[SIM_NAME], fabric[SIM_NAME], gpu_type[SIM_NAME];
    int gpus;
    double price_per_gpu_hour;
} sim_node;

typedef struct sim_fleet {
    sim_node *nodes;
    size_t n;
} sim_fleet;

/* How importers of foreign node lists assign zones and fabrics: the k-th
 * node of a GPU type (in file order) joins fabric k / fabric_nodes of that
 * type, and fabric f of the type lies in zone f % zones. */
typedef struct sim_fleet_opts {
    int zones;        /* default 2 */
    int fabric_nodes; /* default 32 */
} sim_fleet_opts;

/* format: "shoal" (docs/sim-formats.md), "alibaba-v2023" (sn,cpu_milli,
 * memory_mib,gpu,model) or "alibaba-v2026" (gpu_model,gpu_capacity_num,
 * cpu_num,node_name).  opts may be NULL for the defaults.  Nodes without
 * GPUs are skipped.  The caller frees out with sim_fleet_free. */
int sim_fleet_load(const char *path, const char *format, const sim_fleet_opts *opts, sim_fleet *out);
/* Writes a fleet as shoal fleet CSV, atomically. */
int sim_fleet_write(const sim_fleet *f, const char *path);
void sim_fleet_free(sim_fleet *f);
/* The nominal price per GPU-hour the importers give a GPU model. */
double sim_price_of(const char *gpu_type);

/* ---- Traces ------------------------------------------------------------------ */

typedef struct sim_job {
    char id[SIM_NAME], tenant[SIM_NAME];
    double submit_s;
    sched_kind kind;
    int nodes, max_replicas, gpus_per_node;
    int n_types;
    char gpu_types[SCHED_MAX_TYPES][SIM_NAME];
    double speed[SCHED_MAX_TYPES];
    double duration_s; /* run time at speed 1 (elastic: at min replicas) */
    int priority;
    size_t line;       /* its line in the file it was read from; 0 if generated */
} sim_job;

typedef struct sim_trace {
    sim_job *jobs;
    size_t n, cap;
    size_t skipped; /* foreign records that are not GPU jobs (documented per format) */
} sim_trace;

typedef struct sim_trace_opts {
    /* gavel: the throughputs JSON; NULL = gavel_simulation_throughputs.json
     * beside the trace. */
    const char *throughputs;
    /* Renames trace GPU types to fleet types: "v100=V100M32|V100M16,k80=T4".
     * A name mapped to several fleet types allows each at the same speed. */
    const char *type_map;
} sim_trace_opts;

/* format: "shoal" | "gavel" | "alibaba-v2023".  Jobs are sorted by submit
 * time.  The caller frees out with sim_trace_free. */
int sim_trace_load(const char *path, const char *format, const sim_trace_opts *opts, sim_trace *out);
int sim_trace_write(const sim_trace *t, const char *path);
/* SH_EFORMAT naming the job and both lines ("what:LINE: ...") when two jobs
 * of t share an id. */
int sim_trace_check_ids(const sim_trace *t, const char *what);
void sim_trace_free(sim_trace *t);

/* Makes a single-node trace multi-node: every gang's GPU count is scaled by
 * k and packed into nodes of node_gpus GPUs (nodes = ceil(gpus / node_gpus)). */
int sim_trace_multinode(sim_trace *t, int k, int node_gpus);

/* A synthetic trace calibrated to InternLM's Kalos cluster: power-of-two
 * GPU counts from 1 to 1,024 with a mean of 26.8 GPUs per job, packed into
 * 8-GPU nodes; log-normal durations; Poisson arrivals sized so that the
 * offered load is `load` x fleet_gpus.  Appends n jobs to t. */
int sim_trace_kalos(sim_trace *t, size_t n, uint64_t seed, int fleet_gpus, double load);

/* A mixed fleet: `nodes` 8-GPU nodes of three types (30% H100, 40% A100,
 * 30% L4), fabrics of fabric_nodes nodes per type spread over three zones.
 * The caller frees f with sim_fleet_free. */
int sim_fleet_mixed(sim_fleet *f, int nodes, int fabric_nodes);
/* A mixed workload for that fleet: 45% one-GPU functions (minutes, any
 * type), 15% elastic jobs (1-4 to 2-16 replicas of 1-8 GPUs, H100, A100 or
 * L4 at their speeds), 40% gangs (half single-node, up to 64 nodes of 8
 * GPUs; large gangs want the fastest type), priorities 0-2, six tenants;
 * log-normal durations and Poisson arrivals offering `load` x fleet_gpus.
 * Appends n jobs to t. */
int sim_trace_mixed(sim_trace *t, size_t n, uint64_t seed, int fleet_gpus, double load);

/* ---- Replay ------------------------------------------------------------------ */

typedef struct sim_opts {
    sched_config cfg;
    double mtbf_hours;   /* per node; 0 = no failures */
    double repair_s;     /* a failed node comes back after this long; default 3600 */
    double restart_cost_s; /* work lost by a requeued gang; default cfg.restart_cost_s */
    double replace_wait_s; /* > 0: gangs use the replace failure policy with this wait */
    int check;           /* call sched_check after every event */
    int progress;        /* draw a progress bar on a terminal */
    int estimates;       /* record each job's start estimate after its first cycle */
    uint64_t seed;
    /* Non-NULL: write each job's start, wait, end and preemptions there as
     * CSV once the replay ends (docs/sched.md, "Per-job results"). */
    const char *jobs_out;
    /* Non-NULL: write, for each job, the pool it first started in and how
     * long it waited under each of the core's wait reasons (sched_wait, read
     * after every cycle while it was queued), as CSV (docs/sched.md). */
    const char *waits_out;
} sim_opts;

#define SIM_KEYS 64
#define SIM_BUCKETS 5 /* gang sizes: 1, 2-4, 5-16, 17-64, 65+ nodes */
extern const char *const sim_bucket_names[SIM_BUCKETS];

typedef struct sim_report {
    size_t jobs_total, jobs_completed, jobs_rejected, jobs_unfinished;
    double jct_mean_s, jct_p50_s, jct_p99_s;
    double wait_mean_s, wait_p50_s, wait_p99_s;
    size_t bucket_jobs[SIM_BUCKETS];
    double wait_p50_s_by_nodes[SIM_BUCKETS], wait_p99_s_by_nodes[SIM_BUCKETS];
    size_t big_jobs;                /* gangs of >= 16 nodes */
    double wait_p50_s_big, wait_p99_s_big;
    double utilization; /* GPU-seconds of running work / GPU-seconds up, first to last arrival */
    double cost;
    double makespan_s;
    uint64_t decisions;
    /* This thread's CPU time in sched_step, less the CPU clock's own cost:
     * each step is timed by two reads of CLOCK_THREAD_CPUTIME_ID, a system
     * call that costs about 1.5 us on a VM, as much as a whole cycle of
     * the scheduler.  The cost of an empty window between two reads is
     * measured in the same run (the median of 2,001, before and after the
     * replay, the smaller of the two) and taken off each step's window. */
    double sched_cpu_s;
    double sched_cpu_raw_s;           /* the same with the clock's cost */
    double clock_window_s;            /* the empty window taken off each step */
    uint64_t sched_steps;             /* sched_step calls */
    double decisions_per_s;           /* decisions / sched_cpu_s */
    /* A hash of every decision in order (kind, time, job, nodes, places
     * with their GPU masks, scale-ups): equal hashes mean the same
     * decision stream. */
    uint64_t decisions_hash;
    uint64_t preemptions, preempt_declined, failures, failures_survived, requeues, replaces, restarts;
    uint64_t partial_gangs, hold_timeouts;
    double held_gpu_hours;
    uint64_t scale_ups, scale_downs;
    uint64_t resv_late;
    /* Job records the scheduler held at most at once (finished and rejected
     * jobs are forgotten as the replay goes): bounded by the live jobs. */
    size_t sched_job_slots;
    int deadlocked; /* the replay stopped with work queued that could never start */
    /* Billing by GPU type and by tenant (the first SIM_KEYS of each). */
    size_t ntypes, ntenants;
    char type[SIM_KEYS][SIM_NAME], tenant[SIM_KEYS][SIM_NAME];
    double cost_by_type[SIM_KEYS], cost_by_tenant[SIM_KEYS];
    char first_rejection[256]; /* why the first rejected job was rejected */
    /* Start estimates (sim_opts.estimates) against actual first starts,
     * over the jobs still queued after the cycle that saw them arrive and
     * given a finite estimate; error = actual - estimated (> 0: late). */
    size_t est_jobs, est_infinite;
    double est_mean_error_s, est_mean_abs_error_s, est_p50_abs_error_s, est_p90_abs_error_s;
    sched_stats sched; /* the scheduler's own counters at the end (sched_stats_get) */
} sim_report;

/* Replays trace t on fleet f.  Returns 0, or a negative code (sched_check
 * failed in check mode: SH_EINTERNAL with the broken rule and the time). */
int sim_run(const sim_fleet *f, const sim_trace *t, const sim_opts *o, sim_report *out);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
