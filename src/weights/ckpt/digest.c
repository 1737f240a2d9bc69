/* Checkpoint digests: xxh3-128 trees over CKPT_CHUNK-byte chunks, so that
 * chunks hash in parallel and a delta can verify a tensor chunk by chunk. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* The library's runtime-dispatched xxh3 uses the widest vectors the CPU has
 * (the digests are the same whatever the width). */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#endif

#include "shoal/ckpt.h"

sh_hash128 ckpt_chunk_digest(const void *data, size_t len)
{
    XXH128_hash_t h = XXH3_128bits(data, len);
    return (sh_hash128){h.low64, h.high64};
}

static void ckpt__put_digest(uint8_t *p, sh_hash128 h)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(h.lo >> (8 * i));
        p[8 + i] = (uint8_t)(h.hi >> (8 * i));
    }
}

void ckpt_digest_write(sh_buf *b, sh_hash128 h)
{
    uint8_t p[16];
    ckpt__put_digest(p, h);
    sh_buf_append(b, p, 16);
}

sh_hash128 ckpt_combine_digests(const sh_hash128 *parts, size_t n)
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    for (size_t i = 0; i < n; i++) {
        uint8_t p[16];
        ckpt__put_digest(p, parts[i]);
        XXH3_128bits_update(&st, p, 16);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    return (sh_hash128){h.low64, h.high64};
}

sh_hash128 ckpt_tensor_digest(const void *data, uint64_t nbytes)
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    for (uint64_t off = 0; off < nbytes; off += CKPT_CHUNK) {
        uint64_t n = nbytes - off < CKPT_CHUNK ? nbytes - off : CKPT_CHUNK;
        uint8_t p[16];
        ckpt__put_digest(p, ckpt_chunk_digest((const uint8_t *)data + off, n));
        XXH3_128bits_update(&st, p, 16);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    return (sh_hash128){h.low64, h.high64};
}

/* Work list: every chunk of every tensor, hashed by a pool of threads. */
typedef struct {
    const ckpt *c;
    size_t *first;     /* first chunk of tensor i (ntensors + 1 entries) */
    sh_hash128 *chunks;
    size_t nchunks;
    size_t next;       /* claimed under lock */
    pthread_mutex_t mu;
} ckpt__dig_job;

static void *ckpt__dig_worker(void *arg)
{
    ckpt__dig_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        size_t k = j->next;
        j->next += 8;
        pthread_mutex_unlock(&j->mu);
        if (k >= j->nchunks) return NULL;
        size_t end = k + 8 < j->nchunks ? k + 8 : j->nchunks;
        /* Find the tensor of chunk k by binary search over first[]. */
        size_t lo = 0, hi = j->c->ntensors;
        while (hi - lo > 1) {
            size_t mid = (lo + hi) / 2;
            if (j->first[mid] <= k) lo = mid;
            else hi = mid;
        }
        for (size_t t = lo; k < end; k++) {
            while (j->first[t + 1] <= k) t++;
            const ckpt_tensor *ct = &j->c->tensors[t];
            uint64_t off = (uint64_t)(k - j->first[t]) * CKPT_CHUNK;
            uint64_t n = ct->nbytes - off < CKPT_CHUNK ? ct->nbytes - off : CKPT_CHUNK;
            j->chunks[k] = ckpt_chunk_digest(ct->data + off, n);
        }
    }
}

static int ckpt__threads(int threads)
{
    if (threads > 0) return threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int ckpt_digest(const ckpt *c, int threads, sh_hash128 *out, sh_hash128 *tensor_digests)
{
    ckpt__dig_job j = {.c = c};
    j.first = malloc((c->ntensors + 1) * sizeof *j.first);
    if (!j.first) return sh_err(SH_ENOMEM, "out of memory");
    for (size_t i = 0; i < c->ntensors; i++) {
        j.first[i] = j.nchunks;
        j.nchunks += (size_t)((c->tensors[i].nbytes + CKPT_CHUNK - 1) / CKPT_CHUNK);
    }
    j.first[c->ntensors] = j.nchunks;
    j.chunks = malloc((j.nchunks + 1) * sizeof *j.chunks);
    if (!j.chunks) {
        free(j.first);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&j.mu, NULL);
    int nt = ckpt__threads(threads);
    pthread_t tid[64];
    if (nt > 64) nt = 64;
    int started = 0;
    for (int i = 1; i < nt; i++)
        if (pthread_create(&tid[started], NULL, ckpt__dig_worker, &j) == 0) started++;
    ckpt__dig_worker(&j);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&j.mu);

    /* The parts, in order: index JSON, then per file its header and tensors. */
    sh_buf parts = {0};
    if (c->is_folder) ckpt_digest_write(&parts, sh_hash128_of(c->index_json, c->index_len));
    for (size_t f = 0; f < c->nfiles; f++) {
        const ckpt_file *cf = &c->files[f];
        ckpt_digest_write(&parts, sh_hash128_of(cf->map, cf->header_len));
        for (size_t i = cf->first; i < cf->first + cf->count; i++) {
            sh_hash128 d = ckpt_combine_digests(j.chunks + j.first[i], j.first[i + 1] - j.first[i]);
            if (tensor_digests) tensor_digests[i] = d;
            ckpt_digest_write(&parts, d);
        }
    }
    free(j.first);
    free(j.chunks);
    if (parts.len == 0 && c->nfiles + c->is_folder > 0) return sh_err(SH_ENOMEM, "out of memory");
    *out = sh_hash128_of(parts.data, parts.len);
    sh_buf_free(&parts);
    return SH_OK;
}
