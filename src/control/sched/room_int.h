/* Room for blocked gangs (room.c): expected ends of running work,
 * reservations, and preemption of lower-priority elastic and function
 * work.  Above placement. */
#ifndef SHOAL_SCHED_ROOM_INT_H
#define SHOAL_SCHED_ROOM_INT_H

#include "place_int.h"

/* Lists running job ji (just started) by its expected end. */
int sched__due_add(sched *s, uint32_t ji);
/* Moves on the expected end of every running job past it at now
 * (sched_step, before any decision). */
int sched__overdue(sched *s, double now);

/* Reserves nodes for blocked gang ji (shoal and backfill); frees
 * room for it by preemption (shoal), returning 1 when room was made. */
int sched__make_reservation(sched *s, uint32_t ji, double now);
/* When node ni will have g GPUs free if running work ends at its estimates
 * (never before now); cached per node. */
double sched__node_ready(sched *s, uint32_t ni, int g, double now);
int sched__try_preempt(sched *s, sched_decisions *d, uint32_t ji, double now);
/* 1 when shoal turns down victims for gang j (job ji, or NONE for a
 * probe): it would start without them (its reservation time) before now +
 * preempt_wait x its run time; 0 when it may preempt; < 0 on error. */
int sched__preempt_declined(sched *s, const sjob *j, uint32_t ji, double now);
/* Whether a preemption search for gang j (a job or a probe with its shape
 * and priority) could succeed now. */
int sched__preempt_possible(sched *s, const sjob *j);
/* The same for a gang of shape `shape` at priority prio whose search found
 * no victims in any pool before, since when room appeared only in
 * pools[0 .. n) (pools it may use): a search elsewhere still fails, so
 * only these are searched, for the gang probe(s, arg) returns (called
 * only when n > 0). */
int sched__preempt_possible_in(sched *s, uint64_t shape, int prio, const sjob *(*probe)(sched *, void *),
                               void *arg, const uint32_t *pools, int n);
/* The fast search's first tests of pool p for a gang of n nodes x g GPUs
 * at priority prio: 0 when it cannot free room there (no victim below
 * prio, or more than max_victims nodes short of free ones). */
static inline int sched__pool_may_preempt(const sched *s, const spool *p, int n, int g, int prio)
{
    return p->maxg_ever[g] >= n && n - p->ge[g] <= s->cfg.max_victims && p->npre_nodes &&
           sched__prios_below(&p->pre, prio);
}


#endif
