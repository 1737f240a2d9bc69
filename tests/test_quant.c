/* Tests for FP8 block quantisation and its incremental update. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/delta.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* w: [130, 200] bf16 (edge blocks on both axes), big: [300, 260] bf16,
 * emb: [64, 128] bf16 (kept with --keep emb), norm: [200] bf16, id: I32. */
static void build(const char *path, uint16_t *w, uint16_t *big, uint16_t *emb, uint16_t *norm,
                  int32_t *id, int reshape)
{
    ckpt_tensor t[5] = {
        {.name = "w", .dtype = CKPT_BF16, .ndim = 2, .shape = {130, 200}, .data = (uint8_t *)w},
        {.name = "big", .dtype = CKPT_BF16, .ndim = 2, .shape = {300, 260}, .data = (uint8_t *)big},
        {.name = "emb", .dtype = CKPT_BF16, .ndim = 2, .shape = {64, 128}, .data = (uint8_t *)emb},
        {.name = "norm", .dtype = CKPT_BF16, .ndim = 1, .shape = {200}, .data = (uint8_t *)norm},
        {.name = "id", .dtype = CKPT_I32, .ndim = 1, .shape = {4}, .data = (uint8_t *)id},
    };
    if (reshape) t[0].shape[0] = 200, t[0].shape[1] = 130;
    TU_OK(ckpt_save(path, t, 5, NULL));
}

static void fill(uint16_t *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = ckpt_f32_to_bf16(scale * frand());
}

static void test_quant_from_scratch(void **state)
{
    static uint16_t w[130 * 200], big[300 * 260], emb[64 * 128], norm[200];
    int32_t id[4] = {1, 2, 3, 4};
    fill(w, 130 * 200, 0.05f), fill(big, 300 * 260, 2.0f), fill(emb, 64 * 128, 1.0f), fill(norm, 200, 1.0f);
    big[5] = ckpt_f32_to_bf16(0.0f);
    const char *in = tu_path("q_in.safetensors"), *out = tu_path("q_out.safetensors");
    build(in, w, big, emb, norm, id, 0);
    char *o;
    assert_int_equal(tu_run(&o, "%s quant fp8 %s -o %s --keep emb", tu_shoal(), in, out), 0);
    free(o);
    /* --json: one object saying what was quantised, the same file written.
     * w: 2 x 2 blocks, big: 3 x 3; emb (kept), norm and id copied.  Bytes
     * are tensor data: bf16 in; fp8 values, F32 scales and copies out. */
    const char *out2 = tu_path("q_out2.safetensors");
    assert_int_equal(tu_run(&o, "%s quant fp8 %s -o %s --keep emb --json 2>/dev/null", tu_shoal(), in, out2), 0);
    json_t *j = json_loads(o, 0, NULL);
    if (!j) fail_msg("quant fp8 --json: not one JSON object: %s", o);
    assert_int_equal(json_integer_value(json_object_get(j, "tensors_quantised")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "tensors_copied")), 3);
    assert_int_equal(json_integer_value(json_object_get(j, "blocks_quantised")), 13);
    assert_int_equal(json_integer_value(json_object_get(j, "bytes_in")), (130 * 200 + 300 * 260 + 64 * 128 + 200) * 2 + 16);
    assert_int_equal(json_integer_value(json_object_get(j, "bytes_out")),
                     130 * 200 + 4 * 4 + 300 * 260 + 9 * 4 + 64 * 128 * 2 + 200 * 2 + 16);
    assert_true(json_is_real(json_object_get(j, "seconds")) && json_real_value(json_object_get(j, "seconds")) >= 0);
    json_decref(j);
    free(o);
    assert_int_equal(tu_run(NULL, "cmp %s %s", out, out2), 0);
    ckpt *c;
    TU_OK(ckpt_open(out, &c));
    const ckpt_tensor *q = ckpt_find(c, "w"), *s = ckpt_find(c, "w_scale_inv");
    assert_non_null(q);
    assert_non_null(s);
    assert_int_equal(q->dtype, CKPT_F8_E4M3);
    assert_int_equal(s->dtype, CKPT_F32);
    assert_int_equal(s->shape[0], 2);
    assert_int_equal(s->shape[1], 2);
    assert_int_equal(ckpt_find(c, "emb")->dtype, CKPT_BF16);
    assert_null(ckpt_find(c, "emb_scale_inv"));
    assert_int_equal(ckpt_find(c, "norm")->dtype, CKPT_BF16);
    assert_memory_equal(ckpt_find(c, "id")->data, id, 16);
    assert_non_null(ckpt_meta(c, "shoal.source_digest"));
    /* Dequantised values are within e4m3's half-ulp (2^-4 relative) plus
     * the subnormal step of the block's scale, and each block's amax maps
     * to 448. */
    const float *sc = (const float *)s->data;
    for (int64_t r = 0; r < 130; r++)
        for (int64_t col = 0; col < 200; col++) {
            float x = ckpt_bf16_to_f32(w[r * 200 + col]);
            float si = sc[(r / 128) * 2 + col / 128];
            float y = ckpt_e4m3_to_f32(q->data[r * 200 + col]) * si;
            if (fabsf(x - y) > fabsf(x) / 16 + si * 0x1p-9f)
                fail_msg("w[%lld,%lld] = %g dequantises to %g", (long long)r, (long long)col, x, y);
        }
    int at448 = 0;
    for (int64_t i = 0; i < 130 * 200; i++) at448 += (q->data[i] & 0x7f) == 0x7e;
    assert_true(at448 >= 4);
    ckpt_close(c);
}

static void test_quant_update_identical(void **state)
{
    static uint16_t w[130 * 200], big[300 * 260], emb[64 * 128], norm[200];
    int32_t id[4] = {1, 2, 3, 4};
    fill(w, 130 * 200, 0.05f), fill(big, 300 * 260, 2.0f), fill(emb, 64 * 128, 1.0f), fill(norm, 200, 1.0f);
    const char *b = tu_path("u_base.safetensors"), *n = tu_path("u_new.safetensors");
    const char *b8 = tu_path("u_base8.safetensors"), *n8 = tu_path("u_new8.safetensors");
    const char *d = tu_path("u.delta"), *n8u = tu_path("u_new8_upd.safetensors");
    build(b, w, big, emb, norm, id, 0);
    /* A few changes: two blocks of big (one of them an edge block), one of
     * w, the kept emb and the copied norm. */
    big[3] ^= 1, big[299 * 260 + 259] ^= 2, w[129 * 200 + 10] ^= 1, emb[7] ^= 1, norm[0] ^= 1;
    build(n, w, big, emb, norm, id, 0);
    TU_OK(delta_make(b, n, d, NULL, NULL));
    const char *keep[] = {"emb", NULL};
    TU_OK(delta_quant_fp8(b, b8, keep, NULL, NULL));
    TU_OK(delta_quant_fp8(n, n8, keep, NULL, NULL));
    uint64_t blocks = 0;
    TU_OK(delta_quant_fp8_update(b8, n, d, n8u, keep, &(delta_opts){.threads = 2}, &blocks));
    assert_int_equal(blocks, 3);
    assert_int_equal(tu_run(NULL, "cmp %s %s", n8, n8u), 0);
    /* In place, through the command line. */
    char *o;
    assert_int_equal(tu_run(&o, "%s quant fp8 --update %s --from %s --delta %s --keep emb --json",
                            tu_shoal(), b8, n, d), 0);
    assert_non_null(strstr(o, "\"blocks_requantised\":3"));
    free(o);
    assert_int_equal(tu_run(NULL, "cmp %s %s", n8, b8), 0);
    /* Now b8 is the new version: updating it again with the same delta is
     * refused, as is a --from that is not the delta's target. */
    TU_ERR(delta_quant_fp8_update(b8, n, d, n8u, keep, NULL, NULL), SH_EMISMATCH, "was quantised from");
    TU_OK(delta_quant_fp8(b, b8, keep, NULL, NULL));
    TU_ERR(delta_quant_fp8_update(b8, b, d, n8u, keep, NULL, NULL), SH_EMISMATCH, "leads to");

    /* A reshaped tensor is carried whole and re-quantised entirely. */
    char r[512], r8[512], dr[512], r8u[512], nn[512], nn8[512];
    snprintf(nn, sizeof nn, "%s", n), snprintf(nn8, sizeof nn8, "%s", n8);
    n = nn, n8 = nn8;
    snprintf(r, sizeof r, "%s", tu_path("u_resh.safetensors"));
    snprintf(r8, sizeof r8, "%s", tu_path("u_resh8.safetensors"));
    snprintf(dr, sizeof dr, "%s", tu_path("u_resh.delta"));
    snprintf(r8u, sizeof r8u, "%s", tu_path("u_resh8_upd.safetensors"));
    build(r, w, big, emb, norm, id, 1);
    TU_OK(delta_make(n, r, dr, NULL, NULL));
    TU_OK(delta_quant_fp8(r, r8, keep, NULL, NULL));
    TU_OK(delta_quant_fp8_update(n8, r, dr, r8u, keep, NULL, &blocks));
    assert_int_equal(blocks, 4); /* w: 200 x 130 = 2 x 2 blocks; big unchanged */
    assert_int_equal(tu_run(NULL, "cmp %s %s", r8, r8u), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_from_scratch),
        cmocka_unit_test(test_quant_update_identical),
    };
    return cmocka_run_group_tests_name("quant", tests, NULL, NULL);
}
