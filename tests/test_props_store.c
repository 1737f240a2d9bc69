/* Properties of the digests and the store that the generated mutants
 * (scripts/mutgen.py, docs/testing.md) found no test held:
 *  - a digest comparison uses the whole hash: two digests that differ in
 *    any one of their 128 bits are different;
 *  - a digest is read from exactly 32 hex digits, in either case, and any
 *    other character is refused (none is read as a value);
 *  - a run id is 1 to 64 characters, exactly at the boundary. */
#include "testutil.h"

#include <string.h>
#include <sys/stat.h>

#include "shoal/store.h"

static void test_digest_compare_whole(void **state)
{
    sh_hash128 a = sh_hash128_of("shoal", 5);
    assert_true(sh_hash128_eq(a, a));
    for (int bit = 0; bit < 128; bit++) {
        sh_hash128 b = a;
        if (bit < 64) b.lo ^= 1ull << bit;
        else b.hi ^= 1ull << (bit - 64);
        if (sh_hash128_eq(a, b) || sh_hash128_eq(b, a)) fail_msg("digests that differ in bit %d compare equal", bit);
    }
}

static void test_digest_parse_exact(void **state)
{
    sh_hash128 h = {.hi = 0x0123456789abcdefull, .lo = 0xfedcba9876543210ull}, got;
    char hex[33], up[33];
    sh_hash128_hex(h, hex);
    assert_string_equal(hex, "0123456789abcdeffedcba9876543210");
    TU_OK(sh_hash128_parse(hex, &got));
    assert_true(sh_hash128_eq(got, h));
    for (int i = 0; i < 33; i++) up[i] = (char)(hex[i] >= 'a' && hex[i] <= 'f' ? hex[i] - 'a' + 'A' : hex[i]);
    TU_OK(sh_hash128_parse(up, &got));
    assert_true(sh_hash128_eq(got, h));
    /* Every character that is not a hex digit, at every place class. */
    for (int c = 1; c < 256; c++) {
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')) continue;
        for (int at = 0; at < 32; at += 31) {
            char bad[33];
            memcpy(bad, hex, 33);
            bad[at] = (char)c;
            if (sh_hash128_parse(bad, &got) != SH_EFORMAT) fail_msg("'%c' (0x%02x) at %d read as a hex digit", c, c, at);
        }
    }
    TU_ERR(sh_hash128_parse("0123456789abcdeffedcba987654321", &got), SH_EFORMAT, "expected 32 hex digits");
    TU_ERR(sh_hash128_parse("0123456789abcdeffedcba98765432100", &got), SH_EFORMAT, "expected 32 hex digits");
    TU_ERR(sh_hash128_parse(NULL, &got), SH_EFORMAT, "expected 32 hex digits");
}

static void test_run_name_bounds(void **state)
{
    const char *root = tu_path("props-runs");
    char name[70];
    store *s;
    memset(name, 'r', 64);
    name[64] = 0;
    TU_OK(store_open(root, name, 1, &s));
    store_close(s);
    name[65] = 0, name[64] = 'r';
    TU_ERR(store_open(root, name, 1, &s), SH_EINVAL, "run id");
    TU_OK(store_open(root, "a", 1, &s));
    store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_compare_whole),
        cmocka_unit_test(test_digest_parse_exact),
        cmocka_unit_test(test_run_name_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
