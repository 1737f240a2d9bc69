/* Fleet importers: shoal's fleet files (through src/common/fleetfile.c) and the Alibaba node lists, with a
 * deterministic zone and fabric assignment for lists that have none. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "csv_int.h"
#include "shoal/common.h"
#include "shoal/fleetfile.h"
#include "shoal/sim.h"

#define FLEET_HEADER "node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour"

/* Nominal on-demand prices per GPU-hour by model (documented in
 * docs/sim-formats.md); the traces carry no prices, and cost comparisons
 * between policies only need them to be consistent. */
static const struct {
    const char *model;
    double price;
} prices[] = {{"H800", 2.50},   {"H100", 2.50},  {"A100-SXM4-80GB", 1.80}, {"A800-SXM4-80GB", 1.80},
              {"A100", 1.50},   {"A10", 0.60},   {"V100M32", 1.00},        {"V100M16", 0.90},
              {"V100", 0.90},   {"P100", 0.50},  {"T4", 0.35},             {"K80", 0.20}};

double sim_price_of(const char *t)
{
    for (size_t i = 0; i < sizeof prices / sizeof prices[0]; i++)
        if (!strcasecmp(t, prices[i].model)) return prices[i].price;
    return 1.00;
}

void sim_fleet_free(sim_fleet *f)
{
    if (!f) return;
    free(f->nodes);
    memset(f, 0, sizeof *f);
}

static int push(sim_fleet *f, size_t *cap, sim_node **out)
{
    if (f->n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        sim_node *v = realloc(f->nodes, c * sizeof *v);
        if (!v) return sh_err(SH_ENOMEM, "fleet: out of memory");
        f->nodes = v, *cap = c;
    }
    *out = &f->nodes[f->n++];
    memset(*out, 0, sizeof **out);
    return 0;
}

/* Zone and fabric of the k-th node of its type (see sim_fleet_opts). */
typedef struct tcount {
    char type[SIM_NAME];
    int k;
} tcount;

static int assign(sim_node *n, tcount *tc, int *ntc, const sim_fleet_opts *o)
{
    int i = 0;
    while (i < *ntc && strcmp(tc[i].type, n->gpu_type)) i++;
    if (i == *ntc) {
        if (*ntc == 64) return sh_err(SH_ERANGE, "fleet: more than 64 GPU types");
        snprintf(tc[i].type, SIM_NAME, "%s", n->gpu_type);
        tc[i].k = 0, (*ntc)++;
    }
    int f = tc[i].k++ / o->fabric_nodes;
    snprintf(n->zone, SIM_NAME, "z%d", f % o->zones);
    snprintf(n->fabric, SIM_NAME, "%.40s-f%d", n->gpu_type, f);
    return 0;
}

static int parse_line(const char *fmt, const char *path, size_t ln, char **fl, int nf,
                      sim_node *n, int *skip)
{
    *skip = 0;
    if (!strcmp(fmt, "alibaba-v2023")) {
        if (nf != 5) return sh_err(SH_EFORMAT, "%s:%zu: expected 5 fields (sn,cpu_milli,memory_mib,gpu,model), got %d", path, ln, nf);
        SH_TRY(sim__name(n->id, SIM_NAME, fl[0], path, ln, "sn"));
        SH_TRY(sim__int(fl[3], path, ln, "gpu", 0, SCHED_MAX_NODE_GPUS, &n->gpus));
        if (!n->gpus) return *skip = 1, 0;
        return sim__name(n->gpu_type, SIM_NAME, fl[4], path, ln, "model");
    }
    if (nf != 4) return sh_err(SH_EFORMAT, "%s:%zu: expected 4 fields (gpu_model,gpu_capacity_num,cpu_num,node_name), got %d", path, ln, nf);
    char id[SIM_NAME];
    SH_TRY(sim__name(id, SIM_NAME - 8, fl[3], path, ln, "node_name"));
    snprintf(n->id, SIM_NAME, "node-%s", id);
    SH_TRY(sim__int(fl[1], path, ln, "gpu_capacity_num", 0, SCHED_MAX_NODE_GPUS, &n->gpus));
    if (!n->gpus) return *skip = 1, 0;
    return sim__name(n->gpu_type, SIM_NAME, fl[0], path, ln, "gpu_model");
}

static const sim_node *dup_base;
static int cmp_node_ix(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int c = strcmp(dup_base[x].id, dup_base[y].id);
    return c ? c : (x > y) - (x < y);
}

/* Fails naming both lines when two nodes share an id. */
static int dup_ids(const sim_fleet *f, const size_t *lines, const char *path)
{
    size_t *ix = malloc(f->n * sizeof *ix);
    if (!ix) return sh_err(SH_ENOMEM, "fleet: out of memory");
    for (size_t i = 0; i < f->n; i++) ix[i] = i;
    dup_base = f->nodes;
    qsort(ix, f->n, sizeof *ix, cmp_node_ix);
    int rc = 0;
    for (size_t i = 1; i < f->n && !rc; i++)
        if (!strcmp(f->nodes[ix[i]].id, f->nodes[ix[i - 1]].id))
            rc = sh_err(SH_EFORMAT, "%s:%zu: node id \"%s\" appears again (first at line %zu)", path,
                        lines[ix[i]], f->nodes[ix[i]].id, lines[ix[i - 1]]);
    free(ix);
    return rc;
}

/* shoal's own fleet files go through the one reader (docs/fleet-format.md),
 * after the same checks for bytes no importer may read past. */
static int load_native(const char *path, sim_fleet *out)
{
    char *text;
    size_t len;
    SH_TRY(sh_read_file(path, (size_t)1 << 30, &text, &len));
    sh_fleet_file ff;
    int rc = sim__check_text(path, text, len);
    if (!rc) rc = sh_fleet_parse(text, path, NULL, &ff);
    free(text);
    if (rc) return rc;
    _Static_assert(SH_FLEET_NAME <= SIM_NAME && SH_FLEET_MAX_GPUS <= SCHED_MAX_NODE_GPUS,
                   "fleet files fit the simulator's nodes");
    if (!(out->nodes = calloc(ff.n, sizeof *out->nodes))) rc = sh_err(SH_ENOMEM, "fleet: out of memory");
    for (size_t i = 0; !rc && i < ff.n; i++) {
        const sh_fleet_node *f = &ff.nodes[i];
        sim_node *n = &out->nodes[out->n++];
        memcpy(n->id, f->name, sizeof f->name);
        memcpy(n->zone, f->zone, sizeof f->zone);
        memcpy(n->fabric, f->fabric, sizeof f->fabric);
        memcpy(n->gpu_type, f->gpu_type, sizeof f->gpu_type);
        n->gpus = f->gpus;
        n->price_per_gpu_hour = f->price_per_gpu_hour;
    }
    sh_fleet_free(&ff);
    if (rc) sim_fleet_free(out);
    return rc;
}

int sim_fleet_load(const char *path, const char *format, const sim_fleet_opts *opts, sim_fleet *out)
{
    static const char *const headers[] = {FLEET_HEADER, "sn,cpu_milli,memory_mib,gpu,model",
                                          "gpu_model,gpu_capacity_num,cpu_num,node_name"};
    static const char *const formats[] = {"shoal", "alibaba-v2023", "alibaba-v2026"};
    int fi = -1;
    for (int i = 0; i < 3; i++)
        if (format && !strcmp(format, formats[i])) fi = i;
    if (fi < 0)
        return sh_err(SH_EINVAL, "unknown fleet format \"%s\" (use shoal, alibaba-v2023 or alibaba-v2026)",
                      format ? format : "");
    sim_fleet_opts o = {2, 32};
    if (opts) o = *opts;
    if (o.zones < 1 || o.fabric_nodes < 1)
        return sh_err(SH_EINVAL, "fleet: zones and nodes per fabric must be >= 1");
    memset(out, 0, sizeof *out);
    if (fi == 0) return load_native(path, out);
    char *text;
    size_t len, cap = 0, ln = 0;
    SH_TRY(sh_read_file(path, (size_t)1 << 30, &text, &len));
    char *pos = text, *line;
    int rc = sim__check_text(path, text, len), seen_header = 0, ntc = 0;
    size_t *lines = NULL, caplines = 0;
    tcount tc[64];
    while (!rc && (line = sim__next_line(&pos))) {
        ln++;
        if (!*line || *line == '#') continue;
        if (!seen_header) {
            if (strcmp(line, headers[fi]))
                rc = sh_err(SH_EFORMAT, "%s:%zu: expected the header \"%s\"", path, ln, headers[fi]);
            seen_header = 1;
            continue;
        }
        char *fl[SIM__MAX_FIELDS];
        int nf = sim__split(line, ',', fl, SIM__MAX_FIELDS), skip;
        sim_node n;
        memset(&n, 0, sizeof n);
        rc = parse_line(format, path, ln, fl, nf, &n, &skip);
        if (rc || skip) continue;
        if (fi > 0) {
            n.price_per_gpu_hour = sim_price_of(n.gpu_type);
            rc = assign(&n, tc, &ntc, &o);
        }
        sim_node *slot = NULL;
        if (!rc) rc = push(out, &cap, &slot);
        if (!rc) *slot = n;
        if (!rc && out->n > caplines) {
            size_t c = caplines ? caplines * 2 : 256;
            size_t *v = realloc(lines, c * sizeof *v);
            if (!v) rc = sh_err(SH_ENOMEM, "fleet: out of memory");
            else lines = v, caplines = c;
        }
        if (!rc) lines[out->n - 1] = ln;
    }
    free(text);
    if (!rc && !seen_header) rc = sh_err(SH_EFORMAT, "%s: empty fleet file (no header)", path);
    if (!rc && !out->n) rc = sh_err(SH_EFORMAT, "%s: no GPU nodes", path);
    if (!rc) rc = dup_ids(out, lines, path);
    free(lines);
    if (rc) sim_fleet_free(out);
    return rc;
}

int sim_fleet_write(const sim_fleet *f, const char *path)
{
    sh_buf b = {0};
    int rc = sh_buf_printf(&b, FLEET_HEADER "\n");
    for (size_t i = 0; i < f->n && !rc; i++) {
        const sim_node *n = &f->nodes[i];
        rc = sh_buf_printf(&b, "%s,%s,%s,%s,%d,%.4f\n", n->id, n->zone, n->fabric, n->gpu_type,
                           n->gpus, n->price_per_gpu_hour);
    }
    if (!rc) rc = sh_write_atomic(path, b.data, b.len);
    sh_buf_free(&b);
    return rc;
}
