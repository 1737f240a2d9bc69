/* Internal to src/weights/store: a replica's state, shared by models.c (model files
 * and ACTIVE), activate.c (building, verifying and activating versions) and
 * replica.c (threads and the public API). */
#ifndef SHOAL_STORE_REPLICA_H
#define SHOAL_STORE_REPLICA_H

#include <pthread.h>

#include "shoal/ckpt.h"
#include "shoal/delta.h"
#include "weights/store/store_int.h"

typedef struct model {
    int refs;
    uint64_t version;
    uint64_t size;
    uint8_t *map; /* a mapping of fd, not populated: resident as leases read it */
    int fd;
    ckpt *ck; /* parsed once, before activation: leases get tensor views */
    char path[4096];
    struct model *fp8; /* --fp8: the FP8 serving copy of the same version */
    int keep;          /* ACTIVE may still name this file: never delete it */
} model;

typedef struct pending {
    store_version ver;
    store_timeline tl; /* receive steps filled by the push thread */
    char payload[4096];
    double retry_at, pause; /* after a build that failed for want of room: when to try again */
    struct pending *next;
} pending;

struct store_replica {
    store_replica_config cfg;
    char dir[4096], models[4096], staging[4096], spool[4096], active_path[4096];
    char run[65];
    store *st;
    int lock_fd; /* flock on DIR/LOCK, held while open (-1: none) */
    bcast_node *node;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    model *active;
    uint64_t done_version; /* the newest activation that is complete (durable) */
    uint64_t store_latest; /* the store's LATEST when last read (under mu) */
    double activated_at, pause_max_ms;
    uint64_t activations, failures;
    char last_error[512];
    pending *queue, **tail;
    int stop;
    int have_net, have_apply;
    pthread_t net_thread, apply_thread;
    bcast_stats push;
    uint64_t fp8_blocks; /* blocks re-quantised by the last FP8 update */
    store_timeline recv_tl; /* push thread: the payload being received */
    store_timeline timeline; /* the newest activation's */
    double last_push_activity, next_store_check; /* monotonic seconds */
    /* Apply thread only (activate.c): LATEST's version whose build from the
     * store last failed (0: none), when to try it again, and the pause
     * (doubled per failure, 0.1 s to STORE__RETRY_MAX_S). */
    uint64_t sync_failed;
    double sync_retry_at, sync_backoff;
    /* Apply thread only (activate.c): the in-memory image of version
     * img_version (0: none) that the next delta patches in place. */
    uint8_t *img;
    size_t img_cap;
    uint64_t img_size, img_version;
    int img_wanted; /* load the image when the push tree is quiet */
    int img_drop;   /* under mu: a payload of a model's size is coming (an
                     * anchor): free the image first, so that the two never
                     * take memory together (the image is loaded again
                     * from the version it brings) */
    delta_ip_cache ipc;  /* chunk digests of the image, chunks the last applies wrote */
    uint64_t ip_base[2]; /* the bases of those applies ([0]: the last) */
    model *prev;    /* the model the last activation replaced (recycled; under mu) */
    /* Apply thread only (activate.c): a version built in the image and not
     * activated, because a newer one is announced (0: none), since when. */
    store_version staged;
    store_timeline staged_tl;
    double staged_since;
    store_version staged_anchor; /* a staged anchor kept whole as a model file (version 0: none) */
    char staged_anchor_path[4096];
};

/* models.c */
int store__model_open(const char *path, uint64_t version, model **out);
void store__model_free(model *m, int unlink_files);
void store__model_unref(store_replica *r, model *m);
int store__model_path(store_replica *r, uint64_t v, char *out, size_t cap);
int store__fp8_path(store_replica *r, uint64_t v, char *out, size_t cap);
int store__make_fp8(store_replica *r, uint64_t v, const char *bf16, const model *prev,
                    const char *delta_path, char *out, size_t cap);
int store__model_open_fp8(model *m, const char *fp8);
int store__write_active(store_replica *r, const store_version *v, double at);
int store__restore_active(store_replica *r);
void store__clean_leftovers(store_replica *r);
/* activate.c */
void store__replica_error(store_replica *r);
/* Takes r->prev's file for `out` (renames it there) when nothing else uses
 * it: no lease, and no other name (a pushed anchor is a hard link to the
 * push node's spool file, which the node may still forward from).  Returns
 * 1 when `out` is now that file (*version, if given, the version it held),
 * else 0; r->prev is let go either way.  Any thread. */
int store__take_prev(store_replica *r, const char *out, uint64_t *version);
int store__apply_pending(store_replica *r, pending *p);
/* A staged version (built in the image, not activated) is due once the
 * tree has been quiet a while or it waited too long; then it is written
 * and activated. */
int store__staged_due(store_replica *r, double now, double last_push);
int store__activate_staged(store_replica *r);
/* Builds and activates LATEST's version from the store when it is newer
 * than the active one.  A version whose build failed (a damaged payload, a
 * full disk) is tried again after a pause that doubles up to
 * STORE__RETRY_MAX_S, or at once when LATEST moves on: without the pause
 * the replica rebuilt it at every poll (50 times a second), writing and
 * deleting a whole model each time and logging each failure. */
#define STORE__RETRY_MAX_S 5.0
int store__sync_from_store(store_replica *r);
/* Idle work on the apply thread: loads the image of the active version
 * once the push tree has been `quiet` (no chunk for STORE__IDLE_S, so that
 * it takes no CPU from chunks still being forwarded).  Returns 1 while
 * there is work left. */
#define STORE__IDLE_S 0.1
int store__prepare_image(store_replica *r, int quiet);
void store__img_free(store_replica *r);
/* SH_OK when manifest v names the payload o the push node offered and
 * checked (version, kind, size, xxh3); else SH_EMISMATCH naming both.
 * Not for a squash (its manifest is its target's). */
int store__pushed_names(const char *dir, const store_version *v, const bcast_object_info *o);

#endif
