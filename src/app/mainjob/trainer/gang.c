/* One rank of the trainer gang as a process (`shoal rl trainer`,
 * docs/mainjob.md): where it stands from the agent's environment
 * (SHOAL_RANK, SHOAL_WORLD_SIZE, MASTER_ADDR, SHOAL_JOB_ID, SHOAL_ATTEMPT),
 * the ring's rendezvous in the store folder, then rank 0's run
 * (trainer.c) or a follower's (train.c). */
#include <stdlib.h>

#include "trainer_int.h"

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

int mj_trainer_main(const rl_config *c, const mj_trainer_proc *o, mj_trainer_outcome *out)
{
    *out = (mj_trainer_outcome){.rank = env_int("SHOAL_RANK", 0), .world = env_int("SHOAL_WORLD_SIZE", 1)};
    const char *host = getenv("MASTER_ADDR") ? getenv("MASTER_ADDR") : "127.0.0.1";
    int port = env_int("MASTER_PORT", 0);
    if (out->world > 1 && !getenv("SHOAL_JOB_ID"))
        return sh_err(SH_EINVAL, "rl trainer: SHOAL_JOB_ID is not set: run it as a gang job");
    /* Ring rendezvous in the store folder, one per job attempt: fixed ports
     * could be taken by anyone on the machine. */
    char rdv[4200];
    snprintf(rdv, sizeof rdv, "%s/ring/%s-%s", o->store, getenv("SHOAL_JOB_ID") ?: "0",
             getenv("SHOAL_ATTEMPT") ?: "0");
    mj_ring *ring = NULL;
    int rc = mj_ring_new(out->rank, out->world, host, port, rdv, o->ring_timeout, &ring);
    mj_trainer_opts mo = {o->store, o->events, o->result, o->args, o->nargs, o->on_listen, o->arg};
    if (!rc && out->rank == 0) rc = mj_trainer_rank0(c, &mo, ring, out->world, host, &out->res);
    else if (!rc)
        rc = mj_train_follow(&(mj_train){.ring = ring, .rank = out->rank, .world = out->world}, c, &out->steps,
                             &out->in_sync);
    mj_ring_free(ring);
    return rc;
}
