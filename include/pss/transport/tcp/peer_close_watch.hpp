// pss/transport/tcp/peer_close_watch.hpp: TcpPeerCloseWatch, which tells a client connection that its peer closed a link nobody reads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include <asio.hpp>

#include <pss/config.hpp>

#if defined(__linux__)
#include <sys/epoll.h>
#include <unistd.h>
#endif

PSS_NAMESPACE_BEGIN

namespace detail {

/// Watches sockets for their peer's end (EPOLLRDHUP, a reset or an error) and nothing else: an
/// epoll set of its own, itself waited for by the io threads' reactor. A parked link (see
/// TcpClientConnection) has no read armed, so without it a task that died while its link was idle
/// was seen only at the next heartbeat or request. Its data does not wake this set: a socket is added
/// edge-triggered with EPOLLRDHUP alone, and the kernel passes over wake-ups for data (EPOLLIN) an entry
/// did not ask for, so a reply that a direct exchange reads wakes no io thread.
/// Linux only; elsewhere `available()` is false and links do not park.
class TcpPeerCloseWatch {
public:
    explicit TcpPeerCloseWatch(asio::io_context& io) : set_(io) {
#if defined(__linux__)
        const int fd = ::epoll_create1(EPOLL_CLOEXEC);
        if (fd < 0) return;
        std::error_code ec;
        set_.assign(fd, ec);
        if (ec) {
            ::close(fd);
            return;
        }
        arm();
#endif
    }
    TcpPeerCloseWatch(const TcpPeerCloseWatch&) = delete;
    TcpPeerCloseWatch& operator=(const TcpPeerCloseWatch&) = delete;

    [[nodiscard]] bool available() const noexcept { return set_.is_open(); }

    /// Calls `closed` (on an io thread) once `socket`'s peer ends the link; 0 when it cannot watch.
    /// The socket leaves the set when it is closed; `forget` the key before, so `closed` is not called.
    std::uint64_t watch(int socket, std::function<void()> closed) {
#if defined(__linux__)
        if (!available()) return 0;
        std::lock_guard lock(mutex_);
        const std::uint64_t key = ++last_key_;
        epoll_event event{};
        event.events = EPOLLRDHUP | EPOLLET;
        event.data.u64 = key;
        if (::epoll_ctl(set_.native_handle(), EPOLL_CTL_ADD, socket, &event) != 0) return 0;
        watched_.emplace(key, std::move(closed));
        return key;
#else
        (void)socket;
        (void)closed;
        return 0;
#endif
    }

    void forget(std::uint64_t key) {
        if (key == 0) return;
        std::lock_guard lock(mutex_);
        watched_.erase(key);
    }

private:
    void arm() {
        set_.async_wait(asio::posix::stream_descriptor::wait_read, [this](std::error_code ec) {
            if (ec) return;
            on_ready();
            arm();
        });
    }

    void on_ready() {
#if defined(__linux__)
        epoll_event events[16];
        for (int n = 16; n == 16;) {  // the reactor waits for the set's next edge: leave nothing ready
            n = ::epoll_wait(set_.native_handle(), events, 16, 0);
            for (int i = 0; i < n; ++i) {
                std::function<void()> closed;
                {
                    std::lock_guard lock(mutex_);
                    auto it = watched_.find(events[i].data.u64);
                    if (it == watched_.end()) continue;
                    closed = std::move(it->second);
                    watched_.erase(it);  // a link ends once
                }
                closed();
            }
        }
#endif
    }

    asio::posix::stream_descriptor set_;
    std::mutex mutex_;
    std::uint64_t last_key_ = 0;
    std::map<std::uint64_t, std::function<void()>> watched_;
};

}  // namespace detail

PSS_NAMESPACE_END
