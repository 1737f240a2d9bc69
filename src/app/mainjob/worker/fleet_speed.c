/* Fleet files with declared rollout speed factors: shoal's fleet file
 * (docs/fleet-format.md, read by src/common/fleetfile.c) plus a table of
 * gpu_type,speed[,max_seqs] (docs/mainjob.md).  Lines starting with '#' are
 * comments. */
#include <stdlib.h>
#include <string.h>

#include "shoal/fleetfile.h"
#include "worker_int.h"

typedef struct speed_row {
    char type[32];
    double speed;
    int max_seqs;
} speed_row;

/* Splits line l in place on commas into at most max fields. */
static int split(char *l, char **f, int max)
{
    int n = 0;
    for (char *save = NULL, *t = strtok_r(l, ",", &save); t && n < max + 1; t = strtok_r(NULL, ",", &save))
        if (n < max) f[n++] = t;
        else return max + 1;
    return n;
}

/* The number of fields of the header l if it is one of `headers` (a
 * '|'-separated list of accepted headers), else 0. */
static int header_fields(const char *l, const char *headers)
{
    size_t n = strlen(l);
    for (const char *h = headers; *h;) {
        size_t k = strcspn(h, "|");
        if (k == n && !strncmp(h, l, n)) {
            int nf = 1;
            for (size_t i = 0; i < n; i++) nf += l[i] == ',';
            return nf;
        }
        h += k + (h[k] == '|');
    }
    return 0;
}

/* Calls row(ctx, fields, nfields, line) for each data line after the
 * header, which must be one of `headers` ('|'-separated). */
static int each_line(const char *path, const char *headers,
                     int (*row)(void *ctx, char **f, int nf, int line), void *ctx)
{
    char *text;
    size_t len;
    SH_TRY(sh_read_file(path, 16 << 20, &text, &len));
    int line = 0, rc = 0, nf = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l && !rc; l = strtok_r(NULL, "\n", &save)) {
        line++;
        l[strcspn(l, "\r")] = 0;
        if (!*l || *l == '#') continue;
        if (!nf) {
            if (!(nf = header_fields(l, headers)))
                rc = sh_err(SH_EFORMAT, "%s: line %d: expected the header %s", path, line, headers);
            continue;
        }
        char *f[8];
        if (split(l, f, 8) != nf)
            rc = sh_err(SH_EFORMAT, "%s: line %d: expected %d comma-separated fields", path, line, nf);
        else
            rc = row(ctx, f, nf, line);
        if (rc && !strstr(sh_errmsg(), path)) rc = sh_err_wrap(rc, "%s: line %d", path, line);
    }
    free(text);
    return rc;
}

typedef struct speeds {
    speed_row *v;
    int n, cap;
} speeds;

static int speed_row_fn(void *ctx, char **f, int nf, int line)
{
    speeds *s = ctx;
    double v;
    int64_t m = 0;
    (void)line;
    SH_TRY(sh_parse_double(f[1], &v, "speed"));
    if (!(v > 0 && v <= 1)) return sh_err(SH_ERANGE, "speed %g of %s must be in (0,1]", v, f[0]);
    if (nf > 2) SH_TRY(sh_parse_i64(f[2], &m, "max_seqs"));
    if (m < 0 || m > 4096) return sh_err(SH_ERANGE, "max_seqs %lld of %s must be 0..4096", (long long)m, f[0]);
    if (s->n == s->cap) {
        speed_row *nv = realloc(s->v, sizeof *nv * (size_t)(s->cap = s->cap ? 2 * s->cap : 8));
        if (!nv) return sh_err(SH_ENOMEM, "fleet: out of memory");
        s->v = nv;
    }
    snprintf(s->v[s->n].type, sizeof s->v[s->n].type, "%s", f[0]);
    s->v[s->n].max_seqs = (int)m;
    s->v[s->n++].speed = v;
    return 0;
}

/* One node of the fleet file, with its type's declared speed. */
static int node_of(const sh_fleet_node *f, const speeds *sp, const char *path, mj_node *n)
{
    memset(n, 0, sizeof *n);
    if (strlen(f->gpu_type) >= sizeof n->gpu_type)
        return sh_err(SH_EFORMAT, "%s:%d: gpu_type \"%s\" is longer than %zu characters", path, f->line,
                      f->gpu_type, sizeof n->gpu_type - 1);
    memcpy(n->name, f->name, sizeof n->name);
    memcpy(n->gpu_type, f->gpu_type, strlen(f->gpu_type) + 1);
    memcpy(n->zone, f->zone, sizeof n->zone);
    memcpy(n->fabric, f->fabric, sizeof n->fabric);
    n->gpus = f->gpus;
    n->price = f->price_per_gpu_hour;
    for (int i = 0; i < sp->n; i++)
        if (!strcmp(sp->v[i].type, n->gpu_type)) n->speed = sp->v[i].speed, n->max_seqs = sp->v[i].max_seqs;
    if (n->speed <= 0)
        return sh_err(SH_ENOENT, "%s:%d: node %s: GPU type %s has no speed in the speed table; add a line "
                      "\"%s,<speed>\"", path, f->line, n->name, n->gpu_type, n->gpu_type);
    return 0;
}

int mj_fleet_load(const char *fleet_csv, const char *speeds_csv, mj_fleet *out)
{
    memset(out, 0, sizeof *out);
    speeds sp = {0};
    sh_fleet_file ff = {0};
    int rc = each_line(speeds_csv, "gpu_type,speed,max_seqs|gpu_type,speed", speed_row_fn, &sp);
    if (!rc) rc = sh_fleet_load(fleet_csv, NULL, &ff);
    if (!rc && !(out->nodes = calloc(ff.n, sizeof *out->nodes))) rc = sh_err(SH_ENOMEM, "fleet: out of memory");
    for (size_t i = 0; !rc && i < ff.n; i++) {
        rc = node_of(&ff.nodes[i], &sp, fleet_csv, &out->nodes[i]);
        if (!rc) out->n++;
    }
    sh_fleet_free(&ff);
    free(sp.v);
    if (rc) mj_fleet_free(out);
    return rc;
}

void mj_fleet_free(mj_fleet *f)
{
    if (!f) return;
    free(f->nodes);
    memset(f, 0, sizeof *f);
}

const mj_node *mj_fleet_node(const mj_fleet *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->nodes[i].name, name)) return &f->nodes[i];
    return NULL;
}

double mj_fleet_speed(const mj_fleet *f, const char *gpu_type)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->nodes[i].gpu_type, gpu_type)) return f->nodes[i].speed;
    return 0;
}
