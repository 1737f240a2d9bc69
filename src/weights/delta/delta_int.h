/* Internals of src/weights/delta shared between its files (not public API).
 *
 * entropy.c  varints, bit streams, frequency tables, rANS (pure)
 * chunk.c    encoding and decoding one chunk (pure)
 * format.c   the container and the manifest
 * make.c, apply.c, squash.c, quant.c: the operations */
#ifndef SHOAL_DELTA_INTERNAL_H
#define SHOAL_DELTA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <zstd.h>

#include "shoal/delta.h"

#define DELTA__PROB_BITS 14
#define DELTA__PROB (1u << DELTA__PROB_BITS)
#define DELTA__L (1u << 23)
#define DELTA__MAX_BLOB 100000000ull

enum { DELTA__SAME = 0, DELTA__SPARSE = 1, DELTA__DENSE = 2, DELTA__RAW = 3, DELTA__ZSTD = 4 };
extern const char *const delta__enc_names[5];

/* ---- Varints and bit streams ---------------------------------------- */

/* Appends v as LEB128 at *p (at most 10 bytes). */
uint8_t *delta__put_varint(uint8_t *p, uint64_t v);
/* Reads a varint from [*p, end); SH_EFORMAT naming `what` when malformed. */
int delta__get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v, const char *what);

typedef struct {
    uint8_t *p, *end;
    uint64_t acc;
    unsigned n;
    int overflow;
} delta__bw;
void delta__bw_put(delta__bw *w, uint64_t bits, unsigned n); /* n <= 62 */
/* The common case inline: n <= 32 and room for 8 more bytes. */
static inline void delta__bw_put_fast(delta__bw *w, uint64_t bits, unsigned n)
{
    if (n > 32 || w->end - w->p < 8) {
        delta__bw_put(w, bits, n);
        return;
    }
    w->acc |= bits << w->n; /* w->n < 8 here, so nothing is lost */
    w->n += n;
    uint64_t a = w->acc;
    memcpy(w->p, &a, 8);    /* little-endian host: whole bytes go out */
    unsigned bytes = w->n / 8;
    w->p += bytes;
    w->acc = bytes == 8 ? 0 : a >> (8 * bytes);
    w->n -= 8 * bytes;
}
void delta__bw_flush(delta__bw *w);

/* The extra-bit stream as the decoder reads it: a bit position, so that a
 * read is one unaligned 8-byte load and a shift, with no refill branch. */
typedef struct {
    const uint8_t *start;
    size_t len;   /* bytes */
    uint64_t pos; /* bits read, <= 8 * len */
} delta__br;

/* ---- Symbols and tables ------------------------------------------------ */

/* v -> symbol (returned) and extra bits (*nbits of *extra).  Branch-free:
 * whether a gap is below 16 is common and unpredictable. */
static inline unsigned delta__sym(uint64_t v, unsigned *nbits, uint64_t *extra)
{
    unsigned e = 63u - (unsigned)__builtin_clzll(v | 16), big = v >= 16;
    unsigned nb = big ? e - 2 : 0;
    unsigned s = 16 + 4 * (e - 4) + (unsigned)((v >> (e - 2)) & 3);
    *nbits = nb;
    *extra = v & ((1ull << nb) - 1);
    return big ? s : (unsigned)v;
}

typedef struct {
    uint32_t freq[256], cum[257];
} delta__table;

/* What the decoder needs of a symbol, in one 16-byte load: its frequency
 * and start, and its value without the extra bits (value = base | the nb
 * extra bits). */
typedef struct {
    uint16_t freq, cum;
    uint32_t nb;
    uint64_t base;
} delta__dsym;

typedef struct {
    delta__dsym d[256];
    unsigned maxnb;           /* the most extra bits of a symbol in the table */
    uint8_t sym[DELTA__PROB]; /* slot -> symbol: 16 KiB, stays in L1 */
} delta__dtable;

/* Scales counts (not all zero) to frequencies summing to 2^14, keeping every
 * used symbol at least 1. */
void delta__normalize(const uint64_t counts[256], delta__table *t);
/* Serialises t at p (at most 256 * 5 + 2 bytes); returns the new end. */
uint8_t *delta__put_table(uint8_t *p, const delta__table *t);
int delta__get_table(const uint8_t **p, const uint8_t *end, delta__dtable *t, const char *what);

/* ---- rANS -------------------------------------------------------------- */

/* The encoder writes backwards from `end` down to `start`. */
/* Four states take turns (symbol j uses state j mod 4) so that a decoder
 * runs four independent dependency chains at once. */
#define DELTA__STATES 4
typedef struct {
    uint8_t *start, *ptr;
    uint32_t x[DELTA__STATES];
    int overflow;
} delta__renc;

static inline void delta__renc_put(delta__renc *e, int st, const delta__table *t, unsigned s)
{
    uint32_t f = t->freq[s], x = e->x[st];
    uint32_t xmax = ((DELTA__L >> DELTA__PROB_BITS) << 8) * f;
    while (x >= xmax) {
        if (e->ptr == e->start) {
            e->overflow = 1;
            return;
        }
        *--e->ptr = (uint8_t)x;
        x >>= 8;
    }
    e->x[st] = ((x / f) << DELTA__PROB_BITS) + (x % f) + t->cum[s];
}
/* The encoder's division by a frequency done as a multiplication by its
 * reciprocal (exact for states below 2^31), which is what makes encoding
 * fast: x' = (x / f) * 2^14 + x mod f + cum = x + bias + q * (2^14 - f). */
typedef struct {
    uint32_t x_max, rcp_freq, bias, cmpl_freq, rcp_shift;
} delta__esym;
typedef struct {
    delta__esym s[256];
} delta__esyms;

static inline void delta__esyms_init(delta__esyms *e, const delta__table *t)
{
    for (int i = 0; i < 256; i++) {
        uint32_t f = t->freq[i], start = t->cum[i];
        delta__esym *y = &e->s[i];
        y->x_max = ((DELTA__L >> DELTA__PROB_BITS) << 8) * f;
        y->cmpl_freq = DELTA__PROB - f;
        if (f < 2) {
            y->rcp_freq = ~0u;
            y->rcp_shift = 0;
            y->bias = start + DELTA__PROB - 1;
        } else {
            uint32_t shift = 0;
            while (f > (1u << shift)) shift++;
            y->rcp_freq = (uint32_t)(((1ull << (shift + 31)) + f - 1) / f);
            y->rcp_shift = shift - 1;
            y->bias = start;
        }
    }
}

/* One symbol into state x with at least 2 bytes free below *ptr; returns
 * the new state.  At most two bytes go out (x < 2^31 and x_max >= 2^17):
 * it stores two and keeps as many as needed, without branching on the
 * data.  A byte not kept lies below the stream and is overwritten later. */
static inline __attribute__((always_inline)) uint32_t delta__renc_sym(uint32_t x, uint8_t **ptr,
                                                                     const delta__esym *y)
{
    unsigned n = (x >= y->x_max) + ((x >> 8) >= y->x_max);
    uint16_t two = (uint16_t)((x & 0xff) << 8 | ((x >> 8) & 0xff));
    memcpy(*ptr - 2, &two, 2); /* little-endian: ptr[-1] = x & 0xff */
    *ptr -= n;
    x >>= 8 * n;
    uint32_t q = (uint32_t)(((uint64_t)x * y->rcp_freq) >> 32) >> y->rcp_shift;
    return x + y->bias + q * y->cmpl_freq;
}

static inline void delta__renc_put_fast(delta__renc *e, int st, const delta__esym *y)
{
    if (e->ptr - e->start >= 2) {
        e->x[st] = delta__renc_sym(e->x[st], &e->ptr, y);
        return;
    }
    uint32_t x = e->x[st];
    while (x >= y->x_max) {
        if (e->ptr == e->start) {
            e->overflow = 1;
            return;
        }
        *--e->ptr = (uint8_t)x;
        x >>= 8;
    }
    uint32_t q = (uint32_t)(((uint64_t)x * y->rcp_freq) >> 32) >> y->rcp_shift;
    e->x[st] = x + y->bias + q * y->cmpl_freq;
}

/* Writes the final state; the stream is [e->ptr, end). */
void delta__renc_finish(delta__renc *e);

/* ---- Chunks ------------------------------------------------------------ */

/* Per-thread buffers; about 10 MiB for 2 MiB chunks. */
typedef struct delta__scratch {
    uint32_t *pos;      /* changed positions (sparse candidates) */
    uint64_t *d;        /* their values */
    size_t cap;         /* entries of pos and d */
    uint8_t *out;       /* candidate payload */
    uint8_t *rbuf;      /* rANS staging (written backwards) */
    uint8_t *bits;      /* extra bits staging */
    size_t out_cap;
    uint8_t *zbuf;      /* zstd output */
    size_t zcap;
    uint8_t *tmp, *tmp2; /* chunk-sized buffers for callers */
    ZSTD_CCtx *zc;
    ZSTD_DCtx *zd;
    delta__dtable *g, *v;
    void *ho, *hn;      /* XXH3 states for streaming chunk digests */
    uint8_t *sym;       /* symbols of a sparse chunk (2 per change) or a dense one (1 per unit) */
} delta__scratch;

int delta__scratch_init(delta__scratch *s);
int delta__scratch_enc(delta__scratch *s); /* the encoder's buffers */
int delta__scratch_tmp(delta__scratch *s); /* tmp and tmp2 */
void delta__scratch_free(delta__scratch *s);

/* The widest vector scan make may use: 2 AVX-512, 1 AVX2, 0 SSE2 (when the
 * CPU has it).  Every level writes the same delta; tests lower it. */
extern int delta__isa_max;

/* Unit width in bytes for a dtype (1, 2, 4 or 8). */
unsigned delta__unit(ckpt_dtype d);

/* Instantiates a hot loop for each unit width and float-ness: F(W, FL) is
 * called with constants (so that, inlined, each case compiles to its own
 * loop with single-instruction loads) and must return.  Used by the scan of
 * the encoder and the patch of the decoder. */
#define DELTA__BY_UNIT(w, is_float, F)                                                             \
    switch ((w) * 2 + !!(is_float)) {                                                              \
    case 2: F(1, 0);                                                                               \
    case 3: F(1, 1);                                                                               \
    case 4: F(2, 0);                                                                               \
    case 5: F(2, 1);                                                                               \
    case 8: F(4, 0);                                                                               \
    case 9: F(4, 1);                                                                               \
    case 16: F(8, 0);                                                                              \
    default: F(8, 1);                                                                              \
    }

/* Make and apply walk a chunk in pieces of this size, hashing each piece of
 * both sides while it is in cache, so that every byte crosses memory once. */
#define DELTA__PIECE (64u << 10)
/* Changes decoded at a time before they are patched in. */
#define DELTA__BATCH 512

/* Encodes a chunk.  With old == NULL (a whole tensor) only RAW or ZSTD are
 * chosen.  *payload points into the scratch or at `new` (valid until the next
 * call); *changed counts differing units; *odig and *ndig get the chunk
 * digests of old (unless NULL) and new. */
int delta__encode_chunk(delta__scratch *s, unsigned w, int is_float, const uint8_t *old,
                        const uint8_t *new, size_t nbytes, int *enc, const uint8_t **payload,
                        size_t *len, uint64_t *changed, sh_hash128 *odig, sh_hash128 *ndig);

/* Encodes acc (plain w-byte differences, as the sum of a chain) as SAME,
 * SPARSE or DENSE; zeros is nbytes of zero bytes. */
int delta__encode_diff(delta__scratch *s, unsigned w, const uint8_t *zeros, const uint8_t *acc,
                       size_t nbytes, int *enc, const uint8_t **payload, size_t *len,
                       uint64_t *changed);

/* Streaming decoder of the changes of a SPARSE or DENSE chunk. */
typedef struct {
    int dense;
    const uint8_t *p, *end; /* rANS stream */
    uint32_t x[DELTA__STATES];
    uint64_t sym;           /* symbols decoded so far (picks the state) */
    const delta__dtable *g, *v;
    delta__br br;
    uint64_t left;          /* symbols (pairs for sparse) still to decode */
    uint64_t n;             /* units in the chunk */
    uint64_t next;          /* next candidate position */
    uint64_t zmax;          /* values must be <= zmax */
    uint64_t fast_lim;      /* the fast loops run while br.pos < fast_lim */
    const char *what;
} delta__dec;

int delta__dec_open(delta__dec *d, int enc, const uint8_t *payload, size_t len, uint64_t n,
                    unsigned w, delta__scratch *s, const char *what);
/* Up to max changes into pos/z (dense: every unit, z possibly 0). */
int delta__dec_next(delta__dec *d, uint32_t *pos, uint64_t *z, size_t max, size_t *got);
/* Checks that the streams ended exactly. */
int delta__dec_close(delta__dec *d);

/* Decodes a chunk into out (nbytes; holding the base chunk for SAME, SPARSE
 * and DENSE) and counts the changed units into *changed when non-NULL. */
int delta__decode_chunk(delta__scratch *s, int enc, const uint8_t *payload, size_t len,
                        unsigned w, int is_float, uint8_t *out, size_t nbytes, uint64_t *changed,
                        const char *what);

/* For SAME, SPARSE and DENSE: out = base patched, with the chunk digests
 * of out and (unless bdig is NULL) of base.  out == base patches in place;
 * then *applied (if not NULL) counts the changes decoded and written (in
 * stream order), also on failure. */
int delta__decode_fused(delta__scratch *s, int enc, const uint8_t *payload, size_t len,
                        unsigned w, int is_float, const uint8_t *base, uint8_t *out,
                        size_t nbytes, sh_hash128 *bdig, sh_hash128 *odig, uint64_t *applied,
                        const char *what);

/* d (as a signed w-byte value, zigzagged) -> its two's-complement value. */
static inline uint64_t delta__unzig(uint64_t z) { return (z >> 1) ^ (0 - (z & 1)); }
static inline uint64_t delta__zig(uint64_t d, unsigned bits)
{
    int64_t s = (int64_t)(d << (64 - bits)) >> (64 - bits); /* sign-extend */
    return ((uint64_t)s << 1) ^ (uint64_t)(s >> 63);
}
static inline uint64_t delta__mask(unsigned w) { return w == 8 ? ~0ull : (1ull << (8 * w)) - 1; }
/* ord(u) = u below S = 2^(b-1), else (S - 1 - u) mod 2^b, which is u with
 * every bit but the top one flipped: computed without a branch, since the
 * sign of a weight is as good as random. */
static inline uint64_t delta__ord(uint64_t u, unsigned w)
{
    unsigned top = 8 * w - 1;
    return u ^ ((0 - ((u >> top) & 1)) & ((1ull << top) - 1));
}

/* ---- The parsed delta (format.c) ------------------------------------------ */

typedef struct {
    int enc;
    uint64_t off, len;
} delta__chunk;

typedef struct {
    const char *name, *base; /* base NULL: whole */
    ckpt_dtype dtype;
    uint64_t nbytes, changed;
    sh_hash128 digest, base_digest;
    size_t nchunks;
    delta__chunk *chunks;
    uint32_t file;
} delta__tensor;

typedef struct {
    const char *name;
    uint64_t hoff, hlen;   /* header blob */
    uint8_t *header;       /* decompressed (owned) */
    size_t header_len;
    ckpt_tensor *t;        /* parsed header: tensors in offset order */
    size_t nt;
    size_t first;          /* its first tensor in delta.tensors */
} delta__file;

struct delta {
    const uint8_t *buf;
    size_t len;
    json_t *manifest;
    const uint8_t *payload;
    uint64_t payload_len;
    sh_hash128 base_digest, target_digest;
    int base_sharded, target_sharded;
    uint8_t *index;        /* decompressed index JSON (sharded targets) */
    size_t index_len;
    delta__file *files;
    size_t nfiles;
    delta__tensor *tensors;
    size_t ntensors;
};

/* A piece of the payload; the payload is its pieces one after the other. */
typedef struct {
    const void *p;
    size_t len;
} delta__seg;
/* Serialises a delta into *out (allocated once, at its final size):
 * manifest JSON, then the payload, then the trailer. */
int delta__write_container(const json_t *manifest, const delta__seg *seg, size_t nseg,
                           sh_buf *out);
/* The same, streamed to fd (`name` in messages) with no copy of the
 * payload; *len gets the bytes written. */
int delta__write_container_fd(const json_t *manifest, const delta__seg *seg, size_t nseg, int fd,
                              const char *name, uint64_t *len);
/* Maps a delta file read-only (page cache, not anonymous memory); a file
 * shorter than the smallest delta is SH_EFORMAT. */
int delta__map_file(const char *path, const uint8_t **buf, size_t *len);
void delta__unmap_file(const uint8_t *buf, size_t len);
/* zstd-compresses bytes into the payload and returns the [off, len] array. */
json_t *delta__blob(sh_buf *payload, const void *data, size_t len);
json_t *delta__hex(sh_hash128 h);

/* Thread pool helper: runs fn(arg, i) for i in [0, n) on up to threads
 * threads, each with its own scratch; stops at the first error. */
typedef int (*delta__work_fn)(void *arg, size_t i, delta__scratch *s);
int delta__parallel(int threads, size_t n, delta__work_fn fn, void *arg);
/* Adds n to *done and shows it on o->progress (when o and it are set);
 * the pool's threads share done under mu. */
void delta__progress(const delta_opts *o, pthread_mutex_t *mu, uint64_t *done, uint64_t n);

#endif
