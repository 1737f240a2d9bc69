/* The member's jail: what the workload process does between the barrier and
 * the exec of the sandbox (docs/security.md).
 *
 * It runs as root (when the agent is root) in the process that will become
 * the workload, so every step here affects that process only:
 *   1. a private mount namespace, in which the agent's work root, the
 *      server's state directory and any directory others may not enter are
 *      hidden under empty tmpfs mounts, and the member's own work directory
 *      is bound back in;
 *   2. the "writable" directories (the member's own: sandbox.c checked
 *      them and gave them to its uid) are mounted from the descriptors
 *      opened at launch, never from a path: detached copies (nosuid,
 *      nodev) made before the namespace exists, attached beside the bundle
 *      for runsc, or by bwrap itself (--bind-fd);
 *   3. the process drops to the member's uid and gid with no supplementary
 *      groups (its capabilities go with uid 0);
 *   4. it execs bwrap, unprivileged, by the absolute path checked at agent
 *      start and with the agent's environment, which adds user, pid, ipc,
 *      uts and cgroup namespaces, a new session, a read-only view of
 *      everything, a fresh /proc, a minimal /dev, a private /tmp,
 *      no_new_privs and the seccomp filter built here, and then sets the
 *      rank's environment (read from a memfd) for the workload's exec.
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

/* A detached copy of the mount of the directory open as fd (no submounts),
 * nosuid and nodev: made before the member's mount namespace exists, from
 * the descriptor checked at launch (sandbox.c), never from a path.
 * Returns its fd or -errno. */
static int clone_writable(int fd)
{
    int t = (int)syscall(SYS_open_tree, fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
    if (t < 0) return -errno;
    struct mount_attr attr = {0};
    attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if (syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) {
        int e = errno;
        close(t);
        return -e;
    }
    return t;
}

/* Attaches the detached mount t on path (a directory only root may
 * change: under the bundle, or under an empty tmpfs of the jail's). */
static int attach(int t, const char *path)
{
    return syscall(SYS_move_mount, t, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) < 0 ? -errno : 0;
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
 * "writable" directories, attached beside the bundle (agent__gvisor_stage)
 * rather than over the directories, since runsc itself, as root, keeps its
 * state under the work root: the masks and binds go into its OCI spec
 * instead.  Under bwrap the directories are bound by bwrap itself, from
 * their descriptors (--bind-fd), except those under a closed ancestor of
 * the work root, which are attached here. */
static int prepare_mounts(const agent *a, const agent_member *m, const json_t *d, int gvisor, const int *wfd)
{
    json_t *wr = json_object_get(d, "writable");
    size_t nw = json_array_size(wr);
    char secret[AGENT_MAX_MASKS][4096], closed[4096];
    int ns = agent__masks(a, secret, closed), e = 0;
    int t[nw + 1];
    for (size_t i = 0; i < nw; i++) {
        const char *p = json_string_value(json_array_get(wr, i));
        t[i] = -1;
        if (!gvisor && !(closed[0] && agent__under(p, closed))) continue;
        int c = clone_writable(wfd[i]);
        if (c < 0) {
            while (i-- > 0)
                if (t[i] >= 0) close(t[i]);
            return c;
        }
        t[i] = c;
    }
    if (unshare(CLONE_NEWNS) < 0) return -errno;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -errno;
    if (gvisor) {
        for (size_t i = 0; i < nw && e == 0; i++) {
            char at[4200];
            agent__gvisor_stage(a, m, (int)i, at, sizeof at);
            e = attach(t[i], at);
        }
        for (size_t i = 0; i < nw; i++) close(t[i]);
        return e;
    }
    /* The work directory as it is on disk (owned by the member). */
    int fd0 = open(m->workdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd0 < 0) return -errno;
    /* A closed ancestor of the work root would stop the member on its way
     * to its own directory: replace it by an empty tmpfs and attach the
     * "writable" directories under it again, where bwrap finds them. */
    if (closed[0]) {
        e = mask(closed);
        for (size_t i = 0; i < nw && e == 0; i++)
            if (t[i] >= 0) {
                e = mkdir_p(json_string_value(json_array_get(wr, i)));
                if (e == 0) e = attach(t[i], json_string_value(json_array_get(wr, i)));
            }
    }
    for (size_t i = 0; i < nw; i++)
        if (t[i] >= 0) close(t[i]);
    /* Then hide the secrets, wherever they are still visible, and bind the
     * work directory back from under the work root's mask. */
    for (int k = 0; k < ns && e == 0; k++)
        if (sh_is_dir(secret[k])) e = mask(secret[k]);
    if (e == 0) e = bind_fd(fd0, m->workdir);
    close(fd0);
    return e;
}

/* The rank's environment as bwrap options (--clearenv, then --setenv for
 * each variable), NUL-separated in a fresh memfd that bwrap reads with
 * --args: on no command line, applied by bwrap after it has loaded. */
static int env_fd(char **env)
{
    int fd = memfd_create("shoal-env", 0);
    if (fd < 0) return -errno;
    sh_buf b = {0};
    sh_buf_append(&b, "--clearenv", 11);
    for (char **p = env; *p; p++) {
        const char *eq = strchr(*p, '=');
        if (!eq) continue;
        sh_buf_append(&b, "--setenv", 9);
        sh_buf_append(&b, *p, (size_t)(eq - *p));
        sh_buf_append(&b, "", 1);
        sh_buf_append(&b, eq + 1, strlen(eq + 1) + 1);
    }
    int e = 0;
    for (size_t off = 0; off < b.len && !e;) {
        ssize_t w = write(fd, b.data + off, b.len - off);
        if (w < 0) e = errno;
        else off += (size_t)w;
    }
    sh_buf_free(&b);
    if (!e && lseek(fd, 0, SEEK_SET) < 0) e = errno;
    if (e) {
        close(fd);
        return -e;
    }
    return fd;
}

static void put_fd(char **argv, const char *placeholder, int fd)
{
    for (char **p = argv; *p; p++)
        if (!strcmp(*p, placeholder)) {
            free(*p);
            char n[16];
            snprintf(n, sizeof n, "%d", fd);
            *p = strdup(n);
        }
}

int agent__jail_enter(const agent *a, const agent_member *m, const json_t *d, char **argv, char **env,
                      const int *wfd)
{
    if (a->mode == SB_NONE) return 0;
    /* runsc needs root to build its sandbox; the container process runs as
     * the member's uid (its OCI spec). */
    if (a->mode == SB_GVISOR) return prepare_mounts(a, m, d, 1, wfd);
    if (geteuid() == 0) {
        int e = prepare_mounts(a, m, d, 0, wfd);
        if (e < 0) return e;
        if (setgroups(0, NULL) < 0 || setresgid(m->uid, m->uid, m->uid) < 0 ||
            setresuid(m->uid, m->uid, m->uid) < 0)
            return -errno;
    }
    /* A change of credentials cleared the parent-death signal. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int f = seccomp_fd();
    if (f < 0) return f;
    put_fd(argv, AGENT_SECCOMP_FD, f);
    int v = env_fd(env);
    if (v < 0) return v;
    put_fd(argv, AGENT_ENV_FD, v);
    return 0;
}
