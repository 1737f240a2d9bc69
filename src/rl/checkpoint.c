/* Publishing the policy as a bf16 safetensors checkpoint with Hugging Face
 * names (through src/ckpt), and loading one back.  I/O edge. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shoal/ckpt.h"
#include "shoal/rl.h"

void rl_round_bf16(float *w, size_t n)
{
    for (size_t i = 0; i < n; i++) w[i] = ckpt_bf16_to_f32(ckpt_f32_to_bf16(w[i]));
}

int rl_save_checkpoint(nn_model *m, const char *path, int version, const json_t *extra)
{
    int nt = nn_num_tensors(m);
    ckpt_tensor *t = calloc((size_t)nt, sizeof *t);
    uint16_t *data = malloc(nn_num_params(m) * sizeof(uint16_t));
    if (!t || !data) {
        free(t), free(data);
        return sh_err(SH_ENOMEM, "%s: out of memory", path);
    }
    const float *p = nn_params(m);
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        const nn_tensor *s = nn_tensor_at(m, i);
        size_t n = (size_t)s->rows * s->cols;
        for (size_t k = 0; k < n; k++) data[off + k] = ckpt_f32_to_bf16(p[s->offset + k]);
        t[i].name = s->name;
        t[i].dtype = CKPT_BF16;
        /* Vectors (norms, biases) are 1-D as in Hugging Face checkpoints. */
        t[i].ndim = s->rows == 1 ? 1 : 2;
        t[i].shape[0] = s->rows == 1 ? s->cols : s->rows;
        t[i].shape[1] = s->cols;
        t[i].numel = n;
        t[i].nbytes = n * 2;
        t[i].data = (const uint8_t *)(data + off);
        off += n;
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
    int rc = 0;
    float *p = nn_params(m);
    for (int i = 0; i < nn_num_tensors(m) && !rc; i++) {
        const nn_tensor *s = nn_tensor_at(m, i);
        const ckpt_tensor *t = ckpt_find(c, s->name);
        uint64_t n = (uint64_t)s->rows * s->cols;
        if (!t) rc = sh_err(SH_ENOENT, "%s: tensor %s is missing", path, s->name);
        else if (t->dtype != CKPT_BF16 || t->numel != n)
            rc = sh_err(SH_EMISMATCH, "%s: tensor %s: expected %llu BF16 values, found %llu %s",
                        path, s->name, (unsigned long long)n, (unsigned long long)t->numel,
                        ckpt_dtype_name(t->dtype));
        for (uint64_t k = 0; !rc && k < n; k++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * k, 2);
            p[s->offset + k] = ckpt_bf16_to_f32(h);
        }
    }
    ckpt_close(c);
    return rc;
}
