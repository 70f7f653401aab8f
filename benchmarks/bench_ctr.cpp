// End-to-end training of examples/embedding_ctr.cpp's model (a 1,000,000 x 32 float32 embedding in 4 shards
// on 2 ps, mean-pooled, Dense(16, relu), Dense(1, sigmoid), Adagrad(0.2), binary cross-entropy, batches of 256,
// synchronous) on the embedded cluster with 1 and 2 workers: training steps (batches) per second, and the
// share of step time spent in pull, compute and push (summed over workers, from detail::StepProfile).
// Baseline from the same run: a plain loop doing the same forward, backward and Adagrad math on the same
// batches, with every weight in local memory (no strategy, no requests). Printed as pss / plain.
// And the cost of checkpoints: the same fit with pss::BackupAndRestore saving every 100 steps (weights and
// Adagrad's accumulators: 256 MB a save, fsync'd, under PSS_BENCH_DIR or the system's temporary directory),
// printed beside the fit without saves. And the cost of Keras' extras: the same fit with metrics
// (accuracy and AUC, computed by the workers) and a validation split of 10% (evaluated by the workers at each
// epoch's end), in training steps per second beside the fit without them. And the cost of reading the data
// from files: the same fit on 2 workers from a DatasetCreator, each worker reading its own .npy file of the same
// 40,000 examples (a shuffle buffer, batches of 128 a worker, so 256 a step, repeat, prefetch(2)), beside the fit
// from memory.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <benchmark/benchmark.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xview.hpp>

#include <pss/keras.hpp>

#include "bench_support.hpp"
#include "ratio_report.hpp"

namespace {

constexpr std::size_t vocabulary = 1'000'000;
constexpr std::size_t fields = 4;
constexpr std::size_t dim = 32;     // embedding width
constexpr std::size_t hidden = 16;  // Dense(16, relu)
constexpr std::size_t batch = 256;
constexpr std::size_t examples = 40'000;  // as examples/embedding_ctr.cpp: 157 steps per epoch
// The warm-up is one whole untimed epoch: with a few batches only, a fit run later in the process found heap
// pages an earlier fit had touched (glibc keeps them after raising its mmap threshold) and measured 1.3x to
// 1.6x faster than the same fit run first, whichever it was.
constexpr std::size_t warmup_examples = examples;
constexpr double learning_rate = 0.2, initial_accumulator = 0.1, adagrad_epsilon = 1e-7;

struct Data {
    xt::xarray<float> ids;     // (examples, fields)
    xt::xarray<float> clicks;  // (examples, 1)
};

// The data generator of examples/embedding_ctr.cpp (same seed, same skew, same hidden effects).
double effect(std::uint64_t id) {
    id = (id ^ (id >> 31)) * 0x7fb5d329728ea185ULL;
    id = (id ^ (id >> 27)) * 0x81dadef4bc2dd44dULL;
    return static_cast<double>(id >> 40) / static_cast<double>(1ULL << 24) * 4.0 - 2.0;
}

const Data& data() {
    static const Data d = [] {
        std::mt19937_64 rng(2024);
        auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
        Data d{xt::xarray<float>::from_shape({examples, fields}), xt::xarray<float>::from_shape({examples, 1})};
        for (std::size_t i = 0; i < examples; ++i) {
            double logit = -0.5;
            for (std::size_t f = 0; f < fields; ++f) {
                const auto id =
                    static_cast<std::uint64_t>(static_cast<double>(vocabulary) * std::pow(uniform(), 4.0));
                d.ids(i, f) = static_cast<float>(id);
                logit += effect(id);
            }
            d.clicks(i, 0) = uniform() < 1.0 / (1.0 + std::exp(-logit)) ? 1.0f : 0.0f;
        }
        return d;
    }();
    return d;
}

constexpr std::size_t steps_per_epoch = (examples + batch - 1) / batch;

// ---------------------------------------------------------------------------------------------------
// The same examples in files: one .npy file a worker
// ---------------------------------------------------------------------------------------------------

constexpr int file_workers = 2;
constexpr std::size_t file_shuffle_buffer = 1024;

/// Where the files are: part-0.npy and part-1.npy, rows (ids..., click) as float32; worker w's holds the
/// w-th half of each step of the fit from memory (rows 256 k + 128 w ...). Written at the first call.
const std::string& file_directory() {
    static const std::string directory = [] {
        const std::string dir = pss_bench::scratch_directory("pss_bench_ctr_files");
        std::filesystem::create_directories(dir);
        const Data& d = data();
        std::vector<std::vector<float>> parts(file_workers);
        for (std::size_t i = 0; i < examples; ++i) {
            auto& part = parts[(i / (batch / file_workers)) % file_workers];
            for (std::size_t f = 0; f < fields; ++f) part.push_back(d.ids(i, f));
            part.push_back(d.clicks(i, 0));
        }
        for (int w = 0; w < file_workers; ++w) {
            const auto& part = parts[static_cast<std::size_t>(w)];
            xt::xarray<float> rows = xt::xarray<float>::from_shape({part.size() / (fields + 1), fields + 1});
            std::copy(part.begin(), part.end(), rows.begin());
            xt::dump_npy(dir + "/part-" + std::to_string(w) + ".npy", rows);
        }
        return dir;
    }();
    return directory;
}

/// Each worker's dataset: its own file, shuffled in a buffer, batches of 128, repeated, 2 batches made ahead.
pss::DatasetCreator file_datasets() {
    return pss::DatasetCreator([dir = file_directory()](const pss::InputContext& context) {
        return pss::data::Dataset::npy(pss::data::shard_files(pss::data::list_files(dir, ".npy"),
                                                              context.num_input_pipelines, context.input_pipeline_id))
            .shuffle(file_shuffle_buffer, 7)
            .batch(batch / file_workers)
            .repeat()
            .prefetch(2);
    });
}

// ---------------------------------------------------------------------------------------------------
// pss: Sequential::fit on the embedded cluster
// ---------------------------------------------------------------------------------------------------

constexpr std::size_t save_every_steps = 100;
constexpr int epochs = 5;  // benchmark iterations: one epoch each (the saving fit: one iteration of 5 epochs)

/// Sequential::fit of one epoch a benchmark iteration; with `SaveEvery` > 0, one fit of all `epochs` under
/// BackupAndRestore saving every `SaveEvery` steps (7 saves in 785 steps; the backup is removed at the end).
/// With `Metrics`: compiled with accuracy and AUC, fit with validation_split 0.1 (141 steps an epoch).
/// With `Files`: fit from file_datasets() (a fit is 157 steps, the datasets made anew by each).
template <int Workers, std::size_t SaveEvery = 0, bool Metrics = false, bool Files = false>
void pss_fit(benchmark::State& state) {
    static_assert(!Files || Workers == file_workers, "the files are written for file_workers workers");
    using Strategy = pss::ParameterServerStrategy<pss::InProcessTransport, pss::MinSizePartitioner, pss::Adagrad,
                                                  pss::LocalClusterResolver<2, Workers>, pss::Synchronous>;
    Strategy strategy({}, pss::MinSizePartitioner(256 << 10, 4), pss::Adagrad(learning_rate));
    pss::Sequential model(strategy,
                          {pss::Embedding(vocabulary, dim), pss::GlobalAveragePooling1D(), pss::Dense(hidden, "relu"),
                           pss::Dense(1, "sigmoid")},
                          /*seed=*/7);
    model.build({fields});
    if constexpr (Metrics)
        model.compile(pss::Adagrad(learning_rate), pss::BinaryCrossentropy(), {"accuracy", pss::metrics::AUC()});
    else
        model.compile(pss::Adagrad(learning_rate), pss::BinaryCrossentropy());
    const Data& d = data();
    const pss::FitOptions from_files{.epochs = 1, .verbose = 0, .steps_per_epoch = steps_per_epoch};
    std::optional<pss::DatasetCreator> datasets;
    if constexpr (Files) {  // the same warm-up, from the files
        datasets.emplace(file_datasets());
        (void)model.fit(*datasets, from_files);
    } else {  // warm-up (untimed): the workers' replicas, the pages of every buffer a step uses
        const xt::xarray<float> x = xt::view(d.ids, xt::range(0, warmup_examples), xt::all());
        const xt::xarray<float> y = xt::view(d.clicks, xt::range(0, warmup_examples), xt::all());
        (void)model.fit(x, y, 1, batch, /*shuffle=*/false, /*verbose=*/false);
    }

    auto& profile = pss::detail::StepProfile::instance();
    profile.reset();
    double seconds = 0, cpu_seconds = 0, loss = 0;
    std::size_t steps = 0;
    for (auto _ : state) {
        profile.set_enabled(true);
        const std::clock_t cpu_start = std::clock();
        const auto start = std::chrono::steady_clock::now();
        const auto history =
            Files            ? model.fit(*datasets, from_files)
            : Metrics        ? model.fit(d.ids, d.clicks, {.batch_size = batch, .epochs = 1, .verbose = 0,
                                                           .validation_split = 0.1, .shuffle = false})
            : SaveEvery == 0 ? model.fit(d.ids, d.clicks, 1, batch, /*shuffle=*/false, /*verbose=*/false)
                             : model.fit(d.ids, d.clicks, epochs, batch,
                                         pss::BackupAndRestore{pss_bench::scratch_directory("pss_bench_ctr_backup"), true, SaveEvery}, /*shuffle=*/false,
                                         /*verbose=*/false);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        cpu_seconds += static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
        profile.set_enabled(false);
        loss = history.loss.back();
        steps += (Metrics ? (examples * 9 / 10 + batch - 1) / batch : steps_per_epoch) * history.epoch.size();
    }
    const auto s = profile.snapshot();
    const double step_ns = static_cast<double>(std::max<std::uint64_t>(s.step_ns, 1));
    state.counters["steps_per_second"] = static_cast<double>(steps) / seconds;
    state.counters["pull_pct"] = 100.0 * static_cast<double>(s.pull_ns) / step_ns;
    state.counters["compute_pct"] = 100.0 * static_cast<double>(s.compute_ns()) / step_ns;
    state.counters["push_pct"] = 100.0 * static_cast<double>(s.push_ns) / step_ns;
    state.counters["worker_steps"] = static_cast<double>(s.step_count);
    state.counters["cores_busy"] = cpu_seconds / seconds;  // process CPU time / wall time: all threads
    state.counters["loss"] = loss;
}

// ---------------------------------------------------------------------------------------------------
// Baseline: the same math in a plain loop, every weight in local memory
// ---------------------------------------------------------------------------------------------------

/// Keras' Adagrad (TensorFlow's ApplyAdagradV2) on n values: acc += g^2; w -= lr g / (sqrt(acc) + eps).
template <class T>
void adagrad(T* w, T* acc, const double* g, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        const T gi = static_cast<T>(g[i]);
        acc[i] += gi * gi;
        w[i] -= static_cast<T>(learning_rate) * gi / (std::sqrt(acc[i]) + static_cast<T>(adagrad_epsilon));
    }
}

struct PlainModel {
    // float32 weights, as pss stores them; the math in double, as pss's layers do it.
    std::vector<float> table, table_acc, w1, w1_acc, b1, b1_acc, w2, w2_acc, b2, b2_acc;

    PlainModel()
        : table(vocabulary * dim), table_acc(vocabulary * dim, static_cast<float>(initial_accumulator)),
          w1(dim * hidden), w1_acc(dim * hidden, static_cast<float>(initial_accumulator)), b1(hidden, 0.0f),
          b1_acc(hidden, static_cast<float>(initial_accumulator)), w2(hidden), w2_acc(hidden, static_cast<float>(initial_accumulator)),
          b2(1, 0.0f), b2_acc(1, static_cast<float>(initial_accumulator)) {
        std::mt19937 rng(7);
        std::uniform_real_distribution<double> row(-0.05, 0.05);
        for (float& v : table) v = static_cast<float>(row(rng));
        std::uniform_real_distribution<double> k1(-std::sqrt(6.0 / (dim + hidden)), std::sqrt(6.0 / (dim + hidden)));
        for (float& v : w1) v = static_cast<float>(k1(rng));
        std::uniform_real_distribution<double> k2(-std::sqrt(6.0 / (hidden + 1)), std::sqrt(6.0 / (hidden + 1)));
        for (float& v : w2) v = static_cast<float>(k2(rng));
    }

    /// One step on examples [begin, begin + n): forward, binary cross-entropy, backward, Adagrad. Returns the loss.
    double step(const float* ids, const float* clicks, std::size_t n) {
        constexpr double eps = 1e-7;  // Keras' backend.epsilon()
        // Pull: each distinct id once, widened to double.
        unique_.clear();
        slot_.clear();
        slot_of_.resize(n * fields);
        for (std::size_t i = 0; i < n * fields; ++i) {
            const auto id = static_cast<std::int64_t>(ids[i]);
            auto [it, fresh] = slot_.emplace(id, unique_.size());
            if (fresh) unique_.push_back(id);
            slot_of_[i] = it->second;
        }
        rows_.resize(unique_.size() * dim);
        for (std::size_t u = 0; u < unique_.size(); ++u)
            std::copy_n(table.data() + static_cast<std::size_t>(unique_[u]) * dim, dim, rows_.data() + u * dim);
        // Forward: mean-pool, Dense(16, relu), Dense(1, sigmoid).
        h0_.assign(n * dim, 0.0);
        a1_.resize(n * hidden);
        p_.resize(n);
        for (std::size_t r = 0; r < n; ++r) {
            double* h = h0_.data() + r * dim;
            for (std::size_t f = 0; f < fields; ++f) {
                const double* e = rows_.data() + slot_of_[r * fields + f] * dim;
                for (std::size_t k = 0; k < dim; ++k) h[k] += e[k];
            }
            for (std::size_t k = 0; k < dim; ++k) h[k] /= static_cast<double>(fields);
            double* a = a1_.data() + r * hidden;
            for (std::size_t j = 0; j < hidden; ++j) a[j] = b1[j];
            for (std::size_t i = 0; i < dim; ++i)
                for (std::size_t j = 0; j < hidden; ++j) a[j] += h[i] * w1[i * hidden + j];
            double z = b2[0];
            for (std::size_t j = 0; j < hidden; ++j) {
                a[j] = std::max(a[j], 0.0);
                z += a[j] * w2[j];
            }
            p_[r] = 1.0 / (1.0 + std::exp(-z));
        }
        // Loss and backward.
        double loss = 0;
        g_w1_.assign(dim * hidden, 0.0);
        g_b1_.assign(hidden, 0.0);
        g_w2_.assign(hidden, 0.0);
        g_b2_.assign(1, 0.0);
        g_rows_.assign(unique_.size() * dim, 0.0);
        for (std::size_t r = 0; r < n; ++r) {
            const double y = clicks[r], p = p_[r];
            const double pc = std::clamp(p, eps, 1.0 - eps);
            loss -= y * std::log(pc + eps) + (1.0 - y) * std::log(1.0 - pc + eps);
            const double gp = (p < eps || p > 1.0 - eps)
                                  ? 0.0
                                  : -(1.0 / static_cast<double>(n)) * (y / (p + eps) - (1.0 - y) / (1.0 - p + eps));
            const double gz2 = gp * p * (1.0 - p);
            g_b2_[0] += gz2;
            const double* a = a1_.data() + r * hidden;
            double gz1[hidden];
            for (std::size_t j = 0; j < hidden; ++j) {
                g_w2_[j] += a[j] * gz2;
                gz1[j] = a[j] > 0 ? gz2 * w2[j] : 0.0;
                g_b1_[j] += gz1[j];
            }
            const double* h = h0_.data() + r * dim;
            double gh[dim];
            for (std::size_t i = 0; i < dim; ++i) {
                double sum = 0;
                for (std::size_t j = 0; j < hidden; ++j) {
                    g_w1_[i * hidden + j] += h[i] * gz1[j];
                    sum += gz1[j] * w1[i * hidden + j];
                }
                gh[i] = sum / static_cast<double>(fields);
            }
            for (std::size_t f = 0; f < fields; ++f) {
                double* g = g_rows_.data() + slot_of_[r * fields + f] * dim;
                for (std::size_t k = 0; k < dim; ++k) g[k] += gh[k];
            }
        }
        // Push: Adagrad on the touched rows (repeated ids summed) and on the dense weights.
        for (std::size_t u = 0; u < unique_.size(); ++u) {
            const std::size_t at = static_cast<std::size_t>(unique_[u]) * dim;
            adagrad(table.data() + at, table_acc.data() + at, g_rows_.data() + u * dim, dim);
        }
        adagrad(w1.data(), w1_acc.data(), g_w1_.data(), w1.size());
        adagrad(b1.data(), b1_acc.data(), g_b1_.data(), b1.size());
        adagrad(w2.data(), w2_acc.data(), g_w2_.data(), w2.size());
        adagrad(b2.data(), b2_acc.data(), g_b2_.data(), b2.size());
        return loss / static_cast<double>(n);
    }

    /// One epoch over [0, count) in batches, in order; returns the mean batch loss, as Sequential::fit does.
    double epoch(std::size_t count) {
        const Data& d = data();
        double sum = 0;
        std::size_t steps = 0;
        for (std::size_t begin = 0; begin < count; begin += batch, ++steps) {
            const std::size_t n = std::min(batch, count - begin);
            sum += step(d.ids.data() + begin * fields, d.clicks.data() + begin, n);
        }
        return sum / static_cast<double>(steps);
    }

private:
    std::vector<std::int64_t> unique_;
    std::unordered_map<std::int64_t, std::size_t> slot_;
    std::vector<std::size_t> slot_of_;
    std::vector<double> rows_, h0_, a1_, p_, g_w1_, g_b1_, g_w2_, g_b2_, g_rows_;
};

void plain_loop(benchmark::State& state) {
    PlainModel model;
    (void)model.epoch(warmup_examples);  // the same warm-up batches as pss_fit
    double seconds = 0, cpu_seconds = 0, loss = 0;
    std::size_t steps = 0;
    for (auto _ : state) {
        const std::clock_t cpu_start = std::clock();
        const auto start = std::chrono::steady_clock::now();
        loss = model.epoch(examples);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        cpu_seconds += static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
        steps += steps_per_epoch;
    }
    state.counters["steps_per_second"] = static_cast<double>(steps) / seconds;
    state.counters["loss"] = loss;
    state.counters["cores_busy"] = cpu_seconds / seconds;
}

}  // namespace

// Each iteration is one epoch (157 steps); the weights keep training from one iteration to the next.
BENCHMARK(plain_loop)->Iterations(epochs)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(pss_fit<2, 0, true>)
    ->Name("pss_fit_metrics/workers:2")
    ->Iterations(epochs)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(pss_fit<1>)->Name("pss_fit/workers:1")->Iterations(epochs)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(pss_fit<2>)->Name("pss_fit/workers:2")->Iterations(epochs)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(pss_fit<2, 0, false, true>)
    ->Name("pss_fit_files/workers:2")
    ->Iterations(epochs)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(pss_fit<2, save_every_steps>)
    ->Name("pss_fit_saving/workers:2")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    pss_bench::RecordingReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    const std::string suffix = "/iterations:" + std::to_string(epochs) + "/real_time";
    const std::string plain = "plain_loop" + suffix;
    const double baseline = reporter.value(plain, "steps_per_second");
    std::printf("\n%-34s %14s %14s %8s %8s\n", "figure", "pss", "baseline", "ratio", "limit");
    for (const char* workers : {"1", "2"}) {
        const std::string run = std::string("pss_fit/workers:") + workers + suffix;
        const double figure = reporter.value(run, "steps_per_second");
        if (figure == 0 || baseline == 0) continue;  // not selected by --benchmark_filter
        const std::string name = std::string("ctr training steps, ") + workers + " worker" + (workers[0] == '1' ? "" : "s");
        std::printf("%-34s %9.1f /s   %9.1f /s   %8.2f   (no limit set; the limit is the plain loop)\n", name.c_str(),
                    figure, baseline, figure / baseline);
        std::printf("%-34s pull %.1f%%  compute %.1f%%  push %.1f%%  (of step time summed over workers);"
                    " cores busy %.2f (plain %.2f)\n",
                    "", reporter.value(run, "pull_pct"), reporter.value(run, "compute_pct"),
                    reporter.value(run, "push_pct"), reporter.value(run, "cores_busy"),
                    reporter.value(plain, "cores_busy"));
    }
    const std::string saving = "pss_fit_saving/workers:2/iterations:1/real_time", unsaved = "pss_fit/workers:2" + suffix;
    const double with_saves = reporter.value(saving, "steps_per_second"), without = reporter.value(unsaved, "steps_per_second");
    if (with_saves > 0 && without > 0)
        std::printf("%-34s %9.1f /s   %9.1f /s   %8.2f   (no limit set; beside the same fit without saves)\n",
                    "ctr steps, 2 workers, save/100", with_saves, without, with_saves / without);
    const double with_metrics = reporter.value("pss_fit_metrics/workers:2" + suffix, "steps_per_second");
    if (with_metrics > 0 && without > 0)
        std::printf("%-34s %9.1f /s   %9.1f /s   %8.2f   >= 0.9 (beside the same fit without them)\n",
                    "ctr steps, 2 workers, metrics+val", with_metrics, without, with_metrics / without);
    const double with_files = reporter.value("pss_fit_files/workers:2" + suffix, "steps_per_second");
    if (with_files > 0 && without > 0)
        std::printf("%-34s %9.1f /s   %9.1f /s   %8.2f   >= 0.8 (beside the same fit from memory)\n",
                    "ctr steps, 2 workers, .npy files", with_files, without, with_files / without);
    std::error_code ignored;  // the files, if a benchmark wrote them
    std::filesystem::remove_all(pss_bench::scratch_directory("pss_bench_ctr_files"), ignored);
    benchmark::Shutdown();
    return 0;
}
