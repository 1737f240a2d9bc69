/* rl_link (src/rl/engine/link.c), the protocol's two ends for programs
 * outside shoal, in C so that the ASan build covers them (the Python tests,
 * tests/python/test_rl_proto.py, run against the optimised library): a
 * forked worker answers one request honestly, refuses an exact version it
 * is past, then lies about a reward and is dropped, its request asked for
 * again; bad arguments get messages naming them. */
#include "testutil.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shoal/rl.h"

#define SECRET "6a0e3c1f9b7d5a2e4c8f0b1d3e5a7c9f"

/* One request answered by a push worker holding version `held`: every
 * response is "x" then EOS; lie: trajectory 0's reward is off by 0.5. */
static int answer(rl_link *l, const int64_t *info, int held, int lie)
{
    int minv = (int)info[0], exact = (int)info[1], np = (int)info[2], group = (int)info[3], g0 = (int)info[4];
    int need = minv > 0 ? minv : 0;
    if (held < need || (exact && held != need)) return rl_link_refuse(l, held);
    rl_traj *t = calloc((size_t)(np * group), sizeof *t);
    for (int k = 0; k < np * group; k++) {
        uint64_t id = (uint64_t)info[8 + k / group];
        char prompt[64];
        if (rl_task_prompt(RL_TASK_CODE, id, prompt, sizeof prompt) < 0) return -1;
        int n = 0;
        t[k].tokens[n++] = RL_BOS;
        for (const char *c = prompt; *c; c++) t[k].tokens[n++] = rl_tok(*c);
        t[k].plen = n;
        int32_t resp[2] = {rl_tok('x'), RL_EOS};
        t[k].tokens[n] = resp[0], t[k].blogp[n++] = -1.0f;
        t[k].tokens[n] = resp[1], t[k].blogp[n++] = -0.5f;
        t[k].len = n;
        if (rl_task_reward(RL_TASK_CODE, id, resp, 2, &t[k].reward) < 0) return -1;
        t[k].group = g0 + k / group, t[k].problem = id, t[k].vstart = t[k].vend = held;
    }
    if (lie) t[0].reward += 0.5f;
    int rc = rl_link_send(l, t, np * group);
    free(t);
    return rc;
}

static void __attribute__((noreturn)) worker(const char *addr, int lies_from)
{
    rl_link *l;
    if (rl_link_connect(addr, SECRET, "cworker", 1, &l) < 0) _exit(2);
    int64_t info[64];
    for (int served = 0;;) {
        int t = rl_link_next(l, 10, info, 64);
        if (t == 4) { /* STOP: BYE with the final version */
            rl_link_bye(l, (int)info[0], "img", 3);
            rl_link_close(l);
            _exit(0);
        }
        if (t != 2) _exit(t < 0 ? 0 : 3); /* dropped: the trainer hung up */
        if (answer(l, info, 1, served++ >= lies_from) < 0) _exit(4);
    }
}

static void test_link_roundtrip(void **state)
{
    (void)state;
    rl_link *tr;
    TU_OK(rl_link_listen("127.0.0.1:0", SECRET, RL_TASK_CODE, 7, 3, 8, 24, 1, &tr));
    TU_OK(rl_link_set_version(tr, 1));
    pid_t honest = fork();
    if (honest == 0) worker(rl_link_addr(tr), 1000);
    rl_traj out[64];
    int g0 = rl_link_ask(tr, 2, 0, 0);
    assert_int_equal(g0, 0);
    int n = 0;
    for (int i = 0; i < 300 && n < 6; i++) {
        int got = rl_link_poll(tr, 0.1, out + n, 64 - n);
        assert_true(got >= 0);
        n += got;
    }
    assert_int_equal(n, 6);
    for (int k = 0; k < 6; k++) assert_int_equal(out[k].group, k / 3);
    /* Exactly version 0: the worker holds 1, refuses, and it is not asked
     * again; exactly 1 is served. */
    int ge = rl_link_ask(tr, 1, 0, 1);
    int g1 = rl_link_ask(tr, 1, 1, 1);
    n = 0;
    for (int i = 0; i < 300 && n < 3; i++) n += rl_link_poll(tr, 0.1, out + n, 64 - n);
    assert_int_equal(n, 3);
    assert_int_equal(out[0].group, g1);
    char *js;
    TU_OK(rl_link_stats_json(tr, &js));
    char want[128];
    snprintf(want, sizeof want, "\"refused_exact\":[{\"group0\":%d,\"nprompts\":1,\"version\":0,\"held\":1}]", ge);
    if (!strstr(js, want)) fail_msg("stats lack %s: %s", want, js);
    free(js);
    /* A second worker that lies on its first answer: dropped, its request
     * asked for again (of the honest one). */
    pid_t liar = fork();
    if (liar == 0) worker(rl_link_addr(tr), 0);
    for (int i = 0; i < 300 && rl_link_workers(tr) < 2; i++) rl_link_poll(tr, 0.05, out, 64);
    assert_int_equal(rl_link_workers(tr), 2);
    for (int k = 0; k < 4; k++) rl_link_ask(tr, 1, 0, 0);
    n = 0;
    for (int i = 0; i < 600 && n < 12; i++) n += rl_link_poll(tr, 0.1, out + n, 64 - n);
    assert_int_equal(n, 12);
    TU_OK(rl_link_stop(tr, 1, 10));
    TU_OK(rl_link_stats_json(tr, &js));
    if (!strstr(js, "\"workers_dropped_for_violations\":1") || !strstr(js, "reward 0.5") ||
        !strstr(js, "\"final\":{\"version\":1,\"image_xxh3\""))
        fail_msg("stats: %s", js);
    free(js);
    rl_link_close(tr);
    int st;
    waitpid(honest, &st, 0);
    assert_int_equal(st, 0);
    waitpid(liar, &st, 0);
}

static void test_link_bad_input(void **state)
{
    (void)state;
    rl_link *l;
    TU_ERR(rl_link_listen("127.0.0.1:0", "abc", RL_TASK_CODE, 1, 4, 8, 24, 1, &l), SH_EINVAL, "32 hex digits");
    TU_ERR(rl_link_listen("127.0.0.1:0", "", RL_TASK_CODE, 1, 0, 8, 24, 1, &l), SH_EINVAL, "group 0");
    TU_ERR(rl_link_listen("127.0.0.1:0", "", RL_TASK_CODE, 1, 4, 8, 33, 1, &l), SH_EINVAL, "max_len 33");
    TU_ERR(rl_link_listen("nowhere", "", RL_TASK_CODE, 1, 4, 8, 24, 1, &l), SH_EINVAL, "nowhere");
    TU_OK(rl_link_listen("127.0.0.1:0", "", RL_TASK_CODE, 1, 4, 8, 24, 1, &l));
    TU_ERR(rl_link_ask(l, 0, 0, 0), SH_EINVAL, "0 prompts");
    TU_ERR(rl_link_ask(l, 1, -1, 1), SH_EINVAL, "exactly version -1");
    TU_OK(rl_link_set_version(l, 2));
    TU_ERR(rl_link_set_version(l, 1), SH_EINVAL, "older than the published 2");
    rl_link *w;
    TU_ERR(rl_link_connect(rl_link_addr(l), "", "a name far too long", 1, &w), SH_EINVAL, "1..15 characters");
    TU_ERR(rl_link_connect(rl_link_addr(l), "", "sp ace", 1, &w), SH_EINVAL, "printable");
    TU_OK(rl_link_connect(rl_link_addr(l), "", "w", 1, &w));
    TU_ERR(rl_link_send(w, NULL, 0), SH_EINVAL, "no request to answer");
    TU_ERR(rl_link_refuse(w, 0), SH_EINVAL, "no request to refuse");
    rl_link_close(w);
    rl_link_close(l);
    float r;
    int32_t bad[1] = {99};
    TU_ERR(rl_task_reward(RL_TASK_CODE, 1, bad, 1, &r), SH_EINVAL, "not in the alphabet");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_link_roundtrip),
        cmocka_unit_test(test_link_bad_input),
    };
    return cmocka_run_group_tests_name("rl_link", tests, NULL, NULL);
}
