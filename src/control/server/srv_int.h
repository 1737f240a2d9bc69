/* Internal model of the server (src/control/server only).
 *
 * One mutex (srv.mu) guards the whole model; HTTP handler threads, the
 * scheduler thread and agents' long polls all take it.  Every change is
 * written to SQLite inside the same critical section, before the change is
 * visible to anyone, so the database is always a prefix of what was answered.
 *
 * The agent protocol is declarative: for each node the server derives, from
 * the members placed there, the list of members that should exist
 * (srv__desired); an agent makes its processes match it.  Nothing is queued,
 * so a lost reply or a restarted server loses nothing. */
#ifndef SHOAL_SRV_INT_H
#define SHOAL_SRV_INT_H

#include "shoal/sched.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>

#include "shoal/common.h"
#include "shoal/server.h"

enum { NODE_ALIVE, NODE_DEAD, NODE_GONE };
enum { J_PENDING, J_STARTING, J_RUNNING, J_SUCCEEDED, J_FAILED, J_CANCELLED, J_NSTATES };
enum { M_ASSIGNED, M_READY, M_RUNNING, M_EXITED, M_LOST, M_STOPPED };
enum { K_GANG, K_ELASTIC, K_FUNCTION };
enum { P_REQUEUE, P_REPLACE, P_FAIL };

typedef struct srv_node {
    char name[64], gpu_type[32], zone[32], fabric[32], addr[64], sandbox[128];
    char cred[48];       /* the node's own credential (issued at registration) */
    int gpus, state, from_provider; /* GPUs in use: the core's (srv__node_used) */
    double price;        /* dollars per GPU-hour */
    double last_seen;    /* monotonic seconds of the last poll */
    uint64_t version;    /* bumped whenever this node's desired list changes */
} srv_node;

typedef struct srv_member {
    int rank, node, state, exit_code;
    uint64_t gpu_mask;     /* device indices, chosen by the core */
    double t_placed;       /* wall seconds: the core placed it (billing starts) */
    double t_start, t_end; /* wall seconds: its process ran between them */
    int64_t disk_bytes;    /* its work directory at the agent's last look (not stored) */
} srv_member;

/* A Prometheus histogram: counts per bucket (not cumulative; the last is
 * +Inf), the sum and count of the observations. */
#define SRV_HBUCKETS 12
#define SRV_SIZE_CLASSES 5 /* gangs of 1, 2-4, 5-16, 17-64, 65+ nodes */
typedef struct srv_hist {
    uint64_t bucket[SRV_HBUCKETS + 1], n;
    double sum;
} srv_hist;

typedef struct srv_job {
    int64_t id;
    char tenant[64], name[128], idem[128], reason[256];
    int kind, state, policy, attempt, max_attempts, priority, exit_code;
    int failures;                        /* node failures so far (max_attempts bounds them) */
    int nodes, min_nodes, gpus_per_node; /* gang: nodes; elastic: min..nodes */
    json_t *spec;                        /* the job file as accepted (owned) */
    size_t spec_bytes;                   /* its size as sent, charged to the tenant's queue */
    double t_submit, t_start, t_end;     /* wall seconds */
    int go;                              /* the launch barrier is open */
    int nmem;
    srv_member *mem;
    uint64_t log_checked;                /* ranks whose log file this process has repaired */
    int rdzv_port;                       /* MASTER_PORT of this attempt (0: not chosen yet) */
    double t_placed;                     /* wall time this attempt was placed (metrics) */
    int nprefer;                         /* replace policy: nodes to keep, by rank */
    int prefer[64];
} srv_job;


struct srv {
    srv_config cfg;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* broadcast on any change agents may wait for */
    pthread_cond_t sched_cv; /* wakes the scheduler thread */
    pthread_t sched_thread;
    int stopping, dirty;
    sqlite3 *db;
    int lock_fd; /* DB.lock, held while the server runs (-1: none) */
    struct { const char *sql; sqlite3_stmt *st; } stmts[16];
    int nstmts;
    struct MHD_Daemon *mhd;
    int port;
    char dir[4096]; /* directory of the database: logs/ lives there */
    json_t *tokens;
    json_t *tenant_num; /* tenant name -> its number (members run as uid base + number) */
    char state_dir[4096]; /* absolute s->dir: hidden from members, never writable */
    int64_t forged_job;   /* a poll's forged report, recorded after its rollback */
    char forged_msg[256];
    int defer_seam;       /* srv__seam_end only queues (see srv__seam_flush) */
    int64_t seam_queue[64];
    int seam_queue_cancelled[64], nseam_queue;
    double seam_queue_t[64];  /* when it ended, on the core's clock */
    int seam_queue_billed[64]; /* its closing bills, written by srv__seam_prebill */
    srv_node *nodes;
    int nnodes, cap_nodes;
    srv_job **jobs; /* by id; jobs[0] unused */
    int64_t njobs, cap_jobs;
    int64_t *active; /* ids of pending, starting and running jobs */
    int64_t nactive, cap_active;
    /* counters for /metrics */
    uint64_t submits, rejects, http_req[6], polls;
    double last_cycle_s;
    /* /metrics histograms by gang size class (srv__size_class): seconds
     * from placement to every rank running, and from submit to first start. */
    srv_hist h_start[SRV_SIZE_CLASSES], h_wait[SRV_SIZE_CLASSES];
    sched *sc;            /* the scheduling core: every placement comes from it */
    size_t bills_staged;  /* the core's oldest bills, inserted in the open transaction */
    sched_decisions dec;
    int provider_next;    /* provider-created nodes are named auto-<n> */
    int provider_busy;    /* provider commands still running */
    char quota_buf[256];  /* --provider-quota, split into the strings below */
    sched_quota quota;
    int reloading;        /* srv__seam_init rebuilds after an undone cycle, not a restart */
    char failed[1024];    /* non-empty: the state is lost; every request gets 503 */
};

typedef struct srv_req {
    const char *method, *path, *query_raw;
    const char *body;
    size_t body_len;
    const char *tenant; /* NULL: admin or agent */
    int role;           /* ROLE_* */
    int node;           /* ROLE_NODE: the index of the node the credential names */
    const char *idem_header;
    struct MHD_Connection *conn;
    srv_job *job; /* POST /v1/jobs: the job parsed before locking (owned) */
} srv_req;
/* ROLE_JOIN holds the join token ("agent" in the tokens file): it may only
 * register nodes.  ROLE_NODE holds one node's credential: it may only poll
 * as that node.  Neither reaches the tenant API, and the admin token does
 * not reach /v1/agent/. */
enum { ROLE_NONE, ROLE_TENANT, ROLE_ADMIN, ROLE_JOIN, ROLE_NODE };

/* db.c */
int srv__db_open(srv *s);
int srv__db_autocommit(srv *s); /* 1: no transaction is open */
void srv__db_close(srv *s);
int srv__db_load(srv *s);
int srv__db_node(srv *s, const srv_node *n);
int srv__db_job(srv *s, const srv_job *j);
int srv__db_members(srv *s, const srv_job *j);
int srv__db_event(srv *s, int64_t job, const char *node, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* One closed bill of the core, as a ledger row (times on the wall clock). */
typedef struct srv_bill {
    const char *tenant;
    int64_t job;
    int attempt, rank; /* rank -1: no member matched the place */
    const char *node, *gpu_type;
    int gpus;
    double t_start, t_end, seconds, cost;
} srv_bill;
int srv__db_ledger(srv *s, const srv_bill *b);
int srv__db_tenants(srv *s);
int srv__db_begin(srv *s);
int srv__db_commit(srv *s);
void srv__db_rollback(srv *s);
json_t *srv__db_events(srv *s, int64_t after, const char *tenant, int64_t job, int limit);
json_t *srv__db_costs(srv *s, const char *tenant);
/* Closed ledger rows plus what running members have cost so far:
 * {"by_tenant": {tenant: {gpu_type: {dollars, gpu_seconds}}}, "total_dollars"}
 * (all tenants when tenant is NULL).  Caller holds s->mu and owns the result. */
json_t *srv__costs(srv *s, const char *tenant);
/* Metrics: the size class of a gang of n nodes, and recording one value. */
int srv__size_class(int nodes);
void srv__observe_start(srv *s, int nodes, double seconds);
void srv__observe_wait(srv *s, int nodes, double seconds);
void srv__db_job_cost(srv *s, int64_t job, double *dollars, double *gpu_s);

/* state.c */
srv_job *srv__job(srv *s, int64_t id);
int srv__node_find(srv *s, const char *name);
int srv__job_add(srv *s, srv_job *j);
void srv__job_free(srv_job *j);
int srv__active_add(srv *s, int64_t id);
void srv__changed(srv *s);
/* Starts job j's members on nodes[0..n) with the device masks the core chose. */
int srv__start(srv *s, srv_job *j, const int *nodes, const uint64_t *masks, int n);
/* GPUs the core has placed work on, node idx (0 for a node it does not know). */
int srv__node_used(srv *s, int idx);
int srv__finish(srv *s, srv_job *j, int state, int exit_code, const char *reason);
int srv__member_end(srv *s, srv_job *j, srv_member *m, int state, int code);
int srv__node_dead(srv *s, int idx, const char *why);
void srv__heartbeats(srv *s, double now);
int srv__time_limits(srv *s, double wall);
double srv__ends_by(const srv *s, const srv_job *j);
double srv__est_grace(const srv *s);
int srv__cancel(srv *s, srv_job *j, const char *who);
const char *srv__job_state_name(int st);
const char *srv__member_state_name(int st);
const char *srv__kind_name(int k);
const char *srv__policy_name(int p);
json_t *srv__job_json(srv *s, const srv_job *j, int full);
/* Every node not gone, with the work placed on it (tenant: others hidden). */
json_t *srv__nodes_json(srv *s, const char *tenant);
int srv__job_from_spec(json_t *spec, const char *tenant, srv_job **out);

/* An undo record: the jobs and nodes a change may touch, saved before it,
 * so that a change whose transaction fails is taken back in memory too and
 * the model never runs ahead of the database.  Between begin and end the
 * scheduling core is told of ended jobs only after the commit.  (The
 * scheduling cycle does not use it: the core has taken its own decisions
 * by the time they are written.) */
typedef struct srv_undo_job { srv_job *j; srv_job copy; srv_member *mem; } srv_undo_job;
typedef struct srv_undo {
    srv_undo_job *jobs;
    int njobs, cap_jobs;
    int *node_idx;
    srv_node *nodes;
    int nnodes, cap_nodes;
} srv_undo;
void srv__undo_begin(srv *s, srv_undo *u);
int srv__undo_job(srv *s, srv_undo *u, srv_job *j);
int srv__undo_node(srv *s, srv_undo *u, int idx);
/* committed: flush the deferred core updates; else restore what was saved. */
void srv__undo_end(srv *s, srv_undo *u, int committed);

/* seam.c: the scheduling core's seam */
enum { SEAM_UP, SEAM_DEAD, SEAM_GONE };
int srv__seam_init(srv *s);
void srv__seam_free(srv *s);
/* 0 queued, 1 rejected as never fitting (why says so), < 0 error. */
int srv__seam_submit(srv *s, const srv_job *j, char *why, size_t cap);
void srv__seam_end(srv *s, const srv_job *j, int cancelled);
/* srv__seam_end at core time t, for a job whose `billed` closing bills are
 * in the ledger already (srv__seam_prebill). */
void srv__seam_end_at(srv *s, const srv_job *j, int cancelled, double t, int billed);
/* Before the commit of a change that ended jobs (the queue of
 * srv__undo_begin): writes the bills their end closes, in the same
 * transaction, so that an end is never durable without its bills. */
int srv__seam_prebill(srv *s);
int srv__seam_node(srv *s, int idx, int event);
int srv__seam_step(srv *s, double now);
int srv__grow(srv *s, srv_job *j, const int *nodes, const uint64_t *masks, int n);
/* Writes the core's closed bills to the ledger.  Inside a transaction they
 * stay in the core until it commits (srv__seam_bills_end), so that a
 * failed commit or a rollback loses none: they are written again. */
int srv__seam_bills(srv *s);
void srv__seam_bills_end(srv *s, int committed);
int srv__shrink(srv *s, srv_job *j, const int *nodes, const uint64_t *masks, int n);
int srv__requeue(srv *s, srv_job *j, const char *why, int failed);

/* provider.c: autoscaling hook */
int srv__provider_config(srv *s, sched_config *c);
int srv__provider_create(srv *s, const char *zone, const char *fabric, const char *gpu_type, int n);
int srv__provider_delete(srv *s, const char *node);
void srv__provider_tick(srv *s, double now);

/* agentapi.c */
int srv__agent_register(srv *s, json_t *body, json_t **reply);
/* Runs for the node whose credential the request carried (index node). */
int srv__agent_poll(srv *s, int node, json_t *body, json_t **reply);
int srv__agent_logs(srv *s, json_t *body);
int srv__log_path(srv *s, int64_t job, int rank, char *out, size_t cap);

/* logfile.c: rank logs as framed records (docs/server-api.md) */
#define SRV_LOG_MAX_RECORD (1u << 20)
/* Appends data as one or more records; with repair, first cuts the file back
 * to its last whole record (a crash may have left a torn one). */
int srv__log_append(const char *path, const void *data, size_t len, int repair);
/* Appends to out the data of whole records from file offset off, stopping
 * once out holds max bytes or at the first incomplete or broken record;
 * *next is the offset after the last record read.  A missing file reads
 * as empty. */
int srv__log_read(const char *path, uint64_t off, size_t max, sh_buf *out, uint64_t *next);

/* api.c */
/* 1 if key is 1 to 127 printable ASCII characters (an Idempotency-Key). */
int srv__idem_valid(const char *key);
/* 1 if path is dir or lies under it (both plain absolute paths). */
char *srv__allow_split(char *entry, const char **owner);
int srv__allow_applies(char **entry, const char *tenant);
int srv__path_under(const char *path, const char *dir);
int srv__presubmit(const srv_config *cfg, srv_req *r);
int srv__handle(srv *s, srv_req *r, int *status, json_t **reply);
/* Prometheus text; tenant: whose bills to show (NULL every tenant's, "" none). */
void srv__metrics(srv *s, sh_buf *out, const char *tenant);

#endif
