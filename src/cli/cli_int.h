/* Shared helpers for the command line (src/cli only).
 *
 * Each command lives in src/cli/cmd_<name>.c and defines
 *     const char cli_help_<name>[];            one line for `shoal help`
 *     int cli_cmd_<name>(int argc, char **argv); argv[0] is the command name
 * and each benchmark in bench/bench_<name>.c defines cli_bench_help_<name>
 * and cli_bench_<name>.  scripts/gen-commands.sh builds the table from the
 * file names.  A command returns its exit status: 0 on success, 1 when the
 * work failed, 2 for bad usage. */
#ifndef SHOAL_CLI_H
#define SHOAL_CLI_H

#include <getopt.h>
#include <sys/types.h>

#include "shoal/common.h"

#define CLI_USAGE 2

/* ---- Options (opts.c) ----------------------------------------------------
 * Every command parses its options with cli_getopt, a getopt_long loop that
 * also answers --help (the usage, on stdout, wherever it stands before a
 * "--", even after a bad option) and --version, takes
 * --server, --token and --json for commands that talk to a server, accepts
 * --opt=value and --opt value, and answers a mistyped option with the
 * closest one.  Usage:
 *
 *     static const struct option opts[] = {{"limit", required_argument, 0, 'l'}, {0}};
 *     cli_args a = {"jobs", usage, opts, &ctl};   (NULL for a command with no server)
 *     for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
 *         switch (c) {
 *         case 'l': limit = optarg; break;
 *         default: return a.rc;
 *         }
 *     ... positional arguments are argv[optind .. argc) ...
 *
 * Option values are returned as given by the table; the short options are
 * -h and those in shorts.  CLI_OPT_EXIT means the command must return a.rc
 * (0 after --help or --version, 2 after a usage error, whose message is
 * printed). */
enum {
    CLI_OPT_EXIT = -2,
    CLI_OPT_HELP = 0x1000,
    CLI_OPT_VERSION,
    CLI_OPT_SERVER,
    CLI_OPT_TOKEN,
    CLI_OPT_JSON,
};
#define CLI_MAX_OPTS 128
struct cli_ctl;
typedef struct cli_args {
    const char *cmd;            /* "jobs", or "store publish" */
    const char *usage;          /* printed by --help */
    const struct option *opts;  /* the command's own options, ended by {0} */
    struct cli_ctl *ctl;        /* non-NULL: also --server, --token, --json */
    const struct option *more;  /* NULL, or options shared with other commands */
    const char *shorts;         /* NULL, or short options beside -h ("o:j:") */
    const struct option *elsewhere; /* NULL, or the options of sibling subcommands */
    int rc;                     /* the status to return after CLI_OPT_EXIT */
    int ready;
    struct option all[CLI_MAX_OPTS];
    char optstring[32];
} cli_args;
int cli_getopt(cli_args *a, int argc, char **argv);
/* Option values as numbers: each parses v (sh_parse_i64, sh_parse_double,
 * sh_parse_size) into *out when it lies in lo..hi and returns 0, or prints
 * a usage error naming cmd, the option and the bad value ("shoal agent:
 * --gpus must be 0..64, got \"x\"") and returns CLI_USAGE.  cli_real's
 * what says the range in words for that message ("seconds > 0"). */
int cli_int(const char *cmd, const char *opt, const char *v, int64_t lo, int64_t hi, int64_t *out);
int cli_real(const char *cmd, const char *opt, const char *v, double lo, double hi, const char *what, double *out);
int cli_size(const char *cmd, const char *opt, const char *v, uint64_t lo, uint64_t *out);
/* A push-tree address, IPV4:PORT with PORT 1..65535 (what bcast connects
 * to): 0, or a usage error naming the option and the value. */
int cli_hostport(const char *cmd, const char *opt, const char *v);
/* The subcommand argv[1] of cmd, as its index in the NULL-terminated list
 * names; or -1 with *rc set after answering a missing subcommand (usage on
 * stderr, 2), --help or -h (usage on stdout, 0), --version (0) or an
 * unknown one (a usage error that suggests the closest, 2).  The
 * subcommand then parses argv + 1 with cli_getopt and its own cli_args,
 * named "cmd sub". */
int cli_subcommand(const char *cmd, const char *usage, int argc, char **argv, const char *const *names, int *rc);
/* The options of table all whose short codes are in keep, ended by {0}
 * (out has room for CLI_MAX_OPTS): a subcommand's share of its command's.
 * Put all in cli_args.elsewhere to have an option of another subcommand
 * named as such. */
const struct option *cli_opts_pick(const struct option *all, const char *keep, struct option *out);
/* The index of v in the NULL-terminated list allowed, or -1 after printing
 * a usage error that lists the choices and the closest one. */
int cli_pick(const char *cmd, const char *opt, const char *v, const char *const *allowed);

/* The values of --sandbox (cmd_agent.c; `shoal up` passes it on). */
extern const char *const cli_sandbox_modes[];

/* Prints "shoal <cmd>: <message>" for the thread's last error and returns 1. */
int cli_fail(const char *cmd, int rc);
/* Prints "shoal <cmd>: <formatted>" and a hint to run --help; returns 2. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends a progress bar: drawn full when rc is SH_OK; otherwise only its line
 * is ended, so that the error message that follows starts a line. */
void cli_progress_end(sh_progress *pg, int rc);
/* `shoal up`'s state folder for its --db path: the database's folder. */
void cli_up_dir(const char *db, char *dir, size_t cap);
/* Runs this binary with argv (argv[0] "shoal", NULL-terminated; output
 * discarded) and samples the child's RssAnon: *peak gets its maximum and
 * *secs the wall time.  A non-zero exit is an error. */
int cli_peak_anon(char *const argv[], uint64_t *peak, double *secs);
/* Starts this binary with argv (argv[0] a name, argv[1] the subcommand),
 * stdout to out_path (truncated) and stderr appended to err_path: its pid,
 * or -1.  Benchmarks start roots and replicas with it (bench/proc.c). */
pid_t cli_bench_spawn(char *const argv[], const char *out_path, const char *err_path);
/* Waits up to timeout s for a push root (process pid, logging to log) to
 * write its address into addr_file; copies it to addr.  Fails at once,
 * naming the log, if the root exits first. */
int cli_bench_root_addr(const char *addr_file, pid_t pid, const char *log, double timeout, char *addr, size_t cap);
/* The version a replica directory's ACTIVE names (0 if none yet). */
uint64_t cli_bench_active(const char *dir);

#endif
