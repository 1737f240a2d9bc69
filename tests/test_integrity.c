/* Every integrity check, broken on its own: each test feeds one kind of bad
 * bytes past every other check and asserts that the one check meant for it
 * refuses them (tests/mutants.txt names the mutant each test kills).
 *
 * Stores and replicas are real folders; the push root is a real `shoal push
 * serve` over UCX on loopback; the codec checks run on real deltas made by
 * the encoder, with the fields past the file checksum edited in memory (as
 * a delta that passed its checksum but was made wrong would be). */
#include "testutil.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "weights/delta/delta_int.h"
#include "control/sched/query_int.h"
#include "shoal/bcast.h"
#include "shoal/ckpt.h"
#include "shoal/delta.h"
#include "shoal/sched.h"
#include "shoal/store.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* Flips one byte in the middle of a file, keeping its size. */
static void flip_byte(const char *path, size_t at)
{
    size_t len;
    uint8_t *b = tu_read_file(path, &len);
    assert_true(at < len);
    b[at] ^= 0x5a;
    tu_write_file(path, b, len);
    free(b);
}

/* The same, in place (same inode): a process that mapped the file sees it. */
static void flip_byte_in_place(const char *path, size_t at)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)at), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
    close(fd);
}

static uint64_t file_size(const char *path)
{
    size_t len;
    free(tu_read_file(path, &len));
    return len;
}

/* ---- Store: anchors and rebuilt models ------------------------------------ */

/* A same-size corrupted anchor: its size matches the manifest, only its xxh3
 * does not.  The store's verify, a materialise and a replica reading the
 * store all refuse it. */
static void test_store_anchor_same_size(void **state)
{
    const char *root = tu_path("anchor-store"), *ck = tu_path("anchor.st");
    sh_rm_rf(root);
    TU_OK(ckpt_synth(ck, 300000, 5));
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    TU_OK(store_publish(s, ck, &(store_publish_opts){.anchor_every = 1}, &v));
    assert_int_equal(v, 1);
    char payload[4096];
    TU_OK(store_payload_path(s, 1, payload, sizeof payload));
    uint64_t size = file_size(payload);
    flip_byte(payload, size - size / 3);
    assert_int_equal(file_size(payload), size);
    TU_ERR(store_verify(s, 1), SH_EMISMATCH, "hashes to");
    const char *out = tu_path("anchor-out.st");
    unlink(out);
    TU_ERR(store_materialize(s, 1, 0, NULL, out), SH_EMISMATCH, "does not match its manifest");
    assert_false(sh_path_exists(out));
    /* A replica on the store never activates it. */
    const char *dir = tu_path("anchor-rep");
    sh_rm_rf(dir);
    store_replica *r;
    store_replica_config cfg = {.dir = dir, .store = root};
    TU_OK(store_replica_open(&cfg, &r));
    assert_int_equal(store_replica_wait(r, 1, 1.0), SH_ETIMEDOUT);
    store_replica_info info;
    store_replica_get_info(r, &info);
    assert_int_equal(info.version, 0);
    assert_true(info.failures >= 1);
    if (!strstr(info.last_error, "does not match")) fail_msg("replica error: %s", info.last_error);
    store_replica_close(r);
    store_close(s);
}

/* A delta version whose rebuilt model is the right size but not the model
 * its manifest names: the materialise check of model_xxh3 refuses it. */
static void test_store_delta_corrupt_model(void **state)
{
    const char *root = tu_path("model-store"), *a = tu_path("model-a.st"), *b = tu_path("model-b.st");
    sh_rm_rf(root);
    TU_OK(ckpt_synth(a, 200000, 7));
    TU_OK(ckpt_step(a, b, 1e-4, 1, 8));
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    TU_OK(store_publish(s, a, NULL, &v));
    TU_OK(store_publish(s, b, NULL, &v));
    store_version m;
    char *text;
    TU_OK(store_get(s, 2, &m, &text));
    assert_false(m.anchor);
    /* Edit one hex digit of model_xxh3 in the manifest. */
    char hex[33];
    sh_hash128_hex(m.model_xxh3, hex);
    char *at = strstr(text, hex);
    assert_non_null(at);
    at[5] = at[5] == '0' ? '1' : '0';
    char man[4096];
    snprintf(man, sizeof man, "%s/main/versions/%010d/manifest.json", root, 2);
    tu_write_file(man, text, strlen(text));
    free(text);
    TU_OK(store_verify(s, 2)); /* the payload itself is intact */
    const char *out = tu_path("model-out.st");
    unlink(out);
    TU_ERR(store_materialize(s, 2, 0, NULL, out), SH_EMISMATCH, "model_xxh3");
    assert_false(sh_path_exists(out));
    store_close(s);
}

/* Manifests are checked before anything is fetched: what a push tree sends
 * is parsed with store_manifest_parse. */
static void test_manifest_rules(void **state)
{
    static const char *h1 = "0123456789abcdef0123456789abcdef", *h2 = "fedcba9876543210fedcba9876543210";
    char m[1024];
    store_version v;
#define MAN(kind, ver, base, file, size, x, msize, mx)                                                \
    snprintf(m, sizeof m,                                                                          \
             "{\"format\":\"shoal-version/1\",\"run\":\"main\",\"version\":%d,\"kind\":\"%s\","    \
             "\"base\":%d,\"file\":\"%s\",\"size\":%d,\"xxh3\":\"%s\",\"model_size\":%d,"         \
             "\"model_xxh3\":\"%s\",\"created_at\":1}",                                            \
             ver, kind, base, file, size, x, msize, mx)
    MAN("anchor", 3, 0, "model.safetensors", 10, h1, 10, h1);
    TU_OK(store_manifest_parse(m, "main", &v));
    assert_int_equal(v.version, 3);
    MAN("delta", 3, 2, "delta.shd", 10, h1, 20, h2);
    TU_OK(store_manifest_parse(m, "main", &v));
    /* An anchor is its model: equal size and equal hash. */
    MAN("anchor", 3, 0, "model.safetensors", 10, h1, 10, h2);
    TU_ERR(store_manifest_parse(m, "main", &v), SH_EFORMAT, "an anchor's payload is its model");
    MAN("anchor", 3, 0, "model.safetensors", 10, h1, 11, h1);
    TU_ERR(store_manifest_parse(m, "main", &v), SH_EFORMAT, "an anchor's payload is its model");
    /* A payload name is a plain name inside the version folder. */
    MAN("anchor", 3, 0, "../../etc/passwd", 10, h1, 10, h1);
    TU_ERR(store_manifest_parse(m, "main", &v), SH_EFORMAT, "must be a plain name");
    MAN("anchor", 3, 0, "", 10, h1, 10, h1);
    TU_ERR(store_manifest_parse(m, "main", &v), SH_EFORMAT, "must be a plain name");
    /* A delta applies to the version before it. */
    MAN("delta", 3, 1, "delta.shd", 10, h1, 20, h2);
    TU_ERR(store_manifest_parse(m, "main", &v), SH_EFORMAT, "base must be 2");
    /* Another run's manifest is refused. */
    MAN("anchor", 3, 0, "model.safetensors", 10, h1, 10, h1);
    TU_ERR(store_manifest_parse(m, "other", &v), SH_EMISMATCH, "belongs to run \"other\"");
#undef MAN
    /* In the store, a manifest must name its own version. */
    const char *root = tu_path("man-store"), *ck = tu_path("man.st");
    sh_rm_rf(root);
    TU_OK(ckpt_synth(ck, 50000, 9));
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t ver;
    TU_OK(store_publish(s, ck, &(store_publish_opts){.anchor_every = 1}, &ver));
    TU_OK(store_publish(s, ck, &(store_publish_opts){.anchor_every = 1}, &ver));
    char p1[4096], p2[4096];
    snprintf(p1, sizeof p1, "%s/main/versions/%010d/manifest.json", root, 1);
    snprintf(p2, sizeof p2, "%s/main/versions/%010d/manifest.json", root, 2);
    size_t len;
    uint8_t *b = tu_read_file(p1, &len);
    tu_write_file(p2, b, len); /* version 2's folder now holds version 1's manifest */
    free(b);
    TU_ERR(store_get(s, 2, &v, NULL), SH_EMISMATCH, "says run \"main\" version 1");
    store_close(s);
}

/* A holder's copy of a version (the have_path of a plan) is checked before
 * it is used as the result: a same-size corrupted copy is refused. */
static void test_store_have_corrupt(void **state)
{
    const char *root = tu_path("have-store"), *ck = tu_path("have.st"), *bad = tu_path("have-bad.st");
    sh_rm_rf(root);
    TU_OK(ckpt_synth(ck, 100000, 13));
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    TU_OK(store_publish(s, ck, NULL, &v));
    size_t len;
    uint8_t *b = tu_read_file(ck, &len);
    tu_write_file(bad, b, len);
    free(b);
    flip_byte(bad, len - 100);
    const char *out = tu_path("have-out.st");
    unlink(out);
    TU_ERR(store_materialize(s, 1, 1, bad, out), SH_EMISMATCH, "model_xxh3");
    assert_false(sh_path_exists(out));
    TU_OK(store_materialize(s, 1, 1, ck, out));
    tu_assert_same_file(out, ck);
    store_close(s);
}

/* Run names become folder names: nothing that climbs out or hides. */
static void test_run_names(void **state)
{
    const char *root = tu_path("names-store");
    static const char *bad[] = {"..", ".", ".hidden", "a/b", "", "x y",
                                "0123456789012345678901234567890123456789012345678901234567890123456789"};
    store *s;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TU_ERR(store_open(root, bad[i], 1, &s), SH_EINVAL, "run id");
    TU_OK(store_open(root, "run-1_a.b", 1, &s));
    store_close(s);
}

/* A replica restarted over a model file that went bad on its disk (same
 * size) does not serve it: it checks the file against ACTIVE's hash and
 * fetches the version again. */
static void test_replica_restore_corrupt(void **state)
{
    const char *root = tu_path("restore-store"), *ck = tu_path("restore.st"), *dir = tu_path("restore-rep");
    sh_rm_rf(root);
    sh_rm_rf(dir);
    TU_OK(ckpt_synth(ck, 100000, 17));
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    TU_OK(store_publish(s, ck, NULL, &v));
    store_close(s);
    store_replica_config cfg = {.dir = dir, .store = root, .poll_s = 0.01};
    store_replica *r;
    TU_OK(store_replica_open(&cfg, &r));
    TU_OK(store_replica_wait(r, 1, 30));
    store_replica_close(r);
    char model[4096];
    snprintf(model, sizeof model, "%s/models/%010d.safetensors", dir, 1);
    size_t len;
    free(tu_read_file(model, &len));
    flip_byte_in_place(model, len - 10);
    int rc = store_replica_open(&cfg, &r);
    if (rc < 0) return; /* refused outright: also safe */
    TU_OK(store_replica_wait(r, 1, 30));
    store_lease l;
    TU_OK(store_replica_acquire(r, 0, 0, &l));
    uint8_t *want = tu_read_file(ck, &len);
    assert_int_equal(l.size, len);
    if (memcmp(l.data, want, len)) fail_msg("the replica serves the corrupted model file after a restart");
    free(want);
    store_replica_release(r, &l);
    store_replica_close(r);
}

/* LATEST names a positive version of its own run, or the store refuses it
 * (never a silent fallback). */
static void test_latest_rules(void **state)
{
    const char *root = tu_path("latest-store");
    sh_rm_rf(root);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    char p[4096];
    snprintf(p, sizeof p, "%s/main/LATEST", root);
    static const struct {
        const char *text, *needle;
        int code;
    } rows[] = {
        {"{\"format\":\"shoal-latest/1\",\"run\":\"main\",\"version\":0}", "is not positive", SH_EFORMAT},
        {"{\"format\":\"shoal-latest/1\",\"run\":\"main\",\"version\":-3}", "is not positive", SH_EFORMAT},
        {"{\"format\":\"shoal-latest/1\",\"run\":\"other\",\"version\":1}", "pointer of run \"other\"", SH_EMISMATCH},
        {"{\"format\":\"shoal-latest/2\",\"run\":\"main\",\"version\":1}", "expected shoal-latest/1", SH_EFORMAT},
        {"{\"format\":\"shoal-latest/1\",\"run\":\"main\",\"version\":7}", "is missing", SH_ENOENT},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        tu_write_file(p, rows[i].text, strlen(rows[i].text));
        uint64_t v = 99;
        TU_ERR(store_latest(s, &v), rows[i].code, rows[i].needle);
    }
    store_close(s);
}

/* ---- Push tree: a root serving a same-size corrupted anchor -------------- */

static pid_t spawn_sh(const char *cmd)
{
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    return pid;
}

static void *root_loop(void *arg)
{
    bcast_node_run(arg, 120);
    return NULL;
}

/* A push root whose copy of an anchor went bad after the store verified it
 * (the root trusts what it loaded): it sums each chunk from the bytes it
 * has, so every chunk checks out at the replica, and only the whole-payload
 * hash against the manifest can refuse it.  A real `shoal replica` must
 * never activate it. */
static void test_push_root_corrupt_anchor(void **state)
{
    const char *root = tu_path("push-store"), *ck = tu_path("push.st"), *dir = tu_path("push-rep");
    sh_rm_rf(root);
    sh_rm_rf(dir);
    TU_OK(ckpt_synth(ck, 400000, 11));
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    TU_OK(store_publish(s, ck, &(store_publish_opts){.anchor_every = 1}, &v));
    char payload[4096], *text;
    store_version m;
    TU_OK(store_get(s, 1, &m, &text));
    TU_OK(store_verify(s, 1));
    TU_OK(store_payload_path(s, 1, payload, sizeof payload));
    store_close(s);
    flip_byte_in_place(payload, m.size / 2 + 12345);
    bcast_config bc = {.name = "root", .accept_children = 1, .chunk_size = 256 << 10};
    bcast_node *n;
    TU_OK(bcast_node_new(&bc, &n));
    TU_OK(bcast_node_add_object(n, text, payload));
    free(text);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, root_loop, n), 0);
    char log[4096], cmd[8192];
    snprintf(log, sizeof log, "%s.log", dir);
    unlink(log);
    snprintf(cmd, sizeof cmd, "exec %s replica --dir %s --parent %s --until 1 --seconds 60 --json >%s 2>&1",
             tu_shoal(), dir, bcast_node_address(n), log);
    pid_t rep = spawn_sh(cmd);
    /* Until the replica refuses the payload (or, wrongly, takes it). */
    int refused = 0, st = 0, exited = 0;
    double end = sh_now_mono() + 60;
    while (!refused && !exited && sh_now_mono() < end) {
        sh_sleep(0.05);
        char *t;
        size_t tl;
        if (sh_read_file(log, 1 << 20, &t, &tl) == SH_OK) {
            refused = strstr(t, "manifest says") != NULL;
            free(t);
        }
        exited = waitpid(rep, &st, WNOHANG) == rep;
    }
    if (!exited) {
        kill(-rep, SIGKILL);
        waitpid(rep, NULL, 0);
    }
    bcast_node_stop(n);
    bcast_node_wake(n);
    pthread_join(th, NULL);
    bcast_node_free(n);
    char *out = NULL;
    size_t tl;
    if (sh_read_file(log, 1 << 20, &out, &tl) < 0) out = strdup("(no log)");
    if (exited && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        fail_msg("the replica reached version 1 from a corrupt root: %s", out);
    if (!refused) fail_msg("the replica did not refuse the payload's hash within 60 s: %s", out);
    free(out);
    char active[4096];
    snprintf(active, sizeof active, "%s/ACTIVE", dir);
    assert_false(sh_path_exists(active));
}

/* ---- Delta codec ------------------------------------------------------------ */

/* Encodes old -> new (nbytes of w-byte units) and checks the encoding. */
static const uint8_t *encode(delta__scratch *sc, unsigned w, const uint8_t *old, const uint8_t *nw,
                             size_t nbytes, int want_enc, size_t *len)
{
    int enc;
    const uint8_t *p;
    uint64_t changed;
    sh_hash128 od, nd;
    TU_OK(delta__encode_chunk(sc, w, 0, old, nw, nbytes, &enc, &p, len, &changed, &od, &nd));
    if (enc != want_enc) fail_msg("encoder chose %d, the test needs %d", enc, want_enc);
    return p;
}

/* A sparse chunk's last change at the last unit is in range; decoded as a
 * chunk one unit shorter, that position is one past its end. */
static void test_sparse_position_at_end(void **state)
{
    delta__scratch sc;
    TU_OK(delta__scratch_init(&sc));
    TU_OK(delta__scratch_enc(&sc));
    for (int many = 0; many < 2; many++) {
        size_t n = 8192, w = 4, nb = n * w;
        uint8_t *old = calloc(nb + 64, 1), *nw = calloc(nb + 64, 1), *out = calloc(nb + 64, 1);
        for (size_t i = 0; i < nb; i++) old[i] = nw[i] = (uint8_t)rnd();
        if (many)
            for (size_t u = 7; u < n; u += 37) nw[u * w] ^= 1;
        nw[(n - 1) * w] ^= 3; /* the last unit */
        size_t len;
        const uint8_t *p = encode(&sc, (unsigned)w, old, nw, nb, DELTA__SPARSE, &len);
        uint8_t *pay = malloc(len);
        memcpy(pay, p, len);
        /* In range: decodes to new. */
        memcpy(out, old, nb);
        TU_OK(delta__decode_chunk(&sc, DELTA__SPARSE, pay, len, (unsigned)w, 0, out, nb, NULL, "t"));
        assert_memory_equal(out, nw, nb);
        /* One unit shorter: the last position is the chunk's end. */
        memcpy(out, old, nb);
        TU_ERR(delta__decode_chunk(&sc, DELTA__SPARSE, pay, len, (unsigned)w, 0, out, nb - w, NULL, "t"),
               SH_EFORMAT, "change position beyond the chunk");
        sh_hash128 bd, od;
        uint64_t applied = 0;
        memcpy(out, old, nb);
        TU_ERR(delta__decode_fused(&sc, DELTA__SPARSE, pay, len, (unsigned)w, 0, out, out, nb - w, &bd, &od,
                                   &applied, "t"),
               SH_EFORMAT, "change position beyond the chunk");
        free(pay), free(old), free(nw), free(out);
    }
    delta__scratch_free(&sc);
}

/* Changes of 128 in 2-byte units, read as 1-byte units: the value 256 is
 * one above what a byte can change by (sparse and dense). */
static void test_sparse_value_out_of_range(void **state)
{
    delta__scratch sc;
    TU_OK(delta__scratch_init(&sc));
    TU_OK(delta__scratch_enc(&sc));
    for (int dense = 0; dense < 2; dense++) {
        size_t n = 8192, nb = 2 * n;
        uint16_t *old = calloc(n + 32, 2), *nw = calloc(n + 32, 2);
        uint8_t *out = calloc(nb + 64, 1);
        for (size_t i = 0; i < n; i++) old[i] = nw[i] = (uint16_t)(rnd() & 0x3fff);
        /* Dense: the out-of-range values only in the first half, which the
         * four-at-a-time loop decodes (the careful tail checks on its own). */
        if (dense)
            for (size_t i = 0; i < n; i++)
                nw[i] = (uint16_t)(old[i] + (i < n / 2 && i % 3 == 0 ? 128 : 1 + rnd() % 3));
        else
            for (size_t i = 5; i < n; i += 29) nw[i] = (uint16_t)(old[i] + 128);
        size_t len;
        const uint8_t *p = encode(&sc, 2, (uint8_t *)old, (uint8_t *)nw, nb, dense ? DELTA__DENSE : DELTA__SPARSE,
                                  &len);
        uint8_t *pay = malloc(len);
        memcpy(pay, p, len);
        memcpy(out, old, nb);
        TU_OK(delta__decode_chunk(&sc, dense ? DELTA__DENSE : DELTA__SPARSE, pay, len, 2, 0, out, nb, NULL, "t"));
        assert_memory_equal(out, nw, nb);
        memcpy(out, old, nb);
        TU_ERR(delta__decode_chunk(&sc, dense ? DELTA__DENSE : DELTA__SPARSE, pay, len, 1, 0, out, nb, NULL, "t"),
               SH_EFORMAT, "out of range");
        if (dense) {
            /* The first batch alone (the four-at-a-time loop) refuses it. */
            delta__dec dd;
            TU_OK(delta__dec_open(&dd, DELTA__DENSE, pay, len, nb, 1, &sc, "t"));
            uint32_t pos[512];
            uint64_t z[512];
            size_t got = 0;
            TU_ERR(delta__dec_next(&dd, pos, z, 512, &got), SH_EFORMAT, "out of range");
        }
        free(pay), free(old), free(nw), free(out);
    }
    delta__scratch_free(&sc);
}

/* A sparse chunk claims more changes than its chunk has units. */
static void test_sparse_count_beyond_chunk(void **state)
{
    delta__scratch sc;
    TU_OK(delta__scratch_init(&sc));
    TU_OK(delta__scratch_enc(&sc));
    size_t n = 8192, w = 4, nb = n * w;
    uint8_t *old = calloc(nb, 1), *nw = calloc(nb, 1), *out = calloc(nb, 1);
    for (size_t i = 0; i < nb; i++) old[i] = nw[i] = (uint8_t)rnd();
    for (size_t u = 0; u < 200; u++) nw[u * 40 * w] ^= 1;
    size_t len;
    const uint8_t *p = encode(&sc, (unsigned)w, old, nw, nb, DELTA__SPARSE, &len);
    /* 200 changes in a chunk of 100 units. */
    TU_ERR(delta__decode_chunk(&sc, DELTA__SPARSE, p, len, (unsigned)w, 0, out, 100 * w, NULL, "t"), SH_EFORMAT,
           "200 changes in a chunk of 100 units");
    free(old), free(nw), free(out);
    delta__scratch_free(&sc);
}

/* Tensors whose chunks take every encoding: sparse changes, small changes
 * everywhere (DENSE), new random bytes (RAW), new compressible bytes over
 * random ones (ZSTD), and an unchanged tensor (SAME). */
typedef struct {
    uint8_t *base, *target; /* file images */
    size_t len;
    sh_buf delta;
} five;

static void make_five(five *f, const char *tag)
{
    enum { NT = 5 };
    static const char *names[NT] = {"a.sparse", "b.dense", "c.raw", "d.zstd", "e.same"};
    size_t n = CKPT_CHUNK / 4 + 3000; /* units of 4 bytes: a whole chunk and a 12 kB tail */
    uint8_t *bd[NT], *td[NT];
    ckpt_tensor bt[NT], tt[NT];
    for (int i = 0; i < NT; i++) {
        bd[i] = malloc(4 * n), td[i] = malloc(4 * n);
        uint32_t *b = (uint32_t *)bd[i], *t = (uint32_t *)td[i];
        for (size_t k = 0; k < n; k++) b[k] = (uint32_t)rnd();
        for (size_t k = 0; k < n; k++) {
            switch (i) {
            case 0: t[k] = b[k] + (k % 97 == 0); break;
            case 1: t[k] = b[k] + 1 + (uint32_t)(rnd() % 3); break;
            case 2: t[k] = (uint32_t)rnd(); break;
            case 3: t[k] = (uint32_t)(k / 64); break;
            default: t[k] = b[k];
            }
        }
        bt[i] = (ckpt_tensor){.name = names[i], .dtype = CKPT_I32, .ndim = 1, .shape = {(int64_t)n}, .data = bd[i]};
        tt[i] = bt[i];
        tt[i].data = td[i];
    }
    char pb[256], pt[256];
    snprintf(pb, sizeof pb, "%s-base.st", tag);
    snprintf(pt, sizeof pt, "%s-target.st", tag);
    json_t *meta = json_pack("{s:s}", "note", "abcdefgh");
    TU_OK(ckpt_save(tu_path(pb), bt, NT, meta));
    TU_OK(ckpt_save(tu_path(pt), tt, NT, meta));
    json_decref(meta);
    for (int i = 0; i < NT; i++) free(bd[i]), free(td[i]);
    ckpt *B, *T;
    TU_OK(ckpt_open(tu_path(pb), &B));
    TU_OK(ckpt_open(tu_path(pt), &T));
    memset(&f->delta, 0, sizeof f->delta);
    delta_stats st;
    TU_OK(delta_make_mem(B, T, &(delta_opts){.threads = 1}, &f->delta, &st));
    for (int e = DELTA__SAME; e <= DELTA__ZSTD; e++)
        if (!st.chunks[e]) fail_msg("the test delta has no chunk of encoding %d", e);
    ckpt_close(B);
    ckpt_close(T);
    size_t lt;
    f->base = tu_read_file(tu_path(pb), &f->len);
    f->target = tu_read_file(tu_path(pt), &lt);
    assert_int_equal(lt, f->len);
}

static void free_five(five *f)
{
    free(f->base), free(f->target);
    sh_buf_free(&f->delta);
}

/* The tensor of the given name in the delta. */
static delta__tensor *dtensor(delta *d, const char *name)
{
    for (size_t i = 0; i < d->ntensors; i++)
        if (!strcmp(d->tensors[i].name, name)) return &d->tensors[i];
    fail_msg("no tensor %s in the delta", name);
    return NULL;
}

/* In-place applies that fail after chunks of every encoding were written:
 * (1) the last tensor's digest is wrong, so everything is applied and then
 * undone; (2) a corrupt DENSE, RAW or ZSTD chunk fails mid-way.  Each time
 * the image must be the base again, byte for byte. */
static void test_inplace_failures(void **state)
{
    five f;
    make_five(&f, "ip");
    uint8_t *img = malloc(f.len);
    delta *d;
    /* Intact: the image becomes the target. */
    memcpy(img, f.base, f.len);
    TU_OK(delta_parse(f.delta.data, f.delta.len, 0, &d));
    TU_OK(delta_apply_mem_inplace(img, f.len, d, &(delta_opts){.threads = 1}));
    assert_memory_equal(img, f.target, f.len);
    delta_free(d);
    /* (1) Every chunk written, then a tensor's digest refuses the result. */
    static const char *last[] = {"e.same", "a.sparse", "d.zstd"};
    for (int k = 0; k < 3; k++)
        for (int threads = 1; threads <= 2; threads++) {
            TU_OK(delta_parse(f.delta.data, f.delta.len, 0, &d));
            dtensor(d, last[k])->digest.lo ^= 1;
            memcpy(img, f.base, f.len);
            TU_ERR(delta_apply_mem_inplace(img, f.len, d, &(delta_opts){.threads = threads}), SH_EMISMATCH,
                   "does not match");
            if (memcmp(img, f.base, f.len)) fail_msg("digest of %s wrong: the image is not the base after the undo", last[k]);
            delta_free(d);
        }
    /* (2) One corrupt chunk of each encoding, after the others were applied
     * (threads = 1 applies in order; the corrupt chunk is the last of its
     * tensor). */
    static const char *bad[] = {"b.dense", "c.raw", "d.zstd"};
    for (int k = 0; k < 3; k++) {
        uint8_t *copy = malloc(f.delta.len);
        memcpy(copy, f.delta.data, f.delta.len);
        TU_OK(delta_parse(copy, f.delta.len, DELTA_NO_CHECKSUM, &d));
        delta__tensor *t = dtensor(d, bad[k]);
        const delta__chunk *c = &t->chunks[t->nchunks - 1];
        assert_true(c->len > 8);
        /* A byte in the chunk's payload; for RAW the digest catches it, for
         * DENSE and ZSTD the decoder or the digest. */
        uint8_t *pl = (uint8_t *)d->payload + c->off;
        pl[c->len / 2] ^= 0x41;
        pl[c->len - 1] ^= 0x10;
        memcpy(img, f.base, f.len);
        int rc = delta_apply_mem_inplace(img, f.len, d, &(delta_opts){.threads = 1});
        if (rc == SH_OK) fail_msg("a corrupt %s chunk was applied", bad[k]);
        if (memcmp(img, f.base, f.len)) fail_msg("corrupt %s chunk: the image is not the base after the undo", bad[k]);
        delta_free(d);
        free(copy);
    }
    free(img);
    free_five(&f);
}

/* A delta whose target header was changed after it was made (past a file
 * checksum that is off or was recomputed): every tensor digest matches, and
 * only the target digest, which covers the headers, refuses it. */
static void test_tampered_header_no_checksum(void **state)
{
    five f;
    make_five(&f, "hdr");
    delta *d;
    TU_OK(delta_parse(f.delta.data, f.delta.len, DELTA_NO_CHECKSUM, &d));
    uint8_t *h = d->files[0].header;
    uint8_t *at = memmem(h, d->files[0].header_len, "abcdefgh", 8);
    assert_non_null(at);
    at[3] = 'X';
    ckpt *B;
    TU_OK(ckpt_open(tu_path("hdr-base.st"), &B));
    uint8_t *out = malloc(f.len);
    size_t got = 0;
    TU_ERR(delta_apply_mem(B, d, &(delta_opts){.threads = 1}, out, f.len, &got), SH_EMISMATCH, "target digest");
    free(out);
    ckpt_close(B);
    delta_free(d);
    free_five(&f);
}

/* In place, the same tampered header (image and delta alike, so the layout
 * check passes): the target digest refuses it and the image is unchanged. */
static void test_inplace_header_tamper(void **state)
{
    five f;
    make_five(&f, "iph");
    delta *d;
    TU_OK(delta_parse(f.delta.data, f.delta.len, DELTA_NO_CHECKSUM, &d));
    uint8_t *h = d->files[0].header;
    uint8_t *at = memmem(h, d->files[0].header_len, "abcdefgh", 8);
    assert_non_null(at);
    at[3] = 'X';
    uint8_t *img = malloc(f.len), *want = malloc(f.len);
    memcpy(img, f.base, f.len);
    uint8_t *ia = memmem(img, 4096, "abcdefgh", 8);
    assert_non_null(ia);
    ia[3] = 'X';
    memcpy(want, img, f.len);
    TU_ERR(delta_apply_mem_inplace(img, f.len, d, &(delta_opts){.threads = 1}), SH_EMISMATCH, "target digest");
    assert_memory_equal(img, want, f.len);
    free(img), free(want);
    delta_free(d);
    free_five(&f);
}

/* An image whose header differs from the delta's (same length) is another
 * layout: in place is refused before anything is written. */
static void test_inplace_wrong_layout(void **state)
{
    five f;
    make_five(&f, "ipl");
    delta *d;
    TU_OK(delta_parse(f.delta.data, f.delta.len, 0, &d));
    uint8_t *img = malloc(f.len);
    memcpy(img, f.base, f.len);
    uint8_t *ia = memmem(img, 4096, "abcdefgh", 8);
    assert_non_null(ia);
    ia[0] = 'Z';
    TU_ERR(delta_apply_mem_inplace(img, f.len, d, NULL), SH_EINVAL, "keeps the layout");
    assert_int_equal(ia[0], 'Z');
    assert_memory_equal(ia + 1, "bcdefgh", 7);
    free(img);
    delta_free(d);
    free_five(&f);
}

/* With verify_base, a base whose tensors are the delta's base but whose
 * header is not (other metadata) is named as the wrong checkpoint; without
 * it the target is rebuilt, whole and right, from the same tensors. */
static void test_verify_base_header(void **state)
{
    five f;
    make_five(&f, "vb");
    uint8_t *other = malloc(f.len);
    memcpy(other, f.base, f.len);
    uint8_t *ia = memmem(other, 4096, "abcdefgh", 8);
    assert_non_null(ia);
    ia[7] = 'X';
    tu_write_file(tu_path("vb-other.st"), other, f.len);
    free(other);
    ckpt *B;
    TU_OK(ckpt_open(tu_path("vb-other.st"), &B));
    delta *d;
    TU_OK(delta_parse(f.delta.data, f.delta.len, 0, &d));
    uint8_t *out = malloc(f.len);
    size_t got = 0;
    TU_ERR(delta_apply_mem(B, d, &(delta_opts){.threads = 1, .verify_base = 1}, out, f.len, &got), SH_EMISMATCH,
           "the delta was made against checkpoint");
    TU_OK(delta_apply_mem(B, d, &(delta_opts){.threads = 1}, out, f.len, &got));
    assert_int_equal(got, f.len);
    assert_memory_equal(out, f.target, f.len);
    free(out);
    delta_free(d);
    ckpt_close(B);
    free_five(&f);
}

/* ---- Scheduler: reservations go to the oldest blocked gang ---------------- */

/* Four 8-GPU nodes.  Tenant "big" runs A on three of them.  Then, oldest
 * first: big's gang B (4 nodes), small's gang S (4 nodes), tiny's gang T
 * (4 nodes), and tiny's one-node job X that would delay them.  Fair share
 * puts S and T (tenants holding nothing) before B, but the reservation
 * walk takes the oldest blocked gang: B holds the one reservation, X may
 * not start, and B starts when A ends. */
static void test_reservation_order_tenants(void **state)
{
    sched_config c;
    sched_config_default(&c, SCHED_POLICY_SHOAL);
    c.max_reservations = 1;
    sched *s = sched_new(&c);
    assert_non_null(s);
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "n%d", i);
        sched_node_spec n = {id, "z", "f", "h100", 8, 1.0};
        TU_OK(sched_node_add(s, &n, 0));
    }
    sched_job_spec j = {.id = "A", .tenant = "big", .kind = SCHED_GANG, .nodes = 3, .gpus_per_node = 8, .est_s = 100};
    TU_OK(sched_job_submit(s, &j, 0));
    sched_decisions d = {0};
    assert_true(sched_step(s, 0, &d) >= 0);
    j = (sched_job_spec){.id = "B", .tenant = "big", .kind = SCHED_GANG, .nodes = 4, .gpus_per_node = 8, .est_s = 100};
    TU_OK(sched_job_submit(s, &j, 1));
    j = (sched_job_spec){.id = "S", .tenant = "small", .kind = SCHED_GANG, .nodes = 4, .gpus_per_node = 8, .est_s = 100};
    TU_OK(sched_job_submit(s, &j, 2));
    j = (sched_job_spec){.id = "T", .tenant = "tiny", .kind = SCHED_GANG, .nodes = 4, .gpus_per_node = 8, .est_s = 100};
    TU_OK(sched_job_submit(s, &j, 3));
    j = (sched_job_spec){.id = "X", .tenant = "tiny", .kind = SCHED_GANG, .nodes = 1, .gpus_per_node = 8, .est_s = 1000};
    TU_OK(sched_job_submit(s, &j, 4));
    assert_true(sched_step(s, 5, &d) >= 0);
    TU_OK(sched_check(s, 5));
    /* One reservation, held by the oldest blocked gang. */
    assert_int_equal(s->room->nresv, 1);
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, "B", 0, &ji));
    const char *holder = s->jobs[s->room->resv[0].job].id;
    if (strcmp(holder, "B")) fail_msg("the reservation went to %s, not to the oldest blocked gang B", holder);
    TU_OK(sched_job_info_get(s, "X", 0, &ji));
    assert_int_equal(ji.state, SCHED_QUEUED);
    TU_OK(sched_job_finish(s, "A", 100));
    assert_true(sched_step(s, 100, &d) >= 0);
    TU_OK(sched_check(s, 100));
    TU_OK(sched_job_info_get(s, "B", 0, &ji));
    assert_int_equal(ji.state, SCHED_RUNNING);
    static const char *rest[] = {"S", "T", "X"};
    for (int i = 0; i < 3; i++) {
        TU_OK(sched_job_info_get(s, rest[i], 0, &ji));
        if (ji.state == SCHED_RUNNING && strcmp(rest[i], "X")) fail_msg("%s started before B", rest[i]);
    }
    sched_decisions_free(&d);
    sched_free(s);
}

/* ---- Scheduler: failure policies and billing ------------------------------ */

static sched *fleet3(sched_policy pol)
{
    sched_config c;
    sched_config_default(&c, pol);
    sched *s = sched_new(&c);
    assert_non_null(s);
    for (int i = 1; i <= 3; i++) {
        char id[8];
        snprintf(id, sizeof id, "n%d", i);
        sched_node_spec n = {id, "z", "f", "h100", 8, 3.6};
        TU_OK(sched_node_add(s, &n, 0));
    }
    return s;
}

/* The first node of a job's allocation. */
static const char *first_node(sched *s, const char *job)
{
    static char buf[16];
    sched_place p[4];
    assert_true(sched_job_alloc(s, job, p, 4) >= 1);
    snprintf(buf, sizeof buf, "%s", p[0].node);
    return buf;
}

/* on_failure "replace" with replace_wait_s 0 waits for no spare: the gang
 * is requeued at once, as "requeue" would. */
static void test_replace_wait_zero(void **state)
{
    sched *s = fleet3(SCHED_POLICY_SHOAL);
    sched_job_spec g = {.id = "G", .kind = SCHED_GANG, .nodes = 2, .gpus_per_node = 8, .est_s = 100,
                        .on_fail = SCHED_REPLACE, .replace_wait_s = 0};
    TU_OK(sched_job_submit(s, &g, 0));
    sched_decisions d = {0};
    assert_true(sched_step(s, 0, &d) >= 0);
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, "G", 0, &ji));
    assert_int_equal(ji.state, SCHED_RUNNING);
    TU_OK(sched_node_fail(s, first_node(s, "G"), 5));
    TU_OK(sched_job_info_get(s, "G", 5, &ji));
    if (ji.state == SCHED_REPLACING) fail_msg("a gang with replace_wait_s 0 waits for a spare");
    assert_int_equal(ji.state, SCHED_QUEUED);
    TU_OK(sched_check(s, 5));
    sched_decisions_free(&d);
    sched_free(s);
}

/* An elastic job at its minimum that loses a node is requeued: it never
 * runs below min replicas. */
static void test_elastic_min_on_failure(void **state)
{
    sched *s = fleet3(SCHED_POLICY_SHOAL);
    sched_job_spec e = {.id = "E", .kind = SCHED_ELASTIC, .nodes = 2, .max_replicas = 2, .gpus_per_node = 8,
                        .est_s = 100};
    TU_OK(sched_job_submit(s, &e, 0));
    sched_decisions d = {0};
    assert_true(sched_step(s, 0, &d) >= 0);
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, "E", 0, &ji));
    assert_int_equal(ji.replicas, 2);
    TU_OK(sched_node_fail(s, first_node(s, "E"), 5));
    TU_OK(sched_job_info_get(s, "E", 5, &ji));
    if (ji.state == SCHED_RUNNING && ji.replicas < 2)
        fail_msg("elastic E runs %d replica(s), below its minimum of 2", ji.replicas);
    assert_int_equal(ji.state, SCHED_QUEUED);
    assert_true(sched_step(s, 6, &d) >= 0);
    TU_OK(sched_check(s, 6));
    TU_OK(sched_job_info_get(s, "E", 6, &ji));
    assert_int_equal(ji.state, SCHED_RUNNING);
    assert_int_equal(ji.replicas, 2);
    sched_decisions_free(&d);
    sched_free(s);
}

/* firstfit's held GPUs are billed to nobody: a gang that holds two of the
 * three nodes for the whole hold timeout costs its tenant nothing, while
 * the job that ran is billed per second. */
static void test_holding_not_billed(void **state)
{
    sched *s = fleet3(SCHED_POLICY_FIRSTFIT);
    sched_job_spec r = {.id = "R", .tenant = "runner", .kind = SCHED_GANG, .nodes = 1, .gpus_per_node = 8,
                        .est_s = 1000};
    TU_OK(sched_job_submit(s, &r, 0));
    sched_decisions d = {0};
    assert_true(sched_step(s, 0, &d) >= 0);
    sched_job_spec a = {.id = "A", .tenant = "holder", .kind = SCHED_GANG, .nodes = 3, .gpus_per_node = 8,
                        .est_s = 100};
    TU_OK(sched_job_submit(s, &a, 1));
    assert_true(sched_step(s, 1, &d) >= 0);
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, "A", 1, &ji));
    assert_int_equal(ji.state, SCHED_HOLDING);
    double t = sched_next_wakeup(s);
    assert_true(t > 1);
    assert_true(sched_step(s, t, &d) >= 0); /* the hold times out and is released */
    TU_OK(sched_job_finish(s, "R", t + 1));
    double held = sched_cost_tenant(s, "holder", NULL, t + 1), ran = sched_cost_tenant(s, "runner", NULL, t + 1);
    if (held != 0) fail_msg("the holding gang's tenant was billed $%.4f for GPUs it held but never used", held);
    assert_true(ran > 0);
    /* 8 GPUs at $3.60 an hour each for ceil(t + 1) seconds. */
    double secs = (double)(long)(t + 1);
    if (secs < t + 1) secs += 1;
    assert_true(ran > 8 * 0.001 * secs - 1e-6 && ran < 8 * 0.001 * secs + 1e-6);
    sched_decisions_free(&d);
    sched_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_anchor_same_size),
        cmocka_unit_test(test_store_delta_corrupt_model),
        cmocka_unit_test(test_manifest_rules),
        cmocka_unit_test(test_store_have_corrupt),
        cmocka_unit_test(test_run_names),
        cmocka_unit_test(test_latest_rules),
        cmocka_unit_test(test_replica_restore_corrupt),
        cmocka_unit_test(test_push_root_corrupt_anchor),
        cmocka_unit_test(test_sparse_position_at_end),
        cmocka_unit_test(test_sparse_value_out_of_range),
        cmocka_unit_test(test_sparse_count_beyond_chunk),
        cmocka_unit_test(test_inplace_failures),
        cmocka_unit_test(test_tampered_header_no_checksum),
        cmocka_unit_test(test_inplace_header_tamper),
        cmocka_unit_test(test_inplace_wrong_layout),
        cmocka_unit_test(test_verify_base_header),
        cmocka_unit_test(test_reservation_order_tenants),
        cmocka_unit_test(test_replace_wait_zero),
        cmocka_unit_test(test_elastic_min_on_failure),
        cmocka_unit_test(test_holding_not_billed),
    };
    return cmocka_run_group_tests_name("integrity", tests, NULL, NULL);
}
