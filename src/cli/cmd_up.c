/* shoal up: a whole local fleet on this machine — the server in this process
 * and one agent process per node of a fleet file, with declared GPU types
 * (no GPUs needed). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "ctl.h"
#include "shoal/server.h"

const char cli_help_up[] = "start a local fleet: a server and one agent per node of a fleet file";

static const char usage[] =
    "usage: shoal up --fleet FLEET.csv [--db PATH] [--port P] [--tokens FILE] [--sandbox auto|bwrap|gvisor|none]\n"
    "                [server options: --heartbeat-timeout S, --provider-cmd PROG, --web DIR, ...]\n\n"
    "FLEET.csv has a header and one line per node (docs/server-api.md, \"Fleet files\"):\n"
    "    name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n"
    "    a100-0,A100,8,us-east-1a,ib-0,1.80\n\n"
    "--db defaults to shoal-up/shoal.db.  Without --tokens, a tokens file is created\n"
    "beside the database (tokens.json) with an admin, an agent and a tenant \"default\"\n"
    "token, and shoal-up/env holds SHOAL_SERVER and SHOAL_TOKEN for the tenant.\n"
    "Jobs may write only their own work directory, a private /tmp and directories\n"
    "given with --allow-writable DIR (repeatable; docs/security.md).\n"
    "Stops (with its agents) on SIGINT or SIGTERM.\n";

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = sig; }

typedef struct fleet_node {
    char name[64], gpu_type[32], gpus[8], zone[32], fabric[32], price[16];
} fleet_node;

static int parse_fleet(const char *path, fleet_node **out, int *n)
{
    char *text;
    size_t len;
    SH_TRY(sh_read_file(path, 64 << 20, &text, &len));
    int cap = 16, k = 0, line = 0, rc = SH_OK;
    fleet_node *v = calloc((size_t)cap, sizeof *v);
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l && rc == SH_OK; l = strtok_r(NULL, "\n", &save)) {
        line++;
        l[strcspn(l, "\r")] = 0;
        if (line == 1) {
            if (strncmp(l, "name,gpu_type,gpus,zone,fabric,price_per_gpu_hour", 49))
                rc = sh_err(SH_EFORMAT, "%s: line 1: expected the header name,gpu_type,gpus,zone,fabric,price_per_gpu_hour", path);
            continue;
        }
        if (!*l || *l == '#') continue;
        if (k == cap) v = realloc(v, (size_t)(cap *= 2) * sizeof *v);
        fleet_node *f = &v[k];
        char *fld[6] = {0}, *s2 = NULL;
        int nf = 0;
        for (char *t = strtok_r(l, ",", &s2); t && nf < 6; t = strtok_r(NULL, ",", &s2)) fld[nf++] = t;
        int64_t g;
        double p;
        if (nf != 6) rc = sh_err(SH_EFORMAT, "%s: line %d: expected 6 comma-separated fields", path, line);
        else if (sh_parse_i64(fld[2], &g, "gpus") < 0 || g < 0 || g > 64)
            rc = sh_err(SH_EFORMAT, "%s: line %d: gpus \"%s\" is not 0..64", path, line, fld[2]);
        else if (sh_parse_double(fld[5], &p, "price") < 0 || p < 0)
            rc = sh_err(SH_EFORMAT, "%s: line %d: price \"%s\" is not a number >= 0", path, line, fld[5]);
        else {
            snprintf(f->name, sizeof f->name, "%s", fld[0]);
            snprintf(f->gpu_type, sizeof f->gpu_type, "%s", fld[1]);
            snprintf(f->gpus, sizeof f->gpus, "%s", fld[2]);
            snprintf(f->zone, sizeof f->zone, "%s", fld[3]);
            snprintf(f->fabric, sizeof f->fabric, "%s", fld[4]);
            snprintf(f->price, sizeof f->price, "%s", fld[5]);
            k++;
        }
    }
    free(text);
    if (rc == SH_OK && k == 0) rc = sh_err(SH_EFORMAT, "%s: no nodes", path);
    if (rc < 0) {
        free(v);
        return rc;
    }
    *out = v;
    *n = k;
    return SH_OK;
}

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

static pid_t spawn_agent(const fleet_node *f, const char *url, const char *token, const char *work, const char *sandbox)
{
    pid_t parent = getpid();
    pid_t p = fork();
    if (p != 0) return p;
    /* The server lives in `shoal up`: its agents end with it, even on kill -9. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    setenv("SHOAL_TOKEN", token, 1);
    char *argv[] = {"shoal", "agent", "--server", (char *)url, "--name", (char *)f->name, "--gpu-type",
                    (char *)f->gpu_type, "--gpus", (char *)f->gpus, "--zone", (char *)f->zone, "--fabric",
                    (char *)f->fabric, "--price", (char *)f->price, "--work-dir", (char *)work, "--sandbox",
                    (char *)sandbox, NULL};
    execv("/proc/self/exe", argv);
    _exit(127);
}

int cli_cmd_up(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--help")) return fputs(usage, stdout), 0;
    const char *fleet = NULL, *sandbox = "auto";
    srv_config cfg = {0};
    cfg.port = 8470;
    cfg.db_path = "shoal-up/shoal.db";
    /* Take our own options out, hand the rest to the server's parser. */
    int k = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fleet") && i + 1 < argc) fleet = argv[++i];
        else if (!strcmp(argv[i], "--sandbox") && i + 1 < argc) sandbox = argv[++i];
        else argv[k++] = argv[i];
    }
    int rc = cli_server_config(k, argv, 1, &cfg, "up");
    if (rc) return rc;
    if (!fleet) return cli_usage("up", "--fleet FLEET.csv is required");
    fleet_node *nodes;
    int n;
    if ((rc = parse_fleet(fleet, &nodes, &n)) < 0) return cli_fail("up", rc);
    char dir[4096], tokens[4200], work[4200], envf[4200];
    snprintf(dir, sizeof dir, "%s", cfg.db_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    snprintf(tokens, sizeof tokens, "%s/tokens.json", dir);
    snprintf(work, sizeof work, "%s/work", dir);
    snprintf(envf, sizeof envf, "%s/env", dir);
    /* The state directory is private: the agents hide it from members and
     * bind each member's own work directory back in. */
    if ((rc = sh_mkdir_p(dir, 0700)) < 0 || (chmod(dir, 0700) < 0 && (rc = sh_err_errno(errno, "chmod %s", dir))))
        return free(nodes), cli_fail("up", rc);
    if (!cfg.tokens_path) {
        if ((rc = make_tokens(tokens)) < 0) return free(nodes), cli_fail("up", rc);
        cfg.tokens_path = tokens;
    }
    json_t *tok;
    if ((rc = sh_json_load_file(cfg.tokens_path, 1 << 20, &tok)) < 0) return free(nodes), cli_fail("up", rc);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    srv *s;
    if ((rc = srv_start(&cfg, &s)) < 0) return json_decref(tok), free(nodes), cli_fail("up", rc);
    char url[128];
    snprintf(url, sizeof url, "http://%s:%d", cfg.bind_addr ? cfg.bind_addr : "127.0.0.1", srv_port(s));
    const char *agent_tok = json_string_value(json_object_get(tok, "agent"));
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    for (int i = 0; i < n; i++) pids[i] = spawn_agent(&nodes[i], url, agent_tok, work, sandbox);
    const char *tenant_tok = json_string_value(json_object_get(json_object_get(tok, "tenants"), "default"));
    char env[512];
    int el = snprintf(env, sizeof env, "SHOAL_SERVER=%s\nSHOAL_TOKEN=%s\n", url, tenant_tok ? tenant_tok : "");
    if ((rc = sh_write_atomic_mode(envf, env, (size_t)el, 0600)) < 0) sh_warn("%s", sh_errmsg());
    printf("listening on %s\n%d agents started; tokens in %s; for the tenant \"default\": . %s\n", url, n,
           cfg.tokens_path, envf);
    fflush(stdout);
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
    json_decref(tok);
    free(pids);
    free(nodes);
    return 0;
}
