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

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const bwrap_base[] = {"bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc",
                                         "--unshare-uts", "--ro-bind", "/", "/", "--dev", "/dev",
                                         "--proc", "/proc", "--tmpfs", "/tmp", NULL};

static int bwrap_works(void)
{
    pid_t p = fork();
    if (p < 0) return 0;
    if (p == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 1);
        dup2(null, 2);
        char *argv[32];
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
    if (!p[0] || (mkdir(p, 0755) < 0 && errno != EEXIST)) return;
    snprintf(out, cap, "%s", p);
}

int agent_probe_sandbox(const char *mode, char *out, size_t cap)
{
    int use_bwrap = 0;
    if (strcmp(mode, "none")) {
        use_bwrap = bwrap_works();
        if (!use_bwrap && !strcmp(mode, "bwrap"))
            return sh_err(SH_EINVAL, "sandbox bwrap: `bwrap` is missing or the kernel refused its namespaces"
                                     " (apt-get install bubblewrap, or run with --sandbox none)");
    }
    char mem[256], pids[256];
    agent__cgroup_root("memory", mem, sizeof mem);
    agent__cgroup_root("pids", pids, sizeof pids);
    snprintf(out, cap, "%s+cgroup(%s%s%s)", use_bwrap ? "bwrap(pid,ipc,uts,mount,ro-root)" : "none",
             mem[0] ? (strstr(mem, "/memory/") ? "v1:memory" : "v2:memory") : "",
             mem[0] && pids[0] ? "," : "", pids[0] ? (strstr(pids, "/pids/") ? "v1:pids" : "v2:pids") : "");
    return use_bwrap;
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

/* Puts pid into its own memory and pids groups with the job's limits. */
static void cgroup_enter(agent *a, agent_member *m, pid_t pid, const json_t *d)
{
    const char *ctl[2] = {"memory", "pids"};
    char *roots[2] = {a->cg_mem, a->cg_pids};
    for (int k = 0; k < 2; k++) {
        if (!roots[k][0]) continue;
        char dir[600], v[64];
        snprintf(dir, sizeof dir, "%s/%s-%lld-%d-%d", roots[k], a->cfg.name, (long long)m->job, m->attempt, m->rank);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) continue;
        json_t *lim = json_object_get(d, k == 0 ? "memory_mb" : "pids_max");
        if (lim) {
            long long x = json_integer_value(lim);
            if (k == 0) x *= 1024 * 1024;
            snprintf(v, sizeof v, "%lld", x);
            int v2 = !strstr(roots[k], ctl[k]) || strstr(roots[k], "/sys/fs/cgroup/shoal") == roots[k];
            cg_write(dir, k == 0 ? (v2 ? "memory.max" : "memory.limit_in_bytes") : "pids.max", v);
        }
        snprintf(v, sizeof v, "%d", (int)pid);
        cg_write(dir, "cgroup.procs", v);
        snprintf(m->cg[k], sizeof m->cg[k], "%s", dir);
    }
}

void agent__cgroup_cleanup(agent_member *m)
{
    for (int k = 0; k < 2; k++)
        if (m->cg[k][0]) {
            rmdir(m->cg[k]);
            m->cg[k][0] = 0;
        }
}

/* Builds the argv of the member: bwrap's options, then the command. */
static char **build_argv(agent *a, const agent_member *m, const json_t *d)
{
    json_t *cmd = json_object_get(d, "command"), *wr = json_object_get(d, "writable");
    size_t n = json_array_size(cmd) + 3 * json_array_size(wr) + 40;
    char **argv = calloc(n, sizeof *argv);
    if (!argv) return NULL;
    size_t k = 0;
    if (a->use_bwrap) {
        for (int i = 0; bwrap_base[i]; i++) argv[k++] = strdup(bwrap_base[i]);
        argv[k++] = strdup("--bind");
        argv[k++] = strdup(m->workdir);
        argv[k++] = strdup(m->workdir);
        size_t i;
        json_t *v;
        json_array_foreach(wr, i, v) if (sh_is_dir(json_string_value(v))) {
            argv[k++] = strdup("--bind");
            argv[k++] = strdup(json_string_value(v));
            argv[k++] = strdup(json_string_value(v));
        }
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

static void child(agent *a, agent_member *m, const json_t *d, int out, int barrier, int exst, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != a->pid) _exit(125);
    setpgid(0, 0);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(out, 1);
    dup2(out, 2);
    char c;
    ssize_t r;
    while ((r = read(barrier, &c, 1)) < 0 && errno == EINTR) {}
    if (r != 1) _exit(125); /* the launch was cancelled before the barrier opened */
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
    execvp(argv[0], argv);
    int e = errno;
    if (write(exst, &e, sizeof e) < 0) _exit(127);
    _exit(127);
}

int agent__launch(agent *a, agent_member *m, const json_t *d)
{
    snprintf(m->workdir, sizeof m->workdir, "%s/%s-%lld-%d-%d", a->cfg.work_dir, a->cfg.name, (long long)m->job,
             m->attempt, m->rank);
    SH_TRY(sh_mkdir_p(m->workdir, 0755));
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

void agent__stop(agent *a, agent_member *m, double now)
{
    if (m->barrier_fd >= 0) {
        close(m->barrier_fd); /* a member held at the barrier just exits */
        m->barrier_fd = -1;
    }
    if (m->kill_at == 0) {
        kill(-m->pid, SIGTERM);
        m->kill_at = now + a->cfg.grace_s;
    } else if (now >= m->kill_at) {
        kill(-m->pid, SIGKILL);
        kill(m->pid, SIGKILL);
    }
}
