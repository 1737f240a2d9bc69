/* The dashboard in real headless Chromium (tests/browser/dashboard.mjs)
 * against a real fleet: nodes by zone and pool with their heartbeat ages, a
 * dead node, a running gang, the queue, costs, a job appearing without a
 * reload, a job's detail view with its events and log tail, and the page at
 * 800 px.  The screenshots (dashboard.png, dashboard-job.png,
 * dashboard-800.png) go to build/shots; SHOAL_SHOTS=docs refreshes the
 * ones the README shows. */
#include "fleet_util.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_dashboard_in_chromium(void **state)
{
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* a browser run adds nothing under ASan; the server's API tests run there */
#endif
    if (access("/usr/bin/chromium", X_OK) || access("tests/browser/node_modules/playwright-core/package.json", R_OK) ||
        tu_run(NULL, "node --version") != 0) {
        fprintf(stderr, "skipping: needs chromium, node and `npm ci` in tests/browser (scripts/deps.sh)\n");
        skip();
    }
    char web[4096];
    if (!realpath("web", web)) fail_msg("web/ not found from %s", getcwd(NULL, 0));
    tf_fleet f = {0};
    snprintf(f.extra, sizeof f.extra, "--web %s", web);
    tf_start_server(&f, "dash", 3.0);
    tf_start_agent(&f, 0, "H100", 8, "us-east-1a", "ib-a");
    tf_start_agent(&f, 1, "H100", 8, "us-east-1a", "ib-a");
    tf_start_agent(&f, 2, "A100", 8, "us-east-1b", "ib-b");
    tf_start_agent(&f, 3, "L4", 4, "us-west-2a", "eth");
    int64_t gang = tf_submit(&f, TF_ALICE,
                             "{\"name\":\"train-7b\",\"nodes\":2,\"gpus_per_node\":8,\"gpu_types\":[\"H100\"],"
                             "\"command\":[\"sh\",\"-c\",\"echo hello from rank $SHOAL_RANK; sleep 60\"]}");
    json_decref(tf_wait_job(&f, gang, "running", 20));
    int64_t queued = tf_submit(&f, TF_ALICE,
                               "{\"name\":\"eval\",\"nodes\":2,\"gpus_per_node\":8,\"gpu_types\":[\"H100\"],"
                               "\"command\":[\"sleep\",\"60\"]}");
    tf_submit(&f, TF_BOB, "{\"name\":\"bob-fn\",\"kind\":\"function\",\"gpu_types\":[\"A100\"],\"command\":[\"sleep\",\"60\"]}");
    kill(f.agents[3], SIGKILL);
    waitpid(f.agents[3], NULL, 0);
    f.agents[3] = 0;
    tf_wait_alive(&f, 3, 10);
    const char *expect = tu_path("expect.json");
    char e[1024];
    int n = snprintf(e, sizeof e,
                     "{\"nodes\":[\"n0\",\"n1\",\"n2\",\"n3\"],\"dead\":[\"n3\"],\"zones\":[\"us-east-1a\",\"us-east-1b\","
                     "\"us-west-2a\"],\"running\":{\"id\":%lld,\"name\":\"train-7b\",\"gpus\":16,\"log\":\"hello from rank 0\"},\"queued\":%lld,"
                     "\"tenant\":\"alice\",\"gpu_type\":\"H100\",\"submit\":{\"name\":\"live\",\"kind\":\"function\","
                     "\"gpu_types\":[\"A100\"],\"command\":[\"sleep\",\"30\"]}}",
                     (long long)gang, (long long)queued);
    tu_write_file(expect, e, (size_t)n);
    char *out = NULL;
    const char *shots = getenv("SHOAL_SHOTS") && *getenv("SHOAL_SHOTS") ? getenv("SHOAL_SHOTS") : "build/shots";
    assert_int_equal(sh_mkdir_p(shots, 0755), 0);
    int rc = tu_run(&out, "node tests/browser/dashboard.mjs %s %s %s %s", f.url, TF_ALICE, shots, expect);
    if (rc != 0) fail_msg("dashboard check (exit %d):\n%s", rc, out);
    assert_non_null(strstr(out, "dashboard ok"));
    free(out);
    /* Bob's view of the same fleet shows alice's GPUs busy but not her jobs. */
    int st;
    json_t *j = tf_call(&f, TF_BOB, "GET", "/v1/overview", NULL, &st);
    char *text = json_dumps(j, 0);
    assert_null(strstr(text, "train-7b"));
    free(text);
    json_decref(j);
    tf_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_dashboard_in_chromium, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
