/* The trainer's compute thread.
 *
 * The event loop (runtime.c) must keep dispatching while a step trains:
 * trajectories arriving, requests going out and weights reaching workers
 * are what keeps asynchronous workers busy.  So the CPU work of the
 * trainer -- the training step, making the next version's image and shoal
 * delta, evaluating held-out reward, saving checkpoints -- runs on this
 * thread, one step at a time:
 *
 *   loop: rl__compute_dispatch  -> thread: train, make image + delta
 *   loop: rl__compute_collect   <- thread: "trained" (weights go out now)
 *                                  thread: evaluate, save (if due)
 *   loop: rl__compute_collect   <- thread: "evaluated", idle again
 *
 * Ownership: while the thread runs, it alone touches r->tr (model and
 * optimiser), r->ckpts and the job fields below marked "thread"; the loop
 * alone touches the sockets, the buffer and the run's counters.  They meet
 * under cp->mu.  Why a thread is equivalent to a process here: docs/rl.md,
 * "The trainer's threads". */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rl/engine/runtime_int.h"
#include "rl/engine/wire_int.h"
#include "shoal/ckpt.h"
#include "shoal/delta.h"

struct rl__compute {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int wake[2]; /* the thread writes a byte here for every piece of news */
    int job_ready, quit;
    /* The job: set by the loop before job_ready = 1. */
    rl_traj *batch;
    int n, version, step, eval, save;
    long hist[RL_MAX_T + 2];
    int nh, smax;
    int gmin, gmax; /* the batch's first and last group numbers */
    /* Results (thread), read by the loop under mu. */
    int trained, evaluated, rc;
    char err[1024];
    rl_step_stats st;
    sh_buf img, delta;
    ckpt *ck;
    double train_s, publish_s, eval_s, reward;
};

static void wake(rl__compute *cp)
{
    char b = 1;
    while (write(cp->wake[1], &b, 1) < 0 && errno == EINTR) {}
}

/* The next version's image and the delta to it from the current one.  The
 * loop does not replace r->ck while a job is in hand. */
static int make_version(run *r, rl__compute *cp)
{
    sh_buf img = {0}, d = {0};
    ckpt *ck = NULL;
    int rc = rl_policy_image(r->tr.model, r->c->dtype != RL_DTYPE_FP32, &img);
    if (!rc) rc = ckpt_open_mem(img.data, img.len, "policy", &ck);
    if (!rc && r->ck) {
        delta_opts o = {.threads = 1};
        rc = delta_make_mem(r->ck, ck, &o, &d, NULL);
    }
    if (!rc && r->c->on_publish) rc = r->c->on_publish(r->c->hook_ctx, cp->version + 1, &img, &d);
    if (rc) {
        ckpt_close(ck);
        sh_buf_free(&img), sh_buf_free(&d);
        return rc;
    }
    cp->img = img, cp->delta = d, cp->ck = ck;
    return 0;
}

/* out_dir/policy-v<version>.safetensors; the path is recorded in the run's
 * result. */
static int save(run *r, int version, int step)
{
    if (!r->c->out_dir) return 0;
    char path[4096], st[32];
    snprintf(path, sizeof path, "%s/policy-v%06d.safetensors", r->c->out_dir, version);
    snprintf(st, sizeof st, "%d", step);
    json_t *extra = json_pack("{s:s,s:s}", "shoal.step", st, "shoal.task", rl_task_name(r->c->task));
    int rc = rl_save_checkpoint(r->tr.model, path, version, extra);
    json_decref(extra);
    if (!rc) json_array_append_new(r->ckpts, json_string(path));
    return rc;
}

/* The record of a failure on this thread, for the loop to raise. */
static void failed(rl__compute *cp, int rc)
{
    pthread_mutex_lock(&cp->mu);
    if (!cp->rc) {
        cp->rc = rc;
        snprintf(cp->err, sizeof cp->err, "%s", sh_errmsg());
    }
    pthread_mutex_unlock(&cp->mu);
}

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The emulated trainer GPU: the step has lasted train_cost times the CPU
 * time it used (measured on this thread, so other load on the machine does
 * not count unless it leaves the thread less than that). */
static void stretch(const run *r, double t0, double cpu0)
{
    double want = (thread_cpu() - cpu0) * r->c->train_cost, spent = sh_now_mono() - t0;
    if (r->c->train_cost > 1 && want > spent) sh_sleep(want - spent);
}

static void run_job(run *r, rl__compute *cp)
{
    double t0 = sh_now_mono(), cpu0 = thread_cpu();
    rl_step_stats st = {0};
    int rc = r->c->train_fn ? r->c->train_fn(r->c->hook_ctx, &r->tr, cp->batch, cp->n, &st)
                            : rl_train_step(&r->tr, cp->batch, cp->n, &st);
    double t1 = sh_now_mono();
    char msg[1024] = "";
    if (rc == SH_ERANGE) snprintf(msg, sizeof msg, "%s", sh_errmsg()), rc = 0;
    if (!rc && !st.skipped) rc = make_version(r, cp);
    stretch(r, t0, cpu0);
    pthread_mutex_lock(&cp->mu);
    cp->st = st, cp->train_s = t1 - t0, cp->publish_s = sh_now_mono() - t1;
    if (rc && !cp->rc) cp->rc = rc, snprintf(cp->err, sizeof cp->err, "%s", sh_errmsg());
    else if (st.skipped) snprintf(cp->err, sizeof cp->err, "%s", msg);
    cp->trained = 1;
    pthread_mutex_unlock(&cp->mu);
    wake(cp);
    if (rc) return;
    int version = cp->version + !st.skipped;
    if (cp->eval) {
        double rew, e0 = sh_now_mono();
        rc = rl_evaluate(r->tr.model, r->evalset, r->c->eval_n, &r->c->sampling,
                         RL_EVAL_SAMPLES, 99, &rew);
        if (rc) return failed(cp, rc);
        pthread_mutex_lock(&cp->mu);
        cp->reward = rew, cp->eval_s = sh_now_mono() - e0, cp->evaluated = 1;
        pthread_mutex_unlock(&cp->mu);
    }
    if (cp->save && (rc = save(r, version, cp->step)) < 0) failed(cp, rc);
}

static void *thread_main(void *arg)
{
    run *r = arg;
    rl__compute *cp = r->cp;
    /* Signals are the loop's business (a worker's death, ^C). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_mutex_lock(&cp->mu);
    for (;;) {
        while (!cp->job_ready && !cp->quit) pthread_cond_wait(&cp->cv, &cp->mu);
        if (!cp->job_ready) break;
        pthread_mutex_unlock(&cp->mu);
        run_job(r, cp);
        pthread_mutex_lock(&cp->mu);
        cp->job_ready = 0;
        wake(cp);
    }
    pthread_mutex_unlock(&cp->mu);
    return NULL;
}

int rl__compute_start(run *r)
{
    rl__compute *cp = calloc(1, sizeof *cp);
    if (!cp) return sh_err(SH_ENOMEM, "rl: out of memory");
    cp->wake[0] = cp->wake[1] = -1;
    cp->batch = malloc(sizeof(rl_traj) * (size_t)r->batch);
    if (!cp->batch || pipe2(cp->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        int e = errno;
        free(cp->batch), free(cp);
        return sh_err_errno(e, "rl: the compute thread's pipe");
    }
    pthread_mutex_init(&cp->mu, NULL);
    pthread_cond_init(&cp->cv, NULL);
    r->cp = cp;
    int e = pthread_create(&cp->th, NULL, thread_main, r);
    if (e) {
        close(cp->wake[0]), close(cp->wake[1]);
        free(cp->batch), free(cp);
        r->cp = NULL;
        return sh_err_errno(e, "rl: starting the compute thread");
    }
    return 0;
}

int rl__compute_wake_fd(const run *r) { return r->cp ? r->cp->wake[0] : -1; }

void rl__compute_stop(run *r)
{
    rl__compute *cp = r->cp;
    if (!cp) return;
    pthread_mutex_lock(&cp->mu);
    cp->quit = 1;
    pthread_cond_signal(&cp->cv);
    pthread_mutex_unlock(&cp->mu);
    pthread_join(cp->th, NULL);
    pthread_mutex_destroy(&cp->mu);
    pthread_cond_destroy(&cp->cv);
    close(cp->wake[0]), close(cp->wake[1]);
    ckpt_close(cp->ck);
    sh_buf_free(&cp->img), sh_buf_free(&cp->delta);
    free(cp->batch), free(cp);
    r->cp = NULL;
}

int rl__compute_busy(run *r)
{
    pthread_mutex_lock(&r->cp->mu);
    int busy = r->cp->job_ready;
    pthread_mutex_unlock(&r->cp->mu);
    return busy;
}

static int cmp_group(const void *a, const void *b)
{
    const int64_t *x = a, *y = b; /* (group << 32 | position) */
    return (*x > *y) - (*x < *y);
}

/* Orders the buffer by group number, keeping each group's own order.
 * Workers answer in whatever order they finish; sorting makes a sync run's
 * batches, and so the whole run, independent of that timing. */
static int sort_buffer(run *r)
{
    int64_t *key = malloc(sizeof *key * (size_t)(r->nbuf ? r->nbuf : 1));
    if (!key) return sh_err(SH_ENOMEM, "rl: out of memory");
    for (int i = 0; i < r->nbuf; i++) key[i] = (int64_t)r->buf[i].group << 32 | i;
    qsort(key, (size_t)r->nbuf, sizeof *key, cmp_group);
    for (int i = 0; i < r->nbuf; i++) r->sortbuf[i] = r->buf[key[i] & 0xffffffff];
    memcpy(r->buf, r->sortbuf, sizeof(rl_traj) * (size_t)r->nbuf);
    free(key);
    return 0;
}

int rl__compute_dispatch(run *r)
{
    rl__compute *cp = r->cp;
    SH_TRY(sort_buffer(r));
    memset(cp->hist, 0, sizeof cp->hist);
    cp->nh = r->c->mode == RL_MODE_ASYNC ? r->c->max_lag + 1 : 1;
    cp->smax = 0; /* unclamped: what the staleness bound promises */
    cp->gmin = r->batch ? r->buf[0].group : 0, cp->gmax = r->batch ? r->buf[r->batch - 1].group : 0;
    for (int i = 0; i < r->batch; i++) {
        int s = r->version - r->buf[i].vstart;
        if (s > cp->smax) cp->smax = s;
        s = s < 0 ? 0 : s > cp->nh - 1 ? cp->nh - 1 : s;
        cp->hist[s]++;
        r->stale_hist[s]++;
        r->inflight_updates += r->buf[i].vend != r->buf[i].vstart;
    }
    memcpy(cp->batch, r->buf, sizeof(rl_traj) * (size_t)r->batch);
    if (r->step + 1 == r->c->nan_at_step) /* fault injection: one corrupt log-probability */
        cp->batch[0].blogp[cp->batch[0].plen] = NAN;
    memmove(r->buf, r->buf + r->batch, sizeof(rl_traj) * (size_t)(r->nbuf - r->batch));
    r->nbuf -= r->batch;
    int step = r->step + 1;
    pthread_mutex_lock(&cp->mu);
    cp->n = r->batch, cp->version = r->version, cp->step = step;
    cp->eval = step % r->c->eval_every == 0 || step == r->c->steps;
    cp->save = step == r->c->steps || (r->c->save_every && step % r->c->save_every == 0);
    cp->trained = cp->evaluated = 0;
    cp->job_ready = 1;
    pthread_cond_signal(&cp->cv);
    pthread_mutex_unlock(&cp->mu);
    r->training = 1;
    return 0;
}

json_t *rl__hist_json(const long *h, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(h[i]));
    return a;
}

/* JSON has no NaN or infinity (json_pack fails on them): a skipped step's
 * figures are reported as -1. */
static double fin(double x) { return isfinite(x) ? x : -1.0; }

/* The loop's half of a trained step: the new version goes out, the step
 * is reported, and the fault injection fires. */
static int took_step(run *r, rl__compute *cp, const rl_step_stats *st)
{
    if (st->skipped) {
        r->skipped++;
        sh_log(SH_LOG_WARN, "rl: step %d: %s", r->step + 1, cp->err);
    }
    r->train_tokens += st->tokens;
    r->t_train += cp->train_s;
    r->step++;
    if (!st->skipped) {
        double t0 = sh_now_mono();
        r->version++;
        ckpt_close(r->ck);
        sh_buf_free(&r->img), sh_buf_free(&r->delta);
        r->img = cp->img, r->delta = cp->delta, r->ck = cp->ck;
        cp->img = (sh_buf){0}, cp->delta = (sh_buf){0}, cp->ck = NULL;
        r->image_bytes = (double)r->img.len;
        if (r->delta.len) r->delta_bytes_sum += (double)r->delta.len, r->deltas++;
        for (int i = 0; i < r->nslots; i++)
            if (r->w[i].alive && r->w[i].hello && !r->w[i].push)
                SH_TRY(rl__enqueue_weights(r, &r->w[i], 0));
        r->t_publish += cp->publish_s + sh_now_mono() - t0;
    }
    json_t *ev = json_pack("{s:s,s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:b,s:o,s:f,s:i,s:[i,i]}", "event",
                           "step", "step", r->step, "version", r->version, "reward",
                           fin(st->reward), "loss", fin(st->loss), "grad_norm", fin(st->grad_norm),
                           "abs_dlogp", fin(st->abs_dlogp), "kl", fin(st->kl), "clipped_frac",
                           fin(st->clipped_frac), "masked_frac", fin(st->masked_frac), "skipped",
                           st->skipped, "staleness",
                           rl__hist_json(cp->hist, cp->nh), "wall_s", rl__wall(r), "staleness_max",
                           cp->smax, "groups", cp->gmin, cp->gmax);
    if (!ev) return sh_err(SH_EINTERNAL, "rl: step %d: its report could not be built", r->step);
    if (r->progress) r->progress(ev, r->pctx);
    json_array_append_new(r->steps, ev);
    /* The reward the evaluation will measure is that of the weights just
     * made: it is dated now, not when the evaluation ends. */
    r->pending_eval_t = rl__wall(r), r->pending_eval_step = r->step;
    r->training = 0;
    if (r->step == r->c->kill_at_step && r->w[0].alive) {
        sh_log(SH_LOG_WARN, "rl: fault injection: killing worker 0 (pid %d)", (int)r->w[0].pid);
        kill(r->w[0].pid, SIGKILL);
    }
    return 0;
}

static void took_eval(run *r, double rew)
{
    double t = r->pending_eval_t;
    r->last_eval = rew;
    json_array_append_new(r->curve, json_pack("{s:f,s:i,s:f}", "wall_s", t, "step",
                                              r->pending_eval_step, "reward", rew));
    /* Reached when the mean of the last target_window evaluations (at least
     * one) is at the target: one lucky evaluation of a noisy curve is not. */
    int win = r->c->target_window > 1 ? r->c->target_window : 1, have = 0;
    double sum = 0;
    r->recent[r->nevals++ % RL_TARGET_WINDOW_MAX] = rew;
    for (int k = 0; k < win && k < r->nevals; k++, have++)
        sum += r->recent[(r->nevals - 1 - k) % RL_TARGET_WINDOW_MAX];
    if (r->time_to_target < 0 && r->c->target_reward > 0 && have == win &&
        sum / win >= r->c->target_reward)
        r->time_to_target = t;
    /* One more evaluation after stop_reward is reached, so that the curve
     * shows whether the level holds; eval_every keeps it an evaluated step. */
    if (r->c->stop_reward > 0 && !r->stop_step && rew >= r->c->stop_reward)
        r->stop_step = r->pending_eval_step + r->c->eval_every;
    if (r->progress) {
        json_t *ev = json_pack("{s:s,s:i,s:f,s:f}", "event", "eval", "step", r->pending_eval_step,
                               "reward", rew, "wall_s", t);
        r->progress(ev, r->pctx);
        json_decref(ev);
    }
}

int rl__compute_collect(run *r)
{
    rl__compute *cp = r->cp;
    char b[64];
    while (read(cp->wake[0], b, sizeof b) > 0) {}
    pthread_mutex_lock(&cp->mu);
    int rc = cp->rc, trained = r->training && cp->trained, evaluated = cp->evaluated;
    rl_step_stats st = cp->st;
    double rew = cp->reward;
    if (evaluated && (trained || !r->training)) r->eval_s += cp->eval_s, cp->evaluated = 0;
    else evaluated = 0;
    pthread_mutex_unlock(&cp->mu);
    if (rc) return sh_err(rc, "%s", cp->err);
    if (trained) SH_TRY(took_step(r, cp, &st));
    if (evaluated) took_eval(r, rew);
    return 0;
}

int rl__publish_now(run *r)
{
    rl__compute tmp = {.version = r->version - 1};
    SH_TRY(make_version(r, &tmp));
    ckpt_close(r->ck);
    sh_buf_free(&r->img), sh_buf_free(&r->delta);
    r->img = tmp.img, r->delta = tmp.delta, r->ck = tmp.ck;
    r->image_bytes = (double)r->img.len;
    return 0;
}
