/* Trace importers: the shoal trace CSV (v1), the Philly traces as gavel
 * ships them (durations from gavel's measured per-GPU-type throughputs),
 * and the Alibaba v2023 GPU pod list. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "csv_int.h"
#include "shoal/common.h"
#include "shoal/sim.h"

#define TRACE_HEADER "job_id,submit_s,tenant,kind,nodes,gpus_per_node,gpu_types,duration_s,priority"
#define NODE_GPUS 8 /* importers pack jobs wider than this into 8-GPU nodes */

void sim_trace_free(sim_trace *t)
{
    if (!t) return;
    free(t->jobs);
    memset(t, 0, sizeof *t);
}

static int push(sim_trace *t, sim_job **out)
{
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 1024;
        sim_job *v = realloc(t->jobs, c * sizeof *v);
        if (!v) return sh_err(SH_ENOMEM, "trace: out of memory");
        t->jobs = v, t->cap = c;
    }
    *out = &t->jobs[t->n++];
    memset(*out, 0, sizeof **out);
    return 0;
}

/* Splits GPUs into nodes: up to NODE_GPUS on one node, else full nodes. */
static void pack(sim_job *j, int gpus)
{
    if (gpus <= NODE_GPUS) j->nodes = 1, j->gpus_per_node = gpus;
    else j->nodes = (gpus + NODE_GPUS - 1) / NODE_GPUS, j->gpus_per_node = NODE_GPUS;
}

/* "a|b:0.5|c" or "*" into the job's type list. */
static int parse_types(sim_job *j, char *v, const char *path, size_t ln)
{
    if (!strcmp(v, "*")) return 0;
    char *f[SCHED_MAX_TYPES + 1];
    int n = sim__split(v, '|', f, SCHED_MAX_TYPES + 1);
    if (n > SCHED_MAX_TYPES)
        return sh_err(SH_EFORMAT, "%s:%zu: field gpu_types: more than %d types", path, ln, SCHED_MAX_TYPES);
    for (int i = 0; i < n; i++) {
        char *colon = strchr(f[i], ':');
        j->speed[i] = 1.0;
        if (colon) {
            *colon = 0;
            SH_TRY(sim__num(colon + 1, path, ln, "gpu_types (speed)", 1e-9, &j->speed[i]));
        }
        SH_TRY(sim__name(j->gpu_types[i], SIM_NAME, f[i], path, ln, "gpu_types"));
    }
    j->n_types = n;
    return 0;
}

static int parse_shoal(char **fl, int nf, const char *path, size_t ln, sim_job *j)
{
    if (nf != 9) return sh_err(SH_EFORMAT, "%s:%zu: expected 9 fields (" TRACE_HEADER "), got %d", path, ln, nf);
    SH_TRY(sim__name(j->id, SIM_NAME, fl[0], path, ln, "job_id"));
    SH_TRY(sim__num(fl[1], path, ln, "submit_s", 0, &j->submit_s));
    SH_TRY(sim__name(j->tenant, SIM_NAME, fl[2], path, ln, "tenant"));
    if (!strcmp(fl[3], "gang")) j->kind = SCHED_GANG;
    else if (!strcmp(fl[3], "elastic")) j->kind = SCHED_ELASTIC;
    else if (!strcmp(fl[3], "function")) j->kind = SCHED_FUNCTION;
    else return sh_err(SH_EFORMAT, "%s:%zu: field kind: \"%s\" is not gang, elastic or function", path, ln, fl[3]);
    char *dash = j->kind == SCHED_ELASTIC ? strchr(fl[4], '-') : NULL;
    if (dash) *dash = 0;
    SH_TRY(sim__int(fl[4], path, ln, "nodes", 1, 4096, &j->nodes));
    j->max_replicas = j->nodes;
    if (dash) SH_TRY(sim__int(dash + 1, path, ln, "nodes (max replicas)", j->nodes, 4096, &j->max_replicas));
    SH_TRY(sim__int(fl[5], path, ln, "gpus_per_node", 1, SCHED_MAX_NODE_GPUS, &j->gpus_per_node));
    if (j->kind == SCHED_FUNCTION && (j->nodes != 1 || j->gpus_per_node != 1))
        return sh_err(SH_EFORMAT, "%s:%zu: field nodes: a function takes 1 node x 1 GPU", path, ln);
    SH_TRY(parse_types(j, fl[6], path, ln));
    SH_TRY(sim__num(fl[7], path, ln, "duration_s", 1e-6, &j->duration_s));
    return sim__int(fl[8], path, ln, "priority", -1000000, 1000000, &j->priority);
}

static int parse_alibaba(char **fl, int nf, const char *path, size_t ln, sim_job *j, int *skip)
{
    if (nf != 11)
        return sh_err(SH_EFORMAT, "%s:%zu: expected 11 fields (name,...,scheduled_time), got %d", path, ln, nf);
    int gpus;
    SH_TRY(sim__int(fl[3], path, ln, "num_gpu", 0, 1024, &gpus));
    /* CPU-only pods and pods never scheduled carry no GPU run time. */
    if (!gpus || !*fl[10]) return *skip = 1, 0;
    double created, deleted, sched_at;
    SH_TRY(sim__name(j->id, SIM_NAME, fl[0], path, ln, "name"));
    SH_TRY(sim__num(fl[8], path, ln, "creation_time", 0, &created));
    SH_TRY(sim__num(fl[9], path, ln, "deletion_time", 0, &deleted));
    SH_TRY(sim__num(fl[10], path, ln, "scheduled_time", 0, &sched_at));
    j->submit_s = created;
    j->duration_s = deleted > sched_at ? deleted - sched_at : 1;
    j->kind = SCHED_GANG;
    pack(j, gpus);
    j->max_replicas = j->nodes;
    snprintf(j->tenant, SIM_NAME, "%s", *fl[6] ? fl[6] : "default");
    j->priority = !strcmp(fl[6], "LS") || !strcmp(fl[6], "Guaranteed");
    return *fl[5] ? parse_types(j, fl[5], path, ln) : 0;
}

/* ---- gavel ------------------------------------------------------------------ */

static const char *const gavel_types[] = {"v100", "p100", "k80"};

/* steps/s of job_type at scale sf on a GPU type; scales gavel did not
 * measure use the largest measured scale below, linearly. */
static double gavel_thr(json_t *thr, const char *type, const char *job_type, int sf)
{
    json_t *t = json_object_get(thr, type);
    for (int s = sf; s >= 1; s--) {
        char key[256];
        snprintf(key, sizeof key, "('%s', %d)", job_type, s);
        json_t *v = json_object_get(json_object_get(t, key), "null");
        if (json_is_number(v)) return json_number_value(v) * sf / s;
    }
    return 0;
}

/* Two layouts, told apart by their field count: the 7 fields of the
 * traces gavel ships (job_type, command, num_steps_arg, needs_data_dir,
 * total_steps, arrival_time, scale_factor) and the 10 of gavel's current
 * parse_trace (job_type, command, working_directory, num_steps_arg,
 * needs_data_dir, total_steps, scale_factor, priority_weight, SLO,
 * arrival_time).  priority_weight and SLO are checked, not used. */
static int parse_gavel(char **fl, int nf, const char *path, size_t ln, json_t *thr, const char *vc,
                       sim_job *j)
{
    if (nf != 7 && nf != 10)
        return sh_err(SH_EFORMAT, "%s:%zu: expected 7 tab-separated fields (job_type, command, "
                      "num_steps_arg, needs_data_dir, total_steps, arrival_time, scale_factor) or 10 "
                      "(job_type, command, working_directory, num_steps_arg, needs_data_dir, total_steps, "
                      "scale_factor, priority_weight, SLO, arrival_time), got %d",
                      path, ln, nf);
    double steps, weight, slo;
    int sf;
    SH_TRY(sim__num(fl[nf == 7 ? 4 : 5], path, ln, "total_steps", 1, &steps));
    SH_TRY(sim__num(fl[nf == 7 ? 5 : 9], path, ln, "arrival_time", 0, &j->submit_s));
    SH_TRY(sim__int(fl[nf == 7 ? 6 : 6], path, ln, "scale_factor", 1, 1024, &sf));
    if (nf == 10) {
        SH_TRY(sim__num(fl[7], path, ln, "priority_weight", 0, &weight));
        if (strcmp(fl[8], "None")) SH_TRY(sim__num(fl[8], path, ln, "SLO", 0, &slo));
    }
    double t[3], ref = 0;
    for (int i = 0; i < 3; i++) {
        t[i] = gavel_thr(thr, gavel_types[i], fl[0], sf);
        if (t[i] > ref) ref = t[i];
    }
    if (t[0] > 0) ref = t[0]; /* v100 is the reference type when it runs */
    if (ref <= 0)
        return sh_err(SH_EFORMAT, "%s:%zu: field job_type: no throughput for \"%s\" at scale %d",
                      path, ln, fl[0], sf);
    snprintf(j->id, SIM_NAME, "%.40s-%zu", vc, ln);
    snprintf(j->tenant, SIM_NAME, "%s", vc);
    j->kind = SCHED_GANG;
    pack(j, sf);
    j->max_replicas = j->nodes;
    j->duration_s = steps / ref;
    for (int i = 0; i < 3; i++)
        if (t[i] > 0) {
            snprintf(j->gpu_types[j->n_types], SIM_NAME, "%s", gavel_types[i]);
            j->speed[j->n_types++] = t[i] / ref;
        }
    return 0;
}

/* ---- Type renaming and loading ------------------------------------------------------ */

static int apply_type_map(sim_job *j, const char *map)
{
    sim_job o = *j;
    j->n_types = 0;
    for (int i = 0; i < o.n_types; i++) {
        const char *hit = NULL;
        size_t tl = strlen(o.gpu_types[i]);
        for (const char *p = map; p && *p;) {
            if (!strncmp(p, o.gpu_types[i], tl) && p[tl] == '=') hit = p + tl + 1;
            p = strchr(p, ',');
            if (p) p++;
        }
        if (!hit) {
            if (j->n_types == SCHED_MAX_TYPES) goto too_many;
            memcpy(j->gpu_types[j->n_types], o.gpu_types[i], SIM_NAME);
            j->speed[j->n_types++] = o.speed[i];
            continue;
        }
        while (*hit && *hit != ',') {
            size_t n = strcspn(hit, "|,");
            if (j->n_types == SCHED_MAX_TYPES) goto too_many;
            if (!n || n >= SIM_NAME) return sh_err(SH_EINVAL, "type map \"%s\": bad name", map);
            memcpy(j->gpu_types[j->n_types], hit, n);
            j->gpu_types[j->n_types][n] = 0;
            j->speed[j->n_types++] = o.speed[i];
            hit += n + (hit[n] == '|');
        }
    }
    return 0;
too_many:
    return sh_err(SH_EINVAL, "type map \"%s\" gives job %s more than %d GPU types", map, j->id,
                  SCHED_MAX_TYPES);
}

static int cmp_submit(const void *a, const void *b)
{
    const sim_job *x = a, *y = b;
    if (x->submit_s != y->submit_s) return x->submit_s < y->submit_s ? -1 : 1;
    return strcmp(x->id, y->id);
}

int sim_trace_load(const char *path, const char *format, const sim_trace_opts *opts, sim_trace *out)
{
    int gavel = format && !strcmp(format, "gavel"), ali = format && !strcmp(format, "alibaba-v2023");
    if (!gavel && !ali && (!format || strcmp(format, "shoal")))
        return sh_err(SH_EINVAL, "unknown trace format \"%s\" (use shoal, gavel or alibaba-v2023)",
                      format ? format : "");
    memset(out, 0, sizeof *out);
    json_t *thr = NULL;
    char vc[SIM_NAME] = "";
    /* The trace first: a missing one is named as such, not as its missing
     * throughputs file beside it. */
    char *text;
    size_t len, ln = 0;
    SH_TRY(sh_read_file(path, (size_t)1 << 30, &text, &len));
    if (gavel) {
        char tp[4096];
        if (opts && opts->throughputs) snprintf(tp, sizeof tp, "%s", opts->throughputs);
        else {
            snprintf(tp, sizeof tp, "%s", path);
            char *slash = strrchr(tp, '/');
            snprintf(slash ? slash + 1 : tp, sizeof tp - (size_t)(slash ? slash + 1 - tp : 0),
                     "gavel_simulation_throughputs.json");
        }
        int trc = sh_json_load_file(tp, (size_t)64 << 20, &thr);
        if (trc < 0) {
            free(text);
            if (opts && opts->throughputs) return trc;
            return sh_err_wrap(trc, "%s: the gavel throughputs beside it (or give --throughputs FILE)", path);
        }
        const char *base = strrchr(path, '/');
        snprintf(vc, sizeof vc, "%.50s", base ? base + 1 : path);
        char *dot = strrchr(vc, '.');
        if (dot) *dot = 0;
    }
    int rc = sim__check_text(path, text, len);
    char *pos = text, *line;
    int header = !gavel;
    while (!rc && (line = sim__next_line(&pos))) {
        ln++;
        if (!*line || (!gavel && *line == '#')) continue;
        if (header) {
            const char *want = ali ? "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,"
                                     "pod_phase,creation_time,deletion_time,scheduled_time"
                                   : TRACE_HEADER;
            if (strcmp(line, want)) rc = sh_err(SH_EFORMAT, "%s:%zu: expected the header \"%s\"", path, ln, want);
            header = 0;
            continue;
        }
        char *fl[SIM__MAX_FIELDS];
        int nf = sim__split(line, gavel ? '\t' : ',', fl, SIM__MAX_FIELDS), skip = 0;
        sim_job j;
        memset(&j, 0, sizeof j);
        if (gavel) rc = parse_gavel(fl, nf, path, ln, thr, vc, &j);
        else if (ali) rc = parse_alibaba(fl, nf, path, ln, &j, &skip);
        else rc = parse_shoal(fl, nf, path, ln, &j);
        if (!rc && skip) {
            out->skipped++;
            continue;
        }
        if (!rc && opts && opts->type_map) rc = apply_type_map(&j, opts->type_map);
        j.line = ln;
        sim_job *slot = NULL;
        if (!rc) rc = push(out, &slot);
        if (!rc) *slot = j;
    }
    free(text);
    json_decref(thr);
    if (!rc && header) rc = sh_err(SH_EFORMAT, "%s: empty trace (no header)", path);
    if (rc) return sim_trace_free(out), rc;
    rc = sim_trace_check_ids(out, path);
    if (rc) return sim_trace_free(out), rc;
    if (out->n) qsort(out->jobs, out->n, sizeof *out->jobs, cmp_submit);
    return 0;
}

static const sim_job *dup_base;
static int cmp_job_ix(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int c = strcmp(dup_base[x].id, dup_base[y].id);
    return c ? c : (x > y) - (x < y);
}

int sim_trace_check_ids(const sim_trace *t, const char *what)
{
    if (t->n < 2) return 0;
    size_t *ix = malloc(t->n * sizeof *ix);
    if (!ix) return sh_err(SH_ENOMEM, "trace: out of memory");
    for (size_t i = 0; i < t->n; i++) ix[i] = i;
    dup_base = t->jobs;
    qsort(ix, t->n, sizeof *ix, cmp_job_ix);
    int rc = 0;
    for (size_t i = 1; i < t->n && !rc; i++) {
        const sim_job *a = &t->jobs[ix[i - 1]], *b = &t->jobs[ix[i]];
        if (strcmp(a->id, b->id)) continue;
        if (a->line && b->line)
            rc = sh_err(SH_EFORMAT, "%s:%zu: job id \"%s\" appears again (first at line %zu)", what, b->line,
                        b->id, a->line);
        else rc = sh_err(SH_EFORMAT, "%s: job id \"%s\" appears twice", what, b->id);
    }
    free(ix);
    return rc;
}

int sim_trace_write(const sim_trace *t, const char *path)
{
    static const char *const kinds[] = {"gang", "elastic", "function"};
    sh_buf b = {0};
    int rc = sh_buf_printf(&b, TRACE_HEADER "\n");
    for (size_t i = 0; i < t->n && !rc; i++) {
        const sim_job *j = &t->jobs[i];
        char nodes[32], types[SCHED_MAX_TYPES * (SIM_NAME + 16)] = "";
        if (j->kind == SCHED_ELASTIC && j->max_replicas != j->nodes)
            snprintf(nodes, sizeof nodes, "%d-%d", j->nodes, j->max_replicas);
        else snprintf(nodes, sizeof nodes, "%d", j->nodes);
        size_t o = 0;
        for (int k = 0; k < j->n_types; k++)
            o += (size_t)snprintf(types + o, sizeof types - o, "%s%s:%.6g", k ? "|" : "", j->gpu_types[k], j->speed[k]);
        rc = sh_buf_printf(&b, "%s,%.3f,%s,%s,%s,%d,%s,%.3f,%d\n", j->id, j->submit_s, j->tenant,
                           kinds[j->kind], nodes, j->gpus_per_node, j->n_types ? types : "*",
                           j->duration_s, j->priority);
    }
    if (!rc) rc = sh_write_atomic(path, b.data, b.len);
    sh_buf_free(&b);
    return rc;
}
