/* shoal ckpt: safetensors checkpoints (one file, or a sharded folder).
 *
 * A checkpoint opened with ckpt_open() is a read-only view over mmap'd files:
 * every tensor's bytes stay in the page cache and nothing is copied.  The
 * reader validates every header strictly (see docs/safetensors.md) and turns
 * any violation into SH_EFORMAT with a message naming the file, the tensor
 * and the rule broken; a checkpoint that opens is safe to index.
 *
 * Writing goes through a streaming writer: the header is fixed up front from
 * the tensor list, and tensor bytes are then written at any offset, in any
 * order, from any thread, so that no caller needs a whole checkpoint in
 * memory.  The file appears atomically on commit (temporary, fsync, rename).
 */
#ifndef SHOAL_CKPT_H
#define SHOAL_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

/* Dtypes of the safetensors format, declared in the reference
 * implementation's order: its writer sorts tensors by this order, largest
 * first, then by name (ckpt_writer_open() does the same). */
typedef enum ckpt_dtype {
    CKPT_BOOL, CKPT_F4, CKPT_F6_E2M3, CKPT_F6_E3M2, CKPT_U8, CKPT_I8, CKPT_F8_E5M2,
    CKPT_F8_E4M3, CKPT_F8_E8M0, CKPT_I16, CKPT_U16, CKPT_F16, CKPT_BF16, CKPT_I32,
    CKPT_U32, CKPT_F32, CKPT_C64, CKPT_F64, CKPT_I64, CKPT_U64,
    CKPT_DTYPE_COUNT
} ckpt_dtype;

/* "BF16", ... ; NULL for an out-of-range value. */
const char *ckpt_dtype_name(ckpt_dtype d);
/* Parses a dtype name; SH_EFORMAT naming `ctx` if unknown. */
int ckpt_dtype_parse(const char *s, ckpt_dtype *out, const char *ctx);
/* Size of one element in bits (4 for F4, 6 for F6_*, else 8 x bytes). */
unsigned ckpt_dtype_bits(ckpt_dtype d);
/* 1 for BF16, F16, F32, F64 and the F8 formats: dtypes whose bit patterns
 * the delta codec orders as numbers (adjacent values differ by one). */
int ckpt_dtype_is_float(ckpt_dtype d);

/* ---- Number conversions (round to nearest, ties to even) -------------- */
float ckpt_bf16_to_f32(uint16_t h);
uint16_t ckpt_f32_to_bf16(float f);     /* NaN stays NaN (quiet) */
float ckpt_f16_to_f32(uint16_t h);
uint16_t ckpt_f32_to_f16(float f);      /* overflow -> inf */
float ckpt_e4m3_to_f32(uint8_t b);      /* OCP e4m3fn: no inf, NaN = 0x7f/0xff */
uint8_t ckpt_f32_to_e4m3(float f);      /* saturates to +-448; NaN -> 0x7f */
float ckpt_e5m2_to_f32(uint8_t b);
uint8_t ckpt_f32_to_e5m2(float f);      /* overflow -> inf */
/* Element i of a numeric tensor as a double (0 for non-numeric dtypes). */
double ckpt_elem_f64(ckpt_dtype d, const uint8_t *data, uint64_t i);

/* ---- Reading --------------------------------------------------------- */

#define CKPT_MAX_DIMS 16
#define CKPT_MAX_HEADER 100000000ull /* as the reference implementation */
#define CKPT_INDEX_NAME "model.safetensors.index.json"

typedef struct ckpt_tensor {
    const char *name;   /* owned by the checkpoint */
    ckpt_dtype dtype;
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    uint64_t numel;
    uint64_t nbytes;
    uint32_t file;      /* index into ckpt.files */
    uint64_t offset;    /* of the first byte, from the start of its file */
    const uint8_t *data; /* nbytes read-only bytes (NULL in writer specs) */
} ckpt_tensor;

typedef struct ckpt_file {
    char *name;         /* base name: "model.safetensors", shard names */
    char *path;         /* as opened */
    const uint8_t *map; /* the whole file */
    uint64_t size;
    uint64_t header_len; /* 8 + JSON length: where the data buffer starts */
    size_t first, count; /* its tensors: ckpt.tensors[first .. first+count) */
    int owns_map;
} ckpt_file;

/* A checkpoint: tensors ordered by file, then by offset (file byte order). */
typedef struct ckpt {
    char *path;
    int is_folder;         /* a folder with model.safetensors.index.json */
    ckpt_file *files;      /* shards in the order their names sort */
    size_t nfiles;
    ckpt_tensor *tensors;
    size_t ntensors;
    char *index_json;      /* the index file's bytes (folders), else NULL */
    size_t index_len;
    json_t *metadata;      /* __metadata__ of files[0] (NULL if none) */
    size_t *by_name;       /* tensor indices sorted by name (ckpt_find) */
} ckpt;

/* Opens a .safetensors file or a sharded folder; *out is owned by the
 * caller (ckpt_close).  Any violation is SH_EFORMAT naming file and tensor. */
int ckpt_open(const char *path, ckpt **out);
/* Parses a safetensors image in memory (not copied: buf must outlive *out).
 * `name` is used in messages.  This is what the fuzzer drives. */
int ckpt_open_mem(const void *buf, size_t len, const char *name, ckpt **out);
void ckpt_close(ckpt *c);
/* The tensor named `name`, or NULL. */
const ckpt_tensor *ckpt_find(const ckpt *c, const char *name);
/* A __metadata__ value of files[0], or NULL. */
const char *ckpt_meta(const ckpt *c, const char *key);
/* Total bytes of all tensors, and of all files. */
uint64_t ckpt_data_bytes(const ckpt *c);
uint64_t ckpt_file_bytes(const ckpt *c);

/* Validates one safetensors header (the 8-byte length and the JSON) against
 * a data buffer of data_len bytes, and returns the tensors in offset order
 * (malloc'd array and names, freed with ckpt_tensors_free).  `ctx` names the
 * file in messages.  *hdr_len gets 8 + JSON length. */
int ckpt_parse_header(const uint8_t *buf, uint64_t len, const char *ctx, ckpt_tensor **out,
                      size_t *n, json_t **metadata, uint64_t *hdr_len);
void ckpt_tensors_free(ckpt_tensor *t, size_t n);
/* The same for a header image alone (exactly 8 + n bytes, no data): the
 * data buffer is taken to be whatever the tensors cover. */
int ckpt_parse_header_only(const uint8_t *hdr, uint64_t len, const char *ctx, ckpt_tensor **out,
                           size_t *n);

/* ---- Digests ----------------------------------------------------------
 * A tensor's digest is xxh3-128 over the concatenated xxh3-128 digests of its
 * CKPT_CHUNK-byte chunks (16 bytes each, low half first, little-endian), so
 * that chunks hash in parallel; a checkpoint's digest is xxh3-128 over the
 * digests of its parts in order (index JSON if any, then per file: its
 * header bytes, then each tensor).  docs/delta-format.md gives the details. */
#define CKPT_CHUNK (2u << 20)
sh_hash128 ckpt_chunk_digest(const void *data, size_t len);
/* Combines nchunks chunk digests into a tensor digest. */
sh_hash128 ckpt_combine_digests(const sh_hash128 *parts, size_t n);
sh_hash128 ckpt_tensor_digest(const void *data, uint64_t nbytes);
/* The whole checkpoint's digest with up to `threads` threads (0: all cores);
 * tensor_digests (optional, ntensors long) receives every tensor's digest. */
int ckpt_digest(const ckpt *c, int threads, sh_hash128 *out, sh_hash128 *tensor_digests);
void ckpt_digest_write(sh_buf *b, sh_hash128 h); /* appends the 16 bytes */

/* ---- Writing ---------------------------------------------------------- */

typedef struct ckpt_writer ckpt_writer;

enum { CKPT_KEEP_ORDER = 1 }; /* lay tensors out in the given order */

/* Starts writing `path` with tensors `specs` (name, dtype, ndim, shape used;
 * the rest ignored) and an optional __metadata__ string map.  Unless
 * CKPT_KEEP_ORDER, tensors are laid out as the reference writer does.  The
 * header is serialised like the reference: compact JSON, __metadata__ first,
 * padded with spaces to a multiple of 8.  *out is owned by the caller until
 * ckpt_writer_commit or ckpt_writer_abort. */
int ckpt_writer_open(const char *path, const ckpt_tensor *specs, size_t n, const json_t *metadata,
                     int flags, ckpt_writer **out);
/* Starts writing `path` with a given header image (8-byte length + JSON),
 * validated and then reproduced byte for byte. */
int ckpt_writer_open_raw(const char *path, const uint8_t *hdr, size_t hdr_len, ckpt_writer **out);
/* The layout chosen: tensors in file order, with their offsets. */
size_t ckpt_writer_count(const ckpt_writer *w);
const ckpt_tensor *ckpt_writer_tensor(const ckpt_writer *w, size_t i);
/* Index of the tensor `name`, or -1. */
long ckpt_writer_find(const ckpt_writer *w, const char *name);
/* Writes len bytes at byte `off` of tensor i.  Thread-safe; every byte of
 * every tensor must be written exactly once before commit. */
int ckpt_writer_put(ckpt_writer *w, size_t i, uint64_t off, const void *data, size_t len);
/* Checks that every byte was written, fsyncs and renames into place; frees w
 * whatever happens. */
int ckpt_writer_commit(ckpt_writer *w);
void ckpt_writer_abort(ckpt_writer *w); /* removes the temporary; NULL ok */

/* Builds a reference-style header image (8-byte length + padded JSON) for
 * tensors already laid out (offsets from the data buffer start in .offset). */
int ckpt_header_build(const ckpt_tensor *t, size_t n, const json_t *metadata, sh_buf *out);
/* Sorts specs in the reference writer's order (dtype descending, name). */
void ckpt_sort_reference(ckpt_tensor *t, size_t n);

/* A sharded folder (or any checkpoint) seen as the single .safetensors
 * file holding its tensors in order, end to end, with the first shard's
 * __metadata__: files[0].map holds only that file's header (files[0].size
 * is the header's length); the tensors' data point into src's mappings, so
 * the view must be closed (ckpt_close) before src.  Nothing is written. */
int ckpt_single_view(const ckpt *src, ckpt **out);
/* The bytes of the file a single view stands for (header and tensors). */
uint64_t ckpt_single_size(const ckpt *view);

/* Writes a whole checkpoint from tensors whose .data point at their bytes. */
int ckpt_save(const char *path, const ckpt_tensor *t, size_t n, const json_t *metadata);

/* ---- Generators (tests, benchmarks) ---------------------------------- */

/* A Llama-shaped bf16 checkpoint of about `params` parameters with Hugging
 * Face names and realistic magnitudes, reproducible from seed. */
int ckpt_synth(const char *path, uint64_t params, uint64_t seed);
/* `steps` Adam steps of size lr with random gradients from the checkpoint at
 * in (bf16) to out.  The fp32 master weights are drawn uniformly within each
 * bf16 weight's rounding interval (where the trainer's master copy lies), the
 * Adam moments from their steady state under unit-variance gradient noise
 * (m ~ N(0, (1-b1)/(1+b1)), v = 1: deep into training), and the result is
 * cast back with round-to-nearest-even.  Streams chunk by chunk. */
int ckpt_step(const char *in, const char *out, double lr, uint64_t steps, uint64_t seed);
/* The same two, advancing pg (sh_progress_start'ed by the caller; its total
 * is set here when 0) in bytes of tensor data written. */
int ckpt_synth_progress(const char *path, uint64_t params, uint64_t seed, sh_progress *pg);
int ckpt_step_progress(const char *in, const char *out, double lr, uint64_t steps, uint64_t seed,
                       sh_progress *pg);

/* ---- Real-shaped checkpoints (tests, benchmarks) ----------------------
 * The tensor names, dtypes and shapes of public model families, from their
 * published configs (src/weights/ckpt/family.c lists the sources), with synthetic
 * values.  Families: "llama3-8b" (untied embedding and head),
 * "qwen2.5-1.5b" (q/k/v biases, tied embedding), "qwen3-30b-a3b" (128
 * experts per layer), "deepseek-v3" (MLA, experts, F8_E4M3 weights with F32
 * NAME_scale_inv per 128 x 128 block), "single" (one 1 GB tensor). */
extern const char *const ckpt_families[]; /* NULL-terminated */

typedef struct ckpt_family_opts {
    uint64_t layers;  /* decoder layers; 0: the published count */
    uint64_t experts; /* routed experts per MoE layer; 0: published */
    uint64_t vocab;   /* 0: published (the embedding keeps its real size) */
    uint32_t shrink;  /* hidden, MLP and head counts divided by this; 0, 1: real */
    uint32_t shards;  /* 0, 1: one file; n: a folder of n shards and its index */
    uint64_t seed;
} ckpt_family_opts;

/* Writes the family's checkpoint to path (a file, or a folder with shards);
 * pg (optional) advances in bytes of tensor data. */
int ckpt_family_write(const char *family, const ckpt_family_opts *o, const char *path,
                      sh_progress *pg);
/* Tensor bytes and count the family would have with these options. */
int ckpt_family_size(const char *family, const ckpt_family_opts *o, uint64_t *bytes,
                     size_t *ntensors);

typedef struct ckpt_train_opts {
    double lr, wd;  /* AdamW learning rate and decoupled weight decay */
    uint64_t steps; /* 0: 1 */
    uint64_t seed;
} ckpt_train_opts;
/* The next version of any checkpoint (file or folder; same layout and
 * headers) as a trainer writes it: every bf16/f16/f32 tensor is an fp32
 * master (drawn inside the stored value's rounding interval) stepped by
 * AdamW and rounded back; every F8_E4M3 tensor with a NAME_scale_inv is
 * dequantised, stepped, and re-quantised with per-block scales from the new
 * block maxima; other dtypes are copied.  Streams; out is replaced. */
int ckpt_family_next(const char *in, const char *out, const ckpt_train_opts *o, sh_progress *pg);

/* ---- For bindings (python/shoal) ---------------------------------------- */
/* The number of tensors of c, and tensor i in file order (NULL past the
 * end); owned by c. */
size_t ckpt_count(const ckpt *c);
const ckpt_tensor *ckpt_tensor_at(const ckpt *c, size_t i);
/* sizeof(ckpt_tensor), so that a binding that mirrors it can check. */
size_t ckpt_tensor_sizeof(void);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
