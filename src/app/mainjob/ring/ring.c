/* A ring all-reduce over UCX (tag matching) between the ranks of the
 * trainer gang.
 *
 * Rank r listens on base_port + r and opens one endpoint to rank r + 1
 * (mod world).  It sends only to the next rank and receives only from the
 * previous one; receives are posted on the worker with a tag that names the
 * operation number, phase and step, so a fast rank's early message waits in
 * UCX's unexpected queue instead of being taken for another step's.
 *
 * The endpoint is connected before the next rank may be listening (ranks
 * start in any order), so the first send is retried on a fresh endpoint
 * until the deadline.
 *
 * Receives match on the worker, not on an endpoint, so anyone who can
 * connect could send a message with the tag of a coming step (another
 * tenant's rank, over the shared host network).  With SHOAL_RUN_SECRET
 * every tag is xored with a key from it: a message from a process without
 * the secret never matches and is never summed into the gradients. */
#include <arpa/inet.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>

#include "ring_int.h"
#include "shoal/net.h"

struct mj_ring {
    int rank, world;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    ucp_ep_h next;
    /* Endpoints made for the previous rank's connections: a retried connect
     * may arrive twice, and every one is kept (receives are matched on the
     * worker, whichever endpoint they came in on). */
    ucp_ep_h prev[8];
    int nprev;
    double timeout_s;
    uint64_t op, bytes_sent;
    float *scratch;
    size_t scratch_n;
    int efd; /* the worker's event fd: a rank waiting for its neighbour sleeps on it */
    uint64_t tag_key; /* from SHOAL_RUN_SECRET (0 without): xored into every tag */
};

typedef struct req_state {
    int done;
    ucs_status_t status;
    size_t length;
    ucp_tag_recv_info_t info; /* filled when a receive completes at once */
} req_state;

/* Tags: 16 bits of phase/step, the rest the operation counter. */
enum { PH_HELLO = 1, PH_RS = 2, PH_AG = 3, PH_BC = 4, PH_BCLEN = 5 };
static ucp_tag_t tag_of(const mj_ring *r, uint64_t op, int phase, int step)
{
    return ((op << 16) | ((uint64_t)phase << 12) | (uint64_t)(step & 0xfff)) ^ r->tag_key;
}

static void send_cb(void *req, ucs_status_t st, void *user)
{
    req_state *s = user;
    s->done = 1, s->status = st;
}

static void recv_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user)
{
    req_state *s = user;
    s->done = 1, s->status = st;
    if (st == UCS_OK) s->length = info->length;
}

/* Drives the worker until the request completes or the deadline passes. */
static int wait_req(mj_ring *r, ucs_status_ptr_t p, req_state *s, const char *what)
{
    if (p == NULL) return 0;
    if (UCS_PTR_IS_ERR(p))
        return sh_err(SH_EIO, "ring rank %d: %s: %s", r->rank, what, ucs_status_string(UCS_PTR_STATUS(p)));
    double deadline = sh_now_mono() + r->timeout_s;
    while (!s->done) {
        if (ucp_worker_progress(r->worker)) continue;
        /* Nothing to do: sleep until the worker has news rather than spin
         * (a trainer rank waiting for its neighbour, a receiver between
         * messages).  Capped at a millisecond: over TCP, UCX may need a
         * progress call that its event fd does not announce. */
        if (r->efd >= 0 && ucp_worker_arm(r->worker) == UCS_OK) {
            struct pollfd pf = {.fd = r->efd, .events = POLLIN};
            poll(&pf, 1, 1);
        }
        if (sh_now_mono() > deadline) {
            ucp_request_cancel(r->worker, p);
            while (!s->done) ucp_worker_progress(r->worker);
            ucp_request_free(p);
            return sh_err(SH_ETIMEDOUT, "ring rank %d: %s: no answer within %.0f s (is every rank of the gang running?)",
                          r->rank, what, r->timeout_s);
        }
    }
    ucp_request_free(p);
    if (s->status != UCS_OK)
        return sh_err(SH_EIO, "ring rank %d: %s: %s", r->rank, what, ucs_status_string(s->status));
    return 0;
}

static int ring_send(mj_ring *r, const void *buf, size_t len, ucp_tag_t tag, const char *what)
{
    req_state s = {0};
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = send_cb, .user_data = &s};
    SH_TRY(wait_req(r, ucp_tag_send_nbx(r->next, buf, len, tag, &prm), &s, what));
    r->bytes_sent += len;
    return 0;
}

/* Posts a receive; the caller waits for it with wait_req. */
static ucs_status_ptr_t post_recv(mj_ring *r, void *buf, size_t len, ucp_tag_t tag, req_state *s)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_RECV_INFO,
                               .cb.recv = recv_cb, .user_data = s,
                               .recv_info.tag_info = &s->info};
    s->info.length = len;
    ucs_status_ptr_t p = ucp_tag_recv_nbx(r->worker, buf, len, tag, (ucp_tag_t)-1, &prm);
    if (p == NULL) s->done = 1, s->status = UCS_OK, s->length = s->info.length;
    return p;
}

static int ring_recv(mj_ring *r, void *buf, size_t len, ucp_tag_t tag, const char *what)
{
    req_state s = {0};
    SH_TRY(wait_req(r, post_recv(r, buf, len, tag, &s), &s, what));
    if (s.length != len)
        return sh_err(SH_EFORMAT, "ring rank %d: %s: got %zu bytes, expected %zu", r->rank, what,
                      s.length, len);
    return 0;
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st) { (void)arg, (void)ep, (void)st; }

static void conn_cb(ucp_conn_request_h req, void *arg)
{
    mj_ring *r = arg;
    if (r->nprev == 8) {
        ucp_listener_reject(r->listener, req);
        return;
    }
    if (net_ucx_accept(&(net_ucx){.worker = r->worker}, req, ep_err_cb, r, &r->prev[r->nprev]) == 0) r->nprev++;
}

/* Closes an endpoint, flushing what was sent on it first (a completed
 * eager send only means the buffer is free: a forced close right after it
 * could drop the message).  Forced after 5 s, for a peer that is gone. */
static void close_ep(mj_ring *r, ucp_ep_h ep, int force)
{
    if (!ep) return;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    ucs_status_ptr_t p = ucp_ep_close_nbx(ep, &prm);
    double deadline = sh_now_mono() + 5;
    if (p && !UCS_PTR_IS_ERR(p)) {
        while (ucp_request_check_status(p) == UCS_INPROGRESS && sh_now_mono() < deadline)
            ucp_worker_progress(r->worker);
        if (ucp_request_check_status(p) == UCS_INPROGRESS) {
            ucp_request_cancel(r->worker, p);
            while (ucp_request_check_status(p) == UCS_INPROGRESS) ucp_worker_progress(r->worker);
        }
        ucp_request_free(p);
    }
}

/* Listens on host:port (0: an ephemeral port); *port_out gets the port. */
static int start(mj_ring *r, const char *host, int port, int *port_out)
{
    char who[48], want[96];
    snprintf(who, sizeof who, "ring rank %d", r->rank);
    snprintf(want, sizeof want, "%s:%d", host, port);
    struct sockaddr_in sa;
    SH_TRY(net_addr_parse(want, "ring address (MASTER_ADDR:port)", &sa));
    net_ucx u;
    SH_TRY(net_ucx_open(&u, who, UCP_FEATURE_TAG));
    r->ctx = u.ctx, r->worker = u.worker, r->efd = u.efd; /* efd -1: then it spins */
    SH_TRY(net_ucx_listen(&u, who, want, conn_cb, r));
    r->listener = u.listener;
    *port_out = atoi(strrchr(u.addr, ':') + 1);
    return 0;
}

/* Rendezvous through a shared folder: rank r writes its port to
 * dir/rank-<r> (atomically) and reads the next rank's, waiting for it. */
static int rendezvous(mj_ring *r, const char *dir, int port, int *next_port)
{
    char path[4096], buf[32];
    SH_TRY(sh_mkdir_p(dir, 0755));
    snprintf(path, sizeof path, "%s/rank-%d", dir, r->rank);
    int n = snprintf(buf, sizeof buf, "%d\n", port);
    SH_TRY(sh_write_atomic(path, buf, (size_t)n));
    snprintf(path, sizeof path, "%s/rank-%d", dir, (r->rank + 1) % r->world);
    double deadline = sh_now_mono() + r->timeout_s;
    while (!sh_path_exists(path)) {
        if (sh_now_mono() > deadline)
            return sh_err(SH_ETIMEDOUT, "ring rank %d: %s did not appear within %.0f s (is every rank running?)",
                          r->rank, path, r->timeout_s);
        sh_sleep(0.05);
    }
    char *text;
    size_t len;
    SH_TRY(sh_read_file(path, 64, &text, &len));
    int64_t v;
    text[strcspn(text, "\n")] = 0;
    int rc = sh_parse_i64(text, &v, path);
    free(text);
    if (rc == 0 && (v < 1 || v > 65535)) rc = sh_err(SH_EFORMAT, "%s: port %lld", path, (long long)v);
    if (rc == 0) *next_port = (int)v;
    return rc;
}

/* Connects to the next rank: a HELLO that fails (nobody listening yet) is
 * retried on a new endpoint every 100 ms until the deadline. */
static int connect_next(mj_ring *r, const char *host, int port)
{
    int nrank = (r->rank + 1) % r->world;
    char who[48], peer[96];
    snprintf(who, sizeof who, "ring rank %d", r->rank);
    snprintf(peer, sizeof peer, "%s:%d", host, port);
    double deadline = sh_now_mono() + r->timeout_s, keep = r->timeout_s;
    int32_t me = r->rank;
    for (;;) {
        if (net_ucx_connect(&(net_ucx){.worker = r->worker}, who, peer, ep_err_cb, r, &r->next) < 0) r->next = NULL;
        r->timeout_s = 5;
        int rc = r->next ? ring_send(r, &me, sizeof me, tag_of(r, 0, PH_HELLO, 0), "hello") : SH_EIO;
        r->timeout_s = keep;
        if (rc == 0) return 0;
        close_ep(r, r->next, 1);
        r->next = NULL;
        if (sh_now_mono() > deadline)
            return sh_err(SH_ETIMEDOUT, "ring rank %d: rank %d at %s:%d did not answer within %.0f s",
                          r->rank, nrank, host, port, r->timeout_s);
        sh_sleep(0.1);
    }
}

int mj_ring_new(int rank, int world, const char *host, int base_port, const char *rdv_dir, double timeout_s,
                mj_ring **out)
{
    if (world < 1 || rank < 0 || rank >= world)
        return sh_err(SH_EINVAL, "ring: rank %d of %d", rank, world);
    if (!rdv_dir && world > 1 && (base_port < 1 || base_port + world > 65535))
        return sh_err(SH_EINVAL, "ring: base port %d", base_port);
    mj_ring *r = calloc(1, sizeof *r);
    if (!r) return sh_err(SH_ENOMEM, "ring: out of memory");
    r->rank = rank, r->world = world, r->timeout_s = timeout_s > 0 ? timeout_s : 60;
    r->efd = -1;
    r->op = 1;
    sh_hash128 secret;
    int rc = net_run_secret(&secret);
    r->tag_key = rc == 1 ? sh_hash64_of(&secret, sizeof secret) : 0;
    if (rc > 0) rc = 0;
    if (!rc && world > 1) {
        int port = 0, next = (base_port + (rank + 1) % world);
        rc = start(r, host, rdv_dir ? 0 : base_port + rank, &port);
        if (!rc && rdv_dir) rc = rendezvous(r, rdv_dir, port, &next);
        if (!rc) rc = connect_next(r, host, next);
        int32_t who = -1;
        if (!rc) rc = ring_recv(r, &who, sizeof who, tag_of(r, 0, PH_HELLO, 0), "hello from the previous rank");
        if (!rc && who != (rank + world - 1) % world)
            rc = sh_err(SH_EMISMATCH, "ring rank %d: hello from rank %d, expected %d", rank, who,
                        (rank + world - 1) % world);
    }
    if (rc) {
        mj_ring_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void mj_ring_free(mj_ring *r)
{
    if (!r) return;
    if (r->worker) {
        close_ep(r, r->next, 0);
        for (int i = 0; i < r->nprev; i++) close_ep(r, r->prev[i], 0);
    }
    net_ucx_close(&(net_ucx){.ctx = r->ctx, .worker = r->worker, .listener = r->listener});
    free(r->scratch);
    free(r);
}

uint64_t mj_ring_bytes_sent(const mj_ring *r) { return r ? r->bytes_sent : 0; }

/* Segment k of n floats split world ways: [*a, *b). */
static void seg(size_t n, int world, int k, size_t *a, size_t *b)
{
    *a = n * (size_t)k / (size_t)world;
    *b = n * (size_t)(k + 1) / (size_t)world;
}

int mj_ring_allreduce_mean(mj_ring *r, float *x, size_t n)
{
    int W = r->world;
    if (W == 1) return 0;
    size_t maxseg = n / (size_t)W + 1;
    if (r->scratch_n < maxseg) {
        float *s = realloc(r->scratch, sizeof(float) * maxseg);
        if (!s) return sh_err(SH_ENOMEM, "ring: out of memory");
        r->scratch = s, r->scratch_n = maxseg;
    }
    uint64_t op = r->op++;
    /* Reduce-scatter: after W - 1 steps rank r holds the full sum of
     * segment (r + 1) mod W. */
    for (int s = 0; s < W - 1; s++) {
        size_t sa, sb, ra, rb;
        seg(n, W, ((r->rank - s) % W + W) % W, &sa, &sb);
        seg(n, W, ((r->rank - s - 1) % W + W) % W, &ra, &rb);
        req_state rs = {0};
        ucs_status_ptr_t p = post_recv(r, r->scratch, sizeof(float) * (rb - ra), tag_of(r, op, PH_RS, s), &rs);
        SH_TRY(ring_send(r, x + sa, sizeof(float) * (sb - sa), tag_of(r, op, PH_RS, s), "reduce-scatter"));
        SH_TRY(wait_req(r, p, &rs, "reduce-scatter"));
        for (size_t i = ra; i < rb; i++) x[i] += r->scratch[i - ra];
    }
    /* All-gather: pass the summed segments around. */
    for (int s = 0; s < W - 1; s++) {
        size_t sa, sb, ra, rb;
        seg(n, W, ((r->rank + 1 - s) % W + W) % W, &sa, &sb);
        seg(n, W, ((r->rank - s) % W + W) % W, &ra, &rb);
        req_state rs = {0};
        ucs_status_ptr_t p = post_recv(r, x + ra, sizeof(float) * (rb - ra), tag_of(r, op, PH_AG, s), &rs);
        SH_TRY(ring_send(r, x + sa, sizeof(float) * (sb - sa), tag_of(r, op, PH_AG, s), "all-gather"));
        SH_TRY(wait_req(r, p, &rs, "all-gather"));
    }
    float inv = 1.0f / (float)W;
    for (size_t i = 0; i < n; i++) x[i] *= inv;
    return 0;
}

int mj_ring_bcast(mj_ring *r, int root, void **buf, size_t *len)
{
    if (r->world == 1) return 0;
    uint64_t op = r->op++;
    int nxt = (r->rank + 1) % r->world;
    if (r->rank != root) {
        uint64_t n;
        SH_TRY(ring_recv(r, &n, sizeof n, tag_of(r, op, PH_BCLEN, 0), "broadcast length"));
        void *b = malloc(n ? n : 1);
        if (!b) return sh_err(SH_ENOMEM, "ring: broadcast of %llu bytes", (unsigned long long)n);
        int rc = n ? ring_recv(r, b, n, tag_of(r, op, PH_BC, 0), "broadcast") : 0;
        if (rc) {
            free(b);
            return rc;
        }
        *buf = b, *len = n;
    }
    if (nxt == root) return 0;
    uint64_t n = *len;
    SH_TRY(ring_send(r, &n, sizeof n, tag_of(r, op, PH_BCLEN, 0), "broadcast length"));
    return n ? ring_send(r, *buf, n, tag_of(r, op, PH_BC, 0), "broadcast") : 0;
}
