# Declarations of ext/relaxed_atomic.h shared by the kit's Cython modules.
from libc.stdint cimport uint64_t, int64_t, uint32_t, int32_t, uint8_t

cdef extern from "relaxed_atomic.h" nogil:
    int64_t rlx_cache_line()
    int64_t rlx_load_relaxed_i64(const int64_t *p)
    int64_t rlx_load_acquire_i64(const int64_t *p)
    void rlx_store_relaxed_i64(int64_t *p, int64_t v)
    void rlx_store_release_i64(int64_t *p, int64_t v)
    int64_t rlx_fetch_add_i64(int64_t *p, int64_t v)
    int64_t rlx_fetch_add_acqrel_i64(int64_t *p, int64_t v)
    uint64_t rlx_load_relaxed_u64(const uint64_t *p)
    void rlx_store_relaxed_u64(uint64_t *p, uint64_t v)
    int32_t rlx_load_relaxed_i32(const int32_t *p)
    int32_t rlx_load_acquire_i32(const int32_t *p)
    void rlx_store_release_i32(int32_t *p, int32_t v)
    uint8_t rlx_load_relaxed_u8(const uint8_t *p)
    uint8_t rlx_load_acquire_u8(const uint8_t *p)
    void rlx_store_release_u8(uint8_t *p, uint8_t v)
    void rlx_store_relaxed_i32(int32_t *p, int32_t v)
    int rlx_cas_acquire_i32(int32_t *p, int32_t expected, int32_t desired)
    int rlx_cas_acqrel_i64(int64_t *p, int64_t expected, int64_t desired)
    void rlx_release_fence()
    void rlx_full_fence()
    void rlx_cpu_relax()
    void rlx_yield()
    void rlx_prefetch(const void *p)
    void rlx_prefetch_w(const void *p)
    int rlx_pid_alive(int32_t pid)
    uint64_t rlx_rand(uint64_t *state)
    uint32_t rlx_rand_below(uint64_t *state, uint32_t n)
    void rlx_rand_pair(uint64_t *state, uint32_t n, uint32_t *i, uint32_t *j)
    uint64_t rlx_mix64(uint64_t z)
    void rlx_mc_increment(char *base, int64_t stride, int64_t m, uint64_t *rng)
    int64_t rlx_mc_choose(char *base, int64_t stride, int64_t m, uint64_t *rng)
    void rlx_mc_add_sticky(char *base, int64_t stride, int64_t m, uint64_t *rng,
                           int64_t stick, int64_t *cur, int64_t *left, int64_t *last,
                           int64_t n)
    int64_t rlx_now_ns()
    uint64_t rlx_ticks()
    uint64_t rlx_key_from_i64(int64_t k)
    int64_t rlx_key_to_i64(uint64_t u)
    uint64_t rlx_key_from_f64(double d)
    double rlx_key_to_f64(uint64_t u)
    int32_t rlx_getpid()
    void rlx_crash_arm(int64_t k)
    void rlx_crash_point()


# The first 40 bytes of every structure's segment: relaxed/shm.py's common header
# (32 bytes) and the counter that gives each handle its own random stream.
ctypedef struct ShmHead:
    char magic[8]
    uint32_t version
    uint32_t kind
    uint64_t total_size
    int64_t owner_pid
    int64_t handle_counter     # atomic


cdef inline uint64_t handle_stream(ShmHead *head, int64_t seed) noexcept nogil:
    """A new handle's RNG state: the structure's seed mixed with the next value of the
    shared handle counter, so that every handle (thread or process) draws its own stream."""
    cdef int64_t stream = rlx_fetch_add_i64(&head.handle_counter, 1)
    return rlx_mix64(<uint64_t>seed ^ rlx_mix64(<uint64_t>stream))
