/* The member's jail: what the workload process does between the barrier and
 * the exec of the sandbox (docs/security.md).
 *
 * It runs as root (when the agent is root) in the process that will become
 * the workload, so every step here affects that process only:
 *   1. a private mount namespace, in which the agent's work root, the
 *      server's state directory and any directory others may not enter are
 *      hidden under empty tmpfs mounts, and the member's own work directory
 *      and its "writable" directories are bound back in;
 *   2. each "writable" directory is bound through an idmapped mount that
 *      shows its owner as the member's uid, so that the job can write where
 *      the admin allowed it, and only there, without host privileges;
 *   3. the process drops to the member's uid and gid with no supplementary
 *      groups (its capabilities go with uid 0);
 *   4. it execs bwrap, unprivileged, which adds user, pid, ipc, uts and
 *      cgroup namespaces, a read-only view of everything, a fresh /proc, a
 *      minimal /dev, a private /tmp, no_new_privs and the seccomp filter
 *      built here.
 * Any step that fails stops the launch: a member never runs with less
 * isolation than its agent announced. */
#include "agent_int.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Syscalls a job never needs and an attacker would: mounting and namespace
 * tricks, tracing, kernel modules and kexec, BPF and perf, keyrings, the
 * clock, swap, reboot and handles that bypass path permissions. */
static const char *const denied[] = {
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "setns", "unshare", "ptrace", "process_vm_writev", "init_module",
    "finit_module", "delete_module", "kexec_load", "kexec_file_load", "bpf", "perf_event_open", "add_key",
    "request_key", "keyctl", "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "syslog", "quotactl", "open_by_handle_at", "name_to_handle_at",
    "userfaultfd", "lookup_dcookie", "iopl", "ioperm", "vhangup", "nfsservctl", "uselib", "personality",
    NULL};

/* Writes the seccomp filter as BPF into a fresh memfd; returns the fd
 * (offset 0) or -errno. */
static int seccomp_fd(void)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) return -ENOMEM;
    int rc = 0;
    for (int i = 0; denied[i] && rc == 0; i++) {
        int nr = seccomp_syscall_resolve_name(denied[i]);
        if (nr == __NR_SCMP_ERROR) continue; /* not on this architecture */
        if (!strcmp(denied[i], "personality")) /* only the default persona is allowed */
            rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1, SCMP_A0(SCMP_CMP_NE, 0));
        else rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    }
    int fd = rc == 0 ? memfd_create("shoal-seccomp", 0) : -1;
    if (rc == 0 && fd < 0) rc = -errno;
    if (rc == 0) rc = seccomp_export_bpf(ctx, fd);
    seccomp_release(ctx);
    if (rc == 0 && lseek(fd, 0, SEEK_SET) < 0) rc = -errno;
    if (rc < 0) {
        if (fd >= 0) close(fd);
        return rc;
    }
    return fd;
}

/* A user namespace whose map shows host uid/gid `from` as `to`: the
 * mapping of an idmapped mount.  Returns its fd or -errno. */
static int idmap_userns(uid_t from_u, gid_t from_g, uid_t to)
{
    int p[2];
    if (pipe(p) < 0) return -errno;
    pid_t c = fork();
    if (c < 0) return -errno;
    if (c == 0) {
        close(p[1]);
        char x;
        if (unshare(CLONE_NEWUSER) < 0) _exit(1);
        if (read(p[0], &x, 1) < 0) _exit(1); /* hold until the parent is done */
        _exit(0);
    }
    close(p[0]);
    int fd = -1, e = 0;
    char path[64], map[64];
    /* Wait for the child to be in its namespace. */
    for (int i = 0; i < 2000; i++) {
        char a[64], b[64];
        snprintf(path, sizeof path, "/proc/%d/ns/user", (int)c);
        ssize_t la = readlink(path, a, sizeof a - 1), lb = readlink("/proc/self/ns/user", b, sizeof b - 1);
        if (la > 0 && lb > 0 && (la != lb || memcmp(a, b, (size_t)la))) break;
        usleep(500);
    }
    static const char *const files[] = {"uid_map", "gid_map"};
    for (int k = 0; k < 2 && !e; k++) {
        snprintf(path, sizeof path, "/proc/%d/%s", (int)c, files[k]);
        int n = snprintf(map, sizeof map, "%u %u 1\n", k ? (unsigned)from_g : (unsigned)from_u, (unsigned)to);
        int m = open(path, O_WRONLY | O_CLOEXEC);
        if (m < 0 || write(m, map, (size_t)n) != n) e = errno ? errno : EIO;
        if (m >= 0) close(m);
    }
    if (!e) {
        snprintf(path, sizeof path, "/proc/%d/ns/user", (int)c);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) e = errno;
    }
    close(p[1]);
    waitpid(c, NULL, 0);
    return e ? -e : fd;
}

/* Mounts on `at` (in this process's mount namespace) an idmapped view of
 * dir in which its owner is `uid`, nosuid and nodev. */
static int idmapped_bind(const char *dir, const char *at, uid_t uid)
{
    struct stat st;
    if (stat(dir, &st) < 0) return -errno;
    int ns = idmap_userns(st.st_uid, st.st_gid, uid);
    if (ns < 0) return ns;
    int t = (int)syscall(SYS_open_tree, AT_FDCWD, dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    int e = t < 0 ? errno : 0;
    if (!e) {
        struct mount_attr attr = {0};
        attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        attr.userns_fd = (uint64_t)ns;
        if (syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) e = errno;
    }
    if (!e && syscall(SYS_move_mount, t, "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) < 0) e = errno;
    if (t >= 0) close(t);
    close(ns);
    return -e;
}

static int mkdir_p(const char *path)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) < 0 && errno != EEXIST) return -errno;
            *s = '/';
        }
    return mkdir(p, 0755) < 0 && errno != EEXIST ? -errno : 0;
}

int agent__under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '/' || path[n] == 0 || (n == 1 && dir[0] == '/'));
}

/* The topmost ancestor of path (itself excluded) that others may not
 * enter, into out; "" if every ancestor is open. */
static void closed_ancestor(const char *path, char *out, size_t cap)
{
    char p[4096];
    out[0] = 0;
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        struct stat st;
        int closed = stat(p, &st) == 0 && !(st.st_mode & S_IXOTH);
        if (closed) {
            snprintf(out, cap, "%s", p);
            return;
        }
        *s = '/';
    }
}

int agent__masks(const agent *a, char (*masks)[4096], char *closed)
{
    char all[AGENT_MAX_MASKS][4096];
    int n = 0, nm = 0;
    snprintf(all[n++], 4096, "%s", a->cfg.work_dir);
    for (int i = 0; i < a->nprotect; i++)
        if (sh_is_dir(a->protect[i])) snprintf(all[n++], 4096, "%s", a->protect[i]);
    /* Only the outermost: a mask under another is hidden already (and
     * its mount point would no longer exist). */
    for (int i = 0; i < n; i++) {
        int inner = 0;
        for (int k = 0; k < n && !inner; k++)
            inner = k != i && agent__under(all[i], all[k]) && (strcmp(all[i], all[k]) || k < i);
        if (!inner) snprintf(masks[nm++], 4096, "%s", all[i]);
    }
    if (closed) closed_ancestor(a->cfg.work_dir, closed, 4096);
    return nm;
}

/* Binds fd (an O_PATH descriptor) on path, creating the mount point. */
static int bind_fd(int fd, const char *path)
{
    char src[64];
    snprintf(src, sizeof src, "/proc/self/fd/%d", fd);
    int e = mkdir_p(path);
    if (e == 0 && mount(src, path, NULL, MS_BIND | MS_REC, NULL) < 0) e = -errno;
    return e;
}

static int mask(const char *path)
{
    return mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") < 0 ? -errno : 0;
}

/* Steps 1 and 2 (see the top of the file).  Under gVisor only the
 * idmapped views, made beside the bundle (agent__gvisor_stage) rather than
 * over the directories, since runsc itself, as root, keeps its state under
 * the work root: the masks and binds go into its OCI spec instead. */
static int prepare_mounts(const agent *a, const agent_member *m, const json_t *d, int gvisor)
{
    if (unshare(CLONE_NEWNS) < 0) return -errno;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -errno;
    json_t *wr = json_object_get(d, "writable");
    size_t nb = 1 + json_array_size(wr);
    const char *bind[nb];
    int fd[nb];
    bind[0] = m->workdir;
    for (size_t i = 1; i < nb; i++) bind[i] = json_string_value(json_array_get(wr, i - 1));
    /* The work directory as it is on disk (owned by the member), before
     * an idmapped view of a directory above it could change its owner. */
    if ((fd[0] = open(bind[0], O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) return -errno;
    for (size_t i = 1; i < nb; i++) {
        char at[4200];
        if (gvisor) agent__gvisor_stage(a, m, (int)i - 1, at, sizeof at);
        else snprintf(at, sizeof at, "%s", bind[i]);
        int e = idmapped_bind(bind[i], at, m->uid);
        if (e < 0) return e;
    }
    if (gvisor) return close(fd[0]), 0;
    for (size_t i = 1; i < nb; i++)
        if ((fd[i] = open(bind[i], O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) return -errno;
    /* A closed ancestor of the work root would stop the member on its way
     * to its own directory: replace it by an empty tmpfs and bind back the
     * "writable" directories under it. */
    char secret[AGENT_MAX_MASKS][4096], closed[4096];
    int ns = agent__masks(a, secret, closed), e = 0;
    if (closed[0]) {
        e = mask(closed);
        for (size_t i = 1; i < nb && e == 0; i++)
            if (agent__under(bind[i], closed)) e = bind_fd(fd[i], bind[i]);
    }
    /* Then hide the secrets, wherever they are still visible (also inside
     * a "writable" directory that holds them), and bind the work
     * directory back from under the work root's mask. */
    for (int k = 0; k < ns && e == 0; k++)
        if (sh_is_dir(secret[k])) e = mask(secret[k]);
    if (e == 0) e = bind_fd(fd[0], bind[0]);
    for (size_t i = 0; i < nb; i++) close(fd[i]);
    return e;
}

int agent__jail_enter(const agent *a, const agent_member *m, const json_t *d, char **argv)
{
    if (a->mode == SB_NONE) return 0;
    /* runsc needs root to build its sandbox and drops it itself. */
    if (a->mode == SB_GVISOR) return prepare_mounts(a, m, d, 1);
    if (geteuid() == 0) {
        int e = prepare_mounts(a, m, d, 0);
        if (e < 0) return e;
        if (setgroups(0, NULL) < 0 || setresgid(m->uid, m->uid, m->uid) < 0 ||
            setresuid(m->uid, m->uid, m->uid) < 0)
            return -errno;
    }
    /* A change of credentials cleared the parent-death signal. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int f = seccomp_fd();
    if (f < 0) return f;
    for (char **p = argv; *p; p++)
        if (!strcmp(*p, AGENT_SECCOMP_FD)) {
            free(*p);
            char n[16];
            snprintf(n, sizeof n, "%d", f);
            *p = strdup(n);
        }
    return 0;
}
