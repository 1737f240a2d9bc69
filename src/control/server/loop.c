/* The scheduler thread: a cycle of the scheduling core on every change (at
 * most every 2 ms) and at least every 100 ms, under the server's lock, in
 * one database transaction; a cycle that cannot commit is taken back by
 * reloading the state from the database. */
#include "srv_int.h"
#include "db_int.h"
#include "seam_int.h"
#include "state_int.h"
#include "provider_int.h"
#include "carry_int.h"
#include "loop_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The core, the jobs and the nodes: what srv__db_load and srv__seam_init
 * build. */
void srv__free_state(srv *s)
{
    if (s->sc) srv__seam_free(s);
    s->sc = NULL;
    s->dec = (sched_decisions){0};
    s->bills_staged = 0;
    s->nseam_queue = 0;
    for (int64_t i = 1; i <= s->njobs; i++) srv__job_free(s->jobs[i]);
    free(s->jobs);
    free(s->active);
    free(s->nodes);
    s->jobs = NULL, s->active = NULL, s->nodes = NULL;
    json_decref(s->idem_index);
    s->idem_index = NULL;
    s->njobs = s->cap_jobs = s->nactive = s->cap_active = 0;
    s->nnodes = s->cap_nodes = 0;
}

/* After a scheduling cycle whose transaction did not commit.  The cycle
 * carried out its decisions in the core and in the server's memory (places,
 * members, the agents' desired lists), and the database holds none of
 * them: both are rebuilt from the database, as a restart would, before the
 * lock is released, so that no agent or client sees the undone cycle.  The
 * next cycle decides again.  The nodes keep their last poll, and each
 * node's desired list gets a new version, so that a waiting poll answers
 * with the list as the database has it.  A reload that fails leaves the
 * server without a state it can trust: it is marked failed (every request
 * gets 503, `shoal server` exits non-zero for its supervisor to restart it). */
static int reload(srv *s, const char *why)
{
    int n = s->nnodes;
    char (*names)[sizeof s->nodes[0].name] = n ? malloc((size_t)n * sizeof *names) : NULL;
    double *seen = n ? malloc((size_t)n * sizeof *seen) : NULL;
    uint64_t top = 0;
    if (n && (!names || !seen)) {
        free(names), free(seen);
        return sh_err(SH_ENOMEM, "reloading the state");
    }
    for (int i = 0; i < n; i++) {
        memcpy(names[i], s->nodes[i].name, sizeof names[i]);
        seen[i] = s->nodes[i].last_seen;
        if (s->nodes[i].version > top) top = s->nodes[i].version;
    }
    srv__free_state(s);
    s->reloading = 1;
    int rc = srv__db_load(s, srv__job_from_row);
    if (rc == SH_OK) rc = srv__db_begin(s);
    if (rc == SH_OK) {
        rc = srv__seam_init(s);
        if (rc == SH_OK)
            rc = srv__db_event(s, 0, NULL, "cycle_undone",
                               "a scheduling cycle could not commit (%s); its decisions were taken back"
                               " and the state reloaded from the database", why);
        if (rc == SH_OK) rc = srv__commit(s);
        else srv__rollback(s);
    }
    s->reloading = 0;
    for (int i = 0; rc == SH_OK && i < s->nnodes; i++) {
        s->nodes[i].version = top + 1;
        for (int k = 0; k < n; k++)
            if (!strcmp(names[k], s->nodes[i].name)) s->nodes[i].last_seen = seen[k];
    }
    free(names);
    free(seen);
    if (rc < 0) {
        snprintf(s->failed, sizeof s->failed, "the state could not be reloaded from the database after a"
                                              " failed commit (%s): restart the server", sh_errmsg());
        sh_warn("%s", s->failed);
        srv__free_state(s);
    }
    /* Waiting polls wake to the reloaded lists (or to the loss).  The next
     * cycle comes with the timer, not at once: a disk that keeps failing is
     * not retried every 2 ms. */
    pthread_cond_broadcast(&s->cv);
    return rc < 0 ? sh_err(SH_EIO, "%s", s->failed) : SH_OK;
}

static double cycle(srv *s)
{
    if (s->failed[0]) return SH_EIO;
    double t0 = sh_now_mono();
    if (!srv__lead_acting(s)) return SH_EAGAIN; /* the lease lapsed: decide nothing */
    if (srv__db_begin(s) < 0) return SH_EIO;
    int rc = srv__seam_step(s, t0);
    if (rc == SH_OK) rc = srv__commit(s);
    else srv__rollback(s);
    if (rc < 0) {
        /* The core decided and the server carried part or all of it out. */
        char why[600];
        snprintf(why, sizeof why, "%s", sh_errmsg());
        sh_warn("scheduling cycle: %s; reloading the state from the database", why);
        if (reload(s, why) == SH_OK) sh_err(SH_EIO, "scheduling cycle: %s (taken back)", why);
    }
    s->last_cycle_s = sh_now_mono() - t0;
    if (rc == SH_OK && !s->t_first_cycle) s->t_first_cycle = sh_now_wall();
    return rc < 0 ? rc : s->last_cycle_s;
}

static void *sched_main(void *arg)
{
    srv *s = arg;
    pthread_mutex_lock(&s->mu);
    double last = 0;
    while (!s->stopping) {
        double now = sh_now_mono();
        srv__lead_renew(s, now);
        if (s->cfg.manual_cycles) s->dirty = 0, last = now;
        /* Run on every change, at most every 2 ms so that a burst of submits
         * shares one cycle, and at least every 100 ms for heartbeats. */
        if ((s->dirty && now - last >= 0.002) || now - last >= 0.1) {
            s->dirty = 0;
            last = now;
            cycle(s);
            srv__provider_tick(s, now);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (s->dirty) {
            /* Let the burst accumulate: release the lock for the rest of 2 ms. */
            ts.tv_nsec -= 98 * 1000000L;
            if (ts.tv_nsec < 0) {
                ts.tv_sec--;
                ts.tv_nsec += 1000000000L;
            }
        }
        pthread_cond_timedwait(&s->sched_cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int srv__sched_start(srv *s)
{
    if (pthread_create(&s->sched_thread, NULL, sched_main, s)) return sh_err(SH_EIO, "cannot start the scheduler thread");
    return SH_OK;
}

double srv_cycle_for_bench(srv *s)
{
    pthread_mutex_lock(&s->mu);
    double t = cycle(s);
    pthread_mutex_unlock(&s->mu);
    return t;
}
