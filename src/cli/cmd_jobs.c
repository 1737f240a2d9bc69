/* shoal jobs: lists jobs as a table. */
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_jobs[] = "list jobs (yours, or all with the admin token) [--json]";

static const char usage[] =
    "usage: shoal jobs [--state pending|starting|running|succeeded|failed|cancelled|active|finished]\n"
    "                  [--all] [--limit N] [--server URL] [--token T] [--json]\n"
    "\n"
    "Lists the newest jobs of every state (--all, the default); --state active only\n"
    "pending, starting and running ones, --state finished only ended ones (like\n"
    "sacct), each with its final cost and run time.  A pending job shows when it\n"
    "should start (from the scheduler's reservation plan) and why it waits.\n";

static long long integer(const json_t *o, const char *k) { return (long long)json_integer_value(json_object_get(o, k)); }

/* NODES: what runs now, not what was asked (an elastic job may hold fewer). */
static void nodes_cell(const json_t *j, const char *st, char *out, size_t n)
{
    long long max = integer(j, "nodes"), min = integer(j, "min_nodes");
    if (!strcmp(st, "running") || !strcmp(st, "starting")) snprintf(out, n, "%lld", integer(j, "replicas"));
    else if (min && min != max) snprintf(out, n, "%lld-%lld", min, max);
    else snprintf(out, n, "%lld", max);
}

/* START / END: when a pending job should start; when a running one is
 * planned to end (the start estimates of the queue follow from it). */
static void when_cell(const json_t *j, const char *st, double now, char *out, size_t n)
{
    char d[32];
    *out = 0;
    if (!strcmp(st, "pending")) {
        json_t *est = json_object_get(j, "start_estimate");
        if (!json_is_number(est)) snprintf(out, n, "unknown: ");
        else if (json_number_value(est) <= now + 1) snprintf(out, n, "next cycle: ");
        else snprintf(out, n, "in %s: ", cli_fmt_dur(json_number_value(est) - now, d, sizeof d));
    }
    json_t *end = json_object_get(j, "expected_end");
    if (json_is_number(end) && json_number_value(end) > now + 1)
        snprintf(out, n, "ends in %s", cli_fmt_dur(json_number_value(end) - now, d, sizeof d));
    else if (json_is_number(end)) snprintf(out, n, "ends now (past its estimate)");
}

static void print_table(const json_t *reply)
{
    /* GPU/N: GPUs per node (a job of 4 nodes of 8 holds 32). */
    printf("%-6s %-20s %-10s %-8s %-10s %5s %5s %7s %8s %10s %8s  %s\n", "ID", "NAME", "TENANT", "KIND", "STATE",
           "NODES", "GPU/N", "ATTEMPT", "AGE", "COST", "RUN", "START / END / WHY");
    size_t i;
    json_t *j;
    double now = sh_now_wall();
    json_array_foreach(json_object_get(reply, "jobs"), i, j) {
        char age[32], run[32], nodes[32], start[48];
        const char *st = json_string_value(json_object_get(j, "state"));
        nodes_cell(j, st, nodes, sizeof nodes);
        when_cell(j, st, now, start, sizeof start);
        const char *why = json_string_value(json_object_get(j, "pending_reason"));
        if (!why) why = json_string_value(json_object_get(j, "reason"));
        double rs = json_real_value(json_object_get(j, "run_s"));
        printf("%-6lld %-20.20s %-10.10s %-8s %-10s %5s %5lld %3lld/%-3lld %8s %10.4f %8s  %s%s\n", integer(j, "id"),
               json_string_value(json_object_get(j, "name")), json_string_value(json_object_get(j, "tenant")),
               json_string_value(json_object_get(j, "kind")), st, nodes, integer(j, "gpus_per_node"),
               integer(j, "attempt"), integer(j, "max_attempts"),
               cli_fmt_dur(now - json_real_value(json_object_get(j, "submitted_at")), age, sizeof age),
               json_real_value(json_object_get(j, "cost")), rs > 0 ? cli_fmt_dur(rs, run, sizeof run) : "-", start,
               why ? why : "");
    }
}

int cli_cmd_jobs(int argc, char **argv)
{
    static const struct option opts[] = {{"state", required_argument, 0, 's'},
                                         {"all", no_argument, 0, 'a'},
                                         {"limit", required_argument, 0, 'l'},
                                         {0}};
    static const char *const states[] = {"pending", "starting", "running", "succeeded", "failed",
                                         "cancelled", "active", "finished", NULL};
    cli_ctl x;
    cli_ctl_defaults(&x, "jobs");
    cli_args a = {"jobs", usage, opts, &x};
    char path[256];
    const char *state = NULL, *limit = "100";
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        if (c == 's') state = optarg;
        else if (c == 'a') state = NULL;
        else if (c == 'l') limit = optarg;
        else return a.rc;
    }
    if (optind < argc) return cli_usage("jobs", "unexpected argument \"%s\"", argv[optind]);
    if (state && cli_pick("jobs", "--state", state, states) < 0) return CLI_USAGE;
    int64_t lim;
    if (sh_parse_i64(limit, &lim, "--limit") < 0 || lim < 1)
        return cli_usage("jobs", "--limit: expected a count >= 1, got \"%s\"", limit);
    int rc = cli_ctl_connect(&x);
    if (rc) return rc;
    snprintf(path, sizeof path, "/v1/jobs?limit=%lld%s%s", (long long)lim, state ? "&state=" : "", state ? state : "");
    json_t *reply;
    rc = cli_ctl_call(&x, "GET", path, NULL, NULL, &reply);
    cli_ctl_free(&x);
    if (rc) return rc;
    if (x.json) sh_json_print(reply);
    else print_table(reply);
    json_decref(reply);
    return 0;
}
