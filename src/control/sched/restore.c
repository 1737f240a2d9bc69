/* Restoring running work after the control-plane server restarts.
 *
 * Asked for by the server (issue 6): after a crash it rebuilds a fresh
 * scheduler from SQLite, and jobs that were running keep running on their
 * nodes (they are reconciled, not restarted), so the scheduler must learn
 * their placement rather than choose a new one.  The placement is checked
 * whole before anything is booked, so a refused restore changes nothing. */
#include <string.h>

#include "cycle_int.h"

/* The rules a START decision would have kept: a gang gets exactly `nodes`
 * distinct nodes of one pool with gpus_per_node each; elastic replicas of
 * gpus_per_node number min..max; a function one GPU; every node up, known,
 * and with the GPUs free (counting earlier places on the same node). */
static int check_places(sched *s, const sjob *j, const sched_place *pl, size_t n, uint32_t *pool, double now)
{
    if (j->kind == SCHED_GANG && n != (size_t)j->nodes)
        return sh_err(SH_EINVAL, "job %s: a gang of %d nodes cannot be restored on %zu places "
                      "(no partial gangs)", j->id, j->nodes, n);
    if (j->kind == SCHED_ELASTIC && (n < (size_t)j->nodes || n > (size_t)j->maxr))
        return sh_err(SH_EINVAL, "job %s: %zu replicas are outside %d..%d", j->id, n, j->nodes, j->maxr);
    if (j->kind == SCHED_FUNCTION && n != 1)
        return sh_err(SH_EINVAL, "job %s: a function runs on one place, not %zu", j->id, n);
    uint64_t mark = ++s->cyc->markseq;
    *pool = NONE;
    for (size_t i = 0; i < n; i++) {
        uint32_t ni = sched__map_get(&s->node_map, pl[i].node);
        if (ni == NONE || s->nodes[ni].removed || s->nodes[ni].state != SCHED_NODE_UP)
            return sh_err(SH_EINVAL, "job %s: node %s is unknown or not up", j->id, pl[i].node ? pl[i].node : "");
        snode *nd = &s->nodes[ni];
        if (pl[i].gpus != j->gpn)
            return sh_err(SH_EINVAL, "job %s: place on node %s has %d GPUs, the job takes %d", j->id,
                          nd->id, pl[i].gpus, j->gpn);
        if (sched__job_speed(s, j, s->pools[nd->pool].type) <= 0)
            return sh_err(SH_EINVAL, "job %s: node %s has a GPU type the job does not allow", j->id, nd->id);
        if (nd->mark != mark) nd->mark = mark, nd->scratch = nd->free, nd->gscratch = nd->gbusy; /* GPUs left */
        else if (j->kind == SCHED_GANG)
            return sh_err(SH_EINVAL, "job %s: a gang puts two pods on node %s", j->id, nd->id);
        if (nd->scratch < pl[i].gpus)
            return sh_err(SH_EINVAL, "job %s: node %s lacks %d free GPUs", j->id, nd->id, pl[i].gpus);
        nd->scratch -= pl[i].gpus;
        uint64_t m = pl[i].gpu_mask, top = nd->gpus >= 64 ? ~0ull : (1ull << nd->gpus) - 1;
        if (m && (__builtin_popcountll(m) != pl[i].gpus || (m & ~top)))
            return sh_err(SH_EINVAL, "job %s: place on node %s names GPUs %#llx, not %d of its %d", j->id,
                          nd->id, (unsigned long long)m, pl[i].gpus, nd->gpus);
        if (m & nd->gscratch)
            return sh_err(SH_EINVAL, "job %s: GPUs %#llx of node %s are held already", j->id,
                          (unsigned long long)(m & nd->gscratch), nd->id);
        nd->gscratch |= m;
        if (pl[i].since > now)
            return sh_err(SH_EINVAL, "job %s: place on node %s starts in the future", j->id, nd->id);
        if (i == 0) *pool = nd->pool;
        if (j->kind == SCHED_GANG && nd->pool != *pool)
            return sh_err(SH_EINVAL, "job %s: a gang's places span zones, fabrics or GPU types", j->id);
    }
    return 0;
}

int sched_job_restore(sched *s, const char *id, const sched_place *places, size_t n, double now)
{
    uint32_t ji = sched__map_get(&s->job_map, id);
    if (ji == NONE) return sh_err(SH_ENOENT, "job %s is not known", id ? id : "(null)");
    sjob *j = &s->jobs[ji];
    if (j->state != SCHED_QUEUED) return sh_err(SH_EINVAL, "job %s: only a queued job can be restored", id);
    uint32_t pool = NONE;
    SH_TRY(check_places(s, j, places, n, &pool, now));
    for (size_t i = 0; i < n; i++)
        SH_TRY(sched__hold_at(s, ji, sched__map_get(&s->node_map, places[i].node), places[i].gpus,
                              places[i].gpu_mask, places[i].since > 0 ? places[i].since : now, now));
    sched__queue_remove(s, ji);
    j->state = SCHED_RUNNING;
    /* Its estimate runs from when it was placed where the places say (the
     * earliest since): work that had run past its estimate before a
     * server restarted is still past it, not given its whole estimate
     * again. */
    double start = now;
    for (size_t i = 0; i < n; i++)
        if (places[i].since > 0 && places[i].since < start) start = places[i].since;
    j->first_start = j->start = start, j->over = 0;
    j->blocked_since = -1;
    j->pool = j->kind == SCHED_GANG ? pool : NONE;
    s->running++;
    s->st.starts++;
    for (size_t i = 0; i < n; i++) { /* its estimate runs from its start */
        uint32_t ni = sched__map_get(&s->node_map, places[i].node);
        s->nodes[ni].ver++;
        sched__pool_touch(s, s->nodes[ni].pool);
    }
    return sched__due_add(s, ji);
}
