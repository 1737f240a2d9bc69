/* Replicas: stage the next version while the current one serves, verify it,
 * then swap it in atomically.
 *
 * Threads: the push thread (when attached to a parent) runs the bcast node
 * and queues every complete payload; the apply thread turns payloads (or the
 * store's newer versions) into full checkpoints under DIR/models/ and
 * activates them.  Serving threads only take the mutex to lease or release,
 * so a swap blocks them for the few instructions of a pointer exchange. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/ckpt.h"
#include "shoal/delta.h"
#include "store/internal.h"

typedef struct model {
    int refs;
    uint64_t version;
    uint64_t size;
    uint8_t *map;
    ckpt *ck; /* parsed once, before activation: leases get tensor views */
    char path[4096];
    struct model *fp8; /* --fp8: the FP8 serving copy of the same version */
} model;

typedef struct pending {
    store_version ver;
    char payload[4096];
    struct pending *next;
} pending;

struct store_replica {
    store_replica_config cfg;
    char dir[4096], models[4096], staging[4096], spool[4096], active_path[4096];
    char run[65];
    store *st;
    bcast_node *node;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    model *active;
    double activated_at, pause_max_ms;
    uint64_t activations, failures;
    char last_error[512];
    pending *queue, **tail;
    int stop;
    int have_net, have_apply;
    pthread_t net_thread, apply_thread;
    bcast_stats push;
    uint64_t fp8_blocks; /* blocks re-quantised by the last FP8 update */
    double last_push_activity, next_store_check; /* monotonic seconds */
    /* Apply thread only: staging/spare, a scratch copy of the active model
     * (version spare_version, 0: none) for the next delta to patch. */
    char spare[4096];
    uint64_t spare_version;
};

/* ---- Models ------------------------------------------------------------ */

static int model_open(const char *path, uint64_t version, model **out)
{
    model *m = calloc(1, sizeof *m);
    if (!m) return sh_err(SH_ENOMEM, "model");
    snprintf(m->path, sizeof m->path, "%s", path);
    m->version = version;
    m->refs = 1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    int rc = fd < 0 ? sh_err_errno(errno, "open %s", path) : 0;
    if (rc == 0 && fstat(fd, &st) < 0) rc = sh_err_errno(errno, "stat %s", path);
    if (rc == 0 && st.st_size > 0) {
        m->size = (uint64_t)st.st_size;
        /* Populated now, outside the swap, so that the first requests on the
         * new version do not pay its page faults. */
        m->map = mmap(NULL, m->size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (m->map == MAP_FAILED) {
            m->map = NULL;
            rc = sh_err_errno(errno, "mmap %s", path);
        }
    }
    if (fd >= 0) close(fd);
    /* Verification includes the format: a version that is not a valid
     * checkpoint never becomes active. */
    if (rc == 0) rc = ckpt_open_mem(m->map, m->size, path, &m->ck);
    if (rc < 0) {
        if (m->map) munmap(m->map, m->size);
        free(m);
        return rc;
    }
    *out = m;
    return SH_OK;
}

static void model_free(model *m, int unlink_files)
{
    if (!m) return;
    model_free(m->fp8, unlink_files);
    ckpt_close(m->ck);
    if (m->map) munmap(m->map, m->size);
    if (unlink_files) unlink(m->path);
    free(m);
}

/* Drops a reference; the last one unmaps the model and deletes its files
 * unless it is still the active one on disk. */
static void model_unref(store_replica *r, model *m)
{
    if (!m) return;
    pthread_mutex_lock(&r->mu);
    int last = --m->refs == 0;
    int is_active = r->active == m;
    pthread_mutex_unlock(&r->mu);
    if (last) model_free(m, !is_active);
}

static int model_path(store_replica *r, uint64_t v, char *out, size_t cap)
{
    int k = snprintf(out, cap, "%s/%010llu.safetensors", r->models, (unsigned long long)v);
    return k < 0 || (size_t)k >= cap ? sh_err(SH_ERANGE, "replica path too long") : SH_OK;
}

static int fp8_path(store_replica *r, uint64_t v, char *out, size_t cap)
{
    int k = snprintf(out, cap, "%s/%010llu.fp8.safetensors", r->models, (unsigned long long)v);
    return k < 0 || (size_t)k >= cap ? sh_err(SH_ERANGE, "replica path too long") : SH_OK;
}

/* --fp8: the serving copy of version v (bf16 at `bf16`).  After one delta
 * on a version whose FP8 copy exists, only the blocks the delta touched are
 * re-quantised; otherwise the whole model is quantised.  Both give the same
 * bytes (the codec guarantees it). */
static int make_fp8(store_replica *r, uint64_t v, const char *bf16, const model *prev,
                    const char *delta_path, char *out, size_t cap)
{
    SH_TRY(fp8_path(r, v, out, cap));
    delta_opts o = {0};
    if (prev && prev->fp8 && delta_path) {
        uint64_t blocks = 0;
        int rc = delta_quant_fp8_update(prev->fp8->path, bf16, delta_path, out, NULL, &o, &blocks);
        if (rc == 0) {
            pthread_mutex_lock(&r->mu);
            r->fp8_blocks = blocks;
            pthread_mutex_unlock(&r->mu);
            return SH_OK;
        }
        sh_warn("replica %s: FP8 update failed (%s); quantising the whole model", r->dir, sh_errmsg());
    }
    return delta_quant_fp8(bf16, out, NULL, &o);
}

static int model_open_fp8(model *m, const char *fp8)
{
    if (!fp8) return SH_OK;
    return model_open(fp8, m->version, &m->fp8);
}

/* ---- ACTIVE --------------------------------------------------------------- */

static int write_active(store_replica *r, const store_version *v, double at)
{
    char mx[33];
    sh_hash128_hex(v->model_xxh3, mx);
    char file[64];
    snprintf(file, sizeof file, "models/%010llu.safetensors", (unsigned long long)v->version);
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:I,s:s,s:f}", "format", "shoal-active/1", "run", r->run,
                          "version", (json_int_t)v->version, "file", file, "model_size",
                          (json_int_t)v->model_size, "model_xxh3", mx, "activated_at", at);
    int rc = sh_json_write_atomic(r->active_path, j);
    json_decref(j);
    return rc;
}

/* Restores the version ACTIVE names after checking its bytes; a replica
 * whose ACTIVE is missing starts empty. */
static int restore_active(store_replica *r)
{
    json_t *j;
    int rc = sh_json_load_file(r->active_path, 1 << 16, &j);
    if (rc == SH_ENOENT) return SH_OK;
    if (rc < 0) return rc;
    const char *run = NULL, *mx = NULL;
    int64_t v = 0, size = 0;
    double at = 0;
    rc = sh_json_get_str(j, "run", 1, r->active_path, &run);
    if (rc == 0 && strcmp(run, r->run))
        rc = sh_err(SH_EMISMATCH, "%s: replica of run \"%s\", asked for run \"%s\"", r->active_path, run, r->run);
    if (rc == 0) rc = sh_json_get_i64(j, "version", 1, r->active_path, &v);
    if (rc == 0) rc = sh_json_get_i64(j, "model_size", 1, r->active_path, &size);
    if (rc == 0) rc = sh_json_get_str(j, "model_xxh3", 1, r->active_path, &mx);
    if (rc == 0) rc = sh_json_get_num(j, "activated_at", 0, r->active_path, &at);
    sh_hash128 want, got;
    uint64_t n = 0;
    char path[4096];
    if (rc == 0 && sh_hash128_parse(mx, &want) < 0) rc = sh_err(SH_EFORMAT, "%s: bad model_xxh3", r->active_path);
    if (rc == 0) rc = model_path(r, (uint64_t)v, path, sizeof path);
    if (rc == 0) rc = store__hash_file(path, &got, &n);
    if (rc == 0 && (n != (uint64_t)size || !sh_hash128_eq(got, want)))
        rc = sh_err(SH_EMISMATCH, "%s: the model of version %lld does not match its hash", path, (long long)v);
    if (rc == 0) rc = model_open(path, (uint64_t)v, &r->active);
    if (rc == 0) r->activated_at = at;
    json_decref(j);
    if (rc == 0 && r->cfg.fp8) {
        char fp8[4096];
        rc = fp8_path(r, (uint64_t)v, fp8, sizeof fp8);
        /* A missing or damaged FP8 copy is rebuilt from the verified bf16. */
        if (rc == 0 && model_open_fp8(r->active, fp8) < 0) {
            rc = make_fp8(r, (uint64_t)v, path, NULL, NULL, fp8, sizeof fp8);
            if (rc == 0) rc = model_open_fp8(r->active, fp8);
        }
        if (rc < 0) {
            model_free(r->active, 0);
            r->active = NULL;
        }
    }
    return rc;
}

/* Files a crash mid-apply left: staged checkpoints and temporaries. */
static void clean_leftovers(store_replica *r)
{
    sh_rm_rf(r->staging);
    sh_mkdir_p(r->staging, 0755);
    char keep[4096] = "", keep8[4096] = "";
    if (r->active) snprintf(keep, sizeof keep, "%s", r->active->path);
    if (r->active && r->active->fp8) snprintf(keep8, sizeof keep8, "%s", r->active->fp8->path);
    DIR *d = opendir(r->models);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[4096];
        if (e->d_name[0] == '.' || sh_path_join(p, sizeof p, r->models, e->d_name) < 0) continue;
        if (strcmp(p, keep) && strcmp(p, keep8)) unlink(p);
    }
    if (d) closedir(d);
}

/* ---- Activation ---------------------------------------------------------- */

static void set_error(store_replica *r)
{
    pthread_mutex_lock(&r->mu);
    snprintf(r->last_error, sizeof r->last_error, "%s", sh_errmsg());
    r->failures++;
    pthread_mutex_unlock(&r->mu);
    sh_warn("replica %s: %s", r->dir, sh_errmsg());
}

/* `path` holds version v's full checkpoint, verified.  ACTIVE is made
 * durable first, so that a crash after it restarts on the new version and a
 * crash before it on the old one; then the in-memory swap. */
static int activate(store_replica *r, const store_version *v, const char *path, const char *fp8)
{
    model *m;
    SH_TRY(model_open(path, v->version, &m));
    int rc0 = model_open_fp8(m, fp8);
    if (rc0 < 0) {
        model_free(m, 0);
        return rc0;
    }
    uint64_t from = store_replica_version(r);
    if (r->cfg.before_activate) r->cfg.before_activate(r->cfg.arg, from, v->version);
    double at = sh_now_wall();
    int rc = write_active(r, v, at);
    if (rc < 0) {
        model_unref(r, m);
        return rc;
    }
    double t0 = sh_now_mono();
    pthread_mutex_lock(&r->mu);
    model *old = r->active;
    r->active = m;
    r->activated_at = at;
    r->activations++;
    double pause = (sh_now_mono() - t0) * 1e3;
    if (pause > r->pause_max_ms) r->pause_max_ms = pause;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    model_unref(r, old);
    if (r->cfg.after_activate) r->cfg.after_activate(r->cfg.arg, v->version, at);
    return SH_OK;
}

/* Makes `path` and its name durable: the file's pages (written through the
 * push node's shared mapping, which fsync flushes like written pages), then
 * the directory entry. */
static int fsync_file_and_dir(const char *path, const char *dir)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "open %s", path);
    int rc = fsync(fd) < 0 ? sh_err_errno(errno, "fsync %s", path) : SH_OK;
    close(fd);
    return rc == 0 ? sh_fsync_dir(dir) : rc;
}

/* A pushed anchor is already a private file of this replica (a hard link to
 * the spool) whose bytes the push node checked against the manifest's xxh3,
 * which for an anchor is model_xxh3 (store_manifest_parse insists).  It
 * becomes the model by another link, which saves a copy and a hash of the
 * whole model.  Durable before visible: the bytes and the link reach the
 * disk here, on the apply thread before activate() writes ACTIVE, so the
 * fsync adds nothing to the activation pause (the swap under the mutex). */
static int adopt_anchor(store_replica *r, const store_version *v, const char *payload, const char *out)
{
    unlink(out);
    if (link(payload, out) < 0) return store_apply_payload(v, payload, NULL, out);
    return fsync_file_and_dir(out, r->models);
}

/* After an activation, on the apply thread: copies the new model to
 * staging/spare so that the next delta patches only what it changes
 * instead of copying the whole model while a version waits.  Not durable
 * and not trusted: the patch is verified against the delta's digests and
 * fsynced whole before it becomes a model, and a restart deletes it. */
static void make_spare(store_replica *r, const char *path, uint64_t version)
{
    char tmp[4200];
    r->spare_version = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp", r->spare);
    int in = open(path, O_RDONLY | O_CLOEXEC);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    struct stat st;
    int ok = in >= 0 && out >= 0 && fstat(in, &st) == 0;
    for (off_t left = ok ? st.st_size : 0; ok && left > 0;) {
        ssize_t k = copy_file_range(in, NULL, out, NULL, (size_t)left, 0);
        if (k <= 0) ok = 0;
        else left -= k;
    }
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    if (ok && rename(tmp, r->spare) == 0) r->spare_version = version;
    else unlink(tmp), sh_debug("replica %s: no spare copy of v%llu", r->dir, (unsigned long long)version);
}

/* A delta on the active model: patched into the spare copy when there is
 * one of that version, else rebuilt from the mapped model. */
static int apply_delta(store_replica *r, const pending *p, const model *cur, const char *out)
{
    if (r->spare_version == cur->version) {
        r->spare_version = 0;
        int rc = store__delta_apply_spare(r->spare, p->payload, p->ver.model_size, out);
        if (rc == 0) return rc;
        sh_warn("replica %s: in-place apply failed (%s); rebuilding from the active model", r->dir,
                sh_errmsg());
        unlink(r->spare);
    }
    return store__delta_apply_mapped(cur->ck, p->payload, p->ver.model_size, out);
}

/* Builds version v from a payload: an anchor alone, or a delta on the
 * active model. */
static int apply_pending(store_replica *r, const pending *p)
{
    char out[4096];
    SH_TRY(model_path(r, p->ver.version, out, sizeof out));
    model *cur = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->active) (cur = r->active)->refs++;
    pthread_mutex_unlock(&r->mu);
    int rc;
    if (!p->ver.anchor && (!cur || cur->version != p->ver.base))
        rc = sh_err(SH_EMISMATCH, "delta to version %llu needs version %llu, replica holds %llu",
                    (unsigned long long)p->ver.version, (unsigned long long)p->ver.base,
                    (unsigned long long)(cur ? cur->version : 0));
    else if (p->ver.anchor)
        rc = adopt_anchor(r, &p->ver, p->payload, out);
    else
        rc = apply_delta(r, p, cur, out);
    sh_debug("replica %s: v%llu built at %.6f", r->dir, (unsigned long long)p->ver.version, sh_now_wall());
    char fp8[4096] = "";
    if (rc == 0 && r->cfg.fp8)
        rc = make_fp8(r, p->ver.version, out, p->ver.anchor ? NULL : cur, p->ver.anchor ? NULL : p->payload,
                      fp8, sizeof fp8);
    model_unref(r, cur);
    if (rc == 0) rc = activate(r, &p->ver, out, fp8[0] ? fp8 : NULL);
    sh_debug("replica %s: v%llu active at %.6f", r->dir, (unsigned long long)p->ver.version, sh_now_wall());
    if (rc < 0) unlink(out), fp8[0] ? unlink(fp8) : 0;
    if (rc == 0) make_spare(r, out, p->ver.version);
    return rc;
}

static int sync_from_store(store_replica *r)
{
    uint64_t latest, have = store_replica_version(r);
    SH_TRY(store_latest(r->st, &latest));
    if (latest <= have) return SH_OK;
    store_version v;
    char out[4096];
    SH_TRY(store_get(r->st, latest, &v, NULL));
    SH_TRY(model_path(r, latest, out, sizeof out));
    model *cur = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->active) (cur = r->active)->refs++;
    pthread_mutex_unlock(&r->mu);
    int rc = store_materialize(r->st, latest, cur ? cur->version : 0, cur ? cur->path : NULL, out);
    char fp8[4096] = "", delta_path[4096];
    /* One delta on top of what this replica holds: the FP8 copy is updated
     * block by block; anything else is quantised whole. */
    int one_delta = cur && !v.anchor && v.base == cur->version &&
                    store_payload_path(r->st, latest, delta_path, sizeof delta_path) == 0;
    if (rc == 0 && r->cfg.fp8)
        rc = make_fp8(r, latest, out, one_delta ? cur : NULL, one_delta ? delta_path : NULL, fp8, sizeof fp8);
    model_unref(r, cur);
    if (rc == 0) rc = activate(r, &v, out, fp8[0] ? fp8 : NULL);
    if (rc < 0) unlink(out), fp8[0] ? unlink(fp8) : 0;
    return rc;
}

static void *apply_main(void *arg)
{
    store_replica *r = arg;
    double poll = r->cfg.poll_s > 0 ? r->cfg.poll_s : 0.02;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        pending *p = r->queue;
        if (p) {
            r->queue = p->next;
            if (!r->queue) r->tail = &r->queue;
            pthread_mutex_unlock(&r->mu);
            if (p->ver.version > store_replica_version(r) && apply_pending(r, p) < 0) set_error(r);
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
            if (sync_from_store(r) < 0) set_error(r);
            pthread_mutex_lock(&r->mu);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = ts.tv_sec + ts.tv_nsec * 1e-9 + poll;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        if (!r->queue && !r->stop) pthread_cond_timedwait(&r->cv, &r->mu, &ts);
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
    snprintf(p->payload, sizeof p->payload, "%s/%010llu.payload", r->staging, (unsigned long long)o->version);
    unlink(p->payload);
    if (rc == 0 && link(o->path, p->payload) < 0) rc = sh_err_errno(errno, "link %s", o->path);
    if (rc < 0) {
        set_error(r);
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
    pthread_mutex_lock(&r->mu);
    r->last_push_activity = sh_now_mono();
    pthread_mutex_unlock(&r->mu);
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
    SH_TRY(sh_path_join(r->spare, sizeof r->spare, r->staging, "spare.safetensors"));
    SH_TRY(sh_mkdir_p(r->models, 0755));
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
    bc.have_version = r->active ? r->active->version : 0;
    char name[64];
    snprintf(name, sizeof name, "replica-%ld", (long)getpid());
    bc.name = name;
    bc.on_object = on_object;
    bc.on_chunk = on_chunk;
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
    r->last_push_activity = sh_now_mono();
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    int rc = make_dirs(r, cfg);
    if (rc == 0 && cfg->store) rc = store_open(cfg->store, r->run, 0, &r->st);
    if (rc == 0) {
        rc = restore_active(r);
        if (rc < 0) {
            /* A damaged ACTIVE or model is not fatal: start empty and fetch. */
            sh_warn("replica %s: starting empty: %s", r->dir, sh_errmsg());
            rc = 0;
        }
        clean_leftovers(r);
    }
    if (rc == 0 && cfg->nparents > 0) rc = start_push(r);
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
    model_free(r->active, 0);
    store_close(r->st);
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
    while (!r->active || r->active->version < v) {
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
    if (l && l->priv) model_unref(r, l->priv);
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
