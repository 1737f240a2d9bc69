/* Push distribution end to end: real processes (`shoal push serve`, `shoal
 * push relay`, `shoal replica`) talking UCX over loopback. */
#include "testutil.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <math.h>

#include "shoal/ckpt.h"
#include "control/sim/sim_push_int.h"
#include "shoal/store.h"

#define MAXP 16
static pid_t procs[MAXP];
static int nprocs;

/* Starts `sh -c "exec CMD"` so that the pid is the shoal process itself. */
static pid_t spawn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static pid_t spawn(const char *fmt, ...)
{
    char cmd[8192], full[8300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "exec %s", cmd);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    if (nprocs < MAXP) procs[nprocs++] = pid;
    return pid;
}

/* Waits for pid to exit; returns its status, or fails after timeout_s. */
static int wait_exit(pid_t pid, double timeout_s)
{
    double end = sh_now_mono() + timeout_s;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            for (int i = 0; i < nprocs; i++)
                if (procs[i] == pid) procs[i] = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if (sh_now_mono() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("process %d did not exit within %.0fs", (int)pid, timeout_s);
        }
        sh_sleep(0.02);
    }
}

static void kill_all(void)
{
    for (int i = 0; i < nprocs; i++)
        if (procs[i] > 0) {
            kill(procs[i], SIGTERM);
            waitpid(procs[i], NULL, 0);
            procs[i] = 0;
        }
    nprocs = 0;
}

static int teardown(void **state)
{
    kill_all();
    return 0;
}

/* Waits for a file to appear and returns its first line (static buffer). */
static const char *wait_line(const char *path, double timeout_s)
{
    static char line[256];
    double end = sh_now_mono() + timeout_s;
    while (sh_now_mono() < end) {
        FILE *f = fopen(path, "r");
        if (f) {
            int ok = fgets(line, sizeof line, f) != NULL;
            fclose(f);
            if (ok) {
                line[strcspn(line, "\n")] = 0;
                return line;
            }
        }
        sh_sleep(0.02);
    }
    fail_msg("%s did not appear within %.0fs", path, timeout_s);
    return NULL;
}

static void wait_file(const char *path, double timeout_s)
{
    double end = sh_now_mono() + timeout_s;
    while (!sh_path_exists(path)) {
        if (sh_now_mono() > end) fail_msg("%s did not appear within %.0fs", path, timeout_s);
        sh_sleep(0.01);
    }
}

/* The version DIR/ACTIVE names (0 if none yet). */
static uint64_t active_version(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/ACTIVE", dir);
    json_t *j;
    if (sh_json_load_file(p, 1 << 16, &j) < 0) return 0;
    int64_t v = 0;
    sh_json_get_i64(j, "version", 1, p, &v);
    json_decref(j);
    return (uint64_t)v;
}

static void wait_active(const char *dir, uint64_t v, double timeout_s)
{
    double end = sh_now_mono() + timeout_s;
    while (active_version(dir) < v) {
        if (sh_now_mono() > end) fail_msg("%s did not activate version %llu", dir, (unsigned long long)v);
        sh_sleep(0.02);
    }
}

static json_t *load_json(const char *path)
{
    json_t *j;
    if (sh_json_load_file(path, 1 << 20, &j) < 0) fail_msg("%s: %s", path, sh_errmsg());
    return j;
}

static int64_t jint(json_t *j, const char *key)
{
    int64_t v = -1;
    TU_OK(sh_json_get_i64(j, key, 1, "replica output", &v));
    return v;
}

/* Runs `shoal replica --dir DIR --parent ROOT --until V --json` to the end
 * and returns its JSON report, checked to be on version V. */
static json_t *replica_until(const char *dir, const char *root, int v)
{
    pid_t r = spawn("%s replica --dir %s --parent %s --until %d --seconds 60 --json >%s.json 2>%s.log",
                    tu_shoal(), dir, root, v, dir, dir);
    assert_int_equal(wait_exit(r, 60), 0);
    char p[4096];
    snprintf(p, sizeof p, "%s.json", dir);
    json_t *j = load_json(p);
    assert_int_equal(jint(j, "version"), v);
    return j;
}

/* The replica's active model is byte-identical to the checkpoint. */
static void same_model(const char *dir, uint64_t v, const char *ckpt_path)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/models/%010llu.safetensors", dir, (unsigned long long)v);
    tu_assert_same_file(p, ckpt_path);
}

static void publish(const char *store_dir, const char *ckpt_path)
{
    char *out;
    int rc = tu_run(&out, "%s store publish %s %s --anchor-every 1", tu_shoal(), store_dir, ckpt_path);
    if (rc) fail_msg("publish failed: %s", out);
    free(out);
}

static const char *serve_root(const char *name, const char *extra)
{
    char addr[256];
    snprintf(addr, sizeof addr, "%s.addr", name);
    unlink(tu_path(addr));
    spawn("%s push serve --store %s --addr-file %s --chunk 256KiB %s 2>%s.log", tu_shoal(),
          tu_path(name), tu_path(addr), extra, tu_path(name));
    return wait_line(tu_path(addr), 20);
}

static void test_tree_converges(void **state)
{
    TU_OK(ckpt_synth(tu_path("t1.st"), 1000000, 1));
    TU_OK(ckpt_synth(tu_path("t2.st"), 1000000, 2));
    sh_rm_rf(tu_path("tree"));
    publish(tu_path("tree"), tu_path("t1.st"));
    char root[256];
    snprintf(root, sizeof root, "%s", serve_root("tree", "--fanout 1"));
    pid_t rep[3];
    char dirs[3][4096], outs[3][4096];
    for (int i = 0; i < 3; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s/rep%d", tu_path("tree-r"), i);
        snprintf(outs[i], sizeof outs[i], "%s/out%d.json", tu_path("tree-r"), i);
        sh_rm_rf(dirs[i]);
        TU_OK(sh_mkdir_p(dirs[i], 0755));
        rep[i] = spawn("%s replica --dir %s --parent %s --until 2 --seconds 60 --json >%s 2>%s.log",
                       tu_shoal(), dirs[i], root, outs[i], outs[i]);
    }
    for (int i = 0; i < 3; i++) wait_active(dirs[i], 1, 60);
    publish(tu_path("tree"), tu_path("t2.st"));
    int redirected = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(wait_exit(rep[i], 60), 0);
        json_t *j = load_json(outs[i]);
        assert_int_equal(jint(j, "version"), 2);
        assert_int_equal(jint(j, "failures"), 0);
        redirected += jint(j, "redirects") > 0;
        json_decref(j);
        same_model(dirs[i], 2, tu_path("t2.st"));
    }
    /* Fan-out 1: the root takes one replica, the others are sent down. */
    assert_int_equal(redirected, 2);
    kill_all();
}

/* A run's push tree feeds only the processes that prove the run's secret:
 * another tenant's process on the same network, with no SHOAL_RUN_SECRET
 * or another one, attaches and gets no version, and the root says whom it
 * refused; a replica of the run converges, and takes nothing from a
 * parent that does not prove the secret back. */
static void test_secret_required(void **state)
{
    const char *secret = "00112233445566778899aabbccddeeff";
    TU_OK(ckpt_synth(tu_path("s1.st"), 200000, 1));
    sh_rm_rf(tu_path("sec"));
    publish(tu_path("sec"), tu_path("s1.st"));
    unlink(tu_path("sec.addr"));
    spawn("env SHOAL_RUN_SECRET=%s %s push serve --store %s --addr-file %s 2>%s.log", secret, tu_shoal(),
          tu_path("sec"), tu_path("sec.addr"), tu_path("sec"));
    char root[256];
    snprintf(root, sizeof root, "%s", wait_line(tu_path("sec.addr"), 20));
    const char *env[2] = {"env -u SHOAL_RUN_SECRET", "env SHOAL_RUN_SECRET=ffeeddccbbaa99887766554433221100"};
    for (int k = 0; k < 2; k++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/thief%d", tu_path("sec-r"), k);
        sh_rm_rf(dir);
        TU_OK(sh_mkdir_p(dir, 0755));
        pid_t t = spawn("%s %s replica --dir %s --parent %s --until 1 --seconds 3 --json >%s.json 2>%s.log", env[k],
                        tu_shoal(), dir, root, dir, dir);
        assert_int_equal(wait_exit(t, 30), 1);
        assert_int_equal(active_version(dir), 0);
    }
    char *log = (char *)tu_read_file(tu_path("sec.log"), &(size_t){0});
    int refused = 0;
    for (const char *p = log; (p = strstr(p, "lacks this run's secret")); p++) refused++;
    free(log);
    if (refused < 2) fail_msg("the root logged %d refusals for 2 processes without the secret", refused);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/member", tu_path("sec-r"));
    sh_rm_rf(dir);
    TU_OK(sh_mkdir_p(dir, 0755));
    setenv("SHOAL_RUN_SECRET", secret, 1);
    json_t *j = replica_until(dir, root, 1);
    json_decref(j);
    same_model(dir, 1, tu_path("s1.st"));

    /* The other way: a process that took a root's place (another tenant's,
     * on a port the run's replicas knew) and offers weights of its own.  A
     * replica of the run takes nothing from a parent that does not prove
     * the secret: none, or another. */
    TU_OK(ckpt_synth(tu_path("poison.st"), 200000, 7));
    sh_rm_rf(tu_path("poison"));
    publish(tu_path("poison"), tu_path("poison.st"));
    const char *fake[3] = {"env -u SHOAL_RUN_SECRET", "env SHOAL_RUN_SECRET=ffeeddccbbaa99887766554433221100",
                           "env -u SHOAL_RUN_SECRET SHOAL_BCAST_FORGE_WELCOME=1"}; /* the last forges a WELCOME */
    for (int k = 0; k < 3; k++) {
        char paddr[64], prt[256], victim[4096];
        snprintf(paddr, sizeof paddr, "poison%d.addr", k);
        unlink(tu_path(paddr));
        spawn("%s %s push serve --store %s --addr-file %s 2>%s.log", fake[k], tu_shoal(), tu_path("poison"),
              tu_path(paddr), tu_path(paddr));
        snprintf(prt, sizeof prt, "%s", wait_line(tu_path(paddr), 20));
        snprintf(victim, sizeof victim, "%s/victim%d", tu_path("sec-r"), k);
        sh_rm_rf(victim);
        TU_OK(sh_mkdir_p(victim, 0755));
        pid_t v = spawn("%s replica --dir %s --parent %s --until 1 --seconds 7 --json >%s.json 2>%s.log", tu_shoal(),
                        victim, prt, victim, victim);
        assert_int_equal(wait_exit(v, 30), 1);
        assert_int_equal(active_version(victim), 0);
        char vlog[4200];
        snprintf(vlog, sizeof vlog, "%s.log", victim);
        char *t = (char *)tu_read_file(vlog, &(size_t){0});
        if (!strstr(t, "proved this run's secret") && !strstr(t, "proof of this run's secret") &&
            !strstr(t, "did not prove this run's secret"))
            fail_msg("replica %d took no version but did not say why:\n%s", k, t);
        free(t);
    }
    unsetenv("SHOAL_RUN_SECRET");
    kill_all();
}

static void test_corrupt_chunk_refetched(void **state)
{
    TU_OK(ckpt_synth(tu_path("c1.st"), 600000, 3));
    sh_rm_rf(tu_path("corrupt"));
    publish(tu_path("corrupt"), tu_path("c1.st"));
    setenv("SHOAL_BCAST_CORRUPT", "1:2", 1);
    char root[256];
    snprintf(root, sizeof root, "%s", serve_root("corrupt", ""));
    unsetenv("SHOAL_BCAST_CORRUPT");
    const char *dir = tu_path("corrupt-r");
    sh_rm_rf(dir);
    json_t *j = replica_until(dir, root, 1);
    assert_int_equal(jint(j, "chunks_corrupt"), 1);
    assert_int_equal(jint(j, "activations"), 1);
    json_decref(j);
    same_model(dir, 1, tu_path("c1.st"));
    kill_all();
}

/* Deltas pushed through the tree are applied to each replica's in-memory
 * image of its model (the fast apply path) and written into the recycled
 * file of the model two versions back once there is a private one (version
 * 4 into version 2's file: version 1 is a pushed anchor, linked to the push
 * spool).  Both replicas, the second one a hop down, end with the exact
 * bytes of the newest checkpoint and no failed apply. */
static void test_delta_pushed(void **state)
{
    TU_OK(ckpt_synth(tu_path("d1.st"), 800000, 7));
    TU_OK(ckpt_step(tu_path("d1.st"), tu_path("d2.st"), 1e-5, 1, 8));
    TU_OK(ckpt_step(tu_path("d2.st"), tu_path("d3.st"), 1e-5, 1, 9));
    TU_OK(ckpt_step(tu_path("d3.st"), tu_path("d4.st"), 1e-5, 1, 10));
    sh_rm_rf(tu_path("dstore"));
    char *out;
    if (tu_run(&out, "%s store publish %s %s --anchor-every 8", tu_shoal(), tu_path("dstore"), tu_path("d1.st")))
        fail_msg("publish failed: %s", out);
    free(out);
    char root[256];
    snprintf(root, sizeof root, "%s", serve_root("dstore", "--fanout 1"));
    pid_t rep[2];
    char dirs[2][4096], outs[2][4096];
    for (int i = 0; i < 2; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s/rep%d", tu_path("dstore-r"), i);
        snprintf(outs[i], sizeof outs[i], "%s/out%d.json", tu_path("dstore-r"), i);
        sh_rm_rf(dirs[i]);
        TU_OK(sh_mkdir_p(dirs[i], 0755));
        rep[i] = spawn("%s replica --dir %s --parent %s --until 4 --seconds 60 --json >%s 2>%s.log",
                       tu_shoal(), dirs[i], root, outs[i], outs[i]);
    }
    for (int i = 0; i < 2; i++) wait_active(dirs[i], 1, 60);
    ino_t v2_file[2] = {0, 0};
    for (int v = 2; v <= 4; v++) {
        char ck[16], p[4200];
        snprintf(ck, sizeof ck, "d%d.st", v);
        if (tu_run(&out, "%s store publish %s %s --anchor-every 8", tu_shoal(), tu_path("dstore"), tu_path(ck)))
            fail_msg("publish failed: %s", out);
        assert_non_null(strstr(out, "delta"));
        free(out);
        for (int i = 0; i < 2; i++) {
            wait_active(dirs[i], (uint64_t)v, 60);
            snprintf(p, sizeof p, "%s/models/%010d.safetensors", dirs[i], v);
            struct stat st;
            if (v == 2 && stat(p, &st) == 0) v2_file[i] = st.st_ino;
            if (v == 4) assert_int_equal(stat(p, &st), 0), assert_int_equal(st.st_ino, v2_file[i]);
        }
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(wait_exit(rep[i], 60), 0);
        json_t *j = load_json(outs[i]);
        assert_int_equal(jint(j, "version"), 4);
        assert_int_equal(jint(j, "activations"), 4);
        assert_int_equal(jint(j, "failures"), 0);
        json_decref(j);
        same_model(dirs[i], 4, tu_path("d4.st"));
    }
    kill_all();
}

/* A relay killed mid-transfer: its replicas go back to the root (the address
 * that redirected them), resume from their last verified chunk, and every
 * one activates the version whole. */
static void test_relay_killed(void **state)
{
    TU_OK(ckpt_synth(tu_path("k1.st"), 3000000, 4));
    sh_rm_rf(tu_path("kill"));
    publish(tu_path("kill"), tu_path("k1.st"));
    char root[256];
    /* 0.02 Gb/s: the 6 MB version takes about 2.4 s to leave the root. */
    snprintf(root, sizeof root, "%s", serve_root("kill", "--fanout 1 --egress-gbps 0.02"));
    unlink(tu_path("relay.addr"));
    sh_rm_rf(tu_path("relay-spool"));
    pid_t relay = spawn("%s push relay --parent %s --addr-file %s --spool %s 2>%s", tu_shoal(), root,
                        tu_path("relay.addr"), tu_path("relay-spool"), tu_path("relay.log"));
    wait_line(tu_path("relay.addr"), 20);
    wait_file(tu_path("relay-spool/v1.part"), 20); /* attached: the root offered it v1 */
    pid_t rep[2];
    char dirs[2][4096], outs[2][4096];
    for (int i = 0; i < 2; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s/rep%d", tu_path("kill-r"), i);
        snprintf(outs[i], sizeof outs[i], "%s/out%d.json", tu_path("kill-r"), i);
        sh_rm_rf(dirs[i]);
        TU_OK(sh_mkdir_p(dirs[i], 0755));
        rep[i] = spawn("%s replica --dir %s --parent %s --until 1 --seconds 60 --json >%s 2>%s.log",
                       tu_shoal(), dirs[i], root, outs[i], outs[i]);
    }
    /* Kill the relay once both replicas are receiving from it (their spool
     * holds a partial payload) and neither has the version yet. */
    double end = sh_now_mono() + 30;
    for (;;) {
        int receiving = 0;
        for (int i = 0; i < 2; i++) {
            char part[4096];
            snprintf(part, sizeof part, "%s/spool/v1.part", dirs[i]);
            receiving += sh_path_exists(part) && active_version(dirs[i]) == 0;
        }
        if (receiving == 2) break;
        if (sh_now_mono() > end) fail_msg("the replicas never started receiving from the relay");
        sh_sleep(0.01);
    }
    kill(relay, SIGKILL);
    wait_exit(relay, 10);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(wait_exit(rep[i], 60), 0);
        json_t *j = load_json(outs[i]);
        assert_int_equal(jint(j, "version"), 1);
        assert_int_equal(jint(j, "activations"), 1);
        assert_true(jint(j, "redirects") >= 1);
        assert_true(jint(j, "reattaches") >= 1);
        json_decref(j);
        same_model(dirs[i], 1, tu_path("k1.st"));
    }
    kill_all();
}

/* Zones: replicas of zone b that ask the root (zone a) are sent to the
 * relay of zone b, so one copy crosses the boundary. */
static void test_zones(void **state)
{
    TU_OK(ckpt_synth(tu_path("z1.st"), 300000, 5));
    sh_rm_rf(tu_path("zone"));
    publish(tu_path("zone"), tu_path("z1.st"));
    char root[256];
    snprintf(root, sizeof root, "%s", serve_root("zone", "--zone a --fanout 8"));
    unlink(tu_path("zrelay.addr"));
    sh_rm_rf(tu_path("zrelay-spool"));
    spawn("%s push relay --zone b --parent %s --addr-file %s --spool %s 2>/dev/null", tu_shoal(), root,
          tu_path("zrelay.addr"), tu_path("zrelay-spool"));
    wait_line(tu_path("zrelay.addr"), 20);
    wait_file(tu_path("zrelay-spool/v1.part"), 20);
    const char *zones[3] = {"b", "b", "a"};
    pid_t rep[3];
    char dirs[3][4096], outs[3][4096];
    for (int i = 0; i < 3; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s/rep%d", tu_path("zone-r"), i);
        snprintf(outs[i], sizeof outs[i], "%s/out%d.json", tu_path("zone-r"), i);
        sh_rm_rf(dirs[i]);
        TU_OK(sh_mkdir_p(dirs[i], 0755));
        rep[i] = spawn("%s replica --zone %s --leaf --dir %s --parent %s --until 1 --seconds 60 --json >%s 2>/dev/null",
                       tu_shoal(), zones[i], dirs[i], root, outs[i]);
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(wait_exit(rep[i], 60), 0);
        json_t *j = load_json(outs[i]);
        assert_int_equal(jint(j, "version"), 1);
        assert_int_equal(jint(j, "redirects"), zones[i][0] == 'b' ? 1 : 0);
        json_decref(j);
    }
    kill_all();
}

/* A replica whose push parent never answers falls back to the store. */
static void test_store_fallback(void **state)
{
    TU_OK(ckpt_synth(tu_path("f1.st"), 200000, 6));
    sh_rm_rf(tu_path("fb"));
    publish(tu_path("fb"), tu_path("f1.st"));
    char *out;
    const char *dir = tu_path("fb-r");
    sh_rm_rf(dir);
    int rc = tu_run(&out, "%s replica --dir %s --parent 127.0.0.1:9 --store %s --until 1 --seconds 60 --json 2>/dev/null",
                    tu_shoal(), dir, tu_path("fb"));
    if (rc) fail_msg("replica failed: %s", out);
    assert_non_null(strstr(out, "\"version\":1"));
    free(out);
    same_model(dir, 1, tu_path("f1.st"));
}

/* A replica that joins three versions behind (it restarted on version 1
 * while 2, 3 and 4 were published as deltas) is sent one squashed delta
 * 1 -> 4, fewer bytes than the chain of three, and ends on the exact bytes
 * of version 4. */
static void test_late_joiner_squash(void **state)
{
    const char *ck[4] = {"q1.st", "q2.st", "q3.st", "q4.st"};
    TU_OK(ckpt_synth(tu_path(ck[0]), 800000, 9));
    for (int i = 1; i < 4; i++) TU_OK(ckpt_step(tu_path(ck[i - 1]), tu_path(ck[i]), 1e-5, 1, 10));
    char sq[4096], dir[4096]; /* tu_path's buffers rotate */
    snprintf(sq, sizeof sq, "%s", tu_path("sq"));
    snprintf(dir, sizeof dir, "%s", tu_path("sq-r"));
    sh_rm_rf(sq);
    char *out;
    for (int i = 0; i < 4; i++) {
        if (tu_run(&out, "%s store publish %s %s --anchor-every 8", tu_shoal(), sq, tu_path(ck[i])))
            fail_msg("publish failed: %s", out);
        free(out);
        if (i > 0) continue;
        sh_rm_rf(dir);
        if (tu_run(&out, "%s replica --dir %s --store %s --until 1 --seconds 60", tu_shoal(), dir, sq))
            fail_msg("seeding the replica with version 1 failed: %s", out);
        free(out);
    }
    char root[256];
    snprintf(root, sizeof root, "%s", serve_root("sq", ""));
    json_t *j = replica_until(dir, root, 4);
    assert_int_equal(jint(j, "failures"), 0);
    uint64_t got = (uint64_t)jint(j, "bytes_received");
    json_decref(j);
    /* What crossed the link is the squashed delta the root made, and that
     * is fewer bytes than the three deltas. */
    store *s;
    TU_OK(store_open(sq, NULL, 0, &s));
    uint64_t chain = 0;
    for (uint64_t v = 2; v <= 4; v++) {
        store_version m;
        TU_OK(store_get(s, v, &m, NULL));
        chain += m.size;
    }
    char path[4096];
    TU_OK(store_squash_path(s, 1, 4, path, sizeof path));
    store_close(s);
    size_t squashed;
    free(tu_read_file(path, &squashed));
    assert_int_equal(got, squashed);
    assert_true(squashed < chain);
    same_model(dir, 4, tu_path(ck[3]));
    kill_all();
}

/* A late joiner (issue 31, item 5) learns the newest version from its
 * parent's ANNOUNCE and builds the versions on its way there in memory
 * only: joining at version 10 (anchors 1, 5 and 9), it receives the
 * anchor 9 and the delta 10 (what the store's cheapest plan from nothing
 * costs) and activates version 10 first, once, bit-exact. */
static void test_joiner_activates_newest(void **state)
{
    char ck[10][64], sj[4096], dir[4096];
    snprintf(sj, sizeof sj, "%s", tu_path("sj"));
    snprintf(dir, sizeof dir, "%s", tu_path("sj-r"));
    sh_rm_rf(sj);
    sh_rm_rf(dir);
    char *out;
    for (int i = 0; i < 10; i++) {
        snprintf(ck[i], sizeof ck[i], "j%d.st", i + 1);
        if (i == 0) TU_OK(ckpt_synth(tu_path(ck[0]), 800000, 11));
        else TU_OK(ckpt_step(tu_path(ck[i - 1]), tu_path(ck[i]), 1e-5, 1, 20 + (uint64_t)i));
        if (tu_run(&out, "%s store publish %s %s --anchor-every 4", tu_shoal(), sj, tu_path(ck[i])))
            fail_msg("publish failed: %s", out);
        free(out);
    }
    /* A slow link (the anchor takes most of a second): the joiner decides
     * what to do with the anchor long before the delta after it arrives,
     * so only the parent's ANNOUNCE can tell it that version 10 exists. */
    char root[256];
    snprintf(root, sizeof root, "%s", serve_root("sj", "--egress-gbps 0.02"));
    json_t *j = replica_until(dir, root, 10);
    assert_int_equal(jint(j, "failures"), 0);
    assert_int_equal(jint(j, "activations"), 1);
    assert_int_equal(jint(j, "newest_announced"), 10);
    uint64_t got = (uint64_t)jint(j, "bytes_received");
    json_decref(j);
    store *s;
    store_plan *plan = malloc(sizeof *plan);
    TU_OK(store_open(sj, NULL, 0, &s));
    TU_OK(store_plan_make(s, 0, 10, plan));
    store_close(s);
    print_message("joiner at v10: %llu bytes received, the store's plan %llu (%s from v%llu)\n",
                  (unsigned long long)got, (unsigned long long)plan->bytes, store_plan_kind_name(plan->kind),
                  (unsigned long long)plan->anchor);
    assert_int_equal(plan->anchor, 9);
    assert_true(got <= plan->bytes + plan->bytes / 5);
    free(plan);
    same_model(dir, 10, tu_path(ck[9]));
    /* Only version 10's file: nothing before it was written. */
    char m9[4200];
    snprintf(m9, sizeof m9, "%s/models/%010d.safetensors", dir, 9);
    assert_false(sh_path_exists(m9));
    kill_all();
}

/* A replica holding version n - 1 receives the delta to n even when n is
 * stored as an anchor: the root makes one delta across the anchor (into
 * the store's squash cache) and serves it when it is fewer bytes. */
static void test_delta_across_anchor(void **state)
{
    char ck[5][64], sa[4096], dir[4096];
    snprintf(sa, sizeof sa, "%s", tu_path("sa"));
    snprintf(dir, sizeof dir, "%s", tu_path("sa-r"));
    sh_rm_rf(sa);
    sh_rm_rf(dir);
    char *out;
    for (int i = 0; i < 5; i++) {
        snprintf(ck[i], sizeof ck[i], "a%d.st", i + 1);
        if (i == 0) TU_OK(ckpt_synth(tu_path(ck[0]), 800000, 12));
        else TU_OK(ckpt_step(tu_path(ck[i - 1]), tu_path(ck[i]), 1e-5, 1, 40 + (uint64_t)i));
        if (tu_run(&out, "%s store publish %s %s --anchor-every 4", tu_shoal(), sa, tu_path(ck[i])))
            fail_msg("publish failed: %s", out);
        free(out);
        if (i != 3) continue;
        if (tu_run(&out, "%s replica --dir %s --store %s --until 4 --seconds 60", tu_shoal(), dir, sa))
            fail_msg("seeding the replica with version 4 failed: %s", out);
        free(out);
    }
    store *s;
    store_version m5;
    TU_OK(store_open(sa, NULL, 0, &s));
    TU_OK(store_get(s, 5, &m5, NULL));
    assert_true(m5.anchor);
    char root[256];
    snprintf(root, sizeof root, "%s", serve_root("sa", ""));
    json_t *j = replica_until(dir, root, 5);
    assert_int_equal(jint(j, "failures"), 0);
    uint64_t got = (uint64_t)jint(j, "bytes_received");
    json_decref(j);
    char path[4096];
    TU_OK(store_squash_path(s, 4, 5, path, sizeof path));
    size_t cross;
    free(tu_read_file(path, &cross));
    store_plan *plan = malloc(sizeof *plan);
    TU_OK(store_plan_make(s, 4, 5, plan));
    store_close(s);
    print_message("v4 -> v5 (an anchor of %llu bytes): %llu bytes received, the delta across it %zu\n",
                  (unsigned long long)m5.size, (unsigned long long)got, cross);
    assert_int_equal(plan->kind, STORE_PLAN_SQUASH);
    assert_int_equal(got, cross);
    assert_true(cross < m5.size / 4);
    free(plan);
    same_model(dir, 5, tu_path(ck[4]));
    kill_all();
}

static void test_bad_usage(void **state)
{
    char *out;
    assert_int_equal(tu_run(&out, "%s push relay", tu_shoal()), 2);
    assert_non_null(strstr(out, "relay needs --parent"));
    free(out);
    assert_int_equal(tu_run(&out, "%s push serve --store %s", tu_shoal(), tu_path("nostore")), 1);
    assert_non_null(strstr(out, "does not exist"));
    free(out);
    /* A malformed address is bad usage (exit 2), named with its option. */
    assert_int_equal(tu_run(&out, "%s replica --dir %s --parent nonsense", tu_shoal(), tu_path("bad-r")), 2);
    assert_non_null(strstr(out, "--parent: expected IPV4:PORT"));
    free(out);
}


/* The push-tree model (src/control/sim/push.c) on hand-checked cases: 4 chunks of
 * 1 MB at 8 Gb/s (1 ms each), no latency or overhead.  A chain of 3 is a
 * pipeline: (4 + 3 - 1) chunk times.  A star of 2 shares the root's NIC: 8
 * chunk times for the last child, 7 for the first.  With a 1 ms latency and a
 * window of 1, a chunk starts when the previous one's ack is back (3 ms
 * apart) and lands 2 ms after its start: 3 x 3 + 2 = 11 ms. */
static void test_sim_push_model(void **state)
{
    sim_push_config c = {.replicas = 3, .zones = 1, .fanout = 1, .payload = 4000000, .chunk = 1000000,
                         .window = 64, .fabric = {8, 0}, .zone = {8, 0}, .cross = {8, 0}};
    sim_push_result r;
    TU_OK(sim_push_run(&c, &r));
    assert_int_equal(r.nchunks, 4);
    assert_int_equal(r.depth, 3);
    assert_true(fabs(r.converge_s - 6e-3) < 1e-9);
    assert_true(fabs(r.first_s - 4e-3) < 1e-9);
    c.replicas = 2, c.fanout = 2;
    TU_OK(sim_push_run(&c, &r));
    assert_true(fabs(r.converge_s - 8e-3) < 1e-9);
    assert_true(fabs(r.first_s - 7e-3) < 1e-9);
    c.replicas = 1, c.window = 1, c.zone.latency_s = 1e-3;
    TU_OK(sim_push_run(&c, &r));
    assert_true(fabs(r.converge_s - 11e-3) < 1e-9);
    /* Zones: one copy crosses into each other zone. */
    c = (sim_push_config){.replicas = 64, .zones = 4, .payload = 1 << 30, .fabric = {400, 5e-6},
                          .zone = {100, 50e-6}, .cross = {25, 1e-3}};
    TU_OK(sim_push_run(&c, &r));
    assert_int_equal(r.cross_zone_copies, 3);
    assert_true(r.converge_s > (1 << 30) / (25e9 / 8) && r.converge_s < 3.0 * (1 << 30) / (25e9 / 8));
    /* Bad input names the field. */
    c.zones = 65;
    TU_ERR(sim_push_run(&c, &r), SH_EINVAL, "zones");
    c.zones = 4, c.cross.gbps = 0;
    TU_ERR(sim_push_run(&c, &r), SH_EINVAL, "cross-zone link");
    /* sqrt(50e6 x 20e-6 x 125e6 / 16) = 88388, rounded down to 4 KiB */
    assert_int_equal(sim_push_chunk_auto(50000000, 16, 1, 20e-6), 86016);
    uint64_t k = sim_push_chunk_auto(717000000000ull, 4, 400, 20e-6);
    assert_true(k <= (64ull << 20) && k >= (1 << 20));
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_tree_converges, teardown),
        cmocka_unit_test_teardown(test_corrupt_chunk_refetched, teardown),
        cmocka_unit_test_teardown(test_secret_required, teardown),
        cmocka_unit_test_teardown(test_delta_pushed, teardown),
        cmocka_unit_test_teardown(test_relay_killed, teardown),
        cmocka_unit_test_teardown(test_zones, teardown),
        cmocka_unit_test_teardown(test_store_fallback, teardown),
        cmocka_unit_test_teardown(test_late_joiner_squash, teardown),
        cmocka_unit_test_teardown(test_joiner_activates_newest, teardown),
        cmocka_unit_test_teardown(test_delta_across_anchor, teardown),
        cmocka_unit_test_teardown(test_bad_usage, teardown),
        cmocka_unit_test(test_sim_push_model),
    };
    return cmocka_run_group_tests_name("bcast", tests, NULL, NULL);
}
