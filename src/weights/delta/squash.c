/* delta squash: compose a chain v -> v+1 -> ... -> v+k into one delta
 * v -> v+k without the checkpoints.
 *
 * Differences in ord space add modulo 2^b, so a diffed chunk of the result
 * is the sum of the chain's differences (decoded into an accumulator with
 * plain addition).  When some delta of the chain stored a chunk's bytes
 * (RAW, ZSTD, or a whole tensor), the result from there on is known bytes:
 * decode them and apply the later deltas on top. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "weights/delta/delta_int.h"

/* A result tensor: the same tensor in each delta from `start` to the last. */
typedef struct {
    size_t start;          /* first delta of the lineage */
    size_t *idx;           /* idx[j]: the tensor's index in delta j (j >= start) */
    int from_base;         /* the lineage reaches the original base: a diff */
} delta__lineage;

typedef struct {
    uint32_t tensor, chunk;
    int enc;
    uint8_t *payload;
    size_t len;
    uint64_t changed;
} delta__sitem;

typedef struct {
    delta **ds;
    size_t n;
    delta__lineage *lin;   /* per tensor of the last delta */
    delta__sitem *items;
    size_t nitems;
} delta__sq;

static long delta__find_target(const delta *d, const char *name)
{
    for (size_t i = 0; i < d->ntensors; i++)
        if (!strcmp(d->tensors[i].name, name)) return (long)i;
    return -1;
}

/* Walks one tensor of the last delta back through the chain. */
static int delta__trace(delta__sq *q, size_t t, delta__lineage *l)
{
    l->idx = calloc(q->n, sizeof *l->idx);
    if (!l->idx) return sh_err(SH_ENOMEM, "out of memory");
    size_t j = q->n - 1, i = t;
    for (;;) {
        l->idx[j] = i;
        const delta__tensor *e = &q->ds[j]->tensors[i];
        if (!e->base) {
            l->start = j;
            return SH_OK;
        }
        if (j == 0) {
            l->start = 0;
            l->from_base = 1;
            return SH_OK;
        }
        long p = delta__find_target(q->ds[j - 1], e->base);
        if (p < 0)
            return sh_err(SH_EFORMAT, "squash: delta %zu diffs tensor \"%s\" against \"%s\", which "
                          "delta %zu does not produce (not a chain)", j + 1, e->name, e->base, j);
        const delta__tensor *pe = &q->ds[j - 1]->tensors[p];
        if (pe->dtype != e->dtype || pe->nbytes != e->nbytes)
            return sh_err(SH_EFORMAT, "squash: tensor \"%s\" changes type between deltas %zu and "
                          "%zu but is diffed", e->name, j, j + 1);
        i = (size_t)p;
        j--;
    }
}

static const uint8_t *delta__chunk_data(const delta *d, const delta__chunk *c)
{
    return d->payload + c->off;
}

static int delta__squash_item(void *arg, size_t k, delta__scratch *s)
{
    delta__sq *q = arg;
    delta__sitem *it = &q->items[k];
    const delta__lineage *l = &q->lin[it->tensor];
    const delta__tensor *last = &q->ds[q->n - 1]->tensors[it->tensor];
    unsigned w = delta__unit(last->dtype);
    int fl = ckpt_dtype_is_float(last->dtype);
    uint64_t off = (uint64_t)it->chunk * CKPT_CHUNK;
    size_t nb = last->nbytes - off < CKPT_CHUNK ? (size_t)(last->nbytes - off) : CKPT_CHUNK;
    SH_TRY(delta__scratch_tmp(s));
    /* The last delta in the lineage that stored this chunk's bytes. */
    size_t r = SIZE_MAX;
    for (size_t j = l->start; j < q->n; j++) {
        int enc = q->ds[j]->tensors[l->idx[j]].chunks[it->chunk].enc;
        if (enc == DELTA__RAW || enc == DELTA__ZSTD) r = j;
    }
    char what[512];
    const uint8_t *payload;
    uint64_t changed = 0;
    if (r != SIZE_MAX) {
        for (size_t j = r; j < q->n; j++) {
            const delta__tensor *e = &q->ds[j]->tensors[l->idx[j]];
            const delta__chunk *c = &e->chunks[it->chunk];
            snprintf(what, sizeof what, "delta %zu: tensor \"%s\" chunk %u", j + 1, e->name, it->chunk);
            SH_TRY(delta__decode_chunk(s, c->enc, delta__chunk_data(q->ds[j], c), (size_t)c->len,
                                       w, fl, s->tmp, nb, NULL, what));
        }
        sh_hash128 h;
        SH_TRY(delta__encode_chunk(s, w, fl, NULL, s->tmp, nb, &it->enc, &payload, &it->len,
                                   &changed, NULL, &h));
    } else {
        memset(s->tmp, 0, nb);
        memset(s->tmp2, 0, nb);
        for (size_t j = l->start; j < q->n; j++) {
            const delta__tensor *e = &q->ds[j]->tensors[l->idx[j]];
            const delta__chunk *c = &e->chunks[it->chunk];
            snprintf(what, sizeof what, "delta %zu: tensor \"%s\" chunk %u", j + 1, e->name, it->chunk);
            /* Plain addition: the differences are already in ord space. */
            SH_TRY(delta__decode_chunk(s, c->enc, delta__chunk_data(q->ds[j], c), (size_t)c->len,
                                       w, 0, s->tmp, nb, NULL, what));
        }
        SH_TRY(delta__encode_diff(s, w, s->tmp2, s->tmp, nb, &it->enc, &payload, &it->len, &changed));
    }
    it->changed = changed;
    it->payload = malloc(it->len ? it->len : 1);
    if (!it->payload) return sh_err(SH_ENOMEM, "out of memory");
    memcpy(it->payload, payload, it->len);
    return SH_OK;
}

static int delta__check_chain(delta **ds, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        if (!sh_hash128_eq(ds[i]->target_digest, ds[i + 1]->base_digest)) {
            char a[33], b[33];
            sh_hash128_hex(ds[i]->target_digest, a);
            sh_hash128_hex(ds[i + 1]->base_digest, b);
            return sh_err(SH_EMISMATCH, "squash: not a chain: delta %zu ends at checkpoint %s but "
                          "delta %zu starts from %s (give the deltas in order, without gaps)",
                          i + 1, a, i + 2, b);
        }
    return SH_OK;
}

static json_t *delta__squash_tensor(delta__sq *q, size_t t, size_t *k, sh_buf *payload,
                                    delta_stats *st)
{
    const delta__tensor *last = &q->ds[q->n - 1]->tensors[t];
    const delta__lineage *l = &q->lin[t];
    json_t *chunks = json_array();
    uint64_t changed = 0;
    for (; *k < q->nitems && q->items[*k].tensor == t; (*k)++) {
        delta__sitem *it = &q->items[*k];
        json_array_append_new(chunks, json_pack("[i,I,I]", it->enc, (json_int_t)payload->len,
                                                (json_int_t)it->len));
        sh_buf_append(payload, it->payload, it->len);
        changed += it->changed;
        st->chunks[it->enc]++;
    }
    const delta__tensor *first = &q->ds[0]->tensors[l->idx[0]];
    json_t *j = json_pack("{s:s,s:s,s:I,s:o,s:o,s:I,s:o}", "name", last->name, "dtype",
                          ckpt_dtype_name(last->dtype), "nbytes", (json_int_t)last->nbytes, "base",
                          l->from_base ? json_string(first->base) : json_null(), "digest",
                          delta__hex(last->digest), "changed", (json_int_t)changed, "chunks", chunks);
    if (l->from_base) {
        json_object_set_new(j, "base_digest", delta__hex(first->base_digest));
        st->units += last->nbytes / delta__unit(last->dtype);
        st->changed += changed;
        st->tensors_diff++;
    } else {
        st->tensors_whole++;
    }
    st->target_bytes += last->nbytes;
    return j;
}

static int delta__squash_assemble(delta__sq *q, sh_buf *out, delta_stats *st)
{
    const delta *L = q->ds[q->n - 1];
    sh_buf payload = {0};
    json_t *files = json_array(), *tensors = json_array();
    for (size_t f = 0; f < L->nfiles; f++)
        json_array_append_new(files, json_pack("{s:s,s:o}", "name", L->files[f].name, "header",
                                               delta__blob(&payload, L->files[f].header,
                                                           L->files[f].header_len)));
    json_t *index = L->target_sharded ? delta__blob(&payload, L->index, L->index_len) : json_null();
    size_t k = 0;
    for (size_t t = 0; t < L->ntensors; t++)
        json_array_append_new(tensors, delta__squash_tensor(q, t, &k, &payload, st));
    json_t *man = json_pack("{s:s,s:i,s:i,s:{s:o,s:b},s:{s:o,s:b,s:o},s:o,s:o}", "format",
                            "shoal-delta", "version", DELTA_VERSION, "chunk_bytes", CKPT_CHUNK,
                            "base", "digest", delta__hex(q->ds[0]->base_digest), "sharded",
                            q->ds[0]->base_sharded, "target", "digest",
                            delta__hex(L->target_digest), "sharded", L->target_sharded, "index",
                            index, "files", files, "tensors", tensors);
    int rc = man ? delta__write_container(man, &(delta__seg){payload.data, payload.len}, 1, out)
                 : sh_err(SH_ENOMEM, "cannot build the delta manifest");
    json_decref(man);
    sh_buf_free(&payload);
    if (rc == SH_OK) st->delta_bytes = out->len;
    return rc;
}

/* Composes parsed deltas (a chain, in order) into *out. */
static int delta__squash_mem(delta **ds, size_t n, const delta_opts *o, sh_buf *out,
                             delta_stats *st)
{
    memset(st, 0, sizeof *st);
    SH_TRY(delta__check_chain(ds, n));
    const delta *L = ds[n - 1];
    delta__sq q = {.ds = ds, .n = n};
    q.lin = calloc(L->ntensors + 1, sizeof *q.lin);
    size_t nitems = 0;
    int rc = q.lin ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
    for (size_t t = 0; t < L->ntensors && rc == SH_OK; t++) {
        rc = delta__trace(&q, t, &q.lin[t]);
        nitems += L->tensors[t].nchunks;
    }
    if (rc == SH_OK && !(q.items = calloc(nitems + 1, sizeof *q.items)))
        rc = sh_err(SH_ENOMEM, "out of memory");
    for (size_t t = 0; rc == SH_OK && t < L->ntensors; t++)
        for (size_t c = 0; c < L->tensors[t].nchunks; c++)
            q.items[q.nitems++] = (delta__sitem){.tensor = (uint32_t)t, .chunk = (uint32_t)c};
    if (rc == SH_OK) rc = delta__parallel(o ? o->threads : 0, q.nitems, delta__squash_item, &q);
    if (rc == SH_OK) rc = delta__squash_assemble(&q, out, st);
    for (size_t i = 0; i < q.nitems; i++) free(q.items[i].payload);
    free(q.items);
    for (size_t t = 0; q.lin && t < L->ntensors; t++) free(q.lin[t].idx);
    free(q.lin);
    return rc;
}

int delta_squash(const char *const *paths, size_t n, const char *out, const delta_opts *o,
                 delta_stats *st)
{
    delta_stats local;
    if (!st) st = &local;
    if (n < 1) return sh_err(SH_EINVAL, "squash needs at least one delta");
    char **bufs = calloc(n, sizeof *bufs);
    delta **ds = calloc(n, sizeof *ds);
    int rc = bufs && ds ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
    for (size_t i = 0; i < n && rc == SH_OK; i++) {
        size_t len;
        rc = sh_read_file(paths[i], (size_t)1 << 40, &bufs[i], &len);
        if (rc == SH_OK) rc = delta_parse(bufs[i], len, 0, &ds[i]);
        if (rc < 0) sh_err_wrap(rc, "%s", paths[i]);
    }
    sh_buf d = {0};
    if (rc == SH_OK) rc = delta__squash_mem(ds, n, o, &d, st);
    if (rc == SH_OK) rc = sh_write_atomic(out, d.data, d.len);
    sh_buf_free(&d);
    for (size_t i = 0; i < n && ds && bufs; i++) {
        delta_free(ds[i]);
        free(bufs[i]);
    }
    free(ds);
    free(bufs);
    return rc;
}
