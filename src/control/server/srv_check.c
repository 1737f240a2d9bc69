/* Small pure checks the server's files share: token comparison and
 * hashing, idempotency keys, and the names of runs, services and work dirs.  They call nothing of the server,
 * so that any file may use them without joining a circle of calls. */
#include "srv_int.h"

#include <nettle/sha2.h>
#include <stdio.h>
#include <string.h>

/* Compares a presented token with a known one in time that depends only on
 * their lengths, so that response times do not leak a token's prefix. */
int srv__token_eq(const char *given, const char *known)
{
    if (!known) return 0;
    size_t a = strlen(given), b = strlen(known);
    unsigned char diff = a != b;
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)(given[i] ^ known[i % (b ? b : 1)]);
    return !diff;
}

int srv__run_name_ok(const char *n)
{
    size_t len = n ? strlen(n) : 0;
    return len >= 1 && len <= 63 &&
           strspn(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == len && n[0] != '.';
}

int srv__workdir_id_ok(const char *id)
{
    return id && strlen(id) == 32 && strspn(id, "0123456789abcdef") == 32;
}

/* Secrets at rest: the server keeps no token or node credential, only
 * "sha256:" and the SHA-256 of it in hex (SRV_HASH_LEN bytes with the NUL).
 * A token is 128 bits or more of randomness, so one unsalted hash of it
 * cannot be reversed, and the stored value is no credential itself: a
 * bearer token is hashed before it is compared. */
void srv__secret_hash(const char *secret, char out[SRV_HASH_LEN])
{
    struct sha256_ctx ctx;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&ctx);
    sha256_update(&ctx, strlen(secret), (const uint8_t *)secret);
    sha256_digest(&ctx, sizeof d, d);
    memcpy(out, "sha256:", 7);
    for (size_t i = 0; i < sizeof d; i++) snprintf(out + 7 + 2 * i, 3, "%02x", d[i]);
}

int srv__is_hash(const char *v)
{
    if (strncmp(v, "sha256:", 7) || strlen(v) != SRV_HASH_LEN - 1) return 0;
    for (const char *p = v + 7; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
    return 1;
}

int srv__idem_valid(const char *key)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++, n++)
        if (*p < 0x21 || *p > 0x7e) return 0;
    return n >= 1 && n <= 127;
}
