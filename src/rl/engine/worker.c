/* A rollout worker: a separate process that holds its own copy of the
 * policy, generates trajectories on request, and applies new weights as
 * they arrive, between two decoding steps of a batch (in-flight updates).
 *
 * A worker stands in for a GPU type: each decoding step is stretched by
 * sleeping until it has lasted gen_cost / speed times its compute time, so
 * a 0.25 worker takes four times as long as a full-speed one. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rl/engine/runtime_int.h"
#include "shoal/ckpt.h"
#include "shoal/delta.h"
#include "rl/engine/wire_int.h"

typedef struct worker {
    const rl_config *c;
    int idx, fd, version;
    nn_model *model;
    sh_buf msg;
    sh_buf queued; /* REQUESTs that arrived mid-generation: (u32 length, payload)... */
    size_t queued_off;
    sh_buf img; /* the safetensors image of the current weights */
    ckpt *ck;   /* a view over img: the base the next delta applies to */
    uint64_t fp8_blocks; /* FP8 rollouts: blocks re-quantised by the last update */
    /* Push workers: the weights come from src; view pins the version held
     * (img is then unused) and ck is a view over its image. */
    const rl_weights_source *src;
    rl_weights_view view;
    int final_version; /* from STOP: the trainer's last version (-1: not said) */
    int proven;        /* the trainer proved the run's secret (or none is needed) */
    sh_hash128 expect; /* the trainer's proof on our HELLO's nonce */
    double mark, mark_cpu; /* wall and CPU clocks at the end of the last stretch */
    long updates_in_flight;
    /* Emulated GPU time (rl_config.step_s > 0): the current request's
     * sequences, the decoding steps emulated so far, and hook calls. */
    int req_seqs, req_steps, hooks;
    int pinned; /* serving an exact request: no weights taken until it is answered */
    /* Where the worker's wall-clock time goes (SHOAL_LOG=debug prints it at
     * exit): decoding compute, the emulation's sleep, time beyond the
     * emulated cost (the machine's contention), applying weights, and idle
     * waiting for a request. */
    struct {
        double compute, sleep, over, weights, idle;
        long requests, trajs, steps;
    } prof;
} worker;

/* Replaces the worker's image with img (taking ownership) and loads it.
 * FP8 rollouts sample from the dequantised FP8 weights, updated in memory
 * block by block from the image held before (rl__load_fp8). */
static int load_model(worker *w, const ckpt *ck)
{
    if (w->c->dtype == RL_DTYPE_FP8) return rl__load_fp8(w->model, ck, w->ck, &w->fp8_blocks);
    return rl_load_view(w->model, ck, "weights");
}

static int install(worker *w, sh_buf img, int version)
{
    ckpt *ck = NULL;
    int rc = ckpt_open_mem(img.data, img.len, "weights", &ck);
    if (!rc) rc = load_model(w, ck);
    if (rc) {
        ckpt_close(ck);
        sh_buf_free(&img);
        return rc;
    }
    ckpt_close(w->ck);
    sh_buf_free(&w->img);
    w->img = img;
    w->ck = ck;
    w->version = version;
    return 0;
}

/* Installs weights from a WEIGHTS payload: a whole image, or a shoal delta
 * applied to the image the worker holds. */
static int apply_weights(worker *w, const uint8_t *p, size_t len)
{
    rl_wire_weights hd;
    if (len < sizeof hd) return sh_err(SH_EFORMAT, "worker %d: short WEIGHTS message", w->idx);
    memcpy(&hd, p, sizeof hd);
    if (len != sizeof hd + hd.nbytes)
        return sh_err(SH_EFORMAT, "worker %d: WEIGHTS of %llu bytes in a %zu-byte message",
                      w->idx, (unsigned long long)hd.nbytes, len);
    p += sizeof hd;
    sh_buf img = {0};
    if (hd.encoding == RL_ENC_IMAGE) {
        SH_TRY(sh_buf_append(&img, p, hd.nbytes));
        return install(w, img, hd.version);
    }
    if (hd.encoding != RL_ENC_DELTA)
        return sh_err(SH_EFORMAT, "worker %d: unknown WEIGHTS encoding %u", w->idx, hd.encoding);
    if (!w->ck || hd.base_version != w->version)
        return sh_err(SH_EMISMATCH, "worker %d: delta %d -> %d does not apply to version %d",
                      w->idx, hd.base_version, hd.version, w->version);
    delta *d;
    SH_TRY(delta_parse(p, hd.nbytes, 0, &d));
    delta_opts o = {.threads = 1};
    size_t size = (size_t)delta_target_size(d), got = 0;
    int rc = sh_buf_reserve(&img, size + 1);
    if (!rc) rc = delta_apply_mem(w->ck, d, &o, img.data, size, &got);
    delta_free(d);
    img.len = got;
    if (rc) {
        sh_buf_free(&img);
        return rc;
    }
    return install(w, img, hd.version);
}

/* Push workers: takes the newest version the source holds when it is newer
 * than the one held.  Returns 1 when it did, 0 when there was none. */
static int take_from_source(worker *w)
{
    const rl_weights_source *src = w->src;
    if (src->version(src->arg) <= w->version) return 0;
    rl_weights_view v;
    int rc = src->acquire(src->arg, &v);
    if (rc == SH_EAGAIN) return 0;
    if (rc < 0) return rc;
    ckpt *ck = NULL;
    if (v.version <= w->version) rc = 1;
    if (!rc) rc = ckpt_open_mem(v.image, v.len, "weights", &ck);
    if (!rc) rc = load_model(w, ck);
    if (rc) {
        ckpt_close(ck);
        src->release(src->arg, &v);
        return rc == 1 ? 0 : rc;
    }
    ckpt_close(w->ck);
    if (w->view.priv) src->release(src->arg, &w->view);
    w->view = v;
    w->ck = ck;
    w->version = v.version;
    return 1;
}

static void leave(worker *w, int code) __attribute__((noreturn));

/* Answers STOP with BYE (version and image hash) and exits. */
static void __attribute__((noreturn)) bye(worker *w)
{
    const uint8_t *img = w->img.data;
    size_t len = w->img.len;
    if (w->src) { /* the trainer's last version first */
        if (w->final_version > w->version)
            w->src->wait(w->src->arg, w->final_version, 15.0);
        if (take_from_source(w) < 0)
            sh_log(SH_LOG_WARN, "rl worker %d: the final version: %s", w->idx, sh_errmsg());
        img = w->view.image, len = w->view.len;
    }
    sh_hash128 h = sh_hash128_of(img, len);
    rl_wire_bye b = {.version = w->version, .hash_lo = h.lo, .hash_hi = h.hi};
    rl__msg_write(w->fd, RL_MSG_BYE, &b, sizeof b, NULL, 0); /* the trainer may be gone */
    leave(w, 0);
}

/* Handles one message that is not a REQUEST.  Returns 1 on STOP. */
static int handle(worker *w, uint32_t type)
{
    if (type == RL_MSG_WELCOME && !w->proven) {
        sh_hash128 pr;
        if (w->msg.len != sizeof pr || (memcpy(&pr, w->msg.data, sizeof pr), !net_secret_eq(pr, w->expect)))
            return sh_err(SH_EPERM, "worker %d: the trainer did not prove this run's secret (SHOAL_RUN_SECRET)",
                          w->idx);
        w->proven = 1;
        return 0;
    }
    if (!w->proven)
        return sh_err(SH_EPERM, "worker %d: the trainer sent message %u before proving this run's secret"
                                " (SHOAL_RUN_SECRET): is it this run's trainer?", w->idx, type);
    if (type == RL_MSG_STOP) {
        int32_t v;
        if (w->msg.len == sizeof v) memcpy(&v, w->msg.data, sizeof v), w->final_version = v;
        return 1;
    }
    if (type == RL_MSG_WEIGHTS && w->src)
        return sh_err(SH_EFORMAT, "worker %d: WEIGHTS sent to a worker fed by the push tree", w->idx);
    if (type == RL_MSG_REQUEST) { /* the trainer queued the next one: served in order */
        uint32_t n = (uint32_t)w->msg.len;
        SH_TRY(sh_buf_append(&w->queued, &n, sizeof n));
        return sh_buf_append(&w->queued, w->msg.data, n);
    }
    if (type == RL_MSG_WEIGHTS) {
        double t0 = sh_now_mono();
        int rc = apply_weights(w, w->msg.data, w->msg.len);
        w->prof.weights += sh_now_mono() - t0;
        return rc;
    }
    return sh_err(SH_EFORMAT, "worker %d: unexpected message type %u", w->idx, type);
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The emulated GPU time of the work since the last mark is its CPU time
 * times gen_cost / speed: CPU time rather than wall time, so that other
 * load on the machine slows the emulated GPUs only when it leaves them
 * less than that. */
static void leave(worker *w, int code)
{
    sh_log(SH_LOG_DEBUG,
           "rl worker %d: %ld requests, %ld trajectories, %ld decoding steps; compute %.2f s, "
           "emulation sleep %.2f s, beyond the emulated cost %.2f s, weights %.2f s, idle %.2f s",
           w->idx, w->prof.requests, w->prof.trajs, w->prof.steps, w->prof.compute, w->prof.sleep,
           w->prof.over, w->prof.weights, w->prof.idle);
    _exit(code);
}

static void stretch(worker *w)
{
    double cpu = cpu_now() - w->mark_cpu;
    double want = cpu * w->c->gen_cost / w->c->workers[w->idx].speed;
    double spent = sh_now_mono() - w->mark;
    w->prof.compute += cpu;
    w->prof.steps++;
    if (want > spent) sh_sleep(want - spent), w->prof.sleep += want - spent;
    else w->prof.over += spent - want;
    w->mark = sh_now_mono();
    w->mark_cpu = cpu_now();
}

/* One decoding step of the current request in emulated GPU time: sleeps
 * until the step has lasted rl_emu_step_s() (src/rl/engine/emulate.c). */
static void emu_step(worker *w)
{
    double want = rl_emu_step_s(w->c, &w->c->workers[w->idx], w->req_seqs);
    double spent = sh_now_mono() - w->mark;
    w->prof.compute += cpu_now() - w->mark_cpu;
    w->prof.steps++;
    if (want > spent) sh_sleep(want - spent), w->prof.sleep += want - spent;
    else w->prof.over += spent - want;
    w->req_steps++;
    w->mark = sh_now_mono();
    w->mark_cpu = cpu_now();
}

/* Between decoding steps: emulate the worker's speed, then take any weights
 * that arrived meanwhile.  rl_generate calls the hook before every step
 * (and once more when all sequences are done), so with emulated GPU time
 * every call but the first closes one decoding step. */
static int step_hook(void *ctx)
{
    worker *w = ctx;
    if (w->c->step_s <= 0) stretch(w);
    else if (w->hooks++) emu_step(w);
    if (w->pinned) { /* an exact request: every token from the version it started with */
        w->mark = sh_now_mono();
        w->mark_cpu = cpu_now();
        return w->version;
    }
    struct pollfd pf = {.fd = w->fd, .events = POLLIN};
    while (poll(&pf, 1, 0) > 0) {
        uint32_t type;
        if (rl__msg_read(w->fd, &type, &w->msg) < 0) leave(w, 0); /* trainer gone */
        int rc = handle(w, type);
        if (rc == 1) bye(w);
        if (rc < 0) {
            sh_log(SH_LOG_ERROR, "rl worker %d: %s", w->idx, sh_errmsg());
            leave(w, 3);
        }
        w->updates_in_flight += type == RL_MSG_WEIGHTS;
    }
    if (w->src) { /* a version the replica activated meanwhile */
        double t0 = sh_now_mono();
        int rc = take_from_source(w);
        if (rc < 0) {
            sh_log(SH_LOG_ERROR, "rl worker %d: %s", w->idx, sh_errmsg());
            leave(w, 3);
        }
        w->updates_in_flight += rc;
        w->prof.weights += sh_now_mono() - t0;
    }
    w->mark = sh_now_mono();
    w->mark_cpu = cpu_now();
    return w->version;
}

static int serve_request(worker *w)
{
    rl_wire_request rq;
    if (w->msg.len < sizeof rq) return sh_err(SH_EFORMAT, "worker %d: short REQUEST", w->idx);
    memcpy(&rq, w->msg.data, sizeof rq);
    if (rq.nprompts < 1 || rq.group < 1 || (rq.exact != 0 && rq.exact != 1) || rq.reserved ||
        w->msg.len != sizeof rq + (size_t)rq.nprompts * 8)
        return sh_err(SH_EFORMAT, "worker %d: REQUEST sizes do not add up", w->idx);
    int n = rq.nprompts, B = n * rq.group;
    rl_problem *probs = malloc(sizeof(rl_problem) * n);
    rl_traj *out = malloc(sizeof(rl_traj) * B);
    if (!probs || !out) {
        free(probs), free(out);
        return sh_err(SH_ENOMEM, "worker %d: out of memory", w->idx);
    }
    /* The problems are read before waiting below: that reuses w->msg. */
    const uint64_t *ids = (const uint64_t *)(w->msg.data + sizeof rq);
    for (int i = 0; i < n; i++) rl_problem_make(w->c->task, ids[i], &probs[i], NULL);
    /* Version-constrained: wait for weights at least as new as asked, and
     * for some weights in any case (an early async request may allow a
     * min_version below 0, but the initial untrained model is no policy
     * version: the trainer refuses what it generates); from the push tree
     * only so long, then refuse. */
    int need = rq.min_version > 0 ? rq.min_version : 0, rc = 0;
    if (w->src && w->version < need) {
        rc = take_from_source(w);
        double wait = w->src->min_wait_s > 0 ? w->src->min_wait_s : 5.0;
        if (rc >= 0 && w->version < need) {
            w->src->wait(w->src->arg, need, wait);
            rc = take_from_source(w);
        }
        if (rc > 0) rc = 0; /* 1: it took a version */
    }
    while (!rc && !w->src && w->version < need) { /* direct: weights come in order */
        uint32_t type;
        rc = rl__msg_read(w->fd, &type, &w->msg);
        if (!rc) rc = handle(w, type);
    }
    /* Refused: a version it could not get in time, or, asked for exactly
     * one, a newer one (weights never go back). */
    if (rc == 0 && (w->version < need || (rq.exact && w->version != need))) {
        rl_wire_refuse f = {w->version, rq.min_version, rq.group0, rq.nprompts};
        sh_log(SH_LOG_DEBUG, "rl worker %d: refusing groups %d+%d: holds version %d, asked for %s%d",
               w->idx, rq.group0, rq.nprompts, w->version, rq.exact ? "exactly " : "", rq.min_version);
        rc = rl__msg_write(w->fd, RL_MSG_REFUSE, &f, sizeof f, NULL, 0);
        free(probs), free(out);
        if (rc < 0 && (errno == EPIPE || errno == ECONNRESET)) leave(w, 0);
        return rc;
    }
    if (rc) {
        free(probs), free(out);
        return rc;
    }
    w->pinned = rq.exact;
    uint64_t rng = rq.seed;
    w->mark = sh_now_mono();
    w->mark_cpu = cpu_now();
    w->req_seqs = B, w->req_steps = w->hooks = 0;
    rc = rl_generate(w->model, probs, n, rq.group, rq.group0, &w->c->sampling, &rng,
                     w->version, step_hook, w, out);
    w->pinned = 0;
    if (w->c->step_s <= 0) stretch(w);
    else /* the last step when every response ran to max_new */
        while (!rc && w->req_steps < rl_emu_steps(out, B)) emu_step(w);
    for (int i = 0; i < B; i++) out[i].worker = w->idx;
    w->prof.requests++, w->prof.trajs += B;
    rl_wire_trajs th = {.worker = w->idx, .count = B};
    if (!rc) rc = rl__msg_write(w->fd, RL_MSG_TRAJS, &th, sizeof th, out, sizeof(rl_traj) * B);
    free(probs), free(out);
    /* The trainer ended the run (its target reached) while we generated:
     * not an error. */
    if (rc < 0 && (errno == EPIPE || errno == ECONNRESET)) leave(w, 0);
    return rc;
}

/* expect: the trainer's proof of the run's secret to wait for (NULL: none,
 * a forked worker on its socketpair or a run without a secret). */
static void __attribute__((noreturn)) worker_run(const rl_config *c, int idx, int fd,
                                                 const rl_weights_source *src, const sh_hash128 *expect)
{
    signal(SIGINT, SIG_IGN); /* the trainer decides when workers stop */
    worker w = {.c = c, .idx = idx, .fd = fd, .version = -1, .src = src, .final_version = -1,
                .proven = !expect, .expect = expect ? *expect : (sh_hash128){0, 0}};
    if (nn_new(&c->model, c->seed, &w.model) < 0) _exit(3);
    signal(SIGPIPE, SIG_IGN);
    for (;;) {
        uint32_t type;
        if (w.queued_off < w.queued.len) { /* queued requests first, oldest first */
            uint32_t n;
            memcpy(&n, w.queued.data + w.queued_off, sizeof n);
            w.msg.len = 0;
            if (sh_buf_append(&w.msg, w.queued.data + w.queued_off + sizeof n, n) < 0) leave(&w, 3);
            w.queued_off += sizeof n + n;
            if (w.queued_off == w.queued.len) w.queued.len = w.queued_off = 0;
            type = RL_MSG_REQUEST;
        } else {
            double t0 = sh_now_mono();
            if (rl__msg_read(fd, &type, &w.msg) < 0) {
                if (w.proven) break;
                sh_log(SH_LOG_ERROR, "rl worker %d: the trainer hung up before proving this run's secret"
                                     " (is its SHOAL_RUN_SECRET this one?)", idx);
                leave(&w, 3);
            }
            w.prof.idle += sh_now_mono() - t0;
        }
        int rc = type == RL_MSG_REQUEST ? serve_request(&w) : handle(&w, type);
        if (rc == 1) bye(&w);
        if (rc < 0) {
            sh_log(SH_LOG_ERROR, "rl worker %d: %s", idx, sh_errmsg());
            leave(&w, 3);
        }
    }
    sh_buf_free(&w.queued);
    leave(&w, 0);
}

void rl__worker_main(const rl_config *c, int idx, int fd) { worker_run(c, idx, fd, NULL, NULL); }

void rl_worker_serve_from(const rl_config *c, const rl_worker_spec *me, int fd,
                          const rl_weights_source *src)
{
    rl_wire_hello h = {.speed = me->speed, .price = me->price, .pid = (int32_t)getpid(),
                       .flags = src ? RL_HELLO_PUSH : 0};
    snprintf(h.name, sizeof h.name, "%s", me->name);
    sh_hash128 secret, expect;
    net_hello hs;
    int has = net_run_secret(&secret);
    if (has > 0 && net_hello_make(secret, "rl worker", "rl trainer", &hs) < 0) has = -1;
    if (has < 0) {
        sh_log(SH_LOG_ERROR, "rl worker %s: %s", me->name, sh_errmsg());
        _exit(3);
    }
    if (has) {
        h.nonce = hs.nonce, h.proof = hs.proof, expect = hs.expect;
    }
    signal(SIGPIPE, SIG_IGN);
    if (rl__msg_write(fd, RL_MSG_HELLO, &h, sizeof h, NULL, 0) < 0) {
        sh_log(SH_LOG_ERROR, "rl worker %s: HELLO: %s", me->name, sh_errmsg());
        _exit(3);
    }
    /* The worker reads its speed from workers[idx]: a one-entry copy. */
    rl_config *cc = malloc(sizeof *cc);
    if (!cc) _exit(3);
    *cc = *c;
    cc->workers[0] = *me;
    cc->nworkers = 1;
    worker_run(cc, 0, fd, src, has ? &expect : NULL);
}

void rl_worker_serve(const rl_config *c, const rl_worker_spec *me, int fd)
{
    rl_worker_serve_from(c, me, fd, NULL);
}
