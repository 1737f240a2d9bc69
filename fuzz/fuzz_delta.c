/* libFuzzer target: the delta decoder (container, manifest, headers, chunk
 * streams) applied to a fixed base, fuzz/data/delta_base.safetensors.  The
 * trailer checksum is skipped so that mutations reach the decoders.  Any
 * input must apply exactly or fail with a message; never crash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/delta.h"

static ckpt *base;
static uint8_t *out, *img;
#define OUT_CAP (64u << 20)

static void fuzz_init(void)
{
    const char *p = getenv("FUZZ_DELTA_BASE");
    if (ckpt_open(p ? p : "fuzz/data/delta_base.safetensors", &base) < 0) {
        fprintf(stderr, "fuzz_delta: %s (run from the repository root)\n", sh_errmsg());
        abort();
    }
    out = malloc(OUT_CAP);
    img = malloc(base->files[0].size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!base) fuzz_init();
    delta *d;
    if (delta_parse(data, size, DELTA_NO_CHECKSUM, &d) < 0) {
        if (!sh_errmsg()[0]) abort();
        return 0;
    }
    size_t len;
    if (delta_target_size(d) <= OUT_CAP &&
        delta_apply_mem(base, d, &(delta_opts){.threads = 1}, out, OUT_CAP, &len) < 0 &&
        !sh_errmsg()[0])
        abort();
    /* In place: the image ends as the target or exactly as it was. */
    const ckpt_file *f = &base->files[0];
    memcpy(img, f->map, f->size);
    int rc = delta_apply_mem_inplace(img, f->size, d, &(delta_opts){.threads = 1});
    if (rc < 0 && memcmp(img, f->map, f->size)) abort();
    delta_free(d);
    return 0;
}
