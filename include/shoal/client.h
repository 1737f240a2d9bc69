/* shoal client: the small HTTP/1.1 client the command line, the agents, the
 * local fleet and the benchmark use to talk to a server's API
 * (docs/server-api.md).  It knows nothing of the server's insides: a
 * program that only talks to a server links this and not the server. */
#ifndef SHOAL_CLIENT_H
#define SHOAL_CLIENT_H

#include <stddef.h>

#include <jansson.h>

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

typedef struct client_conn client_conn;

/* `url` is "http://host:port" (a trailing slash is ignored); `token` may be
 * NULL.  The connection is opened lazily and kept alive across requests. */
int client_new(const char *url, const char *token, client_conn **out);
void client_free(client_conn *c);
/* Sends one request.  `body` (may be NULL) is sent as JSON; *status gets the
 * HTTP status and *reply the parsed JSON body (NULL if the body was not
 * JSON; caller owns it).  Transport failures return SH_EIO naming the URL;
 * an HTTP error status is not a failure here.  `extra_header` (may be NULL)
 * is one "Name: value" line. */
int client_call(client_conn *c, const char *method, const char *path, const json_t *body,
                const char *extra_header, double timeout_s, int *status, json_t **reply);
/* Like client_call, returning the raw reply body (caller frees). */
int client_raw(client_conn *c, const char *method, const char *path, const char *body,
               size_t body_len, const char *extra_header, double timeout_s, int *status,
               char **reply, size_t *reply_len);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
