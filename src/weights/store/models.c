/* A replica's model files (mapped and parsed full checkpoints, their FP8
 * serving copies) and its ACTIVE pointer. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/delta.h"
#include "weights/store/replica_int.h"

/* ---- Models ------------------------------------------------------------ */

int store__model_open(const char *path, uint64_t version, model **out)
{
    model *m = calloc(1, sizeof *m);
    if (!m) return sh_err(SH_ENOMEM, "model");
    snprintf(m->path, sizeof m->path, "%s", path);
    m->version = version;
    m->refs = 1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    m->fd = fd;
    struct stat st;
    int rc = fd < 0 ? sh_err_errno(errno, "open %s", path) : 0;
    if (rc == 0 && fstat(fd, &st) < 0) rc = sh_err_errno(errno, "stat %s", path);
    if (rc == 0 && st.st_size > 0) {
        m->size = (uint64_t)st.st_size;
        /* Not populated: a page is in this process's memory once a lease
         * reads it, so that a replica holds the versions it serves and
         * nothing else (a push replica's own copy is its image, and the
         * file of the model an activation replaced is only written, with
         * pwrite).  Read ahead into the page cache, which costs no memory
         * of the process. */
        void *map = mmap(NULL, m->size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) rc = sh_err_errno(errno, "mmap %s", path);
        else m->map = map, madvise(map, m->size, MADV_WILLNEED);
    }
    /* Verification includes the format: a version that is not a valid
     * checkpoint never becomes active. */
    if (rc == 0) rc = ckpt_open_mem(m->map, m->size, path, &m->ck);
    if (rc < 0) {
        if (m->map) munmap(m->map, m->size);
        if (fd >= 0) close(fd);
        free(m);
        return rc;
    }
    *out = m;
    return SH_OK;
}

void store__model_free(model *m, int unlink_files)
{
    if (!m) return;
    store__model_free(m->fp8, unlink_files);
    ckpt_close(m->ck);
    if (unlink_files) unlink(m->path);
    if (m->map) munmap(m->map, m->size);
    if (m->fd >= 0) close(m->fd);
    free(m);
}

/* Drops a reference; the last one unmaps the model and deletes its files
 * unless it is still the active one on disk. */
void store__model_unref(store_replica *r, model *m)
{
    if (!m) return;
    pthread_mutex_lock(&r->mu);
    int last = --m->refs == 0;
    int is_active = r->active == m;
    pthread_mutex_unlock(&r->mu);
    if (last) store__model_free(m, !is_active && !m->keep);
}

int store__model_path(store_replica *r, uint64_t v, char *out, size_t cap)
{
    int k = snprintf(out, cap, "%s/%010llu.safetensors", r->models, (unsigned long long)v);
    return k < 0 || (size_t)k >= cap ? sh_err(SH_ERANGE, "replica path too long") : SH_OK;
}

int store__fp8_path(store_replica *r, uint64_t v, char *out, size_t cap)
{
    int k = snprintf(out, cap, "%s/%010llu.fp8.safetensors", r->models, (unsigned long long)v);
    return k < 0 || (size_t)k >= cap ? sh_err(SH_ERANGE, "replica path too long") : SH_OK;
}

/* --fp8: the serving copy of version v (bf16 at `bf16`).  After one delta
 * on a version whose FP8 copy exists, only the blocks the delta touched are
 * re-quantised; otherwise the whole model is quantised.  Both give the same
 * bytes (the codec guarantees it). */
int store__make_fp8(store_replica *r, uint64_t v, const char *bf16, const model *prev,
                    const char *delta_path, char *out, size_t cap)
{
    SH_TRY(store__fp8_path(r, v, out, cap));
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
    return delta_quant_fp8(bf16, out, NULL, &o, NULL);
}

int store__model_open_fp8(model *m, const char *fp8)
{
    if (!fp8) return SH_OK;
    return store__model_open(fp8, m->version, &m->fp8);
}

/* ---- ACTIVE --------------------------------------------------------------- */

int store__write_active(store_replica *r, const store_version *v, double at)
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
int store__restore_active(store_replica *r)
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
    if (rc == 0) rc = store__model_path(r, (uint64_t)v, path, sizeof path);
    if (rc == 0) rc = store__hash_file(path, &got, &n);
    if (rc == 0 && (n != (uint64_t)size || !sh_hash128_eq(got, want)))
        rc = sh_err(SH_EMISMATCH, "%s: the model of version %lld does not match its hash", path, (long long)v);
    if (rc == 0) rc = store__model_open(path, (uint64_t)v, &r->active);
    if (rc == 0) r->activated_at = at;
    json_decref(j);
    if (rc == 0 && r->cfg.fp8) {
        char fp8[4096];
        rc = store__fp8_path(r, (uint64_t)v, fp8, sizeof fp8);
        /* A missing or damaged FP8 copy is rebuilt from the verified bf16. */
        if (rc == 0 && store__model_open_fp8(r->active, fp8) < 0) {
            rc = store__make_fp8(r, (uint64_t)v, path, NULL, NULL, fp8, sizeof fp8);
            if (rc == 0) rc = store__model_open_fp8(r->active, fp8);
        }
        if (rc < 0) {
            store__model_free(r->active, 0);
            r->active = NULL;
        }
    }
    return rc;
}

/* Files a crash mid-apply left: staged checkpoints and temporaries. */
void store__clean_leftovers(store_replica *r)
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
