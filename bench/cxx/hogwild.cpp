// A plain C++ Hogwild! reference for `python -m bench hogwild --cxx`.
//
// The same algorithm as the kit's kernel (sgd_shm/_kernels.py) written the way one would
// in C++ with std::thread: logistic loss, L2 through a weight scale w = s*v whose value
// comes from a per-epoch table indexed by the global step (each worker estimates it from
// its own count plus the counts the others publish every 32 samples, read after the
// sample's weights), scikit-learn's 'optimal' learning rate 1/(alpha*(t0 + t)), the
// intercept accumulated per worker and published with the count, a shuffled index array
// cut into one contiguous part per worker, no locks.
// What it leaves out on purpose: software prefetching, the hot-coordinate buffers and
// the work stealing of the kit (this is textbook Hogwild, Niu, Recht, Re, Wright 2011).
//
// usage: hogwild DIR WORKERS EPOCHS SEED ALPHA T0 [ORDERS]
//   DIR holds shape.txt ("n d nnz"), indptr.bin (int64), indices.bin (int32),
//   data.bin (float64), y.bin (float64, +-1). ORDERS, for tests: a file of EPOCHS x n
//   int64, each epoch's order of the samples instead of a shuffle. Prints one line per epoch
//   ("epoch SECONDS") and writes, after the clock, DIR/coef_E.bin (d doubles, scale
//   folded in) and DIR/intercept_E.bin (one double) for epoch E = 0, 1, ...
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

template <class T>
static std::vector<T> load(const std::string& path, size_t n) {
    std::vector<T> v(n);
    std::ifstream f(path, std::ios::binary);
    if (!f.read(reinterpret_cast<char*>(v.data()), sizeof(T) * n)) {
        std::fprintf(stderr, "cannot read %zu values from %s\n", n, path.c_str());
        std::exit(2);
    }
    return v;
}

struct alignas(64) Slot { std::atomic<int64_t> done{0}; };

int main(int argc, char** argv) {
    if (argc != 7 && argc != 8) {
        std::fprintf(stderr, "usage: %s DIR WORKERS EPOCHS SEED ALPHA T0 [ORDERS]\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const int nw = std::atoi(argv[2]), epochs = std::atoi(argv[3]);
    const uint64_t seed = std::strtoull(argv[4], nullptr, 10);
    const double alpha = std::atof(argv[5]), t0 = std::atof(argv[6]);
    size_t n, d, nnz;
    {
        std::ifstream f(dir + "/shape.txt");
        if (!(f >> n >> d >> nnz) || nw < 1) { std::fprintf(stderr, "bad shape.txt or WORKERS\n"); return 2; }
    }
    const auto indptr = load<int64_t>(dir + "/indptr.bin", n + 1);
    const auto indices = load<int32_t>(dir + "/indices.bin", nnz);
    const auto data = load<double>(dir + "/data.bin", nnz);
    const auto y = load<double>(dir + "/y.bin", n);

    std::vector<double> v(d, 0.0);        // shared weights (scaled), written without locks
    double b = 0.0;                        // shared intercept, published every 32 samples
    const double icpt_decay = 0.01;        // scikit-learn's for sparse data
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(seed);
    std::vector<int64_t> given;            // the orders of ORDERS, when given
    if (argc == 8) given = load<int64_t>(argv[7], n * static_cast<size_t>(epochs));
    std::vector<double> eta(n), scale(n + 1);
    double t_start = 0.0;

    for (int ep = 0; ep < epochs; ++ep) {
        auto start = std::chrono::steady_clock::now();
        if (given.empty())
            std::shuffle(order.begin(), order.end(), rng);
        else
            std::copy(given.begin() + ep * n, given.begin() + (ep + 1) * n, order.begin());
        scale[0] = 1.0;
        for (size_t t = 0; t < n; ++t) {
            eta[t] = 1.0 / (alpha * (t0 + t_start + t));
            scale[t + 1] = scale[t] * (1.0 - eta[t] * alpha);
        }
        std::vector<Slot> progress(nw);
        auto work = [&](int w) {
            const size_t lo = n * w / nw, hi = n * (w + 1) / nw;
            int64_t since = 0, own = 0;
            double db = 0.0;
            for (size_t k = lo; k < hi; ++k) {
                const int64_t i = order[k];
                double p = 0.0;
                for (int64_t m = indptr[i]; m < indptr[i + 1]; ++m) p += v[indices[m]] * data[m];
                int64_t tg = own;                // own count + the others' published ones,
                for (int u = 0; u < nw; ++u)     // read after the weights
                    if (u != w) tg += progress[u].done.load(std::memory_order_relaxed);
                if (tg > (int64_t)n - 1) tg = n - 1;
                const double s = scale[tg], s_after = scale[tg + 1];
                p = p * s + b + db;
                const double z = p * y[i];
                // d loss / dp for log loss, as scikit-learn computes it
                const double dl = z > 18.0 ? -y[i] * std::exp(-z)
                                : z < -18.0 ? -y[i] : -y[i] / (std::exp(z) + 1.0);
                const double g = -eta[tg] * dl;
                const double step = g / s_after;
                for (int64_t m = indptr[i]; m < indptr[i + 1]; ++m) v[indices[m]] += step * data[m];
                db += g * icpt_decay;
                ++own;
                if (++since == 32) {
                    b += db;                     // plain write, like Hogwild's
                    db = 0.0;
                    progress[w].done.store(own, std::memory_order_relaxed);
                    since = 0;
                }
            }
            b += db;
        };
        std::vector<std::thread> threads;
        for (int w = 1; w < nw; ++w) threads.emplace_back(work, w);
        work(0);
        for (auto& th : threads) th.join();
        const double s = scale[n];
        for (auto& x : v) x *= s;
        t_start += n;
        std::chrono::duration<double> dt = std::chrono::steady_clock::now() - start;
        std::printf("epoch %.6f\n", dt.count());
        // after the clock: this epoch's weights (scale folded in) and intercept
        const std::string tag = std::to_string(ep);
        std::ofstream(dir + "/coef_" + tag + ".bin", std::ios::binary)
            .write(reinterpret_cast<char*>(v.data()), sizeof(double) * d);
        std::ofstream(dir + "/intercept_" + tag + ".bin", std::ios::binary)
            .write(reinterpret_cast<char*>(&b), sizeof(double));
    }
    return 0;
}
