/* shoal logs: a job rank's output, optionally followed until it ends. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_logs[] = "print a job's output (one rank), -f to follow until it ends";

static const char usage[] =
    "usage: shoal logs ID [--rank R] [-f|--follow] [--raw] [--server URL] [--token T] [--json]\n\n"
    "Prints rank R's whole output so far (default rank 0).  --follow waits for\n"
    "more until the job ends.  --json prints one object {job, rank, data, offset,\n"
    "done} at the end.\n\n"
    "On a terminal, control characters of the output (escape sequences, other\n"
    "C0 and C1 controls, DEL) are shown as ^[, ^M, \\u009b and the like, so that\n"
    "a job cannot drive your terminal; newlines and tabs pass.  --raw prints\n"
    "the bytes as the job wrote them.  Into a pipe or a file the bytes always\n"
    "pass unchanged (--json escapes them as JSON does; on a terminal, as\n"
    "\\uXXXX for everything past ASCII).\n";

/* Prints a chunk of output, made safe for a terminal when `escape`. */
static int put(const char *d, size_t n, int escape)
{
    if (!escape) return fwrite(d, 1, n, stdout) == n ? 0 : -1;
    sh_buf b = {0};
    int rc = cli_term_escape(d, n, &b);
    if (rc == 0 && b.len && fwrite(b.data, 1, b.len, stdout) != b.len) rc = -1;
    sh_buf_free(&b);
    return rc;
}

int cli_cmd_logs(int argc, char **argv)
{
    static const struct option opts[] = {{"rank", required_argument, 0, 'r'}, {"follow", no_argument, 0, 'f'},
                                         {"raw", no_argument, 0, 'R'}, {0}};
    cli_ctl x;
    cli_ctl_defaults(&x, "logs");
    cli_args a = {"logs", usage, opts, &x, NULL, "f"}; /* -f, as tail spells it */
    int64_t id = -1, rank = 0;
    int follow = 0, raw = 0;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        if (c == 'f') follow = 1;
        else if (c == 'R') raw = 1;
        else if (c != 'r') return a.rc;
        else if (sh_parse_i64(optarg, &rank, "--rank") < 0 || rank < 0)
            return cli_usage("logs", "--rank: expected a rank number, got \"%s\"", optarg);
    }
    int rc = cli_ctl_job_id("logs", argc, argv, &id);
    if (rc) return rc;
    rc = cli_ctl_connect(&x);
    if (rc) return rc;
    int escape = !raw && isatty(STDOUT_FILENO);
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
        else if (put(d, n, escape) < 0) rc = cli_fail("logs", sh_err_errno(errno, "writing the output"));
        if (!x.json) fflush(stdout);
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
        if (escape) {
            /* Past ASCII as \uXXXX: no C1 control reaches the terminal. */
            char *t = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
            if (t) printf("%s\n", t);
            free(t);
        } else sh_json_print(j);
        json_decref(j);
    }
    sh_buf_free(&all);
    return rc;
}
