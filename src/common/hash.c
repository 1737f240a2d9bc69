/* xxh3 wrappers: shoal names integrity hashes sh_hash128 everywhere. */
#include "shoal/common.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct sh_hasher {
    XXH3_state_t *st;
};

sh_hash128 sh_hash128_of(const void *data, size_t len)
{
    XXH128_hash_t h = XXH3_128bits(data, len);
    return (sh_hash128){h.low64, h.high64};
}

uint64_t sh_hash64_of(const void *data, size_t len) { return XXH3_64bits(data, len); }

sh_hasher *sh_hasher_new(void)
{
    sh_hasher *h = malloc(sizeof *h);
    if (!h) return NULL;
    h->st = XXH3_createState();
    if (!h->st) {
        free(h);
        return NULL;
    }
    XXH3_128bits_reset(h->st);
    return h;
}

void sh_hasher_update(sh_hasher *h, const void *data, size_t len)
{
    XXH3_128bits_update(h->st, data, len);
}

sh_hash128 sh_hasher_digest(const sh_hasher *h)
{
    XXH128_hash_t d = XXH3_128bits_digest(h->st);
    return (sh_hash128){d.low64, d.high64};
}

void sh_hasher_reset(sh_hasher *h) { XXH3_128bits_reset(h->st); }

void sh_hasher_free(sh_hasher *h)
{
    if (!h) return;
    XXH3_freeState(h->st);
    free(h);
}

int sh_hash128_eq(sh_hash128 a, sh_hash128 b) { return a.lo == b.lo && a.hi == b.hi; }

void sh_hash128_hex(sh_hash128 h, char out[33])
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
}

static int sh__hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int sh_hash128_parse(const char *hex, sh_hash128 *out)
{
    if (!hex || strlen(hex) != 32)
        return sh_err(SH_EFORMAT, "hash \"%.40s\": expected 32 hex digits", hex ? hex : "");
    uint64_t w[2] = {0, 0};
    for (int i = 0; i < 32; i++) {
        int v = sh__hexval(hex[i]);
        if (v < 0) return sh_err(SH_EFORMAT, "hash \"%s\": '%c' is not a hex digit", hex, hex[i]);
        w[i / 16] = (w[i / 16] << 4) | (uint64_t)v;
    }
    out->hi = w[0];
    out->lo = w[1];
    return SH_OK;
}

int sh_run_secret(sh_hash128 *out)
{
    const char *v = getenv("SHOAL_RUN_SECRET");
    *out = (sh_hash128){0, 0};
    if (!v || !*v) return 0;
    if (strlen(v) != 32 || sh_hash128_parse(v, out) < 0) {
        *out = (sh_hash128){0, 0};
        return sh_err(SH_EFORMAT, "SHOAL_RUN_SECRET must be 32 hex digits (e.g. from `od -An -tx1 -N16 "
                                  "/dev/urandom | tr -d ' \\n'`), not %zu characters", strlen(v));
    }
    return 1;
}

int sh_secret_eq(sh_hash128 a, sh_hash128 b)
{
    volatile uint64_t d = (a.lo ^ b.lo) | (a.hi ^ b.hi);
    return d == 0;
}
