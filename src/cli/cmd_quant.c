/* shoal quant: FP8 block quantisation of bf16 checkpoints for rollouts. */
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "shoal/delta.h"

const char cli_help_quant[] = "quantise bf16 weights to FP8 (E4M3, 128x128 block scales), or update incrementally";

static const char quant_usage[] =
    "usage: shoal quant fp8 IN -o OUT [--keep SUBSTR]... [-j N] [--json]\n"
    "       shoal quant fp8 --update FP8CKPT --from NEW_BF16 --delta DELTA [-o OUT]\n"
    "                       [--keep SUBSTR]... [-j N] [--json]\n\n"
    "Every 2-D BF16 tensor NAME becomes F8_E4M3 NAME with F32 NAME_scale_inv, one\n"
    "scale per 128x128 block (edge blocks partial), as in DeepSeek-V3 checkpoints;\n"
    "dequantised weight = fp8 value x scale_inv.  Other tensors are copied.  Tensors\n"
    "whose names contain a --keep substring stay bf16 (e.g. --keep embed_tokens).\n"
    "--update re-quantises only the blocks that DELTA (FP8CKPT's source -> NEW_BF16)\n"
    "changed, writing OUT or replacing FP8CKPT atomically; the result is byte-identical\n"
    "to `shoal quant fp8 NEW_BF16` with the same --keep.\n\n"
    "--json prints one object: tensors_quantised, tensors_copied, blocks_quantised,\n"
    "bytes_in, bytes_out (tensor data) and seconds; with --update, blocks_requantised\n"
    "and seconds.\n";

/* quant fp8 --update: re-quantises the blocks a delta changed. */
static int quant_update(const char *upd, const char *from, const char *dlt, const char *out, const char *const *keep,
                        delta_opts *o, int json)
{
    sh_progress pg;
    o->progress = &pg;
    uint64_t blocks = 0;
    double t0 = sh_now_mono();
    sh_progress_start(&pg, "quant fp8 --update", 0, "B");
    int rc = delta_quant_fp8_update(upd, from, dlt, out, keep, o, &blocks);
    cli_progress_end(&pg, rc);
    if (rc < 0) return cli_fail("quant fp8", rc);
    if (json) {
        json_t *j = json_pack("{s:I,s:f}", "blocks_requantised", (json_int_t)blocks, "seconds", sh_now_mono() - t0);
        sh_json_print(j);
        json_decref(j);
    } else {
        fprintf(stderr, "quant fp8: re-quantised %llu blocks in %.2f s\n", (unsigned long long)blocks,
                sh_now_mono() - t0);
    }
    return 0;
}

/* quant fp8 IN -o OUT: the whole checkpoint. */
static int quant_full(const char *in, const char *out, const char *const *keep, delta_opts *o, int json)
{
    sh_progress pg;
    o->progress = &pg;
    delta_quant_stats st;
    double t0 = sh_now_mono();
    sh_progress_start(&pg, "quant fp8", 0, "B");
    int rc = delta_quant_fp8(in, out, keep, o, &st);
    cli_progress_end(&pg, rc);
    if (rc < 0) return cli_fail("quant fp8", rc);
    double secs = sh_now_mono() - t0;
    if (json) {
        json_t *j = json_pack("{s:I,s:I,s:I,s:I,s:I,s:f}", "tensors_quantised", (json_int_t)st.tensors_quantised,
                              "tensors_copied", (json_int_t)st.tensors_copied, "blocks_quantised",
                              (json_int_t)st.blocks, "bytes_in", (json_int_t)st.bytes_in, "bytes_out",
                              (json_int_t)st.bytes_out, "seconds", secs);
        sh_json_print(j);
        json_decref(j);
    } else {
        char bi[32], bo[32];
        fprintf(stderr, "quant fp8: quantised %llu tensors (%llu blocks), copied %llu; %s -> %s in %.2f s\n",
                (unsigned long long)st.tensors_quantised, (unsigned long long)st.blocks,
                (unsigned long long)st.tensors_copied, sh_fmt_bytes((double)st.bytes_in, bi, sizeof bi),
                sh_fmt_bytes((double)st.bytes_out, bo, sizeof bo), secs);
    }
    return 0;
}

int cli_cmd_quant(int argc, char **argv)
{
    static const char *const subs[] = {"fp8", NULL};
    static const struct option opts[] = {{"json", no_argument, 0, 'J'},          {"update", required_argument, 0, 'u'},
                                         {"from", required_argument, 0, 'f'},    {"delta", required_argument, 0, 'd'},
                                         {"keep", required_argument, 0, 'k'},    {0}};
    int rc;
    if (cli_subcommand("quant", quant_usage, argc, argv, subs, &rc) < 0) return rc;
    cli_args a = {"quant fp8", quant_usage, opts, NULL, NULL, "o:j:"};
    const char *in = NULL, *out = NULL, *upd = NULL, *from = NULL, *dlt = NULL;
    const char *keep[65] = {0};
    int nkeep = 0, json = 0, threads = 0;
    for (int c; (c = cli_getopt(&a, argc - 1, argv + 1)) != -1;) {
        int64_t j;
        switch (c) {
        case 'J': json = 1; break;
        case 'o': out = optarg; break;
        case 'u': upd = optarg; break;
        case 'f': from = optarg; break;
        case 'd': dlt = optarg; break;
        case 'k':
            if (nkeep == 64) return cli_usage("quant fp8", "too many --keep (at most 64)");
            keep[nkeep++] = optarg;
            break;
        case 'j':
            if (cli_int("quant fp8", "-j", optarg, 1, 256, &j)) return CLI_USAGE;
            threads = (int)j;
            break;
        default: return a.rc;
        }
    }
    if (optind < argc - 1) in = argv[1 + optind];
    if (optind + 1 < argc - 1) return cli_usage("quant fp8", "unexpected argument \"%s\"", argv[2 + optind]);
    delta_opts o = {.threads = threads};
    if (upd) {
        if (in || !from || !dlt)
            return cli_usage("quant fp8", "--update FP8CKPT needs --from NEW_BF16 and --delta DELTA, and no IN");
        return quant_update(upd, from, dlt, out, keep, &o, json);
    }
    if (!in || !out) return cli_usage("quant fp8", "fp8 needs IN and -o OUT");
    return quant_full(in, out, keep, &o, json);
}
