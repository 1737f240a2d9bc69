/* shoal delta: make, apply, squash and inspect weight deltas. */
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
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

static const char *const subs[] = {"make", "apply", "squash", "inspect", NULL};
/* Each subcommand's options, by their codes in opts_all. */
static const char *const sub_opts[] = {"ojJ", "ojiv", "ojJ", "J"};
static const struct option opts_all[] = {{"json", no_argument, 0, 'J'},
                                         {"in-place", no_argument, 0, 'i'},
                                         {"verify-base", no_argument, 0, 'v'},
                                         {0}};

/* Parses argv (argv[0] is the subcommand) into o: -1, or the status to exit with. */
static int delta_parse_args(const char *cmd, int sub, int argc, char **argv, delta_cli *o)
{
    struct option mine[CLI_MAX_OPTS];
    cli_args a = {cmd, delta_usage, cli_opts_pick(opts_all, sub_opts[sub], mine), NULL, NULL,
                  strchr(sub_opts[sub], 'o') ? "o:j:" : NULL, opts_all};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        int64_t j;
        switch (c) {
        case 'J': o->json = 1; break;
        case 'i': o->in_place = 1; break;
        case 'v': o->verify_base = 1; break;
        case 'o': o->out = optarg; break;
        case 'j':
            if (cli_int(cmd, "-j", optarg, 1, 256, &j)) return CLI_USAGE;
            o->threads = (int)j;
            break;
        default: return a.rc;
        }
    }
    if (argc - optind > 4096) return cli_usage(cmd, "too many arguments (at most 4096)");
    for (int i = optind; i < argc; i++) o->pos[o->npos++] = argv[i];
    return -1;
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
    /* The command's result: on stdout, as store publish prints its own. */
    printf("delta %s: %s of tensors -> %s (%.1fx), %.3f%% of units changed, %llu diffed "
            "+ %llu whole tensors, %.2f s\n", what,
            sh_fmt_bytes((double)st->target_bytes, b1, sizeof b1),
            sh_fmt_bytes((double)st->delta_bytes, b2, sizeof b2),
            st->delta_bytes ? (double)st->target_bytes / (double)st->delta_bytes : 0, 100 * frac,
            (unsigned long long)st->tensors_diff, (unsigned long long)st->tensors_whole, secs);
}

static int delta_inspect_cmd(delta_cli *o)
{
    if (o->npos != 1) return cli_usage("delta inspect", "inspect takes one delta");
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
    int rc, k = cli_subcommand("delta", delta_usage, argc, argv, subs, &rc);
    if (k < 0) return rc;
    const char *sub = subs[k];
    char cmd[32];
    snprintf(cmd, sizeof cmd, "delta %s", sub);
    delta_cli o = {0};
    if ((rc = delta_parse_args(cmd, k, argc - 1, argv + 1, &o)) >= 0) return rc;
    sh_progress pg;
    delta_opts opts = {.threads = o.threads, .progress = &pg, .verify_base = o.verify_base};
    delta_stats st;
    double t0 = sh_now_mono();
    if (!strcmp(sub, "inspect")) return delta_inspect_cmd(&o);
    if (!strcmp(sub, "make")) {
        if (o.npos != 2 || !o.out) return cli_usage(cmd, "make needs BASE NEW -o DELTA");
        sh_progress_start(&pg, "delta make", 0, "B");
        rc = delta_make(o.pos[0], o.pos[1], o.out, &opts, &st);
        sh_progress_finish(&pg);
        if (rc < 0) return cli_fail("delta make", rc);
        delta_report("make", &st, sh_now_mono() - t0, o.json);
        return 0;
    }
    if (!strcmp(sub, "apply")) {
        if (o.npos != 2 || (!o.out == !o.in_place))
            return cli_usage(cmd, "apply needs BASE DELTA and either -o OUT or --in-place");
        sh_progress_start(&pg, "delta apply", 0, "B");
        rc = delta_apply(o.pos[0], o.pos[1], o.in_place ? NULL : o.out, &opts);
        sh_progress_finish(&pg);
        return rc < 0 ? cli_fail("delta apply", rc) : 0;
    }
    if (!strcmp(sub, "squash")) {
        if (o.npos < 1 || !o.out) return cli_usage(cmd, "squash needs D1 D2 ... -o DELTA");
        rc = delta_squash(o.pos, (size_t)o.npos, o.out, &opts, &st);
        if (rc < 0) return cli_fail("delta squash", rc);
        delta_report("squash", &st, sh_now_mono() - t0, o.json);
        return 0;
    }
    return cli_usage(cmd, "no such subcommand");
}
