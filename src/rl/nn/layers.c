/* Transformer layers: forward and backward passes (see layers.h for shapes).
 * Written for clarity first; the matrix products, where the time goes, have
 * an OpenBLAS path next to the plain reference loops. */
#include "rl/nn/layers_int.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

void nn__encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                         int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *we = wte + (size_t)inp[b * T + t] * C, *pe = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
        }
}

void nn__encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                          int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            float *we = dwte + (size_t)inp[b * T + t] * C, *pe = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                we[i] += d[i];
                pe[i] += d[i];
            }
        }
}

void nn__layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C)
{
    const float eps = 1e-5f;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0, v = 0;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void nn__layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C, *x = inp + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        /* Two reductions: the mean of dnorm and of dnorm * norm. */
        float dmean = 0, dnorm_norm = 0;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * d[i];
            dmean += dnorm;
            dnorm_norm += dnorm * norm;
        }
        dmean /= C;
        dnorm_norm /= C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * d[i];
            db[i] += d[i];
            dw[i] += norm * d[i];
            dx[i] += (dnorm - dmean - norm * dnorm_norm) * s;
        }
    }
}

void nn__matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                        int C, int OC, int ref)
{
    if (!ref) {
        for (int n = 0; n < N; n++) {
            float *o = out + (size_t)n * OC;
            if (bias)
                memcpy(o, bias, sizeof(float) * OC);
            else
                memset(o, 0, sizeof(float) * OC);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, 1.0f,
                    out, OC);
        return;
    }
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        for (int o = 0; o < OC; o++) {
            const float *wr = w + (size_t)o * C;
            float acc = bias ? bias[o] : 0.0f;
            for (int i = 0; i < C; i++) acc += x[i] * wr[i];
            out[(size_t)n * OC + o] = acc;
        }
    }
}

void nn__matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC, int ref)
{
    if (dbias)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)n * OC + o];
    if (!ref) {
        /* dinp (N,C) += dout (N,OC) @ w (OC,C);  dw (OC,C) += dout^T @ inp. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C,
                    1.0f, dinp, C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                    1.0f, dw, C);
        return;
    }
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * OC, *x = inp + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        for (int o = 0; o < OC; o++) {
            const float *wr = w + (size_t)o * C;
            float *dwr = dw + (size_t)o * C;
            for (int i = 0; i < C; i++) {
                dx[i] += wr[i] * d[o];
                dwr[i] += x[i] * d[o];
            }
        }
    }
}

void nn__attention_forward(float *out, float *preatt, float *att, const float *inp, int B, int T,
                           int C, int NH)
{
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *q = inp + ((size_t)b * T + t) * C3 + h * hs;
                float *pre = preatt + (((size_t)b * NH + h) * T + t) * T;
                float *a = att + (((size_t)b * NH + h) * T + t) * T;
                /* Scores against keys 0..t (causal), then a stable softmax. */
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = inp + ((size_t)b * T + t2) * C3 + C + h * hs;
                    float s = 0;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    s *= scale;
                    pre[t2] = s;
                    if (s > maxv) maxv = s;
                }
                float sum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] = expf(pre[t2] - maxv);
                    sum += a[t2];
                }
                for (int t2 = 0; t2 < T; t2++) {
                    if (t2 <= t) {
                        a[t2] /= sum;
                    } else {
                        a[t2] = 0;
                        pre[t2] = 0;
                    }
                }
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = inp + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
}

void nn__attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout,
                            const float *inp, const float *att, int B, int T, int C, int NH)
{
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *a = att + (((size_t)b * NH + h) * T + t) * T;
                float *da = datt + (((size_t)b * NH + h) * T + t) * T;
                float *dpre = dpreatt + (((size_t)b * NH + h) * T + t) * T;
                const float *q = inp + ((size_t)b * T + t) * C3 + h * hs;
                float *dq = dinp + ((size_t)b * T + t) * C3 + h * hs;
                const float *d = dout + ((size_t)b * T + t) * C + h * hs;
                /* Through the weighted sum of values. */
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = inp + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    float *dv = dinp + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        da[t2] += v[i] * d[i];
                        dv[i] += a[t2] * d[i];
                    }
                }
                /* Through the softmax: dpre = a * (da - sum(a * da)). */
                float dot = 0;
                for (int t2 = 0; t2 <= t; t2++) dot += a[t2] * da[t2];
                for (int t2 = 0; t2 <= t; t2++) dpre[t2] += a[t2] * (da[t2] - dot);
                /* Through the scaled scores q.k. */
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = inp + ((size_t)b * T + t2) * C3 + C + h * hs;
                    float *dk = dinp + ((size_t)b * T + t2) * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += k[i] * dpre[t2] * scale;
                        dk[i] += q[i] * dpre[t2] * scale;
                    }
                }
            }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* tanh(x) = 1 - 2 / (e^2x + 1), with e^2x from a degree-7 polynomial on
 * |r| <= ln 2 / 2 after y = 2x = n ln 2 + r; absolute error below 3e-7
 * (tests/test_nn.c checks it against tanhf), enough for GELU's
 * 0.5 x (1 + tanh).  Plain float arithmetic without branches or calls, so
 * that the loops below vectorise: glibc's tanhf (and the expm1f it calls)
 * was a third of an RL run's CPU time. */
#if defined(__GNUC__) && !defined(__clang__)
/* Lets GCC turn the clamp into min/max and so vectorise the loops; the
 * results are the same (a NaN input gives NaN either way). */
#define NN__VEC __attribute__((optimize("no-trapping-math", "vect-cost-model=dynamic")))
#else
#define NN__VEC
#endif

NN__VEC static inline float nn__tanh(float x)
{
    x = x > 9.0f ? 9.0f : x < -9.0f ? -9.0f : x; /* tanh(9) = 1 - 3e-8 */
    float y = 2.0f * x;
    float t = y * 1.44269504088896341f + 12582912.0f; /* round to nearest: 1.5 x 2^23 */
    uint32_t ti; /* unsigned: a NaN's bits wrap instead of overflowing */
    memcpy(&ti, &t, 4);
    uint32_t n = ti - 0x4B400000u; /* the rounded y log2 e, two's complement */
    float nf = t - 12582912.0f;
    float r = (y - nf * 0.693145751953125f) - nf * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f +
              r * (8.3333338e-3f + r * (1.3888889e-3f + r * 1.9841270e-4f))))));
    uint32_t bits = (n + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return 1.0f - 2.0f / (p * scale + 1.0f);
}

float nn__tanhf(float x) { return nn__tanh(x); }

NN__VEC void nn__gelu_forward(float *restrict out, const float *restrict inp, int n)
{
    for (int i = 0; i < n; i++) {
        float x = inp[i], cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + nn__tanh(GELU_SCALE * (x + cube)));
    }
}

NN__VEC void nn__gelu_backward(float *restrict dinp, const float *restrict inp,
                               const float *restrict dout, int n)
{
    for (int i = 0; i < n; i++) {
        float x = inp[i], cube = 0.044715f * x * x * x;
        float arg = GELU_SCALE * (x + cube), th = nn__tanh(arg);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += g * dout[i];
    }
}

void nn__residual_forward(float *out, const float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void nn__residual_backward(float *da, float *db, const float *dout, int n)
{
    for (int i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}
