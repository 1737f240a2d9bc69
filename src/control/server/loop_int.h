/* The loop layer (loop.c): the scheduler thread.
 * A file includes the headers of its own layer and the layers below it
 * (scripts/check-layers.py, LAYERS). */
#ifndef SHOAL_SRV_LOOP_INT_H
#define SHOAL_SRV_LOOP_INT_H

#include "srv_int.h"

/* loop.c: the scheduler thread */
int srv__sched_start(srv *s);             /* starts the scheduler thread */
void srv__free_state(srv *s);             /* frees the core, the jobs and the nodes */

#endif
