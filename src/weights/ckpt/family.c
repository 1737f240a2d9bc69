/* Real-shaped checkpoints for tests and benchmarks: the tensor names and
 * shapes of public model families, written down from their published
 * configs (config.json on the Hugging Face hub), filled with synthetic
 * values, and their next versions as a trainer makes them: fp32 master
 * weights, one AdamW step, rounded back to the stored dtype (bf16, f32, or
 * F8_E4M3 with one F32 scale_inv per 128 x 128 block, re-scaled from the
 * block's new absolute maximum as DeepSeek-V3's FP8 training does).
 *
 * Everything streams: bf16 and f32 tensors 2 MiB at a time, FP8 tensors one
 * block row (128 rows) at a time, so a 3 GB checkpoint is written in a few
 * MiB of memory.  Every piece draws from its own generator, seeded by
 * (seed, tensor, piece), so outputs are reproducible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weights/ckpt/ckpt_int.h"

#define FAM_QB 128 /* FP8 block edge */

enum { FAM_DENSE, FAM_MOE, FAM_MLA_FP8, FAM_SINGLE };

/* Published configs.  d: hidden_size, f: intermediate_size, mf:
 * moe_intermediate_size, L: num_hidden_layers, V: vocab_size, h / kv:
 * attention / key-value heads, hd: head_dim, E: routed experts, S: shared
 * experts, dense: first_k_dense_replace, ql / kl: q_lora_rank /
 * kv_lora_rank, rope: qk_rope_head_dim. */
typedef struct {
    const char *name;
    int kind;
    uint64_t d, f, mf, L, V, h, kv, hd, E, S, dense, ql, kl, rope;
    int tied, qkv_bias, qk_norm;
    const char *source;
} fam__cfg;

static const fam__cfg fam__cfgs[] = {
    /* meta-llama/Meta-Llama-3-8B: untied embedding and head, GQA 32/8. */
    {"llama3-8b", FAM_DENSE, 4096, 14336, 0, 32, 128256, 32, 8, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0,
     "meta-llama/Meta-Llama-3-8B"},
    /* Qwen/Qwen2.5-1.5B: q/k/v biases, tied embedding (no lm_head). */
    {"qwen2.5-1.5b", FAM_DENSE, 1536, 8960, 0, 28, 151936, 12, 2, 128, 0, 0, 0, 0, 0, 0, 1, 1, 0,
     "Qwen/Qwen2.5-1.5B"},
    /* Qwen/Qwen3-30B-A3B: 128 routed experts per layer, q/k norms, router. */
    {"qwen3-30b-a3b", FAM_MOE, 2048, 6144, 768, 48, 151936, 32, 4, 128, 128, 0, 0, 0, 0, 0, 0, 0,
     1, "Qwen/Qwen3-30B-A3B"},
    /* deepseek-ai/DeepSeek-V3: MLA attention, 3 dense layers then 256
     * routed + 1 shared expert, FP8 linear weights with weight_scale_inv. */
    {"deepseek-v3", FAM_MLA_FP8, 7168, 18432, 2048, 61, 129280, 128, 128, 128, 256, 1, 3, 1536,
     512, 64, 0, 0, 0, "deepseek-ai/DeepSeek-V3"},
    /* One tensor: Llama-3-8B's embedding (1 GB of bf16). */
    {"single", FAM_SINGLE, 4096, 0, 0, 0, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
     "meta-llama/Meta-Llama-3-8B (embed_tokens only)"},
};

const char *const ckpt_families[] = {"llama3-8b", "qwen2.5-1.5b", "qwen3-30b-a3b", "deepseek-v3",
                                     "single", NULL};

/* ---- Tensor lists -------------------------------------------------------- */

typedef struct {
    char name[160];
    ckpt_dtype dt;
    int64_t shape[2];
    int ndim;
    int is_scale; /* the scales of the FP8 weight just before it */
    float mean, sd;
} fam__spec;

typedef struct {
    fam__spec *s;
    size_t n, cap;
    int oom;
} fam__list;

static void fam__add(fam__list *l, ckpt_dtype dt, int64_t a, int64_t b, float mean, float sd,
                     const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void fam__add(fam__list *l, ckpt_dtype dt, int64_t a, int64_t b, float mean, float sd,
                     const char *fmt, ...)
{
    if (l->n + 2 > l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        fam__spec *s = realloc(l->s, cap * sizeof *s);
        if (!s) {
            l->oom = 1;
            return;
        }
        l->s = s, l->cap = cap;
    }
    fam__spec *s = &l->s[l->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->is_scale = 0;
    s->dt = dt, s->ndim = b ? 2 : 1, s->shape[0] = a, s->shape[1] = b, s->mean = mean, s->sd = sd;
    if (dt == CKPT_F8_E4M3) { /* its scales, as DeepSeek-V3 names them */
        fam__spec *c = &l->s[l->n++];
        snprintf(c->name, sizeof c->name, "%.148s_scale_inv", s->name);
        c->dt = CKPT_F32, c->ndim = 2, c->mean = c->sd = 0, c->is_scale = 1;
        c->shape[0] = (a + FAM_QB - 1) / FAM_QB, c->shape[1] = (b + FAM_QB - 1) / FAM_QB;
    }
}

/* A linear layer's weight [out, in]: bf16, or FP8 for the FP8 family. */
#define LIN(out, in, sd, ...) fam__add(l, lin, (int64_t)(out), (int64_t)(in), 0, sd, __VA_ARGS__)
#define NORM(n, ...) fam__add(l, CKPT_BF16, (int64_t)(n), 0, 1.0f, 0.05f, __VA_ARGS__)

static void fam__mlp(fam__list *l, ckpt_dtype lin, const char *p, uint64_t d, uint64_t f,
                     float sd, float sd_out)
{
    LIN(f, d, sd, "%sgate_proj.weight", p);
    LIN(f, d, sd, "%sup_proj.weight", p);
    LIN(d, f, sd_out, "%sdown_proj.weight", p);
}

static void fam__layer(fam__list *l, const fam__cfg *c, uint64_t i)
{
    ckpt_dtype lin = c->kind == FAM_MLA_FP8 ? CKPT_F8_E4M3 : CKPT_BF16;
    float sd = 0.02f, sd_out = 0.02f / sqrtf(2.0f * (float)c->L);
    char p[96], q[160];
    snprintf(p, sizeof p, "model.layers.%llu.", (unsigned long long)i);
    NORM(c->d, "%sinput_layernorm.weight", p);
    NORM(c->d, "%spost_attention_layernorm.weight", p);
    if (c->kind == FAM_MLA_FP8) {
        uint64_t qk = c->hd + c->rope; /* qk_nope_head_dim + qk_rope_head_dim */
        LIN(c->ql, c->d, sd, "%sself_attn.q_a_proj.weight", p);
        NORM(c->ql, "%sself_attn.q_a_layernorm.weight", p);
        LIN(c->h * qk, c->ql, sd, "%sself_attn.q_b_proj.weight", p);
        LIN(c->kl + c->rope, c->d, sd, "%sself_attn.kv_a_proj_with_mqa.weight", p);
        NORM(c->kl, "%sself_attn.kv_a_layernorm.weight", p);
        LIN(c->h * (c->hd + c->hd), c->kl, sd, "%sself_attn.kv_b_proj.weight", p);
        LIN(c->d, c->h * c->hd, sd_out, "%sself_attn.o_proj.weight", p);
    } else {
        static const char *const qkv[] = {"q_proj", "k_proj", "v_proj"};
        for (int k = 0; k < 3; k++) {
            uint64_t out = (k ? c->kv : c->h) * c->hd;
            LIN(out, c->d, sd, "%sself_attn.%s.weight", p, qkv[k]);
            if (c->qkv_bias) fam__add(l, CKPT_BF16, (int64_t)out, 0, 0, sd, "%sself_attn.%s.bias", p, qkv[k]);
        }
        LIN(c->d, c->h * c->hd, sd_out, "%sself_attn.o_proj.weight", p);
        if (c->qk_norm) {
            NORM(c->hd, "%sself_attn.q_norm.weight", p);
            NORM(c->hd, "%sself_attn.k_norm.weight", p);
        }
    }
    if (c->kind == FAM_DENSE || (c->kind == FAM_MLA_FP8 && i < c->dense)) {
        snprintf(q, sizeof q, "%smlp.", p);
        fam__mlp(l, lin, q, c->d, c->f, sd, sd_out);
        return;
    }
    /* A mixture of experts: the router, then every expert's MLP. */
    fam__add(l, CKPT_BF16, (int64_t)c->E, (int64_t)c->d, 0, sd, "%smlp.gate.weight", p);
    if (c->kind == FAM_MLA_FP8)
        fam__add(l, CKPT_F32, (int64_t)c->E, 0, 0, 0.01f, "%smlp.gate.e_score_correction_bias", p);
    for (uint64_t e = 0; e < c->E; e++) {
        snprintf(q, sizeof q, "%smlp.experts.%llu.", p, (unsigned long long)e);
        fam__mlp(l, lin, q, c->d, c->mf, sd, sd_out);
    }
    if (c->S) {
        snprintf(q, sizeof q, "%smlp.shared_experts.", p);
        fam__mlp(l, lin, q, c->d, c->mf * c->S, sd, sd_out);
    }
}

static uint64_t fam__div(uint64_t v, uint32_t k) { return v ? (v / k ? v / k : 1) : 0; }

/* The family's config after the options (layers, experts, widths). */
static int fam__config(const char *family, const ckpt_family_opts *o, fam__cfg *c)
{
    const fam__cfg *f = NULL;
    for (size_t i = 0; i < sizeof fam__cfgs / sizeof *fam__cfgs; i++)
        if (!strcmp(fam__cfgs[i].name, family)) f = &fam__cfgs[i];
    if (!f)
        return sh_err(SH_EINVAL, "unknown model family \"%s\" (known: llama3-8b, qwen2.5-1.5b, "
                      "qwen3-30b-a3b, deepseek-v3, single)", family);
    *c = *f;
    uint32_t k = o && o->shrink > 1 ? o->shrink : 1;
    c->d = fam__div(c->d, k), c->f = fam__div(c->f, k), c->mf = fam__div(c->mf, k);
    c->h = fam__div(c->h, k), c->kv = fam__div(c->kv, k);
    c->ql = fam__div(c->ql, k), c->kl = fam__div(c->kl, k);
    if (o && o->layers) c->L = o->layers;
    if (o && o->experts && c->E) c->E = o->experts;
    if (o && o->vocab) c->V = o->vocab;
    if (c->kind == FAM_MLA_FP8 && c->dense >= c->L) c->dense = c->L > 1 ? c->L - 1 : 0;
    return SH_OK;
}

static int fam__specs(const fam__cfg *c, fam__list *l)
{
    fam__add(l, CKPT_BF16, (int64_t)c->V, (int64_t)c->d, 0, 0.02f, "model.embed_tokens.weight");
    if (c->kind != FAM_SINGLE) {
        for (uint64_t i = 0; i < c->L; i++) fam__layer(l, c, i);
        NORM(c->d, "model.norm.weight");
        if (!c->tied) fam__add(l, CKPT_BF16, (int64_t)c->V, (int64_t)c->d, 0, 0.02f, "lm_head.weight");
    }
    return l->oom ? sh_err(SH_ENOMEM, "out of memory") : SH_OK;
}
#undef LIN
#undef NORM

static uint64_t fam__nbytes(const fam__spec *s)
{
    uint64_t n = (uint64_t)s->shape[0] * (uint64_t)(s->ndim == 2 ? s->shape[1] : 1);
    return n * ckpt_dtype_bits(s->dt) / 8;
}

int ckpt_family_size(const char *family, const ckpt_family_opts *o, uint64_t *bytes,
                     size_t *ntensors)
{
    fam__cfg c;
    SH_TRY(fam__config(family, o, &c));
    fam__list l = {0};
    int rc = fam__specs(&c, &l);
    uint64_t b = 0;
    for (size_t i = 0; i < l.n; i++) b += fam__nbytes(&l.s[i]);
    if (bytes) *bytes = b;
    if (ntensors) *ntensors = l.n;
    free(l.s);
    return rc;
}

/* ---- Values ---------------------------------------------------------------
 * One generator for both versions: a value is a fresh draw (first version,
 * old == NULL) or the AdamW step of the master weight behind the stored one
 * (next version). */

typedef struct {
    ckpt_writer **w;     /* per output file */
    size_t nw;
    const ckpt *in;      /* next version: the previous one */
    float lr, wd;
    uint64_t steps, seed;
    sh_progress *pg;
    uint64_t done;
    float *f;            /* scratch: one chunk or block row of floats */
    uint8_t *b;          /* scratch: the same in the output dtype */
    size_t fcap;
} fam__gen;

static float fam__draw(const fam__gen *g, uint64_t *s, float mean, float sd, float old, float gap)
{
    if (!g->in) return mean + sd * ckpt__normal(s);
    float u = (float)(ckpt__mix(s) >> 40) * (1.0f / 16777216.0f) - 0.5f; /* (-0.5, 0.5) */
    return ckpt__adamw(old + 1.98f * u * gap, s, g->lr, g->wd, g->steps);
}

/* Where tensor `name` goes: writer and index in it. */
static int fam__where(const fam__gen *g, const char *name, size_t *wi, size_t *ti)
{
    for (size_t k = 0; k < g->nw; k++) {
        long i = ckpt_writer_find(g->w[k], name);
        if (i >= 0) {
            *wi = k, *ti = (size_t)i;
            return SH_OK;
        }
    }
    return sh_err(SH_EINTERNAL, "family: no writer holds tensor \"%s\"", name);
}

static int fam__grow(fam__gen *g, size_t n)
{
    if (n <= g->fcap) return SH_OK;
    float *f = realloc(g->f, n * sizeof *f);
    if (f) g->f = f;
    uint8_t *b = realloc(g->b, n * sizeof *f);
    if (b) g->b = b;
    if (!f || !b) return sh_err(SH_ENOMEM, "out of memory");
    g->fcap = n;
    return SH_OK;
}

/* An element-wise tensor (bf16, f16, f32), chunk by chunk.  `old` is the
 * previous version's tensor (NULL for the first). */
static int fam__elementwise(fam__gen *g, size_t wi, size_t ti, uint64_t tid, const fam__spec *sp,
                            const ckpt_tensor *old)
{
    const ckpt_tensor *t = ckpt_writer_tensor(g->w[wi], ti);
    unsigned w = ckpt_dtype_bits(t->dtype) / 8;
    SH_TRY(fam__grow(g, CKPT_CHUNK / w));
    for (uint64_t off = 0, k = 0; off < t->nbytes; off += CKPT_CHUNK, k++) {
        size_t nb = t->nbytes - off < CKPT_CHUNK ? (size_t)(t->nbytes - off) : CKPT_CHUNK;
        size_t n = nb / w;
        uint64_t s = ckpt__seed(g->seed, tid, k);
        for (size_t i = 0; i < n; i++) {
            float v = 0, gap = 0;
            if (old && t->dtype == CKPT_BF16) {
                uint16_t h;
                memcpy(&h, old->data + off + 2 * i, 2);
                v = ckpt_bf16_to_f32(h), gap = ckpt__half_gap_bf16(h);
            } else if (old && t->dtype == CKPT_F16) {
                uint16_t h;
                memcpy(&h, old->data + off + 2 * i, 2);
                v = ckpt_f16_to_f32(h);
            } else if (old) {
                memcpy(&v, old->data + off + 4 * i, 4); /* f32: the master itself */
            }
            v = fam__draw(g, &s, sp ? sp->mean : 0, sp ? sp->sd : 0, v, gap);
            if (t->dtype == CKPT_BF16) {
                uint16_t h = ckpt_f32_to_bf16(v);
                memcpy(g->b + 2 * i, &h, 2);
            } else if (t->dtype == CKPT_F16) {
                uint16_t h = ckpt_f32_to_f16(v);
                memcpy(g->b + 2 * i, &h, 2);
            } else {
                memcpy(g->b + 4 * i, &v, 4);
            }
        }
        SH_TRY(ckpt_writer_put(g->w[wi], ti, off, g->b, nb));
        if (g->pg) sh_progress_update(g->pg, g->done += nb);
    }
    return SH_OK;
}

/* An FP8 weight and its scales, one block row at a time: the block row's
 * values (fresh, or stepped from the dequantised old ones), then per block
 * scale_inv = amax / 448 and the values quantised by it. */
static int fam__fp8(fam__gen *g, size_t wi, size_t ti, uint64_t tid, const fam__spec *sp,
                    const ckpt_tensor *old, const ckpt_tensor *old_scale)
{
    const ckpt_tensor *t = ckpt_writer_tensor(g->w[wi], ti);
    char sname[192];
    snprintf(sname, sizeof sname, "%s_scale_inv", t->name);
    size_t swi = 0, sti = 0;
    SH_TRY(fam__where(g, sname, &swi, &sti));
    int64_t rows = t->shape[0], cols = t->shape[1], nbc = (cols + FAM_QB - 1) / FAM_QB;
    if (ckpt_writer_tensor(g->w[swi], sti)->nbytes !=
        4 * (uint64_t)(((rows + FAM_QB - 1) / FAM_QB) * nbc))
        return sh_err(SH_EINVAL, "tensor \"%s\": %s is not one F32 per 128 x 128 block", t->name, sname);
    SH_TRY(fam__grow(g, (size_t)(FAM_QB * cols) + (size_t)nbc));
    float *sc = g->f + FAM_QB * cols;
    for (int64_t br = 0; br * FAM_QB < rows; br++) {
        int64_t r0 = br * FAM_QB, nr = rows - r0 < FAM_QB ? rows - r0 : FAM_QB;
        uint64_t s = ckpt__seed(g->seed, tid, (uint64_t)br);
        for (int64_t bc = 0; bc < nbc; bc++) sc[bc] = 0;
        for (int64_t i = 0; i < nr * cols; i++) {
            float v = 0, gap = 0;
            if (old) {
                float os;
                memcpy(&os, old_scale->data + 4 * (uint64_t)(br * nbc + (i % cols) / FAM_QB), 4);
                uint8_t q = old->data[(uint64_t)(r0 * cols + i)];
                v = ckpt_e4m3_to_f32(q) * os, gap = ckpt__half_gap_e4m3(q) * os;
            }
            v = fam__draw(g, &s, 0, sp ? sp->sd : 0, v, gap);
            g->f[i] = v;
            float a = fabsf(v);
            if (a > sc[(i % cols) / FAM_QB]) sc[(i % cols) / FAM_QB] = a;
        }
        for (int64_t bc = 0; bc < nbc; bc++) sc[bc] = sc[bc] > 0 ? sc[bc] / 448.0f : 1.0f;
        for (int64_t i = 0; i < nr * cols; i++) g->b[i] = ckpt_f32_to_e4m3(g->f[i] / sc[(i % cols) / FAM_QB]);
        SH_TRY(ckpt_writer_put(g->w[wi], ti, (uint64_t)(r0 * cols), g->b, (size_t)(nr * cols)));
        SH_TRY(ckpt_writer_put(g->w[swi], sti, 4 * (uint64_t)(br * nbc), sc, 4 * (size_t)nbc));
        if (g->pg) sh_progress_update(g->pg, g->done += (uint64_t)(nr * cols + 4 * nbc));
    }
    return SH_OK;
}

/* Is t a scale tensor written together with its FP8 weight? */
static int fam__is_scale(const char *name, ckpt_dtype dt, int (*has)(void *, const char *), void *ctx)
{
    size_t n = strlen(name);
    if (dt != CKPT_F32 || n <= 10 || strcmp(name + n - 10, "_scale_inv")) return 0;
    char w[192];
    snprintf(w, sizeof w, "%.*s", (int)(n - 10), name);
    return has(ctx, w);
}

/* ---- Writing a family -------------------------------------------------------- */

/* The shard of each tensor of l: the k-th of n takes the tensors (in order)
 * whose bytes start in the k-th n-th of the total, as save_pretrained's
 * max_shard_size splits a state dict in order.  An FP8 weight's scales stay
 * with it. */
static void fam__shards(const fam__list *l, uint32_t n, uint64_t total, uint32_t *shard)
{
    uint64_t before = 0;
    for (size_t i = 0; i < l->n; i++) {
        uint64_t k = before * n / (total ? total : 1);
        shard[i] = l->s[i].is_scale && i ? shard[i - 1] : (uint32_t)(k < n ? k : n - 1);
        before += fam__nbytes(&l->s[i]);
    }
}

static void fam__shard_name(char *out, size_t cap, size_t k, uint32_t n)
{
    snprintf(out, cap, "model-%05zu-of-%05u.safetensors", k + 1, n);
}

static int fam__open_writers(const char *path, const fam__list *l, uint32_t shards,
                             fam__gen *g, json_t **index)
{
    uint64_t total = 0;
    for (size_t i = 0; i < l->n; i++) total += fam__nbytes(&l->s[i]);
    g->nw = shards > 1 ? shards : 1;
    g->w = calloc(g->nw, sizeof *g->w);
    ckpt_tensor *t = calloc(l->n + 1, sizeof *t);
    uint32_t *shard = calloc(l->n + 1, sizeof *shard);
    if (shard) fam__shards(l, g->nw, total, shard);
    int rc = g->w && t && shard ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
    json_t *meta = json_pack("{s:s}", "format", "pt"), *wm = json_object();
    if (rc == SH_OK && shards > 1) rc = sh_mkdir_p(path, 0755);
    for (size_t k = 0; rc == SH_OK && k < g->nw; k++) {
        size_t n = 0;
        char name[64], p[4096];
        fam__shard_name(name, sizeof name, k, shards);
        for (size_t i = 0; i < l->n; i++) {
            if (shard[i] != k) continue;
            t[n++] = (ckpt_tensor){.name = l->s[i].name, .dtype = l->s[i].dt,
                                   .ndim = l->s[i].ndim, .shape = {l->s[i].shape[0], l->s[i].shape[1]}};
            if (g->nw > 1) json_object_set_new(wm, l->s[i].name, json_string(name));
        }
        if (g->nw > 1) rc = sh_path_join(p, sizeof p, path, name);
        else snprintf(p, sizeof p, "%s", path);
        if (rc == SH_OK) rc = ckpt_writer_open(p, t, n, meta, 0, &g->w[k]);
    }
    free(t);
    free(shard);
    json_decref(meta);
    if (rc == SH_OK && g->nw > 1)
        *index = json_pack("{s:{s:I},s:O}", "metadata", "total_size", (json_int_t)total,
                           "weight_map", wm);
    json_decref(wm);
    return rc;
}

/* Commits every writer (or aborts them all after a failure), then writes
 * the index of a folder. */
static int fam__finish(fam__gen *g, int rc, const char *dir, const void *index, size_t index_len)
{
    for (size_t k = 0; g->w && k < g->nw; k++) {
        if (!g->w[k]) continue;
        if (rc == SH_OK) rc = ckpt_writer_commit(g->w[k]);
        else ckpt_writer_abort(g->w[k]);
    }
    if (rc == SH_OK && index) {
        char p[4096];
        rc = sh_path_join(p, sizeof p, dir, CKPT_INDEX_NAME);
        if (rc == SH_OK) rc = sh_write_atomic(p, index, index_len);
        if (rc == SH_OK) rc = sh_fsync_dir(dir);
    }
    free(g->w);
    free(g->f);
    free(g->b);
    return rc;
}

int ckpt_family_write(const char *family, const ckpt_family_opts *o, const char *path,
                      sh_progress *pg)
{
    fam__cfg c;
    SH_TRY(fam__config(family, o, &c));
    fam__list l = {0};
    fam__gen g = {.seed = o ? o->seed : 0, .pg = pg};
    json_t *index = NULL;
    uint32_t shards = o && o->shards > 1 ? o->shards : 1;
    int rc = fam__specs(&c, &l);
    if (rc == SH_OK && shards > l.n)
        rc = sh_err(SH_EINVAL, "family %s: %u shards for %zu tensors", family, shards, l.n);
    if (rc == SH_OK) rc = fam__open_writers(path, &l, shards, &g, &index);
    if (pg && !pg->total)
        for (size_t i = 0; i < l.n; i++) pg->total += fam__nbytes(&l.s[i]);
    for (size_t i = 0; rc == SH_OK && i < l.n; i++) {
        const fam__spec *sp = &l.s[i];
        if (sp->is_scale) continue;
        size_t wi = 0, ti = 0;
        rc = fam__where(&g, sp->name, &wi, &ti);
        if (rc == SH_OK && sp->dt == CKPT_F8_E4M3) rc = fam__fp8(&g, wi, ti, i, sp, NULL, NULL);
        else if (rc == SH_OK) rc = fam__elementwise(&g, wi, ti, i, sp, NULL);
    }
    char *text = index ? json_dumps(index, JSON_SORT_KEYS | JSON_INDENT(2)) : NULL;
    if (index && !text && rc == SH_OK) rc = sh_err(SH_ENOMEM, "out of memory");
    rc = fam__finish(&g, rc, path, text, text ? strlen(text) : 0);
    free(text);
    json_decref(index);
    free(l.s);
    return rc;
}

/* ---- The next version ----------------------------------------------------------- */

static int fam__ckpt_has_fp8(void *ctx, const char *name)
{
    const ckpt_tensor *t = ckpt_find(ctx, name);
    return t && t->dtype == CKPT_F8_E4M3 && t->ndim == 2;
}

int ckpt_family_next(const char *in, const char *out, const ckpt_train_opts *o, sh_progress *pg)
{
    ckpt *c;
    SH_TRY(ckpt_open(in, &c));
    fam__gen g = {.in = c, .lr = o ? (float)o->lr : 1e-6f, .wd = o ? (float)o->wd : 0,
                  .steps = o && o->steps ? o->steps : 1, .seed = o ? o->seed : 0, .pg = pg};
    g.nw = c->nfiles;
    g.w = calloc(g.nw, sizeof *g.w);
    int rc = g.w ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
    if (rc == SH_OK && c->is_folder) rc = sh_mkdir_p(out, 0755);
    /* The same header images: a step changes values, not the layout. */
    for (size_t f = 0; rc == SH_OK && f < c->nfiles; f++) {
        char p[4096];
        if (c->is_folder) rc = sh_path_join(p, sizeof p, out, c->files[f].name);
        else snprintf(p, sizeof p, "%s", out);
        if (rc == SH_OK)
            rc = ckpt_writer_open_raw(p, c->files[f].map, c->files[f].header_len, &g.w[f]);
    }
    if (pg && !pg->total) pg->total = ckpt_data_bytes(c);
    for (size_t i = 0; rc == SH_OK && i < c->ntensors; i++) {
        const ckpt_tensor *t = &c->tensors[i];
        size_t ti = i - c->files[t->file].first;
        char sname[192];
        snprintf(sname, sizeof sname, "%s_scale_inv", t->name);
        const ckpt_tensor *sc = ckpt_find(c, sname);
        if (fam__is_scale(t->name, t->dtype, fam__ckpt_has_fp8, c)) continue;
        if (t->dtype == CKPT_F8_E4M3 && t->ndim == 2 && sc && sc->dtype == CKPT_F32)
            rc = fam__fp8(&g, t->file, ti, i, NULL, t, sc);
        else if (t->dtype == CKPT_BF16 || t->dtype == CKPT_F16 || t->dtype == CKPT_F32)
            rc = fam__elementwise(&g, t->file, ti, i, NULL, t);
        else { /* integers, other floats: unchanged */
            rc = ckpt_writer_put(g.w[t->file], ti, 0, t->data, (size_t)t->nbytes);
            if (pg) sh_progress_update(pg, g.done += t->nbytes);
        }
    }
    rc = fam__finish(&g, rc, out, c->is_folder ? c->index_json : NULL, c->index_len);
    ckpt_close(c);
    return rc;
}
