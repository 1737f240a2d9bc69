/* Helpers for the control-plane tests: a real server and real agents
 * started from $SHOAL_BIN on loopback, and JSON calls to the API. */
#ifndef SHOAL_TESTS_FLEET_UTIL_H
#define SHOAL_TESTS_FLEET_UTIL_H

#include <sys/types.h>

#include "testutil.h"
#include "shoal/client.h"
#include "shoal/server.h"

/* Tokens every test fleet uses. */
#define TF_ADMIN "tok-admin"
#define TF_AGENT "tok-agent"
#define TF_ALICE "tok-alice"
#define TF_BOB "tok-bob"

typedef struct tf_fleet {
    char dir[4096], url[64];
    int port;
    double hb;
    pid_t server;
    int nagents;
    pid_t agents[16];
    char names[16][32];
    char extra[512]; /* extra server options */
    char agent_extra[256]; /* extra agent options (e.g. "--sandbox gvisor") */
    uid_t agent_uid[16];   /* agent i runs as this uid when not 0 (a test run as root) */
    char agent_work[16][512]; /* agent i's --work-dir when set; else DIR/work */
} tf_fleet;

/* Starts a server in tu_path(name) with a heartbeat timeout of hb seconds. */
void tf_start_server(tf_fleet *f, const char *name, double hb);
/* Starts the server again on the same port and database (after a kill). */
void tf_restart_server(tf_fleet *f);
/* Starts agent i as node "n<i>" and waits until the server lists it alive. */
void tf_start_agent(tf_fleet *f, int i, const char *gpu_type, int gpus, const char *zone, const char *fabric);
/* Starts agents 0..n-1 (nodes "n0".."n<n-1>") together and waits until the
 * server lists them all alive. */
void tf_start_agents(tf_fleet *f, int n, const char *gpu_type, int gpus, const char *zone, const char *fabric);
/* The two halves of tf_start_agents, for starting several fleets at once. */
void tf_spawn_agents(tf_fleet *f, int n, const char *gpu_type, int gpus, const char *zone, const char *fabric);
void tf_wait_agents(tf_fleet *f, int n);
/* Starts argv (argv[0] a path) with stdout and stderr appended to `out`;
 * the process is stopped by tf_kill_all() and dies with the test. */
pid_t tf_spawn(const char *out, char *const argv[]);
/* tf_spawn, the process running as uid and gid `uid` with no supplementary
 * groups (the caller must be root). */
pid_t tf_spawn_as(const char *out, uid_t uid, char *const argv[]);
/* Stops every process any fleet of this binary started (for teardowns). */
void tf_kill_all(void);
/* A cmocka teardown that calls tf_kill_all(). */
int tf_teardown(void **state);
/* Stops every process of the fleet (SIGTERM, then SIGKILL) and reaps them. */
void tf_stop(tf_fleet *f);
/* One API call; returns the parsed reply (caller decrefs; NULL if not JSON). */
json_t *tf_call(tf_fleet *f, const char *token, const char *method, const char *path, const char *body, int *status);
/* Submits a job as `token`; asserts 201 and returns the job id. */
int64_t tf_submit(tf_fleet *f, const char *token, const char *body);
/* Waits until job id reaches `state` (asserts within timeout); returns the job. */
json_t *tf_wait_job(tf_fleet *f, int64_t id, const char *state, double timeout);
/* Rank 0's whole log, every page of it (caller frees). */
char *tf_job_log(tf_fleet *f, int64_t id);
/* Waits until job id has ended (succeeded or failed) and returns rank 0's
 * log (caller frees).  With ended NULL the job must end within timeout;
 * else *ended says whether it did, and the log so far is returned. */
char *tf_wait_log(tf_fleet *f, int64_t id, double timeout, int *ended);
/* Waits until `n` nodes are alive. */
void tf_wait_alive(tf_fleet *f, int n, double timeout);
/* The node of `rank` in a job JSON. */
const char *tf_member_node(json_t *job, int rank);
/* Index of the agent for node name, or -1. */
int tf_agent_of(tf_fleet *f, const char *node);

#endif
