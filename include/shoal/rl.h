/* shoal rl: tasks, a sandboxed interpreter, rollouts, policy-gradient losses
 * with off-policy corrections, and the asynchronous trainer/worker runtime.
 *
 * Pure parts (no clock, file or socket): the interpreter, the tasks, the
 * losses, sampling and the training step (randomness and versions are
 * arguments).  The runtime (rl_run) is the I/O edge: it forks worker
 * processes, talks to them over socketpairs and reads the clock.
 *
 * Text is character level over the alphabet RL_ALPHABET; token i is the i-th
 * character.  A sequence is BOS, the prompt (ending in '='), the response,
 * EOS. */
#ifndef SHOAL_RL_H
#define SHOAL_RL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "shoal/common.h"
#include "shoal/nn.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

#define RL_ALPHABET "^$0123456789x+-*()=dsp[]"
#define RL_BOS 0
#define RL_EOS 1
#define RL_MAX_T 32    /* longest sequence a trajectory holds */
#define RL_MAX_TESTS 8 /* hidden tests per problem */

int rl_vocab(void);
/* Token id of a character, or -1 if it is not in the alphabet. */
int rl_tok(char ch);
char rl_chr(int tok);

/* ---- The stack-code language (see docs/rl-tasks.md) --------------------
 * A program is a string over "0123456789xdsp+-*[]": a digit pushes itself,
 * x pushes the input, d duplicates, s swaps, p pops, + - * pop two and push
 * the result, [ ... ] repeats its body while the top of the stack is
 * non-zero (the top is peeked, not popped).  The result is the top of the
 * stack at the end. */
typedef struct rl_limits {
    int max_steps; /* instructions executed, loops included */
    int max_stack; /* values on the stack (the memory limit) */
    int max_depth; /* nesting of [ ] (the control-stack limit) */
    int max_len;   /* program length */
} rl_limits;

enum {
    RL_SC_OK = 0,
    RL_SC_SYNTAX,    /* an unknown character or unbalanced brackets */
    RL_SC_UNDERFLOW, /* an operation found too few values */
    RL_SC_STACK,     /* the stack limit was reached */
    RL_SC_DEPTH,     /* brackets nested deeper than allowed */
    RL_SC_STEPS,     /* the step limit was reached */
    RL_SC_OVERFLOW,  /* arithmetic left int64 */
    RL_SC_TOOLONG,   /* the program is longer than allowed */
};

rl_limits rl_limits_default(void);
/* Runs prog (len chars) on input x.  Returns an RL_SC_* status; *result gets
 * the top of the stack on RL_SC_OK.  Never runs past the limits. */
int rl_sc_run(const char *prog, int len, int64_t x, const rl_limits *lim, int64_t *result);
const char *rl_sc_status_name(int status);

/* ---- Tasks -------------------------------------------------------------- */

enum { RL_TASK_CODE = 0, RL_TASK_ARITH = 1 };
int rl_task_parse(const char *name, int *task);
const char *rl_task_name(int task);

typedef struct rl_problem {
    uint64_t id;
    int task;
    char prompt[24]; /* ends in '=' */
    char answer[16]; /* a demonstration (reference solution) */
    int ntests;
    int64_t in[RL_MAX_TESTS], out[RL_MAX_TESTS]; /* hidden tests (code) */
} rl_problem;

/* Builds problem number `id` of a task; problems whose prompts hash into the
 * held-out fifth are evaluation problems (*held_out = 1). */
void rl_problem_make(int task, uint64_t id, rl_problem *p, int *held_out);
/* Draws a training (held_out = 0) or held-out (1) problem using *rng. */
void rl_problem_draw(int task, int held_out, uint64_t *rng, rl_problem *p);
/* The fixed held-out evaluation set: the first n held-out problems. */
void rl_eval_set(int task, int n, rl_problem *out);
/* Reward of a response (chars up to but excluding EOS; terminated = 0 if
 * the response ran out of room without EOS): the fraction of hidden tests
 * passed (code) or 1 for the exact answer (arith). */
float rl_reward(const rl_problem *p, const char *resp, int len, int terminated);

/* ---- Sampling ------------------------------------------------------------ */

typedef struct rl_traj {
    int32_t tokens[RL_MAX_T];
    float blogp[RL_MAX_T]; /* behaviour log-prob of tokens[t], t >= plen */
    int32_t len, plen;     /* tokens in all; prompt tokens (BOS..'=') */
    float reward;
    int32_t group;                /* trajectories of one prompt share it */
    int32_t vstart, vend;         /* policy version at the first and last token */
    int32_t worker;
    uint64_t problem;
} rl_traj;

typedef struct rl_sampling {
    float temperature, top_p;
    int max_new; /* response tokens, EOS included */
    int no_kv_cache; /* 1: recompute the whole prefix at every step (the reference path) */
} rl_sampling;

/* Called between decoding steps; it may change the model's weights (an
 * in-flight update) and returns the current policy version. */
typedef int (*rl_step_hook)(void *ctx);

/* Samples `group` responses to each of n problems (n*group trajectories
 * into out, groups numbered group0 + i).  Member j of group g draws from a
 * random stream that depends only on *rng, g and j: with the same weights,
 * a group's responses are the same whichever call, request or worker
 * generates it.  *rng is then advanced.  hook may be NULL (version then
 * stays `version`). */
int rl_generate(nn_model *m, const rl_problem *probs, int n, int group, int group0,
                const rl_sampling *s, uint64_t *rng, int version, rl_step_hook hook,
                void *hook_ctx, rl_traj *out);
/* Mean reward of `samples` responses to each problem drawn with sampling s
 * (temperature 0: greedy) from a generator seeded with `seed`, so that the
 * same weights always score the same. */
int rl_evaluate(nn_model *m, const rl_problem *probs, int n, const rl_sampling *s, int samples,
                uint64_t seed, double *reward);

/* ---- Losses ---------------------------------------------------------------- */

/* pg: REINFORCE.  naive: PPO clipped against pi_old (the trainer's weights at
 * the start of the step) with no behaviour weight, as if pi_old had sampled
 * the data (uncorrected).  ppo: PPO clipped against mu.  tis, mis,
 * decoupled: PPO against pi_old with the behaviour weight pi_old/mu
 * truncated, masked outside a band (IcePop), or whole.  See docs/rl.md. */
enum { RL_LOSS_PG, RL_LOSS_PPO, RL_LOSS_TIS, RL_LOSS_MIS, RL_LOSS_DECOUPLED, RL_LOSS_NAIVE,
       RL_LOSS_COUNT };
int rl_loss_parse(const char *name, int *loss);
const char *rl_loss_name(int loss);

typedef struct rl_loss_cfg {
    int kind;
    float clip;           /* PPO ratio clip epsilon (0.2) */
    float tis_cap;        /* TIS truncation C (2) */
    float mis_lo, mis_hi; /* MIS band (0.5, 2) */
    int mis_seq;          /* 1: mask whole sequences by their geometric-mean ratio */
    float dec_cap;        /* decoupled behaviour-weight cap (0: none) */
} rl_loss_cfg;
rl_loss_cfg rl_loss_defaults(int kind);

/* One response token: log-probs under the current policy (logp), the
 * trainer's proximal/old policy (lold, the weights at the start of the
 * step) and the behaviour policy that sampled it (lmu); its advantage; the
 * index of its sequence (0..nseq-1). */
typedef struct rl_tok_in {
    float logp, lold, lmu, adv;
    int seq;
} rl_tok_in;

typedef struct rl_loss_stats {
    int tokens, clipped, masked;
} rl_loss_stats;

/* The token-mean loss over n tokens; coef[i] = dLoss/dlogp_i.  Pure. */
double rl_loss(const rl_loss_cfg *c, const rl_tok_in *t, int n, int nseq, float *coef,
               rl_loss_stats *st);

/* GRPO: per trajectory, (r - mean of its group) / (std of its group + 1e-6),
 * 0 for a group whose rewards are all equal.  Groups are runs of equal
 * rl_traj.group values (trajectories of a group are adjacent). */
void rl_grpo_advantages(const rl_traj *tr, int n, float *adv);

/* ---- The training step (pure) -------------------------------------------- */

typedef struct rl_step_stats {
    double loss, reward, grad_norm;
    double abs_dlogp; /* mean |log pi_old - log mu| over tokens */
    double kl;        /* k3 estimate of KL(mu || pi_old) */
    double clipped_frac, masked_frac;
    int tokens, skipped; /* skipped: NaN/inf loss or gradient, weights kept */
} rl_step_stats;

typedef struct rl_trainer {
    nn_model *model;
    nn_adamw opt;
    rl_loss_cfg loss;
    float temperature;
    int minibatches;
    /* Optional: called after each minibatch's backward pass and before its
     * AdamW update, with the gradients in nn_grads(model).  Data-parallel
     * trainers all-reduce them here (src/app/mainjob).  NULL: none. */
    int (*grad_hook)(void *ctx, nn_model *m);
    void *grad_ctx;
} rl_trainer;

/* One optimisation step on n trajectories (whole groups).  A NaN or
 * infinite loss or gradient skips the update (st->skipped = 1, weights kept)
 * and returns SH_ERANGE with a message saying so. */
int rl_train_step(rl_trainer *tr, const rl_traj *trajs, int n, rl_step_stats *st);
/* One supervised step on the demonstrations of n problems. */
int rl_sft_step(nn_model *m, nn_adamw *opt, const rl_problem *p, int n, float *loss);

/* Rounds weights to bf16 (round to nearest even), in place. */
void rl_round_bf16(float *w, size_t n);

/* Writes the policy as a bf16 safetensors checkpoint with Hugging Face
 * tensor names; metadata records the version and shape, plus the string
 * pairs of `extra` (may be NULL).  Atomic (src/weights/ckpt). */
int rl_save_checkpoint(nn_model *m, const char *path, int version, const json_t *extra);
/* Loads a checkpoint written by rl_save_checkpoint into a model of the same
 * shape (SH_EMISMATCH naming the tensor otherwise). */
int rl_load_checkpoint(nn_model *m, const char *path);

struct ckpt;
/* The policy as a safetensors image in memory (BF16 or F32 tensors, Hugging
 * Face names, no metadata): what the trainer diffs into shoal deltas for the
 * workers.  *out is the caller's (sh_buf_free). */
int rl_policy_image(nn_model *m, int bf16, sh_buf *out);
/* Loads the model's tensors from an opened checkpoint (BF16, F32, or
 * F8_E4M3 with NAME_scale_inv block scales as delta_quant_fp8 writes them);
 * `what` names it in errors. */
int rl_load_view(nn_model *m, const struct ckpt *c, const char *what);

/* ---- The runtime (I/O edge) ------------------------------------------------ */

enum { RL_MODE_SYNC = 0, RL_MODE_ASYNC = 1 };
enum { RL_DTYPE_FP32 = 0, RL_DTYPE_BF16 = 1, RL_DTYPE_FP8 = 2 };
/* "fp32", "bf16", "fp8" and back; the parse error names the value. */
int rl_dtype_parse(const char *name, int *dtype);
const char *rl_dtype_name(int dtype);

#define RL_MAX_WORKERS 16

typedef struct rl_worker_spec {
    char name[16];
    double speed; /* 1 = full speed; 0.25 = four times slower */
    double price; /* dollars per hour */
    int req_prompts; /* async: prompts per request for this worker (0: the run's) */
    int max_seqs;    /* emulated GPU time: sequences its memory holds at once (0: no limit) */
} rl_worker_spec;

typedef struct rl_config {
    int task, mode, max_lag, dtype, steps;
    uint64_t seed;
    rl_loss_cfg loss;
    rl_sampling sampling;
    int prompts_per_step, group; /* a step trains on prompts_per_step*group trajectories */
    int minibatches;
    int req_prompts; /* async: prompts per worker request (0: a quarter step's) */
    float lr;
    int warm_steps;    /* supervised warm-start steps before RL */
    /* A folder where warm-started weights are kept (F32 safetensors named
     * by a hash of everything they depend on: task, model shape, seed,
     * steps), so that runs differing only in RL settings train the warm
     * start once.  A cached start is bit-for-bit the trained one.  NULL:
     * always train. */
    const char *warm_cache;
    int eval_every, eval_n;
    int nworkers;
    rl_worker_spec workers[RL_MAX_WORKERS];
    /* A decoding step on a speed-1 worker lasts gen_cost times its CPU time
     * (the rest is slept): rollouts dominate RL time on real GPUs, and
     * sleeping keeps the emulation from competing with the trainer for
     * cores. */
    double gen_cost;
    /* The trainer is an emulated GPU too: a training step (with making
     * the next version) lasts train_cost times its CPU time, the rest
     * slept.  1 (the default) does not stretch it.  Above 1 it makes a
     * run's timing independent of other load on the machine, as long as
     * the trainer gets at least 1/train_cost of a core: what lets
     * `shoal rl sweep` run several runs at once. */
    double train_cost;
    int kill_at_step;  /* fault injection: SIGKILL worker 0 at this step (0: never) */
    int nan_at_step;   /* fault injection: a NaN behaviour log-prob in this step's batch (0: never) */
    int respawn;       /* replace a worker that died */
    double target_reward; /* wall-clock time to reach it is reported (0: none) */
    nn_config model;
    const char *out_dir; /* where checkpoints go (NULL: none) */
    int save_every;      /* also save every N steps (0: only the last) */
    const char *self_exe; /* unused unless workers exec; may be NULL */
    int quiet;
    /* Remote workers (the main job, docs/mainjob.md): with remote = 1 the
     * trainer forks none; it accepts connections on listen_fd (a listening
     * stream socket), each opening with HELLO, up to RL_MAX_WORKERS at a
     * time, joining and leaving at any moment.  nworkers and workers[] are
     * then unused.  At the end every worker gets the last weights and STOP,
     * and the trainer waits up to drain_s for its BYE. */
    int remote, listen_fd;
    double drain_s;
    /* Optional hooks, all called with hook_ctx.  on_publish: after each
     * version is made (img: its safetensors image; delta: from the previous
     * version, empty for the first); a failure stops the run.  train_fn:
     * replaces rl_train_step (data-parallel trainers). */
    int (*on_publish)(void *ctx, int version, const sh_buf *img, const sh_buf *delta);
    int (*train_fn)(void *ctx, rl_trainer *tr, const rl_traj *t, int n, rl_step_stats *st);
    void *hook_ctx;
    /* Emulated GPU time (rl_emu_*; docs/mainjob.md).  step_s > 0: a worker's
     * decoding step lasts rl_emu_step_s() of its request's sequences
     * (instead of gen_cost times its CPU time), and the result reports each
     * worker's emulated busy seconds (gpu_s), counted from the work done, not
     * from the clock.  seq_cost: the cost of one more concurrent sequence
     * relative to a one-sequence step. */
    double step_s, seq_cost;
    int stop_at_target; /* end the run at the evaluation that reaches target_reward */
    /* Async, ordered: step s trains on exactly groups [s P, (s + 1) P) of the
     * run's sequence (P = prompts_per_step), whichever workers generate them,
     * and requests wait for weights new enough that none is dropped.  Runs
     * on different pools from one seed then train on the same problems with
     * the same sampling streams, differing only in the versions that
     * generated each group: what `rl fleet-cost` compares. */
    int ordered;
    /* > 0: end the run one evaluation after the first evaluation at or
     * above this held-out reward (rl sweep --quick: an async run stops once
     * it has shown it reaches its sync partner's final reward). */
    double stop_reward;
    int target_window;  /* the target counts as reached when the mean of the last
                         * target_window evaluations (1..RL_TARGET_WINDOW_MAX; 0: 1) is at it */
    /* The paced run (rl_paced_run) only: emulated seconds of one training
     * step, and its FP8 rollout weights: scaling blocks of fp8_block x
     * fp8_block (0: one scale per tensor), embeddings and output head
     * quantised too when fp8_embed is 1.  rl_run's workers quantise as
     * `shoal quant fp8` does (128 x 128 blocks, embeddings and head kept
     * in bf16). */
    double train_s;
    int fp8_block, fp8_embed;
    int fp8_act; /* FP8 rollouts also round activations (W8A8, nn_set_fp8_act) */
    /* > 0: the target is reward_start + target_gain instead of
     * target_reward (warm starts differ between seeds by more than RL
     * gains; a sync and an async run of one seed share their start). */
    double target_gain;
} rl_config;

#define RL_TARGET_WINDOW_MAX 16

/* Defaults: code task, async, max lag 2, decoupled loss, bf16 rollouts, 3
 * heterogeneous workers. */
void rl_config_default(rl_config *c);
/* Checks every field; the message names the option to fix. */
int rl_config_check(const rl_config *c);
/* Parses "name:speed:price,..." into the worker list. */
int rl_workers_parse(const char *s, rl_config *c);

/* Called after each step and each evaluation with a JSON object describing
 * it (borrowed). */
typedef void (*rl_progress_fn)(const json_t *event, void *ctx);

/* Runs a whole training: warm start, then RL in the configured mode.  On
 * success *result is a new JSON object (caller decrefs) with reward_start,
 * reward_end, wall_s, steps, tokens_per_s, the curve and per-step stats. */
int rl_run(const rl_config *c, rl_progress_fn progress, void *ctx, json_t **result);

/* The same RL as rl_run in one process, with emulated time: requests last
 * rl_emu_request_s() (c->step_s, c->seq_cost > 0), training steps
 * c->train_s (> 0), so that which version generated each group, and the
 * time each step ends, depend on the configuration and the work alone, not
 * on the machine's load; a seed reproduces a run bit for bit.  Sync and
 * async (max_lag, ordered, stop_at_target) as in rl_run, without in-flight
 * updates (a request keeps the version it started with) or remote
 * workers.  *result (caller decrefs): reward_start, reward_end, emulated_s,
 * time_to_target_s (emulated, -1: not reached), the curve (t_s, step,
 * reward), the realised staleness histogram of the trained trajectories,
 * dropped_stale, the mean |log pi_old - log mu| of the first step and of
 * all steps, and per worker (workers: name, trajectories, requests, gpu_s)
 * its completed requests and their emulated seconds.  See
 * src/rl/engine/paced.c. */
int rl_paced_run(const rl_config *c, rl_progress_fn progress, void *ctx, json_t **result);
/* Quantises the model's matrices in place as FP8 rollout weights: e4m3
 * with one scale (amax / 448) per block x block tile (block 0: per
 * tensor), then back to F32.  Vectors are left alone; embeddings and the
 * output head too unless `embed`.  Pure. */
void rl_round_fp8(nn_model *m, int block, int embed);

/* ---- The sweep (src/rl/engine/sweep.c; docs/rl.md) -------------------------------
 * Paced runs over staleness bound x loss x rollout dtype x seed, forked
 * `jobs` at a time, and the figures comparing them. */
typedef struct rl_sweep_cfg {
    rl_config base;       /* every run's settings but mode, max_lag, loss kind, dtype, seed */
    int lags[16], nlags;  /* staleness bounds; 0 is the sync run */
    int losses[RL_LOSS_COUNT], nlosses;
    int dtypes[3], ndtypes;
    int fp8_lags[16], nfp8_lags; /* dtypes other than bf16 only at these bounds (0 of them: all) */
    int seeds;            /* seeds seed0, seed0 + 1, ... */
    uint64_t seed0;
    int last_k;           /* final reward: the mean of the last last_k evaluations */
    int jobs;             /* runs at once */
    const char *dir;      /* DIR/runs: run files; DIR/warm: warm starts (unless base.warm_cache) */
} rl_sweep_cfg;
/* The full grid (quick = 0) or the quick one; dir and jobs are the caller's. */
void rl_sweep_default(rl_sweep_cfg *s, int quick);
/* Checks the grid and the base configuration; the message names the option. */
int rl_sweep_check(const rl_sweep_cfg *s);
typedef void (*rl_sweep_progress)(int done, int total, void *ctx);
/* Runs the sweep.  *out (caller decrefs): the grid, the settings and one
 * row of figures per cell (reward_final, vs_sync, vs_bf16, time to target,
 * speed-up, staleness, mismatch, each {mean, se, n}) with its runs. */
int rl_sweep_run(const rl_sweep_cfg *s, rl_sweep_progress progress, void *ctx, json_t **out);

/* Emulated seconds of one decoding step of `seqs` sequences on worker w
 * (0 for seqs < 1).  Pure. */
double rl_emu_step_s(const rl_config *c, const rl_worker_spec *w, int seqs);
/* Decoding steps of a request: its longest response (len - plen). */
int rl_emu_steps(const rl_traj *t, int n);
/* Emulated seconds of the request that produced t[0..n) on worker w. */
double rl_emu_request_s(const rl_config *c, const rl_worker_spec *w, const rl_traj *t, int n);

/* A remote rollout worker on a connected stream socket fd (the main job):
 * sends HELLO naming `me`, then serves the trainer as a forked worker does
 * until STOP (answered with BYE) or EOF.  c must match the trainer's model
 * shape, task, sampling and gen_cost.  Never returns: exits 0 on STOP or EOF,
 * 3 on an error (logged). */
void rl_worker_serve(const rl_config *c, const rl_worker_spec *me, int fd)
    __attribute__((noreturn));

/* Where a remote worker's weights come from when they do not travel on the
 * trainer's socket: a replica of the store on a push tree (src/app/mainjob),
 * numbered in policy versions.  A view pins one version's image until it is
 * released; the worker holds one at a time and takes a newer one between two
 * decoding steps.  The callbacks run on the worker's one thread. */
typedef struct rl_weights_view {
    int version;          /* policy version */
    const uint8_t *image; /* its safetensors image (read-only, len bytes) */
    size_t len;
    void *priv;
} rl_weights_view;

typedef struct rl_weights_source {
    /* The newest policy version that can be acquired now; -1: none yet. */
    int (*version)(void *arg);
    /* Waits up to timeout_s until version >= v can be acquired: 0, or
     * SH_ETIMEDOUT. */
    int (*wait)(void *arg, int v, double timeout_s);
    /* Pins the newest version; SH_EAGAIN when there is none. */
    int (*acquire)(void *arg, rl_weights_view *out);
    void (*release)(void *arg, rl_weights_view *v);
    void *arg;
    /* How long a request whose min_version this worker does not hold waits
     * for it before it is refused (REFUSE, docs/rl-protocol.md); 0: 5 s. */
    double min_wait_s;
} rl_weights_source;

/* rl_worker_serve with the weights from src: the HELLO says so (flag
 * RL_HELLO_PUSH), the trainer sends it no WEIGHTS, and a request for a
 * version src cannot bring within src->min_wait_s is answered with REFUSE.
 * At STOP the worker first takes the trainer's final version (waiting up to
 * 15 s), so its BYE names it. */
void rl_worker_serve_from(const rl_config *c, const rl_worker_spec *me, int fd,
                          const rl_weights_source *src) __attribute__((noreturn));

/* ---- The protocol for programs outside shoal (src/rl/engine/link.c) -------
 * A trainer that is not rl_run, or a worker that is not rl_worker_serve,
 * speaking docs/rl-protocol.md over TCP: python/shoal/rl.py's Trainer and
 * Worker (ctypes) drive these.  The trainer's end runs the C runtime's
 * checks (trajcheck.c) on every message and drops a worker that fails them.
 * One object per end, used from one thread at a time; calls return 0 or a
 * count, or a negative SH_E* code with sh_errmsg() set. */
typedef struct rl_link rl_link;

/* The trainer's end: listens on hostport ("127.0.0.1:0" picks a port).
 * secret_hex: the run's secret, 32 hex digits ("" none, NULL:
 * SHOAL_RUN_SECRET); a worker's HELLO must prove it.  Group g's problem is
 * drawn from (seed, task, g) alone, as rl_run's are; group: trajectories
 * per prompt; max_new: response tokens; max_len: the context (<= 32);
 * max_lag: a group whose first token is more than max_lag versions older
 * than the trainer's is dropped and asked for again. */
int rl_link_listen(const char *hostport, const char *secret_hex, int task, uint64_t seed, int group,
                   int max_new, int max_len, int max_lag, rl_link **out);
/* "host:port" it listens on, or the trainer's a worker connected to. */
const char *rl_link_addr(const rl_link *l);
/* The newest version the trainer has published (answers may be no newer;
 * staleness is counted against it).  Versions only grow. */
int rl_link_set_version(rl_link *l, int version);
/* Asks for the next nprompts groups with at least min_version (exact = 0)
 * or exactly it (exact = 1: every token sampled by it; a worker holding
 * another refuses).  Returns the first group's number.  The request goes
 * to the least busy worker (up to 4 each) once one is connected; one lost
 * with a worker, refused, or stale is asked for again first, except a
 * refused exact one (weights never go back): stats list it in
 * refused_exact. */
int rl_link_ask(rl_link *l, int nprompts, int min_version, int exact);
/* Serves the workers for up to timeout_s: accepts, checks and answers;
 * returns as soon as whole groups of checked trajectories are in, copying
 * up to cap (>= group) rl_traj records into out (rl_traj.worker: the
 * worker's slot); 0 when none came in time. */
int rl_link_poll(rl_link *l, double timeout_s, void *out, int cap);
/* Workers connected and past their HELLO. */
int rl_link_workers(const rl_link *l);
/* STOP (naming final_version) to every worker, then up to drain_s for their
 * BYEs; the connections are closed. */
int rl_link_stop(rl_link *l, int final_version, double drain_s);
/* Counters (trajectories, dropped_stale, dropped_dead, refused_requests,
 * workers_dropped_for_violations, staleness_hist[s]: trajectories handed
 * out s versions old, ...) and one entry per worker (dropped_for: why it
 * was dropped; final: its BYE), as JSON text (*out: free with sh_free). */
int rl_link_stats_json(const rl_link *l, char **out);
void rl_link_close(rl_link *l);

/* A worker's end: connects to the trainer at hostport and says HELLO as
 * `name` (1..15 printable characters); push = 1: its weights come by the
 * push tree (no WEIGHTS on this link). */
int rl_link_connect(const char *hostport, const char *secret_hex, const char *name, int push, rl_link **out);
/* Waits up to timeout_s for the trainer's next message: 0 (none), or its
 * type with info (cap >= 8 + prompts) filled: RL_MSG_REQUEST (2): info =
 * {min_version, exact, nprompts, group, group0, seed, 0, 0, problem ids...};
 * RL_MSG_STOP (4): {final version}; RL_MSG_WEIGHTS (1, direct transport,
 * applied: rl_link_image): {version}.  The trainer hanging up is SH_ENOENT. */
int rl_link_next(rl_link *l, double timeout_s, int64_t *info, int cap);
/* Answers the oldest unanswered request with n = nprompts * group rl_traj
 * records, or refuses it holding `version` (-1: none). */
int rl_link_send(rl_link *l, const void *trajs, int n);
int rl_link_refuse(rl_link *l, int version);
/* Answers STOP: the version held and the xxh3-128 of its image (NULL: the
 * direct transport's image). */
int rl_link_bye(rl_link *l, int version, const void *image, size_t len);
/* Direct transport: the image held (safetensors); returns its version. */
int rl_link_image(const rl_link *l, const void **data, size_t *len);

/* The tasks with plain arguments.  rl_task_prompt: problem id's prompt
 * (ends in '=') into buf; returns 1 for a held-out problem, else 0.
 * rl_task_draw: a training (held_out 0) or held-out problem's id from *rng.
 * rl_task_reward: the reward of response tokens resp[0..n) (up to EOS;
 * none: unterminated) on the problem's hidden tests. */
const char *rl_alphabet(void);
int rl_task_prompt(int task, uint64_t id, char *buf, size_t cap);
/* A demonstration (reference solution) of problem id, for warm starts. */
int rl_task_answer(int task, uint64_t id, char *buf, size_t cap);
uint64_t rl_task_draw(int task, int held_out, uint64_t *rng);
int rl_task_eval_ids(int task, int n, uint64_t *ids);
int rl_task_reward(int task, uint64_t id, const int32_t *resp, int n, float *reward);
/* sizeof(rl_traj): 296 (docs/rl-protocol.md gives its layout). */
size_t rl_traj_sizeof(void);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
