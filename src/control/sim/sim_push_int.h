/* shoal sim push: a discrete-event model of a push tree (include/shoal/
 * bcast.h) at sizes one machine cannot run: N replicas in Z zones, every
 * chunk of one payload followed from the root down the tree.  No processes,
 * no sockets, no clock: pure.  docs/push-scale.md says what it assumes,
 * how it was checked against `shoal bench push`, and what it predicts.
 *
 * The tree is the one bcast builds: the root in zone 0; the first replica
 * of each zone is its relay (attached to the root: one copy crosses into
 * each zone); the zone's other replicas hang under it `fanout` per node,
 * breadth first.  With fabric_size M > 0 a zone's replicas are grouped in
 * fabrics of M: the relay feeds one relay per fabric (zone links) and each
 * fabric relay its members (fabric links).
 *
 * A node sends chunks to its children round-robin, a chunk as soon as it
 * has it (store and forward per chunk, as bcast does), at most `window`
 * unacknowledged chunks per child.  A send occupies the sender's NIC for
 * chunk / nic_gbps and the link to the child for chunk / link gbps; the
 * chunk arrives one latency after the link is done with it and is
 * acknowledged one latency later.  Each hop adds chunk_overhead_s (the
 * receiver's verify and the sender's post) per chunk. */
#ifndef SHOAL_SIM_PUSH_H
#define SHOAL_SIM_PUSH_H

#include <stdint.h>

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

typedef struct sim_push_link {
    double gbps;      /* > 0 */
    double latency_s; /* one way, >= 0 */
} sim_push_link;

typedef struct sim_push_config {
    int replicas;            /* N >= 1 */
    int zones;               /* Z, 1..N */
    int fanout;              /* children per node inside a zone (default 2) */
    int fabric_size;         /* 0: no fabric level */
    uint64_t payload;        /* bytes to deliver */
    uint64_t chunk;          /* 0: sim_push_chunk_auto() for the tree's depth */
    int window;              /* chunks in flight per child (default 4, bcast's) */
    double nic_gbps;         /* every node's egress (default: the fastest link) */
    sim_push_link fabric, zone, cross;
    double chunk_overhead_s; /* per chunk and hop (default 20 us) */
    double apply_s;          /* after the last chunk, per replica (default 0) */
} sim_push_config;

typedef struct sim_push_result {
    double converge_s;   /* the last replica holds the payload (+ apply_s) */
    double first_s;      /* the first replica does */
    int depth;           /* hops from the root to the deepest replica */
    uint64_t chunk, nchunks;
    uint64_t cross_zone_copies; /* payload copies that crossed a zone */
} sim_push_result;

/* The chunk that minimises the pipelined time (S / c + d) (c / B + h) of a
 * payload S through d hops at B bytes/s with h seconds per chunk: sqrt(S h B
 * / d), rounded to 4 KiB, between 16 KiB and 64 MiB, and small enough that
 * the payload is cut into at least 32 chunks when it is 2 MiB or more.  Pure. */
uint64_t sim_push_chunk_auto(uint64_t payload, int depth, double gbps, double overhead_s);

/* Runs the model.  SH_EINVAL (with a message naming the field) on a bad
 * configuration; SH_ENOMEM. */
int sim_push_run(const sim_push_config *c, sim_push_result *out);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
