/* shoal sched: the gang scheduling core.
 *
 * A pure, event-driven state machine.  It touches no clock, socket, file or
 * database: every call that changes state takes the current time `now` (in
 * seconds, any epoch, never decreasing), and sched_step() returns the
 * decisions for the caller to carry out.  The simulator (src/control/sim) drives it in
 * virtual time; the control-plane server drives it from HTTP requests, agent
 * heartbeats and a timer.
 *
 * Model.
 *  - A node has a string id, a zone, a fabric (the network a gang may span),
 *    a GPU type, a GPU count (1..SCHED_MAX_NODE_GPUS) and a price per
 *    GPU-hour.  Nodes with the same (zone, fabric, GPU type) form a pool.
 *  - A job is one of three kinds:
 *      gang      `nodes` distinct nodes x `gpus_per_node` GPUs each, all in
 *                one pool (one zone, one fabric, one GPU type), placed all or
 *                nothing, never partially.
 *      elastic   min..max replicas of `gpus_per_node` GPUs each, anywhere, of
 *                any allowed type; grows into idle GPUs, shrinks to make room
 *                for gangs and when a node fails.
 *      function  one GPU, short, serverless-style; preemptible.
 *    Each job lists allowed GPU types, each with a relative throughput
 *    ("speed", 1.0 = the reference type), so that time and cost per unit of
 *    work can be compared across types.  No types means any type at speed 1.
 *  - Ids are copied: the caller's strings need not outlive the call.
 *    Lookups by id are O(1) (hash tables); placement is O(pools x GPUs per
 *    node) plus the nodes chosen.
 *
 * Decisions and their lifetime.  sched_step() fills a caller-owned
 * sched_decisions buffer (reset on each call).  Strings in it point into the
 * scheduler and stay valid until the next call that changes the scheduler
 * (any call taking `now`).  Effects of events that happen between steps (a
 * node failure requeueing a gang, a cancel) are reported by the next step.
 *
 * Errors follow common.h: 0 or a negative SH_E* code with sh_errmsg() naming
 * the job or node and the rule broken.
 */
#ifndef SHOAL_SCHED_H
#define SHOAL_SCHED_H

#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

#define SCHED_MAX_NODE_GPUS 16 /* GPUs on one node, the bucket range of a pool */
#define SCHED_MAX_TYPES 8      /* allowed GPU types listed by one job */
#define SCHED_ID_MAX 128       /* bytes of an id, zone, fabric or type, NUL included */

typedef struct sched sched;

typedef enum sched_policy {
    SCHED_POLICY_FIFO = 0,     /* strict order: nothing starts before the queue head */
    SCHED_POLICY_FIRSTFIT = 1, /* greedy per-pod placement holding partial gangs (k8s coscheduling) */
    SCHED_POLICY_BACKFILL = 2, /* EASY backfill: one reservation for the head, first pool that fits */
    SCHED_POLICY_SHOAL = 3,    /* priorities, fair share, reservations + backfill, preemption, packing */
} sched_policy;

typedef enum sched_kind { SCHED_GANG = 0, SCHED_ELASTIC = 1, SCHED_FUNCTION = 2 } sched_kind;

/* Why a queued job waits, as the core sees it between cycles. */
typedef enum sched_wait {
    SCHED_WAIT_NONE = 0,        /* not queued */
    SCHED_WAIT_RESOURCES = 1,   /* no allowed pool has the GPUs free now */
    SCHED_WAIT_RESERVATION = 2, /* it would fit only on nodes reserved for another job */
    SCHED_WAIT_RESERVED = 3,    /* it holds a reservation: it starts when those nodes drain */
    SCHED_WAIT_FAIR_SHARE = 4,  /* short of GPUs, and its tenant is over its fair share */
    SCHED_WAIT_NEXT_CYCLE = 5,  /* it fits now: the next cycle starts it unless jobs ahead take the room */
    SCHED_WAIT_NODES_DOWN = 6,  /* never fits while failed or draining nodes are out */
} sched_wait;

typedef enum sched_on_fail {
    SCHED_REQUEUE = 0, /* the whole gang goes back to the head of its queue */
    SCHED_REPLACE = 1, /* keep the survivors, wait up to replace_wait_s for a node */
} sched_on_fail;

typedef enum sched_job_state {
    SCHED_QUEUED = 0,
    SCHED_HOLDING = 1,   /* firstfit only: some pods placed, GPUs held, not started */
    SCHED_RUNNING = 2,
    SCHED_REPLACING = 3, /* a node failed; survivors held while waiting for a spare */
    SCHED_DONE = 4,
    SCHED_CANCELLED = 5,
    SCHED_REJECTED = 6,  /* can never fit; see sched_job_info.reason */
} sched_job_state;

typedef enum sched_node_state {
    SCHED_NODE_UP = 0,
    SCHED_NODE_FAILED = 1, /* down until sched_node_recover() */
    SCHED_NODE_DRAINING = 2, /* asked to scale down: takes no new work */
} sched_node_state;

/* Capacity a provider can add: up to max_nodes nodes of `gpus` GPUs of
 * gpu_type in (zone, fabric), ready delay_s after the request. */
typedef struct sched_quota {
    const char *zone, *fabric, *gpu_type;
    int gpus;
    int max_nodes;
    double price_per_gpu_hour;
    double delay_s;
} sched_quota;

typedef struct sched_config {
    sched_policy policy;
    /* firstfit: a partially placed gang releases its pods after this long. */
    double hold_timeout_s;          /* default 300 */
    /* Restart cost charged to a requeued gang (reported; the runner adds it). */
    double restart_cost_s;          /* default 60 */
    /* shoal: most victims one preemption may take (0 disables preemption). */
    int max_victims;                /* default 8 */
    /* shoal: preempt for a blocked gang only when, without victims, it
     * would start (its reservation time: when enough nodes of one pool
     * come free if running work ends at its estimates) later than now +
     * preempt_wait x its own estimated run time.  A gang that would start
     * soon anyway waits rather than send lower-priority work back to the
     * queue; 0: whenever victims can make room. */
    double preempt_wait;            /* default 0.5 */
    /* Reservations held for head-of-line gangs (backfill: always 1). */
    int max_reservations;           /* default 1 (backfill: always 1) */
    /* shoal's fair share: a tenant holding a fraction f of the busy GPUs
     * has its jobs ordered as if submitted f x fair_window_s later. */
    double fair_window_s;           /* default 7200 (2 h) */
    /* shoal: place a gang in the pool left fullest (fewest free GPUs after
     * it) rather than the first pool that fits, keeping emptier pools whole.
     * On the Philly replay it lowers cost but also utilisation: off. */
    int pack_pools;
    /* shoal: grow elastic jobs into idle GPUs while jobs are queued (off:
     * only into an empty queue, as the baselines do). */
    int grow_queued;
    /* shoal: among the pools of the fastest type where work that takes
     * whole nodes fits now, put it where running work ends no earlier
     * than it will (the one whose last end is soonest), else where it
     * extends the last end least, so pools drain whole for large gangs;
     * 0: the first pool that fits (work sharing a node always). */
    int drain_pools;                /* default 1 */
    /* 1: start estimates from running work and reservations alone, not
     * from the plan of every queued job (to compare them). */
    int plain_estimates;
    /* Estimated runtime of a job submitted with est_s = 0.  Nothing ends
     * a job at its estimate: one running past it is expected to end soon,
     * the later the longer it has overrun (docs/sched.md, "Work past its
     * estimate"). */
    double default_est_s;           /* default 3600 */
    /* Autoscaling: off unless autoscale != 0 and quotas are given. */
    int autoscale;
    double scale_up_wait_s;         /* a gang waiting this long triggers scale up; default 600 */
    double scale_down_idle_s;       /* an idle provisioned node is released; default 1800 */
    const sched_quota *quotas;      /* copied by sched_new */
    size_t n_quotas;
    /* 1: the reference search, without the cycle's shortcuts (shape
     * sweeps, cached reservation times, the preemption index and memo).
     * Slower; it must decide exactly what the default search decides,
     * which tests check. */
    int reference;
    /* 1: keep every closed bill for sched_bills() until the caller drops
     * it (a server's durable ledger).  0 (default): totals only. */
    int bill_journal;
} sched_config;

/* Fills c with the defaults above for `policy`. */
void sched_config_default(sched_config *c, sched_policy policy);
/* "fifo" | "firstfit" | "backfill" | "shoal" -> policy; SH_EINVAL otherwise. */
int sched_policy_parse(const char *name, sched_policy *out);
const char *sched_policy_name(sched_policy p);
/* "resources", "reservation", ... for a sched_wait; "" for NONE. */
const char *sched_wait_name(sched_wait w);

/* Creates a scheduler; NULL on bad config (sh_errmsg says why) or no memory.
 * The caller owns it and frees it with sched_free (NULL is a no-op). */
sched *sched_new(const sched_config *c);
void sched_free(sched *s);

/* ---- Nodes ---------------------------------------------------------------- */

typedef struct sched_node_spec {
    const char *id, *zone, *fabric, *gpu_type;
    int gpus;
    double price_per_gpu_hour;
} sched_node_spec;

/* Adds an up node.  SH_EEXIST for a known id, SH_EINVAL for a bad field. */
int sched_node_add(sched *s, const sched_node_spec *n, double now);
/* Removes an idle node (SH_EAGAIN if work is still on it: drain it first by
 * failing or waiting). */
int sched_node_remove(sched *s, const char *id, double now);
/* A node failure: work on it is stopped per job policy (gangs requeue or wait
 * for a replacement, elastic jobs shrink, functions requeue); the decisions
 * appear in the next sched_step. */
int sched_node_fail(sched *s, const char *id, double now);
int sched_node_recover(sched *s, const char *id, double now);

/* ---- Jobs ----------------------------------------------------------------- */

typedef struct sched_job_spec {
    const char *id;
    const char *tenant;          /* NULL = "default" */
    sched_kind kind;
    int nodes;                   /* gang: nodes; elastic: min replicas; function: 1 */
    int max_replicas;            /* elastic: max replicas (>= nodes) */
    int gpus_per_node;           /* gang: per node; elastic: per replica; function: 1 */
    int n_types;                 /* 0 = any GPU type at speed 1 */
    const char *gpu_types[SCHED_MAX_TYPES];
    double speed[SCHED_MAX_TYPES]; /* relative throughput per type; 0 = 1.0 */
    double est_s;                /* estimated run time at speed 1 (for reservations); 0 = default */
    int priority;                /* higher first */
    sched_on_fail on_fail;
    double replace_wait_s;       /* SCHED_REPLACE: how long to wait for a spare node */
} sched_job_spec;

/* Submits a job.  Returns 0 when queued; SH_EEXIST for a known id; SH_EINVAL
 * for a malformed spec; SH_ERANGE when the job can never fit the fleet plus
 * its quotas (more GPUs than any pool holds, an unknown GPU type): the job is
 * then recorded as SCHED_REJECTED with the reason in sh_errmsg() and in
 * sched_job_info.reason. */
int sched_job_submit(sched *s, const sched_job_spec *j, double now);
/* Cancels a queued or running job; its GPUs are freed at once. */
int sched_job_cancel(sched *s, const char *id, double now);
/* The job completed; its GPUs are freed at once. */
int sched_job_finish(sched *s, const char *id, double now);

/* Forgets an ended job (SCHED_DONE, SCHED_CANCELLED or SCHED_REJECTED):
 * its record, id, allocation history and any decision about it still
 * pending are dropped, so that a long-running server or a long replay keeps
 * memory bounded by the jobs alive at once.  Its final bill stays in every
 * total: sched_cost_tenant (any tenant, type) and sched_cost_job(s, NULL,
 * ...) return what they returned before; sched_cost_job for its id returns
 * 0 from then on.  Its handle may be given to a later submission, and its
 * id may be submitted again as a new job.  SH_ENOENT for an unknown id,
 * SH_EINVAL for a job that has not ended (cancel it first).  Strings that
 * earlier decisions or infos returned for the job become invalid. */
int sched_job_forget(sched *s, const char *id);

/* ---- Scheduling cycle ------------------------------------------------------- */

typedef enum sched_decision_kind {
    SCHED_D_START = 0,      /* start job on places[first .. first+count) */
    SCHED_D_GROW = 1,       /* elastic: add these replicas */
    SCHED_D_SHRINK = 2,     /* elastic: remove these replicas; with `node` set: pods lost
                               with that failed node (a gang then waits in REPLACING) */
    SCHED_D_PREEMPT = 3,    /* stop job entirely; it is queued again */
    SCHED_D_REQUEUE = 4,    /* a failure stopped job; it is queued again (restart cost) */
    SCHED_D_REPLACE = 5,    /* a gang's failed node is replaced: places holds the new node */
    SCHED_D_HOLD = 6,       /* firstfit: pods placed but the gang cannot start yet */
    SCHED_D_RELEASE = 7,    /* firstfit: a held partial gang timed out and let go */
    SCHED_D_SCALE_UP = 8,   /* ask the provider for `count` nodes of (zone, fabric, gpu_type) */
    SCHED_D_SCALE_DOWN = 9, /* ask the provider to release node `node` (now draining) */
} sched_decision_kind;

/* `gpus` GPUs of node `node` (one gang pod or one elastic replica).  The
 * core also chooses which GPUs: `gpu_mask` has bit g set for device index g
 * (the lowest free indices; nodes of more than 64 GPUs get indices only
 * below 64), and `since` is when the place was taken, on the core's clock.
 * Given to sched_job_restore, a nonzero mask and a since > 0 are kept (the
 * mask must be free on the node and name `gpus` devices). */
typedef struct sched_place {
    const char *node;
    uint32_t node_ix;
    int gpus;
    uint64_t gpu_mask;
    double since;
} sched_place;

typedef struct sched_decision {
    sched_decision_kind kind;
    const char *job;         /* job decisions */
    uint32_t job_ix;         /* dense handle, see sched_job_ix() */
    size_t first, count;     /* into sched_decisions.places */
    const char *node;        /* SCALE_DOWN; REPLACE: the failed node */
    const char *zone, *fabric, *gpu_type; /* SCALE_UP */
    int n;                   /* SCALE_UP: node count */
    double ready_s;          /* SCALE_UP: now + the quota's delay */
} sched_decision;

typedef struct sched_decisions {
    sched_decision *v;
    size_t n, cap;
    sched_place *places;
    size_t n_places, cap_places;
} sched_decisions;

void sched_decisions_free(sched_decisions *d);

/* Marks the queued job `id` running on the n places given, as if a START
 * decision had placed it there at `now` -- for a server rebuilding its
 * scheduler after a restart, whose running jobs must not move.  The
 * placement must be one the job could have been given: a gang on exactly
 * `nodes` distinct nodes of one pool with gpus_per_node GPUs each, elastic
 * min..max replicas, a function one GPU, on up nodes with the GPUs free.
 * Otherwise SH_EINVAL naming the node or the rule, and nothing changes.
 * Its start (and the time its estimate runs from) is the earliest `since`
 * given, else now. */
int sched_job_restore(sched *s, const char *id, const sched_place *places, size_t n, double now);

/* Runs one scheduling cycle at `now`: reports pending event effects, expires
 * timeouts, starts, grows, shrinks, preempts and scales.  Resets and fills
 * out.  Returns the number of decisions, or a negative code (no memory). */
int sched_step(sched *s, double now, sched_decisions *out);

/* The earliest future time at which sched_step would act without any new
 * event (a hold or replace timeout, an autoscale threshold), or INFINITY. */
double sched_next_wakeup(const sched *s);

/* ---- Bills ------------------------------------------------------------------ */

/* One closed allocation: billed when a place is released (the job ends, is
 * preempted or requeued, shrinks, or loses a node), per second with each
 * allocation's seconds rounded up.  Kept only with sched_config.bill_journal
 * set, for a caller that makes bills durable (the server's ledger). */
typedef struct sched_bill {
    const char *job, *tenant, *node, *gpu_type;
    int gpus;
    uint64_t gpu_mask;
    double since, until;     /* on the core's clock */
    double seconds;          /* billed seconds: ceil(until - since) */
    double cost;             /* seconds * gpus * the node's price per GPU-second */
} sched_bill;

/* The bills closed since the last sched_bills_done, oldest first; the
 * strings stay valid until then, even for a job forgotten in between. */
size_t sched_bills(const sched *s, const sched_bill **out);
/* Drops the first n bills (the caller has made them durable). */
void sched_bills_done(sched *s, size_t n);
/* The bills ending job `id` at `now` (sched_job_cancel or sched_job_finish)
 * would close, without ending it: up to cap into out (strings valid until
 * the core changes); returns how many there are.  A caller that makes an
 * end durable in one transaction with its bills writes these first, ends
 * the job once the transaction commits, and then drops the bills the end
 * closed (sched_bills_drop_last): they are the same, already written. */
size_t sched_job_closing_bills(const sched *s, const char *id, double now, sched_bill *out, size_t cap);
/* Drops the newest n bills (see sched_job_closing_bills). */
void sched_bills_drop_last(sched *s, size_t n);

/* ---- Queries -------------------------------------------------------------- */

typedef struct sched_job_info {
    const char *id, *tenant;
    sched_kind kind;
    sched_job_state state;
    int priority;
    int replicas;            /* running pods or replicas now */
    int gpus;                /* GPUs held now */
    const char *gpu_type;    /* the type it runs on (gang), NULL when not placed */
    double speed;            /* relative throughput of that type (gang) */
    double submit_s, first_start_s, start_s, end_s; /* -1 when not yet */
    /* Running: when the core plans it to end (its start plus its estimate
     * at the speed it runs at, moved on while it runs past it; the time
     * reservations and backfill use); -1 otherwise. */
    double expected_end_s;
    double wait_s;           /* total time queued before (re)starts */
    int restarts;            /* requeues after failure */
    int preemptions;
    int backfilled;          /* started ahead of a reservation */
    double cost;             /* billed so far, in price units */
    double cost_open;        /* of that, the places it holds now (not yet closed) */
    const char *reason;      /* SCHED_REJECTED: why */
    /* Queued jobs (else SCHED_WAIT_NONE, "" and -1): why it waits, in
     * words naming the pool, the job or the tenant, and when it should
     * start if running work ends at its estimates and the reservations of
     * the last cycle hold (like Slurm's `squeue --start`; INFINITY when no
     * time can be given, e.g. nodes down).  Computed by the query: it costs
     * a pass over the nodes of the job's pools. */
    sched_wait wait;
    char wait_text[256];
    /* The id of the other job wait_text names (SCHED_WAIT_RESERVATION: the
     * job whose reservation is in the way), else NULL; valid until the core
     * changes.  A caller that shows the text to a tenant other than that
     * job's rewrites it (the id and its start time are that tenant's). */
    const char *wait_job;
    double est_start_s;
} sched_job_info;

int sched_job_info_get(const sched *s, const char *id, double now, sched_job_info *out);
/* sched_job_info_ix without the start estimate (est_start_s is NAN; the
 * wait and its text as sched_job_info_ix gives them).  The estimate is
 * most of what a queued job's query costs (a plan of the queue, or for a
 * job past the plan a pass over the nodes of its pools): a caller that
 * asks every queued job for its reason after every cycle (`shoal sim
 * --waits-out`) asks this. */
int sched_job_reason_ix(const sched *s, uint32_t ix, double now, sched_job_info *out);
/* Handle of a job id (dense, stable while the job is known; once it is
 * forgotten the handle may be reused by a later submission); -1 if unknown. */
int64_t sched_job_ix(const sched *s, const char *id);
/* SH_ENOENT for a handle out of range or of a forgotten job. */
int sched_job_info_ix(const sched *s, uint32_t ix, double now, sched_job_info *out);
/* One more than the largest handle in use so far: handles lie in
 * 0..count-1 (some may be free after sched_job_forget). */
size_t sched_job_count(const sched *s);

/* Copies up to cap places of the job's allocation into out; returns how many
 * it holds in all (may exceed cap). */
size_t sched_job_alloc(const sched *s, const char *id, sched_place *out, size_t cap);

/* Billing, per second (each allocation's seconds rounded up), by GPU type.
 * tenant or job NULL = everyone; gpu_type NULL = all types. */
double sched_cost_tenant(const sched *s, const char *tenant, const char *gpu_type, double now);
double sched_cost_job(const sched *s, const char *job, const char *gpu_type, double now);
/* What the places job `id` holds now have cost so far (gpu_type NULL: all
 * types): the part of sched_cost_job not yet closed into a bill; the billed
 * GPU-seconds in *gpu_s when not NULL. */
double sched_cost_job_open(const sched *s, const char *job, const char *gpu_type, double now, double *gpu_s);

/* Queue order as the policy sees it now: up to cap job ids into out;
 * returns the queue length.  Call it between cycles (not from a thread
 * running sched_step on the same scheduler). */
size_t sched_queue(const sched *s, const char **out, size_t cap);

typedef struct sched_node_info {
    const char *id, *zone, *fabric, *gpu_type;
    sched_node_state state;
    int gpus, free_gpus;
    double price_per_gpu_hour;
} sched_node_info;
int sched_node_info_get(const sched *s, const char *id, sched_node_info *out);

typedef struct sched_stats {
    uint64_t decisions;       /* every decision ever returned */
    uint64_t starts, preemptions, requeues, replaces, shrinks, rejected;
    uint64_t partial_gangs;   /* firstfit: gangs that held a partial placement */
    uint64_t hold_timeouts;   /* firstfit: partial gangs released on timeout */
    double held_gpu_s;        /* firstfit: GPU-seconds held by partial gangs */
    uint64_t scale_ups, scale_downs;
    uint64_t resv_late;       /* head reservations that moved later, or started late */
    uint64_t forgotten;       /* jobs dropped by sched_job_forget */
    uint64_t preempt_declined; /* shoal: gangs that had victims but did not take them, being due
                                  * soon (preempt_wait); each gang once, however often turned down */
    int nodes_up, gpus_up, gpus_busy;
    size_t queued, running;
} sched_stats;
void sched_stats_get(const sched *s, sched_stats *out);

/* Checks every invariant: no running gang partially placed, no GPU booked
 * twice (per-node sums match allocations), every gang in one zone, fabric
 * and type, nothing on a failed node, no reservation delayed by backfill.
 * Returns 0, or SH_EINTERNAL with sh_errmsg() naming the broken rule. */
int sched_check(const sched *s, double now);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
