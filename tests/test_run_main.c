/* `shoal run` (what `make run` calls), the main job in C: a short run
 * succeeds with the push root as a job of the control plane and leaves a
 * report; a broken job stops it fast and loud; a second run on a held port
 * says so and leaves the first one's folder alone.  Run folders lie in
 * /var/tmp: ranks see a private /tmp. */
#include "testutil.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Nothing of a run is left: no process names its folder. */
static void nothing_left(const char *run)
{
    char *ps;
    sh_sleep(0.5);
    tu_run(&ps, "pgrep -af %s | grep -v pgrep || true", run);
    if (strstr(ps, run)) fail_msg("left running:\n%s", ps);
    free(ps);
}

/* Three steps, no fleet-cost experiment: the trainer, the rollouts and the
 * push root run as jobs, every worker takes its weights from the push
 * tree, and the report and summary are written. */
static void test_short_run(void **state)
{
    (void)state;
    char run[128];
    snprintf(run, sizeof run, "/var/tmp/shoal-test-run-ok.%d", (int)getpid());
    char *out;
    /* The ASan build's ranks run unsandboxed: LeakSanitizer cannot run
     * where ptrace is refused, and a rank's leak then fails the run. */
    int rc = tu_run(&out, "SHOAL_BIN=%s %s run --dir %s --port 0 --steps 3 --no-fleet-cost --json %s 2>&1 >%s.json",
                    tu_shoal(), tu_shoal(), run, strstr(tu_shoal(), "/asan/") ? "--sandbox none" : "", run);
    printf("%s", out);
    free(out);
    assert_int_equal(rc, 0);
    char p[256];
    snprintf(p, sizeof p, "%s.json", run);
    json_t *sum = NULL;
    TU_OK(sh_json_load_file(p, 1 << 20, &sum));
    assert_int_equal(json_integer_value(json_object_get(sum, "versions")) >= 3, 1);
    assert_true(json_integer_value(json_object_get(sum, "workers_on_push_tree")) >= 1);
    assert_true(json_is_true(json_object_get(sum, "workers_identical_at_end")));
    json_decref(sum);
    unlink(p);
    /* The push root was a job of the control plane, and said where it is. */
    json_t *jobs = NULL, *root = NULL;
    snprintf(p, sizeof p, "%s/jobs.json", run);
    TU_OK(sh_json_load_file(p, 1 << 22, &jobs));
    char *text = json_dumps(jobs, JSON_COMPACT);
    assert_non_null(strstr(text, "\"rl-push-root\""));
    assert_non_null(strstr(text, "\"rl-trainer\""));
    free(text);
    json_decref(jobs);
    /* The jobs name one run, whose secret the server gave their ranks (the
     * trainer took workers on the push tree above, so they shared it): no
     * job file holds a secret. */
    const char *names[] = {"rl-trainer", "rl-rollouts", "rl-push-root"};
    for (int i = 0; i < 3; i++) {
        json_t *job = NULL;
        snprintf(p, sizeof p, "%s/%s.json", run, names[i]);
        TU_OK(sh_json_load_file(p, 1 << 20, &job));
        assert_string_equal(json_string_value(json_object_get(job, "run")), "main");
        text = json_dumps(job, JSON_COMPACT);
        assert_null(strstr(text, "SECRET"));
        free(text);
        json_decref(job);
    }
    snprintf(p, sizeof p, "%s/push/root.json", run);
    TU_OK(sh_json_load_file(p, 1 << 20, &root));
    assert_non_null(json_string_value(json_object_get(root, "zone")));
    json_decref(root);
    snprintf(p, sizeof p, "%s/report.html", run);
    assert_true(sh_path_exists(p));
    snprintf(p, sizeof p, "%s/costs.jsonl", run);
    assert_true(sh_path_exists(p));
    nothing_left(run);
    tu_run(NULL, "rm -rf %s", run);
}

/* A rank that dies stops the run at once: a rank of the trainer is
 * killed once the trainer has announced itself; the run says which job failed and why,
 * exits 1 and leaves nothing running. */
static void test_broken_job_stops_the_run(void **state)
{
    (void)state;
    char run[128], log[160], tj[200];
    snprintf(run, sizeof run, "/var/tmp/shoal-test-run-main.%d", (int)getpid());
    snprintf(log, sizeof log, "%s.log", run);
    snprintf(tj, sizeof tj, "%s/store/trainer.json", run);
    double t0 = sh_now_mono();
    TU_OK(tu_run(NULL, "SHOAL_BIN=%s SHOAL_RUN_DIR=%s SHOAL_RUN_PORT=0 SHOAL_RUN_FLEET_COST=0 SHOAL_RUN_STEPS=200 "
                       "%s run >%s 2>&1 & echo $! >%s.pid", tu_shoal(), run, tu_shoal(), log, run));
    /* Once the trainer announced itself, one of its ranks (a shoal-core
     * whose command line names this run's store) is killed. */
    char *pids = NULL;
    while (sh_now_mono() - t0 < 240) {
        if (sh_path_exists(tj)) {
            tu_run(&pids, "for p in $(pgrep -f 'rl trainer --store %s/store'); do "
                          "[ \"$(cat /proc/$p/comm 2>/dev/null)\" = shoal-core ] && echo $p; done | head -n 1", run);
            if (atol(pids) > 1) break;
            free(pids), pids = NULL;
        }
        sh_sleep(0.2);
    }
    assert_non_null(pids);
    assert_int_equal(kill((pid_t)atol(pids), SIGKILL), 0);
    free(pids);
    /* The run ends by itself; its output says why. */
    char pidf[160];
    snprintf(pidf, sizeof pidf, "%s.pid", run);
    size_t n = 0;
    char *ps = (char *)tu_read_file(pidf, &n);
    long runpid = atol(ps);
    free(ps);
    while (kill((pid_t)runpid, 0) == 0 && sh_now_mono() - t0 < 240) sh_sleep(0.2);
    if (kill((pid_t)runpid, 0) == 0) {
        kill((pid_t)runpid, SIGTERM); /* it stops everything it started */
        fail_msg("shoal run still runs %.0f s after its trainer's rank died", sh_now_mono() - t0);
    }
    char *out = (char *)tu_read_file(log, &n);
    out = realloc(out, n + 1), out[n] = 0;
    printf("%s(%.1f s)\n", out, sh_now_mono() - t0);
    /* Either job may be the first to fail: the trainer's gang (its rank
     * killed), or the rollouts, whose workers exit once their trainer hangs
     * up (the server gives a gang's ranks a moment to end before it fails
     * the job, to name the first that failed). */
    int trainer = strstr(out, "(rl-trainer) failed: ") && strstr(out, "last lines of job 1 rank ");
    int rollouts = strstr(out, "(rl-rollouts) failed: ") && strstr(out, "the trainer hung up");
    if (!(trainer || rollouts) || !strstr(out, "stopping everything") || !strstr(out, "shoal run: "))
        fail_msg("shoal run did not say which job failed and why:\n%s", out);
    free(out);
    nothing_left(run);
    tu_run(NULL, "rm -rf %s %s %s", run, log, pidf);
}

/* A speed table without one of the fleet's GPU types is refused before
 * anything starts, naming the type. */
static void test_speeds_checked_first(void **state)
{
    (void)state;
    char run[128], speeds[160];
    snprintf(run, sizeof run, "/var/tmp/shoal-test-run-speeds.%d", (int)getpid());
    snprintf(speeds, sizeof speeds, "%s.speeds.csv", run);
    const char *sp = "gpu_type,speed\nH100,1\nA100,0.7\nL40S,0.55\n";
    tu_write_file(speeds, sp, strlen(sp));
    char *out;
    int rc = tu_run(&out, "SHOAL_BIN=%s %s run --dir %s --speeds %s --port 0 2>&1", tu_shoal(), tu_shoal(), run,
                    speeds);
    assert_int_equal(rc, 1);
    if (!strstr(out, "L4")) fail_msg("shoal run with no L4 speed:\n%s", out);
    assert_false(sh_path_exists(run));
    free(out);
    unlink(speeds);
}

/* A second `make run` (its port held) says so at once and leaves the
 * first one's folder alone; so does a folder under /tmp. */
static void test_port_in_use(void **state)
{
    (void)state;
    int port;
    int lfd = tu_hold_port(&port);
    char run[128], mark[160];
    snprintf(run, sizeof run, "/var/tmp/shoal-test-run-main-port.%d", (int)getpid());
    snprintf(mark, sizeof mark, "%s/the-other-run", run);
    sh_mkdir_p(run, 0755);
    tu_write_file(mark, "x", 1);
    char *out;
    int rc = tu_run(&out, "SHOAL_BIN=%s %s run --dir %s --port %d 2>&1", tu_shoal(), tu_shoal(), run, port);
    close(lfd);
    assert_int_equal(rc, 1);
    char want[64];
    snprintf(want, sizeof want, "port %d is in use", port);
    if (!strstr(out, want) || !strstr(out, "--port P")) fail_msg("shoal run with its port held:\n%s", out);
    assert_true(sh_path_exists(mark));
    free(out);
    rc = tu_run(&out, "%s run --dir /tmp/shoal-run-here --port 0 2>&1", tu_shoal());
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "must be outside /tmp"));
    free(out);
    rc = tu_run(&out, "%s run --transport carrier-pigeon 2>&1", tu_shoal());
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "--transport"));
    free(out);
    tu_run(NULL, "rm -rf %s", run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_port_in_use), cmocka_unit_test(test_speeds_checked_first),
                                       cmocka_unit_test(test_short_run), cmocka_unit_test(test_broken_job_stops_the_run)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
