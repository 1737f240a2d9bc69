/* The main job end to end, short: a fleet from a file under `shoal up`, the
 * trainer as a 2-node gang whose ranks all-reduce gradients over a UCX
 * ring, the rollout workers as an elastic job placed by price per unit of
 * throughput, weights published to the store as deltas and applied by the
 * workers in flight, the decoupled correction with a staleness bound.
 *
 * Checks: the held-out reward rises; every trained batch respects the
 * staleness bound; every worker said BYE holding the last version, byte for
 * byte; both trainer ranks hold the same weights; the store's last version
 * rebuilt from its deltas is the trainer's final image; the elastic pool
 * went to the cheapest GPUs per unit of throughput.  Plus the ring
 * all-reduce on its own and bad fleet files. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rl/engine/runtime_int.h"
#include "shoal/ckpt.h"
#include "shoal/delta.h"
#include "app/mainjob/mainjob.h"
#include "app/mainjob/fleetcost/fleetcost_int.h"
#include "app/mainjob/report/report_int.h"
#include "app/mainjob/trainer/trainer_int.h"
#include "app/mainjob/worker/worker_int.h"
#include "shoal/store.h"
#include "testutil.h"

static const char fleet_csv[] =
    "name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n"
    "h100-t0,H100,1,us-east-1a,ib-train,3.95\n"
    "h100-t1,H100,1,us-east-1a,ib-train,3.95\n"
    "h100-r0,H100,1,us-east-1b,eth-e,3.95\n"
    "a100-r0,A100,1,us-central-1a,eth-c,2.50\n"
    "l4-r0,L4,2,us-west-2b,eth-w,0.80\n";
static const char speeds_csv[] = "gpu_type,speed\nH100,1.0\nA100,0.70\nL4,0.30\n";

static pid_t start_up(const char *fleet, const char *db, int port)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char p[16];
        snprintf(p, sizeof p, "%d", port);
        freopen(tu_path("up.log"), "w", stdout);
        freopen(tu_path("up.err"), "w", stderr);
        /* The jobs write the run folder, and the trainer asks priority 10:
         * the admin allows both. */
        execl(tu_shoal(), tu_shoal(), "up", "--fleet", fleet, "--db", db, "--port", p, "--allow-writable",
              tu_path("run"), "--max-priority", "default=10", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void stop_up(pid_t pid)
{
    kill(pid, SIGTERM);
    int st;
    for (int i = 0; i < 100 && waitpid(pid, &st, WNOHANG) == 0; i++) sh_sleep(0.05);
    if (waitpid(pid, &st, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
}

static json_t *wait_json(const char *path, double timeout)
{
    double deadline = sh_now_mono() + timeout;
    while (!sh_path_exists(path) && sh_now_mono() < deadline) sh_sleep(0.2);
    json_t *j = NULL;
    if (sh_path_exists(path)) sh_json_load_file(path, 64 << 20, &j);
    return j;
}

/* Every step event of events.jsonl: staleness_max <= max_lag. */
static void check_staleness(const char *events, int max_lag, int *steps)
{
    char *text = (char *)tu_read_file(events, NULL);
    *steps = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_t *e = json_loads(l, 0, NULL);
        assert_non_null(e);
        if (!strcmp(json_string_value(json_object_get(e, "event")), "step")) {
            (*steps)++;
            json_int_t s = json_integer_value(json_object_get(e, "staleness_max"));
            if (s > max_lag) fail_msg("step %lld trained on data %lld versions old (bound %d)",
                                      (long long)json_integer_value(json_object_get(e, "step")), (long long)s, max_lag);
        }
        json_decref(e);
    }
    free(text);
}

/* The store's newest version, rebuilt from anchor and deltas, hashes as the
 * trainer's final image. */
static void check_store(const char *dir, const char *want_hex, int final_version)
{
    store *s;
    TU_OK(store_open(dir, NULL, 0, &s));
    uint64_t latest;
    TU_OK(store_latest(s, &latest));
    assert_int_equal(latest, (uint64_t)final_version + 1); /* store versions count from 1 */
    const char *out = tu_path("final.safetensors");
    TU_OK(store_materialize(s, latest, 0, NULL, out));
    size_t len;
    uint8_t *img = tu_read_file(out, &len);
    char hex[33];
    sh_hash128_hex(sh_hash128_of(img, len), hex);
    assert_string_equal(hex, want_hex);
    free(img);
    store_close(s);
}

static void test_pipeline(void **state)
{
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* about 40 s of real training; it runs in the optimised build */
#endif
    /* Ranks see a private /tmp: what they read lives in the run folder,
     * which the jobs mount read-write. */
    char rundir[4096], storedir[4200], db[4200], fleet[4200], speeds[4200];
    /* Ranks run in their own working directory: the binary by absolute path. */
    char *shoal = realpath(tu_shoal(), NULL);
    assert_non_null(shoal);
    /* Ranks run the all-in-one binary: the lean client finds shoal-core
     * beside itself, which a job's private /tmp hides when the clone is
     * under /tmp. */
    char core[4200];
    snprintf(core, sizeof core, "%s-core", shoal);
    if (sh_path_exists(core)) {
        free(shoal);
        shoal = strdup(core);
    }
    snprintf(rundir, sizeof rundir, "%s", tu_path("run"));
    snprintf(storedir, sizeof storedir, "%s/store", rundir);
    snprintf(db, sizeof db, "%s/fleet/shoal.db", rundir);
    snprintf(fleet, sizeof fleet, "%s/fleet.csv", rundir);
    snprintf(speeds, sizeof speeds, "%s/speeds.csv", rundir);
    TU_OK(sh_mkdir_p(rundir, 0755)); /* store/ is the trainer's to make, as the tenant's uid */
    tu_write_file(fleet, fleet_csv, strlen(fleet_csv));
    tu_write_file(speeds, speeds_csv, strlen(speeds_csv));
    int port = 21000 + (int)(getpid() % 2000);
    pid_t up = start_up(fleet, db, port);
    char envf[4300];
    snprintf(envf, sizeof envf, "%s/fleet/env", rundir);
    for (int i = 0; i < 200 && !sh_path_exists(envf); i++) sh_sleep(0.05);
    assert_true(sh_path_exists(envf));
    const char *rlopts = "\"--steps\",\"30\",\"--warm\",\"70\",\"--eval-every\",\"30\",\"--eval-n\",\"64\","
                         "\"--max-lag\",\"2\",\"--loss\",\"decoupled\"";
    char job[8192], *out = NULL;
    snprintf(job, sizeof job,
             "{\"name\":\"rl-trainer\",\"kind\":\"gang\",\"nodes\":2,\"gpu_types\":[\"H100\"],\"priority\":10,"
             "\"on_failure\":\"fail\",\"writable\":[\"%s\"],\"command\":[\"%s\",\"rl\",\"trainer\",\"--store\",\"%s\","
             "\"--events\",\"%s/events.jsonl\",\"--result\",\"%s/result.json\",%s]}",
             rundir, shoal, storedir, rundir, rundir, rlopts);
    tu_write_file(tu_path("trainer.json"), job, strlen(job));
    snprintf(job, sizeof job,
             "{\"name\":\"rl-rollouts\",\"kind\":\"elastic\",\"max_nodes\":3,\"gpu_types\":[\"H100\",\"A100\",\"L4\"],"
             "\"gpu_speeds\":{\"H100\":1,\"A100\":0.7,\"L4\":0.3},\"writable\":[\"%s\"],"
             "\"command\":[\"%s\",\"rl\",\"worker\",\"--store\",\"%s\",\"--fleet\",\"%s\",\"--speeds\",\"%s\"]}",
             rundir, shoal, storedir, fleet, speeds);
    tu_write_file(tu_path("rollouts.json"), job, strlen(job));
    /* Submit once every agent has registered (before that the types are unknown). */
    int rc = tu_run(&out, "set -a; . %s; for i in $(seq 200); do [ $(%s nodes | grep -c alive) -ge 5 ] && break; "
                    "sleep 0.05; done; %s submit %s && %s submit %s", envf, tu_shoal(), tu_shoal(),
                    tu_path("trainer.json"), tu_shoal(), tu_path("rollouts.json"));
    if (rc) fail_msg("submit: %s", out);
    free(out);
    char path[4300];
    snprintf(path, sizeof path, "%s/result.json", rundir);
    /* Wait for the result; a job that failed ends the wait at once. */
    json_t *res = NULL;
    for (double t0 = sh_now_mono(); !res && sh_now_mono() - t0 < 120;) {
        res = wait_json(path, 3);
        if (!res && tu_run(NULL, "set -a; . %s; %s jobs | grep -q failed", envf, tu_shoal()) == 0) break;
    }
    if (!res) {
        tu_run(&out, "set -a; . %s; %s jobs; %s logs 1 --rank 0; %s logs 2", envf, tu_shoal(), tu_shoal(), tu_shoal());
        stop_up(up);
        fail_msg("no result from the trainer gang:\n%s", out);
    }
    double r0 = json_number_value(json_object_get(res, "reward_start"));
    double r1 = json_number_value(json_object_get(res, "reward_end"));
    print_message("held-out reward %.3f -> %.3f\n", r0, r1);
    assert_true(r1 > r0);
    assert_true(json_is_true(json_object_get(res, "ranks_in_sync")));
    assert_int_equal(json_integer_value(json_object_get(res, "ranks")), 2);
    int final_version = (int)json_integer_value(json_object_get(res, "final_version"));
    const char *hex = json_string_value(json_object_get(res, "final_image_xxh3"));
    assert_true(final_version >= 26); /* a step may be skipped, never many */
    int steps;
    snprintf(path, sizeof path, "%s/events.jsonl", rundir);
    check_staleness(path, 2, &steps);
    assert_int_equal(steps, 30);
    /* Deltas: every version after the first went out as a delta. */
    assert_true(json_number_value(json_object_get(res, "delta_bytes_total")) > 0);
    /* Byte counts are integers, as every count in the JSON shoal writes. */
    static const char *const counts[] = {"delta_bytes_total", "full_bytes_total", "store_bytes_total"};
    for (int k = 0; k < 3; k++)
        if (!json_is_integer(json_object_get(res, counts[k]))) fail_msg("result.json: %s is not an integer", counts[k]);
    assert_true(json_number_value(json_object_get(res, "delta_bytes_total")) <
                json_number_value(json_object_get(res, "full_bytes_total")));
    /* The elastic pool: three replicas, on the two L4 GPUs (0.80/0.3 per
     * unit of throughput) and the A100 (2.50/0.7), not the H100 (3.95/1). */
    json_t *ws = json_object_get(res, "workers");
    int l4 = 0, a100 = 0, h100 = 0;
    size_t i;
    json_t *w;
    json_array_foreach(ws, i, w) {
        const char *n = json_string_value(json_object_get(w, "name"));
        l4 += !strcmp(n, "L4"), a100 += !strcmp(n, "A100"), h100 += !strcmp(n, "H100");
        json_t *f = json_object_get(w, "final");
        if (!json_is_object(f)) fail_msg("worker %zu (%s) did not say BYE", i, n);
        assert_int_equal(json_integer_value(json_object_get(f, "version")), final_version);
        assert_string_equal(json_string_value(json_object_get(f, "image_xxh3")), hex);
        assert_true(json_integer_value(json_object_get(w, "trajectories")) > 0);
    }
    assert_int_equal(l4, 2);
    assert_int_equal(a100, 1);
    assert_int_equal(h100, 0);
    /* Off-policy data was used (and corrected): some trajectories were stale. */
    json_t *h = json_object_get(res, "staleness_hist");
    assert_true(json_integer_value(json_array_get(h, 1)) + json_integer_value(json_array_get(h, 2)) > 0);
    check_store(storedir, hex, final_version);
    json_decref(res);
    stop_up(up);
    free(shoal);
}

/* Rank r of a ring of W processes (rendezvous in DIR, SHOAL_RUN_SECRET
 * `secret` or none) averages distinct vectors and broadcasts a message;
 * exits 0 when both came out right. */
static void ring_rank(int r, int W, const char *dir, const char *secret, double timeout_s)
{
    enum { N = 1001 };
    if (secret) setenv("SHOAL_RUN_SECRET", secret, 1);
    else unsetenv("SHOAL_RUN_SECRET");
    mj_ring *ring;
    if (mj_ring_new(r, W, "127.0.0.1", 0, dir, timeout_s, &ring) < 0) fprintf(stderr, "rank %d: %s\n", r, sh_errmsg()), _exit(2);
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(r * 1000 + i);
    if (mj_ring_allreduce_mean(ring, x, N) < 0) fprintf(stderr, "rank %d: %s\n", r, sh_errmsg()), _exit(3);
    for (int i = 0; i < N; i++)
        if (x[i] != (float)((W - 1) * 500 + i)) _exit(4); /* mean of r*1000 + i over r = 0..W-1 */
    char msg[] = "hello from rank 0";
    void *b = r == 0 ? msg : NULL;
    size_t len = r == 0 ? sizeof msg : 0;
    if (mj_ring_bcast(ring, 0, &b, &len) < 0) fprintf(stderr, "rank %d: %s\n", r, sh_errmsg()), _exit(5);
    if (len != sizeof msg || memcmp(b, msg, len)) _exit(6);
    if (r) free(b);
    mj_ring_free(ring);
    _exit(0);
}

/* Runs a ring of W processes, rank r with secrets[r]; returns how many
 * exited 0. */
static int run_ring(int W, const char *name, const char *const *secrets, double timeout_s)
{
    pid_t kids[8];
    sh_rm_rf(tu_path(name));
    TU_OK(sh_mkdir_p(tu_path(name), 0755));
    for (int r = 0; r < W; r++) {
        kids[r] = fork();
        assert_true(kids[r] >= 0);
        if (kids[r] == 0) ring_rank(r, W, tu_path(name), secrets[r], timeout_s);
    }
    int ok = 0;
    for (int r = 0; r < W; r++) {
        int st;
        waitpid(kids[r], &st, 0);
        ok += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    return ok;
}

/* The ring alone: three ranks (processes) average distinct vectors. */
static void test_ring(void **state)
{
    const char *none[3] = {NULL, NULL, NULL};
    assert_int_equal(run_ring(3, "rdv", none, 30), 3);
    const char *same[3] = {"0f1e2d3c4b5a69788796a5b4c3d2e1f0", "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
                           "0f1e2d3c4b5a69788796a5b4c3d2e1f0"};
    assert_int_equal(run_ring(3, "rdv-same", same, 30), 3);
}

/* A process without the run's secret that reaches a rank's port (another
 * tenant's rank, over the shared host network) cannot have its messages
 * taken for a step's: with another secret, a rank's hello is never
 * matched, and neither ring forms. */
static void test_ring_secret(void **state)
{
    const char *other[2] = {"0f1e2d3c4b5a69788796a5b4c3d2e1f0", "ffeeddccbbaa99887766554433221100"};
    assert_int_equal(run_ring(2, "rdv-other", other, 3), 0);
    const char *half[2] = {"0f1e2d3c4b5a69788796a5b4c3d2e1f0", NULL};
    assert_int_equal(run_ring(2, "rdv-half", half, 3), 0);
}

static void test_fleet_files(void **state)
{
    const char *f = tu_path("f.csv"), *s = tu_path("s.csv");
    tu_write_file(f, fleet_csv, strlen(fleet_csv));
    const char *no_l4 = "gpu_type,speed\nH100,1\nA100,0.7\n";
    tu_write_file(s, no_l4, strlen(no_l4));
    mj_fleet fl;
    TU_ERR(mj_fleet_load(f, s, &fl), SH_ENOENT, "GPU type L4 has no speed");
    const char *bad = "gpu_type,speed\nH100,1\nA100,1.7\nL4,0.3\n";
    tu_write_file(s, bad, strlen(bad));
    TU_ERR(mj_fleet_load(f, s, &fl), SH_ERANGE, "line 3");
    tu_write_file(s, speeds_csv, strlen(speeds_csv));
    TU_OK(mj_fleet_load(f, s, &fl));
    assert_int_equal(fl.n, 5);
    assert_string_equal(mj_fleet_node(&fl, "l4-r0")->gpu_type, "L4");
    assert_true(mj_fleet_speed(&fl, "A100") == 0.7);
    mj_fleet_free(&fl);
    char *out = NULL;
    int rc = tu_run(&out, "%s rl worker --store /nonexistent --fleet %s --speeds %s --node nope", tu_shoal(), f, s);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "node \"nope\" is not in"));
    free(out);
}


/* FP8 rollout weights in memory (src/rl/engine/checkpoint.c): the same dequantised
 * weights as `shoal quant fp8`'s file, and after a change to one block of one
 * tensor, redoing only the changed blocks gives the same as redoing all. */
static void test_fp8_in_memory(void **state)
{
    nn_config cfg = {.vocab = rl_vocab(), .ctx = 32, .width = 256, .layers = 1, .heads = 4};
    nn_model *src, *a, *b;
    TU_OK(nn_new(&cfg, 7, &src));
    TU_OK(nn_new(&cfg, 8, &a));
    TU_OK(nn_new(&cfg, 9, &b));
    size_t np = nn_num_params(src);
    for (int round = 0; round < 2; round++) {
        sh_buf img = {0};
        TU_OK(rl_policy_image(src, 1, &img));
        const char *bf = tu_path("fp8in.st"), *q = tu_path("fp8out.st");
        tu_write_file(bf, img.data, img.len);
        static const char *const keep[] = {"embed", "lm_head", NULL};
        delta_opts o = {.threads = 1};
        TU_OK(delta_quant_fp8(bf, q, keep, &o, NULL));
        TU_OK(rl_load_checkpoint(a, q)); /* the file's FP8, dequantised */
        static sh_buf prev;
        static ckpt *pck;
        ckpt *ck;
        TU_OK(ckpt_open_mem(img.data, img.len, "img", &ck));
        uint64_t blocks = 0;
        TU_OK(rl__load_fp8(b, ck, pck, &blocks));
        assert_memory_equal(nn_params(a), nn_params(b), np * sizeof(float));
        if (round == 0) assert_true(blocks > 8);
        else assert_int_equal(blocks, 1); /* one block of one tensor changed */
        ckpt_close(pck);
        sh_buf_free(&prev);
        pck = ck, prev = img;
        /* Change one element of a 2-D quantised tensor for the next round. */
        for (int i = 0; i < nn_num_tensors(src); i++) {
            const nn_tensor *t = nn_tensor_at(src, i);
            if (t->rows > 128 && t->cols > 128 && !strstr(t->name, "embed") && !strstr(t->name, "lm_head")) {
                nn_params(src)[t->offset + 130 * (size_t)t->cols + 3] += 0.25f;
                break;
            }
        }
        if (round == 1) ckpt_close(pck), sh_buf_free(&prev), pck = NULL;
    }
    nn_free(src), nn_free(a), nn_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fleet_files),
        cmocka_unit_test(test_fp8_in_memory),
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_ring_secret),
        cmocka_unit_test(test_pipeline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
