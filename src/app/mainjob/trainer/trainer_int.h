/* shoal mainjob, trainer/: the data-parallel trainer gang.  Rank 0 runs the
 * RL engine (src/rl/engine) with remote workers, broadcasts each batch,
 * every rank trains on its share of the groups and all-reduces gradients
 * over the ring (ring/), so all ranks hold the same weights (mj_train_*);
 * rank 0 publishes every version to the store (mj_trainer_rank0). */
#ifndef SHOAL_MJ_TRAINER_INT_H
#define SHOAL_MJ_TRAINER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"
#include "shoal/rl.h"
#include "app/mainjob/ring/ring_int.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

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

/* ---- One rank as a process (gang.c) ----------------------------------------
 * Reads where it stands from the agent's environment, joins the ring
 * (rendezvous in STORE/ring/JOB-ATTEMPT, up to ring_timeout seconds) and
 * runs rank 0 (out->res: the result, the caller's) or a follower
 * (out->steps, out->in_sync). */
typedef struct mj_trainer_proc {
    const char *store, *events, *result;
    double ring_timeout;
    char **args; /* the rl options as given, for the workers */
    int nargs;
    void (*on_listen)(void *arg, const char *addr);
    void *arg;
} mj_trainer_proc;
typedef struct mj_trainer_outcome {
    int rank, world, in_sync;
    long steps;
    json_t *res;
} mj_trainer_outcome;
int mj_trainer_main(const rl_config *c, const mj_trainer_proc *o, mj_trainer_outcome *out);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
