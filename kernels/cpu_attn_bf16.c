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
 * another order (within float32 rounding of them).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_attn_common.h"
#include "cpu_bf16.h"

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
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        float *scores = malloc(sizeof(float) * (size_t)(per_task * max_len));
        float *qf = malloc(sizeof(float) * (size_t)(2 * per_task * dim));
        int64_t *offs = malloc(sizeof(int64_t) * (size_t)max_len);
        const int ok = scores != NULL && qf != NULL && offs != NULL;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < num_seqs * tasks_per_seq; t++) {
            const int64_t s = t / tasks_per_seq, h0 = (t % tasks_per_seq) * per_task, len = seq_lens[s];
            if (!ok) continue;
            if (len < 1) { /* nothing visible: a zero row, never memory the caller left unset */
                memset(out + (s * num_heads + h0) * dim, 0, sizeof(uint16_t) * (size_t)(per_task * dim));
                continue;
            }
            const int64_t first = window > 0 && len > window ? len - window : 0;
            const PagesBf16 pg = {k_cache, v_cache, block_tables + s * table_stride, block_size, num_kv_heads * dim,
                                  dim, group, scale, softcap};
            attend_one(&pg, q + s * q_seq_stride, h0, per_task, first, len, offs, scores, qf, qf + per_task * dim,
                       out + (s * num_heads + h0) * dim);
        }
        free(scores);
        free(qf);
        free(offs);
    }
    return failed ? -1 : 0;
}
