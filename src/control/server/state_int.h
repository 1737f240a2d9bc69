/* The state layer (state.c): the only code that changes the model (starts,
 * ends, requeues, grows, shrinks, failures, undo) and the JSON views of
 * jobs and nodes.
 * A file includes the headers of its own layer and the layers below it
 * (scripts/check-layers.py, LAYERS). */
#ifndef SHOAL_SRV_STATE_INT_H
#define SHOAL_SRV_STATE_INT_H

#include "srv_int.h"

/* state.c: builds a loaded job and adds it to the tables. */
int srv__job_from_row(srv *s, const srv_job_row *r);
void srv__changed(srv *s);
/* Starts job j's members on nodes[0..n) with the device masks the core chose. */
int srv__start(srv *s, srv_job *j, const int *nodes, const uint64_t *masks, int n);
/* GPUs the core has placed work on, node idx (0 for a node it does not know). */
int srv__node_used(srv *s, int idx);
int srv__finish(srv *s, srv_job *j, int state, int exit_code, const char *reason);
int srv__member_end(srv *s, srv_job *j, srv_member *m, int state, int code);
int srv__node_dead(srv *s, int idx, const char *why);
void srv__heartbeats(srv *s, double now);
int srv__time_limits(srv *s, double wall);
double srv__ends_by(const srv *s, const srv_job *j);
double srv__est_grace(const srv *s);
int srv__cancel(srv *s, srv_job *j, const char *who);
/* viewer: the tenant who asks (NULL: the admin), whose view names no
 * other tenant's job. */
json_t *srv__job_json(srv *s, const srv_job *j, int full, const char *viewer);
/* Every node not gone, with the work placed on it (tenant: others hidden). */
json_t *srv__nodes_json(srv *s, const char *tenant);
int srv__job_from_spec(json_t *spec, const char *tenant, srv_job **out);
void srv__undo_begin(srv *s, srv_undo *u);
int srv__undo_job(srv *s, srv_undo *u, srv_job *j);
int srv__undo_node(srv *s, srv_undo *u, int idx);
/* committed: flush the deferred core updates; else restore what was saved. */
void srv__undo_end(srv *s, srv_undo *u, int committed);
int srv__grow(srv *s, srv_job *j, const int *nodes, const uint64_t *masks, int n);
int srv__shrink(srv *s, srv_job *j, const int *nodes, const uint64_t *masks, int n);
int srv__requeue(srv *s, srv_job *j, const char *why, int failed);
/* state.c: moves job j on after its members changed (barrier, running,
 * ended), and fails the jobs whose failed rank has waited out
 * SRV_FAIL_SETTLE_S. */
int srv__job_eval(srv *s, srv_job *j);
int srv__settle_failures(srv *s);

#endif
