/* bfloat16 <-> float32 for rill's CPU kernels (kernels/cpu_linear_bf16.c, cpu_attn_bf16.c, cpu_glue_bf16.c).
 *
 * Widening is exact (a bfloat16 is the top half of a float32). Narrowing rounds to nearest, ties to even,
 * with integer arithmetic, exactly as torch's c10::BFloat16 does (NaN -> 0x7fc0), and never with
 * vcvtneps2bf16, which flushes denormals: so a value rounds to the same bits here, in torch, and on
 * every machine whatever its vector width. */
#ifndef RILL_CPU_BF16_H
#define RILL_CPU_BF16_H

#include <stdint.h>

static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* x rounded to bfloat16 and widened back: what a torch bfloat16 op stores, as a float. */
static inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* The same three on eight lanes (the same bits as the scalar ones: integer rounding, NaN -> 0x7fc0). */
static inline __m256 bf16x8_widen(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
/* v rounded to bfloat16, left in the top half of each lane (the bottom half zero) */
static inline __m256i bf16x8_round_bits(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb),
                                       _mm256_set1_epi32((int)0xffff0000u));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
static inline __m256 bf16x8_round(__m256 v) { return _mm256_castsi256_ps(bf16x8_round_bits(v)); }
static inline void bf16x8_store(uint16_t *p, __m256 v) {
    const __m256i r = _mm256_srli_epi32(bf16x8_round_bits(v), 16);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
#endif

#endif
