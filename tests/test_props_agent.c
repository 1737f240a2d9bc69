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
 *    named without symbolic links: each condition on its own. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fleet_util.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_seccomp_has_its_rules, tf_teardown),
        cmocka_unit_test_teardown(test_cgroup_limits_written, tf_teardown),
        cmocka_unit_test_teardown(test_writable_each_condition, tf_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
