/* The delta container and manifest (docs/delta-format.md): writing, and
 * parsing with every check that does not need the base. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "weights/delta/delta_int.h"

#define DELTA__MAGIC "SHOALDLT"
#define DELTA__MAX_MANIFEST (256ull << 20)

json_t *delta__hex(sh_hash128 h)
{
    char hex[33];
    sh_hash128_hex(h, hex);
    return json_string(hex);
}

json_t *delta__blob(sh_buf *payload, const void *data, size_t len)
{
    size_t cap = ZSTD_compressBound(len);
    if (sh_buf_reserve(payload, cap) < 0) return NULL;
    size_t z = ZSTD_compress(payload->data + payload->len, cap, data, len, 3);
    if (ZSTD_isError(z)) return NULL;
    json_t *j = json_pack("[I,I]", (json_int_t)payload->len, (json_int_t)z);
    payload->len += z;
    return j;
}

static void delta__put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int delta__write_container(const json_t *manifest, const delta__seg *seg, size_t nseg,
                           sh_buf *out)
{
    char *m = json_dumps(manifest, JSON_COMPACT);
    if (!m) return sh_err(SH_ENOMEM, "cannot serialise the delta manifest");
    size_t ml = strlen(m), plen = 0;
    for (size_t i = 0; i < nseg; i++) plen += seg[i].len;
    uint8_t head[24];
    memcpy(head, DELTA__MAGIC, 8);
    head[8] = DELTA_VERSION, head[9] = head[10] = head[11] = 0;
    memset(head + 12, 0, 4);
    delta__put_u64(head + 16, ml);
    sh_buf b = {0};
    int rc = sh_buf_reserve(&b, 24 + ml + plen + 16 + 1);
    if (rc == SH_OK) {
        sh_buf_append(&b, head, 24);
        sh_buf_append(&b, m, ml);
        for (size_t i = 0; i < nseg; i++) sh_buf_append(&b, seg[i].p, seg[i].len);
        sh_hash128 h = sh_hash128_of(b.data, b.len);
        ckpt_digest_write(&b, h);
        *out = b;
    }
    free(m);
    return rc;
}

int delta__write_container_fd(const json_t *manifest, const delta__seg *seg, size_t nseg, int fd,
                              const char *name, uint64_t *len)
{
    char *m = json_dumps(manifest, JSON_COMPACT);
    if (!m) return sh_err(SH_ENOMEM, "cannot serialise the delta manifest");
    size_t ml = strlen(m);
    uint8_t head[24];
    memcpy(head, DELTA__MAGIC, 8);
    head[8] = DELTA_VERSION, head[9] = head[10] = head[11] = 0;
    memset(head + 12, 0, 4);
    delta__put_u64(head + 16, ml);
    sh_hasher *h = sh_hasher_new();
    int rc = h ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
    uint64_t total = 0;
    const delta__seg parts[2] = {{head, 24}, {m, ml}};
    for (size_t i = 0; rc == SH_OK && i < 2 + nseg; i++) {
        const delta__seg *g = i < 2 ? &parts[i] : &seg[i - 2];
        sh_hasher_update(h, g->p, g->len);
        rc = sh_write_all(fd, g->p, g->len, name);
        total += g->len;
    }
    if (rc == SH_OK) {
        sh_buf t = {0};
        ckpt_digest_write(&t, sh_hasher_digest(h));
        rc = t.data ? sh_write_all(fd, t.data, t.len, name) : sh_err(SH_ENOMEM, "out of memory");
        sh_buf_free(&t);
        total += 16;
    }
    sh_hasher_free(h);
    free(m);
    if (rc == SH_OK) *len = total;
    return rc;
}

void delta_free(delta *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->nfiles; i++) {
        free(d->files[i].header);
        ckpt_tensors_free(d->files[i].t, d->files[i].nt);
    }
    for (size_t i = 0; i < d->ntensors; i++) free(d->tensors[i].chunks);
    free(d->files);
    free(d->tensors);
    free(d->index);
    json_decref(d->manifest);
    free(d);
}

static int delta__get_hash(const json_t *o, const char *key, const char *ctx, sh_hash128 *h)
{
    const char *s;
    SH_TRY(sh_json_get_str(o, key, 1, ctx, &s));
    if (sh_hash128_parse(s, h) < 0)
        return sh_err(SH_EFORMAT, "%s: \"%s\" is not a 32-digit hex digest", ctx, key);
    return SH_OK;
}

/* [offset, length] inside the payload. */
static int delta__get_range(const delta *d, const json_t *a, const char *ctx, uint64_t *off,
                            uint64_t *len)
{
    if (!json_is_array(a) || json_array_size(a) != 2 || !json_is_integer(json_array_get(a, 0)) ||
        !json_is_integer(json_array_get(a, 1)))
        return sh_err(SH_EFORMAT, "%s: expected [offset, length]", ctx);
    json_int_t o = json_integer_value(json_array_get(a, 0)), l = json_integer_value(json_array_get(a, 1));
    if (o < 0 || l < 0 || (uint64_t)o > d->payload_len || (uint64_t)l > d->payload_len - (uint64_t)o)
        return sh_err(SH_EFORMAT, "%s: [%lld, %lld] lies outside the %llu-byte payload", ctx,
                      (long long)o, (long long)l, (unsigned long long)d->payload_len);
    *off = (uint64_t)o, *len = (uint64_t)l;
    return SH_OK;
}

static int delta__get_blob(const delta *d, const json_t *a, const char *ctx, uint8_t **out,
                           size_t *out_len)
{
    uint64_t off, len;
    SH_TRY(delta__get_range(d, a, ctx, &off, &len));
    unsigned long long n = ZSTD_getFrameContentSize(d->payload + off, len);
    if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN || n > DELTA__MAX_BLOB)
        return sh_err(SH_EFORMAT, "%s: not a zstd frame of known size up to 100 MB", ctx);
    uint8_t *b = malloc(n ? n : 1);
    if (!b) return sh_err(SH_ENOMEM, "out of memory");
    size_t r = ZSTD_decompress(b, n, d->payload + off, len);
    if (ZSTD_isError(r) || r != n) {
        free(b);
        return sh_err(SH_EFORMAT, "%s: corrupt zstd frame", ctx);
    }
    *out = b, *out_len = n;
    return SH_OK;
}

static int delta__parse_chunks(const delta *d, const json_t *a, delta__tensor *t, const char *ctx)
{
    uint64_t want = (t->nbytes + CKPT_CHUNK - 1) / CKPT_CHUNK;
    if (!json_is_array(a) || json_array_size(a) != want)
        return sh_err(SH_EFORMAT, "%s: \"chunks\" must list %llu chunks", ctx,
                      (unsigned long long)want);
    t->nchunks = (size_t)want;
    t->chunks = calloc(want + 1, sizeof *t->chunks);
    if (!t->chunks) return sh_err(SH_ENOMEM, "out of memory");
    for (size_t i = 0; i < want; i++) {
        json_t *c = json_array_get(a, i);
        if (!json_is_array(c) || json_array_size(c) != 3 || !json_is_integer(json_array_get(c, 0)))
            return sh_err(SH_EFORMAT, "%s: chunk %zu must be [encoding, offset, length]", ctx, i);
        json_int_t enc = json_integer_value(json_array_get(c, 0));
        if (enc < 0 || enc > 4 || (!t->base && enc < DELTA__RAW))
            return sh_err(SH_EFORMAT, "%s: chunk %zu: encoding %lld not allowed here", ctx, i,
                          (long long)enc);
        t->chunks[i].enc = (int)enc;
        json_t *r = json_pack("[O,O]", json_array_get(c, 1), json_array_get(c, 2));
        int rc = delta__get_range(d, r, ctx, &t->chunks[i].off, &t->chunks[i].len);
        json_decref(r);
        SH_TRY(rc);
    }
    return SH_OK;
}

static int delta__parse_tensor(const delta *d, const json_t *j, size_t i, delta__tensor *t)
{
    static const char *const keys[] = {"name", "dtype", "nbytes", "base", "base_digest",
                                       "digest", "changed", "chunks", NULL};
    char ctx[160];
    snprintf(ctx, sizeof ctx, "delta manifest: tensors[%zu]", i);
    if (!json_is_object(j)) return sh_err(SH_EFORMAT, "%s: expected an object", ctx);
    SH_TRY(sh_json_check_keys(j, keys, ctx));
    const char *dt;
    int64_t nb, ch = 0;
    SH_TRY(sh_json_get_str(j, "name", 1, ctx, &t->name));
    SH_TRY(sh_json_get_str(j, "dtype", 1, ctx, &dt));
    SH_TRY(ckpt_dtype_parse(dt, &t->dtype, ctx));
    SH_TRY(sh_json_get_i64(j, "nbytes", 1, ctx, &nb));
    SH_TRY(sh_json_get_i64(j, "changed", 0, ctx, &ch));
    if (nb < 0 || ch < 0) return sh_err(SH_EFORMAT, "%s: negative size", ctx);
    t->nbytes = (uint64_t)nb, t->changed = (uint64_t)ch;
    json_t *b = json_object_get(j, "base");
    if (b && !json_is_null(b)) {
        if (!json_is_string(b)) return sh_err(SH_EFORMAT, "%s: \"base\" must be a name or null", ctx);
        t->base = json_string_value(b);
        SH_TRY(delta__get_hash(j, "base_digest", ctx, &t->base_digest));
    }
    SH_TRY(delta__get_hash(j, "digest", ctx, &t->digest));
    return delta__parse_chunks(d, json_object_get(j, "chunks"), t, ctx);
}

/* Each target header's tensors must be the manifest's, in order. */
static int delta__match_files(delta *d)
{
    size_t k = 0;
    for (size_t f = 0; f < d->nfiles; f++) {
        delta__file *df = &d->files[f];
        df->first = k;
        for (size_t i = 0; i < df->nt; i++, k++) {
            if (k >= d->ntensors)
                return sh_err(SH_EFORMAT, "delta manifest: file %s holds more tensors than listed",
                              df->name);
            delta__tensor *t = &d->tensors[k];
            if (strcmp(t->name, df->t[i].name) || t->dtype != df->t[i].dtype ||
                t->nbytes != df->t[i].nbytes)
                return sh_err(SH_EFORMAT, "delta manifest: tensors[%zu] (\"%s\") does not match "
                              "tensor %zu of %s's header (\"%s\")", k, t->name, i, df->name,
                              df->t[i].name);
            t->file = (uint32_t)f;
        }
    }
    if (k != d->ntensors)
        return sh_err(SH_EFORMAT, "delta manifest: %zu tensors listed, the headers hold %zu",
                      d->ntensors, k);
    return SH_OK;
}

static int delta__parse_files(delta *d, const json_t *files)
{
    if (!json_is_array(files) || json_array_size(files) < 1 ||
        (!d->target_sharded && json_array_size(files) != 1))
        return sh_err(SH_EFORMAT, "delta manifest: \"files\" must list the target's files");
    d->nfiles = json_array_size(files);
    d->files = calloc(d->nfiles, sizeof *d->files);
    if (!d->files) return sh_err(SH_ENOMEM, "out of memory");
    for (size_t f = 0; f < d->nfiles; f++) {
        json_t *o = json_array_get(files, f);
        delta__file *df = &d->files[f];
        char ctx[64];
        snprintf(ctx, sizeof ctx, "delta manifest: files[%zu]", f);
        SH_TRY(sh_json_get_str(o, "name", 1, ctx, &df->name));
        if (!*df->name || strchr(df->name, '/') || !strcmp(df->name, "..") || !strcmp(df->name, "."))
            return sh_err(SH_EFORMAT, "%s: file name \"%s\" is not a plain name", ctx, df->name);
        SH_TRY(delta__get_blob(d, json_object_get(o, "header"), ctx, &df->header, &df->header_len));
        SH_TRY(ckpt_parse_header_only(df->header, df->header_len, df->name, &df->t, &df->nt));
    }
    return SH_OK;
}

static int delta__parse_manifest(delta *d)
{
    const json_t *m = d->manifest;
    const char *fmt;
    int64_t ver, cb;
    const char *ctx = "delta manifest";
    SH_TRY(sh_json_get_str(m, "format", 1, ctx, &fmt));
    SH_TRY(sh_json_get_i64(m, "version", 1, ctx, &ver));
    SH_TRY(sh_json_get_i64(m, "chunk_bytes", 1, ctx, &cb));
    if (strcmp(fmt, "shoal-delta") || ver != DELTA_VERSION || cb != CKPT_CHUNK)
        return sh_err(SH_EFORMAT, "%s: format \"%s\" version %lld chunk %lld (this shoal reads "
                      "shoal-delta version 1 with 2 MiB chunks)", ctx, fmt, (long long)ver,
                      (long long)cb);
    json_t *base = json_object_get(m, "base"), *target = json_object_get(m, "target");
    if (!json_is_object(base) || !json_is_object(target))
        return sh_err(SH_EFORMAT, "%s: missing \"base\" or \"target\"", ctx);
    SH_TRY(delta__get_hash(base, "digest", "delta manifest: base", &d->base_digest));
    SH_TRY(delta__get_hash(target, "digest", "delta manifest: target", &d->target_digest));
    SH_TRY(sh_json_get_bool(base, "sharded", 1, "delta manifest: base", &d->base_sharded));
    SH_TRY(sh_json_get_bool(target, "sharded", 1, "delta manifest: target", &d->target_sharded));
    if (d->target_sharded)
        SH_TRY(delta__get_blob(d, json_object_get(target, "index"), "delta manifest: target index",
                               &d->index, &d->index_len));
    SH_TRY(delta__parse_files(d, json_object_get(m, "files")));
    json_t *ts = json_object_get(m, "tensors");
    if (!json_is_array(ts)) return sh_err(SH_EFORMAT, "%s: missing \"tensors\" array", ctx);
    d->ntensors = json_array_size(ts);
    d->tensors = calloc(d->ntensors + 1, sizeof *d->tensors);
    if (!d->tensors) return sh_err(SH_ENOMEM, "out of memory");
    for (size_t i = 0; i < d->ntensors; i++)
        SH_TRY(delta__parse_tensor(d, json_array_get(ts, i), i, &d->tensors[i]));
    return delta__match_files(d);
}

int delta_parse(const void *buf, size_t len, int flags, delta **out)
{
    const uint8_t *b = buf;
    if (len < 40 || memcmp(b, DELTA__MAGIC, 8))
        return sh_err(SH_EFORMAT, "not a shoal delta (bad magic or shorter than 40 bytes)");
    uint32_t ver = b[8] | b[9] << 8 | (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
    uint32_t fl = b[12] | b[13] << 8 | (uint32_t)b[14] << 16 | (uint32_t)b[15] << 24;
    uint64_t m = 0;
    for (int i = 7; i >= 0; i--) m = m << 8 | b[16 + i];
    if (ver != DELTA_VERSION || fl != 0)
        return sh_err(SH_EFORMAT, "delta format version %u flags %u (this shoal reads version 1)",
                      ver, fl);
    if (m > DELTA__MAX_MANIFEST || m > len - 40)
        return sh_err(SH_EFORMAT, "delta manifest length %llu runs past the end of the %zu-byte "
                      "delta (truncated?)", (unsigned long long)m, len);
    if (!(flags & DELTA_NO_CHECKSUM)) {
        sh_hash128 h = sh_hash128_of(b, len - 16);
        sh_buf t = {0};
        ckpt_digest_write(&t, h);
        int ok = t.data && !memcmp(t.data, b + len - 16, 16);
        sh_buf_free(&t);
        if (!ok)
            return sh_err(SH_EMISMATCH, "delta checksum mismatch: the file is truncated or "
                          "corrupted (fetch it again)");
    }
    delta *d = calloc(1, sizeof *d);
    if (!d) return sh_err(SH_ENOMEM, "out of memory");
    d->buf = b, d->len = len;
    d->payload = b + 24 + m;
    d->payload_len = len - 24 - m - 16;
    int rc = sh_json_parse((const char *)b + 24, m, "delta manifest", &d->manifest);
    if (rc == SH_OK && !json_is_object(d->manifest))
        rc = sh_err(SH_EFORMAT, "delta manifest is not a JSON object");
    if (rc == SH_OK) rc = delta__parse_manifest(d);
    if (rc < 0) {
        delta_free(d);
        return rc;
    }
    *out = d;
    return SH_OK;
}

uint64_t delta_target_size(const delta *d)
{
    uint64_t s = 0;
    for (size_t f = 0; f < d->nfiles; f++) {
        s += d->files[f].header_len;
        for (size_t i = 0; i < d->files[f].nt; i++) s += d->files[f].t[i].nbytes;
    }
    return s;
}

int delta__map_file(const char *path, const uint8_t **buf, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "open %s", path);
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? sh_err_errno(errno, "stat %s", path) : SH_OK;
    if (rc == SH_OK && st.st_size < 40)
        rc = sh_err(SH_EFORMAT, "not a shoal delta: %lld bytes, shorter than the smallest "
                    "(40; truncated?)", (long long)st.st_size);
    void *p = MAP_FAILED;
    if (rc == SH_OK) {
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) rc = sh_err_errno(errno, "map %s", path);
    }
    close(fd);
    if (rc < 0) return rc;
    *buf = p, *len = (size_t)st.st_size;
    return SH_OK;
}

void delta__unmap_file(const uint8_t *buf, size_t len)
{
    if (buf) munmap((void *)buf, len);
}
