/* A member's disk: its work directory may hold at most its share of the
 * work root's file system, in bytes and in files (a job's "disk_mb" may
 * lower the share, never raise it).  Where the agent runs as root with
 * loop devices and mke2fs, the work directory is a file system of its
 * own: a sparse ext4 image of exactly the share, loop-mounted nosuid,nodev
 * on the directory, so the kernel refuses (ENOSPC) the write past it.
 * Elsewhere the agent measures, as kubelet does for a pod's
 * ephemeral-storage limit: every so often it adds up the blocks under each
 * running member's work directory and stops a member that is over, saying
 * why in its log; a writer can then overshoot by what it writes between
 * two looks (docs/security.md). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/close_range.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <mntent.h>

#include "agent_int.h"

/* nftw passes no argument to its callback: one walk at a time per thread. */
static __thread struct {
    uint64_t bytes, files, max_bytes, max_files;
} walk;

static int walk_one(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)path, (void)f;
    if (flag == FTW_NS) return 0; /* removed while walked */
    walk.bytes += (uint64_t)st->st_blocks * 512;
    walk.files++;
    return walk.bytes > walk.max_bytes || walk.files > walk.max_files;
}

int agent__dir_usage(const char *dir, uint64_t max_bytes, uint64_t max_files, uint64_t *bytes, uint64_t *files)
{
    walk.bytes = walk.files = 0;
    walk.max_bytes = max_bytes;
    walk.max_files = max_files;
    /* FTW_CHDIR: each name is looked up from its own directory, so a tree
     * deeper than PATH_MAX is measured too. */
    int r = nftw(dir, walk_one, 16, FTW_PHYS | FTW_MOUNT | FTW_CHDIR);
    *bytes = walk.bytes;
    *files = walk.files;
    if (r < 0) return sh_err_errno(errno, "walk %s", dir);
    return r > 0; /* over a bound (the walk stopped there) */
}

int agent__disk_init(const agent *a, agent_member *m, const json_t *d)
{
    struct statvfs fs;
    double share = agent__node_share(a, d);
    uint64_t avail = 1ull << 40, inodes = 1ull << 24, reserve = 0;
    if (statvfs(a->cfg.work_dir, &fs) == 0) {
        /* What is free now, less the reserve: the work root may share its
         * file system with the server's state (shoal up), whose commits
         * must never meet a full disk. */
        uint64_t total = (uint64_t)fs.f_blocks * fs.f_frsize;
        avail = (uint64_t)fs.f_bavail * fs.f_frsize;
        reserve = total / 100 * AGENT_DISK_RESERVE_PCT;
        if (reserve < AGENT_DISK_RESERVE_MIN) reserve = AGENT_DISK_RESERVE_MIN;
        if (fs.f_files) inodes = fs.f_favail > fs.f_files / 20 ? fs.f_favail - fs.f_files / 20 : 0;
        /* The images of live members are sparse: what they may still
         * write is promised already, and not free for this one.  A member
         * being stopped (preempted, cancelled: its successor on these GPUs
         * may launch before it is gone) writes nothing more that counts. */
        for (int i = 0; i < a->nm; i++) {
            const agent_member *o = &a->m[i];
            struct stat st;
            if (o == m || !o->loop || o->state == AM_EXITED || o->stopping || stat(o->img, &st) < 0) continue;
            uint64_t held = (uint64_t)st.st_blocks * 512, left = o->disk_max > held ? o->disk_max - held : 0;
            avail = avail > left ? avail - left : 0;
        }
    }
    if (avail <= reserve || inodes < 1000)
        return sh_err(SH_ENOSPC, "the node's work file system %s has %llu MiB and %llu inodes free beyond"
                                 " its reserve for the control plane (%llu MiB, 5%% of the inodes): no disk share"
                                 " for a new rank",
                      a->cfg.work_dir, (unsigned long long)(avail > reserve ? (avail - reserve) >> 20 : 0),
                      (unsigned long long)inodes, (unsigned long long)(reserve >> 20));
    m->disk_max = (uint64_t)((avail - reserve) * share);
    m->files_max = (uint64_t)(inodes * share);
    if (m->disk_max < (1ull << 20)) m->disk_max = 1ull << 20;
    if (m->files_max < 1000) m->files_max = 1000;
    json_int_t mb = json_integer_value(json_object_get(d, "disk_mb"));
    if (mb > 0 && (uint64_t)mb << 20 < m->disk_max) m->disk_max = (uint64_t)mb << 20;
    /* Open files: each process at most nofile (RLIMIT_NOFILE, which the
     * rank cannot raise), the rank's processes together at most its share
     * of half the node's file table (fs.file-max), counted by the agent. */
    m->fds_max = (uint64_t)(a->file_max / 2 * share);
    if (m->fds_max < 4096) m->fds_max = 4096;
    m->nofile = m->fds_max < AGENT_NOFILE ? m->fds_max : AGENT_NOFILE;
    m->disk_next = 0;
    return SH_OK;
}

/* Open files of the processes in the cgroup dir (its cgroup.procs),
 * counted until over max. */
static uint64_t count_fds(const char *cg, uint64_t max)
{
    char p[700], line[32];
    snprintf(p, sizeof p, "%s/cgroup.procs", cg);
    FILE *f = cg[0] ? fopen(p, "r") : NULL;
    uint64_t n = 0;
    while (f && n <= max && fgets(line, sizeof line, f)) {
        snprintf(p, sizeof p, "/proc/%d/fd", atoi(line));
        DIR *d = opendir(p);
        struct dirent *e;
        while (d && n <= max && (e = readdir(d))) n += e->d_name[0] != '.';
        if (d) closedir(d);
    }
    if (f) fclose(f);
    return n;
}

/* What a measuring child sends back. */
typedef struct disk_result {
    int over;
    uint64_t bytes, files, fds;
} disk_result;

/* Ends a measure under way (the member is gone or done). */
void agent__disk_abort(agent_member *m)
{
    if (m->disk_pid > 0) {
        kill(m->disk_pid, SIGKILL);
        while (waitpid(m->disk_pid, NULL, 0) < 0 && errno == EINTR) {}
    }
    if (m->disk_fd >= 0) close(m->disk_fd);
    m->disk_pid = 0;
    m->disk_fd = -1;
}

typedef struct disk_walk {
    agent_member *m;
    disk_result *r;
} disk_walk;

static uint64_t image_used(const agent_member *m, int *full);

static void *disk_walk_run(void *arg)
{
    disk_walk *w = arg;
    if (w->m->loop) { /* the kernel bounds it: only what it holds, for the reports */
        int full;
        w->r->bytes = image_used(w->m, &full);
        return NULL;
    }
    w->r->over = agent__dir_usage(w->m->workdir, w->m->disk_max, w->m->files_max, &w->r->bytes, &w->r->files);
    return NULL;
}

/* Starts a measure of m's work directory in a child process: the walk
 * (however many files, however deep) never holds the agent's loop, and a
 * tree that crashes it crashes the child only. */
static void disk_start(agent_member *m, double now)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return;
    pid_t c = fork();
    if (c < 0) {
        close(p[0]);
        close(p[1]);
        return;
    }
    if (c == 0) {
        close(p[0]);
        setpriority(PRIO_PROCESS, 0, 10);
        disk_result r = {0};
        r.fds = count_fds(m->cg[1][0] ? m->cg[1] : m->cg[0], m->fds_max);
        /* nftw recurses once per level: on a thread with a 1 GiB stack
         * (address space, touched only as deep as the tree goes). */
        disk_walk w = {m, &r};
        pthread_attr_t at;
        pthread_t th;
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, 1ull << 30);
        if (pthread_create(&th, &at, disk_walk_run, &w) == 0) pthread_join(th, NULL);
        else disk_walk_run(&w);
        _exit(write(p[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 1);
    }
    close(p[1]);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    m->disk_pid = c;
    m->disk_fd = p[0];
    m->disk_t0 = now;
}

void agent__disk_check(agent *a, agent_member *m, double now)
{
    if (m->stopping || m->state == AM_EXITED || !m->disk_max) {
        agent__disk_abort(m);
        return;
    }
    if (m->disk_pid <= 0) {
        if (now >= m->disk_next) disk_start(m, now);
        return;
    }
    disk_result r;
    ssize_t n = read(m->disk_fd, &r, sizeof r);
    if (n < 0 && errno == EAGAIN) return; /* still walking */
    agent__disk_abort(m);
    /* A look every AGENT_DISK_EVERY seconds, and at most a tenth of the
     * time walking (a member with many files is looked at less). */
    double took = now - m->disk_t0;
    m->disk_next = now + (10 * took > AGENT_DISK_EVERY ? 10 * took : AGENT_DISK_EVERY);
    int unmeasurable = n != (ssize_t)sizeof r;
    if (unmeasurable) r.over = 1, r.bytes = r.files = 0;
    if (r.over >= 0 && !unmeasurable) m->disk_used = r.bytes;
    agent__disk_note_full(m);
    if (!unmeasurable && r.fds > m->fds_max) {
        sh_buf_printf(&m->log,
                      "shoal agent: the member hit its open-files limit (%llu files open across its processes;"
                      " limit %llu, and %llu per process); stopped\n",
                      (unsigned long long)r.fds, (unsigned long long)m->fds_max, (unsigned long long)m->nofile);
        sh_warn("agent %s: job %lld rank %d: over its open-files limit (%llu); stopping it", a->cfg.name,
                (long long)m->job, m->rank, (unsigned long long)r.fds);
        m->stopping = m->over = 1;
        return;
    }
    if (r.over <= 0) return;
    uint64_t bytes = r.bytes, files = r.files;
    sh_buf_printf(&m->log,
                  "shoal agent: the member hit its disk limit (%s in its work directory; limit %llu MiB and "
                  "%llu files); stopped\n",
                  unmeasurable ? "a tree the agent could not measure"
                  : bytes > m->disk_max ? "over the bytes" : "over the files", (unsigned long long)(m->disk_max >> 20),
                  (unsigned long long)m->files_max);
    sh_warn("agent %s: job %lld rank %d: over its disk limit (%llu MiB, %llu files seen); stopping it", a->cfg.name,
            (long long)m->job, m->rank, (unsigned long long)(bytes >> 20), (unsigned long long)files);
    m->stopping = m->over = 1;
}

/* ---- loop-mounted work directories ---- */

static void disk_sweep(const agent *a);

void agent__disk_probe(agent *a)
{
    a->mke2fs[0] = 0;
    if (geteuid() != 0) {
        snprintf(a->loop_why, sizeof a->loop_why, "the agent is not root");
        return;
    }
    int fd = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(a->loop_why, sizeof a->loop_why, "/dev/loop-control: %s", strerror(errno));
        return;
    }
    close(fd);
    char p[4096];
    if (agent__find_tool("mke2fs", p, sizeof p) < 0) {
        snprintf(a->loop_why, sizeof a->loop_why, "%s (apt-get install e2fsprogs)", sh_errmsg());
        return;
    }
    snprintf(a->mke2fs, sizeof a->mke2fs, "%s", p);
    disk_sweep(a);
}

/* What an agent of this name left behind when it was killed: its ranks'
 * images, mounted on their work directories under the work root. */
static void disk_sweep(const agent *a)
{
    char pre[4200];
    snprintf(pre, sizeof pre, "%s/%s-", a->cfg.work_dir, a->cfg.name);
    size_t n = strlen(pre);
    FILE *f = setmntent("/proc/self/mounts", "r");
    struct mntent *e;
    while (f && (e = getmntent(f)))
        if (!strncmp(e->mnt_dir, pre, n) && !strchr(e->mnt_dir + n, '/') && umount2(e->mnt_dir, MNT_DETACH) == 0)
            sh_warn("agent %s: unmounted %s, left by an agent of this name that ended without cleaning up",
                    a->cfg.name, e->mnt_dir);
    if (f) endmntent(f);
    DIR *d = opendir(a->cfg.work_dir);
    struct dirent *de;
    size_t nn = strlen(a->cfg.name), l;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, a->cfg.name, nn) && de->d_name[nn] == '-' && (l = strlen(de->d_name)) > 4 &&
            !strcmp(de->d_name + l - 4, ".img"))
            unlinkat(dirfd(d), de->d_name, 0);
    if (d) closedir(d);
}

/* mke2fs on the image: no journal and lazy inode tables (a few tens of
 * milliseconds whatever the size, and the sparse image stays small), no
 * blocks kept for root, the root directory the rank's. */
static int make_fs(const agent *a, const agent_member *m, uint64_t inodes)
{
    char ext[128], n[32];
    snprintf(ext, sizeof ext, "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=%u:%u", (unsigned)m->uid,
             (unsigned)m->uid);
    snprintf(n, sizeof n, "%llu", (unsigned long long)inodes);
    char *argv[] = {"mke2fs", "-q", "-F", "-t", "ext4", "-m", "0", "-O", "^has_journal", "-N", n, "-E", ext,
                    (char *)m->img, NULL};
    pid_t p = fork();
    if (p < 0) return sh_err_errno(errno, "fork");
    if (p == 0) {
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) dup2(nul, 1);
        syscall(SYS_close_range, 3, ~0u, 0);
        execve(a->mke2fs, argv, agent__tool_env);
        _exit(127);
    }
    int st;
    while (waitpid(p, &st, 0) < 0)
        if (errno != EINTR) return sh_err_errno(errno, "waitpid mke2fs");
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        return sh_err(SH_EIO, "%s %s: exit status %d", a->mke2fs, m->img, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return SH_OK;
}

/* A free loop device bound to the image fd (detached again by the kernel
 * once unmounted: autoclear); its path into dev. */
static int loop_attach(int img, char *dev, size_t cap)
{
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0) return sh_err_errno(errno, "/dev/loop-control");
    int rc = sh_err(SH_EAGAIN, "no free loop device");
    for (int tries = 0; tries < 16; tries++) {
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0) {
            rc = sh_err_errno(errno, "LOOP_CTL_GET_FREE");
            break;
        }
        snprintf(dev, cap, "/dev/loop%d", n);
        int fd = open(dev, O_RDWR | O_CLOEXEC);
        /* A container's /dev may lack the node the kernel just made. */
        if (fd < 0 && errno == ENOENT && mknod(dev, S_IFBLK | 0600, makedev(7, n)) == 0)
            fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            rc = sh_err_errno(errno, "%s", dev);
            break;
        }
        struct loop_config lc = {.fd = (unsigned)img, .info = {.lo_flags = LO_FLAGS_AUTOCLEAR}};
        int r = ioctl(fd, LOOP_CONFIGURE, &lc);
        if (r < 0 && (errno == EINVAL || errno == ENOTTY)) { /* before Linux 5.8 */
            struct loop_info64 li = {.lo_flags = LO_FLAGS_AUTOCLEAR};
            r = ioctl(fd, LOOP_SET_FD, img);
            if (r == 0 && ioctl(fd, LOOP_SET_STATUS64, &li) < 0) {
                int e = errno;
                ioctl(fd, LOOP_CLR_FD, 0);
                errno = e;
                r = -1;
            }
        }
        if (r == 0) {
            close(ctl);
            return fd;
        }
        rc = sh_err_errno(errno, "%s: bind the image", dev);
        close(fd);
        if (errno != EBUSY) break; /* else taken meanwhile: another */
    }
    close(ctl);
    return rc;
}

int agent__disk_mount(const agent *a, agent_member *m)
{
    if (!a->mke2fs[0]) return sh_err(SH_EINVAL, "%s", a->loop_why);
    double t0 = sh_now_mono();
    snprintf(m->img, sizeof m->img, "%s.img", m->workdir);
    uint64_t size = m->disk_max & ~4095ull;
    /* Inodes: the files share, at most one per 8 KiB of the image. */
    uint64_t inodes = m->files_max < size / 8192 ? m->files_max : size / 8192;
    if (inodes < 1024) inodes = 1024;
    unlink(m->img);
    int img = open(m->img, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (img < 0) return sh_err_errno(errno, "create %s", m->img);
    int rc = ftruncate(img, (off_t)size) < 0 ? sh_err_errno(errno, "size %s", m->img) : SH_OK;
    if (rc == SH_OK) rc = make_fs(a, m, inodes);
    char dev[64];
    int lfd = rc == SH_OK ? loop_attach(img, dev, sizeof dev) : -1;
    if (rc == SH_OK && lfd < 0) rc = lfd;
    close(img);
    /* noinit_itable: the kernel does not zero the inode tables behind the
     * rank (they read as zeros in a sparse file already). */
    if (rc == SH_OK && mount(dev, m->workdir, "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME, "noinit_itable") < 0)
        rc = sh_err_errno(errno, "mount %s on %s", dev, m->workdir);
    if (lfd >= 0) close(lfd); /* the mount holds the device now; autoclear frees it after */
    if (rc < 0) {
        unlink(m->img);
        m->img[0] = 0;
        return sh_err_wrap(rc, "job %lld rank %d: work directory as a file system of its own", (long long)m->job,
                           m->rank);
    }
    m->loop = 1;
    m->files_max = inodes;
    char lf[1100];
    snprintf(lf, sizeof lf, "%s/lost+found", m->workdir);
    rmdir(lf); /* the rank's directory starts empty */
    if (chmod(m->workdir, 0700) < 0) sh_warn("chmod %s: %s", m->workdir, strerror(errno));
    struct statvfs fs;
    if (statvfs(m->workdir, &fs) == 0) m->disk_base = (uint64_t)(fs.f_blocks - fs.f_bfree) * fs.f_frsize;
    sh_debug("agent %s: job %lld rank %d: work directory a %llu MiB file system (%llu inodes, %s) in %.0f ms",
             a->cfg.name, (long long)m->job, m->rank, (unsigned long long)(size >> 20), (unsigned long long)inodes,
             dev, (sh_now_mono() - t0) * 1000);
    return SH_OK;
}

void agent__disk_unmount(const agent_member *m)
{
    if (!m->loop) return;
    /* Detached: a process of the sandbox that still holds a file there
     * (gVisor's gofer, say) keeps it until it lets go; the loop device
     * goes with the last user. */
    if (umount2(m->workdir, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
        sh_warn("agent: umount %s: %s", m->workdir, strerror(errno));
    if (unlink(m->img) < 0 && errno != ENOENT) sh_warn("agent: unlink %s: %s", m->img, strerror(errno));
}

/* Bytes used on m's image file system beyond the empty one; sets *full
 * when less than 1 MiB (or a sixteenth of a small one) or no inode is
 * left. */
static uint64_t image_used(const agent_member *m, int *full)
{
    struct statvfs fs;
    *full = 0;
    if (statvfs(m->workdir, &fs) < 0) return 0;
    uint64_t used = (uint64_t)(fs.f_blocks - fs.f_bfree) * fs.f_frsize;
    uint64_t total = (uint64_t)fs.f_blocks * fs.f_frsize, left = (uint64_t)fs.f_bavail * fs.f_frsize;
    uint64_t slack = total / 16 < (1u << 20) ? total / 16 : (1u << 20);
    *full = left <= slack || fs.f_favail == 0;
    return used > m->disk_base ? used - m->disk_base : 0;
}

void agent__disk_note_full(agent_member *m)
{
    int full;
    if (!m->loop || m->disk_noted) return;
    uint64_t used = image_used(m, &full);
    if (used) m->disk_used = used;
    if (!full) return;
    m->disk_noted = 1;
    /* The kernel refuses the writes: the rank goes on, and decides. */
    sh_buf_printf(&m->log,
                  "shoal agent: the member hit its disk limit (its work directory is a file system of %llu MiB and"
                  " %llu files, now full: writes there fail with ENOSPC)\n",
                  (unsigned long long)(m->disk_max >> 20), (unsigned long long)m->files_max);
}
