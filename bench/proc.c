/* The benchmarks' child processes: this binary started as a subcommand
 * (cli_bench_spawn), and its peak anonymous memory measured from outside.
 *
 * Peak anonymous memory of a shoal subcommand, measured from outside: the
 * command runs as a child (this binary, via /proc/self/exe) and the parent
 * samples the child's RssAnon in /proc/PID/status every millisecond until
 * it exits.  RssAnon leaves out the page cache and the mapped checkpoint
 * files, which is the memory the codec's bound is about. */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli_int.h"

int cli_peak_anon(char *const argv[], uint64_t *peak, double *secs)
{
    *peak = 0;
    double t0 = sh_now_mono();
    /* posix_spawn returns once the child has exec'd: a forked child that
     * has not yet would still count the parent's pages. */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    extern char **environ;
    int e = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e) return sh_err_errno(e, "start shoal %s %s", argv[1], argv[2] ? argv[2] : "");
    int st = 0;
    for (;;) {
        uint64_t r = sh_rss_anon(pid);
        if (r > *peak) *peak = r;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return sh_err_errno(errno, "wait for %s %s", argv[0], argv[1]);
        usleep(1000);
    }
    *secs = sh_now_mono() - t0;
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        return sh_err(SH_EINTERNAL, "`shoal %s %s` failed (exit status %d); run it by hand to see "
                      "why", argv[1], argv[2] ? argv[2] : "", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return SH_OK;
}

pid_t cli_bench_spawn(char *const argv[], const char *out_path, const char *err_path)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    pid_t pid = -1;
    if (posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ)) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

int cli_bench_root_addr(const char *addr_file, pid_t pid, const char *log, double timeout, char *addr, size_t cap)
{
    for (double end = sh_now_mono() + timeout; sh_now_mono() < end; sh_sleep(0.01)) {
        char *text;
        size_t len;
        if (sh_read_file(addr_file, 256, &text, &len) == 0) {
            text[strcspn(text, "\n")] = 0;
            snprintf(addr, cap, "%s", text);
            free(text);
            return SH_OK;
        }
        int st;
        if (pid > 0 && waitpid(pid, &st, WNOHANG) == pid)
            return sh_err(SH_EIO, "the push root exited (status %d) before it listened; see %s",
                          WIFEXITED(st) ? WEXITSTATUS(st) : -1, log);
    }
    return sh_err(SH_ETIMEDOUT, "the push root did not listen within %.0f s; see %s", timeout, log);
}

uint64_t cli_bench_active(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/ACTIVE", dir);
    json_t *j;
    int64_t v = 0;
    if (sh_json_load_file(p, 1 << 16, &j) < 0) return 0;
    sh_json_get_i64(j, "version", 0, p, &v);
    json_decref(j);
    return v > 0 ? (uint64_t)v : 0;
}
