/* The main job's weight path: rollout workers as replicas on the push tree.
 *
 * One run, real processes: the trainer (`shoal rl trainer`, one rank), the
 * push root over its store, and `shoal rl worker --push` replicas in two
 * zones.  In it:
 * - the root starts late, so the first requests ask for a version no worker
 *   can get in time: they are refused and asked again, never trained on
 *   (every step still trains, within the staleness bound);
 * - the relay of zone a is killed once version 3 is out: its child
 *   re-attaches and keeps producing;
 * - a worker joins zone a after that, with nothing: it goes straight to its
 *   zone's relay, which serves it the anchor and what it holds after it
 *   within the zone (nothing crosses the zone's boundary again for it);
 * - a worker joins zone c at the same time, the first of its zone: the root
 *   catches it up with the anchor and one squashed delta, and it stays the
 *   zone's relay;
 * - the run's processes share a secret (SHOAL_RUN_SECRET): a worker of
 *   another tenant, with another secret, connects to the trainer and is
 *   refused;
 * - every worker still running at the end holds the trainer's last image,
 *   byte for byte, and the summary says so. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app/mainjob/mainjob.h"
#include "app/mainjob/fleetcost/fleetcost_int.h"
#include "app/mainjob/report/report_int.h"
#include "app/mainjob/trainer/trainer_int.h"
#include "app/mainjob/worker/worker_int.h"
#include "shoal/rl.h"
#include "shoal/store.h"
#include "testutil.h"

static const char fleet_csv[] =
    "name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n"
    "za-0,A100,1,zone-a,eth-a,2.50\n"
    "za-1,A100,1,zone-a,eth-a,2.50\n"
    "za-2,A100,1,zone-a,eth-a,2.50\n"
    "zb-0,L4,1,zone-b,eth-b,0.80\n"
    "zc-0,L4,1,zone-c,eth-c,0.80\n";
static const char speeds_csv[] = "gpu_type,speed\nA100,0.7\nL4,0.5\n";

/* Starts `shoal ARGS...` with stdout and stderr to log; returns its pid. */
static pid_t spawn(const char *log, char *const args[])
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        freopen(log, "w", stdout);
        freopen(log, "a", stderr);
        char *argv[40] = {(char *)tu_shoal()};
        for (int i = 0; args[i] && i < 38; i++) argv[i + 1] = args[i];
        execv(tu_shoal(), argv);
        _exit(127);
    }
    return pid;
}

static void stop(pid_t pid, int sig)
{
    if (pid <= 0) return;
    kill(pid, sig);
    int st;
    for (int i = 0; i < 100 && waitpid(pid, &st, WNOHANG) == 0; i++) sh_sleep(0.05);
    if (waitpid(pid, &st, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
}

static char dir[4096], store_dir[4200], pdir[4200], fleet[4200], speeds[4200];

/* A fresh run folder tu_path(name) with store/, push/ and the fleet and
 * speed tables; sets dir, store_dir, pdir, fleet and speeds. */
static void run_dir(const char *name)
{
    snprintf(dir, sizeof dir, "%s", tu_path(name));
    snprintf(store_dir, sizeof store_dir, "%s/store", dir);
    snprintf(pdir, sizeof pdir, "%s/push", dir);
    snprintf(fleet, sizeof fleet, "%s/fleet.csv", dir);
    snprintf(speeds, sizeof speeds, "%s/speeds.csv", dir);
    sh_rm_rf(dir);
    TU_OK(sh_mkdir_p(store_dir, 0755));
    TU_OK(sh_mkdir_p(pdir, 0755));
    tu_write_file(fleet, fleet_csv, strlen(fleet_csv));
    tu_write_file(speeds, speeds_csv, strlen(speeds_csv));
}

static pid_t worker(const char *node)
{
    char log[4300];
    snprintf(log, sizeof log, "%s/worker-%s.log", dir, node);
    char *args[] = {"rl", "worker", "--store", store_dir, "--fleet", fleet, "--speeds", speeds,
                    "--node", (char *)node, "--push", pdir, "--min-wait", "0.5", NULL};
    return spawn(log, args);
}

static json_t *tree_lines(void)
{
    json_t *root, *lines;
    TU_OK(mj_tree_load(dir, &root, &lines));
    json_decref(root);
    return lines;
}

static const char *s_of(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }
static long i_of(const json_t *o, const char *k) { return (long)json_integer_value(json_object_get(o, k)); }

/* The tree log's line of `name` for the newest store version, or NULL. */
static json_t *newest_of(json_t *lines, const char *prefix, long *nlines)
{
    json_t *best = NULL, *l;
    size_t i;
    *nlines = 0;
    json_array_foreach(lines, i, l) {
        if (strncmp(s_of(l, "name"), prefix, strlen(prefix))) continue;
        (*nlines)++;
        if (!best || i_of(l, "store_version") > i_of(best, "store_version")) best = l;
    }
    return best;
}

/* A late joiner's tree-log lines: its first two store versions, how many it
 * took, and how many of those came from the root (rj, the root's address). */
typedef struct joined {
    long first, second, n, from_root;
} joined;

static joined joiner(json_t *lines, const char *name, const char *rj)
{
    joined j = {0};
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l) {
        if (strncmp(s_of(l, "name"), name, strlen(name))) continue;
        if (j.n == 0) j.first = i_of(l, "store_version");
        if (j.n == 1) j.second = i_of(l, "store_version");
        j.from_root += strstr(rj, s_of(l, "parent")) != NULL;
        j.n++;
    }
    return j;
}

static void test_workers_on_the_tree(void **state)
{
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* about a minute of real training; it runs in the optimised build */
#endif
    run_dir("push-run");
    char events[4300], result[4300], log[4300];
    snprintf(events, sizeof events, "%s/events.jsonl", dir);
    snprintf(result, sizeof result, "%s/result.json", dir);
    snprintf(log, sizeof log, "%s/trainer.log", dir);
    setenv("SHOAL_RUN_SECRET", "6a0e3c1f9b7d5a2e4c8f0b1d3e5a7c9f", 1); /* every process of the run */
    char *targs[] = {"rl", "trainer", "--store", store_dir, "--events", events, "--result", result,
                     "--steps", "14", "--warm", "70", "--eval-every", "7", "--eval-n", "32",
                     "--max-lag", "2", "--loss", "decoupled", "--ordered", NULL};
    pid_t trainer = spawn(log, targs);
    pid_t w[5] = {worker("za-0"), worker("za-1"), worker("zb-0"), 0, 0};
    /* The root comes two seconds after the first version: meanwhile every
     * request asks for a version no worker can get. */
    char latest[4300];
    snprintf(latest, sizeof latest, "%s/main/LATEST", store_dir);
    for (int i = 0; i < 1200 && !sh_path_exists(latest); i++) sh_sleep(0.1);
    assert_true(sh_path_exists(latest));
    /* Another tenant's process on the same network, with its own secret,
     * asks the trainer for work (and weights) directly. */
    char tlog[4300];
    snprintf(tlog, sizeof tlog, "%s/thief.log", dir);
    char *thargs[] = {"rl", "worker", "--store", store_dir, "--fleet", fleet, "--speeds", speeds, "--node", "zb-0", NULL};
    setenv("SHOAL_RUN_SECRET", "0123456789abcdef0123456789abcdef", 1);
    pid_t thief = spawn(tlog, thargs);
    setenv("SHOAL_RUN_SECRET", "6a0e3c1f9b7d5a2e4c8f0b1d3e5a7c9f", 1);
    sh_sleep(2.0);
    char tmp[4300], addr[4300], plog[4300];
    snprintf(tmp, sizeof tmp, "%s/push.tmp", pdir);
    snprintf(addr, sizeof addr, "%s/push.addr", pdir);
    snprintf(plog, sizeof plog, "%s/push.log", dir);
    char *pargs[] = {"push", "serve", "--store", store_dir, "--zone", "zone-root", "--addr-file", tmp, NULL};
    setenv("SHOAL_LOG", "info", 1); /* the root logs each child's plan */
    pid_t root = spawn(plog, pargs);
    unsetenv("SHOAL_LOG");
    for (int i = 0; i < 100 && !sh_path_exists(tmp); i++) sh_sleep(0.05);
    sh_sleep(0.1);
    char *text = (char *)tu_read_file(tmp, NULL);
    char rj[512];
    snprintf(rj, sizeof rj, "{\"name\": \"root\", \"zone\": \"zone-root\", \"addr\": \"%.*s\"}\n",
             (int)strcspn(text, "\r\n"), text);
    snprintf(tmp + strlen(tmp) - 8, 16, "root.json");
    tu_write_file(tmp, rj, strlen(rj));
    free(text);
    snprintf(tmp, sizeof tmp, "%s/push.tmp", pdir);
    assert_int_equal(rename(tmp, addr), 0);
    /* Once store version 4 (policy 3) is out: kill zone a's relay. */
    char relay[64] = "";
    long killed_at = 0;
    for (double t0 = sh_now_mono(); !relay[0] && sh_now_mono() - t0 < 120; sh_sleep(0.2)) {
        json_t *lines = tree_lines(), *l;
        size_t i;
        json_array_foreach(lines, i, l)
            if (!strcmp(s_of(l, "zone"), "zone-a") && i_of(l, "store_version") >= 4 &&
                strstr(rj, s_of(l, "parent")) && !relay[0]) {
                snprintf(relay, sizeof relay, "%s", s_of(l, "name"));
                killed_at = i_of(l, "store_version");
            }
        json_decref(lines);
    }
    if (!relay[0]) fail_msg("zone a never had a relay holding store version 4; see %s", dir);
    int victim = !strncmp(relay, "za-0", 4) ? 0 : 1;
    print_message("killing zone a's relay %s at store version %ld\n", relay, killed_at);
    stop(w[victim], SIGKILL);
    w[victim] = 0;
    /* Two late joiners, with nothing, two versions later: one in zone a,
     * one the first of zone c. */
    for (double t0 = sh_now_mono(); sh_now_mono() - t0 < 60; sh_sleep(0.2)) {
        uint64_t v = 0;
        store *st;
        TU_OK(store_open(store_dir, NULL, 0, &st));
        TU_OK(store_latest(st, &v));
        store_close(st);
        if (v >= (uint64_t)killed_at + 2) break;
    }
    w[3] = worker("za-2");
    w[4] = worker("zc-0");
    json_t *res = NULL;
    for (double t0 = sh_now_mono(); !res && sh_now_mono() - t0 < 240; sh_sleep(0.5))
        if (sh_path_exists(result)) sh_json_load_file(result, 64 << 20, &res);
    int st;
    waitpid(trainer, &st, 0);
    for (int i = 0; i < 5; i++) stop(w[i], SIGTERM);
    stop(root, SIGTERM);
    stop(thief, SIGTERM);
    unsetenv("SHOAL_RUN_SECRET");
    if (!res) fail_msg("no result from the trainer; see %s", log);
    print_message("workers refused for a wrong secret: %ld\n", i_of(res, "workers_refused"));
    assert_true(i_of(res, "workers_refused") >= 1);

    /* Refused and asked again, never trained on: every step trained on its
     * own groups within the bound, and some requests were refused. */
    assert_int_equal(i_of(res, "steps"), 14);
    print_message("refused requests: %ld\n", i_of(res, "refused_requests"));
    assert_true(i_of(res, "refused_requests") > 0);
    char *ev = (char *)tu_read_file(events, NULL);
    for (char *save = NULL, *l = strtok_r(ev, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_t *e = json_loads(l, 0, NULL);
        if (!strcmp(s_of(e, "event"), "step")) assert_true(i_of(e, "staleness_max") <= 2);
        json_decref(e);
    }
    free(ev);

    /* The relay's child re-attached and kept receiving.  The late joiner of
     * zone a took every version from its zone's relay, the anchor first;
     * the late joiner of zone c, the first of its zone, got
     * the anchor and one squashed delta from the root, then versions one by
     * one.  Each built what came before the newest version its parent
     * announced in memory and activated that one first (issue 31, item 5):
     * it joined two versions or more after the kill. */
    json_t *lines = tree_lines();
    const char *child = victim == 0 ? "za-1" : "za-0";
    long n_child;
    json_t *cl = newest_of(lines, child, &n_child);
    assert_non_null(cl);
    assert_true(i_of(cl, "reattaches") >= 1);
    assert_true(i_of(cl, "store_version") > killed_at);
    joined j = joiner(lines, "za-2", rj);
    print_message("late joiner in zone a: first active store v%ld, then v%ld, %ld versions, %ld from the root\n",
                  j.first, j.second, j.n, j.from_root);
    /* The relay's own plan: the anchor, then what it holds after it (the
     * squashed delta it was caught up with at the start, the chain),
     * activated from the newest announced on. */
    assert_true(j.n >= 2);
    assert_int_equal(j.from_root, 0); /* nothing crossed zone a's boundary again for it */
    assert_true(j.first >= killed_at + 2);
    j = joiner(lines, "zc-0", rj);
    print_message("late joiner of zone c: first active store v%ld, then v%ld, %ld versions, %ld from the root\n",
                  j.first, j.second, j.n, j.from_root);
    assert_true(j.first >= killed_at + 2); /* the anchor and one squashed delta, the newest first */
    assert_int_equal(j.from_root, j.n);     /* the first of its zone: its relay */
    json_decref(lines);
    char *plogt = (char *)tu_read_file(plog, NULL);
    assert_non_null(strstr(plogt, "a squashed delta"));
    free(plogt);

    /* Everyone still running holds the trainer's last image. */
    json_t *sum;
    TU_OK(mj_summary(dir, &sum));
    print_message("summary: %s\n", json_dumps(sum, JSON_COMPACT));
    assert_int_equal(json_integer_value(json_object_get(sum, "workers_at_end")), 4);
    assert_true(json_is_true(json_object_get(sum, "workers_identical_at_end")));
    assert_int_equal(json_integer_value(json_object_get(sum, "workers_on_push_tree")),
                     json_integer_value(json_object_get(sum, "workers")));
    json_decref(sum);
    json_decref(res);
}

/* The other way: a worker of the run takes nothing from a trainer that
 * does not prove the run's secret (a process that took a dead trainer's
 * port), and tells why.  Its HELLO carries a proof on a fresh nonce, not
 * the secret, so such a trainer learns nothing it could use. */
static void test_worker_checks_trainer(void **state)
{
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* a trainer's start; the optimised build runs it */
#endif
    run_dir("fake-trainer");
    char log[4300], wlog[4300], result[4300];
    snprintf(log, sizeof log, "%s/trainer.log", dir);
    snprintf(wlog, sizeof wlog, "%s/worker.log", dir);
    snprintf(result, sizeof result, "%s/result.json", dir);
    const char *fakes[2] = {NULL, "ffeeddccbbaa99887766554433221100"}; /* none, another */
    for (int k = 0; k < 2; k++) {
        if (fakes[k]) setenv("SHOAL_RUN_SECRET", fakes[k], 1);
        else unsetenv("SHOAL_RUN_SECRET");
        char *targs[] = {"rl", "trainer", "--store", store_dir, "--result", result, "--steps", "50", NULL};
        pid_t trainer = spawn(log, targs);
        setenv("SHOAL_RUN_SECRET", "6a0e3c1f9b7d5a2e4c8f0b1d3e5a7c9f", 1);
        char *wargs[] = {"rl", "worker", "--store", store_dir, "--fleet", fleet, "--speeds", speeds, "--node", "za-0",
                         "--wait", "60", NULL};
        pid_t w = spawn(wlog, wargs);
        unsetenv("SHOAL_RUN_SECRET");
        int st = -1;
        for (int i = 0; i < 600 && waitpid(w, &st, WNOHANG) == 0; i++) sh_sleep(0.1);
        stop(w, SIGKILL);
        stop(trainer, SIGTERM);
        char *t = (char *)tu_read_file(wlog, NULL);
        print_message("worker against a trainer with %s secret: %s", fakes[k] ? "another" : "no", t);
        /* No secret: it talks first and is refused.  Another: it refuses
         * the worker's proof and hangs up before proving its own. */
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 3 ||
            (!strstr(t, "before proving this run's secret") && !strstr(t, "hung up before proving")))
            fail_msg("the worker (status %d) did not refuse an unproven trainer:\n%s", st, t);
        free(t);
        sh_rm_rf(store_dir);
        TU_OK(sh_mkdir_p(store_dir, 0755));
        unlink(result);
    }
}

/* Connect to the trainer's address in DIR/trainer.json; returns the fd. */
static int connect_trainer(const char *addr)
{
    char host[64];
    int port = 0;
    assert_int_equal(sscanf(addr, "%63[^:]:%d", host, &port), 2);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    assert_int_equal(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* Another tenant's process on the host network connects to the trainer
 * and says nothing; then it fills every worker slot with such connections
 * and opens one more that announces a 64 MiB HELLO.  The run's worker
 * still joins: a connection without a HELLO is closed after RL_HELLO_S,
 * or sooner when every slot is taken and a newer connection comes (the
 * oldest goes first), and the oversized frame is refused from its
 * header. */
static void test_trainer_slots_under_flood(void **state)
{
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* a trainer's run; the optimised build runs it */
#endif
    run_dir("flood");
    char log[4300], wlog[4300], result[4300], tj[4300];
    snprintf(log, sizeof log, "%s/trainer.log", dir);
    snprintf(wlog, sizeof wlog, "%s/worker.log", dir);
    snprintf(result, sizeof result, "%s/result.json", dir);
    snprintf(tj, sizeof tj, "%s/trainer.json", store_dir);
    setenv("SHOAL_RUN_SECRET", "6a0e3c1f9b7d5a2e4c8f0b1d3e5a7c9f", 1);
    char *targs[] = {"rl", "trainer", "--store", store_dir, "--result", result, "--steps", "3", NULL};
    pid_t trainer = spawn(log, targs);
    const char *addr = NULL;
    json_t *j = NULL;
    for (int i = 0; i < 600 && !addr; i++, sh_sleep(0.1)) {
        if (j) json_decref(j), j = NULL;
        if (sh_path_exists(tj) && sh_json_load_file(tj, 1 << 16, &j) == 0 && s_of(j, "addr") && s_of(j, "addr")[0])
            addr = s_of(j, "addr");
    }
    if (!addr) fail_msg("the trainer announced no address; see %s", log);
    /* One that connects and says nothing is closed after RL_HELLO_S (the
     * trainer may still be setting up its first version when it connects:
     * on a loaded machine that took over 5 s). */
    int sleeper = connect_trainer(addr);
    char *t = NULL;
    for (int i = 0; i < 400 && !(t && strstr(t, "no HELLO within")); i++, sh_sleep(0.1)) {
        free(t);
        t = (char *)tu_read_file(log, NULL);
    }
    if (!strstr(t, "no HELLO within")) fail_msg("a silent connection was not closed in time:\n%s", t);
    free(t);
    close(sleeper);
    /* Then every slot at once, and the run's worker right after. */
    int idle[RL_MAX_WORKERS];
    for (int k = 0; k < RL_MAX_WORKERS; k++) idle[k] = connect_trainer(addr);
    int big = connect_trainer(addr);
    struct { uint32_t magic, type; uint64_t len; } hdr = {0x4c524853u, 5 /* HELLO */, 64u << 20};
    assert_int_equal(write(big, &hdr, sizeof hdr), (ssize_t)sizeof hdr);
    sh_sleep(0.5);
    char *wargs[] = {"rl", "worker", "--store", store_dir, "--fleet", fleet, "--speeds", speeds, "--node", "za-0",
                     "--wait", "60", NULL};
    pid_t w = spawn(wlog, wargs);
    json_t *res = NULL;
    for (double t0 = sh_now_mono(); !res && sh_now_mono() - t0 < 60; sh_sleep(0.3))
        if (sh_path_exists(result)) sh_json_load_file(result, 64 << 20, &res);
    stop(w, SIGTERM);
    stop(trainer, SIGTERM);
    unsetenv("SHOAL_RUN_SECRET");
    for (int k = 0; k < RL_MAX_WORKERS; k++) close(idle[k]);
    close(big);
    json_decref(j);
    if (!res) fail_msg("the run did not finish under the flood; see %s and %s", log, wlog);
    print_message("steps %ld, connections dropped %ld\n", i_of(res, "steps"), i_of(res, "connections_dropped"));
    assert_int_equal(i_of(res, "steps"), 3);
    assert_true(i_of(res, "connections_dropped") >= 3); /* the sleeper, the big HELLO, a slot given up */
    t = (char *)tu_read_file(log, NULL);
    assert_non_null(strstr(t, "first message is not a HELLO"));
    assert_non_null(strstr(t, "every slot is taken"));
    free(t);
    json_decref(res);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_workers_on_the_tree),
        cmocka_unit_test(test_worker_checks_trainer),
        cmocka_unit_test(test_trainer_slots_under_flood),
    };
    return cmocka_run_group_tests_name("mainjob_push", tests, NULL, NULL);
}
