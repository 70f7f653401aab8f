// tests/no_tls.cpp: a program built with PSS_NO_TLS and linked without OpenSSL: it compiles, a
// TcpTransport warns that its links are plaintext, and a request makes a round trip over loopback.
#include <cstdio>

#include <pss/transport/tcp.hpp>

int main() {
    static_assert(!PSS_HAS_TLS);
    pss::TcpTransport transport(pss::ClusterSpec{{"ps", {"127.0.0.1:0"}}});
    if (transport.secure()) return 1;
    transport.serve({"ps", 0}, pss::answer_at_once([](pss::Request&& r) {
        pss::Reply reply;
        reply.message = "echo " + r.name;
        return reply;
    }));
    pss::Request request;
    request.kind = pss::RequestKind::call;
    request.name = "hello";
    const pss::Reply reply = transport.send({"ps", 0}, std::move(request)).get();
    std::printf("%s\n", reply.message.c_str());
    return reply.ok() && reply.message == "echo hello" ? 0 : 2;
}
