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
#include <errno.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
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

/* A publish killed mid-way (kill -9, a crash, an OOM kill) leaves its
 * staging folder, up to a whole model for an anchor; only `store gc`
 * removed it, so a publisher restarted in a loop filled the disk.  The next
 * publish removes what dead publishers left, and leaves a live one's (a
 * Python publisher's tensors file, named <...>.<pid>, is one). */
static void test_publish_reclaims_dead_staging(void **state)
{
    two_versions("dst");
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char a[4096], b[4096], c[4096];
    snprintf(a, sizeof a, "%s/main/staging/0000000003.%ld", tu_path("dst"), (long)dead);
    snprintf(b, sizeof b, "%s/main/staging/tensors-7.%ld", tu_path("dst"), (long)dead);
    snprintf(c, sizeof c, "%s/main/staging/tensors-8.%ld", tu_path("dst"), (long)getpid());
    TU_OK(sh_mkdir_p(a, 0755));
    char payload[4200];
    snprintf(payload, sizeof payload, "%s/anchor.safetensors", a);
    tu_write_file(payload, "x", 1);
    tu_write_file(b, "x", 1);
    tu_write_file(c, "x", 1);
    assert_int_equal(shoal("store publish %s %s", tu_path("dst"), tu_path("v3.st")), 0);
    assert_false(sh_path_exists(a));
    assert_false(sh_path_exists(b));
    assert_true(sh_path_exists(c));
    assert_int_equal(shoal("store gc %s --keep 5", tu_path("dst")), 0);
    assert_true(sh_path_exists(c));
}

/* Reads the version DIR/ACTIVE names (0: none). */
static int active_of(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/ACTIVE", dir);
    json_t *j;
    if (sh_json_load_file(path, 1 << 16, &j) < 0) return 0;
    int v = (int)json_integer_value(json_object_get(j, "version"));
    json_decref(j);
    return v;
}

/* A push replica whose disk is full when a version arrives keeps serving
 * the one it has, and dropped the payload: the tree does not send a
 * version twice and every later delta needs it, so the replica stayed
 * behind until the next anchor, however soon the disk had room again.  It
 * now tries the version again (pausing up to 5 s) and takes it once there
 * is room.  The replica's folder is a small tmpfs (root only: skipped
 * elsewhere), filled by the test. */
static void test_push_replica_full_disk_recovers(void **state)
{
    char mnt[4096]; /* tu_path's buffers rotate */
    snprintf(mnt, sizeof mnt, "%s", tu_path("fullrep"));
    TU_OK(sh_mkdir_p(mnt, 0755));
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=8m") != 0) {
        fprintf(stderr, "cannot mount a tmpfs (%s): skipping\n", strerror(errno));
        skip();
    }
    sh_rm_rf(tu_path("fr"));
    two_versions("fr0"); /* for v1.st and v2.st */
    assert_int_equal(shoal("store publish %s %s", tu_path("fr"), tu_path("v1.st")), 0);
    char rep[4096], filler[4096];
    snprintf(rep, sizeof rep, "%s/rep", mnt);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    unlink(tu_path("fr.addr"));
    assert_int_equal(tu_run(NULL, "(%s push serve --store %s --addr-file %s --seconds 40 & echo $! > %s) "
                            "> /dev/null 2>&1", tu_shoal(), tu_path("fr"), tu_path("fr.addr"), tu_path("fr.pid")), 0);
    for (int i = 0; i < 100 && !sh_path_exists(tu_path("fr.addr")); i++) usleep(50 * 1000);
    size_t n;
    char *addr = (char *)tu_read_file(tu_path("fr.addr"), &n);
    addr[strcspn(addr, "\n")] = 0;
    assert_int_equal(tu_run(NULL, "(%s replica --dir %s --parent %s --until 2 --seconds 30 > %s 2>&1 &) "
                            "> /dev/null 2>&1", tu_shoal(), rep, addr, tu_path("fr.log")), 0);
    free(addr);
    for (int i = 0; i < 200 && active_of(rep) != 1; i++) usleep(50 * 1000);
    int v_before = active_of(rep);
    /* Fill the disk but for half a model: version 2's build cannot fit. */
    struct stat st;
    assert_int_equal(stat(tu_path("v2.st"), &st), 0);
    struct statvfs vfs;
    assert_int_equal(statvfs(mnt, &vfs), 0);
    uint64_t room = (uint64_t)vfs.f_bavail * vfs.f_frsize, keep = (uint64_t)st.st_size / 2;
    assert_true(room > keep);
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_int_equal(posix_fallocate(fd, 0, (off_t)(room - keep)), 0);
    close(fd);
    assert_int_equal(shoal("store publish %s %s", tu_path("fr"), tu_path("v2.st")), 0);
    for (int i = 0; i < 100 && count_lines(tu_path("fr.log"), "No space left") < 2; i++) usleep(50 * 1000);
    int failures = count_lines(tu_path("fr.log"), "No space left");
    int v_full = active_of(rep);
    unlink(filler); /* room again */
    for (int i = 0; i < 200 && active_of(rep) != 2; i++) usleep(50 * 1000);
    int v_after = active_of(rep);
    int tries = count_lines(tu_path("fr.log"), "No space left"); /* paused: a handful, not thousands */
    char *pid = (char *)tu_read_file(tu_path("fr.pid"), &n);
    kill((pid_t)atol(pid), SIGTERM);
    free(pid);
    for (int i = 0; i < 100 && tu_run(NULL, "fuser -s %s/rep/models 2>/dev/null", mnt) == 0; i++) usleep(50 * 1000);
    usleep(300 * 1000);
    umount2(mnt, MNT_DETACH);
    assert_int_equal(v_before, 1);
    assert_true(failures >= 1);
    assert_int_equal(v_full, 1);
    assert_int_equal(v_after, 2);
    if (tries > 20) fail_msg("%d tries of version 2 while the disk was full (expected a few)", tries);
}

/* A push root whose store holds a damaged payload hashed it again at every
 * poll, twice a second, and said so each time: for a damaged anchor, a
 * core spent re-reading the whole model for as long as it stayed.  It now
 * hashes it again only once the file changes, says so once, and offers
 * the version as soon as it is repaired. */
static void test_push_root_damaged_payload_once(void **state)
{
    two_versions("dmg");
    char anchor[4096];
    snprintf(anchor, sizeof anchor, "%s/main/versions/0000000001/anchor.safetensors", tu_path("dmg"));
    int fd = open(anchor, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "\x5a", 1, 3000), 1);
    close(fd);
    sh_rm_rf(tu_path("dmg-rep"));
    unlink(tu_path("dmg.addr"));
    assert_int_equal(tu_run(NULL,
                            "(%s push serve --store %s --addr-file %s --seconds 8 > %s 2>&1 &) > /dev/null 2>&1",
                            tu_shoal(), tu_path("dmg"), tu_path("dmg.addr"), tu_path("dmg.log")),
                     0);
    for (int i = 0; i < 100 && !sh_path_exists(tu_path("dmg.addr")); i++) usleep(50 * 1000);
    size_t n;
    char *addr = (char *)tu_read_file(tu_path("dmg.addr"), &n);
    addr[strcspn(addr, "\n")] = 0;
    assert_int_equal(tu_run(NULL, "(%s replica --dir %s --parent %s --until 2 --seconds 12 > %s 2>&1 &) "
                            "> /dev/null 2>&1", tu_shoal(), tu_path("dmg-rep"), addr, tu_path("dmg-rep.log")), 0);
    free(addr);
    sleep(3);
    int said = count_lines(tu_path("dmg.log"), "hashes to");
    int v_damaged = active_of(tu_path("dmg-rep"));
    /* Repaired in place (same inode, new bytes). */
    size_t len;
    uint8_t *good = tu_read_file(tu_path("v1.st"), &len);
    fd = open(anchor, O_WRONLY);
    assert_int_equal(pwrite(fd, good, len, 0), (ssize_t)len);
    close(fd);
    free(good);
    for (int i = 0; i < 160 && active_of(tu_path("dmg-rep")) != 2; i++) usleep(50 * 1000);
    assert_int_equal(said, 1);
    assert_int_equal(v_damaged, 0);
    assert_int_equal(active_of(tu_path("dmg-rep")), 2);
}

/* A safetensors file holding one BF16 tensor [2] named `name`. */
static void raw_ckpt(const char *path, const char *name)
{
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", name);
    while (n % 8) hdr[n++] = ' ';
    uint8_t buf[600] = {0};
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, hdr, (size_t)n);
    tu_write_file(path, buf, 8 + (size_t)n + 4);
}

/* Tensor names are printed (inspect, every error naming a tensor): a
 * checkpoint from elsewhere whose names hold escape sequences set the
 * terminal's title and cleared its screen on `shoal ckpt inspect
 * --tensors`, and was published and served.  Such a file is refused with
 * a message that does not print the name's control bytes. */
static void test_tensor_name_escapes(void **state)
{
    static const char *const names[] = {"\\u001b]0;pwned\\u0007\\u001b[2J", "w\\u009b31m", "a\\u007f",
                                        "tab\\there", NULL};
    for (int i = 0; names[i]; i++) {
        raw_ckpt(tu_path("esc.safetensors"), names[i]);
        assert_int_equal(shoal("ckpt inspect %s --tensors", tu_path("esc.safetensors")), 1);
        want_out("holds a control character");
        for (const char *p = g_out; *p; p++)
            if ((unsigned char)*p < 0x20 && *p != '\n') fail_msg("control byte 0x%02x in: %s", *p, g_out);
        sh_rm_rf(tu_path("esc-store"));
        assert_int_equal(shoal("store publish %s %s", tu_path("esc-store"), tu_path("esc.safetensors")), 1);
        want_out("tensor names must be printable");
    }
    /* Printable Unicode stays a name like any other. */
    raw_ckpt(tu_path("ok.safetensors"), "model.\u00e9\u00e8.w\u00fc");
    assert_int_equal(shoal("ckpt inspect %s --tensors", tu_path("ok.safetensors")), 0);
    /* A folder's index naming a tensor with escapes is refused too. */
    TU_OK(sh_mkdir_p(tu_path("escdir"), 0755));
    raw_ckpt(tu_path("escdir/s1.safetensors"), "w");
    const char *index = "{\"weight_map\":{\"w\":\"s1.safetensors\",\"\\u001b[2J\":\"s1.safetensors\"}}";
    tu_write_file(tu_path("escdir/model.safetensors.index.json"), index, strlen(index));
    assert_int_equal(shoal("ckpt inspect %s", tu_path("escdir")), 1);
    want_out("weight_map holds a name or file with a control character");
    assert_null(strchr(g_out, 0x1b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gc_waits_for_publish),
        cmocka_unit_test(test_publish_on_broken_chain),
        cmocka_unit_test(test_replica_failed_build_backs_off),
        cmocka_unit_test(test_push_root_restarts_on_its_port),
        cmocka_unit_test(test_tensor_name_escapes),
        cmocka_unit_test(test_publish_reclaims_dead_staging),
        cmocka_unit_test(test_push_replica_full_disk_recovers),
        cmocka_unit_test(test_push_root_damaged_payload_once),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(g_out);
    return rc;
}
