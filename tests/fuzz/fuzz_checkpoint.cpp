// tests/fuzz/fuzz_checkpoint.cpp: libFuzzer target for what a ps task (restore_shard) and pss-ckpt read from a
// checkpoint directory: the index (detail::index_from_json) and the .npy files it names (detail::read_saved_rows:
// the record's sizes and chunks, the .npy header, the rows): any bytes, never a crash.
//
// An input is the index's text, a zero byte, then the bytes of every file the index names. The harness
// writes those files into a fresh directory and, so that the fuzzer gets past the checksums to the header
// and the rows, recomputes each record's size and checksums from the bytes (when the record's header and
// chunk sizes fit them). It then reads every variable whole, value and slots, and the rows [begin, end) of
// the index's metadata, as a ps reads the rows it owns. A read either succeeds or throws a pss::Error.
// Built and run by tools/fuzz.sh; built with -DPSS_FUZZ_WRITE_SEEDS, it writes the seed corpus
// (tests/fuzz/corpus_checkpoint/) from checkpoints the library writes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <pss/detail/checkpoint_format.hpp>

namespace {

void require(bool condition) {
    if (!condition) std::abort();
}

/// A directory of this process's own, on tmpfs when there is one, emptied for each input.
const std::string& scratch() {
    static const std::string dir = [] {
        std::string pattern = (::access("/dev/shm", W_OK) == 0 ? std::string("/dev/shm") : std::string("/tmp")) +
                               "/pss_fuzz_checkpoint_XXXXXX";
        require(::mkdtemp(pattern.data()) != nullptr);
        return pattern;
    }();
    return dir;
}

/// The record made true of `bytes`, when its header and chunk sizes fit them (else left to be refused).
void fit_record(pss::detail::FileRecord& r, std::string_view bytes) {
    r.bytes = bytes.size();
    if (r.header_bytes > bytes.size() || r.chunk_bytes == 0) return;
    const std::uint64_t data = bytes.size() - r.header_bytes;
    const std::uint64_t chunks = (data + r.chunk_bytes - 1) / r.chunk_bytes;
    if (chunks > 4096) return;
    r.chunk_crc32 = {pss::detail::crc32(0, bytes.data(), r.header_bytes)};
    for (std::uint64_t c = 0; c < chunks; ++c) {
        const std::uint64_t at = r.header_bytes + c * r.chunk_bytes;
        r.chunk_crc32.push_back(pss::detail::crc32(0, bytes.data() + at, std::min(r.chunk_bytes, bytes.size() - at)));
    }
}

/// Bytes of rows [begin, end) of `v` (a scalar: its one element), or none beyond the harness's 16 MiB.
std::optional<std::size_t> rows_bytes(const pss::detail::SavedVariable& v, std::size_t begin, std::size_t end) {
    pss::Shape rows = v.shape;
    if (!rows.empty()) rows[0] = end - begin;
    const std::size_t element = pss::dtype_size(v.dtype);
    const std::int64_t n = pss::detail::bounded_elements(rows, (std::size_t{16} << 20) / element);
    if (n < 0) return std::nullopt;
    return static_cast<std::size_t>(n) * element;
}

void read(const std::string& dir, const pss::detail::SavedVariable& v, const std::string& slot, std::size_t begin,
          std::size_t end) {
    const auto n = rows_bytes(v, begin, end);
    if (!n) return;
    std::vector<char> out(*n + 1);
    try {
        pss::detail::read_saved_rows(dir, v, slot, begin, end, out.data());
    } catch (const pss::Error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    const auto zero = input.find('\0');
    if (zero == std::string_view::npos) return 0;
    const std::string_view file = input.substr(zero + 1);
    pss::detail::CheckpointIndex index;
    try {
        index = pss::detail::index_from_json(std::string(input.substr(0, zero)), "fuzz/index.json");
    } catch (const pss::InvalidArgumentError&) {
        return 0;
    }
    const std::string& dir = scratch();
    std::vector<std::string> written;
    auto place = [&](pss::detail::FileRecord& r) {
        fit_record(r, file);
        const std::string path = dir + "/" + r.file;  // a plain name: index_from_json refused any other
        require(r.file.find('/') == std::string::npos);
        for (const auto& w : written)
            if (w == path) return;
        std::ofstream(path, std::ios::binary | std::ios::trunc).write(file.data(), static_cast<std::streamsize>(file.size()));
        written.push_back(path);
    };
    for (auto& v : index.variables)
        for (auto& s : v.shards) {
            place(s.value);
            for (auto& [slot, record] : s.slots) place(record);
        }
    auto metadata_row = [&](const char* key) -> std::int64_t {
        if (!index.metadata.is_object() || !index.metadata.contains(key)) return 0;
        try {
            return pss::detail::json_integer<std::int64_t>(index.metadata.at(key), key);
        } catch (const std::invalid_argument&) {
            return -1;
        }
    };
    const std::int64_t begin = metadata_row("begin"), end = metadata_row("end");
    for (const auto& v : index.variables) {
        const std::size_t rows = v.shape.empty() ? 1 : v.shape[0];
        for (const auto& slot : [&] {
                 std::vector<std::string> parts{""};
                 for (const auto& [name, record] : v.shards.front().slots) parts.push_back(name);
                 return parts;
             }()) {
            read(dir, v, slot, 0, rows);
            if (begin >= 0 && begin <= end && static_cast<std::uint64_t>(end) <= rows)
                read(dir, v, slot, static_cast<std::size_t>(begin), static_cast<std::size_t>(end));
        }
    }
    for (const auto& w : written) ::unlink(w.c_str());
    return 0;
}

#ifdef PSS_FUZZ_WRITE_SEEDS
#include <iostream>
#include <iterator>

#include <nlohmann/json.hpp>

int main(int argc, char** argv) {
    const std::string out_dir = argc > 1 ? argv[1] : "tests/fuzz/corpus_checkpoint";
    const std::string& dir = scratch();
    auto seed = [&](const std::string& name, pss::DType dtype, const pss::Shape& shape, std::size_t shards,
                    bool slot, std::int64_t begin, std::int64_t end) {
        // One file of `shape` written by the library; the index names it for every shard and slot, each
        // shard a slice of the rows: the file's header says the shard's shape only when there is one shard,
        // which the fuzzer can then vary from.
        std::vector<char> bytes(pss::detail::row_elements(shape) * (shape.empty() ? 1 : shape[0]) * pss::dtype_size(dtype));
        for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 37 + 11);
        const std::string path = dir + "/" + name + ".npy";
        ::unlink(path.c_str());
        const auto record = pss::detail::write_npy(path, dtype, shape, bytes.data(), bytes.size());
        pss::detail::CheckpointIndex index;
        index.step = 3;
        index.optimizer = {{"name", "Adam"}};
        index.partitioner = {{"name", "fixed"}};
        index.metadata = {{"begin", begin}, {"end", end}};
        pss::detail::SavedVariable v{"var/" + name, shape, dtype, {}};
        const std::size_t rows = shape.empty() ? 0 : shape[0];
        for (std::size_t k = 0, at = 0; k < shards; ++k) {
            pss::detail::SavedShard s;
            s.row_offset = at;
            s.shape = shape;
            if (!shape.empty()) s.shape[0] = rows / shards + (k < rows % shards ? 1 : 0);
            at += shape.empty() ? 0 : s.shape[0];
            s.value = record;
            if (slot) s.slots["velocity"] = record;
            s.counters["iterations"] = 3;
            v.shards.push_back(std::move(s));
        }
        index.variables.push_back(std::move(v));
        std::string text = pss::detail::index_to_json(index).dump();
        text.push_back('\0');
        std::ifstream in(path, std::ios::binary);
        text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        std::ofstream(out_dir + "/" + name, std::ios::binary) << text;
        std::cout << out_dir << "/" << name << ": " << text.size() << " bytes\n";
        ::unlink(path.c_str());
    };
    seed("float32_rows", pss::DType::float32, {6, 3}, 1, true, 2, 5);
    seed("float64_two_shards", pss::DType::float64, {4, 2}, 2, false, 1, 3);
    seed("int32_vector", pss::DType::int32, {10}, 1, false, 0, 10);
    seed("int64_scalar", pss::DType::int64, {}, 1, false, 0, 0);
    seed("float32_empty_rows", pss::DType::float32, {0, 4}, 1, true, 0, 0);
    return 0;
}
#endif
