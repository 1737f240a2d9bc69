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
#include "shoal/fleetfile.h"
#include "shoal/server.h"

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

static int make_tokens(const char *path)
{
    if (sh_path_exists(path)) return SH_OK;
    unsigned char r[48];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r) return sh_err_errno(errno, "/dev/urandom");
    close(fd);
    char t[3][33];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 16; i++) snprintf(t[k] + 2 * i, 3, "%02x", r[16 * k + i]);
    json_t *j = json_pack("{s:s,s:s,s:{s:s}}", "admin", t[0], "agent", t[1], "tenants", "default", t[2]);
    char *text = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!text) return sh_err(SH_ENOMEM, "%s", path);
    /* 0600 from the first byte: never chmod'ed after the fact. */
    int rc = sh_write_atomic_mode(path, text, strlen(text), 0600);
    free(text);
    return rc;
}

/* The first folder on dir's path that does not exist (the one mkdir -p
 * creates first) into out; empty when dir exists. */
static void first_missing(const char *dir, char *out, size_t cap)
{
    char p[4096];
    out[0] = 0;
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1;; c++) {
        if (*c && *c != '/') continue;
        char was = *c;
        *c = 0;
        if (!sh_path_exists(p)) {
            snprintf(out, cap, "%s", p);
            return;
        }
        if (!was) return;
        *c = was;
    }
}

/* What a failed start created, so that it can leave nothing behind: the
 * state folder when it made it, else the tokens file and the database
 * (with SQLite's side files) when they were new. */
typedef struct made {
    char top[4096];
    const char *tokens, *db;
} made;

static int undo(const made *m, int rc)
{
    if (m->top[0]) sh_rm_rf(m->top);
    else {
        if (m->tokens) unlink(m->tokens);
        static const char *const side[] = {"", "-wal", "-shm", "-journal"};
        for (int k = 0; m->db && k < 4; k++) {
            char p[4200];
            snprintf(p, sizeof p, "%s%s", m->db, side[k]);
            unlink(p);
        }
    }
    return cli_fail("up", rc);
}

static pid_t spawn_agent(const sh_fleet_node *f, const char *url, const char *token, const char *work, const char *sandbox)
{
    char gpus[16], price[32];
    snprintf(gpus, sizeof gpus, "%d", f->gpus);
    snprintf(price, sizeof price, "%.6g", f->price_per_gpu_hour);
    pid_t parent = getpid();
    pid_t p = fork();
    if (p != 0) return p;
    /* The server lives in `shoal up`: its agents end with it, even on kill -9. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    setenv("SHOAL_TOKEN", token, 1);
    char *argv[] = {"shoal", "agent", "--server", (char *)url, "--name", (char *)f->name, "--gpu-type",
                    (char *)f->gpu_type, "--gpus", gpus, "--zone", (char *)f->zone, "--fabric",
                    (char *)f->fabric, "--price", price, "--work-dir", (char *)work, "--sandbox",
                    (char *)sandbox, NULL};
    execv("/proc/self/exe", argv);
    _exit(127);
}

void cli_up_dir(const char *db, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s", db);
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, cap, ".");
}

/* How many of the fleet's n nodes the server holds alive, polled until all
 * are or `limit` seconds passed; -1 when the server could not be asked. */
static int wait_registered(const char *url, const char *admin, int n, double limit)
{
    srv_client *c;
    if (!admin || srv_client_new(url, admin, &c) < 0) return -1;
    int alive = -1;
    for (double end = sh_now_mono() + limit; alive < n && sh_now_mono() < end;) {
        int st;
        json_t *j = NULL;
        if (srv_client_call(c, "GET", "/v1/nodes", NULL, NULL, 5.0, &st, &j) == 0 && st == 200) {
            json_t *a = json_object_get(j, "nodes"), *v;
            size_t i;
            alive = 0;
            json_array_foreach(a, i, v) {
                const char *state = json_string_value(json_object_get(v, "state"));
                alive += state && !strcmp(state, "alive");
            }
        }
        json_decref(j);
        if (alive < n) sh_sleep(0.1);
    }
    srv_client_free(c);
    return alive;
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
    close(lk); /* the child holds the lock now */
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

int cli_cmd_up(int argc, char **argv)
{
    static const struct option opts[] = {{"fleet", required_argument, 0, 'f'}, {"sandbox", required_argument, 0, 's'},
                                           {"detach", no_argument, 0, 'd'}, {0}};
    const char *fleet = NULL, *sandbox = "auto";
    int detach = 0;
    srv_config cfg = {0};
    cfg.port = 8470;
    cfg.db_path = "shoal-up/shoal.db";
    cli_args a = {"up", usage, opts, NULL, cli_server_opts, "d"};
    int rc;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
        if (c == 'f') fleet = optarg;
        else if (c == 'd') detach = 1;
        else if (c == 's') {
            if (cli_pick("up", "--sandbox", optarg, cli_sandbox_modes) < 0) return CLI_USAGE;
            sandbox = optarg;
        } else if (c == CLI_OPT_EXIT) return a.rc;
        else if ((rc = cli_server_opt(c, optarg, &cfg, "up"))) return rc;
    if (optind < argc) return cli_usage("up", "unexpected argument \"%s\"", argv[optind]);
    cli_server_done(&cfg);
    if (!fleet) return cli_usage("up", "--fleet FLEET.csv is required");
    sh_fleet_file ff;
    if ((rc = sh_fleet_load(fleet, NULL, &ff)) < 0) return cli_fail("up", rc);
    const sh_fleet_node *nodes = ff.nodes;
    int n = (int)ff.n;
    char dir[4096], tokens[4200], work[4200], envf[4200];
    cli_up_dir(cfg.db_path, dir, sizeof dir);
    snprintf(tokens, sizeof tokens, "%s/tokens.json", dir);
    snprintf(work, sizeof work, "%s/work", dir);
    snprintf(envf, sizeof envf, "%s/env", dir);
    made mk = {.db = sh_path_exists(cfg.db_path) ? NULL : cfg.db_path};
    first_missing(dir, mk.top, sizeof mk.top);
    /* The state directory is private: the agents hide it from members and
     * bind each member's own work directory back in. */
    if ((rc = sh_mkdir_p(dir, 0700)) < 0 || (chmod(dir, 0700) < 0 && (rc = sh_err_errno(errno, "chmod %s", dir))))
        return sh_fleet_free(&ff), undo(&mk, rc);
    /* One `shoal up` per state folder: a second would share its database,
     * tokens, env file and work folders (and rewrite env to its own port). */
    char lockf[4200];
    snprintf(lockf, sizeof lockf, "%s/up.lock", dir);
    int lk;
    long held;
    if ((rc = sh_lock_pid(lockf, &lk, &held)) == SH_EEXIST)
        return sh_fleet_free(&ff), undo(&mk, sh_err(SH_EEXIST, "another shoal up (pid %ld) runs on %s (its database, "
                                                               "tokens and env): stop it, or give this one its own "
                                                               "folder with --db DIR/shoal.db",
                                                               held, dir));
    if (rc < 0) return sh_fleet_free(&ff), undo(&mk, rc);
    if (!cfg.tokens_path) {
        if (!sh_path_exists(tokens)) mk.tokens = tokens;
        if ((rc = make_tokens(tokens)) < 0) return sh_fleet_free(&ff), undo(&mk, rc);
        cfg.tokens_path = tokens;
    }
    json_t *tok;
    if ((rc = sh_json_load_file(cfg.tokens_path, 1 << 20, &tok)) < 0) return sh_fleet_free(&ff), undo(&mk, rc);
    /* Detach before the server starts its threads, which a fork would not
     * carry over. */
    if (detach && (rc = detach_start(dir, lk, cfg.db_path)) != 0) {
        json_decref(tok);
        sh_fleet_free(&ff);
        return rc < 0 ? undo(&mk, rc) : 0; /* rc > 0: the parent, done */
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    srv *s;
    if ((rc = srv_start(&cfg, &s)) < 0) return json_decref(tok), sh_fleet_free(&ff), undo(&mk, rc);
    char url[128];
    snprintf(url, sizeof url, "http://%s:%d", cfg.bind_addr ? cfg.bind_addr : "127.0.0.1", srv_port(s));
    const char *agent_tok = json_string_value(json_object_get(tok, "agent"));
    /* Agents write to up.log, not to the pipe the parent reads to its end. */
    if (ready_fd >= 0) dup2(1, 2);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    for (int i = 0; i < n; i++) pids[i] = spawn_agent(&nodes[i], url, agent_tok, work, sandbox);
    /* The env file first: clients may submit at once (jobs queue until
     * the nodes come); the summary once the nodes are there. */
    const char *tenant_tok = json_string_value(json_object_get(json_object_get(tok, "tenants"), "default"));
    char env[512];
    int el = snprintf(env, sizeof env, "export SHOAL_SERVER=%s\nexport SHOAL_TOKEN=%s\n", url,
                      tenant_tok ? tenant_tok : "");
    if ((rc = sh_write_atomic_mode(envf, env, (size_t)el, 0600)) < 0) sh_warn("%s", sh_errmsg());
    int up = wait_registered(url, json_string_value(json_object_get(tok, "admin")), n, 20.0);
    char said[512] = "";
    if (up < n)
        snprintf(said, sizeof said, " (%d registered after 20 s: see %s)", up < 0 ? 0 : up,
                 ready_fd >= 0 ? "up.log beside the database" : "their errors above");
    char *sum = NULL;
    if (asprintf(&sum,
                 "listening on %s\n%d agents started from %s%s; tokens in %s\n"
                 "client:    . %s    (exports SHOAL_SERVER and SHOAL_TOKEN for the tenant \"default\")\n"
                 "dashboard: %s/    (paste the token; or, after the line above, open %s/#token=$SHOAL_TOKEN;\n"
                 "           the \"admin\" token in %s shows every tenant)\n",
                 url, n, fleet, said, cfg.tokens_path, envf, url, url, cfg.tokens_path) < 0)
        sum = NULL;
    if (sum) fputs(sum, stdout);
    fflush(stdout);
    if (ready_fd >= 0) { /* the parent prints it and returns */
        if (sum && (sh_write_all(ready_fd, "R", 1, "up") < 0 || sh_write_all(ready_fd, sum, strlen(sum), "up") < 0))
            sh_warn("%s", sh_errmsg());
        close(ready_fd);
        ready_fd = -1;
    }
    free(sum);
    while (!stop_flag) {
        /* Reap agents that ended (a killed node stays dead, as on a real fleet). */
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        sh_sleep(0.2);
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGTERM);
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) waitpid(pids[i], NULL, 0);
    srv_stop(s);
    close(lk);
    json_decref(tok);
    free(pids);
    sh_fleet_free(&ff);
    return 0;
}
