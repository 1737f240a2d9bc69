/* A member's disk: its work directory may hold at most its share of the
 * work root's file system, in bytes and in files (a job's "disk_mb" may
 * lower the share, never raise it).  Without project quotas the kernel has
 * no per-directory limit, so the agent measures, as kubelet does for a
 * pod's ephemeral-storage limit: every so often it adds up the blocks
 * under each running member's work directory and stops a member that is
 * over, saying why in its log.  A writer can overshoot by what it writes
 * between two looks (docs/security.md). */
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <sys/statvfs.h>

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
    int r = nftw(dir, walk_one, 16, FTW_PHYS | FTW_MOUNT);
    *bytes = walk.bytes;
    *files = walk.files;
    if (r < 0) return sh_err_errno(errno, "walk %s", dir);
    return r > 0; /* over a bound (the walk stopped there) */
}

void agent__disk_init(const agent *a, agent_member *m, const json_t *d)
{
    struct statvfs fs;
    double share = agent__node_share(a, d);
    uint64_t size = 1ull << 40, inodes = 1ull << 24;
    if (statvfs(a->cfg.work_dir, &fs) == 0) {
        size = (uint64_t)fs.f_blocks * fs.f_frsize;
        if (fs.f_files) inodes = fs.f_files;
    }
    m->disk_max = (uint64_t)(size * share);
    m->files_max = (uint64_t)(inodes * share);
    if (m->disk_max < (1ull << 30) && size >= (1ull << 30)) m->disk_max = 1ull << 30;
    if (m->files_max < 10000) m->files_max = 10000;
    json_int_t mb = json_integer_value(json_object_get(d, "disk_mb"));
    if (mb > 0 && (uint64_t)mb << 20 < m->disk_max) m->disk_max = (uint64_t)mb << 20;
    m->disk_next = 0;
}

void agent__disk_check(agent *a, agent_member *m, double now)
{
    if (m->stopping || m->state == AM_EXITED || now < m->disk_next || !m->disk_max) return;
    uint64_t bytes, files;
    double t0 = sh_now_mono();
    int over = agent__dir_usage(m->workdir, m->disk_max, m->files_max, &bytes, &files);
    /* A look every AGENT_DISK_EVERY seconds, and at most a tenth of the
     * agent's time walking (a member with many files is looked at less). */
    double took = sh_now_mono() - t0;
    if (over >= 0) m->disk_used = bytes;
    m->disk_next = now + (10 * took > AGENT_DISK_EVERY ? 10 * took : AGENT_DISK_EVERY);
    if (over <= 0) return;
    sh_buf_printf(&m->log,
                  "shoal agent: the member hit its disk limit (%s in its work directory; limit %llu MiB and "
                  "%llu files); stopped\n",
                  bytes > m->disk_max ? "over the bytes" : "over the files", (unsigned long long)(m->disk_max >> 20),
                  (unsigned long long)m->files_max);
    sh_warn("agent %s: job %lld rank %d: over its disk limit (%llu MiB, %llu files seen); stopping it", a->cfg.name,
            (long long)m->job, m->rank, (unsigned long long)(bytes >> 20), (unsigned long long)files);
    m->stopping = 1;
}
