/* delta inspect: a per-tensor summary of a delta file. */
#include <stdlib.h>

#include "weights/delta/delta_int.h"

int delta_inspect(const char *path, json_t **out)
{
    char *buf;
    size_t len;
    SH_TRY(sh_read_file(path, (size_t)1 << 40, &buf, &len));
    delta *d;
    int rc = delta_parse(buf, len, 0, &d);
    if (rc < 0) {
        free(buf);
        return sh_err_wrap(rc, "%s", path);
    }
    json_t *tensors = json_array();
    for (size_t i = 0; i < d->ntensors; i++) {
        const delta__tensor *t = &d->tensors[i];
        uint64_t bytes = 0, n[5] = {0};
        for (size_t k = 0; k < t->nchunks; k++) {
            bytes += t->chunks[k].len;
            n[t->chunks[k].enc]++;
        }
        json_t *enc = json_object();
        for (int e = 0; e < 5; e++)
            if (n[e]) json_object_set_new(enc, delta__enc_names[e], json_integer((json_int_t)n[e]));
        uint64_t units = t->nbytes / delta__unit(t->dtype);
        json_array_append_new(
            tensors, json_pack("{s:s,s:s,s:s,s:I,s:f,s:I,s:o}", "name", t->name, "mode",
                               t->base ? "diff" : "whole", "dtype", ckpt_dtype_name(t->dtype),
                               "nbytes", (json_int_t)t->nbytes, "changed_fraction",
                               units ? (double)t->changed / (double)units : 0.0, "bytes",
                               (json_int_t)bytes, "encodings", enc));
    }
    *out = json_pack("{s:i,s:o,s:o,s:I,s:b,s:o}", "version", DELTA_VERSION, "base_digest",
                     delta__hex(d->base_digest), "target_digest", delta__hex(d->target_digest),
                     "bytes", (json_int_t)len, "sharded", d->target_sharded, "tensors", tensors);
    delta_free(d);
    free(buf);
    return *out ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
}
