/* The baseline every size figure is measured against: the XOR of the
 * target's tensor bytes with the same-named base tensor's (its own bytes
 * when the base has none of that size), as one stream in target order,
 * compressed with zstd level 1 in 8 MiB blocks, plus a 16-byte hash.  Pure:
 * memory in, a byte count out.  Blocks compress on the pool's threads. */
#include <stdlib.h>
#include <string.h>

#include "weights/delta/delta_int.h"

#define DELTA__XOR_BLOCK (8u << 20)

typedef struct {
    const ckpt *b, *t;
    uint64_t total;
    uint64_t *zbytes; /* per block */
} delta__xor;

/* XORs stream bytes [off, off + n) into x. */
static void delta__xor_fill(const delta__xor *j, uint64_t off, uint8_t *x, size_t n)
{
    uint64_t pos = 0;
    size_t done = 0;
    for (size_t i = 0; i < j->t->ntensors && done < n; i++) {
        const ckpt_tensor *t = &j->t->tensors[i];
        if (off + done >= pos + t->nbytes) {
            pos += t->nbytes;
            continue;
        }
        uint64_t in = off + done - pos;
        size_t k = t->nbytes - in < n - done ? (size_t)(t->nbytes - in) : n - done;
        const ckpt_tensor *b = ckpt_find(j->b, t->name);
        if (b && b->nbytes == t->nbytes)
            for (size_t q = 0; q < k; q++) x[done + q] = t->data[in + q] ^ b->data[in + q];
        else
            memcpy(x + done, t->data + in, k);
        done += k;
        pos += t->nbytes;
    }
}

static int delta__xor_block(void *arg, size_t i, delta__scratch *s)
{
    (void)s;
    delta__xor *j = arg;
    uint64_t off = (uint64_t)i * DELTA__XOR_BLOCK;
    size_t n = j->total - off < DELTA__XOR_BLOCK ? (size_t)(j->total - off) : DELTA__XOR_BLOCK;
    size_t cap = ZSTD_compressBound(DELTA__XOR_BLOCK);
    /* The scratch's buffers are 2 MiB; a block needs its own. */
    uint8_t *x = malloc(DELTA__XOR_BLOCK), *z = malloc(cap);
    ZSTD_CCtx *zc = ZSTD_createCCtx();
    int rc = x && z && zc ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
    if (rc == SH_OK) {
        delta__xor_fill(j, off, x, n);
        size_t r = ZSTD_compressCCtx(zc, z, cap, x, n, 1);
        if (ZSTD_isError(r)) rc = sh_err(SH_EINTERNAL, "zstd: %s", ZSTD_getErrorName(r));
        else j->zbytes[i] = r;
    }
    ZSTD_freeCCtx(zc);
    free(x), free(z);
    return rc;
}

int delta_baseline_xor_zstd(const ckpt *base, const ckpt *target, int threads, uint64_t *bytes)
{
    delta__xor j = {.b = base, .t = target, .total = ckpt_data_bytes(target)};
    size_t nb = (size_t)((j.total + DELTA__XOR_BLOCK - 1) / DELTA__XOR_BLOCK);
    j.zbytes = calloc(nb + 1, sizeof *j.zbytes);
    if (!j.zbytes) return sh_err(SH_ENOMEM, "out of memory");
    int rc = delta__parallel(threads, nb, delta__xor_block, &j);
    *bytes = 16;
    for (size_t i = 0; i < nb; i++) *bytes += j.zbytes[i];
    free(j.zbytes);
    return rc;
}
