/* libFuzzer target: what the RL trainer takes from a rollout worker
 * (src/rl/engine/rl_wire.c, src/rl/engine/trajcheck.c).  The first 16 bytes are what the
 * trainer asked the worker for (first group, prompts, group size, the
 * request's min_version, the trainer's version, the run's seed); the rest
 * is the byte stream the worker sent, cut into frames by rl__msg_peek as
 * the trainer's event loop does, each frame checked as its type says
 * (HELLO, TRAJS, REFUSE, BYE).
 *
 * Besides crashes and undefined behaviour, a finding is a message that
 * passes the checks and still breaks what the trainer relies on: a
 * trajectory of a group it did not ask for, of another problem or prompt,
 * with a version outside the request's and the trainer's, a length the
 * model cannot take, a log-probability or reward that is not finite or not
 * the task's, or whose loss under any objective is not finite; a HELLO
 * whose name is not printable or whose speed or price is not finite. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rl/engine/wire_int.h"

#define CTX 24
#define MAX_NEW 8

static void check_accepted(const rl__ask *a, const rl_traj *t, int n)
{
    int vmin = a->min_version > 0 ? a->min_version : 0;
    for (int k = 0; k < n; k++) {
        const rl_traj *x = &t[k];
        const rl_problem *p = &a->probs[k / a->group];
        if (x->group != a->group0 + k / a->group || x->problem != p->id) abort();
        if (x->plen != 1 + (int)strlen(p->prompt) || x->len > a->max_len || x->plen >= x->len ||
            x->len - x->plen > a->max_new)
            abort();
        for (int j = 0; j < x->len; j++) {
            if (x->tokens[j] < 0 || x->tokens[j] >= rl_vocab()) abort();
            if (j > 0 && j < x->plen && x->tokens[j] != rl_tok(p->prompt[j - 1])) abort();
            if (j >= x->plen && !(x->blogp[j] <= RL_BLOGP_MAX && x->blogp[j] >= RL_BLOGP_MIN)) abort();
        }
        if (x->vstart < vmin || x->vstart > x->vend || x->vend > a->max_version) abort();
        if (!(x->reward >= 0 && x->reward <= 1)) abort();
    }
    /* What the loss makes of them, with the trainer's log-probabilities at
     * either end of their range: finite, whatever the objective. */
    float adv[64];
    rl_grpo_advantages(t, n, adv);
    static rl_tok_in in[64 * RL_MAX_T];
    static float coef[64 * RL_MAX_T];
    int m = 0;
    for (int k = 0; k < n; k++)
        for (int j = t[k].plen; j < t[k].len; j++)
            in[m++] = (rl_tok_in){.logp = (j & 1) ? 0 : RL_BLOGP_MIN, .lold = (j & 2) ? 0 : RL_BLOGP_MIN,
                                  .lmu = t[k].blogp[j], .adv = adv[k], .seq = k};
    for (int kind = 0; kind < RL_LOSS_COUNT; kind++) {
        rl_loss_cfg c = rl_loss_defaults(kind);
        rl_loss_stats st;
        if (!isfinite(rl_loss(&c, in, m, n, coef, &st))) abort();
        for (int i = 0; i < m; i++)
            if (!isfinite(coef[i])) abort();
    }
}

/* The request an input's first 16 bytes describe; probs: 4 entries. */
static rl__ask ask_of(const uint8_t *data, rl_problem *probs)
{
    int32_t minv, ver;
    uint32_t seed;
    memcpy(&minv, data + 4, 4);
    memcpy(&ver, data + 8, 4);
    memcpy(&seed, data + 12, 4);
    rl__ask a = {.group0 = data[0] | data[1] << 8, .nprompts = 1 + data[2] % 4, .group = 1 + data[3] % 16,
                 .min_version = minv % 1000, .max_version = ver % 1000, .probs = probs,
                 .max_len = CTX, .max_new = MAX_NEW};
    for (int k = 0; k < a.nprompts; k++) rl__group_problem(seed, seed & 1, a.group0 + k, &probs[k]);
    return a;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 16) return 0;
    rl_problem probs[4];
    rl__ask a = ask_of(data, probs);
    sh_buf in = {0};
    if (sh_buf_append(&in, data + 16, size - 16) < 0) return 0;
    rl_traj out[64];
    size_t off = 0;
    for (;;) {
        sh_buf view = {.data = in.data + off, .len = in.len - off, .cap = in.len - off};
        uint32_t type;
        const uint8_t *p;
        size_t len;
        long used = rl__msg_peek(&view, &type, &p, &len);
        if (used <= 0) break;
        if (used < (long)sizeof(rl_wire_hdr) || (size_t)used > view.len || p + len != view.data + used) abort();
        off += (size_t)used;
        if (type == RL_MSG_TRAJS) {
            if (rl__trajs_check(&a, "fuzz", p, len, out) == 0) check_accepted(&a, out, a.nprompts * a.group);
        } else if (type == RL_MSG_REFUSE) {
            rl_wire_refuse f;
            if (rl__refuse_check(&a, "fuzz", p, len, &f) == 0 &&
                (f.group0 != a.group0 || f.nprompts != a.nprompts || f.min_version != a.min_version ||
                 f.version < -1 || f.version >= (f.min_version > 0 ? f.min_version : 0)))
                abort();
        } else if (type == RL_MSG_BYE) {
            rl_wire_bye b;
            if (rl__bye_check(a.max_version, "fuzz", p, len, &b) == 0 && (b.version < -1 || b.version > a.max_version))
                abort();
        } else if (type == RL_MSG_HELLO) {
            rl_wire_hello h;
            if (rl__hello_parse("fuzz", p, len, &h) == 0) {
                size_t n = strnlen(h.name, sizeof h.name);
                if (n == 0 || n == sizeof h.name) abort();
                for (size_t i = 0; i < n; i++)
                    if (h.name[i] < 0x20 || h.name[i] > 0x7e) abort();
                if (!(h.speed > 0 && h.speed <= 1) || !isfinite(h.price) || h.price < 0) abort();
            }
        }
    }
    sh_buf_free(&in);
    return 0;
}
