/* shoal mainjob, fleetcost/: the fleet-cost experiment's parts: per-type
 * tuning under emulated GPU time (pure).  Its runs go through the one
 * process fan-out, sh_fanout (src/common/fanout.c).  The
 * experiment itself (mj_fleet_cost) is in the entry header, mainjob.h. */
#ifndef SHOAL_MJ_FLEETCOST_INT_H
#define SHOAL_MJ_FLEETCOST_INT_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"
#include "shoal/rl.h"
#include "app/mainjob/mainjob.h"
#include "app/mainjob/worker/worker_int.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

/* ---- Per-type tuning under emulated GPU time (pure) -------------------------- */

/* The request size (prompts) of a worker without its own: the run's
 * req_prompts, or a quarter of a step's prompts (as src/rl/engine does). */
int mj_default_prompts(const rl_config *c);
/* Worst-case emulated seconds of a request of `prompts` prompts on w: every
 * response runs to max_new tokens (c->step_s must be > 0). */
double mj_req_latency_s(const rl_config *c, const rl_worker_spec *w, int prompts);
/* Trajectories per emulated second of w at that request size. */
double mj_worker_rate(const rl_config *c, const rl_worker_spec *w, int prompts);
/* The pool's rate: every worker at its own request size (or the default). */
double mj_pool_rate(const rl_config *c);
/* The worst-case latency of the pool's stalest request, in version periods
 * (one version = a step's trajectories at the pool's rate). */
double mj_stalest(const rl_config *c);
/* Sets every worker's req_prompts to the size with the highest rate whose
 * worst-case latency is at most mj_stalest() of the pool as given (its
 * untuned staleness) version periods of the tuned pool, iterated to a
 * fixed point. */
int mj_tune(rl_config *c);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
