/* The cycle (cycle.c: sched_step and its passes; events.c: nodes and jobs
 * changing between steps; restore.c: jobs placed again after a restart).
 * Above room. */
#ifndef SHOAL_SCHED_CYCLE_INT_H
#define SHOAL_SCHED_CYCLE_INT_H

#include "room_int.h"

/* Stops a placed job and queues it again; a failure (failed = 1) sends a
 * gang to the head of its queue and counts a restart. */
int sched__requeue(sched *s, uint32_t ji, double now, int failed);
int sched__wait_add(sched *s, uint32_t ji);
/* Queued jobs in the policy's order (as sched_queue), up to cap indices;
 * returns how many were written. */
size_t sched__queue_order(sched *s, uint32_t *out, size_t cap);


#endif
