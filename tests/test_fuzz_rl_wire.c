/* fuzz_rl_wire over its committed corpus, in `make test`: every input in
 * fuzz/corpus/fuzz_rl_wire (the seeds and each regression the fuzzer
 * found) goes through the fuzz target itself, which aborts when a worker's
 * message passes the trainer's checks and still breaks what the trainer
 * relies on. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

/* The target, compiled into this binary as it is into the fuzzer. */
#include "../fuzz/fuzz_rl_wire.c"

static void test_corpus_replays(void **state) { assert_true(tu_replay_corpus("fuzz_rl_wire", LLVMFuzzerTestOneInput) >= 5); }

/* The seeds' TRAJS (real rollouts of a real model) pass the checks, so the
 * fuzzer starts from messages that reach every check and the loss. */
static void test_seeds_accepted(void **state)
{
    static const char *const seeds[] = {"seed-trajs-code", "seed-trajs-arith", "seed-trajs-4x2", "seed-hello-trajs"};
    for (size_t s = 0; s < sizeof seeds / sizeof *seeds; s++) {
        char path[4200];
        snprintf(path, sizeof path, "fuzz/corpus/fuzz_rl_wire/%s", seeds[s]); /* tests run in the tree */
        size_t n;
        uint8_t *d = tu_read_file(path, &n);
        assert_true(n > 16);
        rl_problem probs[4];
        rl__ask a = ask_of(d, probs);
        sh_buf in = {.data = d + 16, .len = n - 16, .cap = n - 16};
        int trajs = 0;
        for (;;) {
            uint32_t type;
            const uint8_t *p;
            size_t len;
            long used = rl__msg_peek(&in, &type, &p, &len);
            assert_true(used >= 0);
            if (!used) break;
            if (type == RL_MSG_TRAJS) {
                rl_traj out[64];
                TU_OK(rl__trajs_check(&a, seeds[s], p, len, out));
                trajs++;
            }
            in.data += used, in.len -= (size_t)used, in.cap -= (size_t)used;
        }
        assert_int_equal(trajs, 1);
        free(d);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_replays),
        cmocka_unit_test(test_seeds_accepted),
    };
    return cmocka_run_group_tests_name("fuzz_rl_wire corpus", tests, NULL, NULL);
}
