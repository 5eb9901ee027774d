/* rill's CPU decode attention: plain C over raw float32 pointers, called through ctypes.
 * kernels/cpu_build.py compiles this file once per machine (-O3 -march=native) and
 * kernels/cpu_attn.py calls it; the torch reference (kernels/reference.py) is the oracle and the
 * fallback, and tests/test_cpu_attn.py compares the two.
 *
 * Why C: at decode every sequence brings one query, and the torch path copies each sequence's
 * paged keys and values into a padded [b, Hkv, L, D] buffer, zeroes the padding, then runs a
 * masked SDPA over that copy: three passes over the context and a dozen op dispatches per layer.
 * Reading each key and value row once, straight from the page that holds it, is all the work
 * needs; vLLM's CPU backend does the same in C++.
 *
 * Threads: the library's pool (kernels/cpu_pool.h), one task per sequence (or KV head group) claimed by
 * whichever thread is free; the caller passes torch's thread count.
 *
 * Results do not depend on the batch: each (sequence, head) is computed by the same loops in the
 * same order whatever else is in the step, so greedy output is the same alone and batched.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_attn_common.h"
#include "cpu_pool.h"

typedef struct {
    const float *k_cache, *v_cache;
    const int32_t *table;
    int64_t block_size, row_stride, dim, group;
    float scale, softcap;
} Pages;

/* offs[i] = where position first + i's row starts in a cache, walking the pages (one division). */
static void row_offsets(const Pages *pg, int64_t first, int64_t last, int64_t *offs) {
    int64_t p = first, i = 0;
    while (p < last) {
        const int64_t page = p / pg->block_size, in_page = p % pg->block_size;
        const int64_t end = (page + 1) * pg->block_size < last ? (page + 1) * pg->block_size : last;
        const int64_t base = (int64_t)pg->table[page] * pg->block_size;
        for (int64_t o = in_page; p < end; p++, o++) offs[i++] = (base + o) * pg->row_stride;
    }
}

/* s[i] = q . k(i) for the n <= 8 positions whose rows start at offs[0..n), one query head, its KV
 * head at kv_off in each row. Eight positions at once keep eight independent accumulators, so the
 * FMA units never wait on one dot product's chain. */
static void block_scores(const float *k_cache, const int64_t *offs, int64_t n, int64_t kv_off, const float *q,
                         int64_t dim, float *s) {
#ifdef RILL_AVX2
    if (n == 8 && dim % 8 == 0) {
        const float *k0 = k_cache + offs[0] + kv_off, *k1 = k_cache + offs[1] + kv_off;
        const float *k2 = k_cache + offs[2] + kv_off, *k3 = k_cache + offs[3] + kv_off;
        const float *k4 = k_cache + offs[4] + kv_off, *k5 = k_cache + offs[5] + kv_off;
        const float *k6 = k_cache + offs[6] + kv_off, *k7 = k_cache + offs[7] + kv_off;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int64_t d = 0; d < dim; d += 8) {
            const __m256 qv = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
            a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k4 + d), a4);
            a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k5 + d), a5);
            a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k6 + d), a6);
            a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k7 + d), a7);
        }
        _mm256_storeu_ps(s, sum8x8(a0, a1, a2, a3, a4, a5, a6, a7));
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        const float *k = k_cache + offs[i] + kv_off;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < dim; d++) dot += q[d] * k[d];
        s[i] = dot;
    }
}

/* out += sum_i w[i] v(i) over the n positions whose rows start at offs[0..n), one query head. With
 * AVX2, 64 output lanes at a time sit in eight registers across the positions. */
static void block_values(const float *v_cache, const int64_t *offs, int64_t n, int64_t kv_off, const float *w,
                         int64_t dim, float *out) {
    int64_t d0 = 0;
#ifdef RILL_AVX2
    for (; d0 + 64 <= dim; d0 += 64) {
        float *o = out + d0;
        __m256 a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + 8), a2 = _mm256_loadu_ps(o + 16);
        __m256 a3 = _mm256_loadu_ps(o + 24), a4 = _mm256_loadu_ps(o + 32), a5 = _mm256_loadu_ps(o + 40);
        __m256 a6 = _mm256_loadu_ps(o + 48), a7 = _mm256_loadu_ps(o + 56);
        for (int64_t i = 0; i < n; i++) {
            const float *v = v_cache + offs[i] + kv_off + d0;
            const __m256 wb = _mm256_set1_ps(w[i]);
            a0 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(v), a0);
            a1 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(v + 8), a1);
            a2 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(v + 16), a2);
            a3 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(v + 24), a3);
            a4 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(v + 32), a4);
            a5 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(v + 40), a5);
            a6 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(v + 48), a6);
            a7 = _mm256_fmadd_ps(wb, _mm256_loadu_ps(v + 56), a7);
        }
        _mm256_storeu_ps(o, a0);
        _mm256_storeu_ps(o + 8, a1);
        _mm256_storeu_ps(o + 16, a2);
        _mm256_storeu_ps(o + 24, a3);
        _mm256_storeu_ps(o + 32, a4);
        _mm256_storeu_ps(o + 40, a5);
        _mm256_storeu_ps(o + 48, a6);
        _mm256_storeu_ps(o + 56, a7);
    }
#endif
    for (int64_t i = 0; i < n && d0 < dim; i++) {
        const float *v = v_cache + offs[i] + kv_off, wi = w[i];
#pragma omp simd
        for (int64_t d = d0; d < dim; d++) out[d] += wi * v[d];
    }
}

/* One sequence's query heads [h0, h0 + nh) over the visible positions [first, last); head j reads
 * KV head (h0 + j) / group of each row. The positions go in blocks of eight rows (contiguous within
 * a page, all KV heads side by side), and every head is served from a block while it sits in L1,
 * so each key and value row comes from memory once. scores: nh x width floats. */
#define BLOCK 8
/* Ask for the rows two blocks ahead while this one is computed, in address order, into L2 only: a block's
 * heads read its rows a KV head's slice at a time (row 0's first 256 bytes, row 1's, ...), an order the
 * hardware prefetchers follow poorly, and the pages of a sequence lie anywhere in the cache. Measured at
 * 64 sequences, one layer, two threads, alternating in one process: into L1 one block ahead (the first
 * version) 1.05-1.12x over none; into L2 two blocks ahead 1.25-1.4x over that (64 x 320 tokens 2.55-2.85
 * -> 1.82-2.15 ms, 64 x 1,024 9.9 -> 7.5-8.0 ms). Into L1 the prefetches hold the core's few
 * miss buffers, which its own loads then wait for; L2 has more. Four, eight or sixteen blocks ahead were
 * no better, and adding an L1 prefetch one block ahead lost the gain. */
#define PREFETCH_AHEAD (2 * BLOCK)
static inline void prefetch_rows(const float *cache, const int64_t *offs, int64_t from, int64_t width,
                                 int64_t row_bytes) {
    const int64_t to = from + BLOCK < width ? from + BLOCK : width;
    for (int64_t i = from; i < to; i++) {
        const char *row = (const char *)(cache + offs[i]);
        for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b, 0, 1);
    }
}
static void attend_one(const Pages *pg, const float *q, int64_t h0, int64_t nh, int64_t first, int64_t last,
                       int64_t *offs, float *scores, float *out) {
    const int64_t dim = pg->dim, width = last - first;
    row_offsets(pg, first, last, offs);
    const int64_t row_bytes = pg->row_stride * (int64_t)sizeof(float);
    for (int64_t i = 0; i < width; i += BLOCK) {
        const int64_t n = width - i < BLOCK ? width - i : BLOCK;
        prefetch_rows(pg->k_cache, offs, i + PREFETCH_AHEAD, width, row_bytes);
        for (int64_t j = 0; j < nh; j++)
            block_scores(pg->k_cache, offs + i, n, ((h0 + j) / pg->group) * dim, q + (h0 + j) * dim, dim,
                         scores + j * width + i);
    }
    for (int64_t j = 0; j < nh; j++) softmax(scores + j * width, width, pg->scale, pg->softcap);
    memset(out, 0, sizeof(float) * (size_t)(nh * dim));
    for (int64_t i = 0; i < width; i += BLOCK) {
        const int64_t n = width - i < BLOCK ? width - i : BLOCK;
        prefetch_rows(pg->v_cache, offs, i + PREFETCH_AHEAD, width, row_bytes);
        for (int64_t j = 0; j < nh; j++)
            block_values(pg->v_cache, offs + i, n, ((h0 + j) / pg->group) * dim, scores + j * width + i, dim,
                         out + j * dim);
    }
}

typedef struct {
    const float *q;
    int64_t q_seq_stride;
    const float *k_cache, *v_cache;
    const int32_t *block_tables;
    int64_t table_stride;
    const int32_t *seq_lens;
    int64_t num_heads, num_kv_heads, dim, block_size, window;
    float scale, softcap;
    float *out;
    int64_t group, per_task, tasks_per_seq, max_len;
    float *scores; /* per thread */
    int64_t *offs;
} DecodeF32;

/* One task: one sequence's heads [h0, h0 + per_task). */
static void decode_task_f32(void *arg, int64_t t, int thread) {
    const DecodeF32 *j = arg;
    const int64_t dim = j->dim, num_heads = j->num_heads, per_task = j->per_task, window = j->window;
    const int64_t s = t / j->tasks_per_seq, h0 = (t % j->tasks_per_seq) * per_task, len = j->seq_lens[s];
    if (len < 1) { /* nothing visible: a zero row, never memory the caller left unset */
        memset(j->out + (s * num_heads + h0) * dim, 0, sizeof(float) * (size_t)(per_task * dim));
        return;
    }
    const int64_t first = window > 0 && len > window ? len - window : 0;
    const Pages pg = {j->k_cache, j->v_cache, j->block_tables + s * j->table_stride, j->block_size,
                      j->num_kv_heads * dim, dim, j->group, j->scale, j->softcap};
    attend_one(&pg, j->q + s * j->q_seq_stride, h0, per_task, first, len, j->offs + thread * j->max_len,
               j->scores + thread * per_task * j->max_len, j->out + (s * num_heads + h0) * dim);
}

/* Decode attention over a paged cache, one query per sequence.
 *   q:            [num_seqs, num_heads, dim], q_seq_stride floats between sequences, heads contiguous
 *   k/v_cache:    [num_blocks, block_size, num_kv_heads, dim], contiguous
 *   block_tables: [num_seqs, table_stride] int32; seq_lens: [num_seqs] int32, the context with this step's token
 *   window:       0 for none, else only keys at positions > seq_len - 1 - window
 *   softcap:      0 for none (Gemma 2: softcap * tanh(score / softcap))
 *   out:          [num_seqs, num_heads, dim], contiguous
 * A task is one sequence's heads, or one KV head's group of them when there are too few sequences
 * to keep every thread busy. Returns 0, or -1 for an unsupported shape or no memory. */
int rill_paged_decode_f32(const float *q, int64_t q_seq_stride, const float *k_cache, const float *v_cache,
                          const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
                          int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t dim, int64_t block_size,
                          int64_t window, float scale, float softcap, float *out, int num_threads) {
    if (num_kv_heads < 1 || num_heads % num_kv_heads != 0 || dim < 1 || dim > MAX_DIM || block_size < 1) return -1;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t per_task = num_seqs >= 2 * num_threads ? num_heads : group;
    const int64_t tasks_per_seq = num_heads / per_task;
    int64_t max_len = 1;
    for (int64_t s = 0; s < num_seqs; s++) max_len = seq_lens[s] > max_len ? seq_lens[s] : max_len;
    if (window > 0 && window < max_len) max_len = window;
    if (num_threads < 1) num_threads = 1;
    /* scratch per thread: scores (per_task x max_len floats) and the positions' row offsets */
    float *scores = malloc(sizeof(float) * (size_t)(num_threads * per_task * max_len));
    int64_t *offs = malloc(sizeof(int64_t) * (size_t)(num_threads * max_len));
    if (scores == NULL || offs == NULL) {
        free(scores);
        free(offs);
        return -1;
    }
    DecodeF32 job = {q, q_seq_stride, k_cache, v_cache, block_tables, table_stride, seq_lens, num_heads, num_kv_heads,
                     dim, block_size, window, scale, softcap, out, group, per_task, tasks_per_seq, max_len, scores, offs};
    rill_pool_for(decode_task_f32, &job, num_seqs * tasks_per_seq, num_threads);
    free(scores);
    free(offs);
    return 0;
}
