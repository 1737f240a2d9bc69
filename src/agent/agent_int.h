/* Internal state of a node agent (src/agent only). */
#ifndef SHOAL_AGENT_INT_H
#define SHOAL_AGENT_INT_H

#include <sys/types.h>

#include "shoal/agent.h"
#include "shoal/common.h"
#include "shoal/server.h"

enum { AM_READY, AM_RUNNING, AM_EXITED };

typedef struct agent_member {
    int64_t job;
    int attempt, rank, state, exit_code;
    int reported;  /* the exit was sent in a poll */
    int stopping;  /* the server no longer wants it */
    pid_t pid;
    int out_fd, barrier_fd, exec_fd;
    double kill_at;
    sh_buf log;    /* output not yet shipped */
    char workdir[1024];
    char cg[2][640];
} agent_member;

typedef struct agent {
    agent_config cfg;
    srv_client *cl;
    pid_t pid;
    int use_bwrap;
    char sandbox[160];
    char cg_mem[256], cg_pids[256];
    char gpu_type[64];
    char work_abs[4096];
    int gpus;
    agent_member *m;
    int nm, cap;
    int64_t version;
} agent;

int agent__launch(agent *a, agent_member *m, const json_t *desired);
int agent__release(agent *a, agent_member *m);
void agent__stop(agent *a, agent_member *m, double now);
void agent__cgroup_cleanup(agent_member *m);
void agent__cgroup_sweep(const char *root);
void agent__cgroup_root(const char *ctl, char *out, size_t cap);

#endif
