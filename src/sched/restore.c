/* Restoring running work after the control-plane server restarts.
 *
 * Added by the server component (issue 6): the server rebuilds a fresh
 * scheduler from SQLite after a crash; jobs that were running keep running
 * on their nodes (they are reconciled, not restarted), so the scheduler must
 * learn their placement rather than choose a new one.  This file only uses
 * the internal helpers the cycle uses to start a job. */
#include "sched_int.h"

#include <string.h>

/* Declared in src/server/seam.c until it joins include/shoal/sched.h:
 * marks the just-submitted (queued) job `id` running on the n places given,
 * as if a START decision had placed it there at `now`.  Fails with SH_EINVAL
 * naming the node when a place is unknown, down or lacks free GPUs, or when a
 * gang's places span pools. */
int sched_job_restore(sched *s, const char *id, const sched_place *places, size_t n, double now);

int sched_job_restore(sched *s, const char *id, const sched_place *places, size_t n, double now)
{
    uint32_t ji = sched__map_get(&s->job_map, id);
    if (ji == NONE) return sh_err(SH_ENOENT, "job %s is not known", id);
    sjob *j = &s->jobs[ji];
    if (j->state != SCHED_QUEUED) return sh_err(SH_EINVAL, "job %s: only a queued job can be restored", id);
    if (!n) return sh_err(SH_EINVAL, "job %s: no places to restore", id);
    uint32_t pool = NONE;
    for (size_t i = 0; i < n; i++) {
        uint32_t ni = sched__map_get(&s->node_map, places[i].node);
        if (ni == NONE || s->nodes[ni].state != SCHED_NODE_UP || s->nodes[ni].free < places[i].gpus)
            return sh_err(SH_EINVAL, "job %s: node %s is unknown, down or full", id, places[i].node);
        if (i == 0) pool = s->nodes[ni].pool;
        if (j->kind == SCHED_GANG && s->nodes[ni].pool != pool)
            return sh_err(SH_EINVAL, "job %s: a gang's places span pools", id);
    }
    for (size_t i = 0; i < n; i++)
        SH_TRY(sched__hold(s, ji, sched__map_get(&s->node_map, places[i].node), places[i].gpus, now));
    sched__queue_remove(s, ji);
    j->state = SCHED_RUNNING;
    j->first_start = j->start = now;
    j->blocked_since = -1;
    j->pool = j->kind == SCHED_GANG ? pool : NONE;
    s->running++;
    s->st.starts++;
    return 0;
}
