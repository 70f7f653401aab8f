// pss/wire.hpp: the frame format the Tcp transport speaks, its encoder and its validating decoder.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <asio/buffer.hpp>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

static_assert(std::endian::native == std::endian::little,
              "pss: the wire sends tensor payloads and row ids as little-endian bytes straight from memory (no "
              "serialisation copy); big-endian hosts are not supported");

/// @brief The wire format of the Tcp transport: one frame per Request or Reply.
///
/// A frame is a fixed 80-byte little-endian header, then variable sections, then the payload:
///
/// | offset | size | field | rule |
/// | --- | --- | --- | --- |
/// | 0 | 4 | magic | the bytes "PSS1" (`0x31535350` read as a little-endian u32) |
/// | 4 | 2 | version | `wire_version` (2) |
/// | 6 | 1 | kind | a shard operation's `Op` (1 to 12, 15 to 23), `frame_kind_call` (13), `frame_kind_shutdown` (14), `frame_kind_heartbeat` (127), or `frame_kind_reply` (128) |
/// | 7 | 1 | flags | `frame_flag_payload_elided` (the one tensor is described, its bytes not sent), `frame_flag_values` (the frame carries a call's Values), `frame_flag_bfloat16` or `frame_flag_float16` (its float32 payload travels as 16-bit numbers; on a read or gather, the reply is asked for so) |
/// | 8 | 4 | error code | an `ErrorCode` (0 to 10); 0 in requests |
/// | 12 | 8 | request id | chosen by the client, echoed by the reply |
/// | 20 | 4 | task | request: the index of the task addressed; reply: the index of the answering task |
/// | 24 | 8 | variable id | `ShardKey::variable` |
/// | 32 | 4 | shard id | `ShardKey::shard` |
/// | 36 | 2 | tensors | tensors described: at most 1 without `frame_flag_values`, else at most `WireLimits::max_tensors` |
/// | 38 | 2 | descriptor words | u64 words of the descriptor section: one per tensor plus its rank, plus one per string tensor |
/// | 40 | 4 | name length | bytes of the shard name (a call's function name) |
/// | 44 | 4 | message length | bytes of the error message |
/// | 48 | 8 | ids count | number of row ids |
/// | 56 | 8 | payload length | bytes of the tensors, one after another, or 0 when elided |
/// | 64 | 8 | step | `Request::step`: the synchronous training step; 0 in replies |
/// | 72 | 4 | values length | bytes of the CBOR values (`Values::cbor`); 0 without `frame_flag_values` |
/// | 76 | 4 | checksum | CRC-32C of bytes 0 to 75 and of the sections below, but not of the payload |
///
/// Then: the descriptors (for each tensor a word `dtype | rank << 8`, the other bytes 0, then rank x
/// u64 extents, then for a string tensor one word more: its encoded bytes), the name, the message, the
/// CBOR values, the ids (count x i64), and the payload (each tensor's row-major elements, in order; a
/// string tensor's elements encoded as one u64 length per element, then their bytes one after another).
/// All integers are little-endian.
///
/// A create without a payload carries its ShardInitializer as its ids, 6 + rank words: `kind | dtype <<
/// 8 | rank << 16`, the seed, the IEEE bits of the initializer's two parameters, the shard's row offset
/// and rows, and the variable's extents. They are checked as every field is (known kind and dtype, rank
/// at most 8, rows inside the variable, valid parameters, the shard no bigger than the payload limit):
/// the ps draws the shard from them.
///
/// A shard operation carries at most one tensor (its `payload`); a call and a call's reply carry
/// `Values`: the non-tensor values in CBOR (nlohmann/json's encoder and decoder, fuzzed upstream), the
/// tensors as the frame's own tensors, so that one decoder checks every tensor that crosses the wire.
///
/// The checksum covers what a corrupted byte could turn into a wrong decision: the header and the small
/// sections (a shard name, an error text, a call's values, the row ids a scatter writes to). It leaves
/// out the bulk payload on purpose: CRC-32C in software runs at a few GB/s, about the speed of loopback
/// TCP itself, so checksumming a 64 MB gradient would halve the transport's throughput, and TCP already
/// checksums every segment.
///
/// A frame flagged `frame_flag_bfloat16` or `frame_flag_float16` (one of them; not on a call or its
/// reply) carries its float32 payload as 2 bytes an element, in that format, little-endian: the
/// descriptor says float32 and the shape, the payload length is 2 bytes an element, and the receiver
/// widens it back to float32 (Compression). A read or gather request so flagged asks for its reply so.
///
/// An elided payload is described (dtype, shape) but its bytes stay where they are: a `read` request's
/// payload is the buffer the client wants the value in (it stays with the client and the reply lands in
/// it); an update's reply payload is the spent request payload handed back (the client hands its own
/// tensor back, so the gradient does not travel twice).
///
/// Every frame read from the network is untrusted: `decode_header` and `decode_body` check every field
/// and every length against `WireLimits` before a byte is allocated for it.
inline constexpr std::uint32_t wire_magic = 0x31535350u;  // "PSS1"
inline constexpr std::uint16_t wire_version = 2;
inline constexpr std::size_t frame_header_size = 80;
inline constexpr std::size_t max_wire_rank = 8;
inline constexpr std::uint8_t frame_kind_call = 13;
inline constexpr std::uint8_t frame_kind_shutdown = 14;
/// A connection asks whether its peer is alive; the peer's transport answers at once (see Timeouts).
inline constexpr std::uint8_t frame_kind_heartbeat = 127;
inline constexpr std::uint8_t frame_kind_reply = 128;
inline constexpr std::uint8_t frame_flag_payload_elided = 2;
inline constexpr std::uint8_t frame_flag_values = 4;
inline constexpr std::uint8_t frame_flag_bfloat16 = 8;
inline constexpr std::uint8_t frame_flag_float16 = 16;

/// @brief The Compression a frame's flags name (none when neither bit is set).
[[nodiscard]] constexpr Compression compression_of_flags(std::uint8_t flags) noexcept {
    return (flags & frame_flag_bfloat16) != 0  ? Compression::bfloat16
           : (flags & frame_flag_float16) != 0 ? Compression::float16
                                               : Compression::none;
}

/// @brief Bounds on what a peer may ask this process to allocate. A length above one is a WireError.
struct WireLimits {
    std::uint64_t max_payload_bytes = std::uint64_t{1} << 30;  ///< 1 GiB
    std::uint64_t max_ids = std::uint64_t{1} << 24;            ///< 16 Mi ids (128 MiB)
    std::uint32_t max_name = 4096;                             ///< bytes of a shard name
    std::uint32_t max_message = 1u << 16;                      ///< bytes of an error message
    std::uint32_t max_values = 16u << 20;                      ///< bytes of a call's CBOR values (16 MiB)
    std::uint16_t max_tensors = 4096;                          ///< tensors of a call or its answer
    /// Bytes of a shard that a create asks this process to draw from an initializer. None of them
    /// travels (the frame holds a few words), so the payload limit does not bound it: 64 GiB lets a ps
    /// hold a table of many GiB as one shard (50M rows x 32 float32 over 4 ps: 1.6 GB a shard).
    std::uint64_t max_initialized_shard_bytes = std::uint64_t{64} << 30;
};

/// @brief A frame that breaks the format. `request_id()` is set when the header was sound enough (magic
/// and version right) for its id to be trusted, so that the receiver can answer with an error reply.
class WireError : public InvalidArgumentError {
public:
    explicit WireError(const std::string& message, std::optional<std::uint64_t> request_id = std::nullopt)
        : InvalidArgumentError(message), request_id_(request_id) {}
    [[nodiscard]] std::optional<std::uint64_t> request_id() const noexcept { return request_id_; }

private:
    std::optional<std::uint64_t> request_id_;
};

/// @brief The fixed header of a frame, decoded. `checksum` is the value carried by the frame.
struct FrameHeader {
    std::uint8_t kind = static_cast<std::uint8_t>(Op::read);
    std::uint8_t flags = 0;
    ErrorCode code = ErrorCode::ok;
    std::uint64_t request_id = 0;
    std::uint32_t task = 0;
    ShardKey key;
    std::uint16_t tensors = 0;
    std::uint16_t descriptor_words = 0;
    std::uint32_t name_length = 0;
    std::uint32_t message_length = 0;
    std::uint64_t ids_count = 0;
    std::uint64_t payload_length = 0;
    std::uint64_t step = 0;
    std::uint32_t values_length = 0;
    std::uint32_t checksum = 0;

    [[nodiscard]] bool is_reply() const noexcept { return kind == frame_kind_reply; }
    /// @brief What a request frame asks (not meaningful for a reply).
    [[nodiscard]] RequestKind request_kind() const noexcept {
        return kind == frame_kind_call ? RequestKind::call
               : kind == frame_kind_shutdown  ? RequestKind::shutdown
               : kind == frame_kind_heartbeat ? RequestKind::heartbeat
                                              : RequestKind::operation;
    }
    [[nodiscard]] Op op() const noexcept { return static_cast<Op>(kind); }
    /// @brief True when the frame describes one tensor that is a shard operation's payload (or its reply's).
    [[nodiscard]] bool has_payload() const noexcept { return tensors == 1 && !has_values(); }
    [[nodiscard]] bool payload_elided() const noexcept { return (flags & frame_flag_payload_elided) != 0; }
    [[nodiscard]] bool has_values() const noexcept { return (flags & frame_flag_values) != 0; }
    /// @brief How the float32 payload travels (or, on a read or gather request, how its reply should).
    [[nodiscard]] Compression compression() const noexcept { return compression_of_flags(flags); }
    /// @brief Bytes of the sections between the header and the payload.
    [[nodiscard]] std::uint64_t body_length() const noexcept {
        return std::uint64_t{descriptor_words} * 8 + name_length + message_length + values_length + ids_count * 8;
    }
};

/// @brief The dtype and shape of one tensor a frame carries.
struct TensorSpec {
    DType dtype = DType::float32;
    Shape shape;
    std::uint64_t encoded_bytes = 0;  ///< a string tensor's bytes on the wire (lengths and characters)
};

/// @brief The variable sections of a received frame. Reused from frame to frame by a connection.
struct FrameBody {
    std::vector<std::byte> descriptor_bytes;
    std::vector<TensorSpec> tensors;  ///< filled by `decode_body`
    std::string name;
    std::string message;
    std::vector<std::uint8_t> values;
    std::vector<std::int64_t> ids;
    /// @brief The one tensor of a frame whose `has_payload()`.
    [[nodiscard]] const TensorSpec& payload() const noexcept { return tensors.front(); }
};

/// @brief CRC-32C (Castagnoli) of `data`, continuing from `crc` (0 to start). Slicing-by-8 tables.
/// `crc32c(0, "123456789")` is `0xE3069283`.
[[nodiscard]] std::uint32_t crc32c(std::uint32_t crc, std::span<const std::byte> data) noexcept;

/// @brief The 80 header bytes of `header`, every integer written little-endian byte by byte.
[[nodiscard]] std::array<std::byte, frame_header_size> encode_header(const FrameHeader& header) noexcept;

/// @brief Decodes and validates a header read from the network.
/// @throws WireError naming the field and its value, e.g.
///   - `pss: wire: frame magic is 0x00000000, expected 0x31535350 ("PSS1"); the peer does not speak pss`
///   - `pss: wire: frame version 1 is not supported; this build speaks version 2`
///   - `pss: wire: frame kind 99 is unknown; a request is an operation 1 to 12 or 15 to 23, a call 13 or a shutdown 14, a reply is 128`
///   - `pss: wire: frame payload length 2147483648 exceeds the limit 1073741824`
///   - `pss: wire: frame of a shard operation describes 2 tensors; it carries one at most`
///   - the same for name, message and values lengths, ids and tensor counts, unknown flags, error codes
[[nodiscard]] FrameHeader decode_header(std::span<const std::byte, frame_header_size> bytes,
                                        const WireLimits& limits = {});

/// @brief Sizes `body` for `header` and returns the buffers to read the sections into (descriptors,
/// name, message, values, ids: one scatter read). The header must have come from `decode_header`.
[[nodiscard]] std::array<asio::mutable_buffer, 5> body_buffers(const FrameHeader& header, FrameBody& body);

/// @brief Checks the sections read into `body_buffers`: the checksum over `header_bytes` and the
/// sections, then each tensor's descriptor, and their shapes against the payload length. Fills
/// `body.tensors`.
/// @throws WireError
///   - `pss: wire: frame checksum 0x12345678 does not match the computed 0x9abcdef0; the frame was corrupted`
///   - `pss: wire: frame tensor 0: dtype byte 9 is not a dtype; expected 1 (float32) to 5 (string)`
///   - `pss: wire: frame tensor 0: rank 9 exceeds the limit 8`
///   - `pss: wire: frame payload length 12 does not match the tensors' 16 bytes (float32 (2, 2))`
///   - `pss: wire: frame tensor 0: shape (4294967296, 4294967296) of float32 exceeds the payload limit 1073741824 bytes`
void decode_body(std::span<const std::byte, frame_header_size> header_bytes, const FrameHeader& header,
                 FrameBody& body, const WireLimits& limits = {});

/// @brief A tensor to receive the payload of a validated frame into (a frame whose `has_payload()`):
/// `reuse` when it has the dtype and number of elements (it is reshaped, its buffer kept), else a new
/// uninitialised one. Empty when the frame carries no payload bytes.
[[nodiscard]] Tensor payload_buffer(const FrameHeader& header, const FrameBody& body, Tensor reuse = {});

/// @brief The tensors to receive a validated Values frame's payload into, uninitialised, and the
/// buffers to read into them (one scatter read).
[[nodiscard]] std::vector<Tensor> value_tensors(const FrameHeader& header, const FrameBody& body);
[[nodiscard]] std::vector<asio::mutable_buffer> tensor_buffers(std::vector<Tensor>& tensors);

/// @brief Turns the tensors read in their wire form (`payload` and `tensors`, as `payload_buffer` and
/// `value_tensors` made them, the payload's `payload_length` bytes at its start) into their values: a
/// 16-bit payload widened to float32 in place, each string tensor into its `xt::xarray<std::string>`,
/// checking the encoding.
/// @throws WireError `pss: wire: frame tensor 0: its string lengths add up to 60 bytes, but 64 follow them`, or
///   `pss: wire: frame tensor 0: string 2 has length 9, more than the 4 left of the 64 bytes after the lengths`
void decode_wire_tensors(const FrameHeader& header, Tensor& payload, std::vector<Tensor>& tensors);

/// @brief The Request a validated request frame carries. `payload` is the received tensor (or, for an
/// elided payload, the buffer the receiver offers; it may be empty); `tensors` a call's.
[[nodiscard]] Request to_request(const FrameHeader& header, FrameBody& body, Tensor payload,
                                 std::vector<Tensor> tensors = {});

/// @brief The Reply a validated reply frame carries.
[[nodiscard]] Reply to_reply(const FrameHeader& header, FrameBody& body, Tensor payload,
                             std::vector<Tensor> tensors = {});

/// @brief A frame ready to be written by scatter-gather: the header and descriptors are encoded here,
/// the name, message, values, ids and tensors are referenced where they live (a tensor's bytes are its
/// own storage: nothing is copied). The referenced Request or Reply must outlive the write and stay
/// unchanged.
class OutgoingFrame {
public:
    OutgoingFrame() = default;
    /// @brief Appends the buffers to write, in order: header, descriptors, name, message, values, ids,
    /// then each tensor. (Made on each call, so that a copied or moved frame points at its own header.)
    void append_buffers(std::vector<asio::const_buffer>& out) const {
        out.push_back(asio::buffer(header_bytes_));
        out.push_back(descriptors());
        out.push_back(asio::buffer(name_.data(), name_.size()));
        out.push_back(asio::buffer(message_.data(), message_.size()));
        out.push_back(asio::buffer(values_.data(), values_.size()));
        out.push_back(asio::buffer(ids_bytes().data(), ids_bytes().size()));
        if (payload_length_ == 0) return;
        if (many_ == nullptr) {
            out.push_back(encoded_.empty() ? asio::buffer(payload_, payload_length_) : asio::buffer(encoded_.front()));
            return;
        }
        auto encoded = encoded_.begin();  // the string tensors' wire forms, in order
        for (const Tensor& t : *many_)
            out.push_back(t.dtype() == DType::string ? asio::buffer(*encoded++) : asio::buffer(t.bytes(), t.nbytes()));
    }
    /// @brief The frame's bytes in one buffer (tests, and the fuzzer's seeds).
    [[nodiscard]] std::vector<std::byte> bytes() const {
        std::vector<asio::const_buffer> parts;
        append_buffers(parts);
        std::vector<std::byte> out(size());
        asio::buffer_copy(asio::buffer(out), parts);
        return out;
    }
    [[nodiscard]] std::size_t size() const noexcept {
        return frame_header_size + descriptors().size() + name_.size() + message_.size() + values_.size() +
               ids_bytes().size() + payload_length_;
    }
    [[nodiscard]] const FrameHeader& header() const noexcept { return header_; }

    /// @brief A request frame. With `elide_payload` the payload is described but not sent.
    [[nodiscard]] static OutgoingFrame request(const Request& request, std::uint64_t id, std::uint32_t task,
                                               bool elide_payload);
    /// @brief A reply frame. With `elide_payload` the payload is described but not sent.
    [[nodiscard]] static OutgoingFrame reply(const Reply& reply, std::uint64_t id, std::uint32_t task,
                                             bool elide_payload);

private:
    void build(const Tensor& payload, bool elide, Compression compression, const Values* values, std::span<const std::byte> name,
               std::span<const std::byte> message, std::span<const std::int64_t> ids);
    void describe(const Tensor& t, std::byte*& out);
    /// The ids section: the request's ids, or the words of its initializer (held here).
    [[nodiscard]] std::span<const std::byte> ids_bytes() const noexcept {
        return initializer_words_.empty() ? ids_ : std::as_bytes(std::span(initializer_words_));
    }
    [[nodiscard]] asio::const_buffer descriptors() const noexcept {
        return many_descriptors_.empty() ? asio::buffer(one_descriptor_.data(), descriptor_length_)
                                         : asio::buffer(many_descriptors_);
    }

    FrameHeader header_;
    std::array<std::byte, frame_header_size> header_bytes_{};
    // A shard operation's one tensor is described here, with no allocation; a call's tensors below.
    std::array<std::byte, 8 * (2 + max_wire_rank)> one_descriptor_{};
    std::size_t descriptor_length_ = 0;
    std::vector<std::byte> many_descriptors_;
    std::span<const std::byte> name_, message_, values_, ids_;
    const std::byte* payload_ = nullptr;
    const std::vector<Tensor>* many_ = nullptr;
    std::vector<std::vector<std::byte>> encoded_;  // the string tensors sent, in their wire form (a copy)
    std::shared_ptr<std::byte[]> narrowed_;        // a float32 payload sent as 16-bit numbers (shared by copies)
    std::vector<std::int64_t> initializer_words_;  // a create's ShardInitializer, sent as its ids
    std::size_t payload_length_ = 0;
};

/// @brief A whole frame decoded from contiguous bytes, through the same checks a server applies.
struct DecodedFrame {
    FrameHeader header;
    FrameBody body;
    Tensor payload;               ///< a shard operation's one tensor
    std::vector<Tensor> tensors;  ///< a Values frame's tensors
    std::size_t size = 0;         ///< bytes of `bytes` the frame took
};

/// @brief Decodes the frame at the start of `bytes` (what the fuzz target drives).
/// @throws WireError as `decode_header` and `decode_body`, and
///   `pss: wire: frame is truncated: 40 bytes, the header needs 76` (or the sections, or the payload).
[[nodiscard]] DecodedFrame decode_frame(std::span<const std::byte> bytes, const WireLimits& limits = {});

// ---- implementation ---------------------------------------------------------------------------------

namespace detail {

struct Crc32cTables {
    std::uint32_t t[8][256];
};

constexpr Crc32cTables make_crc32c_tables() noexcept {
    Crc32cTables tables{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        tables.t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
        for (int k = 1; k < 8; ++k)
            tables.t[k][i] = (tables.t[k - 1][i] >> 8) ^ tables.t[0][tables.t[k - 1][i] & 0xFFu];
    return tables;
}

inline constexpr Crc32cTables crc32c_tables = make_crc32c_tables();

template <std::size_t N>
inline void put_le(std::byte* out, std::uint64_t value) noexcept {
    for (std::size_t i = 0; i < N; ++i) out[i] = static_cast<std::byte>((value >> (8 * i)) & 0xFFu);
}

template <std::size_t N>
[[nodiscard]] inline std::uint64_t get_le(const std::byte* in) noexcept {
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < N; ++i) value |= std::uint64_t{std::to_integer<std::uint8_t>(in[i])} << (8 * i);
    return value;
}

[[nodiscard]] inline std::string hex32(std::uint32_t value) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out = "0x";
    for (int shift = 28; shift >= 0; shift -= 4) out += digits[(value >> shift) & 0xFu];
    return out;
}

[[nodiscard]] inline std::span<const std::byte> as_bytes(const std::string& s) noexcept {
    return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

[[nodiscard]] inline std::uint32_t frame_checksum(std::span<const std::byte> header_bytes,
                                                  std::initializer_list<std::span<const std::byte>> sections) noexcept {
    std::uint32_t crc = crc32c(0, header_bytes.first(frame_header_size - 4));
    for (const auto& section : sections) crc = crc32c(crc, section);
    return crc;
}

}  // namespace detail

inline std::uint32_t crc32c(std::uint32_t crc, std::span<const std::byte> data) noexcept {
    const auto& t = detail::crc32c_tables.t;
    std::uint32_t c = ~crc;
    const std::byte* p = data.data();
    std::size_t n = data.size();
    while (n >= 8) {
        const auto lo = static_cast<std::uint32_t>(detail::get_le<4>(p)) ^ c;
        const auto hi = static_cast<std::uint32_t>(detail::get_le<4>(p + 4));
        c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) c = t[0][(c ^ std::to_integer<std::uint8_t>(*p++)) & 0xFFu] ^ (c >> 8);
    return ~c;
}

inline std::array<std::byte, frame_header_size> encode_header(const FrameHeader& h) noexcept {
    using detail::put_le;
    std::array<std::byte, frame_header_size> out{};
    std::byte* p = out.data();
    put_le<4>(p + 0, wire_magic);
    put_le<2>(p + 4, wire_version);
    put_le<1>(p + 6, h.kind);
    put_le<1>(p + 7, h.flags);
    put_le<4>(p + 8, static_cast<std::uint32_t>(h.code));
    put_le<8>(p + 12, h.request_id);
    put_le<4>(p + 20, h.task);
    put_le<8>(p + 24, h.key.variable);
    put_le<4>(p + 32, h.key.shard);
    put_le<2>(p + 36, h.tensors);
    put_le<2>(p + 38, h.descriptor_words);
    put_le<4>(p + 40, h.name_length);
    put_le<4>(p + 44, h.message_length);
    put_le<8>(p + 48, h.ids_count);
    put_le<8>(p + 56, h.payload_length);
    put_le<8>(p + 64, h.step);
    put_le<4>(p + 72, h.values_length);
    put_le<4>(p + 76, h.checksum);
    return out;
}

inline FrameHeader decode_header(std::span<const std::byte, frame_header_size> bytes, const WireLimits& limits) {
    using detail::get_le;
    const std::byte* p = bytes.data();
    const auto magic = static_cast<std::uint32_t>(get_le<4>(p));
    if (magic != wire_magic)
        throw WireError("pss: wire: frame magic is " + detail::hex32(magic) + ", expected " + detail::hex32(wire_magic) +
                        " (\"PSS1\"); the peer does not speak pss");
    const auto version = static_cast<std::uint16_t>(get_le<2>(p + 4));
    if (version != wire_version)
        throw WireError("pss: wire: frame version " + std::to_string(version) +
                        " is not supported; this build speaks version " + std::to_string(wire_version));
    FrameHeader h;
    h.request_id = get_le<8>(p + 12);
    // From here the request id can be trusted enough to address an error reply to it.
    auto fail = [&](const std::string& what) -> void { throw WireError("pss: wire: frame " + what, h.request_id); };
    auto too_big = [&](const char* field, std::uint64_t value, std::uint64_t limit) {
        if (value > limit)
            fail(std::string(field) + " " + std::to_string(value) + " exceeds the limit " + std::to_string(limit));
    };
    h.kind = static_cast<std::uint8_t>(get_le<1>(p + 6));
    h.flags = static_cast<std::uint8_t>(get_le<1>(p + 7));
    const auto code = static_cast<std::uint32_t>(get_le<4>(p + 8));
    h.task = static_cast<std::uint32_t>(get_le<4>(p + 20));
    h.key.variable = get_le<8>(p + 24);
    h.key.shard = static_cast<std::uint32_t>(get_le<4>(p + 32));
    h.tensors = static_cast<std::uint16_t>(get_le<2>(p + 36));
    h.descriptor_words = static_cast<std::uint16_t>(get_le<2>(p + 38));
    h.name_length = static_cast<std::uint32_t>(get_le<4>(p + 40));
    h.message_length = static_cast<std::uint32_t>(get_le<4>(p + 44));
    h.ids_count = get_le<8>(p + 48);
    h.payload_length = get_le<8>(p + 56);
    h.step = get_le<8>(p + 64);
    h.values_length = static_cast<std::uint32_t>(get_le<4>(p + 72));
    h.checksum = static_cast<std::uint32_t>(get_le<4>(p + 76));

    const bool shard_operation = (h.kind >= static_cast<std::uint8_t>(Op::create) && h.kind <= static_cast<std::uint8_t>(Op::destroy)) ||
                                 (h.kind >= static_cast<std::uint8_t>(Op::save_shard) &&
                                  h.kind <= static_cast<std::uint8_t>(Op::set_learning_rate));
    const bool bare = h.kind == frame_kind_shutdown || h.kind == frame_kind_heartbeat;  // carry nothing
    if (!(shard_operation || h.kind == frame_kind_call || bare || h.is_reply()))
        fail("kind " + std::to_string(h.kind) +
             " is unknown; a request is an operation 1 to 12 or 15 to 23, a call 13, a shutdown 14 or a heartbeat "
             "127, a reply is 128");
    if ((h.flags & ~(frame_flag_payload_elided | frame_flag_values | frame_flag_bfloat16 | frame_flag_float16)) != 0)
        fail("flags " + std::to_string(h.flags) +
             " has unknown bits; only 2 (elided), 4 (values), 8 (bfloat16) and 16 (float16) are defined");
    if ((h.flags & frame_flag_bfloat16) != 0 && (h.flags & frame_flag_float16) != 0)
        fail("flags " + std::to_string(h.flags) + " name two compressions, bfloat16 and float16; a frame has one");
    if (h.compression() != Compression::none && h.has_values())
        fail("flags " + std::to_string(h.flags) + " compress a call's values; only a shard operation's payload travels compressed");
    if (code > static_cast<std::uint32_t>(ErrorCode::permission_denied))
        fail("error code " + std::to_string(code) + " is unknown; codes are 0 (ok) to 10 (permission denied)");
    h.code = static_cast<ErrorCode>(code);
    if (!h.is_reply() && h.code != ErrorCode::ok)
        fail("error code " + std::to_string(code) + " is set on a request; only a reply carries an error");
    const bool call = h.kind == frame_kind_call;
    if (call && !h.has_values()) fail("of a call carries no values; a call's arguments are its values");
    if (h.has_values() && !call && !h.is_reply())
        fail("of kind " + std::to_string(h.kind) + " carries values; only a call and its reply do");
    if (bare && (h.tensors != 0 || h.ids_count != 0 || h.name_length != 0))
        fail(std::string("of a ") + (h.kind == frame_kind_shutdown ? "shutdown" : "heartbeat") +
             " carries tensors, ids or a name; it carries nothing");
    if (h.is_reply() && (h.ids_count != 0 || h.name_length != 0))
        fail("of a reply carries ids or a name; a reply carries neither");
    if (h.has_values())
        too_big("tensors", h.tensors, limits.max_tensors);
    else if (h.tensors > 1)
        fail("of a shard operation describes " + std::to_string(h.tensors) + " tensors; it carries one at most");
    if (h.payload_elided() && !h.has_payload())
        fail("flags " + std::to_string(h.flags) + " mark a payload elided but the frame has no payload to elide");
    // Each tensor takes one descriptor word and at most max_wire_rank more (and a string tensor one more).
    if (h.descriptor_words < h.tensors || h.descriptor_words > std::uint64_t{h.tensors} * (2 + max_wire_rank))
        fail("descriptor words " + std::to_string(h.descriptor_words) + " cannot describe " + std::to_string(h.tensors) +
             " tensors of rank 0 to " + std::to_string(max_wire_rank));
    too_big("payload length", h.payload_length, limits.max_payload_bytes);
    too_big("name length", h.name_length, limits.max_name);
    too_big("message length", h.message_length, limits.max_message);
    too_big("values length", h.values_length, limits.max_values);
    too_big("ids count", h.ids_count, limits.max_ids);
    if (!h.has_values() && h.values_length != 0)
        fail("values length " + std::to_string(h.values_length) + " is given without the values flag; it must be 0");
    if ((h.tensors == 0 || h.payload_elided()) && h.payload_length != 0)
        fail("payload length " + std::to_string(h.payload_length) + " is given but " +
             (h.tensors != 0 ? "the payload is elided" : "the frame has no tensors") + "; it must be 0");
    return h;
}

inline std::array<asio::mutable_buffer, 5> body_buffers(const FrameHeader& header, FrameBody& body) {
    body.descriptor_bytes.resize(std::size_t{header.descriptor_words} * 8);
    body.name.resize(header.name_length);
    body.message.resize(header.message_length);
    body.values.resize(header.values_length);
    body.ids.resize(static_cast<std::size_t>(header.ids_count));
    return {asio::buffer(body.descriptor_bytes), asio::buffer(body.name.data(), body.name.size()),
            asio::buffer(body.message.data(), body.message.size()), asio::buffer(body.values),
            asio::buffer(body.ids.data(), body.ids.size() * sizeof(std::int64_t))};
}

inline void decode_body(std::span<const std::byte, frame_header_size> header_bytes, const FrameHeader& header,
                        FrameBody& body, const WireLimits& limits) {
    auto fail = [&](const std::string& what) -> void {
        throw WireError("pss: wire: frame " + what, header.request_id);
    };
    const std::uint32_t computed =
        detail::frame_checksum(header_bytes, {std::span<const std::byte>(body.descriptor_bytes), detail::as_bytes(body.name),
                                              detail::as_bytes(body.message), std::as_bytes(std::span(body.values)),
                                              std::as_bytes(std::span(body.ids))});
    if (computed != header.checksum)
        fail("checksum " + detail::hex32(header.checksum) + " does not match the computed " + detail::hex32(computed) +
             "; the frame was corrupted");
    body.tensors.resize(header.tensors);
    const std::byte* word = body.descriptor_bytes.data();
    const std::byte* const end = word + body.descriptor_bytes.size();
    // The limit bounds what the decoded tensors hold, not only what the wire carries: a string element
    // takes 8 bytes on the wire but a std::string (32 bytes in libstdc++) once decoded, so counting its
    // wire bytes would let a 1 GiB payload of empty strings become 4 GiB of memory.
    std::uint64_t needed = 0;  // payload bytes of the tensors so far on the wire
    std::uint64_t held = 0;    // bytes the tensors so far hold once decoded, at most the limit
    for (std::size_t i = 0; i < body.tensors.size(); ++i) {
        const std::string which = "tensor " + std::to_string(i) + ": ";
        if (word == end) fail(which + "its descriptor is missing; the descriptor words end early");
        const std::uint64_t d = detail::get_le<8>(word);
        word += 8;
        const auto dtype = static_cast<std::uint8_t>(d & 0xFFu);
        const auto rank = static_cast<std::size_t>((d >> 8) & 0xFFu);
        if (!is_valid_dtype(dtype))
            fail(which + "dtype byte " + std::to_string(dtype) + " is not a dtype; expected 1 (float32) to 5 (string)");
        if (rank > max_wire_rank)
            fail(which + "rank " + std::to_string(rank) + " exceeds the limit " + std::to_string(max_wire_rank));
        if ((d >> 16) != 0) fail(which + "descriptor " + std::to_string(d) + " has bits set above the rank byte");
        if (static_cast<std::size_t>(end - word) < rank * 8)
            fail(which + "its rank " + std::to_string(rank) + " runs past the descriptor words");
        TensorSpec& spec = body.tensors[i];
        spec.dtype = static_cast<DType>(dtype);
        spec.shape.resize(rank);
        for (std::size_t a = 0; a < rank; ++a, word += 8) spec.shape[a] = detail::get_le<8>(word);
        const bool strings = spec.dtype == DType::string;
        const std::size_t element_size = strings ? sizeof(std::string) : dtype_size(spec.dtype);
        const std::int64_t elements =
            detail::bounded_elements(spec.shape, (limits.max_payload_bytes - held) / element_size);
        if (elements < 0)
            fail(which + "shape " + format_shape(spec.shape) + " of " + std::string(dtype_name(spec.dtype)) +
                 " exceeds the payload limit " + std::to_string(limits.max_payload_bytes) + " bytes" +
                 (strings ? " (a string is held in " + std::to_string(sizeof(std::string)) + " bytes beside its characters)"
                          : std::string()));
        held += static_cast<std::uint64_t>(elements) * element_size;
        if (header.compression() != Compression::none && spec.dtype != DType::float32)
            fail(which + "is " + std::string(dtype_name(spec.dtype)) + " but the flags compress it to " +
                 std::string(compression_name(header.compression())) + "; only float32 travels compressed");
        if (!strings) {
            needed += static_cast<std::uint64_t>(elements) * (header.compression() != Compression::none ? 2 : element_size);
            continue;
        }
        if (word == end) fail(which + "its encoded length is missing; the descriptor words end early");
        spec.encoded_bytes = detail::get_le<8>(word);
        word += 8;
        if (header.payload_elided()) continue;  // described, not sent
        const std::uint64_t lengths = static_cast<std::uint64_t>(elements) * 8;
        if (spec.encoded_bytes < lengths)
            fail(which + "encoded length " + std::to_string(spec.encoded_bytes) + " of " + std::to_string(elements) +
                 " strings is below their lengths' " + std::to_string(lengths) + " bytes");
        const std::uint64_t characters = spec.encoded_bytes - lengths;
        if (characters > limits.max_payload_bytes - held)
            fail(which + "encoded length " + std::to_string(spec.encoded_bytes) + " of " + std::to_string(elements) +
                 " strings holds " + std::to_string(characters) + " bytes of characters, more than the " +
                 std::to_string(limits.max_payload_bytes - held) + " the payload limit " +
                 std::to_string(limits.max_payload_bytes) + " leaves them");
        held += characters;
        needed += spec.encoded_bytes;
    }
    if (word != end) fail("descriptor words " + std::to_string(header.descriptor_words) + " are more than the tensors use");
    if (header.kind == static_cast<std::uint8_t>(Op::create) && header.ids_count != 0) {
        // A create without a payload carries its initializer as ids: the ps draws the shard, whose size
        // is held to max_initialized_shard_bytes.
        if (header.tensors != 0) fail("of a create carries a payload and initializer words; it carries one of them");
        if (auto why = detail::decode_shard_initializer(body.ids, limits.max_initialized_shard_bytes).second;
            !why.empty())
            fail("create's initializer " + why);
    }
    if (!header.payload_elided() && header.payload_length != needed) {
        std::string described;
        for (const auto& spec : body.tensors)
            described += (described.empty() ? "" : ", ") + std::string(dtype_name(spec.dtype)) + " " + format_shape(spec.shape);
        fail("payload length " + std::to_string(header.payload_length) + " does not match the tensors' " +
             std::to_string(needed) + " bytes (" + described + ")");
    }
}

inline Tensor payload_buffer(const FrameHeader& header, const FrameBody& body, Tensor reuse) {
    if (!header.has_payload() || header.payload_elided()) return {};
    const TensorSpec& spec = body.payload();
    if (spec.dtype == DType::string)
        return Tensor(detail::EncodedStrings{spec.shape, std::vector<std::byte>(spec.encoded_bytes)});
    if (reuse.has_value() && reuse.dtype() == spec.dtype && reuse.size() == num_elements(spec.shape)) {
        reuse.visit_mut([&](auto& array) { array.resize(spec.shape); });  // same size: the buffer is kept
        return reuse;
    }
    return Tensor::uninitialized(spec.dtype, spec.shape);
}

inline std::vector<Tensor> value_tensors(const FrameHeader& header, const FrameBody& body) {
    std::vector<Tensor> tensors;
    if (!header.has_values()) return tensors;
    tensors.reserve(body.tensors.size());
    for (const auto& spec : body.tensors)
        tensors.push_back(spec.dtype == DType::string
                              ? Tensor(detail::EncodedStrings{spec.shape, std::vector<std::byte>(spec.encoded_bytes)})
                              : Tensor::uninitialized(spec.dtype, spec.shape));
    return tensors;
}

namespace detail {

/// A string tensor's wire form: one u64 length per element, then the elements' bytes.
[[nodiscard]] inline std::size_t encoded_string_bytes(const xt::xarray<std::string>& strings) noexcept {
    std::size_t n = 8 * strings.size();
    for (const auto& s : strings) n += s.size();
    return n;
}

inline std::vector<std::byte> encode_strings(const xt::xarray<std::string>& strings) {
    std::vector<std::byte> out(encoded_string_bytes(strings));
    std::byte* length = out.data();
    std::byte* chars = out.data() + 8 * strings.size();
    for (const auto& s : strings) {
        put_le<8>(length, s.size());
        length += 8;
        if (!s.empty()) std::memcpy(chars, s.data(), s.size());
        chars += s.size();
    }
    return out;
}

inline void decode_strings(Tensor& tensor, std::size_t index, std::optional<std::uint64_t> request_id) {
    EncodedStrings* encoded = tensor.encoded_strings();
    if (encoded == nullptr) return;
    const std::vector<std::byte>& bytes = encoded->bytes;
    const std::size_t n = num_elements(encoded->shape);  // decode_body checked 8 * n <= bytes.size()
    const std::uint64_t chars = bytes.size() - 8 * n;
    std::uint64_t total = 0;
    auto fail = [&](const std::string& what) {
        throw WireError("pss: wire: frame tensor " + std::to_string(index) + ": " + what, request_id);
    };
    for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t length = get_le<8>(bytes.data() + 8 * i);
        if (length > chars - total)
            fail("string " + std::to_string(i) + " has length " + std::to_string(length) + ", more than the " +
                 std::to_string(chars - total) + " left of the " + std::to_string(chars) + " bytes after the lengths");
        total += length;
    }
    if (total != chars)
        fail("its string lengths add up to " + std::to_string(total) + " bytes, but " + std::to_string(chars) +
             " follow them");
    // Allocated only once the lengths hold, so a hostile frame costs no more than its bytes.
    auto strings = xt::xarray<std::string>::from_shape(encoded->shape);
    const char* text = reinterpret_cast<const char*>(bytes.data()) + 8 * n;
    for (std::size_t i = 0; i < n; ++i) {
        const auto length = static_cast<std::size_t>(get_le<8>(bytes.data() + 8 * i));
        strings.data()[i].assign(text, length);
        text += length;
    }
    tensor = Tensor(std::move(strings));
}

}  // namespace detail

inline void decode_wire_tensors(const FrameHeader& header, Tensor& payload, std::vector<Tensor>& tensors) {
    if (header.compression() != Compression::none && payload.has_value() && !header.payload_elided())
        detail::widen_in_place(header.compression(), payload.get<float>().data(), payload.size());
    detail::decode_strings(payload, 0, header.request_id);
    for (std::size_t i = 0; i < tensors.size(); ++i) detail::decode_strings(tensors[i], i, header.request_id);
}

inline std::vector<asio::mutable_buffer> tensor_buffers(std::vector<Tensor>& tensors) {
    std::vector<asio::mutable_buffer> buffers;
    buffers.reserve(tensors.size());
    for (auto& t : tensors) buffers.push_back(asio::buffer(t.bytes(), t.nbytes()));
    return buffers;
}

inline Request to_request(const FrameHeader& header, FrameBody& body, Tensor payload, std::vector<Tensor> tensors) {
    Request request;
    request.kind = header.request_kind();
    if (request.kind == RequestKind::operation) request.op = header.op();
    request.key = header.key;
    request.name = std::move(body.name);
    if (header.kind == static_cast<std::uint8_t>(Op::create) && !body.ids.empty())
        request.initializer = detail::decode_shard_initializer(body.ids, std::numeric_limits<std::uint64_t>::max()).first;
    else
        request.ids = std::move(body.ids);
    request.payload = std::move(payload);
    request.step = header.step;
    request.compression = header.compression();
    request.values = Values{std::move(body.values), std::move(tensors)};
    body.name.clear();
    body.ids.clear();
    body.values.clear();
    return request;
}

inline Reply to_reply(const FrameHeader& header, FrameBody& body, Tensor payload, std::vector<Tensor> tensors) {
    Reply reply{header.code, std::move(body.message), std::move(payload), Values{std::move(body.values), std::move(tensors)},
                header.compression()};
    body.message.clear();
    body.values.clear();
    return reply;
}

inline void OutgoingFrame::describe(const Tensor& t, std::byte*& out) {
    const Shape shape = t.shape();
    if (shape.size() > max_wire_rank)
        throw InvalidArgumentError("pss: wire: a tensor of rank " + std::to_string(shape.size()) +
                                   " cannot be sent; the wire carries rank " + std::to_string(max_wire_rank) + " at most");
    detail::put_le<8>(out, static_cast<std::uint64_t>(t.dtype()) | (std::uint64_t{shape.size()} << 8));
    out += 8;
    for (auto extent : shape) {
        detail::put_le<8>(out, extent);
        out += 8;
    }
    if (t.dtype() == DType::string) {
        detail::put_le<8>(out, detail::encoded_string_bytes(t.get<std::string>()));
        out += 8;
    }
}

inline void OutgoingFrame::build(const Tensor& payload, bool elide, Compression compression, const Values* values,
                                 std::span<const std::byte> name, std::span<const std::byte> message,
                                 std::span<const std::int64_t> ids) {
    FrameHeader& h = header_;
    descriptor_length_ = 0;
    if (values != nullptr) {
        if (values->tensors.size() > std::numeric_limits<std::uint16_t>::max())
            throw InvalidArgumentError("pss: wire: " + std::to_string(values->tensors.size()) +
                                       " tensors cannot be sent in one call; the wire carries 65535 at most");
        h.flags = frame_flag_values;
        std::size_t words = 0, bytes = 0;
        for (const Tensor& t : values->tensors) {
            if (!t.has_value()) throw InvalidArgumentError("pss: wire: a call's values hold an empty tensor");
            words += 1 + t.shape().size();
            if (t.dtype() == DType::string) {
                encoded_.push_back(detail::encode_strings(t.get<std::string>()));
                bytes += encoded_.back().size();
                ++words;
            } else {
                bytes += t.nbytes();
            }
        }
        if (words > std::numeric_limits<std::uint16_t>::max())
            throw InvalidArgumentError("pss: wire: a call's tensors need " + std::to_string(words) +
                                       " descriptor words; the wire carries 65535 at most");
        if (values->cbor.size() > std::numeric_limits<std::uint32_t>::max())
            throw InvalidArgumentError("pss: wire: a call's values are " + std::to_string(values->cbor.size()) +
                                       " bytes of CBOR; the wire carries 4 GiB at most");
        many_descriptors_.resize(8 * words);
        std::byte* out = many_descriptors_.data();
        for (const Tensor& t : values->tensors) describe(t, out);
        h.tensors = static_cast<std::uint16_t>(values->tensors.size());
        h.descriptor_words = static_cast<std::uint16_t>(words);
        h.payload_length = bytes;
        h.values_length = static_cast<std::uint32_t>(values->cbor.size());
        values_ = std::as_bytes(std::span(values->cbor));
        many_ = &values->tensors;
        payload_length_ = bytes;
    } else if (payload.has_value()) {
        std::byte* out = one_descriptor_.data();
        describe(payload, out);
        descriptor_length_ = static_cast<std::size_t>(out - one_descriptor_.data());
        h.flags = elide ? frame_flag_payload_elided : std::uint8_t{0};
        h.tensors = 1;
        h.descriptor_words = static_cast<std::uint16_t>(descriptor_length_ / 8);
        if (payload.dtype() == DType::string && !elide) encoded_.push_back(detail::encode_strings(payload.get<std::string>()));
        if (payload.dtype() != DType::float32) compression = Compression::none;  // only float32 is compressed
        if (compression != Compression::none && !elide) {
            // Not zero-filled first: every byte is written (a 16 MB push zeroed 8 MB that narrow overwrote).
            narrowed_ = std::make_shared_for_overwrite<std::byte[]>(2 * payload.size());
            detail::narrow(compression, payload.get<float>().data(), reinterpret_cast<std::uint16_t*>(narrowed_.get()),
                           payload.size());
        }
        h.payload_length = elide ? 0 : narrowed_ ? 2 * payload.size() : encoded_.empty() ? payload.nbytes() : encoded_.front().size();
        payload_ = narrowed_ ? narrowed_.get() : payload.bytes();
        payload_length_ = static_cast<std::size_t>(h.payload_length);
    }
    if (values == nullptr && compression != Compression::none)
        h.flags |= compression == Compression::bfloat16 ? frame_flag_bfloat16 : frame_flag_float16;
    h.name_length = static_cast<std::uint32_t>(name.size());
    h.message_length = static_cast<std::uint32_t>(message.size());
    h.ids_count = ids.size();
    const auto id_bytes = std::as_bytes(ids);
    header_bytes_ = encode_header(h);
    const asio::const_buffer d = descriptors();
    h.checksum = detail::frame_checksum(
        header_bytes_, {std::span<const std::byte>(static_cast<const std::byte*>(d.data()), d.size()), name, message,
                        values_, id_bytes});
    detail::put_le<4>(header_bytes_.data() + frame_header_size - 4, h.checksum);
    name_ = name;
    message_ = message;
    ids_ = id_bytes;
}

inline OutgoingFrame OutgoingFrame::request(const Request& request, std::uint64_t id, std::uint32_t task,
                                            bool elide_payload) {
    OutgoingFrame frame;
    switch (request.kind) {
        case RequestKind::operation: frame.header_.kind = static_cast<std::uint8_t>(request.op); break;
        case RequestKind::call: frame.header_.kind = frame_kind_call; break;
        case RequestKind::shutdown: frame.header_.kind = frame_kind_shutdown; break;
        case RequestKind::heartbeat: frame.header_.kind = frame_kind_heartbeat; break;
    }
    frame.header_.request_id = id;
    frame.header_.task = task;
    frame.header_.key = request.key;
    frame.header_.step = request.step;
    const bool call = request.kind == RequestKind::call;
    if (request.kind == RequestKind::operation && request.op == Op::create && request.initializer)
        frame.initializer_words_ = detail::encode_shard_initializer(*request.initializer);
    frame.build(request.payload, elide_payload, request.compression, call ? &request.values : nullptr, detail::as_bytes(request.name), {},
                frame.initializer_words_.empty() ? std::span<const std::int64_t>(request.ids)
                                                 : std::span<const std::int64_t>(frame.initializer_words_));
    return frame;
}

inline OutgoingFrame OutgoingFrame::reply(const Reply& reply, std::uint64_t id, std::uint32_t task,
                                          bool elide_payload) {
    OutgoingFrame frame;
    frame.header_.kind = frame_kind_reply;
    frame.header_.code = reply.code;
    frame.header_.request_id = id;
    frame.header_.task = task;
    const bool values = !reply.values.cbor.empty() || !reply.values.tensors.empty();
    frame.build(reply.payload, elide_payload, reply.compression, values ? &reply.values : nullptr, {},
                detail::as_bytes(reply.message), {});
    return frame;
}

inline DecodedFrame decode_frame(std::span<const std::byte> bytes, const WireLimits& limits) {
    auto truncated = [&](const char* part, std::uint64_t needed, std::optional<std::uint64_t> id) -> void {
        throw WireError("pss: wire: frame is truncated: " + std::to_string(bytes.size()) + " bytes, the " + part +
                            " " + std::to_string(needed),
                        id);
    };
    if (bytes.size() < frame_header_size) truncated("header needs", frame_header_size, std::nullopt);
    DecodedFrame frame;
    const auto header_bytes = bytes.first<frame_header_size>();
    frame.header = decode_header(header_bytes, limits);
    const FrameHeader& h = frame.header;
    const std::uint64_t body_end = frame_header_size + h.body_length();  // no overflow: every length is bounded
    if (bytes.size() < body_end) truncated("header and sections need", body_end, h.request_id);
    std::size_t offset = frame_header_size;
    for (const auto& buffer : body_buffers(h, frame.body)) {
        if (buffer.size() > 0) std::memcpy(buffer.data(), bytes.data() + offset, buffer.size());
        offset += buffer.size();
    }
    decode_body(header_bytes, h, frame.body, limits);
    const std::uint64_t end = body_end + h.payload_length;
    if (bytes.size() < end) truncated("frame needs", end, h.request_id);
    frame.payload = payload_buffer(h, frame.body);
    frame.tensors = value_tensors(h, frame.body);
    std::vector<asio::mutable_buffer> into = tensor_buffers(frame.tensors);
    if (frame.payload.has_value()) into.push_back(asio::buffer(frame.payload.bytes(), static_cast<std::size_t>(h.payload_length)));
    asio::buffer_copy(into, asio::buffer(bytes.data() + body_end, static_cast<std::size_t>(h.payload_length)));
    decode_wire_tensors(h, frame.payload, frame.tensors);
    frame.size = static_cast<std::size_t>(end);
    return frame;
}

PSS_NAMESPACE_END
