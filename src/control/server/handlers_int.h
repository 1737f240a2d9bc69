/* The handlers layer (api.c, agentapi.c, metrics.c): the /v1 API, the
 * agents' API, the /metrics text.
 * A file includes the headers of its own layer and the layers below it
 * (scripts/check-layers.py, LAYERS). */
#ifndef SHOAL_SRV_HANDLERS_INT_H
#define SHOAL_SRV_HANDLERS_INT_H

#include "srv_int.h"

/* Closed ledger rows plus what running members have cost so far:
 * {"by_tenant": {tenant: {gpu_type: {dollars, gpu_seconds}}}, "total_dollars"}
 * (all tenants when tenant is NULL).  Caller holds s->mu and owns the result. */
json_t *srv__costs(srv *s, const char *tenant);
int srv__agent_register(srv *s, json_t *body, json_t **reply);
/* Runs for the node whose credential the request carried (index node). */
int srv__agent_poll(srv *s, int node, json_t *body, json_t **reply);
int srv__log_path(srv *s, int64_t job, int rank, char *out, size_t cap);
/* 1 if path is dir or lies under it (both plain absolute paths). */
char *srv__allow_split(char *entry, const char **owner);
int srv__allow_applies(char **entry, const char *tenant);
int srv__path_under(const char *path, const char *dir);
int srv__presubmit(const srv_config *cfg, srv_req *r);
int srv__handle(srv *s, srv_req *r, int *status, json_t **reply);
/* metrics.c: the Prometheus text; tenant: whose bills to show (NULL every tenant's, "" none). */
void srv__metrics(srv *s, sh_buf *out, const char *tenant);

#endif
