// Tests of the wire format (pss/wire.hpp) and the TCP transport (pss/transport/tcp.hpp), on 127.0.0.1.
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <csignal>
#include <cstdio>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio.hpp>
#include <doctest/doctest.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include <pss/pss.hpp>

namespace {

using Bytes = std::vector<std::byte>;
using Ids = std::vector<std::int64_t>;

Bytes frame_bytes(const pss::OutgoingFrame& frame) { return frame.bytes(); }

/// The frame of assign_add of float32 [1.5, -2] to shard 7/2, named "w", with ids {3, -1}, id 0x0102030405060708.
pss::Request known_request() {
    pss::Request r;
    r.op = pss::Op::assign_add;
    r.key = {7, 2};
    r.name = "w";
    r.payload = xt::xarray<float>{1.5f, -2.0f};
    r.ids = {3, -1};
    r.step = 5;
    return r;
}

Bytes known_frame() {
    const auto request = known_request();
    return frame_bytes(pss::OutgoingFrame::request(request, 0x0102030405060708u, 1, false));
}

void put_u32(Bytes& b, std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}
void put_u64(Bytes& b, std::size_t at, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}

std::uint64_t get_le(const Bytes& b, std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(b[at + static_cast<std::size_t>(i)]);
    return v;
}

/// Re-seals a frame whose header or sections a test changed, so that only the intended check fails.
void reseal(Bytes& b) {
    const std::size_t body = get_le(b, 38, 2) * 8 + get_le(b, 40, 4) + get_le(b, 44, 4) + get_le(b, 72, 4) +
                             get_le(b, 48, 8) * 8;
    std::uint32_t crc = pss::crc32c(0, std::span<const std::byte>(b.data(), 76));
    crc = pss::crc32c(crc, std::span<const std::byte>(b.data() + 80, std::min(body, b.size() - 80)));
    put_u32(b, 76, crc);
}

std::string decode_error(const Bytes& b, const pss::WireLimits& limits = {}) {
    try {
        (void)pss::decode_frame(b, limits);
    } catch (const pss::WireError& e) {
        return e.what();
    }
    return "(decoded)";
}

pss::ClusterSpec one_ps() { return pss::ClusterSpec{{"ps", {"127.0.0.1:0"}}}; }

/// "127.0.0.1:<port>" where nothing listens: a port the system just gave out, closed again.
std::string nobody_listens() {
    asio::io_context io;
    asio::ip::tcp::acceptor probe(io, {asio::ip::address_v4::loopback(), 0});
    return "127.0.0.1:" + std::to_string(probe.local_endpoint().port());
}

/// A blocking client on a raw socket, for hostile bytes.
/// `options` with plaintext links. The attack tests send raw frames, so their ps is plaintext: the bounds
/// they test hold for any peer that gets past TLS (a stranger without a certificate does not: see the
/// TLS tests).
pss::TcpOptions plaintext(pss::TcpOptions options = {}) {
    options.plaintext = true;
    return options;
}

struct RawClient {
    asio::io_context io;
    asio::ip::tcp::socket socket{io};
    explicit RawClient(std::uint16_t port) {
        socket.connect({asio::ip::address_v4::loopback(), port});
    }
    void write(const Bytes& b) { asio::write(socket, asio::buffer(b)); }
    /// Everything the server sends until it closes (EOF or reset).
    Bytes read_to_close() {
        Bytes out;
        std::error_code ec;
        asio::read(socket, asio::dynamic_buffer(out), ec);
        return out;
    }
};


/// A Group's writes on `strategy`'s 2 ps tasks (each variable split in 2), waited for as one: exact values,
/// a read in the group sees the writes before it, a call's own error is raised by the call, a ps's error
/// by wait() after every write ran, groups nest, and another thread's writes are not the group's.
template <class Strategy>
void check_group(Strategy& strategy) {
    const xt::xarray<float> ones = xt::ones<float>({6, 2});
    const xt::xarray<std::int64_t> add_one = {1, 1, 1, 1};
    auto scope = strategy.scope();
    pss::Variable table(xt::xarray<float>(xt::reshape_view(xt::arange<float>(12), {6, 2})), "table");  // row r: 2r, 2r + 1
    pss::Variable counts(xt::xarray<std::int64_t>{10, 20, 30, 40}, "counts");
    REQUIRE(table.shard_tasks() == std::vector<int>{0, 1});
    REQUIRE(counts.num_shards() == 2);
    {
        pss::Group group;
        CHECK(pss::Group::current() == &group);
        table.assign_add(ones);
        table.scatter_add(Ids{0, 5, 0}, xt::xarray<float>{{1, 1}, {2, 2}, {4, 4}});
        counts.assign_sub(xt::xarray<std::int64_t>{1, 2, 3, 4});
        table.apply_gradient(xt::xarray<float>(ones * 2.0f));  // SGD 0.5: minus 1
        CHECK(group.pending() == 8);  // one request per shard reached
        CHECK(counts.read<std::int64_t>() == xt::xarray<std::int64_t>{9, 18, 27, 36});
        CHECK(group.pending() == 8);  // the read was not the group's
        CHECK_THROWS_WITH_AS(counts.assign(xt::xarray<std::int64_t>{1, 2}), doctest::Contains("shape"),
                             pss::InvalidArgumentError);
        CHECK(group.pending() == 8);  // nothing of it was sent
        group.wait();
        CHECK(group.pending() == 0);
    }
    CHECK(pss::Group::current() == nullptr);
    CHECK(table.read<float>() == xt::xarray<float>{{5, 6}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {12, 13}});
    {
        // A gradient the ps of shard 1 refuses: wait() raises its error, after every write of the group ran.
        pss::Group group;
        counts.assign_add(add_one);
        xt::xarray<float> bad = xt::zeros<float>({6, 2});
        bad(4, 1) = std::numeric_limits<float>::quiet_NaN();
        table.apply_gradient(bad);
        counts.assign_add(add_one);
        CHECK_THROWS_WITH_AS(group.wait(), doctest::Contains("'table/part_1': the gradient holds 1 non-finite value"),
                             pss::InvalidArgumentError);
        CHECK(group.pending() == 0);
        CHECK(group.failed() == std::vector<std::uint64_t>{table.id()});  // the variable whose write failed
        CHECK(counts.read<std::int64_t>() == xt::xarray<std::int64_t>{11, 20, 29, 38});
        CHECK(table.read<float>() == xt::xarray<float>{{5, 6}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {12, 13}});
        group.wait();  // nothing more to raise
        CHECK(group.failed().empty());
    }
    {
        pss::Group outer;
        counts.assign_add(add_one);
        {
            pss::Group inner;
            CHECK(pss::Group::current() == &inner);
            counts.assign_add(add_one);
            counts.assign_add(add_one);
            CHECK(inner.pending() == 4);
            CHECK(outer.pending() == 2);
        }  // waits for its writes
        CHECK(pss::Group::current() == &outer);
        CHECK(counts.read<std::int64_t>() == xt::xarray<std::int64_t>{14, 23, 32, 41});
        std::thread([&] {
            CHECK(pss::Group::current() == nullptr);
            counts.assign_add(add_one);  // waited for on its own thread
        }).join();
        CHECK(outer.pending() == 2);
        outer.wait();
    }
    CHECK(counts.read<std::int64_t>() == xt::xarray<std::int64_t>{15, 24, 33, 42});

    // Reads in flight together: each future's get() gives its value; an error of the call is raised by the call.
    pss::TensorFuture whole = table.read_value_async();
    pss::TensorFuture rows = table.sparse_read_async(Ids{5, 0, 3});
    pss::TensorFuture none = counts.sparse_read_async(Ids{});
    CHECK_THROWS_WITH_AS((void)counts.sparse_read_async(Ids{4}), doctest::Contains("id 4 is out of range"),
                         pss::InvalidArgumentError);
    CHECK(rows.get().get<float>() == xt::xarray<float>{{12, 13}, {5, 6}, {6, 7}});
    CHECK(whole.get().get<float>() == xt::xarray<float>{{5, 6}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {12, 13}});
    CHECK(none.get().shape() == pss::Shape{0});
    CHECK(!rows.valid());
    CHECK_THROWS_WITH_AS((void)rows.get(), doctest::Contains("get() was called already"), pss::FailedPreconditionError);
}

}  // namespace

TEST_SUITE("net") {
    // ---- wire -------------------------------------------------------------------------------------------

    TEST_CASE("wire: crc32c of \"123456789\" is 0xe3069283 and can be computed in pieces" * doctest::timeout(30)) {
        const std::string text = "123456789";
        const auto bytes = std::as_bytes(std::span<const char>(text.data(), text.size()));
        CHECK(pss::crc32c(0, bytes) == 0xE3069283u);
        CHECK(pss::crc32c(pss::crc32c(0, bytes.first(5)), bytes.subspan(5)) == 0xE3069283u);
        CHECK(pss::crc32c(0, {}) == 0u);
    }

    TEST_CASE("wire: the frame of assign_add [1.5, -2] to shard 7/2 has these exact 80 + 33 + 8 bytes" *
              doctest::timeout(30)) {
        const Bytes b = known_frame();
        REQUIRE(b.size() == 80 + 16 + 1 + 16 + 8);
        const std::array<std::uint8_t, 76> expected_header{
            'P',  'S', 'S', '1',                      // magic
            2,    0,                                  // version 2
            4,                                        // kind: assign_add
            0,                                        // flags: none
            0,    0,   0,   0,                        // error code ok
            8,    7,   6,   5,   4, 3, 2, 1,          // request id 0x0102030405060708
            1,    0,   0,   0,                        // task 1
            7,    0,   0,   0,   0, 0, 0, 0,          // variable 7
            2,    0,   0,   0,                        // shard 2
            1,    0,                                  // 1 tensor
            2,    0,                                  // 2 descriptor words
            1,    0,   0,   0,                        // name length 1
            0,    0,   0,   0,                        // message length 0
            2,    0,   0,   0,   0, 0, 0, 0,          // 2 ids
            8,    0,   0,   0,   0, 0, 0, 0,          // payload 8 bytes
            5,    0,   0,   0,   0, 0, 0, 0,          // step 5
            0,    0,   0,   0};                       // values length 0
        for (std::size_t i = 0; i < expected_header.size(); ++i) {
            CAPTURE(i);
            CHECK(std::to_integer<std::uint8_t>(b[i]) == expected_header[i]);
        }
        // The checksum: CRC-32C of header bytes 0..75 and the sections, not the payload.
        const std::uint32_t crc = pss::crc32c(0, std::span<const std::byte>(b.data(), 76));
        const std::uint32_t expected_crc = pss::crc32c(crc, std::span<const std::byte>(b.data() + 80, 16 + 1 + 16));
        const auto carried = static_cast<std::uint32_t>(get_le(b, 76, 4));
        CHECK(carried == expected_crc);
        CHECK(carried == 0x0ba5a541u);  // pinned: a change of layout or checksum shows up here
        const std::array<std::uint8_t, 41> expected_sections{
            1, 1, 0, 0, 0, 0, 0, 0,                          // descriptor: float32 (1), rank 1
            2, 0, 0, 0, 0, 0, 0, 0,                          // shape (2,)
            'w',                                             // name
            3, 0, 0, 0, 0, 0, 0, 0,                          // id 3
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // id -1
            0, 0, 0xc0, 0x3f,                                // 1.5f
            0, 0, 0, 0xc0};                                  // -2.0f
        for (std::size_t i = 0; i < expected_sections.size(); ++i) {
            CAPTURE(i);
            CHECK(std::to_integer<std::uint8_t>(b[80 + i]) == expected_sections[i]);
        }
    }

    TEST_CASE("wire: a request and a reply round-trip through decode_frame to equal values" * doctest::timeout(30)) {
        const Bytes b = known_frame();
        auto frame = pss::decode_frame(b);
        CHECK(frame.size == b.size());
        CHECK(frame.header.request_id == 0x0102030405060708u);
        CHECK(frame.header.task == 1u);
        auto request = pss::to_request(frame.header, frame.body, std::move(frame.payload));
        CHECK(request.kind == pss::RequestKind::operation);
        CHECK(request.op == pss::Op::assign_add);
        CHECK(request.key == pss::ShardKey{7, 2});
        CHECK(request.name == "w");
        CHECK(request.ids == Ids{3, -1});
        CHECK(request.step == 5u);
        CHECK(request.payload.get<float>() == xt::xarray<float>{1.5f, -2.0f});

        pss::Reply reply{pss::ErrorCode::out_of_range, "pss: id 9 is out of range", xt::xarray<std::int64_t>{{1, 2}, {3, 4}}, {}};
        const Bytes rb = frame_bytes(pss::OutgoingFrame::reply(reply, 42, 3, false));
        auto rf = pss::decode_frame(rb);
        CHECK(rf.header.is_reply());
        auto back = pss::to_reply(rf.header, rf.body, std::move(rf.payload));
        CHECK(back.code == pss::ErrorCode::out_of_range);
        CHECK(back.message == "pss: id 9 is out of range");
        CHECK(back.payload.get<std::int64_t>() == xt::xarray<std::int64_t>{{1, 2}, {3, 4}});

        // An elided payload travels as its dtype and shape only.
        pss::Request read;
        read.payload = xt::xarray<double>(xt::zeros<double>({3, 5}));
        const Bytes eb = frame_bytes(pss::OutgoingFrame::request(read, 1, 0, true));
        CHECK(eb.size() == 80 + 24);
        auto ef = pss::decode_frame(eb);
        CHECK(ef.header.payload_elided());
        CHECK(ef.body.payload().dtype == pss::DType::float64);
        CHECK(ef.body.payload().shape == pss::Shape{3, 5});
        CHECK_FALSE(ef.payload.has_value());

        // A call: its function, its CBOR values and three tensors (one of rank 0) as sections of their own.
        pss::Request call;
        call.kind = pss::RequestKind::call;
        call.name = "f";
        call.values.cbor = {0x82, 0x01, 0x02};  // [1, 2]
        call.values.tensors = {pss::Tensor(xt::xarray<float>{1.0f, 2.0f}), pss::Tensor(xt::xarray<std::int64_t>(xt::ones<std::int64_t>(pss::Shape{}) * 7)),
                               pss::Tensor(xt::xarray<double>{{0.5, 1.0}, {-0.5, 2.0}})};
        const Bytes cb = frame_bytes(pss::OutgoingFrame::request(call, 5, 0, false));
        CHECK(cb.size() == 80 + 8 * (2 + 1 + 3) + 1 + 3 + 8 + 8 + 32);
        CHECK(std::to_integer<int>(cb[6]) == 13);
        CHECK(std::to_integer<int>(cb[7]) == 4);
        auto cf = pss::decode_frame(cb);
        auto back_call = pss::to_request(cf.header, cf.body, std::move(cf.payload), std::move(cf.tensors));
        CHECK(back_call.kind == pss::RequestKind::call);
        CHECK(back_call.name == "f");
        CHECK(back_call.values.cbor == std::vector<std::uint8_t>{0x82, 0x01, 0x02});
        REQUIRE(back_call.values.tensors.size() == 3);
        CHECK(back_call.values.tensors[0].get<float>() == xt::xarray<float>{1.0f, 2.0f});
        CHECK(back_call.values.tensors[1].get<std::int64_t>() == xt::xarray<std::int64_t>(xt::ones<std::int64_t>(pss::Shape{}) * 7));
        CHECK(back_call.values.tensors[2].get<double>() == xt::xarray<double>{{0.5, 1.0}, {-0.5, 2.0}});
        CHECK_FALSE(back_call.payload.has_value());

        pss::Request shutdown;
        shutdown.kind = pss::RequestKind::shutdown;
        auto sf = pss::decode_frame(frame_bytes(pss::OutgoingFrame::request(shutdown, 6, 0, false)));
        CHECK(pss::to_request(sf.header, sf.body, {}).kind == pss::RequestKind::shutdown);
        CHECK(sf.size == 80);
    }

    TEST_CASE("wire: a string tensor travels as one length per element, then the bytes, and comes back equal; "
              "lengths that do not add up are a WireError" *
              doctest::timeout(30)) {
        using namespace std::string_literals;
        pss::Request assign;
        assign.op = pss::Op::assign;
        assign.key = {3, 0};
        assign.payload = xt::xarray<std::string>{"ab", "", "\0c"s};
        const Bytes b = frame_bytes(pss::OutgoingFrame::request(assign, 9, 0, false));
        // The header, the descriptor (dtype 5 and rank 1, the extent 3, the encoded length 28), the payload:
        // three lengths, then the 4 bytes of "ab" and "\0c".
        CHECK(b.size() == 80 + 24 + 24 + 4);
        CHECK(get_le(b, 80, 8) == (5u | (1u << 8)));
        CHECK(get_le(b, 96, 8) == 28u);
        CHECK(get_le(b, 104, 8) == 2u);
        CHECK(get_le(b, 112, 8) == 0u);
        CHECK(get_le(b, 120, 8) == 2u);
        auto frame = pss::decode_frame(b);
        CHECK(frame.body.payload().dtype == pss::DType::string);
        const auto request = pss::to_request(frame.header, frame.body, std::move(frame.payload));
        CHECK(request.payload.get<std::string>() == xt::xarray<std::string>{"ab", "", "\0c"s});

        // Among a call's values, beside a number tensor; and a reply's payload.
        pss::Request call;
        call.kind = pss::RequestKind::call;
        call.name = "f";
        call.values.cbor = {0x80};
        call.values.tensors = {pss::Tensor(xt::xarray<std::string>{"x", "yy"}), pss::Tensor(xt::xarray<float>{1.5f}),
                               pss::Tensor(xt::xarray<std::string>(std::string(1000, 'z')))};
        auto cf = pss::decode_frame(frame_bytes(pss::OutgoingFrame::request(call, 10, 0, false)));
        const auto back = pss::to_request(cf.header, cf.body, std::move(cf.payload), std::move(cf.tensors));
        REQUIRE(back.values.tensors.size() == 3);
        CHECK(back.values.tensors[0].get<std::string>() == xt::xarray<std::string>{"x", "yy"});
        CHECK(back.values.tensors[1].get<float>() == xt::xarray<float>{1.5f});
        CHECK(back.values.tensors[2].get<std::string>() == xt::xarray<std::string>(std::string(1000, 'z')));
        pss::Reply reply{pss::ErrorCode::ok, "", xt::xarray<std::string>{"the", "a"}, {}};
        auto rf = pss::decode_frame(frame_bytes(pss::OutgoingFrame::reply(reply, 11, 0, false)));
        CHECK(pss::to_reply(rf.header, rf.body, std::move(rf.payload)).payload.get<std::string>() ==
              xt::xarray<std::string>{"the", "a"});

        // Hostile: lengths that claim more bytes than follow, or fewer (the payload is not checksummed).
        Bytes more = b;
        more[104] = std::byte{3};
        CHECK(decode_error(more) ==
              "pss: wire: frame tensor 0: string 2 has length 2, more than the 1 left of the 4 bytes after the lengths");
        Bytes huge = b;
        put_u64(huge, 112, std::uint64_t{1} << 62);
        CHECK(decode_error(huge) == "pss: wire: frame tensor 0: string 1 has length 4611686018427387904, more than the "
                                    "2 left of the 4 bytes after the lengths");
        Bytes fewer = b;
        fewer[104] = std::byte{1};
        CHECK(decode_error(fewer) == "pss: wire: frame tensor 0: its string lengths add up to 3 bytes, but 4 follow them");
        // An encoded length below the elements' lengths, in the checksummed descriptor.
        Bytes short_length = b;
        put_u64(short_length, 96, 16);
        put_u64(short_length, 56, 16);
        reseal(short_length);
        CHECK(decode_error(short_length) ==
              "pss: wire: frame tensor 0: encoded length 16 of 3 strings is below their lengths' 24 bytes");

        // The payload limit bounds the decoded strings (32 bytes each in libstdc++, beside their characters),
        // not their 8 wire bytes each: 3 strings and 4 characters fit in 100 bytes, not in 99 or 95.
        static_assert(sizeof(std::string) == 32);
        pss::WireLimits limits;
        limits.max_payload_bytes = 100;
        CHECK(decode_error(b, limits) == "(decoded)");
        limits.max_payload_bytes = 99;
        CHECK(decode_error(b, limits) == "pss: wire: frame tensor 0: encoded length 28 of 3 strings holds 4 bytes of "
                                         "characters, more than the 3 the payload limit 99 leaves them");
        limits.max_payload_bytes = 95;
        CHECK(decode_error(b, limits) == "pss: wire: frame tensor 0: shape (3,) of string exceeds the payload limit 95 "
                                         "bytes (a string is held in 32 bytes beside its characters)");
        // 1,000 empty strings: 8,000 bytes on the wire, 32,000 once decoded, refused under a 10,000-byte limit.
        assign.payload = xt::xarray<std::string>::from_shape({1000});
        const Bytes empties = frame_bytes(pss::OutgoingFrame::request(assign, 12, 0, false));
        CHECK(empties.size() == 80 + 24 + 8000);
        limits.max_payload_bytes = 10000;
        CHECK(decode_error(empties, limits) == "pss: wire: frame tensor 0: shape (1000,) of string exceeds the payload "
                                              "limit 10000 bytes (a string is held in 32 bytes beside its characters)");
        limits.max_payload_bytes = 32000;
        CHECK(decode_error(empties, limits) == "(decoded)");
    }

    TEST_CASE("wire: a create without a value carries its initializer as 6 + rank id words, checked as every "
              "field; a hostile one is a WireError" *
              doctest::timeout(30)) {
        pss::Request create;
        create.op = pss::Op::create;
        create.key = {3, 1};
        create.name = "t";
        create.initializer = pss::ShardInitializer{pss::InitializerSpec::random_normal(0.5, 2.0, 0xfedcba9876543210u),
                                                   pss::DType::float32, {10, 4}, 6, 4};
        const Bytes good = frame_bytes(pss::OutgoingFrame::request(create, 9, 0, false));
        REQUIRE(good.size() == 80 + 1 + 8 * 8);
        CHECK(get_le(good, 48, 8) == 8);                                 // ids count: the words
        CHECK(get_le(good, 81, 8) == (5u | 1u << 8 | 2u << 16));         // random_normal, float32, rank 2
        CHECK(get_le(good, 89, 8) == 0xfedcba9876543210u);               // the seed
        CHECK(get_le(good, 97, 8) == 0x3fe0000000000000u);               // 0.5
        CHECK(get_le(good, 105, 8) == 0x4000000000000000u);              // 2.0
        CHECK(get_le(good, 113, 8) == 6);                                // row offset
        CHECK(get_le(good, 121, 8) == 4);                                // rows
        CHECK(get_le(good, 129, 8) == 10);
        CHECK(get_le(good, 137, 8) == 4);
        pss::DecodedFrame decoded = pss::decode_frame(good);
        const pss::Request back = pss::to_request(decoded.header, decoded.body, std::move(decoded.payload));
        CHECK(back.op == pss::Op::create);
        CHECK(back.initializer == create.initializer);
        CHECK(back.ids.empty());
        CHECK_FALSE(back.payload.has_value());

        auto word = [&](std::size_t k, std::uint64_t value, pss::WireLimits limits = {}) {
            Bytes b = good;
            put_u64(b, 81 + 8 * k, value);
            reseal(b);
            return decode_error(b, limits);
        };
        const std::string prefix = "pss: wire: frame create's initializer ";
        CHECK(word(0, 7u | 1u << 8 | 2u << 16) == prefix + "kind 7 is unknown; kinds are 1 (zeros) to 6 (truncated_normal)");
        CHECK(word(0, 5u | 9u << 8 | 2u << 16) == prefix + "dtype byte 9 is not a dtype; expected 1 (float32) to 5 (string)");
        CHECK(word(0, 5u | 1u << 8 | 9u << 16) == prefix + "rank 9 exceeds the limit 8");
        CHECK(word(0, 5u | 1u << 8 | 1u << 16) == prefix + "holds 8 words, but rank 1 takes 7");
        CHECK(word(0, 5u | 3u << 8 | 2u << 16) ==
              prefix + "random_normal draws floats, but the variable is int32; random initializers fill float32 or "
                       "float64 variables");
        CHECK(word(0, 5u | 5u << 8 | 2u << 16) == prefix + "random_normal cannot fill a string variable; create it from its value");
        CHECK(word(3, 0x7ff0000000000000u) ==  // an infinite stddev
              prefix + "random_normal: mean is 0.5 and stddev inf; they are finite numbers with stddev >= 0");
        CHECK(word(5, 5) == prefix + "the shard's 5 rows from row 6 are not inside the variable's 10 rows");
        CHECK(word(4, std::uint64_t{1} << 63) ==
              prefix + "the shard's 4 rows from row 9223372036854775808 are not inside the variable's 10 rows");
        CHECK(word(7, std::uint64_t{1} << 40) ==
              prefix + "the shard (4, 1099511627776) of float32 (variable (10, 1099511627776)) exceeds the limit "
                       "68719476736 bytes");
        // No byte of the shard travels: one above the payload limit (4 x 2^27 floats, 2 GiB) is drawn.
        CHECK(word(7, std::uint64_t{1} << 27) == "(decoded)");
        pss::WireLimits small;
        small.max_initialized_shard_bytes = 63;  // the shard is 4 x 4 floats: 64 bytes
        CHECK(word(7, 4, small) == prefix + "the shard (4, 4) of float32 (variable (10, 4)) exceeds the limit 63 bytes");
        // Fewer than 6 words, and words beside a payload.
        pss::Request short_words = create;
        short_words.initializer.reset();
        short_words.ids = {1, 2};
        CHECK(decode_error(frame_bytes(pss::OutgoingFrame::request(short_words, 9, 0, false))) ==
              prefix + "holds 2 words; it takes 6 and one per axis");
        short_words.payload = xt::xarray<float>{1};
        CHECK(decode_error(frame_bytes(pss::OutgoingFrame::request(short_words, 9, 0, false))) ==
              "pss: wire: frame of a create carries a payload and initializer words; it carries one of them");
    }

    TEST_CASE("wire: every malformed frame is a WireError naming the field and its value" * doctest::timeout(30)) {
        const Bytes good = known_frame();
        auto with = [&](auto change, bool seal = true) {
            Bytes b = good;
            change(b);
            if (seal) reseal(b);
            return b;
        };
        SUBCASE("bad magic, unknown version: no request id can be trusted") {
            const Bytes magic = with([](Bytes& b) { put_u32(b, 0, 0x58585858u); });
            CHECK(decode_error(magic) ==
                  "pss: wire: frame magic is 0x58585858, expected 0x31535350 (\"PSS1\"); the peer does not speak pss");
            const Bytes version = with([](Bytes& b) { b[4] = std::byte{1}; });
            CHECK(decode_error(version) == "pss: wire: frame version 1 is not supported; this build speaks version 2");
            try {
                (void)pss::decode_frame(magic);
            } catch (const pss::WireError& e) {
                CHECK_FALSE(e.request_id().has_value());
                CHECK(e.code() == pss::ErrorCode::invalid_argument);
            }
        }
        SUBCASE("kind, flags, error code, tensor counts and descriptors out of their sets") {
            const std::string kinds =
                "a request is an operation 1 to 12 or 15 to 23, a call 13, a shutdown 14 or a heartbeat 127, a reply is 128";
            CHECK(decode_error(with([](Bytes& b) { b[6] = std::byte{99}; })) == "pss: wire: frame kind 99 is unknown; " + kinds);
            CHECK(decode_error(with([](Bytes& b) { b[6] = std::byte{0}; })) == "pss: wire: frame kind 0 is unknown; " + kinds);
            CHECK(decode_error(with([](Bytes& b) { b[6] = std::byte{24}; })) == "pss: wire: frame kind 24 is unknown; " + kinds);
            CHECK(decode_error(with([](Bytes& b) { b[7] = std::byte{9}; })) ==
                  "pss: wire: frame flags 9 has unknown bits; only 2 (elided), 4 (values), 8 (bfloat16) and 16 "
                  "(float16) are defined");
            CHECK(decode_error(with([](Bytes& b) { b[7] = std::byte{24}; })) ==
                  "pss: wire: frame flags 24 name two compressions, bfloat16 and float16; a frame has one");
            // The float32 payload [1.5, -2] flagged bfloat16 must be 2 bytes an element, not 4.
            CHECK(decode_error(with([](Bytes& b) { b[7] = std::byte{8}; })) ==
                  "pss: wire: frame payload length 8 does not match the tensors' 4 bytes (float32 (2,))");
            CHECK(decode_error(with([](Bytes& b) {
                      b[6] = std::byte{128};
                      put_u32(b, 8, 42);
                  })) == "pss: wire: frame error code 42 is unknown; codes are 0 (ok) to 10 (permission denied)");
            CHECK(decode_error(with([](Bytes& b) { put_u32(b, 8, 6); })) ==
                  "pss: wire: frame error code 6 is set on a request; only a reply carries an error");
            CHECK(decode_error(with([](Bytes& b) { b[6] = std::byte{13}; })) ==
                  "pss: wire: frame of a call carries no values; a call's arguments are its values");
            CHECK(decode_error(with([](Bytes& b) { b[7] = std::byte{4}; })) ==
                  "pss: wire: frame of kind 4 carries values; only a call and its reply do");
            CHECK(decode_error(with([](Bytes& b) { b[6] = std::byte{14}; })) ==
                  "pss: wire: frame of a shutdown carries tensors, ids or a name; it carries nothing");
            CHECK(decode_error(with([](Bytes& b) { b[6] = std::byte{127}; })) ==
                  "pss: wire: frame of a heartbeat carries tensors, ids or a name; it carries nothing");
            CHECK(decode_error(with([](Bytes& b) { b[6] = std::byte{128}; })) ==
                  "pss: wire: frame of a reply carries ids or a name; a reply carries neither");
            CHECK(decode_error(with([](Bytes& b) { b[36] = std::byte{2}; })) ==
                  "pss: wire: frame of a shard operation describes 2 tensors; it carries one at most");
            CHECK(decode_error(with([](Bytes& b) { b[38] = std::byte{11}; })) ==  // rank 8 and a string's length: 10
                  "pss: wire: frame descriptor words 11 cannot describe 1 tensors of rank 0 to 8");
            CHECK(decode_error(with([](Bytes& b) { b[36] = std::byte{0}; })) ==
                  "pss: wire: frame descriptor words 2 cannot describe 0 tensors of rank 0 to 8");
            CHECK(decode_error(with([](Bytes& b) { b[80] = std::byte{9}; })) ==
                  "pss: wire: frame tensor 0: dtype byte 9 is not a dtype; expected 1 (float32) to 5 (string)");
            CHECK(decode_error(with([](Bytes& b) { b[80] = std::byte{0}; })) ==
                  "pss: wire: frame tensor 0: dtype byte 0 is not a dtype; expected 1 (float32) to 5 (string)");
            CHECK(decode_error(with([](Bytes& b) { b[81] = std::byte{9}; })) ==
                  "pss: wire: frame tensor 0: rank 9 exceeds the limit 8");
            CHECK(decode_error(with([](Bytes& b) { b[82] = std::byte{1}; })) ==
                  "pss: wire: frame tensor 0: descriptor 65793 has bits set above the rank byte");
            CHECK(decode_error(with([](Bytes& b) { b[81] = std::byte{2}; })) ==
                  "pss: wire: frame tensor 0: its rank 2 runs past the descriptor words");
            CHECK(decode_error(with([](Bytes& b) { b[81] = std::byte{0}; })) ==
                  "pss: wire: frame descriptor words 2 are more than the tensors use");
            CHECK(decode_error(with([](Bytes& b) { b[7] = std::byte{2}; })) ==
                  "pss: wire: frame payload length 8 is given but the payload is elided; it must be 0");
        }
        SUBCASE("lengths above the limits") {
            CHECK(decode_error(with([](Bytes& b) { put_u64(b, 56, 2147483648u); })) ==
                  "pss: wire: frame payload length 2147483648 exceeds the limit 1073741824");
            pss::WireLimits small;
            small.max_name = 0;
            CHECK(decode_error(good, small) == "pss: wire: frame name length 1 exceeds the limit 0");
            small = {};
            small.max_ids = 1;
            CHECK(decode_error(good, small) == "pss: wire: frame ids count 2 exceeds the limit 1");
            CHECK(decode_error(with([](Bytes& b) { put_u32(b, 44, 70000); })) ==
                  "pss: wire: frame message length 70000 exceeds the limit 65536");
            CHECK(decode_error(with([](Bytes& b) {
                      b[7] = std::byte{4};
                      b[6] = std::byte{13};
                      put_u32(b, 72, 17u << 20);
                  })) == "pss: wire: frame values length 17825792 exceeds the limit 16777216");
            CHECK(decode_error(with([](Bytes& b) { put_u32(b, 72, 3); })) ==
                  "pss: wire: frame values length 3 is given without the values flag; it must be 0");
            CHECK(decode_error(with([](Bytes& b) {
                      b[7] = std::byte{4};
                      b[6] = std::byte{13};
                      put_u32(b, 36, 5000);  // 5000 tensors, 0 descriptor words
                  })) == "pss: wire: frame tensors 5000 exceeds the limit 4096");
        }
        SUBCASE("a checksum that does not match, and a payload length that does not match the shape") {
            const Bytes corrupted = with([](Bytes& b) { b[80 + 16] = std::byte{'v'}; }, false);  // the name byte
            CHECK(decode_error(corrupted) ==
                  "pss: wire: frame checksum 0x0ba5a541 does not match the computed 0x5441791e; the frame was corrupted");
            try {
                (void)pss::decode_frame(corrupted);
            } catch (const pss::WireError& e) {
                CHECK(e.request_id() == std::optional<std::uint64_t>(0x0102030405060708u));
            }
            CHECK(decode_error(with([](Bytes& b) { put_u64(b, 56, 12); })) ==
                  "pss: wire: frame payload length 12 does not match the tensors' 8 bytes (float32 (2,))");
            CHECK(decode_error(with([](Bytes& b) {
                      b[38] = std::byte{3};  // rank 2: the descriptor words are now 3
                      b[81] = std::byte{2};
                      put_u32(b, 40, 0);     // no name
                      put_u64(b, 48, 2);     // the ids are the extents' words now
                      put_u64(b, 88, std::uint64_t{1} << 32);
                      put_u64(b, 96, std::uint64_t{1} << 32);
                  })) == "pss: wire: frame tensor 0: shape (4294967296, 4294967296) of float32 exceeds the payload "
                         "limit 1073741824 bytes");
            // An empty axis does not excuse the others: the strides of (0, 2^32, 2^32) would overflow.
            CHECK(decode_error(with([](Bytes& b) {
                      b[38] = std::byte{4};
                      b[81] = std::byte{3};
                      put_u32(b, 40, 0);
                      put_u64(b, 48, 1);
                      put_u64(b, 56, 0);  // no payload bytes: the shape has no element
                      put_u64(b, 88, 0);
                      put_u64(b, 96, std::uint64_t{1} << 32);
                      put_u64(b, 104, std::uint64_t{1} << 32);
                  })) == "pss: wire: frame tensor 0: shape (0, 4294967296, 4294967296) of float32 exceeds the payload "
                         "limit 1073741824 bytes");
        }
        SUBCASE("a truncated frame") {
            CHECK(decode_error(Bytes(good.begin(), good.begin() + 40)) ==
                  "pss: wire: frame is truncated: 40 bytes, the header needs 80");
            CHECK(decode_error(Bytes(good.begin(), good.begin() + 90)) ==
                  "pss: wire: frame is truncated: 90 bytes, the header and sections need 113");
            CHECK(decode_error(Bytes(good.begin(), good.end() - 1)) ==
                  "pss: wire: frame is truncated: 120 bytes, the frame needs 121");
        }
    }

    // ---- TcpTransport -------------------------------------------------------------------------------------

    TEST_CASE("TcpTransport: models Transport; a handler's echo comes back over a real socket" * doctest::timeout(30)) {
        static_assert(pss::Transport<pss::TcpTransport>);
        pss::TcpTransport transport(one_ps());
        const pss::TaskId ps{"ps", 0};
        transport.serve(ps, pss::answer_at_once([](pss::Request&& r) {
            pss::Reply reply;
            reply.message = r.name + " with " + std::to_string(r.ids.size()) + " ids, variable " +
                            std::to_string(r.key.variable) + "/" + std::to_string(r.key.shard);
            reply.payload = std::move(r.payload);
            return reply;
        }));
        CHECK(transport.bound_port(ps) != 0);
        CHECK(transport.endpoint(ps).address() == asio::ip::address_v4::loopback());
        pss::Request r;
        r.op = pss::Op::gather;
        r.key = {5, 1};
        r.name = "emb";
        r.ids = {4, 2, 4};
        r.payload = xt::xarray<std::int32_t>{{1, 2, 3}, {4, 5, 6}};
        pss::Reply reply = transport.send(ps, std::move(r)).get();
        REQUIRE(reply.ok());
        CHECK(reply.message == "emb with 3 ids, variable 5/1");
        CHECK(reply.payload.get<std::int32_t>() == xt::xarray<std::int32_t>{{1, 2, 3}, {4, 5, 6}});
        CHECK_THROWS_WITH_AS((void)transport.bound_port({"ps", 1}),
                             "pss: TcpTransport: task /job:ps/replica:0/task:1 is not served by this transport",
                             pss::NotFoundError);
        CHECK_THROWS_WITH_AS(transport.serve(ps, pss::answer_at_once([](pss::Request&&) { return pss::Reply{}; })),
                             "pss: TcpTransport: task /job:ps/replica:0/task:0 is served twice",
                             pss::InvalidArgumentError);
        transport.shutdown();
        transport.shutdown();  // idempotent
        pss::Reply after = transport.send(ps, pss::Request{}).get();
        CHECK(after.code == pss::ErrorCode::unavailable);
        CHECK(after.message == "pss: TcpTransport: request to /job:ps/replica:0/task:0 after shutdown()");
    }

    TEST_CASE("TcpTransport: a handler that keeps its Responder answers later from another thread; the task "
              "handles the next request meanwhile; a dropped Responder answers unavailable" *
              doctest::timeout(30)) {
        pss::TcpTransport transport(one_ps());
        const pss::TaskId ps{"ps", 0};
        std::promise<pss::Responder> kept;  // the responder of request 1, answered by the test's thread
        transport.serve(ps, [&](pss::Request&& r, pss::Responder respond) {
            if (r.key.variable == 1) return kept.set_value(std::move(respond));
            if (r.key.variable == 3) return;  // dropped unanswered
            pss::Reply reply;
            reply.payload = xt::xarray<std::int64_t>{static_cast<std::int64_t>(r.key.variable) * 10};
            respond(std::move(reply));
        });
        auto request = [](std::uint64_t variable) {
            pss::Request r;
            r.op = pss::Op::gather;
            r.key.variable = variable;
            return r;
        };
        auto first = transport.send(ps, request(1));
        auto second = transport.send(ps, request(2));
        CHECK(second.get().take().get<std::int64_t>()(0) == 20);  // answered while request 1 waits
        CHECK(first.wait_for(std::chrono::milliseconds(20)) == std::future_status::timeout);
        std::thread([respond = kept.get_future().get()]() mutable {
            pss::Reply reply;
            reply.payload = xt::xarray<std::int64_t>{10};
            respond(std::move(reply));
        }).join();
        CHECK(first.get().take().get<std::int64_t>()(0) == 10);
        pss::Reply dropped = transport.send(ps, request(3)).get();
        CHECK(dropped.code == pss::ErrorCode::unavailable);
        CHECK(dropped.message == "pss: the task dropped the request without answering it (it shut down, or its "
                                 "handler lost the responder)");
    }

    TEST_CASE("TcpTransport: 100 pipelined requests on one connection are all answered, each with its own value, "
              "handled in order" *
              doctest::timeout(30)) {
        pss::TcpTransport transport(one_ps());
        const pss::TaskId ps{"ps", 0};
        std::vector<std::int64_t> seen;  // the handler runs on the task's strand: one at a time
        transport.serve(ps, pss::answer_at_once([&](pss::Request&& r) {
            seen.push_back(r.ids.at(0));
            pss::Reply reply;
            reply.payload = xt::xarray<std::int64_t>{r.ids.at(0) * 2};
            return reply;
        }));
        std::vector<std::future<pss::Reply>> futures;
        for (std::int64_t i = 0; i < 100; ++i) {
            pss::Request r;
            r.op = pss::Op::gather;
            r.ids = {i};
            futures.push_back(transport.send(ps, std::move(r)));
        }
        for (std::int64_t i = 0; i < 100; ++i) {
            pss::Reply reply = futures[static_cast<std::size_t>(i)].get();
            REQUIRE(reply.ok());
            CHECK(reply.payload.get<std::int64_t>()(0) == 2 * i);
        }
        transport.shutdown();
        REQUIRE(seen.size() == 100);
        for (std::int64_t i = 0; i < 100; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);
    }

    TEST_CASE("TcpTransport: 200 pipelined pushes of 64 KiB to a peer that reads nothing wait for room in the full "
              "socket, in batches written in part, and reach it whole and in order once it reads" *
              doctest::timeout(30)) {
        // The peer: a raw socket with a 4 KiB receive buffer that reads only when the test says.
        asio::io_context io;
        asio::ip::tcp::acceptor acceptor(io);
        acceptor.open(asio::ip::tcp::v4());
        acceptor.set_option(asio::socket_base::receive_buffer_size(4096));
        acceptor.bind({asio::ip::address_v4::loopback(), 0});
        acceptor.listen();
        const pss::TaskId ps{"ps", 0};
        pss::TcpOptions options = plaintext();
        options.timeouts.heartbeat_timeout = std::chrono::milliseconds(0);  // the peer answers pushes only
        pss::TcpTransport transport(
            pss::ClusterSpec{{"ps", {"127.0.0.1:" + std::to_string(acceptor.local_endpoint().port())}}}, options);
        auto read_frame = [](asio::ip::tcp::socket& peer) {
            Bytes b(pss::frame_header_size);
            asio::read(peer, asio::buffer(b));
            const pss::FrameHeader h =
                pss::decode_header(std::span<const std::byte, pss::frame_header_size>(b.data(), pss::frame_header_size));
            const std::size_t rest = h.body_length() + h.payload_length;
            b.resize(pss::frame_header_size + rest);
            asio::read(peer, asio::buffer(b.data() + pss::frame_header_size, rest));
            return pss::decode_frame(b);
        };
        auto answer = [](asio::ip::tcp::socket& peer, std::uint64_t id) {
            asio::write(peer, asio::buffer(pss::OutgoingFrame::reply(pss::Reply{}, id, 0, false).bytes()));
        };
        constexpr std::size_t floats = 16'384;
        auto pattern = [](std::uint64_t k) {
            return xt::xarray<float>(xt::arange<float>(static_cast<float>(floats)) * static_cast<float>(k));
        };

        // 200 x 64 KiB: more than this socket's send buffer (4 MiB at most here) and the peer's window hold.
        constexpr std::uint64_t pushes = 200;
        std::vector<std::future<pss::Reply>> pushed;
        for (std::uint64_t k = 1; k <= pushes; ++k) {
            pss::Request r;
            r.op = pss::Op::assign_add;
            r.payload = pattern(k);
            pushed.push_back(transport.send(ps, std::move(r)));
        }
        pss::Request gather;
        gather.op = pss::Op::gather;
        gather.ids = {7};
        auto gathered = transport.send(ps, std::move(gather));
        asio::ip::tcp::socket peer = acceptor.accept();
        CHECK(pushed.front().wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
        for (std::uint64_t k = 1; k <= pushes; ++k) {
            const pss::DecodedFrame f = read_frame(peer);
            CHECK(f.header.request_id == k);
            CHECK(f.payload.get<float>() == pattern(k));
            answer(peer, k);
        }
        const pss::DecodedFrame last = read_frame(peer);
        CHECK(last.header.request_id == pushes + 1);
        CHECK(last.header.op() == pss::Op::gather);
        CHECK(last.body.ids == std::vector<std::int64_t>{7});
        answer(peer, pushes + 1);
        for (auto& f : pushed) {
            const pss::Reply reply = f.get();
            INFO(reply.message);
            CHECK(reply.ok());
        }
        CHECK(gathered.get().ok());
        transport.shutdown();
    }

    TEST_CASE("TcpTransport: 4 threads of 300 calls each on one connection, among heartbeats, are answered in "
              "order, none refused as out of order" *
              doctest::timeout(60)) {
        pss::TcpOptions options = plaintext();
        options.timeouts.heartbeat_interval = std::chrono::milliseconds(2);  // frames among the calls
        options.timeouts.heartbeat_timeout = std::chrono::seconds(20);
        pss::TcpTransport transport(one_ps(), options);
        const pss::TaskId ps{"ps", 0};
        std::map<std::uint64_t, std::vector<std::int64_t>> calls;  // by thread (key.variable), in order handled
        transport.serve(ps, pss::answer_at_once([&](pss::Request&& r) {
            calls[r.key.variable].push_back(r.ids.at(0));
            pss::Reply reply;
            reply.payload = xt::xarray<std::int64_t>{r.ids.at(0) * 3};
            return reply;
        }));
        // A frame that left out of the order of its id would be refused as a repeat ("ids must increase").
        constexpr std::int64_t each = 300;
        std::vector<std::thread> threads;
        std::mutex failed_mutex;
        std::vector<std::string> failed;
        for (std::uint64_t t = 0; t < 4; ++t)
            threads.emplace_back([&, t] {
                for (std::int64_t i = 0; i < each; ++i) {
                    pss::Request r;
                    r.op = pss::Op::gather;
                    r.key.variable = t;
                    r.ids = {i};
                    pss::Reply reply = transport.send(ps, std::move(r)).get();
                    if (!reply.ok() || reply.payload.get<std::int64_t>()(0) != 3 * i) {
                        std::lock_guard lock(failed_mutex);
                        failed.push_back(reply.message);
                    }
                }
            });
        for (auto& t : threads) t.join();
        CHECK(failed.empty());
        if (!failed.empty()) MESSAGE(failed.front());
        REQUIRE(calls.size() == 4);
        for (const auto& [thread, ids] : calls) {
            REQUIRE(ids.size() == static_cast<std::size_t>(each));
            for (std::int64_t i = 0; i < each; ++i) CHECK(ids[static_cast<std::size_t>(i)] == i);
        }
        transport.shutdown();
    }

    TEST_CASE("TcpTransport: a 16 MB payload arrives bit-exact; a read lands in the caller's buffer and an update "
              "hands the caller's own buffer back" *
              doctest::timeout(30)) {
        pss::TcpTransport transport(one_ps());
        const pss::TaskId ps{"ps", 0};
        const std::size_t n = (16u << 20) / 4;
        xt::xarray<std::uint32_t> pattern = xt::arange<std::uint32_t>(static_cast<std::uint32_t>(n)) * 2654435761u;
        xt::xarray<std::int32_t> expected = xt::xarray<std::int32_t>::from_shape({n});
        std::memcpy(expected.data(), pattern.data(), n * 4);
        std::atomic<bool> bit_exact{false};
        transport.serve(ps, pss::answer_at_once([&](pss::Request&& r) {
            pss::Reply reply;
            if (r.op == pss::Op::read) {  // fill the offered buffer (or a new one) with the pattern
                auto out = r.payload.has_value() ? std::move(r.payload) : pss::Tensor::zeros(pss::DType::int32, {n});
                std::memcpy(out.bytes(), expected.data(), n * 4);
                reply.payload = std::move(out);
            } else {
                bit_exact = r.payload.nbytes() == n * 4 && std::memcmp(r.payload.bytes(), expected.data(), n * 4) == 0;
                reply.payload = std::move(r.payload);  // the spent buffer
            }
            return reply;
        }));
        pss::Request push;
        push.op = pss::Op::assign_add;
        push.payload = expected;
        const std::byte* sent_buffer = push.payload.bytes();
        pss::Reply pushed = transport.send(ps, std::move(push)).get();
        REQUIRE(pushed.ok());
        CHECK(bit_exact.load());
        CHECK(pushed.payload.bytes() == sent_buffer);  // handed back, not sent back
        // Again and again: the reply must wait for the end of its write even when it is read first.
        pss::Tensor again = std::move(pushed.payload);
        for (int i = 0; i < 8; ++i) {
            pss::Request r;
            r.op = pss::Op::assign_add;
            r.payload = std::move(again);
            pss::Reply back = transport.send(ps, std::move(r)).get();
            REQUIRE(back.ok());
            CHECK(back.payload.bytes() == sent_buffer);
            again = std::move(back.payload);
        }

        pss::Request read;
        read.op = pss::Op::read;
        read.payload = pss::Tensor::zeros(pss::DType::int32, {n});
        const std::byte* buffer = read.payload.bytes();
        pss::Reply value = transport.send(ps, std::move(read)).get();
        REQUIRE(value.ok());
        CHECK(value.payload.bytes() == buffer);  // landed in place
        CHECK(std::memcmp(value.payload.bytes(), expected.data(), n * 4) == 0);

        pss::Request fresh;  // no buffer offered: a new one
        fresh.op = pss::Op::read;
        pss::Reply fresh_value = transport.send(ps, std::move(fresh)).get();
        REQUIRE(fresh_value.ok());
        CHECK(fresh_value.payload.shape() == pss::Shape{n});
        CHECK(std::memcmp(fresh_value.payload.bytes(), expected.data(), n * 4) == 0);
    }

    TEST_CASE("TcpTransport: an unreachable task answers unavailable after the connect timeout; a slow one after "
              "the request timeout" *
              doctest::timeout(30)) {
        const std::string address = nobody_listens();
        pss::TcpOptions options;
        options.timeouts.startup = std::chrono::milliseconds(200);
        options.timeouts.request = std::chrono::milliseconds(100);
        options.io_threads = 2;  // the slow handler below holds one thread; the timeout needs the other
        pss::TcpTransport transport(pss::ClusterSpec{{"ps", {address, "127.0.0.1:0"}}}, options);
        const auto start = std::chrono::steady_clock::now();
        pss::Reply reply = transport.send({"ps", 0}, pss::Request{}).get();
        const auto waited = std::chrono::steady_clock::now() - start;
        CHECK(reply.code == pss::ErrorCode::unavailable);
        CHECK(reply.message.starts_with("pss: TcpTransport: could not connect to /job:ps/replica:0/task:0 at " + address +
                                        " within the start-up timeout of 0.2 s ("));
        CHECK(waited >= std::chrono::milliseconds(200));
        CHECK(waited < std::chrono::seconds(5));

        std::promise<void> release;
        auto released = release.get_future().share();
        transport.serve({"ps", 1}, pss::answer_at_once([released](pss::Request&&) {
            released.wait();
            return pss::Reply{};
        }));
        pss::Reply slow = transport.send({"ps", 1}, pss::Request{}).get();
        CHECK(slow.code == pss::ErrorCode::unavailable);
        CHECK(slow.message == "pss: request to /job:ps/replica:0/task:1 timed out after 0.1 s");
        release.set_value();
        pss::Reply later = transport.send({"ps", 1}, pss::Request{}).get();
        CHECK(later.ok());
    }

    TEST_CASE("TcpTransport: hostile frames get an error reply or a closed connection; the task keeps serving and "
              "its handler never sees them" *
              doctest::timeout(30)) {
        pss::TcpTransport transport(one_ps(), plaintext());
        const pss::TaskId ps{"ps", 0};
        std::atomic<int> handled{0};
        transport.serve(ps, pss::answer_at_once([&](pss::Request&& r) {
            ++handled;
            pss::Reply reply;
            reply.payload = std::move(r.payload);
            return reply;
        }));
        const std::uint16_t port = transport.bound_port(ps);
        pss::Request echo;
        echo.op = pss::Op::gather;
        echo.payload = xt::xarray<float>{1.5f, -2.0f};
        const Bytes good = frame_bytes(pss::OutgoingFrame::request(echo, 9, 0, false));
        const Bytes good_header_and_sections(good.begin(), good.end() - 8);

        struct Case {
            const char* name;
            Bytes bytes;
            std::string reply;  // the error reply's message; "" when the connection is only closed
        };
        auto modified = [&](auto change, bool seal = true) {
            Bytes b = good_header_and_sections;
            change(b);
            if (seal) reseal(b);
            return b;
        };
        pss::Request words;  // a string payload whose lengths claim more bytes than follow
        words.op = pss::Op::gather;
        words.payload = xt::xarray<std::string>{"ab", "c"};
        Bytes bad_strings = frame_bytes(pss::OutgoingFrame::request(words, 9, 0, false));
        bad_strings[80 + 24] = std::byte{3};
        std::mt19937 random(1234);
        Bytes noise(4096);
        for (auto& byte : noise) byte = static_cast<std::byte>(random() & 0xFF);
        std::vector<Case> cases{
            {"oversize payload length", modified([](Bytes& b) { put_u64(b, 56, std::uint64_t{1} << 40); }),
             "pss: wire: frame payload length 1099511627776 exceeds the limit 1073741824"},
            {"bad magic", modified([](Bytes& b) { b[0] = std::byte{'X'}; }), ""},
            {"bad checksum", modified([](Bytes& b) { b[76] = std::byte{3}; }, false),
             "does not match the computed"},
            {"unknown kind", modified([](Bytes& b) { b[6] = std::byte{77}; }),
             "pss: wire: frame kind 77 is unknown; a request is an operation 1 to 12 or 15 to 23, a call 13, a shutdown 14 "
             "or a heartbeat 127, a reply is 128"},
            {"payload length not the shape's", modified([](Bytes& b) { put_u64(b, 56, 12); }),
             "pss: wire: frame payload length 12 does not match the tensors' 8 bytes (float32 (2,))"},
            {"a reply sent to a server", modified([](Bytes& b) { b[6] = std::byte{128}; }),
             "pss: wire: a reply frame reached the server of task /job:ps/replica:0/task:0; a server takes requests "
             "only"},
            {"truncated frame, then close", Bytes(good.begin(), good.end() - 3), ""},
            {"string lengths past the bytes", bad_strings,
             "pss: wire: frame tensor 0: string 1 has length 1, more than the 0 left of the 3 bytes after the lengths"},
            {"4 KB of random bytes", noise, ""},
        };
        for (const auto& c : cases) {
            const std::string name = c.name;
            CAPTURE(name);
            RawClient raw(port);
            std::error_code ec;  // the server may have closed already: both are fine
            asio::write(raw.socket, asio::buffer(c.bytes), ec);
            raw.socket.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
            const Bytes answer = raw.read_to_close();
            if (c.reply.empty()) {
                CHECK(answer.empty());
                continue;
            }
            REQUIRE(!answer.empty());
            auto frame = pss::decode_frame(answer);
            CHECK(frame.size == answer.size());  // one reply, then the close
            CHECK(frame.header.is_reply());
            CHECK(frame.header.request_id == 9u);
            CHECK(frame.header.code == pss::ErrorCode::invalid_argument);
            CHECK(frame.body.message.find(c.reply) != std::string::npos);
        }
        CHECK(handled.load() == 0);

        // A well-formed frame on a raw socket, and a normal client, are answered as before.
        RawClient raw(port);
        raw.write(good);
        Bytes answer(80 + 16 + 8);
        asio::read(raw.socket, asio::buffer(answer));
        auto frame = pss::decode_frame(answer);
        CHECK(frame.header.code == pss::ErrorCode::ok);
        CHECK(frame.payload.get<float>() == xt::xarray<float>{1.5f, -2.0f});
        pss::Reply reply = transport.send(ps, std::move(echo)).get();
        REQUIRE(reply.ok());
        CHECK(reply.payload.get<float>() == xt::xarray<float>{1.5f, -2.0f});
        CHECK(handled.load() == 2);
    }

    TEST_CASE("TcpTransport: ParameterServerStrategy over loopback sockets creates, adds, scatters and reads back "
              "exact values" *
              doctest::timeout(30)) {
        using Strategy = pss::ParameterServerStrategy<pss::TcpTransport, pss::NoPartitioner, pss::SGD,
                                                      pss::SimpleClusterResolver>;
        Strategy strategy(pss::SimpleClusterResolver(pss::ClusterSpec{
                              {"ps", {"127.0.0.1:0", "127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}}),
                          {}, pss::SGD(0.5));
        auto scope = strategy.scope();
        pss::Variable table(xt::xarray<float>(xt::reshape_view(xt::arange<float>(8), {4, 2})), "table");
        pss::Variable counts(xt::xarray<std::int64_t>{10, 20, 30}, "counts");
        CHECK(table.device() == "/job:ps/replica:0/task:0/device:CPU:0");
        CHECK(counts.device() == "/job:ps/replica:0/task:1/device:CPU:0");

        table.assign_add(xt::xarray<float>(xt::ones<float>({4, 2})));
        CHECK(table.read<float>() == xt::xarray<float>{{1, 2}, {3, 4}, {5, 6}, {7, 8}});
        table.scatter_add(Ids{1, 3, 1}, xt::xarray<float>{{10, 10}, {100, 100}, {1000, 1000}});
        CHECK(table.read<float>() == xt::xarray<float>{{1, 2}, {1013, 1014}, {5, 6}, {107, 108}});
        CHECK(table.sparse_read(Ids{3, 0}).get<float>() == xt::xarray<float>{{107, 108}, {1, 2}});
        table.apply_gradient(xt::xarray<float>(xt::ones<float>({4, 2}) * 2.0f));  // SGD 0.5: minus 1
        xt::xarray<float> out = xt::zeros<float>({4, 2});
        const float* buffer = out.data();
        table.read_into(out);
        CHECK(out == xt::xarray<float>{{0, 1}, {1012, 1013}, {4, 5}, {106, 107}});
        CHECK(out.data() == buffer);

        counts.assign_sub(xt::xarray<std::int64_t>{1, 2, 3});
        CHECK(counts.read<std::int64_t>() == xt::xarray<std::int64_t>{9, 18, 27});
        CHECK_THROWS_WITH_AS(counts.scatter_add(Ids{3}, xt::xarray<std::int64_t>(xt::ones<std::int64_t>({1}))),
                             doctest::Contains("id 3 is out of range"), pss::InvalidArgumentError);
        CHECK_THROWS_AS(counts.assign(xt::xarray<std::int64_t>{1, 2}), pss::InvalidArgumentError);
        CHECK(counts.read<std::int64_t>() == xt::xarray<std::int64_t>{9, 18, 27});

        // Strings cross the sockets both ways: the initial value, an update, reads and a gather.
        pss::Variable names(xt::xarray<std::string>{"alpha", "", std::string(100000, 'g')}, "names");
        names.scatter_update(Ids{1}, xt::xarray<std::string>{"beta"});
        CHECK(names.read<std::string>() == xt::xarray<std::string>{"alpha", "beta", std::string(100000, 'g')});
        CHECK(names.sparse_read(Ids{1, 0}).get<std::string>() == xt::xarray<std::string>{"beta", "alpha"});
        names.assign(xt::xarray<std::string>{"", "", "c"});
        CHECK(names.read<std::string>() == xt::xarray<std::string>{"", "", "c"});
    }
    TEST_CASE("Group and TensorFuture: writes to variables on 2 ps tasks over loopback sockets, waited for as one, "
              "and reads in flight together, end exact" *
              doctest::timeout(30)) {
        pss::ParameterServerStrategy<pss::TcpTransport, pss::FixedShardsPartitioner, pss::SGD, pss::SimpleClusterResolver>
            strategy(pss::SimpleClusterResolver(pss::ClusterSpec{{"ps", {"127.0.0.1:0", "127.0.0.1:0"}},
                                                                 {"worker", {"127.0.0.1:0"}}}),
                     pss::FixedShardsPartitioner(2), pss::SGD(0.5));
        check_group(strategy);
    }
    TEST_CASE("ReplyBatch: a reply that comes by a future is waited for without the batch's lock, within one deadline") {
        // A transport thread delivering (a late repeat of a reply, here) while the waiter waits on a
        // future is not held up until that future is ready: it returns, and the waiter gets every reply.
        auto batch = std::make_shared<pss::detail::ReplyBatch>();
        std::promise<pss::Reply> later;
        const std::size_t by_future = batch->add(), delivered = batch->add();
        batch->attach(by_future, later.get_future());
        batch->deliver(delivered, pss::Reply::error(pss::ErrorCode::internal, "first"));
        std::atomic<bool> waiter_in{false};
        auto waiter = std::async(std::launch::async, [&] {
            waiter_in = true;
            return batch->wait_for(std::chrono::seconds(20));
        });
        while (!waiter_in) std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the waiter is on the future by now
        batch->deliver(delivered, pss::Reply::error(pss::ErrorCode::internal, "again"));  // returns: no lock held
        later.set_value(pss::Reply::error(pss::ErrorCode::not_found, "by future"));
        CHECK(waiter.get());
        CHECK(batch->take(by_future).message == "by future");
        CHECK(batch->take(delivered).message == "first");  // a slot keeps its first reply

        // Three futures that never come, waited for 200 ms: one deadline for all (it was 200 ms each).
        pss::detail::ReplyBatch never;
        std::vector<std::promise<pss::Reply>> promises(3);
        for (auto& p : promises) never.attach(never.add(), p.get_future());
        const auto start = std::chrono::steady_clock::now();
        CHECK_FALSE(never.wait_for(std::chrono::milliseconds(200)));
        CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(550));
    }
    TEST_CASE("Group: the same writes on the embedded cluster, and on one whose transport answers by futures, end "
              "exact" * doctest::timeout(30)) {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<2, 1>>
            embedded({}, pss::FixedShardsPartitioner(2), pss::SGD(0.5));
        check_group(embedded);
        // SimulatedTransport fills no reply slot: its futures are waited for instead.
        pss::SimulatedNetwork network({.seed = 1});
        pss::ParameterServerStrategy<pss::SimulatedTransport, pss::FixedShardsPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<2, 1>>
            simulated({}, pss::FixedShardsPartitioner(2), pss::SGD(0.5));
        check_group(simulated);
        // A variable outside any scope lives on the coordinator, whose store answers at once.
        pss::Variable local(xt::xarray<double>{1, 2}, "local");
        pss::Group group;
        local.assign_add(xt::xarray<double>{1, 1});
        local.assign_add(xt::xarray<double>{1, 1});
        CHECK(group.pending() == 2);
        group.wait();
        CHECK(local.read<double>() == xt::xarray<double>{3, 4});
        pss::TensorFuture read = local.read_value_async(), gathered = local.sparse_read_async(Ids{1, 1});
        CHECK(gathered.get().get<double>() == xt::xarray<double>{4, 4});
        CHECK(read.get().get<double>() == xt::xarray<double>{3, 4});
    }
    TEST_CASE("TcpTransport: a table drawn on 2 ps tasks over loopback sockets holds the bits 3 in-process shards draw" *
              doctest::timeout(30)) {
        using Strategy = pss::ParameterServerStrategy<pss::TcpTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                      pss::SimpleClusterResolver>;
        const auto init = pss::InitializerSpec::truncated_normal(0, 0.5, 11);
        Strategy strategy(pss::SimpleClusterResolver(pss::ClusterSpec{
                              {"ps", {"127.0.0.1:0", "127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}}),
                          pss::FixedShardsPartitioner(2));
        auto scope = strategy.scope();
        pss::Variable table(pss::Shape{9, 4}, pss::DType::float32, init, "table");
        CHECK(table.shard_tasks() == std::vector<int>{0, 1});
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner> local(
            {}, pss::FixedShardsPartitioner(3));
        auto local_scope = local.scope();
        const pss::Variable here(pss::Shape{9, 4}, pss::DType::float32, init, "table");
        const xt::xarray<float> expected = here.read<float>();
        CHECK(table.read<float>() == expected);
        CHECK(expected(0, 0) != expected(0, 1));
    }
}


// ---- what a stranger who reaches a port can do (issue 10: bounded resources, nothing trusted) ----------

namespace {

/// `server` serves task ps:0 of `transport`.
void serve_ps(pss::TcpTransport& transport, pss::ParameterServer<pss::SGD>& server) {
    transport.serve({"ps", 0}, [&server](pss::Request&& r, pss::Responder respond) {
        server.handle(std::move(r), std::move(respond));
    });
}

/// A ps task served in this process, over a plaintext TcpTransport with `options`.
struct LocalPs {
    explicit LocalPs(const pss::TcpOptions& options) : transport(one_ps(), plaintext(options)) {
        serve_ps(transport, server);
    }
    [[nodiscard]] std::uint16_t port() const { return transport.bound_port({"ps", 0}); }
    pss::ParameterServer<pss::SGD> server;  // before the transport: outlives its threads
    pss::TcpTransport transport;
};

#if defined(__SANITIZE_THREAD__)
#define PSS_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PSS_TEST_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PSS_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PSS_TEST_ASAN 1
#endif
#endif
#ifdef PSS_TEST_TSAN
constexpr long own_threads = 2;          // the main thread and ThreadSanitizer's background thread
constexpr double shadow_factor = 6.0;    // ThreadSanitizer maps shadow memory beside each page touched
#elif defined(PSS_TEST_ASAN)
constexpr long own_threads = 1;
// AddressSanitizer keeps freed blocks resident in its quarantine (up to 256 MiB) and pads each with
// redzones: a buffer grown in steps holds every smaller one it grew from (131.7 MiB measured once).
constexpr double shadow_factor = 2.0;
#else
constexpr long own_threads = 1;
constexpr double shadow_factor = 1.0;
#endif

/// A ps task in a process of its own, as users run it: forked while this process runs no other thread,
/// it serves a ParameterServer<SGD> over a plaintext TcpTransport with `options` until this object is
/// destroyed.
/// Its resident memory and CPU time are read from /proc.
class ForkedPs {
public:
    explicit ForkedPs(pss::TcpOptions options, rlim_t max_files = 0) {
        // A child forked from a threaded process may inherit a lock some thread held: wait (a little) for
        // the threads of earlier tests to end.
        auto threads = [] {
            return std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                 std::filesystem::directory_iterator{});
        };
        for (int i = 0; i < 200 && threads() > own_threads; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        REQUIRE(threads() == own_threads);
        int port_pipe[2], stop_pipe[2];
        REQUIRE(::pipe(port_pipe) == 0);
        REQUIRE(::pipe(stop_pipe) == 0);
        pid_ = ::fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            ::close(port_pipe[0]);
            ::close(stop_pipe[1]);
            rlimit files{};
            if (max_files != 0 && ::getrlimit(RLIMIT_NOFILE, &files) == 0) {
                files.rlim_cur = max_files;
                if (::setrlimit(RLIMIT_NOFILE, &files) != 0) ::_exit(3);
            }
            {
                pss::ParameterServer<pss::SGD> server(pss::SGD(1.0));
                pss::TcpTransport transport(one_ps(), plaintext(options));
                serve_ps(transport, server);
                const std::uint16_t port = transport.bound_port({"ps", 0});
                if (::write(port_pipe[1], &port, sizeof port) != sizeof port) ::_exit(4);
                char byte = 0;
                while (::read(stop_pipe[0], &byte, 1) < 0) {
                }  // until the parent closes its end
                transport.shutdown();
            }
            ::_exit(0);
        }
        ::close(port_pipe[1]);
        ::close(stop_pipe[0]);
        stop_ = stop_pipe[1];
        const auto n = ::read(port_pipe[0], &port_, sizeof port_);
        ::close(port_pipe[0]);
        REQUIRE(n == sizeof port_);
    }
    ForkedPs(const ForkedPs&) = delete;
    ForkedPs& operator=(const ForkedPs&) = delete;
    ~ForkedPs() {
        ::close(stop_);
        if (killed_) return;
        int status = 0;
        ::waitpid(pid_, &status, 0);
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
    }

    [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
    [[nodiscard]] pid_t pid() const noexcept { return pid_; }

    /// kill -9, and waits until the process is gone (its sockets closed).
    void kill() {
        REQUIRE(::kill(pid_, SIGKILL) == 0);
        int status = 0;
        REQUIRE(::waitpid(pid_, &status, 0) == pid_);
        killed_ = true;
    }

    /// True once every thread of the process is stopped (state T in /proc), within 5 s.
    [[nodiscard]] bool wait_until_stopped() const {
        auto stopped = [](const std::filesystem::path& stat_file) {
            std::ifstream stat(stat_file);
            std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
            const auto paren = text.rfind(')');
            return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T';
        };
        for (int i = 0; i < 500; ++i) {
            bool all = true;
            for (const auto& thread : std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task"))
                all = all && stopped(thread.path() / "stat");
            if (all) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return false;
    }

    /// Resident memory in MiB (VmRSS).
    [[nodiscard]] double rss_mib() const {
        std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
        std::string line;
        while (std::getline(status, line))
            if (line.starts_with("VmRSS:")) return std::stod(line.substr(6)) / 1024.0;
        FAIL("no VmRSS for the ps process");
        return 0;
    }

    /// User and system CPU time so far, in seconds.
    [[nodiscard]] double cpu_seconds() const {
        std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
        std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
        std::istringstream fields(text.substr(text.rfind(')') + 2));
        std::string field;
        double ticks = 0;
        for (int i = 3; i <= 15 && fields >> field; ++i)
            if (i == 14 || i == 15) ticks += std::stod(field);
        return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
    }

    /// A client transport whose ps task is this process.
    [[nodiscard]] std::unique_ptr<pss::TcpTransport> client() const {
        return std::make_unique<pss::TcpTransport>(
            pss::ClusterSpec{{"ps", {"127.0.0.1:" + std::to_string(port_)}}}, plaintext());
    }

private:
    pid_t pid_ = -1;
    int stop_ = -1;
    std::uint16_t port_ = 0;
    bool killed_ = false;
};

pss::Request shard_request(pss::Op op, pss::Tensor payload = {}, Ids ids = {}) {
    pss::Request r;
    r.op = op;
    r.key = {1, 0};
    r.name = "w";
    r.payload = std::move(payload);
    r.ids = std::move(ids);
    return r;
}

/// Creates variable 1/0 on the ps: `elements` float32 values 0, 1, 2, ...
void create_variable(pss::TcpTransport& client, std::size_t elements) {
    REQUIRE(client.send({"ps", 0}, shard_request(pss::Op::create, xt::xarray<float>(xt::arange<float>(
                                                                      static_cast<float>(elements)))))
                .get()
                .ok());
}

/// True when the ps still serves: variable 1/0 reads back as 0, 1, 2, ... (`elements` of them).
bool serves_unchanged(pss::TcpTransport& client, std::size_t elements) {
    pss::Reply reply = client.send({"ps", 0}, shard_request(pss::Op::read)).get();
    return reply.ok() &&
           reply.payload.get<float>() == xt::xarray<float>(xt::arange<float>(static_cast<float>(elements)));
}

/// The seconds until the server closes `raw` (it reads and drops what comes), at most `limit`.
double seconds_until_closed(RawClient& raw, double limit) {
    const auto start = std::chrono::steady_clock::now();
    raw.socket.non_blocking(true);
    std::array<std::byte, 65536> sink;
    for (;;) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (elapsed > limit) return elapsed;
        std::error_code ec;
        raw.socket.read_some(asio::buffer(sink), ec);
        if (ec == asio::error::would_block) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            continue;
        }
        if (ec) return elapsed;  // EOF or reset: closed
    }
}

}  // namespace

TEST_SUITE("net") {
    TEST_CASE("TcpTransport under attack: headers announcing 16 Mi ids or a 1 GiB payload cost the ps memory only "
              "for the bytes that came; a stalled frame is closed after frame_timeout; the ps serves on, unchanged" *
              doctest::timeout(60)) {
        pss::TcpOptions options;
        options.serve.frame_timeout = std::chrono::milliseconds(1500);
        ForkedPs ps(options);
        std::size_t elements = 1000;
        {
            auto client = ps.client();
            create_variable(*client, elements);
        }
        const double before = ps.rss_mib();

        // 16 gathers announcing 16 Mi ids each (128 MiB apiece: 2 GiB had they been sized at once), each
        // sending 1 MiB of them, then stalling.
        pss::Request gather = shard_request(pss::Op::gather, {}, Ids{0, 1});
        Bytes ids_frame = frame_bytes(pss::OutgoingFrame::request(gather, 7, 0, false));
        ids_frame.resize(80 + get_le(ids_frame, 38, 2) * 8 + get_le(ids_frame, 40, 4));  // header, descriptors, name
        put_u64(ids_frame, 48, std::uint64_t{1} << 24);
        ids_frame.resize(ids_frame.size() + (1u << 20), std::byte{0});
        // 4 assigns announcing 1 GiB of float32 each, sending 1 MiB: one is received, three wait for the
        // task's receive budget (4 GiB, half of it announced by the gathers).
        pss::Request assign = shard_request(pss::Op::assign, xt::xarray<float>{1, 2});
        Bytes payload_frame = frame_bytes(pss::OutgoingFrame::request(assign, 8, 0, false));
        REQUIRE(get_le(payload_frame, 38, 2) == 2);  // descriptors: dtype and rank, then the one extent
        payload_frame.resize(80 + 16 + get_le(payload_frame, 40, 4));  // header, descriptors, name
        put_u64(payload_frame, 88, std::uint64_t{1} << 28);
        put_u64(payload_frame, 56, std::uint64_t{1} << 30);
        reseal(payload_frame);
        payload_frame.resize(payload_frame.size() + (1u << 20), std::byte{0});

        std::vector<std::unique_ptr<RawClient>> stalled;
        for (int i = 0; i < 20; ++i) {
            stalled.push_back(std::make_unique<RawClient>(ps.port()));
            stalled.back()->write(i < 16 ? ids_frame : payload_frame);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the ps has read what came
        const double during = ps.rss_mib();
        MESSAGE("ps resident memory: " << before << " MiB before, " << during << " MiB with 20 stalled frames "
                                       << "announcing 6 GiB");
        // 16 x (2 MiB of ids: grown ahead by at most what came, and the 1 MiB they grew from) + 1 MiB
        CHECK(during - before < 100.0 * shadow_factor);
        for (auto& raw : stalled) CHECK(seconds_until_closed(*raw, 10.0) < 5.0);
        CHECK(serves_unchanged(*ps.client(), elements));
    }

    TEST_CASE("TcpTransport under attack: a connection that sends nothing, or half a frame, is closed after "
              "first_frame_timeout or frame_timeout" *
              doctest::timeout(30)) {
        pss::TcpOptions options;
        options.serve.first_frame_timeout = std::chrono::milliseconds(800);
        options.serve.frame_timeout = std::chrono::milliseconds(800);
        LocalPs ps(options);
        const std::uint16_t port = ps.port();
        RawClient silent(port);
        const Bytes frame = frame_bytes(pss::OutgoingFrame::request(
            shard_request(pss::Op::create, xt::xarray<float>(xt::arange<float>(1000.0f))), 1, 0, false));
        RawClient half(port);
        half.write(Bytes(frame.begin(), frame.begin() + static_cast<std::ptrdiff_t>(frame.size() / 2)));
        const double silent_closed = seconds_until_closed(silent, 10.0);
        CHECK(silent_closed > 0.5);
        CHECK(silent_closed < 5.0);
        CHECK(seconds_until_closed(half, 10.0) < 5.0);
        // A proven connection may stay idle: only a frame begun has a deadline.
        RawClient proven(port);
        proven.write(frame);
        Bytes reply(80);
        asio::read(proven.socket, asio::buffer(reply));
        CHECK(pss::decode_header(std::span<const std::byte, 80>(reply.data(), 80)).code == pss::ErrorCode::ok);
        CHECK(seconds_until_closed(proven, 1.5) >= 1.5);
        CHECK(ps.server.num_shards() == 1);
    }

    TEST_CASE("TcpTransport under attack: reads pipelined without reading the replies stop being read past "
              "max_unread_reply_bytes, and the connection is closed after unread_reply_timeout" *
              doctest::timeout(60)) {
        pss::TcpOptions options;
        options.serve.max_unread_reply_bytes = std::size_t{16} << 20;
        options.serve.unread_reply_timeout = std::chrono::milliseconds(1000);
        ForkedPs ps(options);
        const std::size_t elements = std::size_t{1} << 20;  // 4 MiB
        auto client = ps.client();
        create_variable(*client, elements);
        const double before = ps.rss_mib();
        RawClient raw(ps.port());
        Bytes reads;
        for (std::uint64_t id = 1; id <= 300; ++id) {  // 300 x 4 MiB of replies, had they all been made
            const Bytes one = frame_bytes(pss::OutgoingFrame::request(shard_request(pss::Op::read), id, 0, false));
            reads.insert(reads.end(), one.begin(), one.end());
        }
        raw.write(reads);
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        const double during = ps.rss_mib();
        MESSAGE("ps resident memory: " << before << " MiB before, " << during << " MiB with 300 unread reads");
        CHECK(during - before < 48.0 * shadow_factor);  // 16 MiB queued + the reply being written + socket buffers
        CHECK(serves_unchanged(*client, elements));  // another connection is served meanwhile
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        Bytes got;
        std::error_code ec;
        asio::read(raw.socket, asio::dynamic_buffer(got), ec);
        CHECK(ec);  // closed (end of file or reset)
        CHECK(got.size() < std::size_t{300} * (elements * 4 + 80));
        CHECK(serves_unchanged(*client, elements));
    }

    TEST_CASE("TcpTransport under attack: 2,000 idle connections under a limit of 1,024 file descriptors neither "
              "spin the ps nor lock out a legitimate client" *
              doctest::timeout(120)) {
        rlimit files{};
        REQUIRE(::getrlimit(RLIMIT_NOFILE, &files) == 0);
        if (files.rlim_max != RLIM_INFINITY && files.rlim_max < 2300) {
            MESSAGE("skipped: this process may open only " << files.rlim_max << " files");
            return;
        }
        if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur < 2300) {
            files.rlim_cur = 2300;
            REQUIRE(::setrlimit(RLIMIT_NOFILE, &files) == 0);
        }
        // The default cap (three quarters of 1,024), and a cap above the descriptor limit, so that
        // accept itself fails with EMFILE and has to back off.
        for (std::size_t max_connections : {std::size_t{0}, std::size_t{5000}}) {
            CAPTURE(max_connections);
            pss::TcpOptions options;
            options.serve.max_connections = max_connections;
            ForkedPs ps(options, 1024);
            const std::size_t elements = 16;
            {
                auto client = ps.client();
                create_variable(*client, elements);
            }
            asio::io_context io;
            std::vector<asio::ip::tcp::socket> idle;
            for (int i = 0; i < 2000; ++i)
                idle.emplace_back(io).connect({asio::ip::address_v4::loopback(), ps.port()});
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the accept backlog is worked off
            const double cpu_before = ps.cpu_seconds();
            std::this_thread::sleep_for(std::chrono::milliseconds(1000));
            const double cpu = ps.cpu_seconds() - cpu_before;
            MESSAGE("ps CPU time over 1 s with 2,000 idle connections: " << cpu << " s");
            CHECK(cpu < 0.5);  // a spinning accept loop takes the whole second
            CHECK(serves_unchanged(*ps.client(), elements));
        }
    }

    TEST_CASE("TcpTransport under attack: a request id repeated on a connection is answered from the record of "
              "its outcome, not applied twice; one older than the record is refused" *
              doctest::timeout(30)) {
        pss::TcpOptions options;
        options.serve.recorded_replies = 3;
        LocalPs ps(options);
        RawClient raw(ps.port());
        auto exchange = [&](const pss::Request& request, std::uint64_t id) {
            raw.write(frame_bytes(pss::OutgoingFrame::request(request, id, 0, false)));
            Bytes header(80);
            asio::read(raw.socket, asio::buffer(header));
            const auto h = pss::decode_header(std::span<const std::byte, 80>(header.data(), 80));
            Bytes rest(static_cast<std::size_t>(std::uint64_t{h.descriptor_words} * 8 + h.name_length +
                                                h.message_length + h.values_length + h.ids_count * 8 +
                                                h.payload_length));
            asio::read(raw.socket, asio::buffer(rest));
            header.insert(header.end(), rest.begin(), rest.end());
            auto frame = pss::decode_frame(header);
            CHECK(frame.header.request_id == id);
            pss::Reply reply;
            reply.code = frame.header.code;
            reply.message = frame.body.message;
            reply.payload = std::move(frame.payload);
            return reply;
        };
        const auto add_one = shard_request(pss::Op::assign_add, xt::xarray<float>{1, 1});
        CHECK(exchange(shard_request(pss::Op::create, xt::xarray<float>{10, 20}), 1).ok());
        CHECK(exchange(add_one, 2).ok());
        CHECK(exchange(add_one, 2).ok());  // the record's answer: applied once
        const auto wrong_shape = shard_request(pss::Op::assign_add, xt::xarray<float>{1});
        const std::string error = exchange(wrong_shape, 3).message;
        CHECK(error == "pss: assign_add on variable 'w': expected shape (2,) dtype float32, got shape (1,) dtype float32");
        CHECK(exchange(add_one, 3).message == error);  // the record's answer, whatever the frame now says
        CHECK(exchange(shard_request(pss::Op::read), 4).payload.get<float>() == xt::xarray<float>{11, 21});
        CHECK(exchange(shard_request(pss::Op::read), 4).payload.get<float>() == xt::xarray<float>{11, 21});  // reads run again
        CHECK(exchange(add_one, 5).ok());  // reads are not recorded: this pushes id 1 out of the record
        pss::Reply old = exchange(add_one, 1);  // ids 2, 3 and 5 are recorded: 1 is not
        CHECK(old.code == pss::ErrorCode::failed_precondition);
        CHECK(old.message == "pss: TcpTransport: request id 1 reached /job:ps/replica:0/task:0 again on this "
                             "connection (ids must increase: 5 came already); it was not applied again");
        CHECK(exchange(shard_request(pss::Op::read), 6).payload.get<float>() == xt::xarray<float>{12, 22});
    }
}

// ---- TLS and roles ------------------------------------------------------------------------------------

namespace {

pss::TcpOptions tls_as(const pss::TlsAuthority& authority, const pss::TaskId& task) {
    pss::TcpOptions options;
    options.tls = authority.issue(task);
    options.timeouts.startup = std::chrono::milliseconds(3000);
    return options;
}

/// A ps over TLS (certificates of `authority`), serving a ParameterServer<SGD> whose variable 1/0 holds
/// 0, 1, ..., 7, created by a chief of the same CA.
struct TlsPs {
    explicit TlsPs(const pss::TlsAuthority& authority, pss::SyncOptions sync = {})
        : server(pss::SGD(1.0), sync), transport(one_ps(), pss::TaskId{"ps", 0}, tls_as(authority, {"ps", 0})) {
        serve_ps(transport, server);
        auto chief = client(authority, {"chief", 0});
        create_variable(*chief, 8);
    }
    [[nodiscard]] std::uint16_t port() const { return transport.bound_port({"ps", 0}); }
    [[nodiscard]] pss::ClusterSpec spec() const {
        return pss::ClusterSpec{{"ps", {"127.0.0.1:" + std::to_string(port())}}};
    }
    [[nodiscard]] std::unique_ptr<pss::TcpTransport> client(const pss::TlsAuthority& ca, const pss::TaskId& as) const {
        return std::make_unique<pss::TcpTransport>(spec(), tls_as(ca, as));
    }
    pss::ParameterServer<pss::SGD> server;
    pss::TcpTransport transport;
};

}  // namespace

TEST_SUITE("net") {
    TEST_CASE("TcpTransport: links are TLS by default; without credentials a transport refuses to start unless "
              "plaintext is asked for" *
              doctest::timeout(30)) {
        CHECK(pss::TcpTransport(one_ps()).secure());  // the suite's PSS_TLS_DIR, as pss-launch sets it
        CHECK(!pss::TcpTransport(one_ps(), plaintext()).secure());
        const std::string dir = std::getenv("PSS_TLS_DIR");
        ::unsetenv("PSS_TLS_DIR");
        CHECK_THROWS_WITH_AS(pss::TcpTransport(one_ps(), pss::TaskId{"ps", 0}),
                             "pss: TcpTransport: no TLS credentials for /job:ps/replica:0/task:0: set PSS_TLS_DIR (a "
                             "directory holding ca.crt and each task's <job>-<index>.crt and .key; pss-launch makes "
                             "one for every run), or PSS_TLS_CA, PSS_TLS_CERT and PSS_TLS_KEY, or give "
                             "TcpOptions::tls. Plaintext, for trusted networks only, must be asked for: PSS_TLS=off "
                             "or TcpOptions::plaintext",
                             pss::FailedPreconditionError);
        ::setenv("PSS_TLS", "off", 1);
        CHECK(!pss::TcpTransport(one_ps(), pss::TaskId{"ps", 0}).secure());
        ::setenv("PSS_TLS", "maybe", 1);
        CHECK_THROWS_WITH_AS(pss::TcpTransport{one_ps()}, "pss: PSS_TLS is \"maybe\"; give \"on\" or \"off\"",
                             pss::InvalidArgumentError);
        ::unsetenv("PSS_TLS");
        ::setenv("PSS_TLS_DIR", "/nonexistent", 1);
        CHECK_THROWS_WITH_AS(pss::TcpTransport(one_ps(), pss::TaskId{"ps", 0}),
                             "pss: TLS: cannot read the CA certificate \"/nonexistent/ca.crt\" (from PSS_TLS_DIR)",
                             pss::NotFoundError);
        ::setenv("PSS_TLS_DIR", dir.c_str(), 1);
        // Credentials that do not fit: another task's certificate, a key of another certificate.
        const pss::TlsAuthority ca;
        CHECK_THROWS_WITH_AS(pss::TcpTransport(one_ps(), pss::TaskId{"ps", 0}, tls_as(ca, {"worker", 1})),
                             "pss: TcpTransport: the TLS certificate given to /job:ps/replica:0/task:0 names "
                             "/job:worker/replica:0/task:1",
                             pss::InvalidArgumentError);
        pss::TcpOptions mixed = tls_as(ca, {"ps", 0});
        mixed.tls->private_key = ca.issue({"ps", 0}).private_key;
        CHECK_THROWS_WITH_AS(pss::TcpTransport(one_ps(), mixed),
                             "pss: TLS: the private key was refused: use_private_key: key values mismatch (x509 "
                             "certificate routines)",
                             pss::InvalidArgumentError);
        pss::TcpTransport worker(one_ps(), tls_as(ca, {"worker", 0}));
        CHECK_THROWS_WITH_AS(worker.serve({"ps", 0}, pss::answer_at_once([](pss::Request&&) { return pss::Reply{}; })),
                             "pss: TcpTransport: cannot serve /job:ps/replica:0/task:0 with the TLS certificate of "
                             "/job:worker/replica:0/task:0",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("TcpTransport over TLS: a stranger without a certificate, one whose certificate another CA signed, and "
              "a task posing as another get nothing; the ps serves on, unchanged" *
              doctest::timeout(60)) {
        const pss::TlsAuthority ca, other_ca;
        TlsPs ps(ca);
        auto chief = ps.client(ca, {"chief", 0});
        const pss::Request assign = shard_request(pss::Op::assign, xt::xarray<float>(xt::zeros<float>({8})));

        // Plaintext frames to a TLS port: the handshake fails, the connection closes, no byte comes back.
        {
            RawClient raw(ps.port());
            std::error_code ec;
            asio::write(raw.socket, asio::buffer(frame_bytes(pss::OutgoingFrame::request(assign, 1, 0, false))), ec);
            const Bytes answer = raw.read_to_close();
            CHECK(answer.size() < 64);  // at most a TLS alert, never a reply frame
        }
        // TLS without a certificate (the stranger trusts anyone): the ps ends the link before any request.
        {
            asio::io_context io;
            asio::ssl::context context(asio::ssl::context::tls_client);
            context.set_verify_mode(asio::ssl::verify_none);
            asio::ssl::stream<asio::ip::tcp::socket> tls(io, context);
            tls.lowest_layer().connect({asio::ip::address_v4::loopback(), ps.port()});
            std::error_code ec;
            tls.handshake(asio::ssl::stream_base::client, ec);  // TLS 1.3: the client may finish first
            const Bytes frame = frame_bytes(pss::OutgoingFrame::request(assign, 1, 0, false));
            asio::write(tls, asio::buffer(frame), ec);
            std::array<std::byte, 80> reply{};
            const std::size_t n = asio::read(tls, asio::buffer(reply), ec);
            CHECK(n == 0);
            CHECK(ec);
        }
        // A certificate of another CA: the chief's own check of the ps fails first, and says so.
        {
            auto stranger = ps.client(other_ca, {"chief", 0});
            const pss::Reply reply = stranger->send({"ps", 0}, assign).get();
            CHECK(reply.code == pss::ErrorCode::unavailable);
            const std::string expected = "pss: TcpTransport: the TLS handshake with /job:ps/replica:0/task:0 at 127.0.0.1:" +
                                         std::to_string(ps.port()) +
                                         " failed (certificate signature failure): its certificate is not signed by "
                                         "this task's CA, or it refused this task's";
            CHECK(reply.message == expected);
        }
        // A client of another CA that skips its own check: the ps refuses its certificate.
        {
            asio::io_context io;
            asio::ssl::context context(asio::ssl::context::tls_client);
            context.set_verify_mode(asio::ssl::verify_none);
            const auto credentials = other_ca.issue({"chief", 0});
            context.use_certificate_chain(asio::buffer(credentials.certificate));
            context.use_private_key(asio::buffer(credentials.private_key), asio::ssl::context::pem);
            asio::ssl::stream<asio::ip::tcp::socket> tls(io, context);
            tls.lowest_layer().connect({asio::ip::address_v4::loopback(), ps.port()});
            std::error_code ec;
            tls.handshake(asio::ssl::stream_base::client, ec);
            asio::write(tls, asio::buffer(frame_bytes(pss::OutgoingFrame::request(assign, 1, 0, false))), ec);
            std::array<std::byte, 80> reply{};
            CHECK(asio::read(tls, asio::buffer(reply), ec) == 0);
            CHECK(ec);
        }
        // A ps whose certificate names another task: the client refuses to talk to it.
        {
            const pss::ClusterSpec two{{"ps", {"127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}};
            pss::TcpTransport impostor(two, tls_as(ca, {"worker", 0}));
            impostor.serve({"worker", 0}, pss::answer_at_once([](pss::Request&&) { return pss::Reply{}; }));
            const std::string address = "127.0.0.1:" + std::to_string(impostor.bound_port({"worker", 0}));
            pss::TcpTransport chief_to_impostor(pss::ClusterSpec{{"ps", {address}}}, tls_as(ca, {"chief", 0}));
            const pss::Reply reply = chief_to_impostor.send({"ps", 0}, assign).get();
            CHECK(reply.code == pss::ErrorCode::unavailable);
            CHECK(reply.message == "pss: TcpTransport: the task at " + address +
                                       " presented a certificate for /job:worker/replica:0/task:0, not for "
                                       "/job:ps/replica:0/task:0; the cluster spec and the certificates disagree");
        }
        CHECK(serves_unchanged(*chief, 8));
    }

    TEST_CASE("TcpTransport over TLS: each role may make only its requests; a refused one is answered "
              "permission_denied, logged, its connection closed, and nothing changes" *
              doctest::timeout(60)) {
        const pss::TlsAuthority ca;
        TlsPs ps(ca);
        auto chief = ps.client(ca, {"chief", 0});
        auto worker = ps.client(ca, {"worker", 1});
        auto evaluator = ps.client(ca, {"evaluator", 0});
        const auto gradient = xt::xarray<float>(xt::zeros<float>({8}));
        // What a worker does in training: reads, looks up, pushes gradients (of zero: nothing changes).
        CHECK(serves_unchanged(*worker, 8));
        CHECK(worker->send({"ps", 0}, shard_request(pss::Op::gather, {}, Ids{2, 5})).get().payload.get<float>() ==
              xt::xarray<float>{2, 5});
        CHECK(worker->send({"ps", 0}, shard_request(pss::Op::apply_dense, gradient)).get().ok());
        // What a scheduled function may do to a variable (adding zeros, writing what is there).
        CHECK(worker->send({"ps", 0}, shard_request(pss::Op::assign_add, gradient)).get().ok());
        CHECK(worker->send({"ps", 0}, shard_request(pss::Op::scatter_update, xt::xarray<float>{3}, Ids{3})).get().ok());
        CHECK(evaluator->send({"ps", 0}, shard_request(pss::Op::gather, {}, Ids{7})).get().payload.get<float>() ==
              xt::xarray<float>{7});
        const std::string rule =
            ": only the chief creates, destroys, saves and restores variables, sets the learning rate, calls "
            "functions and shuts tasks down; a worker reads and writes variables, an evaluator reads them. The "
            "request was refused and the connection closed";
        // Each refusal on a connection of its own: the ps closes the connection after its answer.
        auto refused = [&](const pss::TaskId& as, pss::Request request, const std::string& who, const std::string& what) {
            const pss::Reply reply = ps.client(ca, as)->send({"ps", 0}, std::move(request)).get();
            CHECK(reply.code == pss::ErrorCode::permission_denied);
            CHECK(reply.message == "pss: TcpTransport: " + who + " may not " + what + rule);
        };
        refused({"worker", 1}, shard_request(pss::Op::create, xt::xarray<float>(xt::ones<float>({8}))),
                "/job:worker/replica:0/task:1", "create");
        refused({"worker", 1}, shard_request(pss::Op::destroy), "/job:worker/replica:0/task:1", "destroy");
        pss::Request save = shard_request(pss::Op::save_shard);
        save.name = "/tmp/stolen";
        refused({"worker", 1}, save, "/job:worker/replica:0/task:1", "save_shard");
        pss::Request shutdown;
        shutdown.kind = pss::RequestKind::shutdown;
        refused({"worker", 1}, shutdown, "/job:worker/replica:0/task:1", "shutdown");
        pss::Request call;
        call.kind = pss::RequestKind::call;
        call.name = "train_step";
        refused({"worker", 1}, call, "/job:worker/replica:0/task:1", "call \"train_step\"");
        refused({"worker", 1}, shard_request(pss::Op::set_learning_rate, xt::xarray<double>(100.0)),
                "/job:worker/replica:0/task:1", "set_learning_rate");
        refused({"evaluator", 0}, shard_request(pss::Op::apply_dense, gradient), "/job:evaluator/replica:0/task:0",
                "apply_gradient");
        // The refused worker connects again, and may still do what workers do.
        CHECK(serves_unchanged(*worker, 8));
        CHECK(serves_unchanged(*chief, 8));
        CHECK(chief->send({"ps", 0}, shard_request(pss::Op::assign, xt::xarray<float>(xt::ones<float>({8})))).get().ok());
        CHECK(worker->send({"ps", 0}, shard_request(pss::Op::read)).get().payload.get<float>() ==
              xt::xarray<float>(xt::ones<float>({8})));
    }

    TEST_CASE("TcpTransport: a host name that does not resolve is named: in the wait's lines and error when "
              "connecting, and in the error when listening" *
              doctest::timeout(30)) {
        const pss::ClusterSpec spec{{"ps", {"no-such-host.invalid:2222"}}};  // .invalid never resolves (RFC 6761)
        auto options = plaintext();
        options.timeouts.startup = std::chrono::milliseconds(300);
        pss::TcpTransport transport(spec, options);
        const pss::Reply reply = transport.send({"ps", 0}, pss::Request{}).get();
        CHECK(reply.code == pss::ErrorCode::unavailable);
        CHECK(reply.message.starts_with("pss: TcpTransport: could not connect to /job:ps/replica:0/task:0 at "
                                        "no-such-host.invalid:2222 within the start-up timeout of 0.3 s ("));
        CHECK(reply.message.find(" attempts; last: the host name \"no-such-host.invalid\" does not resolve: ") !=
              std::string::npos);
        pss::TcpTransport server(spec, plaintext());
        std::string error = "(no error)";
        try {
            server.serve({"ps", 0}, pss::answer_at_once([](pss::Request&&) { return pss::Reply{}; }));
        } catch (const pss::UnavailableError& e) {
            error = e.what();
        }
        CHECK(error.starts_with("pss: TcpTransport: cannot listen on no-such-host.invalid:2222 for "
                                "/job:ps/replica:0/task:0: the host name \"no-such-host.invalid\" does not resolve ("));
    }

    TEST_CASE("TcpTransport: plaintext, asked for, listens only on the address the task's host name resolves to; "
              "TLS on every interface when the name resolves to loopback" *
              doctest::timeout(30)) {
        const std::string host = asio::ip::host_name();
        asio::io_context io;
        asio::ip::tcp::resolver resolver(io);
        std::error_code ec;
        const auto results = resolver.resolve(host, "0", ec);
        if (ec || results.empty()) {
            MESSAGE("skipped: the host name " << host << " does not resolve");
            return;
        }
        const pss::ClusterSpec spec{{"ps", {host + ":0"}}};
        pss::TcpTransport plain(spec, plaintext());
        plain.serve({"ps", 0}, pss::answer_at_once([](pss::Request&&) { return pss::Reply{}; }));
        CHECK(plain.endpoint({"ps", 0}).address() == results.begin()->endpoint().address());
        CHECK(!plain.endpoint({"ps", 0}).address().is_unspecified());
        pss::TcpTransport secure(spec);
        secure.serve({"ps", 0}, pss::answer_at_once([](pss::Request&&) { return pss::Reply{}; }));
        CHECK(secure.endpoint({"ps", 0}).address().is_unspecified());
    }

    TEST_CASE("TcpTransport over TLS: in synchronous training a worker's second push to a step changes nothing (a "
              "closure run again after its worker was lost), before or after the step is applied; only every "
              "worker's push completes the step" *
              doctest::timeout(60)) {
        const pss::TlsAuthority ca;
        TlsPs ps(ca, pss::SyncOptions{true, 2, 0});
        auto chief = ps.client(ca, {"chief", 0});
        auto worker0 = ps.client(ca, {"worker", 0});
        auto worker1 = ps.client(ca, {"worker", 1});
        auto push = [](pss::TcpTransport& worker, float g) {
            pss::Request r = shard_request(pss::Op::apply_dense, xt::xarray<float>(xt::ones<float>({8}) * g));
            r.step = 1;
            return worker.send({"ps", 0}, std::move(r)).get();
        };
        CHECK(push(*worker1, 2).ok());
        CHECK(push(*worker1, 100).ok());  // the first push counts
        CHECK(serves_unchanged(*chief, 8));  // one worker alone does not complete the step
        CHECK(push(*worker0, 4).ok());
        // 0, 1, ..., 7 minus the learning rate 1 times the mean gradient 3.
        const xt::xarray<float> applied = xt::arange<float>(8.0f) - 3.0f;
        CHECK(chief->send({"ps", 0}, shard_request(pss::Op::read)).get().payload.get<float>() == applied);
        CHECK(push(*worker0, 100).ok());  // step 1 is applied: nothing changes
        CHECK(chief->send({"ps", 0}, shard_request(pss::Op::read)).get().payload.get<float>() == applied);
    }
}

// ---- failures: no silent waits ------------------------------------------------------------------------

namespace {

/// What this process writes to stderr while it lives (file descriptor 2 goes to a file meanwhile).
class StderrCapture {
public:
    StderrCapture() : file_(std::tmpfile()) {
        REQUIRE(file_ != nullptr);
        std::fflush(stderr);
        saved_ = ::dup(2);
        REQUIRE(::dup2(::fileno(file_), 2) == 2);
    }
    StderrCapture(const StderrCapture&) = delete;
    StderrCapture& operator=(const StderrCapture&) = delete;
    ~StderrCapture() {
        std::fflush(stderr);
        ::dup2(saved_, 2);
        ::close(saved_);
        std::fclose(file_);
    }
    [[nodiscard]] std::string text() const {
        std::fflush(stderr);
        std::string out;
        std::rewind(file_);
        for (int c; (c = std::fgetc(file_)) != EOF;) out.push_back(static_cast<char>(c));
        return out;
    }

private:
    std::FILE* file_;
    int saved_ = -1;
};

pss::TcpOptions heartbeats(std::chrono::milliseconds interval, std::chrono::milliseconds timeout) {
    pss::TcpOptions options = plaintext();
    options.timeouts.heartbeat_interval = interval;
    options.timeouts.heartbeat_timeout = timeout;
    options.timeouts.startup = std::chrono::milliseconds(3000);
    options.announce_peers = true;
    return options;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

using TcpStrategy =
    pss::ParameterServerStrategy<pss::TcpTransport, pss::NoPartitioner, pss::SGD, pss::SimpleClusterResolver>;

/// A chief, a ps and a worker, each at an address where nothing listens yet.
pss::ClusterSpec chief_ps_worker() {
    return {{"chief", {nobody_listens()}}, {"ps", {nobody_listens()}}, {"worker", {nobody_listens()}}};
}

}  // namespace

TEST_SUITE("net") {
    TEST_CASE("Timeouts: TensorFlow's defaults, changed by PSS_STARTUP_TIMEOUT, PSS_HEARTBEAT_INTERVAL, "
              "PSS_HEARTBEAT_TIMEOUT, PSS_REQUEST_TIMEOUT and PSS_CHIEF_TIMEOUT in seconds; a bad value is named") {
        using std::chrono::milliseconds;
        auto from = [](std::map<std::string, std::string> env) {
            return pss::Timeouts::from_environment([env](std::string_view name) -> std::optional<std::string> {
                auto it = env.find(std::string(name));
                if (it == env.end()) return std::nullopt;
                return it->second;
            });
        };
        const pss::Timeouts defaults = from({});
        CHECK(defaults.startup == milliseconds(60'000));
        CHECK(defaults.heartbeat_interval == milliseconds(1'000));
        CHECK(defaults.heartbeat_timeout == milliseconds(10'000));
        CHECK(defaults.request == milliseconds(0));
        CHECK(defaults.chief == milliseconds(600'000));
        CHECK(defaults.chief_bounded());
        const pss::Timeouts set = from({{"PSS_STARTUP_TIMEOUT", "2.5"},
                                        {"PSS_HEARTBEAT_INTERVAL", "0.25"},
                                        {"PSS_HEARTBEAT_TIMEOUT", "3"},
                                        {"PSS_REQUEST_TIMEOUT", "90"},
                                        {"PSS_CHIEF_TIMEOUT", "4.5"}});
        CHECK(set.startup == milliseconds(2'500));
        CHECK(set.heartbeat_interval == milliseconds(250));
        CHECK(set.heartbeat_timeout == milliseconds(3'000));
        CHECK(set.request == milliseconds(90'000));
        CHECK(set.chief == milliseconds(4'500));
        CHECK_FALSE(from({{"PSS_HEARTBEAT_TIMEOUT", "0"}}).heartbeats());
        CHECK_FALSE(from({{"PSS_HEARTBEAT_TIMEOUT", "0"}}).chief_bounded());  // a chief is heard by its heartbeats
        CHECK_FALSE(from({{"PSS_CHIEF_TIMEOUT", "0"}}).chief_bounded());
        CHECK_THROWS_WITH_AS(from({{"PSS_HEARTBEAT_TIMEOUT", "ten"}}),
                             "pss: PSS_HEARTBEAT_TIMEOUT is \"ten\"; give seconds as a number from 0 to 86400, such "
                             "as \"10\" or \"2.5\"",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(from({{"PSS_STARTUP_TIMEOUT", "-1"}}),
                             "pss: PSS_STARTUP_TIMEOUT is \"-1\"; give seconds as a number from 0 to 86400, such as "
                             "\"10\" or \"2.5\"",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(from({{"PSS_HEARTBEAT_INTERVAL", "10"}}),
                             "pss: Timeouts: the heartbeat interval (10000 ms) must be above 0 and below the heartbeat "
                             "timeout (10000 ms)",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("ParameterServerStrategy: a ps task serves on while a chief's heartbeats reach it, and once none has "
              "for the chief timeout its join raises UnavailableError; a worker's heartbeats do not count" *
              doctest::timeout(30)) {
        using namespace std::chrono_literals;
        const pss::ClusterSpec spec = chief_ps_worker();
        pss::Timeouts timeouts;
        timeouts.heartbeat_interval = 50ms;
        timeouts.heartbeat_timeout = 1s;
        timeouts.chief = 600ms;
        TcpStrategy ps(pss::SimpleClusterResolver(spec, "ps", 0), {}, pss::SGD(1.0), timeouts);
        auto served = std::async(std::launch::async, [&] { ps.join(); });
        // No chief yet: the clock has not started (a chief may start long after its ps tasks).
        CHECK(served.wait_for(900ms) == std::future_status::timeout);
        pss::Request heartbeat;
        heartbeat.kind = pss::RequestKind::heartbeat;
        pss::TcpTransport worker(spec, pss::TaskId{"worker", 0}, timeouts, false);
        REQUIRE(worker.send({"ps", 0}, heartbeat).get().ok());  // its link heartbeats from now on
        std::chrono::steady_clock::time_point chief_gone;
        {
            pss::TcpTransport chief(spec, pss::TaskId{"chief", 0}, timeouts, false);
            REQUIRE(chief.send({"ps", 0}, heartbeat).get().ok());
            CHECK(served.wait_for(1500ms) == std::future_status::timeout);  // 2.5 chief timeouts, heard every 50 ms
            chief_gone = std::chrono::steady_clock::now();
        }
        REQUIRE(served.wait_for(5s) == std::future_status::ready);
        const double waited = seconds_since(chief_gone);
        CHECK(waited >= 0.55);
        CHECK(waited < 3.0);
        CHECK_THROWS_WITH_AS(served.get(),
                             "pss: /job:ps/replica:0/task:0: no chief was heard from for 0.6 s (PSS_CHIEF_TIMEOUT); "
                             "this task stops serving. The chief ended without ending the cluster, or cannot reach "
                             "this task",
                             pss::UnavailableError);
    }

    TEST_CASE("ParameterServerStrategy: a ps drawing a shard from its initializer for longer than the heartbeat "
              "timeout answers heartbeats meanwhile: the chief does not lose it, and the rows are the initializer's" *
              doctest::timeout(60)) {
        using namespace std::chrono_literals;
        const pss::ClusterSpec spec = chief_ps_worker();
        pss::Timeouts timeouts;
        timeouts.heartbeat_interval = 50ms;
        timeouts.heartbeat_timeout = 300ms;
        auto serve = [&](std::string job) {
            return std::async(std::launch::async, [&spec, &timeouts, job] {
                TcpStrategy task(pss::SimpleClusterResolver(spec, job, 0), {}, pss::SGD(1.0), timeouts);
                task.join();
            });
        };
        auto ps = serve("ps");
        auto worker = serve("worker");
        const pss::Shape shape{1 << 20, 64};  // 256 MiB of float32
        const auto init = pss::InitializerSpec::random_uniform(-1, 1, 42);
        const pss::Variable first_row(pss::Shape{1, 64}, pss::DType::float32, init, "first_row");  // drawn here
        {
            TcpStrategy chief(pss::SimpleClusterResolver(spec, "chief", 0), {}, pss::SGD(1.0), timeouts);
            auto scope = chief.scope();
            const auto start = std::chrono::steady_clock::now();
            const pss::Variable table(shape, pss::DType::float32, init, "table");
            const double drew = seconds_since(start);
            MESSAGE("the ps drew 256 MiB in " << drew << " s (heartbeat timeout 0.3 s)");
            CHECK(drew > 0.3);  // else this test shows nothing
            const std::vector<std::int64_t> ids{0};
            CHECK(table.sparse_read(ids).get<float>() == first_row.read<float>());
            chief.join();  // ends the cluster
        }
        REQUIRE(ps.wait_for(10s) == std::future_status::ready);
        REQUIRE(worker.wait_for(10s) == std::future_status::ready);
        CHECK_NOTHROW(ps.get());
        CHECK_NOTHROW(worker.get());
    }

    TEST_CASE("ParameterServerStrategy: a worker waiting for a ps task that is not up stops at once when the chief "
              "ends the cluster: its join returns within 2 s, not after the 10 s start-up timeout" *
              doctest::timeout(30)) {
        using namespace std::chrono_literals;
        const pss::ClusterSpec spec = chief_ps_worker();
        pss::Timeouts timeouts;
        timeouts.startup = 10s;
        StderrCapture captured;  // the worker's "pss: waiting for /job:ps/..." lines
        const auto began = std::chrono::steady_clock::now();
        auto worker = std::async(std::launch::async, [&] {
            TcpStrategy strategy(pss::SimpleClusterResolver(spec, "worker", 0), {}, pss::SGD(1.0), timeouts);
            strategy.join();
        });
        pss::TcpTransport chief(spec, pss::TaskId{"chief", 0}, timeouts, false);
        pss::Request shutdown;
        shutdown.kind = pss::RequestKind::shutdown;
        REQUIRE(chief.send({"worker", 0}, shutdown).get().ok());  // waits for the worker to serve
        const auto ended = std::chrono::steady_clock::now();
        REQUIRE(worker.wait_for(8s) == std::future_status::ready);
        const double exited = seconds_since(ended);
        MESSAGE("the worker served after " << std::chrono::duration<double>(ended - began).count()
                                           << " s and ended " << exited << " s after the chief ended it");
        CHECK_NOTHROW(worker.get());
        CHECK(exited < 2.0);
    }

    TEST_CASE("TcpTransport: waiting for a task that is not up prints whom and where every 5 s, and the start-up "
              "timeout's error names it" *
              doctest::timeout(30)) {
        const std::string address = nobody_listens();
        pss::TcpOptions options = plaintext();
        options.timeouts.startup = std::chrono::milliseconds(5'600);
        StderrCapture captured;
        pss::TcpTransport transport(pss::ClusterSpec{{"ps", {address}}}, options);
        const auto start = std::chrono::steady_clock::now();
        const pss::Reply reply = transport.send({"ps", 0}, pss::Request{}).get();
        const double waited = seconds_since(start);
        CHECK(reply.code == pss::ErrorCode::unavailable);
        CHECK(reply.message.starts_with("pss: TcpTransport: could not connect to /job:ps/replica:0/task:0 at " + address +
                                        " within the start-up timeout of 5.6 s ("));
        CHECK(reply.message.ends_with("). Is the task running, at that address? PSS_STARTUP_TIMEOUT sets the wait"));
        CHECK(waited >= 5.6);
        CHECK(waited < 10);
        const std::string text = captured.text();
        const std::string line = "pss: waiting for /job:ps/replica:0/task:0 at " + address + " (attempt ";
        REQUIRE(text.find(line) != std::string::npos);
        CHECK(text.find(line, text.find(line) + 1) == std::string::npos);  // one line in 5.6 s
        CHECK(text.find(", 5 s)\n") != std::string::npos);
    }

    TEST_CASE("TcpTransport heartbeats: a frozen ps (SIGSTOP) is lost within the heartbeat timeout, its waiting "
              "request answered unavailable and one line printed; once it runs again it is back" *
              doctest::timeout(60)) {
        ForkedPs ps(plaintext());
        const std::string address = "127.0.0.1:" + std::to_string(ps.port());
        StderrCapture captured;
        pss::TcpTransport client(pss::ClusterSpec{{"ps", {address}}},
                                 heartbeats(std::chrono::milliseconds(100), std::chrono::milliseconds(600)));
        create_variable(client, 8);
        REQUIRE(serves_unchanged(client, 8));
        REQUIRE(::kill(ps.pid(), SIGSTOP) == 0);
        REQUIRE(ps.wait_until_stopped());  // a signal takes effect a little later
        const auto start = std::chrono::steady_clock::now();
        const pss::Reply reply = client.send({"ps", 0}, shard_request(pss::Op::read)).get();
        const double waited = seconds_since(start);
        REQUIRE(::kill(ps.pid(), SIGCONT) == 0);
        CHECK(reply.code == pss::ErrorCode::unavailable);
        CHECK(reply.message == "pss: TcpTransport: /job:ps/replica:0/task:0 at " + address +
                                   " answered no heartbeat for 0.6 s: it is dead, frozen or cut off "
                                   "(PSS_HEARTBEAT_TIMEOUT sets the wait); a request in flight may or may not have "
                                   "been applied");
        CHECK(waited >= 0.5);  // the last heartbeat may have gone out up to one interval before the stop
        CHECK(waited < 0.6 + 2);
        MESSAGE("a frozen ps was found after " << waited << " s (heartbeat timeout 0.6 s, interval 0.1 s)");
        CHECK(serves_unchanged(client, 8));  // a new connection: the ps runs again
        const std::string text = captured.text();
        CHECK(text.find("pss: lost /job:ps/replica:0/task:0 at " + address +
                        " (no heartbeat answered for 0.6 s)\n") != std::string::npos);
        CHECK(text.find("pss: /job:ps/replica:0/task:0 at " + address + " is back\n") != std::string::npos);
    }

    TEST_CASE("TcpTransport: a task killed has the heartbeat timeout to come back; after that a request connects "
              "once and is answered at once, naming the task" *
              doctest::timeout(60)) {
        ForkedPs ps(plaintext());
        const std::string address = "127.0.0.1:" + std::to_string(ps.port());
        pss::TcpTransport client(pss::ClusterSpec{{"ps", {address}}},
                                 heartbeats(std::chrono::milliseconds(100), std::chrono::milliseconds(600)));
        create_variable(client, 8);
        REQUIRE(serves_unchanged(client, 8));
        ps.kill();
        const auto killed = std::chrono::steady_clock::now();
        // The link's end is found at once; a request then waits for the task until the heartbeat timeout
        // after the loss, trying to connect.
        const pss::Reply first = client.send({"ps", 0}, shard_request(pss::Op::read)).get();
        const double waited = seconds_since(killed);
        CHECK(first.code == pss::ErrorCode::unavailable);
        CHECK(first.message.find("/job:ps/replica:0/task:0 at " + address) != std::string::npos);
        CHECK(waited < 0.6 + 1.5);
        MESSAGE("the first request after the kill was answered after " << waited << " s: " << first.message);
        // After the heartbeat timeout: one connect, answered at once.
        std::this_thread::sleep_until(killed + std::chrono::milliseconds(700));
        const auto start = std::chrono::steady_clock::now();
        const pss::Reply later = client.send({"ps", 0}, shard_request(pss::Op::read)).get();
        CHECK(seconds_since(start) < 0.5);
        CHECK(later.code == pss::ErrorCode::unavailable);
        CHECK(later.message == "pss: TcpTransport: /job:ps/replica:0/task:0 at " + address +
                                   " is not up (Connection refused); it was lost and has not come back");
    }

    TEST_CASE("TcpTransport: a request deadline holds while a heartbeat to a frozen ps waits unanswered before it" *
              doctest::timeout(60)) {
        ForkedPs ps(plaintext());
        const std::string address = "127.0.0.1:" + std::to_string(ps.port());
        pss::TcpOptions options = heartbeats(std::chrono::milliseconds(50), std::chrono::milliseconds(5'000));
        options.timeouts.request = std::chrono::milliseconds(300);
        pss::TcpTransport client(pss::ClusterSpec{{"ps", {address}}}, options);
        create_variable(client, 8);
        REQUIRE(::kill(ps.pid(), SIGSTOP) == 0);
        REQUIRE(ps.wait_until_stopped());
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a heartbeat is waiting now
        const auto start = std::chrono::steady_clock::now();
        const pss::Reply reply = client.send({"ps", 0}, shard_request(pss::Op::read)).get();
        const double waited = seconds_since(start);
        REQUIRE(::kill(ps.pid(), SIGCONT) == 0);
        CHECK(reply.code == pss::ErrorCode::unavailable);
        CHECK(reply.message == "pss: request to /job:ps/replica:0/task:0 timed out after 0.3 s");
        CHECK(waited >= 0.3);
        CHECK(waited < 3);
    }

    TEST_CASE("TcpTransport heartbeats: a request a handler answers only after 3 heartbeat timeouts completes; "
              "the busy task is not lost" *
              doctest::timeout(30)) {
        pss::TcpTransport server(one_ps(), plaintext());
        std::vector<std::thread> answering;
        std::mutex mutex;
        server.serve({"ps", 0}, [&](pss::Request&&, pss::Responder respond) {
            std::lock_guard lock(mutex);
            answering.emplace_back([respond = std::move(respond)]() mutable {
                std::this_thread::sleep_for(std::chrono::milliseconds(1'800));
                respond(pss::Reply{});
            });
        });
        StderrCapture captured;
        {
            pss::TcpTransport client(
                pss::ClusterSpec{{"ps", {"127.0.0.1:" + std::to_string(server.bound_port({"ps", 0}))}}},
                heartbeats(std::chrono::milliseconds(100), std::chrono::milliseconds(600)));
            const auto start = std::chrono::steady_clock::now();
            CHECK(client.send({"ps", 0}, pss::Request{}).get().ok());
            CHECK(seconds_since(start) >= 1.8);
        }
        for (auto& t : answering) t.join();
        CHECK(captured.text().find("pss: lost") == std::string::npos);
    }

    TEST_CASE("TcpTransport: a request waited for at once on an idle plaintext link is exchanged on the sender's "
              "thread, in order after the requests sent before it; a slow reply, a timeout, a task that closed the "
              "idle link and a shutdown end it as they end a request through the io thread" *
              doctest::timeout(60)) {
        // The ps answers request k (its key's variable) with 2k, and holds the one numbered `held` until
        // it is told to let go: then it answers it with -1.
        pss::TcpTransport server(one_ps(), plaintext());
        std::mutex mutex;
        std::vector<std::uint64_t> seen;
        std::uint64_t held = 0;
        pss::Responder holding;
        server.serve({"ps", 0}, [&](pss::Request&& r, pss::Responder respond) {
            std::lock_guard lock(mutex);
            seen.push_back(r.key.variable);
            if (r.key.variable == held && held != 0) {
                holding = std::move(respond);
                return;
            }
            pss::Reply reply;
            reply.payload = pss::Tensor(xt::xarray<std::int64_t>{2 * static_cast<std::int64_t>(r.key.variable)});
            respond(std::move(reply));
        });
        const auto let_go = [&] {
            std::lock_guard lock(mutex);
            pss::Reply reply;
            reply.payload = pss::Tensor(xt::xarray<std::int64_t>{-1});
            holding(std::move(reply));
            held = 0;
        };
        const std::string address = "127.0.0.1:" + std::to_string(server.bound_port({"ps", 0}));
        const auto request = [](std::uint64_t k, bool at_once) {
            pss::Request r;
            r.key.variable = k;
            r.in_process.waited_at_once = at_once;
            return r;
        };
        const auto answer = [](pss::Reply reply) { return reply.ok() ? reply.payload.get<std::int64_t>()(0) : std::int64_t{-9}; };
        const auto ready = [](std::future<pss::Reply>& f) { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; };
        pss::TcpOptions quiet = plaintext();
        quiet.timeouts.heartbeat_timeout = std::chrono::milliseconds(0);  // nothing reads an idle link

        SUBCASE("in order, its reply in when send returns") {
            pss::TcpTransport client(pss::ClusterSpec{{"ps", {address}}}, quiet);
            REQUIRE(answer(client.send({"ps", 0}, request(1, false)).get()) == 2);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the link parks after its reply
            int in_at_once = 0;
            std::int64_t sum = 0;
            for (std::uint64_t k = 2; k < 102; ++k) {
                auto f = client.send({"ps", 0}, request(k, true));
                in_at_once += ready(f) ? 1 : 0;
                sum += answer(f.get());
            }
            CHECK(in_at_once == 100);
            CHECK(sum == 2 * (101 * 102 / 2 - 1));
            // Sent before it through the io thread, 10 requests are handled before the one waited for.
            std::vector<std::future<pss::Reply>> before;
            for (std::uint64_t k = 200; k < 210; ++k) before.push_back(client.send({"ps", 0}, request(k, false)));
            CHECK(answer(client.send({"ps", 0}, request(300, true)).get()) == 600);
            for (std::size_t i = 0; i < before.size(); ++i) CHECK(answer(before[i].get()) == 2 * (200 + static_cast<std::int64_t>(i)));
            std::lock_guard lock(mutex);
            REQUIRE(seen.size() == 112);
            for (std::size_t i = 0; i < 101; ++i) CHECK(seen[i] == i + 1);
            for (std::size_t i = 0; i < 10; ++i) CHECK(seen[101 + i] == 200 + i);
            CHECK(seen[111] == 300);
        }

        SUBCASE("a reply slower than the heartbeat interval is read by the io thread, which answers heartbeats meanwhile") {
            StderrCapture captured;
            {
                pss::TcpTransport client(pss::ClusterSpec{{"ps", {address}}},
                                         heartbeats(std::chrono::milliseconds(50), std::chrono::milliseconds(300)));
                REQUIRE(answer(client.send({"ps", 0}, request(1, false)).get()) == 2);
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                {
                    std::lock_guard lock(mutex);
                    held = 5;
                }
                std::thread releaser([&] {
                    std::this_thread::sleep_for(std::chrono::milliseconds(700));  // beyond twice the heartbeat timeout
                    let_go();
                });
                const auto start = std::chrono::steady_clock::now();
                auto f = client.send({"ps", 0}, request(5, true));
                const double returned = seconds_since(start);
                CHECK(answer(f.get()) == -1);
                CHECK(returned >= 0.05);  // it waited the heartbeat interval on this thread
                CHECK(returned < 0.65);
                CHECK(seconds_since(start) >= 0.7);
                releaser.join();
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                auto next = client.send({"ps", 0}, request(6, true));
                CHECK(answer(next.get()) == 12);
            }
            CHECK(captured.text().find("pss: lost") == std::string::npos);
        }

        SUBCASE("a request timeout answers it timed out; its late reply is dropped and the link serves on") {
            pss::TcpOptions options = quiet;
            options.timeouts.request = std::chrono::milliseconds(300);
            pss::TcpTransport client(pss::ClusterSpec{{"ps", {address}}}, options);
            REQUIRE(answer(client.send({"ps", 0}, request(1, false)).get()) == 2);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            {
                std::lock_guard lock(mutex);
                held = 7;
            }
            const auto start = std::chrono::steady_clock::now();
            const pss::Reply late = client.send({"ps", 0}, request(7, true)).get();
            const double waited = seconds_since(start);
            CHECK(late.code == pss::ErrorCode::unavailable);
            CHECK(late.message == "pss: request to /job:ps/replica:0/task:0 timed out after 0.3 s");
            CHECK(waited >= 0.3);
            CHECK(waited < 2);
            CHECK(answer(client.send({"ps", 0}, request(8, true)).get()) == 16);
            let_go();  // the late -1 reaches a link that no longer waits for it
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            auto f = client.send({"ps", 0}, request(9, true));
            CHECK(ready(f));
            CHECK(answer(f.get()) == 18);
        }

        SUBCASE("the task closed the idle link: a request, waited for at once or not, goes on a new link, to the "
                "task serving there now") {
            pss::TcpTransport client(pss::ClusterSpec{{"ps", {address}}}, quiet);
            REQUIRE(answer(client.send({"ps", 0}, request(1, false)).get()) == 2);
            // A ps that answers k with factor * k, on the address the last one left.
            const auto restarted = [&](std::int64_t factor) {
                auto ps = std::make_unique<pss::TcpTransport>(pss::ClusterSpec{{"ps", {address}}}, plaintext());
                ps->serve({"ps", 0}, [factor](pss::Request&& r, pss::Responder respond) {
                    pss::Reply reply;
                    reply.payload = pss::Tensor(xt::xarray<std::int64_t>{factor * static_cast<std::int64_t>(r.key.variable)});
                    respond(std::move(reply));
                });
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                return ps;
            };
            server.shutdown();  // closes the parked link; nothing on the client reads it
            auto second = restarted(3);
            CHECK(answer(client.send({"ps", 0}, request(4, true)).get()) == 12);
            CHECK(answer(client.send({"ps", 0}, request(5, true)).get()) == 15);
            second->shutdown();
            auto third = restarted(4);
            CHECK(answer(client.send({"ps", 0}, request(6, false)).get()) == 24);
        }

        SUBCASE("a task that ends an idle link is lost at once, not at the next heartbeat: nothing reads a "
                "parked link, a watch sees its end") {
            StderrCapture captured;
            pss::TcpTransport client(pss::ClusterSpec{{"ps", {address}}},
                                     heartbeats(std::chrono::seconds(20), std::chrono::seconds(60)));
            REQUIRE(answer(client.send({"ps", 0}, request(1, true)).get()) == 2);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));  // parked
            const std::string line = "pss: lost /job:ps/replica:0/task:0 at " + address + " (its connection ended: End of file)\n";
            CHECK(captured.text().find("pss: lost") == std::string::npos);
            const auto start = std::chrono::steady_clock::now();
            server.shutdown();
            while (captured.text().find("pss: lost") == std::string::npos && seconds_since(start) < 10)
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            const double waited = seconds_since(start);
            CHECK(captured.text().find(line) != std::string::npos);
            CHECK(waited < 1.0);  // the heartbeat would have found it after 20 s
        }

        SUBCASE("a shutdown ends an exchange waiting on the sender's thread") {
            pss::TcpTransport client(pss::ClusterSpec{{"ps", {address}}}, quiet);
            REQUIRE(answer(client.send({"ps", 0}, request(1, false)).get()) == 2);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            {
                std::lock_guard lock(mutex);
                held = 3;
            }
            pss::Reply reply;
            std::thread sender([&] { reply = client.send({"ps", 0}, request(3, true)).get(); });
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            const auto start = std::chrono::steady_clock::now();
            client.shutdown();
            sender.join();
            CHECK(seconds_since(start) < 1.0);
            CHECK(reply.code == pss::ErrorCode::unavailable);
            CHECK(reply.message == "pss: TcpTransport: the transport was shut down before /job:ps/replica:0/task:0 answered");
            let_go();
        }
    }
}


// ---- compression on the wire (issue 12 item 7) ----------------------------------------------------------

namespace {

/// `values` rounded to 16 bits of `c`, as a compressed read returns them.
xt::xarray<float> rounded(xt::xarray<float> values, pss::Compression c) {
    pss::detail::round_in_place(c, std::span<float>(values.data(), values.size()));
    return values;
}

/// What a variable trained with compressed gradients and reads holds, exactly (its ps's float32 bits)
/// and as a compressed read returns it.
struct CompressedRun {
    xt::xarray<float> dense, table, dense_read, table_rows;
};

/// 100 SGD(1) steps of a constant gradient 0.01/3 on a 3 x 2 variable and on rows of a 6 x 2 table (id 0
/// twice a step), both over 2 ps, as `c`; then read both compressed and exactly.
template <class Strategy>
CompressedRun train_compressed(Strategy& strategy, pss::Compression c) {
    auto scope = strategy.scope();
    strategy.set_compression(c);
    pss::Variable dense(xt::xarray<float>{{0.1f, 1.0f / 3}, {-2.7f, 1.1f}, {5e-3f, 7.0f}}, "dense");
    pss::Variable table(xt::xarray<float>(xt::ones<float>({6, 2})), "table");
    pss::Variable counts(xt::xarray<std::int64_t>{1, 2}, "counts");
    CHECK(dense.compression() == c);
    CHECK(counts.compression() == pss::Compression::none);  // only float32 is compressed
    const float g = 0.01f / 3;
    for (int step = 0; step < 100; ++step) {
        dense.apply_gradient(xt::xarray<float>(xt::ones<float>({3, 2}) * g));
        table.apply_sparse_gradient(Ids{0, 5, 0, 3}, xt::xarray<float>(xt::ones<float>({4, 2}) * g));
    }
    CompressedRun run;
    run.dense_read = dense.read<float>();
    xt::xarray<float> into = xt::zeros<float>({3, 2});
    dense.read_into(into);
    CHECK(into == run.dense_read);
    // One shard: read_into lands in the caller's buffer, and is widened there.
    pss::Variable row(xt::xarray<float>{{0.1f, 1.0f / 3}}, "row");
    REQUIRE(row.num_shards() == 1);
    xt::xarray<float> buffer = xt::zeros<float>({1, 2});
    const float* memory = buffer.data();
    row.read_into(buffer);
    CHECK(buffer.data() == memory);
    CHECK(buffer == rounded(xt::xarray<float>{{0.1f, 1.0f / 3}}, c));
    run.table_rows = table.sparse_read(Ids{5, 0, 3}).get<float>();
    dense.set_compression(pss::Compression::none);
    table.set_compression(pss::Compression::none);
    run.dense = dense.read<float>();
    run.table = table.read<float>();
    return run;
}

}  // namespace

TEST_SUITE("net") {
    TEST_CASE("Compression: bfloat16 rounds to nearest, ties to even; float16 by F16C and by xtl's half_float agree "
              "bit for bit" * doctest::timeout(30)) {
        using pss::detail::to_bfloat16;
        CHECK(to_bfloat16(1.0f) == 0x3F80);
        CHECK(to_bfloat16(1.0f / 3) == 0x3EAB);                                    // 0x3EAAAAAB rounds up
        CHECK(to_bfloat16(std::bit_cast<float>(0x3F808000u)) == 0x3F80);          // a tie: to the even 0x3F80
        CHECK(to_bfloat16(std::bit_cast<float>(0x3F818000u)) == 0x3F82);          // a tie: to the even 0x3F82
        CHECK(to_bfloat16(-0.0f) == 0x8000);
        CHECK(to_bfloat16(std::numeric_limits<float>::max()) == 0x7F80);          // rounds to infinity
        CHECK(to_bfloat16(std::bit_cast<float>(0x7F800001u)) == 0x7FC0);          // a signalling NaN stays a NaN
        CHECK(pss::detail::from_bfloat16(0x3EAB) == 0.333984375f);

        // float16: the two implementations (F16C here when the CPU has it) on every half, and on floats.
        std::vector<std::uint16_t> halves(65536);
        for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<std::uint16_t>(i);
        std::vector<float> widened(halves.size());
        pss::detail::widen(pss::Compression::float16, halves.data(), widened.data(), halves.size());
        std::size_t differ = 0;
        for (std::size_t i = 0; i < halves.size(); ++i) {
            const float by_xtl = half_float::detail::half2float<float>(halves[i]);
            differ += std::isnan(by_xtl) ? !std::isnan(widened[i])
                                         : std::bit_cast<std::uint32_t>(by_xtl) != std::bit_cast<std::uint32_t>(widened[i]);
        }
        CHECK(differ == 0);
        std::vector<float> floats = {1.0f, 0.1f, 65504.0f, 65519.0f, 65520.0f, -1e9f, 1e-8f, 6e-8f, 3e-5f, -0.0f,
                                     std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
        std::mt19937 bits(7);
        for (int i = 0; i < 200000; ++i) floats.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits())));
        std::vector<std::uint16_t> narrowed(floats.size());
        pss::detail::narrow(pss::Compression::float16, floats.data(), narrowed.data(), floats.size());
        CHECK(narrowed[0] == 0x3C00);
        CHECK(narrowed[1] == 0x2E66);
        CHECK(narrowed[2] == 0x7BFF);  // the largest float16
        CHECK(narrowed[3] == 0x7BFF);  // below the tie
        CHECK(narrowed[4] == 0x7C00);  // the tie with 65536 rounds to even: infinity
        CHECK(narrowed[5] == 0xFC00);
        CHECK(narrowed[6] == 0x0000);  // below half the smallest subnormal
        CHECK(narrowed[7] == 0x0001);  // the smallest subnormal, 2^-24
        differ = 0;
        for (std::size_t i = 0; i < floats.size(); ++i) {
            const auto by_xtl = static_cast<std::uint16_t>(half_float::detail::float2half<std::round_to_nearest>(floats[i]));
            const bool nan = (by_xtl & 0x7FFF) > 0x7C00;
            differ += nan ? (narrowed[i] & 0x7FFF) <= 0x7C00 : narrowed[i] != by_xtl;
        }
        CHECK(differ == 0);

        // Widened in place (3,000 halves received into a buffer of 3,000 floats), as a receiver does.
        std::vector<float> buffer(3000);
        std::vector<std::uint16_t> sent(3000);
        for (std::size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<std::uint16_t>(0x3C00 + i);
        std::memcpy(buffer.data(), sent.data(), 2 * sent.size());
        pss::detail::widen_in_place(pss::Compression::float16, buffer.data(), buffer.size());
        std::vector<float> expected(3000);
        pss::detail::widen(pss::Compression::float16, sent.data(), expected.data(), sent.size());
        CHECK(buffer == expected);
        CHECK(buffer[0] == 1.0f);
        CHECK(buffer[1] == 1.0f + 1.0f / 1024);
    }

    TEST_CASE("Compression: error feedback keeps what rounding lost, so 1,000 pushes of 0.1 add up to 100 within one "
              "rounding; without it they miss by 0.098" * doctest::timeout(30)) {
        for (const pss::Compression c : {pss::Compression::bfloat16, pss::Compression::float16}) {
            CAPTURE(pss::compression_name(c));
            std::vector<float> residual(1, 0.0f);
            double with = 0, without = 0;
            for (int i = 0; i < 1000; ++i) {
                float g = 0.1f;
                pss::detail::round_with_feedback(c, std::span<float>(&g, 1), residual);
                with += g;
                without += rounded(xt::xarray<float>{0.1f}, c)(0);
            }
            CHECK(std::abs(with - 100.0) < 1e-3);
            CHECK(std::abs(with + residual[0] - 1000 * double{0.1f}) < 1e-4);
            CHECK(std::abs(without - 100.0) > (c == pss::Compression::bfloat16 ? 0.09 : 0.02));
        }
        // A push beyond float16's range saturates, and the rest is owed; a non-finite one is left as it is.
        std::vector<float> values{1e6f, std::numeric_limits<float>::infinity()}, residual{0.0f, 5.0f};
        pss::detail::round_with_feedback(pss::Compression::float16, values, residual);
        CHECK(values[0] == 65504.0f);
        CHECK(residual[0] == 1e6f - 65504.0f);
        CHECK(values[1] == std::numeric_limits<float>::infinity());
        CHECK(residual[1] == 0.0f);
    }

    TEST_CASE("wire: a push flagged bfloat16 carries 2 bytes an element and arrives widened to float32; a pull so "
              "flagged asks for its reply so" * doctest::timeout(30)) {
        pss::Request push;
        push.op = pss::Op::apply_dense;
        push.key = {3, 1};
        push.compression = pss::Compression::bfloat16;
        push.payload = xt::xarray<float>{1.0f, 1.0f / 3, -2.5f};
        const pss::OutgoingFrame frame = pss::OutgoingFrame::request(push, 9, 0, false);
        CHECK(frame.header().flags == pss::frame_flag_bfloat16);
        CHECK(frame.header().payload_length == 6);
        pss::DecodedFrame back = pss::decode_frame(frame.bytes());
        CHECK(back.header.compression() == pss::Compression::bfloat16);
        CHECK(back.payload.get<float>() == xt::xarray<float>{1.0f, 0.333984375f, -2.5f});
        CHECK(pss::to_request(back.header, back.body, std::move(back.payload)).compression == pss::Compression::bfloat16);

        pss::Reply reply;
        reply.payload = xt::xarray<float>{{0.1f, 65504.0f}};
        reply.compression = pss::Compression::float16;
        pss::DecodedFrame answered = pss::decode_frame(pss::OutgoingFrame::reply(reply, 9, 0, false).bytes());
        CHECK(answered.header.payload_length == 4);
        CHECK(answered.payload.get<float>() == xt::xarray<float>{{0.0999755859375f, 65504.0f}});

        // Only float32 travels compressed: another dtype goes as it is, and a frame that says otherwise is refused.
        pss::Request ints = push;
        ints.payload = xt::xarray<std::int64_t>{1, 2};
        const pss::OutgoingFrame plain = pss::OutgoingFrame::request(ints, 9, 0, false);
        CHECK(plain.header().flags == 0);
        Bytes forged = plain.bytes();
        forged[7] = std::byte{pss::frame_flag_bfloat16};
        reseal(forged);
        CHECK(decode_error(forged) ==
              "pss: wire: frame tensor 0: is int64 but the flags compress it to bfloat16; only float32 travels compressed");
        pss::Request gather;
        gather.op = pss::Op::gather;
        gather.ids = {1, 2};
        gather.compression = pss::Compression::float16;
        CHECK(pss::decode_frame(pss::OutgoingFrame::request(gather, 1, 0, false).bytes()).header.compression() ==
              pss::Compression::float16);
    }

    TEST_CASE("Compression: training over loopback sockets with bfloat16 and float16 ends with the embedded cluster's "
              "bits, within one rounding of the run without it; reads come back rounded" *
              doctest::timeout(60)) {
        using Tcp = pss::ParameterServerStrategy<pss::TcpTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                 pss::SimpleClusterResolver>;
        using Embedded = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                      pss::LocalClusterResolver<2, 1>>;
        auto tcp = [] {
            return std::make_unique<Tcp>(pss::SimpleClusterResolver(pss::ClusterSpec{
                                             {"ps", {"127.0.0.1:0", "127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}}),
                                         pss::FixedShardsPartitioner(2), pss::SGD(1.0));
        };
        Embedded exact_strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(1.0));
        const CompressedRun exact = train_compressed(exact_strategy, pss::Compression::none);
        for (const pss::Compression c : {pss::Compression::bfloat16, pss::Compression::float16}) {
            CAPTURE(pss::compression_name(c));
            const CompressedRun over_sockets = train_compressed(*tcp(), c);
            Embedded embedded_strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(1.0));
            const CompressedRun embedded = train_compressed(embedded_strategy, c);
            // The same bits, whether the values crossed a wire or not.
            CHECK(over_sockets.dense == embedded.dense);
            CHECK(over_sockets.table == embedded.table);
            CHECK(over_sockets.dense_read == embedded.dense_read);
            CHECK(over_sockets.table_rows == embedded.table_rows);
            // A read returns the ps's value rounded to 16 bits.
            CHECK(over_sockets.dense_read == rounded(over_sockets.dense, c));
            CHECK(over_sockets.table_rows == rounded(xt::xarray<float>(xt::view(over_sockets.table, xt::keep(5, 0, 3))), c));
            CHECK(over_sockets.dense_read != over_sockets.dense);
            // Error feedback: 100 gradients of 0.01/3 (200 on row 0) within one rounding of the exact run,
            // where rounding each one alone loses 7e-4 (bfloat16: 0.01/3 is off by 6.9e-6 in 8 bits).
            CHECK(xt::amax(xt::abs(over_sockets.dense - exact.dense))() < 3e-5f);
            CHECK(xt::amax(xt::abs(over_sockets.table - exact.table))() < 3e-5f);
            const float lost = 100 * std::abs(rounded(xt::xarray<float>{0.01f / 3}, c)(0) - 0.01f / 3);
            CHECK(lost > (c == pss::Compression::bfloat16 ? 5e-4f : 2e-5f));
            CHECK(std::abs(exact.table(0, 0) - (1.0f - 200 * 0.01f / 3)) < 1e-5f);
        }
        // PSS_COMPRESSION gives a strategy its first compression, so that a program trains compressed unchanged.
        ::setenv("PSS_COMPRESSION", "float16", 1);
        CHECK(Embedded({}, pss::FixedShardsPartitioner(2)).compression() == pss::Compression::float16);
        ::setenv("PSS_COMPRESSION", "fp16", 1);
        CHECK_THROWS_WITH_AS(Embedded({}, pss::FixedShardsPartitioner(2)),
                             "pss: PSS_COMPRESSION is \"fp16\"; give none, bfloat16 or float16", pss::InvalidArgumentError);
        ::unsetenv("PSS_COMPRESSION");
        CHECK(Embedded({}, pss::FixedShardsPartitioner(2)).compression() == pss::Compression::none);
        CHECK_THROWS_WITH_AS(
            [] {
                Embedded strategy({}, pss::FixedShardsPartitioner(2));
                auto scope = strategy.scope();
                pss::Variable counts(xt::xarray<std::int64_t>{1, 2}, "counts");
                counts.set_compression(pss::Compression::bfloat16);
            }(),
            "pss: set_compression(bfloat16) of variable 'counts:0': its dtype is int64; only float32 variables travel "
            "compressed",
            pss::InvalidArgumentError);
    }
}
