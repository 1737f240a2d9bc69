/* In-place apply to a checkpoint image in memory, for a replica that holds
 * its weights in memory and whose layout does not change: only changed
 * units are written, every chunk is hashed once, and on any failure every
 * change is undone (differences are invertible: the delta is its own undo
 * log), so the image is never left torn. */
#include <stdlib.h>
#include <string.h>

#include "weights/delta/delta_int.h"

typedef struct {
    const delta *d;
    uint8_t *img;
    size_t *first;      /* first item of tensor i */
    size_t nitems;
    uint32_t *tensor, *chunk;
    uint64_t *applied;  /* changes applied per item (for the undo) */
    uint8_t **saved;    /* RAW/ZSTD: the chunk's old bytes */
    sh_hash128 *dig;
    const delta_ip_cache *cache; /* valid and of this layout, else NULL */
    const delta_opts *o;
    int undo;
} delta__ip;

/* Applies (sign +1) or undoes (-1) up to max changes of a SPARSE/DENSE chunk
 * in data; *applied counts those written. */
static int delta__ip_changes(delta__scratch *s, const delta__chunk *c, const delta *d, unsigned w,
                             int is_float, uint8_t *data, size_t nbytes, int sign, uint64_t max,
                             uint64_t *applied, const char *what)
{
    delta__dec dec;
    SH_TRY(delta__dec_open(&dec, c->enc, d->payload + c->off, (size_t)c->len, nbytes / w, w, s, what));
    uint32_t pos[512];
    uint64_t z[512], mask = delta__mask(w);
    size_t got = 0;
    int rc = SH_OK;
    do {
        got = 0;
        rc = delta__dec_next(&dec, pos, z, 512, &got);
        for (size_t i = 0; i < got && *applied < max; i++) {
            if (!z[i]) continue;
            uint8_t *p = data + (size_t)pos[i] * w;
            uint64_t u = 0, dv = delta__unzig(z[i]);
            memcpy(&u, p, w);
            if (is_float) u = delta__ord(u, w);
            u = (sign > 0 ? u + dv : u - dv) & mask;
            if (is_float) u = delta__ord(u, w);
            memcpy(p, &u, w);
            (*applied)++;
        }
    } while (rc == SH_OK && got && *applied < max);
    /* Undoing replays the stream only as far as the changes were applied;
     * a corrupt chunk fails just after them, which is no error here. */
    if (sign < 0) return *applied == max ? SH_OK : rc < 0 ? rc : sh_err(SH_EINTERNAL, "%s: undo fell short", what);
    if (rc == SH_OK) rc = delta__dec_close(&dec);
    return rc;
}

static int delta__ip_patch(delta__ip *a, size_t i, delta__scratch *s);
static uint64_t delta__ip_off(const delta__ip *a, size_t i);
static uint32_t delta__ip_len(const delta__ip *a, size_t i);

/* Chunk i, then the caller's chunk_done while its bytes are in cache. */
static int delta__ip_item(void *arg, size_t i, delta__scratch *s)
{
    delta__ip *a = arg;
    int rc = delta__ip_patch(a, i, s);
    const delta__chunk *c = &a->d->tensors[a->tensor[i]].chunks[a->chunk[i]];
    if (rc == SH_OK && !a->undo && c->enc != DELTA__SAME && a->o && a->o->chunk_done)
        a->o->chunk_done(a->o->chunk_arg, i, delta__ip_off(a, i), delta__ip_len(a, i));
    return rc;
}

static int delta__ip_patch(delta__ip *a, size_t i, delta__scratch *s)
{
    const delta__tensor *t = &a->d->tensors[a->tensor[i]];
    const delta__chunk *c = &t->chunks[a->chunk[i]];
    const ckpt_tensor *ft = &a->d->files[0].t[a->tensor[i]];
    uint64_t off = (uint64_t)a->chunk[i] * CKPT_CHUNK;
    size_t n = t->nbytes - off < CKPT_CHUNK ? (size_t)(t->nbytes - off) : CKPT_CHUNK;
    uint8_t *data = a->img + ft->offset + off;
    unsigned w = delta__unit(t->dtype);
    int fl = ckpt_dtype_is_float(t->dtype);
    char what[512];
    snprintf(what, sizeof what, "delta: tensor \"%s\" chunk %u", t->name, a->chunk[i]);
    if (a->undo) {
        if (a->saved[i]) memcpy(data, a->saved[i], n);
        else if (a->applied[i])
            SH_TRY(delta__ip_changes(s, c, a->d, w, fl, data, n, -1, a->applied[i],
                                     (uint64_t[]){0}, what));
        return SH_OK;
    }
    if (c->enc == DELTA__RAW || c->enc == DELTA__ZSTD) {
        if (!(a->saved[i] = malloc(n))) return sh_err(SH_ENOMEM, "out of memory");
        memcpy(a->saved[i], data, n);
        SH_TRY(delta__decode_chunk(s, c->enc, a->d->payload + c->off, (size_t)c->len, w, fl, data,
                                   n, NULL, what));
    } else if (c->enc == DELTA__SPARSE) {
        /* Patch and hash piece by piece while in cache. */
        return delta__decode_fused(s, c->enc, a->d->payload + c->off, (size_t)c->len, w, fl, data,
                                   data, n, NULL, &a->dig[i], &a->applied[i], what);
    } else if (c->enc == DELTA__DENSE) {
        SH_TRY(delta__ip_changes(s, c, a->d, w, fl, data, n, 1, UINT64_MAX, &a->applied[i], what));
    } else if (c->len) {
        return sh_err(SH_EFORMAT, "%s: SAME chunk with a payload", what);
    } else if (a->cache) {
        /* Untouched: the kept digest of these very bytes. */
        a->dig[i] = a->cache->dig[i];
        return SH_OK;
    }
    a->dig[i] = ckpt_chunk_digest(data, n);
    return SH_OK;
}

/* The image must be the delta's single file with the delta's header, and
 * every tensor diffed against itself. */
static int delta__ip_check(const uint8_t *img, size_t len, const delta *d)
{
    const delta__file *f = &d->files[0];
    if (d->nfiles != 1 || d->target_sharded || f->header_len > len ||
        memcmp(img, f->header, f->header_len) || delta_target_size(d) != len)
        return sh_err(SH_EINVAL, "in-place apply in memory needs a delta that keeps the layout "
                      "(same header); use delta_apply_mem");
    for (size_t i = 0; i < d->ntensors; i++)
        if (d->tensors[i].base && strcmp(d->tensors[i].base, d->tensors[i].name))
            return sh_err(SH_EINVAL, "in-place apply: tensor \"%s\" is diffed against \"%s\"",
                          d->tensors[i].name, d->tensors[i].base);
    return SH_OK;
}

static int delta__ip_verify(const delta__ip *a)
{
    const delta *d = a->d;
    sh_buf parts = {0};
    ckpt_digest_write(&parts, sh_hash128_of(d->files[0].header, d->files[0].header_len));
    int rc = SH_OK;
    for (size_t t = 0; t < d->ntensors; t++) {
        sh_hash128 h = ckpt_combine_digests(a->dig + a->first[t], a->first[t + 1] - a->first[t]);
        if (rc == SH_OK && !sh_hash128_eq(h, d->tensors[t].digest))
            rc = sh_err(SH_EMISMATCH, "%s: tensor \"%s\" does not match the delta's target after "
                        "applying: the image is not the delta's base (left unchanged)",
                        d->tensors[t].base ? "wrong base" : "corrupt delta", d->tensors[t].name);
        ckpt_digest_write(&parts, h);
    }
    if (rc == SH_OK && !sh_hash128_eq(sh_hash128_of(parts.data, parts.len), d->target_digest))
        rc = sh_err(SH_EMISMATCH, "delta: the result does not match the target digest (image "
                    "left unchanged)");
    sh_buf_free(&parts);
    return rc;
}

void delta_ip_cache_free(delta_ip_cache *c)
{
    if (!c) return;
    free(c->off), free(c->len), free(c->dig), free(c->wrote[0]), free(c->wrote[1]);
    memset(c, 0, sizeof *c);
}

static uint64_t delta__ip_off(const delta__ip *a, size_t i)
{
    return a->d->files[0].t[a->tensor[i]].offset + (uint64_t)a->chunk[i] * CKPT_CHUNK;
}

static uint32_t delta__ip_len(const delta__ip *a, size_t i)
{
    uint64_t nb = a->d->tensors[a->tensor[i]].nbytes, off = (uint64_t)a->chunk[i] * CKPT_CHUNK;
    return nb - off < CKPT_CHUNK ? (uint32_t)(nb - off) : CKPT_CHUNK;
}

/* Whether c holds digests for exactly this delta's chunks of the image. */
static int delta__ip_cache_fits(const delta__ip *a, const delta_ip_cache *c)
{
    if (!c || !c->valid || c->n != a->nitems) return 0;
    for (size_t i = 0; i < a->nitems; i++)
        if (c->off[i] != delta__ip_off(a, i) || c->len[i] != delta__ip_len(a, i)) return 0;
    return 1;
}

/* After a verified apply: c describes the target. */
static int delta__ip_cache_keep(const delta__ip *a, delta_ip_cache *c, int fits)
{
    if (!fits) {
        delta_ip_cache_free(c);
        c->n = a->nitems;
        c->off = calloc(c->n + 1, sizeof *c->off);
        c->len = calloc(c->n + 1, sizeof *c->len);
        c->dig = calloc(c->n + 1, sizeof *c->dig);
        c->wrote[0] = calloc(c->n + 1, 1);
        c->wrote[1] = calloc(c->n + 1, 1);
        if (!c->off || !c->len || !c->dig || !c->wrote[0] || !c->wrote[1]) {
            delta_ip_cache_free(c);
            return SH_OK; /* no cache: the next apply hashes everything */
        }
        for (size_t i = 0; i < c->n; i++) c->off[i] = delta__ip_off(a, i), c->len[i] = delta__ip_len(a, i);
        c->applies = 0;
    }
    uint8_t *w = c->wrote[1];
    c->wrote[1] = c->wrote[0];
    c->wrote[0] = w;
    for (size_t i = 0; i < c->n; i++) {
        const delta__chunk *ch = &a->d->tensors[a->tensor[i]].chunks[a->chunk[i]];
        w[i] = ch->enc != DELTA__SAME;
    }
    memcpy(c->dig, a->dig, c->n * sizeof *c->dig);
    c->valid = 1;
    c->applies++;
    return SH_OK;
}

int delta_apply_mem_inplace(uint8_t *img, size_t len, const delta *d, const delta_opts *o)
{
    return delta_apply_mem_inplace_cached(img, len, d, o, NULL);
}

int delta_apply_mem_inplace_cached(uint8_t *img, size_t len, const delta *d, const delta_opts *o,
                                   delta_ip_cache *cache)
{
    SH_TRY(delta__ip_check(img, len, d));
    delta__ip a = {.d = d, .img = img, .o = o};
    for (size_t t = 0; t < d->ntensors; t++) a.nitems += d->tensors[t].nchunks;
    a.first = calloc(d->ntensors + 1, sizeof *a.first);
    a.tensor = calloc(a.nitems + 1, sizeof *a.tensor);
    a.chunk = calloc(a.nitems + 1, sizeof *a.chunk);
    a.applied = calloc(a.nitems + 1, sizeof *a.applied);
    a.saved = calloc(a.nitems + 1, sizeof *a.saved);
    a.dig = calloc(a.nitems + 1, sizeof *a.dig);
    int rc = a.first && a.tensor && a.chunk && a.applied && a.saved && a.dig
                 ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
    for (size_t t = 0, k = 0; rc == SH_OK && t <= d->ntensors; t++) {
        a.first[t] = k;
        for (size_t c = 0; t < d->ntensors && c < d->tensors[t].nchunks; c++, k++)
            a.tensor[k] = (uint32_t)t, a.chunk[k] = (uint32_t)c;
    }
    int fits = rc == SH_OK && delta__ip_cache_fits(&a, cache);
    if (fits) a.cache = cache;
    int threads = o ? o->threads : 0;
    if (rc == SH_OK) rc = delta__parallel(threads, a.nitems, delta__ip_item, &a);
    if (rc == SH_OK) rc = delta__ip_verify(&a);
    if (rc == SH_OK && cache) rc = delta__ip_cache_keep(&a, cache, fits);
    if (rc < 0 && a.applied) {
        /* Undo everything written, keeping the first error's message. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", sh_errmsg());
        a.undo = 1;
        if (delta__parallel(threads, a.nitems, delta__ip_item, &a) < 0)
            rc = sh_err(SH_EINTERNAL, "in-place apply could not undo its changes: %s", sh_errmsg());
        else
            sh_err(rc, "%s", msg);
    }
    for (size_t i = 0; a.saved && i < a.nitems; i++) free(a.saved[i]);
    free(a.first), free(a.tensor), free(a.chunk), free(a.applied), free(a.saved), free(a.dig);
    return rc;
}
