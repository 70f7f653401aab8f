// pss/transport/tcp/server.hpp: the served side of a TcpTransport: a task's listener and its connections.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <asio.hpp>

#if __has_include(<sys/resource.h>)
#include <sys/resource.h>
#endif

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/tensor.hpp>
#include <pss/transport/tcp/buffers.hpp>
#include <pss/transport/tcp/options.hpp>
#include <pss/transport/tcp/read_ahead.hpp>
#include <pss/transport/tcp/tls.hpp>
#include <pss/wire.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// Receive buffers of one served task, reused so that a large payload lands in memory whose pages are
/// already mapped (a fresh 64 MB buffer costs about 190 ms of page faults). At most `max_bytes` are kept,
/// so that what a peer once sent is not held after it left. Used on the task's strand only.
class TcpBufferPool {
public:
    explicit TcpBufferPool(std::size_t max_bytes) : max_bytes_(max_bytes) {}

    Tensor take(DType dtype, std::size_t elements) {
        for (auto it = buffers_.begin(); it != buffers_.end(); ++it)
            if (it->dtype() == dtype && it->size() == elements) {
                bytes_ -= it->nbytes();
                Tensor t = std::move(*it);
                buffers_.erase(it);
                return t;
            }
        return {};
    }
    void give(Tensor tensor) {
        if (!tensor.has_value() || tensor.nbytes() < min_bytes || tensor.nbytes() > max_bytes_) return;
        while (!buffers_.empty() && (buffers_.size() == max_buffers || bytes_ + tensor.nbytes() > max_bytes_)) {
            bytes_ -= buffers_.front().nbytes();
            buffers_.pop_front();
        }
        bytes_ += tensor.nbytes();
        buffers_.push_back(std::move(tensor));
    }

private:
    static constexpr std::size_t min_bytes = 64 << 10;  // smaller buffers are cheap to allocate
    static constexpr std::size_t max_buffers = 2;
    std::size_t max_bytes_;
    std::size_t bytes_ = 0;
    std::deque<Tensor> buffers_;
};

/// The connections a served task may keep: `limits.max_connections`, or three quarters of the soft
/// limit of file descriptors (the rest are for files and outgoing connections).
inline std::size_t max_served_connections(const TcpServeLimits& limits) {
    if (limits.max_connections != 0) return limits.max_connections;
#if __has_include(<sys/resource.h>)
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY)
        return std::max<std::size_t>(16, static_cast<std::size_t>(files.rlim_cur) / 4 * 3);
#endif
    return 4096;
}

/// Why `peer` may not make the request `header` (a call named `name`); empty when it may. The chief may
/// make every request. A worker reads and writes the variables that exist (a function a coordinator
/// schedules on it may update any of them, as TensorFlow's may); it does not create, destroy, save or
/// restore them, call functions or shut tasks down. An evaluator only reads. Both may make the
/// configuration handshake. A ps makes no request. Setting the learning rate is the chief's too.
inline std::string role_refusal(const TaskId& peer, const FrameHeader& header, std::string_view name) {
    if (peer.type == "chief") return {};
    const bool worker = peer.type == "worker", reader = worker || peer.type == "evaluator";
    std::string what;
    switch (header.request_kind()) {
        case RequestKind::operation: {
            const Op op = header.op();
            if (reader && (op == Op::read || op == Op::gather)) return {};
            const bool structure = op == Op::create || op == Op::destroy || op == Op::save_shard ||
                                   op == Op::restore_shard || op == Op::commit_restore || op == Op::abort_restore ||
                                   op == Op::set_learning_rate;
            if (worker && !structure) return {};
            what = op_name(op);
            break;
        }
        case RequestKind::call:
            if (reader && name == handshake_call) return {};
            what = "call \"" + std::string(name) + "\"";
            break;
        case RequestKind::shutdown: what = "shutdown"; break;
        case RequestKind::heartbeat: return {};  // any task may ask whether another is alive
    }
    return "pss: TcpTransport: " + peer.to_string() + " may not " + what +
           ": only the chief creates, destroys, saves and restores variables, sets the learning rate, calls "
           "functions and shuts tasks down; a worker reads and writes variables, an evaluator reads them. The request was refused and the "
           "connection closed";
}

class TcpServerConnection;

/// One served task: its listening socket, its handler and the strand every one of its connections runs
/// on, so that its requests are handled one at a time, in the order they arrive.
struct TcpServedTask : std::enable_shared_from_this<TcpServedTask> {
    TcpServedTask(asio::io_context& io, TaskId id, RequestHandler h, const WireLimits& l, const TcpServeLimits& s,
                  TlsContext t)
        : task(std::move(id)),
          handler(std::move(h)),
          limits(l),
          serve(s),
          max_connections(max_served_connections(s)),
          strand(asio::make_strand(io)),
          acceptor(strand),
          accept_timer(strand),
          pool(s.max_pooled_bytes),
          tls(std::move(t)) {}

    void accept();
    void on_accept_error(std::error_code ec);
    /// Closes the oldest connection that has not sent a whole frame yet; false when there is none.
    bool close_oldest_unproven();
    /// Hands the receive budget freed by a finished frame to the connections waiting for it.
    void release_receiving(std::uint64_t bytes);
    void close_all();

    TaskId task;
    RequestHandler handler;
    WireLimits limits;
    TcpServeLimits serve;
    std::size_t max_connections;
    TcpStrand strand;
    asio::ip::tcp::acceptor acceptor;
    asio::steady_timer accept_timer;
    std::chrono::milliseconds accept_backoff{0};
    asio::ip::tcp::endpoint endpoint;  // the bound address, with the port the system chose for port 0
    TcpBufferPool pool;
    TlsContext tls;  // null: plaintext
    std::vector<std::weak_ptr<TcpServerConnection>> connections;  // oldest first
    std::uint64_t receiving_bytes = 0;  // announced bytes of the frames being received
    std::deque<std::weak_ptr<TcpServerConnection>> waiting_to_receive;
    std::size_t unread_reply_bytes = 0;  // queued replies of every connection
    /// Set by close_all, once no thread runs the io context: a late reply is dropped from then on, so that
    /// a handler answering after the transport is gone does not reach its strand.
    std::atomic<bool> stopped{false};
    /// When a chief (any task, over plaintext) last sent this task a whole frame, in steady-clock ticks;
    /// 0 until one has. Read by the task's `join()`, which ends when it is older than the chief timeout.
    std::atomic<std::chrono::steady_clock::rep> chief_heard{0};
};

/// The server side of one connection: reads request frames, runs the task's handler, writes replies.
/// Nothing the peer sends is trusted for memory or time: sections grow as their bytes arrive, a frame
/// must arrive whole within `frame_timeout`, reading stops while too many reply bytes are unread, and a
/// repeated request id is answered from the connection's record, never applied twice.
class TcpServerConnection : public std::enable_shared_from_this<TcpServerConnection> {
public:
    TcpServerConnection(std::shared_ptr<TcpServedTask> task, asio::ip::tcp::socket socket)
        : task_(std::move(task)), stream_(std::move(socket)), timer_(task_->strand) {}

    /// Reads requests; over TLS, once the peer has proved which task it is (the first-frame timeout covers
    /// the handshake).
    void start() {
        std::error_code ignored;
        stream_.socket().non_blocking(true, ignored);
        set_deadline(task_->serve.first_frame_timeout);
#if PSS_HAS_TLS
        if (task_->tls)
            return stream_.secure(*task_->tls)
                .async_handshake(asio::ssl::stream_base::server,
                                 [self = shared_from_this()](std::error_code ec) { self->on_handshake(ec); });
#endif
        read_header();
    }

    void close() {
        if (closed_) return;
        closed_ = true;
        std::error_code ignored;
        timer_.cancel();
        stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
        stream_.socket().close(ignored);
        end_frame();
        task_->unread_reply_bytes -= unread_bytes_;
        unread_bytes_ = 0;
    }

    /// True once the peer has sent a whole frame.
    [[nodiscard]] bool proven() const noexcept { return proven_; }

    /// True while its frame waits for the task's receive budget.
    [[nodiscard]] bool waiting() const noexcept { return waiting_; }
    /// What its frame announces.
    [[nodiscard]] std::uint64_t announced() const noexcept { return announced_bytes(header_); }

    /// Goes on with a frame that waited for the task's receive budget.
    void receive_now() {
        if (closed_) return;
        waiting_ = false;
        receiving_ = announced_bytes(header_);
        task_->receiving_bytes += receiving_;
        read_sections();
    }

private:
    struct PendingWrite {
        Reply reply;
        OutgoingFrame frame;
    };
    struct Outcome {
        std::uint64_t id;
        ErrorCode code;
        std::string message;
    };

    /// Bytes a frame announces beyond its header: what receiving it may cost.
    static std::uint64_t announced_bytes(const FrameHeader& h) noexcept {
        return std::uint64_t{h.descriptor_words} * 8 + h.name_length + h.message_length + h.values_length +
               h.ids_count * sizeof(std::int64_t) + h.payload_length;
    }

    /// Closes the connection unless it makes progress within `after` (0: no limit). Setting or clearing a
    /// deadline costs no system call: the timer, once running, re-arms itself for the deadline it finds
    /// when it fires and stops when there is none, so a stream of small frames does not reprogram it.
    void set_deadline(std::chrono::milliseconds after) {
        if (after.count() <= 0) return clear_deadline();
        deadline_ = asio::steady_timer::clock_type::now() + after;
        if (!timer_running_ || *deadline_ < timer_.expiry()) run_timer();
    }
    void clear_deadline() noexcept { deadline_.reset(); }

    void run_timer() {
        timer_running_ = true;
        timer_.expires_at(*deadline_);
        timer_.async_wait([self = shared_from_this()](std::error_code ec) {
            if (ec) return;  // re-armed for an earlier deadline, or closed
            self->timer_running_ = false;
            if (self->closed_ || !self->deadline_) return;
            if (asio::steady_timer::clock_type::now() >= *self->deadline_) return self->close();
            self->run_timer();
        });
    }

#if PSS_HAS_TLS
    /// A peer without a certificate of the cluster's CA naming a task has failed the handshake already.
    void on_handshake(std::error_code ec) {
        if (ec || closed_) return close();
        peer_ = peer_task(stream_.tls()->native_handle());
        if (!peer_) return close();
        read_header();
    }
#endif

    void read_header() {
        ahead_.read_header(stream_, header_bytes_, [self = shared_from_this()](std::error_code ec) { self->on_header(ec); });
    }

    void on_header(std::error_code ec) {
        if (ec || closed_) return close();
        try {
            header_ = decode_header(header_bytes_, task_->limits);
            if (header_.is_reply())
                throw WireError("pss: wire: a reply frame reached the server of task " + task_->task.to_string() +
                                    "; a server takes requests only",
                                header_.request_id);
        } catch (const WireError& e) {
            return refuse(e);
        }
        set_deadline(task_->serve.frame_timeout);
        const std::uint64_t need = announced_bytes(header_);
        if (task_->receiving_bytes != 0 && task_->receiving_bytes + need > task_->serve.max_receiving_bytes) {
            waiting_ = true;  // until release_receiving hands it the budget (the frame timeout runs)
            task_->waiting_to_receive.push_back(weak_from_this());
            flush_held_replies();  // replies held for this frame leave now
            return;
        }
        receive_now();
    }

    /// Reads the sections (descriptors, name, message, values, ids). Small ones in one read; large ones
    /// grow as their bytes arrive, so that a header announcing 16 Mi ids costs memory only for the ids
    /// that come.
    void read_sections() {
        const std::uint64_t sections = announced_bytes(header_) - header_.payload_length;
        if (sections <= growth_bytes)
            return ahead_.fill(stream_, body_buffers(header_, body_),
                               [self = shared_from_this()](std::error_code ec) { self->on_body(ec); });
        body_.descriptor_bytes.clear();
        body_.name.clear();
        body_.message.clear();
        body_.values.clear();
        body_.ids.clear();
        grow_sections({});
    }

    void grow_sections(std::error_code ec) {
        if (ec || closed_) return close();
        asio::mutable_buffer more;
        if (!grow(body_.descriptor_bytes, std::size_t{header_.descriptor_words} * 8, more) &&
            !grow(body_.name, header_.name_length, more) && !grow(body_.message, header_.message_length, more) &&
            !grow(body_.values, header_.values_length, more) &&
            !grow(body_.ids, static_cast<std::size_t>(header_.ids_count), more))
            return on_body({});
        ahead_.fill(stream_, more, [self = shared_from_this()](std::error_code ec2) { self->grow_sections(ec2); });
    }

    /// Lengthens `section` towards `size` elements by at most its length so far (at least 64 KiB); false
    /// when it is whole already.
    template <class Section>
    static bool grow(Section& section, std::size_t size, asio::mutable_buffer& more) {
        using Element = typename Section::value_type;
        const std::size_t have = section.size();
        if (have == size) return false;
        section.resize(std::min(size, have + std::max(have, growth_bytes / sizeof(Element))));
        more = asio::buffer(section.data() + have, (section.size() - have) * sizeof(Element));
        return true;
    }

    void on_body(std::error_code ec) {
        if (ec || closed_) return close();
        try {
            decode_body(header_bytes_, header_, body_, task_->limits);
        } catch (const WireError& e) {
            return refuse(e);
        }
        if (header_.has_values()) {  // a call's tensors
            incoming_values_ = value_tensors(header_, body_);
            if (header_.payload_length == 0) return on_payload({});
            return ahead_.fill(stream_, tensor_buffers(incoming_values_),
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
        // Uninitialised: its pages are mapped as the bytes arrive, not at once.
        incoming_ = payload_buffer(header_, body_, std::move(reuse));
        if (header_.payload_length == 0) return on_payload({});
        ahead_.fill(stream_, asio::buffer(incoming_.bytes(), static_cast<std::size_t>(header_.payload_length)),
                    [self = shared_from_this()](std::error_code ec2) { self->on_payload(ec2); });
    }

    /// The frame is whole, or abandoned: its receive budget goes to those waiting.
    void end_frame() {
        waiting_ = false;  // its entry in the waiting queue is skipped
        if (receiving_ != 0) {
            const std::uint64_t freed = receiving_;
            receiving_ = 0;
            task_->release_receiving(freed);
        }
    }

    void on_payload(std::error_code ec) {
        if (ec || closed_) return close();
        try {
            decode_wire_tensors(header_, incoming_, incoming_values_);
        } catch (const WireError& e) {
            return refuse(e);
        }
        proven_ = true;
        clear_deadline();
        end_frame();
        if (!peer_ || peer_->type == "chief")
            task_->chief_heard.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                                     std::memory_order_relaxed);
        // Only a shard operation's reply may hand the spent request payload back (elided).
        const bool hands_back = header_.request_kind() == RequestKind::operation && !reply_carries_value(header_.op());
        const std::uint64_t id = header_.request_id;
        if (header_.task != static_cast<std::uint32_t>(task_->task.index)) {
            answer(id, hands_back, false,
                   Reply::error(ErrorCode::invalid_argument,
                                "pss: TcpTransport: a request for task index " + std::to_string(header_.task) +
                                    " reached another task (which one is not told); the sender's cluster spec "
                                    "gives this address to another task"));
        } else if (std::string refusal = peer_ ? role_refusal(*peer_, header_, body_.name) : std::string();
                   !refusal.empty()) {
            std::fprintf(stderr, "pss: %s refused a request from %s: %s\n", task_->task.to_string().c_str(),
                         peer_address().c_str(), refusal.c_str());
            return refuse(id, ErrorCode::permission_denied, std::move(refusal));
        } else if (header_.request_kind() == RequestKind::heartbeat) {
            // Answered here, not by the handler: a task whose handler is busy (a worker running a long
            // step on its call thread) still shows it is alive.
            last_id_ = std::max(last_id_.value_or(id), id);
            answer(id, false, false, Reply{});
        } else if (last_id_ && id <= *last_id_ && !rerun_repeat()) {
            answer_repeat(id);
        } else {
            last_id_ = std::max(last_id_.value_or(id), id);
            // Only what changes state is recorded: a repeated read or gather runs again.
            const bool record = !rerun_repeat();
            // A pull asked for its value compressed: the reply frame narrows it.
            const Compression wire = header_.request_kind() == RequestKind::operation && reply_carries_value(header_.op())
                                          ? header_.compression()
                                          : Compression::none;
            // The reply goes out through the task's strand whenever the handler answers: at once (the
            // dispatch runs inline, on this strand) or later from any thread.
            Responder respond([self = shared_from_this(), id, hands_back, record, wire](Reply&& reply) {
                if (self->task_->stopped.load(std::memory_order_acquire)) return;
                reply.compression = wire;
                asio::dispatch(self->task_->strand, [self, id, hands_back, record, reply = std::move(reply)]() mutable {
                    self->answer(id, hands_back, record, std::move(reply));
                });
            });
            // With the next frame read ahead already, a reply given at once waits for it: the replies
            // to a burst of pipelined requests leave in one write (a sendmsg per 96-byte reply had
            // 1,000 pushes in flight at 0.5 to 0.8x ps-lite's rate).
            hold_writes_ = ahead_.holds_header();
            try {
                Request request = to_request(header_, body_, std::move(incoming_), std::move(incoming_values_));
                request.sender = peer_;
                task_->handler(std::move(request), std::move(respond));
            } catch (...) {
                // A handler must not throw; one that does has dropped its Responder, which answered
                // unavailable. The connection and the task go on.
            }
            hold_writes_ = false;
        }
        incoming_ = Tensor{};
        incoming_values_.clear();
        if (closed_) return;
        // Held replies leave once no read-ahead frame follows, or before this connection pauses.
        if (!ahead_.holds_header() || too_much_unread()) flush_held_replies();
        if (too_much_unread()) {
            paused_ = true;  // until the peer reads its replies (on_written), or the timeout closes it
            return set_deadline(task_->serve.unread_reply_timeout);
        }
        read_header();
    }

    /// A repeated id of a read or gather runs again: it changes nothing, and its answer is the value.
    [[nodiscard]] bool rerun_repeat() const noexcept {
        return header_.request_kind() == RequestKind::operation && reply_carries_value(header_.op());
    }

    /// Answers a request id this connection has seen already from the record of its outcome; it is not
    /// applied again (a replayed or duplicated frame has the effect of one).
    void answer_repeat(std::uint64_t id) {
        auto it = std::find_if(recorded_.begin(), recorded_.end(), [id](const Outcome& o) { return o.id == id; });
        if (it != recorded_.end() && header_.request_kind() == RequestKind::operation)
            return queue_reply(id, Reply::error(it->code, it->message), false);
        queue_reply(id,
                    Reply::error(ErrorCode::failed_precondition,
                                 "pss: TcpTransport: request id " + std::to_string(id) + " reached " +
                                     task_->task.to_string() + " again on this connection (ids must increase: " +
                                     std::to_string(*last_id_) + " came already); it was not applied again" +
                                     (it == recorded_.end() ? "" : ", and a call's answer is not kept")),
                    false);
    }

    [[nodiscard]] bool too_much_unread() const noexcept {
        const auto& serve = task_->serve;
        return unread_bytes_ > serve.max_unread_reply_bytes ||
               (unread_bytes_ > 0 && task_->unread_reply_bytes > serve.max_task_unread_reply_bytes);
    }

    /// Queues the reply to request `id` (strand); `record`: kept for a repeat of the id.
    void answer(std::uint64_t id, bool hands_back, bool record, Reply reply) {
        if (closed_) return;
        if (record && task_->serve.recorded_replies != 0) {
            if (recorded_.size() == task_->serve.recorded_replies) recorded_.pop_front();
            recorded_.push_back(Outcome{id, reply.code, reply.message});
        }
        // An update's reply payload is the spent request buffer: the client hands its own back.
        const bool elide = hands_back && reply.ok() && reply.payload.has_value();
        queue_reply(id, std::move(reply), elide);
    }

    /// A bad frame: an error reply when its id can be trusted, then (or else at once) the connection closes.
    void refuse(const WireError& e) {
        if (!e.request_id()) return close();
        refuse(*e.request_id(), ErrorCode::invalid_argument, e.what());
    }
    /// The error reply to request `id`, then the connection closes.
    void refuse(std::uint64_t id, ErrorCode code, std::string message) {
        closing_ = true;
        clear_deadline();
        end_frame();
        queue_reply(id, Reply::error(code, std::move(message)), false);
    }

    std::string peer_address() {
        std::error_code ec;
        const auto endpoint = stream_.socket().remote_endpoint(ec);
        std::string where = ec ? std::string("an unknown address") : endpoint.address().to_string() + ":" +
                                                                          std::to_string(endpoint.port());
        return peer_ ? peer_->to_string() + " at " + where : where;
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
        unread_bytes_ += out.frame.size();
        task_->unread_reply_bytes += out.frame.size();
        if (!hold_writes_) flush_held_replies();
    }

    /// Writes the replies waiting to leave, unless a write is running (it writes them when it ends).
    void flush_held_replies() {
        if (!writing_ && !writes_.empty()) write_next();
    }

    void write_next() {
        writing_ = true;
        batch_.gather(writes_, [](const PendingWrite& w) -> const OutgoingFrame& { return w.frame; });
        batch_.write(stream_, [self = shared_from_this()](std::error_code ec) { self->on_written(ec); });
    }

    void on_written(std::error_code ec) {
        for (std::size_t n = batch_.frames(); n > 0; --n) {
            const std::size_t bytes = writes_.front().frame.size();
            if (!closed_) {
                unread_bytes_ -= bytes;
                task_->unread_reply_bytes -= bytes;
            }
            task_->pool.give(std::move(writes_.front().reply.payload));
            writes_.pop_front();
        }
        if (ec || closed_) {
            writes_.clear();
            writing_ = false;
            return close();
        }
        if (paused_ && !too_much_unread()) {
            paused_ = false;
            clear_deadline();
            read_header();
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
        stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
        if (discarded_ > (1u << 20)) return close();
        set_deadline(task_->serve.frame_timeout);
        stream_.async_read_some(asio::buffer(header_bytes_), [self = shared_from_this()](std::error_code ec, std::size_t n) {
            self->discarded_ += n;
            if (ec) return self->close();
            self->linger();
        });
    }

    static constexpr std::size_t growth_bytes = 64u << 10;

    std::shared_ptr<TcpServedTask> task_;
    TcpStream stream_;
    std::optional<TaskId> peer_;  // the task the peer's certificate names (TLS only)
    asio::steady_timer timer_;  // closes the connection at deadline_ (see set_deadline)
    std::optional<asio::steady_timer::time_point> deadline_;  // first frame, frame, unread replies or linger
    bool timer_running_ = false;
    std::array<std::byte, frame_header_size> header_bytes_{};
    TcpReadAhead ahead_;
    FrameHeader header_;
    FrameBody body_;
    Tensor incoming_;
    std::vector<Tensor> incoming_values_;  // a call's tensors
    std::deque<PendingWrite> writes_;
    TcpWriteBatch batch_;
    std::deque<Outcome> recorded_;  // the outcomes of the last state-changing requests, in answer order
    std::optional<std::uint64_t> last_id_;  // the highest request id seen
    std::uint64_t receiving_ = 0;  // this frame's share of the task's receive budget
    std::size_t unread_bytes_ = 0;  // queued reply bytes
    bool writing_ = false;
    bool hold_writes_ = false;  // a handler runs and the next frame is read ahead (see on_payload)
    bool closing_ = false;
    bool closed_ = false;
    bool paused_ = false;
    bool waiting_ = false;
    bool proven_ = false;
    std::size_t discarded_ = 0;
};

inline void TcpServedTask::accept() {
    acceptor.async_accept([self = shared_from_this()](std::error_code ec, asio::ip::tcp::socket socket) {
        if (!self->acceptor.is_open()) return;
        if (ec) return self->on_accept_error(ec);
        self->accept_backoff = std::chrono::milliseconds{0};
        std::erase_if(self->connections, [](const auto& w) { return w.expired(); });
        std::error_code ignored;
        if (self->connections.size() >= self->max_connections && !self->close_oldest_unproven()) {
            socket.close(ignored);  // full of connections that have all sent frames: the newcomer goes
        } else {
            socket.set_option(asio::ip::tcp::no_delay(true), ignored);
            auto connection = std::make_shared<TcpServerConnection>(self, std::move(socket));
            self->connections.push_back(connection);
            connection->start();
        }
        self->accept();
    });
}

inline void TcpServedTask::on_accept_error(std::error_code ec) {
    // Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): the pending connection stays queued,
    // so accepting again at once would fail again at once, a spin at 100% CPU. A connection that has not
    // sent a whole frame yet gives its descriptor up to the newcomer; when there is none, wait a little
    // longer each time (10 ms doubling to 1 s).
    const bool out_of_resources = ec == asio::error::no_descriptors || ec == std::errc::too_many_files_open_in_system ||
                                  ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
    if (!out_of_resources || close_oldest_unproven()) return accept();
    accept_backoff = std::clamp(accept_backoff * 2, std::chrono::milliseconds{10}, std::chrono::milliseconds{1000});
    accept_timer.expires_after(accept_backoff);
    accept_timer.async_wait([self = shared_from_this()](std::error_code ec2) {
        if (!ec2 && self->acceptor.is_open()) self->accept();
    });
}

inline bool TcpServedTask::close_oldest_unproven() {
    for (auto& weak : connections)
        if (auto connection = weak.lock(); connection && !connection->proven()) {
            connection->close();
            weak.reset();
            return true;
        }
    return false;
}

inline void TcpServedTask::release_receiving(std::uint64_t bytes) {
    receiving_bytes -= bytes;
    while (!waiting_to_receive.empty()) {
        auto next = waiting_to_receive.front().lock();
        if (next && !next->waiting()) next.reset();  // closed, or its frame abandoned
        if (!next) {
            waiting_to_receive.pop_front();
            continue;
        }
        if (receiving_bytes != 0 && receiving_bytes + next->announced() > serve.max_receiving_bytes) return;
        waiting_to_receive.pop_front();
        next->receive_now();
    }
}

inline void TcpServedTask::close_all() {
    stopped.store(true, std::memory_order_release);
    std::error_code ignored;
    acceptor.close(ignored);
    accept_timer.cancel();
    waiting_to_receive.clear();
    for (auto& weak : connections)
        if (auto connection = weak.lock()) connection->close();
    connections.clear();
}

}  // namespace detail

PSS_NAMESPACE_END
