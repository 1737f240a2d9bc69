/* Writing safetensors as the reference implementation does, streaming:
 * the header is fixed first, then tensor bytes arrive at any offset from any
 * thread (pwrite), and the file appears atomically on commit. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weights/ckpt/ckpt_int.h"

struct ckpt_writer {
    sh_atomic_file f;
    ckpt_tensor *t;   /* file order; names owned; offsets absolute in the file */
    size_t n;
    uint64_t *written; /* bytes written per tensor (atomic adds) */
    uint64_t total;    /* file size */
};

/* serde_json's string escaping: quote, backslash and control characters. */
static void ckpt__json_str(sh_buf *b, const char *s)
{
    sh_buf_append(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': sh_buf_append(b, "\\\"", 2); break;
        case '\\': sh_buf_append(b, "\\\\", 2); break;
        case '\b': sh_buf_append(b, "\\b", 2); break;
        case '\f': sh_buf_append(b, "\\f", 2); break;
        case '\n': sh_buf_append(b, "\\n", 2); break;
        case '\r': sh_buf_append(b, "\\r", 2); break;
        case '\t': sh_buf_append(b, "\\t", 2); break;
        default:
            if (*p < 0x20) sh_buf_printf(b, "\\u%04x", *p);
            else sh_buf_append(b, p, 1);
        }
    }
    sh_buf_append(b, "\"", 1);
}

static int ckpt__cmp_keys(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* __metadata__ with keys sorted, so that the header is reproducible. */
static int ckpt__json_meta(sh_buf *b, const json_t *m)
{
    size_t n = json_object_size(m), k = 0;
    const char **keys = malloc((n + 1) * sizeof *keys);
    if (!keys) return sh_err(SH_ENOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)m, key, v)
    {
        if (!json_is_string(v)) {
            free(keys);
            return sh_err(SH_EINVAL, "__metadata__ value of \"%s\" is not a string", key);
        }
        keys[k++] = key;
    }
    qsort(keys, k, sizeof *keys, ckpt__cmp_keys);
    sh_buf_append(b, "\"__metadata__\":{", 16);
    for (size_t i = 0; i < k; i++) {
        if (i) sh_buf_append(b, ",", 1);
        ckpt__json_str(b, keys[i]);
        sh_buf_append(b, ":", 1);
        ckpt__json_str(b, json_string_value(json_object_get(m, keys[i])));
    }
    sh_buf_append(b, "}", 1);
    free(keys);
    return SH_OK;
}

int ckpt_header_build(const ckpt_tensor *t, size_t n, const json_t *metadata, sh_buf *out)
{
    sh_buf b = {0};
    sh_buf_append(&b, "\0\0\0\0\0\0\0\0{", 9);
    int rc = SH_OK;
    if (metadata && json_object_size(metadata) > 0) rc = ckpt__json_meta(&b, metadata);
    for (size_t i = 0; rc == SH_OK && i < n; i++) {
        if (b.len > 9) sh_buf_append(&b, ",", 1);
        ckpt__json_str(&b, t[i].name);
        sh_buf_printf(&b, ":{\"dtype\":\"%s\",\"shape\":[", ckpt_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            sh_buf_printf(&b, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        sh_buf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t[i].offset,
                      (unsigned long long)(t[i].offset + t[i].nbytes));
    }
    sh_buf_append(&b, "}", 1);
    while ((b.len - 8) % 8) sh_buf_append(&b, " ", 1);
    if (rc == SH_OK && !b.data) rc = sh_err(SH_ENOMEM, "out of memory");
    if (rc < 0) {
        sh_buf_free(&b);
        return rc;
    }
    uint64_t hn = b.len - 8;
    for (int i = 0; i < 8; i++) b.data[i] = (uint8_t)(hn >> (8 * i));
    *out = b;
    return SH_OK;
}

static int ckpt__cmp_ref(const void *a, const void *b)
{
    const ckpt_tensor *x = a, *y = b;
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}

void ckpt_sort_reference(ckpt_tensor *t, size_t n) { qsort(t, n, sizeof *t, ckpt__cmp_ref); }

void ckpt_writer_abort(ckpt_writer *w)
{
    if (!w) return;
    if (w->f.fd >= 0) sh_atomic_abort(&w->f);
    ckpt_tensors_free(w->t, w->n);
    free(w->written);
    free(w);
}

/* Creates the temporary file and writes the header image. */
static int ckpt__writer_start(ckpt_writer *w, const char *path, const uint8_t *hdr, size_t len)
{
    w->f.fd = -1;
    SH_TRY(sh_atomic_open(&w->f, path));
    SH_TRY(sh_write_all(w->f.fd, hdr, len, w->f.tmp));
    w->total = len;
    for (size_t i = 0; i < w->n; i++) w->total += w->t[i].nbytes;
    if (ftruncate(w->f.fd, (off_t)w->total) < 0) return sh_err_errno(errno, "resize %s", w->f.tmp);
    w->written = calloc(w->n + 1, sizeof *w->written);
    return w->written ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
}

int ckpt_writer_open_raw(const char *path, const uint8_t *hdr, size_t hdr_len, ckpt_writer **out)
{
    ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return sh_err(SH_ENOMEM, "out of memory");
    w->f.fd = -1;
    uint64_t hl;
    int rc = ckpt__parse_image(hdr, hdr_len, 1, path, &w->t, &w->n, NULL, &hl);
    if (rc == SH_OK) rc = ckpt__writer_start(w, path, hdr, hdr_len);
    if (rc < 0) {
        ckpt_writer_abort(w);
        return rc;
    }
    *out = w;
    return SH_OK;
}

int ckpt_writer_open(const char *path, const ckpt_tensor *specs, size_t n, const json_t *metadata,
                     int flags, ckpt_writer **out)
{
    ckpt_tensor *t = calloc(n + 1, sizeof *t);
    if (!t) return sh_err(SH_ENOMEM, "out of memory");
    int rc = SH_OK;
    for (size_t i = 0; i < n && rc == SH_OK; i++) {
        t[i] = specs[i];
        t[i].name = NULL;
        t[i].data = NULL;
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= (uint64_t)t[i].shape[d];
        t[i].numel = numel;
        t[i].nbytes = numel * ckpt_dtype_bits(t[i].dtype) / 8;
        if (t[i].ndim < 0 || t[i].ndim > CKPT_MAX_DIMS || !ckpt_dtype_name(t[i].dtype))
            rc = sh_err(SH_EINVAL, "%s: tensor \"%s\": bad dtype or rank", path, specs[i].name);
        else if (!(t[i].name = strdup(specs[i].name))) rc = sh_err(SH_ENOMEM, "out of memory");
    }
    if (rc < 0) {
        ckpt_tensors_free(t, n);
        return rc;
    }
    if (!(flags & CKPT_KEEP_ORDER)) ckpt_sort_reference(t, n);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        t[i].offset = off;
        off += t[i].nbytes;
    }
    sh_buf hdr = {0};
    rc = ckpt_header_build(t, n, metadata, &hdr);
    ckpt_tensors_free(t, n);
    if (rc < 0) return rc;
    /* Re-parsing the image checks it (names unique, sizes) exactly as a
     * reader will, and gives the absolute offsets. */
    rc = ckpt_writer_open_raw(path, hdr.data, hdr.len, out);
    sh_buf_free(&hdr);
    return rc;
}

size_t ckpt_writer_count(const ckpt_writer *w) { return w->n; }

const ckpt_tensor *ckpt_writer_tensor(const ckpt_writer *w, size_t i)
{
    return i < w->n ? &w->t[i] : NULL;
}

long ckpt_writer_find(const ckpt_writer *w, const char *name)
{
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name)) return (long)i;
    return -1;
}

static int ckpt__is_zero(const uint8_t *p, size_t n) { return !p[0] && !memcmp(p, p + 1, n - 1); }

int ckpt_writer_put(ckpt_writer *w, size_t i, uint64_t off, const void *data, size_t len)
{
    if (i >= w->n || off > w->t[i].nbytes || len > w->t[i].nbytes - off)
        return sh_err(SH_EINTERNAL, "%s: write of %zu bytes at %llu outside tensor %zu", w->f.path,
                      len, (unsigned long long)off, i);
    if (len == 0) return SH_OK;
    /* The file was sized with ftruncate and every byte is written once, so
     * a run of zeros is already there: skipping it leaves a hole (as
     * cp --sparse does), which spares the disk on zero-filled tensors. */
    const uint8_t *p = data;
    const size_t piece = 64u << 10;
    for (size_t a = 0; a < len;) {
        size_t e = a;
        while (e < len && !ckpt__is_zero(p + e, len - e < piece ? len - e : piece))
            e += len - e < piece ? len - e : piece;
        if (e > a) SH_TRY(sh_pwrite_all(w->f.fd, p + a, e - a, w->t[i].offset + off + a, w->f.tmp));
        a = e;
        while (a < len && ckpt__is_zero(p + a, len - a < piece ? len - a : piece))
            a += len - a < piece ? len - a : piece;
    }
    __atomic_fetch_add(&w->written[i], len, __ATOMIC_RELAXED);
    return SH_OK;
}

int ckpt_writer_commit(ckpt_writer *w)
{
    int rc = SH_OK;
    for (size_t i = 0; i < w->n && rc == SH_OK; i++)
        if (w->written[i] != w->t[i].nbytes)
            rc = sh_err(SH_EINTERNAL, "%s: tensor \"%s\": %llu of %llu bytes written", w->f.path,
                        w->t[i].name, (unsigned long long)w->written[i],
                        (unsigned long long)w->t[i].nbytes);
    if (rc == SH_OK) {
        rc = sh_atomic_commit(&w->f);
        w->f.fd = -1;
    }
    ckpt_writer_abort(w);
    return rc;
}

static int ckpt__cmp_ptr_name(const void *a, const void *b)
{
    return strcmp((*(const ckpt_tensor *const *)a)->name, (*(const ckpt_tensor *const *)b)->name);
}

int ckpt_save(const char *path, const ckpt_tensor *t, size_t n, const json_t *metadata)
{
    ckpt_writer *w;
    SH_TRY(ckpt_writer_open(path, t, n, metadata, 0, &w));
    /* The writer holds the tensors in file order; each one's bytes are
     * found by name in a sorted index of the caller's (a scan per tensor
     * took 50 s for a MoE's 60,000 tensors). */
    const ckpt_tensor **by = malloc((n + 1) * sizeof *by);
    int rc = by ? SH_OK : sh_err(SH_ENOMEM, "%s: out of memory", path);
    for (size_t k = 0; by && k < n; k++) by[k] = &t[k];
    if (by) qsort(by, n, sizeof *by, ckpt__cmp_ptr_name);
    for (size_t i = 0; rc == SH_OK && i < w->n; i++) {
        const ckpt_tensor key = {.name = w->t[i].name}, *kp = &key;
        const ckpt_tensor **hit = bsearch(&kp, by, n, sizeof *by, ckpt__cmp_ptr_name);
        rc = hit ? ckpt_writer_put(w, i, 0, (*hit)->data, w->t[i].nbytes)
                 : sh_err(SH_EINTERNAL, "%s: tensor \"%s\" lost", path, w->t[i].name);
    }
    free(by);
    if (rc < 0) {
        ckpt_writer_abort(w);
        return rc;
    }
    return ckpt_writer_commit(w);
}
