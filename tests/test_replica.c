/* The replica state machine through its library API and its command. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shoal/ckpt.h"
#include "shoal/delta.h"
#include "shoal/store.h"

typedef struct calls {
    int before, after;
    uint64_t last_from, last_to, last_after;
} calls;

static void before(void *arg, uint64_t from, uint64_t to)
{
    calls *c = arg;
    c->before++, c->last_from = from, c->last_to = to;
}

static void after(void *arg, uint64_t v, double at)
{
    calls *c = arg;
    c->after++, c->last_after = v;
}

static store *st;

/* v1 synthetic, each next version one Adam step on the previous. */
static void make_versions(int n)
{
    char prev[4096], cur[4096];
    for (int v = 1; v <= n; v++) {
        snprintf(cur, sizeof cur, "%s/v%d.st", tu_tmpdir(), v);
        if (v == 1) TU_OK(ckpt_synth(cur, 200000, 11));
        else TU_OK(ckpt_step(prev, cur, 1e-4, 1, (uint64_t)v));
        snprintf(prev, sizeof prev, "%s", cur);
    }
}

static uint64_t publish_v(int v)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/v%d.st", tu_tmpdir(), v);
    uint64_t got;
    store_publish_opts o = {8};
    TU_OK(store_publish(st, p, &o, &got));
    return got;
}

static int setup(void **state)
{
    make_versions(5);
    sh_rm_rf(tu_path("store"));
    if (store_open(tu_path("store"), NULL, 1, &st) < 0) return -1;
    return 0;
}

static int teardown(void **state)
{
    store_close(st);
    return 0;
}

static store_replica *open_replica(calls *c)
{
    store_replica_config cfg = {0};
    cfg.dir = tu_path("rep");
    cfg.store = tu_path("store");
    cfg.poll_s = 0.01;
    cfg.before_activate = before;
    cfg.after_activate = after;
    cfg.arg = c;
    store_replica *r;
    TU_OK(store_replica_open(&cfg, &r));
    return r;
}

static void test_lease_constraints_callbacks(void **state)
{
    assert_int_equal(publish_v(1), 1);
    sh_rm_rf(tu_path("rep"));
    calls c = {0};
    store_replica *r = open_replica(&c);
    TU_OK(store_replica_wait(r, 1, 30));
    store_lease l1;
    TU_OK(store_replica_acquire(r, 1, 0, &l1));
    assert_int_equal(l1.version, 1);
    const ckpt_tensor *t;
    const char *name = l1.ckpt->tensors[0].name;
    TU_OK(store_lease_tensor(&l1, name, &t));
    assert_true(t->nbytes > 0);
    TU_ERR(store_lease_tensor(&l1, "no.such.tensor", &t), SH_ENOENT, "not in version 1");
    /* A new version activates while the lease still runs on the old one. */
    assert_int_equal(publish_v(2), 2);
    TU_OK(store_replica_wait(r, 2, 30));
    size_t n1;
    uint8_t *v1 = tu_read_file(tu_path("v1.st"), &n1);
    assert_int_equal(l1.size, n1);
    assert_memory_equal(l1.data, v1, n1);
    free(v1);
    /* The result reports the version at start (1) and at end (2). */
    assert_int_equal(store_replica_release(r, &l1), 2);
    store_lease l;
    TU_ERR(store_replica_acquire(r, 0, 1, &l), SH_EAGAIN, "needs exactly version 1");
    TU_ERR(store_replica_acquire(r, 3, 0, &l), SH_EAGAIN, "needs at least version 3");
    TU_OK(store_replica_acquire(r, 2, 2, &l));
    size_t n2;
    uint8_t *v2 = tu_read_file(tu_path("v2.st"), &n2);
    assert_int_equal(l.size, n2);
    assert_memory_equal(l.data, v2, n2);
    free(v2);
    store_replica_release(r, &l);
    TU_ERR(store_replica_wait(r, 3, 0.2), SH_ETIMEDOUT, "still on version 2");
    assert_int_equal(c.before, 2);
    assert_int_equal(c.after, 2);
    assert_int_equal(c.last_from, 1);
    assert_int_equal(c.last_to, 2);
    assert_int_equal(c.last_after, 2);
    store_replica_info info;
    store_replica_get_info(r, &info);
    assert_int_equal(info.activations, 2);
    assert_true(info.pause_max_ms < 1000);
    store_replica_close(r);
    /* Only the active model is kept on disk. */
    assert_true(sh_path_exists(tu_path("rep/models/0000000002.safetensors")));
    assert_false(sh_path_exists(tu_path("rep/models/0000000001.safetensors")));
}

/* Killed mid-apply: a half-written next model and a staged payload lie
 * around.  The replica comes back on its last good version at once, clears
 * the debris, and converges. */
static void test_restart_mid_apply(void **state)
{
    assert_int_equal(publish_v(3), 3);
    tu_write_file(tu_path("rep/models/0000000003.safetensors"), "half", 4);
    tu_write_file(tu_path("rep/staging/0000000003.payload"), "junk", 4);
    calls c = {0};
    store_replica *r = open_replica(&c);
    uint64_t v0 = store_replica_version(r);
    assert_true(v0 == 2 || v0 == 3);
    assert_false(sh_path_exists(tu_path("rep/staging/0000000003.payload")));
    TU_OK(store_replica_wait(r, 3, 30));
    store_lease l;
    TU_OK(store_replica_acquire(r, 3, 0, &l));
    size_t n3;
    uint8_t *v3 = tu_read_file(tu_path("v3.st"), &n3);
    assert_int_equal(l.size, n3);
    assert_memory_equal(l.data, v3, n3);
    free(v3);
    store_replica_release(r, &l);
    store_replica_close(r);
    /* A damaged active model: the replica starts empty and fetches again. */
    tu_write_file(tu_path("rep/models/0000000003.safetensors"), "torn", 4);
    r = open_replica(&c);
    TU_OK(store_replica_wait(r, 3, 30));
    store_replica_close(r);
}

/* A truncated next version: the replica says why and keeps serving. */
static void test_bad_version_keeps_serving(void **state)
{
    assert_int_equal(publish_v(4), 4);
    assert_int_equal(truncate(tu_path("store/main/versions/0000000004/delta.shd"), 100), 0);
    calls c = {0};
    store_replica *r = open_replica(&c);
    TU_ERR(store_replica_wait(r, 4, 0.5), SH_ETIMEDOUT, "still on version 3");
    store_replica_info info;
    store_replica_get_info(r, &info);
    assert_int_equal(info.version, 3);
    assert_true(info.failures >= 1);
    assert_true(strlen(info.last_error) > 0);
    store_lease l;
    TU_OK(store_replica_acquire(r, 3, 0, &l));
    store_replica_release(r, &l);
    store_replica_close(r);
}

/* --fp8: the serving copy is what quantising the version from scratch gives,
 * and after a delta only the touched blocks were re-quantised. */
static void test_fp8_copy(void **state)
{
    store *s3;
    sh_rm_rf(tu_path("store3"));
    TU_OK(store_open(tu_path("store3"), NULL, 1, &s3));
    uint64_t v;
    TU_OK(store_publish(s3, tu_path("v1.st"), NULL, &v));
    sh_rm_rf(tu_path("rep8"));
    store_replica_config cfg = {0};
    cfg.dir = tu_path("rep8");
    cfg.store = tu_path("store3");
    cfg.poll_s = 0.01;
    cfg.fp8 = 1;
    store_replica *r;
    TU_OK(store_replica_open(&cfg, &r));
    TU_OK(store_replica_wait(r, 1, 30));
    delta_opts o = {0};
    TU_OK(delta_quant_fp8(tu_path("v1.st"), tu_path("ref1.fp8"), NULL, &o, NULL));
    tu_assert_same_file(tu_path("rep8/models/0000000001.fp8.safetensors"), tu_path("ref1.fp8"));
    TU_OK(store_publish(s3, tu_path("v2.st"), NULL, &v));
    TU_OK(store_replica_wait(r, 2, 30));
    store_lease l;
    TU_OK(store_replica_acquire(r, 2, 0, &l));
    assert_non_null(l.fp8);
    store_replica_release(r, &l);
    store_replica_info info;
    store_replica_get_info(r, &info);
    assert_true(info.fp8_blocks > 0);
    TU_OK(delta_quant_fp8(tu_path("v2.st"), tu_path("ref2.fp8"), NULL, &o, NULL));
    tu_assert_same_file(tu_path("rep8/models/0000000002.fp8.safetensors"), tu_path("ref2.fp8"));
    assert_false(sh_path_exists(tu_path("rep8/models/0000000001.fp8.safetensors")));
    store_replica_close(r);
    store_close(s3);
}

static void test_cli_hook(void **state)
{
    sh_rm_rf(tu_path("store2"));
    char *out;
    assert_int_equal(tu_run(&out, "%s store publish %s %s", tu_shoal(), tu_path("store2"), tu_path("v1.st")), 0);
    free(out);
    assert_int_equal(tu_run(&out, "%s store publish %s %s", tu_shoal(), tu_path("store2"), tu_path("v2.st")), 0);
    free(out);
    sh_rm_rf(tu_path("rep2"));
    unlink(tu_path("hook.txt"));
    int rc = tu_run(&out, "%s replica --store %s --dir %s --until 2 --seconds 60 --json "
                    "--on-activate 'echo v$SHOAL_VERSION >> %s' 2>&1",
                    tu_shoal(), tu_path("store2"), tu_path("rep2"), tu_path("hook.txt"));
    if (rc) fail_msg("replica failed: %s", out);
    assert_non_null(strstr(out, "\"version\":2"));
    assert_non_null(strstr(out, "\"activated_at\":\"20"));
    free(out);
    size_t n;
    char *hook = (char *)tu_read_file(tu_path("hook.txt"), &n);
    assert_string_equal(hook, "v2\n");
    free(hook);
    assert_int_equal(tu_run(&out, "%s replica --dir %s", tu_shoal(), tu_path("rep3")), 2);
    assert_non_null(strstr(out, "give --store STORE or --parent"));
    free(out);
    assert_int_equal(tu_run(&out, "%s replica --store %s --dir %s --until 9 --seconds 0.3", tu_shoal(),
                            tu_path("store2"), tu_path("rep2")), 1);
    assert_non_null(strstr(out, "version 9 not reached (have 2)"));
    free(out);
}

/* One replica per directory: a second opener, in this process or from the
 * command line, fails at once naming the directory and the holder's pid,
 * and leaves the first one serving; once the first is closed the directory
 * opens again. */
static void test_second_opener(void **state)
{
    store *s2;
    sh_rm_rf(tu_path("lockstore"));
    sh_rm_rf(tu_path("lockrep"));
    TU_OK(store_open(tu_path("lockstore"), NULL, 1, &s2));
    store_publish_opts o = {8};
    uint64_t v;
    TU_OK(store_publish(s2, tu_path("v1.st"), &o, &v));
    store_replica_config cfg = {0};
    cfg.dir = tu_path("lockrep");
    cfg.store = tu_path("lockstore");
    cfg.poll_s = 0.01;
    store_replica *r, *r2 = NULL;
    TU_OK(store_replica_open(&cfg, &r));
    TU_OK(store_replica_wait(r, 1, 30));
    char want[128];
    snprintf(want, sizeof want, "in use by another replica (process %ld, this one", (long)getpid());
    TU_ERR(store_replica_open(&cfg, &r2), SH_EEXIST, want);
    assert_non_null(strstr(sh_errmsg(), tu_path("lockrep")));
    assert_null(r2);
    char *out;
    double t0 = sh_now_mono();
    int rc = tu_run(&out, "%s replica --store %s --dir %s --seconds 30 2>&1", tu_shoal(), tu_path("lockstore"),
                    tu_path("lockrep"));
    double took = sh_now_mono() - t0;
    if (rc == 0 || !strstr(out, "in use by another replica") || took > 10)
        fail_msg("second replica on one directory: exit %d after %.1fs:\n%s", rc, took, out);
    snprintf(want, sizeof want, "process %ld", (long)getpid());
    assert_non_null(strstr(out, want));
    free(out);
    /* The first replica still follows the store. */
    TU_OK(store_publish(s2, tu_path("v2.st"), &o, &v));
    TU_OK(store_replica_wait(r, 2, 30));
    store_replica_close(r);
    TU_OK(store_replica_open(&cfg, &r2));
    TU_OK(store_replica_wait(r2, 2, 30));
    store_replica_close(r2);
    store_close(s2);
}

/* Publishing from memory: the trainer's own deltas become the payloads (an
 * anchor every 3), every version rebuilds to its image, and a wrong base or
 * a broken delta leaves LATEST where it was with nothing staged. */
static void test_publish_mem(void **state)
{
    store *m;
    sh_rm_rf(tu_path("memstore"));
    TU_OK(store_open(tu_path("memstore"), NULL, 1, &m));
    store_publish_opts o = {3};
    uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (int v = 1; v <= 5; v++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/v%d.st", tu_tmpdir(), v);
        size_t len;
        uint8_t *img = tu_read_file(p, &len);
        sh_buf d = {0};
        if (prev) {
            ckpt *a, *b;
            TU_OK(ckpt_open_mem(prev, prev_len, "prev", &a));
            TU_OK(ckpt_open_mem(img, len, "next", &b));
            delta_opts dop = {.threads = 1};
            TU_OK(delta_make_mem(a, b, &dop, &d, NULL));
            ckpt_close(a), ckpt_close(b);
        }
        store_mem_version in = {img, len, d.data, d.len, (uint64_t)v - 1};
        if (v == 3) { /* a wrong base and a broken delta change nothing */
            in.base = 1;
            uint64_t got = 0;
            TU_ERR(store_publish_mem(m, &in, &o, &got), SH_EMISMATCH, "LATEST names 2");
            in.base = 2;
            uint8_t junk[64] = {1, 2, 3};
            store_mem_version bad = in;
            bad.delta = junk, bad.delta_len = sizeof junk;
            assert_true(store_publish_mem(m, &bad, &o, &got) < 0);
            uint64_t latest;
            TU_OK(store_latest(m, &latest));
            assert_int_equal(latest, 2);
        }
        uint64_t got;
        TU_OK(store_publish_mem(m, &in, &o, &got));
        assert_int_equal(got, (uint64_t)v);
        store_version sv;
        TU_OK(store_get(m, got, &sv, NULL));
        assert_int_equal(sv.anchor, v == 1 || v == 4);
        assert_int_equal(sv.size, sv.anchor ? len : d.len);
        assert_int_equal(sv.model_size, len);
        TU_OK(store_verify(m, got));
        const char *out = tu_path("memout.st");
        TU_OK(store_materialize(m, got, 0, NULL, out));
        tu_assert_same_file(out, p);
        sh_buf_free(&d);
        free(prev);
        prev = img, prev_len = len;
    }
    free(prev);
    char *ls = NULL;
    assert_int_equal(tu_run(&ls, "ls -A %s/main/staging", tu_path("memstore")), 0);
    assert_string_equal(ls, ""); /* nothing staged is left */
    free(ls);
    store_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lease_constraints_callbacks),
        cmocka_unit_test(test_restart_mid_apply),
        cmocka_unit_test(test_bad_version_keeps_serving),
        cmocka_unit_test(test_fp8_copy),
        cmocka_unit_test(test_cli_hook),
        cmocka_unit_test(test_publish_mem),
        cmocka_unit_test(test_second_opener),
    };
    return cmocka_run_group_tests_name("replica", tests, setup, teardown);
}
