/*
 * relaxed_atomic.h -- the few things Cython cannot say by itself:
 * GCC __atomic builtins with explicit orderings, a cpu pause, the cache-line
 * constant, a per-handle RNG (wyrand) and a cheap timestamp.
 *
 * Everything is static inline; the .pyx files declare these with
 * `cdef extern from "relaxed_atomic.h" nogil`.
 */
#ifndef RELAXED_ATOMIC_H
#define RELAXED_ATOMIC_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <signal.h>
#include <sched.h>
#include <time.h>
#include <sys/types.h>
#include <unistd.h>

/* One named cache-line constant for every padded counter and lock guard.
 * 128 rather than 64 on x86-64 because the adjacent-line prefetcher pulls
 * pairs of lines (the same choice as crossbeam's CachePadded).
 * Override at build time with -DRELAXED_CACHE_LINE=64. */
#ifndef RELAXED_CACHE_LINE
#define RELAXED_CACHE_LINE 128
#endif

static inline int64_t rlx_cache_line(void) { return RELAXED_CACHE_LINE; }

/* ---- atomics on int64 / uint64 / int32 words ---------------------------- */
static inline int64_t rlx_load_relaxed_i64(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline int64_t rlx_load_acquire_i64(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void rlx_store_relaxed_i64(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline void rlx_store_release_i64(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline int64_t rlx_fetch_add_i64(int64_t *p, int64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline int64_t rlx_fetch_add_acqrel_i64(int64_t *p, int64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }

static inline uint64_t rlx_load_relaxed_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void rlx_store_relaxed_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

static inline int32_t rlx_load_relaxed_i32(const int32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline int32_t rlx_load_acquire_i32(const int32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void rlx_store_release_i32(int32_t *p, int32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

static inline uint8_t rlx_load_relaxed_u8(const uint8_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline uint8_t rlx_load_acquire_u8(const uint8_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void rlx_store_release_u8(uint8_t *p, uint8_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void rlx_store_relaxed_i32(int32_t *p, int32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

/* Strong CAS; acquire on success (it takes a lock), relaxed on failure. */
static inline int rlx_cas_acquire_i32(int32_t *p, int32_t expected, int32_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}
static inline int rlx_cas_acqrel_i64(int64_t *p, int64_t expected, int64_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

/* Orders every store before it ahead of every store after it (a compiler
 * barrier on x86-64, dmb on arm64). Used by the per-queue journal that lets a
 * survivor repair a heap whose lock holder died mid-operation. */
static inline void rlx_release_fence(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }
/* A full fence: every access before it is globally visible before any after it. */
static inline void rlx_full_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

static inline void rlx_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}
static inline void rlx_yield(void) { sched_yield(); }
static inline int64_t rlx_now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
}
static inline void rlx_prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }
static inline void rlx_prefetch_w(const void *p) { __builtin_prefetch(p, 1, 3); }

static inline int32_t rlx_getpid(void) { return (int32_t)getpid(); }

/* ---- liveness of a lock owner ------------------------------------------ */
/* 1 if a process with this pid is running (or we may not signal it), 0 if it
 * does not exist or is a zombie (dead but not yet reaped by its parent, which
 * kill(pid, 0) alone would report as alive). Slow path only. */
static inline int rlx_pid_alive(int32_t pid) {
    char path[64], buf[512];
    FILE *f;
    size_t n;
    char *rp;
    if (pid <= 0) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (!f) return 1;                 /* no procfs: trust kill() */
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    rp = strrchr(buf, ')');           /* the state follows the command name */
    if (rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X')) return 0;
    return 1;
}

/* ---- per-handle RNG: wyrand (Wang Yi, public domain) ---------------------- */
static inline uint64_t rlx_rand(uint64_t *state) {
    *state += 0xa0761d6478bd642fULL;
    __uint128_t t = (__uint128_t)(*state) * (*state ^ 0xe7037ed1a0b428dbULL);
    return (uint64_t)(t >> 64) ^ (uint64_t)t;
}
/* Uniform in [0, n) by Lemire's multiply-shift (bias < n / 2^32, negligible). */
static inline uint32_t rlx_rand_below(uint64_t *state, uint32_t n) {
    return (uint32_t)(((uint64_t)(uint32_t)rlx_rand(state) * (uint64_t)n) >> 32);
}
/* Two distinct indices in [0, n), n >= 2, from one draw (32 bits each). */
static inline void rlx_rand_pair(uint64_t *state, uint32_t n, uint32_t *i, uint32_t *j) {
    uint64_t r = rlx_rand(state);
    uint32_t a = (uint32_t)(((r & 0xffffffffULL) * (uint64_t)n) >> 32);
    uint32_t b = (uint32_t)(((r >> 32) * (uint64_t)(n - 1)) >> 32);
    *i = a;
    *j = b >= a ? b + 1 : b;
}

/* MultiCounter increment (Alistarh et al., SPAA 2018): add one to the smaller
 * of two distinct random counters, counter i at base + i * stride. Shared by
 * the MultiCounter and the TL2 STM's relaxed clock. */
static inline void rlx_mc_increment(char *base, int64_t stride, int64_t m, uint64_t *rng) {
    uint32_t i, j;
    if (m == 1) { __atomic_fetch_add((int64_t *)base, 1, __ATOMIC_RELAXED); return; }
    rlx_rand_pair(rng, (uint32_t)m, &i, &j);
    if (__atomic_load_n((int64_t *)(base + (int64_t)j * stride), __ATOMIC_RELAXED) <
        __atomic_load_n((int64_t *)(base + (int64_t)i * stride), __ATOMIC_RELAXED)) i = j;
    __atomic_fetch_add((int64_t *)(base + (int64_t)i * stride), 1, __ATOMIC_RELAXED);
}

/* The smaller of two distinct random counters (m >= 2), as rlx_mc_increment picks. */
static inline int64_t rlx_mc_choose(char *base, int64_t stride, int64_t m, uint64_t *rng) {
    uint32_t i, j;
    rlx_rand_pair(rng, (uint32_t)m, &i, &j);
    if (__atomic_load_n((int64_t *)(base + (int64_t)j * stride), __ATOMIC_RELAXED) <
        __atomic_load_n((int64_t *)(base + (int64_t)i * stride), __ATOMIC_RELAXED)) i = j;
    return (int64_t)i;
}

/* n sticky increments: a handle keeps the counter it chose (*cur) for `stick`
 * increments (*left of them still due) before it chooses again, as the
 * MultiQueue's StickRandom policy keeps its queues. Each increment is still one
 * atomic add of 1; only the choice (two loads of lines the other cores write)
 * is paid once per `stick` increments, so on a few cores each thread mostly adds
 * to a line it already holds.
 * Two handles may choose the same counter (the smaller of two is often the one
 * another handle has just chosen); they would then fight over one line for the
 * rest of their runs, at the contended-atomic rate. A handle sees this for free:
 * its fetch_add returns the value before its add, which is its own last value
 * plus one (*last + 1) while it is the only one adding. Any other value means
 * another handle added in between, and the handle ends its run at once and
 * chooses again. Runs only get shorter, so the weight of a run stays <= stick.
 * *last is -1 at the start of a run (nothing to compare with yet). */
static inline void rlx_mc_add_sticky(char *base, int64_t stride, int64_t m, uint64_t *rng,
                                     int64_t stick, int64_t *cur, int64_t *left,
                                     int64_t *last, int64_t n) {
    while (n > 0) {
        if (*left <= 0) {
            *cur = m == 1 ? 0 : rlx_mc_choose(base, stride, m, rng);
            *left = stick;
            *last = -1;
        }
        int64_t run = *left < n ? *left : n, k = 0, prev = *last;
        int64_t *c = (int64_t *)(base + *cur * stride);
        int shared = 0;
        while (k < run) {
            int64_t v = __atomic_fetch_add(c, 1, __ATOMIC_RELAXED);
            k++;
            if (m > 1 && prev >= 0 && v != prev + 1) { shared = 1; prev = v; break; }
            prev = v;
        }
        *last = prev;
        *left = shared ? 0 : *left - k;
        n -= k;
    }
}

/* splitmix64, to derive independent seeds from (seed, stream id). */
static inline uint64_t rlx_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* ---- crash injection (tests only) ----------------------------------------
 * rlx_crash_arm(k): the k-th crash point reached after arming (0-based) kills
 * this process with SIGKILL. Crash points sit after every store of the heap
 * operations and of recovery, so a test can kill a holder at every step and
 * check that the survivors repair the queue. Disarmed (-1) it costs one
 * predictable branch per store. Process-local (one per extension module). */
static int64_t rlx_crash_countdown = -1;
static inline void rlx_crash_arm(int64_t k) { rlx_crash_countdown = k; }
static inline void rlx_crash_point(void) {
    if (__builtin_expect(rlx_crash_countdown >= 0, 0)) {
        if (rlx_crash_countdown-- == 0) kill(getpid(), SIGKILL);
    }
}

/* ---- timestamps for the operation log ---------------------------------- */
/* The log stamps an event while the queue's lock is held, so that sorting by stamp
   is a linearization. RDTSC alone may execute before the lock's compare-and-swap
   completes (it waits for nothing before it), and a stamp taken while another core
   still held the lock would order the two events the wrong way; LFENCE first makes
   every earlier instruction, the lock's CAS included, complete before the read. */
static inline uint64_t rlx_ticks(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_lfence();
    return __builtin_ia32_rdtsc();
#else
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
#endif
}

/* ---- order-preserving key maps to uint64 -------------------------------- */
static inline uint64_t rlx_key_from_i64(int64_t k) { return ((uint64_t)k) ^ 0x8000000000000000ULL; }
static inline int64_t rlx_key_to_i64(uint64_t u) { return (int64_t)(u ^ 0x8000000000000000ULL); }
static inline uint64_t rlx_key_from_f64(double d) {
    union { double d; uint64_t u; } c; c.d = d;
    return (c.u & 0x8000000000000000ULL) ? ~c.u : (c.u | 0x8000000000000000ULL);
}
static inline double rlx_key_to_f64(uint64_t u) {
    union { double d; uint64_t u; } c;
    c.u = (u & 0x8000000000000000ULL) ? (u & 0x7fffffffffffffffULL) : ~u;
    return c.d;
}

#endif
