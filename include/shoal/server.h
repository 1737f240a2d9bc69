/* shoal server: the control plane's HTTP/JSON API over SQLite state.
 *
 * The server keeps an in-memory model of nodes, jobs and their members (one
 * member per rank of a job) and writes every change through to SQLite in WAL
 * mode before it answers, so that a process killed at any instant restarts
 * with every accepted job and no duplicate.  Placement decisions come from the
 * scheduling core behind src/control/server/seam.c and carry.c; the server
 * only carries them out: it hands assignments to node agents, runs the gang
 * launch barrier, notices missed heartbeats and applies each job's failure
 * policy.
 *
 * Specs: docs/server-api.md (HTTP endpoints), docs/job-format.md (job files),
 * docs/agent-protocol.md (what agents send and receive).
 *
 * The HTTP/1.1 client that talks to a server is shoal/client.h. */
#ifndef SHOAL_SERVER_H
#define SHOAL_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

typedef struct srv srv;

typedef struct srv_config {
    const char *db_path;       /* SQLite file (its directory also holds logs/), or a PostgreSQL
                                * URL postgresql://... (several servers may share it: one
                                * leads, the others stand by; docs/deploy.md) */
    const char *state_dir;     /* logs/ goes here (required with PostgreSQL; NULL: beside SQLite's file) */
    const char *advertise;     /* this server's URL as the others redirect to it (NULL:
                                * http://BIND:PORT) */
    const char *tokens_path;   /* JSON {"admin":..,"agent":..,"tenants":{name:token}} */
    const char *web_dir;       /* static dashboard files; NULL: no dashboard */
    const char *bind_addr;     /* default "127.0.0.1" */
    int port;                  /* 0: pick a free port (see srv_port) */
    double heartbeat_timeout;  /* seconds without a poll before a node is dead (default 3) */
    size_t max_body;           /* largest request body in bytes (default 1 MiB) */
    const char *provider_cmd;  /* autoscaling hook (NULL: none); see docs/server-api.md */
    const char *provider_quota; /* "ZONE,FABRIC,GPU_TYPE,GPUS,MAX_NODES,PRICE" it may add */
    double scale_up_wait_s;    /* a job queued this long asks for nodes (default 2) */
    double scale_down_idle_s;  /* an idle provider node is released after (default 10) */
    int sync_full;             /* 1: SQLite synchronous=FULL (survives power loss) */
    int manual_cycles;         /* 1: no scheduler thread; call srv_cycle_for_bench (bench) */
    const char *writable_allow; /* ':'-separated directories jobs may list in "writable", each DIR
                                 * (any tenant's) or TENANT=DIR (that tenant's only); NULL: none */
    uint64_t max_log;          /* bytes one rank's log file may take on disk (default SRV_MAX_LOG) */
    uint64_t max_queued;       /* bytes a tenant's active jobs may hold (default SRV_MAX_QUEUED) */
    double est_grace_s;        /* an attempt runs at most est_s plus this (0: SRV_EST_GRACE) */
    int require_est;           /* 1: a job without "est_s" is refused (400) */
    double default_est_s;      /* the run the scheduler plans for a job without "est_s" (no
                                * limit is set); 0: the core's default, 3600 */
    unsigned max_conns_per_ip; /* connections one address may hold (0: SRV_MAX_CONNS_PER_IP) */
    const char *max_priority;  /* ':'-separated "N" (every tenant's) and "TENANT=N" (one's): the
                                * highest "priority" a tenant's job may ask; NULL: 0 for every
                                * tenant (the admin's jobs are not limited) */
    uint64_t max_tenant_log;   /* bytes all of one tenant's rank logs may take on disk (default
                                * SRV_MAX_TENANT_LOG) */
    double log_drain_s;        /* seconds after a rank ends that its node may still send its
                                * output (0: SRV_LOG_DRAIN) */
    uint64_t workdir_max;      /* largest work-dir archive a tenant may upload (0: SH_TAR_DEFAULT_LIMIT) */
    uint64_t workdir_quota;    /* bytes of archives one tenant may hold (0: SRV_WORKDIR_QUOTA) */
} srv_config;

/* A job's "est_s" is also its time limit, as Slurm's --time is: an attempt
 * that has run longer than est_s + srv_config.est_grace_s is ended (failed,
 * reason "time limit"), so that a tenant cannot win a backfill slot by
 * understating it.  est_s is at most SRV_MAX_EST_S (30 days). */
#define SRV_EST_GRACE 60.0
/* The server takes SRV_MAX_CONNS connections in all and, by default, a
 * quarter of them from one address, so that a rank on one node cannot hold
 * every connection (its node's address is its agent's too). */
#define SRV_MAX_CONNS 1000u
#define SRV_MAX_CONNS_PER_IP 250u
#define SRV_MAX_EST_S (30.0 * 86400)

/* The default of srv_config.max_log: a rank's output past it is dropped,
 * so that a job cannot fill the disk that holds the server's database. */
#define SRV_MAX_LOG (64ull << 20)
/* The default of srv_config.max_tenant_log: past it a tenant's ranks'
 * output is dropped (with a note in each log and an event), so that many
 * ranks of one tenant, each under max_log, cannot fill the disk that holds
 * the database together.  The server counts a tenant's logs again when it
 * reaches the limit, so removing old logs/JOB folders frees room. */
#define SRV_MAX_TENANT_LOG (16ull << 30)
/* The default of srv_config.log_drain_s: a rank's log takes output from
 * its node while the rank lives and this long after (its agent sends the
 * last of it); then it is closed to the node's credential. */
#define SRV_LOG_DRAIN 30.0
/* The default of srv_config.max_queued: a tenant's pending and running
 * jobs may hold this much of the server's memory and database, counted as
 * each job file's size plus SRV_JOB_COST (the server's own record of it):
 * 65,536 small jobs, or 255 job files of 1 MiB.  A submit past it is 429. */
#define SRV_MAX_QUEUED (256ull << 20)
#define SRV_JOB_COST 4096u
/* The default of srv_config.workdir_quota: a tenant's work-dir archives
 * (POST /v1/workdirs) hold at most this much of the server's disk; older
 * archives no pending or running job names make room for new ones. */
#define SRV_WORKDIR_QUOTA (1ull << 30)

/* Opens the database (creating or migrating it), loads the state, starts the
 * HTTP daemon and the scheduler thread.  On success *out owns everything;
 * free with srv_stop().  Fails with a message naming the file or port. */
int srv_start(const srv_config *cfg, srv **out);
/* 1 once the server leads (at once with SQLite; with PostgreSQL once it
 * has won the election and loaded the state), else 0. */
int srv_leading(srv *s);
/* The TCP port the server listens on. */
int srv_port(const srv *s);
/* NULL while the server runs; after a scheduling cycle whose commit failed
 * and whose reload from the database failed too, why: the server then
 * answers every request with 503 and should be restarted. */
const char *srv_failed(srv *s);
/* Stops the daemon and the scheduler thread and closes the database. */
void srv_stop(srv *s);

/* Runs one scheduling cycle in this thread (used by `shoal bench control`);
 * returns its duration in seconds, or a negative SH_E* code. */
double srv_cycle_for_bench(srv *s);
/* Registers `n` nodes that no agent backs (for the benchmark only): they
 * never poll, so they stay alive only while heartbeat_timeout is long. */
int srv_add_bench_nodes(srv *s, int n, const char *gpu_type, int gpus);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
