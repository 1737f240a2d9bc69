/* Room for blocked gangs (room.c): expected ends of running work,
 * reservations, and preemption of lower-priority elastic and function
 * work.  Above placement. */
#ifndef SHOAL_SCHED_ROOM_INT_H
#define SHOAL_SCHED_ROOM_INT_H

#include "place_int.h"

/* A reservation made in the last step for a blocked head-of-line gang. */
typedef struct sresv {
    uint32_t job;
    double T;
    uint32_t *nodes;
    int n, need;
} sresv;


/* The state of reservations and preemption (sched.room). */
struct sroom {
    sresv *resv;
    size_t nresv, capresv;
    uint64_t resv_sig;      /* a hash of this cycle's reservations (job and nodes) */
    double resv_T[4], resv_slack[4]; /* T and T - now of the first four */
    /* Running jobs by expected end (a min-heap, one entry per start or
     * extension; an entry whose job ended, restarted or moved on since is
     * dropped when it comes up): sched__overdue finds the work that ran
     * past its estimate without a walk over every running job. */
    struct sdue {
        double t;
        uint32_t job;
    } *due;
    size_t ndue, capdue;
    uint32_t *deferred;   /* preempted in this step, queued again at its end */
    size_t ndeferred, capdeferred;
    /* Failed preemption searches of this cycle by (gang shape, priority):
     * valid while no GPU has been released since (release_epoch).  Only a
     * release can make a failed search succeed within a cycle: starts and
     * reservations only take room, and a started preemptible job adds no
     * more victim GPUs than the free GPUs it took. */
    struct spmemo {
        uint64_t shape, stamp, epoch;
        int prio;
        int ok; /* the search found room (kept for the sweeps' probes only) */
    } pmemo[256];
    /* The last reservation search's answer for each pool of its job
     * (room.c best_pool), kept while the job, the pools and its pool list
     * stand: the next search for the job looks again only at the pools
     * touched since. */
    struct sbpc {
        uint32_t job;
        double order;  /* the job's queue order (a slot may be reused) */
        int g, n;
        uint64_t pools_ver, gen; /* pools_ver + 1 and touch_gen + 1 when current */
        const uint32_t *jp;
        size_t njp;
        double *val;      /* per pool of the list: the raw time, or a lower bound of it */
        signed char *kind; /* 0: the pool cannot ever fit, 1: val is the time, 2: a lower bound */
        uint32_t *qpos;   /* by pool index: its place in the list, or NONE */
        size_t cap, capk, capq;
    } bpc;
    /* The searches' scratch, kept between cycles: one buffer per search,
     * since some run while another's is in use. */
    struct {
        struct tnode *tn_exact, *tn_best, *tn_resv; /* pool_exact, best_pool, make_reservation */
        size_t cap_exact, cap_best, cap_resv;
        struct pbound *pb; /* best_pool's bounds */
        size_t cappb;
        struct vnode *vn_best, *vn_in, *vn_try; /* best_victim_pool, preempt_possible_in, try_preempt */
        size_t cap_vbest, cap_vin, cap_vtry;
        struct sbpc bpc; /* pool_answers while reservations lean on its answers */
    } scr;
};
int sched__room_new(sched *s);
void sched__room_free(sched *s);
/* A new cycle: the reservations of the last one lapse. */
static inline void sched__room_begin(sched *s)
{
    s->room->nresv = 0, s->room->resv_sig = 0;
}
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
