/* Real fleets for the control-plane tests (see fleet_util.h). */
#include "fleet_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <grp.h>
#include <unistd.h>

/* Every process a test started, so that a failed test (which leaves its
 * function early) still stops them. */
static pid_t started[256];
static int nstarted;

void tf_kill_all(void)
{
    for (int i = 0; i < nstarted; i++)
        if (started[i] > 0 && kill(started[i], 0) == 0 && waitpid(started[i], NULL, WNOHANG) == 0) {
            kill(started[i], SIGTERM);
            for (int k = 0; k < 100 && waitpid(started[i], NULL, WNOHANG) == 0; k++) sh_sleep(0.02);
            kill(started[i], SIGKILL);
            waitpid(started[i], NULL, 0);
        }
    nstarted = 0;
}

pid_t tf_spawn_as(const char *out, uid_t uid, char *const argv[])
{
    if (!nstarted) atexit(tf_kill_all);
    pid_t parent = getpid();
    pid_t p = fork();
    if (p < 0) fail_msg("fork failed");
    if (p > 0 && nstarted < 256) started[nstarted++] = p;
    if (p == 0) {
        /* A test killed by its time limit takes its fleet with it. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (uid) {
            if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0) _exit(126);
            prctl(PR_SET_PDEATHSIG, SIGTERM); /* the change of credentials cleared it */
            if (getppid() != parent) _exit(1);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return p;
}

pid_t tf_spawn(const char *out, char *const argv[]) { return tf_spawn_as(out, 0, argv); }

static void start(tf_fleet *f)
{
    char db[4200], tokens[4200], out[4200], port[16], hb[32];
    snprintf(db, sizeof db, "%s/state.db", f->dir);
    snprintf(tokens, sizeof tokens, "%s/tokens.json", f->dir);
    snprintf(out, sizeof out, "%s/server.out", f->dir);
    snprintf(port, sizeof port, "%d", f->port);
    snprintf(hb, sizeof hb, "%g", f->hb);
    unlink(out);
    /* Jobs may write under the test's folder (it also holds the state
     * directory, which the server keeps out of any "writable"). */
    char *argv[24] = {(char *)tu_shoal(), "server", "--tokens", tokens, "--db", db, "--port", port,
                      "--heartbeat-timeout", hb, "--allow-writable", (char *)tu_tmpdir()};
    int k = 12;
    char extra[512];
    snprintf(extra, sizeof extra, "%s", f->extra);
    for (char *s = NULL, *t = strtok_r(extra, " ", &s); t && k < 22; t = strtok_r(NULL, " ", &s)) argv[k++] = t;
    argv[k] = NULL;
    f->server = tf_spawn(out, argv);
    for (int i = 0; i < 400; i++) {
        char *text;
        size_t len;
        if (sh_read_file(out, 1 << 20, &text, &len) == 0) {
            char *l = strstr(text, "listening on http://127.0.0.1:");
            if (l) {
                f->port = atoi(l + 30);
                snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d", f->port);
                free(text);
                return;
            }
            free(text);
        }
        int st;
        if (waitpid(f->server, &st, WNOHANG) == f->server) fail_msg("server exited at start (see %s)", out);
        sh_sleep(0.025);
    }
    fail_msg("server did not start (see %s)", out);
}

void tf_start_server(tf_fleet *f, const char *name, double hb)
{
    snprintf(f->dir, sizeof f->dir, "%s", tu_path(name));
    sh_rm_rf(f->dir);
    if (sh_mkdir_p(f->dir, 0755) < 0) fail_msg("mkdir %s", f->dir);
    char tokens[4200];
    snprintf(tokens, sizeof tokens, "%s/tokens.json", f->dir);
    const char *t = "{\"admin\":\"" TF_ADMIN "\",\"agent\":\"" TF_AGENT "\",\"tenants\":{\"alice\":\"" TF_ALICE
                    "\",\"bob\":\"" TF_BOB "\"}}";
    tu_write_file(tokens, t, strlen(t));
    chmod(tokens, 0600); /* the server warns about a tokens file others can read */
    f->hb = hb;
    f->port = 0;
    start(f);
}

void tf_restart_server(tf_fleet *f) { start(f); }

static void spawn_agent(tf_fleet *f, int i, const char *gpu_type, int gpus, const char *zone, const char *fabric)
{
    char out[4200], work[4200], g[16];
    snprintf(f->names[i], sizeof f->names[i], "n%d", i);
    snprintf(out, sizeof out, "%s/agent-%d.out", f->dir, i);
    if (f->agent_work[i][0]) snprintf(work, sizeof work, "%s", f->agent_work[i]);
    else snprintf(work, sizeof work, "%s/work", f->dir);
    snprintf(g, sizeof g, "%d", gpus);
    char *argv[32] = {(char *)tu_shoal(), "agent", "--server", f->url, "--token", TF_AGENT, "--name", f->names[i],
                      "--gpu-type", (char *)gpu_type, "--gpus", g, "--zone", (char *)zone, "--fabric",
                      (char *)fabric, "--price", "2.5", "--work-dir", work};
    int k = 20;
    char extra[256];
    snprintf(extra, sizeof extra, "%s", f->agent_extra);
    for (char *s = NULL, *t = strtok_r(extra, " ", &s); t && k < 30; t = strtok_r(NULL, " ", &s)) argv[k++] = t;
    argv[k] = NULL;
    f->agents[i] = tf_spawn_as(out, f->agent_uid[i], argv);
    if (i >= f->nagents) f->nagents = i + 1;
}

/* Whether agents first..first+n-1 are all registered and alive. */
static int agents_alive(tf_fleet *f, int first, int n)
{
    int st, ok = 0;
    json_t *j = tf_call(f, TF_ADMIN, "GET", "/v1/nodes", NULL, &st);
    size_t x;
    json_t *v;
    json_array_foreach(json_object_get(j, "nodes"), x, v) {
        const char *name = json_string_value(json_object_get(v, "name"));
        for (int i = first; i < first + n; i++)
            ok += !strcmp(name, f->names[i]) && !strcmp(json_string_value(json_object_get(v, "state")), "alive");
    }
    json_decref(j);
    return ok == n;
}

static void wait_agents(tf_fleet *f, int first, int n)
{
    for (int k = 0; k < 400; k++) {
        if (agents_alive(f, first, n)) return;
        sh_sleep(0.025);
    }
    fail_msg("agents n%d..n%d did not all register", first, first + n - 1);
}

void tf_start_agent(tf_fleet *f, int i, const char *gpu_type, int gpus, const char *zone, const char *fabric)
{
    spawn_agent(f, i, gpu_type, gpus, zone, fabric);
    wait_agents(f, i, 1);
}

void tf_spawn_agents(tf_fleet *f, int n, const char *gpu_type, int gpus, const char *zone, const char *fabric)
{
    for (int i = 0; i < n; i++) spawn_agent(f, i, gpu_type, gpus, zone, fabric);
}

void tf_wait_agents(tf_fleet *f, int n) { wait_agents(f, 0, n); }

void tf_start_agents(tf_fleet *f, int n, const char *gpu_type, int gpus, const char *zone, const char *fabric)
{
    tf_spawn_agents(f, n, gpu_type, gpus, zone, fabric);
    wait_agents(f, 0, n);
}

/* Waits for *p after a SIGTERM, then kills it for good. */
static void reap_pid(pid_t *p)
{
    if (*p <= 0) return;
    for (int i = 0; i < 200; i++) {
        if (waitpid(*p, NULL, WNOHANG) == *p) {
            *p = 0;
            return;
        }
        sh_sleep(0.025);
    }
    kill(*p, SIGKILL);
    waitpid(*p, NULL, 0);
    *p = 0;
}

/* Agents first, all at once (each stops its ranks in parallel), then the
 * server. */
void tf_stop(tf_fleet *f)
{
    for (int i = 0; i < f->nagents; i++)
        if (f->agents[i] > 0) kill(f->agents[i], SIGTERM);
    for (int i = 0; i < f->nagents; i++) reap_pid(&f->agents[i]);
    if (f->server > 0) kill(f->server, SIGTERM);
    reap_pid(&f->server);
}

json_t *tf_call(tf_fleet *f, const char *token, const char *method, const char *path, const char *body, int *status)
{
    client_conn *c;
    if (client_new(f->url, token, &c) < 0) fail_msg("%s", sh_errmsg());
    char *r = NULL;
    size_t rl = 0;
    int rc = client_raw(c, method, path, body, body ? strlen(body) : 0, NULL, 10, status, &r, &rl);
    client_free(c);
    if (rc < 0) fail_msg("%s %s: %s", method, path, sh_errmsg());
    json_t *j = json_loadb(r, rl, 0, NULL);
    free(r);
    return j;
}

int64_t tf_submit(tf_fleet *f, const char *token, const char *body)
{
    int st;
    json_t *j = tf_call(f, token, "POST", "/v1/jobs", body, &st);
    if (st != 201) fail_msg("submit returned %d: %s", st, json_string_value(json_object_get(j, "error")));
    int64_t id = json_integer_value(json_object_get(j, "id"));
    json_decref(j);
    return id;
}

json_t *tf_wait_job(tf_fleet *f, int64_t id, const char *state, double timeout)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    double until = sh_now_mono() + timeout;
    json_t *j = NULL;
    while (sh_now_mono() < until) {
        int st;
        json_decref(j);
        j = tf_call(f, TF_ADMIN, "GET", path, NULL, &st);
        if (st == 200 && !strcmp(json_string_value(json_object_get(j, "state")), state)) return j;
        sh_sleep(0.02);
    }
    fail_msg("job %lld: state %s, waited %.0fs for %s (reason: %s)", (long long)id,
             json_string_value(json_object_get(j, "state")), timeout, state,
             json_string_value(json_object_get(j, "reason")));
    return NULL;
}

char *tf_job_log(tf_fleet *f, int64_t id)
{
    sh_buf all = {0};
    long long off = 0;
    for (;;) {
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%lld/logs?rank=0&offset=%lld", (long long)id, off);
        int st;
        json_t *j = tf_call(f, TF_ADMIN, "GET", path, NULL, &st);
        assert_int_equal(st, 200);
        json_t *part = json_object_get(j, "data");
        assert_non_null(json_string_value(part));
        sh_buf_append(&all, json_string_value(part), json_string_length(part));
        long long next = (long long)json_integer_value(json_object_get(j, "offset"));
        json_decref(j);
        if (next <= off) break;
        off = next;
    }
    sh_buf_append(&all, "", 1);
    return (char *)all.data;
}

char *tf_wait_log(tf_fleet *f, int64_t id, double timeout, int *ended)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    int done = 0;
    for (double until = sh_now_mono() + timeout; !done && sh_now_mono() < until;) {
        int st;
        json_t *j = tf_call(f, TF_ADMIN, "GET", path, NULL, &st);
        const char *s = json_string_value(json_object_get(j, "state"));
        done = s && (!strcmp(s, "succeeded") || !strcmp(s, "failed"));
        json_decref(j);
        if (!done) sh_sleep(0.05);
    }
    char *log = tf_job_log(f, id);
    if (ended) *ended = done;
    else if (!done) fail_msg("job %lld did not end within %.0f s; log:\n%s", (long long)id, timeout, log);
    return log;
}

void tf_wait_alive(tf_fleet *f, int n, double timeout)
{
    double until = sh_now_mono() + timeout;
    int alive = 0;
    while (sh_now_mono() < until) {
        int st;
        json_t *j = tf_call(f, TF_ADMIN, "GET", "/v1/nodes", NULL, &st);
        alive = 0;
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(j, "nodes"), i, v)
            alive += !strcmp(json_string_value(json_object_get(v, "state")), "alive");
        json_decref(j);
        if (alive == n) return;
        sh_sleep(0.05);
    }
    fail_msg("%d nodes alive, waited for %d", alive, n);
}

const char *tf_member_node(json_t *job, int rank)
{
    json_t *m = json_array_get(json_object_get(job, "members"), (size_t)rank);
    return m ? json_string_value(json_object_get(m, "node")) : "";
}

int tf_agent_of(tf_fleet *f, const char *node)
{
    for (int i = 0; i < f->nagents; i++)
        if (!strcmp(f->names[i], node)) return i;
    return -1;
}

int tf_teardown(void **state)
{
    (void)state;
    tf_kill_all();
    return 0;
}
