/* shoal bench follow: the memory of a push-tree follower (`shoal replica
 * --parent`, a process of its own) while it follows a run version after
 * version, against its model image and against a follower that reads the
 * store directly (the baseline, following the same versions in the same
 * run).  The issue it answers: a follower next to an inference server must
 * hold about one image, not one per version since the last anchor. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli_int.h"
#include "shoal/ckpt.h"
#include "shoal/store.h"

const char cli_bench_help_follow[] =
    "peak memory of a push-tree follower over N versions vs its image and a store follower [--json]";

static const char usage_text[] =
    "usage: shoal bench follow [--mb LIST] [--versions N] [--anchor-every K]\n"
    "                          [--step adamw|flip] [--lr LR] [--json]\n\n"
    "For each image size in LIST (MB, comma-separated; default 150,1500), writes\n"
    "a checkpoint with the tensor names and shapes of Qwen2.5-1.5B (bf16; layers\n"
    "and widths cut to the size), publishes it and N-1 more versions (default\n"
    "20) to a store with the store's anchor policy (an anchor every K versions,\n"
    "default the store's 8), each one AdamW step of LR later (default 1e-6:\n"
    "about 1% of the elements change; --step flip changes 1% of them by one\n"
    "unit in the last place, which is faster to make, for tests).  A push root\n"
    "(`shoal push serve`) and two followers run as processes of their own: one\n"
    "attached to the root (`shoal replica --parent`), one reading the store\n"
    "(`shoal replica --store`, the baseline).  Each version is published once\n"
    "both have activated the one before, and the push follower's model file\n"
    "is checked against the version's model_xxh3 (bit-exact).  Their\n"
    "/proc/PID/status is sampled every 2 ms: peak and final VmRSS, RssAnon and\n"
    "RssFile, and VmHWM (the kernel's own peak RSS).  `bound` is one image +\n"
    "64 MiB + 2 x the largest delta; `ok` says whether the push follower's\n"
    "VmHWM stayed within it; `push_bytes_received` is what crossed its link\n"
    "(an anchor goes to a follower holding the version before as one delta\n"
    "across it), `payload_bytes` the versions' payloads.  The run's files go\n"
    "under $TMPDIR (about 8 images of disk); SHOAL_BENCH_KEEP=1 keeps them.\n";

#define SLACK (64ull << 20)

typedef struct fopt {
    uint64_t mb[8];
    int nmb, versions, json, flip;
    uint64_t anchor_every;
    double lr;
} fopt;

/* ---- Sampling /proc/PID/status ------------------------------------------ */

enum { M_RSS, M_ANON, M_FILE, M_HWM, M_N };
static const char *const m_keys[M_N] = {"VmRSS:", "RssAnon:", "RssFile:", "VmHWM:"};
static const char *const m_names[M_N] = {"rss", "rss_anon", "rss_file", "hwm"};

static int read_status(pid_t pid, uint64_t out[M_N])
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    memset(out, 0, M_N * sizeof *out);
    while (fgets(line, sizeof line, f))
        for (int k = 0; k < M_N; k++) {
            size_t n = strlen(m_keys[k]);
            unsigned long kb;
            if (!strncmp(line, m_keys[k], n) && sscanf(line + n, " %lu", &kb) == 1) out[k] = (uint64_t)kb << 10;
        }
    fclose(f);
    return 0;
}

typedef struct sampler {
    pid_t pid[2];
    uint64_t peak[2][M_N];
    uint64_t samples;
    int stop;
    pthread_mutex_t mu;
} sampler;

static void *sample_main(void *arg)
{
    sampler *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        for (int i = 0; i < 2; i++) {
            uint64_t m[M_N];
            if (s->pid[i] <= 0 || read_status(s->pid[i], m) < 0) continue;
            pthread_mutex_lock(&s->mu);
            for (int k = 0; k < M_N; k++)
                if (m[k] > s->peak[i][k]) s->peak[i][k] = m[k];
            s->samples++;
            pthread_mutex_unlock(&s->mu);
        }
        usleep(2000);
    }
    return NULL;
}

/* ---- Processes ---------------------------------------------------------- */

static void stop(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

static int alive(pid_t pid, const char *what, const char *log)
{
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid)
        return sh_err(SH_EIO, "bench follow: the %s exited (status %d; see %s)", what,
                      WIFEXITED(st) ? WEXITSTATUS(st) : -1, log);
    return SH_OK;
}

static int start_root(const char *dir, const char *store_dir, char *addr, size_t cap, pid_t *pid)
{
    char addr_file[4200], log[4200];
    snprintf(addr_file, sizeof addr_file, "%s/root.addr", dir);
    snprintf(log, sizeof log, "%s/root.log", dir);
    char *argv[] = {"shoal", "push", "serve", "--store", (char *)store_dir, "--addr-file", addr_file, NULL};
    *pid = cli_bench_spawn(argv, "/dev/null", log);
    return cli_bench_root_addr(addr_file, *pid, log, 60, addr, cap);
}

/* Waits until the follower in dir (process pid) has activated version v. */
static int wait_version(const char *dir, pid_t pid, uint64_t v, double timeout)
{
    char log[4200];
    snprintf(log, sizeof log, "%s.log", dir);
    double end = sh_now_mono() + timeout;
    while (cli_bench_active(dir) < v) {
        SH_TRY(alive(pid, "follower", log));
        if (sh_now_mono() > end)
            return sh_err(SH_ETIMEDOUT, "bench follow: %s did not activate version %llu in %.0fs (see %s)", dir,
                          (unsigned long long)v, timeout, log);
        sh_sleep(0.005);
    }
    return SH_OK;
}

/* The follower's model file of version v hashes to the manifest's
 * model_xxh3 (read here through a mapping of this process, not the
 * follower's). */
static int check_model(const char *dir, const store_version *m)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/models/%010llu.safetensors", dir, (unsigned long long)m->version);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sh_err_errno(errno, "bench follow: open %s", p);
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? sh_err_errno(errno, "stat %s", p) : SH_OK;
    if (rc == 0 && (uint64_t)st.st_size != m->model_size)
        rc = sh_err(SH_EMISMATCH, "bench follow: %s has %lld bytes, version %llu has %llu", p, (long long)st.st_size,
                    (unsigned long long)m->version, (unsigned long long)m->model_size);
    void *map = rc == 0 ? mmap(NULL, m->model_size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (rc == 0 && map == MAP_FAILED) rc = sh_err_errno(errno, "mmap %s", p);
    close(fd);
    if (rc < 0) return rc;
    sh_hash128 h = sh_hash128_of(map, m->model_size);
    munmap(map, m->model_size);
    if (!sh_hash128_eq(h, m->model_xxh3))
        return sh_err(SH_EMISMATCH, "bench follow: the push follower's version %llu is not the published one "
                      "(its model file does not hash to model_xxh3)", (unsigned long long)m->version);
    return SH_OK;
}

/* ---- Versions ------------------------------------------------------------- */

/* Layers (and widths) of Qwen2.5-1.5B for an image of about `mb` MB. */
static int family_for(uint64_t mb, ckpt_family_opts *fo)
{
    memset(fo, 0, sizeof *fo);
    fo->shrink = mb < 800 ? 4 : 1;
    fo->seed = 1;
    uint64_t want = mb * 1000000, best = 0;
    for (uint64_t l = 1; l <= 28; l++) {
        ckpt_family_opts t = *fo;
        t.layers = l;
        uint64_t bytes;
        size_t n;
        SH_TRY(ckpt_family_size("qwen2.5-1.5b", &t, &bytes, &n));
        uint64_t d = bytes > want ? bytes - want : want - bytes;
        if (!best || d < best) best = d, fo->layers = l;
    }
    return SH_OK;
}

/* --step flip: a copy of `in` with 1% of its 2-byte units (past the
 * header) moved by one, chosen from seed. */
static int flip_step(const char *in, const char *out, uint64_t seed)
{
    char *buf;
    size_t len;
    SH_TRY(sh_read_file(in, (size_t)1 << 36, &buf, &len));
    uint64_t hlen = 0;
    if (len >= 8) memcpy(&hlen, buf, 8);
    uint64_t start = 8 + hlen, units = len > start ? (len - start) / 2 : 0, r = seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t i = 0; i < units / 100; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        uint16_t *u = (uint16_t *)(buf + start) + r % units;
        *u = (uint16_t)(*u + ((r >> 40) & 1 ? 1 : 0xffff));
    }
    /* Not made durable: the store's publish copies it before it is gone. */
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = fd < 0 ? sh_err_errno(errno, "create %s", out) : sh_pwrite_all(fd, buf, len, 0, out);
    if (fd >= 0) close(fd);
    free(buf);
    return rc;
}

/* ---- One run -------------------------------------------------------------- */

typedef struct follow_result {
    uint64_t image, anchors, deltas, delta_min, delta_max, delta_total, anchor_bytes, bound;
    uint64_t peak[2][M_N], final[2][M_N], samples;
    uint64_t push_received; /* bytes the push follower received (its --json at exit) */
    double seconds;
} follow_result;

/* Counts version m's payload into res: an anchor's or a delta's. */
static void tally(const store_version *m, follow_result *res)
{
    res->image = m->model_size;
    if (m->anchor) res->anchors++, res->anchor_bytes += m->size;
    else {
        res->deltas++, res->delta_total += m->size;
        if (!res->delta_min || m->size < res->delta_min) res->delta_min = m->size;
        if (m->size > res->delta_max) res->delta_max = m->size;
    }
}

/* Versions 1..o->versions: waits for both followers (fol, pid) to hold each,
 * checks the push follower's model, counts it, then makes and publishes
 * the next from ck (the two checkpoint files take turns). */
static int follow_versions(const fopt *o, store *s, const store_publish_opts *po, char ck[2][4200],
                           char fol[2][4200], const pid_t pid[2], follow_result *res)
{
    int rc = 0;
    uint64_t v = 0;
    for (int i = 1; rc == 0; i++) {
        for (int k = 0; rc == 0 && k < 2; k++) rc = wait_version(fol[k], pid[k], (uint64_t)i, 600);
        store_version m;
        if (rc == 0) rc = store_get(s, (uint64_t)i, &m, NULL);
        if (rc == 0) rc = check_model(fol[0], &m);
        if (rc < 0) break;
        tally(&m, res);
        if (i == o->versions) break;
        const char *prev = ck[(i - 1) % 2], *next = ck[i % 2];
        rc = o->flip ? flip_step(prev, next, (uint64_t)i)
                     : ckpt_family_next(prev, next, &(ckpt_train_opts){.lr = o->lr, .wd = 0.1, .seed = (uint64_t)i + 1},
                                        NULL);
        if (rc == 0) rc = store_publish(s, next, po, &v);
        unlink(prev);
    }
    return rc;
}

/* The bytes the push follower received, from its --json at exit (0 when
 * it wrote none). */
static uint64_t push_received(const char *fol)
{
    char rep[4200];
    snprintf(rep, sizeof rep, "%s.json", fol);
    json_t *rj;
    int64_t b = 0;
    if (sh_json_load_file(rep, 1 << 20, &rj) == 0) {
        sh_json_get_i64(rj, "bytes_received", 0, rep, &b);
        json_decref(rj);
    }
    return (uint64_t)b;
}

/* The two followers: fol[0] below the push root at addr, fol[1] polling
 * the store at store_dir. */
static void start_followers(char fol[2][4200], const char *addr, const char *store_dir, pid_t pid[2])
{
    for (int i = 0; i < 2; i++) {
        char out[4200], err[4200];
        snprintf(out, sizeof out, "%s.json", fol[i]);
        snprintf(err, sizeof err, "%s.log", fol[i]);
        char *push[] = {"shoal", "replica", "--dir", fol[i], "--parent", (char *)addr, "--json", NULL};
        char *poll[] = {"shoal", "replica", "--dir", fol[i], "--store", (char *)store_dir, "--json", NULL};
        pid[i] = cli_bench_spawn(i == 0 ? push : poll, out, err);
    }
}

static int run_one(const fopt *o, uint64_t mb, follow_result *res)
{
    memset(res, 0, sizeof *res);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/shoal-bench-follow-XXXXXX", tmp);
    if (!mkdtemp(dir)) return sh_err_errno(errno, "bench follow: mkdtemp %s", dir);
    char store_dir[4200], ck[2][4200], fol[2][4200];
    snprintf(store_dir, sizeof store_dir, "%s/store", dir);
    snprintf(ck[0], sizeof ck[0], "%s/ck0.safetensors", dir);
    snprintf(ck[1], sizeof ck[1], "%s/ck1.safetensors", dir);
    snprintf(fol[0], sizeof fol[0], "%s/push", dir);
    snprintf(fol[1], sizeof fol[1], "%s/poll", dir);
    ckpt_family_opts fo;
    SH_TRY(family_for(mb, &fo));
    int rc = ckpt_family_write("qwen2.5-1.5b", &fo, ck[0], NULL);
    store *s = NULL;
    if (rc == 0) rc = store_open(store_dir, NULL, 1, &s);
    store_publish_opts po = {o->anchor_every, NULL};
    uint64_t v = 0;
    if (rc == 0) rc = store_publish(s, ck[0], &po, &v);
    char addr[256];
    pid_t root = 0, pid[2] = {0, 0};
    if (rc == 0) rc = start_root(dir, store_dir, addr, sizeof addr, &root);
    if (rc == 0) start_followers(fol, addr, store_dir, pid);
    sampler sm = {.pid = {pid[0], pid[1]}};
    pthread_mutex_init(&sm.mu, NULL);
    pthread_t th;
    int have_th = rc == 0 && pthread_create(&th, NULL, sample_main, &sm) == 0;
    double t0 = sh_now_mono();
    if (rc == 0) rc = follow_versions(o, s, &po, ck, fol, pid, res);
    res->seconds = sh_now_mono() - t0;
    /* Settled: what each holds between versions. */
    if (rc == 0) sh_sleep(1.0);
    for (int k = 0; k < 2; k++)
        if (pid[k] > 0) read_status(pid[k], res->final[k]);
    if (have_th) {
        pthread_mutex_lock(&sm.mu);
        sm.stop = 1;
        pthread_mutex_unlock(&sm.mu);
        pthread_join(th, NULL);
    }
    for (int k = 0; k < 2; k++) {
        memcpy(res->peak[k], sm.peak[k], sizeof sm.peak[k]);
        if (res->final[k][M_HWM] > res->peak[k][M_HWM]) res->peak[k][M_HWM] = res->final[k][M_HWM];
        stop(pid[k]);
    }
    res->push_received = push_received(fol[0]);
    res->samples = sm.samples;
    pthread_mutex_destroy(&sm.mu);
    stop(root);
    store_close(s);
    res->bound = res->image + SLACK + 2 * res->delta_max;
    if (rc == 0 && !getenv("SHOAL_BENCH_KEEP")) sh_rm_rf(dir);
    else fprintf(stderr, "bench follow: files kept in %s\n", dir);
    return rc;
}

static json_t *mem_json(const uint64_t m[M_N])
{
    json_t *j = json_object();
    for (int k = 0; k < M_N; k++) json_object_set_new(j, m_names[k], json_integer((json_int_t)m[k]));
    return j;
}

static json_t *result_json(const fopt *o, uint64_t mb, const follow_result *r)
{
    json_t *j = json_pack("{s:I,s:I,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:I}", "mb", (json_int_t)mb, "image_bytes",
                          (json_int_t)r->image, "versions", o->versions, "anchors", (json_int_t)r->anchors,
                          "anchor_bytes", (json_int_t)r->anchor_bytes, "deltas", (json_int_t)r->deltas,
                          "delta_bytes_min", (json_int_t)r->delta_min, "delta_bytes_max", (json_int_t)r->delta_max,
                          "delta_bytes_mean", (json_int_t)(r->deltas ? r->delta_total / r->deltas : 0),
                          "bound_bytes", (json_int_t)r->bound, "seconds", r->seconds, "samples",
                          (json_int_t)r->samples);
    const char *who[2] = {"push_follower", "store_follower"};
    for (int k = 0; k < 2; k++) {
        json_t *f = json_pack("{s:o,s:o}", "peak", mem_json(r->peak[k]), "final", mem_json(r->final[k]));
        json_object_set_new(f, "peak_vs_image", json_real(r->image ? (double)r->peak[k][M_HWM] / (double)r->image : 0));
        json_object_set_new(j, who[k], f);
    }
    /* What crossed the push follower's link, against the payloads a chain
     * follower reads (every anchor whole). */
    json_object_set_new(j, "push_bytes_received", json_integer((json_int_t)r->push_received));
    json_object_set_new(j, "payload_bytes", json_integer((json_int_t)(r->anchor_bytes + r->delta_total)));
    json_object_set_new(j, "push_peak_vs_bound", json_real((double)r->peak[0][M_HWM] / (double)r->bound));
    json_object_set_new(j, "push_vs_store_peak",
                        json_real(r->peak[1][M_HWM] ? (double)r->peak[0][M_HWM] / (double)r->peak[1][M_HWM] : 0));
    json_object_set_new(j, "ok", json_boolean(r->peak[0][M_HWM] <= r->bound));
    return j;
}

static void print_text(uint64_t mb, const follow_result *r)
{
    const double M = 1048576.0;
    printf("image %.1f MiB (%llu MB asked), %llu anchors, %llu deltas of %.2f-%.2f MiB; bound %.1f MiB\n",
           (double)r->image / M, (unsigned long long)mb, (unsigned long long)r->anchors,
           (unsigned long long)r->deltas, (double)r->delta_min / M, (double)r->delta_max / M, (double)r->bound / M);
    const char *who[2] = {"push follower ", "store follower"};
    for (int k = 0; k < 2; k++)
        printf("  %s peak RSS %.1f MiB (%.2fx image; anon %.1f, file %.1f), final %.1f MiB (anon %.1f, file %.1f)\n",
               who[k], (double)r->peak[k][M_HWM] / M, (double)r->peak[k][M_HWM] / (double)r->image,
               (double)r->peak[k][M_ANON] / M, (double)r->peak[k][M_FILE] / M, (double)r->final[k][M_RSS] / M,
               (double)r->final[k][M_ANON] / M, (double)r->final[k][M_FILE] / M);
    printf("  push follower received %.1f MiB; the versions' payloads (anchors whole) are %.1f MiB\n",
           (double)r->push_received / M, (double)(r->anchor_bytes + r->delta_total) / M);
    printf("  push follower within the bound: %s (%.2fx the bound, %.2fx the store follower)\n",
           r->peak[0][M_HWM] <= r->bound ? "yes" : "NO", (double)r->peak[0][M_HWM] / (double)r->bound,
           r->peak[1][M_HWM] ? (double)r->peak[0][M_HWM] / (double)r->peak[1][M_HWM] : 0);
}

static int parse_list(const char *v, fopt *o)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    o->nmb = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int64_t k;
        if (o->nmb == 8 || cli_int("bench follow", "--mb", t, 16, 100000, &k)) return CLI_USAGE;
        o->mb[o->nmb++] = (uint64_t)k;
    }
    return o->nmb ? 0 : CLI_USAGE;
}

int cli_bench_follow(int argc, char **argv)
{
    fopt o = {.mb = {150, 1500}, .nmb = 2, .versions = 20, .lr = 1e-6};
    static const struct option opts[] = {{"mb", required_argument, 0, 'm'},
                                         {"versions", required_argument, 0, 'n'},
                                         {"anchor-every", required_argument, 0, 'a'},
                                         {"step", required_argument, 0, 's'},
                                         {"lr", required_argument, 0, 'l'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    static const char *const steps[] = {"adamw", "flip", NULL};
    cli_args a = {.cmd = "bench follow", .usage = usage_text, .opts = opts};
    int c;
    int64_t k;
    while ((c = cli_getopt(&a, argc, argv)) != -1) {
        switch (c) {
        case 'm': if (parse_list(optarg, &o)) return CLI_USAGE; break;
        case 'n':
            if (cli_int(a.cmd, "--versions", optarg, 2, 1000, &k)) return CLI_USAGE;
            o.versions = (int)k;
            break;
        case 'a':
            if (cli_int(a.cmd, "--anchor-every", optarg, 1, 1000, &k)) return CLI_USAGE;
            o.anchor_every = (uint64_t)k;
            break;
        case 's':
            if (cli_pick(a.cmd, "--step", optarg, steps) < 0) return CLI_USAGE;
            o.flip = !strcmp(optarg, "flip");
            break;
        case 'l':
            if (cli_real(a.cmd, "--lr", optarg, 1e-12, 1, "a learning rate", &o.lr)) return CLI_USAGE;
            break;
        case 'j': o.json = 1; break;
        default: return a.rc;
        }
    }
    if (optind < argc) return cli_usage("bench follow", "unexpected argument \"%s\"", argv[optind]);
    json_t *runs = json_array();
    int rc = SH_OK;
    for (int i = 0; rc == 0 && i < o.nmb; i++) {
        follow_result r;
        if (!o.json) printf("== %llu MB, %d versions\n", (unsigned long long)o.mb[i], o.versions), fflush(stdout);
        rc = run_one(&o, o.mb[i], &r);
        if (rc == 0 && o.json) json_array_append_new(runs, result_json(&o, o.mb[i], &r));
        else if (rc == 0) print_text(o.mb[i], &r);
    }
    if (rc < 0) {
        json_decref(runs);
        return cli_fail("bench follow", rc);
    }
    if (o.json) {
        json_t *j = json_pack("{s:s,s:i,s:s,s:o}", "bench", "follow", "versions", o.versions, "step",
                              o.flip ? "flip" : "adamw", "runs", runs);
        sh_json_print(j);
        json_decref(j);
    } else {
        json_decref(runs);
    }
    return 0;
}
