// bench_support.hpp: what several benchmarks need beside the ratio table: a process's memory as
// /proc/<pid>/status reports it and its CPU time, a scratch directory for their files, and a cluster of ps and worker
// processes on loopback (copies of the benchmark's binary, each with its TF_CONFIG) whose chief is the
// calling process.
#pragma once

#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <asio.hpp>
#include <nlohmann/json.hpp>

#include <pss/pss.hpp>

extern char** environ;

namespace pss_bench {

/// A field of /proc/<pid>/status (`pid` 0: this process) in KiB: VmHWM is the peak resident size, VmRSS
/// the current one; -1 when unknown.
inline long status_kib(pid_t pid, const std::string& field) {
    std::ifstream status(pid == 0 ? std::string("/proc/self/status") : "/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind(field + ":", 0) == 0) return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
    return -1;
}

/// A /proc/self/status field in KiB (see above).
inline long status_kib(const std::string& field) { return status_kib(0, field); }

/// A /proc/<pid>/status field in MiB (see above).
inline double status_mib(pid_t pid, const std::string& field) {
    return static_cast<double>(status_kib(pid, field)) / 1024.0;
}

/// CPU seconds (user + system) process `pid` (0: this process) has used so far, from /proc/<pid>/stat;
/// -1 when unknown.
inline double cpu_seconds(pid_t pid) {
    std::ifstream stat(pid == 0 ? std::string("/proc/self/stat") : "/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');  // the command name may hold spaces; the fields follow it
    if (close == std::string::npos) return -1;
    std::istringstream fields(text.substr(close + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i)  // fields 14 and 15: utime and stime, in clock ticks
        if (i >= 14) ticks += std::stod(field);
    return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

/// `<PSS_BENCH_DIR, else the system's temporary directory>/<name>_<pid>` (not created).
inline std::string scratch_directory(const std::string& name) {
    const char* dir = std::getenv("PSS_BENCH_DIR");
    const std::filesystem::path base = dir != nullptr && *dir != '\0' ? std::filesystem::path(dir)
                                                                     : std::filesystem::temp_directory_path();
    return (base / (name + "_" + std::to_string(::getpid()))).string();
}

/// Starts the program `self` again with `args` and, when not empty, the extra environment entry `extra`
/// (`NAME=VALUE`); with `own_group` in a process group of its own (whose id is its pid), so that it and
/// what it starts can be ended together. Returns its pid; exits when the system refuses.
inline pid_t spawn_self(const char* self, std::vector<std::string> args, const std::string& extra = "",
                        bool own_group = false) {
    std::string program = self;
    std::vector<char*> argv{program.data()};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> env;
    for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
    std::string entry = extra;
    if (!entry.empty()) env.push_back(entry.data());
    env.push_back(nullptr);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    if (own_group) {
        posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&attributes, 0);
    }
    pid_t pid = 0;
    const int error = posix_spawn(&pid, self, nullptr, &attributes, argv.data(), env.data());
    posix_spawnattr_destroy(&attributes);
    if (error != 0) {
        std::fprintf(stderr, "pss bench: cannot start %s: %s\n", self, std::strerror(error));
        std::exit(1);
    }
    return pid;
}

/// Waits up to `patience` for process `pid` (a child) to exit, then ends it (SIGKILL, by its pid).
/// Returns true when it exited by itself.
inline bool reap(pid_t pid, std::chrono::milliseconds patience = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (::waitpid(pid, nullptr, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() >= deadline) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
}

/// `n` addresses `127.0.0.1:PORT` of ports the system gave out, closed again for the tasks to bind.
inline std::vector<std::string> loopback_addresses(int n) {
    asio::io_context io;
    std::vector<asio::ip::tcp::acceptor> held;  // all held at once, so the n ports differ
    std::vector<std::string> addresses;
    for (int i = 0; i < n; ++i) {
        held.emplace_back(io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
        addresses.push_back("127.0.0.1:" + std::to_string(held.back().local_endpoint().port()));
    }
    return addresses;
}

/// A cluster on loopback whose chief is this process: `num_ps` ps and `num_workers` worker processes,
/// each this binary (`self`) started again with `args` and its TF_CONFIG (a program tells a task by
/// TF_CONFIG being set, and serves: `pss::ClusterStrategy<...> s; s.join();`). The chief's strategy ends
/// them (join); the destructor then waits for each and ends, by its pid, one that does not exit.
struct LocalTasks {
    pss::ClusterSpec spec;
    std::vector<pid_t> ps;
    std::vector<pid_t> workers;

    LocalTasks(const char* self, int num_ps, int num_workers, const std::vector<std::string>& args = {}) {
        const auto addresses = loopback_addresses(1 + num_ps + num_workers);
        const auto ps_end = addresses.begin() + 1 + num_ps;
        spec = pss::ClusterSpec{{"chief", {addresses[0]}},
                                {"ps", std::vector<std::string>(addresses.begin() + 1, ps_end)},
                                {"worker", std::vector<std::string>(ps_end, addresses.end())}};
        const auto cluster = spec.to_json();
        auto start = [&](const char* type, int index) {
            const nlohmann::json config{{"cluster", cluster}, {"task", {{"type", type}, {"index", index}}}};
            return spawn_self(self, args, "TF_CONFIG=" + config.dump());
        };
        for (int i = 0; i < num_ps; ++i) ps.push_back(start("ps", i));
        for (int i = 0; i < num_workers; ++i) workers.push_back(start("worker", i));
    }
    ~LocalTasks() {
        for (pid_t pid : workers) reap(pid);
        for (pid_t pid : ps) reap(pid);
    }
    LocalTasks(const LocalTasks&) = delete;
    LocalTasks& operator=(const LocalTasks&) = delete;
};

}  // namespace pss_bench
