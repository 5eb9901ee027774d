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
 * last panel padded with zeros), 64-byte aligned. The activations are packed per call into panels of
 * TILE_M rows, [K][TILE_M]. With AVX2 a 6 x 16 tile of y lives in 12 registers while k runs from 0 to
 * K-1 (the loop unrolled by 4: 1.1-1.3x at decode sizes, measured). With AVX-512 (32 registers, and a
 * panel's row of 16 floats is one register) the activations come in panels of 12 rows and the tile is
 * 12 x 32, two adjacent panels, in 24 registers (12 x 16 for a last odd or partial panel): a decode batch
 * of 8 reads each weight panel once, in one tile, where the AVX2 tiles of 6 and 2 read it twice and the
 * tile of 2 waits on its two chains of FMAs. (12 rows measured 1.02-1.15x 8 rows at 64-2,048 rows; a
 * call of at most 8 rows packs them in panels of 8.)
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
#include "cpu_pool.h"

#define PANEL 16 /* output columns per weight panel */
#define BLOCK_M 96 /* rows of x packed at a time: 96 x K floats stay in L2 (K up to ~1,300 in 512 KB) */

#define TILE_M 6 /* rows per activation panel */
#define WIDE_M 12 /* with AVX-512: rows per activation panel (8 for a call of at most 8 rows) */

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RILL_AVX2 1
#if defined(__AVX512F__)
#define RILL_AVX512 1
#endif
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

/* Inlined at each call with a constant tile_m, so that every tile height gets its own unrolled copy. */
static inline __attribute__((always_inline)) void pack_rows(const float *x, int64_t ldx, int rows, int64_t k,
                                                            float *out, int tile_m) {
    for (int64_t kk = 0; kk < k; kk++)
        for (int i = 0; i < tile_m; i++)
            out[kk * tile_m + i] = i < rows ? x[i * ldx + kk] : 0.0f;
}

static void store(float acc[TILE_M][PANEL], const float *bias, float *y, int64_t ldy, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            y[i * ldy + j] = bias ? acc[i][j] + bias[j] : acc[i][j];
}

#ifdef RILL_AVX512
/* y[0..R)[0..NP * 16) (+ bias) = a [k][tm] (its first R rows) times NP adjacent panels, b and b + pstride,
 * a row of a panel's y in one register: with NP = 2 two whole panels, a 12 x 32 tile in 24 registers in
 * which each broadcast row value feeds two FMAs; with NP = 1 the first `cols` columns of one panel. */
#define WIDE_ROW(NP, R, i)                                                                               \
    if (R > i) {                                                                                         \
        const __m512 x = _mm512_set1_ps(a[i]);                                                           \
        c##i = _mm512_fmadd_ps(x, b0, c##i);                                                             \
        if (NP > 1) d##i = _mm512_fmadd_ps(x, b1, d##i);                                                 \
    }
#define WIDE_STORE(NP, R, i)                                                                             \
    if (R > i) {                                                                                         \
        _mm512_mask_storeu_ps(y + i * ldy, mask,                                                         \
                              bias ? _mm512_add_ps(c##i, _mm512_maskz_loadu_ps(mask, bias)) : c##i);      \
        if (NP > 1)                                                                                      \
            _mm512_storeu_ps(y + i * ldy + 16, bias ? _mm512_add_ps(d##i, _mm512_loadu_ps(bias + 16)) : d##i); \
    }
#define WIDE_R(NP, R)                                                                                    \
    static void wide##NP##_##R(const float *restrict a, const float *restrict b, int64_t pstride, int64_t k, \
                               const float *bias, float *y, int64_t ldy, int cols, int64_t tm) {          \
        __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;  \
        __m512 c8 = c0, c9 = c0, c10 = c0, c11 = c0;                                                      \
        __m512 d0 = c0, d1 = c0, d2 = c0, d3 = c0, d4 = c0, d5 = c0, d6 = c0, d7 = c0;                    \
        __m512 d8 = c0, d9 = c0, d10 = c0, d11 = c0;                                                      \
        const float *restrict e = b + pstride;                                                            \
        _Pragma("GCC unroll 2") for (int64_t kk = 0; kk < k; kk++, a += tm, b += PANEL, e += PANEL) {     \
            const __m512 b0 = _mm512_load_ps(b), b1 = NP > 1 ? _mm512_load_ps(e) : b0;                   \
            WIDE_ROW(NP, R, 0) WIDE_ROW(NP, R, 1) WIDE_ROW(NP, R, 2) WIDE_ROW(NP, R, 3)                    \
            WIDE_ROW(NP, R, 4) WIDE_ROW(NP, R, 5) WIDE_ROW(NP, R, 6) WIDE_ROW(NP, R, 7)                    \
            WIDE_ROW(NP, R, 8) WIDE_ROW(NP, R, 9) WIDE_ROW(NP, R, 10) WIDE_ROW(NP, R, 11)                  \
        }                                                                                                 \
        const __mmask16 mask = (__mmask16)((1u << cols) - 1u);                                            \
        WIDE_STORE(NP, R, 0) WIDE_STORE(NP, R, 1) WIDE_STORE(NP, R, 2) WIDE_STORE(NP, R, 3)                \
        WIDE_STORE(NP, R, 4) WIDE_STORE(NP, R, 5) WIDE_STORE(NP, R, 6) WIDE_STORE(NP, R, 7)                \
        WIDE_STORE(NP, R, 8) WIDE_STORE(NP, R, 9) WIDE_STORE(NP, R, 10) WIDE_STORE(NP, R, 11)              \
    }
#define WIDE_ROWS(NP)                                                                                    \
    WIDE_R(NP, 1) WIDE_R(NP, 2) WIDE_R(NP, 3) WIDE_R(NP, 4) WIDE_R(NP, 5) WIDE_R(NP, 6)                  \
    WIDE_R(NP, 7) WIDE_R(NP, 8) WIDE_R(NP, 9) WIDE_R(NP, 10) WIDE_R(NP, 11) WIDE_R(NP, 12)
WIDE_ROWS(1)
WIDE_ROWS(2)
typedef void (*wide_fn)(const float *restrict, const float *restrict, int64_t, int64_t, const float *, float *,
                        int64_t, int, int64_t);
/* WIDE[NP - 1][R - 1]: one body per panel count and row count, so a partial tile computes only its rows. */
static const wide_fn WIDE[2][WIDE_M] = {
    {wide1_1, wide1_2, wide1_3, wide1_4, wide1_5, wide1_6, wide1_7, wide1_8, wide1_9, wide1_10, wide1_11, wide1_12},
    {wide2_1, wide2_2, wide2_3, wide2_4, wide2_5, wide2_6, wide2_7, wide2_8, wide2_9, wide2_10, wide2_11, wide2_12},
};
#endif


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

/* One call's state, shared by the chunks of its two jobs per block of rows (cpu_pool.h): packing the tiles
 * of rows, then the products in chunks of PAIRS_PER_CHUNK panel pairs (the wide tiles) and one panel a chunk. */
#define PAIRS_PER_CHUNK 4
typedef struct {
    const float *x, *packed, *bias;
    float *y, *rows;
    int64_t ldx, n, k, panels, m0, mb, tiles, pair_chunks, first_single;
    int tm, wide;
} Call;

static void pack_chunk(void *arg, int64_t t, int thread) {
    (void)thread;
    const Call *c = arg;
    const int64_t left = c->mb - t * c->tm, k = c->k;
    const float *src = c->x + (c->m0 + t * c->tm) * c->ldx;
    const int r = left < c->tm ? (int)left : c->tm;
    if (c->tm == TILE_M)
        pack_rows(src, c->ldx, r, k, c->rows + t * c->tm * k, TILE_M);
    else if (c->tm == 8)
        pack_rows(src, c->ldx, r, k, c->rows + t * c->tm * k, 8);
    else
        pack_rows(src, c->ldx, r, k, c->rows + t * c->tm * k, WIDE_M);
}

static void product_chunk(void *arg, int64_t chunk, int thread) {
    (void)thread;
    const Call *c = arg;
    const int64_t n = c->n, k = c->k, tm = c->tm, mb = c->mb, m0 = c->m0;
#ifdef RILL_AVX512
    if (chunk < c->pair_chunks) { /* whole panels, two at a time */
        const int64_t pairs = (n / PANEL) / 2;
        const int64_t last = (chunk + 1) * PAIRS_PER_CHUNK < pairs ? (chunk + 1) * PAIRS_PER_CHUNK : pairs;
        for (int64_t g = chunk * PAIRS_PER_CHUNK; g < last; g++)
            for (int64_t t = 0; t < c->tiles; t++) {
                const int64_t left = mb - t * tm, p = 2 * g;
                WIDE[1][(left < tm ? left : tm) - 1](c->rows + t * tm * k, c->packed + p * k * PANEL, k * PANEL, k,
                                                     c->bias ? c->bias + p * PANEL : NULL,
                                                     c->y + (m0 + t * tm) * n + p * PANEL, n, PANEL, (int)tm);
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
        float *out = c->y + (m0 + t * tm) * n + p * PANEL;
        const float *pb = c->bias ? c->bias + p * PANEL : NULL;
#ifdef RILL_AVX512
        if (c->wide) {
            WIDE[0][r - 1](c->rows + t * tm * k, c->packed + p * k * PANEL, 0, k, pb, out, n, cols, (int)tm);
            continue;
        }
#endif
        tile(c->rows + t * tm * k, c->packed + p * k * PANEL, k, pb, out, n, r, cols);
    }
}

/* y [m, n] (row stride n) = x [m, k] (row stride ldx) times the packed weight, plus bias [n] (or NULL).
 * With AVX-512 and more than 6 rows the 12-row tiles, two whole panels at a time (on a Zen 4, two threads,
 * they beat the 6 x 16 tiles at every size measured from 7 to 2,048 rows). Either computes every output as
 * the same chain of FMAs. Returns 0, or -1 when the scratch for the packed rows cannot be had. */
int rill_linear_f32(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t m,
                    int64_t n, int64_t k, int num_threads) {
    if (m <= 0 || n <= 0)
        return 0;
    Call c = {.x = x, .packed = packed, .bias = bias, .y = y, .ldx = ldx, .n = n, .k = k,
              .panels = (n + PANEL - 1) / PANEL};
#ifdef RILL_AVX512
    /* up to 6 rows the AVX2 tiles hold all the rows in one tile too; there the two measured within a few per
     * cent of each other, about the noise of the comparison (benchmarks/cpu-lib-ab.py) */
    c.wide = m > TILE_M;
#endif
    /* up to 8 rows (decode at small batches) in panels of 8: [K][8] stays in L1 where [K][12] does not */
    c.tm = c.wide ? (m <= 8 ? 8 : WIDE_M) : TILE_M;
    if (c.wide) {
        c.pair_chunks = ((n / PANEL) / 2 + PAIRS_PER_CHUNK - 1) / PAIRS_PER_CHUNK;
        c.first_single = (n / PANEL) / 2 * 2;
    }
    const int64_t block = m < BLOCK_M ? m : BLOCK_M;
    const size_t bytes = ((size_t)((block + c.tm - 1) / c.tm) * c.tm * (size_t)k * sizeof(float) + 63) / 64 * 64;
    c.rows = aligned_alloc(64, bytes);
    if (c.rows == NULL)
        return -1;
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
    return 0;
}
