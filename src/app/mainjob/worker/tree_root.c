/* The push tree's root as a job of the main job (`shoal rl push-root`,
 * docs/mainjob.md): it waits for the trainer's first version in the store,
 * serves the store's run "main" in its node's zone, and announces itself in
 * PDIR/root.json (name, zone, addr: the tree's picture reads it) and then
 * PDIR/push.addr (the workers' replicas attach once it appears). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "shoal/fleetfile.h"
#include "shoal/store.h"
#include "worker_int.h"

/* The zone of `node` in the fleet file. */
static int node_zone(const char *fleet_csv, const char *node, char *zone, size_t cap)
{
    sh_fleet_file ff;
    SH_TRY(sh_fleet_load(fleet_csv, NULL, &ff));
    int rc = sh_err(SH_ENOENT, "push root: node \"%s\" is not in %s", node, fleet_csv);
    for (size_t i = 0; i < ff.n; i++)
        if (!strcmp(ff.nodes[i].name, node)) {
            snprintf(zone, cap, "%s", ff.nodes[i].zone);
            rc = 0;
        }
    sh_fleet_free(&ff);
    return rc;
}

static int announce(const char *pdir, const char *zone, const char *addr)
{
    char p[4200];
    json_t *j = json_pack("{s:s,s:s,s:s}", "name", "root", "zone", zone, "addr", addr);
    snprintf(p, sizeof p, "%s/root.json", pdir);
    int rc = j ? sh_json_write_atomic(p, j) : sh_err(SH_ENOMEM, "push root");
    json_decref(j);
    if (rc < 0) return rc;
    char line[160];
    int n = snprintf(line, sizeof line, "%s\n", addr);
    snprintf(p, sizeof p, "%s/push.addr", pdir);
    return sh_write_atomic(p, line, (size_t)n);
}

int mj_push_root(const mj_push_root_opts *o, volatile sig_atomic_t *stop)
{
    char zone[64], latest[4200];
    SH_TRY(node_zone(o->fleet, o->node, zone, sizeof zone));
    snprintf(latest, sizeof latest, "%s/main/LATEST", o->store);
    for (double end = sh_now_mono() + o->wait_s; !sh_path_exists(latest);) {
        if (*stop) return 0;
        if (sh_now_mono() > end)
            return sh_err(SH_ETIMEDOUT, "push root: no version in %s after %.0f s (the trainer publishes the first)",
                          o->store, o->wait_s);
        sh_sleep(0.1);
    }
    SH_TRY(sh_mkdir_p(o->pdir, 0755));
    bcast_config cfg = {.name = "root", .zone = zone};
    store_push_root *r;
    SH_TRY(store_push_root_new(o->store, "main", &cfg, &r));
    int rc = announce(o->pdir, zone, store_push_root_address(r));
    if (!rc && o->on_start) o->on_start(o->arg, zone, store_push_root_address(r));
    while (rc == 0 && !*stop) rc = store_push_root_step(r, 0.01);
    store_push_root_free(r);
    return rc;
}
