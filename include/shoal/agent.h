/* shoal agent: the node side of the control plane.
 *
 * An agent registers its node with the server, then polls it in a loop (the
 * poll is the heartbeat).  Each reply lists the members (job ranks) that
 * should run on the node; the agent makes its processes match: it forks a
 * member into its sandbox and holds it at the launch barrier, reports it
 * ready, execs the command once the server opens the barrier, streams its
 * output back with the next polls and reports its exit status.  Members the
 * server no longer lists are stopped (SIGTERM, then SIGKILL after a grace
 * period).  Protocol: docs/agent-protocol.md. */
#ifndef SHOAL_AGENT_H
#define SHOAL_AGENT_H

#include <signal.h>

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

typedef struct agent_config {
    const char *server;    /* http://HOST:PORT */
    const char *token;     /* the join token; registering gets the node its own credential */
    const char *name;      /* node name, unique in the fleet */
    const char *gpu_type;  /* NULL: detect with nvidia-smi */
    int gpus;              /* -1: detect with nvidia-smi */
    const char *zone, *fabric, *addr;
    double price;          /* dollars per GPU-hour */
    const char *work_dir;  /* per-member working directories go here */
    const char *sandbox;   /* "auto" (= bwrap), "bwrap", "gvisor" or "none" (docs/security.md) */
    int from_provider;     /* started by an autoscaling provider */
    double grace_s;        /* SIGTERM to SIGKILL (default 2 s) */
} agent_config;

/* Runs the agent until *stop becomes non-zero (set it from a signal handler).
 * Returns 0 after a clean stop, or a negative SH_E* code when the node cannot
 * be set up (bad config, no usable sandbox when "bwrap" was demanded).  A
 * server that is down is not an error: the agent keeps retrying. */
int agent_run(const agent_config *cfg, volatile sig_atomic_t *stop);

/* Describes the isolation this kernel allows, e.g.
 * "bwrap(pid,ipc,uts,mount,ro-root)+cgroup-v1(memory,pids)"; writes at most
 * cap bytes into out.  `mode` is as in agent_config.sandbox. */
int agent_probe_sandbox(const char *mode, char *out, size_t cap);

/* Fills gpu_type/gpus from nvidia-smi; returns 0 if it found GPUs, or
 * SH_ENOENT when nvidia-smi is absent or lists none. */
int agent_detect_gpus(char *gpu_type, size_t cap, int *gpus);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
