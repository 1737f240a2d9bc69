/* shoal nodes: the fleet as a table. */
#include <string.h>

#include "cli_int.h"
#include "ctl_int.h"

const char cli_help_nodes[] = "list the fleet's nodes: GPUs, zone, fabric, state, price [--json]";

static const char usage[] = "usage: shoal nodes [--server URL] [--token T] [--json]\n";

int cli_cmd_nodes(int argc, char **argv)
{
    json_t *reply;
    int rc = cli_ctl_get_table("nodes", argc, argv, usage, "/v1/nodes", &reply);
    if (rc >= 0) return rc;
    printf("%-16s %-8s %5s %-10s %-10s %-6s %8s %-7s %s\n", "NAME", "GPU", "USED", "ZONE", "FABRIC", "STATE", "$/GPU-H",
           "SANDBOX", "JOBS");
    size_t i, k;
    json_t *n, *j;
    json_array_foreach(json_object_get(reply, "nodes"), i, n) {
        char used[16], jobs[256] = "";
        snprintf(used, sizeof used, "%lld/%lld", (long long)json_integer_value(json_object_get(n, "gpus_used")),
                 (long long)json_integer_value(json_object_get(n, "gpus")));
        json_array_foreach(json_object_get(n, "jobs"), k, j) {
            size_t l = strlen(jobs);
            long long id = json_integer_value(json_object_get(j, "job"));
            if (id) snprintf(jobs + l, sizeof jobs - l, "%s%lld/%lld", l ? "," : "", id, (long long)json_integer_value(json_object_get(j, "rank")));
            else snprintf(jobs + l, sizeof jobs - l, "%s(other)", l ? "," : "");
        }
        /* The sandbox mode: the agent's description up to its details
         * (`shoal nodes --json` has all of it). */
        const char *sb = json_string_value(json_object_get(n, "sandbox"));
        int sbl = sb ? (int)strcspn(sb, "(+") : 0;
        printf("%-16.16s %-8.8s %5s %-10.10s %-10.10s %-6s %8.2f %-7.*s %s\n", json_string_value(json_object_get(n, "name")),
               json_string_value(json_object_get(n, "gpu_type")), used, json_string_value(json_object_get(n, "zone")),
               json_string_value(json_object_get(n, "fabric")), json_string_value(json_object_get(n, "state")),
               json_real_value(json_object_get(n, "price_per_gpu_hour")), sbl, sb ? sb : "", jobs[0] ? jobs : "-");
    }
    json_decref(reply);
    return 0;
}
