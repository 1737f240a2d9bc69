/* Tests for the one fleet file reader (src/common/fleetfile.c). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "shoal/fleetfile.h"
#include "app/mainjob/mainjob.h"
#include "app/mainjob/fleetcost/fleetcost_int.h"
#include "app/mainjob/report/report_int.h"
#include "app/mainjob/trainer/trainer_int.h"
#include "app/mainjob/worker/worker_int.h"
#include "shoal/sim.h"

/* The simulator's column order and `shoal up`'s give the same nodes. */
static void test_both_orders(void **state)
{
    sh_fleet_file a, b;
    TU_OK(sh_fleet_parse("node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour\n"
                         "n0,z0,ib-0,H100,8,3.95\n"
                         "n1,z1,eth-1,L4,2,0.80\n",
                         "sim.csv", NULL, &a));
    TU_OK(sh_fleet_parse("# comments and blank lines may come first\n\n"
                         "name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\r\n"
                         "n0,H100,8,z0,ib-0,3.95\r\n"
                         "  # an indented comment\n"
                         "n1, L4 ,2,z1,eth-1,0.80\n",
                         "up.csv", NULL, &b));
    assert_int_equal(a.n, 2);
    assert_int_equal(b.n, 2);
    for (size_t i = 0; i < 2; i++) {
        assert_string_equal(a.nodes[i].name, b.nodes[i].name);
        assert_string_equal(a.nodes[i].zone, b.nodes[i].zone);
        assert_string_equal(a.nodes[i].fabric, b.nodes[i].fabric);
        assert_string_equal(a.nodes[i].gpu_type, b.nodes[i].gpu_type);
        assert_int_equal(a.nodes[i].gpus, b.nodes[i].gpus);
        assert_true(a.nodes[i].price_per_gpu_hour == b.nodes[i].price_per_gpu_hour);
    }
    assert_string_equal(b.nodes[1].gpu_type, "L4");
    assert_int_equal(b.nodes[1].line, 6);
    assert_non_null(sh_fleet_find(&b, "n1"));
    assert_null(sh_fleet_find(&b, "n2"));
    sh_fleet_free(&a);
    sh_fleet_free(&b);
    sh_fleet_free(NULL);
}

/* Extra columns: refused by default, kept by name or all. */
static void test_extra_columns(void **state)
{
    const char *text = "name,gpu_type,gpus,zone,fabric,price_per_gpu_hour,speed,owner\n"
                       "a,H100,1,z,f,1,1.0,ops\n"
                       "b,L4,2,z,f,0.5,0.25,\n";
    sh_fleet_file f;
    TU_ERR(sh_fleet_parse(text, "x.csv", NULL, &f), SH_EFORMAT, "x.csv:1: unknown column \"speed\"");
    assert_int_equal(f.n, 0);
    const char *const keep_speed[] = {"speed", NULL};
    sh_fleet_opts o = {.keep = keep_speed};
    TU_ERR(sh_fleet_parse(text, "x.csv", &o, &f), SH_EFORMAT, "unknown column \"owner\" (columns: name or node_id, zone, fabric, gpu_type, gpus, price_per_gpu_hour, speed)");
    /* A misspelt required column: the suggestion is among the columns the
     * header lacks ("gpu" beside "gpus" means gpu_type). */
    TU_ERR(sh_fleet_parse("name,gpu,gpus,zone,fabric,price_per_gpu_hour\na,H100,1,z,f,1\n", "y.csv", NULL, &f),
           SH_EFORMAT, "y.csv:1: unknown column \"gpu\" (did you mean \"gpu_type\"? columns: name or node_id,");
    TU_ERR(sh_fleet_parse("name,gpu_type,gpus,zone,fabirc,price_per_gpu_hour\na,H100,1,z,f,1\n", "y.csv", NULL, &f),
           SH_EFORMAT, "unknown column \"fabirc\" (did you mean \"fabric\"? ");
    const char *const keep_both[] = {"speed", "owner", NULL};
    o.keep = keep_both;
    TU_OK(sh_fleet_parse(text, "x.csv", &o, &f));
    assert_int_equal(f.n_extra, 2);
    assert_string_equal(sh_fleet_extra(&f, 0, "speed"), "1.0");
    assert_string_equal(sh_fleet_extra(&f, 1, "speed"), "0.25");
    assert_string_equal(sh_fleet_extra(&f, 1, "owner"), "");
    assert_null(sh_fleet_extra(&f, 1, "colour"));
    assert_null(sh_fleet_extra(&f, 2, "speed"));
    sh_fleet_free(&f);
    sh_fleet_opts all = {.keep_all = 1};
    TU_OK(sh_fleet_parse(text, "x.csv", &all, &f));
    assert_string_equal(sh_fleet_extra(&f, 0, "owner"), "ops");
    sh_fleet_free(&f);
}

/* Each broken file is refused with its file, line and rule. */
static void test_errors_name_file_and_line(void **state)
{
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"", "bad.csv: no header line"},
        {"# only a comment\n", "bad.csv: no header line"},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n", "bad.csv: the fleet has no nodes"},
        {"name,gpu_type,gpus,zone,fabric\nn,H,1,z,f\n", "bad.csv:1: the header lacks the column \"price_per_gpu_hour\""},
        {"gpu_type,gpus,zone,fabric,price_per_gpu_hour\n", "lacks the column \"name (or node_id)\""},
        {"name,node_id,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n", "bad.csv:1: column \"name\" appears twice"},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour,\n", "bad.csv:1: header field 7 is empty"},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n\nn,H,1,z,f\n", "bad.csv:3: 5 fields where the header (line 1) has 6"},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H,1,z,f,1,2\n", "bad.csv:2: 7 fields"},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H,17,z,f,1\n", "bad.csv:2: gpus \"17\" is not a whole number 1..16"},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H,-1,z,f,1\n", "bad.csv:2: gpus \"-1\""},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H,0,z,f,1\n", "bad.csv:2: gpus \"0\""},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H,2x,z,f,1\n", "bad.csv:2: gpus \"2x\""},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H,2,z,f,-1\n", "bad.csv:2: price_per_gpu_hour \"-1\""},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H,2,z,f,nan\n", "price_per_gpu_hour \"nan\""},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H,2,z,f,\n", "price_per_gpu_hour \"\""},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n,H,2,z,f,1\n", "bad.csv:2: name \"\" must be 1..63 characters"},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\na b,H,2,z,f,1\n", "bad.csv:2: name \"a b\""},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H;rm,2,z,f,1\n", "bad.csv:2: gpu_type \"H;rm\""},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nn,H,2,z/../x,f,1\n", "bad.csv:2: zone"},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n"
         "n,H,2,z,0123456789012345678901234567890123456789012345678901234567890123,1\n",
         "bad.csv:2: fabric"},
        {"name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nb,H,1,z,f,1\na,H,1,z,f,1\n#\nb,H,2,z,f,1\n",
         "bad.csv:5: node \"b\" was already declared on line 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sh_fleet_file f;
        int rc = sh_fleet_parse(bad[i].text, "bad.csv", NULL, &f);
        if (rc != SH_EFORMAT || !strstr(sh_errmsg(), bad[i].needle))
            fail_msg("case %zu: rc %d, message \"%s\" lacks \"%s\"", i, rc, sh_errmsg(), bad[i].needle);
        assert_int_equal(f.n, 0);
        assert_null(f.nodes);
    }
    /* Too many columns, and a file that is not text. */
    char wide[2048] = "name,gpu_type,gpus,zone,fabric,price_per_gpu_hour";
    for (int k = 0; k < 40; k++) snprintf(wide + strlen(wide), sizeof wide - strlen(wide), ",c%d", k);
    sh_fleet_file f;
    sh_fleet_opts all = {.keep_all = 1};
    TU_ERR(sh_fleet_parse(wide, "wide.csv", &all, &f), SH_EFORMAT, "wide.csv:1: more than 32 columns");
    const char *p = tu_path("nul.csv");
    tu_write_file(p, "name\0x", 6);
    TU_ERR(sh_fleet_load(p, NULL, &f), SH_EFORMAT, "holds a NUL byte");
    TU_ERR(sh_fleet_load(tu_path("missing.csv"), NULL, &f), SH_ENOENT, "missing.csv");
}

/* The fleet files shipped with shoal, and a large generated one. */
static void test_real_files(void **state)
{
    static const char *const files[] = {"fleets/local-mixed.csv", "examples/fleet-local.csv",
                                        "docs/examples/philly-fleet.csv"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        sh_fleet_file f;
        TU_OK(sh_fleet_load(files[i], NULL, &f));
        assert_true(f.n >= 2);
        for (size_t k = 0; k < f.n; k++) assert_true(f.nodes[k].gpus >= 1);
        sh_fleet_free(&f);
    }
    /* 20000 nodes: the duplicate check stays fast, and the last line counts. */
    sh_buf b = {0};
    TU_OK(sh_buf_printf(&b, "fabric,gpus,gpu_type,price_per_gpu_hour,zone,node_id\n"));
    for (int i = 0; i < 20000; i++)
        TU_OK(sh_buf_printf(&b, "ib-%d,%d,%s,%.2f,z%d,node-%05d\n", i / 32, 1 + i % 8, i % 3 ? "A100" : "H100",
                            1.5 + i % 3, i % 4, i));
    const char *p = tu_path("big.csv");
    tu_write_file(p, b.data, b.len);
    sh_fleet_file f;
    TU_OK(sh_fleet_load(p, NULL, &f));
    assert_int_equal(f.n, 20000);
    assert_string_equal(f.nodes[19999].name, "node-19999");
    assert_string_equal(f.nodes[19999].fabric, "ib-624");
    assert_int_equal(f.nodes[19999].gpus, 8);
    assert_int_equal(f.nodes[19999].line, 20001);
    sh_fleet_free(&f);
    TU_OK(sh_buf_printf(&b, "f,1,H100,1,z,node-00007\n"));
    tu_write_file(p, b.data, b.len);
    TU_ERR(sh_fleet_load(p, NULL, &f), SH_EFORMAT, "big.csv:20002: node \"node-00007\" was already declared on line 9");
    sh_buf_free(&b);
}

/* The simulator, the main job and `shoal up` read the same file, in either
 * column order, to the same nodes. */
static void test_every_reader(void **state)
{
    const char *up = tu_path("up.csv"), *simf = tu_path("sim.csv"), *sp = tu_path("speeds.csv");
    const char *a = "# rollout and training nodes\nname,gpu_type,gpus,zone,fabric,price_per_gpu_hour\n"
                    "t0,H100,8,z1,ib,3.95\nr0,L4,2,z2,eth,0.80\n";
    const char *b = "node_id,zone,fabric,gpu_type,gpus,price_per_gpu_hour\nt0,z1,ib,H100,8,3.95\nr0,z2,eth,L4,2,0.80\n";
    tu_write_file(up, a, strlen(a));
    tu_write_file(simf, b, strlen(b));
    tu_write_file(sp, "gpu_type,speed\nH100,1\nL4,0.3\n", 29);
    const char *files[2] = {up, simf};
    for (int k = 0; k < 2; k++) {
        sim_fleet sf;
        TU_OK(sim_fleet_load(files[k], "shoal", NULL, &sf));
        assert_int_equal(sf.n, 2);
        assert_string_equal(sf.nodes[1].id, "r0");
        assert_string_equal(sf.nodes[1].fabric, "eth");
        assert_int_equal(sf.nodes[0].gpus, 8);
        assert_true(sf.nodes[0].price_per_gpu_hour == 3.95);
        sim_fleet_free(&sf);
        mj_fleet mf;
        TU_OK(mj_fleet_load(files[k], sp, &mf));
        assert_int_equal(mf.n, 2);
        assert_string_equal(mf.nodes[1].zone, "z2");
        assert_true(mf.nodes[1].speed == 0.3 && mf.nodes[1].price == 0.80);
        mj_fleet_free(&mf);
    }
    /* The same mistake gets the same message from each. */
    const char *bad = "name,gpu_type,gpus,zone,fabric,price_per_gpu_hour\nt0,H100,99,z1,ib,3.95\n";
    tu_write_file(up, bad, strlen(bad));
    sim_fleet sf;
    mj_fleet mf;
    TU_ERR(sim_fleet_load(up, "shoal", NULL, &sf), SH_EFORMAT, "up.csv:2: gpus \"99\" is not a whole number 1..16");
    TU_ERR(mj_fleet_load(up, sp, &mf), SH_EFORMAT, "up.csv:2: gpus \"99\" is not a whole number 1..16");
    char *out;
    assert_int_equal(tu_run(&out, "%s up --fleet %s --db %s --port 0 2>&1", tu_shoal(), up, tu_path("up/shoal.db")), 1);
    if (!strstr(out, "up.csv:2: gpus \"99\" is not a whole number 1..16")) fail_msg("shoal up: %s", out);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_both_orders),
        cmocka_unit_test(test_extra_columns),
        cmocka_unit_test(test_errors_name_file_and_line),
        cmocka_unit_test(test_real_files),
        cmocka_unit_test(test_every_reader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
