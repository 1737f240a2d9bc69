/* shoal rl sweep (placeholder filled in below). */
#include "cli.h"
#include "cli_rl.h"
int cli_rl_sweep(int argc, char **argv) { return cli_usage("rl sweep", "not yet"); }
