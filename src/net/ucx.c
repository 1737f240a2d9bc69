/* UCX set-up for every UCX user in shoal (include/shoal/net.h): one place
 * that knows how a context, a worker, a listener and client-server
 * endpoints are made. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/net.h"

int net_addr_parse(const char *addr, const char *what, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
        return sh_err(SH_EINVAL, "%s \"%s\": expected host:port", what, addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    int64_t port;
    SH_TRY(sh_parse_i64(colon + 1, &port, what));
    if (port < 0 || port > 65535) return sh_err(SH_ERANGE, "%s \"%s\": bad port", what, addr);
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return sh_err(SH_EINVAL, "%s \"%s\": \"%s\" is not an IPv4 address", what, addr, host);
    return SH_OK;
}

int net_ucx_open(net_ucx *u, const char *who, uint64_t features)
{
    memset(u, 0, sizeof *u);
    u->efd = -1;
    /* A listener restarted on its port (the address its peers know) must
     * bind it while connections its previous run closed first sit in
     * TIME_WAIT.  UCX's TCP listener sets SO_REUSEADDR only when told to
     * (UCX 1.13's default is no; ucp_config_modify does not reach the
     * connection manager's settings).  A value the user set wins. */
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
    ucp_config_t *conf;
    ucs_status_t st = ucp_config_read(NULL, NULL, &conf);
    if (st != UCS_OK) return sh_err(SH_EIO, "%s: UCX configuration: %s", who, ucs_status_string(st));
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = features | UCP_FEATURE_WAKEUP};
    st = ucp_init(&p, conf, &u->ctx);
    ucp_config_release(conf);
    if (st != UCS_OK) {
        u->ctx = NULL;
        return sh_err(SH_EIO, "%s: ucp_init: %s (check UCX_TLS)", who, ucs_status_string(st));
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((st = ucp_worker_create(u->ctx, &wp, &u->worker)) != UCS_OK) {
        u->worker = NULL;
        net_ucx_close(u);
        return sh_err(SH_EIO, "%s: ucp_worker_create: %s", who, ucs_status_string(st));
    }
    if (ucp_worker_get_efd(u->worker, &u->efd) != UCS_OK) u->efd = -1;
    return SH_OK;
}

int net_ucx_listen(net_ucx *u, const char *who, const char *hostport, ucp_listener_conn_callback_t cb,
                   void *arg)
{
    struct sockaddr_in sa;
    SH_TRY(net_addr_parse(hostport, "listen address", &sa));
    ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                                              UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof sa},
                                .conn_handler = {.cb = cb, .arg = arg}};
    ucs_status_t st = ucp_listener_create(u->worker, &lp, &u->listener);
    if (st != UCS_OK) {
        u->listener = NULL;
        return sh_err(SH_EIO, "%s: listen on %s: %s", who, hostport, ucs_status_string(st));
    }
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    if ((st = ucp_listener_query(u->listener, &la)) != UCS_OK)
        return sh_err(SH_EIO, "%s: listener query: %s", who, ucs_status_string(st));
    const struct sockaddr_in *got = (const struct sockaddr_in *)&la.sockaddr;
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &got->sin_addr, host, sizeof host);
    snprintf(u->addr, sizeof u->addr, "%s:%u", host, ntohs(got->sin_port));
    return SH_OK;
}

int net_ucx_connect(net_ucx *u, const char *who, const char *hostport, ucp_err_handler_cb_t on_err, void *arg,
                    ucp_ep_h *out)
{
    *out = NULL;
    struct sockaddr_in sa;
    SH_TRY(net_addr_parse(hostport, "peer address", &sa));
    ucp_ep_params_t p = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                       UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                         .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                         .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof sa},
                         .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                         .err_handler = {.cb = on_err, .arg = arg}};
    ucs_status_t st = ucp_ep_create(u->worker, &p, out);
    if (st != UCS_OK) {
        *out = NULL;
        return sh_err(SH_EIO, "%s: connect to %s: %s", who, hostport, ucs_status_string(st));
    }
    return SH_OK;
}

int net_ucx_accept(net_ucx *u, ucp_conn_request_h req, ucp_err_handler_cb_t on_err, void *arg, ucp_ep_h *out)
{
    ucp_ep_params_t p = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                                       UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                         .conn_request = req,
                         .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                         .err_handler = {.cb = on_err, .arg = arg}};
    ucs_status_t st = ucp_ep_create(u->worker, &p, out);
    if (st != UCS_OK) {
        *out = NULL;
        return sh_err(SH_EIO, "accept: %s", ucs_status_string(st));
    }
    return SH_OK;
}

void net_ucx_close(net_ucx *u)
{
    if (u->listener) ucp_listener_destroy(u->listener);
    if (u->worker) ucp_worker_destroy(u->worker);
    if (u->ctx) ucp_cleanup(u->ctx);
    u->listener = NULL, u->worker = NULL, u->ctx = NULL, u->efd = -1;
}
