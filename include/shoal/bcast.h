/* shoal bcast: chunked, pipelined push trees over UCX.
 *
 * Every process in a push tree runs one bcast_node: the root (`shoal push
 * serve`) is fed objects from a store; relays and replicas attach to a parent
 * and receive objects chunk by chunk, forwarding each verified chunk to their
 * own children while the next one arrives.  An object is one version's
 * payload file (a full anchor checkpoint or a delta) plus its manifest.
 * docs/push-protocol.md specifies the wire protocol.
 *
 * A node is single-threaded: bcast_node_run() drives UCX progress and must be
 * called from one thread.  Callbacks run on that thread. */
#ifndef SHOAL_BCAST_H
#define SHOAL_BCAST_H

#include <stdint.h>

#include "shoal/common.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

#define BCAST_DEFAULT_CHUNK (4u << 20)
#define BCAST_MAX_ADDRS 16

typedef struct bcast_node bcast_node;

/* A complete, verified object as handed to on_object.  The path stays valid
 * until the node drops the object (after the next anchor completes). */
typedef struct bcast_object_info {
    uint64_t version;
    uint64_t base;        /* 0 for an anchor; for a squashed delta, its base */
    int is_anchor;
    int is_squash;        /* a squashed delta base -> version: the manifest is the
                           * version's, but size and hash are the squash's */
    uint64_t size;
    const char *path;     /* the payload file in the node's spool */
    const char *manifest; /* the version's manifest.json text */
    sh_hash128 hash;      /* xxh3 of the payload file (checked whole) */
} bcast_object_info;

typedef struct bcast_config {
    const char *name;        /* for logs and HELLO; default "node-<pid>" */
    const char *zone;        /* default "default" */
    const char *spool;       /* directory for received payloads (required unless root) */
    const char *listen_host; /* default 127.0.0.1 */
    int listen_port;         /* 0: ephemeral */
    int accept_children;     /* 1 for relays and (by default) replicas */
    int fanout;              /* same-zone children before redirecting; default 2 */
    uint32_t chunk_size;     /* root only; default BCAST_DEFAULT_CHUNK, or with
                              * depth_hint > 0 chosen per object (bcast_chunk_auto) */
    int depth_hint;          /* root: the tree's expected depth (hops to the deepest replica) */
    double egress_bps;       /* sender-side rate limit in bytes/s over all children; 0 = none */
    /* Parents to try, in order ("host:port").  A root has none. */
    const char *parents[BCAST_MAX_ADDRS];
    int nparents;
    uint64_t have_version;   /* the version this node already holds (replica restart) */
    /* Root only (optional): for a child at version `from` (at or after the
     * node's newest anchor; a child behind it gets the anchor) that is two or
     * more versions behind the newest, `to`: returns 1 with `path` set to a
     * squashed delta from -> to when that is fewer bytes than the chain of
     * deltas, else 0 (the chain).  The file must stay until the node is
     * freed.  Called on the node's thread, once per child and version. */
    int (*squash)(void *arg, uint64_t from, uint64_t to, char *path, size_t cap);
    /* Called on the node's thread when an object is complete and verified. */
    void (*on_object)(void *arg, const bcast_object_info *obj);
    /* Called for every verified chunk (progress, tests). */
    void (*on_chunk)(void *arg, uint64_t version, uint32_t index, uint32_t nchunks);
    /* Optional, receivers: a file of the application's that the node may
     * receive an object of `size` bytes into instead of creating one (its
     * pages are overwritten: nothing is allocated or zeroed).  The callback
     * renames the file to `path` and returns 1, or returns 0 (a new file).
     * Called on the node's thread when an OFFER comes. */
    int (*reuse_file)(void *arg, uint64_t size, const char *path);
    void *arg;
} bcast_config;

/* The chunk that minimises the pipelined time (S / c + d) (c / B + h) of a
 * payload of S bytes through d hops at `gbps` with `overhead_s` per chunk
 * and hop: sqrt(S h B / d), rounded down to 4 KiB, between 16 KiB and 64 MiB,
 * and small enough to cut a payload of 2 MiB or more into at least 32
 * chunks.  Defaults: h 100 us (a chunk's receive, hash, forward and
 * callbacks at a relay over UCX's tcp transport: plain UCX spends about
 * 80 us of CPU per chunk at each end on this project's machines, `bench
 * push`), gbps 10.  Pure. */
uint64_t bcast_chunk_auto(uint64_t payload, int depth, double gbps, double overhead_s);

/* Creates a node, its UCX worker and its listener.  The caller owns the node
 * and frees it with bcast_node_free(). */
int bcast_node_new(const bcast_config *cfg, bcast_node **out);
void bcast_node_free(bcast_node *n);

/* "host:port" this node listens on (owned by the node). */
const char *bcast_node_address(const bcast_node *n);

/* Root only: offers the payload file at `path` (not copied; it must stay
 * until the node drops the object) described by `manifest_json`
 * (store-version/1 manifest text).  Versions must be added in increasing
 * order; an anchor makes older objects droppable. */
int bcast_node_add_object(bcast_node *n, const char *manifest_json, const char *path);

/* Runs the event loop for up to `seconds` (or until bcast_node_stop()).
 * Returns 0, or a negative code on a fatal error. */
int bcast_node_run(bcast_node *n, double seconds);
void bcast_node_stop(bcast_node *n);

/* Wakes a node blocked in bcast_node_run() from another thread. */
void bcast_node_wake(bcast_node *n);

typedef struct bcast_stats {
    uint64_t bytes_sent;      /* chunk payload bytes sent to children */
    uint64_t bytes_received;  /* chunk payload bytes received (incl. corrupt ones) */
    uint64_t chunks_corrupt;  /* received chunks dropped for a bad checksum */
    uint64_t reattaches;      /* parent connections after the first */
    uint64_t redirects;       /* redirects this node followed */
    uint64_t children_refused; /* HELLOs without the run's secret (SHOAL_RUN_SECRET) */
    uint64_t parents_refused;  /* parents left for not proving it */
    uint64_t have_version;    /* newest complete object */
    uint64_t newest_announced; /* the newest version the tree has announced to this node
                                  (its parent's ANNOUNCE; at least have_version) */
    int children;             /* live children */
    int attached;             /* 1 when connected to a parent (or root) */
    char addr[64];            /* this node's listening address "host:port" */
    char parent[64];          /* the parent the newest complete object came from ("": root) */
    char parent_error[128];   /* "HOST:PORT: UCX status" of the last parent connection that
                                 failed ("": none), e.g. a parent that cannot be reached */
} bcast_stats;
void bcast_node_stats(const bcast_node *n, bcast_stats *out);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
