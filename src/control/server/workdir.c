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

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The file that holds tenant's archive `id` (32 hex digits). */
static int workdir_path(const srv *s, const char *tenant, const char *id, char *out, size_t cap)
{
    sh_buf k = {0};
    sh_buf_printf(&k, "%s%c%s", tenant, 0, id);
    char hex[33];
    sh_hash128_hex(sh_hash128_of(k.data, k.len), hex);
    sh_buf_free(&k);
    if ((size_t)snprintf(out, cap, "%s/workdirs/%s.tar", s->dir, hex) >= cap) return sh_err(SH_ERANGE, "workdir path");
    return SH_OK;
}

int srv__workdir_id_ok(const char *id)
{
    return id && strlen(id) == 32 && strspn(id, "0123456789abcdef") == 32;
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
    int rc = u->bytes ? workdir_path(s, tenant, id, path, sizeof path)
                      : sh_err(SH_EFORMAT, "/v1/workdirs: an empty body is no archive (shoal submit --workdir DIR)");
    if (rc == SH_OK && fsync(u->fd) < 0) rc = sh_err_errno(errno, "%s", u->tmp);
    if (rc == SH_OK && rename(u->tmp, path) < 0) rc = sh_err_errno(errno, "rename %s", path);
    if (rc == SH_OK) {
        char d[4200];
        snprintf(d, sizeof d, "%s/workdirs", s->dir);
        rc = sh_fsync_dir(d);
    }
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
    srv_job *j = srv__job(s, job);
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
