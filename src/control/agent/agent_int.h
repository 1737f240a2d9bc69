/* Internal state of a node agent (src/control/agent only). */
#ifndef SHOAL_AGENT_INT_H
#define SHOAL_AGENT_INT_H

#include <sys/types.h>

#include "shoal/agent.h"
#include "shoal/common.h"
#include "shoal/client.h"

enum { AM_READY, AM_RUNNING, AM_EXITED };
enum { SB_NONE, SB_BWRAP, SB_GVISOR };

#define AGENT_MAX_PROTECT 8
#define AGENT_MAX_MASKS (2 + AGENT_MAX_PROTECT)
/* Placeholder in a member's argv for the seccomp filter's fd. */
#define AGENT_SECCOMP_FD "@shoal-seccomp-fd@"
/* ... and for the fd of the rank's environment (bwrap --args). */
#define AGENT_ENV_FD "@shoal-env-fd@"
/* Members run as uid/gid AGENT_UID_BASE + the tenant's number (the server
 * numbers tenants): far above any account a system creates. */
#define AGENT_UID_BASE 2000000000u

typedef struct agent_member {
    int64_t job;
    int attempt, rank, state, exit_code;
    double ended_at; /* wall seconds it was reaped ("ended_at" in reports) */
    int reported;  /* the exit was sent in a poll */
    int stopping;  /* the server no longer wants it, or it is over a limit */
    int over;      /* over its disk or open-files limit: stopped whatever the server wants */
    pid_t pid;
    uid_t uid;     /* the member's uid and gid */
    int out_fd, barrier_fd, exec_fd;
    double kill_at;
    sh_buf log;    /* output not yet shipped */
    size_t sent;   /* bytes of log in the poll under way */
    char workdir[1024];
    char cg[3][640]; /* memory, pids, cpu */
    uint64_t disk_max, files_max; /* the work directory's bounds (quota.c) */
    uint64_t disk_used;           /* bytes it held at the last look (0: none yet) */
    double disk_next;             /* when it is measured next (monotonic) */
    uint64_t fds_max, nofile;     /* open files: the rank's together, one process's */
    pid_t disk_pid;               /* the child measuring it, or 0 */
    int disk_fd;                  /* its result pipe, or -1 */
    double disk_t0;               /* when that measure started */
    int loop;                     /* its work directory is a loop-mounted image (quota.c) */
    int disk_noted;               /* "hit its disk limit" is in its log */
    uint64_t disk_base;           /* bytes the image's empty file system uses */
    char img[1040];               /* that image, beside the work directory */
} agent_member;

typedef struct agent {
    agent_config cfg;
    client_conn *cl;
    pid_t pid;
    int mode;       /* SB_* */
    char sandbox[160];
    char cg_root[3][256]; /* memory, pids, cpu; "" where unusable */
    char protect[AGENT_MAX_PROTECT][1024]; /* paths the server asked to hide */
    int nprotect;
    long long mem_mb; /* the node's memory */
    uint64_t file_max; /* the node's file table (fs.file-max) */
    int ncpu;
    char gpu_type[64];
    char work_abs[4096];
    int gpus;
    agent_member *m;
    int nm, cap;
    int64_t version;
    size_t log_budget; /* bytes of JSON output one poll may carry */
    pid_t cleaners[64]; /* children removing finished work directories */
    char mke2fs[4096];  /* mke2fs's absolute path, "" without loop images */
    char loop_why[256]; /* why work directories are measured, not images */
    int ncleaners;
} agent;

/* The output one poll carries when the server does not say its largest
 * request body (half of its default, 1 MiB). */
#define AGENT_LOG_BUDGET (512u << 10)

/* Seconds between two measures of a member's work directory (quota.c). */
#define AGENT_DISK_EVERY 0.5

int agent__launch(agent *a, agent_member *m, const json_t *desired);
/* workdir.c: fetches and unpacks the job's "workdir" archive into
 * m->workdir (nothing when the job ships none). */
int agent__workdir(agent *a, agent_member *m, const json_t *d);
/* The share of the node a member's GPUs are (1 on a node without GPUs). */
double agent__node_share(const agent *a, const json_t *d);
/* Bytes and files under dir (not crossing mounts); 1 when the walk
 * stopped over max_bytes or max_files, 0 under them, or an SH_E* code. */
int agent__dir_usage(const char *dir, uint64_t max_bytes, uint64_t max_files, uint64_t *bytes, uint64_t *files);
/* Sets m's disk bounds: its share of the work root's file system, lowered
 * by the job's disk_mb. */
int agent__disk_init(const agent *a, agent_member *m, const json_t *d);
/* The share of the work file system kept free for the control plane. */
#define AGENT_DISK_RESERVE_PCT 5
#define AGENT_DISK_RESERVE_MIN (512ull << 20)
/* Open files one process of a rank may hold (RLIMIT_NOFILE). */
#define AGENT_NOFILE 65536u
/* Measures m's work directory when due; a member over its bounds is told
 * why in its log and stopped. */
void agent__disk_check(agent *a, agent_member *m, double now);
/* Whether work directories can be loop-mounted images here (mke2fs, a
 * loop device, root); sets a->mke2fs, or a->loop_why. */
void agent__disk_probe(agent *a);
/* Makes m's work directory (created, empty) a file system of its own, an
 * ext4 image of m->disk_max bytes and about m->files_max inodes, mounted
 * nosuid,nodev and owned by the rank; SH_OK, or an error (the directory
 * is then left measured). */
int agent__disk_mount(const agent *a, agent_member *m);
/* In a cleaner process: unmounts and deletes m's image, if any. */
void agent__disk_unmount(const agent_member *m);
/* Notes in m's log once when its image is full ("hit its disk limit"). */
void agent__disk_note_full(agent_member *m);
/* Stops a measure of m's work directory that is under way. */
void agent__disk_abort(agent_member *m);
int agent__release(agent *a, agent_member *m);
void agent__stop(agent *a, agent_member *m, double now);
void agent__cgroup_cleanup(agent_member *m);
/* Appends to the member's log why its cgroups refused it anything. */
void agent__limit_report(agent_member *m);
void agent__cgroup_sweep(const char *root);
void agent__cgroup_root(const char *ctl, char *out, size_t cap);
/* The member's pids, memory and CPU limits: the job's own, else the node's
 * share (sandbox.c). */
void agent__limits(const agent *a, const json_t *d, long long *mem_mb, long long *npids, double *cpus);
/* In the workload process, before the exec of argv: enters the member's
 * jail (src/control/agent/jail.c); returns 0 or -errno. */
int agent__jail_enter(const agent *a, const agent_member *m, const json_t *d, char **argv, char **env,
                      const int *wfd);
/* The absolute path of a sandbox tool on the agent's PATH, into out; an
 * error unless it and every directory above it are root's and writable by
 * root only (sandbox.c). */
int agent__find_tool(const char *name, char *out, size_t cap);
/* runsc's path, found when gVisor was probed. */
const char *agent__runsc(void);
/* The environment the sandbox tools run with (the agent's, never a job's). */
extern char *const agent__tool_env[];
/* The rank's environment: the one place it is built ("K=V", NULL-ended;
 * free with agent__env_free). */
char **agent__rank_env(const agent_member *m, const json_t *d);
void agent__env_free(char **env);
/* The paths a member must not see, into masks; returns how many: the work
 * root and the protected paths the server named that exist here (the
 * outermost of them).  closed (4096 bytes, may be NULL) gets the work
 * root's topmost ancestor others may not enter, or "". */
int agent__masks(const agent *a, char (*masks)[4096], char *closed);
/* 1 if path is dir or lies under it. */
int agent__under(const char *path, const char *dir);
/* gvisor.c: whether runsc runs a container here (why not, into why), and
 * the member's OCI bundle and argv under runsc. */
int agent__gvisor_works(char *why, size_t cap);
char **agent__gvisor_argv(const agent *a, const agent_member *m, const json_t *d);
void agent__gvisor_cleanup(const agent *a, const agent_member *m);
/* Where the idmapped view of the member's k-th "writable" directory is
 * mounted for runsc: an empty directory in its bundle. */
void agent__gvisor_stage(const agent *a, const agent_member *m, int k, char *out, size_t cap);

#endif
