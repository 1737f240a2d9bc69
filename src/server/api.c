/* The JSON endpoints of docs/server-api.md.  srv__handle() runs with srv.mu
 * held and returns 0 with *status and *reply set, or a negative SH_E* code
 * that http.c turns into a JSON error. */
#include "srv_int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <microhttpd.h>

static const char *query(srv_req *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

static int64_t query_i64(srv_req *r, const char *key, int64_t def)
{
    const char *v = query(r, key);
    int64_t out = def;
    if (v && sh_parse_i64(v, &out, key) < 0) return def;
    return out;
}

/* A tenant sees only its own jobs; others' look like missing ones, so that a
 * job id reveals nothing about another tenant. */
static srv_job *visible_job(srv *s, srv_req *r, int64_t id)
{
    srv_job *j = srv__job(s, id);
    if (!j) return NULL;
    if (r->role == ROLE_TENANT && strcmp(j->tenant, r->tenant)) return NULL;
    return j;
}

static int64_t idem_lookup(srv *s, const char *tenant, const char *key)
{
    sqlite3_stmt *st;
    int64_t id = 0;
    /* "idem != ''" lets SQLite use the partial index jobs_idem. */
    if (sqlite3_prepare_v2(s->db, "SELECT id FROM jobs WHERE tenant=? AND idem=? AND idem != ''", -1, &st, NULL))
        return 0;
    sqlite3_bind_text(st, 1, tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return id;
}

static int submit(srv *s, srv_req *r, int *status, json_t **reply)
{
    if (r->role != ROLE_TENANT && r->role != ROLE_ADMIN)
        return sh_err(SH_EPERM, "only tenants and the admin submit jobs");
    srv_job *j = r->job;
    r->job = NULL; /* parsed and validated before the lock was taken */
    if (!j) return sh_err(SH_EINTERNAL, "submit without a parsed job");
    int rc;
    int64_t dup = j->idem[0] ? idem_lookup(s, j->tenant, j->idem) : 0;
    if (dup && srv__job(s, dup)) {
        /* A retried submit (same idempotency key) gets the job it created. */
        srv__job_free(j);
        *status = 200;
        *reply = srv__job_json(s, srv__job(s, dup), 0);
        json_object_set_new(*reply, "duplicate", json_true());
        return SH_OK;
    }
    char why[400];
    j->id = s->njobs + 1;
    rc = srv__seam_submit(s, j, why, sizeof why);
    if (rc != 0) {
        if (rc == 1) srv__id_consume(s); /* the core keeps the rejected id */
        srv__job_free(j);
        if (rc < 0) return rc;
        s->rejects++;
        *status = 422;
        *reply = json_pack("{s:s,s:s}", "error", why, "reason", "never_fits");
        return SH_OK;
    }
    j->state = J_PENDING;
    j->t_submit = sh_now_wall();
    SH_TRY(srv__job_add(s, j));
    rc = srv__db_begin(s);
    if (rc == SH_OK) rc = srv__db_job(s, j);
    if (rc == SH_OK) rc = srv__db_event(s, j->id, NULL, "submitted", "%s by %s", j->name, j->tenant);
    if (rc == SH_OK) rc = srv__db_commit(s);
    if (rc < 0) {
        /* Not durable, so not accepted: forget it (it is the newest job). */
        srv__db_rollback(s);
        srv__seam_end(s, j, 1);
        s->jobs[j->id] = NULL;
        s->njobs--;
        s->nactive--;
        srv__job_free(j);
        return rc;
    }
    s->submits++;
    srv__changed(s);
    *status = 201;
    *reply = srv__job_json(s, j, 0);
    return SH_OK;
}

static int list_jobs(srv *s, srv_req *r, json_t **reply)
{
    const char *state = query(r, "state");
    int64_t limit = query_i64(r, "limit", 100);
    if (limit < 1 || limit > 100000) limit = 100;
    json_t *a = json_array();
    for (int64_t id = s->njobs; id >= 1 && (int64_t)json_array_size(a) < limit; id--) {
        srv_job *j = visible_job(s, r, id);
        if (!j) continue;
        if (state && strcmp(state, srv__job_state_name(j->state)) &&
            !(!strcmp(state, "active") && j->state <= J_RUNNING))
            continue;
        json_array_append_new(a, srv__job_json(s, j, 0));
    }
    *reply = json_pack("{s:o}", "jobs", a);
    return SH_OK;
}

static int job_logs(srv *s, srv_req *r, srv_job *j, json_t **reply)
{
    int64_t rank = query_i64(r, "rank", 0), off = query_i64(r, "offset", 0);
    if (off < 0) off = 0;
    if (rank < 0 || rank >= 64) return sh_err(SH_EINVAL, "logs: rank %lld is outside 0..63", (long long)rank);
    char path[4200];
    SH_TRY(srv__log_path(s, j->id, (int)rank, path, sizeof path));
    sh_buf b = {0};
    uint64_t next = (uint64_t)off;
    int rc = srv__log_read(path, (uint64_t)off, 1 << 20, &b, &next);
    if (rc < 0) {
        sh_buf_free(&b);
        return rc;
    }
    *reply = json_pack("{s:s%,s:I,s:b,s:s}", "data", b.data ? (char *)b.data : "", b.len, "offset",
                       (json_int_t)next, "done", j->state > J_RUNNING, "state",
                       srv__job_state_name(j->state));
    sh_buf_free(&b);
    return SH_OK;
}

json_t *srv__costs(srv *s, const char *tenant)
{
    json_t *by = srv__db_costs(s, tenant);
    double now = sh_now_wall();
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        if (!j || (tenant && strcmp(tenant, j->tenant))) continue;
        for (int i = 0; i < j->nmem; i++) {
            srv_member *m = &j->mem[i];
            if (m->t_start <= 0 || m->state > M_RUNNING) continue;
            srv_node *n = &s->nodes[m->node];
            json_t *t = json_object_get(by, j->tenant);
            if (!t) json_object_set_new(by, j->tenant, t = json_object());
            json_t *g = json_object_get(t, n->gpu_type);
            if (!g) json_object_set_new(t, n->gpu_type, g = json_pack("{s:f,s:f}", "dollars", 0.0, "gpu_seconds", 0.0));
            double sec = (now - m->t_start) * j->gpus_per_node;
            json_object_set_new(g, "dollars", json_real(json_real_value(json_object_get(g, "dollars")) + sec / 3600.0 * n->price));
            json_object_set_new(g, "gpu_seconds", json_real(json_real_value(json_object_get(g, "gpu_seconds")) + sec));
        }
    }
    double total = 0;
    const char *k1, *k2;
    json_t *t, *g;
    json_object_foreach(by, k1, t) json_object_foreach(t, k2, g) total += json_real_value(json_object_get(g, "dollars"));
    return json_pack("{s:o,s:f}", "by_tenant", by, "total_dollars", total);
}

static json_t *nodes_json(srv *s, srv_req *r)
{
    json_t *a = srv__nodes_json(s, r->tenant);
    return a ? a : json_array();
}

static int overview(srv *s, srv_req *r, json_t **reply)
{
    json_t *jobs = json_array();
    int recent = 0;
    for (int64_t id = s->njobs; id >= 1; id--) {
        srv_job *j = visible_job(s, r, id);
        if (!j) continue;
        if (j->state > J_RUNNING && recent++ >= 30) continue;
        if (j->state <= J_RUNNING || recent <= 30) json_array_append_new(jobs, srv__job_json(s, j, 0));
        if (json_array_size(jobs) >= 500) break;
    }
    *reply = json_pack("{s:o,s:o,s:o,s:s,s:f}", "nodes", nodes_json(s, r), "jobs", jobs, "costs",
                       srv__costs(s, r->tenant), "viewer", r->tenant ? r->tenant : "admin", "now", sh_now_wall());
    return SH_OK;
}

static int job_routes(srv *s, srv_req *r, const char *rest, int *status, json_t **reply)
{
    char *end;
    long long id = strtoll(rest, &end, 10);
    if (end == rest || id <= 0) return sh_err(SH_ENOENT, "no such job \"%s\"", rest);
    srv_job *j = visible_job(s, r, id);
    if (!j || r->role == ROLE_AGENT) return sh_err(SH_ENOENT, "no such job %lld", id);
    int get = !strcmp(r->method, "GET");
    if (!*end && get) {
        *reply = srv__job_json(s, j, 1);
        return SH_OK;
    }
    if ((!strcmp(end, "/cancel") && !strcmp(r->method, "POST")) || (!*end && !strcmp(r->method, "DELETE"))) {
        SH_TRY(srv__db_begin(s));
        int rc = srv__cancel(s, j, r->tenant ? r->tenant : "admin");
        if (rc == SH_OK) rc = srv__db_commit(s);
        else srv__db_rollback(s);
        SH_TRY(rc);
        *reply = srv__job_json(s, j, 0);
        return SH_OK;
    }
    if (!strcmp(end, "/logs") && get) return job_logs(s, r, j, reply);
    if (!strcmp(end, "/events") && get) {
        *reply = json_pack("{s:o}", "events", srv__db_events(s, 0, NULL, j->id, 1000));
        return SH_OK;
    }
    *status = 405;
    return sh_err(SH_ENOENT, "%s %s: no such endpoint (see docs/server-api.md)", r->method, r->path);
}

static int agent_routes(srv *s, srv_req *r, json_t **reply)
{
    if (r->role != ROLE_AGENT && r->role != ROLE_ADMIN)
        return sh_err(SH_EPERM, "%s: needs the agent token", r->path);
    if (strcmp(r->method, "POST")) return sh_err(SH_ENOENT, "%s %s: no such endpoint", r->method, r->path);
    json_t *b;
    SH_TRY(sh_json_parse(r->body, r->body_len, r->path, &b));
    int rc;
    if (!strcmp(r->path, "/v1/agent/register")) {
        rc = srv__db_begin(s);
        if (rc == SH_OK) rc = srv__agent_register(s, b, reply);
        if (rc == SH_OK) rc = srv__db_commit(s);
        else srv__db_rollback(s);
    } else if (!strcmp(r->path, "/v1/agent/poll")) rc = srv__agent_poll(s, b, reply);
    else rc = sh_err(SH_ENOENT, "%s: no such endpoint", r->path);
    json_decref(b);
    return rc;
}

static int delete_node(srv *s, srv_req *r, const char *name, json_t **reply)
{
    if (r->role != ROLE_ADMIN) return sh_err(SH_EPERM, "only the admin removes nodes");
    int idx = srv__node_find(s, name);
    if (idx < 0) return sh_err(SH_ENOENT, "no such node \"%s\"", name);
    SH_TRY(srv__db_begin(s));
    int rc = srv__node_dead(s, idx, "removed by the admin");
    if (rc == SH_OK) {
        s->nodes[idx].state = NODE_GONE;
        rc = srv__db_node(s, &s->nodes[idx]);
    }
    if (rc == SH_OK && srv__seam_node(s, idx, SEAM_GONE) < 0) sh_warn("node %s: %s", name, sh_errmsg());
    if (rc == SH_OK) rc = srv__db_commit(s);
    else srv__db_rollback(s);
    SH_TRY(rc);
    *reply = json_pack("{s:s,s:s}", "node", name, "state", "gone");
    return SH_OK;
}

/* The part of a submit that needs no lock: parsing and validating the job
 * file, so that concurrent submits contend only for the durable write. */
int srv__presubmit(srv_req *r)
{
    if (strcmp(r->path, "/v1/jobs") || strcmp(r->method, "POST") || (r->role != ROLE_TENANT && r->role != ROLE_ADMIN))
        return SH_OK;
    json_t *spec;
    SH_TRY(sh_json_parse(r->body, r->body_len, "job", &spec));
    if (r->idem_header && *r->idem_header && json_is_object(spec) && !json_object_get(spec, "idempotency_key"))
        json_object_set_new(spec, "idempotency_key", json_string(r->idem_header));
    int rc = srv__job_from_spec(spec, r->tenant ? r->tenant : "admin", &r->job);
    json_decref(spec);
    return rc;
}

int srv__handle(srv *s, srv_req *r, int *status, json_t **reply)
{
    const char *p = r->path;
    int get = !strcmp(r->method, "GET");
    *status = 200;
    if (!strncmp(p, "/v1/agent/", 10)) return agent_routes(s, r, reply);
    if (r->role == ROLE_AGENT) return sh_err(SH_EPERM, "%s: the agent token only reaches /v1/agent/", p);
    if (!strcmp(p, "/v1/jobs")) {
        if (!strcmp(r->method, "POST")) return submit(s, r, status, reply);
        if (get) return list_jobs(s, r, reply);
    } else if (!strncmp(p, "/v1/jobs/", 9)) {
        return job_routes(s, r, p + 9, status, reply);
    } else if (!strcmp(p, "/v1/nodes") && get) {
        *reply = json_pack("{s:o}", "nodes", nodes_json(s, r));
        return SH_OK;
    } else if (!strncmp(p, "/v1/nodes/", 10) && !strcmp(r->method, "DELETE")) {
        return delete_node(s, r, p + 10, reply);
    } else if (!strcmp(p, "/v1/events") && get) {
        int64_t limit = query_i64(r, "limit", 200);
        *reply = json_pack("{s:o}", "events", srv__db_events(s, query_i64(r, "after", 0), r->tenant, 0,
                                                             limit < 1 || limit > 10000 ? 200 : (int)limit));
        return SH_OK;
    } else if (!strcmp(p, "/v1/costs") && get) {
        *reply = srv__costs(s, r->tenant);
        return SH_OK;
    } else if (!strcmp(p, "/v1/overview") && get) {
        return overview(s, r, reply);
    }
    *status = 404;
    return sh_err(SH_ENOENT, "%s %s: no such endpoint (see docs/server-api.md)", r->method, p);
}
