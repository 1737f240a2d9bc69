/* shoal rl report: live progress of a main job, then its report.
 *
 * --watch prints the trainer's events.jsonl as it grows and appends the
 * server's billing (GET /v1/costs) to costs.jsonl once a second; the report
 * itself (report.html, summary.json) is src/app/mainjob/report.c's. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "cli_rl_int.h"
#include "ctl_int.h"
#include "app/mainjob/mainjob_int.h"

static const char usage[] =
    "usage: shoal rl report --dir RUN [--watch [--timeout S]] [--quiet] [--json] [--server URL] [--token T]\n"
    "With --watch, prints one line per training step (reward, staleness, delta vs\n"
    "full bytes, cost so far from the server's billing) until RUN/result.json\n"
    "appears; then writes RUN/report.html (reward against wall-clock time and\n"
    "against cost, cost by GPU type, what moved and the push tree, the fleet-cost\n"
    "table) and RUN/summary.json (docs/mainjob.md).  --json prints summary.json's\n"
    "object on stdout instead of the lines about what moved; --quiet prints nothing.\n";

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

/* A JSON-lines file as an array (missing or unreadable: empty). */
static json_t *load_lines(const char *path)
{
    json_t *a = NULL;
    if (mj_run_lines(path, &a) < 0) return json_array();
    return a;
}

/* ---- watching ------------------------------------------------------------------ */

/* One billing sample: total and per GPU type, appended to costs.jsonl. */
static void sample_cost(cli_ctl *x, const char *dir, double *total)
{
    json_t *reply = NULL;
    int status = 0;
    if (srv_client_call(x->c, "GET", "/v1/costs", NULL, NULL, 5, &status, &reply) < 0 || !reply) return;
    json_t *by = json_object(), *ten, *types;
    const char *tn, *ty;
    json_object_foreach(json_object_get(reply, "by_tenant"), tn, ten) json_object_foreach(ten, ty, types) {
        double prev = json_number_value(json_object_get(by, ty));
        json_object_set_new(by, ty, json_real(prev + num(types, "dollars")));
    }
    *total = num(reply, "total_dollars");
    json_t *s = json_pack("{s:f,s:f,s:o}", "t", sh_now_wall(), "total", *total, "by_type", by);
    char p[4096], *line = json_dumps(s, JSON_COMPACT);
    snprintf(p, sizeof p, "%s/costs.jsonl", dir);
    FILE *f = fopen(p, "a");
    if (f && line) fprintf(f, "%s\n", line);
    if (f) fclose(f);
    free(line);
    json_decref(s), json_decref(reply);
}

static void print_step(const json_t *e, double cost)
{
    char d[32], f[32];
    json_t *h = json_object_get(e, "staleness");
    char st[64] = "";
    for (size_t i = 0, o = 0; i < json_array_size(h) && o < sizeof st - 12; i++)
        o += (size_t)snprintf(st + o, sizeof st - o, "%s%zu:%lld", i ? " " : "", i,
                              (long long)json_integer_value(json_array_get(h, i)));
    printf("step %3lld  v%-3lld reward %.3f  staleness [%s]  delta %s vs full %s  cost $%.4f\n",
           (long long)json_integer_value(json_object_get(e, "step")),
           (long long)json_integer_value(json_object_get(e, "version")), num(e, "reward"), st,
           sh_fmt_bytes(num(e, "delta_bytes"), d, sizeof d), sh_fmt_bytes(num(e, "image_bytes"), f, sizeof f), cost);
    fflush(stdout);
}

static int watch(cli_ctl *x, const char *dir, double timeout_s)
{
    char ev[4096], res[4096], tj[4096];
    snprintf(ev, sizeof ev, "%s/events.jsonl", dir);
    snprintf(res, sizeof res, "%s/result.json", dir);
    snprintf(tj, sizeof tj, "%s/store/trainer.json", dir);
    size_t seen = 0;
    double total = 0, deadline = sh_now_mono() + timeout_s;
    printf("waiting for the trainer gang and the rollout workers (warm start first)...\n");
    for (;;) {
        int done = sh_path_exists(res);
        sample_cost(x, dir, &total);
        json_t *evs = load_lines(ev);
        for (; seen < json_array_size(evs); seen++) {
            json_t *e = json_array_get(evs, seen);
            const char *k = json_string_value(json_object_get(e, "event")) ?: "";
            if (!strcmp(k, "step")) print_step(e, total);
            else printf("eval  step %3lld  held-out reward %.3f\n",
                        (long long)json_integer_value(json_object_get(e, "step")), num(e, "reward"));
        }
        json_decref(evs);
        fflush(stdout); /* a pipe or a file sees each line as it comes */
        if (done) return 0;
        json_t *t = NULL;
        if (sh_path_exists(tj) && sh_json_load_file(tj, 1 << 20, &t) == 0) {
            const char *st = json_string_value(json_object_get(t, "state"));
            int failed = st && !strcmp(st, "failed");
            json_decref(t);
            if (failed) return sh_err(SH_EIO, "the trainer failed: see `shoal logs 1` and %s", dir);
        }
        if (sh_now_mono() > deadline)
            return sh_err(SH_ETIMEDOUT, "no result in %s after %.0f s: see `shoal jobs` and `shoal logs`", dir, timeout_s);
        sh_sleep(1.0);
    }
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
    if (do_watch) rc = watch(&x, dir, timeout_s);
    cli_ctl_free(&x);
    if (rc < 0) return cli_fail("rl report", rc);
    json_t *sum = NULL;
    rc = mj_report_write(dir, &sum);
    if (rc < 0) return cli_fail("rl report", rc);
    if (x.json && !quiet) sh_json_print(sum);
    else if (!quiet) {
        const json_t *m = sum, *t = json_object_get(m, "targets");
        printf("what moved: %lld workers in %lld zones (%lld on the push tree); per version the trainer sent "
               "%.1f KiB for a %.1f KiB delta (target <= %.1f KiB: %s); %.2f copies crossed a zone "
               "(target <= %lld: %s); workers identical at the end: %s\n",
               (long long)json_integer_value(json_object_get(m, "workers")),
               (long long)json_integer_value(json_object_get(m, "zones")),
               (long long)json_integer_value(json_object_get(m, "workers_on_push_tree")),
               num(m, "trainer_bytes_sent_per_version_mean") / 1024, num(m, "delta_bytes_mean") / 1024,
               1.1 * (double)(json_integer_value(json_object_get(m, "zones")) + 1) * num(m, "delta_bytes_mean") / 1024,
               json_is_true(json_object_get(t, "trainer_bytes")) ? "met" : "MISSED",
               num(m, "cross_zone_copies_per_version_mean"),
               (long long)json_integer_value(json_object_get(m, "zones")),
               json_is_true(json_object_get(t, "cross_zone")) ? "met" : "MISSED",
               json_is_true(json_object_get(m, "workers_identical_at_end")) ? "yes" : "NO");
        printf("report: %s/report.html, summary: %s/summary.json\n", dir, dir);
    }
    json_decref(sum);
    return 0;
}
