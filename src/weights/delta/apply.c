/* delta apply: rebuild the target chunk by chunk from the base and the
 * delta, hash every chunk while it is in cache, and let the result become
 * visible only after the base and the target digests check out. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weights/delta/delta_int.h"

/* Where target bytes go: put(file, tensor in file, offset in tensor, ...). */
typedef struct {
    int (*put)(void *ctx, uint32_t file, size_t tensor, uint64_t off, const void *p, size_t n);
    void *ctx;
    /* Optional: where to build the bytes directly (then put is not called). */
    uint8_t *(*direct)(void *ctx, uint32_t file, size_t tensor, uint64_t off);
} delta__sink;

typedef struct {
    uint32_t tensor, chunk; /* hash_only: a base tensor */
    int hash_only;
    sh_hash128 dig, base_dig;
} delta__aitem;

typedef struct {
    const ckpt *base;
    const delta *d;
    const ckpt_tensor **bt; /* per delta tensor: its base tensor (diffs) */
    delta__aitem *items;
    size_t nitems;
    delta__sink sink;
    const delta_opts *o;
    int verify_base;
    pthread_mutex_t mu;
    uint64_t done;
} delta__ap;

static int delta__apply_item(void *arg, size_t i, delta__scratch *s)
{
    delta__ap *a = arg;
    delta__aitem *it = &a->items[i];
    uint64_t off = (uint64_t)it->chunk * CKPT_CHUNK;
    if (it->hash_only) {
        const ckpt_tensor *b = &a->base->tensors[it->tensor];
        size_t n = b->nbytes - off < CKPT_CHUNK ? (size_t)(b->nbytes - off) : CKPT_CHUNK;
        it->dig = ckpt_chunk_digest(b->data + off, n);
        return SH_OK;
    }
    const delta__tensor *t = &a->d->tensors[it->tensor];
    const delta__chunk *c = &t->chunks[it->chunk];
    const ckpt_tensor *b = a->bt[it->tensor];
    size_t n = t->nbytes - off < CKPT_CHUNK ? (size_t)(t->nbytes - off) : CKPT_CHUNK;
    const delta__file *f = &a->d->files[t->file];
    size_t ti = it->tensor - f->first;
    if (!a->sink.direct) SH_TRY(delta__scratch_tmp(s));
    uint8_t *dst = a->sink.direct ? a->sink.direct(a->sink.ctx, t->file, ti, off) : s->tmp;
    char what[512];
    snprintf(what, sizeof what, "delta: tensor \"%s\" chunk %u", t->name, it->chunk);
    const uint8_t *payload = a->d->payload + c->off;
    if (c->enc == DELTA__RAW || c->enc == DELTA__ZSTD) {
        SH_TRY(delta__decode_chunk(s, c->enc, payload, (size_t)c->len, delta__unit(t->dtype),
                                   ckpt_dtype_is_float(t->dtype), dst, n, NULL, what));
        it->dig = ckpt_chunk_digest(dst, n);
        if (b && a->verify_base) it->base_dig = ckpt_chunk_digest(b->data + off, n);
    } else {
        SH_TRY(delta__decode_fused(s, c->enc, payload, (size_t)c->len, delta__unit(t->dtype),
                                   ckpt_dtype_is_float(t->dtype), b->data + off, dst, n,
                                   a->verify_base ? &it->base_dig : NULL, &it->dig, NULL, what));
    }
    if (!a->sink.direct) SH_TRY(a->sink.put(a->sink.ctx, t->file, ti, off, s->tmp, n));
    delta__progress(a->o, &a->mu, &a->done, n);
    return SH_OK;
}

/* Finds each diffed tensor's base and plans the items. */
static int delta__apply_plan(delta__ap *a)
{
    const delta *d = a->d;
    const ckpt *B = a->base;
    a->bt = calloc(d->ntensors + 1, sizeof *a->bt);
    uint8_t *used = calloc(B->ntensors + 1, 1);
    if (!a->bt || !used) {
        free(used);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    size_t n = 0;
    int rc = SH_OK;
    for (size_t i = 0; i < d->ntensors && rc == SH_OK; i++) {
        const delta__tensor *t = &d->tensors[i];
        n += t->nchunks;
        if (!t->base) continue;
        const ckpt_tensor *b = ckpt_find(B, t->base);
        if (!b)
            rc = sh_err(SH_EMISMATCH, "wrong base: %s has no tensor \"%s\" (the delta was made "
                        "against another checkpoint)", B->path, t->base);
        else if (b->dtype != t->dtype || b->nbytes != t->nbytes)
            rc = sh_err(SH_EMISMATCH, "wrong base: %s: tensor \"%s\" is %s of %llu bytes, the "
                        "delta expects %s of %llu", B->path, t->base, ckpt_dtype_name(b->dtype),
                        (unsigned long long)b->nbytes, ckpt_dtype_name(t->dtype),
                        (unsigned long long)t->nbytes);
        else if (used[b - B->tensors]++)
            rc = sh_err(SH_EFORMAT, "delta: base tensor \"%s\" is diffed twice", t->base);
        a->bt[i] = b;
    }
    for (size_t i = 0; a->verify_base && i < B->ntensors; i++)
        if (!used[i]) n += (B->tensors[i].nbytes + CKPT_CHUNK - 1) / CKPT_CHUNK;
    a->items = rc == SH_OK ? calloc(n + 1, sizeof *a->items) : NULL;
    if (rc == SH_OK && !a->items) rc = sh_err(SH_ENOMEM, "out of memory");
    for (size_t i = 0; rc == SH_OK && i < d->ntensors; i++)
        for (size_t k = 0; k < d->tensors[i].nchunks; k++)
            a->items[a->nitems++] = (delta__aitem){.tensor = (uint32_t)i, .chunk = (uint32_t)k};
    for (size_t i = 0; rc == SH_OK && a->verify_base && i < B->ntensors; i++) {
        if (used[i]) continue;
        uint64_t nc = (B->tensors[i].nbytes + CKPT_CHUNK - 1) / CKPT_CHUNK;
        for (uint64_t k = 0; k < nc; k++)
            a->items[a->nitems++] = (delta__aitem){.tensor = (uint32_t)i, .chunk = (uint32_t)k,
                                                   .hash_only = 1};
    }
    free(used);
    return rc;
}

/* Combines the chunk digests of items [k, e) (base side or target side). */
static sh_hash128 delta__combine(const delta__ap *a, size_t k, size_t e, int base_side)
{
    sh_buf b = {0};
    for (size_t q = k; q < e; q++)
        ckpt_digest_write(&b, base_side ? a->items[q].base_dig : a->items[q].dig);
    sh_hash128 h = sh_hash128_of(b.data, b.len);
    sh_buf_free(&b);
    return h;
}

/* With verify_base: the base's tensor digests and checkpoint digest. */
static int delta__verify_base(const delta__ap *a, const sh_hash128 *bd)
{
    const delta *d = a->d;
    const ckpt *B = a->base;
    char h1[33], h2[33];
    for (size_t i = 0; i < d->ntensors; i++)
        if (a->bt[i] && !sh_hash128_eq(bd[a->bt[i] - B->tensors], d->tensors[i].base_digest))
            return sh_err(SH_EMISMATCH, "wrong base: tensor \"%s\" of %s differs from the one "
                          "the delta was made against (apply the delta to its own base version)",
                          d->tensors[i].base, B->path);
    sh_buf parts = {0};
    if (B->is_folder) ckpt_digest_write(&parts, sh_hash128_of(B->index_json, B->index_len));
    for (size_t f = 0; f < B->nfiles; f++) {
        ckpt_digest_write(&parts, sh_hash128_of(B->files[f].map, B->files[f].header_len));
        for (size_t i = B->files[f].first; i < B->files[f].first + B->files[f].count; i++)
            ckpt_digest_write(&parts, bd[i]);
    }
    sh_hash128 bdig = sh_hash128_of(parts.data, parts.len);
    sh_buf_free(&parts);
    if (!sh_hash128_eq(bdig, d->base_digest)) {
        sh_hash128_hex(d->base_digest, h1);
        sh_hash128_hex(bdig, h2);
        return sh_err(SH_EMISMATCH, "wrong base: the delta was made against checkpoint %s, but %s "
                      "is %s", h1, B->path, h2);
    }
    return SH_OK;
}

static int delta__verify(const delta__ap *a)
{
    const delta *d = a->d;
    const ckpt *B = a->base;
    sh_hash128 *bd = malloc((B->ntensors + 1) * sizeof *bd), *td = malloc((d->ntensors + 1) * sizeof *td);
    if (!bd || !td) {
        free(bd), free(td);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    sh_hash128 empty = ckpt_tensor_digest(NULL, 0);
    for (size_t i = 0; i < B->ntensors; i++) bd[i] = empty;
    for (size_t i = 0; i < d->ntensors; i++) td[i] = empty;
    for (size_t k = 0; k < a->nitems;) {
        const delta__aitem *it = &a->items[k];
        size_t e = k;
        while (e < a->nitems && a->items[e].tensor == it->tensor && a->items[e].hash_only == it->hash_only) e++;
        if (it->hash_only) bd[it->tensor] = delta__combine(a, k, e, 0);
        else {
            td[it->tensor] = delta__combine(a, k, e, 0);
            if (a->bt[it->tensor]) bd[a->bt[it->tensor] - B->tensors] = delta__combine(a, k, e, 1);
        }
        k = e;
    }
    int rc = SH_OK;
    if (a->verify_base) rc = delta__verify_base(a, bd);
    for (size_t i = 0; i < d->ntensors && rc == SH_OK; i++)
        if (!sh_hash128_eq(td[i], d->tensors[i].digest)) {
            if (a->bt[i])
                rc = sh_err(SH_EMISMATCH, "wrong base: tensor \"%s\" rebuilt from %s does not "
                            "match the delta's target, so %s is not the checkpoint the delta was "
                            "made against (the delta itself is intact); apply it to its own base "
                            "version", d->tensors[i].name, B->path, B->path);
            else
                rc = sh_err(SH_EMISMATCH, "delta: rebuilt tensor \"%s\" does not match its "
                            "recorded digest (corrupt delta)", d->tensors[i].name);
        }
    sh_buf parts = {0};
    if (d->target_sharded) ckpt_digest_write(&parts, sh_hash128_of(d->index, d->index_len));
    for (size_t f = 0; f < d->nfiles; f++) {
        ckpt_digest_write(&parts, sh_hash128_of(d->files[f].header, d->files[f].header_len));
        for (size_t i = 0; i < d->files[f].nt; i++) ckpt_digest_write(&parts, td[d->files[f].first + i]);
    }
    sh_hash128 tdig = sh_hash128_of(parts.data, parts.len);
    sh_buf_free(&parts);
    if (rc == SH_OK && !sh_hash128_eq(tdig, d->target_digest))
        rc = sh_err(SH_EMISMATCH, "delta: rebuilt checkpoint does not match the target digest "
                    "(corrupt delta)");
    free(bd), free(td);
    return rc;
}
/* Applies with a sink; nothing is committed here. */
static int delta__apply_core(const ckpt *base, const delta *d, const delta_opts *o,
                             delta__sink sink)
{
    delta__ap a = {.base = base, .d = d, .sink = sink, .o = o, .verify_base = o && o->verify_base};
    pthread_mutex_init(&a.mu, NULL);
    int rc = delta__apply_plan(&a);
    if (o && o->progress && !o->progress->total) o->progress->total = delta_target_size(d);
    if (rc == SH_OK) rc = delta__parallel(o ? o->threads : 0, a.nitems, delta__apply_item, &a);
    if (rc == SH_OK) rc = delta__verify(&a);
    free(a.items);
    free(a.bt);
    pthread_mutex_destroy(&a.mu);
    return rc;
}

typedef struct {
    const delta *d;
    uint8_t *out;
} delta__memsink;

static int delta__mem_put(void *ctx, uint32_t file, size_t tensor, uint64_t off, const void *p,
                          size_t n)
{
    delta__memsink *m = ctx;
    memcpy(m->out + m->d->files[file].t[tensor].offset + off, p, n);
    return SH_OK;
}

static uint8_t *delta__mem_direct(void *ctx, uint32_t file, size_t tensor, uint64_t off)
{
    delta__memsink *m = ctx;
    return m->out + m->d->files[file].t[tensor].offset + off;
}

int delta_apply_mem(const ckpt *base, const delta *d, const delta_opts *o, uint8_t *out,
                    size_t cap, size_t *len)
{
    uint64_t size = delta_target_size(d);
    if (d->nfiles != 1 || d->target_sharded)
        return sh_err(SH_EINVAL, "delta_apply_mem: the target is a sharded folder");
    if (size > cap) return sh_err(SH_ERANGE, "delta_apply_mem: target needs %llu bytes",
                                  (unsigned long long)size);
    memcpy(out, d->files[0].header, d->files[0].header_len);
    delta__memsink m = {d, out};
    SH_TRY(delta__apply_core(base, d, o, (delta__sink){delta__mem_put, &m, delta__mem_direct}));
    *len = (size_t)size;
    return SH_OK;
}

/* ---- Files ---------------------------------------------------------------- */

typedef struct {
    ckpt_writer **w;
    size_t n;
} delta__filesink;

static int delta__file_put(void *ctx, uint32_t file, size_t tensor, uint64_t off, const void *p,
                           size_t n)
{
    delta__filesink *f = ctx;
    return ckpt_writer_put(f->w[file], tensor, off, p, n);
}

/* Moves a finished staging folder to out: a plain rename, or an atomic
 * exchange with the existing folder, whose old contents are then removed. */
static int delta__publish_dir(const char *stage, const char *out)
{
    SH_TRY(sh_fsync_dir(stage));
    if (sh_is_dir(out)) {
        if (renameat2(AT_FDCWD, stage, AT_FDCWD, out, RENAME_EXCHANGE) < 0)
            return sh_err_errno(errno, "exchange %s with %s", stage, out);
        SH_TRY(sh_fsync_parent(out));
        return sh_rm_rf(stage); /* now the old version */
    }
    if (rename(stage, out) < 0) return sh_err_errno(errno, "rename %s to %s", stage, out);
    return sh_fsync_parent(out);
}

static int delta__open_writers(const delta *d, const char *out, const char *stage,
                               delta__filesink *fs)
{
    fs->w = calloc(d->nfiles, sizeof *fs->w);
    if (!fs->w) return sh_err(SH_ENOMEM, "out of memory");
    fs->n = d->nfiles;
    if (d->target_sharded) {
        SH_TRY(sh_mkdir_p(stage, 0755));
        char p[4096];
        SH_TRY(sh_path_join(p, sizeof p, stage, CKPT_INDEX_NAME));
        SH_TRY(sh_write_atomic(p, d->index, d->index_len));
    }
    for (size_t f = 0; f < d->nfiles; f++) {
        char p[4096];
        if (d->target_sharded) SH_TRY(sh_path_join(p, sizeof p, stage, d->files[f].name));
        else snprintf(p, sizeof p, "%s", out);
        SH_TRY(ckpt_writer_open_raw(p, d->files[f].header, d->files[f].header_len, &fs->w[f]));
    }
    return SH_OK;
}

static int delta__apply_files(const ckpt *base, const delta *d, const char *out,
                              const delta_opts *o)
{
    if (!d->target_sharded && sh_is_dir(out))
        return sh_err(SH_EINVAL, "%s is a folder but the delta's target is a single file; give "
                      "-o a file path", out);
    if (d->target_sharded && sh_path_exists(out) && !sh_is_dir(out))
        return sh_err(SH_EINVAL, "%s is a file but the delta's target is a sharded folder; give "
                      "-o a folder path", out);
    char stage[4096];
    snprintf(stage, sizeof stage, "%s.tmp.%ld", out, (long)getpid());
    delta__filesink fs = {0};
    int rc = delta__open_writers(d, out, stage, &fs);
    if (rc == SH_OK) rc = delta__apply_core(base, d, o, (delta__sink){delta__file_put, &fs, NULL});
    for (size_t f = 0; f < fs.n; f++) {
        if (rc == SH_OK) rc = ckpt_writer_commit(fs.w[f]);
        else ckpt_writer_abort(fs.w[f]);
    }
    free(fs.w);
    if (d->target_sharded) {
        if (rc == SH_OK) rc = delta__publish_dir(stage, out);
        else sh_rm_rf(stage);
    }
    return rc;
}

int delta_apply(const char *base, const char *delta_path, const char *out, const delta_opts *o)
{
    /* Mapped, not read: the delta stays in the page cache, so apply's
     * anonymous memory is its buffers whatever the delta's size. */
    const uint8_t *buf = NULL;
    size_t len = 0;
    int rc = delta__map_file(delta_path, &buf, &len);
    delta *d = NULL;
    if (rc == SH_OK) rc = delta_parse(buf, len, 0, &d);
    if (rc < 0) {
        delta__unmap_file(buf, len);
        return sh_err_wrap(rc, "%s", delta_path);
    }
    ckpt *b = NULL;
    rc = ckpt_open(base, &b);
    if (rc == SH_OK) rc = delta__apply_files(b, d, out ? out : base, o);
    ckpt_close(b);
    delta_free(d);
    delta__unmap_file(buf, len);
    return rc;
}
