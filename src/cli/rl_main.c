/* shoal rl trainer / worker / push-root: the main job's processes, run as
 * control-plane jobs (docs/mainjob.md): options and what is printed.  The
 * trainer is src/app/mainjob/trainer/ (mj_trainer_main), the worker
 * src/app/mainjob/worker/mj_worker.c (mj_worker_main) with its serving in
 * src/rl/engine/worker.c, the push root worker/tree_root.c (mj_push_root). */
#include <float.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"
#include "cli_rl_int.h"
#include "app/mainjob/trainer/trainer_int.h"
#include "app/mainjob/worker/worker_int.h"

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
    mj_trainer_outcome r;
    mj_trainer_proc mo = {o.store, o.events, o.result, o.ring_timeout, o.rl, o.nrl, on_listen, &r.world};
    rc = mj_trainer_main(&c, &mo, &r);
    free(o.rl);
    if (rc < 0) return cli_fail("rl trainer", rc);
    json_t *res = r.res;
    if (r.rank == 0 && json) sh_json_print(res);
    else if (r.rank == 0)
        printf("trainer: %d ranks, %d steps, held-out reward %.3f -> %.3f, version %d, ranks in sync: %s\n",
               r.world, (int)json_integer_value(json_object_get(res, "steps")),
               json_number_value(json_object_get(res, "reward_start")),
               json_number_value(json_object_get(res, "reward_end")),
               (int)json_integer_value(json_object_get(res, "final_version")),
               json_is_true(json_object_get(res, "ranks_in_sync")) ? "yes" : "NO");
    else
        printf("trainer: rank %d trained %ld steps; weights equal to rank 0's: %s\n", r.rank, r.steps,
               r.in_sync ? "yes" : "NO");
    json_decref(res);
    return r.rank == 0 || r.in_sync ? 0 : 1;
}

/* The trainer's rl options, as `rl train` parses them. */
static int worker_parse(void *arg, int argc, char **argv, rl_config *c)
{
    (void)arg;
    int json = 0;
    return cli_rl_parse("rl worker", argc, argv, c, &json) ? sh_err(SH_EINVAL, "the trainer's options "
                                                                               "(trainer.json \"args\") do not parse")
                                                           : 0;
}

static void say(void *arg, const char *line)
{
    (void)arg;
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

int cli_rl_worker(int argc, char **argv)
{
    mj_worker_proc o = {.node = getenv("SHOAL_NODE"), .wait_s = 300, .min_wait = 5, .parse = worker_parse, .say = say};
    static const struct option opts[] = {{"store", required_argument, 0, 's'}, {"fleet", required_argument, 0, 'f'},
                                         {"speeds", required_argument, 0, 'S'}, {"node", required_argument, 0, 'n'},
                                         {"push", required_argument, 0, 'p'},   {"wait", required_argument, 0, 'w'},
                                         {"min-wait", required_argument, 0, 'm'}, {0}};
    cli_args a = {"rl worker", worker_usage, opts, NULL};
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;) {
        switch (k) {
        case 's': o.store = optarg; break;
        case 'f': o.fleet = optarg; break;
        case 'S': o.speeds = optarg; break;
        case 'n': o.node = optarg; break;
        case 'p': o.push = optarg; break;
        case 'w':
        case 'm':
            if (cli_real(a.cmd, k == 'w' ? "--wait" : "--min-wait", optarg, 0, DBL_MAX, "seconds >= 0",
                         k == 'w' ? &o.wait_s : &o.min_wait))
                return CLI_USAGE;
            break;
        default: return a.rc;
        }
    }
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    if (!o.store || !o.fleet || !o.speeds) return cli_usage("rl worker", "--store, --fleet and --speeds are required");
    if (!o.node) return cli_usage("rl worker", "no --node and SHOAL_NODE is not set (run it as a job, or name the node)");
    int rc = mj_worker_main(&o);
    if (rc == 1) fprintf(stderr, "worker: the trainer has finished; nothing to do\n");
    if (rc == SH_EINVAL) return cli_usage("rl worker", "%s", sh_errmsg());
    return rc == 1 ? 0 : cli_fail("rl worker", rc);
}

static const char push_root_usage[] =
    "usage: shoal rl push-root --store DIR --fleet FLEET.csv --push PDIR [--node NAME] [--wait S]\n"
    "The push tree's root for a main job, run as a job of its own: waits up to S\n"
    "seconds (300) for the trainer's first version in the store DIR, serves its run\n"
    "\"main\" in the zone of node NAME (default $SHOAL_NODE) of the fleet file, and\n"
    "announces itself in PDIR/root.json and PDIR/push.addr, where the rollout\n"
    "workers' replicas find it.  Serves until SIGTERM.  SHOAL_RUN_SECRET, when set,\n"
    "is what replicas must present (docs/security.md).\n";

static volatile sig_atomic_t g_stop;
static void on_term(int sig) { g_stop = sig; }

static void on_root(void *arg, const char *zone, const char *addr)
{
    fprintf(stderr, "push root: serving %s in %s on %s\n", (const char *)arg, zone, addr);
}

int cli_rl_push_root(int argc, char **argv)
{
    mj_push_root_opts o = {.node = getenv("SHOAL_NODE"), .wait_s = 300, .on_start = on_root};
    static const struct option opts[] = {{"store", required_argument, 0, 's'}, {"fleet", required_argument, 0, 'f'},
                                         {"push", required_argument, 0, 'p'},  {"node", required_argument, 0, 'n'},
                                         {"wait", required_argument, 0, 'w'},  {0}};
    cli_args a = {"rl push-root", push_root_usage, opts, NULL};
    for (int k; (k = cli_getopt(&a, argc, argv)) != -1;)
        if (k == 's') o.store = optarg;
        else if (k == 'f') o.fleet = optarg;
        else if (k == 'p') o.pdir = optarg;
        else if (k == 'n') o.node = optarg;
        else if (k != 'w') return a.rc;
        else if (cli_real(a.cmd, "--wait", optarg, 0, DBL_MAX, "seconds >= 0", &o.wait_s)) return CLI_USAGE;
    if (optind < argc) return cli_usage(a.cmd, "unexpected argument \"%s\"", argv[optind]);
    if (!o.store || !o.fleet || !o.pdir) return cli_usage(a.cmd, "--store, --fleet and --push are required");
    if (!o.node) return cli_usage(a.cmd, "no --node and SHOAL_NODE is not set (run it as a job, or name the node)");
    o.arg = (void *)o.store;
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    int rc = mj_push_root(&o, &g_stop);
    return rc < 0 ? cli_fail("rl push-root", rc) : 0;
}
