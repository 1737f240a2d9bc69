/* shoal nn: a small decoder-only transformer in plain C (llm.c style).
 *
 * Pure: no files, clocks or sockets.  One allocation holds every parameter
 * (a table of named tensors points into it), a second holds the gradients,
 * a third the activations of the last forward pass.  Matrix products go
 * through OpenBLAS (cblas_sgemm) or through a plain-C reference loop; both
 * give the same results within float rounding and the tests compare them.
 *
 * Dimension names used in shape comments:
 *   B batch, T sequence length (<= cfg.ctx), C width, NH heads, V vocabulary,
 *   L layers.
 *
 * The architecture is GPT-2 like (learned positions, pre-LayerNorm, GELU MLP
 * of width 4C, untied output head).  Tensors carry Hugging Face style names
 * (model.layers.0.self_attn.q_proj.weight, ...) so that a published
 * checkpoint looks like a real one to the codec and the store. */
#ifndef SHOAL_NN_H
#define SHOAL_NN_H

#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

typedef struct nn_config {
    int vocab;  /* V */
    int ctx;    /* maximum T */
    int width;  /* C, a multiple of heads */
    int layers; /* L */
    int heads;  /* NH */
} nn_config;

/* The default policy: about 0.1 M parameters, a training step on a batch of
 * 64 sequences of 16 tokens takes a few tens of milliseconds on one core. */
nn_config nn_config_default(int vocab);
/* Checks ranges (1..); names the offending field. */
int nn_config_check(const nn_config *c);

/* One named parameter tensor: rows x cols floats at params + offset (a 1-D
 * tensor has rows = 1). */
typedef struct nn_tensor {
    char name[96];
    int rows, cols;
    size_t offset;
} nn_tensor;

typedef struct nn_model nn_model;

/* Creates a model with weights drawn from a fixed-seed generator (normal,
 * std 0.02; LayerNorm weights 1, biases 0).  Same seed, same bits.  The
 * caller owns the model (nn_free). */
int nn_new(const nn_config *cfg, uint64_t seed, nn_model **out);
void nn_free(nn_model *m);
/* A deep copy of parameters and configuration (no optimiser state). */
int nn_clone(const nn_model *m, nn_model **out);

const nn_config *nn_cfg(const nn_model *m);
size_t nn_num_params(const nn_model *m);
float *nn_params(nn_model *m); /* all parameters, nn_num_params floats */
float *nn_grads(nn_model *m);  /* their gradients (same layout) */
int nn_num_tensors(const nn_model *m);
const nn_tensor *nn_tensor_at(const nn_model *m, int i);
/* Finds a tensor by name; NULL if absent. */
const nn_tensor *nn_tensor_find(const nn_model *m, const char *name);

/* Selects the plain-C reference matrix product (1) or OpenBLAS (0, the
 * default).  Used by tests and the benchmark. */
void nn_set_reference(nn_model *m, int reference);

/* FP8 activations (1, off by default): every matrix product's input is
 * rounded to e4m3 with one scale per 128 values of a row, as W8A8 FP8
 * serving does; for rollout models (the backward pass would differentiate
 * the rounded inputs).  Applies to nn_forward and nn_decode alike. */
void nn_set_fp8_act(nn_model *m, int on);
/* x rounded to the nearest OCP e4m3fn value (ties to even), saturating at
 * +-448. */
float nn_e4m3_round(float x);

/* Forward pass over tokens (B,T); returns the logits (B,T,V), owned by the
 * model and valid until the next forward.  Token ids must be < V and T <=
 * ctx (SH_EINVAL otherwise). */
int nn_forward(nn_model *m, const int *tokens, int B, int T, const float **logits);

/* Incremental decoding with a key/value cache: each of `rows` sequences
 * keeps the keys and values of every layer for the tokens it has been fed,
 * so a new token costs one row of work instead of a forward pass over the
 * whole prefix.  Same arithmetic as nn_forward (within float rounding:
 * matrix products of different shapes may round differently).  The cache
 * belongs to the caller (nn_kv_free); it holds activations computed with
 * the weights of the time, so a caller that changes the weights resets it
 * and feeds the prefix again. */
typedef struct nn_kv nn_kv;
int nn_kv_new(const nn_model *m, int rows, nn_kv **out);
void nn_kv_free(nn_kv *kv);
void nn_kv_reset(nn_kv *kv); /* every row back to no tokens */
/* Feeds tokens[i] to row rows[i] (i < n; distinct rows) at that row's next
 * position; *logits (n, V) for the token after it, owned by the cache and
 * valid until the next call.  SH_EINVAL for a bad row or token, or a row
 * whose context is full. */
int nn_decode(nn_model *m, nn_kv *kv, const int *rows, const int *tokens, int n,
              const float **logits);

/* Backward pass for the last forward: dlogits (B,T,V) is dLoss/dlogits.
 * Adds into the gradients (call nn_zero_grad first). */
int nn_backward(nn_model *m, const float *dlogits);
void nn_zero_grad(nn_model *m);

/* Mean next-token cross-entropy over positions with mask[b*T+t] != 0, where
 * position t predicts targets[b*T+t]; writes dlogits (B,T,V) for that mean
 * into the buffer the model owns and returns it through *dlogits.  For
 * supervised warm starts and tests.  Call after nn_forward. */
int nn_xent(nn_model *m, const int *targets, const uint8_t *mask, float *loss,
            const float **dlogits);

/* Global L2 norm of the gradients, in double. */
double nn_grad_norm(const nn_model *m);

/* AdamW with fp32 master weights (the parameters themselves). */
typedef struct nn_adamw {
    float lr, beta1, beta2, eps, weight_decay;
    float clip; /* clip the global gradient norm to this (0: off) */
    int64_t t;
    float *m, *v; /* moments, nn_num_params each */
} nn_adamw;
int nn_adamw_init(nn_adamw *o, const nn_model *m, float lr);
/* One update.  If the gradient norm is not finite the step is skipped, the
 * weights are untouched and SH_ERANGE is returned with a message saying so.
 * *gnorm (may be NULL) gets the norm before clipping. */
int nn_adamw_step(nn_adamw *o, nn_model *m, double *gnorm);
void nn_adamw_free(nn_adamw *o);

/* Log-softmax of one row of logits at `temperature` (1 = the model's own
 * distribution), into out[V]. */
void nn_log_softmax(const float *logits, int V, float temperature, float *out);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
