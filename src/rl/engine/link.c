/* The RL protocol (docs/rl-protocol.md) for programs outside shoal: a
 * trainer that is not rl_run (python/shoal/rl.py's Trainer, a PyTorch
 * trainer) and a worker that is not rl_worker_serve (its Worker, a torch
 * policy).  Both ends speak the same messages and the trainer runs the
 * same checks (trajcheck.c) as the C runtime, so a Python trainer serves C
 * workers (`shoal rl worker`) and a C trainer Python workers.
 *
 * One object per end, one thread each: every call runs to completion on
 * the caller's thread (the trainer's event loop runs inside rl_link_poll;
 * between polls the kernel buffers what workers send and workers keep
 * serving the requests they hold).  Include/shoal/rl.h documents each call. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rl/engine/runtime_int.h"
#include "rl/engine/wire_int.h"
#include "shoal/ckpt.h"
#include "shoal/delta.h"

typedef struct lreq {
    int group0, nprompts, minv, exact;
} lreq;

typedef struct lwk {
    int fd, alive, hello, push, stopped, bye, final_version;
    char name[16], why[256];
    lreq req[RL_QUEUE];
    int busy;
    sh_buf in, out;
    size_t out_off;
    double joined;
    long trajs, refused;
    sh_hash128 final_hash;
} lwk;

#define LINK_PENDING 4096

struct rl_link {
    int trainer; /* 1: the trainer's end; 0: a worker's */
    int fd;      /* trainer: the listening socket; worker: the connection */
    char addr[64];
    sh_hash128 secret;
    int has_secret;
    /* ---- trainer */
    int task, group, max_new, max_len, max_lag;
    uint64_t seed;
    int version, group_next;
    lwk w[RL_MAX_WORKERS];
    lreq pending[LINK_PENDING]; /* asked for, not yet sent to a worker: oldest first */
    int npending;
    rl_traj *ready; /* checked trajectories not yet handed out */
    int nready, capready;
    long joins, trajs, dropped_stale, dropped_dead, refused, violations, deaths, refused_hellos;
    long stale_hist[65];
    json_t *gone; /* workers that left */
    json_t *refused_exact; /* exact requests refused: not asked for again */
    /* ---- worker */
    int proven;
    sh_hash128 expect;
    lreq wq[256]; /* requests received, not yet answered: oldest first */
    int nwq;
    int wversion; /* direct transport: the version of img */
    sh_buf img, msg;
    ckpt *ck;
};

static int parse_secret(const char *hex, sh_hash128 *out, int *has)
{
    if (!hex) {
        int rc = net_run_secret(out);
        if (rc < 0) return rc;
        *has = rc;
        return 0;
    }
    *has = 0;
    if (!*hex) return 0;
    if (strlen(hex) != 32 || sh_hash128_parse(hex, out) < 0)
        return sh_err(SH_EINVAL, "rl link: the run's secret must be 32 hex digits, not %zu characters", strlen(hex));
    *has = 1;
    return 0;
}

/* ======================= the trainer's end ============================= */

int rl_link_listen(const char *hostport, const char *secret_hex, int task, uint64_t seed, int group,
                   int max_new, int max_len, int max_lag, rl_link **out)
{
    *out = NULL;
    struct sockaddr_in sa;
    if (task != RL_TASK_CODE && task != RL_TASK_ARITH) return sh_err(SH_EINVAL, "rl link: task %d is not a task", task);
    if (group < 1 || group > 4096) return sh_err(SH_EINVAL, "rl link: group %d: expected 1..4096", group);
    if (max_len < 3 || max_len > RL_MAX_T)
        return sh_err(SH_EINVAL, "rl link: max_len %d: expected 3..%d (the model's context)", max_len, RL_MAX_T);
    if (max_new < 1 || max_new > RL_MAX_T) return sh_err(SH_EINVAL, "rl link: max_new %d: expected 1..%d", max_new, RL_MAX_T);
    if (max_lag < 0 || max_lag > 64) return sh_err(SH_EINVAL, "rl link: max_lag %d: expected 0..64", max_lag);
    SH_TRY(net_addr_parse(hostport, "rl link: listen address", &sa));
    rl_link *l = calloc(1, sizeof *l);
    if (!l) return sh_err(SH_ENOMEM, "rl link: out of memory");
    l->trainer = 1, l->task = task, l->seed = seed, l->group = group, l->max_new = max_new;
    l->max_len = max_len, l->max_lag = max_lag, l->version = -1, l->fd = -1;
    l->gone = json_array(), l->refused_exact = json_array();
    int rc = parse_secret(secret_hex, &l->secret, &l->has_secret);
    if (!rc) {
        l->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        int one = 1;
        socklen_t sl = sizeof sa;
        if (l->fd < 0) rc = sh_err_errno(errno, "rl link: socket");
        else if (setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), bind(l->fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
                 listen(l->fd, 64) < 0 || getsockname(l->fd, (struct sockaddr *)&sa, &sl) < 0)
            rc = sh_err_errno(errno, "rl link: listen on %s", hostport);
    }
    if (rc) {
        rl_link_close(l);
        return rc;
    }
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, host, sizeof host);
    snprintf(l->addr, sizeof l->addr, "%s:%u", host, ntohs(sa.sin_port));
    signal(SIGPIPE, SIG_IGN);
    *out = l;
    return 0;
}

const char *rl_link_addr(const rl_link *l) { return l->addr; }

int rl_link_set_version(rl_link *l, int version)
{
    if (!l->trainer) return sh_err(SH_EINVAL, "rl link: set_version is the trainer's");
    if (version < l->version)
        return sh_err(SH_EINVAL, "rl link: version %d is older than the published %d (versions only grow)",
                      version, l->version);
    l->version = version;
    return 0;
}

static int push_pending(rl_link *l, lreq q, int front)
{
    if (l->npending == LINK_PENDING)
        return sh_err(SH_ENOSPC, "rl link: %d requests wait for a worker already", LINK_PENDING);
    if (front) {
        memmove(l->pending + 1, l->pending, sizeof(lreq) * (size_t)l->npending);
        l->pending[0] = q;
    } else {
        l->pending[l->npending] = q;
    }
    l->npending++;
    return 0;
}

int rl_link_ask(rl_link *l, int nprompts, int min_version, int exact)
{
    if (!l->trainer) return sh_err(SH_EINVAL, "rl link: ask is the trainer's");
    if (nprompts < 1 || nprompts > 4096) return sh_err(SH_EINVAL, "rl link: %d prompts: expected 1..4096", nprompts);
    if (exact != 0 && exact != 1) return sh_err(SH_EINVAL, "rl link: exact is 0 or 1, not %d", exact);
    if (exact && min_version < 0) return sh_err(SH_EINVAL, "rl link: exactly version %d: expected >= 0", min_version);
    if (nprompts * l->group > 65536)
        return sh_err(SH_EINVAL, "rl link: %d prompts of %d: more than 65536 trajectories in one request", nprompts,
                      l->group);
    lreq q = {l->group_next, nprompts, min_version, exact};
    SH_TRY(push_pending(l, q, 0));
    l->group_next += nprompts;
    return q.group0;
}

static const char *lwho(const rl_link *l, int i, char *buf, size_t cap)
{
    snprintf(buf, cap, "worker %d (%s)", i, l->w[i].hello ? l->w[i].name : "?");
    return buf;
}

static json_t *worker_entry(const lwk *w)
{
    char hex[33];
    sh_hash128_hex(w->final_hash, hex);
    json_t *o = json_pack("{s:s,s:b,s:I,s:I,s:b}", "name", w->name, "push", w->push, "trajectories",
                          (json_int_t)w->trajs, "refused", (json_int_t)w->refused, "alive", w->alive);
    if (w->why[0]) json_object_set_new(o, "dropped_for", json_string(w->why));
    json_object_set_new(o, "final", w->bye ? json_pack("{s:i,s:s}", "version", w->final_version, "image_xxh3", hex)
                                           : json_null());
    return o;
}

/* Worker i is gone (EOF, error, dropped): its requests in flight are asked
 * for again, first. */
static void lworker_dead(rl_link *l, int i)
{
    lwk *w = &l->w[i];
    close(w->fd);
    w->alive = 0;
    if (w->hello) {
        if (!w->bye) {
            l->deaths++;
            for (int k = w->busy - 1; k >= 0; k--) {
                l->dropped_dead += (long)w->req[k].nprompts * l->group;
                push_pending(l, w->req[k], 1);
            }
            sh_log(SH_LOG_WARN, "rl link: worker %d (%s) left; %d of its requests are asked for again", i, w->name,
                   w->busy);
        }
        json_array_append_new(l->gone, worker_entry(w));
    }
    w->busy = 0, w->hello = 0;
    w->in.len = w->out.len = w->out_off = 0;
}

static void lviolated(rl_link *l, int i)
{
    lwk *w = &l->w[i];
    sh_log(SH_LOG_WARN, "rl link: dropping worker %d: %s", i, sh_errmsg());
    snprintf(w->why, sizeof w->why, "%s", sh_errmsg());
    if (w->hello) l->violations++;
    w->bye = 0;
}

static void laccept(rl_link *l)
{
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    int i = 0;
    while (i < RL_MAX_WORKERS && l->w[i].alive) i++;
    if (i == RL_MAX_WORKERS) {
        sh_log(SH_LOG_WARN, "rl link: a worker connected but all %d slots are taken", RL_MAX_WORKERS);
        close(fd);
        return;
    }
    lwk *w = &l->w[i];
    sh_buf in = w->in, out = w->out;
    memset(w, 0, sizeof *w);
    w->in = in, w->out = out;
    w->in.len = w->out.len = 0;
    w->fd = fd, w->alive = 1, w->final_version = -1;
    w->joined = sh_now_mono();
}

static int lhello(rl_link *l, int i, const uint8_t *p, size_t len)
{
    rl_wire_hello h;
    char nm[48];
    snprintf(nm, sizeof nm, "worker %d", i);
    if (l->w[i].hello) return sh_err(SH_EFORMAT, "%s: a second HELLO", lwho(l, i, nm, sizeof nm));
    SH_TRY(rl__hello_parse(nm, p, len, &h));
    if (l->has_secret && !net_hello_check(l->secret, "rl worker", h.nonce, h.proof)) {
        l->refused_hellos++;
        return sh_err(SH_EPERM, "worker %d (%s, pid %d): its HELLO lacks this run's secret", i, h.name, (int)h.pid);
    }
    if (l->has_secret) {
        sh_hash128 pr = net_secret_proof(l->secret, "rl trainer", h.nonce);
        SH_TRY(rl__msg_append(&l->w[i].out, RL_MSG_WELCOME, &pr, sizeof pr, NULL, 0));
    }
    snprintf(l->w[i].name, sizeof l->w[i].name, "%s", h.name);
    l->w[i].push = (h.flags & RL_HELLO_PUSH) != 0;
    l->w[i].hello = 1;
    l->joins++;
    return 0;
}

/* The groups of request q's problems, drawn from the run's seed. */
static int lprobs(const rl_link *l, const lreq *q, rl_problem **out)
{
    rl_problem *p = malloc(sizeof *p * (size_t)q->nprompts);
    if (!p) return sh_err(SH_ENOMEM, "rl link: out of memory");
    for (int k = 0; k < q->nprompts; k++) rl__group_problem(l->seed, l->task, q->group0 + k, &p[k]);
    *out = p;
    return 0;
}

static int ready_room(rl_link *l, int n)
{
    if (l->nready + n <= l->capready) return 0;
    int cap = l->capready ? l->capready : 256;
    while (cap < l->nready + n) cap *= 2;
    rl_traj *r = realloc(l->ready, sizeof *r * (size_t)cap);
    if (!r) return sh_err(SH_ENOMEM, "rl link: out of memory");
    l->ready = r, l->capready = cap;
    return 0;
}

static void pop_req(lwk *w)
{
    memmove(w->req, w->req + 1, sizeof(lreq) * (RL_QUEUE - 1));
    w->busy--;
}

/* A TRAJS: checked against the worker's oldest request (trajcheck.c);
 * groups older than max_lag versions are dropped and asked for again. */
static int ltrajs(rl_link *l, int i, const uint8_t *p, size_t len)
{
    lwk *w = &l->w[i];
    char nm[48];
    if (!w->busy) return sh_err(SH_EFORMAT, "%s: TRAJS without a request", lwho(l, i, nm, sizeof nm));
    lreq q = w->req[0];
    rl_problem *probs;
    SH_TRY(lprobs(l, &q, &probs));
    int n = q.nprompts * l->group;
    int rc = ready_room(l, n);
    rl__ask a = {.group0 = q.group0, .nprompts = q.nprompts, .group = l->group, .min_version = q.minv,
                 .exact = q.exact, .max_version = l->version, .probs = probs, .max_len = l->max_len,
                 .max_new = l->max_new};
    if (!rc) rc = rl__trajs_check(&a, lwho(l, i, nm, sizeof nm), p, len, l->ready + l->nready);
    free(probs);
    if (rc) return rc;
    pop_req(w);
    /* Bounded staleness: a group whose first token is more than max_lag
     * versions older than the trainer's is asked for again, no older. */
    rl_traj *t = l->ready + l->nready;
    int kept = 0;
    for (int g = 0; g < q.nprompts; g++) {
        rl_traj *gt = t + g * l->group;
        int old = 0;
        for (int j = 0; j < l->group; j++) old |= l->version - gt[j].vstart > l->max_lag;
        if (old) {
            l->dropped_stale += l->group;
            lreq again = {q.group0 + g, 1, l->version - l->max_lag, 0};
            SH_TRY(push_pending(l, again, 1));
            continue;
        }
        for (int j = 0; j < l->group; j++) {
            gt[j].worker = i;
            int s = l->version - gt[j].vstart;
            l->stale_hist[s < 0 ? 0 : s > 64 ? 64 : s]++;
        }
        if (t + kept * l->group != gt) memmove(t + kept * l->group, gt, sizeof(rl_traj) * (size_t)l->group);
        kept++;
    }
    l->nready += kept * l->group;
    l->trajs += kept * l->group;
    w->trajs += kept * l->group;
    return 0;
}

static int lrefuse(rl_link *l, int i, const uint8_t *p, size_t len)
{
    lwk *w = &l->w[i];
    char nm[48];
    rl_wire_refuse f;
    if (!w->busy) return sh_err(SH_EFORMAT, "%s: REFUSE without a request", lwho(l, i, nm, sizeof nm));
    lreq q = w->req[0];
    rl__ask a = {.group0 = q.group0, .nprompts = q.nprompts, .group = l->group, .min_version = q.minv,
                 .exact = q.exact};
    SH_TRY(rl__refuse_check(&a, lwho(l, i, nm, sizeof nm), p, len, &f));
    l->refused++, w->refused++;
    sh_log(SH_LOG_INFO, "rl link: worker %d (%s) holds version %d and refused groups %d+%d (%s%d); asking again",
           i, w->name, f.version, q.group0, q.nprompts, q.exact ? "exactly " : "at least ", q.minv);
    pop_req(w);
    /* At least a version: asked for again (this worker or another may get
     * it).  Exactly one: weights never go back, so asking again would only
     * ping-pong; the caller learns of it (stats: refused_exact) instead. */
    if (!q.exact) return push_pending(l, q, 1);
    if (l->refused_exact)
        json_array_append_new(l->refused_exact, json_pack("{s:i,s:i,s:i,s:i}", "group0", q.group0, "nprompts",
                                                          q.nprompts, "version", q.minv, "held", f.version));
    return 0;
}

static int lbye(rl_link *l, int i, const uint8_t *p, size_t len)
{
    rl_wire_bye b;
    char nm[48];
    if (!l->w[i].stopped) return sh_err(SH_EFORMAT, "%s: BYE before STOP", lwho(l, i, nm, sizeof nm));
    SH_TRY(rl__bye_check(l->version, lwho(l, i, nm, sizeof nm), p, len, &b));
    l->w[i].bye = 1;
    l->w[i].final_version = b.version;
    l->w[i].final_hash = (sh_hash128){b.hash_lo, b.hash_hi};
    return 0;
}

/* Reads what worker i sent: 0, 1 (EOF: gone) or < 0 (a violation). */
static int lread(rl_link *l, int i)
{
    lwk *w = &l->w[i];
    uint8_t tmp[1 << 16];
    for (;;) {
        ssize_t n = read(w->fd, tmp, sizeof tmp);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) return 1;
        SH_TRY(sh_buf_append(&w->in, tmp, (size_t)n));
        if (n < (ssize_t)sizeof tmp) break;
    }
    size_t off = 0;
    int rc = 0;
    while (!rc) {
        sh_buf view = {.data = w->in.data + off, .len = w->in.len - off};
        uint32_t type;
        const uint8_t *p;
        size_t len;
        long m = rl__msg_peek(&view, &type, &p, &len);
        if (m <= 0) {
            rc = (int)m;
            break;
        }
        char nm[48];
        if (type != RL_MSG_HELLO && !w->hello)
            rc = sh_err(SH_EFORMAT, "worker %d: message %u before HELLO", i, type);
        else if (type == RL_MSG_HELLO) rc = lhello(l, i, p, len);
        else if (type == RL_MSG_TRAJS) rc = ltrajs(l, i, p, len);
        else if (type == RL_MSG_REFUSE) rc = lrefuse(l, i, p, len);
        else if (type == RL_MSG_BYE) rc = lbye(l, i, p, len);
        else rc = sh_err(SH_EFORMAT, "%s: unexpected message type %u", lwho(l, i, nm, sizeof nm), type);
        off += (size_t)m;
    }
    memmove(w->in.data, w->in.data + off, w->in.len - off);
    w->in.len -= off;
    return rc;
}

static int lflush(lwk *w)
{
    while (w->out_off < w->out.len) {
        ssize_t n = write(w->fd, w->out.data + w->out_off, w->out.len - w->out_off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (n < 0) return 1;
        w->out_off += (size_t)n;
    }
    w->out.len = w->out_off = 0;
    return 0;
}

/* Hands pending requests to workers with room, the least busy first. */
static int ldispatch(rl_link *l)
{
    while (l->npending) {
        int best = -1;
        for (int i = 0; i < RL_MAX_WORKERS; i++) {
            lwk *w = &l->w[i];
            if (!w->alive || !w->hello || w->stopped || w->busy >= RL_QUEUE) continue;
            if (best < 0 || w->busy < l->w[best].busy) best = i;
        }
        if (best < 0) return 0;
        lreq q = l->pending[0];
        rl_problem *probs;
        SH_TRY(lprobs(l, &q, &probs));
        uint64_t *ids = malloc(8 * (size_t)q.nprompts);
        if (!ids) {
            free(probs);
            return sh_err(SH_ENOMEM, "rl link: out of memory");
        }
        for (int k = 0; k < q.nprompts; k++) ids[k] = probs[k].id;
        free(probs);
        rl_wire_request rq = {.min_version = q.minv, .nprompts = q.nprompts, .group = l->group,
                              .group0 = q.group0, .seed = l->seed, .exact = q.exact};
        int rc = rl__msg_append(&l->w[best].out, RL_MSG_REQUEST, &rq, sizeof rq, ids, 8 * (size_t)q.nprompts);
        free(ids);
        SH_TRY(rc);
        l->w[best].req[l->w[best].busy++] = q;
        memmove(l->pending, l->pending + 1, sizeof(lreq) * (size_t)--l->npending);
    }
    return 0;
}

/* One round of the event loop, waiting up to timeout_s for news. */
static int lpoll_once(rl_link *l, double timeout_s)
{
    SH_TRY(ldispatch(l));
    struct pollfd pf[RL_MAX_WORKERS + 1];
    int idx[RL_MAX_WORKERS + 1], n = 0;
    for (int i = 0; i < RL_MAX_WORKERS; i++) {
        if (!l->w[i].alive) continue;
        pf[n] = (struct pollfd){.fd = l->w[i].fd, .events = POLLIN | (l->w[i].out.len ? POLLOUT : 0)};
        idx[n++] = i;
    }
    pf[n] = (struct pollfd){.fd = l->fd, .events = POLLIN};
    int ms = timeout_s <= 0 ? 0 : timeout_s > 3600 ? 3600000 : (int)(timeout_s * 1000 + 0.5);
    if (poll(pf, (nfds_t)n + 1, ms) < 0 && errno != EINTR) return sh_err_errno(errno, "rl link: poll");
    if (pf[n].revents & POLLIN) laccept(l);
    double now = sh_now_mono();
    for (int k = 0; k < n; k++) {
        int i = idx[k], dead = 0;
        lwk *w = &l->w[i];
        if (!w->hello && now - w->joined > RL_HELLO_S) {
            sh_log(SH_LOG_WARN, "rl link: closing connection %d: no HELLO within %d s", i, RL_HELLO_S);
            lworker_dead(l, i);
            continue;
        }
        if (pf[k].revents & POLLOUT) dead = lflush(w);
        if (!dead && (pf[k].revents & (POLLIN | POLLHUP | POLLERR))) {
            int rc = lread(l, i);
            if (rc < 0 && rc != SH_EFORMAT && rc != SH_EPERM) return rc;
            if (rc < 0) lviolated(l, i);
            dead = rc != 0;
        }
        if (dead) lworker_dead(l, i);
    }
    return ldispatch(l);
}

int rl_link_poll(rl_link *l, double timeout_s, void *out, int cap)
{
    if (!l->trainer) return sh_err(SH_EINVAL, "rl link: poll is the trainer's");
    if (cap < l->group) return sh_err(SH_EINVAL, "rl link: room for %d trajectories, less than a group of %d", cap, l->group);
    double deadline = sh_now_mono() + timeout_s;
    for (;;) {
        if (l->nready) {
            int n = l->nready < cap ? l->nready : cap;
            n -= n % l->group; /* whole groups */
            memcpy(out, l->ready, sizeof(rl_traj) * (size_t)n);
            memmove(l->ready, l->ready + n, sizeof(rl_traj) * (size_t)(l->nready - n));
            l->nready -= n;
            return n;
        }
        double left = deadline - sh_now_mono();
        SH_TRY(lpoll_once(l, left < 0 ? 0 : left > 0.2 ? 0.2 : left));
        if (!l->nready && sh_now_mono() >= deadline) return 0;
    }
}

int rl_link_workers(const rl_link *l)
{
    int n = 0;
    for (int i = 0; i < RL_MAX_WORKERS; i++) n += l->w[i].alive && l->w[i].hello;
    return n;
}

int rl_link_stop(rl_link *l, int final_version, double drain_s)
{
    if (!l->trainer) return sh_err(SH_EINVAL, "rl link: stop is the trainer's");
    if (final_version > l->version) SH_TRY(rl_link_set_version(l, final_version));
    l->npending = 0;
    for (int i = 0; i < RL_MAX_WORKERS; i++) {
        lwk *w = &l->w[i];
        if (!w->alive) continue;
        if (!w->hello) {
            lworker_dead(l, i);
            continue;
        }
        int32_t v = l->version;
        w->stopped = 1;
        SH_TRY(rl__msg_append(&w->out, RL_MSG_STOP, &v, sizeof v, NULL, 0));
    }
    double deadline = sh_now_mono() + drain_s;
    while (rl_link_workers(l) && sh_now_mono() < deadline) {
        int bye = 1;
        for (int i = 0; i < RL_MAX_WORKERS; i++) bye &= !l->w[i].alive || l->w[i].bye;
        if (bye) break;
        SH_TRY(lpoll_once(l, 0.1));
    }
    l->nready = 0; /* answers that came while stopping are not trained on */
    for (int i = 0; i < RL_MAX_WORKERS; i++)
        if (l->w[i].alive) {
            l->w[i].busy = 0; /* not lost: the run is over */
            lworker_dead(l, i);
        }
    return 0;
}

int rl_link_stats_json(const rl_link *l, char **out)
{
    json_t *ws = json_array(), *g;
    size_t k;
    json_array_foreach(l->gone, k, g) json_array_append(ws, g);
    for (int i = 0; i < RL_MAX_WORKERS; i++)
        if (l->w[i].alive && l->w[i].hello) json_array_append_new(ws, worker_entry(&l->w[i]));
    int nh = 0;
    for (int i = 0; i < 65; i++)
        if (l->stale_hist[i]) nh = i + 1;
    json_t *h = json_array();
    for (int i = 0; i < nh; i++) json_array_append_new(h, json_integer(l->stale_hist[i]));
    json_t *o = json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:i,s:i}", "version", l->version,
                          "trajectories", (json_int_t)l->trajs, "dropped_stale", (json_int_t)l->dropped_stale,
                          "dropped_dead", (json_int_t)l->dropped_dead, "refused_requests", (json_int_t)l->refused,
                          "workers_dropped_for_violations", (json_int_t)l->violations, "worker_deaths",
                          (json_int_t)l->deaths, "worker_joins", (json_int_t)l->joins, "workers_refused",
                          (json_int_t)l->refused_hellos, "staleness_hist", h, "workers", ws, "pending",
                          l->npending, "live_workers", rl_link_workers(l));
    if (!o) return sh_err(SH_ENOMEM, "rl link: out of memory");
    json_object_set(o, "refused_exact", l->refused_exact ? l->refused_exact : json_null());
    *out = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return *out ? 0 : sh_err(SH_ENOMEM, "rl link: out of memory");
}

void rl_link_close(rl_link *l)
{
    if (!l) return;
    if (l->trainer)
        for (int i = 0; i < RL_MAX_WORKERS; i++) {
            if (l->w[i].alive) close(l->w[i].fd);
            sh_buf_free(&l->w[i].in), sh_buf_free(&l->w[i].out);
        }
    if (l->fd >= 0) close(l->fd);
    json_decref(l->gone), json_decref(l->refused_exact);
    free(l->ready);
    ckpt_close(l->ck);
    sh_buf_free(&l->img), sh_buf_free(&l->msg);
    free(l);
}

/* ======================= a worker's end ================================ */

int rl_link_connect(const char *hostport, const char *secret_hex, const char *name, int push, rl_link **out)
{
    *out = NULL;
    struct sockaddr_in sa;
    SH_TRY(net_addr_parse(hostport, "rl link: the trainer's address", &sa));
    rl_wire_hello h = {.speed = 1, .price = 0, .pid = (int32_t)getpid(), .flags = push ? RL_HELLO_PUSH : 0};
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl >= sizeof h.name)
        return sh_err(SH_EINVAL, "rl link: worker name \"%s\": 1..%zu characters", name ? name : "", sizeof h.name - 1);
    for (size_t i = 0; i < nl; i++)
        if (name[i] < 0x21 || name[i] > 0x7e)
            return sh_err(SH_EINVAL, "rl link: worker name \"%s\": printable ASCII without spaces only", name);
    memcpy(h.name, name, nl);
    rl_link *l = calloc(1, sizeof *l);
    if (!l) return sh_err(SH_ENOMEM, "rl link: out of memory");
    l->fd = -1, l->wversion = -1;
    int rc = parse_secret(secret_hex, &l->secret, &l->has_secret);
    net_hello hs;
    if (!rc && l->has_secret) rc = net_hello_make(l->secret, "rl worker", "rl trainer", &hs);
    if (!rc && l->has_secret) h.nonce = hs.nonce, h.proof = hs.proof, l->expect = hs.expect;
    l->proven = !l->has_secret;
    if (!rc) {
        l->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (l->fd < 0) rc = sh_err_errno(errno, "rl link: socket");
        else if (connect(l->fd, (struct sockaddr *)&sa, sizeof sa) < 0)
            rc = sh_err_errno(errno, "rl link: connect to the trainer at %s", hostport);
    }
    signal(SIGPIPE, SIG_IGN);
    if (!rc) rc = rl__msg_write(l->fd, RL_MSG_HELLO, &h, sizeof h, NULL, 0);
    if (rc) {
        rl_link_close(l);
        return rc;
    }
    snprintf(l->addr, sizeof l->addr, "%s", hostport);
    *out = l;
    return 0;
}

/* Direct transport: a WEIGHTS image or delta, applied to img. */
static int lweights(rl_link *l, int64_t *info)
{
    rl_wire_weights hd;
    const uint8_t *p = l->msg.data;
    if (l->msg.len < sizeof hd) return sh_err(SH_EFORMAT, "rl link: short WEIGHTS message");
    memcpy(&hd, p, sizeof hd);
    if (l->msg.len != sizeof hd + hd.nbytes) return sh_err(SH_EFORMAT, "rl link: WEIGHTS sizes do not add up");
    p += sizeof hd;
    sh_buf img = {0};
    int rc = 0;
    if (hd.encoding == RL_ENC_IMAGE) {
        rc = sh_buf_append(&img, p, hd.nbytes);
    } else if (hd.encoding == RL_ENC_DELTA) {
        if (!l->ck || hd.base_version != l->wversion)
            return sh_err(SH_EMISMATCH, "rl link: delta %d -> %d does not apply to version %d", hd.base_version,
                          hd.version, l->wversion);
        delta *d;
        SH_TRY(delta_parse(p, hd.nbytes, 0, &d));
        delta_opts o = {.threads = 1};
        size_t size = (size_t)delta_target_size(d), got = 0;
        rc = sh_buf_reserve(&img, size + 1);
        if (!rc) rc = delta_apply_mem(l->ck, d, &o, img.data, size, &got);
        delta_free(d);
        img.len = got;
    } else {
        return sh_err(SH_EFORMAT, "rl link: unknown WEIGHTS encoding %u", hd.encoding);
    }
    ckpt *ck = NULL;
    if (!rc) rc = ckpt_open_mem(img.data, img.len, "weights", &ck);
    if (rc) {
        sh_buf_free(&img);
        return rc;
    }
    ckpt_close(l->ck);
    sh_buf_free(&l->img);
    l->img = img, l->ck = ck, l->wversion = hd.version;
    info[0] = hd.version;
    return 0;
}

int rl_link_next(rl_link *l, double timeout_s, int64_t *info, int cap)
{
    if (l->trainer) return sh_err(SH_EINVAL, "rl link: next is a worker's");
    if (cap < 8) return sh_err(SH_EINVAL, "rl link: info has room for %d values, fewer than 8", cap);
    for (;;) {
        struct pollfd pf = {.fd = l->fd, .events = POLLIN};
        int ms = timeout_s <= 0 ? 0 : timeout_s > 3600 ? 3600000 : (int)(timeout_s * 1000 + 0.5);
        int pr = poll(&pf, 1, ms);
        if (pr < 0 && errno != EINTR) return sh_err_errno(errno, "rl link: poll");
        if (pr <= 0) return 0;
        uint32_t type;
        int rc = rl__msg_read(l->fd, &type, &l->msg);
        if (rc == SH_ENOENT && !l->proven)
            return sh_err(SH_EPERM, "rl link: the trainer at %s hung up before proving this run's secret (is "
                                    "SHOAL_RUN_SECRET this run's?)", l->addr);
        if (rc == SH_ENOENT) return sh_err(SH_ENOENT, "rl link: the trainer at %s hung up", l->addr);
        SH_TRY(rc);
        if (type == RL_MSG_WELCOME && !l->proven) {
            sh_hash128 pr2;
            if (l->msg.len != sizeof pr2 || (memcpy(&pr2, l->msg.data, sizeof pr2), !net_secret_eq(pr2, l->expect)))
                return sh_err(SH_EPERM, "rl link: the trainer at %s did not prove this run's secret", l->addr);
            l->proven = 1;
            continue;
        }
        if (!l->proven)
            return sh_err(SH_EPERM, "rl link: the trainer at %s sent message %u before proving this run's secret",
                          l->addr, type);
        if (type == RL_MSG_STOP) {
            int32_t v = -1;
            if (l->msg.len == sizeof v) memcpy(&v, l->msg.data, sizeof v);
            info[0] = v;
            return RL_MSG_STOP;
        }
        if (type == RL_MSG_WEIGHTS) {
            SH_TRY(lweights(l, info));
            return RL_MSG_WEIGHTS;
        }
        if (type != RL_MSG_REQUEST) return sh_err(SH_EFORMAT, "rl link: unexpected message type %u", type);
        rl_wire_request rq;
        if (l->msg.len < sizeof rq) return sh_err(SH_EFORMAT, "rl link: short REQUEST");
        memcpy(&rq, l->msg.data, sizeof rq);
        if (rq.nprompts < 1 || rq.group < 1 || (rq.exact != 0 && rq.exact != 1) || rq.reserved ||
            l->msg.len != sizeof rq + (size_t)rq.nprompts * 8)
            return sh_err(SH_EFORMAT, "rl link: REQUEST sizes do not add up");
        if (cap < 8 + rq.nprompts)
            return sh_err(SH_EINVAL, "rl link: a REQUEST of %d prompts needs room for %d values, info has %d",
                          rq.nprompts, 8 + rq.nprompts, cap);
        if (l->nwq == (int)(sizeof l->wq / sizeof l->wq[0]))
            return sh_err(SH_ENOSPC, "rl link: %d requests unanswered", l->nwq);
        l->wq[l->nwq++] = (lreq){rq.group0, rq.nprompts, rq.min_version, rq.exact};
        l->group = rq.group;
        info[0] = rq.min_version, info[1] = rq.exact, info[2] = rq.nprompts, info[3] = rq.group;
        info[4] = rq.group0, info[5] = (int64_t)rq.seed, info[6] = info[7] = 0;
        memcpy(info + 8, l->msg.data + sizeof rq, 8 * (size_t)rq.nprompts);
        return RL_MSG_REQUEST;
    }
}

int rl_link_send(rl_link *l, const void *trajs, int n)
{
    if (l->trainer) return sh_err(SH_EINVAL, "rl link: send is a worker's");
    if (!l->nwq) return sh_err(SH_EINVAL, "rl link: no request to answer");
    if (n != l->wq[0].nprompts * l->group)
        return sh_err(SH_EINVAL, "rl link: %d trajectories, but the oldest request asks for %d (%d prompts x %d)", n,
                      l->wq[0].nprompts * l->group, l->wq[0].nprompts, l->group);
    rl_wire_trajs th = {.worker = 0, .count = n};
    SH_TRY(rl__msg_write(l->fd, RL_MSG_TRAJS, &th, sizeof th, trajs, sizeof(rl_traj) * (size_t)n));
    memmove(l->wq, l->wq + 1, sizeof(lreq) * (size_t)--l->nwq);
    return 0;
}

int rl_link_refuse(rl_link *l, int version)
{
    if (l->trainer) return sh_err(SH_EINVAL, "rl link: refuse is a worker's");
    if (!l->nwq) return sh_err(SH_EINVAL, "rl link: no request to refuse");
    rl_wire_refuse f = {version, l->wq[0].minv, l->wq[0].group0, l->wq[0].nprompts};
    SH_TRY(rl__msg_write(l->fd, RL_MSG_REFUSE, &f, sizeof f, NULL, 0));
    memmove(l->wq, l->wq + 1, sizeof(lreq) * (size_t)--l->nwq);
    return 0;
}

int rl_link_bye(rl_link *l, int version, const void *image, size_t len)
{
    if (l->trainer) return sh_err(SH_EINVAL, "rl link: bye is a worker's");
    if (!image) image = l->img.data, len = l->img.len;
    sh_hash128 h = sh_hash128_of(image, len);
    rl_wire_bye b = {.version = version, .hash_lo = h.lo, .hash_hi = h.hi};
    return rl__msg_write(l->fd, RL_MSG_BYE, &b, sizeof b, NULL, 0);
}

int rl_link_image(const rl_link *l, const void **data, size_t *len)
{
    *data = l->img.data, *len = l->img.len;
    return l->wversion;
}

/* ======================= the task, for programs outside ================= */

const char *rl_alphabet(void) { return RL_ALPHABET; }

int rl_task_prompt(int task, uint64_t id, char *buf, size_t cap)
{
    if (task != RL_TASK_CODE && task != RL_TASK_ARITH) return sh_err(SH_EINVAL, "rl: task %d is not a task", task);
    rl_problem p;
    int held = 0;
    rl_problem_make(task, id, &p, &held);
    if (strlen(p.prompt) >= cap) return sh_err(SH_ERANGE, "rl: prompt of %zu characters, room for %zu", strlen(p.prompt), cap);
    memcpy(buf, p.prompt, strlen(p.prompt) + 1);
    return held;
}

int rl_task_answer(int task, uint64_t id, char *buf, size_t cap)
{
    if (task != RL_TASK_CODE && task != RL_TASK_ARITH) return sh_err(SH_EINVAL, "rl: task %d is not a task", task);
    rl_problem p;
    rl_problem_make(task, id, &p, NULL);
    if (strlen(p.answer) >= cap) return sh_err(SH_ERANGE, "rl: answer of %zu characters, room for %zu", strlen(p.answer), cap);
    memcpy(buf, p.answer, strlen(p.answer) + 1);
    return 0;
}

uint64_t rl_task_draw(int task, int held_out, uint64_t *rng)
{
    rl_problem p;
    rl_problem_draw(task, held_out, rng, &p);
    return p.id;
}

int rl_task_eval_ids(int task, int n, uint64_t *ids)
{
    if (n < 1 || n > 4096) return sh_err(SH_EINVAL, "rl: %d evaluation problems: expected 1..4096", n);
    rl_problem *p = malloc(sizeof *p * (size_t)n);
    if (!p) return sh_err(SH_ENOMEM, "rl: out of memory");
    rl_eval_set(task, n, p);
    for (int i = 0; i < n; i++) ids[i] = p[i].id;
    free(p);
    return 0;
}

int rl_task_reward(int task, uint64_t id, const int32_t *resp, int n, float *reward)
{
    if (task != RL_TASK_CODE && task != RL_TASK_ARITH) return sh_err(SH_EINVAL, "rl: task %d is not a task", task);
    if (n < 0 || n > RL_MAX_T) return sh_err(SH_EINVAL, "rl: a response of %d tokens: at most %d", n, RL_MAX_T);
    rl_problem p;
    rl_problem_make(task, id, &p, NULL);
    char s[RL_MAX_T];
    int k = 0, term = 0;
    for (int j = 0; j < n && !term; j++) {
        if (resp[j] < 0 || resp[j] >= rl_vocab())
            return sh_err(SH_EINVAL, "rl: response token %d is %d, not in the alphabet of %d", j, (int)resp[j], rl_vocab());
        if (resp[j] == RL_EOS) term = 1;
        else s[k++] = rl_chr(resp[j]);
    }
    *reward = rl_reward(&p, s, k, term);
    return 0;
}

size_t rl_traj_sizeof(void) { return sizeof(rl_traj); }
