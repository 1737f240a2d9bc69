#include "cli.h"
#include "cli_rl.h"
int cli_rl_report(int argc, char **argv) { return cli_usage("rl report", "not yet"); }
