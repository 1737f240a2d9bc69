/* Tests for src/weights/delta: round trips over every dtype and encoding, structure
 * changes, thread independence, integrity (wrong base, corrupt or truncated
 * deltas), in-place and sharded applies, squash, and the command line. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shoal/delta.h"
#include "weights/delta/delta_int.h" /* delta__isa_max */

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

typedef struct {
    char name[64];
    ckpt_dtype dt;
    int ndim;
    int64_t shape[3];
    uint8_t *data;
    size_t nbytes;
} tt;

static void tt_set(tt *t, const char *name, ckpt_dtype dt, int ndim, int64_t a, int64_t b)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dt = dt, t->ndim = ndim, t->shape[0] = a, t->shape[1] = b;
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (uint64_t)t->shape[d];
    t->nbytes = n * ckpt_dtype_bits(dt) / 8;
    t->data = malloc(t->nbytes + 1);
    for (size_t i = 0; i < t->nbytes; i++) t->data[i] = (uint8_t)rnd();
}

static void save(const char *path, tt *t, size_t n)
{
    ckpt_tensor s[64];
    for (size_t i = 0; i < n; i++)
        s[i] = (ckpt_tensor){.name = t[i].name, .dtype = t[i].dt, .ndim = t[i].ndim,
                             .shape = {t[i].shape[0], t[i].shape[1], t[i].shape[2]}, .data = t[i].data};
    TU_OK(ckpt_save(path, s, n, NULL));
}

static void tt_free(tt *t, size_t n)
{
    for (size_t i = 0; i < n; i++) free(t[i].data);
}

/* Changes a fraction of the units by a small integer (in units of the last
 * place for floats: adding to the raw bits of a same-sign value). */
static void perturb(tt *t, unsigned permille, int maxstep)
{
    unsigned w = ckpt_dtype_bits(t->dt) / 8;
    if (w == 0 || (w != 1 && w != 2 && w != 4 && w != 8)) w = 1;
    for (size_t i = 0; i + w <= t->nbytes; i += w) {
        if (rnd() % 1000 >= permille) continue;
        uint64_t u = 0;
        memcpy(&u, t->data + i, w);
        u += (uint64_t)(int64_t)((int)(rnd() % (2 * maxstep + 1)) - maxstep);
        memcpy(t->data + i, &u, w);
    }
}

static int files_equal(const char *a, const char *b)
{
    return tu_run(NULL, "cmp -s %s %s", a, b) == 0;
}

static json_t *inspect(const char *d)
{
    json_t *j;
    TU_OK(delta_inspect(d, &j));
    return j;
}

/* Counts chunks of an encoding over the whole delta. */
static int64_t count_enc(json_t *j, const char *enc)
{
    int64_t n = 0;
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(j, "tensors"), i, t)
        n += json_integer_value(json_object_get(json_object_get(t, "encodings"), enc));
    return n;
}

static void test_roundtrip_every_dtype(void **state)
{
    tt b[32], t[32];
    size_t n = 0;
    for (int d = 0; d < CKPT_DTYPE_COUNT; d++) {
        char nm[32];
        snprintf(nm, sizeof nm, "w.%s", ckpt_dtype_name((ckpt_dtype)d));
        /* Odd sizes: bf16 spans two chunks with a tail. */
        int64_t rows = d == CKPT_BF16 ? 1100001 : ckpt_dtype_bits((ckpt_dtype)d) < 8 ? 30000 : 30001;
        tt_set(&b[n], nm, (ckpt_dtype)d, 2, rows, 2);
        n++;
    }
    tt_set(&b[n++], "empty", CKPT_F32, 2, 0, 7);
    tt_set(&b[n++], "scalar", CKPT_F64, 0, 0, 0);
    tt_set(&b[n++], "dense", CKPT_BF16, 1, 5003, 0);
    tt_set(&b[n++], "random", CKPT_F32, 1, 7001, 0);
    tt_set(&b[n++], "same", CKPT_U8, 1, 999, 0);
    tt_set(&b[n++], "zeros", CKPT_BF16, 1, 100000, 0);
    memset(b[n - 1].data, 0, b[n - 1].nbytes);
    for (size_t i = 0; i < n; i++) {
        t[i] = b[i];
        t[i].data = malloc(b[i].nbytes + 1);
        memcpy(t[i].data, b[i].data, b[i].nbytes);
        if (!strcmp(t[i].name, "dense")) perturb(&t[i], 900, 3);
        else if (!strcmp(t[i].name, "random")) for (size_t k = 0; k < t[i].nbytes; k++) t[i].data[k] = (uint8_t)rnd();
        else if (!strcmp(t[i].name, "scalar")) t[i].data[3] ^= 1;
        else if (!strcmp(t[i].name, "zeros")) perturb(&t[i], 5, 1); /* -0, +0 and subnormals */
        else if (strcmp(t[i].name, "same")) perturb(&t[i], 20, 2);
    }
    const char *bp = tu_path("rt_base.safetensors"), *tp = tu_path("rt_new.safetensors");
    const char *dp = tu_path("rt.delta"), *op = tu_path("rt_out.safetensors");
    save(bp, b, n);
    save(tp, t, n);
    delta_stats st;
    TU_OK(delta_make(bp, tp, dp, &(delta_opts){.threads = 2}, &st));
    assert_int_equal(st.tensors_diff, n);
    TU_OK(delta_apply(bp, dp, op, NULL));
    assert_true(files_equal(op, tp));
    json_t *j = inspect(dp);
    assert_true(count_enc(j, "SAME") > 0);
    assert_true(count_enc(j, "SPARSE") > 0);
    assert_true(count_enc(j, "DENSE") > 0);
    assert_true(count_enc(j, "RAW") + count_enc(j, "ZSTD") > 0);
    json_decref(j);
    tt_free(b, n);
    tt_free(t, n);
}

/* Changes of every size the symbols allow: 64-bit units replaced by random
 * values (up to 61 extra bits a value, beyond what the decoder's fast loop
 * reads at once), 32-bit ones by random steps, and a dense 16-bit integer
 * tensor; each chunk's end is decoded by the careful path. */
static void test_wide_changes(void **state)
{
    tt b[3], t[3];
    tt_set(&b[0], "i64", CKPT_I64, 1, 20001, 0);
    tt_set(&b[1], "f32", CKPT_F32, 2, 25001, 2);
    tt_set(&b[2], "u16", CKPT_U16, 1, 70001, 0);
    for (size_t i = 0; i < 3; i++) {
        t[i] = b[i];
        t[i].data = malloc(b[i].nbytes + 1);
        memcpy(t[i].data, b[i].data, b[i].nbytes);
    }
    for (size_t i = 0; i + 8 <= t[0].nbytes; i += 8)
        if (rnd() % 100 < 3) for (int k = 0; k < 8; k++) t[0].data[i + k] = (uint8_t)rnd();
    for (size_t i = 0; i + 4 <= t[1].nbytes; i += 4)
        if (rnd() % 100 < 5) {
            uint32_t u;
            memcpy(&u, t[1].data + i, 4);
            u += (uint32_t)rnd() >> (rnd() % 32);
            memcpy(t[1].data + i, &u, 4);
        }
    perturb(&t[2], 600, 2);
    const char *bp = tu_path("wide_base.safetensors"), *tp = tu_path("wide_new.safetensors");
    const char *dp = tu_path("wide.delta"), *op = tu_path("wide_out.safetensors");
    save(bp, b, 3);
    save(tp, t, 3);
    TU_OK(delta_make(bp, tp, dp, &(delta_opts){.threads = 2}, NULL));
    TU_OK(delta_apply(bp, dp, op, NULL));
    assert_true(files_equal(op, tp));
    json_t *j = inspect(dp);
    assert_int_equal(count_enc(j, "SPARSE"), 2);
    assert_int_equal(count_enc(j, "DENSE"), 1);
    json_decref(j);
    tt_free(b, 3);
    tt_free(t, 3);
}

static void test_structure_changes(void **state)
{
    tt b[5], t[5];
    tt_set(&b[0], "kept", CKPT_BF16, 2, 64, 33);
    tt_set(&b[1], "removed", CKPT_F32, 1, 100, 0);
    tt_set(&b[2], "reshaped", CKPT_BF16, 2, 4, 6);
    tt_set(&b[3], "old_name", CKPT_F16, 1, 77, 0);
    tt_set(&b[4], "retyped", CKPT_F32, 1, 50, 0);
    t[0] = b[0];
    t[0].data = malloc(b[0].nbytes);
    memcpy(t[0].data, b[0].data, b[0].nbytes);
    perturb(&t[0], 30, 1);
    tt_set(&t[1], "reshaped", CKPT_BF16, 2, 6, 4);
    memcpy(t[1].data, b[2].data, b[2].nbytes);
    tt_set(&t[2], "new_name", CKPT_F16, 1, 77, 0);
    memcpy(t[2].data, b[3].data, b[3].nbytes);
    tt_set(&t[3], "added", CKPT_I64, 1, 9, 0);
    tt_set(&t[4], "retyped", CKPT_I32, 1, 50, 0);
    const char *bp = tu_path("st_base.safetensors"), *tp = tu_path("st_new.safetensors");
    const char *dp = tu_path("st.delta"), *op = tu_path("st_out.safetensors");
    save(bp, b, 5);
    save(tp, t, 5);
    delta_stats st;
    TU_OK(delta_make(bp, tp, dp, NULL, &st));
    assert_int_equal(st.tensors_diff, 1);
    assert_int_equal(st.tensors_whole, 4);
    TU_OK(delta_apply(bp, dp, op, NULL));
    assert_true(files_equal(op, tp));
    json_t *j = inspect(dp);
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(j, "tensors"), i, x)
    {
        const char *nm = json_string_value(json_object_get(x, "name"));
        const char *mode = json_string_value(json_object_get(x, "mode"));
        assert_string_equal(mode, strcmp(nm, "kept") ? "whole" : "diff");
    }
    json_decref(j);
    tt_free(b, 5);
    tt_free(t, 5);
}

/* A small synthetic pair on disk: synth then step. */
static void pair(const char *b, const char *t, uint64_t seed)
{
    TU_OK(ckpt_synth(b, 400000, seed));
    TU_OK(ckpt_step(b, t, 1e-5, 1, seed + 1));
}

static void test_threads_identical(void **state)
{
    const char *b = tu_path("j_base.safetensors"), *t = tu_path("j_new.safetensors");
    pair(b, t, 11);
    const char *d1 = tu_path("j1.delta"), *d4 = tu_path("j4.delta");
    TU_OK(delta_make(b, t, d1, &(delta_opts){.threads = 1}, NULL));
    TU_OK(delta_make(b, t, d4, &(delta_opts){.threads = 4}, NULL));
    assert_true(files_equal(d1, d4));
    /* A delta from a checkpoint to itself is all SAME. */
    const char *d0 = tu_path("j0.delta");
    delta_stats st;
    TU_OK(delta_make(b, b, d0, NULL, &st));
    assert_int_equal(st.changed, 0);
    assert_int_equal(st.chunks[1] + st.chunks[2] + st.chunks[3] + st.chunks[4], 0);
}

/* Every vector width of the scan and of the DENSE symbols (AVX-512, AVX2,
 * SSE2, as far as this CPU has them) writes the same delta: every unit
 * width, float and integer, sparse and dense chunks, tails below one 64-byte block, and chunks with
 * exactly the most changes a sparse chunk may hold (a quarter of the units)
 * and one more. */
static void test_isa_identical(void **state)
{
    tt b[32], t[32];
    size_t n = 0;
    ckpt_dtype dts[] = {CKPT_U8, CKPT_BF16, CKPT_F16, CKPT_I16, CKPT_F32, CKPT_I32, CKPT_F64, CKPT_I64};
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
        for (int v = 0; v < 2; v++) {
            char nm[32];
            snprintf(nm, sizeof nm, "w%zu.%d", d, v);
            tt_set(&b[n++], nm, dts[d], 1, v ? 300007 : 1000, 0);
        }
    tt_set(&b[n++], "at_limit", CKPT_I16, 1, 4096, 0);
    tt_set(&b[n++], "over_limit", CKPT_I16, 1, 4096, 0);
    for (size_t i = 0; i < n; i++) {
        t[i] = b[i];
        t[i].data = malloc(b[i].nbytes + 1);
        memcpy(t[i].data, b[i].data, b[i].nbytes);
        if (!strcmp(t[i].name, "at_limit") || !strcmp(t[i].name, "over_limit")) {
            size_t k = !strcmp(t[i].name, "at_limit") ? 1024 : 1025;
            for (size_t u = 0; u < k; u++) t[i].data[2 * (4095 - 3 * u)] ^= 1;
        } else {
            perturb(&t[i], i % 2 ? 15 : 400, 3);
            t[i].data[t[i].nbytes - 1] ^= 0x40; /* the tail */
        }
    }
    const char *bp = tu_path("isa_base.safetensors"), *tp = tu_path("isa_new.safetensors");
    save(bp, b, n);
    save(tp, t, n);
    const char *d2 = tu_path("isa2.delta");
    TU_OK(delta_make(bp, tp, d2, &(delta_opts){.threads = 1}, NULL));
    json_t *j = inspect(d2);
    assert_true(count_enc(j, "SPARSE") > 0);
    assert_true(count_enc(j, "DENSE") > 0);
    assert_true(count_enc(j, "DENSE") + count_enc(j, "ZSTD") + count_enc(j, "RAW") > 0);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(j, "tensors"), i, e) {
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (strcmp(nm, "at_limit") && strcmp(nm, "over_limit")) continue;
        json_t *enc = json_object_get(e, "encodings");
        assert_int_equal(json_integer_value(json_object_get(enc, "SPARSE")), !strcmp(nm, "at_limit"));
    }
    json_decref(j);
    for (int isa = 1; isa >= 0; isa--) {
        const char *d = tu_path("isa_other.delta");
        delta__isa_max = isa;
        TU_OK(delta_make(bp, tp, d, &(delta_opts){.threads = 1}, NULL));
        delta__isa_max = 2;
        assert_true(files_equal(d, d2));
    }
    const char *op = tu_path("isa_out.safetensors");
    TU_OK(delta_apply(bp, d2, op, NULL));
    assert_true(files_equal(op, tp));
    tt_free(b, n);
    tt_free(t, n);
}

static void test_wrong_base(void **state)
{
    const char *b = tu_path("w_base.safetensors"), *t = tu_path("w_new.safetensors");
    const char *other = tu_path("w_other.safetensors"), *d = tu_path("w.delta");
    pair(b, t, 21);
    TU_OK(ckpt_step(b, other, 1e-5, 1, 99)); /* same layout, other values */
    TU_OK(delta_make(b, t, d, NULL, NULL));
    const char *out = tu_path("w_out.safetensors");
    TU_ERR(delta_apply(other, d, out, NULL), SH_EMISMATCH, "wrong base");
    assert_false(sh_path_exists(out));
    TU_ERR(delta_apply(other, d, out, &(delta_opts){.verify_base = 1}), SH_EMISMATCH, "wrong base: tensor");
    assert_false(sh_path_exists(out));
    TU_OK(delta_apply(b, d, out, &(delta_opts){.verify_base = 1}));
    assert_true(files_equal(out, t));
    unlink(out);
    /* In place: the target file is left as it was. */
    const char *copy = tu_path("w_copy.safetensors");
    assert_int_equal(tu_run(NULL, "cp %s %s", other, copy), 0);
    TU_ERR(delta_apply(copy, d, NULL, NULL), SH_EMISMATCH, "wrong base");
    assert_true(files_equal(copy, other));
    /* A different layout (the synthetic model of another size). */
    const char *small = tu_path("w_small.safetensors");
    TU_OK(ckpt_synth(small, 100000, 1));
    TU_ERR(delta_apply(small, d, out, NULL), SH_EMISMATCH, "wrong base");
    assert_false(sh_path_exists(out));
    char *o;
    assert_int_equal(tu_run(&o, "ls %s | grep -c tmp", tu_tmpdir()), 1);
    assert_int_equal(atoi(o), 0);
    free(o);
}

static void test_corrupt_delta(void **state)
{
    const char *b = tu_path("c_base.safetensors"), *t = tu_path("c_new.safetensors");
    const char *d = tu_path("c.delta"), *bad = tu_path("c_bad.delta"), *out = tu_path("c_out.safetensors");
    pair(b, t, 31);
    TU_OK(delta_make(b, t, d, NULL, NULL));
    size_t len;
    uint8_t *img = tu_read_file(d, &len);
    img[len / 2] ^= 0x10;
    tu_write_file(bad, img, len);
    TU_ERR(delta_apply(b, bad, out, NULL), SH_EMISMATCH, "checksum mismatch");
    img[len / 2] ^= 0x10;
    tu_write_file(bad, img, len - 100);
    TU_ERR(delta_apply(b, bad, out, NULL), SH_EMISMATCH, "truncated or corrupted");
    tu_write_file(bad, img, 30);
    TU_ERR(delta_apply(b, bad, out, NULL), SH_EFORMAT, "not a shoal delta");
    tu_write_file(bad, "SHOALDLT\2\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 40);
    TU_ERR(delta_apply(b, bad, out, NULL), SH_EFORMAT, "version 2");
    assert_false(sh_path_exists(out));
    /* A truncated base. */
    size_t blen;
    uint8_t *bi = tu_read_file(b, &blen);
    const char *tb = tu_path("c_trunc.safetensors");
    tu_write_file(tb, bi, blen - 2);
    TU_ERR(delta_apply(tb, d, out, NULL), SH_EFORMAT, "c_trunc.safetensors");
    assert_false(sh_path_exists(out));
    free(bi);

    /* Mutations past the checksum: the decoder fails cleanly or the digests
     * catch it; nothing crashes (this runs under ASan too). */
    delta *dp;
    TU_OK(delta_parse(img, len, 0, &dp));
    uint64_t size = delta_target_size(dp);
    delta_free(dp);
    ckpt *base;
    TU_OK(ckpt_open(b, &base));
    uint8_t *o = malloc(size), *m = malloc(len);
    size_t tlen;
    uint8_t *want = tu_read_file(t, &tlen);
    assert_int_equal(tlen, size);
    int failed = 0;
    for (int k = 0; k < 200; k++) {
        memcpy(m, img, len);
        size_t at = len / 4 + rnd() % (len - len / 4 - 16);
        m[at] ^= (uint8_t)(1 + rnd() % 255);
        if (k % 2) m[at + 1 + rnd() % 8] ^= (uint8_t)rnd();
        size_t got;
        int rc = delta_parse(m, len, DELTA_NO_CHECKSUM, &dp);
        if (rc == SH_OK) {
            rc = delta_apply_mem(base, dp, &(delta_opts){.threads = 1}, o, size, &got);
            delta_free(dp);
        }
        if (rc < 0) {
            failed++;
            assert_true(rc == SH_EFORMAT || rc == SH_EMISMATCH || rc == SH_ERANGE);
            assert_true(sh_errmsg()[0] != 0);
        } else if (got != size || memcmp(o, want, size)) {
            /* A mutation the digests let through must have been harmless
             * (e.g. padding): success with other bytes is the bug. */
            fail_msg("mutation %d at byte %zu: apply succeeded with a wrong result", k, at);
        }
    }
    assert_true(failed > 150);
    free(o), free(m), free(img), free(want);
    ckpt_close(base);
}

static void test_in_place_and_cli(void **state)
{
    const char *b = tu_path("i_base.safetensors"), *t = tu_path("i_new.safetensors");
    const char *d = tu_path("i.delta"), *c = tu_path("i_ckpt.safetensors");
    pair(b, t, 41);
    char *o;
    assert_int_equal(tu_run(&o, "%s delta make %s %s -o %s --json -j 2", tu_shoal(), b, t, d), 0);
    assert_non_null(strstr(o, "\"delta_bytes\""));
    free(o);
    assert_int_equal(tu_run(NULL, "cp %s %s && %s delta apply --in-place %s %s", b, c, tu_shoal(), c, d), 0);
    assert_true(files_equal(c, t));
    /* Applying again: the checkpoint is now the target, not the base. */
    assert_int_equal(tu_run(&o, "%s delta apply --in-place %s %s", tu_shoal(), c, d), 1);
    assert_non_null(strstr(o, "wrong base"));
    free(o);
    assert_true(files_equal(c, t));
    assert_int_equal(tu_run(&o, "%s delta inspect %s --json", tu_shoal(), d), 0);
    json_t *j;
    TU_OK(sh_json_parse(o, strlen(o), "inspect", &j));
    assert_true(json_array_size(json_object_get(j, "tensors")) > 5);
    json_decref(j);
    free(o);
    assert_int_equal(tu_run(&o, "%s delta inspect %s", tu_shoal(), d), 0);
    assert_non_null(strstr(o, "model.embed_tokens.weight"));
    free(o);
    assert_int_equal(tu_run(&o, "%s delta apply %s %s", tu_shoal(), b, d), 2);
    assert_non_null(strstr(o, "-o OUT or --in-place"));
    free(o);
    assert_int_equal(tu_run(&o, "%s delta make %s %s -o %s", tu_shoal(), b, tu_path("nope"), d), 1);
    assert_non_null(strstr(o, "nope"));
    free(o);
    assert_int_equal(tu_run(&o, "%s delta --help", tu_shoal()), 0);
    free(o);
}

static void make_folder(const char *dir, tt *t, size_t n, int split)
{
    char p[4096];
    sh_rm_rf(dir);
    sh_mkdir_p(dir, 0755);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    save(p, t, (size_t)split);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    save(p, t + split, n - (size_t)split);
    sh_buf b = {0};
    sh_buf_printf(&b, "{\"metadata\":{},\"weight_map\":{");
    for (size_t i = 0; i < n; i++)
        sh_buf_printf(&b, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "", t[i].name,
                      (int)i < split ? 1 : 2);
    sh_buf_printf(&b, "}}\n");
    snprintf(p, sizeof p, "%s/" CKPT_INDEX_NAME, dir);
    tu_write_file(p, b.data, b.len);
    sh_buf_free(&b);
}

static void test_sharded(void **state)
{
    tt b[4], t[4];
    for (int i = 0; i < 4; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "layer.%d", i);
        tt_set(&b[i], nm, CKPT_BF16, 2, 300 + i, 128);
        t[i] = b[i];
        t[i].data = malloc(b[i].nbytes);
        memcpy(t[i].data, b[i].data, b[i].nbytes);
        perturb(&t[i], 15, 1);
    }
    const char *bd = tu_path("sh_base"), *td = tu_path("sh_new"), *d = tu_path("sh.delta");
    const char *od = tu_path("sh_out"), *cd = tu_path("sh_copy");
    make_folder(bd, b, 4, 2);
    make_folder(td, t, 4, 3); /* the split moves between versions */
    TU_OK(delta_make(bd, td, d, NULL, NULL));
    TU_OK(delta_apply(bd, d, od, NULL));
    assert_int_equal(tu_run(NULL, "diff -r %s %s", od, td), 0);
    assert_int_equal(tu_run(NULL, "cp -r %s %s", bd, cd), 0);
    TU_OK(delta_apply(cd, d, NULL, NULL));
    assert_int_equal(tu_run(NULL, "diff -r %s %s", cd, td), 0);
    /* Folder target into a file path is refused with a hint. */
    const char *f = tu_path("sh_file");
    tu_write_file(f, "x", 1);
    TU_ERR(delta_apply(bd, d, f, NULL), SH_EINVAL, "is a file but the delta's target is a sharded");
    tt_free(b, 4);
    tt_free(t, 4);
}

static void test_squash_chain(void **state)
{
    /* A 10-step chain: squash equals the direct delta, byte for byte, and
     * applies to the final checkpoint. */
    char ck[11][64], dl[10][64];
    const char *paths[10];
    snprintf(ck[0], 64, "%s", tu_path("q0.safetensors"));
    TU_OK(ckpt_synth(ck[0], 300000, 5));
    for (int i = 1; i <= 10; i++) {
        char name[32];
        snprintf(name, sizeof name, "q%d.safetensors", i);
        snprintf(ck[i], 64, "%s", tu_path(name));
        TU_OK(ckpt_step(ck[i - 1], ck[i], 1e-5, 1, (uint64_t)i));
        snprintf(name, sizeof name, "q%d.delta", i);
        snprintf(dl[i - 1], 64, "%s", tu_path(name));
        TU_OK(delta_make(ck[i - 1], ck[i], dl[i - 1], NULL, NULL));
        paths[i - 1] = dl[i - 1];
    }
    const char *sq = tu_path("q_squash.delta"), *direct = tu_path("q_direct.delta");
    const char *out = tu_path("q_out.safetensors");
    TU_OK(delta_squash(paths, 10, sq, &(delta_opts){.threads = 3}, NULL));
    TU_OK(delta_make(ck[0], ck[10], direct, NULL, NULL));
    assert_true(files_equal(sq, direct));
    TU_OK(delta_apply(ck[0], sq, out, NULL));
    assert_true(files_equal(out, ck[10]));
    /* Out of order: refused. */
    const char *bad[2] = {dl[0], dl[2]};
    TU_ERR(delta_squash(bad, 2, tu_path("q_bad.delta"), NULL, NULL), SH_EMISMATCH, "not a chain");
}

static void test_squash_whole(void **state)
{
    /* v0 -> v1 reshapes x and adds y (whole), v1 -> v2 changes both a
     * little, v2 -> v3 changes one chunk of z completely (RAW/ZSTD). */
    tt v[4][3];
    tt_set(&v[0][0], "x", CKPT_BF16, 2, 40, 50);
    tt_set(&v[0][1], "z", CKPT_F32, 1, 1200000, 0);
    tt_set(&v[0][2], "gone", CKPT_U8, 1, 10, 0);
    tt_set(&v[1][0], "x", CKPT_BF16, 2, 50, 40);
    memcpy(v[1][0].data, v[0][0].data, v[0][0].nbytes);
    v[1][1] = v[0][1];
    v[1][1].data = malloc(v[0][1].nbytes);
    memcpy(v[1][1].data, v[0][1].data, v[0][1].nbytes);
    perturb(&v[1][1], 10, 2);
    tt_set(&v[1][2], "y", CKPT_F16, 1, 33, 0);
    for (int s = 2; s < 4; s++)
        for (int i = 0; i < 3; i++) {
            v[s][i] = v[s - 1][i];
            v[s][i].data = malloc(v[s - 1][i].nbytes);
            memcpy(v[s][i].data, v[s - 1][i].data, v[s - 1][i].nbytes);
            perturb(&v[s][i], 20, 1);
        }
    for (size_t k = 0; k < 3000000; k++) v[3][1].data[k] = (uint8_t)rnd();
    const char *c[4] = {tu_path("sw0.st"), tu_path("sw1.st"), tu_path("sw2.st"), tu_path("sw3.st")};
    char cs[4][256];
    for (int s = 0; s < 4; s++) {
        snprintf(cs[s], sizeof cs[s], "%s", c[s]);
        save(cs[s], v[s], 3);
    }
    const char *d[3] = {tu_path("sw1.delta"), tu_path("sw2.delta"), tu_path("sw3.delta")};
    char ds[3][256];
    const char *dp[3];
    for (int s = 0; s < 3; s++) {
        snprintf(ds[s], sizeof ds[s], "%s", d[s]);
        dp[s] = ds[s];
        TU_OK(delta_make(cs[s], cs[s + 1], ds[s], NULL, NULL));
    }
    const char *sq = tu_path("sw.delta"), *out = tu_path("sw_out.st");
    TU_OK(delta_squash(dp, 3, sq, NULL, NULL));
    TU_OK(delta_apply(cs[0], sq, out, NULL));
    assert_true(files_equal(out, cs[3]));
    for (int s = 0; s < 4; s++) tt_free(v[s], 3);
}

static void test_memory_api(void **state)
{
    /* The memory layer on images opened under full paths (a file name with
     * '/' once leaked into the manifest and made the delta unreadable). */
    const char *b = tu_path("m_base.safetensors"), *t = tu_path("m_new.safetensors");
    pair(b, t, 51);
    char *bi, *ti;
    size_t bl, tl;
    TU_OK(sh_read_file(b, 1 << 30, &bi, &bl));
    TU_OK(sh_read_file(t, 1 << 30, &ti, &tl));
    ckpt *B, *T;
    TU_OK(ckpt_open_mem(bi, bl, b, &B));
    TU_OK(ckpt_open_mem(ti, tl, t, &T));
    sh_buf d = {0};
    delta_stats st;
    TU_OK(delta_make_mem(B, T, &(delta_opts){.threads = 2}, &d, &st));
    assert_int_equal(st.delta_bytes, d.len);
    delta *dp;
    TU_OK(delta_parse(d.data, d.len, 0, &dp));
    assert_int_equal(delta_target_size(dp), tl);
    uint8_t *out = malloc(tl);
    size_t len;
    TU_ERR(delta_apply_mem(B, dp, NULL, out, tl - 1, &len), SH_ERANGE, "needs");
    TU_OK(delta_apply_mem(B, dp, NULL, out, tl, &len));
    assert_int_equal(len, tl);
    assert_memory_equal(out, ti, tl);
    /* In place: the target, or (wrong base, corrupt chunks) unchanged. */
    uint8_t *img = malloc(bl);
    memcpy(img, bi, bl);
    TU_OK(delta_apply_mem_inplace(img, bl, dp, &(delta_opts){.threads = 2}));
    assert_memory_equal(img, ti, tl);
    TU_ERR(delta_apply_mem_inplace(img, bl, dp, NULL), SH_EMISMATCH, "wrong base");
    assert_memory_equal(img, ti, tl);
    /* With a cache: the first apply hashes every chunk and keeps the
     * digests; every chunk whose bytes changed is marked written; a second
     * apply on the target (the wrong base) still fails and changes
     * nothing, the cache included. */
    delta_ip_cache c = {0};
    memcpy(img, bi, bl);
    TU_OK(delta_apply_mem_inplace_cached(img, bl, dp, NULL, &c));
    assert_memory_equal(img, ti, tl);
    assert_true(c.valid && c.applies == 1 && c.n > 0);
    int wrote = 0;
    for (size_t i = 0; i < c.n; i++) {
        assert_true(c.off[i] + c.len[i] <= bl);
        sh_hash128 h = ckpt_chunk_digest(img + c.off[i], c.len[i]);
        assert_true(sh_hash128_eq(h, c.dig[i]));
        if (memcmp(bi + c.off[i], ti + c.off[i], c.len[i])) assert_true(c.wrote[0][i]);
        wrote += c.wrote[0][i];
    }
    assert_true(wrote > 0);
    sh_hash128 d0 = c.dig[0];
    TU_ERR(delta_apply_mem_inplace_cached(img, bl, dp, NULL, &c), SH_EMISMATCH, "wrong base");
    assert_memory_equal(img, ti, tl);
    assert_true(c.valid && c.applies == 1 && sh_hash128_eq(d0, c.dig[0]));
    delta_ip_cache_free(&c);
    uint8_t *m = malloc(d.len);
    int failed = 0;
    for (int k = 0; k < 40; k++) {
        memcpy(img, bi, bl);
        memcpy(m, d.data, d.len);
        m[d.len / 2 + rnd() % (d.len / 2 - 16)] ^= (uint8_t)(1 + rnd() % 255);
        delta *mp;
        if (delta_parse(m, d.len, DELTA_NO_CHECKSUM, &mp) < 0) continue;
        int rc = delta_apply_mem_inplace(img, bl, mp, &(delta_opts){.threads = 1 + k % 3});
        if (rc < 0) failed++;
        if (memcmp(img, rc < 0 ? (uint8_t *)bi : (uint8_t *)ti, bl))
            fail_msg("mutation %d: rc %d (%s) but the image is not the %s", k, rc, sh_errmsg(),
                     rc < 0 ? "base" : "target");
        delta_free(mp);
    }
    assert_true(failed > 20);
    free(m);
    free(img);
    delta_free(dp);
    delta_free(NULL);
    free(out);
    sh_buf_free(&d);
    ckpt_close(B);
    ckpt_close(T);
    free(bi), free(ti);
}

static void test_golden(void **state)
{
    /* Deltas committed with the fuzz corpus still apply: the format of
     * version 1 does not drift. */
    const char *base = "fuzz/data/delta_base.safetensors";
    if (!sh_path_exists(base)) skip();
    for (int i = 1; i <= 3; i++) {
        char d[64];
        snprintf(d, sizeof d, "fuzz/corpus/fuzz_delta/seed%d", i);
        const char *out = tu_path("golden.safetensors");
        TU_OK(delta_apply(base, d, out, NULL));
        ckpt *c;
        TU_OK(ckpt_open(out, &c));
        ckpt_close(c);
    }
}

static void test_bench_json(void **state)
{
    /* The bench generates a pair, runs both codecs (each checks its own
     * round trip) and reports one JSON object with medians and ranges. */
    char *o;
    assert_int_equal(tu_run(&o, "TMPDIR=%s %s bench delta --params 1M --reps 2 --train-steps 1 --json",
                            tu_tmpdir(), tu_shoal()), 0);
    json_t *j;
    TU_OK(sh_json_parse(o, strlen(o), "bench delta", &j));
    json_t *sh = json_object_get(j, "shoal"), *x = json_object_get(j, "xor_zstd1");
    assert_int_equal(json_integer_value(json_object_get(j, "reps")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "warmup_runs")), 1);
    assert_true(json_integer_value(json_object_get(sh, "bytes")) > 0);
    assert_true(json_integer_value(json_object_get(sh, "bytes")) <
                json_integer_value(json_object_get(x, "bytes")));
    json_t *r = json_object_get(json_object_get(sh, "range"), "make_s");
    double lo = json_real_value(json_array_get(r, 0)), hi = json_real_value(json_array_get(r, 1));
    double med = json_real_value(json_object_get(sh, "make_s"));
    assert_true(lo > 0 && lo <= med && med <= hi);
    assert_true(json_real_value(json_object_get(json_object_get(j, "machine"), "memcpy_gb_per_s")) > 0);
    assert_int_equal(json_array_size(json_object_get(json_object_get(j, "per_dtype"), "dtypes")), 3);
    json_decref(j);
    free(o);
}

/* Issue 31: the delta of a real AdamW step per dtype (bf16, fp16, fp32 casts
 * of the fp32 masters) against XOR+zstd-1 of the same pair.  One step of a
 * from-scratch training moves every master by about lr: in fp32 every
 * element changes, in bf16 a fraction; shoal is smaller than the baseline
 * in each.  Bad options are refused with the option named. */
static void test_bench_dtypes(void **state)
{
    char *o;
    assert_int_equal(tu_run(&o, "TMPDIR=%s %s bench delta --dtypes --train-steps 1 --json", tu_tmpdir(),
                            tu_shoal()), 0);
    json_t *j;
    TU_OK(sh_json_parse(o, strlen(o), "bench delta --dtypes", &j));
    assert_true(json_integer_value(json_object_get(j, "params")) > 1000000);
    json_t *d = json_object_get(j, "dtypes");
    assert_int_equal(json_array_size(d), 3);
    const char *want[] = {"bf16", "fp16", "fp32"};
    for (size_t i = 0; i < 3; i++) {
        json_t *e = json_array_get(d, i);
        assert_string_equal(json_string_value(json_object_get(e, "dtype")), want[i]);
        json_int_t b = json_integer_value(json_object_get(e, "delta_bytes"));
        json_int_t x = json_integer_value(json_object_get(e, "xor_zstd1_bytes"));
        double frac = json_real_value(json_object_get(e, "changed_fraction"));
        assert_true(b > 0 && b < x);
        assert_true(fabs(json_real_value(json_object_get(e, "ratio")) - (double)b / (double)x) < 1e-9);
        assert_true(frac > 0.01 && frac <= 1);
        if (i == 2) assert_true(frac > 0.99);
    }
    /* Fewer elements of a 16-bit cast change than of the masters. */
    assert_true(json_real_value(json_object_get(json_array_get(d, 0), "changed_fraction")) <
                json_real_value(json_object_get(json_array_get(d, 2), "changed_fraction")));
    json_decref(j);
    free(o);
    assert_int_equal(tu_run(&o, "%s bench delta --dtypes --train-lr 0", tu_shoal()), 2);
    assert_non_null(strstr(o, "--train-lr 0"));
    free(o);
    assert_int_equal(tu_run(&o, "%s bench delta --dtypes a.safetensors b.safetensors", tu_shoal()), 2);
    assert_non_null(strstr(o, "give no BASE NEW"));
    free(o);
}

/* Issue 13: a tensor with more 2 MiB chunks than the checkpoint has
 * tensors.  make gathered each tensor's chunk digests into an array sized by
 * the tensor count, so one 4096 x 2048 bf16 tensor (8 chunks) with a few
 * hundred changes corrupted the heap.  Both through the library and through
 * the binary (the ASan build reports any overflow). */
static void test_few_large_tensors(void **state)
{
    tt one[1], three[3];
    tt_set(&one[0], "model.embed_tokens.weight", CKPT_BF16, 2, 4096, 2048);
    tt_set(&three[0], "a.bias", CKPT_F32, 1, 64, 0);
    tt_set(&three[1], "lm_head.weight", CKPT_BF16, 2, 4096, 2048);
    tt_set(&three[2], "z.weight", CKPT_BF16, 2, 3000, 1000); /* 3 chunks, the last partial */
    struct { tt *t; size_t n; const char *tag; } cases[] = {{one, 1, "one"}, {three, 3, "three"}};
    for (size_t c = 0; c < 2; c++) {
        char b[256], t[256], d[256], o[256];
        snprintf(b, sizeof b, "%s", tu_path(cases[c].tag));
        strcat(b, ".base.safetensors");
        snprintf(t, sizeof t, "%s.next.safetensors", tu_path(cases[c].tag));
        snprintf(d, sizeof d, "%s.delta", tu_path(cases[c].tag));
        snprintf(o, sizeof o, "%s.out.safetensors", tu_path(cases[c].tag));
        save(b, cases[c].t, cases[c].n);
        for (size_t i = 0; i < cases[c].n; i++) {
            tt *x = &cases[c].t[i];
            unsigned w = ckpt_dtype_bits(x->dt) / 8;
            for (int k = 0; k < 300; k++) x->data[(rnd() % (x->nbytes / w)) * w] ^= 1;
        }
        save(t, cases[c].t, cases[c].n);
        delta_stats st;
        TU_OK(delta_make(b, t, d, &(delta_opts){.threads = 2}, &st));
        assert_true(st.changed > 0 && st.changed <= 300 * cases[c].n);
        assert_true(st.delta_bytes < 64 * 1024);
        TU_OK(delta_apply(b, d, o, &(delta_opts){.verify_base = 1}));
        assert_true(files_equal(o, t));
        unlink(d), unlink(o);
        assert_int_equal(tu_run(NULL, "%s delta make %s %s -o %s", tu_shoal(), b, t, d), 0);
        assert_int_equal(tu_run(NULL, "%s delta apply %s %s -o %s", tu_shoal(), b, d, o), 0);
        assert_true(files_equal(o, t));
        tt_free(cases[c].t, cases[c].n);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_dtype), cmocka_unit_test(test_structure_changes),
        cmocka_unit_test(test_threads_identical),     cmocka_unit_test(test_wrong_base),
        cmocka_unit_test(test_corrupt_delta),         cmocka_unit_test(test_in_place_and_cli),
        cmocka_unit_test(test_sharded),               cmocka_unit_test(test_squash_chain),
        cmocka_unit_test(test_squash_whole),          cmocka_unit_test(test_memory_api),
        cmocka_unit_test(test_golden),                cmocka_unit_test(test_bench_json),
        cmocka_unit_test(test_bench_dtypes),
        cmocka_unit_test(test_wide_changes),          cmocka_unit_test(test_isa_identical),
        cmocka_unit_test(test_few_large_tensors),
    };
    return cmocka_run_group_tests_name("delta", tests, NULL, NULL);
}
