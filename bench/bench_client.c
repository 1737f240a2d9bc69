/* shoal bench client: how fast the command-line client starts, one process
 * after another, as a user's script or a workflow engine runs it.
 *
 *  1. `shoal version`: exec to exit of the client binary (build/shoal),
 *     against the all-in-one binary (shoal-core, which loads UCX, OpenBLAS,
 *     SQLite and libmicrohttpd) and /bin/true (the fork+exec floor);
 *  2. `shoal submit JOB.json`: sequential submissions per second to a
 *     server in this process, each a new process, against shoal-core
 *     submitting the same way;
 *  3. when Slurm answers on this machine (`sbatch` on PATH and a controller
 *     up), `sbatch --version` and `sbatch --hold --wrap=true` the same way. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli_int.h"
#include "shoal/server.h"

const char cli_bench_help_client[] = "client start: `shoal version` and sequential `shoal submit` per second [--json]";

static const char usage[] =
    "usage: shoal bench client [--runs N] [--submits N] [--json]\n\n"
    "  --runs N      `version` runs per binary (default 200)\n"
    "  --submits N   sequential submits per binary (default 200)\n\n"
    "Compares build/shoal (the client) with shoal-core (every command, every\n"
    "library) and, when Slurm answers here, with sbatch.\n";

/* Runs argv to its exit with stdout and stderr on /dev/null; returns its
 * exit status, or -1 when it could not start. */
static int run_quiet(char *const *argv)
{
    pid_t p = fork();
    if (p < 0) return -1;
    if (p == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    if (waitpid(p, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Mean milliseconds per run of argv over n runs; -1 when a run fails. */
static double per_run_ms(char *const *argv, int n, sh_progress *pg, uint64_t *done)
{
    double t0 = sh_now_mono();
    for (int i = 0; i < n; i++) {
        if (run_quiet(argv) != 0) return -1;
        sh_progress_update(pg, ++*done);
    }
    return (sh_now_mono() - t0) * 1e3 / n;
}

typedef struct figures {
    double ver_client, ver_core, ver_true, sub_client, sub_core, sbatch_ver, sbatch_sub;
} figures;

static int slurm_up(void)
{
    char *ping[] = {"scontrol", "ping", NULL};
    char *which[] = {"sh", "-c", "command -v sbatch", NULL};
    return run_quiet(which) == 0 && run_quiet(ping) == 0;
}

/* The client and the core binary beside this one (build/). */
static int find_binaries(char client[PATH_MAX + 16], char core[PATH_MAX + 16])
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return sh_err_errno(errno, "readlink /proc/self/exe");
    self[n] = 0;
    *strrchr(self, '/') = 0;
    snprintf(client, PATH_MAX + 16, "%s/shoal", self);
    snprintf(core, PATH_MAX + 16, "%s/shoal-core", self);
    if (access(client, X_OK) || access(core, X_OK))
        return sh_err(SH_ENOENT, "%s/shoal and %s/shoal-core are both needed (make all)", self, self);
    return SH_OK;
}

/* A server in this process with one node, so that submits are accepted;
 * writes its tokens and the job file (job) in dir, its address in url. */
static int start_server(const char *dir, char job[PATH_MAX], char url[64], srv **s)
{
    char tok[PATH_MAX], db[PATH_MAX];
    snprintf(tok, PATH_MAX, "%s/tokens.json", dir);
    snprintf(db, PATH_MAX, "%s/state.db", dir);
    snprintf(job, PATH_MAX, "%s/job.json", dir);
    const char *t = "{\"admin\":\"a\",\"agent\":\"g\",\"tenants\":{\"bench\":\"t\"}}";
    const char *j = "{\"name\":\"bench\",\"kind\":\"function\",\"command\":[\"true\"]}";
    SH_TRY(sh_write_atomic(tok, t, strlen(t)));
    SH_TRY(sh_write_atomic(job, j, strlen(j)));
    srv_config c = {.db_path = db, .tokens_path = tok, .heartbeat_timeout = 1e9};
    SH_TRY(srv_start(&c, s));
    snprintf(url, 64, "http://127.0.0.1:%d", srv_port(*s));
    return srv_add_bench_nodes(*s, 1, "H100", 1);
}

static int measure(const char *dir, int runs, int submits, figures *f)
{
    char client[PATH_MAX + 16], core[PATH_MAX + 16], job[PATH_MAX], url[64];
    SH_TRY(find_binaries(client, core));
    srv *s = NULL;
    int rc = start_server(dir, job, url, &s);
    if (!s) return rc;

    int slurm = slurm_up();
    sh_progress pg;
    uint64_t done = 0;
    sh_progress_start(&pg, "client starts", (uint64_t)((runs / 2) * 2 * (slurm ? 4 : 3) + (submits / 2) * 2 * (slurm ? 3 : 2)),
                      "runs");
    char *v_client[] = {client, "version", NULL}, *v_core[] = {core, "version", NULL}, *v_true[] = {"/bin/true", NULL};
    char *s_client[] = {client, "submit", job, "--server", url, "--token", "t", NULL};
    char *s_core[] = {core, "submit", job, "--server", url, "--token", "t", NULL};
    char *b_ver[] = {"sbatch", "--version", NULL};
    /* Held, so that Slurm queues them as shoal's server queues its own
     * (its one GPU is taken by the first): both measure the submit path. */
    char *b_sub[] = {"sbatch", "--hold", "-J", "shoal-bench-client", "-o", "/dev/null", "--wrap=true", NULL};
    char *b_cancel[] = {"scancel", "-n", "shoal-bench-client", NULL};
    /* Interleaved halves, so that a change in the machine's load during the
     * run affects every contender alike. */
    char **ver[4] = {v_client, v_core, v_true, b_ver}, **sub[3] = {s_client, s_core, b_sub};
    double *ver_out[4] = {&f->ver_client, &f->ver_core, &f->ver_true, &f->sbatch_ver};
    double *sub_out[3] = {&f->sub_client, &f->sub_core, &f->sbatch_sub};
    for (int k = 0; k < 4; k++) *ver_out[k] = 0;
    for (int k = 0; k < 3; k++) *sub_out[k] = 0;
    for (int half = 0; rc == SH_OK && half < 2; half++) {
        for (int k = 0; rc == SH_OK && k < (slurm ? 4 : 3); k++) {
            double ms = per_run_ms(ver[k], runs / 2, &pg, &done);
            if (ms < 0) rc = sh_err(SH_EIO, "a run of `%s %s` failed", ver[k][0], ver[k][1] ? ver[k][1] : "");
            *ver_out[k] += ms / 2;
        }
        for (int k = 0; rc == SH_OK && k < (slurm ? 3 : 2); k++) {
            double ms = per_run_ms(sub[k], submits / 2, &pg, &done);
            if (ms < 0)
                rc = sh_err(SH_EIO, "a submit by %s failed (try it by hand: %s submit %s --server %s --token t)",
                            sub[k][0], client, job, url);
            *sub_out[k] += ms / 2;
        }
    }
    if (slurm) run_quiet(b_cancel);
    if (!slurm) f->sbatch_ver = f->sbatch_sub = -1;
    cli_progress_end(&pg, rc);
    srv_stop(s);
    return rc;
}

int cli_bench_client(int argc, char **argv)
{
    static const struct option opts[] = {{"runs", required_argument, 0, 'r'},
                                         {"submits", required_argument, 0, 's'},
                                         {"json", no_argument, 0, 'j'},
                                         {0}};
    cli_args a = {"bench client", usage, opts, NULL};
    int json = 0;
    int64_t runs = 200, submits = 200;
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        if (c == 'j') json = 1;
        else if (c == 'r' || c == 's') {
            int64_t *v = c == 'r' ? &runs : &submits;
            if (sh_parse_i64(optarg, v, c == 'r' ? "--runs" : "--submits") < 0 || *v < 2 || *v > 100000)
                return cli_usage("bench client", "%s: expected a count 2..100000", c == 'r' ? "--runs" : "--submits");
        } else return a.rc;
    }
    if (optind < argc) return cli_usage("bench client", "unexpected argument \"%s\"", argv[optind]);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/shoal-bench-client.%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    sh_rm_rf(dir);
    int rc = sh_mkdir_p(dir, 0755);
    figures f = {0};
    if (rc == SH_OK) rc = measure(dir, (int)runs, (int)submits, &f);
    sh_rm_rf(dir);
    if (rc < 0) return cli_fail("bench client", rc);
    double per_s = 1e3 / f.sub_client, core_per_s = 1e3 / f.sub_core;
    double sb_per_s = f.sbatch_sub > 0 ? 1e3 / f.sbatch_sub : -1;
    if (json) {
        json_t *j = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I}", "version_ms", f.ver_client, "version_ms_core",
                              f.ver_core, "exec_floor_ms", f.ver_true, "submits_per_s", per_s, "submits_per_s_core",
                              core_per_s, "speedup_version", f.ver_core / f.ver_client, "speedup_submit",
                              per_s / core_per_s, "runs", (json_int_t)runs, "submits", (json_int_t)submits);
        json_object_set_new(j, "sbatch_version_ms", f.sbatch_ver > 0 ? json_real(f.sbatch_ver) : json_null());
        json_object_set_new(j, "sbatch_per_s", sb_per_s > 0 ? json_real(sb_per_s) : json_null());
        sh_json_print(j);
        json_decref(j);
        return 0;
    }
    printf("shoal version      %7.2f ms  (shoal-core %.2f ms, %.1fx; /bin/true %.2f ms)\n", f.ver_client, f.ver_core,
           f.ver_core / f.ver_client, f.ver_true);
    printf("shoal submit       %7.1f /s  (shoal-core %.1f /s, %.1fx), one process after another\n", per_s, core_per_s,
           per_s / core_per_s);
    if (sb_per_s > 0)
        printf("sbatch             %7.1f /s  (sbatch --version %.2f ms), ratio shoal/sbatch %.2f\n", sb_per_s,
               f.sbatch_ver, per_s / sb_per_s);
    else printf("sbatch             not measured (no Slurm controller answers on this machine)\n");
    return 0;
}
