/* The model: the scheduling core's state and its bottom layer
 * (src/control/sched only; docs/architecture.md lists the layers: each
 * file calls only its own layer and the ones below, and includes only
 * their headers).
 *
 * Everything is an index into a growable array: nodes, jobs, pools, tenants
 * and interned names never move once created, so an index is a stable
 * handle.  NONE marks "no index". */
#ifndef SHOAL_SCHED_MODEL_INT_H
#define SHOAL_SCHED_MODEL_INT_H

#include "shoal/common.h"
#include "shoal/sched.h"

struct sledger;
struct splacement;
struct sroom;
struct scycle;
struct splan;

#define NONE UINT32_MAX
#define MAXG SCHED_MAX_NODE_GPUS
#define SCHED__MAX_GANG 4096 /* nodes in one gang */
#define RC_SLOTS 8 /* reservation times cached per pool, by gang shape */
#define RLOG 64 /* releases remembered with their pool (sched.rlog) */

/* ---- String -> index map (open addressing, keys owned by the map) ------- */
typedef struct smap {
    char **keys;
    uint64_t *hashes;
    uint32_t *vals;
    size_t cap, n;
} smap;
int sched__map_put(smap *m, const char *key, uint32_t val, const char **stored);
uint32_t sched__map_get(const smap *m, const char *key);
/* Deletes key (if present), freeing the stored copy. */
void sched__map_del(smap *m, const char *key);
void sched__map_free(smap *m);

/* One pod or replica: `gpus` GPUs of node `node` held since `since`;
 * `gmask` names the device indices (snode.gbusy has them set). */
typedef struct splace {
    uint32_t node;
    int gpus;
    double since;
    uint64_t gmask;
} splace;

/* A reference from a node back to a job holding GPUs on it. */
typedef struct sref {
    uint32_t job;
    int gpus;
} sref;

typedef struct snode {
    const char *id;
    uint32_t pool;
    int gpus, free;
    uint64_t gbusy; /* device indices held by places */
    double price_s; /* per GPU-second */
    sched_node_state state;
    uint32_t prev, next; /* bucket list of the pool (UP nodes only) */
    sref *refs;
    int nrefs, caprefs;
    int provisioned;     /* came from a scale-up: may be scaled down */
    int removed;
    double idle_since;
    /* Reservation bookkeeping for this step: spare GPUs at resv_T. */
    double resv_T, resv_end; /* the reserved gang's start and estimated end */
    int resv_spare;
    uint64_t resv_stamp;
    int pre_gpus;      /* GPUs held here by preemptible work */
    uint32_t pool_pos; /* index in its pool's nodes */
    uint32_t pre_pos;  /* index in its pool's pre_nodes while pre_gpus > 0 */
    uint64_t mark; /* scratch stamp for placement */
    int scratch;   /* scratch count, valid where mark is current */
    uint64_t gscratch; /* scratch device mask, valid where mark is current */
    /* ready[g]: when g GPUs will be free if work ends at its estimates;
     * valid while ready_ver == ver (ver changes with every hold and
     * release on the node). */
    uint32_t ver, ready_ver;
    double ready[MAXG + 1];
    /* busy_at's last answer (room.c): ba_val GPUs busy at ba_T, computed
     * at ba_now and holding until ba_until (the earliest estimated end in
     * [ba_now, ba_T] that would turn overdue), while ba_ver == ver. */
    uint32_t ba_ver;
    int ba_val;
    double ba_T, ba_now, ba_until;
} snode;

/* GPUs held by preemptible (elastic and function) work of one priority. */
typedef struct sprio {
    int prio, gpus;
} sprio;

/* Preemptible GPUs by priority (a handful of distinct priorities). */
typedef struct sprios {
    sprio *v;
    size_t n, cap;
} sprios;

typedef struct spool {
    uint32_t zone, fabric, type; /* interned name indices */
    uint32_t head[MAXG + 1];     /* UP nodes by free GPU count */
    int count[MAXG + 1];
    int ge[MAXG + 1]; /* UP nodes with at least g free GPUs */
    int free_total, gpus_up;
    double price_s;  /* the cheapest node's price per GPU-second */
    uint32_t *nodes; /* all nodes ever in the pool */
    size_t nnodes, capnodes;
    int maxg_ever[MAXG + 1]; /* nodes (any state) with >= g GPUs, for never-fits */
    int up_ge[MAXG + 1];     /* UP nodes with >= g GPUs, busy or not (why.c's nodes_down) */
    /* Reservation times by gang shape, valid while the pool's version is
     * unchanged (any hold, release or state change bumps it). */
    uint64_t ver;
    /* Bumped when GPUs are freed or nodes come up: between bumps, holds
     * only make reservation times later, so a cached time stays a lower
     * bound of the pool's time for that shape. */
    uint64_t rel_ver;
    uint64_t resv_stamp; /* a reservation took nodes here this cycle */
    struct {
        uint64_t ver, rel_ver; /* pool versions + 1 when T was computed */
        int g, n;
        double T; /* raw: before clamping to the cycle's `now` */
        uint32_t *nodes; /* the n nodes that give T, while ver is current */
        /* Their times, ascending (tk_ok: kept).  Each release since (of
         * rel_ver's count r) lowers one node's time or adds a node, which
         * moves the n-th smallest time down by at most one place, and holds
         * only raise times: tk[n - 1 - r] stays a lower bound of T. */
        double *tk;
        int capnodes, tk_ok;
    } rc[RC_SLOTS];
    uint32_t rc_next; /* round-robin victim when every slot is current */
    uint32_t rc_hint; /* the slot rc_slot found last: most searches ask for the same shape again */
    uint64_t touch_gen; /* sched.touch_gen when it was last listed in sched.touched */
    /* The latest estimated end of its running work (raw), kept up on each
     * hold, recomputed after the work that set it is released. */
    double drain;
    int drain_ok;
    sprios pre;       /* preemptible work running here, by priority */
    uint32_t *pre_nodes; /* nodes holding preemptible work (any order) */
    size_t npre_nodes, cappre_nodes;
} spool;

typedef struct stenant {
    const char *id;
    uint32_t *queue; /* queued job indices sorted by (-priority, order) */
    size_t nq, capq, cursor;
    size_t holes;    /* NONE slots left by jobs started during a walk */
    int gpus_in_use;
    /* The queue key of the job at the cursor, cached: next_job compares
     * every tenant's head once per job walked, and recomputing the fair
     * share key of each made it the replay's hottest function. */
    uint32_t kc_job;
    int kc_prio;
    uint64_t kc_ver; /* sched.busy_ver x 2 + 2 + fair when current */
    /* queue[live_pos] was found not skippable in the walk live_walk (a
     * cache: a stale entry only makes the walk visit a job it could skip). */
    size_t live_pos;
    uint64_t live_walk;
    double kc_key, kc_order;
    double *cost_t; /* by type index */
    size_t ncost;
} stenant;

typedef struct sjob {
    const char *id;
    uint32_t tenant;
    sched_kind kind;
    int nodes, maxr, gpn;
    int ntypes;
    uint32_t types[SCHED_MAX_TYPES];
    double speed[SCHED_MAX_TYPES];
    double est_s;
    int priority;
    sched_on_fail on_fail;
    double replace_wait_s;
    sched_job_state state;
    double order; /* queue order key: submit sequence, negative after a requeue */
    double submit, first_start, start, end, queued_since, wait_acc;
    double blocked_since; /* first step at which it could not be placed, or -1 */
    int scale_requested;
    int restarts, preemptions, backfilled;
    int declined; /* preempt_wait turned its victims down at least once (sched_stats.preempt_declined) */
    double resv_promise; /* earliest reservation time promised, or -1 */
    /* Running past its estimate: the seconds its expected end was moved
     * on by (sched__overdue); 0 from each start. */
    double over;
    uint32_t pool; /* gang: the pool it runs or holds in */
    double hold_since, replace_deadline;
    splace *places;
    int nplaces, capplaces;
    double *cost_t;
    size_t ncost;
    char *reason;
    uint64_t shape; /* hash of (kind, nodes, gpus, types): equal shapes fit alike */
    uint32_t shape_slot; /* its entry's slot in sched.shapes when queued last (a hint:
                          * the entry is there while that slot holds this shape) */
    uint32_t qgen;  /* bumped each time it is queued: names its shape-heap entry */
    /* sched__job_pools' list for two or more types, while jp_ver ==
     * splacement.pools_ver + 1 (pools are only made when a node is added). */
    uint32_t *jp;
    size_t njp, capjp;
    uint64_t jp_ver;
} sjob;

/* Queued jobs by shape: lets a cycle stop walking the queue once every
 * shape waiting is known not to fit anywhere. */
typedef struct sshape {
    uint64_t shape;   /* 0: empty slot */
    size_t queued;    /* queued jobs of this shape */
    uint64_t dead_walk; /* the walk that found it cannot fit anywhere */
    uint64_t nopre_walk; /* the walk that found its gangs cannot preempt */
    uint64_t calm_walk;  /* the same, found before every shape was dead (not counted in nopre) */
    /* Across cycles: the probe found no room (nofit) or no victims (nopre,
     * while dead) at release epoch *_epoch under the reservations *_sig,
     * with the probe's run time, priority and clock then.  Until a release,
     * a node joining or a reservation of other nodes, placement and
     * preemption only get harder, so the answer stands for a probe no
     * shorter, no higher and no earlier, and reservations starting no later
     * and no later after now (a later start leaves backfill more room: work
     * ending before it no longer counts against the reserved nodes' spare
     * GPUs; *_ok: the entry is set). */
    int nf_ok, np_ok;
    uint64_t nf_epoch, nf_sig, np_epoch, np_sig;
    double nf_len, nf_now, nf_T[4], nf_slack[4];
    int np_prio;
    int max_prio;       /* an upper bound of its queued jobs' priorities */
    double min_est;     /* a lower bound of the queued jobs' estimates */
    /* What placement needs of the shape, for probes without a job at hand
     * (copied from the job that made it live). */
    sched_kind kind;
    int nodes, gpn, ntypes;
    uint32_t types[SCHED_MAX_TYPES];
    double min_len; /* a lower bound of est_s / fastest speed, queued jobs */
    /* Min-heap of (len, job, qgen) pushed with each queued job of the shape;
     * an entry whose job has left the queue since (its qgen moved, or it is
     * not queued) is dropped when it reaches the top, so the top gives the
     * exact shortest queued job (sched__shape_min_len). */
    struct slen { double len; uint32_t job, gen; } *heap;
    size_t nheap, capheap;
    struct slen *pheap; /* the same by -priority: the exact highest queued */
    size_t npheap, cappheap;
    /* The same for its queued gangs not yet turned down (sjob.declined):
     * the highest priority among them (sched__shape_undeclined_prio). */
    struct slen *uheap;
    size_t nuheap, capuheap;
    /* The heaps' answers, kept while no job of the shape joined or left the
     * queue (gen counts those changes; len_gen = gen + 1 when they are current). */
    uint64_t gen, len_gen;
    double len;
    int prio;
} sshape;

typedef struct squota {
    uint32_t zone, fabric, type;
    int gpus, max_nodes, provisioned, pending;
    double price_h, delay_s;
} squota;

/* A decision produced by an event between steps, reported by the next step. */
typedef struct spending {
    sched_decision_kind kind;
    uint32_t job;
    uint32_t node;
    splace *places;
    int nplaces;
} spending;

struct sched {
    sched_config cfg;
    squota *quotas;
    size_t nquotas;
    smap names; /* zones, fabrics, types share one name space */
    const char **name;
    size_t nname, capname;
    smap node_map, job_map, tenant_map;
    snode *nodes;
    size_t nnodes, capnodes;
    spool *pools;
    size_t npools, cappools;
    sjob *jobs;
    size_t njobs, capjobs;
    uint32_t *freejobs; /* slots of forgotten jobs (id NULL), reused by submit */
    size_t nfree, capfree;
    stenant *tenants;
    size_t ntenants, captenants;
    spending *pend;
    size_t npend, cappend;
    double seq, head_seq;
    uint64_t stamp;   /* reservation cycle */
    size_t queued, running;
    int gpus_up, gpus_busy, nodes_up;
    int preemptible_gpus; /* GPUs held by elastic and function work */
    sprios pre;           /* the same by priority */
    uint64_t release_epoch; /* bumped by every release and by a node joining or coming back */
    /* rlog[e % RLOG]: the pool where release e happened, or NONE when any
     * pool may have gained room (a node joined: pools and their lists may
     * be new).  A probe's "no" kept since epoch E then needs a new look
     * only in the pools of the releases after E (sched__released_since). */
    uint32_t rlog[RLOG];
    /* Pools whose ver moved (or that lost a node) since touch_gen began,
     * each listed once (spool.touch_gen); touched_lost: the list could not
     * grow, so any pool may have moved. */
    uint32_t *touched;
    size_t ntouched, captouched;
    uint64_t touch_gen;
    int touched_lost;
    sshape *shapes;    /* open addressing by shape hash */
    size_t capshapes, nshapes_live, nshapes_used;
    /* The slots of the shapes with jobs queued (nshapes_live of them), in
     * slot order: the sweeps visit these, not every slot of the table. */
    uint32_t *live;
    size_t caplive;
    /* A job was submitted with an earlier time than the one before it: the
     * tenant queues may then not be sorted by queue key, and the walk does
     * not skip ahead in them. */
    int submit_unsorted;
    double last_submit;
    uint64_t busy_ver; /* bumped whenever GPUs in use change (keys of next_job) */
    /* 1 turns off the cycle's shortcuts (shape sweeps and probes, the
     * reservation-time cache, the preemption index and memo) to compare
     * decisions with and without (sched_config.reference). */
    int plain_cycle;
    int walking;       /* a queue walk is running: starts leave holes */
    sched_stats st;
    uint64_t resv_late;   /* head reservations that moved later or were missed */
    /* Each layer's own state, made by sched_new and freed by sched_free
     * (sched.c); its header defines it. */
    struct sledger *led; /* ledger_int.h */
    struct splacement *plc; /* place_int.h */
    struct sroom *room;  /* room_int.h */
    struct scycle *cyc;  /* cycle_int.h */
    struct splan *plan;  /* query_int.h: the start plan of the queued jobs */
};

/* ---- model.c -------------------------------------------------------------- */
int sched__grow(void **v, size_t *cap, size_t need, size_t elem);
uint32_t sched__intern(sched *s, const char *name, int create);
/* SH_EINVAL unless v is a non-empty id shorter than SCHED_ID_MAX. */
int sched__check_name(const char *what, const char *v);
/* The index of a known node or job, or SH_ENOENT naming it. */
int sched__find_node(const sched *s, const char *id, uint32_t *out);
int sched__find_job(const sched *s, const char *id, uint32_t *out);
/* Appends a decision about job ji (or NONE) on node ni (or NONE) to d. */
int sched__emit(sched *s, sched_decisions *d, sched_decision_kind k, uint32_t ji, uint32_t ni);
/* Adds place p (held or just released) to the last decision. */
int sched__emit_place(sched_decisions *d, const sched *s, const splace *p);
/* A decision made by an event between steps, reported by the next step. */
int sched__pend(sched *s, sched_decision_kind k, uint32_t ji, uint32_t ni);
/* Frees the model's arrays and s (sched_free, after the layers above). */
void sched__model_free(sched *s);

/* ---- queue.c -------------------------------------------------------------- */
int sched__queue_push(sched *s, uint32_t ji, double now);
void sched__queue_remove(sched *s, uint32_t ji);
/* Removes the holes that starts left in the tenant queues during a walk. */
void sched__queue_compact(sched *s);
sshape *sched__shape(sched *s, uint64_t shape);
/* The shortest est_s / fastest speed among the shape's queued jobs. */
double sched__shape_min_len(const sched *s, sshape *sh);
/* The highest priority among the shape's queued jobs (max_prio is only an
 * upper bound: it never comes down as jobs leave). */
int sched__shape_max_prio(const sched *s, sshape *sh);
/* 1 and the highest priority among the shape's queued gangs that
 * preempt_wait never turned down (sjob.declined) in *prio, or 0 when there
 * is none. */
int sched__shape_undeclined_prio(const sched *s, sshape *sh, int *prio);


/* ---- Inline: placement and reservations call these once per pool and node. */
static inline double sched__job_speed(const sched *s, const sjob *j, uint32_t type)
{
    if (!j->ntypes) return 1.0;
    for (int i = 0; i < j->ntypes; i++)
        if (j->types[i] == type) return j->speed[i];
    return 0;
}

/* Expected run time of a job placed in pool `pool`.  A gang runs at its
 * pool's speed; elastic and function work may spread over several types, so
 * it is expected at its slowest allowed speed.  Placement, reservations and
 * sched_check must all use this one definition. */
static inline double sched__est_len(const sched *s, const sjob *j, uint32_t pool)
{
    double sp = 1.0;
    if (j->kind == SCHED_GANG && pool != NONE) sp = sched__job_speed(s, j, s->pools[pool].type);
    else if (j->ntypes) {
        sp = j->speed[0];
        for (int i = 1; i < j->ntypes; i++)
            if (j->speed[i] < sp) sp = j->speed[i];
    }
    return j->est_s / (sp > 0 ? sp : 1.0);
}

/* When a running job is expected to end: its start plus its estimate,
 * moved on while it runs past it (sched__overdue). */
static inline double sched__est_end(const sched *s, const sjob *j)
{
    return j->start + sched__est_len(s, j, j->pool) + j->over;
}

/* The first move of an overdue job's expected end; each next one is twice
 * the one before (OVERRUN_STEP_S x (2^k - 1) in all after k moves). */
#define OVERRUN_STEP_S 60.0

/* Moves pool pi's version (any hold, release or node state change) and
 * lists it in sched.touched. */
static inline void sched__pool_touch(sched *s, uint32_t pi)
{
    spool *p = &s->pools[pi];
    p->ver++;
    if (p->touch_gen == s->touch_gen + 1) return;
    p->touch_gen = s->touch_gen + 1;
    if (sched__grow((void **)&s->touched, &s->captouched, s->ntouched + 1, sizeof *s->touched) < 0)
        s->touched_lost = 1;
    else s->touched[s->ntouched++] = pi;
}

/* Counts a release (room appeared) in pool pi, or in any pool (NONE). */
static inline void sched__released(sched *s, uint32_t pi)
{
    s->rlog[++s->release_epoch % RLOG] = pi;
}


#endif
