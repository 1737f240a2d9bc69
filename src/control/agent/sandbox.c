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
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* bwrap's options for every member: new user (no capabilities, no nested
 * user namespaces), pid, ipc, uts and cgroup namespaces; everything
 * read-only; a fresh /proc, a minimal /dev, a private /tmp and no view of
 * the cgroup file system.  Run unprivileged (see jail.c). */
static const char *const bwrap_base[] = {"bwrap", "--die-with-parent", "--new-session", "--unshare-user", "--disable-userns",
                                         "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                                         "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                                         "--tmpfs", "/tmp", "--tmpfs", "/sys/fs/cgroup", NULL};

/* The absolute paths of the sandbox tools, found once at agent start
 * (agent__find_tool). */
static char bwrap_path[4096], runsc_path[4096];

const char *agent__runsc(void) { return runsc_path; }

/* The environment the sandbox tools run with: the agent's own, never the
 * job's (which a tenant writes), so that no PATH, LD_PRELOAD,
 * LD_LIBRARY_PATH, BASH_ENV, ENV or IFS of the job steers what runs
 * before the jail. */
char *const agent__tool_env[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", NULL};

/* Whether a file at path, and every directory above it, is owned by root
 * and writable by no one else; why not into why. */
static int root_only(const char *path, char *why, size_t cap)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (;;) {
        const char *at = p[0] ? p : "/";
        struct stat st;
        if (lstat(at, &st) < 0) return snprintf(why, cap, "%s: %s", at, strerror(errno)), 0;
        if (st.st_uid != 0) return snprintf(why, cap, "%s is owned by uid %u, not root", at, (unsigned)st.st_uid), 0;
        if (st.st_mode & 022)
            return snprintf(why, cap, "%s is writable by others than root (mode %04o)", at,
                            (unsigned)st.st_mode & 07777), 0;
        if (!p[0]) return 1;
        *strrchr(p, '/') = 0;
    }
}

int agent__find_tool(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/sbin:/usr/bin:/sbin:/bin";
    char cand[4096], real[4096], why[4200];
    for (const char *p = path; *p;) {
        const char *c = strchr(p, ':');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        if (n && p[0] == '/' && snprintf(cand, sizeof cand, "%.*s/%s", (int)n, p, name) < (int)sizeof cand &&
            access(cand, X_OK) == 0 && realpath(cand, real)) {
            struct stat st;
            if (stat(real, &st) < 0 || !S_ISREG(st.st_mode))
                return sh_err(SH_EINVAL, "%s: %s is not a regular file", name, real);
            if (!root_only(real, why, sizeof why))
                return sh_err(SH_EPERM, "%s: refusing to run %s for tenants: %s (the tool and every directory"
                                        " above it must be owned by root and writable only by root)",
                              name, real, why);
            snprintf(out, cap, "%s", real);
            return SH_OK;
        }
        p = c ? c + 1 : p + n;
    }
    return sh_err(SH_ENOENT, "%s: not found on PATH (%s)", name, path);
}

/* The rank's environment, built here and only here ("K=V" strings, NULL
 * at the end; free with agent__env_free): the agent's fixed variables,
 * then the job's "env" over them.  Applied only inside the sandbox (bwrap's
 * --setenv after its drops, runsc's OCI spec), or directly under --sandbox
 * none. */
char **agent__rank_env(const agent_member *m, const json_t *d)
{
    json_t *env = json_object_get(d, "env");
    size_t n = 4 + json_object_size(env) + 1, k = 0;
    char **out = calloc(n, sizeof *out);
    if (!out) return NULL;
    const char *const fixed[][2] = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", m->workdir},
                                    {"LANG", "C.UTF-8"}, {"SHOAL_WORKDIR", m->workdir}};
    const char *key;
    json_t *v;
    for (int i = 0; i < 4; i++) {
        if (json_object_get(env, fixed[i][0])) continue; /* the job's own wins */
        sh_buf b = {0};
        sh_buf_printf(&b, "%s=%s", fixed[i][0], fixed[i][1]);
        out[k++] = (char *)b.data;
    }
    json_object_foreach(env, key, v) {
        if (!json_is_string(v)) continue;
        sh_buf b = {0};
        sh_buf_printf(&b, "%s=", key);
        sh_buf_append(&b, json_string_value(v), json_string_length(v));
        sh_buf_append(&b, "", 1);
        out[k++] = (char *)b.data;
    }
    out[k] = NULL;
    return out;
}

void agent__env_free(char **env)
{
    for (char **p = env; p && *p; p++) free(*p);
    free(env);
}

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
        execve(bwrap_path, argv, agent__tool_env);
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
        if (agent__find_tool("runsc", runsc_path, sizeof runsc_path) < 0)
            return sh_err(SH_EINVAL, "sandbox gvisor: %s", sh_errmsg());
        if (agent__gvisor_works(why, sizeof why)) m = SB_GVISOR;
        else return sh_err(SH_EINVAL, "sandbox gvisor: %s (run with --sandbox bwrap, the default hardening)", why);
    }
    if (m == SB_NONE && strcmp(mode, "none") && strcmp(mode, "gvisor")) {
        int f = agent__find_tool("bwrap", bwrap_path, sizeof bwrap_path);
        if (f < 0) {
            /* An unsafe bwrap is an error in every mode that would use it. */
            if (f == SH_EPERM || !strcmp(mode, "bwrap") || !strcmp(mode, "auto"))
                return sh_err(SH_EINVAL, "sandbox bwrap: %s", sh_errmsg());
        } else if (bwrap_works()) m = SB_BWRAP;
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

/* Builds the argv of the member: bwrap's options, then the command.
 * wfd[i] is the descriptor of the i-th "writable" directory (open_writable). */
static char **build_argv(agent *a, const agent_member *m, const json_t *d, const int *wfd)
{
    if (a->mode == SB_GVISOR) return agent__gvisor_argv(a, m, d);
    json_t *cmd = json_object_get(d, "command"), *wr = json_object_get(d, "writable");
    size_t n = json_array_size(cmd) + 3 * json_array_size(wr) + 3 * 70 + 60;
    char **argv = calloc(n, sizeof *argv);
    if (!argv) return NULL;
    size_t k = 0;
    if (a->mode == SB_BWRAP) {
        for (int i = 0; bwrap_base[i]; i++) {
            argv[k++] = strdup(bwrap_base[i]);
            if (i == 0) { /* the rank's environment, from a descriptor (jail.c): not on a command line */
                argv[k++] = strdup("--args");
                argv[k++] = strdup(AGENT_ENV_FD);
            }
        }
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
        /* From the descriptor checked at launch, never by path again. */
        json_array_foreach(wr, i, v) {
            char num[16];
            snprintf(num, sizeof num, "%d", wfd[i]);
            argv[k++] = strdup("--bind-fd");
            argv[k++] = strdup(num);
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

/* Whether others than uid (another tenant's rank runs as "others") can
 * reach into the directory open as fd: it lets them in by its mode, and
 * every directory above it lets them pass. */
static int others_reach(int fd, const struct stat *st, uid_t uid)
{
    if (!(st->st_mode & 007) && !((st->st_mode & 070) && st->st_gid != uid)) return 0;
    struct stat cur = *st, up;
    int at = fd, reach = 1;
    for (int depth = 0; reach && depth < 4096; depth++) {
        int p = openat(at, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (at != fd) close(at);
        if (p < 0) return 1;
        at = p;
        if (fstat(at, &up) < 0) break;
        if (up.st_dev == cur.st_dev && up.st_ino == cur.st_ino) break; /* the root */
        if (!(up.st_mode & S_IXOTH)) reach = 0;
        cur = up;
    }
    if (at != fd) close(at);
    return reach;
}

/* Opens each "writable" directory once, into wfd (closed on error), and
 * checks it on that descriptor: every later step (the owner, the bind)
 * uses the descriptor, so a directory swapped for a symbolic link after
 * the check (renameat2 RENAME_EXCHANGE) changes nothing.  The path must
 * resolve without any symbolic link; it must not lie in a hidden path.
 * When the agent is root the directory must be the member's: one owned by
 * root is given to the member's uid (and closed to others, mode 0700), so
 * that what the job creates there is owned on the host by the tenant's
 * uid, never by root; one owned by anyone else, or that others can enter,
 * is refused. */
static int open_writable(const agent *a, const agent_member *m, const json_t *d, int *wfd)
{
    char mask[AGENT_MAX_MASKS][4096];
    int nm = agent__masks(a, mask, NULL);
    json_t *wr = json_object_get(d, "writable");
    size_t n = json_array_size(wr), i;
    for (i = 0; i < n; i++) wfd[i] = -1;
    int rc = SH_OK;
    for (i = 0; i < n && rc == SH_OK; i++) {
        const char *p = json_string_value(json_array_get(wr, i));
        if (!p || p[0] != '/') {
            rc = sh_err(SH_EINVAL, "writable \"%s\": not an absolute path", p ? p : "?");
            break;
        }
        /* Inside a hidden path (another member's directory, the server's
         * state) it would undo the hiding. */
        for (int k = 0; k < nm && rc == SH_OK; k++)
            if (agent__under(p, mask[k]))
                rc = sh_err(SH_EPERM, "writable \"%s\": lies in %s, which members may not see", p, mask[k]);
        if (rc < 0) break;
        struct open_how how = {.flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                               .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
        int fd = (int)syscall(SYS_openat2, AT_FDCWD, p, &how, sizeof how);
        if (fd < 0) {
            rc = sh_err(errno == ELOOP ? SH_EPERM : SH_EINVAL,
                        "writable \"%s\": not an existing directory named without symbolic links on this node (%s)",
                        p, strerror(errno));
            break;
        }
        wfd[i] = fd;
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode)) {
            rc = sh_err(SH_EINVAL, "writable \"%s\": not a directory", p);
            break;
        }
        if (geteuid() != 0 || a->mode == SB_NONE) continue;
        if (st.st_uid == 0) {
            /* The admin's folder, given to the first tenant the server let
             * name it: the member's from now on.  Closed before it changes
             * hands: another agent on this host launching a rank of the same
             * run in between would otherwise find it the tenant's and still
             * 0755, and refuse it as open to other tenants. */
            if (fchmod(fd, 0700) < 0 || fchown(fd, m->uid, m->uid) < 0) {
                rc = sh_err_errno(errno, "writable \"%s\": cannot give it to uid %u", p, (unsigned)m->uid);
                break;
            }
        } else if (st.st_uid != m->uid) {
            rc = st.st_uid >= AGENT_UID_BASE
                     ? sh_err(SH_EPERM, "writable \"%s\": is another tenant's (owned by uid %u)", p,
                              (unsigned)st.st_uid)
                     : sh_err(SH_EPERM, "writable \"%s\": owned by uid %u; a writable folder must be owned by"
                                        " root (the agent gives it to the tenant) or by the tenant's uid %u", p,
                              (unsigned)st.st_uid, (unsigned)m->uid);
        } else if (others_reach(fd, &st, m->uid)) {
            rc = sh_err(SH_EPERM, "writable \"%s\": mode %04o lets other tenants in (chmod go-rwx it, or close a"
                                  " directory above it)", p, (unsigned)st.st_mode & 07777);
        }
    }
    if (rc < 0)
        for (i = 0; i < n; i++)
            if (wfd[i] >= 0) close(wfd[i]), wfd[i] = -1;
    return rc;
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

static void child(agent *a, agent_member *m, const json_t *d, int out, int barrier, int exst, char **argv,
                  char **env, const int *wfd, size_t nw)
{
    signal(SIGUSR1, guard_on_parent_death);
    signal(SIGTERM, SIG_IGN); /* the agent stops the workload, not the guard */
    prctl(PR_SET_PDEATHSIG, SIGUSR1);
    if (getppid() != a->pid) _exit(125);
    /* A session of its own: no controlling terminal, so that no rank
     * reaches the terminal of a foreground agent (TIOCSTI); also a process
     * group of its own. */
    if (setsid() < 0) _exit(125);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(out, 1);
    dup2(out, 2);
    /* Nothing the agent holds open may reach the workload, but the
     * "writable" directories bwrap binds from their descriptors. */
    close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
    if (a->mode == SB_BWRAP)
        for (size_t i = 0; i < nw; i++) fcntl(wfd[i], F_SETFD, 0);
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
    if (chdir(m->workdir) < 0) _exit(126);
    /* Open files per process, soft and hard (the rank cannot raise it);
     * under gVisor the limit is the container's (its spec): the sentry
     * itself needs the host's. */
    struct rlimit nf = {(rlim_t)m->nofile, (rlim_t)m->nofile}, own;
    if (getrlimit(RLIMIT_NOFILE, &own) == 0 && own.rlim_max < nf.rlim_max) nf.rlim_cur = nf.rlim_max = own.rlim_max;
    if (a->mode != SB_GVISOR && m->nofile && setrlimit(RLIMIT_NOFILE, &nf) < 0) _exit(126);
    signal(SIGPIPE, SIG_DFL);
    umask(022);
    int e = -agent__jail_enter(a, m, d, argv, env, wfd);
    if (e) dprintf(2, "shoal agent: cannot enter the sandbox: %s\n", strerror(e));
    else if (a->mode == SB_NONE) {
        /* No jail: the job's environment is the process's own. */
        environ = env;
        execvp(argv[0], argv);
        e = errno;
    } else {
        /* The sandbox tool by the path found at start, with the agent's
         * environment; the job's goes in only inside the sandbox. */
        execve(a->mode == SB_GVISOR ? runsc_path : bwrap_path, argv, agent__tool_env);
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
    size_t nw = json_array_size(json_object_get(d, "writable"));
    int wfd[nw + 1];
    if (a->mode != SB_NONE) SH_TRY(open_writable(a, m, d, wfd));
    else nw = 0;
    int rc = sh_mkdir_p(a->cfg.work_dir, 0700);
    if (rc == SH_OK && mkdir(m->workdir, 0700) < 0 && errno != EEXIST) rc = sh_err_errno(errno, "mkdir %s", m->workdir);
    /* A file system of the rank's disk share, before the jail binds it;
     * where none can be made, the share is measured (quota.c). */
    if (rc == SH_OK && a->mke2fs[0] && agent__disk_mount(a, m) < 0)
        sh_warn("agent %s: %s; its disk share is measured instead", a->cfg.name, sh_errmsg());
    if (rc == SH_OK && chown(m->workdir, m->uid, m->uid) < 0) rc = sh_err_errno(errno, "chown %s", m->workdir);
    if (rc == SH_OK) rc = agent__workdir(a, m, d); /* the job's code (workdir.c) */
    char **argv = rc == SH_OK ? build_argv(a, m, d, wfd) : NULL;
    char **env = argv ? agent__rank_env(m, d) : NULL;
    int out[2] = {-1, -1}, bar[2] = {-1, -1}, ex[2] = {-1, -1};
    if (rc == SH_OK && (!argv || !env)) rc = sh_err(SH_ENOMEM, "member argv");
    if (rc == SH_OK && (pipe2(out, O_CLOEXEC) < 0 || pipe2(bar, O_CLOEXEC) < 0 || pipe2(ex, O_CLOEXEC) < 0))
        rc = sh_err_errno(errno, "pipe");
    pid_t pid = rc == SH_OK ? fork() : -1;
    if (pid == 0) child(a, m, d, out[1], bar[0], ex[1], argv, env, wfd, nw);
    for (size_t i = 0; i < nw; i++) close(wfd[i]);
    for (char **p = argv; p && *p; p++) free(*p);
    free(argv);
    agent__env_free(env);
    if (rc < 0) {
        for (int i = 0; i < 2; i++) {
            if (out[i] >= 0) close(out[i]);
            if (bar[i] >= 0) close(bar[i]);
            if (ex[i] >= 0) close(ex[i]);
        }
        return rc;
    }
    close(out[1]);
    close(bar[0]);
    close(ex[1]);
    if (pid < 0) {
        close(out[0]);
        close(bar[1]);
        close(ex[0]);
        return sh_err_errno(errno, "fork");
    }
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
        /* No cgroup: walk /proc for the guard's descendants (bwrap's
         * --new-session puts the workload in a session and process group
         * of its own, so the guard's group holds only the guard and bwrap). */
        sh_buf b = {0};
        pid_t (*pp)[2] = NULL; /* pid, parent */
        size_t n = 0, cap = 0;
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char sp[64], st[512];
            int pid = atoi(e->d_name), ppid = 0;
            snprintf(sp, sizeof sp, "/proc/%d/stat", pid);
            FILE *sf = pid > 0 ? fopen(sp, "r") : NULL;
            const char *rp = sf && fgets(st, sizeof st, sf) ? strrchr(st, ')') : NULL;
            if (sf) fclose(sf);
            if (!rp || sscanf(rp, ") %*c %d", &ppid) != 1) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                void *np = realloc(pp, cap * sizeof *pp);
                if (!np) break;
                pp = np;
            }
            pp[n][0] = pid, pp[n][1] = ppid, n++;
        }
        if (d) closedir(d);
        /* The guard, then every process whose parent is in the list. */
        sh_buf_printf(&b, "%d\n", (int)m->pid);
        for (int grew = 1; grew;) {
            grew = 0;
            for (size_t i = 0; i < n; i++) {
                char pat[24];
                snprintf(pat, sizeof pat, "\n%d\n", (int)pp[i][1]);
                sh_buf_append(&b, "", 1);
                int in = (int)pp[i][1] == (int)m->pid || strstr((char *)b.data, pat);
                b.len--;
                if (in && pp[i][0] != m->pid) {
                    sh_buf_printf(&b, "%d\n", (int)pp[i][0]);
                    pp[i][1] = -1; /* listed */
                    pp[i][0] = -1;
                    grew = 1;
                }
            }
        }
        free(pp);
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
