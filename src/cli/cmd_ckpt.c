/* shoal ckpt: generate and inspect safetensors checkpoints. */
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "shoal/ckpt.h"

const char cli_help_ckpt[] = "synth, step and inspect safetensors checkpoints";

static const char ckpt_usage[] =
    "usage: shoal ckpt synth --params N [--seed S] -o OUT.safetensors\n"
    "       shoal ckpt step IN --lr LR [--steps K] [--seed S] -o OUT.safetensors\n"
    "       shoal ckpt family NAME [--layers N] [--experts E] [--shrink K] [--vocab V]\n"
    "                         [--shards N] [--seed S] -o OUT\n"
    "       shoal ckpt next IN [--lr LR] [--wd WD] [--steps K] [--seed S] -o OUT\n"
    "       shoal ckpt inspect CKPT [--tensors] [--json]\n\n"
    "synth    a Llama-shaped bf16 checkpoint of about N parameters (K/M/G suffixes)\n"
    "         with Hugging Face tensor names and realistic magnitudes\n"
    "step     K Adam steps of learning rate LR with random gradients on fp32 master\n"
    "         weights, cast back to bf16 with round-to-nearest-even (default K=1)\n"
    "family   the tensor names and shapes of a public model (llama3-8b, qwen2.5-1.5b,\n"
    "         qwen3-30b-a3b, deepseek-v3, single) with synthetic values; fewer layers\n"
    "         or experts, or widths divided by K, keep it small; --shards N writes a\n"
    "         folder of N shards with its index\n"
    "next     the next version of any checkpoint (file or folder): AdamW on fp32\n"
    "         masters, rounded back to bf16/f32, FP8 re-quantised per 128x128 block\n"
    "         (defaults: LR 1e-6, WD 0.1, K 1)\n"
    "inspect  files, tensors, parameters, bytes and the checkpoint's xxh3-128 digest;\n"
    "         CKPT is a .safetensors file or a folder with " CKPT_INDEX_NAME "\n";

/* Options shared by the subcommands; positional arguments go to pos[]. */
typedef struct {
    const char *out, *pos[4];
    int npos, json, tensors;
    uint64_t params, seed, steps, layers, experts, vocab, shrink, shards;
    double lr, wd;
    int has_params, has_lr;
} ckpt_opts;

static const char *const subs[] = {"synth", "step", "family", "next", "inspect", NULL};
/* Each subcommand's options, by their codes in opts_all. */
static const char *const sub_opts[] = {"pso", "lkso", "LEKVNso", "lwkso", "tJ"};
static const struct option opts_all[] = {{"params", required_argument, 0, 'p'}, {"seed", required_argument, 0, 's'},
                                         {"steps", required_argument, 0, 'k'},  {"layers", required_argument, 0, 'L'},
                                         {"experts", required_argument, 0, 'E'}, {"vocab", required_argument, 0, 'V'},
                                         {"shrink", required_argument, 0, 'K'}, {"shards", required_argument, 0, 'N'},
                                         {"wd", required_argument, 0, 'w'},     {"lr", required_argument, 0, 'l'},
                                         {"tensors", no_argument, 0, 't'},      {"json", no_argument, 0, 'J'},
                                         {0}};

/* Parses argv (argv[0] is the subcommand) into o: -1, or the status to exit with. */
static int ckpt_parse(const char *cmd, int sub, int argc, char **argv, ckpt_opts *o)
{
    struct option mine[CLI_MAX_OPTS];
    cli_args a = {cmd, ckpt_usage, cli_opts_pick(opts_all, sub_opts[sub], mine), NULL, NULL,
                  strchr(sub_opts[sub], 'o') ? "o:" : NULL, opts_all};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        const char *v = optarg, *name = "";
        for (const struct option *p = opts_all; p->name; p++)
            if (p->val == c) name = p->name;
        char opt[32];
        snprintf(opt, sizeof opt, "--%s", name);
        int rc = 0;
        switch (c) {
        case 'J': o->json = 1; break;
        case 't': o->tensors = 1; break;
        case 'o': o->out = v; break;
        case 'p': rc = sh_parse_size(v, &o->params, opt), o->has_params = 1; break;
        case 's': rc = sh_parse_u64(v, &o->seed, opt); break;
        case 'k': rc = sh_parse_u64(v, &o->steps, opt); break;
        case 'L': rc = sh_parse_u64(v, &o->layers, opt); break;
        case 'E': rc = sh_parse_u64(v, &o->experts, opt); break;
        case 'V': rc = sh_parse_u64(v, &o->vocab, opt); break;
        case 'K': rc = sh_parse_u64(v, &o->shrink, opt); break;
        case 'N': rc = sh_parse_u64(v, &o->shards, opt); break;
        case 'w': rc = sh_parse_double(v, &o->wd, opt); break;
        case 'l': rc = sh_parse_double(v, &o->lr, opt), o->has_lr = 1; break;
        default: return a.rc;
        }
        if (rc < 0) return cli_usage(cmd, "%s", sh_errmsg());
        /* 0 would mean "the model's own" to ckpt_family: a full-size model
         * (16 GB for llama3-8b) for a flag meant to make it small. */
        uint64_t given = c == 'L' ? o->layers : c == 'E' ? o->experts : c == 'V' ? o->vocab
                       : c == 'K' ? o->shrink : c == 'N' ? o->shards : 1;
        if (given == 0) return cli_usage(cmd, "%s: expected at least 1, got \"%s\" (leave it out for the model's own)", opt, v);
    }
    if (argc - optind > 4) return cli_usage(cmd, "unexpected argument \"%s\"", argv[optind + 4]);
    for (int i = optind; i < argc; i++) o->pos[o->npos++] = argv[i];
    return -1;
}

static void ckpt_shape_str(const ckpt_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static json_t *ckpt_tensor_json(const ckpt *c, const ckpt_tensor *t, sh_hash128 d)
{
    json_t *shape = json_array();
    for (int k = 0; k < t->ndim; k++) json_array_append_new(shape, json_integer(t->shape[k]));
    char hex[33];
    sh_hash128_hex(d, hex);
    return json_pack("{s:s,s:s,s:o,s:I,s:s,s:I,s:s}", "name", t->name, "dtype",
                     ckpt_dtype_name(t->dtype), "shape", shape, "nbytes", (json_int_t)t->nbytes,
                     "file", c->files[t->file].name, "offset", (json_int_t)t->offset, "digest", hex);
}

static int ckpt_inspect(ckpt_opts *o)
{
    if (o->npos != 1) return cli_usage("ckpt inspect", "inspect takes one checkpoint");
    ckpt *c;
    int rc = ckpt_open(o->pos[0], &c);
    if (rc < 0) return cli_fail("ckpt inspect", rc);
    sh_hash128 dig, *td = calloc(c->ntensors + 1, sizeof *td);
    rc = td ? ckpt_digest(c, 0, &dig, td) : sh_err(SH_ENOMEM, "out of memory");
    if (rc < 0) {
        free(td);
        ckpt_close(c);
        return cli_fail("ckpt inspect", rc);
    }
    uint64_t params = 0;
    for (size_t i = 0; i < c->ntensors; i++) params += c->tensors[i].numel;
    char hex[33], b1[32], b2[32];
    sh_hash128_hex(dig, hex);
    if (o->json) {
        json_t *files = json_array(), *tensors = json_array();
        for (size_t f = 0; f < c->nfiles; f++)
            json_array_append_new(files, json_pack("{s:s,s:I,s:I,s:I}", "name", c->files[f].name,
                                                   "bytes", (json_int_t)c->files[f].size,
                                                   "header_bytes", (json_int_t)c->files[f].header_len,
                                                   "tensors", (json_int_t)c->files[f].count));
        for (size_t i = 0; i < c->ntensors; i++)
            json_array_append_new(tensors, ckpt_tensor_json(c, &c->tensors[i], td[i]));
        json_t *j = json_pack("{s:s,s:b,s:I,s:I,s:I,s:s,s:o,s:o,s:O}", "path", c->path, "sharded",
                              c->is_folder, "params", (json_int_t)params, "data_bytes",
                              (json_int_t)ckpt_data_bytes(c), "file_bytes",
                              (json_int_t)ckpt_file_bytes(c), "digest", hex, "files", files,
                              "tensors", tensors, "metadata",
                              c->metadata ? c->metadata : json_null());
        sh_json_print(j);
        json_decref(j);
    } else {
        printf("%s: %s, %zu file(s), %zu tensors, %llu parameters, %s of data (%s on disk)\n"
               "digest %s\n",
               c->path, c->is_folder ? "sharded folder" : "safetensors file", c->nfiles,
               c->ntensors, (unsigned long long)params,
               sh_fmt_bytes((double)ckpt_data_bytes(c), b1, sizeof b1),
               sh_fmt_bytes((double)ckpt_file_bytes(c), b2, sizeof b2), hex);
        for (size_t i = 0; o->tensors && i < c->ntensors; i++) {
            const ckpt_tensor *t = &c->tensors[i];
            char shape[256];
            ckpt_shape_str(t, shape, sizeof shape);
            printf("  %-52s %-8s %-18s %12s\n", t->name, ckpt_dtype_name(t->dtype), shape,
                   sh_fmt_bytes((double)t->nbytes, b1, sizeof b1));
        }
    }
    free(td);
    ckpt_close(c);
    return 0;
}

int cli_cmd_ckpt(int argc, char **argv)
{
    int rc, k = cli_subcommand("ckpt", ckpt_usage, argc, argv, subs, &rc);
    if (k < 0) return rc;
    const char *sub = subs[k];
    char cmd[32];
    snprintf(cmd, sizeof cmd, "ckpt %s", sub);
    ckpt_opts o = {.steps = 1, .seed = 1, .wd = 0.1};
    if ((rc = ckpt_parse(cmd, k, argc - 1, argv + 1, &o)) >= 0) return rc;
    if (!strcmp(sub, "inspect")) return ckpt_inspect(&o);
    if (!strcmp(sub, "synth")) {
        if (!o.has_params || !o.out || o.npos)
            return cli_usage(cmd, "synth needs --params N and -o OUT");
        if (o.params < 1000) return cli_usage(cmd, "--params: expected at least 1000, got \"%llu\"", (unsigned long long)o.params);
        sh_progress pg;
        sh_progress_start(&pg, "ckpt synth", 0, "B");
        rc = ckpt_synth_progress(o.out, o.params, o.seed, &pg);
        cli_progress_end(&pg, rc);
        return rc < 0 ? cli_fail("ckpt synth", rc) : 0;
    }
    if (!strcmp(sub, "step")) {
        if (o.npos != 1 || !o.has_lr || !o.out)
            return cli_usage(cmd, "step needs IN, --lr LR and -o OUT");
        if (!(o.lr > 0 && o.lr < 1)) return cli_usage(cmd, "--lr: expected a number in (0, 1), got %g", o.lr);
        sh_progress pg;
        sh_progress_start(&pg, "ckpt step", 0, "B");
        rc = ckpt_step_progress(o.pos[0], o.out, o.lr, o.steps, o.seed, &pg);
        cli_progress_end(&pg, rc);
        return rc < 0 ? cli_fail("ckpt step", rc) : 0;
    }
    if (!strcmp(sub, "family")) {
        if (o.npos != 1 || !o.out) return cli_usage(cmd, "family needs NAME and -o OUT");
        if (o.shrink > 4096 || o.shards > 100000)
            return cli_usage(cmd, "--shrink must be at most 4096 and --shards at most 100000");
        ckpt_family_opts f = {.layers = o.layers, .experts = o.experts, .vocab = o.vocab,
                              .shrink = (uint32_t)o.shrink, .shards = (uint32_t)o.shards,
                              .seed = o.seed};
        sh_progress pg;
        sh_progress_start(&pg, "ckpt family", 0, "B");
        rc = ckpt_family_write(o.pos[0], &f, o.out, &pg);
        cli_progress_end(&pg, rc);
        return rc < 0 ? cli_fail("ckpt family", rc) : 0;
    }
    if (!strcmp(sub, "next")) {
        if (o.npos != 1 || !o.out) return cli_usage(cmd, "next needs IN and -o OUT");
        if (o.has_lr && !(o.lr > 0 && o.lr < 1)) return cli_usage(cmd, "--lr: expected a number in (0, 1), got %g", o.lr);
        ckpt_train_opts t = {.lr = o.has_lr ? o.lr : 1e-6, .wd = o.wd, .steps = o.steps,
                             .seed = o.seed};
        sh_progress pg;
        sh_progress_start(&pg, "ckpt next", 0, "B");
        rc = ckpt_family_next(o.pos[0], o.out, &t, &pg);
        cli_progress_end(&pg, rc);
        return rc < 0 ? cli_fail("ckpt next", rc) : 0;
    }
    return cli_usage(cmd, "no such subcommand");
}
