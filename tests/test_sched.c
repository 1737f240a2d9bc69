/* Tests for src/control/sched: placement, rejection, each invariant of sched_check,
 * each failure policy, preemption, backfill, firstfit's partial gangs,
 * autoscaling and billing -- small fleets whose answers were worked out by
 * hand (the expected values sit in the tables). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "control/sched/query_int.h"
#include "shoal/sched.h"

/* ---- Helpers --------------------------------------------------------------- */

static void same_reason(sched *s, uint32_t ix, double now);

typedef struct tnode_row {
    const char *id, *zone, *fabric, *type;
    int gpus;
    double price;
} tnode_row;

static sched *mk_cfg(const sched_config *c, const tnode_row *rows)
{
    sched *s = sched_new(c);
    assert_non_null(s);
    for (const tnode_row *r = rows; r && r->id; r++) {
        sched_node_spec n = {r->id, r->zone, r->fabric, r->type, r->gpus, r->price};
        TU_OK(sched_node_add(s, &n, 0));
    }
    return s;
}

static sched *mk(sched_policy pol, const tnode_row *rows)
{
    sched_config c;
    sched_config_default(&c, pol);
    return mk_cfg(&c, rows);
}

/* mk with the shortcuts off (ref = 1: sched_config.reference) or on. */
static sched *mk_ref(sched_policy pol, int ref, const tnode_row *rows)
{
    sched_config c;
    sched_config_default(&c, pol);
    c.reference = ref;
    return mk_cfg(&c, rows);
}

static sched_job_spec gang(const char *id, int nodes, int gpn, double est)
{
    sched_job_spec j;
    memset(&j, 0, sizeof j);
    j.id = id, j.kind = SCHED_GANG, j.nodes = nodes, j.gpus_per_node = gpn, j.est_s = est;
    return j;
}

static void submit(sched *s, sched_job_spec j, double now) { TU_OK(sched_job_submit(s, &j, now)); }

/* Steps and checks the invariants; returns the decision count. */
static int step(sched *s, double now, sched_decisions *d)
{
    int n = sched_step(s, now, d);
    assert_true(n >= 0);
    TU_OK(sched_check(s, now));
    return n;
}

static const sched_decision *find(const sched_decisions *d, sched_decision_kind k, const char *job)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i].kind == k && (!job || (d->v[i].job && !strcmp(d->v[i].job, job)))) return &d->v[i];
    return NULL;
}

static sched_job_state jstate(sched *s, const char *id)
{
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, id, 0, &ji));
    return ji.state;
}

/* The job's nodes, sorted, joined by commas. */
static const char *nodes_of(sched *s, const char *id)
{
    static char buf[512];
    sched_place p[64];
    size_t n = sched_job_alloc(s, id, p, 64);
    const char *names[64];
    for (size_t i = 0; i < n; i++) names[i] = p[i].node;
    for (size_t i = 0; i < n; i++)
        for (size_t k = i + 1; k < n; k++)
            if (strcmp(names[k], names[i]) < 0) {
                const char *t = names[i];
                names[i] = names[k], names[k] = t;
            }
    buf[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (i) strcat(buf, ",");
        strcat(buf, names[i]);
    }
    return buf;
}

/* ---- Placement -------------------------------------------------------------- */

/* Two pools in zone a (fabric f1: a1-a3, fabric f2: a4-a5, 8 x h100 each)
 * and one a10 node in zone b.  Jobs arrive one per step; each row gives the
 * nodes it must get (any of the '|'-separated answers; "-" waits), worked
 * out by hand, for the default pool choice (the first pool that fits) and
 * for pack_pools (the pool left fullest).  Within a pool the fullest nodes
 * that fit are taken, and a gang never spans fabrics or zones. */
static const tnode_row fleet1[] = {
    {"a1", "a", "f1", "h100", 8, 2.0}, {"a2", "a", "f1", "h100", 8, 2.0},
    {"a3", "a", "f1", "h100", 8, 2.0}, {"a4", "a", "f2", "h100", 8, 2.0},
    {"a5", "a", "f2", "h100", 8, 2.0}, {"b1", "b", "f1", "a10", 4, 1.0},
    {NULL}};

static void test_placement_table(void **state)
{
    static const struct {
        const char *id;
        int nodes, gpn;
        const char *type; /* NULL: any */
        const char *first, *pack;
    } rows[] = {
        /* f1 comes first; packing prefers f2 (10 GPUs left, not 18). */
        {"big", 1, 6, "h100", "a1|a2|a3", "a4|a5"},
        /* The node big left with 2 free is the exact fit. */
        {"two", 1, 2, "h100", "=big", "=big"},
        /* 2 x 8 needs two empty nodes of one fabric. */
        {"g2", 2, 8, "h100", "a1,a2|a1,a3|a2,a3", "a1,a2|a1,a3|a2,a3"},
        /* First fit left f2 whole; packing split it, so no fabric has two. */
        {"g3", 2, 8, "h100", "a4,a5", "-"},
        /* 1 x 4 of any type: first fit finds only b1; packing prefers b1's
         * exact fit over the empty node of f2. */
        {"any4", 1, 4, NULL, "b1", "b1"},
        /* a10 only, and b1 is full now. */
        {"a10", 1, 1, "a10", "-", "-"},
    };
    for (int pack = 0; pack < 2; pack++) {
        sched_config c;
        sched_config_default(&c, SCHED_POLICY_SHOAL);
        c.pack_pools = pack;
        sched *s = sched_new(&c);
        for (const tnode_row *r = fleet1; r->id; r++) {
            sched_node_spec n = {r->id, r->zone, r->fabric, r->type, r->gpus, r->price};
            TU_OK(sched_node_add(s, &n, 0));
        }
        sched_decisions d = {0};
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            sched_job_spec j = gang(rows[i].id, rows[i].nodes, rows[i].gpn, 100);
            if (rows[i].type) j.n_types = 1, j.gpu_types[0] = rows[i].type;
            submit(s, j, (double)i);
            step(s, (double)i, &d);
            const char *expect = pack ? rows[i].pack : rows[i].first;
            char got[512];
            snprintf(got, sizeof got, "%s", nodes_of(s, rows[i].id));
            if (!strcmp(expect, "-")) {
                assert_int_equal(jstate(s, rows[i].id), SCHED_QUEUED);
                continue;
            }
            if (expect[0] == '=') {
                assert_string_equal(got, nodes_of(s, expect + 1));
                continue;
            }
            char want[128], needle[520];
            snprintf(want, sizeof want, "|%s|", expect);
            snprintf(needle, sizeof needle, "|%s|", got);
            if (!strstr(want, needle))
                fail_msg("pack %d: job %s got nodes %s, expected %s", pack, rows[i].id, got, expect);
        }
        /* The queue holds what waits, in submit order. */
        const char *q[4];
        size_t nq = sched_queue(s, q, 4);
        assert_int_equal(nq, pack ? 2 : 1);
        assert_string_equal(q[nq - 1], "a10");
        sched_decisions_free(&d);
        sched_free(s);
    }
}

/* Best fit across nodes of one pool with 3, 5 and 8 GPUs: a 1 x 4 job takes
 * n5 (1 left), keeping n8 whole; a 2 x 3 gang then needs n3 and n8; a
 * 1 x 1 job takes n5's last GPU rather than opening n8's. */
static void test_least_fragmentation(void **state)
{
    static const tnode_row f[] = {{"n3", "z", "f", "t", 3, 1}, {"n5", "z", "f", "t", 5, 1},
                                  {"n8", "z", "f", "t", 8, 1}, {NULL}};
    static const struct {
        const char *id;
        int nodes, gpn;
        const char *expect;
    } rows[] = {{"x4", 1, 4, "n5"}, {"g3", 2, 3, "n3,n8"}, {"x1", 1, 1, "n5"}, {"x5", 1, 5, "n8"},
                {"y1", 1, 1, "-"}};
    for (int pol = SCHED_POLICY_FIFO; pol <= SCHED_POLICY_SHOAL; pol++) {
        sched_decisions d = {0};
        sched *s = mk((sched_policy)pol, f);
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            submit(s, gang(rows[i].id, rows[i].nodes, rows[i].gpn, 1000), (double)i);
            step(s, (double)i, &d);
            if (pol == SCHED_POLICY_FIRSTFIT) continue; /* spreads: tested below */
            if (rows[i].expect[0] == '-') assert_int_equal(jstate(s, rows[i].id), SCHED_QUEUED);
            else assert_string_equal(nodes_of(s, rows[i].id), rows[i].expect);
        }
        sched_decisions_free(&d);
        sched_free(s);
    }
}

static void test_reject_never_fits(void **state)
{
    sched *s = mk(SCHED_POLICY_SHOAL, fleet1);
    sched_job_spec j = gang("huge", 3, 8, 10); /* 3 x 8 h100: each fabric has only 2-3 nodes */
    TU_OK(sched_job_submit(s, &j, 0));         /* f1 has 3 nodes: it fits */
    j = gang("huge2", 4, 8, 10);
    TU_ERR(sched_job_submit(s, &j, 0), SH_ERANGE, "largest such pool (with quotas) has 3 nodes");
    j = gang("tpu", 1, 1, 10);
    j.n_types = 1, j.gpu_types[0] = "tpu";
    TU_ERR(sched_job_submit(s, &j, 0), SH_ERANGE, "unknown GPU type \"tpu\"");
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, "tpu", 0, &ji));
    assert_int_equal(ji.state, SCHED_REJECTED);
    assert_non_null(strstr(ji.reason, "tpu"));
    j = gang("fat", 1, 9, 10); /* 9 GPUs on one node: none has them */
    TU_ERR(sched_job_submit(s, &j, 0), SH_ERANGE, ">= 9 GPUs");
    j = gang("huge", 1, 1, 10);
    TU_ERR(sched_job_submit(s, &j, 0), SH_EEXIST, "already exists");
    j = gang("neg", 0, 1, 10);
    TU_ERR(sched_job_submit(s, &j, 0), SH_EINVAL, "nodes 0");
    sched_node_spec n = {"a1", "a", "f1", "h100", 8, 1};
    TU_ERR(sched_node_add(s, &n, 0), SH_EEXIST, "node a1 already exists");
    n.id = "big", n.gpus = 17;
    TU_ERR(sched_node_add(s, &n, 0), SH_EINVAL, "outside 1..16");
    sched_stats st;
    sched_stats_get(s, &st);
    assert_int_equal(st.rejected, 3);
    sched_free(s);
}

/* ---- Backfill, fifo and firstfit on one scenario ------------------------------ */

/* Pool of 4 x 8 GPUs.  A (3 x 8, 100 s) runs; B (4 x 8) must wait for A and
 * gets a reservation at t=100 on all four nodes; C (1 x 4, 50 s) ends
 * before 100 and may backfill; D (1 x 4, 200 s) would still hold 4 GPUs of
 * a reserved node at 100, so it must wait.  fifo starts nothing behind B;
 * firstfit lets B hold the free node as a partial gang. */
static const tnode_row four[] = {{"n1", "z", "f", "t", 8, 1}, {"n2", "z", "f", "t", 8, 1},
                                 {"n3", "z", "f", "t", 8, 1}, {"n4", "z", "f", "t", 8, 1},
                                 {NULL}};

static void test_backfill_table(void **state)
{
    static const struct {
        sched_policy pol;
        sched_job_state a, b, c, d;
    } rows[] = {
        {SCHED_POLICY_FIFO, SCHED_RUNNING, SCHED_QUEUED, SCHED_QUEUED, SCHED_QUEUED},
        {SCHED_POLICY_BACKFILL, SCHED_RUNNING, SCHED_QUEUED, SCHED_RUNNING, SCHED_QUEUED},
        {SCHED_POLICY_SHOAL, SCHED_RUNNING, SCHED_QUEUED, SCHED_RUNNING, SCHED_QUEUED},
        {SCHED_POLICY_FIRSTFIT, SCHED_RUNNING, SCHED_HOLDING, SCHED_QUEUED, SCHED_QUEUED},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        sched_decisions d = {0};
        sched *s = mk(rows[i].pol, four);
        submit(s, gang("A", 3, 8, 100), 0);
        step(s, 0, &d);
        submit(s, gang("B", 4, 8, 100), 0);
        submit(s, gang("C", 1, 4, 50), 0);
        submit(s, gang("D", 1, 4, 200), 0);
        step(s, 0, &d);
        assert_int_equal(jstate(s, "A"), rows[i].a);
        assert_int_equal(jstate(s, "B"), rows[i].b);
        assert_int_equal(jstate(s, "C"), rows[i].c);
        assert_int_equal(jstate(s, "D"), rows[i].d);
        if (rows[i].pol == SCHED_POLICY_BACKFILL || rows[i].pol == SCHED_POLICY_SHOAL) {
            sched_job_info ci;
            TU_OK(sched_job_info_get(s, "C", 0, &ci));
            assert_int_equal(ci.backfilled, 1);
            step(s, 10, &d); /* D still may not start */
            assert_int_equal(jstate(s, "D"), SCHED_QUEUED);
            TU_OK(sched_job_finish(s, "C", 50));
            step(s, 50, &d);
            assert_int_equal(jstate(s, "D"), SCHED_QUEUED);
        }
        /* A ends at 100: B starts at once, exactly when it was promised. */
        if (jstate(s, "C") == SCHED_RUNNING) TU_OK(sched_job_finish(s, "C", 50));
        TU_OK(sched_job_finish(s, "A", 100));
        step(s, 100, &d);
        assert_int_equal(jstate(s, "B"), SCHED_RUNNING);
        assert_non_null(find(&d, SCHED_D_START, "B"));
        assert_int_equal(s->resv_late, 0);
        sched_stats st;
        sched_stats_get(s, &st);
        assert_int_equal(st.partial_gangs, rows[i].pol == SCHED_POLICY_FIRSTFIT ? 1 : 0);
        if (rows[i].pol == SCHED_POLICY_FIRSTFIT) assert_true(st.held_gpu_s >= 8 * 100 - 1e-6);
        sched_decisions_free(&d);
        sched_free(s);
    }
}

/* Found by fuzz_sched: backfilled jobs must share a reserved node's spare
 * GPUs, not each see all of them.  A (2 x 4, 100 s) leaves 4 free on n1 and
 * n2; G (2 x 6) is reserved at t=100 with 2 spare GPUs per node.  B and C
 * (1 x 2, 1000 s) each take one node's spare; D must wait; G starts at 100. */
static void test_backfill_shares_spare(void **state)
{
    static const tnode_row two[] = {{"n1", "z", "f", "t", 8, 1}, {"n2", "z", "f", "t", 8, 1}, {NULL}};
    for (int pol = SCHED_POLICY_BACKFILL; pol <= SCHED_POLICY_SHOAL; pol++) {
        sched_decisions d = {0};
        sched *s = mk((sched_policy)pol, two);
        submit(s, gang("A", 2, 4, 100), 0);
        step(s, 0, &d);
        submit(s, gang("G", 2, 6, 100), 1);
        submit(s, gang("B", 1, 2, 1000), 1);
        submit(s, gang("C", 1, 2, 1000), 1);
        submit(s, gang("D", 1, 2, 1000), 1);
        step(s, 1, &d);
        assert_int_equal(jstate(s, "G"), SCHED_QUEUED);
        assert_int_equal(jstate(s, "B"), SCHED_RUNNING);
        assert_int_equal(jstate(s, "C"), SCHED_RUNNING);
        assert_int_equal(jstate(s, "D"), SCHED_QUEUED);
        assert_string_not_equal(nodes_of(s, "B"), "");
        char b[8];
        snprintf(b, sizeof b, "%s", nodes_of(s, "B"));
        assert_string_not_equal(b, nodes_of(s, "C"));
        TU_OK(sched_job_finish(s, "A", 100));
        step(s, 100, &d);
        assert_int_equal(jstate(s, "G"), SCHED_RUNNING);
        assert_int_equal(s->resv_late, 0);
        sched_decisions_free(&d);
        sched_free(s);
    }
}

/* firstfit's deadlock: n3 and n4 each have 4 GPUs busy until t=1000.  A
 * (3 x 8) holds n1 and n2, B (3 x 4) holds n3 and n4: each waits for the
 * other.  At the timeout both let go and grab the same nodes again.  shoal
 * reserves for A and starts B at once (it ends long before A can start). */
static void test_firstfit_deadlock(void **state)
{
    static const tnode_row half[] = {{"n3", "z", "f", "t", 8, 1}, {"n4", "z", "f", "t", 8, 1}, {NULL}};
    for (int pol = SCHED_POLICY_FIRSTFIT; pol <= SCHED_POLICY_SHOAL; pol += 2) {
        sched_decisions d = {0};
        sched *s = mk((sched_policy)pol, half);
        submit(s, gang("R", 2, 4, 1000), 0);
        step(s, 0, &d);
        sched_node_spec n1 = {"n1", "z", "f", "t", 8, 1}, n2 = {"n2", "z", "f", "t", 8, 1};
        TU_OK(sched_node_add(s, &n1, 1));
        TU_OK(sched_node_add(s, &n2, 1));
        submit(s, gang("A", 3, 8, 100), 1);
        submit(s, gang("B", 3, 4, 100), 1);
        step(s, 1, &d);
        sched_stats st;
        if (pol == SCHED_POLICY_FIRSTFIT) {
            assert_int_equal(jstate(s, "A"), SCHED_HOLDING);
            assert_int_equal(jstate(s, "B"), SCHED_HOLDING);
            assert_string_equal(nodes_of(s, "A"), "n1,n2");
            assert_string_equal(nodes_of(s, "B"), "n3,n4");
            assert_true(sched_next_wakeup(s) == 301);
            step(s, 301, &d);
            assert_non_null(find(&d, SCHED_D_RELEASE, "A"));
            assert_non_null(find(&d, SCHED_D_RELEASE, "B"));
            assert_non_null(find(&d, SCHED_D_HOLD, "A")); /* and grabs them again */
            sched_stats_get(s, &st);
            assert_int_equal(st.hold_timeouts, 2);
            assert_int_equal(st.partial_gangs, 4);
            assert_true(st.held_gpu_s >= 300 * (16 + 8) - 1e-6);
        } else {
            assert_int_equal(jstate(s, "A"), SCHED_QUEUED);
            assert_int_equal(jstate(s, "B"), SCHED_RUNNING);
            sched_stats_get(s, &st);
            assert_int_equal(st.partial_gangs, 0);
        }
        sched_decisions_free(&d);
        sched_free(s);
    }
}

/* ---- Failure policies ------------------------------------------------------------ */

static void test_failure_requeue(void **state)
{
    static const tnode_row three[] = {{"n1", "z", "f", "t", 8, 1}, {"n2", "z", "f", "t", 8, 1},
                                      {"n3", "z", "f", "t", 8, 1}, {NULL}};
    sched_decisions d = {0};
    sched *s = mk(SCHED_POLICY_SHOAL, three);
    submit(s, gang("G", 2, 8, 1000), 0);
    step(s, 0, &d);
    char before[64];
    snprintf(before, sizeof before, "%s", nodes_of(s, "G"));
    const char *victim = strncmp(before, "n1", 2) ? "n2" : "n1";
    TU_OK(sched_node_fail(s, victim, 10));
    TU_OK(sched_check(s, 10));
    assert_int_equal(jstate(s, "G"), SCHED_QUEUED);
    step(s, 10, &d);
    /* Requeued at the head and restarted on the two healthy nodes. */
    assert_non_null(find(&d, SCHED_D_REQUEUE, "G"));
    assert_non_null(find(&d, SCHED_D_START, "G"));
    assert_null(strstr(nodes_of(s, "G"), victim));
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, "G", 10, &ji));
    assert_int_equal(ji.restarts, 1);
    assert_int_equal(ji.state, SCHED_RUNNING);
    /* A second failure with no spare: back in the queue until recovery. */
    const char *other = strstr(nodes_of(s, "G"), "n3") ? "n3" : "n2";
    TU_OK(sched_node_fail(s, other, 20));
    step(s, 20, &d);
    assert_int_equal(jstate(s, "G"), SCHED_QUEUED);
    TU_OK(sched_node_recover(s, victim, 30));
    step(s, 30, &d);
    assert_int_equal(jstate(s, "G"), SCHED_RUNNING);
    sched_decisions_free(&d);
    sched_free(s);
}

static void test_failure_replace(void **state)
{
    static const tnode_row three[] = {{"n1", "z", "f", "t", 8, 1}, {"n2", "z", "f", "t", 8, 1},
                                      {"n3", "z", "f2", "t", 8, 1}, {"n4", "z", "f", "t", 8, 1},
                                      {NULL}};
    sched_decisions d = {0};
    sched *s = mk(SCHED_POLICY_BACKFILL, three);
    sched_job_spec j = gang("G", 2, 8, 1000);
    j.on_fail = SCHED_REPLACE, j.replace_wait_s = 100;
    submit(s, j, 0);
    submit(s, gang("busy", 1, 8, 1e6), 0);
    step(s, 0, &d);
    /* G and busy fill fabric f (n1, n2, n4); n3 is another fabric. */
    char gn[64];
    snprintf(gn, sizeof gn, "%s", nodes_of(s, "G"));
    const char *first = strtok(gn, ",");
    TU_OK(sched_node_fail(s, first, 10));
    assert_int_equal(jstate(s, "G"), SCHED_REPLACING);
    step(s, 10, &d);
    assert_non_null(find(&d, SCHED_D_SHRINK, "G"));
    assert_int_equal(jstate(s, "G"), SCHED_REPLACING); /* n3 is in the wrong fabric */
    assert_true(sched_next_wakeup(s) == 110);
    /* busy ends at 50: its node is the spare. */
    TU_OK(sched_job_finish(s, "busy", 50));
    step(s, 50, &d);
    assert_non_null(find(&d, SCHED_D_REPLACE, "G"));
    assert_int_equal(jstate(s, "G"), SCHED_RUNNING);
    assert_int_equal(sched_job_alloc(s, "G", NULL, 0), 2);
    /* Next failure: no spare in fabric f within 100 s -> requeue at 160. */
    snprintf(gn, sizeof gn, "%s", nodes_of(s, "G"));
    TU_OK(sched_node_fail(s, strtok(gn, ","), 60));
    step(s, 60, &d);
    step(s, 159, &d);
    assert_int_equal(jstate(s, "G"), SCHED_REPLACING);
    step(s, 160, &d);
    assert_non_null(find(&d, SCHED_D_REQUEUE, "G"));
    assert_int_equal(jstate(s, "G"), SCHED_QUEUED);
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, "G", 160, &ji));
    assert_int_equal(ji.restarts, 1);
    sched_decisions_free(&d);
    sched_free(s);
}

static sched_job_spec elastic(const char *id, int min, int max, int gpr, int prio)
{
    sched_job_spec j;
    memset(&j, 0, sizeof j);
    j.id = id, j.kind = SCHED_ELASTIC, j.nodes = min, j.max_replicas = max;
    j.gpus_per_node = gpr, j.priority = prio, j.est_s = 1e5;
    return j;
}

static void test_failure_elastic_and_function(void **state)
{
    static const tnode_row two[] = {{"n1", "z", "f", "t", 8, 1}, {"n2", "z", "f", "t", 8, 1}, {NULL}};
    sched_decisions d = {0};
    sched *s = mk(SCHED_POLICY_SHOAL, two);
    submit(s, elastic("E", 2, 3, 4, 0), 0);
    sched_job_spec fn = {.id = "F", .kind = SCHED_FUNCTION, .est_s = 10};
    submit(s, fn, 0);
    step(s, 0, &d);
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, "E", 0, &ji));
    assert_int_equal(ji.replicas, 3);
    assert_int_equal(jstate(s, "F"), SCHED_RUNNING);
    /* Fail the node holding F: F requeues; E loses what it had there. */
    sched_place p;
    sched_job_alloc(s, "F", &p, 1);
    char fnode[8];
    snprintf(fnode, sizeof fnode, "%s", p.node);
    int e_there = 0;
    sched_place ep[4];
    size_t ne = sched_job_alloc(s, "E", ep, 4);
    for (size_t i = 0; i < ne; i++) e_there += !strcmp(ep[i].node, fnode);
    TU_OK(sched_node_fail(s, fnode, 5));
    step(s, 5, &d);
    assert_non_null(find(&d, SCHED_D_REQUEUE, "F"));
    TU_OK(sched_job_info_get(s, "E", 5, &ji));
    if (3 - e_there >= 2) {
        assert_int_equal(ji.state, SCHED_RUNNING);
        assert_int_equal(ji.replicas, 3 - e_there + 0);
        assert_non_null(find(&d, SCHED_D_SHRINK, "E"));
    } else {
        assert_non_null(find(&d, SCHED_D_REQUEUE, "E"));
    }
    sched_decisions_free(&d);
    sched_free(s);
}

/* An elastic job that names a GPU type no node has yet grows onto it once
 * its first node joins (the type was dropped at submit before); a job
 * none of whose types exists is still refused. */
static void test_elastic_grows_onto_a_type_that_joins(void **state)
{
    static const tnode_row one[] = {{"a1", "z", "f", "A", 8, 1}, {NULL}};
    sched_decisions d = {0};
    sched *s = mk(SCHED_POLICY_SHOAL, one);
    sched_job_spec e = elastic("E", 1, 4, 8, 0);
    e.n_types = 2, e.gpu_types[0] = "A", e.gpu_types[1] = "B";
    submit(s, e, 0);
    step(s, 0, &d);
    sched_job_info ji;
    TU_OK(sched_job_info_get(s, "E", 0, &ji));
    assert_int_equal(ji.replicas, 1);
    TU_OK(sched_node_add(s, &(sched_node_spec){"b1", "z", "f", "B", 8, 1}, 1));
    step(s, 1, &d);
    TU_OK(sched_job_info_get(s, "E", 1, &ji));
    if (ji.replicas != 2) fail_msg("E has %d replicas after a node of its type B joined, not 2", ji.replicas);
    sched_job_spec c = elastic("C", 1, 1, 8, 0);
    c.n_types = 1, c.gpu_types[0] = "Z";
    assert_int_equal(sched_job_submit(s, &c, 2), SH_ERANGE);
    assert_int_equal(jstate(s, "C"), SCHED_REJECTED);
    sched_decisions_free(&d);
    sched_free(s);
}

/* ---- Preemption ------------------------------------------------------------------- */

/* E (elastic, 1..4 replicas of 4 GPUs, priority 0) fills two 8-GPU nodes.
 * G (1 x 8, priority 5) needs one node: two of E's replicas there must go,
 * E shrinks to 2 (no preemption, no victim elsewhere).  H (1 x 8, priority
 * 5) needs the other node: one more replica shrinks (E at its min of 1),
 * then E itself is preempted.  With max_victims = 1, H waits instead; a
 * gang of equal priority never preempts. */
static void test_preemption_table(void **state)
{
    static const tnode_row two[] = {{"n1", "z", "f", "t", 8, 1}, {"n2", "z", "f", "t", 8, 1}, {NULL}};
    static const struct {
        int max_victims, h_prio;
        sched_job_state h, e;
        int shrinks, preempts;
    } rows[] = {
        {8, 5, SCHED_RUNNING, SCHED_QUEUED, 3, 1},
        {1, 5, SCHED_QUEUED, SCHED_RUNNING, 2, 0},
        {8, 0, SCHED_QUEUED, SCHED_RUNNING, 2, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        sched_config c;
        sched_config_default(&c, SCHED_POLICY_SHOAL);
        c.max_victims = rows[i].max_victims < 2 ? 2 : rows[i].max_victims;
        sched *s = sched_new(&c);
        for (const tnode_row *r = two; r->id; r++) {
            sched_node_spec n = {r->id, r->zone, r->fabric, r->type, r->gpus, r->price};
            TU_OK(sched_node_add(s, &n, 0));
        }
        sched_decisions d = {0};
        submit(s, elastic("E", 1, 4, 4, 0), 0);
        step(s, 0, &d);
        sched_job_info ji;
        TU_OK(sched_job_info_get(s, "E", 0, &ji));
        assert_int_equal(ji.replicas, 4);
        sched_job_spec g = gang("G", 1, 8, 100);
        g.priority = 5;
        submit(s, g, 1);
        step(s, 1, &d);
        assert_int_equal(jstate(s, "G"), SCHED_RUNNING);
        TU_OK(sched_job_info_get(s, "E", 1, &ji));
        assert_int_equal(ji.replicas, 2);
        assert_null(find(&d, SCHED_D_PREEMPT, "E"));
        s->cfg.max_victims = rows[i].max_victims;
        g = gang("H", 1, 8, 100);
        g.priority = rows[i].h_prio;
        submit(s, g, 2);
        step(s, 2, &d);
        assert_int_equal(jstate(s, "H"), rows[i].h);
        assert_int_equal(jstate(s, "E"), rows[i].e);
        sched_stats st;
        sched_stats_get(s, &st);
        assert_int_equal(st.shrinks, rows[i].shrinks);
        assert_int_equal(st.preemptions, rows[i].preempts);
        sched_decisions_free(&d);
        sched_free(s);
    }
}

/* preempt_wait: E (elastic, one replica of 8 GPUs, priority 0, estimate
 * e_est) fills the only node from t = 0; G (1 x 8, priority 5, estimate
 * 1000 s) arrives at t = 10.  Without victims G would start when E ends
 * (t = e_est), a wait of e_est - 10; shoal preempts E only when that wait
 * is at least preempt_wait x 1000 s.  Otherwise G holds the reservation
 * and starts at E's end.  The reference search decides the same. */
static void test_preempt_wait_table(void **state)
{
    (void)state;
    static const tnode_row one[] = {{"n1", "z", "f", "t", 8, 1}, {NULL}};
    static const struct {
        double wait, e_est;
        int preempted;
    } rows[] = {
        {0, 100, 1},      /* 0: always, even for a 90 s wait */
        {0.5, 2000, 1},   /* 1,990 s >= 500 s */
        {0.5, 510, 1},    /* 500 s >= 500 s */
        {0.5, 400, 0},    /* 390 s < 500 s */
        {1, 1000, 0},     /* 990 s < 1,000 s */
        {1, 1010, 1},     /* 1,000 s >= 1,000 s */
    };
    for (int ref = 0; ref < 2; ref++)
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            sched_config c;
            sched_config_default(&c, SCHED_POLICY_SHOAL);
            c.preempt_wait = rows[i].wait, c.reference = ref;
            sched *s = sched_new(&c);
            assert_non_null(s);
            sched_node_spec n = {one[0].id, one[0].zone, one[0].fabric, one[0].type, one[0].gpus, one[0].price};
            TU_OK(sched_node_add(s, &n, 0));
            sched_decisions d = {0};
            sched_job_spec e = elastic("E", 1, 1, 8, 0);
            e.est_s = rows[i].e_est;
            submit(s, e, 0);
            step(s, 0, &d);
            assert_int_equal(jstate(s, "E"), SCHED_RUNNING);
            sched_job_spec g = gang("G", 1, 8, 1000);
            g.priority = 5;
            submit(s, g, 10);
            step(s, 10, &d);
            sched_stats st;
            sched_stats_get(s, &st);
            if (rows[i].preempted) {
                assert_non_null(find(&d, SCHED_D_PREEMPT, "E"));
                assert_int_equal(jstate(s, "G"), SCHED_RUNNING);
                assert_int_equal(st.preempt_declined, 0);
            } else {
                assert_null(find(&d, SCHED_D_PREEMPT, "E"));
                assert_int_equal(jstate(s, "G"), SCHED_QUEUED);
                assert_int_equal(jstate(s, "E"), SCHED_RUNNING);
                assert_int_equal(st.preempt_declined, 1);
                sched_job_info ji;
                TU_OK(sched_job_info_get(s, "G", 10, &ji));
                assert_int_equal(ji.wait, SCHED_WAIT_RESERVED);
                assert_true(fabs(ji.est_start_s - rows[i].e_est) < 1e-6);
                /* Turned down again the next cycle: still one gang. */
                step(s, 11, &d);
                assert_null(find(&d, SCHED_D_PREEMPT, "E"));
                sched_stats_get(s, &st);
                assert_int_equal(st.preempt_declined, 1);
                TU_OK(sched_job_finish(s, "E", rows[i].e_est));
                step(s, rows[i].e_est, &d);
                assert_int_equal(jstate(s, "G"), SCHED_RUNNING);
            }
            assert_int_equal(st.preemptions, rows[i].preempted);
            sched_decisions_free(&d);
            sched_free(s);
        }
}

/* Elastic replicas go where their work is cheapest under shoal: h100 at
 * 3.6 per GPU-hour and speed 1 costs 3.6 per unit of work, l4 at 0.36 and
 * speed 0.3 costs 1.2, so shoal fills the l4 node first; the baselines
 * follow the job's type order (h100 first). */
static void test_elastic_cost_per_work(void **state)
{
    static const tnode_row f[] = {{"h", "z", "f", "h100", 4, 3.6}, {"l", "z", "f", "l4", 4, 0.36}, {NULL}};
    static const struct {
        sched_policy pol;
        const char *first_node;
    } rows[] = {{SCHED_POLICY_SHOAL, "l"}, {SCHED_POLICY_BACKFILL, "h"}};
    for (size_t i = 0; i < 2; i++) {
        sched_decisions d = {0};
        sched *s = mk(rows[i].pol, f);
        sched_job_spec e = elastic("E", 1, 2, 2, 0);
        e.n_types = 2, e.gpu_types[0] = "h100", e.speed[0] = 1, e.gpu_types[1] = "l4", e.speed[1] = 0.3;
        submit(s, e, 0);
        step(s, 0, &d);
        assert_string_equal(nodes_of(s, "E"), rows[i].first_node[0] == 'l' ? "l,l" : "h,h");
        sched_decisions_free(&d);
        sched_free(s);
    }
}

/* ---- Billing and autoscaling ------------------------------------------------------ */

static void test_billing_per_second(void **state)
{
    static const tnode_row f[] = {{"h", "z", "f", "h100", 8, 3.6}, {"a", "z", "f", "a10", 4, 0.72},
                                  {NULL}};
    sched_decisions d = {0};
    sched *s = mk(SCHED_POLICY_SHOAL, f);
    sched_job_spec j = gang("x", 1, 2, 10);
    j.tenant = "acme", j.n_types = 1, j.gpu_types[0] = "h100";
    submit(s, j, 0);
    j = gang("y", 1, 4, 10);
    j.tenant = "zeta", j.n_types = 1, j.gpu_types[0] = "a10";
    submit(s, j, 0);
    step(s, 0, &d);
    /* 3.6 per GPU-hour = 0.001 per GPU-second; 10.2 s bills as 11 s. */
    assert_true(fabs(sched_cost_job(s, "x", NULL, 5) - 0.010) < 1e-9);
    TU_OK(sched_job_finish(s, "x", 10.2));
    TU_OK(sched_job_finish(s, "y", 1.0));
    assert_true(fabs(sched_cost_job(s, "x", "h100", 99) - 0.022) < 1e-9);
    assert_true(fabs(sched_cost_job(s, "x", "a10", 99)) < 1e-12);
    assert_true(fabs(sched_cost_tenant(s, "acme", NULL, 99) - 0.022) < 1e-9);
    assert_true(fabs(sched_cost_tenant(s, "zeta", "a10", 99) - 4 * 0.0002) < 1e-9);
    assert_true(fabs(sched_cost_tenant(s, NULL, NULL, 99) - 0.0228) < 1e-9);
    sched_decisions_free(&d);
    sched_free(s);
}

/* The core chooses device indices (the lowest free, released with the
 * place, kept by a restore, never handed out twice) and, with a journal,
 * keeps each closed bill until the caller drops it. */
static void test_devices_and_bills(void **state)
{
    static const tnode_row f[] = {{"h", "z", "f", "h100", 8, 3.6}, {NULL}};
    sched_config c;
    sched_config_default(&c, SCHED_POLICY_SHOAL);
    c.bill_journal = 1;
    sched *s = sched_new(&c);
    assert_non_null(s);
    sched_node_spec ns = {f[0].id, f[0].zone, f[0].fabric, f[0].type, f[0].gpus, f[0].price};
    TU_OK(sched_node_add(s, &ns, 0));
    sched_decisions d = {0};
    sched_job_spec g = gang("g", 1, 3, 10);
    submit(s, g, 0);
    step(s, 0, &d);
    const char *ids[] = {"f0", "f1", "f2"};
    for (int i = 0; i < 3; i++) {
        sched_job_spec fn = {.id = ids[i], .kind = SCHED_FUNCTION, .est_s = 10};
        submit(s, fn, 1);
    }
    step(s, 1, &d);
    sched_place p[4];
    assert_int_equal(sched_job_alloc(s, "g", p, 4), 1);
    assert_int_equal(p[0].gpu_mask, 0x7);
    assert_true(p[0].since == 0);
    uint64_t all = p[0].gpu_mask;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sched_job_alloc(s, ids[i], p, 4), 1);
        assert_int_equal(__builtin_popcountll(p[0].gpu_mask), 1);
        assert_int_equal(all & p[0].gpu_mask, 0);
        all |= p[0].gpu_mask;
    }
    assert_int_equal(all, 0x3f);
    /* The decisions carry the same masks. */
    for (size_t i = 0; i < d.n; i++)
        assert_int_equal(__builtin_popcountll(d.places[d.v[i].first].gpu_mask), 1);
    /* The bills an end would close, asked before it: the same ones, and
     * nothing changes (a caller writes them in the transaction of the end). */
    sched_bill pre[2];
    assert_int_equal(sched_job_closing_bills(s, "g", 10.2, pre, 2), 1);
    assert_int_equal(sched_job_closing_bills(s, "nosuch", 10.2, pre + 1, 1), 0);
    const sched_bill *b;
    assert_int_equal(sched_bills(s, &b), 0);
    assert_true(pre[0].seconds == 11 && fabs(pre[0].cost - 0.033) < 1e-9 && pre[0].gpu_mask == 0x7);
    /* The gang ends after 10.2 s: one bill of 11 s x 3 GPUs at 0.001/GPU-s. */
    TU_OK(sched_job_finish(s, "g", 10.2));
    assert_int_equal(sched_bills(s, &b), 1);
    assert_true(b[0].seconds == pre[0].seconds && b[0].cost == pre[0].cost && b[0].since == pre[0].since &&
                b[0].until == pre[0].until);
    assert_string_equal(b[0].job, "g");
    assert_string_equal(b[0].node, "h");
    assert_string_equal(b[0].gpu_type, "h100");
    assert_int_equal(b[0].gpus, 3);
    assert_int_equal(b[0].gpu_mask, 0x7);
    assert_true(b[0].seconds == 11 && fabs(b[0].cost - 0.033) < 1e-9);
    assert_true(fabs(b[0].cost - sched_cost_job(s, "g", NULL, 99)) < 1e-12);
    /* The bill outlives the job's record. */
    TU_OK(sched_job_forget(s, "g"));
    assert_string_equal(b[0].job, "g");
    sched_bills_drop_last(s, 1);
    assert_int_equal(sched_bills(s, &b), 0);
    /* A 2-GPU elastic replica takes the lowest free indices: 0 and 1, which
     * the gang let go. */
    sched_job_spec e = {.id = "e", .kind = SCHED_ELASTIC, .nodes = 1, .max_replicas = 1, .gpus_per_node = 2,
                        .est_s = 10};
    submit(s, e, 11);
    step(s, 11, &d);
    assert_int_equal(sched_job_alloc(s, "e", p, 4), 1);
    assert_int_equal(p[0].gpu_mask, 0x3);
    assert_true(p[0].since == 11);
    TU_OK(sched_check(s, 11));
    /* A restore that names a device held already is refused whole; one with
     * free devices and an earlier start keeps both. */
    sched_job_spec r = gang("r", 1, 2, 10);
    submit(s, r, 12);
    sched_place bad = {"h", 0, 2, 0x6, 5};
    assert_int_equal(sched_job_restore(s, "r", &bad, 1, 12), SH_EINVAL);
    assert_non_null(strstr(sh_errmsg(), "held already"));
    sched_place odd = {"h", 0, 2, 0x40, 5};
    assert_int_equal(sched_job_restore(s, "r", &odd, 1, 12), SH_EINVAL);
    sched_place good = {"h", 0, 2, 0xc0, 5};
    TU_OK(sched_job_restore(s, "r", &good, 1, 12));
    assert_int_equal(sched_job_alloc(s, "r", p, 4), 1);
    assert_int_equal(p[0].gpu_mask, 0xc0);
    /* Billed from 5, not from the restore at 12: 8 s x 2 GPUs so far. */
    assert_true(fabs(sched_cost_job_open(s, "r", NULL, 13, NULL) - 0.016) < 1e-9);
    double gs;
    sched_cost_job_open(s, "r", "h100", 13, &gs);
    assert_true(gs == 16);
    TU_OK(sched_check(s, 13));
    sched_decisions_free(&d);
    sched_free(s); /* frees the bills still kept */
}

/* Forgetting ended jobs: totals unchanged, handles and ids reused, pending
 * news about a forgotten job dropped, memory bounded over many jobs. */
static void test_forget(void **state)
{
    static const tnode_row f[] = {{"h", "z", "f", "h100", 8, 3.6}, {"a", "z", "f", "a10", 4, 0.72},
                                  {"b", "z", "f", "a10", 4, 0.72}, {NULL}};
    sched_decisions d = {0};
    sched *s = mk(SCHED_POLICY_SHOAL, f);
    sched_job_spec j = gang("x", 1, 2, 10);
    j.tenant = "acme", j.n_types = 1, j.gpu_types[0] = "h100";
    submit(s, j, 0);
    j = gang("y", 2, 4, 10);
    j.tenant = "zeta", j.n_types = 1, j.gpu_types[0] = "a10";
    submit(s, j, 0);
    j = gang("q", 1, 8, 10); /* waits behind x for the h100 node */
    j.tenant = "acme", j.n_types = 1, j.gpu_types[0] = "h100";
    submit(s, j, 0);
    j = gang("big", 9, 1, 10);
    TU_ERR(sched_job_submit(s, &j, 0), SH_ERANGE, "rejected");
    step(s, 0, &d);
    assert_int_equal(jstate(s, "q"), SCHED_QUEUED);
    TU_ERR(sched_job_forget(s, "x"), SH_EINVAL, "has not ended");
    TU_ERR(sched_job_forget(s, "q"), SH_EINVAL, "cancel it first");
    TU_ERR(sched_job_forget(s, "nope"), SH_ENOENT, "not known");
    TU_OK(sched_job_finish(s, "x", 10.2));
    TU_OK(sched_job_cancel(s, "q", 11));
    /* y loses a node: its requeue is pending for the next step, then it is
     * cancelled and forgotten before that step. */
    TU_OK(sched_node_fail(s, "b", 12));
    TU_OK(sched_job_cancel(s, "y", 12));
    static const char *const tenants[] = {NULL, "acme", "zeta"};
    static const char *const types[] = {NULL, "h100", "a10"};
    double before[3][3], all_jobs = sched_cost_job(s, NULL, NULL, 99);
    for (int t = 0; t < 3; t++)
        for (int g = 0; g < 3; g++) before[t][g] = sched_cost_tenant(s, tenants[t], types[g], 99);
    size_t slots = sched_job_count(s);
    int64_t xi = sched_job_ix(s, "x");
    static const char *const gone[] = {"x", "y", "q", "big"};
    for (int k = 0; k < 4; k++) TU_OK(sched_job_forget(s, gone[k]));
    TU_ERR(sched_job_forget(s, "x"), SH_ENOENT, "not known");
    sched_job_info ji;
    TU_ERR(sched_job_info_get(s, "x", 99, &ji), SH_ENOENT, "not known");
    TU_ERR(sched_job_info_ix(s, (uint32_t)xi, 99, &ji), SH_ENOENT, "not known");
    for (int t = 0; t < 3; t++)
        for (int g = 0; g < 3; g++)
            assert_true(fabs(sched_cost_tenant(s, tenants[t], types[g], 99) - before[t][g]) < 1e-12);
    assert_true(fabs(sched_cost_job(s, NULL, NULL, 99) - all_jobs) < 1e-12);
    assert_true(all_jobs > 0.022 - 1e-9); /* x's 11 s on 2 GPUs at least */
    assert_true(fabs(sched_cost_job(s, "x", NULL, 99)) < 1e-12);
    assert_int_equal(step(s, 20, &d), 0); /* y's pending requeue went with it */
    /* The id may come back as a new job, in a reused slot. */
    j = gang("x", 1, 8, 10);
    submit(s, j, 20);
    assert_true(sched_job_ix(s, "x") >= 0 && (size_t)sched_job_ix(s, "x") < slots);
    assert_int_equal(sched_job_count(s), slots);
    step(s, 20, &d);
    assert_non_null(find(&d, SCHED_D_START, "x"));
    TU_OK(sched_job_finish(s, "x", 30));
    TU_OK(sched_job_forget(s, "x"));
    /* Many short jobs, each forgotten when done: the table stays small and
     * the cost for everyone keeps every bill. */
    double t = 40, c0 = sched_cost_job(s, NULL, NULL, t);
    for (int i = 0; i < 2000; i++) {
        char id[32];
        snprintf(id, sizeof id, "w%d", i);
        j = gang(id, 1, 4, 5);
        submit(s, j, t);
        step(s, t, &d);
        assert_non_null(find(&d, SCHED_D_START, id));
        t += 5;
        TU_OK(sched_job_finish(s, id, t));
        TU_OK(sched_job_forget(s, id));
        TU_OK(sched_check(s, t));
    }
    assert_true(sched_job_count(s) <= slots);
    sched_stats st;
    sched_stats_get(s, &st);
    assert_int_equal(st.forgotten, 2005);
    /* Each job: 5 s on 4 GPUs, at 0.001 (h100) or 0.0002 (a10) per GPU-second. */
    double c = sched_cost_job(s, NULL, NULL, t) - c0;
    assert_true(c >= 2000 * 20 * 0.0002 - 1e-9 && c <= 2000 * 20 * 0.001 + 1e-9);
    assert_true(fabs(sched_cost_tenant(s, NULL, NULL, t) - sched_cost_job(s, NULL, NULL, t)) < 1e-9);
    sched_decisions_free(&d);
    sched_free(s);
}

static void test_autoscale(void **state)
{
    sched_quota q = {"z", "f", "t", 8, 4, 2.0, 120};
    sched_config c;
    sched_config_default(&c, SCHED_POLICY_SHOAL);
    c.autoscale = 1, c.quotas = &q, c.n_quotas = 1;
    sched *s = sched_new(&c);
    sched_node_spec n0 = {"n0", "z", "f", "t", 8, 2.0};
    TU_OK(sched_node_add(s, &n0, 0));
    sched_decisions d = {0};
    sched_job_spec g = gang("G", 3, 8, 100);
    submit(s, g, 0); /* 1 node + 4 from the quota: it can fit */
    g = gang("too_big", 6, 8, 100);
    TU_ERR(sched_job_submit(s, &g, 0), SH_ERANGE, "has 5 nodes");
    step(s, 0, &d);
    assert_true(sched_next_wakeup(s) == 600);
    step(s, 599, &d);
    assert_null(find(&d, SCHED_D_SCALE_UP, NULL));
    step(s, 600, &d);
    const sched_decision *up = find(&d, SCHED_D_SCALE_UP, "G");
    assert_non_null(up);
    assert_int_equal(up->n, 2); /* n0 is free: only the shortfall is asked for */
    assert_string_equal(up->gpu_type, "t");
    assert_true(up->ready_s == 720);
    step(s, 650, &d); /* asked once only */
    assert_null(find(&d, SCHED_D_SCALE_UP, NULL));
    for (int i = 0; i < 2; i++) {
        char id[8];
        snprintf(id, sizeof id, "p%d", i);
        sched_node_spec n = {id, "z", "f", "t", 8, 2.0};
        TU_OK(sched_node_add(s, &n, 720));
    }
    step(s, 720, &d);
    assert_int_equal(jstate(s, "G"), SCHED_RUNNING);
    TU_OK(sched_job_finish(s, "G", 820));
    step(s, 820, &d);
    assert_true(sched_next_wakeup(s) == 820 + 1800);
    step(s, 2620, &d);
    int downs = 0;
    for (size_t i = 0; i < d.n; i++) downs += d.v[i].kind == SCHED_D_SCALE_DOWN;
    assert_int_equal(downs, 2); /* provisioned nodes only: n0 stays */
    for (size_t i = 0; i < d.n; i++) TU_OK(sched_node_remove(s, d.v[i].node, 2620));
    TU_OK(sched_check(s, 2620));
    sched_decisions_free(&d);
    sched_free(s);
}

/* sched_job_restore: a server rebuilding after a restart puts running jobs
 * back on their nodes.  Each row is a placement for a queued job and
 * whether it is accepted (else the message); a refused one books nothing. */
static void test_restore_table(void **state)
{
    static const tnode_row f[] = {{"n1", "z", "f", "t", 8, 1}, {"n2", "z", "f", "t", 8, 1},
                                  {"o1", "z", "g", "t", 8, 1}, {"u1", "z", "f", "u", 8, 1}, {NULL}};
    static const struct {
        int nodes, gpn;
        const char *places; /* node:gpus,... */
        const char *err;    /* NULL: accepted */
    } rows[] = {
        {2, 4, "n1:4,n2:4", NULL},
        {2, 4, "n1:4", "cannot be restored on 1 places"},
        {2, 4, "n1:4,n1:4", "two pods on node n1"},
        {2, 4, "n1:4,o1:4", "span zones, fabrics or GPU types"},
        {2, 4, "n1:4,n2:2", "has 2 GPUs, the job takes 4"},
        {2, 4, "n1:4,x9:4", "node x9 is unknown"},
        {1, 8, "n1:8", NULL},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        sched *s = mk(SCHED_POLICY_SHOAL, f);
        submit(s, gang("R", 2, 6, 100), 0); /* to be restored after the rest */
        submit(s, gang("J", rows[i].nodes, rows[i].gpn, 100), 0);
        char buf[128], *save = NULL;
        snprintf(buf, sizeof buf, "%s", rows[i].places);
        sched_place pl[8];
        size_t n = 0;
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            char *c = strchr(t, ':');
            *c = 0;
            pl[n++] = (sched_place){t, 0, atoi(c + 1)};
        }
        int rc = sched_job_restore(s, "J", pl, n, 5);
        if (rows[i].err) {
            if (rc != SH_EINVAL || !strstr(sh_errmsg(), rows[i].err))
                fail_msg("row %zu: rc %d \"%s\", expected \"%s\"", i, rc, sh_errmsg(), rows[i].err);
            assert_int_equal(jstate(s, "J"), SCHED_QUEUED);
            sched_stats st;
            sched_stats_get(s, &st);
            assert_int_equal(st.gpus_busy, 0);
        } else {
            TU_OK(rc);
            assert_int_equal(jstate(s, "J"), SCHED_RUNNING);
        }
        TU_OK(sched_check(s, 5));
        /* A restored job finishes and bills like any other: 5 s at 1/GPU-hour. */
        if (!rows[i].err) {
            TU_OK(sched_job_finish(s, "J", 10));
            assert_true(fabs(sched_cost_job(s, "J", NULL, 10) - 5.0 * 8 / 3600) < 1e-9);
        }
        sched_free(s);
    }
    sched *s = mk(SCHED_POLICY_SHOAL, f);
    TU_ERR(sched_job_restore(s, "nope", NULL, 0, 0), SH_ENOENT, "job nope is not known");
    sched_free(s);
}

/* ---- Each invariant: break it behind the API's back, expect sched_check to say so */

static void test_check_invariants(void **state)
{
    static const char *const want[] = {"partial gang", "booked twice", "spans pools",
                                       "work on a failed node", "delayed by backfill", "free count",
                                       "up nodes with >= 8 GPUs"};
    for (int k = 0; k < 7; k++) {
        static const tnode_row f[] = {{"n1", "z", "f", "t", 8, 1}, {"n2", "z", "f", "t", 8, 1},
                                      {"n3", "z", "f", "t", 8, 1}, {"o1", "z", "g", "t", 8, 1},
                                      {NULL}};
        sched_decisions d = {0};
        sched *s = mk(SCHED_POLICY_BACKFILL, f);
        submit(s, gang("A", 2, 8, 100), 0);
        submit(s, gang("B", 3, 8, 100), 0); /* blocked: reserved at t=100 */
        step(s, 0, &d);
        submit(s, gang("C", 1, 8, 1000), 0); /* queued, never stepped */
        uint32_t a = (uint32_t)sched_job_ix(s, "A"), c = (uint32_t)sched_job_ix(s, "C");
        uint32_t o1 = sched__map_get(&s->node_map, "o1");
        sjob *ja = &s->jobs[a];
        switch (k) {
        case 0: sched__release_place(s, a, 0, 1); break;
        case 1: {
            /* A second booking of the same 8 GPUs, free count untouched. */
            snode *n = &s->nodes[ja->places[0].node];
            n->refs = realloc(n->refs, (size_t)(n->nrefs + 1) * sizeof *n->refs);
            n->refs[n->nrefs++] = (sref){c, 8};
            n->caprefs = n->nrefs;
            break;
        }
        case 2:
            sched__release_place(s, a, 0, 1);
            sched__hold(s, a, o1, s->nodes[o1].free, 1);
            break;
        case 3:
            sched__bucket_remove(s, ja->places[0].node);
            s->nodes[ja->places[0].node].state = SCHED_NODE_FAILED;
            break;
        case 4: {
            /* Start C by hand on the reserved free node: 1000 s > t=100. */
            TU_OK(sched_check(s, 0));
            uint32_t free_node = NONE;
            for (uint32_t ni = 0; ni < 3; ni++)
                if (s->nodes[ni].free == 8) free_node = ni;
            sched__queue_remove(s, c);
            sched__hold(s, c, free_node, 8, 0);
            s->jobs[c].state = SCHED_RUNNING, s->jobs[c].start = 0, s->jobs[c].backfilled = 1;
            s->jobs[c].pool = s->nodes[free_node].pool;
            s->running++;
            break;
        }
        case 5: s->nodes[ja->places[0].node].free = 3; break;
        case 6: s->pools[s->nodes[o1].pool].up_ge[8]--; break; /* why.c's nodes_down would misread */
        }
        int rc = sched_check(s, 1);
        if (rc != SH_EINTERNAL || !strstr(sh_errmsg(), want[k]))
            fail_msg("case %d: sched_check gave %d \"%s\", expected \"%s\"", k, rc, sh_errmsg(), want[k]);
        sched_decisions_free(&d);
        sched_free(s);
    }
}

/* ---- The cycle's shortcuts change no decision ----------------------------------- */

static uint64_t lcg(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return *r >> 33;
}

static void same_decisions(const sched_decisions *a, const sched_decisions *b, int cycle)
{
    if (a->n != b->n) fail_msg("cycle %d: %zu decisions with shortcuts, %zu without", cycle, a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        const sched_decision *x = &a->v[i], *y = &b->v[i];
        if (x->kind != y->kind || x->count != y->count || !x->job != !y->job ||
            (x->job && strcmp(x->job, y->job)))
            fail_msg("cycle %d: decision %zu differs: %d %s vs %d %s", cycle, i, x->kind,
                     x->job ? x->job : "-", y->kind, y->job ? y->job : "-");
        for (size_t k = 0; k < x->count; k++)
            if (strcmp(a->places[x->first + k].node, b->places[y->first + k].node) ||
                a->places[x->first + k].gpus != b->places[y->first + k].gpus)
                fail_msg("cycle %d: job %s placed differently", cycle, x->job ? x->job : "-");
    }
}

/* A generated workload (gangs, functions and elastic jobs of three types
 * with per-type speeds, priorities, two tenants, node failures) drives two
 * schedulers in lockstep, one with the shortcuts (shape sweeps, the
 * reservation-time cache) and one without: every cycle must decide the
 * same, under every policy. */
static void test_shortcuts_same_decisions(void **state)
{
    static const char *const types[] = {"h100", "a100", "l4"};
    for (int run = 0; run < 8; run++) {
        int pol = run % 4, mixed = run < 4; /* gangs only: nothing preemptible, the sweeps run */
        sched *s[2];
        sched_decisions d[2] = {{0}, {0}};
        for (int v = 0; v < 2; v++) {
            s[v] = mk((sched_policy)pol, NULL);
            s[v]->plain_cycle = v;
            for (int i = 0; i < 48; i++) {
                char id[16], fab[16];
                snprintf(id, sizeof id, "n%d", i);
                snprintf(fab, sizeof fab, "f%d", i / 12);
                sched_node_spec n = {id, i < 24 ? "z0" : "z1", fab, types[(i / 12) % 3], i % 5 ? 8 : 4, 1.0 + i % 3};
                TU_OK(sched_node_add(s[v], &n, 0));
            }
        }
        uint64_t rng = 12345 + (uint64_t)run;
        char running[512][16];
        int nrun = 0, next = 0;
        for (int cyc = 0; cyc < 400; cyc++) {
            double now = cyc * 60.0;
            for (int k = (int)(lcg(&rng) % 6); k > 0; k--) {
                char id[16];
                snprintf(id, sizeof id, "j%d", next++);
                sched_job_spec j = gang(id, 1 + (int)(lcg(&rng) % 6), 1 << (lcg(&rng) % 4), 300 + (double)(lcg(&rng) % 7200));
                uint64_t kind = lcg(&rng) % 10;
                if (kind == 0 && mixed) j.kind = SCHED_FUNCTION;
                else if (kind == 1 && mixed) j.kind = SCHED_ELASTIC, j.max_replicas = j.nodes + 2;
                j.tenant = lcg(&rng) % 3 ? "a" : "b";
                j.priority = (int)(lcg(&rng) % 3);
                if (lcg(&rng) % 2) {
                    j.n_types = 2;
                    int t = (int)(lcg(&rng) % 3);
                    j.gpu_types[0] = types[t], j.speed[0] = 1.0 + (double)(lcg(&rng) % 3);
                    j.gpu_types[1] = types[(t + 1) % 3], j.speed[1] = 0.5;
                }
                int rc0 = sched_job_submit(s[0], &j, now), rc1 = sched_job_submit(s[1], &j, now);
                assert_int_equal(rc0, rc1);
            }
            if (cyc % 50 == 25) {
                char id[16];
                snprintf(id, sizeof id, "n%d", (int)(lcg(&rng) % 48));
                TU_OK(sched_node_fail(s[0], id, now));
                TU_OK(sched_node_fail(s[1], id, now));
            }
            for (int v = 0; v < 2; v++) step(s[v], now, &d[v]);
            same_decisions(&d[0], &d[1], cyc);
            if (cyc % 20 == 19) /* every queued job's reason, without its estimate as with it */
                for (uint32_t ix = 0; ix < sched_job_count(s[0]); ix++)
                    if (s[0]->jobs[ix].id) same_reason(s[0], ix, now);
            for (size_t i = 0; i < d[0].n; i++)
                if (d[0].v[i].kind == SCHED_D_START && nrun < 512)
                    snprintf(running[nrun++], 16, "%s", d[0].v[i].job);
            /* Finish a few running jobs, then forget them in both. */
            for (int k = (int)(lcg(&rng) % 4); k > 0 && nrun; k--) {
                int pick = (int)(lcg(&rng) % (uint64_t)nrun);
                for (int v = 0; v < 2; v++)
                    if (sched_job_ix(s[v], running[pick]) >= 0 && jstate(s[v], running[pick]) == SCHED_RUNNING) {
                        TU_OK(sched_job_finish(s[v], running[pick], now + 30));
                        TU_OK(sched_job_forget(s[v], running[pick]));
                    }
                memcpy(running[pick], running[--nrun], 16);
            }
        }
        for (int v = 0; v < 2; v++) sched_decisions_free(&d[v]), sched_free(s[v]);
    }
}

/* The reason-only query gives job ix the wait and text of the whole one,
 * and no estimate. */
static void same_reason(sched *s, uint32_t ix, double now)
{
    sched_job_info in, r;
    TU_OK(sched_job_info_ix(s, ix, now, &in));
    TU_OK(sched_job_reason_ix(s, ix, now, &r));
    if (r.state != in.state || r.wait != in.wait || strcmp(r.wait_text, in.wait_text) ||
        (in.wait != SCHED_WAIT_NONE && !isnan(r.est_start_s)))
        fail_msg("job %s: reason only %s \"%s\" est %g, whole %s \"%s\"", in.id, sched_wait_name(r.wait), r.wait_text,
                 r.est_start_s, sched_wait_name(in.wait), in.wait_text);
}

/* Checks job id's wait reason, a phrase of its text and its estimate. */
static void want_wait(sched *s, const char *id, double now, sched_wait w, const char *phrase, double est)
{
    sched_job_info in;
    same_reason(s, (uint32_t)sched_job_ix(s, id), now);
    TU_OK(sched_job_info_get(s, id, now, &in));
    if (in.wait != w || !strstr(in.wait_text, phrase) ||
        !(in.est_start_s == est || fabs(in.est_start_s - est) < 1e-6))
        fail_msg("job %s: wait %s \"%s\" est %.3f; want %s \"%s\" est %.3f", id, sched_wait_name(in.wait),
                 in.wait_text, in.est_start_s, sched_wait_name(w), phrase, est);
}

/* Every pending job has a reason from the core and a start estimate from
 * the reservation plan; each case worked out by hand on one 4-node pool. */
static void test_pending_reasons(void **state)
{
    static const tnode_row fleet[] = {{"a0", "z0", "f0", "h100", 8, 1}, {"a1", "z0", "f0", "h100", 8, 1},
                                      {"a2", "z0", "f0", "h100", 8, 1}, {"a3", "z0", "f0", "h100", 8, 1},
                                      {NULL}};
    sched_decisions d = {0};
    sched *s = mk(SCHED_POLICY_BACKFILL, fleet);
    submit(s, gang("big", 3, 8, 1000), 0); /* a0..a2 until t=1000 */
    step(s, 0, &d);
    submit(s, gang("g4", 4, 8, 500), 10); /* needs the whole pool: reserved for t=1000 */
    submit(s, gang("x", 1, 8, 5000), 10); /* fits on a3 now, but would outlast g4's start */
    want_wait(s, "x", 10, SCHED_WAIT_NEXT_CYCLE, "fits now", 10); /* before any cycle saw it */
    step(s, 10, &d);
    assert_null(find(&d, SCHED_D_START, NULL));
    want_wait(s, "g4", 20, SCHED_WAIT_RESERVED, "reservation of 4 nodes in z0/f0/h100", 1000);
    /* x's plan: every node is g4's until 1000 + 500. */
    want_wait(s, "x", 20, SCHED_WAIT_RESERVATION, "reservation for job g4", 1500);
    submit(s, gang("two", 2, 8, 100), 20);
    want_wait(s, "two", 20, SCHED_WAIT_RESOURCES, "needs 2 nodes with 8 GPUs free in one pool; the best, z0/f0/h100, has 1", 1500);
    /* Nodes down: a gang of 4 cannot fit while a3 is out. */
    TU_OK(sched_node_fail(s, "a3", 30));
    want_wait(s, "g4", 30, SCHED_WAIT_NODES_DOWN, "never fits while nodes are down", INFINITY);
    TU_OK(sched_node_recover(s, "a3", 40));
    sched_free(s);

    /* Fair share (shoal): tenant a holds all busy GPUs, b has work queued. */
    sched_config c;
    sched_config_default(&c, SCHED_POLICY_SHOAL);
    c.max_reservations = 1; /* b-wait, the older, takes it */
    s = sched_new(&c);
    for (const tnode_row *r = fleet; r->id; r++) {
        sched_node_spec n = {r->id, r->zone, r->fabric, r->type, r->gpus, r->price};
        TU_OK(sched_node_add(s, &n, 0));
    }
    sched_job_spec a = gang("a-run", 4, 8, 1000), b = gang("b-wait", 1, 8, 100), a2 = gang("a-wait", 1, 8, 100);
    a.tenant = a2.tenant = "a", b.tenant = "b";
    submit(s, a, 0);
    step(s, 0, &d);
    submit(s, b, 5), submit(s, a2, 5);
    step(s, 5, &d);
    want_wait(s, "a-wait", 6, SCHED_WAIT_FAIR_SHARE, "tenant a holds 100% of busy GPUs, over its fair share of 50%", 1000);
    want_wait(s, "b-wait", 6, SCHED_WAIT_RESERVED, "reservation of 1 nodes", 1000);
    sched_job_info in;
    TU_OK(sched_job_info_get(s, "a-run", 6, &in));
    assert_int_equal(in.wait, SCHED_WAIT_NONE);
    assert_true(in.est_start_s == -1 && !in.wait_text[0]);
    sched_decisions_free(&d);
    sched_free(s);
}

/* The start estimate plans every queued job ahead in order, not only the
 * reservation: on one node busy until 100, b (reserved), c and d of 50 s
 * each start at 100, 150 and 200; a 20 s job fits the hole a 2-node gang
 * leaves before its start.  plain_estimates gives the old, queue-blind
 * estimate (d at 150: after b). */
static void test_estimate_plan(void **state)
{
    (void)state;
    static const tnode_row one[] = {{"n0", "z0", "f0", "h100", 8, 1}, {NULL}};
    for (int plain = 0; plain < 2; plain++) {
        sched_config c;
        sched_config_default(&c, SCHED_POLICY_BACKFILL);
        c.plain_estimates = plain;
        sched *s = sched_new(&c);
        sched_node_spec n = {one[0].id, one[0].zone, one[0].fabric, one[0].type, one[0].gpus, one[0].price};
        TU_OK(sched_node_add(s, &n, 0));
        sched_decisions d = {0};
        submit(s, gang("a", 1, 8, 100), 0);
        step(s, 0, &d);
        submit(s, gang("b", 1, 8, 50), 1), submit(s, gang("c", 1, 8, 50), 2), submit(s, gang("d", 1, 8, 50), 3);
        step(s, 3, &d);
        want_wait(s, "b", 4, SCHED_WAIT_RESERVED, "reservation of 1 nodes", 100);
        want_wait(s, "c", 4, SCHED_WAIT_RESOURCES, "needs 1 nodes", 150);
        want_wait(s, "d", 4, SCHED_WAIT_RESOURCES, "needs 1 nodes", plain ? 150 : 200);
        sched_decisions_free(&d);
        sched_free(s);
    }
    /* Holes: n0 busy until 10, n1 until 100; g (2 nodes) is reserved for
     * 100, so in the plan n0 stands idle from 10 to 100: a 20 s job fits
     * there at 10, while a 500 s one, though ahead of it, waits for g's
     * end (400). */
    static const tnode_row two[] = {{"n0", "z0", "f0", "h100", 8, 1}, {"n1", "z0", "f0", "h100", 8, 1}, {NULL}};
    sched *s = mk(SCHED_POLICY_BACKFILL, two);
    sched_decisions d = {0};
    submit(s, gang("a0", 1, 8, 10), 0), submit(s, gang("a1", 1, 8, 100), 0);
    step(s, 0, &d);
    submit(s, gang("g", 2, 8, 300), 1);
    step(s, 1, &d);
    submit(s, gang("long", 1, 8, 500), 2), submit(s, gang("short", 1, 8, 20), 2);
    step(s, 2, &d);
    want_wait(s, "g", 3, SCHED_WAIT_RESERVED, "reservation of 2 nodes", 100);
    want_wait(s, "long", 3, SCHED_WAIT_RESOURCES, "needs 1 nodes", 400);
    want_wait(s, "short", 3, SCHED_WAIT_RESOURCES, "needs 1 nodes", 10);
    sched_decisions_free(&d);
    sched_free(s);
}

/* ---- Work past its estimate ---------------------------------------------------

 * A job without est_s is planned at default_est_s (3600 s) and nothing
 * ends it there.  Past its estimate it is expected to end at the first of
 * base + 60 x (2^k - 1) s (k = 0, 1, ...) not before now: 3600, 3660,
 * 3780, 4020, 4500, 5460, 7380, 11220, ... for the gangs below, started
 * at 0.  Each case runs under the fast path and the reference. */

/* Estimates, wait texts and the reservation of a gang waiting behind a
 * job that runs past its default estimate: never before now, "due to
 * start" in more than 0 s while it runs, and a reservation that moves
 * later only when its estimate is passed again (resv_late), not at every
 * cycle. */
static void test_overdue_estimates(void **state)
{
    (void)state;
    static const tnode_row fleet[] = {{"a0", "z0", "f0", "h100", 8, 1}, {"a1", "z0", "f0", "h100", 8, 1},
                                      {"a2", "z0", "f0", "h100", 8, 1}, {"a3", "z0", "f0", "h100", 8, 1},
                                      {NULL}};
    static const sched_policy pols[] = {SCHED_POLICY_BACKFILL, SCHED_POLICY_SHOAL};
    for (int ref = 0; ref < 2; ref++)
        for (int p = 0; p < 2; p++) {
            sched *s = mk_ref(pols[p], ref, fleet);
            sched_decisions d = {0};
            submit(s, gang("big", 3, 8, 0), 0); /* no est_s: 3600 s */
            step(s, 0, &d);
            submit(s, gang("g4", 4, 8, 500), 3500), submit(s, gang("x", 1, 8, 50000), 3500);
            step(s, 3500, &d);
            want_wait(s, "g4", 3500, SCHED_WAIT_RESERVED, "reservation of 4 nodes", 3600);
            want_wait(s, "x", 3500, SCHED_WAIT_RESERVATION, "due to start in 100 s", 4100);
            /* 400 s past: big should end by 4020. */
            step(s, 4000, &d);
            want_wait(s, "g4", 4000, SCHED_WAIT_RESERVED, "reservation of 4 nodes", 4020);
            want_wait(s, "x", 4000, SCHED_WAIT_RESERVATION, "due to start in 20 s", 4520);
            want_wait(s, "g4", 4010, SCHED_WAIT_RESERVED, "reservation of 4 nodes", 4020);
            /* Asked past that before the next cycle: now, never earlier. */
            want_wait(s, "g4", 4030, SCHED_WAIT_RESERVED, "reservation of 4 nodes", 4030);
            /* Work that ends before the reservation's time (now 4500) is
             * backfilled onto a3; "ends now" left a3 idle. */
            submit(s, gang("short", 1, 8, 300), 4030);
            step(s, 4030, &d);
            assert_non_null(find(&d, SCHED_D_START, "short"));
            want_wait(s, "g4", 4030, SCHED_WAIT_RESERVED, "reservation of 4 nodes", 4500);
            want_wait(s, "x", 4030, SCHED_WAIT_RESOURCES, "needs 1 nodes", 5000);
            sched_stats st0, st;
            sched_stats_get(s, &st0);
            /* A cycle every 10 s for four hours: every estimate after now. */
            for (double t = 4035; t < 18000; t += 10) {
                if (t > 4330 && t < 4340) TU_OK(sched_job_finish(s, "short", 4330));
                step(s, t, &d);
                assert_null(find(&d, SCHED_D_START, NULL));
                sched_job_info in;
                TU_OK(sched_job_info_get(s, "g4", t, &in));
                if (!(in.est_start_s > t) || in.wait != SCHED_WAIT_RESERVED)
                    fail_msg("t=%.0f: g4 %s, estimate %.1f, not after now", t, sched_wait_name(in.wait),
                             in.est_start_s);
                TU_OK(sched_job_info_get(s, "x", t, &in));
                if (!(in.est_start_s > t + 500 - 1e-6) || strstr(in.wait_text, "in 0 s"))
                    fail_msg("t=%.0f: x \"%s\", estimate %.1f", t, in.wait_text, in.est_start_s);
            }
            /* Passed at 4500, 5460, 7380, 11220 and 18900 > 18000: four moves. */
            sched_stats_get(s, &st);
            if (st.resv_late - st0.resv_late != 4)
                fail_msg("the reservation moved later %llu times in 1,400 cycles, want 4",
                         (unsigned long long)(st.resv_late - st0.resv_late));
            want_wait(s, "g4", 18000, SCHED_WAIT_RESERVED, "reservation of 4 nodes", 18900);
            TU_OK(sched_job_finish(s, "big", 18000));
            step(s, 18000, &d);
            assert_non_null(find(&d, SCHED_D_START, "g4"));
            /* Work that starts later is planned at its whole estimate. */
            TU_OK(sched_job_finish(s, "g4", 18500));
            step(s, 18500, &d);
            assert_non_null(find(&d, SCHED_D_START, "x"));
            submit(s, gang("y", 4, 8, 100), 18600);
            step(s, 18600, &d);
            want_wait(s, "y", 18600, SCHED_WAIT_RESERVED, "reservation of 4 nodes", 68500);
            sched_decisions_free(&d);
            sched_free(s);
        }
}

/* A blocked gang is told where it can start soonest: not on the node of a
 * job long past its estimate, which in the old rule ("ends now") always
 * looked soonest.  O (no est_s) runs past 3600 on one node, P until 6000
 * on another, R2 until 6100 on the third (whose other half R1 left at
 * 5000).  At 5500 O is expected at 7380, so G (2 x 8) is reserved P's and
 * R2's nodes for 6100, and L (4 GPUs, long) may not take R2's free half:
 * G starts at 6100 while O still runs. */
static void test_overdue_reservation(void **state)
{
    (void)state;
    static const tnode_row fleet[] = {{"a0", "z0", "f0", "h100", 8, 1}, {"a1", "z0", "f0", "h100", 8, 1},
                                      {"a2", "z0", "f0", "h100", 8, 1}, {NULL}};
    static const sched_policy pols[] = {SCHED_POLICY_BACKFILL, SCHED_POLICY_SHOAL};
    for (int ref = 0; ref < 2; ref++)
        for (int p = 0; p < 2; p++) {
            sched *s = mk_ref(pols[p], ref, fleet);
            sched_decisions d = {0};
            submit(s, gang("O", 1, 8, 0), 0), submit(s, gang("P", 1, 8, 6000), 0);
            submit(s, gang("R1", 1, 4, 5000), 0), submit(s, gang("R2", 1, 4, 6100), 0);
            step(s, 0, &d);
            char on_p[16], on_r[16];
            snprintf(on_p, sizeof on_p, "%s", nodes_of(s, "P"));
            snprintf(on_r, sizeof on_r, "%s", nodes_of(s, "R2"));
            assert_string_equal(nodes_of(s, "R1"), on_r);
            TU_OK(sched_job_finish(s, "R1", 5000));
            step(s, 5000, &d);
            submit(s, gang("G", 2, 8, 1000), 5500);
            step(s, 5500, &d);
            want_wait(s, "G", 5500, SCHED_WAIT_RESERVED, "reservation of 2 nodes", 6100);
            submit(s, gang("L", 1, 4, 100000), 5510);
            step(s, 5510, &d);
            assert_null(find(&d, SCHED_D_START, "L"));
            want_wait(s, "L", 5510, SCHED_WAIT_RESERVATION, "reservation for job G (due to start in 590 s)", 7100);
            TU_OK(sched_job_finish(s, "P", 6000));
            step(s, 6000, &d);
            TU_OK(sched_job_finish(s, "R2", 6100));
            step(s, 6100, &d);
            assert_non_null(find(&d, SCHED_D_START, "G"));
            char want[40];
            snprintf(want, sizeof want, "%s,%s", strcmp(on_p, on_r) < 0 ? on_p : on_r,
                     strcmp(on_p, on_r) < 0 ? on_r : on_p);
            assert_string_equal(nodes_of(s, "G"), want);
            assert_int_equal(jstate(s, "O"), SCHED_RUNNING);
            sched_decisions_free(&d);
            sched_free(s);
        }
}

/* A server that restarts under a running job restores it with when its
 * places were taken: R (no est_s) placed at 1000 and restored at 5000 is
 * past its 3600 s, expected at 5020 (4600 moved on 60, 120, 240 s), and W
 * behind it is told so; restored without a since it is given its whole
 * estimate again from now (8600), as before. */
static void test_overdue_restore(void **state)
{
    (void)state;
    static const tnode_row one[] = {{"n0", "z", "f", "t", 8, 1}, {NULL}};
    for (int known = 0; known < 2; known++) {
        sched *s = mk(SCHED_POLICY_BACKFILL, one);
        sched_decisions d = {0};
        submit(s, gang("R", 1, 8, 0), 900), submit(s, gang("W", 1, 8, 100), 900);
        sched_place pl = {"n0", 0, 8, 0, known ? 1000 : 0};
        TU_OK(sched_job_restore(s, "R", &pl, 1, 5000));
        step(s, 5000, &d);
        want_wait(s, "W", 5000, SCHED_WAIT_RESERVED, "reservation of 1 nodes", known ? 5020 : 8600);
        sched_job_info in;
        TU_OK(sched_job_info_get(s, "R", 5000, &in));
        assert_true(in.start_s == (known ? 1000 : 5000));
        sched_decisions_free(&d);
        sched_free(s);
    }
}

/* shoal preempts lower-priority work for a gang that would otherwise wait
 * long (preempt_wait 0.5 x its 1000 s).  Behind a job past its estimate
 * the gang is due "now" in the old rule, forever, so it never preempted;
 * now the wait it is told grows with the overrun: at 4600 O is expected
 * at 5460, 860 s away, and G takes E's node. */
static void test_overdue_preempt_wait(void **state)
{
    (void)state;
    static const tnode_row two[] = {{"n0", "z", "f", "t", 8, 1}, {"n1", "z", "f", "t", 8, 1}, {NULL}};
    for (int ref = 0; ref < 2; ref++) {
        sched *s = mk_ref(SCHED_POLICY_SHOAL, ref, two);
        sched_decisions d = {0};
        submit(s, gang("O", 1, 8, 0), 0);
        submit(s, elastic("E", 1, 1, 8, 0), 0);
        step(s, 0, &d);
        sched_job_spec g = gang("G", 1, 8, 1000);
        g.priority = 5;
        submit(s, g, 3500);
        double started = -1;
        for (double t = 3500; t <= 10000 && started < 0; t += 100) {
            step(s, t, &d);
            if (find(&d, SCHED_D_START, "G")) started = t;
        }
        if (started != 4600) fail_msg("G started at %.0f, want 4600 (E preempted)", started);
        assert_int_equal(jstate(s, "E"), SCHED_QUEUED);
        assert_int_equal(jstate(s, "O"), SCHED_RUNNING);
        sched_decisions_free(&d);
        sched_free(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pending_reasons), cmocka_unit_test(test_estimate_plan),
        cmocka_unit_test(test_overdue_estimates), cmocka_unit_test(test_overdue_reservation),
        cmocka_unit_test(test_overdue_preempt_wait), cmocka_unit_test(test_overdue_restore),
        cmocka_unit_test(test_placement_table),
        cmocka_unit_test(test_least_fragmentation),
        cmocka_unit_test(test_reject_never_fits),
        cmocka_unit_test(test_backfill_table),
        cmocka_unit_test(test_backfill_shares_spare),
        cmocka_unit_test(test_firstfit_deadlock),
        cmocka_unit_test(test_failure_requeue),
        cmocka_unit_test(test_failure_replace),
        cmocka_unit_test(test_failure_elastic_and_function),
        cmocka_unit_test(test_elastic_grows_onto_a_type_that_joins),
        cmocka_unit_test(test_preemption_table),
        cmocka_unit_test(test_preempt_wait_table),
        cmocka_unit_test(test_elastic_cost_per_work),
        cmocka_unit_test(test_billing_per_second),
        cmocka_unit_test(test_devices_and_bills),
        cmocka_unit_test(test_forget),
        cmocka_unit_test(test_shortcuts_same_decisions),
        cmocka_unit_test(test_autoscale),
        cmocka_unit_test(test_restore_table),
        cmocka_unit_test(test_check_invariants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
