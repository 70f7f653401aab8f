// A real cluster on loopback: 2 ps processes and 1, 2 or 4 worker processes started by this benchmark
// (each a copy of this binary with its TF_CONFIG), this process being the chief.
// - many workers: each worker pushes (apply_gradient) and pulls (read_into) a 4 MiB variable of its own,
//   placed round-robin on the 2 ps, until the cluster has moved 2 GiB; the figure is the aggregate bytes
//   per second, from the first schedule to the last join, beside a raw Asio stream moving the same
//   bytes in 4 MiB writes in the same run (one connection: what one pair of tasks can do);
// - flat memory: the chief pushes (assign_add) a 64 MiB value 40 times to a ps; the ps's peak RSS
//   (VmHWM) after 8 pushes and after 40 must be the same (buffers reused, nothing per message kept);
// - failures: steps per second of small steps (closures of 16 pushes and pulls of 4 KiB) with heartbeats
//   off, on at the default 1 s interval, and on every 10 ms (goal: on at 1 s, within 1% of off); the time
//   from a worker's death (SIGKILL) to its closure running on the other worker, beside the time a raw
//   loopback socket takes to see its peer process killed (the kernel's floor for noticing a death); the
//   time from a ps's death to the chief's UnavailableError naming it, beside the heartbeat timeout (a
//   lost task has that long to come back, by design).
// Run: build-bench/benchmarks/bench_cluster (tools/bench.sh bench_cluster); `bench_cluster failures` runs
// the failure figures only. On hosts: with PSS_BENCH_HOSTS="NS=ADDRESS,..." (7 of them: the chief's,
// ps 0's, ps 1's, workers 0 to 3's) this process runs in the first namespace, each task it starts in its
// own (`ip netns exec NS`, as root) at its address, and the raw stream goes to a sink on ps 0's host:
// tools/bench_hosts.sh makes the hosts (network namespaces on a bridge) and runs it there.
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
#include <filesystem>
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

/// A host of PSS_BENCH_HOSTS: a network namespace and this task's address in it.
struct Host {
    std::string ns;
    std::string address;
};

/// The hosts of PSS_BENCH_HOSTS ("NS=ADDRESS,..."); empty when unset (every task on 127.0.0.1).
const std::vector<Host>& hosts() {
    static const std::vector<Host> parsed = [] {
        std::vector<Host> result;
        const char* text = std::getenv("PSS_BENCH_HOSTS");
        std::string rest = text != nullptr ? text : "";
        while (!rest.empty()) {
            const auto comma = rest.find(',');
            const std::string item = rest.substr(0, comma);
            rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
            const auto equals = item.find('=');
            if (equals == std::string::npos) {
                std::fprintf(stderr, "bench_cluster: PSS_BENCH_HOSTS item \"%s\" is not NS=ADDRESS\n", item.c_str());
                std::exit(2);
            }
            result.push_back({item.substr(0, equals), item.substr(equals + 1)});
        }
        if (!result.empty() && result.size() != 7) {
            std::fprintf(stderr, "bench_cluster: PSS_BENCH_HOSTS names %zu hosts, not 7 (chief, 2 ps, 4 workers)\n",
                         result.size());
            std::exit(2);
        }
        return result;
    }();
    return parsed;
}

/// Starts `self` with `args` and the extra environment entry `extra`, in host `host`'s namespace when
/// there are hosts. Returns its pid (`ip netns exec` runs the program in its own process).
pid_t spawn(const char* self, std::size_t host, std::vector<std::string> args, const std::string& extra) {
    std::vector<std::string> command;
    if (!hosts().empty()) command = {"ip", "netns", "exec", hosts()[host].ns};
    command.emplace_back(self);
    for (auto& a : args) command.push_back(std::move(a));
    std::vector<char*> argv;
    for (auto& c : command) argv.push_back(c.data());
    argv.push_back(nullptr);
    std::vector<char*> env;
    for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
    if (!extra.empty()) env.push_back(const_cast<char*>(extra.c_str()));
    env.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), env.data()) != 0) {
        std::perror("bench_cluster: posix_spawnp");
        std::exit(1);
    }
    return pid;
}

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
        // On hosts each task has an address of its own: one port serves all, a new one per cluster (the
        // last cluster's sockets may linger).
        static int generation = 0;
        std::vector<std::uint16_t> ports;
        if (hosts().empty()) ports = free_ports(3 + workers);
        else ports.assign(static_cast<std::size_t>(3 + workers), static_cast<std::uint16_t>(4100 + generation++ % 500));
        auto address = [&](std::size_t i) {
            return (hosts().empty() ? std::string("127.0.0.1") : hosts()[i].address) + ":" + std::to_string(ports[i]);
        };
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
        auto start = [&](const std::string& type, int index, std::size_t host) {
            pids.push_back(spawn(self, host, {},
                                 "TF_CONFIG={\"cluster\": " + cluster + ", \"task\": {\"type\": \"" + type +
                                     "\", \"index\": " + std::to_string(index) + "}}"));
            names.push_back(type + ":" + std::to_string(index));
        };
        start("ps", 0, 1);
        start("ps", 1, 2);
        for (int i = 0; i < workers; ++i) start("worker", i, 3 + static_cast<std::size_t>(i));
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

/// This process as the chief of a Cluster, with `count` float variables of `elements` zeros on its ps
/// tasks (round-robin: the second is on ps 1). SGD with rate 0: the tasks run the same (the handshake
/// refuses another configuration), and values stay put.
struct Chief {
    Cluster cluster;
    Strategy strategy;
    pss::ClusterCoordinator coordinator;
    std::vector<pss::Variable> variables;

    Chief(const char* self, int workers, int count, std::size_t elements)
        : cluster(self, workers),
          strategy(pss::SimpleClusterResolver(cluster.spec, "chief", 0), {}, pss::SGD(0.0f)),
          coordinator(strategy) {
        auto scope = strategy.scope();
        for (int i = 0; i < count; ++i)
            variables.emplace_back(xt::xarray<float>(xt::zeros<float>({elements})), "v" + std::to_string(i));
    }
};

/// Aggregate bytes per second of `workers` worker processes pushing and pulling against 2 ps.
double aggregate(const char* self, int workers) {
    Chief chief(self, workers, workers, value_bytes / sizeof(float));
    auto& [cluster, strategy, coordinator, variables] = chief;
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

/// The raw stream's receiving end: reads from one connection on `endpoint` until it ends.
void raw_sink(asio::io_context& io, asio::ip::tcp::acceptor& acceptor) {
    asio::ip::tcp::socket s(io);
    acceptor.accept(s);
    std::vector<char> buffer(value_bytes);
    std::error_code ec;
    while (!ec) asio::read(s, asio::buffer(buffer), ec);
}

/// Raw Asio: one connection, 4 MiB writes, the same total bytes; on hosts, to a sink process on ps 0's
/// host (what one pair of tasks' link can do), else to a thread of this process over loopback.
double raw_stream(const char* self) {
    asio::io_context io;
    asio::ip::tcp::socket client(io);
    std::thread server;
    asio::ip::tcp::acceptor acceptor(io);
    pid_t sink = 0;
    if (hosts().empty()) {
        acceptor = asio::ip::tcp::acceptor(io, {asio::ip::address_v4::loopback(), 0});
        server = std::thread([&] { raw_sink(io, acceptor); });
        client.connect(acceptor.local_endpoint());
    } else {
        const asio::ip::tcp::endpoint at(asio::ip::make_address(hosts()[1].address), 4099);
        sink = spawn(self, 1, {"raw-sink", hosts()[1].address}, "");
        std::error_code ec;
        for (int i = 0; i < 200; ++i) {  // until the sink listens, at most 10 s
            client.close(ec);
            if (!client.connect(at, ec)) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        if (ec) {
            std::fprintf(stderr, "bench_cluster: the raw sink on %s did not answer: %s\n", hosts()[1].address.c_str(),
                         ec.message().c_str());
            std::exit(1);
        }
    }
    std::vector<char> buffer(value_bytes, 1);
    for (int i = 0; i < 8; ++i) asio::write(client, asio::buffer(buffer));
    const auto begin = Clock::now();
    for (std::uint64_t sent = 0; sent < total_bytes; sent += value_bytes) asio::write(client, asio::buffer(buffer));
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    client.close();
    if (server.joinable()) server.join();
    if (sink != 0) ::waitpid(sink, nullptr, 0);
    return static_cast<double>(total_bytes) / seconds;
}

long long wall_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/// A small step: 16 pushes and pulls of a 4 KiB variable.
int small_step(pss::Variable v) {
    xt::xarray<float> gradient = xt::ones<float>({1024});
    xt::xarray<float> value = xt::zeros<float>({1024});
    for (int i = 0; i < 16; ++i) {
        gradient = std::move(v.apply_gradient(std::move(gradient)).get<float>());
        v.read_into(value);
    }
    return 16;
}
const auto small_step_function = pss::register_function("bench_cluster.small_step", &small_step);

/// Worker 1 notes the time in `marker` and kills itself; any other worker returns the time it started.
long long die_on_worker_1(std::string marker) {
    const long long now = wall_ns();
    if (pss::worker_index() == 1) {
        std::ofstream(marker) << now << "\n" << std::flush;
        std::raise(SIGKILL);
    }
    return now;
}
const auto die_function = pss::register_function("bench_cluster.die_on_worker_1", &die_on_worker_1);

/// Sets (or, for nullptr, unsets) an environment variable the tasks started next inherit.
void set_env(const char* name, const char* value) {
    if (value != nullptr) ::setenv(name, value, 1);
    else ::unsetenv(name);
}

/// Small steps per second of 2 worker processes against 2 ps, with the heartbeat settings of the environment.
double small_steps_per_second(const char* self) {
    Chief chief(self, 2, 2, 1024);
    auto& [cluster, strategy, coordinator, variables] = chief;
    for (int i = 0; i < 20; ++i) (void)coordinator.schedule(small_step_function, variables[i % 2]);
    coordinator.join();
    const auto begin = Clock::now();
    int steps = 0;
    while (Clock::now() - begin < std::chrono::milliseconds(2500)) {
        for (int i = 0; i < 40; ++i, ++steps) (void)coordinator.schedule(small_step_function, variables[i % 2]);
        coordinator.join();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    strategy.join();
    return steps / seconds;
}

/// Seconds from a child process's death (SIGKILL, the time noted just before) to this process's blocking
/// read on a loopback connection to it returning end of file: the kernel's floor for noticing a death.
double raw_death_notice() {
    asio::io_context io;
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
    int stamp_pipe[2];
    if (::pipe(stamp_pipe) != 0) return 0;
    const pid_t child = ::fork();
    if (child == 0) {
        asio::io_context child_io;
        asio::ip::tcp::socket s(child_io);
        s.connect(acceptor.local_endpoint());
        const long long now = wall_ns();
        (void)!::write(stamp_pipe[1], &now, sizeof now);
        std::raise(SIGKILL);
    }
    asio::ip::tcp::socket s(io);
    acceptor.accept(s);
    char byte = 0;
    std::error_code ec;
    (void)s.read_some(asio::buffer(&byte, 1), ec);
    const long long seen = wall_ns();
    long long died = 0;
    (void)!::read(stamp_pipe[0], &died, sizeof died);
    ::waitpid(child, nullptr, 0);
    ::close(stamp_pipe[0]);
    ::close(stamp_pipe[1]);
    return static_cast<double>(seen - died) * 1e-9;
}

/// Seconds from worker 1's death in its closure to that closure starting on worker 0.
double worker_death_to_rerun(const char* self) {
    Chief chief(self, 2, 0, 0);
    auto& [cluster, strategy, coordinator, variables] = chief;
    const auto marker = std::filesystem::temp_directory_path() / ("bench_cluster_death_" + std::to_string(::getpid()));
    std::filesystem::remove(marker);
    auto rerun = coordinator.schedule_on(1, die_function, marker.string());
    const long long started = rerun.fetch();
    long long died = 0;
    std::ifstream(marker) >> died;
    std::filesystem::remove(marker);
    strategy.join();
    return died > 0 ? static_cast<double>(started - died) * 1e-9 : -1;
}

/// Seconds from ps 1's death (SIGKILL, sent here) to the chief's join raising UnavailableError naming it,
/// while closures use a variable on it.
double ps_death_to_error(const char* self) {
    Chief chief(self, 1, 2, 1024);
    auto& [cluster, strategy, coordinator, variables] = chief;
    (void)coordinator.schedule(small_step_function, variables[1]);  // the second variable is on ps 1
    coordinator.join();
    const auto died = Clock::now();
    ::kill(cluster.pids[1], SIGKILL);
    double seconds = -1;
    while (Clock::now() - died < std::chrono::seconds(60)) {
        (void)coordinator.schedule(small_step_function, variables[1]);
        try {
            coordinator.join();
        } catch (const pss::UnavailableError& e) {
            if (std::string(e.what()).find("/job:ps/replica:0/task:1") != std::string::npos)
                seconds = std::chrono::duration<double>(Clock::now() - died).count();
            break;
        }
    }
    strategy.join();
    return seconds;
}

/// The failure figures (see the top of this file).
void failures(const char* self) {
    std::printf("\n%-56s %10s %10s %8s\n", "failures: heartbeats", "steps/s", "off", "ratio");
    // Alternating runs, the best of each: the machines are shared.
    double off = 0, on = 0, often = 0;
    for (int round = 0; round < 3; ++round) {
        set_env("PSS_HEARTBEAT_TIMEOUT", "0");
        set_env("PSS_HEARTBEAT_INTERVAL", nullptr);
        off = std::max(off, small_steps_per_second(self));
        set_env("PSS_HEARTBEAT_TIMEOUT", nullptr);
        on = std::max(on, small_steps_per_second(self));
        set_env("PSS_HEARTBEAT_TIMEOUT", "0.1");
        set_env("PSS_HEARTBEAT_INTERVAL", "0.01");
        often = std::max(often, small_steps_per_second(self));
    }
    set_env("PSS_HEARTBEAT_TIMEOUT", nullptr);
    set_env("PSS_HEARTBEAT_INTERVAL", nullptr);
    std::printf("%-56s %10.0f %10.0f %8.3f%s\n", "small steps, heartbeats every 1 s (default; goal >= 0.99)", on, off,
                on / off, on / off >= 0.99 ? "" : "  MISS");
    std::printf("%-56s %10.0f %10.0f %8.3f\n", "small steps, heartbeats every 10 ms", often, off, often / off);

    const double raw = raw_death_notice();
    const double rerun = worker_death_to_rerun(self);
    std::printf("\n%-56s %10s %10s %8s\n", "failures: deaths", "pss ms", "limit ms", "ratio");
    std::printf("%-56s %10.2f %10.2f %8.1f\n", "worker killed -> its closure running on another (raw EOF)",
                rerun * 1e3, raw * 1e3, rerun / raw);
    set_env("PSS_HEARTBEAT_TIMEOUT", "2");
    set_env("PSS_HEARTBEAT_INTERVAL", "0.2");
    const double error = ps_death_to_error(self);
    set_env("PSS_HEARTBEAT_TIMEOUT", nullptr);
    set_env("PSS_HEARTBEAT_INTERVAL", nullptr);
    std::printf("%-56s %10.0f %10.0f %8.2f\n", "ps killed -> the chief's error (heartbeat timeout 2 s)", error * 1e3,
                2000.0, error / 2.0);
}

/// A CA and certificates for every task a benchmark cluster has, in a directory named by PSS_TLS_DIR
/// (inherited by the tasks) while this object lives; nothing when the environment chose already.
struct TlsDirectory {
    std::filesystem::path path;
    TlsDirectory() {
#if PSS_HAS_TLS
        if (std::getenv("PSS_TLS_DIR") != nullptr || std::getenv("PSS_TLS") != nullptr) return;
        std::string pattern = (std::filesystem::temp_directory_path() / "bench_cluster_tls_XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) return;
        path = pattern;
        std::vector<pss::TaskId> tasks{{"chief", 0}, {"ps", 0}, {"ps", 1}};
        for (int i = 0; i < 4; ++i) tasks.push_back({"worker", i});
        pss::TlsAuthority("bench_cluster CA").write_directory(path, tasks);
        ::setenv("PSS_TLS_DIR", path.c_str(), 1);
#endif
    }
    ~TlsDirectory() {
        std::error_code ignored;
        if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
    TlsDirectory(const TlsDirectory&) = delete;
    TlsDirectory& operator=(const TlsDirectory&) = delete;
};

/// VmHWM (peak RSS) of process `pid`, in MiB.
double peak_rss_mib(pid_t pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "raw-sink") {  // raw_stream's receiving end on another host
        asio::io_context io;
        asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address(argv[2]), 4099});
        raw_sink(io, acceptor);
        return 0;
    }
    if (std::getenv("TF_CONFIG") != nullptr) {  // a ps or worker task of a cluster started below
        // The chief's configuration (the handshake refuses another): SGD with rate 0, so values stay put.
        pss::ClusterStrategy<> strategy({}, {}, pss::SGD(0.0f));
        strategy.join();
        return 0;
    }
    // Links are TLS, as users run them: a throwaway CA for this run's tasks (PSS_TLS=off or a PSS_TLS_DIR
    // of the caller's choosing are kept).
    const TlsDirectory tls;
    if (argc == 2 && std::string(argv[1]) == "failures") {
        failures(argv[0]);
        return 0;
    }
    const double raw = raw_stream(argv[0]);
    std::printf("%-44s %10s %10s %8s\n", "figure", "pss GB/s", "raw GB/s", "ratio");
    for (int workers : {1, 2, 4}) {
        const double figure = aggregate(argv[0], workers);
        std::printf("%-44s %10.2f %10.2f %8.2f\n",
                    ("aggregate push+pull, " + std::to_string(workers) + " workers x 2 ps").c_str(), figure / 1e9,
                    raw / 1e9, figure / raw);
    }

    // Flat memory under a stream of 64 MiB pushes.
    Cluster cluster(argv[0], 1);
    Strategy strategy(pss::SimpleClusterResolver(cluster.spec, "chief", 0), {}, pss::SGD(0.0f));
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
    failures(argv[0]);
    return 0;
}
