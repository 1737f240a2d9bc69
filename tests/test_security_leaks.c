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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_logs_escapes, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
