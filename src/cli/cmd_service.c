/* shoal service: a run's services, published and looked up by its jobs. */
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_service[] = "publish and look up a run's services (push root, trainer) [--json]";

static const char usage_text[] =
    "usage: shoal service publish NAME VALUE [--run R]\n"
    "       shoal service lookup NAME [--timeout S] [--run R]\n"
    "       shoal service ls [--run R]\n"
    "       (each also takes --server URL --token T --json)\n\n"
    "The jobs of one tenant whose job files name the same \"run\" form a run\n"
    "(docs/job-format.md).  Their ranks share a secret (SHOAL_RUN_SECRET) and\n"
    "find each other's addresses here: `publish` sets a service (a push root's\n"
    "ADDR:PORT, a trainer's), `lookup` prints one, waiting up to --timeout\n"
    "seconds (default 0: no wait) for it to be published, and `ls` lists them.\n\n"
    "Inside a rank it needs no option: SHOAL_RUN, SHOAL_RUN_TOKEN and\n"
    "SHOAL_SERVER are set.  Outside, give --run and the tenant's token.\n"
    "lookup exits 1 when the service is not there (in time).\n";

static const char *const subs[] = {"publish", "lookup", "ls", NULL};

static int path_ok(const char *cmd, const char *what, const char *v)
{
    size_t n = strlen(v);
    if (n < 1 || n > 63 || strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != n || v[0] == '.')
        return cli_usage(cmd, "%s \"%s\": expected 1 to 63 of A-Z a-z 0-9 . _ - (not starting with '.')", what, v);
    return 0;
}

/* lookup: polls until the service is published or the timeout passes. */
static int lookup(cli_ctl *x, const char *cmd, const char *path, double timeout, json_t **reply)
{
    double until = sh_now_mono() + timeout;
    for (;;) {
        int status = 0;
        int rc = client_call(x->c, "GET", path, NULL, NULL, 30, &status, reply);
        if (rc < 0) return cli_fail(cmd, rc);
        json_decref(*reply);
        *reply = NULL;
        if (status != 404 || sh_now_mono() >= until)
            return cli_ctl_call(x, "GET", path, NULL, NULL, reply); /* prints the error, if any */
        sh_sleep(0.2);
    }
}

static void print_reply(int k, const json_t *reply)
{
    if (k == 1) printf("%s\n", json_string_value(json_object_get(reply, "value")));
    else if (k == 2) {
        const char *name;
        json_t *v;
        json_object_foreach(json_object_get(reply, "services"), name, v) printf("%s %s\n", name, json_string_value(v));
    }
}

int cli_cmd_service(int argc, char **argv)
{
    int rc, k = cli_subcommand("service", usage_text, argc, argv, subs, &rc);
    if (k < 0) return rc;
    char cmd[32];
    snprintf(cmd, sizeof cmd, "service %s", subs[k]);
    static const struct option opts[] = {{"run", required_argument, 0, 'r'}, {"timeout", required_argument, 0, 't'}, {0}};
    cli_ctl x;
    cli_ctl_defaults(&x, cmd);
    /* Inside a rank its run's token, unless --token or SHOAL_TOKEN says otherwise. */
    const char *rt = getenv("SHOAL_RUN_TOKEN");
    if (rt && *rt && (!x.token || !*x.token)) x.token = rt;
    const char *run = getenv("SHOAL_RUN");
    double timeout = 0;
    cli_args a = {cmd, usage_text, opts, &x};
    argc--, argv++;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        if (c == 'r') run = optarg;
        else if (c != 't') return a.rc;
        else if ((rc = cli_real(cmd, "--timeout", optarg, 0, 86400, "seconds 0..86400", &timeout))) return rc;
    }
    int want = k == 0 ? 2 : k == 1 ? 1 : 0;
    if (argc - optind != want)
        return cli_usage(cmd, k == 0 ? "expected NAME VALUE" : k == 1 ? "expected one service NAME" : "expected no argument");
    if (!run || !*run) return cli_usage(cmd, "no run: give --run R (inside a rank of a run, SHOAL_RUN says it)");
    if ((rc = path_ok(cmd, "run", run)) || (want && (rc = path_ok(cmd, "service", argv[optind])))) return rc;
    if ((rc = cli_ctl_connect(&x))) return rc;
    char path[256];
    snprintf(path, sizeof path, "/v1/runs/%s/services%s%s", run, want ? "/" : "", want ? argv[optind] : "");
    json_t *reply = NULL;
    if (k == 0) {
        json_t *b = json_pack("{s:s}", "value", argv[optind + 1]);
        rc = cli_ctl_call(&x, "PUT", path, b, NULL, &reply);
        json_decref(b);
    } else if (k == 1) rc = lookup(&x, cmd, path, timeout, &reply);
    else rc = cli_ctl_call(&x, "GET", path, NULL, NULL, &reply);
    cli_ctl_free(&x);
    if (!rc && x.json) sh_json_print(reply);
    else if (!rc) print_reply(k, reply);
    json_decref(reply);
    return rc;
}
