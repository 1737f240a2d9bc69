/* Tensor-table access for foreign callers, which cannot follow `ckpt`'s
 * fields safely but can read one ckpt_tensor (checked by its size). */
#include "shoal/ckpt.h"

size_t ckpt_count(const ckpt *c) { return c ? c->ntensors : 0; }

const ckpt_tensor *ckpt_tensor_at(const ckpt *c, size_t i)
{
    return c && i < c->ntensors ? &c->tensors[i] : NULL;
}

size_t ckpt_tensor_sizeof(void) { return sizeof(ckpt_tensor); }
