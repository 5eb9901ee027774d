/* rill's CPU "glue": the elementwise work of a decoder layer between its matrix products, in C over
 * raw float32 pointers, called through ctypes. Built with kernels/cpu_attn.c and kernels/cpu_linear.c
 * into one library by kernels/cpu_build.py; kernels/cpu_glue.py calls it and tests/test_cpu_glue.py
 * holds it to the torch code it replaces (models/llama.py's RMSNorm, rotary embedding, KV write and
 * SiLU-gated MLP).
 *
 * Why C: in torch each of these is several passes over the step's activations, one operator each
 * (an RMSNorm is six: pow, mean, add, rsqrt, mul, mul; the rotary embedding a cat, a neg, two muls
 * and an add for q and again for k; the KV write two index_puts), so a prefill chunk of 2,048 rows
 * spent about 12% of its time in them and a decode step of 64 rows about 9%, mostly dispatch. Here
 * each is one pass: a row is read once and written once.
 *
 * Results do not depend on the batch: every row is computed alone by the same loops in the same
 * order, whatever the other rows or the thread count. The rotary embedding computes exactly what
 * torch's x * cos + rotate_half(x) * sin computes (two rounded products, then their rounded sum:
 * no fused multiply-add), and the RMSNorm's sum of squares runs in eight-lane partial sums, so its
 * last bit can differ from torch's reduction.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_pool.h"
#include "cpu_vec.h"

/* Below this many elements a call runs on one thread: waking the pool costs more than it saves. */
#define PARALLEL_MIN 32768

/* sum of x[i]^2 over one row, in eight-lane partial sums (then lane 0..7 in order). */
static float sum_squares(const float *x, int64_t n) {
    int64_t i = 0;
    float total = 0.0f;
#ifdef RILL_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (; i + 16 <= n; i += 16) {
        const __m256 u = _mm256_loadu_ps(x + i), v = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(u, u, a0);
        a1 = _mm256_fmadd_ps(v, v, a1);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 u = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(u, u, a0);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(a0, a1));
    for (int l = 0; l < 8; l++) total += lanes[l];
#endif
    for (; i < n; i++) total += x[i] * x[i];
    return total;
}

/* out[r] = w * (x[r] * rsqrt(mean(x[r]^2) + eps)) for each of `rows` rows of `dim`, as models/llama.py's
 * RMSNorm computes it in float32. With delta: first x[r] += delta[r], in place (the residual stream),
 * and the norm is of the sum. x, delta and out are contiguous [rows, dim]; out may not alias x. */
typedef struct {
    float *x;
    const float *delta, *w;
    float eps;
    float *out;
    int64_t dim;
} RmsF32;

static void rmsf32_rows(void *arg, int64_t first, int64_t last) {
    const RmsF32 *a = arg;
    float *x = a->x, *out = a->out;
    const float *delta = a->delta, *w = a->w;
    const float eps = a->eps;
    const int64_t dim = a->dim;
    for (int64_t r = first; r < last; r++) {
        float *xr = x + r * dim, *o = out + r * dim;
        if (delta != NULL) {
            const float *d = delta + r * dim;
#pragma omp simd
            for (int64_t i = 0; i < dim; i++) xr[i] += d[i];
        }
        const float scale = 1.0f / sqrtf(sum_squares(xr, dim) / (float)dim + eps);
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) o[i] = w[i] * (xr[i] * scale);
    }
}

void rill_rms_norm_f32(float *x, const float *delta, const float *w, float eps, float *out, int64_t rows, int64_t dim,
                       int num_threads) {
    RmsF32 a = {x, delta, w, eps, out, dim};
    rill_pool_rows(rmsf32_rows, &a, rows, rows * dim >= PARALLEL_MIN ? num_threads : 1);
}

/* The rotary embedding of one head in place, rotate-half layout: x[d] = x[d] * c[d] + rot[d] * s[d]
 * with rot = (-x[half:], x[:half]). Products rounded, then summed: no contraction into an FMA, so the
 * bits are torch's. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static void rotate(float *x, const float *c, const float *s, int64_t dim) {
    const int64_t half = dim / 2;
    int64_t d = 0;
#ifdef RILL_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; d + 8 <= half; d += 8) {
        const __m256 lo = _mm256_loadu_ps(x + d), hi = _mm256_loadu_ps(x + half + d);
        const __m256 new_lo = _mm256_add_ps(_mm256_mul_ps(lo, _mm256_loadu_ps(c + d)),
                                            _mm256_mul_ps(_mm256_xor_ps(hi, sign), _mm256_loadu_ps(s + d)));
        const __m256 new_hi = _mm256_add_ps(_mm256_mul_ps(hi, _mm256_loadu_ps(c + half + d)),
                                            _mm256_mul_ps(lo, _mm256_loadu_ps(s + half + d)));
        _mm256_storeu_ps(x + d, new_lo);
        _mm256_storeu_ps(x + half + d, new_hi);
    }
#endif
    for (; d < half; d++) {
        const float lo = x[d], hi = x[half + d];
        const float a = lo * c[d], b = -hi * s[d];
        const float e = hi * c[half + d], f = lo * s[half + d];
        x[d] = a + b;
        x[half + d] = e + f;
    }
}
#pragma GCC pop_options

/* One step's attention inputs, from the fused qkv projection's output, in one pass:
 *   qkv:          [rows, qkv_stride] floats; a row is q (num_heads x dim), k, v (num_kv_heads x dim each)
 *   cos, sin:     [rows, dim], the rows' positions' tables (rotate-half: the two halves equal)
 *   k/v_cache:    [num_slots, num_kv_heads, dim], contiguous; slots[r] < 0: the row is not written
 * q is rotated in place; k is rotated in place and, with v, copied into the row's cache slot.
 * dim must be even. */
typedef struct {
    float *qkv;
    int64_t qkv_stride, num_heads, num_kv_heads, dim, kv;
    const float *cos, *sin;
    float *k_cache, *v_cache;
    const int64_t *slots;
} RotaryF32;

static void rotaryf32_rows(void *arg, int64_t first, int64_t last) {
    const RotaryF32 *a = arg;
    float *qkv = a->qkv, *k_cache = a->k_cache, *v_cache = a->v_cache;
    const float *cos = a->cos, *sin = a->sin;
    const int64_t *slots = a->slots;
    const int64_t qkv_stride = a->qkv_stride, num_heads = a->num_heads, num_kv_heads = a->num_kv_heads;
    const int64_t dim = a->dim, kv = a->kv;
    for (int64_t r = first; r < last; r++) {
        float *row = qkv + r * qkv_stride;
        const float *c = cos + r * dim, *s = sin + r * dim;
        for (int64_t h = 0; h < num_heads + num_kv_heads; h++) rotate(row + h * dim, c, s, dim);
        if (slots[r] >= 0) {
            memcpy(k_cache + slots[r] * kv, row + num_heads * dim, sizeof(float) * (size_t)kv);
            memcpy(v_cache + slots[r] * kv, row + num_heads * dim + kv, sizeof(float) * (size_t)kv);
        }
    }
}

void rill_rotary_kv_f32(float *qkv, int64_t qkv_stride, int64_t rows, int64_t num_heads, int64_t num_kv_heads,
                        int64_t dim, const float *cos, const float *sin, float *k_cache, float *v_cache,
                        const int64_t *slots, int num_threads) {
    const int64_t kv = num_kv_heads * dim;
    RotaryF32 a = {qkv, qkv_stride, num_heads, num_kv_heads, dim, kv, cos, sin, k_cache, v_cache, slots};
    rill_pool_rows(rotaryf32_rows, &a, rows, rows * qkv_stride >= PARALLEL_MIN ? num_threads : 1);
}

/* out[r][i] = silu(g) * u = g / (1 + e^-g) * u, with g = gate_up[r][i] and u = gate_up[r][inter + i]:
 * the gated MLP's activation, gate_up [rows, 2 * inter] -> out [rows, inter], contiguous. */
typedef struct {
    const float *gate_up;
    int64_t inter;
    float *out;
} SiluF32;

static void siluf32_rows(void *arg, int64_t first, int64_t last) {
    const SiluF32 *a = arg;
    const float *gate_up = a->gate_up;
    const int64_t inter = a->inter;
    float *out = a->out;
    for (int64_t r = first; r < last; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
#ifdef RILL_AVX2
        const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
        for (; i + 8 <= inter; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 e = exp8(_mm256_xor_ps(gv, sign));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < inter; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

void rill_silu_mul_f32(const float *gate_up, int64_t rows, int64_t inter, float *out, int num_threads) {
    SiluF32 a = {gate_up, inter, out};
    rill_pool_rows(siluf32_rows, &a, rows, rows * inter >= PARALLEL_MIN ? num_threads : 1);
}

