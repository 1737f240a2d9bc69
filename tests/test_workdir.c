/* Code goes with the job: `shoal submit --workdir DIR` packs DIR, the
 * server keeps the archive under the tenant's id, and every rank finds it
 * unpacked in its work dir.  The unpacker runs on a tenant's bytes in the
 * agent, so it is given hostile archives built here by hand: paths out of
 * the tree, links out of it, writes through a link, devices, hard links,
 * setuid bits, bad checksums, cut archives. */
#include "fleet_util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One ustar entry (header + data), as a hostile sender would write it. */
static void entry(sh_buf *b, const char *name, char type, unsigned mode, const char *data, const char *link)
{
    uint8_t h[512] = {0};
    size_t n = data ? strlen(data) : 0;
    memcpy(h, name, strlen(name) < 100 ? strlen(name) : 100);
    snprintf((char *)h + 100, 8, "%07o", mode);
    snprintf((char *)h + 124, 12, "%011o", (unsigned)n);
    h[156] = (uint8_t)type;
    if (link) memcpy(h + 157, link, strlen(link));
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    sh_buf_append(b, h, 512);
    uint8_t pad[512] = {0};
    if (n) sh_buf_append(b, data, n), sh_buf_append(b, pad, (512 - n % 512) % 512);
}

static void finish(sh_buf *b)
{
    uint8_t z[1024] = {0};
    sh_buf_append(b, z, sizeof z);
}

/* Unpacks b into a fresh directory; returns the code, *dir its path. */
static int unpack(sh_buf *b, const char *name, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s", tu_path(name));
    sh_rm_rf(dir);
    sh_mkdir_p(dir, 0755);
    int rc = sh_tar_unpack(b->data, b->len, dir, 1 << 20, getuid());
    sh_buf_free(b);
    return rc;
}

static void expect_refused(sh_buf *b, const char *name, const char *needle)
{
    char dir[4200];
    int rc = unpack(b, name, dir, sizeof dir);
    if (rc >= 0 || !strstr(sh_errmsg(), needle))
        fail_msg("%s: rc %d, message \"%s\" lacks \"%s\"", name, rc, sh_errmsg(), needle);
}

static void test_hostile_archives(void **state)
{
    (void)state;
    sh_buf b = {0};
    /* Outside the tree, by name. */
    entry(&b, "../escape.txt", '0', 0644, "x", NULL), finish(&b);
    expect_refused(&b, "h-dotdot", "is not a plain relative path");
    entry(&b, "/tmp/abs.txt", '0', 0644, "x", NULL), finish(&b);
    expect_refused(&b, "h-abs", "is not a plain relative path");
    entry(&b, "a/./b", '0', 0644, "x", NULL), finish(&b);
    expect_refused(&b, "h-dot", "is not a plain relative path");
    /* Links out of the tree. */
    entry(&b, "etc", '2', 0777, NULL, "/etc"), finish(&b);
    expect_refused(&b, "h-link-abs", "points outside the work dir");
    entry(&b, "sub/up", '2', 0777, NULL, "../../x"), finish(&b);
    expect_refused(&b, "h-link-up", "points outside the work dir");
    /* A write through a link: "l" links to "d" (inside), then "l/f" would
     * land in d; the file is made first, as a real directory "l", and the
     * link then collides with it. */
    entry(&b, "d/", '5', 0755, NULL, NULL);
    entry(&b, "l", '2', 0777, NULL, "d");
    entry(&b, "l/f", '0', 0644, "through", NULL), finish(&b);
    char dir[4200], p[4300];
    int rc = unpack(&b, "h-through", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/d/f", dir);
    if (rc >= 0 || !strstr(sh_errmsg(), "appears twice") || access(p, F_OK) == 0)
        fail_msg("a write through a link: rc %d, %s; d/f %s", rc, sh_errmsg(), access(p, F_OK) ? "absent" : "written");
    /* Devices, fifos, hard links. */
    entry(&b, "null", '3', 0666, NULL, NULL), finish(&b);
    expect_refused(&b, "h-dev", "has type '3'");
    entry(&b, "fifo", '6', 0666, NULL, NULL), finish(&b);
    expect_refused(&b, "h-fifo", "has type '6'");
    entry(&b, "hard", '1', 0644, NULL, "/etc/shadow"), finish(&b);
    expect_refused(&b, "h-hard", "has type '1'");
    /* Duplicates, bad checksums, cut archives, no end marker, too much. */
    entry(&b, "f", '0', 0644, "1", NULL), entry(&b, "f", '0', 0644, "2", NULL), finish(&b);
    expect_refused(&b, "h-dup", "appears twice");
    entry(&b, "f", '0', 0644, "1", NULL), finish(&b);
    b.data[0] ^= 1;
    expect_refused(&b, "h-sum", "checksum fails");
    entry(&b, "f", '0', 0644, "hello", NULL);
    b.len -= 100;
    expect_refused(&b, "h-cut", "the archive ends first");
    entry(&b, "f", '0', 0644, "hello", NULL);
    expect_refused(&b, "h-noend", "cut short");
    char *big = malloc(1100000);
    memset(big, 'a', 1100000 - 1), big[1100000 - 1] = 0;
    entry(&b, "big", '0', 0644, big, NULL), finish(&b);
    free(big);
    expect_refused(&b, "h-big", "holds more than");
    /* Setuid and world-writable bits are dropped; an executable keeps x. */
    entry(&b, "bin/", '5', 0777, NULL, NULL);
    entry(&b, "bin/suid", '0', 06777, "#!/bin/sh\n", NULL);
    entry(&b, "bin/link", '2', 0777, NULL, "suid"), finish(&b);
    assert_int_equal(unpack(&b, "h-suid", dir, sizeof dir), 0);
    struct stat st;
    snprintf(p, sizeof p, "%s/bin/suid", dir);
    assert_int_equal(stat(p, &st), 0);
    if ((st.st_mode & 07777) != 0755) fail_msg("bin/suid: mode %o, want 755", (unsigned)(st.st_mode & 07777));
    snprintf(p, sizeof p, "%s/bin", dir);
    assert_int_equal(stat(p, &st), 0);
    if (st.st_mode & 002) fail_msg("bin: mode %o is world-writable", (unsigned)(st.st_mode & 07777));
    snprintf(p, sizeof p, "%s/bin/link", dir);
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
}

/* What the packer refuses, with the path named. */
static void test_pack_refusals(void **state)
{
    (void)state;
    const char *d = tu_path("pk");
    char p[4300];
    sh_rm_rf(d);
    sh_mkdir_p(d, 0755);
    snprintf(p, sizeof p, "%s/sub", d);
    sh_mkdir_p(p, 0755);
    snprintf(p, sizeof p, "%s/sub/a.py", d);
    tu_write_file(p, "print(1)\n", 9);
    snprintf(p, sizeof p, "%s/sub/in", d);
    assert_int_equal(symlink("a.py", p), 0);
    sh_buf b = {0};
    assert_int_equal(sh_tar_pack(d, 1 << 20, &b), 0);
    char dir[4200];
    assert_int_equal(unpack(&b, "pk-out", dir, sizeof dir), 0); /* round trip */
    snprintf(p, sizeof p, "%s/sub/in", dir);
    char *text = (char *)tu_read_file(p, NULL);
    assert_string_equal(text, "print(1)\n");
    free(text);
    assert_true(sh_tar_pack(tu_path("no-such-dir"), 1 << 20, &b) < 0);
    if (!strstr(sh_errmsg(), "no-such-dir")) fail_msg("missing dir: %s", sh_errmsg());
    sh_buf_free(&b);
    snprintf(p, sizeof p, "%s/sub/out", d);
    assert_int_equal(symlink("../../elsewhere", p), 0);
    assert_true(sh_tar_pack(d, 1 << 20, &b) < 0);
    if (!strstr(sh_errmsg(), "sub/out: a symbolic link to \"../../elsewhere\", outside the work dir"))
        fail_msg("link out: %s", sh_errmsg());
    sh_buf_free(&b);
    unlink(p);
    snprintf(p, sizeof p, "%s/fifo", d);
    assert_int_equal(mkfifo(p, 0644), 0);
    assert_true(sh_tar_pack(d, 1 << 20, &b) < 0);
    if (!strstr(sh_errmsg(), "fifo: not a regular file")) fail_msg("fifo: %s", sh_errmsg());
    sh_buf_free(&b);
    unlink(p);
    assert_true(sh_tar_pack(d, 2048, &b) < 0);
    if (!strstr(sh_errmsg(), "over the limit")) fail_msg("limit: %s", sh_errmsg());
    sh_buf_free(&b);
}

static tf_fleet F;

static void expect(int status, const char *needle, const char *token, const char *fmt, const char *a1, const char *a2)
{
    char args[8192], *out;
    snprintf(args, sizeof args, fmt, a1, a2);
    int rc = tu_run(&out, "%s %s --server %s --token %s 2>&1", tu_shoal(), args, F.url, token);
    if (rc != status || !strstr(out, needle))
        fail_msg("shoal %s: exit %d (want %d), output lacks \"%s\":\n%s", args, rc, status, needle, out);
    free(out);
}

static void test_submit_workdir(void **state)
{
    (void)state;
    memset(&F, 0, sizeof F);
    tf_start_server(&F, "wd", 30);
    tf_start_agents(&F, 2, "H100", 1, "z1", "ib");
    char code[4200], p[4300];
    snprintf(code, sizeof code, "%s", tu_path("code"));
    sh_rm_rf(code);
    snprintf(p, sizeof p, "%s/pkg", code);
    sh_mkdir_p(p, 0755);
    snprintf(p, sizeof p, "%s/train.sh", code);
    const char *script = "echo \"rank $SHOAL_RANK in $(pwd | sed 's|.*/||') reads $(cat pkg/data.txt);"
                         " PET_REDIRECTS=$PET_REDIRECTS PET_TEE=$PET_TEE\"\n";
    tu_write_file(p, script, strlen(script));
    snprintf(p, sizeof p, "%s/pkg/data.txt", code);
    tu_write_file(p, "shipped-data", 12);
    /* A gang with --workdir: both ranks run the shipped script. */
    const char *job = "{\"name\":\"wd\",\"nodes\":2,\"gpus_per_node\":1,\"command\":[\"sh\",\"train.sh\"]}";
    tu_write_file(tu_path("wd.json"), job, strlen(job));
    expect(0, "job 1 succeeded", TF_ALICE, "submit %s --workdir %s --wait", tu_path("wd.json"), code);
    expect(0, "[rank 1] rank 1 in ", TF_ALICE, "logs 1 --rank all%s%s", "", "");
    expect(0, "reads shipped-data; PET_REDIRECTS=1 PET_TEE=1", TF_ALICE, "logs 1 --rank 1%s%s", "", "");
    /* The "workdir" field, relative to the job file. */
    const char *rel = "{\"name\":\"wd2\",\"kind\":\"function\",\"workdir\":\"code\",\"command\":[\"cat\",\"pkg/data.txt\"]}";
    tu_write_file(tu_path("wd2.json"), rel, strlen(rel));
    expect(0, "job 2 succeeded", TF_ALICE, "submit %s --wait%s", tu_path("wd2.json"), "");
    expect(0, "shipped-data", TF_ALICE, "logs 2%s%s", "", "");
    /* Bad input: a missing directory, a link out, over the limit. */
    expect(1, "work dir /nonexistent-dir: no such directory", TF_ALICE, "submit %s --workdir %s", tu_path("wd.json"),
           "/nonexistent-dir");
    const char *miss = "{\"name\":\"m\",\"kind\":\"function\",\"workdir\":\"nope\",\"command\":[\"true\"]}";
    tu_write_file(tu_path("miss.json"), miss, strlen(miss));
    expect(1, "(the job file's \"workdir\", relative to the job file)", TF_ALICE, "submit %s%s", tu_path("miss.json"), "");
    expect(1, "over the limit", TF_ALICE, "submit %s --workdir-limit 1K --workdir %s", tu_path("wd.json"), code);
    expect(2, "--workdir-limit: expected a size of at least 1K", TF_ALICE, "submit %s --workdir-limit 10 --workdir %s",
           tu_path("wd.json"), code);
    snprintf(p, sizeof p, "%s/pkg/passwd", code);
    assert_int_equal(symlink("/etc/passwd", p), 0);
    expect(1, "a symbolic link to \"/etc/passwd\", outside the work dir", TF_ALICE, "submit %s --workdir %s",
           tu_path("wd.json"), code);
    unlink(p);
    /* Another tenant cannot run alice's archive by its id. */
    int status = 0;
    json_t *j = tf_call(&F, TF_ADMIN, "GET", "/v1/jobs/2", NULL, &status);
    const char *id = json_string_value(json_object_get(json_object_get(j, "spec"), "workdir"));
    assert_non_null(id);
    char stolen[512];
    snprintf(stolen, sizeof stolen, "{\"name\":\"s\",\"kind\":\"function\",\"workdir\":\"%s\",\"command\":[\"true\"]}", id);
    json_decref(j);
    json_decref(tf_call(&F, TF_BOB, "POST", "/v1/jobs", stolen, &status));
    assert_int_equal(status, 400);
    tu_write_file(tu_path("stolen.json"), stolen, strlen(stolen));
    expect(1, "tenant bob uploaded no work dir", TF_BOB, "submit %s%s", tu_path("stolen.json"), "");
    expect(0, "submitted job", TF_ALICE, "submit %s%s", tu_path("stolen.json"), ""); /* alice's own: fine */
    /* A raw upload is the tenant's only: no token, no upload; an agent
     * credential cannot fetch a job it runs no rank of. */
    json_decref(tf_call(&F, NULL, "POST", "/v1/workdirs", "x", &status));
    assert_int_equal(status, 401);
    json_decref(tf_call(&F, TF_ALICE, "GET", "/v1/agent/workdir?job=1", NULL, &status));
    assert_int_equal(status, 403);
    tf_stop(&F);
}

/* Uploads an archive of one file of `size` bytes of byte `fill`; returns the
 * HTTP status and the id (when 201). */
static int upload(int size, char fill, char *id)
{
    char d[4200], p[4300];
    snprintf(d, sizeof d, "%s", tu_path("up"));
    sh_rm_rf(d);
    sh_mkdir_p(d, 0755);
    char *data = malloc((size_t)size);
    memset(data, fill, (size_t)size);
    snprintf(p, sizeof p, "%s/f", d);
    tu_write_file(p, data, (size_t)size);
    free(data);
    sh_buf b = {0};
    assert_int_equal(sh_tar_pack(d, 1 << 20, &b), 0);
    client_conn *c;
    assert_int_equal(client_new(F.url, TF_ALICE, &c), 0);
    int status = 0;
    char *reply = NULL;
    size_t len = 0;
    assert_int_equal(client_raw(c, "POST", "/v1/workdirs", (char *)b.data, b.len, NULL, 30, &status, &reply, &len), 0);
    json_t *j = json_loadb(reply, len, 0, NULL);
    if (status == 201) snprintf(id, 33, "%s", json_string_value(json_object_get(j, "workdir")));
    else snprintf(id, 33, "%s", "");
    if (status != 201 && status != 413 && status != 429) fail_msg("upload: HTTP %d: %s", status, reply);
    json_decref(j);
    free(reply);
    client_free(c);
    sh_buf_free(&b);
    return status;
}

static int64_t run_with(const char *id, const char *cmd)
{
    char body[512];
    snprintf(body, sizeof body, "{\"name\":\"q\",\"kind\":\"function\",\"workdir\":\"%s\",\"command\":[\"sh\",\"-c\",\"%s\"]}",
             id, cmd);
    return tf_submit(&F, TF_ALICE, body);
}

/* The server's own limits: an archive over --workdir-max is 413; a
 * tenant's archives stay within --workdir-quota, the oldest that no active
 * job names making room, and 429 when those in use leave none. */
static void test_server_limits(void **state)
{
    (void)state;
    memset(&F, 0, sizeof F);
    snprintf(F.extra, sizeof F.extra, "--workdir-max 9000 --workdir-quota 20000");
    tf_start_server(&F, "wdq", 30);
    tf_start_agents(&F, 1, "H100", 4, "z1", "ib");
    char a1[33], a2[33], a3[33], a4[33], a5[33], big[33];
    assert_int_equal(upload(10000, 'x', big), 413);
    assert_int_equal(upload(6000, 'a', a1), 201);
    int64_t j1 = run_with(a1, "sleep 60");
    assert_int_equal(upload(6000, 'b', a2), 201);
    assert_int_equal(upload(6000, 'a', a5), 201); /* the same archive again: its id, no room needed */
    assert_string_equal(a5, a1);
    assert_int_equal(upload(6000, 'c', a3), 201);  /* a2, unused, made room */
    int st = 0;
    char body[256];
    snprintf(body, sizeof body, "{\"name\":\"x\",\"kind\":\"function\",\"workdir\":\"%s\",\"command\":[\"true\"]}", a2);
    json_decref(tf_call(&F, TF_ALICE, "POST", "/v1/jobs", body, &st));
    assert_int_equal(st, 400);
    int64_t j3 = run_with(a3, "sleep 60");
    assert_int_equal(upload(6000, 'd', a4), 429); /* a1 and a3 are in use */
    json_decref(tf_wait_job(&F, j1, "running", 30));
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", (long long)j1);
    json_decref(tf_call(&F, TF_ALICE, "POST", path, NULL, &st));
    assert_int_equal(upload(6000, 'd', a4), 201); /* a1's job ended: a1 made room */
    (void)j3;
    tf_stop(&F);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_archives),
        cmocka_unit_test(test_pack_refusals),
        cmocka_unit_test_teardown(test_submit_workdir, tf_teardown),
        cmocka_unit_test_teardown(test_server_limits, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
