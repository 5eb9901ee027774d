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

#endif
