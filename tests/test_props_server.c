/* Properties of the server's tenancy that the generated mutants
 * (scripts/mutgen.py, docs/testing.md) found no test held, against a real
 * server on loopback (no agents: the jobs stay pending):
 *  - idempotency keys are per tenant: the same key from two tenants makes
 *    two jobs, a retry by either gets its own, also after a restart;
 *  - each condition of a "writable" folder on its own: a plain absolute
 *    path, outside the state directory, under a folder the admin allows
 *    the tenant, holding none given to another, and not another tenant's
 *    (a folder, one inside it or one above it); a sibling whose name only
 *    starts the same is not inside; the admin's jobs take no folder. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_idempotency_per_tenant, tf_teardown),
        cmocka_unit_test_teardown(test_writable_each_condition, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
