/* rill's CPU linear layer in bfloat16: y = x W^T + b with x, W, b and y bfloat16 (y optionally float32),
 * products summed in float32, over a weight packed once; called through ctypes (kernels/cpu_linear.py).
 *
 * Why: a decode step's time is the time to read the weights, and bfloat16 weights are half the bytes of
 * float32 ones. Where the CPU has AVX-512 BF16 (Zen 4, Intel Cooper Lake and later), `vdpbf16ps` does
 * two multiply-adds per lane per instruction, twice an FP32 FMA's; elsewhere the weights are widened
 * to float32 in registers (AVX2: a shift or a mask per eight weights) and fed to FMAs.
 *
 * Layout: the weight [N, K] is packed into panels of 16 output columns and pairs of input features,
 * [ceil(N/16)][ceil(K/2)][16] 32-bit words, word = W[n][2p] | W[n][2p + 1] << 16 (K padded with a zero
 * feature when odd), 64-byte aligned: one k pair of a panel is one zmm register, the operand layout
 * `vdpbf16ps` reads. (Builds without it lay a pair's 64 bytes out as its 16 odd features' weights, then
 * its 16 even ones, so that each half widens with one zero-extend and one shift.) The activations are packed per call: with AVX-512 BF16 in the same pairs,
 * [K/2][tm] words; otherwise widened to float32, [K/2][2][tm] (the odd feature's row, then the even's).
 *
 * One order of arithmetic on every path: y[m][n] is one chain over the k pairs in order, starting from
 * 0, and per pair acc += x[2p+1] W[2p+1] then acc += x[2p] W[2p], each a fused multiply-add (the
 * product of two bfloat16 is exact in float32, so fma(a, b, acc) is the rounded acc + ab), which is
 * the order Intel's manual gives for `vdpbf16ps` (its denormal inputs read as zero, its denormal
 * results flushed: the one place the paths can differ). So a row's result does not depend on the other
 * rows, the tile it lands in, the thread count or the call's size, and every machine taking a path
 * gets the same bits. The float32 sum (and bias) is rounded once to bfloat16 at the end, as torch's
 * bfloat16 linear does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_bf16.h"
#include "cpu_pool.h"

#define PANEL 16 /* output columns per weight panel */
#define BLOCK_M 96 /* rows of x packed at a time */
/* rows per activation panel, AVX2 and plain C: 5 x 16 in ten accumulators. At 6 rows (twelve, as the float32
 * tiles) GCC 12 spilled one to the stack and the tile ran at half speed: one thread, [1280, 768] at 64 rows
 * 2.85 ms against 1.47 at 5 rows and 1.57 at 4; [4096, 768] at 256 rows 45.4 / 19.0 / 21.0 ms. */
#define TILE_M 5
/* With AVX-512 BF16, a tile of at most 8 rows (a decode step's) asks for its panels' bytes this far ahead
 * into L1: at 8 rows the layers of random-qwen2-100m read their weights at 27-36 GB/s without it and 34-44
 * with it on a 2-core Zen 5 that streams 45-52 (2,048 to 8,192 bytes measured alike; 16,384 worse). */
#define PF_DIST 4096
#define WIDE_M 12 /* rows per activation panel with AVX-512 BF16 (8 for a call of at most 8 rows) */

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define RILL_BF16_DP 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RILL_BF16_AVX2 1
#endif

/* Which path this build takes, for logs and tests: "avx512_bf16", "avx2" or "generic" (plain C). */
const char *rill_bf16_path(void) {
#if defined(RILL_BF16_DP)
    return "avx512_bf16";
#elif defined(RILL_BF16_AVX2)
    return "avx2";
#else
    return "generic";
#endif
}

void rill_linear_pack_bf16(const uint16_t *w, int64_t n, int64_t k, uint32_t *out) {
    const int64_t panels = (n + PANEL - 1) / PANEL, k2 = (k + 1) / 2;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t q = 0; q < k2; q++)
            for (int j = 0; j < PANEL; j++) {
                const int64_t col = p * PANEL + j;
                const uint16_t even = col < n ? w[col * k + 2 * q] : 0;
                const uint16_t odd = col < n && 2 * q + 1 < k ? w[col * k + 2 * q + 1] : 0;
#ifdef RILL_BF16_DP
                out[(p * k2 + q) * PANEL + j] = (uint32_t)even | (uint32_t)odd << 16;
#else /* the pair's 16 odd features' weights, then its 16 even ones: each half widens on its own */
                uint16_t *half = (uint16_t *)(out + (p * k2 + q) * PANEL);
                half[j] = odd;
                half[PANEL + j] = even;
#endif
            }
}

/* One row's float32 sums (+ bias) rounded into y (bfloat16, or float32 when out_f32), cols of them. */
static void store_row(const float *acc, const uint16_t *bias, void *y, int64_t off, int cols, int out_f32) {
    for (int j = 0; j < cols; j++) {
        const float v = bias ? acc[j] + bf16_to_f32(bias[j]) : acc[j];
        if (out_f32)
            ((float *)y)[off + j] = v;
        else
            ((uint16_t *)y)[off + j] = f32_to_bf16(v);
    }
}

#ifdef RILL_BF16_DP
/* rows of x as pairs: out [k2][tm] words, rows past `rows` zero. Inlined with a constant tm. */
static inline __attribute__((always_inline)) void pack_rows(const uint16_t *x, int64_t ldx, int rows, int64_t k,
                                                            uint32_t *out, int tm) {
    const int64_t k2 = (k + 1) / 2;
    for (int64_t q = 0; q < k2; q++)
        for (int i = 0; i < tm; i++) {
            const uint16_t *r = x + i * ldx;
            out[q * tm + i] = i < rows ? (uint32_t)r[2 * q] | (2 * q + 1 < k ? (uint32_t)r[2 * q + 1] << 16 : 0) : 0;
        }
}
#define PACKED_T uint32_t
#define PACKED_PER_PAIR 1

/* y rows [0..R) x NP panels = a [k2][tm] (first R rows) times panels b and b + pstride: one register per
 * row and panel, each broadcast pair feeding NP dot products. */
#define DP_ROW(NP, R, i)                                                                                 \
    if (R > i) {                                                                                         \
        const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[i]);                                       \
        c##i = _mm512_dpbf16_ps(c##i, x, b0);                                                            \
        if (NP > 1) d##i = _mm512_dpbf16_ps(d##i, x, b1);                                                \
    }
#define DP_STORE(NP, R, i)                                                                               \
    if (R > i) {                                                                                         \
        float t[2 * PANEL];                                                                              \
        _mm512_storeu_ps(t, c##i);                                                                       \
        if (NP > 1) _mm512_storeu_ps(t + PANEL, d##i);                                                   \
        store_row(t, bias, y, off + i * ldy, NP > 1 ? 2 * PANEL : cols, out_f32);                        \
    }
#define DP_R(NP, R)                                                                                      \
    static void dp##NP##_##R(const uint32_t *restrict a, const uint32_t *restrict b, int64_t pstride,    \
                             int64_t k2, const uint16_t *bias, void *y, int64_t off, int64_t ldy, int cols, \
                             int out_f32, int64_t tm) {                                                   \
        __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;  \
        __m512 c8 = c0, c9 = c0, c10 = c0, c11 = c0;                                                      \
        __m512 d0 = c0, d1 = c0, d2 = c0, d3 = c0, d4 = c0, d5 = c0, d6 = c0, d7 = c0;                    \
        __m512 d8 = c0, d9 = c0, d10 = c0, d11 = c0;                                                      \
        const uint32_t *restrict e = b + pstride;                                                         \
        _Pragma("GCC unroll 2") for (int64_t q = 0; q < k2; q++, a += tm, b += PANEL, e += PANEL) {      \
            if (R <= 8) {                                                                                 \
                __builtin_prefetch((const char *)b + PF_DIST, 0, 3);                                      \
                if (NP > 1) __builtin_prefetch((const char *)e + PF_DIST, 0, 3);                          \
            }                                                                                             \
            const __m512bh b0 = (__m512bh)_mm512_load_si512(b);                                          \
            const __m512bh b1 = NP > 1 ? (__m512bh)_mm512_load_si512(e) : b0;                             \
            DP_ROW(NP, R, 0) DP_ROW(NP, R, 1) DP_ROW(NP, R, 2) DP_ROW(NP, R, 3)                            \
            DP_ROW(NP, R, 4) DP_ROW(NP, R, 5) DP_ROW(NP, R, 6) DP_ROW(NP, R, 7)                            \
            DP_ROW(NP, R, 8) DP_ROW(NP, R, 9) DP_ROW(NP, R, 10) DP_ROW(NP, R, 11)                          \
        }                                                                                                 \
        DP_STORE(NP, R, 0) DP_STORE(NP, R, 1) DP_STORE(NP, R, 2) DP_STORE(NP, R, 3)                        \
        DP_STORE(NP, R, 4) DP_STORE(NP, R, 5) DP_STORE(NP, R, 6) DP_STORE(NP, R, 7)                        \
        DP_STORE(NP, R, 8) DP_STORE(NP, R, 9) DP_STORE(NP, R, 10) DP_STORE(NP, R, 11)                      \
    }
#define DP_ROWS(NP)                                                                                      \
    DP_R(NP, 1) DP_R(NP, 2) DP_R(NP, 3) DP_R(NP, 4) DP_R(NP, 5) DP_R(NP, 6)                              \
    DP_R(NP, 7) DP_R(NP, 8) DP_R(NP, 9) DP_R(NP, 10) DP_R(NP, 11) DP_R(NP, 12)
DP_ROWS(1)
DP_ROWS(2)
typedef void (*dp_fn)(const uint32_t *restrict, const uint32_t *restrict, int64_t, int64_t, const uint16_t *, void *,
                      int64_t, int64_t, int, int, int64_t);
static const dp_fn DP[2][WIDE_M] = {
    {dp1_1, dp1_2, dp1_3, dp1_4, dp1_5, dp1_6, dp1_7, dp1_8, dp1_9, dp1_10, dp1_11, dp1_12},
    {dp2_1, dp2_2, dp2_3, dp2_4, dp2_5, dp2_6, dp2_7, dp2_8, dp2_9, dp2_10, dp2_11, dp2_12},
};

#else /* AVX2 or plain C: activations widened to float32 */
static inline __attribute__((always_inline)) void pack_rows(const uint16_t *x, int64_t ldx, int rows, int64_t k,
                                                            float *out, int tm) {
    const int64_t k2 = (k + 1) / 2;
    for (int64_t q = 0; q < k2; q++)
        for (int i = 0; i < tm; i++) {
            const uint16_t *r = x + i * ldx;
            out[(2 * q) * tm + i] = i < rows && 2 * q + 1 < k ? bf16_to_f32(r[2 * q + 1]) : 0.0f;
            out[(2 * q + 1) * tm + i] = i < rows ? bf16_to_f32(r[2 * q]) : 0.0f;
        }
}
#define PACKED_T float
#define PACKED_PER_PAIR 2
#endif

#ifdef RILL_BF16_AVX2
/* eight bfloat16 -> eight float32 (exact): zero-extend, then shift into the top half */
static inline __m256 widen8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_load_si128((const __m128i *)p)), 16));
}
/* y rows [0..R) x one panel = a [k2][2][5] times b [k2][2][16]: per pair the odd features' 16 weights,
 * widened, then the even's; named accumulators (up to ten), as cpu_linear.c's AVX2 tiles. */
#define W_ROW(R, i, A)                                                                                   \
    if (R > i) {                                                                                         \
        const __m256 x = _mm256_broadcast_ss((A) + i);                                                   \
        c##i##0 = _mm256_fmadd_ps(x, w0, c##i##0);                                                       \
        c##i##1 = _mm256_fmadd_ps(x, w1, c##i##1);                                                       \
    }
#define W_STORE(R, i)                                                                                    \
    if (R > i) {                                                                                         \
        float t[PANEL];                                                                                  \
        _mm256_storeu_ps(t, c##i##0);                                                                    \
        _mm256_storeu_ps(t + 8, c##i##1);                                                                \
        store_row(t, bias, y, off + i * ldy, cols, out_f32);                                             \
    }
#define W_TILE(R)                                                                                        \
    static void tile##R(const float *restrict a, const uint32_t *restrict b, int64_t k2, const uint16_t *bias, \
                        void *y, int64_t off, int64_t ldy, int cols, int out_f32) {                       \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,          \
               c30 = c00, c31 = c00, c40 = c00, c41 = c00;                                                \
        _Pragma("GCC unroll 2") for (int64_t q = 0; q < k2; q++, a += 2 * TILE_M, b += PANEL) {          \
            const uint16_t *h = (const uint16_t *)b;                                                      \
            {                                                                                             \
                const __m256 w0 = widen8(h), w1 = widen8(h + 8);                                          \
                W_ROW(R, 0, a) W_ROW(R, 1, a) W_ROW(R, 2, a) W_ROW(R, 3, a) W_ROW(R, 4, a)                 \
            }                                                                                             \
            {                                                                                             \
                const __m256 w0 = widen8(h + PANEL), w1 = widen8(h + PANEL + 8);                          \
                const float *e = a + TILE_M;                                                              \
                W_ROW(R, 0, e) W_ROW(R, 1, e) W_ROW(R, 2, e) W_ROW(R, 3, e) W_ROW(R, 4, e)                 \
            }                                                                                             \
        }                                                                                                 \
        W_STORE(R, 0) W_STORE(R, 1) W_STORE(R, 2) W_STORE(R, 3) W_STORE(R, 4)                             \
    }
W_TILE(1)
W_TILE(2)
W_TILE(3)
W_TILE(4)
W_TILE(5)

/* From FLAT_MIN_ROWS rows a call widens each weight panel once into a float32 scratch (the order kept: per
 * pair the odd feature's 16 weights, then the even's) and runs cpu_linear.c's float32 6 x 16 tiles over it,
 * activations packed in the same order, [2 k2][6]: the same chain of FMAs in the same order, so the same
 * bits, without widening the panel again for every tile of rows. One thread, [1,280 x 768] at 512 rows:
 * 17.4 ms widening in the tiles, against the float32 kernel's 15.2. Decode batches keep the tiles above,
 * which read the bfloat16 panel straight from memory. */
#define FLAT_M 6
#define FLAT_MIN_ROWS 9
#define F_ROW(R, i)                                                                                      \
    if (R > i) {                                                                                         \
        const __m256 x = _mm256_broadcast_ss(a + i);                                                     \
        c##i##0 = _mm256_fmadd_ps(x, b0, c##i##0);                                                       \
        c##i##1 = _mm256_fmadd_ps(x, b1, c##i##1);                                                       \
    }
#define F_TILE(R)                                                                                        \
    static void flat##R(const float *restrict a, const float *restrict b, int64_t kk, const uint16_t *bias, \
                        void *y, int64_t off, int64_t ldy, int cols, int out_f32) {                       \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,          \
               c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;                          \
        _Pragma("GCC unroll 4") for (int64_t q = 0; q < kk; q++, a += FLAT_M, b += PANEL) {              \
            const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);                              \
            F_ROW(R, 0) F_ROW(R, 1) F_ROW(R, 2) F_ROW(R, 3) F_ROW(R, 4) F_ROW(R, 5)                       \
        }                                                                                                 \
        W_STORE(R, 0) W_STORE(R, 1) W_STORE(R, 2) W_STORE(R, 3) W_STORE(R, 4) W_STORE(R, 5)               \
    }
F_TILE(1)
F_TILE(2)
F_TILE(3)
F_TILE(4)
F_TILE(5)
F_TILE(6)
typedef void (*flat_fn)(const float *restrict, const float *restrict, int64_t, const uint16_t *, void *, int64_t,
                        int64_t, int, int);
static const flat_fn FLAT[FLAT_M] = {flat1, flat2, flat3, flat4, flat5, flat6};

/* one packed panel (k2 pairs of 32 bfloat16) -> 32 k2 floats, in order */
static void widen_panel(const uint32_t *b, int64_t k2, float *out) {
    const uint16_t *h = (const uint16_t *)b;
    for (int64_t i = 0; i < k2 * 2 * PANEL; i += 8) _mm256_store_ps(out + i, widen8(h + i));
}
#endif

#ifndef RILL_BF16_DP
static void tile(const float *restrict a, const uint32_t *restrict b, int64_t k2, const uint16_t *bias, void *y,
                 int64_t off, int64_t ldy, int rows, int cols, int out_f32) {
#ifdef RILL_BF16_AVX2
    switch (rows) {
    case 5: tile5(a, b, k2, bias, y, off, ldy, cols, out_f32); return;
    case 4: tile4(a, b, k2, bias, y, off, ldy, cols, out_f32); return;
    case 3: tile3(a, b, k2, bias, y, off, ldy, cols, out_f32); return;
    case 2: tile2(a, b, k2, bias, y, off, ldy, cols, out_f32); return;
    default: tile1(a, b, k2, bias, y, off, ldy, cols, out_f32); return;
    }
#else
    float acc[TILE_M][PANEL] = {{0}};
    for (int64_t q = 0; q < k2; q++, a += 2 * TILE_M, b += PANEL)
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < PANEL; j++) {
                const uint16_t *h = (const uint16_t *)b;
                const float odd = bf16_to_f32(h[j]), even = bf16_to_f32(h[PANEL + j]);
                acc[i][j] = __builtin_fmaf(a[TILE_M + i], even, __builtin_fmaf(a[i], odd, acc[i][j]));
            }
    for (int i = 0; i < rows; i++) store_row(acc[i], bias, y, off + i * ldy, cols, out_f32);
#endif
}
#endif

/* One call's state, shared by the chunks of its two jobs per block of rows (cpu_pool.h): packing the
 * block's tiles of rows, then the products, in chunks of PAIRS_PER_CHUNK panel pairs (AVX-512 BF16) and
 * then one panel a chunk. */
#define PAIRS_PER_CHUNK 4
typedef struct {
    const uint16_t *x, *bias;
    const uint32_t *packed;
    void *y;
    PACKED_T *rows;
    float *widened; /* AVX2, from FLAT_MIN_ROWS rows: one widened panel per thread */
    int64_t ldx, n, k, k2, panels, per_tile, panel_floats, m0, mb, tiles, pair_chunks, first_single;
    int tm, out_f32, flat;
} Call;

static void pack_chunk(void *arg, int64_t t, int thread) {
    (void)thread;
    const Call *c = arg;
    const int64_t left = c->mb - t * c->tm;
    const int r = left < c->tm ? (int)left : c->tm;
    const uint16_t *src = c->x + (c->m0 + t * c->tm) * c->ldx;
#ifdef RILL_BF16_DP
    if (c->tm == 8)
        pack_rows(src, c->ldx, r, c->k, c->rows + t * c->per_tile, 8);
    else
        pack_rows(src, c->ldx, r, c->k, c->rows + t * c->per_tile, WIDE_M);
#else
#ifdef RILL_BF16_AVX2
    if (c->flat) {
        pack_rows(src, c->ldx, r, c->k, c->rows + t * c->per_tile, FLAT_M);
        return;
    }
#endif
    pack_rows(src, c->ldx, r, c->k, c->rows + t * c->per_tile, TILE_M);
#endif
}

static void product_chunk(void *arg, int64_t chunk, int thread) {
    const Call *c = arg;
    const int64_t n = c->n, k2 = c->k2, tm = c->tm, mb = c->mb, m0 = c->m0;
#ifdef RILL_BF16_DP
    if (chunk < c->pair_chunks) { /* whole panels, two at a time */
        const int64_t pairs = (n / PANEL) / 2;
        const int64_t last = (chunk + 1) * PAIRS_PER_CHUNK < pairs ? (chunk + 1) * PAIRS_PER_CHUNK : pairs;
        for (int64_t g = chunk * PAIRS_PER_CHUNK; g < last; g++)
            for (int64_t t = 0; t < c->tiles; t++) {
                const int64_t left = mb - t * tm, p = 2 * g;
                DP[1][(left < tm ? left : tm) - 1](c->rows + t * c->per_tile, c->packed + p * k2 * PANEL, k2 * PANEL,
                                                   k2,
                                                   c->bias ? c->bias + p * PANEL : NULL, c->y,
                                                   (m0 + t * tm) * n + p * PANEL, n, PANEL, c->out_f32, tm);
            }
        return;
    }
#endif
    const int64_t p = c->first_single + (chunk - c->pair_chunks); /* one panel */
    const int64_t left_cols = n - p * PANEL;
    const int cols = left_cols < PANEL ? (int)left_cols : PANEL;
    for (int64_t t = 0; t < c->tiles; t++) {
        const int64_t left = mb - t * tm;
        const int r = left < tm ? (int)left : (int)tm;
        const int64_t off = (m0 + t * tm) * n + p * PANEL;
        const uint16_t *pb = c->bias ? c->bias + p * PANEL : NULL;
#ifdef RILL_BF16_AVX2
        if (c->flat) {
            float *w = c->widened + (int64_t)thread * c->panel_floats;
            if (t == 0)
                widen_panel(c->packed + p * k2 * PANEL, k2, w);
            FLAT[r - 1](c->rows + t * c->per_tile, w, 2 * k2, pb, c->y, off, n, cols, c->out_f32);
            continue;
        }
#else
        (void)thread;
#endif
#ifdef RILL_BF16_DP
        DP[0][r - 1](c->rows + t * c->per_tile, c->packed + p * k2 * PANEL, 0, k2, pb, c->y, off, n, cols, c->out_f32,
                     tm);
#else
        tile(c->rows + t * c->per_tile, c->packed + p * k2 * PANEL, k2, pb, c->y, off, n, r, cols, c->out_f32);
#endif
    }
}

/* y [m, n] (row stride n; bfloat16, or float32 when out_f32) = x [m, k] bfloat16 (row stride ldx) times
 * the packed weight, plus bias [n] bfloat16 (or NULL). Returns 0, or -1 when the scratch for the packed
 * rows cannot be had. */
int rill_linear_bf16(const uint16_t *x, int64_t ldx, const uint32_t *packed, const uint16_t *bias, void *y,
                     int out_f32, int64_t m, int64_t n, int64_t k, int num_threads) {
    if (m <= 0 || n <= 0)
        return 0;
    if (num_threads < 1)
        num_threads = 1;
    Call c = {.x = x, .bias = bias, .packed = packed, .y = y, .ldx = ldx, .n = n, .k = k, .k2 = (k + 1) / 2,
              .panels = (n + PANEL - 1) / PANEL, .out_f32 = out_f32};
#ifdef RILL_BF16_DP
    c.tm = m <= 8 ? 8 : WIDE_M; /* up to 8 rows (decode) in panels of 8 */
    c.pair_chunks = ((n / PANEL) / 2 + PAIRS_PER_CHUNK - 1) / PAIRS_PER_CHUNK;
    c.first_single = (n / PANEL) / 2 * 2;
#elif defined(RILL_BF16_AVX2)
    c.flat = m >= FLAT_MIN_ROWS;
    c.tm = c.flat ? FLAT_M : TILE_M;
#else
    c.tm = TILE_M;
#endif
    const int64_t block = m < BLOCK_M ? m : BLOCK_M;
    c.per_tile = (int64_t)c.tm * c.k2 * PACKED_PER_PAIR; /* packed elements per tile of rows */
    const size_t bytes = ((size_t)((block + c.tm - 1) / c.tm) * (size_t)c.per_tile * sizeof(PACKED_T) + 63) / 64 * 64;
    c.rows = aligned_alloc(64, bytes);
    if (c.rows == NULL)
        return -1;
#ifdef RILL_BF16_AVX2
    c.panel_floats = (c.k2 * 2 * PANEL + 15) / 16 * 16; /* a widened panel, 64-byte multiples */
    c.widened = c.flat ? aligned_alloc(64, (size_t)num_threads * (size_t)c.panel_floats * sizeof(float)) : NULL;
    if (c.flat && c.widened == NULL) {
        free(c.rows);
        return -1;
    }
#endif
    const int64_t chunks = c.pair_chunks + (c.panels - c.first_single);
    for (c.m0 = 0; c.m0 < m; c.m0 += BLOCK_M) {
        c.mb = m - c.m0 < BLOCK_M ? m - c.m0 : BLOCK_M;
        c.tiles = (c.mb + c.tm - 1) / c.tm;
        if (c.tiles == 1)
            pack_chunk(&c, 0, 0);
        else
            rill_pool_for(pack_chunk, &c, c.tiles, num_threads);
        rill_pool_for(product_chunk, &c, chunks, num_threads);
    }
    free(c.rows);
    free(c.widened);
    return 0;
}
