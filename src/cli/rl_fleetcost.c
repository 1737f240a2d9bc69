#include "cli.h"
#include "cli_rl.h"
int cli_rl_fleet_cost(int argc, char **argv) { return cli_usage("rl fleet-cost", "not yet"); }
