/* shoal delta: make, apply, squash and inspect weight deltas. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "shoal/delta.h"

const char cli_help_delta[] = "make, apply, squash and inspect lossless weight deltas";

static const char delta_usage[] =
    "usage: shoal delta make BASE NEW -o DELTA [-j N] [--json]\n"
    "       shoal delta apply BASE DELTA -o OUT [-j N] [--verify-base]\n"
    "       shoal delta apply --in-place CKPT DELTA [-j N] [--verify-base]\n"
    "       shoal delta squash D1 D2 ... -o DELTA [-j N] [--json]\n"
    "       shoal delta inspect DELTA [--json]\n\n"
    "BASE, NEW, OUT and CKPT are .safetensors files or sharded checkpoint folders.\n"
    "make     encode the change from BASE to NEW (format: docs/delta-format.md)\n"
    "apply    rebuild NEW from BASE; OUT appears atomically, after its digest is\n"
    "         verified; --in-place replaces CKPT the same way (never torn).  Every\n"
    "         rebuilt tensor is checked against its digest, so a wrong base is\n"
    "         refused; --verify-base also hashes the whole base first-hand\n"
    "squash   compose a chain v->v+1->...->v+k into one delta v->v+k\n"
    "inspect  per tensor: encoding, changed fraction, bytes\n"
    "-j N     threads (default: all cores); the delta is the same for any N\n";

typedef struct {
    const char *out, *pos[4096];
    int npos, json, in_place, threads, verify_base;
} delta_cli;

static int delta_parse_args(int argc, char **argv, delta_cli *o)
{
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--in-place")) o->in_place = 1;
        else if (!strcmp(a, "--verify-base")) o->verify_base = 1;
        else if (!strcmp(a, "-o") && i + 1 < argc) o->out = argv[++i];
        else if (!strcmp(a, "-j") && i + 1 < argc) {
            int64_t j;
            if (sh_parse_i64(argv[++i], &j, "-j") < 0 || j < 1 || j > 256)
                return cli_usage("delta", "-j takes a thread count from 1 to 256");
            o->threads = (int)j;
        } else if (a[0] == '-' && a[1]) return cli_usage("delta", "unknown option or missing value: %s", a);
        else if (o->npos < 4096) o->pos[o->npos++] = a;
        else return cli_usage("delta", "too many arguments");
    }
    return 0;
}

static void delta_report(const char *what, const delta_stats *st, double secs, int json)
{
    double frac = st->units ? (double)st->changed / (double)st->units : 0;
    if (json) {
        json_t *j = json_pack("{s:s,s:I,s:I,s:f,s:I,s:I,s:f,s:f,s:{s:I,s:I,s:I,s:I,s:I}}", "op",
                              what, "target_bytes", (json_int_t)st->target_bytes, "delta_bytes",
                              (json_int_t)st->delta_bytes, "changed_fraction", frac,
                              "tensors_diff", (json_int_t)st->tensors_diff, "tensors_whole",
                              (json_int_t)st->tensors_whole, "ratio",
                              st->delta_bytes ? (double)st->target_bytes / (double)st->delta_bytes : 0,
                              "seconds", secs, "chunks", "SAME", (json_int_t)st->chunks[0],
                              "SPARSE", (json_int_t)st->chunks[1], "DENSE",
                              (json_int_t)st->chunks[2], "RAW", (json_int_t)st->chunks[3], "ZSTD",
                              (json_int_t)st->chunks[4]);
        sh_json_print(j);
        json_decref(j);
        return;
    }
    char b1[32], b2[32];
    fprintf(stderr, "delta %s: %s of tensors -> %s (%.1fx), %.3f%% of units changed, %llu diffed "
            "+ %llu whole tensors, %.2f s\n", what,
            sh_fmt_bytes((double)st->target_bytes, b1, sizeof b1),
            sh_fmt_bytes((double)st->delta_bytes, b2, sizeof b2),
            st->delta_bytes ? (double)st->target_bytes / (double)st->delta_bytes : 0, 100 * frac,
            (unsigned long long)st->tensors_diff, (unsigned long long)st->tensors_whole, secs);
}

static int delta_inspect_cmd(delta_cli *o)
{
    if (o->npos != 1) return cli_usage("delta", "inspect takes one delta");
    json_t *j;
    int rc = delta_inspect(o->pos[0], &j);
    if (rc < 0) return cli_fail("delta inspect", rc);
    if (o->json) {
        sh_json_print(j);
        json_decref(j);
        return 0;
    }
    char b1[32], b2[32];
    printf("%s: shoal delta v%d, %s\n  base   %s\n  target %s\n", o->pos[0],
           (int)json_integer_value(json_object_get(j, "version")),
           sh_fmt_bytes((double)json_integer_value(json_object_get(j, "bytes")), b1, sizeof b1),
           json_string_value(json_object_get(j, "base_digest")),
           json_string_value(json_object_get(j, "target_digest")));
    printf("  %-52s %-5s %-8s %10s %10s %9s  %s\n", "tensor", "mode", "dtype", "size", "delta",
           "changed", "chunks");
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(j, "tensors"), i, t)
    {
        char enc[128] = "";
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(t, "encodings"), k, v)
        {
            size_t n = strlen(enc);
            snprintf(enc + n, sizeof enc - n, "%s%s:%lld", n ? " " : "", k,
                     (long long)json_integer_value(v));
        }
        printf("  %-52s %-5s %-8s %10s %10s %8.3f%%  %s\n",
               json_string_value(json_object_get(t, "name")),
               json_string_value(json_object_get(t, "mode")),
               json_string_value(json_object_get(t, "dtype")),
               sh_fmt_bytes((double)json_integer_value(json_object_get(t, "nbytes")), b1, sizeof b1),
               sh_fmt_bytes((double)json_integer_value(json_object_get(t, "bytes")), b2, sizeof b2),
               100 * json_real_value(json_object_get(t, "changed_fraction")), enc);
    }
    json_decref(j);
    return 0;
}

int cli_cmd_delta(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(delta_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : 0;
    }
    delta_cli o = {0};
    int rc = delta_parse_args(argc, argv, &o);
    if (rc) return rc;
    const char *sub = argv[1];
    sh_progress pg;
    delta_opts opts = {.threads = o.threads, .progress = &pg, .verify_base = o.verify_base};
    delta_stats st;
    double t0 = sh_now_mono();
    if (!strcmp(sub, "inspect")) return delta_inspect_cmd(&o);
    if (!strcmp(sub, "make")) {
        if (o.npos != 2 || !o.out) return cli_usage("delta", "make needs BASE NEW -o DELTA");
        sh_progress_start(&pg, "delta make", 0, "B");
        rc = delta_make(o.pos[0], o.pos[1], o.out, &opts, &st);
        sh_progress_finish(&pg);
        if (rc < 0) return cli_fail("delta make", rc);
        delta_report("make", &st, sh_now_mono() - t0, o.json);
        return 0;
    }
    if (!strcmp(sub, "apply")) {
        if (o.npos != 2 || (!o.out == !o.in_place))
            return cli_usage("delta", "apply needs BASE DELTA and either -o OUT or --in-place");
        sh_progress_start(&pg, "delta apply", 0, "B");
        rc = delta_apply(o.pos[0], o.pos[1], o.in_place ? NULL : o.out, &opts);
        sh_progress_finish(&pg);
        return rc < 0 ? cli_fail("delta apply", rc) : 0;
    }
    if (!strcmp(sub, "squash")) {
        if (o.npos < 1 || !o.out) return cli_usage("delta", "squash needs D1 D2 ... -o DELTA");
        rc = delta_squash(o.pos, (size_t)o.npos, o.out, &opts, &st);
        if (rc < 0) return cli_fail("delta squash", rc);
        delta_report("squash", &st, sh_now_mono() - t0, o.json);
        return 0;
    }
    return cli_usage("delta", "unknown subcommand \"%s\" (make, apply, squash, inspect)", sub);
}
