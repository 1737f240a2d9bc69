/* Internal structures of the scheduling core (src/control/sched only).
 *
 * Everything is an index into a growable array: nodes, jobs, pools, tenants
 * and interned names never move once created, so an index is a stable
 * handle.  NONE marks "no index". */
#ifndef SHOAL_SCHED_INT_H
#define SHOAL_SCHED_INT_H

#include "shoal/common.h"
#include "shoal/sched.h"

#define NONE UINT32_MAX
#define MAXG SCHED_MAX_NODE_GPUS
#define SCHED__MAX_GANG 4096 /* nodes in one gang */
#define NJ_MAX 16 /* tenants next_job keeps in order (sched.nj_ord) */
#define RC_SLOTS 8 /* reservation times cached per pool, by gang shape */
#define RLOG 64     /* releases remembered with their pool (sched.rlog) */
#define RELEASED 16 /* distinct pools sched__released_since reports */

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
/* Adds delta GPUs at priority prio (entries are never removed). */
int sched__prios_add(sprios *a, int prio, int delta);
/* Preemptible GPUs held at priorities below prio. */
int sched__prios_below(const sprios *a, int prio);

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
     * sched.pools_ver + 1 (pools are only made when a node is added). */
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

/* A reservation made in the last step for a blocked head-of-line gang. */
typedef struct sresv {
    uint32_t job;
    double T;
    uint32_t *nodes;
    int n, need;
} sresv;

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
    double *forgot_cost_t; /* final bills of forgotten jobs, by type index */
    size_t nforgot_cost;
    stenant *tenants;
    size_t ntenants, captenants;
    sresv *resv;
    size_t nresv, capresv;
    spending *pend;
    size_t npend, cappend;
    double seq, head_seq;
    uint64_t stamp;   /* reservation cycle */
    uint64_t markseq; /* scratch marks on nodes */
    size_t queued, running;
    int gpus_up, gpus_busy, nodes_up;
    int preemptible_gpus; /* GPUs held by elastic and function work */
    sprios pre;           /* the same by priority */
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
    /* The searches' scratch, kept between cycles and freed by sched_free:
     * one buffer per search, since some run while another's is in use.
     * Per-thread statics leaked theirs at every scheduler thread's exit
     * (the server's). */
    struct sscratch {
        struct ppool *pp; /* cycle.c place_elastic: pools by price */
        size_t cappp;
        struct tnode *tn_exact, *tn_best, *tn_resv; /* room.c pool_exact, best_pool, make_reservation */
        size_t cap_exact, cap_best, cap_resv;
        struct pbound *pb; /* room.c best_pool's bounds */
        size_t cappb;
        struct vnode *vn_best, *vn_in, *vn_try; /* room.c best_victim_pool, preempt_possible_in, try_preempt */
        size_t cap_vbest, cap_vin, cap_vtry;
        struct sbpc bpc; /* room.c pool_answers while reservations lean on its answers */
        /* cycle.c's shape probes (a probe may hold a pool list, jp) */
        sjob probe_fit, probe_fit_in, probe_preempt, probe_gang, probe_declined;
    } scr;
    struct { /* sched__released_since's last answer: probes ask it alike */
        uint64_t since, epoch;
        int n;
        uint32_t v[RELEASED];
    } rel;
    uint64_t resv_sig;      /* a hash of this cycle's reservations (job and nodes) */
    double resv_T[4], resv_slack[4]; /* T and T - now of the first four */
    uint64_t resv_late;   /* head reservations that moved later or were missed */
    uint32_t *waiting;    /* HOLDING and REPLACING jobs: they have deadlines */
    size_t nwaiting, capwaiting;
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
    double next_wake;
    sshape *shapes;    /* open addressing by shape hash */
    size_t capshapes, nshapes_live, nshapes_used;
    /* The slots of the shapes with jobs queued (nshapes_live of them), in
     * slot order: the sweeps visit these, not every slot of the table. */
    uint32_t *live;
    size_t caplive;
    uint64_t walk_id;
    /* A job was submitted with an earlier time than the one before it: the
     * tenant queues may then not be sorted by queue key, and the walk does
     * not skip ahead in them. */
    int submit_unsorted;
    double last_submit;
    uint64_t busy_ver; /* bumped whenever GPUs in use change (keys of next_job) */
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
    /* 1 turns off the cycle's shortcuts (shape sweeps and probes, the
     * reservation-time cache, the preemption index and memo) to compare
     * decisions with and without (sched_config.reference). */
    int plain_cycle;
    int walking;       /* a queue walk is running: starts leave holes */
    uint32_t *allpools;  /* 0..npools-1, for jobs that take any type */
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
    uint64_t pools_ver;   /* bumped when a node is added */
    struct stpools {
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
    } *tpools;           /* pools of each GPU type, by name index */
    int ge_all[MAXG + 1]; /* UP nodes of any type with at least g free GPUs */
    size_t ntpools;
    uint32_t *elastic; /* every elastic job, for the growth pass */
    size_t nelastic, capelastic;
    sched_stats st;
    sched_bill *bills; /* closed bills kept for the caller (cfg.bill_journal) */
    size_t nbills, capbills;
    /* The start plan of the queued jobs (why.c), valid while its key
     * matches the state it was made from. */
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
    } plan;
};

/* sched.c */
int sched__grow(void **v, size_t *cap, size_t need, size_t elem);
uint32_t sched__intern(sched *s, const char *name, int create);
void sched__bill(sched *s, sjob *j, const splace *p, double now);
/* Takes `gpus` GPUs on node ni (mask 0: the lowest free indices; else the
 * mask given, which must be free) for job ji since `since`. */
int sched__hold_at(sched *s, uint32_t ji, uint32_t ni, int gpus, uint64_t mask, double since, double now);
double sched__place_cost(const sched *s, const splace *p, double now);
int sched__queue_push(sched *s, uint32_t ji, double now);
void sched__queue_remove(sched *s, uint32_t ji);
/* Removes the holes that starts left in the tenant queues during a walk. */
void sched__queue_compact(sched *s);
/* Inline: placement and reservations call these once per pool and node. */
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

/* place.c */
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
    return t < s->ntpools && g <= MAXG && s->tpools[t].max_ge[g] >= n;
}
int sched__pool_fits(const spool *p, int n, int g);
int sched__never_fits(sched *s, const sjob *j, char *why, size_t cap);
typedef struct scand {
    uint32_t nodes[SCHED__MAX_GANG];
    int n;
} scand;
int sched__pick_gang(sched *s, const sjob *j, uint32_t pi, double est_end, scand *out);
/* room.c: lists running job ji (just started) by its expected end. */
int sched__due_add(sched *s, uint32_t ji);
/* room.c: moves on the expected end of every running job past it at now
 * (sched_step, before any decision). */
int sched__overdue(sched *s, double now);
int sched__pick_pool(sched *s, const sjob *j, double now, int pack, scand *out, uint32_t *pool);

/* room.c: reserves nodes for blocked gang ji (shoal and backfill); frees
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

/* why.c: the wait reason and (est = 1) the start estimate of queued job
 * ji; with est = 0, est_start_s is NAN. */
void sched__pending(sched *s, uint32_t ji, double now, sched_job_info *o, int est);

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

/* The distinct pools of the releases after epoch `since` (*out, owned by
 * s, valid until the next call) and their count (at most RELEASED); -1
 * when they are not all known (too many, too long ago, or one that may
 * have touched any pool). */
int sched__released_since(sched *s, uint64_t since, const uint32_t **out);

/* cycle.c */
int sched__emit(sched *s, sched_decisions *d, sched_decision_kind k, uint32_t ji, uint32_t ni);
/* Adds place p (held or just released) to the last decision. */
int sched__emit_place(sched_decisions *d, const sched *s, const splace *p);
int sched__pend(sched *s, sched_decision_kind k, uint32_t ji, uint32_t ni);
/* Stops a placed job and queues it again; a failure (failed = 1) sends a
 * gang to the head of its queue and counts a restart. */
int sched__requeue(sched *s, uint32_t ji, double now, int failed);
int sched__wait_add(sched *s, uint32_t ji);
/* Queued jobs in the policy's order (as sched_queue), up to cap indices;
 * returns how many were written. */
size_t sched__queue_order(sched *s, uint32_t *out, size_t cap);

#endif
