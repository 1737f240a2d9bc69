/* Building, verifying and activating versions on the apply thread, and the
 * in-memory image that makes a pushed delta cheap.
 *
 * A push replica keeps an image of its active version in anonymous memory.
 * A delta is applied to it in place (only the elements it changes are
 * written, each chunk hashed once and checked against the delta's digests)
 * and the result is written once to the new model file; the image then
 * already holds the new version, so nothing is copied after an activation.
 * Serving threads read the model files' mappings, never the image. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/delta.h"
#include "weights/store/replica_int.h"

void store__replica_error(store_replica *r)
{
    pthread_mutex_lock(&r->mu);
    snprintf(r->last_error, sizeof r->last_error, "%s", sh_errmsg());
    r->failures++;
    pthread_mutex_unlock(&r->mu);
    sh_warn("replica %s: %s", r->dir, sh_errmsg());
}

/* Makes `path` and its name durable: the file's pages (written through a
 * shared mapping, which fsync flushes like written pages), then the
 * directory entry. */
static int fsync_file_and_dir(const char *path, const char *dir)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "open %s", path);
    int rc = fsync(fd) < 0 ? sh_err_errno(errno, "fsync %s", path) : SH_OK;
    close(fd);
    return rc == 0 ? sh_fsync_dir(dir) : rc;
}

/* A push replica keeps the model an activation replaced (with the
 * reference the active slot held) so that the next delta can write its
 * result into that file's pages instead of allocating a new file (the
 * double buffer); an older one is let go. */
static void retire(store_replica *r, model *old)
{
    pthread_mutex_lock(&r->mu);
    model *was = r->prev;
    /* Only its file is kept: with no lease on it (none can start now that
     * it is not active), its mapping goes, so that the replica maps the
     * active version and the one being built, nothing else. */
    int unleased = old && old->refs == 1;
    r->prev = old;
    pthread_mutex_unlock(&r->mu);
    if (unleased) {
        ckpt_close(old->ck);
        old->ck = NULL;
        if (old->map) munmap(old->map, old->size);
        old->map = NULL;
    }
    store__model_unref(r, was);
}

int store__take_prev(store_replica *r, const char *out, uint64_t *version)
{
    /* r->prev is taken under the lock: the push thread takes it too (a
     * spool file for an anchor: reuse_file in replica.c). */
    pthread_mutex_lock(&r->mu);
    model *m = r->prev;
    int leased = m && m->refs > 1;
    r->prev = NULL;
    pthread_mutex_unlock(&r->mu);
    if (!m) return 0;
    if (leased) {
        store__model_unref(r, m); /* deleted when its last lease ends */
        return 0;
    }
    struct stat st;
    int mine = !m->keep && stat(m->path, &st) == 0 && st.st_nlink == 1;
    store__model_free(m->fp8, !m->keep);
    m->fp8 = NULL;
    int ok = mine && rename(m->path, out) == 0;
    if (ok) sh_debug("replica %s: recycling the file of v%llu for %s", r->dir, (unsigned long long)m->version, out);
    if (ok && version) *version = m->version;
    store__model_free(m, !ok && !m->keep);
    return ok;
}

/* `path` holds version v's full checkpoint, built and verified in memory.
 * It is swapped in first, so serving threads see it at once; then its bytes
 * and name are made durable and ACTIVE is replaced.  ACTIVE only ever names
 * a durable, verified file, and a crash before it moves comes back on the
 * previous version, whose file is kept until then. */
static int activate(store_replica *r, const store_version *v, const char *path, const char *fp8,
                    store_timeline *tl)
{
    model *m;
    SH_TRY(store__model_open(path, v->version, &m));
    int rc = store__model_open_fp8(m, fp8);
    if (rc < 0) {
        store__model_free(m, 0);
        return rc;
    }
    uint64_t from = store_replica_version(r);
    if (r->cfg.before_activate) r->cfg.before_activate(r->cfg.arg, from, v->version);
    double at = sh_now_wall();
    double t0 = sh_now_mono();
    pthread_mutex_lock(&r->mu);
    model *old = r->active;
    r->active = m;
    r->activated_at = at;
    r->activations++;
    double pause = (sh_now_mono() - t0) * 1e3;
    if (pause > r->pause_max_ms) r->pause_max_ms = pause;
    tl->version = v->version;
    tl->active = at;
    r->timeline = *tl;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    rc = fsync_file_and_dir(path, r->models);
    if (rc == 0) rc = store__write_active(r, v, at);
    tl->durable = sh_now_wall();
    pthread_mutex_lock(&r->mu);
    r->timeline.durable = rc == 0 ? tl->durable : 0;
    pthread_mutex_unlock(&r->mu);
    if (rc < 0) {
        /* Serving the verified new version from memory, but ACTIVE still
         * names the old file: keep it for a restart. */
        if (old) old->keep = 1;
        rc = sh_err_wrap(rc, "version %llu is served but not durable; a restart comes back on "
                         "version %llu", (unsigned long long)v->version, (unsigned long long)from);
    }
    if (rc == 0 && r->node) retire(r, old);
    else store__model_unref(r, old);
    if (rc == 0 && r->cfg.after_activate) r->cfg.after_activate(r->cfg.arg, v->version, at);
    /* Waiters see the activation once it is complete (durable, old files
     * gone, callback run); serving threads saw it at the swap. */
    pthread_mutex_lock(&r->mu);
    r->done_version = v->version;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* A pushed anchor is already a private name (a hard link to the spool) for
 * bytes the push node checked against the manifest's xxh3, which for an
 * anchor is model_xxh3 (store_manifest_parse insists).  It becomes the model
 * by another link, which saves a copy and a hash of the whole model;
 * activate() makes it durable. */
static int adopt_anchor(const store_version *v, const char *payload, const char *out)
{
    unlink(out);
    if (link(payload, out) < 0) return store_apply_payload(v, payload, NULL, out);
    return SH_OK;
}

static model *ref_active(store_replica *r)
{
    model *cur = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->active) (cur = r->active)->refs++;
    pthread_mutex_unlock(&r->mu);
    return cur;
}

/* ---- The in-memory image ---------------------------------------------- */

/* Anonymous memory in 2 MiB pages where the kernel gives them: the codec
 * patches a few percent of the elements spread over the whole model, and
 * with 4 KiB pages (a tmpfs or page-cache mapping) the TLB misses, which
 * exit to the host in a virtual machine, cost five times the patching. */
static int img_alloc(store_replica *r, uint64_t size)
{
    if (r->img && r->img_cap >= size) return SH_OK;
    store__img_free(r);
    size_t cap = ((size_t)size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return sh_err_errno(errno, "replica %s: %zu bytes for the model image", r->dir, cap);
    madvise(m, cap, MADV_HUGEPAGE);
    r->img = m;
    r->img_cap = cap;
    return SH_OK;
}

void store__img_free(store_replica *r)
{
    if (r->img) munmap(r->img, r->img_cap);
    delta_ip_cache_free(&r->ipc);
    r->img = NULL;
    r->img_cap = 0;
    r->img_version = 0;
}

/* Copies model m (verified: it is active) into the image.  Read from the
 * file, not through m's mapping, whose pages would then stay in this
 * process's memory beside the image. */
static int img_load(store_replica *r, const model *m)
{
    r->img_version = 0;
    r->ipc.valid = 0; /* the next apply hashes every chunk once */
    SH_TRY(img_alloc(r, m->size));
    SH_TRY(sh_pread_all(m->fd, r->img, (size_t)m->size, 0, m->path));
    r->img_version = m->version;
    r->img_size = m->size;
    return SH_OK;
}

int store__prepare_image(store_replica *r, int quiet)
{
    if (!r->img_wanted) return 0;
    if (!quiet) return 1;
    r->img_wanted = 0;
    model *cur = ref_active(r);
    if (cur && r->img_version != cur->version && img_load(r, cur) < 0)
        sh_warn("replica %s: no model image (%s); deltas will be rebuilt from the model", r->dir,
                sh_errmsg());
    store__model_unref(r, cur);
    return 0;
}

/* Which chunks of the image differ from a recycled file that holds version
 * `held`: those the last in-place apply wrote when the file holds its base,
 * those of the last two when it holds the base of the one before (the
 * double buffer's usual case); NULL: all of them. */
static const uint8_t *img_changed_since(store_replica *r, uint64_t held, uint8_t *both)
{
    const delta_ip_cache *c = &r->ipc;
    if (!held || !c->valid || c->applies < 1) return NULL;
    if (held == r->ip_base[0]) return c->wrote[0];
    if (c->applies < 2 || held != r->ip_base[1] || !both) return NULL;
    for (size_t i = 0; i < c->n; i++) both[i] = c->wrote[0][i] | c->wrote[1][i];
    return both;
}

/* The file a version's image is written into: the previous model's file
 * when it can be recycled (its pages are overwritten: no page is
 * allocated, zeroed or freed), else a new one.  A recycled file that held
 * a version the last one or two in-place applies started from gets only
 * the chunks they wrote: the rest of it already holds the same bytes (same
 * layout, chunks the deltas left alone), so the write costs what changed.
 * The chunks the apply itself writes are copied out as it finishes each,
 * while they are in cache (out_chunk); the rest follow it (out_finish).
 *
 * The bytes go in with pwrite, not through a mapping of the file: the
 * kernel copies through its own large-page mapping of memory, while a
 * process's 4 KiB mapping of the file costs a TLB miss per page, which a
 * virtual machine with shadow page tables turns into an exit to the host
 * (bench/results/2026-12-03-notebook.md, "Writing a model file", `shoal bench write`: 50 MB in
 * 9-10 ms of CPU, against 8-67 ms through a kept mapping and 235 ms
 * through a new one).  activate() makes it durable. */
typedef struct img_out {
    store_replica *r;
    const char *path;
    int fd, reuse, same_size;
    uint64_t held; /* the version a recycled file holds */
    int failed;    /* a write of out_chunk failed (SH_E* code) */
    char err[512];
    pthread_mutex_t mu;
} img_out;

static int out_open(store_replica *r, const char *out, img_out *o)
{
    *o = (img_out){.r = r, .path = out, .fd = -1};
    pthread_mutex_init(&o->mu, NULL);
    o->reuse = store__take_prev(r, out, &o->held);
    o->fd = open(out, O_RDWR | O_CLOEXEC | (o->reuse ? 0 : O_CREAT | O_TRUNC), 0644);
    if (o->fd < 0) return sh_err_errno(errno, "create %s", out);
    struct stat st;
    int rc = fstat(o->fd, &st) < 0 ? sh_err_errno(errno, "stat %s", out) : SH_OK;
    o->same_size = rc == 0 && (uint64_t)st.st_size == r->img_size;
    if (rc == 0 && !o->same_size) {
        int e = posix_fallocate(o->fd, 0, (off_t)r->img_size);
        if (e && e != EOPNOTSUPP && e != EINVAL)
            rc = sh_err_errno(e, "reserve %llu bytes for %s", (unsigned long long)r->img_size, out);
        if (rc == 0 && ftruncate(o->fd, (off_t)r->img_size) < 0) rc = sh_err_errno(errno, "truncate %s", out);
    }
    if (rc < 0) {
        close(o->fd);
        unlink(out);
        pthread_mutex_destroy(&o->mu);
    }
    return rc;
}

/* delta_opts.chunk_done: an apply thread finished a chunk of the image.
 * A failed write fails the build (out_finish), as any write does. */
static void out_chunk(void *arg, size_t item, uint64_t off, uint32_t len)
{
    (void)item;
    img_out *o = arg;
    int rc = sh_pwrite_all(o->fd, o->r->img + off, len, off, o->path);
    pthread_mutex_lock(&o->mu);
    if (rc < 0 && !o->failed) o->failed = rc, snprintf(o->err, sizeof o->err, "%s", sh_errmsg());
    pthread_mutex_unlock(&o->mu);
}

/* After the apply (ok: it succeeded): the chunks still to write, then the
 * file is closed; on any failure it is removed. */
static int out_finish(img_out *o, int ok)
{
    store_replica *r = o->r;
    int rc = o->failed ? sh_err(o->failed, "%s", o->err) : SH_OK;
    if (ok && rc == SH_OK) {
        uint8_t *both = o->reuse && o->same_size ? malloc(r->ipc.n + 1) : NULL;
        const uint8_t *changed = o->reuse && o->same_size ? img_changed_since(r, o->held, both) : NULL;
        /* wrote[0]: the chunks this apply wrote, which out_chunk copied. */
        int skip = changed && r->ipc.valid;
        if (changed) {
            for (size_t i = 0; rc == 0 && i < r->ipc.n; i++)
                if (changed[i] && !(skip && r->ipc.wrote[0][i]))
                    rc = sh_pwrite_all(o->fd, r->img + r->ipc.off[i], r->ipc.len[i], r->ipc.off[i], o->path);
        } else {
            rc = sh_pwrite_all(o->fd, r->img, (size_t)r->img_size, 0, o->path);
        }
        free(both);
    }
    close(o->fd);
    if (!ok || rc < 0) unlink(o->path);
    pthread_mutex_destroy(&o->mu);
    return rc;
}

/* ---- Building versions ---------------------------------------------------- */

/* A delta on the active model (or a squashed delta from it): applied in
 * place to the in-memory image of the active version, which is verified
 * against the delta's digests (on failure every write is undone and the
 * image still holds the base), then written to the new file.  The image
 * then holds the new version, ready for the next delta: nothing is copied
 * after activation.  Without an image (none yet, or no memory) the target
 * is rebuilt from the mapped model straight into the new file. */
static int model_mismatch(const store_version *v)
{
    char hex[33];
    sh_hash128_hex(v->model_xxh3, hex);
    return sh_err(SH_EMISMATCH, "version %llu: the delta rebuilds a model whose xxh3 is not the manifest's "
                  "model_xxh3 %s (the delta does not make the version its manifest names); not activated",
                  (unsigned long long)v->version, hex);
}

static int apply_delta(store_replica *r, const pending *p, const model *cur, const char *out)
{
    uint64_t size = p->ver.model_size;
    int cur_is_base = cur && cur->version == p->ver.base;
    if (r->img_version != p->ver.base && cur_is_base && img_load(r, cur) < 0)
        sh_warn("replica %s: no model image (%s)", r->dir, sh_errmsg());
    if (r->img_version == p->ver.base && r->img_size == size) {
        img_out o;
        SH_TRY(out_open(r, out, &o));
        r->img_version = 0; /* until the patch is verified */
        /* On one core: a replica shares its machine with an inference
         * server (or, in `bench push`, with the other replicas, where a
         * second thread per apply measured 7-13 % slower). */
        int rc = store__delta_patch_mem(r->img, size, p->payload, &r->ipc, 1, out_chunk, &o);
        /* The delta's digests say the image is the delta's target; the
         * version is the manifest's model_xxh3 (docs/store-format.md: a
         * reader checks the result against it).  A delta that does not
         * rebuild the model its manifest names (a publisher's mix-up, a
         * root's) is refused here, as the store's readers refuse it; the
         * image then holds neither version and is loaded again. */
        if (rc == 0 && !sh_hash128_eq(sh_hash128_of(r->img, (size_t)size), p->ver.model_xxh3)) {
            r->ipc.valid = 0;
            rc = model_mismatch(&p->ver);
        }
        if (rc < 0) {
            out_finish(&o, 0);
            return rc;
        }
        r->ip_base[1] = r->ip_base[0];
        r->ip_base[0] = p->ver.base;
        r->img_version = p->ver.version;
        return out_finish(&o, 1);
    }
    if (!cur_is_base)
        return sh_err(SH_EMISMATCH, "delta to version %llu needs version %llu, the replica's image was lost",
                      (unsigned long long)p->ver.version, (unsigned long long)p->ver.base);
    int brc = store__delta_build(cur->ck, p->payload, size, out);
    /* The base was read through its mapping: its pages leave this
     * process's memory (they stay in the page cache; a lease that reads
     * them again faults them back in). */
    if (cur->map) madvise(cur->map, cur->size, MADV_DONTNEED);
    SH_TRY(brc);
    sh_hash128 h;
    uint64_t n;
    int rc = store__hash_file(out, &h, &n);
    if (rc == 0 && (n != size || !sh_hash128_eq(h, p->ver.model_xxh3))) rc = model_mismatch(&p->ver);
    if (rc < 0) unlink(out);
    return rc;
}


/* After a failed build or activation: removes the new files unless the new
 * version went live (then only its durability failed). */
static void discard(store_replica *r, uint64_t v, const char *out, const char *fp8)
{
    if (store_replica_version(r) == v) return;
    unlink(out);
    if (fp8[0]) unlink(fp8);
}

/* ---- Staging: versions on the way to a newer one ------------------------ */

/* A replica whose parent has announced a newer version than the payload it
 * is given (a late joiner sent the anchor, then the deltas after it) builds
 * that payload's version in its image only: no model file, no activation.
 * The next delta patches the image again, and the newest version is the
 * first one activated.  A staged version is activated anyway once the tree
 * has been quiet for STORE__STAGE_QUIET_S, or STORE__STAGE_MAX_S after the
 * first staging (a parent that announced more than it sends). */
#define STORE__STAGE_QUIET_S 1.0
#define STORE__STAGE_MAX_S 5.0

static int stage_wanted(store_replica *r, const pending *p)
{
    if (!r->node || r->cfg.fp8) return 0;
    pthread_mutex_lock(&r->mu);
    uint64_t newest = r->push.newest_announced;
    pthread_mutex_unlock(&r->mu);
    if (p->ver.version >= newest) return 0;
    return !r->staged.version || sh_now_mono() - r->staged_since < STORE__STAGE_MAX_S;
}

static void unstage(store_replica *r)
{
    memset(&r->staged, 0, sizeof r->staged);
    r->staged_since = 0;
}

/* A staged anchor is also kept whole as its model file (a link to the
 * payload: no copy), not active: a later step that fails falls back to it
 * rather than to nothing.  Dropped (the file removed unless it became the
 * active one) once a newer version is active. */
static void drop_staged_anchor(store_replica *r)
{
    if (r->staged_anchor.version && store_replica_version(r) != r->staged_anchor.version)
        unlink(r->staged_anchor_path);
    memset(&r->staged_anchor, 0, sizeof r->staged_anchor);
    r->staged_anchor_path[0] = 0;
}

/* After a failed step on the way to a newer version: the staged anchor, a
 * whole version the push node verified, is activated (if it is newer than
 * the active one). */
static int fall_back_to_staged_anchor(store_replica *r)
{
    if (!r->staged_anchor.version || r->staged_anchor.version <= store_replica_version(r)) {
        drop_staged_anchor(r);
        return SH_OK;
    }
    store_version v = r->staged_anchor;
    char path[4096];
    snprintf(path, sizeof path, "%s", r->staged_anchor_path);
    memset(&r->staged_anchor, 0, sizeof r->staged_anchor);
    r->staged_anchor_path[0] = 0;
    store_timeline tl = {0};
    tl.apply_start = tl.built = sh_now_wall();
    sh_info("replica %s: activating the anchor v%llu it holds whole instead", r->dir, (unsigned long long)v.version);
    int rc = activate(r, &v, path, NULL, &tl);
    if (rc < 0 && store_replica_version(r) != v.version) unlink(path);
    if (store_replica_version(r) == v.version && r->img_version != v.version) r->img_wanted = 1;
    return rc;
}

/* An anchor into the image.  Its bytes are the ones the push node checked
 * against the OFFER's xxh3, which on_object matched with the manifest's
 * (store__pushed_names), and for an anchor that is model_xxh3 (as for
 * adopt_anchor): they are not hashed again. */
static int stage_anchor(store_replica *r, const pending *p)
{
    uint64_t size = p->ver.model_size;
    r->img_version = 0;
    r->ipc.valid = 0;
    SH_TRY(img_alloc(r, size));
    int fd = open(p->payload, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "open %s", p->payload);
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? sh_err_errno(errno, "stat %s", p->payload) : SH_OK;
    if (rc == 0 && (uint64_t)st.st_size != size)
        rc = sh_err(SH_EMISMATCH, "version %llu: the anchor has %lld bytes, its manifest says %llu",
                    (unsigned long long)p->ver.version, (long long)st.st_size, (unsigned long long)size);
    if (rc == 0) rc = sh_pread_all(fd, r->img, (size_t)size, 0, p->payload);
    close(fd);
    char out[4096];
    if (rc == 0) rc = store__model_path(r, p->ver.version, out, sizeof out);
    if (rc == 0) {
        drop_staged_anchor(r);
        rc = adopt_anchor(&p->ver, p->payload, out);
    }
    if (rc < 0) return rc;
    r->staged_anchor = p->ver;
    snprintf(r->staged_anchor_path, sizeof r->staged_anchor_path, "%s", out);
    r->img_size = size;
    r->img_version = p->ver.version;
    return SH_OK;
}

/* A delta on the image (the staged version, or the active one loaded). */
static int stage_delta(store_replica *r, const pending *p, const model *cur)
{
    uint64_t size = p->ver.model_size;
    if (r->img_version != p->ver.base && cur && cur->version == p->ver.base) SH_TRY(img_load(r, cur));
    if (r->img_version != p->ver.base || r->img_size != size)
        return sh_err(SH_EMISMATCH, "delta to version %llu needs version %llu, the replica's image holds %llu",
                      (unsigned long long)p->ver.version, (unsigned long long)p->ver.base,
                      (unsigned long long)r->img_version);
    r->img_version = 0; /* until the patch is verified */
    int rc = store__delta_patch_mem(r->img, size, p->payload, &r->ipc, 1, NULL, NULL);
    /* As for a version activated at once: the staged one must be the
     * version its manifest names, or the next delta builds on a stranger. */
    if (rc == 0 && !sh_hash128_eq(p->ver.model_xxh3, sh_hash128_of(r->img, (size_t)size))) {
        r->ipc.valid = 0;
        rc = model_mismatch(&p->ver);
    }
    if (rc < 0) return rc;
    r->img_version = p->ver.version;
    return SH_OK;
}

int store__activate_staged(store_replica *r)
{
    if (!r->staged.version) return SH_OK;
    store_version v = r->staged;
    store_timeline tl = r->staged_tl;
    unstage(r);
    if (v.version == r->staged_anchor.version || r->img_version != v.version) return fall_back_to_staged_anchor(r);
    if (v.version <= store_replica_version(r)) return SH_OK;
    char out[4096];
    SH_TRY(store__model_path(r, v.version, out, sizeof out));
    r->ip_base[0] = r->ip_base[1] = 0; /* a recycled file gets every byte */
    img_out o;
    SH_TRY(out_open(r, out, &o));
    int rc = out_finish(&o, 1);
    tl.built = sh_now_wall();
    if (rc == 0) rc = activate(r, &v, out, NULL, &tl);
    if (rc < 0 && store_replica_version(r) != v.version) unlink(out);
    if (rc < 0) {
        fall_back_to_staged_anchor(r);
        return rc;
    }
    drop_staged_anchor(r);
    return rc;
}

int store__staged_due(store_replica *r, double now, double last_push)
{
    return r->staged.version &&
           (now - last_push >= STORE__STAGE_QUIET_S || now - r->staged_since >= STORE__STAGE_MAX_S);
}

int store__apply_pending(store_replica *r, pending *p)
{
    char out[4096];
    SH_TRY(store__model_path(r, p->ver.version, out, sizeof out));
    p->tl.apply_start = sh_now_wall();
    model *cur = ref_active(r);
    int rc;
    /* The image holds the base, staged: the version is built on it. */
    int staged_base = !p->ver.anchor && r->staged.version == p->ver.base && r->img_version == p->ver.base;
    if (stage_wanted(r, p) && (p->ver.anchor || staged_base || (cur && cur->version == p->ver.base))) {
        rc = p->ver.anchor ? stage_anchor(r, p) : stage_delta(r, p, cur);
        store__model_unref(r, cur);
        if (rc < 0) {
            r->img_version = 0;
            unstage(r);
            store__replica_error(r);
            fall_back_to_staged_anchor(r);
            return SH_OK; /* said */
        }
        if (!r->staged.version) r->staged_since = sh_now_mono();
        r->staged = p->ver;
        r->staged_tl = p->tl;
        r->ip_base[0] = r->ip_base[1] = 0;
        sh_debug("replica %s: v%llu built in memory, not activated (a newer version is announced)", r->dir,
                 (unsigned long long)p->ver.version);
        return SH_OK;
    }
    if (!p->ver.anchor && (!cur || cur->version != p->ver.base) && !staged_base)
        rc = sh_err(SH_EMISMATCH, "delta to version %llu needs version %llu, replica holds %llu",
                    (unsigned long long)p->ver.version, (unsigned long long)p->ver.base,
                    (unsigned long long)(cur ? cur->version : 0));
    else if (p->ver.anchor)
        rc = adopt_anchor(&p->ver, p->payload, out);
    else
        rc = apply_delta(r, p, cur, out);
    p->tl.built = sh_now_wall();
    char fp8[4096] = "";
    if (rc == 0 && r->cfg.fp8)
        rc = store__make_fp8(r, p->ver.version, out, p->ver.anchor ? NULL : cur,
                             p->ver.anchor ? NULL : p->payload, fp8, sizeof fp8);
    store__model_unref(r, cur);
    if (rc == 0) rc = activate(r, &p->ver, out, fp8[0] ? fp8 : NULL, &p->tl);
    if (rc < 0) discard(r, p->ver.version, out, fp8);
    if (rc < 0 && staged_base) {
        store__replica_error(r);
        unstage(r);
        fall_back_to_staged_anchor(r);
        rc = SH_OK; /* said */
    }
    if (store_replica_version(r) >= r->staged.version) unstage(r);
    if (store_replica_version(r) >= r->staged_anchor.version) drop_staged_anchor(r);
    if (store_replica_version(r) == p->ver.version && r->img_version != p->ver.version)
        r->img_wanted = 1; /* loaded when the tree is quiet */
    return rc;
}

static int sync_latest(store_replica *r, uint64_t latest);

int store__sync_from_store(store_replica *r)
{
    uint64_t latest = 0, have = store_replica_version(r);
    double now = sh_now_mono();
    int rc = store_latest(r->st, &latest);
    if (rc == 0) {
        pthread_mutex_lock(&r->mu);
        if (latest > r->store_latest) r->store_latest = latest;
        pthread_mutex_unlock(&r->mu);
    }
    /* While a failure's pause lasts, only a LATEST that moved on to
     * another readable version is tried; anything else waits quietly. */
    if (r->sync_failed && now < r->sync_retry_at && (rc < 0 || latest == r->sync_failed)) return SH_OK;
    if (rc == 0 && latest <= have) {
        r->sync_failed = 0;
        return SH_OK;
    }
    if (rc == 0) rc = sync_latest(r, latest);
    if (rc == 0) {
        r->sync_failed = 0, r->sync_backoff = 0;
        return SH_OK;
    }
    uint64_t key = latest ? latest : UINT64_MAX; /* UINT64_MAX: LATEST unreadable */
    double b = key == r->sync_failed ? 2 * r->sync_backoff : 0.1;
    r->sync_backoff = b < STORE__RETRY_MAX_S ? b : STORE__RETRY_MAX_S;
    r->sync_failed = key;
    r->sync_retry_at = now + r->sync_backoff;
    return rc;
}

static int sync_latest(store_replica *r, uint64_t latest)
{
    store_version v;
    char out[4096];
    store_timeline tl = {0};
    tl.apply_start = sh_now_wall();
    SH_TRY(store_get(r->st, latest, &v, NULL));
    SH_TRY(store__model_path(r, latest, out, sizeof out));
    model *cur = ref_active(r);
    int rc = store_materialize(r->st, latest, cur ? cur->version : 0, cur ? cur->path : NULL, out);
    tl.built = sh_now_wall();
    char fp8[4096] = "", delta_path[4096];
    /* One delta on top of what this replica holds: the FP8 copy is updated
     * block by block; anything else is quantised whole. */
    int one_delta = cur && !v.anchor && v.base == cur->version &&
                    store_payload_path(r->st, latest, delta_path, sizeof delta_path) == 0;
    if (rc == 0 && r->cfg.fp8)
        rc = store__make_fp8(r, latest, out, one_delta ? cur : NULL, one_delta ? delta_path : NULL,
                             fp8, sizeof fp8);
    store__model_unref(r, cur);
    if (rc == 0) rc = activate(r, &v, out, fp8[0] ? fp8 : NULL, &tl);
    if (rc < 0) discard(r, latest, out, fp8);
    if (store_replica_version(r) == latest && r->node) r->img_wanted = 1;
    return rc;
}
