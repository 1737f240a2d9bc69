/* shoal mainjob, ring/: a ring all-reduce over UCX between the ranks of the
 * trainer gang (also what `shoal bench push` measures against): each rank
 * listens and connects to the next one; gradients are averaged with a
 * reduce-scatter and an all-gather, N - 1 steps each, tag-matched so that
 * messages of different steps never mix.  I/O edge: UCX, files. */
#ifndef SHOAL_MJ_RING_INT_H
#define SHOAL_MJ_RING_INT_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

typedef struct mj_ring mj_ring;

/* Joins a ring of `world` ranks on `host`: with rdv_dir NULL on the ports
 * base_port .. base_port + world - 1; otherwise each rank listens on an
 * ephemeral port and announces it in rdv_dir/rank-<r> (a folder every rank
 * sees, fresh for each attempt), which is robust to ports taken by others.
 * Waits up to timeout_s for the neighbours.  The caller owns *out
 * (mj_ring_free).  world = 1 needs no UCX at all. */
int mj_ring_new(int rank, int world, const char *host, int base_port, const char *rdv_dir,
                double timeout_s, mj_ring **out);
void mj_ring_free(mj_ring *r);
/* Sums x (n floats) over all ranks in place, then divides by world (the
 * mean).  Every rank must call it with the same n, in the same order. */
int mj_ring_allreduce_mean(mj_ring *r, float *x, size_t n);
/* Rank `root`'s buffer to every rank: the root passes its bytes in *buf;
 * others get a malloc'd copy in *buf (caller frees) and its length in *len. */
int mj_ring_bcast(mj_ring *r, int root, void **buf, size_t *len);
/* Bytes this rank sent over the ring so far. */
uint64_t mj_ring_bytes_sent(const mj_ring *r);


#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
