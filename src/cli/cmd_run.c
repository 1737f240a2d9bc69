/* shoal run: the main job end to end (`make run`, docs/mainjob.md).  The
 * run itself is src/app/mainjob/run/mainrun.c's (mj_run): here its options
 * (and their SHOAL_RUN_* defaults), the signals, and what is printed. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_int.h"
#include "cli_rl_int.h"
#include "ctl_int.h"
#include "app/mainjob/mainjob.h"

const char cli_help_run[] = "the main job: a local mixed fleet, RL trainer, rollouts, push tree, report";

static const char usage[] =
    "usage: shoal run [--dir RUN] [--port P] [--steps N] [--transport push|direct] [--fleet F --speeds S]\n"
    "                 [--no-fleet-cost] [--fleet-cost-seeds N] [--timeout S] [--sandbox MODE] [--json]\n"
    "Starts a local fleet from F (fleets/local-mixed.csv) on port P (8479), submits\n"
    "the RL trainer (a 2-node H100 gang), the rollout workers (an elastic job on the\n"
    "cheapest GPUs per unit of throughput, speeds from S) and the push tree's root as\n"
    "jobs, prints one line per step until the trainer's result (up to S seconds, 900),\n"
    "stops the fleet, runs the fleet-cost experiment (uniform vs mixed vs tuned\n"
    "pools; --no-fleet-cost skips it) and writes RUN/report.html and summary.json.\n"
    "RUN (build/mainrun, or /var/tmp/shoal-mainrun.UID from a folder under /tmp:\n"
    "ranks see a private /tmp) is emptied first.  When a job fails it stops at once\n"
    "with the job's reason and its failed ranks' last log lines, and exits 1.\n"
    "--transport direct: the workers take every version from the trainer (the\n"
    "baseline).  Defaults come from SHOAL_RUN_DIR, SHOAL_RUN_PORT, SHOAL_RUN_STEPS,\n"
    "SHOAL_RUN_TRANSPORT, SHOAL_RUN_SPEEDS and SHOAL_RUN_FLEET_COST=0 when set.\n"
    "--json prints summary.json's object.\n";

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    if (g_stop) { /* a second one: now */
        signal(sig, SIG_DFL);
        raise(sig);
    }
    g_stop = sig;
}

/* Progress lines on stdout, or on stderr under --json (stdout then holds
 * one JSON object). */
static void say(void *arg, const char *line)
{
    fprintf(arg, "%s\n", line);
    fflush(arg);
}

/* The experiment's progress, from its first step; an interrupt ends it
 * (its runs end with this process). */
static uint64_t g_fc_total;
static void on_progress(void *arg, uint64_t steps)
{
    sh_progress *bar = arg;
    if (g_stop) _exit(130);
    if (!bar->label) sh_progress_start(bar, "fleet cost", g_fc_total, "steps");
    sh_progress_update(bar, steps);
}

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

/* The defaults: SHOAL_RUN_* or the source tree's. */
static void defaults(mj_run_opts *o, char *dir, size_t cap)
{
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
    if (!strncmp(cwd, "/tmp/", 5)) snprintf(dir, cap, "/var/tmp/shoal-mainrun.%d", (int)getuid());
    else snprintf(dir, cap, "%s/build/mainrun", cwd);
    o->dir = env_or("SHOAL_RUN_DIR", dir);
    o->fleet = "fleets/local-mixed.csv";
    o->speeds = env_or("SHOAL_RUN_SPEEDS", "fleets/local-mixed.speeds.csv");
    o->port = atoi(env_or("SHOAL_RUN_PORT", "8479"));
    o->steps = atoi(env_or("SHOAL_RUN_STEPS", "40"));
    o->direct = !strcmp(env_or("SHOAL_RUN_TRANSPORT", "push"), "direct");
    o->fleet_cost = strcmp(env_or("SHOAL_RUN_FLEET_COST", "1"), "0") != 0;
    o->timeout_s = 900;
}

/* Parses the options into o: -1, or the status to exit with. */
static int parse(int argc, char **argv, mj_run_opts *o, int *json)
{
    static const struct option opts[] = {
        {"dir", required_argument, 0, 'd'},      {"port", required_argument, 0, 'p'},
        {"steps", required_argument, 0, 'n'},    {"transport", required_argument, 0, 't'},
        {"fleet", required_argument, 0, 'f'},    {"speeds", required_argument, 0, 'S'},
        {"no-fleet-cost", no_argument, 0, 'N'},  {"fleet-cost-seeds", required_argument, 0, 'c'},
        {"timeout", required_argument, 0, 'T'},  {"sandbox", required_argument, 0, 'b'},
        {"json", no_argument, 0, 'J'},           {0}};
    static const char *const transports[] = {"push", "direct", NULL};
    cli_args a = {"run", usage, opts, NULL};
    int64_t v;
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;) {
        switch (k) {
        case 'd': o->dir = optarg; continue;
        case 'f': o->fleet = optarg; continue;
        case 'S': o->speeds = optarg; continue;
        case 'N': o->fleet_cost = 0; continue;
        case 'J': *json = 1; continue;
        case 'p': if (cli_int(a.cmd, "--port", optarg, 0, 65535, &v)) return CLI_USAGE; o->port = (int)v; continue;
        case 'n': if (cli_int(a.cmd, "--steps", optarg, 1, 100000, &v)) return CLI_USAGE; o->steps = (int)v; continue;
        case 'c': if (cli_int(a.cmd, "--fleet-cost-seeds", optarg, 1, 32, &v)) return CLI_USAGE; o->fc_seeds = (int)v; continue;
        case 'T':
            if (cli_real(a.cmd, "--timeout", optarg, 1, 86400, "seconds in [1,86400]", &o->timeout_s)) return CLI_USAGE;
            continue;
        case 't':
            if (cli_pick(a.cmd, "--transport", optarg, transports) < 0) return CLI_USAGE;
            o->direct = !strcmp(optarg, "direct");
            continue;
        case 'b':
            if (cli_pick(a.cmd, "--sandbox", optarg, cli_sandbox_modes) < 0) return CLI_USAGE;
            o->sandbox = optarg;
            continue;
        default: return a.rc;
        }
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    if (o->steps < 1) return cli_usage(a.cmd, "SHOAL_RUN_STEPS must be a number >= 1");
    return -1;
}

int cli_cmd_run(int argc, char **argv)
{
    static char dir[PATH_MAX + 64], core[PATH_MAX], bin[PATH_MAX + 16];
    mj_run_opts o = {.say = say, .stop = &g_stop};
    int json = 0, rc;
    defaults(&o, dir, sizeof dir);
    if ((rc = parse(argc, argv, &o, &json)) >= 0) return rc;
    o.arg = json ? stderr : stdout;
    /* This is shoal-core; the jobs run the client beside it (SHOAL_BIN: another). */
    ssize_t n = readlink("/proc/self/exe", core, sizeof core - 1);
    if (n <= 0) return cli_fail("run", sh_err_errno(errno, "readlink /proc/self/exe"));
    core[n] = 0;
    snprintf(bin, sizeof bin, "%.*s/shoal", (int)(strrchr(core, '/') - core), core);
    o.core = core;
    o.bin = env_or("SHOAL_BIN", bin);
    srv_config web = {0};
    cli_server_done(&web);
    o.web_dir = web.web_dir;
    mj_fleetcost_opts fo;
    rl_config fb;
    mj_fleetcost_default(&fo, &fb);
    g_fc_total = 3 * (uint64_t)(o.fc_seeds ? o.fc_seeds : fo.seeds) * (uint64_t)fb.steps;
    sh_progress bar = {0};
    o.fc_progress = on_progress, o.fc_arg = &bar;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    json_t *sum = NULL;
    rc = mj_run(&o, &sum);
    if (bar.label) cli_progress_end(&bar, rc);
    if (rc < 0) return cli_fail("run", rc);
    if (json) sh_json_print(sum);
    else cli_rl_print_moved(sum, o.dir);
    json_decref(sum);
    return 0;
}
