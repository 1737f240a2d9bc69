/* Command-line options for every command: getopt_long with --opt=value,
 * --help and --version everywhere, the server options of client commands,
 * and "did you mean" for mistyped options. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

/* The common options appended to each command's own. */
static const struct option common_opts[] = {{"help", no_argument, 0, CLI_OPT_HELP},
                                            {"version", no_argument, 0, CLI_OPT_VERSION}};
static const struct option ctl_opts[] = {{"server", required_argument, 0, CLI_OPT_SERVER},
                                         {"token", required_argument, 0, CLI_OPT_TOKEN},
                                         {"json", no_argument, 0, CLI_OPT_JSON}};

static void add(cli_args *a, int *n, const struct option *o, int k)
{
    for (int i = 0; i < k && *n < CLI_MAX_OPTS - 1; i++) a->all[(*n)++] = o[i];
}

static int count(const struct option *o)
{
    int k = 0;
    while (o && o[k].name) k++;
    return k;
}

static void prepare(cli_args *a)
{
    int n = 0;
    add(a, &n, a->opts, count(a->opts));
    add(a, &n, a->more, count(a->more));
    add(a, &n, common_opts, 2);
    if (a->ctl) add(a, &n, ctl_opts, 3);
    memset(&a->all[n], 0, sizeof a->all[n]);
    snprintf(a->optstring, sizeof a->optstring, ":h%s", a->shorts ? a->shorts : "");
    a->ready = 1;
    optind = 0; /* glibc: start a fresh scan (getopt_long keeps state between calls) */
    opterr = 0; /* the messages below name the command and suggest a fix */
}

/* "unknown option --stat (did you mean --state?)" */
static int unknown(cli_args *a, const char *arg, int opt)
{
    if (strncmp(arg, "--", 2)) {
        if (opt) return cli_usage(a->cmd, "unknown option \"-%c\"", opt);
        return cli_usage(a->cmd, "unknown option \"%s\"", arg);
    }
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(arg + 2, "="), arg + 2);
    const char *names[CLI_MAX_OPTS];
    int n = 0, exact = 0, prefixes = 0;
    for (const struct option *o = a->all; o->name; o++) {
        names[n++] = o->name;
        if (!strcmp(o->name, name)) exact = 1;
        if (!strncmp(o->name, name, strlen(name))) prefixes++;
    }
    if (exact && strchr(arg, '=')) return cli_usage(a->cmd, "option --%s takes no value (\"%s\")", name, arg);
    if (prefixes > 1) return cli_usage(a->cmd, "option \"--%s\" is ambiguous: write it in full", name);
    for (const struct option *o = a->elsewhere; o && o->name && !exact; o++)
        if (!strcmp(o->name, name))
            return cli_usage(a->cmd, "unknown option \"--%s\" (another subcommand takes it: see `shoal %.*s --help`)",
                             name, (int)strcspn(a->cmd, " "), a->cmd);
    const char *near = sh_closest(name, names, (size_t)n);
    if (near) return cli_usage(a->cmd, "unknown option \"--%s\" (did you mean --%s?)", name, near);
    return cli_usage(a->cmd, "unknown option \"--%s\"", name);
}

/* --help or -h before a "--": the usage wins over whatever else is wrong
 * on the line (a user adds --help to a command that failed). */
static int wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

int cli_getopt(cli_args *a, int argc, char **argv)
{
    if (!a->ready) {
        prepare(a);
        if (wants_help(argc, argv)) return a->rc = 0, fputs(a->usage, stdout), CLI_OPT_EXIT;
    }
    for (;;) {
        int c = getopt_long(argc, argv, a->optstring, a->all, NULL);
        switch (c) {
        case 'h':
        case CLI_OPT_HELP: a->rc = 0, fputs(a->usage, stdout); return CLI_OPT_EXIT;
        case CLI_OPT_VERSION: a->rc = 0, printf("shoal %s\n", SHOAL_VERSION); return CLI_OPT_EXIT;
        case CLI_OPT_SERVER: a->ctl->server = optarg; continue;
        case CLI_OPT_TOKEN: a->ctl->token = optarg; continue;
        case CLI_OPT_JSON: a->ctl->json = 1; continue;
        case ':': a->rc = cli_usage(a->cmd, "option %s needs a value", argv[optind - 1]); return CLI_OPT_EXIT;
        case '?': a->rc = unknown(a, argv[optind - 1], optopt); return CLI_OPT_EXIT;
        default: return c;
        }
    }
}

int cli_pick(const char *cmd, const char *opt, const char *v, const char *const *allowed)
{
    int n = 0;
    for (; allowed[n]; n++)
        if (!strcmp(allowed[n], v)) return n;
    char list[512] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", allowed[i]);
    const char *near = sh_closest(v, allowed, (size_t)n);
    if (near) cli_usage(cmd, "%s \"%s\" is not one of %s (did you mean %s?)", opt, v, list, near);
    else cli_usage(cmd, "%s \"%s\" is not one of %s", opt, v, list);
    return -1;
}

int cli_int(const char *cmd, const char *opt, const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t x;
    if (sh_parse_i64(v, &x, opt) == SH_OK && x >= lo && x <= hi) return *out = x, 0;
    if (hi == INT64_MAX)
        return cli_usage(cmd, "%s must be an integer >= %" PRId64 ", got \"%s\"", opt, lo, v);
    return cli_usage(cmd, "%s must be %" PRId64 "..%" PRId64 ", got \"%s\"", opt, lo, hi, v);
}

int cli_real(const char *cmd, const char *opt, const char *v, double lo, double hi, const char *what, double *out)
{
    double x;
    if (sh_parse_double(v, &x, opt) == SH_OK && x >= lo && x <= hi) return *out = x, 0;
    return cli_usage(cmd, "%s: expected %s, got \"%s\"", opt, what, v);
}

int cli_size(const char *cmd, const char *opt, const char *v, uint64_t lo, uint64_t *out)
{
    uint64_t x = 0;
    int rc = sh_parse_size(v, &x, opt);
    if (rc == SH_OK && x >= lo) return *out = x, 0;
    if (rc != SH_OK) return cli_usage(cmd, "%s", sh_errmsg());
    return cli_usage(cmd, "%s: expected a size >= %" PRIu64 " (examples: 4096, 256M, 1GiB), got \"%s\"", opt, lo, v);
}

int cli_hostport(const char *cmd, const char *opt, const char *v)
{
    char host[64];
    const char *colon = strrchr(v, ':');
    int64_t port = 0;
    struct in_addr a;
    if (colon && colon > v && (size_t)(colon - v) < sizeof host) {
        memcpy(host, v, (size_t)(colon - v));
        host[colon - v] = 0;
        if (inet_pton(AF_INET, host, &a) == 1 && sh_parse_i64(colon + 1, &port, opt) == 0 && port >= 1 &&
            port <= 65535)
            return 0;
    }
    return cli_usage(cmd, "%s: expected IPV4:PORT with a port 1..65535 (e.g. 10.0.0.1:9470), got \"%s\"", opt, v);
}

int cli_subcommand(const char *cmd, const char *usage, int argc, char **argv, const char *const *names, int *rc)
{
    const char *sub = argc > 1 ? argv[1] : NULL;
    *rc = 0;
    if (!sub) return fputs(usage, stderr), *rc = CLI_USAGE, -1;
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) return fputs(usage, stdout), -1;
    if (!strcmp(sub, "--version")) return printf("shoal %s\n", SHOAL_VERSION), -1;
    int k = cli_pick(cmd, "subcommand", sub, names);
    if (k < 0) *rc = CLI_USAGE;
    return k;
}

const struct option *cli_opts_pick(const struct option *all, const char *keep, struct option *out)
{
    int n = 0;
    for (; all->name && n < CLI_MAX_OPTS - 1; all++)
        if (all->val > 0 && all->val < 256 && strchr(keep, all->val)) out[n++] = *all;
    memset(&out[n], 0, sizeof out[n]);
    return out;
}
