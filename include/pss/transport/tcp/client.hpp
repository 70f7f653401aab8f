// pss/transport/tcp/client.hpp: TcpClientConnection, the connection from this process to one task: connect, write, read replies.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <poll.h>
#include <unistd.h>

#include <asio.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/detail/reply_batch.hpp>
#include <pss/message.hpp>
#include <pss/tensor.hpp>
#include <pss/transport/tcp/buffers.hpp>
#include <pss/transport/tcp/options.hpp>
#include <pss/transport/tcp/peer_close_watch.hpp>
#include <pss/transport/tcp/read_ahead.hpp>
#include <pss/transport/tcp/tls.hpp>
#include <pss/wire.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// The client side of the connection from this process to one task: created by the first `send`,
/// connected with retries, requests pipelined on it and their replies matched by id.
///
/// Threading rule: everything runs on `strand_` (or, once the transport's threads are joined, on the
/// thread that shuts it down), except `send` and `closed`, which touch only `inbox_` under
/// `inbox_mutex_` (held to append or take requests, never across I/O) and the atomic `closed_`; and
/// a direct exchange. A plaintext link with nothing in flight is parked (`mode_`): no read is armed on
/// it. A request its sender waits for at once (Request::in_process.waited_at_once) then takes the
/// link and makes the exchange on the sender's thread: it writes the frame, sleeps in poll() until the
/// reply comes and reads it, so that a round trip wakes the sender only, as a blocking socket's does
/// (through the strand, it woke the io thread for the request and for the reply, then the sender).
/// Meanwhile the sender owns the strand's state: the strand's handlers first take the link back from
/// a parked one (`own`) and leave a link in an exchange alone; the exchange hands it back when done.
/// A parked link's end (its task died while it was idle) is seen by `TcpPeerCloseWatch`, at once, as
/// a read armed on it would have seen it.
class TcpClientConnection : public std::enable_shared_from_this<TcpClientConnection> {
public:
    using Clock = std::chrono::steady_clock;

    /// `lost_at`: when a connection before this one lost the task. A lost task has the heartbeat timeout
    /// from then to come back (requests wait for it meanwhile); after that a request connects once and
    /// fails at once when the task is not up, so that an error names a dead task within that timeout.
    /// `probe`: one attempt only, from the start (a coordinator asks so whether a lost worker came back).
    /// `parking`: an io context nobody runs, whose reactor holds the socket of a parked link; `watch`
    /// tells it when the peer ends a link.
    TcpClientConnection(asio::io_context& io, asio::io_context& parking, TcpPeerCloseWatch& watch, TaskId task,
                        std::function<TcpHostPort()> where,
                        const TcpOptions& options, TlsContext tls, std::optional<Clock::time_point> lost_at = {},
                        bool probe = false)
        : task_(std::move(task)),
          where_(std::move(where)),
          options_(options),
          tls_(std::move(tls)),
          strand_(asio::make_strand(io)),
          stream_(strand_),
          parked_(parking.get_executor()),
          watch_(watch),
          backoff_timer_(strand_),
          deadline_timer_(strand_),
          heartbeat_timer_(strand_),
          lost_at_(lost_at),
          probe_(probe) {}

    /// Starts connecting (on the strand).
    void start() {
        connect_started_ = Clock::now();
        const auto& t = options_.timeouts;
        const auto wait = lost_at_ && t.heartbeats() ? t.heartbeat_timeout : t.startup;
        connect_deadline_ = wait.count() > 0 ? (lost_at_ ? *lost_at_ : connect_started_) + wait : Clock::time_point::max();
        if (connect_deadline_ <= connect_started_) probe_ = true;  // lost for longer than it had to come back
        next_wait_report_ = connect_started_ + wait_report_interval;
        backoff_ = std::max<Backoff>(options_.connect_backoff_initial, std::chrono::milliseconds(1));
        asio::post(strand_, [self = shared_from_this()] { self->attempt(); });
    }

    [[nodiscard]] bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }
    /// True once the connection ended because the task was lost (its link broke, or it answered no
    /// heartbeat), not because the transport shut down or the cluster ended.
    [[nodiscard]] bool lost_task() const noexcept { return lost_task_.load(std::memory_order_acquire); }
    /// When this connection, or one before it, lost the task, unless it has been connected since.
    [[nodiscard]] std::optional<Clock::time_point> lost_at() const noexcept {
        if (lost_task()) return Clock::time_point(Clock::duration(lost_time_.load(std::memory_order_acquire)));
        if (lost_at_ && !connected_once_.load(std::memory_order_acquire)) return lost_at_;
        return std::nullopt;
    }

    /// Hands `request` to the strand, which writes it once the connection is up; or, when its sender
    /// waits for it at once and the link is parked, makes the exchange on this thread. Empty, and
    /// `request` left as it was, when the parked link turned out closed by its peer (nobody reads a
    /// parked link): the link is being lost, and the request belongs on the next one.
    std::optional<std::future<Reply>> send(Request& request) {
        // Small ones only: a large frame goes through the reactor faster (see TcpWriteBatch::write).
        const bool at_once = request.in_process.waited_at_once && request.payload.nbytes() <= direct_max_bytes;
        // A request for the strand looks at a parked link too: one its peer closed goes on the next.
        if (at_once || mode_.load(std::memory_order_acquire) == parked_mode) {
            switch (take_parked()) {
                case Taken::no: break;
                case Taken::closed_by_peer: return std::nullopt;
                case Taken::yes: {
                    if (!at_once) {  // parked again; the strand takes it back for this request
                        mode_.store(parked_mode, std::memory_order_release);
                        break;
                    }
                    auto [out, future] = outgoing(request);
                    exchange_directly(std::move(out));
                    return std::move(future);
                }
            }
        }
        auto [out, future] = outgoing(request);
        bool first = false;
        {
            std::unique_lock lock(inbox_mutex_);
            if (inbox_closed_) {
                const std::string reason = closed_reason_for_senders_;
                lock.unlock();
                out->answer(Reply::error(ErrorCode::unavailable, reason));
                return std::move(future);
            }
            first = inbox_.empty();
            inbox_.push_back(std::move(out));
        }
        if (first) asio::post(strand_, [self = shared_from_this()] { self->take_inbox(); });
        return std::move(future);
    }

    /// Answers every waiting request with `reason` (unavailable) and closes the socket (strand, or after
    /// the transport's threads are joined).
    void fail(const std::string& reason) {
        if (direct_thread_.load(std::memory_order_acquire) == std::this_thread::get_id()) {
            // A direct exchange's own failure: it answers its request, hands the link back to the
            // strand and has the strand fail it (whose handlers may be using the timers meanwhile).
            if (!direct_failure_) direct_failure_ = reason;
            return;
        }
        std::vector<std::shared_ptr<Outgoing>> inbox;
        {
            std::lock_guard lock(inbox_mutex_);
            if (inbox_closed_) return;
            inbox_closed_ = true;
            closed_reason_for_senders_ = reason;
            inbox.swap(inbox_);
        }
        // No exchange can start now; one in progress sees stopping_ within a poll slice and ends.
        stopping_.store(true, std::memory_order_release);
        { const std::lock_guard exchange_over(direct_mutex_); }
        closed_.store(true, std::memory_order_release);
        state_ = State::closed;
        closed_reason_ = reason;
        watch_.forget(std::exchange(watch_key_, 0));
        std::error_code ignored;
        deadline_timer_.cancel();
        backoff_timer_.cancel();
        heartbeat_timer_.cancel();
        stream_.socket().close(ignored);
        parked_.socket().close(ignored);
        auto pending = std::move(pending_);
        pending_.clear();
        queue_.clear();
        for (auto& [id, p] : pending) p.out->answer(Reply::error(ErrorCode::unavailable, reason));
        for (auto& out : inbox) out->answer(Reply::error(ErrorCode::unavailable, reason));
    }

    /// While connecting, one line every this long says whom this process waits for.
    static constexpr std::chrono::seconds wait_report_interval{5};

private:
    enum class State { connecting, connected, closed };

    /// A request on its way: its frame points into it, and its target (the future send returned, or
    /// the caller's ReplyBatch) is answered exactly once.
    struct Outgoing {
        Request request;
        OutgoingFrame frame;
        std::uint64_t id = 0;
        detail::ReplyTarget target;

        void answer(Reply reply) { target(std::move(reply)); }
        /// Dropped unanswered (its transport stopped before the strand took it): answered unavailable.
        ~Outgoing() { answer(Reply::error(ErrorCode::unavailable, "pss: TcpTransport: the transport stopped before the request was sent")); }
    };

    struct Pending {
        std::shared_ptr<Outgoing> out;
        bool sent = false;
        std::optional<Clock::time_point> deadline;
        /// A reply handing the payload back that was read before this request's write completed (the
        /// two completions race on the strand): kept until the write is done, so that the caller never
        /// gets a buffer a write may still read.
        std::optional<Reply> early;
    };

    std::string address_text() const { return where_text_.empty() ? std::string("?") : where_text_; }

    /// Ends the connection because the task is gone (not because this side shut down): every waiting
    /// request is answered unavailable with `reason`, and the chief's transport says why in one line.
    void lose(const std::string& reason, const std::string& cause) {
        if (state_ == State::closed) return;
        if (state_ == State::connected && !ending_cluster_ && !stopping_.load(std::memory_order_acquire)) {
            lost_time_.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
            lost_task_.store(true, std::memory_order_release);
            if (options_.announce_peers)
                std::fprintf(stderr, "pss: lost %s at %s (%s)\n", task_.to_string().c_str(), address_text().c_str(),
                             cause.c_str());
        }
        fail(reason);
    }
    void lose(std::error_code ec) { lose(lost(ec), "its connection ended: " + ec.message()); }

    std::string lost(std::error_code ec) const {
#if PSS_HAS_TLS
        if (ec.category() == asio::error::get_ssl_category())
            return "pss: TcpTransport: " + task_.to_string() + " at " + address_text() +
                   " ended the TLS link (" + ec.message() +
                   "): it refused this task's certificate, which its CA did not sign, or the link was tampered with";
#endif
        return "pss: TcpTransport: the connection to " + task_.to_string() + " at " + address_text() +
               " was lost (" + ec.message() + "); a request in flight may or may not have been applied";
    }

    // ---- taking requests ----

    /// Moves the requests `send` queued into the write queue, framed and numbered.
    void take_inbox() {
        if (!own()) return;  // a direct exchange hands the inbox to the strand when it is done
        std::vector<std::shared_ptr<Outgoing>> inbox;
        {
            std::lock_guard lock(inbox_mutex_);
            inbox.swap(inbox_);
        }
        const auto now = Clock::now();
        for (auto& out : inbox) {
            if (state_ == State::closed) {
                out->answer(Reply::error(ErrorCode::unavailable, closed_reason_));
                continue;
            }
            if (!number(*out)) continue;
            Pending& pending = pending_[out->id];
            pending.out = out;
            if (state_ == State::connected) start_clock(pending, now);
            queue_.push_back(std::move(out));
        }
        if (state_ == State::connected && !writing_) write_queued();
        if (state_ == State::connected && !pending_.empty() && !reading_) read_header();
        (void)park_if_idle();
    }

    /// Gives `out` its id and frame; false when the wire cannot carry it (a rank above 8), answered so.
    bool number(Outgoing& out) {
        out.id = next_id_++;
        if (out.request.kind == RequestKind::shutdown) ending_cluster_ = true;  // its end is no loss
        // A read's payload is the buffer the value should land in: it stays here, only its shape travels.
        const bool elide = out.request.kind == RequestKind::operation && out.request.op == Op::read &&
                           out.request.payload.has_value();
        try {
            out.frame = OutgoingFrame::request(out.request, out.id, static_cast<std::uint32_t>(task_.index), elide);
        } catch (const Error& e) {
            out.answer(Reply::error(e.code(), e.what()));
            return false;
        }
        return true;
    }

    // ---- who holds the link ----

    static std::pair<std::shared_ptr<Outgoing>, std::future<Reply>> outgoing(Request& request) {
        auto out = std::make_shared<Outgoing>();
        auto [target, future] = detail::ReplyTarget::of(request);
        out->request = std::move(request);
        out->target = std::move(target);
        return {std::move(out), std::move(future)};
    }

    enum class Taken { no, yes, closed_by_peer };

    /// Takes a parked link for a direct exchange on this thread. Not past a request still in the inbox
    /// (requests keep their order), nor a link that is closing, nor one its peer ended (the strand
    /// reads the end and loses the task, see on_peer_closed).
    Taken take_parked() {
        std::lock_guard lock(inbox_mutex_);
        if (peer_closed_.load(std::memory_order_acquire)) return Taken::closed_by_peer;
        int parked = parked_mode;
        if (inbox_closed_ || !inbox_.empty() ||
            !mode_.compare_exchange_strong(parked, direct_mode, std::memory_order_acquire))
            return Taken::no;
        return Taken::yes;
    }

    /// The watch saw the peer end the link (an io thread): the strand reads the end, which loses the task.
    /// A link in a direct exchange reads it there, or is handed back to the strand, not parked.
    void on_peer_closed() {
        peer_closed_.store(true, std::memory_order_release);
        asio::post(strand_, [self = shared_from_this()] {
            if (self->own() && self->state_ == State::connected && !self->reading_) self->read_header();
        });
    }

    /// On the strand: takes the link back when it is parked; false while a direct exchange holds it.
    bool own() {
        int mode = mode_.load(std::memory_order_acquire);
        while (mode == parked_mode)
            if (mode_.compare_exchange_weak(mode, strand_mode, std::memory_order_acquire)) {
                move_socket(false);
                return true;
            }
        return mode == strand_mode;
    }

    /// Moves the socket to the parking reactor (`parked_`), or back to the strand's. Registered with
    /// the strand's reactor, a parked socket woke an io thread (epoll) for every reply a direct exchange
    /// read: a wake-up per round trip, for nothing.
    void move_socket(bool to_parking) {
        if (socket_parked_ == to_parking) return;
        auto& from = to_parking ? stream_.socket() : parked_.socket();
        auto& to = to_parking ? parked_.socket() : stream_.socket();
        std::error_code ec;
        const auto fd = from.release(ec);
        if (ec) return;  // it stays where it is, and works there
        socket_parked_ = to_parking;
        to.assign(protocol_, fd, ec);
        if (ec) {
            ::close(fd);  // the link is broken: its next read or write says so
            return;
        }
        to.non_blocking(true, ec);
    }

    /// Where the socket is now.
    TcpStream& io_stream() noexcept { return socket_parked_ ? parked_ : stream_; }

    /// On the strand: parks a plaintext link with nothing in flight and no read armed, so that the next
    /// request waited for at once can be exchanged on its sender's thread; true when it did. The strand's
    /// state is no longer the strand's then: the caller touches nothing after it.
    bool park_if_idle() {
        if (state_ != State::connected || watch_key_ == 0 || peer_closed_.load(std::memory_order_acquire) || reading_ ||
            !pending_.empty() || !queue_.empty() || writing_ || ahead_.holds_bytes())
            return false;
        move_socket(true);
        mode_.store(parked_mode, std::memory_order_release);
        return true;
    }

    /// Makes the exchange of `out` on this thread, which holds the link (mode_ is direct_mode): writes
    /// its frame, waits for its reply in poll() and reads it through the strand's own decoding. A reply
    /// that has not begun within the heartbeat interval is left to the strand (which answers heartbeats
    /// meanwhile); one that has not within the request timeout is answered timed out, and its late
    /// reply dropped by the strand.
    void exchange_directly(std::shared_ptr<Outgoing> out) {
        std::unique_lock exchange(direct_mutex_);
        direct_thread_.store(std::this_thread::get_id(), std::memory_order_release);
        direct_ = true;
        const auto started = Clock::now();
        enum class End { done, strand_reads, failed } end = End::done;
        if (number(*out)) {
            const std::uint64_t id = out->id;
            Pending& pending = pending_[id];
            pending.out = out;
            pending.sent = true;
            std::error_code ec = write_directly(out->frame);
            if (!ec) ec = wait_readable(started, true);
            if (ec == asio::error::in_progress) {
                end = End::strand_reads;  // a slow reply: the strand reads it and answers heartbeats meanwhile
            } else if (ec == asio::error::timed_out) {
                pending_.erase(id);
                out->answer(Reply::error(ErrorCode::unavailable, "pss: request to " + task_.to_string() + " timed out after " +
                                                                     format_seconds(options_.timeouts.request)));
                end = End::strand_reads;  // its late reply is read and dropped there
            } else if (ec == asio::error::operation_aborted) {
                end = End::failed;  // the transport shuts down: fail() waits for this exchange
            } else {
                // The decoding answers the request, or fails the link; a late reply to a request that
                // timed out before the link parked may come first, and is dropped.
                const auto wait = [this] { return wait_readable(Clock::now(), false); };
                on_header(ec ? ec : ahead_.read_header_now(io_stream(), header_bytes_, wait));
                while (!direct_failure_ && state_ == State::connected && pending_.contains(id))
                    on_header(ahead_.read_header_now(io_stream(), header_bytes_, wait));
                if (direct_failure_) end = End::failed;
            }
            if (end == End::failed) {
                if (auto it = pending_.find(id); it != pending_.end()) {
                    pending_.erase(it);
                    std::string reason = direct_failure_ ? *direct_failure_ : std::string();
                    if (reason.empty()) {
                        std::lock_guard lock(inbox_mutex_);
                        reason = closed_reason_for_senders_;
                    }
                    out->answer(Reply::error(ErrorCode::unavailable, reason));
                }
            }
        }
        out.reset();
        direct_ = false;
        direct_thread_.store(std::thread::id(), std::memory_order_release);
        // Hand the link back: parked again when nothing else wants it, else to the strand.
        std::optional<std::string> failure = std::exchange(direct_failure_, std::nullopt);
        bool post = false;
        {
            std::lock_guard lock(inbox_mutex_);
            const bool idle = end == End::done && !inbox_closed_ && inbox_.empty() && !ahead_.holds_bytes() &&
                              !peer_closed_.load(std::memory_order_acquire);
            if (!idle && !inbox_closed_) move_socket(false);
            mode_.store(idle ? parked_mode : strand_mode, std::memory_order_release);
            post = !inbox_closed_ && !idle;
        }
        exchange.unlock();
        if (!post) return;
        asio::post(strand_, [self = shared_from_this(), failure = std::move(failure), started] {
            if (failure) return self->fail(*failure);
            if (!self->own() || self->state_ != State::connected) return;
            for (auto& [id, pending] : self->pending_)
                if (!pending.deadline) self->start_clock(pending, started);
            if (!self->reading_) self->read_header();  // the reply, or a timed-out one's late reply
            self->take_inbox();
        });
    }

    /// Writes `frame` on this thread (a direct exchange's).
    std::error_code write_directly(const OutgoingFrame& frame) {
        std::vector<asio::const_buffer> buffers;
        frame.append_buffers(buffers);
        for (std::size_t done = 0, left = frame.size(); left != 0;) {
            std::error_code ec;
            const std::size_t n = asio::write(io_stream().socket(), buffers_after<asio::const_buffer>(buffers, done), TransferAll{}, ec);
            done += n;
            left -= n;
            if (ec == asio::error::would_block || ec == asio::error::try_again) {
                if (left == 0) break;
                ec = poll_socket(POLLOUT, poll_slice);
                if (ec == asio::error::would_block) ec = {};
            }
            if (ec) return ec;
            if (stopping_.load(std::memory_order_acquire)) return asio::error::operation_aborted;
        }
        return {};
    }

    /// Waits on this thread until the socket is readable. Before the reply's first byte (`first`), for
    /// the request timeout (then timed_out) and the heartbeat interval (then in_progress: the strand
    /// takes over); within a frame, for the heartbeat timeout (then timed_out, which loses the task).
    /// operation_aborted when the transport shuts down.
    std::error_code wait_readable(Clock::time_point since, bool first) {
        const auto& t = options_.timeouts;
        for (;;) {
            if (stopping_.load(std::memory_order_acquire)) return asio::error::operation_aborted;
            const auto now = Clock::now();
            Clock::time_point until = Clock::time_point::max();
            if (first && t.request.count() > 0) {
                if (now >= since + t.request) return asio::error::timed_out;
                until = since + t.request;
            }
            if (t.heartbeats()) {
                const auto bound = since + (first ? Clock::duration(t.heartbeat_interval) : Clock::duration(t.heartbeat_timeout));
                if (now >= bound) return first ? asio::error::in_progress : asio::error::timed_out;
                until = std::min(until, bound);
            }
            const auto slice = std::min<Clock::duration>(poll_slice, until - now);
            const std::error_code ec = poll_socket(POLLIN, std::chrono::ceil<std::chrono::milliseconds>(slice));
            if (ec != asio::error::would_block) return ec;
        }
    }

    /// poll() on the socket for `events`, at most `slice`: would_block when it did not come.
    std::error_code poll_socket(short events, std::chrono::milliseconds slice) {
        pollfd p{io_stream().socket().native_handle(), events, 0};
        const int n = ::poll(&p, 1, static_cast<int>(slice.count()));
        if (n > 0) return {};
        if (n == 0 || errno == EINTR) return asio::error::would_block;
        return std::error_code(errno, std::system_category());
    }

    // ---- connecting ----

    void attempt() {
        if (state_ == State::closed) return;
        TcpHostPort where;
        try {
            where = where_();
        } catch (const Error& e) {
            return fail(e.what());
        }
        where_host_ = where.host;
        where_text_ = where.host + ":" + std::to_string(where.port);
        stream_.plain();  // the last attempt's TLS, if any, is over
        bound_attempt();
        std::error_code ec;
        const auto address = asio::ip::make_address(where.host == "localhost" ? "127.0.0.1" : where.host, ec);
        if (!ec) {
            stream_.socket().async_connect(asio::ip::tcp::endpoint(address, where.port),
                                  [self = shared_from_this()](std::error_code ec2) { self->on_connect(ec2); });
            return;
        }
        resolver_ = std::make_unique<asio::ip::tcp::resolver>(strand_);
        resolver_->async_resolve(
            where.host, std::to_string(where.port),
            [self = shared_from_this()](std::error_code ec2, asio::ip::tcp::resolver::results_type results) {
                self->unresolved_ = static_cast<bool>(ec2);
                if (ec2) return self->retry(self->end_attempt(ec2));
                asio::async_connect(self->stream_.socket(), results,
                                    [self](std::error_code ec3, const asio::ip::tcp::endpoint&) { self->on_connect(ec3); });
            });
    }

    /// One attempt (resolving, connecting, the TLS handshake) has the time the connect timeout leaves
    /// (a probe's one attempt: the heartbeat timeout), at most 10 s: a host whose link is down answers
    /// nothing, and a peer may accept and never answer; then the attempt ends with `timed_out`.
    void bound_attempt() {
        attempting_ = true;
        const Clock::duration budget = probe_ ? Clock::duration(options_.timeouts.heartbeats()
                                                                     ? options_.timeouts.heartbeat_timeout
                                                                     : std::chrono::seconds(10))
                                              : connect_deadline_ - Clock::now();
        backoff_timer_.expires_after(std::min<Clock::duration>(
            std::chrono::seconds(10), std::max<Clock::duration>(budget, std::chrono::milliseconds(100))));
        backoff_timer_.async_wait([self = shared_from_this()](std::error_code ec) {
            if (ec || !self->attempting_) return;
            self->attempt_timed_out_ = true;
            if (self->resolver_) self->resolver_->cancel();
            std::error_code ignored;
            self->stream_.socket().close(ignored);  // the connect or handshake ends with an error
        });
    }

    /// The attempt's end, with `ec` as it should be reported (an attempt its timer ended timed out).
    std::error_code end_attempt(std::error_code ec) {
        attempting_ = false;
        backoff_timer_.cancel();
        if (ec && attempt_timed_out_) ec = asio::error::timed_out;
        attempt_timed_out_ = false;
        return ec;
    }

    void on_connect(std::error_code ec) {
        if (state_ == State::closed) return;
        if (ec) return retry(end_attempt(ec));
        std::error_code ignored;
        stream_.socket().set_option(asio::ip::tcp::no_delay(true), ignored);
        stream_.socket().non_blocking(true, ignored);
        protocol_ = stream_.socket().local_endpoint(ignored).protocol();
#if PSS_HAS_TLS
        if (tls_) {
            return stream_.secure(*tls_).async_handshake(
                asio::ssl::stream_base::client, [self = shared_from_this()](std::error_code ec2) { self->on_handshake(ec2); });
        }
#endif
        connected();
    }

#if PSS_HAS_TLS
    /// The peer must prove it is the task this connection is for: a certificate of the cluster's CA
    /// (checked by the handshake) that names that task.
    void on_handshake(std::error_code ec) {
        ec = end_attempt(ec);
        if (state_ == State::closed) return;
        if (ec && ec.category() == asio::error::get_ssl_category()) {
            // The verification's own reason says more than the first error OpenSSL queued.
            const long verified = SSL_get_verify_result(stream_.tls()->native_handle());
            return fail("pss: TcpTransport: the TLS handshake with " + task_.to_string() + " at " + address_text() +
                        " failed (" +
                        (verified != X509_V_OK ? X509_verify_cert_error_string(verified) : ec.message()) +
                        "): its certificate is not signed by this task's CA, or it refused this task's");
        }
        if (ec) return retry(ec);
        const auto peer = peer_task(stream_.tls()->native_handle());
        if (peer != task_)
            return fail("pss: TcpTransport: the task at " + address_text() + " presented a certificate for " +
                        (peer ? peer->to_string() : std::string("no task")) + ", not for " + task_.to_string() +
                        "; the cluster spec and the certificates disagree");
        connected();
    }
#endif

    void connected() {
        (void)end_attempt({});
        state_ = State::connected;
        connected_once_.store(true, std::memory_order_release);
        const auto now = Clock::now();
        if (lost_at_ && options_.announce_peers)
            std::fprintf(stderr, "pss: %s at %s is back\n", task_.to_string().c_str(), address_text().c_str());
        for (auto& [id, p] : pending_) start_clock(p, now);
        last_heard_ = now;
        if (!tls_)  // a TLS link never parks: its armed read sees the end
            watch_key_ = watch_.watch(stream_.socket().native_handle(), [weak = weak_from_this()] {
                if (auto self = weak.lock()) self->on_peer_closed();
            });
        arm_heartbeat();
        write_queued();
        read_header();  // the first reply, or the peer's end, is read through the strand
    }

    // ---- heartbeats ----

    void arm_heartbeat() {
        if (!options_.timeouts.heartbeats()) return;
        heartbeat_timer_.expires_after(options_.timeouts.heartbeat_interval);
        heartbeat_timer_.async_wait([self = shared_from_this()](std::error_code ec) { self->on_heartbeat_timer(ec); });
    }

    /// Every interval: a peer asked and silent since for the heartbeat timeout is lost; else, unless a
    /// heartbeat is unanswered, it is asked again. Any frame from it counts as an answer.
    void on_heartbeat_timer(std::error_code ec) {
        if (ec) return;
        if (!own()) return arm_heartbeat();  // a direct exchange is an answer of its own
        if (state_ != State::connected) return;
        const auto now = Clock::now();
        if (heartbeat_id_) {
            if (now - std::max(heartbeat_sent_, last_heard_) >= options_.timeouts.heartbeat_timeout)
                return lose("pss: TcpTransport: " + task_.to_string() + " at " + address_text() +
                                " answered no heartbeat for " + format_seconds(options_.timeouts.heartbeat_timeout) +
                                ": it is dead, frozen or cut off (PSS_HEARTBEAT_TIMEOUT sets the wait); a request "
                                "in flight may or may not have been applied",
                            "no heartbeat answered for " + format_seconds(options_.timeouts.heartbeat_timeout));
        } else {
            auto out = std::make_shared<Outgoing>();
            out->request.kind = RequestKind::heartbeat;
            out->id = next_id_++;
            out->frame = OutgoingFrame::request(out->request, out->id, static_cast<std::uint32_t>(task_.index), false);
            pending_[out->id].out = out;  // no deadline: the heartbeat timeout is its own
            queue_.push_back(std::move(out));
            heartbeat_id_ = next_id_ - 1;
            heartbeat_sent_ = now;
            if (!writing_) write_queued();
            if (!reading_) read_header();
        }
        arm_heartbeat();
    }

    void retry(std::error_code ec) {
        if (state_ == State::closed) return;
        ++attempts_;
        std::error_code ignored;
        stream_.socket().close(ignored);
        const auto now = Clock::now();
        if (probe_)
            return fail("pss: TcpTransport: " + task_.to_string() + " at " + address_text() + " is not up (" +
                        failure_text(ec) + ")" + (lost_at_ ? "; it was lost and has not come back" : ""));
        if (now >= connect_deadline_ && lost_at_)
            return fail("pss: TcpTransport: " + task_.to_string() + " at " + address_text() +
                        " was lost and did not come back within " +
                        format_seconds(options_.timeouts.heartbeats() ? options_.timeouts.heartbeat_timeout
                                                                      : options_.timeouts.startup) +
                        " (" + std::to_string(attempts_) + " attempts; last: " + failure_text(ec) +
                        "); PSS_HEARTBEAT_TIMEOUT sets how long a lost task has to come back");
        if (now >= connect_deadline_)
            return fail("pss: TcpTransport: could not connect to " + task_.to_string() + " at " + address_text() +
                        " within the start-up timeout of " + format_seconds(options_.timeouts.startup) + " (" +
                        std::to_string(attempts_) + " attempts; last: " + failure_text(ec) +
                        "). Is the task running, at that address? PSS_STARTUP_TIMEOUT sets the wait");
        if (now >= next_wait_report_) {
            next_wait_report_ = now + wait_report_interval;
            const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - connect_started_);
            std::fprintf(stderr, "pss: waiting for %s at %s (attempt %d, %lld s%s)\n", task_.to_string().c_str(),
                         address_text().c_str(), attempts_, static_cast<long long>(waited.count()),
                         unresolved_ ? ("; " + failure_text(ec)).c_str() : "");
        }
        const auto wait = std::min<Clock::duration>(std::chrono::ceil<std::chrono::microseconds>(backoff_),
                                                    connect_deadline_ - now);
        // In fractional milliseconds: rounded to whole ones, 1 ms x 1.3 would stay 1 ms for ever.
        backoff_ = std::min<Backoff>(options_.connect_backoff_max, backoff_ * options_.connect_backoff_factor);
        backoff_timer_.expires_after(wait);
        backoff_timer_.async_wait([self = shared_from_this()](std::error_code ec2) {
            if (!ec2) self->attempt();
        });
    }

    /// Why an attempt failed, naming the host when its name did not resolve (a typo in TF_CONFIG, or a
    /// Kubernetes service whose DNS name is not published yet).
    std::string failure_text(std::error_code ec) const {
        if (!unresolved_) return ec.message();
        return "the host name \"" + where_host_ + "\" does not resolve: " + ec.message();
    }

    // ---- deadlines ----

    void start_clock(Pending& pending, Clock::time_point now) {
        if (options_.timeouts.request.count() <= 0) return;
        pending.deadline = now + options_.timeouts.request;
        if (timer_armed_) return;  // it fires at an earlier deadline, then re-arms for the next
        timer_armed_ = true;
        deadline_timer_.expires_at(*pending.deadline);
        deadline_timer_.async_wait([self = shared_from_this()](std::error_code ec) { self->on_deadline(ec); });
    }

    void on_deadline(std::error_code ec) {
        if (ec == asio::error::operation_aborted) return;
        if (!own()) {  // a direct exchange holds the link (and keeps its own deadline): look again soon
            deadline_timer_.expires_after(poll_slice);
            deadline_timer_.async_wait([self = shared_from_this()](std::error_code ec2) { self->on_deadline(ec2); });
            return;
        }
        timer_armed_ = false;
        if (state_ == State::closed) return;
        const auto now = Clock::now();
        // Ids grow with the strand's taking order, and so do deadlines: the overdue requests come first.
        // A heartbeat has no deadline (the heartbeat timeout is its own) and is passed over.
        std::vector<std::shared_ptr<Outgoing>> expired;
        std::optional<Clock::time_point> next;
        for (auto it = pending_.begin(); it != pending_.end();) {
            if (!it->second.deadline) {
                ++it;
                continue;
            }
            if (*it->second.deadline > now) {
                next = *it->second.deadline;
                break;
            }
            if (it->second.early)  // answered, its write still not complete: the answer without the buffer
                it->second.out->answer(std::move(*it->second.early));
            else
                expired.push_back(it->second.out);
            it = pending_.erase(it);
        }
        if (next) {
            timer_armed_ = true;
            deadline_timer_.expires_at(*next);
            deadline_timer_.async_wait([self = shared_from_this()](std::error_code ec2) { self->on_deadline(ec2); });
        }
        for (auto& out : expired)
            out->answer(Reply::error(ErrorCode::unavailable, "pss: request to " + task_.to_string() + " timed out after " +
                                                                 format_seconds(options_.timeouts.request)));
        (void)park_if_idle();
    }

    // ---- writing ----

    /// Writes the queued frames, several in one gather write (a small batch at once, see TcpWriteBatch).
    void write_queued() {
        if (state_ != State::connected || queue_.empty()) {
            writing_ = false;
            return;
        }
        writing_ = true;
        batch_.gather(queue_, [](const std::shared_ptr<Outgoing>& out) -> const OutgoingFrame& { return out->frame; });
        batch_.write(stream_, [self = shared_from_this()](std::error_code ec) { self->on_written(ec); });
    }

    void on_written(std::error_code ec) {
        if (state_ == State::closed) return;
        if (ec) return lose(ec);
        for (std::size_t n = batch_.frames(); n > 0 && !queue_.empty(); --n) {
            if (auto it = pending_.find(queue_.front()->id); it != pending_.end()) {
                it->second.sent = true;
                if (it->second.early) {
                    it->second.early->payload = std::move(it->second.out->request.payload);
                    it->second.out->answer(std::move(*it->second.early));
                    pending_.erase(it);
                }
            }
            queue_.pop_front();
        }
        write_queued();
    }

    // ---- reading ----

    void read_header() {
        reading_ = true;
        ahead_.read_header(stream_, header_bytes_, [self = shared_from_this()](std::error_code ec) { self->on_header(ec); });
    }

    /// After a reply: the next frame's header is read, unless the link parks (or the reply was a direct
    /// exchange's, whose thread reads no further).
    void next_frame() {
        if (direct_) return;
        reading_ = false;
        if (!park_if_idle()) read_header();
    }

    /// Fills `buffers` from the socket, then `next(ec)`: through the strand, or at once in a direct exchange.
    template <class Buffers, class Next>
    void fill(const Buffers& buffers, Next next) {
        if (direct_) return next(ahead_.fill_now(io_stream(), buffers, [this] { return wait_readable(Clock::now(), false); }));
        ahead_.fill(stream_, buffers, std::move(next));
    }

    void on_header(std::error_code ec) {
        if (state_ == State::closed) return;
        if (ec) return lose(ec);
        last_heard_ = Clock::now();
        try {
            header_ = decode_header(header_bytes_, options_.limits);
            if (!header_.is_reply())
                throw WireError("pss: wire: a request frame came back from " + task_.to_string() +
                                "; a client takes replies only");
        } catch (const WireError& e) {
            return fail(std::string(e.what()) + " (from " + task_.to_string() + " at " + address_text() + ")");
        }
        fill(body_buffers(header_, body_), [self = shared_from_this()](std::error_code ec2) { self->on_body(ec2); });
    }

    void on_body(std::error_code ec) {
        if (state_ == State::closed) return;
        if (ec) return lose(ec);
        try {
            decode_body(header_bytes_, header_, body_, options_.limits);
        } catch (const WireError& e) {
            return fail(std::string(e.what()) + " (from " + task_.to_string() + " at " + address_text() + ")");
        }
        target_.reset();
        incoming_ = Tensor{};
        incoming_values_.clear();
        if (header_.has_values()) {  // what a call answered
            incoming_values_ = value_tensors(header_, body_);
            if (header_.payload_length == 0) return on_payload({});
            return fill(tensor_buffers(incoming_values_),
                        [self = shared_from_this()](std::error_code ec2) { self->on_payload(ec2); });
        }
        if (!header_.has_payload() || header_.payload_elided()) return on_payload({});
        // A read lands in the buffer its request offered, when it fits.
        const TensorSpec& spec = body_.payload();
        if (auto it = pending_.find(header_.request_id); it != pending_.end()) {
            const Request& request = it->second.out->request;
            if (request.kind == RequestKind::operation && request.op == Op::read && request.payload.has_value() &&
                spec.dtype != DType::string &&
                request.payload.dtype() == spec.dtype && request.payload.size() == num_elements(spec.shape))
                target_ = it->second.out;
        }
        Tensor* into = &incoming_;
        if (target_) {
            into = &target_->request.payload;
            reshape_in_place(*into, spec.shape);
        } else {
            incoming_ = payload_buffer(header_, body_);
        }
        if (header_.payload_length == 0) return on_payload({});
        fill(asio::buffer(into->bytes(), static_cast<std::size_t>(header_.payload_length)),
             [self = shared_from_this()](std::error_code ec2) { self->on_payload(ec2); });
    }

    void on_payload(std::error_code ec) {
        if (state_ == State::closed) return;
        if (ec) return lose(ec);
        Tensor payload = target_ ? std::move(target_->request.payload) : std::move(incoming_);
        target_.reset();
        try {
            decode_wire_tensors(header_, payload, incoming_values_);
        } catch (const WireError& e) {
            return fail(std::string(e.what()) + " (from " + task_.to_string() + " at " + address_text() + ")");
        }
        Reply reply = to_reply(header_, body_, std::move(payload), std::move(incoming_values_));
        incoming_values_.clear();
        last_heard_ = Clock::now();
        if (header_.request_id == heartbeat_id_) heartbeat_id_.reset();
        if (auto it = pending_.find(header_.request_id); it != pending_.end() && !it->second.early) {
            if (header_.payload_elided() && !it->second.sent) {
                it->second.early = std::move(reply);  // answered by on_written
            } else {
                // An update's spent payload is handed back from here: its bytes have been written.
                if (header_.payload_elided()) reply.payload = std::move(it->second.out->request.payload);
                auto out = std::move(it->second.out);
                pending_.erase(it);
                out->answer(std::move(reply));
            }
        }  // else it timed out
        next_frame();
    }

    TaskId task_;
    std::function<TcpHostPort()> where_;
    TcpOptions options_;
    TlsContext tls_;  // null: plaintext
    TcpStrand strand_;
    TcpStream stream_;
    TcpStream parked_;  // the socket while the link is parked (socket_parked_), on the parking reactor
    bool socket_parked_ = false;
    TcpPeerCloseWatch& watch_;
    std::uint64_t watch_key_ = 0;  // the strand's: 0 when the link is not watched (and so never parks)
    asio::ip::tcp protocol_ = asio::ip::tcp::v4();
    std::unique_ptr<asio::ip::tcp::resolver> resolver_;
    bool unresolved_ = false;  // the last attempt failed in resolving the task's host name
    asio::steady_timer backoff_timer_;
    asio::steady_timer deadline_timer_;
    asio::steady_timer heartbeat_timer_;
    const std::optional<Clock::time_point> lost_at_;
    bool probe_;  // set before start() posts to the strand, read on it
    std::atomic<bool> lost_task_{false};
    std::atomic<Clock::rep> lost_time_{0};  // when lost_task_ was set
    std::atomic<bool> connected_once_{false};

    // Shared with sending threads.
    std::mutex inbox_mutex_;
    std::vector<std::shared_ptr<Outgoing>> inbox_;  // sent, not yet taken by the strand
    bool inbox_closed_ = false;
    std::string closed_reason_for_senders_;
    std::atomic<bool> closed_{false};

    // Who holds the link (see the threading rule).
    static constexpr int strand_mode = 0, parked_mode = 1, direct_mode = 2;
    static constexpr std::size_t direct_max_bytes = 64u << 10;
    static constexpr std::chrono::milliseconds poll_slice{50};  // how soon an exchange sees a shutdown
    std::atomic<int> mode_{strand_mode};
    std::mutex direct_mutex_;                     // held by a direct exchange; fail() waits for it
    std::atomic<std::thread::id> direct_thread_;  // the thread of the exchange in progress
    std::atomic<bool> stopping_{false};           // fail() began: an exchange ends
    std::atomic<bool> peer_closed_{false};        // the watch saw the peer end the link
    bool direct_ = false;                         // the holder's: reads block on its thread
    std::optional<std::string> direct_failure_;   // the holder's: why the exchange failed the link
    bool reading_ = false;                        // the strand's: a frame's read is armed

    // The strand's own.
    State state_ = State::connecting;
    std::string closed_reason_;
    std::uint64_t next_id_ = 1;
    std::map<std::uint64_t, Pending> pending_;
    std::deque<std::shared_ptr<Outgoing>> queue_;  // taken, not yet written
    bool writing_ = false;
    bool timer_armed_ = false;
    bool attempting_ = false;         // the backoff timer bounds the connect attempt meanwhile
    bool attempt_timed_out_ = false;  // it ended the attempt
    TcpWriteBatch batch_;
    std::string where_host_, where_text_;  // the last attempt's host, and "host:port"
    Clock::time_point connect_started_, connect_deadline_, next_wait_report_;
    bool ending_cluster_ = false;               // a shutdown request was taken: the link's end is expected
    std::optional<std::uint64_t> heartbeat_id_;  // the heartbeat not answered yet
    Clock::time_point heartbeat_sent_, last_heard_;
    using Backoff = std::chrono::duration<double, std::milli>;
    Backoff backoff_{1};
    int attempts_ = 0;
    std::array<std::byte, frame_header_size> header_bytes_{};
    TcpReadAhead ahead_;
    FrameHeader header_;
    FrameBody body_;
    Tensor incoming_;
    std::vector<Tensor> incoming_values_;  // what a call answered
    std::shared_ptr<Outgoing> target_;
};

}  // namespace detail

PSS_NAMESPACE_END
