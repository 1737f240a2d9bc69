/* The seam between the server and the scheduling core.
 *
 * PLACEHOLDER: until include/shoal/sched.h lands on main, this file holds a
 * trivial first-fit placement so the control plane can be exercised end to
 * end.  It is not a scheduler (no backfill, preemption, fairness or cost
 * model) and is replaced by calls into src/sched as soon as that exists; the
 * rest of the server only calls srv__seam_fit() and srv__seam_step(). */
#include "srv_int.h"

#include <stdlib.h>
#include <string.h>

static int type_ok(const srv_job *j, const srv_node *n)
{
    json_t *types = json_object_get(j->spec, "gpu_types");
    if (!types || !json_array_size(types)) return 1;
    size_t i;
    json_t *v;
    json_array_foreach(types, i, v) if (!strcmp(json_string_value(v), n->gpu_type)) return 1;
    return 0;
}

static int node_ok(const srv_job *j, const srv_node *n)
{
    const char *zone = json_string_value(json_object_get(j->spec, "zone"));
    return n->state != NODE_GONE && type_ok(j, n) && n->gpus >= j->gpus_per_node &&
           (!zone || !strcmp(zone, n->zone));
}

/* Gangs must sit in one zone and on one fabric: count the nodes of the group
 * of node i that satisfy `ok`. */
static int same_group(const srv_node *a, const srv_node *b)
{
    return !strcmp(a->zone, b->zone) && !strcmp(a->fabric, b->fabric);
}

int srv__seam_fit(srv *s, const srv_job *j, char *why, size_t cap)
{
    int best = 0;
    for (int i = 0; i < s->nnodes; i++) {
        if (!node_ok(j, &s->nodes[i])) continue;
        int c = 0;
        for (int k = 0; k < s->nnodes; k++)
            if (node_ok(j, &s->nodes[k]) && (j->kind != K_GANG || same_group(&s->nodes[i], &s->nodes[k]))) c++;
        if (c > best) best = c;
    }
    if (best >= j->min_nodes) return 0;
    snprintf(why, cap,
             "can never fit: needs %d node(s) with %d GPU(s) of the requested type%s%s; the fleet"
             " has at most %d such node(s)%s",
             j->min_nodes, j->gpus_per_node, json_object_get(j->spec, "zone") ? " in zone " : "",
             json_object_get(j->spec, "zone") ? json_string_value(json_object_get(j->spec, "zone")) : "",
             best, j->kind == K_GANG ? " in one zone and fabric" : "");
    return 1;
}

static int free_ok(const srv_job *j, const srv_node *n)
{
    return n->state == NODE_ALIVE && node_ok(j, n) && n->gpus - n->gpus_used >= j->gpus_per_node;
}

/* First fit: for a replace, the surviving nodes keep their ranks. */
static int place(srv *s, srv_job *j, int *out)
{
    for (int g = 0; g < s->nnodes; g++) {
        if (!free_ok(j, &s->nodes[g])) continue;
        int n = 0;
        for (int r = 0; r < j->nprefer && r < j->nodes; r++) {
            int p = j->prefer[r];
            out[r] = p >= 0 && free_ok(j, &s->nodes[p]) && same_group(&s->nodes[p], &s->nodes[g]) ? p : -1;
        }
        for (int r = j->nprefer; r < j->nodes; r++) out[r] = -1;
        for (int r = 0; r < j->nodes; r++) {
            for (int k = 0; out[r] < 0 && k < s->nnodes; k++) {
                int used = 0;
                for (int q = 0; q < j->nodes; q++) used |= out[q] == k;
                if (!used && free_ok(j, &s->nodes[k]) &&
                    (j->kind != K_GANG || same_group(&s->nodes[g], &s->nodes[k])))
                    out[r] = k;
            }
            if (out[r] >= 0) n = r + 1;
            else break;
        }
        if (n >= j->min_nodes) return n;
    }
    return 0;
}

static int cmp_prio(const void *a, const void *b, void *ctx)
{
    srv *s = ctx;
    const srv_job *x = srv__job(s, *(const int64_t *)a), *y = srv__job(s, *(const int64_t *)b);
    if (x->priority != y->priority) return y->priority - x->priority;
    return x->id < y->id ? -1 : x->id > y->id;
}

int srv__seam_step(srv *s, double now)
{
    srv__heartbeats(s, now);
    int64_t k = 0;
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        if (j && j->state <= J_RUNNING) s->active[k++] = s->active[a];
    }
    s->nactive = k;
    qsort_r(s->active, (size_t)s->nactive, sizeof *s->active, cmp_prio, s);
    int nodes[64];
    for (int64_t a = 0; a < s->nactive; a++) {
        srv_job *j = srv__job(s, s->active[a]);
        if (j->state != J_PENDING) continue;
        int n = place(s, j, nodes);
        if (n) SH_TRY(srv__start(s, j, nodes, n));
    }
    return SH_OK;
}
