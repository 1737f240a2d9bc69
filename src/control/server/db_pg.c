/* The PostgreSQL engine of the storage layer (db_int.h), over libpq.
 *
 * One connection per server.  The leader's connection is also its claim to
 * lead (leader.c): it holds a session-level advisory lock, and every
 * transaction it opens first checks the fencing epoch (shoal_fence), so that
 * a server deposed by another cannot commit a late write even through a new
 * session.  A commit is acknowledged only when PostgreSQL answered COMMIT
 * (an aborted transaction's COMMIT answers ROLLBACK, which is a failure).
 *
 * The schema is created and migrated here: migrations[] below, applied in
 * order under a transaction-level advisory lock, the version recorded in
 * shoal_schema, so that two servers starting together migrate once. */
#include "srv_int.h"
#include "db_int.h"

#include <libpq-fe.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Advisory lock keys: the leader's (held for the session) and the one that
 * serialises migrations ("shoal" in ASCII, then 1 and 2). */
#define PG_KEY_LEADER 0x73686f616c01LL
#define PG_KEY_MIGRATE 0x73686f616c02LL

/* Each entry is one schema version; never edit one that has shipped: add
 * the next.  Version 1 is the SQLite schema in PostgreSQL's types, plus
 * nodes.ord (registration order, SQLite's rowid) and the leader row. */
static const char *const migrations[] = {
    "CREATE TABLE nodes(name TEXT PRIMARY KEY, gpu_type TEXT, gpus BIGINT, zone TEXT, fabric TEXT,"
    " addr TEXT, price DOUBLE PRECISION, state BIGINT, from_provider BIGINT, sandbox TEXT, cred TEXT,"
    " ord BIGSERIAL);"
    "CREATE TABLE jobs(id BIGINT PRIMARY KEY, tenant TEXT, name TEXT, idem TEXT, kind BIGINT,"
    " state BIGINT, policy BIGINT, attempt BIGINT, max_attempts BIGINT, priority BIGINT,"
    " exit_code BIGINT, reason TEXT, spec TEXT, t_submit DOUBLE PRECISION, t_start DOUBLE PRECISION,"
    " t_end DOUBLE PRECISION, go BIGINT, prefer TEXT, nodes BIGINT, min_nodes BIGINT,"
    " gpus_per_node BIGINT, failures BIGINT);"
    "CREATE UNIQUE INDEX jobs_idem ON jobs(tenant, idem) WHERE idem != '';"
    "CREATE TABLE members(job BIGINT, rank BIGINT, node TEXT, state BIGINT, exit_code BIGINT,"
    " gpu_mask BIGINT, t_start DOUBLE PRECISION, t_end DOUBLE PRECISION, t_placed DOUBLE PRECISION,"
    " PRIMARY KEY(job, rank));"
    "CREATE TABLE events(id BIGSERIAL PRIMARY KEY, t DOUBLE PRECISION, job BIGINT, tenant TEXT,"
    " node TEXT, kind TEXT, msg TEXT);"
    "CREATE TABLE ledger(id BIGSERIAL PRIMARY KEY, tenant TEXT, job BIGINT, attempt BIGINT, rank BIGINT,"
    " node TEXT, gpu_type TEXT, gpus BIGINT, t_start DOUBLE PRECISION, t_end DOUBLE PRECISION,"
    " cost DOUBLE PRECISION, seconds DOUBLE PRECISION);"
    "CREATE TABLE tenants(name TEXT PRIMARY KEY, num BIGINT UNIQUE);"
    "CREATE TABLE shoal_leader(id INT PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, url TEXT NOT NULL,"
    " since DOUBLE PRECISION NOT NULL, lease_until DOUBLE PRECISION NOT NULL);"
    "INSERT INTO shoal_leader VALUES(1, 0, '', 0, 0);"
    "CREATE FUNCTION shoal_fence(e BIGINT) RETURNS VOID AS $f$ BEGIN"
    "  IF (SELECT epoch FROM shoal_leader WHERE id = 1) <> e THEN"
    "    RAISE EXCEPTION 'shoal: the leader of epoch % has been deposed: this server may not write', e;"
    "  END IF; END $f$ LANGUAGE plpgsql;",
    /* 2: a run's secret and its jobs' services (runs.c) */
    "CREATE TABLE runs(tenant TEXT, name TEXT, secret TEXT, token TEXT, t DOUBLE PRECISION,"
    " PRIMARY KEY(tenant, name));"
    "CREATE TABLE run_services(tenant TEXT, run TEXT, name TEXT, value TEXT, job BIGINT,"
    " t DOUBLE PRECISION, PRIMARY KEY(tenant, run, name));",
};

typedef struct pgc {
    PGconn *c;
    const char *sql[64]; /* prepared statement i is named "s<gen>_<i>" */
    int nsql, gen;
    int pipe;    /* a transaction is open */
    int started; /* ... and its BEGIN was sent (libpq's pipeline mode) */
} pgc;

struct srv_row { PGresult *res; int row; };

static PGconn *pg__c(srv *s) { return ((pgc *)s->db)->c; }

/* libpq's message without its trailing newline. */
static int pg__fail(srv *s, const char *what, const PGresult *res)
{
    char m[600];
    const char *e = res ? PQresultErrorMessage(res) : "";
    if (!*e) e = PQerrorMessage(pg__c(s));
    snprintf(m, sizeof m, "%s", *e ? e : "unknown error");
    for (size_t n = strlen(m); n && (m[n - 1] == '\n' || m[n - 1] == ' '); n--) m[n - 1] = 0;
    if (PQstatus(pg__c(s)) == CONNECTION_BAD)
        return sh_err(SH_EIO, "%s: %s: the database connection is lost: %s", s->db_name, what, m);
    return sh_err(SH_EIO, "%s: %s: %s", s->db_name, what, m);
}

/* Runs fixed SQL (no parameters); SH_OK if it gave `want`. */
static int pg__exec(srv *s, const char *sql, ExecStatusType want, const char *what)
{
    PGresult *r = PQexec(pg__c(s), sql);
    int rc = PQresultStatus(r) == want ? SH_OK : pg__fail(s, what, r);
    PQclear(r);
    return rc;
}

static int pg__migrate(srv *s)
{
    char sql[200];
    snprintf(sql, sizeof sql, "BEGIN; SELECT pg_advisory_xact_lock(%lld);"
                              " CREATE TABLE IF NOT EXISTS shoal_schema(version INT NOT NULL);", PG_KEY_MIGRATE);
    SH_TRY(pg__exec(s, sql, PGRES_COMMAND_OK, "schema"));
    PGresult *r = PQexec(pg__c(s), "SELECT COALESCE(MAX(version), 0) FROM shoal_schema");
    int rc = PQresultStatus(r) == PGRES_TUPLES_OK ? SH_OK : pg__fail(s, "schema version", r);
    int have = rc == SH_OK ? atoi(PQgetvalue(r, 0, 0)) : 0, want = (int)(sizeof migrations / sizeof *migrations);
    PQclear(r);
    if (rc == SH_OK && have > want)
        rc = sh_err(SH_EFORMAT, "%s: the schema is version %d, newer than this shoal's %d: upgrade shoal",
                    s->db_name, have, want);
    for (int v = have; rc == SH_OK && v < want; v++) {
        rc = pg__exec(s, migrations[v], PGRES_COMMAND_OK, "schema migration");
        snprintf(sql, sizeof sql, "INSERT INTO shoal_schema VALUES(%d)", v + 1);
        if (rc == SH_OK) rc = pg__exec(s, sql, PGRES_COMMAND_OK, "schema version");
        if (rc < 0) sh_err_wrap(rc, "migrating to schema version %d", v + 1);
    }
    if (rc == SH_OK) return pg__exec(s, "COMMIT", PGRES_COMMAND_OK, "schema commit");
    PQclear(PQexec(pg__c(s), "ROLLBACK"));
    return rc;
}

static int pg_open(srv *s)
{
    pgc *p = calloc(1, sizeof *p);
    if (!p) return sh_err(SH_ENOMEM, "%s", s->db_name);
    s->db = p;
    char app[64];
    snprintf(app, sizeof app, "shoal server %d", (int)getpid());
    /* Keepalives notice a database host that vanished without closing the
     * connection; connect_timeout bounds a start against a dead one. */
    const char *const keys[] = {"dbname", "application_name", "connect_timeout", "keepalives_idle",
                                "keepalives_interval", "keepalives_count", NULL};
    const char *const vals[] = {s->cfg.db_path, app, "5", "5", "2", "2", NULL};
    p->c = PQconnectdbParams(keys, vals, 1);
    if (!p->c) return sh_err(SH_ENOMEM, "%s: connecting", s->db_name);
    if (PQstatus(p->c) != CONNECTION_OK) {
        char m[600];
        snprintf(m, sizeof m, "%s", PQerrorMessage(p->c));
        for (char *nl; (nl = strchr(m, '\n'));) *nl = nl[1] ? ' ' : 0;
        return sh_err(SH_EIO, "%s: cannot connect (check --db, the database server and its pg_hba.conf): %s",
                      s->db_name, m);
    }
    /* As SQLite's synchronous=NORMAL, by default a commit is acknowledged
     * once PostgreSQL has it, before its WAL is flushed: a killed shoal
     * server loses nothing and neither does a clean restart of the
     * database, but a crash of the database's host may lose the last
     * fraction of a second (wal_writer_delay).  One flush per commit
     * capped submits near 100/s on a plain disk.  --sync-full waits for
     * the flush (and for synchronous replicas: synchronous_standby_names). */
    SH_TRY(pg__exec(s, s->cfg.sync_full ? "SET synchronous_commit = on" : "SET synchronous_commit = off",
                    PGRES_COMMAND_OK, "settings"));
    SH_TRY(pg__exec(s, "SET client_min_messages = warning", PGRES_COMMAND_OK, "settings"));
    return pg__migrate(s);
}

static void pg_close(srv *s)
{
    pgc *p = s->db;
    if (!p) return;
    PQfinish(p->c);
    free(p);
    s->db = NULL;
}

/* Transactions run in libpq's pipeline mode: BEGIN, the fence and every
 * write are sent without waiting, and their results are read at the
 * commit (or before a read inside the transaction), so that a submit costs
 * one round trip to the database instead of five.  A write that failed
 * fails the commit, which the callers treat as any failed commit: the
 * change is taken back in memory too. */

/* Sends a sync and reads every result up to it.  Returns the first error;
 * *keep (may be NULL) gets the last rows returned, status the last
 * command's tag. */
static int pg__drain(srv *s, PGresult **keep, char *status, size_t cap)
{
    pgc *p = s->db;
    int rc = PQpipelineSync(p->c) == 1 ? SH_OK : pg__fail(s, "sync", NULL), nulls = 0;
    while (rc == SH_OK || PQstatus(p->c) == CONNECTION_OK) {
        PGresult *r = PQgetResult(p->c);
        if (!r) {
            if (++nulls > 1 || PQstatus(p->c) == CONNECTION_BAD) {
                if (rc == SH_OK) rc = pg__fail(s, "reading results", NULL);
                break;
            }
            continue;
        }
        nulls = 0;
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            break;
        }
        if (st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR) {
            if (rc == SH_OK) rc = pg__fail(s, "statement", r);
        } else if (st != PGRES_PIPELINE_ABORTED && status) snprintf(status, cap, "%s", PQcmdStatus(r));
        if (st == PGRES_TUPLES_OK && keep) {
            PQclear(*keep);
            *keep = r;
        } else PQclear(r);
    }
    /* A statement the server skipped may have been a Parse: forget every
     * prepared name rather than trust one that may not exist. */
    if (rc < 0) p->nsql = 0, p->gen++;
    return rc;
}

static int pg__pipe_end(srv *s)
{
    pgc *p = s->db;
    p->pipe = p->started = 0;
    if (PQpipelineStatus(p->c) != PQ_PIPELINE_OFF && PQexitPipelineMode(p->c) != 1) {
        /* Results still unread (an error in the middle): drain, then leave. */
        pg__drain(s, NULL, NULL, 0);
        if (PQexitPipelineMode(p->c) != 1) return pg__fail(s, "leaving pipeline mode", NULL);
    }
    return SH_OK;
}

/* A transaction starts for PostgreSQL with its first statement, so that a
 * scheduling cycle that wrote nothing costs no round trip. */
static int pg_begin(srv *s)
{
    pgc *p = s->db;
    if (PQstatus(p->c) != CONNECTION_OK) return pg__fail(s, "begin", NULL);
    p->pipe = 1;
    p->started = 0;
    return SH_OK;
}

static int pg__start(srv *s)
{
    pgc *p = s->db;
    if (p->started) return SH_OK;
    if (PQenterPipelineMode(p->c) != 1) return pg__fail(s, "begin (pipeline mode)", NULL);
    p->started = 1;
    char e[32];
    snprintf(e, sizeof e, "%lld", (long long)s->epoch);
    const char *vals[] = {e};
    int ok = PQsendQueryParams(p->c, "BEGIN", 0, NULL, NULL, NULL, NULL, 0) == 1 &&
             (!s->epoch || PQsendQueryParams(p->c, "SELECT shoal_fence($1)", 1, NULL, vals, NULL, NULL, 0) == 1);
    if (ok) return SH_OK;
    int rc = pg__fail(s, "begin", NULL);
    pg__pipe_end(s);
    return rc;
}

static void pg_rollback(srv *s)
{
    pgc *p = s->db;
    if (p->pipe && !p->started) p->pipe = 0;
    if (p->pipe) {
        PQsendQueryParams(p->c, "ROLLBACK", 0, NULL, NULL, NULL, NULL, 0);
        pg__drain(s, NULL, NULL, 0);
        pg__pipe_end(s);
    }
    if (PQstatus(p->c) == CONNECTION_OK && PQtransactionStatus(p->c) != PQTRANS_IDLE)
        PQclear(PQexec(p->c, "ROLLBACK"));
}

/* Acknowledged only when PostgreSQL answered COMMIT: an aborted
 * transaction's COMMIT answers ROLLBACK, which is a failure here. */
static int pg_commit(srv *s)
{
    pgc *p = s->db;
    if (!p->pipe) return sh_err(SH_EIO, "%s: commit without a transaction", s->db_name);
    if (!p->started) {
        p->pipe = 0;
        return SH_OK;
    }
    char status[64] = "";
    int rc = PQsendQueryParams(p->c, "COMMIT", 0, NULL, NULL, NULL, NULL, 0) == 1 ? SH_OK : pg__fail(s, "commit", NULL);
    if (rc == SH_OK) rc = pg__drain(s, NULL, status, sizeof status);
    if (rc == SH_OK && strcmp(status, "COMMIT"))
        rc = sh_err(SH_EIO, "%s: commit: the transaction was rolled back (%s)", s->db_name, status);
    int e = pg__pipe_end(s);
    if (rc == SH_OK) rc = e;
    if (rc < 0) pg_rollback(s);
    return rc;
}

static int pg_in_tx(srv *s)
{
    pgc *p = s->db;
    PGTransactionStatusType t = PQtransactionStatus(p->c);
    return p->pipe || t == PQTRANS_INTRANS || t == PQTRANS_INERROR || t == PQTRANS_ACTIVE;
}

/* The name of sql's prepared statement, preparing it on first use (in a
 * pipeline: sending the Parse, whose result the next drain reads). */
static int pg__prepared(srv *s, const char *sql, char name[24])
{
    pgc *p = s->db;
    for (int i = 0; i < p->nsql; i++)
        if (p->sql[i] == sql) return snprintf(name, 24, "s%d_%d", p->gen, i), SH_OK;
    if (p->nsql == (int)(sizeof p->sql / sizeof *p->sql))
        return sh_err(SH_ERANGE, "%s: more statements than the cache holds", s->db_name);
    snprintf(name, 24, "s%d_%d", p->gen, p->nsql);
    if (p->pipe) {
        if (PQsendPrepare(p->c, name, sql, 0, NULL) != 1) return pg__fail(s, "prepare", NULL);
        p->sql[p->nsql++] = sql;
        return SH_OK;
    }
    PGresult *r = PQprepare(p->c, name, sql, 0, NULL);
    int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? SH_OK : pg__fail(s, "prepare", r);
    PQclear(r);
    if (rc == SH_OK) p->sql[p->nsql++] = sql;
    return rc;
}

/* Runs sql with its arguments as text: in a transaction it is only sent
 * (*out NULL, unless want_rows: then the pipeline is read up to it);
 * outside one it runs at once.  *out gets the rows (caller clears). */
static int pg__run(srv *s, const char *sql, const char *types, va_list ap, int want_rows, PGresult **out)
{
    pgc *p = s->db;
    char name[24];
    *out = NULL;
    if (p->pipe) SH_TRY(pg__start(s));
    SH_TRY(pg__prepared(s, sql, name));
    enum { MAXP = 24 };
    char buf[MAXP][32];
    const char *vals[MAXP];
    int n = 0;
    for (; types[n] && n < MAXP; n++) {
        if (types[n] == 'i') snprintf(buf[n], sizeof buf[n], "%lld", (long long)va_arg(ap, int64_t)), vals[n] = buf[n];
        else if (types[n] == 'd') snprintf(buf[n], sizeof buf[n], "%.17g", va_arg(ap, double)), vals[n] = buf[n];
        else vals[n] = va_arg(ap, const char *);
    }
    if (p->pipe) {
        if (PQsendQueryPrepared(p->c, name, n, vals, NULL, NULL, 0) != 1) return pg__fail(s, "statement", NULL);
        return want_rows ? pg__drain(s, out, NULL, 0) : SH_OK;
    }
    PGresult *r = PQexecPrepared(p->c, name, n, vals, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        int rc = pg__fail(s, "statement", r);
        PQclear(r);
        return rc;
    }
    *out = r;
    return SH_OK;
}

static int pg_run(srv *s, const char *sql, const char *types, va_list ap)
{
    PGresult *r = NULL;
    SH_TRY(pg__run(s, sql, types, ap, 0, &r));
    PQclear(r);
    return SH_OK;
}

static int pg_query(srv *s, const char *sql, const char *types, srv_row_fn fn, void *arg, va_list ap)
{
    PGresult *r = NULL;
    SH_TRY(pg__run(s, sql, types, ap, 1, &r));
    int rc = SH_OK, n = r ? PQntuples(r) : 0;
    srv_row row = {r, 0};
    for (int i = 0; rc == SH_OK && i < n; i++) {
        row.row = i;
        rc = fn(s, &row, arg);
    }
    PQclear(r);
    return rc;
}

static const char *pg_text(srv_row *r, int i) { return PQgetvalue(r->res, r->row, i); }
static int64_t pg_i64(srv_row *r, int i) { return strtoll(PQgetvalue(r->res, r->row, i), NULL, 10); }
static double pg_dbl(srv_row *r, int i) { return strtod(PQgetvalue(r->res, r->row, i), NULL); }

const srv_store_ops srv__store_pg = {
    .name = "postgresql", .nodes_order = "ord",
    .open = pg_open, .close = pg_close, .begin = pg_begin, .commit = pg_commit, .rollback = pg_rollback,
    .in_tx = pg_in_tx, .run = pg_run, .query = pg_query, .text = pg_text, .i64 = pg_i64, .dbl = pg_dbl,
};

/* ---- leader election (leader.c) ----------------------------------------- */

static int pg__one(srv *s, const char *sql, int nparams, const char *const *vals, PGresult **out)
{
    PGresult *r = PQexecParams(pg__c(s), sql, nparams, NULL, vals, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK) {
        int rc = pg__fail(s, "leader election", r);
        PQclear(r);
        return rc;
    }
    *out = r;
    return SH_OK;
}

int srv__pg_try_lead(srv *s, int *got)
{
    char sql[80];
    PGresult *r;
    snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock(%lld)", PG_KEY_LEADER);
    if (PQstatus(pg__c(s)) == CONNECTION_BAD) PQreset(pg__c(s)); /* a standby reconnects */
    SH_TRY(pg__one(s, sql, 0, NULL, &r));
    *got = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    return SH_OK;
}

/* Takes the next epoch (fencing out every earlier leader) and says how long
 * the last leader's lease still runs, by the database's clock. */
int srv__pg_take_epoch(srv *s, const char *url, int64_t *epoch, double *wait_s)
{
    PGresult *r;
    const char *vals[] = {url};
    SH_TRY(pg__one(s, "UPDATE shoal_leader SET epoch = epoch + 1, url = $1,"
                      " since = extract(epoch from clock_timestamp()) WHERE id = 1"
                      " RETURNING epoch, GREATEST(lease_until - extract(epoch from clock_timestamp()), 0)",
                   1, vals, &r));
    int ok = PQntuples(r) == 1;
    if (ok) *epoch = strtoll(PQgetvalue(r, 0, 0), NULL, 10), *wait_s = strtod(PQgetvalue(r, 0, 1), NULL);
    PQclear(r);
    return ok ? SH_OK : sh_err(SH_EIO, "%s: the leader row shoal_leader is missing", s->db_name);
}

int srv__pg_renew(srv *s, int64_t epoch, double lease_s)
{
    char e[32], l[32];
    snprintf(e, sizeof e, "%lld", (long long)epoch);
    snprintf(l, sizeof l, "%.3f", lease_s);
    const char *vals[] = {e, l};
    PGresult *r;
    SH_TRY(pg__one(s, "UPDATE shoal_leader SET lease_until = extract(epoch from clock_timestamp()) + $2"
                      " WHERE id = 1 AND epoch = $1", 2, vals, &r));
    int ok = !strcmp(PQcmdTuples(r), "1");
    PQclear(r);
    return ok ? SH_OK : sh_err(SH_EPERM, "%s: epoch %lld is no longer the leader's", s->db_name, (long long)epoch);
}

int srv__pg_leader(srv *s, char *url, size_t cap, int64_t *epoch)
{
    PGresult *r;
    if (PQstatus(pg__c(s)) == CONNECTION_BAD) PQreset(pg__c(s));
    SH_TRY(pg__one(s, "SELECT url, epoch, lease_until > extract(epoch from clock_timestamp())"
                      " FROM shoal_leader WHERE id = 1", 0, NULL, &r));
    int live = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 2), "t");
    snprintf(url, cap, "%s", live ? PQgetvalue(r, 0, 0) : "");
    *epoch = PQntuples(r) == 1 ? strtoll(PQgetvalue(r, 0, 1), NULL, 10) : 0;
    PQclear(r);
    return SH_OK;
}

int srv__pg_backend_pid(srv *s) { return s->db ? PQbackendPID(pg__c(s)) : 0; }
