/* Line and field helpers for the importers. */
#include "csv_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/common.h"

int sim__check_text(const char *path, const char *text, size_t len)
{
    if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3))
        return sh_err(SH_EFORMAT, "%s:1: the file starts with a UTF-8 byte order mark; save it without one", path);
    size_t line = 1, start = 0;
    for (size_t i = 0; i < len; i++) {
        if (!text[i])
            return sh_err(SH_EFORMAT, "%s:%zu: NUL byte at column %zu (a binary or damaged file?)", path, line,
                          i - start + 1);
        if (text[i] == '\n') {
            line++, start = i + 1;
            continue;
        }
        if (i - start >= SIM__MAX_LINE)
            return sh_err(SH_EFORMAT, "%s:%zu: line longer than %d bytes", path, line, SIM__MAX_LINE);
    }
    return 0;
}

char *sim__next_line(char **pos)
{
    char *s = *pos;
    if (!s || !*s) return NULL;
    char *nl = strchr(s, '\n');
    if (nl) {
        *nl = 0;
        *pos = nl + 1;
    } else *pos = s + strlen(s);
    size_t n = strlen(s);
    if (n && s[n - 1] == '\r') s[n - 1] = 0;
    return s;
}

int sim__split(char *line, char sep, char **fields, int max)
{
    int n = 0;
    char *p = line;
    while (n < max) {
        fields[n++] = p;
        char *q = strchr(p, sep);
        if (!q) break;
        *q = 0;
        p = q + 1;
    }
    return n;
}

int sim__int(const char *v, const char *path, size_t line, const char *field, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno)
        return sh_err(SH_EFORMAT, "%s:%zu: field %s: \"%s\" is not an integer", path, line, field, v);
    if (x < lo || x > hi)
        return sh_err(SH_EFORMAT, "%s:%zu: field %s: %ld is outside %ld..%ld", path, line, field, x, lo, hi);
    *out = (int)x;
    return 0;
}

int sim__num(const char *v, const char *path, size_t line, const char *field, double lo, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x))
        return sh_err(SH_EFORMAT, "%s:%zu: field %s: \"%s\" is not a number", path, line, field, v);
    if (x < lo) return sh_err(SH_EFORMAT, "%s:%zu: field %s: %g is below %g", path, line, field, x, lo);
    *out = x;
    return 0;
}

int sim__name(char *dst, size_t cap, const char *v, const char *path, size_t line, const char *field)
{
    if (!*v) return sh_err(SH_EFORMAT, "%s:%zu: field %s: empty", path, line, field);
    if (strlen(v) >= cap)
        return sh_err(SH_EFORMAT, "%s:%zu: field %s: longer than %zu bytes", path, line, field, cap - 1);
    for (const char *c = v; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == ',' || *c == '|')
            return sh_err(SH_EFORMAT, "%s:%zu: field %s: \"%s\" has a control character, ',' or '|'",
                          path, line, field, v);
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}
