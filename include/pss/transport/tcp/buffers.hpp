// pss/transport/tcp/buffers.hpp: buffer sequences past a byte count, write batches, and socket I/O done at once when it can be.
#pragma once

#include <cstddef>
#include <system_error>
#include <utility>
#include <vector>

#include <asio.hpp>

#include <pss/config.hpp>
#include <pss/tensor.hpp>
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

/// The buffers of the sequence `buffers` past its first `skip` bytes.
template <class Buffer, class Buffers>
std::vector<Buffer> buffers_after(const Buffers& buffers, std::size_t skip) {
    std::vector<Buffer> rest;
    for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers); ++it) {
        Buffer b = *it;
        if (skip >= b.size()) {
            skip -= b.size();
            continue;
        }
        rest.push_back(b + skip);
        skip = 0;
    }
    return rest;
}

/// Reads `buffers` at once when the bytes are there already (the socket is non-blocking), else finishes
/// asynchronously; `next(ec)` runs either way. A small frame then costs one wake-up, not one per section.
template <class Socket, class Buffers, class Next>
void read_now_or_later(Socket& socket, const Buffers& buffers, Next next) {
    std::error_code ec;
    const std::size_t n = asio::read(socket, buffers, TransferAll{}, ec);
    if (ec != asio::error::would_block && ec != asio::error::try_again) return next(ec);
    asio::async_read(socket, buffers_after<asio::mutable_buffer>(buffers, n), TransferAll{},
                     [next = std::move(next)](std::error_code ec2, std::size_t) { next(ec2); });
}

/// Writes `buffers` at once when the socket takes them (it is non-blocking), else finishes
/// asynchronously; `next(ec)` runs either way. A reply or a request then goes out without waiting for
/// the reactor to report a writable socket.
template <class Socket, class Buffers, class Next>
void write_now_or_later(Socket& socket, const Buffers& buffers, Next next) {
    std::error_code ec;
    const std::size_t n = asio::write(socket, buffers, TransferAll{}, ec);
    if (ec != asio::error::would_block && ec != asio::error::try_again) return next(ec);
    asio::async_write(socket, buffers_after<asio::const_buffer>(buffers, n), TransferAll{},
                      [next = std::move(next)](std::error_code ec2, std::size_t) { next(ec2); });
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
    /// once, a 16 MB reply made a 16 MB pull take 17 to 20 ms instead of 11 to 13).
    template <class Socket, class Next>
    void write(Socket& socket, Next next) const {
        if (bytes_ <= inline_max_bytes) return write_now_or_later(socket, buffers_, std::move(next));
        asio::async_write(socket, buffers_, TransferAll{},
                          [next = std::move(next)](std::error_code ec, std::size_t) { next(ec); });
    }

private:
    static constexpr std::size_t max_frames = 16;
    static constexpr std::size_t max_bytes = 256u << 10;
    static constexpr std::size_t inline_max_bytes = 64u << 10;
    std::vector<asio::const_buffer> buffers_;
    std::size_t frames_ = 0;
    std::size_t bytes_ = 0;
};

/// Gives `tensor` the shape `shape` of the same element count: the buffer is kept.
inline void reshape_in_place(Tensor& tensor, const Shape& shape) {
    tensor.visit_mut([&](auto& array) { array.resize(shape); });
}

}  // namespace detail

PSS_NAMESPACE_END
