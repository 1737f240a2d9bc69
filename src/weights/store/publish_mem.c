/* Publishing from memory: the writer already holds the new version's image
 * and the delta that leads to it (a trainer makes both for its workers), so
 * the store writes what it is given and diffs nothing.
 *
 * The durability protocol is store.c's: the payload and manifest are written
 * under staging/, fsynced, the folder is renamed into versions/ (fsynced), and
 * only then does LATEST move.  Unlike store_publish(), a delta version stages
 * only the delta: the full image is never written unless the version is an
 * anchor, so a publish needs free space for its payload, not for a model. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shoal/delta.h"
#include "weights/store/store_int.h"

/* Writes len bytes to dir/name and fsyncs it. */
static int write_payload(const char *dir, const char *name, const void *data, size_t len)
{
    char path[4096];
    SH_TRY(sh_path_join(path, sizeof path, dir, name));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return sh_err_errno(errno, "create %s", path);
    int rc = sh_write_all(fd, data, len, path);
    if (rc == 0 && fsync(fd) < 0) rc = sh_err_errno(errno, "fsync %s", path);
    if (close(fd) < 0 && rc == 0) rc = sh_err_errno(errno, "close %s", path);
    return rc;
}

/* The delta must be one the codec reads and must rebuild an image of this
 * size; whether it applies to LATEST's bytes is checked by every reader
 * against the digests it records (a replica never activates a wrong
 * build). */
static int check_delta(const store_mem_version *in)
{
    delta *d;
    SH_TRY(delta_parse(in->delta, in->delta_len, 0, &d));
    uint64_t size = delta_target_size(d);
    delta_free(d);
    if (size != in->image_len)
        return sh_err(SH_EMISMATCH, "the delta rebuilds %llu bytes, the image has %zu",
                      (unsigned long long)size, in->image_len);
    return SH_OK;
}

static int publish_locked(store *s, const store_mem_version *in, uint64_t every, uint64_t *out)
{
    uint64_t latest, last_anchor = 0;
    SH_TRY(store_latest(s, &latest));
    if (latest != in->base)
        return sh_err(SH_EMISMATCH, "run \"%s\": the new version follows version %llu, but LATEST "
                      "names %llu (another publisher?); nothing was written", s->run,
                      (unsigned long long)in->base, (unsigned long long)latest);
    uint64_t v = latest + 1;
    if (latest) SH_TRY(store__anchor_of(s, latest, &last_anchor));
    int anchor = latest == 0 || !in->delta_len || v - last_anchor >= every;
    if (!anchor) SH_TRY(check_delta(in));
    char final[4096], stage[4096];
    SH_TRY(store__version_dir(s, v, final, sizeof final));
    if (sh_path_exists(final)) SH_TRY(sh_rm_rf(final)); /* a crashed publish's leftover */
    snprintf(stage, sizeof stage, "%s/%010llu.%ld", s->staging, (unsigned long long)v, (long)getpid());
    SH_TRY(sh_rm_rf(stage));
    SH_TRY(sh_mkdir_p(stage, 0755));
    store_version m = {.version = v, .anchor = anchor, .base = anchor ? 0 : latest};
    m.created_at = sh_now_wall();
    m.model_size = in->image_len;
    m.model_xxh3 = sh_hash128_of(in->image, in->image_len);
    snprintf(m.file, sizeof m.file, "%s", anchor ? STORE__ANCHOR_FILE : STORE__DELTA_FILE);
    m.size = anchor ? in->image_len : in->delta_len;
    m.xxh3 = anchor ? m.model_xxh3 : sh_hash128_of(in->delta, in->delta_len);
    int rc = write_payload(stage, m.file, anchor ? in->image : in->delta, (size_t)m.size);
    if (rc == 0) rc = store__write_manifest(s, stage, &m);
    SH_TRY(store__commit_version(s, rc, stage, final, v, latest, " from memory"));
    *out = v;
    return SH_OK;
}

int store_publish_mem(store *s, const store_mem_version *in, const store_publish_opts *o, uint64_t *out)
{
    uint64_t every = o && o->anchor_every ? o->anchor_every : 8;
    if (!in || !in->image || !in->image_len)
        return sh_err(SH_EINVAL, "run \"%s\": publish from memory needs the version's image", s->run);
    if (in->delta_len && !in->delta)
        return sh_err(SH_EINVAL, "run \"%s\": a delta length without a delta", s->run);
    /* Only checkpoints go in: a replica must be able to serve every version. */
    ckpt *c;
    SH_TRY(ckpt_open_mem(in->image, in->image_len, "the image to publish", &c));
    ckpt_close(c);
    int fd;
    SH_TRY(store__lock(s, &fd));
    int rc = publish_locked(s, in, every, out);
    close(fd);
    return rc;
}
