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

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"
#include "shoal/rl.h"
#include "shoal/client.h"
#include "shoal/server.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

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
int mj_fleet_cost(const mj_fleetcost_opts *o, const rl_config *base, sh_units_fn progress, void *parg,
                  json_t **result);
/* The experiment's defaults (docs/mainjob.md): o (but its files) and base. */
void mj_fleetcost_default(mj_fleetcost_opts *o, rl_config *base);

/* ---- The report (report/report.c) ------------------------------------------
 * Writes RUN/summary.json and RUN/report.html from what the run folder
 * holds and hands back the summary (caller owns it). */
int mj_report_write(const char *run, json_t **summary);

/* A line of progress for the user (no newline). */
typedef void (*mj_say_fn)(void *arg, const char *line);

/* ---- Watching a run (run/watch.c) ------------------------------------------
 * mj_watch_step looks once: appends a billing sample from the server
 * (client; NULL: none) to RUN/costs.jsonl, says one line per new step or
 * evaluation of RUN/events.jsonl, and returns 1 once RUN/result.json
 * exists, 0 before, an error when RUN/store/trainer.json says the trainer
 * failed.  mj_watch_run looks once a second until the result, up to
 * timeout_s.  Start with the struct zeroed but for its first four fields. */
typedef struct mj_watch {
    const char *dir;
    client_conn *client;
    mj_say_fn say;
    void *arg;
    size_t seen;  /* events said so far */
    double total; /* the last billing sample, dollars */
} mj_watch;
int mj_watch_step(mj_watch *w);
int mj_watch_run(mj_watch *w, double timeout_s);

/* ---- The main job (run/mainrun.c, `shoal run`) -----------------------------
 * Empties the run folder `dir` (outside /tmp: ranks get a private one)
 * after checking that `port` is free, copies the binaries (bin, the client,
 * and core, shoal-core) and the fleet files there, starts the fleet,
 * submits the trainer, the rollouts and (unless direct) the push root,
 * says the progress until the trainer's result, stops the fleet, runs the
 * fleet-cost experiment (fleet_cost), and writes the report.  *summary:
 * summary.json's object (the caller's).  A job that fails ends the run
 * with its reason (its failed ranks' last lines said first); so does *stop
 * set (by a signal). */
typedef struct mj_run_opts {
    const char *bin, *core, *fleet, *speeds, *dir; /* core NULL: shoal-core beside bin */
    const char *sandbox, *web_dir; /* the agents' sandbox (NULL: auto); the dashboard's files (NULL: none) */
    int port, steps, direct, fleet_cost, fc_seeds; /* fc_seeds 0: the experiment's default */
    double timeout_s;                              /* the training's (0: 900) */
    mj_say_fn say;
    void *arg;
    sh_units_fn fc_progress; /* the experiment's steps (NULL: none) */
    void *fc_arg;
    volatile sig_atomic_t *stop;
} mj_run_opts;
int mj_run(const mj_run_opts *o, json_t **summary);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
