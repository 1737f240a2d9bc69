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
 *  - a tenant name holds only the documented characters (a-z, 0-9, '_',
 *    '.', '-'; starting with a letter or a digit; 1 to 63 of them): each
 *    character just outside a range is refused, in the middle and first,
 *    and every allowed one, at both ends of its range, is accepted;
 *  - a node's report for a rank past the job's members (or below 0) is
 *    ignored: it ends no member, and the node's valid report in the same
 *    poll still applies;
 *  - every bound of the API holds at its edge: a query number one past its
 *    bound, a rank past 63, a register field of the wrong type, a method or
 *    a job sub-route the API does not have are refused, not answered; an
 *    idempotency key holds printable ASCII only (no space, DEL, control);
 *  - a node's report or output for a rank past a job's members is stale,
 *    never read as a member (no event, no log file), the real rank's is;
 *  - (one server in this process, its cycles run by the test) a node that
 *    dies or is removed takes each job it held with it, each by its
 *    policy (on_failure "fail" ends the job; the others wait to run
 *    again), whichever of the active jobs it is; a removed node that
 *    registers again is known by its new GPUs; an agent that registers
 *    again while alive ends what ran under the old one, and is known by
 *    its new GPUs too;
 *  - an elastic job grows also while it starts, a preempted replica is
 *    stopped (no status: -1) and the others run on, and a lost replica
 *    is no shrink;
 *  - an open job's bill (dollars per GPU type) counts in the costs, for
 *    its tenant only, each of its places up to the 64th;
 *  - the lists' defaults (100 jobs, 200 events, the overview's 30 recent
 *    ended jobs) and their refusals; a run's services read back; a node
 *    is told only its own members, its stale or malformed reports are
 *    stale or refused, its long poll returns when its list changes;
 *  - the tenant queue bound at its exact edge; the tokens file's bound;
 *    "Authorization: Bearer TOKEN" the only form that authenticates;
 *  - an Idempotency-Key header holds 1 to 127 printable characters: an
 *    empty one is refused as the body's field is. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fleet_util.h"
#include "shoal/server.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* Starts `shoal server` with a tokens file whose tenants are the allowed
 * names and then `bad` (jansson keeps the file's order, and the server
 * refuses the first bad name it reads): the refusal must name `bad`. */
static void refused_after_good(const char *bad)
{
    static const char *const good[] = {"a", "z", "0", "9", "a_z.0-9", "az09", "0a", "9z", "z-", "a.", "a_",
                                       /* 63 characters */
                                       "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0"};
    char dir[4200], tok[4300], text[4096], *out = NULL;
    snprintf(dir, sizeof dir, "%s", tu_path("names"));
    sh_rm_rf(dir);
    TU_OK(sh_mkdir_p(dir, 0700));
    snprintf(tok, sizeof tok, "%s/tokens.json", dir);
    size_t n = (size_t)snprintf(text, sizeof text, "{\"admin\":\"a1\",\"agent\":\"g1\",\"tenants\":{");
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "\"%s\":\"t%zu\",", good[i], i);
    snprintf(text + n, sizeof text - n, "\"%s\":\"bad\"}}", bad);
    tu_write_file(tok, text, strlen(text));
    int rc = tu_run(&out, "%s server --tokens %s --db %s/s.db --port 0", tu_shoal(), tok, dir);
    char want[160];
    snprintf(want, sizeof want, "tenant \"%s\": the name", bad);
    if (rc == 0 || !strstr(out, want)) fail_msg("tenant \"%s\" after the allowed names: exit %d, output:\n%s", bad, rc, out);
    free(out);
}

static void test_tenant_name_characters(void **state)
{
    /* Each neighbour of an allowed range ('/' ':' '`' '{' '@' '['), upper
     * case, and punctuation next to '_' '.' '-' (',' '^' '/'), in the
     * middle; the same first, with '_' '.' '-' (allowed only after it). */
    static const char *const bad[] = {"a/", "a:", "a`", "a{", "a@", "a[", "aA", "aZ", "a,", "a^", "a b", "a~",
                                      "/a", ":a", "`a", "{a", "Aa", "_a", ".a", "-a", "",
                                      /* 64 characters */
                                      "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz01"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) refused_after_good(bad[i]);
}

static void test_rank_past_members(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "ranks", 10);
    int st;
    json_t *r = tf_call(&f, TF_AGENT, "POST", "/v1/agent/register", "{\"name\":\"idle\",\"gpu_type\":\"X\",\"gpus\":8}", &st);
    assert_int_equal(st, 200);
    char cred[256];
    snprintf(cred, sizeof cred, "%s", json_string_value(json_object_get(r, "credential")));
    json_decref(r);
    int64_t id;
    assert_int_equal(submit(&f, TF_ALICE, "", &id, NULL, NULL, 0), 201);
    json_decref(tf_wait_job(&f, id, "starting", 20));
    /* One member (rank 0): ranks 1, 2 and -1 are not the job's. */
    char body[1024];
    snprintf(body, sizeof body,
             "{\"node\":\"idle\",\"members\":["
             "{\"job\":%lld,\"attempt\":1,\"rank\":1,\"state\":\"exited\",\"exit_code\":0},"
             "{\"job\":%lld,\"attempt\":1,\"rank\":2,\"state\":\"exited\",\"exit_code\":0},"
             "{\"job\":%lld,\"attempt\":1,\"rank\":-1,\"state\":\"exited\",\"exit_code\":0},"
             "{\"job\":%lld,\"attempt\":1,\"rank\":0,\"state\":\"running\"}]}",
             (long long)id, (long long)id, (long long)id, (long long)id);
    json_decref(tf_call(&f, cred, "POST", "/v1/agent/poll", body, &st));
    assert_int_equal(st, 200);
    json_decref(tf_wait_job(&f, id, "running", 5));
    /* Still running: not among the finished jobs, among the running. */
    int found[2] = {0, 0};
    const char *ask[2] = {"/v1/jobs?state=finished", "/v1/jobs?state=running"};
    for (int k = 0; k < 2; k++) {
        json_t *l = tf_call(&f, TF_ALICE, "GET", ask[k], NULL, &st);
        assert_int_equal(st, 200);
        size_t q;
        json_t *x;
        json_array_foreach(json_object_get(l, "jobs"), q, x) found[k] |= json_integer_value(json_object_get(x, "id")) == id;
        json_decref(l);
    }
    if (found[0] || !found[1]) fail_msg("a running job listed as finished %d, as running %d", found[0], found[1]);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/events", (long long)id);
    json_t *ev = tf_call(&f, TF_ADMIN, "GET", path, NULL, &st);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(ev, "events"), i, e) {
        const char *k = json_string_value(json_object_get(e, "kind")), *msg = json_string_value(json_object_get(e, "msg"));
        if ((k && !strcmp(k, "exited")) || (msg && strstr(msg, "exited")))
            fail_msg("a report for a rank past the job's members ended one: %s: %s", k, msg ? msg : "");
    }
    json_decref(ev);
    tf_stop(&f);
}

static void refused_why(tf_fleet *f, const char *token, const char *method, const char *path, const char *body,
                        int want, const char *why)
{
    int st;
    json_t *j = tf_call(f, token, method, path, body, &st);
    const char *e = json_string_value(json_object_get(j, "error"));
    if (st != want || (why && (!e || !strstr(e, why))))
        fail_msg("%s %s %s: status %d (%s), expected %d (%s)", method, path, body ? body : "", st, e ? e : "",
                 want, why ? why : "");
    json_decref(j);
}

static void refused(tf_fleet *f, const char *token, const char *method, const char *path, const char *body,
                    int want)
{
    refused_why(f, token, method, path, body, want, NULL);
}

static void test_routes_at_their_bounds(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "bounds", 10);
    refused(&f, TF_AGENT, "POST", "/v1/agent/register",
            "{\"name\":\"p\",\"gpu_type\":\"X\",\"gpus\":8,\"from_provider\":\"yes\"}", 400);
    refused_why(&f, TF_AGENT, "POST", "/v1/agent/register", "{\"name\":\"p\",\"gpu_type\":\"X\",\"gpus\":65}", 400,
                "outside 0..64");
    refused_why(&f, TF_AGENT, "POST", "/v1/agent/register", "{\"name\":\"p\",\"gpu_type\":\"X\",\"gpus\":-1}", 400,
                "outside 0..64");
    fake_node(&f); /* no price: it is optional */
    int64_t id;
    assert_int_equal(submit(&f, TF_ALICE, "", &id, NULL, NULL, 0), 201);
    char p[128];
    refused(&f, TF_ALICE, "GET", "/v1/jobs?limit=100000", NULL, 200);
    refused(&f, TF_ALICE, "GET", "/v1/jobs?limit=100001", NULL, 400);
    refused(&f, TF_ALICE, "GET", "/v1/jobs?limit=0", NULL, 400);
    refused(&f, TF_ALICE, "GET", "/v1/events?limit=10000", NULL, 200);
    refused(&f, TF_ALICE, "GET", "/v1/events?limit=10001", NULL, 400);
    snprintf(p, sizeof p, "/v1/jobs/%lld/logs?rank=64", (long long)id);
    refused(&f, TF_ALICE, "GET", p, NULL, 400);
    snprintf(p, sizeof p, "/v1/jobs/%lld/bogus", (long long)id);
    refused(&f, TF_ALICE, "GET", p, NULL, 405);
    snprintf(p, sizeof p, "/v1/jobs/%lld/events", (long long)id);
    refused(&f, TF_ALICE, "GET", p, NULL, 200);
    /* An idempotency key is printable ASCII, '!' to '~': a space, DEL or a
     * control character in it is refused. */
    const char *keys[] = {",\"idempotency_key\":\"a b\"", ",\"idempotency_key\":\"a\\u007fb\"",
                          ",\"idempotency_key\":\"a\\u001fb\"", ",\"idempotency_key\":\"!~\""};
    for (int k = 0; k < 4; k++) {
        int64_t kid;
        int want = k < 3 ? 400 : 201, got = submit(&f, TF_ALICE, keys[k], &kid, NULL, NULL, 0);
        if (got != want) fail_msg("submit with %s: status %d, expected %d", keys[k], got, want);
    }
    refused(&f, TF_ADMIN, "POST", "/v1/nodes", "{}", 404);
    refused(&f, TF_ADMIN, "GET", "/v1/nodes", NULL, 200);
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

/* ---- One server in this process, its cycles run by the test ---------------- */

static struct {
    srv *s;
    tf_fleet f; /* its url, for tf_call */
} fx;

static char *reg(tf_fleet *f, const char *name, const char *type, int gpus, double price);

static tf_fleet *fx_up(void)
{
    if (fx.s) return &fx.f;
    snprintf(fx.f.dir, sizeof fx.f.dir, "%s", tu_path("inproc"));
    sh_rm_rf(fx.f.dir);
    TU_OK(sh_mkdir_p(fx.f.dir, 0700));
    char db[4200], tok[4200];
    snprintf(db, sizeof db, "%s/state.db", fx.f.dir);
    snprintf(tok, sizeof tok, "%s/tokens.json", fx.f.dir);
    const char *t = "{\"admin\":\"" TF_ADMIN "\",\"agent\":\"" TF_AGENT "\",\"tenants\":{\"alice\":\"" TF_ALICE
                    "\",\"bob\":\"" TF_BOB "\"}}";
    tu_write_file(tok, t, strlen(t));
    chmod(tok, 0600);
    srv_config cfg = {.db_path = db, .tokens_path = tok, .heartbeat_timeout = 3600, .manual_cycles = 1,
                      .max_queued = 3 * (1000 + SRV_JOB_COST), .writable_allow = "bob=/"};
    TU_OK(srv_start(&cfg, &fx.s));
    snprintf(fx.f.url, sizeof fx.f.url, "http://127.0.0.1:%d", srv_port(fx.s));
    /* The first node (the first in every table), priced at $1 a GPU-second. */
    free(reg(&fx.f, "co1", "CO", 1, 3600));
    return &fx.f;
}

static int fx_down(void **state)
{
    (void)state;
    if (fx.s) srv_stop(fx.s);
    fx.s = NULL;
    return 0;
}

static void cycle(void)
{
    double t = srv_cycle_for_bench(fx.s);
    if (t < 0) fail_msg("scheduling cycle: %s", sh_errmsg());
}

/* Registers node `name` (type, gpus, price per GPU-hour); returns its
 * credential (free it). */
static char *reg(tf_fleet *f, const char *name, const char *type, int gpus, double price)
{
    char body[256];
    snprintf(body, sizeof body, "{\"name\":\"%s\",\"gpu_type\":\"%s\",\"gpus\":%d,\"price_per_gpu_hour\":%g}", name,
             type, gpus, price);
    int st;
    json_t *r = tf_call(f, TF_AGENT, "POST", "/v1/agent/register", body, &st);
    if (st != 200) fail_msg("register %s: %d", name, st);
    char *cred = strdup(json_string_value(json_object_get(r, "credential")));
    json_decref(r);
    return cred;
}

/* Job id as the admin sees it (its members too). */
static json_t *job_of(tf_fleet *f, int64_t id)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    int st;
    json_t *j = tf_call(f, TF_ADMIN, "GET", path, NULL, &st);
    if (st != 200) fail_msg("GET %s: %d", path, st);
    return j;
}

static const char *state_of(tf_fleet *f, int64_t id, char *out, size_t cap)
{
    json_t *j = job_of(f, id);
    snprintf(out, cap, "%s", json_string_value(json_object_get(j, "state")));
    json_decref(j);
    return out;
}

/* Members of job id in `state` (NULL: every member). */
static int members_in(tf_fleet *f, int64_t id, const char *state)
{
    json_t *j = job_of(f, id);
    size_t i;
    json_t *m;
    int n = 0;
    json_array_foreach(json_object_get(j, "members"), i, m) n +=
        !state || !strcmp(json_string_value(json_object_get(m, "state")), state);
    json_decref(j);
    return n;
}

/* Ends every active job, so that the next job placed is the first active. */
static void quiesce(tf_fleet *f)
{
    int st;
    json_t *l = tf_call(f, TF_ADMIN, "GET", "/v1/jobs?state=active", NULL, &st);
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(l, "jobs"), i, x) {
        char path[64];
        snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)json_integer_value(json_object_get(x, "id")));
        json_decref(tf_call(f, TF_ADMIN, "POST", path, "{}", &st));
        assert_int_equal(st, 200);
    }
    json_decref(l);
    cycle();
}

static int64_t submit_as(tf_fleet *f, const char *token, const char *spec)
{
    int st;
    json_t *j = tf_call(f, token, "POST", "/v1/jobs", spec, &st);
    if (st != 201) fail_msg("submit %s: %d %s", spec, st, json_string_value(json_object_get(j, "error")));
    int64_t id = json_integer_value(json_object_get(j, "id"));
    json_decref(j);
    return id;
}

static void want_state(tf_fleet *f, int64_t id, const char *want, const char *ctx)
{
    char s1[32];
    if (strcmp(state_of(f, id, s1, sizeof s1), want)) fail_msg("%s: job %lld is %s, expected %s", ctx, (long long)id, s1, want);
}

/* A node that leaves (removed by the admin, or its agent starts again)
 * takes its jobs with it, each by its policy, whichever active job it is. */
static void test_node_lost_takes_its_jobs(void **state)
{
    tf_fleet *f = fx_up();
    quiesce(f);
    free(reg(f, "rm1", "RA", 1, 0));
    /* on_failure "fail": the job ends with the node.  It is the only
     * active job, the first the server looks at. */
    int64_t a = submit_as(f, TF_ALICE, "{\"name\":\"f\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"],"
                                       "\"gpu_types\":[\"RA\"],\"on_failure\":\"fail\"}");
    cycle();
    want_state(f, a, "starting", "placed on rm1");
    int st;
    json_t *r = tf_call(f, TF_ADMIN, "DELETE", "/v1/nodes/rm1", NULL, &st);
    assert_int_equal(st, 200);
    json_decref(r);
    want_state(f, a, "failed", "rm1 removed under an on_failure \"fail\" job");
    if (members_in(f, a, "lost") != 1) fail_msg("the member on the removed node is not lost");
    /* Registered again with other GPUs: the scheduler knows it by them. */
    char *cred = reg(f, "rm1", "RB", 2, 0);
    int64_t b = submit_as(f, TF_ALICE, "{\"name\":\"g\",\"kind\":\"gang\",\"nodes\":1,\"gpus_per_node\":2,"
                                       "\"command\":[\"true\"],\"gpu_types\":[\"RB\"]}");
    cycle();
    want_state(f, b, "starting", "a gang of 2 RB GPUs on rm1 registered again with them");
    char body[512];
    json_t *g = job_of(f, b);
    snprintf(body, sizeof body, "{\"node\":\"rm1\",\"members\":[{\"job\":%lld,\"attempt\":%lld,\"rank\":0,"
             "\"state\":\"running\"}]}", (long long)b, (long long)json_integer_value(json_object_get(g, "attempt")));
    json_decref(g);
    json_decref(tf_call(f, cred, "POST", "/v1/agent/poll", body, &st));
    assert_int_equal(st, 200);
    want_state(f, b, "running", "its one rank reported running");
    /* Its agent starts again (registers while alive): what ran under the
     * old one is lost, and the gang (on_failure requeue) waits to run again. */
    free(cred);
    cred = reg(f, "rm1", "RB", 2, 0);
    want_state(f, b, "pending", "rm1's agent registered again");
    if (members_in(f, b, "lost") != 1) fail_msg("the gang's member under the old agent is not lost");
    free(cred);
    quiesce(f);
    /* Its agent starts again, alive, with other GPUs: the scheduler knows
     * it by the new ones, not by what it had before. */
    cred = reg(f, "rm1", "RC", 3, 0);
    int64_t c = submit_as(f, TF_ALICE, "{\"name\":\"h\",\"kind\":\"gang\",\"nodes\":1,\"gpus_per_node\":3,"
                                       "\"command\":[\"true\"],\"gpu_types\":[\"RC\"]}");
    cycle();
    want_state(f, c, "starting", "a gang of 3 RC GPUs on rm1, its agent registered again with them while alive");
    free(cred);
    quiesce(f);
}

/* An elastic job grows while it starts; a node lost under one of its
 * replicas loses that replica (no shrink); a preempted replica is stopped
 * and the others run on; no member that has not exited has a status (-1). */
static void test_elastic_grow_and_shrink(void **state)
{
    tf_fleet *f = fx_up();
    quiesce(f);
    free(reg(f, "el1", "EL", 1, 0));
    int64_t e = submit_as(f, TF_ALICE, "{\"name\":\"e\",\"kind\":\"elastic\",\"min_nodes\":1,\"max_nodes\":2,"
                                       "\"gpus_per_node\":1,\"command\":[\"true\"],\"gpu_types\":[\"EL\"]}");
    cycle();
    want_state(f, e, "starting", "placed on el1");
    assert_int_equal(members_in(f, e, NULL), 1);
    json_t *j0 = job_of(f, e);
    if (json_integer_value(json_object_get(json_array_get(json_object_get(j0, "members"), 0), "exit_code")) != -1)
        fail_msg("a member just placed has an exit code (not -1)");
    json_decref(j0);
    free(reg(f, "el2", "EL", 1, 0));
    cycle();
    if (members_in(f, e, "assigned") != 2) fail_msg("a starting elastic job did not grow onto a new node");
    assert_int_equal(events_of(f, e, "grow"), 1);
    /* el2 removed: its replica is lost, the job runs on, nothing shrank. */
    int st;
    json_decref(tf_call(f, TF_ADMIN, "DELETE", "/v1/nodes/el2", NULL, &st));
    assert_int_equal(st, 200);
    cycle();
    want_state(f, e, "starting", "one replica of two lost");
    assert_int_equal(members_in(f, e, "lost"), 1);
    assert_int_equal(events_of(f, e, "replica_lost"), 1);
    if (events_of(f, e, "shrink")) fail_msg("a lost replica was reported as a shrink");
    free(reg(f, "el3", "EL", 1, 0));
    cycle();
    assert_int_equal(members_in(f, e, "assigned"), 2);
    /* Higher-priority work takes one node: one replica is stopped. */
    int64_t hi = submit_as(f, TF_ADMIN, "{\"name\":\"hi\",\"kind\":\"gang\",\"nodes\":1,\"priority\":100,"
                                        "\"est_s\":60,\"command\":[\"true\"],\"gpu_types\":[\"EL\"]}");
    cycle();
    want_state(f, hi, "starting", "a priority 100 job on a node of the elastic job's");
    want_state(f, e, "starting", "one replica preempted");
    if (members_in(f, e, "assigned") != 1 || members_in(f, e, "stopped") != 1)
        fail_msg("a shrink by one: %d assigned, %d stopped (expected 1 and 1)", members_in(f, e, "assigned"),
                 members_in(f, e, "stopped"));
    json_t *j = job_of(f, e);
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "members"), i, m) {
        const char *ms = json_string_value(json_object_get(m, "state"));
        if (json_integer_value(json_object_get(m, "exit_code")) != -1)
            fail_msg("a %s member has exit code %lld, not -1 (none)", ms,
                     (long long)json_integer_value(json_object_get(m, "exit_code")));
    }
    json_decref(j);
    assert_int_equal(events_of(f, e, "shrink"), 1);
    /* The node of the stopped replica is removed: the high-priority job
     * loses its rank there; the elastic job lost nothing (its replica there
     * had already stopped). */
    json_t *h = job_of(f, hi);
    char path[96];
    snprintf(path, sizeof path, "/v1/nodes/%s", tf_member_node(h, 0));
    json_decref(h);
    json_decref(tf_call(f, TF_ADMIN, "DELETE", path, NULL, &st));
    assert_int_equal(st, 200);
    assert_int_equal(members_in(f, hi, "lost"), 1);
    if (members_in(f, e, "stopped") != 1 || events_of(f, e, "replica_lost") != 1)
        fail_msg("removing the node of a stopped replica: %d stopped, %d replica_lost events (expected 1 and 1)",
                 members_in(f, e, "stopped"), events_of(f, e, "replica_lost"));
    quiesce(f);
}

/* A running job's open bill counts in the costs: dollars and GPU-seconds
 * under its tenant and GPU type, seen by the admin and its tenant only. */
static void test_costs_of_open_bills(void **state)
{
    tf_fleet *f = fx_up();
    quiesce(f);
    int64_t c = submit_as(f, TF_BOB, "{\"name\":\"c\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"],"
                                     "\"gpu_types\":[\"CO\"]}");
    cycle();
    want_state(f, c, "starting", "placed on co1");
    usleep(100000);
    const char *who[3] = {TF_ADMIN, TF_BOB, TF_ALICE};
    for (int k = 0; k < 3; k++) {
        int st;
        json_t *r = tf_call(f, who[k], "GET", "/v1/costs", NULL, &st);
        assert_int_equal(st, 200);
        json_t *g = json_object_get(json_object_get(json_object_get(r, "by_tenant"), "bob"), "CO");
        double d = json_real_value(json_object_get(g, "dollars")), gs = json_real_value(json_object_get(g, "gpu_seconds"));
        double total = json_real_value(json_object_get(r, "total_dollars"));
        if (k < 2 && (d < 0.05 || gs < 0.05 || total < d))
            fail_msg("costs as %s: bob's CO bill $%g for %g GPU-s (total $%g) after 0.1 s at $1/GPU-s", who[k], d, gs,
                     total);
        if (k == 2 && g) fail_msg("alice sees bob's costs");
        json_decref(r);
    }
    quiesce(f);
}

/* The Idempotency-Key header holds 1 to 127 printable ASCII characters,
 * as the body's idempotency_key does: an empty one is refused. */
static void test_idempotency_header_bounds(void **state)
{
    tf_fleet *f = fx_up();
    free(reg(f, "ih1", "IH", 1, 0));
    char k127[200], k128[200];
    memset(k127, 'k', 127);
    k127[127] = 0;
    memset(k128, 'q', 128);
    k128[128] = 0;
    struct {
        const char *hdr, *key;
        int want;
    } cases[] = {{"Idempotency-Key:", "", 400}, {"Idempotency-Key: %s", "", 400}, {"Idempotency-Key: %s", k128, 400},
                 {"Idempotency-Key: %s", k127, 201}, {"Idempotency-Key: %s", k127, 200}};
    const char *body = "{\"name\":\"h\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"],\"gpu_types\":[\"IH\"]}";
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char h[300];
        snprintf(h, sizeof h, cases[i].hdr, cases[i].key);
        client_conn *c;
        if (client_new(f->url, TF_ALICE, &c) < 0) fail_msg("%s", sh_errmsg());
        char *r = NULL;
        size_t rl = 0;
        int st = 0;
        int rc = client_raw(c, "POST", "/v1/jobs", body, strlen(body), h, 10, &st, &r, &rl);
        client_free(c);
        if (rc < 0) fail_msg("POST with header %.40s: %s", h, sh_errmsg());
        if (st != cases[i].want || (st == 400 && (!r || !strstr(r, "header Idempotency-Key"))))
            fail_msg("POST with header \"%.40s\" (%zu characters): %d %.*s, expected %d", h, strlen(cases[i].key), st,
                     (int)rl, r ? r : "", cases[i].want);
        free(r);
    }
}

/* GET path with only `header` (NULL: none) for credentials; returns the
 * status and copies the error into err. */
static int get_with(tf_fleet *f, const char *header, const char *path, char *err, size_t cap)
{
    client_conn *c;
    if (client_new(f->url, NULL, &c) < 0) fail_msg("%s", sh_errmsg());
    char *r = NULL;
    size_t rl = 0;
    int st = 0;
    if (client_raw(c, "GET", path, NULL, 0, header, 10, &st, &r, &rl) < 0) fail_msg("GET %s: %s", path, sh_errmsg());
    client_free(c);
    json_t *j = json_loadb(r ? r : "", rl, 0, NULL);
    snprintf(err, cap, "%s", json_string_value(json_object_get(j, "error")) ? json_string_value(json_object_get(j, "error")) : "");
    json_decref(j);
    free(r);
    return st;
}

/* Only "Authorization: Bearer TOKEN" authenticates: no header, another
 * scheme of the same length, or an empty token is 401, each saying what
 * is missing or wrong. */
static void test_auth_header_forms(void **state)
{
    tf_fleet *f = fx_up();
    char err[512];
    struct {
        const char *hdr;
        int want;
        const char *why;
    } cases[] = {{NULL, 401, "missing bearer token"},
                 {"Authorization: Token: " TF_ALICE, 401, "missing bearer token"},
                 {"Authorization: Basic  " TF_ALICE, 401, "missing bearer token"},
                 {"Authorization: Bearer ", 401, "missing bearer token"},
                 {"Authorization: Bearer  ", 401, "unknown bearer token"},
                 {"Authorization: Bearer x" TF_ALICE, 401, "unknown bearer token"},
                 {"Authorization: Bearer " TF_ALICE, 200, NULL}};
    /* The leader's address is for anyone (clients follow it). */
    if (get_with(f, NULL, "/v1/leader", err, sizeof err) != 200) fail_msg("GET /v1/leader without a token: not 200");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int st = get_with(f, cases[i].hdr, "/v1/jobs", err, sizeof err);
        if (st != cases[i].want || (cases[i].why && !strstr(err, cases[i].why)))
            fail_msg("GET /v1/jobs with %s: %d \"%s\", expected %d \"%s\"", cases[i].hdr ? cases[i].hdr : "no Authorization",
                     st, err, cases[i].want, cases[i].why ? cases[i].why : "");
    }
}

/* A tenant's active jobs may hold max_queued bytes (each job file plus
 * SRV_JOB_COST): a submit that reaches the limit exactly is taken, one
 * byte past it is 429; jobs that ended hold nothing, the admin's are not
 * counted. */
static void test_queue_bound_exact(void **state)
{
    tf_fleet *f = fx_up();
    quiesce(f);
    /* Job files of exactly 1000 bytes; the limit (set at the fixture's
     * start) holds three. */
    char body[1100];
    int n = snprintf(body, sizeof body, "{\"name\":\"q\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"],"
                                        "\"gpu_types\":[\"QQ\"],\"env\":{\"PAD\":\"");
    memset(body + n, 'p', 1000 - (size_t)n - 3);
    snprintf(body + 1000 - 3, 4, "\"}}");
    assert_int_equal(strlen(body), 1000);
    free(reg(f, "qq1", "QQ", 1, 0));
    int st;
    for (int k = 0; k < 4; k++) {
        json_t *j = tf_call(f, TF_BOB, "POST", "/v1/jobs", body, &st);
        int want = k < 3 ? 201 : 429;
        if (st != want) fail_msg("bob's submit %d of 1000 bytes under a limit of 3 x (1000 + %u): %d %s, expected %d",
                                 k + 1, SRV_JOB_COST, st, json_string_value(json_object_get(j, "error")), want);
        json_decref(j);
        if (k == 0) cycle(); /* the first runs: running jobs count too */
    }
    /* The admin's are not counted; an ended job of bob's frees its room. */
    json_decref(tf_call(f, TF_ADMIN, "POST", "/v1/jobs", body, &st));
    assert_int_equal(st, 201);
    quiesce(f);
    json_decref(tf_call(f, TF_BOB, "POST", "/v1/jobs", body, &st));
    assert_int_equal(st, 201);
    quiesce(f);
}

/* GET path as token; returns the reply (decref it) and sets *st. */
static json_t *get_as(tf_fleet *f, const char *token, const char *path, int *st)
{
    return tf_call(f, token, "GET", path, NULL, st);
}

/* The lists' bounds: 100 jobs and 200 events by default, "limit" more,
 * a list entry without the job file (GET /v1/jobs/ID has it), an unknown
 * state or a bad "after" refused, and the overview's 30 most recent ended
 * jobs beside every active one. */
static void test_list_defaults(void **state)
{
    tf_fleet *f = fx_up();
    quiesce(f);
    free(reg(f, "ls1", "LS", 1, 0));
    int64_t first = 0;
    for (int k = 0; k < 101; k++) {
        int64_t id = submit_as(f, TF_ADMIN, "{\"name\":\"l\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"],"
                                            "\"gpu_types\":[\"LS\"]}");
        if (!first) first = id;
    }
    int st;
    json_t *l = get_as(f, TF_ADMIN, "/v1/jobs", &st);
    assert_int_equal(st, 200);
    json_t *a = json_object_get(l, "jobs");
    if (json_array_size(a) != 100) fail_msg("GET /v1/jobs listed %zu jobs, expected the default 100", json_array_size(a));
    if (json_object_get(json_array_get(a, 0), "spec")) fail_msg("a list entry holds the job file");
    json_decref(l);
    l = get_as(f, TF_ADMIN, "/v1/jobs?limit=101", &st);
    assert_int_equal(json_array_size(json_object_get(l, "jobs")), 101);
    json_decref(l);
    l = job_of(f, first);
    if (!json_object_get(l, "spec")) fail_msg("GET /v1/jobs/ID has no job file");
    json_decref(l);
    refused(f, TF_ADMIN, "GET", "/v1/jobs?state=bogus", NULL, 400);
    quiesce(f); /* 101 "cancelled" events more */
    l = get_as(f, TF_ADMIN, "/v1/events", &st);
    if (json_array_size(json_object_get(l, "events")) != 200)
        fail_msg("GET /v1/events listed %zu events, expected the default 200", json_array_size(json_object_get(l, "events")));
    json_decref(l);
    refused(f, TF_ADMIN, "GET", "/v1/events?after=-1", NULL, 400);
    refused(f, TF_ADMIN, "GET", "/v1/events?after=x", NULL, 400);
    int64_t live = submit_as(f, TF_ADMIN, "{\"name\":\"live\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"],"
                                          "\"gpu_types\":[\"LS\"]}");
    l = get_as(f, TF_ADMIN, "/v1/overview", &st);
    assert_int_equal(st, 200);
    size_t i;
    json_t *x;
    int ended = 0, seen = 0;
    json_array_foreach(json_object_get(l, "jobs"), i, x) {
        const char *js = json_string_value(json_object_get(x, "state"));
        ended += !strcmp(js, "cancelled") || !strcmp(js, "failed") || !strcmp(js, "succeeded");
        seen |= json_integer_value(json_object_get(x, "id")) == live;
    }
    json_decref(l);
    if (ended != 30 || !seen) fail_msg("the overview shows %d ended jobs (expected the 30 most recent) and %s the active one",
                                       ended, seen ? "shows" : "not");
    quiesce(f);
}

/* Polls as node `name` with `extra` fields; returns the status. */
static int poll_as(tf_fleet *f, const char *name, const char *cred, const char *extra, json_t **reply)
{
    char body[2048];
    snprintf(body, sizeof body, "{\"node\":\"%s\"%s}", name, extra);
    int st;
    json_t *j = tf_call(f, cred, "POST", "/v1/agent/poll", body, &st);
    if (reply) *reply = j;
    else json_decref(j);
    return st;
}

static int64_t node_version(tf_fleet *f, const char *name, const char *cred)
{
    json_t *r;
    assert_int_equal(poll_as(f, name, cred, ",\"wait_ms\":0", &r), 200);
    int64_t v = json_integer_value(json_object_get(r, "version"));
    json_decref(r);
    return v;
}

/* How many starts shoal_gang_start_seconds counted (its _count lines). */
static double start_count(tf_fleet *f)
{
    client_conn *c;
    if (client_new(f->url, TF_ADMIN, &c) < 0) fail_msg("%s", sh_errmsg());
    char *r = NULL;
    size_t rl = 0;
    int st = 0;
    if (client_raw(c, "GET", "/metrics", NULL, 0, NULL, 10, &st, &r, &rl) < 0 || st != 200) fail_msg("GET /metrics: %d", st);
    client_free(c);
    double n = 0;
    for (char *l = r; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, "shoal_gang_start_seconds_count", 30)) n += atof(strchr(l, ' ') + 1);
    free(r);
    return n;
}

typedef struct {
    tf_fleet *f;
    const char *cred;
    int64_t version;
    double took;
    int st;
} long_poll;

static void *long_poll_run(void *arg)
{
    long_poll *lp = arg;
    char extra[128];
    snprintf(extra, sizeof extra, ",\"version\":%lld,\"wait_ms\":4000", (long long)lp->version);
    double t0 = sh_now_mono();
    lp->st = poll_as(lp->f, "ag1", lp->cred, extra, NULL);
    lp->took = sh_now_mono() - t0;
    return NULL;
}

/* What a node tells and is told: only its own members; a report for a job
 * the server never had is stale; a disk figure stays until a new one
 * comes; a malformed output entry fails the poll; output of the current
 * attempt lands in the log; a long poll returns as soon as the node's list
 * changes; nothing is refused when nothing was forged; a credential polls
 * as its own node only. */
static void test_agent_reports(void **state)
{
    tf_fleet *f = fx_up();
    quiesce(f);
    char *c1 = reg(f, "ag1", "AG", 1, 0), *c2 = reg(f, "ag2", "AG", 1, 0);
    int64_t id = submit_as(f, TF_ALICE, "{\"name\":\"ag\",\"kind\":\"gang\",\"nodes\":2,\"command\":[\"true\"],"
                                        "\"gpu_types\":[\"AG\"]}");
    cycle();
    want_state(f, id, "starting", "a gang on ag1 and ag2");
    int st;
    json_t *r;
    assert_int_equal(poll_as(f, "ag1", c1, ",\"wait_ms\":0", &r), 200);
    json_t *mine = json_object_get(r, "members");
    if (json_array_size(mine) != 1) fail_msg("ag1 was told to run %zu members, expected its own 1", json_array_size(mine));
    int rank = (int)json_integer_value(json_object_get(json_array_get(mine, 0), "rank"));
    int64_t att = json_integer_value(json_object_get(json_array_get(mine, 0), "attempt"));
    json_decref(r);
    json_t *g = job_of(f, id);
    if (strcmp(tf_member_node(g, rank), "ag1")) fail_msg("ag1 was told to run rank %d, which is %s's", rank, tf_member_node(g, rank));
    json_decref(g);
    /* A registered node is no provider's unless it says so. */
    json_t *nodes = get_as(f, TF_ADMIN, "/v1/nodes", &st);
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(nodes, "nodes"), i, n) if (!strcmp(json_string_value(json_object_get(n, "name")), "ag1") &&
                                                                 json_is_true(json_object_get(n, "from_provider")))
        fail_msg("ag1 registered without from_provider is listed as a provider's node");
    json_decref(nodes);
    char extra[1024];
    snprintf(extra, sizeof extra,
             ",\"members\":[{\"job\":999999,\"attempt\":1,\"rank\":0,\"state\":\"exited\",\"exit_code\":0},"
             "{\"job\":%lld,\"attempt\":%lld,\"rank\":%d,\"state\":\"ready\",\"disk_bytes\":500}]",
             (long long)id, (long long)att, rank);
    if (poll_as(f, "ag1", c1, extra, NULL) != 200) fail_msg("a report for a job the server never had was not taken as stale");
    snprintf(extra, sizeof extra, ",\"members\":[{\"job\":%lld,\"attempt\":%lld,\"rank\":%d,\"state\":\"ready\"}]",
             (long long)id, (long long)att, rank);
    assert_int_equal(poll_as(f, "ag1", c1, extra, NULL), 200);
    g = job_of(f, id);
    json_t *m = json_array_get(json_object_get(g, "members"), (size_t)rank);
    if (json_integer_value(json_object_get(m, "disk_bytes")) != 500)
        fail_msg("a report without disk_bytes reset the member's disk figure to %lld",
                 (long long)json_integer_value(json_object_get(m, "disk_bytes")));
    json_decref(g);
    const char *bad[] = {",\"logs\":[{\"job\":%lld,\"rank\":\"x\",\"data\":\"a\"}]", ",\"logs\":[{\"job\":%lld,\"rank\":0,\"data\":5}]",
                         ",\"logs\":[{\"job\":%lld,\"rank\":0,\"attempt\":\"a\",\"data\":\"a\"}]"};
    for (int k = 0; k < 3; k++) {
        snprintf(extra, sizeof extra, bad[k], (long long)id);
        if (poll_as(f, "ag1", c1, extra, NULL) != 400) fail_msg("a poll with %s was not refused", extra);
    }
    /* Nothing was forged so far: no "refused" event anywhere. */
    json_t *ev = get_as(f, TF_ADMIN, "/v1/events?limit=10000", &st);
    json_t *e;
    json_array_foreach(json_object_get(ev, "events"), i, e) if (!strcmp(json_string_value(json_object_get(e, "kind")), "refused"))
        fail_msg("a \"refused\" event with nothing forged: %s", json_string_value(json_object_get(e, "msg")));
    json_decref(ev);
    snprintf(extra, sizeof extra, ",\"logs\":[{\"job\":%lld,\"attempt\":%lld,\"rank\":%d,\"data\":\"from ag1\\n\"}]",
             (long long)id, (long long)att, rank);
    assert_int_equal(poll_as(f, "ag1", c1, extra, NULL), 200);
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%lld/logs?rank=%d", (long long)id, rank);
    json_t *lg = get_as(f, TF_ALICE, path, &st);
    const char *data = json_string_value(json_object_get(lg, "data"));
    if (!data || !strstr(data, "from ag1")) fail_msg("output of the current attempt is not in the log: \"%s\"", data ? data : "");
    json_decref(lg);
    /* A reply holds about 1 MiB of output (it ends with the record that
     * reaches 1 MiB): three records of 530 kB come in two replies. */
    {
        size_t big = 530000, cap = big + 256;
        char *body = malloc(cap);
        for (int k = 0; k < 3; k++) {
            int n0 = snprintf(body, cap, "{\"node\":\"ag1\",\"logs\":[{\"job\":%lld,\"attempt\":%lld,\"rank\":%d,\"data\":\"",
                              (long long)id, (long long)att, rank);
            memset(body + n0, 'x', big);
            snprintf(body + n0 + big, cap - (size_t)n0 - big, "\"}]}");
            json_decref(tf_call(f, c1, "POST", "/v1/agent/poll", body, &st));
            assert_int_equal(st, 200);
        }
        free(body);
        lg = get_as(f, TF_ALICE, path, &st);
        size_t got = json_string_length(json_object_get(lg, "data"));
        if (got >= (3u << 19) || got < (1u << 20)) fail_msg("a log reply held %zu bytes, not about 1 MiB", got);
        json_decref(lg);
    }
    /* A node's poll that fails (here: it reports another node's member)
     * changes nothing, not even the start-time histogram, although a
     * member's report before the forged one made its job run. */
    char *c3 = reg(f, "ag3", "AG", 1, 0);
    int64_t fn = submit_as(f, TF_ALICE, "{\"name\":\"fn\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"],"
                                        "\"gpu_types\":[\"AG\"]}");
    cycle();
    want_state(f, fn, "starting", "a function on ag3");
    int64_t fatt = json_integer_value(json_object_get((g = job_of(f, fn)), "attempt"));
    json_decref(g);
    double starts = start_count(f);
    snprintf(extra, sizeof extra,
             ",\"members\":[{\"job\":%lld,\"attempt\":%lld,\"rank\":0,\"state\":\"running\"},"
             "{\"job\":%lld,\"attempt\":%lld,\"rank\":%d,\"state\":\"running\"}]",
             (long long)fn, (long long)fatt, (long long)id, (long long)att, rank);
    /* The server's log says what was refused, and no more (this server
     * runs in the test: its log is this process's stderr). */
    char logp[4300];
    snprintf(logp, sizeof logp, "%s/forged.log", f->dir);
    fflush(stderr);
    int saved = dup(2), lfd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(lfd, 2);
    close(lfd);
    st = poll_as(f, "ag3", c3, extra, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_int_equal(st, 403);
    char *text = NULL;
    size_t tl = 0;
    TU_OK(sh_read_file(logp, 1 << 20, &text, &tl));
    if (!strstr(text, "refused") || strstr(text, "event:"))
        fail_msg("the server's log of a refused poll: \"%s\"", text);
    free(text);
    want_state(f, fn, "starting", "a refused poll");
    if (start_count(f) != starts) fail_msg("a refused poll counted a start in shoal_gang_start_seconds");
    snprintf(extra, sizeof extra, ",\"members\":[{\"job\":%lld,\"attempt\":%lld,\"rank\":0,\"state\":\"running\"}]",
             (long long)fn, (long long)fatt);
    assert_int_equal(poll_as(f, "ag3", c3, extra, NULL), 200);
    want_state(f, fn, "running", "its rank reported running");
    if (start_count(f) != starts + 1) fail_msg("a start was not counted in shoal_gang_start_seconds");
    assert_int_equal(events_of(f, id, "refused"), 1);
    free(c3);
    /* A long poll at the node's version returns when its list changes. */
    long_poll lp = {f, c1, node_version(f, "ag1", c1), 0, 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, long_poll_run, &lp), 0);
    usleep(300000);
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)id);
    json_decref(tf_call(f, TF_ALICE, "POST", path, "{}", &st));
    assert_int_equal(st, 200);
    pthread_join(t, NULL);
    assert_int_equal(lp.st, 200);
    if (lp.took > 3) fail_msg("a long poll returned %.1f s after it began, not when its node's list changed", lp.took);
    /* A node's credential speaks for that node only. */
    if (poll_as(f, "ag2", c1, ",\"wait_ms\":0", NULL) != 403) fail_msg("ag1's credential polled as node ag2");
    free(c1);
    free(c2);
    quiesce(f);
}

/* A run's services: published with PUT, read back with GET (the list and
 * one), a run that does not exist is 404. */
static void test_run_services(void **state)
{
    tf_fleet *f = fx_up();
    quiesce(f);
    submit_as(f, TF_ALICE, "{\"name\":\"r\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"],\"gpu_types\":[\"CO\"],"
                           "\"run\":\"r1\"}");
    int st;
    json_decref(tf_call(f, TF_ALICE, "PUT", "/v1/runs/r1/services/svc", "{\"value\":\"10.0.0.1:4000\"}", &st));
    assert_int_equal(st, 200);
    json_t *l = get_as(f, TF_ALICE, "/v1/runs/r1/services", &st);
    assert_int_equal(st, 200);
    const char *v = json_string_value(json_object_get(json_object_get(l, "services"), "svc"));
    if (!v || strcmp(v, "10.0.0.1:4000")) fail_msg("the run's services list svc as \"%s\"", v ? v : "(none)");
    json_decref(l);
    l = get_as(f, TF_ALICE, "/v1/runs/r1/services/svc", &st);
    assert_int_equal(st, 200);
    v = json_string_value(json_object_get(l, "value"));
    if (!v || strcmp(v, "10.0.0.1:4000")) fail_msg("GET of service svc: \"%s\"", v ? v : "(none)");
    json_decref(l);
    refused(f, TF_ALICE, "GET", "/v1/runs/nope/services", NULL, 404);
    refused(f, TF_BOB, "GET", "/v1/runs/r1/services", NULL, 404);
    quiesce(f);
}

/* The job file's checks, each alone: a function with a bad on_failure, a
 * negative replace_wait_s; an est_s under a second is allowed; with two
 * faults the first is named; a writable folder under "/" given to bob; a
 * command argument of 4096 bytes, not 4097. */
static void test_spec_checks(void **state)
{
    tf_fleet *f = fx_up();
    quiesce(f);
    struct {
        const char *tok, *extra;
        int want;
        const char *why;
    } cases[] = {
        {TF_ALICE, ",\"kind\":\"function\",\"gpus\":1,\"on_failure\":\"bogus\"", 400, "on_failure"},
        {TF_ALICE, ",\"kind\":\"function\",\"gpus\":1,\"replace_wait_s\":-1", 400, "replace_wait_s"},
        {TF_ALICE, ",\"kind\":\"function\",\"gpus\":1,\"replace_wait_s\":-1,\"workdir\":\"zz\"", 400, "replace_wait_s"},
        {TF_ALICE, ",\"kind\":\"function\",\"gpus\":1,\"est_s\":0.5", 201, NULL},
        {TF_BOB, ",\"kind\":\"function\",\"gpus\":1,\"writable\":[\"/shoal-props-nowhere/b\"]", 201, NULL},
        {TF_ALICE, ",\"kind\":\"function\",\"gpus\":1,\"writable\":[\"/shoal-props-nowhere/a\"]", 403, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"name\":\"s\",\"command\":[\"true\"],\"gpu_types\":[\"CO\"]%s}", cases[i].extra);
        int st;
        json_t *j = tf_call(f, cases[i].tok, "POST", "/v1/jobs", body, &st);
        const char *e = json_string_value(json_object_get(j, "error"));
        if (st != cases[i].want || (cases[i].why && (!e || !strstr(e, cases[i].why))))
            fail_msg("%s: %d \"%s\", expected %d \"%s\"", body, st, e ? e : "", cases[i].want, cases[i].why ? cases[i].why : "");
        json_decref(j);
    }
    /* A command's argument holds at most 4096 bytes. */
    for (int len = 4096; len <= 4097; len++) {
        char *body = malloc(5000);
        int n = snprintf(body, 5000, "{\"name\":\"s\",\"kind\":\"function\",\"gpu_types\":[\"CO\"],\"command\":[\"true\",\"");
        memset(body + n, 'a', (size_t)len);
        snprintf(body + n + len, 5000 - (size_t)n - (size_t)len, "\"]}");
        int st;
        json_t *j = tf_call(f, TF_ALICE, "POST", "/v1/jobs", body, &st);
        const char *e = json_string_value(json_object_get(j, "error"));
        if (st != (len == 4096 ? 201 : 400) || (len > 4096 && (!e || !strstr(e, "\"command\"[1]"))))
            fail_msg("a command argument of %d bytes: %d \"%s\"", len, st, e ? e : "");
        json_decref(j);
        free(body);
    }
    quiesce(f);
}

/* A tokens file over 1 MiB is refused at start, naming the file. */
static void test_tokens_file_bound(void **state)
{
    char dir[4200], tok[4300], db[4300];
    snprintf(dir, sizeof dir, "%s", tu_path("bigtokens"));
    sh_rm_rf(dir);
    TU_OK(sh_mkdir_p(dir, 0700));
    snprintf(tok, sizeof tok, "%s/tokens.json", dir);
    snprintf(db, sizeof db, "%s/s.db", dir);
    size_t n = (1u << 20) + 1;
    char *t = malloc(n + 1);
    const char *json = "{\"admin\":\"a1\",\"agent\":\"g1\",\"tenants\":{}}";
    memset(t, ' ', n);
    memcpy(t, json, strlen(json));
    tu_write_file(tok, t, n);
    free(t);
    chmod(tok, 0600);
    srv_config cfg = {.db_path = db, .tokens_path = tok, .heartbeat_timeout = 3600, .manual_cycles = 1};
    srv *s = NULL;
    int rc = srv_start(&cfg, &s);
    if (rc == 0) {
        srv_stop(s);
        fail_msg("a tokens file of 1 MiB + 1 byte was taken");
    }
    if (!strstr(sh_errmsg(), "tokens.json")) fail_msg("the refusal does not name the file: %s", sh_errmsg());
}

/* The costs count every place of a job, up to its 64th: an elastic job of
 * 64 replicas whose last one is the only one of its GPU type is billed for
 * that type too. */
static void test_costs_of_64_places(void **state)
{
    tf_fleet *f = fx_up();
    quiesce(f);
    for (int k = 0; k < 63; k++) {
        char name[32];
        snprintf(name, sizeof name, "sa%d", k);
        free(reg(f, name, "SA", 1, 0));
    }
    /* The dearest pool is placed last: its one node is the 64th place. */
    free(reg(f, "sb0", "SB", 1, 3600));
    int64_t e = submit_as(f, TF_BOB, "{\"name\":\"wide\",\"kind\":\"elastic\",\"min_nodes\":64,\"max_nodes\":64,"
                                     "\"command\":[\"true\"],\"gpu_types\":[\"SA\",\"SB\"]}");
    cycle();
    assert_int_equal(members_in(f, e, "assigned"), 64);
    usleep(50000);
    int st;
    json_t *r = tf_call(f, TF_BOB, "GET", "/v1/costs", NULL, &st);
    json_t *g = json_object_get(json_object_get(json_object_get(r, "by_tenant"), "bob"), "SB");
    if (!g || json_real_value(json_object_get(g, "gpu_seconds")) <= 0 || json_real_value(json_object_get(g, "dollars")) <= 0)
        fail_msg("the 64th place's GPU type is not in the costs");
    json_decref(r);
    quiesce(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_idempotency_per_tenant, tf_teardown),
        cmocka_unit_test_teardown(test_writable_each_condition, tf_teardown),
        cmocka_unit_test(test_tenant_name_characters),
        cmocka_unit_test_teardown(test_rank_past_members, tf_teardown),
        cmocka_unit_test_teardown(test_routes_at_their_bounds, tf_teardown),
        cmocka_unit_test_teardown(test_agent_rank_past_members, tf_teardown),
        cmocka_unit_test(test_node_lost_takes_its_jobs),
        cmocka_unit_test(test_elastic_grow_and_shrink),
        cmocka_unit_test(test_costs_of_open_bills),
        cmocka_unit_test(test_idempotency_header_bounds),
        cmocka_unit_test(test_auth_header_forms),
        cmocka_unit_test(test_queue_bound_exact),
        cmocka_unit_test(test_list_defaults),
        cmocka_unit_test(test_agent_reports),
        cmocka_unit_test(test_run_services),
        cmocka_unit_test(test_spec_checks),
        cmocka_unit_test(test_tokens_file_bound),
        cmocka_unit_test(test_costs_of_64_places),
    };
    return cmocka_run_group_tests(tests, NULL, fx_down);
}
