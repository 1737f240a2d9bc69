/* Helpers shared by the commands that talk to a server (src/cli only). */
#ifndef SHOAL_CLI_CTL_H
#define SHOAL_CLI_CTL_H

#include "shoal/client.h"
#include "shoal/server.h"

typedef struct cli_ctl {
    const char *cmd;
    /* What the request sent, if a file (submit): a 4xx's message names it
     * in place of the server's "job: ". */
    const char *subject;
    const char *server, *token;
    int json;
    client_conn *c;
} cli_ctl;

/* Fills x with the defaults: SHOAL_SERVER (else http://127.0.0.1:8470)
 * and SHOAL_TOKEN.  cli_getopt then overrides them from the options. */
void cli_ctl_defaults(cli_ctl *x, const char *cmd);
/* Opens the client for x->server; returns 0 or a usage status. */
int cli_ctl_connect(cli_ctl *x);
void cli_ctl_free(cli_ctl *x);
/* The one job id left after the options (argv[optind..argc)): 0 with *id
 * set, else a usage error naming what was wrong and its exit status. */
int cli_ctl_job_id(const char *cmd, int argc, char **argv, int64_t *id);
/* One request; on a transport failure or an HTTP error prints
 * "shoal CMD: ..." with the server's message and returns 1, else 0.
 * *reply (caller owns) is set on success. */
int cli_ctl_call(cli_ctl *x, const char *method, const char *path, const json_t *body,
                 const char *extra_header, json_t **reply);
/* The whole of a command that takes no argument and GETs one path: parses
 * --help and the common options, fetches `path`, and with --json prints the
 * reply.  Returns -1 with *reply set (caller owns) when the caller should
 * print it as a table, else the command's exit status. */
int cli_ctl_get_table(const char *cmd, int argc, char **argv, const char *usage, const char *path,
                      json_t **reply);
/* The server's options, shared by `shoal server` and `shoal up`: the
 * table goes in cli_args.more, and each option cli_getopt returns from it
 * goes to cli_server_opt, which sets it in cfg (0, or prints a usage error
 * and returns its status).  cli_server_done fills what was left out. */
struct srv_config;
extern const struct option cli_server_opts[];
int cli_server_opt(int c, const char *v, struct srv_config *cfg, const char *cmd);
void cli_server_done(struct srv_config *cfg);
/* The exit status a script gets for an ended job (submit --wait, logs -f):
 * 0 if it succeeded, its exit code (1..255) if a rank failed with one, 1
 * if it failed without one (a lost node, its time limit) or was cancelled. */
int cli_job_status(const json_t *job);
/* Polls GET /v1/jobs/ID until the job has ended; *job (caller owns) gets
 * its last JSON.  Returns 0, or 1 after printing the failed request. */
int cli_ctl_wait_job(cli_ctl *x, int64_t id, json_t **job);
/* Whether a job's JSON says it has ended (succeeded, failed, cancelled). */
int cli_job_ended(const json_t *job);
/* Prints "shoal CMD: job ID STATE: REASON" to stderr for a job that did not
 * succeed (nothing for one that did), and returns cli_job_status(job). */
int cli_job_report(const char *cmd, const json_t *job);

/* Appends in[0..n) to out with every byte a terminal would act on, other
 * than newline, tab and the CR of "\r\n", shown in a visible form (C0 and
 * DEL as "^[", "^M", "^?"; C1 controls as "\u009b"): for another tenant's
 * text (a rank's output) on the admin's terminal.  SH_ENOMEM or 0. */
int cli_term_escape(const char *in, size_t n, sh_buf *out);
/* "3m12s" style durations and a local time "14:03:07" for tables. */
const char *cli_fmt_dur(double s, char *buf, size_t cap);
const char *cli_fmt_time(double wall, char *buf, size_t cap);

#endif
