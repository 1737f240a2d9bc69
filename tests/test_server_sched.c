/* The scheduler as the server shows it, against a real `shoal server` and
 * agents on loopback: every pending job carries the core's wait reason and
 * a start estimate (API, `shoal jobs`, `shoal job`), and a finished job
 * keeps its final cost and run time (`shoal jobs --state finished`). */
#include "fleet_util.h"

#include <math.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static tf_fleet F;

static int teardown(void **state)
{
    tf_stop(&F);
    tf_kill_all();
    return 0;
}

static json_t *get_job(int64_t id)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    int st;
    json_t *j = tf_call(&F, TF_ALICE, "GET", path, NULL, &st);
    assert_int_equal(st, 200);
    return j;
}

static void test_pending_reason_and_final_cost(void **state)
{
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "sched-1", 30);
    tf_start_agents(&F, 2, "H100", 8, "z1", "ib");
    /* Both nodes busy for an estimated 600 s; the second gang must wait. */
    int64_t run = tf_submit(&F, TF_ALICE,
                            "{\"name\":\"holder\",\"nodes\":2,\"gpus_per_node\":8,\"est_s\":600,"
                            "\"command\":[\"sleep\",\"60\"]}");
    json_decref(tf_wait_job(&F, run, "running", 20));
    int64_t wait = tf_submit(&F, TF_ALICE,
                             "{\"name\":\"waiter\",\"nodes\":2,\"gpus_per_node\":8,\"est_s\":60,"
                             "\"command\":[\"true\"]}");
    json_t *j = NULL;
    /* The reason appears once a cycle has seen the job (the reservation). */
    for (double t0 = sh_now_mono(); sh_now_mono() - t0 < 10;) {
        json_decref(j);
        j = get_job(wait);
        const char *w = json_string_value(json_object_get(j, "wait"));
        if (w && !strcmp(w, "reserved")) break;
        usleep(100 * 1000);
    }
    assert_string_equal(json_string_value(json_object_get(j, "state")), "pending");
    assert_string_equal(json_string_value(json_object_get(j, "wait")), "reserved");
    assert_non_null(strstr(json_string_value(json_object_get(j, "pending_reason")), "reservation of 2 nodes in z1/ib/H100"));
    /* The holder started moments ago with a 600 s estimate. */
    double est = json_real_value(json_object_get(j, "start_estimate")), now = sh_now_wall();
    if (!(est > now + 500 && est < now + 601)) fail_msg("start estimate %.1f s from now, expected ~600", est - now);
    json_decref(j);

    char *out = NULL;
    assert_int_equal(tu_run(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s jobs --state pending", F.url, TF_ALICE, tu_shoal()), 0);
    assert_non_null(strstr(out, "waiter"));
    assert_non_null(strstr(out, "holds a reservation"));
    assert_null(strstr(out, "holder"));
    free(out);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "job %lld", (long long)wait);
    assert_int_equal(tu_run(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s %s", F.url, TF_ALICE, tu_shoal(), cmd), 0);
    assert_non_null(strstr(out, "waiting   holds a reservation"));
    assert_non_null(strstr(out, "starts    "));
    free(out);

    /* Cancel the holder: the waiter runs, and the holder keeps its bill. */
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)run);
    int st;
    json_decref(tf_call(&F, TF_ALICE, "POST", path, "{}", &st));
    assert_int_equal(st, 200);
    json_decref(tf_wait_job(&F, wait, "succeeded", 30));
    j = get_job(run);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "cancelled");
    assert_true(json_is_true(json_object_get(j, "cost_final")));
    double cost = json_real_value(json_object_get(j, "cost")), ran = json_real_value(json_object_get(j, "run_s"));
    assert_true(ran > 0);
    assert_true(cost > 0);
    assert_null(json_object_get(j, "wait"));
    json_decref(j);
    assert_int_equal(tu_run(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s jobs --state finished", F.url, TF_ALICE, tu_shoal()), 0);
    assert_non_null(strstr(out, "holder"));
    assert_non_null(strstr(out, "waiter"));
    free(out);
    snprintf(cmd, sizeof cmd, "job %lld", (long long)run);
    assert_int_equal(tu_run(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s %s", F.url, TF_ALICE, tu_shoal(), cmd), 0);
    assert_non_null(strstr(out, "final, ran"));
    assert_null(strstr(out, "so far"));
    free(out);
}

/* A gang too large for the nodes that are up says so, with no estimate. */
static void test_never_fits_while_down(void **state)
{
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "sched-2", 2);
    tf_start_agents(&F, 2, "H100", 8, "z1", "ib");
    kill(F.agents[1], SIGKILL);
    waitpid(F.agents[1], NULL, 0);
    F.agents[1] = 0;
    tf_wait_alive(&F, 1, 10);
    int64_t id = tf_submit(&F, TF_ALICE, "{\"name\":\"pair\",\"nodes\":2,\"gpus_per_node\":8,\"command\":[\"true\"]}");
    json_t *j = NULL;
    for (double t0 = sh_now_mono(); sh_now_mono() - t0 < 10;) {
        json_decref(j);
        j = get_job(id);
        if (json_object_get(j, "wait")) break;
        usleep(100 * 1000);
    }
    assert_string_equal(json_string_value(json_object_get(j, "wait")), "nodes_down");
    assert_non_null(strstr(json_string_value(json_object_get(j, "pending_reason")), "never fits while nodes are down"));
    assert_true(json_is_null(json_object_get(j, "start_estimate")));
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_pending_reason_and_final_cost, teardown),
        cmocka_unit_test_teardown(test_never_fits_while_down, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
