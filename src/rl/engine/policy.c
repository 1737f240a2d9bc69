/* Sampling, evaluation, the supervised warm start and the RL training step.
 * Pure: randomness is a caller-held state, versions come from a hook. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/common.h"
#include "shoal/rl.h"

static double unif(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return ((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

/* Samples a token from one row of logits; returns it and its log-prob under
 * the distribution actually sampled from (temperature, then the top-p
 * nucleus renormalised).  temperature 0 is greedy (log-prob 0). */
static int sample_row(const float *logits, int V, const rl_sampling *s, uint64_t *rng,
                      float *lp, float *logp)
{
    if (s->temperature <= 0) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        *logp = 0;
        return best;
    }
    nn_log_softmax(logits, V, s->temperature, lp);
    int order[256];
    for (int v = 0; v < V; v++) order[v] = v;
    /* Insertion sort by probability: V is tiny. */
    for (int i = 1; i < V; i++)
        for (int j = i; j > 0 && lp[order[j]] > lp[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double mass = 0;
    int keep = 0;
    while (keep < V && (keep == 0 || mass < s->top_p)) mass += exp(lp[order[keep++]]);
    double u = unif(rng) * mass, acc = 0;
    int pick = order[keep - 1];
    for (int i = 0; i < keep; i++) {
        acc += exp(lp[order[i]]);
        if (u < acc) {
            pick = order[i];
            break;
        }
    }
    *logp = (float)(lp[pick] - log(mass));
    return pick;
}

static void start_traj(rl_traj *t, const rl_problem *p, int group)
{
    memset(t, 0, sizeof *t);
    t->tokens[0] = RL_BOS;
    int n = (int)strlen(p->prompt);
    for (int i = 0; i < n; i++) t->tokens[1 + i] = rl_tok(p->prompt[i]);
    t->len = t->plen = 1 + n;
    t->group = group;
    t->problem = p->id;
}

static void finish_traj(rl_traj *t, const rl_problem *p)
{
    char resp[RL_MAX_T];
    int n = 0, term = 0;
    for (int i = t->plen; i < t->len; i++) {
        if (t->tokens[i] == RL_EOS) {
            term = 1;
            break;
        }
        resp[n++] = rl_chr(t->tokens[i]);
    }
    t->reward = rl_reward(p, resp, n, term);
}

/* Samples one token for every active sequence from its row of logits. */
static void sample_step(rl_traj *out, const int *idx, int Ba, const float *logits, size_t stride,
                        const int *row_of, int V, int ctx, const rl_sampling *s, uint64_t *srng,
                        float *lp, int ver, uint8_t *done)
{
    for (int a = 0; a < Ba; a++) {
        rl_traj *t = &out[idx[a]];
        float logp;
        int k = sample_row(logits + (size_t)row_of[a] * stride, V, s, &srng[idx[a]], lp, &logp);
        t->tokens[t->len] = k;
        t->blogp[t->len] = logp;
        t->len++;
        t->vend = ver;
        if (k == RL_EOS || t->len >= ctx || t->len - t->plen >= s->max_new) done[idx[a]] = 1;
    }
}

/* The logits of the next token of every active sequence, without a cache:
 * a forward pass over the whole (right-padded) prefixes. */
static int logits_full(nn_model *m, const rl_traj *out, const int *idx, int Ba, int *tok,
                       int *row_of, const float **logits, size_t *stride)
{
    int T = 0, V = nn_cfg(m)->vocab;
    for (int a = 0; a < Ba; a++)
        if (out[idx[a]].len > T) T = out[idx[a]].len;
    /* Right-pad with EOS: causal attention keeps padding out of the
     * positions each sequence reads. */
    for (int a = 0; a < Ba; a++) {
        const rl_traj *t = &out[idx[a]];
        for (int j = 0; j < T; j++) tok[a * T + j] = j < t->len ? t->tokens[j] : RL_EOS;
        row_of[a] = a * T + t->len - 1;
    }
    *stride = (size_t)V;
    return nn_forward(m, tok, Ba, T, logits);
}

/* The same with the KV cache: the cache holds every token but the last of
 * each sequence; feed the last ones.  When the weights changed (a new
 * version from the hook), the cached keys and values are stale: the cache
 * is rebuilt from the prefixes with the new weights, as the no-cache path
 * would see them. */
static int logits_cached(nn_model *m, nn_kv *kv, int rebuild, const rl_traj *out, const int *idx,
                         int Ba, int *tok, int *row_of, const float **logits, size_t *stride)
{
    if (rebuild) {
        nn_kv_reset(kv);
        for (int j = 0;; j++) { /* position by position, every sequence that has it */
            int n = 0;
            for (int a = 0; a < Ba; a++)
                if (out[idx[a]].len - 1 > j) row_of[n] = idx[a], tok[n++] = out[idx[a]].tokens[j];
            if (!n) break;
            const float *unused;
            SH_TRY(nn_decode(m, kv, row_of, tok, n, &unused));
        }
    }
    for (int a = 0; a < Ba; a++) {
        tok[a] = out[idx[a]].tokens[out[idx[a]].len - 1];
        row_of[a] = idx[a];
    }
    SH_TRY(nn_decode(m, kv, row_of, tok, Ba, logits));
    for (int a = 0; a < Ba; a++) row_of[a] = a;
    *stride = (size_t)nn_cfg(m)->vocab;
    return 0;
}

/* The random stream of member j of group g: a function of the caller's
 * seed and (g, j) alone. */
static uint64_t seq_seed(uint64_t seed, int g, int j)
{
    uint64_t z = seed ^ ((uint64_t)(uint32_t)g << 20 | (uint32_t)j) * 0xd1b54a32d192ed03ULL;
    return (uint64_t)(unif(&z) * 9007199254740992.0) ^ z;
}

int rl_generate(nn_model *m, const rl_problem *probs, int n, int group, int group0,
                const rl_sampling *s, uint64_t *rng, int version, rl_step_hook hook,
                void *hook_ctx, rl_traj *out)
{
    int V = nn_cfg(m)->vocab, ctx = nn_cfg(m)->ctx, B = n * group;
    if (ctx > RL_MAX_T) ctx = RL_MAX_T;
    int *tok = malloc(sizeof(int) * B * ctx), *idx = malloc(sizeof(int) * B);
    int *row_of = malloc(sizeof(int) * B);
    float *lp = malloc(sizeof(float) * V);
    uint8_t *done = calloc(B, 1);
    uint64_t *srng = malloc(sizeof(uint64_t) * (B ? B : 1));
    nn_kv *kv = NULL;
    int rc = !s->no_kv_cache && B > 0 ? nn_kv_new(m, B, &kv) : 0;
    if (!rc && (!tok || !idx || !row_of || !lp || !done || !srng))
        rc = sh_err(SH_ENOMEM, "generate: out of memory for %d sequences", B);
    for (int i = 0; i < B && !rc; i++) {
        start_traj(&out[i], &probs[i / group], group0 + i / group);
        srng[i] = seq_seed(*rng, group0 + i / group, i % group);
    }
    int cached_ver = 0;
    for (int step = 0; step < s->max_new && !rc; step++) {
        int ver = hook ? hook(hook_ctx) : version;
        int Ba = 0;
        for (int i = 0; i < B; i++) {
            if (done[i]) continue;
            if (!step) out[i].vstart = ver;
            idx[Ba++] = i;
        }
        if (!Ba) break;
        const float *logits;
        size_t stride;
        if (kv)
            rc = logits_cached(m, kv, !step || ver != cached_ver, out, idx, Ba, tok, row_of,
                               &logits, &stride);
        else
            rc = logits_full(m, out, idx, Ba, tok, row_of, &logits, &stride);
        cached_ver = ver;
        if (!rc) sample_step(out, idx, Ba, logits, stride, row_of, V, ctx, s, srng, lp, ver, done);
    }
    for (int i = 0; i < B && !rc; i++) finish_traj(&out[i], &probs[i / group]);
    *rng = seq_seed(*rng, group0 + n, -1); /* the next call's seed */
    nn_kv_free(kv);
    free(tok), free(idx), free(row_of), free(lp), free(done), free(srng);
    return rc;
}

int rl_evaluate(nn_model *m, const rl_problem *probs, int n, const rl_sampling *s, int samples,
                uint64_t seed, double *reward)
{
    if (samples < 1) samples = 1;
    rl_traj *t = malloc(sizeof(rl_traj) * (n > 0 ? n : 1) * samples);
    if (!t) return sh_err(SH_ENOMEM, "evaluate: out of memory");
    uint64_t rng = seed;
    int rc = rl_generate(m, probs, n, samples, 0, s, &rng, 0, NULL, NULL, t);
    double sum = 0;
    for (int i = 0; i < n * samples && !rc; i++) sum += t[i].reward;
    *reward = n ? sum / (n * samples) : 0;
    free(t);
    return rc;
}

int rl_sft_step(nn_model *m, nn_adamw *opt, const rl_problem *p, int n, float *loss)
{
    int T = 0;
    for (int i = 0; i < n; i++) {
        int l = 1 + (int)strlen(p[i].prompt) + (int)strlen(p[i].answer) + 1;
        if (l > T) T = l;
    }
    if (T > nn_cfg(m)->ctx) return sh_err(SH_EINVAL, "sft: demonstration of %d tokens exceeds context", T);
    int *tok = calloc((size_t)n * T, sizeof(int)), *tgt = calloc((size_t)n * T, sizeof(int));
    uint8_t *mask = calloc((size_t)n * T, 1);
    int rc = 0;
    if (!tok || !tgt || !mask) rc = sh_err(SH_ENOMEM, "sft: out of memory");
    for (int i = 0; i < n && !rc; i++) {
        char seq[64];
        int pl = 1 + (int)strlen(p[i].prompt);
        snprintf(seq, sizeof seq, "^%s%s$", p[i].prompt, p[i].answer);
        int len = (int)strlen(seq);
        for (int j = 0; j < T; j++) tok[i * T + j] = j < len ? rl_tok(seq[j]) : RL_EOS;
        /* Position j predicts token j+1; train only on the response. */
        for (int j = pl - 1; j < len - 1; j++) {
            tgt[i * T + j] = tok[i * T + j + 1];
            mask[i * T + j] = 1;
        }
    }
    const float *logits, *dl;
    if (!rc) rc = nn_forward(m, tok, n, T, &logits);
    if (!rc) rc = nn_xent(m, tgt, mask, loss, &dl);
    if (!rc) {
        nn_zero_grad(m);
        rc = nn_backward(m, dl);
    }
    if (!rc) rc = nn_adamw_step(opt, m, NULL);
    free(tok), free(tgt), free(mask);
    return rc;
}
