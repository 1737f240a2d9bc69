/* The transformer's layers, each a forward/backward pair (llm.c style).
 * Internal to src/rl/nn, exposed for the gradient-check tests.
 *
 * Shapes: B batch, T time, C channels, OC output channels, NH heads, V
 * vocabulary, N = B*T rows.  Backward functions ADD into their gradient
 * outputs, so that a tensor used twice (the residual stream) accumulates. */
#ifndef SHOAL_NN_LAYERS_H
#define SHOAL_NN_LAYERS_H

/* out (B,T,C) = wte[inp] + wpe[t]; inp (B,T) token ids. */
void nn__encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                         int T, int C);
void nn__encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                          int T, int C);

/* out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) are saved. */
void nn__layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C);
void nn__layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C);

/* out (N,OC) = inp (N,C) @ w^T + bias; w is (OC,C), bias (OC) or NULL.
 * ref = 1 uses the plain loops, 0 OpenBLAS. */
void nn__matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                        int C, int OC, int ref);
void nn__matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC, int ref);

/* Causal multi-head attention.  inp (B,T,3C) holds q,k,v; out (B,T,C);
 * preatt and att (B,NH,T,T) are saved for the backward pass. */
void nn__attention_forward(float *out, float *preatt, float *att, const float *inp, int B, int T,
                           int C, int NH);
void nn__attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout,
                            const float *inp, const float *att, int B, int T, int C, int NH);

/* tanh-approximated GELU, elementwise over n values. */
/* tanh to 3e-7 absolute, the one GELU uses (vectorisable; see layers.c). */
float nn__tanhf(float x);
void nn__gelu_forward(float *out, const float *inp, int n);
void nn__gelu_backward(float *dinp, const float *inp, const float *dout, int n);

/* out = a + b over n values. */
void nn__residual_forward(float *out, const float *a, const float *b, int n);
void nn__residual_backward(float *da, float *db, const float *dout, int n);

#endif
