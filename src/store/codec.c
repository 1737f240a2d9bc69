/* The store's seam to the delta codec (src/delta). */
#include <errno.h>
#include <fcntl.h>
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
