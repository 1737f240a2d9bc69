/* shoal bench delta: shoal's codec against XOR + zstd-1 in 8 MiB chunks
 * (the scheme of Modal's "stitch"), both on one core, on the same pair of
 * checkpoints in memory, plus the empirical entropy bound of the change. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h> /* the same vector width as shoal uses */
#endif
#include <zstd.h>

#include "cli/cli_int.h"
#include "shoal/delta.h"
#include "shoal/nn.h"

const char cli_bench_help_delta[] = "delta codec vs XOR+zstd-1: size, make/apply speed, memory [--json]";

static const char bench_usage[] =
    "usage: shoal bench delta [--params N] [--lr LR] [--steps K] [--seed S] [--reps R]\n"
    "                         [--train-lr LR] [--train-steps K] [--dtypes] [BASE NEW] [--json]\n\n"
    "Without BASE NEW, generates a bf16 pair with `shoal ckpt synth --params N` and\n"
    "`shoal ckpt step --lr LR --steps K` (defaults: 256M, 1e-6, 1) in $TMPDIR.\n"
    "Measures on one core (CPU seconds of the measuring thread; the median of R\n"
    "runs, default 3, and their range, after one uncounted warm-up run), both\n"
    "codecs reading the same checkpoints loaded in memory and writing to memory:\n"
    "delta bytes, make and apply seconds, peak extra memory (resident anonymous\n"
    "memory above the start, the warm-up run included), and the entropy bound: for each\n"
    "tensor, n H(k/n) bits for which of its n elements changed plus k times the\n"
    "empirical entropy of its k changes' ulp differences.  Every image either\n"
    "codec reads or writes is allocated once (transparent huge pages asked for),\n"
    "faulted in before timing and reused by every run; the machine's one-core\n"
    "memcpy, xxh3 and copy+xxh3 speeds over the same image are measured too:\n"
    "copy+xxh3 is the ceiling of apply into a new buffer.\n"
    "Then the file layer runs as the commands do, each in a child process whose\n"
    "RssAnon is sampled every millisecond: `delta make`, `delta apply -o` and\n"
    "`delta apply --in-place` (peak_anon_bytes; bound: 64 MiB plus the delta).\n"
    "Per dtype (without BASE NEW, or alone with --dtypes): a 4.2M-parameter GPT\n"
    "(src/rl/nn) trained for real on a seeded Markov language with AdamW (torch's\n"
    "defaults: betas 0.9/0.999, weight decay 0.01, clip 1; fp32 masters) for\n"
    "--train-steps steps (default 30) at --train-lr (default 1e-5), then one more\n"
    "step: the pair before/after it, cast to bf16, fp16 and fp32 (as a PyTorch\n"
    "user publishing a cast of the masters does), through shoal and XOR+zstd-1\n"
    "(delta bytes, ratio, changed fraction).  A few seconds.\n";

#define XOR_CHUNK (8u << 20)

/* CPU seconds of the calling thread: the machine may be shared, and a
 * one-core measurement should not count time spent waiting for the core. */
static double bench_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- Peak anonymous memory, sampled by a thread -------------------------- */

typedef struct {
    volatile int stop;
    uint64_t peak;
    pthread_t tid;
} bench_mem;

static void *bench_mem_run(void *p)
{
    bench_mem *m = p;
    while (!m->stop) {
        uint64_t r = sh_rss_anon(getpid());
        if (r > m->peak) m->peak = r;
        usleep(2000);
    }
    return NULL;
}

static void bench_mem_start(bench_mem *m)
{
    m->stop = 0;
    m->peak = sh_rss_anon(getpid());
    pthread_create(&m->tid, NULL, bench_mem_run, m);
}

static uint64_t bench_mem_stop(bench_mem *m, uint64_t before)
{
    m->stop = 1;
    pthread_join(m->tid, NULL);
    uint64_t r = sh_rss_anon(getpid());
    if (r > m->peak) m->peak = r;
    return m->peak > before ? m->peak - before : 0;
}

/* ---- The baseline: XOR of the tensor bytes, zstd-1 per 8 MiB ------------- */

/* The checkpoint's tensor bytes as one stream (target order); the base side
 * reads the same-named tensor, or zeros when there is none. */
typedef struct {
    const ckpt *b, *t;
} bench_pair;

enum { FILL_NEW, FILL_XOR, FILL_BASE };

static void bench_fill(const bench_pair *p, uint64_t off, uint8_t *x, size_t n, int mode)
{
    uint64_t pos = 0;
    size_t done = 0;
    for (size_t i = 0; i < p->t->ntensors && done < n; i++) {
        const ckpt_tensor *t = &p->t->tensors[i];
        if (off + done >= pos + t->nbytes) {
            pos += t->nbytes;
            continue;
        }
        uint64_t in = off + done - pos;
        size_t k = t->nbytes - in < n - done ? (size_t)(t->nbytes - in) : n - done;
        const ckpt_tensor *b = ckpt_find(p->b, t->name);
        const uint8_t *src = t->data + in;
        int has_b = b && b->nbytes == t->nbytes;
        if (mode == FILL_XOR && has_b) {
            const uint8_t *bs = b->data + in;
            for (size_t j = 0; j < k; j++) x[done + j] = src[j] ^ bs[j];
        } else if (mode == FILL_BASE) {
            if (has_b) memcpy(x + done, b->data + in, k);
            else memset(x + done, 0, k);
        } else {
            memcpy(x + done, src, k);
        }
        done += k;
        pos += t->nbytes;
    }
}

typedef struct {
    uint64_t bytes;
    double make_s, apply_s, inplace_s;
} bench_xor;

/* The baseline's buffers, allocated once for every run like shoal's images:
 * one 8 MiB XOR chunk and the compressed chunks, packed. */
typedef struct {
    uint8_t *x, *z;
    size_t zcap, nch, *zl;
} bench_xbufs;

/* Decompresses each chunk and XORs it into out, which first gets the base's
 * bytes (into a new buffer) or already holds them (in place); returns the
 * xxh3-128 of the result. */
static XXH128_hash_t bench_xor_apply(const bench_pair *p, const bench_xbufs *xb, ZSTD_DCtx *dc,
                                     uint8_t *out, int from_base)
{
    size_t zoff = 0;
    for (size_t c = 0; c < xb->nch; c++) {
        size_t n = ZSTD_decompressDCtx(dc, xb->x, XOR_CHUNK, xb->z + zoff, xb->zl[c]);
        uint8_t *o = out + (uint64_t)c * XOR_CHUNK;
        zoff += xb->zl[c];
        if (ZSTD_isError(n)) n = 0; /* then the digest cannot match */
        if (from_base) bench_fill(p, (uint64_t)c * XOR_CHUNK, o, n, FILL_BASE);
        for (size_t j = 0; j < n; j++) o[j] ^= xb->x[j];
    }
    return XXH3_128bits(out, ckpt_data_bytes(p->t));
}

static int bench_xor_run(const bench_pair *p, const bench_xbufs *xb, uint8_t *out, bench_xor *r)
{
    uint64_t total = ckpt_data_bytes(p->t);
    uint8_t *x = xb->x, *z = xb->z;
    size_t *zl = xb->zl, zoff = 0;
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    XXH3_state_t *h = XXH3_createState();
    int rc = cc && dc && h ? SH_OK : sh_err(SH_ENOMEM, "out of memory");
    if (rc < 0) goto out;
    double t0 = bench_cpu();
    XXH3_128bits_reset(h);
    r->bytes = 16;
    /* The new state's hash, as stitch records it, straight from the tensors. */
    for (size_t i = 0; i < p->t->ntensors; i++)
        XXH3_128bits_update(h, p->t->tensors[i].data, p->t->tensors[i].nbytes);
    for (size_t c = 0; c < xb->nch && rc == SH_OK; c++) {
        size_t n = total - (uint64_t)c * XOR_CHUNK < XOR_CHUNK ? (size_t)(total - (uint64_t)c * XOR_CHUNK) : XOR_CHUNK;
        bench_fill(p, (uint64_t)c * XOR_CHUNK, x, n, FILL_XOR);
        zl[c] = ZSTD_compressCCtx(cc, z + zoff, xb->zcap - zoff, x, n, 1);
        if (ZSTD_isError(zl[c])) rc = sh_err(SH_EINTERNAL, "zstd: %s", ZSTD_getErrorName(zl[c]));
        else zoff += zl[c], r->bytes += zl[c];
    }
    XXH128_hash_t want = XXH3_128bits_digest(h);
    r->make_s = bench_cpu() - t0;
    if (rc < 0) goto out;
    /* Apply: decompress each chunk and XOR it onto the base, then check the
     * xxh3-128 of the final state. */
    t0 = bench_cpu();
    XXH128_hash_t got = bench_xor_apply(p, xb, dc, out, 1);
    r->apply_s = bench_cpu() - t0;
    int ok = got.low64 == want.low64 && got.high64 == want.high64;
    /* In place: the state already holds the base; XOR each chunk into it. */
    bench_fill(p, 0, out, (size_t)total, FILL_BASE);
    t0 = bench_cpu();
    got = bench_xor_apply(p, xb, dc, out, 0);
    r->inplace_s = bench_cpu() - t0;
    ok = ok && got.low64 == want.low64 && got.high64 == want.high64;
    if (!ok) rc = sh_err(SH_EINTERNAL, "xor+zstd baseline did not round-trip");
out:
    XXH3_freeState(h);
    ZSTD_freeCCtx(cc);
    ZSTD_freeDCtx(dc);
    return rc;
}

/* ---- The entropy bound ----------------------------------------------------- */

static int bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double bench_h(double p) { return p <= 0 || p >= 1 ? 0 : -p * log2(p) - (1 - p) * log2(1 - p); }

/* Bits to code which units of one tensor changed (iid) and their values
 * (order-0 entropy of the zigzagged ord-differences). */
static double bench_tensor_bits(const ckpt_tensor *b, const ckpt_tensor *t, uint64_t *changed)
{
    unsigned w = ckpt_dtype_bits(t->dtype) / 8;
    if (w != 1 && w != 2 && w != 4 && w != 8) w = 1;
    int fl = ckpt_dtype_is_float(t->dtype);
    uint64_t n = t->nbytes / w, k = 0, S = 1ull << (8 * w - 1);
    uint64_t mask = w == 8 ? ~0ull : (1ull << (8 * w)) - 1;
    uint64_t *z = malloc(sizeof *z * (n ? n : 1));
    if (!z) return NAN;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t u = 0, v = 0;
        memcpy(&u, b->data + i * w, w);
        memcpy(&v, t->data + i * w, w);
        if (u == v) continue;
        if (fl) u = u < S ? u : (S - 1 - u) & mask, v = v < S ? v : (S - 1 - v) & mask;
        z[k++] = (v - u) & mask;
    }
    qsort(z, k, sizeof *z, bench_cmp_u64);
    double bits = (double)n * bench_h((double)k / (double)n);
    for (uint64_t i = 0; i < k;) {
        uint64_t j = i;
        while (j < k && z[j] == z[i]) j++;
        bits -= (double)(j - i) * log2((double)(j - i) / (double)k);
        i = j;
    }
    free(z);
    *changed += k;
    return bits;
}

static double bench_bound(const ckpt *B, const ckpt *T, uint64_t *changed, uint64_t *units)
{
    double bits = 0;
    for (size_t i = 0; i < T->ntensors; i++) {
        const ckpt_tensor *t = &T->tensors[i], *b = ckpt_find(B, t->name);
        if (b && b->dtype == t->dtype && b->nbytes == t->nbytes) {
            bits += bench_tensor_bits(b, t, changed);
            *units += t->nbytes / (ckpt_dtype_bits(t->dtype) >= 8 ? ckpt_dtype_bits(t->dtype) / 8 : 1);
        } else {
            bits += 8.0 * (double)t->nbytes; /* carried whole: no model here */
        }
    }
    return bits / 8;
}

/* ---- Memory the codecs run in -------------------------------------------- */

/* Why every image is allocated here, once: on this kind of machine (a
 * virtual machine whose memory the host backs lazily, transparent huge pages
 * only on request) the first touch of a page costs microseconds and a pass
 * over 4 KiB pages costs TLB walks that a pass over 2 MiB pages does not
 * (xxh3 of 512 MB: 15 GB/s against 29 GB/s, measured).  Images malloc'd per
 * run made each codec's timing depend on what the kernel had at hand, which
 * is what made shoal's figures swing from run to run.  So both codecs read
 * and write the same huge-page images, faulted in before any timing. */
static uint8_t *bench_alloc(size_t n)
{
    size_t len = n ? n : 1;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: fine if refused */
    memset(p, 0, len);
    return p;
}

static void bench_release(uint8_t *p, size_t n)
{
    if (p) munmap(p, n ? n : 1);
}

/* Loads a checkpoint file into such an image and opens it there: both
 * codecs then read the same bytes at memory speed.  (Reading through a file
 * mapping measures the machine's page-cache mapping, not the codec.) */
static int bench_load(const char *path, uint8_t **buf, size_t *len, ckpt **out)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int rc = sh_err_errno(errno, "open %s", path);
        if (fd >= 0) close(fd);
        return rc;
    }
    *len = (size_t)st.st_size;
    *buf = bench_alloc(*len);
    int rc = *buf ? SH_OK : sh_err(SH_ENOMEM, "out of memory for %s (%zu bytes)", path, *len);
    for (size_t done = 0; rc == SH_OK && done < *len;) {
        ssize_t r = read(fd, *buf + done, *len - done);
        if (r <= 0) rc = sh_err_errno(r < 0 ? errno : EIO, "read %s", path);
        else done += (size_t)r;
    }
    close(fd);
    if (rc == SH_OK) rc = ckpt_open_mem(*buf, *len, path, out);
    return rc;
}

/* ---- Runs: median and range ------------------------------------------------ */

#define BENCH_MAX_REPS 100
typedef struct {
    double v[BENCH_MAX_REPS];
    int n;
} bench_stat;

static void bench_add(bench_stat *s, double v)
{
    if (s->n < BENCH_MAX_REPS) s->v[s->n++] = v;
}

static int bench_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median (the mean of the middle two for an even count), min and max. */
static double bench_med(const bench_stat *s, double *lo, double *hi)
{
    double v[BENCH_MAX_REPS];
    if (!s->n) return *lo = *hi = NAN;
    memcpy(v, s->v, sizeof(double) * (size_t)s->n);
    qsort(v, (size_t)s->n, sizeof *v, bench_cmp_d);
    *lo = v[0], *hi = v[s->n - 1];
    return s->n % 2 ? v[s->n / 2] : (v[s->n / 2 - 1] + v[s->n / 2]) / 2;
}

/* ---- The machine's ceiling -------------------------------------------------- */

/* One core's memcpy, xxh3-128 and copy+xxh3 (in 64 KiB pieces, each hashed
 * while in cache: the least any apply into a new buffer must do) over the
 * base image, in seconds. */
static void bench_ceiling(const uint8_t *src, uint8_t *dst, size_t n, double *cp, double *hs,
                          double *cphs)
{
    double t0 = bench_cpu();
    memcpy(dst, src, n);
    *cp = bench_cpu() - t0;
    t0 = bench_cpu();
    XXH128_hash_t a = XXH3_128bits(dst, n);
    *hs = bench_cpu() - t0;
    XXH3_state_t *h = XXH3_createState();
    t0 = bench_cpu();
    XXH3_128bits_reset(h);
    for (size_t i = 0; i < n; i += 65536) {
        size_t k = n - i < 65536 ? n - i : 65536;
        memcpy(dst + i, src + i, k);
        XXH3_128bits_update(h, dst + i, k);
    }
    XXH128_hash_t b = XXH3_128bits_digest(h);
    *cphs = bench_cpu() - t0;
    XXH3_freeState(h);
    if (a.low64 != b.low64) *cphs = NAN; /* cannot happen; keeps the hashes live */
}

/* ---- Per dtype: steps of a real AdamW training ------------------------------ */

typedef struct {
    const char *dtype;
    uint64_t bytes, xbytes, changed, units, ckpt_bytes;
} bench_dt;

typedef struct {
    uint64_t params, steps;
    double lr;
    float loss0, loss;
    bench_dt d[3];
} bench_dts;

/* A seeded Markov language: each token has four likely successors. */
static uint64_t bench_rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int bench_train_step(nn_model *m, nn_adamw *opt, const int *succ, int V, int B, int T, uint64_t *rs,
                            float *loss)
{
    int tok[8 * 33], tgt[8 * 32];
    uint8_t mask[8 * 32];
    for (int b = 0; b < B; b++) {
        int cur = (int)(bench_rnd(rs) % (uint64_t)V);
        for (int t = 0; t <= T; t++) {
            tok[b * (T + 1) + t] = cur;
            uint64_t r = bench_rnd(rs);
            cur = r % 100 < 85 ? succ[cur * 4 + (int)((r >> 8) % 4)] : (int)((r >> 16) % (uint64_t)V);
        }
    }
    int in[8 * 32];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            in[b * T + t] = tok[b * (T + 1) + t];
            tgt[b * T + t] = tok[b * (T + 1) + t + 1];
            mask[b * T + t] = 1;
        }
    const float *logits, *dl;
    nn_zero_grad(m);
    SH_TRY(nn_forward(m, in, B, T, &logits));
    SH_TRY(nn_xent(m, tgt, mask, loss, &dl));
    SH_TRY(nn_backward(m, dl));
    return nn_adamw_step(opt, m, NULL);
}

/* Writes the model's parameters p (nn_num_params floats) cast to dtype as
 * a checkpoint at path. */
static int bench_save_cast(const nn_model *m, const float *p, ckpt_dtype dt, const char *path)
{
    int n = nn_num_tensors(m);
    size_t np = nn_num_params(m), w = dt == CKPT_F32 ? 4 : 2;
    uint8_t *buf = malloc(np * w + 1);
    ckpt_tensor *t = calloc((size_t)n + 1, sizeof *t);
    if (!buf || !t) {
        free(buf), free(t);
        return sh_err(SH_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < np; i++) {
        if (dt == CKPT_F32) {
            memcpy(buf + 4 * i, &p[i], 4);
        } else {
            uint16_t h = dt == CKPT_BF16 ? ckpt_f32_to_bf16(p[i]) : ckpt_f32_to_f16(p[i]);
            memcpy(buf + 2 * i, &h, 2);
        }
    }
    for (int i = 0; i < n; i++) {
        const nn_tensor *x = nn_tensor_at(m, i);
        t[i] = (ckpt_tensor){.name = x->name, .dtype = dt, .ndim = x->rows > 1 ? 2 : 1,
                             .data = buf + x->offset * w};
        if (x->rows > 1) t[i].shape[0] = x->rows, t[i].shape[1] = x->cols;
        else t[i].shape[0] = x->cols;
    }
    int rc = ckpt_save(path, t, (size_t)n, NULL);
    free(buf), free(t);
    return rc;
}

/* One dtype's figures: the model before (p0) and after its last step
 * saved as dt in dir, the delta between them, the XOR+zstd baseline and the
 * share of changed values. */
static int dtype_figures(nn_model *m, const float *p0, ckpt_dtype dt, const char *name, const char *dir,
                         bench_dt *x)
{
    char bp[4200], tp[4200];
    snprintf(bp, sizeof bp, "%s/%s.0.safetensors", dir, name);
    snprintf(tp, sizeof tp, "%s/%s.1.safetensors", dir, name);
    ckpt *Bk = NULL, *Tk = NULL;
    sh_buf out = {0};
    int rc = bench_save_cast(m, p0, dt, bp);
    if (rc == SH_OK) rc = bench_save_cast(m, nn_params(m), dt, tp);
    if (rc == SH_OK) rc = ckpt_open(bp, &Bk);
    if (rc == SH_OK) rc = ckpt_open(tp, &Tk);
    if (rc == SH_OK) rc = delta_make_mem(Bk, Tk, &(delta_opts){.threads = 1}, &out, NULL);
    x->dtype = name;
    if (rc == SH_OK) rc = delta_baseline_xor_zstd(Bk, Tk, 1, &x->xbytes);
    if (rc == SH_OK) {
        x->bytes = out.len;
        x->ckpt_bytes = Tk->files[0].size;
        for (size_t i = 0; i < Tk->ntensors; i++) {
            const ckpt_tensor *a = &Bk->tensors[i], *b = &Tk->tensors[i];
            unsigned w = dt == CKPT_F32 ? 4 : 2;
            for (uint64_t u = 0; u < b->numel; u++) x->changed += memcmp(a->data + u * w, b->data + u * w, w) != 0;
            x->units += b->numel;
        }
    }
    sh_buf_free(&out);
    ckpt_close(Bk);
    ckpt_close(Tk);
    return rc;
}

static int bench_dtypes(double lr, uint64_t steps, uint64_t seed, bench_dts *r)
{
    memset(r, 0, sizeof *r);
    const int V = 2048, B = 8, T = 32;
    nn_config c = {.vocab = V, .ctx = T, .width = 256, .layers = 4, .heads = 4};
    nn_model *m = NULL;
    nn_adamw opt = {0};
    int *succ = malloc(sizeof(int) * 4 * (size_t)V);
    float *p0 = NULL;
    uint64_t rs = seed * 7919 + 1;
    int rc = succ ? nn_new(&c, seed, &m) : sh_err(SH_ENOMEM, "out of memory");
    for (int i = 0; rc == SH_OK && i < 4 * V; i++) succ[i] = (int)(bench_rnd(&rs) % (uint64_t)V);
    if (rc == SH_OK) rc = nn_adamw_init(&opt, m, (float)lr);
    if (rc == SH_OK) {
        opt.beta2 = 0.999f, opt.weight_decay = 0.01f, opt.clip = 1.0f; /* torch.optim.AdamW's defaults */
        r->params = nn_num_params(m), r->steps = steps, r->lr = lr;
        p0 = malloc(sizeof(float) * r->params);
        if (!p0) rc = sh_err(SH_ENOMEM, "out of memory");
    }
    for (uint64_t k = 0; rc == SH_OK && k < steps; k++) {
        rc = bench_train_step(m, &opt, succ, V, B, T, &rs, &r->loss);
        if (k == 0) r->loss0 = r->loss;
    }
    if (rc == SH_OK) {
        memcpy(p0, nn_params(m), sizeof(float) * r->params);
        rc = bench_train_step(m, &opt, succ, V, B, T, &rs, &r->loss);
    }
    char dir[4096] = "";
    if (rc == SH_OK) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/shoal-bench-dtypes.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) rc = sh_err_errno(errno, "mkdtemp %s", dir), dir[0] = 0;
    }
    static const ckpt_dtype dts[3] = {CKPT_BF16, CKPT_F16, CKPT_F32};
    static const char *const names[3] = {"bf16", "fp16", "fp32"};
    for (int d = 0; rc == SH_OK && d < 3; d++) rc = dtype_figures(m, p0, dts[d], names[d], dir, &r->d[d]);
    if (dir[0]) sh_rm_rf(dir);
    free(p0);
    free(succ);
    nn_adamw_free(&opt);
    nn_free(m);
    return rc;
}

static json_t *bench_dtypes_json(const bench_dts *r)
{
    json_t *a = json_array();
    for (int d = 0; d < 3; d++) {
        const bench_dt *x = &r->d[d];
        json_array_append_new(a, json_pack("{s:s,s:I,s:I,s:f,s:f,s:I}", "dtype", x->dtype, "delta_bytes",
                                           (json_int_t)x->bytes, "xor_zstd1_bytes", (json_int_t)x->xbytes,
                                           "ratio", x->xbytes ? (double)x->bytes / (double)x->xbytes : 0.0,
                                           "changed_fraction",
                                           x->units ? (double)x->changed / (double)x->units : 0.0,
                                           "checkpoint_bytes", (json_int_t)x->ckpt_bytes));
    }
    return json_pack("{s:s,s:I,s:f,s:I,s:f,s:f,s:o}", "model", "src/rl/nn GPT, Markov language, AdamW",
                     "params", (json_int_t)r->params, "lr", r->lr, "steps", (json_int_t)r->steps, "loss_first",
                     (double)r->loss0, "loss_last", (double)r->loss, "dtypes", a);
}

static void bench_dtypes_print(const bench_dts *r)
{
    printf("\nper dtype: %llu-parameter GPT (src/rl/nn) after %llu AdamW steps at lr %g (loss %.3f -> %.3f), "
           "one more step, cast from the fp32 masters:\n\n", (unsigned long long)r->params,
           (unsigned long long)r->steps, r->lr, (double)r->loss0, (double)r->loss);
    printf("| dtype | changed |   delta bytes | xor+zstd-1 bytes | vs xor+zstd-1 |\n");
    printf("|-------|--------:|--------------:|-----------------:|--------------:|\n");
    for (int d = 0; d < 3; d++) {
        const bench_dt *x = &r->d[d];
        printf("| %-5s | %6.2f%% | %13llu | %16llu | %13.3f |\n", x->dtype,
               x->units ? 100.0 * (double)x->changed / (double)x->units : 0.0, (unsigned long long)x->bytes,
               (unsigned long long)x->xbytes, x->xbytes ? (double)x->bytes / (double)x->xbytes : 0.0);
    }
}

/* ---- Driver ------------------------------------------------------------------ */

typedef struct {
    uint64_t params, steps, seed, reps;
    double lr;
    int json;
    const char *base, *target;
    double train_lr;
    uint64_t train_steps;
    int dtypes_only;
} bench_opts;

/* 0, -1 after --help or --version, or a usage status. */
static int bench_args(int argc, char **argv, bench_opts *o)
{
    static const struct option opts[] = {{"params", required_argument, 0, 'p'}, {"lr", required_argument, 0, 'l'},
                                         {"steps", required_argument, 0, 'k'},  {"seed", required_argument, 0, 's'},
                                         {"reps", required_argument, 0, 'r'},   {"json", no_argument, 0, 'j'},
                                         {"train-lr", required_argument, 0, 'L'},
                                         {"train-steps", required_argument, 0, 'K'},
                                         {"dtypes", no_argument, 0, 'D'},
                                         {0}};
    cli_args a = {"bench delta", bench_usage, opts, NULL};
    for (int c; (c = cli_getopt(&a, argc, argv)) != -1;) {
        int rc = 0;
        switch (c) {
        case 'j': o->json = 1; break;
        case 'p': rc = sh_parse_size(optarg, &o->params, "--params"); break;
        case 'l': rc = sh_parse_double(optarg, &o->lr, "--lr"); break;
        case 'k': rc = sh_parse_u64(optarg, &o->steps, "--steps"); break;
        case 's': rc = sh_parse_u64(optarg, &o->seed, "--seed"); break;
        case 'r': rc = sh_parse_u64(optarg, &o->reps, "--reps"); break;
        case 'L': rc = sh_parse_double(optarg, &o->train_lr, "--train-lr"); break;
        case 'K': rc = sh_parse_u64(optarg, &o->train_steps, "--train-steps"); break;
        case 'D': o->dtypes_only = 1; break;
        default: return a.rc ? a.rc : -1;
        }
        if (rc < 0) return cli_usage("bench delta", "%s", sh_errmsg());
    }
    const char **pos = (const char **)argv + optind;
    int np = argc - optind;
    if (np > 2) return cli_usage("bench delta", "unexpected argument \"%s\"", pos[2]);
    if (np == 1) return cli_usage("bench delta", "give both BASE and NEW, or neither");
    if (np == 2) o->base = pos[0], o->target = pos[1];
    if (o->params < 1000) return cli_usage("bench delta", "--params must be at least 1000");
    if (o->reps < 1 || o->reps > BENCH_MAX_REPS) return cli_usage("bench delta", "--reps must be 1..100");
    if (!(o->train_lr > 0 && o->train_lr <= 1))
        return cli_usage("bench delta", "--train-lr %g: use a learning rate in (0, 1]", o->train_lr);
    if (o->train_steps > 100000) return cli_usage("bench delta", "--train-steps must be 0..100000");
    if (o->dtypes_only && o->base) return cli_usage("bench delta", "--dtypes trains its own pairs: give no BASE NEW");
    return 0;
}

/* Generates the pair into dir; returns 0 or a CLI status. */
static int bench_generate(const bench_opts *o, char *dir, char *bp, char *tp)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, 4096, "%s/shoal-bench-delta.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return cli_fail("bench delta", sh_err_errno(errno, "mkdtemp %s", dir));
    snprintf(bp, 4096, "%s/base.safetensors", dir);
    snprintf(tp, 4096, "%s/new.safetensors", dir);
    if (!o->json) fprintf(stderr, "generating a %llu-parameter bf16 pair in %s ...\n",
                          (unsigned long long)o->params, dir);
    int rc = ckpt_synth(bp, o->params, o->seed);
    if (rc == SH_OK) rc = ckpt_step(bp, tp, o->lr, o->steps, o->seed + 1);
    if (rc < 0) {
        sh_rm_rf(dir);
        return cli_fail("bench delta", rc);
    }
    return 0;
}

/* Figures measured once per run; the report gives their medians and ranges. */
enum { F_XMAKE, F_XAPPLY, F_XINPLACE, F_MAKE, F_APPLY, F_INPLACE, F_MAKEX, F_MEMCPY, F_XXH3,
       F_COPYHASH, F_N };

typedef struct {
    uint64_t bytes, xbytes, changed, units, params, ckpt_bytes;
    double bound;
    uint64_t peak_make, peak_apply;
    /* The file layer in a child process: peak RssAnon of `delta make`,
     * `delta apply -o` and `delta apply --in-place`, and its delta size. */
    uint64_t anon_make, anon_apply, anon_inplace, file_delta;
    bench_stat f[F_N];
} bench_res;

/* One run of shoal: make, apply into out, and apply in place (when the
 * layout allows: out then holds the base image first). */
static int bench_shoal(const ckpt *B, const ckpt *T, uint8_t *out, uint64_t size, bench_res *r)
{
    delta_opts one = {.threads = 1};
    sh_buf d = {0};
    bench_mem m;
    uint64_t before = sh_rss_anon(getpid());
    bench_mem_start(&m);
    double t0 = bench_cpu();
    int rc = delta_make_mem(B, T, &one, &d, NULL);
    bench_add(&r->f[F_MAKE], bench_cpu() - t0);
    uint64_t peak = bench_mem_stop(&m, before);
    if (peak > r->peak_make) r->peak_make = peak;
    SH_TRY(rc);
    r->bytes = d.len;
    delta *dp = NULL;
    size_t len = 0;
    before = sh_rss_anon(getpid());
    bench_mem_start(&m);
    t0 = bench_cpu();
    rc = delta_parse(d.data, d.len, 0, &dp);
    if (rc == SH_OK) rc = delta_apply_mem(B, dp, &one, out, size, &len);
    bench_add(&r->f[F_APPLY], bench_cpu() - t0);
    peak = bench_mem_stop(&m, before);
    if (peak > r->peak_apply) r->peak_apply = peak;
    if (rc == SH_OK && (len != T->files[0].size || memcmp(out, T->files[0].map, len)))
        rc = sh_err(SH_EINTERNAL, "shoal apply did not reproduce the target");
    if (rc == SH_OK && B->files[0].size == size) {
        memcpy(out, B->files[0].map, size);
        delta_free(dp);
        dp = NULL;
        t0 = bench_cpu();
        rc = delta_parse(d.data, d.len, 0, &dp);
        if (rc == SH_OK) rc = delta_apply_mem_inplace(out, size, dp, &one);
        double dt = bench_cpu() - t0;
        if (rc == SH_OK) {
            bench_add(&r->f[F_INPLACE], dt);
            if (memcmp(out, T->files[0].map, size))
                rc = sh_err(SH_EINTERNAL, "shoal in-place apply did not reproduce the target");
        } else if (rc == SH_EINVAL) {
            rc = SH_OK; /* the layout changes: not measured */
        }
    }
    delta_free(dp);
    sh_buf_free(&d);
    return rc;
}

/* ---- The file layer's memory ------------------------------------------------ */

/* The bound the codec keeps: 64 MiB plus the delta, whatever the size. */
#define BENCH_ANON_BOUND (64ull << 20)

/* Runs `shoal delta make`, `apply -o` and `apply --in-place` on the pair in
 * child processes (files in a fresh folder under TMPDIR) and records each
 * one's peak anonymous memory. */
static int bench_file_layer(const char *base, const char *target, bench_res *r)
{
    const char *tmp = getenv("TMPDIR");
    char dir[4096], d[4200], o[4200], c[4200];
    snprintf(dir, sizeof dir, "%s/shoal-bench-files.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return sh_err_errno(errno, "mkdtemp %s", dir);
    snprintf(d, sizeof d, "%s/d.shd", dir);
    snprintf(o, sizeof o, "%s/o.safetensors", dir);
    snprintf(c, sizeof c, "%s/c.safetensors", dir);
    double s;
    char *mk[] = {"shoal", "delta", "make", (char *)base, (char *)target, "-o", d, NULL};
    char *ap[] = {"shoal", "delta", "apply", (char *)base, d, "-o", o, NULL};
    char *ip[] = {"shoal", "delta", "apply", "--in-place", c, d, NULL};
    int rc = cli_peak_anon(mk, &r->anon_make, &s);
    struct stat st;
    if (rc == SH_OK) r->file_delta = stat(d, &st) == 0 ? (uint64_t)st.st_size : 0;
    if (rc == SH_OK) rc = cli_peak_anon(ap, &r->anon_apply, &s);
    if (rc == SH_OK) unlink(o);
    if (rc == SH_OK) {
        int in = open(base, O_RDONLY | O_CLOEXEC);
        sh_atomic_file f;
        rc = in < 0 ? sh_err_errno(errno, "open %s", base) : sh_atomic_open(&f, c);
        if (rc == SH_OK) {
            off_t left = 0;
            rc = fstat(in, &st) < 0 ? sh_err_errno(errno, "stat %s", base) : SH_OK;
            for (left = st.st_size; rc == SH_OK && left > 0;) {
                ssize_t n = copy_file_range(in, NULL, f.fd, NULL, (size_t)left, 0);
                if (n <= 0) rc = sh_err_errno(n < 0 ? errno : EIO, "copy %s", base);
                else left -= n;
            }
            rc = rc == SH_OK ? sh_atomic_commit(&f) : (sh_atomic_abort(&f), rc);
        }
        if (in >= 0) close(in);
    }
    if (rc == SH_OK) rc = cli_peak_anon(ip, &r->anon_inplace, &s);
    sh_rm_rf(dir);
    return rc;
}

static json_t *bench_range_json(const bench_stat *s)
{
    double lo, hi;
    bench_med(s, &lo, &hi);
    return s->n ? json_pack("[f,f]", lo, hi) : json_null();
}

static json_t *bench_num_json(double v) { return isnan(v) ? json_null() : json_real(v); }

static void bench_print_json(const bench_res *r, const double *med, const bench_dts *dt)
{
    double gb = (double)r->ckpt_bytes / 1e9, frac = r->units ? (double)r->changed / (double)r->units : 0;
    double size_x = (double)r->bytes / (double)r->xbytes, bound_x = (double)r->bytes / r->bound;
    const bench_stat *f = r->f;
    json_t *j = json_pack(
        "{s:I,s:I,s:f,s:I,"
        "s:{s:I,s:f,s:f,s:f,s:f,s:f,s:o,s:{s:o,s:o,s:o}},"
        "s:{s:I,s:f,s:f,s:f,s:{s:o,s:o,s:o}},s:f,"
        "s:{s:o,s:o,s:o},"
        "s:{s:f,s:f,s:f,s:o,s:f,s:b}}",
        "params", (json_int_t)r->params, "checkpoint_bytes", (json_int_t)r->ckpt_bytes,
        "changed_fraction", frac, "reps", (json_int_t)f[F_MAKE].n,
        "shoal", "bytes", (json_int_t)r->bytes, "make_s", med[F_MAKE], "apply_s", med[F_APPLY],
        "peak_extra_mib", (double)(r->peak_make > r->peak_apply ? r->peak_make : r->peak_apply) / 1048576.0,
        "apply_gb_per_s", gb / med[F_APPLY], "make_gb_per_s", gb / med[F_MAKE],
        "apply_inplace_s", bench_num_json(med[F_INPLACE]), "range", "make_s",
        bench_range_json(&f[F_MAKE]), "apply_s", bench_range_json(&f[F_APPLY]), "apply_inplace_s",
        bench_range_json(&f[F_INPLACE]),
        "xor_zstd1", "bytes", (json_int_t)r->xbytes, "make_s", med[F_XMAKE], "apply_s",
        med[F_XAPPLY], "apply_inplace_s", med[F_XINPLACE], "range", "make_s",
        bench_range_json(&f[F_XMAKE]), "apply_s", bench_range_json(&f[F_XAPPLY]),
        "apply_inplace_s", bench_range_json(&f[F_XINPLACE]),
        "entropy_bound_bytes", r->bound,
        "machine", "memcpy_gb_per_s", bench_num_json(gb / med[F_MEMCPY]), "xxh3_gb_per_s",
        bench_num_json(gb / med[F_XXH3]), "copy_xxh3_gb_per_s", bench_num_json(gb / med[F_COPYHASH]),
        "ratios", "size_vs_xor", size_x, "size_vs_bound", bound_x, "make_speedup", med[F_MAKEX],
        "make_speedup_range", bench_range_json(&f[F_MAKEX]), "apply_speedup",
        med[F_XAPPLY] / med[F_APPLY], "targets_met",
        size_x <= 0.5 && bound_x <= 1.3 && med[F_MAKEX] >= 3 && gb / med[F_APPLY] >= 4);
    json_object_set_new(j, "warmup_runs", json_integer(1)); /* run before the reps, not counted */
    uint64_t bound = BENCH_ANON_BOUND + r->file_delta;
    json_object_set_new(j, "peak_anon_bytes",
                        json_pack("{s:I,s:I,s:I}", "make", (json_int_t)r->anon_make, "apply",
                                  (json_int_t)r->anon_apply, "apply_in_place",
                                  (json_int_t)r->anon_inplace));
    json_object_set_new(j, "anon_bound_bytes", json_integer((json_int_t)bound));
    json_object_set_new(j, "anon_bound_met",
                        json_boolean(r->anon_make <= bound && r->anon_apply <= bound &&
                                     r->anon_inplace <= bound));
    if (dt) json_object_set_new(j, "per_dtype", bench_dtypes_json(dt));
    sh_json_print(j);
    json_decref(j);
}

static void bench_print(const bench_opts *o, const bench_res *r, const bench_dts *dt)
{
    double med[F_N], lo[F_N], hi[F_N];
    for (int i = 0; i < F_N; i++) med[i] = bench_med(&r->f[i], &lo[i], &hi[i]);
    if (o->json) {
        bench_print_json(r, med, dt);
        return;
    }
    double gb = (double)r->ckpt_bytes / 1e9, frac = r->units ? (double)r->changed / (double)r->units : 0;
    double size_x = (double)r->bytes / (double)r->xbytes, bound_x = (double)r->bytes / r->bound;
    double make_x = med[F_MAKEX], apply_gbs = gb / med[F_APPLY], inplace_gbs = gb / med[F_INPLACE];
    char b[32];
    printf("shoal bench delta: %llu parameters, %s checkpoint, %.3f%% of elements changed (one core, "
           "median of %d runs)\n\n", (unsigned long long)r->params,
           sh_fmt_bytes((double)r->ckpt_bytes, b, sizeof b), 100 * frac, r->f[F_MAKE].n);
    printf("| codec         |      delta bytes | vs xor+zstd-1 | make s | apply s | apply GB/s | in place GB/s | peak extra MiB |\n");
    printf("|---------------|-----------------:|--------------:|-------:|--------:|-----------:|--------------:|---------------:|\n");
    printf("| xor+zstd-1    | %16llu |         1.000 | %6.3f | %7.3f | %10.2f | %13.2f |              - |\n",
           (unsigned long long)r->xbytes, med[F_XMAKE], med[F_XAPPLY], gb / med[F_XAPPLY],
           gb / med[F_XINPLACE]);
    printf("| shoal         | %16llu | %13.3f | %6.3f | %7.3f | %10.2f | %13.2f | %6.1f / %-6.1f |\n",
           (unsigned long long)r->bytes, size_x, med[F_MAKE], med[F_APPLY], apply_gbs, inplace_gbs,
           (double)r->peak_make / 1048576.0, (double)r->peak_apply / 1048576.0);
    printf("| entropy bound | %16.0f | %13.3f |        |         |            |               |                |\n\n",
           r->bound, r->bound / (double)r->xbytes);
    printf("range over runs (s): xor+zstd-1 make %.3f-%.3f, apply %.3f-%.3f, in place %.3f-%.3f;\n"
           "                     shoal make %.3f-%.3f, apply %.3f-%.3f, in place %.3f-%.3f\n",
           lo[F_XMAKE], hi[F_XMAKE], lo[F_XAPPLY], hi[F_XAPPLY], lo[F_XINPLACE], hi[F_XINPLACE],
           lo[F_MAKE], hi[F_MAKE], lo[F_APPLY], hi[F_APPLY], lo[F_INPLACE], hi[F_INPLACE]);
    printf("machine, one core, %s image: memcpy %.2f GB/s, xxh3-128 %.2f GB/s, copy+xxh3 %.2f GB/s "
           "(the ceiling of apply into a new buffer)\n\n", b, gb / med[F_MEMCPY], gb / med[F_XXH3],
           gb / med[F_COPYHASH]);
    printf("size:  shoal = %.3f x xor+zstd-1 (target <= 0.5) %s, %.3f x entropy bound (target <= 1.3) %s\n",
           size_x, size_x <= 0.5 ? "met" : "MISSED", bound_x, bound_x <= 1.3 ? "met" : "MISSED");
    printf("make:  %.2f x faster than xor+zstd-1 (target >= 3) %s; per run %.2f-%.2f x\n", make_x,
           make_x >= 3 ? "met" : "MISSED", lo[F_MAKEX], hi[F_MAKEX]);
    printf("apply: %.2f GB/s of checkpoint into a new buffer (target >= 4) %s, %.2f x xor+zstd-1, "
           "%.0f%% of the copy+xxh3 ceiling;\n"
           "       %.2f GB/s in place (target >= 4) %s, %.2f x xor+zstd-1 in place\n", apply_gbs,
           apply_gbs >= 4 ? "met" : "MISSED", med[F_XAPPLY] / med[F_APPLY],
           100 * med[F_COPYHASH] / med[F_APPLY], inplace_gbs, inplace_gbs >= 4 ? "met" : "MISSED",
           med[F_XINPLACE] / med[F_INPLACE]);
    printf("(peak extra: make / apply, resident anonymous memory above the start)\n");
    uint64_t bound = BENCH_ANON_BOUND + r->file_delta;
    int met = r->anon_make <= bound && r->anon_apply <= bound && r->anon_inplace <= bound;
    printf("file layer, peak anonymous memory of the whole process (RssAnon, page cache not "
           "counted):\n       delta make %.1f MiB, delta apply %.1f MiB, apply --in-place %.1f MiB "
           "(bound 64 MiB + delta = %.1f MiB) %s\n", (double)r->anon_make / 1048576.0,
           (double)r->anon_apply / 1048576.0, (double)r->anon_inplace / 1048576.0,
           (double)bound / 1048576.0, met ? "met" : "MISSED");
    if (dt) bench_dtypes_print(dt);
}

/* The baseline's buffers: room for every chunk's worst case, faulted in. */
static int bench_xbufs_new(uint64_t total, bench_xbufs *xb)
{
    xb->nch = (size_t)((total + XOR_CHUNK - 1) / XOR_CHUNK);
    xb->zcap = 0;
    for (size_t c = 0; c < xb->nch; c++)
        xb->zcap += ZSTD_compressBound(total - (uint64_t)c * XOR_CHUNK < XOR_CHUNK
                                           ? (size_t)(total - (uint64_t)c * XOR_CHUNK) : XOR_CHUNK);
    xb->x = bench_alloc(XOR_CHUNK);
    xb->z = bench_alloc(xb->zcap);
    xb->zl = calloc(xb->nch + 1, sizeof *xb->zl);
    return xb->x && xb->z && xb->zl ? SH_OK : sh_err(SH_ENOMEM, "out of memory for the baseline");
}

static void bench_xbufs_free(bench_xbufs *xb)
{
    bench_release(xb->x, XOR_CHUNK);
    bench_release(xb->z, xb->zcap);
    free(xb->zl);
}

/* The runs: both codecs alternate, so that a disturbance of the shared
 * machine lands on both, and the machine's ceiling is measured each run.
 * Run 0 warms both codecs up and is not counted: the first calls in a
 * process fault in malloc's heap (for shoal's make, the payloads and the
 * delta, about 2,400 pages, which at some 20 us a fault in this VM add
 * 0.05 s), and a trainer that makes a delta every step pays that once. */
static int bench_runs(const bench_opts *o, const ckpt *B, const ckpt *T, uint8_t *out,
                      bench_res *r)
{
    bench_xbufs xb = {0};
    int err = bench_xbufs_new(ckpt_data_bytes(T), &xb);
    bench_res *warm = calloc(1, sizeof *warm);
    if (!warm && err == SH_OK) err = sh_err(SH_ENOMEM, "out of memory");
    for (uint64_t k = 0; k <= o->reps && err == SH_OK; k++) {
        if (!o->json && k == 0) fprintf(stderr, "warm-up run (not counted): xor+zstd-1, shoal ...\n");
        else if (!o->json)
            fprintf(stderr, "run %llu of %llu: xor+zstd-1, shoal, memcpy/xxh3 ...\n",
                    (unsigned long long)k, (unsigned long long)o->reps);
        bench_xor x = {0};
        err = bench_xor_run(&(bench_pair){B, T}, &xb, out, &x);
        if (err == SH_OK) err = bench_shoal(B, T, out, r->ckpt_bytes, k ? r : warm);
        if (err < 0 || k == 0) continue;
        r->xbytes = x.bytes;
        bench_add(&r->f[F_XMAKE], x.make_s);
        bench_add(&r->f[F_XAPPLY], x.apply_s);
        bench_add(&r->f[F_XINPLACE], x.inplace_s);
        bench_add(&r->f[F_MAKEX], x.make_s / r->f[F_MAKE].v[r->f[F_MAKE].n - 1]);
        double cp, hs, cphs;
        size_t n = B->files[0].size < r->ckpt_bytes ? B->files[0].size : r->ckpt_bytes;
        bench_ceiling(B->files[0].map, out, n, &cp, &hs, &cphs);
        double scale = (double)r->ckpt_bytes / (double)(n ? n : 1); /* per checkpoint byte */
        bench_add(&r->f[F_MEMCPY], cp * scale);
        bench_add(&r->f[F_XXH3], hs * scale);
        bench_add(&r->f[F_COPYHASH], cphs * scale);
    }
    if (warm && warm->peak_make > r->peak_make) r->peak_make = warm->peak_make;
    if (warm && warm->peak_apply > r->peak_apply) r->peak_apply = warm->peak_apply;
    free(warm);
    bench_xbufs_free(&xb);
    return err;
}

/* The per-dtype figures (a small GPT trained with AdamW) into a new *dt. */
static int run_dtypes(const bench_opts *o, bench_dts **dt)
{
    if (!o->json) fprintf(stderr, "per dtype: training a small GPT with AdamW (%llu steps at lr %g) ...\n",
                          (unsigned long long)o->train_steps, o->train_lr);
    *dt = calloc(1, sizeof **dt);
    int e = *dt ? bench_dtypes(o->train_lr, o->train_steps, o->seed, *dt) : sh_err(SH_ENOMEM, "out of memory");
    if (e < 0) free(*dt), *dt = NULL;
    return e;
}

/* --dtypes alone: the per-dtype figures as JSON or text. */
static void print_dtypes(const bench_opts *o, const bench_dts *dt)
{
    if (o->json) {
        json_t *j = bench_dtypes_json(dt);
        json_object_set_new(j, "bench", json_string("delta --dtypes"));
        sh_json_print(j);
        json_decref(j);
    } else {
        bench_dtypes_print(dt);
    }
}

int cli_bench_delta(int argc, char **argv)
{
    bench_opts o = {.params = 256000000, .steps = 1, .seed = 1, .lr = 1e-6, .reps = 3, .train_lr = 1e-5,
                    .train_steps = 30};
    int rc = bench_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    bench_dts *dt = NULL;
    if (o.dtypes_only || !o.base) {
        int e = run_dtypes(&o, &dt);
        if (e < 0) return cli_fail("bench delta", e);
    }
    if (o.dtypes_only) {
        print_dtypes(&o, dt);
        free(dt);
        return 0;
    }
    char dir[4096] = "", bp[4096], tp[4096];
    if (!o.base) {
        if ((rc = bench_generate(&o, dir, bp, tp))) return rc;
        o.base = bp, o.target = tp;
    }
    ckpt *B = NULL, *T = NULL;
    uint8_t *bbuf = NULL, *tbuf = NULL, *out = NULL;
    size_t blen = 0, tlen = 0;
    int err = SH_OK;
    if (sh_is_dir(o.base) || sh_is_dir(o.target))
        err = sh_err(SH_EINVAL, "the bench takes single .safetensors files, not folders");
    if (err == SH_OK) err = bench_load(o.base, &bbuf, &blen, &B);
    if (err == SH_OK) err = bench_load(o.target, &tbuf, &tlen, &T);
    bench_res *r = calloc(1, sizeof *r);
    if (err == SH_OK && !r) err = sh_err(SH_ENOMEM, "out of memory");
    if (err == SH_OK) {
        r->ckpt_bytes = T->files[0].size;
        for (size_t i = 0; i < T->ntensors; i++) r->params += T->tensors[i].numel;
        out = bench_alloc(r->ckpt_bytes);
        if (!out) err = sh_err(SH_ENOMEM, "out of memory for the output image");
    }
    if (err == SH_OK) err = bench_runs(&o, B, T, out, r);
    if (err == SH_OK) r->bound = bench_bound(B, T, &r->changed, &r->units);
    if (err == SH_OK && !o.json) fprintf(stderr, "file layer: delta make, apply, apply --in-place "
                                         "in child processes (peak anonymous memory) ...\n");
    if (err == SH_OK) err = bench_file_layer(o.base, o.target, r);
    bench_release(out, r ? r->ckpt_bytes : 0);
    ckpt_close(B);
    ckpt_close(T);
    bench_release(bbuf, blen);
    bench_release(tbuf, tlen);
    if (dir[0]) sh_rm_rf(dir);
    if (err == SH_OK) bench_print(&o, r, dt);
    free(r);
    free(dt);
    return err < 0 ? cli_fail("bench delta", err) : 0;
}
