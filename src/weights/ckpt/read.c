/* Reading safetensors: strict header validation, single files by mmap, and
 * sharded folders described by model.safetensors.index.json.
 *
 * The rules (docs/safetensors.md): an 8-byte little-endian header length n
 * <= 100 MB; n bytes of UTF-8 JSON, an object whose keys are tensor names
 * (plus an optional "__metadata__" string map), each mapping to exactly
 * {"dtype", "shape", "data_offsets"}; offsets relative to the data buffer
 * that follows, which the tensors cover exactly, without gap or overlap, each
 * holding product(shape) x dtype size bytes. */
#include "weights/ckpt/ckpt_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void ckpt_tensors_free(ckpt_tensor *t, size_t n)
{
    if (!t) return;
    for (size_t i = 0; i < n; i++) free((char *)t[i].name);
    free(t);
}

static int ckpt__cmp_offset(const void *a, const void *b)
{
    const ckpt_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    /* Zero-sized tensors share offsets; order them by size then name so that
     * the order is total and a zero-sized one sorts first. */
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int ckpt__parse_shape(json_t *shape, const char *ctx, const char *name, ckpt_tensor *t)
{
    if (!json_is_array(shape))
        return sh_err(SH_EFORMAT, "%s: tensor \"%s\": \"shape\" must be an array of integers", ctx,
                      name);
    size_t nd = json_array_size(shape);
    if (nd > CKPT_MAX_DIMS)
        return sh_err(SH_EFORMAT, "%s: tensor \"%s\": %zu dimensions (at most %d supported)", ctx,
                      name, nd, CKPT_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t d = 0; d < nd; d++) {
        json_t *v = json_array_get(shape, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return sh_err(SH_EFORMAT, "%s: tensor \"%s\": shape[%zu] is not a non-negative integer",
                          ctx, name, d);
        t->shape[d] = json_integer_value(v);
        if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel)) overflow = 1;
    }
    uint64_t bits;
    if (overflow || __builtin_mul_overflow(numel, (uint64_t)ckpt_dtype_bits(t->dtype), &bits))
        return sh_err(SH_EFORMAT, "%s: tensor \"%s\": shape overflows 64 bits", ctx, name);
    if (bits % 8)
        return sh_err(SH_EFORMAT, "%s: tensor \"%s\": %llu elements of %s do not fill whole bytes",
                      ctx, name, (unsigned long long)numel, ckpt_dtype_name(t->dtype));
    t->numel = numel;
    t->nbytes = bits / 8;
    return SH_OK;
}

static int ckpt__parse_entry(const char *ctx, const char *name, json_t *v, ckpt_tensor *t)
{
    static const char *const keys[] = {"dtype", "shape", "data_offsets", NULL};
    char what[600];
    snprintf(what, sizeof what, "%s: tensor \"%s\"", ctx, name);
    if (!json_is_object(v)) return sh_err(SH_EFORMAT, "%s: expected an object", what);
    SH_TRY(sh_json_check_keys(v, keys, what));
    const char *dt;
    SH_TRY(sh_json_get_str(v, "dtype", 1, what, &dt));
    SH_TRY(ckpt_dtype_parse(dt, &t->dtype, what));
    SH_TRY(ckpt__parse_shape(json_object_get(v, "shape"), ctx, name, t));
    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        !json_is_integer(json_array_get(off, 0)) || !json_is_integer(json_array_get(off, 1)))
        return sh_err(SH_EFORMAT, "%s: \"data_offsets\" must be [begin, end] integers", what);
    json_int_t b = json_integer_value(json_array_get(off, 0));
    json_int_t e = json_integer_value(json_array_get(off, 1));
    if (b < 0 || e < b)
        return sh_err(SH_EFORMAT, "%s: data_offsets [%lld, %lld] are not 0 <= begin <= end", what,
                      (long long)b, (long long)e);
    if ((uint64_t)(e - b) != t->nbytes)
        return sh_err(SH_EFORMAT,
                      "%s: data_offsets [%lld, %lld] hold %llu bytes, but %s of shape with %llu "
                      "elements needs %llu",
                      what, (long long)b, (long long)e, (unsigned long long)(e - b), dt,
                      (unsigned long long)t->numel, (unsigned long long)t->nbytes);
    t->offset = (uint64_t)b;
    return SH_OK;
}

static int ckpt__check_metadata(json_t *m, const char *ctx)
{
    if (!json_is_object(m))
        return sh_err(SH_EFORMAT, "%s: \"__metadata__\" must be an object of strings", ctx);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) if (!json_is_string(v)) return sh_err(
        SH_EFORMAT, "%s: \"__metadata__\" value of \"%s\" is not a string", ctx, k);
    return SH_OK;
}

/* Checks that the tensors, sorted by offset, tile [0, data_len) exactly
 * (data_len UINT64_MAX: a header alone, whose end is whatever they cover). */
static int ckpt__check_tiling(const ckpt_tensor *t, size_t n, uint64_t data_len, const char *ctx)
{
    uint64_t end = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].offset != end) {
            if (t[i].offset > end)
                return sh_err(SH_EFORMAT, "%s: tensor \"%s\": gap of %llu bytes before its data "
                              "(data_offsets must be contiguous)", ctx, t[i].name,
                              (unsigned long long)(t[i].offset - end));
            return sh_err(SH_EFORMAT, "%s: tensor \"%s\": data overlaps the previous tensor's "
                          "(begins at %llu, previous ends at %llu)", ctx, t[i].name,
                          (unsigned long long)t[i].offset, (unsigned long long)end);
        }
        end = t[i].offset + t[i].nbytes;
    }
    if (data_len != UINT64_MAX && end != data_len)
        return sh_err(SH_EFORMAT, "%s: tensors cover %llu bytes of data, but the file holds %llu "
                      "after the header (truncated or padded file)", ctx,
                      (unsigned long long)end, (unsigned long long)data_len);
    return SH_OK;
}

static int ckpt__parse_json(const uint8_t *buf, uint64_t n, const char *ctx, ckpt_tensor **out,
                            size_t *count, json_t **metadata)
{
    json_t *root;
    if (n == 0 || buf[0] != '{')
        return sh_err(SH_EFORMAT, "%s: header does not start with '{'", ctx);
    SH_TRY(sh_json_parse((const char *)buf, n, ctx, &root));
    if (!json_is_object(root)) {
        json_decref(root);
        return sh_err(SH_EFORMAT, "%s: header is not a JSON object", ctx);
    }
    size_t cap = json_object_size(root);
    ckpt_tensor *t = calloc(cap ? cap : 1, sizeof *t);
    size_t nt = 0;
    int rc = t ? SH_OK : sh_err(SH_ENOMEM, "%s: out of memory", ctx);
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v)
    {
        if (rc < 0) break;
        if (!strcmp(k, "__metadata__")) {
            rc = ckpt__check_metadata(v, ctx);
            continue;
        }
        /* Tensor names reach terminals (inspect, every error naming a
         * tensor): a checkpoint from elsewhere must not write escape
         * sequences there.  Checked first, so no later message prints it. */
        long at = sh_control_at(k);
        if (at >= 0) {
            rc = sh_err(SH_EFORMAT, "%s: the name of tensor %zu holds a control character (byte 0x%02x "
                        "at offset %ld; \"%.*s...\" before it); tensor names must be printable",
                        ctx, nt, (unsigned char)k[at], at, (int)(at < 64 ? at : 64), k);
            break;
        }
        rc = ckpt__parse_entry(ctx, k, v, &t[nt]);
        if (rc == SH_OK && !(t[nt].name = strdup(k))) rc = sh_err(SH_ENOMEM, "out of memory");
        if (rc == SH_OK) nt++;
    }
    if (rc == SH_OK && metadata) {
        *metadata = json_object_get(root, "__metadata__");
        json_incref(*metadata);
    }
    json_decref(root);
    if (rc < 0) {
        ckpt_tensors_free(t, nt);
        return rc;
    }
    qsort(t, nt, sizeof *t, ckpt__cmp_offset);
    *out = t;
    *count = nt;
    return SH_OK;
}

int ckpt__parse_image(const uint8_t *buf, uint64_t len, int header_only, const char *ctx,
                      ckpt_tensor **out, size_t *n, json_t **metadata, uint64_t *hdr_len)
{
    if (metadata) *metadata = NULL;
    if (len < 8) return sh_err(SH_EFORMAT, "%s: %llu bytes is too short for a safetensors file "
                               "(needs an 8-byte header length)", ctx, (unsigned long long)len);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | buf[i];
    if (hn > CKPT_MAX_HEADER)
        return sh_err(SH_EFORMAT, "%s: header length %llu exceeds the 100 MB limit (not a "
                      "safetensors file?)", ctx, (unsigned long long)hn);
    if (hn > len - 8)
        return sh_err(SH_EFORMAT, "%s: header length %llu runs past the end of the %llu-byte file "
                      "(truncated?)", ctx, (unsigned long long)hn, (unsigned long long)len);
    ckpt_tensor *t = NULL;
    size_t nt = 0;
    json_t *meta = NULL;
    SH_TRY(ckpt__parse_json(buf + 8, hn, ctx, &t, &nt, &meta));
    if (header_only && hn != len - 8) {
        ckpt_tensors_free(t, nt);
        json_decref(meta);
        return sh_err(SH_EFORMAT, "%s: header image has %llu bytes after the JSON", ctx,
                      (unsigned long long)(len - 8 - hn));
    }
    int rc = ckpt__check_tiling(t, nt, header_only ? UINT64_MAX : len - 8 - hn, ctx);
    if (rc < 0) {
        ckpt_tensors_free(t, nt);
        json_decref(meta);
        return rc;
    }
    for (size_t i = 0; i < nt; i++) {
        t[i].offset += 8 + hn;
        t[i].data = header_only ? NULL : buf + t[i].offset;
    }
    *out = t;
    *n = nt;
    *hdr_len = 8 + hn;
    if (metadata) *metadata = meta;
    else json_decref(meta);
    return SH_OK;
}

int ckpt_parse_header(const uint8_t *buf, uint64_t len, const char *ctx, ckpt_tensor **out,
                      size_t *n, json_t **metadata, uint64_t *hdr_len)
{
    return ckpt__parse_image(buf, len, 0, ctx, out, n, metadata, hdr_len);
}

int ckpt_parse_header_only(const uint8_t *hdr, uint64_t len, const char *ctx, ckpt_tensor **out,
                           size_t *n)
{
    uint64_t hl;
    return ckpt__parse_image(hdr, len, 1, ctx, out, n, NULL, &hl);
}
