// pss/transport/tcp/buffers.hpp: buffer sequences past a byte count, write batches, and socket I/O done at once when it can be.
#pragma once

#include <cstddef>
#include <cstring>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include <asio.hpp>

#include <pss/config.hpp>
#include <pss/tensor.hpp>
#include <pss/transport/tcp/buffer_sequence.hpp>
#include <pss/transport/tcp/tls.hpp>
#include <pss/transport/tcp/tls_stream.hpp>
#include <pss/wire.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// Asio's `transfer_all` without its cap: `transfer_all` lets each system call move at most 64 KiB
/// (`asio::default_max_transfer_size`), so a 16 MB frame took 256 `sendmsg` or `recvmsg` calls and as
/// many wake-ups of the peer; this one offers the socket everything left (up to 64 iovecs), and the
/// kernel takes what its buffer holds.
struct TransferAll {
    std::size_t operator()(const std::error_code& ec, std::size_t) const noexcept {
        return ec ? 0 : std::size_t{1} << 30;
    }
};

/// A connection's byte stream: a TCP socket, and TLS over it once `secure` was called. Reads and writes
/// through TLS are asynchronous only: OpenSSL's state must be entered from the connection's strand alone,
/// where `TlsStream` runs every step, never from the thread that happens to write.
class TcpStream {
public:
    explicit TcpStream(asio::ip::tcp::socket socket) : socket_(std::move(socket)) {}
    template <class Executor>
    explicit TcpStream(const Executor& executor) : socket_(executor) {}

    [[nodiscard]] asio::ip::tcp::socket& socket() noexcept { return socket_; }
    [[nodiscard]] auto get_executor() { return socket_.get_executor(); }

#if PSS_HAS_TLS
    using Tls = TlsStream;
    /// Puts TLS over the socket (connected, non-blocking, nothing exchanged yet); the handshake comes next.
    Tls& secure(asio::ssl::context& context) { return tls_.emplace(socket_, context); }
    /// Drops TLS, for the next connection attempt of the socket.
    void plain() { tls_.reset(); }
    [[nodiscard]] Tls* tls() noexcept { return tls_ ? &*tls_ : nullptr; }
#else
    [[nodiscard]] static constexpr const void* tls() noexcept { return nullptr; }
    void plain() noexcept {}
#endif

    template <class Buffers, class Handler>
    void async_read_some(const Buffers& buffers, Handler&& handler) {
#if PSS_HAS_TLS
        if (tls_) return tls_->async_read_some(buffers, std::forward<Handler>(handler));
#endif
        socket_.async_read_some(buffers, std::forward<Handler>(handler));
    }

    /// Reads all of `buffers`, then `next(ec)`.
    template <class Buffers, class Next>
    void async_read(const Buffers& buffers, Next next) {
#if PSS_HAS_TLS
        if (tls_) return tls_->async_read(buffers, std::move(next));
#endif
        asio::async_read(socket_, buffers, TransferAll{},
                        [next = std::move(next)](std::error_code ec, std::size_t) mutable { next(ec); });
    }

    /// Writes all of `buffers`, then `next(ec)`.
    template <class Buffers, class Next>
    void async_write(const Buffers& buffers, Next next) {
#if PSS_HAS_TLS
        if (tls_) return tls_->async_write(buffers, std::move(next));
#endif
        asio::async_write(socket_, buffers, TransferAll{},
                        [next = std::move(next)](std::error_code ec, std::size_t) mutable { next(ec); });
    }

private:
    asio::ip::tcp::socket socket_;
#if PSS_HAS_TLS
    std::optional<Tls> tls_;  // after socket_, which it refers to
#endif
};

/// Reads `buffers` at once when the bytes are there already (the socket is non-blocking), else finishes
/// asynchronously; `next(ec)` runs either way. A small frame then costs one wake-up, not one per section.
/// Through TLS, asynchronously always.
template <class Buffers, class Next>
void read_now_or_later(TcpStream& stream, const Buffers& buffers, Next next) {
    if (stream.tls()) return stream.async_read(buffers, std::move(next));
    std::error_code ec;
    const std::size_t n = asio::read(stream.socket(), buffers, TransferAll{}, ec);
    if (ec != asio::error::would_block && ec != asio::error::try_again) return next(ec);
    stream.async_read(buffers_after<asio::mutable_buffer>(buffers, n), std::move(next));
}

/// Writes `buffers` at once when the socket takes them (it is non-blocking), else finishes
/// asynchronously; `next(ec)` runs either way. A reply or a request then goes out without waiting for
/// the reactor to report a writable socket. Through TLS, asynchronously always.
template <class Buffers, class Next>
void write_now_or_later(TcpStream& stream, const Buffers& buffers, Next next) {
    if (stream.tls()) return stream.async_write(buffers, std::move(next));
    std::error_code ec;
    const std::size_t n = asio::write(stream.socket(), buffers, TransferAll{}, ec);
    if (ec != asio::error::would_block && ec != asio::error::try_again) return next(ec);
    stream.async_write(buffers_after<asio::const_buffer>(buffers, n), std::move(next));
}

/// The frames at the front of a write queue that go out in one gather write: several small ones, up to
/// 16 frames or until one crosses 256 KiB.
class TcpWriteBatch {
public:
    /// Gathers the buffers of the first frames of `queue`; `frame_of(element)` is an element's OutgoingFrame.
    template <class Queue, class FrameOf>
    void gather(const Queue& queue, FrameOf frame_of) {
        buffers_.clear();
        frames_ = 0;
        std::size_t bytes = 0;
        for (const auto& element : queue) {
            if (frames_ == max_frames || (frames_ > 0 && bytes > max_bytes)) break;
            const OutgoingFrame& frame = frame_of(element);
            frame.append_buffers(buffers_);
            bytes += frame.size();
            ++frames_;
        }
        bytes_ = bytes;
    }

    [[nodiscard]] const std::vector<asio::const_buffer>& buffers() const noexcept { return buffers_; }
    /// How many frames of the queue's front the batch holds.
    [[nodiscard]] std::size_t frames() const noexcept { return frames_; }
    [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

    /// Writes the batch, then `next(ec)`. Up to 64 KiB it is written at once when the socket takes it
    /// (a small request or reply goes out without a trip through the reactor: a 1 KB round trip of
    /// bench_tcp took 35 to 58 us so, 78 to 85 us without); a larger one through the reactor (written at
    /// once, a 16 MB reply made a 16 MB pull take 17 to 20 ms instead of 11 to 13). Through TLS, a small
    /// batch is copied into one buffer first: TLS seals each buffer of a sequence as records of its own.
    template <class Next>
    void write(TcpStream& stream, Next next) {
        if (bytes_ > inline_max_bytes) return stream.async_write(buffers_, std::move(next));
        if (!stream.tls()) return write_now_or_later(stream, buffers_, std::move(next));
        joined_.resize(bytes_);
        std::size_t at = 0;
        for (const auto& b : buffers_) {
            if (b.size() != 0) std::memcpy(joined_.data() + at, b.data(), b.size());
            at += b.size();
        }
        stream.async_write(asio::buffer(joined_), std::move(next));
    }

private:
    static constexpr std::size_t max_frames = 16;
    static constexpr std::size_t max_bytes = 256u << 10;
    static constexpr std::size_t inline_max_bytes = 64u << 10;
    std::vector<asio::const_buffer> buffers_;
    std::vector<std::byte> joined_;  // a small batch, for TLS
    std::size_t frames_ = 0;
    std::size_t bytes_ = 0;
};

/// Gives `tensor` the shape `shape` of the same element count: the buffer is kept.
inline void reshape_in_place(Tensor& tensor, const Shape& shape) {
    tensor.visit_mut([&](auto& array) { array.resize(shape); });
}

}  // namespace detail

PSS_NAMESPACE_END
