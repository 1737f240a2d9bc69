/* The push protocol's headers, packed little-endian field by field. */
#include "weights/push/wire_int.h"

#include <string.h>

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Copies a NUL-padded text field and insists that it is terminated, so that
 * a peer cannot make us read past the field. */
static int get_text(const uint8_t *p, size_t cap, char *out, const char *what)
{
    if (!memchr(p, 0, cap)) return sh_err(SH_EFORMAT, "push message: %s field is not terminated", what);
    memcpy(out, p, cap);
    return SH_OK;
}

static void put_text(uint8_t *p, size_t cap, const char *s)
{
    memset(p, 0, cap);
    size_t n = strnlen(s, cap - 1);
    memcpy(p, s, n);
}

void bcast__pack_hello(const bcast__hello *h, uint8_t out[BCAST__HELLO_LEN])
{
    memset(out, 0, BCAST__HELLO_LEN);
    put32(out, BCAST__MAGIC);
    put16(out + 4, BCAST__PROTO);
    put16(out + 6, h->flags);
    put64(out + 8, h->have);
    put64(out + 16, h->resume_version);
    put32(out + 24, h->resume_next);
    put64(out + 32, h->resume_hash.lo);
    put64(out + 40, h->resume_hash.hi);
    put_text(out + 48, BCAST__NAME, h->name);
    put_text(out + 112, BCAST__ZONE, h->zone);
    put_text(out + 144, BCAST__ADDR, h->addr);
    put64(out + 208, h->nonce.lo);
    put64(out + 216, h->nonce.hi);
    put64(out + 224, h->proof.lo);
    put64(out + 232, h->proof.hi);
}

int bcast__unpack_hello(const void *buf, size_t len, bcast__hello *h)
{
    const uint8_t *p = buf;
    if (len != BCAST__HELLO_LEN)
        return sh_err(SH_EFORMAT, "push HELLO: %zu bytes, expected %d", len, BCAST__HELLO_LEN);
    h->magic = get32(p);
    h->proto = get16(p + 4);
    if (h->magic != BCAST__MAGIC) return sh_err(SH_EFORMAT, "push HELLO: bad magic 0x%08x", h->magic);
    if (h->proto != BCAST__PROTO)
        return sh_err(SH_EMISMATCH, "push HELLO: protocol %u, this node speaks %d", h->proto,
                      BCAST__PROTO);
    h->flags = get16(p + 6);
    h->have = get64(p + 8);
    h->resume_version = get64(p + 16);
    h->resume_next = get32(p + 24);
    h->resume_hash.lo = get64(p + 32);
    h->resume_hash.hi = get64(p + 40);
    SH_TRY(get_text(p + 48, BCAST__NAME, h->name, "name"));
    SH_TRY(get_text(p + 112, BCAST__ZONE, h->zone, "zone"));
    SH_TRY(get_text(p + 144, BCAST__ADDR, h->addr, "addr"));
    h->nonce.lo = get64(p + 208);
    h->nonce.hi = get64(p + 216);
    h->proof.lo = get64(p + 224);
    h->proof.hi = get64(p + 232);
    return SH_OK;
}

void bcast__pack_offer(const bcast__offer *o, uint8_t out[BCAST__OFFER_LEN])
{
    put64(out, o->version);
    put64(out + 8, o->base);
    put64(out + 16, o->size);
    put64(out + 24, o->hash.lo);
    put64(out + 32, o->hash.hi);
    put32(out + 40, o->chunk_size);
    put32(out + 44, o->nchunks);
    put32(out + 48, o->flags);
    put32(out + 52, o->manifest_len);
}

int bcast__unpack_offer(const void *buf, size_t len, bcast__offer *o)
{
    const uint8_t *p = buf;
    if (len != BCAST__OFFER_LEN)
        return sh_err(SH_EFORMAT, "push OFFER: %zu bytes, expected %d", len, BCAST__OFFER_LEN);
    o->version = get64(p);
    o->base = get64(p + 8);
    o->size = get64(p + 16);
    o->hash.lo = get64(p + 24);
    o->hash.hi = get64(p + 32);
    o->chunk_size = get32(p + 40);
    o->nchunks = get32(p + 44);
    o->flags = get32(p + 48);
    o->manifest_len = get32(p + 52);
    if (o->version == 0) return sh_err(SH_EFORMAT, "push OFFER: version 0");
    if ((o->flags & BCAST__OFFER_SQUASH) && ((o->flags & BCAST__OFFER_ANCHOR) || o->base >= o->version))
        return sh_err(SH_EFORMAT, "push OFFER v%llu: a squashed delta needs a base below it, not %llu",
                      (unsigned long long)o->version, (unsigned long long)o->base);
    if (o->chunk_size == 0) return sh_err(SH_EFORMAT, "push OFFER v%llu: chunk size 0",
                                          (unsigned long long)o->version);
    /* Rounded up without the sum, which a size near 2^64 would wrap. */
    uint64_t want = o->size / o->chunk_size + (o->size % o->chunk_size != 0);
    if (want != o->nchunks)
        return sh_err(SH_EFORMAT, "push OFFER v%llu: %u chunks for %llu bytes in chunks of %u",
                      (unsigned long long)o->version, o->nchunks, (unsigned long long)o->size,
                      o->chunk_size);
    return SH_OK;
}

void bcast__pack_chunk(const bcast__chunk *c, uint8_t out[BCAST__CHUNK_LEN])
{
    put64(out, c->version);
    put32(out + 8, c->index);
    put32(out + 12, c->len);
    put64(out + 16, c->xxh64);
}

int bcast__unpack_chunk(const void *buf, size_t len, bcast__chunk *c)
{
    const uint8_t *p = buf;
    if (len != BCAST__CHUNK_LEN)
        return sh_err(SH_EFORMAT, "push CHUNK: %zu bytes, expected %d", len, BCAST__CHUNK_LEN);
    c->version = get64(p);
    c->index = get32(p + 8);
    c->len = get32(p + 12);
    c->xxh64 = get64(p + 16);
    return SH_OK;
}

void bcast__pack_nack(const bcast__nack *k, uint8_t out[BCAST__NACK_LEN])
{
    put64(out, k->version);
    put32(out + 8, k->index);
}

int bcast__unpack_nack(const void *buf, size_t len, bcast__nack *k)
{
    const uint8_t *p = buf;
    if (len != BCAST__NACK_LEN)
        return sh_err(SH_EFORMAT, "push NACK: %zu bytes, expected %d", len, BCAST__NACK_LEN);
    k->version = get64(p);
    k->index = get32(p + 8);
    return SH_OK;
}

int bcast__unpack_redirect(const void *buf, size_t len, char out[BCAST__ADDR])
{
    if (len != BCAST__REDIRECT_LEN)
        return sh_err(SH_EFORMAT, "push REDIRECT: %zu bytes, expected %d", len, BCAST__REDIRECT_LEN);
    return get_text(buf, BCAST__ADDR, out, "redirect address");
}

void bcast__pack_announce(uint64_t newest, uint8_t out[BCAST__ANNOUNCE_LEN]) { put64(out, newest); }

int bcast__unpack_announce(const void *buf, size_t len, uint64_t *newest)
{
    if (len != BCAST__ANNOUNCE_LEN)
        return sh_err(SH_EFORMAT, "push ANNOUNCE: %zu bytes, expected %d", len, BCAST__ANNOUNCE_LEN);
    *newest = get64(buf);
    if (*newest == 0) return sh_err(SH_EFORMAT, "push ANNOUNCE: version 0");
    return SH_OK;
}

void bcast__pack_welcome(sh_hash128 proof, uint8_t out[BCAST__WELCOME_LEN])
{
    put64(out, proof.lo);
    put64(out + 8, proof.hi);
}

int bcast__unpack_welcome(const void *buf, size_t len, sh_hash128 *proof)
{
    const uint8_t *p = buf;
    if (len != BCAST__WELCOME_LEN)
        return sh_err(SH_EFORMAT, "push WELCOME: %zu bytes, expected %d", len, BCAST__WELCOME_LEN);
    proof->lo = get64(p);
    proof->hi = get64(p + 8);
    return SH_OK;
}
