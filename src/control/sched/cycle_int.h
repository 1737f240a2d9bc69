/* The cycle (cycle.c: sched_step and its passes; events.c: nodes and jobs
 * changing between steps; restore.c: jobs placed again after a restart).
 * Above room. */
#ifndef SHOAL_SCHED_CYCLE_INT_H
#define SHOAL_SCHED_CYCLE_INT_H

#include "room_int.h"

#define NJ_MAX 16 /* tenants next_job keeps in order (scycle.nj_ord) */

/* The cycle's state (sched.cyc). */
struct scycle {
    uint32_t *waiting;    /* HOLDING and REPLACING jobs: they have deadlines */
    size_t nwaiting, capwaiting;
    uint32_t *elastic; /* every elastic job, for the growth pass */
    size_t nelastic, capelastic;
    uint64_t markseq; /* scratch marks on nodes */
    double next_wake;
    uint64_t walk_id;
    /* next_job's tenants with a head, best head first (nj_n of them), kept
     * between calls of one walk while only the tenant it returned last
     * (nj_ord[0]) moved its cursor, by one (to nj_cursor + 1): most jobs a
     * walk visits do nothing, and comparing every tenant's head for each
     * cost a fifth of a shoal cycle.  nj_ok = 0 when not kept (cursors
     * reset, more than NJ_MAX tenants); nj_kver and nj_walk: the key
     * version and walk it was made for. */
    uint32_t nj_ord[NJ_MAX];
    size_t nj_n, nj_cursor;
    uint64_t nj_kver, nj_walk;
    int nj_ok;
    /* place_elastic's pool order by (types, speeds), kept until a node is
     * added (pools and prices change only then): elastic jobs share a few
     * type lists, and sorting every pool per placement showed in perf. */
    struct sporder {
        int ntypes;
        uint32_t types[SCHED_MAX_TYPES];
        double speed[SCHED_MAX_TYPES];
        uint64_t ver; /* pools_ver + 1 when current */
        uint32_t *pools;
        size_t n, cap;
    } porder[16];
    uint32_t porder_next; /* the entry to reuse next */
    /* The searches' scratch, kept between cycles. */
    struct {
        struct ppool *pp; /* place_elastic: pools by price */
        size_t cappp;
        /* the shape probes (a probe may hold a pool list, jp) */
        sjob probe_fit, probe_fit_in, probe_preempt, probe_gang, probe_declined;
    } scr;
};
int sched__cycle_new(sched *s);
void sched__cycle_free(sched *s);
/* Stops a placed job and queues it again; a failure (failed = 1) sends a
 * gang to the head of its queue and counts a restart. */
int sched__requeue(sched *s, uint32_t ji, double now, int failed);
int sched__wait_add(sched *s, uint32_t ji);
/* Queued jobs in the policy's order (as sched_queue), up to cap indices;
 * returns how many were written. */
size_t sched__queue_order(sched *s, uint32_t *out, size_t cap);


#endif
