/* The billing ledger: per-second bills of each allocation, the totals by
 * job, tenant and GPU type, and the journal of closed bills. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ledger_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

/* ---- Billing: per second, each allocation's seconds rounded up ----------- */

void sched__add_cost(double **v, size_t *n, uint32_t type, double c)
{
    if (type >= *n) {
        double *nv = realloc(*v, (type + 1) * sizeof *nv);
        if (!nv) return; /* billing is best effort under memory exhaustion */
        for (size_t i = *n; i <= type; i++) nv[i] = 0;
        *v = nv, *n = type + 1;
    }
    (*v)[type] += c;
}

/* A place's billed seconds: each allocation's seconds rounded up. */
static double place_secs(const splace *p, double now)
{
    double secs = ceil(now - p->since - 1e-9);
    return secs > 0 ? secs : 0;
}

double sched__place_cost(const sched *s, const splace *p, double now)
{
    return place_secs(p, now) * p->gpus * s->nodes[p->node].price_s;
}

/* The bill of place p of job j closed at now (strings the core's). */
static sched_bill bill_of(const sched *s, const sjob *j, const splace *p, double c, double now)
{
    const snode *n = &s->nodes[p->node];
    return (sched_bill){j->id, s->tenants[j->tenant].id, n->id, s->name[s->pools[n->pool].type],
                        p->gpus, p->gmask, p->since, now, place_secs(p, now), c};
}

/* Keeps a closed bill for sched_bills(); best effort under memory
 * exhaustion, as the totals are. */
static void journal(sched *s, const sjob *j, const splace *p, double c, double now)
{
    if (!s->cfg.bill_journal || sched__grow((void **)&s->led->bills, &s->led->capbills, s->led->nbills + 1, sizeof *s->led->bills))
        return;
    sched_bill b = bill_of(s, j, p, c, now);
    char *job = strdup(b.job), *node = strdup(b.node);
    if (!job || !node) {
        free(job), free(node);
        return;
    }
    b.job = job, b.node = node;
    s->led->bills[s->led->nbills++] = b;
}

void sched__bill(sched *s, sjob *j, const splace *p, double now)
{
    if (j->state == SCHED_HOLDING) return; /* billed to nobody: the waste firstfit causes */
    double c = sched__place_cost(s, p, now);
    uint32_t type = s->pools[s->nodes[p->node].pool].type;
    sched__add_cost(&j->cost_t, &j->ncost, type, c);
    stenant *t = &s->tenants[j->tenant];
    sched__add_cost(&t->cost_t, &t->ncost, type, c);
    journal(s, j, p, c, now);
}

size_t sched_bills(const sched *s, const sched_bill **out)
{
    *out = s->led->bills;
    return s->led->nbills;
}

size_t sched_job_closing_bills(const sched *s, const char *id, double now, sched_bill *out, size_t cap)
{
    uint32_t ji = id ? sched__map_get(&s->job_map, id) : NONE;
    if (ji == NONE) return 0;
    const sjob *j = &s->jobs[ji];
    /* As stop_job: a holding job's places are billed to nobody. */
    if (j->state != SCHED_RUNNING && j->state != SCHED_REPLACING) return 0;
    for (int k = 0; k < j->nplaces && (size_t)k < cap; k++)
        out[k] = bill_of(s, j, &j->places[k], sched__place_cost(s, &j->places[k], now), now);
    return (size_t)j->nplaces;
}

void sched_bills_drop_last(sched *s, size_t n)
{
    if (n > s->led->nbills) n = s->led->nbills;
    for (size_t i = s->led->nbills - n; i < s->led->nbills; i++) free((char *)s->led->bills[i].job), free((char *)s->led->bills[i].node);
    s->led->nbills -= n;
}

void sched_bills_done(sched *s, size_t n)
{
    if (n > s->led->nbills) n = s->led->nbills;
    for (size_t i = 0; i < n; i++) free((char *)s->led->bills[i].job), free((char *)s->led->bills[i].node);
    if (n && n < s->led->nbills) memmove(s->led->bills, s->led->bills + n, (s->led->nbills - n) * sizeof *s->led->bills);
    s->led->nbills -= n;
}

/* c plus what the places job j holds now have cost so far. */
double sched__open_cost(const sched *s, const sjob *j, uint32_t type, double now, double c)
{
    if (j->state == SCHED_RUNNING || j->state == SCHED_REPLACING)
        for (int k = 0; k < j->nplaces; k++)
            if (type == NONE || s->pools[s->nodes[j->places[k].node].pool].type == type)
                c += sched__place_cost(s, &j->places[k], now);
    return c;
}

double sched__job_cost(const sched *s, const sjob *j, uint32_t type, double now)
{
    double c = 0;
    for (size_t i = 0; i < j->ncost; i++)
        if (type == NONE || type == i) c += j->cost_t[i];
    return sched__open_cost(s, j, type, now, c);
}

double sched_cost_job(const sched *s, const char *job, const char *gpu_type, double now)
{
    uint32_t type = gpu_type ? sched__map_get(&s->names, gpu_type) : NONE;
    if (gpu_type && type == NONE) return 0;
    double c = 0;
    if (!job) /* everyone: forgotten jobs too */
        for (size_t i = 0; i < s->led->nforgot_cost; i++)
            if (type == NONE || type == i) c += s->led->forgot_cost_t[i];
    for (size_t i = 0; i < s->njobs; i++)
        if (s->jobs[i].id && (!job || !strcmp(job, s->jobs[i].id))) {
            c += sched__job_cost(s, &s->jobs[i], type, now);
            if (job) break;
        }
    return c;
}

double sched_cost_job_open(const sched *s, const char *job, const char *gpu_type, double now, double *gpu_s)
{
    uint32_t type = gpu_type ? sched__map_get(&s->names, gpu_type) : NONE;
    uint32_t ji = job ? sched__map_get(&s->job_map, job) : NONE;
    if (gpu_s) *gpu_s = 0;
    if ((gpu_type && type == NONE) || ji == NONE) return 0;
    const sjob *j = &s->jobs[ji];
    if (gpu_s && (j->state == SCHED_RUNNING || j->state == SCHED_REPLACING))
        for (int k = 0; k < j->nplaces; k++)
            if (type == NONE || s->pools[s->nodes[j->places[k].node].pool].type == type)
                *gpu_s += place_secs(&j->places[k], now) * j->places[k].gpus;
    return sched__open_cost(s, j, type, now, 0);
}

double sched_cost_tenant(const sched *s, const char *tenant, const char *gpu_type, double now)
{
    uint32_t type = gpu_type ? sched__map_get(&s->names, gpu_type) : NONE;
    if (gpu_type && type == NONE) return 0;
    uint32_t ti = tenant ? sched__map_get(&s->tenant_map, tenant) : NONE;
    if (tenant && ti == NONE) return 0;
    double c = 0;
    for (size_t i = 0; i < s->ntenants; i++) {
        const stenant *t = &s->tenants[i];
        if (ti != NONE && ti != i) continue;
        for (size_t k = 0; k < t->ncost; k++)
            if (type == NONE || type == k) c += t->cost_t[k];
    }
    /* Running allocations are billed up to now. */
    for (size_t i = 0; i < s->njobs; i++) {
        const sjob *j = &s->jobs[i];
        if ((ti != NONE && j->tenant != ti) ||
            (j->state != SCHED_RUNNING && j->state != SCHED_REPLACING))
            continue;
        for (int k = 0; k < j->nplaces; k++)
            if (type == NONE || s->pools[s->nodes[j->places[k].node].pool].type == type)
                c += sched__place_cost(s, &j->places[k], now);
    }
    return c;
}

int sched__ledger_new(sched *s)
{
    return (s->led = calloc(1, sizeof *s->led)) ? 0 : SH_ENOMEM;
}

void sched__ledger_free(sched *s)
{
    if (!s->led) return;
    sched_bills_done(s, s->led->nbills);
    free(s->led->bills), free(s->led->forgot_cost_t);
    free(s->led);
}

void sched__ledger_forget(sched *s, const sjob *j)
{
    for (size_t k = 0; k < j->ncost; k++)
        sched__add_cost(&s->led->forgot_cost_t, &s->led->nforgot_cost, (uint32_t)k, j->cost_t[k]);
}
