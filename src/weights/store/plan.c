/* Plans (the cheapest byte path between versions), materialising a version,
 * garbage collection, and file helpers. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "weights/store/store_int.h"

#define COPY_BLOCK (4u << 20)

/* Streams src through xxh3-128, also writing it to fd unless fd < 0 (then
 * dst_name is unused); a copy is fsynced.  pg (optional) follows src. */
static int stream_hash(const char *src, int fd, const char *dst_name, sh_hash128 *h, uint64_t *size,
                       sh_progress *pg)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return sh_err_errno(errno, "open %s", src);
    struct stat st;
    if (pg && !pg->total && fstat(in, &st) == 0) pg->total = (uint64_t)st.st_size;
    uint8_t *buf = malloc(COPY_BLOCK);
    sh_hasher *hs = sh_hasher_new();
    int rc = buf && hs ? SH_OK : sh_err(SH_ENOMEM, "copy buffer");
    uint64_t total = 0;
    while (rc == 0) {
        ssize_t n = read(in, buf, COPY_BLOCK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) rc = sh_err_errno(errno, "read %s", src);
        if (n <= 0) break;
        sh_hasher_update(hs, buf, (size_t)n);
        if (fd >= 0) rc = sh_write_all(fd, buf, (size_t)n, dst_name);
        total += (uint64_t)n;
        if (pg) sh_progress_update(pg, total);
    }
    if (rc == 0 && fd >= 0 && fsync(fd) < 0) rc = sh_err_errno(errno, "fsync %s", dst_name);
    if (rc == 0) {
        *h = sh_hasher_digest(hs);
        *size = total;
    }
    sh_hasher_free(hs);
    free(buf);
    close(in);
    return rc;
}

int store__copy_hash(const char *src, int fd, const char *dst_name, sh_hash128 *h, uint64_t *size,
                     sh_progress *pg)
{
    return stream_hash(src, fd, dst_name, h, size, pg);
}

int store__hash_file(const char *path, sh_hash128 *h, uint64_t *size)
{
    return stream_hash(path, -1, NULL, h, size, NULL);
}

/* ---- Plans -------------------------------------------------------------- */

const char *store_plan_kind_name(int kind)
{
    switch (kind) {
    case STORE_PLAN_NONE: return "none";
    case STORE_PLAN_CHAIN: return "chain";
    case STORE_PLAN_SQUASH: return "squash";
    case STORE_PLAN_ANCHOR: return "anchor";
    }
    return "?";
}

int store_squash_path(store *s, uint64_t from, uint64_t to, char *out, size_t cap)
{
    int k = snprintf(out, cap, "%s/squash/%010llu-%010llu.shd", s->dir, (unsigned long long)from,
                     (unsigned long long)to);
    if (k < 0 || (size_t)k >= cap) return sh_err(SH_ERANGE, "squash path too long");
    return SH_OK;
}

int store_plan_make(store *s, uint64_t from, uint64_t to, store_plan *p)
{
    memset(p, 0, offsetof(store_plan, steps));
    p->nsteps = 0;
    p->from = from, p->to = to;
    p->chain_bytes = p->squash_bytes = p->anchor_bytes = UINT64_MAX;
    if (from == to && to) {
        p->kind = STORE_PLAN_NONE;
        p->chain_bytes = 0;
        return SH_OK;
    }
    /* Walk back from `to` to its anchor, collecting the deltas. */
    uint64_t chain[STORE_MAX_CHAIN], sizes[STORE_MAX_CHAIN];
    size_t n = 0;
    uint64_t v = to;
    for (;;) {
        store_version m;
        int rc = store_get(s, v, &m, NULL);
        if (rc < 0 && v != to)
            return sh_err_wrap(rc, "version %llu chains back to version %llu",
                               (unsigned long long)to, (unsigned long long)v);
        if (rc < 0) return rc;
        if (n == STORE_MAX_CHAIN) return sh_err(SH_ERANGE, "version %llu: chain too long", (unsigned long long)to);
        chain[n] = v, sizes[n] = m.size, n++;
        if (m.anchor) break;
        v = m.base;
    }
    /* chain[n-1] is the anchor; chain[0] is `to`. */
    p->anchor = chain[n - 1];
    p->anchor_bytes = 0;
    for (size_t i = 0; i < n; i++) p->anchor_bytes += sizes[i];
    if (from >= p->anchor && from < to) {
        p->chain_bytes = 0;
        for (size_t i = 0; i < n && chain[i] > from; i++) p->chain_bytes += sizes[i];
        char sq[4096];
        struct stat st;
        if (to - from >= 2 && store_squash_path(s, from, to, sq, sizeof sq) == 0 && stat(sq, &st) == 0)
            p->squash_bytes = (uint64_t)st.st_size;
    } else if (from > 0 && from < to) {
        /* From before the anchor: one delta across it, when the push root
         * made one (store__cross_delta). */
        char sq[4096];
        struct stat st;
        if (store_squash_path(s, from, to, sq, sizeof sq) == 0 && stat(sq, &st) == 0)
            p->squash_bytes = (uint64_t)st.st_size;
    }
    p->kind = STORE_PLAN_ANCHOR, p->bytes = p->anchor_bytes;
    if (p->chain_bytes < p->bytes) p->kind = STORE_PLAN_CHAIN, p->bytes = p->chain_bytes;
    if (p->squash_bytes < p->bytes) p->kind = STORE_PLAN_SQUASH, p->bytes = p->squash_bytes;
    uint64_t start = p->kind == STORE_PLAN_ANCHOR ? p->anchor : from;
    for (size_t i = n; i-- > 0;)
        if (chain[i] > start && p->kind != STORE_PLAN_SQUASH) p->steps[p->nsteps++] = chain[i];
    return SH_OK;
}

/* ---- Materialise -------------------------------------------------------- */

static int check_model(const store_version *ver, const char *path)
{
    sh_hash128 h;
    uint64_t n;
    SH_TRY(store__hash_file(path, &h, &n));
    if (n != ver->model_size || !sh_hash128_eq(h, ver->model_xxh3))
        return sh_err(SH_EMISMATCH, "version %llu: the rebuilt checkpoint %s does not match the "
                      "manifest's model_xxh3 (%llu bytes, manifest %llu)",
                      (unsigned long long)ver->version, path, (unsigned long long)n,
                      (unsigned long long)ver->model_size);
    return SH_OK;
}

int store_apply_payload(const store_version *ver, const char *payload, const char *prev, const char *out)
{
    int rc;
    if (ver->anchor) {
        sh_atomic_file f;
        SH_TRY(sh_atomic_open(&f, out));
        sh_hash128 h;
        uint64_t n;
        rc = store__copy_hash(payload, f.fd, f.tmp, &h, &n, NULL);
        if (rc == 0 && (n != ver->model_size || !sh_hash128_eq(h, ver->model_xxh3)))
            rc = sh_err(SH_EMISMATCH, "version %llu: anchor %s does not match its manifest",
                        (unsigned long long)ver->version, payload);
        if (rc < 0) {
            sh_atomic_abort(&f);
            return rc;
        }
        return sh_atomic_commit(&f);
    }
    if (!prev) return sh_err(SH_EINVAL, "version %llu is a delta: it needs version %llu to apply to",
                             (unsigned long long)ver->version, (unsigned long long)ver->base);
    rc = store__delta_apply(prev, payload, out);
    if (rc == 0) rc = check_model(ver, out);
    if (rc < 0) unlink(out);
    return rc;
}

int store_materialize(store *s, uint64_t v, uint64_t have, const char *have_path, const char *out)
{
    store_plan *p = malloc(sizeof *p);
    if (!p) return sh_err(SH_ENOMEM, "plan");
    int rc = store_plan_make(s, have_path ? have : 0, v, p);
    if (rc == 0 && p->kind == STORE_PLAN_SQUASH) {
        /* One squashed delta from `have` straight to v. */
        store_version m;
        char sq[4096];
        rc = store_get(s, v, &m, NULL);
        if (rc == 0) rc = store_squash_path(s, have, v, sq, sizeof sq);
        if (rc == 0) rc = store__delta_apply(have_path, sq, out);
        if (rc == 0) rc = check_model(&m, out);
        if (rc < 0) unlink(out);
        free(p);
        return rc;
    }
    char cur[4096], next[4096], payload[4096];
    snprintf(cur, sizeof cur, "%s", "");
    if (rc == 0 && p->kind == STORE_PLAN_NONE) {
        store_version m;
        rc = store_get(s, v, &m, NULL);
        if (rc == 0) rc = check_model(&m, have_path);
        if (rc == 0) {
            sh_atomic_file f;
            sh_hash128 h;
            uint64_t n;
            rc = sh_atomic_open(&f, out);
            if (rc == 0) rc = store__copy_hash(have_path, f.fd, f.tmp, &h, &n, NULL);
            rc = rc == 0 ? sh_atomic_commit(&f) : (sh_atomic_abort(&f), rc);
        }
        free(p);
        return rc;
    }
    if (rc == 0 && p->kind == STORE_PLAN_ANCHOR) {
        store_version m;
        snprintf(cur, sizeof cur, "%s.step%llu", out, (unsigned long long)p->anchor);
        rc = store_get(s, p->anchor, &m, NULL);
        if (rc == 0) rc = store_payload_path(s, p->anchor, payload, sizeof payload);
        if (rc == 0) rc = store_apply_payload(&m, payload, NULL, cur);
    } else if (rc == 0) {
        snprintf(cur, sizeof cur, "%s", have_path);
    }
    for (size_t i = 0; rc == 0 && i < p->nsteps; i++) {
        store_version m;
        snprintf(next, sizeof next, "%s.step%llu", out, (unsigned long long)p->steps[i]);
        rc = store_get(s, p->steps[i], &m, NULL);
        if (rc == 0) rc = store_payload_path(s, p->steps[i], payload, sizeof payload);
        if (rc == 0) rc = store_apply_payload(&m, payload, cur, next);
        if (strcmp(cur, have_path ? have_path : "")) unlink(cur);
        snprintf(cur, sizeof cur, "%s", next);
    }
    if (rc == 0 && rename(cur, out) < 0) rc = sh_err_errno(errno, "rename %s to %s", cur, out);
    if (rc == 0) rc = sh_fsync_parent(out);
    if (rc < 0 && cur[0] && strcmp(cur, have_path ? have_path : "")) unlink(cur);
    free(p);
    return rc;
}

int store_squash(store *s, uint64_t from, uint64_t to, uint64_t *bytes)
{
    if (from == 0 || to < from + 2)
        return sh_err(SH_EINVAL, "squash %llu..%llu: needs a version to start from and at least two "
                      "deltas after it", (unsigned long long)from, (unsigned long long)to);
    /* The arrays below are sized by to - from before any version is read:
     * bound it by the longest chain a store may hold, not by memory. */
    if (to - from > STORE_MAX_CHAIN)
        return sh_err(SH_EINVAL, "squash %llu..%llu: more than %d deltas; a chain is at most "
                      "that long", (unsigned long long)from, (unsigned long long)to, STORE_MAX_CHAIN);
    const char **paths = calloc(to - from, sizeof *paths);
    char(*bufs)[4096] = calloc(to - from, sizeof *bufs);
    int rc = paths && bufs ? SH_OK : sh_err(SH_ENOMEM, "squash");
    for (uint64_t v = from + 1; rc == 0 && v <= to; v++) {
        store_version m;
        rc = store_get(s, v, &m, NULL);
        if (rc == 0 && (m.anchor || m.base != v - 1))
            rc = sh_err(SH_EINVAL, "squash %llu..%llu: version %llu is an anchor; squash from it instead",
                        (unsigned long long)from, (unsigned long long)to, (unsigned long long)v);
        if (rc == 0) rc = store_payload_path(s, v, bufs[v - from - 1], sizeof bufs[0]);
        paths[v - from - 1] = bufs[v - from - 1];
    }
    char dir[4096], out[4096];
    if (rc == 0) rc = sh_path_join(dir, sizeof dir, s->dir, "squash");
    if (rc == 0) rc = sh_mkdir_p(dir, 0755);
    if (rc == 0) rc = store_squash_path(s, from, to, out, sizeof out);
    if (rc == 0) rc = store__delta_squash(paths, (size_t)(to - from), out);
    if (rc == 0) rc = sh_fsync_dir(dir);
    struct stat st;
    if (rc == 0 && bytes) *bytes = stat(out, &st) == 0 ? (uint64_t)st.st_size : 0;
    free(paths);
    free(bufs);
    return rc;
}

int store__cross_delta(store *s, uint64_t from, uint64_t to, uint64_t *bytes)
{
    uint64_t anchor = 0;
    SH_TRY(store__anchor_of(s, to, &anchor));
    if (from == 0 || from >= anchor)
        return sh_err(SH_EINVAL, "delta %llu..%llu: does not cross version %llu's anchor %llu",
                      (unsigned long long)from, (unsigned long long)to, (unsigned long long)to,
                      (unsigned long long)anchor);
    char dir[4096], out[4096], a[4096], b[4096], target[4096];
    SH_TRY(sh_path_join(dir, sizeof dir, s->dir, "squash"));
    SH_TRY(sh_mkdir_p(dir, 0755));
    SH_TRY(store_squash_path(s, from, to, out, sizeof out));
    snprintf(a, sizeof a, "%s.from.%ld", out, (long)getpid());
    snprintf(b, sizeof b, "%s.to.%ld", out, (long)getpid());
    store_version m;
    int rc = store_get(s, to, &m, NULL);
    int to_is_file = rc == 0 && m.anchor;
    if (rc == 0) rc = store_materialize(s, from, 0, NULL, a);
    if (rc == 0 && to_is_file) rc = store_payload_path(s, to, target, sizeof target);
    else if (rc == 0) rc = store_materialize(s, to, 0, NULL, b), snprintf(target, sizeof target, "%s", b);
    if (rc == 0) rc = store__delta_make(a, target, out, NULL);
    if (rc == 0) rc = sh_fsync_dir(dir);
    unlink(a);
    unlink(b);
    struct stat st;
    if (rc == 0 && bytes) *bytes = stat(out, &st) == 0 ? (uint64_t)st.st_size : 0;
    return rc;
}

/* ---- Garbage collection ------------------------------------------------- */

static int remove_version(store *s, uint64_t v)
{
    /* Renamed out of versions/ first, so that a crash mid-removal never
     * leaves a half-deleted folder that looks like a version. */
    char dir[4096], trash[4096];
    SH_TRY(store__version_dir(s, v, dir, sizeof dir));
    snprintf(trash, sizeof trash, "%s/gc-%010llu.%ld", s->staging, (unsigned long long)v, (long)getpid());
    SH_TRY(sh_mkdir_p(s->staging, 0755));
    if (rename(dir, trash) < 0) return sh_err_errno(errno, "rename %s to %s", dir, trash);
    SH_TRY(sh_fsync_dir(s->versions));
    return sh_rm_rf(trash);
}

void store__clean_staging(store *s)
{
    DIR *d = opendir(s->staging);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *dot = strrchr(e->d_name, '.');
        if (e->d_name[0] == '.' || !dot) continue;
        long pid = strtol(dot + 1, NULL, 10);
        if (pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM)) continue;
        char path[4096];
        if (sh_path_join(path, sizeof path, s->staging, e->d_name) == 0) sh_rm_rf(path);
    }
    closedir(d);
}

/* Squashed deltas that start before what gc kept can no longer be used. */
static void clean_squash(store *s, uint64_t floor)
{
    char dir[4096];
    if (sh_path_join(dir, sizeof dir, s->dir, "squash") < 0) return;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        unsigned long long from = 0;
        if (sscanf(e->d_name, "%10llu-", &from) != 1 || from >= floor) continue;
        char path[4096];
        if (sh_path_join(path, sizeof path, dir, e->d_name) == 0) unlink(path);
    }
    if (d) closedir(d);
}

static int gc_locked(store *s, uint64_t keep, uint64_t *removed)
{
    uint64_t latest;
    SH_TRY(store_latest(s, &latest));
    store_version *list;
    size_t n, broken;
    SH_TRY(store_list(s, &list, &n, &broken));
    uint64_t lo = latest >= keep ? latest - keep + 1 : 1;
    /* Everything the kept versions chain back to is kept too; a kept
     * version whose chain is broken stops the collection. */
    uint64_t floor = lo;
    int rc = SH_OK;
    if (latest) {
        store_plan *p = malloc(sizeof *p);
        if (!p) rc = sh_err(SH_ENOMEM, "plan");
        for (uint64_t v = lo; rc == 0 && v <= latest; v++) {
            rc = store_plan_make(s, 0, v, p);
            if (rc < 0) rc = sh_err_wrap(rc, "gc keeps version %llu", (unsigned long long)v);
            else if (p->anchor < floor) floor = p->anchor;
        }
        free(p);
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint64_t v = list[i].version;
        if (latest && v >= floor && v <= latest) continue;
        rc = remove_version(s, v);
        if (rc == 0) (*removed)++;
    }
    free(list);
    if (rc == 0) store__clean_staging(s);
    if (rc == 0) clean_squash(s, latest ? floor : UINT64_MAX);
    return rc;
}

int store_gc(store *s, uint64_t keep, uint64_t *removed)
{
    *removed = 0;
    if (keep == 0) return sh_err(SH_EINVAL, "gc --keep must be at least 1");
    /* Under the publishers' lock: a publish renames its version folder in
     * before LATEST names it, and gc removes every folder above LATEST, so
     * without the lock a gc between those two steps deleted the version
     * LATEST then named. */
    int fd;
    SH_TRY(store__lock(s, &fd));
    int rc = gc_locked(s, keep, removed);
    close(fd);
    return rc;
}
