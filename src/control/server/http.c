/* libmicrohttpd glue: request bodies, authentication, JSON errors, static
 * dashboard files and routing; starting and stopping the server.  The
 * scheduler thread is loop.c, the /metrics text metrics.c.
 *
 * The daemon runs one thread per connection so that agents' long polls can
 * block in their handler without holding up anyone else. */
#include "srv_int.h"
#include "db_int.h"
#include "seam_int.h"
#include "state_int.h"
#include "carry_int.h"
#include "files_int.h"
#include "handlers_int.h"
#include "loop_int.h"

#include <errno.h>
#include <math.h>

#include <fcntl.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <nettle/sha2.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct conn_ctx {
    sh_buf body;
    int too_big;
    /* POST /v1/workdirs: the body streams to a file (uploads.c), after the
     * token is checked; upload_err says why it was refused. */
    int upload;
    srv_upload up;
    const char *tenant;
    char upload_err[300];
    int upload_status;
} conn_ctx;

static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *type,
                                 const void *data, size_t len, int copy)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, (void *)data, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_MUST_FREE);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    enum MHD_Result r = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result send_json(srv *s, struct MHD_Connection *c, int status, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(j);
    if (!text) return MHD_NO;
    __atomic_fetch_add(&s->http_req[status / 100 <= 5 ? status / 100 : 0], 1, __ATOMIC_RELAXED);
    return send_text(c, status, "application/json", text, strlen(text), 0);
}

static enum MHD_Result send_error(srv *s, struct MHD_Connection *c, int status, const char *msg)
{
    return send_json(s, c, status, json_pack("{s:s,s:i}", "error", msg, "status", status));
}

static int status_of(int rc)
{
    switch (rc) {
    case SH_EFORMAT: case SH_EINVAL: case SH_ERANGE: return 400;
    case SH_ENOENT: return 404;
    case SH_EPERM: return 403;
    case SH_EEXIST: return 410; /* only a removed node's poll fails this way */
    default: return 500;
    }
}

/* Compares two hashes in time independent of where they differ. */
static int hash_eq(const char *given, const char *known)
{
    if (!known || strlen(known) != SRV_HASH_LEN - 1) return 0;
    volatile unsigned char diff = 0;
    for (size_t i = 0; i < SRV_HASH_LEN - 1; i++) diff |= (unsigned char)(given[i] ^ known[i]);
    return !diff;
}

/* Maps the bearer token to a role; *tenant points into s->tokens. */
static int authenticate(srv *s, struct MHD_Connection *c, srv_req *r, const char **err)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) || !h[7]) {
        *err = "missing bearer token: send \"Authorization: Bearer TOKEN\" (shoal: --token or SHOAL_TOKEN)";
        return -1;
    }
    char tok[SRV_HASH_LEN];
    srv__secret_hash(h + 7, tok);
    const char *admin = json_string_value(json_object_get(s->tokens, "admin"));
    const char *join = json_string_value(json_object_get(s->tokens, "agent"));
    if (hash_eq(tok, admin)) return r->role = ROLE_ADMIN;
    if (hash_eq(tok, join)) return r->role = ROLE_JOIN;
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(s->tokens, "tenants"), name, v) {
        if (json_is_string(v) && hash_eq(tok, json_string_value(v))) {
            r->tenant = name;
            return r->role = ROLE_TENANT;
        }
    }
    /* A node's credential (the node table only grows, so the index stays
     * valid after the lock is released). */
    pthread_mutex_lock(&s->mu);
    r->node = -1;
    for (int i = 0; i < s->nnodes && r->node < 0; i++)
        if (s->nodes[i].cred[0] && hash_eq(tok, s->nodes[i].cred)) r->node = i;
    /* A run's token (runs.c), kept in plain because the server hands it to
     * each new rank of the run; the strings it points at live as long as the
     * server (runs are never removed). */
    int run = r->node < 0 && !strncmp(h + 7, "run-", 4) && srv__run_token(s, h + 7, &r->tenant, &r->run);
    pthread_mutex_unlock(&s->mu);
    if (r->node >= 0) return r->role = ROLE_NODE;
    if (run) return r->role = ROLE_RUN;
    *err = "unknown bearer token (check --token / SHOAL_TOKEN against the server's tokens file)";
    return -1;
}

static const char *mime_of(const char *path)
{
    const char *dot = strrchr(path, '.');
    if (!dot) return "application/octet-stream";
    if (!strcmp(dot, ".html")) return "text/html; charset=utf-8";
    if (!strcmp(dot, ".js")) return "text/javascript; charset=utf-8";
    if (!strcmp(dot, ".css")) return "text/css; charset=utf-8";
    if (!strcmp(dot, ".svg")) return "image/svg+xml";
    return "application/octet-stream";
}

static enum MHD_Result serve_static(srv *s, struct MHD_Connection *c, const char *url)
{
    const char *name = !strcmp(url, "/") ? "index.html" : url + 1;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || (*p == '.' && p != name)))
            return send_error(s, c, 404, "no such file");
    char path[4200];
    if (!s->cfg.web_dir || snprintf(path, sizeof path, "%s/%s", s->cfg.web_dir, name) >= (int)sizeof path)
        return send_error(s, c, 404, "no dashboard: start the server with --web DIR");
    char *data;
    size_t len;
    if (sh_read_file(path, 8 << 20, &data, &len) < 0) return send_error(s, c, 404, "no such file");
    __atomic_fetch_add(&s->http_req[2], 1, __ATOMIC_RELAXED);
    return send_text(c, 200, mime_of(path), data, len, 0);
}

/* /metrics needs no token for the fleet's figures; the bills need one:
 * the admin's shows every tenant's, a tenant's its own (a rank on the host
 * network reaches this port, so tenants must not read each other's). */
static enum MHD_Result serve_metrics(srv *s, struct MHD_Connection *c)
{
    sh_buf b = {0};
    srv_req r = {.role = ROLE_NONE, .node = -1};
    const char *err = NULL;
    const char *who = "";
    if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")) {
        if (authenticate(s, c, &r, &err) < 0) return send_error(s, c, 401, err);
        who = r.role == ROLE_ADMIN ? NULL : r.role == ROLE_TENANT ? r.tenant : "";
    }
    pthread_mutex_lock(&s->mu);
    srv__metrics(s, &b, who);
    pthread_mutex_unlock(&s->mu);
    __atomic_fetch_add(&s->http_req[2], 1, __ATOMIC_RELAXED);
    enum MHD_Result res = send_text(c, 200, "text/plain; version=0.0.4", b.data ? (char *)b.data : "", b.len, 1);
    sh_buf_free(&b);
    return res;
}

static enum MHD_Result append_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    sh_buf *b = cls;
    sh_buf_printf(b, "%s", b->len && b->data[b->len - 1] != '?' ? "&" : "");
    for (int k = 0; k < 2; k++) {
        const char *p = k ? value : key;
        if (k) sh_buf_printf(b, "=");
        for (; p && *p; p++) {
            unsigned char ch = (unsigned char)*p;
            if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || strchr("-_.~", ch))
                sh_buf_printf(b, "%c", ch);
            else sh_buf_printf(b, "%%%02X", ch);
        }
    }
    return MHD_YES;
}

/* A standby's answer to the API: 307 to the same request on the leader
 * (clients re-send it there, body and method kept), or 503 while no leader
 * is known.  Either way the reply names where to go. */
static enum MHD_Result standby_reply(srv *s, struct MHD_Connection *c, const char *url)
{
    char leader[sizeof s->leader_url];
    pthread_mutex_lock(&s->lead_mu);
    snprintf(leader, sizeof leader, "%s", s->leader_url);
    pthread_mutex_unlock(&s->lead_mu);
    if (!leader[0] || !strcmp(leader, s->self_url)) {
        json_t *j = json_pack("{s:s,s:i,s:s}", "error", "this server is a standby and no leader is known yet"
                                                        " (an election is under way): retry shortly",
                              "status", 503, "standby", s->self_url);
        return send_json(s, c, 503, j);
    }
    sh_buf loc = {0};
    sh_buf_printf(&loc, "%s%s?", leader, url);
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, append_arg, &loc);
    if (loc.data[loc.len - 1] == '?') loc.data[--loc.len] = 0;
    char *text = NULL;
    json_t *j = json_pack("{s:s,s:i,s:s,s:s}", "error", "this server is a standby: ask the leader", "status", 307,
                          "leader", leader, "standby", s->self_url);
    text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    struct MHD_Response *resp = text ? MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE)
                                     : NULL;
    enum MHD_Result r = MHD_NO;
    if (resp) {
        MHD_add_response_header(resp, "Content-Type", "application/json");
        MHD_add_response_header(resp, "Location", (const char *)loc.data);
        MHD_add_response_header(resp, "Cache-Control", "no-store");
        r = MHD_queue_response(c, 307, resp);
        MHD_destroy_response(resp);
    } else free(text);
    sh_buf_free(&loc);
    return r;
}

static enum MHD_Result serve_workdir(srv *s, struct MHD_Connection *c, const srv_req *r);

static enum MHD_Result dispatch(srv *s, struct MHD_Connection *c, const char *url, const char *method,
                                conn_ctx *ctx)
{
    if (ctx->too_big) {
        char m[128];
        snprintf(m, sizeof m, "request body larger than %zu bytes", s->cfg.max_body);
        return send_error(s, c, 413, m);
    }
    const char *lost = srv_failed(s);
    if (lost) return send_error(s, c, 503, lost);
    if (!strcmp(url, "/healthz"))
        return send_json(s, c, 200, json_pack("{s:b,s:b}", "ok", 1, "leader", srv__lead_acting(s)));
    if (!strcmp(url, "/v1/leader")) return send_json(s, c, 200, srv__leader_json(s));
    if (!__atomic_load_n(&s->leader, __ATOMIC_ACQUIRE) && (!strcmp(url, "/metrics") || !strncmp(url, "/v1/", 4)))
        return standby_reply(s, c, url);
    if (!strcmp(url, "/metrics")) return serve_metrics(s, c);
    if (strncmp(url, "/v1/", 4)) {
        if (strcmp(method, "GET")) return send_error(s, c, 405, "static files are GET only");
        return serve_static(s, c, url);
    }
    srv_req r = {.method = method, .path = url, .body = (const char *)ctx->body.data, .body_len = ctx->body.len,
                 .role = ROLE_NONE, .node = -1,
                 .idem_header = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key"), .conn = c};
    if (!r.body) r.body = "";
    const char *err = NULL;
    if (authenticate(s, c, &r, &err) < 0) return send_error(s, c, 401, err);
    if (!strcmp(url, "/v1/agent/workdir") && !strcmp(method, "GET")) return serve_workdir(s, c, &r);
    if (r.idem_header && !srv__idem_valid(r.idem_header))
        return send_error(s, c, 400, "header Idempotency-Key: expected 1 to 127 printable ASCII characters"
                                     " (letters, digits, punctuation; no spaces)");
    int status = 200;
    json_t *reply = NULL;
    char msg[1100];
    int rc = srv__presubmit(&s->cfg, &r); /* cfg is fixed after start */
    if (rc == SH_OK) {
        pthread_mutex_lock(&s->mu);
        /* The state may have been lost while this request waited. */
        if (s->failed[0]) status = 503, rc = sh_err(SH_EIO, "%s", s->failed);
        else if (!srv__lead_acting(s))
            status = 503, rc = sh_err(SH_EIO, "this server's leader lease lapsed (the database is out of reach):"
                                              " retry, or ask another server");
        else rc = srv__handle(s, &r, &status, &reply);
        if (rc < 0 && s->failed[0]) status = 503; /* lost while it waited for a poll's news */
        if (rc < 0) snprintf(msg, sizeof msg, "%s", sh_errmsg());
        pthread_mutex_unlock(&s->mu);
    } else snprintf(msg, sizeof msg, "%s", sh_errmsg());
    srv__job_free(r.job);
    if (rc < 0) {
        json_decref(reply);
        return send_error(s, c, status == 405 || status == 503 ? status : status_of(rc), msg);
    }
    return send_json(s, c, status, reply ? reply : json_object());
}

/* ---- work-dir uploads and downloads (uploads.c) ---------------------------- */

static enum MHD_Result upload_start(srv *s, struct MHD_Connection *c, conn_ctx *ctx, const char *cl)
{
    ctx->upload = 1;
    ctx->up.fd = -1;
    srv_req r = {.role = ROLE_NONE, .node = -1};
    const char *err = NULL;
    uint64_t max = s->cfg.workdir_max;
    if (authenticate(s, c, &r, &err) < 0) {
        ctx->upload_status = 401;
        snprintf(ctx->upload_err, sizeof ctx->upload_err, "%s", err);
    } else if (r.role != ROLE_TENANT && r.role != ROLE_ADMIN) {
        ctx->upload_status = 403;
        snprintf(ctx->upload_err, sizeof ctx->upload_err, "/v1/workdirs: only tenants and the admin upload work dirs");
    } else if (cl && strtoull(cl, NULL, 10) > max) {
        ctx->upload_status = 413;
        snprintf(ctx->upload_err, sizeof ctx->upload_err, "work dir: %s bytes, over the server's limit of %llu bytes",
                 cl, (unsigned long long)max);
    } else if (srv__upload_begin(s, &ctx->up) < 0) {
        ctx->upload_status = 500;
        snprintf(ctx->upload_err, sizeof ctx->upload_err, "%s", sh_errmsg());
    }
    ctx->tenant = r.tenant ? r.tenant : "admin";
    return MHD_YES;
}

static void upload_chunk(srv *s, conn_ctx *ctx, const char *data, size_t n)
{
    if (ctx->upload_status) return; /* refused: the rest is read and dropped */
    if (ctx->up.bytes + n > s->cfg.workdir_max) {
        ctx->upload_status = 413;
        snprintf(ctx->upload_err, sizeof ctx->upload_err, "work dir: over the server's limit of %llu bytes",
                 (unsigned long long)s->cfg.workdir_max);
    } else if (srv__upload_write(&ctx->up, data, n) < 0) {
        ctx->upload_status = 500;
        snprintf(ctx->upload_err, sizeof ctx->upload_err, "%s", sh_errmsg());
    }
    if (ctx->upload_status) srv__upload_abort(&ctx->up);
}

static enum MHD_Result upload_done(srv *s, struct MHD_Connection *c, conn_ctx *ctx)
{
    if (ctx->upload_status) return send_error(s, c, ctx->upload_status, ctx->upload_err);
    json_t *reply = NULL;
    int rc = srv__upload_commit(s, &ctx->up, ctx->tenant, &reply);
    if (rc < 0) return send_error(s, c, rc == SH_ERANGE ? 429 : rc == SH_EFORMAT ? 400 : 500, sh_errmsg());
    return send_json(s, c, 201, reply);
}

/* GET /v1/agent/workdir?job=ID: the archive, streamed from its file. */
static enum MHD_Result serve_workdir(srv *s, struct MHD_Connection *c, const srv_req *r)
{
    if (r->role != ROLE_NODE) return send_error(s, c, 403, "/v1/agent/workdir: needs a node's credential");
    const char *q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "job");
    int64_t job = 0;
    if (!q || sh_parse_i64(q, &job, "job") < 0) return send_error(s, c, 400, "/v1/agent/workdir: expected ?job=ID");
    char path[4300];
    pthread_mutex_lock(&s->mu);
    int rc = srv__workdir_for_node(s, r->node, job, path, sizeof path);
    char msg[400];
    if (rc < 0) snprintf(msg, sizeof msg, "%s", sh_errmsg());
    pthread_mutex_unlock(&s->mu);
    if (rc < 0) return send_error(s, c, status_of(rc), msg);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        if (fd >= 0) close(fd);
        return send_error(s, c, 404, "/v1/agent/workdir: the job's archive is gone from the server");
    }
    struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!resp) return close(fd), MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/x-tar");
    enum MHD_Result res = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    __atomic_fetch_add(&s->http_req[2], 1, __ATOMIC_RELAXED);
    return res;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    srv *s = cls;
    conn_ctx *ctx = *con_cls;
    if (!ctx) {
        if (!(ctx = calloc(1, sizeof *ctx))) return MHD_NO;
        *con_cls = ctx;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (!strcmp(url, "/v1/workdirs") && !strcmp(method, "POST")) return upload_start(s, c, ctx, cl);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) ctx->too_big = 1;
        return MHD_YES;
    }
    if (ctx->upload) {
        if (*upload_size) upload_chunk(s, ctx, upload, *upload_size);
        else return upload_done(s, c, ctx);
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!ctx->too_big && ctx->body.len + *upload_size <= s->cfg.max_body) {
            if (sh_buf_append(&ctx->body, upload, *upload_size) < 0) ctx->too_big = 1;
        } else ctx->too_big = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(s, c, url, method, ctx);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
    conn_ctx *ctx = *con_cls;
    if (!ctx) return;
    if (ctx->upload) srv__upload_abort(&ctx->up); /* a no-op after a commit */
    sh_buf_free(&ctx->body);
    free(ctx);
    *con_cls = NULL;
}

/* ---- start and stop --------------------------------------------------------- */

/* Tenant names become directory names, uids and filters: a name must be
 * 1 to 63 of [a-z0-9_.-], start with a letter or digit, and not be one the
 * server uses itself. */
static int tenant_name_ok(const char *n, const char **why)
{
    static const char *const reserved[] = {"admin", "agent", "root", "system", "shoal", "all", "none",
                                           "nobody", "default-admin", NULL};
    size_t len = strlen(n);
    if (len == 0 || len > 63) return *why = "must be 1 to 63 characters", 0;
    if (!((n[0] >= 'a' && n[0] <= 'z') || (n[0] >= '0' && n[0] <= '9')))
        return *why = "must start with a lowercase letter or a digit", 0;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '.' || *p == '-'))
            return *why = "may only hold a-z, 0-9, '_', '.' and '-'", 0;
    for (int i = 0; reserved[i]; i++)
        if (!strcmp(n, reserved[i])) return *why = "is reserved", 0;
    return 1;
}

/* A token of the tokens file as its hash: "sha256:HEX" stays as it is. */
static void hash_token(const char *tok, char out[SRV_HASH_LEN])
{
    if (srv__is_hash(tok)) snprintf(out, SRV_HASH_LEN, "%s", tok);
    else srv__secret_hash(tok, out);
}

static int load_tokens(srv *s)
{
    const char *path = s->cfg.tokens_path;
    if (!path) return sh_err(SH_EINVAL, "the server needs a tokens file (--tokens FILE; see docs/server-api.md)");
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        sh_warn("%s: the tokens file is readable by others (mode %03o): run chmod 600 %s", path,
                (unsigned)(st.st_mode & 0777), path);
    SH_TRY(sh_json_load_file(path, 1 << 20, &s->tokens));
    static const char *const keys[] = {"admin", "agent", "tenants", NULL};
    SH_TRY(sh_json_check_keys(s->tokens, keys, path));
    const char *a = NULL, *g = NULL;
    SH_TRY(sh_json_get_str(s->tokens, "admin", 1, path, &a));
    SH_TRY(sh_json_get_str(s->tokens, "agent", 1, path, &g));
    json_t *t = json_object_get(s->tokens, "tenants");
    if (t && !json_is_object(t)) return sh_err(SH_EFORMAT, "%s: \"tenants\" must map tenant names to tokens", path);
    if (!*a || !*g || !strcmp(a, g))
        return sh_err(SH_EFORMAT, "%s: \"admin\" and \"agent\" must be non-empty and differ", path);
    const char *name, *why = "";
    json_t *v;
    /* The provider hook hands the agent token to the nodes it creates:
     * the one secret the server must keep as given. */
    if (s->cfg.provider_cmd) {
        if (srv__is_hash(g))
            return sh_err(SH_EINVAL, "%s: \"agent\" is a hash, but --provider-cmd hands the agent token to the "
                                     "nodes it creates: give it as the token itself", path);
        s->provider_token = strdup(g);
        if (!s->provider_token) return sh_err(SH_ENOMEM, "%s", path);
    }
    /* Each token is kept as its hash (a value already "sha256:HEX" is one). */
    char ha[SRV_HASH_LEN], hg[SRV_HASH_LEN];
    hash_token(a, ha), hash_token(g, hg);
    if (!strcmp(ha, hg)) return sh_err(SH_EFORMAT, "%s: \"admin\" and \"agent\" must differ", path);
    json_object_set_new(s->tokens, "admin", json_string(ha));
    json_object_set_new(s->tokens, "agent", json_string(hg));
    void *it;
    json_object_foreach_safe(t, it, name, v) {
        if (!tenant_name_ok(name, &why))
            return sh_err(SH_EFORMAT, "%s: tenant \"%s\": the name %s", path, name, why);
        const char *tok = json_string_value(v);
        char ht[SRV_HASH_LEN];
        if (tok && *tok) hash_token(tok, ht);
        if (!tok || !*tok || !strcmp(ht, ha) || !strcmp(ht, hg))
            return sh_err(SH_EFORMAT, "%s: tenant \"%s\": the token must be a non-empty string, unlike the"
                                      " admin's and the agents'", path, name);
        json_object_set_new(t, name, json_string(ht));
    }
    return SH_OK;
}

static int start_http(srv *s)
{
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)s->cfg.port);
    if (inet_pton(AF_INET, s->cfg.bind_addr, &sa.sin_addr) != 1)
        return sh_err(SH_EINVAL, "bind address \"%s\" is not an IPv4 address", s->cfg.bind_addr);
    s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL,
                              (uint16_t)s->cfg.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &sa,
                              MHD_OPTION_NOTIFY_COMPLETED, on_done, s, MHD_OPTION_CONNECTION_LIMIT,
                              SRV_MAX_CONNS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                              s->cfg.max_conns_per_ip ? s->cfg.max_conns_per_ip : SRV_MAX_CONNS_PER_IP,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                              MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_END);
    if (!s->mhd)
        return sh_err(SH_EIO, "cannot listen on %s:%d (port in use? pick another with --port P, or --port 0 for any free one)",
                      s->cfg.bind_addr, s->cfg.port);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : s->cfg.port;
    return SH_OK;
}

/* Every TENANT=DIR entry of --allow-writable names a tenant of the tokens
 * file: a typo would otherwise leave that tenant without its folder. */
static int check_allowed_tenants(srv *s)
{
    char allow[8192];
    snprintf(allow, sizeof allow, "%s", s->cfg.writable_allow ? s->cfg.writable_allow : "");
    for (char *sv = NULL, *e = strtok_r(allow, ":", &sv); e; e = strtok_r(NULL, ":", &sv)) {
        const char *a;
        const char *dir = srv__allow_split(e, &a);
        if (a && !json_object_get(json_object_get(s->tokens, "tenants"), a))
            return sh_err(SH_EINVAL, "--allow-writable %s=%s: no tenant \"%s\" in %s", a, dir, a,
                          s->cfg.tokens_path);
    }
    return SH_OK;
}

/* --max-priority: "N" sets every tenant's limit, "TENANT=N" one tenant's
 * (the later entry wins); each TENANT must be in the tokens file. */
static int load_max_priority(srv *s)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", s->cfg.max_priority ? s->cfg.max_priority : "");
    s->prio_max = json_object();
    if (!s->prio_max) return sh_err(SH_ENOMEM, "--max-priority");
    for (char *sv = NULL, *e = strtok_r(buf, ":", &sv); e; e = strtok_r(NULL, ":", &sv)) {
        char *eq = strchr(e, '=');
        int64_t n;
        if (sh_parse_i64(eq ? eq + 1 : e, &n, "--max-priority") < 0 || n < -1000 || n > 1000)
            return sh_err(SH_EINVAL, "--max-priority %s: expected N or TENANT=N with N in -1000..1000", e);
        if (!eq) {
            s->prio_default = (int)n;
            continue;
        }
        *eq = 0;
        if (!json_object_get(json_object_get(s->tokens, "tenants"), e))
            return sh_err(SH_EINVAL, "--max-priority %s=%lld: no tenant \"%s\" in %s", e, (long long)n, e,
                          s->cfg.tokens_path);
        json_object_set_new(s->prio_max, e, json_integer(n));
    }
    return SH_OK;
}

/* The standby's election thread (leader.c): once it wins, the state comes
 * from the database as at a restart, and the scheduler thread starts. */
static void *lead_main(void *arg)
{
    srv *s = arg;
    int got = 0;
    while (!__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE) && !got) srv__lead_try(s, &got);
    if (!got) return NULL;
    double t0 = sh_now_mono();
    int rc = srv__lead_claim(s); /* s->mu held when it succeeds */
    if (rc == SH_OK) {
        rc = srv__db_load(s, srv__job_from_row);
        if (rc == SH_OK) rc = srv__db_tenants(s);
        if (rc == SH_OK) rc = srv__db_begin(s);
        if (rc == SH_OK) {
            rc = srv__seam_init(s);
            if (rc == SH_OK)
                rc = srv__db_event(s, 0, NULL, "leader", "server %s leads (epoch %lld)", s->self_url,
                                   (long long)s->epoch);
            if (rc == SH_OK) rc = srv__commit(s);
            else srv__rollback(s);
        }
        if (rc == SH_OK) {
            s->t_led_wall = sh_now_wall();
            s->dirty = 1;
            __atomic_store_n(&s->leader, 1, __ATOMIC_RELEASE);
            sh_info("leading as %s (epoch %lld): %lld jobs, %d nodes loaded in %.3f s", s->self_url,
                    (long long)s->epoch, (long long)s->njobs, s->nnodes, sh_now_mono() - t0);
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (rc == SH_OK) rc = srv__sched_start(s);
    if (rc < 0) {
        pthread_mutex_lock(&s->mu);
        snprintf(s->failed, sizeof s->failed, "could not take over as leader: %s", sh_errmsg());
        sh_warn("%s", s->failed);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* PostgreSQL: serve as a standby at once (redirecting to the leader) and
 * run for leader in the background (leader.c). */
static int start_standby(srv *s, srv **out)
{
    int rc = start_http(s);
    if (rc == SH_OK) {
        if (s->cfg.advertise) snprintf(s->self_url, sizeof s->self_url, "%s", s->cfg.advertise);
        else snprintf(s->self_url, sizeof s->self_url, "http://%s:%d", s->cfg.bind_addr, s->port);
        if (pthread_create(&s->lead_thread, NULL, lead_main, s)) rc = sh_err(SH_EIO, "cannot start the election thread");
    }
    if (rc < 0) {
        if (s->mhd) MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        srv_stop(s);
        return rc;
    }
    *out = s;
    return SH_OK;
}

int srv_start(const srv_config *cfg, srv **out)
{
    srv *s = calloc(1, sizeof *s);
    if (!s) return sh_err(SH_ENOMEM, "server");
    s->lock_fd = -1;
    s->cfg = *cfg;
    if (!s->cfg.bind_addr) s->cfg.bind_addr = "127.0.0.1";
    if (s->cfg.heartbeat_timeout <= 0) s->cfg.heartbeat_timeout = 3;
    if (!s->cfg.max_body) s->cfg.max_body = 1 << 20;
    if (!s->cfg.workdir_max) s->cfg.workdir_max = SH_TAR_DEFAULT_LIMIT;
    if (!s->cfg.workdir_quota) s->cfg.workdir_quota = SRV_WORKDIR_QUOTA;
    if (!s->cfg.max_log) s->cfg.max_log = SRV_MAX_LOG;
    if (!s->cfg.max_tenant_log) s->cfg.max_tenant_log = SRV_MAX_TENANT_LOG;
    if (!s->cfg.max_queued) s->cfg.max_queued = SRV_MAX_QUEUED;
    if (s->cfg.scale_up_wait_s <= 0) s->cfg.scale_up_wait_s = 2;
    if (s->cfg.scale_down_idle_s <= 0) s->cfg.scale_down_idle_s = 10;
    if (!s->cfg.db_path) s->cfg.db_path = "shoal.db";
    int pg = srv__store_is_pg(s->cfg.db_path);
    snprintf(s->dir, sizeof s->dir, "%s", s->cfg.state_dir ? s->cfg.state_dir : s->cfg.db_path);
    char *slash = strrchr(s->dir, '/');
    if (s->cfg.state_dir) ;
    else if (slash) *slash = 0;
    else snprintf(s->dir, sizeof s->dir, ".");
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->lead_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->sched_cv, NULL);
    int rc = load_tokens(s);
    if (rc == SH_OK && pg && !s->cfg.state_dir)
        rc = sh_err(SH_EINVAL, "a PostgreSQL --db needs --state-dir DIR for the ranks' logs (shared by the servers"
                               " of one database; docs/deploy.md)");
    if (rc == SH_OK && s->cfg.state_dir && sh_mkdir_p(s->cfg.state_dir, 0700) < 0)
        rc = sh_err_wrap(SH_EIO, "--state-dir %s", s->cfg.state_dir);
    if (rc == SH_OK) rc = check_allowed_tenants(s);
    if (rc == SH_OK) rc = load_max_priority(s);
    if (rc == SH_OK && !realpath(s->dir, s->state_dir))
        rc = sh_err_errno(errno, "%s: the database's directory", s->dir);
    /* One server per database: a second would schedule the same nodes. */
    char lockf[4200];
    long held = 0;
    snprintf(lockf, sizeof lockf, "%s.lock", s->cfg.db_path);
    if (rc == SH_OK && !pg && (rc = sh_lock_pid(lockf, &s->lock_fd, &held)) == SH_EEXIST)
        rc = sh_err(SH_EEXIST, "%s is in use by another shoal server (pid %ld): stop it, or give this one its "
                    "own --db", s->cfg.db_path, held);
    if (rc == SH_OK) rc = srv__db_open(s);
    if (rc == SH_OK && pg) return start_standby(s, out);
    s->leader = 1;
    s->lease_until = INFINITY;
    if (rc == SH_OK) rc = srv__db_load(s, srv__job_from_row);
    if (rc == SH_OK) rc = srv__db_tenants(s);
    if (rc == SH_OK) rc = srv__db_begin(s);
    if (rc == SH_OK) {
        rc = srv__seam_init(s);
        if (rc == SH_OK) rc = srv__commit(s);
        else srv__rollback(s);
    }
    if (rc == SH_OK) rc = start_http(s);
    if (rc == SH_OK) rc = srv__sched_start(s);
    if (rc < 0) {
        if (s->mhd) MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        s->sched_thread = 0;
        srv_stop(s);
        return rc;
    }
    s->dirty = 1;
    *out = s;
    return SH_OK;
}

int srv_port(const srv *s) { return s->port; }

int srv_leading(srv *s) { return srv__lead_acting(s); }

const char *srv_failed(srv *s)
{
    pthread_mutex_lock(&s->mu);
    const char *f = s->failed[0] ? s->failed : NULL;
    pthread_mutex_unlock(&s->mu);
    return f;
}

void srv_stop(srv *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    __atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->sched_cv);
    pthread_mutex_unlock(&s->mu);
    if (s->lead_thread) pthread_join(s->lead_thread, NULL);
    if (s->sched_thread) pthread_join(s->sched_thread, NULL);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    if (s->db) srv__db_close(s);
    if (s->lock_fd >= 0) close(s->lock_fd);
    srv__free_state(s);
    json_decref(s->tokens);
    free(s->provider_token);
    json_decref(s->prio_max);
    free(s->tlog);
    json_decref(s->tenant_num);
    json_decref(s->runs);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->lead_mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->sched_cv);
    free(s);
}

int srv_add_bench_nodes(srv *s, int n, const char *gpu_type, int gpus)
{
    pthread_mutex_lock(&s->mu);
    int rc = srv__db_begin(s);
    for (int i = 0; rc == SH_OK && i < n; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"name\":\"bench-%d\",\"gpu_type\":\"%s\",\"gpus\":%d,\"zone\":\"z%d\",\"fabric\":\"f%d\"}",
                 i, gpu_type, gpus, i % 4, i % 8);
        json_t *b = json_loads(body, 0, NULL), *reply = NULL;
        rc = srv__agent_register(s, b, &reply);
        json_decref(b);
        json_decref(reply);
    }
    if (rc == SH_OK) rc = srv__commit(s);
    else srv__rollback(s);
    pthread_mutex_unlock(&s->mu);
    return rc;
}
