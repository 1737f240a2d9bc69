/* `make run` fails fast and loud: scripts/run-main.sh with a speed table
 * that lacks the L4 (every L4 rollout worker then exits at start) must stop
 * within seconds, print the job's reason and the failed rank's last log
 * lines, exit 1 and leave no process of the run behind. */
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void test_broken_job_stops_the_run(void **state)
{
    /* Ranks see a private /tmp, so the run directory lies elsewhere. */
    char run[128], speeds[160];
    snprintf(run, sizeof run, "/var/tmp/shoal-test-run-main.%d", (int)getpid());
    snprintf(speeds, sizeof speeds, "%s.speeds.csv", run);
    const char *sp = "gpu_type,speed\nH100,1\nA100,0.7\nL40S,0.55\n";
    tu_write_file(speeds, sp, strlen(sp));
    char *out;
    double t0 = sh_now_mono();
    int rc = tu_run(&out, "SHOAL_BIN=%s SHOAL_RUN_DIR=%s SHOAL_RUN_SPEEDS=%s SHOAL_RUN_PORT=0 SHOAL_RUN_FLEET_COST=0 "
                          "sh scripts/run-main.sh 2>&1", tu_shoal(), run, speeds);
    double took = sh_now_mono() - t0;
    printf("%s(%.1f s)\n", out, took);
    assert_int_equal(rc, 1);
    if (!strstr(out, "(rl-rollouts) failed: rank") || !strstr(out, "GPU type L4 has no speed in the speed table") ||
        !strstr(out, "run-main: stopping everything"))
        fail_msg("run-main did not say which job failed and why:\n%s", out);
    if (took > 240) fail_msg("run-main took %.0f s to notice", took);
    free(out);
    /* Nothing of the run is left: no process names its directory. */
    char *ps;
    sh_sleep(0.5);
    tu_run(&ps, "pgrep -af %s | grep -v pgrep || true", run);
    if (strstr(ps, run)) fail_msg("left running:\n%s", ps);
    free(ps);
    tu_run(NULL, "rm -rf %s %s", run, speeds);
}

/* A second `make run` (its port held) says so at once and leaves the
 * first one's folder alone. */
static void test_port_in_use(void **state)
{
    int port;
    int lfd = tu_hold_port(&port);
    char run[128], mark[160];
    snprintf(run, sizeof run, "/var/tmp/shoal-test-run-main-port.%d", (int)getpid());
    snprintf(mark, sizeof mark, "%s/the-other-run", run);
    sh_mkdir_p(run, 0755);
    tu_write_file(mark, "x", 1);
    char *out;
    int rc = tu_run(&out, "SHOAL_BIN=%s SHOAL_RUN_DIR=%s SHOAL_RUN_PORT=%d sh scripts/run-main.sh 2>&1", tu_shoal(), run,
                    port);
    close(lfd);
    assert_int_equal(rc, 1);
    char want[64];
    snprintf(want, sizeof want, "run-main: port %d is in use", port);
    if (!strstr(out, want) || !strstr(out, "SHOAL_RUN_PORT=P")) fail_msg("run-main with its port held:\n%s", out);
    assert_true(sh_path_exists(mark));
    free(out);
    tu_run(NULL, "rm -rf %s", run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_port_in_use),
                                       cmocka_unit_test(test_broken_job_stops_the_run)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
