/* Properties of the delta codec that the generated mutants
 * (scripts/mutgen.py, docs/testing.md) found no test held:
 *  - an in-place apply of a delta whose chunks are dense differences (most
 *    units changed by a little, as an optimizer step on integers or on the
 *    float bits) rebuilds the target, and applied again (to the target, a
 *    wrong base) is refused and leaves the image as it was;
 *  - an in-place apply that meets a corrupt dense chunk reports the chunk's
 *    own error (not a failed undo) and leaves the image exactly the base
 *    (or, when the byte is one the decoder never reads, the target);
 *  - a delta that drops base tensors (the target has fewer) rebuilds the
 *    target from the base, and with base verification refuses a base that
 *    differs only in a tensor the delta does not diff. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "shoal/ckpt.h"
#include "shoal/delta.h"

static uint64_t rng = 88172645463325252ull;

static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Reads a checkpoint file into memory and opens it there. */
static ckpt *open_mem(const char *path, char **buf, size_t *len)
{
    ckpt *c;
    TU_OK(sh_read_file(path, 1 << 30, buf, len));
    TU_OK(ckpt_open_mem(*buf, *len, path, &c));
    return c;
}

static void test_inplace_dense_is_target(void **state)
{
    enum { N = 1 << 16 };
    uint32_t *old = malloc(N * 4), *new = malloc(N * 4);
    for (size_t i = 0; i < N; i++) {
        old[i] = next_u32();
        new[i] = old[i] + (i % 4 ? 1u + (uint32_t)(i % 3) : 0u); /* 3 units in 4, by 1 to 3 */
    }
    ckpt_tensor t = {.name = "w", .dtype = CKPT_I32, .ndim = 1, .shape = {N}, .numel = N, .nbytes = N * 4};
    char b[4096], g[4096];
    snprintf(b, sizeof b, "%s/dense-base.st", tu_tmpdir());
    snprintf(g, sizeof g, "%s/dense-target.st", tu_tmpdir());
    t.data = (const uint8_t *)old;
    TU_OK(ckpt_save(b, &t, 1, NULL));
    t.data = (const uint8_t *)new;
    TU_OK(ckpt_save(g, &t, 1, NULL));
    char *bi, *ti;
    size_t bl, tl;
    ckpt *B = open_mem(b, &bi, &bl), *T = open_mem(g, &ti, &tl);
    assert_int_equal(bl, tl);
    sh_buf d = {0};
    TU_OK(delta_make_mem(B, T, &(delta_opts){0}, &d, NULL));
    assert_true(d.len < N); /* a difference, not the new bytes */
    delta *dp;
    TU_OK(delta_parse(d.data, d.len, 0, &dp));
    uint8_t *img = malloc(bl);
    for (int threads = 1; threads <= 2; threads++) {
        memcpy(img, bi, bl);
        TU_OK(delta_apply_mem_inplace(img, bl, dp, &(delta_opts){.threads = threads}));
        assert_memory_equal(img, ti, tl);
        TU_ERR(delta_apply_mem_inplace(img, bl, dp, &(delta_opts){.threads = threads}), SH_EMISMATCH, "wrong base");
        assert_memory_equal(img, ti, tl);
    }
    /* Corrupt the chunk's payload (the container's checksum skipped, as a
     * fuzzer does): it lies between the 24-byte head plus the manifest and
     * the 16-byte trailer. */
    uint64_t ml = 0;
    for (int i = 7; i >= 0; i--) ml = ml << 8 | d.data[16 + i];
    size_t lo = 24 + (size_t)ml, hi = d.len - 16;
    assert_true(hi > lo + 64);
    const size_t at[] = {hi - 1, hi - 2, lo + (hi - lo) / 2, lo + 4};
    int decode_errors = 0;
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        uint8_t *copy = malloc(d.len);
        memcpy(copy, d.data, d.len);
        copy[at[k]] ^= 0x10;
        delta *bad;
        TU_OK(delta_parse(copy, d.len, DELTA_NO_CHECKSUM, &bad));
        memcpy(img, bi, bl);
        int rc = delta_apply_mem_inplace(img, bl, bad, &(delta_opts){.threads = 1});
        if (rc == SH_OK && memcmp(img, ti, tl)) fail_msg("a chunk corrupt at byte %zu was applied", at[k]);
        if (rc == SH_OK) { /* a byte the decoder never reads: the target */
            delta_free(bad);
            free(copy);
            continue;
        }
        if (strstr(sh_errmsg(), "undo")) fail_msg("corrupt at byte %zu: the undo failed: %s", at[k], sh_errmsg());
        if (memcmp(img, bi, bl)) fail_msg("corrupt at byte %zu: the image is not the base after the undo", at[k]);
        if (rc == SH_EFORMAT && !strstr(sh_errmsg(), "tensor \"w\" chunk 0"))
            fail_msg("corrupt at byte %zu: the error does not name the chunk: %s", at[k], sh_errmsg());
        decode_errors += rc == SH_EFORMAT;
        delta_free(bad);
        free(copy);
    }
    assert_true(decode_errors > 0); /* the decoder, not only the digest, refused one */
    free(img);
    delta_free(dp);
    sh_buf_free(&d);
    ckpt_close(B), ckpt_close(T);
    free(bi), free(ti), free(old), free(new);
}

static void test_dropped_tensors_verified(void **state)
{
    enum { U = 300 };
    ckpt_tensor t[U + 1];
    static uint32_t a[4096], a2[4096], u[U];
    char names[U][16];
    for (size_t i = 0; i < 4096; i++) a[i] = next_u32(), a2[i] = a[i] + (i % 7 == 0);
    t[0] = (ckpt_tensor){.name = "a", .dtype = CKPT_U32, .ndim = 1, .shape = {4096}, .numel = 4096,
                         .nbytes = sizeof a, .data = (const uint8_t *)a};
    for (size_t k = 0; k < U; k++) {
        snprintf(names[k], sizeof names[k], "u%03zu", k);
        u[k] = next_u32();
        t[k + 1] = (ckpt_tensor){.name = names[k], .dtype = CKPT_U32, .ndim = 1, .shape = {1}, .numel = 1,
                                 .nbytes = 4, .data = (const uint8_t *)&u[k]};
    }
    char b[4096], bad[4096], g[4096], dpath[4096], out[4096];
    snprintf(b, sizeof b, "%s/drop-base.st", tu_tmpdir());
    snprintf(bad, sizeof bad, "%s/drop-bad.st", tu_tmpdir());
    snprintf(g, sizeof g, "%s/drop-target.st", tu_tmpdir());
    snprintf(dpath, sizeof dpath, "%s/drop.shd", tu_tmpdir());
    snprintf(out, sizeof out, "%s/drop-out.st", tu_tmpdir());
    TU_OK(ckpt_save(b, t, U + 1, NULL));
    u[U / 2] ^= 1; /* one tensor the target drops */
    TU_OK(ckpt_save(bad, t, U + 1, NULL));
    t[0].data = (const uint8_t *)a2;
    TU_OK(ckpt_save(g, t, 1, NULL));
    TU_OK(delta_make(b, g, dpath, &(delta_opts){0}, NULL));
    TU_OK(delta_apply(b, dpath, out, &(delta_opts){.verify_base = 1}));
    tu_assert_same_file(out, g);
    TU_ERR(delta_apply(bad, dpath, out, &(delta_opts){.verify_base = 1}), SH_EMISMATCH, "base");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inplace_dense_is_target),
        cmocka_unit_test(test_dropped_tensors_verified),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
