/* The server's storage layer: one small interface, two engines.
 *
 * db.c holds every SQL statement the server runs and maps rows to the
 * in-memory model; an engine (db_sqlite.c, db_pg.c) only connects,
 * creates or migrates its schema, runs a statement with bound arguments and
 * hands back rows.  The statements are written in the SQL both engines
 * accept: "$N" parameters numbered in order of first use, upserts as
 * "ON CONFLICT ... DO UPDATE", and a CAST on a parameter that stands alone.
 *
 * Every function runs with s->mu held (or before the server is shared): an
 * engine has one connection and no lock of its own.  Errors come back as
 * SH_EIO with a message naming the database and the statement's purpose. */
#ifndef SHOAL_SRV_DB_INT_H
#define SHOAL_SRV_DB_INT_H

#include <stdarg.h>
#include <stdint.h>

#include "srv_int.h"

typedef struct srv srv;
typedef struct srv_row srv_row; /* one row of a query, valid inside its callback */

/* Called once per row; a negative return stops the query with that code. */
typedef int (*srv_row_fn)(srv *s, srv_row *r, void *arg);

typedef struct srv_store_ops {
    const char *name;         /* "sqlite" or "postgresql" */
    const char *nodes_order;  /* the column that keeps nodes in registration order */
    /* Connects and creates or migrates the schema; close accepts a store
     * that never opened. */
    int (*open)(srv *s);
    void (*close)(srv *s);
    int (*begin)(srv *s);
    /* On failure the transaction is over (rolled back) either way. */
    int (*commit)(srv *s);
    void (*rollback)(srv *s);
    int (*in_tx)(srv *s); /* 1: a transaction is open */
    /* Runs one statement; types has one letter per argument: i int64_t,
     * d double, t const char * (never NULL).  sql must be a string literal:
     * engines cache the prepared statement by its address. */
    int (*run)(srv *s, const char *sql, const char *types, va_list ap);
    int (*query)(srv *s, const char *sql, const char *types, srv_row_fn fn, void *arg, va_list ap);
    const char *(*text)(srv_row *r, int col); /* "" for NULL */
    int64_t (*i64)(srv_row *r, int col);      /* 0 for NULL */
    double (*dbl)(srv_row *r, int col);       /* 0 for NULL */
} srv_store_ops;

extern const srv_store_ops srv__store_sqlite, srv__store_pg;

/* 1 if the --db value names a PostgreSQL database (postgresql:// or
 * postgres:// URL, or a libpq "key=value" string). */
int srv__store_is_pg(const char *db);

/* PostgreSQL only (db_pg.c), for the leader election of leader.c. */
int srv__pg_try_lead(srv *s, int *got);      /* pg_try_advisory_lock on this session */
int srv__pg_take_epoch(srv *s, const char *url, int64_t *epoch, double *wait_s);
int srv__pg_renew(srv *s, int64_t epoch, double lease_s);
int srv__pg_leader(srv *s, char *url, size_t cap, int64_t *epoch);
int srv__pg_backend_pid(srv *s);

/* The rows: what db.c writes and reads for the layers above, and the
 * leader election of leader.c. */
int srv__db_open(srv *s);
int srv__db_autocommit(srv *s); /* 1: no transaction is open */
void srv__db_close(srv *s);
/* Loads runs, nodes, jobs and members; each job row goes to `job`
 * (srv__job_from_row), which builds the job. */
int srv__db_load(srv *s, int (*job)(srv *s, const srv_job_row *row));
int srv__db_node(srv *s, const srv_node *n);
int srv__db_job(srv *s, const srv_job *j);
int srv__db_members(srv *s, const srv_job *j);
int srv__db_event(srv *s, int64_t job, const char *node, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int srv__db_ledger(srv *s, const srv_bill *b);
int srv__db_tenants(srv *s);
int srv__db_begin(srv *s);
/* The engine's commit and rollback only: the files above the seam use
 * srv__commit and srv__rollback, which also settle the core's bills. */
int srv__db_commit(srv *s);
void srv__db_rollback(srv *s);
json_t *srv__db_events(srv *s, int64_t after, const char *tenant, int64_t job, int limit);
json_t *srv__db_costs(srv *s, const char *tenant);
/* The job tenant submitted under Idempotency-Key key (0: none). */
int64_t srv__db_idem(srv *s, const char *tenant, const char *key);
void srv__db_job_cost(srv *s, int64_t job, double *dollars, double *gpu_s);
/* leader.c: one leader among the servers of a PostgreSQL database */
int srv__lead_try(srv *s, int *got);      /* one round of a standby's election */
int srv__lead_claim(srv *s);              /* fences, takes the lease; s->mu held on success */
void srv__lead_wait(srv *s, double seconds); /* sleeps, cut short by srv_stop */
void srv__lead_renew(srv *s, double now); /* scheduler thread, s->mu held */
int srv__lead_acting(srv *s);             /* 1: it leads and its lease holds */
json_t *srv__leader_json(srv *s);         /* GET /v1/leader */
int srv__db_run(srv *s, const char *tenant, const char *name, const char *secret, const char *token);
int srv__db_run_service(srv *s, const char *tenant, const char *run, const char *name, const char *value, int64_t job);

#endif
