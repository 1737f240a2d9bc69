/* --sandbox gvisor: each member runs under gVisor's runsc, from an OCI
 * bundle the agent writes outside the member's view (docs/security.md).
 *
 * The bundle's root is the host's / read-only, as the sentry's gofer sees
 * it after jail.c's mount preparation (hidden work root and state
 * directory, "writable" directories attached from their descriptors); the member's work
 * directory, its "writable" directories and a private /tmp are mounted
 * into it, and /proc, /sys and /dev are the sentry's own.  The process runs
 * as the member's uid with no capabilities and no_new_privs, and the pids,
 * memory and CPU limits go into the spec as well as onto the host cgroups
 * that hold the sentry.
 *
 * What works here (Debian 12's runsc 0.0~20221219 on this kernel): only
 * the ptrace platform (no /dev/kvm; "systrap" is newer than this build);
 * `runsc do` and `runsc run` both run programs, but this build refuses
 * statx() with AT_NO_AUTOMOUNT (EINVAL), which coreutils 9.1's `ls` and
 * `stat` pass, so those two fail while getdents, fstatat and everything
 * else used by shells, Python and shoal work.  The probe below runs a real
 * container and checks that it lists a directory and reads a file. */
#include "agent_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const runsc_flags[] = {"--platform=ptrace", "--network=host", "--ignore-cgroups", NULL};

static json_t *mount_of(const char *dst, const char *type, const char *src, const char *opts)
{
    json_t *o = json_array();
    for (const char *p = opts; p && *p;) {
        const char *c = strchr(p, ',');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        json_array_append_new(o, json_stringn(p, n));
        p = c ? c + 1 : p + n;
    }
    return json_pack("{s:s,s:s,s:s,s:o}", "destination", dst, "type", type, "source", src, "options", o);
}

/* The OCI spec of one container. */
static json_t *spec(const char *cwd, uid_t uid, json_t *args, json_t *env, json_t *mounts, long long pids,
                    long long mem, long long quota, long long nofile)
{
    json_t *caps = json_pack("{s:[],s:[],s:[],s:[],s:[]}", "bounding", "effective", "inheritable", "permitted",
                             "ambient");
    json_t *res = json_pack("{s:{s:I},s:{s:I},s:{s:I,s:I}}", "pids", "limit", (json_int_t)pids, "memory", "limit",
                            (json_int_t)mem, "cpu", "quota", (json_int_t)quota, "period", (json_int_t)100000);
    json_t *ns = json_pack("[{s:s},{s:s},{s:s},{s:s}]", "type", "pid", "type", "ipc", "type", "uts", "type", "mount");
    json_t *sp = json_pack("{s:s,s:{s:b,s:{s:i,s:i},s:o,s:o,s:s,s:o,s:b},s:{s:s,s:b},s:s,s:o,s:{s:o,s:o}}",
                     "ociVersion", "1.0.2", "process", "terminal", 0, "user", "uid", (int)uid, "gid", (int)uid,
                     "args", args, "env", env, "cwd", cwd, "capabilities", caps, "noNewPrivileges", 1, "root",
                     "path", "/", "readonly", 1, "hostname", "shoal", "mounts", mounts, "linux", "namespaces", ns,
                     "resources", res);
    if (sp && nofile > 0)
        json_object_set_new(json_object_get(sp, "process"), "rlimits",
                            json_pack("[{s:s,s:I,s:I}]", "type", "RLIMIT_NOFILE", "hard", (json_int_t)nofile, "soft",
                                      (json_int_t)nofile));
    return sp;
}

static json_t *base_mounts(void)
{
    json_t *m = json_array();
    json_array_append_new(m, mount_of("/proc", "proc", "proc", "nosuid,noexec,nodev"));
    json_array_append_new(m, mount_of("/dev", "tmpfs", "tmpfs", "nosuid,mode=755"));
    json_array_append_new(m, mount_of("/sys", "sysfs", "sysfs", "nosuid,noexec,nodev,ro"));
    json_array_append_new(m, mount_of("/tmp", "tmpfs", "tmpfs", "nosuid,nodev"));
    return m;
}

/* Writes bundle/config.json and returns runsc's argv (caller frees). */
static char **run_argv(const char *state, const char *bundle, const char *id, json_t *cfg)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", bundle);
    if (sh_mkdir_p(bundle, 0700) < 0 || sh_json_write_atomic(path, cfg) < 0) return NULL;
    char **argv = calloc(16, sizeof *argv);
    if (!argv) return NULL;
    int k = 0;
    argv[k++] = strdup("runsc");
    argv[k++] = strdup("--root");
    argv[k++] = strdup(state);
    for (int i = 0; runsc_flags[i]; i++) argv[k++] = strdup(runsc_flags[i]);
    argv[k++] = strdup("run");
    argv[k++] = strdup("--bundle");
    argv[k++] = strdup(bundle);
    argv[k++] = strdup(id);
    return argv;
}

static void member_id(const agent *a, const agent_member *m, char *id, size_t cap)
{
    snprintf(id, cap, "%s-%d-%lld-%d-%d", a->cfg.name, (int)a->pid, (long long)m->job, m->attempt, m->rank);
}

void agent__gvisor_stage(const agent *a, const agent_member *m, int k, char *out, size_t cap)
{
    char id[256];
    member_id(a, m, id, sizeof id);
    snprintf(out, cap, "%s/.bundles/%s/w%d", a->cfg.work_dir, id, k);
}

char **agent__gvisor_argv(const agent *a, const agent_member *m, const json_t *d)
{
    json_t *args = json_array(), *env = json_array(), *mounts = base_mounts();
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(d, "command"), i, v) json_array_append(args, v);
    char **renv = agent__rank_env(m, d);
    for (char **p = renv; p && *p; p++) json_array_append_new(env, json_string(*p));
    agent__env_free(renv);
    /* A closed ancestor of the work root as an empty tmpfs (the member
     * could not pass it), the "writable" directories, then the hidden paths
     * over them (a writable directory may hold the server's state), then
     * the work directory, which lies under a hidden path. */
    char mask[AGENT_MAX_MASKS][4096], closed[4096];
    int nm = agent__masks(a, mask, closed);
    if (closed[0]) json_array_append_new(mounts, mount_of(closed, "tmpfs", "tmpfs", "nosuid,nodev,noexec,mode=755"));
    json_array_foreach(json_object_get(d, "writable"), i, v) {
        char stage[4200];
        agent__gvisor_stage(a, m, (int)i, stage, sizeof stage);
        if (sh_mkdir_p(stage, 0700) < 0) {
            json_decref(args);
            json_decref(env);
            json_decref(mounts);
            return NULL;
        }
        json_array_append_new(mounts, mount_of(json_string_value(v), "bind", stage, "rbind,rw,nosuid,nodev"));
    }
    for (int k = 0; k < nm; k++) json_array_append_new(mounts, mount_of(mask[k], "tmpfs", "tmpfs", "nosuid,nodev,noexec,mode=755"));
    json_array_append_new(mounts, mount_of(m->workdir, "bind", m->workdir, "rbind,rw,nosuid,nodev"));
    long long pids, mem_mb;
    double cpus;
    agent__limits(a, d, &mem_mb, &pids, &cpus);
    json_t *cfg = spec(m->workdir, m->uid, args, env, mounts, pids, mem_mb << 20, (long long)(cpus * 100000),
                       (long long)m->nofile);
    char state[4200], bundle[4200], id[256];
    snprintf(state, sizeof state, "%s/.runsc", a->cfg.work_dir);
    member_id(a, m, id, sizeof id);
    snprintf(bundle, sizeof bundle, "%s/.bundles/%s", a->cfg.work_dir, id);
    char **argv = cfg ? run_argv(state, bundle, id, cfg) : NULL;
    json_decref(cfg);
    return argv;
}

/* Runs argv with stdout into out; returns the exit status or -1. */
static int run_capture(char **argv, sh_buf *out)
{
    int p[2];
    if (pipe(p) < 0) return -1;
    pid_t c = fork();
    if (c < 0) return -1;
    if (c == 0) {
        close(p[0]);
        dup2(p[1], 1);
        dup2(p[1], 2);
        execve(agent__runsc(), argv, agent__tool_env);
        _exit(127);
    }
    close(p[1]);
    char buf[4096];
    ssize_t n;
    while ((n = read(p[0], buf, sizeof buf)) > 0) sh_buf_append(out, buf, (size_t)n);
    close(p[0]);
    int st;
    while (waitpid(c, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int agent__gvisor_works(char *why, size_t cap)
{
    if (geteuid() != 0) return snprintf(why, cap, "runsc needs root to create sandboxes"), 0;
    char dir[] = "/tmp/shoal-gvisor-probe.XXXXXX";
    if (!mkdtemp(dir)) return snprintf(why, cap, "mkdtemp: %s", strerror(errno)), 0;
    char state[128], bundle[128];
    snprintf(state, sizeof state, "%s/state", dir);
    snprintf(bundle, sizeof bundle, "%s/bundle", dir);
    json_t *args = json_pack("[s,s,s]", "/bin/sh", "-c",
                             "for f in /etc/*; do n=$((n+1)); done; read l < /etc/hostname && echo listed:$n");
    json_t *env = json_pack("[s]", "PATH=/usr/bin:/bin");
    json_t *cfg = spec("/", AGENT_UID_BASE, args, env, base_mounts(), 64, 256ll << 20, 100000, 1024);
    char id[64]; /* runsc names a socket after the id: one per agent */
    snprintf(id, sizeof id, "shoal-probe-%d", (int)getpid());
    char **argv = run_argv(state, bundle, id, cfg);
    json_decref(cfg);
    int ok = 0;
    if (!argv) snprintf(why, cap, "cannot write the probe's bundle: %s", sh_errmsg());
    else {
        sh_buf out = {0};
        int st = run_capture(argv, &out);
        sh_buf_append(&out, "", 1);
        const char *o = (const char *)out.data;
        ok = st == 0 && strstr(o, "listed:") && atoi(strstr(o, "listed:") + 7) > 1;
        if (!ok) {
            char *nl;
            while ((nl = strchr(o, '\n')) && nl[1]) o = nl + 1; /* the last line says why */
            snprintf(why, cap, "%s", st == 127 ? "runsc is not installed (apt-get install runsc)"
                                  : *o     ? o
                                           : "runsc could not run a container");
            if ((nl = strchr(why, '\n'))) *nl = 0;
        }
        sh_buf_free(&out);
        for (char **p = argv; *p; p++) free(*p);
        free(argv);
    }
    sh_rm_rf(dir);
    return ok;
}

void agent__gvisor_cleanup(const agent *a, const agent_member *m)
{
    char p[4200], id[256];
    member_id(a, m, id, sizeof id);
    snprintf(p, sizeof p, "%s/.bundles/%s", a->cfg.work_dir, id);
    sh_rm_rf(p);
    /* runsc removes its state when `run` returns; a killed one leaves it. */
    snprintf(p, sizeof p, "%s/.runsc", a->cfg.work_dir);
    DIR *d = opendir(p);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, id)) {
            char f[4600];
            snprintf(f, sizeof f, "%s/%s", p, e->d_name);
            sh_rm_rf(f);
        }
    if (d) closedir(d);
}
