/* shoal agent: registers this node with a server and runs what it assigns. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
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

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = sig; }

int cli_cmd_agent(int argc, char **argv)
{
    agent_config cfg = {0};
    cfg.server = getenv("SHOAL_SERVER");
    if (!cfg.server || !*cfg.server) cfg.server = "http://127.0.0.1:8470";
    cfg.token = getenv("SHOAL_TOKEN");
    cfg.gpus = -1;
    int probe = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) return fputs(usage, stdout), 0;
        if (!strcmp(a, "--probe")) { probe = 1; continue; }
        if (!strcmp(a, "--from-provider")) { cfg.from_provider = 1; continue; }
        if (!v) return cli_usage("agent", "unknown option or missing value: \"%s\"", a);
        if (!strcmp(a, "--name")) cfg.name = v;
        else if (!strcmp(a, "--server")) cfg.server = v;
        else if (!strcmp(a, "--token")) cfg.token = v;
        else if (!strcmp(a, "--gpu-type")) cfg.gpu_type = v;
        else if (!strcmp(a, "--zone")) cfg.zone = v;
        else if (!strcmp(a, "--fabric")) cfg.fabric = v;
        else if (!strcmp(a, "--addr")) cfg.addr = v;
        else if (!strcmp(a, "--work-dir")) cfg.work_dir = v;
        else if (!strcmp(a, "--sandbox")) {
            if (strcmp(v, "auto") && strcmp(v, "bwrap") && strcmp(v, "gvisor") && strcmp(v, "none"))
                return cli_usage("agent", "--sandbox: expected auto, bwrap, gvisor or none, got \"%s\"", v);
            cfg.sandbox = v;
        } else if (!strcmp(a, "--gpus")) {
            int64_t n;
            if (sh_parse_i64(v, &n, "--gpus") < 0 || n < 0 || n > 64) return cli_usage("agent", "--gpus: expected 0..64, got \"%s\"", v);
            cfg.gpus = (int)n;
        } else if (!strcmp(a, "--price")) {
            if (sh_parse_double(v, &cfg.price, "--price") < 0 || cfg.price < 0) return cli_usage("agent", "--price: expected dollars >= 0, got \"%s\"", v);
        } else return cli_usage("agent", "unknown option \"%s\"", a);
        i++;
    }
    if (probe) {
        char s[256];
        int rc = agent_probe_sandbox(cfg.sandbox ? cfg.sandbox : "auto", s, sizeof s);
        if (rc < 0) return cli_fail("agent", rc);
        char t[64];
        int n = 0;
        printf("sandbox %s\n", s);
        if (agent_detect_gpus(t, sizeof t, &n) == 0) printf("gpus    %d x %s (nvidia-smi)\n", n, t);
        else printf("gpus    none detected (%s): declare them with --gpu-type and --gpus\n", sh_errmsg());
        return 0;
    }
    if (!cfg.name) return cli_usage("agent", "--name NODE is required");
    if ((cfg.gpu_type == NULL) != (cfg.gpus < 0) && cfg.gpus < 0)
        cfg.gpus = -1; /* a type alone: count with nvidia-smi */
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    int rc = agent_run(&cfg, &stop_flag);
    return rc < 0 ? cli_fail("agent", rc) : 0;
}
