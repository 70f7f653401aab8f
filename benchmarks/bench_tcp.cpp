// TcpTransport on loopback, issue 12's bench_pslite-style sweep: push, pull and push-then-pull of 1 KB,
// 1 MB, 16 MB and 64 MB; 1,000 rows of 1 KB read in one call (sparse_read); 1,000 single 1 KB pushes in
// flight. One client here, the ps in another process (as a ps runs), and beside each figure, in the same
// run, the same bytes through a tuned raw socket pair to that process. The limits: push, pull and
// push-then-pull at least 0.8x the raw socket's bytes per second from 1 MB up; a 1 KB round trip at most
// 1.3x the raw one's time (a rate at least 0.77x); the 1,000 rows in one call and the 1,000 pushes in
// flight at least 1.5x ps-lite's rates. ps-lite cannot be built here, so its figures are constants,
// measured in issue 12 in 2026-11 on a machine of this type, not in this run (marked * in the table).
//
// A push is assign_add: the payload crosses once, the reply hands the spent buffer back. A pull is a
// read into a reused buffer. For those the ps task hands back the buffer it is given without touching
// the elements, so the figures are the transport's own. The two sweep figures go through a real
// ParameterServer (a second ps task of the same process) and the library's own paths: Variable::
// sparse_read of a 16 Ki x 256 float32 table, and 1,000 assign_add requests to a 256-float variable
// sent through a Channel's asynchronous send before any reply is waited for.
//
// The raw baseline is the upper bound a hand-written loopback client and server reach: plain blocking
// POSIX sockets with TCP_NODELAY, no Asio in the data path; a message is one sendmsg of header and body
// (repeated only for what the kernel did not take) and one recv loop into the whole remaining buffer, as
// iperf writes; buffers are reused. Its server reads ahead into a 64 KiB stage (a small request with its
// header costs one recv) and answers pipelined pushes with one send of every ack due before it would
// block. A gather is answered with one sendmsg whose iovecs point at the table's rows (no copy in user
// space); a push in flight adds its 256 floats, as the ps does.
//
// TLS (mutual, TLS 1.3 AES-GCM): the same push and pull through a TLS link of the same server process,
// beside plaintext in the same run. The limits: at least 0.7x plaintext's bytes per second at 1,
// 16 and 64 MB, a 1 KB round trip at most 1.3x plaintext's. And the cost of a new link: connect,
// handshake and one 1 KB push, beside the same without TLS (no limit).
//
// A figure and its baselines are timed in one loop, call by call in turn (raw, plaintext pss, TLS pss,
// then back), and each rate comes from its median time per call: on this shared 2-core machine the
// neighbours' load swings loopback rates 2-4x within seconds, so baselines measured a few seconds apart
// (before 2026-12-04 every size of the raw socket ran, then every size of pss) gave ratios anywhere
// from 0.14 to 2.4 for the same code. The counters are pss_, raw_ and tls_bytes_per_second (and
// _items_per_second). One benchmark per kind and size: `bench_tcp --benchmark_filter='^pull/16777216'`,
// `gather`, `pushes_in_flight`, `new_link`. A whole run takes about 20 s.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <benchmark/benchmark.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include <pss/optimizer/sgd.hpp>
#include <pss/server.hpp>
#include <pss/transport/tcp.hpp>
#include <pss/variable.hpp>

#include "ratio_report.hpp"

namespace {

constexpr std::int64_t KB = 1 << 10;
constexpr std::int64_t MB = 1 << 20;

// The sweep's sparse figures: 1,000 rows of 1 KB (256 float32) from a table of 16 Ki rows, and 1,000
// single pushes of 1 KB.
constexpr std::size_t row_floats = 256;
constexpr std::size_t row_bytes = row_floats * sizeof(float);
constexpr std::size_t table_rows = 16 << 10;
constexpr std::size_t sweep_count = 1000;
constexpr int sweep_task = 1;                        // the ps task holding them (a ParameterServer)
constexpr std::uint64_t table_id = 1, pushed_id = 2, compressed_id = 3;  // its variables

// ps-lite's figures, measured in issue 12 (2026-11, on a machine of this type; not in this run).
constexpr double pslite_rows_per_second = 1.56e6;     // 1,000 rows of 1 KB read in one call
constexpr double pslite_pushes_per_second = 198e3;    // 1,000 single-key pushes in flight
constexpr double pslite_pull_16mb = 2.58e9;           // bytes/s
constexpr double pslite_pull_64mb = 1.28e9;           // bytes/s
constexpr double pslite_push_pull_1mb = 2.09e9;       // bytes/s

std::size_t floats_of(std::int64_t bytes) { return static_cast<std::size_t>(bytes) / sizeof(float); }

[[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error("pss: bench_tcp: " + what + ": " + std::strerror(errno));
}

// ---------------------------------------------------------------------------------------------------
// The raw socket pair: plain blocking POSIX calls.
// ---------------------------------------------------------------------------------------------------

namespace raw {

constexpr std::size_t max_iov = 1024;  // Linux's UIO_MAXIOV: the most iovecs one sendmsg takes

/// A command: what the client asks and how many bytes (a push or a pull), ids (a gather) or floats
/// (one push of the pipelined kind) follow or are answered.
struct Header {
    std::uint64_t op = 0;
    std::uint64_t n = 0;
};
enum : std::uint64_t { quit = 0, push = 1, pull = 2, gather = 3, small_push = 4 };

/// Sends every byte of `iov[0, count)`: one sendmsg, repeated only for what the kernel did not take.
/// Changes `iov`.
void send_all(int fd, iovec* iov, std::size_t count) {
    while (count > 0) {
        msghdr message{};
        message.msg_iov = iov;
        message.msg_iovlen = std::min(count, max_iov);
        const ssize_t sent = ::sendmsg(fd, &message, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR) continue;
            fail("raw sendmsg");
        }
        auto left = static_cast<std::size_t>(sent);
        while (count > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            ++iov;
            --count;
        }
        if (count > 0) {
            iov->iov_base = static_cast<char*>(iov->iov_base) + left;
            iov->iov_len -= left;
        }
    }
}

void send_all(int fd, const void* data, std::size_t n) {
    iovec one{const_cast<void*>(data), n};
    send_all(fd, &one, 1);
}

/// Receives exactly `n` bytes into `data`, one recv for all that is left each time; false when the
/// peer closed first.
bool recv_all(int fd, void* data, std::size_t n) {
    auto* at = static_cast<char*>(data);
    while (n > 0) {
        const ssize_t got = ::recv(fd, at, n, 0);
        if (got == 0) return false;
        if (got < 0) {
            if (errno == EINTR) continue;
            fail("raw recv");
        }
        at += got;
        n -= static_cast<std::size_t>(got);
    }
    return true;
}

void no_delay(int fd) {
    const int one = 1;
    if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) fail("raw TCP_NODELAY");
}

/// The raw server's side of its one connection.
class ServerConnection {
public:
    explicit ServerConnection(int fd) : fd_(fd) {
        for (std::size_t r = 0; r < table_rows; ++r)
            std::fill_n(table_.begin() + static_cast<std::ptrdiff_t>(r * row_floats), row_floats, static_cast<float>(r));
    }

    /// Answers commands until the client says quit or closes.
    void run() {
        for (;;) {
            Header h;
            if (!read(&h, sizeof h) || h.op == quit) return;
            switch (h.op) {
                case push:  // take n bytes, ack
                    if (buffer_.size() < h.n) buffer_.resize(h.n);
                    if (!read(buffer_.data(), h.n)) return;
                    ack_byte();
                    break;
                case pull:  // send n bytes
                    if (buffer_.size() < h.n) buffer_.resize(h.n);
                    send_all(fd_, buffer_.data(), h.n);
                    break;
                case gather: {  // n ids; answer their rows, each an iovec into the table
                    ids_.resize(h.n);
                    if (!read(ids_.data(), h.n * sizeof(std::int64_t))) return;
                    iov_.resize(h.n);
                    for (std::size_t i = 0; i < h.n; ++i) {
                        const auto id = static_cast<std::size_t>(ids_[i]);
                        if (id >= table_rows) throw std::runtime_error("pss: bench_tcp: raw gather: id out of range");
                        iov_[i] = {table_.data() + id * row_floats, row_bytes};
                    }
                    send_all(fd_, iov_.data(), iov_.size());
                    break;
                }
                case small_push: {  // n floats added to the variable; its ack waits for the batch's
                    if (h.n != row_floats) throw std::runtime_error("pss: bench_tcp: raw push of the wrong size");
                    std::array<float, row_floats> rows{};
                    if (!read(rows.data(), sizeof rows)) return;
                    for (std::size_t i = 0; i < row_floats; ++i) pushed_[i] += rows[i];
                    acks_.push_back(++pushes_);
                    break;
                }
                default: throw std::runtime_error("pss: bench_tcp: raw server: unknown command");
            }
        }
    }

private:
    void ack_byte() {
        const char ack = 1;
        send_all(fd_, &ack, 1);
    }

    /// Sends the acks due before a read that may block, in one send.
    void flush_acks() {
        if (acks_.empty()) return;
        send_all(fd_, acks_.data(), acks_.size() * sizeof(std::uint64_t));
        acks_.clear();
    }

    /// Fills `data` with `n` bytes: from the stage first, then small remainders through the stage (one
    /// recv takes the next commands too), large ones straight into `data` with one recv loop.
    bool read(void* data, std::size_t n) {
        auto* out = static_cast<char*>(data);
        const std::size_t staged = std::min(n, end_ - begin_);
        std::memcpy(out, stage_.data() + begin_, staged);
        begin_ += staged;
        out += staged;
        n -= staged;
        if (n == 0) return true;
        flush_acks();  // the next recv may block: the client waits for these
        begin_ = end_ = 0;
        if (n >= stage_.size() / 2) return recv_all(fd_, out, n);
        while (end_ < n) {
            const ssize_t got = ::recv(fd_, stage_.data() + end_, stage_.size() - end_, 0);
            if (got == 0) return false;
            if (got < 0) {
                if (errno == EINTR) continue;
                fail("raw recv");
            }
            end_ += static_cast<std::size_t>(got);
        }
        std::memcpy(out, stage_.data(), n);
        begin_ = n;
        return true;
    }

    int fd_;
    std::vector<char> stage_ = std::vector<char>(64 << 10);
    std::size_t begin_ = 0, end_ = 0;
    std::vector<char> buffer_;
    std::vector<float> table_ = std::vector<float>(table_rows * row_floats);
    std::vector<std::int64_t> ids_;
    std::vector<iovec> iov_;
    std::array<float, row_floats> pushed_{};
    std::vector<std::uint64_t> acks_;
    std::uint64_t pushes_ = 0;
};

/// A listening socket on 127.0.0.1 and a port of the system's choice.
int listen_loopback(std::uint16_t& port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("raw socket");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(fd, 1) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
        fail("raw listen");
    port = ntohs(address.sin_port);
    return fd;
}

int connect_loopback(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("raw socket");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) fail("raw connect");
    no_delay(fd);
    return fd;
}

}  // namespace raw

// ---------------------------------------------------------------------------------------------------
// The server process.
// ---------------------------------------------------------------------------------------------------

/// The servers run in a child process (this program with `--serve`), as a ps does in every real
/// deployment: a client and a server sharing one process and its io thread measure something else.
/// The child serves /job:ps/replica:0/task:0 (hands buffers back) and task:1 (a ParameterServer) over
/// TcpTransport, task:0 also over TLS, and the raw socket; prints the four ports on one line, and ends
/// when its standard input closes (this process ending, whatever the way).
struct ServerProcess {
    pid_t pid = -1;
    int to_child = -1;
    std::uint16_t tcp_port = 0, ps_port = 0, tls_port = 0, raw_port = 0;
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
        if (std::sscanf(line.c_str(), "%hu %hu %hu %hu", &tcp_port, &ps_port, &tls_port, &raw_port) != 4)
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

pss::TcpOptions plaintext() {
    pss::TcpOptions options;
    options.plaintext = true;
    return options;
}

/// The child: task 0 hands back the buffer it is given (without touching the elements, so the figures
/// are the transport's own: a ParameterServer adds one pass over the value); task 1 is a ParameterServer
/// for the sweep's table and pushed variable; and the raw socket server.
int serve() {
    const pss::ClusterSpec spec{{"ps", {"127.0.0.1:0", "127.0.0.1:0"}}};
    const pss::TaskId ps{"ps", 0}, ps1{"ps", 1};
    pss::ParameterServer<pss::SGD> server;  // outlives the transports' threads
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
    transport.serve(ps1, [&server](pss::Request&& r, pss::Responder respond) {
        server.handle(std::move(r), std::move(respond));
    });
    tls.serve(ps, hand_back);
    std::uint16_t raw_port = 0;
    const int listener = raw::listen_loopback(raw_port);
    std::printf("%u %u %u %u\n", static_cast<unsigned>(transport.bound_port(ps)),
                static_cast<unsigned>(transport.bound_port(ps1)), static_cast<unsigned>(tls.bound_port(ps)),
                static_cast<unsigned>(raw_port));
    std::fflush(stdout);
    std::thread raw_server([listener] {
        const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;  // no raw client came (the raw benchmarks filtered out)
        raw::no_delay(fd);
        raw::ServerConnection(fd).run();
        ::close(fd);
    });
    char c = 0;
    while (::read(STDIN_FILENO, &c, 1) > 0) {
    }
    // A raw client that never came: shutdown wakes the blocked accept, which closing does not.
    ::shutdown(listener, SHUT_RDWR);
    raw_server.join();
    ::close(listener);
    transport.shutdown();
    tls.shutdown();
    server.release_held();
    return 0;
}

// ---------------------------------------------------------------------------------------------------
// The clients.
// ---------------------------------------------------------------------------------------------------

pss::ClusterSpec server_spec(bool tls) {
    const auto& server = ServerProcess::get();
    return pss::ClusterSpec{{"ps",
                             {"127.0.0.1:" + std::to_string(tls ? server.tls_port : server.tcp_port),
                              "127.0.0.1:" + std::to_string(server.ps_port)}}};
}

/// This process's transport, sending to the server process's tasks: plaintext, or TLS as the chief.
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

/// What a Variable sends through: the plaintext transport's ps tasks, as a strategy's channel.
class BenchChannel final : public pss::detail::Channel {
public:
    explicit BenchChannel(pss::TcpTransport& transport) : transport_(transport) {}
    std::future<pss::Reply> send(int task, pss::Request request) override {
        return transport_.send(pss::TaskId{"ps", task}, std::move(request));
    }
    [[nodiscard]] std::string device(int task) const override {
        return pss::TaskId{"ps", task}.to_string() + "/device:CPU:0";
    }

private:
    pss::TcpTransport& transport_;
};

/// The sweep's variables on ps task 1, the ids read in one call, and the buffers pushed in flight.
struct SweepFixture {
    std::shared_ptr<BenchChannel> channel = std::make_shared<BenchChannel>(TcpFixture::get().transport);
    pss::Variable table;
    pss::Variable pushed;
    std::vector<std::int64_t> ids;
    std::vector<pss::Tensor> payloads;

    SweepFixture() {
        // Row r holds r in every element, so that a read can be checked.
        xt::xarray<float> value = xt::xarray<float>::from_shape({table_rows, row_floats});
        for (std::size_t r = 0; r < table_rows; ++r)
            std::fill_n(value.data() + r * row_floats, row_floats, static_cast<float>(r));
        table = pss::detail::create_sharded(channel, table_id, "table", pss::Tensor(std::move(value)), {table_rows}, {sweep_task});
        pushed = pss::detail::create_sharded(channel, pushed_id, "pushed",
                                             pss::Tensor::zeros(pss::DType::float32, {row_floats}), {1}, {sweep_task});
        std::mt19937_64 random(12);
        std::uniform_int_distribution<std::int64_t> row(0, static_cast<std::int64_t>(table_rows) - 1);
        for (std::size_t i = 0; i < sweep_count; ++i) ids.push_back(row(random));
        for (std::size_t i = 0; i < sweep_count; ++i)
            payloads.push_back(pss::Tensor(xt::xarray<float>(xt::ones<float>({row_floats}))));
    }
    static SweepFixture& get() {
        static SweepFixture fixture;
        return fixture;
    }
};

/// Throws unless `rows` (float32, one row per id, each of 256) holds row `ids[i]`'s value in row i.
void check_rows(const float* rows, const std::vector<std::int64_t>& ids) {
    for (std::size_t i = 0; i < ids.size(); ++i)
        if (rows[i * row_floats] != static_cast<float>(ids[i]) || rows[i * row_floats + row_floats - 1] != rows[i * row_floats])
            throw std::runtime_error("pss: bench_tcp: row " + std::to_string(i) + " of a gather is not row " +
                                     std::to_string(ids[i]));
}

/// The raw client: one connection to the server process's raw socket, its buffers reused.
struct RawFixture {
    int fd = raw::connect_loopback(ServerProcess::get().raw_port);
    std::vector<char> buffer;
    std::vector<char> frames;  // sweep_count pipelined pushes, each a header and its 1 KB
    std::vector<std::uint64_t> acks = std::vector<std::uint64_t>(sweep_count);

    RawFixture() {
        const raw::Header h{raw::small_push, row_floats};
        std::array<float, row_floats> ones{};
        ones.fill(1.0f);
        for (std::size_t i = 0; i < sweep_count; ++i) {
            frames.insert(frames.end(), reinterpret_cast<const char*>(&h), reinterpret_cast<const char*>(&h + 1));
            frames.insert(frames.end(), reinterpret_cast<const char*>(ones.data()),
                          reinterpret_cast<const char*>(ones.data() + ones.size()));
        }
    }
    ~RawFixture() {
        const raw::Header h{raw::quit, 0};
        (void)::send(fd, &h, sizeof h, MSG_NOSIGNAL);
        ::close(fd);
    }
    void reserve(std::size_t n) {
        if (buffer.size() < n) buffer.resize(n);
    }
    void expect(bool received) const {
        if (!received) throw std::runtime_error("pss: bench_tcp: the raw server closed its connection");
    }
    void push(std::size_t n) {
        raw::Header h{raw::push, n};
        std::array<iovec, 2> iov{iovec{&h, sizeof h}, iovec{buffer.data(), n}};
        raw::send_all(fd, iov.data(), iov.size());
        char ack = 0;
        expect(raw::recv_all(fd, &ack, 1));
    }
    void pull(std::size_t n) {
        const raw::Header h{raw::pull, n};
        raw::send_all(fd, &h, sizeof h);
        expect(raw::recv_all(fd, buffer.data(), n));
    }
    /// The rows of `ids` into `buffer`: a header and the ids in one sendmsg, the rows in one recv loop.
    void gather(const std::vector<std::int64_t>& ids) {
        raw::Header h{raw::gather, ids.size()};
        std::array<iovec, 2> iov{iovec{&h, sizeof h},
                                 iovec{const_cast<std::int64_t*>(ids.data()), ids.size() * sizeof(std::int64_t)}};
        raw::send_all(fd, iov.data(), iov.size());
        expect(raw::recv_all(fd, buffer.data(), ids.size() * row_bytes));
    }
    /// sweep_count pushes written back to back, then their acks read.
    void pushes() {
        raw::send_all(fd, frames.data(), frames.size());
        expect(raw::recv_all(fd, acks.data(), acks.size() * sizeof(std::uint64_t)));
    }
    static RawFixture& get() {
        static RawFixture fixture;
        return fixture;
    }
};

// ---------------------------------------------------------------------------------------------------
// The benchmarks.
// ---------------------------------------------------------------------------------------------------

/// Runs `ops` (named "raw", "pss", "tls") in turn in every iteration, forwards and backwards on
/// alternate ones, timing each call, so that each operation and its baseline meet this shared machine in
/// the same milliseconds. Reports each one's rates as counters `<name>_bytes_per_second` and
/// `<name>_items_per_second`, from its median time per call (a burst of the neighbours' load moves a
/// median little).
void alternate(benchmark::State& state, const std::vector<std::pair<std::string, std::function<void()>>>& ops,
               double bytes_per_call, double items_per_call) {
    for (const auto& op : ops) op.second();  // untimed: connections made, buffers faulted in
    std::vector<std::vector<double>> seconds(ops.size());
    std::size_t round = 0;
    for (auto _ : state) {
        for (std::size_t k = 0; k < ops.size(); ++k) {
            const std::size_t i = round % 2 == 0 ? k : ops.size() - 1 - k;
            const auto start = std::chrono::steady_clock::now();
            ops[i].second();
            seconds[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        ++round;
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
        auto& s = seconds[i];
        std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2), s.end());
        const double median = s[s.size() / 2];
        state.counters[ops[i].first + "_bytes_per_second"] = bytes_per_call / median;
        state.counters[ops[i].first + "_items_per_second"] = items_per_call / median;
    }
}

pss::Tensor push_once(TcpFixture& f, pss::Tensor payload, std::int64_t bytes) {
    pss::Request r;
    r.op = pss::Op::assign_add;
    r.key.variable = static_cast<std::uint64_t>(floats_of(bytes));
    r.payload = std::move(payload);
    r.in_process.waited_at_once = true;  // as a Variable operation waited for at once
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
    r.in_process.waited_at_once = true;
    pss::Reply reply = f.transport.send(f.ps, std::move(r)).get();
    if (!reply.ok() || reply.payload.nbytes() != static_cast<std::size_t>(bytes))
        throw std::runtime_error("pss: bench_tcp: pull did not answer the value: " + reply.message);
    return std::move(reply.payload);
}

enum class Kind { push, pull, push_pull };

/// A push, a pull, or a push then a pull of `state.range(0)` bytes: the raw socket's, plaintext pss's
/// and TLS pss's in turn. A push then pull counts the bytes of both.
void transfer(benchmark::State& state, Kind kind) {
    const std::int64_t n = state.range(0);
    auto& raw = RawFixture::get();
    raw.reserve(static_cast<std::size_t>(n));
    struct Link {
        TcpFixture& fixture;
        pss::Tensor payload, buffer;
    };
    const auto zeros = [&] { return pss::Tensor::zeros(pss::DType::float32, {floats_of(n)}); };
    Link plain{TcpFixture::get(false), zeros(), zeros()}, tls{TcpFixture::get(true), zeros(), zeros()};
    const bool pushes = kind != Kind::pull, pulls = kind != Kind::push;
    const auto through = [&](Link& link) {
        if (pushes) link.payload = push_once(link.fixture, std::move(link.payload), n);
        if (pulls) link.buffer = pull_once(link.fixture, std::move(link.buffer), n);
    };
    alternate(state,
              {{"raw",
                [&] {
                    if (pushes) raw.push(static_cast<std::size_t>(n));
                    if (pulls) raw.pull(static_cast<std::size_t>(n));
                }},
               {"pss", [&] { through(plain); }},
               {"tls", [&] { through(tls); }}},
              static_cast<double>(kind == Kind::push_pull ? 2 * n : n), 1);
}

/// 1,000 rows of 1 KB in one call: Variable::sparse_read through the transport to the ps process,
/// beside the raw gather.
void gather(benchmark::State& state) {
    auto& s = SweepFixture::get();
    auto& raw = RawFixture::get();
    raw.reserve(sweep_count * row_bytes);
    raw.gather(s.ids);
    check_rows(reinterpret_cast<const float*>(raw.buffer.data()), s.ids);
    check_rows(s.table.sparse_read(s.ids).get<float>().data(), s.ids);
    alternate(state,
              {{"raw", [&] { raw.gather(s.ids); }},
               {"pss", [&] { benchmark::DoNotOptimize(s.table.sparse_read(s.ids)); }}},
              static_cast<double>(sweep_count * row_bytes), static_cast<double>(sweep_count));
}

/// 1,000 single pushes of 1 KB in flight: each an assign_add request of its own, all sent through the
/// channel's asynchronous send before the first reply is waited for (each reply hands its buffer back),
/// beside 1,000 raw pushes written back to back and their acks read, 1,000 Variable::assign_add in a
/// pss::Group, and the same 1,000 each waiting for its reply.
void pushes_in_flight(benchmark::State& state) {
    auto& s = SweepFixture::get();
    auto& raw = RawFixture::get();
    std::vector<std::future<pss::Reply>> replies(sweep_count);
    const auto pss_pushes = [&] {
        for (std::size_t i = 0; i < sweep_count; ++i) {
            pss::Request r;
            r.op = pss::Op::assign_add;
            r.key = {pushed_id, 0};
            r.payload = std::move(s.payloads[i]);
            replies[i] = s.channel->send(sweep_task, std::move(r));
        }
        for (std::size_t i = 0; i < sweep_count; ++i) {
            pss::Reply reply = replies[i].get();
            if (!reply.ok()) throw std::runtime_error("pss: bench_tcp: a push failed: " + reply.message);
            s.payloads[i] = std::move(reply.payload);
        }
    };
    // The same pushes as a user writes them: Variable::assign_add in a pss::Group, waited for as one
    // (each push a new gradient tensor, as a training step makes).
    const pss::Tensor gradient = pss::Tensor(xt::xarray<float>(xt::ones<float>({row_floats})));
    const auto group_pushes = [&] {
        pss::Group group;
        for (std::size_t i = 0; i < sweep_count; ++i) s.pushed.assign_add(gradient);
        group.wait();
    };
    // And one by one, each waiting for its reply: what a Group saves.
    const auto each_push = [&] {
        for (std::size_t i = 0; i < sweep_count; ++i) s.pushed.assign_add(gradient);
    };
    alternate(state, {{"raw", [&] { raw.pushes(); }}, {"pss", pss_pushes}, {"group", group_pushes}, {"each", each_push}},
              static_cast<double>(sweep_count * row_bytes), static_cast<double>(sweep_count));
}

/// A 16 MB float32 variable on the ps process, its gradient pushed (apply_gradient: the ps applies SGD)
/// or its value read (read_into, the buffer reused), as float32 ("pss"), bfloat16 and float16 in turn:
/// a compressed call sends half the bytes and rounds (pushes with error feedback) on this side, narrows
/// or widens on the other. Rates in float32 bytes, so that a ratio is the time saved.
void compressed(benchmark::State& state, Kind kind) {
    constexpr std::size_t floats = 16 * MB / sizeof(float);
    static pss::Variable v = pss::detail::create_sharded(SweepFixture::get().channel, compressed_id, "compressed",
                                                         pss::Tensor::zeros(pss::DType::float32, {floats}), {1}, {sweep_task});
    pss::Tensor gradient(xt::xarray<float>(xt::ones<float>({floats}) * 1e-3f));
    xt::xarray<float> value;
    const auto call = [&](pss::Compression c) {
        return [&, c] {
            v.set_compression(c);
            if (kind == Kind::push)
                gradient = v.apply_gradient(std::move(gradient));  // the spent gradient handed back
            else
                v.read_into(value);
        };
    };
    alternate(state,
              {{"pss", call(pss::Compression::none)},
               {"bf16", call(pss::Compression::bfloat16)},
               {"fp16", call(pss::Compression::float16)}},
              static_cast<double>(16 * MB), 1);
}

/// A new link each time: connect (and handshake), one 1 KB push, close; plaintext ("pss") and TLS.
void new_link(benchmark::State& state) {
    pss::Tensor payload = pss::Tensor::zeros(pss::DType::float32, {floats_of(KB)});
    const auto link = [&](bool tls) {
        TcpFixture f(tls);
        payload = push_once(f, std::move(payload), KB);
    };
    alternate(state, {{"pss", [&] { link(false); }}, {"tls", [&] { link(true); }}}, static_cast<double>(KB), 1);
}

constexpr std::array<std::int64_t, 4> sweep_sizes{1 * KB, 1 * MB, 16 * MB, 64 * MB};

/// Calls per benchmark: about a second of this machine each, under load.
std::int64_t calls_for(std::int64_t bytes) {
    return bytes <= KB ? 2000 : bytes <= MB ? 300 : bytes <= 16 * MB ? 30 : 10;
}

std::string size_label(std::int64_t n) { return n >= MB ? std::to_string(n / MB) + " MB" : std::to_string(n / KB) + " KB"; }

const char* kind_name(Kind kind) { return kind == Kind::push ? "push" : kind == Kind::pull ? "pull" : "push_pull"; }

/// The run name Google Benchmark gives a benchmark registered as `name` with `calls` iterations.
std::string run_name(const std::string& name, std::int64_t calls) {
    std::string run = name;
    run.append("/iterations:").append(std::to_string(calls));
    return run;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "--serve") return serve();
    std::vector<pss_bench::Ratio> ratios, tls_ratios;
    // Rates from counters: pss's (or TLS's) against the raw socket's (or plaintext's) of the same run.
    const auto against = [](std::string name, std::string run, double limit, const char* figure, const char* baseline) {
        return pss_bench::Ratio{std::move(name), run, run, limit, figure, 0, baseline};
    };
    for (Kind kind : {Kind::push, Kind::pull, Kind::push_pull}) {
        for (std::int64_t n : sweep_sizes) {
            // Built with append: g++ 12 at -O3 warns falsely (-Wrestrict) on `"/" + std::to_string(n)`.
            benchmark::RegisterBenchmark(kind_name(kind), [kind](benchmark::State& s) { transfer(s, kind); })
                ->Arg(n)
                ->Iterations(calls_for(n));
            std::string run = kind_name(kind);
            run.append("/").append(std::to_string(n));
            run = run_name(run, calls_for(n));
            std::string label = kind_name(kind);
            label.append(" ").append(size_label(n));
            ratios.push_back(against(label + " vs raw", run, n >= MB ? 0.8 : 0.0, "pss_bytes_per_second",
                                     "raw_bytes_per_second"));
            tls_ratios.push_back(against("tls " + label + " vs plain", run, n >= MB ? 0.7 : 0.0, "tls_bytes_per_second",
                                         "pss_bytes_per_second"));
            if (n == KB && kind != Kind::push_pull) {
                // Latency as a rate: a round trip at most 1.3x the raw one's time is at least 1 / 1.3 of its rate.
                ratios.push_back(against("1 KB " + label.substr(0, 4) + " round trips vs raw", run, 1.0 / 1.3,
                                         "pss_items_per_second", "raw_items_per_second"));
                if (kind == Kind::push)
                    tls_ratios.push_back(against("tls 1 KB push round trips vs plain", run, 1.0 / 1.3,
                                                 "tls_items_per_second", "pss_items_per_second"));
            }
        }
    }
    benchmark::RegisterBenchmark("gather/1000x1KB", gather)->Iterations(1000);
    benchmark::RegisterBenchmark("pushes_in_flight/1000x1KB", pushes_in_flight)->Iterations(100);
    benchmark::RegisterBenchmark("new_link", new_link)->Iterations(200);
    benchmark::RegisterBenchmark("compressed_push/16MB", [](benchmark::State& s) { compressed(s, Kind::push); })
        ->Iterations(30);
    benchmark::RegisterBenchmark("compressed_pull/16MB", [](benchmark::State& s) { compressed(s, Kind::pull); })
        ->Iterations(30);
    const std::string gathered = run_name("gather/1000x1KB", 1000), pushed = run_name("pushes_in_flight/1000x1KB", 100);
    ratios.push_back(against("1,000 rows of 1 KB, 1 call vs raw", gathered, 0.0, "pss_items_per_second",
                             "raw_items_per_second"));
    ratios.push_back(against("1,000 pushes in flight vs raw", pushed, 0.0, "pss_items_per_second", "raw_items_per_second"));
    // Against ps-lite's figures of 2026-11 (constants, not this run).
    const auto pslite = [](std::string name, std::string run, double limit, const char* counter, double figure) {
        return pss_bench::Ratio{std::move(name), run, run, limit, counter, figure};
    };
    ratios.push_back(pslite("1,000 rows of 1 KB, 1 call vs ps-lite", gathered, 1.5, "pss_items_per_second",
                            pslite_rows_per_second));
    ratios.push_back(pslite("1,000 pushes in flight vs ps-lite", pushed, 0.0, "pss_items_per_second",
                            pslite_pushes_per_second));
    ratios.push_back(against("1,000 pushes in a Group vs raw", pushed, 0.0, "group_items_per_second", "raw_items_per_second"));
    ratios.push_back(against("1,000 pushes in a Group vs one by one", pushed, 0.0, "group_items_per_second",
                             "each_items_per_second"));
    ratios.push_back(pslite("1,000 pushes in a Group vs ps-lite", pushed, 1.5, "group_items_per_second",
                            pslite_pushes_per_second));
    ratios.push_back(pslite("pull 16 MB vs ps-lite", run_name("pull/16777216", calls_for(16 * MB)), 0.0,
                            "pss_bytes_per_second", pslite_pull_16mb));
    ratios.push_back(pslite("pull 64 MB vs ps-lite", run_name("pull/67108864", calls_for(64 * MB)), 0.0,
                            "pss_bytes_per_second", pslite_pull_64mb));
    ratios.push_back(pslite("push_pull 1 MB vs ps-lite", run_name("push_pull/1048576", calls_for(MB)), 0.0,
                            "pss_bytes_per_second", pslite_push_pull_1mb));
    ratios.insert(ratios.end(), tls_ratios.begin(), tls_ratios.end());
    ratios.push_back(against("new link + 1 KB push (TLS vs plain)", run_name("new_link", 200), 0.0,
                             "tls_items_per_second", "pss_items_per_second"));
    for (const char* kind : {"push", "pull"})
        for (const char* c : {"bf16", "fp16"}) {
            std::string name = "compressed_";
            name.append(kind).append("/16MB");
            std::string label = c;
            label.append(" ").append(kind).append(" 16 MB (half the bytes) vs float32");
            ratios.push_back(against(label, run_name(name, 30), 0.0,
                                     std::string(c) == "bf16" ? "bf16_bytes_per_second" : "fp16_bytes_per_second",
                                     "pss_bytes_per_second"));
        }
    return pss_bench::run(argc, argv, ratios,
                          "Rates from the median time of each call, the raw socket's, pss's and TLS pss's in turn in "
                          "one loop.\n* a constant, not this run: ps-lite's figure measured in issue 12 in 2026-11 on a "
                          "machine of this type (ps-lite cannot be built here). A push_pull's bytes count both directions.");
}
