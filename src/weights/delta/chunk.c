/* Encoding and decoding one chunk (docs/delta-format.md, "Chunk
 * encodings").  Pure: buffers in, buffers out.
 *
 * The encoder finds changed units with a 16-byte-wide compare, codes the
 * gaps between them and their zigzagged ord-differences with rANS, and falls
 * back to DENSE when more than a quarter of the units changed, and to ZSTD or
 * RAW when those are smaller (tried only when the difference takes more
 * than a quarter of the chunk's bytes). */
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "weights/delta/delta_int.h"

/* The library's runtime-dispatched xxh3 uses the widest vectors the CPU has
 * (the digests are the same whatever the width). */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#endif

const char *const delta__enc_names[5] = {"SAME", "SPARSE", "DENSE", "RAW", "ZSTD"};

unsigned delta__unit(ckpt_dtype d)
{
    unsigned b = ckpt_dtype_bits(d);
    return b == 16 || b == 32 || b == 64 ? b / 8 : 1;
}

/* Decoding needs only the small buffers; encoding and chunk staging
 * allocate theirs on first use, so that a thread that only applies stays
 * small (and fuzzing stays fast). */
int delta__scratch_init(delta__scratch *s)
{
    memset(s, 0, sizeof *s);
    s->cap = CKPT_CHUNK / 4 + 16; /* sparse holds at most a quarter of 1-byte units */
    s->out_cap = CKPT_CHUNK + 4096;
    s->zcap = ZSTD_compressBound(CKPT_CHUNK);
    s->zd = ZSTD_createDCtx();
    s->g = malloc(sizeof *s->g);
    s->v = malloc(sizeof *s->v);
    s->ho = XXH3_createState();
    s->hn = XXH3_createState();
    if (!s->zd || !s->g || !s->v || !s->ho || !s->hn) {
        delta__scratch_free(s);
        return sh_err(SH_ENOMEM, "out of memory for delta buffers");
    }
    return SH_OK;
}

int delta__scratch_enc(delta__scratch *s)
{
    if (s->zc) return SH_OK;
    s->pos = malloc((s->cap + 64) * sizeof *s->pos); /* the AVX-512 scan's stores */
    s->d = malloc(s->cap * sizeof *s->d);
    s->out = malloc(s->out_cap);
    s->rbuf = malloc(s->out_cap);
    s->bits = malloc(s->out_cap);
    s->zbuf = malloc(s->zcap);
    s->sym = malloc(CKPT_CHUNK + 2 * s->cap); /* a dense chunk's units (1 byte each), or 2 per sparse change */
    s->zc = ZSTD_createCCtx();
    if (!s->pos || !s->d || !s->out || !s->rbuf || !s->bits || !s->zbuf || !s->sym || !s->zc) {
        ZSTD_freeCCtx(s->zc);
        s->zc = NULL;
        return sh_err(SH_ENOMEM, "out of memory for delta buffers");
    }
    return SH_OK;
}

int delta__scratch_tmp(delta__scratch *s)
{
    if (!s->tmp) s->tmp = malloc(CKPT_CHUNK);
    if (!s->tmp2) s->tmp2 = malloc(CKPT_CHUNK);
    return s->tmp && s->tmp2 ? SH_OK : sh_err(SH_ENOMEM, "out of memory for delta buffers");
}

void delta__scratch_free(delta__scratch *s)
{
    free(s->pos), free(s->d), free(s->out), free(s->rbuf), free(s->bits), free(s->zbuf);
    free(s->tmp), free(s->tmp2), free(s->g), free(s->v), free(s->sym);
    XXH3_freeState(s->ho);
    XXH3_freeState(s->hn);
    ZSTD_freeCCtx(s->zc);
    ZSTD_freeDCtx(s->zd);
    memset(s, 0, sizeof *s);
}

/* The hot loops are instantiated for each unit width (always_inline with a
 * constant w), so that loads are single instructions, not memcpy calls. */
#define DELTA__HOT static inline __attribute__((always_inline))

DELTA__HOT uint64_t delta__load(const uint8_t *p, unsigned w)
{
    switch (w) {
    case 1: return *p;
    case 2: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    default: {
        uint64_t v;
        memcpy(&v, p, 8); /* little-endian host */
        return v;
    }
    }
}

DELTA__HOT uint64_t delta__diff(const uint8_t *o, const uint8_t *n, unsigned w, int is_float)
{
    uint64_t a = delta__load(o, w), b = delta__load(n, w);
    if (is_float) a = delta__ord(a, w), b = delta__ord(b, w);
    return (b - a) & delta__mask(w);
}

/* The changes found so far.  The scan works on a local copy: stores to pos
 * and d could alias anything reached through the scratch, and would force
 * k and the pointers back to memory at every change. */
typedef struct {
    uint32_t *pos;
    uint64_t *d;
    size_t k, cap;
    size_t pf_end; /* the chunk's end: the next piece is prefetched below it */
} delta__found;

/* While the scan works on the block at byte i, the block one piece ahead
 * is fetched from memory: the next piece's hashing then reads from cache,
 * and the scan's arithmetic overlaps the memory traffic instead of waiting
 * for it.  (Make is otherwise hash-from-memory, then compute, in turns.) */
#define DELTA__PREFETCH_NEXT(f, o, n, i)                                                           \
    do {                                                                                           \
        if ((i) + DELTA__PIECE < (f)->pf_end) {                                                   \
            __builtin_prefetch((o) + (i) + DELTA__PIECE, 0, 2);                                    \
            __builtin_prefetch((n) + (i) + DELTA__PIECE, 0, 2);                                    \
        }                                                                                          \
    } while (0)

/* Records the differing units of a 64-byte block at unit index base; the
 * mask has one bit per differing byte.  Returns 0 when the list is full. */
DELTA__HOT int delta__record(delta__found *f, uint64_t m, size_t base, const uint8_t *o,
                             const uint8_t *n, unsigned w, int is_float)
{
    uint64_t um = (1ull << w) - 1;
    while (m) {
        unsigned ui = (unsigned)__builtin_ctzll(m) / w;
        if (f->k == f->cap) return 0;
        f->pos[f->k] = (uint32_t)(base + ui);
        f->d[f->k] = delta__diff(o + ui * w, n + ui * w, w, is_float);
        f->k++;
        m &= ~(um << (ui * w));
    }
    return 1;
}

/* The tail of a range, below 64 bytes, byte by byte. */
DELTA__HOT int delta__scan_tail(delta__found *f, const uint8_t *o, const uint8_t *n, size_t i,
                                size_t end, unsigned w, int is_float)
{
    uint64_t m = 0;
    for (size_t b = 0; b < end - i; b++) m |= (uint64_t)(o[i + b] != n[i + b]) << b;
    return !m || delta__record(f, m, i / w, o + i, n + i, w, is_float);
}

/* Finds the changed units of bytes [i, end) into f after the f->k already
 * there; returns 0 when more than f->cap units changed.  Most
 * 64-byte blocks are unchanged and cost two or four compares. */
DELTA__HOT int delta__scan(delta__found *f, const uint8_t *o, const uint8_t *n, size_t i,
                           size_t end, unsigned w, int is_float)
{
    delta__found l = *f; /* kept in registers */
    int ok = 1;
#ifdef __SSE2__
    for (; i + 64 <= end; i += 64) {
        DELTA__PREFETCH_NEXT(&l, o, n, i);
        __m128i e0 = _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(o + i)),
                                    _mm_loadu_si128((const __m128i *)(n + i)));
        __m128i e1 = _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(o + i + 16)),
                                    _mm_loadu_si128((const __m128i *)(n + i + 16)));
        __m128i e2 = _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(o + i + 32)),
                                    _mm_loadu_si128((const __m128i *)(n + i + 32)));
        __m128i e3 = _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(o + i + 48)),
                                    _mm_loadu_si128((const __m128i *)(n + i + 48)));
        __m128i all = _mm_and_si128(_mm_and_si128(e0, e1), _mm_and_si128(e2, e3));
        if (_mm_movemask_epi8(all) == 0xffff) continue;
        uint64_t m = (uint64_t)(uint16_t)_mm_movemask_epi8(e0) |
                     (uint64_t)(uint16_t)_mm_movemask_epi8(e1) << 16 |
                     (uint64_t)(uint16_t)_mm_movemask_epi8(e2) << 32 |
                     (uint64_t)(uint16_t)_mm_movemask_epi8(e3) << 48;
        if (!(ok = delta__record(&l, ~m, i / w, o + i, n + i, w, is_float))) break;
    }
#endif
    for (; ok && i + 64 <= end; i += 64) ok = delta__scan_tail(&l, o, n, i, i + 64, w, is_float);
    if (ok && i < end) ok = delta__scan_tail(&l, o, n, i, end, w, is_float);
    f->k = l.k;
    return ok;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DELTA__HAVE_AVX2 1
/* The same with 32-byte compares, for CPUs that have AVX2 (checked at run
 * time; the output is identical). */
__attribute__((target("avx2"))) static inline __attribute__((always_inline)) int
delta__scan_avx2(delta__found *f, const uint8_t *o, const uint8_t *n, size_t i, size_t end,
                 unsigned w, int is_float)
{
    delta__found l = *f; /* kept in registers */
    int ok = 1;
    for (; i + 64 <= end; i += 64) {
        DELTA__PREFETCH_NEXT(&l, o, n, i);
        __m256i e0 = _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(o + i)),
                                       _mm256_loadu_si256((const __m256i *)(n + i)));
        __m256i e1 = _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(o + i + 32)),
                                       _mm256_loadu_si256((const __m256i *)(n + i + 32)));
        uint64_t m = (uint64_t)(uint32_t)_mm256_movemask_epi8(e0) |
                     (uint64_t)(uint32_t)_mm256_movemask_epi8(e1) << 32;
        if (m == ~0ull) continue;
        if (!(ok = delta__record(&l, ~m, i / w, o + i, n + i, w, is_float))) break;
    }
    if (ok && i < end) ok = delta__scan_tail(&l, o, n, i, end, w, is_float);
    f->k = l.k;
    return ok;
}

__attribute__((target("avx2"))) static int delta__scan_w_avx2(delta__found *f, const uint8_t *o,
                                                             const uint8_t *n, size_t i,
                                                             size_t end, unsigned w, int is_float)
{
#define DELTA__SCAN(W, F) return delta__scan_avx2(f, o, n, i, end, W, F)
    DELTA__BY_UNIT(w, is_float, DELTA__SCAN)
#undef DELTA__SCAN
}
/* With AVX-512 the scan has no branch per block: one compare gives a mask
 * with a bit per unit, and each 16 bits of it compress the matching unit
 * indices into a register that is stored whole at the end of the list
 * (the list has 64 entries of room past its capacity for that).  A block
 * that changed and one that did not cost the same, so a change rate that
 * leaves a third of the blocks changed no longer mispredicts.  The values
 * are read in a second pass over the new entries, from cache.  (The
 * register form of vpcompressd: the form that stores to memory is
 * microcoded and slow on some CPUs.) */
#define DELTA__AVX512 "avx512f,avx512bw,avx512cd"
__attribute__((target(DELTA__AVX512))) static inline __attribute__((always_inline)) size_t
delta__compress16(uint32_t *pos, size_t k, __m512i idx, unsigned m)
{
    _mm512_storeu_si512(pos + k, _mm512_maskz_compress_epi32((__mmask16)m, idx));
    return k + (unsigned)__builtin_popcount(m & 0xffff);
}

__attribute__((target(DELTA__AVX512))) static inline __attribute__((always_inline)) int
delta__scan_avx512(delta__found *f, const uint8_t *o, const uint8_t *n, size_t i, size_t end,
                   unsigned w, int is_float)
{
    delta__found l = *f; /* kept in registers */
    uint32_t *pos = l.pos;
    size_t k = l.k, k0 = l.k;
    int ok = 1;
    const __m512i s16 = _mm512_set1_epi32(16), s8 = _mm512_set1_epi32(8);
    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32((int)(i / w)),
                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                     14, 15));
    for (; i + 64 <= end; i += 64) {
        DELTA__PREFETCH_NEXT(&l, o, n, i);
        __m512i a = _mm512_loadu_si512(o + i), b = _mm512_loadu_si512(n + i);
        uint64_t m = w == 1 ? _mm512_cmpneq_epi8_mask(a, b)
                   : w == 2 ? _mm512_cmpneq_epi16_mask(a, b)
                   : w == 4 ? _mm512_cmpneq_epi32_mask(a, b)
                            : _mm512_cmpneq_epi64_mask(a, b);
        for (unsigned q = 0; q < 64 / w; q += 16) { /* 16 units at a time, 8 when w = 8 */
            k = delta__compress16(pos, k, idx, (unsigned)(m >> q) & 0xffff);
            idx = _mm512_add_epi32(idx, w == 8 ? s8 : s16);
        }
        if (__builtin_expect(k > l.cap, 0)) {
            ok = 0;
            break;
        }
    }
    if (ok) {
        for (size_t j = k0; j < k; j++)
            l.d[j] = delta__diff(o + (size_t)pos[j] * w, n + (size_t)pos[j] * w, w, is_float);
        l.k = k;
        if (i < end) ok = delta__scan_tail(&l, o, n, i, end, w, is_float);
    }
    f->k = ok ? l.k : k;
    return ok;
}

__attribute__((target(DELTA__AVX512))) static int delta__scan_w_avx512(delta__found *f, const uint8_t *o,
                                                                    const uint8_t *n, size_t i,
                                                                    size_t end, unsigned w,
                                                                    int is_float)
{
#define DELTA__SCAN(W, F) return delta__scan_avx512(f, o, n, i, end, W, F)
    DELTA__BY_UNIT(w, is_float, DELTA__SCAN)
#undef DELTA__SCAN
}
#endif

int delta__isa_max = 2;

/* The widest scan this CPU runs: 2 AVX-512 (F, BW, CD), 1 AVX2, 0 SSE2; at
 * most delta__isa_max (tests lower it to check that every path writes the
 * same delta). */
static int delta__isa(void)
{
    static int isa = -1; /* every thread computes the same value */
    int a = __atomic_load_n(&isa, __ATOMIC_RELAXED);
    if (a < 0) {
        a = 0;
#ifdef DELTA__HAVE_AVX2
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2")) a = 1;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512cd"))
            a = 2;
#endif
        __atomic_store_n(&isa, a, __ATOMIC_RELAXED);
    }
    return a < delta__isa_max ? a : delta__isa_max;
}

static int delta__scan_in(delta__found *f, const uint8_t *o, const uint8_t *n, size_t i,
                          size_t end, unsigned w, int is_float)
{
#ifdef DELTA__HAVE_AVX2
    int a = delta__isa();
    if (a == 2) return delta__scan_w_avx512(f, o, n, i, end, w, is_float);
    if (a == 1) return delta__scan_w_avx2(f, o, n, i, end, w, is_float);
#endif
#define DELTA__SCAN(W, F) return delta__scan(f, o, n, i, end, W, F)
    DELTA__BY_UNIT(w, is_float, DELTA__SCAN)
#undef DELTA__SCAN
}

/* The scan of bytes [i, end) with the changes kept in s->pos/s->d (*k of
 * them so far, at most s->cap). */
static int delta__scan_w(delta__scratch *s, const uint8_t *o, const uint8_t *n, size_t i,
                         size_t end, size_t chunk_end, unsigned w, int is_float, size_t *k)
{
    delta__found f = {s->pos, s->d, *k, s->cap, chunk_end};
    int ok = delta__scan_in(&f, o, n, i, end, w, is_float);
    *k = f.k;
    return ok;
}

/* Scans a chunk in cache-sized pieces, hashing both sides of each piece
 * while it is in cache (the digests are needed anyway, and reading the
 * chunk once from memory is what bounds the speed).  Returns the number of
 * changes, or limit + 1 when there are more. */
static size_t delta__scan_hash(delta__scratch *s, const uint8_t *o, const uint8_t *n,
                               size_t nbytes, unsigned w, int is_float, size_t limit,
                               sh_hash128 *odig, sh_hash128 *ndig)
{
    size_t k = 0, saved = s->cap;
    int full = 0;
    s->cap = limit < saved ? limit : saved;
    XXH3_state_t *ho = s->ho, *hn = s->hn;
    XXH3_128bits_reset(ho);
    XXH3_128bits_reset(hn);
    for (size_t i = 0; i < nbytes; i += DELTA__PIECE) {
        size_t end = nbytes - i < DELTA__PIECE ? nbytes : i + DELTA__PIECE;
        XXH3_128bits_update(ho, o + i, end - i);
        XXH3_128bits_update(hn, n + i, end - i);
        if (!full && !delta__scan_w(s, o, n, i, end, nbytes, w, is_float, &k)) full = 1;
    }
    XXH128_hash_t a = XXH3_128bits_digest(ho), b = XXH3_128bits_digest(hn);
    *odig = (sh_hash128){a.low64, a.high64};
    *ndig = (sh_hash128){b.low64, b.high64};
    s->cap = saved;
    return full ? limit + 1 : k;
}

/* Writes table(s), the rANS stream and the extra bits after a prefix of
 * `pre` bytes already in s->out; returns the payload size or 0 if it does
 * not fit in `limit`. */
static size_t delta__assemble(delta__scratch *s, uint8_t *p, const delta__renc *e,
                              const delta__bw *bw, size_t limit)
{
    size_t r = (size_t)(s->rbuf + s->out_cap - e->ptr), nb = (size_t)(bw->p - s->bits);
    if (e->overflow || bw->overflow) return 0;
    size_t head = (size_t)(p - s->out);
    if (head + 10 + r + nb > limit) return 0;
    p = delta__put_varint(p, r);
    memcpy(p, e->ptr, r);
    memcpy(p + r, s->bits, nb);
    return (size_t)(p - s->out) + r + nb;
}

/* The scalar pass 1 over pairs [*i, end) while the stream has room for an
 * 8-byte store: units of at most 4 bytes only, whose gap has at most 18
 * extra bits and value at most 29, so that a pair's bits fit the 64-bit
 * accumulator with the 7 left over, and one store writes them out. */
static inline void delta__symbols_fast(delta__scratch *s, size_t *i, size_t end, unsigned w,
                                       uint32_t hg[4][256], uint32_t hv[4][256], delta__bw *bw)
{
    uint8_t *sym = s->sym, *p = bw->p;
    uint64_t acc = bw->acc, ex;
    unsigned n = bw->n, nb;
    size_t q = *i;
    for (; q < end && bw->end - p >= 8; q++) {
        uint32_t prev = q ? s->pos[q - 1] + 1 : 0; /* position after the previous change */
        unsigned g = delta__sym(s->pos[q] - prev, &nb, &ex);
        acc |= ex << n, n += nb;
        unsigned v = delta__sym(delta__zig(s->d[q], 8 * w), &nb, &ex);
        acc |= ex << n, n += nb;
        memcpy(p, &acc, 8); /* little-endian host: whole bytes go out */
        p += n >> 3;
        acc >>= n & 56;
        n &= 7;
        hg[q & 3][g]++, hv[q & 3][v]++;
        sym[2 * q] = (uint8_t)g, sym[2 * q + 1] = (uint8_t)v;
    }
    bw->p = p, bw->acc = acc, bw->n = n;
    *i = q;
}

#ifdef DELTA__HAVE_AVX2
/* delta__sym on 16 lanes of 32 bits: the symbol, the extra bits and
 * their count.  16 + 4 (e - 4) + top two bits = 4 e + top two bits. */
__attribute__((target(DELTA__AVX512))) static inline __attribute__((always_inline)) __m512i
delta__sym16(__m512i v, __m512i *nb, __m512i *ex)
{
    const __m512i c16 = _mm512_set1_epi32(16), c2 = _mm512_set1_epi32(2), c3 = _mm512_set1_epi32(3);
    __m512i e = _mm512_sub_epi32(_mm512_set1_epi32(31), _mm512_lzcnt_epi32(_mm512_or_si512(v, c16)));
    __mmask16 big = _mm512_cmpge_epu32_mask(v, c16);
    __m512i sh = _mm512_sub_epi32(e, c2);
    __m512i sym = _mm512_add_epi32(_mm512_slli_epi32(e, 2), _mm512_and_si512(_mm512_srlv_epi32(v, sh), c3));
    *nb = _mm512_maskz_mov_epi32(big, sh);
    *ex = _mm512_and_si512(v, _mm512_sub_epi32(_mm512_sllv_epi32(_mm512_set1_epi32(1), *nb),
                                               _mm512_set1_epi32(1)));
    return _mm512_mask_blend_epi32(big, v, sym);
}

/* Pass 1 of delta__sparse_symbols for pairs [i, k) of units of w <= 4
 * bytes, 16 pairs a turn: the symbols and each pair's extra bits are
 * computed in vectors, and only the bit packing and the counts stay
 * serial.  The bits are those of the scalar loop, in the same order.
 * Returns the pair it stopped at (room for a whole turn runs out first). */
__attribute__((target(DELTA__AVX512))) static size_t
delta__symbols16(delta__scratch *s, size_t i, size_t k, unsigned w, uint32_t hg[4][256],
                 uint32_t hv[4][256], delta__bw *bw)
{
    uint8_t *sym = s->sym, *p = bw->p;
    uint64_t acc = bw->acc;
    unsigned n = bw->n;
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i vbits = _mm512_set1_epi32((int)(32 - 8 * w)); /* sign-extend from 8 w bits */
    for (; i >= 1 && i + 16 <= k && bw->end - p >= 8 + 16 * 6; i += 16) {
        __m512i pos = _mm512_loadu_si512(s->pos + i), prev = _mm512_loadu_si512(s->pos + i - 1);
        __m512i g = _mm512_sub_epi32(_mm512_sub_epi32(pos, prev), one);
        __m512i d = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_loadu_si512(s->d + i))),
                                       _mm512_cvtepi64_epi32(_mm512_loadu_si512(s->d + i + 8)), 1);
        __m512i sx = _mm512_srav_epi32(_mm512_sllv_epi32(d, vbits), vbits);
        __m512i v = _mm512_xor_si512(_mm512_slli_epi32(sx, 1), _mm512_srai_epi32(sx, 31));
        __m512i nbg, exg, nbv, exv;
        __m512i sg = delta__sym16(g, &nbg, &exg), sv = delta__sym16(v, &nbv, &exv);
        _mm256_storeu_si256((__m256i *)(sym + 2 * i),
                            _mm512_cvtepi32_epi16(_mm512_or_si512(sg, _mm512_slli_epi32(sv, 8))));
        /* A pair's bits: the gap's, then the value's above them (<= 47). */
        uint64_t pb[16];
        uint32_t nt[16];
        for (int h = 0; h < 2; h++) {
            __m512i eg = _mm512_cvtepu32_epi64(h ? _mm512_extracti64x4_epi64(exg, 1) : _mm512_castsi512_si256(exg));
            __m512i ev = _mm512_cvtepu32_epi64(h ? _mm512_extracti64x4_epi64(exv, 1) : _mm512_castsi512_si256(exv));
            __m512i ng = _mm512_cvtepu32_epi64(h ? _mm512_extracti64x4_epi64(nbg, 1) : _mm512_castsi512_si256(nbg));
            _mm512_storeu_si512(pb + 8 * h, _mm512_or_si512(eg, _mm512_sllv_epi64(ev, ng)));
        }
        _mm512_storeu_si512(nt, _mm512_add_epi32(nbg, nbv));
        for (int j = 0; j < 16; j++) {
            acc |= pb[j] << n, n += nt[j];
            memcpy(p, &acc, 8); /* little-endian host: whole bytes go out */
            p += n >> 3;
            acc >>= n & 56;
            n &= 7;
            size_t q = i + (size_t)j;
            hg[q & 3][sym[2 * q]]++, hv[q & 3][sym[2 * q + 1]]++;
        }
    }
    bw->p = p, bw->acc = acc, bw->n = n;
    return i;
}
#endif

#ifdef DELTA__HAVE_AVX2
/* Pass 1 of a DENSE chunk for units of W = 2 or 4 bytes, 16 units a turn:
 * the ord-differences, their zigzag, symbols and extra bits in vectors;
 * only the bit packing and the counts stay serial.  The same symbols and
 * bits as the scalar loop, in the same order.  Returns the unit it stopped
 * at (a whole turn's room in the bit stream runs out first). */
__attribute__((target(DELTA__AVX512))) static inline __attribute__((always_inline)) size_t
delta__dense16_w(uint8_t *sym, const uint8_t *o, const uint8_t *n, size_t units, unsigned W, int FL,
                 uint32_t h[4][256], delta__bw *bw, uint64_t *changed)
{
    uint8_t *p = bw->p;
    uint64_t acc = bw->acc, k = 0;
    unsigned nbits = bw->n;
    const __m512i zero = _mm512_setzero_si512();
    const __m512i topm = _mm512_set1_epi32((int)((1u << (8 * W - 1)) - 1));
    size_t i = 0;
    for (; i + 16 <= units && bw->end - p >= 8 + 16 * 4; i += 16) {
        __m512i a, b;
        if (W == 4) {
            a = _mm512_loadu_si512(o + 4 * i), b = _mm512_loadu_si512(n + 4 * i);
        } else {
            a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(o + 2 * i)));
            b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(n + 2 * i)));
        }
        if (FL) { /* delta__ord: every bit below the top one flipped when the top one is set */
            a = _mm512_xor_si512(a, _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(a, 32 - 8 * W), 31), topm));
            b = _mm512_xor_si512(b, _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(b, 32 - 8 * W), 31), topm));
        }
        __m512i d = _mm512_sub_epi32(b, a);
        __m512i sx = _mm512_srai_epi32(_mm512_slli_epi32(d, 32 - 8 * W), 32 - 8 * W);
        __m512i v = _mm512_xor_si512(_mm512_slli_epi32(sx, 1), _mm512_srai_epi32(sx, 31));
        k += (unsigned)__builtin_popcount(_mm512_cmpneq_epi32_mask(v, zero));
        __m512i nb, ex;
        __m512i sv = delta__sym16(v, &nb, &ex);
        _mm_storeu_si128((__m128i *)(sym + i), _mm512_cvtepi32_epi8(sv));
        uint32_t e32[16], n32[16];
        _mm512_storeu_si512(e32, ex);
        _mm512_storeu_si512(n32, nb);
        for (int j = 0; j < 16; j++) {
            acc |= (uint64_t)e32[j] << nbits, nbits += n32[j];
            memcpy(p, &acc, 8); /* little-endian host: whole bytes go out */
            p += nbits >> 3;
            acc >>= nbits & 56;
            nbits &= 7;
            h[j & 3][sym[i + (size_t)j]]++;
        }
    }
    bw->p = p, bw->acc = acc, bw->n = nbits;
    *changed += k;
    return i;
}

__attribute__((target(DELTA__AVX512))) static size_t delta__dense16(uint8_t *sym, const uint8_t *o,
                                                                   const uint8_t *n, size_t units,
                                                                   unsigned w, int is_float,
                                                                   uint32_t h[4][256], delta__bw *bw,
                                                                   uint64_t *changed)
{
    if (w == 4) return is_float ? delta__dense16_w(sym, o, n, units, 4, 1, h, bw, changed)
                                : delta__dense16_w(sym, o, n, units, 4, 0, h, bw, changed);
    return is_float ? delta__dense16_w(sym, o, n, units, 2, 1, h, bw, changed)
                    : delta__dense16_w(sym, o, n, units, 2, 0, h, bw, changed);
}
#endif

/* Pass 1 of a sparse chunk: the symbols (kept for pass 2), their counts,
 * and the extra bits, which go forward in decoding order.  Counts go to
 * four copies of each histogram in turn: the same symbol comes again and
 * again, and one counter would make each increment wait for the last. */
static void delta__sparse_symbols(delta__scratch *s, size_t k, unsigned w, uint64_t cg[256],
                                  uint64_t cv[256], delta__bw *bw)
{
    uint32_t hg[4][256] = {{0}}, hv[4][256] = {{0}}; /* k < 2^32 */
    uint8_t *sym = s->sym;
    uint64_t ex;
    unsigned nb;
    size_t i = 0;
    if (w <= 4) {
#ifdef DELTA__HAVE_AVX2
        if (delta__isa() == 2) { /* the first pair has no previous position to load */
            delta__symbols_fast(s, &i, k < 1 ? k : 1, w, hg, hv, bw);
            i = delta__symbols16(s, i, k, w, hg, hv, bw);
        }
#endif
        delta__symbols_fast(s, &i, k, w, hg, hv, bw);
    }
    for (; i < k; i++) {
        uint32_t prev = i ? s->pos[i - 1] + 1 : 0;
        unsigned g = delta__sym(s->pos[i] - prev, &nb, &ex);
        delta__bw_put(bw, ex, nb);
        unsigned v = delta__sym(delta__zig(s->d[i], 8 * w), &nb, &ex);
        delta__bw_put(bw, ex, nb);
        hg[i & 3][g]++, hv[i & 3][v]++;
        sym[2 * i] = (uint8_t)g, sym[2 * i + 1] = (uint8_t)v;
    }
    for (int c = 0; c < 256; c++) {
        cg[c] = (uint64_t)hg[0][c] + hg[1][c] + hg[2][c] + hg[3][c];
        cv[c] = (uint64_t)hv[0][c] + hv[1][c] + hv[2][c] + hv[3][c];
    }
}

/* Pass 2: rANS, backwards, pair i with states 2 (i mod 2) and 2 (i mod 2)
 * + 1.  Two pairs a turn with the four states in locals (a state picked
 * by a run-time index would live in memory) while 8 bytes are free below
 * the stream, then one symbol at a time with every store checked. */
static void delta__sparse_rans(delta__renc *e, const uint8_t *sym, size_t k,
                               const delta__esyms *eg, const delta__esyms *ev)
{
    size_t i = k;
    if (i & 1) { /* the last pair is even: states 0 and 1 */
        i--;
        delta__renc_put_fast(e, 1, &ev->s[sym[2 * i + 1]]);
        delta__renc_put_fast(e, 0, &eg->s[sym[2 * i]]);
    }
    uint32_t x0 = e->x[0], x1 = e->x[1], x2 = e->x[2], x3 = e->x[3];
    uint8_t *ptr = e->ptr;
    for (; i >= 2 && ptr - e->start >= 8; i -= 2) {
        x3 = delta__renc_sym(x3, &ptr, &ev->s[sym[2 * i - 1]]);
        x2 = delta__renc_sym(x2, &ptr, &eg->s[sym[2 * i - 2]]);
        x1 = delta__renc_sym(x1, &ptr, &ev->s[sym[2 * i - 3]]);
        x0 = delta__renc_sym(x0, &ptr, &eg->s[sym[2 * i - 4]]);
    }
    e->x[0] = x0, e->x[1] = x1, e->x[2] = x2, e->x[3] = x3, e->ptr = ptr;
    while (i-- > 0) {
        int st = (int)(2 * i) % DELTA__STATES; /* symbol 2i: gap, 2i + 1: value */
        delta__renc_put_fast(e, st + 1, &ev->s[sym[2 * i + 1]]);
        delta__renc_put_fast(e, st, &eg->s[sym[2 * i]]);
    }
}

static size_t delta__encode_sparse(delta__scratch *s, size_t k, unsigned w, size_t limit)
{
    uint64_t cg[256], cv[256];
    delta__bw bw = {s->bits, s->bits + s->out_cap, 0, 0, 0};
    delta__sparse_symbols(s, k, w, cg, cv, &bw);
    delta__bw_flush(&bw);
    delta__table tg, tv;
    delta__normalize(cg, &tg);
    delta__normalize(cv, &tv);
    uint8_t *p = delta__put_varint(s->out, k);
    p = delta__put_table(p, &tg);
    p = delta__put_table(p, &tv);
    delta__esyms eg, ev;
    delta__esyms_init(&eg, &tg);
    delta__esyms_init(&ev, &tv);
    delta__renc e = {s->rbuf, s->rbuf + s->out_cap, {DELTA__L, DELTA__L, DELTA__L, DELTA__L}, 0};
    delta__sparse_rans(&e, s->sym, k, &eg, &ev);
    delta__renc_finish(&e);
    return delta__assemble(s, p, &e, &bw, limit);
}

/* Pass 1 of a DENSE chunk for units of w bytes: every unit's symbol (kept
 * for pass 2), their counts (four histograms in turn, as in
 * delta__sparse_symbols) and the extra bits.  Returns 0 when the bits
 * overflow. */
DELTA__HOT int delta__dense_symbols(delta__scratch *s, const uint8_t *o, const uint8_t *n, size_t units,
                                    unsigned w, int is_float, uint64_t cv[256], delta__bw *bw,
                                    uint64_t *changed)
{
    uint32_t h[4][256] = {{0}}; /* units <= CKPT_CHUNK < 2^32 */
    uint8_t *sym = s->sym;
    uint64_t k = 0, ex;
    unsigned nb;
    size_t i = 0;
#ifdef DELTA__HAVE_AVX2
    /* Counts go to histogram (i mod 4) there too: 16 units a turn keep i
     * a multiple of 4. */
    if ((w == 2 || w == 4) && delta__isa() == 2) i = delta__dense16(sym, o, n, units, w, is_float, h, bw, &k);
#endif
    for (; i < units; i++) {
        uint64_t z = delta__zig(delta__diff(o + i * w, n + i * w, w, is_float), 8 * w);
        k += z != 0;
        unsigned y = delta__sym(z, &nb, &ex);
        sym[i] = (uint8_t)y;
        h[i & 3][y]++;
        if (nb) delta__bw_put_fast(bw, ex, nb);
        if (bw->overflow) return 0;
    }
    for (int c = 0; c < 256; c++) cv[c] = (uint64_t)h[0][c] + h[1][c] + h[2][c] + h[3][c];
    *changed = k;
    return 1;
}

/* Pass 2: rANS, backwards, unit i with state i mod 4, four units a turn
 * with the states in locals while 8 bytes are free below the stream (the
 * reciprocal encoder of delta__sparse_rans: the same bytes as the
 * division), then one at a time with every store checked. */
static void delta__dense_rans(delta__renc *e, const uint8_t *sym, size_t units, const delta__esyms *ev)
{
    size_t i = units;
    while (i % DELTA__STATES) {
        i--;
        delta__renc_put_fast(e, (int)(i % DELTA__STATES), &ev->s[sym[i]]);
    }
    uint32_t x0 = e->x[0], x1 = e->x[1], x2 = e->x[2], x3 = e->x[3];
    uint8_t *ptr = e->ptr;
    for (; i >= 4 && ptr - e->start >= 8; i -= 4) {
        x3 = delta__renc_sym(x3, &ptr, &ev->s[sym[i - 1]]);
        x2 = delta__renc_sym(x2, &ptr, &ev->s[sym[i - 2]]);
        x1 = delta__renc_sym(x1, &ptr, &ev->s[sym[i - 3]]);
        x0 = delta__renc_sym(x0, &ptr, &ev->s[sym[i - 4]]);
    }
    e->x[0] = x0, e->x[1] = x1, e->x[2] = x2, e->x[3] = x3, e->ptr = ptr;
    while (i-- > 0 && !e->overflow) delta__renc_put_fast(e, (int)(i % DELTA__STATES), &ev->s[sym[i]]);
}

static size_t delta__encode_dense(delta__scratch *s, const uint8_t *o, const uint8_t *n,
                                  size_t units, unsigned w, int is_float, size_t limit,
                                  uint64_t *changed)
{
    uint64_t cv[256], k = 0;
    delta__bw bw = {s->bits, s->bits + s->out_cap, 0, 0, 0};
    int ok;
#define DELTA__DENSE_SYMBOLS(W, FL)                                                                \
    ok = delta__dense_symbols(s, o, n, units, W, FL, cv, &bw, &k);                                 \
    break
    DELTA__BY_UNIT(w, is_float, DELTA__DENSE_SYMBOLS);
#undef DELTA__DENSE_SYMBOLS
    if (!ok) return 0;
    delta__bw_flush(&bw);
    *changed = k;
    delta__table tv;
    delta__normalize(cv, &tv);
    uint8_t *p = delta__put_table(s->out, &tv);
    delta__esyms ev;
    delta__esyms_init(&ev, &tv);
    delta__renc e = {s->rbuf, s->rbuf + s->out_cap, {DELTA__L, DELTA__L, DELTA__L, DELTA__L}, 0};
    delta__dense_rans(&e, s->sym, units, &ev);
    delta__renc_finish(&e);
    return delta__assemble(s, p, &e, &bw, limit);
}

/* The smallest of ZSTD and RAW for a chunk's new bytes. */
static int delta__encode_bytes(delta__scratch *s, const uint8_t *new, size_t nbytes, int level,
                               int *enc, const uint8_t **payload, size_t *len)
{
    size_t z = ZSTD_compressCCtx(s->zc, s->zbuf, s->zcap, new, nbytes, level);
    if (ZSTD_isError(z)) return sh_err(SH_EINTERNAL, "zstd: %s", ZSTD_getErrorName(z));
    if (z < nbytes) {
        *enc = DELTA__ZSTD, *payload = s->zbuf, *len = z;
    } else {
        *enc = DELTA__RAW, *payload = new, *len = nbytes;
    }
    return SH_OK;
}

int delta__encode_diff(delta__scratch *s, unsigned w, const uint8_t *zeros, const uint8_t *acc,
                       size_t nbytes, int *enc, const uint8_t **payload, size_t *len,
                       uint64_t *changed)
{
    SH_TRY(delta__scratch_enc(s));
    size_t units = nbytes / w, limit = units / 4, sz;
    sh_hash128 h1, h2;
    size_t k = delta__scan_hash(s, zeros, acc, nbytes, w, 0, limit, &h1, &h2);
    *changed = k;
    *payload = s->out;
    if (k == 0) {
        *enc = DELTA__SAME, *len = 0;
        return SH_OK;
    }
    if (k <= limit) {
        sz = delta__encode_sparse(s, k, w, s->out_cap - 64);
        *enc = DELTA__SPARSE;
    } else {
        sz = delta__encode_dense(s, zeros, acc, units, w, 0, s->out_cap - 64, changed);
        *enc = DELTA__DENSE;
    }
    if (!sz)
        return sh_err(SH_ERANGE, "squash: a chunk's composed change is too dense to encode as a "
                      "difference; apply the deltas one after the other instead");
    *len = sz;
    return SH_OK;
}

int delta__encode_chunk(delta__scratch *s, unsigned w, int is_float, const uint8_t *old,
                        const uint8_t *new, size_t nbytes, int *enc, const uint8_t **payload,
                        size_t *len, uint64_t *changed, sh_hash128 *odig, sh_hash128 *ndig)
{
    SH_TRY(delta__scratch_enc(s));
    *changed = 0;
    if (!old) {
        *ndig = ckpt_chunk_digest(new, nbytes);
        /* Whole tensors compress like any data: zstd level 3 is the usual
         * balance; they are rare between RL steps. */
        *changed = nbytes / w;
        return delta__encode_bytes(s, new, nbytes, 3, enc, payload, len);
    }
    size_t units = nbytes / w, limit = units / 4;
    size_t k = delta__scan_hash(s, old, new, nbytes, w, is_float, limit, odig, ndig);
    if (k == 0) {
        *enc = DELTA__SAME, *payload = s->out, *len = 0;
        return SH_OK;
    }
    size_t sz;
    if (k <= limit) {
        *changed = k;
        sz = delta__encode_sparse(s, k, w, nbytes);
        *enc = DELTA__SPARSE;
    } else {
        sz = delta__encode_dense(s, old, new, units, w, is_float, nbytes, changed);
        *enc = DELTA__DENSE;
    }
    /* A difference of at most a quarter of the chunk is kept without trying
     * zstd on the new bytes, which would have to compress them more than
     * 4:1 to win (a dense fp32 AdamW step codes to about 1/7 of its bytes,
     * and zstd cost as much again as the whole encode). */
    if (sz && sz <= nbytes / 4) {
        *payload = s->out, *len = sz;
        return SH_OK;
    }
    /* Worth comparing with plain compression of the new bytes. */
    int benc;
    const uint8_t *bp;
    size_t blen;
    SH_TRY(delta__encode_bytes(s, new, nbytes, 1, &benc, &bp, &blen));
    if (sz && sz <= blen) {
        *payload = s->out, *len = sz;
    } else {
        *enc = benc, *payload = bp, *len = blen;
        if (*changed == 0) {
            /* Dense attempt overflowed before counting: count for the stats. */
            for (size_t i = 0; i < units; i++) *changed += memcmp(old + i * w, new + i * w, w) != 0;
        }
    }
    return SH_OK;
}
