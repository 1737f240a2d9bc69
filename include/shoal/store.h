/* shoal store: versioned runs of weights on a file system, and replicas.
 *
 * A store is a directory with one folder per run and, under it, one folder
 * per version holding either a full anchor checkpoint or a delta against the
 * previous version.  A run's LATEST pointer is replaced atomically, and only
 * after the version it names is durable.  docs/store-format.md specifies the
 * layout and the protocol.
 *
 * Every function returns 0 or a negative SH_E* code with sh_errmsg() set. */
#ifndef SHOAL_STORE_H
#define SHOAL_STORE_H

#include <stdint.h>

#include "shoal/bcast.h"
#include "shoal/ckpt.h"
#include "shoal/common.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

#define STORE_DEFAULT_RUN "main"
#define STORE_MAX_CHAIN 4096

typedef struct store store;

/* One version's manifest. */
typedef struct store_version {
    uint64_t version;
    int anchor;              /* 1: a full checkpoint; 0: a delta on version-1 */
    uint64_t base;           /* version-1 for a delta, 0 for an anchor */
    uint64_t size;           /* payload bytes */
    sh_hash128 xxh3;         /* of the payload file */
    uint64_t model_size;     /* bytes of the full checkpoint this version is */
    sh_hash128 model_xxh3;   /* of the full checkpoint */
    double created_at;       /* seconds since the epoch */
    char file[64];           /* payload file name inside the version folder */
} store_version;

/* Opens run `run` (NULL: STORE_DEFAULT_RUN) of the store at `root`.  With
 * create = 1 the folders are made if missing; otherwise a missing run is
 * SH_ENOENT.  The caller owns the handle. */
int store_open(const char *root, const char *run, int create, store **out);
void store_close(store *s);
/* Makes this handle the run's publisher until store_close: a lock on
 * root/run/publisher (flock), exclusive when writer_id is NULL, shared
 * between handles that each give a writer id (1-64 characters).  A second
 * publisher (every DDP rank publishing is the usual mistake) gets SH_EEXIST
 * naming the holder's pid.  Publishing itself does not claim: the Python
 * Store claims on its first publish; a claimed handle claims again as a
 * no-op. */
int store_claim_publisher(store *s, const char *writer_id);
const char *store_root(const store *s);
const char *store_run(const store *s);

/* The version LATEST names, or 0 when the run has none yet.  A pointer that
 * names another run or cannot be parsed is an error (SH_EFORMAT), never a
 * silent fallback. */
int store_latest(store *s, uint64_t *out);

/* Reads and checks version v's manifest.  *text (optional, caller frees)
 * gets the manifest's JSON text. */
int store_get(store *s, uint64_t v, store_version *out, char **text);
/* Parses a manifest's text (as sent over the push tree); with run non-NULL
 * the manifest must belong to that run. */
int store_manifest_parse(const char *text, const char *run, store_version *out);
/* The payload file of version v. */
int store_payload_path(store *s, uint64_t v, char *out, size_t cap);
/* Checks the payload's size and xxh3 against the manifest. */
int store_verify(store *s, uint64_t v);

/* Every version folder of the run in increasing order (caller frees *out).
 * A folder whose manifest is unreadable is listed with version set and
 * size 0, and counted in *broken. */
int store_list(store *s, store_version **out, size_t *n, size_t *broken);

typedef struct store_publish_opts {
    uint64_t anchor_every; /* a full anchor every N versions (default 8); 1: all anchors */
    /* Optional: advanced in bytes of the checkpoint as the publish reads it
     * (its total, when 0, set to the checkpoint's size); the caller starts
     * and finishes it. */
    sh_progress *progress;
} store_publish_opts;

/* Publishes the checkpoint file `ckpt` as the next version: a delta against
 * the previous version (computed here), or an anchor every N versions.  The
 * payload and manifest are made durable and the version folder renamed into
 * place before LATEST advances; on any failure (SH_ENOSPC included) LATEST is
 * unchanged and no partial folder remains.  *out gets the new version. */
int store_publish(store *s, const char *ckpt, const store_publish_opts *o, uint64_t *out);

/* A version held in memory by its writer: the full checkpoint image (one
 * safetensors file's bytes) and, optionally, the shoal delta from the image of
 * store version `base` to it, as delta_make_mem() made it.  Both stay the
 * caller's. */
typedef struct store_mem_version {
    const uint8_t *image;
    size_t image_len;
    const uint8_t *delta; /* NULL / 0: none (the version becomes an anchor) */
    size_t delta_len;
    uint64_t base;        /* the version LATEST must name now (0: the run is empty) */
} store_mem_version;

/* Publishes the next version from memory, diffing nothing: the given delta
 * becomes its payload, or the image when the version is due for an anchor
 * (every N versions, the first, or no delta given).  Only the payload is
 * staged, never a full image for a delta version.  LATEST must name
 * in->base (else SH_EMISMATCH and nothing is written: another publisher
 * moved it).  The delta is parsed and its target size checked; readers check
 * its digests when they apply it.  Durability and failure as store_publish():
 * on any failure LATEST is unchanged and no partial folder remains. */
int store_publish_mem(store *s, const store_mem_version *in, const store_publish_opts *o,
                      uint64_t *out);

/* Keeps the newest `keep` versions and every version they chain back to;
 * removes the rest (and leftovers of crashed publishes).  *removed counts
 * removed version folders. */
int store_gc(store *s, uint64_t keep, uint64_t *removed);

/* ---- Plans ---------------------------------------------------------------
 * How a holder of version `from` (0: nothing) gets to version `to` with the
 * fewest bytes: apply the deltas after `from`, apply one squashed delta (when
 * the store has it), or load the nearest anchor and apply from there. */
enum { STORE_PLAN_NONE = 0, STORE_PLAN_CHAIN = 1, STORE_PLAN_SQUASH = 2, STORE_PLAN_ANCHOR = 3 };

typedef struct store_plan {
    int kind;
    uint64_t from, to;
    uint64_t anchor;      /* STORE_PLAN_ANCHOR: the anchor loaded first */
    uint64_t bytes;       /* payload bytes read or moved */
    uint64_t chain_bytes, squash_bytes, anchor_bytes; /* each option; UINT64_MAX if impossible */
    uint64_t steps[STORE_MAX_CHAIN]; /* deltas to apply in order (CHAIN, ANCHOR) */
    size_t nsteps;
} store_plan;

/* Fills *p (caller allocates; it is large).  SH_ENOENT if `to` or a version
 * it chains to is missing. */
int store_plan_make(store *s, uint64_t from, uint64_t to, store_plan *p);
const char *store_plan_kind_name(int kind);
/* The squashed delta from `from` to `to` (path of the cache file). */
int store_squash_path(store *s, uint64_t from, uint64_t to, char *out, size_t cap);
/* Composes the deltas from+1 .. to into that cache file (durably), so that
 * plans from `from` can use it; *bytes (optional) gets its size. */
int store_squash(store *s, uint64_t from, uint64_t to, uint64_t *bytes);

/* Writes version v's full checkpoint to `out` (atomically), starting from
 * `have_path` holding version `have` when that is cheaper (have = 0: none),
 * and checks the result against the manifest's model_xxh3. */
int store_materialize(store *s, uint64_t v, uint64_t have, const char *have_path, const char *out);

/* Applies one payload (anchor or delta) on top of `prev` (NULL for an
 * anchor) into `out`, atomically; checks the model hash in `ver`. */
int store_apply_payload(const store_version *ver, const char *payload, const char *prev,
                        const char *out);

/* Whether this build has the delta codec (src/weights/delta). */
int store_have_codec(void);

/* ---- Replicas --------------------------------------------------------------
 * A replica keeps the active version of a run in DIR and reconciles with a
 * store (polling LATEST) or a push tree (attached to a parent): it stages and
 * verifies the next version while the current one keeps serving, then
 * activates it with an atomic swap.  Serving code embeds it and leases the
 * active model per request; a lease pins its version until released.
 * docs/store-format.md describes DIR. */
typedef struct store_replica store_replica;

typedef struct store_replica_config {
    const char *dir;   /* required: models/, staging/, spool/, ACTIVE */
    const char *store; /* store root: the source when no parent is given */
    const char *run;   /* NULL: STORE_DEFAULT_RUN */
    const char *parents[BCAST_MAX_ADDRS]; /* push parents ("host:port") */
    int nparents;
    const char *zone;
    int fanout;
    int leaf;          /* 1: accept no children in the push tree */
    const char *listen_host; /* address children reach this replica at (default 127.0.0.1) */
    int listen_port;         /* its port (0: any free one) */
    double egress_bps; /* rate limit for forwarding to children */
    double poll_s;     /* store polling period (default 0.02 s) */
    int fp8;           /* also keep an FP8 serving copy (delta_quant_fp8), updated
                        * block by block after a delta */
    /* Called on the replica's apply thread around each activation. */
    void (*before_activate)(void *arg, uint64_t from, uint64_t to);
    void (*after_activate)(void *arg, uint64_t version, double activated_at);
    void *arg;
} store_replica_config;

/* A leased model: the full checkpoint bytes of one version (read-only). */
typedef struct store_lease {
    uint64_t version; /* the version this request runs on (at its start) */
    const uint8_t *data;
    uint64_t size;
    const struct ckpt *ckpt; /* the parsed checkpoint over data (tensor views) */
    const struct ckpt *fp8;  /* with fp8: the FP8 serving copy of the same version */
    void *priv;
} store_lease;

/* A tensor of the leased version (valid until the lease is released). */
int store_lease_tensor(const store_lease *l, const char *name, const ckpt_tensor **out);

/* Where the time of one version's activation went, as wall-clock seconds
 * (0: the step did not happen, e.g. no chunk for a version read from the
 * store).  Filled by the replica for the newest activation. */
typedef struct store_timeline {
    uint64_t version;
    double first_chunk; /* the first verified chunk of its payload arrived */
    double last_chunk;  /* the last one arrived */
    double received;    /* the whole payload verified and queued */
    double apply_start; /* the apply thread took it */
    double built;       /* the full model is built and verified */
    double durable;     /* its bytes and name are on disk (fsync) */
    double active;      /* swapped in */
} store_timeline;

typedef struct store_replica_info {
    uint64_t version;
    double activated_at;  /* wall-clock seconds */
    double pause_max_ms;  /* longest time a swap blocked lease callers */
    uint64_t activations, failures;
    uint64_t fp8_blocks;  /* blocks re-quantised by the last FP8 update */
    char last_error[512];
    /* The newest version the replica knows exists: its push parent's
     * announcement (push.newest_announced), or the store's LATEST when it
     * reads the store; at least `version`. */
    uint64_t newest_announced;
    bcast_stats push;
    store_timeline timeline; /* of the newest activation */
} store_replica_info;

/* The root of a push tree over a store's run (`shoal push serve`): a bcast
 * node (cfg; accept_children is set, name defaults to "root") that follows
 * the run's LATEST and offers each version from the newest anchor on, each
 * checked against its manifest first, and answers a late joiner with the
 * store's cheapest plan.  A damaged version is reported once (sh_warn) and
 * stops the offers, not the root; children keep what they have.  The caller
 * owns the root (store_push_root_free). */
typedef struct store_push_root store_push_root;
int store_push_root_new(const char *root, const char *run, const bcast_config *cfg, store_push_root **out);
/* The address children connect to, and the run served (owned by the root). */
const char *store_push_root_address(const store_push_root *r);
const char *store_push_root_run(const store_push_root *r);
/* Offers what LATEST added since the last call, then runs the node for up to
 * `seconds` (at least 0.5 s after a damaged version).  0 or a negative SH_E*
 * code from the node. */
int store_push_root_step(store_push_root *r, double seconds);
/* NULL: a no-op. */
void store_push_root_free(store_push_root *r);

/* Opens DIR (created if missing), restores the last activated version after
 * checking it, removes what a crash mid-apply left, and starts reconciling in
 * background threads.  The caller owns the replica. */
int store_replica_open(const store_replica_config *cfg, store_replica **out);
void store_replica_close(store_replica *r);
uint64_t store_replica_version(store_replica *r);
/* Blocks until an activation of a version >= v is complete: serving it, its
 * ACTIVE durable, the previous version's files gone (unless leased) and
 * after_activate run.  (Leases see a new version a moment earlier, at the
 * swap.)  SH_ETIMEDOUT after timeout_s. */
int store_replica_wait(store_replica *r, uint64_t v, double timeout_s);
/* Leases the active model.  min_version / exact_version (0: none) are the
 * request's constraints; one this replica cannot meet now is SH_EAGAIN
 * (retryable: later, or on another replica), with the reason. */
int store_replica_acquire(store_replica *r, uint64_t min_version, uint64_t exact_version,
                          store_lease *out);
/* Ends a lease; returns the replica's active version at that moment, so that
 * a result reports the version at the start and at the end of generation. */
uint64_t store_replica_release(store_replica *r, store_lease *l);
void store_replica_get_info(store_replica *r, store_replica_info *out);

/* ---- For bindings (python/shoal; src/weights/store/store_bind.c) ----------------------
 * The same operations with only pointers, numbers and JSON text crossing, so
 * that a foreign caller mirrors no struct that may grow.  Text returned in
 * *out is the caller's (sh_free). */
/* store_publish() with opts.anchor_every = anchor_every (0: default). */
int store_publish_path(store *s, const char *ckpt, uint64_t anchor_every, uint64_t *out);
/* Publishes n tensors from the caller's memory (name, dtype, ndim, shape and
 * data of each used; nbytes is derived): written once, straight from .data,
 * into a checkpoint in the run's staging folder, published, then removed. */
int store_publish_tensors(store *s, const ckpt_tensor *t, size_t n, uint64_t anchor_every,
                          uint64_t *out);
/* The same with the file's safetensors __metadata__ given as JSON text, an
 * object of strings (NULL: none); the Python package records tied tensors
 * there ("shoal.aliases", docs/safetensors.md). */
int store_publish_tensors_meta(store *s, const ckpt_tensor *t, size_t n, const char *metadata,
                               uint64_t anchor_every, uint64_t *out);
/* Publishes of tensors (store_publish_tensors*) on this handle keep the
 * image of the version they published last in memory (with on = 0: stop,
 * and free it) and make the next delta against it, with `threads` encoder
 * threads (0: all cores): no checkpoint file is written for a delta version
 * and the previous version is not read back from the store.  The kept image
 * is used only while LATEST names its version and its manifest's size and
 * model_xxh3 match (checked under the run's lock); otherwise it is read back
 * from the store once.  Memory: up to two images (the kept one and the one
 * being published). */
int store_publish_keep(store *s, int on, int threads);
/* store_list() as a JSON array of manifests ({"version", "kind", "base",
 * "size", "xxh3", "model_size", "model_xxh3", "created_at"}, or {"version",
 * "broken": true}). */
int store_list_json(store *s, char **out);
/* store_replica_open() from a JSON object with the keys of
 * store_replica_config: "dir", "store", "run", "parents" (a list of
 * "host:port"), "zone", "fanout", "leaf", "egress_bps", "poll_s", "fp8".
 * Close with store_replica_close_json(). */
int store_replica_open_json(const char *config_json, store_replica **out);
void store_replica_close_json(store_replica *r);
/* store_replica_get_info() as a JSON object. */
int store_replica_info_json(store_replica *r, char **out);
/* store_replica_acquire() into a lease allocated here; store_lease_free()
 * releases and frees it (NULL: no-op) and returns what release returns. */
int store_lease_new(store_replica *r, uint64_t min_version, uint64_t exact_version, store_lease **out);
uint64_t store_lease_free(store_replica *r, store_lease *l);
/* Lets bytes [off, off + len) of a lease's model (whole pages around them)
 * leave this process's resident memory once read: madvise(MADV_DONTNEED) on
 * the model's read-only file mapping.  The pages stay in the page cache and
 * the lease stays valid: a later read (by this lease, another one or a
 * tensor view) faults the same bytes back in.  load_into calls it as it
 * copies, so that a follower holding its own copy of the tensors does not
 * also hold the leased image.  SH_ERANGE for a range past the model's end,
 * SH_EINVAL for a lease that is not a model's file mapping. */
int store_lease_drop_pages(const store_lease *l, uint64_t off, uint64_t len);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
