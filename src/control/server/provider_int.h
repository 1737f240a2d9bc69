/* The provider layer (provider.c): cloud nodes made and removed (`provider`
 * in the config).
 * A file includes the headers of its own layer and the layers below it
 * (scripts/check-layers.py, LAYERS). */
#ifndef SHOAL_SRV_PROVIDER_INT_H
#define SHOAL_SRV_PROVIDER_INT_H

#include "srv_int.h"

/* provider.c: autoscaling hook */
int srv__provider_config(srv *s, sched_config *c);
int srv__provider_create(srv *s, const char *zone, const char *fabric, const char *gpu_type, int n);
int srv__provider_delete(srv *s, const char *node);
void srv__provider_tick(srv *s, double now);

#endif
