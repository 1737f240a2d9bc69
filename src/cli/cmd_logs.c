/* shoal logs: a job rank's output, optionally followed until it ends. */
#include <string.h>

#include "cli.h"
#include "ctl.h"

const char cli_help_logs[] = "print a job's output (one rank), -f to follow until it ends";

static const char usage[] = "usage: shoal logs ID [--rank R] [-f] [--server URL] [--token T]\n";

int cli_cmd_logs(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--help")) return fputs(usage, stdout), 0;
    cli_ctl x;
    int rc = cli_ctl_init(&x, "logs", &argc, argv);
    if (rc) return rc;
    int64_t id = -1, rank = 0;
    int follow = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow")) follow = 1;
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) {
            if (sh_parse_i64(argv[++i], &rank, "--rank") < 0) return cli_ctl_free(&x), cli_usage("logs", "--rank: expected a number");
        } else if (id < 0 && sh_parse_i64(argv[i], &id, "job id") == 0) {
        } else return cli_ctl_free(&x), cli_usage("logs", "unexpected argument \"%s\"", argv[i]);
    }
    if (id < 0) return cli_ctl_free(&x), cli_usage("logs", "expected a job id");
    long long off = 0;
    for (;;) {
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%lld/logs?rank=%lld&offset=%lld", (long long)id, (long long)rank, off);
        json_t *r;
        if ((rc = cli_ctl_call(&x, "GET", path, NULL, NULL, &r))) break;
        const char *d = json_string_value(json_object_get(r, "data"));
        size_t n = json_string_length(json_object_get(r, "data"));
        fwrite(d, 1, n, stdout);
        fflush(stdout);
        off = json_integer_value(json_object_get(r, "offset"));
        int done = json_is_true(json_object_get(r, "done"));
        json_decref(r);
        if (!follow || (done && n == 0)) break;
        if (n == 0) sh_sleep(0.3);
    }
    cli_ctl_free(&x);
    return rc;
}
