/* Escape tests (docs/security.md): a hostile tenant's jobs, a forged node
 * and a careless client against a real server and real agents on loopback.
 * Each attack must fail for the attacker, and the reason must be on record:
 * in the job's own log (what the kernel answered), in the HTTP error, or in
 * the job's events.  The sandbox attacks run under bubblewrap and, where
 * runsc works on this host, under gVisor. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fleet_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shoal/agent.h"

static const char *err_of(json_t *j) { return json_string_value(json_object_get(j, "error")); }

static void expect_error(tf_fleet *f, const char *token, const char *method, const char *path, const char *body,
                         int want, const char *needle)
{
    int st;
    json_t *j = tf_call(f, token, method, path, body, &st);
    if (st != want || !j || !err_of(j) || !strstr(err_of(j), needle))
        fail_msg("%s %s: got %d \"%s\", expected %d with \"%s\"", method, path, st, j ? err_of(j) : "(not JSON)",
                 want, needle);
    json_decref(j);
}

/* Submits `script` under sh -c as a one-GPU function of `token`. */
static int64_t submit_sh(tf_fleet *f, const char *token, const char *name, const char *script)
{
    json_t *b = json_pack("{s:s,s:s,s:i,s:[s,s,s]}", "name", name, "kind", "function", "gpus", 1, "command", "sh",
                          "-c", script);
    char *text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    int64_t id = tf_submit(f, token, text);
    free(text);
    return id;
}

/* The same with one "writable" directory. */
static int64_t submit_writable(tf_fleet *f, const char *token, const char *name, const char *script, const char *dir)
{
    json_t *b = json_pack("{s:s,s:s,s:i,s:[s],s:[s,s,s]}", "name", name, "kind", "function", "gpus", 1, "writable",
                          dir, "command", "sh", "-c", script);
    char *text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    int64_t id = tf_submit(f, token, text);
    free(text);
    return id;
}


/* Waits until the log of a running job holds `needle`. */
static char *wait_in_log(tf_fleet *f, int64_t id, const char *needle, double timeout)
{
    for (double until = sh_now_mono() + timeout; sh_now_mono() < until; sh_sleep(0.05)) {
        char *l = tf_job_log(f, id);
        if (strstr(l, needle)) return l;
        free(l);
    }
    char *l = tf_job_log(f, id);
    fail_msg("job %lld: \"%s\" never appeared in its log:\n%s", (long long)id, needle, l);
    return NULL;
}

static void log_has(const char *what, const char *log, const char *needle)
{
    if (!strstr(log, needle)) fail_msg("%s: the log lacks \"%s\":\n%s", what, needle, log);
}

static void log_lacks(const char *what, const char *log, const char *needle)
{
    if (strstr(log, needle)) fail_msg("%s: the attack worked (\"%s\" in the log):\n%s", what, needle, log);
}

static void cancel(tf_fleet *f, int64_t id)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)id);
    int st;
    json_decref(tf_call(f, TF_ADMIN, "POST", path, NULL, &st));
    assert_int_equal(st, 200);
}

/* A raw mount(2), as an attacker with Python would call it. */
#define PY_MOUNT(src, dst, type, flags, data)                                                              \
    "python3 -c \"import ctypes,os; l=ctypes.CDLL(None,use_errno=True); r=l.mount(" src "," dst "," type \
    "," flags "," data "); print('" #flags "', 'ESCAPED' if r == 0 else os.strerror(ctypes.get_errno()))\""

/* Every sandbox attack of the issue, as jobs on one fleet. */
static void escapes(const char *mode)
{
    tf_fleet f = {0};
    snprintf(f.agent_extra, sizeof f.agent_extra, "--sandbox %s", mode);
    char name[32];
    snprintf(name, sizeof name, "esc-%s", mode);
    tf_start_server(&f, name, 10);
    /* 16 GPUs a node: a one-GPU rank's share is 256 tasks, so that the
     * fork bomb meets its limit soon even on a loaded machine. */
    tf_start_agents(&f, 2, "H100", 16, "z", "ib");
    char script[4096];
    /* A victim of another tenant keeps a secret in its work directory. */
    int64_t victim = submit_sh(&f, TF_ALICE, "victim", "echo victim-secret > secret; echo dir=$PWD; exec sleep 60");
    char *vl = wait_in_log(&f, victim, "dir=", 20);
    char vdir[1024] = "";
    sscanf(strstr(vl, "dir=") + 4, "%1023s", vdir);
    free(vl);

    /* 1. Capabilities and uid. */
    int64_t caps = submit_sh(&f, TF_BOB, "caps",
                             "echo uid=$(id -u); grep -E 'CapEff|NoNewPrivs' /proc/self/status;"
                             " [ \"$(id -u)\" = 0 ] && echo ESCAPED-uid0;"
                             " grep -q 'CapEff:[[:space:]]*0000000000000000' /proc/self/status || echo ESCAPED-caps");
    /* 2. Remount / read-write and write a host file. */
    snprintf(script, sizeof script,
             PY_MOUNT("b'none'", "b'/'", "None", "0x1020", "None") "; touch /usr/shoal-escape-%d 2>&1 || echo write-refused",
             (int)getpid());
    int64_t remount = submit_sh(&f, TF_BOB, "remount", script);
    /* 3. Host secrets: shadow, the tokens file, the database, other
     * members' work directories. */
    snprintf(script, sizeof script,
             "cat /etc/shadow 2>&1; cat %s/tokens.json 2>&1; head -c 64 %s/state.db 2>&1; echo;"
             " for d in %s/work/*; do echo other:$d; done; cat %s/secret 2>&1;"
             " mv %s %s.moved 2>/dev/null && echo ESCAPED-moved-state || echo move-refused; echo end",
             f.dir, f.dir, f.dir, vdir, f.dir, f.dir);
    int64_t secrets = submit_writable(&f, TF_BOB, "secrets", script, tu_tmpdir());
    /* 5. The host's /proc: other processes and the agent's token. */
    snprintf(script, sizeof script,
             "n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo procs=$n;"
             " cat /proc/%d/cmdline 2>&1 | tr '\\0' ' '; echo; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c tok-",
             (int)f.agents[0]);
    int64_t proc = submit_sh(&f, TF_BOB, "proc", script);
    /* 6. The cgroup escape: reach the hierarchy, move out, mount it. */
    int64_t cg = submit_sh(&f, TF_BOB, "cgroup",
                           "n=0; for e in /sys/fs/cgroup/*; do [ -e \"$e\" ] && n=$((n+1)); done; echo cgroup-entries=$n;"
                           " (echo $$ > /sys/fs/cgroup/pids/cgroup.procs) 2>/dev/null && echo ESCAPED-move || echo move-refused;"
                           " mkdir -p /tmp/cg; " PY_MOUNT("b'cgroup'", "b'/tmp/cg'", "b'cgroup'", "0", "b'pids'"));
    /* 7. A fork bomb under the default limits (1 GPU of 16: 256 tasks). */
    /* Each child forks and blocks opening a FIFO, with no exec: the bomb
     * reaches its limit in a fraction of a second, even on a busy host. */
    int64_t bomb = submit_sh(&f, TF_BOB, "bomb",
                             "mkfifo /tmp/f; i=0; while [ $i -lt 3000 ]; do (read x < /tmp/f) & i=$((i+1)); done;"
                             " echo forked=$i; wait");

    char *l = tf_wait_log(&f, caps, 60, NULL);
    log_has("caps", l, "CapEff:\t0000000000000000");
    log_lacks("caps", l, "ESCAPED");
    log_lacks("caps", l, "uid=0\n");
    free(l);
    l = tf_wait_log(&f, remount, 60, NULL);
    log_has("remount", l, "Operation not permitted");
    log_has("remount", l, "write-refused");
    log_lacks("remount", l, "ESCAPED");
    char esc[64];
    snprintf(esc, sizeof esc, "/usr/shoal-escape-%d", (int)getpid());
    assert_false(sh_path_exists(esc));
    free(l);
    l = tf_wait_log(&f, secrets, 60, NULL);
    log_has("secrets", l, "/etc/shadow: Permission denied");
    log_has("secrets", l, "tokens.json: No such file or directory");
    log_lacks("secrets", l, TF_ADMIN);
    log_lacks("secrets", l, "root:");
    log_lacks("secrets", l, "SQLite format");
    log_lacks("secrets", l, "victim-secret");
    log_has("secrets", l, "other:"); /* the glob ran, and listed at most its own directory */
    /* The folder holds the state directory and is now bob's: the hidden
     * state directory still cannot be moved away. */
    log_has("secrets", l, "move-refused");
    log_lacks("secrets", l, "ESCAPED");
    char *other = strstr(l, "other:");
    assert_null(strstr(other + 6, "other:"));
    free(l);
    l = tf_wait_log(&f, proc, 60, NULL);
    log_lacks("proc", l, TF_AGENT);
    int procs = atoi(strstr(l, "procs=") + 6);
    if (procs > 8) fail_msg("proc: %d processes visible:\n%s", procs, l);
    free(l);
    l = tf_wait_log(&f, cg, 60, NULL);
    log_has("cgroup", l, "cgroup-entries=0");
    log_has("cgroup", l, "move-refused");
    log_has("cgroup", l, "Operation not permitted");
    log_lacks("cgroup", l, "ESCAPED");
    free(l);
    /* The shell gives up at its first failed fork (under gVisor the
     * sandbox dies); the agent says which limit stopped it. */
    l = tf_wait_log(&f, bomb, 120, NULL);
    log_has("bomb", l, "hit its pids limit");
    log_lacks("bomb", l, "forked=3000");
    free(l);
    /* The node survived: it still runs new work. */
    l = tf_wait_log(&f, submit_sh(&f, TF_ALICE, "after", "echo alive"), 60, NULL);
    log_has("after the bomb", l, "alive");
    free(l);
    cancel(&f, victim);
    tf_stop(&f);
}

static void test_escapes_bwrap(void **state) { escapes("bwrap"); }

static void test_escapes_gvisor(void **state)
{
    char s[256];
    if (agent_probe_sandbox("gvisor", s, sizeof s) < 0) {
        fprintf(stderr, "skipped: gVisor cannot run here: %s\n", sh_errmsg());
        skip();
    }
    escapes("gvisor");
}

/* 4. "writable" outside what the admin allows. */
static void test_writable_outside_allowed(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "writable", 10);
    char body[1024];
    const char *bad[][2] = {{"/etc", "not under a directory the admin allows"},
                            {f.dir, "lies in the server's state directory"},
                            {"/usr", "not under a directory the admin allows"},
                            {"/tmp/../etc", "is not a plain absolute path"}};
    for (int i = 0; i < 4; i++) {
        snprintf(body, sizeof body, "{\"name\":\"w\",\"nodes\":1,\"writable\":[\"%s\"],\"command\":[\"true\"]}", bad[i][0]);
        expect_error(&f, TF_ALICE, "POST", "/v1/jobs", body, i == 3 ? 400 : 403, bad[i][1]);
    }
    tf_stop(&f);
}

/* Registers a fake node with the join token; returns its credential. */
static char *fake_node(tf_fleet *f, const char *name)
{
    char body[256];
    snprintf(body, sizeof body, "{\"name\":\"%s\",\"gpu_type\":\"EVIL\",\"gpus\":1}", name);
    int st;
    json_t *j = tf_call(f, TF_AGENT, "POST", "/v1/agent/register", body, &st);
    assert_int_equal(st, 200);
    char *cred = strdup(json_string_value(json_object_get(j, "credential")));
    json_decref(j);
    return cred;
}

static int events_have(tf_fleet *f, int64_t id, const char *kind, const char *needle)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/events", (long long)id);
    int st, found = 0;
    json_t *j = tf_call(f, TF_ADMIN, "GET", path, NULL, &st);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(j, "events"), i, e)
        found |= !strcmp(json_string_value(json_object_get(e, "kind")), kind) &&
                 (!needle || strstr(json_string_value(json_object_get(e, "msg")), needle));
    json_decref(j);
    return found;
}

/* 8-10. Forged reports, and credentials on the wrong API. */
static void test_credentials(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "creds", 10);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    char *evil = fake_node(&f, "evil");
    int64_t id = submit_sh(&f, TF_ALICE, "target", "echo real; exec sleep 60");
    json_decref(tf_wait_job(&f, id, "running", 30));
    char body[512];
    /* Node evil reports alice's rank (placed on n0) as exited 0. */
    snprintf(body, sizeof body,
             "{\"node\":\"evil\",\"members\":[{\"job\":%lld,\"attempt\":1,\"rank\":0,\"state\":\"exited\",\"exit_code\":0}]}",
             (long long)id);
    expect_error(&f, evil, "POST", "/v1/agent/poll", body, 403, "may only report its own members");
    snprintf(body, sizeof body, "{\"node\":\"evil\",\"logs\":[{\"job\":%lld,\"rank\":0,\"data\":\"FORGED\\n\"}]}",
             (long long)id);
    expect_error(&f, evil, "POST", "/v1/agent/poll", body, 403, "may only report its own members");
    /* ... or polls as n0. */
    expect_error(&f, evil, "POST", "/v1/agent/poll", "{\"node\":\"n0\"}", 403, "belongs to node evil");
    json_decref(tf_wait_job(&f, id, "running", 1));
    char *l = tf_job_log(&f, id);
    log_lacks("forged log", l, "FORGED");
    free(l);
    assert_true(events_have(&f, id, "refused", "node evil sent a report"));
    assert_true(events_have(&f, id, "refused", "node evil sent output"));
    /* The admin token does not reach the agent API; agent credentials do
     * not reach the tenant API. */
    expect_error(&f, TF_ADMIN, "POST", "/v1/agent/poll", "{\"node\":\"n0\"}", 403, "admin token does not reach");
    expect_error(&f, TF_ADMIN, "POST", "/v1/agent/register", "{\"name\":\"x\",\"gpu_type\":\"H100\",\"gpus\":1}", 403,
                 "admin token does not reach");
    expect_error(&f, TF_AGENT, "GET", "/v1/jobs", NULL, 403, "only reach /v1/agent/");
    expect_error(&f, TF_AGENT, "POST", "/v1/agent/poll", "{\"node\":\"n0\"}", 403, "node's credential");
    expect_error(&f, evil, "GET", "/v1/nodes", NULL, 403, "only reach /v1/agent/");
    expect_error(&f, evil, "POST", "/v1/agent/register", "{\"name\":\"n0\",\"gpu_type\":\"H100\",\"gpus\":8}", 403,
                 "needs the agent token");
    free(evil);
    /* A rank shares the host network, so it reaches the server's port: its
     * /metrics without a token shows the fleet, not alice's running bill. */
    char script[512];
    snprintf(script, sizeof script,
             "python3 -c \"import urllib.request as u; print(u.urlopen('%s/metrics').read().decode())\"", f.url);
    int64_t spy = submit_sh(&f, TF_BOB, "spy", script);
    char *m = tf_wait_log(&f, spy, 30, NULL);
    if (!strstr(m, "shoal_gpus{state=\"used\"}")) fail_msg("the spy did not reach /metrics:\n%s", m);
    log_lacks("alice's bill on /metrics", m, "alice");
    free(m);
    cancel(&f, id);
    tf_stop(&f);
}

/* Bad tenant names stop the server at start, with the rule broken. */
static void test_tenant_names(void **state)
{
    const char *bad[][2] = {{"", "must be 1 to 63"}, {"admin", "is reserved"}, {"Bad Name", "must start"},
                            {"a/b", "may only hold"}};
    for (int i = 0; i < 4; i++) {
        char dir[4200], tok[4300], text[512], *out = NULL;
        snprintf(dir, sizeof dir, "%s", tu_path("names"));
        sh_rm_rf(dir);
        TU_OK(sh_mkdir_p(dir, 0700));
        snprintf(tok, sizeof tok, "%s/tokens.json", dir);
        snprintf(text, sizeof text, "{\"admin\":\"a1\",\"agent\":\"g1\",\"tenants\":{\"%s\":\"t1\"}}", bad[i][0]);
        tu_write_file(tok, text, strlen(text));
        int rc = tu_run(&out, "%s server --tokens %s --db %s/s.db --port 0", tu_shoal(), tok, dir);
        if (rc == 0 || !strstr(out, bad[i][1])) fail_msg("tenant \"%s\": exit %d, output:\n%s", bad[i][0], rc, out);
        free(out);
    }
}

/* Malformed Idempotency-Key headers and ill-typed or unknown query
 * parameters are refused, not ignored. */
static void test_bad_query_and_key(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "query", 10);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    expect_error(&f, TF_ALICE, "GET", "/v1/jobs?state=bogus", NULL, 400, "state=\"bogus\"");
    expect_error(&f, TF_ALICE, "GET", "/v1/jobs?limit=-1", NULL, 400, "limit=\"-1\"");
    expect_error(&f, TF_ALICE, "GET", "/v1/jobs?limt=5", NULL, 400, "unknown query parameter \"limt\"");
    expect_error(&f, TF_ALICE, "GET", "/v1/events?after=x", NULL, 400, "after=\"x\"");
    expect_error(&f, TF_ALICE, "GET", "/v1/costs?tenant=bob", NULL, 400, "unknown query parameter \"tenant\"");
    int64_t id = submit_sh(&f, TF_ALICE, "q", "true");
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%lld/logs?rank=abc", (long long)id);
    expect_error(&f, TF_ALICE, "GET", path, NULL, 400, "rank=\"abc\"");
    const char *keys[] = {"Idempotency-Key: \xff\xfe-retry", "Idempotency-Key: has space"};
    for (int i = 0; i < 2; i++) {
        client_conn *c;
        TU_OK(client_new(f.url, TF_ALICE, &c));
        const char *b = "{\"name\":\"k\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"true\"]}";
        int st;
        char *r = NULL;
        size_t rl;
        TU_OK(client_raw(c, "POST", "/v1/jobs", b, strlen(b), keys[i], 5, &st, &r, &rl));
        client_free(c);
        if (st != 400 || !strstr(r, "Idempotency-Key")) fail_msg("%s: got %d %s", keys[i], st, r);
        free(r);
    }
    tf_stop(&f);
}

static unsigned mode_of(const char *p)
{
    struct stat st;
    if (stat(p, &st) < 0) fail_msg("stat %s failed", p);
    return st.st_mode & 0777;
}

/* Secrets, state and logs are private from their first byte, and the server
 * warns about a tokens file others can read. */
static void test_file_modes(void **state)
{
    const char *dir = tu_path("up-modes");
    sh_rm_rf(dir);
    char db[4200], out[4200], envf[4200], p[4300], fleet[4200];
    snprintf(db, sizeof db, "%s/st/shoal.db", dir);
    snprintf(out, sizeof out, "%s/up.out", tu_tmpdir());
    snprintf(envf, sizeof envf, "%s/st/env", dir);
    snprintf(fleet, sizeof fleet, "%s/fleet.csv", tu_tmpdir());
    const char *csv = "name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nm0,L4,1,z,e,1.0\n";
    tu_write_file(fleet, csv, strlen(csv));
    char *argv[] = {(char *)tu_shoal(), "up", "--fleet", fleet, "--db", db, "--port", "0", NULL};
    pid_t up = tf_spawn(out, argv);
    for (int i = 0; i < 400 && !sh_path_exists(envf); i++) sh_sleep(0.025);
    assert_true(sh_path_exists(envf));
    snprintf(p, sizeof p, "%s/st", dir);
    assert_int_equal(mode_of(p), 0700);
    snprintf(p, sizeof p, "%s/st/tokens.json", dir);
    assert_int_equal(mode_of(p), 0600);
    assert_int_equal(mode_of(envf), 0600);
    assert_int_equal(mode_of(db), 0600);
    snprintf(p, sizeof p, "%s-wal", db);
    assert_int_equal(mode_of(p), 0600);
    kill(up, SIGTERM);
    /* A server given a tokens file others can read says so. */
    tf_fleet f = {0};
    tf_start_server(&f, "lax", 10);
    snprintf(p, sizeof p, "%s/tokens.json", f.dir);
    chmod(p, 0644);
    tf_stop(&f);
    tf_restart_server(&f);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    char *text;
    size_t len;
    snprintf(p, sizeof p, "%s/server.out", f.dir);
    TU_OK(sh_read_file(p, 1 << 20, &text, &len));
    if (!strstr(text, "readable by others")) fail_msg("no warning in %s:\n%s", p, text);
    free(text);
    /* Logs: a private directory, private files. */
    int64_t id = submit_sh(&f, TF_ALICE, "m", "echo x");
    free(tf_wait_log(&f, id, 30, NULL));
    snprintf(p, sizeof p, "%s/logs", f.dir);
    assert_int_equal(mode_of(p), 0700);
    snprintf(p, sizeof p, "%s/logs/%lld/0.log", f.dir, (long long)id);
    assert_int_equal(mode_of(p), 0600);
    tf_stop(&f);
}

/* Counts the lines of a file (0 if missing). */
static int lines_of(const char *path)
{
    char *t;
    size_t n;
    if (sh_read_file(path, 1 << 20, &t, &n) < 0) return 0;
    int k = 0;
    for (size_t i = 0; i < n; i++) k += t[i] == '\n';
    free(t);
    return k;
}

/* A server restart keeps running ranks running and finished ranks
 * finished: nothing is requeued and the decision is an event. */
static void test_restart_keeps_ranks(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "restart", 10);
    tf_start_agents(&f, 2, "H100", 8, "z", "ib");
    const char *out = tu_path("restart-out");
    sh_rm_rf(out);
    TU_OK(sh_mkdir_p(out, 0755));
    char body[1024];
    /* Rank 1 finishes at once; rank 0 counts its starts and keeps running. */
    snprintf(body, sizeof body,
             "{\"name\":\"r\",\"nodes\":2,\"gpus_per_node\":1,\"writable\":[\"%s\"],\"command\":[\"sh\",\"-c\","
             "\"[ $RANK = 1 ] && exit 0; echo start >> %s/starts; exec sleep 60\"]}",
             out, out);
    int64_t id = tf_submit(&f, TF_ALICE, body);
    json_decref(tf_wait_job(&f, id, "running", 30));
    char starts[4200];
    snprintf(starts, sizeof starts, "%s/starts", out);
    for (int i = 0; i < 200 && lines_of(starts) < 1; i++) sh_sleep(0.05);
    sh_sleep(0.5); /* rank 1's exit reaches the server */
    kill(f.server, SIGKILL);
    waitpid(f.server, NULL, 0);
    tf_restart_server(&f);
    sh_sleep(2.0); /* agents reconcile through several polls */
    json_t *j = tf_wait_job(&f, id, "running", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "attempt")), 1);
    json_decref(j);
    assert_int_equal(lines_of(starts), 1);
    assert_true(events_have(&f, id, "restored", "kept running"));
    assert_false(events_have(&f, id, "requeue", NULL));
    cancel(&f, id);
    tf_stop(&f);
}

/* With the database unable to grow (a file-size limit on the server, as a
 * full disk), a cancel fails and changes nothing: the job stays running,
 * its rank is untouched, and so after a restart. */
static void test_disk_full_cancel(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "full", 10);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    int64_t id = submit_sh(&f, TF_ALICE, "full", "while :; do echo tick; sleep 0.1; done");
    json_decref(tf_wait_job(&f, id, "running", 30));
    free(wait_in_log(&f, id, "tick", 20));
    char wal[4200];
    snprintf(wal, sizeof wal, "%s/state.db-wal", f.dir);
    struct stat st;
    TU_OK(stat(wal, &st) == 0 ? 0 : -1);
    /* Nothing the server writes may grow past its size now. */
    struct rlimit rl = {(rlim_t)st.st_size, RLIM_INFINITY};
    if (prlimit(f.server, RLIMIT_FSIZE, &rl, NULL) < 0) fail_msg("prlimit: %s", strerror(errno));
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)id);
    int code;
    json_t *j = tf_call(&f, TF_ALICE, "POST", path, NULL, &code);
    if (code < 500 || !strstr(err_of(j), "was not cancelled")) fail_msg("cancel: %d %s", code, err_of(j));
    json_decref(j);
    sh_sleep(1.0);
    json_decref(tf_wait_job(&f, id, "running", 1));
    char *a = tf_job_log(&f, id);
    size_t before = strlen(a);
    free(a);
    rl.rlim_cur = rl.rlim_max = RLIM_INFINITY;
    if (prlimit(f.server, RLIMIT_FSIZE, &rl, NULL) < 0) fail_msg("prlimit: %s (the server is %s)", strerror(errno), kill(f.server, 0) == 0 ? "alive" : "gone");
    sh_sleep(0.5);
    a = tf_job_log(&f, id);
    if (strlen(a) <= before) fail_msg("the rank stopped writing after the failed cancel");
    free(a);
    /* After a restart the job is still running, on the same attempt. */
    kill(f.server, SIGKILL);
    waitpid(f.server, NULL, 0);
    tf_restart_server(&f);
    sh_sleep(1.0);
    j = tf_wait_job(&f, id, "running", 5);
    assert_int_equal(json_integer_value(json_object_get(j, "attempt")), 1);
    json_decref(j);
    cancel(&f, id);
    json_decref(tf_wait_job(&f, id, "cancelled", 5));
    tf_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_escapes_bwrap, tf_teardown),
        cmocka_unit_test_teardown(test_escapes_gvisor, tf_teardown),
        cmocka_unit_test_teardown(test_writable_outside_allowed, tf_teardown),
        cmocka_unit_test_teardown(test_credentials, tf_teardown),
        cmocka_unit_test_teardown(test_tenant_names, tf_teardown),
        cmocka_unit_test_teardown(test_bad_query_and_key, tf_teardown),
        cmocka_unit_test_teardown(test_file_modes, tf_teardown),
        cmocka_unit_test_teardown(test_restart_keeps_ranks, tf_teardown),
        cmocka_unit_test_teardown(test_disk_full_cancel, tf_teardown),
    };
    /* SHOAL_TEST_ONLY=test_name runs one test (for debugging). */
    if (getenv("SHOAL_TEST_ONLY")) cmocka_set_test_filter(getenv("SHOAL_TEST_ONLY"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
