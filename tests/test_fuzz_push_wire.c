/* fuzz_push_wire over its committed corpus, in `make test`: every input in
 * fuzz/corpus/fuzz_push_wire (the seeds and each regression the fuzzer
 * found) goes through the fuzz target itself, which aborts when a push
 * header unpacks into something the node cannot rely on. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

/* The target, compiled into this binary as it is into the fuzzer. */
#include "../fuzz/fuzz_push_wire.c"

static void test_corpus_replays(void **state) { assert_true(tu_replay_corpus("fuzz_push_wire", LLVMFuzzerTestOneInput) >= 10); }

/* An OFFER whose size is within a chunk of 2^64: rounding its size up to
 * whole chunks must not wrap to a small count the header then matches. */
static void test_offer_size_near_2_64(void **state)
{
    bcast__offer o = {.version = 1, .size = UINT64_MAX, .chunk_size = 2, .nchunks = 0, .flags = BCAST__OFFER_ANCHOR};
    uint8_t buf[BCAST__OFFER_LEN];
    bcast__pack_offer(&o, buf);
    bcast__offer got;
    assert_int_equal(bcast__unpack_offer(buf, sizeof buf, &got), SH_EFORMAT);
    assert_non_null(strstr(sh_errmsg(), "chunks for"));
    o.size = 4097, o.chunk_size = 4096, o.nchunks = 2;
    bcast__pack_offer(&o, buf);
    TU_OK(bcast__unpack_offer(buf, sizeof buf, &got));
    assert_int_equal(got.nchunks, 2);
}

/* A manifest a parent sends names a positive version, a base and a size
 * that are not negative, a known kind and a full digest; anything else is
 * refused by name before a byte of the object is taken. */
static void test_manifest_fields_refused(void **state)
{
    static const char *const h = "0123456789abcdef0123456789abcdef";
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"version\":0,\"kind\":\"anchor\",\"size\":10,\"xxh3\":\"%s\"}", "must be positive"},
        {"{\"version\":-3,\"kind\":\"anchor\",\"size\":10,\"xxh3\":\"%s\"}", "must be positive"},
        {"{\"version\":2,\"kind\":\"delta\",\"base\":-1,\"size\":10,\"xxh3\":\"%s\"}", "must be positive"},
        {"{\"version\":1,\"kind\":\"anchor\",\"size\":-10,\"xxh3\":\"%s\"}", "must be positive"},
        {"{\"kind\":\"anchor\",\"size\":10,\"xxh3\":\"%s\"}", "version"},
        {"{\"version\":1,\"kind\":\"full\",\"size\":10,\"xxh3\":\"%s\"}", "neither anchor nor delta"},
        {"{\"version\":3,\"kind\":\"delta\",\"base\":1,\"size\":10,\"xxh3\":\"%s\"}", "base must be v2"},
        {"{\"version\":1,\"kind\":\"anchor\",\"size\":10,\"xxh3\":\"%.31s\"}", "32 hex digits"},
    };
    char text[512];
    uint64_t v, b, sz;
    int anchor;
    sh_hash128 hash;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(text, sizeof text, bad[i].json, h);
        if (bcast__manifest_parse(text, &v, &b, &anchor, &sz, &hash) >= 0)
            fail_msg("manifest %s was accepted", text);
        if (!strstr(sh_errmsg(), bad[i].msg)) fail_msg("manifest %s: \"%s\" does not say %s", text, sh_errmsg(), bad[i].msg);
    }
    snprintf(text, sizeof text, "{\"version\":2,\"kind\":\"delta\",\"base\":1,\"size\":10,\"xxh3\":\"%s\"}", h);
    TU_OK(bcast__manifest_parse(text, &v, &b, &anchor, &sz, &hash));
    assert_int_equal(v, 2);
    assert_int_equal(b, 1);
    assert_int_equal(sz, 10);
    assert_int_equal(anchor, 0);
}

/* ANNOUNCE: one version, never 0 (a child would take it for "nothing
 * newer"), and exactly 8 bytes. */
static void test_announce(void **state)
{
    uint8_t buf[BCAST__ANNOUNCE_LEN + 1] = {0};
    uint64_t v = 0;
    bcast__pack_announce(42, buf);
    TU_OK(bcast__unpack_announce(buf, BCAST__ANNOUNCE_LEN, &v));
    assert_int_equal(v, 42);
    assert_int_equal(bcast__unpack_announce(buf, BCAST__ANNOUNCE_LEN + 1, &v), SH_EFORMAT);
    assert_int_equal(bcast__unpack_announce(buf, 4, &v), SH_EFORMAT);
    bcast__pack_announce(0, buf);
    assert_int_equal(bcast__unpack_announce(buf, BCAST__ANNOUNCE_LEN, &v), SH_EFORMAT);
    assert_non_null(strstr(sh_errmsg(), "version 0"));
}

/* Every bit of every numeric field of the headers survives pack then
 * unpack in its place: one bit set at a time, the others clear, so that a
 * field that loses or moves a bit (a byte shifted by 7 instead of 8, an
 * offset off by one) comes back different. */
static void test_headers_round_trip_every_bit(void **state)
{
    for (int b = 0; b < 64; b++) {
        uint64_t v64 = 1ull << b;
        uint32_t v32 = 1u << (b % 32);
        uint16_t v16 = (uint16_t)(1u << (b % 16));
        bcast__hello h = {.flags = v16, .have = v64, .resume_version = ~v64, .resume_next = v32,
                          .resume_hash = {v64, ~v64}, .nonce = {~v64, v64}, .proof = {v64, v64 >> 1}}, hg;
        uint8_t hb[BCAST__HELLO_LEN];
        bcast__pack_hello(&h, hb);
        TU_OK(bcast__unpack_hello(hb, sizeof hb, &hg));
        if (hg.flags != h.flags || hg.have != h.have || hg.resume_version != h.resume_version ||
            hg.resume_next != h.resume_next || !sh_hash128_eq(hg.resume_hash, h.resume_hash) ||
            !sh_hash128_eq(hg.nonce, h.nonce) || !sh_hash128_eq(hg.proof, h.proof))
            fail_msg("HELLO with bit %d: a field came back changed (flags %#x -> %#x)", b, h.flags, hg.flags);
        /* chunk_size x nchunks is the size exactly (the OFFER's own check). */
        bcast__offer o = {.version = v64, .base = ~v64, .hash = {v64, ~v64}, .chunk_size = v32 | 1,
                          .nchunks = (uint32_t)(1u << (b % 31)), .flags = v32 & ~(uint32_t)BCAST__OFFER_SQUASH,
                          .manifest_len = v32},
                     og;
        o.size = (uint64_t)o.chunk_size * o.nchunks;
        uint8_t ob[BCAST__OFFER_LEN];
        bcast__pack_offer(&o, ob);
        TU_OK(bcast__unpack_offer(ob, sizeof ob, &og));
        if (memcmp(&o, &og, sizeof o)) fail_msg("OFFER with bit %d: a field came back changed", b);
        bcast__chunk c = {.version = v64, .index = v32, .len = ~v32, .xxh64 = ~v64}, cg;
        uint8_t cb[BCAST__CHUNK_LEN];
        bcast__pack_chunk(&c, cb);
        TU_OK(bcast__unpack_chunk(cb, sizeof cb, &cg));
        if (memcmp(&c, &cg, sizeof c)) fail_msg("CHUNK with bit %d: a field came back changed", b);
        bcast__nack k = {.version = v64, .index = v32}, kg;
        uint8_t kb[BCAST__NACK_LEN];
        bcast__pack_nack(&k, kb);
        TU_OK(bcast__unpack_nack(kb, sizeof kb, &kg));
        assert_true(kg.version == k.version && kg.index == k.index);
        uint64_t a;
        uint8_t ab[BCAST__ANNOUNCE_LEN];
        bcast__pack_announce(v64, ab);
        TU_OK(bcast__unpack_announce(ab, sizeof ab, &a));
        assert_true(a == v64);
        sh_hash128 w = {v64, ~v64}, wg;
        uint8_t wb[BCAST__WELCOME_LEN];
        bcast__pack_welcome(w, wb);
        TU_OK(bcast__unpack_welcome(wb, sizeof wb, &wg));
        assert_true(sh_hash128_eq(w, wg));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_replays),
        cmocka_unit_test(test_offer_size_near_2_64),
        cmocka_unit_test(test_manifest_fields_refused),
        cmocka_unit_test(test_announce),
        cmocka_unit_test(test_headers_round_trip_every_bit),
    };
    return cmocka_run_group_tests_name("fuzz_push_wire corpus", tests, NULL, NULL);
}
