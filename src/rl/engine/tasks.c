/* Tasks: the code task (write a stack-code program for an infix formula,
 * judged by hidden tests) and the arithmetic task (add two numbers).
 * Problems are numbered; a fixed fifth of them, chosen by a hash of the
 * prompt, is held out for evaluation and never drawn for training. */
#include <stdio.h>
#include <string.h>

#include "shoal/common.h"
#include "shoal/rl.h"

int rl_vocab(void) { return (int)strlen(RL_ALPHABET); }

int rl_tok(char ch)
{
    const char *p = ch ? strchr(RL_ALPHABET, ch) : NULL;
    return p ? (int)(p - RL_ALPHABET) : -1;
}

char rl_chr(int tok) { return tok >= 0 && tok < rl_vocab() ? RL_ALPHABET[tok] : '?'; }

int rl_task_parse(const char *name, int *task)
{
    if (!strcmp(name, "code")) *task = RL_TASK_CODE;
    else if (!strcmp(name, "arith")) *task = RL_TASK_ARITH;
    else return sh_err(SH_EINVAL, "--task \"%s\": expected code or arith", name);
    return 0;
}

const char *rl_task_name(int task) { return task == RL_TASK_ARITH ? "arith" : "code"; }

/* The code task's formula shapes: infix prompt, postfix demonstration, and
 * whether the second constant is used.  %c stands for a constant. */
static const struct {
    const char *infix, *postfix;
    int two;
} forms[] = {
    {"x+%c", "x%c+", 0},         {"x-%c", "x%c-", 0},         {"x*%c", "x%c*", 0},
    {"%c-x", "%cx-", 0},         {"x*x+%c", "xd*%c+", 0},     {"(x+%c)*%c", "x%c+%c*", 1},
    {"(x-%c)*%c", "x%c-%c*", 1}, {"x*%c+%c", "x%c*%c+", 1},   {"x*%c-%c", "x%c*%c-", 1},
    {"(%c-x)*%c", "%cx-%c*", 1},
};
#define NFORMS ((int)(sizeof forms / sizeof forms[0]))
static const int64_t test_inputs[] = {-2, -1, 0, 1, 2, 3};

/* Arithmetic operands are 0..ARITH_N-1.  With 0..19 (the first version)
 * there were 320 training sums: RL drew the same ones again and again and
 * the policy memorised them, while the 80 held-out sums never improved.
 * With 0..99 there are 8,000 training sums, a run of 60 steps x 8 prompts
 * sees almost every one once, and the only way to raise the reward is to
 * learn to add, which is what the held-out sums measure.  Operands are
 * written with two digits ("07+38=") so that a digit's place is its
 * position, and a response earns partial credit per digit (see
 * rl_reward): an exact-sum reward alone is almost always 0 for a policy
 * that has not yet learnt to carry, and GRPO learns nothing from a group
 * whose rewards are all equal. */
#define ARITH_N 100

static void fmt2(char *out, size_t cap, const char *fmt, char a, char b)
{
    /* The forms hold one or two %c; snprintf ignores the extra argument. */
    snprintf(out, cap, fmt, a, b);
}

static int64_t eval_form(int f, int64_t x, int64_t a, int64_t b)
{
    switch (f) {
    case 0: return x + a;
    case 1: return x - a;
    case 2: return x * a;
    case 3: return a - x;
    case 4: return x * x + a;
    case 5: return (x + a) * b;
    case 6: return (x - a) * b;
    case 7: return x * a + b;
    case 8: return x * a - b;
    default: return (a - x) * b;
    }
}

void rl_problem_make(int task, uint64_t id, rl_problem *p, int *held_out)
{
    memset(p, 0, sizeof *p);
    p->id = id;
    p->task = task;
    char body[20];
    if (task == RL_TASK_ARITH) {
        int a = (int)(id % ARITH_N), b = (int)(id / ARITH_N % ARITH_N);
        snprintf(body, sizeof body, "%02d+%02d", a, b);
        snprintf(p->answer, sizeof p->answer, "%d", a + b);
    } else {
        int f = (int)(id % NFORMS), a = (int)(id / NFORMS % 9) + 1, b = (int)(id / NFORMS / 9 % 9) + 1;
        if (!forms[f].two) b = 1; /* one-constant forms ignore b */
        fmt2(body, sizeof body, forms[f].infix, (char)('0' + a), (char)('0' + b));
        fmt2(p->answer, sizeof p->answer, forms[f].postfix, (char)('0' + a), (char)('0' + b));
        p->ntests = (int)(sizeof test_inputs / sizeof test_inputs[0]);
        for (int i = 0; i < p->ntests; i++) {
            p->in[i] = test_inputs[i];
            p->out[i] = eval_form(f, test_inputs[i], a, b);
        }
    }
    snprintf(p->prompt, sizeof p->prompt, "%s=", body);
    if (held_out) *held_out = sh_hash64_of(p->prompt, strlen(p->prompt)) % 5 == 0;
}

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t space(int task)
{
    return task == RL_TASK_ARITH ? (uint64_t)ARITH_N * ARITH_N : (uint64_t)NFORMS * 81;
}

void rl_problem_draw(int task, int held_out, uint64_t *rng, rl_problem *p)
{
    for (;;) {
        int h;
        rl_problem_make(task, next_u64(rng) % space(task), p, &h);
        if (h == held_out) return;
    }
}

/* The code task's evaluation set is the first held-out problems in id
 * order, which cycles through every formula shape.  Arithmetic ids in
 * order would all have a small second operand (id / 100), a distribution
 * unlike training's: they are visited in a stride that is coprime with
 * the space, so the set spreads over both operands. */
void rl_eval_set(int task, int n, rl_problem *out)
{
    int k = 0;
    uint64_t N = space(task);
    for (uint64_t j = 0; j < N && k < n; j++) {
        uint64_t id = task == RL_TASK_ARITH ? j * 7919 % N : j;
        int h;
        rl_problem_make(task, id, &out[k], &h);
        int dup = task == RL_TASK_CODE && !forms[id % NFORMS].two && id / NFORMS / 9 % 9 != 0;
        if (h && !dup) k++;
    }
    /* Fewer held-out problems than asked: repeat the set. */
    for (int i = k; i < n && k; i++) out[i] = out[i % k];
}

/* The fraction of digit places (aligned on the units) at which the
 * response has the answer's digit, over the longer of the two: 1 only for
 * the exact sum, and a shorter or longer response loses the places it
 * lacks or adds. */
static float arith_reward(const char *ans, const char *resp, int len)
{
    int n = (int)strlen(ans), m = len > n ? len : n, ok = 0;
    if (len < 1) return 0.0f;
    for (int i = 1; i <= n && i <= len; i++) ok += ans[n - i] == resp[len - i];
    return (float)ok / (float)m;
}

float rl_reward(const rl_problem *p, const char *resp, int len, int terminated)
{
    if (!terminated) return 0.0f;
    if (p->task == RL_TASK_ARITH) return arith_reward(p->answer, resp, len);
    rl_limits lim = rl_limits_default();
    int pass = 0;
    for (int i = 0; i < p->ntests; i++) {
        int64_t r;
        if (rl_sc_run(resp, len, p->in[i], &lim, &r) == RL_SC_OK && r == p->out[i]) pass++;
    }
    return p->ntests ? (float)pass / p->ntests : 0.0f;
}
