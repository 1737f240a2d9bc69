/* FP8 rollout weights: block quantisation of bf16 checkpoints to F8_E4M3 as
 * DeepSeek-V3 stores them (one F32 scale_inv per 128 x 128 block), and its
 * incremental update from a delta that re-quantises only touched blocks.
 *
 * Both paths quantise a block with the same function, so a block's bytes
 * depend only on its 128 x 128 bf16 values: re-quantising exactly the blocks
 * whose values changed gives the bytes of quantising from scratch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "weights/delta/delta_int.h"

#define QB DELTA_FP8_BLOCK

enum { QUANT_COPY, QUANT_Q, QUANT_SCALE };

typedef struct {
    int kind;
    size_t src;     /* tensor index in the source checkpoint */
    size_t scale;   /* QUANT_Q: the writer index of its scale_inv tensor */
} quant__map;

typedef struct {
    const ckpt *src;       /* bf16 checkpoint quantised (from scratch: in; update: new) */
    const ckpt *old;       /* update: the fp8 checkpoint to reuse blocks from */
    ckpt_writer *w;
    quant__map *map;       /* per writer tensor */
    uint8_t **touched;     /* update: per source tensor, a block bitmap (NULL: all) */
    size_t *items;         /* work items: (writer tensor << 32) | block row or chunk */
    size_t nitems;
    uint64_t requantised;
    const delta_opts *o;
    pthread_mutex_t mu;    /* guards done, the progress in source bytes */
    uint64_t done;
} quant__job;

static int quant__eligible(const ckpt_tensor *t, const char *const *keep)
{
    if (t->dtype != CKPT_BF16 || t->ndim != 2) return 0;
    for (size_t i = 0; keep && keep[i]; i++)
        if (strstr(t->name, keep[i])) return 0;
    return 1;
}

static void quant__free_names(char **nm, size_t n)
{
    for (size_t i = 0; nm && i < n; i++) free(nm[i]);
    free(nm);
}

/* Output tensors: each eligible tensor becomes NAME (F8_E4M3) and
 * NAME_scale_inv (F32 blocks); the rest are copied. */
static int quant__specs(const ckpt *src, const char *const *keep, ckpt_tensor **out, size_t *n,
                        char ***names)
{
    size_t cap = 2 * src->ntensors + 1, k = 0;
    ckpt_tensor *t = calloc(cap, sizeof *t);
    char **nm = calloc(cap, sizeof *nm);
    if (!t || !nm) {
        free(t), free(nm);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < src->ntensors; i++) {
        const ckpt_tensor *s = &src->tensors[i];
        t[k] = *s;
        nm[k] = strdup(s->name);
        t[k].name = nm[k];
        if (!quant__eligible(s, keep)) {
            k++;
            continue;
        }
        t[k++].dtype = CKPT_F8_E4M3;
        size_t len = strlen(s->name) + 11;
        nm[k] = malloc(len);
        if (nm[k]) snprintf(nm[k], len, "%s_scale_inv", s->name);
        t[k] = (ckpt_tensor){.name = nm[k], .dtype = CKPT_F32, .ndim = 2,
                             .shape = {(s->shape[0] + QB - 1) / QB, (s->shape[1] + QB - 1) / QB}};
        if (!nm[k] || ckpt_find(src, nm[k])) {
            int rc = nm[k] ? sh_err(SH_EINVAL, "%s: already has a tensor \"%s\" (is it "
                                    "quantised already?)", src->path, nm[k])
                           : sh_err(SH_ENOMEM, "out of memory");
            quant__free_names(nm, k + 1);
            free(t);
            return rc;
        }
        k++;
    }
    *out = t, *n = k, *names = nm;
    return SH_OK;
}

/* Quantises block (br, bc) of a bf16 [rows, cols] tensor: q gets the fp8
 * rows of the block (row stride cols), *scale its scale_inv. */
float delta_fp8_block(const void *x, int64_t rows, int64_t cols, int64_t br, int64_t bc, uint8_t *q,
                      int64_t ldq)
{
    const uint8_t *b = x;
    int64_t r0 = br * QB, c0 = bc * QB;
    int64_t r1 = r0 + QB < rows ? r0 + QB : rows, c1 = c0 + QB < cols ? c0 + QB : cols;
    float amax = 0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            uint16_t h;
            memcpy(&h, b + 2 * (r * cols + c), 2);
            float v = fabsf(ckpt_bf16_to_f32(h));
            if (v > amax) amax = v; /* NaN never compares greater: ignored */
        }
    float si = amax > 0 && isfinite(amax) ? amax / 448.0f : 1.0f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            uint16_t h;
            memcpy(&h, b + 2 * (r * cols + c), 2);
            q[(r - r0) * ldq + (c - c0)] = ckpt_f32_to_e4m3(ckpt_bf16_to_f32(h) / si);
        }
    return si;
}

static int quant__copy_item(quant__job *j, size_t wt, size_t chunk)
{
    const ckpt_tensor *t = ckpt_writer_tensor(j->w, wt);
    const ckpt_tensor *s = &j->src->tensors[j->map[wt].src];
    uint64_t off = (uint64_t)chunk * CKPT_CHUNK;
    size_t n = t->nbytes - off < CKPT_CHUNK ? (size_t)(t->nbytes - off) : CKPT_CHUNK;
    delta__progress(j->o, &j->mu, &j->done, n);
    return ckpt_writer_put(j->w, wt, off, s->data + off, n);
}

/* One block row of a quantised tensor: fp8 rows and their scales. */
static int quant__row_item(quant__job *j, size_t wt, int64_t br)
{
    size_t si = j->map[wt].src;
    const ckpt_tensor *s = &j->src->tensors[si];
    int64_t rows = s->shape[0], cols = s->shape[1], nbc = (cols + QB - 1) / QB;
    int64_t r0 = br * QB, nr = r0 + QB < rows ? QB : rows - r0;
    const uint8_t *touched = j->touched ? j->touched[si] : NULL;
    uint8_t *q = malloc((size_t)(nr * cols) + 1);
    float *sc = malloc((size_t)nbc * sizeof *sc + 1);
    if (!q || !sc) {
        free(q), free(sc);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    const ckpt_tensor *oq = NULL, *os = NULL;
    if (j->old) {
        oq = ckpt_find(j->old, s->name);
        os = ckpt_find(j->old, ckpt_writer_tensor(j->w, j->map[wt].scale)->name);
    }
    uint64_t done = 0;
    for (int64_t bc = 0; bc < nbc; bc++) {
        if (touched && !touched[br * nbc + bc]) {
            /* Reuse the old block: its bf16 values did not change. */
            int64_t c0 = bc * QB, nc = c0 + QB < cols ? QB : cols - c0;
            for (int64_t r = 0; r < nr; r++)
                memcpy(q + r * cols + c0, oq->data + (r0 + r) * cols + c0, (size_t)nc);
            memcpy(&sc[bc], os->data + (size_t)(br * nbc + bc) * 4, 4);
            continue;
        }
        sc[bc] = delta_fp8_block(s->data, s->shape[0], cols, br, bc, q + bc * QB, cols);
        done++;
    }
    int rc = ckpt_writer_put(j->w, wt, (uint64_t)(r0 * cols), q, (size_t)(nr * cols));
    if (rc == SH_OK)
        rc = ckpt_writer_put(j->w, j->map[wt].scale, (uint64_t)(br * nbc) * 4, sc, (size_t)nbc * 4);
    __atomic_fetch_add(&j->requantised, done, __ATOMIC_RELAXED);
    delta__progress(j->o, &j->mu, &j->done, (uint64_t)(nr * cols) * 2);
    free(q), free(sc);
    return rc;
}

static int quant__item(void *arg, size_t i, delta__scratch *s)
{
    quant__job *j = arg;
    size_t wt = j->items[i] >> 32, sub = j->items[i] & 0xffffffffu;
    if (j->map[wt].kind == QUANT_COPY) return quant__copy_item(j, wt, sub);
    return quant__row_item(j, wt, (int64_t)sub);
}

/* Maps writer tensors to sources and lists the work. */
static int quant__plan(quant__job *j)
{
    size_t n = ckpt_writer_count(j->w), cap = 0;
    j->map = calloc(n + 1, sizeof *j->map);
    if (!j->map) return sh_err(SH_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = ckpt_writer_tensor(j->w, i);
        const ckpt_tensor *s = ckpt_find(j->src, t->name);
        if (s) {
            j->map[i] = (quant__map){t->dtype == CKPT_F8_E4M3 && s->dtype == CKPT_BF16 ? QUANT_Q : QUANT_COPY,
                                     (size_t)(s - j->src->tensors), 0};
            if (j->map[i].kind == QUANT_Q) {
                char nm[1024];
                snprintf(nm, sizeof nm, "%s_scale_inv", t->name);
                long k = ckpt_writer_find(j->w, nm);
                if (k < 0) return sh_err(SH_EINTERNAL, "quant: no scale tensor for %s", t->name);
                j->map[i].scale = (size_t)k;
            }
            cap += j->map[i].kind == QUANT_Q ? (size_t)((s->shape[0] + QB - 1) / QB)
                                             : (size_t)((t->nbytes + CKPT_CHUNK - 1) / CKPT_CHUNK);
        } else {
            j->map[i].kind = QUANT_SCALE; /* written with its weight */
        }
    }
    j->items = calloc(cap + 1, sizeof *j->items);
    if (!j->items) return sh_err(SH_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (j->map[i].kind == QUANT_SCALE) continue;
        const ckpt_tensor *t = ckpt_writer_tensor(j->w, i);
        size_t subs = j->map[i].kind == QUANT_Q
                          ? (size_t)((j->src->tensors[j->map[i].src].shape[0] + QB - 1) / QB)
                          : (size_t)((t->nbytes + CKPT_CHUNK - 1) / CKPT_CHUNK);
        for (size_t k = 0; k < subs; k++) j->items[j->nitems++] = (size_t)i << 32 | k;
    }
    return SH_OK;
}

static void quant__job_free(quant__job *j)
{
    free(j->map);
    free(j->items);
    for (size_t i = 0; j->touched && i < j->src->ntensors; i++) free(j->touched[i]);
    free(j->touched);
}

/* What the writer of job j holds: tensors by kind and data bytes. */
static void quant__stats(const quant__job *j, delta_quant_stats *st)
{
    size_t n = ckpt_writer_count(j->w);
    *st = (delta_quant_stats){.blocks = j->requantised, .bytes_in = ckpt_data_bytes(j->src)};
    for (size_t i = 0; i < n; i++) {
        st->bytes_out += ckpt_writer_tensor(j->w, i)->nbytes;
        if (j->map[i].kind == QUANT_Q) st->tensors_quantised++;
        else if (j->map[i].kind == QUANT_COPY) st->tensors_copied++;
    }
}

/* Writes the quantisation of j->src to out (j->old and j->touched set for
 * an update), and what it wrote to *st when not NULL.  The metadata
 * records the source checkpoint's digest. */
static int quant__run(quant__job *j, const char *out, const char *const *keep, sh_hash128 src_dig,
                      const delta_opts *o, delta_quant_stats *st)
{
    ckpt_tensor *specs = NULL;
    size_t n = 0;
    char **names = NULL;
    SH_TRY(quant__specs(j->src, keep, &specs, &n, &names));
    json_t *meta = j->src->metadata ? json_deep_copy(j->src->metadata) : json_object();
    char hex[33];
    sh_hash128_hex(src_dig, hex);
    json_object_set_new(meta, "shoal.quant", json_string("F8_E4M3, one F32 scale_inv per 128x128 block"));
    json_object_set_new(meta, "shoal.source_digest", json_string(hex));
    int rc = ckpt_writer_open(out, specs, n, meta, 0, &j->w);
    json_decref(meta);
    free(specs);
    quant__free_names(names, n);
    SH_TRY(rc);
    rc = quant__plan(j);
    j->o = o;
    if (o && o->progress && !o->progress->total) o->progress->total = ckpt_data_bytes(j->src);
    pthread_mutex_init(&j->mu, NULL);
    if (rc == SH_OK) rc = delta__parallel(o ? o->threads : 0, j->nitems, quant__item, j);
    pthread_mutex_destroy(&j->mu);
    if (rc == SH_OK && st) quant__stats(j, st); /* the writer goes with the commit */
    if (rc == SH_OK) rc = ckpt_writer_commit(j->w);
    else ckpt_writer_abort(j->w);
    return rc;
}

int delta_quant_fp8(const char *in, const char *out, const char *const *keep, const delta_opts *o,
                    delta_quant_stats *st)
{
    ckpt *src;
    SH_TRY(ckpt_open(in, &src));
    sh_hash128 dig;
    int rc = ckpt_digest(src, o ? o->threads : 0, &dig, NULL);
    quant__job j = {.src = src};
    if (rc == SH_OK) rc = quant__run(&j, out, keep, dig, o, st);
    quant__job_free(&j);
    ckpt_close(src);
    return rc;
}

/* Marks the blocks holding units [u0, u1) of a [rows, cols] tensor. */
static void quant__mark_range(uint8_t *bm, int64_t cols, int64_t nbc, uint64_t u0, uint64_t u1)
{
    for (uint64_t u = u0; u < u1;) {
        int64_t r = (int64_t)(u / (uint64_t)cols), c = (int64_t)(u % (uint64_t)cols);
        uint64_t row_end = (uint64_t)(r + 1) * (uint64_t)cols, e = u1 < row_end ? u1 : row_end;
        int64_t c1 = c + (int64_t)(e - u) - 1;
        for (int64_t bc = c / QB; bc <= c1 / QB; bc++) bm[(r / QB) * nbc + bc] = 1;
        u = e;
    }
}

/* The blocks of tensor t (in the delta's target) that the delta changed;
 * NULL result with SH_OK never happens: all-ones when carried whole. */
static int quant__touched(const delta *d, const ckpt_tensor *t, delta__scratch *s, uint8_t **out)
{
    int64_t rows = t->shape[0], cols = t->shape[1];
    int64_t nbr = (rows + QB - 1) / QB, nbc = (cols + QB - 1) / QB;
    uint8_t *bm = calloc((size_t)(nbr * nbc) + 1, 1);
    if (!bm) return sh_err(SH_ENOMEM, "out of memory");
    *out = bm;
    const delta__tensor *dt = NULL;
    for (size_t i = 0; i < d->ntensors && !dt; i++)
        if (!strcmp(d->tensors[i].name, t->name)) dt = &d->tensors[i];
    if (!dt || !dt->base || strcmp(dt->base, t->name)) {
        memset(bm, 1, (size_t)(nbr * nbc));
        return SH_OK;
    }
    uint32_t pos[512];
    uint64_t z[512];
    for (size_t k = 0; k < dt->nchunks; k++) {
        const delta__chunk *c = &dt->chunks[k];
        uint64_t u0 = (uint64_t)k * (CKPT_CHUNK / 2);
        uint64_t units = (dt->nbytes - (uint64_t)k * CKPT_CHUNK < CKPT_CHUNK ? dt->nbytes - (uint64_t)k * CKPT_CHUNK : CKPT_CHUNK) / 2;
        if (c->enc == DELTA__SAME) continue;
        if (c->enc == DELTA__RAW || c->enc == DELTA__ZSTD) {
            quant__mark_range(bm, cols, nbc, u0, u0 + units);
            continue;
        }
        delta__dec dec;
        SH_TRY(delta__dec_open(&dec, c->enc, d->payload + c->off, (size_t)c->len, units, 2, s, t->name));
        size_t got;
        do {
            SH_TRY(delta__dec_next(&dec, pos, z, 512, &got));
            for (size_t i = 0; i < got; i++)
                if (z[i]) quant__mark_range(bm, cols, nbc, u0 + pos[i], u0 + pos[i] + 1);
        } while (got);
        SH_TRY(delta__dec_close(&dec));
    }
    return SH_OK;
}

/* The update's preconditions: the fp8 checkpoint was quantised from the
 * delta's base, and new_bf16 is the delta's target. */
static int quant__check(const ckpt *old, const ckpt *nw, const delta *d, const delta_opts *o,
                        sh_hash128 *ndig)
{
    char a[33], b[33];
    const char *src = ckpt_meta(old, "shoal.source_digest");
    sh_hash128 h;
    if (!src || sh_hash128_parse(src, &h) < 0)
        return sh_err(SH_EINVAL, "%s: no shoal.source_digest in its metadata (quantise it with "
                      "`shoal quant fp8` first)", old->path);
    if (!sh_hash128_eq(h, d->base_digest)) {
        sh_hash128_hex(d->base_digest, a);
        return sh_err(SH_EMISMATCH, "%s was quantised from checkpoint %s, but the delta starts "
                      "from %s", old->path, src, a);
    }
    SH_TRY(ckpt_digest(nw, o ? o->threads : 0, ndig, NULL));
    if (!sh_hash128_eq(*ndig, d->target_digest)) {
        sh_hash128_hex(*ndig, a);
        sh_hash128_hex(d->target_digest, b);
        return sh_err(SH_EMISMATCH, "%s is checkpoint %s, but the delta leads to %s (give the "
                      "delta's target with --from)", nw->path, a, b);
    }
    return SH_OK;
}

int delta_quant_fp8_update(const char *fp8, const char *new_bf16, const char *delta_path,
                           const char *out, const char *const *keep, const delta_opts *o,
                           uint64_t *blocks)
{
    ckpt *old = NULL, *nw = NULL;
    delta *d = NULL;
    char *buf = NULL;
    size_t len;
    int rc = ckpt_open(fp8, &old);
    if (rc == SH_OK) rc = ckpt_open(new_bf16, &nw);
    if (rc == SH_OK) rc = sh_read_file(delta_path, (size_t)1 << 40, &buf, &len);
    if (rc == SH_OK && (rc = delta_parse(buf, len, 0, &d)) < 0) sh_err_wrap(rc, "%s", delta_path);
    sh_hash128 ndig;
    if (rc == SH_OK) rc = quant__check(old, nw, d, o, &ndig);
    quant__job j = {.src = nw, .old = old};
    delta__scratch s;
    if (rc == SH_OK) rc = delta__scratch_init(&s);
    if (rc == SH_OK) {
        j.touched = calloc(nw->ntensors + 1, sizeof *j.touched);
        if (!j.touched) rc = sh_err(SH_ENOMEM, "out of memory");
        for (size_t i = 0; rc == SH_OK && i < nw->ntensors; i++) {
            const ckpt_tensor *t = &nw->tensors[i];
            if (!quant__eligible(t, keep)) continue;
            rc = quant__touched(d, t, &s, &j.touched[i]);
            /* Reuse needs the old fp8 weight and scales with the same shape. */
            char nm[1024];
            snprintf(nm, sizeof nm, "%s_scale_inv", t->name);
            const ckpt_tensor *oq = ckpt_find(old, t->name), *os = ckpt_find(old, nm);
            if (rc == SH_OK && (!oq || oq->dtype != CKPT_F8_E4M3 || oq->nbytes != t->numel || !os ||
                                os->nbytes != 4 * (uint64_t)(((t->shape[0] + QB - 1) / QB) *
                                                             ((t->shape[1] + QB - 1) / QB))))
                memset(j.touched[i], 1, (size_t)(((t->shape[0] + QB - 1) / QB) * ((t->shape[1] + QB - 1) / QB)));
        }
        delta__scratch_free(&s);
    }
    if (rc == SH_OK) rc = quant__run(&j, out ? out : fp8, keep, ndig, o, NULL);
    if (rc == SH_OK && blocks) *blocks = j.requantised;
    quant__job_free(&j);
    delta_free(d);
    free(buf);
    ckpt_close(old);
    ckpt_close(nw);
    return rc;
}
