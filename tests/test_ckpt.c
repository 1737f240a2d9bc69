/* Tests for src/weights/ckpt: dtype conversions, safetensors read/write, strict
 * validation, sharded folders, digests, and the synth/step generators. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/ckpt.h"

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_bf16_rounding(void **state)
{
    /* 1 + 2^-8 lies halfway between bf16 1.0 and 1.0078125: ties go to even. */
    assert_int_equal(ckpt_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(ckpt_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(ckpt_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_int_equal(ckpt_f32_to_bf16(-2.0f), 0xc000);
    assert_true(isnan(ckpt_bf16_to_f32(ckpt_f32_to_bf16(NAN))));
    assert_int_equal(ckpt_f32_to_bf16(f32_of(0x7f7fffff)), 0x7f80); /* max float -> inf */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ckpt_bf16_to_f32((uint16_t)h);
        if (!isnan(f)) assert_int_equal(ckpt_f32_to_bf16(f), h);
    }
}

static void test_small_floats(void **state)
{
    /* Every finite code round-trips through f32. */
    for (uint32_t b = 0; b < 256; b++) {
        float e4 = ckpt_e4m3_to_f32((uint8_t)b), e5 = ckpt_e5m2_to_f32((uint8_t)b);
        if (!isnan(e4)) assert_int_equal(ckpt_f32_to_e4m3(e4), b);
        if (!isnan(e5) && !isinf(e5)) assert_int_equal(ckpt_f32_to_e5m2(e5), b);
    }
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ckpt_f16_to_f32((uint16_t)h);
        if (!isnan(f)) assert_int_equal(ckpt_f32_to_f16(f), h);
    }
    /* Hand-checked values: e4m3fn saturates at 448, has subnormals down to
     * 2^-9 and NaN at 0x7f; ties to even. */
    assert_true(ckpt_e4m3_to_f32(0x7e) == 448.0f);
    assert_int_equal(ckpt_f32_to_e4m3(1000.0f), 0x7e);
    assert_int_equal(ckpt_f32_to_e4m3(-1000.0f), 0xfe);
    assert_int_equal(ckpt_f32_to_e4m3(INFINITY), 0x7e);
    assert_true(isnan(ckpt_e4m3_to_f32(0x7f)));
    assert_true(ckpt_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_int_equal(ckpt_f32_to_e4m3(0x1p-10f), 0x00);     /* tie -> even (0) */
    assert_int_equal(ckpt_f32_to_e4m3(3 * 0x1p-10f), 0x02); /* tie -> even (2) */
    assert_int_equal(ckpt_f32_to_e4m3(1.0625f), 0x38);      /* 1 + 1/16: tie -> 1.0 */
    assert_int_equal(ckpt_f32_to_e4m3(1.1875f), 0x3a);      /* 1 + 3/16: tie -> 1.25 */
    assert_true(ckpt_f16_to_f32(0x3c00) == 1.0f);
    assert_int_equal(ckpt_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
    assert_int_equal(ckpt_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(ckpt_f32_to_e5m2(1e6f), 0x7c);
}

/* One tensor of every dtype, plus empty and 0-d tensors. */
static size_t all_dtypes(ckpt_tensor *t, uint8_t *bytes, char names[][32])
{
    size_t n = 0, off = 0;
    for (int d = 0; d < CKPT_DTYPE_COUNT; d++) {
        snprintf(names[n], 32, "t.%s", ckpt_dtype_name((ckpt_dtype)d));
        t[n] = (ckpt_tensor){.name = names[n], .dtype = (ckpt_dtype)d, .ndim = 2, .shape = {3, 4}};
        size_t nb = 12 * ckpt_dtype_bits((ckpt_dtype)d) / 8;
        for (size_t i = 0; i < nb; i++) bytes[off + i] = (uint8_t)(i * 37 + d);
        t[n].data = bytes + off;
        off += nb, n++;
    }
    snprintf(names[n], 32, "empty");
    t[n++] = (ckpt_tensor){.name = names[n - 1], .dtype = CKPT_F32, .ndim = 2, .shape = {0, 5}, .data = bytes};
    snprintf(names[n], 32, "scalar");
    t[n++] = (ckpt_tensor){.name = names[n - 1], .dtype = CKPT_F64, .ndim = 0, .data = bytes + 8};
    return n;
}

static void test_roundtrip_every_dtype(void **state)
{
    ckpt_tensor t[32];
    uint8_t bytes[4096];
    char names[32][32];
    size_t n = all_dtypes(t, bytes, names);
    json_t *meta = json_pack("{s:s,s:s}", "format", "pt", "z\"q", "line\nbreak");
    const char *p = tu_path("all.safetensors");
    TU_OK(ckpt_save(p, t, n, meta));
    json_decref(meta);
    ckpt *c;
    TU_OK(ckpt_open(p, &c));
    assert_int_equal(c->ntensors, n);
    assert_string_equal(ckpt_meta(c, "z\"q"), "line\nbreak");
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *r = ckpt_find(c, t[i].name);
        assert_non_null(r);
        assert_int_equal(r->dtype, t[i].dtype);
        assert_int_equal(r->ndim, t[i].ndim);
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= (uint64_t)t[i].shape[d];
        assert_int_equal(r->numel, numel);
        assert_memory_equal(r->data, t[i].data, r->nbytes);
    }
    /* Reference layout: dtype descending (U64 first), then name; data
     * aligned to 8 after the header. */
    assert_string_equal(c->tensors[0].name, "t.U64");
    assert_int_equal(c->files[0].header_len % 8, 0);
    assert_null(ckpt_find(c, "absent"));
    ckpt_close(c);
    ckpt_close(NULL);
}

static void test_header_bytes(void **state)
{
    /* The exact bytes the reference writer produces for this input. */
    uint8_t data[24] = {0};
    ckpt_tensor t[2] = {
        {.name = "b", .dtype = CKPT_BF16, .ndim = 1, .shape = {2}, .data = data},
        {.name = "a", .dtype = CKPT_F32, .ndim = 2, .shape = {2, 2}, .data = data},
    };
    const char *p = tu_path("hdr.safetensors");
    TU_OK(ckpt_save(p, t, 2, NULL));
    size_t len;
    uint8_t *img = tu_read_file(p, &len);
    const char *want = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]}}";
    size_t wl = strlen(want), hn = (wl + 7) / 8 * 8;
    assert_int_equal(img[0], hn);
    assert_memory_equal(img + 8, want, wl);
    for (size_t i = wl; i < hn; i++) assert_int_equal(img[8 + i], ' ');
    assert_int_equal(len, 8 + hn + 20);
    free(img);
}

/* Builds an image from a header string and `data` zero bytes. */
static uint8_t *image(const char *hdr, size_t data, size_t *len)
{
    size_t hn = strlen(hdr);
    uint8_t *b = calloc(1, 8 + hn + data + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hn >> (8 * i));
    memcpy(b + 8, hdr, hn);
    *len = 8 + hn + data;
    return b;
}

static void test_bad_headers(void **state)
{
    static const struct {
        const char *hdr;
        size_t data;
        const char *msg;
    } cases[] = {
        {"[1]", 0, "does not start with '{'"},
        {"{\"a\":", 0, "invalid JSON"},
        {"{\"a\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "unknown dtype \"Q8\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "needs 8"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3, "gap of 1 bytes"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3, "overlaps"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 5, "truncated or padded"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 1, "truncated or padded"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2],\"x\":1}}", 2, "unknown field \"x\""},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-2],\"data_offsets\":[0,2]}}", 2, "shape[0]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,0]}}", 2, "begin <= end"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "is not a string"},
        {"{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1, "whole bytes"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}", 1,
         "overflows"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "duplicate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        uint8_t *img = image(cases[i].hdr, cases[i].data, &len);
        ckpt *c = NULL;
        int rc = ckpt_open_mem(img, len, "bad.safetensors", &c);
        if (rc != SH_EFORMAT || !strstr(sh_errmsg(), cases[i].msg) ||
            !strstr(sh_errmsg(), "bad.safetensors"))
            fail_msg("case %zu: rc %d, message \"%s\", wanted \"%s\"", i, rc, sh_errmsg(),
                     cases[i].msg);
        assert_null(c);
        free(img);
    }
    /* Length prefix problems. */
    uint8_t tiny[4] = {0};
    ckpt *c;
    TU_ERR(ckpt_open_mem(tiny, 4, "tiny", &c), SH_EFORMAT, "too short");
    uint8_t big[16] = {0, 0, 0, 0, 1, 0, 0, 0};
    TU_ERR(ckpt_open_mem(big, 16, "big", &c), SH_EFORMAT, "100 MB limit");
    uint8_t past[16] = {200};
    TU_ERR(ckpt_open_mem(past, 16, "past", &c), SH_EFORMAT, "runs past the end");
    /* Files: a missing one, a truncated one. */
    TU_ERR(ckpt_open(tu_path("missing.safetensors"), &c), SH_ENOENT, "missing.safetensors");
    /* A folder that is not a sharded checkpoint says so. */
    TU_OK(sh_mkdir_p(tu_path("plain-folder"), 0755));
    TU_ERR(ckpt_open(tu_path("plain-folder"), &c), SH_ENOENT,
           "plain-folder is a folder without model.safetensors.index.json, so not a sharded checkpoint");
    uint8_t d[64] = {0};
    ckpt_tensor t = {.name = "w", .dtype = CKPT_F32, .ndim = 1, .shape = {16}, .data = d};
    const char *p = tu_path("trunc.safetensors");
    TU_OK(ckpt_save(p, &t, 1, NULL));
    size_t len;
    uint8_t *img = tu_read_file(p, &len);
    tu_write_file(p, img, len - 1);
    free(img);
    TU_ERR(ckpt_open(p, &c), SH_EFORMAT, "trunc.safetensors: tensors cover 64 bytes");
}

static void write_shards(const char *dir, const char *index)
{
    char p[4096];
    sh_mkdir_p(dir, 0755);
    uint8_t d[64];
    for (int i = 0; i < 64; i++) d[i] = (uint8_t)i;
    ckpt_tensor a[2] = {{.name = "w1", .dtype = CKPT_BF16, .ndim = 1, .shape = {8}, .data = d},
                        {.name = "w2", .dtype = CKPT_F32, .ndim = 1, .shape = {4}, .data = d + 16}};
    ckpt_tensor b = {.name = "w3", .dtype = CKPT_U8, .ndim = 1, .shape = {5}, .data = d + 32};
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    TU_OK(ckpt_save(p, a, 2, NULL));
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    TU_OK(ckpt_save(p, &b, 1, NULL));
    snprintf(p, sizeof p, "%s/" CKPT_INDEX_NAME, dir);
    tu_write_file(p, index, strlen(index));
}

static void test_sharded_folder(void **state)
{
    const char *good = "{\"metadata\":{\"total_size\":37},\"weight_map\":{"
                       "\"w1\":\"model-00001-of-00002.safetensors\","
                       "\"w2\":\"model-00001-of-00002.safetensors\","
                       "\"w3\":\"model-00002-of-00002.safetensors\"}}";
    const char *dir = tu_path("sharded");
    write_shards(dir, good);
    ckpt *c;
    TU_OK(ckpt_open(dir, &c));
    assert_true(c->is_folder);
    assert_int_equal(c->nfiles, 2);
    assert_int_equal(c->ntensors, 3);
    assert_int_equal(ckpt_find(c, "w3")->file, 1);
    assert_int_equal(ckpt_find(c, "w3")->data[0], 32);
    sh_hash128 d1, d2, td[3];
    TU_OK(ckpt_digest(c, 1, &d1, td));
    TU_OK(ckpt_digest(c, 3, &d2, NULL));
    assert_true(sh_hash128_eq(d1, d2));
    assert_true(sh_hash128_eq(td[2], ckpt_tensor_digest(ckpt_find(c, "w3")->data, 5)));
    ckpt_close(c);

    static const struct {
        const char *index, *msg;
    } bad[] = {
        {"{\"weight_map\":{\"w1\":\"model-00001-of-00002.safetensors\","
         "\"w3\":\"model-00002-of-00002.safetensors\"}}", "tensor \"w2\" of model-00001-of-00002.safetensors is missing"},
        {"{\"weight_map\":{\"w1\":\"model-00001-of-00002.safetensors\","
         "\"w2\":\"model-00002-of-00002.safetensors\",\"w3\":\"model-00002-of-00002.safetensors\"}}",
         "puts tensor \"w2\" in model-00002"},
        {"{\"weight_map\":{\"w1\":\"../x.safetensors\"}}", "no '/'"},
        {"{\"weights\":{}}", "missing \"weight_map\""},
        {"{\"weight_map\":{\"w1\":\"model-00001-of-00002.safetensors\","
         "\"w2\":\"model-00001-of-00002.safetensors\",\"w3\":\"model-00002-of-00002.safetensors\","
         "\"w9\":\"model-00002-of-00002.safetensors\"}}", "lists tensor \"w9\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_shards(dir, bad[i].index);
        int rc = ckpt_open(dir, &c);
        if (rc != SH_EFORMAT || !strstr(sh_errmsg(), bad[i].msg))
            fail_msg("case %zu: rc %d: %s", i, rc, sh_errmsg());
    }
}

static void test_writer_streaming(void **state)
{
    ckpt_tensor spec[2] = {{.name = "x", .dtype = CKPT_U8, .ndim = 1, .shape = {10}},
                           {.name = "y", .dtype = CKPT_I16, .ndim = 1, .shape = {3}}};
    const char *p = tu_path("stream.safetensors");
    ckpt_writer *w;
    TU_OK(ckpt_writer_open(p, spec, 2, NULL, CKPT_KEEP_ORDER, &w));
    assert_int_equal(ckpt_writer_find(w, "y"), 1);
    /* Out of order and in pieces. */
    TU_OK(ckpt_writer_put(w, 1, 0, "abcdef", 6));
    TU_OK(ckpt_writer_put(w, 0, 5, "56789", 5));
    TU_ERR(ckpt_writer_put(w, 0, 8, "xyz", 3), SH_EINTERNAL, "outside tensor");
    TU_OK(ckpt_writer_put(w, 0, 0, "01234", 5));
    TU_OK(ckpt_writer_commit(w));
    ckpt *c;
    TU_OK(ckpt_open(p, &c));
    assert_memory_equal(ckpt_find(c, "x")->data, "0123456789", 10);
    assert_string_equal(c->tensors[0].name, "x");
    ckpt_close(c);
    /* A writer that misses bytes does not commit, and leaves the old file. */
    TU_OK(ckpt_writer_open(p, spec, 2, NULL, 0, &w));
    TU_OK(ckpt_writer_put(w, 0, 0, "abc", 3));
    TU_ERR(ckpt_writer_commit(w), SH_EINTERNAL, "bytes written");
    TU_OK(ckpt_open(p, &c));
    assert_memory_equal(ckpt_find(c, "x")->data, "0123456789", 10);
    ckpt_close(c);
    TU_OK(ckpt_writer_open(p, spec, 2, NULL, 0, &w));
    ckpt_writer_abort(w);
    ckpt_writer_abort(NULL);
    char *out;
    tu_run(&out, "ls %s | grep -c tmp", tu_tmpdir());
    assert_int_equal(atoi(out), 0);
    free(out);
}

static void test_synth_step_cli(void **state)
{
    const char *a = tu_path("synth_a.safetensors"), *b = tu_path("synth_b.safetensors");
    char *out;
    assert_int_equal(tu_run(NULL, "%s ckpt synth --params 300K --seed 7 -o %s", tu_shoal(), a), 0);
    assert_int_equal(tu_run(&out, "%s ckpt inspect %s --json", tu_shoal(), a), 0);
    json_t *j;
    TU_OK(sh_json_parse(out, strlen(out), "inspect", &j));
    int64_t params = 0;
    TU_OK(sh_json_get_i64(j, "params", 1, "inspect", &params));
    assert_true(params > 250000 && params <= 300000);
    json_decref(j);
    free(out);
    assert_int_equal(tu_run(NULL, "%s ckpt step %s --lr 1e-6 --steps 2 --seed 3 -o %s", tu_shoal(), a, b), 0);
    ckpt *ca, *cb;
    TU_OK(ckpt_open(a, &ca));
    TU_OK(ckpt_open(b, &cb));
    assert_memory_equal(ca->files[0].map, cb->files[0].map, ca->files[0].header_len);
    uint64_t changed = 0, total = 0, big = 0;
    for (size_t i = 0; i < ca->ntensors; i++) {
        const uint16_t *x = (const uint16_t *)ca->tensors[i].data;
        const uint16_t *y = (const uint16_t *)ckpt_find(cb, ca->tensors[i].name)->data;
        for (uint64_t k = 0; k < ca->tensors[i].numel; k++, total++) {
            changed += x[k] != y[k];
            int d = (int)(x[k] & 0x7fff) - (int)(y[k] & 0x7fff);
            big += d > 4 || d < -4;
        }
    }
    /* Adam steps of 1e-6 change roughly 1% of bf16 weights by one ulp. */
    if (changed < total / 1000 || changed > total / 10) fail_msg("%llu of %llu changed", (unsigned long long)changed, (unsigned long long)total);
    if (big > changed / 5) fail_msg("%llu of %llu changes exceed 4 ulp", (unsigned long long)big, (unsigned long long)changed);
    ckpt_close(ca);
    ckpt_close(cb);
    /* Reproducible from the seed. */
    const char *a2 = tu_path("synth_a2.safetensors");
    assert_int_equal(tu_run(NULL, "%s ckpt synth --params 300K --seed 7 -o %s && cmp %s %s", tu_shoal(), a2, a, a2), 0);
    assert_int_equal(tu_run(&out, "%s ckpt synth --params 300K", tu_shoal()), 2);
    assert_non_null(strstr(out, "needs --params N and -o OUT"));
    free(out);
    assert_int_equal(tu_run(&out, "%s ckpt inspect %s", tu_shoal(), tu_path("nope")), 1);
    assert_non_null(strstr(out, "nope"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),     cmocka_unit_test(test_small_floats),
        cmocka_unit_test(test_roundtrip_every_dtype), cmocka_unit_test(test_header_bytes),
        cmocka_unit_test(test_bad_headers),       cmocka_unit_test(test_sharded_folder),
        cmocka_unit_test(test_writer_streaming),  cmocka_unit_test(test_synth_step_cli),
    };
    return cmocka_run_group_tests_name("ckpt", tests, NULL, NULL);
}
