/* Internal: the state of a push node, shared by node.c (UCX plumbing, event
 * loop) and sched.c (which child gets which chunk next). */
#ifndef SHOAL_BCAST_NODE_H
#define SHOAL_BCAST_NODE_H

#include <ucp/api/ucp.h>

#include "weights/push/obj_int.h"
#include "shoal/bcast.h"
#include "shoal/net.h"

#define BCAST__MAX_OUTSTANDING 4 /* chunk sends in flight per child */
#define BCAST__MAX_RESEND 64
#define BCAST__PROOF_WAIT 5.0 /* s a parent has to prove the run's secret (WELCOME) */
#define BCAST__MIN_CHUNKS 32 /* the root cuts an object into at least this many */
#define BCAST__STACK 32
#define BCAST__EAGER_MAX (64u << 10) /* larger messages go by rendezvous (zero-copy) */

typedef struct bcast__peer {
    struct bcast_node *node;
    ucp_ep_h ep;
    int dead;  /* the endpoint failed or the child left: reap it */
    int hello; /* accepted: HELLO received and not redirected */
    int refs;  /* 1 while listed + one per send in flight */
    int accepts;
    int announce;        /* the child understands ANNOUNCE (HELLO flag) */
    uint64_t announced;  /* the newest version announced to it so far */
    char name[BCAST__NAME], zone[BCAST__ZONE], addr[BCAST__ADDR];
    uint64_t have; /* the version the child holds once what was posted lands */
    uint64_t plan_for; /* root: n->have when this child's plan was last asked (0: never) */
    uint64_t plan_from; /* root: and the child's have then */
    int squash;        /* that answer: 1 for a squashed delta */
    bcast__obj *cur;
    uint32_t next;
    uint64_t resume_version;
    uint32_t resume_next;
    sh_hash128 resume_hash;
    uint64_t resend_ver[BCAST__MAX_RESEND];
    uint32_t resend_idx[BCAST__MAX_RESEND];
    int nresend;
    int outstanding;
    double offer_at, nack_at; /* monotonic: when this child's object and last NACK came */
    unsigned redirects; /* children this node sent to this one */
    struct bcast__peer *next_peer;
} bcast__peer;

struct bcast_node {
    bcast_config cfg;
    sh_hash128 secret; /* SHOAL_RUN_SECRET: children must present it, and we do to parents */
    int has_secret;
    char name[BCAST__NAME], zone[BCAST__ZONE], addr[BCAST__ADDR];
    char spool[4096];
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    int epfd, wakefd, worker_fd;
    bcast__peer *children;
    /* The parent: an address stack of redirects on top of the configured
     * list, so that a dead parent sends us back to whoever sent us to it. */
    ucp_ep_h parent_ep;
    int parent_failed;
    sh_hash128 nonce;     /* of the HELLO to the current parent */
    int parent_proven;    /* the parent's WELCOME proved the run's secret (or there is none) */
    double parent_since;  /* when the current parent was connected (monotonic) */
    char unproven_warned[BCAST__ADDR]; /* the last parent said to have left unproven */
    char lost_warned[BCAST__ADDR];     /* the last parent said to have failed */
    char failed_parent[BCAST__ADDR];   /* the last parent whose endpoint failed ... */
    const char *failed_status;         /* ... and why (ucs_status_string: static), or NULL */
    char redirect_to[BCAST__ADDR];
    char fed_by[BCAST__ADDR]; /* the parent connected to last: objects come from it */
    double reconnect_at;
    char stack[BCAST__STACK][BCAST__ADDR];
    int nstack, base_idx;
    bcast__obj *objs; /* by increasing version */
    bcast__obj *squashes; /* root: squashed deltas served to late joiners */
    uint64_t have;    /* newest delivered object */
    uint64_t announced_in; /* the newest version the parent announced (0: none) */
    double link_free, wake_at; /* monotonic: the egress link's clock (sched.c) */
    int stop;
    bcast_stats stats;
    void **closing;
    int nclosing, capclosing;
    int inflight;      /* sends not yet completed, all peers */
    double inflight_wait; /* the loop's wake-up period while transfers are in flight */
    int recv_inflight; /* rendezvous receives not yet completed */
    uint64_t corrupt_version; /* fault injection: SHOAL_BCAST_CORRUPT=V:I */
    uint32_t corrupt_index;
    int corrupt_armed;
    int forge_welcome; /* fault injection: SHOAL_BCAST_FORGE_WELCOME (a hostile parent) */
};

/* sched.c */
bcast__obj *bcast__find(struct bcast_node *n, uint64_t version);
void bcast__insert(struct bcast_node *n, bcast__obj *o);
void bcast__drop_old(struct bcast_node *n);
/* Whether a child is being sent o or a receive into it is in flight. */
int bcast__obj_busy(const bcast__obj *o);
/* Drops o, an incomplete object nothing uses, so that another payload of
 * its version can be received (1), or keeps it (0). */
int bcast__replace(struct bcast_node *n, bcast__obj *o);
void bcast__deliver(struct bcast_node *n);
void bcast__pump(struct bcast_node *n, double now);
bcast__peer *bcast__choose_redirect(struct bcast_node *n, bcast__peer *p);
/* Sends p a REDIRECT to `to` (node.c). */
void bcast__redirect(struct bcast_node *n, bcast__peer *p, bcast__peer *to);
uint32_t bcast__chunk_for(const struct bcast_node *n, uint64_t size);
/* node.c */
/* Sends one active message; `owned` (may be NULL) is freed when it is done,
 * and `pin` (may be NULL), the object data points into, is kept (refs)
 * until then. */
int bcast__send(struct bcast_node *n, ucp_ep_h ep, bcast__peer *p, unsigned id, const void *hdr,
                size_t hlen, const void *data, size_t len, void *owned, struct bcast__obj *pin);

#endif
