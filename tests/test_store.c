/* The store protocol: publish, LATEST, manifests, plans, gc, bad inputs. */
#include "testutil.h"

#include <errno.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/ckpt.h"
#include "shoal/store.h"

/* Deterministic bytes: a file of `len` bytes from `seed`. */
static void make_file(const char *path, size_t len, unsigned seed)
{
    uint8_t *b = malloc(len ? len : 1);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (uint8_t)x;
    }
    tu_write_file(path, b, len);
    free(b);
}

/* A real (small) checkpoint: publish accepts only safetensors. */
static void synth(const char *path, uint64_t params, unsigned seed)
{
    TU_OK(ckpt_synth(path, params, seed));
}

static store *fresh(const char *name)
{
    store *s;
    sh_rm_rf(tu_path(name));
    TU_OK(store_open(tu_path(name), "r1", 1, &s));
    return s;
}

static void test_publish_and_latest(void **state)
{
    store *s = fresh("pub");
    uint64_t v = 99, latest;
    TU_OK(store_latest(s, &latest));
    assert_int_equal(latest, 0);
    synth(tu_path("a.bin"), 50000, 1);
    synth(tu_path("b.bin"), 35000, 2);
    store_publish_opts o = {1};
    TU_OK(store_publish(s, tu_path("a.bin"), &o, &v));
    assert_int_equal(v, 1);
    TU_OK(store_publish(s, tu_path("b.bin"), &o, &v));
    assert_int_equal(v, 2);
    TU_OK(store_latest(s, &latest));
    assert_int_equal(latest, 2);
    store_version m;
    TU_OK(store_get(s, 2, &m, NULL));
    assert_true(m.anchor);
    struct stat st;
    assert_int_equal(stat(tu_path("b.bin"), &st), 0);
    assert_int_equal(m.size, (uint64_t)st.st_size);
    assert_int_equal(m.model_size, (uint64_t)st.st_size);
    TU_OK(store_verify(s, 1));
    TU_OK(store_verify(s, 2));
    /* LATEST is one line of JSON naming the run. */
    size_t len;
    char *text = (char *)tu_read_file(tu_path("pub/r1/LATEST"), &len);
    assert_string_equal(text, "{\"format\":\"shoal-latest/1\",\"run\":\"r1\",\"version\":2}\n");
    free(text);
    /* The version rebuilt from the store is the checkpoint published. */
    TU_OK(store_materialize(s, 1, 0, NULL, tu_path("out.bin")));
    size_t la, lb;
    uint8_t *a = tu_read_file(tu_path("a.bin"), &la), *b = tu_read_file(tu_path("out.bin"), &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a), free(b);
    store_close(s);
    /* A run that does not exist is an error, not an empty run. */
    TU_ERR(store_open(tu_path("pub"), "nope", 0, &s), SH_ENOENT, "has no run \"nope\"");
    tu_write_file(tu_path("not-a-store"), "x", 1);
    TU_ERR(store_open(tu_path("not-a-store"), "r1", 0, &s), SH_EINVAL, "not-a-store is a file, not a store's folder");
    TU_ERR(store_open(tu_path("pub"), "../x", 1, &s), SH_EINVAL, "run id \"../x\"");
}

static void write_latest(const char *text)
{
    tu_write_file(tu_path("bad/r1/LATEST"), text, strlen(text));
}

static void test_bad_pointers(void **state)
{
    store *s = fresh("bad");
    synth(tu_path("a.bin"), 5000, 3);
    uint64_t v;
    TU_OK(store_publish(s, tu_path("a.bin"), NULL, &v));
    write_latest("garbage\n");
    TU_ERR(store_latest(s, &v), SH_EFORMAT, "unparsable pointer");
    write_latest("{\"format\":\"shoal-latest/1\",\"run\":\"other\",\"version\":1}\n");
    TU_ERR(store_latest(s, &v), SH_EMISMATCH, "pointer of run \"other\"");
    write_latest("{\"format\":\"shoal-latest/9\",\"run\":\"r1\",\"version\":1}\n");
    TU_ERR(store_latest(s, &v), SH_EFORMAT, "shoal-latest/9");
    write_latest("{\"format\":\"shoal-latest/1\",\"run\":\"r1\",\"version\":7}\n");
    TU_ERR(store_latest(s, &v), SH_ENOENT, "names version 7, but");
    /* Publishing on top of a bad pointer fails and leaves it alone. */
    TU_ERR(store_publish(s, tu_path("a.bin"), NULL, &v), SH_ENOENT, "names version 7");
    write_latest("{\"format\":\"shoal-latest/1\",\"run\":\"r1\",\"version\":1}\n");
    TU_OK(store_latest(s, &v));
    assert_int_equal(v, 1);
    store_close(s);
}

static void test_truncated_and_missing(void **state)
{
    store *s = fresh("trunc");
    synth(tu_path("a.bin"), 150000, 4);
    uint64_t v;
    store_publish_opts o = {1};
    TU_OK(store_publish(s, tu_path("a.bin"), &o, &v));
    TU_OK(store_publish(s, tu_path("a.bin"), &o, &v));
    assert_int_equal(truncate(tu_path("trunc/r1/versions/0000000002/anchor.safetensors"), 1000), 0);
    TU_ERR(store_verify(s, 2), SH_EFORMAT, "has 1000 bytes, its manifest says");
    TU_ERR(store_materialize(s, 2, 0, NULL, tu_path("o2.bin")), SH_EMISMATCH, "does not match");
    assert_false(sh_path_exists(tu_path("o2.bin")));
    unlink(tu_path("trunc/r1/versions/0000000001/manifest.json"));
    TU_ERR(store_get(s, 1, &(store_version){0}, NULL), SH_ENOENT, "manifest.json is missing");
    /* A version never published is named as such, not as a damaged folder. */
    TU_ERR(store_get(s, 9, &(store_version){0}, NULL), SH_ENOENT, "run \"r1\" has no version 9 (LATEST is 2)");
    store_version *list;
    size_t n, broken;
    TU_OK(store_list(s, &list, &n, &broken));
    assert_int_equal(n, 2);
    assert_int_equal(broken, 1);
    free(list);
    /* A manifest of another version in this folder is refused. */
    char *m2 = (char *)tu_read_file(tu_path("trunc/r1/versions/0000000002/manifest.json"), &n);
    tu_write_file(tu_path("trunc/r1/versions/0000000001/manifest.json"), m2, n);
    free(m2);
    TU_ERR(store_get(s, 1, &(store_version){0}, NULL), SH_EMISMATCH, "version 2, but belongs to run");
    store_close(s);
}

/* A hand-made version folder, for plans and gc over delta chains that do
 * not need the codec: they read manifests only. */
static void fake_version(const char *run_dir, uint64_t v, int anchor, size_t size)
{
    char dir[4096], path[4096], text[1024];
    snprintf(dir, sizeof dir, "%s/versions/%010llu", run_dir, (unsigned long long)v);
    TU_OK(sh_mkdir_p(dir, 0755));
    snprintf(path, sizeof path, "%s/%s", dir, anchor ? "anchor.safetensors" : "delta.shd");
    make_file(path, size, (unsigned)v);
    size_t n;
    uint8_t *b = tu_read_file(path, &n);
    char hex[33];
    sh_hash128_hex(sh_hash128_of(b, n), hex);
    free(b);
    int k = snprintf(text, sizeof text,
                     "{\"format\":\"shoal-version/1\",\"run\":\"r1\",\"version\":%llu,\"kind\":\"%s\",%s"
                     "\"file\":\"%s\",\"size\":%zu,\"xxh3\":\"%s\",\"model_size\":1000000,"
                     "\"model_xxh3\":\"%s\",\"created_at\":0}",
                     (unsigned long long)v, anchor ? "anchor" : "delta", anchor ? "" : "\"base\":0,",
                     anchor ? "anchor.safetensors" : "delta.shd", size, hex, hex);
    if (!anchor) {
        char base[64];
        snprintf(base, sizeof base, "\"base\":%llu,", (unsigned long long)v - 1);
        char *at = strstr(text, "\"base\":0,");
        char rest[1024];
        snprintf(rest, sizeof rest, "%s", at + 9);
        snprintf(at, sizeof text - (size_t)(at - text), "%s%s", base, rest);
        k = (int)strlen(text);
    }
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    tu_write_file(path, text, (size_t)k);
}

static void chain_store(const char *name)
{
    sh_rm_rf(tu_path(name));
    char run[4096];
    snprintf(run, sizeof run, "%s/r1", tu_path(name));
    /* 1 anchor (1 MB), 2..4 deltas, 5 anchor, 6..8 deltas (10 kB each). */
    for (uint64_t v = 1; v <= 8; v++) fake_version(run, v, v == 1 || v == 5, v == 1 || v == 5 ? 1000000 : 10000);
    char latest[4096], text[128];
    snprintf(latest, sizeof latest, "%s/LATEST", run);
    int k = snprintf(text, sizeof text, "{\"format\":\"shoal-latest/1\",\"run\":\"r1\",\"version\":8}\n");
    tu_write_file(latest, text, (size_t)k);
}

static void test_plan(void **state)
{
    chain_store("plan");
    store *s;
    TU_OK(store_open(tu_path("plan"), "r1", 0, &s));
    store_plan *p = malloc(sizeof *p);
    TU_OK(store_plan_make(s, 6, 8, p));
    assert_int_equal(p->kind, STORE_PLAN_CHAIN);
    assert_int_equal(p->bytes, 20000);
    assert_int_equal(p->nsteps, 2);
    assert_int_equal(p->steps[0], 7);
    assert_int_equal(p->steps[1], 8);
    /* From before the anchor: the anchor and the deltas after it. */
    TU_OK(store_plan_make(s, 3, 8, p));
    assert_int_equal(p->kind, STORE_PLAN_ANCHOR);
    assert_int_equal(p->anchor, 5);
    assert_int_equal(p->bytes, 1030000);
    assert_int_equal(p->nsteps, 3);
    TU_OK(store_plan_make(s, 0, 4, p));
    assert_int_equal(p->kind, STORE_PLAN_ANCHOR);
    assert_int_equal(p->anchor, 1);
    TU_OK(store_plan_make(s, 8, 8, p));
    assert_int_equal(p->kind, STORE_PLAN_NONE);
    /* A squashed delta in the store beats the chain when smaller. */
    char sq[4096];
    TU_OK(store_squash_path(s, 5, 8, sq, sizeof sq));
    TU_OK(sh_mkdir_p(tu_path("plan/r1/squash"), 0755));
    make_file(sq, 12000, 9);
    TU_OK(store_plan_make(s, 5, 8, p));
    assert_int_equal(p->kind, STORE_PLAN_SQUASH);
    assert_int_equal(p->bytes, 12000);
    assert_int_equal(p->chain_bytes, 30000);
    /* A chain with a hole is an error naming the hole. */
    sh_rm_rf(tu_path("plan/r1/versions/0000000006"));
    TU_ERR(store_plan_make(s, 0, 8, p), SH_ENOENT, "version 8 chains back to version 6");
    free(p);
    store_close(s);
}

static void test_gc_keeps_chains(void **state)
{
    chain_store("gc");
    store *s;
    TU_OK(store_open(tu_path("gc"), "r1", 0, &s));
    uint64_t removed;
    TU_ERR(store_gc(s, 0, &removed), SH_EINVAL, "at least 1");
    /* Keeping 2 (7, 8) keeps their anchor 5 and delta 6: 1..4 go. */
    TU_OK(store_gc(s, 2, &removed));
    assert_int_equal(removed, 4);
    store_version *list;
    size_t n, broken;
    TU_OK(store_list(s, &list, &n, &broken));
    assert_int_equal(n, 4);
    assert_int_equal(list[0].version, 5);
    assert_int_equal(list[3].version, 8);
    free(list);
    TU_OK(store_gc(s, 2, &removed));
    assert_int_equal(removed, 0);
    /* A kept version whose chain is broken stops gc before it deletes. */
    sh_rm_rf(tu_path("gc/r1/versions/0000000006"));
    TU_ERR(store_gc(s, 1, &removed), SH_ENOENT, "gc keeps version 8");
    TU_OK(store_list(s, &list, &n, &broken));
    assert_int_equal(n, 3);
    free(list);
    store_close(s);
}

static void test_crash_leftovers(void **state)
{
    store *s = fresh("crash");
    synth(tu_path("a.bin"), 4000, 5);
    uint64_t v;
    TU_OK(store_publish(s, tu_path("a.bin"), NULL, &v));
    /* A publish that died after renaming its folder but before LATEST: the
     * folder is above LATEST, so nothing names it and the next publish
     * replaces it. */
    TU_OK(sh_mkdir_p(tu_path("crash/r1/versions/0000000002"), 0755));
    tu_write_file(tu_path("crash/r1/versions/0000000002/junk"), "x", 1);
    TU_OK(sh_mkdir_p(tu_path("crash/r1/staging/0000000002.999999"), 0755));
    TU_OK(store_latest(s, &v));
    assert_int_equal(v, 1);
    TU_OK(store_publish(s, tu_path("a.bin"), &(store_publish_opts){1}, &v));
    assert_int_equal(v, 2);
    assert_false(sh_path_exists(tu_path("crash/r1/versions/0000000002/junk")));
    TU_OK(store_verify(s, 2));
    uint64_t removed;
    TU_OK(store_gc(s, 5, &removed));
    assert_false(sh_path_exists(tu_path("crash/r1/staging/0000000002.999999")));
    store_close(s);
}

/* ENOSPC for real: a 1 MiB tmpfs.  The publish fails with a message naming
 * the disk, LATEST still names the old version, and no partial folder is
 * left behind. */
static void test_enospc(void **state)
{
    const char *mnt = tu_path("tiny");
    TU_OK(sh_mkdir_p(mnt, 0755));
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") != 0) {
        fprintf(stderr, "cannot mount a tmpfs (%s): skipping the ENOSPC test\n", strerror(errno));
        skip();
    }
    store *s;
    char root[4096];
    snprintf(root, sizeof root, "%s/store", mnt);
    int ok = store_open(root, "r1", 1, &s) == 0;
    synth(tu_path("small.bin"), 50000, 6);
    synth(tu_path("big.bin"), 1500000, 7);
    uint64_t v = 0, latest = 0;
    int rc1 = ok ? store_publish(s, tu_path("small.bin"), NULL, &v) : -1;
    int rc2 = ok ? store_publish(s, tu_path("big.bin"), NULL, &v) : -1;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sh_errmsg());
    int rc3 = ok ? store_latest(s, &latest) : -1;
    char stage[4096];
    snprintf(stage, sizeof stage, "%s/r1/versions/0000000002", root);
    int leftover = sh_path_exists(stage);
    if (ok) store_close(s);
    umount(mnt);
    assert_true(ok);
    assert_int_equal(rc1, 0);
    assert_int_equal(rc2, SH_ENOSPC);
    assert_non_null(strstr(msg, "No space left on device"));
    assert_non_null(strstr(msg, "LATEST still names version 1"));
    assert_int_equal(rc3, 0);
    assert_int_equal(latest, 1);
    assert_false(leftover);
}

/* Real deltas from the codec: publish computes them, materialise and a
 * squashed delta rebuild the exact checkpoint, anchors come every N. */
static void test_deltas_and_squash(void **state)
{
    char p[5][64];
    for (int i = 0; i < 5; i++) {
        snprintf(p[i], sizeof p[i], "d%d.st", i + 1);
        if (i == 0) TU_OK(ckpt_synth(tu_path(p[0]), 200000, 21));
        else TU_OK(ckpt_step(tu_path(p[i - 1]), tu_path(p[i]), 3e-6, 1, (uint64_t)i));
    }
    store *s = fresh("deltas");
    uint64_t v;
    for (int i = 0; i < 5; i++) TU_OK(store_publish(s, tu_path(p[i]), NULL, &v));
    store_version m;
    TU_OK(store_get(s, 1, &m, NULL));
    assert_true(m.anchor);
    for (uint64_t k = 2; k <= 5; k++) {
        TU_OK(store_get(s, k, &m, NULL));
        assert_false(m.anchor);
        assert_int_equal(m.base, k - 1);
        assert_true(m.size * 10 < m.model_size);
        TU_OK(store_verify(s, k));
    }
    TU_OK(store_materialize(s, 5, 0, NULL, tu_path("m5.st")));
    tu_assert_same_file(tu_path("m5.st"), tu_path(p[4]));
    uint64_t bytes;
    TU_ERR(store_squash(s, 1, 2, &bytes), SH_EINVAL, "at least two deltas");
    TU_OK(store_squash(s, 1, 5, &bytes));
    store_plan *pl = malloc(sizeof *pl);
    TU_OK(store_plan_make(s, 1, 5, pl));
    assert_int_equal(pl->kind, STORE_PLAN_SQUASH);
    assert_int_equal(pl->bytes, bytes);
    assert_true(pl->squash_bytes < pl->chain_bytes);
    free(pl);
    TU_OK(store_materialize(s, 5, 1, tu_path(p[0]), tu_path("s5.st")));
    tu_assert_same_file(tu_path("s5.st"), tu_path(p[4]));
    /* gc keeps the chain back to the anchor, and the squash from it. */
    uint64_t removed;
    TU_OK(store_gc(s, 1, &removed));
    assert_int_equal(removed, 0);
    store_close(s);
    /* --anchor-every 2: anchor, delta, anchor, delta, anchor. */
    s = fresh("every2");
    store_publish_opts o = {2};
    for (int i = 0; i < 5; i++) {
        TU_OK(store_publish(s, tu_path(p[i]), &o, &v));
        TU_OK(store_get(s, v, &m, NULL));
        assert_int_equal(m.anchor, i % 2 == 0);
    }
    store_close(s);
}

static void test_cli(void **state)
{
    char *out;
    synth(tu_path("c.bin"), 10000, 8);
    make_file(tu_path("junk.bin"), 1000, 9);
    sh_rm_rf(tu_path("cli"));
    assert_int_equal(tu_run(&out, "%s store publish %s %s --json", tu_shoal(), tu_path("cli"), tu_path("c.bin")), 0);
    assert_non_null(strstr(out, "\"version\":1"));
    free(out);
    assert_int_equal(tu_run(&out, "%s store ls %s --json", tu_shoal(), tu_path("cli")), 0);
    assert_non_null(strstr(out, "\"latest\":1"));
    free(out);
    assert_int_equal(tu_run(&out, "%s store gc %s", tu_shoal(), tu_path("cli")), 2);
    assert_non_null(strstr(out, "--keep K is required"));
    free(out);
    assert_int_equal(tu_run(&out, "%s store ls %s --run zz", tu_shoal(), tu_path("cli")), 1);
    assert_non_null(strstr(out, "has no run \"zz\""));
    free(out);
    assert_int_equal(tu_run(&out, "%s store publish %s %s", tu_shoal(), tu_path("cli"), tu_path("none.bin")), 1);
    assert_non_null(strstr(out, "none.bin does not exist"));
    free(out);
    assert_int_equal(tu_run(&out, "%s store publish %s %s", tu_shoal(), tu_path("cli"), tu_path("junk.bin")), 1);
    assert_non_null(strstr(out, "junk.bin"));
    free(out);
}

/* A delta publish stages only its delta: it diffs against the anchor's
 * payload, or against the head cache (the previous checkpoint, hard-linked
 * at its publish); a cache that no longer holds that version is rebuilt. */
static void test_delta_publish_head_cache(void **state)
{
    store *s = fresh("head");
    const char *p[4] = {"h1.st", "h2.st", "h3.st", "h4.st"};
    for (int i = 0; i < 4; i++) {
        char src[4200];
        snprintf(src, sizeof src, "%s", tu_path(p[i]));
        if (i == 0) TU_OK(ckpt_family_write("qwen2.5-1.5b", &(ckpt_family_opts){.layers = 1, .shrink = 8,
                                                .vocab = 4096, .seed = 7}, src, NULL));
        else {
            char prev[4200];
            snprintf(prev, sizeof prev, "%s", tu_path(p[i - 1]));
            TU_OK(ckpt_family_next(prev, src, &(ckpt_train_opts){.lr = 1e-5, .seed = (uint64_t)i}, NULL));
        }
    }
    store_publish_opts o = {8};
    uint64_t v;
    char head[4200], meta[4200], *text;
    size_t len;
    snprintf(head, sizeof head, "%s/r1/cache/head.safetensors", tu_path("head"));
    snprintf(meta, sizeof meta, "%s/r1/cache/head.json", tu_path("head"));
    TU_OK(store_publish(s, tu_path(p[0]), &o, &v));
    TU_OK(store_publish(s, tu_path(p[1]), &o, &v)); /* against the anchor's payload */
    assert_int_equal(v, 2);
    TU_OK(sh_read_file(meta, 4096, &text, &len));
    assert_non_null(strstr(text, "\"version\":2"));
    free(text);
    struct stat a, b;
    assert_int_equal(stat(head, &a), 0);
    assert_int_equal(stat(tu_path(p[1]), &b), 0);
    assert_int_equal(a.st_ino, b.st_ino); /* a link, not a copy */
    TU_OK(store_publish(s, tu_path(p[2]), &o, &v)); /* against the cache */
    /* Replace the cache with other bytes: the next publish must notice. */
    unlink(head);
    assert_int_equal(tu_run(NULL, "cp %s %s", tu_path(p[0]), head), 0);
    TU_OK(sh_read_file(meta, 4096, &text, &len));
    free(text);
    TU_OK(store_publish(s, tu_path(p[3]), &o, &v));
    assert_int_equal(v, 4);
    for (uint64_t k = 2; k <= 4; k++) {
        store_version m;
        TU_OK(store_get(s, k, &m, NULL));
        assert_false(m.anchor);
        TU_OK(store_materialize(s, k, 0, NULL, tu_path("head.out")));
        tu_assert_same_file(tu_path("head.out"), tu_path(p[k - 1]));
    }
    store_close(s);
}

/* A sharded folder with its index publishes as the single file holding its
 * tensors (anchor, then deltas: the head cache is patched in place), through
 * the library and the command line. */
static void test_publish_folder(void **state)
{
    store *s = fresh("fold");
    const char *p[3] = {"f1", "f2", "f3"};
    ckpt_family_opts fo = {.layers = 1, .experts = 4, .shrink = 8, .vocab = 4096, .shards = 3, .seed = 9};
    TU_OK(ckpt_family_write("qwen3-30b-a3b", &fo, tu_path(p[0]), NULL));
    for (int i = 1; i < 3; i++) {
        char prev[4200], cur[4200];
        snprintf(prev, sizeof prev, "%s", tu_path(p[i - 1]));
        snprintf(cur, sizeof cur, "%s", tu_path(p[i]));
        TU_OK(ckpt_family_next(prev, cur, &(ckpt_train_opts){.lr = 1e-5, .seed = (uint64_t)i}, NULL));
    }
    store_publish_opts o = {8};
    uint64_t v;
    TU_OK(store_publish(s, tu_path(p[0]), &o, &v));
    TU_OK(store_publish(s, tu_path(p[1]), &o, &v));
    char *out;
    assert_int_equal(tu_run(&out, "%s store publish %s %s --run r1", tu_shoal(), tu_path("fold"),
                            tu_path(p[2])), 0);
    free(out);
    for (uint64_t k = 1; k <= 3; k++) {
        store_version m;
        TU_OK(store_get(s, k, &m, NULL));
        assert_int_equal(m.anchor, k == 1);
        TU_OK(store_materialize(s, k, 0, NULL, tu_path("fold.out")));
        ckpt *f, *one;
        TU_OK(ckpt_open(tu_path(p[k - 1]), &f));
        TU_OK(ckpt_open(tu_path("fold.out"), &one));
        assert_true(f->is_folder && !one->is_folder);
        assert_int_equal(f->ntensors, one->ntensors);
        for (size_t i = 0; i < f->ntensors; i++) {
            const ckpt_tensor *a = &f->tensors[i], *b = ckpt_find(one, a->name);
            assert_non_null(b);
            assert_int_equal(a->nbytes, b->nbytes);
            assert_int_equal(memcmp(a->data, b->data, a->nbytes), 0);
        }
        ckpt_close(one);
        ckpt_close(f);
    }
    store_close(s);
}

/* `shoal store publish` draws a progress bar on a terminal, for an anchor
 * (a copy) and a delta alike, while it works (an "eta" draw before the
 * last); none with --json or when stderr is not a terminal. */
static void test_publish_progress(void **state)
{
    synth(tu_path("pg1.st"), 4000000, 12); /* 16 MB: several copy blocks */
    TU_OK(ckpt_step(tu_path("pg1.st"), tu_path("pg2.st"), 1e-4, 1, 13));
    sh_rm_rf(tu_path("pg"));
    char *out;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(tu_run_tty(&out, "%s store publish %s %s", tu_shoal(), tu_path("pg"), tu_path(k ? "pg2.st" : "pg1.st")),
                         0);
        if (!strstr(out, "store publish [") || !strstr(out, "100%") || !strstr(out, " eta "))
            fail_msg("no progress bar for the %s on a terminal:\n%s", k ? "delta" : "anchor", out);
        assert_non_null(strstr(out, k ? "version 2: delta" : "version 1: anchor"));
        free(out);
    }
    assert_int_equal(tu_run_tty(&out, "%s store publish %s %s --json", tu_shoal(), tu_path("pg"), tu_path("pg1.st")), 0);
    assert_null(strstr(out, "store publish ["));
    assert_non_null(strstr(out, "\"version\":3"));
    free(out);
    assert_int_equal(tu_run(&out, "%s store publish %s %s", tu_shoal(), tu_path("pg"), tu_path("pg2.st")), 0);
    assert_null(strstr(out, "store publish ["));
    assert_non_null(strstr(out, "version 4"));
    free(out);
}

/* `shoal replica` writes a time as ISO 8601 UTC in its text as in its
 * --json (was: seconds since the epoch in the text). */
static void test_replica_times(void **state)
{
    synth(tu_path("rt.st"), 10000, 14);
    sh_rm_rf(tu_path("rt"));
    char *out;
    assert_int_equal(tu_run(&out, "%s store publish %s %s --json", tu_shoal(), tu_path("rt"), tu_path("rt.st")), 0);
    free(out);
    regex_t iso;
    assert_int_equal(regcomp(&iso, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6}Z$", REG_EXTENDED), 0);
    for (int json = 0; json < 2; json++) {
        const char *dir = tu_path(json ? "rt-json" : "rt-text");
        sh_rm_rf(dir);
        assert_int_equal(tu_run(&out, "%s replica --dir %s --store %s --until 1 --seconds 30%s 2>/dev/null", tu_shoal(), dir,
                                tu_path("rt"), json ? " --json" : ""),
                         0);
        char at[64] = "";
        if (json) {
            json_t *j = json_loads(out, 0, NULL);
            snprintf(at, sizeof at, "%s", json_string_value(json_object_get(j, "activated_at")) ?: "");
            json_decref(j);
        } else {
            const char *l = strstr(out, "activated version 1 at ");
            if (l) sscanf(l + 23, "%63s", at);
        }
        if (regexec(&iso, at, 0, NULL, 0)) fail_msg("replica%s: the time is not ISO 8601 UTC: %s", json ? " --json" : "", out);
        free(out);
    }
    regfree(&iso);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_publish_and_latest), cmocka_unit_test(test_bad_pointers),
        cmocka_unit_test(test_truncated_and_missing), cmocka_unit_test(test_plan),
        cmocka_unit_test(test_gc_keeps_chains), cmocka_unit_test(test_crash_leftovers),
        cmocka_unit_test(test_enospc), cmocka_unit_test(test_deltas_and_squash),
        cmocka_unit_test(test_cli),                   cmocka_unit_test(test_delta_publish_head_cache),
        cmocka_unit_test(test_publish_folder),        cmocka_unit_test(test_publish_progress), cmocka_unit_test(test_replica_times),
    };
    return cmocka_run_group_tests_name("store", tests, NULL, NULL);
}
