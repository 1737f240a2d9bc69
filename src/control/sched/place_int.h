/* Placement (place.c): free-GPU buckets, holds and releases, the pools a
 * job may use, and picking the nodes of a gang.  Above the ledger. */
#ifndef SHOAL_SCHED_PLACE_INT_H
#define SHOAL_SCHED_PLACE_INT_H

#include "ledger_int.h"

#define RELEASED 16 /* distinct pools sched__released_since reports */

typedef struct stpools {
    uint32_t *v;
    size_t n, cap;
    int ge[MAXG + 1]; /* UP nodes of the type with at least g free GPUs */
    /* The most UP nodes with at least g free GPUs in any one pool of
     * the type (max_ge[g]), kept exact in O(1) per change by a count
     * of the type's pools at each value of their ge[g]
     * (ge_hist[g * hcap + v]): ge moves by one at a time, so when the
     * last pool at the maximum steps down, the new maximum is one
     * less.  Lets a gang that fits no pool of a type (or cannot get
     * within max_victims nodes of fitting) rule the type out at once. */
    int max_ge[MAXG + 1];
    int *ge_hist;
    size_t hcap; /* > any of the type's pools' node count */
} stpools;

/* Placement's state (sched.plc): the pool index and its caches. */
struct splacement {
    uint32_t *allpools;   /* 0..npools-1, for jobs that take any type */
    uint64_t pools_ver;   /* bumped when a node is added */
    stpools *tpools;      /* pools of each GPU type, by name index */
    int ge_all[MAXG + 1]; /* UP nodes of any type with at least g free GPUs */
    size_t ntpools;
    struct { /* sched__released_since's last answer: probes ask it alike */
        uint64_t since, epoch;
        int n;
        uint32_t v[RELEASED];
    } rel;
};
int sched__place_new(sched *s);
void sched__place_free(sched *s);
/* The pool of zone z, fabric f and type t (interned names), made when new;
 * every call moves pools_ver (a node is being added).  NONE without memory. */
uint32_t sched__pool_of(sched *s, uint32_t z, uint32_t f, uint32_t t);
void sched__bucket_insert(sched *s, uint32_t ni);
void sched__bucket_remove(sched *s, uint32_t ni);
/* Node ni comes up (d = 1: into its free bucket) or goes down (d = -1:
 * out of it), counted in its pool's up_ge. */
void sched__node_updown(sched *s, uint32_t ni, int d);
int sched__hold(sched *s, uint32_t ji, uint32_t ni, int gpus, double now);
void sched__release_place(sched *s, uint32_t ji, int k, double now);
void sched__release_all(sched *s, uint32_t ji, double now);
int sched__pool_allowed(const sched *s, const sjob *j, uint32_t pi);
/* The pools a job may use, in its type order (owned by s or by the job,
 * valid until a node is added). */
size_t sched__job_pools(const sched *s, const sjob *j, const uint32_t **out);
/* The pools of one GPU type. */
size_t sched__type_pools(const sched *s, uint32_t type, const uint32_t **out);
/* Makes room in type t's ge histogram for pools of up to n nodes. */
int sched__type_hist_grow(sched *s, uint32_t t, size_t n);
/* Whether some pool of type t has at least n UP nodes with g free GPUs. */
static inline int sched__type_fits(const sched *s, uint32_t t, int n, int g)
{
    return t < s->plc->ntpools && g <= MAXG && s->plc->tpools[t].max_ge[g] >= n;
}
int sched__pool_fits(const spool *p, int n, int g);
int sched__never_fits(sched *s, const sjob *j, char *why, size_t cap);
typedef struct scand {
    uint32_t nodes[SCHED__MAX_GANG];
    int n;
} scand;
int sched__pick_gang(sched *s, const sjob *j, uint32_t pi, double est_end, scand *out);
/* Takes `gpus` GPUs on node ni (mask 0: the lowest free indices; else the
 * mask given, which must be free) for job ji since `since`. */
int sched__hold_at(sched *s, uint32_t ji, uint32_t ni, int gpus, uint64_t mask, double since, double now);
int sched__pick_pool(sched *s, const sjob *j, double now, int pack, scand *out, uint32_t *pool);
/* Adds delta GPUs at priority prio (entries are never removed). */
int sched__prios_add(sprios *a, int prio, int delta);
/* Preemptible GPUs held at priorities below prio. */
int sched__prios_below(const sprios *a, int prio);
/* The distinct pools of the releases after epoch `since` (*out, owned by
 * s, valid until the next call) and their count (at most RELEASED); -1
 * when they are not all known (too many, too long ago, or one that may
 * have touched any pool). */
int sched__released_since(sched *s, uint64_t since, const uint32_t **out);

#endif
