/* shoal cost: what the fleet has cost, by tenant and GPU type. */
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_cost[] = "costs by tenant and GPU type from the billing ledger [--json]";

static const char usage[] = "usage: shoal cost [--server URL] [--token T] [--json]\n\n"
                            "A tenant's token shows its own costs; the admin token shows all.\n";

int cli_cmd_cost(int argc, char **argv)
{
    json_t *reply;
    int rc = cli_ctl_get_table("cost", argc, argv, usage, "/v1/costs", &reply);
    if (rc >= 0) return rc;
    printf("%-14s %-10s %12s %12s\n", "TENANT", "GPU", "GPU-HOURS", "DOLLARS");
    const char *t, *g;
    json_t *by, *v;
    json_object_foreach(json_object_get(reply, "by_tenant"), t, by) json_object_foreach(by, g, v)
        printf("%-14.14s %-10.10s %12.4f %12.4f\n", t, g, json_real_value(json_object_get(v, "gpu_seconds")) / 3600,
               json_real_value(json_object_get(v, "dollars")));
    printf("%-14s %-10s %12s %12.4f\n", "total", "", "", json_real_value(json_object_get(reply, "total_dollars")));
    json_decref(reply);
    return 0;
}
