/* The emulated GPU time of rollouts (docs/mainjob.md, "Emulated GPU time").
 *
 * A worker stands in for a GPU of a declared type.  With rl_config.step_s
 * set, a decoding step of B sequences on it lasts
 *
 *     step_s / speed * sum over passes p of (1 + seq_cost * (b_p - 1))
 *
 * where the B sequences are decoded in passes of at most max_seqs (what
 * the type's memory holds at once; 0: no limit).  Decoding is
 * memory-bound: every step reads the weights once for the whole batch, and
 * each further sequence adds its KV-cache reads (seq_cost of a
 * one-sequence step), so throughput rises with concurrency until the
 * memory is full.  A request is decoded in lockstep (static batching), so
 * it takes as many steps as its longest response.
 *
 * Pure: the same work always costs the same emulated seconds, whatever the
 * load on the machine that runs the emulation. */
#include "shoal/rl.h"

double rl_emu_step_s(const rl_config *c, const rl_worker_spec *w, int seqs)
{
    if (seqs < 1 || !(w->speed > 0)) return 0;
    int cap = w->max_seqs > 0 ? w->max_seqs : seqs;
    double units = 0;
    for (int left = seqs; left > 0; left -= cap) {
        int b = left < cap ? left : cap;
        units += 1 + c->seq_cost * (b - 1);
    }
    return c->step_s / w->speed * units;
}

int rl_emu_steps(const rl_traj *t, int n)
{
    int steps = 0;
    for (int i = 0; i < n; i++)
        if (t[i].len - t[i].plen > steps) steps = t[i].len - t[i].plen;
    return steps;
}

double rl_emu_request_s(const rl_config *c, const rl_worker_spec *w, const rl_traj *t, int n)
{
    return rl_emu_steps(t, n) * rl_emu_step_s(c, w, n);
}
