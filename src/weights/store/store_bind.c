/* The store for foreign callers (python/shoal): calls that take and return
 * only pointers, numbers and JSON text, so that a binding needs no struct
 * layout that may grow.  The C API in store.h stays the reference; each
 * function here is a thin translation onto it. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shoal/ckpt.h"
#include "weights/store/replica_int.h"
#include "weights/store/store_int.h"

static int publish_tensors(store *s, const ckpt_tensor *t, size_t n, const json_t *meta,
                           uint64_t anchor_every, uint64_t *out);

int store_publish_path(store *s, const char *ckpt_path, uint64_t anchor_every, uint64_t *out)
{
    store_publish_opts o = {.anchor_every = anchor_every};
    if (!sh_is_dir(ckpt_path)) return store_publish(s, ckpt_path, &o, out);
    /* A version is one file that replicas map whole, so a sharded folder is
     * published as one file holding the same tensors (written from the
     * shards' maps). */
    ckpt *c;
    SH_TRY(ckpt_open(ckpt_path, &c));
    int rc = store_publish_tensors(s, c->tensors, c->ntensors, anchor_every, out);
    ckpt_close(c);
    return rc;
}

int store_publish_tensors(store *s, const ckpt_tensor *t, size_t n, uint64_t anchor_every,
                          uint64_t *out)
{
    return store_publish_tensors_meta(s, t, n, NULL, anchor_every, out);
}

int store_publish_tensors_meta(store *s, const ckpt_tensor *t, size_t n, const char *metadata,
                               uint64_t anchor_every, uint64_t *out)
{
    json_t *meta = NULL;
    if (metadata) {
        json_error_t je;
        meta = json_loads(metadata, 0, &je);
        const char *k;
        json_t *v;
        int ok = json_is_object(meta);
        json_object_foreach(ok ? meta : NULL, k, v) ok = ok && json_is_string(v);
        if (!ok) {
            json_decref(meta);
            return sh_err(SH_EINVAL, "publish to run \"%s\": metadata must be a JSON object of strings "
                          "(safetensors __metadata__)", s->run);
        }
    }
    int rc = publish_tensors(s, t, n, meta, anchor_every, out);
    json_decref(meta);
    return rc;
}

static int publish_tensors(store *s, const ckpt_tensor *t, size_t n, const json_t *meta,
                           uint64_t anchor_every, uint64_t *out)
{
    if (n == 0) return sh_err(SH_EINVAL, "publish to run \"%s\": no tensors given", s->run);
    for (size_t i = 0; i < n; i++)
        if (!t[i].name || (!t[i].data && t[i].nbytes))
            return sh_err(SH_EINVAL, "publish to run \"%s\": tensor %zu has no name or no data", s->run, i);
    if (s->keep) return store__publish_kept(s, t, n, meta, anchor_every, out);
    /* The checkpoint is written straight from the caller's memory into the
     * run's staging folder (same file system as the versions), published,
     * then removed: a publisher holds no other copy. */
    static unsigned long seq;
    char path[4096];
    /* Named <...>.<pid>, as every staging entry is: gc and publishes remove
     * the entries of publishers that no longer run, by that pid (the name
     * "tensors.<pid>.<n>.safetensors" read as pid 0, a dead one). */
    int k = snprintf(path, sizeof path, "%s/tensors-%lu.%ld", s->staging,
                     __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED), (long)getpid());
    if (k < 0 || (size_t)k >= sizeof path) return sh_err(SH_ERANGE, "path too long under %s", s->staging);
    SH_TRY(sh_mkdir_p(s->staging, 0755));
    int rc = ckpt_save(path, t, n, meta);
    if (rc == 0) rc = store_publish_path(s, path, anchor_every, out);
    unlink(path);
    return rc;
}

int store_list_json(store *s, char **out)
{
    *out = NULL;
    store_version *v;
    size_t n, broken;
    SH_TRY(store_list(s, &v, &n, &broken));
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        char x[33], mx[33];
        sh_hash128_hex(v[i].xxh3, x);
        sh_hash128_hex(v[i].model_xxh3, mx);
        json_t *e = v[i].size == 0 && !v[i].anchor && v[i].base == 0
                        ? json_pack("{s:I,s:b}", "version", (json_int_t)v[i].version, "broken", 1)
                        : json_pack("{s:I,s:s,s:I,s:I,s:s,s:I,s:s,s:f}", "version", (json_int_t)v[i].version,
                                    "kind", v[i].anchor ? "anchor" : "delta", "base", (json_int_t)v[i].base,
                                    "size", (json_int_t)v[i].size, "xxh3", x, "model_size",
                                    (json_int_t)v[i].model_size, "model_xxh3", mx, "created_at",
                                    v[i].created_at);
        json_array_append_new(arr, e);
    }
    free(v);
    return sh_json_take_text(arr, out);
}

/* ---- Replicas ------------------------------------------------------------
 * store_replica_open() keeps the config's string pointers, so the parsed
 * JSON they point into lives until store_replica_close_json(). */
typedef struct held {
    store_replica *r;
    json_t *j;
    struct held *next;
} held;
static held *g_held;
static pthread_mutex_t g_held_mu = PTHREAD_MUTEX_INITIALIZER;

static int cfg_from_json(json_t *j, store_replica_config *c)
{
    static const char *const keys[] = {"dir", "store", "run", "parents", "zone", "fanout", "leaf",
                                       "egress_bps", "poll_s", "fp8", NULL};
    const char *ctx = "replica config";
    int64_t fanout = 0;
    int leaf = 0, fp8 = 0;
    json_t *parents = json_object_get(j, "parents");
    int rc = sh_json_check_keys(j, keys, ctx);
    if (rc == 0) rc = sh_json_get_str(j, "dir", 1, ctx, &c->dir);
    if (rc == 0) rc = sh_json_get_str(j, "store", 0, ctx, &c->store);
    if (rc == 0) rc = sh_json_get_str(j, "run", 0, ctx, &c->run);
    if (rc == 0) rc = sh_json_get_str(j, "zone", 0, ctx, &c->zone);
    if (rc == 0) rc = sh_json_get_i64(j, "fanout", 0, ctx, &fanout);
    if (rc == 0) rc = sh_json_get_bool(j, "leaf", 0, ctx, &leaf);
    if (rc == 0) rc = sh_json_get_bool(j, "fp8", 0, ctx, &fp8);
    if (rc == 0) rc = sh_json_get_num(j, "egress_bps", 0, ctx, &c->egress_bps);
    if (rc == 0) rc = sh_json_get_num(j, "poll_s", 0, ctx, &c->poll_s);
    if (rc < 0) return rc;
    if (fanout < 0 || fanout > 1024) return sh_err(SH_EINVAL, "%s: fanout %lld: use 1..1024", ctx, (long long)fanout);
    c->fanout = (int)fanout;
    c->leaf = leaf;
    c->fp8 = fp8;
    if (parents && !json_is_array(parents)) return sh_err(SH_EINVAL, "%s: \"parents\" must be a list of \"host:port\"", ctx);
    if (json_array_size(parents) > BCAST_MAX_ADDRS)
        return sh_err(SH_EINVAL, "%s: %zu parents; at most %d", ctx, json_array_size(parents), BCAST_MAX_ADDRS);
    for (size_t i = 0; i < json_array_size(parents); i++) {
        const char *p = json_string_value(json_array_get(parents, i));
        if (!p || !strchr(p, ':')) return sh_err(SH_EINVAL, "%s: parent %zu: expected \"host:port\"", ctx, i);
        c->parents[c->nparents++] = p;
    }
    if (!c->store && !c->nparents)
        return sh_err(SH_EINVAL, "%s: give \"store\" (a store root) or \"parents\" (push-tree parents)", ctx);
    return SH_OK;
}

int store_replica_open_json(const char *config_json, store_replica **out)
{
    *out = NULL;
    json_t *j;
    SH_TRY(sh_json_parse(config_json, strlen(config_json), "replica config", &j));
    store_replica_config c = {0};
    held *h = calloc(1, sizeof *h);
    int rc = h ? cfg_from_json(j, &c) : sh_err(SH_ENOMEM, "replica");
    if (rc == 0) rc = store_replica_open(&c, out);
    if (rc < 0) {
        free(h);
        json_decref(j);
        return rc;
    }
    h->r = *out;
    h->j = j;
    pthread_mutex_lock(&g_held_mu);
    h->next = g_held;
    g_held = h;
    pthread_mutex_unlock(&g_held_mu);
    return SH_OK;
}

void store_replica_close_json(store_replica *r)
{
    if (!r) return;
    store_replica_close(r);
    pthread_mutex_lock(&g_held_mu);
    held **p = &g_held;
    while (*p && (*p)->r != r) p = &(*p)->next;
    held *h = *p;
    if (h) *p = h->next;
    pthread_mutex_unlock(&g_held_mu);
    if (h) json_decref(h->j);
    free(h);
}

int store_replica_info_json(store_replica *r, char **out)
{
    store_replica_info i;
    store_replica_get_info(r, &i);
    json_t *j = json_pack("{s:I,s:I,s:f,s:f,s:I,s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:i,s:b,s:s}", "version",
                          (json_int_t)i.version, "newest_announced", (json_int_t)i.newest_announced, "activated_at", i.activated_at, "pause_max_ms",
                          i.pause_max_ms, "activations", (json_int_t)i.activations, "failures",
                          (json_int_t)i.failures, "last_error", i.last_error, "bytes_received",
                          (json_int_t)i.push.bytes_received, "bytes_sent", (json_int_t)i.push.bytes_sent,
                          "chunks_corrupt", (json_int_t)i.push.chunks_corrupt, "reattaches",
                          (json_int_t)i.push.reattaches, "redirects", (json_int_t)i.push.redirects,
                          "children_refused", (json_int_t)i.push.children_refused, "children", i.push.children, "attached", i.push.attached,
                          "parent_error", i.push.parent_error);
    return sh_json_take_text(j, out);
}

int store_lease_new(store_replica *r, uint64_t min_version, uint64_t exact_version, store_lease **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return sh_err(SH_ENOMEM, "lease");
    int rc = store_replica_acquire(r, min_version, exact_version, *out);
    if (rc < 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

uint64_t store_lease_free(store_replica *r, store_lease *l)
{
    if (!l) return 0;
    uint64_t v = store_replica_release(r, l);
    free(l);
    return v;
}

int store_lease_drop_pages(const store_lease *l, uint64_t off, uint64_t len)
{
    if (!l || !l->priv) return sh_err(SH_EINVAL, "drop pages: no model leased");
    const model *m = l->priv;
    /* Only the model's read-only file mapping (MAP_SHARED of its file):
     * its pages are clean and stay in the page cache, so dropping them
     * loses nothing.  Anonymous memory (the replica's image, a caller's
     * buffer) is never passed to madvise here. */
    if (!m->map || m->fd < 0 || l->data != m->map || l->size != m->size)
        return sh_err(SH_EINVAL, "drop pages: version %llu's lease is not its model's file mapping",
                      (unsigned long long)l->version);
    if (off > m->size || len > m->size - off)
        return sh_err(SH_ERANGE, "drop pages: bytes %llu..+%llu are outside version %llu's %llu bytes",
                      (unsigned long long)off, (unsigned long long)len, (unsigned long long)l->version,
                      (unsigned long long)m->size);
    if (len == 0) return SH_OK;
    /* Whole pages: a page shared with a neighbour's bytes is dropped too,
     * which costs that neighbour only a fault that reads the page cache. */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t a = off / page * page, b = (off + len + page - 1) / page * page;
    if (madvise(m->map + a, (size_t)(b - a), MADV_DONTNEED) < 0)
        return sh_err_errno(errno, "drop pages of version %llu", (unsigned long long)l->version);
    return SH_OK;
}
