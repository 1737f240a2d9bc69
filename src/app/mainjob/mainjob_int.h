/* shoal mainjob: the pieces that turn the RL engine into control-plane jobs
 * on a mixed fleet (docs/mainjob.md).
 *
 *  - A ring all-reduce over UCX between the ranks of the trainer gang
 *    (mj_ring_*): each rank listens and connects to the next one; gradients are averaged with a reduce-scatter and an
 *    all-gather, N - 1 steps each, tag-matched so that messages of different
 *    steps never mix.
 *  - The data-parallel trainer: rank 0 runs the RL engine (src/rl/engine) with
 *    remote workers, broadcasts each batch, every rank trains on its share of
 *    the groups and all-reduces gradients, so all ranks hold the same weights
 *    (mj_train_*).
 *  - Fleet files with declared speed factors (mj_fleet_*), for placement by
 *    cost per unit of rollout throughput and for workers to know what GPU
 *    they stand for.
 *
 * I/O edge: sockets, UCX, files.  Every function returns 0 or a negative
 * SH_E* code with sh_errmsg() set. */
#ifndef SHOAL_MAINJOB_H
#define SHOAL_MAINJOB_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"
#include "shoal/rl.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

/* ---- Ring all-reduce over UCX ------------------------------------------- */

typedef struct mj_ring mj_ring;

/* Joins a ring of `world` ranks on `host`: with rdv_dir NULL on the ports
 * base_port .. base_port + world - 1; otherwise each rank listens on an
 * ephemeral port and announces it in rdv_dir/rank-<r> (a folder every rank
 * sees, fresh for each attempt), which is robust to ports taken by others.
 * Waits up to timeout_s for the neighbours.  The caller owns *out
 * (mj_ring_free).  world = 1 needs no UCX at all. */
int mj_ring_new(int rank, int world, const char *host, int base_port, const char *rdv_dir,
                double timeout_s, mj_ring **out);
void mj_ring_free(mj_ring *r);
/* Sums x (n floats) over all ranks in place, then divides by world (the
 * mean).  Every rank must call it with the same n, in the same order. */
int mj_ring_allreduce_mean(mj_ring *r, float *x, size_t n);
/* Rank `root`'s buffer to every rank: the root passes its bytes in *buf;
 * others get a malloc'd copy in *buf (caller frees) and its length in *len. */
int mj_ring_bcast(mj_ring *r, int root, void **buf, size_t *len);
/* Bytes this rank sent over the ring so far. */
uint64_t mj_ring_bytes_sent(const mj_ring *r);

/* ---- Data-parallel trainer --------------------------------------------------- */

/* Per-rank state.  Rank 0 passes mj_train_step as rl_config.train_fn (with
 * hook_ctx = this); other ranks run mj_train_follow. */
typedef struct mj_train {
    mj_ring *ring;
    int rank, world;
    int synced; /* 1 once rank 0 has sent its warm-started weights */
    long steps;
    long total_steps; /* rank 0: after this many steps it ends the gang */
    int in_sync;      /* rank 0, after the last step: 1 when all ranks' weights match */
} mj_train;

/* rl_config.train_fn for rank 0: broadcasts the batch (and, the first time,
 * the weights), trains on rank 0's share of the groups with gradients
 * all-reduced across the ring.  After step total_steps it calls
 * mj_train_finish and records in_sync. */
int mj_train_step(void *ctx, rl_trainer *tr, const rl_traj *t, int n, rl_step_stats *st);
/* Rank 0 at the end: an empty batch tells the others to stop; then every
 * rank compares the xxh3 of its weights.  *in_sync = 1 when all are equal. */
int mj_train_finish(mj_train *m, rl_trainer *tr, int *in_sync);
/* Ranks > 0: follow rank 0 until it finishes; *steps_out counts the steps. */
int mj_train_follow(mj_train *m, const rl_config *c, long *steps_out, int *in_sync);

/* ---- Fleets with speed factors ----------------------------------------------- */

typedef struct mj_node {
    char name[64], gpu_type[32], zone[64], fabric[64];
    int gpus;
    double price; /* per GPU-hour */
    double speed; /* declared rollout speed factor (1 = the training type) */
    int max_seqs; /* sequences its memory holds at once (0: not declared) */
} mj_node;

typedef struct mj_fleet {
    mj_node *nodes;
    int n;
} mj_fleet;

/* Reads a `shoal up` fleet file and its speed table (gpu_type,speed lines;
 * docs/mainjob.md).  Every GPU type of the fleet needs a speed. */
int mj_fleet_load(const char *fleet_csv, const char *speeds_csv, mj_fleet *out);
void mj_fleet_free(mj_fleet *f);
const mj_node *mj_fleet_node(const mj_fleet *f, const char *name);
/* The speed of a GPU type (0 if unknown). */
double mj_fleet_speed(const mj_fleet *f, const char *gpu_type);

/* ---- Per-type tuning under emulated GPU time (pure) -------------------------- */

/* The request size (prompts) of a worker without its own: the run's
 * req_prompts, or a quarter of a step's prompts (as src/rl/engine does). */
int mj_default_prompts(const rl_config *c);
/* Worst-case emulated seconds of a request of `prompts` prompts on w: every
 * response runs to max_new tokens (c->step_s must be > 0). */
double mj_req_latency_s(const rl_config *c, const rl_worker_spec *w, int prompts);
/* Trajectories per emulated second of w at that request size. */
double mj_worker_rate(const rl_config *c, const rl_worker_spec *w, int prompts);
/* The pool's rate: every worker at its own request size (or the default). */
double mj_pool_rate(const rl_config *c);
/* The worst-case latency of the pool's stalest request, in version periods
 * (one version = a step's trajectories at the pool's rate). */
double mj_stalest(const rl_config *c);
/* Sets every worker's req_prompts to the size with the highest rate whose
 * worst-case latency is at most mj_stalest() of the pool as given (its
 * untuned staleness) version periods of the tuned pool, iterated to a
 * fixed point. */
int mj_tune(rl_config *c);

/* ---- A rollout worker's weights from the push tree (weights.c) ---------
 * A store_replica attached to the push tree, seen by the RL worker as an
 * rl_weights_source.  Store version store_base + v + 1 holds policy version
 * v.  After each activation one JSON line is appended to tree_log:
 * {"version", "store_version", "name", "zone", "addr" (this replica's push
 * address), "parent" (the address it got the version from), "bytes" (push
 * bytes received since the last line), "t", "reattaches"}. */
typedef struct mj_weights mj_weights;

typedef struct mj_weights_config {
    const char *dir;      /* the replica's folder (required) */
    const char *parent;   /* push parent "host:port": the root */
    const char *parent_file; /* or a file that will name it: the replica starts when it does */
    const char *zone;     /* the node's zone: one relay per zone */
    const char *name;     /* in the tree log */
    const char *tree_log; /* NULL: none */
    uint64_t store_base;
    int fanout;           /* same-zone children before redirecting (0: 2) */
    double min_wait_s;    /* rl_weights_source.min_wait_s */
} mj_weights_config;

/* Opens the replica and starts following the tree.  The caller owns *out. */
int mj_weights_open(const mj_weights_config *cfg, mj_weights **out);
/* The source for rl_worker_serve_from (valid until mj_weights_close). */
const rl_weights_source *mj_weights_source(mj_weights *w);
void mj_weights_close(mj_weights *w);

/* ---- What moved (summary.c) ----------------------------------------------
 * mj_summary: RUN/summary.json's object (docs/mainjob.md) from
 * RUN/result.json and the push tree's log; the caller owns *out.
 * mj_tree_load: RUN/push/root.json (NULL when missing) and the lines of
 * RUN/push/tree.jsonl.  mj_tree_svg: the tree (who fed whom, and per
 * version) as an SVG appended to b.  mj_run_lines: a JSON-lines file as an
 * array (a missing file: empty). */
int mj_summary(const char *run, json_t **out);
int mj_tree_load(const char *run, json_t **root, json_t **lines);
int mj_tree_svg(const json_t *root, const json_t *lines, sh_buf *b);
int mj_run_lines(const char *path, json_t **out);

/* ---- Plots and the report (plot.c, report.c) -----------------------------
 * Every picture of the project's reports (the main job's report, the RL
 * sweep) is drawn here.  mj_plot appends one <svg> line plot of ns series
 * to b; mj_plot_lines is its short form (y from 0 up to ymax_fixed or a
 * round maximum); mj_plot_bars a bar chart.  Tick labels are plain numbers
 * (1.5k, 20k, 3M: never 1e+04).
 * mj_report_write writes RUN/summary.json and RUN/report.html from what the
 * run folder holds and hands back the summary (caller owns it). */
typedef struct mj_series {
    const char *name, *color; /* name NULL: no legend entry */
    double *x, *y;
    int n;
    const double *err; /* optional: +- error bar at each point */
    int dashed;
    double dx;         /* horizontal offset in pixels (series sharing a category) */
} mj_series;

typedef struct mj_axes {
    const char *title, *xlabel, *ylabel;
    double ymin, ymax;           /* ymin == ymax: from 0 to a round maximum of the data */
    const char *const *xcats;    /* categorical x axis: labels of x = 0..ncats-1 */
    int ncats;
    double width, height;        /* 0: 520 x 300 */
    const char *const *notes;    /* lines under the legend */
    int nnotes;
    int standalone;              /* a whole .svg file (xmlns, white background) */
} mj_axes;

void mj_plot(sh_buf *b, const mj_axes *a, const mj_series *s, int ns);
void mj_plot_lines(sh_buf *b, const char *title, const char *xl, const char *yl, const mj_series *s, int ns,
                   double ymax_fixed);
void mj_plot_bars(sh_buf *b, const char *title, const char *unit, const char *const *names, const double *v,
                  int n);
int mj_report_write(const char *run, json_t **summary);

/* ---- The fleet-cost experiment (fleetcost.c, docs/mainjob.md) ------------ */
typedef struct mj_fleetcost_opts {
    const char *fleet, *speeds; /* fleet and speed tables */
    const char *ttype;          /* the training GPU type */
    int tg;                     /* the trainer's GPUs, kept out of the pools */
    int seeds, jobs;            /* seeds 1..32; runs at once */
    const char *warm_cache;     /* NULL: a temporary folder */
    double thr;                 /* each pool's rollout throughput, in training GPUs */
} mj_fleetcost_opts;

/* Runs the three pools from every seed with base's options and returns the
 * experiment's object (docs/mainjob.md, `--json`); the caller owns it. */
int mj_fleet_cost(const mj_fleetcost_opts *o, const rl_config *base, sh_units_fn progress, void *parg,
                  json_t **result);

/* ---- The trainer and worker processes (trainer.c, worker.c) --------------
 * mj_trainer_rank0: rank 0 of `shoal rl trainer` (docs/mainjob.md): listens
 * for workers on host (an ephemeral port), announces itself in
 * STORE/trainer.json with args (the rl options workers must share), runs the
 * RL engine with remote workers, publishes every version to the store from
 * memory, appends events, writes the result; *res is the caller's. */
typedef struct mj_trainer_opts {
    const char *store, *events, *result; /* events, result: NULL for none */
    char **args;
    int nargs;
    void (*on_listen)(void *arg, const char *addr); /* where workers connect */
    void *arg;
} mj_trainer_opts;
int mj_trainer_rank0(const rl_config *c, const mj_trainer_opts *o, mj_ring *ring, int world,
                     const char *host, json_t **res);
/* A worker's side: waits up to wait_s for STORE/trainer.json to say
 * "running" (1 when it says the run is over, 0 with *out set), connects to
 * its "addr", and opens the worker's replica on the push tree whose root
 * PDIR/push.addr names (now or later; PDIR/replicas/, PDIR/tree.jsonl). */
int mj_trainer_wait(const char *store, double wait_s, json_t **out);
int mj_trainer_connect(const char *addr, int *fd);
int mj_worker_weights(const char *pdir, const char *node, const char *zone, uint64_t store_base,
                      double min_wait_s, mj_weights **out);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
