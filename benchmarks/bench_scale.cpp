// Scale (issue 12, item 6): an embedding table of 1M, 10M and 50M rows x 32 float32 over 4 ps processes
// (one shard each), trained by 2 worker processes; each size is a cluster of its own on loopback. This
// process starts a chief per size (a copy of this binary), which starts the 4 ps and the workers (copies
// too, each with its TF_CONFIG) and creates the table from an initializer (pss::InitializerSpec), so each
// ps draws its shard and the chief never holds it. A step is one worker's: a lookup (sparse_read) of 4096
// ids drawn uniformly over the table's rows (std::mt19937_64, a seed per closure) and a push of their
// gradient (apply_sparse_gradient; the gradient is the looked-up rows themselves, that of 0.5 * |row|^2)
// with SGD (no slots), or with --adagrad Adagrad (one slot as large as the shard, made at the first
// push). Closures of 25 steps, one per worker at a time; the figure is all workers' steps per second
// over --seconds (default 8), after one untimed closure per worker.
// Reported for each size: the steps per second; each task's RSS at start (the cluster up and every
// worker answering, before the table), its peak RSS (VmHWM, after the steps) and its CPU time per step
// (/proc/<pid>/stat, over the timed steps: where the time goes); a ps's growth against its shard of the
// table and its slots.
// Against what (the goals): the steps per second at each size against the first size's (>= 0.8;
// the first size runs again after the others and the mean of its two runs is the baseline, as the
// machine is shared), and the same goal as all tasks' CPU time a step (<= 1.25x the first size's); each ps's peak RSS against its shard + slots + its RSS at start (at most 1.05 x
// (shard + slots) + start + 8 MiB); the chief's and each worker's peak RSS at the last size against the
// first (flat: at most 10 MiB more).
// Usage: bench_scale [ROWS,ROWS,...: default 1M,10M,50M; K and M are 10^3 and 10^6] [--workers N: 2]
// [--seconds S: 8] [--adagrad] (tools/bench.sh bench_scale; Google Benchmark's --benchmark_* arguments are
// ignored). Plaintext links (PSS_TLS=off): the figures are memory and steps, not TLS. With --adagrad,
// PSS_HEARTBEAT_TIMEOUT is 120 s unless set: a ps building a 1.6 GB accumulator on its first push
// answers no heartbeat meanwhile (a shard's drawing does not block them). 50M rows take 6.4 GB of memory (12.8 GB with --adagrad); a run takes about a minute here.
#include <sys/types.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pss/pss.hpp>

#include "bench_support.hpp"
#include "ratio_report.hpp"

namespace {

constexpr int num_ps = 4;
constexpr std::size_t columns = 32;
constexpr std::size_t batch = 4096;
constexpr std::int64_t steps_per_closure = 25;
constexpr double mib = 1 << 20;
using Clock = std::chrono::steady_clock;

/// A worker's part: `steps` steps of `batch` ids drawn uniformly over the table's rows from `seed`:
/// the rows looked up, and pushed back as their own gradient. Returns the steps done.
std::int64_t train_steps(pss::Variable table, std::int64_t steps, std::int64_t seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
    std::uniform_int_distribution<std::int64_t> pick(0, static_cast<std::int64_t>(table.shape()[0]) - 1);
    std::vector<std::int64_t> ids(batch);
    for (std::int64_t s = 0; s < steps; ++s) {
        for (auto& id : ids) id = pick(rng);
        (void)table.apply_sparse_gradient(ids, table.sparse_read(ids));
    }
    return steps;
}
const auto train_function = pss::register_function("bench_scale.train_steps", &train_steps);

/// Nothing: a worker that answers it has started and serves.
std::int64_t ready() { return 0; }
const auto ready_function = pss::register_function("bench_scale.ready", &ready);

/// Every task's optimizer (the chief's handshake refuses another configuration).
template <class OptimizerPolicy>
OptimizerPolicy make_optimizer() {
    return OptimizerPolicy(0.01);
}

/// Slot bytes a ps holds per byte of its shard: SGD none, Adagrad its accumulator.
double slots_per_shard_byte(const std::string& optimizer) { return optimizer == "adagrad" ? 1.0 : 0.0; }

struct Options {
    std::vector<std::size_t> sizes{1'000'000, 10'000'000, 50'000'000};
    int workers = 2;
    double seconds = 8;
    std::string optimizer = "sgd";
};

/// "1M" is 1000000, "50K" 50000; 0 for what is not a count of rows.
std::size_t parse_rows(const std::string& text) {
    char* end = nullptr;
    const double n = std::strtod(text.c_str(), &end);
    const std::string unit = end;
    const double scale = unit.empty() ? 1 : unit == "K" || unit == "k" ? 1e3 : unit == "M" || unit == "m" ? 1e6 : 0;
    return n > 0 ? static_cast<std::size_t>(n * scale) : 0;
}

/// "1000000" as "1M", 50000 as "50K"; else the number.
std::string rows_name(std::size_t rows) {
    if (rows % 1'000'000 == 0) return std::to_string(rows / 1'000'000) + "M";
    if (rows % 1'000 == 0) return std::to_string(rows / 1'000) + "K";
    return std::to_string(rows);
}

[[noreturn]] void usage(const std::string& problem) {
    std::fprintf(stderr,
                 "bench_scale: %s\nusage: bench_scale [ROWS,ROWS,... (default 1M,10M,50M)] [--workers N (default 2)] "
                 "[--seconds S (default 8)] [--adagrad]\n",
                 problem.c_str());
    std::exit(2);
}

Options parse_options(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&] {
            if (i + 1 >= argc) usage(arg + " needs a value");
            return std::string(argv[++i]);
        };
        if (arg.rfind("--benchmark", 0) == 0) continue;  // tools/bench.sh's PSS_BENCH_ARGS, for Google Benchmark
        if (arg == "--workers") o.workers = std::atoi(value().c_str());
        else if (arg == "--seconds") o.seconds = std::atof(value().c_str());
        else if (arg == "--adagrad") o.optimizer = "adagrad";
        else if (arg.rfind("--", 0) == 0) usage("unknown option " + arg);
        else {
            o.sizes.clear();
            for (std::size_t at = 0; at <= arg.size();) {
                const auto comma = std::min(arg.find(',', at), arg.size());
                const std::string item = arg.substr(at, comma - at);
                const std::size_t rows = parse_rows(item);
                if (rows == 0) usage("\"" + item + "\" is not a number of rows (1M, 500K, 20000)");
                o.sizes.push_back(rows);
                at = comma + 1;
            }
        }
    }
    if (o.workers < 1) usage("--workers must be at least 1");
    if (o.seconds <= 0) usage("--seconds must be more than 0");
    return o;
}

/// What a chief measured, by name ("steps_per_second", "ps0_start", "ps0_peak", ... in MiB).
using Figures = std::map<std::string, double>;

/// One size's cluster, run by this process as its chief; writes its figures to `result_path`.
template <class OptimizerPolicy>
void run_chief(const char* self, const Options& o, std::size_t rows, const std::string& result_path) {
    pss_bench::LocalTasks tasks(self, num_ps, o.workers, {o.optimizer});
    using Strategy = pss::ParameterServerStrategy<pss::TcpTransport, pss::FixedShardsPartitioner, OptimizerPolicy,
                                                  pss::SimpleClusterResolver>;
    Strategy strategy(pss::SimpleClusterResolver(tasks.spec, "chief", 0), pss::FixedShardsPartitioner(num_ps),
                      make_optimizer<OptimizerPolicy>());
    pss::ClusterCoordinator coordinator(strategy);
    Figures f;
    // Each task's name and pid (0: this process).
    std::vector<std::pair<std::string, pid_t>> all{{"chief", 0}};
    for (std::size_t i = 0; i < tasks.ps.size(); ++i) all.emplace_back("ps" + std::to_string(i), tasks.ps[i]);
    for (std::size_t i = 0; i < tasks.workers.size(); ++i)
        all.emplace_back("worker" + std::to_string(i), tasks.workers[i]);
    auto sample = [&](const char* field, const char* suffix) {
        for (const auto& [name, pid] : all) f[name + suffix] = pss_bench::status_mib(pid, field);
    };
    auto sample_cpu = [&](const char* suffix) {
        for (const auto& [name, pid] : all) f[name + suffix] = pss_bench::cpu_seconds(pid);
    };
    std::vector<pss::RemoteValue<std::int64_t>> serving;
    for (int w = 0; w < o.workers; ++w) serving.push_back(coordinator.schedule_on(w, ready_function));
    (void)pss::fetch(serving);
    sample("VmRSS", "_start");

    {
        auto scope = strategy.scope();
        const auto created = Clock::now();
        pss::Variable table(pss::Shape{rows, columns}, pss::DType::float32,
                            pss::InitializerSpec::random_uniform(-0.05, 0.05, 42), "table");
        f["create_seconds"] = std::chrono::duration<double>(Clock::now() - created).count();

        std::int64_t seed = 0;
        auto round = [&] {  // one closure per worker; the steps they did
            std::vector<pss::RemoteValue<std::int64_t>> done;
            for (int w = 0; w < o.workers; ++w)
                done.push_back(coordinator.schedule_on(w, train_function, table, steps_per_closure, ++seed));
            std::int64_t steps = 0;
            for (std::int64_t s : pss::fetch(done)) steps += s;
            return steps;
        };
        (void)round();  // untimed: connections up, buffers allocated
        sample_cpu("_cpu_before");
        const auto begin = Clock::now();
        std::int64_t steps = 0;
        double seconds = 0;
        while (seconds < o.seconds) {
            steps += round();
            seconds = std::chrono::duration<double>(Clock::now() - begin).count();
        }
        f["steps_per_second"] = static_cast<double>(steps) / seconds;
        f["steps"] = static_cast<double>(steps);
        sample_cpu("_cpu_after");
        sample("VmHWM", "_peak");
    }
    strategy.join();

    std::ofstream out(result_path);
    for (const auto& [name, value] : f) out << name << " " << value << "\n";
}

/// Runs one size's chief (a process of its own, in a process group of its own so that its tasks can be
/// ended with it should it hang or fail); its figures, empty when it failed.
Figures run_size(const char* self, const Options& o, std::size_t rows) {
    const std::string path = pss_bench::scratch_directory("bench_scale") + "_" + std::to_string(rows);
    std::filesystem::remove(path);
    const pid_t chief = pss_bench::spawn_self(self,
                                              {"chief", std::to_string(rows), std::to_string(o.workers),
                                               std::to_string(o.seconds), o.optimizer, path},
                                              "", true);
    // Until it exits or has run 10 minutes, its pid held (WNOWAIT: not reaped), so that the group it
    // leads is still its own when its tasks left in it, should it have failed before ending them, are
    // ended; then it is reaped.
    const auto deadline = Clock::now() + std::chrono::minutes(10);
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(chief), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0) {
        if (Clock::now() >= deadline) {
            std::fprintf(stderr, "bench_scale: the chief of %zu rows ran 10 minutes: ending its process group\n", rows);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(-chief, SIGKILL);  // the chief when it hangs, and tasks it left (none when it ended them)
    int status = 0;
    ::waitpid(chief, &status, 0);
    Figures f;
    std::ifstream in(path);
    std::string name;
    for (double value = 0; in >> name >> value;) f[name] = value;
    std::filesystem::remove(path);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || f.empty())
        std::fprintf(stderr, "bench_scale: the chief of %zu rows failed (status %d)\n", rows, status);
    return f;
}

/// The figures of every size, then the ratio table against the limits.
/// CPU milliseconds all tasks of a size's cluster spent per timed step.
double cpu_ms_per_step(const Figures& f) {
    double seconds = 0;
    for (const auto& [name, value] : f)
        if (name.ends_with("_cpu_after")) seconds += value - f.at(name.substr(0, name.size() - 6) + "_before");
    return seconds / f.at("steps") * 1e3;
}

/// `again`: the first size run once more after the others (empty when it was not, or failed).
void report(const Options& o, const std::vector<std::size_t>& sizes, const std::vector<Figures>& figures,
            const Figures& again) {
    const double slots = slots_per_shard_byte(o.optimizer);
    std::vector<std::string> tasks{"chief"};
    for (int i = 0; i < num_ps; ++i) tasks.push_back("ps" + std::to_string(i));
    for (int i = 0; i < o.workers; ++i) tasks.push_back("worker" + std::to_string(i));
    auto shard_mib = [&](std::size_t rows) {  // FixedShardsPartitioner(4): shards differ by one row at most
        return static_cast<double>(rows) / num_ps * columns * sizeof(float) / mib;
    };
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        auto f = figures[k];
        const double shard = shard_mib(sizes[k]);
        std::printf("\n%s rows x %zu float32 (%.0f MiB) over %d ps, %s, %d workers: created in %.1f s, %.0f steps/s "
                    "(%zu ids a step), %.2f ms of CPU a step\n",
                    rows_name(sizes[k]).c_str(), columns, shard * num_ps, num_ps, o.optimizer.c_str(), o.workers,
                    f["create_seconds"], f["steps_per_second"], batch, cpu_ms_per_step(f));
        std::printf("  %-9s %12s %12s %12s %12s %22s\n", "task", "start MiB", "peak MiB", "growth MiB",
                    "CPU ms/step", "growth/(shard+slots)");
        for (const auto& t : tasks) {
            const double start = f[t + "_start"], peak = f[t + "_peak"];
            const double cpu_ms = (f[t + "_cpu_after"] - f[t + "_cpu_before"]) / f["steps"] * 1e3;
            std::printf("  %-9s %12.1f %12.1f %12.1f %12.3f", t.c_str(), start, peak, peak - start, cpu_ms);
            if (t.rfind("ps", 0) == 0) std::printf(" %22.3f", (peak - start) / (shard * (1 + slots)));
            std::printf("\n");
        }
    }
    const auto& first = figures.front();
    double baseline_steps = first.at("steps_per_second"), baseline_cpu = cpu_ms_per_step(first);
    if (!again.empty()) {
        std::printf("\n%s rows again, last: %.0f steps/s, %.2f ms of CPU a step (the baselines below are the "
                    "means of its two runs)\n",
                    rows_name(sizes.front()).c_str(), again.at("steps_per_second"), cpu_ms_per_step(again));
        baseline_steps = (baseline_steps + again.at("steps_per_second")) / 2;
        baseline_cpu = (baseline_cpu + cpu_ms_per_step(again)) / 2;
    }
    pss_bench::print_measured_heading();
    for (std::size_t k = 1; k < sizes.size(); ++k)
        pss_bench::print_measured_ratio("steps/s " + rows_name(sizes[k]) + " vs " + rows_name(sizes.front()),
                                        figures[k].at("steps_per_second"), baseline_steps, "st/s", 0.8);
    // The same goal in CPU time, which the neighbours of a shared machine move less: 0.8x the steps per
    // second is 1.25x the time a step.
    for (std::size_t k = 1; k < sizes.size(); ++k)
        pss_bench::print_measured_ratio("CPU ms/step " + rows_name(sizes[k]) + " vs " + rows_name(sizes.front()),
                                        cpu_ms_per_step(figures[k]), baseline_cpu, "ms  ", 1.25, true);
    constexpr double slack_mib = 8;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        const double held = shard_mib(sizes[k]) * (1 + slots);
        for (int i = 0; i < num_ps; ++i) {
            const std::string t = "ps" + std::to_string(i);
            const double start = figures[k].at(t + "_start");
            const double base = held + start;
            pss_bench::print_measured_ratio(t + " peak " + rows_name(sizes[k]) + " vs shard+slots+start",
                                   figures[k].at(t + "_peak"), base, "MiB ", (1.05 * held + start + slack_mib) / base,
                                   true);
        }
    }
    constexpr double flat_mib = 10;
    if (sizes.size() > 1)
        for (const auto& t : tasks) {
            if (t.rfind("ps", 0) == 0) continue;
            const double base = first.at(t + "_peak");
            pss_bench::print_measured_ratio(t + " peak " + rows_name(sizes.back()) + " vs " + rows_name(sizes.front()),
                                   figures.back().at(t + "_peak"), base, "MiB ", (base + flat_mib) / base, true);
        }
    std::printf("(a ps's limit: 1.05 x (shard + slots) + its RSS at start + %.0f MiB", slack_mib);
    if (sizes.size() > 1)
        std::printf("; the chief's and a worker's: at most %.0f MiB more at %s rows than at %s", flat_mib,
                    rows_name(sizes.back()).c_str(), rows_name(sizes.front()).c_str());
    std::printf(")\n");
}

}  // namespace

int main(int argc, char** argv) {
    ::setenv("PSS_TLS", "off", 1);
    if (std::getenv("TF_CONFIG") != nullptr) {  // a ps or worker task of a chief's cluster: argv[1] its optimizer
        if (argc > 1 && std::string(argv[1]) == "adagrad") {
            pss::ClusterStrategy<pss::NoPartitioner, pss::Adagrad> strategy({}, {}, make_optimizer<pss::Adagrad>());
            strategy.join();
        } else {
            pss::ClusterStrategy<> strategy({}, {}, make_optimizer<pss::SGD>());
            strategy.join();
        }
        return 0;
    }
    if (argc == 7 && std::string(argv[1]) == "chief") {  // chief ROWS WORKERS SECONDS OPTIMIZER RESULT_FILE
        Options o;
        o.workers = std::atoi(argv[3]);
        o.seconds = std::atof(argv[4]);
        o.optimizer = argv[5];
        const auto rows = static_cast<std::size_t>(std::strtoull(argv[2], nullptr, 10));
        if (o.optimizer == "adagrad") run_chief<pss::Adagrad>(argv[0], o, rows, argv[6]);
        else run_chief<pss::SGD>(argv[0], o, rows, argv[6]);
        return 0;
    }
    const Options o = parse_options(argc, argv);
    // A ps draws its shard on a thread of its own, answering heartbeats meanwhile; but Adagrad's first
    // push builds the accumulator on the strand that answers them: 1.6 GB at 50M rows, beyond the
    // default 10 s with 4 ps on this 2-core machine. Every task started from here inherits this, unless
    // the caller chose.
    if (o.optimizer == "adagrad") ::setenv("PSS_HEARTBEAT_TIMEOUT", "120", 0);
    std::vector<std::size_t> sizes;
    std::vector<Figures> figures;
    for (std::size_t rows : o.sizes) {
        auto f = run_size(argv[0], o, rows);
        if (f.empty()) continue;
        sizes.push_back(rows);
        figures.push_back(std::move(f));
    }
    if (figures.empty()) return 1;
    // The machine is shared: the first size again, last, brackets the others in time.
    const Figures again = sizes.size() > 1 ? run_size(argv[0], o, sizes.front()) : Figures{};
    report(o, sizes, figures, again);
    return 0;
}
