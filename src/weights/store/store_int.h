/* Internal to src/weights/store. */
#ifndef SHOAL_STORE_INTERNAL_H
#define SHOAL_STORE_INTERNAL_H

#include "shoal/store.h"

struct store {
    char root[4096];
    char run[65];
    char dir[4096];      /* root/run */
    char versions[4096]; /* root/run/versions */
    char staging[4096];  /* root/run/staging */
    int writer_fd;       /* store_claim_publisher's lock on root/run/publisher (-1: none) */
    struct store__keep *keep; /* store_publish_keep's images (NULL: off) */
};

/* publish_mem.c: frees what store_publish_keep() holds. */
void store__keep_free(store *s);
/* publish_mem.c: store_publish_tensors_meta() when s->keep is set. */
struct json_t;
int store__publish_kept(store *s, const ckpt_tensor *t, size_t n, const struct json_t *meta,
                        uint64_t anchor_every, uint64_t *out);
/* store.c's check, shared with publish_mem.c: whether readers can rebuild
 * version `latest` from anchor `a` and the deltas after it (every payload a
 * plain file of its manifest's size); with verify_anchor, an anchor that is
 * `latest` is also hashed (it is then the base a delta is made against). */
int store__chain_readable(store *s, uint64_t a, uint64_t latest, int verify_anchor);
/* The path of version prev's full checkpoint (its anchor payload, or the
 * head cache, rebuilt when stale); pm is its manifest. */
int store__head_base(store *s, uint64_t prev, const store_version *pm, char *out, size_t cap);

#define STORE__ANCHOR_FILE "anchor.safetensors"
#define STORE__DELTA_FILE "delta.shd"

/* root/run/versions/<v, 10 digits> */
int store__version_dir(const store *s, uint64_t v, char *out, size_t cap);
int store__valid_run(const char *run);

/* Takes the run's lock (flock(LOCK_EX) on R/lock; *fd, close it to let
 * go): one publisher or collector per run at a time, so that version
 * numbers never collide and gc never removes a version a publish is
 * committing (folder renamed in, LATEST not yet moved). */
int store__lock(store *s, int *fd);

/* Removes what publishers that no longer run left under staging/ (every
 * entry is named <...>.<pid>): a publish killed mid-way leaves up to a
 * model's bytes there.  Under the run's lock (gc, publish). */
void store__clean_staging(store *s);

/* store.c's publish steps, shared with publish_mem.c. */
int store__write_manifest(store *s, const char *dir, const store_version *m);
int store__write_latest(store *s, uint64_t v);
/* The last steps of a publish, once the staged folder `stage` holds the
 * payload and manifest of version v (rc: how staging went): fsync it,
 * rename it to `final`, fsync the versions folder, move LATEST.  On any
 * failure the staged folder goes, and so does `final` unless LATEST already
 * names v; the error names the run, v and what LATEST names.  `how` is
 * added after the run's name in messages (" from memory"). */
int store__commit_version(store *s, int rc, const char *stage, const char *final, uint64_t v, uint64_t latest,
                          const char *how);
/* The anchor version v chains back to (v itself for an anchor). */
int store__anchor_of(store *s, uint64_t v, uint64_t *out);
/* One delta from `from` to `to` across to's anchor (from is below it),
 * made from the two versions' checkpoints into the squash cache
 * (store_squash_path), where store_plan_make finds it: a replica holding
 * version n - 1 gets the delta to n even when n is stored as an anchor. */
int store__cross_delta(store *s, uint64_t from, uint64_t to, uint64_t *bytes);

/* Copies src to an open fd, hashing what it copies; fsyncs fd.  pg
 * (optional) is advanced in bytes of src. */
int store__copy_hash(const char *src, int fd, const char *dst_name, sh_hash128 *h, uint64_t *size,
                     sh_progress *pg);
/* Streams a file through xxh3-128. */
int store__hash_file(const char *path, sh_hash128 *h, uint64_t *size);

/* The delta codec (src/weights/delta), behind one seam so that the store's protocol
 * does not depend on the codec's internals.  Each writes `out` durably. */
int store__delta_make(const char *prev, const char *next, const char *out, sh_progress *pg);
int store__delta_apply(const char *prev, const char *delta, const char *out);
/* The same with the next version already opened (a folder's single view). */
struct ckpt;
int store__delta_make_ckpt(const char *prev, const struct ckpt *next, const char *out, sh_progress *pg);
int store__delta_squash(const char *const *deltas, size_t n, const char *out);
/* Rebuilds the single-file target of delta_path (`size` bytes) from a base
 * already parsed in memory into a new file `out`, verified against the
 * delta's digests.  Not fsynced: the caller makes it durable. */
int store__delta_build(const struct ckpt *base, const char *delta_path, uint64_t size,
                       const char *out);
/* Applies delta_path in place to img (`size` bytes), a copy of its base in
 * memory: only changed elements are written; verified; on failure img
 * still holds the base. */
struct delta_ip_cache;
/* threads: delta_opts.threads (0: all cores); chunk_done / arg:
 * delta_opts.chunk_done (NULL: none). */
int store__delta_patch_mem(uint8_t *img, uint64_t size, const char *delta_path, struct delta_ip_cache *cache,
                           int threads, void (*chunk_done)(void *, size_t, uint64_t, uint32_t), void *arg);

#endif
