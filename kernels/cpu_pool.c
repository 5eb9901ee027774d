/* The parallel loop of rill's CPU kernels: see cpu_pool.h. One job at a time. The caller publishes a job by
 * a generation counter (odd while it writes the job, even once published), and every thread, the caller
 * included, claims chunks from one counter until none is left; the caller then waits for the chunks claimed
 * to be done, never for a worker to arrive. A worker spins a while for the next job (a decode step calls the
 * kernels back to back), then sleeps on a futex. */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cpu_pool.h"

#define MAX_WORKERS 255
#define SPIN_NS 200000 /* how long a worker spins for the next job before it sleeps */

static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t spawn = PTHREAD_MUTEX_INITIALIZER;
static int num_workers;               /* started (under spawn) */
/* each counter on a cache line of its own: the claims and completions of one must not evict another */
#define LINE __attribute__((aligned(64)))
static LINE _Atomic uint32_t gen;     /* even: the job published (or none yet); odd: a job being written */
static LINE _Atomic int active;       /* workers inside the current job */
static LINE _Atomic int sleepers;
static LINE _Atomic int64_t next_chunk;
static LINE _Atomic int64_t done_chunks;
static LINE rill_chunk_fn job_fn;     /* the job: written only while gen is odd and no worker is active */
static void *job_ctx;
static int64_t job_n;
static int job_workers;               /* workers 1..job_workers take part */

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void run_chunks(rill_chunk_fn fn, void *ctx, int64_t n, int thread) {
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&next_chunk, 1, memory_order_relaxed);
        if (i >= n)
            return;
        fn(ctx, i, thread);
        atomic_fetch_add_explicit(&done_chunks, 1, memory_order_release);
    }
}

static uint32_t started_at[MAX_WORKERS + 1]; /* the generation current when each worker was started */

static void *worker(void *arg) {
    const int thread = (int)(intptr_t)arg; /* 1.. */
    uint32_t seen = started_at[thread];    /* the last job taken: none before the one its caller publishes next */
    for (;;) {
        uint32_t g;
        int64_t until = 0;
        int spins = 0;
        while ((g = atomic_load_explicit(&gen, memory_order_acquire)) == seen || (g & 1u)) {
            relax();
            if (++spins % 256)
                continue;
            if (until == 0) {
                until = now_ns() + SPIN_NS;
            } else if (now_ns() > until) { /* sleep until gen moves from g (returns at once if it has) */
                atomic_fetch_add(&sleepers, 1);
                syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
                atomic_fetch_sub(&sleepers, 1);
                until = 0;
            }
        }
        atomic_fetch_add(&active, 1); /* then check the job is still g: the caller rewrites it only at 0 */
        if (atomic_load(&gen) != g) {
            atomic_fetch_sub(&active, 1);
            continue;
        }
        seen = g;
        if (thread <= job_workers)
            run_chunks(job_fn, job_ctx, job_n, thread);
        atomic_fetch_sub_explicit(&active, 1, memory_order_release);
    }
    return NULL;
}

static void after_fork_child(void) { /* the workers did not come along */
    num_workers = 0;
    atomic_store(&active, 0);
    atomic_store(&sleepers, 0);
    pthread_mutex_init(&busy, NULL);
    pthread_mutex_init(&spawn, NULL);
}

static int start_workers(int want) {
    pthread_mutex_lock(&spawn);
    if (num_workers == 0)
        pthread_atfork(NULL, NULL, after_fork_child);
    while (num_workers < want) {
        started_at[num_workers + 1] = atomic_load(&gen); /* the caller holds `busy`: gen stays until it publishes */
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int failed = pthread_create(&t, &attr, worker, (void *)(intptr_t)(num_workers + 1));
        pthread_attr_destroy(&attr);
        if (failed)
            break;
        num_workers++;
    }
    const int have = num_workers;
    pthread_mutex_unlock(&spawn);
    return have < want ? have : want;
}

void rill_pool_for(rill_chunk_fn fn, void *ctx, int64_t n, int num_threads) {
    if (n <= 0)
        return;
    int want = num_threads - 1;
    if (want > MAX_WORKERS)
        want = MAX_WORKERS;
    if (want > n - 1)
        want = (int)(n - 1);
    if (want <= 0 || pthread_mutex_trylock(&busy) != 0) {
        for (int64_t i = 0; i < n; i++)
            fn(ctx, i, 0);
        return;
    }
    want = start_workers(want);
    const uint32_t g = atomic_load(&gen);
    atomic_store(&gen, g + 1u); /* odd: writing */
    while (atomic_load(&active) != 0)
        relax();
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    job_workers = want;
    atomic_store(&next_chunk, 0);
    atomic_store(&done_chunks, 0);
    atomic_store_explicit(&gen, g + 2u, memory_order_release);
    if (atomic_load(&sleepers) > 0)
        syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    run_chunks(fn, ctx, n, 0);
    while (atomic_load_explicit(&done_chunks, memory_order_acquire) < n)
        relax();
    pthread_mutex_unlock(&busy);
}

typedef struct {
    rill_rows_fn fn;
    void *ctx;
    int64_t rows, ranges;
} Rows;

static void rows_chunk(void *arg, int64_t i, int thread) {
    (void)thread;
    const Rows *r = arg;
    r->fn(r->ctx, r->rows * i / r->ranges, r->rows * (i + 1) / r->ranges);
}

void rill_pool_rows(rill_rows_fn fn, void *ctx, int64_t rows, int num_threads) {
    if (rows <= 0)
        return;
    if (num_threads <= 1 || rows == 1) {
        fn(ctx, 0, rows);
        return;
    }
    const int64_t ranges = rows < 4 * (int64_t)num_threads ? rows : 4 * (int64_t)num_threads;
    Rows r = {fn, ctx, rows, ranges};
    rill_pool_for(rows_chunk, &r, ranges, num_threads);
}
