/* Properties of the server's tenancy that the generated mutants
 * (scripts/mutgen.py, docs/testing.md) found no test held, against a real
 * server on loopback (no agents: the jobs stay pending):
 *  - idempotency keys are per tenant: the same key from two tenants makes
 *    two jobs, a retry by either gets its own, also after a restart;
 *  - each condition of a "writable" folder on its own: a plain absolute
 *    path, outside the state directory, under a folder the admin allows
 *    the tenant, holding none given to another, and not another tenant's
 *    (a folder, one inside it or one above it); a sibling whose name only
 *    starts the same is not inside; the admin's jobs take no folder;
 *  - a node's report or output for a rank past a job's members is stale,
 *    never read as a member (no event, no log file), the real rank's is. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fleet_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Submits a pending job as token with `extra` fields; returns the status
 * and sets *id (0 when refused) and *dup. */
static int submit(tf_fleet *f, const char *token, const char *extra, int64_t *id, int *dup, char *err, size_t cap)
{
    char body[8192];
    snprintf(body, sizeof body, "{\"name\":\"p\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"]%s}", extra);
    int st;
    json_t *j = tf_call(f, token, "POST", "/v1/jobs", body, &st);
    *id = json_integer_value(json_object_get(j, "id"));
    if (dup) *dup = json_is_true(json_object_get(j, "duplicate"));
    if (err) snprintf(err, cap, "%s", json_string_value(json_object_get(j, "error")) ? json_string_value(json_object_get(j, "error")) : "");
    json_decref(j);
    return st;
}

/* A node that registers and never polls: jobs fit, and stay unfinished. */
static void fake_node(tf_fleet *f)
{
    int st;
    json_decref(tf_call(f, TF_AGENT, "POST", "/v1/agent/register", "{\"name\":\"idle\",\"gpu_type\":\"X\",\"gpus\":8}", &st));
    assert_int_equal(st, 200);
}

static void test_idempotency_per_tenant(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "idem", 10);
    fake_node(&f);
    const char *key = ",\"idempotency_key\":\"same-key\"";
    int64_t a, b, x;
    int dup;
    assert_int_equal(submit(&f, TF_ALICE, key, &a, &dup, NULL, 0), 201);
    assert_false(dup);
    assert_int_equal(submit(&f, TF_BOB, key, &b, &dup, NULL, 0), 201);
    assert_false(dup);
    assert_true(a > 0 && b > 0 && a != b);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(submit(&f, TF_ALICE, key, &x, &dup, NULL, 0), 200);
        assert_true(dup);
        assert_int_equal(x, a);
        assert_int_equal(submit(&f, TF_BOB, key, &x, &dup, NULL, 0), 200);
        assert_true(dup);
        assert_int_equal(x, b);
        /* The index lives in the database too: a restart keeps it per tenant. */
        if (round == 0) {
            kill(f.server, SIGKILL);
            waitpid(f.server, NULL, 0);
            tf_restart_server(&f);
        }
    }
    /* The admin's key is the admin's own. */
    assert_int_equal(submit(&f, TF_ADMIN, key, &x, &dup, NULL, 0), 201);
    assert_true(x != a && x != b);
    /* Each tenant sees its own job only. */
    char path[64];
    int st;
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)a);
    json_decref(tf_call(&f, TF_BOB, "GET", path, NULL, &st));
    assert_int_equal(st, 404);
    tf_stop(&f);
}

static void expect(tf_fleet *f, const char *token, const char *path, int want, const char *needle)
{
    char extra[4400], err[1024];
    int64_t id;
    snprintf(extra, sizeof extra, ",\"writable\":[\"%s\"]", path);
    int st = submit(f, token, extra, &id, NULL, err, sizeof err);
    if (st != want || (needle && !strstr(err, needle)))
        fail_msg("writable \"%s\" as %s: %d \"%s\", expected %d \"%s\"", path, token, st, err, want, needle ? needle : "");
}

static void test_writable_each_condition(void **state)
{
    char t[4096], wa[4200], wb[4200], p[4400];
    snprintf(t, sizeof t, "%s", tu_tmpdir());
    snprintf(wa, sizeof wa, "%s/wa", t);
    snprintf(wb, sizeof wb, "%s/wb", t);
    TU_OK(sh_mkdir_p(wa, 0755));
    TU_OK(sh_mkdir_p(wb, 0755));
    tf_fleet f = {0};
    snprintf(f.extra, sizeof f.extra, "--allow-writable alice=%s --allow-writable bob=%s", wa, wb);
    tf_start_server(&f, "wserver", 10);
    fake_node(&f);
    /* Not plain: each form alone. */
    const char *forms[] = {"%s/wa/x//y", "%s/wa/./x", "%s/wa/../wb", "%s/wa/x/", "%s/wa/x/.", "%s/wa/x/.."};
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, forms[i], t);
        expect(&f, TF_ALICE, p, 400, "is not a plain absolute path");
    }
    expect(&f, TF_ALICE, "wa/x", 400, "absolute path");
    /* The state directory, and what lies in it. */
    expect(&f, TF_ALICE, f.dir, 403, "lies in the server's state directory");
    snprintf(p, sizeof p, "%s/sub", f.dir);
    expect(&f, TF_ALICE, p, 403, "lies in the server's state directory");
    /* Alice's folder is alice's: not bob's, not above it for bob. */
    snprintf(p, sizeof p, "%s/x", wa);
    expect(&f, TF_ALICE, p, 201, NULL);
    expect(&f, TF_BOB, p, 403, "gave another tenant");
    snprintf(p, sizeof p, "%s/y", wa);
    expect(&f, TF_BOB, p, 403, "lies in a folder the admin gave another tenant");
    expect(&f, TF_BOB, wa, 403, "holds a folder the admin gave another tenant");
    /* A sibling that only starts like an allowed folder is not in it. */
    snprintf(p, sizeof p, "%s/wab", t);
    expect(&f, TF_ALICE, p, 201, NULL); /* under the shared test folder */
    snprintf(p, sizeof p, "%sx/y", wa);
    expect(&f, TF_ALICE, p, 201, NULL);
    /* The shared folder (every tenant's): the first tenant to name a
     * directory keeps it, what lies in it and what lies above it. */
    snprintf(p, sizeof p, "%s/shared/one", t);
    expect(&f, TF_ALICE, p, 201, NULL);
    expect(&f, TF_BOB, p, 403, "another tenant's");
    snprintf(p, sizeof p, "%s/shared/one/inner", t);
    expect(&f, TF_BOB, p, 403, "another tenant's");
    snprintf(p, sizeof p, "%s/shared", t);
    expect(&f, TF_BOB, p, 403, "another tenant's");
    snprintf(p, sizeof p, "%s/shared/onex", t);
    expect(&f, TF_BOB, p, 201, NULL);
    snprintf(p, sizeof p, "%s/shared/one", t);
    expect(&f, TF_ALICE, p, 201, NULL);
    expect(&f, TF_ADMIN, p, 201, NULL);
    /* The admin is no tenant: what its jobs name stays free for tenants. */
    snprintf(p, sizeof p, "%s/shared/adm", t);
    expect(&f, TF_ADMIN, p, 201, NULL);
    expect(&f, TF_BOB, p, 201, NULL);
    /* Outside every allowed folder. */
    expect(&f, TF_ALICE, "/usr/share", 403, "not under a directory the admin allows");
    /* Paths shorter than the suffixes checked ("/.", "/.."): under ASan a
     * compare that reads before the string fails here. */
    expect(&f, TF_ALICE, "/a", 403, "not under a directory the admin allows");
    expect(&f, TF_ALICE, "/", 403, NULL);
    tf_stop(&f);
}

/* Polls as node "solo" (credential cred) with `extra` fields; returns the
 * status and the reply's first member's attempt in *attempt (-1: none). */
static int poll_solo(tf_fleet *f, const char *cred, const char *extra, int64_t *attempt)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"node\":\"solo\",\"wait_ms\":0%s}", extra);
    int st;
    json_t *j = tf_call(f, cred, "POST", "/v1/agent/poll", body, &st);
    json_t *m = json_array_get(json_object_get(j, "members"), 0);
    if (attempt) *attempt = m ? json_integer_value(json_object_get(m, "attempt")) : -1;
    json_decref(j);
    return st;
}

static const char *job_state(tf_fleet *f, int64_t id, char *out, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    int st;
    json_t *j = tf_call(f, TF_ADMIN, "GET", path, NULL, &st);
    snprintf(out, cap, "%s", json_string_value(json_object_get(j, "state")) ? json_string_value(json_object_get(j, "state")) : "?");
    json_decref(j);
    return out;
}

/* How many of job id's events are of `kind`. */
static int events_of(tf_fleet *f, int64_t id, const char *kind)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/events", (long long)id);
    int st, n = 0;
    json_t *j = tf_call(f, TF_ADMIN, "GET", path, NULL, &st);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(j, "events"), i, e) n += !strcmp(json_string_value(json_object_get(e, "kind")), kind);
    json_decref(j);
    return n;
}

/* A node speaks only for the ranks of a job's members: a report or output
 * for a rank past them (the job's world size, or far past it, beyond an
 * int) is stale, taken as nothing, and never read as a member; the job
 * ends only when its real rank does. */
static void test_agent_rank_past_members(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "ranks", 10);
    int st;
    json_t *r = tf_call(&f, TF_AGENT, "POST", "/v1/agent/register", "{\"name\":\"solo\",\"gpu_type\":\"X\",\"gpus\":8}", &st);
    assert_int_equal(st, 200);
    char *cred = strdup(json_string_value(json_object_get(r, "credential")));
    json_decref(r);
    int64_t id, attempt = -1;
    assert_int_equal(submit(&f, TF_ALICE, "", &id, NULL, NULL, 0), 201);
    for (int i = 0; i < 200 && attempt < 0; i++) {
        assert_int_equal(poll_solo(&f, cred, "", &attempt), 200);
        if (attempt < 0) usleep(50000);
    }
    if (attempt < 0) fail_msg("job %lld was never given to node solo", (long long)id);
    char extra[512], s1[32];
    const long long ranks[] = {1, 2, 64, 2147483648LL, 4294967296LL};
    for (size_t i = 0; i < sizeof ranks / sizeof *ranks; i++) {
        snprintf(extra, sizeof extra,
                 ",\"members\":[{\"job\":%lld,\"attempt\":%lld,\"rank\":%lld,\"state\":\"exited\",\"exit_code\":3}],"
                 "\"logs\":[{\"job\":%lld,\"attempt\":%lld,\"rank\":%lld,\"data\":\"PAST\\n\"}]",
                 (long long)id, (long long)attempt, ranks[i], (long long)id, (long long)attempt, ranks[i]);
        int got = poll_solo(&f, cred, extra, NULL);
        if (got != 200) fail_msg("a report for rank %lld of a 1-member job: status %d, not taken as stale", ranks[i], got);
        if (strcmp(job_state(&f, id, s1, sizeof s1), "succeeded") == 0 || strcmp(s1, "failed") == 0)
            fail_msg("a report for rank %lld ended job %lld (%s)", ranks[i], (long long)id, s1);
    }
    /* Nothing was taken from them: no event, no log file of a rank past
     * the members in the server's state. */
    if (events_of(&f, id, "exited")) fail_msg("a report for a rank past the members left an \"exited\" event");
    char lp[4400];
    for (int k = 1; k <= 2; k++) {
        snprintf(lp, sizeof lp, "%s/logs/%lld/%d.log", f.dir, (long long)id, k);
        if (sh_path_exists(lp)) fail_msg("output for rank %d of a 1-member job was written to %s", k, lp);
    }
    /* The real rank's report is read: the job ends, with its status. */
    snprintf(extra, sizeof extra,
             ",\"members\":[{\"job\":%lld,\"attempt\":%lld,\"rank\":0,\"state\":\"exited\",\"exit_code\":3}]",
             (long long)id, (long long)attempt);
    assert_int_equal(poll_solo(&f, cred, extra, NULL), 200);
    json_decref(tf_wait_job(&f, id, "failed", 10));
    if (events_of(&f, id, "exited") != 1) fail_msg("rank 0's report left no \"exited\" event");
    free(cred);
    tf_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_idempotency_per_tenant, tf_teardown),
        cmocka_unit_test_teardown(test_writable_each_condition, tf_teardown),
        cmocka_unit_test_teardown(test_agent_rank_past_members, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
