/* Shared between shoal rl train and shoal rl sweep (src/cli only). */
#ifndef SHOAL_CLI_RL_H
#define SHOAL_CLI_RL_H

#include "shoal/rl.h"

#include <getopt.h>

/* The options of `rl train`, also taken by rl trainer, rl worker and rl
 * sweep: put the table in cli_args (opts, or more beside a subcommand's
 * own) and hand each option cli_getopt returns from it to cli_rl_opt, which
 * sets it in c (0, or prints a usage error naming cmd and returns its
 * status).  --json and --verbose (CLI_RL_JSON, CLI_RL_VERBOSE) are the
 * caller's to read; cli_rl_opt ignores them.  cli_rl_check checks the
 * whole configuration once the options are read. */
enum { CLI_RL_OPT = 0x3000, CLI_RL_JSON = 0x3100, CLI_RL_QUIET, CLI_RL_NO_RESPAWN, CLI_RL_ORDERED, CLI_RL_VERBOSE };
extern const struct option cli_rl_opts[];
int cli_rl_opt(const char *cmd, int code, const char *v, rl_config *c);
/* The option's name without "--", or NULL for a code not in cli_rl_opts. */
const char *cli_rl_opt_name(int code);
int cli_rl_check(const char *cmd, rl_config *c);
/* Parses rl train options (argv without the subcommand: a list the trainer
 * hands its workers) into c, which holds defaults, and checks them; --json
 * sets *json.  Prints the error and returns 2 on bad usage, 0 otherwise. */
int cli_rl_parse(const char *cmd, int argc, char **argv, rl_config *c, int *json);
int cli_rl_sweep(int argc, char **argv);
/* The main job (src/cli/rl_main.c, rl_report.c, rl_fleetcost.c). */
int cli_rl_trainer(int argc, char **argv);
int cli_rl_worker(int argc, char **argv);
int cli_rl_push_root(int argc, char **argv);
int cli_rl_report(int argc, char **argv);
/* What moved (summary.json) against its targets, and where the report is. */
void cli_rl_print_moved(const json_t *summary, const char *dir);
int cli_rl_fleet_cost(int argc, char **argv);

#endif
