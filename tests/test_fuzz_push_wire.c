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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_replays),
        cmocka_unit_test(test_offer_size_near_2_64),
        cmocka_unit_test(test_manifest_fields_refused),
        cmocka_unit_test(test_announce),
    };
    return cmocka_run_group_tests_name("fuzz_push_wire corpus", tests, NULL, NULL);
}
