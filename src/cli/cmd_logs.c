/* shoal logs: a job rank's output, optionally followed until it ends. */
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_logs[] = "print a job's output (one rank), -f to follow until it ends";

static const char usage[] =
    "usage: shoal logs ID [--rank R] [-f|--follow] [--server URL] [--token T] [--json]\n\n"
    "Prints rank R's whole output so far (default rank 0).  --follow waits for\n"
    "more until the job ends.  --json prints one object {job, rank, data, offset,\n"
    "done} at the end.\n";

int cli_cmd_logs(int argc, char **argv)
{
    static const struct option opts[] = {{"rank", required_argument, 0, 'r'}, {"follow", no_argument, 0, 'f'}, {0}};
    cli_ctl x;
    cli_ctl_defaults(&x, "logs");
    cli_args a = {"logs", usage, opts, &x, NULL, "f"}; /* -f, as tail spells it */
    int64_t id = -1, rank = 0;
    int follow = 0;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        if (c == 'f') follow = 1;
        else if (c != 'r') return a.rc;
        else if (sh_parse_i64(optarg, &rank, "--rank") < 0 || rank < 0)
            return cli_usage("logs", "--rank: expected a rank number, got \"%s\"", optarg);
    }
    int rc = cli_ctl_job_id("logs", argc, argv, &id);
    if (rc) return rc;
    rc = cli_ctl_connect(&x);
    if (rc) return rc;
    long long off = 0;
    sh_buf all = {0};
    int done = 0;
    for (;;) {
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%lld/logs?rank=%lld&offset=%lld", (long long)id, (long long)rank, off);
        json_t *r;
        if ((rc = cli_ctl_call(&x, "GET", path, NULL, NULL, &r))) break;
        const char *d = json_string_value(json_object_get(r, "data"));
        size_t n = json_string_length(json_object_get(r, "data"));
        if (x.json) rc = sh_buf_append(&all, d, n) < 0 ? cli_fail("logs", SH_ENOMEM) : 0;
        else fwrite(d, 1, n, stdout), fflush(stdout);
        off = json_integer_value(json_object_get(r, "offset"));
        done = json_is_true(json_object_get(r, "done"));
        json_decref(r);
        /* A page holds at most a window of the log (1 MiB): without
         * --follow, pages are read until one comes back empty. */
        if (rc || (n == 0 && (!follow || done))) break;
        if (n == 0) sh_sleep(0.3);
    }
    cli_ctl_free(&x);
    if (!rc && x.json) {
        json_t *j = json_pack("{s:I,s:I,s:s#,s:I,s:b}", "job", (json_int_t)id, "rank", (json_int_t)rank, "data",
                              all.data ? (const char *)all.data : "", all.len, "offset", (json_int_t)off, "done", done);
        sh_json_print(j);
        json_decref(j);
    }
    sh_buf_free(&all);
    return rc;
}
