// pss/transport/tcp/options.hpp: TcpOptions, and the address and message helpers both ends of a TcpTransport use.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <utility>

#include <asio.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/timeouts.hpp>
#include <pss/transport/tcp/tls.hpp>
#include <pss/wire.hpp>

PSS_NAMESPACE_BEGIN

/// @brief What a served task spends on its peers at most. Each bound is a defence against a peer that
/// misbehaves or attacks (the README's Security section); the defaults leave a legitimate cluster room.
struct TcpServeLimits {
    /// Connections one served task keeps open; 0: three quarters of the process's soft limit of file
    /// descriptors. A connection beyond it closes the oldest one that has not sent a whole frame yet, or
    /// else is closed itself.
    std::size_t max_connections = 0;
    /// A connection that has not sent its first whole frame this long after it was accepted is closed.
    std::chrono::milliseconds first_frame_timeout{10'000};
    /// A frame whose header has arrived must arrive whole within this, else the connection is closed
    /// (a peer that announces a large frame and stalls holds nothing for longer).
    std::chrono::milliseconds frame_timeout{60'000};
    /// Reply bytes a connection may leave unread before the task stops reading its requests.
    std::size_t max_unread_reply_bytes = std::size_t{64} << 20;
    /// Reply bytes all of a task's connections may leave unread before each stops reading requests (a
    /// connection with no reply waiting still reads).
    std::size_t max_task_unread_reply_bytes = std::size_t{1} << 30;
    /// A connection whose requests are not read (its replies are not being read) for this long is closed.
    std::chrono::milliseconds unread_reply_timeout{60'000};
    /// Bytes (ids and tensors, as announced) of the frames a task is receiving at once; a frame that
    /// would go beyond waits until others are whole. A single frame may always be received.
    std::uint64_t max_receiving_bytes = std::uint64_t{4} << 30;
    /// Bytes of receive buffers a task keeps for reuse (large pushes land in mapped pages).
    std::size_t max_pooled_bytes = std::size_t{256} << 20;
    /// Replies a connection remembers, so that a repeated request id is answered, not applied twice.
    std::size_t recorded_replies = 1024;
};

/// @brief Settings of a TcpTransport. The defaults are TensorFlow's where it has one.
struct TcpOptions {
    /// First wait between two connection attempts to a task that is not up yet.
    std::chrono::milliseconds connect_backoff_initial{1};
    /// Longest wait between two connection attempts.
    std::chrono::milliseconds connect_backoff_max{10'000};
    /// Each failed attempt multiplies the wait by this.
    double connect_backoff_factor = 1.3;
    /// The start-up timeout (connecting), the heartbeats that find a lost peer, and the request deadline
    /// (none by default: a synchronous pull held at the ps waits for the slowest worker's step, and a
    /// call for its whole step, while heartbeats tell a dead or frozen peer from a busy one). The
    /// defaults, not the environment's: a strategy passes `Timeouts::from_environment()`.
    Timeouts timeouts;
    /// Print one line to stderr when a task this transport sends to is lost (its connection broke, or it
    /// answered no heartbeat) and when it is back: a strategy's chief does.
    bool announce_peers = false;
    /// What a peer may make this process allocate for one frame.
    WireLimits limits;
    /// What a served task spends on its peers.
    TcpServeLimits serve;
    /// This task's TLS identity. Empty: from the environment (PSS_TLS_CA, PSS_TLS_CERT and PSS_TLS_KEY, or
    /// PSS_TLS_DIR for a transport that knows its task); with none there either, the transport refuses
    /// to start unless plaintext was asked for.
    std::optional<TlsCredentials> tls;
    /// Plaintext links, asked for explicitly (as PSS_TLS=off does): no peer is authenticated and anyone
    /// who reaches a port may command the task. For trusted networks only; a warning says so.
    bool plaintext = false;
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

inline std::future<Reply> ready_reply(Reply reply) {
    std::promise<Reply> promise;
    promise.set_value(std::move(reply));
    return promise.get_future();
}

using TcpStrand = asio::strand<asio::io_context::executor_type>;

}  // namespace detail

PSS_NAMESPACE_END
