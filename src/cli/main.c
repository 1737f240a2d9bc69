/* shoal: subcommands like git, in two binaries.
 *
 * build/shoal-core holds every command.  build/shoal, the one users run, is
 * the same main() built with -DSHOAL_CLIENT: it holds only the commands that
 * talk to a server (client-commands.h) and links only libc and jansson, so
 * that `shoal submit` does not pay for loading UCX, OpenBLAS and the rest.
 * Any other command it hands to shoal-core with execv(). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_int.h"

#define SH_CMD(name, str)                                                     \
    extern const char cli_help_##name[];                                      \
    int cli_cmd_##name(int argc, char **argv);
#define SH_BENCH(name, str)                                                   \
    extern const char cli_bench_help_##name[];                                \
    int cli_bench_##name(int argc, char **argv);
#ifdef SHOAL_CLIENT
#include "client-commands.h"
#else
#include "commands.h"
#endif
#undef SH_CMD
#undef SH_BENCH

struct cli_entry {
    const char *name;
    const char *help;
    int (*fn)(int, char **);
};

#define SH_CMD(name, str) {str, cli_help_##name, cli_cmd_##name},
#define SH_BENCH(name, str)
static const struct cli_entry commands[] = {
#ifdef SHOAL_CLIENT
#include "client-commands.h"
#else
#include "commands.h"
#endif
    {NULL, NULL, NULL}};
#undef SH_CMD
#undef SH_BENCH

#ifndef SHOAL_CLIENT
#define SH_CMD(name, str)
#define SH_BENCH(name, str) {str, cli_bench_help_##name, cli_bench_##name},
static const struct cli_entry benches[] = {
#include "commands.h"
    {NULL, NULL, NULL}};
#undef SH_CMD
#undef SH_BENCH
#endif

int cli_fail(const char *cmd, int rc)
{
    const char *m = sh_errmsg()[0] ? sh_errmsg() : sh_strerror(rc);
    fprintf(stderr, "shoal %s: %s\n", cmd, m);
    /* UCX says "Device is busy" for a port in use (push serve/relay, replica). */
    if (strstr(m, "listen on ") && strstr(m, "busy"))
        fputs("hint: another process holds that port: give another with --listen HOST:PORT (port 0: any free one)\n",
              stderr);
    return 1;
}

int cli_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "shoal %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(run `shoal %s --help` for usage)\n", cmd);
    va_end(ap);
    return CLI_USAGE;
}

void cli_progress_end(sh_progress *pg, int rc)
{
    if (rc == SH_OK) sh_progress_finish(pg);
    else if (pg->enabled && pg->done) fputc('\n', stderr);
}

#ifndef SHOAL_CLIENT
static void list(FILE *f, const struct cli_entry *t, const char *prefix)
{
    for (const struct cli_entry *e = t; e->name; e++)
        fprintf(f, "  %s%-14s %s\n", prefix, e->name, e->help);
}

static int usage(FILE *f)
{
    fprintf(f, "usage: shoal <command> [options]\n\n"
               "shoal runs reinforcement-learning post-training over a mixed GPU fleet:\n"
               "a gang scheduler, versioned weight deltas, and asynchronous RL.\n\ncommands:\n");
    list(f, commands, "");
    if (benches[0].name) {
        fprintf(f, "\nbenchmarks (shoal bench <name>):\n");
        list(f, benches, "");
    }
    fprintf(f, "\nRun `shoal <command> --help` (or `shoal help <command>`) for a command's options.\n");
    return f == stdout ? 0 : CLI_USAGE;
}

static int dispatch(const struct cli_entry *t, const char *what, int argc, char **argv)
{
    const char *names[256];
    size_t n = 0;
    for (const struct cli_entry *e = t; e->name; e++) {
        if (!strcmp(e->name, argv[0])) return e->fn(argc, argv);
        if (n < 256) names[n++] = e->name;
    }
    const char *near = sh_closest(argv[0], names, n);
    if (near)
        fprintf(stderr, "shoal: unknown %s \"%s\" (did you mean \"%s\"? run `shoal help` for the list)\n", what,
                argv[0], near);
    else fprintf(stderr, "shoal: unknown %s \"%s\" (run `shoal help` for the list)\n", what, argv[0]);
    return CLI_USAGE;
}

#else
/* Runs shoal-core with the same arguments: $SHOAL_CORE, else shoal-core
 * beside this binary, else ../libexec/shoal/shoal-core (an installed tree). */
static int exec_core(char **argv)
{
    char self[PATH_MAX], path[PATH_MAX + 32];
    /* UCX writes its own log lines to stdout unless told otherwise, which
     * would break a command's --json output (one JSON object on stdout).
     * It reads the setting when its library loads, so it is set here,
     * before shoal-core starts.  A value the user set wins. */
    setenv("UCX_LOG_FILE", "stderr", 0);
    const char *env = getenv("SHOAL_CORE");
    if (env && *env) {
        execv(env, argv);
        fprintf(stderr, "shoal: cannot run SHOAL_CORE=%s: %s\n", env, strerror(errno));
        return 1;
    }
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return fprintf(stderr, "shoal: cannot find my own path: %s\n", strerror(errno)), 1;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    *slash = 0;
    snprintf(path, sizeof path, "%s/shoal-core", self);
    execv(path, argv);
    snprintf(path, sizeof path, "%s/../libexec/shoal/shoal-core", self);
    execv(path, argv);
    fprintf(stderr, "shoal: cannot run %s/shoal-core (%s): the client binary needs shoal-core beside it\n"
                    "hint: build both with `make all`, or set SHOAL_CORE to its path\n", self, strerror(errno));
    return 1;
}
#endif

#ifndef SHOAL_CLIENT
/* Ctrl-C or a kill during a long write (ckpt family, delta apply) would
 * leave OUT.tmp.PID, as large as the model, beside OUT. */
static void on_signal(int sig)
{
    sh_atomic_unlink_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* For SIGINT, SIGTERM and SIGHUP where nobody asked to ignore them; a
 * command with handlers of its own (server, agent, replica) replaces these. */
static void remove_temporaries_on_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction old, sa = {0};
        if (sigaction(sigs[i], NULL, &old) < 0 || old.sa_handler == SIG_IGN) continue;
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}
#endif

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "";
    if (!strcmp(c, "--version")) return printf("shoal %s\n", SHOAL_VERSION), 0;
#ifdef SHOAL_CLIENT
    for (const struct cli_entry *e = commands; e->name; e++)
        if (!strcmp(e->name, c)) return e->fn(argc - 1, argv + 1);
    return exec_core(argv);
#else
    remove_temporaries_on_signals();
    if (argc < 2) return usage(stderr);
    if (!strcmp(c, "--help") || !strcmp(c, "-h") || (!strcmp(c, "help") && argc == 2)) return usage(stdout);
    if (!strcmp(c, "help")) { /* shoal help CMD [SUB]: CMD [SUB] --help */
        char *v[5] = {argv[0], argv[2], argc > 3 ? argv[3] : "--help", argc > 3 ? "--help" : NULL, NULL};
        if (argc > 4) return fprintf(stderr, "usage: shoal help [COMMAND [SUBCOMMAND]]\n"), CLI_USAGE;
        return main(argc > 3 ? 4 : 3, v);
    }
    if (c[0] == '-') { /* the only options before a command */
        static const char *const top[] = {"help", "version", NULL};
        const char *near = c[1] == '-' ? sh_closest(c + 2, top, 2) : NULL;
        if (near) fprintf(stderr, "shoal: unknown option \"%s\" (did you mean --%s?)\n", c, near);
        else fprintf(stderr, "shoal: unknown option \"%s\" (run `shoal help` for the commands)\n", c);
        return CLI_USAGE;
    }
    if (!strcmp(c, "bench")) {
        if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
            fprintf(argc < 3 ? stderr : stdout, "usage: shoal bench <name> [options]\n\n");
            list(argc < 3 ? stderr : stdout, benches, "");
            return argc < 3 ? CLI_USAGE : 0;
        }
        return dispatch(benches, "benchmark", argc - 2, argv + 2);
    }
    return dispatch(commands, "command", argc - 1, argv + 1);
#endif
}
