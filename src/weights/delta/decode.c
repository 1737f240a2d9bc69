/* Decoding chunks.  Every read is bounds-checked: the input is untrusted
 * (the fuzzer drives this file through delta_apply_mem). */
#include <stdlib.h>
#include <string.h>

#include "weights/delta/delta_int.h"

/* The library's runtime-dispatched xxh3 uses the widest vectors the CPU has
 * (the digests are the same whatever the width). */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#endif

/* nbits (<= 64) extra bits, least significant first, checked against the
 * stream's end: the careful path, for the last bytes of a stream. */
static int delta__br_get(delta__dec *d, unsigned nbits, uint64_t *out)
{
    delta__br *b = &d->br;
    if (nbits > 8 * b->len - b->pos)
        return sh_err(SH_EFORMAT, "%s: extra-bit stream too short", d->what);
    uint64_t v = 0;
    for (unsigned got = 0; got < nbits;) {
        uint64_t at = b->pos + got;
        unsigned sh = (unsigned)(at & 7), take = 8 - sh < nbits - got ? 8 - sh : nbits - got;
        v |= (uint64_t)((b->start[at >> 3] >> sh) & ((1u << take) - 1)) << got;
        got += take;
    }
    b->pos += nbits;
    *out = v;
    return SH_OK;
}

/* One rANS symbol with state st, and its value (symbol + extra bits), with
 * every read checked. */
static int delta__get(delta__dec *d, int st, const delta__dtable *t, uint64_t *v)
{
    uint32_t x = d->x[st], slot = x & (DELTA__PROB - 1);
    const delta__dsym *y = &t->d[t->sym[slot]];
    x = y->freq * (x >> DELTA__PROB_BITS) + slot - y->cum;
    while (x < DELTA__L) {
        if (d->p == d->end) return sh_err(SH_EFORMAT, "%s: rANS stream too short", d->what);
        x = (x << 8) | *d->p++;
    }
    d->x[st] = x;
    uint64_t extra = 0;
    SH_TRY(delta__br_get(d, y->nb, &extra));
    *v = y->base | extra;
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
    d->br = (delta__br){p + r, (size_t)(end - p - r), 0};
    /* The fast loops read 8 bytes at the bit position and take up to 4
     * symbols' extra bits a turn; they run while the position is below
     * fast_lim (none when a table holds symbols of over 56 extra bits,
     * which one 8-byte read could not hold). */
    unsigned mg = d->dense ? d->v->maxnb : d->g->maxnb, mv = d->v->maxnb;
    uint64_t need = 64 + 2 * (uint64_t)(mg + mv), have = 8 * (uint64_t)d->br.len;
    d->fast_lim = mg <= 56 && mv <= 56 && have >= need ? have - need + 1 : 0;
    return SH_OK;
}

/* One rANS symbol and its value without a branch on the data, for the hot
 * loops: X is a local state, T its table, OUT the value; uses the locals p
 * (rANS stream, 2 bytes readable), bs and bp (extra-bit stream and bit
 * position, 8 bytes readable at bp / 8).  Renormalisation needs at most two
 * bytes (x >= 2^9 after decoding), so both are loaded at once and the
 * number used computed from x: the stream position then depends on the
 * states only through an add, and the four states' chains overlap. */
#define DELTA__FAST_SYM(X, T, OUT)                                                                 \
    do {                                                                                           \
        uint32_t slot_ = X & (DELTA__PROB - 1);                                                    \
        const delta__dsym *y_ = &(T)->d[(T)->sym[slot_]];                                          \
        X = y_->freq * (X >> DELTA__PROB_BITS) + slot_ - y_->cum;                                  \
        unsigned n_ = (X < DELTA__L) + (X < (DELTA__L >> 8));                                      \
        uint32_t in_ = (uint32_t)p[0] << 8 | p[1];                                                 \
        X = X << (8 * n_) | in_ >> (16 - 8 * n_);                                                  \
        p += n_;                                                                                   \
        uint64_t w_;                                                                               \
        memcpy(&w_, bs + (bp >> 3), 8);                                                            \
        OUT = y_->base | ((w_ >> (bp & 7)) & ((1ull << y_->nb) - 1));                              \
        bp += y_->nb;                                                                              \
    } while (0)

/* Dense: every unit's value, four symbols (states 0-3) a turn while the
 * streams have room, then one at a time with every read checked. */
static int delta__dec_dense(delta__dec *d, uint32_t *pos, uint64_t *z, size_t max, size_t *got)
{
    size_t k = 0;
    if (d->next % DELTA__STATES == 0) {
        uint32_t x0 = d->x[0], x1 = d->x[1], x2 = d->x[2], x3 = d->x[3];
        const uint8_t *p = d->p, *end = d->end, *bs = d->br.start;
        const delta__dtable *tv = d->v;
        uint64_t bp = d->br.pos, next = d->next, zmax = d->zmax, bad = 0;
        for (; k + 4 <= max && d->left - k >= 4 && end - p >= 8 && bp < d->fast_lim; k += 4) {
            uint64_t v0, v1, v2, v3;
            DELTA__FAST_SYM(x0, tv, v0);
            DELTA__FAST_SYM(x1, tv, v1);
            DELTA__FAST_SYM(x2, tv, v2);
            DELTA__FAST_SYM(x3, tv, v3);
            bad |= (v0 > zmax) | (v1 > zmax) | (v2 > zmax) | (v3 > zmax);
            z[k] = v0, z[k + 1] = v1, z[k + 2] = v2, z[k + 3] = v3;
            for (int i = 0; i < 4; i++) pos[k + i] = (uint32_t)next++;
        }
        d->x[0] = x0, d->x[1] = x1, d->x[2] = x2, d->x[3] = x3;
        d->p = p, d->br.pos = bp, d->next = next, d->left -= k;
        if (bad) return sh_err(SH_EFORMAT, "%s: change value out of range", d->what);
    }
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

/* Checks a decoded change at position `next` + g (of n units) with value
 * v, and records it as change k. */
#define DELTA__PUT(G, V)                                                                           \
    do {                                                                                           \
        if ((G) >= n - next) {                                                                     \
            rc = sh_err(SH_EFORMAT, "%s: change position beyond the chunk", d->what);             \
            goto out;                                                                              \
        }                                                                                          \
        if ((V) - 1 >= zmax) {                                                                     \
            rc = sh_err(SH_EFORMAT, "%s: change value %llu out of range", d->what,                \
                        (unsigned long long)(V));                                                  \
            goto out;                                                                              \
        }                                                                                          \
        pos[k] = (uint32_t)(next + (G));                                                           \
        z[k++] = (V);                                                                              \
        next += (G) + 1;                                                                           \
    } while (0)

int delta__dec_next(delta__dec *d, uint32_t *pos, uint64_t *z, size_t max, size_t *got)
{
    if (d->dense) return delta__dec_dense(d, pos, z, max, got);
    /* The sparse loop keeps the states and the stream positions in locals:
     * every symbol depends on the previous one of its state, so latency is
     * what counts. */
    uint32_t x0 = d->x[0], x1 = d->x[1], x2 = d->x[2], x3 = d->x[3];
    const uint8_t *p = d->p, *end = d->end, *bs = d->br.start;
    const delta__dtable *tg = d->g, *tv = d->v;
    uint64_t bp = d->br.pos, next = d->next, left = d->left, n = d->n, zmax = d->zmax;
    uint64_t pair = d->sym / 2, fast_lim = d->fast_lim;
    size_t k = 0;
    int rc = SH_OK;
    /* Two pairs a turn, without branches on the data, while the streams
     * have room for them (4 symbols renormalise with at most 8 bytes):
     * states 0-1 then 2-3, so the chains overlap. */
    if (!(pair & 1))
        while (k + 2 <= max && left - k >= 2 && end - p >= 8 && bp < fast_lim) {
            uint64_t g0, v0, g1, v1;
            DELTA__FAST_SYM(x0, tg, g0);
            DELTA__FAST_SYM(x1, tv, v0);
            DELTA__FAST_SYM(x2, tg, g1);
            DELTA__FAST_SYM(x3, tv, v1);
            DELTA__PUT(g0, v0);
            DELTA__PUT(g1, v1);
        }
    /* The rest one pair at a time, every read checked (through d). */
    for (pair += k; k < max && k < left; pair++) {
        uint64_t g, v;
        int st = pair & 1 ? 2 : 0;
        d->p = p, d->br.pos = bp;
        d->x[0] = x0, d->x[1] = x1, d->x[2] = x2, d->x[3] = x3;
        if ((rc = delta__get(d, st, tg, &g)) < 0 || (rc = delta__get(d, st + 1, tv, &v)) < 0)
            return rc;
        p = d->p, bp = d->br.pos;
        x0 = d->x[0], x1 = d->x[1], x2 = d->x[2], x3 = d->x[3];
        DELTA__PUT(g, v);
    }
out:
    d->x[0] = x0, d->x[1] = x1, d->x[2] = x2, d->x[3] = x3;
    d->p = p, d->br.pos = bp, d->next = next, d->left = left - k, d->sym = 2 * (d->sym / 2 + k);
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
    uint64_t used = d->br.pos;
    if ((used + 7) / 8 != d->br.len)
        return sh_err(SH_EFORMAT, "%s: extra-bit stream of %zu bytes holds %llu bits", d->what,
                      d->br.len, (unsigned long long)used);
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
    /* z = 0 (dense) is patched too: it rewrites the same value, cheaper
     * than a branch that mispredicts. */
    for (; bi < bn && pos[bi] < lim; bi++) delta__patch1(out, pos[bi] - u0, z[bi], w, is_float);
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
        if (out != base) {
            memcpy(piece, base + i, end - i);
        } else if (end < nbytes) {
            /* In place nothing streams the piece into cache before the
             * patches land on it at random: fetch the next piece while
             * this one is patched and hashed. */
            size_t next_end = nbytes - end < DELTA__PIECE ? nbytes : end + DELTA__PIECE;
            for (size_t q = end; q < next_end; q += 64) __builtin_prefetch(out + q, 1, 3);
        }
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
