// pss/transport/tcp.hpp: TcpTransport, requests and replies as wire frames over TCP (standalone Asio).
#pragma once

#include <algorithm>
#include <cstdint>
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
#include <pss/transport/tcp/client.hpp>
#include <pss/transport/tcp/options.hpp>
#include <pss/transport/tcp/server.hpp>

PSS_NAMESPACE_BEGIN

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
/// Every served task's connections run on one strand, which runs its handler: requests to one task are
/// handled one at a time, in the order they arrive. A handler may keep its Responder and answer later,
/// from any thread: the reply is written through the task's strand (after shutdown() it is dropped; a
/// kept Responder must not outlive the transport, whose io context it refers to). A bad frame gets an error reply and
/// its connection closed (or only closed, when even its id cannot be trusted); the handler never sees it.
///
/// The parts: tcp/client.hpp (the connection to a task), tcp/server.hpp (a served task and its
/// connections), tcp/read_ahead.hpp and tcp/buffers.hpp (reading and writing frames), tcp/options.hpp.
///
/// A listening host that is an IP address is bound as it is; "localhost" binds 127.0.0.1; any other name
/// binds every interface (0.0.0.0), as TensorFlow's server does, since a name may resolve to an address
/// others do not reach (Debian maps the host name to 127.0.1.1).
///
/// Models the Transport concept.
class TcpTransport {
public:
    /// @brief Its tasks can be other processes: a strategy over it serves only its own task.
    static constexpr bool crosses_processes = true;

    /// @brief A transport for the tasks of `spec`. Starts `options.io_threads` threads.
    explicit TcpTransport(const ClusterSpec& spec, TcpOptions options = {})
        : spec_(spec), options_(options), work_(asio::make_work_guard(io_)) {
        const int n = std::max(1, options_.io_threads);
        for (int i = 0; i < n; ++i) threads_.emplace_back([this] { io_.run(); });
    }
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
        auto served = std::make_shared<detail::TcpServedTask>(io_, task, std::move(handler), options_.limits,
                                                             options_.serve);
        std::error_code ec;
        asio::ip::address address = asio::ip::make_address(where.host, ec);
        if (where.host == "localhost") address = asio::ip::address_v4::loopback();
        else if (ec) address = asio::ip::address_v4::any();
        const asio::ip::tcp::endpoint endpoint(address, where.port);
        auto& acceptor = served->acceptor;
        auto check = [&](const char* step) {
            if (ec)
                throw UnavailableError("pss: TcpTransport: cannot listen on " + spec_.task_address(task) + " for " +
                                       task.to_string() + " (" + step + "): " + ec.message());
        };
        ec.clear();
        acceptor.open(endpoint.protocol(), ec);
        check("open");
        acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
        check("reuse_address");
        acceptor.bind(endpoint, ec);
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
    std::future<Reply> send(const TaskId& task, Request request) {
        if (task.index < 0 || task.index >= spec_.num_tasks(task.type))
            return detail::ready_reply(Reply::error(
                ErrorCode::unavailable, "pss: TcpTransport: task " + task.to_string() + " is not in the cluster spec"));
        std::shared_ptr<detail::TcpClientConnection> connection;
        {
            std::lock_guard lock(mutex_);
            if (closed_)
                return detail::ready_reply(Reply::error(ErrorCode::unavailable, "pss: TcpTransport: request to " +
                                                                                     task.to_string() +
                                                                                     " after shutdown()"));
            auto& slot = clients_[task];
            if (!slot || slot->closed()) {
                slot = std::make_shared<detail::TcpClientConnection>(
                    io_, task, [this, task] { return connect_address(task); }, options_);
                slot->start();
            }
            connection = slot;
        }
        return connection->send(std::move(request));
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

    [[nodiscard]] const ClusterSpec& cluster_spec() const noexcept { return spec_; }
    [[nodiscard]] const TcpOptions& options() const noexcept { return options_; }

private:
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
    asio::io_context io_;  // before everything holding sockets: destroyed last
    asio::executor_work_guard<asio::io_context::executor_type> work_;
    std::vector<std::thread> threads_;
    mutable std::mutex mutex_;
    std::mutex shutdown_mutex_;
    bool closed_ = false;
    std::map<TaskId, std::shared_ptr<detail::TcpServedTask>> served_;
    std::map<TaskId, std::shared_ptr<detail::TcpClientConnection>> clients_;
};

PSS_NAMESPACE_END
