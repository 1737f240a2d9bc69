/* Internal to src/rl/engine: the trainer's state, shared by its event loop
 * (runtime.c) and its compute thread (compute.c), and the worker process
 * entry point. */
#ifndef SHOAL_RL_RUNTIME_H
#define SHOAL_RL_RUNTIME_H

#include <sys/types.h>

#include "shoal/rl.h"

typedef struct rl__compute rl__compute;

/* Held-out reward is the mean over this many samples per problem at the
 * training temperature: what RL optimises, and smoother than one greedy
 * answer per problem. */
#define RL_EVAL_SAMPLES 8
#define RL_QUEUE 4
/* Seconds a remote connection has to send its HELLO. */
#define RL_HELLO_S 5

typedef struct wk {
    pid_t pid;
    /* busy: requests outstanding (async queues up to RL_QUEUE, so that a
     * worker has its next request at hand while the trainer trains instead
     * of idling until the trainer reads its result); req_trajs: their sizes,
     * oldest first (a worker answers in order). */
    int fd, alive, busy, req_trajs[RL_QUEUE];
    int req_group0[RL_QUEUE]; /* each request's first group (ordered: re-issued if lost) */
    int req_minv[RL_QUEUE];   /* each request's min_version: its answer is no older */
    sh_buf in, out;
    size_t out_off;
    double busy_since, busy_s;
    double gpu_s; /* emulated busy GPU seconds (rl_config.step_s > 0), from the work done */
    long trajs, trajs_at_join; /* trajs_at_join: trajs when the current process joined */
    int hello;            /* remote: HELLO received (forked workers start with 1) */
    int push;             /* its weights come by the push tree: no WEIGHTS to it */
    long refused;         /* requests it refused (REFUSE) */
    int bye, final_version; /* BYE received, and the version it reported */
    int stopped;          /* STOP was queued to it: only then may it say BYE */
    char why[256];        /* why it was dropped, if for breaking the protocol */
    sh_hash128 final_hash;
    double joined, left;  /* seconds since the RL phase began (left < 0: still here) */
} wk;

typedef struct run {
    const rl_config *c;
    rl_trainer tr;
    wk w[RL_MAX_WORKERS];
    /* What each slot stands for: c->workers for forked workers, the HELLO
     * of the current connection for remote ones. */
    rl_worker_spec spec[RL_MAX_WORKERS];
    int nslots;
    long joins, dropped_end;
    json_t *gone; /* remote workers that left, as result entries */
    rl_traj *buf;
    int nbuf, cap, batch, version, step, group_next;
    long issued; /* trajectories admitted and not lost; bounds staleness */
    /* The run's seed for problems and sampling: group g's problem and
     * responses are functions of it and g alone. */
    uint64_t seed;
    /* Ordered: groups lost with a dead worker, as (first group, prompts)
     * pairs, asked for again before any new group. */
    int lost[2 * RL_MAX_WORKERS * RL_QUEUE], nlost;
    double t0, eval_s;
    rl_traj *sortbuf; /* scratch for sort_buffer */
    long gen_tokens, train_tokens, dropped_stale, dropped_dead, deaths, respawns, skipped;
    long stale_hist[RL_MAX_T + 2];
    long inflight_updates;
    long refused, push_joins; /* REFUSEd requests; workers that joined fed by the push tree */
    double weights_bytes;     /* WEIGHTS bytes queued to workers (the direct transport) */
    rl_problem *evalset;
    /* The published image of the current version, and the delta that led
     * to it from the previous one (what workers holding that get).  Owned
     * by the event loop; the compute thread reads ck (to diff against)
     * while it trains, and the loop replaces all three only when the
     * thread hands over the next version. */
    sh_buf img, delta;
    struct ckpt *ck;
    double image_bytes, delta_bytes_sum;
    long deltas;
    json_t *curve, *steps, *ckpts;
    rl_progress_fn progress;
    void *pctx;
    double time_to_target, last_eval;
    double recent[RL_TARGET_WINDOW_MAX]; /* the last evaluations' rewards, a ring */
    int nevals;
    int stop_step; /* > 0: the last step, set when stop_reward was reached */
    /* Where the trainer's wall-clock time goes: training steps, making and
     * queueing deltas, and waiting in poll for workers. */
    double t_train, t_publish, t_wait;
    rl__compute *cp; /* the compute thread (compute.c) */
    int training;    /* a step has been handed to it and its weights are not back yet */
    double pending_eval_t; /* wall time of the version being evaluated */
    int pending_eval_step;
    sh_hash128 secret; /* remote mode: a HELLO must carry it (SHOAL_RUN_SECRET) */
    int has_secret;
    long refused_hellos;
    long dropped_unproven; /* remote connections closed before their HELLO */
    long violations;       /* workers dropped for a message that failed the checks (trajcheck.c) */
} run;


/* Wall-clock seconds of the RL phase so far (evaluations included: they
 * run on the compute thread while the loop keeps serving workers). */
double rl__wall(const run *r);
/* The run has done its steps, or reached its target with stop_at_target. */
int rl__over(const run *r);

/* ---- The compute thread (compute.c) --------------------------------------
 * The trainer's event loop (runtime.c) owns the sockets and the buffer of
 * trajectories; the compute thread owns the model and the optimiser.  The
 * loop hands it one batch at a time; the thread trains, makes the next
 * version's image and delta, and hands them back; then, if asked, it
 * evaluates the new weights and saves a checkpoint while the loop already
 * sends them to the workers. */

/* Starts the thread.  wake_fd() becomes readable whenever it has news. */
int rl__compute_start(run *r);
int rl__compute_wake_fd(const run *r);
/* Stops and joins the thread (waiting for the work in hand); NULL-safe. */
void rl__compute_stop(run *r);
/* 1 while the thread has work (training, evaluating or saving). */
int rl__compute_busy(run *r);
/* Hands the first r->batch trajectories of r->buf to the thread. */
int rl__compute_dispatch(run *r);
/* Takes what the thread has finished: a trained step (new weights are
 * queued to the workers, the step is reported) and an evaluation. */
int rl__compute_collect(run *r);
/* Publishes the trainer's current weights as r->version (the first
 * version, before the thread starts; later ones are made by the thread). */
int rl__publish_now(run *r);
json_t *rl__hist_json(const long *h, int n);

/* The supervised warm start (warm.c): trains m on demonstrations, or
 * loads the result from c->warm_cache when an earlier run made it. */
int rl__warm_start(const rl_config *c, nn_model *m);
int rl__enqueue_weights(run *r, wk *w, int full);
/* Queues STOP, naming the final version (r->version). */
int rl__queue_stop(run *r, wk *w);

/* FP8 rollouts (checkpoint.c): loads the dequantised FP8 view of the BF16
 * image img into m, in memory.  With prev (the image m's weights were last
 * loaded from this way) only the 128 x 128 blocks whose bytes differ are
 * re-quantised; *blocks (optional) counts the blocks redone. */
int rl__load_fp8(nn_model *m, const struct ckpt *img, const struct ckpt *prev, uint64_t *blocks);

/* Runs a rollout worker on fd until STOP or EOF; never returns (_exit). */
void rl__worker_main(const rl_config *c, int idx, int fd) __attribute__((noreturn));

#endif
