/* Writable shared file mappings populated in one batch. */
#include "shoal/common.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int reserve(int fd, uint64_t size, const char *path)
{
    int e = posix_fallocate(fd, 0, (off_t)size);
    if (e == EOPNOTSUPP || e == EINVAL) e = ftruncate(fd, (off_t)size) < 0 ? errno : 0;
    if (e) return sh_err_errno(e, "reserve %llu bytes for %s", (unsigned long long)size, path);
    return SH_OK;
}

static int check_size(int fd, uint64_t size, const char *path)
{
    struct stat st;
    if (fstat(fd, &st) < 0) return sh_err_errno(errno, "stat %s", path);
    if ((uint64_t)st.st_size != size)
        return sh_err(SH_EMISMATCH, "%s: %llu bytes, expected %llu", path,
                      (unsigned long long)st.st_size, (unsigned long long)size);
    return SH_OK;
}

int sh_map_rw(const char *path, uint64_t size, int create, uint8_t **out, int *fd_out)
{
    *out = NULL;
    if (fd_out) *fd_out = -1;
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), 0644);
    if (fd < 0) return sh_err_errno(errno, "open %s", path);
    int rc = create ? reserve(fd, size, path) : check_size(fd, size, path);
    if (rc == 0 && size > 0) {
        void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            rc = sh_err_errno(errno, "mmap %s", path);
        } else {
            *out = m;
#ifdef MADV_POPULATE_WRITE
            /* MAP_POPULATE maps a shared mapping's pages read-only, so
             * every first write would still fault. */
            if (madvise(m, size, MADV_POPULATE_WRITE) < 0)
#endif
                madvise(m, size, MADV_WILLNEED);
        }
    }
    if (rc == 0 && fd_out) *fd_out = fd;
    else close(fd);
    return rc;
}
