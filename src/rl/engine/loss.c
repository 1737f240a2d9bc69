/* Policy-gradient losses with off-policy corrections, and GRPO advantages.
 *
 * Three policies meet here: mu, the behaviour policy that sampled a token
 * (possibly several versions old, possibly run in bf16 or FP8); pi_old, the
 * trainer's weights at the start of the step (AReaL's proximal policy,
 * recomputed by the trainer); and pi, the weights being optimised.  All
 * losses are token means; coef[i] is dLoss/dlog pi(token i), which the
 * trainer turns into logits gradients. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/common.h"
#include "shoal/rl.h"

static const char *const loss_names[RL_LOSS_COUNT] = {"pg", "ppo", "tis", "mis", "decoupled",
                                                      "naive"};

int rl_loss_parse(const char *name, int *loss)
{
    for (int i = 0; i < RL_LOSS_COUNT; i++)
        if (!strcmp(name, loss_names[i])) return *loss = i, 0;
    return sh_err(SH_EINVAL, "--loss \"%s\": expected pg, naive, ppo, tis, mis or decoupled", name);
}

const char *rl_loss_name(int loss)
{
    return loss >= 0 && loss < RL_LOSS_COUNT ? loss_names[loss] : "?";
}

rl_loss_cfg rl_loss_defaults(int kind)
{
    return (rl_loss_cfg){.kind = kind, .clip = 0.2f, .tis_cap = 2.0f, .mis_lo = 0.5f,
                         .mis_hi = 2.0f, .mis_seq = 0, .dec_cap = 0.0f};
}

/* The PPO clipped surrogate -min(r A, clip(r) A) for r = exp(logp - base),
 * scaled by w; adds its gradient w.r.t. logp to *coef and returns the loss.
 * *clipped is set when the clipped branch is active (zero gradient). */
static double ppo_term(float logp, float base, float adv, float eps, double w, float *coef,
                       int *clipped)
{
    double r = exp((double)logp - base);
    double rc = r < 1 - eps ? 1 - eps : r > 1 + eps ? 1 + eps : r;
    double un = r * adv, cl = rc * adv;
    if (cl < un) { /* the min picks the clipped term, whose gradient is 0 */
        *clipped = 1;
        *coef = 0;
        return -w * cl;
    }
    *clipped = 0;
    *coef = (float)(-w * adv * r);
    return -w * un;
}

/* Sequence-level MIS: 1 where the geometric mean of pi_old/mu over the
 * sequence lies in the band, per sequence (caller frees). */
static uint8_t *seq_keep(const rl_loss_cfg *c, const rl_tok_in *t, int n, int nseq)
{
    double *sum = calloc((size_t)nseq + 1, sizeof(double));
    int *cnt = calloc((size_t)nseq + 1, sizeof(int));
    uint8_t *keep = calloc((size_t)nseq + 1, 1);
    if (!sum || !cnt || !keep) {
        free(sum), free(cnt), free(keep);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        sum[t[i].seq] += (double)t[i].lold - t[i].lmu;
        cnt[t[i].seq]++;
    }
    for (int s = 0; s < nseq; s++) {
        double g = cnt[s] ? exp(sum[s] / cnt[s]) : 1.0;
        keep[s] = g >= c->mis_lo && g <= c->mis_hi;
    }
    free(sum), free(cnt);
    return keep;
}

/* Whether MIS keeps token k: its sequence's geometric mean (keep != NULL)
 * or its own ratio pi_old/mu lies in the band. */
static int mis_kept(const rl_loss_cfg *c, const uint8_t *keep, const rl_tok_in *k, double w_old)
{
    return keep ? keep[k->seq] : w_old >= c->mis_lo && w_old <= c->mis_hi;
}

double rl_loss(const rl_loss_cfg *c, const rl_tok_in *t, int n, int nseq, float *coef,
               rl_loss_stats *st)
{
    memset(st, 0, sizeof *st);
    st->tokens = n;
    if (n <= 0) return 0.0;
    uint8_t *keep = NULL;
    if (c->kind == RL_LOSS_MIS && c->mis_seq) {
        keep = seq_keep(c, t, n, nseq);
        if (!keep) return NAN; /* out of memory: the caller skips the step */
    }
    /* The mean runs over the tokens that take part: all of them, except
     * that MIS drops the masked ones from the denominator too (IcePop), so
     * that masking many tokens does not shrink the step of the rest. */
    int denom = n;
    if (c->kind == RL_LOSS_MIS) {
        denom = 0;
        for (int i = 0; i < n; i++) denom += mis_kept(c, keep, &t[i], exp((double)t[i].lold - t[i].lmu));
    }
    double total = 0;
    for (int i = 0; i < n; i++) {
        const rl_tok_in *k = &t[i];
        double w_old = exp((double)k->lold - k->lmu); /* pi_old / mu */
        int clipped = 0;
        double l = 0;
        switch (c->kind) {
        case RL_LOSS_PG: /* REINFORCE: ignores who sampled the token */
            l = -(double)k->adv * k->logp;
            coef[i] = -k->adv;
            break;
        case RL_LOSS_NAIVE: /* PPO on the trainer's weights as if they had sampled */
            l = ppo_term(k->logp, k->lold, k->adv, c->clip, 1.0, &coef[i], &clipped);
            break;
        case RL_LOSS_PPO: /* the behaviour policy serves as pi_old */
            l = ppo_term(k->logp, k->lmu, k->adv, c->clip, 1.0, &coef[i], &clipped);
            break;
        case RL_LOSS_TIS:
            l = ppo_term(k->logp, k->lold, k->adv, c->clip, fmin(w_old, c->tis_cap), &coef[i],
                         &clipped);
            break;
        case RL_LOSS_MIS: /* IcePop: masked outside the band, importance-weighted inside */
            if (!mis_kept(c, keep, k, w_old)) {
                st->masked++;
                coef[i] = 0;
                break;
            }
            l = ppo_term(k->logp, k->lold, k->adv, c->clip, w_old, &coef[i], &clipped);
            break;
        default: { /* decoupled: behaviour weight pi_prox/mu, optionally capped */
            double w = c->dec_cap > 0 ? fmin(w_old, c->dec_cap) : w_old;
            l = ppo_term(k->logp, k->lold, k->adv, c->clip, w, &coef[i], &clipped);
        }
        }
        st->clipped += clipped;
        total += l;
        coef[i] = denom ? coef[i] / denom : 0.0f;
    }
    free(keep);
    return denom ? total / denom : 0.0;
}

void rl_grpo_advantages(const rl_traj *tr, int n, float *adv)
{
    for (int i = 0; i < n;) {
        int j = i;
        double sum = 0, sq = 0;
        while (j < n && tr[j].group == tr[i].group) sum += tr[j++].reward;
        int g = j - i;
        double mean = sum / g;
        for (int k = i; k < j; k++) sq += (tr[k].reward - mean) * (tr[k].reward - mean);
        double sd = sqrt(sq / g);
        for (int k = i; k < j; k++)
            adv[k] = sd < 1e-9 ? 0.0f : (float)((tr[k].reward - mean) / (sd + 1e-6));
        i = j;
    }
}
