// The kit's MultiQueue (relaxed._multiqueue) as a competitor of the C++ MultiQueue's own
// benchmark harness (Williams, Sanders, Dementiev, "Engineering MultiQueues", ESA 2021;
// https://github.com/marvinwilliams/multiqueue_experiments, e.g. `monotonic`): the same
// wrapper interface as the harness's wrapper/multiqueue.hpp (a PQ<Min, Key, T> with
// get_handle(), push(pair), try_pop() -> optional<pair>, and a Settings struct with
// "-c, --queue-factor" queues per thread), so the harness's threads, pinning, batching
// and timing drive both queues alike.
//
// The queue lives in Python's world (an embedded interpreter imports `relaxed`, builds a
// MultiQueue and hands out its compiled core through MultiQueue._native_handles); the
// harness's threads then call the core's nogil push and pop directly, never Python.
// Keys: the harness's unsigned keys (below 2^63) map to the kit's order-preserving
// uint64 form by flipping the top bit, as an int64 key does.
//
// Build beside the harness's monotonic benchmark (EXP: a checkout of
// multiqueue_experiments; `relaxed` must be importable by the embedded Python, through
// PYTHONPATH or an installed kit). The harness picks its queue in util/selector.hpp by a
// PQ_* macro; the one line that includes it is pointed at this header instead, nothing
// else of the harness changes:
//   sed 's|#include "util/selector.hpp"|#include "kit_mq.hpp"|' EXP/benchmarks/monotonic.cpp \
//       > monotonic_kit.cpp
//   g++ -std=c++17 -O3 -DNDEBUG -march=native -pthread -DL1_CACHE_LINE_SIZE=64 \
//       -DPAGE_SIZE=4096 -I bench/cxx -I EXP/benchmarks -I EXP -isystem EXP/third_party \
//       $(python3-config --includes) monotonic_kit.cpp EXP/benchmarks/util/threading.cpp \
//       $(python3-config --embed --ldflags) -o monotonic_kit
#pragma once

#include <Python.h>

#include <cxxopts.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>

namespace wrapper::kit {

struct Elem {              // the kit's element: mapped key, value
    std::uint64_t key;
    std::int64_t value;
};
using push_fn = int (*)(void*, void*, Elem);
using pop_fn = int (*)(void*, void*, Elem*);
constexpr int kDone = 1, kBusy = 2;     // the core's R_OK, R_BUSY
constexpr std::uint64_t FLIP = 0x8000000000000000ULL;

// One embedded interpreter for the process; the GIL is released once the queue exists.
inline PyObject* py_call(PyObject* obj, char const* method, PyObject* args, PyObject* kw) {
    PyObject* f = PyObject_GetAttrString(obj, method);
    if (f == nullptr) { PyErr_Print(); std::abort(); }
    PyObject* r = PyObject_Call(f, args, kw);
    Py_DECREF(f);
    if (r == nullptr) { PyErr_Print(); std::abort(); }
    return r;
}

inline std::size_t addr_of(PyObject* dict, char const* key) {
    PyObject* v = PyDict_GetItemString(dict, key);            // borrowed
    if (v == nullptr) { std::cerr << "kit_mq: no " << key << '\n'; std::abort(); }
    return static_cast<std::size_t>(PyLong_AsSize_t(v));
}

template <bool Min, typename Key = unsigned long, typename T = Key>
class KitMultiQueue {
    static_assert(Min, "the kit's MultiQueue is a min-queue");

   public:
    using key_type = Key;
    using mapped_type = T;
    using value_type = std::pair<key_type, mapped_type>;

    struct Settings {
        int factor = 2;
        int seed = 1;
        int stickiness = 1;

        void register_cmd_options(cxxopts::Options& cmd) {
            cmd.add_options()("c,queue-factor", "The number of queues per thread",
                              cxxopts::value<int>(factor), "NUMBER");
            cmd.add_options()("mq-seed", "Seed for the multiqueue", cxxopts::value<int>(seed),
                              "NUMBER");
            cmd.add_options()("k,stickiness", "Operations on one pair of queues (1: a fresh "
                              "pair every operation)", cxxopts::value<int>(stickiness), "NUMBER");
        }
        [[nodiscard]] bool validate() const {
            if (factor < 1 || stickiness < 1) {
                std::cerr << "Error: queue factor and stickiness must be at least 1\n";
                return false;
            }
            return true;
        }
        void write_human_readable(std::ostream& out) const {
            out << "Queue factor: " << factor << "\nMQ seed: " << seed
                << "\nStickiness: " << stickiness << '\n';
        }
        void write_json(std::ostream& out) const {
            out << '{' << std::quoted("queue_factor") << ':' << factor << ','
                << std::quoted("seed") << ':' << seed << ',' << std::quoted("stickiness") << ':'
                << stickiness << '}';
        }
    };

    class Handle {
        friend KitMultiQueue;
        void* core_;
        void* h_;
        push_fn push_;
        pop_fn pop_;
        Handle(void* core, void* h, push_fn p, pop_fn q) : core_{core}, h_{h}, push_{p}, pop_{q} {}

       public:
        bool push(value_type const& v) {
            Elem e{static_cast<std::uint64_t>(v.first) ^ FLIP, static_cast<std::int64_t>(v.second)};
            int r;
            while ((r = push_(core_, h_, e)) == kBusy) {
            }
            if (r != kDone) { std::cerr << "kit_mq: every queue full\n"; std::abort(); }
            return true;
        }
        std::optional<value_type> try_pop() {
            Elem e;
            int r;
            while ((r = pop_(core_, h_, &e)) == kBusy) {
            }
            if (r != kDone) return std::nullopt;
            return value_type{static_cast<key_type>(e.key ^ FLIP), static_cast<mapped_type>(e.value)};
        }
    };

    using handle_type = Handle;
    using settings_type = Settings;

    // capacity: twice what the harness asks for (its hold loop keeps the size, but random
    // pushes let single queues run fuller than the mean), plus slack per queue
    KitMultiQueue(int num_threads, std::size_t initial_capacity, Settings const& settings) {
        // numpy's BLAS would start a pool of threads that spin (and yield) on the
        // harness's cores for a while after the import; the queue never calls BLAS
        setenv("OPENBLAS_NUM_THREADS", "1", 0);
        setenv("OMP_NUM_THREADS", "1", 0);
        setenv("MKL_NUM_THREADS", "1", 0);
        if (!Py_IsInitialized()) Py_Initialize();
        PyObject* mod = PyImport_ImportModule("relaxed");
        if (mod == nullptr) { PyErr_Print(); std::abort(); }
        PyObject* cls = PyObject_GetAttrString(mod, "MultiQueue");
        long queues = static_cast<long>(num_threads) * settings.factor;
        PyObject* args = Py_BuildValue("(l)", static_cast<long>(2 * initial_capacity + 1024 * queues));
        PyObject* kw = Py_BuildValue("{s:l,s:l,s:l}", "n_queues", queues, "seed",
                                     static_cast<long>(settings.seed), "stickiness",
                                     static_cast<long>(settings.stickiness));
        mq_ = PyObject_Call(cls, args, kw);
        if (mq_ == nullptr) { PyErr_Print(); std::abort(); }
        Py_DECREF(args);
        Py_DECREF(kw);
        PyObject* nargs = Py_BuildValue("(l)", static_cast<long>(kMaxHandles));
        native_ = py_call(mq_, "_native_handles", nargs, nullptr);
        Py_DECREF(nargs);
        core_ = reinterpret_cast<void*>(addr_of(native_, "core"));
        push_ = reinterpret_cast<push_fn>(addr_of(native_, "push"));
        pop_ = reinterpret_cast<pop_fn>(addr_of(native_, "pop"));
        PyObject* buf = PyDict_GetItemString(native_, "handles");
        Py_buffer view;
        if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) != 0) { PyErr_Print(); std::abort(); }
        handles_ = static_cast<char*>(view.buf) + addr_of(native_, "offset");
        PyBuffer_Release(&view);             // the dict keeps the array alive
        stride_ = addr_of(native_, "stride");
        Py_DECREF(cls);
        Py_DECREF(mod);
        saved_ = PyEval_SaveThread();        // the harness's threads never need the GIL
    }
    KitMultiQueue(KitMultiQueue const&) = delete;
    KitMultiQueue& operator=(KitMultiQueue const&) = delete;
    ~KitMultiQueue() {
        PyEval_RestoreThread(saved_);
        PyObject* r = PyObject_CallMethod(mq_, "close", nullptr);
        Py_XDECREF(r);
        Py_DECREF(native_);
        Py_DECREF(mq_);
    }

    static void write_human_readable(std::ostream& out) {
        out << "The kit's MultiQueue (relaxed.MultiQueue, compiled core via _native_handles)\n";
    }

    Handle get_handle() {
        int k = next_.fetch_add(1, std::memory_order_relaxed);
        if (k >= kMaxHandles) { std::cerr << "kit_mq: too many handles\n"; std::abort(); }
        return Handle{core_, handles_ + static_cast<std::size_t>(k) * stride_, push_, pop_};
    }

   private:
    static constexpr int kMaxHandles = 256;
    PyObject* mq_ = nullptr;
    PyObject* native_ = nullptr;
    PyThreadState* saved_ = nullptr;
    void* core_ = nullptr;
    push_fn push_ = nullptr;
    pop_fn pop_ = nullptr;
    char* handles_ = nullptr;
    std::size_t stride_ = 0;
    std::atomic<int> next_{0};
};

}  // namespace wrapper::kit

// what the harness's util/selector.hpp defines for the queue it picks
#define PQ wrapper::kit::KitMultiQueue
