// TcpTransport on loopback: push, pull and push-then-pull of 1 KB to 64 MB between one client and one
// served task in another process (as a ps runs), each beside a raw blocking Asio socket to the same
// process moving the same bytes in the same run. The issue's
// limits: at least 0.8x the raw socket's bytes per second from 1 MB up, and a 1 KB round trip at most
// 1.5x the raw one (a rate at least 0.67x). Below 1 MB no limit is set (limit 0: printed, not judged).
//
// A push is assign_add: the payload crosses once, the reply hands the spent buffer back. A pull is a
// read into a reused buffer.
// TLS (mutual, TLS 1.3 AES-GCM): the same push and pull through a TLS link of the same server process,
// beside plaintext in the same run. The limits: at least 0.7x plaintext's bytes per second at 1,
// 16 and 64 MB, a 1 KB round trip at most 1.3x plaintext's. And the cost of a new link: connect,
// handshake and one 1 KB push, beside the same without TLS (no limit).
// The raw baseline (each call offering the kernel everything at once, as pss's TcpTransport does, not
// Asio's default 64 KiB a system call): the client writes a 16-byte command and, for a push, N bytes, and reads a 1-byte ack;
// for a pull the server writes the N bytes back. Both reuse their buffers, as a training loop does.
#include <array>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>

#include <asio.hpp>
#include <benchmark/benchmark.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include <pss/transport/tcp.hpp>

#include "ratio_report.hpp"

namespace {

constexpr std::int64_t KB = 1 << 10;
constexpr std::int64_t MB = 1 << 20;

std::size_t floats_of(std::int64_t bytes) { return static_cast<std::size_t>(bytes) / sizeof(float); }

/// The servers run in a child process (this program with `--serve`), as a ps does in every real
/// deployment: a client and a server sharing one process and its io thread measure something else.
/// The child serves /job:ps/replica:0/task:0 over TcpTransport and a raw socket, prints both ports on
/// one line, and ends when its standard input closes (this process ending, whatever the way).
struct ServerProcess {
    pid_t pid = -1;
    int to_child = -1;
    std::uint16_t tcp_port = 0, tls_port = 0, raw_port = 0;
    std::filesystem::path tls_dir;

    ServerProcess() {
        // The cluster's certificates, as pss-launch makes them; PSS_TLS_DIR names them in both processes.
        std::string pattern = (std::filesystem::temp_directory_path() / "pss_bench_tls_XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("pss: bench_tcp: mkdtemp failed");
        tls_dir = pattern;
        pss::TlsAuthority().write_directory(tls_dir, std::vector<pss::TaskId>{{"ps", 0}, {"chief", 0}});
        ::setenv("PSS_TLS_DIR", pattern.c_str(), 1);
        int in[2], out[2];
        if (::pipe(in) != 0 || ::pipe(out) != 0) throw std::runtime_error("pss: bench_tcp: pipe failed");
        pid = ::fork();
        if (pid < 0) throw std::runtime_error("pss: bench_tcp: fork failed");
        if (pid == 0) {
            ::dup2(in[0], STDIN_FILENO);
            ::dup2(out[1], STDOUT_FILENO);
            ::close(in[1]);
            ::close(out[0]);
            char self[] = "/proc/self/exe", flag[] = "--serve";
            char* args[] = {self, flag, nullptr};
            ::execv(self, args);
            ::_exit(127);
        }
        ::close(in[0]);
        ::close(out[1]);
        to_child = in[1];
        std::string line;
        char c = 0;
        while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
        ::close(out[0]);
        if (std::sscanf(line.c_str(), "%hu %hu %hu", &tcp_port, &tls_port, &raw_port) != 3)
            throw std::runtime_error("pss: bench_tcp: the server process did not start (it printed \"" + line + "\")");
    }
    ~ServerProcess() {
        ::close(to_child);  // the child's stdin closes: it ends
        int status = 0;
        ::waitpid(pid, &status, 0);
        std::error_code ignored;
        std::filesystem::remove_all(tls_dir, ignored);
    }
    static ServerProcess& get() {
        static ServerProcess server;
        return server;
    }
};

/// The child: a TcpTransport task whose handler hands back the buffer it is given (without touching the
/// elements, so the figures are the transport's own: a ParameterServer adds one pass over the value),
/// and a raw blocking socket server.
pss::TcpOptions plaintext() {
    pss::TcpOptions options;
    options.plaintext = true;
    return options;
}

int serve() {
    const pss::ClusterSpec spec{{"ps", {"127.0.0.1:0"}}};
    const pss::TaskId ps{"ps", 0};
    pss::TcpTransport transport{spec, plaintext()};
    pss::TcpTransport tls{spec, ps};
    auto hand_back = pss::answer_at_once([](pss::Request&& r) {
        pss::Reply reply;
        if (r.op == pss::Op::read && !r.payload.has_value())  // the first pull of a size: no buffer to reuse yet
            r.payload = pss::Tensor::zeros(pss::DType::float32, {static_cast<std::size_t>(r.key.variable)});
        reply.payload = std::move(r.payload);
        return reply;
    });
    transport.serve(ps, hand_back);
    tls.serve(ps, hand_back);
    asio::io_context io;
    asio::ip::tcp::acceptor acceptor{io, {asio::ip::address_v4::loopback(), 0}};
    std::printf("%u %u %u\n", static_cast<unsigned>(transport.bound_port(ps)), static_cast<unsigned>(tls.bound_port(ps)),
                static_cast<unsigned>(acceptor.local_endpoint().port()));
    std::fflush(stdout);
    std::thread raw([&] {
        asio::ip::tcp::socket s(io);
        std::error_code accepted;
        if (acceptor.accept(s, accepted); accepted) return;
        s.set_option(asio::ip::tcp::no_delay(true));
        std::vector<char> buffer;
        for (;;) {
            std::array<std::uint64_t, 2> command{};
            std::error_code ec;
            asio::read(s, asio::buffer(command), pss::detail::TransferAll{}, ec);
            if (ec || command[0] == 0) return;
            const auto n = static_cast<std::size_t>(command[1]);
            if (buffer.size() < n) buffer.resize(n);
            if (command[0] == 1) {  // push: take n bytes, ack
                asio::read(s, asio::buffer(buffer.data(), n), pss::detail::TransferAll{});
                const char ack = 1;
                asio::write(s, asio::buffer(&ack, 1));
            } else {  // pull: send n bytes
                asio::write(s, asio::buffer(buffer.data(), n), pss::detail::TransferAll{});
            }
        }
    });
    char c = 0;
    while (::read(STDIN_FILENO, &c, 1) > 0) {
    }
    // A raw client that never came (the raw benchmarks filtered out): shutdown wakes the blocked accept,
    // which closing the socket from this thread does not.
    ::shutdown(acceptor.native_handle(), SHUT_RDWR);
    raw.join();
    return 0;
}

pss::ClusterSpec server_spec(bool tls) {
    const auto& server = ServerProcess::get();
    return pss::ClusterSpec{{"ps", {"127.0.0.1:" + std::to_string(tls ? server.tls_port : server.tcp_port)}}};
}

/// This process's transport, sending to the server process's task: plaintext, or TLS as the chief.
struct TcpFixture {
    const pss::TaskId ps{"ps", 0};
    pss::TcpTransport transport;
    explicit TcpFixture(bool tls)
        : transport(tls ? pss::TcpTransport(server_spec(true), pss::TaskId{"chief", 0})
                        : pss::TcpTransport(server_spec(false), plaintext())) {}
    static TcpFixture& get(bool tls = false) {
        static TcpFixture plain(false);
        if (!tls) return plain;
        static TcpFixture secure(true);
        return secure;
    }
};

/// A raw blocking Asio client of the server process's raw socket.
struct RawFixture {
    asio::io_context io;
    asio::ip::tcp::socket client{io};
    std::vector<char> client_buffer;

    RawFixture() {
        client.connect({asio::ip::address_v4::loopback(), ServerProcess::get().raw_port});
        client.set_option(asio::ip::tcp::no_delay(true));
    }
    ~RawFixture() {
        const std::array<std::uint64_t, 2> quit{0, 0};
        std::error_code ignored;
        asio::write(client, asio::buffer(quit), ignored);
    }
    void push(std::size_t n) {
        const std::array<std::uint64_t, 2> command{1, n};
        asio::write(client, std::array<asio::const_buffer, 2>{asio::buffer(command), asio::buffer(client_buffer.data(), n)},
                    pss::detail::TransferAll{});
        char ack = 0;
        asio::read(client, asio::buffer(&ack, 1));
    }
    void pull(std::size_t n) {
        const std::array<std::uint64_t, 2> command{2, n};
        asio::write(client, asio::buffer(command));
        asio::read(client, asio::buffer(client_buffer.data(), n), pss::detail::TransferAll{});
    }
    static RawFixture& get() {
        static RawFixture fixture;
        return fixture;
    }
};

void count(benchmark::State& state, std::int64_t bytes_per_iteration) {
    state.SetBytesProcessed(state.iterations() * bytes_per_iteration);
    state.SetItemsProcessed(state.iterations());
}

pss::Tensor push_once(TcpFixture& f, pss::Tensor payload, std::int64_t bytes) {
    pss::Request r;
    r.op = pss::Op::assign_add;
    r.key.variable = static_cast<std::uint64_t>(floats_of(bytes));
    r.payload = std::move(payload);
    pss::Reply reply = f.transport.send(f.ps, std::move(r)).get();
    if (!reply.ok() || reply.payload.nbytes() != static_cast<std::size_t>(bytes))
        throw std::runtime_error("pss: bench_tcp: push did not hand the buffer back: " + reply.message);
    return std::move(reply.payload);
}

pss::Tensor pull_once(TcpFixture& f, pss::Tensor buffer, std::int64_t bytes) {
    pss::Request r;
    r.op = pss::Op::read;
    r.key.variable = static_cast<std::uint64_t>(floats_of(bytes));
    r.payload = std::move(buffer);
    pss::Reply reply = f.transport.send(f.ps, std::move(r)).get();
    if (!reply.ok() || reply.payload.nbytes() != static_cast<std::size_t>(bytes))
        throw std::runtime_error("pss: bench_tcp: pull did not answer the value: " + reply.message);
    return std::move(reply.payload);
}

void tcp_push(benchmark::State& state, bool tls) {
    auto& f = TcpFixture::get(tls);
    pss::Tensor payload = pss::Tensor::zeros(pss::DType::float32, {floats_of(state.range(0))});
    for (auto _ : state) payload = push_once(f, std::move(payload), state.range(0));
    count(state, state.range(0));
}

void tcp_pull(benchmark::State& state, bool tls) {
    auto& f = TcpFixture::get(tls);
    pss::Tensor buffer = pss::Tensor::zeros(pss::DType::float32, {floats_of(state.range(0))});
    for (auto _ : state) buffer = pull_once(f, std::move(buffer), state.range(0));
    count(state, state.range(0));
}

void tcp_push_pull(benchmark::State& state, bool tls) {
    auto& f = TcpFixture::get(tls);
    pss::Tensor payload = pss::Tensor::zeros(pss::DType::float32, {floats_of(state.range(0))});
    pss::Tensor buffer = pss::Tensor::zeros(pss::DType::float32, {floats_of(state.range(0))});
    for (auto _ : state) {
        payload = push_once(f, std::move(payload), state.range(0));
        buffer = pull_once(f, std::move(buffer), state.range(0));
    }
    count(state, 2 * state.range(0));
}

/// A new link each time: connect (and handshake), one 1 KB push, close.
void new_link(benchmark::State& state, bool tls) {
    pss::Tensor payload = pss::Tensor::zeros(pss::DType::float32, {floats_of(KB)});
    for (auto _ : state) {
        TcpFixture f(tls);
        payload = push_once(f, std::move(payload), KB);
    }
    state.SetItemsProcessed(state.iterations());
}

void raw_push(benchmark::State& state) {
    auto& f = RawFixture::get();
    const auto n = static_cast<std::size_t>(state.range(0));
    f.client_buffer.resize(std::max(f.client_buffer.size(), n));
    for (auto _ : state) f.push(n);
    count(state, state.range(0));
}

void raw_pull(benchmark::State& state) {
    auto& f = RawFixture::get();
    const auto n = static_cast<std::size_t>(state.range(0));
    f.client_buffer.resize(std::max(f.client_buffer.size(), n));
    for (auto _ : state) f.pull(n);
    count(state, state.range(0));
}

void raw_push_pull(benchmark::State& state) {
    auto& f = RawFixture::get();
    const auto n = static_cast<std::size_t>(state.range(0));
    f.client_buffer.resize(std::max(f.client_buffer.size(), n));
    for (auto _ : state) {
        f.push(n);
        f.pull(n);
    }
    count(state, 2 * state.range(0));
}

void sizes(benchmark::internal::Benchmark* b) {
    for (std::int64_t n : {1 * KB, 64 * KB, 1 * MB, 16 * MB, 64 * MB}) b->Arg(n);
    b->UseRealTime();
}

}  // namespace

void tls_sizes(benchmark::internal::Benchmark* b) {
    for (std::int64_t n : {1 * KB, 1 * MB, 16 * MB, 64 * MB}) b->Arg(n);
    b->UseRealTime();
}

// Each TCP figure right after its raw baseline, so that both see the machine in the same state; each
// TLS figure right after plaintext's.
BENCHMARK(raw_push)->Apply(sizes);
BENCHMARK_CAPTURE(tcp_push, plain, false)->Apply(sizes);
BENCHMARK_CAPTURE(tcp_push, tls, true)->Apply(tls_sizes);
BENCHMARK(raw_pull)->Apply(sizes);
BENCHMARK_CAPTURE(tcp_pull, plain, false)->Apply(sizes);
BENCHMARK_CAPTURE(tcp_pull, tls, true)->Apply(tls_sizes);
BENCHMARK(raw_push_pull)->Apply(sizes);
BENCHMARK_CAPTURE(tcp_push_pull, plain, false)->Apply(sizes);
BENCHMARK_CAPTURE(tcp_push_pull, tls, true)->Apply(tls_sizes);
BENCHMARK_CAPTURE(new_link, plain, false)->UseRealTime();
BENCHMARK_CAPTURE(new_link, tls, true)->UseRealTime();

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "--serve") return serve();
    std::vector<pss_bench::Ratio> ratios;
    const std::vector<std::pair<std::string, std::int64_t>> sizes{
        {"1 KB", 1 * KB}, {"64 KB", 64 * KB}, {"1 MB", 1 * MB}, {"16 MB", 16 * MB}, {"64 MB", 64 * MB}};
    for (const char* kind : {"push", "pull", "push_pull"}) {
        for (const auto& [label, n] : sizes) {
            // Built with append: g++ 12 at -O3 warns falsely (-Wrestrict) on `"/" + std::to_string(n)`.
            std::string arg = "/";
            arg.append(std::to_string(n)).append("/real_time");
            std::string name(kind), figure("tcp_"), baseline("raw_");
            name.append(" ").append(label);
            figure.append(kind).append("/plain").append(arg);
            baseline.append(kind).append(arg);
            ratios.push_back({name, figure, baseline, n >= MB ? 0.8 : 0.0});
        }
    }
    // Latency as a rate: round trips per second at most 1.5x slower means at least 1 / 1.5 of the rate.
    ratios.push_back({"1 KB push round trips", "tcp_push/plain/1024/real_time", "raw_push/1024/real_time", 1.0 / 1.5,
                      "items_per_second"});
    // TLS against plaintext.
    for (const char* kind : {"push", "pull", "push_pull"}) {
        for (const auto& [label, n] : sizes) {
            if (n == 64 * KB) continue;
            std::string arg = "/";
            arg.append(std::to_string(n)).append("/real_time");
            std::string name("tls "), figure("tcp_"), baseline("tcp_");
            name.append(kind).append(" ").append(label);
            figure.append(kind).append("/tls").append(arg);
            baseline.append(kind).append("/plain").append(arg);
            ratios.push_back({name, figure, baseline, n >= MB ? 0.7 : 0.0});
        }
    }
    ratios.push_back({"tls 1 KB push round trips", "tcp_push/tls/1024/real_time", "tcp_push/plain/1024/real_time",
                      1.0 / 1.3, "items_per_second"});
    ratios.push_back({"new link + 1 KB push (TLS vs plain)", "new_link/tls/real_time", "new_link/plain/real_time", 0.0,
                      "items_per_second"});
    return pss_bench::run(argc, argv, ratios);
}
