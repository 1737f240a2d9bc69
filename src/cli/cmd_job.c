/* shoal job: one job in detail, with its ranks and events. */
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_job[] = "show one job: state, ranks, placement, events [--json]";

static const char usage[] = "usage: shoal job ID [--server URL] [--token T] [--json]\n";

static const char *str(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }
static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

/* Its name, state, times and why it waits or ended. */
static void print_head(int64_t id, const json_t *j)
{
    char t1[32], t2[32], t3[32];
    printf("job %lld  %s  (%s, tenant %s)\nstate     %s  attempt %lld/%lld  on_failure %s\n", (long long)id,
           str(j, "name"), str(j, "kind"), str(j, "tenant"), str(j, "state"),
           (long long)json_integer_value(json_object_get(j, "attempt")),
           (long long)json_integer_value(json_object_get(j, "max_attempts")), str(j, "on_failure"));
    printf("times     submitted %s  started %s  finished %s\n",
           cli_fmt_time(num(j, "submitted_at"), t1, sizeof t1), cli_fmt_time(num(j, "started_at"), t2, sizeof t2),
           cli_fmt_time(num(j, "finished_at"), t3, sizeof t3));
    const char *reason = str(j, "reason"), *why = str(j, "pending_reason");
    if (why) {
        json_t *est = json_object_get(j, "start_estimate");
        printf("waiting   %s (%s)\n", why, str(j, "wait"));
        if (json_is_number(est))
            printf("starts    %s (estimate: running work ends on time, reservations hold)\n",
                   cli_fmt_time(json_number_value(est), t1, sizeof t1));
        else printf("starts    unknown (no estimate while it cannot fit)\n");
    } else if (reason && *reason) printf("reason    %s\n", reason);
}

/* When it should end (the scheduler's plan), when it must (its time
 * limit), and what it cost. */
static void print_plan_and_cost(const json_t *j)
{
    char t1[32], t2[32];
    const json_t *spec = json_object_get(j, "spec");
    json_t *exp = json_object_get(j, "expected_end");
    if (json_is_number(exp)) {
        double e = json_number_value(exp), now = sh_now_wall();
        int has_est = json_is_number(json_object_get(spec, "est_s"));
        printf("planned   ends %s%s (%s; moved on while it runs past it)\n", e > now ? "about " : "now",
               e > now ? cli_fmt_time(e, t1, sizeof t1) : "",
               has_est ? "what the scheduler plans with: its est_s at its GPUs' speed"
                       : "no est_s: the scheduler plans it at the server's --default-est");
    }
    if (json_is_number(json_object_get(j, "ends_by")))
        printf("limit     ends by %s (est_s %g s, its time limit, plus the server's grace)\n",
               cli_fmt_time(num(j, "ends_by"), t1, sizeof t1), num(spec, "est_s"));
    int final = json_is_true(json_object_get(j, "cost_final"));
    double rs = num(j, "run_s");
    /* Placed ranks hold their GPUs, and are billed, before they run. */
    char ran[64] = "not started yet (billed from placement)";
    if (rs > 0 || final) snprintf(ran, sizeof ran, "ran %s", rs > 0 ? cli_fmt_dur(rs, t2, sizeof t2) : "0s");
    printf("cost      $%.4f %s, %s\n", num(j, "cost"), final ? "final" : "so far", ran);
}

static void print_ranks_and_events(const json_t *j, const json_t *ev)
{
    char t[32];
    size_t i;
    json_t *m;
    printf("\n%-5s %-16s %-9s %5s  %s\n", "RANK", "NODE", "STATE", "EXIT", "DISK");
    json_array_foreach(json_object_get(j, "members"), i, m) {
        json_int_t disk = json_integer_value(json_object_get(m, "disk_bytes"));
        printf("%-5lld %-16s %-9s %5lld  %s\n", (long long)json_integer_value(json_object_get(m, "rank")),
               str(m, "node"), str(m, "state"), (long long)json_integer_value(json_object_get(m, "exit_code")),
               disk > 0 ? sh_fmt_bytes((double)disk, t, sizeof t) : "-");
    }
    printf("\nevents\n");
    json_array_foreach(json_object_get(ev, "events"), i, m) {
        /* Most events name no node: their message starts in the same column. */
        const char *node = str(m, "node");
        printf("  %s  %-14s %s%s%s\n", cli_fmt_time(num(m, "t"), t, sizeof t), str(m, "kind"), node ? node : "",
               node && *node ? " " : "", str(m, "msg"));
    }
}

int cli_cmd_job(int argc, char **argv)
{
    cli_ctl x;
    cli_ctl_defaults(&x, "job");
    cli_args a = {"job", usage, NULL, &x};
    if (cli_getopt(&a, argc, argv) != -1) return a.rc;
    int64_t id;
    int rc = cli_ctl_job_id("job", argc, argv, &id);
    if (rc) return rc;
    rc = cli_ctl_connect(&x);
    if (rc) return rc;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    json_t *j, *ev = NULL;
    if ((rc = cli_ctl_call(&x, "GET", path, NULL, NULL, &j))) return cli_ctl_free(&x), rc;
    strcat(path, "/events");
    rc = cli_ctl_call(&x, "GET", path, NULL, NULL, &ev);
    cli_ctl_free(&x);
    if (rc) return json_decref(j), rc;
    if (x.json) {
        json_object_set(j, "events", json_object_get(ev, "events"));
        sh_json_print(j);
    } else {
        print_head(id, j);
        print_plan_and_cost(j);
        print_ranks_and_events(j, ev);
    }
    json_decref(j);
    json_decref(ev);
    return 0;
}
