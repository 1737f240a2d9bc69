/* Replicas: stage the next version while the current one serves, verify it,
 * then swap it in atomically.
 *
 * Threads: the push thread (when attached to a parent) runs the bcast node
 * and queues every complete payload; the apply thread turns payloads (or the
 * store's newer versions) into full checkpoints under DIR/models/ and
 * activates them.  Serving threads only take the mutex to lease or release,
 * so a swap blocks them for the few instructions of a pointer exchange. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "weights/store/replica_int.h"

static void *apply_main(void *arg)
{
    store_replica *r = arg;
    /* Building a version yields to forwarding chunks: a relay's forwarding
     * delay holds up every node below it, its own apply only itself.  Only
     * this thread's nice value changes (Linux: per thread). */
    if (r->node && setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 5) < 0)
        sh_debug("replica %s: setpriority: %s", r->dir, strerror(errno));
    double poll = r->cfg.poll_s > 0 ? r->cfg.poll_s : 0.02;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        if (r->img_drop && !r->staged.version) {
            r->img_drop = 0;
            pthread_mutex_unlock(&r->mu);
            store__img_free(r);
            pthread_mutex_lock(&r->mu);
        }
        if (!r->queue && store__staged_due(r, sh_now_mono(), r->last_push_activity)) {
            pthread_mutex_unlock(&r->mu);
            if (store__activate_staged(r) < 0) store__replica_error(r);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        pending *p = r->queue;
        if (p && p->retry_at <= sh_now_mono()) {
            r->queue = p->next;
            if (!r->queue) r->tail = &r->queue;
            pthread_mutex_unlock(&r->mu);
            int rc = p->ver.version > store_replica_version(r) ? store__apply_pending(r, p) : SH_OK;
            if (rc < 0) store__replica_error(r);
            pthread_mutex_lock(&r->mu);
            /* A pushed version the tree will not send again: one that failed
             * for want of room (a full disk, memory) stays first in line and
             * is tried again after a pause that doubles to 5 s; dropped, the
             * replica stayed on its version until the next anchor, since
             * every delta after it needs it. */
            if ((rc == SH_ENOSPC || rc == SH_EIO || rc == SH_ENOMEM) && !r->stop) {
                p->pause = p->pause ? (2 * p->pause < STORE__RETRY_MAX_S ? 2 * p->pause : STORE__RETRY_MAX_S) : 0.1;
                p->retry_at = sh_now_mono() + p->pause;
                p->next = r->queue;
                r->queue = p;
                if (!p->next) r->tail = &p->next;
                continue;
            }
            pthread_mutex_unlock(&r->mu);
            unlink(p->payload);
            free(p);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        /* With a push parent the store is the fallback: when the tree has
         * brought nothing new for a while (a failed apply, a parent that
         * cannot serve), the replica reads the store itself. */
        double now = sh_now_mono();
        int fallback = r->node && r->st && now - r->last_push_activity > 2.0 && now >= r->next_store_check;
        if ((!r->node && r->st) || fallback) {
            if (fallback) r->next_store_check = now + 1.0;
            pthread_mutex_unlock(&r->mu);
            if (store__sync_from_store(r) < 0) store__replica_error(r);
            pthread_mutex_lock(&r->mu);
        }
        if (r->img_wanted && !r->queue) {
            int quiet = now - r->last_push_activity >= STORE__IDLE_S;
            pthread_mutex_unlock(&r->mu);
            store__prepare_image(r, quiet);
            pthread_mutex_lock(&r->mu);
            if (r->queue) continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = ts.tv_sec + ts.tv_nsec * 1e-9 + poll;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        if ((!r->queue || r->queue->retry_at > sh_now_mono()) && !r->stop)
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- Push side -------------------------------------------------------- */

/* On the push thread (the only one that may read the node): publishes the
 * node's counters.  Called for every chunk and before an object is queued,
 * so that whoever sees a version active also sees every chunk (corrupt ones
 * included) that led to it; a snapshot taken only between runs of the loop
 * could lag an activation by a whole run. */
static void snapshot_push(store_replica *r)
{
    bcast_stats s;
    bcast_node_stats(r->node, &s);
    pthread_mutex_lock(&r->mu);
    r->push = s;
    pthread_mutex_unlock(&r->mu);
}

/* The node checked a pushed payload against its OFFER's size and xxh3;
 * the manifest must name that same payload, or an anchor's bytes (adopted
 * without hashing again) could differ from the digest the replica reports.
 * Not for a squash, whose manifest is its target's. */
int store__pushed_names(const char *dir, const store_version *v, const bcast_object_info *o)
{
    if (v->version == o->version && v->anchor == o->is_anchor && v->size == o->size && sh_hash128_eq(v->xxh3, o->hash))
        return SH_OK;
    char a[33], b[33];
    sh_hash128_hex(v->xxh3, a);
    sh_hash128_hex(o->hash, b);
    return sh_err(SH_EMISMATCH, "replica %s: pushed v%llu: its manifest names another payload (v%llu, %s, %llu "
                  "bytes, xxh3 %s) than the one offered (%s, %llu bytes, xxh3 %s); dropped", dir,
                  (unsigned long long)o->version, (unsigned long long)v->version, v->anchor ? "anchor" : "delta",
                  (unsigned long long)v->size, a, o->is_anchor ? "anchor" : "delta", (unsigned long long)o->size, b);
}

/* On the push thread: keeps the payload (a hard link, so the node may drop
 * its spool file) and queues it for the apply thread. */
static void on_object(void *arg, const bcast_object_info *o)
{
    store_replica *r = arg;
    sh_debug("replica %s: v%llu received at %.6f", r->dir, (unsigned long long)o->version, sh_now_wall());
    snapshot_push(r);
    pending *p = calloc(1, sizeof *p);
    if (!p) return;
    int rc = store_manifest_parse(o->manifest, r->run, &p->ver);
    if (rc == 0 && !o->is_squash) rc = store__pushed_names(r->dir, &p->ver, o);
    if (rc == 0 && o->is_squash) {
        /* A squashed delta from o->base: the manifest is its target's
         * (an anchor's, for a delta across the anchor). */
        p->ver.anchor = 0;
        p->ver.base = o->base;
        p->ver.size = o->size;
    }
    pthread_mutex_lock(&r->mu);
    if (r->recv_tl.version == o->version) p->tl = r->recv_tl;
    pthread_mutex_unlock(&r->mu);
    p->tl.received = sh_now_wall();
    snprintf(p->payload, sizeof p->payload, "%s/%010llu.payload", r->staging, (unsigned long long)o->version);
    unlink(p->payload);
    if (rc == 0 && link(o->path, p->payload) < 0) rc = sh_err_errno(errno, "link %s", o->path);
    if (rc < 0) {
        store__replica_error(r);
        free(p);
        return;
    }
    pthread_mutex_lock(&r->mu);
    *r->tail = p;
    r->tail = &p->next;
    r->last_push_activity = sh_now_mono();
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Chunks arriving mean the tree is delivering: no store fallback now. */
static void on_chunk(void *arg, uint64_t version, uint32_t index, uint32_t nchunks)
{
    store_replica *r = arg;
    snapshot_push(r);
    double now = sh_now_wall();
    pthread_mutex_lock(&r->mu);
    r->last_push_activity = sh_now_mono();
    if (r->recv_tl.version != version) {
        memset(&r->recv_tl, 0, sizeof r->recv_tl);
        r->recv_tl.version = version;
        r->recv_tl.first_chunk = now;
    }
    r->recv_tl.last_chunk = now;
    pthread_mutex_unlock(&r->mu);
}

/* A spool file for a whole model's payload (an anchor): the model file the
 * last activation replaced, whose pages the payload overwrites, instead of
 * a new file whose every page the kernel must allocate and zero.  A small
 * payload (a delta) leaves it for the next delta's build.  A payload of
 * more than half a model also has the apply thread free the image first
 * (img_drop): the payload and the image would otherwise be two models in
 * memory at once. */
static int reuse_file(void *arg, uint64_t size, const char *path)
{
    store_replica *r = arg;
    pthread_mutex_lock(&r->mu);
    int fits = r->prev && size > r->prev->size / 2;
    if (r->active && size > r->active->size / 2) {
        r->img_drop = 1;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return fits && store__take_prev(r, path, NULL);
}

static void *net_main(void *arg)
{
    store_replica *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int stop = r->stop;
        pthread_mutex_unlock(&r->mu);
        if (stop) break;
        bcast_node_run(r->node, 0.05);
        snapshot_push(r);
    }
    return NULL;
}

/* ---- Public API ---------------------------------------------------------- */

static int make_dirs(store_replica *r, const store_replica_config *cfg)
{
    if (!cfg->dir) return sh_err(SH_EINVAL, "replica: a directory is required");
    if (!cfg->store && cfg->nparents == 0)
        return sh_err(SH_EINVAL, "replica: give a store to poll or a push parent to attach to");
    const char *run = cfg->run ? cfg->run : STORE_DEFAULT_RUN;
    if (!store__valid_run(run)) return sh_err(SH_EINVAL, "replica: bad run id \"%s\"", run);
    snprintf(r->run, sizeof r->run, "%s", run);
    snprintf(r->dir, sizeof r->dir, "%s", cfg->dir);
    SH_TRY(sh_path_join(r->models, sizeof r->models, cfg->dir, "models"));
    SH_TRY(sh_path_join(r->staging, sizeof r->staging, cfg->dir, "staging"));
    SH_TRY(sh_path_join(r->spool, sizeof r->spool, cfg->dir, "spool"));
    SH_TRY(sh_path_join(r->active_path, sizeof r->active_path, cfg->dir, "ACTIVE"));
    SH_TRY(sh_mkdir_p(r->models, 0755));
    /* One replica per directory, locked before anything in it is touched:
     * a second one would wipe the first's spool below and both would then
     * rename each other's files away, failing forever without a word. */
    char lock[4096];
    long holder;
    SH_TRY(sh_path_join(lock, sizeof lock, cfg->dir, "LOCK"));
    int lrc = sh_lock_pid(lock, &r->lock_fd, &holder);
    if (lrc == SH_EEXIST)
        return sh_err(SH_EEXIST, "replica %s: the directory is in use by another replica (process %ld%s "
                      "holds %s); give each replica its own directory", cfg->dir, holder,
                      holder == (long)getpid() ? ", this one" : "", lock);
    SH_TRY(lrc);
    SH_TRY(sh_mkdir_p(r->staging, 0755));
    SH_TRY(sh_rm_rf(r->spool));
    return sh_mkdir_p(r->spool, 0755);
}

static int start_push(store_replica *r)
{
    bcast_config bc = {0};
    memcpy(bc.parents, r->cfg.parents, sizeof bc.parents);
    bc.nparents = r->cfg.nparents;
    bc.zone = r->cfg.zone;
    bc.fanout = r->cfg.fanout;
    bc.egress_bps = r->cfg.egress_bps;
    bc.spool = r->spool;
    bc.accept_children = !r->cfg.leaf;
    bc.listen_host = r->cfg.listen_host;
    bc.listen_port = r->cfg.listen_port;
    bc.have_version = r->active ? r->active->version : 0;
    char name[64];
    snprintf(name, sizeof name, "replica-%ld", (long)getpid());
    bc.name = name;
    bc.on_object = on_object;
    bc.on_chunk = on_chunk;
    bc.reuse_file = reuse_file;
    bc.arg = r;
    return bcast_node_new(&bc, &r->node);
}

int store_replica_open(const store_replica_config *cfg, store_replica **out)
{
    *out = NULL;
    store_replica *r = calloc(1, sizeof *r);
    if (!r) return sh_err(SH_ENOMEM, "replica");
    r->cfg = *cfg;
    r->tail = &r->queue;
    r->lock_fd = -1;
    r->last_push_activity = sh_now_mono();
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    int rc = make_dirs(r, cfg);
    if (rc == 0 && cfg->store) rc = store_open(cfg->store, r->run, 0, &r->st);
    if (rc == 0) {
        rc = store__restore_active(r);
        if (rc < 0) {
            /* A damaged ACTIVE or model is not fatal: start empty and fetch. */
            sh_warn("replica %s: starting empty: %s", r->dir, sh_errmsg());
            rc = 0;
        }
        store__clean_leftovers(r);
    }
    if (rc == 0 && cfg->nparents > 0) rc = start_push(r);
    if (rc == 0 && r->active) r->done_version = r->active->version;
    /* A restarted push replica loads its image when its tree is quiet. */
    if (rc == 0 && r->node && r->active) r->img_wanted = 1;
    if (rc == 0 && r->node) {
        if (pthread_create(&r->net_thread, NULL, net_main, r)) rc = sh_err(SH_EIO, "replica: thread");
        else r->have_net = 1;
    }
    if (rc == 0) {
        if (pthread_create(&r->apply_thread, NULL, apply_main, r)) rc = sh_err(SH_EIO, "replica: thread");
        else r->have_apply = 1;
    }
    if (rc < 0) {
        store_replica_close(r);
        return rc;
    }
    *out = r;
    return SH_OK;
}

void store_replica_close(store_replica *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->node) bcast_node_stop(r->node), bcast_node_wake(r->node);
    if (r->have_net) pthread_join(r->net_thread, NULL);
    if (r->have_apply) pthread_join(r->apply_thread, NULL);
    bcast_node_free(r->node);
    while (r->queue) {
        pending *p = r->queue;
        r->queue = p->next;
        unlink(p->payload);
        free(p);
    }
    store__img_free(r);
    store__model_free(r->prev, r->prev && !r->prev->keep);
    store__model_free(r->active, 0);
    store_close(r->st);
    if (r->lock_fd >= 0) close(r->lock_fd);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

uint64_t store_replica_version(store_replica *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t v = r->active ? r->active->version : 0;
    pthread_mutex_unlock(&r->mu);
    return v;
}

int store_replica_wait(store_replica *r, uint64_t v, double timeout_s)
{
    double end = sh_now_wall() + timeout_s;
    pthread_mutex_lock(&r->mu);
    while (r->done_version < v) {
        double now = sh_now_wall();
        if (now >= end) {
            uint64_t have = r->active ? r->active->version : 0;
            pthread_mutex_unlock(&r->mu);
            return sh_err(SH_ETIMEDOUT, "replica %s: still on version %llu after %.1fs waiting for %llu%s%s",
                          r->dir, (unsigned long long)have, timeout_s, (unsigned long long)v,
                          r->last_error[0] ? "; last error: " : "", r->last_error);
        }
        double t = now + 0.05 < end ? now + 0.05 : end;
        struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return SH_OK;
}

int store_replica_acquire(store_replica *r, uint64_t min_version, uint64_t exact_version, store_lease *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->mu);
    model *m = r->active;
    uint64_t have = m ? m->version : 0;
    int rc = SH_OK;
    if (!m) rc = sh_err(SH_EAGAIN, "replica %s holds no version yet (retry later)", r->dir);
    else if (exact_version && have != exact_version)
        rc = sh_err(SH_EAGAIN, "replica %s serves version %llu; the request needs exactly version %llu "
                    "(retry later or on another replica)", r->dir, (unsigned long long)have,
                    (unsigned long long)exact_version);
    else if (have < min_version)
        rc = sh_err(SH_EAGAIN, "replica %s serves version %llu; the request needs at least version %llu "
                    "(retry later or on another replica)", r->dir, (unsigned long long)have,
                    (unsigned long long)min_version);
    if (rc == 0) {
        m->refs++;
        out->version = m->version;
        out->data = m->map;
        out->size = m->size;
        out->ckpt = m->ck;
        out->fp8 = m->fp8 ? m->fp8->ck : NULL;
        out->priv = m;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

uint64_t store_replica_release(store_replica *r, store_lease *l)
{
    uint64_t v = store_replica_version(r);
    if (l && l->priv) store__model_unref(r, l->priv);
    if (l) memset(l, 0, sizeof *l);
    return v;
}

void store_replica_get_info(store_replica *r, store_replica_info *out)
{
    pthread_mutex_lock(&r->mu);
    memset(out, 0, sizeof *out);
    out->version = r->active ? r->active->version : 0;
    out->activated_at = r->activated_at;
    out->pause_max_ms = r->pause_max_ms;
    out->activations = r->activations;
    out->fp8_blocks = r->fp8_blocks;
    out->failures = r->failures;
    snprintf(out->last_error, sizeof out->last_error, "%s", r->last_error);
    out->push = r->push;
    out->timeline = r->timeline;
    uint64_t n = out->push.newest_announced > r->store_latest ? out->push.newest_announced : r->store_latest;
    out->newest_announced = n > out->version ? n : out->version;
    pthread_mutex_unlock(&r->mu);
}

int store_lease_tensor(const store_lease *l, const char *name, const ckpt_tensor **out)
{
    *out = NULL;
    if (!l || !l->ckpt) return sh_err(SH_EINVAL, "tensor %s: no model leased", name);
    *out = ckpt_find(l->ckpt, name);
    if (!*out)
        return sh_err(SH_ENOENT, "tensor %s: not in version %llu", name, (unsigned long long)l->version);
    return SH_OK;
}
