/* shoal cancel: stops a job. */
#include <string.h>

#include "cli.h"
#include "ctl.h"

const char cli_help_cancel[] = "cancel a job: its running ranks are stopped [--json]";

static const char usage[] = "usage: shoal cancel ID [--server URL] [--token T] [--json]\n";

int cli_cmd_cancel(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--help")) return fputs(usage, stdout), 0;
    cli_ctl x;
    int rc = cli_ctl_init(&x, "cancel", &argc, argv);
    if (rc) return rc;
    int64_t id;
    if (argc != 2 || sh_parse_i64(argv[1], &id, "job id") < 0)
        return cli_ctl_free(&x), cli_usage("cancel", "expected one job id");
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)id);
    json_t *j;
    rc = cli_ctl_call(&x, "POST", path, NULL, NULL, &j);
    cli_ctl_free(&x);
    if (rc) return rc;
    if (x.json) sh_json_print(j);
    else printf("job %lld: %s\n", (long long)id, json_string_value(json_object_get(j, "state")));
    json_decref(j);
    return 0;
}
