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
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/* How a version's delta payload is had: given in memory (store_publish_mem),
 * or made here from two opened checkpoints and streamed into the staged
 * file (store_publish_keep: no container is built in memory). */
typedef struct {
    const uint8_t *bytes; /* NULL: make it from base to next */
    size_t len;
    const ckpt *base, *next;
    int threads;
} stage_delta;

/* Stages, makes durable and commits version latest + 1 from memory: the
 * delta as its payload, or the image when `anchor`.  model_xxh3: the
 * image's hash (computed once by the caller). */
static int commit_locked(store *s, uint64_t latest, const uint8_t *image, size_t image_len, int anchor,
                         sh_hash128 model_xxh3, const stage_delta *sd, uint64_t *out)
{
    uint64_t v = latest + 1;
    char final[4096], stage[4096];
    SH_TRY(store__version_dir(s, v, final, sizeof final));
    if (sh_path_exists(final)) SH_TRY(sh_rm_rf(final)); /* a crashed publish's leftover */
    snprintf(stage, sizeof stage, "%s/%010llu.%ld", s->staging, (unsigned long long)v, (long)getpid());
    SH_TRY(sh_rm_rf(stage));
    SH_TRY(sh_mkdir_p(stage, 0755));
    store_version m = {.version = v, .anchor = anchor, .base = anchor ? 0 : latest};
    m.created_at = sh_now_wall();
    m.model_size = image_len;
    m.model_xxh3 = model_xxh3;
    snprintf(m.file, sizeof m.file, "%s", anchor ? STORE__ANCHOR_FILE : STORE__DELTA_FILE);
    int rc;
    if (anchor || sd->bytes) {
        m.size = anchor ? image_len : sd->len;
        m.xxh3 = anchor ? m.model_xxh3 : sh_hash128_of(sd->bytes, sd->len);
        rc = write_payload(stage, m.file, anchor ? image : sd->bytes, (size_t)m.size);
    } else {
        /* Written (fsynced) straight from the encoder's chunk payloads, then
         * hashed from the page cache. */
        char path[4096];
        rc = sh_path_join(path, sizeof path, stage, m.file);
        if (rc == 0) rc = delta_make_ckpt(sd->base, sd->next, path, &(delta_opts){.threads = sd->threads}, NULL);
        if (rc == 0) rc = store__hash_file(path, &m.xxh3, &m.size);
    }
    if (rc == 0) rc = store__write_manifest(s, stage, &m);
    SH_TRY(store__commit_version(s, rc, stage, final, v, latest, " from memory"));
    *out = v;
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
    stage_delta sd = {.bytes = in->delta, .len = in->delta_len};
    return commit_locked(s, latest, in->image, in->image_len, anchor, sh_hash128_of(in->image, in->image_len),
                         &sd, out);
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

/* ---- Tensors, with the previous version kept in memory -------------------
 * store_publish_keep(): a publisher of tensors (the Python package) keeps
 * the image of the version it published last, and makes the next delta
 * against that, in memory: no checkpoint file is written for a delta
 * version, and the previous version is neither rebuilt from the store nor
 * hashed again.  The kept image is trusted only while it is the one LATEST
 * names: its size and hash are those of LATEST's manifest, checked under the
 * run's lock at every publish; otherwise (another writer, a restart, gc) it
 * is read back from the store once and checked against that manifest. */

typedef struct store__img {
    uint8_t *p; /* an anonymous mapping of cap bytes */
    size_t len, cap;
} store__img;

struct store__keep {
    int threads;
    store__img prev, next; /* prev: version prev_v's image; next: the one being built */
    uint64_t prev_v;       /* 0: prev holds no known version */
    sh_hash128 prev_hash;
};

static void img_free(store__img *m)
{
    if (m->p) munmap(m->p, m->cap);
    memset(m, 0, sizeof *m);
}

/* Room for len bytes, reusing the mapping unless it is far too large. */
static int img_reserve(store__img *m, size_t len)
{
    if (m->p && m->cap >= len && m->cap / 2 <= len) {
        m->len = len;
        return SH_OK;
    }
    img_free(m);
    size_t cap = len ? len : 1;
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return sh_err(SH_ENOMEM, "publish: no memory for a %zu-byte image", len);
#ifdef MADV_HUGEPAGE
    /* A new image is faulted in by its first copy: in 2 MiB pages that is
     * 512 times fewer faults (at some 20 us a fault in a VM, 0.7 s for a
     * 141 MB image in 4 KiB pages). */
    madvise(p, cap, MADV_HUGEPAGE);
#endif
    m->p = p, m->cap = cap, m->len = len;
    return SH_OK;
}

void store__keep_free(store *s)
{
    if (!s->keep) return;
    img_free(&s->keep->prev);
    img_free(&s->keep->next);
    free(s->keep);
    s->keep = NULL;
}

int store_publish_keep(store *s, int on, int threads)
{
    if (!on) {
        store__keep_free(s);
        return SH_OK;
    }
    if (threads < 0 || threads > 4096)
        return sh_err(SH_EINVAL, "run \"%s\": %d encoder threads: use 0 (all cores) to 4096", s->run, threads);
    if (!s->keep && !(s->keep = calloc(1, sizeof *s->keep))) return sh_err(SH_ENOMEM, "out of memory");
    s->keep->threads = threads;
    return SH_OK;
}

/* The checkpoint image of tensors t (laid out as ckpt_save() writes them)
 * into img, hashed piece by piece while each piece is in cache. */
static int build_image(store *s, const ckpt_tensor *t, size_t n, const json_t *meta, store__img *img,
                       sh_hash128 *h)
{
    ckpt_tensor *c = calloc(n + 1, sizeof *c);
    if (!c) return sh_err(SH_ENOMEM, "out of memory");
    int rc = SH_OK;
    for (size_t i = 0; rc == SH_OK && i < n; i++) {
        c[i] = t[i];
        uint64_t numel = 1;
        int neg = 0;
        for (int d = 0; d < c[i].ndim && d < CKPT_MAX_DIMS; d++) {
            neg |= c[i].shape[d] < 0;
            numel *= (uint64_t)c[i].shape[d];
        }
        c[i].numel = numel;
        if (c[i].ndim < 0 || c[i].ndim > CKPT_MAX_DIMS || neg || !ckpt_dtype_name(c[i].dtype))
            rc = sh_err(SH_EINVAL, "publish to run \"%s\": tensor \"%s\": bad dtype, rank or shape", s->run,
                        t[i].name);
        else if ((c[i].nbytes = numel * ckpt_dtype_bits(c[i].dtype) / 8) && !c[i].data)
            rc = sh_err(SH_EINVAL, "publish to run \"%s\": tensor \"%s\" has no data", s->run, t[i].name);
        else if (t[i].nbytes && t[i].nbytes != c[i].nbytes)
            rc = sh_err(SH_EINVAL, "publish to run \"%s\": tensor \"%s\": %llu bytes given, its shape "
                        "and dtype make %llu", s->run, t[i].name, (unsigned long long)t[i].nbytes,
                        (unsigned long long)c[i].nbytes);
    }
    sh_buf hdr = {0};
    if (rc == SH_OK) {
        ckpt_sort_reference(c, n);
        uint64_t off = 0;
        for (size_t i = 0; i < n; i++) {
            c[i].offset = off;
            off += c[i].nbytes;
        }
        rc = ckpt_header_build(c, n, meta, &hdr);
        if (rc == SH_OK) rc = img_reserve(img, hdr.len + off);
    }
    sh_hasher *hs = rc == SH_OK ? sh_hasher_new() : NULL;
    if (rc == SH_OK && !hs) rc = sh_err(SH_ENOMEM, "out of memory");
    if (rc == SH_OK) {
        memcpy(img->p, hdr.data, hdr.len);
        sh_hasher_update(hs, img->p, hdr.len);
        for (size_t i = 0; i < n; i++) {
            uint8_t *dst = img->p + hdr.len + c[i].offset;
            for (uint64_t o = 0; o < c[i].nbytes; o += 4u << 20) {
                size_t len = (size_t)(c[i].nbytes - o < (4u << 20) ? c[i].nbytes - o : (4u << 20));
                memcpy(dst + o, c[i].data + o, len);
                sh_hasher_update(hs, dst + o, len);
            }
        }
        *h = sh_hasher_digest(hs);
    }
    sh_hasher_free(hs);
    sh_buf_free(&hdr);
    free(c);
    return rc;
}

/* Makes k->prev hold version `latest`'s image (manifest pm). */
static int load_prev(store *s, struct store__keep *k, uint64_t latest, const store_version *pm)
{
    if (k->prev_v == latest && k->prev.len == pm->model_size && sh_hash128_eq(k->prev_hash, pm->model_xxh3))
        return SH_OK;
    k->prev_v = 0;
    char path[4096];
    SH_TRY(store__head_base(s, latest, pm, path, sizeof path));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "open %s", path);
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? sh_err_errno(errno, "stat %s", path) : SH_OK;
    if (rc == SH_OK && (uint64_t)st.st_size != pm->model_size)
        rc = sh_err(SH_EFORMAT, "version %llu of run \"%s\": %s has %lld bytes, its manifest says %llu",
                    (unsigned long long)latest, s->run, path, (long long)st.st_size,
                    (unsigned long long)pm->model_size);
    if (rc == SH_OK) rc = img_reserve(&k->prev, (size_t)st.st_size);
    for (size_t got = 0; rc == SH_OK && got < k->prev.len;) {
        ssize_t r = pread(fd, k->prev.p + got, k->prev.len - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) rc = r < 0 ? sh_err_errno(errno, "read %s", path) : sh_err(SH_EFORMAT, "%s: shorter than %zu bytes", path, k->prev.len);
        else got += (size_t)r;
    }
    close(fd);
    if (rc < 0) return rc;
    sh_hash128 h = sh_hash128_of(k->prev.p, k->prev.len);
    if (!sh_hash128_eq(h, pm->model_xxh3)) {
        char a[33], b[33];
        sh_hash128_hex(h, a);
        sh_hash128_hex(pm->model_xxh3, b);
        return sh_err(SH_EMISMATCH, "version %llu of run \"%s\": %s hashes to %s, its manifest says %s",
                      (unsigned long long)latest, s->run, path, a, b);
    }
    k->prev_v = latest;
    k->prev_hash = h;
    return SH_OK;
}

static int keep_locked(store *s, struct store__keep *k, const ckpt *next, sh_hash128 h, uint64_t every,
                       uint64_t *out)
{
    uint64_t latest, last_anchor = 0;
    SH_TRY(store_latest(s, &latest));
    uint64_t v = latest + 1;
    if (latest) SH_TRY(store__anchor_of(s, latest, &last_anchor));
    /* The delta's base is the kept image, checked against LATEST's manifest,
     * so the chain's anchor need not be hashed here (as store_publish does). */
    int anchor = latest == 0 || v - last_anchor >= every || !store_have_codec() ||
                 !store__chain_readable(s, last_anchor, latest, 0);
    int rc = SH_OK;
    ckpt *b = NULL;
    if (!anchor) {
        store_version pm;
        rc = store_get(s, latest, &pm, NULL);
        if (rc == SH_OK && load_prev(s, k, latest, &pm) < 0) {
            /* The previous version cannot be read back as its manifest
             * says (damaged in place): a delta on it could never be
             * applied, so this version is an anchor, readable on its own. */
            sh_warn("run \"%s\": %s; publishing version %llu as an anchor", s->run, sh_errmsg(),
                    (unsigned long long)v);
            anchor = 1;
        }
        if (rc == SH_OK && !anchor) rc = ckpt_open_mem(k->prev.p, k->prev.len, "the previous version", &b);
    }
    stage_delta sd = {.base = b, .next = next, .threads = k->threads};
    if (rc == SH_OK) rc = commit_locked(s, latest, k->next.p, k->next.len, anchor, h, &sd, out);
    ckpt_close(b);
    if (rc < 0) return rc;
    store__img t = k->prev;
    k->prev = k->next, k->next = t;
    k->prev_v = *out, k->prev_hash = h;
    return SH_OK;
}

int store__publish_kept(store *s, const ckpt_tensor *t, size_t n, const json_t *meta, uint64_t anchor_every,
                        uint64_t *out)
{
    struct store__keep *k = s->keep;
    uint64_t every = anchor_every ? anchor_every : 8;
    sh_hash128 h;
    SH_TRY(build_image(s, t, n, meta, &k->next, &h));
    /* Only checkpoints go in: parsed as every reader parses it. */
    ckpt *c;
    SH_TRY(ckpt_open_mem(k->next.p, k->next.len, "the tensors to publish", &c));
    int fd;
    int rc = store__lock(s, &fd);
    if (rc == SH_OK) rc = keep_locked(s, k, c, h, every, out);
    if (fd >= 0) close(fd);
    ckpt_close(c);
    return rc;
}
