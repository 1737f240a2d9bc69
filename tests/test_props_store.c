/* Properties of the digests and the store that the generated mutants
 * (scripts/mutgen.py, docs/testing.md) found no test held:
 *  - a digest comparison uses the whole hash: two digests that differ in
 *    any one of their 128 bits are different;
 *  - a digest is read from exactly 32 hex digits, in either case, and any
 *    other character is refused (none is read as a value);
 *  - a run id is 1 to 64 characters, exactly at the boundary;
 *  - a LATEST pointer lacking any of its fields is refused, naming it, and
 *    version 1 is the first it may name;
 *  - what the store publishes and a replica activates is readable by every
 *    user and writable by its owner only: folders 0755, files 0644 (under
 *    the process's umask), and a restarted replica removes the model files
 *    it does not serve;
 *  - a publish from memory without an image, or with a delta length and
 *    no delta, is refused before anything is written;
 *  - a replica never activates a pushed version whose bytes differ from
 *    its manifest's model digest, even when the payload itself checks out
 *    (its hash, and the delta's own digests);
 *  - a squashed chain rebuilds exactly what the chain rebuilds, whichever
 *    of its deltas changes what (a chain of one too);
 *  - a version folder whose path does not fit whole is refused, never
 *    truncated to the name of another folder (which would be removed);
 *  - a replica refuses a delta whose target size is not its manifest's
 *    model_size, and says so;
 *  - from memory, a run's first version and a version given without a
 *    delta are anchors;
 *  - a push root offers what is published after its first offer;
 *  - a run's publisher claim: exclusive without a writer id, shared by
 *    writer ids (1-64 characters, exactly), ended by store_close, and a
 *    lock file that cannot be opened is refused with the system's reason;
 *  - a chain whose middle delta is damaged fails as that version's damage,
 *    an unreadable anchor as unreadable, and leaves no step file behind;
 *  - a delta across the anchor to a delta version rebuilds it exactly; the
 *    squash cache is never planned from version 0 or from a newer version,
 *    a cached squash that rebuilds another model is refused, and gc removes
 *    the squashes that start before what it keeps;
 *  - the default anchor period is 8 (versions 1 and 9 of 9) by file, memory
 *    and kept tensors, an anchor has base 0 and a delta the version before;
 *  - a publish whose staging folder cannot be made fails there, and LATEST
 *    stays; a kept-tensors publish on a too-long path is refused;
 *  - a manifest's digests are required; a publish on a chain cut short is
 *    an anchor; a head cache that lost its file is rebuilt; verify names an
 *    unreadable payload as such;
 *  - a folder's delta publish leaves no descriptor open, and publishes whole
 *    when its head cache cannot be made. */
#include "testutil.h"

#include <errno.h>
#include <string.h>
#include <strings.h>
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/stat.h>

#include "shoal/bcast.h"
#include "shoal/ckpt.h"
#include "shoal/delta.h"
#include "shoal/store.h"
#include "weights/store/store_int.h" /* store__cross_delta */

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

static void test_latest_fields_required(void **state)
{
    const char *root = tu_path("props-latest");
    sh_rm_rf(root);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    char p[4096];
    snprintf(p, sizeof p, "%s/main/LATEST", root);
    static const struct {
        const char *text, *field;
    } rows[] = {
        {"{\"run\":\"main\",\"version\":1}", "format"},
        {"{\"format\":\"shoal-latest/1\",\"version\":1}", "run"},
        {"{\"format\":\"shoal-latest/1\",\"run\":\"main\"}", "version"},
        {"{\"format\":1,\"run\":\"main\",\"version\":1}", "format"},
        {"{\"format\":\"shoal-latest/1\",\"run\":7,\"version\":1}", "run"},
        {"{\"format\":\"shoal-latest/1\",\"run\":\"main\",\"version\":\"1\"}", "version"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        tu_write_file(p, rows[i].text, strlen(rows[i].text));
        uint64_t v = 99;
        int rc = store_latest(s, &v);
        if (rc != SH_EFORMAT || !strstr(sh_errmsg(), rows[i].field))
            fail_msg("LATEST %s: %d \"%s\", expected a refusal naming \"%s\"", rows[i].text, rc, sh_errmsg(),
                     rows[i].field);
    }
    /* Version 1 parses (and is missing here). */
    const char *one = "{\"format\":\"shoal-latest/1\",\"run\":\"main\",\"version\":1}";
    tu_write_file(p, one, strlen(one));
    uint64_t v = 99;
    TU_ERR(store_latest(s, &v), SH_ENOENT, "is missing");
    store_close(s);
}

/* Checks the mode of every folder and file under dir; returns how many. */
static int check_modes(const char *dir, mode_t um)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        /* Lock files are the owner's alone (0600). */
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcasecmp(e->d_name, "lock")) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        assert_int_equal(lstat(p, &st), 0);
        mode_t want = S_ISDIR(st.st_mode) ? (0755 & ~um) : (0644 & ~um);
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) continue;
        if ((st.st_mode & 07777) != want) fail_msg("%s: mode %04o, expected %04o", p, st.st_mode & 07777, want);
        n++;
        if (S_ISDIR(st.st_mode)) n += check_modes(p, um);
    }
    closedir(d);
    return n;
}

static void test_published_modes(void **state)
{
    mode_t um = umask(022);
    umask(um);
    const char *root = tu_path("props-modes"), *rep = tu_path("props-modes-rep");
    sh_rm_rf(root);
    sh_rm_rf(rep);
    TU_OK(ckpt_synth(tu_path("pm1.st"), 20000, 1));
    TU_OK(ckpt_synth(tu_path("pm2.st"), 20000, 2));
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    TU_OK(store_publish(s, tu_path("pm1.st"), NULL, &v));
    store_replica_config cfg = {0};
    cfg.dir = rep;
    cfg.store = root;
    cfg.poll_s = 0.01;
    store_replica *r;
    TU_OK(store_replica_open(&cfg, &r));
    TU_OK(store_replica_wait(r, 1, 30));
    TU_OK(store_publish(s, tu_path("pm2.st"), NULL, &v));
    TU_OK(store_replica_wait(r, 2, 30));
    /* A healthy replica has no failure on record. */
    sh_sleep(0.1);
    store_replica_info info;
    store_replica_get_info(r, &info);
    if (info.failures || info.last_error[0]) fail_msg("a healthy replica reports %llu failures: %s",
                                                      (unsigned long long)info.failures, info.last_error);
    store_replica_close(r);
    /* A restart removes the model files it does not serve (a crash's). */
    char junk[4200];
    snprintf(junk, sizeof junk, "%s/models/0000000009.safetensors", rep);
    tu_write_file(junk, "x", 1);
    chmod(junk, 0644 & ~um);
    TU_OK(store_replica_open(&cfg, &r));
    TU_OK(store_replica_wait(r, 2, 30));
    store_replica_close(r);
    if (sh_path_exists(junk)) fail_msg("a restarted replica kept %s, which it does not serve", junk);
    store_close(s);
    assert_true(check_modes(root, um) >= 6);
    assert_true(check_modes(rep, um) >= 3);
}

static void test_publish_mem_needs_image(void **state)
{
    const char *root = tu_path("props-pubmem");
    sh_rm_rf(root);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    TU_OK(ckpt_synth(tu_path("pmem.st"), 20000, 3));
    size_t n;
    uint8_t *img = tu_read_file(tu_path("pmem.st"), &n);
    uint64_t v = 0;
    TU_ERR(store_publish_mem(s, NULL, NULL, &v), SH_EINVAL, "needs the version's image");
    store_mem_version in = {.image = NULL, .image_len = n};
    TU_ERR(store_publish_mem(s, &in, NULL, &v), SH_EINVAL, "needs the version's image");
    in = (store_mem_version){.image = img, .image_len = 0};
    TU_ERR(store_publish_mem(s, &in, NULL, &v), SH_EINVAL, "needs the version's image");
    in = (store_mem_version){.image = img, .image_len = n, .delta = NULL, .delta_len = 10};
    TU_ERR(store_publish_mem(s, &in, NULL, &v), SH_EINVAL, "a delta length without a delta");
    uint64_t latest = 9;
    TU_OK(store_latest(s, &latest));
    assert_int_equal(latest, 0); /* nothing was published */
    in = (store_mem_version){.image = img, .image_len = n};
    TU_OK(store_publish_mem(s, &in, NULL, &v));
    assert_int_equal(v, 1);
    /* A version given without a delta is a whole anchor, also when the
     * anchor period (8) has not come round: it needs no delta. */
    in.base = 1;
    TU_OK(store_publish_mem(s, &in, NULL, &v));
    assert_int_equal(v, 2);
    free(img);
    store_close(s);
}

/* Which versions are anchors is the store's rule, not the caller's: the
 * first version of a run and a version given without a delta are anchors
 * (a replica must be able to load them alone), whatever delta comes along. */
static void test_publish_mem_anchor_rule(void **state)
{
    const char *root = tu_path("props-pubanchor");
    sh_rm_rf(root);
    TU_OK(ckpt_synth(tu_path("pa1.st"), 20000, 7));
    TU_OK(ckpt_step(tu_path("pa1.st"), tu_path("pa2.st"), 1e-3, 1, 8));
    ckpt *c1, *c2;
    TU_OK(ckpt_open(tu_path("pa1.st"), &c1));
    TU_OK(ckpt_open(tu_path("pa2.st"), &c2));
    sh_buf d = {0};
    TU_OK(delta_make_mem(c1, c2, NULL, &d, NULL));
    size_t n1, n2;
    uint8_t *i1 = tu_read_file(tu_path("pa1.st"), &n1), *i2 = tu_read_file(tu_path("pa2.st"), &n2);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    store_plan *p = malloc(sizeof *p);
    uint64_t v = 0;
    /* The first version, handed a valid delta of its own size. */
    store_mem_version in = {.image = i2, .image_len = n2, .delta = (const uint8_t *)d.data, .delta_len = d.len};
    TU_OK(store_publish_mem(s, &in, NULL, &v));
    assert_int_equal(v, 1);
    TU_OK(store_plan_make(s, 0, 1, p));
    if (p->kind != STORE_PLAN_ANCHOR || p->anchor != 1)
        fail_msg("the first version of a run is not an anchor (plan kind %d, anchor %llu)", p->kind,
                 (unsigned long long)p->anchor);
    /* A later version without a delta. */
    in = (store_mem_version){.image = i1, .image_len = n1, .base = 1};
    TU_OK(store_publish_mem(s, &in, NULL, &v));
    assert_int_equal(v, 2);
    TU_OK(store_plan_make(s, 0, 2, p));
    if (p->kind != STORE_PLAN_ANCHOR || p->anchor != 2)
        fail_msg("a version published without a delta is not an anchor (plan kind %d, anchor %llu)", p->kind,
                 (unsigned long long)p->anchor);
    free(p);
    store_close(s);
    sh_buf_free(&d);
    free(i1);
    free(i2);
    ckpt_close(c1);
    ckpt_close(c2);
}

static void *root_loop(void *arg)
{
    bcast_node_run(arg, 120);
    return NULL;
}

/* Version 2's manifest spoiled one way: the model digest one hex digit off. */
static char *spoil_digest(const char *text, const store_version *m)
{
    char hex[33], *t = strdup(text);
    sh_hash128_hex(m->model_xxh3, hex);
    char *at = strstr(t, hex);
    assert_non_null(at);
    at[31] = at[31] == '0' ? '1' : '0';
    return t;
}

/* ... or its model_size 4096 bytes more than the delta rebuilds. */
static char *spoil_size(const char *text, const store_version *m)
{
    json_t *j = json_loads(text, 0, NULL);
    assert_non_null(j);
    json_object_set_new(j, "model_size", json_integer((json_int_t)m->model_size + 4096));
    char *t = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return t;
}

/* Version 2 is a delta whose manifest is spoiled (a model digest one hex
 * digit off, a model_size that is not the delta's; the payload's own hash
 * and the delta's digests are right, so the push tree and the codec pass
 * it): a real `shoal replica` fed by a push root takes version 1, must
 * never activate version 2, and must say `why`.  With first 2, the
 * replica serves version 1 before the root has version 2 (so version 2 is
 * built on the active model).  With a version
 * 3 after it (nver 3), the root announces version 3 and the replica builds
 * versions 1 and 2 in memory without activating them (a late joiner's
 * catch-up): version 2 must be refused there too, so version 3, whose base
 * it is, is never built on it; the replica then activates the anchor it
 * kept whole. */
static void spoiled_case(const char *tag, int nver, int first,
                         char *(*spoil)(const char *, const store_version *), const char *why)
{
    char root[4096], dir[4096];
    snprintf(root, sizeof root, "%s%s%d", tu_path("props-push"), tag, nver);
    snprintf(dir, sizeof dir, "%s%s%d", tu_path("props-push-rep"), tag, nver);
    sh_rm_rf(root);
    sh_rm_rf(dir);
    TU_OK(ckpt_synth(tu_path("pp1.st"), 100000, 5));
    TU_OK(ckpt_step(tu_path("pp1.st"), tu_path("pp2.st"), 1e-3, 1, 6));
    TU_OK(ckpt_step(tu_path("pp2.st"), tu_path("pp3.st"), 1e-3, 1, 7));
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    char pay[3][4096], *text[3];
    store_version m[3];
    for (int k = 0; k < nver; k++) {
        char src[64];
        snprintf(src, sizeof src, "pp%d.st", k + 1);
        TU_OK(store_publish(s, tu_path(src), NULL, &v));
        TU_OK(store_get(s, (uint64_t)k + 1, &m[k], &text[k]));
        TU_OK(store_payload_path(s, (uint64_t)k + 1, pay[k], sizeof pay[k]));
    }
    store_close(s);
    assert_false(m[1].anchor);
    char *bad = spoil(text[1], &m[1]);
    free(text[1]);
    text[1] = bad;
    /* first > 1: the replica first takes and activates the versions before
     * it from a root that has only those, then is restarted on one that
     * has them all (the version is then a delta on its active model). */
    int rc = 0;
    char log[4200];
    snprintf(log, sizeof log, "%s.log", dir);
    for (int until = first > 1 ? first - 1 : nver; until <= nver; until = until < nver ? nver : nver + 1) {
        bcast_config bc = {.name = "root", .accept_children = 1, .chunk_size = 64 << 10};
        bcast_node *n;
        TU_OK(bcast_node_new(&bc, &n));
        for (int k = 0; k < until; k++) TU_OK(bcast_node_add_object(n, text[k], pay[k]));
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, root_loop, n), 0);
        char cmd[12288];
        snprintf(cmd, sizeof cmd, "exec %s replica --dir %s --parent %s --until %d --seconds 8 --json >%s 2>&1",
                 tu_shoal(), dir, bcast_node_address(n), until, log);
        char *out = NULL;
        rc = tu_run(&out, "%s", cmd);
        free(out);
        bcast_node_stop(n);
        bcast_node_wake(n);
        pthread_join(th, NULL);
        bcast_node_free(n);
        if (until < nver && rc != 0) fail_msg("the replica did not take version %d (exit %d)", until, rc);
    }
    for (int k = 0; k < nver; k++) free(text[k]);
    char *l = NULL;
    size_t tl;
    if (sh_read_file(log, 1 << 20, &l, &tl) < 0) l = strdup("(no log)");
    char active[4200], *act = NULL;
    snprintf(active, sizeof active, "%s/ACTIVE", dir);
    if (sh_read_file(active, 1 << 16, &act, &tl) < 0) act = strdup("");
    json_t *j = json_loads(act, 0, NULL);
    long long on = j ? (long long)json_integer_value(json_object_get(j, "version")) : 0;
    json_decref(j);
    if (rc == 0 || on >= 2) fail_msg("the replica activated version %lld (exit %d): ACTIVE %s\n%s", on, rc, act, l);
    /* Version 1 (an anchor) was staged on the way to the newest and kept
     * whole: the replica falls back to it. */
    if (on != 1) fail_msg("the replica did not take version 1: ACTIVE %s\n%s", act, l);
    if (!strstr(l, why)) fail_msg("the replica did not say \"%s\": %s", why, l);
    /* The activation that succeeded records when it became durable (its
     * bytes and name fsynced), not after the active one. */
    const char *du = strstr(l, "\"durable_us\":"), *ac = strstr(l, "\"active_us\":");
    if (!du || !ac || strtoll(du + 13, NULL, 10) < strtoll(ac + 12, NULL, 10))
        fail_msg("version 1's timeline has no durable time at or after its activation:\n%s", l);
    free(act);
    free(l);
}

static void test_pushed_version_digest_checked(void **state)
{
    spoiled_case("digest", 2, 1, spoil_digest, "not the manifest's model_xxh3");
}

static void test_staged_version_digest_checked(void **state)
{
    spoiled_case("digest", 3, 1, spoil_digest, "not the manifest's model_xxh3");
}

static void test_pushed_version_size_checked(void **state)
{
    spoiled_case("size", 2, 2, spoil_size, "the manifest says");
}

static void test_squash_is_the_chain(void **state)
{
    char paths[4][4096], deltas[3][4096];
    for (int v = 0; v < 4; v++) snprintf(paths[v], sizeof paths[v], "%s/sq%d.st", tu_tmpdir(), v);
    TU_OK(ckpt_synth(paths[0], 50000, 9));
    for (int v = 1; v < 4; v++) TU_OK(ckpt_step(paths[v - 1], paths[v], 1e-3, 1, (uint64_t)(9 + v)));
    for (int k = 0; k < 3; k++) {
        snprintf(deltas[k], sizeof deltas[k], "%s/sq%d-%d.shd", tu_tmpdir(), k, k + 1);
        TU_OK(delta_make(paths[k], paths[k + 1], deltas[k], &(delta_opts){0}, NULL));
    }
    for (size_t n = 1; n <= 3; n++) {
        const char *chain[3] = {deltas[0], deltas[1], deltas[2]};
        char sq[4200], out[4200];
        snprintf(sq, sizeof sq, "%s/sq-0-%zu.shd", tu_tmpdir(), n);
        snprintf(out, sizeof out, "%s/sq-out-%zu.st", tu_tmpdir(), n);
        TU_OK(delta_squash(chain, n, sq, &(delta_opts){0}, NULL));
        TU_OK(delta_apply(paths[0], sq, out, &(delta_opts){0}));
        tu_assert_same_file(out, paths[n]);
    }
}

/* The store's version folder is root/main/versions/NNNNNNNNNN: a root
 * whose folder path is exactly one byte too long for the 4096-byte buffer
 * (the terminating NUL has no room) must be refused, not truncated to
 * versions/000000000, a folder that is then "a crashed publish's leftover"
 * and removed. */
static void test_publish_path_never_truncated(void **state)
{
    char root[4096];
    int k = snprintf(root, sizeof root, "%s/long", tu_tmpdir());
    /* strlen(root) + strlen("/main/versions/0000000001") == 4096 */
    size_t want = 4096 - strlen("/main/versions/0000000001");
    while ((size_t)k < want) {
        size_t left = want - (size_t)k, part = left > 201 ? 200 : left - 1;
        if (left > 201 && left - 201 < 2) part = 150; /* no empty last part */
        root[k++] = '/';
        memset(root + k, 'd', part);
        k += (int)part;
        root[k] = 0;
    }
    assert_int_equal(strlen(root), want);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    char other[4096];
    snprintf(other, sizeof other, "%s/main/versions/000000000", root);
    TU_OK(sh_mkdir_p(other, 0755));
    TU_OK(ckpt_synth(tu_path("plong.st"), 2000, 4));
    uint64_t v = 0;
    TU_ERR(store_publish(s, tu_path("plong.st"), NULL, &v), SH_ERANGE, "too long");
    size_t n;
    uint8_t *img = tu_read_file(tu_path("plong.st"), &n);
    store_mem_version in = {.image = img, .image_len = n};
    TU_ERR(store_publish_mem(s, &in, NULL, &v), SH_ERANGE, "too long");
    free(img);
    /* Tensors with the previous image kept: refused the same way. */
    ckpt *c;
    TU_OK(ckpt_open(tu_path("plong.st"), &c));
    ckpt_tensor t = *ckpt_tensor_at(c, 0);
    TU_OK(store_publish_keep(s, 1, 1));
    TU_ERR(store_publish_tensors(s, &t, 1, 0, &v), SH_ERANGE, "too long");
    ckpt_close(c);
    store_close(s);
    if (!sh_is_dir(other)) fail_msg("a publish removed %s, the folder its truncated path named", other);
}

static atomic_int root_stop;

static void *root_steps(void *arg)
{
    while (!atomic_load(&root_stop)) store_push_root_step(arg, 0.1);
    return NULL;
}

/* A push root follows its run's LATEST: a version published after the
 * root's first offer is offered too, and a replica joining the tree
 * activates it. */
static void test_push_root_offers_later_versions(void **state)
{
    const char *root = tu_path("props-later"), *dir = tu_path("props-later-rep");
    sh_rm_rf(root);
    sh_rm_rf(dir);
    TU_OK(ckpt_synth(tu_path("pl1.st"), 100000, 9));
    TU_OK(ckpt_step(tu_path("pl1.st"), tu_path("pl2.st"), 1e-3, 1, 10));
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    TU_OK(store_publish(s, tu_path("pl1.st"), NULL, &v));
    bcast_config bc = {.chunk_size = 64 << 10};
    store_push_root *r;
    TU_OK(store_push_root_new(root, NULL, &bc, &r));
    TU_OK(store_push_root_step(r, 0.05)); /* offers version 1 */
    TU_OK(store_publish(s, tu_path("pl2.st"), NULL, &v));
    assert_int_equal(v, 2);
    store_close(s);
    atomic_store(&root_stop, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, root_steps, r), 0);
    char log[4096];
    snprintf(log, sizeof log, "%s.log", dir);
    char *out = NULL;
    int rc = tu_run(&out, "exec %s replica --dir %s --parent %s --until 2 --seconds 10 --json >%s 2>&1", tu_shoal(), dir,
                    store_push_root_address(r), log);
    free(out);
    atomic_store(&root_stop, 1);
    pthread_join(th, NULL);
    store_push_root_free(r);
    char active[4200], *act = NULL, *l = NULL;
    size_t tl;
    snprintf(active, sizeof active, "%s/ACTIVE", dir);
    if (sh_read_file(active, 1 << 16, &act, &tl) < 0) act = strdup("");
    if (sh_read_file(log, 1 << 20, &l, &tl) < 0) l = strdup("(no log)");
    json_t *j = json_loads(act, 0, NULL);
    long long on = j ? (long long)json_integer_value(json_object_get(j, "version")) : 0;
    json_decref(j);
    if (rc != 0 || on != 2)
        fail_msg("version 2, published after the root's first offer, was not activated (exit %d, ACTIVE %s):\n%s", rc, act, l);
    free(act);
    free(l);
}

/* A run has one publisher unless its publishers each give a writer id: an
 * exclusive claim (no writer id) excludes every other handle, shared or
 * not, and is refused while another holds the run, naming the holder; the
 * claim lasts until store_close and no longer (the next publisher of the
 * same process claims then); a writer id is 1 to 64 characters without a
 * newline, exactly at the boundary; a lock file that cannot be opened is
 * refused with its path and the system's reason. */
static void test_publisher_claim(void **state)
{
    const char *root = tu_path("props-claim");
    sh_rm_rf(root);
    store *a, *b, *c;
    TU_OK(store_open(root, NULL, 1, &a));
    TU_OK(store_open(root, NULL, 1, &b));
    TU_OK(store_claim_publisher(a, NULL));
    TU_OK(store_claim_publisher(a, NULL)); /* a claimed handle: a no-op */
    char holder[64];
    snprintf(holder, sizeof holder, "(process %ld, this one)", (long)getpid());
    TU_ERR(store_claim_publisher(b, NULL), SH_EEXIST, holder);
    TU_ERR(store_claim_publisher(b, "w1"), SH_EEXIST, holder);
    store_close(a);
    TU_OK(store_claim_publisher(b, NULL)); /* a's claim ended with its handle */
    store_close(b);

    char id[80];
    memset(id, 'w', 64);
    id[64] = 0;
    TU_OK(store_open(root, NULL, 1, &a));
    TU_OK(store_open(root, NULL, 1, &b));
    TU_OK(store_open(root, NULL, 1, &c));
    TU_OK(store_claim_publisher(a, id));
    TU_OK(store_claim_publisher(b, "w2")); /* shared with a */
    TU_ERR(store_claim_publisher(c, NULL), SH_EEXIST, "writer id \"w2\"");
    id[64] = 'w', id[65] = 0;
    TU_ERR(store_claim_publisher(c, id), SH_EINVAL, "use 1-64 characters");
    TU_ERR(store_claim_publisher(c, ""), SH_EINVAL, "use 1-64 characters");
    TU_ERR(store_claim_publisher(c, "w\n3"), SH_EINVAL, "use 1-64 characters");
    TU_OK(store_claim_publisher(c, "w"));
    store_close(a);
    store_close(b);
    store_close(c);

    /* The lock file's name taken by a folder. */
    const char *root2 = tu_path("props-claim2");
    sh_rm_rf(root2);
    TU_OK(store_open(root2, NULL, 1, &a));
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/main/publisher", root2);
    TU_OK(sh_mkdir_p(lock, 0755));
    int rc = store_claim_publisher(a, NULL);
    if (rc >= 0 || !strstr(sh_errmsg(), lock) || !strstr(sh_errmsg(), strerror(EISDIR)))
        fail_msg("a publisher lock that is a folder: %d \"%s\", expected a refusal naming %s and \"%s\"", rc,
                 sh_errmsg(), lock, strerror(EISDIR));
    store_close(a);
}

/* A chain whose middle delta is damaged fails to materialise as that
 * version's damage (its folder named, never "missing"), not as a later
 * step's missing input; an anchor that cannot be read fails as unreadable;
 * neither leaves a file behind. */
static void test_materialize_damaged_step(void **state)
{
    char root[4096], dir[4096];
    snprintf(root, sizeof root, "%s", tu_path("props-mat"));
    snprintf(dir, sizeof dir, "%s", tu_path("props-mat-out"));
    sh_rm_rf(root);
    sh_rm_rf(dir);
    TU_OK(sh_mkdir_p(dir, 0755));
    TU_OK(ckpt_synth(tu_path("pm-1.st"), 2000, 21));
    for (int k = 2; k <= 4; k++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "pm-%d.st", k - 1);
        snprintf(b, sizeof b, "pm-%d.st", k);
        char pa[4096];
        snprintf(pa, sizeof pa, "%s", tu_path(a));
        TU_OK(ckpt_step(pa, tu_path(b), 1e-3, 1, (uint64_t)(21 + k)));
    }
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    for (int k = 1; k <= 4; k++) {
        char b[64];
        snprintf(b, sizeof b, "pm-%d.st", k);
        TU_OK(store_publish(s, tu_path(b), NULL, &v));
    }
    char out[4200], pay[4096];
    snprintf(out, sizeof out, "%s/model.st", dir);
    TU_OK(store_materialize(s, 4, 0, NULL, out));
    tu_assert_same_file(out, tu_path("pm-4.st"));
    unlink(out);
    store_version m;
    TU_OK(store_get(s, 2, &m, NULL));
    assert_false(m.anchor);
    TU_OK(store_payload_path(s, 2, pay, sizeof pay));
    size_t n;
    uint8_t *d = tu_read_file(pay, &n);
    d[n / 2] ^= 0x5a;
    tu_write_file(pay, d, n);
    free(d);
    int rc = store_materialize(s, 4, 0, NULL, out);
    if (rc >= 0 || rc == SH_ENOENT || !strstr(sh_errmsg(), "0000000002"))
        fail_msg("version 2's damaged delta: %d \"%s\", expected a failure naming its version", rc, sh_errmsg());
    /* An anchor whose payload cannot be read (here a folder in its place)
     * is reported as unreadable, not as bytes that differ from its
     * manifest. */
    TU_OK(store_payload_path(s, 1, pay, sizeof pay));
    TU_OK(sh_rm_rf(pay));
    TU_OK(sh_mkdir_p(pay, 0755));
    rc = store_materialize(s, 1, 0, NULL, out);
    if (rc >= 0 || rc == SH_EMISMATCH || !strstr(sh_errmsg(), strerror(EISDIR)))
        fail_msg("version 1's unreadable anchor: %d \"%s\", expected a read failure", rc, sh_errmsg());
    DIR *dd = opendir(dir);
    assert_non_null(dd);
    struct dirent *e;
    while ((e = readdir(dd)))
        if (e->d_name[0] != '.') fail_msg("a failed materialise left %s/%s", dir, e->d_name);
    closedir(dd);
    store_close(s);
}

/* Without an anchor period of its own (anchor_every 0, or no options) a
 * run's anchors are every 8th version: versions 1 and 9 of 9, whichever way
 * they are published (a checkpoint file, an image and its delta from
 * memory, tensors with the previous image kept), and an anchor has no
 * base (0) while a delta's is the version before it. */
static void test_publish_default_anchor_period(void **state)
{
    enum { N = 9 };
    char files[N][4096];
    ckpt *c[N];
    for (int k = 0; k < N; k++) {
        snprintf(files[k], sizeof files[k], "%s/period%d.st", tu_tmpdir(), k + 1);
        if (k == 0) TU_OK(ckpt_synth(files[0], 500, 31));
        else TU_OK(ckpt_step(files[k - 1], files[k], 1e-3, 1, (uint64_t)(31 + k)));
        TU_OK(ckpt_open(files[k], &c[k]));
    }
    for (int way = 0; way < 3; way++) {
        char root[4096];
        snprintf(root, sizeof root, "%s/period-%d", tu_tmpdir(), way);
        sh_rm_rf(root);
        store *s;
        TU_OK(store_open(root, NULL, 1, &s));
        if (way == 2) TU_OK(store_publish_keep(s, 1, 1));
        store_publish_opts o = {0};
        for (int k = 0; k < N; k++) {
            uint64_t v = 0;
            if (way == 0) {
                TU_OK(store_publish(s, files[k], k % 2 ? &o : NULL, &v));
            } else if (way == 1) {
                size_t n;
                uint8_t *img = tu_read_file(files[k], &n);
                sh_buf d = {0};
                if (k) TU_OK(delta_make_mem(c[k - 1], c[k], NULL, &d, NULL));
                store_mem_version in = {.image = img, .image_len = n, .base = (uint64_t)k,
                                        .delta = (const uint8_t *)d.data, .delta_len = d.len};
                TU_OK(store_publish_mem(s, &in, k % 2 ? &o : NULL, &v));
                sh_buf_free(&d);
                free(img);
            } else {
                size_t nt = ckpt_count(c[k]);
                ckpt_tensor *t = calloc(nt, sizeof *t);
                for (size_t i = 0; i < nt; i++) t[i] = *ckpt_tensor_at(c[k], i);
                TU_OK(store_publish_tensors(s, t, nt, 0, &v));
                free(t);
            }
            assert_int_equal(v, (uint64_t)k + 1);
        }
        for (uint64_t v = 1; v <= N; v++) {
            store_version m;
            TU_OK(store_get(s, v, &m, NULL));
            if (m.anchor != (v == 1 || v == 9))
                fail_msg("publish way %d: version %llu is %s, expected anchors 1 and 9 only", way,
                         (unsigned long long)v, m.anchor ? "an anchor" : "a delta");
            /* An anchor has no base; a delta's is the version before. */
            if (m.base != (m.anchor ? 0 : v - 1))
                fail_msg("publish way %d: version %llu (%s) has base %llu", way, (unsigned long long)v,
                         m.anchor ? "an anchor" : "a delta", (unsigned long long)m.base);
        }
        store_close(s);
    }
    for (int k = 0; k < N; k++) ckpt_close(c[k]);
}

/* A push root answers a late joiner below the anchor with one delta across
 * it (store__cross_delta, into the squash cache): from version 4 to version
 * 6, a delta on anchor 5, it rebuilds version 6 exactly as the plan's
 * squash; a delta that crosses no anchor, or to a version that does not
 * exist, is refused naming why; a squash that rebuilds another model is
 * refused; from a version held after the anchor, the chain's deltas after
 * it rebuild the version; gc removes the squashes that start before what it
 * keeps. */
static void test_materialize_across_anchor(void **state)
{
    char root[4096], files[6][4096], out[4200];
    snprintf(root, sizeof root, "%s", tu_path("props-cross"));
    sh_rm_rf(root);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    store_publish_opts o = {.anchor_every = 4};
    for (int k = 0; k < 6; k++) {
        snprintf(files[k], sizeof files[k], "%s/cross%d.st", tu_tmpdir(), k + 1);
        if (k == 0) TU_OK(ckpt_synth(files[0], 500, 41));
        else TU_OK(ckpt_step(files[k - 1], files[k], 1e-3, 1, (uint64_t)(41 + k)));
        uint64_t v;
        TU_OK(store_publish(s, files[k], &o, &v));
    }
    store_version m;
    TU_OK(store_get(s, 5, &m, NULL));
    assert_true(m.anchor);
    TU_OK(store_get(s, 6, &m, NULL));
    assert_false(m.anchor);
    uint64_t bytes = 0;
    TU_OK(store__cross_delta(s, 4, 6, &bytes));
    assert_true(bytes > 0);
    store_plan *p = malloc(sizeof *p);
    TU_OK(store_plan_make(s, 4, 6, p));
    assert_int_equal(p->kind, STORE_PLAN_SQUASH);
    assert_int_equal(p->bytes, bytes);
    free(p);
    snprintf(out, sizeof out, "%s/cross-out.st", tu_tmpdir());
    TU_OK(store_materialize(s, 6, 4, files[3], out));
    tu_assert_same_file(out, files[5]);
    /* The squash cache serves only a from that holds an older version:
     * files named from version 0 (nothing held) or from a newer version
     * are never planned, however small. */
    for (int k = 0; k < 2; k++) {
        char stray[4200];
        TU_OK(store_squash_path(s, k ? 7 : 0, 6, stray, sizeof stray));
        tu_write_file(stray, "stray", 5);
        store_plan q;
        TU_OK(store_plan_make(s, k ? 7 : 0, 6, &q));
        if (q.kind != STORE_PLAN_ANCHOR || q.anchor != 5)
            fail_msg("a plan from version %d to 6 is %s (%llu bytes), not anchor 5's", k ? 7 : 0,
                     store_plan_kind_name(q.kind), (unsigned long long)q.bytes);
    }
    unlink(out);
    TU_OK(store_materialize(s, 6, 0, NULL, out));
    tu_assert_same_file(out, files[5]);
    /* From a version held after the anchor: that version and the chain's
     * deltas after it, nothing from the anchor. */
    store_plan q;
    TU_OK(store_plan_make(s, 2, 4, &q));
    if (q.kind != STORE_PLAN_CHAIN || q.nsteps != 2 || q.steps[0] != 3 || q.steps[1] != 4)
        fail_msg("the plan from version 2 to 4 is %s with %zu steps, not the chain 3, 4",
                 store_plan_kind_name(q.kind), (size_t)q.nsteps);
    unlink(out);
    TU_OK(store_materialize(s, 4, 2, files[1], out));
    tu_assert_same_file(out, files[3]);
    /* A squash in the cache that rebuilds another model (a valid delta from
     * version 2 to a stranger) is refused by the manifest's digest. */
    char other[4200], sq[4200];
    snprintf(other, sizeof other, "%s/cross-other.st", tu_tmpdir());
    TU_OK(ckpt_step(files[1], other, 1e-3, 1, 99));
    TU_OK(store_squash_path(s, 2, 4, sq, sizeof sq));
    TU_OK(delta_make(files[1], other, sq, &(delta_opts){0}, NULL));
    TU_OK(store_plan_make(s, 2, 4, &q));
    assert_int_equal(q.kind, STORE_PLAN_SQUASH);
    unlink(out);
    TU_ERR(store_materialize(s, 4, 2, files[1], out), SH_EMISMATCH, "model_xxh3");
    assert_false(sh_path_exists(out));
    TU_ERR(store__cross_delta(s, 5, 6, &bytes), SH_EINVAL, "does not cross version 6's anchor 5");
    TU_ERR(store__cross_delta(s, 4, 9, &bytes), SH_ENOENT, "no version 9");
    /* gc keeping versions 5 and 6 (anchor 5) removes the squashed deltas
     * that start before version 5: nothing can apply them any more. */
    uint64_t removed = 0;
    TU_OK(store_gc(s, 2, &removed));
    assert_int_equal(removed, 4);
    static const uint64_t gone[][2] = {{2, 4}, {4, 6}, {0, 6}};
    for (int k = 0; k < 3; k++) {
        TU_OK(store_squash_path(s, gone[k][0], gone[k][1], sq, sizeof sq));
        if (sh_path_exists(sq)) fail_msg("gc down to version 5 kept the squash %s", sq);
    }
    store_close(s);
}

/* A publish whose staging folder cannot be made (here its path leads
 * nowhere: a dangling link) fails there, saying "mkdir" and the folder, and
 * LATEST does not move; from a file and from memory. */
static void test_publish_staging_unmakeable(void **state)
{
    char root[4096], staging[4200], gone[4200];
    snprintf(root, sizeof root, "%s", tu_path("props-nostage"));
    sh_rm_rf(root);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    snprintf(staging, sizeof staging, "%s/main/staging", root);
    snprintf(gone, sizeof gone, "%s/gone/staging", root);
    TU_OK(sh_rm_rf(staging));
    assert_int_equal(symlink(gone, staging), 0);
    TU_OK(ckpt_synth(tu_path("nostage.st"), 2000, 51));
    size_t n;
    uint8_t *img = tu_read_file(tu_path("nostage.st"), &n);
    store_mem_version in = {.image = img, .image_len = n};
    uint64_t v = 0, latest = 9;
    char want[4300];
    snprintf(want, sizeof want, "mkdir %s/0000000001.", staging);
    TU_ERR(store_publish_mem(s, &in, NULL, &v), SH_ENOENT, want);
    TU_ERR(store_publish(s, tu_path("nostage.st"), NULL, &v), SH_ENOENT, want);
    TU_OK(store_latest(s, &latest));
    assert_int_equal(latest, 0);
    free(img);
    store_close(s);
}

/* A manifest's payload and model digests are required, as 32 hex digits:
 * one missing or unreadable is refused naming it (a delta too, whose
 * digests no other field repeats).  A version folder without its manifest
 * is named as such; a version past LATEST without a folder was never
 * published.  A head cache that lost its file is rebuilt; a publish on a
 * chain that cannot be read whole is an anchor; verify names a payload it
 * cannot read as unreadable. */
static void test_manifest_digests_required(void **state)
{
    static const char *h = "0123456789abcdef0123456789abcdef";
    static const struct {
        const char *x, *mx, *field;
    } rows[] = {
        {NULL, "\"model_xxh3\":\"%s\",", "\"xxh3\""},
        {"\"xxh3\":\"0123456789abcdef0123456789abcdeg\",", "\"model_xxh3\":\"%s\",", "\"xxh3\""},
        {"\"xxh3\":\"%s\",", NULL, "\"model_xxh3\""},
        {"\"xxh3\":\"%s\",", "\"model_xxh3\":\"0123\",", "\"model_xxh3\""},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char x[128] = "", mx[128] = "", m[1024];
        if (rows[i].x) snprintf(x, sizeof x, rows[i].x, h);
        if (rows[i].mx) snprintf(mx, sizeof mx, rows[i].mx, h);
        snprintf(m, sizeof m,
                 "{\"format\":\"shoal-version/1\",\"run\":\"main\",\"version\":3,\"kind\":\"delta\",\"base\":2,"
                 "\"file\":\"delta.shd\",\"size\":10,%s%s\"model_size\":20,\"created_at\":1}", x, mx);
        store_version v;
        int rc = store_manifest_parse(m, "main", &v);
        if (rc != SH_EFORMAT || !strstr(sh_errmsg(), rows[i].field))
            fail_msg("%s: %d \"%s\", expected a refusal naming %s", m, rc, sh_errmsg(), rows[i].field);
    }
    char root[4096], dir[4200];
    snprintf(root, sizeof root, "%s", tu_path("props-manifest"));
    sh_rm_rf(root);
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    TU_OK(ckpt_synth(tu_path("pmf.st"), 500, 61));
    uint64_t v;
    TU_OK(store_publish(s, tu_path("pmf.st"), NULL, &v));
    for (int k = 2; k <= 4; k++) {
        char a[32], b[32];
        snprintf(a, sizeof a, k == 2 ? "pmf.st" : "pmf%d.st", k - 1);
        snprintf(b, sizeof b, "pmf%d.st", k);
        char pa[4096];
        snprintf(pa, sizeof pa, "%s", tu_path(a));
        TU_OK(ckpt_step(pa, tu_path(b), 1e-3, 1, (uint64_t)(60 + k)));
    }
    TU_OK(store_publish(s, tu_path("pmf2.st"), NULL, &v));
    /* The head cache (the newest checkpoint, named by cache/head.json) lost
     * its file: the next delta is made on a rebuilt one. */
    char cache[4200], out[4200];
    snprintf(cache, sizeof cache, "%s/main/cache/head.safetensors", root);
    assert_int_equal(unlink(cache), 0);
    TU_OK(store_publish(s, tu_path("pmf3.st"), NULL, &v));
    store_version m;
    TU_OK(store_get(s, 3, &m, NULL));
    assert_false(m.anchor);
    snprintf(out, sizeof out, "%s.out3", root);
    TU_OK(store_materialize(s, 3, 0, NULL, out));
    tu_assert_same_file(out, tu_path("pmf3.st"));
    /* A publish after a chain that cannot be read back whole (version 3's
     * delta cut short) is an anchor: a delta on it could never be applied. */
    char pay[4096];
    TU_OK(store_payload_path(s, 3, pay, sizeof pay));
    assert_int_equal(truncate(pay, (off_t)m.size - 1), 0);
    TU_OK(store_publish(s, tu_path("pmf4.st"), NULL, &v));
    TU_OK(store_get(s, 4, &m, NULL));
    if (!m.anchor) fail_msg("version 4, published on a chain whose delta 3 is cut short, is a delta");
    /* A payload of the manifest's size that cannot be read (a folder in its
     * place, the manifest's size made the folder's) fails verification as
     * unreadable, not as a digest mismatch. */
    TU_OK(sh_rm_rf(pay));
    TU_OK(sh_mkdir_p(pay, 0755));
    struct stat st;
    assert_int_equal(stat(pay, &st), 0);
    char man[4200];
    snprintf(man, sizeof man, "%s/main/versions/0000000003/manifest.json", root);
    json_t *j = json_load_file(man, 0, NULL);
    assert_non_null(j);
    json_object_set_new(j, "size", json_integer((json_int_t)st.st_size));
    assert_int_equal(json_dump_file(j, man, JSON_COMPACT), 0);
    json_decref(j);
    int rc = store_verify(s, 3);
    if (rc >= 0 || rc == SH_EMISMATCH || !strstr(sh_errmsg(), strerror(EISDIR)))
        fail_msg("verify of an unreadable payload: %d \"%s\", expected a read failure", rc, sh_errmsg());
    snprintf(dir, sizeof dir, "%s/main/versions/0000000006", root);
    TU_OK(sh_mkdir_p(dir, 0755));
    TU_ERR(store_get(s, 6, &m, NULL), SH_ENOENT, "0000000006/manifest.json is missing");
    TU_ERR(store_get(s, 7, &m, NULL), SH_ENOENT, "has no version 7 (LATEST is 4)");
    store_close(s);
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Publishing a sharded folder (its delta versions patch the head cache in
 * place) leaves no descriptor open: a publisher runs for days. */
static void test_publish_folder_no_descriptor_left(void **state)
{
    char root[4096], f[3][4096];
    snprintf(root, sizeof root, "%s", tu_path("props-fold"));
    sh_rm_rf(root);
    ckpt_family_opts fo = {.layers = 1, .experts = 2, .shrink = 16, .vocab = 512, .shards = 2, .seed = 71};
    for (int k = 0; k < 3; k++) {
        char n[64];
        snprintf(n, sizeof n, "props-fold%d", k);
        snprintf(f[k], sizeof f[k], "%s", tu_path(n));
        sh_rm_rf(f[k]);
        if (k == 0) TU_OK(ckpt_family_write("qwen3-30b-a3b", &fo, f[0], NULL));
        else TU_OK(ckpt_family_next(f[k - 1], f[k], &(ckpt_train_opts){.lr = 1e-5, .seed = (uint64_t)k}, NULL));
    }
    store *s;
    TU_OK(store_open(root, NULL, 1, &s));
    uint64_t v;
    TU_OK(store_publish(s, f[0], NULL, &v));
    TU_OK(store_publish(s, f[1], NULL, &v));
    int before = open_fds();
    TU_OK(store_publish(s, f[2], NULL, &v)); /* patches the cache holding version 2 */
    int after = open_fds();
    if (after != before) fail_msg("a folder's delta publish left %d descriptors open", after - before);
    store_version m;
    TU_OK(store_get(s, 3, &m, NULL));
    assert_false(m.anchor);
    store_close(s);
    /* A run whose head cache cannot be made (a file in the way) still
     * publishes a delta on its anchor, and both versions read back whole. */
    char cache[4200], out[4200];
    sh_rm_rf(root);
    TU_OK(store_open(root, NULL, 1, &s));
    snprintf(cache, sizeof cache, "%s/main/cache", root);
    tu_write_file(cache, "x", 1);
    TU_OK(store_publish(s, f[0], NULL, &v));
    TU_OK(store_publish(s, f[1], NULL, &v));
    for (uint64_t k = 1; k <= 2; k++) {
        TU_OK(store_verify(s, k));
        snprintf(out, sizeof out, "%s.out%llu", root, (unsigned long long)k);
        TU_OK(store_materialize(s, k, 0, NULL, out));
    }
    store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_compare_whole),
        cmocka_unit_test(test_digest_parse_exact),
        cmocka_unit_test(test_run_name_bounds),
        cmocka_unit_test(test_latest_fields_required),
        cmocka_unit_test(test_published_modes),
        cmocka_unit_test(test_publish_mem_needs_image),
        cmocka_unit_test(test_publish_mem_anchor_rule),
        cmocka_unit_test(test_push_root_offers_later_versions),
        cmocka_unit_test(test_pushed_version_digest_checked),
        cmocka_unit_test(test_staged_version_digest_checked),
        cmocka_unit_test(test_pushed_version_size_checked),
        cmocka_unit_test(test_squash_is_the_chain),
        cmocka_unit_test(test_publish_path_never_truncated),
        cmocka_unit_test(test_publisher_claim),
        cmocka_unit_test(test_materialize_damaged_step),
        cmocka_unit_test(test_materialize_across_anchor),
        cmocka_unit_test(test_publish_default_anchor_period),
        cmocka_unit_test(test_publish_staging_unmakeable),
        cmocka_unit_test(test_manifest_digests_required),
        cmocka_unit_test(test_publish_folder_no_descriptor_left),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
