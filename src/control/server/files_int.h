/* The files layer (logfile.c, runs.c, uploads.c): rank logs, runs and their
 * services, work-dir archives.
 * A file includes the headers of its own layer and the layers below it
 * (scripts/check-layers.py, LAYERS). */
#ifndef SHOAL_SRV_FILES_INT_H
#define SHOAL_SRV_FILES_INT_H

#include "srv_int.h"

int srv__upload_begin(srv *s, srv_upload *u);
int srv__upload_write(srv_upload *u, const void *data, size_t len);
void srv__upload_abort(srv_upload *u);
/* Durable under the tenant's id; *reply {"workdir": id, "bytes": n}. */
int srv__upload_commit(srv *s, srv_upload *u, const char *tenant, json_t **reply);
int srv__workdir_exists(const srv *s, const char *tenant, const char *id);
/* The archive of job's work dir, for node `node` (which must run a live
 * rank of it); caller holds s->mu. */
int srv__workdir_for_node(srv *s, int node, int64_t job, char *path, size_t cap);
json_t *srv__run_find(srv *s, const char *tenant, const char *run);
json_t *srv__run_put(srv *s, const char *tenant, const char *run, const char *secret, const char *token);
/* For a submit: draws the job's run's secret and token if the run is new
 * (nr->create; the caller writes it with srv__db_run inside the submit's
 * transaction); srv__run_commit adds it to memory once that committed. */
int srv__run_prepare(srv *s, const srv_job *j, srv_new_run *nr);
void srv__run_commit(srv *s, const srv_new_run *nr);
/* SHOAL_RUN, SHOAL_RUN_SECRET and SHOAL_RUN_TOKEN for a rank of j. */
void srv__run_env(srv *s, const srv_job *j, json_t *env);
/* 1 with *tenant and *run set when tok is a run's token. */
int srv__run_token(srv *s, const char *tok, const char **tenant, const char **run);
/* /v1/runs/...: answers a GET in *reply, or fills *put for a PUT. */
int srv__run_routes(srv *s, srv_req *r, const char *rest, int *status, json_t **reply, srv_run_put *put);
/* Sets a published service in memory (after its write); *reply the answer. */
void srv__run_set(srv *s, srv_run_put *put, json_t **reply);
/* Appends data as one or more records; with repair, first cuts the file back
 * to its last whole record (a crash may have left a torn one). */
int srv__log_append(const char *path, const void *data, size_t len, int repair);
/* Appends to out the data of whole records from file offset off, stopping
 * once out holds max bytes or at the first incomplete or broken record;
 * *next is the offset after the last record read.  A missing file reads
 * as empty. */
int srv__log_read(const char *path, uint64_t off, size_t max, sh_buf *out, uint64_t *next);

#endif
