/* The server's API against a real `shoal server` on loopback: tenant
 * isolation, roles, bad requests, idempotent submits (body, header and CLI)
 * and never-fitting jobs.  Each test starts its own server and agents, so
 * that any one runs alone (SHOAL_TEST_FILTER) and in any order. */
#include "fleet_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static tf_fleet F;

/* A fresh server (its own folder and database) with two 8-GPU agents. */
static int setup(void **state)
{
    static int n;
    char name[32];
    snprintf(name, sizeof name, "api-%d", n++);
    memset(&F, 0, sizeof F);
    tf_start_server(&F, name, 30);
    tf_start_agents(&F, 2, "H100", 8, "z1", "ib");
    return 0;
}

static int teardown(void **state)
{
    tf_stop(&F);
    tf_kill_all();
    return 0;
}

static const char *err_of(json_t *j) { return json_string_value(json_object_get(j, "error")); }

static void expect_error(const char *token, const char *method, const char *path, const char *body,
                         int want, const char *needle)
{
    int st;
    json_t *j = tf_call(&F, token, method, path, body, &st);
    if (st != want || !j || !err_of(j) || !strstr(err_of(j), needle))
        fail_msg("%s %s: got %d \"%s\", expected %d with \"%s\"", method, path, st, j ? err_of(j) : "(not JSON)", want, needle);
    json_decref(j);
}

/* The value of the sample named exactly `name` in Prometheus text. */
static long long metric(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; (p = strstr(p, name)); p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ') return atoll(p + n + 1);
    fail_msg("metric %s is missing", name);
    return -1;
}

static const char *sleeper = "{\"name\":\"%s\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"sleep\",\"30\"]}";

static void test_tenant_isolation(void **state)
{
    char body[256];
    snprintf(body, sizeof body, sleeper, "alice-job");
    int64_t a = tf_submit(&F, TF_ALICE, body);
    snprintf(body, sizeof body, sleeper, "bob-job");
    int64_t b = tf_submit(&F, TF_BOB, body);
    json_decref(tf_wait_job(&F, a, "running", 20));
    json_decref(tf_wait_job(&F, b, "running", 20));
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)a);
    expect_error(TF_BOB, "GET", path, NULL, 404, "no such job");
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)a);
    expect_error(TF_BOB, "POST", path, NULL, 404, "no such job");
    snprintf(path, sizeof path, "/v1/jobs/%lld/logs", (long long)a);
    expect_error(TF_BOB, "GET", path, NULL, 404, "no such job");
    /* Bob's list, nodes view, events and costs show nothing of Alice's. */
    int st;
    const char *views[] = {"/v1/jobs", "/v1/nodes", "/v1/events", "/v1/costs", "/v1/overview"};
    for (int i = 0; i < 5; i++) {
        json_t *j = tf_call(&F, TF_BOB, "GET", views[i], NULL, &st);
        assert_int_equal(st, 200);
        char *text = json_dumps(j, JSON_COMPACT);
        if (strstr(text, "alice")) fail_msg("bob's %s shows alice's work: %s", views[i], text);
        free(text);
        json_decref(j);
    }
    json_t *j = tf_call(&F, TF_BOB, "GET", "/v1/jobs", NULL, &st);
    assert_int_equal(json_array_size(json_object_get(j, "jobs")), 1);
    json_decref(j);
    /* The nodes view places each job on its node: the admin sees both by
     * id, bob sees his own and alice's as an anonymous busy slot. */
    int64_t seen_admin = 0, seen_bob = 0;
    for (int who = 0; who < 2; who++) {
        j = tf_call(&F, who ? TF_BOB : TF_ADMIN, "GET", "/v1/nodes", NULL, &st);
        size_t i, k;
        json_t *n, *p;
        json_array_foreach(json_object_get(j, "nodes"), i, n) json_array_foreach(json_object_get(n, "jobs"), k, p) {
            int64_t id = json_integer_value(json_object_get(p, "job"));
            int64_t bit = id == a ? 1 : id == b ? 2 : id == 0 ? 4 : 8;
            if (who) seen_bob |= bit;
            else seen_admin |= bit;
        }
        json_decref(j);
    }
    assert_int_equal(seen_admin, 3);
    assert_int_equal(seen_bob, 6);
    /* The admin sees both; the agent token reaches only /v1/agent/. */
    j = tf_call(&F, TF_ADMIN, "GET", "/v1/jobs?state=running", NULL, &st);
    assert_true(json_array_size(json_object_get(j, "jobs")) >= 2);
    json_decref(j);
    expect_error(TF_AGENT, "GET", "/v1/jobs", NULL, 403, "agent token");
    expect_error(TF_ALICE, "POST", "/v1/agent/poll", "{\"node\":\"n0\"}", 403, "agent token");
    /* Alice cancels her own job; bob's keeps running. */
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)a);
    j = tf_call(&F, TF_ALICE, "POST", path, NULL, &st);
    assert_int_equal(st, 200);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "cancelled");
    json_decref(j);
    json_decref(tf_wait_job(&F, b, "running", 1));
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)b);
    json_decref(tf_call(&F, TF_ADMIN, "DELETE", path, NULL, &st));
    assert_int_equal(st, 200);
    json_decref(tf_wait_job(&F, b, "cancelled", 5));
}

static void test_bad_requests(void **state)
{
    /* One job that ended (cancelled), for the counters below. */
    char sb[256];
    snprintf(sb, sizeof sb, sleeper, "ended");
    int64_t ended_id = tf_submit(&F, TF_ALICE, sb);
    json_decref(tf_wait_job(&F, ended_id, "running", 20));
    char cp[64];
    snprintf(cp, sizeof cp, "/v1/jobs/%lld/cancel", (long long)ended_id);
    int cst;
    json_decref(tf_call(&F, TF_ALICE, "POST", cp, NULL, &cst));
    assert_int_equal(cst, 200);
    expect_error(NULL, "GET", "/v1/jobs", NULL, 401, "missing bearer token");
    expect_error("nope", "GET", "/v1/jobs", NULL, 401, "unknown bearer token");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\": \"x\", \"kind\": ", 400, "invalid JSON");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "[1,2]", 400, "expected a JSON object");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"command\":[\"true\"],\"nodes\":1,\"colour\":1}", 400,
                 "unknown field \"colour\"");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"command\":[\"true\"]}", 400, "missing field \"nodes\"");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":\"2\",\"command\":[\"true\"]}", 400,
                 "expected an integer");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":0,\"command\":[\"true\"]}", 400, "outside 1..64");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"kind\":\"batch\",\"command\":[\"true\"]}", 400,
                 "\"batch\" is not one of gang|elastic|function");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":1,\"command\":[]}", 400, "field \"command\"");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":1,\"command\":[\"true\"],\"env\":{\"SHOAL_RANK\":\"9\"}}",
                 400, "reserved");
    expect_error(TF_ALICE, "POST", "/v1/jobs",
                 "{\"name\":\"x\",\"nodes\":1,\"command\":[\"true\"],\"env\":{\"SHOAL_RUN_SECRET\":\"hunter2\"}}", 400,
                 "expected 32 hex digits");
    /* A gang larger than any zone's worth of matching nodes never fits. */
    /* Zones cannot be pinned, so a job asking for one is refused, not
     * silently placed in any zone. */
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":1,\"zone\":\"z1\",\"command\":[\"true\"]}",
                 400, "field \"zone\" is not supported");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":1,\"replace_wait_s\":-1,\"command\":[\"true\"]}",
                 400, "outside 0..86400");
    /* A rank holds 1 to 16 GPUs (the scheduler's node): 0 and 17 are refused
     * at submit, not left pending for ever. */
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":1,\"gpus_per_node\":0,\"command\":[\"true\"]}",
                 400, "\"gpus_per_node\": 0 is outside 1..16");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":1,\"gpus_per_node\":17,\"command\":[\"true\"]}",
                 400, "outside 1..16");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":3,\"command\":[\"true\"]}", 422, "can never fit");
    expect_error(TF_ALICE, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":1,\"gpu_types\":[\"B300\"],\"command\":[\"true\"]}", 422,
                 "can never fit");
    expect_error(TF_ALICE, "GET", "/v1/nope", NULL, 404, "no such endpoint");
    expect_error(TF_ALICE, "GET", "/v1/jobs/abc", NULL, 404, "no such job");
    expect_error(TF_ALICE, "GET", "/v1/jobs/99999", NULL, 404, "no such job");
    /* An oversized body: 2 MiB against the 1 MiB default. */
    size_t n = 2 << 20;
    char *big = malloc(n + 1);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    big[n] = 0;
    expect_error(TF_ALICE, "POST", "/v1/jobs", big, 413, "larger than");
    free(big);
    /* Garbage on the socket: the server answers 400 or closes, and lives. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)F.port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    const char *junk = "\x01\x02 NOT HTTP\r\n\r\n";
    assert_true(write(fd, junk, strlen(junk)) > 0);
    char buf[256];
    ssize_t r = read(fd, buf, sizeof buf - 1);
    if (r > 0) {
        buf[r] = 0;
        assert_non_null(strstr(buf, " 400 "));
    }
    close(fd);
    int st;
    json_t *j = tf_call(&F, NULL, "GET", "/healthz", NULL, &st);
    assert_int_equal(st, 200);
    json_decref(j);
    /* /metrics counts what happened, in Prometheus text. */
    client_conn *c;
    TU_OK(client_new(F.url, NULL, &c));
    char *text;
    size_t tl;
    TU_OK(client_raw(c, "GET", "/metrics", NULL, 0, NULL, 5, &st, &text, &tl));
    assert_int_equal(st, 200);
    assert_non_null(strstr(text, "# TYPE shoal_jobs gauge"));
    assert_non_null(strstr(text, "shoal_nodes{state=\"alive\"} 2"));
    assert_non_null(strstr(text, "shoal_jobs_rejected_total 2"));
    /* The core holds exactly the live jobs: every ended or rejected job was
     * forgotten once its bill was final. */
    long long live = metric(text, "shoal_jobs{state=\"pending\"}") + metric(text, "shoal_jobs{state=\"starting\"}") +
                    metric(text, "shoal_jobs{state=\"running\"}");
    long long ended = metric(text, "shoal_jobs{state=\"succeeded\"}") + metric(text, "shoal_jobs{state=\"failed\"}") +
                     metric(text, "shoal_jobs{state=\"cancelled\"}");
    assert_true(ended >= 1);
    assert_int_equal(metric(text, "shoal_sched_jobs"), live);
    assert_int_equal(metric(text, "shoal_sched_jobs_forgotten_total"), ended + 2);
    free(text);
    client_free(c);
}

static void test_idempotent_submit(void **state)
{
    const char *body = "{\"name\":\"once\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"],\"idempotency_key\":\"k-1\"}";
    int st;
    json_t *a = tf_call(&F, TF_ALICE, "POST", "/v1/jobs", body, &st);
    assert_int_equal(st, 201);
    json_t *b = tf_call(&F, TF_ALICE, "POST", "/v1/jobs", body, &st);
    assert_int_equal(st, 200);
    assert_true(json_is_true(json_object_get(b, "duplicate")));
    assert_int_equal(json_integer_value(json_object_get(a, "id")), json_integer_value(json_object_get(b, "id")));
    /* The same key from another tenant is another job. */
    json_t *c = tf_call(&F, TF_BOB, "POST", "/v1/jobs", body, &st);
    assert_int_equal(st, 201);
    assert_int_not_equal(json_integer_value(json_object_get(a, "id")), json_integer_value(json_object_get(c, "id")));
    json_decref(tf_wait_job(&F, json_integer_value(json_object_get(a, "id")), "succeeded", 20));
    json_decref(tf_wait_job(&F, json_integer_value(json_object_get(c, "id")), "succeeded", 20));
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

/* The Idempotency-Key header, as a retrying client sends it. */
static void test_idempotent_header(void **state)
{
    client_conn *c;
    TU_OK(client_new(F.url, TF_ALICE, &c));
    json_t *body = json_loads("{\"name\":\"hdr\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"]}", 0, NULL);
    int st;
    json_t *a, *b, *d;
    TU_OK(client_call(c, "POST", "/v1/jobs", body, "Idempotency-Key: h-1", 10, &st, &a));
    assert_int_equal(st, 201);
    TU_OK(client_call(c, "POST", "/v1/jobs", body, "Idempotency-Key: h-1", 10, &st, &b));
    assert_int_equal(st, 200);
    assert_true(json_is_true(json_object_get(b, "duplicate")));
    assert_int_equal(json_integer_value(json_object_get(a, "id")), json_integer_value(json_object_get(b, "id")));
    /* Another key is another job. */
    TU_OK(client_call(c, "POST", "/v1/jobs", body, "Idempotency-Key: h-2", 10, &st, &d));
    assert_int_equal(st, 201);
    assert_int_not_equal(json_integer_value(json_object_get(a, "id")), json_integer_value(json_object_get(d, "id")));
    json_decref(tf_wait_job(&F, json_integer_value(json_object_get(a, "id")), "succeeded", 20));
    json_decref(a), json_decref(b), json_decref(d), json_decref(body);
    client_free(c);
}

/* `shoal submit --idempotency-key`: a retry of the command prints the job
 * the first one created. */
static void test_idempotent_cli(void **state)
{
    const char *job = tu_path("cli-job.json");
    const char *text = "{\"name\":\"cli\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"]}";
    tu_write_file(job, text, strlen(text));
    char *out[3];
    int64_t id[3];
    const char *tok[3] = {TF_ALICE, TF_ALICE, TF_BOB};
    for (int i = 0; i < 3; i++) {
        int rc = tu_run(&out[i], "%s submit %s --idempotency-key c-1 --server %s --token %s --json", tu_shoal(), job,
                        F.url, tok[i]);
        if (rc) fail_msg("shoal submit exited %d: %s", rc, out[i]);
        json_t *j = json_loads(out[i], 0, NULL);
        if (!j) fail_msg("shoal submit --json printed no JSON: %s", out[i]);
        id[i] = json_integer_value(json_object_get(j, "id"));
        assert_true(id[i] > 0);
        assert_int_equal(json_is_true(json_object_get(j, "duplicate")), i == 1);
        json_decref(j);
        free(out[i]);
    }
    assert_int_equal(id[0], id[1]);
    assert_int_not_equal(id[0], id[2]); /* the same key from bob is bob's job */
    /* The plain output says so too. */
    char *o;
    assert_int_equal(tu_run(&o, "%s submit %s --idempotency-key c-1 --server %s --token %s", tu_shoal(), job, F.url,
                            TF_ALICE), 0);
    if (!strstr(o, "already submitted")) fail_msg("the retried submit printed: %s", o);
    free(o);
}

/* Each token reaches only its own endpoints. */
static void test_roles(void **state)
{
    expect_error(TF_AGENT, "GET", "/v1/jobs", NULL, 403, "agent token");
    expect_error(TF_AGENT, "GET", "/v1/nodes", NULL, 403, "agent token");
    expect_error(TF_AGENT, "POST", "/v1/jobs", "{\"name\":\"x\",\"nodes\":1,\"command\":[\"true\"]}", 403, "agent token");
    expect_error(TF_ALICE, "POST", "/v1/agent/poll", "{\"node\":\"n0\"}", 403, "agent token");
    expect_error(TF_BOB, "POST", "/v1/agent/register", "{\"name\":\"evil\"}", 403, "agent token");
    expect_error(TF_ALICE, "DELETE", "/v1/nodes/n0", NULL, 403, "only the admin removes nodes");
    /* A token matches whole: not a prefix, not a repetition. */
    expect_error("tok-", "GET", "/v1/jobs", NULL, 401, "unknown bearer token");
    expect_error("tok-admintok-admin", "GET", "/v1/jobs", NULL, 401, "unknown bearer token");
    expect_error("tok-admi", "GET", "/v1/jobs", NULL, 401, "unknown bearer token");
    int st;
    json_t *j = tf_call(&F, TF_ADMIN, "GET", "/v1/nodes", NULL, &st);
    assert_int_equal(st, 200);
    assert_int_equal(json_array_size(json_object_get(j, "nodes")), 2);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tenant_isolation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotent_submit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotent_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotent_cli, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roles, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
