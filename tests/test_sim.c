/* Tests for src/control/sim: importers on the shared data (fleets, Philly traces
 * with gavel throughputs, Alibaba pods), bad input naming file, line and
 * field, the multi-node transformer, the Kalos generator, and end-to-end
 * replays of `shoal sim` watched by sched_check after every event. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/sim.h"

#define SIM_MAX_LINE_TEST 65536 /* SIM__MAX_LINE of src/control/sim/csv_int.h */

static const char *shared_path(const char *rel)
{
    static char buf[4][4096];
    static int k;
    const char *sh = tu_shared();
    if (!sh) return NULL;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/data/%s", sh, rel);
    return buf[k];
}

#define NEED_SHARED()                                                          \
    do {                                                                       \
        if (!tu_shared()) skip();                                              \
    } while (0)

/* ---- Fleets --------------------------------------------------------------------- */

static void test_fleet_alibaba(void **state)
{
    NEED_SHARED();
    sim_fleet f;
    sim_fleet_opts o = {2, 32};
    TU_OK(sim_fleet_load(shared_path("fleets/alibaba-v2023-gpu-nodes.csv"), "alibaba-v2023", &o, &f));
    assert_int_equal(f.n, 1213);
    long gpus = 0;
    for (size_t i = 0; i < f.n; i++) gpus += f.nodes[i].gpus;
    assert_int_equal(gpus, 6212);
    /* The rule: k-th node of a type -> fabric k / 32 of that type, zone
     * (k / 32) % 2.  openb-node-0000 is the first P100. */
    assert_string_equal(f.nodes[0].id, "openb-node-0000");
    assert_string_equal(f.nodes[0].gpu_type, "P100");
    assert_string_equal(f.nodes[0].zone, "z0");
    assert_string_equal(f.nodes[0].fabric, "P100-f0");
    int k = 0;
    for (size_t i = 0; i < f.n; i++)
        if (!strcmp(f.nodes[i].gpu_type, "P100") && k++ == 32) {
            assert_string_equal(f.nodes[i].zone, "z1");
            assert_string_equal(f.nodes[i].fabric, "P100-f1");
        }
    assert_true(fabs(f.nodes[0].price_per_gpu_hour - 0.5) < 1e-9);
    /* Round trip through the shoal fleet CSV. */
    TU_OK(sim_fleet_write(&f, tu_path("fleet.csv")));
    sim_fleet g;
    TU_OK(sim_fleet_load(tu_path("fleet.csv"), "shoal", NULL, &g));
    assert_int_equal(g.n, f.n);
    assert_memory_equal(g.nodes, f.nodes, f.n * sizeof *f.nodes);
    sim_fleet_free(&g);
    sim_fleet_free(&f);

    TU_OK(sim_fleet_load(shared_path("fleets/alibaba-v2026-spot-nodes.csv"), "alibaba-v2026", NULL, &f));
    assert_int_equal(f.n, 4278);
    gpus = 0;
    for (size_t i = 0; i < f.n; i++) gpus += f.nodes[i].gpus;
    assert_int_equal(gpus, 10412);
    assert_string_equal(f.nodes[0].id, "node-0");
    sim_fleet_free(&f);
}

static void test_fleet_bad_input(void **state)
{
    static const struct {
        const char *text, *format, *needle;
    } rows[] = {
        {"node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour\nn1,z,f,t,8,1\nn2,z,f,t,twenty,1\n",
         "shoal", "bad.csv:3: gpus \"twenty\" is not a whole number 1..16"},
        {"node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour\nn1,z,f,t,17,1\n", "shoal",
         "bad.csv:2: gpus \"17\" is not a whole number 1..16"},
        {"node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour\nn1,z,,t,8,1\n", "shoal",
         "bad.csv:2: fabric \"\" must be 1..63 characters"},
        {"node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour\nn1,z,f,t,8,-2\n", "shoal",
         "bad.csv:2: price_per_gpu_hour \"-2\" is not a number"},
        {"node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour\nn1,z,f,t,8\n", "shoal",
         "bad.csv:2: 5 fields where the header (line 1) has 6"},
        {"id,zone\nn1,z\n", "shoal", "bad.csv:1: unknown column \"id\""},
        {"sn,cpu_milli,memory_mib,gpu,model\nx,1,1,x,P100\n", "alibaba-v2023", "bad.csv:2: field gpu"},
        {"", "shoal", "bad.csv: no header line"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        tu_write_file(tu_path("bad.csv"), rows[i].text, strlen(rows[i].text));
        sim_fleet f;
        int rc = sim_fleet_load(tu_path("bad.csv"), rows[i].format, NULL, &f);
        if (rc == 0 || !strstr(sh_errmsg(), rows[i].needle))
            fail_msg("row %zu: rc %d, message \"%s\" lacks \"%s\"", i, rc, sh_errmsg(), rows[i].needle);
    }
    sim_fleet f;
    TU_ERR(sim_fleet_load(tu_path("bad.csv"), "yaml", NULL, &f), SH_EINVAL, "unknown fleet format");
}

/* ---- Traces --------------------------------------------------------------------- */

static void test_trace_gavel(void **state)
{
    NEED_SHARED();
    sim_trace t;
    TU_OK(sim_trace_load(shared_path("traces/philly-gavel/0e4a51.trace"), "gavel", NULL, &t));
    assert_int_equal(t.n, 1181);
    /* Line 1: Transformer (batch size 128), 95121 steps, 1 GPU: its v100
     * throughput gives 17465.876 s; p100 runs it at 0.5644 and k80 at
     * 0.1802 of that speed (worked out from the JSON by hand). */
    const sim_job *j = NULL;
    for (size_t i = 0; i < t.n; i++)
        if (!strcmp(t.jobs[i].id, "0e4a51-1")) j = &t.jobs[i];
    assert_non_null(j);
    assert_true(fabs(j->duration_s - 17465.876284) < 1e-3);
    assert_int_equal(j->n_types, 3);
    assert_string_equal(j->gpu_types[0], "v100");
    assert_true(fabs(j->speed[1] - 0.564355) < 1e-5 && fabs(j->speed[2] - 0.180236) < 1e-5);
    assert_string_equal(j->tenant, "0e4a51");
    for (size_t i = 1; i < t.n; i++) assert_true(t.jobs[i].submit_s >= t.jobs[i - 1].submit_s);
    /* Round trip through the shoal trace CSV, with a type map. */
    TU_OK(sim_trace_write(&t, tu_path("t.csv")));
    sim_trace u;
    sim_trace_opts o = {NULL, "v100=V100M32|V100M16,k80=T4"};
    TU_OK(sim_trace_load(tu_path("t.csv"), "shoal", &o, &u));
    assert_int_equal(u.n, t.n);
    for (size_t i = 0; i < u.n; i++) {
        assert_string_equal(u.jobs[i].id, t.jobs[i].id);
        assert_true(fabs(u.jobs[i].duration_s - t.jobs[i].duration_s) < 1e-3);
    }
    j = &u.jobs[0];
    assert_int_equal(j->n_types, 4);
    assert_string_equal(j->gpu_types[0], "V100M32");
    assert_string_equal(j->gpu_types[1], "V100M16");
    assert_string_equal(j->gpu_types[2], "p100");
    assert_string_equal(j->gpu_types[3], "T4");
    sim_trace_free(&u);
    sim_trace_free(&t);
    /* Every Philly trace loads; the wide ones are packed into 8-GPU nodes. */
    static const char *const vcs[] = {"0e4a51", "103959", "11cb48", "23dbec", "2869ce", "51b7ef",
                                      "6214e9", "6c71a0", "795a4c", "7f04ca", "925e2b", "b436b2",
                                      "e13805", "ed69ec", "ee9e8c"};
    size_t total = 0;
    int widest = 0;
    for (size_t v = 0; v < 15; v++) {
        char rel[128];
        snprintf(rel, sizeof rel, "traces/philly-gavel/%s.trace", vcs[v]);
        TU_OK(sim_trace_load(shared_path(rel), "gavel", NULL, &t));
        total += t.n;
        for (size_t i = 0; i < t.n; i++) {
            assert_true(t.jobs[i].gpus_per_node <= 8);
            if (t.jobs[i].nodes > widest) widest = t.jobs[i].nodes;
        }
        sim_trace_free(&t);
    }
    assert_int_equal(total, 15264);
    assert_int_equal(widest, 8); /* the one 64-GPU job */
}

static void test_trace_alibaba(void **state)
{
    NEED_SHARED();
    sim_trace t;
    TU_OK(sim_trace_load(shared_path("traces/alibaba-v2023/openb_pod_list_default.csv"), "alibaba-v2023", NULL, &t));
    /* 8,152 pods: 1,949 are CPU-only or were never scheduled. */
    assert_int_equal(t.n, 6203);
    assert_int_equal(t.skipped, 1949);
    int eight = 0;
    for (size_t i = 0; i < t.n; i++) eight += t.jobs[i].gpus_per_node == 8;
    assert_int_equal(eight, 44);
    assert_string_equal(t.jobs[0].id, "openb-pod-0000");
    assert_true(fabs(t.jobs[0].duration_s - 12537496) < 1e-6);
    assert_string_equal(t.jobs[0].tenant, "LS");
    assert_int_equal(t.jobs[0].priority, 1);
    sim_trace_free(&t);
}

static void test_trace_bad_input(void **state)
{
#define H "job_id,submit_s,tenant,kind,nodes,gpus_per_node,gpu_types,duration_s,priority\n"
    static const struct {
        const char *text, *needle;
    } rows[] = {
        {H "a,0,t,gang,2,8,*,100,0\nb,1,t,batch,1,1,*,10,0\n", "t.csv:3: field kind: \"batch\" is not gang"},
        {H "a,0,t,gang,2,8,*,-1,0\n", "t.csv:2: field duration_s"},
        {H "a,x,t,gang,2,8,*,1,0\n", "t.csv:2: field submit_s: \"x\" is not a number"},
        {H "a,0,t,gang,2,8,v100:0|p100,1,0\n", "t.csv:2: field gpu_types (speed)"},
        {H "a,0,t,function,1,2,*,1,0\n", "t.csv:2: field nodes: a function takes 1 node x 1 GPU"},
        {H "a,0,t,elastic,4-2,1,*,1,0\n", "t.csv:2: field nodes (max replicas): 2 is outside 4..4096"},
        {H "a,0,t,gang,1,1,*,1,0\nb,0,t,gang,1,1,*,1,0\na,1,t,gang,1,1,*,1,0\n",
         "t.csv:4: job id \"a\" appears again (first at line 2)"},
        {H "a,0,t,gang,1,1,*,1\n", "t.csv:2: expected 9 fields"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        tu_write_file(tu_path("t.csv"), rows[i].text, strlen(rows[i].text));
        sim_trace t;
        int rc = sim_trace_load(tu_path("t.csv"), "shoal", NULL, &t);
        if (rc == 0 || !strstr(sh_errmsg(), rows[i].needle))
            fail_msg("row %zu: rc %d, message \"%s\" lacks \"%s\"", i, rc, sh_errmsg(), rows[i].needle);
    }
    /* Bytes no importer may read past: a NUL (which once ended the file
     * there, silently), a byte order mark, an over-long line; in traces
     * and fleets alike. */
    static const struct {
        const char *text;
        size_t len;
        const char *needle;
    } bin[] = {
        {H "a,0,t,gang,1,1,*,1,0\nb,0,t,g\0ang,1,1,*,1,0\n", sizeof H + 30, "t.csv:3: NUL byte at column 8"},
        {"\xef\xbb\xbf" H "a,0,t,gang,1,1,*,1,0\n", sizeof H + 23, "t.csv:1: the file starts with a UTF-8 byte order mark"},
    };
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++) {
        tu_write_file(tu_path("t.csv"), bin[i].text, bin[i].len);
        sim_trace t;
        int rc = sim_trace_load(tu_path("t.csv"), "shoal", NULL, &t);
        if (rc == 0 || !strstr(sh_errmsg(), bin[i].needle))
            fail_msg("binary row %zu: rc %d, message \"%s\" lacks \"%s\"", i, rc, sh_errmsg(), bin[i].needle);
        sim_fleet f;
        rc = sim_fleet_load(tu_path("t.csv"), "shoal", NULL, &f);
        if (rc == 0 || !strstr(sh_errmsg(), "t.csv:")) fail_msg("fleet row %zu: rc %d: %s", i, rc, sh_errmsg());
    }
    size_t big = SIM_MAX_LINE_TEST + 100;
    char *longl = malloc(big + sizeof H + 64);
    int off = snprintf(longl, sizeof H + 64, H "a,0,t,gang,1,1,*,1,0\n");
    memset(longl + off, 'x', big);
    memcpy(longl + off + big, ",0\n", 4);
    tu_write_file(tu_path("t.csv"), longl, (size_t)off + big + 3);
    free(longl);
    sim_trace lt;
    TU_ERR(sim_trace_load(tu_path("t.csv"), "shoal", NULL, &lt), SH_EFORMAT, "t.csv:3: line longer than");
    const char *dupf = "node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour\nn0,z,f,v100,8,1\nn1,z,f,v100,8,1\nn0,z,f,v100,8,1\n";
    tu_write_file(tu_path("f.csv"), dupf, strlen(dupf));
    sim_fleet df;
    TU_ERR(sim_fleet_load(tu_path("f.csv"), "shoal", NULL, &df), SH_EFORMAT,
           "f.csv:4: node \"n0\" was already declared on line 2");
    const char *gavel = "ResNet-18 (batch size 16)\tcmd\t-n\t1\tmany\t0\t1\n";
    tu_write_file(tu_path("x.trace"), gavel, strlen(gavel));
    sim_trace t;
    sim_trace_opts o = {tu_path("none.json"), NULL};
    TU_ERR(sim_trace_load(tu_path("x.trace"), "gavel", &o, &t), SH_ENOENT, "none.json");
    /* A missing trace is named, not the throughputs file beside it. */
    TU_ERR(sim_trace_load(tu_path("no.trace"), "gavel", NULL, &t), SH_ENOENT, "no.trace: No such file");
    TU_ERR(sim_trace_load(tu_path("x.trace"), "gavel", NULL, &t), SH_ENOENT,
           "x.trace: the gavel throughputs beside it (or give --throughputs FILE)");
#undef H
}

/* Gavel's current 10-field layout reads as the 7-field one it replaced. */
static void test_trace_gavel10(void **state)
{
    NEED_SHARED();
    const char *seven = "ResNet-18 (batch size 32)\tcd x && python3 main.py\t--num_steps\t1\t1104675\t6.000000\t1\n"
                        "Transformer (batch size 128)\tcd y && python3 train.py\t-step\t1\t95121\t10.5\t4\n";
    const char *ten = "ResNet-18 (batch size 32)\tcd x && python3 main.py\t/tmp/w\t--num_steps\t1\t1104675\t1\t1.0\tNone\t6.000000\n"
                      "Transformer (batch size 128)\tcd y && python3 train.py\t/tmp/w\t-step\t1\t95121\t4\t2.5\t1.2\t10.5\n";
    char p7[4096], p10[4096], thr[4096];
    snprintf(p7, sizeof p7, "%s", tu_path("v7.trace"));
    snprintf(p10, sizeof p10, "%s", tu_path("v10.trace"));
    snprintf(thr, sizeof thr, "%s", shared_path("traces/philly-gavel/gavel_simulation_throughputs.json"));
    tu_write_file(p7, seven, strlen(seven));
    tu_write_file(p10, ten, strlen(ten));
    sim_trace a, b;
    sim_trace_opts o = {thr, NULL};
    TU_OK(sim_trace_load(p7, "gavel", &o, &a));
    TU_OK(sim_trace_load(p10, "gavel", &o, &b));
    assert_int_equal(a.n, 2);
    assert_int_equal(b.n, 2);
    for (size_t i = 0; i < 2; i++) {
        assert_true(a.jobs[i].submit_s == b.jobs[i].submit_s);
        assert_true(a.jobs[i].duration_s == b.jobs[i].duration_s);
        assert_int_equal(a.jobs[i].nodes * a.jobs[i].gpus_per_node, b.jobs[i].nodes * b.jobs[i].gpus_per_node);
    }
    assert_true(b.jobs[1].submit_s == 10.5);
    sim_trace_free(&a), sim_trace_free(&b);
    const char *bad = "ResNet-18 (batch size 32)\tcd x\t/tmp/w\t--num_steps\t1\t1104675\t1\t1.0\tsoon\t6\n";
    tu_write_file(p10, bad, strlen(bad));
    TU_ERR(sim_trace_load(p10, "gavel", &o, &b), SH_EFORMAT, "v10.trace:1: field SLO");
}

/* ---- Transforms ------------------------------------------------------------------ */

static void test_multinode_table(void **state)
{
    static const struct {
        int nodes, gpn, k, node_gpus, want_nodes, want_gpn;
    } rows[] = {
        {1, 1, 4, 8, 1, 4},  /* 4 GPUs still fit one node */
        {1, 4, 4, 8, 2, 8},  /* 16 GPUs: two full nodes */
        {1, 8, 8, 8, 8, 8},  /* 64 GPUs: eight */
        {1, 3, 3, 8, 2, 8},  /* 9 GPUs round up to two nodes */
        {2, 8, 2, 8, 4, 8},
        {1, 2, 2, 4, 1, 4},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        sim_job j;
        memset(&j, 0, sizeof j);
        j.kind = SCHED_GANG, j.nodes = rows[i].nodes, j.gpus_per_node = rows[i].gpn;
        sim_trace t = {&j, 1, 1, 0};
        TU_OK(sim_trace_multinode(&t, rows[i].k, rows[i].node_gpus));
        assert_int_equal(j.nodes, rows[i].want_nodes);
        assert_int_equal(j.gpus_per_node, rows[i].want_gpn);
    }
}

static void test_kalos_calibration(void **state)
{
    sim_trace t = {0};
    TU_OK(sim_trace_kalos(&t, 20000, 7, 4096, 0.8));
    double sum = 0, work = 0;
    int max = 0;
    for (size_t i = 0; i < t.n; i++) {
        int g = t.jobs[i].nodes * t.jobs[i].gpus_per_node;
        assert_true(g > 0 && (g & (g - 1)) == 0); /* a power of two */
        sum += g, work += g * t.jobs[i].duration_s;
        if (g > max) max = g;
        if (i) assert_true(t.jobs[i].submit_s >= t.jobs[i - 1].submit_s);
    }
    double mean = sum / (double)t.n;
    if (fabs(mean - 26.8) > 26.8 * 0.1) fail_msg("mean GPUs per job %.2f, expected 26.8 +- 10%%", mean);
    assert_true(max <= 1024 && max >= 256);
    /* Offered load: GPU-seconds over the arrival span / fleet GPUs ~ 0.8. */
    double load = work / t.jobs[t.n - 1].submit_s / 4096;
    assert_true(load > 0.6 && load < 1.0);
    sim_trace_free(&t);
}

/* ---- End to end ------------------------------------------------------------------- */

static json_t *run_json(const char *args)
{
    char *out = NULL;
    int rc = tu_run(&out, "%s sim %s --json 2>%s", tu_shoal(), args, tu_path("err.txt"));
    if (rc != 0) {
        size_t n;
        char *err = (char *)tu_read_file(tu_path("err.txt"), &n);
        fail_msg("shoal sim %s exited %d: %s", args, rc, err);
    }
    json_t *j;
    TU_OK(sh_json_parse(out, strlen(out), "shoal sim --json", &j));
    free(out);
    return j;
}

static void write_fleet(void)
{
    /* 2 zones x (v100: one 16-node fabric, p100: one 8-node fabric). */
    sh_buf b = {0};
    sh_buf_printf(&b, "node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour\n");
    for (int z = 0; z < 2; z++) {
        for (int n = 0; n < 16; n++) sh_buf_printf(&b, "z%d-v%d,z%d,v100-f0,v100,8,0.9\n", z, n, z);
        for (int n = 0; n < 8; n++) sh_buf_printf(&b, "z%d-p%d,z%d,p100-f0,p100,8,0.5\n", z, n, z);
    }
    tu_write_file(tu_path("fleet.csv"), b.data, b.len);
    sh_buf_free(&b);
}

/* Two Philly VCs made multi-node (x4) on a 48-node fleet, every policy,
 * with failures, and sched_check after every event. */
static void test_replay_checked(void **state)
{
    NEED_SHARED();
    write_fleet();
    char args[2048];
    snprintf(args, sizeof args,
             "--fleet %s --format gavel --multi-node 4 --policy all --check --failures 2000 %s %s",
             tu_path("fleet.csv"), shared_path("traces/philly-gavel/2869ce.trace"),
             shared_path("traces/philly-gavel/e13805.trace"));
    json_t *all = run_json(args);
    static const char *const pols[] = {"fifo", "firstfit", "backfill", "shoal"};
    for (int p = 0; p < 4; p++) {
        json_t *r = json_object_get(all, pols[p]);
        assert_non_null(r);
        static const char *const keys[] = {"jobs_total", "jobs_completed", "jobs_rejected", "partial_gangs",
                                           "utilization", "jct_mean_s", "cost", "decisions_per_s",
                                           "wait_p99_s_by_nodes", "wait_p50_s_by_nodes"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (!json_object_get(r, keys[k])) fail_msg("%s: no \"%s\" in the report", pols[p], keys[k]);
        json_t *by = json_object_get(r, "wait_p99_s_by_nodes");
        assert_int_equal(json_object_size(by), 5);
        for (int b = 0; b < SIM_BUCKETS; b++) assert_non_null(json_object_get(by, sim_bucket_names[b]));
        assert_int_equal(json_integer_value(json_object_get(r, "jobs_total")), 1140);
        int64_t done = json_integer_value(json_object_get(r, "jobs_completed"));
        int64_t rej = json_integer_value(json_object_get(r, "jobs_rejected"));
        assert_int_equal(done + rej, 1140);
        int64_t partial = json_integer_value(json_object_get(r, "partial_gangs"));
        if (p == 1) assert_true(partial > 0); /* firstfit holds partial gangs... */
        else assert_int_equal(partial, 0);    /* ...the others never do */
        assert_true(json_integer_value(json_object_get(r, "failures")) > 0);
        /* Finished jobs are forgotten: the scheduler held fewer records at
         * once than the trace has jobs. */
        int64_t slots = json_integer_value(json_object_get(r, "sched_job_slots"));
        assert_true(slots > 0 && slots < 1140);
    }
    json_decref(all);
    /* The replace policy: gangs keep their survivors and wait for a spare. */
    snprintf(args, sizeof args,
             "--fleet %s --format gavel --multi-node 4 --policy shoal --check --failures 100 "
             "--replace-wait 600 %s",
             tu_path("fleet.csv"), shared_path("traces/philly-gavel/2869ce.trace"));
    json_t *r = run_json(args);
    assert_int_equal(json_integer_value(json_object_get(r, "jobs_completed")), 533);
    assert_true(json_integer_value(json_object_get(r, "replaces")) > 0);
    assert_true(json_integer_value(json_object_get(r, "failures_survived")) > 0);
    json_decref(r);
}

/* A gang larger than any fabric is rejected with its reason; autoscaling
 * with a quota lets it fit instead.  Replays of the shoal trace format. */
static void test_replay_reject_and_autoscale(void **state)
{
    write_fleet();
    const char *trace = "job_id,submit_s,tenant,kind,nodes,gpus_per_node,gpu_types,duration_s,priority\n"
                        "small,0,a,gang,2,8,v100,600,0\n"
                        "huge,10,a,gang,20,8,v100,600,0\n"
                        "fn,20,b,function,1,1,*,30,0\n"
                        "el,30,b,elastic,1-4,2,p100:1|v100:2,900,0\n";
    tu_write_file(tu_path("trace.csv"), trace, strlen(trace));
    char args[2048];
    snprintf(args, sizeof args, "--fleet %s --trace %s --check --policy shoal", tu_path("fleet.csv"), tu_path("trace.csv"));
    json_t *r = run_json(args);
    assert_int_equal(json_integer_value(json_object_get(r, "jobs_rejected")), 1);
    assert_int_equal(json_integer_value(json_object_get(r, "jobs_completed")), 3);
    json_decref(r);
    snprintf(args, sizeof args,
             "--fleet %s --trace %s --check --policy shoal --autoscale --scale-up-wait 60 "
             "--quota z0,v100-f0,v100,8,8,0.9,120",
             tu_path("fleet.csv"), tu_path("trace.csv"));
    r = run_json(args);
    assert_int_equal(json_integer_value(json_object_get(r, "jobs_rejected")), 0);
    assert_int_equal(json_integer_value(json_object_get(r, "jobs_completed")), 4);
    assert_true(json_integer_value(json_object_get(r, "scale_ups")) >= 1);
    /* huge waited for the scale-up threshold plus the provider's delay. */
    json_t *p99 = json_object_get(json_object_get(r, "wait_p99_s_by_nodes"), "17-64");
    assert_true(json_real_value(p99) >= 180 - 1e-6);
    json_decref(r);
}

static void test_cli_errors(void **state)
{
    write_fleet();
    const char *trace = "job_id,submit_s,tenant,kind,nodes,gpus_per_node,gpu_types,duration_s,priority\n"
                        "a,0,t,gang,1,8,*,1,0\nb,zero,t,gang,1,8,*,1,0\n";
    tu_write_file(tu_path("bad.csv"), trace, strlen(trace));
    char *out = NULL;
    int rc = tu_run(&out, "%s sim --fleet %s --trace %s 2>&1", tu_shoal(), tu_path("fleet.csv"), tu_path("bad.csv"));
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "bad.csv:3: field submit_s: \"zero\" is not a number"));
    free(out);
    /* Every job rejected: a failed run, with the first reason. */
    const char *none = "job_id,submit_s,tenant,kind,nodes,gpus_per_node,gpu_types,duration_s,priority\n"
                       "a,0,t,gang,1,8,h100,1,0\nb,1,t,gang,1,8,h100,1,0\n";
    tu_write_file(tu_path("none.csv"), none, strlen(none));
    rc = tu_run(&out, "%s sim --fleet %s --trace %s 2>&1", tu_shoal(), tu_path("fleet.csv"), tu_path("none.csv"));
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "all 2 jobs were rejected"));
    assert_non_null(strstr(out, "job a rejected: unknown GPU type \"h100\""));
    free(out);
    rc = tu_run(&out, "%s sim --fleet %s --policy lottery --trace x 2>&1", tu_shoal(), tu_path("fleet.csv"));
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "unknown --policy \"lottery\" (use fifo, firstfit, backfill, shoal or all)"));
    free(out);
    rc = tu_run(&out, "%s sim --bogus 2>&1", tu_shoal());
    assert_int_equal(rc, 2);
    free(out);
    rc = tu_run(&out, "%s sim --help", tu_shoal());
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "--policy"));
    free(out);
}

/* Every count of decisions the scheduler keeps (sched_stats) is the same
 * in a and b, the replays of one trace by the fast and the reference
 * search: the same decisions, and the same preemptions turned down. */
static void same_counts(const sim_report *a, const sim_report *b, const char *what)
{
    const sched_stats *x = &a->sched, *y = &b->sched;
    const struct {
        const char *name;
        uint64_t a, b;
    } f[] = {{"decisions", x->decisions, y->decisions},
             {"starts", x->starts, y->starts},
             {"preemptions", x->preemptions, y->preemptions},
             {"requeues", x->requeues, y->requeues},
             {"replaces", x->replaces, y->replaces},
             {"shrinks", x->shrinks, y->shrinks},
             {"rejected", x->rejected, y->rejected},
             {"partial_gangs", x->partial_gangs, y->partial_gangs},
             {"hold_timeouts", x->hold_timeouts, y->hold_timeouts},
             {"scale_ups", x->scale_ups, y->scale_ups},
             {"scale_downs", x->scale_downs, y->scale_downs},
             {"resv_late", x->resv_late, y->resv_late},
             {"forgotten", x->forgotten, y->forgotten},
             {"preempt_declined", x->preempt_declined, y->preempt_declined},
             {"restarts (report)", a->restarts, b->restarts},
             {"failures (report)", a->failures, b->failures}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].a != f[i].b)
            fail_msg("%s: sched_stats.%s is %llu, the reference's %llu", what, f[i].name, (unsigned long long)f[i].a,
                     (unsigned long long)f[i].b);
    if (x->held_gpu_s != y->held_gpu_s) fail_msg("%s: held_gpu_s %g, the reference's %g", what, x->held_gpu_s, y->held_gpu_s);
}

/* The optimised search (preemption index and memo, shape sweeps, cached
 * reservation times, per-type pool maxima) against the reference search
 * (sched_config.reference) on mixed workloads with functions, elastic
 * jobs, gangs of up to 64 nodes, priorities and node failures: the two
 * must make the same decision stream (a hash of every decision in order,
 * with its time, job, nodes and GPUs), and so agree on every figure and
 * every count of the scheduler's (same_counts).  Two loads: at 0.95 some
 * gangs preempt, at 1.3 the queue runs deep. */
static void test_mixed_reference_same(void **state)
{
    (void)state;
    sim_fleet f;
    TU_OK(sim_fleet_mixed(&f, 600, 64));
    int gpus = 0;
    for (size_t i = 0; i < f.n; i++) gpus += f.nodes[i].gpus;
    static const double loads[] = {0.95, 1.3};
    uint64_t hashes[2][2];
    for (int li = 0; li < 2; li++) {
        sim_trace t = {0};
        TU_OK(sim_trace_mixed(&t, 1500, 5 + (uint64_t)li, gpus, loads[li]));
        size_t kinds[3] = {0};
        for (size_t i = 0; i < t.n; i++) kinds[t.jobs[i].kind]++;
        assert_true(kinds[SCHED_FUNCTION] > 500 && kinds[SCHED_ELASTIC] > 150 && kinds[SCHED_GANG] > 450);
        for (int pol = SCHED_POLICY_BACKFILL; pol <= SCHED_POLICY_SHOAL; pol++) {
            sim_report r[2];
            for (int ref = 0; ref < 2; ref++) {
                sim_opts o;
                memset(&o, 0, sizeof o);
                sched_config_default(&o.cfg, (sched_policy)pol);
                o.cfg.reference = ref;
                o.mtbf_hours = 2000, o.seed = 5;
                TU_OK(sim_run(&f, &t, &o, &r[ref]));
            }
            assert_int_equal(r[0].jobs_completed, t.n);
            assert_int_equal(r[0].decisions, r[1].decisions);
            assert_true(r[0].decisions_hash == r[1].decisions_hash);
            char what[64];
            snprintf(what, sizeof what, "load %.2f, %s", loads[li], sched_policy_name((sched_policy)pol));
            same_counts(&r[0], &r[1], what);
            assert_true(r[0].jct_mean_s == r[1].jct_mean_s);
            assert_true(r[0].cost == r[1].cost);
            for (int b = 0; b < SIM_BUCKETS; b++)
                assert_true(r[0].wait_p99_s_by_nodes[b] == r[1].wait_p99_s_by_nodes[b] ||
                            (isnan(r[0].wait_p99_s_by_nodes[b]) && isnan(r[1].wait_p99_s_by_nodes[b])));
            if (pol == SCHED_POLICY_SHOAL) assert_true(r[0].preemptions > 0);
            hashes[li][pol - SCHED_POLICY_BACKFILL] = r[0].decisions_hash;
        }
        sim_trace_free(&t);
    }
    /* The hash tells decision streams apart: the policies decide differently. */
    assert_true(hashes[0][0] != hashes[0][1] && hashes[1][0] != hashes[1][1]);
    sim_fleet_free(&f);
}

/* The same for shoal on longer replays at the mix's load (0.85), where the
 * queue stays long and most of it is gangs too large to start: the walk's
 * shortcuts past such jobs (shapes marked dead and unable to preempt,
 * kept across cycles and looked at again only in pools that gained room)
 * must leave every decision as the reference makes it, preemptions
 * included.  Passing over jobs of such shapes in every tenant queue at
 * once, while a later preemption could still revive them, changed the
 * decisions of the third replay here and of none of the shorter ones
 * above.  Gangs that preempt_wait turns down are counted alike too: the
 * walk's stop past shapes whose victims would all be turned down once
 * skipped gangs the reference counted (857 against 1,413 turn-downs on
 * the first seed). */
static void test_mixed_reference_deep(void **state)
{
    (void)state;
    sim_fleet f;
    TU_OK(sim_fleet_mixed(&f, 600, 128));
    int gpus = 0;
    for (size_t i = 0; i < f.n; i++) gpus += f.nodes[i].gpus;
    uint64_t preemptions = 0, declined = 0;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        sim_trace t = {0};
        TU_OK(sim_trace_mixed(&t, 4000, seed, gpus, 0.85));
        sim_report r[2];
        for (int ref = 0; ref < 2; ref++) {
            sim_opts o;
            memset(&o, 0, sizeof o);
            sched_config_default(&o.cfg, SCHED_POLICY_SHOAL);
            o.cfg.reference = ref;
            TU_OK(sim_run(&f, &t, &o, &r[ref]));
        }
        assert_int_equal(r[0].jobs_completed, t.n);
        assert_int_equal(r[0].decisions, r[1].decisions);
        if (r[0].decisions_hash != r[1].decisions_hash)
            fail_msg("seed %llu: the decision streams differ (%016llx, reference %016llx)", (unsigned long long)seed,
                     (unsigned long long)r[0].decisions_hash, (unsigned long long)r[1].decisions_hash);
        char what[32];
        snprintf(what, sizeof what, "seed %llu", (unsigned long long)seed);
        same_counts(&r[0], &r[1], what);
        preemptions += r[0].preemptions, declined += r[0].preempt_declined;
        sim_trace_free(&t);
    }
    assert_true(preemptions > 0 && declined > 0);
    sim_fleet_free(&f);
}

/* Replays t on f under backfill and shoal (no failures, no estimates). */
static void both(const sim_fleet *f, const sim_trace *t, sim_report r[2])
{
    for (int k = 0; k < 2; k++) {
        sim_opts o;
        memset(&o, 0, sizeof o);
        sched_config_default(&o.cfg, k ? SCHED_POLICY_SHOAL : SCHED_POLICY_BACKFILL);
        TU_OK(sim_run(f, t, &o, &r[k]));
        assert_int_equal(r[k].jobs_completed + r[k].jobs_rejected, t->n);
    }
}

/* --jobs-out: one line per job, whose waits give the report's p99 by
 * gang size and whose preemptions add up to the report's; with --policy
 * all the CLI writes one file per policy. */
static int cmp_dbl_t(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void test_jobs_out(void **state)
{
    (void)state;
    sim_fleet f;
    TU_OK(sim_fleet_mixed(&f, 64, 32));
    sim_trace t = {0};
    TU_OK(sim_trace_mixed(&t, 800, 3, 64 * 8, 0.9));
    sim_opts o;
    memset(&o, 0, sizeof o);
    sched_config_default(&o.cfg, SCHED_POLICY_SHOAL);
    o.cfg.preempt_wait = 0; /* preempt whenever victims make room: some preemptions to count */
    o.jobs_out = tu_path("jobs.csv");
    sim_report r;
    TU_OK(sim_run(&f, &t, &o, &r));
    assert_true(r.preemptions > 0);
    size_t n;
    char *text = (char *)tu_read_file(o.jobs_out, &n), *pos = text, *line;
    line = strsep(&pos, "\n");
    assert_string_equal(line, "id,tenant,kind,nodes,gpus_per_node,priority,submit_s,duration_s,start_s,wait_s,"
                              "end_s,jct_s,preemptions,shrinks");
    double *w[SIM_BUCKETS];
    size_t nb[SIM_BUCKETS] = {0}, lines = 0, done = 0, rejected = 0;
    uint64_t pre = 0;
    for (int b = 0; b < SIM_BUCKETS; b++) w[b] = calloc(t.n, sizeof(double));
    while ((line = strsep(&pos, "\n")) && *line) {
        char *fld[14], *q = line;
        int k = 0;
        while (k < 14 && (fld[k] = strsep(&q, ","))) k++;
        assert_int_equal(k, 14);
        assert_null(q);
        const sim_job *j = &t.jobs[lines++];
        assert_string_equal(fld[0], j->id);
        assert_int_equal(atoi(fld[3]), j->nodes);
        if (!*fld[8]) { /* rejected (larger than any pool): never started */
            assert_true(!*fld[9] && !*fld[10] && !*fld[11]);
            rejected++;
            continue;
        }
        assert_true(*fld[10]); /* every job that started ended */
        double sub = atof(fld[6]), start = atof(fld[8]), wait = atof(fld[9]), end = atof(fld[10]);
        assert_true(fabs(sub - j->submit_s) < 1e-3 && fabs(start - sub - wait) < 2e-3);
        assert_true(end >= start && fabs(atof(fld[11]) - (end - sub)) < 2e-3);
        int b = j->nodes <= 1 ? 0 : j->nodes <= 4 ? 1 : j->nodes <= 16 ? 2 : j->nodes <= 64 ? 3 : 4;
        w[b][nb[b]++] = wait;
        pre += (uint64_t)atoi(fld[12]);
        done++;
    }
    assert_int_equal(lines, t.n);
    assert_int_equal(done, r.jobs_completed);
    assert_int_equal(rejected, r.jobs_rejected);
    assert_true(done > 700);
    assert_int_equal(pre, r.preemptions);
    for (int b = 0; b < SIM_BUCKETS; b++) {
        if (!nb[b]) {
            assert_true(isnan(r.wait_p99_s_by_nodes[b]));
            free(w[b]);
            continue;
        }
        qsort(w[b], nb[b], sizeof(double), cmp_dbl_t);
        size_t i = (size_t)ceil(0.99 * (double)nb[b]) - 1;
        assert_true(fabs(w[b][i] - r.wait_p99_s_by_nodes[b]) < 2e-3);
        free(w[b]);
    }
    free(text);
    /* The CLI: one file per policy, named after it. */
    char args[1024];
    snprintf(args, sizeof args, "--fleet mixed:64 --fabric-nodes 32 --format mixed --jobs 200 --seed 3 --policy all "
             "--no-estimates --jobs-out %s", tu_path("per-job.csv"));
    json_decref(run_json(args));
    static const char *const pols[] = {"fifo", "firstfit", "backfill", "shoal"};
    for (int p = 0; p < 4; p++) {
        char name[64];
        snprintf(name, sizeof name, "per-job.%s.csv", pols[p]);
        char *x = (char *)tu_read_file(tu_path(name), &n);
        size_t nl = 0;
        for (size_t k = 0; k < n; k++) nl += x[k] == '\n';
        assert_int_equal(nl, 201);
        free(x);
    }
    sim_trace_free(&t);
    sim_fleet_free(&f);
}

/* --waits-out: each job's queued seconds by the core's wait reason add up
 * to its wait, its start pool is one of the fleet's, and reading the
 * reasons after every cycle changes no decision. */
static void test_waits_out(void **state)
{
    (void)state;
    sim_fleet f;
    TU_OK(sim_fleet_mixed(&f, 64, 32));
    sim_trace t = {0};
    TU_OK(sim_trace_mixed(&t, 800, 5, 64 * 8, 0.9));
    /* fifo too: its deep queue is where the reasons cost (the reason-only query). */
    static const sched_policy pols[] = {SCHED_POLICY_FIFO, SCHED_POLICY_BACKFILL, SCHED_POLICY_SHOAL};
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0]; pi++) {
        sched_policy pol = pols[pi];
        sim_opts o;
        memset(&o, 0, sizeof o);
        sched_config_default(&o.cfg, pol);
        sim_report r[2];
        TU_OK(sim_run(&f, &t, &o, &r[0]));
        o.waits_out = tu_path("waits.csv");
        TU_OK(sim_run(&f, &t, &o, &r[1]));
        assert_true(r[0].decisions_hash == r[1].decisions_hash);
        size_t n;
        char *text = (char *)tu_read_file(o.waits_out, &n), *pos = text, *line;
        line = strsep(&pos, "\n");
        assert_string_equal(line, "id,tenant,nodes,gpus_per_node,submit_s,start_s,wait_s,start_pool,resources_s,"
                                  "reservation_s,reserved_s,fair_share_s,next_cycle_s,nodes_down_s,other_s,last_reason");
        size_t lines = 0, started = 0;
        double by[7] = {0};
        while ((line = strsep(&pos, "\n")) && *line) {
            char *fld[16], *q = line;
            int k = 0;
            while (k < 15 && (fld[k] = strsep(&q, ","))) k++;
            assert_int_equal(k, 15);
            assert_non_null(q); /* the last reason: the rest of the line */
            const sim_job *j = &t.jobs[lines++];
            assert_string_equal(fld[0], j->id);
            assert_int_equal(atoi(fld[2]), j->nodes);
            if (!*fld[5]) { /* rejected: never queued, never started */
                assert_true(!*fld[6] && !*fld[7]);
                continue;
            }
            started++;
            double sum = 0;
            for (int w = 0; w < 7; w++) sum += atof(fld[8 + w]), by[w] += atof(fld[8 + w]);
            assert_true(fabs(sum - atof(fld[6])) < 1e-2);
            if (atof(fld[6]) > 0) assert_true(*q); /* a job that waited has a reason */
            int found = 0;
            for (size_t x = 0; x < f.n && !found; x++) {
                char pool[3 * SIM_NAME + 3];
                snprintf(pool, sizeof pool, "%s/%s/%s", f.nodes[x].zone, f.nodes[x].fabric, f.nodes[x].gpu_type);
                found = !strcmp(pool, fld[7]);
            }
            assert_true(found);
        }
        assert_int_equal(lines, t.n);
        assert_int_equal(started, r[1].jobs_completed);
        assert_true(by[0] > 0); /* resources */
        if (pol == SCHED_POLICY_FIFO) assert_true(by[2] == 0); /* no reservations */
        else assert_true(by[2] > 0); /* reserved: the head gang waits with a reservation */
        if (pol != SCHED_POLICY_SHOAL) assert_true(by[3] == 0); /* no fair share */
        else assert_true(by[3] > 0);
        free(text);
    }
    sim_trace_free(&t);
    sim_fleet_free(&f);
}

/* The targets: shoal's p99 wait in each gang-size bucket at most
 * 1.1x backfill's, its mean JCT at most 1.05x, and (strict) its p99 for
 * gangs of 17+ nodes lower, where such gangs waited at all. */
static void check_targets(const char *what, const sim_report r[2], int strict_big)
{
    for (int b = 0; b < SIM_BUCKETS; b++) {
        double bf = r[0].wait_p99_s_by_nodes[b], sh = r[1].wait_p99_s_by_nodes[b];
        if (isnan(bf)) continue;
        if (!(sh <= 1.1 * bf + 1e-9))
            fail_msg("%s: p99 wait of %s-node gangs %.0f s under shoal, %.0f s under backfill", what,
                     sim_bucket_names[b], sh, bf);
        if (b == 3 && strict_big && !(sh < bf))
            fail_msg("%s: p99 wait of 17-64-node gangs %.0f s, not below backfill's %.0f s", what, sh, bf);
    }
    if (!(r[1].jct_mean_s <= 1.05 * r[0].jct_mean_s))
        fail_msg("%s: mean JCT %.0f s under shoal, %.0f s under backfill", what, r[1].jct_mean_s, r[0].jct_mean_s);
}

static int cmp_submit_t(const void *a, const void *b)
{
    double x = ((const sim_job *)a)->submit_s, y = ((const sim_job *)b)->submit_s;
    return x < y ? -1 : x > y;
}

/* The targets where they hold: every shipped Philly trace (one tenant per
 * virtual cluster) made multi-node x10 on the example fleet, and one trace
 * x8 on a 192-node slice of it.  On the generated mixed workloads they do
 * not hold seed by seed (docs/sched.md, "Against backfill"): one replay's
 * p99 is the wait of a handful of jobs and moves by tens of percent with
 * any change of order.  There the bounds (p99 at most 1.1x in every
 * bucket, JCT at most 1.05x) hold for the geometric mean over seeds 1-20
 * of mixed:600 (what scripts/sched-quality.sh -s mixed600 reports; waits
 * under a minute count as a minute), and preemption runs.  Preempting
 * whenever victims make room (preempt_wait = 0) misses them: the 1-node
 * bucket at 1.11x. */
static void test_quality_targets(void **state)
{
    (void)state;
    sim_fleet f;
    TU_OK(sim_fleet_mixed(&f, 600, 128));
    int gpus = 0;
    for (size_t i = 0; i < f.n; i++) gpus += f.nodes[i].gpus;
    double lsum[SIM_BUCKETS + 1] = {0};
    int nsum[SIM_BUCKETS + 1] = {0};
    uint64_t preempted = 0;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        sim_trace t = {0};
        TU_OK(sim_trace_mixed(&t, 4000, seed, gpus, 0.85));
        sim_report r[2];
        both(&f, &t, r);
        preempted += r[1].preemptions;
        for (int b = 0; b < SIM_BUCKETS; b++) {
            double bf = r[0].wait_p99_s_by_nodes[b], sh = r[1].wait_p99_s_by_nodes[b];
            if (isnan(bf) || isnan(sh)) continue;
            lsum[b] += log(fmax(sh, 60) / fmax(bf, 60)), nsum[b]++;
        }
        lsum[SIM_BUCKETS] += log(r[1].jct_mean_s / r[0].jct_mean_s), nsum[SIM_BUCKETS]++;
        sim_trace_free(&t);
    }
    assert_true(preempted > 0);
    for (int b = 0; b <= SIM_BUCKETS; b++) {
        if (!nsum[b]) continue;
        double g = exp(lsum[b] / nsum[b]), bound = b < SIM_BUCKETS ? 1.1 : 1.05;
        if (!(g <= bound))
            fail_msg("mixed:600 seeds 1-20: geometric mean of shoal over backfill %.3fx for %s, over %.2fx", g,
                     b < SIM_BUCKETS ? sim_bucket_names[b] : "mean JCT", bound);
    }
    sim_fleet_free(&f);
    NEED_SHARED();
    sim_trace t = {0};
    sim_report r[2];
    TU_OK(sim_fleet_load("docs/examples/philly-fleet.csv", "shoal", NULL, &f));
    static const char *const vcs[] = {"0e4a51", "103959", "11cb48", "23dbec", "2869ce", "51b7ef", "6214e9", "6c71a0",
                                      "795a4c", "7f04ca", "925e2b", "b436b2", "e13805", "ed69ec", "ee9e8c"};
    memset(&t, 0, sizeof t);
    for (size_t i = 0; i < sizeof vcs / sizeof vcs[0]; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "traces/philly-gavel/%s.trace", vcs[i]);
        sim_trace one;
        TU_OK(sim_trace_load(shared_path(rel), "gavel", NULL, &one));
        sim_job *v = realloc(t.jobs, (t.n + one.n + 1) * sizeof *v);
        assert_non_null(v);
        memcpy(v + t.n, one.jobs, one.n * sizeof *v);
        t.jobs = v, t.n += one.n, t.cap = t.n + 1;
        sim_trace_free(&one);
    }
    TU_OK(sim_trace_multinode(&t, 10, 8));
    qsort(t.jobs, t.n, sizeof *t.jobs, cmp_submit_t);
    both(&f, &t, r);
    check_targets("philly x10", r, 1);
    sim_trace_free(&t);
    sim_fleet_free(&f);
    /* z0's first v100, p100 and k80 fabrics of docs/examples/philly-fleet.csv. */
    sim_fleet g = {calloc(192, sizeof(sim_node)), 0};
    static const char *const types[] = {"v100", "p100", "k80"};
    static const double price[] = {0.90, 0.50, 0.20};
    for (int y = 0; y < 3; y++)
        for (int k = 0; k < 64; k++) {
            sim_node *n = &g.nodes[g.n++];
            snprintf(n->id, SIM_NAME, "z0-%s-f0-n%02d", types[y], k);
            snprintf(n->zone, SIM_NAME, "z0");
            snprintf(n->fabric, SIM_NAME, "%s-f0", types[y]);
            snprintf(n->gpu_type, SIM_NAME, "%s", types[y]);
            n->gpus = 8, n->price_per_gpu_hour = price[y];
        }
    TU_OK(sim_trace_load(shared_path("traces/philly-gavel/b436b2.trace"), "gavel", NULL, &t));
    TU_OK(sim_trace_multinode(&t, 8, 8));
    both(&g, &t, r);
    /* One tenant, gangs only: nothing to preempt and no fair share, and
     * one pool of each type, so shoal decides as backfill does; 17+ can tie. */
    check_targets("philly b436b2 x8", r, 0);
    sim_trace_free(&t);
    sim_fleet_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fleet_alibaba),        cmocka_unit_test(test_fleet_bad_input),
        cmocka_unit_test(test_trace_gavel),          cmocka_unit_test(test_trace_alibaba),
        cmocka_unit_test(test_trace_bad_input),      cmocka_unit_test(test_multinode_table),
        cmocka_unit_test(test_kalos_calibration),    cmocka_unit_test(test_replay_checked),
        cmocka_unit_test(test_replay_reject_and_autoscale), cmocka_unit_test(test_cli_errors),
        cmocka_unit_test(test_mixed_reference_same), cmocka_unit_test(test_mixed_reference_deep),
        cmocka_unit_test(test_trace_gavel10),
        cmocka_unit_test(test_jobs_out),             cmocka_unit_test(test_waits_out),
        cmocka_unit_test(test_quality_targets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
