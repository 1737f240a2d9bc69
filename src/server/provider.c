/* Autoscaling through a provider hook (docs/server-api.md, "Provider hook"). */
#include "srv_int.h"

void srv__provider_tick(srv *s, double now)
{
    if (!s->cfg.provider_cmd) return;
}
