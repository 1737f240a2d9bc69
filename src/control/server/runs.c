/* Runs: the jobs of one tenant that name the same "run" find each other
 * through the server (docs/server-api.md, "Runs").
 *
 * A run is created by the first job that names it.  It gets two random
 * values, generated once and kept in the database: the run secret, which
 * the run's processes present to each other (SHOAL_RUN_SECRET: the push
 * tree, the RL trainer), and the run token, with which a rank publishes and
 * looks up the run's services (the push root's address, the trainer's).
 * Both reach the run's ranks only, in their environment; neither appears in
 * any reply.  A run token reaches only /v1/runs/<its run>/..., and only
 * while a job of the run is pending, starting or running, so that a token
 * left in an old log opens nothing.  All functions run with srv.mu held. */
#include "srv_int.h"
#include "files_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static void key_of(const char *tenant, const char *run, char *out, size_t cap)
{
    snprintf(out, cap, "%s\n%s", tenant, run);
}

json_t *srv__run_find(srv *s, const char *tenant, const char *run)
{
    char k[256];
    key_of(tenant, run, k, sizeof k);
    return json_object_get(s->runs, k);
}

json_t *srv__run_put(srv *s, const char *tenant, const char *run, const char *secret, const char *token)
{
    char k[256];
    key_of(tenant, run, k, sizeof k);
    json_t *r = json_object_get(s->runs, k);
    if (r) return r; /* never replaced: authenticated requests point into it */
    r = json_pack("{s:s,s:s,s:s,s:s,s:o}", "tenant", tenant, "run", run, "secret", secret, "token", token,
                          "services", json_object());
    json_object_set_new(s->runs, k, r);
    return r;
}

static int random_hex(char *out, size_t bytes)
{
    unsigned char r[32];
    if (bytes > sizeof r) return sh_err(SH_EINTERNAL, "random_hex");
    if (getrandom(r, bytes, 0) != (ssize_t)bytes) return sh_err_errno(errno, "getrandom");
    for (size_t i = 0; i < bytes; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
    return SH_OK;
}

int srv__run_prepare(srv *s, const srv_job *j, srv_new_run *nr)
{
    memset(nr, 0, sizeof *nr);
    const char *run = json_string_value(json_object_get(j->spec, "run"));
    if (!run || srv__run_find(s, j->tenant, run)) return SH_OK;
    nr->create = 1;
    snprintf(nr->tenant, sizeof nr->tenant, "%s", j->tenant);
    snprintf(nr->run, sizeof nr->run, "%s", run);
    memcpy(nr->token, "run-", 4);
    SH_TRY(random_hex(nr->secret, 16));
    return random_hex(nr->token + 4, 20);
}

void srv__run_commit(srv *s, const srv_new_run *nr)
{
    if (nr->create) srv__run_put(s, nr->tenant, nr->run, nr->secret, nr->token);
}

void srv__run_env(srv *s, const srv_job *j, json_t *env)
{
    const char *run = json_string_value(json_object_get(j->spec, "run"));
    json_t *r = run ? srv__run_find(s, j->tenant, run) : NULL;
    if (!r) return;
    json_object_set_new(env, "SHOAL_RUN", json_string(run));
    json_object_set(env, "SHOAL_RUN_SECRET", json_object_get(r, "secret"));
    json_object_set(env, "SHOAL_RUN_TOKEN", json_object_get(r, "token"));
}

int srv__run_token(srv *s, const char *tok, const char **tenant, const char **run)
{
    const char *k;
    json_t *r;
    int found = 0;
    /* Every run is compared, so the time taken says nothing of which. */
    json_object_foreach(s->runs, k, r) {
        if (srv__token_eq(tok, json_string_value(json_object_get(r, "token"))) && !found) {
            *tenant = json_string_value(json_object_get(r, "tenant"));
            *run = json_string_value(json_object_get(r, "run"));
            found = 1;
        }
    }
    return found;
}

/* Whether a job of the run is pending, starting or running. */
static int run_active(srv *s, const char *tenant, const char *run)
{
    for (int64_t a = 0; a < s->nactive; a++) {
        const srv_job *j = srv__job_at(s, s->active[a]);
        const char *r = j ? json_string_value(json_object_get(j->spec, "run")) : NULL;
        if (r && j->state <= J_RUNNING && !strcmp(j->tenant, tenant) && !strcmp(r, run)) return 1;
    }
    return 0;
}

static int value_ok(const json_t *v)
{
    if (!json_is_string(v) || json_string_length(v) > 4096) return 0;
    return sh_control_at(json_string_value(v)) < 0;
}

/* /v1/runs/RUN/services[/NAME]: GET lists or looks up, PUT {"value": V}
 * publishes.  A tenant reaches its own runs, the admin every tenant's
 * (?tenant=T, default "admin"), a run token its own run. */
int srv__run_routes(srv *s, srv_req *r, const char *rest, int *status, json_t **reply, srv_run_put *put)
{
    memset(put, 0, sizeof *put);
    char run[128], name[128] = "";
    const char *slash = strchr(rest, '/');
    if (!slash || (size_t)(slash - rest) >= sizeof run) return sh_err(SH_ENOENT, "%s: no such endpoint", r->path);
    snprintf(run, sizeof run, "%.*s", (int)(slash - rest), rest);
    const char *tail = slash + 1;
    if (strncmp(tail, "services", 8) || (tail[8] && tail[8] != '/'))
        return sh_err(SH_ENOENT, "%s: no such endpoint (see docs/server-api.md, \"Runs\")", r->path);
    if (tail[8] == '/') snprintf(name, sizeof name, "%s", tail + 9);
    if (!srv__run_name_ok(run)) return sh_err(SH_EINVAL, "%s: \"%s\" is not a run name", r->path, run);
    if (*name && !srv__run_name_ok(name))
        return sh_err(SH_EINVAL, "%s: \"%s\" is not a service name (1 to 63 of A-Z a-z 0-9 . _ -)", r->path, name);
    const char *tenant = r->tenant ? r->tenant : "admin";
    if (r->role == ROLE_RUN) {
        if (strcmp(run, r->run))
            return sh_err(SH_EPERM, "%s: this run token is run %s's; it reaches no other run", r->path, r->run);
        if (!run_active(s, tenant, run))
            return sh_err(SH_EPERM, "%s: run %s has no pending or running job; its token is closed", r->path, run);
    }
    json_t *rn = srv__run_find(s, tenant, run);
    /* A run of another tenant is as absent as one that never was. */
    if (!rn) return sh_err(SH_ENOENT, "%s: no run \"%s\" (a job file's \"run\" creates it)", r->path, run);
    json_t *svc = json_object_get(rn, "services");
    int get = !strcmp(r->method, "GET"), is_put = !strcmp(r->method, "PUT");
    if (get && !*name) {
        *reply = json_pack("{s:s,s:O}", "run", run, "services", svc);
        return SH_OK;
    }
    if (get) {
        json_t *v = json_object_get(svc, name);
        if (!v) return sh_err(SH_ENOENT, "run %s has no service \"%s\" (yet)", run, name);
        *reply = json_pack("{s:s,s:s,s:O}", "run", run, "name", name, "value", v);
        return SH_OK;
    }
    if (!is_put || !*name) {
        *status = 405;
        return sh_err(SH_ENOENT, "%s %s: no such endpoint (GET, or PUT of one service)", r->method, r->path);
    }
    json_t *b;
    SH_TRY(sh_json_parse(r->body, r->body_len, r->path, &b));
    static const char *const keys[] = {"value", NULL};
    int rc = sh_json_check_keys(b, keys, r->path);
    json_t *v = json_object_get(b, "value");
    if (rc == SH_OK && !value_ok(v))
        rc = sh_err(SH_EFORMAT, "%s: field \"value\": expected a string of at most 4096 bytes without control"
                                " characters", r->path);
    if (rc == SH_OK && !json_object_get(svc, name) && json_object_size(svc) >= 64)
        rc = sh_err(SH_ERANGE, "%s: run %s has 64 services, the most one run may publish", r->path, run);
    if (rc == SH_OK) {
        put->put = 1;
        snprintf(put->tenant, sizeof put->tenant, "%s", tenant);
        snprintf(put->run, sizeof put->run, "%s", run);
        snprintf(put->name, sizeof put->name, "%s", name);
        put->value = json_incref(v);
    }
    json_decref(b);
    return rc;
}

void srv__run_set(srv *s, srv_run_put *put, json_t **reply)
{
    json_t *rn = srv__run_find(s, put->tenant, put->run);
    if (rn) json_object_set(json_object_get(rn, "services"), put->name, put->value);
    *reply = json_pack("{s:s,s:s,s:O}", "run", put->run, "name", put->name, "value", put->value);
    json_decref(put->value);
    put->value = NULL;
}
