/* The RL runtime: a trainer (this process) and K rollout worker processes
 * connected by socketpairs (protocol: docs/rl-protocol.md).
 *
 * sync:  each step the trainer splits the batch's prompts evenly over the
 *        workers, waits for all of them, trains, and sends new weights; the
 *        slowest worker sets the pace and the trainer idles while they run.
 * async: workers are kept busy with small requests; the trainer trains as
 *        soon as a batch of whole groups is buffered.  Staleness is bounded
 *        AReaL-style: a request is only admitted while the trajectories
 *        issued stay within (version + max_lag + 1) batches, and a group
 *        that started more than max_lag versions before the step that would
 *        consume it is dropped.  New weights reach workers mid-batch.
 * ordered (async): step s trains on exactly groups [s P, (s + 1) P) (P
 *        prompts a step), whichever workers bring them and in whatever
 *        order; a request asks for weights no older than max_lag versions
 *        before the step that will consume its last group, so nothing is
 *        dropped, and groups lost with a worker are asked for again.  Group
 *        g's problem and sampling streams depend only on the seed and g
 *        (in every mode), so two pools that train this way see the same
 *        data, differing only in the versions that generated it.
 *
 * The trainer never blocks on a worker: sockets are non-blocking with an
 * outbox each, so a worker busy writing trajectories cannot deadlock with a
 * trainer busy writing weights.  This file is the trainer's event loop; it
 * never computes: training, making versions, evaluating and saving run on
 * the compute thread (compute.c), so the loop keeps serving workers. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "rl/engine/runtime_int.h"
#include "rl/engine/wire_int.h"
#include "shoal/ckpt.h"
#include "shoal/delta.h"

/* Queues the current weights: the delta from the previous version for a
 * worker that holds it, the whole image for one that just joined. */
int rl__enqueue_weights(run *r, wk *w, int full)
{
    int use_delta = !full && r->delta.len;
    rl_wire_weights hd = {.version = r->version,
                          .encoding = use_delta ? RL_ENC_DELTA : RL_ENC_IMAGE,
                          .nbytes = use_delta ? r->delta.len : r->img.len,
                          .base_version = use_delta ? r->version - 1 : -1};
    r->weights_bytes += (double)hd.nbytes;
    return rl__msg_append(&w->out, RL_MSG_WEIGHTS, &hd, sizeof hd,
                          use_delta ? r->delta.data : r->img.data, hd.nbytes);
}

/* The run has done its steps, or reached its target with stop_at_target. */
int rl__over(const run *r)
{
    return r->step >= r->c->steps || (r->c->stop_at_target && r->time_to_target >= 0) ||
           (r->stop_step > 0 && r->step >= r->stop_step);
}

static int spawn(run *r, int i)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return sh_err_errno(errno, "worker %s: socketpair", r->spec[i].name);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]), close(sv[1]);
        return sh_err_errno(errno, "worker %s: fork", r->spec[i].name);
    }
    if (pid == 0) {
        signal(SIGPIPE, SIG_IGN);
        for (int j = 0; j < r->nslots; j++)
            if (r->w[j].alive) close(r->w[j].fd);
        close(sv[0]);
        rl__worker_main(r->c, i, sv[1]);
    }
    close(sv[1]);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    wk *w = &r->w[i];
    w->pid = pid, w->fd = sv[0], w->alive = 1, w->busy = 0, w->hello = 1, w->stopped = 0;
    w->trajs_at_join = w->trajs;
    w->in.len = w->out.len = w->out_off = 0;
    return rl__enqueue_weights(r, w, 1);
}

static json_t *worker_json(const run *r, int i, double wall_s);

static void worker_dead(run *r, int i)
{
    wk *w = &r->w[i];
    close(w->fd);
    int st;
    if (!r->c->remote) waitpid(w->pid, &st, 0);
    w->alive = 0;
    if (r->c->remote && !w->hello) { /* never a worker: no death, nothing to ask again */
        r->dropped_unproven++;
        w->in.len = w->out.len = w->out_off = 0;
        return;
    }
    w->left = sh_now_mono() - r->t0;
    if (w->bye) { /* a clean exit after STOP */
        json_array_append_new(r->gone, worker_json(r, i, w->left));
        w->trajs = 0, w->busy_s = 0, w->hello = 0, w->bye = 0, w->busy = 0;
        return;
    }
    r->deaths++;
    for (int k = 0; k < w->busy; k++) { /* lost; they will be asked for again */
        r->issued -= w->req_trajs[k];
        r->dropped_dead += w->req_trajs[k];
        if (r->c->ordered && r->nlost < RL_MAX_WORKERS * RL_QUEUE) {
            r->lost[2 * r->nlost] = w->req_group0[k];
            r->lost[2 * r->nlost + 1] = w->req_trajs[k] / r->c->group;
            r->nlost++;
        }
    }
    w->busy = 0;
    sh_log(SH_LOG_WARN, "rl: worker %d (%s) died; its in-flight trajectories are dropped", i,
           r->spec[i].name);
    if (r->c->remote) {
        /* The slot is reused by the next connection: keep its record. */
        if (w->hello) json_array_append_new(r->gone, worker_json(r, i, w->left));
        w->trajs = 0, w->busy_s = 0, w->hello = 0, w->bye = 0;
        return;
    }
    /* A worker that keeps dying (a broken setup rather than a lost node)
     * is not replaced forever: the loop then fails once none is left. */
    if (r->c->respawn && r->respawns < 3 * r->c->nworkers && spawn(r, i) == 0) r->respawns++;
}

/* Remote mode: takes a new connection into a free slot; it gets weights
 * once its HELLO says what it is.  With every slot taken it is closed. */
/* Closes remote connection i, which has not sent its HELLO (why: for the
 * log).  It was never a worker: no death, no lost work. */
static void drop_unproven(run *r, int i, const char *why)
{
    sh_log(SH_LOG_WARN, "rl: closing connection %d before its HELLO: %s", i, why);
    worker_dead(r, i);
}

static void accept_remote(run *r)
{
    int fd = accept4(r->c->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    int i = 0;
    while (i < RL_MAX_WORKERS && r->w[i].alive) i++;
    if (i == RL_MAX_WORKERS) {
        /* Every slot is taken.  A connection that has not sent its HELLO
         * yet gives its slot up, the oldest first: connections that never
         * say HELLO (another tenant's, on the host network) cannot keep the
         * run's workers out, since a worker sends its HELLO as it connects. */
        int old = -1;
        for (int k = 0; k < RL_MAX_WORKERS; k++)
            if (!r->w[k].hello && (old < 0 || r->w[k].joined < r->w[old].joined)) old = k;
        if (old < 0) {
            sh_log(SH_LOG_WARN, "rl: a worker connected but all %d slots are taken", RL_MAX_WORKERS);
            close(fd);
            return;
        }
        drop_unproven(r, old, "every slot is taken, and it is the oldest without a HELLO");
        i = old;
    }
    if (i >= r->nslots) r->nslots = i + 1;
    wk *w = &r->w[i];
    w->pid = 0, w->fd = fd, w->alive = 1, w->busy = 0, w->hello = 0, w->bye = 0, w->push = 0;
    w->refused = 0, w->stopped = 0, w->why[0] = 0;
    w->trajs = w->trajs_at_join = 0, w->busy_s = 0;
    w->in.len = w->out.len = w->out_off = 0;
    w->joined = sh_now_mono() - r->t0, w->left = -1;
}

/* "worker 3 (h100)", for messages. */
static const char *who(const run *r, int i, char *buf, size_t cap)
{
    snprintf(buf, cap, "worker %d (%s)", i, r->w[i].hello && r->spec[i].name[0] ? r->spec[i].name : "?");
    return buf;
}

static int got_hello(run *r, int i, const uint8_t *p, size_t len)
{
    rl_wire_hello h;
    char nm[48];
    snprintf(nm, sizeof nm, "worker %d", i);
    if (r->w[i].hello) return sh_err(SH_EFORMAT, "%s: a second HELLO", who(r, i, nm, sizeof nm));
    SH_TRY(rl__hello_parse(nm, p, len, &h));
    if (r->has_secret && !net_hello_check(r->secret, "rl worker", h.nonce, h.proof)) {
        r->refused_hellos++;
        return sh_err(SH_EPERM, "worker %d (%s, pid %d): its HELLO lacks this run's secret (SHOAL_RUN_SECRET)",
                      i, h.name, (int)h.pid);
    }
    if (r->has_secret) { /* our proof first: the worker trusts nothing before it */
        sh_hash128 pr = net_secret_proof(r->secret, "rl trainer", h.nonce);
        SH_TRY(rl__msg_append(&r->w[i].out, RL_MSG_WELCOME, &pr, sizeof pr, NULL, 0));
    }
    rl_worker_spec *sp = &r->spec[i];
    memset(sp, 0, sizeof *sp);
    snprintf(sp->name, sizeof sp->name, "%s", h.name);
    sp->speed = h.speed, sp->price = h.price;
    r->w[i].pid = h.pid;
    r->w[i].hello = 1;
    r->w[i].push = (h.flags & RL_HELLO_PUSH) != 0;
    r->joins++;
    r->push_joins += r->w[i].push;
    if (!r->w[i].push) SH_TRY(rl__enqueue_weights(r, &r->w[i], 1));
    if (rl__over(r)) return rl__queue_stop(r, &r->w[i]); /* joined while the run was ending */
    return 0;
}

int rl__queue_stop(run *r, wk *w)
{
    int32_t v = r->version; /* a push worker takes it before its BYE */
    w->stopped = 1;
    return rl__msg_append(&w->out, RL_MSG_STOP, &v, sizeof v, NULL, 0);
}

/* Drops worker i's oldest request, answered or refused. */
static void pop_request(run *r, wk *w)
{
    memmove(w->req_trajs, w->req_trajs + 1, sizeof(int) * (RL_QUEUE - 1));
    memmove(w->req_group0, w->req_group0 + 1, sizeof(int) * (RL_QUEUE - 1));
    memmove(w->req_minv, w->req_minv + 1, sizeof(int) * (RL_QUEUE - 1));
    if (--w->busy == 0) w->busy_s += sh_now_mono() - w->busy_since;
}

/* A push worker could not get weights new enough for its oldest request in
 * time: its groups are asked for again (of this worker or another), and
 * nothing of them is trained on. */
static int got_refuse(run *r, int i, const uint8_t *p, size_t len)
{
    wk *w = &r->w[i];
    rl_wire_refuse f;
    char nm[48];
    if (!w->busy) return sh_err(SH_EFORMAT, "%s: REFUSE without a request", who(r, i, nm, sizeof nm));
    rl__ask a = {.group0 = w->req_group0[0], .nprompts = w->req_trajs[0] / r->c->group,
                 .group = r->c->group, .min_version = w->req_minv[0]};
    SH_TRY(rl__refuse_check(&a, who(r, i, nm, sizeof nm), p, len, &f));
    r->issued -= w->req_trajs[0];
    r->refused++, w->refused++;
    sh_log(SH_LOG_INFO, "rl: worker %d (%s) holds version %d, refused groups %d+%d that need %d; "
           "asking again", i, r->spec[i].name, f.version, f.group0, f.nprompts, f.min_version);
    if (!rl__over(r) && r->nlost < RL_MAX_WORKERS * RL_QUEUE) {
        r->lost[2 * r->nlost] = f.group0;
        r->lost[2 * r->nlost + 1] = f.nprompts;
        r->nlost++;
    }
    pop_request(r, w);
    return 0;
}

static int got_bye(run *r, int i, const uint8_t *p, size_t len)
{
    rl_wire_bye b;
    char nm[48];
    /* A BYE before STOP would make its leaving a clean exit, and its
     * requests in flight would never be asked for again. */
    if (!r->w[i].stopped) return sh_err(SH_EFORMAT, "%s: BYE before STOP", who(r, i, nm, sizeof nm));
    SH_TRY(rl__bye_check(r->version, who(r, i, nm, sizeof nm), p, len, &b));
    r->w[i].bye = 1;
    r->w[i].final_version = b.version;
    r->w[i].final_hash = (sh_hash128){b.hash_lo, b.hash_hi};
    return 0;
}

/* Asks worker i for groups [g0, g0 + nprompts); g0 < 0: the next new ones. */
static int send_request(run *r, int i, int nprompts, int g0)
{
    wk *w = &r->w[i];
    const rl_config *c = r->c;
    if (g0 < 0) g0 = r->group_next, r->group_next += nprompts;
    int minv = c->mode == RL_MODE_ASYNC ? r->version - c->max_lag : r->version;
    if (c->mode == RL_MODE_ASYNC && c->ordered) { /* the step that consumes the last group */
        int last = (g0 + nprompts - 1) / c->prompts_per_step - c->max_lag;
        if (last > minv) minv = last;
    }
    rl_wire_request rq = {.min_version = minv, .nprompts = nprompts, .group = c->group,
                          .group0 = g0, .seed = r->seed};
    uint64_t ids[4096];
    for (int k = 0; k < nprompts; k++) {
        rl_problem p;
        rl__group_problem(r->seed, c->task, g0 + k, &p);
        ids[k] = p.id;
    }
    SH_TRY(rl__msg_append(&w->out, RL_MSG_REQUEST, &rq, sizeof rq, ids, 8 * (size_t)nprompts));
    if (!w->busy) w->busy_since = sh_now_mono();
    w->req_group0[w->busy] = g0;
    w->req_minv[w->busy] = minv;
    w->req_trajs[w->busy++] = nprompts * c->group;
    r->issued += nprompts * c->group;
    return 0;
}

static int busy_count(const run *r)
{
    int n = 0;
    for (int i = 0; i < r->nslots; i++) n += r->w[i].alive && r->w[i].busy > 0;
    return n;
}

/* Hands out work according to the mode. */
static int issue(run *r)
{
    const rl_config *c = r->c;
    if (rl__over(r)) return 0;
    if (c->mode == RL_MODE_SYNC) {
        /* Sync: the next round starts with the weights of the step that
         * is training, once they are back. */
        if (busy_count(r) || r->nbuf >= r->batch || r->training) return 0;
        int alive = 0, need = (r->batch - r->nbuf) / c->group;
        for (int i = 0; i < r->nslots; i++) alive += r->w[i].alive && r->w[i].hello;
        if (!alive) return 0;
        for (int i = 0, k = 0; i < r->nslots; i++) {
            if (!r->w[i].alive || !r->w[i].hello) continue;
            int share = need / alive + (k++ < need % alive);
            if (share) SH_TRY(send_request(r, i, share, -1));
        }
        return 0;
    }
    int per = c->req_prompts ? c->req_prompts : (c->prompts_per_step + 3) / 4;
    long bound = (long)(r->step + c->max_lag + 1) * r->batch;
    double fastest = 0;
    for (int i = 0; i < r->nslots; i++)
        if (r->spec[i].speed > fastest) fastest = r->spec[i].speed;
    if (fastest <= 0) fastest = 1; /* remote slots before their HELLO */
    /* Lost groups (a dead or dropped worker's, or refused) first, every one
     * of them before any new group: a worker serves its requests in order,
     * and an ordered request for a new group may wait for a version that
     * only the lost groups can make.  Each goes to the worker with room
     * that has nothing queued waiting for a newer version, the least busy. */
    while (r->nlost) {
        int best = -1, best_waits = 0;
        for (int i = 0; i < r->nslots; i++) {
            wk *w = &r->w[i];
            if (!w->alive || !w->hello || w->busy >= RL_QUEUE) continue;
            int waits = 0;
            for (int k = 0; k < w->busy; k++) waits |= w->req_minv[k] > r->version;
            if (best < 0 || waits < best_waits || (waits == best_waits && w->busy < r->w[best].busy))
                best = i, best_waits = waits;
        }
        if (best < 0) return 0; /* new groups wait until every lost one is asked for */
        r->nlost--;
        SH_TRY(send_request(r, best, r->lost[2 * r->nlost + 1], r->lost[2 * r->nlost]));
    }
    /* Every idle worker gets a request before any gets a second one.  A
     * slow worker gets a shorter queue: work queued behind it would be
     * stale by the time it started. */
    for (int depth = 1; depth <= RL_QUEUE; depth++)
        for (int i = 0; i < r->nslots; i++) {
            wk *w = &r->w[i];
            int n = r->spec[i].req_prompts ? r->spec[i].req_prompts : per;
            int limit = 1 + (int)((RL_QUEUE - 1) * r->spec[i].speed / fastest + 0.5);
            if (w->alive && w->hello && w->busy < depth && depth <= limit &&
                r->issued + n * c->group <= bound)
                SH_TRY(send_request(r, i, n, -1));
        }
    return 0;
}

/* Checks a TRAJS message against the worker's oldest request
 * (rl__trajs_check) and buffers its trajectories. */
static int accept_trajs(run *r, int i, const uint8_t *p, size_t len)
{
    wk *w = &r->w[i];
    char nm[48];
    if (!w->busy) return sh_err(SH_EFORMAT, "%s: TRAJS without a request", who(r, i, nm, sizeof nm));
    int count = w->req_trajs[0], np = count / r->c->group;
    rl_problem *probs = malloc(sizeof(rl_problem) * (size_t)np);
    rl_traj *tmp = malloc(sizeof(rl_traj) * (size_t)count);
    int rc = probs && tmp ? 0 : sh_err(SH_ENOMEM, "rl: out of memory");
    for (int k = 0; k < np && !rc; k++) rl__group_problem(r->seed, r->c->task, w->req_group0[0] + k, &probs[k]);
    /* A push worker may hold the version the compute thread is publishing. */
    rl__ask a = {.group0 = w->req_group0[0], .nprompts = np, .group = r->c->group,
                 .min_version = w->req_minv[0], .max_version = r->version + r->training,
                 .probs = probs, .max_len = r->c->model.ctx < RL_MAX_T ? r->c->model.ctx : RL_MAX_T,
                 .max_new = r->c->sampling.max_new};
    if (!rc) rc = rl__trajs_check(&a, who(r, i, nm, sizeof nm), p, len, tmp);
    free(probs);
    if (!rc && r->c->step_s > 0) /* the GPU did the work, whether or not it is used */
        w->gpu_s += rl_emu_request_s(r->c, &r->spec[i], tmp, count);
    if (!rc && rl__over(r)) /* the run is over: answers to old requests */
        r->dropped_end += count;
    else if (!rc && r->nbuf + count > r->cap)
        rc = sh_err(SH_EINTERNAL, "rl: trajectory buffer overflow (%d + %d > %d)", r->nbuf, count, r->cap);
    else if (!rc) {
        for (int k = 0; k < count; k++) {
            r->gen_tokens += tmp[k].len - tmp[k].plen;
            tmp[k].worker = i; /* remote workers do not know their slot */
        }
        memcpy(r->buf + r->nbuf, tmp, sizeof(rl_traj) * (size_t)count);
        r->nbuf += count;
        w->trajs += count;
    }
    free(tmp);
    if (!rc) pop_request(r, w);
    return rc;
}

static int read_worker(run *r, int i)
{
    wk *w = &r->w[i];
    int gone = 0;
    for (;;) {
        SH_TRY(sh_buf_reserve(&w->in, 65536));
        ssize_t n = read(w->fd, w->in.data + w->in.len, w->in.cap - w->in.len - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) { /* EOF or error: the worker is gone once its last messages are read */
            gone = 1;
            break;
        }
        w->in.len += (size_t)n;
    }
    /* Before its HELLO a remote peer is nobody: its first frame must be a
     * HELLO of the right size, checked from the header, so that it cannot
     * make the trainer buffer a large payload. */
    if (r->c->remote && !w->hello && w->in.len >= sizeof(rl_wire_hdr)) {
        rl_wire_hdr h;
        memcpy(&h, w->in.data, sizeof h);
        if (h.magic != RL_WIRE_MAGIC || h.type != RL_MSG_HELLO || h.len != sizeof(rl_wire_hello))
            return sh_err(SH_EFORMAT, "connection %d: first message is not a HELLO (type %u, %llu bytes)", i,
                          h.type, (unsigned long long)h.len);
    }
    for (;;) {
        uint32_t type;
        const uint8_t *pl;
        size_t len;
        long used = rl__msg_peek(&w->in, &type, &pl, &len);
        if (used < 0) return (int)used;
        if (!used) return gone;
        if (type == RL_MSG_HELLO && r->c->remote) SH_TRY(got_hello(r, i, pl, len));
        else if (type == RL_MSG_BYE) SH_TRY(got_bye(r, i, pl, len));
        else if (type == RL_MSG_TRAJS && w->hello) SH_TRY(accept_trajs(r, i, pl, len));
        else if (type == RL_MSG_REFUSE && w->hello) SH_TRY(got_refuse(r, i, pl, len));
        else return sh_err(SH_EFORMAT, "worker %d: unexpected message %u", i, type);
        memmove(w->in.data, w->in.data + used, w->in.len - used);
        w->in.len -= used;
    }
}

static int flush_worker(wk *w)
{
    while (w->out_off < w->out.len) {
        ssize_t n = send(w->fd, w->out.data + w->out_off, w->out.len - w->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (n < 0) return 1;
        w->out_off += (size_t)n;
    }
    w->out.len = w->out_off = 0;
    return 0;
}

/* Drops whole groups that started more than max_lag versions ago. */
static void drop_stale(run *r)
{
    int k = 0;
    for (int i = 0; i < r->nbuf;) {
        int j = i, old = 0;
        while (j < r->nbuf && r->buf[j].group == r->buf[i].group)
            old |= r->version - r->buf[j++].vstart > r->c->max_lag;
        if (old) {
            r->dropped_stale += j - i;
            r->issued -= j - i;
        } else {
            memmove(&r->buf[k], &r->buf[i], sizeof(rl_traj) * (j - i));
            k += j - i;
        }
        i = j;
    }
    r->nbuf = k;
}

double rl__wall(const run *r) { return sh_now_mono() - r->t0; }

static int poll_once(run *r);

/* A batch is buffered: any batch of whole groups, or, ordered, every group
 * of the next step's. */
static int batch_ready(const run *r)
{
    if (r->nbuf < r->batch) return 0;
    if (!r->c->ordered || r->c->mode != RL_MODE_ASYNC) return 1;
    int end = (r->step + 1) * r->c->prompts_per_step, n = 0;
    for (int i = 0; i < r->nbuf; i++) n += r->buf[i].group < end;
    return n == r->batch;
}

/* The event loop: it never computes, so workers are answered and fed
 * while the compute thread trains and evaluates.  The run ends when the
 * last step is trained and its evaluation is in. */
static int loop(run *r)
{
    const rl_config *c = r->c;
    int busy = 0;
    while (!rl__over(r) || busy) {
        if (rl__over(r)) { /* only the last evaluation is left: workers wait */
            struct pollfd pf = {.fd = rl__compute_wake_fd(r), .events = POLLIN};
            if (poll(&pf, 1, 200) < 0 && errno != EINTR) return sh_err_errno(errno, "rl: poll");
            SH_TRY(rl__compute_collect(r));
            busy = rl__compute_busy(r);
            continue;
        }
        SH_TRY(issue(r));
        SH_TRY(poll_once(r));
        SH_TRY(rl__compute_collect(r));
        /* Ordered requests wait for weights new enough instead (a dropped
         * group would leave a hole in the sequence). */
        if (c->mode == RL_MODE_ASYNC && !c->ordered) drop_stale(r);
        busy = rl__compute_busy(r);
        if (!busy && !rl__over(r) && batch_ready(r) &&
            (c->mode == RL_MODE_ASYNC || !busy_count(r))) {
            SH_TRY(rl__compute_dispatch(r));
            busy = 1;
        }
    }
    return 0;
}

/* Worker i sent a message that breaks the protocol or fails the checks
 * (sh_errmsg() says which): it is dropped, not fatal, whether remote or
 * forked (killed, then replaced as a dead one is).  Its requests in
 * flight are lost with it and asked for again. */
static void violated(run *r, int i)
{
    wk *w = &r->w[i];
    sh_log(SH_LOG_WARN, "rl: dropping worker %d: %s", i, sh_errmsg());
    snprintf(w->why, sizeof w->why, "%s", sh_errmsg());
    if (w->hello) r->violations++;
    w->bye = 0; /* not a clean exit, whatever it said */
    if (!r->c->remote && w->pid > 0) kill(w->pid, SIGKILL);
}

/* One poll over the workers (and, remote, the listening socket): flushes
 * outboxes, reads messages, handles deaths and new connections. */
static int poll_once(run *r)
{
    const rl_config *c = r->c;
    {
        struct pollfd pf[RL_MAX_WORKERS + 2];
        int idx[RL_MAX_WORKERS + 2], n = 0;
        for (int i = 0; i < r->nslots; i++) {
            if (!r->w[i].alive) continue;
            pf[n] = (struct pollfd){.fd = r->w[i].fd,
                                    .events = POLLIN | (r->w[i].out.len ? POLLOUT : 0)};
            idx[n++] = i;
        }
        if (!n && !c->remote)
            return sh_err(SH_EIO, "rl: every worker has died (%ld deaths, %ld replacements); "
                                  "see the worker errors above", r->deaths, r->respawns);
        int nw = n;
        if (c->remote) pf[n++] = (struct pollfd){.fd = c->listen_fd, .events = POLLIN};
        pf[n++] = (struct pollfd){.fd = rl__compute_wake_fd(r), .events = POLLIN};
        double t0 = sh_now_mono();
        if (poll(pf, n, 200) < 0 && errno != EINTR) return sh_err_errno(errno, "rl: poll");
        r->t_wait += sh_now_mono() - t0;
        if (c->remote && (pf[nw].revents & POLLIN)) accept_remote(r);
        /* A connection gets RL_HELLO_S to say HELLO (a worker says it as
         * it connects). */
        for (int k = 0; c->remote && k < nw; k++) {
            int i = idx[k];
            if (r->w[i].alive && !r->w[i].hello && rl__wall(r) - r->w[i].joined > RL_HELLO_S) {
                char why[64];
                snprintf(why, sizeof why, "no HELLO within %d s of connecting", RL_HELLO_S);
                drop_unproven(r, i, why);
                pf[k].revents = 0;
            }
        }
        /* The compute thread's news is taken by the loop's next collect. */
        for (int k = 0; k < nw; k++) {
            int i = idx[k], dead = 0;
            if (pf[k].revents & POLLOUT) dead = flush_worker(&r->w[i]);
            if (!dead && (pf[k].revents & (POLLIN | POLLHUP | POLLERR))) {
                int rc = read_worker(r, i);
                if (rc < 0 && rc != SH_EFORMAT && rc != SH_EPERM && !c->remote) return rc;
                if (rc < 0) violated(r, i);
                dead = rc != 0;
            }
            if (dead) worker_dead(r, i);
        }
    }
    return 0;
}

/* STOP to every worker, then close; a worker that does not exit within two
 * seconds is killed. */
static void shutdown_remote(run *r)
{
    for (int i = 0; i < r->nslots; i++)
        if (r->w[i].alive && r->w[i].hello) rl__queue_stop(r, &r->w[i]);
        else if (r->w[i].alive) worker_dead(r, i);
    /* Workers apply the last weights, finish what they generate (answers
     * are discarded), then answer STOP with BYE and close. */
    double deadline = sh_now_mono() + (r->c->drain_s > 0 ? r->c->drain_s : 10);
    for (;;) {
        int alive = 0;
        for (int i = 0; i < r->nslots; i++) alive += r->w[i].alive;
        if (!alive || sh_now_mono() > deadline) break;
        if (poll_once(r) < 0) sh_log(SH_LOG_WARN, "rl: while stopping workers: %s", sh_errmsg());
    }
    for (int i = 0; i < r->nslots; i++)
        if (r->w[i].alive) worker_dead(r, i);
    for (int i = 0; i < RL_MAX_WORKERS; i++) sh_buf_free(&r->w[i].in), sh_buf_free(&r->w[i].out);
}

static void shutdown_workers(run *r)
{
    if (r->c->remote) {
        shutdown_remote(r);
        return;
    }
    for (int i = 0; i < r->nslots; i++) {
        wk *w = &r->w[i];
        if (!w->alive) continue;
        w->out.len = w->out_off = 0;
        rl__msg_append(&w->out, RL_MSG_STOP, NULL, 0, NULL, 0);
        flush_worker(w);
        close(w->fd);
    }
    double deadline = sh_now_mono() + 2.0;
    for (int i = 0; i < r->nslots; i++) {
        wk *w = &r->w[i];
        if (!w->alive) continue;
        int st;
        while (waitpid(w->pid, &st, WNOHANG) == 0) {
            if (sh_now_mono() > deadline) {
                kill(w->pid, SIGKILL);
                waitpid(w->pid, &st, 0);
                break;
            }
            sh_sleep(0.01);
        }
        w->alive = 0;
    }
    for (int i = 0; i < r->nslots; i++) sh_buf_free(&r->w[i].in), sh_buf_free(&r->w[i].out);
}

/* One worker's entry in the result.  A rented GPU is paid for the whole
 * time it is held, busy or not: the run for forked workers, from joining
 * to leaving for remote ones. */
static json_t *worker_json(const run *r, int i, double until)
{
    const wk *w = &r->w[i];
    const rl_worker_spec *sp = &r->spec[i];
    double held = r->c->remote ? until - w->joined : until;
    char hex[33];
    sh_hash128_hex(w->final_hash, hex);
    json_t *o = json_pack("{s:s,s:f,s:f,s:I,s:I,s:f,s:f,s:f}", "name", sp->name, "speed", sp->speed,
                          "price_per_h", sp->price, "trajectories", (json_int_t)w->trajs,
                          "trajectories_since_join", (json_int_t)(w->trajs - w->trajs_at_join),
                          "busy_s", w->busy_s, "held_s", held, "cost_usd",
                          sp->price * held / 3600.0);
    if (r->c->step_s > 0) {
        json_object_set_new(o, "gpu_s", json_real(w->gpu_s));
        json_object_set_new(o, "max_seqs", json_integer(sp->max_seqs));
        json_object_set_new(o, "req_prompts", json_integer(sp->req_prompts));
    }
    if (r->c->remote) {
        json_object_set_new(o, "push", json_boolean(w->push));
        json_object_set_new(o, "refused", json_integer(w->refused));
    }
    if (w->why[0]) json_object_set_new(o, "dropped_for", json_string(w->why));
    if (r->c->remote)
        json_object_set_new(o, "final", w->bye ? json_pack("{s:i,s:s}", "version", w->final_version,
                                                           "image_xxh3", hex)
                                               : json_null());
    return o;
}

static json_t *result_json(run *r, double reward_start, double wall_s)
{
    const rl_config *c = r->c;
    json_t *workers = json_array();
    double cost = 0;
    size_t k;
    json_t *g;
    json_array_foreach(r->gone, k, g) json_array_append(workers, g);
    for (int i = 0; i < r->nslots; i++)
        if (!c->remote) json_array_append_new(workers, worker_json(r, i, wall_s));
    json_array_foreach(workers, k, g) cost += json_number_value(json_object_get(g, "cost_usd"));
    char hex[33];
    sh_hash128_hex(sh_hash128_of(r->img.data, r->img.len), hex);
    int nh = c->mode == RL_MODE_ASYNC ? c->max_lag + 1 : 1;
    json_t *res = json_pack("{s:s,s:s,s:i,s:s,s:s,s:I,s:f,s:f,s:f,s:i,s:f,s:f,s:f,s:I,s:I,s:I,s:I,s:I,"
                     "s:I,s:o,s:o,s:o,s:o,s:f,s:I,s:f,s:o,s:f,s:f,s:o,s:i,s:s,s:I,s:I}",
                     "task", rl_task_name(c->task), "mode", c->mode ? "async" : "sync", "max_lag",
                     c->max_lag, "loss", rl_loss_name(c->loss.kind), "rollout_dtype",
                     c->dtype == RL_DTYPE_FP32 ? "fp32" : c->dtype == RL_DTYPE_BF16 ? "bf16" : "fp8",
                     "seed", (json_int_t)c->seed, "reward_start", reward_start, "reward_end",
                     r->last_eval, "wall_s", wall_s, "steps", r->step, "tokens_per_s",
                     r->gen_tokens / wall_s, "train_tokens_per_s", r->train_tokens / wall_s,
                     "time_to_target_s", r->time_to_target, "skipped_steps", (json_int_t)r->skipped,
                     "dropped_stale", (json_int_t)r->dropped_stale, "dropped_dead",
                     (json_int_t)r->dropped_dead, "worker_deaths", (json_int_t)r->deaths,
                     "respawns", (json_int_t)r->respawns, "inflight_updated_trajs",
                     (json_int_t)r->inflight_updates, "staleness_hist", rl__hist_json(r->stale_hist, nh),
                     "curve", json_incref(r->curve), "workers", workers, "step_stats",
                     json_incref(r->steps), "cost_usd", cost, "params",
                     (json_int_t)nn_num_params(r->tr.model), "eval_s", r->eval_s,
                     "checkpoints", json_incref(r->ckpts), "weights_image_bytes", r->image_bytes,
                     "weights_delta_bytes_mean", r->deltas ? r->delta_bytes_sum / r->deltas : 0.0,
                     "trainer_phases_s", json_pack("{s:f,s:f,s:f}", "train", r->t_train, "publish",
                                                   r->t_publish, "wait", r->t_wait),
                     "final_version", r->version, "final_image_xxh3", hex, "worker_joins",
                     (json_int_t)r->joins, "dropped_end", (json_int_t)r->dropped_end);
    if (res) {
        json_object_set_new(res, "refused_requests", json_integer(r->refused));
        json_object_set_new(res, "worker_joins_push", json_integer(r->push_joins));
        json_object_set_new(res, "workers_refused", json_integer(r->refused_hellos));
        json_object_set_new(res, "connections_dropped", json_integer(r->dropped_unproven));
        json_object_set_new(res, "workers_dropped_for_violations", json_integer(r->violations));
        json_object_set_new(res, "weights_bytes_sent", json_real(r->weights_bytes));
    }
    return res;
}

int rl_run(const rl_config *c, rl_progress_fn progress, void *ctx, json_t **result)
{
    SH_TRY(rl_config_check(c));
    run *r = calloc(1, sizeof *r);
    if (!r) return sh_err(SH_ENOMEM, "rl: out of memory");
    r->c = c, r->progress = progress, r->pctx = ctx;
    r->batch = c->prompts_per_step * c->group;
    r->seed = c->seed * 0x2545f4914f6cdd1dULL + 1;
    r->time_to_target = -1;
    r->curve = json_array(), r->steps = json_array(), r->ckpts = json_array();
    r->gone = json_array();
    r->nslots = c->remote ? 0 : c->nworkers;
    if (!c->remote) memcpy(r->spec, c->workers, sizeof r->spec);
    /* Admission keeps at most max_lag + 1 batches beyond those consumed;
     * sync keeps one.  Leave room for every worker's request on top. */
    int slots = c->remote ? RL_MAX_WORKERS : c->nworkers;
    r->cap = r->batch * (c->max_lag + 2 + RL_QUEUE * slots) + 64;
    r->buf = malloc(sizeof(rl_traj) * (size_t)r->cap);
    r->sortbuf = malloc(sizeof(rl_traj) * (size_t)r->cap);
    r->evalset = malloc(sizeof(rl_problem) * c->eval_n);
    int rc = r->buf && r->sortbuf && r->evalset ? 0 : sh_err(SH_ENOMEM, "rl: out of memory");
    if (!rc && c->remote) {
        rc = net_run_secret(&r->secret);
        r->has_secret = rc == 1;
        if (rc > 0) rc = 0;
    }
    if (!rc && c->out_dir) rc = sh_mkdir_p(c->out_dir, 0755);
    if (!rc) rc = nn_new(&c->model, c->seed, &r->tr.model);
    if (!rc) rc = rl__warm_start(c, r->tr.model);
    r->tr.loss = c->loss, r->tr.temperature = c->sampling.temperature;
    r->tr.minibatches = c->minibatches;
    if (!rc) rc = nn_adamw_init(&r->tr.opt, r->tr.model, c->lr);
    double reward_start = 0, wall_s = 0;
    if (!rc) rl_eval_set(c->task, c->eval_n, r->evalset);
    if (!rc) rc = rl_evaluate(r->tr.model, r->evalset, c->eval_n, &c->sampling, RL_EVAL_SAMPLES, 99, &reward_start);
    if (!rc) {
        r->last_eval = reward_start;
        r->t0 = sh_now_mono();
        json_array_append_new(r->curve, json_pack("{s:f,s:i,s:f}", "wall_s", 0.0, "step", 0,
                                                  "reward", reward_start));
        rc = rl__publish_now(r);
        /* Before the thread starts: forked workers must not inherit it. */
        for (int i = 0; i < r->nslots && !rc; i++) rc = spawn(r, i);
        if (!rc) rc = rl__compute_start(r);
        if (!rc) rc = loop(r);
        wall_s = rl__wall(r);
        rl__compute_stop(r);
        shutdown_workers(r);
    }
    if (!rc) *result = result_json(r, reward_start, wall_s);
    json_decref(r->curve), json_decref(r->steps), json_decref(r->ckpts), json_decref(r->gone);
    nn_adamw_free(&r->tr.opt);
    nn_free(r->tr.model);
    ckpt_close(r->ck);
    sh_buf_free(&r->img), sh_buf_free(&r->delta);
    free(r->buf), free(r->sortbuf), free(r->evalset), free(r);
    return rc;
}
