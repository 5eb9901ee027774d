/* rill's CPU kernels' parallel loop (kernels/cpu_pool.c): chunks [0, n) of a job shared by the calling thread
 * and up to num_threads - 1 pool workers, each chunk claimed by whichever thread comes first.
 *
 * Why not an OpenMP parallel region: a region ends at a barrier every thread must reach, so a worker the OS
 * has not scheduled yet (its core taken by the server's event loop or a client on the same machine) holds
 * the whole region, and the caller's core idles while it waits. In a served decode step of 8 sequences on a
 * 2-core Zen 5 (rill serve and vLLM's benchmark client on the same cores) the engine's steps took 12.6 ms
 * against 8.5 ms alone. Here the caller waits only for chunks already claimed: a late worker finds none left.
 *
 * Which thread computes a chunk never changes what it computes, so results stay independent of the thread
 * count and of timing, as the kernels promise. */
#ifndef RILL_CPU_POOL_H
#define RILL_CPU_POOL_H

#include <stdint.h>

/* thread: which of the job's threads runs the chunk, in [0, num_threads): for per-thread scratch. */
typedef void (*rill_chunk_fn)(void *ctx, int64_t chunk, int thread);

/* fn(ctx, i, thread) for every i in [0, n), on the calling thread (thread 0) and up to num_threads - 1
 * workers; returns when all are done. A second caller while a job runs (another engine's thread) runs its
 * chunks alone, as thread 0. */
void rill_pool_for(rill_chunk_fn fn, void *ctx, int64_t n, int num_threads);

/* fn(ctx, first, last) over [0, rows) in ranges, a few per thread (one range with one thread). */
typedef void (*rill_rows_fn)(void *ctx, int64_t first, int64_t last);
void rill_pool_rows(rill_rows_fn fn, void *ctx, int64_t rows, int num_threads);

#endif
