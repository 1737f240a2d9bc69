/* The run secret (SHOAL_RUN_SECRET), the proofs built on it and the one
 * handshake every link of a run uses (include/shoal/net.h).  Apart from
 * common's hashing so that programs which never speak to a run's peers (the
 * lean client) do not link the HMAC. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <nettle/hmac.h>

#include "shoal/net.h"

int net_run_secret(sh_hash128 *out)
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

int net_secret_eq(sh_hash128 a, sh_hash128 b)
{
    volatile uint64_t d = (a.lo ^ b.lo) | (a.hi ^ b.hi);
    return d == 0;
}

sh_hash128 net_secret_proof(sh_hash128 secret, const char *label, sh_hash128 nonce)
{
    uint8_t key[16], msg[16], mac[SHA256_DIGEST_SIZE];
    for (int i = 0; i < 8; i++) {
        key[i] = (uint8_t)(secret.lo >> (8 * i)), key[8 + i] = (uint8_t)(secret.hi >> (8 * i));
        msg[i] = (uint8_t)(nonce.lo >> (8 * i)), msg[8 + i] = (uint8_t)(nonce.hi >> (8 * i));
    }
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, sizeof key, key);
    hmac_sha256_update(&ctx, strlen(label) + 1, (const uint8_t *)label);
    hmac_sha256_update(&ctx, sizeof msg, msg);
    hmac_sha256_digest(&ctx, sizeof mac, mac);
    sh_hash128 out = {0, 0};
    for (int i = 0; i < 8; i++) out.lo |= (uint64_t)mac[i] << (8 * i), out.hi |= (uint64_t)mac[8 + i] << (8 * i);
    return out;
}

int net_nonce(sh_hash128 *out)
{
    uint64_t w[2];
    if (getrandom(w, sizeof w, 0) != (ssize_t)sizeof w) return sh_err_errno(errno, "getrandom");
    out->lo = w[0], out->hi = w[1];
    return SH_OK;
}

int net_hello_make(sh_hash128 secret, const char *child_label, const char *parent_label, net_hello *h)
{
    SH_TRY(net_nonce(&h->nonce));
    h->proof = net_secret_proof(secret, child_label, h->nonce);
    h->expect = net_secret_proof(secret, parent_label, h->nonce);
    return SH_OK;
}

int net_hello_check(sh_hash128 secret, const char *child_label, sh_hash128 nonce, sh_hash128 proof)
{
    return net_secret_eq(proof, net_secret_proof(secret, child_label, nonce));
}
