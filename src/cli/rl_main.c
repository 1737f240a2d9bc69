/* shoal rl trainer / shoal rl worker: the RL engine as control-plane jobs
 * (docs/mainjob.md): options, environment and what is printed.  The
 * trainer's rank 0 is src/app/mainjob/trainer.c, the other ranks
 * src/app/mainjob/train.c; the worker's joining is src/app/mainjob/mj_worker.c and its
 * serving src/rl/engine/worker.c. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "cli_rl_int.h"
#include "app/mainjob/mainjob_int.h"

static const char trainer_usage[] =
    "usage: shoal rl trainer --store DIR [--events F] [--result F] [--ring-timeout S] [rl train options]\n"
    "One rank of the trainer gang (run by agents: SHOAL_RANK, SHOAL_WORLD_SIZE,\n"
    "MASTER_ADDR and MASTER_PORT say where it stands).  Rank 0 accepts rollout\n"
    "workers (`shoal rl worker`) announced through DIR/trainer.json, publishes\n"
    "every version to the store DIR (run \"main\"), appends one JSON line per step\n"
    "and evaluation to --events and writes the run's result to --result.  Ranks\n"
    "all-reduce gradients over a UCX ring (rendezvous in DIR/ring/).\n"
    "With SHOAL_RUN_SECRET (32 hex digits) in the environment, rank 0 takes only\n"
    "workers that present it and the ring's messages are keyed with it\n"
    "(docs/security.md).\n";

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
    "direct transport, a baseline).  SHOAL_RUN_SECRET, when set, is presented to\n"
    "the trainer and in the push tree: the run's processes share it.\n";

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* Separates the trainer's own options from the rl train options. */
typedef struct cli_trainer_opts {
    const char *store, *events, *result;
    double ring_timeout;
    char **rl;
    int nrl;
} cli_trainer_opts;

/* Reads the trainer's own options into o and the rl train options into c,
 * and keeps the latter as given in o->rl for the workers: -1, or the status
 * to exit with. */
static int trainer_args(int argc, char **argv, cli_trainer_opts *o, rl_config *c, int *json)
{
    static const struct option opts[] = {{"store", required_argument, 0, 's'}, {"events", required_argument, 0, 'e'},
                                         {"result", required_argument, 0, 'r'},
                                         {"ring-timeout", required_argument, 0, 't'}, {0}};
    o->rl = calloc((size_t)argc + 1, sizeof *o->rl);
    if (!o->rl) return cli_fail("rl trainer", sh_err(SH_ENOMEM, "out of memory"));
    o->ring_timeout = 600;
    cli_args a = {"rl trainer", trainer_usage, opts, NULL, cli_rl_opts};
    int rc;
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;) {
        switch (k) {
        case 's': o->store = optarg; continue;
        case 'e': o->events = optarg; continue;
        case 'r': o->result = optarg; continue;
        case 't':
            if (cli_real(a.cmd, "--ring-timeout", optarg, DBL_TRUE_MIN, DBL_MAX, "seconds > 0", &o->ring_timeout))
                return CLI_USAGE;
            continue;
        case CLI_OPT_EXIT: return a.rc;
        }
        if (k == CLI_RL_JSON) *json = 1;
        else if ((rc = cli_rl_opt(a.cmd, k, optarg, c))) return rc;
        /* As given: "--opt=value", or "--opt" and its value. */
        if (optarg && optarg == argv[optind - 1]) o->rl[o->nrl++] = argv[optind - 2];
        o->rl[o->nrl++] = argv[optind - 1];
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    if (!o->store) return cli_usage(a.cmd, "--store DIR is required");
    return (rc = cli_rl_check(a.cmd, c)) ? rc : -1;
}

static void on_listen(void *arg, const char *addr)
{
    fprintf(stderr, "trainer: rank 0 of %d, workers connect to %s (announced in trainer.json)\n", *(int *)arg, addr);
}

int cli_rl_trainer(int argc, char **argv)
{
    cli_trainer_opts o = {0};
    rl_config c;
    rl_config_default(&c);
    c.quiet = 1;
    int json = 0, rc = trainer_args(argc, argv, &o, &c, &json);
    if (rc >= 0) {
        free(o.rl);
        return rc;
    }
    rc = 0;
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
    mj_trainer_opts mo = {o.store, o.events, o.result, o.rl, o.nrl, on_listen, &world};
    if (!rc && rank == 0) rc = mj_trainer_rank0(&c, &mo, ring, world, host, &res);
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

int cli_rl_worker(int argc, char **argv)
{
    const char *store_dir = NULL, *fleet = NULL, *speeds = NULL, *node = getenv("SHOAL_NODE");
    const char *push = NULL;
    double wait_s = 300, min_wait = 5;
    static const struct option opts[] = {{"store", required_argument, 0, 's'}, {"fleet", required_argument, 0, 'f'},
                                         {"speeds", required_argument, 0, 'S'}, {"node", required_argument, 0, 'n'},
                                         {"push", required_argument, 0, 'p'},   {"wait", required_argument, 0, 'w'},
                                         {"min-wait", required_argument, 0, 'm'}, {0}};
    cli_args a = {"rl worker", worker_usage, opts, NULL};
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;) {
        switch (k) {
        case 's': store_dir = optarg; break;
        case 'f': fleet = optarg; break;
        case 'S': speeds = optarg; break;
        case 'n': node = optarg; break;
        case 'p': push = optarg; break;
        case 'w':
        case 'm':
            if (cli_real(a.cmd, k == 'w' ? "--wait" : "--min-wait", optarg, 0, DBL_MAX, "seconds >= 0",
                         k == 'w' ? &wait_s : &min_wait))
                return CLI_USAGE;
            break;
        default: return a.rc;
        }
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    if (!store_dir || !fleet || !speeds) return cli_usage("rl worker", "--store, --fleet and --speeds are required");
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
    rc = mj_trainer_wait(store_dir, wait_s, &tj);
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
    if (!rc && mj_trainer_connect(json_string_value(json_object_get(tj, "addr")), &fd) < 0) {
        free(av);
        json_decref(tj);
        return cli_fail("rl worker", SH_EIO);
    }
    if (rc) return rc;
    mj_weights *mw = NULL;
    if (push) {
        uint64_t base = (uint64_t)json_integer_value(json_object_get(tj, "store_base"));
        rc = mj_worker_weights(push, node, zone, base, min_wait, &mw);
        if (rc < 0) return cli_fail("rl worker", rc);
    }
    fprintf(stderr, "worker: %s (speed %.2f, $%.2f/h) on %s in %s connected to the trainer at %s; weights %s\n",
            me.name, me.speed, me.price, node, zone, json_string_value(json_object_get(tj, "addr")),
            mw ? "by the push tree" : "from the trainer (direct)");
    fflush(stderr);
    /* Never returns: av, tj and mw stay alive for the process's life. */
    rl_worker_serve_from(&c, &me, fd, mw ? mj_weights_source(mw) : NULL);
}
