/* The command line as scripts use it, against a real server and agents:
 * `submit --wait` and `logs -f` exit with the job's status, `logs --rank
 * all` prefixes every rank's lines, and a failed gang's reason names the
 * rank that failed first with its last lines. */
#include "fleet_util.h"

#include <stdlib.h>
#include <string.h>

static tf_fleet F;

static void expect(int status, const char *needle, const char *fmt, const char *arg)
{
    char args[4096], *out;
    snprintf(args, sizeof args, fmt, arg);
    int rc = tu_run(&out, "%s %s --server %s --token %s 2>&1", tu_shoal(), args, F.url, TF_ALICE);
    if (rc != status || !strstr(out, needle))
        fail_msg("shoal %s: exit %d (want %d), output lacks \"%s\":\n%s", args, rc, status, needle, out);
    free(out);
}

static void job_file(const char *name, const char *body)
{
    tu_write_file(tu_path(name), body, strlen(body));
}

static void test_scripts(void **state)
{
    (void)state;
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "scripts", 30);
    tf_start_agents(&F, 2, "H100", 1, "z1", "ib");
    /* Rank 0 raises first; rank 1 fails a moment later, as a peer of a
     * dead rank does. */
    job_file("fail.json", "{\"name\":\"boom\",\"nodes\":2,\"on_failure\":\"fail\",\"command\":[\"sh\",\"-c\","
                          "\"if [ $SHOAL_RANK = 0 ]; then echo r0-start; sleep 1; echo Traceback; "
                          "echo 'ValueError: boom-from-rank0'; exit 3; else echo r1-start; sleep 1.5; "
                          "echo 'Connection closed by peer'; exit 9; fi\"]}");
    job_file("ok.json", "{\"name\":\"fine\",\"nodes\":2,\"command\":[\"sh\",\"-c\","
                        "\"echo line-a-$SHOAL_RANK; printf no-newline-$SHOAL_RANK\"]}");
    char *out;
    int rc = tu_run(&out, "%s submit %s --wait --server %s --token %s 2>&1", tu_shoal(), tu_path("fail.json"), F.url,
                    TF_ALICE);
    if (rc != 3 || !strstr(out, "job 1 failed: rank 0 exited with status 3; its last lines: r0-start | Traceback | "
                                "ValueError: boom-from-rank0"))
        fail_msg("submit --wait of a failing gang: exit %d (want 3):\n%s", rc, out);
    free(out);
    json_t *j = tf_wait_job(&F, 1, "failed", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "exit_code")), 3);
    json_decref(j);
    /* logs -f of the ended job exits with its status too, the reason on stderr. */
    expect(3, "shoal logs: job 1 failed: rank 0 exited with status 3", "logs 1 -f", "");
    /* Without -f, printing the log is the command's whole work: 0. */
    expect(0, "r0-start", "logs 1", "");
    expect(0, "[rank 0] ValueError: boom-from-rank0\n", "logs 1 --rank all", "");
    expect(0, "[rank 1] r1-start\n", "logs 1 --rank=all", "");
    expect(0, "\"ranks\":[{\"rank\":0,", "logs 1 --rank all --json", "");
    expect(2, "--rank: expected a rank number or \"all\", got \"every\"", "logs 1 --rank every", "");
    expect(1, "no such job 99", "logs 99 --rank all", "");
    /* A job that succeeds: --wait and -f exit 0; lines without a newline at
     * the end get one under their prefix. */
    rc = tu_run(&out, "%s submit %s --wait --json --server %s --token %s", tu_shoal(), tu_path("ok.json"), F.url,
                TF_ALICE);
    if (rc != 0 || !strstr(out, "\"state\":\"succeeded\"")) fail_msg("submit --wait --json of a good gang: exit %d:\n%s", rc, out);
    free(out);
    expect(0, "[rank 1] no-newline-1\n", "logs 2 --rank all -f", "");
    expect(0, "[rank 0] line-a-0\n[rank 0] no-newline-0\n", "logs 2 --rank all", "");
    /* A refused submit is 1 and waits for nothing. */
    job_file("bad.json", "{\"name\":\"x\",\"nodes\":2}");
    expect(1, "missing field \"command\"", "submit %s --wait", tu_path("bad.json"));
    tf_stop(&F);
}

/* A cancelled job: logs -f started before the cancel ends with 1. */
static void test_follow_cancelled(void **state)
{
    (void)state;
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "follow", 30);
    tf_start_agents(&F, 1, "H100", 1, "z1", "ib");
    int64_t id = tf_submit(&F, TF_ALICE, "{\"name\":\"long\",\"kind\":\"function\",\"command\":[\"sh\",\"-c\","
                                         "\"echo started; sleep 60\"]}");
    json_decref(tf_wait_job(&F, id, "running", 20));
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "sleep 1; %s cancel %lld --server %s --token %s >/dev/null", tu_shoal(), (long long)id,
             F.url, TF_ALICE);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    tf_spawn(tu_path("cancel.out"), argv);
    expect(1, "job 1 cancelled: cancelled by alice", "logs 1 -f", "");
    tf_stop(&F);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_scripts, tf_teardown),
        cmocka_unit_test_teardown(test_follow_cancelled, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
