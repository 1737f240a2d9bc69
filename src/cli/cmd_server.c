/* shoal server: runs the control plane's HTTP API until SIGINT/SIGTERM. */
#include <float.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_int.h"
#include "ctl_int.h"
#include "shoal/server.h"

const char cli_help_server[] = "run the control plane: HTTP/JSON API, SQLite or PostgreSQL state, dashboard";

static const char usage[] =
    "usage: shoal server --tokens FILE [--db PATH] [--port P] [--bind ADDR] [--web DIR]\n"
    "                    [--heartbeat-timeout S] [--max-body BYTES] [--provider-cmd PROG]\n"
    "                    [--provider-quota Q] [--scale-up-wait S] [--scale-down-idle S] [--sync-full]\n"
    "                    [--allow-writable [TENANT=]DIR]... [--est-grace S] [--require-est]\n"
    "                    [--default-est S] [--max-conns-per-ip N] [--log-drain S]\n"
    "                    [--max-priority [TENANT=]N]... [--max-tenant-log BYTES]\n"
    "                    [--state-dir DIR] [--advertise URL]\n"
    "                    [--workdir-max SIZE] [--workdir-quota SIZE]\n\n"
    "  --tokens FILE          JSON {\"admin\": T, \"agent\": T, \"tenants\": {NAME: T}}\n"
    "  --db PATH|URL          SQLite state (default shoal.db; logs go beside it), or a\n"
    "                         PostgreSQL database postgresql://USER@HOST/DB: several servers\n"
    "                         may share one; one leads, the others stand by (docs/deploy.md)\n"
    "  --state-dir DIR        where the ranks' logs go (required with PostgreSQL)\n"
    "  --advertise URL        this server's URL for standbys' redirects (default\n"
    "                         http://BIND:PORT)\n"
    "  --port P               TCP port (default 8470; 0 picks a free one)\n"
    "  --bind ADDR            IPv4 address to listen on (default 127.0.0.1)\n"
    "  --web DIR              dashboard files to serve at / (default: web/ here, else the\n"
    "                         build's or installation's beside the binary)\n"
    "  --heartbeat-timeout S  seconds without a poll before a node is dead (default 3)\n"
    "  --max-body BYTES       largest request body (default 1MiB)\n"
    "  --provider-cmd PROG    autoscaling hook, run with a JSON request on stdin\n"
    "  --provider-quota ZONE,FABRIC,GPU_TYPE,GPUS,MAX_NODES,PRICE  what it may add\n"
    "  --scale-up-wait S      a job queued this long asks the provider (default 2)\n"
    "  --scale-down-idle S    an idle provider node is released after (default 10)\n"
    "  --sync-full            fsync every commit (survives power loss, slower)\n"
    "  --allow-writable [TENANT=]DIR  jobs may list DIR or directories under it in\n"
    "                         \"writable\"; TENANT=DIR: only that tenant's jobs (repeatable;\n"
    "                         default: none; docs/security.md)\n"
    "  --est-grace S          a job's est_s is its time limit: an attempt is ended this\n"
    "                         long past it (default 60)\n"
    "  --require-est          refuse jobs without est_s (every job then has a limit)\n"
    "  --default-est S        the run the scheduler plans for a job without est_s, which\n"
    "                         is not ended there (default 3600; docs/sched.md)\n"
    "  --max-conns-per-ip N   connections one address may hold (default 250 of 1000;\n"
    "                         raise it when agents reach the server through one tunnel)\n"
    "  --log-drain S          a rank's node may send its last output this long after the\n"
    "                         rank ended; later output is dropped (default 30)\n"
    "  --max-priority [TENANT=]N  the highest \"priority\" a tenant's job may ask, -1000..1000:\n"
    "                         N for every tenant, TENANT=N for one (repeatable; default 0,\n"
    "                         so that no tenant preempts another's work; the admin's jobs\n"
    "                         are not limited; docs/security.md)\n"
    "  --max-tenant-log BYTES all of one tenant's rank logs together (default 16GiB);\n"
    "                         past it the output of its ranks is dropped, with a note\n"
    "  --workdir-max SIZE     largest work dir a job may ship (default 100MiB)\n"
    "  --workdir-quota SIZE   work dirs one tenant's pending and running jobs may hold\n"
    "                         (default 1GiB; older unused ones make room)\n\n"
    "Prints \"listening on http://ADDR:PORT\" once ready.  See docs/server-api.md.\n";

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = sig; }

/* --allow-writable directories, resolved and joined with ':', each as
 * DIR (any tenant's) or TENANT=DIR (that tenant's only). */
static char allow_buf[8192];

static int add_allowed(const char *spec, srv_config *cfg, const char *cmd)
{
    char tenant[128] = "", real[4096];
    const char *dir = spec, *eq = strchr(spec, '=');
    if (spec[0] != '/' && eq) {
        if (eq == spec || (size_t)(eq - spec) >= sizeof tenant)
            return cli_usage(cmd, "--allow-writable %s: expected DIR or TENANT=DIR", spec);
        snprintf(tenant, sizeof tenant, "%.*s=", (int)(eq - spec), spec);
        dir = eq + 1;
    }
    if (!realpath(dir, real) || !sh_is_dir(real))
        return cli_usage(cmd, "--allow-writable %s: not an existing directory", dir);
    if (strchr(real, ':') || strchr(tenant, ':'))
        return cli_usage(cmd, "--allow-writable %s: a path or tenant with ':' cannot be listed", spec);
    size_t n = strlen(allow_buf);
    if (n + strlen(tenant) + strlen(real) + 2 > sizeof allow_buf)
        return cli_usage(cmd, "--allow-writable: too many directories");
    snprintf(allow_buf + n, sizeof allow_buf - n, "%s%s%s", n ? ":" : "", tenant, real);
    cfg->writable_allow = allow_buf;
    return 0;
}

/* --max-priority entries, joined with ':' ("N", "TENANT=N"); the server
 * checks that each tenant is in its tokens file. */
static char prio_buf[4096];

static int add_max_priority(const char *spec, srv_config *cfg, const char *cmd)
{
    const char *eq = strchr(spec, '='), *num = eq ? eq + 1 : spec;
    int64_t n;
    if (eq == spec || strchr(spec, ':'))
        return cli_usage(cmd, "--max-priority %s: expected N or TENANT=N", spec);
    if (cli_int(cmd, "--max-priority", num, -1000, 1000, &n)) return CLI_USAGE;
    size_t len = strlen(prio_buf);
    if (len + strlen(spec) + 2 > sizeof prio_buf) return cli_usage(cmd, "--max-priority: too many entries");
    snprintf(prio_buf + len, sizeof prio_buf - len, "%s%s", len ? ":" : "", spec);
    cfg->max_priority = prio_buf;
    return 0;
}

enum { O_TOKENS = 0x2000, O_DB, O_PORT, O_BIND, O_WEB, O_HEARTBEAT, O_MAX_BODY, O_PROVIDER_CMD, O_PROVIDER_QUOTA,
       O_SCALE_UP, O_SCALE_DOWN, O_SYNC_FULL, O_ALLOW_WRITABLE, O_EST_GRACE, O_REQUIRE_EST, O_CONNS_PER_IP,
       O_DEFAULT_EST, O_LOG_DRAIN, O_MAX_PRIORITY, O_MAX_TENANT_LOG, O_STATE_DIR, O_ADVERTISE, O_WORKDIR_MAX,
       O_WORKDIR_QUOTA };
const struct option cli_server_opts[] = {{"tokens", required_argument, 0, O_TOKENS},
                                         {"db", required_argument, 0, O_DB},
                                         {"port", required_argument, 0, O_PORT},
                                         {"bind", required_argument, 0, O_BIND},
                                         {"web", required_argument, 0, O_WEB},
                                         {"heartbeat-timeout", required_argument, 0, O_HEARTBEAT},
                                         {"max-body", required_argument, 0, O_MAX_BODY},
                                         {"provider-cmd", required_argument, 0, O_PROVIDER_CMD},
                                         {"provider-quota", required_argument, 0, O_PROVIDER_QUOTA},
                                         {"scale-up-wait", required_argument, 0, O_SCALE_UP},
                                         {"scale-down-idle", required_argument, 0, O_SCALE_DOWN},
                                         {"sync-full", no_argument, 0, O_SYNC_FULL},
                                         {"allow-writable", required_argument, 0, O_ALLOW_WRITABLE},
                                         {"est-grace", required_argument, 0, O_EST_GRACE},
                                         {"require-est", no_argument, 0, O_REQUIRE_EST},
                                         {"default-est", required_argument, 0, O_DEFAULT_EST},
                                         {"max-conns-per-ip", required_argument, 0, O_CONNS_PER_IP},
                                         {"log-drain", required_argument, 0, O_LOG_DRAIN},
                                         {"max-priority", required_argument, 0, O_MAX_PRIORITY},
                                         {"max-tenant-log", required_argument, 0, O_MAX_TENANT_LOG},
                                         {"state-dir", required_argument, 0, O_STATE_DIR},
                                         {"advertise", required_argument, 0, O_ADVERTISE},
                                         {"workdir-max", required_argument, 0, O_WORKDIR_MAX},
                                         {"workdir-quota", required_argument, 0, O_WORKDIR_QUOTA},
                                         {0}};

int cli_server_opt(int c, const char *v, srv_config *cfg, const char *cmd)
{
    int64_t port;
    uint64_t body;
    switch (c) {
    case O_TOKENS: cfg->tokens_path = v; return 0;
    case O_DB: cfg->db_path = v; return 0;
    case O_STATE_DIR: cfg->state_dir = v; return 0;
    case O_ADVERTISE:
        if (strncmp(v, "http://", 7) || strlen(v) > 250)
            return cli_usage(cmd, "--advertise %s: expected http://HOST:PORT (at most 250 characters)", v);
        cfg->advertise = v;
        return 0;
    case O_BIND: cfg->bind_addr = v; return 0;
    case O_WEB: cfg->web_dir = v; return 0;
    case O_PROVIDER_CMD: cfg->provider_cmd = v; return 0;
    case O_PROVIDER_QUOTA: cfg->provider_quota = v; return 0;
    case O_SYNC_FULL: cfg->sync_full = 1; return 0;
    case O_REQUIRE_EST: cfg->require_est = 1; return 0;
    case O_CONNS_PER_IP:
        return cli_int(cmd, "--max-conns-per-ip", v, 1, SRV_MAX_CONNS, &port) ? CLI_USAGE
                                                                             : (cfg->max_conns_per_ip = (unsigned)port, 0);
    case O_EST_GRACE: return cli_real(cmd, "--est-grace", v, DBL_TRUE_MIN, DBL_MAX, "seconds > 0", &cfg->est_grace_s);
    case O_DEFAULT_EST:
        return cli_real(cmd, "--default-est", v, DBL_TRUE_MIN, 2592000, "seconds > 0, at most 30 days (est_s's limit)",
                        &cfg->default_est_s);
    case O_ALLOW_WRITABLE: return add_allowed(v, cfg, cmd);
    case O_MAX_PRIORITY: return add_max_priority(v, cfg, cmd);
    case O_MAX_TENANT_LOG:
        return cli_size(cmd, "--max-tenant-log", v, 4096, &body) ? CLI_USAGE : (cfg->max_tenant_log = body, 0);
    case O_LOG_DRAIN:
        return cli_real(cmd, "--log-drain", v, DBL_TRUE_MIN, 86400, "seconds > 0, at most a day", &cfg->log_drain_s);
    case O_SCALE_UP: return cli_real(cmd, "--scale-up-wait", v, DBL_TRUE_MIN, DBL_MAX, "seconds > 0", &cfg->scale_up_wait_s);
    case O_SCALE_DOWN:
        return cli_real(cmd, "--scale-down-idle", v, DBL_TRUE_MIN, DBL_MAX, "seconds > 0", &cfg->scale_down_idle_s);
    case O_HEARTBEAT:
        return cli_real(cmd, "--heartbeat-timeout", v, DBL_TRUE_MIN, DBL_MAX, "seconds > 0", &cfg->heartbeat_timeout);
    case O_PORT: return cli_int(cmd, "--port", v, 0, 65535, &port) ? CLI_USAGE : (cfg->port = (int)port, 0);
    case O_WORKDIR_MAX: return cli_size(cmd, "--workdir-max", v, 1024, &cfg->workdir_max) ? CLI_USAGE : 0;
    case O_WORKDIR_QUOTA: return cli_size(cmd, "--workdir-quota", v, 1024, &cfg->workdir_quota) ? CLI_USAGE : 0;
    case O_MAX_BODY: return cli_size(cmd, "--max-body", v, 1024, &body) ? CLI_USAGE : (cfg->max_body = (size_t)body, 0);
    default: return cli_usage(cmd, "option code %d is not one of the server's", c);
    }
}

/* The dashboard's files when --web is not given: web/ here, else beside
 * the binary: a build's build/shoal-core (or build/asan/) finds the tree's web/, an
 * installed libexec/shoal/shoal-core its share/shoal/web.  Without it a
 * server started elsewhere answered / with 404. */
void cli_server_done(srv_config *cfg)
{
    static char found[PATH_MAX + 32];
    if (cfg->web_dir) return;
    if (access("web/index.html", R_OK) == 0) {
        cfg->web_dir = "web";
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = 0;
    static const char *const rel[] = {"../web", "../../web", "../../share/shoal/web"}; /* build/, build/asan/ */
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
        char index[sizeof found + 16];
        snprintf(found, sizeof found, "%s/%s", exe, rel[i]);
        snprintf(index, sizeof index, "%s/index.html", found);
        if (access(index, R_OK) == 0) {
            cfg->web_dir = found;
            return;
        }
    }
}

int cli_cmd_server(int argc, char **argv)
{
    srv_config cfg = {0};
    cfg.port = 8470;
    cli_args a = {"server", usage, cli_server_opts, NULL};
    int rc;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;)
        if (c == CLI_OPT_EXIT) return a.rc;
        else if ((rc = cli_server_opt(c, optarg, &cfg, "server"))) return rc;
    if (optind < argc) return cli_usage("server", "unexpected argument \"%s\"", argv[optind]);
    cli_server_done(&cfg);
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
