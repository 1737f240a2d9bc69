/* torchrun's conventions on a real two-node gang: Debian's python3-torch
 * forms one torch.distributed group (gloo) across the nodes, both with a
 * plain `torchrun script.py` (two workers per node) and with one process
 * per node.  Also: every attempt rendezvouses on its own port. */
#include "fleet_util.h"

#include <stdlib.h>
#include <string.h>

static tf_fleet F;

/* python3-torch present, and this is the optimised build: under ASan the
 * Python side would only run again at the same speed, twice as long. */
static int have_torch(void)
{
    if (strstr(tu_shoal(), "/asan/")) return 0;
    return tu_run(NULL, "/usr/bin/python3 -c 'import torch.distributed as d; assert d.is_gloo_available()' "
                        ">/dev/null 2>&1 && command -v torchrun >/dev/null") == 0;
}

static int setup(void **state)
{
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "torchrun", 30);
    tf_start_agents(&F, 2, "H100", 2, "z1", "ib");
    return 0;
}

/* A script that joins the group and all-reduces rank + 1: with N workers the
 * sum is N(N+1)/2.  Written into the rank's work directory first, because
 * the sandbox gives each rank a private /tmp. */
static const char script[] =
    "import os, torch, torch.distributed as dist\\n"
    "dist.init_process_group('gloo')\\n"
    "t = torch.tensor([float(dist.get_rank() + 1)])\\n"
    "dist.all_reduce(t)\\n"
    "print('worker', dist.get_rank(), 'of', dist.get_world_size(), 'local', os.environ['LOCAL_RANK'],"
    " 'node', os.environ['NODE_RANK'], 'sum', int(t.item()), flush=True)\\n"
    "dist.destroy_process_group()\\n";

static char *log_of(int64_t id, int rank)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%lld/logs?rank=%d", (long long)id, rank);
    int st;
    json_t *j = tf_call(&F, TF_ALICE, "GET", path, NULL, &st);
    assert_int_equal(st, 200);
    char *s = strdup(json_string_value(json_object_get(j, "data")));
    json_decref(j);
    return s;
}

/* Runs the script on a 2-node gang with 2 GPUs per node; asserts success,
 * showing both ranks' logs when it fails. */
static int64_t run_gang(const char *launcher)
{
    char body[2048];
    /* PET_REDIRECTS/PET_TEE: Debian 12's torch 1.13 under Python 3.11 cannot
     * parse torchrun's default "--redirects 0" (docs/job-format.md). */
    snprintf(body, sizeof body,
             "{\"name\":\"ddp\",\"nodes\":2,\"gpus_per_node\":2,\"env\":{\"GLOO_SOCKET_IFNAME\":\"lo\","
             "\"OMP_NUM_THREADS\":\"1\",\"PET_REDIRECTS\":\"1\",\"PET_TEE\":\"1\"},"
             "\"command\":[\"sh\",\"-c\",\"printf \\\"%s\\\" > t.py && exec %s t.py\"]}",
             script, launcher);
    int64_t id = tf_submit(&F, TF_ALICE, body);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)id);
    const char *state = "";
    json_t *j = NULL;
    for (double t0 = sh_now_mono(); sh_now_mono() - t0 < 240; sh_sleep(0.1)) {
        int st;
        json_decref(j);
        j = tf_call(&F, TF_ALICE, "GET", path, NULL, &st);
        state = json_string_value(json_object_get(j, "state"));
        if (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled")) break;
    }
    if (strcmp(state, "succeeded")) {
        char *l0 = log_of(id, 0), *l1 = log_of(id, 1);
        fail_msg("%s gang: state %s (%s)\n--- rank 0:\n%s\n--- rank 1:\n%s", launcher, state,
                 json_string_value(json_object_get(j, "reason")), l0, l1);
    }
    json_decref(j);
    return id;
}

static void test_torchrun_two_nodes(void **state)
{
    if (!have_torch()) skip();
    int64_t id = run_gang("torchrun");
    /* Four workers (2 nodes x 2 GPUs), each node's log holding its two. */
    for (int node = 0; node < 2; node++) {
        char *log = log_of(id, node);
        for (int local = 0; local < 2; local++) {
            char want[96];
            snprintf(want, sizeof want, "worker %d of 4 local %d node %d sum 10", 2 * node + local, local, node);
            if (!strstr(log, want)) fail_msg("node %d's log lacks \"%s\":\n%s", node, want, log);
        }
        free(log);
    }
}

static void test_one_process_per_node(void **state)
{
    if (!have_torch()) skip();
    int64_t id = run_gang("python3");
    for (int node = 0; node < 2; node++) {
        char *log = log_of(id, node);
        char want[96];
        snprintf(want, sizeof want, "worker %d of 2 local 0 node %d sum 3", node, node);
        if (!strstr(log, want)) fail_msg("node %d's log lacks \"%s\":\n%s", node, want, log);
        free(log);
    }
}

/* The README's job as written, `{"command": ["torchrun", "train.py"]}`
 * with no env, submitted with --workdir from the folder holding train.py:
 * the code reaches every rank and torch 1.13's torchrun starts without
 * PET_REDIRECTS/PET_TEE in the job file. */
static void test_readme_torchrun(void **state)
{
    if (!have_torch()) skip();
    char dir[4200], p[4300], *out;
    snprintf(dir, sizeof dir, "%s", tu_path("ddp-code"));
    sh_rm_rf(dir);
    sh_mkdir_p(dir, 0755);
    snprintf(p, sizeof p, "%s/train.py", dir);
    static const char train[] = "import os\nos.environ.setdefault('GLOO_SOCKET_IFNAME', 'lo')\n"
                                "import torch, torch.distributed as dist\ntorch.set_num_threads(1)\n"
                                "dist.init_process_group('gloo')\nt = torch.tensor([float(dist.get_rank() + 1)])\n"
                                "dist.all_reduce(t)\nprint('readme worker', dist.get_rank(), 'sum', int(t.item()), flush=True)\n";
    tu_write_file(p, train, strlen(train));
    snprintf(p, sizeof p, "%s/ddp.json", dir);
    const char *job = "{\"name\": \"ddp\", \"nodes\": 2, \"gpus_per_node\": 2, \"command\": [\"torchrun\", \"train.py\"]}";
    tu_write_file(p, job, strlen(job));
    char shoal[4096];
    if (!realpath(tu_shoal(), shoal)) fail_msg("%s: not found", tu_shoal());
    int rc = tu_run(&out, "cd %s && %s submit ddp.json --workdir . --wait --server %s --token %s 2>&1", dir, shoal,
                    F.url, TF_ALICE);
    if (rc != 0) fail_msg("the README's torchrun job: exit %d:\n%s", rc, out);
    free(out);
    assert_int_equal(tu_run(&out, "%s logs 1 --rank all --server %s --token %s", tu_shoal(), F.url, TF_ALICE), 0);
    for (int w = 0; w < 4; w++) {
        char want[64];
        snprintf(want, sizeof want, "readme worker %d sum 10", w);
        if (!strstr(out, want)) fail_msg("the README's torchrun job: no \"%s\" in\n%s", want, out);
    }
    free(out);
}

/* Two gangs running at once, and a requeued attempt, get different ports. */
static void test_ports_unique(void **state)
{
    const char *body = "{\"name\":\"p\",\"nodes\":2,\"gpus_per_node\":1,\"max_attempts\":3,"
                       "\"command\":[\"sh\",\"-c\",\"echo port=$MASTER_PORT/$PET_MASTER_PORT; sleep 30\"]}";
    int64_t a = tf_submit(&F, TF_ALICE, body), b = tf_submit(&F, TF_ALICE, body);
    json_decref(tf_wait_job(&F, a, "running", 30));
    json_decref(tf_wait_job(&F, b, "running", 30));
    int ports[2];
    int64_t ids[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        char *log = NULL;
        for (double t0 = sh_now_mono(); sh_now_mono() - t0 < 20; sh_sleep(0.2)) {
            free(log);
            log = log_of(ids[k], 1);
            if (strstr(log, "port=")) break;
        }
        const char *p = strstr(log, "port=");
        if (!p) fail_msg("job %lld printed no port: %s", (long long)ids[k], log);
        int x, y;
        assert_int_equal(sscanf(p, "port=%d/%d", &x, &y), 2);
        assert_int_equal(x, y);
        assert_true(x >= 20000 && x < 32768); /* below the ephemeral ports */
        ports[k] = x;
        free(log);
    }
    assert_int_not_equal(ports[0], ports[1]);
    for (int k = 0; k < 2; k++) {
        char path[64];
        snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)ids[k]);
        int st;
        json_decref(tf_call(&F, TF_ALICE, "POST", path, NULL, &st));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_torchrun),
        cmocka_unit_test(test_torchrun_two_nodes),
        cmocka_unit_test(test_one_process_per_node),
        cmocka_unit_test(test_ports_unique),
    };
    return cmocka_run_group_tests(tests, setup, tf_teardown);
}
