/* The server's state in its database: every statement it runs, and the
 * mapping between rows and the in-memory model.  The engine (SQLite or
 * PostgreSQL) is behind db_int.h; this file is the same for both, so that
 * the two hold the same state and pass the same tests.  The schema is in
 * docs/server-api.md ("State"). */
#include "srv_int.h"
#include "db_int.h"

#include <stdlib.h>
#include <string.h>

int srv__store_is_pg(const char *db)
{
    return db && (!strncmp(db, "postgresql://", 13) || !strncmp(db, "postgres://", 11) ||
                  (strchr(db, '=') && !strchr(db, '/')) || !strncmp(db, "dbname=", 7) ||
                  !strncmp(db, "host=", 5));
}

/* --db as messages show it: a URL's password is replaced by "***". */
static void db__name(srv *s)
{
    const char *d = s->cfg.db_path;
    snprintf(s->db_name, sizeof s->db_name, "%s", d);
    const char *at = strchr(d, '@'), *sch = strstr(d, "://");
    if (sch && at) {
        const char *colon = memchr(sch + 3, ':', (size_t)(at - sch - 3));
        if (colon) snprintf(s->db_name, sizeof s->db_name, "%.*s:***%s", (int)(colon - d), d, at);
    }
    char *pw = strstr(s->db_name, "password=");
    if (pw) snprintf(pw, sizeof s->db_name - (size_t)(pw - s->db_name), "password=***");
}

static int db__hash_creds(srv *s);

int srv__db_open(srv *s)
{
    db__name(s);
    s->store = srv__store_is_pg(s->cfg.db_path) ? &srv__store_pg : &srv__store_sqlite;
    SH_TRY(s->store->open(s));
    return db__hash_creds(s);
}

int srv__db_begin(srv *s) { return s->store->begin(s); }

int srv__db_commit(srv *s) { return s->store->commit(s); }

void srv__db_rollback(srv *s) { s->store->rollback(s); }

int srv__db_autocommit(srv *s) { return !s->store->in_tx(s); }

void srv__db_close(srv *s)
{
    if (s->store) s->store->close(s);
    s->db = NULL;
}

static int db__run(srv *s, const char *sql, const char *types, ...)
{
    va_list ap;
    va_start(ap, types);
    int rc = s->store->run(s, sql, types, ap);
    va_end(ap);
    return rc;
}

static int db__query(srv *s, const char *sql, const char *types, srv_row_fn fn, void *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    int rc = s->store->query(s, sql, types, fn, arg, ap);
    va_end(ap);
    return rc;
}

#define COL_T(r, i) s->store->text(r, i)
#define COL_I(r, i) s->store->i64(r, i)
#define COL_D(r, i) s->store->dbl(r, i)

static int db__plain_cred(srv *s, srv_row *r, void *arg)
{
    const char *cred = COL_T(r, 1);
    if (cred[0] && !srv__is_hash(cred)) json_object_set_new(arg, COL_T(r, 0), json_string(cred));
    return SH_OK;
}

/* Databases from before hashed credentials hold each node's credential as
 * it was issued: each is replaced by its hash (srv__secret_hash), in one
 * transaction, before the server answers anyone.  Plain SQL, the hash made
 * here, so both engines run it. */
static int db__hash_creds(srv *s)
{
    json_t *plain = json_object();
    if (!plain) return sh_err(SH_ENOMEM, "%s: node credentials", s->db_name);
    int rc = db__query(s, "SELECT name, cred FROM nodes", "", db__plain_cred, plain);
    if (rc == SH_OK && json_object_size(plain)) {
        rc = s->store->begin(s);
        const char *name;
        json_t *v;
        json_object_foreach(plain, name, v) if (rc == SH_OK) {
            char h[SRV_HASH_LEN];
            srv__secret_hash(json_string_value(v), h);
            rc = db__run(s, "UPDATE nodes SET cred=$1 WHERE name=$2", "tt", h, name);
        }
        if (rc == SH_OK) rc = s->store->commit(s);
        else if (s->store->in_tx(s)) s->store->rollback(s);
        if (rc == SH_OK)
            sh_info("%s: %zu node credential(s) stored as given were replaced by their hashes", s->db_name,
                    json_object_size(plain));
    }
    json_decref(plain);
    return rc;
}

int srv__db_node(srv *s, const srv_node *n)
{
    return db__run(s,
                   "INSERT INTO nodes(name, gpu_type, gpus, zone, fabric, addr, price, state,"
                   " from_provider, sandbox, cred) VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)"
                   " ON CONFLICT(name) DO UPDATE SET gpu_type=excluded.gpu_type, gpus=excluded.gpus,"
                   " zone=excluded.zone, fabric=excluded.fabric, addr=excluded.addr, price=excluded.price,"
                   " state=excluded.state, from_provider=excluded.from_provider, sandbox=excluded.sandbox,"
                   " cred=excluded.cred", "ttitttdiitt", n->name,
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
                     "INSERT INTO jobs(id, tenant, name, idem, kind, state, policy, attempt, max_attempts,"
                     " priority, exit_code, reason, spec, t_submit, t_start, t_end, go, prefer, nodes,"
                     " min_nodes, gpus_per_node, failures)"
                     " VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22)"
                     " ON CONFLICT(id) DO UPDATE SET state=excluded.state, policy=excluded.policy,"
                     " attempt=excluded.attempt, max_attempts=excluded.max_attempts,"
                     " priority=excluded.priority, exit_code=excluded.exit_code, reason=excluded.reason,"
                     " spec=excluded.spec, t_submit=excluded.t_submit, t_start=excluded.t_start,"
                     " t_end=excluded.t_end, go=excluded.go, prefer=excluded.prefer, nodes=excluded.nodes,"
                     " min_nodes=excluded.min_nodes, gpus_per_node=excluded.gpus_per_node,"
                     " failures=excluded.failures",
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
    SH_TRY(db__run(s, "DELETE FROM members WHERE job=$1", "i", j->id));
    for (int i = 0; i < j->nmem; i++) {
        const srv_member *m = &j->mem[i];
        SH_TRY(db__run(s, "INSERT INTO members(job, rank, node, state, exit_code, gpu_mask, t_start, t_end,"
                       " t_placed) VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9)", "iitiiiddd", j->id,
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
    return db__run(s, "INSERT INTO events(t, job, tenant, node, kind, msg) VALUES($1,$2,$3,$4,$5,$6)",
                   "ditttt", sh_now_wall(), job, j ? j->tenant : "", node ? node : "", kind, msg);
}

int srv__db_ledger(srv *s, const srv_bill *b)
{
    return db__run(s,
                   "INSERT INTO ledger(tenant, job, attempt, rank, node, gpu_type, gpus, t_start,"
                   " t_end, seconds, cost) VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)",
                   "tiiittidddd", b->tenant, b->job, (int64_t)b->attempt, (int64_t)b->rank, b->node,
                   b->gpu_type, (int64_t)b->gpus, b->t_start, b->t_end, b->seconds, b->cost);
}

static int db__row_node(srv *s, srv_row *r, void *arg)
{
    if (s->nnodes == s->cap_nodes) {
        int cap = s->cap_nodes ? 2 * s->cap_nodes : 64;
        srv_node *nn = realloc(s->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return sh_err(SH_ENOMEM, "loading nodes");
        s->nodes = nn;
        s->cap_nodes = cap;
    }
    srv_node *n = &s->nodes[s->nnodes++];
    memset(n, 0, sizeof *n);
    snprintf(n->name, sizeof n->name, "%s", COL_T(r, 0));
    snprintf(n->gpu_type, sizeof n->gpu_type, "%s", COL_T(r, 1));
    n->gpus = (int)COL_I(r, 2);
    snprintf(n->zone, sizeof n->zone, "%s", COL_T(r, 3));
    snprintf(n->fabric, sizeof n->fabric, "%s", COL_T(r, 4));
    snprintf(n->addr, sizeof n->addr, "%s", COL_T(r, 5));
    n->price = COL_D(r, 6);
    n->state = (int)COL_I(r, 7);
    n->from_provider = (int)COL_I(r, 8);
    snprintf(n->sandbox, sizeof n->sandbox, "%s", COL_T(r, 9));
    snprintf(n->cred, sizeof n->cred, "%s", COL_T(r, 10));
    /* A node alive at the crash gets a fresh heartbeat window to poll the
     * restarted server before it is declared dead. */
    n->last_seen = sh_now_mono();
    return SH_OK;
}

static int db__row_member(srv *s, srv_row *r, void *arg)
{
    srv_job *j = srv__job(s, COL_I(r, 0));
    int node = srv__node_find(s, COL_T(r, 2));
    if (!j || node < 0) return SH_OK;
    srv_member *nm = realloc(j->mem, (size_t)(j->nmem + 1) * sizeof *nm);
    if (!nm) return sh_err(SH_ENOMEM, "loading members");
    j->mem = nm;
    srv_member *m = &j->mem[j->nmem++];
    memset(m, 0, sizeof *m);
    m->rank = (int)COL_I(r, 1);
    m->node = node;
    m->state = (int)COL_I(r, 3);
    m->exit_code = (int)COL_I(r, 4);
    m->gpu_mask = (uint64_t)COL_I(r, 5);
    m->t_start = COL_D(r, 6);
    m->t_end = COL_D(r, 7);
    m->t_placed = COL_D(r, 8); /* 0 (NULL) in older databases */
    return SH_OK;
}

/* A job row goes to the caller's `job` (state.c's srv__job_from_row),
 * which builds the job: the database only reads rows. */
static int db__row_job(srv *s, srv_row *r, void *arg)
{
    int (*job)(srv *, const srv_job_row *) = *(int (**)(srv *, const srv_job_row *))arg;
    srv_job_row row = {COL_I(r, 0), COL_T(r, 1), COL_T(r, 3), (int)COL_I(r, 5), (int)COL_I(r, 7),
                       (int)COL_I(r, 10), COL_T(r, 11), COL_T(r, 12), COL_D(r, 13), COL_D(r, 14),
                       COL_D(r, 15), (int)COL_I(r, 16), COL_T(r, 17), (int)COL_I(r, 18), (int)COL_I(r, 21)};
    return job(s, &row);
}

int srv__db_run(srv *s, const char *tenant, const char *name, const char *secret, const char *token)
{
    return db__run(s, "INSERT INTO runs(tenant, name, secret, token, t) VALUES($1,$2,$3,$4,$5)", "ttttd", tenant,
                   name, secret, token, sh_now_wall());
}

int srv__db_run_service(srv *s, const char *tenant, const char *run, const char *name, const char *value, int64_t job)
{
    return db__run(s, "INSERT INTO run_services(tenant, run, name, value, job, t) VALUES($1,$2,$3,$4,$5,$6)"
                      " ON CONFLICT(tenant, run, name) DO UPDATE SET value=excluded.value, job=excluded.job,"
                      " t=excluded.t",
                   "ttttid", tenant, run, name, value, job, sh_now_wall());
}

/* The entries' layout is runs.c's (srv__run_put); built here so that
 * loading calls nothing above the database.  An entry already in memory
 * is kept: a request may hold pointers into it. */
static int db__row_run(srv *s, srv_row *r, void *arg)
{
    char k[256];
    snprintf(k, sizeof k, "%s\n%s", COL_T(r, 0), COL_T(r, 1));
    if (json_object_get(s->runs, k)) return SH_OK;
    json_object_set_new(s->runs, k, json_pack("{s:s,s:s,s:s,s:s,s:o}", "tenant", COL_T(r, 0), "run", COL_T(r, 1),
                                              "secret", COL_T(r, 2), "token", COL_T(r, 3), "services",
                                              json_object()));
    return SH_OK;
}

static int db__row_run_service(srv *s, srv_row *r, void *arg)
{
    char k[256];
    snprintf(k, sizeof k, "%s\n%s", COL_T(r, 0), COL_T(r, 1));
    json_t *run = json_object_get(s->runs, k);
    if (run) json_object_set_new(json_object_get(run, "services"), COL_T(r, 2), json_string(COL_T(r, 3)));
    return SH_OK;
}

/* Every run and its services into s->runs (runs.c). */
static int db__load_runs(srv *s)
{
    if (!s->runs) s->runs = json_object();
    if (!s->runs) return sh_err(SH_ENOMEM, "%s: runs", s->db_name);
    SH_TRY(db__query(s, "SELECT tenant, name, secret, token FROM runs", "", db__row_run, NULL));
    return db__query(s, "SELECT tenant, run, name, value FROM run_services", "", db__row_run_service, NULL);
}

int srv__db_load(srv *s, int (*job)(srv *s, const srv_job_row *row))
{
    SH_TRY(db__load_runs(s));
    int pg = s->store == &srv__store_pg;
    SH_TRY(db__query(s, pg ? "SELECT name, gpu_type, gpus, zone, fabric, addr, price, state, from_provider,"
                             " sandbox, cred FROM nodes ORDER BY ord"
                           : "SELECT name, gpu_type, gpus, zone, fabric, addr, price, state, from_provider,"
                             " sandbox, cred FROM nodes ORDER BY rowid",
                     "", db__row_node, NULL));
    SH_TRY(db__query(s, "SELECT id, tenant, name, idem, kind, state, policy, attempt, max_attempts, priority,"
                        " exit_code, reason, spec, t_submit, t_start, t_end, go, prefer, nodes, min_nodes,"
                        " gpus_per_node, failures FROM jobs ORDER BY id",
                     "", db__row_job, &job));
    return db__query(s, "SELECT job, rank, node, state, exit_code, gpu_mask, t_start, t_end, t_placed"
                        " FROM members ORDER BY job, rank", "", db__row_member, NULL);
}

static int db__row_tenant(srv *s, srv_row *r, void *arg)
{
    json_object_set_new(s->tenant_num, COL_T(r, 0), json_integer(COL_I(r, 1)));
    return SH_OK;
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
        rc = db__run(s, "INSERT INTO tenants(name, num) VALUES($1, (SELECT COALESCE(MAX(num), 0) + 1 FROM tenants))"
                        " ON CONFLICT DO NOTHING", "t", json_string_value(v));
    json_decref(names);
    SH_TRY(rc);
    json_decref(s->tenant_num);
    s->tenant_num = json_object();
    return db__query(s, "SELECT name, num FROM tenants", "", db__row_tenant, NULL);
}

/* Every job of the database is in memory (srv__db_load), so the key is
 * looked up there, in the index srv__job_add keeps; an entry whose job
 * was taken back (a failed commit) no longer matches its job. */
int64_t srv__db_idem(srv *s, const char *tenant, const char *key)
{
    char k[sizeof ((srv_job *)0)->tenant + sizeof ((srv_job *)0)->idem + 2];
    snprintf(k, sizeof k, "%s/%s", tenant, key);
    int64_t id = json_integer_value(json_object_get(s->idem_index, k));
    srv_job *j = id ? srv__job(s, id) : NULL;
    return j && !strcmp(j->tenant, tenant) && !strcmp(j->idem, key) ? id : 0;
}

static int db__row_event(srv *s, srv_row *r, void *arg)
{
    json_array_append_new(arg, json_pack("{s:I,s:f,s:I,s:s,s:s,s:s}", "id", (json_int_t)COL_I(r, 0), "t",
                                         COL_D(r, 1), "job", (json_int_t)COL_I(r, 2), "node", COL_T(r, 3),
                                         "kind", COL_T(r, 4), "msg", COL_T(r, 5)));
    return SH_OK;
}

json_t *srv__db_events(srv *s, int64_t after, const char *tenant, int64_t job, int limit)
{
    json_t *out = json_array();
    db__query(s,
              "SELECT id, t, job, node, kind, msg FROM events WHERE id > $1 AND"
              " (CAST($2 AS TEXT) = '' OR tenant = $2) AND (CAST($3 AS BIGINT) = 0 OR job = $3)"
              " ORDER BY id LIMIT $4",
              "itii", db__row_event, out, after, tenant ? tenant : "", job, (int64_t)limit);
    return out;
}

static int db__row_cost(srv *s, srv_row *r, void *arg)
{
    double *d = arg;
    d[0] = COL_D(r, 0), d[1] = COL_D(r, 1);
    return SH_OK;
}

/* The closed ledger of one job: dollars and GPU-seconds over its members. */
void srv__db_job_cost(srv *s, int64_t job, double *dollars, double *gpu_s)
{
    double d[2] = {0, 0};
    db__query(s, "SELECT SUM(cost), SUM(COALESCE(seconds, t_end - t_start) * gpus) FROM ledger WHERE job = $1",
              "i", db__row_cost, d, job);
    *dollars = d[0], *gpu_s = d[1];
}

static int db__row_costs(srv *s, srv_row *r, void *arg)
{
    const char *t = COL_T(r, 0);
    json_t *by = json_object_get(arg, t);
    if (!by) json_object_set_new(arg, t, by = json_object());
    json_object_set_new(by, COL_T(r, 1),
                        json_pack("{s:f,s:f}", "dollars", COL_D(r, 2), "gpu_seconds", COL_D(r, 3)));
    return SH_OK;
}

/* Sums the closed ledger by tenant and GPU type into obj[tenant][gpu_type]. */
json_t *srv__db_costs(srv *s, const char *tenant)
{
    json_t *out = json_object();
    db__query(s,
              "SELECT tenant, gpu_type, SUM(cost), SUM(COALESCE(seconds, t_end - t_start) * gpus)"
              " FROM ledger WHERE CAST($1 AS TEXT) = '' OR tenant = $1 GROUP BY tenant, gpu_type",
              "t", db__row_costs, out, tenant ? tenant : "");
    return out;
}
