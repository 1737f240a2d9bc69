/* shoal quant: FP8 block quantisation of bf16 checkpoints for rollouts. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "shoal/delta.h"

const char cli_help_quant[] = "quantise bf16 weights to FP8 (E4M3, 128x128 block scales), or update incrementally";

static const char quant_usage[] =
    "usage: shoal quant fp8 IN -o OUT [--keep SUBSTR]... [-j N]\n"
    "       shoal quant fp8 --update FP8CKPT --from NEW_BF16 --delta DELTA [-o OUT]\n"
    "                       [--keep SUBSTR]... [-j N] [--json]\n\n"
    "Every 2-D BF16 tensor NAME becomes F8_E4M3 NAME with F32 NAME_scale_inv, one\n"
    "scale per 128x128 block (edge blocks partial), as in DeepSeek-V3 checkpoints;\n"
    "dequantised weight = fp8 value x scale_inv.  Other tensors are copied.  Tensors\n"
    "whose names contain a --keep substring stay bf16 (e.g. --keep embed_tokens).\n"
    "--update re-quantises only the blocks that DELTA (FP8CKPT's source -> NEW_BF16)\n"
    "changed, writing OUT or replacing FP8CKPT atomically; the result is byte-identical\n"
    "to `shoal quant fp8 NEW_BF16` with the same --keep.\n";

int cli_cmd_quant(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(quant_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : 0;
    }
    if (strcmp(argv[1], "fp8")) return cli_usage("quant", "unknown format \"%s\" (fp8)", argv[1]);
    const char *in = NULL, *out = NULL, *upd = NULL, *from = NULL, *dlt = NULL;
    const char *keep[65] = {0};
    int nkeep = 0, json = 0, threads = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "-o") && has) out = argv[++i];
        else if (!strcmp(a, "--update") && has) upd = argv[++i];
        else if (!strcmp(a, "--from") && has) from = argv[++i];
        else if (!strcmp(a, "--delta") && has) dlt = argv[++i];
        else if (!strcmp(a, "--keep") && has && nkeep < 64) keep[nkeep++] = argv[++i];
        else if (!strcmp(a, "-j") && has) {
            int64_t j;
            if (sh_parse_i64(argv[++i], &j, "-j") < 0 || j < 1 || j > 256)
                return cli_usage("quant", "-j takes a thread count from 1 to 256");
            threads = (int)j;
        } else if (a[0] != '-' && !in) in = a;
        else return cli_usage("quant", "unexpected argument \"%s\"", a);
    }
    sh_progress pg;
    delta_opts o = {.threads = threads, .progress = &pg};
    double t0 = sh_now_mono();
    if (upd) {
        if (in || !from || !dlt)
            return cli_usage("quant", "--update FP8CKPT needs --from NEW_BF16 and --delta DELTA");
        uint64_t blocks = 0;
        sh_progress_start(&pg, "quant fp8 --update", 0, "B");
        int rc = delta_quant_fp8_update(upd, from, dlt, out, keep, &o, &blocks);
        cli_progress_end(&pg, rc);
        if (rc < 0) return cli_fail("quant fp8", rc);
        if (json) {
            json_t *j = json_pack("{s:I,s:f}", "blocks_requantised", (json_int_t)blocks, "seconds",
                                  sh_now_mono() - t0);
            sh_json_print(j);
            json_decref(j);
        } else {
            fprintf(stderr, "quant fp8: re-quantised %llu blocks in %.2f s\n",
                    (unsigned long long)blocks, sh_now_mono() - t0);
        }
        return 0;
    }
    if (!in || !out) return cli_usage("quant", "fp8 needs IN and -o OUT");
    sh_progress_start(&pg, "quant fp8", 0, "B");
    int rc = delta_quant_fp8(in, out, keep, &o);
    cli_progress_end(&pg, rc);
    return rc < 0 ? cli_fail("quant fp8", rc) : 0;
}
