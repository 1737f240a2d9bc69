/* libFuzzer target: the push protocol's headers and OFFER manifests, the
 * bytes a push node takes from its network peers (src/weights/push/push_wire.c,
 * bcast__manifest_parse).  The first byte picks the message, the rest is
 * its bytes (0 HELLO, 1 OFFER, 2 CHUNK, 3 NACK, 4 REDIRECT, 5 an OFFER's
 * manifest, 6 WELCOME).  Besides crashes and undefined behaviour, a finding is a header
 * that unpacks but breaks what the node then relies on: an OFFER whose
 * chunk count is not its size in chunks, a text field without its NUL, a
 * delta manifest whose base is not the version before, or a header that
 * does not unpack again to itself once packed. */
#include <stdlib.h>
#include <string.h>

#include "weights/push/obj_int.h"
#include "weights/push/wire_int.h"

static void check_hello(const uint8_t *p, size_t n)
{
    bcast__hello h, again;
    if (bcast__unpack_hello(p, n, &h) < 0) return;
    if (!memchr(h.name, 0, sizeof h.name) || !memchr(h.zone, 0, sizeof h.zone) || !memchr(h.addr, 0, sizeof h.addr))
        abort();
    uint8_t buf[BCAST__HELLO_LEN];
    bcast__pack_hello(&h, buf);
    if (bcast__unpack_hello(buf, sizeof buf, &again) < 0) abort();
    if (again.have != h.have || again.flags != h.flags || again.resume_version != h.resume_version ||
        again.resume_next != h.resume_next || !sh_hash128_eq(again.resume_hash, h.resume_hash) ||
        !sh_hash128_eq(again.nonce, h.nonce) || !sh_hash128_eq(again.proof, h.proof) ||
        strcmp(again.name, h.name) || strcmp(again.zone, h.zone) || strcmp(again.addr, h.addr))
        abort();
}

static void check_offer(const uint8_t *p, size_t n)
{
    bcast__offer o, again;
    if (bcast__unpack_offer(p, n, &o) < 0) return;
    /* The node sizes its chunk state by nchunks and addresses chunk i at
     * i * chunk_size: the count must be the size in chunks, exactly. */
    unsigned __int128 want = ((unsigned __int128)o.size + o.chunk_size - 1) / o.chunk_size;
    if (o.version == 0 || o.chunk_size == 0 || want != o.nchunks) abort();
    uint8_t buf[BCAST__OFFER_LEN];
    bcast__pack_offer(&o, buf);
    if (bcast__unpack_offer(buf, sizeof buf, &again) < 0 || memcmp(&again, &o, sizeof o)) abort();
}

static void check_chunk(const uint8_t *p, size_t n)
{
    bcast__chunk c, again;
    if (bcast__unpack_chunk(p, n, &c) < 0) return;
    uint8_t buf[BCAST__CHUNK_LEN];
    bcast__pack_chunk(&c, buf);
    if (bcast__unpack_chunk(buf, sizeof buf, &again) < 0 || memcmp(&again, &c, sizeof c)) abort();
}

static void check_nack(const uint8_t *p, size_t n)
{
    bcast__nack k, again;
    if (bcast__unpack_nack(p, n, &k) < 0) return;
    uint8_t buf[BCAST__NACK_LEN];
    bcast__pack_nack(&k, buf);
    if (bcast__unpack_nack(buf, sizeof buf, &again) < 0 || again.version != k.version || again.index != k.index)
        abort();
}

static void check_welcome(const uint8_t *p, size_t n)
{
    sh_hash128 proof, again;
    if (bcast__unpack_welcome(p, n, &proof) < 0) return;
    uint8_t buf[BCAST__WELCOME_LEN];
    bcast__pack_welcome(proof, buf);
    if (bcast__unpack_welcome(buf, sizeof buf, &again) < 0 || !sh_hash128_eq(again, proof)) abort();
}

static void check_redirect(const uint8_t *p, size_t n)
{
    char addr[BCAST__ADDR];
    if (bcast__unpack_redirect(p, n, addr) < 0) return;
    if (!memchr(addr, 0, sizeof addr)) abort();
}

static void check_manifest(const uint8_t *p, size_t n)
{
    char *text = malloc(n + 1);
    if (!text) return;
    memcpy(text, p, n);
    text[n] = 0;
    uint64_t version, base, size;
    int anchor;
    sh_hash128 h;
    if (bcast__manifest_parse(text, &version, &base, &anchor, &size, &h) == 0) {
        if (version == 0 || (anchor && base != 0) || (!anchor && base + 1 != version)) abort();
        if (size > (uint64_t)INT64_MAX) abort();
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 7) {
    case 0: check_hello(p, n); break;
    case 1: check_offer(p, n); break;
    case 2: check_chunk(p, n); break;
    case 3: check_nack(p, n); break;
    case 4: check_redirect(p, n); break;
    case 5: check_manifest(p, n); break;
    default: check_welcome(p, n); break;
    }
    return 0;
}
