/* The data-parallel trainer gang: rank 0 runs the RL engine and hands each
 * batch round the ring; every rank trains on its share of the groups and
 * the gradients of each minibatch are averaged with the ring all-reduce
 * before AdamW, so every rank applies the same update to the same weights.
 *
 * Messages from rank 0 (ring broadcasts) are a u32 kind, a u32 count, then
 * the payload: WEIGHTS (count floats: rank 0's parameters after the warm
 * start, sent once before the first batch), BATCH (count rl_traj records),
 * END (no payload). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_int.h"

enum { MSG_WEIGHTS = 1, MSG_BATCH = 2, MSG_END = 3 };

typedef struct msg_hdr {
    uint32_t kind, count;
} msg_hdr;

static int grad_allreduce(void *ctx, nn_model *m)
{
    mj_train *t = ctx;
    return mj_ring_allreduce_mean(t->ring, nn_grads(m), nn_num_params(m));
}

/* Rank 0 sends kind/count/payload to every other rank. */
static int send_msg(mj_train *m, uint32_t kind, uint32_t count, const void *p, size_t len)
{
    size_t n = sizeof(msg_hdr) + len;
    uint8_t *b = malloc(n);
    if (!b) return sh_err(SH_ENOMEM, "trainer: out of memory");
    msg_hdr h = {kind, count};
    memcpy(b, &h, sizeof h);
    if (len) memcpy(b + sizeof h, p, len);
    void *bp = b;
    int rc = mj_ring_bcast(m->ring, 0, &bp, &n);
    free(b);
    return rc;
}

/* Groups are runs of equal rl_traj.group; rank r of W takes groups
 * [G r / W, G (r + 1) / W) of the G in the batch. */
static void share(const rl_traj *t, int n, int rank, int world, int *a, int *b)
{
    int G = 0;
    for (int i = 0; i < n; i++) G += i == 0 || t[i].group != t[i - 1].group;
    int g0 = G * rank / world, g1 = G * (rank + 1) / world, g = -1;
    *a = n, *b = n;
    for (int i = 0; i < n; i++) {
        g += i == 0 || t[i].group != t[i - 1].group;
        if (g == g0 && *a == n) *a = i;
        if (g == g1) {
            *b = i;
            break;
        }
    }
}

static int train_share(mj_train *m, rl_trainer *tr, const rl_traj *t, int n, rl_step_stats *st)
{
    int a, b;
    share(t, n, m->rank, m->world, &a, &b);
    if (b - a < tr->minibatches)
        return sh_err(SH_EINVAL, "trainer rank %d: %d trajectories for %d minibatches: use more "
                      "prompts per step (--prompts) or fewer ranks", m->rank, b - a, tr->minibatches);
    tr->grad_hook = grad_allreduce;
    tr->grad_ctx = m;
    int rc = rl_train_step(tr, t + a, b - a, st);
    m->steps++;
    return rc;
}

int mj_train_step(void *ctx, rl_trainer *tr, const rl_traj *t, int n, rl_step_stats *st)
{
    mj_train *m = ctx;
    if (!m->synced && m->world > 1) {
        size_t np = nn_num_params(tr->model);
        SH_TRY(send_msg(m, MSG_WEIGHTS, (uint32_t)np, nn_params(tr->model), sizeof(float) * np));
    }
    m->synced = 1;
    if (m->world > 1) SH_TRY(send_msg(m, MSG_BATCH, (uint32_t)n, t, sizeof(rl_traj) * (size_t)n));
    int rc = train_share(m, tr, t, n, st);
    if (rc < 0 && rc != SH_ERANGE) return rc;
    if (m->steps == m->total_steps) SH_TRY(mj_train_finish(m, tr, &m->in_sync));
    return rc;
}

/* Every rank: compares its weights' hash with rank 0's; *in_sync on rank 0
 * is 1 only if every rank matched (the mean of the mismatch flags is 0). */
static int compare(mj_train *m, rl_trainer *tr, int *in_sync)
{
    sh_hash128 h = sh_hash128_of(nn_params(tr->model), sizeof(float) * nn_num_params(tr->model));
    void *p = &h;
    size_t len = sizeof h;
    SH_TRY(mj_ring_bcast(m->ring, 0, &p, &len));
    float bad = 0;
    if (m->rank) {
        bad = len != sizeof h || memcmp(p, &h, sizeof h) != 0;
        free(p);
    }
    SH_TRY(mj_ring_allreduce_mean(m->ring, &bad, 1));
    *in_sync = bad == 0;
    return 0;
}

int mj_train_finish(mj_train *m, rl_trainer *tr, int *in_sync)
{
    *in_sync = 1;
    if (m->world == 1) return 0;
    SH_TRY(send_msg(m, MSG_END, 0, NULL, 0));
    return compare(m, tr, in_sync);
}

static int follow_loop(mj_train *m, rl_trainer *tr)
{
    for (;;) {
        void *p = NULL;
        size_t len = 0;
        SH_TRY(mj_ring_bcast(m->ring, 0, &p, &len));
        msg_hdr h;
        int rc = len >= sizeof h ? 0 : sh_err(SH_EFORMAT, "trainer rank %d: short message", m->rank);
        if (!rc) memcpy(&h, p, sizeof h);
        size_t body = len - sizeof h;
        const uint8_t *b = (const uint8_t *)p + sizeof h;
        size_t np = nn_num_params(tr->model);
        if (rc) {
        } else if (h.kind == MSG_END) {
            free(p);
            return 0;
        } else if (h.kind == MSG_WEIGHTS && h.count == np && body == sizeof(float) * np) {
            memcpy(nn_params(tr->model), b, body);
        } else if (h.kind == MSG_BATCH && body == sizeof(rl_traj) * h.count && h.count > 0) {
            rl_traj *t = malloc(body);
            rl_step_stats st;
            rc = t ? 0 : sh_err(SH_ENOMEM, "trainer: out of memory");
            if (!rc) memcpy(t, b, body);
            if (!rc) rc = train_share(m, tr, t, (int)h.count, &st);
            if (rc == SH_ERANGE) rc = 0; /* a skipped step, as on rank 0 */
            free(t);
        } else {
            rc = sh_err(SH_EFORMAT, "trainer rank %d: message kind %u with %zu bytes", m->rank,
                        h.kind, body);
        }
        free(p);
        if (rc) return rc;
    }
}

int mj_train_follow(mj_train *m, const rl_config *c, long *steps_out, int *in_sync)
{
    rl_trainer tr = {.loss = c->loss, .temperature = c->sampling.temperature,
                     .minibatches = c->minibatches};
    int rc = nn_new(&c->model, c->seed, &tr.model);
    if (!rc) rc = nn_adamw_init(&tr.opt, tr.model, c->lr);
    if (!rc) rc = follow_loop(m, &tr);
    if (!rc) rc = compare(m, &tr, in_sync);
    *steps_out = m->steps;
    nn_adamw_free(&tr.opt);
    nn_free(tr.model);
    return rc;
}
