/* rill's CPU linear layer: y = x W^T + b in float32 over a weight packed once, called through ctypes.
 * Built with kernels/cpu_attn.c into one library by kernels/cpu_build.py; kernels/cpu_linear.py packs
 * and calls, and tests/test_cpu_linear.py holds it to torch's F.linear.
 *
 * Why C: a decode step multiplies a few rows (one per sequence) by every weight of the model, so its
 * time is the time to read the weights. oneDNN's packed GEMM, which rill used before, reads them at
 * about half of what the memory gives at 8 rows on an AVX2 machine; this kernel streams each weight
 * once from a layout made for it. At prefill sizes the same micro-kernel keeps the FMA units busy.
 *
 * Layout: the weight [N, K] is packed into panels of 16 output columns, [ceil(N/16)][K][16] (the
 * last panel padded with zeros), 32-byte aligned. The activations are packed per call into panels of
 * 6 rows, [K][6]. A 6 x 16 tile of y lives in 12 AVX2 registers while k runs from 0 to K-1 (the loop
 * unrolled by 4: 1.1-1.3x at decode sizes, measured).
 *
 * Results do not depend on the batch: every y[m][n] is one chain of fused multiply-adds over k in
 * order 0..K-1, started from 0, whatever the other rows, the tile a row lands in, the thread count
 * or K. So a row is bitwise the same computed alone, in a decode batch, or in a prefill chunk of any
 * size: chunked prefill computes what the whole prompt computes, and greedy output is the same alone
 * and batched.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PANEL 16 /* output columns per weight panel */
#define TILE_M 6 /* rows per activation panel */
#define BLOCK_M 96 /* rows of x packed at a time: 96 x K floats stay in L2 (K up to ~1,300 in 512 KB) */

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RILL_AVX2 1
#endif

void rill_linear_pack_f32(const float *w, int64_t n, int64_t k, float *out) {
    const int64_t panels = (n + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int j = 0; j < PANEL; j++) {
                const int64_t col = p * PANEL + j;
                out[(p * k + kk) * PANEL + j] = col < n ? w[col * k + kk] : 0.0f;
            }
}

static void pack_rows(const float *x, int64_t ldx, int rows, int64_t k, float *out) {
    for (int64_t kk = 0; kk < k; kk++)
        for (int i = 0; i < TILE_M; i++)
            out[kk * TILE_M + i] = i < rows ? x[i * ldx + kk] : 0.0f;
}

static void store(float acc[TILE_M][PANEL], const float *bias, float *y, int64_t ldy, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            y[i * ldy + j] = bias ? acc[i][j] + bias[j] : acc[i][j];
}

#ifdef RILL_AVX2
/* y[0..R)[0..cols) (+ bias) = a [k][6] (its first R rows) times b [k][16]. One body per R, so a
 * partial tile computes only its own rows (a decode batch of 8 is a tile of 6 and one of 2); named
 * accumulators, not an array, so that the compiler keeps all twelve in registers. */
#define ROW(R, i)                                                                                        \
    if (R > i) {                                                                                         \
        const __m256 x = _mm256_broadcast_ss(a + i);                                                     \
        c##i##0 = _mm256_fmadd_ps(x, b0, c##i##0);                                                       \
        c##i##1 = _mm256_fmadd_ps(x, b1, c##i##1);                                                       \
    }
#define STORE_Y(R, i)                                                                                    \
    if (R > i) {                                                                                         \
        _mm256_storeu_ps(y + i * ldy, bias ? _mm256_add_ps(c##i##0, _mm256_loadu_ps(bias)) : c##i##0);   \
        _mm256_storeu_ps(y + i * ldy + 8, bias ? _mm256_add_ps(c##i##1, _mm256_loadu_ps(bias + 8)) : c##i##1); \
    }
#define SAVE(R, i)                                                                                       \
    if (R > i) {                                                                                         \
        _mm256_storeu_ps(acc[i], c##i##0);                                                               \
        _mm256_storeu_ps(acc[i] + 8, c##i##1);                                                           \
    }
#define TILE_R(R)                                                                                        \
    static void tile##R(const float *restrict a, const float *restrict b, int64_t k, const float *bias,   \
                        float *y, int64_t ldy, int cols) {                                                \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,          \
               c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;                          \
        _Pragma("GCC unroll 4") for (int64_t kk = 0; kk < k; kk++, a += TILE_M, b += PANEL) {            \
            const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);                              \
            ROW(R, 0) ROW(R, 1) ROW(R, 2) ROW(R, 3) ROW(R, 4) ROW(R, 5)                                   \
        }                                                                                                 \
        if (cols == PANEL) { /* a whole panel: straight from the registers */                              \
            STORE_Y(R, 0) STORE_Y(R, 1) STORE_Y(R, 2) STORE_Y(R, 3) STORE_Y(R, 4) STORE_Y(R, 5)           \
            return;                                                                                       \
        }                                                                                                 \
        float acc[TILE_M][PANEL];                                                                         \
        SAVE(R, 0) SAVE(R, 1) SAVE(R, 2) SAVE(R, 3) SAVE(R, 4) SAVE(R, 5)                                 \
        store(acc, bias, y, ldy, R, cols);                                                                \
    }
TILE_R(1)
TILE_R(2)
TILE_R(3)
TILE_R(4)
TILE_R(5)
TILE_R(6)
#endif

static void tile(const float *restrict a, const float *restrict b, int64_t k, const float *bias, float *y,
                 int64_t ldy, int rows, int cols) {
#ifdef RILL_AVX2
    switch (rows) {
    case 6: tile6(a, b, k, bias, y, ldy, cols); return;
    case 5: tile5(a, b, k, bias, y, ldy, cols); return;
    case 4: tile4(a, b, k, bias, y, ldy, cols); return;
    case 3: tile3(a, b, k, bias, y, ldy, cols); return;
    case 2: tile2(a, b, k, bias, y, ldy, cols); return;
    default: tile1(a, b, k, bias, y, ldy, cols); return;
    }
#else
    float acc[TILE_M][PANEL] = {{0}};
    for (int64_t kk = 0; kk < k; kk++, a += TILE_M, b += PANEL)
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < PANEL; j++)
                acc[i][j] = __builtin_fmaf(a[i], b[j], acc[i][j]);
    store(acc, bias, y, ldy, rows, cols);
#endif
}

/* y [m, n] (row stride n) = x [m, k] (row stride ldx) times the packed weight, plus bias [n] (or NULL).
 * Returns 0, or -1 when the scratch for the packed rows cannot be had. */
int rill_linear_f32(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t m,
                    int64_t n, int64_t k, int num_threads) {
    if (m <= 0 || n <= 0)
        return 0;
    const int64_t panels = (n + PANEL - 1) / PANEL;
    const int64_t block = m < BLOCK_M ? m : BLOCK_M;
    const size_t bytes = ((size_t)((block + TILE_M - 1) / TILE_M) * TILE_M * (size_t)k * sizeof(float) + 63) / 64 * 64;
    float *rows = aligned_alloc(64, bytes);
    if (rows == NULL)
        return -1;
    for (int64_t m0 = 0; m0 < m; m0 += BLOCK_M) {
        const int64_t mb = m - m0 < BLOCK_M ? m - m0 : BLOCK_M;
        const int64_t tiles = (mb + TILE_M - 1) / TILE_M;
#pragma omp parallel num_threads(num_threads)
        {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < tiles; t++) {
                const int64_t left = mb - t * TILE_M;
                pack_rows(x + (m0 + t * TILE_M) * ldx, ldx, left < TILE_M ? (int)left : TILE_M, k,
                          rows + t * TILE_M * k);
            }
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; p++) {
                const int64_t left_cols = n - p * PANEL;
                const int cols = left_cols < PANEL ? (int)left_cols : PANEL;
                for (int64_t t = 0; t < tiles; t++) {
                    const int64_t left = mb - t * TILE_M;
                    tile(rows + t * TILE_M * k, packed + p * k * PANEL, k, bias ? bias + p * PANEL : NULL,
                         y + (m0 + t * TILE_M) * n + p * PANEL, n, left < TILE_M ? (int)left : TILE_M, cols);
                }
            }
        }
    }
    free(rows);
    return 0;
}
