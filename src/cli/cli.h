/* Shared helpers for the command line (src/cli only).
 *
 * Each command lives in src/cli/cmd_<name>.c and defines
 *     const char cli_help_<name>[];            one line for `shoal help`
 *     int cli_cmd_<name>(int argc, char **argv); argv[0] is the command name
 * and each benchmark in src/cli/bench_<name>.c defines cli_bench_help_<name>
 * and cli_bench_<name>.  scripts/gen-commands.sh builds the table from the
 * file names.  A command returns its exit status: 0 on success, 1 when the
 * work failed, 2 for bad usage. */
#ifndef SHOAL_CLI_H
#define SHOAL_CLI_H

#include <getopt.h>

#include "shoal/common.h"

#define CLI_USAGE 2

/* ---- Options (opts.c) ----------------------------------------------------
 * Every command parses its options with cli_getopt, a getopt_long loop that
 * also answers --help (the usage, on stdout) and --version, takes
 * --server, --token and --json for commands that talk to a server, accepts
 * --opt=value and --opt value, and answers a mistyped option with the
 * closest one.  Usage:
 *
 *     static const struct option opts[] = {{"limit", required_argument, 0, 'l'}, {0}};
 *     cli_args a = {"jobs", usage, opts, &ctl};
 *     for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
 *         switch (c) {
 *         case 'l': limit = optarg; break;
 *         default: return a.rc;
 *         }
 *     ... positional arguments are argv[optind .. argc) ...
 *
 * Option values are returned as given by the table (only -h is a short
 * option); CLI_OPT_EXIT means the command must return a.rc (0 after --help
 * or --version, 2 after a usage error, whose message is printed). */
enum {
    CLI_OPT_EXIT = -2,
    CLI_OPT_HELP = 0x1000,
    CLI_OPT_VERSION,
    CLI_OPT_SERVER,
    CLI_OPT_TOKEN,
    CLI_OPT_JSON,
};
#define CLI_MAX_OPTS 64
struct cli_ctl;
typedef struct cli_args {
    const char *cmd;            /* "jobs", or "store publish" */
    const char *usage;          /* printed by --help */
    const struct option *opts;  /* the command's own options, ended by {0} */
    struct cli_ctl *ctl;        /* non-NULL: also --server, --token, --json */
    int rc;                     /* the status to return after CLI_OPT_EXIT */
    int ready;
    struct option all[CLI_MAX_OPTS];
} cli_args;
int cli_getopt(cli_args *a, int argc, char **argv);
/* The index of v in the NULL-terminated list allowed, or -1 after printing
 * a usage error that lists the choices and the closest one. */
int cli_pick(const char *cmd, const char *opt, const char *v, const char *const *allowed);

/* Prints "shoal <cmd>: <message>" for the thread's last error and returns 1. */
int cli_fail(const char *cmd, int rc);
/* Prints "shoal <cmd>: <formatted>" and a hint to run --help; returns 2. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends a progress bar: drawn full when rc is SH_OK; otherwise only its line
 * is ended, so that the error message that follows starts a line. */
void cli_progress_end(sh_progress *pg, int rc);
/* Runs this binary with argv (argv[0] "shoal", NULL-terminated; output
 * discarded) and samples the child's RssAnon: *peak gets its maximum and
 * *secs the wall time.  A non-zero exit is an error. */
int cli_peak_anon(char *const argv[], uint64_t *peak, double *secs);

#endif
