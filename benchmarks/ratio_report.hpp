// ratio_report.hpp: runs the registered Google Benchmarks and prints each figure beside its baseline
// from the same run, as a ratio against the limit (these machines are shared and noisy, so
// only a ratio measured in one run means anything).
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

namespace pss_bench {

/// One line of the closing table: `name` measured by benchmark `figure`, against benchmark `baseline`.
struct Ratio {
    std::string name;
    std::string figure;
    std::string baseline;
    double limit;  ///< the least acceptable figure / baseline; 0 when the issue sets none
    const char* counter = "bytes_per_second";
    /// A baseline not measured in this run (another system's published figure), in `counter`'s unit
    /// (bytes or items per second); when nonzero, `baseline` is not read and the value is marked `*`.
    double fixed_baseline = 0;
    /// The baseline's counter when it is not `counter` (a benchmark that times a figure and its
    /// baseline in one loop reports both as counters of one run); null: `counter`.
    const char* baseline_counter = nullptr;
};

/// Keeps every run's counters while the console reporter prints as usual.
class RecordingReporter : public benchmark::ConsoleReporter {
public:
    void ReportRuns(const std::vector<Run>& runs) override {
        for (const auto& run : runs) {
            if (run.run_type != Run::RT_Iteration && run.aggregate_name != "median") continue;
            auto& slot = counters_[run.run_name.str()];
            for (const auto& [name, counter] : run.counters) slot[name] = counter.value;
        }
        ConsoleReporter::ReportRuns(runs);
    }
    [[nodiscard]] double value(const std::string& run, const std::string& counter) const {
        auto it = counters_.find(run);
        if (it == counters_.end()) return 0;
        auto c = it->second.find(counter);
        return c == it->second.end() ? 0 : c->second;
    }

private:
    std::map<std::string, std::map<std::string, double>> counters_;
};

/// For figures measured outside Google Benchmark (whole processes, their memory): the table's heading.
inline void print_measured_heading() {
    std::printf("\n%-38s %16s %16s %7s %10s\n", "figure", "pss", "baseline", "ratio", "limit");
}

/// A line of that table: `figure` beside `baseline`, both in `unit` (4 characters), and whether their
/// ratio meets `limit`: at least it or, with `at_most`, at most it.
inline void print_measured_ratio(const std::string& name, double figure, double baseline, const char* unit,
                                 double limit, bool at_most = false) {
    const double ratio = figure / baseline;
    const bool met = at_most ? ratio <= limit : ratio >= limit;
    std::printf("%-38s %11.2f %s %11.2f %s %7.3f %s%.3f %s\n", name.c_str(), figure, unit, baseline, unit, ratio,
                at_most ? "<=" : ">=", limit, met ? "ok" : "MISS");
}

/// Runs the benchmarks selected by the command line and prints the ratio table. Returns 0 (figures
/// that miss their limit are printed as MISS: a benchmark reports, it does not fail the build).
/// `footnote`, when given, is printed under the table (what the `*` of a fixed baseline means).
inline int run(int argc, char** argv, const std::vector<Ratio>& ratios, const char* footnote = nullptr) {
    benchmark::Initialize(&argc, argv);
    RecordingReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    std::printf("\n%-38s %14s %14s %8s %8s\n", "figure", "pss", "baseline", "ratio", "limit");
    for (const auto& r : ratios) {
        const double figure = reporter.value(r.figure, r.counter);
        const bool fixed = r.fixed_baseline > 0;
        const double baseline = fixed ? r.fixed_baseline
                                       : reporter.value(r.baseline, r.baseline_counter ? r.baseline_counter : r.counter);
        if (figure == 0 || baseline == 0) continue;  // not selected by --benchmark_filter
        const double ratio = figure / baseline;
        const bool bytes = std::string(r.counter).find("bytes_per_second") != std::string::npos;
        // Rates below 100 k/s in thousands, so that they keep their digits.
        const bool thousands = !bytes && figure < 1e5 && baseline < 1e5;
        const double scale = bytes ? 1e9 : thousands ? 1e3 : 1e6;
        const char* unit = bytes ? "GB/s" : thousands ? " k/s" : " M/s";
        std::printf("%-38s %11.3f %s %11.3f %s%c %7.2f ", r.name.c_str(), figure / scale, unit, baseline / scale, unit,
                    fixed ? '*' : ' ', ratio);
        if (r.limit > 0)
            std::printf("  >=%.2f %s\n", r.limit, ratio >= r.limit ? "ok" : "MISS");
        else
            std::printf("  (no limit set)\n");
    }
    if (footnote != nullptr) std::printf("%s\n", footnote);
    benchmark::Shutdown();
    return 0;
}

}  // namespace pss_bench
