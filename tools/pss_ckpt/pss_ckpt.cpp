// tools/pss_ckpt/pss_ckpt.cpp: pss-ckpt, which inspects a pss checkpoint (TensorFlow's inspect_checkpoint).
//
// pss-ckpt list DIR                                 the variables: name, shape, dtype, shards, slots, step
// pss-ckpt show DIR VARIABLE [--rows A:B] [--slot S] one variable's values (or a slot's), one row a line
// pss-ckpt verify DIR                               every file's size, header and checksums
//
// DIR is a checkpoint (it holds index.json) or a CheckpointManager's directory (it holds `latest`: the
// newest checkpoint is used). Exit status: 0, 1 when a check fails or the checkpoint cannot be read, 2 for
// a usage error.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <pss/detail/checkpoint_format.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/tensor.hpp>

namespace {

constexpr const char* usage =
    "usage: pss-ckpt list DIR\n"
    "       pss-ckpt show DIR VARIABLE [--rows A:B] [--slot SLOT]\n"
    "       pss-ckpt verify DIR\n"
    "DIR: a checkpoint directory (with index.json) or a CheckpointManager's directory (with `latest`)\n";

/// The checkpoint DIR means: itself, or the one its `latest` record names.
std::string checkpoint_of(const std::string& dir) {
    if (::access((dir + "/index.json").c_str(), F_OK) == 0) return dir;
    if (::access((dir + "/latest").c_str(), F_OK) == 0) {
        const auto j = nlohmann::json::parse(pss::detail::read_small_file(dir + "/latest"));
        return dir + "/" + j.at("latest").get<std::string>();
    }
    throw pss::NotFoundError("pss-ckpt: " + dir + " holds neither index.json (a checkpoint) nor latest (a CheckpointManager's directory)");
}

std::string join(const std::vector<std::string>& parts, const char* sep = ", ") {
    std::string out;
    for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
    return out;
}

int list(const std::string& dir) {
    const auto index = pss::detail::read_index(dir);
    std::cout << "checkpoint: " << dir << "\n"
              << "format_version: " << index.format_version << "\n"
              << "step: " << index.step << "\n"
              << "optimizer: " << index.optimizer.value("name", std::string("?")) << " "
              << index.optimizer.value("config", nlohmann::json::object()).dump() << "\n"
              << "slots: " << (index.slot_names().empty() ? std::string("none") : join(index.slot_names())) << "\n"
              << "partitioner: " << index.partitioner.dump() << "\n"
              << "variables: " << index.variables.size() << "\n";
    for (const auto& v : index.variables) {
        std::vector<std::string> rows, slots, counters;
        for (const auto& s : v.shards) rows.push_back(std::to_string(s.shape.empty() ? 1 : s.shape[0]));
        for (const auto& [name, record] : v.shards.front().slots) slots.push_back(name);
        for (const auto& [name, value] : v.shards.front().counters) {
            std::vector<std::string> each;
            for (const auto& s : v.shards) each.push_back(std::to_string(s.counters.count(name) ? s.counters.at(name) : -1));
            counters.push_back(name + " " + join(each, ","));
        }
        std::cout << v.name << ": shape " << pss::format_shape(v.shape) << " dtype " << pss::dtype_name(v.dtype)
                  << " shards " << v.shards.size() << " (rows " << join(rows) << ") slots "
                  << (slots.empty() ? std::string("none") : join(slots));
        if (!counters.empty()) std::cout << " counters " << join(counters, "; ");
        std::cout << "\n";
    }
    return 0;
}

/// One element as numpy's repr would round-trip it: 9 significant digits for float32, 17 for float64.
void print_element(const std::byte* p, pss::DType dtype) {
    char buffer[64];
    switch (dtype) {
        case pss::DType::float32: {
            float x;
            std::memcpy(&x, p, sizeof x);
            std::snprintf(buffer, sizeof buffer, "%.9g", static_cast<double>(x));
            break;
        }
        case pss::DType::float64: {
            double x;
            std::memcpy(&x, p, sizeof x);
            std::snprintf(buffer, sizeof buffer, "%.17g", x);
            break;
        }
        case pss::DType::int32: {
            std::int32_t x;
            std::memcpy(&x, p, sizeof x);
            std::snprintf(buffer, sizeof buffer, "%" PRId32, x);
            break;
        }
        case pss::DType::int64: {
            std::int64_t x;
            std::memcpy(&x, p, sizeof x);
            std::snprintf(buffer, sizeof buffer, "%" PRId64, x);
            break;
        }
        case pss::DType::string: {  // p points at a std::string element
            std::string text;
            pss::detail::format_element(text, *reinterpret_cast<const std::string*>(p));
            std::cout << text;
            return;
        }
    }
    std::cout << buffer;
}

int show(const std::string& dir, const std::string& name, const std::string& rows_arg, const std::string& slot) {
    const auto index = pss::detail::read_index(dir);
    const auto* v = index.find(name);
    if (v == nullptr) {
        std::vector<std::string> names;
        for (const auto& s : index.variables) names.push_back(s.name);
        std::cerr << "pss-ckpt: " << dir << " has no variable '" << name << "'; it has: " << join(names) << "\n";
        return 1;
    }
    const std::size_t dim0 = v->shape.empty() ? 1 : v->shape[0];
    std::size_t begin = 0, end = dim0;
    if (!rows_arg.empty()) {
        const auto colon = rows_arg.find(':');
        try {
            if (colon == std::string::npos) throw std::invalid_argument("no colon");
            if (colon > 0) begin = std::stoull(rows_arg.substr(0, colon));
            if (colon + 1 < rows_arg.size()) end = std::stoull(rows_arg.substr(colon + 1));
        } catch (const std::exception&) {
            std::cerr << "pss-ckpt: --rows takes A:B (rows A to B-1), got '" << rows_arg << "'\n";
            return 2;
        }
        if (v->shape.empty() || begin > end || end > dim0) {
            std::cerr << "pss-ckpt: --rows " << rows_arg << " is outside the rows [0, " << dim0 << ") of '" << name << "' of shape "
                      << pss::format_shape(v->shape) << "\n";
            return 2;
        }
    }
    pss::Shape shape = v->shape;
    if (!shape.empty()) shape[0] = end - begin;
    pss::Tensor t = pss::Tensor::uninitialized(v->dtype, shape);
    const bool strings = v->dtype == pss::DType::string;
    auto* elements = strings ? reinterpret_cast<std::byte*>(t.get<std::string>().data()) : t.bytes();
    pss::detail::read_saved_rows(dir, *v, slot, begin, end, elements);
    std::cout << name << (slot.empty() ? "" : ":" + slot) << " rows " << begin << ":" << end << " shape "
              << pss::format_shape(shape) << " dtype " << pss::dtype_name(v->dtype) << "\n";
    const std::size_t width = pss::detail::row_elements(v->shape);
    const std::size_t size = strings ? sizeof(std::string) : pss::dtype_size(v->dtype);
    const std::size_t lines = v->shape.empty() ? 1 : end - begin;
    for (std::size_t r = 0; r < lines; ++r) {
        for (std::size_t c = 0; c < width; ++c) {
            if (c > 0) std::cout << " ";
            print_element(elements + (r * width + c) * size, v->dtype);
        }
        std::cout << "\n";
    }
    return 0;
}

/// Checks one file: its size, its whole CRC-32, its header, and every chunk's checksum.
void verify_file(const std::string& dir, const pss::detail::FileRecord& record, pss::DType dtype, const pss::Shape& shape) {
    const std::string path = dir + "/" + record.file;
    pss::detail::FileHandle f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.get() < 0) pss::detail::throw_file_error("opening", path, errno);
    std::vector<char> buffer(1 << 20);
    std::uint32_t crc = 0;
    std::uint64_t bytes = 0;
    for (;;) {
        const ::ssize_t r = ::read(f.get(), buffer.data(), buffer.size());
        if (r < 0) pss::detail::throw_file_error("reading", path, errno);
        if (r == 0) break;
        crc = pss::detail::crc32(crc, buffer.data(), static_cast<std::size_t>(r));
        bytes += static_cast<std::uint64_t>(r);
    }
    if (bytes != record.bytes)
        throw pss::InvalidArgumentError(path + " has " + std::to_string(bytes) + " bytes where the index says " +
                                        std::to_string(record.bytes));
    if (crc != record.crc32) {
        char text[96];
        std::snprintf(text, sizeof text, "CRC-32 is %08x where the index says %08x", crc, record.crc32);
        throw pss::InvalidArgumentError(path + ": " + text);
    }
    // Header and chunk checksums, as a restore checks them, one row range at a time.
    const std::size_t rows = shape.empty() ? 1 : shape[0];
    const bool strings = dtype == pss::DType::string;
    const std::size_t row_elements = pss::detail::row_elements(shape);
    const std::size_t row_bytes = row_elements * (strings ? sizeof(std::string) : pss::dtype_size(dtype));
    const std::size_t step = std::max<std::size_t>(1, (std::size_t{64} << 20) / std::max<std::size_t>(1, row_bytes));
    std::vector<char> rows_buffer;
    std::vector<std::string> rows_strings;
    for (std::size_t at = 0; at < rows || at == 0; at += step) {
        const std::size_t n = std::min(step, rows - at);
        void* into = nullptr;
        if (strings) {
            rows_strings.assign(n * row_elements, std::string());
            into = rows_strings.data();
        } else {
            rows_buffer.resize(n * row_bytes);
            into = rows_buffer.data();
        }
        pss::detail::read_npy_rows(dir, record, dtype, shape, at, at + n, into);
        if (rows == 0) break;
    }
}

int verify(const std::string& dir) {
    const auto index = pss::detail::read_index(dir);
    std::size_t files = 0, failed = 0;
    std::uint64_t bytes = 0;
    auto check = [&](const pss::detail::FileRecord& record, pss::DType dtype, const pss::Shape& shape) {
        ++files;
        try {
            verify_file(dir, record, dtype, shape);
            bytes += record.bytes;
            std::printf("ok %s %" PRIu64 " bytes crc32 %08x\n", record.file.c_str(), record.bytes, record.crc32);
        } catch (const std::exception& e) {
            ++failed;
            std::printf("FAILED %s: %s\n", record.file.c_str(), e.what());
        }
    };
    for (const auto& v : index.variables)
        for (const auto& s : v.shards) {
            check(s.value, v.dtype, s.shape);
            for (const auto& [name, record] : s.slots) check(record, v.dtype, s.shape);
        }
    if (failed > 0) {
        std::printf("%zu of %zu files FAILED verification\n", failed, files);
        return 1;
    }
    std::printf("verified %zu files, %" PRIu64 " bytes: every size, header and checksum matches the index\n", files, bytes);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() < 2 || args[0] == "--help" || args[0] == "-h") {
        std::cerr << usage;
        return args.empty() || args[0] == "--help" || args[0] == "-h" ? (args.empty() ? 2 : 0) : 2;
    }
    try {
        const std::string& command = args[0];
        const std::string dir = checkpoint_of(args[1]);
        if (command == "list" && args.size() == 2) return list(dir);
        if (command == "verify" && args.size() == 2) return verify(dir);
        if (command == "show" && args.size() >= 3) {
            std::string rows, slot;
            for (std::size_t i = 3; i < args.size(); ++i) {
                if (args[i] == "--rows" && i + 1 < args.size())
                    rows = args[++i];
                else if (args[i] == "--slot" && i + 1 < args.size())
                    slot = args[++i];
                else {
                    std::cerr << "pss-ckpt: unknown argument '" << args[i] << "'\n" << usage;
                    return 2;
                }
            }
            return show(dir, args[2], rows, slot);
        }
        std::cerr << usage;
        return 2;
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
