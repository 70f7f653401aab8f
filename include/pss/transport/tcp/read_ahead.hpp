// pss/transport/tcp/read_ahead.hpp: TcpReadAhead, the bytes read from a socket ahead of the frame being decoded.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

#include <asio.hpp>

#include <pss/config.hpp>
#include <pss/transport/tcp/buffers.hpp>
#include <pss/wire.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// Bytes read ahead from a socket: a frame's header is read together with what follows it (its small
/// sections, a small payload, the next frames), so that a small frame costs one read system call, not
/// one per section. Used on one strand only.
class TcpReadAhead {
public:
    /// Calls `next(ec)` once `header` is filled, from the bytes read ahead or from the socket.
    template <class Next>
    void read_header(TcpStream& socket, std::array<std::byte, frame_header_size>& header, Next next) {
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
    template <class Buffers, class Next>
    void fill(TcpStream& socket, const Buffers& buffers, Next next) {
        std::vector<asio::mutable_buffer> rest = fill_from_stage(buffers);
        if (rest.empty()) return next(std::error_code{});
        read_now_or_later(socket, rest, std::move(next));
    }

    /// True when the next frame's header was read ahead already: it is handled without a system call.
    [[nodiscard]] bool holds_header() const noexcept { return end_ - begin_ >= frame_header_size; }
    /// True when any byte was read ahead and not handed out yet.
    [[nodiscard]] bool holds_bytes() const noexcept { return end_ != begin_; }

    // On the calling thread (a plaintext socket, which the caller owns meanwhile): each reads what the
    // socket has, and when it has nothing calls `wait()`, which returns once it is readable or an error.

    /// Fills `header` from the bytes read ahead, then from the socket.
    template <class Wait>
    std::error_code read_header_now(TcpStream& socket, std::array<std::byte, frame_header_size>& header, Wait&& wait) {
        depth_ = 0;
        while (end_ - begin_ < header.size()) {
            if (begin_ != 0) {
                std::memmove(stage_.data(), stage_.data() + begin_, end_ - begin_);
                end_ -= begin_;
                begin_ = 0;
            }
            std::error_code ec;
            end_ += socket.socket().read_some(asio::buffer(stage_.data() + end_, stage_.size() - end_), ec);
            if (ec == asio::error::would_block || ec == asio::error::try_again) ec = wait();
            if (ec) return ec;
        }
        std::memcpy(header.data(), stage_.data() + begin_, header.size());
        begin_ += header.size();
        return {};
    }

    /// Fills `buffers` from the bytes read ahead, then from the socket.
    template <class Buffers, class Wait>
    std::error_code fill_now(TcpStream& socket, const Buffers& buffers, Wait&& wait) {
        const std::vector<asio::mutable_buffer> rest = fill_from_stage(buffers);
        for (std::size_t done = 0, left = asio::buffer_size(rest); left != 0;) {
            std::error_code ec;
            const std::size_t n = asio::read(socket.socket(), buffers_after<asio::mutable_buffer>(rest, done), TransferAll{}, ec);
            done += n;
            left -= n;
            if (ec == asio::error::would_block || ec == asio::error::try_again) ec = left != 0 ? wait() : std::error_code{};
            if (ec) return ec;
        }
        return {};
    }

private:
    /// Fills `buffers` from the bytes read ahead, as far as they go; returns what is still to fill.
    template <class Buffers>
    std::vector<asio::mutable_buffer> fill_from_stage(const Buffers& buffers) {
        std::vector<asio::mutable_buffer> rest;
        for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers); ++it) {
            asio::mutable_buffer b = *it;
            const std::size_t n = std::min(b.size(), end_ - begin_);
            if (n != 0) std::memcpy(b.data(), stage_.data() + begin_, n);
            begin_ += n;
            if (n < b.size()) rest.push_back(b + n);
        }
        return rest;
    }

    std::vector<std::byte> stage_ = std::vector<std::byte>(16 << 10);
    std::size_t begin_ = 0, end_ = 0;
    int depth_ = 0;
};

}  // namespace detail

PSS_NAMESPACE_END
