// A real cluster on loopback: 2 ps processes and 1, 2 or 4 worker processes started by this benchmark
// (each a copy of this binary with its TF_CONFIG), this process being the chief.
// - many workers: each worker pushes (apply_gradient) and pulls (read_into) a 4 MiB variable of its own,
//   placed round-robin on the 2 ps, until the cluster has moved 2 GiB; the figure is the aggregate bytes
//   per second, from the first schedule to the last join, beside a raw Asio stream moving the same
//   bytes in 4 MiB writes in the same run (one connection: what one pair of tasks can do);
// - flat memory: the chief pushes (assign_add) a 64 MiB value 40 times to a ps; the ps's peak RSS
//   (VmHWM) after 8 pushes and after 40 must be the same (buffers reused, nothing per message kept).
// Run: build-bench/benchmarks/bench_cluster (tools/bench.sh bench_cluster). No arguments.
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <asio.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include <pss/pss.hpp>

extern char** environ;

namespace {

constexpr std::size_t value_bytes = 4u << 20;
constexpr std::uint64_t total_bytes = 2ull << 30;
using Clock = std::chrono::steady_clock;

/// A worker's part: `rounds` pushes and pulls of its variable. Returns the bytes moved.
double push_pull(pss::Variable v, std::int64_t rounds) {
    xt::xarray<float> gradient = xt::ones<float>({value_bytes / sizeof(float)});
    xt::xarray<float> value = xt::zeros<float>({value_bytes / sizeof(float)});
    for (std::int64_t i = 0; i < rounds; ++i) {
        gradient = std::move(v.apply_gradient(std::move(gradient)).get<float>());
        v.read_into(value);
    }
    return static_cast<double>(rounds) * 2.0 * static_cast<double>(value_bytes);
}
const auto push_pull_function = pss::register_function("bench_cluster.push_pull", &push_pull);

std::vector<std::uint16_t> free_ports(int n) {
    asio::io_context io;
    std::vector<asio::ip::tcp::acceptor> held;
    std::vector<std::uint16_t> ports;
    for (int i = 0; i < n; ++i) {
        held.emplace_back(io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
        ports.push_back(held.back().local_endpoint().port());
    }
    return ports;
}

/// The chief's view of a cluster of 2 ps and `workers` worker processes, started here and ended by join().
struct Cluster {
    pss::ClusterSpec spec;
    std::vector<pid_t> pids;
    std::vector<std::string> names;

    Cluster(const char* self, int workers) {
        auto ports = free_ports(3 + workers);
        auto address = [&](std::size_t i) { return "127.0.0.1:" + std::to_string(ports[i]); };
        std::vector<std::string> ps{address(1), address(2)}, worker;
        for (int i = 0; i < workers; ++i) worker.push_back(address(3 + static_cast<std::size_t>(i)));
        spec = pss::ClusterSpec{{"chief", {address(0)}}, {"ps", ps}, {"worker", worker}};
        std::string cluster = R"({"chief": [")" + address(0) + R"("], "ps": [")" + ps[0] + R"(", ")" + ps[1] +
                              R"("], "worker": [)";
        for (std::size_t i = 0; i < worker.size(); ++i) {
            if (i != 0) cluster.append(", ");
            cluster.append("\"").append(worker[i]).append("\"");
        }
        cluster += "]}";
        auto start = [&](const std::string& type, int index) {
            const std::string tf_config =
                "TF_CONFIG={\"cluster\": " + cluster + ", \"task\": {\"type\": \"" + type + "\", \"index\": " +
                std::to_string(index) + "}}";
            std::vector<char*> env;
            for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
            env.push_back(const_cast<char*>(tf_config.c_str()));
            env.push_back(nullptr);
            char* argv[] = {const_cast<char*>(self), nullptr};
            pid_t pid = 0;
            if (posix_spawn(&pid, self, nullptr, nullptr, argv, env.data()) != 0) {
                std::perror("bench_cluster: posix_spawn");
                std::exit(1);
            }
            pids.push_back(pid);
            names.push_back(type + ":" + std::to_string(index));
        };
        start("ps", 0);
        start("ps", 1);
        for (int i = 0; i < workers; ++i) start("worker", i);
    }
    ~Cluster() {
        for (pid_t pid : pids) {  // after join() they have exited; a stuck one is ended by its pid
            for (int i = 0; i < 100 && ::waitpid(pid, nullptr, WNOHANG) == 0; ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            if (::kill(pid, 0) == 0) {
                ::kill(pid, SIGKILL);
                ::waitpid(pid, nullptr, 0);
            }
        }
    }
};

using Strategy = pss::ParameterServerStrategy<pss::TcpTransport, pss::NoPartitioner, pss::SGD, pss::SimpleClusterResolver>;

/// Aggregate bytes per second of `workers` worker processes pushing and pulling against 2 ps.
double aggregate(const char* self, int workers) {
    Cluster cluster(self, workers);
    Strategy strategy(pss::SimpleClusterResolver(cluster.spec, "chief", 0), {}, pss::SGD(0.0f));
    pss::ClusterCoordinator coordinator(strategy);
    std::vector<pss::Variable> variables;
    {
        auto scope = strategy.scope();
        for (int i = 0; i < workers; ++i)
            variables.emplace_back(xt::xarray<float>(xt::zeros<float>({value_bytes / sizeof(float)})),
                                   "v" + std::to_string(i));
    }
    // A first round on every worker: connections up, buffers allocated.
    for (auto& v : variables) (void)coordinator.schedule(push_pull_function, v, std::int64_t{2});
    coordinator.join();
    const auto rounds = static_cast<std::int64_t>(total_bytes / (2 * value_bytes) / static_cast<std::uint64_t>(workers));
    const auto begin = Clock::now();
    std::vector<pss::RemoteValue<double>> moved;
    for (auto& v : variables) moved.push_back(coordinator.schedule(push_pull_function, v, rounds));
    double bytes = 0;
    for (double b : pss::fetch(moved)) bytes += b;
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    strategy.join();
    return bytes / seconds;
}

/// Raw Asio: one connection, 4 MiB writes, the same total bytes.
double raw_stream() {
    asio::io_context io;
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
    std::thread server([&] {
        asio::ip::tcp::socket s(io);
        acceptor.accept(s);
        std::vector<char> buffer(value_bytes);
        std::error_code ec;
        while (!ec) asio::read(s, asio::buffer(buffer), ec);
    });
    asio::ip::tcp::socket client(io);
    client.connect(acceptor.local_endpoint());
    std::vector<char> buffer(value_bytes, 1);
    for (int i = 0; i < 8; ++i) asio::write(client, asio::buffer(buffer));
    const auto begin = Clock::now();
    for (std::uint64_t sent = 0; sent < total_bytes; sent += value_bytes) asio::write(client, asio::buffer(buffer));
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    client.close();
    server.join();
    return static_cast<double>(total_bytes) / seconds;
}

/// VmHWM (peak RSS) of process `pid`, in MiB.
double peak_rss_mib(pid_t pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
    return 0;
}

}  // namespace

int main(int, char** argv) {
    if (std::getenv("TF_CONFIG") != nullptr) {  // a ps or worker task of a cluster started below
        pss::ClusterStrategy<> strategy;
        strategy.join();
        return 0;
    }
    const double raw = raw_stream();
    std::printf("%-44s %10s %10s %8s\n", "figure", "pss GB/s", "raw GB/s", "ratio");
    for (int workers : {1, 2, 4}) {
        const double figure = aggregate(argv[0], workers);
        std::printf("%-44s %10.2f %10.2f %8.2f\n",
                    ("aggregate push+pull, " + std::to_string(workers) + " workers x 2 ps").c_str(), figure / 1e9,
                    raw / 1e9, figure / raw);
    }

    // Flat memory under a stream of 64 MiB pushes.
    Cluster cluster(argv[0], 1);
    Strategy strategy(pss::SimpleClusterResolver(cluster.spec, "chief", 0));
    auto scope = strategy.scope();
    constexpr std::size_t big = (64u << 20) / sizeof(float);
    pss::Variable v(xt::xarray<float>(xt::zeros<float>({big})), "big");
    pss::Tensor delta(xt::xarray<float>(xt::ones<float>({big})));
    double after_8 = 0;
    for (int i = 1; i <= 40; ++i) {
        delta = v.assign_add(std::move(delta));
        if (i == 8) after_8 = peak_rss_mib(cluster.pids[0]);
    }
    const double after_40 = peak_rss_mib(cluster.pids[0]);
    const bool exact = v.read<float>()(big - 1) == 40.0f;
    std::printf("\nps peak RSS (VmHWM) holding 64 MiB: after 8 pushes of 64 MiB %.1f MiB, after 40 %.1f MiB: "
                "growth %.1f MiB (limit: flat, under 1 MiB)%s%s\n",
                after_8, after_40, after_40 - after_8, after_40 - after_8 < 1.0 ? "" : "  MISS",
                exact ? "" : "  (WRONG VALUE)");
    strategy.join();
    return 0;
}
