/* The tenant queues and the index of queued jobs by shape (the model's
 * waiting work). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"

#define GROW(arr, cap, need) sched__grow((void **)&(arr), &(cap), (need), sizeof *(arr))

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
