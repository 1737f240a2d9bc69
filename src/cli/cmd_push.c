/* shoal push: the root (serve) and relays of a push tree over UCX. */
#include <float.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* A payload that failed its check, as it was on disk: it is not hashed
 * again (a whole anchor, twice a second) until the file changes. */
typedef struct bad_payload {
    uint64_t version;
    struct stat st;
    char msg[1024];
    int known; /* the last error was this payload's, already said */
} bad_payload;

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static int verify_once(store *s, uint64_t v, bad_payload *bad)
{
    char path[4096];
    struct stat st = {0};
    int known = store_payload_path(s, v, path, sizeof path) == 0 && stat(path, &st) == 0 &&
                bad->version == v && same_file(&st, &bad->st);
    bad->known = known;
    if (known) return sh_err(SH_EMISMATCH, "%s", bad->msg);
    int rc = store_verify(s, v);
    if (rc < 0) {
        bad->version = v, bad->st = st;
        snprintf(bad->msg, sizeof bad->msg, "%s", sh_errmsg());
    }
    return rc;
}

/* Offers every version from the newest anchor at or below `latest` that the
 * node does not have yet, in order. */
static int offer_new(bcast_node *n, store *s, uint64_t *have, uint64_t latest, bad_payload *bad)
{
    store_plan *p = malloc(sizeof *p);
    if (!p) return sh_err(SH_ENOMEM, "plan");
    int rc = store_plan_make(s, *have, latest, p);
    if (rc == 0 && p->kind == STORE_PLAN_SQUASH) rc = store_plan_make(s, 0, latest, p);
    uint64_t list[STORE_MAX_CHAIN + 1];
    size_t k = 0;
    if (rc == 0 && p->kind == STORE_PLAN_ANCHOR) list[k++] = p->anchor;
    for (size_t i = 0; rc == 0 && i < p->nsteps; i++) list[k++] = p->steps[i];
    free(p);
    for (size_t i = 0; rc == 0 && i < k; i++) {
        char *text = NULL, path[4096];
        store_version m;
        rc = store_get(s, list[i], &m, &text);
        if (rc == 0) rc = verify_once(s, list[i], bad);
        if (rc == 0) rc = store_payload_path(s, list[i], path, sizeof path);
        if (rc == 0) rc = bcast_node_add_object(n, text, path);
        if (rc == 0) *have = list[i];
        free(text);
    }
    return rc;
}

/* The root's answer for a late joiner at `from`: a squashed delta to `to`
 * when the store's plan says it is the fewest bytes.  It is made (and kept
 * in the store's squash cache) the first time a child needs it. */
static int squash_plan(void *arg, uint64_t from, uint64_t to, char *path, size_t cap)
{
    store *s = arg;
    store_plan *p = malloc(sizeof *p);
    int rc = p ? store_plan_make(s, from, to, p) : sh_err(SH_ENOMEM, "plan");
    if (rc == 0 && p->kind == STORE_PLAN_CHAIN && store_squash_path(s, from, to, path, cap) == 0 &&
        !sh_path_exists(path) && store_squash(s, from, to, NULL) == 0)
        rc = store_plan_make(s, from, to, p);
    int use = rc == 0 && p->kind == STORE_PLAN_SQUASH && store_squash_path(s, from, to, path, cap) == 0;
    if (rc < 0) fprintf(stderr, "shoal push serve: plan v%llu -> v%llu: %s\n", (unsigned long long)from,
                        (unsigned long long)to, sh_errmsg());
    free(p);
    return use;
}

static int serve(opts *o)
{
    if (!o->store) return cli_usage("push serve", "serve needs --store STORE");
    if (o->cfg.nparents) return cli_usage("push serve", "serve is the root: it takes no --parent");
    store *s;
    int rc = store_open(o->store, o->run, 0, &s);
    if (rc < 0) return cli_fail("push serve", rc);
    bcast_node *n;
    o->cfg.accept_children = 1;
    if (!o->cfg.name) o->cfg.name = "root";
    o->cfg.squash = squash_plan;
    o->cfg.arg = s;
    if ((rc = bcast_node_new(&o->cfg, &n)) < 0) {
        store_close(s);
        return cli_fail("push serve", rc);
    }
    rc = write_addr(o->addr_file, bcast_node_address(n));
    fprintf(stderr, "shoal push serve: %s run %s on %s\n", o->store, store_run(s), bcast_node_address(n));
    uint64_t have = 0;
    double end = o->seconds > 0 ? sh_now_mono() + o->seconds : 0;
    bad_payload bad = {0};
    while (rc == 0 && !g_stop && (!end || sh_now_mono() < end)) {
        uint64_t latest;
        rc = store_latest(s, &latest);
        bad.known = 0;
        if (rc == 0 && latest > have) rc = offer_new(n, s, &have, latest, &bad);
        if (rc < 0) {
            /* A bad version in the store stops the offer, not the server:
             * children keep what they have; the next poll retries (a
             * damaged payload only once it changes, said once). */
            if (!bad.known) fprintf(stderr, "shoal push serve: %s\n", sh_errmsg());
            rc = 0;
            bcast_node_run(n, 0.5);
            continue;
        }
        rc = bcast_node_run(n, 0.01);
    }
    bcast_node_free(n);
    store_close(s);
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
