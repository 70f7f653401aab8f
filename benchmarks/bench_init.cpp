// Peak resident memory of the chief and of each ps while a 4 GiB float32 embedding table (32 Mi rows x 32)
// is created over 4 ps processes started here (copies of this binary with their TF_CONFIG; one worker too,
// as a cluster needs one), this process being the chief. Each ps draws its 1 GiB shard from the
// initializer (pss::InitializerSpec), so the chief never holds the table. The issue's limits: the chief's
// peak RSS under 100 MB; a ps's, its shard + 5% + what it held before. Two rows read back are checked
// against the generator. Usage: bench_init [rows, default 33554432] [columns, default 32]
// (tools/bench.sh bench_init). Plaintext links (PSS_TLS=off): the figure is memory, not TLS.
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <asio.hpp>
#include <xtensor/xarray.hpp>

#include <pss/pss.hpp>

#include "bench_support.hpp"

extern char** environ;

namespace {

constexpr int num_ps = 4;

/// VmHWM or VmRSS of process `pid` (the /proc/<pid>/status field), in MiB.
double status_mib(pid_t pid, const std::string& field) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
    return 0;
}

/// Starts this binary again with TF_CONFIG `tf_config`; returns its pid.
pid_t start_task(const char* self, const std::string& tf_config) {
    std::string program = self;
    char* argv[] = {program.data(), nullptr};
    std::vector<char*> env;
    for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
    std::string entry = "TF_CONFIG=" + tf_config;
    env.push_back(entry.data());
    env.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, self, nullptr, nullptr, argv, env.data()) != 0) {
        std::perror("bench_init: posix_spawn");
        std::exit(1);
    }
    return pid;
}

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

    // Ports the system gives out, held until the tasks are named (then closed for them to bind).
    std::vector<std::string> addresses;
    {
        asio::io_context io;
        std::vector<asio::ip::tcp::acceptor> held;
        for (int i = 0; i < num_ps + 2; ++i) {
            held.emplace_back(io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
            addresses.push_back("127.0.0.1:" + std::to_string(held.back().local_endpoint().port()));
        }
    }
    std::vector<std::string> ps(addresses.begin() + 1, addresses.begin() + 1 + num_ps);
    const pss::ClusterSpec spec{{"chief", {addresses[0]}}, {"ps", ps}, {"worker", {addresses.back()}}};
    std::string ps_list;
    for (const auto& a : ps) ps_list += (ps_list.empty() ? "\"" : ", \"") + a + "\"";
    const std::string cluster = R"({"chief": [")" + addresses[0] + R"("], "ps": [)" + ps_list + R"(], "worker": [")" +
                                addresses.back() + R"("]})";
    std::vector<pid_t> ps_pids;
    for (int i = 0; i < num_ps; ++i)
        ps_pids.push_back(start_task(argv[0], R"({"cluster": )" + cluster + R"(, "task": {"type": "ps", "index": )" +
                                                  std::to_string(i) + "}}"));
    const pid_t worker = start_task(argv[0], R"({"cluster": )" + cluster + R"(, "task": {"type": "worker", "index": 0}})");

    using Strategy = pss::ParameterServerStrategy<pss::TcpTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                  pss::SimpleClusterResolver>;
    Strategy strategy(pss::SimpleClusterResolver(spec, "chief", 0), pss::FixedShardsPartitioner(num_ps));
    std::vector<double> ps_before;
    for (pid_t pid : ps_pids) ps_before.push_back(status_mib(pid, "VmRSS"));
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
    for (pid_t pid : ps_pids) ps_peak.push_back(status_mib(pid, "VmHWM"));
    const double chief_peak = static_cast<double>(pss_bench::status_kib("VmHWM")) / 1024;
    strategy.join();
    for (pid_t pid : ps_pids) ::waitpid(pid, nullptr, 0);
    ::waitpid(worker, nullptr, 0);

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
