/* Tests for src/rl/nn: every layer's gradient against central finite
 * differences, the OpenBLAS path against the plain reference, the whole
 * model's gradient, bit-for-bit determinism, and AdamW's NaN guard. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rl/nn/layers_int.h"
#include "shoal/nn.h"

static uint64_t rng = 12345;
static float urand(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) / 16777216.0) * 2.0f - 1.0f;
}
static float *rnd(int n, float scale)
{
    float *p = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) p[i] = urand() * scale;
    return p;
}

/* A layer under test: forward() writes the layer output, the loss is
 * sum(out * R) so that dout = R. */
typedef struct lcase {
    void (*forward)(struct lcase *);
    float *out, *R;
    int nout;
    void *ctx[8];
    int dim[6];
} lcase;

static double loss_of(lcase *c)
{
    c->forward(c);
    double s = 0;
    for (int i = 0; i < c->nout; i++) s += (double)c->out[i] * c->R[i];
    return s;
}

/* Compares analytic gradient g of input x (n values) with finite
 * differences; fails naming the layer, input and index. */
static void check_grad(const char *what, lcase *c, float *x, const float *g, int n)
{
    const float eps = 1e-2f;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + eps;
        double lp = loss_of(c);
        x[i] = keep - eps;
        double lm = loss_of(c);
        x[i] = keep;
        double num = (lp - lm) / (2 * eps), err = fabs(num - g[i]) / (fabs(num) + fabs(g[i]) + 1e-2);
        if (err > worst) worst = err;
        if (err > 2e-2) fail_msg("%s: gradient %d: analytic %g, numeric %g", what, i, g[i], num);
    }
    loss_of(c);
    print_message("%s: worst relative error %.2e over %d values\n", what, worst, n);
}

static void ln_fwd(lcase *c)
{
    int N = c->dim[0], C = c->dim[1];
    nn__layernorm_forward(c->out, c->ctx[3], c->ctx[4], c->ctx[0], c->ctx[1], c->ctx[2], N, C);
}

static void test_layernorm_grad(void **state)
{
    int N = 3, C = 8;
    float *x = rnd(N * C, 1), *w = rnd(C, 1), *b = rnd(C, 1), mean[3], rstd[3];
    lcase c = {ln_fwd, malloc(sizeof(float) * N * C), rnd(N * C, 1), N * C, {x, w, b, mean, rstd}, {N, C}};
    float *dx = calloc(N * C, 4), *dw = calloc(C, 4), *db = calloc(C, 4);
    loss_of(&c);
    nn__layernorm_backward(dx, dw, db, c.R, x, w, mean, rstd, N, C);
    check_grad("layernorm dinp", &c, x, dx, N * C);
    check_grad("layernorm dw", &c, w, dw, C);
    check_grad("layernorm db", &c, b, db, C);
    free(x), free(w), free(b), free(c.out), free(c.R), free(dx), free(dw), free(db);
}

static void mm_fwd(lcase *c)
{
    nn__matmul_forward(c->out, c->ctx[0], c->ctx[1], c->ctx[2], c->dim[0], c->dim[1], c->dim[2],
                       c->dim[3]);
}

static void test_matmul_grad_and_blas(void **state)
{
    int N = 5, C = 7, OC = 6;
    float *x = rnd(N * C, 1), *w = rnd(OC * C, 1), *b = rnd(OC, 1);
    for (int ref = 0; ref <= 1; ref++) {
        lcase c = {mm_fwd, malloc(sizeof(float) * N * OC), rnd(N * OC, 1), N * OC, {x, w, b}, {N, C, OC, ref}};
        float *dx = calloc(N * C, 4), *dw = calloc(OC * C, 4), *db = calloc(OC, 4);
        loss_of(&c);
        nn__matmul_backward(dx, dw, db, c.R, x, w, N, C, OC, ref);
        check_grad(ref ? "matmul(ref) dinp" : "matmul(blas) dinp", &c, x, dx, N * C);
        check_grad(ref ? "matmul(ref) dw" : "matmul(blas) dw", &c, w, dw, OC * C);
        check_grad(ref ? "matmul(ref) dbias" : "matmul(blas) dbias", &c, b, db, OC);
        free(c.out), free(c.R), free(dx), free(dw), free(db);
    }
    /* Larger shapes: the fast path agrees with the reference within float
     * rounding, forward and backward. */
    N = 64, C = 48, OC = 96;
    float *X = rnd(N * C, 1), *W = rnd(OC * C, 1), *Bi = rnd(OC, 1), *D = rnd(N * OC, 1);
    float *o[2], *dx[2], *dw[2], *db[2];
    for (int ref = 0; ref <= 1; ref++) {
        o[ref] = malloc(sizeof(float) * N * OC);
        dx[ref] = calloc(N * C, 4), dw[ref] = calloc(OC * C, 4), db[ref] = calloc(OC, 4);
        nn__matmul_forward(o[ref], X, W, Bi, N, C, OC, ref);
        nn__matmul_backward(dx[ref], dw[ref], db[ref], D, X, W, N, C, OC, ref);
    }
    for (int i = 0; i < N * OC; i++) assert_float_equal(o[0][i], o[1][i], 1e-4);
    for (int i = 0; i < N * C; i++) assert_float_equal(dx[0][i], dx[1][i], 1e-4);
    for (int i = 0; i < OC * C; i++) assert_float_equal(dw[0][i], dw[1][i], 1e-3);
    for (int r = 0; r < 2; r++) free(o[r]), free(dx[r]), free(dw[r]), free(db[r]);
    free(X), free(W), free(Bi), free(D), free(x), free(w), free(b);
}

static void att_fwd(lcase *c)
{
    nn__attention_forward(c->out, c->ctx[1], c->ctx[2], c->ctx[0], c->dim[0], c->dim[1], c->dim[2],
                          c->dim[3]);
}

static void test_attention_grad(void **state)
{
    int B = 2, T = 4, C = 8, NH = 2;
    float *x = rnd(B * T * 3 * C, 1), *pre = malloc(sizeof(float) * B * NH * T * T);
    float *att = malloc(sizeof(float) * B * NH * T * T);
    lcase c = {att_fwd, malloc(sizeof(float) * B * T * C), rnd(B * T * C, 1), B * T * C, {x, pre, att}, {B, T, C, NH}};
    float *dx = calloc(B * T * 3 * C, 4), *dpre = calloc(B * NH * T * T, 4), *datt = calloc(B * NH * T * T, 4);
    loss_of(&c);
    nn__attention_backward(dx, dpre, datt, c.R, x, att, B, T, C, NH);
    check_grad("attention dinp", &c, x, dx, B * T * 3 * C);
    /* Causality: the output at t = 0 does not depend on later tokens. */
    float keep = c.out[0];
    x[(1 * 3 * C) + 5] += 1.0f;
    att_fwd(&c);
    assert_float_equal(c.out[0], keep, 0);
    free(x), free(pre), free(att), free(c.out), free(c.R), free(dx), free(dpre), free(datt);
}

static void gelu_fwd(lcase *c) { nn__gelu_forward(c->out, c->ctx[0], c->dim[0]); }
static void res_fwd(lcase *c) { nn__residual_forward(c->out, c->ctx[0], c->ctx[1], c->dim[0]); }
static void enc_fwd(lcase *c)
{
    nn__encoder_forward(c->out, c->ctx[2], c->ctx[0], c->ctx[1], c->dim[0], c->dim[1], c->dim[2]);
}

static void test_small_layers_grad(void **state)
{
    int n = 20;
    float *x = rnd(n, 3), *y = rnd(n, 1);
    lcase g = {gelu_fwd, malloc(sizeof(float) * n), rnd(n, 1), n, {x}, {n}};
    float *dx = calloc(n, 4), *dy = calloc(n, 4);
    loss_of(&g);
    nn__gelu_backward(dx, x, g.R, n);
    check_grad("gelu dinp", &g, x, dx, n);
    lcase r = {res_fwd, malloc(sizeof(float) * n), rnd(n, 1), n, {x, y}, {n}};
    memset(dx, 0, 4 * n);
    loss_of(&r);
    nn__residual_backward(dx, dy, r.R, n);
    check_grad("residual da", &r, x, dx, n);
    check_grad("residual db", &r, y, dy, n);
    int B = 2, T = 3, C = 4, V = 5, tok[6] = {1, 4, 1, 0, 2, 2};
    float *wte = rnd(V * C, 1), *wpe = rnd(T * C, 1), *dwte = calloc(V * C, 4), *dwpe = calloc(T * C, 4);
    lcase e = {enc_fwd, malloc(sizeof(float) * B * T * C), rnd(B * T * C, 1), B * T * C, {wte, wpe, tok}, {B, T, C}};
    loss_of(&e);
    nn__encoder_backward(dwte, dwpe, e.R, tok, B, T, C);
    check_grad("encoder dwte", &e, wte, dwte, V * C);
    check_grad("encoder dwpe", &e, wpe, dwpe, T * C);
    free(x), free(y), free(dx), free(dy), free(g.out), free(g.R), free(r.out), free(r.R);
    free(wte), free(wpe), free(dwte), free(dwpe), free(e.out), free(e.R);
}

/* The whole model: cross-entropy gradient of sampled parameters of every
 * tensor against finite differences. */
static double model_loss(nn_model *m, const int *tok, const int *tgt, const uint8_t *mask, int B, int T)
{
    const float *logits, *dl;
    float loss;
    TU_OK(nn_forward(m, tok, B, T, &logits));
    TU_OK(nn_xent(m, tgt, mask, &loss, &dl));
    return loss;
}

static void test_model_grad(void **state)
{
    nn_config cfg = {.vocab = 11, .ctx = 6, .width = 8, .layers = 2, .heads = 2};
    nn_model *m;
    TU_OK(nn_new(&cfg, 7, &m));
    /* Larger weights than the default init so that every path matters. */
    float *p = nn_params(m);
    for (size_t i = 0; i < nn_num_params(m); i++) p[i] += 0.3f * urand();
    int B = 2, T = 5, tok[10], tgt[10];
    uint8_t mask[10];
    for (int i = 0; i < 10; i++) tok[i] = i % 11, tgt[i] = (3 * i + 1) % 11, mask[i] = i % 4 != 0;
    const float *logits, *dl;
    float loss;
    TU_OK(nn_forward(m, tok, B, T, &logits));
    TU_OK(nn_xent(m, tgt, mask, &loss, &dl));
    nn_zero_grad(m);
    TU_OK(nn_backward(m, dl));
    float *g = malloc(sizeof(float) * nn_num_params(m));
    memcpy(g, nn_grads(m), sizeof(float) * nn_num_params(m));
    for (int t = 0; t < nn_num_tensors(m); t++) {
        const nn_tensor *ten = nn_tensor_at(m, t);
        size_t n = (size_t)ten->rows * ten->cols;
        for (size_t k = 0; k < 3; k++) {
            size_t i = ten->offset + (k * 7919) % n;
            float keep = p[i], eps = 1e-2f;
            p[i] = keep + eps;
            double lp = model_loss(m, tok, tgt, mask, B, T);
            p[i] = keep - eps;
            double lm = model_loss(m, tok, tgt, mask, B, T);
            p[i] = keep;
            double num = (lp - lm) / (2 * eps);
            if (fabs(num - g[i]) > 2e-2 * (fabs(num) + fabs(g[i])) + 2e-4)
                fail_msg("model %s[%zu]: analytic %g numeric %g", ten->name, i - ten->offset, g[i], num);
        }
    }
    free(g);
    nn_free(m);
}

/* Train a few steps; returns the hash of the parameters. */
static sh_hash128 train_hash(uint64_t seed, int ref)
{
    nn_config cfg = nn_config_default(16);
    nn_model *m;
    TU_OK(nn_new(&cfg, seed, &m));
    nn_set_reference(m, ref);
    nn_adamw opt;
    TU_OK(nn_adamw_init(&opt, m, 3e-3f));
    int B = 4, T = 12, tok[48], tgt[48];
    uint8_t mask[48];
    for (int i = 0; i < 48; i++) tok[i] = (i * 5) % 16, tgt[i] = (i * 5 + 5) % 16, mask[i] = 1;
    float first = 0, loss = 0;
    for (int s = 0; s < 20; s++) {
        const float *logits, *dl;
        TU_OK(nn_forward(m, tok, B, T, &logits));
        TU_OK(nn_xent(m, tgt, mask, &loss, &dl));
        if (!s) first = loss;
        nn_zero_grad(m);
        TU_OK(nn_backward(m, dl));
        TU_OK(nn_adamw_step(&opt, m, NULL));
    }
    assert_true(loss < first * 0.5f); /* it learns the fixed mapping */
    sh_hash128 h = sh_hash128_of(nn_params(m), nn_num_params(m) * sizeof(float));
    nn_adamw_free(&opt);
    nn_free(m);
    return h;
}

static void test_determinism(void **state)
{
    sh_hash128 a = train_hash(42, 0), b = train_hash(42, 0), c = train_hash(43, 0);
    assert_true(sh_hash128_eq(a, b));
    assert_false(sh_hash128_eq(a, c));
    sh_hash128 r1 = train_hash(42, 1), r2 = train_hash(42, 1);
    assert_true(sh_hash128_eq(r1, r2));
}

static void test_config_and_nan_guard(void **state)
{
    nn_config bad = nn_config_default(16);
    bad.width = 30; /* not a multiple of 4 heads */
    nn_model *m = NULL;
    TU_ERR(nn_new(&bad, 1, &m), SH_EINVAL, "multiple of heads");
    nn_config cfg = nn_config_default(16);
    TU_OK(nn_new(&cfg, 1, &m));
    assert_non_null(nn_tensor_find(m, "model.layers.1.self_attn.k_proj.weight"));
    assert_non_null(nn_tensor_find(m, "lm_head.weight"));
    int tok[2] = {3, 99};
    const float *lg;
    TU_ERR(nn_forward(m, tok, 1, 2, &lg), SH_EINVAL, "not in vocabulary");
    nn_adamw opt;
    TU_OK(nn_adamw_init(&opt, m, 1e-3f));
    float *before = malloc(sizeof(float) * nn_num_params(m));
    memcpy(before, nn_params(m), sizeof(float) * nn_num_params(m));
    nn_zero_grad(m);
    nn_grads(m)[5] = NAN;
    double gn;
    TU_ERR(nn_adamw_step(&opt, m, &gn), SH_ERANGE, "step skipped");
    assert_memory_equal(before, nn_params(m), sizeof(float) * nn_num_params(m));
    free(before);
    nn_adamw_free(&opt);
    nn_free(m);
    nn_free(NULL);
}

/* GELU's tanh: within 3e-7 of libm's tanhf over [-12, 12] (and
 * within 1e-7 of +-1 far out), odd to rounding, and the same whether a loop runs it in
 * vector lanes or in its scalar tail (GELU of an array against GELU of
 * each element alone). */
static void test_tanh(void **state)
{
    (void)state;
    double worst = 0;
    for (int i = -120000; i <= 120000; i++) {
        float x = (float)i * 1e-4f;
        double e = fabs((double)nn__tanhf(x) - (double)tanhf(x));
        if (e > worst) worst = e;
        assert_true(fabsf(nn__tanhf(x) + nn__tanhf(-x)) <= 3e-7f);
    }
    print_message("nn__tanhf: worst absolute error %.2e against tanhf\n", worst);
    assert_true(worst < 3e-7);
    assert_true(fabsf(nn__tanhf(1e30f) - 1.0f) <= 1e-7f && fabsf(nn__tanhf(-1e30f) + 1.0f) <= 1e-7f);
    assert_true(isnan(nn__tanhf(NAN)));
    enum { N = 1003 };
    float in[N], out[N], one;
    for (int i = 0; i < N; i++) in[i] = (float)(i - N / 2) * 0.011f;
    nn__gelu_forward(out, in, N);
    for (int i = 0; i < N; i++) {
        nn__gelu_forward(&one, &in[i], 1);
        assert_memory_equal(&one, &out[i], sizeof one);
    }
}

/* FP8 activations (W8A8): the logits move, but by the little an e4m3
 * rounding of each product's input moves them; the cached decoder rounds
 * the same rows the same way, so it still matches the full forward; and
 * turning it off gives back the exact logits. */
static void test_fp8_activations(void **state)
{
    nn_config cfg = nn_config_default(16);
    nn_model *m;
    TU_OK(nn_new(&cfg, 4, &m));
    float *p = nn_params(m);
    for (size_t i = 0; i < nn_num_params(m); i++) p[i] *= 2.0f; /* sharper than a fresh init */
    enum { T = 12 };
    int tok[T];
    for (int t = 0; t < T; t++) tok[t] = (t * 7 + 3) % 16;
    const float *lg;
    float off[T * 16], on[T * 16];
    TU_OK(nn_forward(m, tok, 1, T, &lg));
    memcpy(off, lg, sizeof off);
    nn_set_fp8_act(m, 1);
    TU_OK(nn_forward(m, tok, 1, T, &lg));
    memcpy(on, lg, sizeof on);
    double diff = 0, scale = 0;
    for (int i = 0; i < T * 16; i++) diff = fmax(diff, fabs(on[i] - off[i])), scale = fmax(scale, fabs(off[i]));
    print_message("fp8 activations: max logit change %.4f of max |logit| %.3f\n", diff, scale);
    assert_true(diff > 0 && diff < 0.1 * scale);
    nn_kv *kv;
    TU_OK(nn_kv_new(m, 1, &kv));
    int row = 0;
    for (int t = 0; t < T; t++) {
        TU_OK(nn_decode(m, kv, &row, &tok[t], 1, &lg));
        for (int v = 0; v < 16; v++)
            if (fabsf(lg[v] - on[t * 16 + v]) > 1e-2f * (float)scale)
                fail_msg("decode t %d v %d: %g, forward %g", t, v, lg[v], on[t * 16 + v]);
    }
    nn_kv_free(kv);
    nn_set_fp8_act(m, 0);
    TU_OK(nn_forward(m, tok, 1, T, &lg));
    assert_memory_equal(lg, off, sizeof off);
    nn_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm_grad),     cmocka_unit_test(test_matmul_grad_and_blas),
        cmocka_unit_test(test_attention_grad),     cmocka_unit_test(test_small_layers_grad),
        cmocka_unit_test(test_model_grad),         cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_config_and_nan_guard), cmocka_unit_test(test_tanh),
        cmocka_unit_test(test_fp8_activations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
