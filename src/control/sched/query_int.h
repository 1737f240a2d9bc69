/* Queries (info.c: jobs, nodes, statistics; why.c: wait reasons and
 * start estimates; check.c: invariants).  The top layer; sched.c (sched_new,
 * sched_free) puts the layers together. */
#ifndef SHOAL_SCHED_QUERY_INT_H
#define SHOAL_SCHED_QUERY_INT_H

#include "cycle_int.h"

/* The start plan of the queued jobs (why.c, sched.plan), valid while its
 * key matches the state it was made from. */
struct splan {
    uint64_t stamp, busy_ver, id;
    double now;
    int nodes_up, gpus_up;
    double *slot;      /* per node, MAXG GPU free times, ascending */
    size_t capslot;
    struct sphole { double from, to; int gpus; } *hole; /* per node: GPUs idle before a planned start */
    size_t caphole;
    double *est;       /* by job index, where mark == id */
    uint64_t *mark;
    size_t capest, capmark;
    uint32_t *order;   /* queued jobs in the policy's order */
    size_t caporder, norder;
    uint64_t order_id; /* mark of jobs in order, not planned yet */
    int built;
    struct splt { double t; uint32_t ni; } *tn;
    size_t captn;
};
int sched__query_new(sched *s);
void sched__query_free(sched *s);
/* why.c: the wait reason and (est = 1) the start estimate of queued job
 * ji; with est = 0, est_start_s is NAN. */
void sched__pending(sched *s, uint32_t ji, double now, sched_job_info *o, int est);


#endif
