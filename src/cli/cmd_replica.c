/* shoal replica: keep DIR on the newest version of a run. */
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_int.h"
#include "shoal/store.h"

const char cli_help_replica[] = "keep a directory on a run's newest version (store or push) [--json]";

static const char usage_text[] =
    "usage: shoal replica --dir DIR (--store STORE | --parent HOST:PORT ...) [options]\n\n"
    "Reconciles DIR with a store's LATEST (polling) or with a push tree: stages\n"
    "and verifies each new version while the current one serves, then activates\n"
    "it atomically (DIR/ACTIVE, DIR/models/) and reports {version, activated_at}.\n"
    "A replica restarted mid-apply comes back on its last good version.\n"
    "  --run R             the run (default main)\n"
    "  --zone Z            zone for the push tree (default \"default\")\n"
    "  --fanout F          same-zone children before redirecting (default 2)\n"
    "  --leaf              take no children in the push tree\n"
    "  --listen HOST[:PORT]  where this replica's children reach it (default\n"
    "                      127.0.0.1 and any port: on several hosts, give this\n"
    "                      host's address, and a port to open in a firewall)\n"
    "  --egress-gbps G     limit forwarding to children to G Gb/s\n"
    "  --on-activate CMD   run CMD (sh -c) after each activation, with\n"
    "                      SHOAL_VERSION and SHOAL_ACTIVATED_AT set\n"
    "  --until V           exit once version V or newer is active\n"
    "  --seconds S         exit after S seconds (status 1 if --until was not met)\n"
    "  --fp8               also keep an FP8 serving copy (models/<v>.fp8.safetensors),\n"
    "                      re-quantising only the blocks a delta touched\n"
    "  --stats-file F      rewrite F (JSON) after each activation\n"
    "  --json              print one JSON object at exit\n"
    "Environment: SHOAL_RUN_SECRET (32 hex digits) is presented to the parent and\n"
    "required of children: the run's push root and replicas share it\n"
    "(docs/security.md); UCX_TLS selects transports.\n";

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = 1; }

typedef struct ctx {
    const char *hook, *stats_file;
    int json;
    store_replica *r;
} ctx;

/* Seconds since the epoch as ISO 8601 UTC to the microsecond, the one
 * form of a time in both the text and the JSON. */
static void iso_utc(double t, char *out, size_t cap)
{
    time_t secs = (time_t)t;
    struct tm tm;
    gmtime_r(&secs, &tm);
    size_t k = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    long us = (long)((t - (double)secs) * 1e6);
    snprintf(out + k, cap - k, ".%06ldZ", us < 0 ? 0 : us > 999999 ? 999999 : us);
}

static json_t *info_json(const store_replica_info *info)
{
    char iso[64] = "";
    if (info->version) iso_utc(info->activated_at, iso, sizeof iso);
    /* Microseconds since the epoch: a double printed as JSON keeps too few
     * digits for steps a millisecond apart. */
    const store_timeline *t = &info->timeline;
    const double at[] = {t->first_chunk, t->last_chunk, t->received, t->apply_start, t->built, t->active, t->durable};
    const char *names[] = {"first_chunk_us", "last_chunk_us", "received_us", "apply_start_us", "built_us",
                           "active_us", "durable_us"};
    json_t *tl = json_pack("{s:I}", "version", (json_int_t)t->version);
    for (size_t k = 0; k < sizeof at / sizeof *at; k++)
        json_object_set_new(tl, names[k], json_integer((json_int_t)(at[k] * 1e6)));
    return json_pack("{s:I,s:I,s:s,s:I,s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:s,s:s,s:I,s:o}", "version", (json_int_t)info->version,
                     "newest_announced", (json_int_t)info->newest_announced,
                     "activated_at", iso, "activated_at_us", (json_int_t)(info->activated_at * 1e6),
                     "pause_ms_max", info->pause_max_ms, "activations", (json_int_t)info->activations,
                     "failures", (json_int_t)info->failures, "bytes_received",
                     (json_int_t)info->push.bytes_received, "chunks_corrupt",
                     (json_int_t)info->push.chunks_corrupt, "reattaches", (json_int_t)info->push.reattaches,
                     "redirects", (json_int_t)info->push.redirects, "children_refused",
                     (json_int_t)info->push.children_refused, "last_error", info->last_error,
                     "parent_error", info->push.parent_error,
                     "fp8_blocks_requantised", (json_int_t)info->fp8_blocks, "timeline", tl);
}

static void after(void *arg, uint64_t v, double at)
{
    ctx *c = arg;
    if (!c->json) {
        char iso[64];
        iso_utc(at, iso, sizeof iso);
        printf("activated version %llu at %s\n", (unsigned long long)v, iso);
        fflush(stdout);
    }
    if (c->hook) {
        char buf[64];
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
        setenv("SHOAL_VERSION", buf, 1);
        snprintf(buf, sizeof buf, "%.6f", at);
        setenv("SHOAL_ACTIVATED_AT", buf, 1);
        int st = system(c->hook);
        if (st != 0) fprintf(stderr, "shoal replica: --on-activate hook exited with status %d\n", st);
    }
}

/* Rewrites the stats file when the version moved (and once at start). */
static void write_stats(ctx *c, store_replica_info *last)
{
    store_replica_info info;
    store_replica_get_info(c->r, &info);
    if (info.version == last->version && last->activations) return;
    json_t *j = info_json(&info);
    if (sh_json_write_atomic(c->stats_file, j) < 0) fprintf(stderr, "shoal replica: %s\n", sh_errmsg());
    json_decref(j);
    *last = info;
    last->activations = 1;
}

/* Parses the options: -1, or the status to exit with. */
/* --listen HOST or HOST:PORT: 0, or a usage error (printed). */
static int parse_listen(const char *v, store_replica_config *cfg)
{
    static char host[256];
    const char *colon = strrchr(v, ':');
    int64_t port = 0;
    size_t n = colon ? (size_t)(colon - v) : strlen(v);
    if (!n || n >= sizeof host ||
        (colon && (sh_parse_i64(colon + 1, &port, "--listen port") < 0 || port < 0 || port > 65535)))
        return cli_usage("replica", "--listen: expected HOST or HOST:PORT, got \"%s\"", v);
    memcpy(host, v, n);
    host[n] = 0;
    cfg->listen_host = host;
    cfg->listen_port = (int)port;
    return 0;
}

static int parse(int argc, char **argv, store_replica_config *cfg, ctx *c, uint64_t *until,
                 double *seconds)
{
    static const struct option opts[] = {{"dir", required_argument, 0, 'd'},        {"store", required_argument, 0, 's'},
                                         {"run", required_argument, 0, 'r'},        {"zone", required_argument, 0, 'z'},
                                         {"listen", required_argument, 0, 'l'},     {"on-activate", required_argument, 0, 'o'},
                                         {"stats-file", required_argument, 0, 'S'}, {"parent", required_argument, 0, 'p'},
                                         {"fanout", required_argument, 0, 'f'},     {"egress-gbps", required_argument, 0, 'e'},
                                         {"until", required_argument, 0, 'u'},      {"seconds", required_argument, 0, 't'},
                                         {"json", no_argument, 0, 'j'},             {"leaf", no_argument, 0, 'L'},
                                         {"fp8", no_argument, 0, '8'},              {0}};
    cli_args a = {"replica", usage_text, opts, NULL};
    for (int ch; (ch = cli_getopt(&a, argc, argv)) != -1;) {
        const char *v = optarg;
        double d;
        int64_t k;
        switch (ch) {
        case 'j': c->json = 1; break;
        case 'L': cfg->leaf = 1; break;
        case '8': cfg->fp8 = 1; break;
        case 'd': cfg->dir = v; break;
        case 's': cfg->store = v; break;
        case 'r': cfg->run = v; break;
        case 'z': cfg->zone = v; break;
        case 'o': c->hook = v; break;
        case 'S': c->stats_file = v; break;
        case 'l':
            if (parse_listen(v, cfg)) return CLI_USAGE;
            break;
        case 'p':
            if (cfg->nparents == BCAST_MAX_ADDRS) return cli_usage("replica", "too many --parent (at most %d)", BCAST_MAX_ADDRS);
            if (cli_hostport("replica", "--parent", v)) return CLI_USAGE;
            cfg->parents[cfg->nparents++] = v;
            break;
        case 'f':
            if (cli_int("replica", "--fanout", v, 1, 1024, &k)) return CLI_USAGE;
            cfg->fanout = (int)k;
            break;
        case 'e':
            if (cli_real("replica", "--egress-gbps", v, 0, DBL_MAX, "Gb/s >= 0", &d)) return CLI_USAGE;
            cfg->egress_bps = d * 1e9 / 8;
            break;
        case 'u':
            if (sh_parse_u64(v, until, "--until") < 0) return cli_usage("replica", "%s", sh_errmsg());
            break;
        case 't':
            if (cli_real("replica", "--seconds", v, 0, DBL_MAX, "seconds >= 0", seconds)) return CLI_USAGE;
            break;
        default: return a.rc;
        }
    }
    if (optind < argc) return cli_usage("replica", "unexpected argument \"%s\"", argv[optind]);
    if (!cfg->dir) return cli_usage("replica", "--dir DIR is required");
    if (!cfg->store && !cfg->nparents) return cli_usage("replica", "give --store STORE or --parent HOST:PORT");
    return -1;
}

int cli_cmd_replica(int argc, char **argv)
{
    store_replica_config cfg = {0};
    ctx c = {0};
    uint64_t until = 0;
    double seconds = 0;
    int rc = parse(argc, argv, &cfg, &c, &until, &seconds);
    if (rc >= 0) return rc;
    cfg.after_activate = after;
    cfg.arg = &c;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    store_replica *r;
    if ((rc = store_replica_open(&cfg, &r)) < 0) return cli_fail("replica", rc);
    c.r = r;
    store_replica_info last = {0};
    double end = seconds > 0 ? sh_now_mono() + seconds : 0;
    int met = 0;
    while (!g_stop && (!end || sh_now_mono() < end)) {
        if (until && store_replica_version(r) >= until) {
            met = 1;
            break;
        }
        /* Woken by an activation, or every 0.1 s for a signal: a replica
         * beside an inference server takes no core to wait. */
        double t = end ? fmin(0.1, end - sh_now_mono()) : 0.1;
        uint64_t next = (c.stats_file ? last.version : store_replica_version(r)) + 1;
        if (until && next > until) next = until;
        if (t > 0) (void)store_replica_wait(r, next, t); /* SH_ETIMEDOUT: look again */
        if (c.stats_file) write_stats(&c, &last);
    }
    store_replica_info info;
    store_replica_get_info(r, &info);
    store_replica_close(r);
    if (c.json) {
        json_t *j = info_json(&info);
        sh_json_print(j);
        json_decref(j);
    }
    if (until && !met && !g_stop) {
        /* Why: the last failure to apply, else the last parent that failed. */
        const char *why = info.last_error[0] ? info.last_error : info.push.parent_error;
        fprintf(stderr, "shoal replica: version %llu not reached (have %llu)%s%s%s\n", (unsigned long long)until,
                (unsigned long long)info.version, why[0] ? ": " : "",
                why == info.push.parent_error && why[0] ? "parent " : "", why);
        return 1;
    }
    return 0;
}
