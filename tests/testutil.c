#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

const char *tu_tmpdir(void)
{
    static char dir[4096];
    if (!dir[0]) {
        const char *e = getenv("SHOAL_TEST_TMP");
        if (e && *e) snprintf(dir, sizeof dir, "%s", e);
        else snprintf(dir, sizeof dir, "/tmp/shoal-test.%ld", (long)getpid());
        if (sh_mkdir_p(dir, 0755) < 0) fail_msg("cannot create %s: %s", dir, sh_errmsg());
    }
    return dir;
}

const char *tu_path(const char *name)
{
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, 4096, "%s/%s", tu_tmpdir(), name);
    return b;
}

const char *tu_shoal(void)
{
    const char *e = getenv("SHOAL_BIN");
    return e && *e ? e : "build/shoal";
}

const char *tu_shared(void)
{
    const char *e = getenv("SHOAL_SHARED");
    static char p[4096];
    if (!e || !*e) e = "../shared";
    snprintf(p, sizeof p, "%s/data/README.md", e);
    return access(p, R_OK) == 0 ? e : NULL;
}

int tu_run(char **out, const char *fmt, ...)
{
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[16500];
    snprintf(full, sizeof full, "(%s) 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) fail_msg("popen failed for: %s", cmd);
    sh_buf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) sh_buf_append(&b, chunk, n);
    int st = pclose(p);
    if (out) *out = b.data ? (char *)b.data : strdup("");
    else sh_buf_free(&b);
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
}

int tu_run_tty(char **out, const char *fmt, ...)
{
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    if (pid < 0) fail_msg("forkpty failed for: %s", cmd);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    sh_buf b = {0};
    char chunk[4096];
    ssize_t n;
    /* The pty reports EIO once the last process holding it has exited. */
    while ((n = read(fd, chunk, sizeof chunk)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0) sh_buf_append(&b, chunk, (size_t)n);
    close(fd);
    int st;
    waitpid(pid, &st, 0);
    sh_buf_append(&b, "", 1);
    if (out) *out = (char *)b.data;
    else sh_buf_free(&b);
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
}

void tu_write_file(const char *path, const void *data, size_t len)
{
    if (sh_write_atomic(path, data, len) < 0) fail_msg("write %s: %s", path, sh_errmsg());
}

uint8_t *tu_read_file(const char *path, size_t *len)
{
    char *buf;
    if (sh_read_file(path, (size_t)1 << 34, &buf, len) < 0) fail_msg("read %s: %s", path, sh_errmsg());
    return (uint8_t *)buf;
}

static int tu_by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

size_t tu_replay_corpus(const char *name, int (*one)(const uint8_t *, size_t))
{
    char dir[512];
    snprintf(dir, sizeof dir, "fuzz/corpus/%s", name);
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s (run the tests from the repository root)", dir);
    char *names[4096];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096)
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, tu_by_name);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        size_t len;
        uint8_t *buf = tu_read_file(path, &len);
        print_message("%s (%zu bytes)\n", names[i], len);
        one(buf, len);
        free(buf);
        free(names[i]);
    }
    return n;
}

void tu_assert_same_file(const char *a, const char *b)
{
    size_t la, lb;
    uint8_t *x = tu_read_file(a, &la), *y = tu_read_file(b, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(x, y, la);
    free(x), free(y);
}

/* SHOAL_TEST_FILTER (a cmocka glob such as "test_plan*") runs only the
 * matching tests of a binary: the mutation harness (scripts/mutants.py) uses
 * it to run the one test that must catch a mutant. */
__attribute__((constructor)) static void tu_filter(void)
{
    const char *f = getenv("SHOAL_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
}

int tu_hold_port(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}
