/* A hostile tenant, or a hostile node, against the control plane's output,
 * identities and scheduling (issue 29, item 6), from the attacker's side
 * against a real server (and a real agent where a rank must run): what a
 * rank's output may do to the admin's terminal, what a node's credential
 * may write, what a pending job's reason tells one tenant of another's,
 * how credentials are kept at rest, and how far a tenant's priority and
 * output may reach.  docs/security.md names each test. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fleet_util.h"

#include <nettle/sha2.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Submits `script` under sh -c as a one-GPU function of `token`, with
 * `extra` (",\"key\":value..." or "") added to the job file. */
static int64_t submit_sh(tf_fleet *f, const char *token, const char *name, const char *extra, const char *script)
{
    json_t *cmd = json_pack("[s,s,s]", "sh", "-c", script);
    char *c = json_dumps(cmd, JSON_COMPACT);
    json_decref(cmd);
    char body[8192];
    snprintf(body, sizeof body, "{\"name\":\"%s\",\"kind\":\"function\",\"gpus\":1%s,\"command\":%s}", name, extra, c);
    free(c);
    return tf_submit(f, token, body);
}

/* A call that must fail with `status`, its message holding `needle`. */
static json_t *expect_error(tf_fleet *f, const char *token, const char *method, const char *path, const char *body,
                            int status, const char *needle)
{
    int st;
    json_t *j = tf_call(f, token, method, path, body, &st);
    const char *e = json_string_value(json_object_get(j, "error"));
    if (st != status || !e || !strstr(e, needle))
        fail_msg("%s %s: expected %d with \"%s\", got %d: %s", method, path, status, needle, st, e ? e : "(no error)");
    return j;
}

/* ---- shoal logs on a terminal ------------------------------------------- */

/* A rank prints what would retitle the admin's window (OSC 0), set its
 * clipboard (OSC 52), clear the screen (CSI 2J, in ESC and in the C1 form
 * U+009B), ring the bell, overwrite the line (a lone CR) and delete (DEL).
 * On a terminal `shoal logs` shows each as text; --raw and a pipe pass the
 * bytes.  Before: every byte reached the terminal. */
static void test_logs_escapes(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "esc", 10);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    int64_t id = submit_sh(&f, TF_BOB, "esc", "",
                           "printf 'A\\033]0;PWNED\\007B\\033]52;c;ZWNobyBwd25lZA==\\007C\\033[2JD\\302\\2332JE"
                           "\\rF\\177G\\tH\\n'");
    free(tf_wait_log(&f, id, 30, NULL));
    char *out = NULL;
    assert_int_equal(tu_run_tty(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s logs %lld", f.url, TF_BOB, tu_shoal(),
                                (long long)id), 0);
    if (strchr(out, 0x1b) || strchr(out, 0x07) || strchr(out, 0x7f) || strstr(out, "\xc2\x9b"))
        fail_msg("control bytes reached the terminal:\n%s", out);
    const char *want = "A^[]0;PWNED^GB^[]52;c;ZWNobyBwd25lZA==^GC^[[2JD\\u009b2JE^MF^?G\tH";
    if (!strstr(out, want)) fail_msg("the terminal shows:\n%s\nexpected:\n%s", out, want);
    free(out);
    /* --follow goes through the same path. */
    assert_int_equal(tu_run_tty(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s logs -f %lld", f.url, TF_BOB, tu_shoal(),
                                (long long)id), 0);
    if (strchr(out, 0x1b) || !strstr(out, want)) fail_msg("logs -f on a terminal shows:\n%s", out);
    free(out);
    /* --json on a terminal: no C1 control either. */
    assert_int_equal(tu_run_tty(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s logs --json %lld", f.url, TF_BOB,
                                tu_shoal(), (long long)id), 0);
    if (strchr(out, 0x1b) || strstr(out, "\xc2\x9b") || !strstr(out, "\\u009B"))
        fail_msg("logs --json on a terminal shows:\n%s", out);
    free(out);
    /* --raw on a terminal, and a pipe, get the bytes. */
    assert_int_equal(tu_run_tty(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s logs --raw %lld", f.url, TF_BOB,
                                tu_shoal(), (long long)id), 0);
    if (!strstr(out, "A\x1b]0;PWNED\x07" "B")) fail_msg("logs --raw on a terminal shows:\n%s", out);
    free(out);
    assert_int_equal(tu_run(&out, "SHOAL_SERVER=%s SHOAL_TOKEN=%s %s logs %lld | od -An -c", f.url, TF_BOB,
                            tu_shoal(), (long long)id), 0);
    if (!strstr(out, "033") || !strstr(out, "302 233")) fail_msg("logs into a pipe did not pass the bytes:\n%s", out);
    free(out);
    tf_stop(&f);
}

/* ---- a node's credential and other jobs' logs --------------------------- */

/* Registers a node of type EVIL, which no agent backs: the test speaks for
 * it with its credential (returned). */
static char *fake_node(tf_fleet *f, const char *name, int gpus)
{
    char body[256];
    snprintf(body, sizeof body, "{\"name\":\"%s\",\"gpu_type\":\"EVIL\",\"gpus\":%d}", name, gpus);
    int st;
    json_t *j = tf_call(f, TF_AGENT, "POST", "/v1/agent/register", body, &st);
    assert_int_equal(st, 200);
    char *cred = strdup(json_string_value(json_object_get(j, "credential")));
    json_decref(j);
    return cred;
}

/* One poll of node `name` with its credential; asserts `status`. */
static void node_poll(tf_fleet *f, const char *cred, const char *name, int64_t job, const char *state,
                      const char *output, int status)
{
    json_t *b = json_pack("{s:s,s:[],s:[]}", "node", name, "members", "logs");
    if (state) {
        json_t *m = json_pack("{s:I,s:i,s:i,s:s}", "job", (json_int_t)job, "attempt", 1, "rank", 0, "state", state);
        if (!strcmp(state, "exited")) json_object_set_new(m, "exit_code", json_integer(0));
        json_array_append_new(json_object_get(b, "members"), m);
    }
    if (output)
        json_array_append_new(json_object_get(b, "logs"), json_pack("{s:I,s:i,s:i,s:s}", "job", (json_int_t)job,
                                                                    "attempt", 1, "rank", 0, "data", output));
    char *text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    int st;
    json_decref(tf_call(f, cred, "POST", "/v1/agent/poll", text, &st));
    free(text);
    if (st != status) fail_msg("poll of node %s: HTTP %d, expected %d", name, st, status);
}

/* A node that once ran alice's job keeps its credential (or an attacker
 * has it).  While the rank lives, and for --log-drain seconds after it
 * ended (its agent sends the last output), the node writes the rank's
 * log; after that, what it sends for the finished job is dropped.
 * Before: a node could append to the log of any finished job that had run
 * on it, for good. */
static void test_node_writes_only_live_logs(void **state)
{
    tf_fleet f = {0};
    snprintf(f.extra, sizeof f.extra, "--log-drain 1");
    tf_start_server(&f, "drain", 30);
    char *evil = fake_node(&f, "evil", 1);
    int64_t id = submit_sh(&f, TF_ALICE, "target", ",\"gpu_types\":[\"EVIL\"]", "true");
    json_decref(tf_wait_job(&f, id, "starting", 10));
    node_poll(&f, evil, "evil", id, "running", "started\n", 200);
    node_poll(&f, evil, "evil", id, "exited", "last words\n", 200);
    json_decref(tf_wait_job(&f, id, "succeeded", 5));
    node_poll(&f, evil, "evil", 0, NULL, "drained\n", 200); /* job 0: none, the poll goes through */
    node_poll(&f, evil, "evil", id, NULL, "drained\n", 200);
    sh_sleep(1.5);
    node_poll(&f, evil, "evil", id, NULL, "FORGED after the end\n", 200);
    node_poll(&f, evil, "evil", id, "exited", "FORGED with a report\n", 200);
    char *l = tf_job_log(&f, id);
    if (!strstr(l, "started\nlast words\ndrained\n")) fail_msg("the rank's own output is missing:\n%s", l);
    if (strstr(l, "FORGED")) fail_msg("a node wrote into a finished job's log:\n%s", l);
    free(l);
    free(evil);
    tf_stop(&f);
}

/* A node's name, GPU type, zone, fabric, address and sandbox are shown on
 * the admin's terminal (shoal nodes, shoal job): a node registering with
 * escape sequences in them is refused (400), naming the field.  Before:
 * only '/' was refused in a name, and nothing in the other fields. */
static void test_node_fields_escapes(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "nodeesc", 30);
    static const char *const bodies[][2] = {
        {"{\"name\":\"n\\u001b]0;PWNED\\u0007\",\"gpu_type\":\"H100\",\"gpus\":1}", "field \"name\""},
        {"{\"name\":\"n1\",\"gpu_type\":\"H100\\u009b2J\",\"gpus\":1}", "field \"gpu_type\""},
        {"{\"name\":\"n1\",\"gpu_type\":\"H100\",\"gpus\":1,\"zone\":\"z\\r\"}", "field \"zone\""},
        {"{\"name\":\"n1\",\"gpu_type\":\"H100\",\"gpus\":1,\"sandbox\":\"bwrap\\u007f\"}", "field \"sandbox\""},
    };
    for (int i = 0; i < 4; i++)
        json_decref(expect_error(&f, TF_AGENT, "POST", "/v1/agent/register", bodies[i][0], 400, bodies[i][1]));
    int st;
    json_t *n = tf_call(&f, TF_ADMIN, "GET", "/v1/nodes", NULL, &st);
    assert_int_equal(json_array_size(json_object_get(n, "nodes")), 0);
    json_decref(n);
    free(fake_node(&f, "n1", 1)); /* printable text still registers */
    tf_stop(&f);
}

/* ---- what a pending job's reason tells of others --------------------------- */

static json_t *get_job(tf_fleet *f, const char *token, int64_t id)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    int st;
    json_t *j = tf_call(f, token, "GET", path, NULL, &st);
    assert_int_equal(st, 200);
    return j;
}

/* Waits until job id (as token sees it) waits for `wait`; returns its
 * pending_reason (caller frees). */
static char *wait_reason(tf_fleet *f, const char *token, int64_t id, const char *wait)
{
    for (double until = sh_now_mono() + 10; sh_now_mono() < until; sh_sleep(0.05)) {
        json_t *j = get_job(f, token, id);
        const char *w = json_string_value(json_object_get(j, "wait"));
        if (w && !strcmp(w, wait)) {
            char *r = strdup(json_string_value(json_object_get(j, "pending_reason")));
            json_decref(j);
            return r;
        }
        json_decref(j);
    }
    fail_msg("job %lld never waited for %s", (long long)id, wait);
    return NULL;
}

/* Bob's job waits behind the reservation of alice's gang.  Bob's view of
 * its reason says so without alice's job id or when it starts; the
 * admin's names both.  Before: bob read alice's job id and start time. */
static void test_pending_reason_names_no_other_tenant(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "reason", 30);
    char *big = fake_node(&f, "big", 8);
    const char *gang = "{\"name\":\"%s\",\"nodes\":1,\"gpus_per_node\":%d,\"est_s\":%d,"
                       "\"gpu_types\":[\"EVIL\"],\"command\":[\"true\"]}";
    char body[512];
    snprintf(body, sizeof body, gang, "half", 4, 3600);
    int64_t held = tf_submit(&f, TF_BOB, body);
    json_decref(tf_wait_job(&f, held, "starting", 10));
    snprintf(body, sizeof body, gang, "whole", 8, 600);
    int64_t whole = tf_submit(&f, TF_ALICE, body);
    free(wait_reason(&f, TF_ALICE, whole, "reserved"));
    snprintf(body, sizeof body, gang, "behind", 4, 3600);
    int64_t behind = tf_submit(&f, TF_BOB, body);
    char *admin = wait_reason(&f, TF_ADMIN, behind, "reservation");
    char id[32];
    snprintf(id, sizeof id, "job %lld", (long long)whole);
    if (!strstr(admin, id) || !strstr(admin, "due to start")) fail_msg("the admin's reason: %s", admin);
    char *bob = wait_reason(&f, TF_BOB, behind, "reservation");
    if (strstr(bob, id) || strstr(bob, "due to start") || !strstr(bob, "another tenant's job"))
        fail_msg("bob reads of alice's job: %s", bob);
    /* Alice's own job in the way is hers to see. */
    snprintf(body, sizeof body, gang, "mine", 4, 3600);
    int64_t mine = tf_submit(&f, TF_ALICE, body);
    char *own = wait_reason(&f, TF_ALICE, mine, "reservation");
    if (!strstr(own, id)) fail_msg("alice's reason for her own job: %s", own);
    free(admin), free(bob), free(own), free(big);
    tf_stop(&f);
}

/* ---- secrets at rest ------------------------------------------------------ */

static void sha256_text(const char *secret, char out[72])
{
    struct sha256_ctx c;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&c);
    sha256_update(&c, strlen(secret), (const uint8_t *)secret);
    sha256_digest(&c, sizeof d, d);
    strcpy(out, "sha256:");
    for (int i = 0; i < 32; i++) snprintf(out + 7 + 2 * i, 3, "%02x", d[i]);
}

/* Runs one SQL statement on the fleet's database; returns the first column
 * of the first row, if any (caller frees). */
static char *db_exec(tf_fleet *f, const char *sql)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/state.db", f->dir);
    sqlite3 *db;
    sqlite3_stmt *st;
    if (sqlite3_open(path, &db) || sqlite3_prepare_v2(db, sql, -1, &st, NULL))
        fail_msg("%s: %s: %s", path, sql, sqlite3_errmsg(db));
    char *v = NULL;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && sqlite3_column_text(st, 0)) v = strdup((const char *)sqlite3_column_text(st, 0));
    else if (rc != SQLITE_ROW && rc != SQLITE_DONE) fail_msg("%s: %s: %s", path, sql, sqlite3_errmsg(db));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* Whether `needle` appears in the bytes of the database or its WAL. */
static int db_files_hold(tf_fleet *f, const char *needle)
{
    static const char *const sfx[] = {"", "-wal"};
    for (int i = 0; i < 2; i++) {
        char path[4200], *text;
        size_t len;
        snprintf(path, sizeof path, "%s/state.db%s", f->dir, sfx[i]);
        if (sh_read_file(path, 256 << 20, &text, &len) < 0) continue;
        int found = memmem(text, len, needle, strlen(needle)) != NULL;
        free(text);
        if (found) return 1;
    }
    return 0;
}

static int status_of(tf_fleet *f, const char *token, const char *method, const char *path, const char *body)
{
    int st;
    json_decref(tf_call(f, token, method, path, body, &st));
    return st;
}

/* Someone who reads the server's database (a backup, a copy of the state
 * directory) learns no node's credential, and the value stored is refused
 * as a token; a database that holds credentials as given (written before)
 * has them replaced by their hashes at open, and they still work.  The
 * tokens file may give a token as "sha256:HEX", and that text itself is no
 * token.  Before: credentials were stored as issued and worked as read. */
static void test_secrets_stored_hashed(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "hashed", 30);
    char *cred = fake_node(&f, "n", 1), want[72];
    sha256_text(cred, want);
    char *stored = db_exec(&f, "SELECT cred FROM nodes WHERE name='n'");
    if (!stored || strcmp(stored, want)) fail_msg("node n's stored credential: %s, expected %s", stored, want);
    if (db_files_hold(&f, cred)) fail_msg("the credential %s lies in the database files", cred);
    assert_int_equal(status_of(&f, cred, "POST", "/v1/agent/poll", "{\"node\":\"n\"}"), 200);
    assert_int_equal(status_of(&f, stored, "POST", "/v1/agent/poll", "{\"node\":\"n\"}"), 401);
    free(stored);
    /* An older database: the credential as issued. */
    tf_stop(&f);
    free(db_exec(&f, "UPDATE nodes SET cred='0123456789abcdef0123456789abcdef01234567' WHERE name='n'"));
    /* Bob's token as its hash in the tokens file. */
    char bob[72], tokens[4200], text[512];
    sha256_text(TF_BOB, bob);
    snprintf(tokens, sizeof tokens, "%s/tokens.json", f.dir);
    snprintf(text, sizeof text, "{\"admin\":\"%s\",\"agent\":\"%s\",\"tenants\":{\"alice\":\"%s\",\"bob\":\"%s\"}}",
             TF_ADMIN, TF_AGENT, TF_ALICE, bob);
    tu_write_file(tokens, text, strlen(text));
    tf_restart_server(&f);
    stored = db_exec(&f, "SELECT cred FROM nodes WHERE name='n'");
    sha256_text("0123456789abcdef0123456789abcdef01234567", want);
    if (!stored || strcmp(stored, want)) fail_msg("the old credential was not hashed at open: %s", stored);
    assert_int_equal(status_of(&f, "0123456789abcdef0123456789abcdef01234567", "POST", "/v1/agent/poll",
                               "{\"node\":\"n\"}"), 200);
    assert_int_equal(status_of(&f, stored, "POST", "/v1/agent/poll", "{\"node\":\"n\"}"), 401);
    assert_int_equal(status_of(&f, TF_BOB, "GET", "/v1/jobs", NULL), 200);
    assert_int_equal(status_of(&f, bob, "GET", "/v1/jobs", NULL), 401);
    assert_int_equal(status_of(&f, TF_ALICE, "GET", "/v1/jobs", NULL), 200);
    free(stored), free(cred);
    tf_stop(&f);
}

/* ---- how far a tenant's priority and output reach ---------------------------- */

/* Bob asks for priority 1000 to go first and preempt alice's elastic job:
 * refused (403, "priority_over_limit"), and alice's job runs on.  The
 * operator may let a tenant higher (--max-priority alice=100), never past
 * its limit; the admin's jobs are not limited.  Before: any tenant could
 * ask for 1000 and preempt every other tenant's work. */
static void test_priority_limit(void **state)
{
    tf_fleet f = {0};
    snprintf(f.extra, sizeof f.extra, "--max-priority alice=100");
    tf_start_server(&f, "prio", 30);
    char *node = fake_node(&f, "big", 8);
    int64_t victim = tf_submit(&f, TF_ALICE, "{\"name\":\"victim\",\"kind\":\"elastic\",\"max_nodes\":1,"
                                             "\"gpus_per_node\":8,\"gpu_types\":[\"EVIL\"],\"command\":[\"true\"]}");
    json_decref(tf_wait_job(&f, victim, "starting", 10));
    const char *gang = "{\"name\":\"%s\",\"nodes\":1,\"gpus_per_node\":8,\"priority\":%d,"
                       "\"gpu_types\":[\"EVIL\"],\"command\":[\"true\"]}";
    char body[512];
    snprintf(body, sizeof body, gang, "jump", 1000);
    json_t *e = expect_error(&f, TF_BOB, "POST", "/v1/jobs", body, 403, "above tenant bob's limit of 0");
    assert_string_equal(json_string_value(json_object_get(e, "reason")), "priority_over_limit");
    json_decref(e);
    snprintf(body, sizeof body, gang, "one", 1);
    json_decref(expect_error(&f, TF_BOB, "POST", "/v1/jobs", body, 403, "--max-priority"));
    snprintf(body, sizeof body, gang, "alice-high", 101);
    json_decref(expect_error(&f, TF_ALICE, "POST", "/v1/jobs", body, 403, "limit of 100"));
    /* At the limit, and below it, jobs are taken; the victim is untouched. */
    snprintf(body, sizeof body, gang, "zero", 0);
    int64_t zero = tf_submit(&f, TF_BOB, body);
    snprintf(body, sizeof body, gang, "low", -5);
    tf_submit(&f, TF_BOB, body);
    sh_sleep(0.5);
    json_t *v = tf_wait_job(&f, victim, "starting", 1);
    assert_int_equal(json_integer_value(json_object_get(v, "attempt")), 1);
    json_decref(v);
    json_decref(tf_wait_job(&f, zero, "pending", 1));
    snprintf(body, sizeof body, gang, "admin", 1000);
    tf_submit(&f, TF_ADMIN, body);
    /* A limit for a tenant the tokens file lacks stops the server. */
    char *out = NULL;
    int rc = tu_run(&out, "%s server --tokens %s/tokens.json --db %s/other.db --port 0 --max-priority carol=5",
                    tu_shoal(), f.dir, f.dir);
    if (rc == 0 || !strstr(out, "no tenant \"carol\"")) fail_msg("--max-priority carol=5: exit %d:\n%s", rc, out);
    free(out), free(node);
    tf_stop(&f);
}

/* Bob runs four ranks, each well under the server's limit for one rank's
 * log, that together pass his tenant's budget (--max-tenant-log 24KiB):
 * past it, his ranks' output is dropped with a note in each log and an
 * event; alice's rank beside them keeps all of its output.  Before: only
 * each rank's log was limited, so the ranks of one tenant together could
 * fill the disk the database lives on. */
static void test_tenant_log_budget(void **state)
{
    tf_fleet f = {0};
    snprintf(f.extra, sizeof f.extra, "--max-tenant-log 24KiB");
    tf_start_server(&f, "tlog", 10);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    const char *print = "yes 123456789 | head -n 1000; echo end-of-output"; /* 10,000 bytes and a line */
    int64_t bob[4];
    for (int i = 0; i < 4; i++) bob[i] = submit_sh(&f, TF_BOB, "chatty", "", print);
    int64_t alice = submit_sh(&f, TF_ALICE, "quiet", "", print);
    size_t total = 0;
    int noted = 0, whole = 0;
    for (int i = 0; i < 4; i++) {
        char *l = tf_wait_log(&f, bob[i], 60, NULL);
        total += strlen(l);
        noted += strstr(l, "the logs of tenant bob reached the server's limit") != NULL;
        whole += strstr(l, "end-of-output") != NULL;
        free(l);
    }
    /* Past the budget each log gets one note (about 190 bytes) more. */
    if (total > 24 * 1024 + 4 * 300 || !noted || whole > 2)
        fail_msg("bob's logs hold %zu bytes, %d with the note, %d whole", total, noted, whole);
    char *l = tf_wait_log(&f, alice, 60, NULL);
    if (!strstr(l, "end-of-output") || strstr(l, "reached")) fail_msg("alice's log:\n%.2000s", l);
    free(l);
    int st, found = 0;
    json_t *ev = tf_call(&f, TF_BOB, "GET", "/v1/events?limit=1000", NULL, &st);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(ev, "events"), i, e) found |= !strcmp(
        json_string_value(json_object_get(e, "kind")), "log_budget");
    json_decref(ev);
    if (!found) fail_msg("no log_budget event for bob");
    tf_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_logs_escapes, tf_teardown),
        cmocka_unit_test_teardown(test_node_writes_only_live_logs, tf_teardown),
        cmocka_unit_test_teardown(test_node_fields_escapes, tf_teardown),
        cmocka_unit_test_teardown(test_pending_reason_names_no_other_tenant, tf_teardown),
        cmocka_unit_test_teardown(test_secrets_stored_hashed, tf_teardown),
        cmocka_unit_test_teardown(test_priority_limit, tf_teardown),
        cmocka_unit_test_teardown(test_tenant_log_budget, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
