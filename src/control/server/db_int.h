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

#endif
