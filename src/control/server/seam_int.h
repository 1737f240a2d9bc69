/* The seam layer (seam.c): tells the scheduling core about nodes and jobs,
 * writes its bills, and settles them at a commit or a rollback.
 * A file includes the headers of its own layer and the layers below it
 * (scripts/check-layers.py, LAYERS). */
#ifndef SHOAL_SRV_SEAM_INT_H
#define SHOAL_SRV_SEAM_INT_H

#include "srv_int.h"

void srv__seam_free(srv *s);
/* 0 queued, 1 rejected as never fitting (why says so), < 0 error. */
int srv__seam_submit(srv *s, const srv_job *j, char *why, size_t cap);
void srv__seam_end(srv *s, const srv_job *j, int cancelled);
/* srv__seam_end at core time t, for a job whose `billed` closing bills are
 * in the ledger already (srv__seam_prebill). */
void srv__seam_end_at(srv *s, const srv_job *j, int cancelled, double t, int billed);
/* Before the commit of a change that ended jobs (the queue of
 * srv__undo_begin): writes the bills their end closes, in the same
 * transaction, so that an end is never durable without its bills. */
int srv__seam_prebill(srv *s);
int srv__seam_node(srv *s, int idx, int event);
/* Writes the core's closed bills to the ledger.  Inside a transaction they
 * stay in the core until it commits (srv__seam_bills_end), so that a
 * failed commit or a rollback loses none: they are written again. */
int srv__seam_bills(srv *s);
void srv__seam_bills_end(srv *s, int committed);
/* Commits (or rolls back) the transaction and drops the bills it wrote
 * from the core (or keeps them to be written again). */
int srv__commit(srv *s);
void srv__rollback(srv *s);

#endif
