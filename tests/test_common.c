/* Tests for src/common: errors, hashing, atomic files, parsing, JSON. */
#include "testutil.h"

#include <fcntl.h>
#include <pty.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_err_messages(void **state)
{
    int rc = sh_err(SH_EFORMAT, "file %s: tensor %s: offsets overlap", "a.st", "w");
    assert_int_equal(rc, SH_EFORMAT);
    assert_string_equal(sh_errmsg(), "file a.st: tensor w: offsets overlap");
    sh_err_wrap(rc, "loading");
    assert_string_equal(sh_errmsg(), "loading: file a.st: tensor w: offsets overlap");
    assert_int_equal(sh_err_errno(28 /* ENOSPC */, "write x"), SH_ENOSPC);
    assert_non_null(strstr(sh_errmsg(), "write x: "));
}

static void test_hash_known_values(void **state)
{
    /* xxh3-128 of the empty input, as printed by `xxhsum -H2 /dev/null`. */
    char hex[33];
    sh_hash128_hex(sh_hash128_of("", 0), hex);
    assert_string_equal(hex, "99aa06d3014798d86001c324468d497f");
    /* Streaming equals one-shot across uneven splits. */
    uint8_t data[10000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 131 + 7);
    sh_hasher *h = sh_hasher_new();
    for (size_t off = 0; off < sizeof data;) {
        size_t n = 1 + off % 997;
        if (off + n > sizeof data) n = sizeof data - off;
        sh_hasher_update(h, data + off, n);
        off += n;
    }
    assert_true(sh_hash128_eq(sh_hasher_digest(h), sh_hash128_of(data, sizeof data)));
    sh_hasher_free(h);
    sh_hasher_free(NULL);
    sh_hash128 p;
    sh_hash128_hex(sh_hash128_of(data, 5), hex);
    TU_OK(sh_hash128_parse(hex, &p));
    assert_true(sh_hash128_eq(p, sh_hash128_of(data, 5)));
    TU_ERR(sh_hash128_parse("xyz", &p), SH_EFORMAT, "32 hex digits");
}

static void test_atomic_write(void **state)
{
    const char *p = tu_path("atomic.txt");
    TU_OK(sh_write_atomic(p, "one", 3));
    TU_OK(sh_write_atomic(p, "second", 6));
    size_t n;
    uint8_t *d = tu_read_file(p, &n);
    assert_int_equal(n, 6);
    assert_memory_equal(d, "second", 6);
    free(d);
    /* An aborted streaming write leaves the old file and no temporary. */
    sh_atomic_file f;
    TU_OK(sh_atomic_open(&f, p));
    TU_OK(sh_write_all(f.fd, "garbage", 7, "tmp"));
    sh_atomic_abort(&f);
    d = tu_read_file(p, &n);
    assert_memory_equal(d, "second", 6);
    free(d);
    assert_false(sh_path_exists(f.tmp));
    /* Writing into a missing directory fails with a message naming it. */
    TU_ERR(sh_write_atomic(tu_path("no/such/dir/x"), "a", 1), SH_ENOENT, "no/such/dir");
}

/* Kept mappings: a released mapping comes back for the same file (even
 * renamed), with what was written through it; another size, access or
 * file gets a new one; a deleted file's mapping is not kept. */
static void test_map_keep(void **state)
{
    const uint64_t size = 8u << 20;
    const char *a = tu_path("keep-a"), *b = tu_path("keep-b");
    int fd = open(a, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    uint8_t *m, *again, *ro, *other;
    TU_OK(sh_map_keep(fd, size, 1, &m));
    memset(m, 0x5a, size);
    sh_map_keep_release(m, size, fd, 1);
    close(fd);
    assert_int_equal(rename(a, b), 0);
    fd = open(b, O_RDWR);
    TU_OK(sh_map_keep(fd, size, 1, &again));
    assert_ptr_equal(again, m);
    assert_int_equal(again[size - 1], 0x5a);
    TU_OK(sh_map_keep(fd, size, 0, &ro)); /* read-only: not the writer's */
    assert_ptr_not_equal(ro, m);
    assert_int_equal(ro[12345], 0x5a);
    sh_map_keep_release(ro, size, fd, 0);
    TU_OK(sh_map_keep(fd, size - 4096, 1, &other)); /* another size */
    assert_ptr_not_equal(other, m);
    sh_map_keep_release(other, size - 4096, fd, 1);
    TU_ERR(sh_map_keep(fd, size + 1, 1, &other), SH_EINVAL, "map");
    assert_int_equal(unlink(b), 0);
    sh_map_keep_release(again, size, fd, 1); /* deleted: unmapped, not kept */
    close(fd);
    fd = open(a, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    TU_OK(sh_map_keep(fd, size, 1, &other));
    assert_int_equal(other[0], 0); /* a new file's mapping, not the old one */
    sh_map_keep_release(other, size, fd, 1);
    close(fd);
    unlink(a);
}

static void test_dirs(void **state)
{
    const char *d = tu_path("a/b/c");
    TU_OK(sh_mkdir_p(d, 0755));
    assert_true(sh_is_dir(d));
    TU_OK(sh_write_atomic(tu_path("a/b/c/f"), "x", 1));
    TU_OK(sh_rm_rf(tu_path("a")));
    assert_false(sh_path_exists(tu_path("a")));
    TU_OK(sh_rm_rf(tu_path("a")));
}

static void test_parse_numbers(void **state)
{
    uint64_t u;
    int64_t i;
    double x;
    TU_OK(sh_parse_size("256M", &u, "--params"));
    assert_int_equal(u, 256000000u);
    TU_OK(sh_parse_size("2MiB", &u, "--chunk"));
    assert_int_equal(u, 2u << 20);
    TU_OK(sh_parse_size("1.5K", &u, "--x"));
    assert_int_equal(u, 1500);
    TU_ERR(sh_parse_size("12Q", &u, "--params"), SH_EINVAL, "--params: unknown suffix");
    /* The message lists every suffix it takes (T and TiB too). */
    TU_ERR(sh_parse_size("12Q", &u, "--params"), SH_EINVAL, "(use K, M, G, T, KiB, MiB, GiB, TiB)");
    TU_OK(sh_parse_size("1TiB", &u, "--payload"));
    assert_int_equal(u, 1099511627776ULL);
    TU_ERR(sh_parse_size("-3", &u, "--params"), SH_EINVAL, "not a size");
    TU_OK(sh_parse_i64("-42", &i, "--seed"));
    assert_int_equal(i, -42);
    TU_ERR(sh_parse_i64("4x", &i, "--seed"), SH_EINVAL, "--seed: \"4x\" is not an integer");
    TU_ERR(sh_parse_u64("-1", &u, "--steps"), SH_EINVAL, "--steps");
    TU_OK(sh_parse_double("1e-6", &x, "--lr"));
    assert_true(x == 1e-6);
    TU_ERR(sh_parse_double("nan", &x, "--lr"), SH_EINVAL, "--lr");
}

static void test_json_helpers(void **state)
{
    json_t *j;
    const char *txt = "{\"name\": \"train\", \"nodes\": 4, \"lr\": 0.5, \"on\": true}";
    TU_OK(sh_json_parse(txt, strlen(txt), "job.json", &j));
    const char *s = NULL;
    int64_t n = 0;
    double lr = 0;
    int on = 0;
    TU_OK(sh_json_get_str(j, "name", 1, "job.json", &s));
    assert_string_equal(s, "train");
    TU_OK(sh_json_get_i64(j, "nodes", 1, "job.json", &n));
    assert_int_equal(n, 4);
    TU_OK(sh_json_get_num(j, "lr", 1, "job.json", &lr));
    TU_OK(sh_json_get_bool(j, "on", 1, "job.json", &on));
    assert_true(on);
    n = 7;
    TU_OK(sh_json_get_i64(j, "absent", 0, "job.json", &n));
    assert_int_equal(n, 7);
    TU_ERR(sh_json_get_i64(j, "name", 1, "job.json", &n), SH_EFORMAT,
           "job.json: field \"name\": expected an integer, got string");
    TU_ERR(sh_json_get_str(j, "absent", 1, "job.json", &s), SH_EFORMAT, "missing field \"absent\"");
    static const char *const allowed[] = {"name", "nodes", "lr", NULL};
    TU_ERR(sh_json_check_keys(j, allowed, "job.json"), SH_EFORMAT, "unknown field \"on\"");
    json_decref(j);
    TU_ERR(sh_json_parse("{\"a\": 1,}", 9, "bad.json", &j), SH_EFORMAT, "bad.json: invalid JSON at line 1");
    TU_ERR(sh_json_parse("{\"a\":1,\"a\":2}", 13, "dup.json", &j), SH_EFORMAT, "duplicate");
}

static void test_cli_dispatch(void **state)
{
    char *out;
    assert_int_equal(tu_run(&out, "%s version --json", tu_shoal()), 0);
    assert_non_null(strstr(out, "\"zstd\""));
    free(out);
    assert_int_equal(tu_run(&out, "%s no-such-command", tu_shoal()), 2);
    assert_non_null(strstr(out, "unknown command \"no-such-command\""));
    free(out);
    assert_int_equal(tu_run(&out, "%s help", tu_shoal()), 0);
    assert_non_null(strstr(out, "version"));
    free(out);
}

/* On a terminal, a line printed between updates starts on a clean line:
 * sh_progress_clear erases the bar first (was: the line ran on after it). */
static void test_progress_clear(void **state)
{
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    assert_true(pid >= 0);
    if (pid == 0) {
        sh_progress p;
        sh_progress_start(&p, "work", 10, "steps");
        sh_progress_update(&p, 3);
        sh_progress_clear(&p);
        fputs("a line of its own\n", stderr);
        sh_progress_update(&p, 4);
        sh_progress_finish(&p);
        _exit(0);
    }
    char buf[4096];
    size_t n = 0;
    for (ssize_t r; n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0;) n += (size_t)r;
    buf[n] = 0;
    close(fd);
    waitpid(pid, NULL, 0);
    if (!strstr(buf, "\r\033[Ka line of its own") || !strstr(buf, "work ["))
        fail_msg("the bar was not erased before the line:\n%s", buf);
}

/* sh_utf8_tail: the bytes a reader keeps for its next read. */
static void test_utf8_tail(void **state)
{
    static const struct {
        const char *s;
        size_t tail;
    } t[] = {
        {"", 0},           {"abc", 0},         {"x\xe2", 1},             {"x\xe2\x82", 2},
        {"x\xe2\x82\xac", 0}, {"\xc3", 1},       {"\xc3\xa9", 0},          {"\xf0\x9f\x98", 3},
        {"\xf0\x9f\x98\x80", 0}, {"\x82\xac", 0}, /* continuation bytes alone: no character to finish */
        {"\xe2\x82\xac\xe2", 1}, {"\xc0", 0},   {"\xf5\x80", 0}, /* never UTF-8 */
        {"\x80\x80\x80\x80\x80", 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (sh_utf8_tail((const uint8_t *)t[i].s, strlen(t[i].s)) != t[i].tail)
            fail_msg("case %zu: sh_utf8_tail gave %zu, expected %zu", i,
                     sh_utf8_tail((const uint8_t *)t[i].s, strlen(t[i].s)), t[i].tail);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_messages),  cmocka_unit_test(test_hash_known_values),
        cmocka_unit_test(test_atomic_write),  cmocka_unit_test(test_dirs),
        cmocka_unit_test(test_parse_numbers), cmocka_unit_test(test_json_helpers),
        cmocka_unit_test(test_cli_dispatch),  cmocka_unit_test(test_map_keep),
        cmocka_unit_test(test_progress_clear), cmocka_unit_test(test_utf8_tail),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
