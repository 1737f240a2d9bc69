/* fuzz_sched's invariant checker over its committed corpus, in `make test`:
 * every input in fuzz/corpus/fuzz_sched (the seeds and each regression the
 * fuzzer found) is replayed through the fuzz target itself, which aborts
 * when sched_check finds a broken invariant or a decision names something
 * impossible.  The fuzzer explores; this keeps what it found fixed. */
#include "testutil.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

/* The target, compiled into this binary as it is into the fuzzer. */
#include "../fuzz/fuzz_sched.c"

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_corpus_replays(void **state)
{
    const char *dir = "fuzz/corpus/fuzz_sched";
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s (run the tests from the repository root)", dir);
    char *names[4096];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096)
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    assert_true(n >= 1);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        size_t len;
        uint8_t *buf = tu_read_file(path, &len);
        print_message("%s (%zu bytes)\n", names[i], len);
        LLVMFuzzerTestOneInput(buf, len);
        free(buf);
        free(names[i]);
    }
}

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
