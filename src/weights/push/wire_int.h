/* Internal: the push protocol's message headers (docs/push-protocol.md).
 *
 * Every header is a fixed-size little-endian record, packed and unpacked
 * field by field so that the layout does not depend on the compiler. */
#ifndef SHOAL_BCAST_WIRE_H
#define SHOAL_BCAST_WIRE_H

#include <stdint.h>

#include "shoal/common.h"

enum {
    BCAST__AM_HELLO = 1,
    BCAST__AM_REDIRECT = 2,
    BCAST__AM_OFFER = 3,
    BCAST__AM_CHUNK = 4,
    BCAST__AM_NACK = 5,
    BCAST__AM_WELCOME = 6,
    BCAST__AM_ANNOUNCE = 7,
};

#define BCAST__MAGIC 0x31424853u /* "SHB1" little-endian */
#define BCAST__PROTO 2
#define BCAST__NAME 64
#define BCAST__ZONE 32
#define BCAST__ADDR 64

/* OFFER flags */
#define BCAST__OFFER_ANCHOR 1u
#define BCAST__OFFER_SQUASH 2u /* a squashed delta from `base` (< version - 1 allowed) */

#define BCAST__HELLO_LEN 256
#define BCAST__REDIRECT_LEN 64
#define BCAST__OFFER_LEN 56
#define BCAST__CHUNK_LEN 24
#define BCAST__NACK_LEN 12
#define BCAST__WELCOME_LEN 16
#define BCAST__ANNOUNCE_LEN 8

/* HELLO flags */
#define BCAST__HELLO_ACCEPTS 1u  /* takes children */
#define BCAST__HELLO_ANNOUNCE 2u /* understands ANNOUNCE (a parent sends it only then) */

typedef struct bcast__hello {
    uint32_t magic;
    uint16_t proto;
    uint16_t flags; /* bit 0: accepts children */
    uint64_t have;
    uint64_t resume_version;
    uint32_t resume_next;
    sh_hash128 resume_hash;
    char name[BCAST__NAME];
    char zone[BCAST__ZONE];
    char addr[BCAST__ADDR];
    sh_hash128 nonce; /* fresh per connection */
    sh_hash128 proof; /* net_secret_proof(run secret, "push child", nonce), or zero */
} bcast__hello;

typedef struct bcast__offer {
    uint64_t version;
    uint64_t base;
    uint64_t size;
    sh_hash128 hash;
    uint32_t chunk_size;
    uint32_t nchunks;
    uint32_t flags; /* BCAST__OFFER_* */
    uint32_t manifest_len;
} bcast__offer;

typedef struct bcast__chunk {
    uint64_t version;
    uint32_t index;
    uint32_t len;
    uint64_t xxh64;
} bcast__chunk;

typedef struct bcast__nack {
    uint64_t version;
    uint32_t index;
} bcast__nack;

void bcast__pack_hello(const bcast__hello *h, uint8_t out[BCAST__HELLO_LEN]);
int bcast__unpack_hello(const void *buf, size_t len, bcast__hello *h);
void bcast__pack_offer(const bcast__offer *o, uint8_t out[BCAST__OFFER_LEN]);
int bcast__unpack_offer(const void *buf, size_t len, bcast__offer *o);
void bcast__pack_chunk(const bcast__chunk *c, uint8_t out[BCAST__CHUNK_LEN]);
int bcast__unpack_chunk(const void *buf, size_t len, bcast__chunk *c);
void bcast__pack_nack(const bcast__nack *k, uint8_t out[BCAST__NACK_LEN]);
int bcast__unpack_nack(const void *buf, size_t len, bcast__nack *k);
/* WELCOME (parent -> child, first, when the parent has the run's secret):
 * net_secret_proof(secret, "push parent", the child's HELLO nonce). */
void bcast__pack_welcome(sh_hash128 proof, uint8_t out[BCAST__WELCOME_LEN]);
int bcast__unpack_welcome(const void *buf, size_t len, sh_hash128 *proof);
/* ANNOUNCE (parent -> child that set BCAST__HELLO_ANNOUNCE): the newest
 * version the tree above the child has (version > 0). */
void bcast__pack_announce(uint64_t newest, uint8_t out[BCAST__ANNOUNCE_LEN]);
int bcast__unpack_announce(const void *buf, size_t len, uint64_t *newest);
/* A redirect is one NUL-padded "host:port" of BCAST__REDIRECT_LEN bytes. */
int bcast__unpack_redirect(const void *buf, size_t len, char out[BCAST__ADDR]);

#endif
