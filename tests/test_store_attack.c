/* The weight path attacked from outside: the store, replicas and the push
 * tree driven through the command line as a user or a hostile peer would,
 * with inputs the other tests never used.  Each test failed before the fix
 * it names (docs/security.md, "The weight path under attack"). */
#include "testutil.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shoal/ckpt.h"
#include "shoal/store.h"

static char *g_out;

/* Runs a shoal command line (after the binary) and returns its status; its
 * output is in g_out until the next call. */
static int shoal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int shoal(const char *fmt, ...)
{
    char args[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    free(g_out);
    g_out = NULL;
    return tu_run(&g_out, "%s %s", tu_shoal(), args);
}

static void want_out(const char *needle)
{
    if (!strstr(g_out ? g_out : "", needle)) fail_msg("output lacks \"%s\":\n%s", needle, g_out);
}

/* Versions 1 (anchor) and 2 (a delta) of run main in store `name`, from
 * synthetic checkpoints v1.st and v2.st. */
static void two_versions(const char *name)
{
    sh_rm_rf(tu_path(name));
    if (!sh_path_exists(tu_path("v1.st"))) {
        TU_OK(ckpt_synth(tu_path("v1.st"), 300000, 21));
        TU_OK(ckpt_step(tu_path("v1.st"), tu_path("v2.st"), 1e-3, 1, 2));
        TU_OK(ckpt_step(tu_path("v2.st"), tu_path("v3.st"), 1e-3, 1, 3));
    }
    assert_int_equal(shoal("store publish %s %s", tu_path(name), tu_path("v1.st")), 0);
    assert_int_equal(shoal("store publish %s %s", tu_path(name), tu_path("v2.st")), 0);
    want_out("version 2: delta");
}

static void write_text(const char *path, const char *text) { tu_write_file(path, text, strlen(text)); }

/* gc removes every version folder above LATEST (a crashed publish's
 * leftover), and a publish renames its folder into versions/ before it
 * moves LATEST.  gc did not take the run's lock, so a gc between those two
 * steps deleted the version LATEST was about to name: every reader and the
 * next publish then failed on "LATEST names version 2, but ... is
 * missing".  Here the test is the publisher, frozen between the two steps
 * with the lock held; `shoal store gc` must wait for it. */
static void test_gc_waits_for_publish(void **state)
{
    two_versions("gcp");
    /* Version 2 is in versions/, LATEST still names 1: mid-commit. */
    write_text(tu_path("gcp/main/LATEST"), "{\"format\":\"shoal-latest/1\",\"run\":\"main\",\"version\":1}\n");
    int fd = open(tu_path("gcp/main/lock"), O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX), 0);
    unlink(tu_path("gc.rc"));
    assert_int_equal(tu_run(NULL, "(%s store gc %s --keep 1 > %s 2>&1; echo $? > %s) > /dev/null 2>&1 &", tu_shoal(),
                            tu_path("gcp"), tu_path("gc.log"), tu_path("gc.rc")),
                     0);
    usleep(700 * 1000);
    int gc_done_early = sh_path_exists(tu_path("gc.rc"));
    int v2_there = sh_path_exists(tu_path("gcp/main/versions/0000000002/manifest.json"));
    /* The publisher's last step, then it lets go. */
    write_text(tu_path("gcp/main/LATEST"), "{\"format\":\"shoal-latest/1\",\"run\":\"main\",\"version\":2}\n");
    close(fd);
    for (int i = 0; i < 200 && !sh_path_exists(tu_path("gc.rc")); i++) usleep(50 * 1000);
    assert_false(gc_done_early);
    assert_true(v2_there);
    size_t n;
    char *rc = (char *)tu_read_file(tu_path("gc.rc"), &n);
    assert_int_equal(atoi(rc), 0);
    free(rc);
    assert_int_equal(shoal("store verify %s", tu_path("gcp")), 0);
    want_out("2 version(s) checked, 0 bad");
    assert_int_equal(shoal("store ls %s", tu_path("gcp")), 0);
    want_out("<- LATEST");
}

/* A publish on a run whose chain readers cannot rebuild (a payload
 * removed, truncated or replaced; the anchor damaged in place) made a
 * delta that nobody could ever apply, and said "published ... delta".  It
 * now writes an anchor, which readers can use at once. */
static void test_publish_on_broken_chain(void **state)
{
    static const char *const damage[] = {
        "rm %s/main/versions/0000000001/anchor.safetensors",
        "truncate -s 100 %s/main/versions/0000000001/anchor.safetensors",
        "truncate -s 10 %s/main/versions/0000000002/delta.shd",
        "rm %s/main/versions/0000000002/delta.shd && ln -s /dev/zero %s/main/versions/0000000002/delta.shd",
        NULL};
    for (int i = 0; damage[i]; i++) {
        two_versions("brk");
        char cmd[8192];
        snprintf(cmd, sizeof cmd, damage[i], tu_path("brk"), tu_path("brk"));
        assert_int_equal(tu_run(NULL, "%s", cmd), 0);
        assert_int_equal(shoal("store publish %s %s", tu_path("brk"), tu_path("v3.st")), 0);
        want_out("version 3: anchor");
        sh_rm_rf(tu_path("brk3.st"));
        store *s;
        TU_OK(store_open(tu_path("brk"), NULL, 0, &s));
        TU_OK(store_materialize(s, 3, 0, NULL, tu_path("brk3.st")));
        store_close(s);
        tu_assert_same_file(tu_path("brk3.st"), tu_path("v3.st"));
    }
    /* Version 2 is an anchor damaged in place (same size): its bytes were
     * the next delta's base. */
    sh_rm_rf(tu_path("brk"));
    assert_int_equal(shoal("store publish %s %s --anchor-every 1", tu_path("brk"), tu_path("v1.st")), 0);
    assert_int_equal(shoal("store publish %s %s --anchor-every 1", tu_path("brk"), tu_path("v2.st")), 0);
    int fd = open(tu_path("brk/main/versions/0000000002/anchor.safetensors"), O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "\x5a\x5a", 2, 4096), 2);
    close(fd);
    assert_int_equal(shoal("store publish %s %s", tu_path("brk"), tu_path("v3.st")), 0);
    want_out("version 3: anchor");
    /* An intact chain still gets a delta. */
    assert_int_equal(shoal("store publish %s %s", tu_path("brk"), tu_path("v2.st")), 0);
    want_out("version 4: delta");
}

/* Counts lines holding `needle` in a file. */
static int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) n++;
    fclose(f);
    return n;
}

/* A replica following a store whose newest version cannot be built (here a
 * damaged delta; a full disk is the same) keeps serving what it has, and
 * retried at every poll: 50 full rebuilds and 50 warnings a second, for as
 * long as the version stayed.  It now pauses between tries (doubling to
 * 5 s), and still takes a newer version as soon as LATEST names one. */
static void test_replica_failed_build_backs_off(void **state)
{
    two_versions("rbo");
    /* The delta of version 2 damaged in place: same size, other bytes. */
    int fd = open(tu_path("rbo/main/versions/0000000002/delta.shd"), O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(pwrite(fd, "\xff\xff\xff\xff", 4, st.st_size / 2), 4);
    close(fd);
    /* The replica takes version 1 first (a store that held only it), then
     * LATEST names the damaged 2. */
    write_text(tu_path("rbo/main/LATEST"), "{\"format\":\"shoal-latest/1\",\"run\":\"main\",\"version\":1}\n");
    sh_rm_rf(tu_path("rbo-rep"));
    assert_int_equal(shoal("replica --dir %s --store %s --until 1 --seconds 20", tu_path("rbo-rep"),
                           tu_path("rbo")),
                     0);
    write_text(tu_path("rbo/main/LATEST"), "{\"format\":\"shoal-latest/1\",\"run\":\"main\",\"version\":2}\n");
    unlink(tu_path("rbo.log"));
    assert_int_equal(tu_run(NULL, "%s replica --dir %s --store %s --seconds 2.5 > %s 2>&1", tu_shoal(),
                            tu_path("rbo-rep"), tu_path("rbo"), tu_path("rbo.log")),
                     0);
    int warns = count_lines(tu_path("rbo.log"), "warn: replica");
    if (warns < 1 || warns > 6) {
        size_t n;
        char *log = (char *)tu_read_file(tu_path("rbo.log"), &n);
        fail_msg("%d failed builds in 2.5 s (expected 1..6):\n%.2000s", warns, log);
    }
    assert_int_equal(count_lines(tu_path("rbo-rep/ACTIVE"), "\"version\": 1\n"), 1);
    /* A good version 3 (an anchor) is taken at once, mid-pause: published
     * 3.3 s in, when the pause has grown to 1.6 s (tries at 0, 0.1, 0.3,
     * 0.7, 1.5, 3.1, then 6.3 s). */
    unlink(tu_path("rbo.log"));
    assert_int_equal(tu_run(NULL,
                            "(%s replica --dir %s --store %s --until 3 --seconds 20 > %s 2>&1; "
                            "date +%%s.%%N > %s) & sleep 3.3; date +%%s.%%N > %s; "
                            "%s store publish %s %s --anchor-every 1 > /dev/null; wait",
                            tu_shoal(), tu_path("rbo-rep"), tu_path("rbo"), tu_path("rbo.log"),
                            tu_path("rbo.end"), tu_path("rbo.pub"), tu_shoal(), tu_path("rbo"),
                            tu_path("v3.st")),
                     0);
    assert_int_equal(count_lines(tu_path("rbo.log"), "activated version 3"), 1);
    size_t n;
    char *a = (char *)tu_read_file(tu_path("rbo.pub"), &n), *b = (char *)tu_read_file(tu_path("rbo.end"), &n);
    double lag = atof(b) - atof(a);
    free(a), free(b);
    if (lag > 2.0) fail_msg("version 3 active %.2f s after its publish (expected < 2 s)", lag);
    tu_assert_same_file(tu_path("rbo-rep/models/0000000003.safetensors"), tu_path("v3.st"));
}

/* A push root restarted on its port, as its children know it, while a
 * connection its previous run closed first waits in TIME_WAIT (made here
 * by a listener that, like UCX's with the fix, sets SO_REUSEADDR): the
 * restart failed with "Device is busy" for a minute. */
static void test_push_root_restarts_on_its_port(void **state)
{
    two_versions("prt");
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    assert_int_equal(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &len), 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
    int a = accept(l, NULL, NULL);
    assert_true(a >= 0);
    close(a); /* the listening side closes first: its end waits in TIME_WAIT */
    usleep(100 * 1000);
    close(c);
    close(l);
    int port = ntohs(sa.sin_port);
    assert_int_equal(shoal("push serve --store %s --listen 127.0.0.1:%d --seconds 0.5", tu_path("prt"), port), 0);
    want_out("on 127.0.0.1:");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gc_waits_for_publish),
        cmocka_unit_test(test_publish_on_broken_chain),
        cmocka_unit_test(test_replica_failed_build_backs_off),
        cmocka_unit_test(test_push_root_restarts_on_its_port),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(g_out);
    return rc;
}
