/* The fleet file reader (docs/fleet-format.md): columns by header name, the
 * six required ones and explicitly kept or refused extras. */
#include <stdlib.h>
#include <string.h>

#include "shoal/common.h"
#include "shoal/fleetfile.h"

enum { C_NAME, C_ZONE, C_FABRIC, C_TYPE, C_GPUS, C_PRICE, C_REQUIRED };

/* The required columns; "node_id" is the simulator's spelling of "name". */
static const char *const required[C_REQUIRED] = {"name", "zone", "fabric", "gpu_type", "gpus",
                                                 "price_per_gpu_hour"};

static int column_of(const char *h)
{
    if (!strcmp(h, "node_id")) return C_NAME;
    for (int c = 0; c < C_REQUIRED; c++)
        if (!strcmp(h, required[c])) return c;
    return -1;
}

/* Returns the next line of *pos without its "\n" or "\r\n", or NULL. */
static char *next_line(char **pos)
{
    char *s = *pos;
    if (!*s) return NULL;
    char *e = strchr(s, '\n');
    if (e) *e = 0, *pos = e + 1;
    else *pos = s + strlen(s);
    size_t n = strlen(s);
    if (n && s[n - 1] == '\r') s[n - 1] = 0;
    return s;
}

/* Splits line in place at commas, keeping empty fields and trimming blanks
 * around each.  Returns the count, or max + 1 when there are more. */
static int split(char *line, char **f, int max)
{
    int n = 0;
    for (char *s = line;; s++) {
        char *e = strchr(s, ',');
        if (n == max) return max + 1;
        if (e) *e = 0;
        while (*s == ' ' || *s == '\t') s++;
        size_t k = strlen(s);
        while (k && (s[k - 1] == ' ' || s[k - 1] == '\t')) s[--k] = 0;
        f[n++] = s;
        if (!e) return n;
        s = e;
    }
}

static int name_ok(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n >= SH_FLEET_NAME) return 0;
    for (const char *p = v; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr("._:-", *p)))
            return 0;
    return 1;
}

static int kept(const char *col, const sh_fleet_opts *o)
{
    if (o && o->keep_all) return 1;
    for (const char *const *k = o ? o->keep : NULL; k && *k; k++)
        if (!strcmp(*k, col)) return 1;
    return 0;
}

/* The header: fills col[i] with the required column of field i, or
 * C_REQUIRED + k for the k-th kept extra.  */
static int read_header(char **fl, int nf, const char *path, int ln, const sh_fleet_opts *o,
                       int *col, sh_fleet_file *out)
{
    int seen[C_REQUIRED] = {0};
    for (int i = 0; i < nf; i++) {
        int c = column_of(fl[i]);
        if (c >= 0) {
            if (seen[c])
                return sh_err(SH_EFORMAT, "%s:%d: column \"%s\" appears twice (name and node_id are one column)",
                              path, ln, required[c]);
            seen[c] = 1, col[i] = c;
            continue;
        }
        if (!*fl[i]) return sh_err(SH_EFORMAT, "%s:%d: header field %d is empty", path, ln, i + 1);
        if (!kept(fl[i], o)) {
            char known[256] = "";
            for (const char *const *k = o ? o->keep : NULL; k && *k; k++)
                snprintf(known + strlen(known), sizeof known - strlen(known), ", %s", *k);
            /* A suggestion among the required columns the header lacks, so
             * that "gpu" beside "gpus" points at gpu_type. */
            const char *missing[C_REQUIRED];
            size_t nm = 0;
            for (int r = 0; r < C_REQUIRED; r++) {
                int has = 0;
                for (int j = 0; j < nf; j++) has |= column_of(fl[j]) == r;
                if (!has) missing[nm++] = required[r];
            }
            const char *near = sh_closest(fl[i], missing, nm);
            char hint[64] = "";
            if (near) snprintf(hint, sizeof hint, "did you mean \"%s\"? ", near);
            return sh_err(SH_EFORMAT, "%s:%d: unknown column \"%s\" (%scolumns: name or node_id, zone, fabric, "
                          "gpu_type, gpus, price_per_gpu_hour%s)", path, ln, fl[i], hint, known);
        }
        for (int k = 0; k < out->n_extra; k++)
            if (!strcmp(out->extra_cols[k], fl[i]))
                return sh_err(SH_EFORMAT, "%s:%d: column \"%s\" appears twice", path, ln, fl[i]);
        char *dup = strdup(fl[i]);
        if (!dup) return sh_err(SH_ENOMEM, "%s: out of memory", path);
        out->extra_cols[out->n_extra] = dup;
        col[i] = C_REQUIRED + out->n_extra++;
    }
    for (int c = 0; c < C_REQUIRED; c++)
        if (!seen[c])
            return sh_err(SH_EFORMAT, "%s:%d: the header lacks the column \"%s\" (needed: name, zone, fabric, "
                          "gpu_type, gpus, price_per_gpu_hour, in any order)", path, ln,
                          c == C_NAME ? "name (or node_id)" : required[c]);
    return 0;
}

static int field(const char *v, char *dst, const char *path, int ln, const char *col)
{
    if (!name_ok(v))
        return sh_err(SH_EFORMAT, "%s:%d: %s \"%.80s\" must be 1..%d characters of A-Z a-z 0-9 . _ : -",
                      path, ln, col, v, SH_FLEET_NAME - 1);
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

static int read_node(char **fl, const int *col, int nf, const char *path, int ln, sh_fleet_file *out,
                     sh_fleet_node *n)
{
    memset(n, 0, sizeof *n);
    n->line = ln;
    if (out->n_extra && !(n->extra = calloc((size_t)out->n_extra, sizeof *n->extra)))
        return sh_err(SH_ENOMEM, "%s: out of memory", path);
    for (int i = 0; i < nf; i++) {
        const char *v = fl[i];
        int64_t g;
        switch (col[i]) {
        case C_NAME: SH_TRY(field(v, n->name, path, ln, "name")); break;
        case C_ZONE: SH_TRY(field(v, n->zone, path, ln, "zone")); break;
        case C_FABRIC: SH_TRY(field(v, n->fabric, path, ln, "fabric")); break;
        case C_TYPE: SH_TRY(field(v, n->gpu_type, path, ln, "gpu_type")); break;
        case C_GPUS:
            if (sh_parse_i64(v, &g, "gpus") < 0 || g < 1 || g > SH_FLEET_MAX_GPUS)
                return sh_err(SH_EFORMAT, "%s:%d: gpus \"%.40s\" is not a whole number 1..%d", path, ln, v,
                              SH_FLEET_MAX_GPUS);
            n->gpus = (int)g;
            break;
        case C_PRICE:
            if (sh_parse_double(v, &n->price_per_gpu_hour, "price") < 0 || !(n->price_per_gpu_hour >= 0) ||
                n->price_per_gpu_hour > 1e6)
                return sh_err(SH_EFORMAT, "%s:%d: price_per_gpu_hour \"%.40s\" is not a number 0..1e6", path, ln, v);
            break;
        default:
            if (!(n->extra[col[i] - C_REQUIRED] = strdup(v))) return sh_err(SH_ENOMEM, "%s: out of memory", path);
        }
    }
    return 0;
}

static void free_node(sh_fleet_node *n, int n_extra)
{
    for (int k = 0; n->extra && k < n_extra; k++) free(n->extra[k]);
    free(n->extra);
    n->extra = NULL;
}

static int grow(sh_fleet_file *out, size_t *cap)
{
    size_t c = *cap ? 2 * *cap : 16;
    sh_fleet_node *v = realloc(out->nodes, c * sizeof *v);
    if (!v) return SH_ENOMEM;
    out->nodes = v, *cap = c;
    return 0;
}

static int by_name(const void *a, const void *b)
{
    const sh_fleet_node *x = *(const sh_fleet_node *const *)a, *y = *(const sh_fleet_node *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->line > y->line) - (x->line < y->line);
}

/* Node names are unique: sorted by name, no two neighbours are equal. */
static int unique_names(const sh_fleet_file *f, const char *path)
{
    const sh_fleet_node **v = malloc(f->n * sizeof *v);
    if (!v) return sh_err(SH_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < f->n; i++) v[i] = &f->nodes[i];
    qsort(v, f->n, sizeof *v, by_name);
    int rc = 0;
    for (size_t i = 1; i < f->n && !rc; i++)
        if (!strcmp(v[i - 1]->name, v[i]->name))
            rc = sh_err(SH_EFORMAT, "%s:%d: node \"%s\" was already declared on line %d", path, v[i]->line,
                        v[i]->name, v[i - 1]->line);
    free(v);
    return rc;
}

int sh_fleet_parse(const char *text, const char *path, const sh_fleet_opts *opts, sh_fleet_file *out)
{
    memset(out, 0, sizeof *out);
    char *buf = strdup(text), *pos = buf, *line;
    if (!buf) return sh_err(SH_ENOMEM, "%s: out of memory", path);
    int rc = 0, ln = 0, ncol = 0, header_ln = 0, col[SH_FLEET_MAX_COLS];
    size_t cap = 0;
    static char *no_extra[1];
    out->extra_cols = calloc(SH_FLEET_MAX_COLS, sizeof *out->extra_cols);
    if (!out->extra_cols) out->extra_cols = no_extra, rc = sh_err(SH_ENOMEM, "%s: out of memory", path);
    while (!rc && (line = next_line(&pos))) {
        ln++;
        const char *s = line + strspn(line, " \t");
        if (!*s || *s == '#') continue;
        char *fl[SH_FLEET_MAX_COLS];
        int nf = split(line, fl, SH_FLEET_MAX_COLS);
        if (nf > SH_FLEET_MAX_COLS) {
            rc = sh_err(SH_EFORMAT, "%s:%d: more than %d columns", path, ln, SH_FLEET_MAX_COLS);
        } else if (!ncol) {
            rc = read_header(fl, nf, path, ln, opts, col, out);
            ncol = nf, header_ln = ln;
        } else if (nf != ncol) {
            rc = sh_err(SH_EFORMAT, "%s:%d: %d fields where the header (line %d) has %d", path, ln, nf,
                        header_ln, ncol);
        } else if (out->n == cap && grow(out, &cap) < 0) {
            rc = sh_err(SH_ENOMEM, "%s: out of memory", path);
        } else {
            sh_fleet_node *n = &out->nodes[out->n];
            rc = read_node(fl, col, nf, path, ln, out, n);
            if (rc) free_node(n, out->n_extra);
            else out->n++;
        }
    }
    free(buf);
    if (!rc && !ncol) rc = sh_err(SH_EFORMAT, "%s: no header line (docs/fleet-format.md)", path);
    else if (!rc && !out->n) rc = sh_err(SH_EFORMAT, "%s: the fleet has no nodes", path);
    if (!rc) rc = unique_names(out, path);
    if (out->extra_cols == no_extra) out->extra_cols = NULL;
    if (rc) sh_fleet_free(out);
    return rc;
}

int sh_fleet_load(const char *path, const sh_fleet_opts *opts, sh_fleet_file *out)
{
    char *text;
    size_t len;
    memset(out, 0, sizeof *out);
    SH_TRY(sh_read_file(path, (size_t)1 << 30, &text, &len));
    if (memchr(text, 0, len)) {
        free(text);
        return sh_err(SH_EFORMAT, "%s: a fleet file is text; this one holds a NUL byte", path);
    }
    int rc = sh_fleet_parse(text, path, opts, out);
    free(text);
    return rc;
}

const char *sh_fleet_extra(const sh_fleet_file *f, size_t i, const char *col)
{
    for (int k = 0; i < f->n && k < f->n_extra; k++)
        if (!strcmp(f->extra_cols[k], col)) return f->nodes[i].extra[k];
    return NULL;
}

const sh_fleet_node *sh_fleet_find(const sh_fleet_file *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->nodes[i].name, name)) return &f->nodes[i];
    return NULL;
}

void sh_fleet_free(sh_fleet_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free_node(&f->nodes[i], f->n_extra);
    for (int k = 0; k < f->n_extra; k++) free(f->extra_cols[k]);
    free(f->extra_cols);
    free(f->nodes);
    memset(f, 0, sizeof *f);
}
