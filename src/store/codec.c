/* The store's seam to the delta codec (src/delta). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/delta.h"
#include "store/internal.h"

int store_have_codec(void) { return 1; }

/* The codec renames its output into place; the store's protocol also needs
 * the bytes on disk before the manifest names them. */
static int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "open %s", path);
    int rc = fsync(fd) < 0 ? sh_err_errno(errno, "fsync %s", path) : SH_OK;
    close(fd);
    return rc;
}

int store__delta_make(const char *prev, const char *next, const char *out)
{
    delta_opts o = {0};
    SH_TRY(delta_make(prev, next, out, &o, NULL));
    return fsync_path(out);
}

int store__delta_apply(const char *prev, const char *delta_path, const char *out)
{
    delta_opts o = {0};
    SH_TRY(delta_apply(prev, delta_path, out, &o));
    return fsync_path(out);
}

int store__delta_squash(const char *const *deltas, size_t n, const char *out)
{
    delta_opts o = {0};
    SH_TRY(delta_squash(deltas, n, out, &o, NULL));
    return fsync_path(out);
}

/* The replica's fast path.  delta_apply() reads the base file, writes the
 * target through pwrite and leaves it to the caller to re-hash it; here the
 * base is the model the replica already has mapped and parsed, the target is
 * rebuilt straight into a mapping of the new file (no staging buffer, no
 * write copy), every rebuilt chunk is hashed once while it is in cache (the
 * codec's own target-digest check, which stands in for re-hashing the file),
 * and the file is fsynced once by sh_atomic_commit.  The space is reserved
 * first, so a full disk is an error here and never a SIGBUS on a page
 * fault. */
int store__delta_apply_mapped(const ckpt *base, const char *delta_path, uint64_t size, const char *out)
{
    char *buf = NULL;
    size_t len = 0;
    SH_TRY(sh_read_file(delta_path, (size_t)1 << 34, &buf, &len));
    delta *d = NULL;
    int rc = delta_parse(buf, len, 0, &d);
    if (rc == 0 && delta_target_size(d) != size)
        rc = sh_err(SH_EMISMATCH, "%s: rebuilds %llu bytes, the manifest says %llu", delta_path,
                    (unsigned long long)delta_target_size(d), (unsigned long long)size);
    if (rc == 0 && size == 0) rc = sh_err(SH_EFORMAT, "%s: empty target", delta_path);
    sh_atomic_file f;
    int opened = 0;
    if (rc == 0) rc = sh_atomic_open(&f, out), opened = rc == 0;
    if (rc == 0) {
        int e = posix_fallocate(f.fd, 0, (off_t)size);
        if (e == EOPNOTSUPP || e == EINVAL) e = ftruncate(f.fd, (off_t)size) < 0 ? errno : 0;
        if (e) rc = sh_err_errno(e, "reserve %llu bytes for %s", (unsigned long long)size, out);
    }
    uint8_t *map = NULL;
    if (rc == 0) {
        /* sh_atomic_open's descriptor is write-only; a shared mapping needs
         * one opened for reading too. */
        int fd = open(f.tmp, O_RDWR | O_CLOEXEC);
        if (fd < 0) rc = sh_err_errno(errno, "open %s", f.tmp);
        else {
            map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
            if (map == MAP_FAILED) map = NULL, rc = sh_err_errno(errno, "mmap %s", f.tmp);
            close(fd);
        }
    }
    size_t got = 0;
    delta_opts o = {0};
    if (rc == 0) rc = delta_apply_mem(base, d, &o, map, (size_t)size, &got);
    if (rc == 0 && got != size) rc = sh_err(SH_EFORMAT, "%s: rebuilt %zu bytes, expected %llu", delta_path, got,
                                            (unsigned long long)size);
    if (map) munmap(map, size); /* the dirty pages stay in the page cache for the fsync */
    if (opened) {
        if (rc == 0) rc = sh_atomic_commit(&f);
        else sh_atomic_abort(&f);
    }
    delta_free(d);
    free(buf);
    return rc;
}

/* The replica's fastest path: `spare` is a scratch copy of the delta's base
 * (made after the previous activation, off the critical path).  The delta
 * is applied to it in place, so only the changed elements are written; the
 * codec hashes each chunk once and checks the target digests, undoing every
 * write on failure.  Then one fsync of the whole file (the copied pages
 * too) and a rename make it `out`. */
int store__delta_apply_spare(const char *spare, const char *delta_path, uint64_t size, const char *out)
{
    char *buf = NULL;
    size_t len = 0;
    SH_TRY(sh_read_file(delta_path, (size_t)1 << 34, &buf, &len));
    delta *d = NULL;
    int rc = delta_parse(buf, len, 0, &d);
    if (rc == 0 && delta_target_size(d) != size)
        rc = sh_err(SH_EMISMATCH, "%s: rebuilds %llu bytes, the manifest says %llu", delta_path,
                    (unsigned long long)delta_target_size(d), (unsigned long long)size);
    int fd = rc == 0 ? open(spare, O_RDWR | O_CLOEXEC) : -1;
    if (rc == 0 && fd < 0) rc = sh_err_errno(errno, "open %s", spare);
    struct stat st;
    if (rc == 0 && fstat(fd, &st) < 0) rc = sh_err_errno(errno, "stat %s", spare);
    if (rc == 0 && (uint64_t)st.st_size != size)
        rc = sh_err(SH_EMISMATCH, "%s: %llu bytes, the target has %llu", spare,
                    (unsigned long long)st.st_size, (unsigned long long)size);
    uint8_t *map = NULL;
    if (rc == 0 && size) {
        map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (map == MAP_FAILED) map = NULL, rc = sh_err_errno(errno, "mmap %s", spare);
    }
    delta_opts o = {0};
    if (rc == 0) rc = delta_apply_mem_inplace(map, (size_t)size, d, &o);
    if (map) munmap(map, size);
    if (rc == 0 && fsync(fd) < 0) rc = sh_err_errno(errno, "fsync %s", spare);
    if (fd >= 0) close(fd);
    if (rc == 0 && rename(spare, out) < 0) rc = sh_err_errno(errno, "rename %s to %s", spare, out);
    if (rc == 0) rc = sh_fsync_parent(out);
    delta_free(d);
    free(buf);
    return rc;
}
