/* Shared between shoal rl train and shoal rl sweep (src/cli only). */
#ifndef SHOAL_CLI_RL_H
#define SHOAL_CLI_RL_H

#include "shoal/rl.h"

/* Parses rl train options (argv without the subcommand) into c, which holds
 * defaults; --json sets *json.  Prints the error and returns 2 on bad
 * usage, 0 otherwise. */
int cli_rl_parse(const char *cmd, int argc, char **argv, rl_config *c, int *json);
int cli_rl_sweep(int argc, char **argv);
/* The main job (src/cli/rl_main.c, rl_report.c, rl_fleetcost.c). */
int cli_rl_trainer(int argc, char **argv);
int cli_rl_worker(int argc, char **argv);
int cli_rl_report(int argc, char **argv);
int cli_rl_fleet_cost(int argc, char **argv);

#endif
