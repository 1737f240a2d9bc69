/* libFuzzer target: the safetensors header parser and validator.
 * Any input must either open (and then every tensor lies inside the image)
 * or fail with a message; never crash, never read out of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ckpt *c = NULL;
    if (ckpt_open_mem(data, size, "fuzz.safetensors", &c) < 0) {
        if (!sh_errmsg()[0]) abort(); /* every failure explains itself */
        return 0;
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < c->ntensors; i++) {
        const ckpt_tensor *t = &c->tensors[i];
        if (t->offset + t->nbytes > size || t->data != data + t->offset) abort();
        if (t->nbytes) sum += t->data[0] + t->data[t->nbytes - 1];
        if (ckpt_find(c, t->name) != t) abort();
    }
    sh_hash128 d;
    ckpt_digest(c, 1, &d, NULL);
    ckpt_close(c);
    return (int)(sum & 0);
}
