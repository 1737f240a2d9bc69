/* A push node: UCX context, worker, listener, endpoints, and the event loop.
 *
 * Everything runs on the thread that calls bcast_node_run(): UCX callbacks
 * only record what happened (a failed endpoint, a redirect), and the loop
 * acts on it between progress calls, because closing or creating endpoints
 * from inside a UCX callback is not allowed. */
#include <arpa/inet.h>
#include <math.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "weights/push/node_int.h"

/* While transfers are in flight the loop wakes at least this often (see
 * wait_events), backing off to BCAST__INFLIGHT_MAX while wake-ups find
 * nothing to do. */
#ifndef BCAST__INFLIGHT_WAIT
#define BCAST__INFLIGHT_WAIT 0.001
#endif
#ifndef BCAST__INFLIGHT_MAX
#define BCAST__INFLIGHT_MAX 0.016
#endif

typedef struct send_ctx {
    bcast_node *node;
    bcast__peer *peer;
    bcast__obj *pin; /* the object whose bytes are sent, kept until done */
    void *owned;
    uint8_t hdr[BCAST__HELLO_LEN];
} send_ctx;

typedef struct recv_ctx {
    bcast_node *node;
    uint64_t version;
    uint32_t index;
    uint64_t sum;
    void *scratch; /* a duplicate chunk lands here and is dropped */
} recv_ctx;

static void peer_unref(bcast__peer *p)
{
    if (--p->refs == 0) free(p);
}

static void send_done(send_ctx *s, ucs_status_t st)
{
    s->node->inflight--;
    if (s->pin) s->pin->refs--;
    if (s->peer) {
        s->peer->outstanding--;
        peer_unref(s->peer);
    }
    if (st != UCS_OK && st != UCS_ERR_CANCELED)
        sh_debug("push %s: send failed: %s", s->node->name, ucs_status_string(st));
    free(s->owned);
    free(s);
}

static void send_cb(void *req, ucs_status_t st, void *user)
{
    send_done(user, st);
    ucp_request_free(req);
}

int bcast__send(bcast_node *n, ucp_ep_h ep, bcast__peer *p, unsigned id, const void *hdr,
                size_t hlen, const void *data, size_t len, void *owned, bcast__obj *pin)
{
    send_ctx *s = malloc(sizeof *s);
    if (!s) {
        free(owned);
        return sh_err(SH_ENOMEM, "push send");
    }
    /* UCX 1.13 reads the header until the send completes, so it lives here. */
    memcpy(s->hdr, hdr, hlen);
    s->node = n;
    s->peer = p;
    s->owned = owned;
    /* UCX reads data until the send completes (a queued send, or a zero-copy
     * one): its object is not freed meanwhile (bcast__obj_busy). */
    s->pin = pin;
    if (pin) pin->refs++;
    if (p) p->outstanding++, p->refs++;
    n->inflight++;
    ucp_request_param_t prm = {0};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send = send_cb;
    prm.user_data = s;
    prm.flags = UCP_AM_SEND_FLAG_REPLY;
    /* A small chunk goes in one message: by rendezvous it would take three
     * (announce, ready, data), each a wake-up on one side, per hop. */
    if (len <= BCAST__EAGER_MAX) prm.flags |= UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, s->hdr, hlen, data, len, &prm);
    if (r == NULL) {
        send_done(s, UCS_OK);
    } else if (UCS_PTR_IS_ERR(r)) {
        ucs_status_t st = UCS_PTR_STATUS(r);
        send_done(s, st);
        return sh_err(SH_EIO, "push %s: send: %s", n->name, ucs_status_string(st));
    }
    return SH_OK;
}

static void close_ep(bcast_node *n, ucp_ep_h ep)
{
    ucp_request_param_t prm = {0};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void *r = ucp_ep_close_nbx(ep, &prm);
    if (r == NULL || UCS_PTR_IS_ERR(r)) return;
    if (n->nclosing == n->capclosing) {
        int cap = n->capclosing ? 2 * n->capclosing : 16;
        void **c = realloc(n->closing, cap * sizeof *c);
        if (!c) return; /* leaks one request rather than failing the loop */
        n->closing = c;
        n->capclosing = cap;
    }
    n->closing[n->nclosing++] = r;
}

static void reap_closing(bcast_node *n)
{
    int k = 0;
    for (int i = 0; i < n->nclosing; i++) {
        if (ucp_request_check_status(n->closing[i]) == UCS_INPROGRESS) n->closing[k++] = n->closing[i];
        else ucp_request_free(n->closing[i]);
    }
    n->nclosing = k;
}

/* ---- Addresses ------------------------------------------------------- */

static int parse_addr(const char *addr, struct sockaddr_in *sa) { return net_addr_parse(addr, "push address", sa); }

static const char *current_parent(const bcast_node *n)
{
    if (n->nstack > 0) return n->stack[n->nstack - 1];
    return n->cfg.parents[n->base_idx % n->cfg.nparents];
}

/* ---- Parent side ------------------------------------------------------- */

static void parent_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    bcast_node *n = arg;
    if (ep == n->parent_ep) {
        n->parent_failed = 1;
        snprintf(n->failed_parent, sizeof n->failed_parent, "%s", current_parent(n));
        n->failed_status = ucs_status_string(st);
    }
    sh_debug("push %s: parent endpoint failed: %s", n->name, ucs_status_string(st));
}

static void fill_resume(bcast_node *n, bcast__hello *h)
{
    for (bcast__obj *o = n->objs; o; o = o->next) {
        if (o->version <= n->have || o->complete) continue;
        uint32_t k = 0;
        while (k < o->nchunks && o->verified[k]) k++;
        h->resume_version = o->version;
        h->resume_next = k;
        h->resume_hash = o->hash;
        return;
    }
}

static int parent_connect(bcast_node *n)
{
    const char *addr = current_parent(n);
    char who[128];
    snprintf(who, sizeof who, "push %s", n->name);
    SH_TRY(net_ucx_connect(&(net_ucx){.worker = n->worker}, who, addr, parent_err_cb, n, &n->parent_ep));
    bcast__hello h = {0};
    if (n->has_secret) {
        net_hello hs;
        SH_TRY(net_hello_make(n->secret, "push child", "push parent", &hs));
        n->nonce = h.nonce = hs.nonce;
        h.proof = hs.proof;
    }
    n->parent_proven = !n->has_secret;
    n->parent_since = sh_now_mono();
    h.flags = (n->cfg.accept_children ? BCAST__HELLO_ACCEPTS : 0) | BCAST__HELLO_ANNOUNCE;
    h.have = n->have;
    fill_resume(n, &h);
    snprintf(h.name, sizeof h.name, "%s", n->name);
    snprintf(h.zone, sizeof h.zone, "%s", n->zone);
    snprintf(h.addr, sizeof h.addr, "%s", n->cfg.accept_children ? n->addr : "");
    uint8_t buf[BCAST__HELLO_LEN];
    bcast__pack_hello(&h, buf);
    snprintf(n->fed_by, sizeof n->fed_by, "%s", addr);
    sh_info("push %s: attaching to %s (have v%llu)", n->name, addr, (unsigned long long)n->have);
    return bcast__send(n, n->parent_ep, NULL, BCAST__AM_HELLO, buf, sizeof buf, NULL, 0, NULL, NULL);
}

/* Acts on a failed parent or a redirect: a redirect is pushed on the address
 * stack; a failure pops the dead address, so the node goes back to whoever
 * sent it there (its grandparent), or on to the next configured parent. */
static void parent_events(bcast_node *n, double now)
{
    if (n->redirect_to[0]) {
        if (n->parent_ep) close_ep(n, n->parent_ep);
        n->parent_ep = NULL;
        n->parent_failed = 0;
        if (n->nstack == BCAST__STACK) n->nstack = 0;
        snprintf(n->stack[n->nstack++], BCAST__ADDR, "%s", n->redirect_to);
        n->redirect_to[0] = 0;
        n->stats.redirects++;
        n->reconnect_at = now;
    }
    int unproven = 0;
    if (n->parent_ep && !n->parent_proven && now > n->parent_since + BCAST__PROOF_WAIT) {
        sh_warn("push %s: parent %s sent no proof of this run's secret within %.0f s (SHOAL_RUN_SECRET);"
                " leaving it", n->name, current_parent(n), BCAST__PROOF_WAIT);
        n->stats.parents_refused++;
        n->parent_failed = unproven = 1;
    } else if (n->parent_failed && n->parent_ep && !n->parent_proven) {
        /* Refused us, most likely: another secret.  Said once per parent. */
        if (strcmp(n->unproven_warned, current_parent(n)))
            sh_warn("push %s: parent %s went away before it proved this run's secret (is its"
                    " SHOAL_RUN_SECRET this one?)", n->name, current_parent(n));
        snprintf(n->unproven_warned, sizeof n->unproven_warned, "%s", current_parent(n));
        unproven = 1;
    }
    if (n->parent_failed) {
        /* Said once per parent, so that a replica whose parent cannot be
         * reached does not wait in silence; the retries go on. */
        if (!unproven && strcmp(n->lost_warned, current_parent(n)))
            sh_warn("push %s: parent %s failed (%s); retrying", n->name, current_parent(n),
                    n->failed_status && !strcmp(n->failed_parent, current_parent(n)) ? n->failed_status
                                                                                   : "connection lost");
        if (!unproven) snprintf(n->lost_warned, sizeof n->lost_warned, "%s", current_parent(n));
        if (n->parent_ep) close_ep(n, n->parent_ep);
        n->parent_ep = NULL;
        n->parent_failed = 0;
        if (n->nstack > 0) n->nstack--;
        else n->base_idx++;
        n->stats.reattaches++;
        n->reconnect_at = now + (unproven ? 1.0 : 0.05); /* not a busy loop against a stranger */
        sh_info("push %s: parent lost; next try %s", n->name, current_parent(n));
    }
    if (!n->parent_ep && n->cfg.nparents > 0 && now >= n->reconnect_at) {
        if (parent_connect(n) < 0) {
            sh_warn("%s", sh_errmsg());
            if (n->parent_ep) close_ep(n, n->parent_ep);
            n->parent_ep = NULL;
            n->parent_failed = 0;
            n->reconnect_at = now + 0.2;
        }
    }
}

/* ---- Child side (this node as a parent) --------------------------------- */

static void child_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    bcast__peer *p = arg;
    p->dead = 1;
}

static void conn_cb(ucp_conn_request_h req, void *arg)
{
    bcast_node *n = arg;
    bcast__peer *p = calloc(1, sizeof *p);
    if (!p) {
        ucp_listener_reject(n->listener, req);
        return;
    }
    p->node = n;
    p->refs = 1;
    if (net_ucx_accept(&(net_ucx){.worker = n->worker}, req, child_err_cb, p, &p->ep) < 0) {
        free(p);
        return;
    }
    p->next_peer = n->children;
    n->children = p;
}

static bcast__peer *peer_of(bcast_node *n, const ucp_am_recv_param_t *prm)
{
    if (!(prm->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return NULL;
    for (bcast__peer *p = n->children; p; p = p->next_peer)
        if (p->ep == prm->reply_ep && !p->dead) return p;
    return NULL;
}

static void reap_children(bcast_node *n)
{
    bcast__peer **pp = &n->children;
    while (*pp) {
        bcast__peer *p = *pp;
        if (!p->dead) {
            pp = &p->next_peer;
            continue;
        }
        *pp = p->next_peer;
        if (p->cur) p->cur->refs--;
        p->cur = NULL;
        sh_info("push %s: child %s left", n->name, p->name[0] ? p->name : "(no hello)");
        close_ep(n, p->ep);
        peer_unref(p);
    }
}

void bcast__redirect(bcast_node *n, bcast__peer *p, bcast__peer *to)
{
    uint8_t buf[BCAST__REDIRECT_LEN] = {0};
    snprintf((char *)buf, sizeof buf, "%s", to->addr);
    to->redirects++;
    p->hello = 0; /* nothing more is sent to it here */
    sh_info("push %s: redirecting %s (zone %s) to %s", n->name, p->name, p->zone, to->name);
    bcast__send(n, p->ep, p, BCAST__AM_REDIRECT, buf, sizeof buf, NULL, 0, NULL, NULL);
}

static ucs_status_t on_hello(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                             const ucp_am_recv_param_t *prm)
{
    bcast_node *n = arg;
    bcast__peer *p = peer_of(n, prm);
    bcast__hello h;
    if (!p) return UCS_OK;
    if (bcast__unpack_hello(hdr, hlen, &h) < 0) {
        sh_warn("push %s: dropping a child: %s", n->name, sh_errmsg());
        p->dead = 1;
        return UCS_OK;
    }
    if (n->forge_welcome) {
        /* Fault injection: a stranger posing as a parent of the run (one
         * that took a dead root's port) answers any child with a WELCOME
         * it cannot have computed. */
        uint8_t w[BCAST__WELCOME_LEN];
        bcast__pack_welcome(net_secret_proof((sh_hash128){0, 0}, "push parent", h.nonce), w);
        bcast__send(n, p->ep, p, BCAST__AM_WELCOME, w, sizeof w, NULL, 0, NULL, NULL);
    } else if (n->has_secret) {
        /* The child proves the secret without sending it; we prove it back
         * on its nonce, before anything else, so that it trusts what we send. */
        if (!net_hello_check(n->secret, "push child", h.nonce, h.proof)) {
            sh_warn("push %s: refused child %.64s (zone %.32s): its HELLO lacks this run's secret"
                    " (SHOAL_RUN_SECRET)", n->name, h.name, h.zone);
            n->stats.children_refused++;
            p->dead = 1;
            return UCS_OK;
        }
        uint8_t w[BCAST__WELCOME_LEN];
        bcast__pack_welcome(net_secret_proof(n->secret, "push parent", h.nonce), w);
        bcast__send(n, p->ep, p, BCAST__AM_WELCOME, w, sizeof w, NULL, 0, NULL, NULL);
    }
    snprintf(p->name, sizeof p->name, "%s", h.name);
    snprintf(p->zone, sizeof p->zone, "%s", h.zone);
    snprintf(p->addr, sizeof p->addr, "%s", h.addr);
    p->accepts = (h.flags & BCAST__HELLO_ACCEPTS) != 0;
    p->announce = (h.flags & BCAST__HELLO_ANNOUNCE) != 0;
    p->announced = 0;
    p->have = h.have;
    bcast__peer *to = bcast__choose_redirect(n, p);
    if (to) {
        bcast__redirect(n, p, to);
        return UCS_OK;
    }
    p->resume_version = h.resume_version;
    p->resume_next = h.resume_next;
    p->resume_hash = h.resume_hash;
    p->hello = 1;
    sh_info("push %s: child %s (zone %s) attached with v%llu", n->name, h.name, h.zone,
            (unsigned long long)h.have);
    return UCS_OK;
}

static ucs_status_t on_nack(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                            const ucp_am_recv_param_t *prm)
{
    bcast_node *n = arg;
    bcast__peer *p = peer_of(n, prm);
    bcast__nack k;
    if (!p || bcast__unpack_nack(hdr, hlen, &k) < 0) return UCS_OK;
    p->nack_at = sh_now_mono();
    if (p->nresend < BCAST__MAX_RESEND) {
        p->resend_ver[p->nresend] = k.version;
        p->resend_idx[p->nresend++] = k.index;
    }
    return UCS_OK;
}

/* ---- Receiving from the parent --------------------------------------- */

static int from_parent_ep(bcast_node *n, const ucp_am_recv_param_t *prm)
{
    return n->parent_ep && (prm->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) &&
           prm->reply_ep == n->parent_ep;
}

/* A message from the current parent, once it proved the run's secret: with
 * a secret, nothing a parent sends counts before its WELCOME. */
static int from_parent(bcast_node *n, const ucp_am_recv_param_t *prm)
{
    return from_parent_ep(n, prm) && n->parent_proven;
}

static ucs_status_t on_welcome(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                               const ucp_am_recv_param_t *prm)
{
    bcast_node *n = arg;
    sh_hash128 proof;
    if (!from_parent_ep(n, prm) || !n->has_secret || n->parent_proven) return UCS_OK;
    if (bcast__unpack_welcome(hdr, hlen, &proof) < 0 ||
        !net_secret_eq(proof, net_secret_proof(n->secret, "push parent", n->nonce))) {
        sh_warn("push %s: parent %s did not prove this run's secret (SHOAL_RUN_SECRET); leaving it", n->name,
                current_parent(n));
        n->stats.parents_refused++;
        n->parent_failed = 1;
        return UCS_OK;
    }
    n->parent_proven = 1;
    return UCS_OK;
}

/* The newest version above us: what this node's children are told. */
static ucs_status_t on_announce(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                                const ucp_am_recv_param_t *prm)
{
    bcast_node *n = arg;
    uint64_t v;
    if (!from_parent(n, prm)) return UCS_OK;
    if (bcast__unpack_announce(hdr, hlen, &v) < 0) {
        sh_warn("push %s: bad ANNOUNCE from parent: %s", n->name, sh_errmsg());
        return UCS_OK;
    }
    if (v > n->announced_in) n->announced_in = v;
    if (v > n->stats.newest_announced) n->stats.newest_announced = v;
    return UCS_OK;
}

static ucs_status_t on_redirect(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                                const ucp_am_recv_param_t *prm)
{
    bcast_node *n = arg;
    char addr[BCAST__ADDR];
    if (!from_parent(n, prm) || bcast__unpack_redirect(hdr, hlen, addr) < 0) return UCS_OK;
    snprintf(n->redirect_to, sizeof n->redirect_to, "%s", addr);
    return UCS_OK;
}

static ucs_status_t on_offer(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                             const ucp_am_recv_param_t *prm)
{
    bcast_node *n = arg;
    bcast__offer of;
    if (!from_parent(n, prm)) return UCS_OK;
    if (prm->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        sh_warn("push %s: OFFER manifest of %zu bytes is too large", n->name, len);
        return UCS_OK;
    }
    if (bcast__unpack_offer(hdr, hlen, &of) < 0 || of.manifest_len != len) {
        sh_warn("push %s: bad OFFER from parent: %s", n->name, sh_errmsg());
        n->parent_failed = 1;
        return UCS_OK;
    }
    bcast__obj *o = bcast__find(n, of.version);
    if (o && sh_hash128_eq(o->hash, of.hash)) return UCS_OK; /* resuming */
    /* Part of another payload of this version (a squashed delta where the
     * chain's delta now comes, after a new parent): start over with this. */
    if (o && bcast__replace(n, o)) o = NULL;
    if (o || of.version <= n->have) return UCS_OK;           /* stale: keep ours */
    char path[4096];
    if (bcast__obj_spool_path(&of, n->spool, path, sizeof path) < 0) {
        sh_warn("push %s: %s", n->name, sh_errmsg());
        return UCS_OK;
    }
    int reused = n->cfg.reuse_file && n->cfg.reuse_file(n->cfg.arg, of.size, path) == 1;
    if (bcast__obj_for_offer(&of, data, len, path, reused, &o) < 0) {
        sh_warn("push %s: %s", n->name, sh_errmsg());
        return UCS_OK;
    }
    bcast__insert(n, o);
    return UCS_OK;
}

static void chunk_landed(bcast_node *n, uint64_t version, uint32_t i, uint64_t sum, int ok)
{
    bcast__obj *o = bcast__find(n, version);
    if (!o) return;
    o->receiving[i] = 0;
    if (!ok || o->verified[i]) return;
    uint32_t len = bcast__obj_chunk_len(o, i);
    n->stats.bytes_received += len;
    if (sh_hash64_of(o->map + bcast__obj_chunk_off(o, i), len) != sum) {
        n->stats.chunks_corrupt++;
        sh_warn("push %s: chunk %u of v%llu failed its checksum; fetching it again", n->name, i,
                (unsigned long long)version);
        bcast__nack k = {version, i};
        uint8_t buf[BCAST__NACK_LEN];
        bcast__pack_nack(&k, buf);
        if (n->parent_ep) bcast__send(n, n->parent_ep, NULL, BCAST__AM_NACK, buf, sizeof buf, NULL, 0, NULL, NULL);
        return;
    }
    o->verified[i] = 1;
    o->ready_at[i] = sh_now_mono();
    o->sums[i] = sum;
    o->summed[i] = 1;
    o->nverified++;
    if (n->cfg.on_chunk) n->cfg.on_chunk(n->cfg.arg, version, i, o->nchunks);
    if (o->nverified < o->nchunks) return;
    if (bcast__obj_check_hash(o) < 0) {
        /* Every chunk matched its checksum but the whole does not match the
         * manifest: the sender's copy is bad.  Start over from the parent. */
        sh_warn("push %s: %s", n->name, sh_errmsg());
        memset(o->verified, 0, o->nchunks);
        o->nverified = 0;
        n->parent_failed = 1;
        return;
    }
    o->complete = 1;
}

static void recv_cb(void *req, ucs_status_t st, size_t length, void *user)
{
    recv_ctx *r = user;
    r->node->recv_inflight--;
    sh_debug("push %s: chunk %u landed at %.6f", r->node->name, r->index, sh_now_wall());
    if (!r->scratch) chunk_landed(r->node, r->version, r->index, r->sum, st == UCS_OK);
    free(r->scratch);
    free(r);
    if (req) ucp_request_free(req);
}

static ucs_status_t on_chunk(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                             const ucp_am_recv_param_t *prm)
{
    bcast_node *n = arg;
    bcast__chunk c;
    int rndv = prm->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    bcast__obj *o = NULL;
    int ok = from_parent(n, prm) && bcast__unpack_chunk(hdr, hlen, &c) == 0 &&
             (o = bcast__find(n, c.version)) && c.index < o->nchunks &&
             c.len == bcast__obj_chunk_len(o, c.index) && c.len == len;
    int wanted = ok && !o->verified[c.index] && !o->receiving[c.index];
    if (wanted && bcast__obj_prepare(o, c.index) < 0) {
        sh_warn("push %s: %s", n->name, sh_errmsg());
        wanted = 0;
    }
    if (!rndv) {
        if (wanted) {
            memcpy(o->map + bcast__obj_chunk_off(o, c.index), data, len);
            chunk_landed(n, c.version, c.index, c.xxh64, 1);
        }
        return UCS_OK;
    }
    /* Rendezvous: the bytes are fetched into place; an unwanted chunk still
     * has to be received (into scratch) to release the sender. */
    recv_ctx *r = calloc(1, sizeof *r);
    if (!r) return UCS_OK;
    r->node = n;
    void *dst;
    if (wanted) {
        r->version = c.version, r->index = c.index, r->sum = c.xxh64;
        o->receiving[c.index] = 1;
        dst = o->map + bcast__obj_chunk_off(o, c.index);
    } else {
        dst = r->scratch = malloc(len ? len : 1);
        if (!dst) {
            free(r);
            return UCS_OK;
        }
    }
    ucp_request_param_t rp = {0};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = recv_cb;
    rp.user_data = r;
    n->recv_inflight++;
    sh_debug("push %s: chunk %u announced at %.6f", n->name, r->index, sh_now_wall());
    ucs_status_ptr_t q = ucp_am_recv_data_nbx(n->worker, data, dst, len, &rp);
    if (q == NULL) recv_cb(NULL, UCS_OK, len, r);
    else if (UCS_PTR_IS_ERR(q)) recv_cb(NULL, UCS_PTR_STATUS(q), 0, r);
    return UCS_OK;
}

/* ---- Lifecycle and the loop ------------------------------------------ */

static int set_handler(bcast_node *n, unsigned id, ucp_am_recv_callback_t cb)
{
    ucp_am_handler_param_t h = {0};
    h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    h.id = id;
    h.cb = cb;
    h.arg = n;
    h.flags = UCP_AM_FLAG_WHOLE_MSG;
    ucs_status_t st = ucp_worker_set_am_recv_handler(n->worker, &h);
    if (st != UCS_OK) return sh_err(SH_EIO, "push: AM handler %u: %s", id, ucs_status_string(st));
    return SH_OK;
}

static int start_ucx(bcast_node *n)
{
    net_ucx u;
    SH_TRY(net_ucx_open(&u, "push", UCP_FEATURE_AM));
    n->ctx = u.ctx, n->worker = u.worker, n->worker_fd = u.efd;
    if (n->worker_fd < 0) return sh_err(SH_EIO, "push: the UCX worker has no event fd");
    SH_TRY(set_handler(n, BCAST__AM_HELLO, on_hello));
    SH_TRY(set_handler(n, BCAST__AM_REDIRECT, on_redirect));
    SH_TRY(set_handler(n, BCAST__AM_OFFER, on_offer));
    SH_TRY(set_handler(n, BCAST__AM_CHUNK, on_chunk));
    SH_TRY(set_handler(n, BCAST__AM_NACK, on_nack));
    SH_TRY(set_handler(n, BCAST__AM_WELCOME, on_welcome));
    SH_TRY(set_handler(n, BCAST__AM_ANNOUNCE, on_announce));
    return SH_OK;
}

static int start_listener(bcast_node *n)
{
    char want[BCAST__ADDR];
    snprintf(want, sizeof want, "%s:%d", n->cfg.listen_host ? n->cfg.listen_host : "127.0.0.1",
             n->cfg.listen_port);
    net_ucx u = {.worker = n->worker};
    SH_TRY(net_ucx_listen(&u, "push", want, conn_cb, n));
    n->listener = u.listener;
    snprintf(n->addr, sizeof n->addr, "%s", u.addr);
    return SH_OK;
}

static int start_poll(bcast_node *n)
{
    n->epfd = epoll_create1(EPOLL_CLOEXEC);
    n->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (n->epfd < 0 || n->wakefd < 0) return sh_err_errno(errno, "push: epoll/eventfd");
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = n->worker_fd;
    if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, n->worker_fd, &ev) < 0)
        return sh_err_errno(errno, "push: epoll_ctl");
    ev.data.fd = n->wakefd;
    if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, n->wakefd, &ev) < 0)
        return sh_err_errno(errno, "push: epoll_ctl");
    return SH_OK;
}

static void parse_corrupt(bcast_node *n)
{
    const char *e = getenv("SHOAL_BCAST_CORRUPT");
    unsigned long long v;
    unsigned i;
    if (e && sscanf(e, "%llu:%u", &v, &i) == 2) {
        n->corrupt_version = v;
        n->corrupt_index = i;
        n->corrupt_armed = 1;
    }
    n->forge_welcome = getenv("SHOAL_BCAST_FORGE_WELCOME") != NULL; /* tests: a hostile parent */
}

int bcast_node_new(const bcast_config *cfg, bcast_node **out)
{
    *out = NULL;
    if (cfg->nparents < 0 || cfg->nparents > BCAST_MAX_ADDRS)
        return sh_err(SH_EINVAL, "push: %d parents (at most %d)", cfg->nparents, BCAST_MAX_ADDRS);
    if (cfg->nparents > 0 && !cfg->spool)
        return sh_err(SH_EINVAL, "push: a node with a parent needs a spool directory");
    for (int i = 0; i < cfg->nparents; i++) {
        struct sockaddr_in sa;
        SH_TRY(parse_addr(cfg->parents[i], &sa));
    }
    bcast_node *n = calloc(1, sizeof *n);
    if (!n) return sh_err(SH_ENOMEM, "push node");
    n->cfg = *cfg;
    n->epfd = n->wakefd = -1;
    snprintf(n->zone, sizeof n->zone, "%s", cfg->zone ? cfg->zone : "default");
    if (cfg->name) snprintf(n->name, sizeof n->name, "%s", cfg->name);
    else snprintf(n->name, sizeof n->name, "node-%ld", (long)getpid());
    if (cfg->spool) snprintf(n->spool, sizeof n->spool, "%s", cfg->spool);
    if (!n->cfg.chunk_size && n->cfg.depth_hint <= 0) n->cfg.chunk_size = BCAST_DEFAULT_CHUNK;
    n->have = cfg->have_version;
    n->stats.have_version = n->have;
    n->stats.newest_announced = n->have;
    parse_corrupt(n);
    int rc = net_run_secret(&n->secret);
    n->has_secret = rc == 1;
    if (rc >= 0) rc = cfg->spool ? sh_mkdir_p(cfg->spool, 0755) : 0;
    if (rc == 0) rc = start_ucx(n);
    if (rc == 0) rc = start_listener(n);
    if (rc == 0) rc = start_poll(n);
    if (rc < 0) {
        bcast_node_free(n);
        return rc;
    }
    *out = n;
    return SH_OK;
}

const char *bcast_node_address(const bcast_node *n) { return n->addr; }

/* The chunk size for an object of `size` bytes: the configured one, cut
 * down so that the object has at least BCAST__MIN_CHUNKS chunks (in 4 KiB
 * steps).  Every hop of a tree adds one chunk time, so a small object (a
 * delta) cut into big chunks would spend most of its time waiting at each
 * hop for a whole chunk. */
uint64_t bcast_chunk_auto(uint64_t payload, int depth, double gbps, double overhead_s)
{
    if (depth < 1) depth = 1;
    if (!(overhead_s > 0)) overhead_s = 100e-6;
    if (!(gbps > 0)) gbps = 10;
    double c = sqrt((double)payload * overhead_s * (gbps * 1e9 / 8) / depth);
    uint64_t k = c < 0 ? 0 : (uint64_t)c & ~(uint64_t)4095;
    if (k < (16u << 10)) k = 16u << 10;
    if (k > (64ull << 20)) k = 64ull << 20;
    if (payload >= (2u << 20) && k > payload / 32) k = (payload / 32 + 4095) & ~(uint64_t)4095;
    return k;
}

uint32_t bcast__chunk_for(const bcast_node *n, uint64_t size)
{
    if (!n->cfg.chunk_size) /* chosen for this payload and the tree's depth */
        return (uint32_t)bcast_chunk_auto(size, n->cfg.depth_hint, n->cfg.egress_bps * 8 / 1e9, 0);
    uint64_t c = (size + BCAST__MIN_CHUNKS - 1) / BCAST__MIN_CHUNKS;
    c = (c + 4095) & ~(uint64_t)4095;
    return c < n->cfg.chunk_size ? (uint32_t)c : n->cfg.chunk_size;
}

int bcast_node_add_object(bcast_node *n, const char *manifest, const char *path)
{
    bcast__obj *o;
    uint64_t version, base, size;
    int anchor;
    sh_hash128 h;
    SH_TRY(bcast__manifest_parse(manifest, &version, &base, &anchor, &size, &h));
    SH_TRY(bcast__obj_from_file(manifest, path, bcast__chunk_for(n, size), &o));
    if (bcast__find(n, o->version) || o->version <= n->have) {
        uint64_t v = o->version;
        bcast__obj_free(o);
        return sh_err(SH_EEXIST, "push %s: v%llu is not newer than v%llu", n->name,
                      (unsigned long long)v, (unsigned long long)n->have);
    }
    if (!o->anchor && o->base != n->have) {
        uint64_t b = o->base;
        bcast__obj_free(o);
        return sh_err(SH_EMISMATCH, "push %s: a delta on v%llu cannot follow v%llu", n->name,
                      (unsigned long long)b, (unsigned long long)n->have);
    }
    bcast__insert(n, o);
    bcast__deliver(n);
    return SH_OK;
}

void bcast_node_stop(bcast_node *n) { n->stop = 1; }

void bcast_node_wake(bcast_node *n)
{
    uint64_t one = 1;
    if (write(n->wakefd, &one, sizeof one) < 0) { /* already signalled */ }
}

static void wait_events(bcast_node *n, double until)
{
    /* While transfers are in flight UCX may need progress calls that the
     * event fd does not announce (a TCP socket turning writable), so the
     * wait is cut to a millisecond then; each wake-up that found nothing
     * to do doubles it (up to 16 ms), each that did resets it: a node
     * whose sends wait on a slow link does not spin its core at a thousand
     * wake-ups a second, and one that moves data keeps its reaction time. */
    double cap = n->inflight_wait > 0 ? n->inflight_wait : BCAST__INFLIGHT_WAIT;
    if ((n->inflight > 0 || n->recv_inflight > 0) && until > sh_now_mono() + cap)
        until = sh_now_mono() + cap;
    if (ucp_worker_arm(n->worker) == UCS_ERR_BUSY) return;
    double now = sh_now_mono();
    int ms = until > now ? (int)((until - now) * 1000) + 1 : 0;
    struct epoll_event ev[4];
    int k = epoll_wait(n->epfd, ev, 4, ms);
    for (int i = 0; i < k; i++) {
        if (ev[i].data.fd == n->wakefd) {
            uint64_t v;
            if (read(n->wakefd, &v, sizeof v) < 0) { /* nothing pending */ }
        }
    }
}

int bcast_node_run(bcast_node *n, double seconds)
{
    double end = sh_now_mono() + seconds;
    n->stop = 0;
    while (!n->stop) {
        unsigned did = 0, k;
        uint64_t moved = n->stats.bytes_sent + n->stats.bytes_received;
        while ((k = ucp_worker_progress(n->worker))) did += k;
        double now = sh_now_mono();
        parent_events(n, now);
        reap_children(n);
        reap_closing(n);
        bcast__deliver(n);
        bcast__pump(n, now);
        while ((k = ucp_worker_progress(n->worker))) did += k;
        int active = did || n->stats.bytes_sent + n->stats.bytes_received != moved;
        n->inflight_wait = active || n->inflight_wait <= 0 ? BCAST__INFLIGHT_WAIT
                                                          : fmin(2 * n->inflight_wait, BCAST__INFLIGHT_MAX);
        if (now >= end || n->stop) break;
        double until = end;
        if (n->wake_at > 0 && n->wake_at < until) until = n->wake_at;
        if (!n->parent_ep && n->cfg.nparents > 0 && n->reconnect_at < until) until = n->reconnect_at;
        /* Endpoint errors are reported from progress, not the event fd, so
         * the wait is capped to notice them promptly. */
        if (until > now + 0.05) until = now + 0.05;
        wait_events(n, until);
    }
    return SH_OK;
}

void bcast_node_stats(const bcast_node *n, bcast_stats *out)
{
    *out = n->stats;
    out->children = 0;
    for (const bcast__peer *p = n->children; p; p = p->next_peer) out->children += p->hello && !p->dead;
    out->attached = n->cfg.nparents == 0 || n->parent_ep != NULL;
    snprintf(out->parent_error, sizeof out->parent_error, "%s%s%s", n->failed_parent, n->failed_status ? ": " : "",
             n->failed_status ? n->failed_status : "");
    snprintf(out->addr, sizeof out->addr, "%s", n->addr);
}

void bcast_node_free(bcast_node *n)
{
    if (!n) return;
    if (n->worker) {
        if (n->listener) ucp_listener_destroy(n->listener);
        n->listener = NULL;
        for (bcast__peer *p = n->children; p; p = p->next_peer) p->dead = 1;
        reap_children(n);
        if (n->parent_ep) close_ep(n, n->parent_ep);
        n->parent_ep = NULL;
        double end = sh_now_mono() + 1.0;
        while ((n->nclosing > 0 || n->inflight > 0) && sh_now_mono() < end) {
            ucp_worker_progress(n->worker);
            reap_closing(n);
        }
    }
    net_ucx_close(&(net_ucx){.ctx = n->ctx, .worker = n->worker});
    for (bcast__obj **l = &n->objs; l; l = l == &n->objs ? &n->squashes : NULL) {
        while (*l) {
            bcast__obj *o = *l;
            *l = o->next;
            bcast__obj_free(o);
        }
    }
    free(n->closing);
    if (n->epfd >= 0) close(n->epfd);
    if (n->wakefd >= 0) close(n->wakefd);
    free(n);
}
