/* What the trainer checks in the messages a rollout worker sends
 * (docs/rl-protocol.md, "What the trainer checks").  A worker may be
 * hostile (another tenant who got the run's secret) or, far more often,
 * buggy (another GPU type's numerics, FP8 overflow, a stale build): either
 * way a single bad trajectory must not reach the loss.  Every field that a
 * worker sends and the trainer uses is checked here against what the
 * trainer asked that worker for and what it can recompute itself: groups,
 * problems and prompts (functions of the run's seed), versions (bounded
 * by the request and by what the trainer has published), behaviour
 * log-probabilities, and rewards (recomputed with the task's hidden tests).
 *
 * Pure: no sockets or clocks; the trainer's event loop (runtime.c) and the
 * fuzzer (fuzz/fuzz_rl_wire.c) call the same functions. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rl/engine/wire_int.h"

void rl__group_problem(uint64_t seed, int task, int g, rl_problem *p)
{
    uint64_t rng = seed ^ ((uint64_t)(uint32_t)g * 0x9e3779b97f4a7c15ULL);
    rl_problem_draw(task, 0, &rng, p);
}

/* "nan", "inf", "-inf" or the value, for messages. */
static const char *fnum(float x, char *buf, size_t cap)
{
    snprintf(buf, cap, "%g", (double)x);
    return buf;
}

/* Trajectory k against the request: its group, problem and prompt. */
static int check_origin(const rl__ask *a, const char *who, int k, const rl_traj *t)
{
    int gi = k / a->group, g = a->group0 + gi;
    const rl_problem *pb = &a->probs[gi];
    if (t->group != g)
        return sh_err(SH_EFORMAT, "%s: trajectory %d: group %d, but it answers groups %d..%d and "
                      "this record belongs to group %d", who, k, t->group, a->group0,
                      a->group0 + a->nprompts - 1, g);
    if (t->problem != pb->id)
        return sh_err(SH_EFORMAT, "%s: trajectory %d: problem %llu, but group %d's problem is %llu",
                      who, k, (unsigned long long)t->problem, g, (unsigned long long)pb->id);
    int plen = 1 + (int)strlen(pb->prompt);
    if (t->plen != plen)
        return sh_err(SH_EFORMAT, "%s: trajectory %d: plen %d, but group %d's prompt \"%s\" is %d tokens "
                      "with BOS", who, k, t->plen, g, pb->prompt, plen);
    for (int j = 0; j < plen; j++) {
        int want = j ? rl_tok(pb->prompt[j - 1]) : RL_BOS;
        if (t->tokens[j] != want)
            return sh_err(SH_EFORMAT, "%s: trajectory %d: tokens[%d] is %d, but group %d's prompt "
                          "\"%s\" has %d there", who, k, j, (int)t->tokens[j], g, pb->prompt, want);
    }
    return 0;
}

/* Its response: tokens, lengths, behaviour log-probabilities, reward. */
static int check_response(const rl__ask *a, const char *who, int k, const rl_traj *t)
{
    char b1[32], b2[32];
    for (int j = t->plen; j < t->len; j++) {
        if (t->tokens[j] < 0 || t->tokens[j] >= rl_vocab())
            return sh_err(SH_EFORMAT, "%s: trajectory %d: tokens[%d] is %d, not in the alphabet of %d",
                          who, k, j, (int)t->tokens[j], rl_vocab());
        float lp = t->blogp[j];
        if (!isfinite(lp))
            return sh_err(SH_EFORMAT, "%s: trajectory %d: blogp[%d] is %s", who, k, j, fnum(lp, b1, sizeof b1));
        if (lp > RL_BLOGP_MAX || lp < RL_BLOGP_MIN)
            return sh_err(SH_EFORMAT, "%s: trajectory %d: blogp[%d] is %s, not a sampled token's "
                          "log-probability (%g..%g)", who, k, j, fnum(lp, b1, sizeof b1),
                          (double)RL_BLOGP_MIN, (double)RL_BLOGP_MAX);
    }
    /* The reward is the task's, on the response up to EOS: recomputed. */
    char resp[RL_MAX_T];
    int n = 0, term = 0;
    for (int j = t->plen; j < t->len && !term; j++)
        if (t->tokens[j] == RL_EOS) term = 1;
        else resp[n++] = rl_chr(t->tokens[j]);
    float want = rl_reward(&a->probs[k / a->group], resp, n, term);
    if (!(t->reward == want))
        return sh_err(SH_EFORMAT, "%s: trajectory %d: reward %s, but its response scores %s on the "
                      "task's tests", who, k, fnum(t->reward, b1, sizeof b1), fnum(want, b2, sizeof b2));
    return 0;
}

int rl__trajs_check(const rl__ask *a, const char *who, const uint8_t *p, size_t len, rl_traj *out)
{
    rl_wire_trajs th;
    int count = a->nprompts * a->group;
    if (len < sizeof th) return sh_err(SH_EFORMAT, "%s: short TRAJS (%zu bytes)", who, len);
    memcpy(&th, p, sizeof th);
    if (th.count != count || len != sizeof th + (size_t)count * sizeof(rl_traj))
        return sh_err(SH_EFORMAT, "%s: TRAJS with %d records in %zu bytes, but it was asked for %d "
                      "(groups %d..%d of %d)", who, th.count, len, count, a->group0,
                      a->group0 + a->nprompts - 1, a->group);
    memcpy(out, p + sizeof th, (size_t)count * sizeof(rl_traj)); /* p may be unaligned */
    int vmin = a->min_version > 0 ? a->min_version : 0;
    for (int k = 0; k < count; k++) {
        const rl_traj *t = &out[k];
        if (t->len > a->max_len || t->plen < 2 || t->plen >= t->len)
            return sh_err(SH_EFORMAT, "%s: trajectory %d: plen %d, len %d: want 2 <= plen < len <= %d",
                          who, k, t->plen, t->len, a->max_len);
        SH_TRY(check_origin(a, who, k, t));
        if (t->len - t->plen > a->max_new)
            return sh_err(SH_EFORMAT, "%s: trajectory %d: %d response tokens, more than the run's %d",
                          who, k, t->len - t->plen, a->max_new);
        if (t->vstart < vmin)
            return sh_err(SH_EFORMAT, "%s: trajectory %d: vstart %d, older than the request's "
                          "min_version %d", who, k, t->vstart, vmin);
        if (t->vstart > t->vend)
            return sh_err(SH_EFORMAT, "%s: trajectory %d: vstart %d > vend %d", who, k, t->vstart, t->vend);
        if (a->exact && (t->vstart != vmin || t->vend != vmin))
            return sh_err(SH_EFORMAT, "%s: trajectory %d: versions %d..%d, but the request asked for "
                          "exactly version %d", who, k, t->vstart, t->vend, vmin);
        if (t->vend > a->max_version)
            return sh_err(SH_EFORMAT, "%s: trajectory %d: vend %d, newer than the trainer's version %d",
                          who, k, t->vend, a->max_version);
        SH_TRY(check_response(a, who, k, t));
    }
    return 0;
}

int rl__refuse_check(const rl__ask *a, const char *who, const uint8_t *p, size_t len,
                     rl_wire_refuse *out)
{
    if (len != sizeof *out) return sh_err(SH_EFORMAT, "%s: REFUSE of %zu bytes, not %zu", who, len, sizeof *out);
    memcpy(out, p, sizeof *out);
    if (out->group0 != a->group0 || out->nprompts != a->nprompts)
        return sh_err(SH_EFORMAT, "%s: REFUSE of groups %d+%d, but its oldest request is %d+%d", who,
                      out->group0, out->nprompts, a->group0, a->nprompts);
    if (out->min_version != a->min_version)
        return sh_err(SH_EFORMAT, "%s: REFUSE says min_version %d, but the request asked for %d", who,
                      out->min_version, a->min_version);
    /* A worker refuses only a version it cannot get: it holds an older one,
     * or none (-1; none serves no request, whatever its min_version), or,
     * asked for exactly one, a newer one (weights never go back). */
    int need = out->min_version > 0 ? out->min_version : 0;
    if (out->version < -1 || (a->exact ? out->version == need : out->version >= need))
        return sh_err(SH_EFORMAT, "%s: REFUSE while holding version %d, which serves min_version %d",
                      who, out->version, out->min_version);
    return 0;
}

int rl__bye_check(int max_version, const char *who, const uint8_t *p, size_t len, rl_wire_bye *out)
{
    if (len != sizeof *out) return sh_err(SH_EFORMAT, "%s: BYE of %zu bytes, not %zu", who, len, sizeof *out);
    memcpy(out, p, sizeof *out);
    if (out->version < -1 || out->version > max_version)
        return sh_err(SH_EFORMAT, "%s: BYE names version %d, but the trainer's is %d", who, out->version,
                      max_version);
    return 0;
}

int rl__hello_parse(const char *who, const uint8_t *p, size_t len, rl_wire_hello *out)
{
    if (len != sizeof *out) return sh_err(SH_EFORMAT, "%s: HELLO of %zu bytes, not %zu", who, len, sizeof *out);
    memcpy(out, p, sizeof *out);
    /* The name goes into logs and the run's JSON: printable ASCII. */
    size_t n = strnlen(out->name, sizeof out->name);
    if (n == 0 || n == sizeof out->name)
        return sh_err(SH_EFORMAT, "%s: HELLO name is empty or not NUL-terminated within %zu bytes", who,
                      sizeof out->name);
    for (size_t i = 0; i < n; i++)
        if (out->name[i] < 0x20 || out->name[i] > 0x7e)
            return sh_err(SH_EFORMAT, "%s: HELLO name has byte 0x%02x at %zu: printable ASCII only", who,
                          (unsigned)(uint8_t)out->name[i], i);
    if (!(out->speed > 0 && out->speed <= 1) || !(out->price >= 0 && out->price <= 1e6))
        return sh_err(SH_EFORMAT, "%s (%s): HELLO speed %g must be in (0,1], price %g in [0,1e6] $/h", who,
                      out->name, out->speed, out->price);
    if (out->pid <= 0 || (out->flags & ~(uint32_t)RL_HELLO_PUSH))
        return sh_err(SH_EFORMAT, "%s (%s): HELLO pid %d must be > 0, flags %#x only %#x", who, out->name,
                      (int)out->pid, out->flags, (unsigned)RL_HELLO_PUSH);
    return 0;
}
