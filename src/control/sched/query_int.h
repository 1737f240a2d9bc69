/* Queries (info.c: jobs, nodes, statistics; why.c: wait reasons and
 * start estimates; check.c: invariants).  The top layer; sched.c (sched_new,
 * sched_free) puts the layers together. */
#ifndef SHOAL_SCHED_QUERY_INT_H
#define SHOAL_SCHED_QUERY_INT_H

#include "cycle_int.h"

/* why.c: the wait reason and (est = 1) the start estimate of queued job
 * ji; with est = 0, est_start_s is NAN. */
void sched__pending(sched *s, uint32_t ji, double now, sched_job_info *o, int est);


#endif
