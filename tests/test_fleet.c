/* End-to-end control plane: real server and agents on loopback.
 *  - a gang launches all-or-nothing, with the SHOAL_* and torchrun variables;
 *  - a killed agent marks its node dead and each failure policy runs;
 *  - kill -9 of the server under a stream of submits loses and duplicates
 *    nothing, agents reconnect and a running job is kept, not restarted. */
#include "fleet_util.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *slurp(const char *path)
{
    char *t;
    size_t n;
    return sh_read_file(path, 1 << 20, &t, &n) == 0 ? t : NULL;
}

static const char *env_val(const char *env, const char *key, char *out, size_t cap)
{
    char k[64];
    snprintf(k, sizeof k, "\n%s=", key);
    const char *p = strstr(env, k);
    if (!p) return NULL;
    p += strlen(k);
    snprintf(out, cap, "%.*s", (int)strcspn(p, "\n"), p);
    return out;
}

static void test_gang_all_or_nothing(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "gang", 30);
    tf_start_agents(&f, 3, "H100", 8, "z1", "ib");
    const char *out = tu_path("gang-out");
    sh_rm_rf(out);
    sh_mkdir_p(out, 0755);
    /* Hold one node's agent: its member cannot get ready, so no member may
     * run its command, however long the others wait. */
    kill(f.agents[2], SIGSTOP);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"name\":\"g\",\"nodes\":3,\"gpus_per_node\":4,\"writable\":[\"%s\"],\"command\":[\"sh\",\"-c\","
             "\"(echo; env) > %s/env.$RANK; echo $SHOAL_NODE > %s/started.$RANK\"]}",
             out, out, out);
    int64_t id = tf_submit(&f, TF_ALICE, body);
    sh_sleep(1.0);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    int st;
    json_t *j = tf_call(&f, TF_ALICE, "GET", path, NULL, &st);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "starting");
    int ready = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "members"), i, m) ready += !strcmp(json_string_value(json_object_get(m, "state")), "ready");
    assert_int_equal(ready, 2);
    json_decref(j);
    for (int r = 0; r < 3; r++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/started.%d", out, r);
        if (sh_path_exists(p)) fail_msg("rank %d ran before the whole gang was ready", r);
    }
    kill(f.agents[2], SIGCONT);
    j = tf_wait_job(&f, id, "succeeded", 20);
    char master[64] = "", port[16] = "", v[128];
    for (int r = 0; r < 3; r++) {
        char p[4200], want[32];
        snprintf(p, sizeof p, "%s/env.%d", out, r);
        char *env = slurp(p);
        if (!env) fail_msg("rank %d wrote no environment", r);
        snprintf(want, sizeof want, "%d", r);
        const char *eq[][2] = {{"SHOAL_RANK", want}, {"RANK", want}, {"NODE_RANK", want}, {"LOCAL_RANK", "0"},
                               {"SHOAL_WORLD_SIZE", "3"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"},
                               {"SHOAL_NODE", tf_member_node(j, r)}, {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}};
        for (size_t k = 0; k < sizeof eq / sizeof eq[0]; k++) {
            if (!env_val(env, eq[k][0], v, sizeof v) || strcmp(v, eq[k][1]))
                fail_msg("rank %d: %s=%s, expected %s", r, eq[k][0], env_val(env, eq[k][0], v, sizeof v) ? v : "(unset)", eq[k][1]);
        }
        snprintf(want, sizeof want, "%lld", (long long)id);
        assert_string_equal(env_val(env, "SHOAL_JOB_ID", v, sizeof v), want);
        /* Every rank agrees on the rendezvous point. */
        env_val(env, "MASTER_PORT", v, sizeof v);
        if (r == 0) snprintf(port, sizeof port, "%s", v);
        else assert_string_equal(v, port);
        env_val(env, "MASTER_ADDR", v, sizeof v);
        if (r == 0) snprintf(master, sizeof master, "%s", v);
        else assert_string_equal(v, master);
        free(env);
    }
    json_decref(j);
    tf_stop(&f);
}

/* One failure-policy scenario: a gang of 2 on its own fleet of `nag` nodes,
 * whose rank 1 loses its node.  The scenarios run side by side so that their
 * heartbeat windows overlap. */
typedef struct policy_case {
    tf_fleet f;
    int64_t id;
    char victim[32];
    json_t *first; /* the job as it ran before the kill */
    int a;         /* its attempt then */
    const char *out;
} policy_case;

/* Starts the fleets side by side (servers, then every agent, then every
 * gang) and waits until each gang runs.  `extra` adds fields to the job file
 * ("" or ",\"k\":v"). */
static void policy_setup(policy_case *c, int n, const char *const (*cfg)[4], const int *nag)
{
    for (int k = 0; k < n; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s-%d", cfg[k][0], nag[k]);
        c[k].out = tu_path(cfg[k][2]);
        sh_rm_rf(c[k].out);
        sh_mkdir_p(c[k].out, 0755);
        tf_start_server(&c[k].f, name, 3.0); /* short, yet above the stalls of a loaded machine */
    }
    for (int k = 0; k < n; k++) tf_spawn_agents(&c[k].f, nag[k], "A100", 8, "z1", "ib");
    for (int k = 0; k < n; k++) tf_wait_agents(&c[k].f, nag[k]);
    for (int k = 0; k < n; k++) {
        const char *out = c[k].out;
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"name\":\"p\",\"nodes\":2,\"gpus_per_node\":8,\"max_attempts\":10,\"on_failure\":\"%s\"%s,\"writable\":[\"%s\"],"
                 "\"command\":[\"sh\",\"-c\",\"trap 'echo stopped > %s/stopped.$RANK.$SHOAL_ATTEMPT; exit 143' TERM;"
                 " echo $SHOAL_NODE > %s/started.$RANK.$SHOAL_ATTEMPT; while :; do sleep 0.05; done\"]}",
                 cfg[k][0], cfg[k][1], out, out, out);
        c[k].id = tf_submit(&c[k].f, TF_ALICE, body);
    }
    for (int k = 0; k < n; k++) c[k].first = tf_wait_job(&c[k].f, c[k].id, "running", 20);
}

/* Kills the agent of the node under rank 1 (as the job last ran). */
static void policy_kill(policy_case *c)
{
    json_decref(c->first);
    c->first = tf_wait_job(&c->f, c->id, "running", 20);
    c->a = (int)json_integer_value(json_object_get(c->first, "attempt"));
    snprintf(c->victim, sizeof c->victim, "%s", tf_member_node(c->first, 1));
    int a = tf_agent_of(&c->f, c->victim);
    assert_true(a >= 0);
    kill(c->f.agents[a], SIGKILL);
    waitpid(c->f.agents[a], NULL, 0);
    c->f.agents[a] = 0;
}

static void assert_file(const char *out, const char *name)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", out, name);
    for (int i = 0; i < 200 && !sh_path_exists(p); i++) sh_sleep(0.025);
    if (!sh_path_exists(p)) fail_msg("%s is missing", p);
}

/* Waits for the attempt after `first` to run.  A loaded machine may already
 * have moved the job on (a stalled agent missing its window), so attempts
 * are counted from the one the test killed, not from 1. */
static json_t *next_attempt(tf_fleet *f, int64_t id, int first)
{
    json_t *j = NULL;
    for (int i = 0; i < 200; i++) {
        json_decref(j);
        j = tf_wait_job(f, id, "running", 20);
        if (json_integer_value(json_object_get(j, "attempt")) > first) break;
        sh_sleep(0.05);
    }
    assert_true(json_integer_value(json_object_get(j, "attempt")) > first);
    return j;
}

static void check_requeue(policy_case *c)
{
    tf_fleet *f = &c->f;
    int64_t id = c->id;
    const char *victim = c->victim, *out = c->out;
    char name[64];
    int a = c->a;
    /* The next attempt runs on the two nodes left; the survivor was stopped. */
    json_t *j = next_attempt(f, id, a);
    for (int r = 0; r < 2; r++) assert_string_not_equal(tf_member_node(j, r), victim);
    snprintf(name, sizeof name, "stopped.0.%d", a);
    assert_file(out, name);
    for (int r = 0; r < 2; r++) {
        snprintf(name, sizeof name, "started.%d.%d", r, a + 1);
        assert_file(out, name);
    }
    int st;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/events", (long long)id);
    json_t *ev = tf_call(f, TF_ALICE, "GET", path, NULL, &st);
    char *text = json_dumps(ev, 0);
    assert_non_null(strstr(text, "\"requeue\""));
    assert_non_null(strstr(text, "died"));
    free(text);
    json_decref(ev);
    json_decref(j);
}

static void check_replace(policy_case *c)
{
    const char *out = c->out;
    char keep[32], name[64];
    int a = c->a;
    snprintf(keep, sizeof keep, "%s", tf_member_node(c->first, 0));
    json_t *j = next_attempt(&c->f, c->id, a);
    /* The surviving node keeps its rank; the dead one is replaced. */
    assert_string_equal(tf_member_node(j, 0), keep);
    assert_string_not_equal(tf_member_node(j, 1), c->victim);
    snprintf(name, sizeof name, "stopped.0.%d", a);
    assert_file(out, name);
    snprintf(name, sizeof name, "started.1.%d", a + 1);
    assert_file(out, name);
    json_decref(j);
}

/* Whether the job's event log holds an event of `kind`. */
static int has_event(tf_fleet *f, const char *token, int64_t id, const char *kind)
{
    int st;
    char path[64], needle[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/events", (long long)id);
    snprintf(needle, sizeof needle, "\"%s\"", kind);
    json_t *ev = tf_call(f, token, "GET", path, NULL, &st);
    char *text = json_dumps(ev, 0);
    int found = text && strstr(text, needle) != NULL;
    free(text);
    json_decref(ev);
    return found;
}

/* replace with no spare node: the survivors wait replace_wait_s, then the
 * job falls back to a requeue and runs again once a node joins. */
static void check_replace_times_out(policy_case *c)
{
    tf_fleet *f = &c->f;
    int64_t id = c->id;
    const char *victim = c->victim, *out = c->out;
    char name[64];
    int a = c->a;
    snprintf(name, sizeof name, "stopped.0.%d", a);
    assert_file(out, name);
    /* Heartbeat window (3 s) + replace wait (1 s), with slack for a loaded
     * machine; nothing can replace the node, so only the fallback ends it. */
    for (int i = 0; i < 300 && !has_event(f, TF_ALICE, id, "requeue"); i++) sh_sleep(0.05);
    if (!has_event(f, TF_ALICE, id, "requeue")) fail_msg("job %lld: the replace wait never fell back to a requeue", (long long)id);
    assert_true(has_event(f, TF_ALICE, id, "replace"));
    json_t *j = tf_wait_job(f, id, "pending", 5);
    json_decref(j);
    tf_start_agent(f, 2, "A100", 8, "z1", "ib");
    j = next_attempt(f, id, a);
    for (int r = 0; r < 2; r++) assert_string_not_equal(tf_member_node(j, r), victim);
    for (int r = 0; r < 2; r++) {
        snprintf(name, sizeof name, "started.%d.%d", r, (int)json_integer_value(json_object_get(j, "attempt")));
        assert_file(out, name);
    }
    json_decref(j);
}

static void check_fail(policy_case *c)
{
    char name[64];
    snprintf(name, sizeof name, "stopped.0.%d", c->a);
    json_t *j = tf_wait_job(&c->f, c->id, "failed", 20);
    assert_non_null(strstr(json_string_value(json_object_get(j, "reason")), "died"));
    assert_file(c->out, name);
    json_decref(j);
}

/* A killed agent marks its node dead and each job's failure policy runs:
 * requeue, replace (with a spare node), fail, and replace with no spare,
 * which falls back to a requeue after replace_wait_s.  Each scenario has its
 * own fleet; the agents are killed together so the windows overlap. */
static void test_killed_agent_policies(void **state)
{
    static policy_case c[4];
    memset(c, 0, sizeof c);
    static const char *const cfg[4][4] = {{"requeue", "", "requeue-out"},
                                           {"replace", "", "replace-out"},
                                           {"fail", "", "fail-out"},
                                           {"replace", ",\"replace_wait_s\":1", "replace-timeout-out"}};
    static const int nag[4] = {3, 3, 3, 2};
    policy_setup(c, 4, cfg, nag);
    for (int i = 0; i < 4; i++) policy_kill(&c[i]);
    check_requeue(&c[0]);
    check_replace(&c[1]);
    check_fail(&c[2]);
    check_replace_times_out(&c[3]);
    for (int i = 0; i < 4; i++) {
        json_decref(c[i].first);
        tf_stop(&c[i].f);
    }
}

/* The loader: submits N jobs with idempotency keys, retrying each until the
 * server answers, across the crash. Exits 0 when every one was accepted. */
static int loader(tf_fleet *f, int n)
{
    client_conn *c;
    if (client_new(f->url, TF_BOB, &c) < 0) return 2;
    for (int i = 0; i < n; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"name\":\"load-%d\",\"kind\":\"function\",\"command\":[\"true\"],\"idempotency_key\":\"key-%d\"}", i, i);
        for (int tries = 0;; tries++) {
            int st = 0;
            char *r = NULL;
            size_t rl;
            int rc = client_raw(c, "POST", "/v1/jobs", body, strlen(body), NULL, 5, &st, &r, &rl);
            free(r);
            if (rc == 0 && (st == 201 || st == 200)) break;
            if (rc == 0 || tries > 400) return 3; /* an HTTP error is a real failure */
            sh_sleep(0.025);
        }
    }
    client_free(c);
    return 0;
}

static void test_server_kill9_under_load(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "crash", 5);
    tf_start_agents(&f, 2, "L4", 8, "z1", "eth");
    const char *out = tu_path("crash-out");
    sh_rm_rf(out);
    sh_mkdir_p(out, 0755);
    /* A long job that must survive the crash without a restart: it appends a
     * line per start, so two lines would mean it ran twice. */
    char body[512];
    snprintf(body, sizeof body,
             "{\"name\":\"long\",\"nodes\":2,\"gpus_per_node\":8,\"writable\":[\"%s\"],\"command\":[\"sh\",\"-c\","
             "\"echo $SHOAL_ATTEMPT >> %s/starts.$RANK; while :; do sleep 0.05; done\"]}", out, out);
    int64_t long_id = tf_submit(&f, TF_ALICE, body);
    json_decref(tf_wait_job(&f, long_id, "running", 20));
    int n = 400;
    pid_t p = fork();
    if (p == 0) _exit(loader(&f, n));
    sh_sleep(0.3);
    kill(f.server, SIGKILL);
    waitpid(f.server, NULL, 0);
    sh_sleep(0.3);
    tf_restart_server(&f);
    int st;
    waitpid(p, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    tf_wait_alive(&f, 2, 10);
    /* Every key is there exactly once. */
    json_t *j = tf_call(&f, TF_ADMIN, "GET", "/v1/jobs?limit=100000", NULL, &st);
    char *seen = calloc((size_t)n, 1);
    size_t i;
    json_t *v;
    int total = 0;
    json_array_foreach(json_object_get(j, "jobs"), i, v) {
        const char *name = json_string_value(json_object_get(v, "name"));
        if (strncmp(name, "load-", 5)) continue;
        int k = atoi(name + 5);
        assert_true(k >= 0 && k < n);
        if (seen[k]++) fail_msg("load-%d is duplicated", k);
        total++;
    }
    assert_int_equal(total, n);
    free(seen);
    json_decref(j);
    /* The long job ran through the crash: attempt 1, started once per rank. */
    j = tf_wait_job(&f, long_id, "running", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "attempt")), 1);
    json_decref(j);
    sh_sleep(0.5);
    for (int r = 0; r < 2; r++) {
        char pth[4200];
        snprintf(pth, sizeof pth, "%s/starts.%d", out, r);
        char *t = slurp(pth);
        assert_non_null(t);
        assert_string_equal(t, "1\n");
        free(t);
    }
    tf_stop(&f);
}

/* A crash can cut the last chunk of a log (a power cut, a full disk).  The
 * server is killed with -9 while a rank writes, its log file is cut inside
 * the last record as such a crash would leave it, and after the restart the
 * log must read as whole lines only: the cut chunk is gone, nothing is glued
 * onto its remains, and the output written after the restart is there. */
static void test_log_torn_tail(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "logs", 5);
    tf_start_agent(&f, 0, "L4", 1, "z", "eth");
    int64_t id = tf_submit(&f, TF_ALICE, "{\"name\":\"chatty\",\"nodes\":1,\"command\":[\"sh\",\"-c\","
                                         "\"i=0; while [ $i -lt 80 ]; do echo line $i; i=$((i+1)); sleep 0.02; done\"]}");
    json_decref(tf_wait_job(&f, id, "running", 20));
    char logf[4200];
    snprintf(logf, sizeof logf, "%s/logs/%lld/0.log", f.dir, (long long)id);
    struct stat st;
    for (int i = 0; i < 200 && (stat(logf, &st) < 0 || st.st_size < 200); i++) sh_sleep(0.02);
    kill(f.server, SIGKILL);
    waitpid(f.server, NULL, 0);
    assert_int_equal(stat(logf, &st), 0);
    assert_true(st.st_size > 3);
    assert_int_equal(truncate(logf, st.st_size - 3), 0);
    tf_restart_server(&f);
    json_decref(tf_wait_job(&f, id, "succeeded", 30));
    char *text = tf_job_log(&f, id);
    /* Every line is an attempt marker or "line N", N increasing, ending
     * with the last line the rank wrote (after the restart). */
    int last = -1, lines = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(l, "--- attempt", 11)) continue;
        int n = -1, used = 0;
        if (sscanf(l, "line %d%n", &n, &used) != 1 || l[used] || n <= last)
            fail_msg("log line %d is torn or out of order: \"%s\" after line %d", lines, l, last);
        last = n;
        lines++;
    }
    assert_int_equal(last, 79);
    assert_true(lines > 20);
    free(text);
    tf_stop(&f);
}

/* Counts the occurrences of needle in text (in one pass: ASan's strstr
 * measures the whole rest of the text at every call). */
static size_t count_of(const char *text, const char *needle)
{
    size_t n = 0, k = strlen(needle);
    for (const char *p = text; *p; p++)
        if (!strncmp(p, needle, k)) n++, p += k - 1;
    return n;
}

/* Appends one record of a rank log file as the server frames it
 * (docs/server-api.md, "Rank log files"), for logs an older server wrote. */
static void log_record(FILE *f, const void *data, uint32_t len)
{
    uint8_t hdr[8];
    for (int i = 0; i < 4; i++) hdr[i] = (uint8_t)(len >> (8 * i));
    sh_hasher *h = sh_hasher_new();
    sh_hasher_update(h, hdr, 4);
    sh_hasher_update(h, data, len);
    uint32_t c = (uint32_t)sh_hasher_digest(h).lo;
    sh_hasher_free(h);
    for (int i = 0; i < 4; i++) hdr[4 + i] = (uint8_t)(c >> (8 * i));
    fwrite(hdr, 1, 8, f);
    fwrite(data, 1, len, f);
}

/* A character cut by a read reaches the log whole.  The agent reads a
 * rank's pipe in pieces, and a rank that prints the first two bytes of
 * a euro sign and the last one a second later was logged as "x???" (each
 * piece cut alone).  The server writes records of at most 1 MiB and reads
 * windows of whole records: output sent in one poll of 1.5 MiB of euro
 * signs (a server that takes 4 MiB requests) was cut inside a character
 * at 1 MiB, and the first window read back as {} with no text. */
static void test_log_utf8_boundaries(void **state)
{
    tf_fleet f = {0};
    snprintf(f.extra, sizeof f.extra, "--max-body 4194304");
    tf_start_server(&f, "utf8", 10);
    tf_start_agent(&f, 0, "L4", 1, "z", "eth");
    int64_t id = tf_submit(&f, TF_ALICE, "{\"name\":\"euro\",\"nodes\":1,\"command\":[\"sh\",\"-c\","
                                         "\"printf 'x\\\\342\\\\202'; sleep 1; printf '\\\\254 y\\\\n'\"]}");
    json_decref(tf_wait_job(&f, id, "succeeded", 30));
    char *l = tf_job_log(&f, id);
    if (!strstr(l, "x\xe2\x82\xac y\n")) fail_msg("the euro sign cut by the pipe is not whole in the log:\n%s", l);
    free(l);

    /* The server's side, with a node of this test's own that sends the
     * rank's output in one poll. */
    int st;
    json_t *r = tf_call(&f, TF_AGENT, "POST", "/v1/agent/register", "{\"name\":\"big\",\"gpu_type\":\"BIG\",\"gpus\":1}", &st);
    assert_int_equal(st, 200);
    char *cred = strdup(json_string_value(json_object_get(r, "credential")));
    json_decref(r);
    id = tf_submit(&f, TF_ALICE, "{\"name\":\"big\",\"nodes\":1,\"gpu_types\":[\"BIG\"],\"command\":[\"true\"]}");
    json_decref(tf_wait_job(&f, id, "starting", 30));
    enum { EUROS = 500000 }; /* 1.5 MB: the 1 MiB mark falls inside the 349,526th */
    sh_buf body = {0};
    sh_buf_printf(&body, "{\"node\":\"big\",\"members\":[{\"job\":%lld,\"attempt\":1,\"rank\":0,\"state\":\"running\"}],"
                         "\"logs\":[{\"job\":%lld,\"attempt\":1,\"rank\":0,\"data\":\"", (long long)id, (long long)id);
    for (int i = 0; i < EUROS; i++) sh_buf_append(&body, "\xe2\x82\xac", 3);
    sh_buf_printf(&body, "\"}]}");
    sh_buf_append(&body, "", 1);
    json_decref(tf_call(&f, cred, "POST", "/v1/agent/poll", (char *)body.data, &st));
    assert_int_equal(st, 200);
    sh_buf_free(&body);
    free(cred);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%lld/logs?rank=0&offset=0", (long long)id);
    r = tf_call(&f, TF_ALICE, "GET", path, NULL, &st);
    assert_int_equal(st, 200);
    json_t *d = json_object_get(r, "data");
    if (!json_is_string(d)) fail_msg("the first window of the log has no text (%s)", json_dumps(r, 0));
    assert_true(json_string_length(d) >= (1 << 20)); /* one window, carried on to its character's end */
    json_decref(r);
    l = tf_job_log(&f, id);
    assert_int_equal(count_of(l, "\xe2\x82\xac"), EUROS);
    free(l);
    /* `shoal logs` prints every page, --follow or not (was: the first). */
    for (int json = 0; json < 2; json++) {
        char *o;
        assert_int_equal(tu_run(&o, "%s logs %lld --server %s --token %s%s", tu_shoal(), (long long)id, f.url, TF_ALICE,
                                json ? " --json" : ""),
                         0);
        if (count_of(o, "\xe2\x82\xac") != EUROS)
            fail_msg("shoal logs%s printed %zu of %d euro signs", json ? " --json" : "", count_of(o, "\xe2\x82\xac"),
                     EUROS);
        free(o);
    }
    /* A log an older server wrote: a first record of a whole window (1 MiB)
     * cut inside a character, whose last bytes start the next record.  The
     * window is carried on to the character's end; bytes no JSON string
     * holds read as '?', never as an empty reply. */
    char logf[4200];
    snprintf(logf, sizeof logf, "%s/logs/%lld/0.log", f.dir, (long long)id);
    FILE *lf = fopen(logf, "wb");
    assert_non_null(lf);
    uint8_t *w = malloc(1 << 20);
    for (uint32_t i = 0; i < (1 << 20); i++) w[i] = "\xe2\x82\xac"[i % 3]; /* ends after 0xe2 */
    log_record(lf, w, 1 << 20);
    log_record(lf, "\x82\xac end\n", 7);
    log_record(lf, "bad \xff byte\n", 11);
    fclose(lf);
    free(w);
    r = tf_call(&f, TF_ALICE, "GET", path, NULL, &st);
    d = json_object_get(r, "data");
    if (!json_is_string(d)) fail_msg("an old log's first window has no text (%s)", json_dumps(r, 0));
    assert_int_equal(json_string_length(d), (1 << 20) + 7);
    json_decref(r);
    l = tf_job_log(&f, id);
    assert_non_null(strstr(l, "\xe2\x82\xac end\nbad ? byte\n"));
    free(l);
    tf_stop(&f);
}

static int count_nodes(tf_fleet *f)
{
    int st;
    json_t *j = tf_call(f, TF_ADMIN, "GET", "/v1/nodes", NULL, &st);
    int n = (int)json_array_size(json_object_get(j, "nodes"));
    json_decref(j);
    return n;
}

/* Autoscaling: with no node at all, a job that fits the provider's quota
 * is accepted; the core asks for nodes, the local provider starts agents,
 * the job runs, and the idle nodes are released afterwards. */
static void test_autoscale_local_provider(void **state)
{
    tf_fleet f = {0};
    const char *prov = tu_path("provider.sh"), *pdir = tu_path("provider");
    char script[8400], shoal[4096];
    if (!realpath(tu_shoal(), shoal)) fail_msg("no %s", tu_shoal());
    int n = snprintf(script, sizeof script, "#!/bin/sh\nexec %s provider-local --dir %s\n", shoal, pdir);
    tu_write_file(prov, script, (size_t)n);
    chmod(prov, 0755);
    snprintf(f.extra, sizeof f.extra,
             "--provider-cmd %s --provider-quota z9,ib,H100,8,2,1.5 --scale-up-wait 0.3 --scale-down-idle 1", prov);
    tf_start_server(&f, "autoscale", 2);
    assert_int_equal(count_nodes(&f), 0);
    int64_t id = tf_submit(&f, TF_ALICE, "{\"name\":\"grow\",\"nodes\":2,\"gpus_per_node\":8,\"gpu_types\":[\"H100\"],"
                                         "\"command\":[\"true\"]}");
    json_t *j = tf_wait_job(&f, id, "succeeded", 30);
    assert_non_null(strstr(tf_member_node(j, 0), "auto-"));
    json_decref(j);
    for (int i = 0; i < 400 && count_nodes(&f) > 0; i++) sh_sleep(0.05);
    assert_int_equal(count_nodes(&f), 0);
    int st;
    j = tf_call(&f, TF_ADMIN, "GET", "/v1/events", NULL, &st);
    char *text = json_dumps(j, 0);
    assert_non_null(strstr(text, "scale_up"));
    assert_non_null(strstr(text, "scale_down"));
    free(text);
    json_decref(j);
    tf_stop(&f);
}

/* `shoal up` with the example fleet, driven through the command line. */
static void test_up_and_cli(void **state)
{
    const char *dir = tu_path("up");
    sh_rm_rf(dir);
    sh_mkdir_p(dir, 0755);
    char db[4200], out[4200], envf[4200];
    snprintf(db, sizeof db, "%s/shoal.db", dir);
    snprintf(out, sizeof out, "%s/up.out", dir);
    snprintf(envf, sizeof envf, "%s/env", dir);
    char *argv[] = {(char *)tu_shoal(), "up", "--fleet", "examples/fleet-local.csv", "--db", db, "--port", "0",
                    "--heartbeat-timeout", "5", NULL};
    tf_spawn(out, argv);
    char *env = NULL;
    for (int i = 0; i < 400 && !env; i++) {
        size_t len;
        if (sh_read_file(envf, 4096, &env, &len) < 0) env = NULL, sh_sleep(0.025);
    }
    assert_non_null(env);
    char url[128] = "", tok[128] = "";
    sscanf(strstr(env, "SHOAL_SERVER=") + 13, "%127s", url);
    sscanf(strstr(env, "SHOAL_TOKEN=") + 12, "%127s", tok);
    free(env);
    const char *sh = tu_shoal();
    char *o = NULL;
    /* All eight agents register. */
    for (int i = 0; i < 200; i++) {
        free(o);
        o = NULL;
        tu_run(&o, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s nodes --json", url, tok, sh);
        json_t *j = json_loads(o, 0, NULL);
        size_t n = json_array_size(json_object_get(j, "nodes"));
        json_decref(j);
        if (n == 8) break;
        sh_sleep(0.05);
    }
    assert_non_null(strstr(o, "h100-a3"));
    free(o);
    const char *jobf = tu_path("short.json");
    const char *job = "{\"name\":\"cli\",\"nodes\":2,\"gpus_per_node\":8,\"gpu_types\":[\"A100\"],"
                      "\"command\":[\"sh\",\"-c\",\"echo hello from $RANK\"]}";
    tu_write_file(jobf, job, strlen(job));
    assert_int_equal(tu_run(&o, "%s submit %s --server %s --token %s --json", sh, jobf, url, tok), 0);
    json_t *j = json_loads(o, 0, NULL);
    free(o);
    long long id = json_integer_value(json_object_get(j, "id"));
    json_decref(j);
    assert_true(id > 0);
    /* logs -f follows until the job ends. */
    assert_int_equal(tu_run(&o, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s logs %lld --rank 1 -f", url, tok, sh, id), 0);
    assert_non_null(strstr(o, "hello from 1"));
    free(o);
    assert_int_equal(tu_run(&o, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s job %lld", url, tok, sh, id), 0);
    assert_non_null(strstr(o, "succeeded"));
    free(o);
    assert_int_equal(tu_run(&o, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s jobs", url, tok, sh), 0);
    assert_non_null(strstr(o, "cli"));
    free(o);
    assert_int_equal(tu_run(&o, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s cost --json", url, tok, sh), 0);
    j = json_loads(o, 0, NULL);
    assert_non_null(json_object_get(json_object_get(json_object_get(j, "by_tenant"), "default"), "A100"));
    json_decref(j);
    free(o);
    /* Errors: a job that never fits, a bad token, a missing job. */
    const char *huge = tu_path("huge.json");
    const char *h = "{\"name\":\"huge\",\"nodes\":9,\"gpu_types\":[\"H100\"],\"command\":[\"true\"]}";
    tu_write_file(huge, h, strlen(h));
    assert_int_equal(tu_run(&o, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s submit %s", url, tok, sh, huge), 1);
    assert_non_null(strstr(o, "can never fit"));
    free(o);
    assert_int_equal(tu_run(&o, "SHOAL_SERVER=%s SHOAL_TOKEN=nope %s jobs", url, sh), 1);
    assert_non_null(strstr(o, "401"));
    free(o);
    assert_int_equal(tu_run(&o, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s cancel 999", url, tok, sh), 1);
    assert_non_null(strstr(o, "no such job"));
    free(o);
    assert_int_equal(tu_run(&o, "%s jobs --limit x", sh), 2);
    free(o);
    tf_kill_all();
}

/* `shoal up` on a port another process holds fails, says how to fix it, and
 * takes back what it created: a new state folder whole, and in a folder that
 * was there only its new tokens file and database (was: both left behind). */
static void test_up_busy_port(void **state)
{
    int port;
    int sock = tu_hold_port(&port);
    char top[4200], keep[4200], mine[4300], p[4300];
    snprintf(top, sizeof top, "%s", tu_path("up-new"));
    snprintf(keep, sizeof keep, "%s", tu_path("up-keep"));
    sh_rm_rf(top);
    sh_rm_rf(keep);
    sh_mkdir_p(keep, 0700);
    snprintf(mine, sizeof mine, "%s/mine.txt", keep);
    tu_write_file(mine, "mine\n", 5);
    char *o;
    assert_int_equal(tu_run(&o, "%s up --fleet examples/fleet-local.csv --db %s/a/b/shoal.db --port %d", tu_shoal(), top,
                            port),
                     1);
    if (!strstr(o, "cannot listen on 127.0.0.1:") || !strstr(o, "pick another with --port"))
        fail_msg("shoal up on a busy port said: %s", o);
    free(o);
    assert_false(sh_path_exists(top));
    assert_int_equal(tu_run(&o, "%s up --fleet examples/fleet-local.csv --db %s/shoal.db --port %d", tu_shoal(), keep, port),
                     1);
    free(o);
    assert_true(sh_path_exists(mine));
    const char *gone[] = {"tokens.json", "shoal.db", "shoal.db-wal", "shoal.db-shm"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", keep, gone[i]);
        if (sh_path_exists(p)) fail_msg("a failed shoal up left %s", p);
    }
    /* What was there stays: a database and tokens of an earlier run. */
    snprintf(p, sizeof p, "%s/shoal.db", keep);
    tu_write_file(p, "", 0);
    snprintf(p, sizeof p, "%s/tokens.json", keep);
    const char *t = "{\"admin\":\"a\",\"agent\":\"b\",\"tenants\":{\"default\":\"c\"}}";
    tu_write_file(p, t, strlen(t));
    assert_int_equal(tu_run(&o, "%s up --fleet examples/fleet-local.csv --db %s/shoal.db --port %d", tu_shoal(), keep, port),
                     1);
    free(o);
    assert_true(sh_path_exists(p));
    snprintf(p, sizeof p, "%s/shoal.db", keep);
    assert_true(sh_path_exists(p));
    close(sock);
}

/* `shoal up -d` returns once every agent has registered, leaves the fleet
 * running in the background, and `shoal down` stops it (was: the README's
 * `shoal up ... &` pasted with the next lines sourced an env file that did
 * not exist yet, and stopping it meant finding its pid). */
static void test_up_detach_down(void **state)
{
    const char *dir = tu_path("up-detach");
    sh_rm_rf(dir);
    const char *sh = tu_shoal();
    char *o;
    assert_int_equal(tu_run(&o, "%s up --fleet examples/fleet-local.csv --db %s/shoal.db --port 0 -d", sh, dir), 0);
    const char *bg = strstr(o, "running in the background (pid ");
    if (!bg || !strstr(o, "8 agents started") || strstr(o, "registered after")) fail_msg("shoal up -d said: %s", o);
    long pid = atol(bg + strlen("running in the background (pid "));
    free(o);
    assert_true(pid > 1);
    assert_int_equal(kill((pid_t)pid, 0), 0);
    /* Ready when it returned: the env file is there and every node is alive. */
    assert_int_equal(tu_run(&o, ". %s/env && %s nodes --json", dir, sh), 0);
    json_t *j = json_loads(o, 0, NULL);
    json_t *v;
    size_t i, alive = 0;
    json_array_foreach(json_object_get(j, "nodes"), i, v) alive += !strcmp(json_string_value(json_object_get(v, "state")), "alive");
    json_decref(j);
    free(o);
    assert_int_equal(alive, 8);
    /* A second one on the same folder is refused, naming the first. */
    assert_int_equal(tu_run(&o, "%s up --fleet examples/fleet-local.csv --db %s/shoal.db --port 0 -d", sh, dir), 1);
    char want[64];
    snprintf(want, sizeof want, "another shoal up (pid %ld)", pid);
    if (!strstr(o, want)) fail_msg("a second shoal up -d said: %s", o);
    free(o);
    assert_int_equal(tu_run(&o, "%s down --db %s/shoal.db", sh, dir), 0);
    assert_non_null(strstr(o, "stopped shoal up"));
    free(o);
    /* Gone with its agents (or a zombie until whoever adopted it reaps it):
     * nothing answers on its address. */
    char stat[64], *st = NULL;
    size_t sl;
    snprintf(stat, sizeof stat, "/proc/%ld/stat", pid);
    if (sh_read_file(stat, 4096, &st, &sl) == 0 && strrchr(st, ')') && strrchr(st, ')')[2] != 'Z')
        fail_msg("shoal up (pid %ld) still runs after shoal down: %s", pid, st);
    free(st);
    assert_int_not_equal(tu_run(&o, ". %s/env && %s nodes", dir, sh), 0);
    free(o);
    assert_int_equal(tu_run(&o, "%s down --db %s/shoal.db", sh, dir), 1);
    assert_non_null(strstr(o, "no shoal up runs on"));
    free(o);
    /* A start that fails in the background says why, in the foreground. */
    int port;
    int sock = tu_hold_port(&port);
    sh_rm_rf(dir);
    assert_int_equal(tu_run(&o, "%s up --fleet examples/fleet-local.csv --db %s/shoal.db --port %d -d", sh, dir, port), 1);
    if (!strstr(o, "cannot listen on 127.0.0.1:")) fail_msg("shoal up -d on a busy port said: %s", o);
    free(o);
    assert_false(sh_path_exists(dir));
    close(sock);
}

/* The sandbox: pids_max is enforced by the rank's cgroup, the root is
 * read-only, /tmp is private and the rank sees its own pid namespace. */
static void test_sandbox_limits(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "sandbox", 5);
    tf_start_agent(&f, 0, "L4", 4, "z", "eth");
    const char *out = tu_path("sandbox-out");
    sh_rm_rf(out);
    sh_mkdir_p(out, 0755);
    char body[1024];
    /* Forks until the pids limit stops it; reports how far it got. */
    snprintf(body, sizeof body,
             "{\"name\":\"forks\",\"nodes\":1,\"pids_max\":12,\"command\":[\"sh\",\"-c\","
             "\"n=0; while [ $n -lt 40 ]; do sleep 5 & n=$((n+1)); done; echo started $n\"]}");
    int64_t a = tf_submit(&f, TF_ALICE, body);
    json_t *j = tf_wait_job(&f, a, "failed", 20);
    json_decref(j);
    char marker[128];
    snprintf(marker, sizeof marker, "/tmp/shoal-sandbox-marker-%d", (int)getpid());
    tu_write_file(marker, "x", 1);
    snprintf(body, sizeof body,
             "{\"name\":\"probe\",\"nodes\":1,\"writable\":[\"%s\"],\"command\":[\"sh\",\"-c\","
             "\"echo $$ > %s/pid; touch /usr/x 2>/dev/null && echo rw > %s/root; ls %s 2>/dev/null | wc -l > %s/tmp\"]}",
             out, out, out, marker, out);
    int64_t b = tf_submit(&f, TF_ALICE, body);
    json_decref(tf_wait_job(&f, b, "succeeded", 20));
    char p[4200], *t;
    size_t n;
    snprintf(p, sizeof p, "%s/root", out);
    assert_false(sh_path_exists(p)); /* / is read-only inside */
    snprintf(p, sizeof p, "%s/tmp", out);
    assert_int_equal(sh_read_file(p, 64, &t, &n), 0);
    assert_int_equal(atoi(t), 0); /* a private /tmp: the host's file is not there */
    free(t);
    unlink(marker);
    snprintf(p, sizeof p, "%s/pid", out);
    assert_int_equal(sh_read_file(p, 64, &t, &n), 0);
    assert_true(atoi(t) < 10); /* a fresh pid namespace */
    free(t);

    /* A client built in a checkout under /tmp runs in a job, though the
     * private /tmp hides its folder: the program is shown read-only, and so
     * is the shoal-core it hands every other command to. */
    char dir[128], cmd[8600];
    snprintf(dir, sizeof dir, "/tmp/shoal-client-%d", (int)getpid());
    /* The optimised build: LeakSanitizer cannot run where ptrace is refused. */
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp build/shoal %s/shoal && cp build/shoal-core %s/shoal-core",
             dir, dir, dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(body, sizeof body, "{\"name\":\"client\",\"nodes\":1,\"command\":[\"%s/shoal\",\"delta\",\"--help\"]}",
             dir);
    int64_t c = tf_submit(&f, TF_ALICE, body);
    json_decref(tf_wait_job(&f, c, "succeeded", 20));
    snprintf(p, sizeof p, "%s/logs/%lld/0.log", f.dir, (long long)c);
    assert_int_equal(sh_read_file(p, 1 << 20, &t, &n), 0);
    assert_non_null(memmem(t, n, "usage: shoal delta make", 23)); /* shoal-core answered (framed log) */
    free(t);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    tf_stop(&f);
}

static int live_members(json_t *job)
{
    int n = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(job, "members"), i, m) {
        const char *st = json_string_value(json_object_get(m, "state"));
        n += !strcmp(st, "running") || !strcmp(st, "ready") || !strcmp(st, "assigned");
    }
    return n;
}

/* Elastic work fills idle GPUs and makes room when a higher-priority gang
 * arrives: the core's preempt/shrink decisions are carried out on the
 * agents, and no GPU is ever given twice. */
static void test_elastic_yields_to_gang(void **state)
{
    tf_fleet f = {0};
    /* alice's gang asks priority 10 to preempt her own elastic job: the
     * operator grants it (by default a tenant may not ask above 0). */
    snprintf(f.extra, sizeof f.extra, "--max-priority alice=10");
    tf_start_server(&f, "elastic", 5);
    tf_start_agent(&f, 0, "A100", 8, "z", "ib");
    const char *out = tu_path("elastic-out");
    sh_rm_rf(out);
    sh_mkdir_p(out, 0755);
    char body[512];
    snprintf(body, sizeof body,
             "{\"name\":\"rollouts\",\"kind\":\"elastic\",\"min_nodes\":1,\"max_nodes\":2,\"gpus_per_node\":8,"
             "\"writable\":[\"%s\"],\"command\":[\"sh\",\"-c\",\"echo $SHOAL_NODE > %s/replica.$RANK; exec sleep 60\"]}",
             out, out);
    int64_t e = tf_submit(&f, TF_BOB, body);
    /* One node: the job starts with the one replica that fits. */
    json_t *j = tf_wait_job(&f, e, "running", 20);
    assert_int_equal(live_members(j), 1);
    json_decref(j);
    assert_file(out, "replica.0");
    /* A second node joins: the job grows into its idle GPUs, and the new
     * replica really runs there. */
    tf_start_agent(&f, 1, "A100", 8, "z", "ib");
    j = NULL;
    for (int i = 0; i < 200; i++) {
        json_decref(j);
        j = tf_wait_job(&f, e, "running", 10);
        if (live_members(j) == 2) break;
        sh_sleep(0.05);
    }
    assert_int_equal(live_members(j), 2);
    assert_string_not_equal(tf_member_node(j, 0), tf_member_node(j, 1));
    json_decref(j);
    assert_file(out, "replica.1");
    assert_true(has_event(&f, TF_BOB, e, "grow"));
    int64_t g = tf_submit(&f, TF_ALICE, "{\"name\":\"train\",\"nodes\":2,\"gpus_per_node\":8,\"priority\":10,"
                                      "\"command\":[\"sleep\",\"60\"]}");
    json_decref(tf_wait_job(&f, g, "running", 20));
    int st;
    j = tf_call(&f, TF_ADMIN, "GET", "/v1/nodes", NULL, &st);
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(j, "nodes"), i, n)
        assert_true(json_integer_value(json_object_get(n, "gpus_used")) <= 8);
    json_decref(j);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)e);
    j = tf_call(&f, TF_ADMIN, "GET", path, NULL, &st);
    assert_int_equal(live_members(j), 0);
    json_decref(j);
    tf_stop(&f);
}

/* max_attempts counts node failures: with max_attempts 1 the first lost
 * node ends the job as failed, with the reason, instead of requeueing it. */
static void test_max_attempts(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "maxatt", 3.0);
    tf_start_agents(&f, 3, "A100", 8, "z1", "ib");
    int64_t id = tf_submit(&f, TF_ALICE, "{\"name\":\"m\",\"nodes\":2,\"gpus_per_node\":8,\"max_attempts\":1,"
                                         "\"on_failure\":\"requeue\",\"command\":[\"sleep\",\"60\"]}");
    json_t *j = tf_wait_job(&f, id, "running", 20);
    int a = tf_agent_of(&f, tf_member_node(j, 1));
    json_decref(j);
    assert_true(a >= 0);
    kill(f.agents[a], SIGKILL);
    waitpid(f.agents[a], NULL, 0);
    f.agents[a] = 0;
    j = tf_wait_job(&f, id, "failed", 30);
    const char *reason = json_string_value(json_object_get(j, "reason"));
    if (!reason || !strstr(reason, "gave up after 1 failure(s)")) fail_msg("reason: %s", reason ? reason : "(none)");
    assert_int_equal(json_integer_value(json_object_get(j, "attempt")), 1);
    json_decref(j);
    tf_stop(&f);
}

/* The state of node `name` in /v1/nodes ("" if missing). */
static const char *node_state(tf_fleet *f, const char *name)
{
    static char buf[32];
    int st;
    json_t *j = tf_call(f, TF_ADMIN, "GET", "/v1/nodes", NULL, &st);
    buf[0] = 0;
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(j, "nodes"), i, n)
        if (!strcmp(json_string_value(json_object_get(n, "name")), name))
            snprintf(buf, sizeof buf, "%s", json_string_value(json_object_get(n, "state")));
    json_decref(j);
    return buf;
}

/* A node whose agent stops polling dies after the heartbeat timeout: not
 * before (it was seen less than hb ago) and not much after (the server's
 * check runs every cycle).  The reason the server records, "no heartbeat
 * for X s", is checked against hb and against the time measured here. */
static void test_heartbeat_timing(void **state)
{
    const double hb = 3.0;
    tf_fleet f = {0};
    tf_start_server(&f, "heartbeat", hb);
    tf_start_agent(&f, 0, "A100", 8, "z", "ib");
    sh_sleep(0.3); /* a few polls */
    double t0 = sh_now_mono();
    kill(f.agents[0], SIGSTOP);
    double dead_at = 0;
    while (sh_now_mono() - t0 < 4 * hb) {
        if (!strcmp(node_state(&f, "n0"), "dead")) {
            dead_at = sh_now_mono() - t0;
            break;
        }
        sh_sleep(0.05);
    }
    kill(f.agents[0], SIGCONT);
    if (!dead_at) fail_msg("n0 still alive %.1f s after its agent stopped (heartbeat timeout %.1f s)", 4 * hb, hb);
    int st;
    json_t *ev = tf_call(&f, TF_ADMIN, "GET", "/v1/events", NULL, &st);
    assert_int_equal(st, 200);
    double recorded = -1;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(ev, "events"), i, e) {
        const char *kind = json_string_value(json_object_get(e, "kind"));
        const char *msg = json_string_value(json_object_get(e, "msg"));
        if (kind && msg && !strcmp(kind, "node_dead") && sscanf(msg, "no heartbeat for %lf s", &recorded) == 1) break;
    }
    json_decref(ev);
    if (recorded < 0) fail_msg("no node_dead event with \"no heartbeat for X s\"");
    print_message("heartbeat timeout %.1f s: the server recorded %.1f s; seen dead %.2f s after the stop\n", hb,
                  recorded, dead_at);
    /* Not before the timeout, and within a cycle or two of it (a doubled
     * timeout records 6 s or more). */
    if (recorded < hb) fail_msg("the node died after %.1f s without heartbeat, before the %.1f s timeout", recorded, hb);
    if (recorded > hb + 2.5) fail_msg("the node died after %.1f s without heartbeat, %.1f s past the timeout", recorded, recorded - hb);
    /* The last heartbeat came before the stop, so the recorded silence is at
     * least as long as the time from it to the death the server reports. */
    if (dead_at > recorded + 2.0) fail_msg("seen dead %.2f s after the stop, yet the server recorded %.1f s", dead_at, recorded);
    tf_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_heartbeat_timing, tf_teardown),
        cmocka_unit_test_teardown(test_max_attempts, tf_teardown),
        cmocka_unit_test_teardown(test_gang_all_or_nothing, tf_teardown),
        cmocka_unit_test_teardown(test_killed_agent_policies, tf_teardown),
        cmocka_unit_test_teardown(test_server_kill9_under_load, tf_teardown),
        cmocka_unit_test_teardown(test_log_torn_tail, tf_teardown),
        cmocka_unit_test_teardown(test_log_utf8_boundaries, tf_teardown),
        cmocka_unit_test_teardown(test_autoscale_local_provider, tf_teardown),
        cmocka_unit_test_teardown(test_up_and_cli, tf_teardown),
        cmocka_unit_test_teardown(test_up_busy_port, tf_teardown),
        cmocka_unit_test_teardown(test_up_detach_down, tf_teardown),
        cmocka_unit_test_teardown(test_sandbox_limits, tf_teardown),
        cmocka_unit_test_teardown(test_elastic_yields_to_gang, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
