/* Virtual-time replay: feeds a trace and a fleet to the scheduling core as
 * events (submissions, completions, node failures and repairs, provisioned
 * nodes), carries out its decisions, and measures what users would see. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shoal/common.h"
#include "shoal/sim.h"

const char *const sim_bucket_names[SIM_BUCKETS] = {"1", "2-4", "5-16", "17-64", "65+"};

enum { EV_FINISH, EV_FAIL, EV_RECOVER, EV_ADD, EV_WAKE };

typedef struct ev {
    double t;
    uint64_t seq;
    int type;
    uint32_t a, gen;
} ev;

typedef struct rjob {
    double remaining, rate, last;
    uint32_t gen;
    int gpus;      /* GPUs of running work now (for utilisation) */
    int hit;       /* a failure touched it */
    int started;
    double first_start; /* virtual time of its first START, or -1 */
    double est;         /* its start estimate after its first cycle; NAN: none taken */
    double end;         /* virtual time it finished, or 0 */
    int preempted, shrunk; /* PREEMPTs, and SHRINKs by preemption, it took */
} rjob;

/* --waits-out: what each job waited under, from its submission to its first
 * start.  The reason read after a cycle holds until the next cycle (or the
 * start). */
#define SIM_WAITS 7 /* sched_wait values */
typedef struct rwait {
    double s[SIM_WAITS]; /* seconds queued under each reason */
    double since;        /* when `last` was read; < 0: never */
    int last;            /* sched_wait at the last read */
    uint32_t pool_node;  /* scheduler node handle of its first start's first pod; UINT32_MAX: none */
    uint32_t six;        /* its scheduler handle (stable while it waits: only ended jobs are forgotten) */
    char text[160];      /* the last reason's text */
} rwait;

typedef struct run {
    const sim_trace *t;
    const sim_opts *o;
    sched *s;
    sched_decisions d;
    ev *heap;
    size_t nheap, capheap;
    uint64_t seq;
    rjob *jobs;       /* by trace index */
    /* Scheduler job handle -> trace index.  Handles are reused after
     * sched_job_forget, so this is as large as the most jobs alive at once. */
    uint32_t *six2t;
    size_t nsix;
    sim_node *nodes;  /* by scheduler node handle (fleet, then provisioned) */
    sim_node *prov;   /* nodes asked of the provider, by EV_ADD index */
    size_t nprov, capprov;
    size_t nnodes, capnodes;
    int running_gpus;
    double wake_at;
    uint64_t rng;
    size_t done;
    double *wait, *jct;
    size_t nwait;
    sim_report *r;
    rwait *waits;     /* --waits-out: by trace index, else NULL */
    uint32_t *pend;   /* trace indices submitted and never started (with waits) */
    size_t npend;
} run;

/* ---- Event heap (min by time, then insertion order) ----------------------- */

static int ev_less(const ev *a, const ev *b) { return a->t < b->t || (a->t == b->t && a->seq < b->seq); }

static int push_ev(run *R, double t, int type, uint32_t a, uint32_t gen)
{
    if (R->nheap == R->capheap) {
        size_t c = R->capheap ? R->capheap * 2 : 1024;
        ev *h = realloc(R->heap, c * sizeof *h);
        if (!h) return sh_err(SH_ENOMEM, "sim: out of memory");
        R->heap = h, R->capheap = c;
    }
    size_t i = R->nheap++;
    R->heap[i] = (ev){t, R->seq++, type, a, gen};
    while (i && ev_less(&R->heap[i], &R->heap[(i - 1) / 2])) {
        ev x = R->heap[i];
        R->heap[i] = R->heap[(i - 1) / 2], R->heap[(i - 1) / 2] = x;
        i = (i - 1) / 2;
    }
    return 0;
}

static ev pop_ev(run *R)
{
    ev top = R->heap[0];
    R->heap[0] = R->heap[--R->nheap];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < R->nheap && ev_less(&R->heap[l], &R->heap[m])) m = l;
        if (r < R->nheap && ev_less(&R->heap[r], &R->heap[m])) m = r;
        if (m == i) break;
        ev x = R->heap[i];
        R->heap[i] = R->heap[m], R->heap[m] = x;
        i = m;
    }
    return top;
}

static double rnd(run *R)
{
    uint64_t z = (R->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return ((double)((z ^ (z >> 31)) >> 11) + 0.5) / 9007199254740992.0;
}

/* ---- Nodes -------------------------------------------------------------------- */

static int add_node(run *R, const sim_node *n, double now)
{
    if (R->nnodes == R->capnodes) {
        size_t c = R->capnodes ? R->capnodes * 2 : 256;
        sim_node *v = realloc(R->nodes, c * sizeof *v);
        if (!v) return sh_err(SH_ENOMEM, "sim: out of memory");
        R->nodes = v, R->capnodes = c;
    }
    sched_node_spec sp = {n->id, n->zone, n->fabric, n->gpu_type, n->gpus, n->price_per_gpu_hour};
    SH_TRY(sched_node_add(R->s, &sp, now));
    R->nodes[R->nnodes++] = *n;
    return 0;
}

static int next_failure(run *R, double now)
{
    if (!(R->o->mtbf_hours > 0) || !R->nnodes) return 0;
    double rate = (double)R->nnodes / (R->o->mtbf_hours * 3600.0);
    uint32_t victim = (uint32_t)(rnd(R) * (double)R->nnodes);
    return push_ev(R, now - log(rnd(R)) / rate, EV_FAIL, victim, 0);
}

/* ---- Job progress --------------------------------------------------------------- */

static double speed_on(const sim_job *j, const sim_node *n)
{
    if (!j->n_types) return 1.0;
    for (int k = 0; k < j->n_types; k++)
        if (!strcmp(j->gpu_types[k], n->gpu_type)) return j->speed[k];
    return 1.0;
}

/* Brings a job's remaining work up to now, then recomputes its rate from
 * its current placement and schedules its completion. */
static int replan(run *R, uint32_t six, double now)
{
    uint32_t ti = R->six2t[six];
    rjob *rj = &R->jobs[ti];
    const sim_job *j = &R->t->jobs[ti];
    rj->remaining -= rj->rate * (now - rj->last);
    if (rj->remaining < 0) rj->remaining = 0;
    rj->last = now;
    rj->gen++;
    sched_job_info info;
    SH_TRY(sched_job_info_ix(R->s, six, now, &info));
    R->running_gpus -= rj->gpus;
    rj->gpus = 0, rj->rate = 0;
    if (info.state != SCHED_RUNNING) return 0;
    sched_place pl[64];
    size_t n = sched_job_alloc(R->s, info.id, pl, 64);
    double sum = 0;
    for (size_t k = 0; k < n && k < 64; k++) sum += speed_on(j, &R->nodes[pl[k].node_ix]);
    if (j->kind == SCHED_GANG) rj->rate = n ? speed_on(j, &R->nodes[pl[0].node_ix]) : 0;
    else if (j->kind == SCHED_ELASTIC) rj->rate = sum / j->nodes;
    else rj->rate = sum;
    rj->gpus = info.gpus;
    R->running_gpus += rj->gpus;
    if (rj->rate > 0) SH_TRY(push_ev(R, now + rj->remaining / rj->rate, EV_FINISH, ti, rj->gen));
    return 0;
}

static int apply(run *R, const sched_decision *x, double now)
{
    if (x->kind == SCHED_D_SCALE_UP) {
        const sched_quota *q = NULL;
        for (size_t i = 0; i < R->o->cfg.n_quotas; i++) {
            const sched_quota *c = &R->o->cfg.quotas[i];
            if (!strcmp(c->zone, x->zone) && !strcmp(c->fabric, x->fabric) && !strcmp(c->gpu_type, x->gpu_type))
                q = c;
        }
        if (!q) return sh_err(SH_EINTERNAL, "sim: scale-up for an unknown quota %s/%s/%s", x->zone, x->fabric, x->gpu_type);
        for (int k = 0; k < x->n; k++) {
            /* Described now, added to the scheduler when the provider is ready. */
            if (R->nprov == R->capprov) {
                size_t c = R->capprov ? R->capprov * 2 : 64;
                sim_node *v = realloc(R->prov, c * sizeof *v);
                if (!v) return sh_err(SH_ENOMEM, "sim: out of memory");
                R->prov = v, R->capprov = c;
            }
            sim_node *n = &R->prov[R->nprov];
            memset(n, 0, sizeof *n);
            snprintf(n->id, SIM_NAME, "auto-%zu", R->nprov);
            snprintf(n->zone, SIM_NAME, "%s", q->zone);
            snprintf(n->fabric, SIM_NAME, "%s", q->fabric);
            snprintf(n->gpu_type, SIM_NAME, "%s", q->gpu_type);
            n->gpus = q->gpus, n->price_per_gpu_hour = q->price_per_gpu_hour;
            SH_TRY(push_ev(R, x->ready_s, EV_ADD, (uint32_t)R->nprov++, 0));
        }
        R->r->scale_ups++;
        return 0;
    }
    if (x->kind == SCHED_D_SCALE_DOWN) {
        R->r->scale_downs++;
        return sched_node_remove(R->s, x->node, now);
    }
    if (x->job_ix >= R->nsix) return sh_err(SH_EINTERNAL, "sim: decision for unknown job %u", x->job_ix);
    uint32_t ti = R->six2t[x->job_ix];
    rjob *rj = &R->jobs[ti];
    switch (x->kind) {
    case SCHED_D_START:
        if (!rj->started && R->waits) {
            rwait *w = &R->waits[ti];
            if (w->since >= 0) w->s[w->last] += now - w->since;
            if (x->count) w->pool_node = R->d.places[x->first].node_ix;
        }
        if (!rj->started) rj->remaining = R->t->jobs[ti].duration_s, rj->started = 1, rj->first_start = now;
        rj->rate = 0, rj->last = now;
        return replan(R, x->job_ix, now);
    case SCHED_D_PREEMPT:
        rj->preempted++;
        SH_TRY(replan(R, x->job_ix, now));
        if (R->t->jobs[ti].kind == SCHED_FUNCTION) rj->remaining = R->t->jobs[ti].duration_s;
        return 0;
    case SCHED_D_REQUEUE:
        rj->hit = 1;
        SH_TRY(replan(R, x->job_ix, now));
        rj->remaining += R->o->restart_cost_s;
        return 0;
    case SCHED_D_SHRINK:
        if (x->node) rj->hit = 1;
        else rj->shrunk++;
        return replan(R, x->job_ix, now);
    case SCHED_D_GROW:
    case SCHED_D_REPLACE: return replan(R, x->job_ix, now);
    default: return 0; /* HOLD, RELEASE: firstfit bookkeeping only */
    }
}

/* ---- The loop ------------------------------------------------------------------ */

static int submit(run *R, size_t ti, double now)
{
    const sim_job *j = &R->t->jobs[ti];
    sched_job_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.id = j->id, sp.tenant = j->tenant, sp.kind = j->kind, sp.nodes = j->nodes;
    sp.max_replicas = j->max_replicas, sp.gpus_per_node = j->gpus_per_node;
    sp.n_types = j->n_types;
    for (int k = 0; k < j->n_types; k++) sp.gpu_types[k] = j->gpu_types[k], sp.speed[k] = j->speed[k];
    sp.est_s = j->duration_s, sp.priority = j->priority;
    sp.on_fail = R->o->replace_wait_s > 0 ? SCHED_REPLACE : SCHED_REQUEUE;
    sp.replace_wait_s = R->o->replace_wait_s;
    int rc = sched_job_submit(R->s, &sp, now);
    int64_t six = sched_job_ix(R->s, j->id);
    if (six >= 0) {
        R->six2t[six] = (uint32_t)ti;
        if ((size_t)six >= R->nsix) R->nsix = (size_t)six + 1;
    }
    if (!rc && R->waits) R->pend[R->npend++] = (uint32_t)ti, R->waits[ti].six = (uint32_t)six;
    if (rc == SH_ERANGE) {
        if (!R->r->jobs_rejected++) snprintf(R->r->first_rejection, sizeof R->r->first_rejection, "%s", sh_errmsg());
        R->done++;
        /* The replay keeps what it reports; the scheduler need not. */
        return sched_job_forget(R->s, j->id);
    }
    return rc;
}

static int finish(run *R, uint32_t ti, double now)
{
    rjob *rj = &R->jobs[ti];
    const sim_job *j = &R->t->jobs[ti];
    SH_TRY(sched_job_finish(R->s, j->id, now));
    R->running_gpus -= rj->gpus;
    rj->gpus = 0;
    rj->end = now;
    sched_job_info info;
    SH_TRY(sched_job_info_get(R->s, j->id, now, &info));
    R->wait[R->nwait] = info.first_start_s - j->submit_s;
    R->jct[R->nwait++] = now - j->submit_s;
    R->r->jobs_completed++;
    R->r->restarts += (uint64_t)info.restarts;
    if (rj->hit) R->r->failures_survived++;
    R->done++;
    /* Everything the report needs is recorded above or in rj; forgetting
     * the job keeps the scheduler's memory bounded by the live jobs over a
     * long replay (its bill stays in the cost totals). */
    return sched_job_forget(R->s, j->id);
}

static int handle(run *R, const ev *e)
{
    switch (e->type) {
    case EV_FINISH:
        if (e->gen != R->jobs[e->a].gen) return 0; /* superseded by a replan */
        return finish(R, e->a, e->t);
    case EV_FAIL: {
        if (R->done >= R->t->n) return 0;
        sched_node_info ni;
        if (sched_node_info_get(R->s, R->nodes[e->a].id, &ni) == 0 && ni.state == SCHED_NODE_UP) {
            SH_TRY(sched_node_fail(R->s, R->nodes[e->a].id, e->t));
            R->r->failures++;
            SH_TRY(push_ev(R, e->t + R->o->repair_s, EV_RECOVER, e->a, 0));
        }
        return next_failure(R, e->t);
    }
    case EV_RECOVER: {
        sched_node_info ni;
        if (sched_node_info_get(R->s, R->nodes[e->a].id, &ni) == 0 && ni.state == SCHED_NODE_FAILED)
            return sched_node_recover(R->s, R->nodes[e->a].id, e->t);
        return 0;
    }
    case EV_ADD: return add_node(R, &R->prov[e->a], e->t);
    default: return 0;
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double p)
{
    if (!n) return NAN;
    size_t i = (size_t)ceil(p * (double)n) - 1;
    return v[i >= n ? n - 1 : i];
}

static int bucket_of(int nodes)
{
    return nodes <= 1 ? 0 : nodes <= 4 ? 1 : nodes <= 16 ? 2 : nodes <= 64 ? 3 : 4;
}

static void summarise(run *R, double t0, double t_end)
{
    sim_report *r = R->r;
    size_t n = R->nwait;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += R->jct[i];
    r->jct_mean_s = n ? sum / (double)n : NAN;
    sum = 0;
    for (size_t i = 0; i < n; i++) sum += R->wait[i];
    r->wait_mean_s = n ? sum / (double)n : NAN;
    /* Waits by gang size, over every job that started (finished jobs are
     * forgotten by the scheduler: the replay's own record is used). */
    double *bw[SIM_BUCKETS], *big = malloc((R->t->n + 1) * sizeof(double));
    size_t nb[SIM_BUCKETS] = {0}, nbig = 0;
    for (int b = 0; b < SIM_BUCKETS; b++) bw[b] = malloc((R->t->n + 1) * sizeof(double));
    for (size_t ti = 0; ti < R->t->n; ti++) {
        if (!R->jobs[ti].started) continue;
        const sim_job *j = &R->t->jobs[ti];
        double w = R->jobs[ti].first_start - j->submit_s;
        int b = bucket_of(j->nodes);
        if (bw[b]) bw[b][nb[b]++] = w;
        if (big && j->nodes >= 16) big[nbig++] = w;
    }
    if (big) qsort(big, nbig, sizeof(double), cmp_d);
    r->big_jobs = nbig;
    r->wait_p50_s_big = big ? pct(big, nbig, 0.5) : NAN;
    r->wait_p99_s_big = big ? pct(big, nbig, 0.99) : NAN;
    free(big);
    for (int b = 0; b < SIM_BUCKETS; b++) {
        if (bw[b]) qsort(bw[b], nb[b], sizeof(double), cmp_d);
        r->bucket_jobs[b] = nb[b];
        r->wait_p50_s_by_nodes[b] = bw[b] ? pct(bw[b], nb[b], 0.50) : NAN;
        r->wait_p99_s_by_nodes[b] = bw[b] ? pct(bw[b], nb[b], 0.99) : NAN;
        free(bw[b]);
    }
    qsort(R->jct, n, sizeof(double), cmp_d);
    qsort(R->wait, n, sizeof(double), cmp_d);
    r->jct_p50_s = pct(R->jct, n, 0.5), r->jct_p99_s = pct(R->jct, n, 0.99);
    r->wait_p50_s = pct(R->wait, n, 0.5), r->wait_p99_s = pct(R->wait, n, 0.99);
    r->makespan_s = t_end - t0;
    r->cost = sched_cost_tenant(R->s, NULL, NULL, t_end);
    for (size_t i = 0; i < R->nnodes; i++) {
        size_t k = 0;
        while (k < r->ntypes && strcmp(r->type[k], R->nodes[i].gpu_type)) k++;
        if (k == r->ntypes && k < SIM_KEYS) {
            memcpy(r->type[k], R->nodes[i].gpu_type, SIM_NAME);
            r->cost_by_type[k] = sched_cost_tenant(R->s, NULL, r->type[k], t_end);
            r->ntypes++;
        }
    }
    for (size_t i = 0; i < R->t->n; i++) {
        size_t k = 0;
        while (k < r->ntenants && strcmp(r->tenant[k], R->t->jobs[i].tenant)) k++;
        if (k == r->ntenants && k < SIM_KEYS) {
            memcpy(r->tenant[k], R->t->jobs[i].tenant, SIM_NAME);
            r->cost_by_tenant[k] = sched_cost_tenant(R->s, r->tenant[k], NULL, t_end);
            r->ntenants++;
        }
    }
    sched_stats st;
    sched_stats_get(R->s, &st);
    r->decisions = st.decisions;
    r->decisions_per_s = r->sched_cpu_s > 0 ? (double)st.decisions / r->sched_cpu_s : 0;
    r->preemptions = st.preemptions, r->preempt_declined = st.preempt_declined, r->requeues = st.requeues, r->replaces = st.replaces;
    r->partial_gangs = st.partial_gangs, r->hold_timeouts = st.hold_timeouts;
    r->held_gpu_hours = st.held_gpu_s / 3600.0;
    r->resv_late = st.resv_late;
    r->sched = st;
    r->sched_job_slots = sched_job_count(R->s);
    r->jobs_unfinished = r->jobs_total - r->jobs_completed - r->jobs_rejected;
}

/* CPU seconds of this thread: decisions per second is a figure of one
 * core, and on a shared machine wall time also counts other programs. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t str_hash(const char *v) { return v ? sh_hash64_of(v, strlen(v)) : 0; }

/* Folds the decisions of the cycle at `now` into the report's hash. */
static void hash_decisions(run *R, double now)
{
    uint64_t h = R->r->decisions_hash;
    for (size_t i = 0; i < R->d.n; i++) {
        const sched_decision *x = &R->d.v[i];
        struct { uint64_t h; double now, ready; int64_t kind, n, count; uint64_t job, node, zone, fabric, type; } k;
        memset(&k, 0, sizeof k);
        k.h = h, k.now = now, k.ready = x->ready_s, k.kind = x->kind, k.n = x->n, k.count = (int64_t)x->count;
        k.job = str_hash(x->job), k.node = str_hash(x->node);
        k.zone = str_hash(x->zone), k.fabric = str_hash(x->fabric), k.type = str_hash(x->gpu_type);
        h = sh_hash64_of(&k, sizeof k);
        for (size_t p = x->first; p < x->first + x->count; p++) {
            const sched_place *pl = &R->d.places[p];
            struct { uint64_t h, node, mask; int64_t gpus; } q = {h, str_hash(pl->node), pl->gpu_mask, pl->gpus};
            h = sh_hash64_of(&q, sizeof q);
        }
    }
    R->r->decisions_hash = h;
}

/* One batch: every event at time `now`, then one scheduling cycle. */
static int cycle(run *R, double now)
{
    double c0 = cpu_now();
    int n = sched_step(R->s, now, &R->d);
    R->r->sched_cpu_raw_s += cpu_now() - c0;
    R->r->sched_steps++;
    if (n < 0) return n;
    hash_decisions(R, now);
    for (size_t i = 0; i < R->d.n; i++) SH_TRY(apply(R, &R->d.v[i], now));
    if (R->o->check) {
        int rc = sched_check(R->s, now);
        if (rc) return sh_err_wrap(rc, "sim: invariant broken at t=%.3f s", now);
    }
    double w = sched_next_wakeup(R->s);
    if (isfinite(w) && w > now && w != R->wake_at) {
        R->wake_at = w;
        SH_TRY(push_ev(R, w, EV_WAKE, 0, 0));
    }
    return n;
}

/* The CPU time between two back-to-back reads of the clock (the median of
 * 2,001 tries): what each step's window counts besides the step. */
static double clock_window(void)
{
    enum { N = 2001 };
    double v[N];
    for (int i = 0; i < N; i++) {
        double a = cpu_now();
        v[i] = cpu_now() - a;
    }
    qsort(v, N, sizeof *v, cmp_d);
    return v[N / 2];
}

/* --waits-out: after a cycle, each job still waiting for its first start
 * says why (the core's reason), which holds until the next cycle. */
static int read_waits(run *R, double now)
{
    size_t k = 0;
    for (size_t i = 0; i < R->npend; i++) {
        uint32_t ti = R->pend[i];
        if (R->jobs[ti].started) continue;
        rwait *w = &R->waits[ti];
        sched_job_info in;
        SH_TRY(sched_job_reason_ix(R->s, w->six, now, &in)); /* the reason only: no estimate */
        if (w->since >= 0) w->s[w->last] += now - w->since;
        w->since = now;
        /* Not queued (firstfit holding part of a gang): no reason, "other". */
        w->last = in.state == SCHED_QUEUED && (unsigned)in.wait < SIM_WAITS ? (int)in.wait : SCHED_WAIT_NONE;
        if (in.state == SCHED_QUEUED) {
            size_t n = strnlen(in.wait_text, sizeof w->text - 1);
            memcpy(w->text, in.wait_text, n), w->text[n] = 0;
        }
        R->pend[k++] = ti;
    }
    R->npend = k;
    return 0;
}

/* Jobs submitted at `now` that the cycle left queued get the core's start
 * estimate, to be checked against their actual start. */
static int take_estimates(run *R, size_t from, size_t to, double now)
{
    for (size_t ti = from; ti < to; ti++) {
        int64_t six = sched_job_ix(R->s, R->t->jobs[ti].id);
        if (six < 0) continue; /* rejected and forgotten */
        sched_job_info in;
        SH_TRY(sched_job_info_ix(R->s, (uint32_t)six, now, &in));
        if (in.state == SCHED_QUEUED) R->jobs[ti].est = in.est_start_s;
    }
    return 0;
}

static void summarise_estimates(run *R)
{
    sim_report *r = R->r;
    double *abs_e = malloc((R->t->n + 1) * sizeof *abs_e), sum = 0, sum_abs = 0;
    size_t n = 0;
    for (size_t ti = 0; ti < R->t->n && abs_e; ti++) {
        const rjob *rj = &R->jobs[ti];
        if (isnan(rj->est) || !rj->started) continue;
        if (!isfinite(rj->est)) {
            r->est_infinite++;
            continue;
        }
        double e = rj->first_start - rj->est;
        sum += e, sum_abs += fabs(e), abs_e[n++] = fabs(e);
    }
    r->est_jobs = n;
    r->est_mean_error_s = n ? sum / (double)n : NAN;
    r->est_mean_abs_error_s = n ? sum_abs / (double)n : NAN;
    if (abs_e) qsort(abs_e, n, sizeof *abs_e, cmp_d);
    r->est_p50_abs_error_s = abs_e ? pct(abs_e, n, 0.5) : NAN;
    r->est_p90_abs_error_s = abs_e ? pct(abs_e, n, 0.9) : NAN;
    free(abs_e);
}

static int loop(run *R, double *t0, double *t_end)
{
    const sim_trace *t = R->t;
    size_t next = 0, idle = 0;
    double last = t->n ? t->jobs[0].submit_s : 0, util_busy = 0, util_up = 0;
    *t0 = last;
    sh_progress bar;
    if (R->o->progress) sh_progress_start(&bar, "sim", t->n, "jobs");
    while (R->done < t->n) {
        double now = next < t->n ? t->jobs[next].submit_s : INFINITY;
        if (R->nheap && R->heap[0].t < now) now = R->heap[0].t;
        if (!isfinite(now)) break; /* nothing left can happen: the rest never starts */
        sched_stats st;
        sched_stats_get(R->s, &st);
        /* Utilisation is measured over the arrival window, where every policy
         * is offered the same work; the drain after the last arrival
         * measures stragglers, not the scheduler. */
        if (next < t->n) {
            util_busy += (double)R->running_gpus * (now - last);
            util_up += (double)st.gpus_up * (now - last);
        }
        last = now;
        size_t first_new = next;
        while (next < t->n && t->jobs[next].submit_s <= now) SH_TRY(submit(R, next++, now));
        while (R->nheap && R->heap[0].t <= now) {
            ev e = pop_ev(R);
            SH_TRY(handle(R, &e));
        }
        if (R->o->check) {
            int rc = sched_check(R->s, now);
            if (rc) return sh_err_wrap(rc, "sim: invariant broken at t=%.3f s", now);
        }
        int n = cycle(R, now);
        if (n < 0) return n;
        if (R->o->estimates) SH_TRY(take_estimates(R, first_new, next, now));
        if (R->waits) SH_TRY(read_waits(R, now));
        /* A livelock (firstfit gangs holding and releasing each other's
         * nodes with nothing running and nothing left to arrive) ends the
         * replay as deadlocked rather than spinning forever. */
        int started = 0;
        for (size_t i = 0; i < R->d.n; i++) started |= R->d.v[i].kind == SCHED_D_START;
        if (next >= t->n && R->running_gpus == 0 && !started) idle++;
        else idle = 0;
        if (idle > 1000) {
            R->r->deadlocked = 1;
            break;
        }
        if (R->o->progress) sh_progress_update(&bar, R->done);
    }
    if (R->o->progress) sh_progress_clear(&bar); /* the results table follows: no finished bar between its rows */
    if (R->done < t->n) R->r->deadlocked = 1;
    *t_end = last;
    R->r->utilization = util_up > 0 ? util_busy / util_up : 0;
    return 0;
}

/* One line per job of the trace, in trace order (docs/sched.md, "Per-job
 * results"); a job that never started or ended leaves those fields empty. */
static int write_jobs(const run *R, const char *path)
{
    static const char *const kinds[] = {"gang", "elastic", "function"};
    sh_buf b = {0};
    int rc = sh_buf_printf(&b, "id,tenant,kind,nodes,gpus_per_node,priority,submit_s,duration_s,start_s,wait_s,"
                               "end_s,jct_s,preemptions,shrinks\n");
    for (size_t i = 0; i < R->t->n && !rc; i++) {
        const sim_job *j = &R->t->jobs[i];
        const rjob *rj = &R->jobs[i];
        char st[32] = "", wt[32] = "", en[32] = "", jc[32] = "";
        if (rj->started) {
            snprintf(st, sizeof st, "%.3f", rj->first_start);
            snprintf(wt, sizeof wt, "%.3f", rj->first_start - j->submit_s);
        }
        if (rj->end > 0) {
            snprintf(en, sizeof en, "%.3f", rj->end);
            snprintf(jc, sizeof jc, "%.3f", rj->end - j->submit_s);
        }
        rc = sh_buf_printf(&b, "%s,%s,%s,%d,%d,%d,%.3f,%.3f,%s,%s,%s,%s,%d,%d\n", j->id, j->tenant, kinds[j->kind],
                           j->nodes, j->gpus_per_node, j->priority, j->submit_s, j->duration_s, st, wt, en, jc,
                           rj->preempted, rj->shrunk);
    }
    if (!rc) rc = sh_write_atomic(path, b.data, b.len);
    sh_buf_free(&b);
    return rc ? sh_err_wrap(rc, "sim: writing per-job results to %s", path) : 0;
}

/* Appends v to b as one CSV field, quoted when it holds a comma, quote or
 * line break. */
static int csv_field(sh_buf *b, const char *v)
{
    if (!strpbrk(v, ",\"\r\n")) return sh_buf_printf(b, "%s", v);
    int rc = sh_buf_printf(b, "\"");
    for (const char *c = v; *c && !rc; c++) rc = *c == '"' ? sh_buf_printf(b, "\"\"") : sh_buf_printf(b, "%c", *c);
    return rc ? rc : sh_buf_printf(b, "\"");
}

/* --waits-out: one line per job of the trace, in trace order: the pool of
 * its first start and its queued seconds by the core's reason (docs/sched.md,
 * "Per-job results"); a job still queued at the end counts up to t_end. */
static int write_waits(const run *R, const char *path, double t_end)
{
    sh_buf b = {0};
    int rc = sh_buf_printf(&b, "id,tenant,nodes,gpus_per_node,submit_s,start_s,wait_s,start_pool");
    for (int k = 1; k < SIM_WAITS && !rc; k++) rc = sh_buf_printf(&b, ",%s_s", sched_wait_name((sched_wait)k));
    if (!rc) rc = sh_buf_printf(&b, ",other_s,last_reason\n");
    for (size_t i = 0; i < R->t->n && !rc; i++) {
        const sim_job *j = &R->t->jobs[i];
        const rjob *rj = &R->jobs[i];
        const rwait *w = &R->waits[i];
        double v[SIM_WAITS];
        memcpy(v, w->s, sizeof v);
        if (!rj->started && w->since >= 0 && t_end > w->since) v[w->last] += t_end - w->since;
        char st[32] = "", wt[32] = "", pool[3 * SIM_NAME + 3] = "";
        if (rj->started) {
            snprintf(st, sizeof st, "%.3f", rj->first_start);
            snprintf(wt, sizeof wt, "%.3f", rj->first_start - j->submit_s);
        }
        if (w->pool_node < R->nnodes) {
            const sim_node *n = &R->nodes[w->pool_node];
            snprintf(pool, sizeof pool, "%s/%s/%s", n->zone, n->fabric, n->gpu_type);
        }
        rc = sh_buf_printf(&b, "%s,%s,%d,%d,%.3f,%s,%s,", j->id, j->tenant, j->nodes, j->gpus_per_node, j->submit_s, st, wt);
        if (!rc) rc = csv_field(&b, pool);
        for (int k = 1; k < SIM_WAITS && !rc; k++) rc = sh_buf_printf(&b, ",%.3f", v[k]);
        if (!rc) rc = sh_buf_printf(&b, ",%.3f,", v[SCHED_WAIT_NONE]);
        if (!rc) rc = csv_field(&b, w->text);
        if (!rc) rc = sh_buf_printf(&b, "\n");
    }
    if (!rc) rc = sh_write_atomic(path, b.data, b.len);
    sh_buf_free(&b);
    return rc ? sh_err_wrap(rc, "sim: writing per-job waits to %s", path) : 0;
}

int sim_run(const sim_fleet *f, const sim_trace *t, const sim_opts *o, sim_report *out)
{
    memset(out, 0, sizeof *out);
    out->jobs_total = t->n;
    sim_opts opt = *o;
    if (!(opt.repair_s > 0)) opt.repair_s = 3600;
    if (!(opt.restart_cost_s > 0)) opt.restart_cost_s = opt.cfg.restart_cost_s;
    run R;
    memset(&R, 0, sizeof R);
    R.t = t, R.o = &opt, R.r = out, R.rng = o->seed * 0x9e3779b97f4a7c15ull + 7;
    R.wake_at = -1;
    R.s = sched_new(&opt.cfg);
    R.jobs = calloc(t->n + 1, sizeof *R.jobs);
    for (size_t i = 0; R.jobs && i < t->n; i++) R.jobs[i].est = NAN;
    R.six2t = calloc(t->n + 1, sizeof *R.six2t);
    R.wait = calloc(t->n + 1, sizeof *R.wait);
    R.jct = calloc(t->n + 1, sizeof *R.jct);
    if (o->waits_out) {
        R.waits = calloc(t->n + 1, sizeof *R.waits);
        R.pend = calloc(t->n + 1, sizeof *R.pend);
        for (size_t i = 0; R.waits && i < t->n; i++) R.waits[i].since = -1, R.waits[i].pool_node = UINT32_MAX;
    }
    int rc = R.s && R.jobs && R.six2t && R.wait && R.jct && (!o->waits_out || (R.waits && R.pend))
                 ? 0 : sh_err(SH_ENOMEM, "sim: out of memory");
    double t0 = 0, t_end = 0;
    for (size_t i = 0; i < f->n && !rc; i++) rc = add_node(&R, &f->nodes[i], t->n ? t->jobs[0].submit_s : 0);
    if (rc && R.s) sh_err_wrap(rc, "fleet");
    if (!rc) rc = next_failure(&R, t->n ? t->jobs[0].submit_s : 0);
    double w0 = clock_window();
    if (!rc) rc = loop(&R, &t0, &t_end);
    double w1 = clock_window();
    out->clock_window_s = w0 < w1 ? w0 : w1;
    out->sched_cpu_s = out->sched_cpu_raw_s - (double)out->sched_steps * out->clock_window_s;
    if (out->sched_cpu_s < 0) out->sched_cpu_s = 0;
    if (!rc) summarise(&R, t0, t_end);
    if (!rc) summarise_estimates(&R);
    if (!rc && o->jobs_out) rc = write_jobs(&R, o->jobs_out);
    if (!rc && o->waits_out) rc = write_waits(&R, o->waits_out, t_end);
    sched_decisions_free(&R.d);
    sched_free(R.s);
    free(R.heap), free(R.jobs), free(R.six2t), free(R.nodes), free(R.prov), free(R.wait), free(R.jct);
    free(R.waits), free(R.pend);
    return rc;
}
