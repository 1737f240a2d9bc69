/* shoal rl report: live progress of a main job, then its report.
 *
 * Options and what is printed: the watching (events.jsonl, costs.jsonl) is
 * src/app/mainjob/run/watch.c's, the report (report.html, summary.json)
 * src/app/mainjob/report/report.c's. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "cli_rl_int.h"
#include "ctl_int.h"
#include "app/mainjob/mainjob.h"

static const char usage[] =
    "usage: shoal rl report --dir RUN [--watch [--timeout S]] [--quiet] [--json] [--server URL] [--token T]\n"
    "With --watch, prints one line per training step (reward, staleness, delta vs\n"
    "full bytes, cost so far from the server's billing) until RUN/result.json\n"
    "appears; then writes RUN/report.html (reward against wall-clock time and\n"
    "against cost, cost by GPU type, what moved and the push tree, the fleet-cost\n"
    "table) and RUN/summary.json (docs/mainjob.md).  --json prints summary.json's\n"
    "object on stdout instead of the lines about what moved; --quiet prints nothing.\n";

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

static void say(void *arg, const char *line)
{
    (void)arg;
    printf("%s\n", line);
    fflush(stdout); /* a pipe or a file sees each line as it comes */
}

/* What moved, against its targets (docs/mainjob.md, "summary.json"). */
void cli_rl_print_moved(const json_t *m, const char *dir)
{
    const json_t *t = json_object_get(m, "targets");
    printf("what moved: %lld workers in %lld zones (%lld on the push tree); per version the trainer sent "
           "%.1f KiB for a %.1f KiB delta (target <= %.1f KiB: %s); %.2f copies crossed a zone "
           "(target <= %lld: %s); workers identical at the end: %s\n",
           (long long)json_integer_value(json_object_get(m, "workers")),
           (long long)json_integer_value(json_object_get(m, "zones")),
           (long long)json_integer_value(json_object_get(m, "workers_on_push_tree")),
           num(m, "trainer_bytes_sent_per_version_mean") / 1024, num(m, "delta_bytes_mean") / 1024,
           1.1 * (double)(json_integer_value(json_object_get(m, "zones")) + 1) * num(m, "delta_bytes_mean") / 1024,
           json_is_true(json_object_get(t, "trainer_bytes")) ? "met" : "MISSED",
           num(m, "cross_zone_copies_per_version_mean"), (long long)json_integer_value(json_object_get(m, "zones")),
           json_is_true(json_object_get(t, "cross_zone")) ? "met" : "MISSED",
           json_is_true(json_object_get(m, "workers_identical_at_end")) ? "yes" : "NO");
    printf("report: %s/report.html, summary: %s/summary.json\n", dir, dir);
}

int cli_rl_report(int argc, char **argv)
{
    static const struct option opts[] = {{"dir", required_argument, 0, 'd'}, {"watch", no_argument, 0, 'w'},
                                         {"timeout", required_argument, 0, 't'}, {"quiet", no_argument, 0, 'q'},
                                         {0}};
    cli_ctl x;
    cli_ctl_defaults(&x, "rl report");
    cli_args a = {"rl report", usage, opts, &x};
    const char *dir = NULL;
    int do_watch = 0, quiet = 0;
    double timeout_s = 900;
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;)
        if (k == 'd') dir = optarg;
        else if (k == 'w') do_watch = 1;
        else if (k == 'q') quiet = 1;
        else if (k != 't') return a.rc;
        else if (cli_real(a.cmd, "--timeout", optarg, 0, DBL_MAX, "seconds >= 0", &timeout_s)) return CLI_USAGE;
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    if (!dir) return cli_usage(a.cmd, "--dir RUN is required");
    if (!sh_is_dir(dir))
        return cli_fail("rl report", sh_err(SH_ENOENT, "%s is not a folder: give a main job's run folder (`make run` "
                                                      "writes build/mainrun)", dir));
    int rc = cli_ctl_connect(&x);
    if (rc) return rc;
    mj_watch w = {dir, x.c, say, NULL};
    if (do_watch) rc = mj_watch_run(&w, timeout_s);
    cli_ctl_free(&x);
    if (rc < 0) return cli_fail("rl report", rc);
    json_t *sum = NULL;
    rc = mj_report_write(dir, &sum);
    if (rc < 0) return cli_fail("rl report", rc);
    if (x.json && !quiet) sh_json_print(sum);
    else if (!quiet) cli_rl_print_moved(sum, dir);
    json_decref(sum);
    return 0;
}
