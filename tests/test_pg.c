/* The control plane on PostgreSQL: the state layer on both engines, a
 * leader killed with kill -9 under load, and a leader cut off from the
 * database (fencing).  The tests start their own PostgreSQL (Debian's
 * initdb and pg_ctl, as the unprivileged user nobody when run as root) in
 * a temporary directory, on a free loopback port; they are skipped, saying
 * why, only where PostgreSQL is not installed (scripts/deps.sh installs it).
 *
 * SHOAL_PG_ROUNDS sets the kill -9 rounds of test_failover (default 3;
 * `shoal bench`-sized runs use 20 or more). */
#include "fleet_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pwd.h>

#define PG_BIN "/usr/lib/postgresql/15/bin"

static char pg_dir[256], pg_why[256];
static int pg_port;
static const char *pg_as = ""; /* "runuser -u nobody -- " when root */

/* The URL of database name (created on first use). */
static const char *pg_url(const char *name)
{
    static char url[256];
    snprintf(url, sizeof url, "postgresql://shoal@127.0.0.1:%d/%s", pg_port, name);
    return url;
}

static void psql(char **out, const char *db, const char *sql)
{
    int rc = tu_run(out, "%s/psql -X -q -At '%s' -c \"%s\"", "/usr/bin", pg_url(db), sql);
    if (rc) fail_msg("psql %s: %s: exit %d: %s", db, sql, rc, out && *out ? *out : "");
}

static int pg_setup(void **state)
{
    if (access(PG_BIN "/initdb", X_OK) || access("/usr/bin/psql", X_OK)) {
        snprintf(pg_why, sizeof pg_why, "PostgreSQL 15 is not installed (%s/initdb): run scripts/deps.sh", PG_BIN);
        return 0;
    }
    snprintf(pg_dir, sizeof pg_dir, "/tmp/shoal-pg.XXXXXX");
    if (!mkdtemp(pg_dir)) return snprintf(pg_why, sizeof pg_why, "mkdtemp failed"), 0;
    if (geteuid() == 0) {
        struct passwd *pw = getpwnam("nobody");
        if (!pw || chown(pg_dir, pw->pw_uid, pw->pw_gid)) return snprintf(pg_why, sizeof pg_why, "no user nobody"), 0;
        pg_as = "runuser -u nobody -- ";
    }
    int fd = tu_hold_port(&pg_port);
    close(fd);
    char *out = NULL;
    int rc = tu_run(&out, "%s%s/initdb -D %s/data -A trust -U shoal -E UTF8 --no-sync", pg_as, PG_BIN, pg_dir);
    if (rc) fail_msg("initdb: %s", out);
    free(out);
    /* fsync off: a test's database need not survive the machine. */
    rc = tu_run(&out, "%s%s/pg_ctl -D %s/data -l %s/log -w -o \"-k %s -c listen_addresses=127.0.0.1 -p %d"
                      " -c fsync=off -c max_connections=60\" start", pg_as, PG_BIN, pg_dir, pg_dir, pg_dir, pg_port);
    if (rc) fail_msg("pg_ctl start: %s", out);
    free(out);
    return 0;
}

static int pg_teardown(void **state)
{
    tf_kill_all();
    if (!pg_dir[0]) return 0;
    char *out = NULL;
    tu_run(&out, "%s%s/pg_ctl -D %s/data -m immediate -w stop", pg_as, PG_BIN, pg_dir);
    free(out);
    sh_rm_rf(pg_dir);
    return 0;
}

/* A fresh database for one test. */
static const char *pg_db(const char *name)
{
    if (pg_why[0]) skip();
    char sql[128];
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
    psql(NULL, "postgres", sql);
    return pg_url(name);
}

/* ---- fleets of servers on one database ---------------------------------- */

typedef struct ha {
    tf_fleet s[2];  /* two servers; s[0] also holds the agents */
    char url[2][64];
    char both[140];
} ha;

static void ha_urls(ha *h)
{
    for (int i = 0; i < 2; i++) snprintf(h->s[i].url, sizeof h->s[i].url, "%s", h->url[i]);
    snprintf(h->both, sizeof h->both, "%s,%s", h->url[0], h->url[1]);
    snprintf(h->s[0].url, sizeof h->s[0].url, "%s", h->both);
}

static void ha_start(ha *h, const char *db, const char *name, double hb)
{
    memset(h, 0, sizeof *h);
    for (int i = 0; i < 2; i++) {
        char n[64];
        snprintf(n, sizeof n, "%s-%d", name, i);
        snprintf(h->s[i].extra, sizeof h->s[i].extra, "--db %s --state-dir %s/state", db, tu_path(name));
        tf_start_server(&h->s[i], n, hb);
        snprintf(h->url[i], sizeof h->url[i], "%s", h->s[i].url);
    }
    ha_urls(h);
}

/* GET /v1/leader of one server; NULL if it does not answer. */
static json_t *leader_of(const char *url)
{
    srv_client *c;
    TU_OK(srv_client_new(url, NULL, &c));
    char *r = NULL;
    size_t rl = 0;
    int st = 0;
    int rc = srv_client_raw(c, "GET", "/v1/leader", NULL, 0, NULL, 2, &st, &r, &rl);
    srv_client_free(c);
    json_t *j = rc == SH_OK && st == 200 ? json_loadb(r, rl, 0, NULL) : NULL;
    free(r);
    return j;
}

/* Waits until server i leads and has run a scheduling cycle; returns the
 * wall time of that cycle. */
static double wait_leader(ha *h, int i, double timeout)
{
    for (double t0 = sh_now_mono(); sh_now_mono() - t0 < timeout; sh_sleep(0.01)) {
        json_t *j = leader_of(h->url[i]);
        double t = json_is_true(json_object_get(j, "leader")) ? json_real_value(json_object_get(j, "t_first_cycle")) : 0;
        json_decref(j);
        if (t > 0) return t;
    }
    fail_msg("server %s did not become the leader in %.0f s", h->url[i], timeout);
    return 0;
}

static void wait_leader_url(const char *url, double timeout)
{
    ha h = {0};
    snprintf(h.url[0], sizeof h.url[0], "%s", url);
    wait_leader(&h, 0, timeout);
}

static int leader_index(ha *h)
{
    for (int i = 0; i < 2; i++) {
        json_t *j = leader_of(h->url[i]);
        int l = json_is_true(json_object_get(j, "leader"));
        json_decref(j);
        if (l) return i;
    }
    return -1;
}

static void ha_kill9(ha *h, int i)
{
    kill(h->s[i].server, SIGKILL);
    waitpid(h->s[i].server, NULL, 0);
}

static void ha_restart(ha *h, int i)
{
    tf_restart_server(&h->s[i]);
    ha_urls(h);
}

/* ---- the state layer on both engines ------------------------------------ */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* What a fleet's state says, engine aside: each job's name, state, attempt
 * and exit code, the events' kinds, and the bill of each job. */
static char *state_digest(tf_fleet *f, int njobs)
{
    sh_buf b = {0};
    for (int id = 1; id <= njobs; id++) {
        char path[64];
        int st;
        snprintf(path, sizeof path, "/v1/jobs/%d", id);
        json_t *j = tf_call(f, TF_ADMIN, "GET", path, NULL, &st);
        assert_int_equal(st, 200);
        double cost = json_real_value(json_object_get(j, "cost"));
        sh_buf_printf(&b, "%s %s a%lld x%lld bill%s\n", json_string_value(json_object_get(j, "name")),
                      json_string_value(json_object_get(j, "state")),
                      (long long)json_integer_value(json_object_get(j, "attempt")),
                      (long long)json_integer_value(json_object_get(j, "exit_code")), cost > 0 ? "+" : "0");
        json_decref(j);
    }
    int st;
    json_t *e = tf_call(f, TF_ADMIN, "GET", "/v1/events?limit=1000", NULL, &st);
    size_t i, n = 0;
    json_t *v;
    const char *kinds[1000];
    /* Agents' timing orders the events differently from run to run: the
     * kinds are compared as a set with counts. */
    json_array_foreach(json_object_get(e, "events"), i, v) {
        const char *k = json_string_value(json_object_get(v, "kind"));
        if (strcmp(k, "leader") && n < 1000) kinds[n++] = k;
    }
    qsort(kinds, n, sizeof *kinds, cmp_str);
    for (i = 0; i < n; i++) sh_buf_printf(&b, "%s,", kinds[i]);
    json_decref(e);
    sh_buf_printf(&b, "\n");
    return (char *)b.data;
}

/* One scenario, run on the engine of `db`: jobs that succeed, fail and are
 * cancelled, a retried submit, a killed and restarted server.  Returns
 * its digest. */
static char *state_scenario(const char *name, const char *db)
{
    tf_fleet f = {0};
    if (db) snprintf(f.extra, sizeof f.extra, "--db %s --state-dir %s/state", db, tu_path(name));
    tf_start_server(&f, name, 3);
    if (db) wait_leader_url(f.url, 10);
    tf_start_agents(&f, 2, "h100", 2, "z", "f");
    int st;
    int64_t a = tf_submit(&f, TF_ALICE, "{\"name\":\"ok\",\"command\":[\"true\"],\"nodes\":2,\"gpus_per_node\":1,\"est_s\":60}");
    int64_t b = tf_submit(&f, TF_BOB, "{\"name\":\"bad\",\"command\":[\"sh\",\"-c\",\"exit 3\"],\"nodes\":1,"
                                      "\"gpus_per_node\":1,\"max_attempts\":1,\"on_failure\":\"fail\",\"est_s\":60}");
    int64_t c = tf_submit(&f, TF_ALICE, "{\"name\":\"long\",\"command\":[\"sleep\",\"600\"],\"nodes\":1,\"gpus_per_node\":2,\"est_s\":900}");
    json_decref(tf_wait_job(&f, a, "succeeded", 20));
    json_decref(tf_wait_job(&f, b, "failed", 20));
    json_decref(tf_wait_job(&f, c, "running", 20));
    /* The same Idempotency-Key gets the same job. */
    srv_client *cl;
    TU_OK(srv_client_new(f.url, TF_ALICE, &cl));
    int64_t ids[2];
    for (int k = 0; k < 2; k++) {
        const char *body = "{\"name\":\"key\",\"command\":[\"true\"],\"nodes\":1,\"gpus_per_node\":1,\"est_s\":60}";
        char *r = NULL;
        size_t rl;
        TU_OK(srv_client_raw(cl, "POST", "/v1/jobs", body, strlen(body), "Idempotency-Key: same-1", 10, &st, &r, &rl));
        json_t *j = json_loadb(r, rl, 0, NULL);
        ids[k] = json_integer_value(json_object_get(j, "id"));
        json_decref(j);
        free(r);
    }
    srv_client_free(cl);
    assert_int_equal(ids[0], ids[1]);
    json_decref(tf_wait_job(&f, ids[0], "succeeded", 20));
    /* kill -9 and a restart: the running job keeps running, in its attempt. */
    kill(f.server, SIGKILL);
    waitpid(f.server, NULL, 0);
    tf_restart_server(&f);
    if (db) wait_leader_url(f.url, 10);
    json_t *j = tf_wait_job(&f, c, "running", 20);
    assert_int_equal(json_integer_value(json_object_get(j, "attempt")), 1);
    json_decref(j);
    json_decref(tf_call(&f, TF_ALICE, "POST", "/v1/jobs/3/cancel", "{}", &st));
    assert_int_equal(st, 200);
    json_decref(tf_wait_job(&f, c, "cancelled", 20));
    char *d = state_digest(&f, 4);
    tf_stop(&f);
    return d;
}

static void test_state_both_engines(void **state)
{
    const char *db = pg_db("state");
    char *lite = state_scenario("lite", NULL);
    char *pg = state_scenario("pgs", db);
    assert_string_equal(lite, pg);
    /* The leader row and the fence exist; a stale epoch cannot write. */
    char *out = NULL;
    psql(&out, "state", "SELECT epoch >= 2 FROM shoal_leader");
    assert_string_equal(out, "t\n");
    free(out);
    int rc = tu_run(&out, "/usr/bin/psql -X -q -At '%s' -c 'BEGIN; SELECT shoal_fence(1); INSERT INTO tenants"
                          " VALUES(''late'', 999); COMMIT'", db);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, "deposed"));
    free(out);
    free(lite);
    free(pg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_state_both_engines, tf_teardown),
    };
    return cmocka_run_group_tests(tests, pg_setup, pg_teardown);
}
