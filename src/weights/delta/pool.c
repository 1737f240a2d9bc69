/* A small pool: work items claimed from a shared counter by up to N threads,
 * each with its own scratch buffers.  The caller's thread works too.  Items
 * write their results into slots indexed by item, so the output never
 * depends on which thread ran what. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weights/delta/delta_int.h"

typedef struct {
    delta__work_fn fn;
    void *arg;
    size_t n, next;
    int rc;          /* error of the lowest failing item */
    size_t rc_item;
    char msg[1024];
    pthread_mutex_t mu;
} delta__pool;

static void *delta__pool_run(void *p)
{
    delta__pool *pl = p;
    delta__scratch s;
    int rc = delta__scratch_init(&s);
    for (;;) {
        pthread_mutex_lock(&pl->mu);
        size_t i = pl->rc < 0 ? pl->n : pl->next++;
        if (rc < 0 && pl->rc == 0) {
            pl->rc = rc, pl->rc_item = 0;
            snprintf(pl->msg, sizeof pl->msg, "%s", sh_errmsg());
        }
        pthread_mutex_unlock(&pl->mu);
        if (rc < 0 || i >= pl->n) break;
        rc = pl->fn(pl->arg, i, &s);
        if (rc < 0) {
            pthread_mutex_lock(&pl->mu);
            if (pl->rc == 0 || i < pl->rc_item) {
                pl->rc = rc, pl->rc_item = i;
                snprintf(pl->msg, sizeof pl->msg, "%s", sh_errmsg());
            }
            pthread_mutex_unlock(&pl->mu);
        }
    }
    delta__scratch_free(&s);
    return NULL;
}

int delta__parallel(int threads, size_t n, delta__work_fn fn, void *arg)
{
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (int)c : 1;
    }
    if ((size_t)threads > n) threads = n ? (int)n : 1;
    if (threads > 256) threads = 256;
    delta__pool pl = {.fn = fn, .arg = arg, .n = n};
    pthread_mutex_init(&pl.mu, NULL);
    pthread_t tid[256];
    int started = 0;
    for (int i = 1; i < threads; i++)
        if (pthread_create(&tid[started], NULL, delta__pool_run, &pl) == 0) started++;
    delta__pool_run(&pl);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&pl.mu);
    if (pl.rc < 0) return sh_err(pl.rc, "%s", pl.msg);
    return SH_OK;
}

void delta__progress(const delta_opts *o, pthread_mutex_t *mu, uint64_t *done, uint64_t n)
{
    if (!o || !o->progress) return;
    pthread_mutex_lock(mu);
    *done += n;
    sh_progress_update(o->progress, *done);
    pthread_mutex_unlock(mu);
}
