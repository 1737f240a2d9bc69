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

/* A push manifest's version must be positive, its base and size not
 * negative: a node never takes an object that names version 0 or a
 * negative size (the fields it then offers and verifies against). */
static void test_manifest_fields_in_range(void **state)
{
    const char *hx = "00112233445566778899aabbccddeeff";
    char text[512];
    uint64_t v, b, sz;
    int anchor;
    sh_hash128 h;
    snprintf(text, sizeof text, "{\"version\":1,\"kind\":\"anchor\",\"base\":0,\"size\":0,\"xxh3\":\"%s\"}", hx);
    TU_OK(bcast__manifest_parse(text, &v, &b, &anchor, &sz, &h));
    assert_int_equal(v, 1);
    /* Each bound alone (anchors: a delta's base is also checked against
     * its version, which would refuse some of these for another reason). */
    const char *bad[][4] = {{"0", "0", "10", "anchor"}, {"-1", "0", "10", "anchor"}, {"1", "-1", "10", "anchor"},
                            {"1", "0", "-1", "anchor"}};
    for (int i = 0; i < 4; i++) {
        snprintf(text, sizeof text, "{\"version\":%s,\"kind\":\"%s\",\"base\":%s,\"size\":%s,\"xxh3\":\"%s\"}",
                 bad[i][0], bad[i][3], bad[i][1], bad[i][2], hx);
        if (bcast__manifest_parse(text, &v, &b, &anchor, &sz, &h) != SH_EFORMAT || !strstr(sh_errmsg(), "must be positive"))
            fail_msg("manifest %s accepted (or refused for another reason: %s)", text, sh_errmsg());
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_replays),
        cmocka_unit_test(test_offer_size_near_2_64),
        cmocka_unit_test(test_manifest_fields_in_range),
    };
    return cmocka_run_group_tests_name("fuzz_push_wire corpus", tests, NULL, NULL);
}
