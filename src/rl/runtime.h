/* Internal to src/rl: the worker process entry point. */
#ifndef SHOAL_RL_RUNTIME_H
#define SHOAL_RL_RUNTIME_H

#include "shoal/rl.h"

/* Runs a rollout worker on fd until STOP or EOF; never returns (_exit). */
void rl__worker_main(const rl_config *c, int idx, int fd) __attribute__((noreturn));

#endif
