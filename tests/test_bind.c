/* The calls made for bindings (the bind.c files of src/common, src/weights/ckpt and
 * src/weights/store), from C, so that they also run under ASan and UBSan (the Python
 * tests use the optimised library only). */
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/ckpt.h"
#include "shoal/store.h"

static void test_publish_tensors_list_and_lease(void **state)
{
    const char *root = tu_path("store");
    sh_rm_rf(root);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    /* Two tensors straight from memory, as the Python package passes them. */
    enum { R = 300, C = 200 };
    uint16_t *w = malloc(R * C * sizeof *w);
    float bias[C];
    for (int i = 0; i < R * C; i++) w[i] = ckpt_f32_to_bf16((float)((i * 7919) % 1000) / 1000.0f - 0.5f);
    for (int i = 0; i < C; i++) bias[i] = (float)i;
    ckpt_tensor t[2] = {{.name = "w", .dtype = CKPT_BF16, .ndim = 2, .shape = {R, C}, .data = (const uint8_t *)w},
                        {.name = "bias", .dtype = CKPT_F32, .ndim = 1, .shape = {C}, .data = (const uint8_t *)bias}};
    uint64_t v;
    TU_OK(store_publish_tensors(s, t, 2, 0, &v));
    assert_int_equal(v, 1);
    w[5] ^= 1;
    TU_OK(store_publish_tensors(s, t, 2, 0, &v));
    assert_int_equal(v, 2);
    TU_ERR(store_publish_tensors(s, t, 0, 0, &v), SH_EINVAL, "no tensors");
    ckpt_tensor bad = {.name = NULL, .dtype = CKPT_F32, .ndim = 1, .shape = {4}};
    TU_ERR(store_publish_tensors(s, &bad, 1, 0, &v), SH_EINVAL, "no name or no data");
    char *text;
    TU_OK(store_list_json(s, &text));
    assert_non_null(strstr(text, "\"kind\":\"anchor\""));
    assert_non_null(strstr(text, "\"kind\":\"delta\""));
    sh_free(text);

    /* A replica from JSON; its lease's tensors are the published bytes. */
    char cfg[8192];
    snprintf(cfg, sizeof cfg, "{\"dir\": \"%s\", \"store\": \"%s\", \"poll_s\": 0.01}", tu_path("rep"), root);
    store_replica *r;
    TU_OK(store_replica_open_json(cfg, &r));
    TU_OK(store_replica_wait(r, 2, 30));
    store_lease *l;
    TU_OK(store_lease_new(r, 2, 0, &l));
    assert_int_equal(ckpt_count(l->ckpt), 2);
    assert_null(ckpt_tensor_at(l->ckpt, 2));
    for (size_t i = 0; i < ckpt_count(l->ckpt); i++) {
        const ckpt_tensor *x = ckpt_tensor_at(l->ckpt, i);
        const void *want = !strcmp(x->name, "w") ? (const void *)w : (const void *)bias;
        assert_memory_equal(x->data, want, x->nbytes);
    }
    assert_int_equal(ckpt_tensor_sizeof(), sizeof(ckpt_tensor));
    store_lease *none;
    TU_ERR(store_lease_new(r, 9, 0, &none), SH_EAGAIN, "at least version 9");
    assert_int_equal(store_lease_free(r, l), 2);
    store_lease_free(r, NULL);
    TU_OK(store_replica_info_json(r, &text));
    assert_non_null(strstr(text, "\"version\":2"));
    sh_free(text);
    store_replica_close_json(r);
    store_close(s);
    free(w);
}

/* store_publish_keep (the Python Store's default): deltas made against the
 * kept image, under ASan here.  Every version materializes to the bytes
 * ckpt_save writes for the same tensors; a second handle publishing in
 * between, and a new handle (a restart), make the kept image stale, and
 * the next delta is made against the store's version instead. */
static void test_publish_kept(void **state)
{
    const char *root = tu_path("kept");
    sh_rm_rf(root);
    store *a, *b;
    TU_OK(store_open(root, NULL, 1, &a));
    TU_OK(store_open(root, NULL, 1, &b));
    TU_OK(store_publish_keep(a, 1, 2));
    TU_OK(store_publish_keep(b, 1, 0));
    TU_ERR(store_publish_keep(a, 1, -1), SH_EINVAL, "-1 encoder threads");
    enum { N = 70000 };
    float *f = malloc(N * sizeof *f);
    uint16_t *h = malloc(N * sizeof *h);
    for (int i = 0; i < N; i++) f[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f, h[i] = ckpt_f32_to_bf16(f[i]);
    ckpt_tensor t[2] = {{.name = "f", .dtype = CKPT_F32, .ndim = 2, .shape = {N / 10, 10}, .data = (const uint8_t *)f},
                        {.name = "h", .dtype = CKPT_BF16, .ndim = 1, .shape = {N}, .data = (const uint8_t *)h}};
    store *who[6] = {a, a, b, a, NULL, a};
    for (int v = 1; v <= 6; v++) {
        for (int i = v; i < N; i += 3) f[i] += 1e-3f, h[i] = ckpt_f32_to_bf16(f[i]);
        store *s = who[v - 1];
        if (!s) { /* a restarted publisher */
            store_close(a);
            TU_OK(store_open(root, NULL, 1, &a));
            TU_OK(store_publish_keep(a, 1, 1));
            s = who[5] = a;
        }
        uint64_t got;
        TU_OK(store_publish_tensors_meta(s, t, 2, v == 2 ? "{\"k\":\"v\"}" : NULL, 20, &got));
        assert_int_equal(got, (uint64_t)v);
        char want[4096], out[4096];
        snprintf(want, sizeof want, "%s.want%d", root, v);
        snprintf(out, sizeof out, "%s.out%d", root, v);
        json_t *meta = v == 2 ? json_pack("{s:s}", "k", "v") : NULL;
        TU_OK(ckpt_save(want, t, 2, meta));
        json_decref(meta);
        TU_OK(store_materialize(a, (uint64_t)v, 0, NULL, out));
        assert_int_equal(tu_run(NULL, "cmp -s %s %s", want, out), 0);
    }
    char *text;
    TU_OK(store_list_json(a, &text));
    int anchors = 0; /* version 1 only: every other is a delta */
    for (const char *p = text; (p = strstr(p, "\"kind\":\"anchor\"")); p++) anchors++;
    assert_int_equal(anchors, 1);
    assert_non_null(strstr(text, "\"version\":6,\"kind\":\"delta\""));
    sh_free(text);
    ckpt_tensor neg = {.name = "n", .dtype = CKPT_F32, .ndim = 1, .shape = {-4}, .data = (const uint8_t *)f};
    uint64_t v;
    TU_ERR(store_publish_tensors(a, &neg, 1, 0, &v), SH_EINVAL, "bad dtype, rank or shape");
    TU_OK(store_publish_keep(a, 0, 0)); /* off: the file path again */
    TU_OK(store_publish_tensors(a, t, 2, 20, &v));
    assert_int_equal(v, 7);
    store_close(a);
    store_close(b);
    free(f);
    free(h);
}

static void test_replica_config_errors(void **state)
{
    store_replica *r;
    TU_ERR(store_replica_open_json("{\"dir\": \"/tmp/x\"}", &r), SH_EINVAL, "give \"store\"");
    TU_ERR(store_replica_open_json("{\"dir\": \"/tmp/x\", \"parents\": [\"nocolon\"]}", &r), SH_EINVAL, "host:port");
    TU_ERR(store_replica_open_json("{\"dir\": \"/tmp/x\", \"store\": \"/s\", \"colour\": 1}", &r), SH_EFORMAT, "unknown field \"colour\"");
    TU_ERR(store_replica_open_json("{\"dir\": \"/tmp/x\", \"store\": \"/s\", \"fanout\": 5000}", &r), SH_EINVAL, "fanout");
    assert_int_not_equal(store_replica_open_json("{not json", &r), 0);
    assert_null(r);
    store_replica_close_json(NULL);
    char *text;
    TU_ERR(sh_json_take_text(NULL, &text), SH_EINVAL, "no JSON");
    TU_OK(sh_json_take_text(json_pack("{s:i}", "a", 1), &text));
    assert_string_equal(text, "{\"a\":1}");
    sh_free(text);
}

/* /proc/self/status's RssFile, in bytes. */
static uint64_t rss_file(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssFile: %llu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

/* store_lease_drop_pages (what load_into calls as it copies): the leased
 * model's pages leave the process's RSS and read back the same bytes; a
 * range outside the model, or no lease, is refused by name. */
static void test_lease_drop_pages(void **state)
{
    const char *root = tu_path("drop");
    sh_rm_rf(root);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    enum { N = 4 << 20 }; /* 16 MiB of F32 */
    float *w = malloc(N * sizeof *w);
    for (int i = 0; i < N; i++) w[i] = (float)(i % 9973);
    ckpt_tensor t = {.name = "w", .dtype = CKPT_F32, .ndim = 1, .shape = {N}, .data = (const uint8_t *)w};
    uint64_t v;
    TU_OK(store_publish_tensors(s, &t, 1, 0, &v));
    char cfg[8192];
    snprintf(cfg, sizeof cfg, "{\"dir\": \"%s\", \"store\": \"%s\", \"poll_s\": 0.01}", tu_path("drop-rep"),
             root);
    store_replica *r;
    TU_OK(store_replica_open_json(cfg, &r));
    TU_OK(store_replica_wait(r, 1, 30));
    store_lease *l;
    TU_OK(store_lease_new(r, 1, 0, &l));
    const ckpt_tensor *x;
    TU_OK(store_lease_tensor(l, "w", &x));
    uint64_t before = rss_file();
    assert_memory_equal(x->data, w, x->nbytes); /* every page read */
    uint64_t read = rss_file();
    TU_OK(store_lease_drop_pages(l, 0, l->size));
    uint64_t dropped = rss_file();
    print_message("RssFile: %.1f MiB before reading, %.1f read, %.1f dropped\n", before / 1048576.0,
                  read / 1048576.0, dropped / 1048576.0);
    assert_true(read >= before + (12 << 20));
    assert_true(dropped + (12 << 20) <= read);
    assert_memory_equal(x->data, w, x->nbytes); /* the same bytes, faulted back in */
    /* Part of it: whole pages around the range, nothing outside the model. */
    TU_OK(store_lease_drop_pages(l, 1, 4095));
    TU_OK(store_lease_drop_pages(l, l->size, 0));
    TU_ERR(store_lease_drop_pages(l, l->size - 1, 2), SH_ERANGE, "outside version 1's");
    TU_ERR(store_lease_drop_pages(l, 1, UINT64_MAX), SH_ERANGE, "outside version 1's");
    TU_ERR(store_lease_drop_pages(l, UINT64_MAX, 1), SH_ERANGE, "outside version 1's");
    /* Only a model's own mapping: a lease whose data is anything else
     * (here, the caller's anonymous memory) is refused, not madvised. */
    store_lease forged = *l;
    forged.data = (const uint8_t *)w;
    TU_ERR(store_lease_drop_pages(&forged, 0, 4096), SH_EINVAL, "not its model's file mapping");
    assert_int_equal(w[1], 1.0f);
    TU_ERR(store_lease_drop_pages(NULL, 0, 1), SH_EINVAL, "no model leased");
    assert_memory_equal(x->data, w, x->nbytes);
    store_lease_free(r, l);
    store_replica_close_json(r);
    store_close(s);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_publish_tensors_list_and_lease),
        cmocka_unit_test(test_publish_kept),
        cmocka_unit_test(test_replica_config_errors),
        cmocka_unit_test(test_lease_drop_pages),
    };
    return cmocka_run_group_tests_name("bind", tests, NULL, NULL);
}
