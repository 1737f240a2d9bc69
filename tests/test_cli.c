/* The command line's conventions: getopt_long options (--opt=value, --help
 * and --version everywhere), "did you mean", the client binary that loads
 * no heavy library, and client commands against a real server. */
#include "fleet_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_closest(void **state)
{
    static const char *const names[] = {"submit", "jobs", "job", "logs", "nodes", "cancel", "server", "store", NULL};
    static const struct {
        const char *word, *want;
    } cases[] = {
        {"sbumit", "submit"}, {"jbos", "jobs"},  {"nods", "nodes"}, {"cancle", "cancel"}, {"servre", "server"},
        {"lgos", "logs"},     {"sub", "submit"}, {"xyz", NULL},     {"st", "store"}, {"s", NULL},         {"", NULL},
        {"submarine", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = sh_closest(cases[i].word, names, (size_t)-1);
        if (cases[i].want ? !got || strcmp(got, cases[i].want) : got != NULL)
            fail_msg("\"%s\": got %s, want %s", cases[i].word, got ? got : "NULL", cases[i].want ? cases[i].want : "NULL");
    }
}

/* Runs `shoal ARGS`, asserts the exit status and that the output holds needle. */
static void expect(int status, const char *needle, const char *args)
{
    char *out;
    int rc = tu_run(&out, "%s %s", tu_shoal(), args);
    if (rc != status || !strstr(out, needle))
        fail_msg("shoal %s: exit %d (want %d), output lacks \"%s\":\n%s", args, rc, status, needle, out);
    free(out);
}

static void test_conventions(void **state)
{
    expect(0, "shoal 0.1.0\n", "--version");
    expect(0, "shoal 0.1.0\n", "version --version");
    expect(0, "usage: shoal version", "version --help");
    expect(0, "usage: shoal jobs", "jobs --help");
    expect(0, "usage: shoal submit", "submit -h");
    expect(0, "\"zstd\"", "version --json");
    expect(2, "unknown command \"sbumit\" (did you mean \"submit\"?", "sbumit");
    expect(2, "unknown command \"no-such-command\" (run", "no-such-command");
    expect(2, "unknown option \"--rnak\" (did you mean --rank?)", "logs 1 --rnak=2");
    expect(2, "option --json takes no value", "cancel 1 --json=yes");
    expect(2, "option --idempotency-key needs a value", "submit job.json --idempotency-key");
    expect(2, "unexpected argument \"extra\"", "version extra");
    expect(2, "--state \"bogus\" is not one of pending, starting, running", "jobs --state bogus");
    expect(2, "--state \"runing\" is not one of pending, starting, running, succeeded, failed, cancelled, "
              "active, finished (did you mean running?)", "jobs --state=runing");
    expect(2, "--limit: expected a count >= 1, got \"0\"", "jobs --limit=0");
    expect(2, "expected one job id", "job 1 2");
    expect(2, "shoal job: \"abc\" is not a job id", "job abc");
    expect(2, "shoal cancel: expected a job id", "cancel");
    expect(2, "shoal logs: \"-3\" is not a job id", "logs -- -3");
    /* An output path that is a directory is refused before any work, not
     * at the final rename ("Device or resource busy" for "."). */
    expect(1, "shoal ckpt synth: . is a directory; give the path of a file", "ckpt synth --params 1M -o .");
    /* delta make's summary is its result: on stdout. */
    char dm[8192];
    snprintf(dm, sizeof dm, "ckpt synth --params 1M -o %s && $SHOAL_BIN ckpt step %s --lr 1e-3 -o %s && "
             "$SHOAL_BIN delta make %s %s -o %s 2>/dev/null", tu_path("dm0.st"), tu_path("dm0.st"), tu_path("dm1.st"),
             tu_path("dm0.st"), tu_path("dm1.st"), tu_path("dm.delta"));
    expect(0, "delta make: ", dm);
    /* Commands that live in shoal-core answer through the client too. */
    expect(0, "usage: shoal <command>", "help");
    expect(0, "usage: shoal rl train", "help rl train");
    expect(0, "usage: shoal bench push", "help bench push");
    expect(2, "unknown option \"--hlep\" (did you mean --help?)", "--hlep");
    expect(0, "usage: shoal store", "store --help");
    /* --help and --version after a subcommand, in commands that parse by hand. */
    expect(0, "usage: shoal store publish", "store publish --help");
    expect(0, "usage: shoal delta make", "delta make x y --help");
    expect(0, "usage: shoal agent", "agent --gpus=many --bogus-opt --help"); /* --help wins */
    expect(2, "shoal store ls: unknown option \"--keep\" (another subcommand takes it: see `shoal store --help`)",
           "store ls x --keep 3");
    /* A replica whose parent cannot be reached says which and why. */
    char rep[4300];
    snprintf(rep, sizeof rep, "replica --dir %s --parent 127.0.0.1:1 --until 1 --seconds 2", tu_path("rep-unreachable"));
    expect(1, "version 1 not reached (have 0): parent 127.0.0.1:1: ", rep);
    /* A listen port another process holds: the message says so and which
     * option picks another (UCX alone says "Device is busy"). */
    int held;
    int lfd = tu_hold_port(&held);
    snprintf(rep, sizeof rep, "store publish %s %s >/dev/null && $SHOAL_BIN push serve --store %s --listen 127.0.0.1:%d "
             "--seconds 1", tu_path("busy-store"), tu_path("dm0.st"), tu_path("busy-store"), held);
    expect(1, "hint: another process holds that port: give another with --listen HOST:PORT", rep);
    close(lfd);
    expect(1, "shoal rl report: /nonexistent/run is not a folder", "rl report --dir /nonexistent/run");
    /* A trace pattern the shell left unexpanded (nothing matches it). */
    expect(2, "shoal sim: no trace matches /nonexistent/traces/*.trace (the shell passes a pattern",
           "sim --fleet x --policy all /nonexistent/traces/*.trace");
    /* An agent whose server cannot be reached says so (once) while it retries. */
    expect(124, "agent x: cannot register: http://127.0.0.1:1: cannot connect",
           "agent --server http://127.0.0.1:1 --token t --name x --gpus 1 --gpu-type H100 2>&1 & "
           "p=$!; sleep 1.5; kill $p; wait $p; exit 124");
    expect(0, "shoal 0.1.0\n", "server --version");
    expect(0, "shoal 0.1.0\n", "push serve --version");
}

/* Every command and subcommand, with one of its long options.  The test
 * reads the command list from `shoal help` and the subcommands from
 * cli_subcommand's error, so a command or subcommand added without a row
 * here fails it. */
static const struct {
    const char *cmd, *sub, *opt;
} opt_rows[] = {
    {"agent", NULL, "name"},          {"cancel", NULL, "server"},        {"ckpt", "synth", "params"},
    {"ckpt", "step", "steps"},        {"ckpt", "family", "layers"},      {"ckpt", "next", "steps"},
    {"ckpt", "inspect", "tensors"},   {"cost", NULL, "token"},           {"delta", "make", "json"},
    {"delta", "apply", "in-place"},   {"delta", "squash", "json"},       {"delta", "inspect", "json"},
    {"job", NULL, "server"},          {"jobs", NULL, "state"},           {"logs", NULL, "rank"},
    {"nodes", NULL, "server"},        {"provider-local", NULL, "dir"},   {"push", "serve", "store"},
    {"push", "relay", "parent"},      {"quant", "fp8", "update"},        {"replica", NULL, "parent"},      {"run", NULL, "steps"},
    {"rl", "train", "steps"},         {"rl", "sweep", "losses"},         {"rl", "trainer", "store"},
    {"rl", "worker", "speeds"},       {"rl", "push-root", "push"},       {"rl", "report", "timeout"},       {"rl", "fleet-cost", "fleet"},
    {"server", NULL, "tokens"},       {"sim", NULL, "fleet"},            {"sim", "push", "replicas"},
    {"store", "publish", "anchor-every"}, {"store", "ls", "json"},       {"store", "gc", "keep"},
    {"store", "plan", "from"},        {"store", "verify", "version"},    {"store", "squash", "from"},
    {"submit", NULL, "idempotency-key"}, {"up", NULL, "fleet"},          {"version", NULL, "json"},
    {"bench client", NULL, "runs"},   {"bench control", NULL, "starts"}, {"bench delta", NULL, "params"},
    {"bench push", NULL, "replicas"}, {"bench rl", NULL, "reps"},        {"bench scale", NULL, "layers"},
    {"bench sched", NULL, "nodes"},   {"bench write", NULL, "reps"},     {"bench follow", NULL, "versions"},
    {"down", NULL, "timeout"},
    {"service", "publish", "run"},    {"service", "lookup", "timeout"},  {"service", "ls", "run"},
};

/* Value options, each given a bad value as --opt=value and as --opt value:
 * both must reach the option's own check, which names it and the value. */
static const struct {
    const char *args, *opt, *val, *want;
} value_rows[] = {
    {"agent", "--gpus", "x", "--gpus must be 0..64, got \"x\""},
    {"server", "--port", "99999", "--port must be 0..65535, got \"99999\""},
    {"down", "--timeout", "x", "--timeout: expected seconds 0..3600, got \"x\""},
    {"up", "--sandbox", "bwarp", "--sandbox \"bwarp\" is not one of auto, bwrap, gvisor, none (did you mean bwrap?)"},
    {"jobs", "--limit", "0", "--limit: expected a count >= 1, got \"0\""},
    {"store plan x", "--to", "x", "--to: \"x\" is not a non-negative integer"},
    {"store gc x", "--keep", "0", "--keep: expected a count >= 1, got \"0\""},
    {"push serve", "--chunk", "1", "--chunk: expected a size >= 4096"},
    {"replica --dir d", "--seconds", "-1", "--seconds: expected seconds >= 0, got \"-1\""},
    {"replica --dir d", "--parent", "127.0.0.1:99999", "--parent: expected IPV4:PORT with a port 1..65535"},
    {"push relay", "--parent", "1.2.3.4", "--parent: expected IPV4:PORT with a port 1..65535"},
    {"ckpt synth -o x", "--params", "many", "--params: \"many\" is not a size"},
    {"ckpt family llama3-8b -o x", "--layers", "0", "--layers: expected at least 1, got \"0\""},
    {"rl train", "--mode", "later", "--mode \"later\": expected sync or async"},
    {"rl fleet-cost", "--seeds", "0", "--seeds must be 1..32, got \"0\""},
    {"sim push", "--replicas", "-1", "--replicas must be 0..10000000, got \"-1\""},
    {"sim push", "--zones", "0", "shoal sim push: push model: 0 zones: must be 1..16 (the replicas)"},
    {"bench control", "--clients", "65", "--clients must be 1..64, got \"65\""},
    {"bench push", "--topology", "stra", "--topology \"stra\" is not one of tree, star, store (did you mean star?)"},
    {"bench follow", "--step", "flp", "--step \"flp\" is not one of adamw, flip (did you mean flip?)"},
    {"sim --fleet mixed:8 --format mixed", "--preempt-wait", "-1", "--preempt-wait: expected a number >= 0, got \"-1\""},
    {"sim --fleet mixed:8 --format mixed", "--jobs", "0", "--jobs must be an integer >= 1, got \"0\""},
    {"sim --fleet mixed:8", "--quota", "z,f,t,eight,1,1,1", "--quota gpus must be 1..1024, got \"eight\""},
    {"bench sched --mix", "--nodes", "50", "--nodes must be 100..1000000, got \"50\""},
    {"bench sched --mix", "--load", "0", "--load: expected a load in (0, 10], got \"0\""},
};

/* Whole command lines: a value missing at the end, and runs small enough
 * for every build, with --opt=value and --opt value. */
static const struct {
    const char *args;
    int status;
    const char *want;
} line_rows[] = {
    {"sim --fleet mixed:8 --format mixed --jobs", 2, "shoal sim: option --jobs needs a value"},
    {"sim --fleet", 2, "shoal sim: option --fleet needs a value"},
    {"sim --format mixed --jobs 5", 2, "shoal sim: --fleet is required"},
    {"bench sched --mix --nodes", 2, "shoal bench sched: option --nodes needs a value"},
    {"bench sched --mix x", 2, "shoal bench sched: unexpected argument \"x\""},
    {"sim --fleet mixed:8 --format mixed --jobs 10 --policy bogus", 2,
     "shoal sim: unknown --policy \"bogus\" (use fifo, firstfit, backfill, shoal or all)"},
    {"bench sched --seed 3", 2, "shoal bench sched: --seed applies to the mixed replay: add --mix"},
    {"bench sched --mix --batch 5", 2, "shoal bench sched: --batch applies without --mix only"},
    {"sim --fleet=mixed:16 --format mixed --jobs=40 --seed 3 --preempt-wait=0.25 --json", 0, "\"jobs_total\":40,"},
    {"sim --fleet mixed:16 --format=mixed --jobs 40 --policy=all", 0, "backfill"},
    {"bench sched --mix --nodes=100 --jobs 300 --load=0.9 --json", 0, "\"shoal_vs_backfill\":"},
};

/* The names listed under `heading` in `shoal help`, with prefix. */
static int listed(const char *help, const char *heading, const char *prefix, char names[][64], int cap)
{
    int n = 0;
    const char *l = strstr(help, heading);
    for (l = l ? strchr(l, '\n') : NULL; l && l[1] == ' ' && n < cap; l = strchr(l + 1, '\n')) {
        char w[48];
        sscanf(l + 1, " %47s", w);
        snprintf(names[n++], 64, "%s%s", prefix, w);
    }
    return n;
}

/* The subcommands cli_subcommand names when asked for one it lacks; "" if
 * the command has none that way. */
static void subcommands(const char *cmd, char *list, size_t cap)
{
    static const char key[] = "subcommand \"zz-no-such\" is not one of ";
    char *out;
    tu_run(&out, "%s %s zz-no-such </dev/null", tu_shoal(), cmd);
    const char *p = strstr(out, key);
    *list = 0;
    if (p) {
        p += strlen(key);
        int len = (int)strcspn(p, "(\n");
        while (len && p[len - 1] == ' ') len--;
        snprintf(list, cap, "%.*s", len, p);
    }
    free(out);
}

/* Under ASan each run of the binary costs half a second: the sanitised
 * build checks every sixth row (the parsing is the same code), the
 * optimised one every row and the coverage of the command table. */
#if defined(__SANITIZE_ADDRESS__)
#define STRIDE 6
#else
#define STRIDE 1
#endif

static void test_every_command_options(void **state)
{
    char *help;
    assert_int_equal(tu_run(&help, "%s help 2>/dev/null", tu_shoal()), 0);
    static char cmds[128][64];
    int n = listed(help, "commands:\n", "", cmds, 128);
    n += listed(help, "benchmarks (shoal bench <name>):\n", "bench ", cmds + n, 128 - n);
    free(help);
    assert_true(n >= 25);
    int covered = 0;
    for (int c = 0; c < n && STRIDE == 1; c++) {
        char want[1024] = "", have[1024] = "";
        int rows = 0;
        for (size_t r = 0; r < sizeof opt_rows / sizeof opt_rows[0]; r++) {
            if (strcmp(opt_rows[r].cmd, cmds[c])) continue;
            rows++;
            if (opt_rows[r].sub && opt_rows[r].opt && strcmp(cmds[c], "sim"))
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", *want ? ", " : "", opt_rows[r].sub);
        }
        if (!rows) fail_msg("`shoal %s` has no row in opt_rows (tests/test_cli.c): add its options' checks", cmds[c]);
        covered += rows;
        subcommands(cmds[c], have, sizeof have);
        if (*have && strcmp(have, want))
            fail_msg("`shoal %s` has subcommands %s, opt_rows covers %s", cmds[c], have, want);
    }
    /* Every row names a command that exists. */
    if (STRIDE == 1) assert_int_equal(covered, (int)(sizeof opt_rows / sizeof opt_rows[0]));
    for (size_t r = 0; r < sizeof opt_rows / sizeof opt_rows[0]; r += STRIDE) {
        char cmd[128], args[512];
        snprintf(cmd, sizeof cmd, "%s%s%s", opt_rows[r].cmd, opt_rows[r].sub ? " " : "",
                 opt_rows[r].sub ? opt_rows[r].sub : "");
        /* --help: the usage on stdout, naming the command and subcommand. */
        char usage[160], *out;
        snprintf(usage, sizeof usage, "usage: shoal %s", opt_rows[r].cmd);
        int rc = tu_run(&out, "%s %s --help 2>/dev/null", tu_shoal(), cmd);
        snprintf(args, sizeof args, "shoal %s", cmd);
        if (rc || !strstr(out, usage) || !strstr(out, args))
            fail_msg("shoal %s --help: exit %d, stdout lacks \"%s\" or \"%s\":\n%s", cmd, rc, usage, args, out);
        free(out);
        /* An unknown option is named, with the command. */
        snprintf(args, sizeof args, "%s --bogus-opt", cmd);
        snprintf(usage, sizeof usage, "shoal %s: unknown option \"--bogus-opt\"", opt_rows[r].sub ? cmd : opt_rows[r].cmd);
        if (!opt_rows[r].opt) snprintf(usage, sizeof usage, "unknown option \"--bogus-opt\"");
        expect(2, usage, args);
        if (!opt_rows[r].opt) continue;
        /* A near miss (two letters swapped) gets the option it missed. */
        char typo[64], hint[96];
        snprintf(typo, sizeof typo, "%s", opt_rows[r].opt);
        int k = typo[1] == typo[2] ? 2 : 1;
        char t = typo[k];
        typo[k] = typo[k + 1], typo[k + 1] = t;
        snprintf(args, sizeof args, "%s --%s=1", cmd, typo);
        snprintf(hint, sizeof hint, "unknown option \"--%s\" (did you mean --%s?)", typo, opt_rows[r].opt);
        expect(2, hint, args);
    }
    for (size_t r = 0; r < sizeof line_rows / sizeof line_rows[0]; r += STRIDE) {
        char args[512];
        snprintf(args, sizeof args, "%s 2>&1", line_rows[r].args);
        expect(line_rows[r].status, line_rows[r].want, args);
    }
    for (size_t r = 0; r < sizeof value_rows / sizeof value_rows[0]; r += STRIDE) {
        char args[512];
        snprintf(args, sizeof args, "%s %s=%s", value_rows[r].args, value_rows[r].opt, value_rows[r].val);
        expect(2, value_rows[r].want, args);
        snprintf(args, sizeof args, "%s %s %s", value_rows[r].args, value_rows[r].opt, value_rows[r].val);
        expect(2, value_rows[r].want, args);
    }
}

/* A command killed while it writes a large file leaves no OUT.tmp.PID
 * (a 16 GB one for llama3-8b) behind: shoal-core's SIGTERM handler removes
 * the temporaries of its open atomic files. */
static void test_killed_write_leaves_no_temporary(void **state)
{
    const char *out = tu_path("killed.safetensors");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(tu_shoal(), "shoal", "ckpt", "family", "llama3-8b", "-o", out, (char *)NULL);
        _exit(127);
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)pid); /* shoal execs shoal-core: the same pid */
    for (int i = 0; i < 2000 && !sh_path_exists(tmp); i++) usleep(5000);
    int seen = sh_path_exists(tmp);
    kill(pid, SIGTERM);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    int left = sh_path_exists(tmp);
    unlink(tmp);
    unlink(out);
    if (!seen) fail_msg("%s never appeared", tmp);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGTERM) fail_msg("ckpt family was not ended by SIGTERM: status %d", st);
    if (left) fail_msg("%s is left behind after SIGTERM", tmp);
}

/* A server started outside the source tree (its working directory has no
 * web/) still serves the dashboard: the build's, found beside the binary. */
static void test_dashboard_from_elsewhere(void **state)
{
    char shoal[4096], tokens[4200], db[4200], out[4200];
    assert_non_null(realpath(tu_shoal(), shoal));
    snprintf(tokens, sizeof tokens, "%s", tu_path("web-tokens.json"));
    TU_OK(sh_mkdir_p(tu_path("web-state"), 0700));
    snprintf(db, sizeof db, "%s", tu_path("web-state/shoal.db"));
    snprintf(out, sizeof out, "%s", tu_path("web-server.out"));
    const char *t = "{\"admin\":\"" TF_ADMIN "\",\"agent\":\"" TF_AGENT "\",\"tenants\":{}}";
    tu_write_file(tokens, t, strlen(t));
    chmod(tokens, 0600);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || chdir(tu_tmpdir()) < 0) _exit(127);
        dup2(fd, 1), dup2(fd, 2);
        execl(shoal, "shoal", "server", "--tokens", tokens, "--db", db, "--port", "0", (char *)NULL);
        _exit(127);
    }
    int port = 0;
    for (int i = 0; i < 400 && !port; i++) {
        char *text;
        if (sh_read_file(out, 1 << 20, &text, NULL) == 0) {
            char *l = strstr(text, "listening on http://127.0.0.1:");
            if (l) port = atoi(l + 30);
            free(text);
        }
        if (!port) sh_sleep(0.025);
    }
    char url[64], *body = NULL;
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    client_conn *c;
    int st = 0;
    size_t len;
    if (port && client_new(url, NULL, &c) == 0) {
        (void)client_raw(c, "GET", "/", NULL, 0, NULL, 10, &st, &body, &len);
        client_free(c);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    if (!port) fail_msg("the server did not start (see %s)", out);
    if (st != 200 || !body || !strstr(body, "<title>shoal")) fail_msg("GET / from a server started in %s: %d %s", tu_tmpdir(), st, body ? body : "");
    free(body);
}

/* The client binary links neither UCX, OpenBLAS, SQLite nor libmicrohttpd. */
static void test_client_is_lean(void **state)
{
    char *out;
    assert_int_equal(tu_run(&out, "ldd %s", tu_shoal()), 0);
    static const char *const heavy[] = {"libucp", "libuct", "libucs", "libopenblas", "libgfortran", "libsqlite3",
                                        "libmicrohttpd", "libgnutls"};
    for (size_t i = 0; i < sizeof heavy / sizeof heavy[0]; i++)
        if (strstr(out, heavy[i])) fail_msg("%s loads %s:\n%s", tu_shoal(), heavy[i], out);
    free(out);
    /* shoal-core, beside it, does (it is the binary that needs them). */
    assert_int_equal(tu_run(&out, "ldd %s-core", tu_shoal()), 0);
    assert_non_null(strstr(out, "libucp"));
    free(out);
    /* The bench that measures it runs (small counts: figures are for make bench). */
    assert_int_equal(tu_run(&out, "%s bench client --runs 4 --submits 4 --json 2>/dev/null", tu_shoal()), 0);
    json_t *j = json_loads(out, 0, NULL);
    if (!j || !(json_real_value(json_object_get(j, "submits_per_s")) > 0) ||
        !(json_real_value(json_object_get(j, "version_ms")) > 0))
        fail_msg("bench client --json: %s", out);
    json_decref(j);
    free(out);
    /* A missing shoal-core is named, with the fix. */
    expect(1, "SHOAL_CORE", "help 2>&1; SHOAL_CORE=/nonexistent/shoal-core $SHOAL_BIN help");
    /* bench write times each way of writing a model file, and names a
     * folder it cannot use. */
    assert_int_equal(tu_run(&out, "%s bench write --mb 4 --reps 1 --dir %s --json 2>/dev/null", tu_shoal(),
                            tu_tmpdir()), 0);
    j = json_loads(out, 0, NULL);
    static const char *const ways[] = {"pwrite_recycled", "pwrite_new", "map_kept", "map_kept_after", "map_new"};
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++)
        if (!j || !(json_real_value(json_object_get(json_object_get(j, ways[i]), "cpu_ms")) > 0))
            fail_msg("bench write --json: no %s in %s", ways[i], out);
    assert_int_equal(json_integer_value(json_object_get(j, "bytes")), 4000000);
    json_decref(j);
    free(out);
    expect(1, "/nonexistent", "bench write --dir /nonexistent --reps 1 2>&1");
}

/* The man page and bash completion come from the help text: every command
 * has a section, and completion offers commands and each one's options. */
static void test_man_and_completion(void **state)
{
    char *man, *help;
    assert_int_equal(tu_run(&man, "sh scripts/gen-man.sh %s 0.1.0", tu_shoal()), 0);
    assert_int_equal(tu_run(&help, "%s help", tu_shoal()), 0);
    assert_non_null(strstr(man, ".TH SHOAL 1"));
    int n = 0;
    for (char *l = strstr(help, "commands:\n"); l && (l = strchr(l, '\n')) && l[1] == ' '; n++) {
        char name[64], want[80];
        sscanf(l + 1, " %63s", name);
        snprintf(want, sizeof want, ".SS %s\n", name);
        if (!strstr(man, want)) fail_msg("the man page lacks a section for %s", name);
        l++;
    }
    assert_true(n >= 15);
    assert_non_null(strstr(man, "usage: shoal submit JOB.json"));
    assert_non_null(strstr(man, "usage: shoal rl train [options] [--json]")); /* a subcommand's own usage */
    free(man);
    free(help);
    char *out;
    assert_int_equal(tu_run(&out, "PATH=$(dirname $(realpath %s)):$PATH bash -c '. scripts/shoal-completion.bash; "
                                  "COMP_WORDS=(shoal subm); COMP_CWORD=1; _shoal; echo \"1:${COMPREPLY[*]}\"; "
                                  "COMP_WORDS=(shoal jobs --st); COMP_CWORD=2; _shoal; echo \"2:${COMPREPLY[*]}\"; "
                                  "COMP_WORDS=(shoal store pub); COMP_CWORD=2; _shoal; echo \"3:${COMPREPLY[*]}\"; "
                                  "COMP_WORDS=(shoal rl train --max-l); COMP_CWORD=3; _shoal; echo \"4:${COMPREPLY[*]}\"'",
                            tu_shoal()),
                     0);
    if (!strstr(out, "1:submit\n") || !strstr(out, "2:--state\n") || !strstr(out, "3:publish\n") ||
        !strstr(out, "4:--max-lag\n"))
        fail_msg("completion: %s", out);
    free(out);
}

/* The value of the Prometheus sample whose name and labels are `series`. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; (p = strstr(p, series)); p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ') return atof(p + n + 1);
    fail_msg("/metrics lacks %s:\n%s", series, text);
    return -1;
}

static char *get_metrics(tf_fleet *F, const char *token, int want)
{
    client_conn *c;
    TU_OK(client_new(F->url, token, &c));
    int st;
    char *text;
    size_t len;
    TU_OK(client_raw(c, "GET", "/metrics", NULL, 0, NULL, 10, &st, &text, &len));
    client_free(c);
    assert_int_equal(st, want);
    return text;
}

/* After one 1-node job ran: build info, histograms that count it, alice's
 * cost, and GPU gauges that sum to the fleet. */
static void check_metrics(tf_fleet *F)
{
    /* Bills need a token: anyone on the network (a rank on the host
     * network too) sees the fleet's figures but no tenant's bill; a tenant
     * sees its own; a wrong token is refused. */
    char *text = get_metrics(F, NULL, 200);
    assert_null(strstr(text, "tenant="));
    assert_non_null(strstr(text, "shoal_gpus{state=\"used\"}"));
    free(text);
    text = get_metrics(F, TF_BOB, 200);
    assert_null(strstr(text, "tenant=\"alice\""));
    free(text);
    free(get_metrics(F, "not-a-token", 401));
    text = get_metrics(F, TF_ALICE, 200);
    assert_true(sample(text, "shoal_cost_dollars_total{tenant=\"alice\",gpu_type=\"H100\"}") > 0);
    free(text);
    text = get_metrics(F, TF_ADMIN, 200);
    assert_true(sample(text, "shoal_build_info{version=\"" SHOAL_VERSION "\"}") == 1);
    assert_true(sample(text, "shoal_gang_start_seconds_count{nodes=\"1\"}") >= 1);
    assert_true(sample(text, "shoal_gang_start_seconds_bucket{nodes=\"1\",le=\"+Inf\"}") >= 1);
    assert_true(sample(text, "shoal_gang_start_seconds_count{nodes=\"2-4\"}") == 0);
    assert_true(sample(text, "shoal_queue_wait_seconds_count{nodes=\"1\"}") >= 1);
    assert_true(sample(text, "shoal_queue_wait_seconds_bucket{nodes=\"1\",le=\"+Inf\"}") ==
                sample(text, "shoal_queue_wait_seconds_count{nodes=\"1\"}"));
    assert_true(sample(text, "shoal_cost_dollars_total{tenant=\"alice\",gpu_type=\"H100\"}") > 0);
    assert_true(sample(text, "shoal_gpu_seconds_total{tenant=\"alice\",gpu_type=\"H100\"}") > 0);
    /* One alive node with 2 GPUs: used + free is 2, whatever runs. */
    assert_true(sample(text, "shoal_gpus{state=\"used\"}") + sample(text, "shoal_gpus{state=\"free\"}") == 2);
    if (strstr(text, "state=\"total\"")) fail_msg("a \"total\" series sits beside its parts:\n%s", text);
    free(text);
}

/* Client commands against a real server: --opt=value, idempotent submits,
 * logs --json, a mistyped job-file field, sub-second times. */
static void test_client_commands(void **state)
{
    tf_fleet F;
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "cli", 30);
    tf_start_agents(&F, 1, "H100", 2, "z1", "ib");
    const char *job = tu_path("job.json"), *typo = tu_path("typo.json");
    const char *body = "{\"name\":\"hello\",\"kind\":\"function\",\"gpus\":1,\"command\":[\"sh\",\"-c\",\"echo hello-from-rank\"]}";
    tu_write_file(job, body, strlen(body));
    const char *bad = "{\"name\":\"t\",\"kind\":\"function\",\"gpus\":1,\"comand\":[\"true\"]}";
    tu_write_file(typo, bad, strlen(bad));
    char args[1024], *out;
    snprintf(args, sizeof args, "submit --idempotency-key=k1 %s --server=%s --token=%s --json", job, F.url, TF_ALICE);
    char *first;
    assert_int_equal(tu_run(&first, "%s %s", tu_shoal(), args), 0);
    json_t *j = json_loads(first, 0, NULL);
    assert_non_null(j);
    int64_t id = json_integer_value(json_object_get(j, "id"));
    assert_true(id > 0);
    json_decref(j);
    expect(0, "\"duplicate\":true", args);
    snprintf(args, sizeof args, "jobs --limit=5 --state=active --server=%s --token=%s --json", F.url, TF_ALICE);
    expect(0, "\"jobs\":[", args);
    /* A wrong token is named, without the hint to pass one; a missing one
     * gets the hint. */
    snprintf(args, sizeof args, "jobs --server=%s --token=not-a-token 2>&1", F.url);
    assert_int_equal(tu_run(&out, "%s %s", tu_shoal(), args), 1);
    if (!strstr(out, "unknown bearer token") || strstr(out, "hint:")) fail_msg("jobs with a wrong token:\n%s", out);
    free(out);
    snprintf(args, sizeof args, "jobs --server=%s 2>&1", F.url);
    assert_int_equal(tu_run(&out, "env -u SHOAL_TOKEN %s %s", tu_shoal(), args), 1);
    if (!strstr(out, "hint: pass --token TOKEN or set SHOAL_TOKEN")) fail_msg("jobs without a token:\n%s", out);
    free(out);
    /* The table says its GPU column counts per node. */
    snprintf(args, sizeof args, "jobs --server=%s --token=%s", F.url, TF_ALICE);
    expect(0, " NODES GPU/N ATTEMPT ", args);
    free(first);
    json_decref(tf_wait_job(&F, id, "succeeded", 30));
    snprintf(args, sizeof args, "logs %lld --server %s --token %s --json", (long long)id, F.url, TF_ALICE);
    assert_int_equal(tu_run(&out, "%s %s", tu_shoal(), args), 0);
    j = json_loads(out, 0, NULL);
    if (!j || !strstr(json_string_value(json_object_get(j, "data")), "hello-from-rank"))
        fail_msg("logs --json: %s", out);
    assert_true(json_is_true(json_object_get(j, "done")));
    json_decref(j);
    free(out);
    /* Cancelling a job that has ended says so. */
    snprintf(args, sizeof args, "cancel %lld --server=%s --token=%s", (long long)id, F.url, TF_ALICE);
    char ended[64];
    snprintf(ended, sizeof ended, "job %lld had already succeeded; nothing to cancel\n", (long long)id);
    expect(0, ended, args);
    /* Times carry fractions of a second. */
    snprintf(args, sizeof args, "job %lld --server=%s --token=%s --json", (long long)id, F.url, TF_ALICE);
    assert_int_equal(tu_run(&out, "%s %s", tu_shoal(), args), 0);
    j = json_loads(out, 0, NULL);
    double t = json_real_value(json_object_get(j, "submitted_at")), ts = json_real_value(json_object_get(j, "started_at"));
    if (!(t > 1.7e9) || (t == (double)(int64_t)t && ts == (double)(int64_t)ts))
        fail_msg("submitted_at %.6f and started_at %.6f are whole seconds: %s", t, ts, out);
    json_decref(j);
    free(out);
    /* The events table: a message without a node starts in its column. */
    snprintf(args, sizeof args, "job %lld --server=%s --token=%s", (long long)id, F.url, TF_ALICE);
    expect(0, "  submitted      hello by alice\n", args);
    /* A rank the job cannot have is an error, not an empty log. */
    snprintf(args, sizeof args, "logs %lld --rank 5 --server %s --token %s", (long long)id, F.url, TF_ALICE);
    expect(1, "has 1 rank(s), 0..0; there is no rank 5", args);
    snprintf(args, sizeof args, "submit %s --server %s --token %s", typo, F.url, TF_ALICE);
    char named[4200];
    snprintf(named, sizeof named, "shoal submit: %s: unknown field \"comand\" (did you mean \"command\"?)", typo);
    expect(1, named, args);
    check_metrics(&F);
    tf_stop(&F);
}

/* `shoal rl report --json` prints every count as an integer (was: versions
 * 8.0, full_bytes 65536.0) and means as numbers, from a run folder
 * written by hand: a trainer's result and one push-tree line. */
static void test_rl_report_counts(void **state)
{
    const char *run = tu_path("rl-run");
    char p[4200];
    sh_rm_rf(run);
    snprintf(p, sizeof p, "%s/push", run);
    sh_mkdir_p(p, 0755);
    const char *res = "{\"store_versions\":8,\"store_bytes_total\":123456.0,\"weights_bytes_sent\":1000,"
                      "\"weights_delta_bytes_mean\":2048.5,\"weights_image_bytes\":65536,\"final_version\":8,"
                      "\"final_image_xxh3\":\"ab\",\"dropped_stale\":2,\"refused_requests\":1,\"reward_start\":0.1,"
                      "\"reward_end\":0.9,\"workers\":[{\"push\":true,\"final\":{\"version\":8,\"image_xxh3\":\"ab\"}},"
                      "{\"push\":false,\"final\":{\"version\":8,\"image_xxh3\":\"ab\"}}]}";
    snprintf(p, sizeof p, "%s/result.json", run);
    tu_write_file(p, res, strlen(res));
    const char *root = "{\"name\":\"root\",\"zone\":\"za\",\"addr\":\"10.0.0.1:5\"}";
    snprintf(p, sizeof p, "%s/push/root.json", run);
    tu_write_file(p, root, strlen(root));
    const char *line = "{\"name\":\"w0\",\"zone\":\"zb\",\"addr\":\"10.0.0.2:6\",\"parent\":\"10.0.0.1:5\",\"store_version\":8}\n";
    snprintf(p, sizeof p, "%s/push/tree.jsonl", run);
    tu_write_file(p, line, strlen(line));
    /* A fleet-cost pool whose L4s ask for one prompt at a time. */
    const char *fc = "{\"mixed\":{\"workers\":\"1xL4+1xA100\",\"per_type\":{\"L4\":{\"request_prompts\":1,"
                     "\"concurrency\":8},\"A100\":{\"request_prompts\":6,\"concurrency\":48}}}}";
    snprintf(p, sizeof p, "%s/fleet-cost.json", run);
    tu_write_file(p, fc, strlen(fc));
    char *out;
    assert_int_equal(tu_run(&out, "%s rl report --dir %s --json", tu_shoal(), run), 0);
    json_t *j = json_loads(out, 0, NULL);
    if (!j) fail_msg("rl report --json printed no JSON: %s", out);
    static const char *const counts[] = {"versions", "zones", "workers", "workers_on_push_tree", "workers_at_end",
                                         "full_bytes", "versions_in_tree_log", "dropped_stale", "refused_requests",
                                         "final_version", "workers_direct"};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
        if (!json_is_integer(json_object_get(j, counts[i]))) fail_msg("%s is not an integer: %s", counts[i], out);
    assert_int_equal(json_integer_value(json_object_get(j, "versions")), 8);
    assert_int_equal(json_integer_value(json_object_get(j, "full_bytes")), 65536);
    assert_true(json_number_value(json_object_get(j, "delta_bytes_mean")) == 2048.5);
    json_decref(j);
    free(out);
    size_t len = 0;
    snprintf(p, sizeof p, "%s/report.html", run);
    char *html = (char *)tu_read_file(p, &len);
    html = realloc(html, len + 1), html[len] = 0;
    if (!strstr(html, "L4: 1 prompt, 8 at once") || !strstr(html, "A100: 6 prompts, 48 at once"))
        fail_msg("the fleet-cost table's per-type cell is not as expected");
    free(html);
}

/* A second `shoal up` on the same state folder (a newcomer picking another
 * port after "port in use") is refused, naming the first, and leaves the
 * first one's env alone. */
static void test_up_twice(void **state)
{
    const char *fleet = tu_path("up-fleet.csv"), *db = tu_path("up-state/shoal.db"), *env = tu_path("up-state/env");
    const char *csv = "name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn0,H100,1,z,f,1\n";
    tu_write_file(fleet, csv, strlen(csv));
    char *out;
    assert_int_equal(tu_run(&out, "%s up --fleet %s --db %s --port 0 --sandbox none >%s 2>&1 & echo $!", tu_shoal(),
                            fleet, db, tu_path("up-first.log")), 0);
    pid_t first = (pid_t)atoi(out);
    free(out);
    assert_true(first > 0);
    for (int i = 0; i < 200 && !sh_path_exists(env); i++) sh_sleep(0.05);
    assert_true(sh_path_exists(env));
    size_t n0 = 0, n1 = 0;
    uint8_t *env0 = tu_read_file(env, &n0);
    char want[4300];
    snprintf(want, sizeof want, "shoal up: another shoal up (pid %d) runs on %s", (int)first, tu_path("up-state"));
    int rc = tu_run(&out, "%s up --fleet %s --db %s --port 0 --sandbox none 2>&1", tu_shoal(), fleet, db);
    kill(first, SIGTERM);
    if (rc != 1 || !strstr(out, want) || !strstr(out, "--db DIR/shoal.db"))
        fail_msg("a second shoal up on one folder: exit %d:\n%s", rc, out);
    free(out);
    uint8_t *env1 = tu_read_file(env, &n1);
    assert_true(n0 == n1 && !memcmp(env0, env1, n0));
    free(env0), free(env1);
    for (int i = 0; i < 200 && !kill(first, 0); i++) sh_sleep(0.05);
}

/* Off a terminal (a log, a pipe, CI), long work prints a line once it has
 * run SHOAL_PROGRESS_AFTER seconds (5 by default; the test runner sets 600)
 * and at each further tenth, then how long it took; short work prints
 * nothing (was: nothing at all, so `ckpt synth` of a large model piped to a
 * log said nothing for minutes). */
static void test_progress_off_terminal(void **state)
{
    char *out;
    const char *f = tu_path("progress.safetensors");
    assert_int_equal(tu_run(&out, "SHOAL_PROGRESS_AFTER=0 %s ckpt synth --params 4M -o %s 2>&1 >/dev/null", tu_shoal(), f), 0);
    if (!strstr(out, "ckpt synth: 100% (") || !strstr(out, "ckpt synth: done in ") || strchr(out, '\r'))
        fail_msg("ckpt synth off a terminal said: %s", out);
    free(out);
    assert_int_equal(tu_run(&out, "SHOAL_PROGRESS_AFTER=0 %s ckpt step %s --lr 1e-4 -o %s.2 2>&1 >/dev/null", tu_shoal(), f, f), 0);
    if (!strstr(out, "ckpt step: ") || !strstr(out, "ckpt step: done in ")) fail_msg("ckpt step off a terminal said: %s", out);
    free(out);
    /* The default, 5 s: this takes far less and prints nothing. */
    assert_int_equal(tu_run(&out, "SHOAL_PROGRESS_AFTER= %s ckpt synth --params 1M -o %s 2>&1 >/dev/null", tu_shoal(), f), 0);
    assert_string_equal(out, "");
    free(out);
    assert_int_equal(tu_run(&out, "SHOAL_PROGRESS_AFTER=0 SHOAL_NO_PROGRESS=1 %s ckpt synth --params 1M -o %s 2>&1 >/dev/null",
                            tu_shoal(), f),
                     0);
    assert_string_equal(out, "");
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closest),
        cmocka_unit_test(test_conventions),
        cmocka_unit_test(test_every_command_options),
        cmocka_unit_test(test_client_is_lean),
        cmocka_unit_test(test_killed_write_leaves_no_temporary),
        cmocka_unit_test(test_dashboard_from_elsewhere),
        cmocka_unit_test(test_man_and_completion),
        cmocka_unit_test(test_rl_report_counts),
        cmocka_unit_test(test_up_twice),
        cmocka_unit_test(test_progress_off_terminal),
        cmocka_unit_test_teardown(test_client_commands, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
