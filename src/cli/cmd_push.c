/* shoal push: the root (serve) and relays of a push tree over UCX. */
#include <float.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "shoal/bcast.h"
#include "shoal/store.h"

const char cli_help_push[] = "push versions through a UCX tree: serve (root), relay";

static const char usage_text[] =
    "usage: shoal push serve --store STORE [--run R] [options]\n"
    "       shoal push relay --parent HOST:PORT [--parent HOST:PORT ...] [options]\n\n"
    "serve offers every version of a store's run from its newest anchor on and\n"
    "follows LATEST; relay attaches to a parent and forwards each verified chunk\n"
    "to its children while the next arrives.  Replicas attach with\n"
    "`shoal replica --parent`.  Options:\n"
    "  --listen HOST:PORT   where to accept children (default 127.0.0.1:0)\n"
    "  --addr-file F        write the address children should use to F\n"
    "  --name N             this node's name in messages and to its children (serve:\n"
    "                       root; relay: node-PID)\n"
    "  --zone Z             this node's zone (default \"default\")\n"
    "  --fanout F           same-zone children before redirecting (default 2)\n"
    "  --chunk SIZE|auto    serve: chunk size (default 4MiB; auto: chosen per payload\n"
    "                       from its size, --depth and --egress-gbps)\n"
    "  --depth D            serve: the tree's expected depth (implies --chunk auto\n"
    "                       unless --chunk SIZE is given; default 4 with auto)\n"
    "  --egress-gbps G      limit this node's sending to G Gb/s (sender-side)\n"
    "  --spool DIR          relay: where received payloads go (default a temp dir)\n"
    "  --seconds S          exit after S seconds (default: until SIGTERM)\n"
    "Environment: UCX_TLS selects transports (see docs/push-protocol.md);\n"
    "SHOAL_RUN_SECRET (32 hex digits): children must present it (and a relay\n"
    "presents it to its parent), so that only the run's replicas are fed\n"
    "(docs/security.md).\n";

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = 1; }

typedef struct opts {
    bcast_config cfg;
    const char *store, *run, *addr_file, *listen;
    double seconds;
    uint64_t chunk;
    int chunk_auto;
} opts;

static const char *const subs[] = {"serve", "relay", NULL};
/* Each subcommand's options, by their codes in opts_all (serve keeps
 * --parent to say that the root takes none). */
static const char *const sub_opts[] = {"srlaznfcdegSp", "plaznfeSo"};
static const struct option opts_all[] = {{"store", required_argument, 0, 's'},  {"run", required_argument, 0, 'r'},
                                         {"listen", required_argument, 0, 'l'}, {"addr-file", required_argument, 0, 'a'},
                                         {"zone", required_argument, 0, 'z'},   {"name", required_argument, 0, 'n'},
                                         {"fanout", required_argument, 0, 'f'}, {"chunk", required_argument, 0, 'c'},
                                         {"depth", required_argument, 0, 'd'},  {"egress-gbps", required_argument, 0, 'e'},
                                         {"seconds", required_argument, 0, 'S'}, {"parent", required_argument, 0, 'p'},
                                         {"spool", required_argument, 0, 'o'},  {0}};

/* Parses argv (argv[0] is the subcommand) into o: -1, or the status to exit with. */
static int parse(const char *cmd, int sub, int argc, char **argv, opts *o)
{
    struct option mine[CLI_MAX_OPTS];
    cli_args a = {cmd, usage_text, cli_opts_pick(opts_all, sub_opts[sub], mine), NULL, .elsewhere = opts_all};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        double d;
        int64_t k;
        switch (c) {
        case 's': o->store = optarg; break;
        case 'r': o->run = optarg; break;
        case 'a': o->addr_file = optarg; break;
        case 'l': o->listen = optarg; break;
        case 'z': o->cfg.zone = optarg; break;
        case 'o': o->cfg.spool = optarg; break;
        case 'n': o->cfg.name = optarg; break;
        case 'p':
            if (o->cfg.nparents == BCAST_MAX_ADDRS) return cli_usage(cmd, "too many --parent (at most %d)", BCAST_MAX_ADDRS);
            if (cli_hostport(cmd, "--parent", optarg)) return CLI_USAGE;
            o->cfg.parents[o->cfg.nparents++] = optarg;
            break;
        case 'f':
            if (cli_int(cmd, "--fanout", optarg, 1, 1024, &k)) return CLI_USAGE;
            o->cfg.fanout = (int)k;
            break;
        case 'd':
            if (cli_int(cmd, "--depth", optarg, 1, 100000, &k)) return CLI_USAGE;
            o->cfg.depth_hint = (int)k;
            break;
        case 'c':
            if (!strcmp(optarg, "auto")) o->chunk_auto = 1;
            else if (cli_size(cmd, "--chunk", optarg, 4096, &o->chunk)) return CLI_USAGE;
            else if (o->chunk > (1u << 30)) return cli_usage(cmd, "--chunk: expected 4KiB..1GiB or auto, got \"%s\"", optarg);
            else o->cfg.chunk_size = (uint32_t)o->chunk;
            break;
        case 'e':
            if (cli_real(cmd, "--egress-gbps", optarg, 0, DBL_MAX, "Gb/s >= 0", &d)) return CLI_USAGE;
            o->cfg.egress_bps = d * 1e9 / 8;
            break;
        case 'S':
            if (cli_real(cmd, "--seconds", optarg, 0, DBL_MAX, "seconds >= 0", &o->seconds)) return CLI_USAGE;
            break;
        default: return a.rc;
        }
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument \"%s\"", argv[optind]);
    return -1;
}

static int write_addr(const char *file, const char *addr)
{
    if (!file) return 0;
    char line[128];
    int n = snprintf(line, sizeof line, "%s\n", addr);
    return sh_write_atomic(file, line, (size_t)n);
}

static int serve(opts *o)
{
    if (!o->store) return cli_usage("push serve", "serve needs --store STORE");
    if (o->cfg.nparents) return cli_usage("push serve", "serve is the root: it takes no --parent");
    store_push_root *r;
    int rc = store_push_root_new(o->store, o->run, &o->cfg, &r);
    if (rc < 0) return cli_fail("push serve", rc);
    rc = write_addr(o->addr_file, store_push_root_address(r));
    fprintf(stderr, "shoal push serve: %s run %s on %s\n", o->store, store_push_root_run(r), store_push_root_address(r));
    double end = o->seconds > 0 ? sh_now_mono() + o->seconds : 0;
    while (rc == 0 && !g_stop && (!end || sh_now_mono() < end)) rc = store_push_root_step(r, 0.01);
    store_push_root_free(r);
    return rc < 0 ? cli_fail("push serve", rc) : 0;
}

static int relay(opts *o)
{
    if (!o->cfg.nparents) return cli_usage("push relay", "relay needs --parent HOST:PORT");
    char spool[4096];
    if (!o->cfg.spool) {
        snprintf(spool, sizeof spool, "/tmp/shoal-relay.%ld", (long)getpid());
        o->cfg.spool = spool;
    }
    o->cfg.accept_children = 1;
    bcast_node *n;
    int rc = bcast_node_new(&o->cfg, &n);
    if (rc < 0) return cli_fail("push relay", rc);
    rc = write_addr(o->addr_file, bcast_node_address(n));
    fprintf(stderr, "shoal push relay: on %s, parent %s\n", bcast_node_address(n), o->cfg.parents[0]);
    double end = o->seconds > 0 ? sh_now_mono() + o->seconds : 0;
    while (rc == 0 && !g_stop && (!end || sh_now_mono() < end)) rc = bcast_node_run(n, 0.05);
    bcast_node_free(n);
    if (spool == o->cfg.spool) sh_rm_rf(spool);
    return rc < 0 ? cli_fail("push relay", rc) : 0;
}

int cli_cmd_push(int argc, char **argv)
{
    int rc, k = cli_subcommand("push", usage_text, argc, argv, subs, &rc);
    if (k < 0) return rc;
    const char *cmd = k == 0 ? "push serve" : "push relay";
    opts o = {0};
    if ((rc = parse(cmd, k, argc - 1, argv + 1, &o)) >= 0) return rc;
    if (o.chunk_auto && !o.cfg.depth_hint) o.cfg.depth_hint = 4;
    if (o.cfg.depth_hint && !o.chunk) o.cfg.chunk_size = 0; /* per payload */
    if (o.listen) {
        static char host[64];
        const char *c = strrchr(o.listen, ':');
        int64_t port;
        if (!c || (size_t)(c - o.listen) >= sizeof host || sh_parse_i64(c + 1, &port, "--listen port") < 0 ||
            port < 0 || port > 65535)
            return cli_usage(cmd, "--listen: expected HOST:PORT, got \"%s\"", o.listen);
        memcpy(host, o.listen, c - o.listen);
        host[c - o.listen] = 0;
        o.cfg.listen_host = host;
        o.cfg.listen_port = (int)port;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    return k == 0 ? serve(&o) : relay(&o);
}
