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
 *    differs only in a tensor the delta does not diff (also when the base
 *    holds many one-byte tensors: each is one chunk to hash);
 *  - a manifest that breaks a rule of the format is refused by delta_parse
 *    with SH_EFORMAT naming the rule, even with a valid checksum (a hostile
 *    sender computes it): an encoding not allowed at its place, a header
 *    holding more tensors than the manifest lists or others than it names,
 *    a file name that is not a plain name, a missing field, a manifest
 *    that is not a JSON object or is longer than 256 MiB;
 *  - a stored (RAW or ZSTD) chunk of a diffed tensor that is corrupt is
 *    reported as that chunk's error, not as a wrong base;
 *  - the container writers set every header byte (a rewritten container
 *    is the same bytes, whatever the stack held);
 *  - squash refuses a chain whose deltas disagree on a diffed tensor's size,
 *    and keeps no memory once it returns (a store squashes for every late
 *    joiner);
 *  - an in-memory apply (copy or in place) refuses a sharded target with
 *    SH_EINVAL, leaving the image as it was;
 *  - in place refuses a delta that diffs a tensor against another one;
 *  - an in-place cache kept over two applies describes the image, counts
 *    the applies and marks what each of the last two wrote;
 *  - the decoder reads nothing past a chunk's payload, whatever the chunk
 *    holds (a payload that ends at an unmapped page decodes the same), and
 *    writes nothing past the chunk when a corrupt one has room for more
 *    symbols than the chunk has units. */
#include "testutil.h"

#include <fcntl.h>
#include <jansson.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/ckpt.h"
#include "shoal/delta.h"
#include "weights/delta/delta_int.h"

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

/* The target keeps tensor "a" (changed) and drops U one-unit tensors of
 * `ub` bytes each (4: U32, 1: U8); with base verification every dropped
 * tensor is hashed (one chunk each, whatever its size). */
static void dropped_case(size_t ub)
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
        t[k + 1] = (ckpt_tensor){.name = names[k], .dtype = ub == 4 ? CKPT_U32 : CKPT_U8, .ndim = 1,
                                 .shape = {1}, .numel = 1, .nbytes = ub, .data = (const uint8_t *)&u[k]};
    }
    char b[4096], bad[4096], g[4096], dpath[4096], out[4096];
    snprintf(b, sizeof b, "%s/drop%zu-base.st", tu_tmpdir(), ub);
    snprintf(bad, sizeof bad, "%s/drop%zu-bad.st", tu_tmpdir(), ub);
    snprintf(g, sizeof g, "%s/drop%zu-target.st", tu_tmpdir(), ub);
    snprintf(dpath, sizeof dpath, "%s/drop%zu.shd", tu_tmpdir(), ub);
    snprintf(out, sizeof out, "%s/drop%zu-out.st", tu_tmpdir(), ub);
    TU_OK(ckpt_save(b, t, U + 1, NULL));
    u[U / 2] ^= 1; /* one tensor the target drops (its first byte) */
    TU_OK(ckpt_save(bad, t, U + 1, NULL));
    t[0].data = (const uint8_t *)a2;
    TU_OK(ckpt_save(g, t, 1, NULL));
    TU_OK(delta_make(b, g, dpath, &(delta_opts){0}, NULL));
    TU_OK(delta_apply(b, dpath, out, &(delta_opts){.verify_base = 1}));
    tu_assert_same_file(out, g);
    TU_ERR(delta_apply(bad, dpath, out, &(delta_opts){.verify_base = 1}), SH_EMISMATCH, "base");
}

static void test_dropped_tensors_verified(void **state)
{
    dropped_case(4);
    dropped_case(1);
}

/* ---- Forged manifests ----------------------------------------------------- */

static uint64_t manifest_len(const uint8_t *b)
{
    uint64_t m = 0;
    for (int i = 7; i >= 0; i--) m = m << 8 | b[16 + i];
    return m;
}

static json_t *manifest_of(const sh_buf *d)
{
    json_error_t e;
    json_t *m = json_loadb((const char *)d->data + 24, (size_t)manifest_len(d->data), 0, &e);
    if (!m) fail_msg("manifest: %s", e.text);
    return m;
}

/* d's container around manifest m, with a trailer that checks out (a
 * hostile sender computes it as easily as shoal does). */
static void reseal_text(const sh_buf *d, const char *js, sh_buf *out)
{
    uint64_t ml = manifest_len(d->data);
    uint64_t nl = strlen(js);
    uint8_t head[24];
    memcpy(head, d->data, 16);
    for (int i = 0; i < 8; i++) head[16 + i] = (uint8_t)(nl >> (8 * i));
    *out = (sh_buf){0};
    TU_OK(sh_buf_append(out, head, 24));
    TU_OK(sh_buf_append(out, js, nl));
    TU_OK(sh_buf_append(out, d->data + 24 + ml, d->len - 24 - ml - 16));
    ckpt_digest_write(out, sh_hash128_of(out->data, out->len));
}

static void reseal(const sh_buf *d, const json_t *m, sh_buf *out)
{
    char *js = json_dumps(m, JSON_COMPACT);
    assert_non_null(js);
    reseal_text(d, js, out);
    free(js);
}

/* delta_parse must refuse d resealed around m (consumed) with SH_EFORMAT
 * and a message holding `what`. */
static void refused(const sh_buf *d, json_t *m, const char *what)
{
    sh_buf f;
    reseal(d, m, &f);
    json_decref(m);
    delta *dp = NULL;
    int rc = delta_parse(f.data, f.len, 0, &dp);
    if (rc == SH_OK) {
        delta_free(dp);
        fail_msg("a manifest forged for \"%s\" was accepted", what);
    }
    if (rc != SH_EFORMAT || !strstr(sh_errmsg(), what))
        fail_msg("a manifest forged for \"%s\": error %d: %s", what, rc, sh_errmsg());
    sh_buf_free(&f);
}

static json_t *mtensor(json_t *m, const char *name)
{
    json_t *ts = json_object_get(m, "tensors"), *t;
    size_t i;
    json_array_foreach(ts, i, t) if (!strcmp(json_string_value(json_object_get(t, "name")), name)) return t;
    fail_msg("no tensor %s in the manifest", name);
    return NULL;
}

static void set_enc(json_t *m, const char *name, json_int_t enc)
{
    json_t *c = json_array_get(json_object_get(mtensor(m, name), "chunks"), 0);
    json_array_set_new(c, 0, json_integer(enc));
}

/* Writes a checkpoint of tensors {name, dtype, bytes} and opens it. */
typedef struct {
    const char *name;
    ckpt_dtype dtype;
    const void *data;
    size_t nbytes;
} spec;

static void save(const char *path, const spec *s, size_t n)
{
    ckpt_tensor t[8];
    for (size_t i = 0; i < n; i++) {
        size_t u = ckpt_dtype_bits(s[i].dtype) / 8;
        t[i] = (ckpt_tensor){.name = (char *)s[i].name, .dtype = s[i].dtype, .ndim = 1, .shape = {s[i].nbytes / u},
                             .numel = s[i].nbytes / u, .nbytes = s[i].nbytes, .data = s[i].data};
    }
    TU_OK(ckpt_save(path, t, n, NULL));
}

static void test_forged_manifest_refused(void **state)
{
    enum { W = 4096, N = 1024 };
    static uint32_t w0[W], w1[W], nn[N];
    for (size_t i = 0; i < W; i++) w0[i] = next_u32(), w1[i] = w0[i] + (i % 7 == 0);
    for (size_t i = 0; i < N; i++) nn[i] = next_u32();
    char b[4096], g[4096];
    snprintf(b, sizeof b, "%s/forge-base.st", tu_tmpdir());
    snprintf(g, sizeof g, "%s/forge-target.st", tu_tmpdir());
    save(b, (spec[]){{"w", CKPT_U32, w0, sizeof w0}}, 1);
    save(g, (spec[]){{"w", CKPT_U32, w1, sizeof w1}, {"n", CKPT_U32, nn, sizeof nn}}, 2);
    char *bi, *ti;
    size_t bl, tl;
    ckpt *B = open_mem(b, &bi, &bl), *T = open_mem(g, &ti, &tl);
    sh_buf d = {0};
    TU_OK(delta_make_mem(B, T, &(delta_opts){.threads = 1}, &d, NULL));

    /* The resealed, unchanged manifest is a valid delta that rebuilds the
     * target: what the forgeries below refuse is their one change. */
    sh_buf f;
    json_t *m = manifest_of(&d);
    reseal(&d, m, &f);
    json_decref(m);
    delta *dp;
    TU_OK(delta_parse(f.data, f.len, 0, &dp));
    uint8_t *out = malloc(tl);
    size_t got = 0;
    TU_OK(delta_apply_mem(B, dp, &(delta_opts){.threads = 1}, out, tl, &got));
    assert_int_equal(got, tl);
    assert_memory_equal(out, ti, tl);
    delta_free(dp);
    sh_buf_free(&f);

    /* Encodings: "n" is whole (no base), so only RAW (3) and ZSTD (4); "w"
     * is diffed, so 0-4. */
    static const json_int_t whole_bad[] = {0, 1, 2, 5, -1}, diff_bad[] = {5, 7, -1};
    for (size_t k = 0; k < sizeof whole_bad / sizeof whole_bad[0]; k++) {
        m = manifest_of(&d);
        set_enc(m, "n", whole_bad[k]);
        refused(&d, m, "not allowed");
    }
    for (size_t k = 0; k < sizeof diff_bad / sizeof diff_bad[0]; k++) {
        m = manifest_of(&d);
        set_enc(m, "w", diff_bad[k]);
        refused(&d, m, "not allowed");
    }
    /* The header holds a tensor the manifest does not list. */
    m = manifest_of(&d);
    json_t *ts = json_object_get(m, "tensors");
    json_array_remove(ts, json_array_size(ts) - 1);
    refused(&d, m, "holds more tensors than listed");
    /* The manifest's dtype or size is not the header's. */
    m = manifest_of(&d);
    json_object_set_new(mtensor(m, "w"), "dtype", json_string("I32"));
    refused(&d, m, "does not match");
    m = manifest_of(&d);
    json_object_set_new(mtensor(m, "w"), "nbytes", json_integer(sizeof w1 - 4));
    refused(&d, m, "does not match");
    /* A file name that is a path (a sharded target's files land in a folder). */
    static const char *const names[] = {"../model.safetensors", "a/b", "/x", "..", ".", ""};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        m = manifest_of(&d);
        json_object_set_new(json_array_get(json_object_get(m, "files"), 0), "name", json_string(names[k]));
        refused(&d, m, "not a plain name");
    }
    /* A required field missing or of the wrong type. */
    m = manifest_of(&d);
    json_object_del(json_object_get(m, "base"), "sharded");
    refused(&d, m, "sharded");
    m = manifest_of(&d);
    json_object_set_new(json_object_get(m, "target"), "sharded", json_string("no"));
    refused(&d, m, "sharded");
    m = manifest_of(&d);
    json_object_del(mtensor(m, "w"), "digest");
    refused(&d, m, "digest");
    m = manifest_of(&d);
    json_object_del(mtensor(m, "w"), "base_digest");
    refused(&d, m, "base_digest");
    m = manifest_of(&d);
    json_object_set_new(json_object_get(m, "target"), "digest", json_integer(7));
    refused(&d, m, "digest");
    m = manifest_of(&d);
    json_object_del(m, "tensors");
    refused(&d, m, "missing \"tensors\"");
    /* A sharded target of no files (and so no tensors). */
    m = manifest_of(&d);
    json_t *tg = json_object_get(m, "target");
    json_object_set_new(tg, "sharded", json_true());
    json_object_set(tg, "index", json_object_get(json_array_get(json_object_get(m, "files"), 0), "header"));
    json_object_set_new(m, "files", json_array());
    json_object_set_new(m, "tensors", json_array());
    refused(&d, m, "\"files\" must list");

    /* A manifest that is not JSON, or not an object: the message says so
     * (with the parser's position for the first). */
    sh_buf f2;
    delta *bad = NULL;
    reseal_text(&d, "{\"format\": \"shoal-delta\",", &f2);
    TU_ERR(delta_parse(f2.data, f2.len, 0, &bad), SH_EFORMAT, "invalid JSON at line 1");
    sh_buf_free(&f2);
    reseal_text(&d, "[\"shoal-delta\"]", &f2);
    TU_ERR(delta_parse(f2.data, f2.len, 0, &bad), SH_EFORMAT, "JSON object");
    sh_buf_free(&f2);

    /* A manifest length over the 256 MiB bound is refused before anything
     * is parsed, even when the buffer holds that much. */
    size_t big = (257u << 20) + 40;
    uint8_t *huge = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(huge != MAP_FAILED);
    memcpy(huge, d.data, 16);
    uint64_t hm = (256u << 20) + 1;
    for (int i = 0; i < 8; i++) huge[16 + i] = (uint8_t)(hm >> (8 * i));
    memcpy(huge + 24, "{}", 2);
    delta *hd = NULL;
    TU_ERR(delta_parse(huge, big, DELTA_NO_CHECKSUM, &hd), SH_EFORMAT, "manifest length");
    munmap(huge, big);

    free(out);
    sh_buf_free(&d);
    ckpt_close(B), ckpt_close(T);
    free(bi), free(ti);
}

/* A diffed tensor whose chunk the delta stores (RAW: random new values;
 * ZSTD: compressible ones), its length one byte short in a resealed
 * manifest: apply refuses it as a corrupt chunk naming it, never as a wrong
 * base (the base is right), in a copy and in place. */
static void test_corrupt_stored_chunk_named(void **state)
{
    enum { W = 4096 };
    static uint32_t r0[W], r1[W], z0[W], z1[W];
    for (size_t i = 0; i < W; i++) r0[i] = next_u32(), r1[i] = next_u32(), z0[i] = next_u32(), z1[i] = (uint32_t)(i / 64);
    char b[4096], g[4096];
    snprintf(b, sizeof b, "%s/stored-base.st", tu_tmpdir());
    snprintf(g, sizeof g, "%s/stored-target.st", tu_tmpdir());
    save(b, (spec[]){{"r", CKPT_U32, r0, sizeof r0}, {"z", CKPT_U32, z0, sizeof z0}}, 2);
    save(g, (spec[]){{"r", CKPT_U32, r1, sizeof r1}, {"z", CKPT_U32, z1, sizeof z1}}, 2);
    char *bi, *ti;
    size_t bl, tl;
    ckpt *B = open_mem(b, &bi, &bl), *T = open_mem(g, &ti, &tl);
    sh_buf d = {0};
    TU_OK(delta_make_mem(B, T, &(delta_opts){.threads = 1}, &d, NULL));
    static const struct {
        const char *name;
        json_int_t enc;
    } cases[] = {{"r", DELTA__RAW}, {"z", DELTA__ZSTD}};
    uint8_t *out = malloc(tl), *img = malloc(bl);
    for (size_t k = 0; k < 2; k++) {
        json_t *m = manifest_of(&d);
        json_t *c = json_array_get(json_object_get(mtensor(m, cases[k].name), "chunks"), 0);
        assert_int_equal(json_integer_value(json_array_get(c, 0)), cases[k].enc);
        json_array_set_new(c, 2, json_integer(json_integer_value(json_array_get(c, 2)) - 1));
        sh_buf f;
        reseal(&d, m, &f);
        json_decref(m);
        delta *dp;
        TU_OK(delta_parse(f.data, f.len, 0, &dp));
        char want[64];
        snprintf(want, sizeof want, "tensor \"%s\" chunk 0", cases[k].name);
        size_t got = 0;
        int rc = delta_apply_mem(B, dp, &(delta_opts){.threads = 1}, out, tl, &got);
        if (rc != SH_EFORMAT || !strstr(sh_errmsg(), want))
            fail_msg("a short %s chunk: error %d: %s", cases[k].name, rc, sh_errmsg());
        memcpy(img, bi, bl);
        rc = delta_apply_mem_inplace(img, bl, dp, &(delta_opts){.threads = 1});
        if (rc != SH_EFORMAT || !strstr(sh_errmsg(), want))
            fail_msg("a short %s chunk in place: error %d: %s", cases[k].name, rc, sh_errmsg());
        assert_memory_equal(img, bi, bl);
        delta_free(dp);
        sh_buf_free(&f);
    }
    free(out), free(img);
    sh_buf_free(&d);
    ckpt_close(B), ckpt_close(T);
    free(bi), free(ti);
}

/* ---- The container ---------------------------------------------------------- */

/* Fills n bytes of stack below the caller's frame with 0xff, where the
 * next call's frame will lie. */
static __attribute__((noinline)) void dirty_stack(size_t n)
{
    volatile uint8_t junk[65536];
    for (size_t i = 0; i < n && i < sizeof junk; i++) junk[i] = 0xff;
}

/* Both container writers set every byte of the header, whatever the stack
 * held: rewriting a delta's container from its manifest and payload gives
 * its bytes exactly, in memory and to a file. */
static void test_container_bytes_defined(void **state)
{
    enum { W = 4096 };
    static uint32_t w0[W], w1[W];
    for (size_t i = 0; i < W; i++) w0[i] = next_u32(), w1[i] = w0[i] + (i % 3 == 0);
    char b[4096], g[4096], fpath[4096];
    snprintf(b, sizeof b, "%s/cont-base.st", tu_tmpdir());
    snprintf(g, sizeof g, "%s/cont-target.st", tu_tmpdir());
    snprintf(fpath, sizeof fpath, "%s/cont.shd", tu_tmpdir());
    save(b, (spec[]){{"w", CKPT_U32, w0, sizeof w0}}, 1);
    save(g, (spec[]){{"w", CKPT_U32, w1, sizeof w1}}, 1);
    ckpt *B, *T;
    TU_OK(ckpt_open(b, &B));
    TU_OK(ckpt_open(g, &T));
    sh_buf d = {0}, again = {0};
    TU_OK(delta_make_mem(B, T, &(delta_opts){.threads = 1}, &d, NULL));
    json_t *m = manifest_of(&d);
    uint64_t ml = manifest_len(d.data);
    delta__seg seg = {d.data + 24 + ml, d.len - 24 - ml - 16};
    dirty_stack(65536);
    TU_OK(delta__write_container(m, &seg, 1, &again));
    assert_int_equal(again.len, d.len);
    assert_memory_equal(again.data, d.data, d.len);
    int fd = open(fpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    uint64_t len = 0;
    dirty_stack(65536);
    TU_OK(delta__write_container_fd(m, &seg, 1, fd, fpath, &len));
    close(fd);
    assert_int_equal(len, d.len);
    size_t fl;
    uint8_t *fb = tu_read_file(fpath, &fl);
    assert_int_equal(fl, d.len);
    assert_memory_equal(fb, d.data, d.len);
    free(fb);
    json_decref(m);
    sh_buf_free(&d), sh_buf_free(&again);
    ckpt_close(B), ckpt_close(T);
}

/* ---- Squash ----------------------------------------------------------------- */

static void write_buf(const char *path, const sh_buf *b)
{
    tu_write_file(path, b->data, b->len);
}

/* A delta from a checkpoint of tensor "w" of nw U32 units to the same with
 * one unit in 7 changed, written to path; its manifest is returned. */
static json_t *w_delta(const char *tag, size_t nw, sh_buf *d)
{
    uint32_t *w0 = malloc(nw * 4), *w1 = malloc(nw * 4);
    for (size_t i = 0; i < nw; i++) w0[i] = next_u32(), w1[i] = w0[i] + (i % 7 == 0);
    char b[4096], g[4096];
    snprintf(b, sizeof b, "%s/%s-base.st", tu_tmpdir(), tag);
    snprintf(g, sizeof g, "%s/%s-target.st", tu_tmpdir(), tag);
    save(b, (spec[]){{"w", CKPT_U32, w0, nw * 4}}, 1);
    save(g, (spec[]){{"w", CKPT_U32, w1, nw * 4}}, 1);
    ckpt *B, *T;
    TU_OK(ckpt_open(b, &B));
    TU_OK(ckpt_open(g, &T));
    *d = (sh_buf){0};
    TU_OK(delta_make_mem(B, T, &(delta_opts){.threads = 1}, d, NULL));
    ckpt_close(B), ckpt_close(T);
    free(w0), free(w1);
    return manifest_of(d);
}

/* Delta 2 claims to start where delta 1 ends (its base digest is delta 1's
 * target digest, the checksum recomputed) but diffs "w" at twice the size:
 * not a chain, whatever the digests say. */
static void test_squash_forged_chain(void **state)
{
    sh_buf d1, d2, f2;
    json_t *m1 = w_delta("chain1", 4096, &d1), *m2 = w_delta("chain2", 8192, &d2);
    json_object_set(json_object_get(m2, "base"), "digest",
                    json_object_get(json_object_get(m1, "target"), "digest"));
    reseal(&d2, m2, &f2);
    char p1[4096], p2[4096], out[4096];
    snprintf(p1, sizeof p1, "%s/chain1.shd", tu_tmpdir());
    snprintf(p2, sizeof p2, "%s/chain2.shd", tu_tmpdir());
    snprintf(out, sizeof out, "%s/chain-squashed.shd", tu_tmpdir());
    write_buf(p1, &d1);
    write_buf(p2, &f2);
    const char *chain[] = {p1, p2};
    TU_ERR(delta_squash(chain, 2, out, &(delta_opts){.threads = 1}, NULL), SH_EFORMAT, "\"w\"");
    assert_false(sh_path_exists(out));
    json_decref(m1), json_decref(m2);
    sh_buf_free(&d1), sh_buf_free(&d2), sh_buf_free(&f2);
}

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* A squash frees what it allocated: squashing a delta whose first chunk is
 * 1 MiB of stored bytes four more times leaves the heap as it was after
 * the first (under ASan, LeakSanitizer checks the same). */
static void test_squash_keeps_no_memory(void **state)
{
    enum { N = 1 << 18 };
    uint32_t *big = malloc(N * 4), w0[64], w1[64];
    for (size_t i = 0; i < N; i++) big[i] = next_u32();
    for (size_t i = 0; i < 64; i++) w0[i] = next_u32(), w1[i] = w0[i] + 1;
    char b[4096], g[4096], dp[4096], out[4096];
    snprintf(b, sizeof b, "%s/sqmem-base.st", tu_tmpdir());
    snprintf(g, sizeof g, "%s/sqmem-target.st", tu_tmpdir());
    snprintf(dp, sizeof dp, "%s/sqmem.shd", tu_tmpdir());
    snprintf(out, sizeof out, "%s/sqmem-out.shd", tu_tmpdir());
    save(b, (spec[]){{"w", CKPT_U32, w0, sizeof w0}}, 1);
    save(g, (spec[]){{"a", CKPT_U32, big, N * 4}, {"w", CKPT_U32, w1, sizeof w1}}, 2);
    free(big);
    TU_OK(delta_make(b, g, dp, &(delta_opts){.threads = 1}, NULL));
    const char *chain[] = {dp};
    TU_OK(delta_squash(chain, 1, out, &(delta_opts){.threads = 1}, NULL));
    size_t before = heap_in_use();
    for (int k = 0; k < 4; k++) TU_OK(delta_squash(chain, 1, out, &(delta_opts){.threads = 1}, NULL));
    size_t after = heap_in_use();
    if (after > before + (512u << 10))
        fail_msg("four squashes left %zu bytes more on the heap", after - before);
}

/* ---- In memory: single-file targets only ------------------------------------ */

/* A folder of one shard and its index. */
static void save_folder(const char *dir, const spec *s)
{
    assert_int_equal(mkdir(dir, 0755), 0);
    char p[4096];
    snprintf(p, sizeof p, "%s/model-00001-of-00001.safetensors", dir);
    save(p, s, 1);
    char idx[256];
    int n = snprintf(idx, sizeof idx, "{\"metadata\":{},\"weight_map\":{\"%s\":\"model-00001-of-00001.safetensors\"}}",
                     s->name);
    snprintf(p, sizeof p, "%s/%s", dir, CKPT_INDEX_NAME);
    tu_write_file(p, idx, (size_t)n);
}

static void test_sharded_target_not_in_memory(void **state)
{
    enum { W = 4096 };
    static uint32_t w0[W], w1[W];
    for (size_t i = 0; i < W; i++) w0[i] = next_u32(), w1[i] = w0[i] + (i % 5 == 0);
    char b[4096], g[4096], dpath[4096], out[4096], shard[4096];
    snprintf(b, sizeof b, "%s/shard-base", tu_tmpdir());
    snprintf(g, sizeof g, "%s/shard-target", tu_tmpdir());
    snprintf(dpath, sizeof dpath, "%s/shard.shd", tu_tmpdir());
    snprintf(out, sizeof out, "%s/shard-out", tu_tmpdir());
    save_folder(b, (spec[]){{"w", CKPT_U32, w0, sizeof w0}});
    save_folder(g, (spec[]){{"w", CKPT_U32, w1, sizeof w1}});
    TU_OK(delta_make(b, g, dpath, &(delta_opts){.threads = 1}, NULL));
    /* The delta is good: the file layer rebuilds the folder. */
    TU_OK(delta_apply(b, dpath, out, &(delta_opts){.threads = 1}));
    char x[4096], y[4096];
    snprintf(x, sizeof x, "%s/model-00001-of-00001.safetensors", out);
    snprintf(y, sizeof y, "%s/model-00001-of-00001.safetensors", g);
    tu_assert_same_file(x, y);
    /* A sharded target is a folder: an out that is a file is refused before
     * anything is written, and the file is left as it was. */
    char ofile[4096];
    snprintf(ofile, sizeof ofile, "%s/shard-out.st", tu_tmpdir());
    tu_write_file(ofile, "keep", 4);
    TU_ERR(delta_apply(b, dpath, ofile, &(delta_opts){.threads = 1}), SH_EINVAL, "is a file");
    size_t kl;
    uint8_t *kb = tu_read_file(ofile, &kl);
    assert_int_equal(kl, 4);
    assert_memory_equal(kb, "keep", 4);
    free(kb);
    char stage[4200];
    snprintf(stage, sizeof stage, "%s.tmp.%ld", ofile, (long)getpid());
    assert_false(sh_path_exists(stage));
    size_t dl, il;
    uint8_t *db = tu_read_file(dpath, &dl);
    delta *d;
    TU_OK(delta_parse(db, dl, 0, &d));
    ckpt *B;
    TU_OK(ckpt_open(b, &B));
    snprintf(shard, sizeof shard, "%s/model-00001-of-00001.safetensors", b);
    uint8_t *img = tu_read_file(shard, &il), *was = malloc(il), *o = malloc(il + 4096);
    memcpy(was, img, il);
    size_t got = 0;
    TU_ERR(delta_apply_mem(B, d, &(delta_opts){.threads = 1}, o, il + 4096, &got), SH_EINVAL, "sharded");
    TU_ERR(delta_apply_mem_inplace(img, il, d, &(delta_opts){.threads = 1}), SH_EINVAL, "keeps the layout");
    assert_memory_equal(img, was, il);
    free(img), free(was), free(o), free(db);
    ckpt_close(B);
    delta_free(d);
}

/* A delta (resealed) that diffs tensor "a" against base tensor "b": in
 * place patches every tensor where it lies, so it is refused there
 * (SH_EINVAL, naming both) before anything is written, whichever tensor
 * it is (the copy apply refuses it too: "b" would be diffed twice). */
static void test_inplace_cross_diff_refused(void **state)
{
    enum { W = 2048 };
    static uint32_t a0[W], a1[W], b0[W], b1[W];
    for (size_t i = 0; i < W; i++)
        a0[i] = next_u32(), a1[i] = a0[i] + (i % 5 == 0), b0[i] = next_u32(), b1[i] = b0[i] + (i % 9 == 0);
    char b[4096], g[4096];
    snprintf(b, sizeof b, "%s/cross-base.st", tu_tmpdir());
    snprintf(g, sizeof g, "%s/cross-target.st", tu_tmpdir());
    save(b, (spec[]){{"a", CKPT_U32, a0, sizeof a0}, {"b", CKPT_U32, b0, sizeof b0}}, 2);
    save(g, (spec[]){{"a", CKPT_U32, a1, sizeof a1}, {"b", CKPT_U32, b1, sizeof b1}}, 2);
    char *bi, *ti;
    size_t bl, tl;
    ckpt *B = open_mem(b, &bi, &bl), *T = open_mem(g, &ti, &tl);
    sh_buf d = {0};
    TU_OK(delta_make_mem(B, T, &(delta_opts){.threads = 1}, &d, NULL));
    uint8_t *img = malloc(bl), *out = malloc(tl);
    static const char *const from[][2] = {{"a", "b"}, {"b", "a"}};
    for (size_t k = 0; k < 2; k++) {
        json_t *m = manifest_of(&d);
        json_object_set_new(mtensor(m, from[k][0]), "base", json_string(from[k][1]));
        sh_buf f;
        reseal(&d, m, &f);
        json_decref(m);
        delta *dp;
        TU_OK(delta_parse(f.data, f.len, 0, &dp));
        memcpy(img, bi, bl);
        char want[64];
        snprintf(want, sizeof want, "\"%s\" is diffed against \"%s\"", from[k][0], from[k][1]);
        TU_ERR(delta_apply_mem_inplace(img, bl, dp, &(delta_opts){.threads = 1}), SH_EINVAL, want);
        assert_memory_equal(img, bi, bl);
        size_t got = 0;
        TU_ERR(delta_apply_mem(B, dp, &(delta_opts){.threads = 1}, out, tl, &got), SH_EFORMAT, "diffed twice");
        delta_free(dp);
        sh_buf_free(&f);
    }
    free(img), free(out);
    sh_buf_free(&d);
    ckpt_close(B), ckpt_close(T);
    free(bi), free(ti);
}

/* Two applies in place with one cache (v0 -> v1 -> v2): after each the
 * cache describes the image (every chunk's place, size and digest), counts
 * the applies since it was made whole, and marks the chunks each of the
 * last two applies wrote (exactly those whose bytes changed). */
static void test_inplace_cache_two_applies(void **state)
{
    enum { A = (CKPT_CHUNK + 4096) / 4, Bn = 4096 };
    uint32_t *a[3], *bt[3];
    for (int v = 0; v < 3; v++) a[v] = malloc(A * 4), bt[v] = malloc(Bn * 4);
    for (size_t i = 0; i < A; i++) a[0][i] = next_u32();
    for (size_t i = 0; i < Bn; i++) bt[0][i] = next_u32();
    memcpy(a[1], a[0], A * 4), memcpy(bt[1], bt[0], Bn * 4);
    for (size_t i = 0; i < CKPT_CHUNK / 4; i += 97) a[1][i]++; /* v1: a's chunk 0 and b */
    for (size_t i = 0; i < Bn; i += 13) bt[1][i]++;
    memcpy(a[2], a[1], A * 4), memcpy(bt[2], bt[1], Bn * 4);
    for (size_t i = CKPT_CHUNK / 4; i < A; i += 7) a[2][i]++; /* v2: a's chunk 1 only */
    char p[3][4096];
    char *buf[3];
    size_t len[3];
    ckpt *c[3];
    for (int v = 0; v < 3; v++) {
        snprintf(p[v], sizeof p[v], "%s/cache-v%d.st", tu_tmpdir(), v);
        save(p[v], (spec[]){{"a", CKPT_U32, a[v], A * 4}, {"b", CKPT_U32, bt[v], Bn * 4}}, 2);
        c[v] = open_mem(p[v], &buf[v], &len[v]);
    }
    assert_int_equal(len[0], len[2]);
    sh_buf d[2] = {{0}, {0}};
    delta *dp[2];
    for (int k = 0; k < 2; k++) {
        TU_OK(delta_make_mem(c[k], c[k + 1], &(delta_opts){.threads = 1}, &d[k], NULL));
        TU_OK(delta_parse(d[k].data, d[k].len, 0, &dp[k]));
    }
    /* The chunks in image order: a's two, then b's one. */
    const ckpt_tensor *ta = ckpt_find(c[0], "a"), *tb = ckpt_find(c[0], "b");
    uint64_t ao = (uint64_t)(ta->data - (const uint8_t *)buf[0]), bo = (uint64_t)(tb->data - (const uint8_t *)buf[0]);
    const uint64_t off[3] = {ao, ao + CKPT_CHUNK, bo};
    const uint32_t clen[3] = {CKPT_CHUNK, 4096, Bn * 4};
    uint8_t *img = malloc(len[0]);
    memcpy(img, buf[0], len[0]);
    delta_ip_cache cache = {0};
    for (int k = 0; k < 2; k++) {
        TU_OK(delta_apply_mem_inplace_cached(img, len[0], dp[k], &(delta_opts){.threads = 1}, &cache));
        assert_memory_equal(img, buf[k + 1], len[0]);
        assert_true(cache.valid);
        assert_int_equal(cache.applies, k + 1);
        assert_int_equal(cache.n, 3);
        for (size_t i = 0; i < 3; i++) {
            assert_int_equal(cache.off[i], off[i]);
            assert_int_equal(cache.len[i], clen[i]);
            assert_true(sh_hash128_eq(cache.dig[i], ckpt_chunk_digest(img + off[i], clen[i])));
            for (int j = 0; j <= k; j++) {
                int changed = memcmp(buf[k - j] + off[i], buf[k + 1 - j] + off[i], clen[i]) != 0;
                if (cache.wrote[j][i] != changed)
                    fail_msg("apply %d: chunk %zu marked %d by the apply %d before, changed %d", k + 1, i,
                             cache.wrote[j][i], j, changed);
            }
        }
    }
    delta_ip_cache_free(&cache);
    free(img);
    for (int k = 0; k < 2; k++) delta_free(dp[k]), sh_buf_free(&d[k]);
    for (int v = 0; v < 3; v++) ckpt_close(c[v]), free(buf[v]), free(a[v]), free(bt[v]);
}

/* ---- The decoder stays inside a chunk ------------------------------------- */

/* Each diffed chunk of d decoded (both decoders) from a copy whose last
 * byte is the last of a page followed by an unmapped one: the same bytes
 * as the target, and no read past the payload (which would fault). */
static void decode_at_guard(const delta *d, const uint8_t *base, const uint8_t *target, size_t *ndiff)
{
    long pg = sysconf(_SC_PAGESIZE);
    delta__scratch s;
    TU_OK(delta__scratch_init(&s));
    for (size_t t = 0; t < d->ntensors; t++) {
        const delta__tensor *dt = &d->tensors[t];
        const ckpt_tensor *ft = &d->files[0].t[t];
        unsigned w = delta__unit(dt->dtype);
        for (size_t c = 0; c < dt->nchunks; c++) {
            const delta__chunk *ch = &dt->chunks[c];
            if (ch->enc != DELTA__SPARSE && ch->enc != DELTA__DENSE) continue;
            (*ndiff)++;
            uint64_t off = (uint64_t)c * CKPT_CHUNK;
            size_t n = dt->nbytes - off < CKPT_CHUNK ? (size_t)(dt->nbytes - off) : CKPT_CHUNK;
            size_t span = ((size_t)ch->len + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
            uint8_t *map = mmap(NULL, span + (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            assert_true(map != MAP_FAILED);
            assert_int_equal(mprotect(map + span, (size_t)pg, PROT_NONE), 0);
            uint8_t *p = map + span - ch->len;
            memcpy(p, d->payload + ch->off, (size_t)ch->len);
            const uint8_t *bt = base + ft->offset + off, *want = target + ft->offset + off;
            uint8_t *o = malloc(n);
            memcpy(o, bt, n);
            TU_OK(delta__decode_chunk(&s, ch->enc, p, (size_t)ch->len, w, ckpt_dtype_is_float(dt->dtype), o, n,
                                      NULL, "guard"));
            assert_memory_equal(o, want, n);
            sh_hash128 bd, od;
            memset(o, 0, n);
            TU_OK(delta__decode_fused(&s, ch->enc, p, (size_t)ch->len, w, ckpt_dtype_is_float(dt->dtype), bt, o,
                                      n, &bd, &od, NULL, "guard"));
            assert_memory_equal(o, want, n);
            assert_true(sh_hash128_eq(od, ckpt_chunk_digest(want, n)));
            free(o);
            munmap(map, span + (size_t)pg);
        }
    }
    delta__scratch_free(&s);
}

/* Chunks whose extra-bit streams are empty or a few bytes (changes below
 * 16 need no extra bits) and one with a long stream, dense and sparse. */
static void test_decode_stays_in_chunk(void **state)
{
    enum { A = 4096, S = 16384, L = 8192 };
    static uint32_t a0[A], a1[A], s0[S], s1[S], l0[L], l1[L];
    for (size_t i = 0; i < A; i++) a0[i] = next_u32(), a1[i] = a0[i] + 1 + (uint32_t)(i % 3);
    for (size_t i = 0; i < S; i++) s0[i] = next_u32(), s1[i] = s0[i] + (i % 6 == 0 ? 1 + (uint32_t)(i % 5) : 0);
    for (size_t i = 0; i < L; i++) l0[i] = next_u32(), l1[i] = l0[i] + (i % 2 ? next_u32() % 100000 : 0);
    char b[4096], g[4096];
    snprintf(b, sizeof b, "%s/guard-base.st", tu_tmpdir());
    snprintf(g, sizeof g, "%s/guard-target.st", tu_tmpdir());
    save(b, (spec[]){{"a", CKPT_U32, a0, sizeof a0}, {"l", CKPT_U32, l0, sizeof l0}, {"s", CKPT_U32, s0, sizeof s0}}, 3);
    save(g, (spec[]){{"a", CKPT_U32, a1, sizeof a1}, {"l", CKPT_U32, l1, sizeof l1}, {"s", CKPT_U32, s1, sizeof s1}}, 3);
    char *bi, *ti;
    size_t bl, tl;
    ckpt *B = open_mem(b, &bi, &bl), *T = open_mem(g, &ti, &tl);
    assert_int_equal(bl, tl);
    sh_buf d = {0};
    TU_OK(delta_make_mem(B, T, &(delta_opts){.threads = 1}, &d, NULL));
    delta *dp;
    TU_OK(delta_parse(d.data, d.len, 0, &dp));
    size_t ndiff = 0;
    decode_at_guard(dp, (const uint8_t *)bi, (const uint8_t *)ti, &ndiff);
    assert_int_equal(ndiff, 3);
    delta_free(dp);
    sh_buf_free(&d);
    ckpt_close(B), ckpt_close(T);
    free(bi), free(ti);
}

/* A dense chunk of a tensor whose unit count is 3 past a multiple of 4,
 * made corrupt by 8 more bytes at the end of its rANS stream and 32 at the
 * end of its extra bits (so the fast loop has room to its last symbols):
 * decoding into a buffer that ends at an unmapped page is refused (the
 * stream does not end where it should) without writing one unit past the
 * chunk. */
static void test_decode_writes_only_its_chunk(void **state)
{
    enum { N = 4099 };
    static uint32_t v0[N], v1[N];
    for (size_t i = 0; i < N; i++) v0[i] = next_u32(), v1[i] = v0[i] + 100 + next_u32() % 900;
    char b[4096], g[4096];
    snprintf(b, sizeof b, "%s/tail-base.st", tu_tmpdir());
    snprintf(g, sizeof g, "%s/tail-target.st", tu_tmpdir());
    save(b, (spec[]){{"w", CKPT_U32, v0, sizeof v0}}, 1);
    save(g, (spec[]){{"w", CKPT_U32, v1, sizeof v1}}, 1);
    ckpt *B, *T;
    TU_OK(ckpt_open(b, &B));
    TU_OK(ckpt_open(g, &T));
    sh_buf d = {0};
    TU_OK(delta_make_mem(B, T, &(delta_opts){.threads = 1}, &d, NULL));
    delta *dp;
    TU_OK(delta_parse(d.data, d.len, 0, &dp));
    const delta__chunk *ch = &dp->tensors[0].chunks[0];
    assert_int_equal(ch->enc, DELTA__DENSE);
    const uint8_t *p0 = dp->payload + ch->off, *e0 = p0 + ch->len, *q = p0;
    delta__dtable *tab = malloc(sizeof *tab);
    TU_OK(delta__get_table(&q, e0, tab, "table"));
    size_t tlen = (size_t)(q - p0);
    uint64_t r;
    TU_OK(delta__get_varint(&q, e0, &r, "rANS length"));
    const uint8_t *bits = q + r;
    size_t blen = (size_t)(e0 - bits);
    uint8_t *pl = calloc(1, (size_t)ch->len + 64);
    uint8_t *w = pl;
    memcpy(w, p0, tlen), w += tlen;
    w = delta__put_varint(w, r + 8);
    memcpy(w, q, (size_t)r), w += r + 8;
    memcpy(w, bits, blen), w += blen + 32;
    size_t plen = (size_t)(w - pl);

    long pg = sysconf(_SC_PAGESIZE);
    size_t nbytes = sizeof v1, span = (nbytes + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
    uint8_t *map = mmap(NULL, span + (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(map != MAP_FAILED);
    assert_int_equal(mprotect(map + span, (size_t)pg, PROT_NONE), 0);
    uint8_t *out = map + span - nbytes;
    delta__scratch s;
    TU_OK(delta__scratch_init(&s));
    /* The unpadded chunk decodes to the target there. */
    memcpy(out, v0, nbytes);
    TU_OK(delta__decode_chunk(&s, DELTA__DENSE, p0, (size_t)ch->len, 4, 0, out, nbytes, NULL, "tail"));
    assert_memory_equal(out, v1, nbytes);
    memcpy(out, v0, nbytes);
    TU_ERR(delta__decode_chunk(&s, DELTA__DENSE, pl, plen, 4, 0, out, nbytes, NULL, "tail"), SH_EFORMAT,
           "does not end where it should");
    delta__scratch_free(&s);
    munmap(map, span + (size_t)pg);
    free(pl), free(tab);
    delta_free(dp);
    sh_buf_free(&d);
    ckpt_close(B), ckpt_close(T);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inplace_dense_is_target),
        cmocka_unit_test(test_dropped_tensors_verified),
        cmocka_unit_test(test_forged_manifest_refused),
        cmocka_unit_test(test_corrupt_stored_chunk_named),
        cmocka_unit_test(test_container_bytes_defined),
        cmocka_unit_test(test_squash_forged_chain),
        cmocka_unit_test(test_squash_keeps_no_memory),
        cmocka_unit_test(test_sharded_target_not_in_memory),
        cmocka_unit_test(test_inplace_cross_diff_refused),
        cmocka_unit_test(test_inplace_cache_two_applies),
        cmocka_unit_test(test_decode_stays_in_chunk),
        cmocka_unit_test(test_decode_writes_only_its_chunk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
