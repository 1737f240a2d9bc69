/* shoal sim push: the push-tree model (include/shoal/sim_push.h) from the
 * command line.  Dispatched from `shoal sim` (cmd_sim.c). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "shoal/sim_push.h"

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

static int num(const char *a, const char *v, double *out)
{
    if (sh_parse_double(v, out, a) < 0) return -1;
    if (*out < 0) return sh_err(SH_EINVAL, "%s must not be negative", a);
    return 0;
}

int cli_sim_push(int argc, char **argv)
{
    sim_push_config c = {.replicas = 16, .zones = 1, .fanout = 2, .payload = 717000000000ull,
                         .window = 4, .fabric = {400, 5e-6}, .zone = {100, 50e-6}, .cross = {25, 1e-3},
                         .chunk_overhead_s = 20e-6};
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return fputs(usage_text, stdout), 0;
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!v) return cli_usage("sim push", "%s needs a value (see --help)", a);
        double d = 0;
        int64_t k = 0;
        int rc = 0;
        if (!strcmp(a, "--replicas") || !strcmp(a, "--zones") || !strcmp(a, "--fanout") ||
            !strcmp(a, "--fabric-size") || !strcmp(a, "--window")) {
            rc = sh_parse_i64(v, &k, a);
            if (!rc && (k < 0 || k > 10000000)) rc = sh_err(SH_EINVAL, "%s must be 0..10000000", a);
            int *dst = !strcmp(a, "--replicas") ? &c.replicas : !strcmp(a, "--zones") ? &c.zones
                     : !strcmp(a, "--fanout") ? &c.fanout : !strcmp(a, "--fabric-size") ? &c.fabric_size
                     : &c.window;
            *dst = (int)k;
        } else if (!strcmp(a, "--payload")) rc = sh_parse_size(v, &c.payload, a);
        else if (!strcmp(a, "--chunk")) { c.chunk = 0; rc = strcmp(v, "auto") ? sh_parse_size(v, &c.chunk, a) : 0; }
        else if (!strcmp(a, "--fabric-gbps")) rc = num(a, v, &c.fabric.gbps);
        else if (!strcmp(a, "--zone-gbps")) rc = num(a, v, &c.zone.gbps);
        else if (!strcmp(a, "--cross-gbps")) rc = num(a, v, &c.cross.gbps);
        else if (!strcmp(a, "--nic-gbps")) rc = num(a, v, &c.nic_gbps);
        else if (!strcmp(a, "--fabric-latency-us")) rc = num(a, v, &d), c.fabric.latency_s = d * 1e-6;
        else if (!strcmp(a, "--zone-latency-us")) rc = num(a, v, &d), c.zone.latency_s = d * 1e-6;
        else if (!strcmp(a, "--cross-latency-us")) rc = num(a, v, &d), c.cross.latency_s = d * 1e-6;
        else if (!strcmp(a, "--overhead-us")) rc = num(a, v, &d), c.chunk_overhead_s = d * 1e-6;
        else if (!strcmp(a, "--apply-ms")) rc = num(a, v, &d), c.apply_s = d * 1e-3;
        else return cli_usage("sim push", "unknown option \"%s\" (see --help)", a);
        if (rc < 0) return cli_usage("sim push", "%s", sh_errmsg());
        i++;
    }
    sim_push_result r;
    int rc = sim_push_run(&c, &r);
    if (rc < 0) return cli_usage("sim push", "%s", sh_errmsg());
    if (json) {
        json_t *j = json_pack("{s:f,s:f,s:i,s:i,s:I,s:I,s:I,s:i,s:i,s:I,s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f},s:f,s:f}",
                              "converge_s", r.converge_s, "first_s", r.first_s, "replicas", c.replicas, "zones",
                              c.zones, "payload", (json_int_t)c.payload, "chunk", (json_int_t)r.chunk, "nchunks",
                              (json_int_t)r.nchunks, "depth", r.depth, "fanout", c.fanout, "cross_zone_copies",
                              (json_int_t)r.cross_zone_copies, "fabric", "gbps", c.fabric.gbps, "latency_s",
                              c.fabric.latency_s, "zone", "gbps", c.zone.gbps, "latency_s", c.zone.latency_s,
                              "cross", "gbps", c.cross.gbps, "latency_s", c.cross.latency_s, "overhead_s",
                              c.chunk_overhead_s, "apply_s", c.apply_s);
        json_object_set_new(j, "fabric_size", json_integer(c.fabric_size));
        json_object_set_new(j, "window", json_integer(c.window));
        sh_json_print(j);
        json_decref(j);
        return 0;
    }
    char pb[32], cb[32];
    printf("%d replicas in %d zones, payload %s in %llu chunks of %s, depth %d\n", c.replicas, c.zones,
           sh_fmt_bytes((double)c.payload, pb, sizeof pb), (unsigned long long)r.nchunks,
           sh_fmt_bytes((double)r.chunk, cb, sizeof cb), r.depth);
    printf("converge %.3f s (first replica %.3f s); %llu copies crossed a zone\n", r.converge_s, r.first_s,
           (unsigned long long)r.cross_zone_copies);
    return 0;
}
