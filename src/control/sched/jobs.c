/* Jobs: submission and its checks, tenant queues, cancel and finish,
 * per-second billing and the queries. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

static uint32_t tenant_of(sched *s, const char *name)
{
    uint32_t ti = sched__map_get(&s->tenant_map, name);
    if (ti != NONE) return ti;
    if (GROW(s->tenants, s->captenants, s->ntenants + 1) < 0) return NONE;
    stenant *t = &s->tenants[s->ntenants];
    memset(t, 0, sizeof *t);
    t->kc_job = NONE;
    if (sched__map_put(&s->tenant_map, name, (uint32_t)s->ntenants, &t->id) < 0) return NONE;
    return (uint32_t)s->ntenants++;
}

/* Queue order within a tenant: higher priority first, then `order` (the
 * submit sequence; a requeued gang gets a negative order, so it goes to the
 * head of its priority class). */
static int before(const sjob *a, const sjob *b)
{
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->order < b->order;
}

static size_t queue_pos(const sched *s, const stenant *t, const sjob *j)
{
    size_t lo = 0, hi = t->nq;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (before(&s->jobs[t->queue[mid]], j)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Position of slot k in s->live (where it is or would go). */
static size_t live_pos(const sched *s, uint32_t k)
{
    size_t lo = 0, hi = s->nshapes_live;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->live[mid] < k) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Shape sh got its first queued job: it joins s->live. */
static int live_add(sched *s, const sshape *sh)
{
    SH_TRY(GROW(s->live, s->caplive, s->nshapes_live + 1));
    uint32_t k = (uint32_t)(sh - s->shapes);
    size_t at = live_pos(s, k);
    memmove(s->live + at + 1, s->live + at, (s->nshapes_live - at) * sizeof *s->live);
    s->live[at] = k;
    s->nshapes_live++;
    return 0;
}

/* Shape sh has no queued job left: it leaves s->live. */
static void live_drop(sched *s, const sshape *sh)
{
    size_t at = live_pos(s, (uint32_t)(sh - s->shapes));
    s->nshapes_live--;
    memmove(s->live + at, s->live + at + 1, (s->nshapes_live - at) * sizeof *s->live);
}

/* The entry of a shape (created empty when new; NULL without memory). */
sshape *sched__shape(sched *s, uint64_t shape)
{
    /* Slots of shapes with nothing queued stay taken until a rebuild, so
     * the load counts every taken slot (counting only live shapes once let
     * the table fill up, and a probe for a new shape never ended). */
    if ((s->nshapes_used + 1) * 2 > s->capshapes) {
        /* Rebuild, dropping shapes with nothing queued. */
        size_t cap = 64;
        while (cap < (s->nshapes_live + 1) * 4) cap *= 2;
        sshape *v = calloc(cap, sizeof *v);
        if (!v) return NULL;
        s->nshapes_used = 0;
        for (size_t i = 0; i < s->capshapes; i++) {
            if (!s->shapes[i].queued) {
                free(s->shapes[i].heap), free(s->shapes[i].pheap), free(s->shapes[i].uheap);
                continue;
            }
            size_t k = s->shapes[i].shape & (cap - 1);
            while (v[k].shape) k = (k + 1) & (cap - 1);
            v[k] = s->shapes[i];
            s->nshapes_used++;
        }
        free(s->shapes);
        s->shapes = v, s->capshapes = cap;
        /* Every live shape moved: list the slots afresh, in order (the
         * list holds nshapes_live slots, so it has room). */
        size_t n = 0;
        for (size_t i = 0; i < cap; i++)
            if (v[i].queued) s->live[n++] = (uint32_t)i;
    }
    size_t k = shape & (s->capshapes - 1);
    while (s->shapes[k].shape && s->shapes[k].shape != shape) k = (k + 1) & (s->capshapes - 1);
    if (!s->shapes[k].shape) s->nshapes_used++;
    s->shapes[k].shape = shape;
    return &s->shapes[k];
}

static int heap_valid(const sched *s, const sshape *sh, const struct slen *e)
{
    const sjob *j = &s->jobs[e->job];
    return j->qgen == e->gen && j->shape == sh->shape &&
           (j->state == SCHED_QUEUED || j->state == SCHED_HOLDING);
}

static void heap_down(struct slen *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l].len < h[m].len) m = l;
        if (r < n && h[r].len < h[m].len) m = r;
        if (m == i) return;
        struct slen x = h[i];
        h[i] = h[m], h[m] = x;
        i = m;
    }
}

/* The smallest valid key of a heap, dropping stale entries from its top. */
static double heap_min(const sched *s, const sshape *sh, struct slen *h, size_t *n)
{
    while (*n && !heap_valid(s, sh, &h[0])) {
        h[0] = h[--*n];
        heap_down(h, *n, 0);
    }
    return *n ? h[0].len : INFINITY;
}

double sched__shape_min_len(const sched *s, sshape *sh)
{
    if (sh->len_gen != sh->gen + 1) {
        sh->len = heap_min(s, sh, sh->heap, &sh->nheap);
        double p = heap_min(s, sh, sh->pheap, &sh->npheap);
        sh->prio = isfinite(p) ? (int)-p : sh->max_prio;
        sh->len_gen = sh->gen + 1;
    }
    return sh->len;
}

int sched__shape_max_prio(const sched *s, sshape *sh)
{
    sched__shape_min_len(s, sh);
    return sh->prio;
}

int sched__shape_undeclined_prio(const sched *s, sshape *sh, int *prio)
{
    /* Turned down is for good: such entries are dropped like stale ones. */
    struct slen *h = sh->uheap;
    while (sh->nuheap && (!heap_valid(s, sh, &h[0]) || s->jobs[h[0].job].declined)) {
        h[0] = h[--sh->nuheap];
        heap_down(h, sh->nuheap, 0);
    }
    return sh->nuheap ? (*prio = (int)-h[0].len, 1) : 0;
}

static int heap_push(sched *s, const sshape *sh, struct slen **hp, size_t *np, size_t *cap, double key, uint32_t ji)
{
    struct slen *h = *hp;
    /* Stale entries deep in the heap are dropped when they outnumber the
     * queued jobs, so the heap stays O(queued jobs of the shape). */
    if (*np > 2 * sh->queued + 16) {
        size_t w = 0;
        for (size_t i = 0; i < *np; i++)
            if (heap_valid(s, sh, &h[i])) h[w++] = h[i];
        *np = w;
        for (size_t i = w / 2; i-- > 0;) heap_down(h, w, i);
    }
    SH_TRY(GROW(*hp, *cap, *np + 1));
    h = *hp;
    size_t i = (*np)++;
    h[i] = (struct slen){key, ji, s->jobs[ji].qgen};
    while (i && h[(i - 1) / 2].len > h[i].len) {
        struct slen x = h[i];
        h[i] = h[(i - 1) / 2], h[(i - 1) / 2] = x;
        i = (i - 1) / 2;
    }
    return 0;
}

int sched__queue_push(sched *s, uint32_t ji, double now)
{
    s->busy_ver++; /* queues change: cached head keys lapse */
    sjob *j = &s->jobs[ji];
    stenant *t = &s->tenants[j->tenant];
    if (t->holes) sched__queue_compact(s);
    SH_TRY(GROW(t->queue, t->capq, t->nq + 1));
    size_t pos = queue_pos(s, t, j);
    memmove(t->queue + pos + 1, t->queue + pos, (t->nq - pos) * sizeof *t->queue);
    t->queue[pos] = ji;
    t->nq++;
    sshape *sh = sched__shape(s, j->shape);
    if (!sh) return sh_err(SH_ENOMEM, "sched: out of memory");
    j->shape_slot = (uint32_t)(sh - s->shapes);
    double fastest = 1.0;
    for (int k = 0; k < j->ntypes; k++) fastest = k ? fmax(fastest, j->speed[k]) : j->speed[k];
    double len = j->est_s / (fastest > 0 ? fastest : 1.0);
    if (!sh->queued) SH_TRY(live_add(s, sh));
    if (!sh->queued++) {
        sh->min_est = j->est_s, sh->min_len = len, sh->max_prio = j->priority;
        sh->kind = j->kind, sh->nodes = j->nodes, sh->gpn = j->gpn, sh->ntypes = j->ntypes;
        memcpy(sh->types, j->types, sizeof sh->types);
    } else {
        if (j->est_s < sh->min_est) sh->min_est = j->est_s;
        if (len < sh->min_len) sh->min_len = len;
        if (j->priority > sh->max_prio) sh->max_prio = j->priority;
    }
    j->qgen++;
    sh->gen++;
    SH_TRY(heap_push(s, sh, &sh->heap, &sh->nheap, &sh->capheap, len, ji));
    SH_TRY(heap_push(s, sh, &sh->pheap, &sh->npheap, &sh->cappheap, -(double)j->priority, ji));
    if (j->kind == SCHED_GANG && !j->declined)
        SH_TRY(heap_push(s, sh, &sh->uheap, &sh->nuheap, &sh->capuheap, -(double)j->priority, ji));
    j->state = SCHED_QUEUED;
    j->queued_since = now;
    s->queued++;
    return 0;
}

static void shape_dec(sched *s, const sjob *j)
{
    sshape *sh = sched__shape(s, j->shape);
    if (sh) sh->gen++;
    if (sh && sh->queued && !--sh->queued) live_drop(s, sh);
}

void sched__queue_compact(sched *s)
{
    for (size_t ti = 0; ti < s->ntenants; ti++) {
        stenant *t = &s->tenants[ti];
        if (!t->holes) continue;
        size_t w = 0;
        for (size_t r = 0; r < t->nq; r++)
            if (t->queue[r] != NONE) t->queue[w++] = t->queue[r];
        t->nq = w, t->holes = 0;
    }
}

void sched__queue_remove(sched *s, uint32_t ji)
{
    s->busy_ver++;
    sjob *j = &s->jobs[ji];
    stenant *t = &s->tenants[j->tenant];
    /* A job started during a walk sits at its tenant's cursor: leave a hole
     * there rather than shift the whole queue once per start; the walk
     * compacts once at its end. */
    if (s->walking && t->cursor < t->nq && t->queue[t->cursor] == ji) {
        t->queue[t->cursor] = NONE;
        t->holes++;
        s->queued--;
        shape_dec(s, j);
        return;
    }
    if (t->holes) sched__queue_compact(s);
    size_t pos = queue_pos(s, t, j);
    if (pos >= t->nq || t->queue[pos] != ji) return;
    memmove(t->queue + pos, t->queue + pos + 1, (t->nq - pos - 1) * sizeof *t->queue);
    t->nq--;
    s->queued--;
    shape_dec(s, j);
}

static int check_spec(sched *s, const sched_job_spec *js)
{
    if (!js->id || !*js->id || strlen(js->id) >= SCHED_ID_MAX)
        return sh_err(SH_EINVAL, "job id must be 1..%d bytes", SCHED_ID_MAX - 1);
    if ((unsigned)js->kind > SCHED_FUNCTION)
        return sh_err(SH_EINVAL, "job %s: unknown kind %d", js->id, (int)js->kind);
    if (js->kind != SCHED_FUNCTION) {
        if (js->nodes < 1 || js->nodes > SCHED__MAX_GANG)
            return sh_err(SH_EINVAL, "job %s: nodes %d is outside 1..%d", js->id, js->nodes,
                          SCHED__MAX_GANG);
        if (js->gpus_per_node < 1 || js->gpus_per_node > MAXG)
            return sh_err(SH_EINVAL, "job %s: gpus_per_node %d is outside 1..%d", js->id,
                          js->gpus_per_node, MAXG);
    }
    if (js->kind == SCHED_ELASTIC && (js->max_replicas < js->nodes || js->max_replicas > SCHED__MAX_GANG))
        return sh_err(SH_EINVAL, "job %s: max replicas %d must be >= min replicas %d", js->id,
                      js->max_replicas, js->nodes);
    if (js->n_types < 0 || js->n_types > SCHED_MAX_TYPES)
        return sh_err(SH_EINVAL, "job %s: %d GPU types (at most %d)", js->id, js->n_types,
                      SCHED_MAX_TYPES);
    if (!(js->est_s >= 0) || js->replace_wait_s < 0 || js->speed[0] < 0)
        return sh_err(SH_EINVAL, "job %s: estimate and waits must be >= 0", js->id);
    if (sched__map_get(&s->job_map, js->id) != NONE)
        return sh_err(SH_EEXIST, "job %s already exists", js->id);
    return 0;
}

/* Records the job as rejected and returns SH_ERANGE with `why`. */
static int reject(sched *s, uint32_t ji, const char *why)
{
    sjob *j = &s->jobs[ji];
    j->state = SCHED_REJECTED;
    j->reason = strdup(why);
    s->st.rejected++;
    return sh_err(SH_ERANGE, "job %s rejected: %s", j->id, why);
}

int sched_job_submit(sched *s, const sched_job_spec *js, double now)
{
    SH_TRY(check_spec(s, js));
    uint32_t ti = tenant_of(s, js->tenant && *js->tenant ? js->tenant : "default");
    if (ti == NONE) return SH_ENOMEM;
    /* A forgotten job's slot is reused first, so that the job table stays
     * as large as the most jobs known at once, not as all jobs ever. */
    int reuse = s->nfree > 0;
    uint32_t ji;
    if (reuse) ji = s->freejobs[s->nfree - 1];
    else {
        SH_TRY(GROW(s->jobs, s->capjobs, s->njobs + 1));
        ji = (uint32_t)s->njobs;
    }
    sjob *j = &s->jobs[ji];
    memset(j, 0, sizeof *j);
    SH_TRY(sched__map_put(&s->job_map, js->id, ji, &j->id));
    if (reuse) s->nfree--;
    else s->njobs++;
    j->tenant = ti, j->kind = js->kind;
    j->nodes = js->kind == SCHED_FUNCTION ? 1 : js->nodes;
    j->gpn = js->kind == SCHED_FUNCTION ? 1 : js->gpus_per_node;
    j->maxr = js->kind == SCHED_ELASTIC ? js->max_replicas : j->nodes;
    j->est_s = js->est_s > 0 ? js->est_s : s->cfg.default_est_s;
    j->priority = js->priority, j->on_fail = js->on_fail, j->replace_wait_s = js->replace_wait_s;
    j->submit = now, j->first_start = j->start = j->end = -1;
    if (now < s->last_submit) s->submit_unsorted = 1;
    s->last_submit = now;
    j->blocked_since = -1, j->resv_promise = -1, j->pool = NONE;
    j->order = ++s->seq;
    char why[256];
    /* Types no node or quota has are dropped; a job left with none of its
     * types can never run. */
    for (int i = 0; i < js->n_types; i++) {
        uint32_t t = js->gpu_types[i] ? sched__intern(s, js->gpu_types[i], 0) : NONE;
        if (t == NONE) continue;
        j->types[j->ntypes] = t;
        j->speed[j->ntypes++] = js->speed[i] > 0 ? js->speed[i] : 1.0;
    }
    if (js->n_types && !j->ntypes) {
        snprintf(why, sizeof why, "unknown GPU type%s \"%s\"%s (no node or quota has %s)",
                 js->n_types > 1 ? "s" : "", js->gpu_types[0] ? js->gpu_types[0] : "",
                 js->n_types > 1 ? ", ..." : "", js->n_types > 1 ? "them" : "it");
        return reject(s, ji, why);
    }
    if (sched__never_fits(s, j, why, sizeof why)) return reject(s, ji, why);
    struct { int kind, nodes, gpn, nt; uint32_t t[SCHED_MAX_TYPES]; } key;
    memset(&key, 0, sizeof key);
    key.kind = j->kind, key.nodes = j->nodes, key.gpn = j->gpn, key.nt = j->ntypes;
    memcpy(key.t, j->types, sizeof key.t);
    j->shape = sh_hash64_of(&key, sizeof key) | 1;
    if (j->kind == SCHED_ELASTIC) {
        SH_TRY(sched__grow((void **)&s->elastic, &s->capelastic, s->nelastic + 1, sizeof *s->elastic));
        s->elastic[s->nelastic++] = ji;
    }
    SH_TRY(sched__queue_push(s, ji, now));
    return 0;
}

static int find_job(const sched *s, const char *id, uint32_t *out)
{
    uint32_t ji = sched__map_get(&s->job_map, id);
    if (ji == NONE) return sh_err(SH_ENOENT, "job %s is not known", id ? id : "(null)");
    *out = ji;
    return 0;
}

static int stop_job(sched *s, const char *id, double now, sched_job_state to)
{
    uint32_t ji = NONE;
    SH_TRY(find_job(s, id, &ji));
    sjob *j = &s->jobs[ji];
    if (j->state >= SCHED_DONE)
        return sh_err(SH_EINVAL, "job %s has already ended", id);
    if (j->state == SCHED_QUEUED) sched__queue_remove(s, ji);
    else if (j->state == SCHED_HOLDING) sched__queue_remove(s, ji), sched__release_all(s, ji, now);
    else sched__release_all(s, ji, now), s->running--;
    j->state = to;
    j->end = now;
    return 0;
}

int sched_job_cancel(sched *s, const char *id, double now) { return stop_job(s, id, now, SCHED_CANCELLED); }

int sched_job_finish(sched *s, const char *id, double now)
{
    uint32_t ji = NONE;
    SH_TRY(find_job(s, id, &ji));
    if (s->jobs[ji].state != SCHED_RUNNING && s->jobs[ji].state != SCHED_REPLACING)
        return sh_err(SH_EINVAL, "job %s is not running, it cannot finish", id);
    return stop_job(s, id, now, SCHED_DONE);
}

/* ---- Forgetting ended jobs ------------------------------------------------ */

static void add_cost(double **v, size_t *n, uint32_t type, double c);

/* Drops every reference the cycle bookkeeping keeps to job ji: its pending
 * decisions (the caller forgot the job, so their news is moot), its entry
 * in the deadline and elastic lists, and the reservation records of the
 * last cycle (kept for sched_check, which skips a NONE job). */
static void drop_refs(sched *s, uint32_t ji)
{
    size_t w = 0;
    for (size_t i = 0; i < s->npend; i++) {
        if (s->pend[i].job == ji) free(s->pend[i].places);
        else s->pend[w++] = s->pend[i];
    }
    s->npend = w;
    w = 0;
    for (size_t i = 0; i < s->nwaiting; i++)
        if (s->waiting[i] != ji) s->waiting[w++] = s->waiting[i];
    s->nwaiting = w;
    if (s->jobs[ji].kind == SCHED_ELASTIC) {
        /* Order kept: the growth pass visits elastic jobs in submit order. */
        w = 0;
        for (size_t i = 0; i < s->nelastic; i++)
            if (s->elastic[i] != ji) s->elastic[w++] = s->elastic[i];
        s->nelastic = w;
    }
    for (size_t i = 0; i < s->nresv; i++)
        if (s->resv[i].job == ji) s->resv[i].job = NONE;
}

int sched_job_forget(sched *s, const char *id)
{
    uint32_t ji = NONE;
    SH_TRY(find_job(s, id, &ji));
    sjob *j = &s->jobs[ji];
    if (j->state < SCHED_DONE)
        return sh_err(SH_EINVAL, "job %s has not ended: only a finished, cancelled or rejected job "
                      "can be forgotten (cancel it first)", id);
    SH_TRY(GROW(s->freejobs, s->capfree, s->nfree + 1));
    /* Its final bill stays in the totals for everyone; its tenant's totals
     * already hold it (sched__bill charges job and tenant together). */
    for (size_t k = 0; k < j->ncost; k++)
        add_cost(&s->forgot_cost_t, &s->nforgot_cost, (uint32_t)k, j->cost_t[k]);
    drop_refs(s, ji);
    free(j->places), free(j->cost_t), free(j->reason), free(j->jp);
    sched__map_del(&s->job_map, j->id); /* frees the id j->id points to */
    memset(j, 0, sizeof *j);
    j->id = NULL, j->state = SCHED_DONE, j->pool = NONE;
    s->freejobs[s->nfree++] = ji;
    s->st.forgotten++;
    return 0;
}

/* ---- Billing: per second, each allocation's seconds rounded up ----------- */

static void add_cost(double **v, size_t *n, uint32_t type, double c)
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
    if (!s->cfg.bill_journal || sched__grow((void **)&s->bills, &s->capbills, s->nbills + 1, sizeof *s->bills))
        return;
    sched_bill b = bill_of(s, j, p, c, now);
    char *job = strdup(b.job), *node = strdup(b.node);
    if (!job || !node) {
        free(job), free(node);
        return;
    }
    b.job = job, b.node = node;
    s->bills[s->nbills++] = b;
}

void sched__bill(sched *s, sjob *j, const splace *p, double now)
{
    if (j->state == SCHED_HOLDING) return; /* billed to nobody: the waste firstfit causes */
    double c = sched__place_cost(s, p, now);
    uint32_t type = s->pools[s->nodes[p->node].pool].type;
    add_cost(&j->cost_t, &j->ncost, type, c);
    stenant *t = &s->tenants[j->tenant];
    add_cost(&t->cost_t, &t->ncost, type, c);
    journal(s, j, p, c, now);
}

size_t sched_bills(const sched *s, const sched_bill **out)
{
    *out = s->bills;
    return s->nbills;
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
    if (n > s->nbills) n = s->nbills;
    for (size_t i = s->nbills - n; i < s->nbills; i++) free((char *)s->bills[i].job), free((char *)s->bills[i].node);
    s->nbills -= n;
}

void sched_bills_done(sched *s, size_t n)
{
    if (n > s->nbills) n = s->nbills;
    for (size_t i = 0; i < n; i++) free((char *)s->bills[i].job), free((char *)s->bills[i].node);
    if (n && n < s->nbills) memmove(s->bills, s->bills + n, (s->nbills - n) * sizeof *s->bills);
    s->nbills -= n;
}

/* c plus what the places job j holds now have cost so far. */
static double open_cost(const sched *s, const sjob *j, uint32_t type, double now, double c)
{
    if (j->state == SCHED_RUNNING || j->state == SCHED_REPLACING)
        for (int k = 0; k < j->nplaces; k++)
            if (type == NONE || s->pools[s->nodes[j->places[k].node].pool].type == type)
                c += sched__place_cost(s, &j->places[k], now);
    return c;
}

static double job_cost(const sched *s, const sjob *j, uint32_t type, double now)
{
    double c = 0;
    for (size_t i = 0; i < j->ncost; i++)
        if (type == NONE || type == i) c += j->cost_t[i];
    return open_cost(s, j, type, now, c);
}

double sched_cost_job(const sched *s, const char *job, const char *gpu_type, double now)
{
    uint32_t type = gpu_type ? sched__map_get(&s->names, gpu_type) : NONE;
    if (gpu_type && type == NONE) return 0;
    double c = 0;
    if (!job) /* everyone: forgotten jobs too */
        for (size_t i = 0; i < s->nforgot_cost; i++)
            if (type == NONE || type == i) c += s->forgot_cost_t[i];
    for (size_t i = 0; i < s->njobs; i++)
        if (s->jobs[i].id && (!job || !strcmp(job, s->jobs[i].id))) {
            c += job_cost(s, &s->jobs[i], type, now);
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
    return open_cost(s, j, type, now, 0);
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

/* ---- Queries -------------------------------------------------------------- */

int64_t sched_job_ix(const sched *s, const char *id)
{
    uint32_t ji = sched__map_get(&s->job_map, id);
    return ji == NONE ? -1 : (int64_t)ji;
}

size_t sched_job_count(const sched *s) { return s->njobs; }

static int info_ix(const sched *s, uint32_t ix, double now, sched_job_info *o, int est)
{
    if (ix >= s->njobs || !s->jobs[ix].id) return sh_err(SH_ENOENT, "job handle %u is not known", ix);
    const sjob *j = &s->jobs[ix];
    memset(o, 0, sizeof *o);
    o->id = j->id, o->tenant = s->tenants[j->tenant].id, o->kind = j->kind, o->state = j->state;
    o->priority = j->priority, o->replicas = j->nplaces;
    for (int k = 0; k < j->nplaces; k++) o->gpus += j->places[k].gpus;
    if (j->pool != NONE && j->kind == SCHED_GANG) {
        o->gpu_type = s->name[s->pools[j->pool].type];
        o->speed = sched__job_speed(s, j, s->pools[j->pool].type);
    }
    o->submit_s = j->submit, o->first_start_s = j->first_start, o->start_s = j->start;
    o->end_s = j->end, o->wait_s = j->wait_acc;
    o->expected_end_s = j->state == SCHED_RUNNING ? sched__est_end(s, j) : -1;
    o->restarts = j->restarts, o->preemptions = j->preemptions, o->backfilled = j->backfilled;
    o->cost = job_cost(s, j, NONE, now);
    o->cost_open = open_cost(s, j, NONE, now, 0);
    o->reason = j->reason;
    o->est_start_s = -1;
    if (j->state == SCHED_QUEUED || j->state == SCHED_HOLDING) sched__pending((sched *)s, ix, now, o, est);
    return 0;
}

int sched_job_info_ix(const sched *s, uint32_t ix, double now, sched_job_info *o)
{
    return info_ix(s, ix, now, o, 1);
}

int sched_job_reason_ix(const sched *s, uint32_t ix, double now, sched_job_info *o)
{
    return info_ix(s, ix, now, o, 0);
}

int sched_job_info_get(const sched *s, const char *id, double now, sched_job_info *out)
{
    uint32_t ji = NONE;
    SH_TRY(find_job(s, id, &ji));
    return sched_job_info_ix(s, ji, now, out);
}

size_t sched_job_alloc(const sched *s, const char *id, sched_place *out, size_t cap)
{
    uint32_t ji = sched__map_get(&s->job_map, id);
    if (ji == NONE) return 0;
    const sjob *j = &s->jobs[ji];
    for (int k = 0; k < j->nplaces && (size_t)k < cap; k++)
        out[k] = (sched_place){s->nodes[j->places[k].node].id, j->places[k].node, j->places[k].gpus,
                               j->places[k].gmask, j->places[k].since};
    return (size_t)j->nplaces;
}

void sched_stats_get(const sched *s, sched_stats *o)
{
    *o = s->st;
    o->nodes_up = s->nodes_up, o->gpus_up = s->gpus_up, o->gpus_busy = s->gpus_busy;
    o->queued = s->queued, o->running = s->running;
    o->resv_late = s->resv_late;
}
