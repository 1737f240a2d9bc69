/* The paced run: the same RL as rl_run -- warm start, GRPO groups sampled
 * by workers, the trainer's step, the staleness bound -- in one process,
 * with time emulated instead of measured.
 *
 * Why: an experiment about staleness needs the staleness to be what the
 * configuration makes it.  In rl_run it is what the machine makes it: the
 * trainer and the workers share the cores with everything else, and a
 * loaded machine turns every async run into a trainer-bound, maximally
 * stale one.  Here every duration is a function of the work alone
 * (docs/mainjob.md, "Emulated GPU time"): a worker's request lasts
 * rl_emu_request_s() of the sequences it decoded, a training step lasts
 * train_s, so the schedule -- which version generated which group, and when
 * each step ends -- is the same on an idle laptop and a loaded server, and a
 * seed reproduces a run bit for bit.  What is real: the model, the
 * sampling (with the rollout dtype's weights), the rewards, the losses and
 * the optimiser.  What is emulated: time, and the transport of weights
 * (workers read the trainer's published weights directly, rounded to the
 * rollout dtype as a worker's copy would be).
 *
 * The schedule, a discrete-event simulation:
 *   sync:  each step the batch's prompts are split evenly over the workers,
 *          all start with the current version, the step begins when the
 *          slowest is done and ends train_s later with the next version.
 *   async: an idle worker starts a request of req_prompts prompts with the
 *          version current at that moment, as long as the trajectories
 *          admitted stay within (steps done + max_lag + 1) batches; the
 *          trainer starts a step as soon as it is idle and a batch of whole
 *          groups is buffered (oldest groups first), after dropping groups
 *          more than max_lag versions old; the new version becomes visible
 *          train_s later.  A request runs to its end with the version it
 *          started with (no in-flight update: emulated requests are
 *          short, and a group's version is then one number).
 * Ordered (c->ordered), the trainer waits for exactly groups [s P, (s + 1) P)
 * for step s: admission already keeps them within max_lag versions, so
 * none is dropped, and pools from one seed train on the same batches.
 * With stop_at_target the run ends at the evaluation that reaches the
 * target.  Each worker's completed requests are billed (gpu_s); a request
 * in flight when the run ends is not.
 * Held-out evaluations cost no emulated time (a separate evaluator); each
 * is dated when the version it measures became visible.
 *
 * Pure: no clock, socket or process.  The warm-start cache is the only
 * file touched (c->warm_cache). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rl/engine/runtime_int.h"
#include "shoal/ckpt.h"

/* A worker's request in flight: its trajectories and when it ends. */
typedef struct preq {
    rl_traj *t;
    int n;
    double end; /* < 0: the worker is idle */
    double dur; /* its emulated seconds */
} preq;

/* What each worker did: billed from completed requests only. */
typedef struct pwork {
    double gpu_s;
    long trajs, requests;
} pwork;

typedef struct paced {
    const rl_config *c;
    rl_trainer tr;
    nn_model *roll; /* the rollout weights of the current version */
    rl_problem *evalset;
    uint64_t seed;
    preq w[RL_MAX_WORKERS];
    pwork work[RL_MAX_WORKERS];
    rl_traj *buf, *batch;
    int nbuf, cap, B; /* B: trajectories a step */
    int version, step, group_next;
    long issued; /* async admission: trajectories admitted, less those dropped */
    double now, train_end; /* train_end < 0: the trainer is idle */
    long hist[66], dropped_stale, gen_tokens, resp_tokens, resp_n;
    double abs_dlogp_sum, abs_dlogp_first, kl_sum, clipped_sum, masked_sum;
    double recent[RL_TARGET_WINDOW_MAX], time_to_target, target;
    int nevals, skipped, stop;
    json_t *curve;
    rl_progress_fn progress;
    void *pctx;
} paced;

void rl_round_fp8(nn_model *m, int block, int embed)
{
    float *p = nn_params(m);
    for (int i = 0; i < nn_num_tensors(m); i++) {
        const nn_tensor *t = nn_tensor_at(m, i);
        if (t->rows == 1) continue; /* norms and biases stay bf16 */
        if (!embed && (strstr(t->name, "embed") || strstr(t->name, "lm_head"))) continue;
        float *x = p + t->offset;
        int bs = block > 0 ? block : (t->rows > t->cols ? t->rows : t->cols);
        for (int r0 = 0; r0 < t->rows; r0 += bs)
            for (int c0 = 0; c0 < t->cols; c0 += bs) {
                int r1 = r0 + bs < t->rows ? r0 + bs : t->rows, c1 = c0 + bs < t->cols ? c0 + bs : t->cols;
                float amax = 0;
                for (int r = r0; r < r1; r++)
                    for (int c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(x[(size_t)r * t->cols + c]));
                float s = amax > 0 && isfinite(amax) ? amax / 448.0f : 1.0f;
                for (int r = r0; r < r1; r++)
                    for (int c = c0; c < c1; c++) {
                        float *v = &x[(size_t)r * t->cols + c];
                        *v = nn_e4m3_round(*v / s) * s;
                    }
            }
    }
}

/* Makes the trainer's weights the rollout weights of the next version. */
static void publish(paced *p)
{
    size_t np = nn_num_params(p->tr.model);
    memcpy(nn_params(p->roll), nn_params(p->tr.model), np * sizeof(float));
    if (p->c->dtype != RL_DTYPE_FP32) rl_round_bf16(nn_params(p->roll), np);
    if (p->c->dtype == RL_DTYPE_FP8) rl_round_fp8(p->roll, p->c->fp8_block, p->c->fp8_embed);
}

/* Worker i starts a request for groups [g0, g0 + n) now. */
static int start_request(paced *p, int i, int n)
{
    const rl_config *c = p->c;
    int g0 = p->group_next;
    p->group_next += n;
    rl_problem *pr = malloc(sizeof *pr * (size_t)n);
    preq *q = &p->w[i];
    q->t = realloc(q->t, sizeof(rl_traj) * (size_t)n * c->group);
    if (!pr || !q->t) return free(pr), sh_err(SH_ENOMEM, "rl paced: out of memory");
    for (int k = 0; k < n; k++) {
        uint64_t rng = p->seed ^ ((uint64_t)(uint32_t)(g0 + k) * 0x9e3779b97f4a7c15ULL);
        rl_problem_draw(c->task, 0, &rng, &pr[k]);
    }
    uint64_t rng = p->seed;
    int rc = rl_generate(p->roll, pr, n, c->group, g0, &c->sampling, &rng, p->version, NULL,
                         NULL, q->t);
    free(pr);
    if (rc) return rc;
    q->n = n * c->group;
    for (int k = 0; k < q->n; k++) q->t[k].worker = i;
    q->dur = rl_emu_request_s(c, &c->workers[i], q->t, q->n);
    q->end = p->now + q->dur;
    p->issued += q->n;
    return 0;
}

/* Worker i's request is done: its trajectories join the buffer. */
static void finish_request(paced *p, int i)
{
    preq *q = &p->w[i];
    memcpy(p->buf + p->nbuf, q->t, sizeof(rl_traj) * (size_t)q->n);
    p->nbuf += q->n;
    for (int k = 0; k < q->n; k++) p->gen_tokens += q->t[k].len - q->t[k].plen;
    p->work[i].gpu_s += q->dur, p->work[i].trajs += q->n, p->work[i].requests++;
    q->end = -1;
}

/* Async: drops whole groups that started more than max_lag versions before
 * the step about to train (as runtime.c does). */
static void drop_stale(paced *p)
{
    int k = 0;
    for (int i = 0; i < p->nbuf;) {
        int j = i, old = 0;
        while (j < p->nbuf && p->buf[j].group == p->buf[i].group)
            old |= p->version - p->buf[j++].vstart > p->c->max_lag;
        if (old) p->dropped_stale += j - i, p->issued -= j - i;
        else memmove(&p->buf[k], &p->buf[i], sizeof(rl_traj) * (size_t)(j - i)), k += j - i;
        i = j;
    }
    p->nbuf = k;
}

static int cmp_traj(const void *a, const void *b)
{
    const rl_traj *x = a, *y = b;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    return x->worker < y->worker ? -1 : x->worker > y->worker; /* a group is one worker's */
}

/* The target counts as reached when the mean of the last target_window
 * evaluations is at it, as in rl_run. */
static int evaluate(paced *p, int step, double t)
{
    const rl_config *c = p->c;
    double rew;
    SH_TRY(rl_evaluate(p->tr.model, p->evalset, c->eval_n, &c->sampling, RL_EVAL_SAMPLES, 99, &rew));
    json_array_append_new(p->curve, json_pack("{s:f,s:i,s:f}", "t_s", t, "step", step, "reward", rew));
    int win = c->target_window > 0 ? c->target_window : 1, have = 0;
    double sum = 0;
    p->recent[p->nevals++ % RL_TARGET_WINDOW_MAX] = rew;
    for (int k = 0; k < win && k < p->nevals; k++, have++)
        sum += p->recent[(p->nevals - 1 - k) % RL_TARGET_WINDOW_MAX];
    if (p->time_to_target < 0 && p->target > 0 && have == win && sum / win >= p->target) {
        p->time_to_target = t;
        p->stop = c->stop_at_target;
    }
    if (p->progress) {
        json_t *ev = json_pack("{s:s,s:i,s:f,s:f}", "event", "eval", "step", step, "reward", rew,
                               "t_s", t);
        p->progress(ev, p->pctx);
        json_decref(ev);
    }
    return 0;
}

/* Trains on the first B buffered trajectories (sorted by group): the
 * trainer's weights move now, the workers see them at train_end. */
static int train(paced *p)
{
    qsort(p->buf, (size_t)p->nbuf, sizeof(rl_traj), cmp_traj);
    memcpy(p->batch, p->buf, sizeof(rl_traj) * (size_t)p->B);
    memmove(p->buf, p->buf + p->B, sizeof(rl_traj) * (size_t)(p->nbuf - p->B));
    p->nbuf -= p->B;
    int nh = p->c->mode == RL_MODE_ASYNC ? p->c->max_lag + 1 : 1;
    for (int i = 0; i < p->B; i++) {
        int s = p->version - p->batch[i].vstart;
        p->hist[s < 0 ? 0 : s >= nh ? nh - 1 : s]++;
        p->resp_tokens += p->batch[i].len - p->batch[i].plen;
    }
    p->resp_n += p->B;
    rl_step_stats st;
    int rc = rl_train_step(&p->tr, p->batch, p->B, &st);
    if (rc == SH_ERANGE) p->skipped++, rc = 0;
    if (rc) return rc;
    if (!p->step) p->abs_dlogp_first = st.abs_dlogp;
    p->abs_dlogp_sum += st.abs_dlogp, p->kl_sum += st.kl;
    p->clipped_sum += st.clipped_frac, p->masked_sum += st.masked_frac;
    p->train_end = p->now + p->c->train_s;
    if (p->progress) {
        json_t *ev = json_pack("{s:s,s:i,s:f,s:f,s:f,s:[i,i]}", "event", "step", "step", p->step + 1,
                               "reward", st.reward, "abs_dlogp", st.abs_dlogp, "t_s", p->train_end, "groups",
                               p->batch[0].group, p->batch[p->B - 1].group);
        p->progress(ev, p->pctx);
        json_decref(ev);
    }
    return 0;
}

/* A step's end: the next version is visible, and evaluated when due. */
static int step_done(paced *p)
{
    p->step++;
    p->version++;
    p->train_end = -1;
    publish(p);
    if (p->step % p->c->eval_every == 0 || p->step == p->c->steps)
        SH_TRY(evaluate(p, p->step, p->now));
    return 0;
}

/* Async: idle workers start requests while admission allows, in worker
 * order (deterministic). */
static int issue_async(paced *p)
{
    const rl_config *c = p->c;
    int per = c->req_prompts ? c->req_prompts : (c->prompts_per_step + 3) / 4;
    long bound = (long)(p->step + c->max_lag + 1) * p->B;
    for (int i = 0; i < c->nworkers; i++) {
        int n = c->workers[i].req_prompts ? c->workers[i].req_prompts : per;
        if (p->w[i].end < 0 && p->issued + n * c->group <= bound) SH_TRY(start_request(p, i, n));
    }
    return 0;
}

/* Ordered: every trajectory of groups [step P, (step + 1) P) is buffered. */
static int batch_ready(const paced *p)
{
    if (!p->c->ordered) return p->nbuf >= p->B;
    int n = 0, end = (p->step + 1) * p->c->prompts_per_step;
    for (int i = 0; i < p->nbuf; i++) n += p->buf[i].group < end;
    return n >= p->B;
}

static int run_sync(paced *p)
{
    const rl_config *c = p->c;
    while (p->step < c->steps && !p->stop) {
        double end = p->now;
        for (int i = 0, k = 0, P = c->prompts_per_step; i < c->nworkers; i++) {
            int share = P / c->nworkers + (k++ < P % c->nworkers);
            if (!share) continue;
            SH_TRY(start_request(p, i, share));
            if (p->w[i].end > end) end = p->w[i].end;
        }
        for (int i = 0; i < c->nworkers; i++)
            if (p->w[i].end >= 0) finish_request(p, i);
        p->now = end;
        SH_TRY(train(p));
        p->now = p->train_end;
        SH_TRY(step_done(p));
    }
    return 0;
}

static int run_async(paced *p)
{
    const rl_config *c = p->c;
    while (p->step < c->steps && !p->stop) {
        SH_TRY(issue_async(p));
        if (p->train_end < 0 && batch_ready(p)) {
            drop_stale(p);
            if (batch_ready(p)) {
                SH_TRY(train(p));
                continue;
            }
        }
        /* The next event: the trainer's step ends first on a tie, so that
         * a worker freed at that moment starts with the new version. */
        double t = p->train_end;
        int who = -1;
        for (int i = 0; i < c->nworkers; i++)
            if (p->w[i].end >= 0 && (t < 0 || p->w[i].end < t)) t = p->w[i].end, who = i;
        if (t < 0) return sh_err(SH_EINTERNAL, "rl paced: nothing to wait for at step %d", p->step);
        p->now = t;
        if (who < 0) SH_TRY(step_done(p));
        else finish_request(p, who);
    }
    return 0;
}

/* Each worker's name, speed, price, and its completed requests: their
 * trajectories and emulated busy seconds (gpu_s, what billing counts). */
static json_t *workers_json(const paced *p)
{
    json_t *a = json_array();
    for (int i = 0; i < p->c->nworkers; i++) {
        const rl_worker_spec *w = &p->c->workers[i];
        json_array_append_new(a, json_pack("{s:s,s:f,s:f,s:i,s:i,s:I,s:I,s:f}", "name", w->name, "speed", w->speed,
                                           "price_per_h", w->price, "max_seqs", w->max_seqs, "req_prompts",
                                           w->req_prompts, "trajectories", (json_int_t)p->work[i].trajs,
                                           "requests", (json_int_t)p->work[i].requests, "gpu_s",
                                           p->work[i].gpu_s));
    }
    return a;
}

static json_t *result(paced *p, double reward_start)
{
    const rl_config *c = p->c;
    int nh = c->mode == RL_MODE_ASYNC ? c->max_lag + 1 : 1, n = p->step ? p->step : 1;
    json_t *hist = json_array();
    for (int i = 0; i < nh; i++) json_array_append_new(hist, json_integer(p->hist[i]));
    json_t *o = json_pack("{s:s,s:s,s:i,s:s,s:s,s:I,s:f,s:f,s:i,s:f,s:f,s:f,s:o,s:I,s:I,s:f,s:f,s:f,s:f,"
                     "s:f,s:f,s:o,s:i}",
                     "task", rl_task_name(c->task), "mode", c->mode ? "async" : "sync", "max_lag",
                     c->mode ? c->max_lag : 0, "loss", rl_loss_name(c->loss.kind), "rollout_dtype",
                     rl_dtype_name(c->dtype),
                     "seed", (json_int_t)c->seed, "reward_start", reward_start, "reward_end",
                     p->nevals ? p->recent[(p->nevals - 1) % RL_TARGET_WINDOW_MAX] : reward_start,
                     "steps", p->step, "emulated_s", p->now, "target", p->target, "time_to_target_s", p->time_to_target,
                     "staleness_hist", hist, "dropped_stale", (json_int_t)p->dropped_stale,
                     "generated_tokens", (json_int_t)p->gen_tokens, "abs_dlogp_first",
                     p->abs_dlogp_first, "abs_dlogp_mean", p->abs_dlogp_sum / n, "kl_mean",
                     p->kl_sum / n, "clipped_frac_mean", p->clipped_sum / n, "masked_frac_mean",
                     p->masked_sum / n, "response_tokens_mean",
                     p->resp_n ? (double)p->resp_tokens / p->resp_n : 0.0, "curve",
                     json_incref(p->curve), "skipped_steps", p->skipped);
    if (o) json_object_set_new(o, "workers", workers_json(p));
    return o;
}

static void paced_free(paced *p)
{
    for (int i = 0; i < RL_MAX_WORKERS; i++) free(p->w[i].t);
    nn_adamw_free(&p->tr.opt);
    nn_free(p->tr.model), nn_free(p->roll);
    free(p->buf), free(p->batch), free(p->evalset);
    json_decref(p->curve);
}

int rl_paced_run(const rl_config *c, rl_progress_fn progress, void *ctx, json_t **out)
{
    SH_TRY(rl_config_check(c));
    if (!(c->step_s > 0 && c->train_s > 0))
        return sh_err(SH_EINVAL, "paced run: emulated decoding step %g s and training step %g s "
                                 "must both be > 0", c->step_s, c->train_s);
    if (c->remote) return sh_err(SH_EINVAL, "paced run: remote workers are rl_run's");
    paced p = {.c = c, .progress = progress, .pctx = ctx, .train_end = -1, .time_to_target = -1};
    p.B = c->prompts_per_step * c->group;
    p.seed = c->seed * 0x2545f4914f6cdd1dULL + 1; /* as rl_run: the same problems */
    int per = c->req_prompts ? c->req_prompts : (c->prompts_per_step + 3) / 4;
    for (int i = 0; i < c->nworkers; i++) {
        p.w[i].end = -1;
        if (c->workers[i].req_prompts > per) per = c->workers[i].req_prompts;
    }
    /* Admission keeps at most max_lag + 1 batches beyond those consumed,
     * plus what finishing requests bring (sync: one batch). */
    p.cap = p.B * (c->max_lag + 2) + c->nworkers * per * c->group + c->prompts_per_step * c->group;
    p.buf = malloc(sizeof(rl_traj) * (size_t)p.cap);
    p.batch = malloc(sizeof(rl_traj) * (size_t)p.B);
    p.evalset = malloc(sizeof(rl_problem) * (size_t)c->eval_n);
    p.curve = json_array();
    int rc = p.buf && p.batch && p.evalset && p.curve ? 0 : sh_err(SH_ENOMEM, "rl paced: out of memory");
    if (!rc) rc = nn_new(&c->model, c->seed, &p.tr.model);
    if (!rc) rc = rl__warm_start(c, p.tr.model);
    if (!rc) rc = nn_clone(p.tr.model, &p.roll);
    if (!rc) nn_set_fp8_act(p.roll, c->dtype == RL_DTYPE_FP8 && c->fp8_act);
    p.tr.loss = c->loss, p.tr.temperature = c->sampling.temperature, p.tr.minibatches = c->minibatches;
    if (!rc) rc = nn_adamw_init(&p.tr.opt, p.tr.model, c->lr);
    double reward_start = 0;
    if (!rc) {
        rl_eval_set(c->task, c->eval_n, p.evalset);
        rc = rl_evaluate(p.tr.model, p.evalset, c->eval_n, &c->sampling, RL_EVAL_SAMPLES, 99,
                         &reward_start);
        json_array_append_new(p.curve, json_pack("{s:f,s:i,s:f}", "t_s", 0.0, "step", 0, "reward",
                                                 reward_start));
        p.target = c->target_gain > 0 ? reward_start + c->target_gain : c->target_reward;
    }
    if (!rc) {
        publish(&p);
        rc = c->mode == RL_MODE_SYNC ? run_sync(&p) : run_async(&p);
    }
    if (!rc) *out = result(&p, reward_start);
    paced_free(&p);
    return rc;
}
