/* Publishing the policy as a bf16 safetensors checkpoint with Hugging Face
 * names (through src/weights/ckpt), and loading one back.  I/O edge. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/ckpt.h"
#include "shoal/delta.h"
#include "rl/engine/runtime_int.h"
#include "shoal/rl.h"

void rl_round_bf16(float *w, size_t n)
{
    for (size_t i = 0; i < n; i++) w[i] = ckpt_bf16_to_f32(ckpt_f32_to_bf16(w[i]));
}

/* The tensor table as ckpt specs (names borrowed from the model), laid out
 * back to back in table order with element size `esz`. */
static ckpt_tensor *specs(nn_model *m, ckpt_dtype dt, size_t esz, uint64_t *total)
{
    int nt = nn_num_tensors(m);
    ckpt_tensor *t = calloc((size_t)nt, sizeof *t);
    if (!t) return NULL;
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        const nn_tensor *s = nn_tensor_at(m, i);
        uint64_t n = (uint64_t)s->rows * s->cols;
        t[i].name = s->name;
        t[i].dtype = dt;
        /* Vectors (norms, biases) are 1-D as in Hugging Face checkpoints. */
        t[i].ndim = s->rows == 1 ? 1 : 2;
        t[i].shape[0] = s->rows == 1 ? s->cols : s->rows;
        t[i].shape[1] = s->cols;
        t[i].numel = n;
        t[i].nbytes = n * esz;
        t[i].offset = off;
        off += n * esz;
    }
    *total = off;
    return t;
}

static void put_values(nn_model *m, const nn_tensor *s, ckpt_dtype dt, uint8_t *dst)
{
    const float *p = nn_params(m) + s->offset;
    size_t n = (size_t)s->rows * s->cols;
    if (dt == CKPT_F32) {
        memcpy(dst, p, n * 4);
        return;
    }
    for (size_t k = 0; k < n; k++) {
        uint16_t h = ckpt_f32_to_bf16(p[k]);
        memcpy(dst + 2 * k, &h, 2);
    }
}

int rl_policy_image(nn_model *m, int bf16, sh_buf *out)
{
    ckpt_dtype dt = bf16 ? CKPT_BF16 : CKPT_F32;
    size_t esz = bf16 ? 2 : 4;
    uint64_t total;
    ckpt_tensor *t = specs(m, dt, esz, &total);
    if (!t) return sh_err(SH_ENOMEM, "policy image: out of memory");
    sh_buf img = {0};
    int rc = ckpt_header_build(t, (size_t)nn_num_tensors(m), NULL, &img);
    if (!rc) rc = sh_buf_reserve(&img, total + 1);
    if (!rc) {
        uint8_t *base = img.data + img.len;
        for (int i = 0; i < nn_num_tensors(m); i++)
            put_values(m, nn_tensor_at(m, i), dt, base + t[i].offset);
        img.len += total;
        *out = img;
    } else {
        sh_buf_free(&img);
    }
    free(t);
    return rc;
}

/* Reads one tensor of a checkpoint into n floats, from BF16 or F32. */
static int get_values(const ckpt_tensor *t, uint64_t n, float *dst, const char *what)
{
    if (t->numel != n || (t->dtype != CKPT_BF16 && t->dtype != CKPT_F32))
        return sh_err(SH_EMISMATCH, "%s: tensor %s: expected %llu BF16 or F32 values, found %llu %s",
                      what, t->name, (unsigned long long)n, (unsigned long long)t->numel,
                      ckpt_dtype_name(t->dtype));
    for (uint64_t k = 0; k < n; k++) {
        if (t->dtype == CKPT_F32) {
            memcpy(&dst[k], t->data + 4 * k, 4);
        } else {
            uint16_t h;
            memcpy(&h, t->data + 2 * k, 2);
            dst[k] = ckpt_bf16_to_f32(h);
        }
    }
    return 0;
}

/* Dequantises an F8_E4M3 [rows, cols] tensor with its NAME_scale_inv (one
 * F32 per 128 x 128 block, as `shoal quant fp8` writes them). */
static int get_fp8(const ckpt *c, const ckpt_tensor *t, const nn_tensor *s, float *dst,
                   const char *what)
{
    char name[160];
    snprintf(name, sizeof name, "%s_scale_inv", t->name);
    const ckpt_tensor *sc = ckpt_find(c, name);
    int64_t nbr = (s->rows + DELTA_FP8_BLOCK - 1) / DELTA_FP8_BLOCK, nbc = (s->cols + DELTA_FP8_BLOCK - 1) / DELTA_FP8_BLOCK;
    if (t->ndim != 2 || t->shape[0] != s->rows || t->shape[1] != s->cols)
        return sh_err(SH_EMISMATCH, "%s: tensor %s: F8_E4M3 shape does not match the model", what,
                      t->name);
    if (!sc || sc->dtype != CKPT_F32 || sc->numel != (uint64_t)(nbr * nbc))
        return sh_err(SH_EFORMAT, "%s: tensor %s needs %s as %lld F32 block scales", what,
                      t->name, name, (long long)(nbr * nbc));
    for (int64_t r = 0; r < s->rows; r++)
        for (int64_t k = 0; k < s->cols; k++) {
            float si;
            memcpy(&si, sc->data + 4 * ((r / DELTA_FP8_BLOCK) * nbc + k / DELTA_FP8_BLOCK), 4);
            dst[r * s->cols + k] = ckpt_e4m3_to_f32(t->data[r * s->cols + k]) * si;
        }
    return 0;
}

int rl_load_view(nn_model *m, const ckpt *c, const char *what)
{
    float *p = nn_params(m);
    for (int i = 0; i < nn_num_tensors(m); i++) {
        const nn_tensor *s = nn_tensor_at(m, i);
        const ckpt_tensor *t = ckpt_find(c, s->name);
        if (!t) return sh_err(SH_ENOENT, "%s: tensor %s is missing", what, s->name);
        if (t->dtype == CKPT_F8_E4M3) SH_TRY(get_fp8(c, t, s, p + s->offset, what));
        else SH_TRY(get_values(t, (uint64_t)s->rows * s->cols, p + s->offset, what));
    }
    return 0;
}

int rl_save_checkpoint(nn_model *m, const char *path, int version, const json_t *extra)
{
    uint64_t total;
    ckpt_tensor *t = specs(m, CKPT_BF16, 2, &total);
    uint8_t *data = malloc(total ? total : 1);
    if (!t || !data) {
        free(t), free(data);
        return sh_err(SH_ENOMEM, "%s: out of memory", path);
    }
    int nt = nn_num_tensors(m);
    for (int i = 0; i < nt; i++) {
        put_values(m, nn_tensor_at(m, i), CKPT_BF16, data + t[i].offset);
        t[i].data = data + t[i].offset;
    }
    const nn_config *c = nn_cfg(m);
    char ver[32], shape[128];
    snprintf(ver, sizeof ver, "%d", version);
    snprintf(shape, sizeof shape, "vocab=%d ctx=%d width=%d layers=%d heads=%d", c->vocab, c->ctx,
             c->width, c->layers, c->heads);
    json_t *meta = json_pack("{s:s,s:s,s:s,s:s}", "format", "pt", "shoal.policy_version", ver,
                             "shoal.model", shape, "shoal.alphabet", RL_ALPHABET);
    const char *k;
    json_t *v;
    if (extra) json_object_foreach((json_t *)extra, k, v) json_object_set(meta, k, v);
    int rc = ckpt_save(path, t, (size_t)nt, meta);
    json_decref(meta);
    free(t), free(data);
    return rc;
}

int rl_load_checkpoint(nn_model *m, const char *path)
{
    ckpt *c;
    SH_TRY(ckpt_open(path, &c));
    int rc = rl_load_view(m, c, path);
    ckpt_close(c);
    return rc;
}

/* ---- FP8 rollout weights, in memory ---------------------------------------
 * The worker samples from the dequantised FP8 weights: every 2-D BF16 tensor
 * but the embeddings and the output head (kept BF16, as DeepSeek-V3 keeps
 * them) is quantised to e4m3 with one scale per 128 x 128 block, scale =
 * amax / 448, the block rule of `shoal quant fp8` (src/weights/delta/quant.c), and
 * read back.  A block depends only on its own BF16 values, so after a delta
 * only the blocks whose bytes changed are redone. */

static int fp8_kept(const char *name) { return strstr(name, "embed") || strstr(name, "lm_head"); }

/* Block (br, bc) of a BF16 [rows, cols] tensor, dequantised into dst. */
/* Block (br, bc) of x's FP8 serving copy, dequantised into dst (rows x
 * cols), by delta's one block rule. */
static void fp8_block(const uint8_t *x, int64_t rows, int64_t cols, int64_t br, int64_t bc, float *dst)
{
    uint8_t q[DELTA_FP8_BLOCK * DELTA_FP8_BLOCK];
    float si = delta_fp8_block(x, rows, cols, br, bc, q, DELTA_FP8_BLOCK);
    int64_t r0 = br * DELTA_FP8_BLOCK, c0 = bc * DELTA_FP8_BLOCK;
    int64_t r1 = r0 + DELTA_FP8_BLOCK < rows ? r0 + DELTA_FP8_BLOCK : rows;
    int64_t c1 = c0 + DELTA_FP8_BLOCK < cols ? c0 + DELTA_FP8_BLOCK : cols;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
            dst[r * cols + c] = ckpt_e4m3_to_f32(q[(r - r0) * DELTA_FP8_BLOCK + (c - c0)]) * si;
}

/* Whether block (br, bc) has the same bytes in a and b. */
static int block_same(const uint8_t *a, const uint8_t *b, int64_t rows, int64_t cols, int64_t br,
                      int64_t bc)
{
    int64_t r1 = br * DELTA_FP8_BLOCK + DELTA_FP8_BLOCK < rows ? br * DELTA_FP8_BLOCK + DELTA_FP8_BLOCK : rows, c0 = bc * DELTA_FP8_BLOCK;
    size_t n = (size_t)((c0 + DELTA_FP8_BLOCK < cols ? c0 + DELTA_FP8_BLOCK : cols) - c0) * 2;
    for (int64_t r = br * DELTA_FP8_BLOCK; r < r1; r++)
        if (memcmp(a + 2 * (r * cols + c0), b + 2 * (r * cols + c0), n)) return 0;
    return 1;
}

int rl__load_fp8(nn_model *m, const ckpt *img, const ckpt *prev, uint64_t *blocks)
{
    float *p = nn_params(m);
    uint64_t redone = 0;
    for (int i = 0; i < nn_num_tensors(m); i++) {
        const nn_tensor *s = nn_tensor_at(m, i);
        const ckpt_tensor *t = ckpt_find(img, s->name);
        if (!t) return sh_err(SH_ENOENT, "fp8 weights: tensor %s is missing", s->name);
        uint64_t n = (uint64_t)s->rows * s->cols;
        if (t->dtype != CKPT_BF16 || t->ndim != 2 || fp8_kept(s->name)) {
            SH_TRY(get_values(t, n, p + s->offset, "fp8 weights"));
            continue;
        }
        if (t->numel != n || t->shape[0] != s->rows || t->shape[1] != s->cols)
            return sh_err(SH_EMISMATCH, "fp8 weights: tensor %s: shape does not match the model", s->name);
        const ckpt_tensor *o = prev ? ckpt_find(prev, s->name) : NULL;
        if (o && (o->dtype != CKPT_BF16 || o->numel != n)) o = NULL;
        for (int64_t br = 0; br * DELTA_FP8_BLOCK < s->rows; br++)
            for (int64_t bc = 0; bc * DELTA_FP8_BLOCK < s->cols; bc++) {
                if (o && block_same(t->data, o->data, s->rows, s->cols, br, bc)) continue;
                fp8_block(t->data, s->rows, s->cols, br, bc, p + s->offset);
                redone++;
            }
    }
    if (blocks) *blocks = redone;
    return 0;
}
