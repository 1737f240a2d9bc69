/* A rollout worker's weights as a replica on the push tree.
 *
 * The worker (src/rl/engine/worker.c) asks an rl_weights_source for versions; this
 * one is a store_replica attached to the push tree (docs/push-protocol.md):
 * the replica stages each version while the worker decodes, activates it
 * atomically, and the worker takes it between two decoding steps.  Store
 * version store_base + v + 1 holds policy version v (the trainer announces
 * store_base in trainer.json).
 *
 * After every activation one JSON line goes to the tree log: which version
 * this replica got, from which parent, in which zone.  That is the record of
 * who fed whom that `shoal rl report` draws and counts (docs/mainjob.md). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker_int.h"
#include "shoal/store.h"

struct mj_weights {
    mj_weights_config cfg;
    char dir[4096], parent[256], parent_file[4096], zone[64], name[64], log[4096];
    store_replica *r;
    rl_weights_source src;
    uint64_t bytes_logged; /* push bytes received at the last log line */
};

static int open_replica(mj_weights *w);

/* With a parent file: the replica starts once the file names the root
 * (the worker serves the trainer meanwhile, refusing what it cannot do). */
static int ensure_open(mj_weights *w)
{
    if (w->r) return 1;
    if (!w->parent[0]) {
        char *text = NULL;
        size_t len = 0;
        if (!sh_path_exists(w->parent_file) || sh_read_file(w->parent_file, 255, &text, &len) < 0) return 0;
        snprintf(w->parent, sizeof w->parent, "%.*s", (int)strcspn(text, "\r\n"), text);
        free(text);
        if (!w->parent[0]) return 0;
    }
    if (open_replica(w) < 0) {
        sh_warn("replica worker %s: %s", w->name, sh_errmsg());
        return 0;
    }
    return 1;
}

static int src_version(void *arg)
{
    mj_weights *w = arg;
    if (!ensure_open(w)) return -1;
    uint64_t v = store_replica_version(w->r);
    return v > w->cfg.store_base ? (int)(v - w->cfg.store_base - 1) : -1;
}

static int src_wait(void *arg, int v, double timeout_s)
{
    mj_weights *w = arg;
    double end = sh_now_mono() + timeout_s;
    while (!ensure_open(w)) {
        if (sh_now_mono() >= end)
            return sh_err(SH_ETIMEDOUT, "replica worker %s: no push root in %s yet", w->name, w->parent_file);
        sh_sleep(0.05);
    }
    double left = end - sh_now_mono();
    return store_replica_wait(w->r, w->cfg.store_base + (uint64_t)v + 1, left > 0 ? left : 0);
}

static int src_acquire(void *arg, rl_weights_view *out)
{
    mj_weights *w = arg;
    if (!ensure_open(w)) return sh_err(SH_EAGAIN, "replica worker %s: not on the push tree yet", w->name);
    store_lease *l = malloc(sizeof *l);
    if (!l) return sh_err(SH_ENOMEM, "replica lease");
    int rc = store_replica_acquire(w->r, w->cfg.store_base + 1, 0, l);
    if (rc < 0) {
        free(l);
        return rc;
    }
    out->version = (int)(l->version - w->cfg.store_base - 1);
    out->image = l->data;
    out->len = (size_t)l->size;
    out->priv = l;
    return 0;
}

static void src_release(void *arg, rl_weights_view *v)
{
    mj_weights *w = arg;
    if (!v || !v->priv) return;
    store_replica_release(w->r, v->priv);
    free(v->priv);
    memset(v, 0, sizeof *v);
}

/* On the replica's apply thread, after each activation. */
static void logged(void *arg, uint64_t version, double at)
{
    mj_weights *w = arg;
    if (!w->log[0] || !w->r) return;
    store_replica_info info;
    store_replica_get_info(w->r, &info);
    uint64_t bytes = info.push.bytes_received - w->bytes_logged;
    w->bytes_logged = info.push.bytes_received;
    json_t *j = json_pack("{s:I,s:I,s:s,s:s,s:s,s:s,s:I,s:f,s:I}", "version",
                          (json_int_t)(version - w->cfg.store_base - 1), "store_version",
                          (json_int_t)version, "name", w->name, "zone", w->zone, "addr",
                          info.push.addr, "parent", info.push.parent, "bytes", (json_int_t)bytes,
                          "t", at, "reattaches", (json_int_t)info.push.reattaches);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return;
    size_t n = strlen(s);
    s[n] = '\n'; /* json_dumps leaves room for the NUL: replaced, written whole */
    int fd = open(w->log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    /* One write of a short line to an O_APPEND file: lines of several
     * replicas never interleave. */
    if (fd >= 0) {
        if (write(fd, s, n + 1) < 0) sh_debug("tree log %s: %s", w->log, strerror(errno));
        close(fd);
    }
    free(s);
}

static int open_replica(mj_weights *w)
{
    store_replica_config rc = {0};
    rc.dir = w->dir;
    rc.parents[0] = w->parent;
    rc.nparents = 1;
    rc.zone = w->zone;
    rc.fanout = w->cfg.fanout;
    rc.after_activate = logged;
    rc.arg = w;
    /* No store: a worker's versions come by the tree alone (a store
     * fallback would bypass the zone's relay and its one crossing). */
    return store_replica_open(&rc, &w->r);
}

int mj_weights_open(const mj_weights_config *cfg, mj_weights **out)
{
    *out = NULL;
    if (!cfg->dir || (!cfg->parent && !cfg->parent_file))
        return sh_err(SH_EINVAL, "replica worker: a folder and a push parent (or its file) are required");
    mj_weights *w = calloc(1, sizeof *w);
    if (!w) return sh_err(SH_ENOMEM, "replica worker");
    w->cfg = *cfg;
    snprintf(w->dir, sizeof w->dir, "%s", cfg->dir);
    snprintf(w->parent, sizeof w->parent, "%s", cfg->parent ? cfg->parent : "");
    snprintf(w->parent_file, sizeof w->parent_file, "%s", cfg->parent_file ? cfg->parent_file : "");
    snprintf(w->zone, sizeof w->zone, "%s", cfg->zone ? cfg->zone : "default");
    snprintf(w->name, sizeof w->name, "%s", cfg->name ? cfg->name : "worker");
    snprintf(w->log, sizeof w->log, "%s", cfg->tree_log ? cfg->tree_log : "");
    w->src = (rl_weights_source){src_version, src_wait, src_acquire, src_release, w, cfg->min_wait_s};
    if (w->parent[0]) {
        int e = open_replica(w);
        if (e < 0) {
            free(w);
            return e;
        }
    } else {
        /* The root is up already (the usual case): follow the tree from now
         * on, whether or not requests come; otherwise the first request or
         * wait opens it. */
        ensure_open(w);
    }
    *out = w;
    return 0;
}

const rl_weights_source *mj_weights_source(mj_weights *w) { return &w->src; }

void mj_weights_close(mj_weights *w)
{
    if (!w) return;
    store_replica_close(w->r);
    free(w);
}
