/* rill's CPU glue for bfloat16 models: RMSNorm (with the residual add), the rotary embedding with the KV
 * write, and SiLU-times-up, as kernels/cpu_glue.c does for float32, over bfloat16 tensors; called through
 * ctypes (kernels/cpu_glue.py).
 *
 * Each computes what models/llama.py's torch code computes in bfloat16, where every torch op widens its
 * inputs to float32 and rounds its result to bfloat16: the residual add is rounded, the RMSNorm's
 * statistics are float32 and its normalized row is rounded before the weight multiplies it (as
 * transformers' RMSNorm does), the rotary embedding rounds both products and their sum, SiLU is rounded
 * before the up projection multiplies it. Rows are independent: the result does not depend on the other
 * rows or the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_bf16.h"
#include "cpu_pool.h"
#include "cpu_vec.h"

#define PARALLEL_MIN 32768 /* elements: below, one thread (as cpu_glue.c) */

/* sum of x[i]^2 over a bfloat16 row, in eight partial sums (lane i % 8), then lanes 0..7 in order. */
static float sum_squares(const uint16_t *x, int64_t n) {
    float part[8] = {0};
    int64_t i = 0;
#ifdef RILL_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = bf16x8_widen(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    _mm256_storeu_ps(part, acc);
#endif
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            const float v = bf16_to_f32(x[i + l]);
            part[l] = fmaf(v, v, part[l]);
        }
    float total = 0.0f;
    for (int l = 0; l < 8; l++) total += part[l];
    for (; i < n; i++) total = fmaf(bf16_to_f32(x[i]), bf16_to_f32(x[i]), total);
    return total;
}

/* out[r] = w * bf16(x[r] * rsqrt(mean(x[r]^2) + eps)); with delta, first x[r] = bf16(x[r] + delta[r]) in
 * place (the residual stream). All bfloat16 [rows, dim], contiguous; out may not alias x. */
typedef struct {
    uint16_t *x;
    const uint16_t *delta, *w;
    float eps;
    uint16_t *out;
    int64_t dim;
} RmsBf16;

static void rmsbf16_rows(void *arg, int64_t first, int64_t last) {
    const RmsBf16 *a = arg;
    uint16_t *x = a->x, *out = a->out;
    const uint16_t *delta = a->delta, *w = a->w;
    const float eps = a->eps;
    const int64_t dim = a->dim;
    for (int64_t r = first; r < last; r++) {
        uint16_t *xr = x + r * dim, *o = out + r * dim;
        int64_t i = 0;
        if (delta != NULL) {
            const uint16_t *d = delta + r * dim;
#ifdef RILL_AVX2
            for (; i + 8 <= dim; i += 8) bf16x8_store(xr + i, _mm256_add_ps(bf16x8_widen(xr + i), bf16x8_widen(d + i)));
#endif
            for (; i < dim; i++) xr[i] = f32_to_bf16(bf16_to_f32(xr[i]) + bf16_to_f32(d[i]));
        }
        const float scale = 1.0f / sqrtf(sum_squares(xr, dim) / (float)dim + eps);
        i = 0;
#ifdef RILL_AVX2
        const __m256 sv = _mm256_set1_ps(scale);
        for (; i + 8 <= dim; i += 8)
            bf16x8_store(o + i,
                         _mm256_mul_ps(bf16x8_widen(w + i), bf16x8_round(_mm256_mul_ps(bf16x8_widen(xr + i), sv))));
#endif
        for (; i < dim; i++) o[i] = f32_to_bf16(bf16_to_f32(w[i]) * round_bf16(bf16_to_f32(xr[i]) * scale));
    }
}

void rill_rms_norm_bf16(uint16_t *x, const uint16_t *delta, const uint16_t *w, float eps, uint16_t *out, int64_t rows,
                        int64_t dim, int num_threads) {
    RmsBf16 a = {x, delta, w, eps, out, dim};
    rill_pool_rows(rmsbf16_rows, &a, rows, rows * dim >= PARALLEL_MIN ? num_threads : 1);
}

/* One head in place, rotate-half: x[d] = bf16(bf16(x[d] c[d]) + bf16(rot[d] s[d])), rot = (-x[half:], x[:half]).
 * The products of two bfloat16 are exact in float32, so only the roundings written here happen. */
static void rotate(uint16_t *x, const uint16_t *c, const uint16_t *s, int64_t dim) {
    const int64_t half = dim / 2;
    int64_t d = 0;
#ifdef RILL_AVX2
    for (; d + 8 <= half; d += 8) {
        const __m256 lo = bf16x8_widen(x + d), hi = bf16x8_widen(x + half + d);
        const __m256 nhi = _mm256_xor_ps(hi, _mm256_set1_ps(-0.0f));
        const __m256 a = bf16x8_round(_mm256_mul_ps(lo, bf16x8_widen(c + d)));
        const __m256 b = bf16x8_round(_mm256_mul_ps(nhi, bf16x8_widen(s + d)));
        const __m256 e = bf16x8_round(_mm256_mul_ps(hi, bf16x8_widen(c + half + d)));
        const __m256 f = bf16x8_round(_mm256_mul_ps(lo, bf16x8_widen(s + half + d)));
        bf16x8_store(x + d, _mm256_add_ps(a, b));
        bf16x8_store(x + half + d, _mm256_add_ps(e, f));
    }
#endif
    for (; d < half; d++) {
        const float lo = bf16_to_f32(x[d]), hi = bf16_to_f32(x[half + d]);
        const float a = round_bf16(lo * bf16_to_f32(c[d])), b = round_bf16(-hi * bf16_to_f32(s[d]));
        const float e = round_bf16(hi * bf16_to_f32(c[half + d])), f = round_bf16(lo * bf16_to_f32(s[half + d]));
        x[d] = f32_to_bf16(a + b);
        x[half + d] = f32_to_bf16(e + f);
    }
}

/* As rill_rotary_kv_f32 (cpu_glue.c) over bfloat16: qkv [rows, qkv_stride], cos/sin [rows, dim], caches
 * [num_slots, num_kv_heads, dim]; slots[r] < 0: the row is not written. */
typedef struct {
    uint16_t *qkv;
    int64_t qkv_stride, num_heads, num_kv_heads, dim, kv;
    const uint16_t *cos, *sin;
    uint16_t *k_cache, *v_cache;
    const int64_t *slots;
} RotaryBf16;

static void rotarybf16_rows(void *arg, int64_t first, int64_t last) {
    const RotaryBf16 *a = arg;
    uint16_t *qkv = a->qkv, *k_cache = a->k_cache, *v_cache = a->v_cache;
    const uint16_t *cos = a->cos, *sin = a->sin;
    const int64_t *slots = a->slots;
    const int64_t qkv_stride = a->qkv_stride, num_heads = a->num_heads, num_kv_heads = a->num_kv_heads;
    const int64_t dim = a->dim, kv = a->kv;
    for (int64_t r = first; r < last; r++) {
        uint16_t *row = qkv + r * qkv_stride;
        const uint16_t *c = cos + r * dim, *s = sin + r * dim;
        for (int64_t h = 0; h < num_heads + num_kv_heads; h++) rotate(row + h * dim, c, s, dim);
        if (slots[r] >= 0) {
            memcpy(k_cache + slots[r] * kv, row + num_heads * dim, sizeof(uint16_t) * (size_t)kv);
            memcpy(v_cache + slots[r] * kv, row + num_heads * dim + kv, sizeof(uint16_t) * (size_t)kv);
        }
    }
}

void rill_rotary_kv_bf16(uint16_t *qkv, int64_t qkv_stride, int64_t rows, int64_t num_heads, int64_t num_kv_heads,
                         int64_t dim, const uint16_t *cos, const uint16_t *sin, uint16_t *k_cache, uint16_t *v_cache,
                         const int64_t *slots, int num_threads) {
    const int64_t kv = num_kv_heads * dim;
    RotaryBf16 a = {qkv, qkv_stride, num_heads, num_kv_heads, dim, kv, cos, sin, k_cache, v_cache, slots};
    rill_pool_rows(rotarybf16_rows, &a, rows, rows * qkv_stride >= PARALLEL_MIN ? num_threads : 1);
}

/* out[r][i] = bf16(bf16(silu(g)) * u): gate_up [rows, 2 inter] -> out [rows, inter], bfloat16. */
typedef struct {
    const uint16_t *gate_up;
    int64_t inter;
    uint16_t *out;
} SiluBf16;

static void silubf16_rows(void *arg, int64_t first, int64_t last) {
    const SiluBf16 *a = arg;
    const uint16_t *gate_up = a->gate_up;
    const int64_t inter = a->inter;
    uint16_t *out = a->out;
    for (int64_t r = first; r < last; r++) {
        const uint16_t *g = gate_up + r * 2 * inter, *u = g + inter;
        uint16_t *o = out + r * inter;
        int64_t i = 0;
#ifdef RILL_AVX2
        const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
        for (; i + 8 <= inter; i += 8) {
            const __m256 x = bf16x8_widen(g + i);
            const __m256 silu = bf16x8_round(_mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, sign)))));
            bf16x8_store(o + i, _mm256_mul_ps(silu, bf16x8_widen(u + i)));
        }
#endif
        for (; i < inter; i++) {
            const float x = bf16_to_f32(g[i]);
            o[i] = f32_to_bf16(round_bf16(x / (1.0f + expf(-x))) * bf16_to_f32(u[i]));
        }
    }
}

void rill_silu_mul_bf16(const uint16_t *gate_up, int64_t rows, int64_t inter, uint16_t *out, int num_threads) {
    SiluBf16 a = {gate_up, inter, out};
    rill_pool_rows(silubf16_rows, &a, rows, rows * inter >= PARALLEL_MIN ? num_threads : 1);
}

