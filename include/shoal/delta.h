/* shoal delta: lossless weight deltas between checkpoints (format in
 * docs/delta-format.md), their composition, and FP8 block quantisation.
 *
 * Two layers.  The file layer (delta_make, delta_apply, delta_squash) takes
 * paths, streams chunk by chunk with a pool of threads, and makes every
 * output appear atomically after verification.  The memory layer works on
 * opened checkpoints and delta images; it is what the store, the rollout
 * workers and the fuzzers call.  Output bytes never depend on the number of
 * threads.  Extra memory is about 10 MiB per thread plus the delta.
 */
#ifndef SHOAL_DELTA_H
#define SHOAL_DELTA_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/ckpt.h"
#include "shoal/common.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

#define DELTA_VERSION 1

typedef struct delta_opts {
    int threads;           /* 0: all cores */
    sh_progress *progress; /* optional: advanced in bytes of target, under a lock */
    /* apply: also hash the whole base and check its recorded digests.  Not
     * needed for safety: every rebuilt tensor is checked against its
     * recorded digest and the delta against its checksum, so a wrong base
     * is refused anyway; this names the base digest in the message. */
    int verify_base;
    /* In-place apply: called, from the thread that patched it, once chunk
     * `item` of the image ([off, off + len)) holds its new bytes and is
     * hashed, before the whole is verified (nothing is known good until
     * the apply returns SH_OK).  A caller copies each chunk out while it
     * is in cache.  Not called for chunks the delta leaves alone. */
    void (*chunk_done)(void *arg, size_t item, uint64_t off, uint32_t len);
    void *chunk_arg;
} delta_opts;

/* What a make or squash produced (all counts over the whole checkpoint). */
typedef struct delta_stats {
    uint64_t target_bytes;  /* tensor bytes of the target */
    uint64_t delta_bytes;   /* size of the delta file */
    uint64_t units;         /* units (elements) in diffed tensors */
    uint64_t changed;       /* of which changed */
    uint64_t tensors_diff, tensors_whole;
    uint64_t chunks[5];     /* by encoding: SAME, SPARSE, DENSE, RAW, ZSTD */
} delta_stats;

/* ---- Memory layer ------------------------------------------------------ */

/* Encodes the delta base -> target into *out (an sh_buf the caller frees).
 * st may be NULL. */
int delta_make_mem(const ckpt *base, const ckpt *target, const delta_opts *o, sh_buf *out,
                   delta_stats *st);

/* A parsed delta: a view over the caller's bytes (kept alive by the caller). */
typedef struct delta delta;
enum { DELTA_NO_CHECKSUM = 1 }; /* skip the trailer (fuzzers only) */
/* Validates the container and the manifest (every rule of the format that
 * does not need the base); *out is owned by the caller (delta_free). */
int delta_parse(const void *buf, size_t len, int flags, delta **out);
void delta_free(delta *d);

/* Applies d to base and writes the single-file target image into out (cap
 * bytes; *len receives its size).  Verifies the base and the target as
 * apply does.  For benchmarks, tests and fuzzing. */
int delta_apply_mem(const ckpt *base, const delta *d, const delta_opts *o, uint8_t *out,
                    size_t cap, size_t *len);
/* Applies d in place to img, a base image of len bytes in memory (a replica
 * holding its weights), when the delta keeps the layout (same header): only
 * changed elements are written and each chunk is hashed once.  Verified like
 * delta_apply_mem; on any failure every write is undone, so img is either
 * the target or unchanged.  SH_EINVAL when the layout changes. */
int delta_apply_mem_inplace(uint8_t *img, size_t len, const delta *d, const delta_opts *o);

/* What an in-place applier keeps between deltas on one image, so that a
 * delta's apply costs what it changes, not the model's size: the digest of
 * every CKPT_CHUNK chunk of every tensor as the image holds it (a chunk the
 * delta leaves alone, SAME, is not hashed again: its digest is the kept
 * one, and the tensor and checkpoint digests are checked as always), and
 * which chunks each of the last two applies wrote.  Chunk i covers image
 * bytes [off[i], off[i] + len[i]).  The caller must reset it (valid = 0)
 * whenever the image changes other than by these applies. */
typedef struct delta_ip_cache {
    size_t n;
    uint64_t *off;
    uint32_t *len;
    sh_hash128 *dig;
    uint8_t *wrote[2]; /* [0]: by the last apply, [1]: by the one before */
    int valid;         /* dig describes the image */
    int applies;       /* applies since dig was last computed whole (wrote[] valid for min(2, applies)) */
} delta_ip_cache;
/* delta_apply_mem_inplace with a cache (NULL: none).  On success the cache
 * describes the target; on failure the image and the cache are unchanged. */
int delta_apply_mem_inplace_cached(uint8_t *img, size_t len, const delta *d, const delta_opts *o,
                                   delta_ip_cache *c);
void delta_ip_cache_free(delta_ip_cache *c);
/* The size of the target image (single-file targets), for delta_apply_mem. */
uint64_t delta_target_size(const delta *d);

/* The baseline sizes are measured against, in the same run: the XOR of the
 * target's tensor bytes with the same-named base tensor's, in target order,
 * compressed by zstd level 1 in 8 MiB blocks, plus a 16-byte hash (what
 * `shoal bench delta` calls xor+zstd-1).  Up to `threads` threads (0: all
 * cores), each with one 8 MiB block and its output in memory. */
int delta_baseline_xor_zstd(const ckpt *base, const ckpt *target, int threads, uint64_t *bytes);

/* ---- File layer -------------------------------------------------------- */

/* BASE and TARGET are .safetensors files or sharded folders. */
int delta_make(const char *base, const char *target, const char *out, const delta_opts *o,
               delta_stats *st);
/* The same from opened checkpoints (a ckpt_single_view() included); out
 * is written atomically, streamed. */
int delta_make_ckpt(const ckpt *base, const ckpt *target, const char *out, const delta_opts *o,
                    delta_stats *st);
/* Writes the target to out (a file or folder, like the target; replaced
 * atomically), or with out == NULL replaces base in place: staged beside it,
 * verified, then renamed over it, so an interruption leaves the old or the
 * new version, never a mix. */
int delta_apply(const char *base, const char *delta_path, const char *out, const delta_opts *o);
/* Composes a chain d[0] (v -> v+1), ..., d[n-1] into one delta v -> v+n
 * without the checkpoints. */
int delta_squash(const char *const *deltas, size_t n, const char *out, const delta_opts *o,
                 delta_stats *st);

/* Per-tensor summary of a delta file as JSON (caller owns the result):
 * {"version", "base_digest", "target_digest", "bytes", "tensors": [{"name",
 * "mode": "diff"|"whole", "dtype", "nbytes", "changed_fraction", "bytes",
 * "encodings": {"SAME": n, ...}}]} */
int delta_inspect(const char *path, json_t **out);

/* ---- FP8 rollout weights ------------------------------------------------ */

#define DELTA_FP8_BLOCK 128

/* The one FP8 block rule, shared by delta_quant_fp8 and the RL engine's
 * in-memory FP8 weights: block (br, bc) of a rows x cols bf16 matrix x (any
 * alignment) is scaled by amax / 448 (amax over its finite magnitudes; 1 when
 * amax is 0 or not finite) and rounded to e4m3, written to
 * q[(r - 128 br) * ldq + (c - 128 bc)].  Returns the scale (dequantised value
 * = e4m3 value x scale).  Edge blocks are partial. */
float delta_fp8_block(const void *x, int64_t rows, int64_t cols, int64_t br, int64_t bc, uint8_t *q,
                      int64_t ldq);

/* What delta_quant_fp8 wrote. */
typedef struct delta_quant_stats {
    uint64_t tensors_quantised; /* BF16 tensors written as F8_E4M3 NAME + F32 NAME_scale_inv */
    uint64_t tensors_copied;    /* the others, copied as they were */
    uint64_t blocks;            /* 128 x 128 blocks quantised (edge blocks partial) */
    uint64_t bytes_in;          /* tensor data read from the source */
    uint64_t bytes_out;         /* tensor data written (fp8 values, scales and copies) */
} delta_quant_stats;

/* Quantises every 2-D BF16 tensor of `in` (except names containing one of the
 * NULL-terminated `keep` substrings) to F8_E4M3 with one F32 scale per
 * 128 x 128 block, stored as NAME and NAME_scale_inv (dequantised weight =
 * fp8 value x scale_inv), as DeepSeek-V3 checkpoints do.  Other tensors are
 * copied.  The output (one file) records the source digest in __metadata__.
 * st (may be NULL) gets what was written. */
int delta_quant_fp8(const char *in, const char *out, const char *const *keep,
                    const delta_opts *o, delta_quant_stats *st);
/* Brings fp8 (quantised from the delta's base) up to new_bf16 (the delta's
 * target), re-quantising only the blocks the delta changed; the result is
 * byte-identical to delta_quant_fp8(new_bf16).  out == NULL: in place. */
int delta_quant_fp8_update(const char *fp8, const char *new_bf16, const char *delta_path,
                           const char *out, const char *const *keep, const delta_opts *o,
                           uint64_t *blocks_requantised);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
