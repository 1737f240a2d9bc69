/* shoal mainjob, worker/: a rollout worker's side.  Fleet files with
 * declared speed factors (mj_fleet_*: placement by cost per unit of rollout
 * throughput, and what GPU a worker stands for), the rendezvous with the
 * trainer (STORE/trainer.json) and the worker's weights from the push tree
 * (a store replica seen as an rl_weights_source). */
#ifndef SHOAL_MJ_WORKER_INT_H
#define SHOAL_MJ_WORKER_INT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"
#include "shoal/rl.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

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

/* A worker's side: waits up to wait_s for STORE/trainer.json to say
 * "running" (1 when it says the run is over, 0 with *out set), connects to
 * its "addr", and opens the worker's replica on the push tree whose root
 * PDIR/push.addr names (now or later; PDIR/replicas/, PDIR/tree.jsonl). */
int mj_trainer_wait(const char *store, double wait_s, json_t **out);
int mj_trainer_connect(const char *addr, int *fd);
int mj_worker_weights(const char *pdir, const char *node, const char *zone, uint64_t store_base,
                      double min_wait_s, mj_weights **out);

/* ---- A worker as a process (mj_worker.c) ----------------------------------
 * Finds its GPU (type, speed, price, zone) from `node` in the fleet files,
 * waits for the trainer, parses the trainer's rl options with parse
 * (returning 0 or an error), connects, opens its replica on the push tree
 * when `push` names the tree's folder, says one line, and serves until
 * STOP (it then exits: it never returns).  Returns 1 when the trainer has
 * already finished, or a negative SH_E* code: SH_EINVAL for a node not in
 * the fleet or options that do not parse (the caller's mistake). */
typedef struct mj_worker_proc {
    const char *store, *fleet, *speeds, *node, *push;
    double wait_s, min_wait;
    int (*parse)(void *arg, int argc, char **argv, rl_config *c);
    void (*say)(void *arg, const char *line);
    void *arg;
} mj_worker_proc;
int mj_worker_main(const mj_worker_proc *o);

/* ---- The push tree's root, a job of its own (tree_root.c) -----------------
 * Waits up to wait_s for STORE/main/LATEST, serves the run "main" in the
 * zone of `node` (from the fleet file), writes PDIR/root.json and then
 * PDIR/push.addr, and serves until *stop (0) or an error. */
typedef struct mj_push_root_opts {
    const char *store, *fleet, *pdir, *node;
    double wait_s;
    void (*on_start)(void *arg, const char *zone, const char *addr);
    void *arg;
} mj_push_root_opts;
int mj_push_root(const mj_push_root_opts *o, volatile sig_atomic_t *stop);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
