/* Properties of a replica's activation and of a push root that the
 * generated mutants (scripts/mutgen.py, docs/testing.md) found no test
 * held.  Everything runs in this process: a push root (store_push_root)
 * stepped on a thread, push replicas attached to it over UCX on loopback,
 * and an interposed open() that fails where a test says.
 *  - a push root offers every version published after what it offered,
 *    also when the store's squash cache holds a squash from its position
 *    (made by `shoal store squash` or another root): it never stalls; a
 *    root on a sound store, or on a run with no version yet, says nothing,
 *    and one whose store cannot be read says why;
 *  - a failed step runs the node for the time asked, not twice that;
 *  - a damaged payload repaired in place within the same second is
 *    hashed again and offered;
 *  - a late joiner two or more deltas behind gets one squashed delta
 *    (fewer bytes than the chain); a joiner below the anchor gets the
 *    anchor when the delta across it is more bytes; a joiner with nothing
 *    activates the newest version first; each ends on the exact bytes;
 *  - a push replica never recycles the file of a version a lease still
 *    reads: the lease keeps its bytes and the next version is built
 *    anyway; an unleased file is recycled;
 *  - a pushed version that fails for want of memory is tried again after
 *    pauses that double, and taken;
 *  - a version served but not durable (ACTIVE cannot be replaced) keeps
 *    its model file and reports no durable time; a version whose FP8 copy
 *    cannot be opened is never activated;
 *  - a restarted replica reports the activation time ACTIVE recorded and
 *    removes the files it does not serve, but no hidden file. */
#include "testutil.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/bcast.h"
#include "shoal/ckpt.h"
#include "shoal/store.h"
#include "weights/store/replica_int.h"

/* ---- Failing opens ------------------------------------------------------------
 * This binary interposes open() (the library is linked into it, so its
 * calls come here first): while armed, opening a path that contains one of
 * FO.pat fails with FO.err, as a kernel out of memory (ENOMEM) or a failed
 * disk would fail it; FO.hits counts those. */
static struct {
    pthread_mutex_t mu;
    char pat[2][256];
    int err, hits;
} FO = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int (*real_open)(const char *, int, ...);

static int open_fails(const char *path)
{
    pthread_mutex_lock(&FO.mu);
    int fail = 0;
    for (int i = 0; i < 2; i++) fail |= FO.pat[i][0] && strstr(path, FO.pat[i]) != NULL;
    if (fail) FO.hits++;
    int e = FO.err;
    pthread_mutex_unlock(&FO.mu);
    if (fail) errno = e;
    return fail;
}

static int fo_open(const char *path, int flags, va_list ap, const char *name)
{
    mode_t mode = flags & (O_CREAT | O_TMPFILE) ? va_arg(ap, mode_t) : 0;
    if (open_fails(path)) return -1;
    if (!real_open) real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, name);
    return real_open(path, flags, mode);
}

int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int r = fo_open(path, flags, ap, "open");
    va_end(ap);
    return r;
}

int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int r = fo_open(path, flags, ap, "open64");
    va_end(ap);
    return r;
}

/* Fails the opens of paths containing a (and b, when given) with err. */
static void fo_arm(const char *a, const char *b, int err)
{
    pthread_mutex_lock(&FO.mu);
    snprintf(FO.pat[0], sizeof FO.pat[0], "%s", a);
    snprintf(FO.pat[1], sizeof FO.pat[1], "%s", b ? b : "");
    FO.err = err;
    FO.hits = 0;
    pthread_mutex_unlock(&FO.mu);
}

static int fo_disarm(void)
{
    pthread_mutex_lock(&FO.mu);
    FO.pat[0][0] = FO.pat[1][0] = 0;
    int n = FO.hits;
    pthread_mutex_unlock(&FO.mu);
    return n;
}

/* ---- Warnings ---------------------------------------------------------- */

static pthread_mutex_t warn_mu = PTHREAD_MUTEX_INITIALIZER;
static char warn_buf[16384];
static size_t warn_len;

static void warn_sink(int level, const char *line, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&warn_mu);
    if (level <= SH_LOG_WARN && warn_len + strlen(line) + 2 < sizeof warn_buf)
        warn_len += (size_t)snprintf(warn_buf + warn_len, sizeof warn_buf - warn_len, "%s\n", line);
    pthread_mutex_unlock(&warn_mu);
}

static void warn_start(void)
{
    pthread_mutex_lock(&warn_mu);
    warn_len = 0;
    warn_buf[0] = 0;
    pthread_mutex_unlock(&warn_mu);
    sh_log_set_sink(warn_sink, NULL);
}

/* Lines captured since warn_start() that start with `prefix`. */
static int warn_count(const char *prefix, char *copy, size_t cap)
{
    int n = 0;
    pthread_mutex_lock(&warn_mu);
    for (const char *l = warn_buf; *l;) {
        const char *e = strchr(l, '\n');
        if (!strncmp(l, prefix, strlen(prefix))) n++;
        l = e ? e + 1 : l + strlen(l);
    }
    if (copy) snprintf(copy, cap, "%s", warn_buf);
    pthread_mutex_unlock(&warn_mu);
    return n;
}

static void warn_stop(void) { sh_log_set_sink(NULL, NULL); }

/* ---- A store, a root, replicas ------------------------------------------ */

/* Checkpoint NAME (in the scratch folder): k = 0 a fresh model (seed),
 * else one small step from NAME's previous one. */
static const char *ck(const char *tag, int k)
{
    static char p[8][4096];
    static int slot;
    char *out = p[slot++ % 8];
    char name[64];
    snprintf(name, sizeof name, "%s%d.st", tag, k);
    snprintf(out, 4096, "%s", tu_path(name));
    return out;
}

static void make_cks(const char *tag, int n, uint64_t seed)
{
    TU_OK(ckpt_synth(ck(tag, 1), 60000, seed));
    for (int k = 2; k <= n; k++) TU_OK(ckpt_step(ck(tag, k - 1), ck(tag, k), 1e-3, 1, seed + (uint64_t)k));
}

/* A checkpoint of one BF16 tensor of 60000 random finite values (every
 * bit pattern but infinities and NaNs). */
static void noise_ckpt(const char *path, uint64_t seed)
{
    enum { N = 60000 };
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[%d],\"data_offsets\":[0,%d]}}", N, 2 * N);
    while (n % 8) hdr[n++] = ' ';
    size_t len = 8 + (size_t)n + 2 * N;
    uint8_t *buf = calloc(1, len);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, hdr, (size_t)n);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < N; i++) {
        uint16_t w;
        do {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            w = (uint16_t)x;
        } while ((w & 0x7f80) == 0x7f80); /* no infinity, no NaN */
        buf[8 + (size_t)n + 2 * i] = (uint8_t)w;
        buf[8 + (size_t)n + 2 * i + 1] = (uint8_t)(w >> 8);
    }
    tu_write_file(path, buf, len);
    free(buf);
}

static void publish(store *s, const char *path, uint64_t anchor_every, uint64_t want)
{
    uint64_t v = 0;
    TU_OK(store_publish(s, path, &(store_publish_opts){.anchor_every = anchor_every}, &v));
    assert_int_equal(v, want);
}

typedef struct {
    store_push_root *r;
    pthread_t th;
    atomic_int stop;
} root_t;

static void *root_main(void *arg)
{
    root_t *t = arg;
    while (!atomic_load(&t->stop)) store_push_root_step(t->r, 0.05);
    return NULL;
}

static void root_start(root_t *t, const char *store_root)
{
    bcast_config bc = {.chunk_size = 64 << 10};
    TU_OK(store_push_root_new(store_root, NULL, &bc, &t->r));
    atomic_store(&t->stop, 0);
    assert_int_equal(pthread_create(&t->th, NULL, root_main, t), 0);
}

static void root_stop(root_t *t)
{
    atomic_store(&t->stop, 1);
    pthread_join(t->th, NULL);
    store_push_root_free(t->r);
}

static store_replica *push_replica(const char *dir, root_t *t)
{
    store_replica_config cfg = {.dir = dir, .parents = {store_push_root_address(t->r)}, .nparents = 1, .leaf = 1};
    store_replica *x;
    TU_OK(store_replica_open(&cfg, &x));
    return x;
}

/* A replica at `dir` that took version v from the store (whose LATEST
 * names v now), closed again. */
static void seed_replica(const char *dir, const char *store_root, uint64_t v)
{
    sh_rm_rf(dir);
    store_replica_config cfg = {.dir = dir, .store = store_root, .poll_s = 0.01};
    store_replica *x;
    TU_OK(store_replica_open(&cfg, &x));
    TU_OK(store_replica_wait(x, v, 30));
    store_replica_close(x);
}

/* The replica serves version v with exactly the bytes of `path`. */
static void serves(store_replica *x, uint64_t v, const char *path)
{
    store_lease l;
    TU_OK(store_replica_acquire(x, v, v, &l));
    size_t n;
    uint8_t *want = tu_read_file(path, &n);
    assert_int_equal(l.size, n);
    if (memcmp(l.data, want, n))
        fail_msg("version %llu is served with other bytes than %s", (unsigned long long)v, path);
    free(want);
    store_replica_release(x, &l);
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

/* ---- The shared tree -------------------------------------------------------
 * One store (versions 1.. of one model, deltas after the anchor 1), one
 * root stepped on a thread, and the replicas below, used by the tests in
 * order: L takes every version as it is published, J joins late on
 * version 1, F joins with nothing. */
static struct {
    char sr[4096], ldir[4096], jdir[4096], fdir[4096];
    store *s;
    root_t t;
    store_replica *L;
    ino_t ino[8]; /* L's model file of each version */
} T;

static void root_pause(root_t *t)
{
    atomic_store(&t->stop, 1);
    pthread_join(t->th, NULL);
}

static void root_resume(root_t *t)
{
    atomic_store(&t->stop, 0);
    assert_int_equal(pthread_create(&t->th, NULL, root_main, t), 0);
}

static ino_t model_ino(const char *dir, int v)
{
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s/models/%010d.safetensors", dir, v);
    return stat(p, &st) == 0 ? st.st_ino : 0;
}

static int tree_setup(void **state)
{
    snprintf(T.sr, sizeof T.sr, "%s", tu_path("tree"));
    snprintf(T.ldir, sizeof T.ldir, "%s", tu_path("tree-L"));
    snprintf(T.jdir, sizeof T.jdir, "%s", tu_path("tree-J"));
    snprintf(T.fdir, sizeof T.fdir, "%s", tu_path("tree-F"));
    sh_rm_rf(T.sr), sh_rm_rf(T.ldir), sh_rm_rf(T.fdir);
    make_cks("c", 8, 31);
    TU_OK(store_open(T.sr, NULL, 1, &T.s));
    publish(T.s, ck("c", 1), 8, 1);
    seed_replica(T.jdir, T.sr, 1);
    warn_start();
    root_start(&T.t, T.sr);
    T.L = push_replica(T.ldir, &T.t);
    return 0;
}

static int tree_teardown(void **state)
{
    store_replica_close(T.L);
    root_stop(&T.t);
    store_close(T.s);
    warn_stop();
    return 0;
}

/* A pushed payload is taken only when its manifest names it: the node
 * checked the bytes against the OFFER's size and xxh3, and an anchor is
 * then adopted without hashing again, so a manifest naming other bytes
 * (another version, kind, size or digest) must be refused, each field
 * alone; a squash's manifest is its target's and is not compared. */
static void test_pushed_manifest_names_the_payload(void **state)
{
    store_version v = {.version = 7, .anchor = 1, .size = 4096, .model_size = 4096};
    v.xxh3 = v.model_xxh3 = sh_hash128_of("payload", 7);
    bcast_object_info o = {.version = 7, .is_anchor = 1, .size = 4096, .hash = v.xxh3};
    TU_OK(store__pushed_names("r", &v, &o));
    bcast_object_info bad[5] = {o, o, o, o, o};
    bad[0].version = 6;
    bad[1].is_anchor = 0;
    bad[2].size = 4095;
    bad[3].hash.lo ^= 1;
    bad[4].hash.hi ^= 1ull << 63;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(store__pushed_names("r", &v, &bad[i]), SH_EMISMATCH);
        if (!strstr(sh_errmsg(), "its manifest names another payload")) fail_msg("case %d: %s", i, sh_errmsg());
    }
}

/* A push replica recycles the file of the version an activation replaced
 * for the next delta's result (the double buffer), but never while a lease
 * still reads that version: here a lease on version 1 is held while 2 and
 * 3 activate.  Version 3 is built in a new file, and the lease keeps the
 * exact bytes of version 1. */
static void test_leased_file_never_recycled(void **state)
{
    TU_OK(store_replica_wait(T.L, 1, 30));
    store_lease l1;
    TU_OK(store_replica_acquire(T.L, 1, 1, &l1));
    for (int v = 2; v <= 3; v++) {
        publish(T.s, ck("c", v), 8, (uint64_t)v);
        int rc = store_replica_wait(T.L, (uint64_t)v, 30);
        if (rc < 0) fail_msg("version %d was not activated while a lease held version 1: %s", v, sh_errmsg());
        T.ino[v] = model_ino(T.ldir, v);
    }
    serves(T.L, 3, ck("c", 3));
    size_t n;
    uint8_t *want = tu_read_file(ck("c", 1), &n);
    assert_int_equal(l1.size, n);
    if (memcmp(l1.data, want, n)) fail_msg("the lease on version 1 reads other bytes after versions 2 and 3");
    free(want);
    store_replica_release(T.L, &l1);
}

/* The root, at version 3, finds versions 4 and 5 published and a squash
 * 3 -> 5 in the store's cache (`shoal store squash`, or another root
 * serving a joiner): its plan from 3 is that squash, which is no plan for
 * the node (it needs every version).  It offered version 1 again, which
 * the node refused, and stayed on version 3 for ever, warning twice a
 * second.  It offers 4 and 5; the replica takes them, into the file of an
 * earlier version (no lease now), exact. */
static void test_push_root_offers_past_a_cached_squash(void **state)
{
    root_pause(&T.t);
    publish(T.s, ck("c", 4), 8, 4);
    publish(T.s, ck("c", 5), 8, 5);
    TU_OK(store_squash(T.s, 3, 5, NULL));
    store_plan *p = malloc(sizeof *p);
    TU_OK(store_plan_make(T.s, 3, 5, p));
    assert_int_equal(p->kind, STORE_PLAN_SQUASH);
    free(p);
    root_resume(&T.t);
    int rc = store_replica_wait(T.L, 5, 30);
    char said[16384];
    warn_count("", said, sizeof said);
    if (rc < 0) fail_msg("versions 4 and 5 never reached the replica: %s\nwarnings:\n%s", sh_errmsg(), said);
    serves(T.L, 5, ck("c", 5));
    /* Version 4 was built in memory only when version 5 was announced
     * first; either way version 5 went into a recycled file. */
    ino_t i5 = model_ino(T.ldir, 5);
    if (i5 != T.ino[2] && i5 != T.ino[3]) fail_msg("version 5 is in a new file, not the one of version 2 or 3");
    char m5[4200];
    snprintf(m5, sizeof m5, "%s/models/%010d.safetensors", T.ldir, 5);
    tu_assert_same_file(m5, ck("c", 5));
}

/* J, on version 1, joins the root at version 5 (2..5 deltas): it is sent
 * one squashed delta 1 -> 5, fewer bytes than the chain, and ends on the
 * exact bytes of version 5. */
static void test_joiner_gets_one_squash(void **state)
{
    uint64_t chain = 0;
    for (uint64_t v = 2; v <= 5; v++) {
        store_version m;
        TU_OK(store_get(T.s, v, &m, NULL));
        assert_false(m.anchor);
        chain += m.size;
    }
    store_replica *x = push_replica(T.jdir, &T.t);
    int rc = store_replica_wait(x, 5, 30);
    store_replica_info info;
    store_replica_get_info(x, &info);
    if (rc < 0) fail_msg("the joiner did not reach version 5: %s", sh_errmsg());
    serves(x, 5, ck("c", 5));
    store_replica_close(x);
    char sq[4096];
    TU_OK(store_squash_path(T.s, 1, 5, sq, sizeof sq));
    if (!sh_path_exists(sq)) fail_msg("the root made no squash 1 -> 5 for the joiner");
    uint64_t squashed = file_size(sq);
    print_message("joiner at v1: %llu bytes received, the squash %llu, the chain %llu\n",
                  (unsigned long long)info.push.bytes_received, (unsigned long long)squashed,
                  (unsigned long long)chain);
    assert_true(squashed < chain);
    assert_int_equal(info.push.bytes_received, squashed);
    assert_int_equal(info.failures, 0);
}

/* F joins with nothing: the anchor 1 and the deltas to 5 are built in
 * memory (a newer version is announced) and version 5 is the first and
 * only one activated, exact.  No step of the tree so far gave the root
 * anything to warn about. */
static void test_fresh_joiner_activates_newest(void **state)
{
    store_replica *x = push_replica(T.fdir, &T.t);
    int rc = store_replica_wait(x, 5, 30);
    store_replica_info info;
    store_replica_get_info(x, &info);
    if (rc < 0) fail_msg("the fresh joiner did not reach version 5: %s", sh_errmsg());
    serves(x, 5, ck("c", 5));
    store_replica_close(x);
    assert_int_equal(info.failures, 0);
    assert_int_equal(info.activations, 1);
    char said[16384];
    int n = warn_count("push root:", said, sizeof said);
    if (n) fail_msg("a push root on a sound store warned %d times:\n%s", n, said);
}

/* A push root whose store cannot be read (LATEST unparsable) says why,
 * and a failed step runs the node for the time asked (at least 0.5 s),
 * not that and again the time asked; a replica reading that store pauses
 * between its tries. */
static void test_push_root_says_why(void **state)
{
    root_pause(&T.t);
    /* S follows the store itself (polling every 10 ms). */
    char sdir[4096];
    snprintf(sdir, sizeof sdir, "%s", tu_path("tree-S"));
    sh_rm_rf(sdir);
    store_replica_config cfg = {.dir = sdir, .store = T.sr, .poll_s = 0.01};
    store_replica *x;
    TU_OK(store_replica_open(&cfg, &x));
    TU_OK(store_replica_wait(x, 5, 30));
    store_replica_info a, b;
    store_replica_get_info(x, &a);
    char latest[4200];
    snprintf(latest, sizeof latest, "%s/main/LATEST", T.sr);
    size_t len;
    uint8_t *good = tu_read_file(latest, &len);
    tu_write_file(latest, "{\"format\":", 10);
    warn_start();
    double t0 = sh_now_mono();
    TU_OK(store_push_root_step(T.t.r, 0.8));
    double took = sh_now_mono() - t0;
    char said[16384];
    int n = warn_count("push root:", said, sizeof said);
    store_replica_get_info(x, &b);
    tu_write_file(latest, good, len);
    free(good);
    store_replica_close(x);
    /* The replica reading the store fails too, but tries again after
     * pauses that double (0.1, 0.2, 0.4 s: 4 tries in 0.8 s), not at every
     * poll (80). */
    int tries = (int)(b.failures - a.failures);
    if (tries < 1 || tries > 6) fail_msg("a store replica tried an unreadable LATEST %d times in %.2f s", tries, took);
    if (n != 1 || !strstr(said, "LATEST")) fail_msg("a step on an unreadable LATEST said it %d times:\n%s", n, said);
    if (took < 0.75 || took > 1.45) fail_msg("a failed step of 0.8 s ran the node %.2f s", took);
}

/* A damaged payload is hashed again only once its file changes: a repair
 * in place within the same second (same inode, same size, the time
 * differing in nanoseconds only) is a change, and the version is offered. */
static void test_push_root_sees_a_repair_within_a_second(void **state)
{
    publish(T.s, ck("c", 6), 8, 6);
    char pay[4096];
    TU_OK(store_payload_path(T.s, 6, pay, sizeof pay));
    int fd = open(pay, O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    off_t at = st.st_size / 2;
    uint8_t b, bad;
    assert_int_equal(pread(fd, &b, 1, at), 1);
    bad = (uint8_t)(b ^ 0x40);
    struct timespec tm[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec, 100000000}};
    assert_int_equal(pwrite(fd, &bad, 1, at), 1);
    assert_int_equal(futimens(fd, tm), 0);
    warn_start();
    TU_OK(store_push_root_step(T.t.r, 0.01));
    char said[16384];
    int n = warn_count("push root:", said, sizeof said);
    if (n != 1 || !strstr(said, "hashes to")) fail_msg("a step on a damaged payload said it %d times:\n%s", n, said);
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
    tm[1].tv_nsec = 200000000;
    assert_int_equal(futimens(fd, tm), 0);
    close(fd);
    root_resume(&T.t);
    int rc = store_replica_wait(T.L, 6, 20);
    if (rc < 0) fail_msg("the payload repaired within the same second was never offered: %s", sh_errmsg());
    serves(T.L, 6, ck("c", 6));
}

/* A pushed version whose build fails for want of memory (here the kernel
 * refuses to open its model file, ENOMEM) is not sent again by the tree:
 * the replica tries it again after a pause that doubles (0.1, 0.2, 0.4 s
 * ...: 4 tries in the second from the first, not 10), and takes it once it
 * can. */
static void test_pushed_version_retried_without_memory(void **state)
{
    store_replica_info before, after;
    store_replica_get_info(T.L, &before);
    fo_arm("tree-L/models/0000000007.safetensors", NULL, ENOMEM);
    publish(T.s, ck("c", 7), 8, 7);
    /* The second from the first try on. */
    for (double end = sh_now_mono() + 20; sh_now_mono() < end; sh_sleep(0.005)) {
        pthread_mutex_lock(&FO.mu);
        int hits = FO.hits;
        pthread_mutex_unlock(&FO.mu);
        if (hits) break;
    }
    sh_sleep(1.0);
    int tries = fo_disarm();
    int rc = store_replica_wait(T.L, 7, 10);
    store_replica_get_info(T.L, &after);
    if (rc < 0) fail_msg("version 7 was not taken after %d tries without memory: %s", tries, sh_errmsg());
    serves(T.L, 7, ck("c", 7));
    print_message("%d tries in the second from the first without memory\n", tries);
    if (tries < 2 || tries > 5) fail_msg("%d tries in the second from the first without memory (expected 2..5)", tries);
    assert_int_equal(after.failures - before.failures, (uint64_t)tries);
}

/* G joins with nothing while the root holds version 8, whose payload G
 * cannot receive (its spool file cannot be opened; nor can the root make
 * a squash, so G gets the chain): G builds versions 1 to 7 in memory on
 * the way to 8, and once the tree is quiet it activates 7.
 * Its ACTIVE cannot be replaced (a folder holds the name), so version 7 is
 * served but not durable: its model file stays (it is the one served, and
 * the one a later activation keeps as the previous version). */
static void test_staged_version_served_keeps_its_file(void **state)
{
    char gdir[4096], act[4200], m7[4200];
    snprintf(gdir, sizeof gdir, "%s", tu_path("tree-G"));
    sh_rm_rf(gdir);
    snprintf(act, sizeof act, "%s/ACTIVE/x", gdir);
    TU_OK(sh_mkdir_p(act, 0755));
    publish(T.s, ck("c", 8), 8, 8);
    TU_OK(store_replica_wait(T.L, 8, 30));
    fo_arm("tree-G/spool/v8.part", "tree/main/squash/", EIO);
    store_replica *x = push_replica(gdir, &T.t);
    store_replica_info info;
    for (double end = sh_now_mono() + 20;; sh_sleep(0.01)) {
        store_replica_get_info(x, &info);
        if ((info.version == 7 && info.failures) || sh_now_mono() > end) break;
    }
    int refused = fo_disarm();
    if (info.version != 7 || !info.failures)
        fail_msg("G (v8 refused %d times) serves v%llu with %llu failures: %s", refused,
                 (unsigned long long)info.version, (unsigned long long)info.failures, info.last_error);
    if (!strstr(info.last_error, "not durable")) fail_msg("the failure does not say so: %s", info.last_error);
    snprintf(m7, sizeof m7, "%s/models/%010d.safetensors", gdir, 7);
    if (!sh_path_exists(m7)) fail_msg("version 7 is served but its model file %s was removed", m7);
    tu_assert_same_file(m7, ck("c", 7));
    serves(x, 7, ck("c", 7));
    store_replica_close(x);
}

/* A replica on version 1 joins a root whose newest version 2 is an anchor
 * of another model: the delta across the anchor is more bytes than the
 * anchor itself, so the joiner gets the anchor. */
static void test_joiner_below_anchor_gets_the_cheaper(void **state)
{
    char sr[4096], dir[4096];
    snprintf(sr, sizeof sr, "%s", tu_path("sq-below"));
    snprintf(dir, sizeof dir, "%s", tu_path("sq-below-rep"));
    sh_rm_rf(sr);
    /* Random bits: no delta between two of them is smaller than either. */
    noise_ckpt(ck("b", 1), 61);
    noise_ckpt(ck("bb", 1), 62);
    store *s;
    TU_OK(store_open(sr, NULL, 1, &s));
    publish(s, ck("b", 1), 8, 1);
    seed_replica(dir, sr, 1);
    publish(s, ck("bb", 1), 1, 2);
    store_version m2;
    TU_OK(store_get(s, 2, &m2, NULL));
    assert_true(m2.anchor);
    root_t t;
    root_start(&t, sr);
    store_replica *x = push_replica(dir, &t);
    int rc = store_replica_wait(x, 2, 30);
    store_replica_info info;
    store_replica_get_info(x, &info);
    if (rc < 0) fail_msg("the joiner did not reach version 2: %s", sh_errmsg());
    serves(x, 2, ck("bb", 1));
    store_replica_close(x);
    root_stop(&t);
    char cross[4096];
    TU_OK(store_squash_path(s, 1, 2, cross, sizeof cross));
    store_close(s);
    uint64_t cb = sh_path_exists(cross) ? file_size(cross) : 0;
    print_message("joiner at v1, v2 an anchor of %llu bytes: %llu bytes received, the delta across it %llu\n",
                  (unsigned long long)m2.size, (unsigned long long)info.push.bytes_received, (unsigned long long)cb);
    assert_true(cb > m2.size);
    assert_int_equal(info.push.bytes_received, m2.size);
}

/* A restarted replica reports the activation time its ACTIVE recorded,
 * not 0 (a version that was never activated), and removes the files in
 * models/ it does not serve, but no hidden one. */
static void test_restart_keeps_activation_time(void **state)
{
    char sr[4096], dir[4096];
    snprintf(sr, sizeof sr, "%s", tu_path("rtime"));
    snprintf(dir, sizeof dir, "%s", tu_path("rtime-rep"));
    sh_rm_rf(sr);
    make_cks("t", 1, 81);
    store *s;
    TU_OK(store_open(sr, NULL, 1, &s));
    publish(s, ck("t", 1), 8, 1);
    store_close(s);
    sh_rm_rf(dir);
    store_replica_config cfg = {.dir = dir, .store = sr, .poll_s = 0.01};
    store_replica *x;
    TU_OK(store_replica_open(&cfg, &x));
    TU_OK(store_replica_wait(x, 1, 30));
    store_replica_info a, b;
    store_replica_get_info(x, &a);
    store_replica_close(x);
    assert_true(a.activated_at > 1e9);
    /* What the restart removes from models/: the replica's leftovers, never
     * a hidden file (NFS keeps a file a process still reads as .nfsNNNN:
     * removing it breaks that reader). */
    char hidden[4200], stray[4200];
    snprintf(hidden, sizeof hidden, "%s/models/.nfs000000000001", dir);
    snprintf(stray, sizeof stray, "%s/models/0000000009.safetensors", dir);
    tu_write_file(hidden, "x", 1);
    tu_write_file(stray, "x", 1);
    cfg.poll_s = 3600;
    TU_OK(store_replica_open(&cfg, &x));
    store_replica_get_info(x, &b);
    store_replica_close(x);
    if (!sh_path_exists(hidden)) fail_msg("a restart removed the hidden file %s", hidden);
    if (sh_path_exists(stray)) fail_msg("a restart left %s, a version it does not serve", stray);
    assert_int_equal(b.version, 1);
    if (fabs(b.activated_at - a.activated_at) > 1e-3)
        fail_msg("restarted on version 1 activated at %.6f, recorded %.6f", b.activated_at, a.activated_at);
}

/* A replica whose ACTIVE cannot be replaced (here a folder holds its name)
 * serves the version it built, verified, but it is not durable: the
 * failure is counted and said, and the timeline has no durable time. */
static void test_unwritable_active_not_durable(void **state)
{
    char sr[4096], dir[4096], act[4200];
    snprintf(sr, sizeof sr, "%s", tu_path("nodur"));
    snprintf(dir, sizeof dir, "%s", tu_path("nodur-rep"));
    sh_rm_rf(sr);
    sh_rm_rf(dir);
    make_cks("n", 1, 91);
    store *s;
    TU_OK(store_open(sr, NULL, 1, &s));
    publish(s, ck("n", 1), 8, 1);
    store_close(s);
    snprintf(act, sizeof act, "%s/ACTIVE/x", dir);
    TU_OK(sh_mkdir_p(act, 0755));
    store_replica_config cfg = {.dir = dir, .store = sr, .poll_s = 0.01};
    store_replica *x;
    TU_OK(store_replica_open(&cfg, &x));
    TU_OK(store_replica_wait(x, 1, 30));
    /* The failure is counted once the activation returns, a moment after
     * waiters see it. */
    store_replica_info info;
    for (double end = sh_now_mono() + 20;; sh_sleep(0.01)) {
        store_replica_get_info(x, &info);
        if (info.failures || sh_now_mono() > end) break;
    }
    serves(x, 1, ck("n", 1));
    store_replica_close(x);
    assert_int_equal(info.version, 1);
    assert_int_equal(info.timeline.version, 1);
    assert_true(info.timeline.active > 0);
    if (info.timeline.durable != 0)
        fail_msg("a version whose ACTIVE failed has durable time %.6f", info.timeline.durable);
    assert_true(info.failures >= 1);
    if (!strstr(info.last_error, "not durable")) fail_msg("the failure does not say so: %s", info.last_error);
}

/* A replica that serves an FP8 copy never activates a version whose FP8
 * copy it cannot open (here the open fails once the copy is built): it
 * keeps serving the version before, says why, and takes the version once
 * the copy opens. */
static void test_fp8_copy_required(void **state)
{
    char sr[4096], dir[4096];
    snprintf(sr, sizeof sr, "%s", tu_path("fp8s"));
    snprintf(dir, sizeof dir, "%s", tu_path("fp8s-rep"));
    sh_rm_rf(sr);
    sh_rm_rf(dir);
    make_cks("f", 2, 85);
    store *s;
    TU_OK(store_open(sr, NULL, 1, &s));
    publish(s, ck("f", 1), 8, 1);
    store_replica_config cfg = {.dir = dir, .store = sr, .poll_s = 0.01, .fp8 = 1};
    store_replica *x;
    TU_OK(store_replica_open(&cfg, &x));
    TU_OK(store_replica_wait(x, 1, 30));
    fo_arm("fp8s-rep/models/0000000002.fp8.safetensors", NULL, EACCES);
    publish(s, ck("f", 2), 8, 2);
    store_close(s);
    store_replica_info info;
    for (double end = sh_now_mono() + 20;; sh_sleep(0.01)) {
        store_replica_get_info(x, &info);
        if (info.failures || info.version != 1 || sh_now_mono() > end) break;
    }
    int tries = fo_disarm();
    if (info.version != 1 || !info.failures || tries < 1)
        fail_msg("with its FP8 copy unopenable, version 2: served %llu, %llu failures, %d opens refused: %s",
                 (unsigned long long)info.version, (unsigned long long)info.failures, tries, info.last_error);
    print_message("version 2 refused: %s\n", info.last_error);
    if (!strstr(info.last_error, "fp8")) fail_msg("the failure does not name the FP8 copy: %s", info.last_error);
    /* It knows version 2 exists (the store's LATEST), though it serves 1. */
    assert_int_equal(info.newest_announced, 2);
    TU_OK(store_replica_wait(x, 2, 30));
    store_lease l;
    TU_OK(store_replica_acquire(x, 2, 2, &l));
    assert_non_null(l.fp8);
    store_replica_release(x, &l);
    store_replica_close(x);
}

/* A push root started before the run's first version (the usual order:
 * the root, then the trainer) waits quietly: a run with no version is no
 * error, and each step runs only the time asked. */
static void test_push_root_waits_quietly_for_a_first_version(void **state)
{
    char sr[4096];
    snprintf(sr, sizeof sr, "%s", tu_path("empty"));
    sh_rm_rf(sr);
    store *s;
    TU_OK(store_open(sr, NULL, 1, &s));
    store_close(s);
    bcast_config bc = {.chunk_size = 64 << 10};
    store_push_root *r;
    TU_OK(store_push_root_new(sr, NULL, &bc, &r));
    warn_start();
    double t0 = sh_now_mono();
    for (int i = 0; i < 3; i++) TU_OK(store_push_root_step(r, 0.01));
    double took = sh_now_mono() - t0;
    char said[16384];
    int n = warn_count("", said, sizeof said);
    warn_stop();
    store_push_root_free(r);
    store_push_root_free(NULL); /* a no-op, as free(NULL) is */
    if (n) fail_msg("a root on a run with no version yet warned:\n%s", said);
    /* A step that waits its pause of 0.5 s would take 1.5 s; the bound
     * leaves a loaded machine room. */
    if (took > 1.2) fail_msg("3 steps of 0.01 s on a run with no version yet took %.2f s", took);
}

/* The image is reloaded with its in-place cache forgotten: M takes
 * version 2 by the push tree (its image and the cache's digests then hold
 * version 2), version 3 from the store while the root is paused (the
 * image is not touched), and version 4, a delta on 3, by the push tree
 * again: the image is reloaded from version 3's file, and the apply must
 * check the delta's base against that, not against digests of version 2
 * (the delta would be refused as on a wrong base, a failure). */
static void test_image_reload_forgets_the_cache(void **state)
{
    char sr[4096], dir[4096];
    snprintf(sr, sizeof sr, "%s", tu_path("fb"));
    snprintf(dir, sizeof dir, "%s", tu_path("fb-M"));
    sh_rm_rf(sr), sh_rm_rf(dir);
    make_cks("f", 4, 77);
    store *s;
    TU_OK(store_open(sr, NULL, 1, &s));
    publish(s, ck("f", 1), 8, 1);
    root_t t;
    root_start(&t, sr);
    store_replica_config cfg = {.dir = dir, .store = sr, .parents = {store_push_root_address(t.r)}, .nparents = 1,
                                .leaf = 1, .poll_s = 0.01};
    store_replica *m;
    TU_OK(store_replica_open(&cfg, &m));
    TU_OK(store_replica_wait(m, 1, 30));
    publish(s, ck("f", 2), 8, 2);
    TU_OK(store_replica_wait(m, 2, 30));
    root_pause(&t);
    publish(s, ck("f", 3), 8, 3);
    TU_OK(store_replica_wait(m, 3, 30));
    root_resume(&t);
    publish(s, ck("f", 4), 8, 4);
    TU_OK(store_replica_wait(m, 4, 30));
    serves(m, 4, ck("f", 4));
    store_replica_info in;
    store_replica_get_info(m, &in);
    store_replica_close(m);
    root_stop(&t);
    store_close(s);
    if (in.failures) fail_msg("%llu failures on the way to version 4 (the last: %s)", (unsigned long long)in.failures,
                              in.last_error);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leased_file_never_recycled),
        cmocka_unit_test(test_push_root_offers_past_a_cached_squash),
        cmocka_unit_test(test_joiner_gets_one_squash),
        cmocka_unit_test(test_fresh_joiner_activates_newest),
        cmocka_unit_test(test_push_root_says_why),
        cmocka_unit_test(test_push_root_sees_a_repair_within_a_second),
        cmocka_unit_test(test_pushed_version_retried_without_memory),
        cmocka_unit_test(test_staged_version_served_keeps_its_file),
        cmocka_unit_test(test_joiner_below_anchor_gets_the_cheaper),
        cmocka_unit_test(test_restart_keeps_activation_time),
        cmocka_unit_test(test_unwritable_active_not_durable),
        cmocka_unit_test(test_fp8_copy_required),
        cmocka_unit_test(test_push_root_waits_quietly_for_a_first_version),
        cmocka_unit_test(test_pushed_manifest_names_the_payload),
        cmocka_unit_test(test_image_reload_forgets_the_cache),
    };
    return cmocka_run_group_tests(tests, tree_setup, tree_teardown);
}
