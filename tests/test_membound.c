/* The codec's memory bound on one tensor larger than 4 GiB (past 2^31
 * elements, where 32-bit counts and offsets would wrap): `delta make`,
 * `delta apply` to a new file and `delta apply --in-place` each keep their
 * anonymous memory (RssAnon, sampled every millisecond from outside; the
 * page cache and the mapped checkpoints do not count) within 64 MiB plus
 * the delta's size, and the in-place result is the target byte for byte.
 * The checkpoints are sparse files (a real 4.3 GB header, zeros but for a
 * few thousand values), so the test costs little disk; the codec reads
 * every byte all the same.  Optimised build only: ASan's shadow memory is
 * anonymous too. */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shoal/ckpt.h"

#define BOUND (64ull << 20)

/* One tensor past 2^31 elements and 4 GiB (a vocabulary of 262,400 by a
 * width of 8,192: where 32-bit counts and offsets wrap), and a norm. */
#define ROWS 262400u
#define COLS 8192u
static void write_sparse(const char *path, uint64_t seed, int changes)
{
    ckpt_tensor t[2] = {
        {.name = "lm_head.weight", .dtype = CKPT_BF16, .ndim = 2, .shape = {ROWS, COLS}},
        {.name = "model.norm.weight", .dtype = CKPT_BF16, .ndim = 1, .shape = {COLS}},
    };
    uint64_t off = 0;
    for (int i = 0; i < 2; i++) {
        t[i].numel = (uint64_t)t[i].shape[0] * (t[i].ndim == 2 ? (uint64_t)t[i].shape[1] : 1);
        t[i].nbytes = 2 * t[i].numel;
        t[i].offset = off;
        off += t[i].nbytes;
    }
    sh_buf h = {0};
    TU_OK(ckpt_header_build(t, 2, NULL, &h));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, h.data, h.len), (ssize_t)h.len);
    assert_int_equal(ftruncate(fd, (off_t)(h.len + off)), 0);
    /* 32 MiB of real-looking values (16 chunks), of which the next version
     * changes a fifth: dense chunks, which fill the encoder's buffers. */
    uint16_t *v = malloc(32u << 20);
    uint64_t r = 777;
    for (size_t i = 0; i < (16u << 20); i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        v[i] = (uint16_t)(0x3c00 + r % 4096);
        if (changes && r % 5 == 0) v[i]++;
    }
    assert_int_equal(pwrite(fd, v, 32u << 20, (off_t)(h.len + (64u << 20))), (ssize_t)(32u << 20));
    free(v);
    /* The same scattered values in both versions, then `changes` that
     * differ. */
    uint64_t s = 12345;
    for (int k = 0; k < 4000 + changes; k++) {
        if (k == 4000) s = seed;
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint64_t e = s % (off / 2);
        uint16_t x = (uint16_t)(0x3c00 + (s >> 40) % 64);
        assert_int_equal(pwrite(fd, &x, 2, (off_t)(h.len + 2 * e)), 2);
    }
    /* Changes on both sides of the 2^31st element and in the last one. */
    uint64_t at[3] = {(1ull << 31) - 1, (1ull << 31) + 1, (uint64_t)ROWS * COLS - 1};
    for (int k = 0; changes && k < 3; k++) {
        uint16_t x = (uint16_t)(0x4000 + k);
        assert_int_equal(pwrite(fd, &x, 2, (off_t)(h.len + 2 * at[k])), 2);
    }
    close(fd);
    sh_buf_free(&h);
}

/* Runs `shoal ARGS...` and returns its peak RssAnon; asserts exit 0. */
static uint64_t peak_of(const char *a1, const char *a2, const char *a3, const char *a4,
                        const char *a5, const char *a6)
{
    /* posix_spawn returns after the exec: a forked child would count this
     * process's pages until then. */
    char *argv[] = {"shoal", (char *)a1, (char *)a2, (char *)a3, (char *)a4, (char *)a5,
                    (char *)a6, NULL};
    extern char **environ;
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, tu_shoal(), NULL, NULL, argv, environ), 0);
    uint64_t peak = 0;
    int st = 0;
    for (;;) {
        uint64_t r = sh_rss_anon(pid);
        if (r > peak) peak = r;
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        usleep(1000);
    }
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    return peak;
}

static void test_bound_one_huge_tensor(void **state)
{
#if defined(__SANITIZE_ADDRESS__)
    skip();
#endif
    const char *b = tu_path("b.safetensors"), *t = tu_path("t.safetensors");
    const char *d = tu_path("d.delta"), *o = tu_path("o.safetensors"), *c = tu_path("c.safetensors");
    write_sparse(b, 1, 0);
    write_sparse(t, 99, 3000);
    struct stat st;
    assert_int_equal(stat(b, &st), 0);
    assert_true(st.st_size > (4ll << 30));
    uint64_t make = peak_of("delta", "make", b, t, "-o", d);
    assert_int_equal(stat(d, &st), 0);
    uint64_t limit = BOUND + (uint64_t)st.st_size;
    /* Apply checks every rebuilt chunk against the target's digests; the
     * bytes are compared once, after the in-place apply. */
    uint64_t apply = peak_of("delta", "apply", b, d, "-o", o);
    unlink(o);
    assert_int_equal(tu_run(NULL, "cp --sparse=always %s %s", b, c), 0);
    uint64_t inplace = peak_of("delta", "apply", "--in-place", c, d, NULL);
    assert_int_equal(tu_run(NULL, "cmp %s %s", c, t), 0);
    assert_int_equal(stat(t, &st), 0);
    print_message("checkpoint %lld bytes, delta %lld bytes: peak RssAnon make %.1f MiB, apply "
                  "%.1f MiB, in place %.1f MiB (bound %.1f MiB)\n", (long long)st.st_size,
                  (long long)(limit - BOUND), make / 1048576.0,
                  apply / 1048576.0, inplace / 1048576.0, limit / 1048576.0);
    assert_true(make <= limit);
    assert_true(apply <= limit);
    assert_true(inplace <= limit);
    unlink(b), unlink(t), unlink(d), unlink(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bound_one_huge_tensor)};
    return cmocka_run_group_tests_name("membound", tests, NULL, NULL);
}
