// pss/transport/tcp/server.hpp: the served side of a TcpTransport: a task's listener and its connections.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <asio.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/tensor.hpp>
#include <pss/transport/tcp/buffers.hpp>
#include <pss/transport/tcp/options.hpp>
#include <pss/transport/tcp/read_ahead.hpp>
#include <pss/wire.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

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
    /// Set by close_all, once no thread runs the io context: a late reply is dropped from then on, so that
    /// a handler answering after the transport is gone does not reach its strand.
    std::atomic<bool> stopped{false};
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
        if (header_.has_values()) {  // a call's tensors
            incoming_values_ = value_tensors(header_, body_);
            if (header_.payload_length == 0) return on_payload({});
            return ahead_.fill(socket_, tensor_buffers(incoming_values_),
                               [self = shared_from_this()](std::error_code ec2) { self->on_payload(ec2); });
        }
        Tensor reuse;
        if (header_.has_payload()) reuse = task_->pool.take(body_.payload().dtype, num_elements(body_.payload().shape));
        if (header_.payload_elided()) {
            // A read's buffer: offer a reused one of that shape, never a fresh one (a peer could otherwise
            // make this process allocate a gigabyte with a frame of 100 bytes).
            if (reuse.has_value()) reshape_in_place(reuse, body_.payload().shape);
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
        // Only a shard operation's reply may hand the spent request payload back (elided).
        const bool hands_back = header_.request_kind() == RequestKind::operation && !reply_carries_value(header_.op());
        const std::uint64_t id = header_.request_id;
        if (header_.task != static_cast<std::uint32_t>(task_->task.index)) {
            answer(id, hands_back,
                   Reply::error(ErrorCode::invalid_argument,
                                "pss: TcpTransport: a request for task index " + std::to_string(header_.task) +
                                    " of job \"" + task_->task.type + "\" reached " + task_->task.to_string() +
                                    "; the sender's cluster spec gives this address to another task"));
        } else {
            // The reply goes out through the task's strand whenever the handler answers: at once (the
            // dispatch runs inline, on this strand) or later from any thread.
            Responder respond([self = shared_from_this(), id, hands_back](Reply&& reply) {
                if (self->task_->stopped.load(std::memory_order_acquire)) return;
                asio::dispatch(self->task_->strand, [self, id, hands_back, reply = std::move(reply)]() mutable {
                    self->answer(id, hands_back, std::move(reply));
                });
            });
            try {
                task_->handler(to_request(header_, body_, std::move(incoming_), std::move(incoming_values_)),
                               std::move(respond));
            } catch (...) {
                // A handler must not throw; one that does has dropped its Responder, which answered
                // unavailable. The connection and the task go on.
            }
        }
        incoming_ = Tensor{};
        incoming_values_.clear();
        read_header();
    }

    /// Queues the reply to request `id` (strand).
    void answer(std::uint64_t id, bool hands_back, Reply reply) {
        // An update's reply payload is the spent request buffer: the client hands its own back.
        const bool elide = hands_back && reply.ok() && reply.payload.has_value();
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
        batch_.gather(writes_, [](const PendingWrite& w) -> const OutgoingFrame& { return w.frame; });
        batch_.write(socket_, [self = shared_from_this()](std::error_code ec) { self->on_written(ec); });
    }

    void on_written(std::error_code ec) {
        for (std::size_t n = batch_.frames(); n > 0; --n) {
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
    std::vector<Tensor> incoming_values_;  // a call's tensors
    std::deque<PendingWrite> writes_;
    TcpWriteBatch batch_;
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
    stopped.store(true, std::memory_order_release);
    std::error_code ignored;
    acceptor.close(ignored);
    for (auto& weak : connections)
        if (auto connection = weak.lock()) connection->close();
    connections.clear();
}

}  // namespace detail

PSS_NAMESPACE_END
