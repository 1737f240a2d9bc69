/* One process fan-out for experiments (the RL sweep, the fleet-cost experiment): `total` tasks, each
 * in a child process of its own, up to `jobs` at a time.
 *
 * A task's process reports progress as lines "S <units>" on its pipe (done
 * so far, sh_fanout_step) and ends with "R <result JSON>" or "E <message>"
 * (written by sh_fanout itself from what the task returns).  A task's
 * process ends with the caller's (PR_SET_PDEATHSIG): Ctrl-C or a kill stops
 * every run, and whatever processes each run started see their pipes and
 * sockets close. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "shoal/common.h"

typedef struct slot {
    pid_t pid;
    int fd, task, units;
    sh_buf in;
} slot;

void sh_fanout_step(int fd, int units) { dprintf(fd, "S %d\n", units); }

static void __attribute__((noreturn)) child(sh_task_fn fn, void *arg, int task, int fd)
{
    int rc = 0;
    json_t *r = fn(arg, task, fd, &rc);
    char *s = r ? json_dumps(r, JSON_COMPACT) : NULL;
    if (s) dprintf(fd, "R %s\n", s);
    else dprintf(fd, "E %s\n", rc ? sh_errmsg() : "out of memory");
    _exit(s ? 0 : 1);
}

static int start(slot *sl, sh_task_fn fn, void *arg, int task)
{
    int pfd[2];
    if (pipe(pfd)) return sh_err_errno(errno, "fan-out: pipe");
    fflush(NULL);
    sl->pid = fork();
    if (sl->pid < 0) {
        close(pfd[0]), close(pfd[1]);
        return sh_err_errno(errno, "fan-out: fork");
    }
    if (!sl->pid) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1) _exit(1);
        close(pfd[0]);
        child(fn, arg, task, pfd[1]);
    }
    close(pfd[1]);
    sl->fd = pfd[0], sl->task = task, sl->units = 0, sl->in = (sh_buf){0};
    return 0;
}

/* Reads what a task sent; 1 when it has ended (its result in *res, or an
 * error recorded), 0 while it goes on. */
static int read_task(slot *sl, json_t **res, int *rc)
{
    char b[65536];
    ssize_t n = read(sl->fd, b, sizeof b);
    if (n < 0 && errno == EINTR) return 0;
    if (n > 0) {
        if (sh_buf_append(&sl->in, b, (size_t)n)) return *rc = SH_ENOMEM, 1;
        char *line = (char *)sl->in.data, *end = line + sl->in.len, *nl;
        while ((nl = memchr(line, '\n', (size_t)(end - line)))) {
            *nl = 0;
            if (line[0] == 'S') sl->units = atoi(line + 2);
            else if (line[0] == 'R') *res = json_loads(line + 2, 0, NULL);
            else if (line[0] == 'E') *rc = sh_err(SH_EIO, "task %d: %s", sl->task, line + 2);
            if (line[0] != 'S') return 1;
            line = nl + 1;
        }
        memmove(sl->in.data, line, (size_t)(end - line));
        sl->in.len = (size_t)(end - line);
        return 0;
    }
    *rc = sh_err(SH_EIO, "task %d ended without a result", sl->task);
    return 1;
}

static void end(slot *sl)
{
    close(sl->fd);
    sh_buf_free(&sl->in);
    waitpid(sl->pid, NULL, 0);
    sl->pid = 0;
}

int sh_fanout(int total, int jobs, int units_each, sh_task_fn fn, void *arg, sh_units_fn progress,
              void *parg, json_t **results)
{
    if (jobs < 1 || jobs > 64) return sh_err(SH_EINVAL, "fan-out: %d processes at once, allowed 1..64", jobs);
    int next = 0, live = 0, rc = 0;
    slot *sl = calloc((size_t)jobs, sizeof *sl);
    if (!sl) return sh_err(SH_ENOMEM, "fan-out");
    uint64_t done = 0;
    while ((next < total && !rc) || live) {
        struct pollfd pf[64];
        int np = 0;
        for (int j = 0; j < jobs; j++) {
            if (!sl[j].pid && next < total && !rc) {
                if ((rc = start(&sl[j], fn, arg, next))) continue;
                next++, live++;
            }
            if (sl[j].pid) pf[np++] = (struct pollfd){.fd = sl[j].fd, .events = POLLIN};
        }
        if (!np) break;
        if (poll(pf, (nfds_t)np, -1) < 0 && errno != EINTR) {
            rc = sh_err_errno(errno, "fan-out: poll");
            break;
        }
        uint64_t running = 0;
        for (int j = 0; j < jobs; j++) {
            if (!sl[j].pid) continue;
            json_t *r = NULL;
            int k = 0;
            for (int q = 0; q < np; q++) k |= pf[q].fd == sl[j].fd && pf[q].revents;
            if (k && read_task(&sl[j], &r, &rc)) {
                results[sl[j].task] = r;
                if (!r && !rc) rc = sh_err(SH_EFORMAT, "task %d: its result is not JSON", sl[j].task);
                done += (uint64_t)units_each, live--;
                end(&sl[j]);
            } else {
                running += (uint64_t)sl[j].units;
            }
        }
        if (progress) progress(parg, done + running);
    }
    free(sl);
    return rc;
}
