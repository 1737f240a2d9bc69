/* Internal helpers shared by the files of src/weights/ckpt (not public API). */
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

/* An approximately normal deviate (Irwin-Hall of four 16-bit uniforms). */
static inline float ckpt__normal(uint64_t *s)
{
    uint64_t r = ckpt__mix(s);
    uint32_t sum = (uint32_t)(r & 0xffff) + (uint32_t)(r >> 16 & 0xffff) +
                   (uint32_t)(r >> 32 & 0xffff) + (uint32_t)(r >> 48);
    return ((float)sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

/* The generator of one piece (chunk, block row) of one tensor, so that
 * every piece is reproducible on its own. */
static inline uint64_t ckpt__seed(uint64_t seed, uint64_t tensor, uint64_t chunk)
{
    uint64_t s = seed ^ 0x5ea1c0ffee;
    s = ckpt__mix(&s) ^ tensor * 0x9e3779b97f4a7c15ull;
    s = ckpt__mix(&s) ^ chunk * 0xc2b2ae3d27d4eb4full;
    return ckpt__mix(&s);
}

/* Half the distance from a bf16 value to its nearer neighbour: the fp32
 * master weight a trainer holds lies strictly inside the interval that
 * rounds to the stored value.  0 for the largest finite value, inf, NaN. */
float ckpt__half_gap_bf16(uint16_t h);
/* The same for an F8_E4M3 value (before its block scale). */
float ckpt__half_gap_e4m3(uint8_t q);

/* One AdamW update of `steps` steps on master weight w, with the moments
 * drawn from their steady state under unit-variance gradient noise (as
 * deep into training); draws from *s. */
float ckpt__adamw(float w, uint64_t *s, float lr, float wd, uint64_t steps);

#endif
