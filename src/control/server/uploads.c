/* Work dirs: the archives of code that jobs ship (docs/server-api.md,
 * "Work dirs").
 *
 * A tenant uploads an archive with POST /v1/workdirs; the body streams to a
 * temporary file beside the database, never into memory, up to
 * srv_config.workdir_max bytes, and is renamed, after an fsync, to a name
 * derived from the tenant and the archive's xxh3-128, which is the id the
 * tenant names in its job's "workdir".  An id is therefore only ever the
 * tenant's own: another tenant naming it finds nothing.  The agent of a
 * node that runs a rank of the job fetches it with GET
 * /v1/agent/workdir?job=ID and unpacks it, checking every entry
 * (src/common/tarball.c). */
#include "srv_int.h"
#include "files_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The directory of a tenant's archives (one per tenant, so that what a
 * tenant holds can be counted). */
static void tenant_dir(const srv *s, const char *tenant, char *out, size_t cap)
{
    char hex[33];
    sh_hash128_hex(sh_hash128_of(tenant, strlen(tenant)), hex);
    snprintf(out, cap, "%s/workdirs/%s", s->dir, hex);
}

/* The file that holds tenant's archive `id` (32 hex digits). */
static int workdir_path(const srv *s, const char *tenant, const char *id, char *out, size_t cap)
{
    sh_buf k = {0};
    sh_buf_printf(&k, "%s%c%s", tenant, 0, id);
    char hex[33], d[4200];
    sh_hash128_hex(sh_hash128_of(k.data, k.len), hex);
    sh_buf_free(&k);
    tenant_dir(s, tenant, d, sizeof d);
    if ((size_t)snprintf(out, cap, "%s/%s.tar", d, hex) >= cap) return sh_err(SH_ERANGE, "workdir path");
    return SH_OK;
}

/* Makes room for `more` bytes in the tenant's archives, within
 * srv_config.workdir_quota: removes, oldest first, the archives no pending
 * or running job of the tenant names.  Fails (429-worthy SH_ERANGE) when
 * the archives in use leave no room. */
static int make_room(srv *s, const char *tenant, uint64_t more)
{
    char d[4200];
    tenant_dir(s, tenant, d, sizeof d);
    DIR *dir = opendir(d);
    if (!dir) return sh_err_errno(errno, "%s", d);
    struct { char name[64]; time_t t; uint64_t size; int used; } f[512];
    int n = 0;
    uint64_t held = 0;
    pthread_mutex_lock(&s->mu);
    for (struct dirent *e; (e = readdir(dir)) && n < 512;) {
        size_t len = strlen(e->d_name);
        struct stat st;
        if (len != 36 || strcmp(e->d_name + 32, ".tar") || fstatat(dirfd(dir), e->d_name, &st, 0) < 0) continue;
        snprintf(f[n].name, sizeof f[n].name, "%s", e->d_name);
        f[n].t = st.st_mtime;
        f[n].size = (uint64_t)st.st_size;
        f[n].used = 0;
        for (int64_t a = 0; a < s->nactive && !f[n].used; a++) {
            const srv_job *j = srv__job_at(s, s->active[a]);
            const char *id = j && j->state <= J_RUNNING && !strcmp(j->tenant, tenant)
                                 ? json_string_value(json_object_get(j->spec, "workdir")) : NULL;
            char p[4300];
            f[n].used = id && workdir_path(s, tenant, id, p, sizeof p) == SH_OK && strstr(p, e->d_name);
        }
        held += f[n++].size;
    }
    pthread_mutex_unlock(&s->mu);
    while (held + more > s->cfg.workdir_quota) {
        int old = -1;
        for (int i = 0; i < n; i++)
            if (!f[i].used && f[i].size && (old < 0 || f[i].t < f[old].t)) old = i;
        if (old < 0) break;
        if (unlinkat(dirfd(dir), f[old].name, 0) == 0) held -= f[old].size;
        f[old].size = 0;
    }
    closedir(dir);
    if (held + more > s->cfg.workdir_quota)
        return sh_err(SH_ERANGE, "work dir: tenant %s's work dirs of pending and running jobs hold %llu bytes;"
                                 " %llu more would pass the server's limit of %llu per tenant: wait for some to"
                                 " end", tenant, (unsigned long long)held, (unsigned long long)more,
                      (unsigned long long)s->cfg.workdir_quota);
    return SH_OK;
}

int srv__workdir_exists(const srv *s, const char *tenant, const char *id)
{
    char p[4300];
    struct stat st;
    return srv__workdir_id_ok(id) && workdir_path(s, tenant, id, p, sizeof p) == SH_OK && stat(p, &st) == 0;
}

int srv__upload_begin(srv *s, srv_upload *u)
{
    memset(u, 0, sizeof *u);
    u->fd = -1;
    char d[4200];
    snprintf(d, sizeof d, "%s/workdirs", s->dir);
    SH_TRY(sh_mkdir_p(d, 0700));
    snprintf(u->tmp, sizeof u->tmp, "%s/.upload.XXXXXX", d);
    u->fd = mkstemp(u->tmp);
    if (u->fd < 0) return sh_err_errno(errno, "%s", u->tmp);
    if (!(u->h = sh_hasher_new())) {
        srv__upload_abort(u);
        return sh_err(SH_ENOMEM, "upload");
    }
    return SH_OK;
}

int srv__upload_write(srv_upload *u, const void *data, size_t len)
{
    if (u->fd < 0) return SH_EIO;
    sh_hasher_update(u->h, data, len);
    u->bytes += len;
    return sh_write_all(u->fd, data, len, u->tmp);
}

void srv__upload_abort(srv_upload *u)
{
    if (u->fd >= 0) {
        close(u->fd);
        unlink(u->tmp);
    }
    u->fd = -1;
    sh_hasher_free(u->h);
    u->h = NULL;
}

int srv__upload_commit(srv *s, srv_upload *u, const char *tenant, json_t **reply)
{
    char id[33], path[4300];
    sh_hash128_hex(sh_hasher_digest(u->h), id);
    char d[4200];
    tenant_dir(s, tenant, d, sizeof d);
    int rc = u->bytes ? workdir_path(s, tenant, id, path, sizeof path)
                      : sh_err(SH_EFORMAT, "/v1/workdirs: an empty body is no archive (shoal submit --workdir DIR)");
    struct stat st;
    if (rc == SH_OK) rc = sh_mkdir_p(d, 0700);
    if (rc == SH_OK && stat(path, &st) < 0) rc = make_room(s, tenant, u->bytes); /* the same archive again: no room needed */
    if (rc == SH_OK && fsync(u->fd) < 0) rc = sh_err_errno(errno, "%s", u->tmp);
    if (rc == SH_OK && rename(u->tmp, path) < 0) rc = sh_err_errno(errno, "rename %s", path);
    if (rc == SH_OK) rc = sh_fsync_dir(d);
    if (rc < 0) {
        srv__upload_abort(u);
        return rc;
    }
    close(u->fd);
    u->fd = -1;
    sh_hasher_free(u->h);
    u->h = NULL;
    *reply = json_pack("{s:s,s:I}", "workdir", id, "bytes", (json_int_t)u->bytes);
    return SH_OK;
}

int srv__workdir_for_node(srv *s, int node, int64_t job, char *path, size_t cap)
{
    srv_job *j = srv__job_at(s, job);
    int here = 0;
    for (int i = 0; j && i < j->nmem; i++) here |= j->mem[i].node == node && j->mem[i].state <= M_RUNNING;
    /* A node sees the code of the jobs it runs, no other. */
    if (!j || j->state > J_RUNNING || !here)
        return sh_err(SH_EPERM, "/v1/agent/workdir: job %lld has no live rank on node %s", (long long)job,
                      s->nodes[node].name);
    const char *id = json_string_value(json_object_get(j->spec, "workdir"));
    if (!id) return sh_err(SH_ENOENT, "/v1/agent/workdir: job %lld ships no work dir", (long long)job);
    return workdir_path(s, j->tenant, id, path, cap);
}
