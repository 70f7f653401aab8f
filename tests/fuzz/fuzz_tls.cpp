// tests/fuzz/fuzz_tls.cpp: libFuzzer target for what reaches a TcpTransport server over TLS: any bytes,
// never a crash, never a frame from a peer that did not prove its identity.
//
// The first byte picks the path:
//   0: a stranger's bytes go straight into a ps's TLS handshake (OpenSSL's parser, then pss's check of
//      the peer's certificate). Without a certificate of the cluster's CA, no peer task may come out.
//   1: the chief and the ps complete a real handshake in memory; the chief sends the rest of the bytes as
//      TLS records, and the ps decrypts them and runs them through the frame decoder and the role check,
//      as TcpServerConnection does.
//   2: as 1, but the bytes on the wire are tampered with (the input says where and how): the ps must
//      refuse them, never decrypt them into something else.
// Every input also goes through the parser of the task URI a certificate names. Built and run by
// tools/fuzz.sh (with -lssl -lcrypto).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <pss/transport/tcp/server.hpp>
#include <pss/transport/tcp/tls.hpp>
#include <pss/wire.hpp>

namespace {

void require(bool condition) {
    if (!condition) std::abort();
}

struct Contexts {
    pss::TlsAuthority authority;
    pss::detail::TlsContext ps = pss::detail::make_tls_context(authority.issue({"ps", 0}));
    pss::detail::TlsContext chief = pss::detail::make_tls_context(authority.issue({"chief", 0}));
    static Contexts& get() {
        static Contexts contexts;
        return contexts;
    }
};

/// One end of a TLS link in memory: an SSL object over a BIO pair.
struct End {
    SSL* ssl;
    BIO* network;  // the other side of the pair: what this end writes comes out here
    End(asio::ssl::context& context, bool server) : ssl(SSL_new(context.native_handle())) {
        BIO* inside = nullptr;
        BIO_new_bio_pair(&inside, 1 << 17, &network, 1 << 17);
        SSL_set_bio(ssl, inside, inside);
        if (server) SSL_set_accept_state(ssl);
        else SSL_set_connect_state(ssl);
    }
    ~End() {
        SSL_free(ssl);
        BIO_free(network);
    }
    End(const End&) = delete;
    End& operator=(const End&) = delete;
    /// What this end has written to the network.
    std::vector<unsigned char> take() {
        std::vector<unsigned char> out;
        unsigned char buffer[4096];
        for (int n; (n = BIO_read(network, buffer, sizeof buffer)) > 0;) out.insert(out.end(), buffer, buffer + n);
        return out;
    }
    void give(const std::vector<unsigned char>& bytes) {
        if (!bytes.empty()) BIO_write(network, bytes.data(), static_cast<int>(bytes.size()));
    }
};

/// Runs the handshake between `client` and `server` in memory; true when both finished.
bool handshake(End& client, End& server) {
    for (int round = 0; round < 8; ++round) {
        const int c = SSL_do_handshake(client.ssl);
        server.give(client.take());
        const int s = SSL_do_handshake(server.ssl);
        client.give(server.take());
        if (c == 1 && s == 1) return true;
    }
    return false;
}

/// What `server` decrypts of `wire`.
std::vector<std::byte> decrypt(End& server, const std::vector<unsigned char>& wire) {
    server.give(wire);
    std::vector<std::byte> plain;
    std::byte buffer[4096];
    for (int n; (n = SSL_read(server.ssl, buffer, sizeof buffer)) > 0;) plain.insert(plain.end(), buffer, buffer + n);
    ERR_clear_error();
    return plain;
}

/// As a TcpServerConnection: decode a frame, then ask whether its sender's role may make it.
void serve_frame(std::span<const std::byte> bytes, const pss::TaskId& peer) {
    pss::WireLimits limits;
    limits.max_payload_bytes = 1u << 20;
    try {
        const pss::DecodedFrame frame = pss::decode_frame(bytes, limits);
        if (!frame.header.is_reply()) (void)pss::detail::role_refusal(peer, frame.header, frame.body.name);
    } catch (const pss::WireError&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    (void)pss::detail::task_of_uri(std::string_view(reinterpret_cast<const char*>(data), size));
    if (size == 0) return 0;
    auto& contexts = Contexts::get();
    const std::uint8_t mode = data[0] % 3;
    const std::span<const std::uint8_t> rest(data + 1, size - 1);
    if (mode == 0) {
        End ps(*contexts.ps, true);
        ps.give(std::vector<unsigned char>(rest.begin(), rest.end()));
        const int done = SSL_do_handshake(ps.ssl);
        (void)ps.take();
        ERR_clear_error();
        require(done != 1 || !pss::detail::peer_task(ps.ssl));  // no identity without the CA's certificate
        return 0;
    }
    End chief(*contexts.chief, false), ps(*contexts.ps, true);
    require(handshake(chief, ps));
    const auto peer = pss::detail::peer_task(ps.ssl);
    require(peer && *peer == (pss::TaskId{"chief", 0}));
    std::span<const std::uint8_t> payload = rest;
    std::size_t where = 0;
    std::uint8_t flip = 0;
    if (mode == 2) {
        if (payload.size() < 3) return 0;
        where = payload[0] | (std::size_t{payload[1]} << 8);
        flip = payload[2] == 0 ? 1 : payload[2];
        payload = payload.subspan(3);
    }
    if (payload.empty()) return 0;
    require(SSL_write(chief.ssl, payload.data(), static_cast<int>(payload.size())) == static_cast<int>(payload.size()));
    auto wire = chief.take();
    if (mode == 2) wire[where % wire.size()] ^= flip;
    const auto plain = decrypt(ps, wire);
    if (mode == 2) {
        // A tampered record is refused whole: what was decrypted is a prefix of what was sent.
        require(plain.size() <= payload.size() &&
                (plain.empty() || std::memcmp(plain.data(), payload.data(), plain.size()) == 0));
        require(plain.size() < payload.size());
        return 0;
    }
    require(plain.size() == payload.size() && std::memcmp(plain.data(), payload.data(), plain.size()) == 0);
    serve_frame(plain, *peer);
    return 0;
}
