/* A small HTTP/1.1 client for the server's own API.
 *
 * It speaks just what the server sends back: a status line, headers and a
 * Content-Length body (libmicrohttpd always sets it for buffer responses).
 * One connection is kept alive per client, which matters for the agents'
 * long polls and for the benchmark's load generator; a request that finds the
 * kept connection closed by the peer is retried once on a fresh one. */
#include "shoal/common.h"
#include "shoal/client.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define CL_MAX_URLS 8

struct client_conn {
    char host[256]; /* the server talked to now */
    char port[16];
    char url[300];
    char urls[CL_MAX_URLS][300]; /* every server given, http://HOST:PORT */
    int nurls, cur;
    char *token;
    int fd;
};

/* Parses "http://HOST:PORT[/...]" into host and port; 0 if it is not one. */
static int cl__parse(const char *url, size_t len, char host[256], char port[16])
{
    if (len < 7 || strncmp(url, "http://", 7)) return 0;
    const char *p = url + 7, *end = url + len;
    const char *colon = memchr(p, ':', (size_t)(end - p));
    if (!colon || colon == p || colon - p > 250) return 0;
    size_t plen = strcspn(colon + 1, "/,");
    if (colon + 1 + plen > end) plen = (size_t)(end - colon - 1);
    if (plen == 0 || plen > 5) return 0;
    snprintf(host, 256, "%.*s", (int)(colon - p), p);
    snprintf(port, 16, "%.*s", (int)plen, colon + 1);
    for (const char *d = port; *d; d++)
        if (*d < '0' || *d > '9') return 0;
    return 1;
}

/* Makes the client talk to host:port from its next request on. */
static void cl__target(client_conn *c, const char *host, const char *port)
{
    if (!strcmp(c->host, host) && !strcmp(c->port, port)) return;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    snprintf(c->host, sizeof c->host, "%s", host);
    snprintf(c->port, sizeof c->port, "%s", port);
    snprintf(c->url, sizeof c->url, "http://%s:%s", c->host, c->port);
}

int client_new(const char *url, const char *token, client_conn **out)
{
    client_conn *c = calloc(1, sizeof *c);
    if (!c) return sh_err(SH_ENOMEM, "client for %s", url);
    c->fd = -1;
    for (const char *p = url; *p;) {
        size_t n = strcspn(p, ",");
        char host[256], port[16];
        if (!cl__parse(p, n, host, port) || c->nurls == CL_MAX_URLS) {
            int full = c->nurls == CL_MAX_URLS;
            free(c);
            return full
                       ? sh_err(SH_EINVAL, "server addresses \"%s\": at most %d", url, CL_MAX_URLS)
                       : sh_err(SH_EINVAL, "server address \"%.*s\": expected http://HOST:PORT (several: comma-separated)",
                                (int)n, p);
        }
        snprintf(c->urls[c->nurls++], sizeof c->urls[0], "http://%s:%s", host, port);
        if (c->nurls == 1) cl__target(c, host, port);
        p += n;
        if (*p == ',') p++;
    }
    if (!c->nurls) {
        free(c);
        return sh_err(SH_EINVAL, "server address \"\": expected http://HOST:PORT");
    }
    c->token = token && *token ? strdup(token) : NULL;
    *out = c;
    return SH_OK;
}

void client_free(client_conn *c)
{
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    free(c->token);
    free(c);
}

static int cl__connect(client_conn *c)
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int e = getaddrinfo(c->host, c->port, &hints, &ai);
    if (e) return sh_err(SH_EIO, "%s: cannot resolve: %s", c->url, gai_strerror(e));
    int fd = -1, err = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return sh_err(SH_EIO, "%s: cannot connect: %s (is `shoal server` running there?)", c->url,
                      strerror(err ? err : ECONNREFUSED));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    return SH_OK;
}

/* Reads into b until `want` total bytes or the deadline; returns bytes read
 * in this call, 0 on EOF, or a negative code. */
static int cl__read_some(client_conn *c, sh_buf *b, double deadline)
{
    double left = deadline - sh_now_mono();
    if (left <= 0) return sh_err(SH_ETIMEDOUT, "%s: no reply in time", c->url);
    struct pollfd pfd = {c->fd, POLLIN, 0};
    int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
    if (pr == 0) return sh_err(SH_ETIMEDOUT, "%s: no reply in time", c->url);
    if (pr < 0) return errno == EINTR ? 1 : sh_err_errno(errno, "%s: poll", c->url);
    SH_TRY(sh_buf_reserve(b, 65536));
    ssize_t n = recv(c->fd, b->data + b->len, b->cap - b->len - 1, 0);
    if (n < 0) return errno == EINTR ? 1 : sh_err_errno(errno, "%s: receive", c->url);
    b->len += (size_t)n;
    b->data[b->len] = 0;
    return (int)(n > 0 ? 1 : 0);
}

/* Parses the head of a reply once it is complete; returns the offset of the
 * body, 0 while incomplete, or a negative code. */
static long cl__head(client_conn *c, const sh_buf *b, int *status, long *clen, int *close_after)
{
    const char *end = strstr((const char *)b->data, "\r\n\r\n");
    if (!end) return 0;
    if (sscanf((const char *)b->data, "HTTP/1.%*d %d", status) != 1)
        return sh_err(SH_EFORMAT, "%s: reply is not HTTP", c->url);
    *clen = -1;
    *close_after = 0;
    for (const char *l = strstr((const char *)b->data, "\r\n") + 2; l < end; l = strstr(l, "\r\n") + 2) {
        if (!strncasecmp(l, "Content-Length:", 15)) *clen = strtol(l + 15, NULL, 10);
        if (!strncasecmp(l, "Connection:", 11) && strstr(l, "close") && strstr(l, "close") < strstr(l, "\r\n"))
            *close_after = 1;
    }
    if (*clen < 0) *close_after = 1; /* body runs to EOF */
    return (long)(end + 4 - (const char *)b->data);
}

static int cl__once(client_conn *c, const sh_buf *req, double deadline, int *status, char **reply,
                    size_t *reply_len)
{
    if (c->fd < 0) SH_TRY(cl__connect(c));
    if (send(c->fd, req->data, req->len, MSG_NOSIGNAL) != (ssize_t)req->len)
        return sh_err(SH_EAGAIN, "%s: connection dropped while sending", c->url);
    sh_buf b = {0};
    long body = 0, clen = -1;
    int close_after = 0, rc = SH_OK;
    for (;;) {
        int n = cl__read_some(c, &b, deadline);
        if (n < 0) { rc = n; break; }
        if (n == 0 && b.len == 0) { rc = sh_err(SH_EAGAIN, "%s: connection closed", c->url); break; }
        if (b.len == 0) continue; /* interrupted before anything arrived */
        if (!body && (body = cl__head(c, &b, status, &clen, &close_after)) < 0) { rc = (int)body; break; }
        if (body && clen >= 0 && (long)b.len >= body + clen) break;
        if (n == 0) {
            if (!body || clen >= 0) rc = sh_err(SH_EFORMAT, "%s: reply cut short", c->url);
            clen = (long)b.len - body;
            break;
        }
    }
    if (rc < 0 || close_after) {
        close(c->fd);
        c->fd = -1;
    }
    if (rc < 0) {
        sh_buf_free(&b);
        return rc;
    }
    memmove(b.data, b.data + body, (size_t)clen);
    b.data[clen] = 0;
    *reply = (char *)b.data;
    *reply_len = (size_t)clen;
    return SH_OK;
}

static int cl__raw1(client_conn *c, const char *method, const char *path, const char *body, size_t body_len,
                   const char *extra_header, double deadline, int *status, char **reply, size_t *reply_len,
                   int *sent)
{
    sh_buf req = {0};
    int rc = sh_buf_printf(&req, "%s %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Length: %zu\r\n", method,
                           path, c->host, c->port, body ? body_len : 0);
    if (rc == SH_OK && body) rc = sh_buf_printf(&req, "Content-Type: application/json\r\n");
    if (rc == SH_OK && c->token) rc = sh_buf_printf(&req, "Authorization: Bearer %s\r\n", c->token);
    if (rc == SH_OK && extra_header) rc = sh_buf_printf(&req, "%s\r\n", extra_header);
    if (rc == SH_OK) rc = sh_buf_append(&req, "\r\n", 2);
    if (rc == SH_OK && body) rc = sh_buf_append(&req, body, body_len);
    if (rc < 0) {
        sh_buf_free(&req);
        return rc;
    }
    int reused = c->fd >= 0;
    *sent = 0;
    if (c->fd < 0 && (rc = cl__connect(c)) < 0) {
        sh_buf_free(&req);
        return rc;
    }
    *sent = 1;
    rc = cl__once(c, &req, deadline, status, reply, reply_len);
    /* A kept-alive connection the server has since closed fails at once;
     * that is not an error of the request, so try a fresh connection. */
    if (rc == SH_EAGAIN && reused) {
        if (c->fd >= 0) close(c->fd);
        c->fd = -1;
        rc = cl__once(c, &req, deadline, status, reply, reply_len);
    }
    if (rc == SH_EAGAIN) rc = sh_err(SH_EIO, "%s", sh_errmsg());
    sh_buf_free(&req);
    if (rc < 0 && c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    return rc;
}

int client_call(client_conn *c, const char *method, const char *path, const json_t *body,
                const char *extra_header, double timeout_s, int *status, json_t **reply)
{
    char *text = NULL;
    if (body && !(text = json_dumps(body, JSON_COMPACT)))
        return sh_err(SH_ENOMEM, "%s %s: cannot serialise the request", method, path);
    char *r = NULL;
    size_t rlen = 0;
    int rc = client_raw(c, method, path, text, text ? strlen(text) : 0, extra_header, timeout_s,
                        status, &r, &rlen);
    free(text);
    if (rc < 0) return rc;
    *reply = rlen ? json_loadb(r, rlen, 0, NULL) : NULL;
    free(r);
    return SH_OK;
}

/* The Location of a 307 reply's head is not kept; a standby's JSON body
 * names the leader instead ("leader"). */
static int cl__standby(const char *reply, size_t len, char host[256], char port[16])
{
    json_t *j = json_loadb(reply, len, 0, NULL);
    const char *l = json_string_value(json_object_get(j, "leader"));
    int ok = json_object_get(j, "standby") && l && cl__parse(l, strlen(l), host, port);
    int standby = json_object_get(j, "standby") != NULL;
    json_decref(j);
    return ok ? 2 : standby;
}

/* Several servers (a leader and standbys, docs/deploy.md): a request goes
 * to the one that answered last; a standby's redirect is followed, and a
 * server that cannot be reached or stands by without knowing the leader
 * passes the request to the next, until the deadline.  A request that
 * reached a server which then vanished is re-sent only when that is safe:
 * a GET, an agent's poll (declarative), or a request with an
 * Idempotency-Key. */
int client_raw(client_conn *c, const char *method, const char *path, const char *body,
               size_t body_len, const char *extra_header, double timeout_s, int *status,
               char **reply, size_t *reply_len)
{
    double deadline = sh_now_mono() + (timeout_s > 0 ? timeout_s : 30);
    int safe = !strcmp(method, "GET") || !strncmp(path, "/v1/agent/", 10) ||
               (extra_header && !strncasecmp(extra_header, "Idempotency-Key:", 16));
    for (int tries = 0;; tries++) {
        int sent = 0;
        int rc = cl__raw1(c, method, path, body, body_len, extra_header, deadline, status, reply, reply_len, &sent);
        char host[256], port[16];
        int sb = rc == SH_OK && (*status == 307 || *status == 503) ? cl__standby(*reply, *reply_len, host, port) : 0;
        if (rc == SH_OK && !sb) return SH_OK;
        int more = sh_now_mono() < deadline && tries < 1000;
        if (sb == 2 && more) { /* a standby named the leader */
            free(*reply);
            *reply = NULL;
            cl__target(c, host, port);
            continue;
        }
        if (sb == 1 && (c->nurls == 1 || !more)) return SH_OK; /* the caller sees the 503 */
        if (rc < 0 && (c->nurls == 1 || !more || (sent && !safe))) {
            if (sent && !safe && c->nurls > 1)
                return sh_err(SH_EIO, "%s (the request may or may not have been applied: retry it with an"
                                      " Idempotency-Key)", sh_errmsg());
            return rc;
        }
        if (sb) free(*reply), *reply = NULL;
        /* The next server; a whole round without an answer waits a little. */
        c->cur = (c->cur + 1) % c->nurls;
        if (c->cur == 0) sh_sleep(0.05);
        char h[256], p[16];
        cl__parse(c->urls[c->cur], strlen(c->urls[c->cur]), h, p);
        cl__target(c, h, p);
    }
}
