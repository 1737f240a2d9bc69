/* Decoding chunks.  Every read is bounds-checked: the input is untrusted
 * (the fuzzer drives this file through delta_apply_mem). */
#include <stdlib.h>
#include <string.h>

#include "delta/internal.h"

/* The library's runtime-dispatched xxh3 uses the widest vectors the CPU has
 * (the digests are the same whatever the width). */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#endif

/* Extra bits, least significant first; refills eight bytes at a time. */
static inline int delta__br_get(delta__dec *d, unsigned nbits, uint64_t *out)
{
    delta__br *b = &d->br;
    if (nbits > 32) {
        uint64_t lo = 0, hi = 0;
        SH_TRY(delta__br_get(d, 32, &lo));
        SH_TRY(delta__br_get(d, nbits - 32, &hi));
        *out = lo | hi << 32;
        return SH_OK;
    }
    if (b->n < nbits) {
        if (b->end - b->p >= 8) {
            uint64_t v;
            memcpy(&v, b->p, 8);
            b->acc |= v << b->n;
            b->p += (63 - b->n) >> 3;
            b->n |= 56;
            b->acc &= (1ull << b->n) - 1;
        } else {
            while (b->n <= 56 && b->p < b->end) {
                b->acc |= (uint64_t)*b->p++ << b->n;
                b->n += 8;
            }
            if (b->n < nbits)
                return sh_err(SH_EFORMAT, "%s: extra-bit stream too short", d->what);
        }
    }
    *out = b->acc & ((1ull << nbits) - 1);
    b->acc >>= nbits;
    b->n -= nbits;
    return SH_OK;
}

/* One rANS symbol with state st, and its value (symbol + extra bits). */
static inline int delta__get(delta__dec *d, int st, const delta__dtable *t, uint64_t *v)
{
    uint32_t x = d->x[st], slot = x & (DELTA__PROB - 1);
    unsigned s = t->sym[slot];
    x = t->t.freq[s] * (x >> DELTA__PROB_BITS) + slot - t->t.cum[s];
    while (x < DELTA__L) {
        if (d->p == d->end) return sh_err(SH_EFORMAT, "%s: rANS stream too short", d->what);
        x = (x << 8) | *d->p++;
    }
    d->x[st] = x;
    if (s < 16) {
        *v = s;
        return SH_OK;
    }
    unsigned e = 4 + (s - 16) / 4, m = (s - 16) % 4;
    uint64_t extra = 0;
    SH_TRY(delta__br_get(d, e - 2, &extra));
    *v = ((uint64_t)(4 + m) << (e - 2)) | extra;
    return SH_OK;
}

static uint32_t delta__le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int delta__dec_open(delta__dec *d, int enc, const uint8_t *payload, size_t len, uint64_t n,
                    unsigned w, delta__scratch *s, const char *what)
{
    const uint8_t *p = payload, *end = payload + len;
    memset(d, 0, sizeof *d);
    d->what = what;
    d->n = n;
    d->zmax = delta__mask(w);
    d->dense = enc == DELTA__DENSE;
    d->g = s->g;
    d->v = s->v;
    if (d->dense) {
        d->left = n;
    } else {
        SH_TRY(delta__get_varint(&p, end, &d->left, what));
        if (d->left < 1 || d->left > n)
            return sh_err(SH_EFORMAT, "%s: %llu changes in a chunk of %llu units", what,
                          (unsigned long long)d->left, (unsigned long long)n);
        SH_TRY(delta__get_table(&p, end, s->g, what));
    }
    SH_TRY(delta__get_table(&p, end, s->v, what));
    uint64_t r;
    SH_TRY(delta__get_varint(&p, end, &r, what));
    if (r < 4 * DELTA__STATES || r > (uint64_t)(end - p))
        return sh_err(SH_EFORMAT, "%s: rANS stream of %llu bytes does not fit the payload", what,
                      (unsigned long long)r);
    for (int st = 0; st < DELTA__STATES; st++) {
        d->x[st] = delta__le32(p + 4 * st);
        if (d->x[st] < DELTA__L || d->x[st] >= (DELTA__L << 8))
            return sh_err(SH_EFORMAT, "%s: rANS initial state out of range", what);
    }
    d->p = p + 4 * DELTA__STATES;
    d->end = p + r;
    d->br.start = d->br.p = p + r;
    d->br.end = end;
    return SH_OK;
}

/* One rANS symbol and its value, for the hot loops: X is a local state, T
 * its table, OUT the value; uses the locals p, end, br, rc, d and the label
 * `out` of the enclosing function. */
#define DELTA__SYM(X, T, OUT)                                                                      \
    do {                                                                                           \
        uint32_t slot_ = X & (DELTA__PROB - 1);                                                    \
        unsigned s_ = (T)->sym[slot_];                                                             \
        X = (T)->t.freq[s_] * (X >> DELTA__PROB_BITS) + slot_ - (T)->t.cum[s_];                   \
        while (X < DELTA__L) {                                                                     \
            if (p == end) {                                                                        \
                rc = sh_err(SH_EFORMAT, "%s: rANS stream too short", d->what);                    \
                goto out;                                                                          \
            }                                                                                      \
            X = (X << 8) | *p++;                                                                   \
        }                                                                                          \
        if (s_ < 16) {                                                                             \
            OUT = s_;                                                                              \
        } else {                                                                                   \
            unsigned e_ = 4 + (s_ - 16) / 4, nb_ = e_ - 2;                                         \
            uint64_t ex_ = 0;                                                                      \
            if (nb_ <= 32 && br.n >= nb_) {                                                        \
                ex_ = br.acc & ((1ull << nb_) - 1);                                                \
                br.acc >>= nb_, br.n -= nb_;                                                       \
            } else {                                                                               \
                d->br = br;                                                                        \
                if ((rc = delta__br_get(d, nb_, &ex_)) < 0) goto out;                              \
                br = d->br;                                                                        \
            }                                                                                      \
            OUT = ((uint64_t)(4 + (s_ - 16) % 4) << nb_) | ex_;                                    \
        }                                                                                          \
    } while (0)

/* The same without branches on the data, when at least 4 stream bytes (a
 * symbol renormalises with at most 2) and 8 extra-bit bytes are left and
 * the extra bits fit one refill (at most 56: gaps and values of units up to
 * 4 bytes). */
#define DELTA__FAST_SYM(X, T, OUT)                                                                 \
    do {                                                                                           \
        uint32_t slot_ = X & (DELTA__PROB - 1);                                                    \
        unsigned s_ = (T)->sym[slot_];                                                             \
        X = (T)->t.freq[s_] * (X >> DELTA__PROB_BITS) + slot_ - (T)->t.cum[s_];                   \
        uint32_t c1_ = X < DELTA__L;                                                               \
        X = c1_ ? (X << 8) | *p : X;                                                               \
        p += c1_;                                                                                  \
        uint32_t c2_ = X < DELTA__L;                                                               \
        X = c2_ ? (X << 8) | *p : X;                                                               \
        p += c2_;                                                                                  \
        unsigned big_ = s_ >= 16, sb_ = big_ ? s_ - 16 : 0, nb_ = big_ ? sb_ / 4 + 2 : 0;          \
        if (br.n < nb_) {                                                                          \
            uint64_t w_;                                                                           \
            memcpy(&w_, br.p, 8);                                                                  \
            br.acc |= w_ << br.n;                                                                  \
            br.p += (63 - br.n) >> 3;                                                              \
            br.n |= 56;                                                                            \
            br.acc &= (1ull << br.n) - 1;                                                          \
        }                                                                                          \
        uint64_t ex_ = br.acc & ((1ull << nb_) - 1);                                               \
        br.acc >>= nb_;                                                                            \
        br.n -= nb_;                                                                               \
        OUT = big_ ? ((uint64_t)(4 + sb_ % 4) << nb_) | ex_ : s_;                                  \
    } while (0)

int delta__dec_next(delta__dec *d, uint32_t *pos, uint64_t *z, size_t max, size_t *got)
{
    size_t k = 0;
    if (d->dense) {
        for (; k < max && d->left; k++, d->left--) {
            uint64_t v = 0;
            SH_TRY(delta__get(d, (int)(d->next % DELTA__STATES), d->v, &v));
            if (v > d->zmax)
                return sh_err(SH_EFORMAT, "%s: change value %llu out of range", d->what,
                              (unsigned long long)v);
            pos[k] = (uint32_t)d->next++;
            z[k] = v;
        }
        *got = k;
        return SH_OK;
    }
    /* The sparse loop keeps the states and the bit reader in locals: every
     * symbol depends on the previous one through the state, so latency is
     * what counts. */
    uint32_t x0 = d->x[0], x1 = d->x[1], x2 = d->x[2], x3 = d->x[3];
    const uint8_t *p = d->p, *end = d->end;
    const delta__dtable *tg = d->g, *tv = d->v;
    delta__br br = d->br;
    uint64_t next = d->next, left = d->left, n = d->n, zmax = d->zmax, pair = d->sym / 2;
    int rc = SH_OK, narrow = zmax <= 0xffffffffu; /* units of at most 4 bytes */
    /* Two pairs a turn, branch-free, while the streams have room for them
     * (4 symbols renormalise with at most 8 bytes and refill the extra bits
     * at most 4 times): states 0-1 then 2-3, so the chains overlap. */
    while (narrow && !(pair & 1) && k + 2 <= max && left >= 2 && end - p >= 8 &&
           br.end - br.p >= 32) {
        uint64_t g0, v0, g1, v1;
        DELTA__FAST_SYM(x0, tg, g0);
        DELTA__FAST_SYM(x1, tv, v0);
        DELTA__FAST_SYM(x2, tg, g1);
        DELTA__FAST_SYM(x3, tv, v1);
        if (g0 >= n - next || g1 >= n - next - g0 - 1) {
            rc = sh_err(SH_EFORMAT, "%s: change position beyond the chunk", d->what);
            goto out;
        }
        if (v0 - 1 >= zmax || v1 - 1 >= zmax) {
            rc = sh_err(SH_EFORMAT, "%s: change value %llu out of range", d->what,
                        (unsigned long long)(v0 - 1 >= zmax ? v0 : v1));
            goto out;
        }
        pos[k] = (uint32_t)(next + g0);
        z[k] = v0;
        next += g0 + 1;
        pos[k + 1] = (uint32_t)(next + g1);
        z[k + 1] = v1;
        next += g1 + 1;
        k += 2, left -= 2, pair += 2;
    }
    for (; k < max && left; k++, left--, pair++) {
        uint64_t g, v;
        int fast = narrow && end - p >= 4 && br.end - br.p >= 8;
        if (fast && (pair & 1)) {
            DELTA__FAST_SYM(x2, tg, g);
            DELTA__FAST_SYM(x3, tv, v);
        } else if (fast) {
            DELTA__FAST_SYM(x0, tg, g);
            DELTA__FAST_SYM(x1, tv, v);
        } else if (pair & 1) {
            DELTA__SYM(x2, tg, g);
            DELTA__SYM(x3, tv, v);
        } else {
            DELTA__SYM(x0, tg, g);
            DELTA__SYM(x1, tv, v);
        }
        if (g >= n - next) {
            rc = sh_err(SH_EFORMAT, "%s: change position beyond the chunk", d->what);
            goto out;
        }
        if (v > zmax || v == 0) {
            rc = sh_err(SH_EFORMAT, "%s: change value %llu out of range", d->what,
                        (unsigned long long)v);
            goto out;
        }
        pos[k] = (uint32_t)(next + g);
        z[k] = v;
        next += g + 1;
    }
out:
    d->x[0] = x0, d->x[1] = x1, d->x[2] = x2, d->x[3] = x3;
    d->p = p, d->br = br, d->next = next, d->left = left, d->sym = 2 * pair;
    *got = k;
    return rc;
}

int delta__dec_close(delta__dec *d)
{
    for (int st = 0; st < DELTA__STATES; st++)
        if (d->x[st] != DELTA__L) d->p = NULL; /* flags the error below */
    if (d->p != d->end)
        return sh_err(SH_EFORMAT, "%s: rANS stream does not end where it should (corrupt chunk)",
                      d->what);
    /* The extra-bit stream is exactly the bytes holding the bits read. */
    uint64_t used = (uint64_t)(d->br.p - d->br.start) * 8 - d->br.n;
    if ((used + 7) / 8 != (uint64_t)(d->br.end - d->br.start))
        return sh_err(SH_EFORMAT, "%s: extra-bit stream of %zu bytes holds %llu bits", d->what,
                      (size_t)(d->br.end - d->br.start), (unsigned long long)used);
    return SH_OK;
}

static inline __attribute__((always_inline)) void delta__patch1(uint8_t *out, uint32_t pos,
                                                                uint64_t z, unsigned w,
                                                                int is_float)
{
    uint8_t *p = out + (size_t)pos * w;
    uint64_t u = 0;
    memcpy(&u, p, w); /* constant w after inlining: one load */
    if (is_float) u = delta__ord(u, w);
    u = (u + delta__unzig(z)) & delta__mask(w);
    if (is_float) u = delta__ord(u, w);
    memcpy(p, &u, w);
}

/* Applies changes [bi, bn) below unit lim to out, which holds units from
 * u0 on; returns the new bi. */
static inline __attribute__((always_inline)) size_t
delta__patch_run(uint8_t *out, const uint32_t *pos, const uint64_t *z, size_t bi, size_t bn,
                 uint64_t lim, unsigned w, int is_float, uint32_t u0)
{
    for (; bi < bn && pos[bi] < lim; bi++)
        if (z[bi]) delta__patch1(out, pos[bi] - u0, z[bi], w, is_float);
    return bi;
}

static size_t delta__patch_w(uint8_t *out, const uint32_t *pos, const uint64_t *z, size_t bi,
                             size_t bn, uint64_t lim, unsigned w, int is_float, uint32_t u0)
{
#define DELTA__RUN(W, F) return delta__patch_run(out, pos, z, bi, bn, lim, W, F, u0)
    DELTA__BY_UNIT(w, is_float, DELTA__RUN)
#undef DELTA__RUN
}

/* Copies the base chunk to out and patches it in cache-sized pieces,
 * hashing each piece of the base and of the result while it is in cache:
 * apply then reads the base once and writes the target once. */
int delta__decode_fused(delta__scratch *s, int enc, const uint8_t *payload, size_t len,
                        unsigned w, int is_float, const uint8_t *base, uint8_t *out,
                        size_t nbytes, sh_hash128 *bdig, sh_hash128 *odig, uint64_t *applied,
                        const char *what)
{
    if (enc != DELTA__SAME && enc != DELTA__SPARSE && enc != DELTA__DENSE)
        return sh_err(SH_EINTERNAL, "%s: not a diff encoding", what);
    if (enc == DELTA__SAME && len) return sh_err(SH_EFORMAT, "%s: SAME chunk with a payload", what);
    delta__dec d;
    int more = enc != DELTA__SAME;
    if (more) SH_TRY(delta__dec_open(&d, enc, payload, len, nbytes / w, w, s, what));
    if (applied) *applied = 0;
    XXH3_state_t *hb = s->ho, *ho = s->hn;
    int hash_base = bdig != NULL, hash_out = enc != DELTA__SAME || !hash_base;
    XXH3_128bits_reset(hb);
    XXH3_128bits_reset(ho);
    uint32_t pos[DELTA__BATCH];
    uint64_t z[DELTA__BATCH];
    size_t bi = 0, bn = 0;
    for (size_t i = 0; i < nbytes; i += DELTA__PIECE) {
        size_t end = nbytes - i < DELTA__PIECE ? nbytes : i + DELTA__PIECE;
        uint8_t *piece = out + i; /* holds units from i / w on */
        if (out != base) memcpy(piece, base + i, end - i); /* else in place */
        if (hash_base) XXH3_128bits_update(hb, piece, end - i);
        uint64_t lim = end / w;
        while (more) {
            if (bi == bn) {
                SH_TRY(delta__dec_next(&d, pos, z, DELTA__BATCH, &bn));
                bi = 0;
                if (!bn) {
                    more = 0;
                    break;
                }
            }
            size_t b0 = bi;
            bi = delta__patch_w(piece, pos, z, bi, bn, lim, w, is_float, (uint32_t)(i / w));
            if (applied) *applied += bi - b0;
            if (bi < bn) break;
        }
        if (hash_out) XXH3_128bits_update(ho, piece, end - i);
    }

    if (enc != DELTA__SAME) SH_TRY(delta__dec_close(&d));
    XXH128_hash_t a = XXH3_128bits_digest(hb), b = hash_out ? XXH3_128bits_digest(ho) : a;
    if (bdig) *bdig = (sh_hash128){a.low64, a.high64};
    *odig = (sh_hash128){b.low64, b.high64};
    return SH_OK;
}

static int delta__patch(delta__scratch *s, int enc, const uint8_t *payload, size_t len,
                        unsigned w, int is_float, uint8_t *out, size_t nbytes, uint64_t *changed,
                        const char *what)
{
    delta__dec d;
    SH_TRY(delta__dec_open(&d, enc, payload, len, nbytes / w, w, s, what));
    uint32_t pos[DELTA__BATCH];
    uint64_t z[DELTA__BATCH], k = 0;
    size_t got;
    do {
        SH_TRY(delta__dec_next(&d, pos, z, DELTA__BATCH, &got));
        delta__patch_w(out, pos, z, 0, got, UINT64_MAX, w, is_float, 0);
        for (size_t i = 0; i < got; i++) k += z[i] != 0;
    } while (got);
    if (changed) *changed += k;
    return delta__dec_close(&d);
}

int delta__decode_chunk(delta__scratch *s, int enc, const uint8_t *payload, size_t len,
                        unsigned w, int is_float, uint8_t *out, size_t nbytes, uint64_t *changed,
                        const char *what)
{
    switch (enc) {
    case DELTA__SAME:
        if (len) return sh_err(SH_EFORMAT, "%s: SAME chunk with a payload", what);
        return SH_OK;
    case DELTA__RAW:
        if (len != nbytes)
            return sh_err(SH_EFORMAT, "%s: RAW chunk of %zu bytes, expected %zu", what, len, nbytes);
        memcpy(out, payload, len);
        return SH_OK;
    case DELTA__ZSTD: {
        size_t r = ZSTD_decompressDCtx(s->zd, out, nbytes, payload, len);
        if (ZSTD_isError(r))
            return sh_err(SH_EFORMAT, "%s: zstd: %s", what, ZSTD_getErrorName(r));
        if (r != nbytes)
            return sh_err(SH_EFORMAT, "%s: zstd chunk holds %zu bytes, expected %zu", what, r,
                          nbytes);
        return SH_OK;
    }
    case DELTA__SPARSE:
    case DELTA__DENSE:
        return delta__patch(s, enc, payload, len, w, is_float, out, nbytes, changed, what);
    }
    return sh_err(SH_EFORMAT, "%s: unknown chunk encoding %d", what, enc);
}
