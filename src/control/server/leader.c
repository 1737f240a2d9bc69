/* Several servers on one PostgreSQL database, one of them the leader.
 *
 * Election: a server leads while its database session holds the advisory
 * lock PG_KEY_LEADER (db_pg.c).  The session ends when the process dies
 * or is cut off, and PostgreSQL then frees the lock for a standby, which
 * polls for it every SRV_LEAD_POLL_S.
 *
 * Fencing: on winning, a server takes the next epoch in shoal_leader; every
 * transaction it opens checks that the epoch is still its own, so that no
 * earlier leader can commit again, even through a new session.  It also
 * holds a lease, renewed every SRV_LEASE_RENEW_S by the scheduler thread:
 * a leader that could not renew stops answering (503) once its lease has
 * run out by its own clock, and a new leader starts acting only after the
 * last lease has run out by the database's clock.  So a leader cut off from
 * the database has stopped acting before the next one starts.
 *
 * Take-over: the new leader loads the state and rebuilds the scheduling
 * core from the database, exactly as a restarted server does (running
 * gangs stay placed; their agents find the new leader and report on).
 * Until then, and on every standby, requests get 307 to the leader's URL,
 * or 503 while no leader is known. */
#include "srv_int.h"
#include "db_int.h"

#include <stdlib.h>
#include <string.h>

#define SRV_LEAD_POLL_S 0.1
#define SRV_LEASE_S 1.5
#define SRV_LEASE_RENEW_S 0.25
/* The lease a leader trusts is shorter than the one it wrote by this much,
 * covering clock-rate differences and the renewal's own round trip. */
#define SRV_LEASE_MARGIN_S 0.2

void srv__lead_wait(srv *s, double seconds)
{
    double end = sh_now_mono() + seconds;
    while (!__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE) && sh_now_mono() < end) sh_sleep(0.02);
}

/* One round of the standby's election: *got 1 if this server now holds the
 * leader's lock; else it notes who leads, for its redirects.  Errors (the
 * database out of reach) are warned about every 10 s and retried. */
int srv__lead_try(srv *s, int *got)
{
    static __thread double warned;
    char url[sizeof s->leader_url] = "";
    int64_t epoch = 0;
    *got = 0;
    int rc = srv__pg_try_lead(s, got);
    if (rc == SH_OK && !*got) rc = srv__pg_leader(s, url, sizeof url, &epoch);
    if (rc < 0) {
        if (sh_now_mono() - warned > 10) sh_warn("standby: %s (retrying)", sh_errmsg()), warned = sh_now_mono();
        srv__lead_wait(s, 0.5);
        return rc;
    }
    if (*got) return SH_OK;
    pthread_mutex_lock(&s->lead_mu);
    snprintf(s->leader_url, sizeof s->leader_url, "%s", url);
    pthread_mutex_unlock(&s->lead_mu);
    srv__lead_wait(s, SRV_LEAD_POLL_S);
    return SH_OK;
}

/* Takes the next epoch (fencing out every earlier leader), waits out the
 * last leader's lease and takes a lease of its own.  On success s->mu is
 * held, for the caller to load the state.  The lease runs from before the
 * load: the scheduler thread's first round renews it. */
int srv__lead_claim(srv *s)
{
    double wait = 0;
    int64_t epoch = 0;
    SH_TRY(srv__pg_take_epoch(s, s->self_url, &epoch, &wait));
    sh_info("won the leader election: epoch %lld; waiting %.2f s for the last leader's lease", (long long)epoch,
            wait);
    srv__lead_wait(s, wait + 0.05);
    double t0 = sh_now_mono();
    pthread_mutex_lock(&s->mu);
    s->epoch = epoch;
    int rc = srv__pg_renew(s, epoch, SRV_LEASE_S);
    if (rc < 0) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    s->lease_until = t0 + SRV_LEASE_S - SRV_LEASE_MARGIN_S;
    return SH_OK;
}

/* Called by the scheduler thread with s->mu held. */
void srv__lead_renew(srv *s, double now)
{
    static __thread double next;
    if (s->store != &srv__store_pg || s->failed[0] || now < next) return;
    next = now + SRV_LEASE_RENEW_S;
    double t0 = sh_now_mono();
    if (srv__pg_renew(s, s->epoch, SRV_LEASE_S) == SH_OK) {
        s->lease_until = t0 + SRV_LEASE_S - SRV_LEASE_MARGIN_S;
        return;
    }
    snprintf(s->failed, sizeof s->failed, "no longer the leader (epoch %lld): %s; restart this server to stand by",
             (long long)s->epoch, sh_errmsg());
    sh_warn("%s", s->failed);
    s->lease_until = 0;
    pthread_cond_broadcast(&s->cv);
}

int srv__lead_acting(srv *s)
{
    return __atomic_load_n(&s->leader, __ATOMIC_ACQUIRE) && sh_now_mono() < s->lease_until;
}

json_t *srv__leader_json(srv *s)
{
    char url[sizeof s->leader_url];
    int leading = srv__lead_acting(s);
    pthread_mutex_lock(&s->lead_mu);
    snprintf(url, sizeof url, "%s", leading ? s->self_url : s->leader_url);
    pthread_mutex_unlock(&s->lead_mu);
    pthread_mutex_lock(&s->mu);
    json_t *j = json_pack("{s:b,s:s,s:s,s:s,s:I,s:f,s:f}", "leader", leading, "self", s->self_url, "leader_url",
                          url, "store", s->store ? s->store->name : "", "epoch", (json_int_t)s->epoch, "t_led",
                          s->t_led_wall, "t_first_cycle", s->t_first_cycle);
    pthread_mutex_unlock(&s->mu);
    return j;
}
