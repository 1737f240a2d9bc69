/* SQLite state of the server: the durable copy of the in-memory model.
 *
 * WAL mode with synchronous=NORMAL survives a killed process (every commit is
 * in the WAL before the reply leaves); synchronous=FULL (--sync-full) also
 * survives a power cut at the cost of one fsync per commit.  The schema is in
 * docs/server-api.md ("State"). */
#include "srv_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string.h>

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
    "CREATE TABLE IF NOT EXISTS tenants(name TEXT PRIMARY KEY, num INTEGER UNIQUE);";

/* Columns added since the first schema: a database written before them
 * gets them (NULL in old rows, which readers treat as unknown). */
static const char *const added[][3] = {
    {"members", "t_placed", "REAL"},
    {"ledger", "seconds", "REAL"},
};

static int db__fail(srv *s, const char *what)
{
    return sh_err(SH_EIO, "%s: %s: %s", s->cfg.db_path, what, sqlite3_errmsg(s->db));
}

/* Creates the database file 0600 before SQLite opens it (SQLite gives its
 * WAL and shared-memory files the database's mode), and tightens the
 * files of an older, laxer install. */
static int db__private(srv *s)
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

int srv__db_open(srv *s)
{
    SH_TRY(db__private(s));
    if (sqlite3_open_v2(s->cfg.db_path, &s->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL)) {
        int rc = sh_err(SH_EIO, "%s: cannot open the database: %s (check the --db path)",
                        s->cfg.db_path, s->db ? sqlite3_errmsg(s->db) : "out of memory");
        sqlite3_close(s->db);
        s->db = NULL;
        return rc;
    }
    sqlite3_busy_timeout(s->db, 5000);
    char *err = NULL;
    const char *pragmas = s->cfg.sync_full ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                                           : "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=16384;";
    if (sqlite3_exec(s->db, pragmas, NULL, NULL, &err) || sqlite3_exec(s->db, schema, NULL, NULL, &err)) {
        int rc = sh_err(SH_EIO, "%s: %s", s->cfg.db_path, err ? err : "cannot set up the schema");
        sqlite3_free(err);
        return rc;
    }
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++) {
        char sql[160];
        snprintf(sql, sizeof sql, "SELECT %s FROM %s LIMIT 0", added[i][1], added[i][0]);
        if (sqlite3_exec(s->db, sql, NULL, NULL, NULL) == SQLITE_OK) continue;
        snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN %s %s", added[i][0], added[i][1], added[i][2]);
        if (sqlite3_exec(s->db, sql, NULL, NULL, &err)) {
            int rc = sh_err(SH_EIO, "%s: %s: %s", s->cfg.db_path, sql, err ? err : "failed");
            sqlite3_free(err);
            return rc;
        }
    }
    /* Databases from before node credentials lack the column. */
    sqlite3_exec(s->db, "ALTER TABLE nodes ADD COLUMN cred TEXT", NULL, NULL, NULL);
    return SH_OK;
}

int srv__db_begin(srv *s)
{
    return sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) ? db__fail(s, "begin") : SH_OK;
}

/* The ledger rows a transaction wrote are the core's bills until it
 * commits: dropped from the core then, written again after a failure. */
int srv__db_commit(srv *s)
{
    int rc = sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) ? db__fail(s, "commit") : SH_OK;
    /* A commit that failed without ending the transaction (SQLITE_BUSY)
     * is rolled back here, so that its rows cannot commit later beside
     * the ones written again. */
    if (rc < 0 && !sqlite3_get_autocommit(s->db)) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    srv__seam_bills_end(s, rc == SH_OK);
    return rc;
}

void srv__db_rollback(srv *s)
{
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    srv__seam_bills_end(s, 0);
}

int srv__db_autocommit(srv *s) { return sqlite3_get_autocommit(s->db) != 0; }

/* Prepares sql (cached per statement text by SQLite's own prepare is cheap
 * enough at our rates) and binds the arguments described by `types`:
 * i int64, d double, t text. */
/* Prepared statements, cached by the address of their (literal) SQL text:
 * preparing the wide job INSERT on every submit cost as much as running it. */
static sqlite3_stmt *db__stmt(srv *s, const char *sql)
{
    for (int i = 0; i < s->nstmts; i++)
        if (s->stmts[i].sql == sql) return s->stmts[i].st;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL)) return NULL;
    if (s->nstmts < (int)(sizeof s->stmts / sizeof s->stmts[0])) {
        s->stmts[s->nstmts].sql = sql;
        s->stmts[s->nstmts++].st = st;
    }
    return st;
}

void srv__db_close(srv *s)
{
    for (int i = 0; i < s->nstmts; i++) sqlite3_finalize(s->stmts[i].st);
    s->nstmts = 0;
    sqlite3_close(s->db);
    s->db = NULL;
}

static int db__run(srv *s, const char *sql, const char *types, ...)
{
    sqlite3_stmt *st = db__stmt(s, sql);
    if (!st) return db__fail(s, "prepare");
    va_list ap;
    va_start(ap, types);
    for (int i = 0; types[i]; i++) {
        if (types[i] == 'i') sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
        else if (types[i] == 'd') sqlite3_bind_double(st, i + 1, va_arg(ap, double));
        else sqlite3_bind_text(st, i + 1, va_arg(ap, const char *), -1, SQLITE_TRANSIENT);
    }
    va_end(ap);
    int rc = sqlite3_step(st);
    int ok = rc == SQLITE_DONE || rc == SQLITE_ROW;
    if (!ok) rc = db__fail(s, "write");
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return ok ? SH_OK : rc;
}

int srv__db_node(srv *s, const srv_node *n)
{
    return db__run(s,
                   "INSERT OR REPLACE INTO nodes(name, gpu_type, gpus, zone, fabric, addr, price, state,"
                   " from_provider, sandbox, cred) VALUES(?,?,?,?,?,?,?,?,?,?,?)", "ttitttdiitt", n->name,
                   n->gpu_type, (int64_t)n->gpus, n->zone, n->fabric, n->addr, n->price,
                   (int64_t)n->state, (int64_t)n->from_provider, n->sandbox, n->cred);
}

int srv__db_job(srv *s, const srv_job *j)
{
    char *spec = json_dumps(j->spec, JSON_COMPACT | JSON_SORT_KEYS);
    json_t *pa = json_array();
    for (int i = 0; i < j->nprefer; i++) json_array_append_new(pa, json_integer(j->prefer[i]));
    char *prefer = json_dumps(pa, JSON_COMPACT);
    json_decref(pa);
    int rc = db__run(s,
                     "INSERT OR REPLACE INTO jobs VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     "itttiiiiiiittddditiiii", j->id, j->tenant, j->name, j->idem, (int64_t)j->kind,
                     (int64_t)j->state, (int64_t)j->policy, (int64_t)j->attempt,
                     (int64_t)j->max_attempts, (int64_t)j->priority, (int64_t)j->exit_code,
                     j->reason, spec ? spec : "{}", j->t_submit, j->t_start, j->t_end,
                     (int64_t)j->go, prefer ? prefer : "[]", (int64_t)j->nodes,
                     (int64_t)j->min_nodes, (int64_t)j->gpus_per_node, (int64_t)j->failures);
    free(spec);
    free(prefer);
    return rc;
}

int srv__db_members(srv *s, const srv_job *j)
{
    SH_TRY(db__run(s, "DELETE FROM members WHERE job=?", "i", j->id));
    for (int i = 0; i < j->nmem; i++) {
        const srv_member *m = &j->mem[i];
        SH_TRY(db__run(s, "INSERT INTO members(job, rank, node, state, exit_code, gpu_mask, t_start, t_end,"
                       " t_placed) VALUES(?,?,?,?,?,?,?,?,?)", "iitiiiddd", j->id,
                       (int64_t)m->rank, s->nodes[m->node].name, (int64_t)m->state,
                       (int64_t)m->exit_code, (int64_t)m->gpu_mask, m->t_start, m->t_end, m->t_placed));
    }
    return SH_OK;
}

int srv__db_event(srv *s, int64_t job, const char *node, const char *kind, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_job *j = job ? srv__job(s, job) : NULL;
    sh_debug("event %s job %lld node %s: %s", kind, (long long)job, node ? node : "-", msg);
    return db__run(s, "INSERT INTO events(t, job, tenant, node, kind, msg) VALUES(?,?,?,?,?,?)",
                   "ditttt", sh_now_wall(), job, j ? j->tenant : "", node ? node : "", kind, msg);
}

int srv__db_ledger(srv *s, const srv_bill *b)
{
    return db__run(s,
                   "INSERT INTO ledger(tenant, job, attempt, rank, node, gpu_type, gpus, t_start,"
                   " t_end, seconds, cost) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                   "tiiittidddd", b->tenant, b->job, (int64_t)b->attempt, (int64_t)b->rank, b->node,
                   b->gpu_type, (int64_t)b->gpus, b->t_start, b->t_end, b->seconds, b->cost);
}

static const char *col_text(sqlite3_stmt *st, int i)
{
    const char *t = (const char *)sqlite3_column_text(st, i);
    return t ? t : "";
}

static int db__load_nodes(srv *s)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "SELECT name, gpu_type, gpus, zone, fabric, addr, price, state, from_provider, sandbox, cred"
                           " FROM nodes ORDER BY rowid", -1, &st, NULL))
        return db__fail(s, "load nodes");
    int rc = SH_OK;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (s->nnodes == s->cap_nodes) {
            int cap = s->cap_nodes ? 2 * s->cap_nodes : 64;
            srv_node *nn = realloc(s->nodes, (size_t)cap * sizeof *nn);
            if (!nn) { rc = sh_err(SH_ENOMEM, "loading nodes"); break; }
            s->nodes = nn;
            s->cap_nodes = cap;
        }
        srv_node *n = &s->nodes[s->nnodes++];
        memset(n, 0, sizeof *n);
        snprintf(n->name, sizeof n->name, "%s", col_text(st, 0));
        snprintf(n->gpu_type, sizeof n->gpu_type, "%s", col_text(st, 1));
        n->gpus = sqlite3_column_int(st, 2);
        snprintf(n->zone, sizeof n->zone, "%s", col_text(st, 3));
        snprintf(n->fabric, sizeof n->fabric, "%s", col_text(st, 4));
        snprintf(n->addr, sizeof n->addr, "%s", col_text(st, 5));
        n->price = sqlite3_column_double(st, 6);
        n->state = sqlite3_column_int(st, 7);
        n->from_provider = sqlite3_column_int(st, 8);
        snprintf(n->sandbox, sizeof n->sandbox, "%s", col_text(st, 9));
        snprintf(n->cred, sizeof n->cred, "%s", col_text(st, 10));
        /* A node alive at the crash gets a fresh heartbeat window to poll the
         * restarted server before it is declared dead. */
        n->last_seen = sh_now_mono();
    }
    sqlite3_finalize(st);
    return rc;
}

static int db__load_members(srv *s)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "SELECT job, rank, node, state, exit_code, gpu_mask, t_start, t_end, t_placed"
                           " FROM members ORDER BY job, rank", -1, &st, NULL))
        return db__fail(s, "load members");
    while (sqlite3_step(st) == SQLITE_ROW) {
        srv_job *j = srv__job(s, sqlite3_column_int64(st, 0));
        int node = srv__node_find(s, col_text(st, 2));
        if (!j || node < 0) continue;
        srv_member *nm = realloc(j->mem, (size_t)(j->nmem + 1) * sizeof *nm);
        if (!nm) {
            sqlite3_finalize(st);
            return sh_err(SH_ENOMEM, "loading members");
        }
        j->mem = nm;
        srv_member *m = &j->mem[j->nmem++];
        m->rank = sqlite3_column_int(st, 1);
        m->node = node;
        m->state = sqlite3_column_int(st, 3);
        m->exit_code = sqlite3_column_int(st, 4);
        m->gpu_mask = (uint64_t)sqlite3_column_int64(st, 5);
        m->t_start = sqlite3_column_double(st, 6);
        m->t_end = sqlite3_column_double(st, 7);
        m->t_placed = sqlite3_column_double(st, 8); /* 0 (NULL) in older databases */
    }
    sqlite3_finalize(st);
    return SH_OK;
}

static int db__load_job(srv *s, sqlite3_stmt *st)
{
    json_t *spec = json_loads(col_text(st, 12), 0, NULL);
    /* Databases written before "zone" was refused may hold it; it never
     * affected placement, so dropping it keeps those jobs loadable. */
    if (json_is_object(spec)) json_object_del(spec, "zone");
    srv_job *j = NULL;
    int rc = srv__job_from_spec(spec, col_text(st, 1), &j);
    json_decref(spec);
    if (rc == SH_OK) j->spec_bytes = strlen(col_text(st, 12));
    if (rc < 0) return sh_err_wrap(rc, "%s: job %lld", s->cfg.db_path, (long long)sqlite3_column_int64(st, 0));
    j->id = sqlite3_column_int64(st, 0);
    snprintf(j->idem, sizeof j->idem, "%s", col_text(st, 3));
    j->state = sqlite3_column_int(st, 5);
    j->attempt = sqlite3_column_int(st, 7);
    j->exit_code = sqlite3_column_int(st, 10);
    snprintf(j->reason, sizeof j->reason, "%s", col_text(st, 11));
    j->t_submit = sqlite3_column_double(st, 13);
    j->t_start = sqlite3_column_double(st, 14);
    j->t_end = sqlite3_column_double(st, 15);
    j->go = sqlite3_column_int(st, 16);
    json_t *pa = json_loads(col_text(st, 17), 0, NULL);
    size_t i;
    json_t *v;
    json_array_foreach(pa, i, v) if (j->nprefer < 64) j->prefer[j->nprefer++] = (int)json_integer_value(v);
    json_decref(pa);
    j->nodes = sqlite3_column_int(st, 18);
    j->failures = sqlite3_column_int(st, 21);
    return srv__job_add(s, j);
}

int srv__db_load(srv *s)
{
    SH_TRY(db__load_nodes(s));
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "SELECT * FROM jobs ORDER BY id", -1, &st, NULL))
        return db__fail(s, "load jobs");
    int rc = SH_OK;
    while (rc == SH_OK && sqlite3_step(st) == SQLITE_ROW) rc = db__load_job(s, st);
    sqlite3_finalize(st);
    SH_TRY(rc);
    return db__load_members(s);
}

/* Numbers every tenant of the tokens file, "admin" and every tenant that
 * owns a job, keeping the numbers already given: a tenant's number (and so
 * the uid its members run as) never changes or passes to another. */
int srv__db_tenants(srv *s)
{
    json_t *names = json_array();
    const char *k;
    json_t *v;
    json_array_append_new(names, json_string("admin"));
    json_object_foreach(json_object_get(s->tokens, "tenants"), k, v) json_array_append_new(names, json_string(k));
    for (int64_t id = 1; id <= s->njobs; id++)
        if (s->jobs[id]) json_array_append_new(names, json_string(s->jobs[id]->tenant));
    int rc = SH_OK;
    size_t i;
    json_array_foreach(names, i, v) if (rc == SH_OK)
        rc = db__run(s, "INSERT OR IGNORE INTO tenants(name, num) VALUES(?, (SELECT COALESCE(MAX(num), 0) + 1 FROM tenants))",
                     "t", json_string_value(v));
    json_decref(names);
    SH_TRY(rc);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "SELECT name, num FROM tenants", -1, &st, NULL)) return db__fail(s, "load tenants");
    json_decref(s->tenant_num);
    s->tenant_num = json_object();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_object_set_new(s->tenant_num, col_text(st, 0), json_integer(sqlite3_column_int64(st, 1)));
    sqlite3_finalize(st);
    return SH_OK;
}

json_t *srv__db_events(srv *s, int64_t after, const char *tenant, int64_t job, int limit)
{
    sqlite3_stmt *st;
    json_t *out = json_array();
    if (sqlite3_prepare_v2(s->db,
                           "SELECT id, t, job, node, kind, msg FROM events WHERE id > ?1 AND"
                           " (?2 = '' OR tenant = ?2) AND (?3 = 0 OR job = ?3) ORDER BY id LIMIT ?4",
                           -1, &st, NULL))
        return out;
    sqlite3_bind_int64(st, 1, after);
    sqlite3_bind_text(st, 2, tenant ? tenant : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, job);
    sqlite3_bind_int(st, 4, limit);
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(out, json_pack("{s:I,s:f,s:I,s:s,s:s,s:s}", "id",
                                             (json_int_t)sqlite3_column_int64(st, 0), "t",
                                             sqlite3_column_double(st, 1), "job",
                                             (json_int_t)sqlite3_column_int64(st, 2), "node",
                                             col_text(st, 3), "kind", col_text(st, 4), "msg",
                                             col_text(st, 5)));
    sqlite3_finalize(st);
    return out;
}

/* The closed ledger of one job: dollars and GPU-seconds over its members. */
void srv__db_job_cost(srv *s, int64_t job, double *dollars, double *gpu_s)
{
    sqlite3_stmt *st;
    *dollars = *gpu_s = 0;
    if (sqlite3_prepare_v2(s->db, "SELECT SUM(cost), SUM(COALESCE(seconds, t_end - t_start) * gpus) FROM ledger WHERE job = ?",
                           -1, &st, NULL))
        return;
    sqlite3_bind_int64(st, 1, job);
    if (sqlite3_step(st) == SQLITE_ROW) *dollars = sqlite3_column_double(st, 0), *gpu_s = sqlite3_column_double(st, 1);
    sqlite3_finalize(st);
}

/* Sums the closed ledger by tenant and GPU type into obj[tenant][gpu_type]. */
json_t *srv__db_costs(srv *s, const char *tenant)
{
    sqlite3_stmt *st;
    json_t *out = json_object();
    if (sqlite3_prepare_v2(s->db,
                           "SELECT tenant, gpu_type, SUM(cost), SUM(COALESCE(seconds, t_end - t_start) * gpus)"
                           " FROM ledger WHERE ?1 = '' OR tenant = ?1 GROUP BY tenant, gpu_type",
                           -1, &st, NULL))
        return out;
    sqlite3_bind_text(st, 1, tenant ? tenant : "", -1, SQLITE_STATIC);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *t = col_text(st, 0);
        json_t *by = json_object_get(out, t);
        if (!by) json_object_set_new(out, t, by = json_object());
        json_object_set_new(by, col_text(st, 1),
                            json_pack("{s:f,s:f}", "dollars", sqlite3_column_double(st, 2),
                                      "gpu_seconds", sqlite3_column_double(st, 3)));
    }
    sqlite3_finalize(st);
    return out;
}
