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
    if (srv_client_new(x->server, x->token, &x->c) < 0) return cli_usage(x->cmd, "%s", sh_errmsg());
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
    srv_client_free(x->c);
    x->c = NULL;
}

int cli_ctl_call(cli_ctl *x, const char *method, const char *path, const json_t *body,
                 const char *extra_header, json_t **reply)
{
    int status = 0;
    *reply = NULL;
    int rc = srv_client_call(x->c, method, path, body, extra_header, 30, &status, reply);
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
