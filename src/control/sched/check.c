/* sched_check: every invariant of the core, verified from scratch against
 * the incremental bookkeeping.  O(nodes + placed pods); tests and the
 * simulator's --check mode call it after every event. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "query_int.h"

static int check_node(const sched *s, uint32_t ni, int *busy, int *up)
{
    const snode *n = &s->nodes[ni];
    if (n->removed) return n->nrefs ? sh_err(SH_EINTERNAL, "node %s was removed with %d pods on it", n->id, n->nrefs) : 0;
    int held = 0;
    for (int r = 0; r < n->nrefs; r++) held += n->refs[r].gpus;
    if (n->state == SCHED_NODE_FAILED && n->nrefs)
        return sh_err(SH_EINTERNAL, "work on a failed node: node %s still holds %d pods", n->id, n->nrefs);
    if (held > n->gpus)
        return sh_err(SH_EINTERNAL, "node %s: GPU booked twice: %d GPUs held of %d", n->id, held, n->gpus);
    if (n->state == SCHED_NODE_UP) {
        if (n->free != n->gpus - held)
            return sh_err(SH_EINTERNAL, "node %s: free count %d disagrees with its pods (%d held)",
                          n->id, n->free, held);
        *busy += held, *up += n->gpus;
    }
    return 0;
}

static int check_job(const sched *s, uint32_t ji)
{
    const sjob *j = &s->jobs[ji];
    int placed = j->state == SCHED_RUNNING || j->state == SCHED_HOLDING || j->state == SCHED_REPLACING;
    if (!placed && j->nplaces)
        return sh_err(SH_EINTERNAL, "job %s holds %d pods while not running", j->id, j->nplaces);
    if (!placed) return 0;
    for (int k = 0; k < j->nplaces; k++) {
        const snode *n = &s->nodes[j->places[k].node];
        int found = 0;
        for (int r = 0; r < n->nrefs; r++) found |= n->refs[r].job == ji;
        if (!found) return sh_err(SH_EINTERNAL, "job %s: node %s does not know its pod", j->id, n->id);
        if (n->state == SCHED_NODE_FAILED)
            return sh_err(SH_EINTERNAL, "job %s runs on failed node %s", j->id, n->id);
    }
    if (j->kind != SCHED_GANG) {
        if (j->kind == SCHED_ELASTIC && j->state == SCHED_RUNNING &&
            (j->nplaces < j->nodes || j->nplaces > j->maxr))
            return sh_err(SH_EINTERNAL, "elastic job %s has %d replicas outside %d..%d", j->id,
                          j->nplaces, j->nodes, j->maxr);
        return 0;
    }
    if (j->state == SCHED_RUNNING && j->nplaces != j->nodes)
        return sh_err(SH_EINTERNAL, "partial gang: job %s runs on %d of its %d nodes", j->id, j->nplaces, j->nodes);
    if (j->state == SCHED_HOLDING && s->cfg.policy != SCHED_POLICY_FIRSTFIT)
        return sh_err(SH_EINTERNAL, "partial gang: job %s holds %d of %d pods outside firstfit",
                      j->id, j->nplaces, j->nodes);
    for (int k = 0; k < j->nplaces; k++) {
        const snode *n = &s->nodes[j->places[k].node];
        if (n->pool != j->pool)
            return sh_err(SH_EINTERNAL, "gang %s spans pools: node %s is outside its zone, fabric or type",
                          j->id, n->id);
        if (j->places[k].gpus != j->gpn)
            return sh_err(SH_EINTERNAL, "gang %s: pod on node %s has %d GPUs, not %d", j->id, n->id,
                          j->places[k].gpus, j->gpn);
        for (int m = 0; m < k; m++)
            if (j->places[m].node == j->places[k].node)
                return sh_err(SH_EINTERNAL, "gang %s puts two pods on node %s", j->id, n->id);
    }
    return 0;
}

/* No reservation delayed by backfill: at the reservation's time T, each
 * reserved node must have `need` GPUs that no work expected past T holds. */
static int check_resv(const sched *s, double now)
{
    for (size_t i = 0; i < s->room->nresv; i++) {
        const sresv *r = &s->room->resv[i];
        if (r->job == NONE || s->jobs[r->job].state != SCHED_QUEUED) continue; /* started or forgotten */
        for (int k = 0; k < r->n; k++) {
            const snode *n = &s->nodes[r->nodes[k]];
            if (n->state != SCHED_NODE_UP) continue; /* a failure, not backfill */
            int late = 0;
            for (int q = 0; q < n->nrefs; q++) {
                const sjob *j = &s->jobs[n->refs[q].job];
                double e = sched__est_end(s, j);
                if (j->backfilled && e > r->T + 1e-6 && e >= now) late += n->refs[q].gpus;
            }
            if (late > n->gpus - r->need)
                return sh_err(SH_EINTERNAL, "reservation of job %s delayed by backfill on node %s: %d GPUs "
                              "busy past its start, %d allowed",
                              s->jobs[r->job].id, n->id, late, n->gpus - r->need);
        }
    }
    return 0;
}

/* Devices: each place names as many device indices as it holds GPUs
 * (nodes of up to 64), no index is held twice, and each node's busy mask is
 * the union of its places' masks. */
static int check_devices(const sched *s)
{
    uint64_t *acc = calloc(s->nnodes ? s->nnodes : 1, sizeof *acc);
    if (!acc) return sh_err(SH_ENOMEM, "sched_check: device masks");
    int rc = 0;
    for (size_t ji = 0; ji < s->njobs && !rc; ji++) {
        const sjob *j = &s->jobs[ji];
        for (int k = 0; k < j->nplaces && !rc; k++) {
            const splace *p = &j->places[k];
            const snode *n = &s->nodes[p->node];
            if (n->gpus <= 64 && __builtin_popcountll(p->gmask) != p->gpus)
                rc = sh_err(SH_EINTERNAL, "job %s: place on node %s names %d devices for %d GPUs", j->id, n->id,
                            __builtin_popcountll(p->gmask), p->gpus);
            else if (acc[p->node] & p->gmask)
                rc = sh_err(SH_EINTERNAL, "node %s: device mask %#llx booked twice (job %s)", n->id,
                            (unsigned long long)(acc[p->node] & p->gmask), j->id);
            acc[p->node] |= p->gmask;
        }
    }
    for (size_t ni = 0; ni < s->nnodes && !rc; ni++)
        if (acc[ni] != s->nodes[ni].gbusy)
            rc = sh_err(SH_EINTERNAL, "node %s: busy devices %#llx disagree with its places (%#llx)",
                        s->nodes[ni].id, (unsigned long long)s->nodes[ni].gbusy, (unsigned long long)acc[ni]);
    free(acc);
    return rc;
}

int sched_check(const sched *s, double now)
{
    int busy = 0, up = 0;
    for (size_t ni = 0; ni < s->nnodes; ni++) SH_TRY(check_node(s, (uint32_t)ni, &busy, &up));
    if (busy != s->gpus_busy || up != s->gpus_up)
        return sh_err(SH_EINTERNAL, "GPU totals drifted: %d busy of %d counted, %d of %d booked",
                      busy, up, s->gpus_busy, s->gpus_up);
    for (size_t pi = 0; pi < s->npools; pi++) {
        const spool *p = &s->pools[pi];
        int cnt = 0;
        for (int f = 0; f <= MAXG; f++) {
            int c = 0;
            for (uint32_t ni = p->head[f]; ni != NONE; ni = s->nodes[ni].next, c++)
                if (s->nodes[ni].free != f || s->nodes[ni].state != SCHED_NODE_UP)
                    return sh_err(SH_EINTERNAL, "node %s is in the wrong free bucket %d",
                                  s->nodes[ni].id, f);
            if (c != p->count[f])
                return sh_err(SH_EINTERNAL, "pool bucket %d counts %d nodes, holds %d", f,
                              p->count[f], c);
            cnt += c;
        }
        for (int g = 0, ge = cnt; g <= MAXG; ge -= p->count[g], g++)
            if (p->ge[g] != ge)
                return sh_err(SH_EINTERNAL, "pool count of nodes with >= %d free GPUs is %d, holds %d",
                              g, p->ge[g], ge);
        int by[MAXG + 1] = {0};
        for (size_t k = 0; k < p->nnodes; k++) {
            const snode *n = &s->nodes[p->nodes[k]];
            if (n->state == SCHED_NODE_UP) by[n->gpus < MAXG ? n->gpus : MAXG]++;
        }
        for (int g = MAXG, c = 0; g >= 0; g--)
            if (p->up_ge[g] != (c += by[g]))
                return sh_err(SH_EINTERNAL, "pool count of up nodes with >= %d GPUs is %d, holds %d", g,
                              p->up_ge[g], c);
    }
    for (size_t t = 0; t < s->plc->ntpools; t++) { /* the largest pool count by type */
        const struct stpools *tp = &s->plc->tpools[t];
        for (int g = 0; g <= MAXG && tp->n; g++) {
            int mx = 0;
            for (size_t k = 0; k < tp->n; k++)
                if (s->pools[tp->v[k]].ge[g] > mx) mx = s->pools[tp->v[k]].ge[g];
            if (mx != tp->max_ge[g])
                return sh_err(SH_EINTERNAL, "type %s: the largest pool count of nodes with >= %d free "
                              "GPUs is %d, booked %d", s->name[t], g, mx, tp->max_ge[g]);
        }
    }
    size_t queued = 0, running = 0;
    for (size_t ji = 0; ji < s->njobs; ji++) {
        SH_TRY(check_job(s, (uint32_t)ji));
        sched_job_state st = s->jobs[ji].state;
        queued += st == SCHED_QUEUED || st == SCHED_HOLDING;
        running += st == SCHED_RUNNING || st == SCHED_REPLACING;
    }
    if (queued != s->queued || running != s->running)
        return sh_err(SH_EINTERNAL, "job counts drifted: %zu queued, %zu running; booked %zu, %zu",
                      queued, running, s->queued, s->running);
    for (size_t i = 0, n = 0; i <= s->capshapes; i++) { /* the live shape list, in slot order */
        if (i < s->capshapes && !s->shapes[i].queued) continue;
        if (i == s->capshapes ? n != s->nshapes_live : n >= s->nshapes_live || s->live[n] != i)
            return sh_err(SH_EINTERNAL, "the list of shapes with queued jobs (%zu) disagrees with the "
                          "table at slot %zu", s->nshapes_live, i);
        n++;
    }
    SH_TRY(check_devices(s));
    return check_resv(s, now);
}
