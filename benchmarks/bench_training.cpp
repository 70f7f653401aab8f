// Training-path figures, each beside its plain baseline from the same run:
// - coordinator overhead per scheduled closure, beside a bare task handed to a minimal thread pool
//   (limit: at most 2x the time, so at least 0.5x the closures per second);
// - embedding rows looked up per second (sparse_read of a 1M x 32 float32 table sharded over 4 ps),
//   beside a plain in-memory gather of the same rows;
// - sparse rows updated per second (apply_sparse_gradient with SGD), beside a plain scatter loop.
// The last two twice: with the same 4096 ids each call (their rows stay in the cache, so the figure is
// mostly pss's own cost per call), and with fresh ids each call, as training looks up a new batch each
// step (from a pool of 64 batches, so that the rows come from memory as in training).
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include <pss/pss.hpp>

#include "ratio_report.hpp"

namespace {

/// The least thread pool: one queue, a mutex, a condition variable, and a counter to wait on.
class ThreadPool {
public:
    explicit ThreadPool(int threads) {
        for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
    }
    ~ThreadPool() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        work_.notify_all();
        for (auto& t : threads_) t.join();
    }
    void submit(std::function<void()> task) {
        {
            std::lock_guard lock(mutex_);
            queue_.push_back(std::move(task));
            ++pending_;
        }
        work_.notify_one();
    }
    void wait() {
        std::unique_lock lock(mutex_);
        idle_.wait(lock, [&] { return pending_ == 0; });
    }

private:
    void run() {
        for (;;) {
            std::unique_lock lock(mutex_);
            work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;
            auto task = std::move(queue_.front());
            queue_.pop_front();
            lock.unlock();
            task();
            lock.lock();
            if (--pending_ == 0) idle_.notify_all();
        }
    }
    std::mutex mutex_;
    std::condition_variable work_, idle_;
    std::deque<std::function<void()>> queue_;
    std::size_t pending_ = 0;
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

constexpr int closures = 1000;

void bare_thread_pool(benchmark::State& state) {
    ThreadPool pool(2);
    std::atomic<int> sum{0};
    for (auto _ : state) {
        for (int i = 0; i < closures; ++i) pool.submit([&sum, i] { sum += i; });
        pool.wait();
    }
    state.counters["items_per_second"] = benchmark::Counter(static_cast<double>(state.iterations()) * closures,
                                                            benchmark::Counter::kIsRate);
}

void coordinator_schedule(benchmark::State& state) {
    pss::ParameterServerStrategy<> strategy;  // 2 workers, as the pool has 2 threads
    pss::ClusterCoordinator coordinator(strategy);
    std::atomic<int> sum{0};
    for (auto _ : state) {
        for (int i = 0; i < closures; ++i) coordinator.schedule([&sum, i] { sum += i; });
        coordinator.join();
    }
    state.counters["items_per_second"] = benchmark::Counter(static_cast<double>(state.iterations()) * closures,
                                                            benchmark::Counter::kIsRate);
}

constexpr std::size_t table_rows = 1 << 20;
constexpr std::size_t width = 32;
constexpr std::size_t batch_rows = 4096;

constexpr std::size_t fresh_batches = 64;  // 64 x 4096 ids: a lookup's rows are 32 MiB of the 128 MiB table

/// Batches of 4096 uniform random ids: one, the same each call; or `fresh_batches`, a new one each call.
/// The first batch is the same in both.
std::vector<std::vector<std::int64_t>> id_batches(bool fresh) {
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<std::int64_t> pick(0, static_cast<std::int64_t>(table_rows) - 1);
    std::vector<std::vector<std::int64_t>> batches(fresh ? fresh_batches : 1, std::vector<std::int64_t>(batch_rows));
    for (auto& ids : batches)
        for (auto& id : ids) id = pick(rng);
    return batches;
}

using Sharded = pss::ParameterServerStrategy<pss::InProcessTransport, pss::MinSizePartitioner, pss::SGD,
                                             pss::LocalClusterResolver<4, 2>>;

void plain_gather(benchmark::State& state, bool fresh) {
    std::vector<float> table(table_rows * width, 1.0f), out(batch_rows * width);
    const auto batches = id_batches(fresh);
    std::size_t call = 0;
    for (auto _ : state) {
        const auto& ids = batches[call++ % batches.size()];
        for (std::size_t i = 0; i < ids.size(); ++i)
            std::memcpy(out.data() + i * width, table.data() + static_cast<std::size_t>(ids[i]) * width,
                        width * sizeof(float));
        benchmark::DoNotOptimize(out.data());
    }
    state.counters["items_per_second"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch_rows,
                                                            benchmark::Counter::kIsRate);
}

void embedding_lookup(benchmark::State& state, bool fresh) {
    Sharded strategy({}, pss::MinSizePartitioner(256 << 10, 4));
    auto scope = strategy.scope();
    pss::Variable table(xt::xarray<float>(xt::ones<float>({table_rows, width})), "table");
    const auto batches = id_batches(fresh);
    std::size_t call = 0;
    for (auto _ : state) {
        const auto& ids = batches[call++ % batches.size()];
        auto rows = pss::embedding_lookup(table, ids);
        benchmark::DoNotOptimize(rows.bytes());
    }
    state.counters["items_per_second"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch_rows,
                                                            benchmark::Counter::kIsRate);
}

void plain_scatter(benchmark::State& state, bool fresh) {
    std::vector<float> table(table_rows * width, 1.0f), rows(batch_rows * width, 0.5f);
    const auto batches = id_batches(fresh);
    std::size_t call = 0;
    const float lr = 0.01f;
    for (auto _ : state) {
        const auto& ids = batches[call++ % batches.size()];
        for (std::size_t i = 0; i < ids.size(); ++i) {
            float* out = table.data() + static_cast<std::size_t>(ids[i]) * width;
            const float* in = rows.data() + i * width;
            for (std::size_t j = 0; j < width; ++j) out[j] -= lr * in[j];
        }
        benchmark::DoNotOptimize(table.data());
    }
    state.counters["items_per_second"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch_rows,
                                                            benchmark::Counter::kIsRate);
}

void sparse_update(benchmark::State& state, bool fresh) {
    Sharded strategy({}, pss::MinSizePartitioner(256 << 10, 4));
    auto scope = strategy.scope();
    pss::Variable table(xt::xarray<float>(xt::ones<float>({table_rows, width})), "table");
    const auto batches = id_batches(fresh);
    std::size_t call = 0;
    pss::Tensor rows(xt::xarray<float>(xt::ones<float>({batch_rows, width}) * 0.5f));
    for (auto _ : state) rows = table.apply_sparse_gradient(batches[call++ % batches.size()], std::move(rows));
    state.counters["items_per_second"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch_rows,
                                                            benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(bare_thread_pool)->UseRealTime();
BENCHMARK(coordinator_schedule)->UseRealTime();
BENCHMARK_CAPTURE(plain_gather, same_ids, false)->UseRealTime();
BENCHMARK_CAPTURE(embedding_lookup, same_ids, false)->UseRealTime();
BENCHMARK_CAPTURE(plain_scatter, same_ids, false)->UseRealTime();
BENCHMARK_CAPTURE(sparse_update, same_ids, false)->UseRealTime();
BENCHMARK_CAPTURE(plain_gather, fresh_ids, true)->UseRealTime();
BENCHMARK_CAPTURE(embedding_lookup, fresh_ids, true)->UseRealTime();
BENCHMARK_CAPTURE(plain_scatter, fresh_ids, true)->UseRealTime();
BENCHMARK_CAPTURE(sparse_update, fresh_ids, true)->UseRealTime();

int main(int argc, char** argv) {
    return pss_bench::run(argc, argv,
                          {
                              {"closures scheduled", "coordinator_schedule/real_time", "bare_thread_pool/real_time",
                               0.5, "items_per_second"},
                              {"embedding rows looked up", "embedding_lookup/same_ids/real_time",
                               "plain_gather/same_ids/real_time", 0, "items_per_second"},
                              {"sparse rows updated (SGD)", "sparse_update/same_ids/real_time",
                               "plain_scatter/same_ids/real_time", 0, "items_per_second"},
                              {"rows looked up, fresh ids each call", "embedding_lookup/fresh_ids/real_time",
                               "plain_gather/fresh_ids/real_time", 0, "items_per_second"},
                              {"rows updated (SGD), fresh ids each call", "sparse_update/fresh_ids/real_time",
                               "plain_scatter/fresh_ids/real_time", 0, "items_per_second"},
                          });
}
