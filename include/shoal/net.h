/* shoal net: what every link between a run's processes shares.
 *
 *  - The run secret (SHOAL_RUN_SECRET) and the one handshake built on it:
 *    the connecting side sends a fresh nonce and proof(secret, CHILD_LABEL,
 *    nonce); the accepting side checks it and answers proof(secret,
 *    PARENT_LABEL, nonce) before anything else; the connecting side trusts
 *    nothing it receives before that answer.  The secret itself never
 *    crosses the wire.  The push tree (labels "push child"/"push parent")
 *    and the RL trainer's TCP link ("rl worker"/"rl trainer") use it.
 *  - UCX set-up: a context with one single-threaded worker, a listener and
 *    client-server endpoints on IPv4 "host:port" addresses.  The push tree
 *    and the trainer ring get their workers, listeners and endpoints here;
 *    no other file calls ucp_init, ucp_worker_create, ucp_listener_create or
 *    creates an endpoint from an address.
 *
 * Errors follow include/shoal/common.h: 0 or a negative SH_E* code with a
 * message that names the caller's `who` ("push root", "ring rank 3"). */
#ifndef SHOAL_NET_H
#define SHOAL_NET_H

#include <netinet/in.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "shoal/common.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

/* ---- The run secret and the handshake ------------------------------------
 * The processes of one run (trainer, workers, push nodes) may share a
 * secret: SHOAL_RUN_SECRET, 32 hex digits (128 random bits) in their
 * environment.  net_run_secret() reads it: 1 with *out set when the
 * variable is set, 0 when it is unset or empty (no secret: anyone may
 * connect), < 0 when it is malformed. */
int net_run_secret(sh_hash128 *out);
/* Compares two secrets in time independent of where they differ. */
int net_secret_eq(sh_hash128 a, sh_hash128 b);
/* Proof of the secret without revealing it: HMAC-SHA256 keyed by the
 * secret over the NUL-terminated label and the nonce, truncated to 128
 * bits. */
sh_hash128 net_secret_proof(sh_hash128 secret, const char *label, sh_hash128 nonce);
/* 128 bits from getrandom(). */
int net_nonce(sh_hash128 *out);

/* The connecting side's half of the handshake: a fresh nonce, the proof to
 * send with it, and the answer to expect back. */
typedef struct net_hello {
    sh_hash128 nonce, proof, expect;
} net_hello;
int net_hello_make(sh_hash128 secret, const char *child_label, const char *parent_label, net_hello *h);
/* The accepting side: 1 when proof proves the secret on nonce (then send
 * net_secret_proof(secret, parent_label, nonce) back first), else 0. */
int net_hello_check(sh_hash128 secret, const char *child_label, sh_hash128 nonce, sh_hash128 proof);

/* ---- UCX ----------------------------------------------------------------- */
typedef struct net_ucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    int efd;       /* the worker's event fd, or -1 (then callers poll) */
    char addr[64]; /* "host:port" the listener took, once listening */
} net_ucx;

/* Parses "host:port" (IPv4, port 0..65535); `what` names it in errors. */
int net_addr_parse(const char *addr, const char *what, struct sockaddr_in *sa);
/* A context with `features` (UCP_FEATURE_AM, UCP_FEATURE_TAG; WAKEUP is
 * added) and one single-threaded worker.  On error *u is left closed. */
int net_ucx_open(net_ucx *u, const char *who, uint64_t features);
/* Listens on "host:port" (port 0: an ephemeral one; u->addr gets what was
 * taken).  A restarted listener may take its port back at once
 * (SO_REUSEADDR, unless UCX_TCP_CM_REUSEADDR says otherwise). */
int net_ucx_listen(net_ucx *u, const char *who, const char *hostport, ucp_listener_conn_callback_t cb,
                   void *arg);
/* A client endpoint to "host:port", with peer error handling. */
int net_ucx_connect(net_ucx *u, const char *who, const char *hostport, ucp_err_handler_cb_t on_err, void *arg,
                    ucp_ep_h *out);
/* The endpoint for a connection request the listener got. */
int net_ucx_accept(net_ucx *u, ucp_conn_request_h req, ucp_err_handler_cb_t on_err, void *arg, ucp_ep_h *out);
/* Destroys the listener, the worker and the context (endpoints are the
 * caller's to close first).  Safe on a zeroed or half-opened net_ucx. */
void net_ucx_close(net_ucx *u);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
