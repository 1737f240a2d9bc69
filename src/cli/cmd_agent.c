/* shoal agent: registers this node with a server and runs what it assigns. */
#include <float.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "shoal/agent.h"

const char cli_help_agent[] = "run a node agent: register, heartbeat, launch sandboxed workloads";

static const char usage[] =
    "usage: shoal agent --name NODE [--server URL] [--token T] [--gpu-type T --gpus N]\n"
    "                   [--zone Z] [--fabric F] [--price P] [--addr A] [--work-dir DIR]\n"
    "                   [--sandbox auto|bwrap|gvisor|none] [--from-provider] [--probe]\n\n"
    "  --server URL     the server (default $SHOAL_SERVER or http://127.0.0.1:8470)\n"
    "  --token T        the agents' join token (default $SHOAL_TOKEN); registering\n"
    "                   gets the node its own credential, which its polls carry\n"
    "  --gpu-type/--gpus  declare the GPUs (default: detect with nvidia-smi)\n"
    "  --zone, --fabric where the node sits (gangs stay in one zone and fabric)\n"
    "  --price P        dollars per GPU-hour, for the billing ledger\n"
    "  --addr A         address other ranks reach this node at (MASTER_ADDR)\n"
    "  --work-dir DIR   members' working directories (default /tmp/shoal-agent)\n"
    "  --sandbox MODE   gvisor: each rank under runsc; bwrap: bubblewrap, an unprivileged\n"
    "                   uid, seccomp and cgroup limits; auto (default): bwrap;\n"
    "                   none: no isolation (trusted code only).\n"
    "                   docs/security.md says what each guarantees\n"
    "  --probe          print the isolation this kernel allows and the GPUs nvidia-smi\n"
    "                   finds, and exit\n";

const char *const cli_sandbox_modes[] = {"auto", "bwrap", "gvisor", "none", NULL};

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = sig; }

/* Parses the options into cfg and *probe: -1, or the status to exit with. */
static int parse(int argc, char **argv, agent_config *cfg, int *probe)
{
    static const struct option opts[] = {{"name", required_argument, 0, 'n'},      {"server", required_argument, 0, 'S'},
                                         {"token", required_argument, 0, 'T'},     {"gpu-type", required_argument, 0, 't'},
                                         {"gpus", required_argument, 0, 'g'},      {"zone", required_argument, 0, 'z'},
                                         {"fabric", required_argument, 0, 'f'},    {"price", required_argument, 0, 'p'},
                                         {"addr", required_argument, 0, 'a'},      {"work-dir", required_argument, 0, 'w'},
                                         {"sandbox", required_argument, 0, 's'},   {"from-provider", no_argument, 0, 'F'},
                                         {"probe", no_argument, 0, 'P'},           {0}};
    cli_args a = {"agent", usage, opts, NULL};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        int64_t n;
        switch (c) {
        case 'n': cfg->name = optarg; break;
        case 'S': cfg->server = optarg; break;
        case 'T': cfg->token = optarg; break;
        case 't': cfg->gpu_type = optarg; break;
        case 'z': cfg->zone = optarg; break;
        case 'f': cfg->fabric = optarg; break;
        case 'a': cfg->addr = optarg; break;
        case 'w': cfg->work_dir = optarg; break;
        case 'F': cfg->from_provider = 1; break;
        case 'P': *probe = 1; break;
        case 's':
            if (cli_pick("agent", "--sandbox", optarg, cli_sandbox_modes) < 0) return CLI_USAGE;
            cfg->sandbox = optarg;
            break;
        case 'g':
            if (cli_int("agent", "--gpus", optarg, 0, 64, &n)) return CLI_USAGE;
            cfg->gpus = (int)n;
            break;
        case 'p':
            if (cli_real("agent", "--price", optarg, 0, DBL_MAX, "dollars >= 0", &cfg->price)) return CLI_USAGE;
            break;
        default: return a.rc;
        }
    }
    if (optind < argc) return cli_usage("agent", "unexpected argument \"%s\"", argv[optind]);
    return -1;
}

/* --probe: the sandbox this node would use and the GPUs it has. */
static int probe_node(const char *sandbox)
{
    char s[256], t[64];
    int n = 0, rc = agent_probe_sandbox(sandbox ? sandbox : "auto", s, sizeof s);
    if (rc < 0) return cli_fail("agent", rc);
    printf("sandbox %s\n", s);
    if (agent_detect_gpus(t, sizeof t, &n) == 0) printf("gpus    %d x %s (nvidia-smi)\n", n, t);
    else printf("gpus    none detected (%s): declare them with --gpu-type and --gpus\n", sh_errmsg());
    return 0;
}

int cli_cmd_agent(int argc, char **argv)
{
    agent_config cfg = {0};
    cfg.server = getenv("SHOAL_SERVER");
    if (!cfg.server || !*cfg.server) cfg.server = "http://127.0.0.1:8470";
    cfg.token = getenv("SHOAL_TOKEN");
    cfg.gpus = -1;
    int probe = 0, rc = parse(argc, argv, &cfg, &probe);
    if (rc >= 0) return rc;
    if (probe) return probe_node(cfg.sandbox);
    if (!cfg.name) return cli_usage("agent", "--name NODE is required");
    if ((cfg.gpu_type == NULL) != (cfg.gpus < 0) && cfg.gpus < 0)
        cfg.gpus = -1; /* a type alone: count with nvidia-smi */
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    rc = agent_run(&cfg, &stop_flag);
    return rc < 0 ? cli_fail("agent", rc) : 0;
}
