/* What kernels/cpu_attn.c (float32 caches) and kernels/cpu_attn_bf16.c (bfloat16 caches) share: e^x for
 * the softmax, an eight-lane horizontal sum, and the softmax itself (over float32 scores either way). */
#ifndef RILL_CPU_ATTN_COMMON_H
#define RILL_CPU_ATTN_COMMON_H

#include <math.h>
#include <stdint.h>

#define MAX_DIM 256

/* exp(x) for x <= 0 (softmax after the max is subtracted): x = n ln2 + r with
 * |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (relative error < 2e-7), 2^n by the
 * exponent bits. Below -87 the result is 0 (the float would be denormal). */
static inline float exp_nonpositive(float x) {
    const float clamped = x < -87.0f ? -87.0f : x;
    /* round to nearest even by the 1.5 * 2^23 trick (|value| < 2^22), as the vector lanes round */
    const float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = fmaf(-n, 1.428606765330187e-06f, fmaf(-n, 0.693145751953125f, clamped));
    float p = 1.0f / 720.0f;
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
    return x < -87.0f ? 0.0f : p * two_n.f;
}

#include "cpu_vec.h"

#ifdef RILL_AVX2
/* The eight lanes' sums of eight vectors, as one vector: [sum(a0), ..., sum(a7)]. */
static inline __m256 sum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
#endif

/* In place: s[i] -> softmax(scale * s, soft-capped), over one head's width scores. */
static void softmax(float *s, int64_t width, float scale, float softcap) {
    if (softcap > 0.0f) {
        for (int64_t i = 0; i < width; i++) s[i] = softcap * tanhf(s[i] * scale / softcap);
    } else {
#pragma omp simd
        for (int64_t i = 0; i < width; i++) s[i] *= scale;
    }
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < width; i++) m = s[i] > m ? s[i] : m;
    float sum = 0.0f;
    int64_t i = 0;
#ifdef RILL_AVX2
    __m256 sums = _mm256_setzero_ps();
    for (const __m256 mv = _mm256_set1_ps(m); i + 8 <= width; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
        _mm256_storeu_ps(s + i, e);
        sums = _mm256_add_ps(sums, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, sums);
    for (int l = 0; l < 8; l++) sum += lanes[l];
#endif
    for (; i < width; i++) {
        s[i] = exp_nonpositive(s[i] - m);
        sum += s[i];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t i = 0; i < width; i++) s[i] *= inv;
}

#endif
