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
 * so a lost reply or a restarted server loses nothing.
 *
 * This header is the base layer of the server's stack (the model's types,
 * checks, lookups and histograms); each layer above has its own header:
 * db_int.h, seam_int.h, state_int.h, provider_int.h, carry_int.h,
 * files_int.h, handlers_int.h, loop_int.h (docs/architecture.md). */
#ifndef SHOAL_SRV_INT_H
#define SHOAL_SRV_INT_H

#include "shoal/sched.h"

#include <pthread.h>
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
    char cred[72];       /* the hash of the node's credential (srv__secret_hash) */
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
    double t_exit;         /* wall seconds its agent saw it exit ("ended_at"; not stored, 0: unknown) */
    char tail[240];        /* the end of its output this attempt, for a failure's reason (not stored) */
    int tail_len;
} srv_member;

/* A gang whose rank failed waits this long (or until every rank has ended)
 * before it is failed, so that the rank that failed first, by its agent's
 * clock, is the one the reason names: the other ranks often fail a moment
 * later ("connection closed by peer") and their agent may poll first. */
#define SRV_FAIL_SETTLE_S 2.0

/* A Prometheus histogram: counts per bucket (not cumulative; the last is
 * +Inf), the sum and count of the observations. */
#define SRV_HBUCKETS 12
#define SRV_SIZE_CLASSES 5 /* gangs of 1, 2-4, 5-16, 17-64, 65+ nodes */
typedef struct srv_hist {
    uint64_t bucket[SRV_HBUCKETS + 1], n;
    double sum;
} srv_hist;

/* What one tenant's rank logs take on disk: counted from the files when
 * first needed and again (at most every SRV_TLOG_RECOUNT_S) when the
 * budget is reached, and kept up by every append in between. */
typedef struct srv_tlog {
    char tenant[64];
    uint64_t bytes;
    double counted; /* monotonic seconds of the last count from the files */
} srv_tlog;
#define SRV_TLOG_RECOUNT_S 10.0

typedef struct srv_job {
    int64_t id;
    char tenant[64], name[128], idem[128], reason[640];
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
    uint64_t log_tenant_full;            /* ranks whose log has the note of the tenant's budget */
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
    const struct srv_store_ops *store; /* the engine behind db.c */
    void *db;                   /* its connection (NULL: closed) */
    char db_name[512];          /* --db as messages show it (no password) */
    int lock_fd; /* DB.lock, held while the server runs (-1: none) */
    /* Several servers on one PostgreSQL database (leader.c): only the
     * leader holds a state; a standby answers with a redirect to it. */
    int leader;              /* 1: this process leads (always, with SQLite) */
    int64_t epoch;           /* its fencing epoch (PostgreSQL) */
    double lease_until;      /* monotonic: it may act as leader until then */
    double t_led_wall;       /* wall time it became leader (0: never) */
    double t_first_cycle;    /* wall time of its first scheduling cycle as leader */
    char leader_url[300];    /* a standby's view of the leader (guarded by lead_mu) */
    char self_url[300];      /* the URL this server advertises */
    pthread_mutex_t lead_mu;
    pthread_t lead_thread;
    struct MHD_Daemon *mhd;
    int port;
    char dir[4096]; /* directory of the database: logs/ lives there */
    json_t *tokens;       /* the tokens file, each token replaced by its hash */
    char *provider_token; /* the agent token as given, for --provider-cmd only (else NULL) */
    json_t *prio_max;     /* --max-priority: tenant -> the highest priority its jobs may ask */
    int prio_default;     /* ... for a tenant not in prio_max */
    struct srv_tlog *tlog; /* bytes of each tenant's rank logs on disk (agentapi.c) */
    int ntlog, cap_tlog;
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
    json_t *idem_index; /* "tenant/key" -> job id, of every job with an Idempotency-Key */
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
    json_t *runs;         /* "tenant\nrun" -> {tenant, run, secret, token, services} (runs.c) */
};

typedef struct srv_req {
    const char *method, *path, *query_raw;
    const char *body;
    size_t body_len;
    const char *tenant; /* NULL: admin or agent */
    const char *run;    /* ROLE_RUN: the run its token opens (tenant: the run's tenant) */
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
enum { ROLE_NONE, ROLE_TENANT, ROLE_ADMIN, ROLE_JOIN, ROLE_NODE, ROLE_RUN };
/* ROLE_RUN holds a run token (SHOAL_RUN_TOKEN, given to a run's ranks): it
 * reaches only /v1/runs/<its run>/ (runs.c). */

/* srv_check.c: secrets at rest.  "sha256:" and 64 hex digits, NUL included. */
#define SRV_HASH_LEN 72
void srv__secret_hash(const char *secret, char out[SRV_HASH_LEN]);
/* 1 if v is a hash as srv__secret_hash writes it. */
int srv__is_hash(const char *v);

/* A row of the jobs table, as srv__db_load hands it to `job`. */
typedef struct srv_job_row {
    int64_t id;
    const char *tenant, *idem;
    int state, attempt, exit_code;
    const char *reason, *spec; /* spec: the job file's JSON text */
    double t_submit, t_start, t_end;
    int go;
    const char *prefer; /* JSON array of node indexes */
    int nodes, failures;
} srv_job_row;
/* One closed bill of the core, as a ledger row (times on the wall clock). */
typedef struct srv_bill {
    const char *tenant;
    int64_t job;
    int attempt, rank; /* rank -1: no member matched the place */
    const char *node, *gpu_type;
    int gpus;
    double t_start, t_end, seconds, cost;
} srv_bill;
/* hist.c: the size class of a gang of n nodes, recording one value, and
 * printing a histogram (wait: the queue-wait bounds, else the start ones). */
int srv__size_class(int nodes);
void srv__observe_start(srv *s, int nodes, double seconds);
void srv__observe_wait(srv *s, int nodes, double seconds);
void srv__hist_print(sh_buf *b, const char *name, const char *help, const srv_hist *h, int wait);

/* srv_model.c: looking jobs and nodes up, adding and freeing jobs */
srv_job *srv__job(srv *s, int64_t id);
int srv__node_find(srv *s, const char *name);
int srv__job_add(srv *s, srv_job *j);
void srv__job_free(srv_job *j);
int srv__active_add(srv *s, int64_t id);
const char *srv__job_state_name(int st);
const char *srv__member_state_name(int st);
/* srv_model.c: the spellings of kinds (K_*) and failure policies (P_*). */
extern const char *const srv__kinds[3];
extern const char *const srv__policies[3];
const char *srv__kind_name(int k);
const char *srv__policy_name(int p);

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

/* seam.c: the scheduling core's seam */
enum { SEAM_UP, SEAM_DEAD, SEAM_GONE };

/* uploads.c: the archives jobs ship (POST /v1/workdirs, GET /v1/agent/workdir) */
typedef struct srv_upload {
    int fd;
    char tmp[4300];
    sh_hasher *h;
    uint64_t bytes;
} srv_upload;
int srv__workdir_id_ok(const char *id);

/* runs.c: a tenant's jobs that name one "run" share a secret and services.
 * runs.c and uploads.c call nothing of the files that call each other
 * (scripts/layers-known-cycles.txt): their callers write the database. */
typedef struct srv_new_run {
    int create;
    char tenant[64], run[64], secret[33], token[45];
} srv_new_run;
/* A service a PUT publishes: written by the caller (srv__db_run_service),
 * then set in memory with srv__run_set. */
typedef struct srv_run_put {
    int put;
    char tenant[64], run[64], name[64];
    json_t *value; /* owned */
} srv_run_put;
/* Job `id` as srv__job has it, for the files outside the circle. */
static inline srv_job *srv__job_at(const struct srv *s, int64_t id)
{
    return id > 0 && id <= s->njobs ? s->jobs[id] : NULL;
}
int srv__run_name_ok(const char *name);
/* srv_check.c: compares tokens in time that depends only on their lengths. */
int srv__token_eq(const char *given, const char *known);

/* logfile.c: rank logs as framed records (docs/server-api.md) */
#define SRV_LOG_MAX_RECORD (1u << 20)

/* srv_check.c: 1 if key is 1 to 127 printable ASCII characters (an
 * Idempotency-Key). */
int srv__idem_valid(const char *key);

#endif
