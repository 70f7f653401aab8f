// pss/transport/tcp.hpp: TcpTransport, requests and replies as wire frames over TCP (standalone Asio).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <asio.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/timeouts.hpp>
#include <pss/transport/tcp/client.hpp>
#include <pss/transport/tcp/options.hpp>
#include <pss/transport/tcp/server.hpp>
#include <pss/transport/tcp/tls.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// Says once per process that links are plaintext, and why.
inline void warn_plaintext(const std::string& why) {
    static std::atomic<bool> said{false};
    if (said.exchange(true)) return;
    std::fprintf(stderr,
                 "pss: warning: TcpTransport links are plaintext (%s): no peer is authenticated, anyone who reaches "
                 "a port may read and command this task. Use it on a trusted network only\n",
                 why.c_str());
}

/// The TLS context of `task` from the directory `dir` (PSS_TLS_DIR): ca.crt, <job>-<index>.crt and .key.
inline TlsContext tls_dir_context([[maybe_unused]] const std::string& dir, [[maybe_unused]] const TaskId& task) {
#if PSS_HAS_TLS
    const std::string base = dir + "/" + task.type + "-" + std::to_string(task.index);
    return make_tls_context(TlsCredentials::from_files(dir + "/ca.crt", base + ".crt", base + ".key", "PSS_TLS_DIR"));
#else
    return nullptr;
#endif
}

/// A transport's TLS context (null: plaintext) and, when its credentials came from PSS_TLS_DIR, that
/// directory.
struct TcpSecurity {
    TlsContext context;
    std::string directory;
};

/// The TLS context of a transport for `self` (when known) under `options`, or null for plaintext: the
/// options' credentials, else the environment's (PSS_TLS_CA, PSS_TLS_CERT and PSS_TLS_KEY; or
/// PSS_TLS_DIR, a directory holding ca.crt, <job>-<index>.crt and <job>-<index>.key: `self`'s, or the
/// chief's for a transport of no one task); plaintext only when asked for (TcpOptions::plaintext, PSS_TLS=off).
/// @throws FailedPreconditionError when there are no credentials and plaintext was not asked for
inline TcpSecurity tcp_security(const TcpOptions& options, [[maybe_unused]] const std::optional<TaskId>& self) {
    const char* tls_env = std::getenv("PSS_TLS");
    const std::string tls_mode = tls_env ? tls_env : "";
    if (!tls_mode.empty() && tls_mode != "on" && tls_mode != "off")
        throw InvalidArgumentError("pss: PSS_TLS is \"" + tls_mode + "\"; give \"on\" or \"off\"");
    if (options.plaintext) {
        warn_plaintext("TcpOptions::plaintext");
        return {};
    }
#if !PSS_HAS_TLS
    warn_plaintext("pss was built with PSS_NO_TLS");
    return {};
#else
    if (options.tls) return {make_tls_context(*options.tls), {}};
    if (tls_mode == "off") {
        warn_plaintext("PSS_TLS=off");
        return {};
    }
    auto variable = [](const char* name) -> std::string {
        const char* value = std::getenv(name);
        return value ? value : "";
    };
    const std::string ca = variable("PSS_TLS_CA"), cert = variable("PSS_TLS_CERT"), key = variable("PSS_TLS_KEY");
    if (!ca.empty() || !cert.empty() || !key.empty()) {
        if (ca.empty() || cert.empty() || key.empty())
            throw InvalidArgumentError("pss: TLS: PSS_TLS_CA, PSS_TLS_CERT and PSS_TLS_KEY are set together; " +
                                       std::string(ca.empty() ? "PSS_TLS_CA" : cert.empty() ? "PSS_TLS_CERT" : "PSS_TLS_KEY") +
                                       " is missing");
        return {make_tls_context(TlsCredentials::from_files(ca, cert, key, "PSS_TLS_CA, PSS_TLS_CERT, PSS_TLS_KEY")), {}};
    }
    const std::string dir = variable("PSS_TLS_DIR");
    if (!dir.empty()) return {tls_dir_context(dir, self ? *self : TaskId{"chief", 0}), dir};
    throw FailedPreconditionError(
        "pss: TcpTransport: no TLS credentials" + (self ? " for " + self->to_string() : std::string()) +
        ": set PSS_TLS_DIR (a directory holding ca.crt and each task's <job>-<index>.crt and .key; pss-launch "
        "makes one for every run), or PSS_TLS_CA, PSS_TLS_CERT and PSS_TLS_KEY, or give TcpOptions::tls. "
        "Plaintext, for trusted networks only, must be asked for: PSS_TLS=off or TcpOptions::plaintext");
#endif
}

}  // namespace detail

/// @brief The network transport: every task a process, requests and replies wire frames over TCP.
///
/// `serve(task, h)` listens on the task's address from the cluster spec ("host:port"; port 0 lets the
/// system choose, and `bound_port` tells which). `send(task, r)` writes `r` on the one connection this
/// transport keeps to `task`, made on first use with retries and exponential backoff; many requests are
/// in flight on it at once and replies are matched to them by request id.
///
/// Payloads are written by scatter-gather straight from the tensor's storage and read straight into
/// the receiving tensor (a reused buffer where one fits). A `read` request's payload stays with the
/// sender as the buffer its value lands in, and an update's reply hands the request's own payload back:
/// neither crosses the network (see wire.hpp).
///
/// A request its sender waits for at once (Request::in_process.waited_at_once: a Variable operation of
/// one request sets it) on an idle plaintext link is exchanged on the sender's thread: it writes the
/// frame, sleeps in poll() until the reply comes and reads it, so that a round trip wakes the sender
/// only, as a blocking socket's does. Its reply is in when `send` returns. A reply that has not begun
/// within the heartbeat interval is left to the io thread, which answers heartbeats meanwhile.
///
/// Every served task's connections run on one strand, which runs its handler: requests to one task are
/// handled one at a time, in the order they arrive. A handler may keep its Responder and answer later,
/// from any thread: the reply is written through the task's strand (after shutdown() it is dropped; a
/// kept Responder must not outlive the transport, whose io context it refers to). A bad frame gets an error reply and
/// its connection closed (or only closed, when even its id cannot be trusted); the handler never sees it.
///
/// The parts: tcp/client.hpp (the connection to a task), tcp/server.hpp (a served task and its
/// connections), tcp/read_ahead.hpp and tcp/buffers.hpp (reading and writing frames), tcp/options.hpp,
/// tcp/tls.hpp (credentials, the cluster CA) and tcp/tls_stream.hpp (the TLS records).
///
/// Links are mutual TLS (1.3) unless plaintext is asked for: each task presents a certificate signed by
/// the cluster's CA that names it (subjectAltName URI `pss:/job:ps/replica:0/task:1`), and checks its
/// peer's; a client checks that the task it reached is the one it meant. A served task refuses a
/// request the peer's role may not make (see `role_refusal`), logs it and closes the connection.
///
/// A listening host that is an IP address is bound as it is; "localhost" binds 127.0.0.1. Any other name
/// is resolved through the system resolver and bound where it resolves, so a task listens on its own
/// address only; a name that does not resolve is an UnavailableError naming it. Over TLS, where a name
/// resolves only to loopback (Debian maps the host name to 127.0.1.1, while other hosts reach it by
/// another address), does not resolve yet (a Kubernetes service published after its pod starts), or
/// resolves to an address that is not this machine's (a NAT's), every interface (0.0.0.0) is bound, as
/// TensorFlow's server does; the peer's certificate, not the address, says who may talk.
///
/// Models the Transport concept.
class TcpTransport {
public:
    /// @brief Its tasks can be other processes: a strategy over it serves only its own task.
    static constexpr bool crosses_processes = true;

    /// @brief A transport for the tasks of `spec`, its TLS identity from `options.tls` or the environment's
    /// PSS_TLS_CA, PSS_TLS_CERT and PSS_TLS_KEY. Starts `options.io_threads` threads.
    /// @throws FailedPreconditionError when there are no credentials and plaintext was not asked for
    /// @throws InvalidArgumentError when the credentials are not PEM, do not match, or name no task
    explicit TcpTransport(const ClusterSpec& spec, TcpOptions options = {})
        : TcpTransport(spec, std::nullopt, std::move(options)) {}

    /// @brief A transport of task `self`, which also finds its credentials in PSS_TLS_DIR (a strategy
    /// builds its transports so).
    TcpTransport(const ClusterSpec& spec, const TaskId& self, TcpOptions options = {})
        : TcpTransport(spec, std::optional<TaskId>(self), std::move(options)) {}
    /// @brief A transport of task `self` with the default options but `timeouts`, announcing lost and
    /// returning peers when `announce_peers` (what a strategy builds).
    TcpTransport(const ClusterSpec& spec, const TaskId& self, const Timeouts& timeouts, bool announce_peers)
        : TcpTransport(spec, std::optional<TaskId>(self), with(timeouts, announce_peers)) {}
    TcpTransport(const TcpTransport&) = delete;
    TcpTransport& operator=(const TcpTransport&) = delete;
    ~TcpTransport() { shutdown(); }

    /// @brief Listens on `task`'s address and hands every request that reaches it to `handler`, with
    /// the Responder that writes its reply.
    /// @throws InvalidArgumentError when `task` is not in the cluster spec, is served twice, or its address
    ///         is not "host:port"
    /// @throws UnavailableError `pss: TcpTransport: cannot listen on 127.0.0.1:2222 for /job:ps/replica:0/task:0: Address already in use`
    /// @throws FailedPreconditionError after shutdown()
    void serve(const TaskId& task, RequestHandler handler) {
        check_task(task);
        const auto where = detail::parse_host_port(spec_.task_address(task), task);
        std::lock_guard lock(mutex_);
        if (closed_)
            throw FailedPreconditionError("pss: TcpTransport: serve(" + task.to_string() +
                                          ") was called after shutdown()");
        if (served_.contains(task))
            throw InvalidArgumentError("pss: TcpTransport: task " + task.to_string() + " is served twice");
        auto context = tls_;
#if PSS_HAS_TLS
        if (tls_ && !tls_dir_.empty() && task != identity_) {
            context = detail::tls_dir_context(tls_dir_, task);  // a transport of the whole cluster
        } else if (tls_ && task != identity_) {
            throw InvalidArgumentError("pss: TcpTransport: cannot serve " + task.to_string() +
                                       " with the TLS certificate of " + identity_.to_string());
        }
#endif
        auto served = std::make_shared<detail::TcpServedTask>(io_, task, std::move(handler), options_.limits,
                                                             options_.serve, std::move(context));
        std::error_code ec;
        asio::ip::address address = asio::ip::make_address(where.host, ec);
        bool anywhere_if_not_mine = false;  // bound to a name's address, which may not be this machine's
        if (where.host == "localhost") {
            address = asio::ip::address_v4::loopback();
        } else if (ec) {
            asio::ip::tcp::resolver resolver(io_);
            const auto results = resolver.resolve(where.host, std::to_string(where.port), ec);
            if (!tls_) {
                if (ec || results.empty())
                    throw UnavailableError("pss: TcpTransport: cannot listen on " + spec_.task_address(task) + " for " +
                                           task.to_string() + ": the host name \"" + where.host +
                                           "\" does not resolve (" + ec.message() + ")");
                address = results.begin()->endpoint().address();  // plaintext listens where the name resolves only
            } else {
                // Over TLS a name is bound where it resolves when that is not loopback (only its own
                // address); a loopback answer (Debian maps the host name to 127.0.1.1) or none means
                // others reach this host by an address it cannot know: every interface, as TensorFlow.
                address = asio::ip::address_v4::any();
                if (!ec)
                    for (const auto& result : results)
                        if (!result.endpoint().address().is_loopback()) {
                            address = result.endpoint().address();
                            anywhere_if_not_mine = true;
                            break;
                        }
            }
        }
        const asio::ip::tcp::endpoint endpoint(address, where.port);
        auto& acceptor = served->acceptor;
        auto check = [&](const char* step) {
            if (ec)
                throw UnavailableError("pss: TcpTransport: cannot listen on " + spec_.task_address(task) + " for " +
                                       task.to_string() + " (" + step + "): " + ec.message());
        };
        const auto bind = [&](const asio::ip::tcp::endpoint& at) {
            ec.clear();
            if (acceptor.is_open()) acceptor.close(ec);
            acceptor.open(at.protocol(), ec);
            check("open");
            acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
            check("reuse_address");
            acceptor.bind(at, ec);
        };
        bind(endpoint);
        // The name resolves to an address of another machine (a NAT's, a load balancer's): every interface.
        if (ec == std::errc::address_not_available && anywhere_if_not_mine)
            bind(asio::ip::tcp::endpoint(asio::ip::address_v4::any(), where.port));
        check("bind");
        acceptor.listen(asio::socket_base::max_listen_connections, ec);
        check("listen");
        served->endpoint = acceptor.local_endpoint(ec);
        check("local_endpoint");
        served_.emplace(task, served);
        asio::post(served->strand, [served] { served->accept(); });
    }

    /// @brief Sends `request` to `task`; the future holds its Reply. Never throws for a remote failure:
    /// an unreachable task, a lost connection, a timeout or a shut-down transport answer unavailable.
    /// A request waits for an unconnected task to come up for the start-up timeout; for a task that was
    /// lost, until the heartbeat timeout after the loss, and then it connects once (unavailable at once when
    /// the task is not up). A heartbeat (RequestKind::heartbeat) always asks once.
    std::future<Reply> send(const TaskId& task, Request request) {
        if (task.index < 0 || task.index >= spec_.num_tasks(task.type))
            return detail::ready_reply(Reply::error(
                ErrorCode::unavailable, "pss: TcpTransport: task " + task.to_string() + " is not in the cluster spec"));
        for (;;) {
            std::shared_ptr<detail::TcpClientConnection> connection = client(task, request);
            if (!connection)
                return detail::ready_reply(Reply::error(ErrorCode::unavailable, "pss: TcpTransport: request to " +
                                                                                     task.to_string() + " after shutdown()"));
            if (auto future = connection->send(request)) return std::move(*future);
            // The link had been closed by the task while nobody read it: once it is lost, as it would
            // have been at once, the request goes on the next one (which waits for a lost task to return).
            while (!connection->closed()) std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    }

    /// @brief Stops serving and sending: closes every socket, answers every waiting request unavailable,
    /// joins the threads. Idempotent. Must not be called from a request handler.
    void shutdown() {
        std::lock_guard join_lock(shutdown_mutex_);
        std::map<TaskId, std::shared_ptr<detail::TcpServedTask>> served;
        std::map<TaskId, std::shared_ptr<detail::TcpClientConnection>> clients;
        {
            std::lock_guard lock(mutex_);
            closed_ = true;
            served.swap(served_);
            clients.swap(clients_);
        }
        work_.reset();
        io_.stop();
        for (auto& t : threads_)
            if (t.joinable()) t.join();
        threads_.clear();
        // No thread runs the io_context now: sockets can be closed from here.
        for (auto& [task, connection] : clients)
            connection->fail("pss: TcpTransport: the transport was shut down before " + task.to_string() + " answered");
        for (auto& [task, s] : served) s->close_all();
    }

    /// @brief The port `task` listens on (the system's choice when its address gives port 0).
    /// @throws NotFoundError when this transport does not serve `task`
    [[nodiscard]] std::uint16_t bound_port(const TaskId& task) const { return endpoint(task).port(); }

    /// @brief The address and port `task` listens on.
    /// @throws NotFoundError `pss: TcpTransport: task /job:ps/replica:0/task:3 is not served by this transport`
    [[nodiscard]] asio::ip::tcp::endpoint endpoint(const TaskId& task) const {
        std::lock_guard lock(mutex_);
        auto it = served_.find(task);
        if (it == served_.end())
            throw NotFoundError("pss: TcpTransport: task " + task.to_string() + " is not served by this transport");
        return it->second->endpoint;
    }

    /// @brief When a chief last sent a whole frame (a heartbeat counts) to a task this transport serves;
    /// empty until one has. Over plaintext links a task cannot tell who sent a frame: any task's count.
    [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> chief_heard() const {
        std::lock_guard lock(mutex_);
        std::chrono::steady_clock::rep latest = 0;
        for (const auto& [task, served] : served_)
            latest = std::max(latest, served->chief_heard.load(std::memory_order_relaxed));
        if (latest == 0) return std::nullopt;
        return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(latest));
    }

    [[nodiscard]] const ClusterSpec& cluster_spec() const noexcept { return spec_; }
    [[nodiscard]] const TcpOptions& options() const noexcept { return options_; }
    /// @brief True when links are TLS (false when plaintext was asked for, or in a PSS_NO_TLS build).
    [[nodiscard]] bool secure() const noexcept { return tls_ != nullptr; }

private:
    TcpTransport(const ClusterSpec& spec, std::optional<TaskId> self, TcpOptions options)
        : spec_(spec), options_(std::move(options)), work_(asio::make_work_guard(io_)) {
        auto security = detail::tcp_security(options_, self);
        tls_ = std::move(security.context);
#if PSS_HAS_TLS
        if (tls_) {
            identity_ = detail::context_task(*tls_);
            if (self && *self != identity_)
                throw InvalidArgumentError("pss: TcpTransport: the TLS certificate given to " + self->to_string() +
                                           " names " + identity_.to_string());
            // A transport of no one task, its credentials from a directory, serves each task with that
            // task's certificate (the whole cluster in one process) and connects as the chief.
            if (!self) tls_dir_ = std::move(security.directory);
        }
#endif
        options_.tls.reset();  // the key lives in the TLS context only
        const int n = std::max(1, options_.io_threads);
        for (int i = 0; i < n; ++i) threads_.emplace_back([this] { io_.run(); });
    }

    static TcpOptions with(const Timeouts& timeouts, bool announce_peers) {
        TcpOptions options;
        options.timeouts = timeouts;
        options.announce_peers = announce_peers;
        return options;
    }

    /// The connection to `task`, made when there is none or the last one closed; null after shutdown().
    std::shared_ptr<detail::TcpClientConnection> client(const TaskId& task, const Request& request) {
        std::lock_guard lock(mutex_);
        if (closed_) return nullptr;
        auto& slot = clients_[task];
        if (!slot || slot->closed()) {
            const auto lost_at = slot ? slot->lost_at() : std::nullopt;
            // A heartbeat to a task not connected asks once, without waiting for the task to start.
            const bool probe = request.kind == RequestKind::heartbeat;
            slot = std::make_shared<detail::TcpClientConnection>(
                io_, parking_, peer_close_watch_, task, [this, task] { return connect_address(task); }, options_, tls_, lost_at, probe);
            slot->start();
        }
        return slot;
    }

    void check_task(const TaskId& task) const {
        if (task.index < 0 || task.index >= spec_.num_tasks(task.type))
            throw InvalidArgumentError("pss: TcpTransport: task " + task.to_string() + " is not in the cluster spec");
    }

    /// Where to connect to `task`: where it listens when this transport serves it (its real port, even
    /// when the spec says 0), else its address in the spec.
    detail::TcpHostPort connect_address(const TaskId& task) {
        {
            std::lock_guard lock(mutex_);
            if (auto it = served_.find(task); it != served_.end()) {
                auto address = it->second->endpoint.address();
                if (address.is_unspecified()) address = asio::ip::address_v4::loopback();
                return {address.to_string(), it->second->endpoint.port()};
            }
        }
        return detail::parse_host_port(spec_.task_address(task), task);
    }

    ClusterSpec spec_;
    TcpOptions options_;
    detail::TlsContext tls_;  // null: plaintext
    TaskId identity_;         // the task this transport's certificate names (TLS only)
    std::string tls_dir_;     // PSS_TLS_DIR, for a transport of no one task
    asio::io_context io_;  // before everything holding sockets: destroyed last
    asio::io_context parking_;  // never run: its reactor holds the sockets of parked links (see TcpClientConnection)
    detail::TcpPeerCloseWatch peer_close_watch_{io_};  // sees a parked link's end
    asio::executor_work_guard<asio::io_context::executor_type> work_;
    std::vector<std::thread> threads_;
    mutable std::mutex mutex_;
    std::mutex shutdown_mutex_;
    bool closed_ = false;
    std::map<TaskId, std::shared_ptr<detail::TcpServedTask>> served_;
    std::map<TaskId, std::shared_ptr<detail::TcpClientConnection>> clients_;
};

PSS_NAMESPACE_END
