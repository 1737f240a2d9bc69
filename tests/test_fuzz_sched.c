/* fuzz_sched's invariant checker over its committed corpus, in `make test`:
 * every input in fuzz/corpus/fuzz_sched (the seeds and each regression the
 * fuzzer found) is replayed through the fuzz target itself, which aborts
 * when sched_check finds a broken invariant or a decision names something
 * impossible.  The fuzzer explores; this keeps what it found fixed. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

/* The target, compiled into this binary as it is into the fuzzer. */
#include "../fuzz/fuzz_sched.c"

static void test_corpus_replays(void **state) { assert_true(tu_replay_corpus("fuzz_sched", LLVMFuzzerTestOneInput) >= 1); }

/* Inputs the corpus may lack: empty, one byte of each policy, and a long
 * run of one repeated byte. */
static void test_edge_inputs(void **state)
{
    LLVMFuzzerTestOneInput((const uint8_t *)"", 0);
    for (uint8_t p = 0; p < 8; p++) LLVMFuzzerTestOneInput(&p, 1);
    uint8_t run[4096];
    for (int v = 0; v < 256; v += 51) {
        memset(run, v, sizeof run);
        LLVMFuzzerTestOneInput(run, sizeof run);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_replays),
        cmocka_unit_test(test_edge_inputs),
    };
    return cmocka_run_group_tests_name("fuzz_sched corpus", tests, NULL, NULL);
}
