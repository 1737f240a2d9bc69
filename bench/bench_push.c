/* shoal bench push: time until N replica processes have activated a new
 * version, through a push tree, a star, against the same run with one
 * replica (the baseline, measured in the same run). */
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli_int.h"
#include <sys/resource.h>

#include "shoal/bcast.h"
#include "shoal/ckpt.h"
#include "app/mainjob/ring/ring_int.h"
#include "shoal/store.h"

const char cli_bench_help_push[] = "converge time of N replicas over a UCX push tree vs one replica [--json]";

static const char usage_text[] =
    "usage: shoal bench push [--replicas N] [--link-gbps G] [--topology tree|star|store]\n"
    "                        [--payload full|delta] [--params P] [--chunk SIZE]\n"
    "                        [--fanout F] [--lr LR] [--json]\n\n"
    "Publishes version 1 of a synthetic checkpoint of P parameters (default 25M,\n"
    "bf16), seeds N replica directories with it from the store, starts `shoal push\n"
    "serve` and N `shoal replica` processes on them and waits until all serve it.\n"
    "Then it publishes three more versions (each one Adam step of LR later, default\n"
    "3e-6: about 3% of the weights change), full anchors or deltas: the replicas\n"
    "take two untimed (their steady state between a trainer's steps), and the\n"
    "bench times until every replica has activated the third.  Every node's\n"
    "sending is limited to G Gb/s by a sender-side link model\n"
    "(docs/push-protocol.md), not by network namespaces; the default is what\n"
    "this machine can emulate for N replicas: 0.8 Gb/s x cores / N, at most 1\n"
    "(0.1 for 16 replicas on 2 cores).  tree: replicas forward to each other, fan-out F\n"
    "(default 1, a pipelined chain); star: every replica attaches to the root;\n"
    "store: every replica polls the store and reads it directly (a shared file\n"
    "system here: no link limit applies, only the 20 ms polling).\n"
    "--json adds `breakdown`: per replica, seconds from the publish to its first\n"
    "and last chunk, payload verified, apply start, model built and verified,\n"
    "active (swapped in) and durable (ACTIVE written), with min/median/max; and\n"
    "`cpu_s`, the CPU the nodes used meanwhile.\n"
    "The same measurement with one replica is the baseline; with --payload delta\n"
    "the full payload is measured too.  Defaults: N 16, chunk auto (the root cuts each\n"
    "payload for the tree's depth: `shoal push serve --depth`, docs/push-protocol.md).\n"
    "`cpu_s_per_gb` is the CPU-seconds the nodes used per GB received; the same\n"
    "bytes in the same chunks, sent once from one process to another over plain\n"
    "UCX (tag messages), give `ucx_cpu_s_per_gb`, measured in the same run.\n"
    "`machine_busy` is the whole machine's CPU busy fraction over the timed\n"
    "windows (every process's, from /proc/stat); `cpu_wait` the nodes' mean\n"
    "time runnable but waiting for a core (schedstat), as a share of the\n"
    "window, the most of the runs; above 0.1 the run is `cpu_bound`: the\n"
    "machine, not the links, set its times.\n"
    "SHOAL_BENCH_KEEP=1 keeps the run's directories and logs.\n";

typedef struct bopt {
    int replicas, fanout, json;
    double gbps;
    const char *topology, *payload;
    uint64_t params, chunk;
    double lr;
} bopt;

#define NSTEPS 7
#define NWARM 2 /* untimed versions before the timed one */
#define NCK (NWARM + 2)
static const char *const step_names[NSTEPS] = {"first_chunk", "last_chunk", "received", "apply_start",
                                               "built", "active", "durable"};

typedef struct result {
    double converge_s, publish_s, pause_ms_max;
    double machine_busy; /* the whole machine's CPU busy fraction over the timed window */
    double cpu_wait;     /* the nodes' mean time waiting for a core, share of the window */
    double cpu_user_s, cpu_sys_s; /* the nodes' CPU from the publish to convergence */
    uint64_t bytes_sent, payload_bytes, model_bytes;
    /* Per replica, seconds from the publish to each step of its timeline
     * (docs: store_timeline); -1 where the step did not happen. */
    double (*steps)[NSTEPS];
    int n;
} result;

/* Reads a replica's timeline of version v relative to t0. */
static void read_steps(json_t *j, uint64_t v, double t0, double out[NSTEPS])
{
    json_t *tl = json_object_get(j, "timeline");
    int ok = tl && (uint64_t)json_integer_value(json_object_get(tl, "version")) == v;
    for (int k = 0; k < NSTEPS; k++) {
        char key[32];
        snprintf(key, sizeof key, "%s_us", step_names[k]);
        double at = ok ? (double)json_integer_value(json_object_get(tl, key)) * 1e-6 : 0;
        out[k] = at > 0 ? at - t0 : -1;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* {step: {min, median, max}} over the replicas that reached each step, and
 * every replica's timeline (by replica index). */
static json_t *breakdown_json(const result *r)
{
    json_t *b = json_object();
    double *col = calloc((size_t)r->n + 1, sizeof *col);
    for (int k = 0; col && k < NSTEPS; k++) {
        int m = 0;
        for (int i = 0; i < r->n; i++)
            if (r->steps[i][k] >= 0) col[m++] = r->steps[i][k];
        if (!m) continue;
        qsort(col, (size_t)m, sizeof *col, cmp_double);
        json_object_set_new(b, step_names[k], json_pack("{s:f,s:f,s:f}", "min", col[0], "median",
                                                          col[m / 2], "max", col[m - 1]));
    }
    free(col);
    json_t *each = json_array();
    for (int i = 0; i < r->n; i++) {
        json_t *e = json_object();
        for (int k = 0; k < NSTEPS; k++)
            if (r->steps[i][k] >= 0) json_object_set_new(e, step_names[k], json_real(r->steps[i][k]));
        json_array_append_new(each, e);
    }
    json_object_set_new(b, "replicas", each);
    return b;
}

static int read_json(const char *path, json_t **out)
{
    return sh_json_load_file(path, 1 << 20, out);
}

static int64_t jget_i(json_t *j, const char *k)
{
    int64_t v = 0;
    sh_json_get_i64(j, k, 0, "replica", &v);
    return v;
}

/* Waits until every replica's ACTIVE names version v; returns the latest
 * activated_at among them. */
static int wait_all(char dirs[][4096], int n, uint64_t v, double timeout, double *last_at)
{
    double end = sh_now_mono() + timeout;
    *last_at = 0;
    for (int i = 0; i < n; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/ACTIVE", dirs[i]);
        for (;;) {
            json_t *j;
            if (read_json(p, &j) == 0) {
                double at = 0;
                int64_t got = jget_i(j, "version");
                sh_json_get_num(j, "activated_at", 0, p, &at);
                json_decref(j);
                if ((uint64_t)got >= v) {
                    if (at > *last_at) *last_at = at;
                    break;
                }
            }
            if (sh_now_mono() > end)
                return sh_err(SH_ETIMEDOUT, "bench push: replica %s did not activate version %llu in %.0fs "
                              "(see its log beside it)", dirs[i], (unsigned long long)v, timeout);
            sh_sleep(0.002);
        }
    }
    return SH_OK;
}

/* CPU seconds (user, system) a process has used so far, from /proc. */
static void cpu_of(pid_t pid, double *user, double *sys)
{
    char p[64], text[4096];
    snprintf(p, sizeof p, "/proc/%ld/stat", (long)pid);
    *user = *sys = 0;
    FILE *f = fopen(p, "r");
    size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[len] = 0;
    /* Fields 14 and 15 (utime, stime in clock ticks), after the ")" that
     * ends the command name. */
    const char *q = strrchr(text, ')');
    unsigned long long ut = 0, st = 0;
    if (q && sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2) {
        double hz = (double)sysconf(_SC_CLK_TCK);
        *user = (double)ut / hz, *sys = (double)st / hz;
    }
}

/* The whole machine's CPU ticks so far: busy and total (from /proc/stat). */
static void machine_ticks(double *busy, double *total)
{
    unsigned long long v[10] = {0};
    *busy = *total = 0;
    FILE *f = fopen("/proc/stat", "r");
    int k = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                       &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9])
              : 0;
    if (f) fclose(f);
    if (k < 8) return;
    /* user nice system idle iowait irq softirq steal (guest time is in user) */
    *total = (double)(v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]);
    *busy = *total - (double)(v[3] + v[4]);
}

/* Seconds the threads of pid spent runnable but waiting for a core
 * (run_delay in /proc/PID/task/TID/schedstat). */
static double wait_of(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%ld/task", (long)pid);
    DIR *d = opendir(dir);
    double w = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[320];
        snprintf(p, sizeof p, "%s/%s/schedstat", dir, e->d_name);
        FILE *f = fopen(p, "r");
        unsigned long long run = 0, delay = 0;
        if (f && fscanf(f, "%llu %llu", &run, &delay) == 2) w += (double)delay * 1e-9;
        if (f) fclose(f);
    }
    if (d) closedir(d);
    return w;
}

static double wait_all_nodes(pid_t root, const pid_t *reps, int n)
{
    double w = root > 0 ? wait_of(root) : 0;
    for (int i = 0; i < n; i++) w += wait_of(reps[i]);
    return w;
}

/* CPU the replicas (and the root) used, summed. */
static void cpu_all(pid_t root, const pid_t *reps, int n, double *user, double *sys)
{
    double u, s;
    cpu_of(root, user, sys);
    for (int i = 0; i < n; i++) cpu_of(reps[i], &u, &s), *user += u, *sys += s;
}

static void stop(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* Every replica starts holding version 1, as after a restart: its
 * directory is filled from the store by `shoal replica --store --until 1`,
 * so that only version 2 crosses the links. */
static int seed(char dirs[][4096], int n, const char *store_dir)
{
    for (int i = 0; i < n; i++) {
        char log[4200];
        snprintf(log, sizeof log, "%s.seed.log", dirs[i]);
        char *argv[] = {"shoal", "replica", "--dir", dirs[i], "--store", (char *)store_dir, "--until", "1",
                        "--seconds", "120", NULL};
        pid_t pid = cli_bench_spawn(argv, "/dev/null", log);
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return sh_err(SH_EIO, "bench push: seeding %s with version 1 failed (see %s)", dirs[i], log);
    }
    return SH_OK;
}

/* Hops from the root to the deepest of n replicas: a chain (fan-out 1) is n
 * deep, a star 1, a tree of fan-out F as deep as its levels. */
static int tree_depth(const bopt *o, int n)
{
    if (!strcmp(o->topology, "star")) return 1;
    int F = o->fanout > 0 ? o->fanout : 1, depth = 0;
    if (F == 1) return n;
    for (long cap = 0, width = 1; cap < n; depth++) width *= F, cap += width;
    return depth;
}

static int start_root(const bopt *o, const char *dir, const char *store_dir, int n, char *addr, size_t cap, pid_t *pid)
{
    char addr_file[4200], log[4200], gbps[32], chunk[32], fanout[16], depth[16];
    snprintf(addr_file, sizeof addr_file, "%s/root.addr", dir);
    snprintf(log, sizeof log, "%s/root.log", dir);
    snprintf(gbps, sizeof gbps, "%g", o->gbps);
    if (o->chunk) snprintf(chunk, sizeof chunk, "%llu", (unsigned long long)o->chunk);
    else snprintf(chunk, sizeof chunk, "auto");
    snprintf(fanout, sizeof fanout, "%d", strcmp(o->topology, "star") ? o->fanout : n);
    snprintf(depth, sizeof depth, "%d", tree_depth(o, n));
    char *argv[] = {"shoal", "push", "serve", "--store", (char *)store_dir, "--addr-file", addr_file,
                    "--chunk", chunk, "--depth", depth, "--egress-gbps", gbps, "--fanout", fanout, NULL};
    *pid = cli_bench_spawn(argv, "/dev/null", log);
    return cli_bench_root_addr(addr_file, *pid, log, 30, addr, cap);
}

/* Starts n replicas in dirs: below the root at addr, or reading the store
 * at store_dir directly (topology store). */
static void start_replicas(const bopt *o, char (*dirs)[4096], int n, const char *addr, const char *store_dir,
                           pid_t *reps)
{
    char gbps[32], fanout[16];
    snprintf(gbps, sizeof gbps, "%g", o->gbps);
    snprintf(fanout, sizeof fanout, "%d", o->fanout);
    int star = !strcmp(o->topology, "star");
    for (int i = 0; i < n; i++) {
        char out[4200], err[4200], stats[4200];
        snprintf(out, sizeof out, "%s.json", dirs[i]);
        snprintf(err, sizeof err, "%s.log", dirs[i]);
        snprintf(stats, sizeof stats, "%s.stats", dirs[i]);
        char *argv[] = {"shoal", "replica", "--dir", dirs[i], "--parent", (char *)addr, "--egress-gbps", gbps,
                        "--fanout", fanout, "--stats-file", stats, "--json", star ? "--leaf" : NULL, NULL};
        char *sargv[] = {"shoal", "replica", "--dir", dirs[i], "--store", (char *)store_dir, "--stats-file", stats,
                         "--json", NULL};
        if (!strcmp(o->topology, "store")) memcpy(argv, sargv, sizeof sargv);
        reps[i] = cli_bench_spawn(argv, out, err);
    }
}

/* Bytes the n replicas received while warming up (up to version warm),
 * from the stats they wrote then. */
static uint64_t warm_bytes(char (*dirs)[4096], int n, uint64_t warm)
{
    uint64_t before = 0;
    for (int i = 0; i < n; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s.stats", dirs[i]);
        json_t *j = NULL;
        double end = sh_now_mono() + 10;
        while (sh_now_mono() < end) {
            if (read_json(p, &j) == 0 && (uint64_t)jget_i(j, "version") >= warm) break;
            if (j) json_decref(j), j = NULL;
            sh_sleep(0.01);
        }
        if (j) before += (uint64_t)jget_i(j, "bytes_received"), json_decref(j);
    }
    return before;
}

/* The timed version: publishes ck as version mv and waits for the n
 * replicas to hold it; fills r's times and CPU, *t1 the publish's end. */
static int timed_publish(store *s, const char *ck, const store_publish_opts *po, pid_t root, pid_t *reps,
                         char (*dirs)[4096], int n, uint64_t mv, result *r, double *t1)
{
    double u0, s0, u1, s1, b0, k0, b1, k1, at = 0;
    uint64_t v;
    cpu_all(root, reps, n, &u0, &s0);
    machine_ticks(&b0, &k0);
    double w0 = wait_all_nodes(root, reps, n);
    double t0 = sh_now_wall();
    int rc = store_publish(s, ck, po, &v);
    *t1 = sh_now_wall();
    if (rc == 0) rc = wait_all(dirs, n, mv, 300, &at);
    cpu_all(root, reps, n, &u1, &s1);
    machine_ticks(&b1, &k1);
    r->machine_busy = k1 > k0 ? (b1 - b0) / (k1 - k0) : 0;
    /* The nodes' average wait for a core, as a share of the timed window. */
    r->cpu_wait = (wait_all_nodes(root, reps, n) - w0) / (n + (root > 0)) / (at - *t1 > 0 ? at - *t1 : 1);
    r->cpu_user_s = u1 - u0, r->cpu_sys_s = s1 - s0;
    r->publish_s = *t1 - t0;
    r->converge_s = at - *t1;
    return rc;
}

/* Stops the n replicas and reads their reports into r (pause, steps of
 * version mv published at t1) when rc is 0; the bytes they received. */
static uint64_t collect(int rc, pid_t *reps, char (*dirs)[4096], int n, uint64_t mv, double t1, result *r)
{
    uint64_t after = 0;
    r->steps = calloc((size_t)n, sizeof *r->steps);
    r->n = r->steps ? n : 0;
    for (int i = 0; i < n; i++) {
        stop(reps[i]);
        char p[4200];
        snprintf(p, sizeof p, "%s.json", dirs[i]);
        json_t *j;
        if (rc == 0 && read_json(p, &j) == 0) {
            double pause = 0;
            sh_json_get_num(j, "pause_ms_max", 0, p, &pause);
            if (pause > r->pause_ms_max) r->pause_ms_max = pause;
            after += (uint64_t)jget_i(j, "bytes_received");
            if (r->steps) read_steps(j, mv, t1, r->steps[i]);
            json_decref(j);
        }
    }
    return after;
}

/* ck: NCK checkpoints.  Replicas start on version 1 (ck[0]) and first take
 * NWARM versions (not timed) of the same kind as the timed one, so that the
 * timed version finds them in their steady state, as between a trainer's
 * steps: a model image in memory, and a retired model file, already mapped
 * and written by this process, to receive the payload or write the new
 * model into (two versions back: the previous one's file is then still
 * in use).  The timed version is the last. */
static int measure(const bopt *o, const char *base, int n, int delta, char ck[][4200], result *r)
{
    static int seq;
    char dir[4096], store_dir[4200];
    snprintf(dir, sizeof dir, "%s/m%d", base, seq++);
    snprintf(store_dir, sizeof store_dir, "%s/store", dir);
    memset(r, 0, sizeof *r);
    store *s;
    uint64_t v;
    store_publish_opts po = {delta ? 8 : 1};
    SH_TRY(store_open(store_dir, NULL, 1, &s));
    int rc = store_publish(s, ck[0], &po, &v);
    uint64_t warm = 1 + NWARM, mv = warm + 1;
    char addr[256];
    pid_t root = 0, *reps = calloc((size_t)n, sizeof *reps);
    char(*dirs)[4096] = calloc((size_t)n, sizeof *dirs);
    if (!reps || !dirs) rc = sh_err(SH_ENOMEM, "bench");
    int from_store = !strcmp(o->topology, "store");
    if (rc == 0 && !from_store) rc = start_root(o, dir, store_dir, n, addr, sizeof addr, &root);
    for (int i = 0; rc == 0 && i < n; i++) snprintf(dirs[i], sizeof dirs[i], "%s/rep%02d", dir, i);
    if (rc == 0) rc = seed(dirs, n, store_dir);
    if (rc == 0) start_replicas(o, dirs, n, addr, store_dir, reps);
    double at, t1 = 0;
    if (rc == 0) rc = wait_all(dirs, n, 1, 300, &at);
    for (uint64_t w = 2; rc == 0 && w <= warm; w++) {
        rc = store_publish(s, ck[w - 1], &po, &v);
        if (rc == 0) rc = wait_all(dirs, n, w, 300, &at);
    }
    uint64_t before = rc == 0 ? warm_bytes(dirs, n, warm) : 0;
    /* Idle between versions, as replicas are between a trainer's publishes:
     * each loads its model image once its tree is quiet. */
    sh_sleep(1.0);
    if (rc == 0) rc = timed_publish(s, ck[warm], &po, root, reps, dirs, n, mv, r, &t1);
    store_version m;
    if (rc == 0 && store_get(s, mv, &m, NULL) == 0) r->payload_bytes = m.size, r->model_bytes = m.model_size;
    uint64_t after = collect(rc, reps, dirs, n, mv, t1, r);
    /* Replicas that read the store report no push bytes: count what each
     * read (the payload), which is what the store's link carried. */
    r->bytes_sent = from_store ? (uint64_t)n * r->payload_bytes : after - before;
    stop(root);
    store_close(s);
    free(reps);
    free(dirs);
    if (rc == 0 && !getenv("SHOAL_BENCH_KEEP")) sh_rm_rf(dir);
    return rc;
}

static double cpu_self(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* One rank of the baseline: after a one-byte handshake, `bytes` in chunks
 * from rank 0 to rank 1 over plain UCX; writes its CPU seconds to fd. */
static void __attribute__((noreturn)) ucx_rank(int r, const char *rdv, uint64_t bytes, uint64_t chunk, int fd)
{
    mj_ring *ring;
    if (mj_ring_new(r, 2, "127.0.0.1", 0, rdv, 30, &ring) < 0) _exit(3);
    char one = 1;
    void *p = r == 0 ? &one : NULL;
    size_t len = 1;
    if (mj_ring_bcast(ring, 0, &p, &len) < 0) _exit(3);
    if (r) free(p);
    uint8_t *buf = r == 0 ? malloc(chunk) : NULL;
    if (r == 0 && !buf) _exit(3);
    if (buf) memset(buf, 0x5a, chunk);
    double c0 = cpu_self();
    for (uint64_t sent = 0; sent < bytes; sent += len) {
        len = (size_t)(bytes - sent < chunk ? bytes - sent : chunk);
        p = buf;
        if (mj_ring_bcast(ring, 0, &p, &len) < 0) _exit(3);
        if (r) free(p);
    }
    double c = cpu_self() - c0;
    if (write(fd, &c, sizeof c) != sizeof c) _exit(3);
    mj_ring_free(ring);
    _exit(0);
}

/* The baseline for CPU per byte: the same bytes in the same chunks from one
 * process to another over plain UCX (tag messages, mj_ring_bcast on two
 * ranks over loopback), both processes' CPU over the transfer alone. */
static int ucx_baseline(const char *base, uint64_t bytes, uint64_t chunk, double *cpu_s)
{
    static int seq;
    char rdv[4200];
    snprintf(rdv, sizeof rdv, "%s/ucx-rdv-%d", base, seq++);
    SH_TRY(sh_mkdir_p(rdv, 0755));
    int fds[2];
    if (pipe(fds) < 0) return sh_err_errno(errno, "bench push: pipe");
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        fflush(stdout), fflush(stderr);
        pid[r] = fork();
        if (pid[r] == 0) ucx_rank(r, rdv, bytes, chunk, fds[1]);
    }
    close(fds[1]);
    *cpu_s = 0;
    int ok = 1;
    for (int r = 0; r < 2; r++) {
        double c;
        ok &= read(fds[0], &c, sizeof c) == sizeof c;
        if (ok) *cpu_s += c;
    }
    close(fds[0]);
    for (int r = 0; r < 2; r++) {
        int st = 0;
        if (pid[r] > 0) waitpid(pid[r], &st, 0);
        ok &= pid[r] > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    sh_rm_rf(rdv);
    return ok ? 0 : sh_err(SH_EIO, "bench push: the plain UCX transfer failed (check UCX_TLS)");
}

/* The default link: one this machine can emulate faithfully for n replicas.
 * The link model is a sender-side limiter, so the nodes' CPU must keep up
 * with n links at once: at the push path's cost here (about 6 CPU-s per GB
 * received, for a relay that receives and forwards; bench/results/2026-12-03-notebook.md),
 * 0.1 GB/s received per core keeps the nodes at about 60 % of the cores,
 * with room left for the applies and the machine's other work.  At most
 * 1 Gb/s; two decimals.  2 cores: 1 Gb/s for 1 replica, 0.4 at 4, 0.1 at 16. */
#define BENCH_GB_PER_CORE_S 0.1
static double default_gbps(int n)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double g = 8 * BENCH_GB_PER_CORE_S * (double)(cores > 0 ? cores : 1) / (n > 0 ? n : 1);
    g = (double)(long)(g * 100) / 100;
    return g > 1 ? 1 : g > 0.01 ? g : 0.01;
}

/* Above this mean share of the timed window spent waiting for a core, the
 * machine, not the link model, set the nodes' pace. */
#define BENCH_WAIT_MAX 0.1

/* Parses the options into o: -1, or the status to exit with. */
static int parse(int argc, char **argv, bopt *o)
{
    static const struct option opts[] = {{"replicas", required_argument, 0, 'r'}, {"fanout", required_argument, 0, 'f'},
                                         {"link-gbps", required_argument, 0, 'g'}, {"topology", required_argument, 0, 't'},
                                         {"payload", required_argument, 0, 'p'},  {"params", required_argument, 0, 'P'},
                                         {"chunk", required_argument, 0, 'c'},    {"lr", required_argument, 0, 'l'},
                                         {"json", no_argument, 0, 'j'},           {0}};
    static const char *const topologies[] = {"tree", "star", "store", NULL}, *const payloads[] = {"full", "delta", NULL};
    cli_args a = {"bench push", usage_text, opts, NULL};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        int rc = 0;
        int64_t k;
        switch (c) {
        case 'j': o->json = 1; break;
        case 'r':
            if (cli_int(a.cmd, "--replicas", optarg, 1, 256, &k)) return CLI_USAGE;
            o->replicas = (int)k;
            break;
        case 'f':
            if (cli_int(a.cmd, "--fanout", optarg, 1, 256, &k)) return CLI_USAGE;
            o->fanout = (int)k;
            break;
        case 'g':
            if (cli_real(a.cmd, "--link-gbps", optarg, DBL_TRUE_MIN, DBL_MAX, "Gb/s > 0", &o->gbps)) return CLI_USAGE;
            break;
        case 't':
            if (cli_pick(a.cmd, "--topology", optarg, topologies) < 0) return CLI_USAGE;
            o->topology = optarg;
            break;
        case 'p':
            if (cli_pick(a.cmd, "--payload", optarg, payloads) < 0) return CLI_USAGE;
            o->payload = optarg;
            break;
        case 'P': rc = sh_parse_size(optarg, &o->params, "--params"); break;
        case 'c': rc = strcmp(optarg, "auto") ? sh_parse_size(optarg, &o->chunk, "--chunk") : 0; break;
        case 'l': rc = sh_parse_double(optarg, &o->lr, "--lr"); break;
        default: return a.rc;
        }
        if (rc < 0) return cli_usage(a.cmd, "%s", sh_errmsg());
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    return -1;
}

static json_t *result_json(const result *r)
{
    return json_pack("{s:f,s:f,s:I,s:f,s:f,s:f,s:f,s:f,s:o}", "converge_s", r->converge_s, "publish_s",
                     r->publish_s, "bytes_sent", (json_int_t)r->bytes_sent, "pause_ms_max", r->pause_ms_max,
                     "cpu_user_s", r->cpu_user_s, "cpu_sys_s", r->cpu_sys_s, "machine_busy",
                     r->machine_busy, "cpu_wait", r->cpu_wait, "breakdown", breakdown_json(r));
}

/* The figures cli_bench_push reports beside the runs' results. */
typedef struct summary {
    int link_default, cpu_bound;
    long cores;
    uint64_t chunk;
    double ratio, busy, wait, nodes_frac, push_per_gb, ucx_per_gb;
} summary;

/* The runs: one replica, o->replicas, and with a delta payload o->replicas
 * with the full one; then plain UCX moving the same bytes.  Keeps its files
 * in base on failure. */
static int run_all(const bopt *o, const char *base, int delta, result *one, result *many, result *full,
                   summary *sm)
{
    char ck[NCK][4200];
    for (int i = 0; i < NCK; i++) snprintf(ck[i], sizeof ck[i], "%s/v%d.safetensors", base, i + 1);
    int rc = ckpt_synth(ck[0], o->params, 1);
    for (int i = 1; rc == 0 && i < NCK; i++) rc = ckpt_step(ck[i - 1], ck[i], o->lr, 1, 1 + (uint64_t)i);
    sh_progress pg;
    sh_progress_start(&pg, "bench push", (uint64_t)(2 + delta), "runs");
    if (rc == 0) rc = measure(o, base, 1, delta, ck, one);
    sh_progress_update(&pg, 1);
    if (rc == 0) rc = measure(o, base, o->replicas, delta, ck, many);
    sh_progress_update(&pg, 2);
    if (rc == 0 && delta) rc = measure(o, base, o->replicas, 0, ck, full);
    /* CPU per GB received, beside plain UCX moving the same bytes in the same
     * chunks (the root cut the payload with the same rule). */
    double ucx_cpu = 0;
    sm->chunk = o->chunk ? o->chunk : bcast_chunk_auto(many->payload_bytes, tree_depth(o, o->replicas), o->gbps, 0);
    if (rc == 0 && strcmp(o->topology, "store")) rc = ucx_baseline(base, many->bytes_sent, sm->chunk, &ucx_cpu);
    sh_progress_finish(&pg);
    double gb = (double)many->bytes_sent / 1e9;
    sm->push_per_gb = gb > 0 ? (many->cpu_user_s + many->cpu_sys_s) / gb : 0;
    sm->ucx_per_gb = gb > 0 ? ucx_cpu / gb : 0;
    return rc;
}

static double max2(double a, double b)
{
    return a > b ? a : b;
}

/* The ratio to one replica and how loaded the machine was. */
static void summarise(int delta, const result *one, const result *many, const result *full, summary *sm)
{
    sm->ratio = one->converge_s > 0 ? many->converge_s / one->converge_s : 0;
    sm->cores = sysconf(_SC_NPROCESSORS_ONLN);
    sm->busy = max2(one->machine_busy, many->machine_busy);
    if (delta && full->machine_busy > sm->busy) sm->busy = full->machine_busy;
    sm->wait = max2(one->cpu_wait, many->cpu_wait);
    if (delta && full->cpu_wait > sm->wait) sm->wait = full->cpu_wait;
    sm->cpu_bound = sm->wait > BENCH_WAIT_MAX;
    sm->nodes_frac = many->converge_s > 0 && sm->cores > 0
                         ? (many->cpu_user_s + many->cpu_sys_s) / (many->converge_s * (double)sm->cores) : 0;
}

static void print_json(const bopt *o, int delta, const result *one, const result *many, const result *full,
                       const summary *sm)
{
    json_t *j = json_pack("{s:i,s:s,s:s,s:f,s:i,s:I,s:s,s:I,s:I,s:I,s:f,s:f,s:f,s:o,s:f}", "replicas",
                          o->replicas, "topology", o->topology, "payload", o->payload, "link_gbps", o->gbps,
                          "fanout", strcmp(o->topology, "star") ? o->fanout : o->replicas, "chunk",
                          (json_int_t)o->chunk /* 0: auto */, "limiter", strcmp(o->topology, "store") ? "sender-side link model per node (no netns/tc)"
                                                   : "none: replicas read the store's files directly",
                          "model_bytes", (json_int_t)many->model_bytes, "payload_bytes",
                          (json_int_t)many->payload_bytes, "bytes_sent", (json_int_t)many->bytes_sent,
                          "converge_s", many->converge_s, "pause_ms_max", max2(many->pause_ms_max, one->pause_ms_max),
                          "publish_s", many->publish_s, "one_replica", result_json(one), "ratio_vs_one", sm->ratio);
    json_object_set_new(j, "breakdown", breakdown_json(many));
    json_object_set_new(j, "cpu_s", json_pack("{s:f,s:f}", "user", many->cpu_user_s, "sys", many->cpu_sys_s));
    json_object_set_new(j, "chunk_used", json_integer((json_int_t)sm->chunk));
    json_object_set_new(j, "depth", json_integer(tree_depth(o, o->replicas)));
    json_object_set_new(j, "cpu_s_per_gb", json_real(sm->push_per_gb));
    json_object_set_new(j, "ucx_cpu_s_per_gb", json_real(sm->ucx_per_gb));
    json_object_set_new(j, "cpu_vs_ucx", json_real(sm->ucx_per_gb > 0 ? sm->push_per_gb / sm->ucx_per_gb : 0));
    json_object_set_new(j, "link_gbps_default", json_boolean(sm->link_default));
    json_object_set_new(j, "cores", json_integer(sm->cores));
    json_object_set_new(j, "machine_busy", json_real(sm->busy));
    json_object_set_new(j, "nodes_cpu_frac", json_real(sm->nodes_frac));
    json_object_set_new(j, "cpu_wait", json_real(sm->wait));
    json_object_set_new(j, "cpu_bound", json_boolean(sm->cpu_bound));
    if (delta) {
        json_object_set_new(j, "full", result_json(full));
        json_object_set_new(j, "full_over_delta",
                            json_real(many->converge_s > 0 ? full->converge_s / many->converge_s : 0));
    }
    sh_json_print(j);
    json_decref(j);
}

static void print_text(const bopt *o, int delta, const result *one, const result *many, const result *full,
                       const summary *sm)
{
    char mb[32], pb[32];
    printf("push %s, %s payload %s of a %s model, links %g Gb/s (sender-side limiter)\n", o->topology,
           o->payload, sh_fmt_bytes((double)many->payload_bytes, pb, sizeof pb),
           sh_fmt_bytes((double)many->model_bytes, mb, sizeof mb), o->gbps);
    printf("  %3d replica(s): converge %.3fs\n", 1, one->converge_s);
    printf("  %3d replica(s): converge %.3fs (%.2fx one replica), %llu bytes sent, pause max %.3f ms\n",
           o->replicas, many->converge_s, sm->ratio, (unsigned long long)many->bytes_sent, many->pause_ms_max);
    printf("  CPU %.2f s per GB received (plain UCX, same bytes and %llu-byte chunks: %.2f s per GB; %.1fx)\n",
           sm->push_per_gb, (unsigned long long)sm->chunk, sm->ucx_per_gb,
           sm->ucx_per_gb > 0 ? sm->push_per_gb / sm->ucx_per_gb : 0);
    if (delta)
        printf("  %3d replica(s), full payload: converge %.3fs (delta is %.1fx faster)\n", o->replicas,
               full->converge_s, many->converge_s > 0 ? full->converge_s / many->converge_s : 0);
    printf("  machine %.0f%% busy at most over the timed windows (these nodes %.0f%% of %ld cores);\n"
           "  the nodes waited for a core %.1f%% of the time at most\n",
           sm->busy * 100, sm->nodes_frac * 100, sm->cores, sm->wait * 100);
    if (sm->cpu_bound)
        printf("  CPU-bound: the machine, not the %g Gb/s links, set these times; the ratios say little.\n"
               "  Run it on an idler machine, or with a slower --link-gbps or fewer --replicas.\n", o->gbps);
}

int cli_bench_push(int argc, char **argv)
{
    bopt o = {16, 1, 0, 0, "tree", "full", 25000000, 0, 3e-6};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    summary sm = {!(o.gbps > 0)};
    if (sm.link_default) o.gbps = default_gbps(o.replicas);
    /* tmpfs, like a serving node's page cache: the disk of this shared VM is not
     * what the bench measures. */
    char base[] = "/dev/shm/shoal-bench-push.XXXXXX";
    if (!mkdtemp(base)) return cli_fail("bench push", sh_err_errno(errno, "mkdtemp"));
    int delta = !strcmp(o.payload, "delta");
    result one = {0}, many = {0}, full = {0};
    rc = run_all(&o, base, delta, &one, &many, &full, &sm);
    if (rc < 0) {
        free(one.steps), free(many.steps), free(full.steps);
        fprintf(stderr, "shoal bench push: files kept in %s\n", base);
        return cli_fail("bench push", rc);
    }
    if (!getenv("SHOAL_BENCH_KEEP")) sh_rm_rf(base);
    summarise(delta, &one, &many, &full, &sm);
    if (o.json) print_json(&o, delta, &one, &many, &full, &sm);
    else print_text(&o, delta, &one, &many, &full, &sm);
    free(one.steps), free(many.steps), free(full.steps);
    return 0;
}
