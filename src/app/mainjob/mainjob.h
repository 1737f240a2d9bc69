/* shoal mainjob: the end-to-end RL job on a local mixed fleet
 * (docs/mainjob.md), the one header the command line includes.
 *
 * Its private parts, each behind its own *_int.h: ring/ (the trainer
 * gang's UCX ring all-reduce), trainer/ (the data-parallel trainer),
 * worker/ (a rollout worker: fleet speeds, rendezvous, weights from the
 * push tree), fleetcost/ (the cost experiment's tuning and fan-out),
 * report/ (summary, plots, report.html), run/ (`shoal run`: the fleet, the
 * jobs, the watch).
 *
 * I/O edge: processes, sockets, UCX, files.  Every function returns 0 or a
 * negative SH_E* code with sh_errmsg() set. */
#ifndef SHOAL_MAINJOB_H
#define SHOAL_MAINJOB_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"
#include "shoal/rl.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

/* Progress in units (steps) done so far. */
typedef void (*mj_progress_fn)(void *arg, uint64_t units);

/* ---- The fleet-cost experiment (fleetcost.c, docs/mainjob.md) ------------ */
typedef struct mj_fleetcost_opts {
    const char *fleet, *speeds; /* fleet and speed tables */
    const char *ttype;          /* the training GPU type */
    int tg;                     /* the trainer's GPUs, kept out of the pools */
    int seeds, jobs;            /* seeds 1..32; runs at once */
    const char *warm_cache;     /* NULL: a temporary folder */
    double thr;                 /* each pool's rollout throughput, in training GPUs */
} mj_fleetcost_opts;

/* Runs the three pools from every seed with base's options and returns the
 * experiment's object (docs/mainjob.md, `--json`); the caller owns it. */
int mj_fleet_cost(const mj_fleetcost_opts *o, const rl_config *base, mj_progress_fn progress, void *parg,
                  json_t **result);

/* ---- The report (report/report.c) ------------------------------------------
 * Writes RUN/summary.json and RUN/report.html from what the run folder
 * holds and hands back the summary (caller owns it). */
int mj_report_write(const char *run, json_t **summary);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
