/* The model: parameter layout, forward and backward passes over the layers,
 * cross-entropy, AdamW.  Parameters of one kind are contiguous across
 * layers (all qkv weights, then all qkv biases, ...), as in llm.c; the named
 * tensor table is a view into that layout with Hugging Face style names. */
#include "shoal/nn.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rl/nn/layers_int.h"
#include "shoal/common.h"

/* Parameter kinds, in layout order. */
enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB, P_LN2W, P_LN2B,
    P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB, P_HEAD, P_COUNT
};

/* Activation kinds (sizes for B rows of T tokens). */
enum {
    A_ENC, A_LN1, A_LN1M, A_LN1R, A_QKV, A_ATTY, A_PRE, A_ATT, A_ATTPROJ, A_RES2, A_LN2, A_LN2M,
    A_LN2R, A_FCH, A_FCHG, A_FCPROJ, A_RES3, A_LNF, A_LNFM, A_LNFR, A_LOGITS, A_COUNT
};

struct nn_model {
    nn_config cfg;
    size_t sizes[P_COUNT];
    float *ptr[P_COUNT], *gptr[P_COUNT];
    float *params, *grads;
    size_t nparams;
    nn_tensor *tensors;
    int ntensors;
    int reference;
    int fp8_act; /* round each matrix product's input to e4m3 (nn_set_fp8_act) */
    /* Activations for up to cap_b rows of ctx tokens; acts and dacts share
     * one layout. */
    int cap_b, B, T;
    float *acts, *dacts, *dlogits;
    float *a[A_COUNT], *da[A_COUNT];
    int *tokens;
};

nn_config nn_config_default(int vocab)
{
    return (nn_config){.vocab = vocab, .ctx = 24, .width = 64, .layers = 2, .heads = 4};
}

int nn_config_check(const nn_config *c)
{
    if (c->vocab < 2 || c->vocab > 65536)
        return sh_err(SH_EINVAL, "model: vocab %d out of range 2..65536", c->vocab);
    if (c->ctx < 1 || c->ctx > 4096)
        return sh_err(SH_EINVAL, "model: ctx %d out of range 1..4096", c->ctx);
    if (c->layers < 1 || c->layers > 64)
        return sh_err(SH_EINVAL, "model: layers %d out of range 1..64", c->layers);
    if (c->heads < 1 || c->width < 1 || c->width > 8192 || c->width % c->heads)
        return sh_err(SH_EINVAL,
                      "model: width %d must be in 1..8192 and a multiple of heads %d",
                      c->width, c->heads);
    return 0;
}

static void param_sizes(const nn_config *c, size_t s[P_COUNT])
{
    size_t V = c->vocab, T = c->ctx, C = c->width, L = c->layers;
    s[P_WTE] = V * C;
    s[P_WPE] = T * C;
    s[P_LN1W] = s[P_LN1B] = s[P_LN2W] = s[P_LN2B] = L * C;
    s[P_QKVW] = L * 3 * C * C;
    s[P_QKVB] = L * 3 * C;
    s[P_ATTPROJW] = L * C * C;
    s[P_ATTPROJB] = L * C;
    s[P_FCW] = L * 4 * C * C;
    s[P_FCB] = L * 4 * C;
    s[P_FCPROJW] = L * C * 4 * C;
    s[P_FCPROJB] = L * C;
    s[P_LNFW] = s[P_LNFB] = C;
    s[P_HEAD] = V * C;
}

static void act_sizes(const nn_config *c, size_t B, size_t s[A_COUNT])
{
    size_t T = c->ctx, C = c->width, L = c->layers, NH = c->heads, V = c->vocab;
    s[A_ENC] = B * T * C;
    s[A_LN1] = s[A_ATTY] = s[A_ATTPROJ] = s[A_RES2] = s[A_LN2] = s[A_FCPROJ] = s[A_RES3] =
        L * B * T * C;
    s[A_LN1M] = s[A_LN1R] = s[A_LN2M] = s[A_LN2R] = L * B * T;
    s[A_QKV] = L * B * T * 3 * C;
    s[A_PRE] = s[A_ATT] = L * B * NH * T * T;
    s[A_FCH] = s[A_FCHG] = L * B * T * 4 * C;
    s[A_LNF] = B * T * C;
    s[A_LNFM] = s[A_LNFR] = B * T;
    s[A_LOGITS] = B * T * V;
}

static void add_tensor(nn_model *m, const char *name, int kind, size_t off, int rows, int cols)
{
    nn_tensor *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = rows;
    t->cols = cols;
    t->offset = (size_t)(m->ptr[kind] - m->params) + off;
}

/* The named view: Hugging Face names, q/k/v split out of the fused qkv. */
static void build_table(nn_model *m)
{
    int C = m->cfg.width, V = m->cfg.vocab, L = m->cfg.layers;
    size_t CC = (size_t)C * C;
    char n[96];
    add_tensor(m, "model.embed_tokens.weight", P_WTE, 0, V, C);
    add_tensor(m, "model.embed_positions.weight", P_WPE, 0, m->cfg.ctx, C);
    for (int l = 0; l < L; l++) {
        static const char *qkv[3] = {"q_proj", "k_proj", "v_proj"};
#define T_(fmt, kind, off, r, c)                                                 \
    do {                                                                         \
        snprintf(n, sizeof n, "model.layers.%d." fmt, l);                        \
        add_tensor(m, n, kind, off, r, c);                                       \
    } while (0)
        T_("input_layernorm.weight", P_LN1W, (size_t)l * C, 1, C);
        T_("input_layernorm.bias", P_LN1B, (size_t)l * C, 1, C);
        for (int j = 0; j < 3; j++) {
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.weight", l, qkv[j]);
            add_tensor(m, n, P_QKVW, ((size_t)l * 3 + j) * CC, C, C);
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.bias", l, qkv[j]);
            add_tensor(m, n, P_QKVB, ((size_t)l * 3 + j) * C, 1, C);
        }
        T_("self_attn.o_proj.weight", P_ATTPROJW, (size_t)l * CC, C, C);
        T_("self_attn.o_proj.bias", P_ATTPROJB, (size_t)l * C, 1, C);
        T_("post_attention_layernorm.weight", P_LN2W, (size_t)l * C, 1, C);
        T_("post_attention_layernorm.bias", P_LN2B, (size_t)l * C, 1, C);
        T_("mlp.up_proj.weight", P_FCW, (size_t)l * 4 * CC, 4 * C, C);
        T_("mlp.up_proj.bias", P_FCB, (size_t)l * 4 * C, 1, 4 * C);
        T_("mlp.down_proj.weight", P_FCPROJW, (size_t)l * 4 * CC, C, 4 * C);
        T_("mlp.down_proj.bias", P_FCPROJB, (size_t)l * C, 1, C);
#undef T_
    }
    add_tensor(m, "model.norm.weight", P_LNFW, 0, 1, C);
    add_tensor(m, "model.norm.bias", P_LNFB, 0, 1, C);
    add_tensor(m, "lm_head.weight", P_HEAD, 0, V, C);
}

/* splitmix64 and Box-Muller: a generator that gives the same bits everywhere. */
static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float normal(uint64_t *s)
{
    double u1 = ((splitmix(s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (splitmix(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int alloc_model(const nn_config *cfg, nn_model **out)
{
    SH_TRY(nn_config_check(cfg));
    nn_model *m = calloc(1, sizeof *m);
    if (!m) return sh_err(SH_ENOMEM, "model: out of memory");
    m->cfg = *cfg;
    param_sizes(cfg, m->sizes);
    for (int i = 0; i < P_COUNT; i++) m->nparams += m->sizes[i];
    m->params = calloc(m->nparams, sizeof(float));
    m->grads = calloc(m->nparams, sizeof(float));
    m->tensors = calloc(4 + 18 * (size_t)cfg->layers, sizeof(nn_tensor));
    if (!m->params || !m->grads || !m->tensors) {
        nn_free(m);
        return sh_err(SH_ENOMEM, "model: out of memory for %zu parameters", m->nparams);
    }
    size_t off = 0;
    for (int i = 0; i < P_COUNT; i++) {
        m->ptr[i] = m->params + off;
        m->gptr[i] = m->grads + off;
        off += m->sizes[i];
    }
    build_table(m);
    /* One process is one worker: OpenBLAS threads would only fight over the
     * cores and make sums depend on the thread count. */
    openblas_set_num_threads(1);
    *out = m;
    return 0;
}

int nn_new(const nn_config *cfg, uint64_t seed, nn_model **out)
{
    nn_model *m;
    SH_TRY(alloc_model(cfg, &m));
    uint64_t s = seed ^ 0x5eed5eed5eedULL;
    for (int k = 0; k < P_COUNT; k++) {
        float *p = m->ptr[k];
        int one = k == P_LN1W || k == P_LN2W || k == P_LNFW;
        int zero = k == P_LN1B || k == P_LN2B || k == P_LNFB || k == P_QKVB || k == P_ATTPROJB ||
                   k == P_FCB || k == P_FCPROJB;
        /* Residual projections get GPT-2's 1/sqrt(2L) scaling. */
        float std = (k == P_ATTPROJW || k == P_FCPROJW) ? 0.02f / sqrtf(2.0f * cfg->layers)
                                                        : 0.02f;
        for (size_t i = 0; i < m->sizes[k]; i++)
            p[i] = one ? 1.0f : zero ? 0.0f : std * normal(&s);
    }
    *out = m;
    return 0;
}

int nn_clone(const nn_model *src, nn_model **out)
{
    nn_model *m;
    SH_TRY(alloc_model(&src->cfg, &m));
    memcpy(m->params, src->params, src->nparams * sizeof(float));
    m->reference = src->reference;
    m->fp8_act = src->fp8_act;
    *out = m;
    return 0;
}

void nn_free(nn_model *m)
{
    if (!m) return;
    free(m->params);
    free(m->grads);
    free(m->tensors);
    free(m->acts);
    free(m->dacts);
    free(m->dlogits);
    free(m->tokens);
    free(m);
}

const nn_config *nn_cfg(const nn_model *m) { return &m->cfg; }
size_t nn_num_params(const nn_model *m) { return m->nparams; }
float *nn_params(nn_model *m) { return m->params; }
float *nn_grads(nn_model *m) { return m->grads; }
int nn_num_tensors(const nn_model *m) { return m->ntensors; }
const nn_tensor *nn_tensor_at(const nn_model *m, int i) { return &m->tensors[i]; }
void nn_set_reference(nn_model *m, int reference) { m->reference = reference; }

void nn_set_fp8_act(nn_model *m, int on) { m->fp8_act = on; }

float nn_e4m3_round(float x)
{
    float a = fabsf(x);
    if (!(a == a)) return x;
    if (a >= 448.0f) return copysignf(448.0f, x);
    if (a < 0.015625f) /* subnormal: a multiple of 2^-9 */
        return copysignf(rintf(a * 512.0f) / 512.0f, x);
    int e;
    float f = frexpf(a, &e); /* a = f 2^e, f in [0.5, 1): 4 significant bits */
    float r = ldexpf(rintf(f * 16.0f), e - 4);
    return copysignf(r > 448.0f ? 448.0f : r, x);
}

/* Rounds n values to e4m3 with one scale (amax / 448) per group of 128, as
 * FP8 matrix products quantise their activations (1 x 128 tiles). */
static void fp8_rows(float *x, int N, int C)
{
    for (int i = 0; i < N; i++)
        for (int c0 = 0; c0 < C; c0 += 128) {
            float *v = x + (size_t)i * C + c0, amax = 0;
            int n = C - c0 < 128 ? C - c0 : 128;
            for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(v[j]));
            float s = amax > 0 && isfinite(amax) ? amax / 448.0f : 1.0f;
            for (int j = 0; j < n; j++) v[j] = nn_e4m3_round(v[j] / s) * s;
        }
}

/* out (N,OC) = inp (N,C) @ w^T + bias.  With fp8_act the input is first
 * rounded in place: each product's input is used by nothing else. */
static void linear(nn_model *m, float *out, float *inp, const float *w, const float *bias, int N,
                   int C, int OC)
{
    if (m->fp8_act) fp8_rows(inp, N, C);
    nn__matmul_forward(out, inp, w, bias, N, C, OC, m->reference);
}

const nn_tensor *nn_tensor_find(const nn_model *m, const char *name)
{
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

static int ensure_acts(nn_model *m, int B)
{
    if (B <= m->cap_b) return 0;
    size_t s[A_COUNT], total = 0;
    act_sizes(&m->cfg, (size_t)B, s);
    for (int i = 0; i < A_COUNT; i++) total += s[i];
    float *a = malloc(total * sizeof(float)), *d = malloc(total * sizeof(float));
    float *dl = malloc(s[A_LOGITS] * sizeof(float));
    int *tok = malloc((size_t)B * m->cfg.ctx * sizeof(int));
    if (!a || !d || !dl || !tok) {
        free(a), free(d), free(dl), free(tok);
        return sh_err(SH_ENOMEM, "model: out of memory for activations of batch %d", B);
    }
    free(m->acts), free(m->dacts), free(m->dlogits), free(m->tokens);
    m->acts = a, m->dacts = d, m->dlogits = dl, m->tokens = tok;
    size_t off = 0;
    for (int i = 0; i < A_COUNT; i++) {
        m->a[i] = a + off;
        m->da[i] = d + off;
        off += s[i];
    }
    m->cap_b = B;
    return 0;
}

int nn_forward(nn_model *m, const int *tokens, int B, int T, const float **logits)
{
    const nn_config *c = &m->cfg;
    if (B < 1 || T < 1 || T > c->ctx)
        return sh_err(SH_EINVAL, "forward: batch %d x %d tokens (context is %d)", B, T, c->ctx);
    for (int i = 0; i < B * T; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return sh_err(SH_EINVAL, "forward: token %d at %d not in vocabulary 0..%d",
                          tokens[i], i, c->vocab - 1);
    SH_TRY(ensure_acts(m, B));
    m->B = B, m->T = T;
    memcpy(m->tokens, tokens, sizeof(int) * B * T);
    int C = c->width, NH = c->heads, V = c->vocab, N = B * T;
    size_t NC = (size_t)N * C, NTT = (size_t)B * NH * T * T;
    float **a = m->a, **p = m->ptr;
    nn__encoder_forward(a[A_ENC], tokens, p[P_WTE], p[P_WPE], B, T, C);
    const float *res = a[A_ENC];
    for (int l = 0; l < c->layers; l++) {
        size_t lc = (size_t)l * C, lcc = lc * C;
        float *ln1 = a[A_LN1] + l * NC, *qkv = a[A_QKV] + l * NC * 3, *atty = a[A_ATTY] + l * NC;
        float *res2 = a[A_RES2] + l * NC, *ln2 = a[A_LN2] + l * NC, *fch = a[A_FCH] + l * NC * 4;
        float *fchg = a[A_FCHG] + l * NC * 4, *fcproj = a[A_FCPROJ] + l * NC;
        float *attproj = a[A_ATTPROJ] + l * NC, *res3 = a[A_RES3] + l * NC;
        nn__layernorm_forward(ln1, a[A_LN1M] + (size_t)l * N, a[A_LN1R] + (size_t)l * N, res,
                              p[P_LN1W] + lc, p[P_LN1B] + lc, N, C);
        linear(m, qkv, ln1, p[P_QKVW] + 3 * lcc, p[P_QKVB] + 3 * lc, N, C, 3 * C);
        nn__attention_forward(atty, a[A_PRE] + l * NTT, a[A_ATT] + l * NTT, qkv, B, T, C, NH);
        linear(m, attproj, atty, p[P_ATTPROJW] + lcc, p[P_ATTPROJB] + lc, N, C, C);
        nn__residual_forward(res2, res, attproj, (int)NC);
        nn__layernorm_forward(ln2, a[A_LN2M] + (size_t)l * N, a[A_LN2R] + (size_t)l * N, res2,
                              p[P_LN2W] + lc, p[P_LN2B] + lc, N, C);
        linear(m, fch, ln2, p[P_FCW] + 4 * lcc, p[P_FCB] + 4 * lc, N, C, 4 * C);
        nn__gelu_forward(fchg, fch, (int)NC * 4);
        linear(m, fcproj, fchg, p[P_FCPROJW] + 4 * lcc, p[P_FCPROJB] + lc, N, 4 * C, C);
        nn__residual_forward(res3, res2, fcproj, (int)NC);
        res = res3;
    }
    nn__layernorm_forward(a[A_LNF], a[A_LNFM], a[A_LNFR], res, p[P_LNFW], p[P_LNFB], N, C);
    linear(m, a[A_LOGITS], a[A_LNF], p[P_HEAD], NULL, N, C, V);
    *logits = a[A_LOGITS];
    return 0;
}

struct nn_kv {
    int rows, ctx, C, L;
    int *len;       /* tokens fed per row */
    float *k, *v;   /* (L, rows, ctx, C) each */
    /* Scratch for up to `rows` new tokens. */
    float *x, *ln, *qkv, *atty, *proj, *res, *fch, *fchg, *mean, *rstd, *att, *logits;
};

int nn_kv_new(const nn_model *m, int rows, nn_kv **out)
{
    const nn_config *c = &m->cfg;
    if (rows < 1) return sh_err(SH_EINVAL, "kv cache: %d rows", rows);
    nn_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return sh_err(SH_ENOMEM, "kv cache: out of memory");
    size_t R = (size_t)rows, C = c->width, cache = (size_t)c->layers * R * c->ctx * C;
    kv->rows = rows, kv->ctx = c->ctx, kv->C = c->width, kv->L = c->layers;
    kv->len = calloc(R, sizeof(int));
    kv->k = malloc(cache * sizeof(float));
    kv->v = malloc(cache * sizeof(float));
    /* One block for the scratch: x, ln, atty, proj, res (C each), qkv (3C),
     * fch, fchg (4C each), mean, rstd (1 each), logits (V), att (ctx). */
    size_t per = 5 * C + 3 * C + 8 * C + 2 + c->vocab;
    float *s = malloc((R * per + c->ctx) * sizeof(float));
    if (!kv->len || !kv->k || !kv->v || !s) {
        free(s);
        nn_kv_free(kv);
        return sh_err(SH_ENOMEM, "kv cache: out of memory for %d rows", rows);
    }
    float **bufs[] = {&kv->x, &kv->ln, &kv->atty, &kv->proj, &kv->res, &kv->qkv,
                      &kv->fch, &kv->fchg, &kv->mean, &kv->rstd, &kv->logits, &kv->att};
    size_t sizes[] = {C, C, C, C, C, 3 * C, 4 * C, 4 * C, 1, 1, c->vocab, 0};
    for (int i = 0; i < 12; i++) {
        *bufs[i] = s;
        s += i < 11 ? R * sizes[i] : 0;
    }
    *out = kv;
    return 0;
}

void nn_kv_free(nn_kv *kv)
{
    if (!kv) return;
    free(kv->x); /* the scratch block starts with x */
    free(kv->len), free(kv->k), free(kv->v), free(kv);
}

void nn_kv_reset(nn_kv *kv) { memset(kv->len, 0, sizeof(int) * kv->rows); }

/* Causal attention of n new queries against their rows' cached keys and
 * values (the new token's included), as nn__attention_forward does for one
 * position. */
static void kv_attend(nn_kv *kv, int l, const int *rows, int n, int NH)
{
    int C = kv->C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs), *a = kv->att;
    for (int i = 0; i < n; i++) {
        size_t base = (((size_t)l * kv->rows + rows[i]) * kv->ctx) * C;
        const float *K = kv->k + base, *Vv = kv->v + base;
        int T = kv->len[rows[i]] + 1;
        for (int h = 0; h < NH; h++) {
            const float *q = kv->qkv + (size_t)i * 3 * C + h * hs;
            float maxv = -INFINITY, sum = 0;
            for (int t = 0; t < T; t++) {
                float sc = 0;
                for (int j = 0; j < hs; j++) sc += q[j] * K[(size_t)t * C + h * hs + j];
                a[t] = sc * scale;
                if (a[t] > maxv) maxv = a[t];
            }
            for (int t = 0; t < T; t++) sum += a[t] = expf(a[t] - maxv);
            float *o = kv->atty + (size_t)i * C + h * hs;
            for (int j = 0; j < hs; j++) o[j] = 0;
            for (int t = 0; t < T; t++) {
                float w = a[t] / sum;
                for (int j = 0; j < hs; j++) o[j] += w * Vv[(size_t)t * C + h * hs + j];
            }
        }
    }
}

int nn_decode(nn_model *m, nn_kv *kv, const int *rows, const int *tokens, int n,
              const float **logits)
{
    const nn_config *c = &m->cfg;
    if (n < 1 || n > kv->rows || kv->C != c->width || kv->L != c->layers || kv->ctx != c->ctx)
        return sh_err(SH_EINVAL, "decode: %d tokens for a cache of %d rows (or another shape)",
                      n, kv->rows);
    for (int i = 0; i < n; i++) {
        if (rows[i] < 0 || rows[i] >= kv->rows)
            return sh_err(SH_EINVAL, "decode: row %d not in 0..%d", rows[i], kv->rows - 1);
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return sh_err(SH_EINVAL, "decode: token %d not in vocabulary 0..%d", tokens[i],
                          c->vocab - 1);
        if (kv->len[rows[i]] >= c->ctx)
            return sh_err(SH_EINVAL, "decode: row %d already holds the whole context of %d",
                          rows[i], c->ctx);
    }
    int C = c->width;
    float **p = m->ptr;
    for (int i = 0; i < n; i++) {
        const float *we = p[P_WTE] + (size_t)tokens[i] * C;
        const float *pe = p[P_WPE] + (size_t)kv->len[rows[i]] * C;
        for (int j = 0; j < C; j++) kv->x[(size_t)i * C + j] = we[j] + pe[j];
    }
    for (int l = 0; l < c->layers; l++) {
        size_t lc = (size_t)l * C, lcc = lc * C;
        nn__layernorm_forward(kv->ln, kv->mean, kv->rstd, kv->x, p[P_LN1W] + lc, p[P_LN1B] + lc,
                              n, C);
        linear(m, kv->qkv, kv->ln, p[P_QKVW] + 3 * lcc, p[P_QKVB] + 3 * lc, n, C, 3 * C);
        for (int i = 0; i < n; i++) { /* append this token's key and value */
            size_t at = (((size_t)l * kv->rows + rows[i]) * kv->ctx + kv->len[rows[i]]) * C;
            memcpy(kv->k + at, kv->qkv + (size_t)i * 3 * C + C, sizeof(float) * C);
            memcpy(kv->v + at, kv->qkv + (size_t)i * 3 * C + 2 * C, sizeof(float) * C);
        }
        kv_attend(kv, l, rows, n, c->heads);
        linear(m, kv->proj, kv->atty, p[P_ATTPROJW] + lcc, p[P_ATTPROJB] + lc, n, C, C);
        nn__residual_forward(kv->res, kv->x, kv->proj, n * C);
        nn__layernorm_forward(kv->ln, kv->mean, kv->rstd, kv->res, p[P_LN2W] + lc,
                              p[P_LN2B] + lc, n, C);
        linear(m, kv->fch, kv->ln, p[P_FCW] + 4 * lcc, p[P_FCB] + 4 * lc, n, C, 4 * C);
        nn__gelu_forward(kv->fchg, kv->fch, n * 4 * C);
        linear(m, kv->proj, kv->fchg, p[P_FCPROJW] + 4 * lcc, p[P_FCPROJB] + lc, n,
                           4 * C, C);
        nn__residual_forward(kv->x, kv->res, kv->proj, n * C);
    }
    for (int i = 0; i < n; i++) kv->len[rows[i]]++;
    nn__layernorm_forward(kv->ln, kv->mean, kv->rstd, kv->x, p[P_LNFW], p[P_LNFB], n, C);
    linear(m, kv->logits, kv->ln, p[P_HEAD], NULL, n, C, c->vocab);
    *logits = kv->logits;
    return 0;
}

int nn_backward(nn_model *m, const float *dlogits)
{
    if (!m->B) return sh_err(SH_EINVAL, "backward: no forward pass to differentiate");
    const nn_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->width, NH = c->heads, V = c->vocab, N = B * T;
    int ref = m->reference;
    size_t NC = (size_t)N * C, NTT = (size_t)B * NH * T * T;
    float **a = m->a, **d = m->da, **p = m->ptr, **g = m->gptr;
    size_t s[A_COUNT], total = 0;
    act_sizes(&m->cfg, (size_t)m->cap_b, s);
    for (int i = 0; i < A_COUNT; i++) total += s[i];
    memset(m->dacts, 0, total * sizeof(float));
    memcpy(d[A_LOGITS], dlogits, sizeof(float) * N * V);
    nn__matmul_backward(d[A_LNF], g[P_HEAD], NULL, d[A_LOGITS], a[A_LNF], p[P_HEAD], N, C, V, ref);
    const float *res = c->layers ? a[A_RES3] + (size_t)(c->layers - 1) * NC : a[A_ENC];
    float *dres = d[A_RES3] + (size_t)(c->layers - 1) * NC;
    nn__layernorm_backward(dres, g[P_LNFW], g[P_LNFB], d[A_LNF], res, p[P_LNFW], a[A_LNFM],
                           a[A_LNFR], N, C);
    for (int l = c->layers - 1; l >= 0; l--) {
        size_t lc = (size_t)l * C, lcc = lc * C;
        const float *resin = l ? a[A_RES3] + (l - 1) * NC : a[A_ENC];
        float *dresin = l ? d[A_RES3] + (l - 1) * NC : d[A_ENC];
        float *dres3 = d[A_RES3] + l * NC, *dres2 = d[A_RES2] + l * NC;
        nn__residual_backward(dres2, d[A_FCPROJ] + l * NC, dres3, (int)NC);
        nn__matmul_backward(d[A_FCHG] + l * NC * 4, g[P_FCPROJW] + 4 * lcc, g[P_FCPROJB] + lc,
                            d[A_FCPROJ] + l * NC, a[A_FCHG] + l * NC * 4, p[P_FCPROJW] + 4 * lcc,
                            N, 4 * C, C, ref);
        nn__gelu_backward(d[A_FCH] + l * NC * 4, a[A_FCH] + l * NC * 4, d[A_FCHG] + l * NC * 4,
                          (int)NC * 4);
        nn__matmul_backward(d[A_LN2] + l * NC, g[P_FCW] + 4 * lcc, g[P_FCB] + 4 * lc,
                            d[A_FCH] + l * NC * 4, a[A_LN2] + l * NC, p[P_FCW] + 4 * lcc, N, C,
                            4 * C, ref);
        nn__layernorm_backward(dres2, g[P_LN2W] + lc, g[P_LN2B] + lc, d[A_LN2] + l * NC,
                               a[A_RES2] + l * NC, p[P_LN2W] + lc, a[A_LN2M] + (size_t)l * N,
                               a[A_LN2R] + (size_t)l * N, N, C);
        nn__residual_backward(dresin, d[A_ATTPROJ] + l * NC, dres2, (int)NC);
        nn__matmul_backward(d[A_ATTY] + l * NC, g[P_ATTPROJW] + lcc, g[P_ATTPROJB] + lc,
                            d[A_ATTPROJ] + l * NC, a[A_ATTY] + l * NC, p[P_ATTPROJW] + lcc, N, C,
                            C, ref);
        nn__attention_backward(d[A_QKV] + l * NC * 3, d[A_PRE] + l * NTT, d[A_ATT] + l * NTT,
                               d[A_ATTY] + l * NC, a[A_QKV] + l * NC * 3, a[A_ATT] + l * NTT, B,
                               T, C, NH);
        nn__matmul_backward(d[A_LN1] + l * NC, g[P_QKVW] + 3 * lcc, g[P_QKVB] + 3 * lc,
                            d[A_QKV] + l * NC * 3, a[A_LN1] + l * NC, p[P_QKVW] + 3 * lcc, N, C,
                            3 * C, ref);
        nn__layernorm_backward(dresin, g[P_LN1W] + lc, g[P_LN1B] + lc, d[A_LN1] + l * NC, resin,
                               p[P_LN1W] + lc, a[A_LN1M] + (size_t)l * N,
                               a[A_LN1R] + (size_t)l * N, N, C);
    }
    nn__encoder_backward(g[P_WTE], g[P_WPE], d[A_ENC], m->tokens, B, T, C);
    return 0;
}

void nn_zero_grad(nn_model *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

void nn_log_softmax(const float *logits, int V, float temperature, float *out)
{
    float maxv = -INFINITY;
    for (int i = 0; i < V; i++)
        if (logits[i] / temperature > maxv) maxv = logits[i] / temperature;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp(logits[i] / temperature - maxv);
    float lse = maxv + (float)log(sum);
    for (int i = 0; i < V; i++) out[i] = logits[i] / temperature - lse;
}

int nn_xent(nn_model *m, const int *targets, const uint8_t *mask, float *loss,
            const float **dlogits)
{
    if (!m->B) return sh_err(SH_EINVAL, "xent: no forward pass");
    int N = m->B * m->T, V = m->cfg.vocab, count = 0;
    for (int i = 0; i < N; i++) count += mask[i] != 0;
    memset(m->dlogits, 0, sizeof(float) * N * V);
    double total = 0;
    float *lp = malloc(sizeof(float) * V);
    if (!lp) return sh_err(SH_ENOMEM, "xent: out of memory");
    for (int i = 0; i < N && count; i++) {
        if (!mask[i]) continue;
        if (targets[i] < 0 || targets[i] >= V) {
            free(lp);
            return sh_err(SH_EINVAL, "xent: target %d at %d not in vocabulary", targets[i], i);
        }
        nn_log_softmax(m->a[A_LOGITS] + (size_t)i * V, V, 1.0f, lp);
        total -= lp[targets[i]];
        float *d = m->dlogits + (size_t)i * V;
        for (int v = 0; v < V; v++) d[v] = expf(lp[v]) / count;
        d[targets[i]] -= 1.0f / count;
    }
    free(lp);
    *loss = count ? (float)(total / count) : 0.0f;
    *dlogits = m->dlogits;
    return 0;
}

double nn_grad_norm(const nn_model *m)
{
    double s = 0;
    for (size_t i = 0; i < m->nparams; i++) s += (double)m->grads[i] * m->grads[i];
    return sqrt(s);
}

int nn_adamw_init(nn_adamw *o, const nn_model *m, float lr)
{
    *o = (nn_adamw){.lr = lr, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.0f,
                    .clip = 1.0f};
    o->m = calloc(m->nparams, sizeof(float));
    o->v = calloc(m->nparams, sizeof(float));
    if (!o->m || !o->v) {
        nn_adamw_free(o);
        return sh_err(SH_ENOMEM, "adamw: out of memory");
    }
    return 0;
}

int nn_adamw_step(nn_adamw *o, nn_model *m, double *gnorm)
{
    double norm = nn_grad_norm(m);
    if (gnorm) *gnorm = norm;
    if (!isfinite(norm))
        return sh_err(SH_ERANGE, "adamw: gradient norm is %g; step skipped, weights kept", norm);
    float scale = (o->clip > 0 && norm > o->clip) ? (float)(o->clip / norm) : 1.0f;
    o->t++;
    float c1 = 1.0f - powf(o->beta1, (float)o->t), c2 = 1.0f - powf(o->beta2, (float)o->t);
    for (size_t i = 0; i < m->nparams; i++) {
        float g = m->grads[i] * scale;
        o->m[i] = o->beta1 * o->m[i] + (1 - o->beta1) * g;
        o->v[i] = o->beta2 * o->v[i] + (1 - o->beta2) * g * g;
        float mh = o->m[i] / c1, vh = o->v[i] / c2;
        m->params[i] -= o->lr * (mh / (sqrtf(vh) + o->eps) + o->weight_decay * m->params[i]);
    }
    return 0;
}

void nn_adamw_free(nn_adamw *o)
{
    if (!o) return;
    free(o->m);
    free(o->v);
    o->m = o->v = NULL;
}
