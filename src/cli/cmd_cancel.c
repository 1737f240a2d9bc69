/* shoal cancel: stops a job. */
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_cancel[] = "cancel a job: its running ranks are stopped [--json]";

static const char usage[] = "usage: shoal cancel ID [--server URL] [--token T] [--json]\n";

int cli_cmd_cancel(int argc, char **argv)
{
    cli_ctl x;
    cli_ctl_defaults(&x, "cancel");
    cli_args a = {"cancel", usage, NULL, &x};
    if (cli_getopt(&a, argc, argv) != -1) return a.rc;
    int64_t id;
    int rc = cli_ctl_job_id("cancel", argc, argv, &id);
    if (rc) return rc;
    rc = cli_ctl_connect(&x);
    if (rc) return rc;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)id);
    json_t *j;
    rc = cli_ctl_call(&x, "POST", path, NULL, NULL, &j);
    cli_ctl_free(&x);
    if (rc) return rc;
    if (x.json) sh_json_print(j);
    else {
        const char *st = json_string_value(json_object_get(j, "state"));
        st = st ? st : "?";
        if (!strcmp(st, "succeeded") || !strcmp(st, "failed"))
            printf("job %lld had already %s; nothing to cancel\n", (long long)id, st);
        else printf("job %lld: %s\n", (long long)id, st);
    }
    json_decref(j);
    return 0;
}
