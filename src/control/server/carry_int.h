/* The carry layer (carry.c): rebuilds the scheduling core from the model
 * and carries out `sched_step`'s decisions.
 * A file includes the headers of its own layer and the layers below it
 * (scripts/check-layers.py, LAYERS). */
#ifndef SHOAL_SRV_CARRY_INT_H
#define SHOAL_SRV_CARRY_INT_H

#include "srv_int.h"

/* Makes the scheduling core from the model (at start and after a failed
 * commit), and runs one cycle of it, carrying out its decisions. */
int srv__seam_init(srv *s);
int srv__seam_step(srv *s, double now);

#endif
