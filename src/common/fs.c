/* Durable file writes and small file-system helpers.
 *
 * The atomic-write protocol: write a temporary in the same directory, fsync
 * it, rename it over the target, fsync the directory.  A crash at any point
 * leaves either the old file or the new one, never a mix. */
#include "shoal/common.h"

#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int sh_path_join(char *out, size_t cap, const char *a, const char *b)
{
    int n = snprintf(out, cap, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= cap) return sh_err(SH_ERANGE, "path too long: %s/%s", a, b);
    return SH_OK;
}

int sh_write_all(int fd, const void *buf, size_t len, const char *what)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return sh_err_errno(errno, "write %s", what);
        }
        p += n;
        len -= (size_t)n;
    }
    return SH_OK;
}

int sh_pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *what)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return sh_err_errno(errno, "write %s", what);
        }
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return SH_OK;
}

int sh_pread_all(int fd, void *buf, size_t len, uint64_t off, const char *what)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return sh_err_errno(errno, "read %s", what);
        }
        if (n == 0) return sh_err(SH_EFORMAT, "%s: unexpected end of file at byte %llu", what,
                                  (unsigned long long)off);
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return SH_OK;
}

int sh_lock_pid(const char *path, int *fd, long *holder)
{
    *fd = -1, *holder = 0;
    int lk = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lk < 0) return sh_err_errno(errno, "open %s", path);
    if (flock(lk, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        char held[32] = "";
        ssize_t k = pread(lk, held, sizeof held - 1, 0);
        held[k > 0 ? k : 0] = 0;
        close(lk);
        *holder = atol(held);
        if (e != EWOULDBLOCK) return sh_err_errno(e, "lock %s", path);
        return sh_err(SH_EEXIST, "%s is held by process %ld", path, *holder);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(lk, 0) < 0 || pwrite(lk, pid, (size_t)n, 0) != n) sh_warn("%s: cannot write the pid", path);
    *fd = lk;
    return SH_OK;
}

int sh_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "open directory %s", dir);
    int rc = SH_OK;
    if (fsync(fd) < 0 && errno != EINVAL) rc = sh_err_errno(errno, "fsync directory %s", dir);
    close(fd);
    return rc;
}

int sh_fsync_parent(const char *path)
{
    char tmp[4096];
    if (strlen(path) >= sizeof tmp) return sh_err(SH_ERANGE, "path too long: %s", path);
    strcpy(tmp, path);
    return sh_fsync_dir(dirname(tmp));
}

/* The temporaries of this process's open atomic files, for
 * sh_atomic_unlink_all() from a signal handler: each slot holds its own
 * copy of the path (so a caller that loses its sh_atomic_file leaves no
 * dangling pointer here) and the pid that opened it (so that a forked child
 * killed by a signal never removes its parent's files).  A full table only
 * means no cleanup on a signal for the files past it. */
#define SH__LIVE 32
static struct {
    int used; /* read with acquire after path and pid are written */
    pid_t pid;
    char path[4096];
} live[SH__LIVE];
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;

static void live_add(const char *tmp)
{
    pthread_mutex_lock(&live_mu);
    for (int i = 0; i < SH__LIVE; i++) {
        if (__atomic_load_n(&live[i].used, __ATOMIC_ACQUIRE)) continue;
        snprintf(live[i].path, sizeof live[i].path, "%s", tmp);
        live[i].pid = getpid();
        __atomic_store_n(&live[i].used, 1, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&live_mu);
}

static void live_del(const char *tmp)
{
    pthread_mutex_lock(&live_mu);
    for (int i = 0; i < SH__LIVE; i++)
        if (__atomic_load_n(&live[i].used, __ATOMIC_ACQUIRE) && live[i].pid == getpid() && !strcmp(live[i].path, tmp)) {
            __atomic_store_n(&live[i].used, 0, __ATOMIC_RELEASE);
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

void sh_atomic_unlink_all(void)
{
    pid_t me = getpid();
    for (int i = 0; i < SH__LIVE; i++)
        if (__atomic_load_n(&live[i].used, __ATOMIC_ACQUIRE) && live[i].pid == me) unlink(live[i].path);
}

int sh_atomic_open(sh_atomic_file *f, const char *path) { return sh_atomic_open_mode(f, path, 0644); }

int sh_atomic_open_mode(sh_atomic_file *f, const char *path, unsigned mode)
{
    f->fd = -1;
    int n1 = snprintf(f->path, sizeof f->path, "%s", path);
    int n2 = snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n1 < 0 || (size_t)n1 >= sizeof f->path || n2 < 0 || (size_t)n2 >= sizeof f->tmp)
        return sh_err(SH_ERANGE, "path too long: %s", path);
    /* Said before any work is done: otherwise the rename at commit fails
     * ("Is a directory", or "busy" for ".") after the whole output was
     * written. */
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return sh_err(SH_EINVAL, "%s is a directory; give the path of a file to write", path);
    /* A fresh file (O_EXCL): one left by someone else could carry a laxer
     * mode or an open descriptor. */
    unlink(f->tmp);
    /* Listed before it exists, so that no signal finds it unlisted. */
    live_add(f->tmp);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (f->fd < 0) {
        int e = errno;
        live_del(f->tmp);
        return sh_err_errno(e, "create %s", f->tmp);
    }
    return SH_OK;
}

int sh_atomic_commit(sh_atomic_file *f)
{
    int rc = SH_OK;
    if (fsync(f->fd) < 0) rc = sh_err_errno(errno, "fsync %s", f->tmp);
    if (close(f->fd) < 0 && rc == SH_OK) rc = sh_err_errno(errno, "close %s", f->tmp);
    f->fd = -1;
    if (rc == SH_OK && rename(f->tmp, f->path) < 0)
        rc = sh_err_errno(errno, "rename %s to %s", f->tmp, f->path);
    live_del(f->tmp);
    if (rc != SH_OK) {
        unlink(f->tmp);
        return rc;
    }
    return sh_fsync_parent(f->path);
}

void sh_atomic_abort(sh_atomic_file *f)
{
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (f->tmp[0]) live_del(f->tmp), unlink(f->tmp);
}

int sh_write_atomic(const char *path, const void *data, size_t len)
{
    return sh_write_atomic_mode(path, data, len, 0644);
}

int sh_write_atomic_mode(const char *path, const void *data, size_t len, unsigned mode)
{
    sh_atomic_file f;
    int rc = sh_atomic_open_mode(&f, path, mode);
    if (rc < 0) return rc;
    rc = sh_write_all(f.fd, data, len, f.tmp);
    if (rc < 0) {
        sh_atomic_abort(&f);
        return rc;
    }
    return sh_atomic_commit(&f);
}

int sh_read_file(const char *path, size_t max_len, char **out, size_t *out_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "open %s", path);
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return sh_err_errno(e, "stat %s", path);
    }
    if ((uint64_t)st.st_size > max_len) {
        close(fd);
        return sh_err(SH_ERANGE, "%s: %lld bytes is more than the limit of %zu", path,
                      (long long)st.st_size, max_len);
    }
    size_t len = (size_t)st.st_size;
    char *buf = malloc(len + 1);
    if (!buf) {
        close(fd);
        return sh_err(SH_ENOMEM, "%s: cannot allocate %zu bytes", path, len + 1);
    }
    int rc = len ? sh_pread_all(fd, buf, len, 0, path) : SH_OK;
    close(fd);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = len;
    return SH_OK;
}

int sh_mkdir_p(const char *path, unsigned mode)
{
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) return sh_err(SH_ERANGE, "bad directory path \"%s\"", path);
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, mode) < 0 && errno != EEXIST) return sh_err_errno(errno, "mkdir %s", tmp);
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST) return sh_err_errno(errno, "mkdir %s", tmp);
    if (!sh_is_dir(tmp)) return sh_err(SH_EEXIST, "%s exists and is not a directory", tmp);
    return SH_OK;
}

int sh_path_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

int sh_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Without recursion: one directory stream open at a time, every step
 * relative to a descriptor (unlinkat, openat with O_NOFOLLOW), never
 * following a symbolic link nor entering another file system.  A directory
 * that cannot be emptied is entered once only (its identity kept in a short
 * list), so the walk ends whatever the tree holds; memory and stack stay
 * the same for a tree 5,000 directories deep and for a million files. */
int sh_rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0) return errno == ENOENT ? SH_OK : sh_err_errno(errno, "stat %s", path);
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) < 0 && errno != ENOENT) return sh_err_errno(errno, "unlink %s", path);
        return SH_OK;
    }
    int cur = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (cur < 0) return errno == ENOENT ? SH_OK : sh_err_errno(errno, "open %s", path);
    struct { dev_t dev; ino_t ino; } stuck[64];
    int nstuck = 0, err = 0;
    long depth = 0;
    for (;;) {
        DIR *d = fdopendir(cur);
        if (!d) {
            err = errno;
            close(cur);
            break;
        }
        int next = -1, failed = 0;
        struct dirent *e;
        while (next < 0 && (e = readdir(d))) {
            const char *n = e->d_name;
            if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
            if (unlinkat(dirfd(d), n, 0) == 0 || errno == ENOENT) continue;
            if (errno != EISDIR && errno != EPERM) {
                err = errno, failed = 1;
                continue;
            }
            if (unlinkat(dirfd(d), n, AT_REMOVEDIR) == 0 || errno == ENOENT) continue;
            if (errno != ENOTEMPTY && errno != EEXIST) {
                err = errno, failed = 1;
                continue;
            }
            struct stat cs;
            int skip = fstatat(dirfd(d), n, &cs, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(cs.st_mode) ||
                       cs.st_dev != st.st_dev;
            for (int k = 0; k < nstuck && !skip; k++) skip = stuck[k].dev == cs.st_dev && stuck[k].ino == cs.st_ino;
            if (skip) {
                failed = 1;
                if (!err) err = ENOTEMPTY;
                continue;
            }
            next = openat(dirfd(d), n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (next < 0) err = errno, failed = 1;
        }
        if (next >= 0) { /* down */
            closedir(d);
            cur = next;
            depth++;
            continue;
        }
        if (depth == 0) {
            closedir(d);
            break;
        }
        /* This directory is as empty as it gets: up, where the parent's
         * next pass removes it (or, if it kept something, skips it). */
        struct stat me;
        if (failed && fstat(dirfd(d), &me) == 0) {
            if (nstuck == 64) {
                closedir(d);
                err = ENOTEMPTY;
                break;
            }
            stuck[nstuck].dev = me.st_dev;
            stuck[nstuck++].ino = me.st_ino;
        }
        cur = openat(dirfd(d), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        closedir(d);
        if (cur < 0) {
            err = errno;
            break;
        }
        depth--;
    }
    if (!err && rmdir(path) < 0 && errno != ENOENT) err = errno;
    return err ? sh_err_errno(err, "remove %s", path) : SH_OK;
}
