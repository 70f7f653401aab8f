// pss/transport/tcp.hpp: TcpTransport, requests and replies as wire frames over TCP (standalone Asio).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <cerrno>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#define PSS_TCP_HAS_SENDMSG 1
#endif

#include <asio.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/tensor.hpp>
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
    /// The clock starts once the connection is up (the connect timeout covers the wait before).
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

/// Receive buffers of one served task, reused so that a large payload lands in memory whose pages are
/// already mapped (a fresh 64 MB buffer costs about 190 ms of page faults). Used on the task's strand only.
class TcpBufferPool {
public:
    Tensor take(DType dtype, std::size_t elements) {
        for (auto it = buffers_.begin(); it != buffers_.end(); ++it)
            if (it->dtype() == dtype && it->size() == elements) {
                Tensor t = std::move(*it);
                buffers_.erase(it);
                return t;
            }
        return {};
    }
    void give(Tensor tensor) {
        if (!tensor.has_value() || tensor.nbytes() < min_bytes) return;
        if (buffers_.size() == max_buffers) buffers_.pop_front();
        buffers_.push_back(std::move(tensor));
    }

private:
    static constexpr std::size_t min_bytes = 64 << 10;  // smaller buffers are cheap to allocate
    static constexpr std::size_t max_buffers = 2;
    std::deque<Tensor> buffers_;
};

/// Reads `buffers` at once when the bytes are there already (the socket is non-blocking), else finishes
/// asynchronously; `next(ec)` runs either way. A small frame then costs one wake-up, not one per section.
template <class Socket, class Buffers, class Next>
void read_now_or_later(Socket& socket, const Buffers& buffers, Next next) {
    std::error_code ec;
    const std::size_t n = asio::read(socket, buffers, ec);
    if (ec != asio::error::would_block && ec != asio::error::try_again) return next(ec);
    std::vector<asio::mutable_buffer> rest;
    std::size_t skip = n;
    for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers); ++it) {
        asio::mutable_buffer b = *it;
        if (skip >= b.size()) {
            skip -= b.size();
            continue;
        }
        rest.push_back(b + skip);
        skip = 0;
    }
    asio::async_read(socket, std::move(rest), [next = std::move(next)](std::error_code ec2, std::size_t) { next(ec2); });
}

/// Bytes read ahead from a socket: a frame's header is read together with what follows it (its small
/// sections, a small payload, the next frames), so that a small frame costs one read system call, not
/// one per section. Used on one strand only.
class TcpReadAhead {
public:
    /// Calls `next(ec)` once `header` is filled, from the bytes read ahead or from the socket.
    template <class Socket, class Next>
    void read_header(Socket& socket, std::array<std::byte, frame_header_size>& header, Next next) {
        if (end_ - begin_ >= header.size()) {
            std::memcpy(header.data(), stage_.data() + begin_, header.size());
            begin_ += header.size();
            // Frames already here are handled in turn; every few, through the io context, so that a
            // burst of pipelined frames does not deepen the stack.
            if (++depth_ < 8) return next(std::error_code{});
            depth_ = 0;
            return asio::post(socket.get_executor(), [next = std::move(next)] { next(std::error_code{}); });
        }
        depth_ = 0;
        if (begin_ != 0) {  // keep the partial header at the front
            std::memmove(stage_.data(), stage_.data() + begin_, end_ - begin_);
            end_ -= begin_;
            begin_ = 0;
        }
        socket.async_read_some(asio::buffer(stage_.data() + end_, stage_.size() - end_),
                               [this, &socket, &header, next = std::move(next)](std::error_code ec, std::size_t n) mutable {
                                   if (ec) return next(ec);
                                   end_ += n;
                                   read_header(socket, header, std::move(next));
                               });
    }

    /// Fills `buffers` from the bytes read ahead, then from the socket; then `next(ec)`.
    template <class Socket, class Buffers, class Next>
    void fill(Socket& socket, const Buffers& buffers, Next next) {
        std::vector<asio::mutable_buffer> rest;
        for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers); ++it) {
            asio::mutable_buffer b = *it;
            const std::size_t n = std::min(b.size(), end_ - begin_);
            if (n != 0) std::memcpy(b.data(), stage_.data() + begin_, n);
            begin_ += n;
            if (n < b.size()) rest.push_back(b + n);
        }
        if (rest.empty()) return next(std::error_code{});
        read_now_or_later(socket, rest, std::move(next));
    }

private:
    std::vector<std::byte> stage_ = std::vector<std::byte>(16 << 10);
    std::size_t begin_ = 0, end_ = 0;
    int depth_ = 0;
};

inline void reshape_in_place(Tensor& tensor, const Shape& shape) {
    tensor.visit_mut([&](auto& array) { array.resize(shape); });  // same element count: the buffer is kept
}

class TcpServerConnection;

/// One served task: its listening socket, its handler and the strand every one of its connections runs
/// on, so that its requests are handled one at a time, in the order they arrive.
struct TcpServedTask : std::enable_shared_from_this<TcpServedTask> {
    TcpServedTask(asio::io_context& io, TaskId id, RequestHandler h, const WireLimits& l)
        : task(std::move(id)), handler(std::move(h)), limits(l), strand(asio::make_strand(io)), acceptor(strand) {}

    void accept();
    void close_all();

    TaskId task;
    RequestHandler handler;
    WireLimits limits;
    TcpStrand strand;
    asio::ip::tcp::acceptor acceptor;
    asio::ip::tcp::endpoint endpoint;  // the bound address, with the port the system chose for port 0
    TcpBufferPool pool;
    std::vector<std::weak_ptr<TcpServerConnection>> connections;
};

/// The server side of one connection: reads request frames, runs the task's handler, writes replies.
class TcpServerConnection : public std::enable_shared_from_this<TcpServerConnection> {
public:
    TcpServerConnection(std::shared_ptr<TcpServedTask> task, asio::ip::tcp::socket socket)
        : task_(std::move(task)), socket_(std::move(socket)) {}

    void start() {
        std::error_code ignored;
        socket_.non_blocking(true, ignored);
        read_header();
    }

    void close() {
        std::error_code ignored;
        socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
        socket_.close(ignored);
    }

private:
    struct PendingWrite {
        Reply reply;
        OutgoingFrame frame;
    };

    void read_header() {
        ahead_.read_header(socket_, header_bytes_, [self = shared_from_this()](std::error_code ec) { self->on_header(ec); });
    }

    void on_header(std::error_code ec) {
        if (ec) return close();
        try {
            header_ = decode_header(header_bytes_, task_->limits);
            if (header_.is_reply())
                throw WireError("pss: wire: a reply frame reached the server of task " + task_->task.to_string() +
                                    "; a server takes requests only",
                                header_.request_id);
        } catch (const WireError& e) {
            return refuse(e);
        }
        ahead_.fill(socket_, body_buffers(header_, body_),
                    [self = shared_from_this()](std::error_code ec2) { self->on_body(ec2); });
    }

    void on_body(std::error_code ec) {
        if (ec) return close();
        try {
            decode_body(header_bytes_, header_, body_, task_->limits);
        } catch (const WireError& e) {
            return refuse(e);
        }
        Tensor reuse;
        if (header_.has_payload()) reuse = task_->pool.take(header_.dtype, num_elements(body_.shape));
        if (header_.payload_elided()) {
            // A read's buffer: offer a reused one of that shape, never a fresh one (a peer could otherwise
            // make this process allocate a gigabyte with a frame of 100 bytes).
            if (reuse.has_value()) reshape_in_place(reuse, body_.shape);
            incoming_ = std::move(reuse);
            return on_payload({});
        }
        incoming_ = payload_buffer(header_, body_, std::move(reuse));
        if (header_.payload_length == 0) return on_payload({});
        ahead_.fill(socket_, asio::buffer(incoming_.bytes(), static_cast<std::size_t>(header_.payload_length)),
                    [self = shared_from_this()](std::error_code ec2) { self->on_payload(ec2); });
    }

    void on_payload(std::error_code ec) {
        if (ec) return close();
        const Op op = header_.op();
        const std::uint64_t id = header_.request_id;
        if (header_.task != static_cast<std::uint32_t>(task_->task.index)) {
            answer(id, op,
                   Reply::error(ErrorCode::invalid_argument,
                                "pss: TcpTransport: a request for task index " + std::to_string(header_.task) +
                                    " of job \"" + task_->task.type + "\" reached " + task_->task.to_string() +
                                    "; the sender's cluster spec gives this address to another task"));
        } else {
            // The reply goes out through the task's strand whenever the handler answers: at once (the
            // dispatch runs inline, on this strand) or later from any thread.
            Responder respond([self = shared_from_this(), id, op](Reply&& reply) {
                asio::dispatch(self->task_->strand, [self, id, op, reply = std::move(reply)]() mutable {
                    self->answer(id, op, std::move(reply));
                });
            });
            try {
                task_->handler(to_request(header_, body_, std::move(incoming_)), std::move(respond));
            } catch (...) {
                // A handler must not throw; one that does has dropped its Responder, which answered
                // unavailable. The connection and the task go on.
            }
        }
        incoming_ = Tensor{};
        read_header();
    }

    /// Queues the reply to request `id` (strand).
    void answer(std::uint64_t id, Op op, Reply reply) {
        // An update's reply payload is the spent request buffer: the client hands its own back.
        const bool elide = reply.ok() && reply.payload.has_value() && !reply_carries_value(op);
        queue_reply(id, std::move(reply), elide);
    }

    /// A bad frame: an error reply when its id can be trusted, then (or else at once) the connection closes.
    void refuse(const WireError& e) {
        if (!e.request_id()) return close();
        closing_ = true;
        queue_reply(*e.request_id(), Reply::error(ErrorCode::invalid_argument, e.what()), false);
    }

    void queue_reply(std::uint64_t id, Reply reply, bool elide) {
        auto& out = writes_.emplace_back();  // built in place: the frame points into the reply
        out.reply = std::move(reply);
        try {
            out.frame = OutgoingFrame::reply(out.reply, id, static_cast<std::uint32_t>(task_->task.index), elide);
        } catch (const Error& e) {  // a handler's reply the wire cannot carry (rank above 8)
            out.reply = Reply::error(e.code(), e.what());
            out.frame = OutgoingFrame::reply(out.reply, id, static_cast<std::uint32_t>(task_->task.index), false);
        }
        if (!writing_) write_next();
    }

    void write_next() {
        writing_ = true;
        buffers_.clear();
        batch_ = 0;
        std::size_t bytes = 0;
        for (const auto& w : writes_) {  // several small replies go out in one write
            if (batch_ == 16 || (batch_ > 0 && bytes > (256u << 10))) break;
            const auto frame_buffers = w.frame.buffers();
            buffers_.insert(buffers_.end(), frame_buffers.begin(), frame_buffers.end());
            bytes += w.frame.size();
            ++batch_;
        }
        asio::async_write(socket_, buffers_,
                          [self = shared_from_this()](std::error_code ec, std::size_t) { self->on_written(ec); });
    }

    void on_written(std::error_code ec) {
        for (; batch_ > 0; --batch_) {
            task_->pool.give(std::move(writes_.front().reply.payload));
            writes_.pop_front();
        }
        if (ec) {
            writes_.clear();
            writing_ = false;
            return close();
        }
        if (!writes_.empty()) return write_next();
        writing_ = false;
        if (closing_) linger();
    }

    /// After an error reply: stop sending, then read and drop what the peer still sends (up to 1 MiB)
    /// until it closes, so that closing with unread bytes does not reset the connection and destroy the
    /// error reply before the peer has read it.
    void linger() {
        std::error_code ignored;
        socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
        if (discarded_ > (1u << 20)) return close();
        socket_.async_read_some(asio::buffer(header_bytes_), [self = shared_from_this()](std::error_code ec, std::size_t n) {
            self->discarded_ += n;
            if (ec) return self->close();
            self->linger();
        });
    }

    std::shared_ptr<TcpServedTask> task_;
    asio::ip::tcp::socket socket_;
    std::array<std::byte, frame_header_size> header_bytes_{};
    TcpReadAhead ahead_;
    FrameHeader header_;
    FrameBody body_;
    Tensor incoming_;
    std::deque<PendingWrite> writes_;
    std::vector<asio::const_buffer> buffers_;
    std::size_t batch_ = 0;
    bool writing_ = false;
    bool closing_ = false;
    std::size_t discarded_ = 0;
};

inline void TcpServedTask::accept() {
    acceptor.async_accept([self = shared_from_this()](std::error_code ec, asio::ip::tcp::socket socket) {
        if (!self->acceptor.is_open()) return;
        if (!ec) {
            std::error_code ignored;
            socket.set_option(asio::ip::tcp::no_delay(true), ignored);
            auto connection = std::make_shared<TcpServerConnection>(self, std::move(socket));
            std::erase_if(self->connections, [](const auto& w) { return w.expired(); });
            self->connections.push_back(connection);
            connection->start();
        }
        self->accept();
    });
}

inline void TcpServedTask::close_all() {
    std::error_code ignored;
    acceptor.close(ignored);
    for (auto& weak : connections)
        if (auto connection = weak.lock()) connection->close();
    connections.clear();
}

/// The client side of the connection from this process to one task: created by the first `send`,
/// connected with retries, requests pipelined on it and their replies matched by id.
class TcpClientConnection : public std::enable_shared_from_this<TcpClientConnection> {
public:
    using Clock = std::chrono::steady_clock;

    TcpClientConnection(asio::io_context& io, TaskId task, std::function<TcpHostPort()> where,
                        const TcpOptions& options)
        : task_(std::move(task)),
          where_(std::move(where)),
          options_(options),
          strand_(asio::make_strand(io)),
          socket_(strand_),
          backoff_timer_(strand_),
          deadline_timer_(strand_) {}

    /// Starts connecting (on the strand).
    void start() {
        connect_deadline_ = Clock::now() + options_.connect_timeout;
        backoff_ = options_.connect_backoff_initial;
        asio::post(strand_, [self = shared_from_this()] { self->attempt(); });
    }

    [[nodiscard]] bool closed() {
        std::lock_guard lock(mutex_);
        return state_ == State::closed;
    }

    std::future<Reply> send(Request request) {
        auto out = std::make_shared<Outgoing>();
        out->request = std::move(request);
        // A read's payload is the buffer the value should land in: it stays here, only its shape travels.
        const bool elide = out->request.op == Op::read && out->request.payload.has_value();
        std::promise<Reply> promise;
        auto future = promise.get_future();
        std::unique_lock lock(mutex_);
        if (state_ == State::closed) {
            lock.unlock();
            promise.set_value(Reply::error(ErrorCode::unavailable, closed_reason_));
            return future;
        }
        out->id = next_id_++;
        try {
            out->frame = OutgoingFrame::request(out->request, out->id, static_cast<std::uint32_t>(task_.index), elide);
        } catch (const Error& e) {
            lock.unlock();
            promise.set_value(Reply::error(e.code(), e.what()));
            return future;
        }
        Pending& pending = pending_[out->id];
        pending.promise = std::move(promise);
        pending.out = out;
        if (state_ == State::connecting) {
            queue_.push_back(std::move(out));
            return future;
        }
        start_clock_locked(pending, Clock::now());
        if (writing_) {
            queue_.push_back(std::move(out));
            return future;
        }
        // Nothing is being written: write from this thread, sparing a wake-up of an io thread.
        out->written = write_now(*out);
        if (out->written == out->frame.size()) {
            pending.sent = true;
            return future;
        }
        writing_ = true;
        queue_.push_back(std::move(out));
        lock.unlock();
        asio::post(strand_, [self = shared_from_this()] { self->write_queued(); });
        return future;
    }

    /// Answers every waiting request with `reason` (unavailable) and closes the socket.
    void fail(const std::string& reason) {
        std::map<std::uint64_t, Pending> pending;
        {
            std::lock_guard lock(mutex_);
            if (state_ == State::closed) return;
            state_ = State::closed;
            closed_reason_ = reason;
            fd_ = -1;
            pending.swap(pending_);
            queue_.clear();
            writing_ = false;
            std::error_code ignored;
            deadline_timer_.cancel();
            backoff_timer_.cancel();
            socket_.close(ignored);  // under the lock: no sendmsg can be using the descriptor
        }
        for (auto& [id, p] : pending) p.promise.set_value(Reply::error(ErrorCode::unavailable, reason));
    }

private:
    enum class State { connecting, connected, closed };

    struct Outgoing {
        Request request;
        OutgoingFrame frame;
        std::uint64_t id = 0;
        std::size_t written = 0;  // bytes already written from the sending thread
    };

    struct Pending {
        std::promise<Reply> promise;
        std::shared_ptr<Outgoing> out;
        bool sent = false;
        std::optional<Clock::time_point> deadline;
        /// A reply handing the payload back that was read before this request's write completed (the
        /// two completions race on the strand): kept until the write is done, so that the caller never
        /// gets a buffer a write may still read.
        std::optional<Reply> early;
    };

    std::string address_text() const { return where_text_.empty() ? std::string("?") : where_text_; }

    // ---- connecting (strand) ----

    void attempt() {
        TcpHostPort where;
        try {
            where = where_();
        } catch (const Error& e) {
            return fail(e.what());
        }
        where_text_ = where.host + ":" + std::to_string(where.port);
        std::error_code ec;
        const auto address = asio::ip::make_address(where.host == "localhost" ? "127.0.0.1" : where.host, ec);
        if (!ec) {
            socket_.async_connect(asio::ip::tcp::endpoint(address, where.port),
                                  [self = shared_from_this()](std::error_code ec2) { self->on_connect(ec2); });
            return;
        }
        resolver_ = std::make_unique<asio::ip::tcp::resolver>(strand_);
        resolver_->async_resolve(
            where.host, std::to_string(where.port),
            [self = shared_from_this()](std::error_code ec2, asio::ip::tcp::resolver::results_type results) {
                if (ec2) return self->retry(ec2);
                asio::async_connect(self->socket_, results,
                                    [self](std::error_code ec3, const asio::ip::tcp::endpoint&) { self->on_connect(ec3); });
            });
    }

    void on_connect(std::error_code ec) {
        if (ec) return retry(ec);
        std::error_code ignored;
        socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
        socket_.non_blocking(true, ignored);
        bool write = false;
        {
            std::lock_guard lock(mutex_);
            if (state_ == State::closed) return;
            state_ = State::connected;
            fd_ = static_cast<int>(socket_.native_handle());
            const auto now = Clock::now();
            for (auto& [id, p] : pending_) start_clock_locked(p, now);
            write = writing_ = !queue_.empty();
        }
        if (write) write_queued();
        read_header();
    }

    void retry(std::error_code ec) {
        {
            std::lock_guard lock(mutex_);
            if (state_ == State::closed) return;
        }
        ++attempts_;
        std::error_code ignored;
        socket_.close(ignored);
        const auto now = Clock::now();
        if (now >= connect_deadline_)
            return fail("pss: TcpTransport: could not connect to " + task_.to_string() + " at " + address_text() +
                        " within " + format_seconds(options_.connect_timeout) + " (" + std::to_string(attempts_) +
                        " attempts): " + ec.message());
        const auto wait = std::min<Clock::duration>(backoff_, connect_deadline_ - now);
        backoff_ = std::min(options_.connect_backoff_max,
                            std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(
                                static_cast<double>(backoff_.count()) * options_.connect_backoff_factor + 0.5)));
        if (backoff_.count() == 0) backoff_ = std::chrono::milliseconds(1);
        std::lock_guard lock(mutex_);
        if (state_ == State::closed) return;
        backoff_timer_.expires_after(wait);
        backoff_timer_.async_wait([self = shared_from_this()](std::error_code ec2) {
            if (!ec2) self->attempt();
        });
    }

    // ---- deadlines (mutex held, or strand) ----

    void start_clock_locked(Pending& pending, Clock::time_point now) {
        if (options_.request_timeout.count() <= 0) return;
        pending.deadline = now + options_.request_timeout;
        if (timer_armed_) return;  // it fires at an earlier deadline, then re-arms for the next
        timer_armed_ = true;
        deadline_timer_.expires_at(*pending.deadline);
        deadline_timer_.async_wait([self = shared_from_this()](std::error_code ec) { self->on_deadline(ec); });
    }

    void on_deadline(std::error_code ec) {
        if (ec == asio::error::operation_aborted) return;
        std::vector<std::promise<Reply>> expired;
        std::vector<std::pair<std::promise<Reply>, Reply>> answered;
        {
            std::lock_guard lock(mutex_);
            timer_armed_ = false;
            if (state_ == State::closed) return;
            const auto now = Clock::now();
            // Ids grow with send time, so deadlines grow with ids: the overdue requests come first.
            for (auto it = pending_.begin(); it != pending_.end();) {
                if (!it->second.deadline || *it->second.deadline > now) break;
                if (it->second.early)  // answered, its write still not complete: the answer without the buffer
                    answered.emplace_back(std::move(it->second.promise), std::move(*it->second.early));
                else
                    expired.push_back(std::move(it->second.promise));
                it = pending_.erase(it);
            }
            if (!pending_.empty() && pending_.begin()->second.deadline) {
                timer_armed_ = true;
                deadline_timer_.expires_at(*pending_.begin()->second.deadline);
                deadline_timer_.async_wait([self = shared_from_this()](std::error_code ec2) { self->on_deadline(ec2); });
            }
        }
        for (auto& [promise, reply] : answered) promise.set_value(std::move(reply));
        for (auto& p : expired)
            p.set_value(Reply::error(ErrorCode::unavailable, "pss: request to " + task_.to_string() + " timed out after " +
                                                                  format_seconds(options_.request_timeout)));
    }

    // ---- writing ----

    /// Writes what the socket takes now without blocking (mutex held). Returns the bytes written.
    std::size_t write_now([[maybe_unused]] const Outgoing& out) {
#ifdef PSS_TCP_HAS_SENDMSG
        std::size_t done = 0;
        const std::size_t total = out.frame.size();
        while (done < total && fd_ >= 0) {
            iovec iov[6];
            int count = 0;
            std::size_t skip = done;
            for (const auto& b : out.frame.buffers()) {
                if (skip >= b.size()) {
                    skip -= b.size();
                    continue;
                }
                iov[count].iov_base = static_cast<char*>(const_cast<void*>(b.data())) + skip;
                iov[count].iov_len = b.size() - skip;
                skip = 0;
                ++count;
            }
            msghdr message{};
            message.msg_iov = iov;
            message.msg_iovlen = static_cast<decltype(message.msg_iovlen)>(count);
            const ssize_t n = ::sendmsg(fd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                done += static_cast<std::size_t>(n);
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            break;  // would block, or an error that the asynchronous write will report
        }
        return done;
#else
        return 0;
#endif
    }

    /// Writes the queued frames, several in one gather write (strand).
    void write_queued() {
        {
            std::lock_guard lock(mutex_);
            if (state_ != State::connected || queue_.empty()) {
                writing_ = false;
                return;
            }
            buffers_.clear();
            batch_ = 0;
            std::size_t bytes = 0;
            for (const auto& out : queue_) {
                if (batch_ == 16 || (batch_ > 0 && bytes > (256u << 10))) break;
                std::size_t skip = out->written;
                for (const auto& b : out->frame.buffers()) {
                    if (skip >= b.size()) {
                        skip -= b.size();
                        continue;
                    }
                    buffers_.push_back(b + skip);
                    skip = 0;
                }
                bytes += out->frame.size() - out->written;
                ++batch_;
            }
        }
        asio::async_write(socket_, buffers_,
                          [self = shared_from_this()](std::error_code ec, std::size_t) { self->on_written(ec); });
    }

    void on_written(std::error_code ec) {
        if (ec) return fail(lost(ec));
        std::vector<std::pair<std::promise<Reply>, Reply>> answered;
        bool more = false;
        {
            std::lock_guard lock(mutex_);
            if (state_ == State::closed) return;
            for (; batch_ > 0 && !queue_.empty(); --batch_) {
                if (auto it = pending_.find(queue_.front()->id); it != pending_.end()) {
                    it->second.sent = true;
                    if (it->second.early) {
                        it->second.early->payload = std::move(it->second.out->request.payload);
                        answered.emplace_back(std::move(it->second.promise), std::move(*it->second.early));
                        pending_.erase(it);
                    }
                }
                queue_.pop_front();
            }
            more = !queue_.empty();
            if (!more) writing_ = false;
        }
        for (auto& [promise, reply] : answered) promise.set_value(std::move(reply));
        if (more) write_queued();
    }

    std::string lost(std::error_code ec) const {
        return "pss: TcpTransport: the connection to " + task_.to_string() + " at " + address_text() +
               " was lost (" + ec.message() + "); a request in flight may or may not have been applied";
    }

    // ---- reading (strand) ----

    void read_header() {
        ahead_.read_header(socket_, header_bytes_, [self = shared_from_this()](std::error_code ec) { self->on_header(ec); });
    }

    void on_header(std::error_code ec) {
        if (ec) return fail(lost(ec));
        try {
            header_ = decode_header(header_bytes_, options_.limits);
            if (!header_.is_reply())
                throw WireError("pss: wire: a request frame came back from " + task_.to_string() +
                                "; a client takes replies only");
        } catch (const WireError& e) {
            return fail(std::string(e.what()) + " (from " + task_.to_string() + " at " + address_text() + ")");
        }
        ahead_.fill(socket_, body_buffers(header_, body_),
                    [self = shared_from_this()](std::error_code ec2) { self->on_body(ec2); });
    }

    void on_body(std::error_code ec) {
        if (ec) return fail(lost(ec));
        try {
            decode_body(header_bytes_, header_, body_, options_.limits);
        } catch (const WireError& e) {
            return fail(std::string(e.what()) + " (from " + task_.to_string() + " at " + address_text() + ")");
        }
        target_.reset();
        incoming_ = Tensor{};
        if (!header_.has_payload() || header_.payload_elided()) return on_payload({});
        {
            // A read lands in the buffer its request offered, when it fits.
            std::lock_guard lock(mutex_);
            if (auto it = pending_.find(header_.request_id); it != pending_.end()) {
                const Tensor& buffer = it->second.out->request.payload;
                if (it->second.out->request.op == Op::read && buffer.has_value() && buffer.dtype() == header_.dtype &&
                    buffer.size() == num_elements(body_.shape))
                    target_ = it->second.out;
            }
        }
        Tensor* into = &incoming_;
        if (target_) {
            into = &target_->request.payload;
            reshape_in_place(*into, body_.shape);
        } else {
            incoming_ = payload_buffer(header_, body_);
        }
        if (header_.payload_length == 0) return on_payload({});
        ahead_.fill(socket_, asio::buffer(into->bytes(), static_cast<std::size_t>(header_.payload_length)),
                          [self = shared_from_this()](std::error_code ec2) { self->on_payload(ec2); });
    }

    void on_payload(std::error_code ec) {
        if (ec) return fail(lost(ec));
        Tensor payload = target_ ? std::move(target_->request.payload) : std::move(incoming_);
        target_.reset();
        std::optional<std::promise<Reply>> promise;
        Reply reply = to_reply(header_, body_, std::move(payload));
        {
            std::lock_guard lock(mutex_);
            if (auto it = pending_.find(header_.request_id); it != pending_.end() && !it->second.early) {
                if (header_.payload_elided() && !it->second.sent) {
                    it->second.early = std::move(reply);  // answered by on_written
                } else {
                    // An update's spent payload is handed back from here: its bytes have been written.
                    if (header_.payload_elided()) reply.payload = std::move(it->second.out->request.payload);
                    promise = std::move(it->second.promise);
                    pending_.erase(it);
                }
            }
        }
        if (promise) promise->set_value(std::move(reply));  // else it timed out
        read_header();
    }

    TaskId task_;
    std::function<TcpHostPort()> where_;
    TcpOptions options_;
    TcpStrand strand_;
    asio::ip::tcp::socket socket_;
    std::unique_ptr<asio::ip::tcp::resolver> resolver_;
    asio::steady_timer backoff_timer_;
    asio::steady_timer deadline_timer_;

    // Shared with sending threads, under mutex_.
    std::mutex mutex_;
    State state_ = State::connecting;
    std::string closed_reason_;
    int fd_ = -1;
    std::uint64_t next_id_ = 1;
    std::map<std::uint64_t, Pending> pending_;
    std::deque<std::shared_ptr<Outgoing>> queue_;
    bool writing_ = false;
    bool timer_armed_ = false;

    // The strand's own.
    std::vector<asio::const_buffer> buffers_;
    std::size_t batch_ = 0;
    std::string where_text_;
    Clock::time_point connect_deadline_;
    std::chrono::milliseconds backoff_{1};
    int attempts_ = 0;
    std::array<std::byte, frame_header_size> header_bytes_{};
    TcpReadAhead ahead_;
    FrameHeader header_;
    FrameBody body_;
    Tensor incoming_;
    std::shared_ptr<Outgoing> target_;
};

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
/// Every served task's connections run on one strand, which runs its handler: requests to one task are
/// handled one at a time, in the order they arrive. A bad frame gets an error reply and its connection
/// closed (or only closed, when even its id cannot be trusted); the handler never sees it.
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

    /// @brief Listens on `task`'s address and answers every request that reaches it with `handler`.
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
        auto served = std::make_shared<detail::TcpServedTask>(io_, task, std::move(handler), options_.limits);
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
