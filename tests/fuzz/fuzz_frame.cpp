// tests/fuzz/fuzz_frame.cpp: libFuzzer target for the wire decoder (pss/wire.hpp): any bytes, never a crash.
//
// The bytes go through pss::decode_frame, which runs decode_header, body_buffers, decode_body and
// payload_buffer: the functions a TcpTransport server and client run on what they read. A frame that
// decodes is turned into its Request or Reply, encoded again and decoded again, and must come back equal.
// Built and run by tools/fuzz.sh. Built with -DPSS_FUZZ_WRITE_SEEDS, it is instead a program that writes
// the seed corpus (tests/fuzz/corpus/) from frames the library's own encoder makes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>

#include <pss/wire.hpp>

namespace {

std::vector<std::byte> bytes_of(const pss::OutgoingFrame& frame) { return frame.bytes(); }

bool same_specs(const std::vector<pss::TensorSpec>& a, const std::vector<pss::TensorSpec>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].dtype != b[i].dtype || a[i].shape != b[i].shape) return false;
    return true;
}

void require(bool condition) {
    if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    pss::WireLimits limits;
    limits.max_payload_bytes = 1u << 20;  // a truncated frame never allocates; keep the fuzzer's memory small anyway
    pss::DecodedFrame frame;
    try {
        frame = pss::decode_frame(std::as_bytes(std::span<const std::uint8_t>(data, size)), limits);
    } catch (const pss::WireError&) {
        return 0;
    }
    require(frame.size <= size);
    const pss::FrameHeader header = frame.header;
    const bool elided = header.payload_elided();
    const std::vector<pss::TensorSpec> specs = frame.body.tensors;
    // A payload sent as 16-bit numbers: its values as first decoded, to compare with the second decoding's
    // (the bytes may differ: a signalling NaN is encoded again quiet).
    std::vector<float> widened;
    if (header.compression() != pss::Compression::none && frame.payload.has_value() && !elided)
        widened.assign(frame.payload.get<float>().begin(), frame.payload.get<float>().end());
    std::vector<std::byte> again;
    if (header.is_reply()) {
        pss::Reply reply = pss::to_reply(header, frame.body, std::move(frame.payload), std::move(frame.tensors));
        if (elided) reply.payload = pss::Tensor::zeros(specs[0].dtype, specs[0].shape);
        if (header.has_values() && reply.values.cbor.empty() && reply.values.tensors.empty()) return 0;  // sent as no values
        again = bytes_of(pss::OutgoingFrame::reply(reply, header.request_id, header.task, elided));
    } else {
        pss::Request request = pss::to_request(header, frame.body, std::move(frame.payload), std::move(frame.tensors));
        if (elided) request.payload = pss::Tensor::zeros(specs[0].dtype, specs[0].shape);
        again = bytes_of(pss::OutgoingFrame::request(request, header.request_id, header.task, elided));
    }
    const pss::DecodedFrame back = pss::decode_frame(again, limits);  // must not throw
    require(back.size == again.size());
    require(back.header.kind == header.kind && back.header.request_id == header.request_id &&
            back.header.flags == header.flags && back.header.payload_length == header.payload_length &&
            same_specs(back.body.tensors, specs));
    if (!widened.empty()) {
        const auto& values = back.payload.get<float>();
        require(values.size() == widened.size());
        for (std::size_t i = 0; i < widened.size(); ++i)
            require(std::memcmp(&values.data()[i], &widened[i], sizeof(float)) == 0 ||
                    (values.data()[i] != values.data()[i] && widened[i] != widened[i]));  // both NaN
    } else if (header.payload_length > 0) {
        std::vector<std::byte> sent;
        auto append = [&](const pss::Tensor& t) {  // what the wire carries of `t`: a string tensor encoded
            if (t.dtype() != pss::DType::string) return sent.insert(sent.end(), t.bytes(), t.bytes() + t.nbytes()), void();
            const auto encoded = pss::detail::encode_strings(t.get<std::string>());
            sent.insert(sent.end(), encoded.begin(), encoded.end());
        };
        if (back.payload.has_value()) append(back.payload);
        for (const auto& t : back.tensors) append(t);
        require(sent.size() == header.payload_length &&
                std::memcmp(sent.data(), data + (frame.size - header.payload_length), header.payload_length) == 0);
    }
    return 0;
}

#ifdef PSS_FUZZ_WRITE_SEEDS
#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
    const std::string dir = argc > 1 ? argv[1] : "tests/fuzz/corpus";
    auto write = [&](const std::string& name, const pss::OutgoingFrame& frame) {
        const auto b = bytes_of(frame);
        std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                                                static_cast<std::streamsize>(b.size()));
        std::cout << dir << "/" << name << ": " << b.size() << " bytes\n";
    };
    pss::Request create;
    create.op = pss::Op::create;
    create.key = {1, 0};
    create.name = "dense/kernel";
    create.payload = xt::xarray<float>{{1.5f, -2.0f}, {0.25f, 8.0f}};
    write("request_create_float32", pss::OutgoingFrame::request(create, 1, 0, false));
    create.payload = {};
    create.initializer = pss::ShardInitializer{pss::InitializerSpec::truncated_normal(0.0, 0.05, 7), pss::DType::float32,
                                               {10, 4}, 6, 4};
    write("request_create_initializer", pss::OutgoingFrame::request(create, 1, 0, false));
    pss::Request scatter;
    scatter.op = pss::Op::scatter_add;
    scatter.key = {2, 1};
    scatter.ids = {3, 0, 3};
    scatter.payload = xt::xarray<std::int64_t>{{1, 2}, {3, 4}, {5, 6}};
    write("request_scatter_add_int64", pss::OutgoingFrame::request(scatter, 2, 1, false));
    pss::Request read;
    read.op = pss::Op::read;
    read.key = {2, 0};
    read.payload = xt::xarray<double>(xt::xarray<double>::from_shape({4, 3}));
    write("request_read_elided_float64", pss::OutgoingFrame::request(read, 3, 0, true));
    pss::Request destroy;
    destroy.op = pss::Op::destroy;
    destroy.key = {9, 4};
    destroy.step = 12;
    write("request_destroy_empty", pss::OutgoingFrame::request(destroy, 4, 2, false));
    pss::Reply value{pss::ErrorCode::ok, "", xt::xarray<std::int32_t>{7, 8, 9}, {}};
    write("reply_int32", pss::OutgoingFrame::reply(value, 5, 0, false));
    pss::Reply error = pss::Reply::error(pss::ErrorCode::out_of_range, "pss: id 9 is out of range for shape (4,)");
    write("reply_error", pss::OutgoingFrame::reply(error, 6, 0, false));
    pss::Reply spent{pss::ErrorCode::ok, "", xt::xarray<float>(xt::xarray<float>::from_shape({2, 2, 2})), {}};
    write("reply_spent_elided", pss::OutgoingFrame::reply(spent, 7, 0, true));
    pss::Reply scalar{pss::ErrorCode::ok, "", xt::xarray<double>(2.5), {}};
    write("reply_scalar_float64", pss::OutgoingFrame::reply(scalar, 8, 1, false));
    pss::Request compressed;  // a gradient as bfloat16, 2 bytes an element
    compressed.op = pss::Op::apply_dense;
    compressed.key = {3, 1};
    compressed.compression = pss::Compression::bfloat16;
    compressed.payload = xt::xarray<float>{{0.5f, -1.25f, 3.0f}};
    write("request_apply_dense_bfloat16", pss::OutgoingFrame::request(compressed, 12, 1, false));
    pss::Reply narrowed{pss::ErrorCode::ok, "", xt::xarray<float>{0.1f, 65504.0f}, {}, pss::Compression::float16};
    write("reply_float16", pss::OutgoingFrame::reply(narrowed, 13, 1, false));
    pss::Request call;
    call.kind = pss::RequestKind::call;
    call.name = "pss.keras.Sequential.step";
    call.values.cbor = {0x83, 0x01, 0xa1, 0x66, 't', 'e', 'n', 's', 'o', 'r', 0x00, 0x41, 'x'};  // [1, {"tensor": 0}, h'78']
    call.values.tensors = {pss::Tensor(xt::xarray<float>{{1, 2}, {3, 4}}), pss::Tensor(xt::xarray<std::int64_t>(xt::ones<std::int64_t>(pss::Shape{}) * 3))};
    write("request_call_two_tensors", pss::OutgoingFrame::request(call, 9, 1, false));
    pss::Reply answered;
    answered.values.cbor = {0x82, 0x00, 0xf9, 0x3c, 0x00};  // [0, 1.0]
    write("reply_call_values", pss::OutgoingFrame::reply(answered, 10, 1, false));
    pss::Request shutdown;
    shutdown.kind = pss::RequestKind::shutdown;
    write("request_shutdown", pss::OutgoingFrame::request(shutdown, 11, 0, false));
    pss::Request strings;
    strings.op = pss::Op::scatter_update;
    strings.key = {3, 0};
    strings.ids = {1, 0};
    strings.payload = xt::xarray<std::string>{"the", ""};
    write("request_scatter_update_strings", pss::OutgoingFrame::request(strings, 12, 0, false));
    pss::Request call_strings;
    call_strings.kind = pss::RequestKind::call;
    call_strings.name = "f";
    call_strings.values.cbor = {0x81, 0xa1, 0x66, 't', 'e', 'n', 's', 'o', 'r', 0x00};  // [{"tensor": 0}]
    call_strings.values.tensors = {pss::Tensor(xt::xarray<std::string>{"a", "bc", "def"}), pss::Tensor(xt::xarray<float>{1})};
    write("request_call_strings", pss::OutgoingFrame::request(call_strings, 13, 1, false));
    return 0;
}
#endif
