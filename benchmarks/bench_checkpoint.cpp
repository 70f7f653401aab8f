// Checkpoint save and restore speed, beside plain POSIX write+fsync and read of the same bytes in the same run.
// The model: 8 float32 variables over 4 ps tasks (2 each), as the figure; each ps task writes and
// reads its own files, so the baselines use 4 threads, one per ps, over the same 8 files.
// The limits: save >= 0.8x plain write+fsync, restore >= 0.8x plain read.
//
// Size: PSS_BENCH_CHECKPOINT_MB (default 64, small for CI machines; the figure is 1024). Files go
// under PSS_BENCH_DIR (default: the system's temporary directory). Restore and the plain reads run on
// files the save just wrote, so both read from the page cache alike.
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <benchmark/benchmark.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include <pss/pss.hpp>

#include "bench_support.hpp"
#include "ratio_report.hpp"

namespace {

namespace fs = std::filesystem;

constexpr int num_variables = 8;
constexpr int num_ps = 4;

std::size_t model_bytes() {
    const char* mb = std::getenv("PSS_BENCH_CHECKPOINT_MB");
    return static_cast<std::size_t>(mb ? std::strtoul(mb, nullptr, 10) : 64) << 20;
}

std::string bench_dir() {
    static const std::string path = pss_bench::scratch_directory("pss_bench_checkpoint");
    fs::create_directories(path);
    return path;
}

using Strategy = pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                              pss::LocalClusterResolver<num_ps, 1>>;

/// The strategy and its 8 variables, made once.
struct Model {
    Strategy strategy;
    std::vector<pss::Variable> variables;
    Model() {
        auto scope = strategy.scope();
        const std::size_t floats = model_bytes() / sizeof(float) / num_variables;
        for (int i = 0; i < num_variables; ++i) {
            xt::xarray<float> value = xt::xarray<float>::from_shape({floats / 256, 256});
            for (std::size_t j = 0; j < value.size(); ++j) value.data()[j] = static_cast<float>((j * 31 + i) % 1000) * 0.001f;
            variables.emplace_back(std::move(value), "v" + std::to_string(i));
        }
    }
    static Model& get() {
        static Model model;
        return model;
    }
};

/// Runs f(i) for the 8 files on 4 threads, files i and i + 4 on thread i (as round-robin placement does).
template <class F>
void on_ps_threads(F f) {
    std::vector<std::thread> threads;
    for (int t = 0; t < num_ps; ++t)
        threads.emplace_back([&, t] {
            for (int i = t; i < num_variables; i += num_ps) f(i);
        });
    for (auto& th : threads) th.join();
}

void BM_Checkpoint_save(benchmark::State& state) {
    Model& model = Model::get();
    pss::Checkpoint checkpoint(model.strategy);
    int n = 0;
    for (auto _ : state) {
        const std::string path = bench_dir() + "/save-" + std::to_string(n++);
        checkpoint.write(path);
        state.PauseTiming();
        fs::remove_all(path);
        state.ResumeTiming();
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * model_bytes()));
}

void BM_plain_write_fsync(benchmark::State& state) {
    Model& model = Model::get();
    std::vector<xt::xarray<float>> values;
    for (const auto& v : model.variables) values.push_back(v.read<float>());
    int n = 0;
    for (auto _ : state) {
        const std::string dir = bench_dir() + "/plain-" + std::to_string(n++);
        fs::create_directories(dir);
        on_ps_threads([&](int i) {
            const std::string path = dir + "/" + std::to_string(i);
            const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            const auto* p = reinterpret_cast<const char*>(values[static_cast<std::size_t>(i)].data());
            std::size_t left = values[static_cast<std::size_t>(i)].size() * sizeof(float);
            while (left > 0) {
                const ::ssize_t w = ::write(fd, p, left);
                if (w <= 0) break;
                p += w;
                left -= static_cast<std::size_t>(w);
            }
            ::fsync(fd);
            ::close(fd);
        });
        state.PauseTiming();
        fs::remove_all(dir);
        state.ResumeTiming();
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * model_bytes()));
}

const std::string& saved_checkpoint() {
    static const std::string path = [] {
        const std::string p = bench_dir() + "/restore-source";
        fs::remove_all(p);
        pss::Checkpoint(Model::get().strategy).write(p);
        return p;
    }();
    return path;
}

void BM_Checkpoint_restore(benchmark::State& state) {
    Model& model = Model::get();
    pss::Checkpoint checkpoint(model.strategy);
    const std::string& path = saved_checkpoint();
    for (auto _ : state) checkpoint.restore(path);
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * model_bytes()));
}

/// Reads the same 8 data files (the checkpoint's .npy files) with plain read(2), into buffers allocated
/// for each read (`fresh`, as a restore must: the staged copy is new memory) or reused.
void plain_read(benchmark::State& state, bool fresh) {
    const std::string& path = saved_checkpoint();
    std::vector<std::string> files;
    for (int i = 0; i < num_variables; ++i) files.push_back(path + "/v" + std::to_string(i) + ".npy");
    const std::size_t per_file = fs::file_size(files.front());
    std::vector<std::vector<char>> buffers(num_variables);
    for (auto _ : state) {
        on_ps_threads([&](int i) {
            auto& buffer = buffers[static_cast<std::size_t>(i)];
            if (fresh) buffer = std::vector<char>();
            if (buffer.size() != per_file) buffer = std::vector<char>(per_file);  // zeroed: its pages faulted in
            const int fd = ::open(files[static_cast<std::size_t>(i)].c_str(), O_RDONLY);
            std::size_t at = 0;
            while (at < per_file) {
                const ::ssize_t r = ::read(fd, buffer.data() + at, per_file - at);
                if (r <= 0) break;
                at += static_cast<std::size_t>(r);
            }
            ::close(fd);
            benchmark::DoNotOptimize(buffer.data());
        });
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * model_bytes()));
}
void BM_plain_read_fresh_buffers(benchmark::State& state) { plain_read(state, true); }
void BM_plain_read_reused_buffers(benchmark::State& state) { plain_read(state, false); }

BENCHMARK(BM_Checkpoint_save)->Unit(benchmark::kMillisecond)->UseRealTime()->Repetitions(3)->ReportAggregatesOnly(true);
BENCHMARK(BM_plain_write_fsync)->Unit(benchmark::kMillisecond)->UseRealTime()->Repetitions(3)->ReportAggregatesOnly(true);
BENCHMARK(BM_Checkpoint_restore)->Unit(benchmark::kMillisecond)->UseRealTime()->Repetitions(3)->ReportAggregatesOnly(true);
BENCHMARK(BM_plain_read_fresh_buffers)->Unit(benchmark::kMillisecond)->UseRealTime()->Repetitions(3)->ReportAggregatesOnly(true);
BENCHMARK(BM_plain_read_reused_buffers)->Unit(benchmark::kMillisecond)->UseRealTime()->Repetitions(3)->ReportAggregatesOnly(true);

}  // namespace

/// The memory one save needs beyond the variables: the peak RSS during a save less the RSS before it
/// (the peak is reset first by /proc/self/clear_refs). All 4 ps tasks are in this process, so this is
/// the sum of their needs; the limit is one shard's buffer.
void report_save_memory() {
    Model& model = Model::get();
    pss::Checkpoint checkpoint(model.strategy);
    const std::string path = bench_dir() + "/memory";
    checkpoint.write(path);  // warm: the first save allocates the checkpoint's own small state
    fs::remove_all(path);
    std::ofstream("/proc/self/clear_refs") << "5";
    const long before = pss_bench::status_kib("VmRSS");
    checkpoint.write(path);
    const long peak = pss_bench::status_kib("VmHWM");
    fs::remove_all(path);
    const double shard_mib = static_cast<double>(model_bytes()) / num_variables / (1 << 20);
    std::printf("memory beyond the variables during a save (4 ps tasks together): %ld KiB (RSS %ld KiB before, peak "
                "%ld KiB); one shard is %.1f MiB\n",
                peak > before ? peak - before : 0, before, peak, shard_mib);
}

int main(int argc, char** argv) {
    std::printf("checkpoint of %zu MiB in %d float32 variables over %d ps tasks, files under %s\n", model_bytes() >> 20,
                num_variables, num_ps, bench_dir().c_str());
    report_save_memory();
    const int status = pss_bench::run(argc, argv,
                                      {{"save vs write+fsync", "BM_Checkpoint_save/repeats:3/real_time",
                                        "BM_plain_write_fsync/repeats:3/real_time", 0.8},
                                       {"restore vs read (fresh buffers)", "BM_Checkpoint_restore/repeats:3/real_time",
                                        "BM_plain_read_fresh_buffers/repeats:3/real_time", 0.8},
                                       {"restore vs read (reused buffers)", "BM_Checkpoint_restore/repeats:3/real_time",
                                        "BM_plain_read_reused_buffers/repeats:3/real_time", 0}});
    fs::remove_all(bench_dir());
    return status;
}
