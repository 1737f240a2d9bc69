/* The scheduler as the server shows it, against a real `shoal server` and
 * agents on loopback: every pending job carries the core's wait reason and
 * a start estimate (API, `shoal jobs`, `shoal job`), a finished job keeps
 * its final cost and run time (`shoal jobs --state finished`), and devices
 * and bills come from the core alone. */
#include "fleet_util.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
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

/* For a test that stops an agent: a stopped process would not take the
 * SIGTERM tf_stop sends. */
static int teardown_cont(void **state)
{
    for (int i = 0; i < F.nagents; i++)
        if (F.agents[i] > 0) kill(F.agents[i], SIGCONT);
    return teardown(state);
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

/* `shoal job ID`'s output (caller frees). */
static char *job_text(int64_t id)
{
    char *out = NULL, cmd[64];
    snprintf(cmd, sizeof cmd, "job %lld", (long long)id);
    assert_int_equal(tu_run(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s %s", F.url, TF_ALICE, tu_shoal(), cmd), 0);
    return out;
}

/* Cancels job id (alice's), then waits for job `then` to succeed. */
static void cancel_then(int64_t id, int64_t then)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)id);
    int st;
    json_decref(tf_call(&F, TF_ALICE, "POST", path, "{}", &st));
    assert_int_equal(st, 200);
    json_decref(tf_wait_job(&F, then, "succeeded", 30));
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
    out = job_text(wait);
    assert_non_null(strstr(out, "waiting   holds a reservation"));
    assert_non_null(strstr(out, "starts    "));
    free(out);

    /* Cancel the holder: the waiter runs, and the holder keeps its bill. */
    cancel_then(run, wait);
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
    out = job_text(run);
    assert_non_null(strstr(out, "final, ran"));
    assert_null(strstr(out, "so far"));
    free(out);
}

/* A job without est_s is planned at the server's --default-est (2 s here)
 * and not ended there.  Once it runs past that, the gang waiting behind
 * it is still told a start after now, and a real one: the holder is
 * expected 60 s past its estimate (docs/sched.md, "Work past its
 * estimate"), where the rule before said "now" at every cycle. */
static void test_overdue_estimate(void **state)
{
    memset(&F, 0, sizeof F);
    snprintf(F.extra, sizeof F.extra, "--default-est 2");
    tf_start_server(&F, "sched-over", 30);
    tf_start_agents(&F, 2, "H100", 8, "z1", "ib");
    int64_t run = tf_submit(&F, TF_ALICE,
                            "{\"name\":\"holder\",\"nodes\":2,\"gpus_per_node\":8,\"command\":[\"sleep\",\"60\"]}");
    json_decref(tf_wait_job(&F, run, "running", 20));
    double t_run = sh_now_mono();
    int64_t wait = tf_submit(&F, TF_ALICE,
                             "{\"name\":\"waiter\",\"nodes\":2,\"gpus_per_node\":8,\"est_s\":60,"
                             "\"command\":[\"true\"]}");
    /* From 3 s after the holder started (past its 2 s) for 3 s. */
    while (sh_now_mono() - t_run < 3) usleep(100 * 1000);
    int seen = 0;
    for (double t0 = sh_now_mono(); sh_now_mono() - t0 < 3; usleep(200 * 1000)) {
        double before = sh_now_wall();
        json_t *j = get_job(wait), *h = get_job(run);
        const char *w = json_string_value(json_object_get(j, "wait"));
        /* The holder's planned end is moved on too, and it is what the
         * waiter's estimate comes from. */
        double end = json_real_value(json_object_get(h, "expected_end"));
        if (!(end > before + 30 && end < before + 62))
            fail_msg("the holder past its estimate is expected to end %.1f s from now; want 30-62 s", end - before);
        if (w && !strcmp(w, "reserved")) {
            double est = json_real_value(json_object_get(j, "start_estimate"));
            if (!(est > before + 30 && est < before + 62))
                fail_msg("start estimate %.1f s from now behind a job past its estimate; want 30-62 s", est - before);
            if (fabs(est - end) > 1.5) fail_msg("the waiter starts %.1f s from the holder's planned end", est - end);
            seen++;
        }
        json_decref(j);
        json_decref(h);
    }
    if (seen < 5) fail_msg("the waiter held its reservation at %d of about 15 polls", seen);
    char *out = job_text(wait);
    assert_non_null(strstr(out, "waiting   holds a reservation"));
    free(out);
    out = job_text(run);
    if (!strstr(out, "planned   ends about ") || !strstr(out, "no est_s")) fail_msg("shoal job of the holder: %s", out);
    free(out);
    assert_int_equal(tu_run(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s jobs", F.url, TF_ALICE, tu_shoal()), 0);
    if (!strstr(out, "START / END / WHY") || !strstr(out, "ends in ")) fail_msg("shoal jobs: %s", out);
    free(out);
    json_t *j = get_job(wait);
    assert_null(json_object_get(j, "expected_end")); /* pending: a start estimate, no end */
    json_decref(j);
    cancel_then(run, wait);
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

static json_t *member_gpus(int64_t id)
{
    json_t *j = get_job(id);
    json_t *g = json_incref(json_object_get(json_array_get(json_object_get(j, "members"), 0), "gpus"));
    json_decref(j);
    assert_true(json_is_array(g) && json_array_size(g) == 1);
    return g;
}

/* The core chooses each member's devices and bills each place; the server
 * shows both, and after a killed server restarts, the running places keep
 * their devices and their bills run from the first placement. */
static void test_core_devices_and_bill(void **state)
{
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "sched-3", 30);
    tf_start_agents(&F, 1, "H100", 2, "z1", "ib");
    int64_t id[2];
    double seen[2];
    for (int i = 0; i < 2; i++) {
        char body[160];
        snprintf(body, sizeof body, "{\"name\":\"f%d\",\"kind\":\"function\",\"gpus\":1,"
                 "\"command\":[\"sleep\",\"4\"]}", i);
        id[i] = tf_submit(&F, TF_ALICE, body);
    }
    for (int i = 0; i < 2; i++) {
        json_decref(tf_wait_job(&F, id[i], "running", 20));
        seen[i] = sh_now_wall(); /* placed no later than this */
    }
    json_t *g0 = member_gpus(id[0]), *g1 = member_gpus(id[1]);
    json_int_t d0 = json_integer_value(json_array_get(g0, 0)), d1 = json_integer_value(json_array_get(g1, 0));
    assert_true(d0 != d1 && d0 + d1 == 1); /* devices 0 and 1, one each */
    int st;
    json_t *nodes = tf_call(&F, TF_ADMIN, "GET", "/v1/nodes", NULL, &st);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(nodes, "nodes"), 0), "gpus_used")), 2);
    json_decref(nodes);

    kill(F.server, SIGKILL);
    waitpid(F.server, NULL, 0);
    sh_sleep(1.5); /* a gap the bill must cover: the places were held */
    tf_restart_server(&F);
    json_t *a = member_gpus(id[0]);
    assert_true(json_equal(a, g0));
    json_decref(a);
    double sum_s = 0;
    for (int i = 0; i < 2; i++) {
        json_t *j = tf_wait_job(&F, id[i], "succeeded", 30);
        json_decref(j);
        j = get_job(id[i]);
        assert_true(json_is_true(json_object_get(j, "cost_final")));
        double secs = json_real_value(json_object_get(j, "cost")) * 3600 / 2.5; /* 1 GPU at $2.5/h */
        double end = json_real_value(json_object_get(j, "finished_at"));
        /* Billed by the second, each allocation rounded up ... */
        if (fabs(secs - round(secs)) > 1e-6) fail_msg("job %d billed %.6f s, not whole seconds", i, secs);
        /* ... from the first placement, across the restart. */
        if (secs < end - seen[i] - 1e-6)
            fail_msg("job %d billed %.0f s, but it held its GPU at least %.2f s", i, secs, end - seen[i]);
        if (secs > end - seen[i] + 30) fail_msg("job %d billed %.0f s, far past its run", i, secs);
        sum_s += secs;
        json_decref(j);
    }
    /* The tenant's costs are the same ledger rows. */
    json_t *c = tf_call(&F, TF_ALICE, "GET", "/v1/costs", NULL, &st);
    assert_int_equal(st, 200);
    json_t *h = json_object_get(json_object_get(json_object_get(c, "by_tenant"), "alice"), "H100");
    assert_true(fabs(json_real_value(json_object_get(h, "gpu_seconds")) - sum_s) < 1e-6);
    json_decref(c);
    json_decref(g0);
    json_decref(g1);
}

/* The scheduler thread's searches keep their scratch in the scheduler, which
 * the server frees when it stops: a server that made room for a gang
 * (placement of elastic replicas by price, a reservation, a preemption, the
 * shape probes of a gang that takes two GPU types) exits with nothing
 * leaked (was: per-thread buffers, lost at the thread's exit, ~640 bytes
 * here).  Only LeakSanitizer can tell, so only the ASan build runs it. */
static void test_stop_leaks_nothing(void **state)
{
#if !defined(__SANITIZE_ADDRESS__)
    skip(); /* the ASan build's server has LeakSanitizer */
#endif
    memset(&F, 0, sizeof F);
    snprintf(F.extra, sizeof F.extra, "--max-priority alice=5"); /* her gang preempts her elastic job */
    tf_start_server(&F, "sched-4", 30);
    tf_start_agents(&F, 1, "H100", 2, "z1", "ib");
    int64_t el = tf_submit(&F, TF_ALICE, "{\"name\":\"fill\",\"kind\":\"elastic\",\"nodes\":1,\"max_nodes\":2,"
                                         "\"gpus_per_node\":1,\"command\":[\"sleep\",\"60\"]}");
    json_decref(tf_wait_job(&F, el, "running", 20));
    int64_t g = tf_submit(&F, TF_ALICE, "{\"name\":\"urgent\",\"nodes\":1,\"gpus_per_node\":2,\"priority\":5,"
                                        "\"gpu_types\":[\"H100\",\"A100\"],\"command\":[\"sleep\",\"1\"]}");
    json_decref(tf_wait_job(&F, g, "succeeded", 30));
    for (int i = 0; i < F.nagents; i++) kill(F.agents[i], SIGTERM);
    for (int i = 0; i < F.nagents; i++) waitpid(F.agents[i], NULL, 0), F.agents[i] = 0;
    kill(F.server, SIGTERM);
    int st = -1;
    waitpid(F.server, &st, 0);
    F.server = 0;
    char out[4200];
    snprintf(out, sizeof out, "%s/server.out", F.dir);
    char *text = (char *)tu_read_file(out, NULL);
    int leaked = strstr(text, "LeakSanitizer") != NULL;
    if (leaked) print_message("%.6000s\n", text);
    free(text);
    if (leaked) fail_msg("the server leaked at its exit (its output is above)");
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Placed ranks hold their GPUs before they run: while a job's agent has
 * not started its rank (here it is stopped), the job is starting, its rank
 * counts in `replicas` (was 0: NODES 0 in `shoal jobs`) and is billed from
 * its placement, and `shoal job` says it has not started rather than "ran
 * 0s". */
static void test_starting_holds_and_bills(void **state)
{
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "sched-6", 30);
    tf_start_agents(&F, 1, "H100", 8, "z1", "ib");
    kill(F.agents[0], SIGSTOP);
    int64_t id = tf_submit(&F, TF_ALICE, "{\"name\":\"held\",\"nodes\":1,\"gpus_per_node\":8,"
                                         "\"command\":[\"sleep\",\"30\"]}");
    json_t *j = NULL;
    for (double t0 = sh_now_mono(); sh_now_mono() - t0 < 10;) {
        json_decref(j);
        j = get_job(id);
        if (!strcmp(json_string_value(json_object_get(j, "state")), "starting")) break;
        usleep(100 * 1000);
    }
    assert_string_equal(json_string_value(json_object_get(j, "state")), "starting");
    assert_int_equal(json_integer_value(json_object_get(j, "replicas")), 1);
    json_decref(j);
    sh_sleep(1.2);
    j = get_job(id);
    assert_true(json_real_value(json_object_get(j, "cost")) > 0);
    assert_true(json_real_value(json_object_get(j, "run_s")) == 0);
    json_decref(j);
    char *out;
    assert_int_equal(tu_run(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s job %lld", F.url, TF_ALICE, tu_shoal(), (long long)id), 0);
    assert_non_null(strstr(out, "not started yet (billed from placement)"));
    free(out);
    assert_int_equal(tu_run(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s jobs", F.url, TF_ALICE, tu_shoal()), 0);
    assert_non_null(strstr(out, "starting       1 "));
    free(out);
    kill(F.agents[0], SIGCONT);
}

/* A submit that can never fit takes no job id: its message names none, and
 * the next job gets the id after the last accepted one, so that no id is
 * named for a job that does not exist or reused after a restart. */
static void test_rejected_takes_no_id(void **state)
{
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "sched-7", 30);
    tf_start_agents(&F, 1, "H100", 8, "z1", "ib");
    int64_t a = tf_submit(&F, TF_ALICE, "{\"name\":\"a\",\"nodes\":1,\"command\":[\"true\"]}");
    int st;
    json_t *r = tf_call(&F, TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"big\",\"nodes\":3,\"command\":[\"true\"]}", &st);
    assert_int_equal(st, 422);
    const char *err = json_string_value(json_object_get(r, "error"));
    assert_non_null(strstr(err, "can never fit"));
    assert_null(strstr(err, "rejected"));
    assert_null(strstr(err, "job "));
    json_decref(r);
    int64_t b = tf_submit(&F, TF_ALICE, "{\"name\":\"b\",\"nodes\":1,\"command\":[\"true\"]}");
    assert_int_equal(b, a + 1);
    kill(F.server, SIGTERM);
    waitpid(F.server, NULL, 0);
    tf_restart_server(&F);
    int64_t c = tf_submit(&F, TF_ALICE, "{\"name\":\"c\",\"nodes\":1,\"command\":[\"true\"]}");
    assert_int_equal(c, b + 1);
}

/* One server per database: a second `shoal server` on it (another port)
 * would schedule the same nodes from the same state; it is refused, naming
 * the first one's pid, and the first one keeps serving. */
static void test_second_server_refused(void **state)
{
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "sched-8", 30);
    char *out;
    int rc = tu_run(&out, "timeout 10 %s server --db %s/state.db --tokens %s/tokens.json --port 0", tu_shoal(), F.dir, F.dir);
    assert_int_not_equal(rc, 0);
    char pid[32];
    snprintf(pid, sizeof pid, "(pid %ld)", (long)F.server);
    if (!strstr(out, "in use by another shoal server") || !strstr(out, pid)) fail_msg("second server said: %s", out);
    free(out);
    int st;
    json_t *j = tf_call(&F, NULL, "GET", "/healthz", NULL, &st);
    assert_int_equal(st, 200);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_pending_reason_and_final_cost, teardown),
        cmocka_unit_test_teardown(test_overdue_estimate, teardown),
        cmocka_unit_test_teardown(test_never_fits_while_down, teardown),
        cmocka_unit_test_teardown(test_starting_holds_and_bills, teardown_cont),
        cmocka_unit_test_teardown(test_rejected_takes_no_id, teardown),
        cmocka_unit_test_teardown(test_second_server_refused, teardown),
        cmocka_unit_test_teardown(test_core_devices_and_bill, teardown),
        cmocka_unit_test_teardown(test_stop_leaks_nothing, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
