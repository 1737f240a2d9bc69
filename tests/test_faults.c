/* Fault injection, SQLite-style, on every durable write path: the store's
 * publish, a replica's activation and the server's state.
 *
 * This binary (and only it) interposes the C library's write, pwrite,
 * pwrite64, fsync, fdatasync, rename and link, and watches open and mkdir:
 * the library and SQLite are linked into the executable's namespace, so
 * their calls come here first and go on to the real functions.  Calls on
 * paths outside the directory under test pass straight through.
 *
 * Each scenario first runs once to count its steps (the calls above on the
 * directory under test), then once per step k, either failing step k (EIO,
 * ENOSPC for writes) or exiting the process at step k (in a forked child,
 * the closest thing to a crash a test can make).  After each case a fresh
 * open must find a complete, verified state: LATEST or ACTIVE naming a
 * version whose bytes match the checkpoint published as it, and the
 * server's jobs as they were before the failed change.
 *
 * Beside the failures, every run checks the ordering a power cut needs:
 * the model keeps a set of files whose bytes were written but not fsynced
 * and of folders whose entries changed (create, rename, mkdir, link) but
 * were not fsynced.  When a pointer (LATEST, ACTIVE) is renamed into place,
 * nothing it can name may still be in that set, and once a publish or an
 * activation is reported, the pointer's own folder must be synced too. */
#include "testutil.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shoal/ckpt.h"
#include "shoal/client.h"
#include "shoal/delta.h"
#include "shoal/server.h"
#include "shoal/store.h"

#include <sqlite3.h>

/* ---- The interposed calls -------------------------------------------------- */

enum { MAXDIRTY = 4096 };
typedef struct {
    char *path;
    int content; /* bytes written since the last fsync */
    int entries; /* (folders) entries changed since the last fsync */
} dirty;

static struct {
    pthread_mutex_t mu;
    int on;               /* counting and checking */
    char root[1024];      /* only paths under it are watched */
    size_t rootlen;
    long steps;           /* steps seen since armed */
    long fail_at, exit_at; /* the step that fails or exits (0: none) */
    int fail_on;           /* 1: every step from fail_at on fails (a disk that stays full) */
    int fired;
    dirty d[MAXDIRTY];
    int nd;
    char violation[2048]; /* the first ordering error */
} F = {.mu = PTHREAD_MUTEX_INITIALIZER};

#define REAL(ret, name, ...)                                                                       \
    static ret (*real_##name)(__VA_ARGS__);                                                        \
    static void load_##name(void)                                                                  \
    {                                                                                              \
        if (!real_##name) real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name);              \
    }
REAL(ssize_t, write, int, const void *, size_t)
REAL(ssize_t, pwrite, int, const void *, size_t, off_t)
REAL(ssize_t, pwrite64, int, const void *, size_t, off_t)
REAL(int, fsync, int)
REAL(int, fdatasync, int)
REAL(int, rename, const char *, const char *)
REAL(int, link, const char *, const char *)
REAL(int, open, const char *, int, ...)
REAL(int, open64, const char *, int, ...)
REAL(int, mkdir, const char *, mode_t)

static int under_root(const char *p)
{
    return F.rootlen && !strncmp(p, F.root, F.rootlen) && (p[F.rootlen] == '/' || !p[F.rootlen]);
}

/* The absolute path of fd (empty when unknown). */
static void fd_path(int fd, char *out, size_t cap)
{
    char l[64];
    snprintf(l, sizeof l, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(l, out, cap - 1);
    out[n > 0 ? n : 0] = 0;
}

static void abs_path(const char *p, char *out, size_t cap)
{
    if (p[0] == '/') {
        snprintf(out, cap, "%s", p);
        return;
    }
    char cwd[1024];
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
    snprintf(out, cap, "%s/%s", cwd, p);
}

static void parent_of(const char *p, char *out, size_t cap)
{
    snprintf(out, cap, "%s", p);
    char *s = strrchr(out, '/');
    if (s && s != out) *s = 0;
}

static dirty *find_dirty(const char *p, int add)
{
    for (int i = 0; i < F.nd; i++)
        if (!strcmp(F.d[i].path, p)) return &F.d[i];
    if (!add || F.nd == MAXDIRTY) return NULL;
    F.d[F.nd] = (dirty){strdup(p), 0, 0};
    return &F.d[F.nd++];
}

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    if (F.violation[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(F.violation, sizeof F.violation, fmt, ap);
    va_end(ap);
}

/* Before a step on a watched path: counts it, and fails it or exits at the
 * armed step.  Returns the errno to fail with, or 0.  Called with F.mu. */
static int step(const char *what, const char *path, int err)
{
    if (!F.on || !under_root(path)) return 0;
    /* A replica's LOCK holds its pid for messages only (a failed write of
     * it is a warning): not a step of the durable path. */
    const char *base = strrchr(path, '/');
    if (base && !strcmp(base, "/LOCK")) return 0;
    F.steps++;
    if (F.exit_at && F.steps == F.exit_at) _exit(77);
    if (F.fail_at && (F.steps == F.fail_at || (F.fail_on && F.steps > F.fail_at))) {
        F.fired = 1;
        return err;
    }
    return 0;
}

/* Whether path is key or inside it. */
static int inside(const char *path, const char *key)
{
    size_t n = strlen(key);
    return !strncmp(path, key, n) && (path[n] == '/' || !path[n]);
}

/* A pointer is renamed into place at dst: everything in its folder must be
 * durable (except staging areas and the folder's own entries, which the
 * pointer's rename changes anyway and the caller syncs after it), and so
 * must the pointer's bytes. */
static void check_pointer(const char *src, const char *dst)
{
    char dir[1024];
    parent_of(dst, dir, sizeof dir);
    for (int i = 0; i < F.nd; i++) {
        dirty *x = &F.d[i];
        if (!inside(x->path, dir) || (!x->content && !x->entries)) continue;
        if (strstr(x->path + strlen(dir), "/staging") || strstr(x->path + strlen(dir), "/spool")) continue;
        /* A lock file's pid is for messages only: the lock is the flock,
         * which no power cut keeps. */
        if (!strcmp(x->path + strlen(dir), "/LOCK")) continue;
        if (!strcmp(x->path, dir) && !x->content) continue;
        if (!strcmp(x->path, src) && !x->content) continue;
        violation("%s is renamed to %s while %s has %s not fsynced", src, dst, x->path,
                  x->content ? "bytes" : "entries");
    }
    /* What the pointer names must exist: a store's version folder, or a
     * replica's model file. */
    char *text = NULL, named[2048];
    size_t len;
    long long v = 0;
    const char *at;
    if (sh_read_file(src, 4096, &text, &len) < 0 || !(at = strstr(text, "\"version\":")) ||
        sscanf(at + 10, "%lld", &v) != 1) {
        violation("%s is renamed to %s without a \"version\" in it", src, dst);
        free(text);
        return;
    }
    free(text);
    if (!strcmp(strrchr(dst, '/'), "/LATEST")) snprintf(named, sizeof named, "%s/versions/%010lld/manifest.json", dir, v);
    else snprintf(named, sizeof named, "%s/models/%010lld.safetensors", dir, v);
    struct stat st;
    if (stat(named, &st) < 0) violation("%s is renamed to %s naming version %lld, but %s does not exist", src, dst, v, named);
}

static void note_write(int fd)
{
    char p[1024];
    fd_path(fd, p, sizeof p);
    if (!under_root(p)) return;
    dirty *x = find_dirty(p, 1);
    if (x) x->content = 1;
}

static void note_sync(int fd)
{
    char p[1024];
    fd_path(fd, p, sizeof p);
    if (!under_root(p)) return;
    dirty *x = find_dirty(p, 0);
    struct stat st;
    if (!x || fstat(fd, &st) < 0) return;
    if (S_ISDIR(st.st_mode)) x->entries = 0;
    x->content = 0;
}

static void note_entries(const char *path)
{
    char dir[1024];
    parent_of(path, dir, sizeof dir);
    if (!under_root(dir)) return;
    dirty *x = find_dirty(dir, 1);
    if (x) x->entries = 1;
}

/* The dirty state of src and everything under it moves to dst. */
static void note_rename(const char *src, const char *dst)
{
    size_t n = strlen(src);
    for (int i = 0; i < F.nd; i++)
        if (inside(F.d[i].path, dst) && !inside(F.d[i].path, src)) F.d[i].content = F.d[i].entries = 0;
    for (int i = 0; i < F.nd; i++)
        if (inside(F.d[i].path, src)) {
            char np[2048];
            snprintf(np, sizeof np, "%s%s", dst, F.d[i].path + n);
            dirty *y = find_dirty(np, 1);
            if (y && y != &F.d[i]) {
                y->content = F.d[i].content, y->entries = F.d[i].entries;
                F.d[i].content = F.d[i].entries = 0;
            }
        }
    note_entries(src);
    note_entries(dst);
}

static ssize_t do_write(int fd, const void *b, size_t n, off_t off, int kind)
{
    char p[1024] = "";
    pthread_mutex_lock(&F.mu);
    int e = 0;
    if (F.on) {
        fd_path(fd, p, sizeof p);
        e = step("write", p, ENOSPC);
    }
    pthread_mutex_unlock(&F.mu);
    if (e) {
        errno = e;
        return -1;
    }
    ssize_t r;
    if (kind == 0) load_write(), r = real_write(fd, b, n);
    else if (kind == 1) load_pwrite(), r = real_pwrite(fd, b, n, off);
    else load_pwrite64(), r = real_pwrite64(fd, b, n, off);
    if (r > 0 && F.on) {
        pthread_mutex_lock(&F.mu);
        note_write(fd);
        pthread_mutex_unlock(&F.mu);
    }
    return r;
}

ssize_t write(int fd, const void *b, size_t n) { return do_write(fd, b, n, 0, 0); }
ssize_t pwrite(int fd, const void *b, size_t n, off_t off) { return do_write(fd, b, n, off, 1); }
ssize_t pwrite64(int fd, const void *b, size_t n, off_t off) { return do_write(fd, b, n, off, 2); }

/* Files under this folder are not really synced: no test here can observe
 * a real fsync (the process exits, the machine does not lose power), and
 * the model above stands in for the disk.  It keeps the test fast. */
static char nosync_root[1024];

static int do_sync(int fd, int data)
{
    char p[1024] = "";
    fd_path(fd, p, sizeof p);
    pthread_mutex_lock(&F.mu);
    int e = F.on ? step("fsync", p, EIO) : 0;
    pthread_mutex_unlock(&F.mu);
    if (e) {
        errno = e;
        return -1;
    }
    int r = 0;
    size_t nr = strlen(nosync_root);
    if (nr && !strncmp(p, nosync_root, nr) && p[nr] == '/') r = 0;
    else if (data) load_fdatasync(), r = real_fdatasync(fd);
    else load_fsync(), r = real_fsync(fd);
    if (r == 0 && F.on) {
        pthread_mutex_lock(&F.mu);
        note_sync(fd);
        pthread_mutex_unlock(&F.mu);
    }
    return r;
}

int fsync(int fd) { return do_sync(fd, 0); }
int fdatasync(int fd) { return do_sync(fd, 1); }

static int do_rename(const char *a, const char *b, int is_link)
{
    char pa[1024], pb[1024];
    abs_path(a, pa, sizeof pa);
    abs_path(b, pb, sizeof pb);
    pthread_mutex_lock(&F.mu);
    int e = F.on ? step(is_link ? "link" : "rename", pb, EIO) : 0;
    const char *base = strrchr(pb, '/');
    if (F.on && !e && !is_link && base && (!strcmp(base, "/LATEST") || !strcmp(base, "/ACTIVE")))
        check_pointer(pa, pb);
    pthread_mutex_unlock(&F.mu);
    if (e) {
        errno = e;
        return -1;
    }
    int r;
    if (is_link) load_link(), r = real_link(a, b);
    else load_rename(), r = real_rename(a, b);
    if (r == 0 && F.on) {
        pthread_mutex_lock(&F.mu);
        if (is_link) note_entries(pb);
        else note_rename(pa, pb);
        pthread_mutex_unlock(&F.mu);
    }
    return r;
}

int rename(const char *a, const char *b) { return do_rename(a, b, 0); }
int link(const char *a, const char *b) { return do_rename(a, b, 1); }

static int do_open(const char *path, int flags, mode_t mode, int is64)
{
    int r;
    if (is64) load_open64(), r = real_open64(path, flags, mode);
    else load_open(), r = real_open(path, flags, mode);
    if (r >= 0 && F.on && (flags & (O_CREAT | O_TRUNC))) {
        char p[1024];
        abs_path(path, p, sizeof p);
        pthread_mutex_lock(&F.mu);
        if (under_root(p)) {
            if (flags & O_CREAT) note_entries(p);
            if (flags & O_TRUNC) {
                dirty *x = find_dirty(p, 1);
                if (x) x->content = 1;
            }
        }
        pthread_mutex_unlock(&F.mu);
    }
    return r;
}

int open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    return do_open(path, flags, mode, 0);
}

int open64(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    return do_open(path, flags, mode, 1);
}

int mkdir(const char *path, mode_t mode)
{
    load_mkdir();
    int r = real_mkdir(path, mode);
    if (r == 0 && F.on) {
        char p[1024];
        abs_path(path, p, sizeof p);
        pthread_mutex_lock(&F.mu);
        note_entries(p);
        pthread_mutex_unlock(&F.mu);
    }
    return r;
}

/* ---- Control --------------------------------------------------------------- */

static void faults_reset(void)
{
    for (int i = 0; i < F.nd; i++) free(F.d[i].path);
    F.nd = 0;
    F.violation[0] = 0;
}

/* Starts watching root: the next steps count from 1; fail_at / exit_at arm
 * one step (0: none). */
static void faults_arm(const char *root, long fail_at, long exit_at)
{
    pthread_mutex_lock(&F.mu);
    faults_reset();
    snprintf(F.root, sizeof F.root, "%s", root);
    F.rootlen = strlen(F.root);
    F.steps = 0, F.fail_at = fail_at, F.exit_at = exit_at, F.fired = 0, F.fail_on = 0;
    F.on = 1;
    pthread_mutex_unlock(&F.mu);
}

/* Stops watching; returns the steps counted. */
static long faults_disarm(void)
{
    pthread_mutex_lock(&F.mu);
    F.on = 0;
    long n = F.steps;
    pthread_mutex_unlock(&F.mu);
    return n;
}

/* The folder (and everything it may name) is durable now. */
static void faults_assert_synced(const char *dir)
{
    pthread_mutex_lock(&F.mu);
    for (int i = 0; i < F.nd; i++) {
        dirty *x = &F.d[i];
        if (!inside(x->path, dir) || (!x->content && !x->entries)) continue;
        if (strstr(x->path + strlen(dir), "/staging") || strstr(x->path + strlen(dir), "/spool")) continue;
        /* A lock file's pid is for messages only: the lock is the flock,
         * which no power cut keeps. */
        if (!strcmp(x->path + strlen(dir), "/LOCK")) continue;
        violation("after the commit, %s still has %s not fsynced", x->path, x->content ? "bytes" : "entries");
    }
    pthread_mutex_unlock(&F.mu);
}

static void faults_assert_ordered(const char *what)
{
    if (F.violation[0]) fail_msg("%s: %s", what, F.violation);
}

/* Runs fn(arg) in a child that exits at step k, counted from where fn
 * calls child_arm() (where the counting run armed); returns the child's
 * exit status (77: it exited at step k). */
static const char *child_root;
static long child_k, child_fail;

static void child_arm(void) { faults_arm(child_root, 0, child_k); }

static int in_child_exit_at(const char *root, long k, void (*fn)(void *), void *arg)
{
    fflush(NULL);
    child_root = root, child_k = k;
    pid_t pid = fork();
    if (pid == 0) {
        fn(arg);
        _exit(0);
    }
    assert_true(pid > 0);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Copies of a prepared state, restored before each case (in place, so
 * that what the state records about its own paths stays true). */
static void snapshot(const char *dir)
{
    char *out;
    if (tu_run(&out, "rm -rf '%s.snap' && cp -a '%s' '%s.snap'", dir, dir, dir)) fail_msg("snapshot %s: %s", dir, out);
    free(out);
}

static void restore(const char *dir)
{
    char *out;
    if (tu_run(&out, "rm -rf '%s' && cp -a '%s.snap' '%s'", dir, dir, dir)) fail_msg("restore %s: %s", dir, out);
    free(out);
}

/* ---- The store's publish --------------------------------------------------- */

/* Three checkpoints; versions 1 and 2 published before the faults, version
 * 3 (a delta, or an anchor) published under them. */
typedef struct {
    char root[1024];
    char ck[4][1024]; /* ck[v]: the checkpoint of version v */
    uint64_t every;
    int mem;                /* version 3 by store_publish_mem() from img and dl */
    uint8_t *img, *dl;      /* version 3's image, and the delta from 2 to it */
    size_t img_len, dl_len;
} pub;

static void pub_make(pub *p);

static void pub_setup(pub *p, const char *name, uint64_t every)
{
    memset(p, 0, sizeof *p); /* a publish from a file; test_publish_mem_faults sets the rest */
    snprintf(p->root, sizeof p->root, "%s", tu_path(name));
    p->every = every;
    for (int v = 1; v <= 3; v++) {
        char n[256];
        snprintf(n, sizeof n, "%s-v%d.st", name, v);
        snprintf(p->ck[v], sizeof p->ck[v], "%s", tu_path(n));
        if (v == 1) TU_OK(ckpt_synth(p->ck[v], 120000, 21));
        else TU_OK(ckpt_step(p->ck[v - 1], p->ck[v], 1e-4, 1, (uint64_t)(21 + v)));
    }
    pub_make(p);
    snapshot(p->root);
}

/* A fresh store with versions 1 and 2 (made once, then restored). */
static void pub_make(pub *p)
{
    sh_rm_rf(p->root);
    store *s;
    TU_OK(store_open(p->root, NULL, 1, &s));
    uint64_t v;
    for (int k = 1; k <= 2; k++) TU_OK(store_publish(s, p->ck[k], &(store_publish_opts){.anchor_every = p->every}, &v));
    store_close(s);
}

static void pub_reset(pub *p) { restore(p->root); }

static int pub_third(pub *p)
{
    store *s;
    TU_OK(store_open(p->root, NULL, 0, &s));
    uint64_t v = 0;
    store_mem_version in = {.image = p->img, .image_len = p->img_len, .delta = p->dl, .delta_len = p->dl_len,
                            .base = 2};
    int rc = p->mem ? store_publish_mem(s, &in, &(store_publish_opts){.anchor_every = p->every}, &v)
                    : store_publish(s, p->ck[3], &(store_publish_opts){.anchor_every = p->every}, &v);
    if (rc == SH_OK) assert_int_equal(v, 3);
    store_close(s);
    return rc;
}

static void pub_child(void *arg)
{
    child_arm();
    pub_third(arg);
}

/* What a reopen must find: LATEST is 2 or 3 (3 only if allowed), the
 * version verifies, its rebuilt model is its checkpoint, no folder above
 * LATEST is served, and publishing again works. */
static uint64_t pub_check(pub *p, int may_be_3, const char *ctx)
{
    store *s;
    TU_OK(store_open(p->root, NULL, 0, &s));
    uint64_t latest = 0;
    int rc = store_latest(s, &latest);
    if (rc < 0) fail_msg("%s: reopen: %s", ctx, sh_errmsg());
    if (latest != 2 && !(may_be_3 && latest == 3)) fail_msg("%s: LATEST names version %llu", ctx, (unsigned long long)latest);
    rc = store_verify(s, latest);
    if (rc < 0) fail_msg("%s: version %llu does not verify: %s", ctx, (unsigned long long)latest, sh_errmsg());
    char out[1024];
    snprintf(out, sizeof out, "%s.out", p->root);
    unlink(out);
    rc = store_materialize(s, latest, 0, NULL, out);
    if (rc < 0) fail_msg("%s: version %llu does not rebuild: %s", ctx, (unsigned long long)latest, sh_errmsg());
    tu_assert_same_file(out, p->ck[latest]);
    unlink(out);
    /* The next publish (a retry) succeeds and is the next version. */
    uint64_t v;
    TU_OK(store_publish(s, p->ck[3], &(store_publish_opts){.anchor_every = p->every}, &v));
    assert_int_equal(v, latest + 1);
    TU_OK(store_verify(s, v));
    store_close(s);
    return latest;
}

static void publish_cases(pub *p, const char *label)
{
    char ctx[256];
    /* Count the steps, and check the ordering of a clean publish. */
    pub_reset(p);
    faults_arm(p->root, 0, 0);
    TU_OK(pub_third(p));
    long n = faults_disarm();
    char run[1100];
    snprintf(run, sizeof run, "%s/main", p->root);
    faults_assert_synced(run);
    faults_assert_ordered(label);
    assert_true(n >= 8);
    print_message("%s: %ld steps, each failed and each exited at\n", label, n);
    int failed = 0, exited = 0;
    for (long k = 1; k <= n; k++) {
        /* Step k fails. */
        pub_reset(p);
        faults_arm(p->root, k, 0);
        int rc = pub_third(p);
        faults_disarm();
        snprintf(ctx, sizeof ctx, "%s: step %ld of %ld fails", label, k, n);
        faults_assert_ordered(ctx);
        if (rc == SH_OK && F.fired) {
            /* Only a step after the pointer moved may fail without failing
             * the publish... and none does: every step is checked. */
            fail_msg("%s: publish succeeded although a step failed", ctx);
        }
        /* A failure after LATEST moved (the fsync of its folder) says so. */
        int moved = rc < 0 && strstr(sh_errmsg(), "LATEST names version 3, but a crash may bring back version 2");
        if (rc < 0 && !moved && !strstr(sh_errmsg(), "LATEST still names version 2"))
            fail_msg("%s: message \"%s\" does not say what LATEST names", ctx, sh_errmsg());
        failed += rc < 0;
        /* A failed publish leaves no folder of its version behind. */
        char v3[1200];
        snprintf(v3, sizeof v3, "%s/main/versions/%010d", p->root, 3);
        if (rc < 0 && !moved && sh_path_exists(v3)) fail_msg("%s: the failed publish left %s behind", ctx, v3);
        assert_int_equal(pub_check(p, rc == SH_OK || moved, ctx), rc == SH_OK || moved ? 3 : 2);
        /* The process dies at step k. */
        pub_reset(p);
        int st = in_child_exit_at(p->root, k, pub_child, p);
        snprintf(ctx, sizeof ctx, "%s: exit at step %ld of %ld", label, k, n);
        if (st != 77) fail_msg("%s: the child exited %d", ctx, st);
        exited++;
        pub_check(p, 1, ctx);
    }
    assert_int_equal(failed, n);
    assert_int_equal(exited, n);
}

static void test_publish_faults(void **state)
{
    pub p;
    pub_setup(&p, "pub-delta", 8);
    publish_cases(&p, "delta publish");
    pub_setup(&p, "pub-anchor", 1);
    publish_cases(&p, "anchor publish");
}

/* The same from memory (store_publish_mem, what a trainer publishes with):
 * the delta from version 2 and version 3's image, staged, synced and
 * renamed under the same rules. */
static void test_publish_mem_faults(void **state)
{
    pub p;
    for (int anchor = 0; anchor < 2; anchor++) {
        memset(&p, 0, sizeof p);
        pub_setup(&p, anchor ? "pubm-anchor" : "pubm-delta", anchor ? 1 : 8);
        char dl[1100];
        snprintf(dl, sizeof dl, "%s.2to3.shd", p.root);
        TU_OK(delta_make(p.ck[2], p.ck[3], dl, &(delta_opts){0}, NULL));
        p.dl = tu_read_file(dl, &p.dl_len);
        p.img = tu_read_file(p.ck[3], &p.img_len);
        p.mem = 1;
        publish_cases(&p, anchor ? "anchor publish from memory" : "delta publish from memory");
        free(p.dl);
        free(p.img);
    }
}

/* ---- A replica's activation ------------------------------------------------ */

typedef struct {
    pub p;
    char dir[1024];
} rep;

static void rep_make(rep *r)
{
    pub_reset(&r->p); /* versions 1 and 2 */
    sh_rm_rf(r->dir);
    store_replica *x;
    store_replica_config cfg = {.dir = r->dir, .store = r->p.root, .poll_s = 0.01};
    TU_OK(store_replica_open(&cfg, &x));
    TU_OK(store_replica_wait(x, 2, 30));
    store_replica_close(x);
    /* Version 3 waits in the store for the next open. */
    store *s;
    TU_OK(store_open(r->p.root, NULL, 0, &s));
    uint64_t v;
    TU_OK(store_publish(s, r->p.ck[3], &(store_publish_opts){.anchor_every = r->p.every}, &v));
    store_close(s);
    snapshot(r->p.root);
    snapshot(r->dir);
}

static void rep_reset(rep *r)
{
    restore(r->p.root);
    restore(r->dir);
}

/* Opens the replica and waits until it has taken version 3 or failed. */
static int rep_activate(rep *r)
{
    store_replica *x;
    store_replica_config cfg = {.dir = r->dir, .store = r->p.root, .poll_s = 0.01};
    TU_OK(store_replica_open(&cfg, &x));
    int rc = SH_OK;
    double end = sh_now_mono() + 30;
    for (;;) {
        store_replica_info info;
        store_replica_get_info(x, &info);
        if (info.failures) {
            rc = SH_EIO;
            break;
        }
        if (store_replica_wait(x, 3, 0.05) == SH_OK) break;
        if (sh_now_mono() > end) fail_msg("replica %s: neither version 3 nor a failure in 30 s", r->dir);
    }
    /* A failed step is reported as a failure, if only after the waiters
     * saw the version (served from memory but not durable). */
    store_replica_info info;
    for (double until = sh_now_mono() + 5;;) {
        store_replica_get_info(x, &info);
        if (info.failures || !F.fired || sh_now_mono() > until) break;
        sh_sleep(0.01);
    }
    if (info.failures) rc = SH_EIO;
    store_replica_close(x);
    return rc;
}

static void rep_child(void *arg)
{
    child_arm();
    rep_activate(arg);
}

/* A restart serves version 2 or 3 (3 only if allowed), byte for byte. */
static uint64_t rep_check(rep *r, int may_be_3, const char *ctx)
{
    store_replica *x;
    /* No store: only what the replica holds on its disk. */
    store_replica_config cfg = {.dir = r->dir, .store = r->p.root, .poll_s = 3600};
    int rc = store_replica_open(&cfg, &x);
    if (rc < 0) fail_msg("%s: reopen: %s", ctx, sh_errmsg());
    uint64_t v = store_replica_version(x);
    if (v != 2 && !(may_be_3 && v == 3)) fail_msg("%s: the replica restarted on version %llu", ctx, (unsigned long long)v);
    store_lease l;
    TU_OK(store_replica_acquire(x, 0, 0, &l));
    size_t len;
    uint8_t *want = tu_read_file(r->p.ck[v], &len);
    assert_int_equal(l.size, len);
    if (memcmp(l.data, want, len)) fail_msg("%s: version %llu is served with other bytes", ctx, (unsigned long long)v);
    free(want);
    store_replica_release(x, &l);
    store_replica_close(x);
    return v;
}

static void test_replica_faults(void **state)
{
    rep r;
    pub_setup(&r.p, "rep-store", 8);
    snprintf(r.dir, sizeof r.dir, "%s", tu_path("rep-dir"));
    char ctx[256];
    rep_make(&r);
    rep_reset(&r);
    faults_arm(r.dir, 0, 0);
    TU_OK(rep_activate(&r));
    long n = faults_disarm();
    faults_assert_synced(r.dir);
    faults_assert_ordered("replica activation");
    assert_true(n >= 4);
    print_message("replica activation: %ld steps, each failed and each exited at\n", n);
    for (long k = 1; k <= n; k++) {
        rep_reset(&r);
        faults_arm(r.dir, k, 0);
        int rc = rep_activate(&r);
        faults_disarm();
        snprintf(ctx, sizeof ctx, "replica: step %ld of %ld fails", k, n);
        faults_assert_ordered(ctx);
        if (rc == SH_OK && F.fired) fail_msg("%s: activated although a step failed", ctx);
        rep_check(&r, 1, ctx);
        rep_reset(&r);
        int st = in_child_exit_at(r.dir, k, rep_child, &r);
        snprintf(ctx, sizeof ctx, "replica: exit at step %ld of %ld", k, n);
        if (st != 77) fail_msg("%s: the child exited %d", ctx, st);
        rep_check(&r, 1, ctx);
    }
}

/* ---- A push replica's activation ------------------------------------------ */

/* A replica attached to a real `shoal push serve` root receives version 3
 * (a delta) over UCX, applies it to its in-memory image and writes the new
 * model itself (no store in between), then makes it durable and moves
 * ACTIVE.  UCX runs only in forked children, so each case starts clean. */
typedef struct {
    rep r;
    char parent[256];
    char result[1100]; /* where a child writes what it saw */
} push;

/* Runs in a child: activates version 3 from the push root with step
 * `fail_at` failing (0: none) and writes "steps fired failed violation" to
 * p->result; exits 77 when exit_at hits. */
static void push_child(void *arg)
{
    push *p = arg;
    store_replica_config cfg = {.dir = p->r.dir, .parents = {p->parent}, .nparents = 1, .leaf = 1};
    if (child_k) child_arm();
    else faults_arm(p->r.dir, child_fail, 0);
    store_replica *x;
    int failed = 0;
    if (store_replica_open(&cfg, &x) < 0) _exit(3);
    double end = sh_now_mono() + 60;
    store_replica_info info;
    for (;;) {
        store_replica_get_info(x, &info);
        if (info.failures) break;
        if (store_replica_wait(x, 3, 0.05) == SH_OK) break;
        if (sh_now_mono() > end) _exit(4);
    }
    for (double until = sh_now_mono() + 5;;) {
        store_replica_get_info(x, &info);
        if (info.failures || !F.fired || sh_now_mono() > until) break;
        sh_sleep(0.01);
    }
    failed = info.failures > 0;
    store_replica_close(x);
    long n = faults_disarm();
    if (!failed) faults_assert_synced(p->r.dir);
    FILE *f = fopen(p->result, "w");
    if (!f) _exit(5);
    fprintf(f, "%ld %d %d %s\n", n, F.fired, failed, F.violation[0] ? F.violation : "-");
    fclose(f);
    _exit(0);
}

static void push_run(push *p, long fail_at, long exit_at, long *steps, int *fired, int *failed, char *viol,
                     size_t cap, int *status)
{
    unlink(p->result);
    child_fail = fail_at;
    *status = in_child_exit_at(p->r.dir, exit_at, push_child, p);
    child_fail = 0;
    *steps = 0, *fired = 0, *failed = 0;
    viol[0] = 0;
    if (*status != 0) return;
    char *text;
    size_t len;
    TU_OK(sh_read_file(p->result, 4096, &text, &len));
    int off = 0;
    if (sscanf(text, "%ld %d %d %n", steps, fired, failed, &off) < 3) fail_msg("bad child report: %s", text);
    snprintf(viol, cap, "%s", text + off);
    viol[strcspn(viol, "\n")] = 0;
    if (!strcmp(viol, "-")) viol[0] = 0;
    free(text);
}

static void test_push_replica_faults(void **state)
{
    push p;
    pub_setup(&p.r.p, "push-store", 8);
    snprintf(p.r.dir, sizeof p.r.dir, "%s", tu_path("push-dir"));
    snprintf(p.result, sizeof p.result, "%s", tu_path("push-result"));
    rep_make(&p.r); /* the replica on version 2, version 3 in the store */
    /* The root: a real `shoal push serve` over the store. */
    char addr[1100], cmd[4096], *out;
    snprintf(addr, sizeof addr, "%s.addr", p.r.p.root);
    unlink(addr);
    snprintf(cmd, sizeof cmd, "%s push serve --store %s --addr-file %s --chunk 64KiB >%s.log 2>&1 & echo $!", tu_shoal(),
             p.r.p.root, addr, p.r.p.root);
    assert_int_equal(tu_run(&out, "%s", cmd), 0);
    long root_pid = atol(out);
    free(out);
    double end = sh_now_mono() + 20;
    char *line = NULL;
    size_t len = 0;
    while (sh_now_mono() < end) {
        if (sh_read_file(addr, 4096, &line, &len) == SH_OK && len && line[len - 1] == '\n') break;
        free(line);
        line = NULL;
        sh_sleep(0.02);
    }
    if (!line) fail_msg("the push root did not start");
    line[strcspn(line, "\n")] = 0;
    snprintf(p.parent, sizeof p.parent, "%s", line);
    free(line);
    long n;
    int fired, failed, st;
    char viol[2048], ctx[256];
    rep_reset(&p.r);
    push_run(&p, 0, 0, &n, &fired, &failed, viol, sizeof viol, &st);
    if (st != 0) fail_msg("push activation: the child exited %d", st);
    if (failed) fail_msg("push activation failed without a fault");
    if (viol[0]) fail_msg("push activation: %s", viol);
    assert_true(n >= 4);
    print_message("push replica activation: %ld steps, each failed and each exited at\n", n);
    for (long k = 1; k <= n; k++) {
        rep_reset(&p.r);
        long n2;
        push_run(&p, k, 0, &n2, &fired, &failed, viol, sizeof viol, &st);
        snprintf(ctx, sizeof ctx, "push replica: step %ld of %ld fails", k, n);
        if (st != 0) fail_msg("%s: the child exited %d", ctx, st);
        if (viol[0]) fail_msg("%s: %s", ctx, viol);
        if (fired && !failed) fail_msg("%s: activated although a step failed", ctx);
        rep_check(&p.r, 1, ctx);
        rep_reset(&p.r);
        push_run(&p, 0, k, &n2, &fired, &failed, viol, sizeof viol, &st);
        snprintf(ctx, sizeof ctx, "push replica: exit at step %ld of %ld", k, n);
        if (st != 77) fail_msg("%s: the child exited %d", ctx, st);
        rep_check(&p.r, 1, ctx);
    }
    kill((pid_t)root_pid, SIGKILL);
}

/* ---- The server's state ---------------------------------------------------- */

typedef struct {
    char dir[1024], db[1100], tokens[1100];
} srvc;

/* The server's folder, database and tokens file under the test's tmpdir. */
static void srvc_init(srvc *c, const char *name)
{
    snprintf(c->dir, sizeof c->dir, "%s", tu_path(name));
    snprintf(c->db, sizeof c->db, "%s/state.db", c->dir);
    snprintf(c->tokens, sizeof c->tokens, "%s/tokens.json", c->dir);
}

static srv *srv_up(srvc *c)
{
    /* alice's jobs may ask priorities up to 10 (to preempt her own work). */
    srv_config cfg = {.db_path = c->db, .tokens_path = c->tokens, .heartbeat_timeout = 3600, .manual_cycles = 1,
                      .max_priority = "alice=10"};
    srv *s;
    TU_OK(srv_start(&cfg, &s));
    return s;
}

static client_conn *client(srv *s, const char *token)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv_port(s));
    client_conn *c;
    TU_OK(client_new(url, token, &c));
    return c;
}

/* Submits a job spec as alice; returns the HTTP status (0: no reply). */
static int submit_spec(srv *s, const char *body)
{
    client_conn *c = client(s, "tok-alice");
    json_t *j = json_loads(body, 0, NULL), *reply = NULL;
    int st = 0;
    if (client_call(c, "POST", "/v1/jobs", j, NULL, 10, &st, &reply) < 0) st = 0;
    json_decref(j);
    json_decref(reply);
    client_free(c);
    return st;
}

/* Submits a one-GPU function named `name` as alice. */
static int submit(srv *s, const char *name)
{
    char body[256];
    snprintf(body, sizeof body, "{\"name\":\"%s\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"]}", name);
    return submit_spec(s, body);
}

/* The names of alice's jobs, in id order, joined by commas. */
static void job_names(srv *s, char *out, size_t cap)
{
    client_conn *c = client(s, "tok-alice");
    int st;
    json_t *reply;
    TU_OK(client_call(c, "GET", "/v1/jobs", NULL, NULL, 10, &st, &reply));
    assert_int_equal(st, 200);
    out[0] = 0;
    size_t i;
    json_t *v;
    json_t *jobs = json_object_get(reply, "jobs");
    /* The list is newest first or oldest first; sort the names. */
    const char *names[16];
    size_t n = 0;
    json_array_foreach(jobs, i, v) if (n < 16) names[n++] = json_string_value(json_object_get(v, "name"));
    for (size_t a = 0; a < n; a++)
        for (size_t b = a + 1; b < n; b++)
            if (strcmp(names[b], names[a]) < 0) {
                const char *t = names[a];
                names[a] = names[b], names[b] = t;
            }
    for (size_t a = 0; a < n; a++) {
        strncat(out, a ? "," : "", cap - strlen(out) - 1);
        strncat(out, names[a], cap - strlen(out) - 1);
    }
    json_decref(reply);
    client_free(c);
}

/* A fresh database holding alice's job "one" (made once, then restored). */
static void srv_make(srvc *c)
{
    sh_rm_rf(c->dir);
    TU_OK(sh_mkdir_p(c->dir, 0755));
    const char *t = "{\"admin\":\"tok-admin\",\"agent\":\"tok-agent\",\"tenants\":{\"alice\":\"tok-alice\"}}";
    tu_write_file(c->tokens, t, strlen(t));
    srv *s = srv_up(c);
    TU_OK(srv_add_bench_nodes(s, 2, "H100", 8));
    assert_int_equal(submit(s, "one"), 201);
    srv_stop(s);
    snapshot(c->dir);
}

static void srv_reset(srvc *c) { restore(c->dir); }

static void srv_child(void *arg)
{
    srvc *c = arg;
    srv *s = srv_up(c);
    srv_add_bench_nodes(s, 2, "H100", 8);
    child_arm();
    submit(s, "two");
    srv_stop(s);
}

/* After a restart: "one" is there, "two" is there only if allowed. */
static void srv_check(srvc *c, int two, const char *ctx)
{
    srv *s = srv_up(c);
    char names[256];
    job_names(s, names, sizeof names);
    const char *want = two == 1 ? "one,two" : "one";
    if (two == 2 ? strcmp(names, "one") && strcmp(names, "one,two") : strcmp(names, want) != 0)
        fail_msg("%s: the jobs after a restart are \"%s\"", ctx, names);
    srv_stop(s);
}

static void test_server_state_faults(void **state)
{
    srvc c;
    srvc_init(&c, "srv-faults");
    char ctx[256];
    srv_make(&c);
    srv *s = srv_up(&c);
    TU_OK(srv_add_bench_nodes(s, 2, "H100", 8));
    faults_arm(c.dir, 0, 0);
    assert_int_equal(submit(s, "two"), 201);
    long n = faults_disarm();
    srv_stop(s);
    assert_true(n >= 1);
    print_message("server submit: %ld steps, each failed and each exited at\n", n);
    for (long k = 1; k <= n; k++) {
        /* Step k of the submit fails: the reply is an error and the job is
         * in neither the running server nor the database. */
        srv_reset(&c);
        s = srv_up(&c);
        TU_OK(srv_add_bench_nodes(s, 2, "H100", 8));
        faults_arm(c.dir, k, 0);
        int st = submit(s, "two");
        faults_disarm();
        snprintf(ctx, sizeof ctx, "server: step %ld of %ld of a submit fails (reply %d)", k, n, st);
        if (F.fired && st == 201) fail_msg("%s: the submit succeeded although its write failed", ctx);
        char names[256];
        job_names(s, names, sizeof names);
        if (strcmp(names, st == 201 ? "one,two" : "one")) fail_msg("%s: the running server lists \"%s\"", ctx, names);
        srv_stop(s);
        srv_check(&c, st == 201, ctx);
        /* The server dies at step k. */
        srv_reset(&c);
        int ex = in_child_exit_at(c.dir, k, srv_child, &c);
        snprintf(ctx, sizeof ctx, "server: exit at step %ld of %ld of a submit", k, n);
        if (ex != 77) fail_msg("%s: the child exited %d", ctx, ex);
        srv_check(&c, 2, ctx);
    }
}

/* ---- The server's ledger ----------------------------------------------------- */

/* Ledger rows of job `job` (read straight from the database). */
/* SELECT COUNT(*) ... with one integer parameter, on database file db. */
static int db_count(const char *db, const char *sql, int64_t arg)
{
    sqlite3 *h;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) fail_msg("open %s", db);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(h, sql, -1, &st, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(h));
    sqlite3_bind_int64(st, 1, arg);
    int n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    sqlite3_close(h);
    return n;
}

static int ledger_rows(const char *db, int64_t job)
{
    return db_count(db, "SELECT COUNT(*) FROM ledger WHERE job = ?", job);
}

/* Cancels alice's job `id`; returns the HTTP status. */
static int cancel_job(srv *s, int id)
{
    client_conn *c = client(s, "tok-alice");
    json_t *b = json_object(), *reply = NULL;
    int st = 0;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%d/cancel", id);
    if (client_call(c, "POST", path, b, NULL, 10, &st, &reply) < 0) st = 0;
    json_decref(b);
    json_decref(reply);
    client_free(c);
    return st;
}

static int cancel_one(srv *s) { return cancel_job(s, 1); }

/* Alice's job `id` as GET /v1/jobs/ID reports it: "state nodes=N", where
 * N is how many places its members hold. */
static void job_state(srv *s, int id, char *out, size_t cap)
{
    client_conn *c = client(s, "tok-alice");
    int st;
    json_t *reply;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%d", id);
    TU_OK(client_call(c, "GET", path, NULL, NULL, 10, &st, &reply));
    assert_int_equal(st, 200);
    const char *got = json_string_value(json_object_get(reply, "state"));
    snprintf(out, cap, "%s nodes=%zu", got ? got : "?", json_array_size(json_object_get(reply, "members")));
    json_decref(reply);
    client_free(c);
}

static int job_is(srv *s, int id, const char *state)
{
    char got[128];
    job_state(s, id, got, sizeof got);
    return !strncmp(got, state, strlen(state)) && got[strlen(state)] == ' ';
}

static int one_ended(srv *s) { return job_is(s, 1, "cancelled"); }

/* Job 1 is billed once it has ended, exactly once, and not before. */
static void ledger_check(srvc *c, srv *s, const char *ctx)
{
    int ended = one_ended(s), rows = ledger_rows(c->db, 1);
    if (rows != ended)
        fail_msg("%s: job 1 is %s and has %d ledger rows (want %d)", ctx, ended ? "cancelled" : "still live",
                 rows, ended);
}

static void ledger_child(void *arg)
{
    srvc *c = arg;
    srv *s = srv_up(c);
    child_arm();
    cancel_one(s);
    srv_stop(s);
}

/* The job's bill under failures: job 1 holds a GPU (its bill open) and is
 * cancelled while each write the cancel makes fails in turn, or the server
 * dies at it.  The bill is written in the cancel's transaction: the cancel
 * fails whole (the job runs on, nothing is billed) or the job has ended
 * with exactly one ledger row, also after a restart. */
static void test_ledger_faults(void **state)
{
    srvc c;
    srvc_init(&c, "ledger-faults");
    srv_make(&c);
    srv *s = srv_up(&c);
    TU_OK(srv_add_bench_nodes(s, 2, "H100", 8));
    srv_cycle_for_bench(s); /* job 1 is placed: its bill opens */
    srv_stop(s);
    snapshot(c.dir);
    assert_int_equal(ledger_rows(c.db, 1), 0);

    /* The nodes are in the database: registering them again would restart
     * them, which ends the job's placement. */
    srv_reset(&c);
    s = srv_up(&c);
    faults_arm(c.dir, 0, 0);
    assert_int_equal(cancel_one(s), 200);
    long n = faults_disarm();
    assert_int_equal(ledger_rows(c.db, 1), 1);
    srv_stop(s);
    assert_true(n >= 2);
    print_message("cancel with its bill: %ld steps, each failed and each exited at\n", n);
    char ctx[256];
    for (long k = 1; k <= n; k++) {
        srv_reset(&c);
        s = srv_up(&c);
        faults_arm(c.dir, k, 0);
        int st = cancel_one(s);
        faults_disarm();
        snprintf(ctx, sizeof ctx, "ledger: step %ld of %ld of a cancel fails (reply %d)", k, n, st);
        if (F.fired && st == 200) fail_msg("%s: cancelled although a write failed", ctx);
        ledger_check(&c, s, ctx);
        srv_cycle_for_bench(s);
        ledger_check(&c, s, ctx);
        srv_stop(s);
        s = srv_up(&c);
        strncat(ctx, ", after a restart", sizeof ctx - strlen(ctx) - 1);
        ledger_check(&c, s, ctx);
        if (!one_ended(s)) assert_int_equal(cancel_one(s), 200);
        ledger_check(&c, s, ctx);
        srv_stop(s);

        srv_reset(&c);
        int ex = in_child_exit_at(c.dir, k, ledger_child, &c);
        snprintf(ctx, sizeof ctx, "ledger: exit at step %ld of %ld of a cancel", k, n);
        if (ex != 77) fail_msg("%s: the child exited %d", ctx, ex);
        s = srv_up(&c);
        ledger_check(&c, s, ctx);
        if (!one_ended(s)) assert_int_equal(cancel_one(s), 200);
        ledger_check(&c, s, ctx);
        srv_stop(s);
    }
}

/* Bills closed inside a scheduling cycle whose commit fails: jobs 1 and 2,
 * low-priority elastic jobs, fill the two nodes; job 3, a gang, preempts one
 * of them while each write of that cycle fails in turn.  The core closed the preempted job's
 * place; its bill stays in the core and the next cycle writes it: one row,
 * not none, not two. */
static int preempted_rows(const char *db) { return ledger_rows(db, 1) + ledger_rows(db, 2); }

/* A node's long poll, held open at its version (the node "lp", 1 GPU). */
typedef struct {
    srv *s;
    const char *cred;
    long long version;
    int st;
    double took;
} lpoll;

static void *lpoll_run(void *arg)
{
    lpoll *p = arg;
    client_conn *cl = client(p->s, p->cred);
    char body[128];
    snprintf(body, sizeof body, "{\"node\":\"lp\",\"version\":%lld,\"wait_ms\":5000}", p->version);
    char *r = NULL;
    size_t rl = 0;
    double t0 = sh_now_mono();
    if (client_raw(cl, "POST", "/v1/agent/poll", body, strlen(body), NULL, 10, &p->st, &r, &rl) < 0) p->st = 0;
    p->took = sh_now_mono() - t0;
    free(r);
    client_free(cl);
    return NULL;
}

static void test_ledger_cycle_faults(void **state)
{
    srvc c;
    srvc_init(&c, "ledger-cycle");
    sh_rm_rf(c.dir);
    TU_OK(sh_mkdir_p(c.dir, 0755));
    const char *t = "{\"admin\":\"tok-admin\",\"agent\":\"tok-agent\",\"tenants\":{\"alice\":\"tok-alice\"}}";
    tu_write_file(c.tokens, t, strlen(t));
    srv *s = srv_up(&c);
    TU_OK(srv_add_bench_nodes(s, 2, "H100", 8));
    for (int i = 0; i < 2; i++)
        assert_int_equal(submit_spec(s, "{\"name\":\"low\",\"kind\":\"elastic\",\"max_nodes\":1,\"gpus_per_node\":8,"
                                        "\"priority\":0,\"command\":[\"true\"]}"), 201);
    srv_cycle_for_bench(s);
    assert_int_equal(submit_spec(s, "{\"name\":\"high\",\"nodes\":1,\"gpus_per_node\":8,\"priority\":2,"
                                    "\"command\":[\"true\"]}"), 201);
    /* A node with an agent's credential, for a long poll when the state is
     * lost (below). */
    char lp_cred[64];
    {
        client_conn *cl = client(s, "tok-agent");
        json_t *b = json_loads("{\"name\":\"lp\",\"gpu_type\":\"LP\",\"gpus\":1}", 0, NULL), *reply = NULL;
        int st = 0;
        TU_OK(client_call(cl, "POST", "/v1/agent/register", b, NULL, 10, &st, &reply));
        if (st != 200) fail_msg("register lp: %d %s", st, json_string_value(json_object_get(reply, "error")));
        snprintf(lp_cred, sizeof lp_cred, "%s", json_string_value(json_object_get(reply, "credential")));
        json_decref(b);
        json_decref(reply);
        client_free(cl);
    }
    srv_stop(s);
    snapshot(c.dir);

    restore(c.dir);
    s = srv_up(&c);
    faults_arm(c.dir, 0, 0);
    srv_cycle_for_bench(s);
    long n = faults_disarm();
    srv_stop(s);
    int rows = preempted_rows(c.db);
    if (rows != 1) fail_msg("the preempting cycle left %d ledger rows for jobs 1 and 2 (want 1)", rows);
    assert_true(n >= 1);
    print_message("preempting cycle: %ld steps, each failed\n", n);
    for (long k = 1; k <= n; k++) {
        restore(c.dir);
        s = srv_up(&c);
        faults_arm(c.dir, k, 0);
        srv_cycle_for_bench(s);
        faults_disarm();
        assert_true(F.fired);
        srv_cycle_for_bench(s);
        rows = preempted_rows(c.db);
        if (rows != 1) fail_msg("step %ld of %ld of the preempting cycle failed: %d ledger rows for jobs 1 and 2 "
                                "after the next cycle (want 1)", k, n, rows);
        srv_stop(s);
    }
    /* A cycle whose commit fails is taken back whole: the server reloads
     * its state from the database, so job 3 still waits, jobs 1 and 2 still
     * run, unbilled, and the agents' lists say so; the next cycle decides
     * again.  Then job 3 is cancelled while each of its writes fails in
     * turn: the preemption happens once or never, and bills once. */
    restore(c.dir);
    s = srv_up(&c);
    char before[3][128], after[128];
    for (int id = 1; id <= 3; id++) job_state(s, id, before[id - 1], sizeof before[0]);
    assert_true(job_is(s, 3, "pending"));
    faults_arm(c.dir, n, 0); /* the commit: the cycle's last step */
    assert_true(srv_cycle_for_bench(s) < 0);
    faults_disarm();
    assert_true(F.fired);
    assert_null(srv_failed(s));
    for (int id = 1; id <= 3; id++) {
        job_state(s, id, after, sizeof after);
        if (strcmp(after, before[id - 1]))
            fail_msg("job %d was '%s' before a cycle whose commit failed, '%s' after", id, before[id - 1], after);
    }
    assert_int_equal(preempted_rows(c.db), 0);
    assert_int_equal(db_count(c.db, "SELECT COUNT(*) FROM events WHERE kind = 'cycle_undone' AND id > ?", 0), 1);
    faults_arm(c.dir, 0, 0);
    assert_int_equal(cancel_job(s, 3), 200);
    long m = faults_disarm();
    srv_cycle_for_bench(s);
    for (int id = 1; id <= 2; id++) {
        job_state(s, id, after, sizeof after);
        if (strcmp(after, before[id - 1])) fail_msg("job %d: '%s' after job 3's cancel, want '%s'", id, after, before[id - 1]);
    }
    srv_stop(s);
    assert_int_equal(preempted_rows(c.db), 0);
    /* The disk stays full: the reload cannot commit either.  The server
     * says it must be restarted, refuses every request, and a restart
     * finds the state as it was before the cycle. */
    restore(c.dir);
    s = srv_up(&c);
    /* Node lp waits in a long poll at its version: the loss ends the wait
     * at once, with 503 (the node table it waited on is gone). */
    lpoll lp = {s, lp_cred, 0, 0, 0};
    {
        client_conn *cl = client(s, lp_cred);
        json_t *b = json_loads("{\"node\":\"lp\"}", 0, NULL), *reply = NULL;
        int st = 0;
        TU_OK(client_call(cl, "POST", "/v1/agent/poll", b, NULL, 10, &st, &reply));
        assert_int_equal(st, 200);
        lp.version = json_integer_value(json_object_get(reply, "version"));
        json_decref(b);
        json_decref(reply);
        client_free(cl);
    }
    pthread_t lpt;
    assert_int_equal(pthread_create(&lpt, NULL, lpoll_run, &lp), 0);
    sh_sleep(0.5);
    faults_arm(c.dir, n, 0);
    F.fail_on = 1;
    assert_true(srv_cycle_for_bench(s) < 0);
    faults_disarm();
    pthread_join(lpt, NULL);
    if (lp.st != 503 || lp.took > 3)
        fail_msg("a long poll waiting when the state was lost: %d after %.1f s (want 503 at once)", lp.st, lp.took);
    const char *why = srv_failed(s);
    assert_non_null(why);
    assert_non_null(strstr(why, "restart the server"));
    assert_true(srv_cycle_for_bench(s) < 0);
    {
        client_conn *cl = client(s, "tok-alice");
        int st = 0;
        json_t *reply = NULL;
        TU_OK(client_call(cl, "GET", "/v1/jobs/3", NULL, NULL, 10, &st, &reply));
        assert_int_equal(st, 503);
        json_decref(reply);
        reply = NULL;
        TU_OK(client_call(cl, "GET", "/healthz", NULL, NULL, 10, &st, &reply));
        assert_int_equal(st, 503); /* a supervisor's health check sees it too */
        json_decref(reply);
        client_free(cl);
    }
    srv_stop(s);
    s = srv_up(&c);
    for (int id = 1; id <= 3; id++) {
        job_state(s, id, after, sizeof after);
        if (strcmp(after, before[id - 1]))
            fail_msg("job %d: '%s' after a restart from a lost state, want '%s'", id, after, before[id - 1]);
    }
    srv_stop(s);
    assert_int_equal(preempted_rows(c.db), 0);
    print_message("cancel after the failed cycle: %ld steps, each failed\n", m);
    for (long q = 1; q <= m; q++) {
        restore(c.dir);
        s = srv_up(&c);
        faults_arm(c.dir, 1, 0);
        srv_cycle_for_bench(s);
        faults_disarm();
        faults_arm(c.dir, q, 0);
        cancel_job(s, 3);
        faults_disarm();
        srv_cycle_for_bench(s);
        rows = preempted_rows(c.db);
        if (rows != 1) fail_msg("step %ld of %ld of a cancel after a failed cycle failed: %d ledger rows for jobs "
                                "1 and 2 after the next cycle (want 1)", q, m, rows);
        srv_stop(s);
    }
}

int main(void)
{
    snprintf(nosync_root, sizeof nosync_root, "%s", tu_tmpdir());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_publish_faults),
        cmocka_unit_test(test_publish_mem_faults),
        cmocka_unit_test(test_replica_faults),
        cmocka_unit_test(test_push_replica_faults),
        cmocka_unit_test(test_server_state_faults),
        cmocka_unit_test(test_ledger_faults),
        cmocka_unit_test(test_ledger_cycle_faults),
    };
    return cmocka_run_group_tests_name("faults", tests, NULL, NULL);
}
