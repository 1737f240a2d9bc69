/* Properties of the agent's isolation that the generated mutants
 * (scripts/mutgen.py, docs/testing.md) found no test held, each against a
 * real server and a real agent on loopback:
 *  - the seccomp filter has its rules: inside the sandbox every syscall of
 *    the denied list fails with EPERM (called with arguments that, without
 *    the filter, give another answer), and personality(0) still works;
 *  - every cgroup limit the agent computes is written to the member's
 *    groups: memory (and no swap on top), pids and CPU, from the node's
 *    share and lowered by the job's memory_mb and pids_max;
 *  - a "writable" folder is refused unless it is an existing directory
 *    named without symbolic links: each condition on its own;
 *  - the disk share, on work roots of small tmpfs file systems: an agent
 *    that is not root (no loop images: it measures) stops a rank over its
 *    share in bytes or in files and leaves one inside it alone, and hides
 *    the work root and the server's state from its ranks itself (bwrap's
 *    --tmpfs), also from one that names a folder there as "writable"; a
 *    root agent's second rank gets its share of what is left after the
 *    first rank's promise;
 *  - a tenant's open folder that others cannot reach (a folder above it is
 *    closed to them) works, also across mounts whose roots share an inode
 *    number. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fleet_util.h"
#include "control/agent/agent_int.h"

#include <glob.h>
#include <stdio.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <sys/statvfs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

static int64_t submit_sh(tf_fleet *f, const char *token, const char *name, int gpus, const char *extra,
                         const char *script)
{
    json_t *cmd = json_pack("[s,s,s]", "sh", "-c", script);
    char *c = json_dumps(cmd, JSON_COMPACT);
    json_decref(cmd);
    char body[16384];
    /* A function has one GPU; more make a gang of one node. */
    snprintf(body, sizeof body, "{\"name\":\"%s\",%s%d%s,\"command\":%s}", name,
             gpus == 1 ? "\"kind\":\"function\",\"gpus\":" : "\"kind\":\"gang\",\"nodes\":1,\"gpus_per_node\":", gpus,
             extra, c);
    free(c);
    return tf_submit(f, token, body);
}

/* The denied syscalls (src/agent/jail.c) by their x86-64 numbers, each
 * called with zero or -1 arguments: without the filter each gives
 * something other than EPERM (EFAULT, EBADF, EINVAL, ENOSYS or success);
 * with it, EPERM before the kernel looks at the arguments. */
#define PY_SYSCALLS                                                                                          \
    "import ctypes\n"                                                                                        \
    "l = ctypes.CDLL(None, use_errno=True)\n"                                                                \
    "l.syscall.restype = ctypes.c_long\n"                                                                    \
    "calls = [('setns', 308, -1, 0), ('personality', 135, 0x0040000), ('ptrace', 101, 0, 0, 0, 0),\n"        \
    "  ('process_vm_writev', 311, 0, 0, 0, 0, 0, 0), ('add_key', 248, 0, 0, 0, 0, 0),\n"                    \
    "  ('request_key', 249, 0, 0, 0, 0), ('keyctl', 250, 0, -2, 0), ('userfaultfd', 323, -1),\n"             \
    "  ('name_to_handle_at', 303, -1, 0, 0, 0, 0), ('clock_adjtime', 305, 0, 0), ('adjtimex', 159, 0),\n"   \
    "  ('chroot', 161, 0), ('open_tree', 428, -1, 0, 0), ('mount_setattr', 442, -1, 0, 0, 0, 0),\n"           \
    "  ('move_mount', 429, -1, 0, -1, 0, 0), ('fsconfig', 431, -1, 0, 0, 0, 0),\n"                             \
    "  ('fsmount', 432, -1, 0, 0), ('clock_settime', 227, 99, 0), ('settimeofday', 164, 0, 0),\n"           \
    "  ('quotactl', 179, 0, 0, 0, 0), ('perf_event_open', 298, 0, 0, 0, 0, 0), ('reboot', 169, 0, 0, 0, 0),\n" \
    "  ('syslog', 103, 10, 0, 0), ('uselib', 134, 0), ('lookup_dcookie', 212, 0, 0, 0),\n"                  \
    "  ('delete_module', 176, 0, 0), ('kexec_file_load', 320, -1, -1, 0, 0, 0)]\n"                            \
    "for c in calls:\n"                                                                                      \
    "    ctypes.set_errno(0)\n"                                                                              \
    "    r = l.syscall(*[ctypes.c_long(x) for x in c[1:]])\n"                                                \
    "    print('sys', c[0], r, ctypes.get_errno())\n"                                                        \
    "r = l.syscall(ctypes.c_long(135), ctypes.c_long(0xffffffff))\n"                                        \
    "print('persona-query', r, ctypes.get_errno())\n"                                                       \
    "ctypes.set_errno(0)\n"                                                                               \
    "print('persona-default', l.syscall(ctypes.c_long(135), ctypes.c_long(0)), ctypes.get_errno())\n"

static void test_seccomp_has_its_rules(void **state)
{
    struct utsname u;
    if (uname(&u) < 0 || strcmp(u.machine, "x86_64")) {
        print_message("the syscall numbers here are x86-64's; this is %s\n", u.machine);
        skip();
    }
    tf_fleet f = {0};
    snprintf(f.agent_extra, sizeof f.agent_extra, "--sandbox bwrap");
    tf_start_server(&f, "seccomp", 10);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    json_t *cmd = json_pack("[s,s,s]", "python3", "-c", PY_SYSCALLS);
    char *c = json_dumps(cmd, JSON_COMPACT);
    json_decref(cmd);
    char body[8192];
    snprintf(body, sizeof body, "{\"name\":\"sys\",\"kind\":\"function\",\"gpus\":1,\"command\":%s}", c);
    free(c);
    char *l = tf_wait_log(&f, tf_submit(&f, TF_BOB, body), 60, NULL);
    int n = 0;
    for (char *s = l; (s = strstr(s, "sys ")); s += 4) {
        char name[64];
        long r;
        int e;
        if (sscanf(s, "sys %63s %ld %d", name, &r, &e) != 3) fail_msg("cannot read \"%.80s\"", s);
        if (r != -1 || e != 1) fail_msg("%s inside the sandbox returned %ld (errno %d), not EPERM:\n%s", name, r, e, l);
        n++;
    }
    if (n != 27) fail_msg("%d syscalls reported, not 27:\n%s", n, l);
    if (!strstr(l, "persona-query -1 1")) fail_msg("personality(0xffffffff) was not refused:\n%s", l);
    if (!strstr(l, "persona-default 0 0")) fail_msg("personality(0), the default persona, was refused:\n%s", l);
    free(l);
    tf_stop(&f);
}

/* The agent's pid: its groups are named NODE.AGENTPID-JOB-ATTEMPT-RANK
 * (other tests on the host may run agents and jobs of the same numbers). */
static pid_t agent_pid;

/* One line of the member's cgroup file under root (group n0.PID-JOB-1-0). */
static int member_cg_read(const char *root, int64_t job, const char *file, char *out, size_t cap)
{
    char pat[600];
    snprintf(pat, sizeof pat, "%s/n0.%d-%lld-1-0/%s", root, (int)agent_pid, (long long)job, file);
    glob_t g;
    int rc = -1;
    out[0] = 0;
    if (glob(pat, 0, NULL, &g) == 0 && g.gl_pathc == 1) {
        FILE *fp = fopen(g.gl_pathv[0], "r");
        if (fp && fgets(out, (int)cap, fp)) {
            out[strcspn(out, "\n")] = 0;
            rc = 0;
        }
        if (fp) fclose(fp);
    }
    globfree(&g);
    return rc;
}

static void expect_cg(const char *root, int64_t job, const char *file, const char *want)
{
    char got[128];
    if (member_cg_read(root, job, file, got, sizeof got) < 0)
        fail_msg("job %lld: no %s/n0.%d-%lld-1-0/%s", (long long)job, root, (int)agent_pid, (long long)job, file);
    if (strcmp(got, want)) fail_msg("job %lld: %s is \"%s\", expected \"%s\"", (long long)job, file, got, want);
}

/* What the agent must write for a rank of `gpus` of the node's 16 GPUs,
 * with the job's memory_mb and pids_max (0: none). */
static void check_limits(int64_t job, int gpus, long long job_mem, long long job_pids, int v2)
{
    double share = gpus >= 16 ? 1.0 : (double)gpus / 16;
    long long total = (long long)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) >> 20;
    long long mem = (long long)(total * share), pids = (long long)(4096 * share);
    if (mem < 256) mem = 256;
    if (pids < 128) pids = 128;
    if (job_mem > 0 && job_mem < mem) mem = job_mem;
    if (job_pids > 0 && job_pids < pids) pids = job_pids;
    double ncpu = (double)sysconf(_SC_NPROCESSORS_ONLN);
    double cpus = ncpu * share < 1 ? 1 : ncpu * share;
    char v[64], swap[64];
    snprintf(v, sizeof v, "%lld", mem * 1024 * 1024);
    if (v2) {
        expect_cg("/sys/fs/cgroup/shoal", job, "memory.max", v);
        if (member_cg_read("/sys/fs/cgroup/shoal", job, "memory.swap.max", swap, sizeof swap) == 0)
            expect_cg("/sys/fs/cgroup/shoal", job, "memory.swap.max", "0");
        snprintf(v, sizeof v, "%lld", pids);
        expect_cg("/sys/fs/cgroup/shoal", job, "pids.max", v);
        snprintf(v, sizeof v, "%lld 100000", (long long)(cpus * 100000));
        expect_cg("/sys/fs/cgroup/shoal", job, "cpu.max", v);
    } else {
        expect_cg("/sys/fs/cgroup/memory/shoal", job, "memory.limit_in_bytes", v);
        if (member_cg_read("/sys/fs/cgroup/memory/shoal", job, "memory.memsw.limit_in_bytes", swap, sizeof swap) == 0)
            expect_cg("/sys/fs/cgroup/memory/shoal", job, "memory.memsw.limit_in_bytes", v);
        snprintf(v, sizeof v, "%lld", pids);
        expect_cg("/sys/fs/cgroup/pids/shoal", job, "pids.max", v);
        expect_cg("/sys/fs/cgroup/cpu/shoal", job, "cpu.cfs_period_us", "100000");
        snprintf(v, sizeof v, "%lld", (long long)(cpus * 100000));
        expect_cg("/sys/fs/cgroup/cpu/shoal", job, "cpu.cfs_quota_us", v);
    }
}

static void test_cgroup_limits_written(void **state)
{
    tf_fleet f = {0};
    tf_start_server(&f, "cglimits", 10);
    tf_start_agents(&f, 1, "H100", 16, "z", "ib");
    agent_pid = f.agents[0];
    int64_t whole = submit_sh(&f, TF_BOB, "quarter", 4, "", "sleep 30");
    int64_t low = submit_sh(&f, TF_BOB, "low", 1, ",\"memory_mb\":300,\"pids_max\":50", "sleep 30");
    json_decref(tf_wait_job(&f, whole, "running", 30));
    json_decref(tf_wait_job(&f, low, "running", 30));
    /* The groups are made at the launch, before the job reports running. */
    char probe[128];
    int v2 = -1;
    for (int i = 0; i < 100 && v2 < 0; i++, sh_sleep(0.05)) {
        if (member_cg_read("/sys/fs/cgroup/shoal", low, "pids.max", probe, sizeof probe) == 0) v2 = 1;
        else if (member_cg_read("/sys/fs/cgroup/pids/shoal", low, "pids.max", probe, sizeof probe) == 0) v2 = 0;
    }
    if (v2 < 0) {
        print_message("no pids cgroup for the rank on this host: nothing to check\n");
        tf_stop(&f);
        skip();
    }
    check_limits(whole, 4, 0, 0, v2);
    check_limits(low, 1, 300, 50, v2);
    /* And the rank's processes are in its groups (the limits hold them). */
    char pid[32];
    const char *roots[2][3] = {{"/sys/fs/cgroup/memory/shoal", "/sys/fs/cgroup/pids/shoal", "/sys/fs/cgroup/cpu/shoal"},
                               {"/sys/fs/cgroup/shoal", "/sys/fs/cgroup/shoal", "/sys/fs/cgroup/shoal"}};
    for (int k = 0; k < 3; k++)
        if (member_cg_read(roots[v2][k], low, "cgroup.procs", pid, sizeof pid) < 0 || atoi(pid) <= 0)
            fail_msg("job %lld: no process in its group under %s", (long long)low, roots[v2][k]);
    tf_stop(&f);
}

/* Each condition of the agent's check of a "writable" folder on its own,
 * on paths the server lets through (plain, under the allowed folder): a
 * missing directory, a regular file, a symbolic link to a directory, and a
 * directory reached through a linked parent.  The real directory next to
 * them works. */
static void test_writable_each_condition(void **state)
{
    char base[4200], ok[4300], file[4300], link[4300], via[4300], missing[4300];
    snprintf(base, sizeof base, "%s/wpaths", tu_tmpdir());
    sh_rm_rf(base);
    snprintf(ok, sizeof ok, "%s/real", base);
    TU_OK(sh_mkdir_p(ok, 0777));
    chmod(ok, 0777);
    snprintf(file, sizeof file, "%s/file", base);
    tu_write_file(file, "x", 1);
    snprintf(link, sizeof link, "%s/link", base);
    assert_int_equal(symlink(ok, link), 0);
    snprintf(via, sizeof via, "%s/link/sub", base);
    char sub[4400];
    snprintf(sub, sizeof sub, "%s/sub", ok);
    TU_OK(sh_mkdir_p(sub, 0777));
    snprintf(missing, sizeof missing, "%s/missing", base);
    tf_fleet f = {0};
    snprintf(f.agent_extra, sizeof f.agent_extra, "--sandbox bwrap");
    tf_start_server(&f, "wprops", 10);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    const char *bad[] = {missing, file, link, via};
    int64_t ids[4];
    char extra[4400];
    for (int i = 0; i < 4; i++) {
        snprintf(extra, sizeof extra, ",\"writable\":[\"%s\"]", bad[i]);
        ids[i] = submit_sh(&f, TF_BOB, "w", 1, extra, "echo ran-anyway");
    }
    snprintf(extra, sizeof extra, ",\"writable\":[\"%s\"]", ok);
    char script[4500];
    snprintf(script, sizeof script, "echo fine > %s/x && echo written", ok);
    int64_t good = submit_sh(&f, TF_BOB, "w", 1, extra, script);
    for (int i = 0; i < 4; i++) {
        char *l = tf_wait_log(&f, ids[i], 60, NULL);
        if (strstr(l, "ran-anyway") || !strstr(l, "not an existing directory named without symbolic links"))
            fail_msg("writable %s: the member ran, or without the reason:\n%s", bad[i], l);
        free(l);
    }
    char *l = tf_wait_log(&f, good, 60, NULL);
    if (!strstr(l, "written")) fail_msg("writable %s (a real directory): %s", ok, l);
    free(l);
    tf_stop(&f);
}

/* A PATH entry so long that "DIR/bwrap" does not fit the agent's buffer
 * (4096 bytes with its NUL) is skipped whole, never cut to another name:
 * "DIR/bwra" here, which exists and lies under the world-writable /tmp.
 * The next entry's bwrap is the one found. */
static void test_find_tool_long_path_entry(void **state)
{
    char dir[4200], tool[4300];
    snprintf(dir, sizeof dir, "%s/toolpath", tu_tmpdir());
    sh_rm_rf(dir);
    TU_OK(sh_mkdir_p(dir, 0755));
    while (strlen(dir) < 4090) {
        size_t n = strlen(dir), add = 4090 - n - 1 > 200 ? 200 : 4090 - n - 1;
        dir[n] = '/';
        memset(dir + n + 1, 'd', add);
        dir[n + 1 + add] = 0;
        if (mkdir(dir, 0755) < 0) fail_msg("mkdir %s: %s", dir, strerror(errno));
    }
    assert_int_equal(strlen(dir) + strlen("/bwrap"), 4096);
    snprintf(tool, sizeof tool, "%s/bwra", dir);
    int fd = open(tool, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    if (fd < 0 || write(fd, "#!/bin/sh\nexit 0\n", 17) != 17) fail_msg("write %s: %s", tool, strerror(errno));
    close(fd);
    char *old = getenv("PATH") ? strdup(getenv("PATH")) : NULL, path[4400], out[4096];
    snprintf(path, sizeof path, "%s:/usr/sbin:/usr/bin:/sbin:/bin", dir);
    setenv("PATH", path, 1);
    int rc = agent__find_tool("bwrap", out, sizeof out);
    const char *msg = rc < 0 ? sh_errmsg() : "";
    if (old) setenv("PATH", old, 1), free(old);
    if (rc == SH_ENOENT) skip(); /* no bwrap on this host */
    if (rc < 0 || !strncmp(out, tu_tmpdir(), strlen(tu_tmpdir())) || strcmp(out + strlen(out) - 6, "/bwrap"))
        fail_msg("bwrap after a PATH entry of 4090 bytes: %d %s %s", rc, msg, rc < 0 ? "" : out);
    sh_rm_rf(tu_path("toolpath"));
}

/* What the agent announces of the cgroup controllers, on a cgroup file
 * system made to look like a host's (in a mount namespace of a child, so
 * nothing of the host changes): a unified (v2) hierarchy whose
 * cgroup.subtree_control enables memory and pids, and a read-only v1 "cpu"
 * hierarchy where the agent cannot make its group.  It must announce the
 * first two as v2 and not announce cpu: a member never runs with less
 * isolation than its agent announced. */
static void test_cgroup_probe_announces_what_it_can_use(void **state)
{
    if (geteuid() != 0) {
        print_message("needs root (a mount namespace)\n");
        skip();
    }
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
        close(p[0]);
        char out[512] = "";
        const char *why = "";
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) why = "unshare";
        else if (mount("tmpfs", "/sys/fs/cgroup", "tmpfs", 0, "mode=0755") < 0) why = "mount tmpfs";
        else {
            int fd = open("/sys/fs/cgroup/cgroup.subtree_control", O_WRONLY | O_CREAT, 0644);
            if (fd < 0 || write(fd, "memory pids\n", 12) != 12) why = "subtree_control";
            if (fd >= 0) close(fd);
            if (!*why && (mkdir("/sys/fs/cgroup/cpu", 0755) < 0 ||
                          mount("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu", NULL, MS_BIND, NULL) < 0 ||
                          mount(NULL, "/sys/fs/cgroup/cpu", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0))
                why = "read-only cpu";
        }
        if (!*why && agent_probe_sandbox("bwrap", out, sizeof out) < 0) snprintf(out, sizeof out, "!%s", sh_errmsg());
        if (*why) snprintf(out, sizeof out, "?%s: %s", why, strerror(errno));
        ssize_t w = write(p[1], out, strlen(out) + 1);
        _exit(w > 0 ? 0 : 1);
    }
    close(p[1]);
    char got[512] = "";
    ssize_t n = read(p[0], got, sizeof got - 1);
    close(p[0]);
    waitpid(c, NULL, 0);
    if (n <= 0) fail_msg("the probing child said nothing");
    if (got[0] == '?') {
        print_message("cannot fake a cgroup file system here (%s)\n", got + 1);
        skip();
    }
    if (got[0] == '!') {
        print_message("no bwrap sandbox here (%s)\n", got + 1);
        skip();
    }
    const char *cg = strstr(got, "+cgroup(");
    if (!cg || strcmp(cg, "+cgroup(v2:memory,v2:pids)"))
        fail_msg("on a v2 hierarchy with memory and pids and a read-only v1 cpu: announced \"%s\", expected"
                 " \"...+cgroup(v2:memory,v2:pids)\"", got);
}

/* ---- the disk share, on small work file systems ----------------------------
 * Two agents of one server, each with its work root on a tmpfs of its own
 * (so that the node's free space, and the share of it, is known): n0 (8
 * "H100") runs as an unprivileged uid, so it has no loop images and
 * measures; n1 (8 "A100") runs as root and gives each rank an ext4 image
 * of its share.  Each file system has 640 or 768 MiB: 128 or 256 MiB
 * beyond the control plane's reserve (512 MiB).  A third, n2 (8 "L4"),
 * runs its ranks without a sandbox. */

#define NOBODY 65534

static char disk_root[2][4200], open_dir[4200], priv_dir[4200], nest_dir[4200];

static int disk_teardown(void **state)
{
    tf_kill_all();
    for (int i = 0; i < 2; i++)
        if (disk_root[i][0]) {
            umount2(disk_root[i], MNT_DETACH);
            rmdir(disk_root[i]);
            disk_root[i][0] = 0;
        }
    if (open_dir[0]) sh_rm_rf(open_dir), open_dir[0] = 0;
    if (priv_dir[0]) sh_rm_rf(priv_dir), priv_dir[0] = 0;
    if (nest_dir[0]) {
        char b[4300];
        snprintf(b, sizeof b, "%s/b", nest_dir);
        umount2(b, MNT_DETACH);
        umount2(nest_dir, MNT_DETACH);
        rmdir(nest_dir);
        nest_dir[0] = 0;
    }
    return 0;
}

static void disk_mount(int i, const char *path, const char *opts, uid_t owner)
{
    snprintf(disk_root[i], sizeof disk_root[i], "%s", path);
    sh_rm_rf(disk_root[i]);
    TU_OK(sh_mkdir_p(disk_root[i], 0700));
    if (mount("tmpfs", disk_root[i], "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
        fail_msg("mount a tmpfs (%s) on %s: %s", opts, disk_root[i], strerror(errno));
    assert_int_equal(chown(disk_root[i], owner, owner), 0);
    assert_int_equal(chmod(disk_root[i], 0700), 0);
}

/* The number after `key` in the log, or -1. */
static long long log_num(const char *log, const char *key)
{
    const char *p = strstr(log, key);
    return p ? atoll(p + strlen(key)) : -1;
}

#define FS_BYTES "python3 -c \"import os; s = os.statvfs('.'); print('fs-bytes', s.f_blocks * s.f_frsize)\""

static void test_disk_share_small_roots(void **state)
{
    if (geteuid() != 0) {
        print_message("needs root (tmpfs work roots, an agent of another uid)\n");
        skip();
    }
    tf_fleet f = {0};
    snprintf(f.agent_extra, sizeof f.agent_extra, "--sandbox bwrap");
    /* The work roots lie in /var/tmp: n0's uid must reach its own (the
     * test's folder may be closed), and n1's ranks must still see a folder
     * open to all beside it (the jail hides only what others cannot
     * enter).  The server's state (its ranks' logs) lies where n0's uid
     * cannot reach it, outside /tmp (as on another host): n0 has no reason
     * to hide it, and bwrap could not. */
    char n0root[200], n1root[200], visible[4300], state_dir[4300];
    snprintf(n0root, sizeof n0root, "/var/tmp/shoal-props-n0.%d", (int)getpid());
    disk_mount(0, n0root, "size=640m,nr_inodes=10000", NOBODY);
    snprintf(priv_dir, sizeof priv_dir, "/var/tmp/shoal-props-priv.%d", (int)getpid());
    TU_OK(sh_mkdir_p(priv_dir, 0700));
    snprintf(state_dir, sizeof state_dir, "%s/state", priv_dir);
    snprintf(nest_dir, sizeof nest_dir, "/var/tmp/shoal-props-nest.%d", (int)getpid());
    TU_OK(sh_mkdir_p(nest_dir, 0700));
    snprintf(f.extra, sizeof f.extra, "--allow-writable %s --allow-writable %s --state-dir %s", n0root, nest_dir,
             state_dir);
    tf_start_server(&f, "dshare", 10);
    snprintf(n1root, sizeof n1root, "/var/tmp/shoal-props-n1.%d", (int)getpid());
    snprintf(open_dir, sizeof open_dir, "/var/tmp/shoal-props-open.%d", (int)getpid());
    disk_mount(1, n1root, "size=768m", 0);
    TU_OK(sh_mkdir_p(open_dir, 0755));
    chmod(open_dir, 0755);
    snprintf(visible, sizeof visible, "%s/visible", open_dir);
    tu_write_file(visible, "open-to-all\n", 12);
    chmod(visible, 0644);
    /* What other ranks left in the work root, as n0's ranks
     * would find them without the masks. */
    char planted[4300];
    snprintf(planted, sizeof planted, "%s/s3cr3t", disk_root[0]);
    tu_write_file(planted, "top-secret-bytes\n", 17);
    assert_int_equal(chown(planted, NOBODY, NOBODY), 0);
    char victim[4300];
    snprintf(victim, sizeof victim, "%s/n0-99-1-0", disk_root[0]);
    TU_OK(sh_mkdir_p(victim, 0700));
    assert_int_equal(chown(victim, NOBODY, NOBODY), 0);
    f.agent_uid[0] = NOBODY;
    for (int i = 0; i < 2; i++) snprintf(f.agent_work[i], sizeof f.agent_work[i], "%s", disk_root[i]);
    tf_start_agent(&f, 0, "H100", 8, "z", "ib");
    tf_start_agent(&f, 1, "A100", 8, "z", "ib");
    /* n2 (8 "L4") runs its ranks without a sandbox: the guard is their
     * parent, and the agent execs the command itself. */
    snprintf(f.agent_extra, sizeof f.agent_extra, "--sandbox none");
    tf_start_agent(&f, 2, "L4", 8, "z", "ib");
    const char *l4 = ",\"gpu_types\":[\"L4\"]";
    int64_t sig = submit_sh(&f, TF_BOB, "sig", 1, l4, "kill -TERM $$");
    int64_t noexec = tf_submit(&f, TF_BOB, "{\"name\":\"noexec\",\"kind\":\"function\",\"gpus\":1,"
                                            "\"gpu_types\":[\"L4\"],\"command\":[\"/nonexistent/shoal-prog\"]}");
    const char *h100 = ",\"gpu_types\":[\"H100\"]", *a100 = ",\"gpu_types\":[\"A100\"]";
    /* n1: the first rank (half the node) holds its image while the
     * second starts. */
    int64_t first =
        submit_sh(&f, TF_ALICE, "first", 4, a100, FS_BYTES "; head -c 3145728 /dev/zero > w; exec sleep 60");
    /* n0: each of one GPU, so a share of 16 MiB and of ~1190 files. */
    char peek[9000];
    snprintf(peek, sizeof peek,
             "echo root:$(ls -A %s | tr '\\n' ' '):; echo state:$(ls -A %s | wc -l):; cat %s 2>/dev/null;"
             " echo peek-done", disk_root[0], state_dir, planted);
    int64_t look = submit_sh(&f, TF_BOB, "peek", 1, h100, peek);
    int64_t bytes = submit_sh(&f, TF_BOB, "bytes", 1, h100,
                              "head -c 50331648 /dev/zero > big && sleep 20 && echo survived-bytes");
    int64_t files = submit_sh(&f, TF_BOB, "files", 1, h100,
                              "python3 -c \"[open('f%d' % i, 'w').close() for i in range(1400)]\" && sleep 20 &&"
                              " echo survived-files");
    int64_t fine = submit_sh(&f, TF_ALICE, "fine", 1, h100,
                             "head -c 2097152 /dev/zero > f && python3 -c \"[open('g%d' % i, 'w').close() for i in"
                             " range(100)]\" && sleep 1.5 && echo within-share");
    /* Bob names a directory in n0's work root (as another rank's) as
     * "writable": with the agent's uid for every rank, only the agent's
     * refusal keeps him out. */
    char extra[4400];
    snprintf(extra, sizeof extra, "%s,\"writable\":[\"%s\"]", h100, victim);
    int64_t squat = submit_sh(&f, TF_BOB, "squat", 1, extra, "echo squatted");
    /* Bob's work dir is no archive at all (the server keeps uploads as they
     * come): the launch fails, and says it was the work dir. */
    char junk[2049], body[512];
    memset(junk, 'x', 2048), junk[2048] = 0;
    int st;
    json_t *up = tf_call(&f, TF_BOB, "POST", "/v1/workdirs", junk, &st);
    if (st != 201) fail_msg("upload of a work dir: HTTP %d", st);
    snprintf(body, sizeof body, "{\"name\":\"junk\",\"kind\":\"function\",\"gpus\":1,\"gpu_types\":[\"H100\"],"
                                "\"workdir\":\"%s\",\"command\":[\"echo\",\"unpacked\"]}",
             json_string_value(json_object_get(up, "workdir")));
    json_decref(up);
    int64_t junked = tf_submit(&f, TF_BOB, body);
    /* n1's second rank: its share of what the first one's image has not
     * yet taken of the free space. */
    json_decref(tf_wait_job(&f, first, "running", 30));
    long long a = -1;
    char *l;
    for (double until = sh_now_mono() + 20; a < 0 && sh_now_mono() < until; sh_sleep(0.05)) {
        l = tf_job_log(&f, first);
        a = log_num(l, "fs-bytes ");
        free(l);
    }
    char second_sh[4600];
    snprintf(second_sh, sizeof second_sh, FS_BYTES "; cat %s; echo uid=$(id -u)", visible);
    int64_t second = submit_sh(&f, TF_BOB, "second", 4, a100, second_sh);
    l = tf_wait_log(&f, look, 30, NULL);
    char want[200];
    snprintf(want, sizeof want, "root:n0-%lld-1-0 :", (long long)look);
    if (!strstr(l, want) || !strstr(l, "state:0:") || strstr(l, "top-secret") || !strstr(l, "peek-done"))
        fail_msg("a rank of the unprivileged agent sees into the work root %s or the server's state %s"
                 " (expected only \"%s\" and an empty state):\n%s", disk_root[0], state_dir, want, l);
    free(l);
    l = tf_wait_log(&f, squat, 30, NULL);
    if (strstr(l, "squatted") || !strstr(l, "which members may not see"))
        fail_msg("writable %s, in the work root of n0: the rank ran, or without the reason:\n%s", victim, l);
    free(l);
    l = tf_wait_log(&f, junked, 30, NULL);
    if (strstr(l, "unpacked") || !strstr(l, "cannot launch") || !strstr(l, ": work dir"))
        fail_msg("a work dir that is no archive: the rank ran, or the log does not name the work dir:\n%s", l);
    free(l);
    l = tf_wait_log(&f, bytes, 30, NULL);
    long long mib = log_num(l, "; limit ");
    if (strstr(l, "survived-bytes") || !strstr(l, "hit its disk limit (over the bytes") || mib < 14 || mib > 16)
        fail_msg("48 MiB in a share of 16 MiB (1/8 of the 128 MiB free beyond the reserve): not stopped, or not"
                 " for its bytes, or another limit:\n%s", l);
    free(l);
    l = tf_wait_log(&f, files, 30, NULL);
    long long nfiles = log_num(l, "MiB and ");
    if (strstr(l, "survived-files") || !strstr(l, "hit its disk limit (over the files") || nfiles < 1100 ||
        nfiles > 1250)
        fail_msg("1400 files in a share of ~1190 (1/8 of 10000 inodes less 5%%): not stopped, or not for its"
                 " files, or another limit:\n%s", l);
    free(l);
    l = tf_wait_log(&f, fine, 30, NULL);
    if (!strstr(l, "within-share") || strstr(l, "disk limit"))
        fail_msg("2 MiB and 100 files inside a share of 16 MiB and ~1190 files:\n%s", l);
    free(l);
    /* Its exit (status 0) reached the server as such. */
    json_decref(tf_wait_job(&f, fine, "succeeded", 5));
    /* On a file system that does not count inodes (f_files 0: btrfs, a
     * tmpfs without nr_inodes), the files share is of 2^24. */
    if (mount("tmpfs", disk_root[0], "tmpfs", MS_REMOUNT | MS_NOSUID | MS_NODEV, "size=640m,nr_inodes=0") < 0)
        fail_msg("remount %s without an inode count: %s", disk_root[0], strerror(errno));
    int64_t uncounted = submit_sh(&f, TF_BOB, "uncounted", 1, h100,
                                  "head -c 50331648 /dev/zero > big && sleep 20 && echo survived-uncounted");
    l = tf_wait_log(&f, second, 30, NULL);
    if (!strstr(l, "open-to-all"))
        fail_msg("a rank of n1 (work root %s) cannot read %s, open to all:\n%s", n1root, visible, l);
    long long b = log_num(l, "fs-bytes "), bob_uid = log_num(l, "uid=");
    long long beyond = 256ll << 20, slack = 4ll << 20;
    if (a > beyond / 2 || a < beyond / 2 - 16 * slack || b < 0 || b > (beyond - a) / 2 + slack)
        fail_msg("n1 (256 MiB free beyond its reserve): the first rank of half the node has %lld bytes, the second"
                 " %lld; expected at most %lld and then at most half of what is left (%lld):\n%s", a, b, beyond / 2,
                 (beyond - a) / 2 + slack, l);
    free(l);
    l = tf_wait_log(&f, uncounted, 30, NULL);
    if (strstr(l, "survived-uncounted") || log_num(l, "MiB and ") != (1 << 24) / 8)
        fail_msg("a rank of 1/8 of a node whose work root counts no inodes: not stopped, or a files share other"
                 " than 2^24 / 8:\n%s", l);
    free(l);
    /* n2: a rank killed by signal 15 ends with status 128 + 15; a command
     * that cannot be executed says why. */
    json_t *j = tf_wait_job(&f, sig, "failed", 30);
    json_int_t code = json_integer_value(json_object_get(json_array_get(json_object_get(j, "members"), 0), "exit_code"));
    json_decref(j);
    if (code != 143) fail_msg("a rank killed by SIGTERM (no sandbox) ended with status %lld, not 143", (long long)code);
    l = tf_wait_log(&f, noexec, 30, NULL);
    if (!strstr(l, "cannot run the command: No such file or directory"))
        fail_msg("a command that does not exist (no sandbox): the log does not say so:\n%s", l);
    free(l);
    /* Bob's folder is the root of a file system mounted in the root of
     * another (both tmpfs: the same inode number, 1, on two devices), whose
     * root only his group may pass (0710): others cannot reach it, though
     * it is open (0755), and it works. */
    char nb[4300], opts[128], nscript[4600], nextra[4500];
    snprintf(nb, sizeof nb, "%s/b", nest_dir);
    snprintf(opts, sizeof opts, "mode=0710,gid=%lld", bob_uid);
    if (bob_uid <= 0 || mount("tmpfs", nest_dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0 || mkdir(nb, 0755) < 0)
        fail_msg("nested folders in %s (bob's uid %lld): %s", nest_dir, bob_uid, strerror(errno));
    snprintf(opts, sizeof opts, "mode=0755,uid=%lld,gid=%lld", bob_uid, bob_uid);
    if (mount("tmpfs", nb, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) fail_msg("mount on %s: %s", nb, strerror(errno));
    snprintf(nextra, sizeof nextra, "%s,\"writable\":[\"%s\"]", a100, nb);
    snprintf(nscript, sizeof nscript, "echo in > %s/f && echo nested-ok", nb);
    int64_t nested = submit_sh(&f, TF_BOB, "nested", 4, nextra, nscript);
    /* What n1's first rank holds is what it wrote (3 MiB), not its file
     * system's own blocks (its root directory's, whatever the block size). */
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)first);
    json_int_t held = 0;
    for (double until = sh_now_mono() + 10; held < (3 << 20) && sh_now_mono() < until; sh_sleep(0.05)) {
        json_t *jj = tf_call(&f, TF_ADMIN, "GET", path, NULL, &st);
        held = json_integer_value(json_object_get(json_array_get(json_object_get(jj, "members"), 0), "disk_bytes"));
        json_decref(jj);
    }
    if (held < (3 << 20) || held >= (3 << 20) + 1024)
        fail_msg("n1's first rank wrote 3 MiB (in one extent) into its image; disk_bytes shows %lld", (long long)held);
    l = tf_wait_log(&f, nested, 30, NULL);
    if (!strstr(l, "nested-ok"))
        fail_msg("bob's folder %s (open, but closed to others above it, across two mounts): refused or broken:\n%s",
                 nb, l);
    free(l);
    /* The unprivileged agent said at its start that it measures. */
    char out[4300], *text = NULL;
    size_t len;
    snprintf(out, sizeof out, "%s/agent-0.out", f.dir);
    if (sh_read_file(out, 1 << 20, &text, &len) < 0 || !strstr(text, "work directories are measured every"))
        fail_msg("agent n0 (not root) does not say that it measures the work directories:\n%s", text ? text : "");
    free(text);
    tf_stop(&f);
}

/* A secret folder the jail cannot hide stops the rank before its command
 * runs: hiding the work root (a tmpfs over it) fails here, by a mount(2)
 * preloaded into the agent (tests/fault/mount.c), and the server's state
 * folder is hidden after it; the rank must not start with the work root,
 * and every other rank's work directory in it, in view. */
static void test_mask_failure_stops_the_rank(void **state)
{
    tf_fleet f = {0};
    snprintf(f.agent_extra, sizeof f.agent_extra, "--sandbox bwrap");
    tf_start_server(&f, "maskfail", 10);
    char so[4096], work[4200];
    if (!realpath("build/tests/fault_mount.so", so)) fail_msg("build/tests/fault_mount.so: %s (make builds it)", strerror(errno));
    /* The work root apart from the server's folder, so that both are
     * hidden, each by its own mount, the work root first. */
    snprintf(work, sizeof work, "/tmp/shoal-props-maskwork.%d", (int)getpid());
    TU_OK(sh_mkdir_p(work, 0755));
    snprintf(f.agent_work[0], sizeof f.agent_work[0], "%s", work);
    setenv("LD_PRELOAD", so, 1);
    setenv("SHOAL_FAULT_MOUNT", work, 1);
    setenv("ASAN_OPTIONS", "verify_asan_link_order=0:detect_leaks=0", 1);
    tf_start_agents(&f, 1, "H100", 8, "z", "ib");
    unsetenv("LD_PRELOAD");
    unsetenv("SHOAL_FAULT_MOUNT");
    unsetenv("ASAN_OPTIONS");
    int64_t id = tf_submit(&f, TF_BOB, "{\"name\":\"m\",\"kind\":\"function\",\"gpus\":1,"
                                       "\"command\":[\"sh\",\"-c\",\"echo ran; ls -a ..\"]}");
    char *l = tf_wait_log(&f, id, 60, NULL);
    if (strstr(l, "ran\n")) fail_msg("the rank ran although its work root could not be hidden:\n%s", l);
    if (!strstr(l, "cannot enter the sandbox")) fail_msg("no word of the sandbox's failure in the rank's log:\n%s", l);
    free(l);
    tf_stop(&f);
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    if (system(cmd) != 0) print_message("could not remove %s\n", work);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find_tool_long_path_entry),
        cmocka_unit_test_teardown(test_seccomp_has_its_rules, tf_teardown),
        cmocka_unit_test(test_cgroup_probe_announces_what_it_can_use),
        cmocka_unit_test_teardown(test_cgroup_limits_written, tf_teardown),
        cmocka_unit_test_teardown(test_writable_each_condition, tf_teardown),
        cmocka_unit_test_teardown(test_mask_failure_stops_the_rank, tf_teardown),
        cmocka_unit_test_teardown(test_disk_share_small_roots, disk_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
