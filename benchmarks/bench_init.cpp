// Peak resident memory of the chief and of each ps while a 4 GiB float32 embedding table (32 Mi rows x 32)
// is created over 4 ps processes started here (copies of this binary with their TF_CONFIG; one worker too,
// as a cluster needs one), this process being the chief. Each ps draws its 1 GiB shard from the
// initializer (pss::InitializerSpec), so the chief never holds the table. The limits: the chief's
// peak RSS under 100 MB; a ps's, its shard + 5% + what it held before. Two rows read back are checked
// against the generator. Usage: bench_init [rows, default 33554432] [columns, default 32]
// (tools/bench.sh bench_init). Plaintext links (PSS_TLS=off): the figure is memory, not TLS.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>

#include <pss/pss.hpp>

#include "bench_support.hpp"

namespace {

constexpr int num_ps = 4;

}  // namespace

int main(int argc, char** argv) {
    ::setenv("PSS_TLS", "off", 1);
    if (std::getenv("TF_CONFIG") != nullptr) {  // a ps or the worker of the cluster started below
        pss::ClusterStrategy<> strategy;
        strategy.join();
        return 0;
    }
    const std::size_t rows = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{32} << 20;
    const std::size_t columns = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 32;

    pss_bench::LocalTasks tasks(argv[0], num_ps, 1);  // a cluster needs a worker
    using Strategy = pss::ParameterServerStrategy<pss::TcpTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                  pss::SimpleClusterResolver>;
    Strategy strategy(pss::SimpleClusterResolver(tasks.spec, "chief", 0), pss::FixedShardsPartitioner(num_ps));
    std::vector<double> ps_before;
    for (pid_t pid : tasks.ps) ps_before.push_back(pss_bench::status_mib(pid, "VmRSS"));
    const auto init = pss::InitializerSpec::random_uniform(-0.05, 0.05, 42);
    const pss::Shape shape{rows, columns};
    const auto begin = std::chrono::steady_clock::now();
    double seconds = 0;
    bool rows_match = false;
    {
        auto scope = strategy.scope();
        const pss::Variable table(shape, pss::DType::float32, init, "table");
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
        // The first and the last row, read back, are what the generator gives for them.
        const std::vector<std::int64_t> ids{0, static_cast<std::int64_t>(rows - 1)};
        const auto got = table.sparse_read(ids).get<float>();
        rows_match = true;
        for (std::size_t k = 0; k < ids.size(); ++k) {
            const auto ids_k = static_cast<std::size_t>(ids[k]);
            const auto want = pss::detail::initial_shard({init, pss::DType::float32, shape, ids_k, 1}).get<float>();
            for (std::size_t c = 0; c < columns; ++c) rows_match = rows_match && got(k, c) == want(0, c);
        }
    }
    std::vector<double> ps_peak;
    for (pid_t pid : tasks.ps) ps_peak.push_back(pss_bench::status_mib(pid, "VmHWM"));
    const double chief_peak = static_cast<double>(pss_bench::status_kib("VmHWM")) / 1024;
    strategy.join();

    const double table_mib = static_cast<double>(rows) * static_cast<double>(columns) * sizeof(float) / (1 << 20);
    const double shard_mib = table_mib / num_ps;
    const double chief_limit_mib = 100e6 / (1 << 20);
    std::printf("a %zu x %zu float32 table (%.0f MiB) drawn on %d ps processes, shards of %.0f MiB, in %.1f s; "
                "rows read back %s the generator's\n",
                rows, columns, table_mib, num_ps, shard_mib, seconds, rows_match ? "match" : "DO NOT MATCH");
    std::printf("%-34s %10s %12s %s\n", "figure", "pss", "limit", "");
    std::printf("%-34s %6.1f MiB %8.1f MiB %s\n", "chief peak RSS", chief_peak, chief_limit_mib,
                chief_peak < chief_limit_mib ? "ok (100 MB)" : "MISS (100 MB)");
    for (int i = 0; i < num_ps; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const double limit = shard_mib * 1.05 + ps_before[k];
        std::printf("%-34s %6.0f MiB %8.0f MiB %s\n", ("ps " + std::to_string(i) + " peak RSS").c_str(), ps_peak[k],
                    limit, ps_peak[k] <= limit ? "ok (shard + 5% + RSS at start)" : "MISS (shard + 5% + RSS at start)");
    }
    return 0;
}
