/* shoal fleet: a whole local fleet on this machine -- the server in this
 * process and one agent process per node of a fleet file, with declared GPU
 * types (no GPUs needed).  What `shoal up` and `shoal run` start
 * (src/control/fleet/localfleet.c).
 *
 * The state folder is the database's: it holds tokens.json (made when
 * missing, mode 0600: an admin, an agent and a tenant "default" token), env
 * (exports SHOAL_SERVER and SHOAL_TOKEN for the tenant), work/ (the agents'
 * work folders) and up.lock (one fleet per folder).
 *
 * Two steps, so that `shoal up -d` can fork between them (a fork does not
 * carry the server's threads): fleet_prepare makes the folder, takes the
 * lock and the tokens; fleet_launch starts the server and the agents and
 * waits for them to register.  fleet_start does both.  A step that fails
 * removes what it made (the folder when it made it, else new tokens and
 * database files) and sets sh_errmsg(). */
#ifndef SHOAL_FLEET_H
#define SHOAL_FLEET_H

#include "shoal/server.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

typedef struct fleet_opts {
    const char *fleet_csv; /* the nodes (docs/fleet-format.md); required */
    srv_config server;     /* server.db_path required; server.tokens_path NULL: DIR/tokens.json */
    const char *sandbox;   /* the agents' --sandbox (NULL: "auto") */
    const char *exe;       /* the shoal-core the agents run (NULL: /proc/self/exe) */
    const char *agent_log; /* the agents' output, appended (NULL: this process's) */
    double register_s;     /* fleet_launch waits this long for every agent (0: 20) */
} fleet_opts;

typedef struct fleet fleet;

/* The state folder, lock and tokens.  The caller owns *out (fleet_stop). */
int fleet_prepare(const fleet_opts *o, fleet **out);
/* The lock file's descriptor (its pid can be rewritten by a child that takes
 * over) and the state folder. */
int fleet_lock_fd(const fleet *f);
const char *fleet_dir(const fleet *f);
/* The server, the agents, DIR/env; then waits for the agents.  0 also when
 * some did not register in time: fleet_registered says how many did. */
int fleet_launch(fleet *f);
int fleet_start(const fleet_opts *o, fleet **out);
/* "http://127.0.0.1:PORT"; a token by role: "admin", "agent", or a tenant's
 * name ("default").  NULL before fleet_launch or for an unknown name. */
const char *fleet_url(const fleet *f);
const char *fleet_token(const fleet *f, const char *who);
const char *fleet_tokens_path(const fleet *f);
const char *fleet_env_path(const fleet *f);
int fleet_nodes(const fleet *f);
int fleet_registered(const fleet *f); /* -1: the server could not be asked */
/* Reaps agents that ended (a killed node stays dead, as on a real fleet). */
void fleet_reap(fleet *f);
/* Stops the agents (SIGTERM, waited for; they end their ranks), then the
 * server, and frees f.  NULL: nothing. */
void fleet_stop(fleet *f);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
