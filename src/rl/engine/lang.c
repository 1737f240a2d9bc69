/* The stack-code interpreter: a sandbox that can run any string the policy
 * writes.  Every loop iteration and instruction counts against the step
 * limit, the value stack and the bracket nesting are bounded arrays, and
 * arithmetic is checked, so no program can hang, grow memory or invoke
 * undefined behaviour. */
#include <stdlib.h>
#include <string.h>

#include "shoal/rl.h"

#define SC_HARD_STACK 1024
#define SC_HARD_DEPTH 64

rl_limits rl_limits_default(void)
{
    return (rl_limits){.max_steps = 1000, .max_stack = 64, .max_depth = 8, .max_len = 64};
}

const char *rl_sc_status_name(int s)
{
    static const char *names[] = {"ok", "syntax error", "stack underflow", "stack limit",
                                  "nesting limit", "step limit", "arithmetic overflow",
                                  "program too long"};
    return s >= 0 && s <= RL_SC_TOOLONG ? names[s] : "unknown";
}

/* Matches brackets once up front: match[i] is the partner of a bracket. */
static int match_brackets(const char *p, int len, int max_depth, int *match)
{
    int stack[SC_HARD_DEPTH], depth = 0;
    for (int i = 0; i < len; i++) {
        if (p[i] == '[') {
            if (depth >= max_depth || depth >= SC_HARD_DEPTH) return RL_SC_DEPTH;
            stack[depth++] = i;
        } else if (p[i] == ']') {
            if (!depth) return RL_SC_SYNTAX;
            int o = stack[--depth];
            match[o] = i;
            match[i] = o;
        } else if (!strchr("0123456789xdsp+-*", p[i]) || !p[i]) {
            return RL_SC_SYNTAX;
        }
    }
    return depth ? RL_SC_SYNTAX : RL_SC_OK;
}

static int arith(char op, int64_t a, int64_t b, int64_t *r)
{
    int ovf = op == '+' ? __builtin_add_overflow(a, b, r)
              : op == '-' ? __builtin_sub_overflow(a, b, r)
                          : __builtin_mul_overflow(a, b, r);
    return ovf ? RL_SC_OVERFLOW : RL_SC_OK;
}

int rl_sc_run(const char *prog, int len, int64_t x, const rl_limits *lim, int64_t *result)
{
    if (len > lim->max_len) return RL_SC_TOOLONG;
    int match[128];
    if (len > (int)(sizeof match / sizeof match[0])) return RL_SC_TOOLONG;
    int rc = match_brackets(prog, len, lim->max_depth, match);
    if (rc) return rc;
    int cap = lim->max_stack < SC_HARD_STACK ? lim->max_stack : SC_HARD_STACK;
    int64_t st[SC_HARD_STACK];
    int sp = 0;
    long steps = 0;
    for (int pc = 0; pc < len; pc++) {
        if (++steps > lim->max_steps) return RL_SC_STEPS;
        char c = prog[pc];
        if (c >= '0' && c <= '9') {
            if (sp >= cap) return RL_SC_STACK;
            st[sp++] = c - '0';
        } else if (c == 'x' || c == 'd') {
            if (c == 'd' && sp < 1) return RL_SC_UNDERFLOW;
            if (sp >= cap) return RL_SC_STACK;
            st[sp] = c == 'x' ? x : st[sp - 1];
            sp++;
        } else if (c == 'p') {
            if (sp < 1) return RL_SC_UNDERFLOW;
            sp--;
        } else if (c == 's') {
            if (sp < 2) return RL_SC_UNDERFLOW;
            int64_t t = st[sp - 1];
            st[sp - 1] = st[sp - 2];
            st[sp - 2] = t;
        } else if (c == '+' || c == '-' || c == '*') {
            if (sp < 2) return RL_SC_UNDERFLOW;
            rc = arith(c, st[sp - 2], st[sp - 1], &st[sp - 2]);
            if (rc) return rc;
            sp--;
        } else if (c == '[') {
            if (sp < 1) return RL_SC_UNDERFLOW;
            if (!st[sp - 1]) pc = match[pc]; /* skip the body */
        } else { /* ']' jumps back while the top is non-zero */
            if (sp < 1) return RL_SC_UNDERFLOW;
            if (st[sp - 1]) pc = match[pc];
        }
    }
    if (sp < 1) return RL_SC_UNDERFLOW;
    *result = st[sp - 1];
    return RL_SC_OK;
}
