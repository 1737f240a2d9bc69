/* shoal submit: sends a job file to the server. */
#include <stdlib.h>
#include <sys/random.h>
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_submit[] = "submit a job file (gang, elastic or function) [--json]";

static const char usage[] =
    "usage: shoal submit JOB.json [--wait] [--workdir DIR] [--workdir-limit SIZE] [--idempotency-key K]\n"
    "                    [--server URL] [--token T] [--json]\n\n"
    "Sends the job file (docs/job-format.md) and prints the job's id.  A retried\n"
    "submit with the same idempotency key returns the job the first one created.\n"
    "A job that can never fit on the fleet is rejected with the reason.\n\n"
    "--workdir DIR (or a \"workdir\" field naming a directory, relative to the\n"
    "job file) uploads DIR's files, directories and links inside it as an archive\n"
    "of at most --workdir-limit bytes (default 100MiB); every rank starts in a\n"
    "copy of it.  A link out of DIR, a socket or device, or a larger tree is\n"
    "refused before anything is sent.\n\n"
    "--wait waits until the job ends and exits with its status, as srun does:\n"
    "0 if it succeeded, the failed rank's exit code (1..255), or 1 if it failed\n"
    "without one (a lost node, its time limit) or was cancelled; the reason goes\n"
    "to stderr.  With --json it prints the ended job.  Exit status 2 is a usage\n"
    "error, 1 also a refused submit.\n";

/* The work dir to ship: --workdir, else a "workdir" field that names a
 * directory (relative to the job file's); it is packed, uploaded, and the
 * field set to the id the server gives it.  Returns 0 or an exit status. */
static int upload_workdir(cli_ctl *x, const char *file, const char *dir, uint64_t limit, json_t *job)
{
    const char *field = json_string_value(json_object_get(job, "workdir"));
    char path[4096];
    if (!dir && !field) return 0;
    if (!dir && json_object_get(job, "workdir") && !field)
        return fprintf(stderr, "shoal submit: %s: field \"workdir\": expected the path of a directory\n", file), 1;
    if (!dir) {
        /* Relative to the job file, as a Makefile's paths are to it. */
        const char *slash = strrchr(file, '/');
        if (field[0] == '/' || !slash) snprintf(path, sizeof path, "%s", field);
        else snprintf(path, sizeof path, "%.*s/%s", (int)(slash - file), file, field);
        if (!sh_is_dir(path) && strlen(field) == 32 && strspn(field, "0123456789abcdef") == 32)
            return 0; /* already an uploaded work dir's id */
        dir = path;
    }
    if (!sh_is_dir(dir)) {
        fprintf(stderr, "shoal submit: work dir %s: no such directory%s\n", dir,
                dir == path ? " (the job file's \"workdir\", relative to the job file)" : "");
        return 1;
    }
    sh_buf tar = {0};
    int rc = sh_tar_pack(dir, limit, &tar);
    if (rc < 0) {
        sh_buf_free(&tar);
        return cli_fail("submit", rc);
    }
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    rc = client_raw(x->c, "POST", "/v1/workdirs", (const char *)tar.data, tar.len, NULL, 300, &status, &body, &len);
    sh_buf_free(&tar);
    if (rc < 0) return cli_fail("submit", rc);
    json_t *r = json_loadb(body, len, 0, NULL);
    free(body);
    const char *id = json_string_value(json_object_get(r, "workdir"));
    if (status != 201 || !id) {
        fprintf(stderr, "shoal submit: work dir %s: %s (HTTP %d from %s)\n", dir,
                r ? json_string_value(json_object_get(r, "error")) : "no reply", status, x->server);
        json_decref(r);
        return 1;
    }
    json_object_set_new(job, "workdir", json_string(id));
    json_decref(r);
    return 0;
}

/* With several servers a submit may be re-sent to the next after the
 * first died holding it: a key of its own keeps it from running twice. */
static const char *auto_key(const cli_ctl *x, char *out, size_t cap)
{
    uint8_t r[12];
    if (!strchr(x->server, ',') || getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return NULL;
    int n = snprintf(out, cap, "auto-");
    for (size_t i = 0; i < sizeof r; i++) n += snprintf(out + n, cap - (size_t)n, "%02x", r[i]);
    return out;
}

/* --wait: the job's end, and its status as the exit code. */
static int wait_for(cli_ctl *x, json_t *reply)
{
    int64_t id = json_integer_value(json_object_get(reply, "id"));
    if (!x->json)
        printf("submitted job %lld (%s); waiting for it to end\n", (long long)id,
               json_string_value(json_object_get(reply, "name"))), fflush(stdout);
    json_t *end = NULL;
    x->subject = NULL;
    int rc = cli_ctl_wait_job(x, id, &end);
    if (rc) return rc;
    if (x->json) sh_json_print(end);
    else printf("job %lld %s\n", (long long)id, json_string_value(json_object_get(end, "state")));
    rc = cli_job_report("submit", end);
    json_decref(end);
    return rc;
}

int cli_cmd_submit(int argc, char **argv)
{
    static const struct option opts[] = {
        {"idempotency-key", required_argument, 0, 'k'}, {"wait", no_argument, 0, 'w'},
        {"workdir", required_argument, 0, 'd'},         {"workdir-limit", required_argument, 0, 'l'}, {0}};
    cli_ctl x;
    cli_ctl_defaults(&x, "submit");
    cli_args a = {"submit", usage, opts, &x};
    const char *file = NULL, *key = NULL, *workdir = NULL;
    uint64_t limit = SH_TAR_DEFAULT_LIMIT;
    int wait = 0;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
        if (c == 'k') key = optarg;
        else if (c == 'w') wait = 1;
        else if (c == 'd') workdir = optarg;
        else if (c != 'l') return a.rc;
        else if (sh_parse_size(optarg, &limit, "--workdir-limit") < 0 || limit < 1000)
            return cli_usage("submit", "--workdir-limit: expected a size of at least 1K (e.g. 100M or 100MiB), got \"%s\"", optarg);
    if (optind + 1 != argc) return cli_usage("submit", optind < argc ? "expected one job file" : "expected a job file");
    file = argv[optind];
    int rc = cli_ctl_connect(&x);
    if (rc) return rc;
    json_t *job, *reply = NULL;
    char hdr[300], autokey[40];
    if ((rc = sh_json_load_file(file, 1 << 20, &job)) < 0) rc = cli_fail("submit", rc);
    if (!rc) rc = upload_workdir(&x, file, workdir, limit, job);
    if (!key) key = auto_key(&x, autokey, sizeof autokey);
    if (key) snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", key);
    x.subject = file;
    if (!rc) rc = cli_ctl_call(&x, "POST", "/v1/jobs", job, key ? hdr : NULL, &reply);
    json_decref(job);
    if (!rc && wait) rc = wait_for(&x, reply);
    else if (!rc && x.json) sh_json_print(reply);
    else if (!rc)
        printf("%s job %lld (%s): %s\n", json_is_true(json_object_get(reply, "duplicate")) ? "already submitted:" : "submitted",
               (long long)json_integer_value(json_object_get(reply, "id")),
               json_string_value(json_object_get(reply, "name")), json_string_value(json_object_get(reply, "state")));
    cli_ctl_free(&x);
    json_decref(reply);
    return rc;
}
