// bench_optimizers.cpp: the optimizers' dense and sparse updates against a plain hand-written loop doing the
// same arithmetic on the same buffers.
//
// Limit: the pss update reaches at least 0.9x the loop's bytes/s (dense, 1M and 16M float32) and rows/s
// (sparse, 4096 random rows of a 1M x 64 float32 shard); dense Adam at least 0.95x (issue 12), its loop
// built with -fno-math-errno (baselines/adam_loop.cpp), without which GCC leaves its sqrt scalar. Bytes counted per element: SGD reads w and g and
// writes w (12 bytes); Adam reads w, m, v, g and writes w, m, v (28 bytes).
// Build: -O3 -DXTENSOR_USE_XSIMD (as the pss::pss target defines it), link -lbenchmark -lpthread.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include <benchmark/benchmark.h>
#include <xtensor/xarray.hpp>

#include <pss/optimizer/adam.hpp>
#include <pss/optimizer/sgd.hpp>

#include "ratio_report.hpp"

/// Adam's update of n elements, by hand (baselines/adam_loop.cpp, built with -fno-math-errno).
void adam_loop(float* w, float* m, float* v, const float* g, std::size_t n, float alpha, float one_minus_b1,
               float one_minus_b2, float eps);

namespace {

constexpr std::size_t M = std::size_t{1} << 20;
constexpr double learning_rate = 1e-6;  // small: the values drift little over millions of steps

/// One dense shard with its gradient and optimizer slots, shared by the pss and loop benchmarks of a
/// size so both touch the same (already faulted-in) memory.
template <class O>
struct DenseCase {
    O optimizer;
    xt::xarray<float> value, grad;
    typename O::template Slots<float> slots;
    std::int64_t loop_steps = 0;

    DenseCase(O o, std::size_t n)
        : optimizer(o), value(std::vector<std::size_t>{n}, 1.0f), grad(std::vector<std::size_t>{n}, 0.5f),
          slots(optimizer.make_slots(value)) {}

    static DenseCase& get(std::size_t n) {
        static DenseCase one(O(learning_rate), M), sixteen(O(learning_rate), 16 * M);
        return n == M ? one : sixteen;
    }
};

/// A 1M x 64 float32 shard and 4096 unique random rows of gradient.
template <class O>
struct SparseCase {
    static constexpr std::size_t rows = M, width = 64, picked = 4096;
    O optimizer;
    xt::xarray<float> value, grad_rows;
    typename O::template Slots<float> slots;
    std::vector<std::int64_t> ids;
    std::int64_t loop_steps = 0;

    SparseCase()
        : optimizer(learning_rate), value(std::vector<std::size_t>{rows, width}, 1.0f),
          grad_rows(std::vector<std::size_t>{picked, width}, 0.5f), slots(optimizer.make_slots(value)) {
        std::mt19937_64 rng(42);
        std::unordered_set<std::int64_t> seen;
        while (ids.size() < picked) {
            const auto id = static_cast<std::int64_t>(rng() % rows);
            if (seen.insert(id).second) ids.push_back(id);
        }
        // A first apply touches every slot page the benchmark will touch.
        optimizer.apply_sparse(value, slots, std::span<const std::int64_t>(ids), grad_rows);
    }
    static SparseCase& get() {
        static SparseCase one;
        return one;
    }
};

// ---- the plain loops: the same arithmetic, written by hand ---------------------------------------

void sgd_loop(float* w, const float* g, std::size_t n, float lr) {
    for (std::size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
}


/// Keras' bias-corrected step size at step t, as pss::Adam computes it.
float adam_alpha(std::int64_t t) {
    const double td = static_cast<double>(t);
    return static_cast<float>(learning_rate * std::sqrt(1 - std::pow(0.999, td)) / (1 - std::pow(0.9, td)));
}

// ---- dense ---------------------------------------------------------------------------------------

void dense_sgd_pss(benchmark::State& state) {
    auto& c = DenseCase<pss::SGD>::get(static_cast<std::size_t>(state.range(0)));
    for (auto _ : state) {
        c.optimizer.apply_dense(c.value, c.slots, c.grad);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * state.range(0) * 12);
}

void dense_sgd_loop(benchmark::State& state) {
    auto& c = DenseCase<pss::SGD>::get(static_cast<std::size_t>(state.range(0)));
    const auto lr = static_cast<float>(c.optimizer.learning_rate()(0));
    for (auto _ : state) {
        sgd_loop(c.value.data(), c.grad.data(), c.value.size(), lr);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * state.range(0) * 12);
}

void dense_adam_pss(benchmark::State& state) {
    auto& c = DenseCase<pss::Adam>::get(static_cast<std::size_t>(state.range(0)));
    for (auto _ : state) {
        c.optimizer.apply_dense(c.value, c.slots, c.grad);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * state.range(0) * 28);
}

void dense_adam_loop(benchmark::State& state) {
    auto& c = DenseCase<pss::Adam>::get(static_cast<std::size_t>(state.range(0)));
    for (auto _ : state) {
        adam_loop(c.value.data(), c.slots.m.data(), c.slots.v.data(), c.grad.data(), c.value.size(),
                  adam_alpha(++c.loop_steps), 0.1f, 0.001f, 1e-7f);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * state.range(0) * 28);
}

// ---- sparse: 4096 random rows of a 1M x 64 float32 shard -------------------------------------------

void sparse_sgd_pss(benchmark::State& state) {
    auto& c = SparseCase<pss::SGD>::get();
    for (auto _ : state) {
        c.optimizer.apply_sparse(c.value, c.slots, std::span<const std::int64_t>(c.ids), c.grad_rows);
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(c.ids.size()));
}

void sparse_sgd_loop(benchmark::State& state) {
    auto& c = SparseCase<pss::SGD>::get();
    const auto lr = static_cast<float>(c.optimizer.learning_rate()(0));
    constexpr std::size_t width = SparseCase<pss::SGD>::width;
    for (auto _ : state) {
        for (std::size_t i = 0; i < c.ids.size(); ++i)
            sgd_loop(c.value.data() + static_cast<std::size_t>(c.ids[i]) * width, c.grad_rows.data() + i * width,
                     width, lr);
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(c.ids.size()));
}

void sparse_adam_pss(benchmark::State& state) {
    auto& c = SparseCase<pss::Adam>::get();
    for (auto _ : state) {
        c.optimizer.apply_sparse(c.value, c.slots, std::span<const std::int64_t>(c.ids), c.grad_rows);
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(c.ids.size()));
}

void sparse_adam_loop(benchmark::State& state) {
    auto& c = SparseCase<pss::Adam>::get();
    constexpr std::size_t width = SparseCase<pss::Adam>::width;
    for (auto _ : state) {
        const float alpha = adam_alpha(++c.loop_steps);
        for (std::size_t i = 0; i < c.ids.size(); ++i) {
            const std::size_t at = static_cast<std::size_t>(c.ids[i]) * width;
            adam_loop(c.value.data() + at, c.slots.m.data() + at, c.slots.v.data() + at,
                      c.grad_rows.data() + i * width, width, alpha, 0.1f, 0.001f, 1e-7f);
        }
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(c.ids.size()));
}

// Medians of 5 repetitions, pss and loop of a case one after the other, so a noisy neighbour on this
// shared machine hits both alike. About 30 s in all.
void configure(benchmark::internal::Benchmark* b) {
    b->Repetitions(5)->ReportAggregatesOnly(true)->MinTime(0.1)->UseRealTime()->Unit(benchmark::kMicrosecond);
}

constexpr auto one_m = static_cast<std::int64_t>(M);
constexpr auto sixteen_m = static_cast<std::int64_t>(16 * M);

BENCHMARK(dense_sgd_pss)->Arg(one_m)->Arg(sixteen_m)->Apply(configure);
BENCHMARK(dense_sgd_loop)->Arg(one_m)->Arg(sixteen_m)->Apply(configure);
BENCHMARK(dense_adam_pss)->Arg(one_m)->Arg(sixteen_m)->Apply(configure);
BENCHMARK(dense_adam_loop)->Arg(one_m)->Arg(sixteen_m)->Apply(configure);
BENCHMARK(sparse_sgd_pss)->Apply(configure);
BENCHMARK(sparse_sgd_loop)->Apply(configure);
BENCHMARK(sparse_adam_pss)->Apply(configure);
BENCHMARK(sparse_adam_loop)->Apply(configure);

}  // namespace

int main(int argc, char** argv) {
    const std::string m1 = "/" + std::to_string(one_m), m16 = "/" + std::to_string(sixteen_m);
    // Run names carry the settings of configure(): keep the two in step.
    return pss_bench::run(
        argc, argv,
        {
            {"dense SGD 1M float32", "dense_sgd_pss" + m1 + "/min_time:0.100/repeats:5/real_time",
             "dense_sgd_loop" + m1 + "/min_time:0.100/repeats:5/real_time", 0.9},
            {"dense SGD 16M float32", "dense_sgd_pss" + m16 + "/min_time:0.100/repeats:5/real_time",
             "dense_sgd_loop" + m16 + "/min_time:0.100/repeats:5/real_time", 0.9},
            {"dense Adam 1M float32", "dense_adam_pss" + m1 + "/min_time:0.100/repeats:5/real_time",
             "dense_adam_loop" + m1 + "/min_time:0.100/repeats:5/real_time", 0.95},
            {"dense Adam 16M float32", "dense_adam_pss" + m16 + "/min_time:0.100/repeats:5/real_time",
             "dense_adam_loop" + m16 + "/min_time:0.100/repeats:5/real_time", 0.95},
            {"sparse SGD 4096 rows of 1M x 64", "sparse_sgd_pss/min_time:0.100/repeats:5/real_time",
             "sparse_sgd_loop/min_time:0.100/repeats:5/real_time", 0.9, "items_per_second"},
            {"sparse Adam 4096 rows of 1M x 64", "sparse_adam_pss/min_time:0.100/repeats:5/real_time",
             "sparse_adam_loop/min_time:0.100/repeats:5/real_time", 0.9, "items_per_second"},
        });
}
