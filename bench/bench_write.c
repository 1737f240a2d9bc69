/* shoal bench write: the ways a replica can put a new model file's bytes in
 * place, timed on this machine (bench/results/2026-12-03-notebook.md, "Writing a model file").
 * A replica writes each version from its image in anonymous memory into
 * the file its activation before last replaced (src/weights/store/activate.c); the
 * bench compares pwrite with a copy through a mapping of the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli_int.h"

const char cli_bench_help_write[] = "writing a model file: pwrite against a copy through a mapping [--json]";

static const char usage[] =
    "usage: shoal bench write [--mb N] [--reps N] [--dir DIR] [--json]\n\n"
    "Times putting N MB (default 50, the size of `bench push`'s model) from\n"
    "anonymous memory in large pages into a file on DIR (default /dev/shm, a\n"
    "serving node's page cache), the thread's CPU time for each of:\n"
    "  pwrite_recycled  pwrite over a file that already holds N MB (a replica's\n"
    "                   recycled model file)\n"
    "  pwrite_new       pwrite into a new file\n"
    "  map_kept         memcpy through a shared mapping of the recycled file\n"
    "                   that was written through before (a kept mapping)\n"
    "  map_kept_after   the same, after another mapping of the file was read\n"
    "                   and unmapped (what serving the previous version does)\n"
    "  map_new          memcpy through a new mapping of a new file\n"
    "Each is the median of --reps runs (default 5); `vs_pwrite` divides by\n"
    "pwrite_recycled, measured in the same run.\n";

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { W_PWRITE_RECYCLED, W_PWRITE_NEW, W_MAP_KEPT, W_MAP_KEPT_AFTER, W_MAP_NEW, W_N };
static const char *const names[W_N] = {"pwrite_recycled", "pwrite_new", "map_kept", "map_kept_after", "map_new"};

static int new_file(const char *path, size_t n, int *fd)
{
    unlink(path);
    *fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (*fd < 0) return sh_err_errno(errno, "create %s", path);
    if (ftruncate(*fd, (off_t)n) < 0) return sh_err_errno(errno, "size %s", path);
    return SH_OK;
}

/* One run of each way; seconds of CPU into t[]. */
static int run_once(const char *dir, const uint8_t *img, size_t n, double t[W_N])
{
    char rec[4200], fresh[4200];
    snprintf(rec, sizeof rec, "%s/recycled", dir);
    snprintf(fresh, sizeof fresh, "%s/new", dir);
    int fd, nfd;
    SH_TRY(new_file(rec, n, &fd));
    int rc = sh_pwrite_all(fd, img, n, 0, rec); /* the recycled file's pages exist */
    uint8_t *kept = rc == 0 ? mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (rc == 0 && kept == MAP_FAILED) rc = sh_err_errno(errno, "mmap %s", rec);
    if (rc == 0) memcpy(kept, img, n); /* written through once: its page table is filled */
    double c0 = cpu_now();
    if (rc == 0) rc = sh_pwrite_all(fd, img, n, 0, rec);
    t[W_PWRITE_RECYCLED] = cpu_now() - c0;
    c0 = cpu_now();
    if (rc == 0) memcpy(kept, img, n);
    t[W_MAP_KEPT] = cpu_now() - c0;
    if (rc == 0) {
        uint8_t *other = mmap(NULL, n, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (other != MAP_FAILED) munmap(other, n);
        c0 = cpu_now();
        memcpy(kept, img, n);
        t[W_MAP_KEPT_AFTER] = cpu_now() - c0;
    }
    if (rc == 0) rc = new_file(fresh, n, &nfd);
    c0 = cpu_now();
    if (rc == 0) rc = sh_pwrite_all(nfd, img, n, 0, fresh);
    t[W_PWRITE_NEW] = cpu_now() - c0;
    if (rc == 0) {
        close(nfd);
        rc = new_file(fresh, n, &nfd);
    }
    c0 = cpu_now();
    uint8_t *m = rc == 0 ? mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, nfd, 0) : MAP_FAILED;
    if (rc == 0 && m == MAP_FAILED) rc = sh_err_errno(errno, "mmap %s", fresh);
    if (rc == 0) memcpy(m, img, n), munmap(m, n);
    t[W_MAP_NEW] = cpu_now() - c0;
    if (kept != MAP_FAILED) munmap(kept, n);
    close(fd);
    if (rc == 0) close(nfd);
    unlink(rec), unlink(fresh);
    return rc;
}

/* The median of each way's CPU seconds over reps runs (t[k][w]) into med. */
static int medians(double (*t)[W_N], int64_t reps, double *med)
{
    double *v = malloc((size_t)reps * sizeof *v);
    if (!v) return sh_err(SH_ENOMEM, "bench write");
    for (int w = 0; w < W_N; w++) {
        for (int64_t k = 0; k < reps; k++) v[k] = t[k][w];
        qsort(v, (size_t)reps, sizeof *v, cmp_double);
        med[w] = v[reps / 2];
    }
    free(v);
    return SH_OK;
}

/* reps runs of every way of writing an n-byte image into a directory made
 * under base; med: each way's median CPU seconds. */
static int run_reps(const char *base, size_t n, int64_t reps, double *med)
{
    size_t cap = (n + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/shoal-bench-write.XXXXXX", base);
    if (!mkdtemp(dir)) return sh_err_errno(errno, "mkdtemp in %s (--dir)", base);
    uint8_t *img = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (img == MAP_FAILED) {
        int rc = sh_err_errno(errno, "%zu bytes of memory", cap);
        sh_rm_rf(dir);
        return rc;
    }
    madvise(img, cap, MADV_HUGEPAGE);
    for (size_t i = 0; i < n; i++) img[i] = (uint8_t)(i * 2654435761u >> 13);
    double (*t)[W_N] = calloc((size_t)reps, sizeof *t);
    int rc = t ? SH_OK : sh_err(SH_ENOMEM, "bench write");
    sh_progress pg;
    sh_progress_start(&pg, "bench write", (uint64_t)reps, "runs");
    for (int64_t k = 0; rc == 0 && k < reps; k++) {
        rc = run_once(dir, img, n, t[k]);
        sh_progress_update(&pg, (uint64_t)k + 1);
    }
    sh_progress_finish(&pg);
    munmap(img, cap);
    sh_rm_rf(dir);
    if (rc == 0) rc = medians(t, reps, med);
    free(t);
    return rc;
}

int cli_bench_write(int argc, char **argv)
{
    static const struct option opts[] = {{"mb", required_argument, 0, 'm'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"dir", required_argument, 0, 'd'},
                                         {"json", no_argument, 0, 'j'},
                                         {0}};
    cli_args a = {"bench write", usage, opts, NULL};
    int json = 0;
    int64_t mb = 50, reps = 5;
    const char *base = "/dev/shm";
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        if (c == 'j') json = 1;
        else if (c == 'd') base = optarg;
        else if (c == 'm' || c == 'r') {
            int64_t *v = c == 'm' ? &mb : &reps;
            if (sh_parse_i64(optarg, v, c == 'm' ? "--mb" : "--reps") < 0 || *v < 1 || *v > 65536)
                return cli_usage("bench write", "%s: expected 1..65536", c == 'm' ? "--mb" : "--reps");
        } else return a.rc;
    }
    if (optind < argc) return cli_usage("bench write", "unexpected argument \"%s\"", argv[optind]);
    size_t n = (size_t)mb * 1000 * 1000;
    double med[W_N];
    int rc = run_reps(base, n, reps, med);
    if (rc < 0) return cli_fail("bench write", rc);
    if (json) {
        json_t *j = json_pack("{s:I,s:I,s:s}", "bytes", (json_int_t)n, "reps", (json_int_t)reps, "dir", base);
        for (int w = 0; w < W_N; w++)
            json_object_set_new(j, names[w], json_pack("{s:f,s:f}", "cpu_ms", med[w] * 1e3, "vs_pwrite",
                                                       med[W_PWRITE_RECYCLED] > 0 ? med[w] / med[W_PWRITE_RECYCLED] : 0));
        sh_json_print(j);
        json_decref(j);
        return 0;
    }
    printf("writing %lld MB from anonymous memory into a file on %s (CPU ms, median of %lld)\n", (long long)mb,
           base, (long long)reps);
    for (int w = 0; w < W_N; w++)
        printf("  %-16s %8.2f ms  %6.2fx pwrite_recycled\n", names[w], med[w] * 1e3,
               med[W_PWRITE_RECYCLED] > 0 ? med[w] / med[W_PWRITE_RECYCLED] : 0);
    return 0;
}
