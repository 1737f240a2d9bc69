/* delta make: encode base -> target chunk by chunk on a pool of threads,
 * hashing each chunk while it is in cache, then lay the payload out in
 * checkpoint order. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "weights/delta/delta_int.h"

/* One work item: a chunk of a target tensor, or (hash_only) a chunk of a
 * base tensor that no target tensor diffs against. */
typedef struct {
    uint32_t tensor, chunk;
    int hash_only;
    int enc;
    uint8_t *payload;
    size_t len;
    uint64_t changed;
    sh_hash128 dig, base_dig;
} delta__item;

typedef struct {
    const ckpt *base, *target;
    const ckpt_tensor **bt; /* per target tensor: the base tensor it diffs against, or NULL */
    delta__item *items;
    size_t nitems;
    const delta_opts *o;
    pthread_mutex_t mu;
    uint64_t done;
} delta__mk;

static int delta__make_item(void *arg, size_t i, delta__scratch *s)
{
    delta__mk *m = arg;
    delta__item *it = &m->items[i];
    const ckpt_tensor *t = it->hash_only ? &m->base->tensors[it->tensor] : &m->target->tensors[it->tensor];
    uint64_t off = (uint64_t)it->chunk * CKPT_CHUNK;
    size_t n = t->nbytes - off < CKPT_CHUNK ? (size_t)(t->nbytes - off) : CKPT_CHUNK;
    if (it->hash_only) {
        it->dig = ckpt_chunk_digest(t->data + off, n);
        return SH_OK;
    }
    const ckpt_tensor *b = m->bt[it->tensor];
    const uint8_t *payload;
    SH_TRY(delta__encode_chunk(s, delta__unit(t->dtype), ckpt_dtype_is_float(t->dtype),
                               b ? b->data + off : NULL, t->data + off, n, &it->enc, &payload,
                               &it->len, &it->changed, &it->base_dig, &it->dig));
    it->payload = malloc(it->len ? it->len : 1);
    if (!it->payload) return sh_err(SH_ENOMEM, "out of memory");
    memcpy(it->payload, payload, it->len);
    delta__progress(m->o, &m->mu, &m->done, n);
    return SH_OK;
}

static int delta__same_shape(const ckpt_tensor *a, const ckpt_tensor *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

/* Plans the items: every target chunk, then the chunks of base tensors that
 * nothing diffs against (their digests are part of the base's digest). */
static int delta__plan(delta__mk *m)
{
    const ckpt *B = m->base, *T = m->target;
    m->bt = calloc(T->ntensors + 1, sizeof *m->bt);
    uint8_t *used = calloc(B->ntensors + 1, 1);
    if (!m->bt || !used) {
        free(used);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < T->ntensors; i++) {
        const ckpt_tensor *b = ckpt_find(B, T->tensors[i].name);
        if (b && delta__same_shape(b, &T->tensors[i])) {
            m->bt[i] = b;
            used[b - B->tensors] = 1;
        }
        n += (T->tensors[i].nbytes + CKPT_CHUNK - 1) / CKPT_CHUNK;
    }
    for (size_t i = 0; i < B->ntensors; i++)
        if (!used[i]) n += (B->tensors[i].nbytes + CKPT_CHUNK - 1) / CKPT_CHUNK;
    m->items = calloc(n + 1, sizeof *m->items);
    if (!m->items) {
        free(used);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    for (int pass = 0; pass < 2; pass++) {
        const ckpt *c = pass ? B : T;
        for (size_t i = 0; i < c->ntensors; i++) {
            if (pass && used[i]) continue;
            uint64_t nc = (c->tensors[i].nbytes + CKPT_CHUNK - 1) / CKPT_CHUNK;
            for (uint64_t k = 0; k < nc; k++)
                m->items[m->nitems++] = (delta__item){.tensor = (uint32_t)i, .chunk = (uint32_t)k,
                                                      .hash_only = pass};
        }
    }
    free(used);
    return SH_OK;
}

/* Digests of every tensor of c from the items (diff chunks carry the base's
 * chunk digests), and the checkpoint digest into *out.  A tensor's chunk
 * digests are gathered into `parts`, which grows to the longest run of one
 * tensor's items: a tensor may have many more chunks than the checkpoint
 * has tensors (a 1 GB embedding is 501 chunks). */
static int delta__ckpt_digest(const delta__mk *m, const ckpt *c, int is_base, sh_hash128 *td,
                              sh_hash128 *out)
{
    sh_hash128 *parts = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < c->ntensors; i++) td[i] = ckpt_tensor_digest(NULL, 0);
    /* Items of one tensor are consecutive; gather them per tensor. */
    for (size_t k = 0; k < m->nitems;) {
        const delta__item *it = &m->items[k];
        size_t e = k;
        while (e < m->nitems && m->items[e].tensor == it->tensor && m->items[e].hash_only == it->hash_only) e++;
        size_t idx = SIZE_MAX;
        int base_side = 0;
        if (!is_base && !it->hash_only) idx = it->tensor;
        if (is_base && it->hash_only) idx = it->tensor;
        if (is_base && !it->hash_only && m->bt[it->tensor]) {
            idx = (size_t)(m->bt[it->tensor] - c->tensors);
            base_side = 1;
        }
        if (idx != SIZE_MAX) {
            if (e - k > cap) {
                sh_hash128 *p = realloc(parts, (e - k) * sizeof *parts);
                if (!p) {
                    free(parts);
                    return sh_err(SH_ENOMEM, "out of memory");
                }
                parts = p, cap = e - k;
            }
            for (size_t q = k; q < e; q++) parts[q - k] = base_side ? m->items[q].base_dig : m->items[q].dig;
            td[idx] = ckpt_combine_digests(parts, e - k);
        }
        k = e;
    }
    free(parts);
    sh_buf b = {0};
    if (c->is_folder) ckpt_digest_write(&b, sh_hash128_of(c->index_json, c->index_len));
    for (size_t f = 0; f < c->nfiles; f++) {
        ckpt_digest_write(&b, sh_hash128_of(c->files[f].map, c->files[f].header_len));
        for (size_t i = c->files[f].first; i < c->files[f].first + c->files[f].count; i++)
            ckpt_digest_write(&b, td[i]);
    }
    *out = sh_hash128_of(b.data, b.len);
    sh_buf_free(&b);
    return SH_OK;
}

/* The manifest entry of target tensor i, whose chunks are items *k on; their
 * payloads take their places from *off in the payload, and segments in seg. */
static json_t *delta__tensor_json(const delta__mk *m, size_t i, size_t *k, uint64_t *off,
                                  delta__seg *seg, const sh_hash128 *td, const sh_hash128 *bd,
                                  delta_stats *st)
{
    const ckpt_tensor *t = &m->target->tensors[i], *b = m->bt[i];
    json_t *chunks = json_array();
    uint64_t changed = 0;
    for (; *k < m->nitems && !m->items[*k].hash_only && m->items[*k].tensor == i; (*k)++) {
        delta__item *it = &m->items[*k];
        json_array_append_new(chunks, json_pack("[i,I,I]", it->enc, (json_int_t)*off,
                                                (json_int_t)it->len));
        seg[*k] = (delta__seg){it->payload, it->len};
        *off += it->len;
        changed += it->changed;
        st->chunks[it->enc]++;
    }
    json_t *j = json_pack("{s:s,s:s,s:I,s:o,s:o,s:I,s:o}", "name", t->name, "dtype",
                          ckpt_dtype_name(t->dtype), "nbytes", (json_int_t)t->nbytes, "base",
                          b ? json_string(b->name) : json_null(), "digest", delta__hex(td[i]),
                          "changed", (json_int_t)changed, "chunks", chunks);
    if (b) {
        json_object_set_new(j, "base_digest", delta__hex(bd[b - m->base->tensors]));
        st->units += t->nbytes / delta__unit(t->dtype);
        st->changed += changed;
        st->tensors_diff++;
    } else {
        st->tensors_whole++;
    }
    st->target_bytes += t->nbytes;
    return j;
}

/* Where the delta goes: a buffer, or a file descriptor (streamed). */
typedef struct {
    sh_buf *buf;
    int fd;
    const char *name;
} delta__dst;

static int delta__assemble_delta(delta__mk *m, const delta__dst *dst, delta_stats *st)
{
    const ckpt *B = m->base, *T = m->target;
    sh_hash128 *td = calloc(T->ntensors + 1, sizeof *td), *bd = calloc(B->ntensors + 1, sizeof *bd);
    if (!td || !bd) {
        free(td), free(bd);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    sh_hash128 tdig, bdig;
    int drc = delta__ckpt_digest(m, T, 0, td, &tdig);
    if (drc == SH_OK) drc = delta__ckpt_digest(m, B, 1, bd, &bdig);
    if (drc < 0) {
        free(td), free(bd);
        return drc;
    }
    /* The payload: the compressed headers, then every chunk's bytes straight
     * from its item (one copy, into the container). */
    sh_buf payload = {0};
    delta__seg *seg = calloc(m->nitems + 2, sizeof *seg);
    json_t *files = json_array(), *tensors = json_array();
    for (size_t f = 0; f < T->nfiles; f++)
        json_array_append_new(files, json_pack("{s:s,s:o}", "name", T->files[f].name, "header",
                                               delta__blob(&payload, T->files[f].map,
                                                           T->files[f].header_len)));
    json_t *index = T->is_folder ? delta__blob(&payload, T->index_json, T->index_len) : json_null();
    size_t k = 0;
    uint64_t off = payload.len;
    for (size_t i = 0; seg && i < T->ntensors; i++)
        json_array_append_new(tensors, delta__tensor_json(m, i, &k, &off, seg + 1, td, bd, st));
    if (seg) seg[0] = (delta__seg){payload.data, payload.len};
    json_t *man = json_pack("{s:s,s:i,s:i,s:{s:o,s:b},s:{s:o,s:b,s:o},s:o,s:o}", "format",
                            "shoal-delta", "version", DELTA_VERSION, "chunk_bytes", CKPT_CHUNK,
                            "base", "digest", delta__hex(bdig), "sharded", B->is_folder, "target",
                            "digest", delta__hex(tdig), "sharded", T->is_folder, "index", index,
                            "files", files, "tensors", tensors);
    uint64_t len = 0;
    int rc = !man || !seg ? sh_err(SH_ENOMEM, "cannot build the delta manifest")
             : dst->buf   ? delta__write_container(man, seg, k + 1, dst->buf)
                          : delta__write_container_fd(man, seg, k + 1, dst->fd, dst->name, &len);
    json_decref(man);
    sh_buf_free(&payload);
    free(seg);
    free(td), free(bd);
    if (rc == SH_OK) st->delta_bytes = dst->buf ? dst->buf->len : len;
    return rc;
}

static int delta__make(const ckpt *base, const ckpt *target, const delta_opts *o,
                       const delta__dst *dst, delta_stats *st)
{
    delta_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    delta__mk m = {.base = base, .target = target, .o = o};
    pthread_mutex_init(&m.mu, NULL);
    int rc = delta__plan(&m);
    if (o && o->progress && !o->progress->total) o->progress->total = ckpt_data_bytes(target);
    if (rc == SH_OK) rc = delta__parallel(o ? o->threads : 0, m.nitems, delta__make_item, &m);
    if (rc == SH_OK) rc = delta__assemble_delta(&m, dst, st);
    for (size_t i = 0; i < m.nitems; i++) free(m.items[i].payload);
    free(m.items);
    free(m.bt);
    pthread_mutex_destroy(&m.mu);
    return rc;
}

int delta_make_mem(const ckpt *base, const ckpt *target, const delta_opts *o, sh_buf *out,
                   delta_stats *st)
{
    return delta__make(base, target, o, &(delta__dst){.buf = out, .fd = -1}, st);
}

/* The file layer streams the container into the output file: the chunk
 * payloads (the delta's size) are the only copy held in memory. */
int delta_make_ckpt(const ckpt *base, const ckpt *target, const char *out, const delta_opts *o,
                    delta_stats *st)
{
    sh_atomic_file f;
    SH_TRY(sh_atomic_open(&f, out));
    int rc = delta__make(base, target, o, &(delta__dst){.fd = f.fd, .name = f.tmp}, st);
    if (rc == SH_OK) return sh_atomic_commit(&f);
    sh_atomic_abort(&f);
    return rc;
}

int delta_make(const char *base, const char *target, const char *out, const delta_opts *o,
               delta_stats *st)
{
    ckpt *b = NULL, *t = NULL;
    int rc = ckpt_open(base, &b);
    if (rc == SH_OK) rc = ckpt_open(target, &t);
    if (rc == SH_OK) rc = delta_make_ckpt(b, t, out, o, st);
    ckpt_close(b);
    ckpt_close(t);
    return rc;
}
