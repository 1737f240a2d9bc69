/* Internal: objects (one version's payload) held by a push node.
 *
 * An object's bytes live in a file mapped into memory: the root maps the
 * store's payload read-only; other nodes create a spool file of the full size
 * and receive each chunk straight into the mapping, so that forwarding a chunk
 * to children reads the same pages without a copy.  A receiver unmaps a
 * complete object while no child is being sent it (bcast__obj_unmap) and
 * maps it again for the next child (bcast__obj_map). */
#ifndef SHOAL_BCAST_OBJ_H
#define SHOAL_BCAST_OBJ_H

#include <stdint.h>

#include "weights/push/wire_int.h"
#include "shoal/common.h"

typedef struct bcast__obj {
    uint64_t version, base, size;
    int anchor;
    int squash;     /* a squashed delta from `base`; its size and hash are the file's */
    sh_hash128 hash;
    uint32_t chunk_size, nchunks;
    char *manifest; /* NUL-terminated manifest.json text */
    char path[4096];
    int owned;      /* 1: a spool file this node created and deletes */
    int fd;
    uint8_t *map;   /* NULL while unmapped (bcast__obj_unmap) */
    uint8_t *verified;  /* one byte per chunk */
    uint8_t *receiving; /* one byte per chunk: a receive is in flight */
    uint64_t *sums;     /* per-chunk xxh3-64, valid where verified (root: lazily) */
    uint8_t *summed;    /* root: sums[i] computed */
    double *ready_at;   /* monotonic time chunk i was verified here (root: added) */
    uint32_t nverified;
    int complete;   /* every chunk verified and the whole-file hash checked */
    int delivered;  /* on_object was called */
    int refs;       /* children currently being sent this object, and its sends
                     * still in flight (UCX reads their bytes until done) */
    struct bcast__obj *next; /* the node's list, by increasing version */
} bcast__obj;

/* Parses the fields a push node needs from a store manifest (version, kind,
 * base, size, xxh3). */
int bcast__manifest_parse(const char *text, uint64_t *version, uint64_t *base, int *anchor,
                          uint64_t *size, sh_hash128 *hash);

/* The root's object: maps `path` read-only and marks every chunk verified
 * after checking the file's size (not its hash: the store verified it). */
int bcast__obj_from_file(const char *manifest, const char *path, uint32_t chunk_size,
                         bcast__obj **out);
/* The root's squashed delta from `base` to the manifest's version at `path`:
 * its size and hash come from the file (hashed here), the rest from the
 * target version's manifest. */
int bcast__obj_squash(const char *manifest, const char *path, uint64_t base, uint32_t chunk_size,
                      bcast__obj **out);
/* The receiver's spool file for an offer: <spool>/v<version>.part. */
int bcast__obj_spool_path(const bcast__offer *o, const char *spool, char *out, size_t cap);
/* A receiver's object: the spool file `path` of the offered size, created,
 * or (reused = 1) a file already there whose bytes are overwritten.  Its
 * pages are not touched here: bcast__obj_prepare() readies each chunk's. */
int bcast__obj_for_offer(const bcast__offer *o, const char *manifest, size_t manifest_len,
                         const char *path, int reused, bcast__obj **out);
/* Makes chunk i's pages of a receiver's object writable in one call, so
 * that receiving into it takes no page fault per 4 KiB. */
int bcast__obj_prepare(bcast__obj *o, uint32_t i);
/* A receiver's complete object that no child is being sent and nothing is
 * received into: unmapped (its file and descriptor stay, for children and
 * late joiners), so that a node's memory holds the objects in flight, not
 * every one since its newest anchor.  Anything else: left as it is. */
void bcast__obj_unmap(bcast__obj *o);
/* Maps an unmapped object again (read-only) before it is sent. */
int bcast__obj_map(bcast__obj *o);
/* Unmaps, closes, and deletes the spool file if the node owns it. */
void bcast__obj_free(bcast__obj *o);

uint64_t bcast__obj_chunk_off(const bcast__obj *o, uint32_t i);
uint32_t bcast__obj_chunk_len(const bcast__obj *o, uint32_t i);
/* Hashes the whole payload and compares with the manifest's xxh3. */
int bcast__obj_check_hash(const bcast__obj *o);

#endif
