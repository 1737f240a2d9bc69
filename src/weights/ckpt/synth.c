/* Synthetic checkpoints for tests and benchmarks: a Llama-shaped bf16 model
 * (ckpt_synth) and an optimiser step on it (ckpt_step).  Both stream chunk by
 * chunk and are reproducible from their seed: every chunk draws from its own
 * generator, seeded by (seed, tensor, chunk). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "weights/ckpt/ckpt_int.h"

typedef struct {
    uint64_t d, L, f, V; /* hidden, layers, MLP width, vocabulary */
} ckpt__cfg;

static uint64_t ckpt__layer_params(uint64_t d, uint64_t f) { return 4 * d * d + 3 * d * f + 2 * d; }

/* The widest model whose layers take at most 85% of params, one layer per 64
 * of width (the usual aspect ratio), the vocabulary filling the rest. */
static void ckpt__config(uint64_t params, ckpt__cfg *c)
{
    c->d = 16, c->L = 1, c->f = 48;
    for (uint64_t d = 16;; d += 16) {
        uint64_t L = d / 64 ? d / 64 : 1, f = (8 * d / 3 + 15) / 16 * 16;
        if (L * ckpt__layer_params(d, f) + d > params * 85 / 100) break;
        c->d = d, c->L = L, c->f = f;
    }
    uint64_t body = c->L * ckpt__layer_params(c->d, c->f) + c->d;
    c->V = params > body + 32 * c->d ? (params - body) / (2 * c->d) : 16;
}

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[2];
    float mean, sd;
} ckpt__spec;

static size_t ckpt__specs(const ckpt__cfg *c, ckpt__spec **out)
{
    size_t n = 0, cap = 3 + 9 * c->L;
    ckpt__spec *s = calloc(cap, sizeof *s);
    if (!s) return 0;
    float sd = 0.02f, sd_out = 0.02f / sqrtf(2.0f * (float)c->L);
#define ADD(nm, nd, a, b, mu, sg)                                                                  \
    do {                                                                                           \
        snprintf(s[n].name, sizeof s[n].name, "%s", nm);                                           \
        s[n].ndim = nd, s[n].shape[0] = (int64_t)(a), s[n].shape[1] = (int64_t)(b);                \
        s[n].mean = mu, s[n].sd = sg;                                                              \
        n++;                                                                                       \
    } while (0)
    ADD("model.embed_tokens.weight", 2, c->V, c->d, 0, sd);
    for (uint64_t l = 0; l < c->L; l++) {
        char p[96], nm[128];
        snprintf(p, sizeof p, "model.layers.%llu.", (unsigned long long)l);
        static const char *attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        snprintf(nm, sizeof nm, "%sinput_layernorm.weight", p);
        ADD(nm, 1, c->d, 0, 1.0f, 0.05f);
        for (int k = 0; k < 4; k++) {
            snprintf(nm, sizeof nm, "%sself_attn.%s.weight", p, attn[k]);
            ADD(nm, 2, c->d, c->d, 0, k == 3 ? sd_out : sd);
        }
        snprintf(nm, sizeof nm, "%spost_attention_layernorm.weight", p);
        ADD(nm, 1, c->d, 0, 1.0f, 0.05f);
        snprintf(nm, sizeof nm, "%smlp.gate_proj.weight", p);
        ADD(nm, 2, c->f, c->d, 0, sd);
        snprintf(nm, sizeof nm, "%smlp.up_proj.weight", p);
        ADD(nm, 2, c->f, c->d, 0, sd);
        snprintf(nm, sizeof nm, "%smlp.down_proj.weight", p);
        ADD(nm, 2, c->d, c->f, 0, sd_out);
    }
    ADD("model.norm.weight", 1, c->d, 0, 1.0f, 0.05f);
    ADD("lm_head.weight", 2, c->V, c->d, 0, sd);
#undef ADD
    *out = s;
    return n;
}

/* Fills every tensor of w chunk by chunk, calling fill(ctx, tensor, chunk,
 * element offset, count, out) for the bf16 values. */
typedef int (*ckpt__fill_fn)(void *ctx, size_t t, uint64_t chunk, uint64_t first, size_t n,
                             uint16_t *out);

/* Fills every tensor of w chunk by chunk; pg (optional) advances in bytes. */
static int ckpt__fill_all(ckpt_writer *w, ckpt__fill_fn fill, void *ctx, sh_progress *pg)
{
    uint16_t *buf = malloc(CKPT_CHUNK);
    if (!buf) return sh_err(SH_ENOMEM, "out of memory");
    int rc = SH_OK;
    uint64_t done = 0;
    if (pg && !pg->total)
        for (size_t i = 0; i < ckpt_writer_count(w); i++) pg->total += ckpt_writer_tensor(w, i)->nbytes;
    for (size_t i = 0; i < ckpt_writer_count(w) && rc == SH_OK; i++) {
        const ckpt_tensor *t = ckpt_writer_tensor(w, i);
        for (uint64_t off = 0, k = 0; off < t->nbytes && rc == SH_OK; off += CKPT_CHUNK, k++) {
            size_t nb = t->nbytes - off < CKPT_CHUNK ? (size_t)(t->nbytes - off) : CKPT_CHUNK;
            rc = fill(ctx, i, k, off / 2, nb / 2, buf);
            if (rc == SH_OK) rc = ckpt_writer_put(w, i, off, buf, nb);
            if (pg) sh_progress_update(pg, done += nb);
        }
    }
    free(buf);
    return rc;
}

typedef struct {
    const ckpt__spec *spec; /* in writer order */
    uint64_t seed;
} ckpt__synth_ctx;

static int ckpt__synth_fill(void *arg, size_t t, uint64_t chunk, uint64_t first, size_t n,
                            uint16_t *out)
{
    ckpt__synth_ctx *c = arg;
    uint64_t s = ckpt__seed(c->seed, t, chunk);
    float mu = c->spec[t].mean, sd = c->spec[t].sd;
    for (size_t i = 0; i < n; i++) out[i] = ckpt_f32_to_bf16(mu + sd * ckpt__normal(&s));
    return SH_OK;
}

int ckpt_synth_progress(const char *path, uint64_t params, uint64_t seed, sh_progress *pg)
{
    ckpt__cfg cfg;
    ckpt__config(params, &cfg);
    ckpt__spec *spec;
    size_t n = ckpt__specs(&cfg, &spec);
    if (!n) return sh_err(SH_ENOMEM, "out of memory");
    ckpt_tensor *t = calloc(n, sizeof *t);
    if (!t) {
        free(spec);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        t[i].name = spec[i].name;
        t[i].dtype = CKPT_BF16;
        t[i].ndim = spec[i].ndim;
        t[i].shape[0] = spec[i].shape[0];
        t[i].shape[1] = spec[i].shape[1];
    }
    json_t *meta = json_pack("{s:s}", "format", "pt");
    ckpt_writer *w;
    int rc = ckpt_writer_open(path, t, n, meta, 0, &w);
    json_decref(meta);
    free(t);
    if (rc == SH_OK) {
        /* Reorder the value specs to the writer's (reference) layout. */
        ckpt__spec *ord = calloc(n, sizeof *ord);
        for (size_t i = 0; ord && i < n; i++)
            for (size_t k = 0; k < n; k++)
                if (!strcmp(spec[k].name, ckpt_writer_tensor(w, i)->name)) ord[i] = spec[k];
        ckpt__synth_ctx ctx = {ord, seed};
        rc = ord ? ckpt__fill_all(w, ckpt__synth_fill, &ctx, pg) : sh_err(SH_ENOMEM, "out of memory");
        free(ord);
        if (rc == SH_OK) rc = ckpt_writer_commit(w);
        else ckpt_writer_abort(w);
    }
    free(spec);
    return rc;
}

int ckpt_synth(const char *path, uint64_t params, uint64_t seed)
{
    return ckpt_synth_progress(path, params, seed, NULL);
}

float ckpt__half_gap_bf16(uint16_t h)
{
    uint16_t m = h & 0x7fff;
    if (m >= 0x7f7f) return 0; /* largest finite, inf, NaN: keep as is */
    float v = ckpt_bf16_to_f32(m), up = ckpt_bf16_to_f32((uint16_t)(m + 1)) - v;
    float down = m ? v - ckpt_bf16_to_f32((uint16_t)(m - 1)) : up;
    return 0.5f * (up < down ? up : down);
}

float ckpt__half_gap_e4m3(uint8_t q)
{
    uint8_t m = q & 0x7f;
    if (m >= 0x7e) return 0; /* 448 (the largest) and NaN */
    float v = ckpt_e4m3_to_f32(m), up = ckpt_e4m3_to_f32((uint8_t)(m + 1)) - v;
    float down = m ? v - ckpt_e4m3_to_f32((uint8_t)(m - 1)) : up;
    return 0.5f * (up < down ? up : down);
}

float ckpt__adamw(float w, uint64_t *s, float lr, float wd, uint64_t steps)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float m_sd = sqrtf((1 - b1) / (1 + b1));
    /* Moments in their steady state under unit-variance noisy gradients, as
     * deep into training (no bias correction left). */
    float m = m_sd * ckpt__normal(s), v = 1.0f;
    for (uint64_t k = 0; k < steps; k++) {
        float g = ckpt__normal(s);
        m = b1 * m + (1 - b1) * g;
        v = b2 * v + (1 - b2) * g * g;
        w -= lr * m / (sqrtf(v) + eps);
        if (wd != 0) w -= lr * wd * w; /* decoupled weight decay */
    }
    return w;
}

typedef struct {
    const ckpt *in;
    ckpt_writer *w;
    double lr;
    uint64_t steps, seed;
} ckpt__step_ctx;

static int ckpt__step_fill(void *arg, size_t t, uint64_t chunk, uint64_t first, size_t n,
                           uint16_t *out)
{
    ckpt__step_ctx *c = arg;
    const ckpt_tensor *src = ckpt_find(c->in, ckpt_writer_tensor(c->w, t)->name);
    uint64_t s = ckpt__seed(c->seed, t, chunk);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src->data + 2 * (first + i), 2);
        float u = (float)(ckpt__mix(&s) >> 40) * (1.0f / 16777216.0f) - 0.5f; /* (-0.5, 0.5) */
        float w = ckpt_bf16_to_f32(h) + 1.98f * u * ckpt__half_gap_bf16(h);
        w = ckpt__adamw(w, &s, (float)c->lr, 0, c->steps);
        out[i] = ckpt_f32_to_bf16(w);
    }
    return SH_OK;
}

int ckpt_step_progress(const char *in, const char *out, double lr, uint64_t steps, uint64_t seed,
                       sh_progress *pg)
{
    ckpt *c;
    SH_TRY(ckpt_open(in, &c));
    int rc = SH_OK;
    if (c->is_folder || c->nfiles != 1)
        rc = sh_err(SH_EINVAL, "%s: ckpt step takes a single .safetensors file", in);
    for (size_t i = 0; rc == SH_OK && i < c->ntensors; i++)
        if (c->tensors[i].dtype != CKPT_BF16)
            rc = sh_err(SH_EINVAL, "%s: tensor \"%s\" is %s; ckpt step needs bf16 tensors", in,
                        c->tensors[i].name, ckpt_dtype_name(c->tensors[i].dtype));
    ckpt_writer *w = NULL;
    /* The same header image: the step changes values, not the layout. */
    if (rc == SH_OK) rc = ckpt_writer_open_raw(out, c->files[0].map, c->files[0].header_len, &w);
    if (rc == SH_OK) {
        ckpt__step_ctx ctx = {c, w, lr, steps, seed};
        rc = ckpt__fill_all(w, ckpt__step_fill, &ctx, pg);
        if (rc == SH_OK) rc = ckpt_writer_commit(w);
        else ckpt_writer_abort(w);
    }
    ckpt_close(c);
    return rc;
}

int ckpt_step(const char *in, const char *out, double lr, uint64_t steps, uint64_t seed)
{
    return ckpt_step_progress(in, out, lr, steps, seed, NULL);
}
