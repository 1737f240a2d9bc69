/* shoal sim push: the push-tree model (src/control/sim/sim_push_int.h) from the
 * command line.  Dispatched from `shoal sim` (cmd_sim.c). */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "control/sim/sim_push_int.h"

static const char usage_text[] =
    "usage: shoal sim push [--replicas N] [--zones Z] [--payload SIZE] [options] [--json]\n\n"
    "Discrete-event model of a push tree (no processes): N replicas in Z zones, the\n"
    "root in zone 0, one relay per zone, the rest `--fanout` per node below it;\n"
    "prints the time until every replica holds the payload (docs/push-scale.md).\n"
    "  --replicas N          default 16\n"
    "  --zones Z             default 1\n"
    "  --payload SIZE        bytes (suffixes k, M, G, T; default 717G)\n"
    "  --fanout F            children per node inside a zone (default 2)\n"
    "  --fabric-size M       group a zone's replicas in fabrics of M (default 0: none)\n"
    "  --chunk SIZE|auto     chunk size (default auto: from the payload and the depth)\n"
    "  --window W            chunks in flight per child (default 4)\n"
    "  --fabric-gbps G / --fabric-latency-us U   default 400 / 5\n"
    "  --zone-gbps G / --zone-latency-us U       default 100 / 50\n"
    "  --cross-gbps G / --cross-latency-us U     default 25 / 1000\n"
    "  --nic-gbps G          every node's egress (default: the fastest link)\n"
    "  --overhead-us U       per chunk and hop (default 20)\n"
    "  --apply-ms MS         per replica after the last chunk (default 0)\n"
    "  --json                one JSON object: converge_s, first_s, depth, chunk, ...\n";

/* The model's answer, as JSON or two lines of text. */
static void print_result(const sim_push_config *c, const sim_push_result *r, int json)
{
    if (json) {
        json_t *j = json_pack("{s:f,s:f,s:i,s:i,s:I,s:I,s:I,s:i,s:i,s:I,s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f},s:f,s:f}",
                              "converge_s", r->converge_s, "first_s", r->first_s, "replicas", c->replicas, "zones",
                              c->zones, "payload", (json_int_t)c->payload, "chunk", (json_int_t)r->chunk, "nchunks",
                              (json_int_t)r->nchunks, "depth", r->depth, "fanout", c->fanout, "cross_zone_copies",
                              (json_int_t)r->cross_zone_copies, "fabric", "gbps", c->fabric.gbps, "latency_s",
                              c->fabric.latency_s, "zone", "gbps", c->zone.gbps, "latency_s", c->zone.latency_s,
                              "cross", "gbps", c->cross.gbps, "latency_s", c->cross.latency_s, "overhead_s",
                              c->chunk_overhead_s, "apply_s", c->apply_s);
        json_object_set_new(j, "fabric_size", json_integer(c->fabric_size));
        json_object_set_new(j, "window", json_integer(c->window));
        sh_json_print(j);
        json_decref(j);
        return;
    }
    char pb[32], cb[32];
    printf("%d replicas in %d zones, payload %s in %llu chunks of %s, depth %d\n", c->replicas, c->zones,
           sh_fmt_bytes((double)c->payload, pb, sizeof pb), (unsigned long long)r->nchunks,
           sh_fmt_bytes((double)r->chunk, cb, sizeof cb), r->depth);
    printf("converge %.3f s (first replica %.3f s); %llu copies crossed a zone\n", r->converge_s, r->first_s,
           (unsigned long long)r->cross_zone_copies);
}

/* Parses the options into c and *json: -1, or the status to exit with. */
static int parse(int argc, char **argv, sim_push_config *c, int *json)
{
    static const struct option opts[] = {
        {"replicas", required_argument, 0, 'r'},          {"zones", required_argument, 0, 'z'},
        {"fanout", required_argument, 0, 'f'},            {"fabric-size", required_argument, 0, 'F'},
        {"window", required_argument, 0, 'w'},            {"payload", required_argument, 0, 'p'},
        {"chunk", required_argument, 0, 'c'},             {"fabric-gbps", required_argument, 0, 'a'},
        {"zone-gbps", required_argument, 0, 'b'},         {"cross-gbps", required_argument, 0, 'x'},
        {"nic-gbps", required_argument, 0, 'n'},          {"fabric-latency-us", required_argument, 0, 'A'},
        {"zone-latency-us", required_argument, 0, 'B'},   {"cross-latency-us", required_argument, 0, 'X'},
        {"overhead-us", required_argument, 0, 'o'},       {"apply-ms", required_argument, 0, 'm'},
        {"json", no_argument, 0, 'j'},                    {0}};
    /* Counts, and non-negative figures with the factor to seconds or Gb/s. */
    const struct {
        int code;
        const char *name;
        int *to;
    } counts[] = {{'r', "--replicas", &c->replicas}, {'z', "--zones", &c->zones}, {'f', "--fanout", &c->fanout},
                  {'F', "--fabric-size", &c->fabric_size}, {'w', "--window", &c->window}};
    const struct {
        int code;
        const char *name;
        double scale, *to;
    } reals[] = {{'a', "--fabric-gbps", 1, &c->fabric.gbps},         {'b', "--zone-gbps", 1, &c->zone.gbps},
                 {'x', "--cross-gbps", 1, &c->cross.gbps},           {'n', "--nic-gbps", 1, &c->nic_gbps},
                 {'A', "--fabric-latency-us", 1e-6, &c->fabric.latency_s},
                 {'B', "--zone-latency-us", 1e-6, &c->zone.latency_s},
                 {'X', "--cross-latency-us", 1e-6, &c->cross.latency_s},
                 {'o', "--overhead-us", 1e-6, &c->chunk_overhead_s}, {'m', "--apply-ms", 1e-3, &c->apply_s}};
    cli_args a = {"sim push", usage_text, opts, NULL};
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;) {
        int rc = 0;
        if (k == CLI_OPT_EXIT) return a.rc;
        if (k == 'j') *json = 1;
        else if (k == 'p') rc = sh_parse_size(optarg, &c->payload, "--payload");
        else if (k == 'c') c->chunk = 0, rc = strcmp(optarg, "auto") ? sh_parse_size(optarg, &c->chunk, "--chunk") : 0;
        if (rc < 0) return cli_usage(a.cmd, "%s", sh_errmsg());
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
            int64_t n;
            if (counts[i].code != k) continue;
            if (cli_int(a.cmd, counts[i].name, optarg, 0, 10000000, &n)) return CLI_USAGE;
            *counts[i].to = (int)n;
        }
        for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
            double d;
            if (reals[i].code != k) continue;
            if (cli_real(a.cmd, reals[i].name, optarg, 0, DBL_MAX, "a number >= 0", &d)) return CLI_USAGE;
            *reals[i].to = d * reals[i].scale;
        }
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    return -1;
}

int cli_sim_push(int argc, char **argv)
{
    sim_push_config c = {.replicas = 16, .zones = 1, .fanout = 2, .payload = 717000000000ull,
                         .window = 4, .fabric = {400, 5e-6}, .zone = {100, 50e-6}, .cross = {25, 1e-3},
                         .chunk_overhead_s = 20e-6};
    int json = 0, rc = parse(argc, argv, &c, &json);
    if (rc >= 0) return rc;
    sim_push_result r;
    rc = sim_push_run(&c, &r);
    if (rc == SH_EINVAL) return cli_usage("sim push", "%s", sh_errmsg());
    if (rc < 0) return cli_fail("sim push", rc);
    print_result(&c, &r, json);
    return 0;
}
