/* A small HTTP/1.1 client for the server's own API.
 *
 * It speaks just what the server sends back: a status line, headers and a
 * Content-Length body (libmicrohttpd always sets it for buffer responses).
 * One connection is kept alive per client, which matters for the agents'
 * long polls and for the benchmark's load generator; a request that finds the
 * kept connection closed by the peer is retried once on a fresh one. */
#include "shoal/common.h"
#include "shoal/server.h"

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

struct srv_client {
    char host[256];
    char port[16];
    char url[300];
    char *token;
    int fd;
};

int srv_client_new(const char *url, const char *token, srv_client **out)
{
    const char *p = url;
    if (strncmp(p, "http://", 7))
        return sh_err(SH_EINVAL, "server address \"%s\": expected http://HOST:PORT", url);
    p += 7;
    const char *colon = strchr(p, ':');
    if (!colon || colon == p || strlen(p) > 250)
        return sh_err(SH_EINVAL, "server address \"%s\": expected http://HOST:PORT", url);
    srv_client *c = calloc(1, sizeof *c);
    if (!c) return sh_err(SH_ENOMEM, "client for %s", url);
    snprintf(c->host, sizeof c->host, "%.*s", (int)(colon - p), p);
    snprintf(c->port, sizeof c->port, "%.*s", (int)strcspn(colon + 1, "/"), colon + 1);
    snprintf(c->url, sizeof c->url, "http://%s:%s", c->host, c->port);
    c->token = token && *token ? strdup(token) : NULL;
    c->fd = -1;
    *out = c;
    return SH_OK;
}

void srv_client_free(srv_client *c)
{
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    free(c->token);
    free(c);
}

static int cl__connect(srv_client *c)
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
static int cl__read_some(srv_client *c, sh_buf *b, double deadline)
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
static long cl__head(srv_client *c, const sh_buf *b, int *status, long *clen, int *close_after)
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

static int cl__once(srv_client *c, const sh_buf *req, double deadline, int *status, char **reply,
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

int srv_client_raw(srv_client *c, const char *method, const char *path, const char *body,
                   size_t body_len, const char *extra_header, double timeout_s, int *status,
                   char **reply, size_t *reply_len)
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
    double deadline = sh_now_mono() + (timeout_s > 0 ? timeout_s : 30);
    int reused = c->fd >= 0;
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

int srv_client_call(srv_client *c, const char *method, const char *path, const json_t *body,
                    const char *extra_header, double timeout_s, int *status, json_t **reply)
{
    char *text = NULL;
    if (body && !(text = json_dumps(body, JSON_COMPACT)))
        return sh_err(SH_ENOMEM, "%s %s: cannot serialise the request", method, path);
    char *r = NULL;
    size_t rlen = 0;
    int rc = srv_client_raw(c, method, path, text, text ? strlen(text) : 0, extra_header, timeout_s,
                            status, &r, &rlen);
    free(text);
    if (rc < 0) return rc;
    *reply = rlen ? json_loadb(r, rlen, 0, NULL) : NULL;
    free(r);
    return SH_OK;
}
