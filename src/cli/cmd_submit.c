/* shoal submit: sends a job file to the server. */
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_submit[] = "submit a job file (gang, elastic or function) [--json]";

static const char usage[] =
    "usage: shoal submit JOB.json [--wait] [--idempotency-key K] [--server URL] [--token T] [--json]\n\n"
    "Sends the job file (docs/job-format.md) and prints the job's id.  A retried\n"
    "submit with the same idempotency key returns the job the first one created.\n"
    "A job that can never fit on the fleet is rejected with the reason.\n\n"
    "--wait waits until the job ends and exits with its status, as srun does:\n"
    "0 if it succeeded, the failed rank's exit code (1..255), or 1 if it failed\n"
    "without one (a lost node, its time limit) or was cancelled; the reason goes\n"
    "to stderr.  With --json it prints the ended job.  Exit status 2 is a usage\n"
    "error, 1 also a refused submit.\n";

int cli_cmd_submit(int argc, char **argv)
{
    static const struct option opts[] = {
        {"idempotency-key", required_argument, 0, 'k'}, {"wait", no_argument, 0, 'w'}, {0}};
    cli_ctl x;
    cli_ctl_defaults(&x, "submit");
    cli_args a = {"submit", usage, opts, &x};
    const char *file = NULL, *key = NULL;
    int wait = 0;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
        if (c == 'k') key = optarg;
        else if (c == 'w') wait = 1;
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
    if (rc) return cli_ctl_free(&x), rc;
    if (wait) {
        int64_t id = json_integer_value(json_object_get(reply, "id"));
        if (!x.json)
            printf("submitted job %lld (%s); waiting for it to end\n", (long long)id,
                   json_string_value(json_object_get(reply, "name"))), fflush(stdout);
        json_decref(reply);
        x.subject = NULL;
        rc = cli_ctl_wait_job(&x, id, &reply);
        cli_ctl_free(&x);
        if (rc) return rc;
        if (x.json) sh_json_print(reply);
        else printf("job %lld %s\n", (long long)id, json_string_value(json_object_get(reply, "state")));
        rc = cli_job_report("submit", reply);
        json_decref(reply);
        return rc;
    }
    cli_ctl_free(&x);
    if (x.json) sh_json_print(reply);
    else
        printf("%s job %lld (%s): %s\n", json_is_true(json_object_get(reply, "duplicate")) ? "already submitted:" : "submitted",
               (long long)json_integer_value(json_object_get(reply, "id")),
               json_string_value(json_object_get(reply, "name")), json_string_value(json_object_get(reply, "state")));
    json_decref(reply);
    return 0;
}
