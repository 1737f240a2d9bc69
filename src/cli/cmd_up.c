/* shoal up: a whole local fleet on this machine — the server in this process
 * and one agent process per node of a fleet file, with declared GPU types
 * (no GPUs needed). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_int.h"
#include "ctl_int.h"
#include "shoal/fleet.h"

const char cli_help_up[] = "start a local fleet: a server and one agent per node of a fleet file";

static const char usage[] =
    "usage: shoal up --fleet FLEET.csv [--db PATH] [--port P] [--tokens FILE] [--sandbox auto|bwrap|gvisor|none]\n"
    "                [-d|--detach] [server options: --heartbeat-timeout S, --provider-cmd PROG, --web DIR, ...]\n\n"
    "FLEET.csv has a header naming its columns, in any order, and one line per node\n"
    "(docs/fleet-format.md; `shoal sim --fleet` reads the same files):\n"
    "    name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n"
    "    a100-0,A100,8,us-east-1a,ib-0,1.80\n\n"
    "--db defaults to shoal-up/shoal.db.  Without --tokens, a tokens file is created\n"
    "beside the database (tokens.json) with an admin, an agent and a tenant \"default\"\n"
    "token, and shoal-up/env exports SHOAL_SERVER and SHOAL_TOKEN for the tenant\n"
    "(`. shoal-up/env`).  The dashboard is at the server's address; it asks for a token.\n"
    "Jobs may write only their own work directory, a private /tmp and directories\n"
    "given with --allow-writable DIR (repeatable; docs/security.md).\n"
    "Prints where to reach it once every agent has registered (or after 20 s, saying\n"
    "how many did).  Stops (with its agents) on SIGINT or SIGTERM.\n"
    "-d, --detach: run in the background, in its own session, once started: the\n"
    "command returns when the fleet is up (its output then goes to up.log beside\n"
    "the database) and `shoal down --db PATH` stops it; a start that fails says why\n"
    "and exits non-zero.\n";

static volatile sig_atomic_t stop_flag;
/* --detach: the child's end of the pipe its parent waits on, or -1. */
static int ready_fd = -1;
static void on_signal(int sig) { stop_flag = sig; }

void cli_up_dir(const char *db, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s", db);
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, cap, ".");
}

/* --detach: forks.  The parent waits on a pipe until the child says the
 * fleet is up (it prints the child's summary and returns 1) or the child
 * ends first (it prints what the child said and returns its error).  The
 * child (0) leaves the terminal's session, takes over the lock in `lk`
 * (writing its own pid), and sends its output to DIR/up.log; its errors go
 * to the parent until the agents start. */
static int detach_start(const char *dir, int lk, const char *db)
{
    char logp[4200];
    snprintf(logp, sizeof logp, "%s/up.log", dir);
    int log = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log < 0) return sh_err_errno(errno, "open %s", logp);
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) return close(log), sh_err_errno(errno, "pipe");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return close(log), close(pfd[0]), close(pfd[1]), sh_err_errno(errno, "fork");
    if (pid == 0) {
        close(pfd[0]);
        setsid();
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0), close(nul);
        dup2(log, 1);
        dup2(pfd[1], 2); /* until the agents start: errors reach the user */
        close(log);
        ready_fd = pfd[1];
        char p[32];
        int k = snprintf(p, sizeof p, "%ld\n", (long)getpid());
        if (ftruncate(lk, 0) < 0 || pwrite(lk, p, (size_t)k, 0) != k) sh_warn("%s/up.lock: cannot write the pid", dir);
        return 0;
    }
    close(pfd[1]);
    close(log);
    sh_buf b = {0};
    for (;;) {
        if (sh_buf_reserve(&b, 4096) < 0) break;
        ssize_t r = read(pfd[0], b.data + b.len, b.cap - b.len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        b.len += (size_t)r;
    }
    close(pfd[0]);
    if (b.data) b.data[b.len] = 0;
    if (b.len && b.data[0] == 'R') {
        fputs((const char *)b.data + 1, stdout);
        printf("running in the background (pid %ld, output in %s); stop it with `shoal down --db %s`\n", (long)pid,
               logp, db);
        sh_buf_free(&b);
        return 1;
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (b.len) fputs((const char *)b.data, stderr);
    else fprintf(stderr, "shoal up: the background process ended before the fleet was up (%s %d)\n",
                 WIFSIGNALED(st) ? "signal" : "status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    sh_buf_free(&b);
    exit(WIFEXITED(st) && WEXITSTATUS(st) ? WEXITSTATUS(st) : 1);
}

/* What to print once the fleet is up: where, the tokens, the env file. */
static char *summary(const fleet *f, const char *fleet_csv, int detached)
{
    int n = fleet_nodes(f), up = fleet_registered(f);
    char said[512] = "", *sum = NULL;
    if (up < n)
        snprintf(said, sizeof said, " (%d registered after 20 s: see %s)", up < 0 ? 0 : up,
                 detached ? "up.log beside the database" : "their errors above");
    const char *url = fleet_url(f), *tp = fleet_tokens_path(f);
    if (asprintf(&sum,
                 "listening on %s\n%d agents started from %s%s; tokens in %s\n"
                 "client:    . %s    (exports SHOAL_SERVER and SHOAL_TOKEN for the tenant \"default\")\n"
                 "dashboard: %s/    (paste the token; or, after the line above, open %s/#token=$SHOAL_TOKEN;\n"
                 "           the \"admin\" token in %s shows every tenant)\n",
                 url, n, fleet_csv, said, tp, fleet_env_path(f), url, url, tp) < 0)
        return NULL;
    return sum;
}

/* Parses the options into o (its server part too) and *detach: -1, or the
 * status to exit with. */
static int parse(int argc, char **argv, fleet_opts *o, int *detach)
{
    static const struct option opts[] = {{"fleet", required_argument, 0, 'f'}, {"sandbox", required_argument, 0, 's'},
                                           {"detach", no_argument, 0, 'd'}, {0}};
    o->sandbox = "auto";
    o->server.port = 8470;
    o->server.db_path = "shoal-up/shoal.db";
    cli_args a = {"up", usage, opts, NULL, cli_server_opts, "d"};
    int rc;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
        if (c == 'f') o->fleet_csv = optarg;
        else if (c == 'd') *detach = 1;
        else if (c == 's') {
            if (cli_pick("up", "--sandbox", optarg, cli_sandbox_modes) < 0) return CLI_USAGE;
            o->sandbox = optarg;
        } else if (c == CLI_OPT_EXIT) return a.rc;
        else if ((rc = cli_server_opt(c, optarg, &o->server, "up"))) return rc;
    if (optind < argc) return cli_usage("up", "unexpected argument \"%s\"", argv[optind]);
    cli_server_done(&o->server);
    if (!o->fleet_csv) return cli_usage("up", "--fleet FLEET.csv is required");
    return -1;
}

int cli_cmd_up(int argc, char **argv)
{
    fleet_opts o = {0};
    int detach = 0, rc = parse(argc, argv, &o, &detach);
    if (rc >= 0) return rc;
    /* Detached, the agents write to up.log, not to the pipe the parent
     * reads to its end. */
    char dir[4096], logp[4200];
    cli_up_dir(o.server.db_path, dir, sizeof dir);
    snprintf(logp, sizeof logp, "%s/up.log", dir);
    if (detach) o.agent_log = logp;
    fleet *f;
    if ((rc = fleet_prepare(&o, &f)) < 0) return cli_fail("up", rc);
    /* Detach before the server starts its threads, which a fork would not
     * carry over. */
    if (detach && (rc = detach_start(fleet_dir(f), fleet_lock_fd(f), o.server.db_path)) != 0) {
        fleet_stop(f); /* rc > 0: the parent, done (the child holds the lock) */
        return rc < 0 ? cli_fail("up", rc) : 0; /* the parent closes its copy of the lock */
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    if ((rc = fleet_launch(f)) < 0) {
        fleet_stop(f);
        return cli_fail("up", rc);
    }
    char *sum = summary(f, o.fleet_csv, ready_fd >= 0);
    if (sum) fputs(sum, stdout);
    fflush(stdout);
    if (ready_fd >= 0) { /* the parent prints it and returns */
        if (sum && (sh_write_all(ready_fd, "R", 1, "up") < 0 || sh_write_all(ready_fd, sum, strlen(sum), "up") < 0))
            sh_warn("%s", sh_errmsg());
        close(ready_fd);
        ready_fd = -1;
        dup2(1, 2);
    }
    free(sum);
    while (!stop_flag) {
        fleet_reap(f);
        sh_sleep(0.2);
    }
    fleet_stop(f);
    return 0;
}
