/* Launching members: fork, hold at the barrier, exec inside the sandbox.
 *
 * The child is forked as soon as the member is assigned and blocks reading
 * the barrier pipe, so that "ready" means the process exists, sits in its
 * cgroups and has its working directory: opening the barrier then costs one
 * write and one exec.  Closing the pipe without writing cancels the launch.
 *
 * Isolation: bubblewrap (new pid, ipc, uts and mount namespaces, read-only
 * root, private /tmp, writable working directory and the job's "writable"
 * paths) and cgroup limits (memory, pids) through whichever hierarchy the
 * kernel mounts them on: v2 when its controllers are enabled, else v1. */
#include "agent_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* bwrap's options for every member: new user (no capabilities, no nested
 * user namespaces), pid, ipc, uts and cgroup namespaces; everything
 * read-only; a fresh /proc, a minimal /dev, a private /tmp and no view of
 * the cgroup file system.  Run unprivileged (see jail.c). */
static const char *const bwrap_base[] = {"bwrap", "--die-with-parent", "--unshare-user", "--disable-userns",
                                         "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                                         "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                                         "--tmpfs", "/tmp", "--tmpfs", "/sys/fs/cgroup", NULL};

/* Runs bwrap as a member would (dropped to the first member uid when the
 * agent is root) and reports whether it worked. */
static int bwrap_works(void)
{
    pid_t p = fork();
    if (p < 0) return 0;
    if (p == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 1);
        dup2(null, 2);
        if (geteuid() == 0 && (setgroups(0, NULL) < 0 || setresgid(AGENT_UID_BASE, AGENT_UID_BASE, AGENT_UID_BASE) < 0 ||
                               setresuid(AGENT_UID_BASE, AGENT_UID_BASE, AGENT_UID_BASE) < 0))
            _exit(126);
        char *argv[40];
        int n = 0;
        for (; bwrap_base[n]; n++) argv[n] = (char *)bwrap_base[n];
        argv[n++] = "true";
        argv[n] = NULL;
        execvp("bwrap", argv);
        _exit(127);
    }
    int st;
    while (waitpid(p, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The cgroup directory under which members' groups go for `ctl`, or "" if
 * the controller cannot be used here. */
void agent__cgroup_root(const char *ctl, char *out, size_t cap)
{
    char p[512];
    out[0] = 0;
    char *ctls = NULL;
    size_t len;
    if (sh_read_file("/sys/fs/cgroup/cgroup.subtree_control", 4096, &ctls, &len) == 0 && strstr(ctls, ctl)) {
        snprintf(p, sizeof p, "/sys/fs/cgroup/shoal");
    } else {
        snprintf(p, sizeof p, "/sys/fs/cgroup/%s/shoal", ctl);
        char parent[512];
        snprintf(parent, sizeof parent, "/sys/fs/cgroup/%s", ctl);
        if (!sh_is_dir(parent)) p[0] = 0;
    }
    free(ctls);
    if (!p[0] || (mkdir(p, 0700) < 0 && errno != EEXIST)) return;
    snprintf(out, cap, "%s", p);
}

static const char *const cg_ctl[3] = {"memory", "pids", "cpu"};

int agent_probe_sandbox(const char *mode, char *out, size_t cap)
{
    int m = SB_NONE;
    char why[256] = "";
    /* "auto" is bwrap: this host's runsc has only the ptrace platform,
     * which makes every syscall several context switches (docs/security.md). */
    if (!strcmp(mode, "gvisor")) {
        if (agent__gvisor_works(why, sizeof why)) m = SB_GVISOR;
        else return sh_err(SH_EINVAL, "sandbox gvisor: %s (run with --sandbox bwrap, the default hardening)", why);
    }
    if (m == SB_NONE && strcmp(mode, "none") && strcmp(mode, "gvisor")) {
        if (bwrap_works()) m = SB_BWRAP;
        else if (!strcmp(mode, "bwrap") || !strcmp(mode, "auto"))
            return sh_err(SH_EINVAL, "sandbox bwrap: `bwrap` is missing or the kernel refused its namespaces"
                                     " (apt-get install bubblewrap; --sandbox none runs jobs without isolation)");
    }
    char roots[3][256];
    sh_buf b = {0};
    for (int k = 0; k < 3; k++) {
        agent__cgroup_root(cg_ctl[k], roots[k], sizeof roots[k]);
        if (roots[k][0])
            sh_buf_printf(&b, "%s%s:%s", b.len ? "," : "", strstr(roots[k], "/shoal") == roots[k] + 14 ? "v2" : "v1",
                          cg_ctl[k]);
    }
    const char *desc = m == SB_GVISOR ? "gvisor(runsc,uid,ro-root,seccomp)"
                     : m == SB_BWRAP  ? "bwrap(user,pid,ipc,uts,mount,uid,ro-root,seccomp)"
                                      : "none";
    snprintf(out, cap, "%s+cgroup(%s)", desc, b.data ? (char *)b.data : "");
    sh_buf_free(&b);
    return m;
}

static void cg_write(const char *dir, const char *file, const char *val)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (write(fd, val, strlen(val)) < 0) sh_warn("cgroup %s: %s", p, strerror(errno));
    close(fd);
}

/* The member's part of the node: its GPUs over the node's (a member that
 * takes no GPU counts as one), which sets its default limits. */
double agent__node_share(const agent *a, const json_t *d)
{
    json_t *g = json_object_get(d, "gpus");
    long long per = g ? json_integer_value(g) : 1;
    if (a->gpus <= 0) return 1.0;
    if (per <= 0) per = 1;
    return per >= a->gpus ? 1.0 : (double)per / a->gpus;
}

/* Puts pid into its own memory, pids and cpu groups.  The limits come
 * from the node's share: that share of the node's memory (at least 256
 * MiB), of 4096 tasks (at least 128) and of its CPUs (at least one).  A
 * job's memory_mb and pids_max may lower the first two, never raise them:
 * the job file is the tenant's, and a rank above its share would take the
 * memory or the pid space (kernel.pid_max) of the node's other ranks.  The
 * job never sees the groups: it has no /sys/fs/cgroup and a cgroup
 * namespace rooted at its own group. */
void agent__limits(const agent *a, const json_t *d, long long *mem_mb, long long *npids, double *cpus)
{
    double share = agent__node_share(a, d);
    json_t *mem = json_object_get(d, "memory_mb"), *pids = json_object_get(d, "pids_max");
    *mem_mb = (long long)(a->mem_mb * share);
    *npids = (long long)(4096 * share);
    if (*mem_mb < 256) *mem_mb = 256;
    if (*npids < 128) *npids = 128;
    if (json_integer_value(mem) > 0 && json_integer_value(mem) < *mem_mb) *mem_mb = json_integer_value(mem);
    if (json_integer_value(pids) > 0 && json_integer_value(pids) < *npids) *npids = json_integer_value(pids);
    *cpus = a->ncpu * share < 1 ? 1 : a->ncpu * share;
}

static void cgroup_enter(agent *a, agent_member *m, pid_t pid, const json_t *d)
{
    long long mem_mb, npids;
    double cpus;
    agent__limits(a, d, &mem_mb, &npids, &cpus);
    for (int k = 0; k < 3; k++) {
        const char *root = a->cg_root[k];
        if (!root[0]) continue;
        int v2 = strstr(root, "/sys/fs/cgroup/shoal") == root;
        char dir[600], v[64];
        snprintf(dir, sizeof dir, "%s/%s.%d-%lld-%d-%d", root, a->cfg.name, (int)a->pid, (long long)m->job,
                 m->attempt, m->rank);
        if (mkdir(dir, 0700) < 0 && errno != EEXIST) continue;
        if (k == 0) {
            snprintf(v, sizeof v, "%lld", mem_mb * 1024 * 1024);
            cg_write(dir, v2 ? "memory.max" : "memory.limit_in_bytes", v);
            /* No swap on top: a rank over its memory would otherwise go on
             * in the node's swap (slowly, and with every other tenant's
             * pages) instead of being stopped.  v1 counts memory and swap
             * together; the files are absent where swap is not accounted. */
            if (v2) cg_write(dir, "memory.swap.max", "0");
            else cg_write(dir, "memory.memsw.limit_in_bytes", v);
        } else if (k == 1) {
            /* Under gVisor the limit is the sentry's (in the spec): the host
             * group also holds the sentry's and gofer's own threads. */
            snprintf(v, sizeof v, "%lld", a->mode == SB_GVISOR ? npids + 256 : npids);
            cg_write(dir, "pids.max", v);
        } else if (v2) {
            snprintf(v, sizeof v, "%lld 100000", (long long)(cpus * 100000));
            cg_write(dir, "cpu.max", v);
        } else {
            cg_write(dir, "cpu.cfs_period_us", "100000");
            snprintf(v, sizeof v, "%lld", (long long)(cpus * 100000));
            cg_write(dir, "cpu.cfs_quota_us", v);
        }
        snprintf(v, sizeof v, "%d", (int)pid);
        cg_write(dir, "cgroup.procs", v);
        snprintf(m->cg[k], sizeof m->cg[k], "%s", dir);
    }
}

/* Removes member groups left by agents that were killed (their names carry
 * the agent's pid); a group that still holds processes stays. */
void agent__cgroup_sweep(const char *root)
{
    DIR *d = root[0] ? opendir(root) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *dot = strchr(e->d_name, '.');
        if (!dot || e->d_name[0] == '.' || !strchr(dot, '-')) continue;
        pid_t pid = (pid_t)atoi(dot + 1);
        if (pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH)) {
            char p[600];
            snprintf(p, sizeof p, "%s/%s", root, e->d_name);
            rmdir(p);
        }
    }
    if (d) closedir(d);
}

/* The number after `key` in a cgroup file, or 0. */
static long long cg_count(const char *dir, const char *file, const char *key)
{
    char p[700], line[128];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "r");
    long long n = 0;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ' ') n = atoll(line + kl + 1);
    if (f) fclose(f);
    return n;
}

void agent__limit_report(agent_member *m)
{
    /* Said in the member's own log, so that its owner learns why a fork
     * or an allocation failed, or why the sandbox died. */
    long long pids = m->cg[1][0] ? cg_count(m->cg[1], "pids.events", "max") : 0;
    long long oom = m->cg[0][0] ? cg_count(m->cg[0], "memory.oom_control", "oom_kill") +
                                      cg_count(m->cg[0], "memory.events", "oom_kill") : 0;
    if (pids) sh_buf_printf(&m->log, "shoal agent: the member hit its pids limit (%lld refused forks)\n", pids);
    if (oom) sh_buf_printf(&m->log, "shoal agent: the member hit its memory limit (%lld processes killed)\n", oom);
}

void agent__cgroup_cleanup(agent_member *m)
{
    for (int k = 0; k < 3; k++)
        if (m->cg[k][0]) {
            rmdir(m->cg[k]);
            m->cg[k][0] = 0;
        }
}

/* GPU device nodes a member of a node with GPUs may use: the control
 * nodes and the ones of its GPUs (by index), where they exist. */
static void gpu_devices(const json_t *d, char **argv, size_t *k)
{
    static const char *const ctl[] = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", NULL};
    const char *vis = json_string_value(json_object_get(json_object_get(d, "env"), "CUDA_VISIBLE_DEVICES"));
    if (!vis || !*vis) return;
    char dev[64];
    for (int i = 0; ctl[i]; i++)
        if (sh_path_exists(ctl[i])) {
            argv[(*k)++] = strdup("--dev-bind");
            argv[(*k)++] = strdup(ctl[i]);
            argv[(*k)++] = strdup(ctl[i]);
        }
    for (const char *p = vis; *p;) {
        int g = atoi(p);
        snprintf(dev, sizeof dev, "/dev/nvidia%d", g);
        if (sh_path_exists(dev)) {
            argv[(*k)++] = strdup("--dev-bind");
            argv[(*k)++] = strdup(dev);
            argv[(*k)++] = strdup(dev);
        }
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
}

/* Builds the argv of the member: bwrap's options, then the command. */
static char **build_argv(agent *a, const agent_member *m, const json_t *d)
{
    if (a->mode == SB_GVISOR) return agent__gvisor_argv(a, m, d);
    json_t *cmd = json_object_get(d, "command"), *wr = json_object_get(d, "writable");
    size_t n = json_array_size(cmd) + 3 * json_array_size(wr) + 3 * 70 + 60;
    char **argv = calloc(n, sizeof *argv);
    if (!argv) return NULL;
    size_t k = 0;
    if (a->mode == SB_BWRAP) {
        for (int i = 0; bwrap_base[i]; i++) argv[k++] = strdup(bwrap_base[i]);
        gpu_devices(d, argv, &k);
        /* The private /tmp hides a program that lives under /tmp (a build
         * in a checkout there): show that one file, read-only, and for
         * shoal's client the shoal-core it runs from beside it (src/cli/main.c). */
        const char *prog = json_string_value(json_array_get(cmd, 0));
        if (prog && !strncmp(prog, "/tmp/", 5) && access(prog, X_OK) == 0) {
            argv[k++] = strdup("--ro-bind");
            argv[k++] = strdup(prog);
            argv[k++] = strdup(prog);
            const char *base = strrchr(prog, '/') + 1;
            char core[4200];
            if (!strcmp(base, "shoal") &&
                snprintf(core, sizeof core, "%.*sshoal-core", (int)(base - prog), prog) < (int)sizeof core &&
                access(core, X_OK) == 0) {
                argv[k++] = strdup("--ro-bind");
                argv[k++] = strdup(core);
                argv[k++] = strdup(core);
            }
        }
        size_t i;
        json_t *v;
        json_array_foreach(wr, i, v) {
            argv[k++] = strdup("--bind");
            argv[k++] = strdup(json_string_value(v));
            argv[k++] = strdup(json_string_value(v));
        }
        /* An agent that is not root cannot prepare the mounts (jail.c):
         * bwrap hides the secrets itself, after the "writable" binds that
         * may hold them. */
        if (geteuid() != 0) {
            char mask[AGENT_MAX_MASKS][4096];
            int nm = agent__masks(a, mask, NULL);
            for (int q = 0; q < nm; q++) {
                argv[k++] = strdup("--tmpfs");
                argv[k++] = strdup(mask[q]);
            }
        }
        argv[k++] = strdup("--bind");
        argv[k++] = strdup(m->workdir);
        argv[k++] = strdup(m->workdir);
        argv[k++] = strdup("--seccomp");
        argv[k++] = strdup(AGENT_SECCOMP_FD);
        argv[k++] = strdup("--chdir");
        argv[k++] = strdup(m->workdir);
        argv[k++] = strdup("--");
    }
    size_t i;
    json_t *v;
    json_array_foreach(cmd, i, v) argv[k++] = strdup(json_string_value(v));
    argv[k] = NULL;
    return argv;
}

/* The "writable" paths must be directories exactly as named: a symbolic
 * link anywhere in one could point the bind outside what the server
 * checked. */
static int check_writable(const agent *a, const json_t *d)
{
    char mask[AGENT_MAX_MASKS][4096];
    int nm = agent__masks(a, mask, NULL);
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(d, "writable"), i, v) {
        const char *p = json_string_value(v);
        char real[4096];
        if (!p || !realpath(p, real) || strcmp(real, p) || !sh_is_dir(p))
            return sh_err(SH_EINVAL, "writable \"%s\": not an existing directory named without symbolic links"
                                     " or \"..\" on this node", p ? p : "?");
        /* Inside a hidden path (another member's directory, the server's
         * state) it would undo the hiding. */
        for (int k = 0; k < nm; k++)
            if (agent__under(p, mask[k]))
                return sh_err(SH_EPERM, "writable \"%s\": lies in %s, which members may not see", p, mask[k]);
    }
    return SH_OK;
}

/* The guard: the member's process-group leader that stays outside the
 * sandbox.  It exists because bwrap drops its capabilities at start, which
 * makes the kernel clear the parent-death signal the agent set: without the
 * guard, a killed agent would leave its workloads running.  The guard keeps
 * its parent-death signal (it never execs) and answers it by killing the
 * whole group; otherwise it waits for the workload and exits as it did. */
static void guard_on_parent_death(int sig)
{
    kill(-getpid(), SIGKILL);
    _exit(137);
}

static void guard(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) _exit(126);
    if (WIFEXITED(st)) _exit(WEXITSTATUS(st));
    _exit(128 + WTERMSIG(st));
}

static void child(agent *a, agent_member *m, const json_t *d, int out, int barrier, int exst, char **argv)
{
    signal(SIGUSR1, guard_on_parent_death);
    signal(SIGTERM, SIG_IGN); /* the agent stops the workload, not the guard */
    prctl(PR_SET_PDEATHSIG, SIGUSR1);
    if (getppid() != a->pid) _exit(125);
    setpgid(0, 0);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(out, 1);
    dup2(out, 2);
    /* Nothing the agent holds open may reach the workload. */
    close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
    char c;
    ssize_t r;
    while ((r = read(barrier, &c, 1)) < 0 && errno == EINTR) {}
    if (r != 1) _exit(125); /* the launch was cancelled before the barrier opened */
    pid_t w = fork();
    if (w < 0) _exit(126);
    if (w > 0) {
        close(exst); /* only the workload's exec may hold it now */
        guard(w);
    }
    signal(SIGUSR1, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    clearenv();
    setenv("PATH", "/usr/local/bin:/usr/bin:/bin", 1);
    setenv("HOME", m->workdir, 1);
    setenv("LANG", "C.UTF-8", 1);
    setenv("SHOAL_WORKDIR", m->workdir, 1);
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(d, "env"), k, v) setenv(k, json_string_value(v), 1);
    if (chdir(m->workdir) < 0) _exit(126);
    signal(SIGPIPE, SIG_DFL);
    umask(022);
    int e = -agent__jail_enter(a, m, d, argv);
    if (e) dprintf(2, "shoal agent: cannot enter the sandbox: %s\n", strerror(e));
    else {
        execvp(argv[0], argv);
        e = errno;
    }
    if (write(exst, &e, sizeof e) < 0) _exit(127);
    _exit(127);
}

int agent__launch(agent *a, agent_member *m, const json_t *d)
{
    snprintf(m->workdir, sizeof m->workdir, "%s/%s-%lld-%d-%d", a->cfg.work_dir, a->cfg.name, (long long)m->job,
             m->attempt, m->rank);
    m->uid = geteuid() == 0 && a->mode != SB_NONE
                 ? AGENT_UID_BASE + (uid_t)json_integer_value(json_object_get(d, "uid"))
                 : geteuid();
    if (a->mode != SB_NONE) SH_TRY(check_writable(a, d));
    SH_TRY(sh_mkdir_p(a->cfg.work_dir, 0700));
    if (mkdir(m->workdir, 0700) < 0 && errno != EEXIST) return sh_err_errno(errno, "mkdir %s", m->workdir);
    if (chown(m->workdir, m->uid, m->uid) < 0) return sh_err_errno(errno, "chown %s", m->workdir);
    char **argv = build_argv(a, m, d);
    if (!argv) return sh_err(SH_ENOMEM, "member argv");
    int out[2], bar[2], ex[2];
    if (pipe2(out, O_CLOEXEC) < 0) return sh_err_errno(errno, "pipe");
    if (pipe2(bar, O_CLOEXEC) < 0 || pipe2(ex, O_CLOEXEC) < 0) return sh_err_errno(errno, "pipe");
    pid_t pid = fork();
    if (pid == 0) child(a, m, d, out[1], bar[0], ex[1], argv);
    for (char **p = argv; *p; p++) free(*p);
    free(argv);
    close(out[1]);
    close(bar[0]);
    close(ex[1]);
    if (pid < 0) {
        close(out[0]);
        close(bar[1]);
        close(ex[0]);
        return sh_err_errno(errno, "fork");
    }
    setpgid(pid, pid); /* also in the child: whichever runs first wins the race */
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    cgroup_enter(a, m, pid, d);
    m->pid = pid;
    m->out_fd = out[0];
    m->barrier_fd = bar[1];
    m->exec_fd = ex[0];
    m->state = AM_READY;
    return SH_OK;
}

/* Opens the barrier; returns 0 once exec succeeded, or the exec errno. */
int agent__release(agent *a, agent_member *m)
{
    char c = 1;
    if (write(m->barrier_fd, &c, 1) != 1) return errno ? errno : EPIPE;
    close(m->barrier_fd);
    m->barrier_fd = -1;
    int e = 0;
    ssize_t r;
    while ((r = read(m->exec_fd, &e, sizeof e)) < 0 && errno == EINTR) {}
    close(m->exec_fd);
    m->exec_fd = -1;
    m->state = AM_RUNNING;
    return r == (ssize_t)sizeof e ? e : 0;
}

/* Whether pid is part of the sandbox rather than the workload: bwrap, or
 * runsc's gofer and sentry (which run as "exe"; `runsc run` itself forwards
 * a SIGTERM to the container). */
static int is_sandbox(pid_t pid)
{
    char p[64], comm[32] = "";
    snprintf(p, sizeof p, "/proc/%d/comm", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
    fclose(f);
    return !strncmp(comm, "bwrap", 5) || !strcmp(comm, "exe\n");
}

/* Sends sig to the member's processes, found through its cgroup (which
 * also holds any that left the process group) or else its process group.
 * SIGTERM skips the guard and bwrap itself: bwrap runs the workload with a
 * parent-death SIGKILL, so terminating bwrap first would kill the workload
 * before its own SIGTERM handler ran. */
static void signal_member(agent_member *m, int sig)
{
    char p[700], *text = NULL;
    int k = m->cg[1][0] ? 1 : 0;
    snprintf(p, sizeof p, "%s/cgroup.procs", m->cg[k]);
    /* cgroup files report a size of 0, so read them as a stream. */
    FILE *f = m->cg[k][0] ? fopen(p, "r") : NULL;
    if (f) {
        sh_buf b = {0};
        char line[32];
        while (fgets(line, sizeof line, f)) sh_buf_append(&b, line, strlen(line));
        fclose(f);
        sh_buf_append(&b, "", 1);
        text = (char *)b.data;
    } else {
        /* No cgroup: walk /proc for the process group. */
        sh_buf b = {0};
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            pid_t pid = (pid_t)atoi(e->d_name);
            if (pid > 0 && getpgid(pid) == m->pid) sh_buf_printf(&b, "%d\n", (int)pid);
        }
        if (d) closedir(d);
        text = b.data ? (char *)b.data : strdup("");
    }
    for (char *s = NULL, *t = strtok_r(text, "\n", &s); t; t = strtok_r(NULL, "\n", &s)) {
        pid_t pid = (pid_t)atoi(t);
        if (pid <= 0 || (sig == SIGTERM && (pid == m->pid || is_sandbox(pid)))) continue;
        sh_debug("member %lld/%d: signal %d to %d", (long long)m->job, m->rank, sig, (int)pid);
        kill(pid, sig);
    }
    free(text);
}

void agent__stop(agent *a, agent_member *m, double now)
{
    if (m->barrier_fd >= 0) {
        close(m->barrier_fd); /* a member held at the barrier just exits */
        m->barrier_fd = -1;
    }
    if (m->kill_at == 0) {
        signal_member(m, SIGTERM);
        m->kill_at = now + a->cfg.grace_s;
    } else if (now >= m->kill_at) {
        signal_member(m, SIGKILL);
        kill(-m->pid, SIGKILL);
        kill(m->pid, SIGKILL);
    }
}
