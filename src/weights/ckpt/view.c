/* A sharded folder seen as the one .safetensors file that holds the same
 * tensors: the store keeps every version as one file, so a folder is
 * published as its consolidation without writing that file anywhere but the
 * store.  The view builds the file's header (tensors in the folder's order,
 * laid end to end, the first shard's __metadata__) and points every tensor
 * at its bytes in the folder's mappings. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "weights/ckpt/ckpt_int.h"

int ckpt_single_view(const ckpt *src, ckpt **out)
{
    *out = NULL;
    ckpt_tensor *t = calloc(src->ntensors + 1, sizeof *t);
    if (!t) return sh_err(SH_ENOMEM, "out of memory");
    uint64_t off = 0;
    for (size_t i = 0; i < src->ntensors; i++) {
        t[i] = src->tensors[i];
        t[i].offset = off;
        off += t[i].nbytes;
    }
    sh_buf h = {0};
    int rc = ckpt_header_build(t, src->ntensors, src->metadata, &h);
    ckpt *c = calloc(1, sizeof *c);
    void *map = MAP_FAILED;
    if (rc == SH_OK && !c) rc = sh_err(SH_ENOMEM, "out of memory");
    if (rc == SH_OK) {
        /* The header lives in its own mapping so that ckpt_close frees it. */
        map = mmap(NULL, h.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED) rc = sh_err(SH_ENOMEM, "out of memory");
        else memcpy(map, h.data, h.len);
    }
    if (rc == SH_OK) {
        c->files = calloc(1, sizeof *c->files);
        c->tensors = t;
        c->by_name = malloc((src->ntensors + 1) * sizeof *c->by_name);
        c->path = strdup(src->path);
        if (c->files) c->files[0] = (ckpt_file){.name = strdup("model.safetensors"),
                                                .path = strdup(src->path), .map = map,
                                                .size = h.len, .header_len = h.len,
                                                .count = src->ntensors, .owns_map = 1};
        c->nfiles = c->files ? 1 : 0;
        t = NULL;
        c->ntensors = src->ntensors;
        for (size_t i = 0; i < c->ntensors; i++) c->tensors[i].name = NULL;
        for (size_t i = 0; i < c->ntensors; i++) {
            ckpt_tensor *x = &c->tensors[i];
            x->name = strdup(src->tensors[i].name);
            x->file = 0;
            x->offset += h.len;
            if (!x->name) rc = sh_err(SH_ENOMEM, "out of memory");
        }
        if (!c->files || !c->by_name || !c->path || !c->files[0].name || !c->files[0].path)
            rc = sh_err(SH_ENOMEM, "out of memory");
        else memcpy(c->by_name, src->by_name, src->ntensors * sizeof *c->by_name);
        c->metadata = src->metadata ? json_incref(src->metadata) : NULL;
    }
    free(t);
    if (rc < 0 && c && !c->nfiles && map != MAP_FAILED) munmap(map, h.len);
    sh_buf_free(&h);
    if (rc < 0) {
        ckpt_close(c);
        return rc;
    }
    *out = c;
    return SH_OK;
}

uint64_t ckpt_single_size(const ckpt *c)
{
    return c->files[0].header_len + ckpt_data_bytes(c);
}
