/* What rill's CPU kernels (kernels/cpu_attn.c, kernels/cpu_glue.c) share: the AVX2 switch and e^x on
 * eight lanes. kernels/cpu_build.py compiles the .c files with this header beside them and counts it in
 * the library's hash. */
#ifndef RILL_CPU_VEC_H
#define RILL_CPU_VEC_H

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RILL_AVX2 1

/* e^x on eight lanes, x clamped to [-87, 88] and 0 below -87 (the float would be denormal): x = n ln2 + r
 * with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (relative error < 2e-7), 2^n by the
 * exponent bits, n rounded to nearest even. */
static inline __m256 exp8(__m256 x) {
    const __m256 low = _mm256_set1_ps(-87.0f);
    const __m256 c = _mm256_min_ps(_mm256_max_ps(x, low), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), c);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(two_n)), _mm256_cmp_ps(x, low, _CMP_GE_OQ));
}
#endif

#endif
