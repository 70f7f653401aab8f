// pss/transport/tcp/options.hpp: TcpOptions, and the address and message helpers both ends of a TcpTransport use.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <string>
#include <utility>

#include <asio.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/wire.hpp>

PSS_NAMESPACE_BEGIN

/// @brief Settings of a TcpTransport. The defaults are TensorFlow's where it has one.
struct TcpOptions {
    /// First wait between two connection attempts to a task that is not up yet.
    std::chrono::milliseconds connect_backoff_initial{1};
    /// Longest wait between two connection attempts.
    std::chrono::milliseconds connect_backoff_max{10'000};
    /// Each failed attempt multiplies the wait by this.
    double connect_backoff_factor = 1.3;
    /// After this long without a connection, the requests waiting for it are answered unavailable
    /// (about TensorFlow's 3 minutes for a ps to come up).
    std::chrono::milliseconds connect_timeout{180'000};
    /// A request not answered this long after it was written is answered unavailable; 0 waits forever.
    /// The clock starts once the connection is up (the connect timeout covers the wait before). A
    /// synchronous pull is held at the ps until its step is applied, so it waits for the slowest worker's
    /// step: keep this above the longest step.
    std::chrono::milliseconds request_timeout{30'000};
    /// What a peer may make this process allocate.
    WireLimits limits;
    /// Threads running the sockets and the served tasks' handlers (a handler runs on one of them, and
    /// holds it while it runs). One gives the lowest latency: with two, completions hop between threads.
    /// Raise it for a process serving several busy tasks, or whose handler may block: with one thread,
    /// a handler that waits blocks every socket and timer of this transport, its own timeouts included.
    int io_threads = 1;
};

namespace detail {

struct TcpHostPort {
    std::string host;
    std::uint16_t port = 0;
};

/// Splits "host:port" ("[::1]:2222" for IPv6).
/// @throws InvalidArgumentError `pss: TcpTransport: task /job:ps/replica:0/task:0 has address "ps0"; give it as "host:port"`
inline TcpHostPort parse_host_port(const std::string& address, const TaskId& task) {
    auto bad = [&]() -> void {
        throw InvalidArgumentError("pss: TcpTransport: task " + task.to_string() + " has address \"" + address +
                                   "\"; give it as \"host:port\" with a port from 0 to 65535");
    };
    if (address.starts_with("inproc:"))
        throw InvalidArgumentError("pss: TcpTransport: task " + task.to_string() + " has address \"" + address +
                                   "\", an embedded cluster's (threads of one process); TcpTransport reaches "
                                   "\"host:port\" addresses. Use InProcessTransport for the embedded cluster, or "
                                   "AutoTransport (ClusterStrategy) for a program that runs either way");
    const auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) bad();
    std::string host = address.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    unsigned long port = 0;
    for (std::size_t i = colon + 1; i < address.size(); ++i) {
        const char c = address[i];
        if (c < '0' || c > '9' || i - colon > 5) bad();
        port = port * 10 + static_cast<unsigned long>(c - '0');
    }
    if (port > 65535) bad();
    return {host, static_cast<std::uint16_t>(port)};
}

/// "30 s", "0.25 s": a duration as the messages print it.
inline std::string format_seconds(std::chrono::milliseconds ms) {
    const auto count = ms.count();
    std::string out = std::to_string(count / 1000);
    if (count % 1000 != 0) {
        std::string frac = std::to_string(1000 + count % 1000).substr(1);
        while (frac.back() == '0') frac.pop_back();
        out += "." + frac;
    }
    return out + " s";
}

inline std::future<Reply> ready_reply(Reply reply) {
    std::promise<Reply> promise;
    promise.set_value(std::move(reply));
    return promise.get_future();
}

using TcpStrand = asio::strand<asio::io_context::executor_type>;

}  // namespace detail

PSS_NAMESPACE_END
