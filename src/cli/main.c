/* shoal: one binary, subcommands like git. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define SH_CMD(name, str)                                                     \
    extern const char cli_help_##name[];                                      \
    int cli_cmd_##name(int argc, char **argv);
#define SH_BENCH(name, str)                                                   \
    extern const char cli_bench_help_##name[];                                \
    int cli_bench_##name(int argc, char **argv);
#include "commands.h"
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
#include "commands.h"
    {NULL, NULL, NULL}};
#undef SH_CMD
#undef SH_BENCH

#define SH_CMD(name, str)
#define SH_BENCH(name, str) {str, cli_bench_help_##name, cli_bench_##name},
static const struct cli_entry benches[] = {
#include "commands.h"
    {NULL, NULL, NULL}};
#undef SH_CMD
#undef SH_BENCH

int cli_fail(const char *cmd, int rc)
{
    fprintf(stderr, "shoal %s: %s\n", cmd, sh_errmsg()[0] ? sh_errmsg() : sh_strerror(rc));
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
    fprintf(f, "\nRun `shoal <command> --help` for a command's options.\n");
    return f == stdout ? 0 : CLI_USAGE;
}

static int dispatch(const struct cli_entry *t, const char *what, int argc, char **argv)
{
    for (const struct cli_entry *e = t; e->name; e++)
        if (!strcmp(e->name, argv[0])) return e->fn(argc, argv);
    fprintf(stderr, "shoal: unknown %s \"%s\" (run `shoal help` for the list)\n", what, argv[0]);
    return CLI_USAGE;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage(stderr);
    const char *c = argv[1];
    if (!strcmp(c, "help") || !strcmp(c, "--help") || !strcmp(c, "-h")) return usage(stdout);
    if (!strcmp(c, "bench")) {
        if (argc < 3 || !strcmp(argv[2], "--help")) {
            fprintf(argc < 3 ? stderr : stdout, "usage: shoal bench <name> [options]\n\n");
            list(argc < 3 ? stderr : stdout, benches, "");
            return argc < 3 ? CLI_USAGE : 0;
        }
        return dispatch(benches, "benchmark", argc - 2, argv + 2);
    }
    return dispatch(commands, "command", argc - 1, argv + 1);
}
