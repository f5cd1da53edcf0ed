// Hold-model driver for the C++ MultiQueue of Williams, Sanders and Dementiev
// ("Engineering MultiQueues: Fast Relaxed Concurrent Priority Queues", ESA 2021;
// https://github.com/marvinwilliams/multiqueue), for `python -m bench pq-threads
// --cxx-mq PATH`. It runs the protocol of bench/pq.py: prefill N keys uniform in
// [0, 2^32) with values 0..N-1, then each of T threads repeats "pop, then push
// key + U[0, 2^32 - 1) with the same value" `iters` times; a pop and a push count
// as two operations. Queues: `c` per thread (default 2) with the library's default
// queue (8-ary heap with 16-element insertion and deletion buffers). Policy: with
// STICKINESS 0 (the default) the library's default one (two-choice pops, random
// pushes, no stickiness); with STICKINESS s >= 1 its StickRandom mode: a handle
// keeps one random pair of queues for s operations, pops the smaller top of the
// two and pushes to one of them (the kit's `stickiness=s`).
//
// Build (header-only library; use its release flags):
//   git clone https://github.com/marvinwilliams/multiqueue
//   g++ -std=c++17 -O3 -DNDEBUG -march=native -pthread \
//       -I multiqueue/include -I multiqueue/include/multiqueue/third_party/pcg \
//       bench/cxx/mq_hold.cpp -o mq_hold
// Usage: mq_hold THREADS PREFILL ITERS_PER_THREAD [QUEUES_PER_THREAD [SEED [STICKINESS]]]
// Prints one line of JSON: {"threads": T, "ops": ..., "seconds": ..., "ops_per_s": ...}.
#include "multiqueue/multiqueue.hpp"
#include "multiqueue/modes/stick_random.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

// std::greater<>: a min-queue like the kit's (the library, like std::priority_queue, pops the
// largest key under std::less; the hold model would then never reach the heaps)
struct StickyPolicy {
    using mode_type = multiqueue::mode::StickRandom<2>;
    static constexpr int pop_tries = 1;
    static constexpr bool scan = true;
};
using plain_mq = multiqueue::KeyValueMultiQueue<std::uint64_t, std::int64_t, std::greater<>>;
using sticky_mq = multiqueue::KeyValueMultiQueue<std::uint64_t, std::int64_t, std::greater<>, StickyPolicy>;

struct Args {
    int threads;
    long prefill;
    long iters;
    int per_thread;
    unsigned seed;
};

template <typename MQ>
int run(Args const& a, typename MQ::config_type config) {
    const int threads = a.threads;
    const long iters = a.iters;
    const unsigned seed = a.seed;
    config.seed = static_cast<int>(seed) + 1;
    MQ mq(static_cast<std::size_t>(a.per_thread * threads), config);
    {
        auto h = mq.get_handle();
        std::mt19937_64 rng(seed);
        for (long i = 0; i < a.prefill; ++i) {
            h.push({rng() & 0xFFFFFFFFULL, i});
        }
    }
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<double> t0(threads), t1(threads);
    std::vector<long> empties(threads, 0);
    std::vector<std::thread> ts;
    for (int w = 0; w < threads; ++w) {
        ts.emplace_back([&, w] {
            auto h = mq.get_handle();
            std::mt19937_64 rng(seed * 1000003ULL + w + 1);
            ready.fetch_add(1);
            while (!go.load(std::memory_order_acquire)) {
            }
            auto start = std::chrono::steady_clock::now();
            for (long i = 0; i < iters; ++i) {
                auto v = h.try_pop();
                std::uint64_t d = rng() % 0xFFFFFFFFULL;
                if (v) {
                    h.push({v->first + d, v->second});
                } else {
                    ++empties[w];
                    h.push({d, i});
                }
            }
            auto end = std::chrono::steady_clock::now();
            t0[w] = std::chrono::duration<double>(start.time_since_epoch()).count();
            t1[w] = std::chrono::duration<double>(end.time_since_epoch()).count();
        });
    }
    while (ready.load() < threads) {
    }
    go.store(true, std::memory_order_release);
    for (auto& t : ts) {
        t.join();
    }
    double lo = t0[0], hi = t1[0];
    long empty = 0;
    for (int w = 0; w < threads; ++w) {
        lo = std::min(lo, t0[w]);
        hi = std::max(hi, t1[w]);
        empty += empties[w];
    }
    const double ops = 2.0 * static_cast<double>(iters) * threads;
    std::printf("{\"threads\": %d, \"ops\": %.0f, \"seconds\": %.6f, \"ops_per_s\": %.1f, \"empty_pops\": %ld}\n",
                threads, ops, hi - lo, ops / (hi - lo), empty);
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr,
                     "usage: %s THREADS PREFILL ITERS_PER_THREAD [QUEUES_PER_THREAD [SEED [STICKINESS]]]\n",
                     argv[0]);
        return 2;
    }
    Args a{std::atoi(argv[1]), std::atol(argv[2]), std::atol(argv[3]), argc > 4 ? std::atoi(argv[4]) : 2,
           argc > 5 ? static_cast<unsigned>(std::atoi(argv[5])) : 0U};
    const int stickiness = argc > 6 ? std::atoi(argv[6]) : 0;
    if (a.threads < 1 || a.prefill < 0 || a.iters < 0 || a.per_thread < 1 || stickiness < 0) {
        std::fprintf(stderr, "bad arguments: threads >= 1, prefill >= 0, iters >= 0, queues >= 1, stickiness >= 0\n");
        return 2;
    }
    if (a.threads * a.per_thread < 2) {
        // the library draws two distinct queues per pop: with one it would never return
        std::fprintf(stderr, "bad arguments: THREADS * QUEUES_PER_THREAD must be >= 2\n");
        return 2;
    }
    if (stickiness == 0) {
        return run<plain_mq>(a, plain_mq::config_type{});
    }
    sticky_mq::config_type config{};
    config.stickiness = stickiness;
    return run<sticky_mq>(a, config);
}
