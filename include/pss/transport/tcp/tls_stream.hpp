// pss/transport/tcp/tls_stream.hpp: TLS over a non-blocking TCP socket, moving many records per system call.
#pragma once

#include <pss/transport/tcp/buffer_sequence.hpp>
#include <pss/transport/tcp/tls.hpp>

#if PSS_HAS_TLS

#include <cstddef>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief TLS over a connected, non-blocking socket, driven by the socket's executor.
///
/// Why not `asio::ssl::stream`: it passes every record through a 17 KiB BIO pair, so each 16 KiB record
/// costs a turn of the reactor and a system call on both sides; TLS pushes and pulls ran at a quarter to
/// a third of plaintext. Here OpenSSL reads straight from the socket, up to `read_buffer` bytes (many
/// records) per `recvmsg`, and writes whole batches of records into a buffer that goes out in one
/// `sendmsg`; while the socket is full, the next records are sealed.
///
/// Reads and writes may be in flight at once (one of each). They are started on the socket's executor (a
/// strand), and every completion runs there, so OpenSSL is never entered from two threads at once. A read
/// of some bytes completes through the executor, never inside the call that started it (a peer sending
/// tiny records must not deepen the stack); whole reads and writes complete at once when they can.
class TlsStream {
public:
    /// Bytes OpenSSL reads from the socket at once: four records per `recvmsg`. Each TLS connection holds
    /// this buffer while it lives. 256 KiB reads and up to 4 MiB sealed ahead measured no faster (TLS ran
    /// at 0.5 to 1.0 GB/s with each: the cipher and the copies on 2 cores set the pace).
    static constexpr std::size_t read_buffer = 64u << 10;

    TlsStream(asio::ip::tcp::socket& socket, asio::ssl::context& context)
        : core_(std::make_shared<Core>(socket, context)) {}
    TlsStream(const TlsStream&) = delete;
    TlsStream& operator=(const TlsStream&) = delete;
    /// Operations still waiting end with `operation_aborted`, whatever the socket does next.
    ~TlsStream() { core_->dead = true; }

    [[nodiscard]] SSL* native_handle() const noexcept { return core_->ssl; }

    /// The TLS handshake, then `handler(ec)`.
    template <class Handler>
    void async_handshake(asio::ssl::stream_base::handshake_type type, Handler handler) {
        if (type == asio::ssl::stream_base::client) SSL_set_connect_state(core_->ssl);
        else SSL_set_accept_state(core_->ssl);
        asio::post(core_->socket.get_executor(), HandshakeOp<Handler>{core_, std::move(handler)});
    }

    /// Reads some bytes (at least one) into `buffers`, then `handler(ec, n)`.
    template <class Buffers, class Handler>
    void async_read_some(const Buffers& buffers, Handler handler) {
        start_read(buffers, true, std::move(handler));
    }

    /// Reads all of `buffers`, then `next(ec)` (at once when the bytes were here: as over plaintext).
    template <class Buffers, class Next>
    void async_read(const Buffers& buffers, Next next) {
        start_read(buffers, false, [next = std::move(next)](std::error_code ec, std::size_t) mutable { next(ec); });
    }

    /// Writes all of `buffers`, then `next(ec)` (at once when the socket took them: as over plaintext).
    template <class Buffers, class Next>
    void async_write(const Buffers& buffers, Next next) {
        WriteOp<Next> op{core_, buffers_after<asio::const_buffer>(buffers, 0), std::move(next)};
        op();
    }

private:
    /// What operations share, and outlive the stream with: a late completion finds `dead` set.
    struct Core {
        static constexpr std::size_t out_kept = 256u << 10;

        asio::ip::tcp::socket& socket;
        SSL* ssl = nullptr;
        std::vector<std::byte> out;  // sealed records not yet written
        std::size_t sent = 0;        // of `out`
        std::error_code socket_error;  // what the last read from the socket met (end of stream, reset)
        bool dead = false;

        Core(asio::ip::tcp::socket& s, asio::ssl::context& context) : socket(s), ssl(SSL_new(context.native_handle())) {
            openssl_check(ssl != nullptr, "SSL_new");
            BIO* rbio = BIO_new(method());
            BIO* wbio = BIO_new(method());
            if (rbio == nullptr || wbio == nullptr) {
                BIO_free(rbio);
                BIO_free(wbio);
                SSL_free(ssl);
                openssl_check(false, "BIO_new");
            }
            BIO_set_data(rbio, this);
            BIO_set_data(wbio, this);
            SSL_set0_rbio(ssl, rbio);
            SSL_set0_wbio(ssl, wbio);
            SSL_set_read_ahead(ssl, 1);
            SSL_set_default_read_buffer_len(ssl, read_buffer);
        }
        Core(const Core&) = delete;
        Core& operator=(const Core&) = delete;
        ~Core() { SSL_free(ssl); }

        /// The error of a failed OpenSSL call that returned `result`: the socket's, when reading it failed
        /// (a peer that closed is `eof`, as over plaintext); else OpenSSL's, in Asio's ssl category.
        std::error_code error_of(int result) {
            const int kind = SSL_get_error(ssl, result);
            const unsigned long code = ERR_get_error();
            ERR_clear_error();  // nothing left for the thread's next OpenSSL call to misread
            if (socket_error) return socket_error;
            if (kind == SSL_ERROR_ZERO_RETURN || kind == SSL_ERROR_SYSCALL || code == 0) return asio::error::eof;
            return {static_cast<int>(code), asio::error::get_ssl_category()};
        }

        /// Writes `out` as far as the socket takes it now: true when all is written; false with `ec` clear
        /// when the socket is full.
        bool flush(std::error_code& ec) {
            while (sent < out.size()) {
                const std::size_t n = socket.write_some(asio::buffer(out.data() + sent, out.size() - sent), ec);
                if (ec == asio::error::would_block || ec == asio::error::try_again) {
                    ec.clear();
                    return false;
                }
                if (ec) return false;
                sent += n;
            }
            // A large write's records are not held after it: a connection keeps at most `out_kept` bytes.
            if (out.capacity() > out_kept) std::vector<std::byte>().swap(out);
            else out.clear();
            sent = 0;
            return true;
        }

        /// The BIO both directions of the SSL object go through: reads come from the socket (would-block
        /// is "retry"), writes are appended to `out`.
        static BIO_METHOD* method() {
            static BIO_METHOD* const m = [] {
                BIO_METHOD* made = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "pss tcp");
                openssl_check(made != nullptr, "BIO_meth_new");
                BIO_meth_set_create(made, [](BIO* bio) {
                    BIO_set_init(bio, 1);
                    return 1;
                });
                BIO_meth_set_read_ex(made, [](BIO* bio, char* data, std::size_t size, std::size_t* read) {
                    auto* core = static_cast<Core*>(BIO_get_data(bio));
                    BIO_clear_retry_flags(bio);
                    std::error_code ec;
                    *read = core->socket.read_some(asio::buffer(data, size), ec);
                    if (ec == asio::error::would_block || ec == asio::error::try_again) {
                        BIO_set_retry_read(bio);
                        return 0;
                    }
                    if (ec) {
                        core->socket_error = ec;
                        return 0;
                    }
                    return 1;
                });
                BIO_meth_set_write_ex(made, [](BIO* bio, const char* data, std::size_t size, std::size_t* written) {
                    auto* core = static_cast<Core*>(BIO_get_data(bio));
                    const auto* bytes = reinterpret_cast<const std::byte*>(data);
                    core->out.insert(core->out.end(), bytes, bytes + size);
                    *written = size;
                    return 1;
                });
                BIO_meth_set_ctrl(made, [](BIO*, int command, long, void*) -> long {
                    return command == BIO_CTRL_FLUSH ? 1 : 0;
                });
                return made;
            }();
            return m;
        }
    };

    template <class Handler>
    struct HandshakeOp {
        std::shared_ptr<Core> core;
        Handler handler;

        void operator()(std::error_code ec = {}) {
            if (core->dead) return handler(asio::error::operation_aborted);
            if (ec) return handler(ec);
            ERR_clear_error();
            const int result = SSL_do_handshake(core->ssl);
            if (result != 1 && SSL_get_error(core->ssl, result) != SSL_ERROR_WANT_READ)
                return handler(core->error_of(result));
            // What the handshake produced goes out before anything is waited for.
            auto& socket = core->socket;
            if (!core->flush(ec)) {
                if (ec) return handler(ec);
                return socket.async_wait(asio::socket_base::wait_write, std::move(*this));
            }
            if (result == 1) return handler(std::error_code{});
            if (core->socket_error) return handler(core->socket_error);
            socket.async_wait(asio::socket_base::wait_read, std::move(*this));
        }
    };

    template <class Handler>
    struct ReadOp {
        std::shared_ptr<Core> core;
        std::vector<asio::mutable_buffer> rest;
        bool some;  // done after the first bytes
        Handler handler;
        std::size_t total = 0;
        bool waited = false;

        void operator()(std::error_code ec = {}) {
            if (core->dead) return handler(asio::error::operation_aborted, total);
            if (ec) return finish(ec);
            while (!rest.empty()) {
                std::size_t n = 0;
                ERR_clear_error();
                const int result = SSL_read_ex(core->ssl, rest.front().data(), rest.front().size(), &n);
                if (result == 1) {
                    total += n;
                    rest.front() += n;
                    if (rest.front().size() == 0) rest.erase(rest.begin());
                    if (some) break;
                    continue;
                }
                if (SSL_get_error(core->ssl, result) != SSL_ERROR_WANT_READ || core->socket_error)
                    return finish(core->error_of(result));
                waited = true;
                auto& socket = core->socket;
                return socket.async_wait(asio::socket_base::wait_read, std::move(*this));
            }
            finish(std::error_code{});
        }

        void finish(std::error_code ec) {
            if (waited || !some) return handler(ec, total);
            asio::post(core->socket.get_executor(),
                       [handler = std::move(handler), ec, n = total]() mutable { handler(ec, n); });
        }
    };

    template <class Buffers, class Handler>
    void start_read(const Buffers& buffers, bool some, Handler handler) {
        ReadOp<Handler> op{core_, buffers_after<asio::mutable_buffer>(buffers, 0), some, std::move(handler)};
        op();  // the records already read ahead are used without a turn of the reactor
    }

    template <class Next>
    struct WriteOp {
        /// Plaintext sealed at a time; up to `max_sealed` bytes wait sealed while the socket is full.
        static constexpr std::size_t chunk = 64u << 10;
        static constexpr std::size_t max_sealed = 256u << 10;

        std::shared_ptr<Core> core;
        std::vector<asio::const_buffer> rest;
        Next next;

        void operator()(std::error_code ec = {}) {
            if (core->dead) return next(asio::error::operation_aborted);
            if (ec) return next(ec);
            for (;;) {
                if (core->flush(ec) && rest.empty()) return next(std::error_code{});
                if (ec) return next(ec);
                // The socket is full, or all is written and more is to seal: seal the next chunk while
                // the peer reads, unless enough waits already.
                if (rest.empty() || core->out.size() - core->sent >= max_sealed) {
                    auto& socket = core->socket;
                    return socket.async_wait(asio::socket_base::wait_write, std::move(*this));
                }
                const std::size_t size = std::min(rest.front().size(), chunk);
                std::size_t n = 0;
                ERR_clear_error();
                const int result = SSL_write_ex(core->ssl, rest.front().data(), size, &n);
                if (result != 1) return next(core->error_of(result));
                rest.front() += n;
                if (rest.front().size() == 0) rest.erase(rest.begin());
            }
        }
    };

    std::shared_ptr<Core> core_;
};

}  // namespace detail

PSS_NAMESPACE_END

#endif  // PSS_HAS_TLS
