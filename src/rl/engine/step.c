/* The RL training step: advantages, the trainer's recomputation of pi_old
 * (the proximal policy), then one AdamW update per minibatch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/common.h"
#include "shoal/rl.h"

/* Forward over trajectories [a,b) padded to a common length; calls back with
 * the log-softmax of the row predicting each response token. */
typedef struct pass {
    nn_model *m;
    const rl_traj *tr;
    int a, b, T;
    float temperature;
    int *tok;
    float *lp;
} pass;

static int pass_forward(pass *p, const float **logits)
{
    p->T = 0;
    for (int i = p->a; i < p->b; i++)
        if (p->tr[i].len > p->T) p->T = p->tr[i].len;
    for (int i = p->a; i < p->b; i++)
        for (int j = 0; j < p->T; j++)
            p->tok[(i - p->a) * p->T + j] = j < p->tr[i].len ? p->tr[i].tokens[j] : RL_EOS;
    return nn_forward(p->m, p->tok, p->b - p->a, p->T, logits);
}

static int count_tokens(const rl_traj *tr, int a, int b)
{
    int n = 0;
    for (int i = a; i < b; i++) n += tr[i].len - tr[i].plen;
    return n;
}

/* Fills lold for all response tokens of all trajectories (in order). */
static int old_logps(rl_trainer *t, pass *p, int n, float *lold)
{
    int V = nn_cfg(t->model)->vocab, k = 0, mb = (n + t->minibatches - 1) / t->minibatches;
    for (p->a = 0; p->a < n; p->a += mb) {
        p->b = p->a + mb < n ? p->a + mb : n;
        const float *logits;
        SH_TRY(pass_forward(p, &logits));
        for (int i = p->a; i < p->b; i++)
            for (int j = p->tr[i].plen; j < p->tr[i].len; j++) {
                nn_log_softmax(logits + ((size_t)(i - p->a) * p->T + j - 1) * V, V,
                               t->temperature, p->lp);
                lold[k++] = p->lp[p->tr[i].tokens[j]];
            }
    }
    return 0;
}

/* One minibatch: loss, logits gradient, backward, AdamW. */
static int minibatch(rl_trainer *t, pass *p, const float *adv, const float *lold, int k0,
                     rl_tok_in *in, float *coef, float *dlog, rl_step_stats *st)
{
    int V = nn_cfg(t->model)->vocab, n = 0;
    const float *logits;
    SH_TRY(pass_forward(p, &logits));
    for (int i = p->a; i < p->b; i++)
        for (int j = p->tr[i].plen; j < p->tr[i].len; j++, n++) {
            nn_log_softmax(logits + ((size_t)(i - p->a) * p->T + j - 1) * V, V, t->temperature,
                           p->lp);
            in[n] = (rl_tok_in){.logp = p->lp[p->tr[i].tokens[j]], .lold = lold[k0 + n],
                                .lmu = p->tr[i].blogp[j], .adv = adv[i], .seq = i - p->a};
        }
    rl_loss_stats ls;
    double loss = rl_loss(&t->loss, in, n, p->b - p->a, coef, &ls);
    st->loss += loss / t->minibatches;
    st->clipped_frac += ls.clipped;
    st->masked_frac += ls.masked;
    if (!isfinite(loss))
        return sh_err(SH_ERANGE, "train step: loss is %g; step skipped, weights kept", loss);
    /* dLoss/dlogits_v = coef * (onehot_v - p_v) / temperature at each row
     * that predicts a response token; zero elsewhere. */
    memset(dlog, 0, sizeof(float) * (size_t)(p->b - p->a) * p->T * V);
    n = 0;
    for (int i = p->a; i < p->b; i++)
        for (int j = p->tr[i].plen; j < p->tr[i].len; j++, n++) {
            const float *row = logits + ((size_t)(i - p->a) * p->T + j - 1) * V;
            float *d = dlog + ((size_t)(i - p->a) * p->T + j - 1) * V;
            nn_log_softmax(row, V, t->temperature, p->lp);
            for (int v = 0; v < V; v++) d[v] = -coef[n] * expf(p->lp[v]) / t->temperature;
            d[p->tr[i].tokens[j]] += coef[n] / t->temperature;
        }
    nn_zero_grad(t->model);
    SH_TRY(nn_backward(t->model, dlog));
    if (t->grad_hook) SH_TRY(t->grad_hook(t->grad_ctx, t->model));
    double gn;
    int rc = nn_adamw_step(&t->opt, t->model, &gn);
    if (gn > st->grad_norm || !isfinite(gn)) st->grad_norm = gn;
    return rc;
}

int rl_train_step(rl_trainer *t, const rl_traj *tr, int n, rl_step_stats *st)
{
    memset(st, 0, sizeof *st);
    if (n < 1) return sh_err(SH_EINVAL, "train step: no trajectories");
    if (t->minibatches < 1 || t->minibatches > n)
        return sh_err(SH_EINVAL, "train step: %d minibatches for %d trajectories", t->minibatches, n);
    int V = nn_cfg(t->model)->vocab, ntok = count_tokens(tr, 0, n), mb = (n + t->minibatches - 1) / t->minibatches;
    int maxT = 0;
    for (int i = 0; i < n; i++) maxT = tr[i].len > maxT ? tr[i].len : maxT;
    float *adv = malloc(sizeof(float) * n), *lold = malloc(sizeof(float) * (ntok + 1));
    float *coef = malloc(sizeof(float) * (ntok + 1)), *dlog = malloc(sizeof(float) * (size_t)mb * maxT * V);
    rl_tok_in *in = malloc(sizeof(rl_tok_in) * (ntok + 1));
    pass p = {.m = t->model, .tr = tr, .temperature = t->temperature,
              .tok = malloc(sizeof(int) * (size_t)mb * maxT), .lp = malloc(sizeof(float) * V)};
    int rc = 0;
    if (!adv || !lold || !coef || !dlog || !in || !p.tok || !p.lp)
        rc = sh_err(SH_ENOMEM, "train step: out of memory");
    /* Snapshot for a skipped step: the last good weights and moments. */
    size_t np = nn_num_params(t->model);
    float *keep = malloc(sizeof(float) * np * 3);
    if (!keep) rc = sh_err(SH_ENOMEM, "train step: out of memory");
    if (!rc) {
        memcpy(keep, nn_params(t->model), sizeof(float) * np);
        memcpy(keep + np, t->opt.m, sizeof(float) * np);
        memcpy(keep + 2 * np, t->opt.v, sizeof(float) * np);
    }
    int64_t keep_t = t->opt.t;
    if (!rc) {
        rl_grpo_advantages(tr, n, adv);
        rc = old_logps(t, &p, n, lold);
    }
    st->tokens = ntok;
    int k = 0;
    for (int i = 0; i < n && !rc; i++) {
        st->reward += tr[i].reward / n;
        for (int j = tr[i].plen; j < tr[i].len; j++, k++) {
            double d = (double)lold[k] - tr[i].blogp[j], r = exp(d);
            st->abs_dlogp += fabs(d) / ntok;
            st->kl += (r - 1 - d) / ntok;
        }
    }
    int k0 = 0;
    for (p.a = 0; p.a < n && !rc; p.a += mb) {
        p.b = p.a + mb < n ? p.a + mb : n;
        rc = minibatch(t, &p, adv, lold, k0, in, coef, dlog, st);
        k0 += count_tokens(tr, p.a, p.b);
    }
    if (rc == SH_ERANGE && keep) {
        st->skipped = 1;
        memcpy(nn_params(t->model), keep, sizeof(float) * np);
        memcpy(t->opt.m, keep + np, sizeof(float) * np);
        memcpy(t->opt.v, keep + 2 * np, sizeof(float) * np);
        t->opt.t = keep_t;
    }
    free(keep);
    st->clipped_frac /= ntok ? ntok : 1;
    st->masked_frac /= ntok ? ntok : 1;
    free(adv), free(lold), free(coef), free(dlog), free(in), free(p.tok), free(p.lp);
    return rc;
}
