/* Talking to a server from the command line: options, errors, formats. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_int.h"
#include "ctl_int.h"

void cli_ctl_defaults(cli_ctl *x, const char *cmd)
{
    memset(x, 0, sizeof *x);
    x->cmd = cmd;
    x->server = getenv("SHOAL_SERVER");
    x->token = getenv("SHOAL_TOKEN");
    if (!x->server || !*x->server) x->server = "http://127.0.0.1:8470";
}

int cli_ctl_connect(cli_ctl *x)
{
    if (client_new(x->server, x->token, &x->c) < 0) return cli_usage(x->cmd, "%s", sh_errmsg());
    return 0;
}

int cli_ctl_job_id(const char *cmd, int argc, char **argv, int64_t *id)
{
    if (optind >= argc) return cli_usage(cmd, "expected a job id (`shoal jobs` lists them)");
    if (optind + 1 < argc) return cli_usage(cmd, "expected one job id, got %d arguments", argc - optind);
    if (sh_parse_i64(argv[optind], id, "job id") < 0 || *id < 0)
        return cli_usage(cmd, "\"%s\" is not a job id (a number: `shoal jobs` lists them)", argv[optind]);
    return 0;
}

void cli_ctl_free(cli_ctl *x)
{
    client_free(x->c);
    x->c = NULL;
}

int cli_ctl_call(cli_ctl *x, const char *method, const char *path, const json_t *body,
                 const char *extra_header, json_t **reply)
{
    int status = 0;
    *reply = NULL;
    int rc = client_call(x->c, method, path, body, extra_header, 30, &status, reply);
    if (rc < 0) return cli_fail(x->cmd, rc);
    if (status >= 400) {
        const char *e = json_string_value(json_object_get(*reply, "error"));
        if (!e) e = "request failed";
        if (x->subject && !strncmp(e, "job: ", 5)) e += 5;
        fprintf(stderr, "shoal %s: %s%s%s (HTTP %d from %s)\n", x->cmd, x->subject ? x->subject : "",
                x->subject ? ": " : "", e, status, x->server);
        /* Without a token, say how to give one; a wrong one is named by the server. */
        if (status == 401 && (!x->token || !*x->token)) fprintf(stderr, "hint: pass --token TOKEN or set SHOAL_TOKEN\n");
        json_decref(*reply);
        *reply = NULL;
        return 1;
    }
    if (!*reply) *reply = json_object();
    return 0;
}

const char *cli_fmt_dur(double s, char *buf, size_t cap)
{
    if (s < 0) s = 0;
    if (s < 60) snprintf(buf, cap, "%.1fs", s);
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
    return buf;
}

const char *cli_fmt_time(double wall, char *buf, size_t cap)
{
    if (wall <= 0) return snprintf(buf, cap, "-"), buf;
    time_t t = (time_t)wall;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, cap, "%H:%M:%S", &tm);
    return buf;
}

int cli_ctl_get_table(const char *cmd, int argc, char **argv, const char *usage, const char *path,
                      json_t **reply)
{
    cli_ctl x;
    cli_ctl_defaults(&x, cmd);
    cli_args a = {cmd, usage, NULL, &x};
    if (cli_getopt(&a, argc, argv) != -1) return a.rc;
    if (optind < argc) return cli_usage(cmd, "unexpected argument \"%s\"", argv[optind]);
    int rc = cli_ctl_connect(&x);
    if (rc) return rc;
    rc = cli_ctl_call(&x, "GET", path, NULL, NULL, reply);
    cli_ctl_free(&x);
    if (rc) return rc;
    if (!x.json) return -1;
    sh_json_print(*reply);
    json_decref(*reply);
    return 0;
}

int cli_job_ended(const json_t *job)
{
    const char *st = json_string_value(json_object_get(job, "state"));
    return st && (!strcmp(st, "succeeded") || !strcmp(st, "failed") || !strcmp(st, "cancelled"));
}

int cli_job_status(const json_t *job)
{
    const char *st = json_string_value(json_object_get(job, "state"));
    if (st && !strcmp(st, "succeeded")) return 0;
    json_int_t code = json_integer_value(json_object_get(job, "exit_code"));
    if (st && !strcmp(st, "failed") && code >= 1 && code <= 255) return (int)code;
    return 1;
}

int cli_job_report(const char *cmd, const json_t *job)
{
    int status = cli_job_status(job);
    if (status)
        fprintf(stderr, "shoal %s: job %lld %s: %s\n", cmd, (long long)json_integer_value(json_object_get(job, "id")),
                json_string_value(json_object_get(job, "state")), json_string_value(json_object_get(job, "reason")));
    return status;
}

int cli_ctl_wait_job(cli_ctl *x, int64_t id, json_t **job)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    double pause = 0.1;
    for (;;) {
        int rc = cli_ctl_call(x, "GET", path, NULL, NULL, job);
        if (rc || cli_job_ended(*job)) return rc;
        json_decref(*job);
        *job = NULL;
        sh_sleep(pause);
        if (pause < 1) pause *= 1.5; /* quick for short jobs, one request a second for long ones */
    }
}

/* A rank's output is another tenant's bytes on the admin's terminal:
 * escape sequences in it can retitle the window, write the clipboard
 * (OSC 52), redraw the screen or, on some terminals, answer with text the
 * shell then reads.  Every byte a terminal acts on, other than a newline,
 * a tab and the carriage return of a "\r\n", is shown instead in a visible
 * form: C0 controls and DEL in caret notation (ESC is "^[", BEL "^G", a
 * lone CR "^M", DEL "^?"), and the C1 controls U+0080..U+009F (UTF-8
 * C2 80..C2 9F; CSI is U+009B) as "\u009b".  Other bytes pass unchanged,
 * invalid UTF-8 included (a terminal shows it as replacement characters).
 * The server's log windows end on a character, so a chunk never splits a
 * C1 control; a "\r\n" split across two chunks shows as "^M" and a
 * newline. */
int cli_term_escape(const char *in, size_t n, sh_buf *out)
{
    const unsigned char *p = (const unsigned char *)in;
    size_t run = 0; /* bytes before i that pass unchanged */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        int c1 = c == 0xC2 && i + 1 < n && p[i + 1] >= 0x80 && p[i + 1] <= 0x9F;
        int ctl = (c < 0x20 && c != '\n' && c != '\t' && !(c == '\r' && i + 1 < n && p[i + 1] == '\n')) ||
                  c == 0x7F;
        if (!c1 && !ctl) continue;
        if (i > run && sh_buf_append(out, p + run, i - run) < 0) return SH_ENOMEM;
        if (c1) {
            if (sh_buf_printf(out, "\\u%04x", p[i + 1]) < 0) return SH_ENOMEM;
            i++;
        } else if (sh_buf_printf(out, "^%c", c == 0x7F ? '?' : c + 0x40) < 0)
            return SH_ENOMEM;
        run = i + 1;
    }
    if (n > run && sh_buf_append(out, p + run, n - run) < 0) return SH_ENOMEM;
    return SH_OK;
}
