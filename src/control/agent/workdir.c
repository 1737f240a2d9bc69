/* A job's work dir: the archive `shoal submit --workdir` uploaded, fetched
 * from the server and unpacked into the rank's work directory before the
 * rank is forked, so that every rank starts with the tenant's code in its
 * current directory.  The archive is the tenant's and is untrusted:
 * sh_tar_unpack creates only plain files, directories and links inside the
 * tree, owned by the rank's uid, without setuid bits (docs/security.md). */
#include "agent_int.h"

#include <stdlib.h>
#include <string.h>

int agent__workdir(agent *a, agent_member *m, const json_t *d)
{
    if (!json_is_string(json_object_get(d, "workdir"))) return SH_OK;
    char path[96];
    snprintf(path, sizeof path, "/v1/agent/workdir?job=%lld", (long long)m->job);
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    int rc = client_raw(a->cl, "GET", path, NULL, 0, NULL, 120, &status, &body, &len);
    if (rc == SH_OK && status != 200) {
        json_t *e = json_loadb(body, len, 0, NULL);
        rc = sh_err(SH_EIO, "work dir of job %lld: HTTP %d from the server: %s", (long long)m->job, status,
                    e ? json_string_value(json_object_get(e, "error")) : "(no message)");
        json_decref(e);
    }
    /* What the agent unpacks is bounded as the server bounds uploads. */
    if (rc == SH_OK) rc = sh_tar_unpack(body, len, m->workdir, SH_TAR_DEFAULT_LIMIT, (unsigned)m->uid);
    free(body);
    return rc < 0 ? sh_err_wrap(rc, "job %lld rank %d: work dir", (long long)m->job, m->rank) : SH_OK;
}
