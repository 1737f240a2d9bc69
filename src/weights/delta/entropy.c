/* Entropy coding primitives of the delta format: varints, the extra-bit
 * stream, frequency tables and the rANS state.  Pure: no I/O. */
#include <string.h>

#include "weights/delta/delta_int.h"

uint8_t *delta__put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

int delta__get_varint(const uint8_t **pp, const uint8_t *end, uint64_t *v, const char *what)
{
    const uint8_t *p = *pp;
    uint64_t r = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (p >= end) return sh_err(SH_EFORMAT, "%s: truncated varint", what);
        uint8_t b = *p++;
        if (shift == 63 && b > 1) break;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *v = r;
            return SH_OK;
        }
    }
    return sh_err(SH_EFORMAT, "%s: varint longer than 64 bits", what);
}

void delta__bw_put(delta__bw *w, uint64_t bits, unsigned n)
{
    if (n > 32) {
        delta__bw_put(w, bits & 0xffffffffu, 32);
        delta__bw_put(w, bits >> 32, n - 32);
        return;
    }
    w->acc |= bits << w->n;
    w->n += n;
    while (w->n >= 8) {
        if (w->p == w->end) {
            w->overflow = 1;
            w->n = 0;
            return;
        }
        *w->p++ = (uint8_t)w->acc;
        w->acc >>= 8;
        w->n -= 8;
    }
}

void delta__bw_flush(delta__bw *w)
{
    if (w->n) {
        if (w->p == w->end) w->overflow = 1;
        else *w->p++ = (uint8_t)w->acc;
    }
    w->acc = 0;
    w->n = 0;
}

void delta__normalize(const uint64_t counts[256], delta__table *t)
{
    uint64_t total = 0;
    for (int s = 0; s < 256; s++) total += counts[s];
    int64_t sum = 0;
    int top = 0;
    for (int s = 0; s < 256; s++) {
        uint64_t f = counts[s] ? (counts[s] * DELTA__PROB) / total : 0;
        if (counts[s] && f == 0) f = 1;
        t->freq[s] = (uint32_t)f;
        sum += (int64_t)f;
        if (counts[s] > counts[top]) top = s;
    }
    /* Floors leave a remainder that goes to the most frequent symbol; the
     * bumps to 1 may overshoot, taken back from the largest frequencies. */
    if (sum < DELTA__PROB) t->freq[top] += (uint32_t)(DELTA__PROB - sum);
    while (sum > DELTA__PROB) {
        int big = 0;
        for (int s = 1; s < 256; s++)
            if (t->freq[s] > t->freq[big]) big = s;
        uint32_t take = (uint32_t)(sum - DELTA__PROB);
        if (take > t->freq[big] - 1) take = t->freq[big] - 1;
        t->freq[big] -= take;
        sum -= take;
    }
    t->cum[0] = 0;
    for (int s = 0; s < 256; s++) t->cum[s + 1] = t->cum[s] + t->freq[s];
}

uint8_t *delta__put_table(uint8_t *p, const delta__table *t)
{
    unsigned used = 0;
    for (int s = 0; s < 256; s++) used += t->freq[s] != 0;
    p = delta__put_varint(p, used);
    int prev = -1;
    for (int s = 0; s < 256; s++) {
        if (!t->freq[s]) continue;
        p = delta__put_varint(p, (uint64_t)(s - prev - 1));
        p = delta__put_varint(p, t->freq[s]);
        prev = s;
    }
    return p;
}

int delta__get_table(const uint8_t **p, const uint8_t *end, delta__dtable *t, const char *what)
{
    uint64_t used, dl, f;
    SH_TRY(delta__get_varint(p, end, &used, what));
    if (used < 1 || used > 256)
        return sh_err(SH_EFORMAT, "%s: frequency table has %llu symbols (1..256 allowed)", what,
                      (unsigned long long)used);
    uint32_t freq[256] = {0};
    uint64_t sym = 0, sum = 0;
    for (uint64_t i = 0; i < used; i++) {
        SH_TRY(delta__get_varint(p, end, &dl, what));
        SH_TRY(delta__get_varint(p, end, &f, what));
        sym = (i == 0 ? 0 : sym + 1) + dl;
        if (dl > 255 || sym > 255)
            return sh_err(SH_EFORMAT, "%s: frequency table symbol beyond 255", what);
        if (f < 1 || f > DELTA__PROB)
            return sh_err(SH_EFORMAT, "%s: frequency %llu out of 1..16384", what,
                          (unsigned long long)f);
        freq[sym] = (uint32_t)f;
        sum += f;
    }
    if (sum != DELTA__PROB)
        return sh_err(SH_EFORMAT, "%s: frequencies sum to %llu, not 16384", what,
                      (unsigned long long)sum);
    uint32_t cum = 0;
    t->maxnb = 0;
    for (unsigned s = 0; s < 256; s++) {
        delta__dsym *y = &t->d[s];
        y->freq = (uint16_t)freq[s], y->cum = (uint16_t)cum;
        /* Symbols >= 16: e = 4 + (s - 16) / 4 and e - 2 extra bits below
         * the top bits 4 + (s - 16) % 4 (docs/delta-format.md, "Symbols"). */
        y->nb = s < 16 ? 0 : 4 + (s - 16) / 4 - 2;
        y->base = s < 16 ? s : (uint64_t)(4 + (s - 16) % 4) << y->nb;
        if (freq[s]) {
            memset(t->sym + cum, (int)s, freq[s]);
            if (y->nb > t->maxnb) t->maxnb = y->nb;
        }
        cum += freq[s];
    }
    return SH_OK;
}

void delta__renc_finish(delta__renc *e)
{
    for (int st = DELTA__STATES - 1; st >= 0; st--)
        for (int i = 3; i >= 0; i--) {
            if (e->ptr == e->start) {
                e->overflow = 1;
                return;
            }
            *--e->ptr = (uint8_t)(e->x[st] >> (8 * i));
        }
}
