/* rill's CPU decode attention over a bfloat16 paged KV cache, called through ctypes (kernels/cpu_attn.py).
 *
 * The float32 kernel's plan (kernels/cpu_attn.c: each key and value row read once from its page, in
 * blocks of eight positions that every head of the task is served from while they sit in L1, the next
 * blocks prefetched into L2) over rows of half the bytes: a decode step's attention is the time to read
 * the context, and a bfloat16 cache halves it. Keys and values are widened to float32 in registers (exact)
 * and everything is summed in float32: scores q . k, the softmax, the weighted sum of values; the output
 * is rounded to bfloat16 once, as torch's bfloat16 attention rounds its float32 accumulators.
 *
 * One order of arithmetic for a build: each (sequence, head) runs the same loops in the same order
 * whatever else is in the step or the thread count, so greedy output is the same alone and batched. The
 * AVX2 and AVX-512 builds run the same eight-lane code (the same bits); the plain C build sums in
 * another order, and a build with AVX-512 BF16 takes the wider plan below for head dims that are
 * multiples of 32 (each within float32 rounding of the others).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_attn_common.h"
#include "cpu_bf16.h"
#include "cpu_pool.h"

typedef struct {
    const uint16_t *k_cache, *v_cache;
    const int32_t *table;
    int64_t block_size, row_stride, dim, group;
    float scale, softcap;
} PagesBf16;

static void row_offsets(const PagesBf16 *pg, int64_t first, int64_t last, int64_t *offs) {
    int64_t p = first, i = 0;
    while (p < last) {
        const int64_t page = p / pg->block_size, in_page = p % pg->block_size;
        const int64_t end = (page + 1) * pg->block_size < last ? (page + 1) * pg->block_size : last;
        const int64_t base = (int64_t)pg->table[page] * pg->block_size;
        for (int64_t o = in_page; p < end; p++, o++) offs[i++] = (base + o) * pg->row_stride;
    }
}

#ifdef RILL_AVX2
/* eight bfloat16 -> eight float32 (exact) */
static inline __m256 load8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#endif

/* s[i] = q . k(i) for the n <= 8 positions at offs[0..n), q widened to float32 already. */
static void block_scores(const uint16_t *k_cache, const int64_t *offs, int64_t n, int64_t kv_off, const float *q,
                         int64_t dim, float *s) {
#ifdef RILL_AVX2
    if (n == 8 && dim % 8 == 0) {
        const uint16_t *k0 = k_cache + offs[0] + kv_off, *k1 = k_cache + offs[1] + kv_off;
        const uint16_t *k2 = k_cache + offs[2] + kv_off, *k3 = k_cache + offs[3] + kv_off;
        const uint16_t *k4 = k_cache + offs[4] + kv_off, *k5 = k_cache + offs[5] + kv_off;
        const uint16_t *k6 = k_cache + offs[6] + kv_off, *k7 = k_cache + offs[7] + kv_off;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int64_t d = 0; d < dim; d += 8) {
            const __m256 qv = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, load8(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, load8(k1 + d), a1);
            a2 = _mm256_fmadd_ps(qv, load8(k2 + d), a2);
            a3 = _mm256_fmadd_ps(qv, load8(k3 + d), a3);
            a4 = _mm256_fmadd_ps(qv, load8(k4 + d), a4);
            a5 = _mm256_fmadd_ps(qv, load8(k5 + d), a5);
            a6 = _mm256_fmadd_ps(qv, load8(k6 + d), a6);
            a7 = _mm256_fmadd_ps(qv, load8(k7 + d), a7);
        }
        _mm256_storeu_ps(s, sum8x8(a0, a1, a2, a3, a4, a5, a6, a7));
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *k = k_cache + offs[i] + kv_off;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < dim; d++) dot += q[d] * bf16_to_f32(k[d]);
        s[i] = dot;
    }
}

/* out += sum_i w[i] v(i) over the n positions at offs[0..n), float32 accumulators. */
static void block_values(const uint16_t *v_cache, const int64_t *offs, int64_t n, int64_t kv_off, const float *w,
                         int64_t dim, float *out) {
    int64_t d0 = 0;
#ifdef RILL_AVX2
    for (; d0 + 32 <= dim; d0 += 32) {
        float *o = out + d0;
        __m256 a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + 8), a2 = _mm256_loadu_ps(o + 16);
        __m256 a3 = _mm256_loadu_ps(o + 24);
        for (int64_t i = 0; i < n; i++) {
            const uint16_t *v = v_cache + offs[i] + kv_off + d0;
            const __m256 wb = _mm256_set1_ps(w[i]);
            a0 = _mm256_fmadd_ps(wb, load8(v), a0);
            a1 = _mm256_fmadd_ps(wb, load8(v + 8), a1);
            a2 = _mm256_fmadd_ps(wb, load8(v + 16), a2);
            a3 = _mm256_fmadd_ps(wb, load8(v + 24), a3);
        }
        _mm256_storeu_ps(o, a0);
        _mm256_storeu_ps(o + 8, a1);
        _mm256_storeu_ps(o + 16, a2);
        _mm256_storeu_ps(o + 24, a3);
    }
#endif
    for (int64_t i = 0; i < n && d0 < dim; i++) {
        const uint16_t *v = v_cache + offs[i] + kv_off;
        const float wi = w[i];
#ifdef __FMA__
#pragma omp simd
        for (int64_t d = d0; d < dim; d++) out[d] = fmaf(wi, bf16_to_f32(v[d]), out[d]);
#else /* plain C: no fused multiply-add in hardware (fmaf would be a libm call per element) */
        for (int64_t d = d0; d < dim; d++) out[d] += wi * bf16_to_f32(v[d]);
#endif
    }
}

#define BLOCK 8
#define PREFETCH_AHEAD (2 * BLOCK) /* as cpu_attn.c: two blocks ahead, into L2 */
static inline void prefetch_rows(const uint16_t *cache, const int64_t *offs, int64_t from, int64_t width,
                                 int64_t row_bytes) {
    const int64_t to = from + BLOCK < width ? from + BLOCK : width;
    for (int64_t i = from; i < to; i++) {
        const char *row = (const char *)(cache + offs[i]);
        for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b, 0, 1);
    }
}

/* One sequence's query heads [h0, h0 + nh) over positions [first, last). qf: nh x dim floats (the
 * queries widened), acc: nh x dim floats, scores: nh x width floats. out: bfloat16 [nh][dim]. */
static void attend_one(const PagesBf16 *pg, const uint16_t *q, int64_t h0, int64_t nh, int64_t first, int64_t last,
                       int64_t *offs, float *scores, float *qf, float *acc, uint16_t *out) {
    const int64_t dim = pg->dim, width = last - first;
    for (int64_t i = 0; i < nh * dim; i++) qf[i] = bf16_to_f32(q[h0 * dim + i]);
    row_offsets(pg, first, last, offs);
    const int64_t row_bytes = pg->row_stride * (int64_t)sizeof(uint16_t);
    for (int64_t i = 0; i < width; i += BLOCK) {
        const int64_t n = width - i < BLOCK ? width - i : BLOCK;
        prefetch_rows(pg->k_cache, offs, i + PREFETCH_AHEAD, width, row_bytes);
        for (int64_t j = 0; j < nh; j++)
            block_scores(pg->k_cache, offs + i, n, ((h0 + j) / pg->group) * dim, qf + j * dim, dim,
                         scores + j * width + i);
    }
    for (int64_t j = 0; j < nh; j++) softmax(scores + j * width, width, pg->scale, pg->softcap);
    memset(acc, 0, sizeof(float) * (size_t)(nh * dim));
    for (int64_t i = 0; i < width; i += BLOCK) {
        const int64_t n = width - i < BLOCK ? width - i : BLOCK;
        prefetch_rows(pg->v_cache, offs, i + PREFETCH_AHEAD, width, row_bytes);
        for (int64_t j = 0; j < nh; j++)
            block_values(pg->v_cache, offs + i, n, ((h0 + j) / pg->group) * dim, scores + j * width + i, dim,
                         acc + j * dim);
    }
    for (int64_t i = 0; i < nh * dim; i++) out[i] = f32_to_bf16(acc[i]);
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
/* With AVX-512 BF16 (Zen 4 and 5, Intel from Cooper Lake) a wider plan, for head dims that are multiples of 32:
 * a score is q . k as vdpbf16ps over 32 dims at a time (products of two bfloat16 are exact in float32; the
 * pairs' sums float32), sixteen positions' 16-lane partial sums reduced together by a transpose tree; the
 * values' weighted sum in 16-lane float32 FMAs, each value row widened once for all the query heads that
 * share its KV head. The eight-lane plan above spends its time widening every row again for each of
 * those heads and in one horizontal sum per eight scores: 13 GB/s of bfloat16 KV on a 2-core Zen 5 (64
 * sequences x 320 positions, 12 heads over 4 KV heads), where the cache reads at 50. Still one order of
 * arithmetic for the build, whatever the batch, the thread count or the split of heads into tasks. */
#define DP_BLOCK 16
#define DP_GROUP 4 /* query heads sharing a KV head, taken together in the values' pass */
#define DP_AHEAD (2 * DP_BLOCK) /* as the plan above: rows two blocks ahead asked for into L2 */

/* `bytes` of the rows [from, from + DP_BLOCK) of offs (below width), from `cache`, into L2 (0: none). (Whole
 * rows, every
 * KV head, in a task's first pass, for the other heads' passes to find in L2: 12% slower on the Zen 5 above.) */
static inline void prefetch_kv_rows(const uint16_t *cache, const int64_t *offs, int64_t from, int64_t width,
                                    int64_t bytes) {
    if (bytes == 0)
        return;
    const int64_t to = from + DP_BLOCK < width ? from + DP_BLOCK : width;
    for (int64_t i = from; i < to; i++)
        for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch((const char *)(cache + offs[i]) + b, 0, 1);
}

/* lane i = the sum of the sixteen lanes of v[i] (v[n..16) zero) */
static inline __m512 sum16x16(__m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
    /* c[0] lanes: [v0-3 part, v4-7 part, v0-3 part, v4-7 part] by 128-bit lane; the same for c[1] with v8-15 */
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
}

/* s[j][i] = q_j . k(i) for one query head j, positions [0, width) at offs, its KV head at kv_off. */
static void dp_scores(const uint16_t *k_cache, const int64_t *offs, int64_t width, int64_t kv_off, const uint16_t *q,
                      int64_t dim, float *s, int64_t prefetch_bytes) {
    __m512bh qv[MAX_DIM / 32];
    for (int64_t c = 0; c < dim / 32; c++) qv[c] = (__m512bh)_mm512_loadu_si512(q + 32 * c);
    for (int64_t i = 0; i < width; i += DP_BLOCK) {
        const int n = width - i < DP_BLOCK ? (int)(width - i) : DP_BLOCK;
        prefetch_kv_rows(k_cache + kv_off, offs, i + DP_AHEAD, width, prefetch_bytes);
        __m512 t[DP_BLOCK];
#pragma GCC unroll 16
        for (int p = 0; p < DP_BLOCK; p++) {
            t[p] = _mm512_setzero_ps();
            if (p < n) {
                const uint16_t *k = k_cache + offs[i + p] + kv_off;
                for (int64_t c = 0; c < dim / 32; c++)
                    t[p] = _mm512_dpbf16_ps(t[p], qv[c], (__m512bh)_mm512_loadu_si512(k + 32 * c));
            }
        }
        const __m512 sums = sum16x16(t);
        _mm512_mask_storeu_ps(s + i, (__mmask16)((1u << n) - 1u), sums);
    }
}

/* acc[j] += sum_i w[j][i] v(i) for the G <= DP_GROUP query heads of one KV head, positions [0, width);
 * inlined with a constant G, so that the accumulators stay in registers. */
static inline __attribute__((always_inline)) void dp_values_g(const uint16_t *v_cache, const int64_t *offs,
                                                              int64_t width, int64_t kv_off, const float *w,
                                                              int64_t w_stride, const int G, int64_t dim, float *acc,
                                                              int64_t prefetch_bytes) {
    for (int64_t i = 0; i < width; i += DP_BLOCK) {
        const int n = width - i < DP_BLOCK ? (int)(width - i) : DP_BLOCK;
        prefetch_kv_rows(v_cache + kv_off, offs, i + DP_AHEAD, width, prefetch_bytes);
        for (int64_t c = 0; c < dim; c += 16) {
            __m512 a[DP_GROUP];
            for (int j = 0; j < G; j++) a[j] = _mm512_loadu_ps(acc + j * dim + c);
            for (int p = 0; p < n; p++) {
                const uint16_t *v = v_cache + offs[i + p] + kv_off + c;
                const __m512 vv = _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)v)), 16));
                for (int j = 0; j < G; j++) a[j] = _mm512_fmadd_ps(_mm512_set1_ps(w[j * w_stride + i + p]), vv, a[j]);
            }
            for (int j = 0; j < G; j++) _mm512_storeu_ps(acc + j * dim + c, a[j]);
        }
    }
}

static void dp_values(const uint16_t *v_cache, const int64_t *offs, int64_t width, int64_t kv_off, const float *w,
                      int64_t w_stride, int g, int64_t dim, float *acc, int64_t pf) {
    switch (g) {
    case 4: dp_values_g(v_cache, offs, width, kv_off, w, w_stride, 4, dim, acc, pf); return;
    case 3: dp_values_g(v_cache, offs, width, kv_off, w, w_stride, 3, dim, acc, pf); return;
    case 2: dp_values_g(v_cache, offs, width, kv_off, w, w_stride, 2, dim, acc, pf); return;
    default: dp_values_g(v_cache, offs, width, kv_off, w, w_stride, 1, dim, acc, pf); return;
    }
}

static void attend_one_dp(const PagesBf16 *pg, const uint16_t *q, int64_t h0, int64_t nh, int64_t first, int64_t last,
                          int64_t *offs, float *scores, float *acc, uint16_t *out) {
    const int64_t dim = pg->dim, width = last - first;
    row_offsets(pg, first, last, offs);
    for (int64_t j = 0; j < nh; j++) {
        const int64_t kv_off = ((h0 + j) / pg->group) * dim;
        /* the first head of a KV head asks for its keys (its first blocks here, the rest as it goes); the
         * others find them in L2 */
        const int64_t ask = j == 0 || (h0 + j) % pg->group == 0 ? dim * (int64_t)sizeof(uint16_t) : 0;
        for (int64_t i = 0; ask && i < DP_AHEAD && i < width; i += DP_BLOCK)
            prefetch_kv_rows(pg->k_cache + kv_off, offs, i, width, ask);
        dp_scores(pg->k_cache, offs, width, kv_off, q + (h0 + j) * dim, dim, scores + j * width, ask);
        softmax(scores + j * width, width, pg->scale, pg->softcap);
    }
    memset(acc, 0, sizeof(float) * (size_t)(nh * dim));
    for (int64_t j = 0; j < nh;) { /* heads [j, j + g) share a KV head, at most DP_GROUP at a time */
        const int64_t kv = (h0 + j) / pg->group, end_of_kv = (kv + 1) * pg->group - h0;
        const int64_t stop = end_of_kv < nh ? end_of_kv : nh; /* the task's last head of this KV head, + 1 */
        const int g = (int)(stop - j < DP_GROUP ? stop - j : DP_GROUP);
        const int64_t ask = j == 0 || (h0 + j) % pg->group == 0 ? dim * (int64_t)sizeof(uint16_t) : 0; /* as above */
        for (int64_t i = 0; ask && i < DP_AHEAD && i < width; i += DP_BLOCK)
            prefetch_kv_rows(pg->v_cache + kv * dim, offs, i, width, ask);
        dp_values(pg->v_cache, offs, width, kv * dim, scores + j * width, width, g, dim, acc + j * dim, ask);
        j += g;
    }
    int64_t i = 0;
    for (; i + 8 <= nh * dim; i += 8) bf16x8_store(out + i, _mm256_loadu_ps(acc + i));
    for (; i < nh * dim; i++) out[i] = f32_to_bf16(acc[i]);
}
#endif

typedef struct {
    const uint16_t *q;
    int64_t q_seq_stride;
    const uint16_t *k_cache, *v_cache;
    const int32_t *block_tables;
    int64_t table_stride;
    const int32_t *seq_lens;
    int64_t num_heads, num_kv_heads, dim, block_size, window;
    float scale, softcap;
    uint16_t *out;
    int64_t group, per_task, tasks_per_seq, max_len;
    float *scores, *qf; /* per thread */
    int64_t *offs;
} DecodeBf16;

/* One task: one sequence's heads [h0, h0 + per_task). */
static void decode_task_bf16(void *arg, int64_t t, int thread) {
    const DecodeBf16 *j = arg;
    const int64_t dim = j->dim, num_heads = j->num_heads, per_task = j->per_task, window = j->window;
    const int64_t s = t / j->tasks_per_seq, h0 = (t % j->tasks_per_seq) * per_task, len = j->seq_lens[s];
    uint16_t *out = j->out + (s * num_heads + h0) * dim;
    if (len < 1) { /* nothing visible: a zero row, never memory the caller left unset */
        memset(out, 0, sizeof(uint16_t) * (size_t)(per_task * dim));
        return;
    }
    const int64_t first = window > 0 && len > window ? len - window : 0;
    const PagesBf16 pg = {j->k_cache, j->v_cache, j->block_tables + s * j->table_stride, j->block_size,
                          j->num_kv_heads * dim, dim, j->group, j->scale, j->softcap};
    float *scores = j->scores + thread * per_task * j->max_len, *qf = j->qf + thread * 2 * per_task * dim;
    int64_t *offs = j->offs + thread * j->max_len;
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (dim % 32 == 0) {
        attend_one_dp(&pg, j->q + s * j->q_seq_stride, h0, per_task, first, len, offs, scores, qf + per_task * dim,
                      out);
        return;
    }
#endif
    attend_one(&pg, j->q + s * j->q_seq_stride, h0, per_task, first, len, offs, scores, qf, qf + per_task * dim, out);
}

/* As rill_paged_decode_f32 (kernels/cpu_attn.c), with q, the caches and out bfloat16:
 *   q:         [num_seqs, num_heads, dim], q_seq_stride elements between sequences, heads contiguous
 *   k/v_cache: [num_blocks, block_size, num_kv_heads, dim], contiguous
 *   out:       [num_seqs, num_heads, dim], contiguous
 * Returns 0, or -1 for an unsupported shape or no memory. */
int rill_paged_decode_bf16(const uint16_t *q, int64_t q_seq_stride, const uint16_t *k_cache, const uint16_t *v_cache,
                           const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
                           int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t dim, int64_t block_size,
                           int64_t window, float scale, float softcap, uint16_t *out, int num_threads) {
    if (num_kv_heads < 1 || num_heads % num_kv_heads != 0 || dim < 1 || dim > MAX_DIM || block_size < 1) return -1;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t per_task = num_seqs >= 2 * num_threads ? num_heads : group;
    const int64_t tasks_per_seq = num_heads / per_task;
    int64_t max_len = 1;
    for (int64_t s = 0; s < num_seqs; s++) max_len = seq_lens[s] > max_len ? seq_lens[s] : max_len;
    if (window > 0 && window < max_len) max_len = window;
    if (num_threads < 1) num_threads = 1;
    /* scratch per thread: scores (per_task x max_len), the queries widened and the sums (2 per_task x dim), offsets */
    float *scores = malloc(sizeof(float) * (size_t)(num_threads * per_task * max_len));
    float *qf = malloc(sizeof(float) * (size_t)(num_threads * 2 * per_task * dim));
    int64_t *offs = malloc(sizeof(int64_t) * (size_t)(num_threads * max_len));
    if (scores == NULL || qf == NULL || offs == NULL) {
        free(scores);
        free(qf);
        free(offs);
        return -1;
    }
    DecodeBf16 job = {q, q_seq_stride, k_cache, v_cache, block_tables, table_stride, seq_lens, num_heads, num_kv_heads,
                      dim, block_size, window, scale, softcap, out, group, per_task, tasks_per_seq, max_len, scores, qf,
                      offs};
    rill_pool_for(decode_task_bf16, &job, num_seqs * tasks_per_seq, num_threads);
    free(scores);
    free(qf);
    free(offs);
    return 0;
}
