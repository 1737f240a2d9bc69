/* Objects held by a push node: a mapped payload file and its chunk state. */
#include "weights/push/obj_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int bcast__manifest_parse(const char *text, uint64_t *version, uint64_t *base, int *anchor,
                          uint64_t *size, sh_hash128 *hash)
{
    json_t *j;
    SH_TRY(sh_json_parse(text, strlen(text), "manifest", &j));
    int64_t v = 0, b = 0, sz = 0;
    const char *kind = NULL, *hex = NULL;
    int rc = sh_json_get_i64(j, "version", 1, "manifest", &v);
    if (rc == 0) rc = sh_json_get_str(j, "kind", 1, "manifest", &kind);
    if (rc == 0) rc = sh_json_get_i64(j, "base", 0, "manifest", &b);
    if (rc == 0) rc = sh_json_get_i64(j, "size", 1, "manifest", &sz);
    if (rc == 0) rc = sh_json_get_str(j, "xxh3", 1, "manifest", &hex);
    if (rc == 0 && (v <= 0 || b < 0 || sz < 0))
        rc = sh_err(SH_EFORMAT, "manifest: version, base and size must be positive");
    if (rc == 0 && strcmp(kind, "anchor") && strcmp(kind, "delta"))
        rc = sh_err(SH_EFORMAT, "manifest v%lld: kind \"%s\" is neither anchor nor delta",
                    (long long)v, kind);
    if (rc == 0 && sh_hash128_parse(hex, hash) < 0)
        rc = sh_err(SH_EFORMAT, "manifest v%lld: xxh3 \"%s\" is not 32 hex digits", (long long)v, hex);
    if (rc == 0) {
        *version = (uint64_t)v;
        *anchor = !strcmp(kind, "anchor");
        *base = *anchor ? 0 : (uint64_t)b;
        *size = (uint64_t)sz;
        if (!*anchor && *base + 1 != *version)
            rc = sh_err(SH_EFORMAT, "manifest v%lld: a delta's base must be v%lld, not v%lld",
                        (long long)v, (long long)v - 1, (long long)b);
    }
    json_decref(j);
    return rc;
}

static int alloc_state(bcast__obj *o, const char *manifest, size_t mlen)
{
    o->manifest = malloc(mlen + 1);
    o->verified = calloc(o->nchunks ? o->nchunks : 1, 1);
    o->receiving = calloc(o->nchunks ? o->nchunks : 1, 1);
    o->summed = calloc(o->nchunks ? o->nchunks : 1, 1);
    o->sums = calloc(o->nchunks ? o->nchunks : 1, sizeof *o->sums);
    o->ready_at = calloc(o->nchunks ? o->nchunks : 1, sizeof *o->ready_at);
    if (!o->manifest || !o->verified || !o->receiving || !o->summed || !o->sums || !o->ready_at) return sh_err(SH_ENOMEM, "push object state");
    memcpy(o->manifest, manifest, mlen);
    o->manifest[mlen] = 0;
    return SH_OK;
}

static int map_file(bcast__obj *o)
{
    if (o->size == 0) return SH_OK; /* nothing to map; every chunk loop is empty */
    /* Populated up front: one batch instead of a page fault per 4 KiB as
     * chunks land or leave, which costs more than the copy itself (and much
     * more in a virtual machine, where every fault exits to the host). */
    o->map = mmap(NULL, o->size, PROT_READ, MAP_SHARED | MAP_POPULATE, o->fd, 0);
    if (o->map == MAP_FAILED) {
        o->map = NULL;
        return sh_err_errno(errno, "mmap %s", o->path);
    }
    return SH_OK;
}

/* Opens and maps the root's payload; `size` is checked unless it is
 * UINT64_MAX, when it is taken from the file. */
static int open_payload(bcast__obj *o, const char *path, uint64_t size)
{
    snprintf(o->path, sizeof o->path, "%s", path);
    o->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (o->fd < 0) return sh_err_errno(errno, "open %s", path);
    struct stat st;
    if (fstat(o->fd, &st) < 0) return sh_err_errno(errno, "stat %s", path);
    if (size != UINT64_MAX && (uint64_t)st.st_size != size)
        return sh_err(SH_EFORMAT, "%s: %lld bytes, but its manifest says %llu", path,
                      (long long)st.st_size, (unsigned long long)size);
    o->size = (uint64_t)st.st_size;
    return map_file(o);
}

static int root_obj(const char *manifest, const char *path, uint32_t chunk_size, uint64_t squash_base,
                    bcast__obj **out)
{
    bcast__obj *o = calloc(1, sizeof *o);
    if (!o) return sh_err(SH_ENOMEM, "push object");
    o->fd = -1;
    int rc = bcast__manifest_parse(manifest, &o->version, &o->base, &o->anchor, &o->size, &o->hash);
    if (rc == 0 && squash_base) {
        /* The target may be an anchor (a delta across it). */
        if (squash_base >= o->version)
            rc = sh_err(SH_EINVAL, "push: a squashed delta to v%llu cannot start at v%llu",
                        (unsigned long long)o->version, (unsigned long long)squash_base);
        o->squash = 1, o->anchor = 0, o->base = squash_base;
    }
    if (rc == 0) rc = open_payload(o, path, o->squash ? UINT64_MAX : o->size);
    if (rc == 0 && o->squash) o->hash = sh_hash128_of(o->map ? o->map : (const uint8_t *)"", o->size);
    if (rc == 0) {
        o->chunk_size = chunk_size;
        o->nchunks = (uint32_t)((o->size + chunk_size - 1) / chunk_size);
        rc = alloc_state(o, manifest, strlen(manifest));
    }
    if (rc < 0) {
        bcast__obj_free(o);
        return rc;
    }
    memset(o->verified, 1, o->nchunks);
    double now = sh_now_mono();
    for (uint32_t i = 0; i < o->nchunks; i++) o->ready_at[i] = now;
    o->nverified = o->nchunks;
    o->complete = 1;
    *out = o;
    return SH_OK;
}

int bcast__obj_from_file(const char *manifest, const char *path, uint32_t chunk_size,
                         bcast__obj **out)
{
    return root_obj(manifest, path, chunk_size, 0, out);
}

int bcast__obj_squash(const char *manifest, const char *path, uint64_t base, uint32_t chunk_size,
                      bcast__obj **out)
{
    return root_obj(manifest, path, chunk_size, base, out);
}

int bcast__obj_spool_path(const bcast__offer *of, const char *spool, char *out, size_t cap)
{
    int k = snprintf(out, cap, "%s/v%llu.part", spool, (unsigned long long)of->version);
    return k < 0 || (size_t)k >= cap ? sh_err(SH_ERANGE, "spool path too long: %s", spool) : SH_OK;
}

/* The spool file, mapped writable and not populated: a new file's pages
 * are allocated (and zeroed) chunk by chunk as chunks land, not all at the
 * OFFER, which in a chain would delay every hop's first chunk by the
 * allocation of a whole payload.  The mapping is the object's only while
 * it is received or sent (bcast__obj_unmap): a replica's memory is its
 * model, not every payload since the last anchor. */
static int open_spool(bcast__obj *o, int reused)
{
    o->fd = open(o->path, O_RDWR | O_CLOEXEC | O_CREAT | (reused ? 0 : O_TRUNC), 0644);
    if (o->fd < 0) return sh_err_errno(errno, "create %s", o->path);
    if (ftruncate(o->fd, (off_t)o->size) < 0) return sh_err_errno(errno, "size %s", o->path);
    if (o->size == 0) return SH_OK;
    void *m = mmap(NULL, o->size, PROT_READ | PROT_WRITE, MAP_SHARED, o->fd, 0);
    if (m == MAP_FAILED) return sh_err_errno(errno, "mmap %s", o->path);
    o->map = m;
    return SH_OK;
}

void bcast__obj_unmap(bcast__obj *o)
{
    if (!o->owned || !o->map || !o->complete || o->refs > 0) return;
    for (uint32_t i = 0; i < o->nchunks; i++)
        if (o->receiving[i]) return;
    munmap(o->map, o->size);
    o->map = NULL;
}

int bcast__obj_map(bcast__obj *o)
{
    if (o->map || o->size == 0) return SH_OK;
    /* Read-only: a complete object is only sent from now on.  Populated in
     * one batch: a child is about to be sent every chunk. */
    void *m = mmap(NULL, o->size, PROT_READ, MAP_SHARED | MAP_POPULATE, o->fd, 0);
    if (m == MAP_FAILED) return sh_err_errno(errno, "push object v%llu: mmap %s", (unsigned long long)o->version, o->path);
    o->map = m;
    return SH_OK;
}

int bcast__obj_prepare(bcast__obj *o, uint32_t i)
{
#ifdef MADV_POPULATE_WRITE
    uint64_t off = bcast__obj_chunk_off(o, i), start = off & ~(uint64_t)4095;
    uint64_t end = off + bcast__obj_chunk_len(o, i);
    /* An error here (a full file system) is one now, not a SIGBUS later. */
    if (end > start && madvise(o->map + start, end - start, MADV_POPULATE_WRITE) < 0 && errno != EINVAL)
        return sh_err_errno(errno, "push object v%llu: space for chunk %u in %s",
                            (unsigned long long)o->version, i, o->path);
#else
    (void)o, (void)i;
#endif
    return SH_OK;
}

int bcast__obj_for_offer(const bcast__offer *of, const char *manifest, size_t manifest_len,
                         const char *path, int reused, bcast__obj **out)
{
    bcast__obj *o = calloc(1, sizeof *o);
    if (!o) return sh_err(SH_ENOMEM, "push object");
    o->fd = -1;
    o->version = of->version;
    o->base = of->base;
    o->size = of->size;
    o->anchor = (of->flags & BCAST__OFFER_ANCHOR) != 0;
    o->squash = (of->flags & BCAST__OFFER_SQUASH) != 0;
    o->hash = of->hash;
    o->chunk_size = of->chunk_size;
    o->nchunks = of->nchunks;
    o->owned = 1;
    snprintf(o->path, sizeof o->path, "%s", path);
    int rc = alloc_state(o, manifest, manifest_len);
    if (rc == 0) rc = open_spool(o, reused);
    if (rc < 0) {
        bcast__obj_free(o);
        return rc;
    }
    *out = o;
    return SH_OK;
}

void bcast__obj_free(bcast__obj *o)
{
    if (!o) return;
    if (o->owned && o->path[0]) unlink(o->path);
    if (o->map) munmap(o->map, o->size);
    if (o->fd >= 0) close(o->fd);
    free(o->manifest);
    free(o->verified);
    free(o->receiving);
    free(o->summed);
    free(o->sums);
    free(o->ready_at);
    free(o);
}

uint64_t bcast__obj_chunk_off(const bcast__obj *o, uint32_t i) { return (uint64_t)i * o->chunk_size; }

uint32_t bcast__obj_chunk_len(const bcast__obj *o, uint32_t i)
{
    uint64_t off = bcast__obj_chunk_off(o, i);
    uint64_t left = o->size - off;
    return left < o->chunk_size ? (uint32_t)left : o->chunk_size;
}

int bcast__obj_check_hash(const bcast__obj *o)
{
    sh_hash128 h = sh_hash128_of(o->map ? o->map : (const uint8_t *)"", o->size);
    if (!sh_hash128_eq(h, o->hash)) {
        char a[33], b[33];
        sh_hash128_hex(h, a);
        sh_hash128_hex(o->hash, b);
        return sh_err(SH_EMISMATCH, "push object v%llu: payload hashes to %s, manifest says %s",
                      (unsigned long long)o->version, a, b);
    }
    return SH_OK;
}
