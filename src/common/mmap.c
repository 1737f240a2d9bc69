/* Writable shared file mappings populated in one batch. */
#include "shoal/common.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
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

/* ---- Kept mappings ------------------------------------------------------ */

#define SH__KEEP 8
#define SH__KEEP_MIN (4u << 20) /* smaller mappings are not worth a slot */

typedef struct keep {
    dev_t dev;
    ino_t ino;
    uint64_t size;
    int writable;
    uint8_t *map;
    int fd; /* a descriptor of the file, to see when it is deleted */
    unsigned long used; /* release order, for eviction */
} keep;

static keep keeps[SH__KEEP];
static unsigned long keep_clock;
static pthread_mutex_t keep_mu = PTHREAD_MUTEX_INITIALIZER;

static void keep_drop(keep *k)
{
    munmap(k->map, k->size);
    close(k->fd);
    memset(k, 0, sizeof *k);
}

/* Lets go of kept mappings whose file is deleted everywhere: they only
 * hold its memory.  Under keep_mu. */
static void keep_prune(void)
{
    for (int i = 0; i < SH__KEEP; i++) {
        struct stat ks;
        if (keeps[i].map && (fstat(keeps[i].fd, &ks) < 0 || ks.st_nlink == 0)) keep_drop(&keeps[i]);
    }
}

int sh_map_keep(int fd, uint64_t size, int writable, uint8_t **out)
{
    *out = NULL;
    struct stat st;
    if (fstat(fd, &st) < 0) return sh_err_errno(errno, "stat a file to map");
    if ((uint64_t)st.st_size < size)
        return sh_err(SH_EINVAL, "map %llu bytes of a file of %lld", (unsigned long long)size,
                      (long long)st.st_size);
    if (size == 0) return SH_OK;
    pthread_mutex_lock(&keep_mu);
    keep_prune();
    for (int i = 0; i < SH__KEEP && !*out; i++) {
        keep *k = &keeps[i];
        if (k->map && k->dev == st.st_dev && k->ino == st.st_ino && k->size == size &&
            k->writable == writable) {
            *out = k->map;
            close(k->fd);
            memset(k, 0, sizeof *k); /* the caller's until released */
        }
    }
    pthread_mutex_unlock(&keep_mu);
    if (*out) return SH_OK;
    void *m = mmap(NULL, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return sh_err_errno(errno, "mmap %llu bytes", (unsigned long long)size);
#ifdef MADV_POPULATE_READ
    /* A reader's page table in one batch, not a fault per 4 KiB (a writer
     * populates what it writes, when it writes it). */
    if (!writable && madvise(m, size, MADV_POPULATE_READ) < 0)
#endif
        if (!writable) madvise(m, size, MADV_WILLNEED);
    *out = m;
    return SH_OK;
}

void sh_map_keep_release(uint8_t *map, uint64_t size, int fd, int writable)
{
    if (!map) return;
    struct stat st;
    int kfd = size >= SH__KEEP_MIN && fd >= 0 && fstat(fd, &st) == 0 && st.st_nlink > 0
                  ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (kfd < 0) {
        munmap(map, size);
        return;
    }
    pthread_mutex_lock(&keep_mu);
    keep_prune();
    keep *slot = NULL;
    for (int i = 0; i < SH__KEEP; i++) {
        keep *k = &keeps[i];
        if (!k->map) { slot = k; break; }
        if (!slot || k->used < slot->used) slot = k;
    }
    if (slot->map) keep_drop(slot);
    *slot = (keep){st.st_dev, st.st_ino, size, writable != 0, map, kfd, ++keep_clock};
    pthread_mutex_unlock(&keep_mu);
}
