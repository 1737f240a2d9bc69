/* The trainer/worker wire protocol (docs/rl-protocol.md): framed messages
 * over a stream socket.  Internal to src/rl/engine. */
#ifndef SHOAL_RL_WIRE_H
#define SHOAL_RL_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "shoal/common.h"
#include "shoal/rl.h"
#include "shoal/net.h"

#define RL_WIRE_MAGIC 0x4c524853u /* "SHRL" little-endian */
#define RL_WIRE_MAX (64u << 20)   /* largest payload accepted */

enum { RL_MSG_WEIGHTS = 1, RL_MSG_REQUEST = 2, RL_MSG_TRAJS = 3, RL_MSG_STOP = 4,
       RL_MSG_HELLO = 5, RL_MSG_BYE = 6, RL_MSG_REFUSE = 7, RL_MSG_WELCOME = 8 };
/* HELLO flags: the worker's weights come by the push tree, not WEIGHTS. */
enum { RL_HELLO_PUSH = 1 };
/* WEIGHTS encodings: a whole safetensors image, or a shoal delta
 * (docs/delta-format.md) from the image of base_version. */
enum { RL_ENC_IMAGE = 1, RL_ENC_DELTA = 2 };

typedef struct rl_wire_hdr {
    uint32_t magic, type;
    uint64_t len;
} rl_wire_hdr;

typedef struct rl_wire_weights {
    int32_t version;
    uint32_t encoding;
    uint64_t nbytes;
    int32_t base_version; /* RL_ENC_DELTA: the version the delta applies to */
    uint32_t reserved;
} rl_wire_weights;

typedef struct rl_wire_request {
    int32_t min_version, nprompts, group, group0;
    uint64_t seed;
    /* 1: exactly min_version (every token of the answer sampled by it: no
     * in-flight update, and a worker holding a newer one refuses); 0: at
     * least min_version. */
    int32_t exact;
    uint32_t reserved; /* 0 */
} rl_wire_request; /* followed by nprompts uint64 problem ids */

typedef struct rl_wire_trajs {
    int32_t worker, count;
} rl_wire_trajs; /* followed by count rl_traj records */

/* HELLO (remote worker -> trainer, first message): what GPU it stands for. */
typedef struct rl_wire_hello {
    char name[16]; /* NUL-terminated GPU type or worker name */
    double speed, price;
    int32_t pid;
    uint32_t flags; /* RL_HELLO_PUSH */
    sh_hash128 nonce; /* fresh per connection (zero without the run's secret) */
    sh_hash128 proof; /* net_secret_proof(secret, "rl worker", nonce), or zero */
} rl_wire_hello;
/* WELCOME (trainer -> worker, first, when the trainer has the run's secret):
 * net_secret_proof(secret, "rl trainer", the HELLO's nonce), 16 bytes. */

/* REFUSE (worker -> trainer, the answer to a REQUEST in its turn): the
 * worker could not get weights as new as min_version in time.  The trainer
 * asks for those groups again; nothing of them is trained on. */
typedef struct rl_wire_refuse {
    int32_t version;     /* the policy version the worker holds (-1: none) */
    int32_t min_version; /* what the request asked for */
    int32_t group0, nprompts;
} rl_wire_refuse;

/* STOP may carry an int32: the trainer's final version, which a push worker
 * takes before it answers BYE. */

/* BYE (worker -> trainer, answer to STOP): the version it holds and the
 * xxh3-128 of its weights image, so the trainer can check convergence. */
typedef struct rl_wire_bye {
    int32_t version, reserved;
    uint64_t hash_lo, hash_hi;
} rl_wire_bye;

/* Appends one framed message (header, a, b) to buf. */
int rl__msg_append(sh_buf *buf, uint32_t type, const void *a, size_t alen, const void *b,
                   size_t blen);
/* Writes one message to a blocking fd. */
int rl__msg_write(int fd, uint32_t type, const void *a, size_t alen, const void *b, size_t blen);
/* Reads one whole message from a blocking fd into payload (replacing its
 * contents).  EOF before a header is SH_ENOENT. */
int rl__msg_read(int fd, uint32_t *type, sh_buf *payload);
/* If buf starts with a whole message, sets *type, *payload, *len and returns
 * its total size; 0 if more bytes are needed; negative if malformed. */
long rl__msg_peek(const sh_buf *buf, uint32_t *type, const uint8_t **payload, size_t *len);

/* ---- What the trainer checks in a worker's messages (trajcheck.c) -------
 * Every function is pure; `who` names the worker in messages ("worker 3
 * (h100)").  A failure is SH_EFORMAT naming the trajectory and field. */

/* A behaviour log-probability is that of a token the worker sampled: at
 * most 0 (RL_BLOGP_MAX leaves room for rounding in a worker's softmax),
 * and above RL_BLOGP_MIN: a token that unlikely (e^-80) is never drawn,
 * and above it pi / mu stays finite in float. */
#define RL_BLOGP_MAX 1e-3f
#define RL_BLOGP_MIN -80.0f

/* What the trainer asked a worker for, which a TRAJS or REFUSE answers. */
typedef struct rl__ask {
    int group0, nprompts, group; /* groups group0.., group trajectories each */
    int min_version;             /* the request's */
    int exact;                   /* the request asked for exactly min_version */
    int max_version;             /* the newest version the trainer has published */
    const rl_problem *probs;     /* nprompts: each group's problem (rl__group_problem) */
    int max_len, max_new;        /* the model's context (<= RL_MAX_T); response tokens */
} rl__ask;

/* Group g's problem: a function of the run's seed and g alone. */
void rl__group_problem(uint64_t seed, int task, int g, rl_problem *p);
/* Checks a TRAJS payload against a; copies its nprompts * group records
 * into out (whatever the result). */
int rl__trajs_check(const rl__ask *a, const char *who, const uint8_t *p, size_t len, rl_traj *out);
/* A REFUSE payload answering the request a. */
int rl__refuse_check(const rl__ask *a, const char *who, const uint8_t *p, size_t len,
                     rl_wire_refuse *out);
/* A BYE payload; the version it names is at most max_version. */
int rl__bye_check(int max_version, const char *who, const uint8_t *p, size_t len, rl_wire_bye *out);
/* A HELLO payload's form (the secret is checked by the caller). */
int rl__hello_parse(const char *who, const uint8_t *p, size_t len, rl_wire_hello *out);

#endif
