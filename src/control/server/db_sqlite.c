/* The SQLite engine of the storage layer (db_int.h): one file beside the
 * server, the embedded default.
 *
 * WAL mode with synchronous=NORMAL survives a killed process (every commit is
 * in the WAL before the reply leaves); synchronous=FULL (--sync-full) also
 * survives a power cut at the cost of one fsync per commit.  The schema is in
 * docs/server-api.md ("State"). */
#include "srv_int.h"
#include "db_int.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const schema =
    "CREATE TABLE IF NOT EXISTS nodes(name TEXT PRIMARY KEY, gpu_type TEXT, gpus INTEGER,"
    " zone TEXT, fabric TEXT, addr TEXT, price REAL, state INTEGER, from_provider INTEGER,"
    " sandbox TEXT, cred TEXT);"
    "CREATE TABLE IF NOT EXISTS jobs(id INTEGER PRIMARY KEY, tenant TEXT, name TEXT, idem TEXT,"
    " kind INTEGER, state INTEGER, policy INTEGER, attempt INTEGER, max_attempts INTEGER,"
    " priority INTEGER, exit_code INTEGER, reason TEXT, spec TEXT, t_submit REAL, t_start REAL,"
    " t_end REAL, go INTEGER, prefer TEXT, nodes INTEGER, min_nodes INTEGER, gpus_per_node INTEGER,"
    " failures INTEGER);"
    "CREATE UNIQUE INDEX IF NOT EXISTS jobs_idem ON jobs(tenant, idem) WHERE idem != '';"
    "CREATE TABLE IF NOT EXISTS members(job INTEGER, rank INTEGER, node TEXT, state INTEGER,"
    " exit_code INTEGER, gpu_mask INTEGER, t_start REAL, t_end REAL, t_placed REAL,"
    " PRIMARY KEY(job, rank));"
    "CREATE TABLE IF NOT EXISTS events(id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL, job INTEGER,"
    " tenant TEXT, node TEXT, kind TEXT, msg TEXT);"
    "CREATE TABLE IF NOT EXISTS ledger(id INTEGER PRIMARY KEY, tenant TEXT, job INTEGER,"
    " attempt INTEGER, rank INTEGER, node TEXT, gpu_type TEXT, gpus INTEGER, t_start REAL,"
    " t_end REAL, cost REAL, seconds REAL);"
    "CREATE TABLE IF NOT EXISTS tenants(name TEXT PRIMARY KEY, num INTEGER UNIQUE);"
    "CREATE TABLE IF NOT EXISTS runs(tenant TEXT, name TEXT, secret TEXT, token TEXT, t REAL,"
    " PRIMARY KEY(tenant, name));"
    "CREATE TABLE IF NOT EXISTS run_services(tenant TEXT, run TEXT, name TEXT, value TEXT, job INTEGER,"
    " t REAL, PRIMARY KEY(tenant, run, name));";

/* Columns added since the first schema: a database written before them
 * gets them (NULL in old rows, which readers treat as unknown). */
static const char *const added[][3] = {
    {"members", "t_placed", "REAL"},
    {"ledger", "seconds", "REAL"},
    {"nodes", "cred", "TEXT"},
};

typedef struct sq {
    sqlite3 *db;
    struct { const char *sql; sqlite3_stmt *st; } stmts[64];
    int nstmts;
} sq;

struct srv_row { sqlite3_stmt *st; };

static sqlite3 *sq__db(srv *s) { return ((sq *)s->db)->db; }

static int sq__fail(srv *s, const char *what)
{
    return sh_err(SH_EIO, "%s: %s: %s", s->db_name, what, sqlite3_errmsg(sq__db(s)));
}

/* Creates the database file 0600 before SQLite opens it (SQLite gives its
 * WAL and shared-memory files the database's mode), and tightens the
 * files of an older, laxer install. */
static int sq__private(srv *s)
{
    static const char *const sfx[] = {"", "-wal", "-shm", NULL};
    for (int i = 0; sfx[i]; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s%s", s->cfg.db_path, sfx[i]);
        int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 && (i == 0 || errno != ENOENT))
            return sh_err_errno(errno, "%s: cannot create the database (check the --db path)", p);
        if (fd >= 0 && fchmod(fd, 0600) < 0) {
            close(fd);
            return sh_err_errno(errno, "chmod 600 %s", p);
        }
        if (fd >= 0) close(fd);
        if (i == 0) break; /* the others appear with the mode of the first */
    }
    return SH_OK;
}

static int sq_open(srv *s)
{
    SH_TRY(sq__private(s));
    sq *q = calloc(1, sizeof *q);
    if (!q) return sh_err(SH_ENOMEM, "%s", s->db_name);
    s->db = q;
    if (sqlite3_open_v2(s->cfg.db_path, &q->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL))
        return sh_err(SH_EIO, "%s: cannot open the database: %s (check the --db path)", s->db_name,
                      q->db ? sqlite3_errmsg(q->db) : "out of memory");
    sqlite3_busy_timeout(q->db, 5000);
    char *err = NULL;
    const char *pragmas = s->cfg.sync_full ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                                           : "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=16384;";
    if (sqlite3_exec(q->db, pragmas, NULL, NULL, &err) || sqlite3_exec(q->db, schema, NULL, NULL, &err)) {
        int rc = sh_err(SH_EIO, "%s: %s", s->db_name, err ? err : "cannot set up the schema");
        sqlite3_free(err);
        return rc;
    }
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++) {
        char sql[160];
        snprintf(sql, sizeof sql, "SELECT %s FROM %s LIMIT 0", added[i][1], added[i][0]);
        if (sqlite3_exec(q->db, sql, NULL, NULL, NULL) == SQLITE_OK) continue;
        snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN %s %s", added[i][0], added[i][1], added[i][2]);
        if (sqlite3_exec(q->db, sql, NULL, NULL, &err)) {
            int rc = sh_err(SH_EIO, "%s: %s: %s", s->db_name, sql, err ? err : "failed");
            sqlite3_free(err);
            return rc;
        }
    }
    return SH_OK;
}

static void sq_close(srv *s)
{
    sq *q = s->db;
    if (!q) return;
    for (int i = 0; i < q->nstmts; i++) sqlite3_finalize(q->stmts[i].st);
    sqlite3_close(q->db);
    free(q);
    s->db = NULL;
}

static int sq_begin(srv *s)
{
    return sqlite3_exec(sq__db(s), "BEGIN IMMEDIATE", NULL, NULL, NULL) ? sq__fail(s, "begin") : SH_OK;
}

static int sq_commit(srv *s)
{
    int rc = sqlite3_exec(sq__db(s), "COMMIT", NULL, NULL, NULL) ? sq__fail(s, "commit") : SH_OK;
    /* A commit that failed without ending the transaction (SQLITE_BUSY)
     * is rolled back here, so that its rows cannot commit later beside
     * the ones written again. */
    if (rc < 0 && !sqlite3_get_autocommit(sq__db(s))) sqlite3_exec(sq__db(s), "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

static void sq_rollback(srv *s) { sqlite3_exec(sq__db(s), "ROLLBACK", NULL, NULL, NULL); }

static int sq_in_tx(srv *s) { return !sqlite3_get_autocommit(sq__db(s)); }

/* Prepared statements, cached by the address of their (literal) SQL text:
 * preparing the wide job INSERT on every submit cost as much as running it. */
static sqlite3_stmt *sq__stmt(srv *s, const char *sql)
{
    sq *q = s->db;
    for (int i = 0; i < q->nstmts; i++)
        if (q->stmts[i].sql == sql) return q->stmts[i].st;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v3(q->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL)) return NULL;
    if (q->nstmts < (int)(sizeof q->stmts / sizeof q->stmts[0])) {
        q->stmts[q->nstmts].sql = sql;
        q->stmts[q->nstmts++].st = st;
    }
    return st;
}

static void sq__bind(sqlite3_stmt *st, const char *types, va_list ap)
{
    for (int i = 0; types[i]; i++) {
        if (types[i] == 'i') sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
        else if (types[i] == 'd') sqlite3_bind_double(st, i + 1, va_arg(ap, double));
        else sqlite3_bind_text(st, i + 1, va_arg(ap, const char *), -1, SQLITE_TRANSIENT);
    }
}

/* Releases a statement: cached ones are reset for their next use. */
static void sq__done(srv *s, sqlite3_stmt *st)
{
    sq *q = s->db;
    for (int i = 0; i < q->nstmts; i++)
        if (q->stmts[i].st == st) {
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
            return;
        }
    sqlite3_finalize(st);
}

static int sq_run(srv *s, const char *sql, const char *types, va_list ap)
{
    sqlite3_stmt *st = sq__stmt(s, sql);
    if (!st) return sq__fail(s, "prepare");
    sq__bind(st, types, ap);
    int rc = sqlite3_step(st);
    int ok = rc == SQLITE_DONE || rc == SQLITE_ROW;
    if (!ok) rc = sq__fail(s, "write");
    sq__done(s, st);
    return ok ? SH_OK : rc;
}

static int sq_query(srv *s, const char *sql, const char *types, srv_row_fn fn, void *arg, va_list ap)
{
    sqlite3_stmt *st = sq__stmt(s, sql);
    if (!st) return sq__fail(s, "prepare");
    sq__bind(st, types, ap);
    srv_row r = {st};
    int rc = SH_OK, step;
    while (rc == SH_OK && (step = sqlite3_step(st)) == SQLITE_ROW) rc = fn(s, &r, arg);
    if (rc == SH_OK && step != SQLITE_DONE) rc = sq__fail(s, "read");
    sq__done(s, st);
    return rc;
}

static const char *sq_text(srv_row *r, int i)
{
    const char *t = (const char *)sqlite3_column_text(r->st, i);
    return t ? t : "";
}

static int64_t sq_i64(srv_row *r, int i) { return sqlite3_column_int64(r->st, i); }
static double sq_dbl(srv_row *r, int i) { return sqlite3_column_double(r->st, i); }

const srv_store_ops srv__store_sqlite = {
    .name = "sqlite", .nodes_order = "rowid",
    .open = sq_open, .close = sq_close, .begin = sq_begin, .commit = sq_commit, .rollback = sq_rollback,
    .in_tx = sq_in_tx, .run = sq_run, .query = sq_query, .text = sq_text, .i64 = sq_i64, .dbl = sq_dbl,
};
