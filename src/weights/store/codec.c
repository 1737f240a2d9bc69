/* The store's seam to the delta codec (src/weights/delta). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/delta.h"
#include "weights/store/store_int.h"

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

int store__delta_make(const char *prev, const char *next, const char *out, sh_progress *pg)
{
    delta_opts o = {.progress = pg};
    SH_TRY(delta_make(prev, next, out, &o, NULL));
    return fsync_path(out);
}

int store__delta_make_ckpt(const char *prev, const ckpt *next, const char *out, sh_progress *pg)
{
    ckpt *b;
    SH_TRY(ckpt_open(prev, &b));
    int rc = delta_make_ckpt(b, next, out, &(delta_opts){.progress = pg}, NULL);
    ckpt_close(b);
    return rc == SH_OK ? fsync_path(out) : rc;
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

/* Reads and parses a delta whose single-file target must be `size` bytes.
 * The caller frees *buf and *d. */
static int load_delta(const char *delta_path, uint64_t size, char **buf, delta **d)
{
    size_t len = 0;
    *d = NULL;
    SH_TRY(sh_read_file(delta_path, (size_t)1 << 34, buf, &len));
    int rc = delta_parse(*buf, len, 0, d);
    if (rc == 0 && delta_target_size(*d) != size)
        rc = sh_err(SH_EMISMATCH, "%s: rebuilds %llu bytes, the manifest says %llu", delta_path,
                    (unsigned long long)delta_target_size(*d), (unsigned long long)size);
    if (rc == 0 && size == 0) rc = sh_err(SH_EFORMAT, "%s: empty target", delta_path);
    return rc;
}

/* The replica's path without a model image: the base is the model the replica
 * already has mapped and parsed; the target is rebuilt straight into a
 * mapping of the new file `out` (no staging buffer, no write copy), and
 * every rebuilt chunk is hashed once while it is in cache (the codec's own
 * target-digest check, which stands in for re-hashing the file).  Not
 * fsynced: the caller makes it durable before anything names it. */
int store__delta_build(const ckpt *base, const char *delta_path, uint64_t size, const char *out)
{
    char *buf = NULL;
    delta *d = NULL;
    uint8_t *map = NULL;
    int rc = load_delta(delta_path, size, &buf, &d);
    if (rc == 0) rc = sh_map_rw(out, size, 1, &map, NULL);
    size_t got = 0;
    delta_opts o = {0};
    if (rc == 0) rc = delta_apply_mem(base, d, &o, map, (size_t)size, &got);
    if (rc == 0 && got != size)
        rc = sh_err(SH_EFORMAT, "%s: rebuilt %zu bytes, expected %llu", delta_path, got,
                    (unsigned long long)size);
    if (map) munmap(map, size); /* the dirty pages stay in the page cache for the fsync */
    if (rc < 0) unlink(out);
    delta_free(d);
    free(buf);
    return rc;
}

/* The replica's fast path: `img` (`size` bytes) holds the delta's base in
 * memory.  The delta is applied to it in place, so only the changed
 * elements are written; the codec hashes each chunk once and checks the
 * target digests, undoing every write on failure (img then still holds the
 * base).  With a cache, chunks the delta leaves alone are not hashed again. */
int store__delta_patch_mem(uint8_t *img, uint64_t size, const char *delta_path, delta_ip_cache *cache,
                           int threads, void (*chunk_done)(void *, size_t, uint64_t, uint32_t), void *arg)
{
    char *buf = NULL;
    delta *d = NULL;
    int rc = load_delta(delta_path, size, &buf, &d);
    delta_opts o = {.threads = threads, .chunk_done = chunk_done, .chunk_arg = arg};
    if (rc == 0) rc = delta_apply_mem_inplace_cached(img, (size_t)size, d, &o, cache);
    delta_free(d);
    free(buf);
    return rc;
}
