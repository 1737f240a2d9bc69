/* A rollout worker's side of the main job (`shoal rl worker`,
 * docs/mainjob.md): finding the trainer through its rendezvous file,
 * connecting, and its replica on the push tree (weights.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "worker_int.h"

/* Waits for DIR/trainer.json to say "running"; 1 if it says the run is
 * over, 0 with *out set when it runs. */
int mj_trainer_wait(const char *dir, double wait_s, json_t **out)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/trainer.json", dir);
    double deadline = sh_now_mono() + wait_s;
    for (;;) {
        json_t *j = NULL;
        if (sh_path_exists(path) && sh_json_load_file(path, 1 << 20, &j) == 0) {
            const char *st = json_string_value(json_object_get(j, "state"));
            if (st && !strcmp(st, "running")) {
                *out = j;
                return 0;
            }
            json_decref(j);
            if (st) return 1;
        }
        if (sh_now_mono() > deadline)
            return sh_err(SH_ETIMEDOUT, "%s: no trainer announced itself within %.0f s (is the trainer job running with --store %s?)",
                          path, wait_s, dir);
        sh_sleep(0.2);
    }
}

int mj_trainer_connect(const char *addr, int *fd_out)
{
    char host[64];
    int port;
    if (sscanf(addr, "%63[^:]:%d", host, &port) != 2)
        return sh_err(SH_EFORMAT, "trainer.json: addr \"%s\" is not HOST:PORT", addr);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return sh_err(SH_EFORMAT, "trainer.json: \"%s\" is not an IPv4 address", host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return sh_err_errno(errno, "worker: socket");
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        return sh_err_errno(e, "worker: connect to the trainer at %s", addr);
    }
    *fd_out = fd;
    return 0;
}

/* The worker's replica on the push tree whose root PDIR/push.addr names. */
/* The worker's replica on the push tree whose root PDIR/push.addr names
 * (now or later: the worker serves the trainer meanwhile). */
int mj_worker_weights(const char *pdir, const char *node, const char *zone, uint64_t base,
                        double min_wait, mj_weights **out)
{
    char addr_file[4096], dir[4096], log[4096];
    snprintf(addr_file, sizeof addr_file, "%s/push.addr", pdir);
    /* Replicas of one node (one per GPU) run in private process namespaces
     * and may share a pid: the job's rank names them, a fresh folder keeps
     * them apart. */
    char name[64];
    const char *rank = getenv("SHOAL_RANK");
    if (rank) snprintf(name, sizeof name, "%s-r%s", node, rank);
    else snprintf(name, sizeof name, "%s-%ld", node, (long)getpid());
    snprintf(dir, sizeof dir, "%s/replicas", pdir);
    int rc = sh_mkdir_p(dir, 0755);
    if (rc < 0) return rc;
    snprintf(dir, sizeof dir, "%s/replicas/%s-XXXXXX", pdir, name);
    if (!mkdtemp(dir)) return sh_err_errno(errno, "replica folder %s", dir);
    snprintf(log, sizeof log, "%s/tree.jsonl", pdir);
    mj_weights_config wc = {.dir = dir, .parent_file = addr_file, .zone = zone, .name = name,
                            .tree_log = log, .store_base = base, .min_wait_s = min_wait};
    return mj_weights_open(&wc, out);
}


/* The worker's GPU from its node's line in the fleet files: *me and *zone. */
static int whoami(const mj_worker_proc *o, rl_worker_spec *me, char *zone, size_t cap)
{
    mj_fleet f;
    SH_TRY(mj_fleet_load(o->fleet, o->speeds, &f));
    const mj_node *n = mj_fleet_node(&f, o->node);
    int rc = n ? 0 : sh_err(SH_EINVAL, "node \"%s\" is not in %s", o->node, o->fleet);
    if (n) {
        *me = (rl_worker_spec){.speed = n->speed, .price = n->price};
        snprintf(me->name, sizeof me->name, "%s", n->gpu_type);
        snprintf(zone, cap, "%s", n->zone);
    }
    mj_fleet_free(&f);
    return rc;
}

int mj_worker_main(const mj_worker_proc *o)
{
    rl_worker_spec me;
    char zone[64], line[512];
    SH_TRY(whoami(o, &me, zone, sizeof zone));
    json_t *tj = NULL;
    int rc = mj_trainer_wait(o->store, o->wait_s, &tj);
    if (rc) return rc; /* 1: the trainer has finished */
    /* The trainer's rl options, parsed as the trainer parsed them. */
    json_t *args = json_object_get(tj, "args");
    int na = (int)json_array_size(args), fd = -1;
    char **av = calloc((size_t)na + 1, sizeof *av);
    for (int i = 0; av && i < na; i++) av[i] = (char *)json_string_value(json_array_get(args, i));
    rl_config c;
    rl_config_default(&c);
    rc = av ? o->parse(o->arg, na, av, &c) : sh_err(SH_ENOMEM, "rl worker");
    free(av);
    const char *addr = json_string_value(json_object_get(tj, "addr"));
    if (!rc) rc = mj_trainer_connect(addr, &fd);
    mj_weights *mw = NULL;
    if (!rc && o->push)
        rc = mj_worker_weights(o->push, o->node, zone,
                               (uint64_t)json_integer_value(json_object_get(tj, "store_base")), o->min_wait, &mw);
    if (!rc && o->say) {
        snprintf(line, sizeof line, "worker: %s (speed %.2f, $%.2f/h) on %s in %s connected to the trainer at %s; "
                                    "weights %s", me.name, me.speed, me.price, o->node, zone, addr,
                 mw ? "by the push tree" : "from the trainer (direct)");
        o->say(o->arg, line);
    }
    if (rc) {
        if (fd >= 0) close(fd);
        json_decref(tj);
        return rc;
    }
    /* Never returns: tj and mw stay alive for the process's life. */
    rl_worker_serve_from(&c, &me, fd, mw ? mj_weights_source(mw) : NULL);
}
