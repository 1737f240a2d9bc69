/* shoal mainjob, run/: `shoal run`'s parts (mainrun.c drives them): the
 * control-plane jobs of a main job, submitted and watched (jobs.c). */
#ifndef SHOAL_MJ_RUN_INT_H
#define SHOAL_MJ_RUN_INT_H

#include "app/mainjob/mainjob.h"
#include "app/mainjob/worker/worker_int.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

enum { MJ_NJOBS = 3 }; /* the trainer, the rollouts, the push root */

/* The jobs' "run" (docs/job-format.md, "Runs"): the server makes the run's
 * secret and gives it to these jobs' ranks only (SHOAL_RUN_SECRET); the
 * trainer, workers, replicas and push root prove with it that they belong
 * to this run (docs/security.md).  No job file holds it. */
#define MJ_RUN_NAME "main"

/* What the jobs are made from: the run folder's paths. */
typedef struct mj_run_paths {
    char dir[4096], bin[4200], store[4200], pdir[4200], fleet[4200], speeds[4200];
    int steps, direct;
} mj_run_paths;

/* The job files (docs/job-format.md) of the trainer gang, the elastic
 * rollout workers (GPU types and speeds from the fleet files) and the push
 * root (NULL with p->direct).  Each is also kept as RUN/<name>.json.  The
 * caller owns them. */
int mj_run_jobs(const mj_run_paths *p, json_t *jobs[MJ_NJOBS]);
/* POST /v1/jobs: *id. */
int mj_run_submit(client_conn *c, const json_t *job, int64_t *id);
/* 0 while job id runs or queues; an error naming the job, its state and
 * reason when it failed or was cancelled, after saying the last lines of
 * each rank that failed. */
int mj_run_check(client_conn *c, int64_t id, mj_say_fn say, void *arg);
/* Asks the server to cancel job id (best effort). */
void mj_run_cancel(client_conn *c, int64_t id);
/* GET path, written as RUN/name (best effort: a record of the run). */
void mj_run_save(client_conn *c, const char *path, const char *dir, const char *name);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
