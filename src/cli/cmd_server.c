/* shoal server: runs the control plane's HTTP API until SIGINT/SIGTERM. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ctl.h"
#include "shoal/server.h"

const char cli_help_server[] = "run the control plane: HTTP/JSON API, SQLite state, dashboard";

static const char usage[] =
    "usage: shoal server --tokens FILE [--db PATH] [--port P] [--bind ADDR] [--web DIR]\n"
    "                    [--heartbeat-timeout S] [--max-body BYTES] [--provider-cmd PROG]\n"
    "                    [--provider-quota Q] [--scale-up-wait S] [--scale-down-idle S] [--sync-full]\n"
    "                    [--allow-writable DIR]...\n\n"
    "  --tokens FILE          JSON {\"admin\": T, \"agent\": T, \"tenants\": {NAME: T}}\n"
    "  --db PATH              SQLite state (default shoal.db); logs go beside it\n"
    "  --port P               TCP port (default 8470; 0 picks a free one)\n"
    "  --bind ADDR            IPv4 address to listen on (default 127.0.0.1)\n"
    "  --web DIR              dashboard files to serve at / (default: web/ if present)\n"
    "  --heartbeat-timeout S  seconds without a poll before a node is dead (default 3)\n"
    "  --max-body BYTES       largest request body (default 1MiB)\n"
    "  --provider-cmd PROG    autoscaling hook, run with a JSON request on stdin\n"
    "  --provider-quota ZONE,FABRIC,GPU_TYPE,GPUS,MAX_NODES,PRICE  what it may add\n"
    "  --scale-up-wait S      a job queued this long asks the provider (default 2)\n"
    "  --scale-down-idle S    an idle provider node is released after (default 10)\n"
    "  --sync-full            fsync every commit (survives power loss, slower)\n"
    "  --allow-writable DIR   jobs may list DIR or directories under it in \"writable\"\n"
    "                         (repeatable; default: none; docs/security.md)\n\n"
    "Prints \"listening on http://ADDR:PORT\" once ready.  See docs/server-api.md.\n";

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = sig; }

/* --allow-writable directories, resolved and joined with ':'. */
static char allow_buf[8192];

static int add_allowed(const char *dir, srv_config *cfg, const char *cmd)
{
    char real[4096];
    if (!realpath(dir, real) || !sh_is_dir(real))
        return cli_usage(cmd, "--allow-writable %s: not an existing directory", dir);
    if (strchr(real, ':')) return cli_usage(cmd, "--allow-writable %s: a path with ':' cannot be listed", dir);
    size_t n = strlen(allow_buf);
    if (n + strlen(real) + 2 > sizeof allow_buf) return cli_usage(cmd, "--allow-writable: too many directories");
    snprintf(allow_buf + n, sizeof allow_buf - n, "%s%s", n ? ":" : "", real);
    cfg->writable_allow = allow_buf;
    return 0;
}

int cli_server_config(int argc, char **argv, int first, srv_config *cfg, const char *cmd)
{
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u;
        double d;
        if (!strcmp(a, "--sync-full")) { cfg->sync_full = 1; continue; }
        if (!v) return cli_usage(cmd, "unknown option or missing value: \"%s\"", a);
        if (!strcmp(a, "--tokens")) cfg->tokens_path = v;
        else if (!strcmp(a, "--allow-writable")) {
            int rc = add_allowed(v, cfg, cmd);
            if (rc) return rc;
        }
        else if (!strcmp(a, "--db")) cfg->db_path = v;
        else if (!strcmp(a, "--bind")) cfg->bind_addr = v;
        else if (!strcmp(a, "--web")) cfg->web_dir = v;
        else if (!strcmp(a, "--provider-cmd")) cfg->provider_cmd = v;
        else if (!strcmp(a, "--provider-quota")) cfg->provider_quota = v;
        else if (!strcmp(a, "--scale-up-wait") || !strcmp(a, "--scale-down-idle")) {
            if (sh_parse_double(v, &d, a) < 0 || d <= 0) return cli_usage(cmd, "%s: expected seconds > 0, got \"%s\"", a, v);
            if (a[8] == 'u') cfg->scale_up_wait_s = d;
            else cfg->scale_down_idle_s = d;
        }
        else if (!strcmp(a, "--port")) {
            if (sh_parse_u64(v, &u, "--port") < 0 || u > 65535) return cli_usage(cmd, "--port: expected 0..65535, got \"%s\"", v);
            cfg->port = (int)u;
        } else if (!strcmp(a, "--heartbeat-timeout")) {
            if (sh_parse_double(v, &d, "--heartbeat-timeout") < 0 || d <= 0) return cli_usage(cmd, "--heartbeat-timeout: expected seconds > 0, got \"%s\"", v);
            cfg->heartbeat_timeout = d;
        } else if (!strcmp(a, "--max-body")) {
            if (sh_parse_size(v, &u, "--max-body") < 0 || u < 1024) return cli_usage(cmd, "--max-body: expected a size >= 1KiB, got \"%s\"", v);
            cfg->max_body = (size_t)u;
        } else return cli_usage(cmd, "unknown option \"%s\"", a);
        i++;
    }
    if (!cfg->web_dir && access("web/index.html", R_OK) == 0) cfg->web_dir = "web";
    return 0;
}

int cli_cmd_server(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--help")) return fputs(usage, stdout), 0;
    srv_config cfg = {0};
    cfg.port = 8470;
    int rc = cli_server_config(argc, argv, 1, &cfg, "server");
    if (rc) return rc;
    if (!cfg.tokens_path) return cli_usage("server", "--tokens FILE is required");
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit fails the write (EFBIG), as a full disk does */
    srv *s;
    if ((rc = srv_start(&cfg, &s)) < 0) return cli_fail("server", rc);
    printf("listening on http://%s:%d\n", cfg.bind_addr ? cfg.bind_addr : "127.0.0.1", srv_port(s));
    fflush(stdout);
    const char *failed = NULL;
    while (!stop_flag && !(failed = srv_failed(s))) sh_sleep(0.2);
    if (failed) fprintf(stderr, "shoal server: %s\n", failed);
    srv_stop(s);
    return failed ? 1 : 0;
}
