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

#include "shoal/common.h"

#define CLI_USAGE 2

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
