/* Autoscaling through a provider hook (docs/server-api.md, "Provider hook").
 *
 * The core decides when to scale (SCHED_D_SCALE_UP / SCALE_DOWN, bounded by
 * the quota); this file only runs the provider command with a JSON request
 * on its stdin and does not wait for it: a created node shows up when its
 * agent registers, like any other.  Commands are reaped on each tick. */
#include "srv_int.h"
#include "db_int.h"
#include "seam_int.h"
#include "state_int.h"
#include "provider_int.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

int srv__provider_config(srv *s, sched_config *c)
{
    if (!s->cfg.provider_cmd) return SH_OK;
    if (!s->cfg.provider_quota)
        return sh_err(SH_EINVAL, "--provider-cmd needs --provider-quota ZONE,FABRIC,GPU_TYPE,GPUS,MAX_NODES,PRICE");
    snprintf(s->quota_buf, sizeof s->quota_buf, "%s", s->cfg.provider_quota);
    char *f[6] = {0}, *save = NULL;
    int n = 0;
    for (char *t = strtok_r(s->quota_buf, ",", &save); t && n < 6; t = strtok_r(NULL, ",", &save)) f[n++] = t;
    int64_t gpus = 0, max = 0;
    double price = 0;
    if (n != 6 || sh_parse_i64(f[3], &gpus, "GPUS") < 0 || sh_parse_i64(f[4], &max, "MAX_NODES") < 0 ||
        sh_parse_double(f[5], &price, "PRICE") < 0 || gpus < 1 || gpus > SCHED_MAX_NODE_GPUS || max < 1)
        return sh_err(SH_EINVAL, "--provider-quota \"%s\": expected ZONE,FABRIC,GPU_TYPE,GPUS(1..%d),MAX_NODES,PRICE",
                      s->cfg.provider_quota, SCHED_MAX_NODE_GPUS);
    s->quota = (sched_quota){f[0], f[1], f[2], (int)gpus, (int)max, price, 0};
    c->autoscale = 1;
    c->quotas = &s->quota;
    c->n_quotas = 1;
    c->scale_up_wait_s = s->cfg.scale_up_wait_s;
    c->scale_down_idle_s = s->cfg.scale_down_idle_s;
    return SH_OK;
}

/* Starts `sh -c provider_cmd` with the request on its stdin. */
static int run(srv *s, json_t *req)
{
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!text) return sh_err(SH_ENOMEM, "provider request");
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) {
        free(text);
        return sh_err_errno(errno, "provider: pipe");
    }
    pid_t parent = getpid();
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* local agents end with their server */
        if (getppid() != parent) _exit(1); /* the server died before prctl took hold */
        dup2(fds[0], 0);
        execl("/bin/sh", "sh", "-c", s->cfg.provider_cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    int rc = p < 0 ? sh_err_errno(errno, "provider: fork") : SH_OK;
    /* The request is far smaller than a pipe buffer: this never blocks. */
    if (rc == SH_OK && sh_write_all(fds[1], text, strlen(text), "provider stdin") == SH_OK) s->provider_busy++;
    close(fds[1]);
    free(text);
    return rc;
}

int srv__provider_create(srv *s, const char *zone, const char *fabric, const char *gpu_type, int n)
{
    if (!s->cfg.provider_cmd) return SH_OK;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s->port);
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "auto-%d", ++s->provider_next);
        while (srv__node_find(s, name) >= 0) snprintf(name, sizeof name, "auto-%d", ++s->provider_next);
        json_t *req = json_pack("{s:s,s:s,s:s,s:s,s:s,s:i,s:f,s:s,s:s}", "action", "create", "name", name, "zone",
                                zone, "fabric", fabric, "gpu_type", gpu_type, "gpus", s->quota.gpus,
                                "price_per_gpu_hour", s->quota.price_per_gpu_hour, "server", url, "token",
                                s->provider_token ? s->provider_token : "");
        SH_TRY(run(s, req));
        SH_TRY(srv__db_event(s, 0, name, "scale_up", "asked the provider for %d x %s in %s/%s", s->quota.gpus,
                             gpu_type, zone, fabric));
    }
    return SH_OK;
}

int srv__provider_delete(srv *s, const char *node)
{
    int idx = srv__node_find(s, node);
    if (!s->cfg.provider_cmd || idx < 0) return SH_OK;
    SH_TRY(run(s, json_pack("{s:s,s:s}", "action", "delete", "name", node)));
    SH_TRY(srv__node_dead(s, idx, "released to the provider"));
    s->nodes[idx].state = NODE_GONE;
    SH_TRY(srv__db_node(s, &s->nodes[idx]));
    if (srv__seam_node(s, idx, SEAM_GONE) < 0) sh_warn("node %s: %s", node, sh_errmsg());
    return srv__db_event(s, 0, node, "scale_down", "released to the provider after idling");
}

void srv__provider_tick(srv *s, double now)
{
    (void)now;
    while (s->provider_busy > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p <= 0) break;
        s->provider_busy--;
    }
}
