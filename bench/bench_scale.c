/* shoal bench scale: the codec and the store at the size of a real model.
 * A Llama-3-8B-shaped checkpoint with few decoder layers (2: about 3 GB of
 * bf16, a 1 GB embedding and head) and its next version (AdamW on fp32
 * masters), then each step as a user runs it, in a child process whose
 * anonymous memory is sampled: delta make, apply to a new file, apply in
 * place, store publish (anchor, then delta), and a push of the delta to N
 * replicas through `shoal push serve`.  The delta's size is compared with
 * xor+zstd-1 over the same pair in the same run. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli_int.h"
#include "shoal/ckpt.h"
#include "shoal/delta.h"

const char cli_bench_help_scale[] =
    "codec and store on a Llama-3-8B-shaped checkpoint: make, apply, publish, push [--json]";

static const char usage_text[] =
    "usage: shoal bench scale [--layers L] [--replicas N] [--lr LR] [--dir DIR] [--json]\n"
    "                         [--shrink K] [--vocab V]\n\n"
    "Writes a Llama-3-8B-shaped bf16 checkpoint with L decoder layers (default 2:\n"
    "about 3 GB, the real 128256 x 4096 embedding and head) and its next version\n"
    "(`shoal ckpt next`: AdamW at LR, default 1e-6, on fp32 masters, rounded to bf16)\n"
    "under DIR (default $TMPDIR or /tmp), then times each step as a user runs it, in\n"
    "a child process whose anonymous memory (RssAnon) is sampled every millisecond:\n"
    "  make      shoal delta make V1 V2 (and xor+zstd-1 over the same pair, in process)\n"
    "  apply     shoal delta apply V1 DELTA -o OUT          (checked byte for byte)\n"
    "  in_place  shoal delta apply --in-place COPY DELTA    (checked byte for byte)\n"
    "  anchor    shoal store publish STORE V1\n"
    "  publish   shoal store publish STORE V2  (a delta; N replicas listening)\n"
    "  push      until N `shoal replica` processes under `shoal push serve` (default 4)\n"
    "            have activated V2; peak is the largest replica's\n"
    "--shrink K divides the widths and --vocab V sets the vocabulary (quick runs).\n"
    "GB/s are checkpoint bytes per second of wall time.  Needs about 10 + 2N times\n"
    "the checkpoint in free disk.\n";

typedef struct {
    uint64_t layers, shrink, vocab;
    int replicas, json;
    double lr;
    const char *dir;
} scale_opts;

enum { S_MAKE, S_APPLY, S_INPLACE, S_ANCHOR, S_PUBLISH, S_PUSH, S_N };
static const char *const step_names[S_N] = {"make", "apply", "in_place", "anchor", "publish", "push"};

typedef struct {
    double secs[S_N];
    uint64_t peak[S_N];
    uint64_t ckpt_bytes, delta_bytes, xor_bytes, tensors;
    double gen_s, next_s, xor_s;
} scale_res;

/* 0, -1 after --help or --version, or a usage status. */
static int scale_args(int argc, char **argv, scale_opts *o)
{
    static const struct option opts[] = {{"layers", required_argument, 0, 'L'}, {"shrink", required_argument, 0, 'K'},
                                         {"vocab", required_argument, 0, 'V'},  {"lr", required_argument, 0, 'l'},
                                         {"dir", required_argument, 0, 'd'},    {"replicas", required_argument, 0, 'r'},
                                         {"json", no_argument, 0, 'j'},         {0}};
    cli_args a = {"bench scale", usage_text, opts, NULL};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        int rc = 0;
        int64_t k;
        switch (c) {
        case 'j': o->json = 1; break;
        case 'L': rc = sh_parse_u64(optarg, &o->layers, "--layers"); break;
        case 'K': rc = sh_parse_u64(optarg, &o->shrink, "--shrink"); break;
        case 'V': rc = sh_parse_u64(optarg, &o->vocab, "--vocab"); break;
        case 'l': rc = sh_parse_double(optarg, &o->lr, "--lr"); break;
        case 'd': o->dir = optarg; break;
        case 'r':
            if (cli_int(a.cmd, "--replicas", optarg, 1, 64, &k)) return CLI_USAGE;
            o->replicas = (int)k;
            break;
        default: return a.rc ? a.rc : -1;
        }
        if (rc < 0) return cli_usage(a.cmd, "%s", sh_errmsg());
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    if (o->shrink > 64) return cli_usage("bench scale", "--shrink must be at most 64");
    if (o->layers < 1 || o->layers > 32) return cli_usage("bench scale", "--layers must be 1..32");
    if (!(o->lr > 0 && o->lr < 1)) return cli_usage("bench scale", "--lr must be in (0, 1)");
    return 0;
}

/* Whether two files hold the same bytes (mapped, compared in place). */
static int scale_same(const char *a, const char *b)
{
    int fa = open(a, O_RDONLY | O_CLOEXEC), fb = open(b, O_RDONLY | O_CLOEXEC);
    struct stat sa, sb;
    int same = fa >= 0 && fb >= 0 && fstat(fa, &sa) == 0 && fstat(fb, &sb) == 0 &&
               sa.st_size == sb.st_size;
    if (same && sa.st_size > 0) {
        void *ma = mmap(NULL, (size_t)sa.st_size, PROT_READ, MAP_SHARED, fa, 0);
        void *mb = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fb, 0);
        same = ma != MAP_FAILED && mb != MAP_FAILED && !memcmp(ma, mb, (size_t)sa.st_size);
        if (ma != MAP_FAILED) munmap(ma, (size_t)sa.st_size);
        if (mb != MAP_FAILED) munmap(mb, (size_t)sb.st_size);
    }
    if (fa >= 0) close(fa);
    if (fb >= 0) close(fb);
    return same;
}

static int scale_copy(const char *src, const char *dst)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return sh_err_errno(errno, "open %s", src);
    sh_atomic_file f;
    struct stat st;
    int rc = fstat(in, &st) < 0 ? sh_err_errno(errno, "stat %s", src) : sh_atomic_open(&f, dst);
    for (off_t left = st.st_size; rc == SH_OK && left > 0;) {
        ssize_t n = copy_file_range(in, NULL, f.fd, NULL, (size_t)left, 0);
        if (n <= 0) rc = sh_err_errno(n < 0 ? errno : EIO, "copy %s to %s", src, dst);
        else left -= n;
    }
    if (rc == SH_OK) rc = sh_atomic_commit(&f);
    else if (st.st_size >= 0) sh_atomic_abort(&f);
    close(in);
    return rc;
}

/* ---- The push: a root and N replicas, as `bench push` runs them ---------- */

static void scale_stop(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

typedef struct {
    pid_t root, reps[64];
    char dirs[64][4096];
    int n;
} scale_tree;

/* Seeds every replica with version 1 from the store, then starts the root
 * and the replicas under it (a chain, fan-out 1, links unlimited). */
static int scale_tree_start(const char *base, const char *store_dir, int n, scale_tree *t)
{
    char addr_file[4200], log[4200], addr[256] = "";
    t->n = n;
    for (int i = 0; i < n; i++) {
        snprintf(t->dirs[i], sizeof t->dirs[i], "%s/rep%02d", base, i);
        snprintf(log, sizeof log, "%s.log", t->dirs[i]);
        char *argv[] = {"shoal", "replica", "--dir", t->dirs[i], "--store", (char *)store_dir,
                        "--until", "1", "--seconds", "600", NULL};
        pid_t pid = cli_bench_spawn(argv, "/dev/null", log);
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
            return sh_err(SH_EIO, "bench scale: seeding %s with version 1 failed (see %s)",
                          t->dirs[i], log);
    }
    snprintf(addr_file, sizeof addr_file, "%s/root.addr", base);
    snprintf(log, sizeof log, "%s/root.log", base);
    char *rargv[] = {"shoal", "push", "serve", "--store", (char *)store_dir, "--addr-file",
                     addr_file, "--fanout", "1", NULL};
    t->root = cli_bench_spawn(rargv, "/dev/null", log);
    SH_TRY(cli_bench_root_addr(addr_file, t->root, log, 60, addr, sizeof addr));
    for (int i = 0; i < n; i++) {
        snprintf(log, sizeof log, "%s.log", t->dirs[i]);
        char *argv[] = {"shoal", "replica", "--dir", t->dirs[i], "--parent", addr, "--fanout", "1",
                        NULL};
        t->reps[i] = cli_bench_spawn(argv, "/dev/null", log);
    }
    /* Every replica serves version 1 before anything is timed. */
    for (int i = 0; i < n; i++)
        for (double end = sh_now_mono() + 600; cli_bench_active(t->dirs[i]) < 1; sh_sleep(0.005))
            if (sh_now_mono() > end)
                return sh_err(SH_ETIMEDOUT, "bench scale: replica %s did not serve version 1",
                              t->dirs[i]);
    return SH_OK;
}

/* Waits until every replica has activated version v, sampling their
 * anonymous memory; *peak gets the largest replica's. */
static int scale_tree_wait(scale_tree *t, uint64_t v, uint64_t *peak)
{
    double end = sh_now_mono() + 1800;
    for (int done = 0; done < t->n;) {
        done = 0;
        for (int i = 0; i < t->n; i++) {
            uint64_t r = sh_rss_anon(t->reps[i]);
            if (r > *peak) *peak = r;
            done += cli_bench_active(t->dirs[i]) >= v;
        }
        if (sh_now_mono() > end)
            return sh_err(SH_ETIMEDOUT, "bench scale: the replicas did not all activate version %llu "
                          "(see their logs under %s)", (unsigned long long)v, t->dirs[0]);
        if (done < t->n) sh_sleep(0.002);
    }
    return SH_OK;
}

static void scale_tree_stop(scale_tree *t)
{
    for (int i = 0; i < t->n; i++) scale_stop(t->reps[i]);
    scale_stop(t->root);
}

/* ---- The run ------------------------------------------------------------------ */

static int scale_step(const scale_opts *o, int step, char *const argv[], scale_res *r)
{
    if (!o->json) fprintf(stderr, "%-9s shoal %s %s ...\n", step_names[step], argv[1], argv[2]);
    return cli_peak_anon(argv, &r->peak[step], &r->secs[step]);
}

static int scale_generate(const scale_opts *o, const char *v1, const char *v2, scale_res *r)
{
    ckpt_family_opts f = {.layers = o->layers, .shrink = (uint32_t)o->shrink, .vocab = o->vocab,
                          .seed = 1};
    size_t nt;
    SH_TRY(ckpt_family_size("llama3-8b", &f, &r->ckpt_bytes, &nt));
    r->tensors = nt;
    sh_progress pg;
    double t0 = sh_now_mono();
    sh_progress_start(&pg, "llama3-8b v1", r->ckpt_bytes, "B");
    int rc = ckpt_family_write("llama3-8b", &f, v1, o->json ? NULL : &pg);
    cli_progress_end(&pg, rc);
    r->gen_s = sh_now_mono() - t0;
    t0 = sh_now_mono();
    sh_progress_start(&pg, "llama3-8b v2", r->ckpt_bytes, "B");
    ckpt_train_opts tr = {.lr = o->lr, .wd = 0.1, .steps = 1, .seed = 2};
    if (rc == SH_OK) rc = ckpt_family_next(v1, v2, &tr, o->json ? NULL : &pg);
    cli_progress_end(&pg, rc);
    r->next_s = sh_now_mono() - t0;
    return rc;
}

static int scale_codec(const scale_opts *o, const char *dir, const char *v1, const char *v2,
                       scale_res *r)
{
    char d[4200], out[4200], cp[4200];
    snprintf(d, sizeof d, "%s/v2.shd", dir);
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    snprintf(cp, sizeof cp, "%s/copy.safetensors", dir);
    char *mk[] = {"shoal", "delta", "make", (char *)v1, (char *)v2, "-o", d, NULL};
    char *ap[] = {"shoal", "delta", "apply", (char *)v1, d, "-o", out, NULL};
    char *ip[] = {"shoal", "delta", "apply", "--in-place", cp, d, NULL};
    SH_TRY(scale_step(o, S_MAKE, mk, r));
    struct stat st;
    r->delta_bytes = stat(d, &st) == 0 ? (uint64_t)st.st_size : 0;
    if (!o->json) fprintf(stderr, "baseline  xor+zstd-1 over the same pair ...\n");
    ckpt *B, *T;
    SH_TRY(ckpt_open(v1, &B));
    int rc = ckpt_open(v2, &T);
    double t0 = sh_now_mono();
    if (rc == SH_OK) rc = delta_baseline_xor_zstd(B, T, 0, &r->xor_bytes);
    r->xor_s = sh_now_mono() - t0;
    ckpt_close(B);
    if (rc == SH_OK) ckpt_close(T);
    if (rc == SH_OK) rc = scale_step(o, S_APPLY, ap, r);
    if (rc == SH_OK && !scale_same(out, v2))
        rc = sh_err(SH_EMISMATCH, "bench scale: delta apply did not rebuild %s byte for byte", v2);
    unlink(out);
    if (rc == SH_OK) rc = scale_copy(v1, cp);
    if (rc == SH_OK) rc = scale_step(o, S_INPLACE, ip, r);
    if (rc == SH_OK && !scale_same(cp, v2))
        rc = sh_err(SH_EMISMATCH, "bench scale: in-place apply did not rebuild %s byte for byte", v2);
    unlink(cp);
    return rc;
}

static int scale_store(const scale_opts *o, const char *dir, const char *v1, const char *v2,
                       scale_res *r)
{
    char store_dir[4200];
    snprintf(store_dir, sizeof store_dir, "%s/store", dir);
    char *a1[] = {"shoal", "store", "publish", store_dir, (char *)v1, NULL};
    char *a2[] = {"shoal", "store", "publish", store_dir, (char *)v2, NULL};
    SH_TRY(scale_step(o, S_ANCHOR, a1, r));
    scale_tree t = {0};
    if (!o->json) fprintf(stderr, "push      seeding %d replicas with version 1, starting the tree ...\n",
                          o->replicas);
    int rc = scale_tree_start(dir, store_dir, o->replicas, &t);
    double t0 = sh_now_mono();
    if (rc == SH_OK) rc = scale_step(o, S_PUBLISH, a2, r);
    if (rc == SH_OK && !o->json) fprintf(stderr, "push      until %d replicas activate version 2 ...\n",
                                         o->replicas);
    if (rc == SH_OK) rc = scale_tree_wait(&t, 2, &r->peak[S_PUSH]);
    r->secs[S_PUSH] = sh_now_mono() - t0 - r->secs[S_PUBLISH];
    scale_tree_stop(&t);
    return rc;
}

static void scale_print(const scale_opts *o, const scale_res *r)
{
    double gb = (double)r->ckpt_bytes / 1e9, ratio = (double)r->delta_bytes / (double)r->xor_bytes;
    uint64_t bound = (64ull << 20) + r->delta_bytes;
    if (o->json) {
        json_t *steps = json_object();
        for (int i = 0; i < S_N; i++)
            json_object_set_new(steps, step_names[i],
                                json_pack("{s:f,s:f,s:I}", "seconds", r->secs[i], "gb_per_s",
                                          r->secs[i] > 0 ? gb / r->secs[i] : 0.0, "peak_anon_bytes",
                                          (json_int_t)r->peak[i]));
        json_t *j = json_pack(
            "{s:s,s:I,s:I,s:I,s:I,s:f,s:I,s:f,s:f,s:f,s:o,s:I,s:b}", "model", "llama3-8b",
            "layers", (json_int_t)o->layers, "tensors", (json_int_t)r->tensors, "checkpoint_bytes",
            (json_int_t)r->ckpt_bytes, "delta_bytes", (json_int_t)r->delta_bytes, "lr", o->lr,
            "xor_zstd1_bytes", (json_int_t)r->xor_bytes, "size_vs_xor", ratio, "generate_s",
            r->gen_s, "next_s", r->next_s, "steps", steps, "anon_bound_bytes", (json_int_t)bound,
            "anon_bound_met",
            r->peak[S_MAKE] <= bound && r->peak[S_APPLY] <= bound && r->peak[S_INPLACE] <= bound);
        json_object_set_new(j, "replicas", json_integer(o->replicas));
        json_object_set_new(j, "shrink", json_integer((json_int_t)(o->shrink ? o->shrink : 1)));
        json_object_set_new(j, "xor_zstd1_s", json_real(r->xor_s));
        sh_json_print(j);
        json_decref(j);
        return;
    }
    char b1[32], b2[32], b3[32];
    printf("shoal bench scale: llama3-8b with %llu layers, %llu tensors, %s; next version by AdamW "
           "lr %g\n\n", (unsigned long long)o->layers, (unsigned long long)r->tensors,
           sh_fmt_bytes((double)r->ckpt_bytes, b1, sizeof b1), o->lr);
    printf("delta %s = %.3f x xor+zstd-1 (%s, %.2f s in process) (target <= 0.5) %s\n\n",
           sh_fmt_bytes((double)r->delta_bytes, b2, sizeof b2), ratio,
           sh_fmt_bytes((double)r->xor_bytes, b3, sizeof b3), r->xor_s, ratio <= 0.5 ? "met" : "MISSED");
    printf("| step      | seconds | GB/s  | peak anon MiB |\n|-----------|--------:|------:|--------------:|\n");
    for (int i = 0; i < S_N; i++)
        printf("| %-9s | %7.2f | %5.2f | %13.1f |\n", step_names[i], r->secs[i],
               r->secs[i] > 0 ? gb / r->secs[i] : 0.0, (double)r->peak[i] / 1048576.0);
    printf("\nmemory bound of make and apply: 64 MiB + delta = %.1f MiB %s; push: the largest of "
           "%d replicas, which hold the model in memory\n", (double)bound / 1048576.0,
           r->peak[S_MAKE] <= bound && r->peak[S_APPLY] <= bound && r->peak[S_INPLACE] <= bound
               ? "met" : "MISSED", o->replicas);
}

int cli_bench_scale(int argc, char **argv)
{
    scale_opts o = {.layers = 2, .replicas = 4, .lr = 1e-6};
    int rc = scale_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    const char *tmp = o.dir ? o.dir : getenv("TMPDIR");
    char dir[4096], v1[4200], v2[4200];
    snprintf(dir, sizeof dir, "%s/shoal-bench-scale.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return cli_fail("bench scale", sh_err_errno(errno, "mkdtemp %s", dir));
    snprintf(v1, sizeof v1, "%s/v1.safetensors", dir);
    snprintf(v2, sizeof v2, "%s/v2.safetensors", dir);
    scale_res r = {0};
    rc = scale_generate(&o, v1, v2, &r);
    if (rc == SH_OK) rc = scale_codec(&o, dir, v1, v2, &r);
    if (rc == SH_OK) rc = scale_store(&o, dir, v1, v2, &r);
    if (rc < 0) {
        fprintf(stderr, "shoal bench scale: files kept in %s\n", dir);
        return cli_fail("bench scale", rc);
    }
    sh_rm_rf(dir);
    scale_print(&o, &r);
    return 0;
}
