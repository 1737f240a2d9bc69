/* Dtypes of the safetensors format and conversions between the float
 * formats.  Narrowing conversions round to nearest, ties to even, as the
 * hardware (and PyTorch's .to()) does. */
#include "shoal/ckpt.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    unsigned bits;
    int is_float;
} ckpt__dtypes[CKPT_DTYPE_COUNT] = {
    [CKPT_BOOL] = {"BOOL", 8, 0},        [CKPT_F4] = {"F4", 4, 0},
    [CKPT_F6_E2M3] = {"F6_E2M3", 6, 0},  [CKPT_F6_E3M2] = {"F6_E3M2", 6, 0},
    [CKPT_U8] = {"U8", 8, 0},            [CKPT_I8] = {"I8", 8, 0},
    [CKPT_F8_E5M2] = {"F8_E5M2", 8, 1},  [CKPT_F8_E4M3] = {"F8_E4M3", 8, 1},
    [CKPT_F8_E8M0] = {"F8_E8M0", 8, 0},  [CKPT_I16] = {"I16", 16, 0},
    [CKPT_U16] = {"U16", 16, 0},         [CKPT_F16] = {"F16", 16, 1},
    [CKPT_BF16] = {"BF16", 16, 1},       [CKPT_I32] = {"I32", 32, 0},
    [CKPT_U32] = {"U32", 32, 0},         [CKPT_F32] = {"F32", 32, 1},
    [CKPT_C64] = {"C64", 64, 0},         [CKPT_F64] = {"F64", 64, 1},
    [CKPT_I64] = {"I64", 64, 0},         [CKPT_U64] = {"U64", 64, 0},
};

const char *ckpt_dtype_name(ckpt_dtype d)
{
    return (unsigned)d < CKPT_DTYPE_COUNT ? ckpt__dtypes[d].name : NULL;
}

int ckpt_dtype_parse(const char *s, ckpt_dtype *out, const char *ctx)
{
    for (int i = 0; i < CKPT_DTYPE_COUNT; i++)
        if (!strcmp(s, ckpt__dtypes[i].name)) {
            *out = (ckpt_dtype)i;
            return SH_OK;
        }
    return sh_err(SH_EFORMAT, "%s: unknown dtype \"%s\" (expected one of BOOL, U8, I8, F8_E5M2, "
                  "F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64, F4, "
                  "F6_E2M3, F6_E3M2)", ctx, s);
}

unsigned ckpt_dtype_bits(ckpt_dtype d)
{
    return (unsigned)d < CKPT_DTYPE_COUNT ? ckpt__dtypes[d].bits : 0;
}

int ckpt_dtype_is_float(ckpt_dtype d)
{
    return (unsigned)d < CKPT_DTYPE_COUNT && ckpt__dtypes[d].is_float;
}

static uint32_t ckpt__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float ckpt__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float ckpt_bf16_to_f32(uint16_t h) { return ckpt__bits_f32((uint32_t)h << 16); }

uint16_t ckpt_f32_to_bf16(float f)
{
    uint32_t u = ckpt__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);                                              /* ties to even */
    return (uint16_t)(u >> 16);
}

/* A small IEEE-like format: E exponent bits, M mantissa bits, bias B. */
typedef struct {
    int E, M, B;
    double max;  /* largest finite value */
    int has_inf; /* exponent all ones is inf/NaN (else e4m3fn: only S.1111.111 is NaN) */
} ckpt__fmt;

static const ckpt__fmt ckpt__f16 = {5, 10, 15, 65504.0, 1};
static const ckpt__fmt ckpt__e5m2 = {5, 2, 15, 57344.0, 1};
static const ckpt__fmt ckpt__e4m3 = {4, 3, 7, 448.0, 0};

static double ckpt__decode(const ckpt__fmt *f, uint32_t bits)
{
    uint32_t sign = (bits >> (f->E + f->M)) & 1;
    uint32_t ef = (bits >> f->M) & ((1u << f->E) - 1);
    uint32_t m = bits & ((1u << f->M) - 1);
    double v;
    if (f->has_inf && ef == (1u << f->E) - 1) v = m ? NAN : INFINITY;
    else if (!f->has_inf && ef == (1u << f->E) - 1 && m == (1u << f->M) - 1) v = NAN;
    else if (ef == 0) v = ldexp((double)m, 1 - f->B - f->M);
    else v = ldexp((double)(m | (1u << f->M)), (int)ef - f->B - f->M);
    return sign ? -v : v;
}

/* Rounds |x| to the format with ties to even; exact because x is a float
 * (hence exact in double) and the quantum is a power of two. */
static uint32_t ckpt__encode(const ckpt__fmt *f, float x, int saturate)
{
    uint32_t sign = (ckpt__f32_bits(x) >> 31) << (f->E + f->M);
    uint32_t all_e = ((1u << f->E) - 1) << f->M;
    if (isnan(x)) return sign | all_e | ((1u << f->M) - 1);
    double a = fabs((double)x);
    if (a == 0) return sign;
    int ex;
    frexp(a, &ex);
    int e = ex - 1, emin = 1 - f->B;
    if (e < emin) e = emin;
    double r = rint(ldexp(a, f->M - e)); /* default rounding mode: ties to even */
    if (isinf(a) || ldexp(r, e - f->M) > f->max) {
        if (saturate || !f->has_inf) return sign | ckpt__encode(f, (float)f->max, 1);
        return sign | all_e;
    }
    if (r >= ldexp(1.0, f->M + 1)) {
        e++;
        r = ldexp(1.0, f->M);
    }
    if (r < ldexp(1.0, f->M)) return sign | (uint32_t)r; /* subnormal */
    return sign | ((uint32_t)(e + f->B) << f->M) | ((uint32_t)r - (1u << f->M));
}

float ckpt_f16_to_f32(uint16_t h) { return (float)ckpt__decode(&ckpt__f16, h); }
uint16_t ckpt_f32_to_f16(float f) { return (uint16_t)ckpt__encode(&ckpt__f16, f, 0); }
float ckpt_e4m3_to_f32(uint8_t b) { return (float)ckpt__decode(&ckpt__e4m3, b); }
uint8_t ckpt_f32_to_e4m3(float f) { return (uint8_t)ckpt__encode(&ckpt__e4m3, f, 1); }
float ckpt_e5m2_to_f32(uint8_t b) { return (float)ckpt__decode(&ckpt__e5m2, b); }
uint8_t ckpt_f32_to_e5m2(float f) { return (uint8_t)ckpt__encode(&ckpt__e5m2, f, 0); }

double ckpt_elem_f64(ckpt_dtype d, const uint8_t *p, uint64_t i)
{
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    switch (d) {
    case CKPT_BOOL:
    case CKPT_U8: return p[i];
    case CKPT_I8: return (int8_t)p[i];
    case CKPT_F8_E4M3: return ckpt_e4m3_to_f32(p[i]);
    case CKPT_F8_E5M2: return ckpt_e5m2_to_f32(p[i]);
    case CKPT_I16: memcpy(&u16, p + 2 * i, 2); return (int16_t)u16;
    case CKPT_U16: memcpy(&u16, p + 2 * i, 2); return u16;
    case CKPT_F16: memcpy(&u16, p + 2 * i, 2); return ckpt_f16_to_f32(u16);
    case CKPT_BF16: memcpy(&u16, p + 2 * i, 2); return ckpt_bf16_to_f32(u16);
    case CKPT_I32: memcpy(&u32, p + 4 * i, 4); return (int32_t)u32;
    case CKPT_U32: memcpy(&u32, p + 4 * i, 4); return u32;
    case CKPT_F32: memcpy(&u32, p + 4 * i, 4); return ckpt__bits_f32(u32);
    case CKPT_F64: {
        double v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    case CKPT_I64: memcpy(&u64, p + 8 * i, 8); return (double)(int64_t)u64;
    case CKPT_U64: memcpy(&u64, p + 8 * i, 8); return (double)u64;
    default: return 0;
    }
}
