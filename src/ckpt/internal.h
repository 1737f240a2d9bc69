/* Internal helpers shared by the files of src/ckpt (not public API). */
#ifndef SHOAL_CKPT_INTERNAL_H
#define SHOAL_CKPT_INTERNAL_H

#include "shoal/ckpt.h"

/* ckpt_parse_header(), or with header_only the image is exactly the 8-byte
 * length and the JSON, and the data buffer is whatever the tensors cover. */
int ckpt__parse_image(const uint8_t *buf, uint64_t len, int header_only, const char *ctx,
                      ckpt_tensor **out, size_t *n, json_t **metadata, uint64_t *hdr_len);

/* A fast, seedable generator (splitmix64) for the synthetic checkpoints. */
static inline uint64_t ckpt__mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
