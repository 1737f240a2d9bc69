/* libFuzzer target: the server's request handlers, over real HTTP on
 * loopback.  The first byte of an input picks an endpoint and a token, the
 * rest is the body (or the query string / path).  The server must answer
 * every input with a status below 500 (or 500 only for a failed write, which
 * cannot happen here) and stay up; a crash, a hang or a 5xx is a finding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shoal/common.h"
#include "shoal/client.h"
#include "shoal/server.h"

static srv *S;
static client_conn *C[4];

static void setup(void)
{
    char dir[] = "/tmp/shoal-fuzz-XXXXXX";
    if (!mkdtemp(dir)) abort();
    char tok[256], db[256];
    snprintf(tok, sizeof tok, "%s/tokens.json", dir);
    snprintf(db, sizeof db, "%s/state.db", dir);
    const char *t = "{\"admin\":\"a\",\"agent\":\"g\",\"tenants\":{\"alice\":\"t\",\"bob\":\"u\"}}";
    if (sh_write_atomic(tok, t, strlen(t))) abort();
    srv_config c = {0};
    c.db_path = db;
    c.tokens_path = tok;
    c.heartbeat_timeout = 1e9;
    c.max_body = 4096;
    if (srv_start(&c, &S)) abort();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv_port(S));
    const char *tokens[4] = {"t", "u", "g", "a"};
    for (int i = 0; i < 4; i++)
        if (client_new(url, tokens[i], &C[i])) abort();
    /* Some state for the handlers to work on: two nodes, one job. */
    int st;
    char *r;
    size_t rl;
    const char *reg = "{\"name\":\"n0\",\"gpu_type\":\"H100\",\"gpus\":8}";
    client_raw(C[2], "POST", "/v1/agent/register", reg, strlen(reg), NULL, 5, &st, &r, &rl);
    free(r);
    const char *job = "{\"name\":\"j\",\"nodes\":1,\"command\":[\"true\"]}";
    client_raw(C[0], "POST", "/v1/jobs", job, strlen(job), NULL, 5, &st, &r, &rl);
    free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!S) setup();
    if (size < 1) return 0;
    static const struct { const char *method, *path; int client, body; } eps[] = {
        {"POST", "/v1/jobs", 0, 1},          {"POST", "/v1/agent/register", 2, 1},
        {"POST", "/v1/agent/poll", 2, 1},    {"GET", "/v1/jobs/", 1, 0},
        {"POST", "/v1/jobs/%s/cancel", 0, 0}, {"GET", "/v1/jobs?", 3, 0},
        {"GET", "/v1/events?", 0, 0},        {"DELETE", "/v1/nodes/", 3, 0},
    };
    const size_t neps = sizeof eps / sizeof eps[0];
    size_t e = data[0] % neps;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    char path[600];
    char arg[256];
    size_t k = 0;
    /* A path segment or query: keep it to printable bytes without spaces. */
    for (size_t i = 0; i < n && k + 1 < sizeof arg; i++)
        if (rest[i] > ' ' && rest[i] < 127) arg[k++] = rest[i];
    arg[k] = 0;
    if (strstr(eps[e].path, "%s")) snprintf(path, sizeof path, "/v1/jobs/%s/cancel", arg);
    else snprintf(path, sizeof path, "%s%s", eps[e].path, eps[e].body ? "" : arg);
    int st = 0;
    char *r = NULL;
    size_t rl = 0;
    int rc = client_raw(C[eps[e].client], eps[e].method, path, eps[e].body ? rest : NULL, eps[e].body ? n : 0,
                        NULL, 10, &st, &r, &rl);
    free(r);
    if (rc < 0) {
        fprintf(stderr, "transport failure on %s %s: %s\n", eps[e].method, path, sh_errmsg());
        abort();
    }
    if (st >= 500) {
        fprintf(stderr, "%s %s answered %d\n", eps[e].method, path, st);
        abort();
    }
    return 0;
}
