/* shoal submit: sends a job file to the server. */
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_submit[] = "submit a job file (gang, elastic or function) [--json]";

static const char usage[] =
    "usage: shoal submit JOB.json [--idempotency-key K] [--server URL] [--token T] [--json]\n\n"
    "Sends the job file (docs/job-format.md) and prints the job's id.  A retried\n"
    "submit with the same idempotency key returns the job the first one created.\n"
    "A job that can never fit on the fleet is rejected with the reason.\n";

int cli_cmd_submit(int argc, char **argv)
{
    static const struct option opts[] = {{"idempotency-key", required_argument, 0, 'k'}, {0}};
    cli_ctl x;
    cli_ctl_defaults(&x, "submit");
    cli_args a = {"submit", usage, opts, &x};
    const char *file = NULL, *key = NULL;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
        if (c == 'k') key = optarg;
        else return a.rc;
    if (optind + 1 != argc) return cli_usage("submit", optind < argc ? "expected one job file" : "expected a job file");
    file = argv[optind];
    int rc = cli_ctl_connect(&x);
    if (rc) return rc;
    json_t *job, *reply;
    if ((rc = sh_json_load_file(file, 1 << 20, &job)) < 0) return cli_ctl_free(&x), cli_fail("submit", rc);
    char hdr[300];
    if (key) snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", key);
    x.subject = file;
    rc = cli_ctl_call(&x, "POST", "/v1/jobs", job, key ? hdr : NULL, &reply);
    json_decref(job);
    cli_ctl_free(&x);
    if (rc) return rc;
    if (x.json) sh_json_print(reply);
    else
        printf("%s job %lld (%s): %s\n", json_is_true(json_object_get(reply, "duplicate")) ? "already submitted:" : "submitted",
               (long long)json_integer_value(json_object_get(reply, "id")),
               json_string_value(json_object_get(reply, "name")), json_string_value(json_object_get(reply, "state")));
    json_decref(reply);
    return 0;
}
