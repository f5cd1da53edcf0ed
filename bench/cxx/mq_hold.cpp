// Hold-model driver for the C++ MultiQueue of Williams, Sanders and Dementiev
// ("Engineering MultiQueues: Fast Relaxed Concurrent Priority Queues", ESA 2021;
// https://github.com/marvinwilliams/multiqueue), for `python -m bench pq-threads
// --cxx-mq PATH`. It runs the protocol of bench/pq.py: prefill N keys uniform in
// [0, 2^32) with values 0..N-1, then each of T threads repeats "pop, then push
// key + U[0, 2^32 - 1) with the same value" `iters` times; a pop and a push count
// as two operations. Queues: `c` per thread (default 2), the library's default
// policy (two-choice pops, random pushes, no stickiness) and its default queue
// (8-ary heap with 16-element insertion and deletion buffers).
//
// Build (header-only library; use its release flags):
//   git clone https://github.com/marvinwilliams/multiqueue
//   g++ -std=c++17 -O3 -DNDEBUG -march=native -pthread \
//       -I multiqueue/include -I multiqueue/include/multiqueue/third_party/pcg \
//       bench/cxx/mq_hold.cpp -o mq_hold
// Usage: mq_hold THREADS PREFILL ITERS_PER_THREAD [QUEUES_PER_THREAD [SEED]]
// Prints one line of JSON: {"threads": T, "ops": ..., "seconds": ..., "ops_per_s": ...}.
#include "multiqueue/multiqueue.hpp"

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
using mq_type = multiqueue::KeyValueMultiQueue<std::uint64_t, std::int64_t, std::greater<>>;

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s THREADS PREFILL ITERS_PER_THREAD [QUEUES_PER_THREAD [SEED]]\n", argv[0]);
        return 2;
    }
    const int threads = std::atoi(argv[1]);
    const long prefill = std::atol(argv[2]);
    const long iters = std::atol(argv[3]);
    const int per_thread = argc > 4 ? std::atoi(argv[4]) : 2;
    const unsigned seed = argc > 5 ? static_cast<unsigned>(std::atoi(argv[5])) : 0;
    if (threads < 1 || prefill < 0 || iters < 0 || per_thread < 1) {
        std::fprintf(stderr, "bad arguments: threads >= 1, prefill >= 0, iters >= 0, queues >= 1\n");
        return 2;
    }
    mq_type::config_type config{};
    config.seed = static_cast<int>(seed) + 1;
    mq_type mq(static_cast<std::size_t>(per_thread * threads), config);
    {
        auto h = mq.get_handle();
        std::mt19937_64 rng(seed);
        for (long i = 0; i < prefill; ++i) {
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
