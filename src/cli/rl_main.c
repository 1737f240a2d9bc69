/* shoal rl trainer / shoal rl worker: the RL engine as control-plane jobs
 * (docs/mainjob.md).
 *
 * The trainer is a gang: every rank joins a UCX ring on MASTER_ADDR
 * (ports MASTER_PORT + rank); rank 0 listens for rollout workers on an
 * ephemeral TCP port, announces it in STORE/trainer.json together with the
 * rl options it runs with, publishes every version to the store and trains
 * on its share of each batch; the other ranks train on theirs.  A worker is
 * one replica of an elastic job: it looks up what GPU its node has in the
 * fleet file, waits for STORE/trainer.json, connects and serves rollouts. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"
#include "cli_rl.h"
#include "shoal/mainjob.h"
#include "shoal/store.h"

static const char trainer_usage[] =
    "usage: shoal rl trainer --store DIR [--events F] [--result F] [--ring-timeout S] [rl train options]\n"
    "One rank of the trainer gang (run by agents: SHOAL_RANK, SHOAL_WORLD_SIZE,\n"
    "MASTER_ADDR and MASTER_PORT say where it stands).  Rank 0 accepts rollout\n"
    "workers (`shoal rl worker`) announced through DIR/trainer.json, publishes\n"
    "every version to the store DIR (run \"main\"), appends one JSON line per step\n"
    "and evaluation to --events and writes the run's result to --result.  Ranks\n"
    "all-reduce gradients over a UCX ring (rendezvous in DIR/ring/).\n";

static const char worker_usage[] =
    "usage: shoal rl worker --store DIR --fleet FLEET.csv --speeds SPEEDS.csv [--push PDIR]\n"
    "                       [--node NAME] [--wait S] [--min-wait S]\n"
    "One rollout worker (a replica of an elastic job).  Its GPU type, price and\n"
    "declared speed are those of node NAME (default $SHOAL_NODE) in the fleet\n"
    "files; it waits up to S seconds (300) for DIR/trainer.json, connects, and\n"
    "generates trajectories until the trainer says STOP.\n"
    "With --push PDIR its weights come by the push tree whose root's address is\n"
    "in PDIR/push.addr: the worker is a replica (PDIR/replicas/NODE-PID) in its\n"
    "node's zone, logs each version's parent to PDIR/tree.jsonl, and refuses a\n"
    "request whose minimum version it cannot get within --min-wait S (5).\n"
    "Without it the weights come from the trainer over the RL socket (the\n"
    "direct transport, a baseline).\n";

typedef struct trainer_ctx {
    mj_train dp; /* first: rl_config.hook_ctx is also mj_train_step's ctx */
    store *st;
    const char *store_dir;
    FILE *events;
    double t0, delta_bytes, full_bytes, last_delta, image_bytes, publish_s;
    double store_bytes; /* payload bytes written to the store (deltas and anchors) */
    uint64_t base0;     /* the store's LATEST when the trainer started */
    long versions;
} trainer_ctx;

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* Policy version `version` becomes store version base0 + version + 1: the
 * image and the delta the trainer made for it go to the store as they are
 * (store_publish_mem: nothing is diffed again, no image is staged for a
 * delta version). */
static int on_publish(void *ctx, int version, const sh_buf *img, const sh_buf *delta)
{
    trainer_ctx *t = ctx;
    double t0 = sh_now_mono();
    uint64_t v;
    store_mem_version in = {img->data, img->len, delta->data, delta->len, t->base0 + (uint64_t)version};
    store_publish_opts o = {.anchor_every = 16};
    int rc = store_publish_mem(t->st, &in, &o, &v);
    if (rc) return sh_err_wrap(rc, "trainer: publishing version %d to %s", version, t->store_dir);
    store_version sv;
    if (store_get(t->st, v, &sv, NULL) == 0) t->store_bytes += (double)sv.size;
    t->image_bytes = (double)img->len;
    t->last_delta = (double)delta->len;
    t->delta_bytes += (double)delta->len;
    t->full_bytes += delta->len ? (double)img->len : 0;
    t->versions++;
    t->publish_s += sh_now_mono() - t0;
    return 0;
}

static void on_event(const json_t *ev, void *ctx)
{
    trainer_ctx *t = ctx;
    json_t *e = json_deep_copy(ev);
    json_object_set_new(e, "delta_bytes", json_real(t->last_delta));
    json_object_set_new(e, "image_bytes", json_real(t->image_bytes));
    json_object_set_new(e, "delta_bytes_total", json_real(t->delta_bytes));
    json_object_set_new(e, "full_bytes_total", json_real(t->full_bytes));
    json_object_set_new(e, "store_versions", json_integer(t->versions));
    json_object_set_new(e, "t", json_real(sh_now_wall()));
    if (t->events) {
        char *s = json_dumps(e, JSON_COMPACT);
        if (s) fprintf(t->events, "%s\n", s), fflush(t->events);
        free(s);
    }
    json_decref(e);
}

/* DIR/trainer.json: where workers connect and the options they must share. */
static int announce(const char *dir, const char *addr, int argc, char **argv, const char *state,
                    uint64_t base0)
{
    json_t *args = json_array();
    for (int i = 0; i < argc; i++) json_array_append_new(args, json_string(argv[i]));
    json_t *j = json_pack("{s:s,s:o,s:s,s:i,s:I}", "addr", addr, "args", args, "state", state, "pid",
                          (int)getpid(), "store_base", (json_int_t)base0);
    char path[4096];
    snprintf(path, sizeof path, "%s/trainer.json", dir);
    int rc = sh_json_write_atomic(path, j);
    json_decref(j);
    return rc;
}

static int listen_tcp(const char *host, char *addr, size_t cap, int *fd_out)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    if (fd < 0) return sh_err_errno(errno, "trainer: socket");
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        close(fd);
        return sh_err(SH_EINVAL, "trainer: MASTER_ADDR \"%s\" is not an IPv4 address", host);
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 64) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
        int e = errno;
        close(fd);
        return sh_err_errno(e, "trainer: listen on %s", host);
    }
    snprintf(addr, cap, "%s:%u", host, ntohs(sa.sin_port));
    *fd_out = fd;
    return 0;
}

/* Separates the trainer's own options from the rl train options. */
typedef struct trainer_opts {
    const char *store, *events, *result;
    double ring_timeout;
    char **rl;
    int nrl;
} trainer_opts;

static int trainer_args(int argc, char **argv, trainer_opts *o)
{
    o->rl = calloc((size_t)argc + 1, sizeof *o->rl);
    if (!o->rl) return sh_err(SH_ENOMEM, "out of memory");
    o->ring_timeout = 600;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int mine = !strcmp(a, "--store") || !strcmp(a, "--events") || !strcmp(a, "--result") ||
                   !strcmp(a, "--ring-timeout");
        if (!mine) {
            o->rl[o->nrl++] = argv[i];
            continue;
        }
        if (!v) return sh_err(SH_EINVAL, "%s needs a value", a);
        if (!strcmp(a, "--store")) o->store = v;
        else if (!strcmp(a, "--events")) o->events = v;
        else if (!strcmp(a, "--result")) o->result = v;
        else SH_TRY(sh_parse_double(v, &o->ring_timeout, a));
        i++;
    }
    if (!o->store) return sh_err(SH_EINVAL, "--store DIR is required");
    return 0;
}

static int trainer_rank0(const rl_config *c0, trainer_opts *o, mj_ring *ring, int world,
                         const char *host, json_t **res)
{
    rl_config c = *c0;
    trainer_ctx t = {.dp = {.ring = ring, .rank = 0, .world = world, .total_steps = c.steps},
                     .store_dir = o->store};
    char addr[64];
    int lfd = -1;
    int rc = sh_mkdir_p(o->store, 0755);
    if (!rc) rc = store_open(o->store, NULL, 1, &t.st);
    if (!rc) rc = store_latest(t.st, &t.base0);
    if (!rc) rc = listen_tcp(host, addr, sizeof addr, &lfd);
    if (!rc && o->events && !(t.events = fopen(o->events, "a")))
        rc = sh_err_errno(errno, "trainer: %s", o->events);
    if (!rc) rc = announce(o->store, addr, o->nrl, o->rl, "running", t.base0);
    if (!rc) {
        fprintf(stderr, "trainer: rank 0 of %d, workers connect to %s (announced in %s/trainer.json)\n",
                world, addr, o->store);
        c.remote = 1, c.listen_fd = lfd, c.drain_s = 15;
        c.on_publish = on_publish, c.train_fn = mj_train_step, c.hook_ctx = &t;
        rc = rl_run(&c, on_event, &t, res);
    }
    if (!rc) {
        json_object_set_new(*res, "ranks", json_integer(world));
        json_object_set_new(*res, "ranks_in_sync", json_boolean(t.dp.in_sync || world == 1));
        json_object_set_new(*res, "ring_bytes_sent_rank0", json_integer((json_int_t)mj_ring_bytes_sent(ring)));
        json_object_set_new(*res, "store_versions", json_integer(t.versions));
        json_object_set_new(*res, "delta_bytes_total", json_real(t.delta_bytes));
        json_object_set_new(*res, "full_bytes_total", json_real(t.full_bytes));
        json_object_set_new(*res, "store_bytes_total", json_real(t.store_bytes));
        json_object_set_new(*res, "store_base", json_integer((json_int_t)t.base0));
        json_object_set_new(*res, "publish_s", json_real(t.publish_s));
        if (o->result) rc = sh_json_write_atomic(o->result, *res);
    }
    announce(o->store, lfd >= 0 ? addr : "", o->nrl, o->rl, rc ? "failed" : "done", t.base0);
    if (lfd >= 0) close(lfd);
    if (t.events) fclose(t.events);
    store_close(t.st);
    return rc;
}

int cli_rl_trainer(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(trainer_usage, stdout), 0;
    trainer_opts o = {0};
    if (trainer_args(argc, argv, &o) < 0) {
        free(o.rl);
        return cli_usage("rl trainer", "%s", sh_errmsg());
    }
    rl_config c;
    rl_config_default(&c);
    c.quiet = 1;
    int json = 0, rc = cli_rl_parse("rl trainer", o.nrl, o.rl, &c, &json);
    int rank = env_int("SHOAL_RANK", 0), world = env_int("SHOAL_WORLD_SIZE", 1);
    const char *host = getenv("MASTER_ADDR") ? getenv("MASTER_ADDR") : "127.0.0.1";
    int port = env_int("MASTER_PORT", 0);
    if (!rc && world > 1 && !getenv("SHOAL_JOB_ID"))
        rc = cli_usage("rl trainer", "SHOAL_JOB_ID is not set: run it as a gang job");
    if (rc) {
        free(o.rl);
        return rc;
    }
    mj_ring *ring = NULL;
    json_t *res = NULL;
    int in_sync = 0;
    long steps = 0;
    /* Ring rendezvous in the store folder, one per job attempt: fixed ports
     * could be taken by anyone on the machine. */
    char rdv[4200];
    snprintf(rdv, sizeof rdv, "%s/ring/%s-%s", o.store, getenv("SHOAL_JOB_ID") ?: "0",
             getenv("SHOAL_ATTEMPT") ?: "0");
    rc = mj_ring_new(rank, world, host, port, rdv, o.ring_timeout, &ring);
    if (!rc && rank == 0) rc = trainer_rank0(&c, &o, ring, world, host, &res);
    else if (!rc) rc = mj_train_follow(&(mj_train){.ring = ring, .rank = rank, .world = world}, &c,
                                       &steps, &in_sync);
    mj_ring_free(ring);
    free(o.rl);
    if (rc < 0) return cli_fail("rl trainer", rc);
    if (rank == 0 && json) sh_json_print(res);
    else if (rank == 0)
        printf("trainer: %d ranks, %d steps, held-out reward %.3f -> %.3f, version %d, ranks in sync: %s\n",
               world, (int)json_integer_value(json_object_get(res, "steps")),
               json_number_value(json_object_get(res, "reward_start")),
               json_number_value(json_object_get(res, "reward_end")),
               (int)json_integer_value(json_object_get(res, "final_version")),
               json_is_true(json_object_get(res, "ranks_in_sync")) ? "yes" : "NO");
    else
        printf("trainer: rank %d trained %ld steps; weights equal to rank 0's: %s\n", rank, steps,
               in_sync ? "yes" : "NO");
    json_decref(res);
    return rank == 0 || in_sync ? 0 : 1;
}

/* Waits for DIR/trainer.json to say "running"; 1 if it says the run is
 * over, 0 with *out set when it runs. */
static int wait_trainer(const char *dir, double wait_s, json_t **out)
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

static int connect_to(const char *addr, int *fd_out)
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
static int open_weights(const char *pdir, const char *node, const char *zone, uint64_t base,
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

int cli_rl_worker(int argc, char **argv)
{
    const char *store_dir = NULL, *fleet = NULL, *speeds = NULL, *node = getenv("SHOAL_NODE");
    const char *push = NULL;
    double wait_s = 300, min_wait = 5;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return fputs(worker_usage, stdout), 0;
        if (!v) return cli_usage("rl worker", "unknown option or missing value \"%s\"", a);
        if (!strcmp(a, "--store")) store_dir = v;
        else if (!strcmp(a, "--fleet")) fleet = v;
        else if (!strcmp(a, "--speeds")) speeds = v;
        else if (!strcmp(a, "--node")) node = v;
        else if (!strcmp(a, "--push")) push = v;
        else if (!strcmp(a, "--wait") || !strcmp(a, "--min-wait")) {
            if (sh_parse_double(v, !strcmp(a, "--wait") ? &wait_s : &min_wait, a) < 0)
                return cli_usage("rl worker", "%s", sh_errmsg());
        } else return cli_usage("rl worker", "unknown option \"%s\"", a);
        i++;
    }
    if (!store_dir || !fleet || !speeds) return cli_usage("rl worker", "--store_dir, --fleet and --speeds are required");
    if (!node) return cli_usage("rl worker", "no --node and SHOAL_NODE is not set (run it as a job, or name the node)");
    mj_fleet f;
    int rc = mj_fleet_load(fleet, speeds, &f);
    if (rc < 0) return cli_fail("rl worker", rc);
    const mj_node *n = mj_fleet_node(&f, node);
    if (!n) {
        mj_fleet_free(&f);
        return cli_usage("rl worker", "node \"%s\" is not in %s", node, fleet);
    }
    rl_worker_spec me = {.speed = n->speed, .price = n->price};
    snprintf(me.name, sizeof me.name, "%s", n->gpu_type);
    char zone[64];
    snprintf(zone, sizeof zone, "%s", n->zone);
    mj_fleet_free(&f);
    json_t *tj = NULL;
    rc = wait_trainer(store_dir, wait_s, &tj);
    if (rc == 1) {
        fprintf(stderr, "worker: the trainer has finished; nothing to do\n");
        return 0;
    }
    if (rc < 0) return cli_fail("rl worker", rc);
    json_t *args = json_object_get(tj, "args");
    int na = (int)json_array_size(args), json = 0;
    char **av = calloc((size_t)na + 1, sizeof *av);
    for (int i = 0; av && i < na; i++) av[i] = (char *)json_string_value(json_array_get(args, i));
    rl_config c;
    rl_config_default(&c);
    rc = av ? cli_rl_parse("rl worker", na, av, &c, &json) : 1;
    int fd = -1;
    if (!rc && connect_to(json_string_value(json_object_get(tj, "addr")), &fd) < 0) {
        free(av);
        json_decref(tj);
        return cli_fail("rl worker", SH_EIO);
    }
    if (rc) return rc;
    mj_weights *mw = NULL;
    if (push) {
        uint64_t base = (uint64_t)json_integer_value(json_object_get(tj, "store_base"));
        rc = open_weights(push, node, zone, base, min_wait, &mw);
        if (rc < 0) return cli_fail("rl worker", rc);
    }
    fprintf(stderr, "worker: %s (speed %.2f, $%.2f/h) on %s in %s connected to the trainer at %s; weights %s\n",
            me.name, me.speed, me.price, node, zone, json_string_value(json_object_get(tj, "addr")),
            mw ? "by the push tree" : "from the trainer (direct)");
    fflush(stderr);
    /* Never returns: av, tj and mw stay alive for the process's life. */
    rl_worker_serve_from(&c, &me, fd, mw ? mj_weights_source(mw) : NULL);
}
