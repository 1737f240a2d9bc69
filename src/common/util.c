/* Time, progress bars, number parsing and growable buffers. */
#include "shoal/common.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

double sh_now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double sh_now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sh_sleep(double seconds)
{
    if (seconds <= 0) return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

uint64_t sh_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) < 0) return 0;
    return (uint64_t)ru.ru_maxrss * 1024u;
}

uint64_t sh_rss_anon(long pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    unsigned long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %lu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb << 10;
}

/* ---- Progress ------------------------------------------------------------ */

const char *sh_fmt_bytes(double bytes, char *buf, size_t cap)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (fabs(bytes) >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%.0f B", bytes);
    else snprintf(buf, cap, "%.2f %s", bytes, units[u]);
    return buf;
}

void sh_progress_start(sh_progress *p, const char *label, uint64_t total, const char *unit)
{
    memset(p, 0, sizeof *p);
    p->label = label;
    p->unit = unit ? unit : "";
    p->total = total;
    p->t0 = sh_now_mono();
    int quiet = getenv("SHOAL_NO_PROGRESS") != NULL;
    p->enabled = isatty(STDERR_FILENO) && !quiet;
    p->lines = !p->enabled && !quiet;
    p->logged = -1;
    const char *after = getenv("SHOAL_PROGRESS_AFTER");
    p->after = after && *after ? atof(after) : 5.0;
}

/* Off a terminal (a log, a pipe, CI), work that has run 5 s (or
 * SHOAL_PROGRESS_AFTER seconds) says so on a line of its own, then at each
 * further tenth (every 30 s while its total is unknown), so that a long run
 * piped somewhere is not silent; shorter work prints nothing. */
static void sh__progress_line(sh_progress *p, int final)
{
    double now = sh_now_mono(), el = now - p->t0;
    if (final ? p->logged < 0 : el < p->after) return;
    int k = p->total ? (int)(10 * (p->done < p->total ? p->done : p->total) / p->total) : 0;
    if (!final && (p->total ? k <= p->logged : p->logged >= 0 && now - p->last_draw < 30.0)) return;
    p->logged = k;
    p->last_draw = now;
    char d[32], t[48] = "";
    int bytes = !strcmp(p->unit, "B");
    if (bytes) sh_fmt_bytes((double)p->done, d, sizeof d);
    else snprintf(d, sizeof d, "%llu", (unsigned long long)p->done);
    if (p->total && bytes) sh_fmt_bytes((double)p->total, t, sizeof t);
    else if (p->total) snprintf(t, sizeof t, "%llu %s", (unsigned long long)p->total, p->unit);
    if (final) fprintf(stderr, "%s: done in %.0f s\n", p->label, el);
    else if (p->total) fprintf(stderr, "%s: %d%% (%s of %s, %.0f s)\n", p->label, 10 * k, d, t, el);
    else fprintf(stderr, "%s: %s%s%s (%.0f s)\n", p->label, d, bytes ? "" : " ", bytes ? "" : p->unit, el);
    fflush(stderr);
}

static void sh__progress_draw(sh_progress *p, int final)
{
    double now = sh_now_mono(), el = now - p->t0;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    if (frac > 1) frac = 1;
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    char rate[48] = "";
    double r = el > 0 ? (double)p->done / el : 0;
    if (!strcmp(p->unit, "B")) {
        char b[32];
        snprintf(rate, sizeof rate, "%s/s", sh_fmt_bytes(r, b, sizeof b));
    } else {
        snprintf(rate, sizeof rate, "%.1f %s/s", r, p->unit);
    }
    double eta = (r > 0 && p->total > p->done) ? (double)(p->total - p->done) / r : 0;
    fprintf(stderr, "\r%s [%s] %3.0f%% %s %s %.0fs%s", p->label, bar, frac * 100, rate,
            final ? "in" : "eta", final ? el : eta, final ? "\n" : "  ");
    fflush(stderr);
    p->last_draw = now;
}

void sh_progress_update(sh_progress *p, uint64_t done)
{
    p->done = done;
    if (p->lines) sh__progress_line(p, 0);
    if (!p->enabled) return;
    if (sh_now_mono() - p->last_draw < 0.1) return;
    sh__progress_draw(p, 0);
}

void sh_progress_clear(sh_progress *p)
{
    if (!p->enabled || p->last_draw == 0) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->last_draw = 0; /* drawn again at the next update */
}

void sh_progress_finish(sh_progress *p)
{
    if (p->lines) sh__progress_line(p, 1);
    if (!p->enabled) return;
    p->done = p->total;
    sh__progress_draw(p, 1);
}

/* ---- Numbers --------------------------------------------------------------- */

int sh_parse_i64(const char *s, int64_t *out, const char *what)
{
    if (!s || !*s) return sh_err(SH_EINVAL, "%s: expected an integer, got an empty string", what);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return sh_err(SH_EINVAL, "%s: \"%s\" is not an integer", what, s);
    *out = v;
    return SH_OK;
}

int sh_parse_u64(const char *s, uint64_t *out, const char *what)
{
    if (!s || !*s || *s == '-')
        return sh_err(SH_EINVAL, "%s: \"%s\" is not a non-negative integer", what, s ? s : "");
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return sh_err(SH_EINVAL, "%s: \"%s\" is not a non-negative integer", what, s);
    *out = v;
    return SH_OK;
}

int sh_parse_double(const char *s, double *out, const char *what)
{
    if (!s || !*s) return sh_err(SH_EINVAL, "%s: expected a number, got an empty string", what);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return sh_err(SH_EINVAL, "%s: \"%s\" is not a number", what, s);
    *out = v;
    return SH_OK;
}

int sh_parse_size(const char *s, uint64_t *out, const char *what)
{
    if (!s || !*s) return sh_err(SH_EINVAL, "%s: expected a size, got an empty string", what);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isfinite(v))
        return sh_err(SH_EINVAL, "%s: \"%s\" is not a size (examples: 4096, 256M, 1GiB)", what, s);
    static const struct {
        const char *suf;
        double mul;
    } tab[] = {{"", 1},      {"K", 1e3},          {"M", 1e6},          {"G", 1e9},
               {"T", 1e12},  {"KiB", 1024.0},     {"MiB", 1048576.0},  {"GiB", 1073741824.0},
               {"k", 1e3},   {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (!strcmp(end, tab[i].suf)) {
            double r = v * tab[i].mul;
            if (r > 1.8e19) return sh_err(SH_ERANGE, "%s: \"%s\" is too large", what, s);
            *out = (uint64_t)llround(r);
            return SH_OK;
        }
    }
    return sh_err(SH_EINVAL, "%s: unknown suffix \"%s\" in \"%s\" (use K, M, G, T, KiB, MiB, GiB, TiB)", what,
                  end, s);
}

/* ---- Buffers --------------------------------------------------------------- */

int sh_buf_reserve(sh_buf *b, size_t extra)
{
    if (b->len + extra <= b->cap) return SH_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) return sh_err(SH_ENOMEM, "cannot grow a buffer to %zu bytes", cap);
    b->data = d;
    b->cap = cap;
    return SH_OK;
}

int sh_buf_append(sh_buf *b, const void *data, size_t len)
{
    SH_TRY(sh_buf_reserve(b, len + 1));
    if (len) memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = 0;
    return SH_OK;
}

int sh_buf_printf(sh_buf *b, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        return sh_err(SH_EINVAL, "bad format string");
    }
    int rc = sh_buf_reserve(b, (size_t)n + 1);
    if (rc == SH_OK) {
        vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
    return rc;
}

void sh_buf_free(sh_buf *b)
{
    if (!b) return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
