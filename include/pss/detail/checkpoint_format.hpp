// pss/detail/checkpoint_format.hpp: a checkpoint's files: CRC-32, .npy files written with their checksums and
// read back by rows, the JSON index, and the fsync'd renames; shared by the ps (its shards), the chief
// (the index) and pss-ckpt.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <xtensor/xnpy.hpp>

#include <pss/config.hpp>
#include <pss/detail/json_text.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

static_assert(std::endian::native == std::endian::little,
              "pss: checkpoints write little-endian .npy files straight from memory; a big-endian host is not supported");

// ---- CRC-32 ------------------------------------------------------------------------------------------

/// Slicing-by-8 tables of zlib's CRC-32 (reflected polynomial 0xEDB88320), so that Python's
/// `zlib.crc32(open(f, "rb").read())` gives the checksums of the index. None of pss's dependencies has one.
inline constexpr std::array<std::array<std::uint32_t, 256>, 8> crc32_tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[0][i] = c;
    }
    for (std::size_t s = 1; s < 8; ++s)
        for (std::size_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
    return t;
}();

/// zlib's CRC-32 by the tables (any host): the CRC-32 of what `crc` covered followed by `n` bytes.
[[nodiscard]] inline std::uint32_t crc32_by_table(std::uint32_t crc, const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    const auto& t = crc32_tables;
    std::uint32_t c = ~crc;
    while (n >= 8) {
        std::uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) c = t[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(PSS_NO_CRC32_PCLMUL)
#define PSS_CRC32_PCLMUL 1
/// x.hi * k.hi ^ x.lo * k.lo ^ next, carry-less: one folding step of a 128-bit lane by the distance `k` encodes.
__attribute__((target("pclmul,sse4.1"))) inline __m128i crc32_fold_step(__m128i x, __m128i k, __m128i next) noexcept {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x11), _mm_clmulepi64_si128(x, k, 0x00)), next);
}

__attribute__((target("pclmul,sse4.1"))) inline __m128i crc32_load(const void* at) noexcept {
    return _mm_loadu_si128(static_cast<const __m128i*>(at));
}

/// The CRC register (not inverted) after `n` bytes (n >= 64, a multiple of 16) by carry-less multiplication:
/// four 128-bit lanes folded 64 bytes at a time, then into one, then Barrett-reduced (Intel's "Fast CRC
/// Computation for Generic Polynomials Using PCLMULQDQ", with the constants of zlib's crc32_simd.c in
/// Chromium). 4x the tables: saving a checkpoint was bounded by its checksums.
__attribute__((target("pclmul,sse4.1"))) inline std::uint32_t crc32_fold_pclmul(const unsigned char* p, std::size_t n,
                                                                                std::uint32_t reg) noexcept {
    alignas(16) static constexpr std::uint64_t k1k2[2] = {0x0154442bd4, 0x01c6e41596};
    alignas(16) static constexpr std::uint64_t k3k4[2] = {0x01751997d0, 0x00ccaa009e};
    alignas(16) static constexpr std::uint64_t k5k0[2] = {0x0163cd6124, 0x0000000000};
    alignas(16) static constexpr std::uint64_t poly[2] = {0x01db710641, 0x01f7011641};
    __m128i x1 = _mm_xor_si128(crc32_load(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
    __m128i x2 = crc32_load(p + 16), x3 = crc32_load(p + 32), x4 = crc32_load(p + 48);
    p += 64;
    n -= 64;
    __m128i k = crc32_load(k1k2);
    for (; n >= 64; p += 64, n -= 64) {
        x1 = crc32_fold_step(x1, k, crc32_load(p));
        x2 = crc32_fold_step(x2, k, crc32_load(p + 16));
        x3 = crc32_fold_step(x3, k, crc32_load(p + 32));
        x4 = crc32_fold_step(x4, k, crc32_load(p + 48));
    }
    k = crc32_load(k3k4);
    x1 = crc32_fold_step(crc32_fold_step(crc32_fold_step(x1, k, x2), k, x3), k, x4);
    for (; n >= 16; p += 16, n -= 16) x1 = crc32_fold_step(x1, k, crc32_load(p));
    // 128 bits to 64, then to 32 (Barrett reduction).
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(x1, k, 0x10));
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), crc32_load(k5k0), 0x00), _mm_srli_si128(x1, 4));
    const __m128i mu = crc32_load(poly);
    const __m128i q = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), mu, 0x10), low32);
    x1 = _mm_xor_si128(x1, _mm_clmulepi64_si128(q, mu, 0x00));
    return static_cast<std::uint32_t>(_mm_extract_epi32(x1, 1));
}

/// True when this CPU has PCLMULQDQ and SSE4.1 (asked once).
[[nodiscard]] inline bool cpu_has_pclmul() noexcept {
    static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    return has;
}
#endif

/// @brief zlib's `crc32(crc, data, n)`: the CRC-32 of what `crc` covered followed by `n` bytes at `data`
/// (start with 0). By carry-less multiplication where the CPU has it (x86-64 since 2010), else by tables.
[[nodiscard]] inline std::uint32_t crc32(std::uint32_t crc, const void* data, std::size_t n) noexcept {
#ifdef PSS_CRC32_PCLMUL
    if (n >= 64 && cpu_has_pclmul()) {
        const auto* p = static_cast<const unsigned char*>(data);
        const std::size_t bulk = n & ~std::size_t{15};
        crc = ~crc32_fold_pclmul(p, bulk, ~crc);
        return crc32_by_table(crc, p + bulk, n - bulk);
    }
#endif
    return crc32_by_table(crc, data, n);
}

// ---- files ---------------------------------------------------------------------------------------------

/// For tests of crash safety: when set, called at every point of a save where a crash leaves a
/// different state on disk ("file created", "file written", "index written", "committed", ...). A
/// test's hook kills the process at the k-th call. Null in normal use.
inline void (*checkpoint_save_point_hook)(const char* point) = nullptr;

inline void checkpoint_save_point(const char* point) {
    if (auto hook = checkpoint_save_point_hook) hook(point);
}

/// "No space left on device" for errno `e`.
[[nodiscard]] inline std::string errno_text(int e) { return std::strerror(e); }

/// An open file descriptor, closed on destruction.
class FileHandle {
public:
    FileHandle() = default;
    explicit FileHandle(int fd) noexcept : fd_(fd) {}
    FileHandle(FileHandle&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    FileHandle& operator=(FileHandle&& o) noexcept {
        if (this != &o) {
            reset();
            fd_ = std::exchange(o.fd_, -1);
        }
        return *this;
    }
    ~FileHandle() { reset(); }
    [[nodiscard]] int get() const noexcept { return fd_; }
    /// Closes and reports close's error (a write-back failure can surface only here).
    int close() noexcept {
        const int fd = std::exchange(fd_, -1);
        return fd < 0 ? 0 : ::close(fd);
    }

private:
    void reset() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    int fd_ = -1;
};

/// Throws the error of a failed file operation: NotFoundError for a missing file, else
/// FailedPreconditionError (a read-only directory, a full disk), naming the path and errno's text.
[[noreturn]] inline void throw_file_error(std::string_view doing, const std::string& path, int e) {
    const std::string text = "pss: checkpoint: " + std::string(doing) + " " + path + ": " + errno_text(e);
    if (e == ENOENT) throw NotFoundError(text);
    if (e == EEXIST) throw AlreadyExistsError(text);
    throw FailedPreconditionError(text);
}

/// Writes `n` bytes at `data` to `fd`, whole (a short write and EINTR are continued).
inline void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
        const ::ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
        if (w < 0) {
            if (errno == EINTR) continue;
            throw_file_error("writing", path, errno);
        }
        p += w;
        n -= static_cast<std::size_t>(w);
    }
}

/// Reads `n` bytes at `offset` of `fd` into `out`; fewer bytes than asked is an error naming the file.
inline void pread_all(int fd, void* out, std::size_t n, std::uint64_t offset, const std::string& path) {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
        const ::ssize_t r = ::pread(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30), static_cast<::off_t>(offset));
        if (r < 0) {
            if (errno == EINTR) continue;
            throw_file_error("reading", path, errno);
        }
        if (r == 0)
            throw InvalidArgumentError("pss: checkpoint: " + path + " is truncated: it ends at byte " +
                                       std::to_string(offset) + " where " + std::to_string(n) + " more bytes were expected");
        p += r;
        n -= static_cast<std::size_t>(r);
        offset += static_cast<std::uint64_t>(r);
    }
}

/// fsyncs a directory, so that the names created or renamed in it last.
inline void fsync_directory(const std::string& path) {
    FileHandle dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.get() < 0) throw_file_error("opening directory", path, errno);
    if (::fsync(dir.get()) != 0) throw_file_error("fsync of directory", path, errno);
}

/// The whole content of a small file (an index, the latest record).
[[nodiscard]] inline std::string read_small_file(const std::string& path) {
    FileHandle f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.get() < 0) throw_file_error("opening", path, errno);
    std::string out;
    char buffer[65536];
    for (;;) {
        const ::ssize_t r = ::read(f.get(), buffer, sizeof buffer);
        if (r < 0) {
            if (errno == EINTR) continue;
            throw_file_error("reading", path, errno);
        }
        if (r == 0) break;
        out.append(buffer, static_cast<std::size_t>(r));
    }
    return out;
}

/// Writes `content` to `path` (a new file), fsyncs and closes it.
inline void write_small_file(const std::string& path, std::string_view content) {
    FileHandle f(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (f.get() < 0) throw_file_error("creating", path, errno);
    write_all(f.get(), content.data(), content.size(), path);
    if (::fsync(f.get()) != 0) throw_file_error("fsync of", path, errno);
    if (f.close() != 0) throw_file_error("closing", path, errno);
}

/// Renames `from` to `to` (replacing `to` when it is a file), atomically.
inline void rename_path(const std::string& from, const std::string& to) {
    if (::rename(from.c_str(), to.c_str()) != 0) throw_file_error("renaming " + from + " to", to, errno);
}

/// The directory part of a path ("." when it has none).
[[nodiscard]] inline std::string parent_directory(const std::string& path) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const auto slash = p.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : p.substr(0, slash);
}

/// The last component of a path.
[[nodiscard]] inline std::string base_name(const std::string& path) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const auto slash = p.find_last_of('/');
    return slash == std::string::npos ? p : p.substr(slash + 1);
}

/// What marks a directory that a save is still writing: `<checkpoint>.tmp-<pid>-<counter>-<random>`.
inline constexpr std::string_view temporary_marker = ".tmp-";

/// True for a name that stays in its directory: not empty, no '/', not "." or "..".
[[nodiscard]] inline bool is_plain_file_name(std::string_view name) noexcept {
    return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
           name.find('\0') == std::string_view::npos;
}

/// True for an absolute path with no "." or ".." component and no empty one: what the coordinator
/// sends (`absolute_path`), and a path whose meaning does not depend on the ps's working directory.
[[nodiscard]] inline bool is_normal_absolute_path(std::string_view path) noexcept {
    if (path.size() < 2 || path.front() != '/' || path.back() == '/') return false;
    for (std::size_t at = 1; at <= path.size();) {
        const auto slash = std::min(path.find('/', at), path.size());
        if (!is_plain_file_name(path.substr(at, slash - at))) return false;
        at = slash + 1;
    }
    return true;
}

/// Checks a file prefix a ps is asked to save a shard under, before anything is created: it must name
/// a plain file in a save's temporary directory (`*.tmp-*`) that exists and is a real directory, not a
/// link. A peer can then only add files to a save in progress (and never replace one: the files are
/// created exclusively), not write anywhere the ps's user may.
/// @throws InvalidArgumentError naming the prefix and the rule it breaks.
inline void check_save_prefix(const std::string& prefix) {
    const auto refuse = [&](const std::string& why) {
        throw InvalidArgumentError("pss: save_shard: refused the file prefix '" + prefix + "': " + why);
    };
    if (!is_normal_absolute_path(prefix)) refuse("it must be an absolute path without '.', '..' or empty parts");
    const std::string directory = parent_directory(prefix);
    if (base_name(directory).find(temporary_marker) == std::string::npos)
        refuse("its directory is not a checkpoint being saved (a name with '" + std::string(temporary_marker) + "')");
    struct stat st{};
    if (::lstat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        refuse("its directory does not exist or is not a directory (links are not followed)");
}

/// Checks a checkpoint directory a ps is asked to restore from: absolute and normal (`check_save_prefix`);
/// the index then names the files, and each must be a plain name in it (`from_json(FileRecord)`).
/// @throws InvalidArgumentError naming the directory.
inline void check_restore_directory(const std::string& directory) {
    if (!is_normal_absolute_path(directory))
        throw InvalidArgumentError("pss: restore_shard: refused the checkpoint directory '" + directory +
                                   "': it must be an absolute path without '.', '..' or empty parts");
}

// ---- .npy files with chunk checksums --------------------------------------------------------------------

/// Bytes covered by one checksum of a file's data (after its header): a reader of some rows reads and
/// checks the chunks that hold them, not the whole file. At least 4 MiB; more for a file above 1 GiB,
/// so that no file has more than 257 checksums.
[[nodiscard]] inline std::uint64_t checkpoint_chunk_bytes(std::uint64_t data_bytes) noexcept {
    constexpr std::uint64_t min_chunk = std::uint64_t{4} << 20, mib = std::uint64_t{1} << 20;
    const std::uint64_t by_count = (data_bytes / 256 + mib - 1) / mib * mib;
    return std::max(min_chunk, by_count);
}

/// An untrusted JSON value as an integer of type T: nlohmann's get<T>() converts a float or an integer
/// out of T's range with undefined behaviour, so the value's kind and range are checked first.
/// @throws std::invalid_argument naming `what` and the value.
template <std::integral T>
[[nodiscard]] T json_integer(const nlohmann::json& j, std::string_view what) {
    if (j.is_number_unsigned()) {
        if (const auto v = j.get<std::uint64_t>(); std::in_range<T>(v)) return static_cast<T>(v);
    } else if (j.is_number_integer()) {
        if (const auto v = j.get<std::int64_t>(); std::in_range<T>(v)) return static_cast<T>(v);
    }
    throw std::invalid_argument(std::string(what) + " must be an integer from " +
                                std::to_string(std::numeric_limits<T>::min()) + " to " +
                                std::to_string(std::numeric_limits<T>::max()) + ", not " + dumped(j));
}

/// An untrusted JSON array of integers of type T (json_integer for each).
template <std::integral T>
[[nodiscard]] std::vector<T> json_integers(const nlohmann::json& j, std::string_view what) {
    if (!j.is_array()) throw std::invalid_argument(std::string(what) + " must be an array, not " + dumped(j));
    std::vector<T> out;
    out.reserve(j.size());
    for (const auto& item : j) out.push_back(json_integer<T>(item, what));
    return out;
}

/// An untrusted JSON object of counters: {"iterations": 7}.
[[nodiscard]] inline std::map<std::string, std::int64_t> json_counters(const nlohmann::json& j) {
    if (!j.is_object()) throw std::invalid_argument("\"counters\" must be an object, not " + dumped(j));
    std::map<std::string, std::int64_t> out;
    for (const auto& [name, value] : j.items()) out[name] = json_integer<std::int64_t>(value, "counter \"" + name + "\"");
    return out;
}

/// What the index records of one file: its size, its CRC-32 (zlib's, the whole file), and the CRC-32 of
/// its header and of each chunk of its data, which a partial read checks.
struct FileRecord {
    std::string file;                     ///< the file name, in the checkpoint's directory
    std::uint64_t bytes = 0;              ///< the file's size
    std::uint32_t crc32 = 0;              ///< zlib.crc32 of the whole file
    std::uint64_t header_bytes = 0;       ///< the .npy header (magic to newline)
    std::uint64_t chunk_bytes = 0;        ///< data bytes per chunk checksum
    std::vector<std::uint32_t> chunk_crc32;  ///< [0]: the header's; then each data chunk's

    friend bool operator==(const FileRecord&, const FileRecord&) = default;
};

inline void to_json(nlohmann::json& j, const FileRecord& r) {
    j = nlohmann::json{{"file", r.file},           {"bytes", r.bytes},        {"crc32", r.crc32},
                       {"header_bytes", r.header_bytes}, {"chunk_bytes", r.chunk_bytes}, {"chunk_crc32", r.chunk_crc32}};
}
inline void from_json(const nlohmann::json& j, FileRecord& r) {
    r.file = j.at("file").get<std::string>();
    // An index names files in its own directory only: a name with a '/' or '..' would make the ps
    // (and pss-ckpt) read outside it.
    if (!is_plain_file_name(r.file))
        throw std::invalid_argument("a file name must be a plain name in the checkpoint's directory, not '" + r.file + "'");
    r.bytes = json_integer<std::uint64_t>(j.at("bytes"), "\"bytes\"");
    r.crc32 = json_integer<std::uint32_t>(j.at("crc32"), "\"crc32\"");
    r.header_bytes = json_integer<std::uint64_t>(j.at("header_bytes"), "\"header_bytes\"");
    r.chunk_bytes = json_integer<std::uint64_t>(j.at("chunk_bytes"), "\"chunk_bytes\"");
    r.chunk_crc32 = json_integers<std::uint32_t>(j.at("chunk_crc32"), "\"chunk_crc32\"");
}

/// numpy's dtype string of a pss dtype: "<f4", "<f8", "<i4", "<i8"; "|S<width>" for strings (numpy's
/// fixed-width bytes, each element padded with NUL bytes to the longest).
[[nodiscard]] inline std::string npy_descr(DType dtype, std::size_t string_width = 1) {
    switch (dtype) {
        case DType::float32: return "<f4";
        case DType::float64: return "<f8";
        case DType::int32: return "<i4";
        case DType::int64: return "<i8";
        case DType::string: return "|S" + std::to_string(string_width);
    }
    return "?";
}

/// The .npy header numpy writes for a C-order array (version 1.0, padded to 64 bytes), by xtensor's npy
/// writer.
[[nodiscard]] inline std::string npy_header(const std::string& descr, const Shape& shape) {
    std::ostringstream out;
    xt::detail::write_header(out, descr, false, shape);
    return out.str();
}

/// Writes an array as a .npy file (created; it must not exist), straight from `data`: the header (of
/// numpy dtype `descr`), then `nbytes` of data, checksummed as they go out, then fsync. Returns the
/// file's record (its name is the path's last component).
/// @throws FailedPreconditionError naming the path and the system's reason (disk full, read-only).
inline FileRecord write_npy(const std::string& path, const std::string& descr, const Shape& shape, const void* data,
                            std::size_t nbytes) {
    const std::string header = npy_header(descr, shape);
    FileHandle f(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (f.get() < 0) throw_file_error("creating", path, errno);
    checkpoint_save_point("file created");
    FileRecord r;
    r.file = base_name(path);
    r.header_bytes = header.size();
    r.bytes = header.size() + nbytes;
    r.chunk_bytes = checkpoint_chunk_bytes(nbytes);
    r.chunk_crc32.push_back(crc32(0, header.data(), header.size()));
    r.crc32 = r.chunk_crc32.front();
    write_all(f.get(), header.data(), header.size(), path);
    const auto* p = static_cast<const char*>(data);
    for (std::size_t at = 0; at < nbytes; at += r.chunk_bytes) {
        const std::size_t n = std::min<std::size_t>(r.chunk_bytes, nbytes - at);
        r.chunk_crc32.push_back(crc32(0, p + at, n));
        r.crc32 = crc32(r.crc32, p + at, n);
        write_all(f.get(), p + at, n, path);
        checkpoint_save_point("chunk written");
    }
    if (::fsync(f.get()) != 0) throw_file_error("fsync of", path, errno);
    if (f.close() != 0) throw_file_error("closing", path, errno);
    checkpoint_save_point("file written");
    return r;
}

/// The same for an array of a numeric dtype.
inline FileRecord write_npy(const std::string& path, DType dtype, const Shape& shape, const void* data,
                            std::size_t nbytes) {
    return write_npy(path, npy_descr(dtype), shape, data, nbytes);
}

/// The same for strings, as numpy's fixed-width bytes (`|S<width>`, the longest element's length, at
/// least 1): what `numpy.load` gives back as a bytes_ array. numpy drops the NUL bytes that end an
/// element, so an element ending in one cannot be saved exactly, and is refused.
/// @throws InvalidArgumentError naming `what` and the element, before the file is created.
inline FileRecord write_npy_strings(const std::string& path, const std::string& what, const Shape& shape,
                                    const std::string* strings, std::size_t count) {
    std::size_t width = 1;
    for (std::size_t i = 0; i < count; ++i) {
        width = std::max(width, strings[i].size());
        if (!strings[i].empty() && strings[i].back() == '\0')
            throw InvalidArgumentError("pss: checkpoint: " + what + ": element " + std::to_string(i) +
                                       " ends in a NUL byte, which numpy's fixed-width bytes (dtype |S) cannot keep; "
                                       "nothing was saved");
    }
    std::vector<char> fixed(count * width, '\0');
    for (std::size_t i = 0; i < count; ++i) std::copy(strings[i].begin(), strings[i].end(), fixed.begin() + i * width);
    return write_npy(path, npy_descr(DType::string, width), shape, fixed.data(), fixed.size());
}

/// What a .npy header says.
struct NpyHeader {
    DType dtype = DType::float32;
    Shape shape;
    std::size_t header_bytes = 0;
    std::size_t element_size = 4;  ///< bytes of an element in the file (a string file's width)
};

/// Parses the dictionary of a .npy header, the Python literal numpy writes:
/// `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }` padded with spaces, then a newline;
/// the keys in any order, each once. Strict, and safe on any bytes (xtensor's parse_header reads before
/// an empty string on some, and takes "-1" or "x" for a dimension).
/// @throws std::invalid_argument saying what is wrong.
inline void parse_npy_dictionary(std::string_view text, std::string& descr, bool& fortran, std::vector<std::size_t>& shape) {
    std::size_t at = 0;
    const auto fail = [&](const std::string& what) {
        throw std::invalid_argument(what + " at byte " + std::to_string(at) + " of the dictionary");
    };
    const auto skip_space = [&] {
        while (at < text.size() && (text[at] == ' ' || text[at] == '\n' || text[at] == '\t')) ++at;
    };
    const auto expect = [&](char c) {
        skip_space();
        if (at >= text.size() || text[at] != c) fail(std::string("expected '") + c + "'");
        ++at;
    };
    const auto peek = [&](char c) {
        skip_space();
        return at < text.size() && text[at] == c;
    };
    const auto quoted = [&] {
        expect('\'');
        const auto end = text.find('\'', at);
        if (end == std::string_view::npos) fail("an unterminated string");
        std::string out(text.substr(at, end - at));
        at = end + 1;
        return out;
    };
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    expect('{');
    while (!peek('}')) {
        const std::string key = quoted();
        expect(':');
        skip_space();
        if (key == "descr" && !seen_descr) {
            descr = quoted();
            seen_descr = true;
        } else if (key == "fortran_order" && !seen_fortran) {
            fortran = text.substr(at, 4) == "True";
            if (!fortran && text.substr(at, 5) != "False") fail("fortran_order is neither True nor False");
            at += fortran ? 4 : 5;
            seen_fortran = true;
        } else if (key == "shape" && !seen_shape) {
            expect('(');
            shape.clear();
            while (!peek(')')) {
                const std::size_t begin = at;
                std::uint64_t d = 0;
                for (; at < text.size() && text[at] >= '0' && text[at] <= '9'; ++at) {
                    if (d > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) fail("a dimension too large");
                    d = d * 10 + static_cast<std::uint64_t>(text[at] - '0');
                }
                if (at == begin || shape.size() == 32) fail("expected a dimension (at most 32)");
                shape.push_back(static_cast<std::size_t>(d));
                if (!peek(')')) expect(',');
            }
            expect(')');
            seen_shape = true;
        } else {
            fail("key '" + key + "' is unknown or repeated");
        }
        if (!peek('}')) expect(',');
    }
    expect('}');
    skip_space();
    if (at != text.size()) fail("bytes after the dictionary");
    if (!seen_descr || !seen_fortran || !seen_shape) fail("'descr', 'fortran_order' or 'shape' is missing");
}

/// Parses a .npy header from the first bytes of a file.
/// @throws InvalidArgumentError naming `path` when the bytes are no .npy header of a pss dtype in C order.
[[nodiscard]] inline NpyHeader parse_npy_header(std::string_view bytes, const std::string& path) {
    auto bad = [&](const std::string& why) {
        return InvalidArgumentError("pss: checkpoint: " + path + " is not a .npy file pss can read: " + why);
    };
    if (bytes.size() < 10 || bytes.substr(0, 6) != std::string_view("\x93NUMPY", 6))
        throw bad("it does not start with the .npy magic \\x93NUMPY");
    const auto major = static_cast<unsigned char>(bytes[6]);
    std::size_t len = 0, prefix = 0;
    if (major == 1) {
        len = static_cast<unsigned char>(bytes[8]) | (std::size_t{static_cast<unsigned char>(bytes[9])} << 8);
        prefix = 10;
    } else if (major == 2 || major == 3) {
        if (bytes.size() < 12) throw bad("its header is cut short");
        for (int i = 3; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(bytes[8 + static_cast<std::size_t>(i)]);
        prefix = 12;
    } else {
        throw bad("format version " + std::to_string(major) + " is unknown");
    }
    if (bytes.size() < prefix + len) throw bad("its header is cut short");
    if (len == 0 || bytes[prefix + len - 1] != '\n') throw bad("its header does not end with a newline");
    NpyHeader h;
    h.header_bytes = prefix + len;
    std::string descr;
    bool fortran = false;
    std::vector<std::size_t> shape;
    try {
        parse_npy_dictionary(bytes.substr(prefix, len), descr, fortran, shape);
    } catch (const std::invalid_argument& e) {
        throw bad(std::string("its header does not parse (") + e.what() + ")");
    }
    if (fortran) throw bad("it is in Fortran order; pss reads C order");
    bool known = false;
    for (DType d : {DType::float32, DType::float64, DType::int32, DType::int64})
        if (npy_descr(d) == descr) {
            h.dtype = d;
            h.element_size = dtype_size(d);
            known = true;
        }
    if (descr.size() > 2 && descr.size() <= 12 && descr.starts_with("|S") &&
        descr.find_first_not_of("0123456789", 2) == std::string::npos && descr[2] != '0') {
        h.dtype = DType::string;
        h.element_size = static_cast<std::size_t>(std::stoull(descr.substr(2)));  // at most 10 digits
        known = true;
    }
    if (!known) throw bad("dtype '" + descr + "' is none of <f4, <f8, <i4, <i8, |S<width>");
    h.shape.assign(shape.begin(), shape.end());
    return h;
}

/// Reads rows [row_begin, row_end) of the .npy file `dir/record.file` into `out` (the rows' bytes; for
/// DType::string, `out` points at the rows' std::string elements), after checking the file's size, its
/// header (dtype and shape must be `dtype` and `shape`) and the checksum of every chunk it reads. Reads
/// only the header and the chunks that hold those rows.
/// @throws NotFoundError (missing file), InvalidArgumentError (truncated, checksum, header), each
/// naming the file.
inline void read_npy_rows(const std::string& dir, const FileRecord& record, DType dtype, const Shape& shape,
                          std::size_t row_begin, std::size_t row_end, void* out) {
    const std::string path = dir + "/" + record.file;
    FileHandle f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.get() < 0) throw_file_error("opening", path, errno);
    struct ::stat st {};
    if (::fstat(f.get(), &st) != 0) throw_file_error("stat of", path, errno);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size != record.bytes)
        throw InvalidArgumentError("pss: checkpoint: " + path + (size < record.bytes ? " is truncated" : " is too long") +
                                   ": it has " + std::to_string(size) + " bytes where the index says " +
                                   std::to_string(record.bytes));
    // A header is a few hundred bytes (numpy pads it to 64); one the index claims larger is not read.
    constexpr std::uint64_t max_header_bytes = std::uint64_t{1} << 20;
    const bool header_fits = record.header_bytes >= 10 && record.header_bytes <= record.bytes &&
                             record.header_bytes <= max_header_bytes;
    const std::uint64_t data_bytes = header_fits ? record.bytes - record.header_bytes : 0;
    const std::uint64_t chunks =
        record.chunk_bytes == 0 ? 0 : data_bytes / record.chunk_bytes + (data_bytes % record.chunk_bytes != 0 ? 1 : 0);
    if (!header_fits || record.chunk_bytes == 0 || record.chunk_crc32.size() != chunks + 1)
        throw InvalidArgumentError("pss: checkpoint: the index's record of " + path +
                                   " is inconsistent (header_bytes, chunk_bytes and chunk_crc32 do not fit its size)");
    auto checksum_error = [&](const std::string& part) {
        return InvalidArgumentError("pss: checkpoint: " + path + ": checksum mismatch in " + part +
                                    "; the file is corrupt (or was changed after the save)");
    };
    std::string header(record.header_bytes, '\0');
    pread_all(f.get(), header.data(), header.size(), 0, path);
    if (crc32(0, header.data(), header.size()) != record.chunk_crc32[0]) throw checksum_error("its header");
    const NpyHeader h = parse_npy_header(header, path);
    if (h.dtype != dtype || h.shape != shape)
        throw InvalidArgumentError("pss: checkpoint: " + path + " holds shape " + format_shape(h.shape) + " dtype " +
                                   std::string(dtype_name(h.dtype)) + " where the index says shape " +
                                   format_shape(shape) + " dtype " + std::string(dtype_name(dtype)));
    // The index's shapes are checked; a string file's width is at most 10 digits, so no product overflows.
    const std::size_t row_bytes = row_elements(shape) * h.element_size;
    if (row_begin > row_end || (row_bytes != 0 && row_end > data_bytes / row_bytes))
        throw InvalidArgumentError("pss: checkpoint: " + path + " has no rows [" + std::to_string(row_begin) + ", " +
                                   std::to_string(row_end) + ")");
    const std::uint64_t want_begin = row_begin * row_bytes, want_end = row_end * row_bytes;
    if (want_begin == want_end) return;
    std::vector<char> buffer, fixed;  // fixed: a string file's rows as stored, before they become strings
    auto* dest = static_cast<char*>(out);
    if (dtype == DType::string) {
        fixed.resize(static_cast<std::size_t>(want_end - want_begin));
        dest = fixed.data();
    }
    for (std::size_t c = want_begin / record.chunk_bytes; c < chunks && c * record.chunk_bytes < want_end; ++c) {
        const std::uint64_t cb = c * record.chunk_bytes;
        const std::uint64_t ce = std::min<std::uint64_t>(cb + record.chunk_bytes, data_bytes);
        const std::size_t n = static_cast<std::size_t>(ce - cb);
        char* target;
        const bool whole = cb >= want_begin && ce <= want_end;  // read it straight into its place
        if (whole) {
            target = dest + (cb - want_begin);
        } else {
            buffer.resize(n);
            target = buffer.data();
        }
        pread_all(f.get(), target, n, record.header_bytes + cb, path);
        if (crc32(0, target, n) != record.chunk_crc32[c + 1])
            throw checksum_error("data bytes [" + std::to_string(cb) + ", " + std::to_string(ce) + ")");
        if (!whole) {
            const std::uint64_t from = std::max(cb, want_begin), to = std::min(ce, want_end);
            std::memcpy(dest + (from - want_begin), target + (from - cb), static_cast<std::size_t>(to - from));
        }
    }
    auto* strings = static_cast<std::string*>(out);
    for (std::size_t i = 0, w = h.element_size; i < fixed.size() / w; ++i) {
        const char* element = fixed.data() + i * w;
        strings[i].assign(element, std::find(element, element + w, '\0'));  // numpy's bytes_ end at the first NUL
    }
}

// ---- the index ----------------------------------------------------------------------------------------

/// The version of the index this pss writes; an index of a higher version is refused.
inline constexpr int checkpoint_format_version = 1;

/// One saved shard: its rows of the variable, its value's file, its slots' files and counters.
struct SavedShard {
    std::size_t row_offset = 0;
    Shape shape;
    FileRecord value;
    std::map<std::string, FileRecord> slots;
    std::map<std::string, std::int64_t> counters;
};

/// One saved variable.
struct SavedVariable {
    std::string name;
    Shape shape;
    DType dtype = DType::float32;
    std::vector<SavedShard> shards;
};

/// A checkpoint's index.json.
struct CheckpointIndex {
    int format_version = checkpoint_format_version;
    std::uint64_t step = 0;
    nlohmann::json optimizer = nlohmann::json::object();  ///< {"name": ..., "config": {...}, "slot_names": [...]}
    nlohmann::json partitioner = nlohmann::json::object();
    nlohmann::json metadata = nlohmann::json::object();   ///< the caller's (Keras: epoch and step)
    std::vector<SavedVariable> variables;

    [[nodiscard]] const SavedVariable* find(std::string_view name) const {
        for (const auto& v : variables)
            if (v.name == name) return &v;
        return nullptr;
    }
    [[nodiscard]] std::vector<std::string> slot_names() const {
        std::vector<std::string> out;
        if (optimizer.contains("slot_names"))
            for (const auto& s : optimizer.at("slot_names")) out.push_back(s.get<std::string>());
        return out;
    }
};

[[nodiscard]] inline std::optional<DType> dtype_from_name(std::string_view name) {
    for (DType d : {DType::float32, DType::float64, DType::int32, DType::int64, DType::string})
        if (dtype_name(d) == name) return d;
    return std::nullopt;
}

[[nodiscard]] inline nlohmann::json index_to_json(const CheckpointIndex& index) {
    nlohmann::json vars = nlohmann::json::array();
    for (const auto& v : index.variables) {
        nlohmann::json shards = nlohmann::json::array();
        for (const auto& s : v.shards) {
            nlohmann::json slots = nlohmann::json::object();
            for (const auto& [name, record] : s.slots) slots[name] = record;
            shards.push_back({{"row_offset", s.row_offset},
                              {"shape", s.shape},
                              {"value", s.value},
                              {"slots", std::move(slots)},
                              {"counters", s.counters}});
        }
        vars.push_back({{"name", v.name}, {"shape", v.shape}, {"dtype", dtype_name(v.dtype)}, {"shards", std::move(shards)}});
    }
    return {{"format", "pss-checkpoint"},
            {"format_version", index.format_version},
            {"step", index.step},
            {"optimizer", index.optimizer},
            {"partitioner", index.partitioner},
            {"metadata", index.metadata},
            {"variables", std::move(vars)}};
}

/// The most bytes a saved variable may describe (2^62): more than any file, and no product of a
/// shape's extents, rows or bytes overflows below it.
inline constexpr std::uint64_t max_saved_bytes = std::uint64_t{1} << 62;

/// Parses and checks an index (`path` names it in errors).
/// @throws InvalidArgumentError for an index that is not pss's, of a newer format, or inconsistent.
[[nodiscard]] inline CheckpointIndex index_from_json(const std::string& text, const std::string& path) {
    auto bad = [&](const std::string& why) { return InvalidArgumentError("pss: checkpoint: " + path + ": " + why); };
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
        throw bad(std::string("is not JSON (") + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("format") || j.at("format") != "pss-checkpoint")
        throw bad("is not a pss checkpoint index (no \"format\": \"pss-checkpoint\")");
    CheckpointIndex index;
    try {
        index.format_version = json_integer<int>(j.at("format_version"), "\"format_version\"");
        if (index.format_version > checkpoint_format_version)
            throw bad("format_version is " + std::to_string(index.format_version) + ", newer than this pss reads (" +
                      std::to_string(checkpoint_format_version) + "); restore it with a newer pss");
        index.step = json_integer<std::uint64_t>(j.at("step"), "\"step\"");
        index.optimizer = j.at("optimizer");
        index.partitioner = j.at("partitioner");
        index.metadata = j.value("metadata", nlohmann::json::object());
        for (const auto& jv : j.at("variables")) {
            SavedVariable v;
            v.name = jv.at("name").get<std::string>();
            v.shape = json_integers<std::size_t>(jv.at("shape"), "\"shape\"");
            const auto dtype = dtype_from_name(jv.at("dtype").get<std::string>());
            if (!dtype) throw bad("variable '" + v.name + "' has an unknown dtype " + dumped(jv.at("dtype")));
            v.dtype = *dtype;
            // Shapes are untrusted: none may describe more bytes than a file can hold (no size overflows).
            auto check_shape = [&](const Shape& shape, const std::string& what) {
                if (bounded_elements(shape, max_saved_bytes / std::max<std::size_t>(dtype_size(v.dtype), 1)) < 0)
                    throw bad("variable '" + v.name + "': " + what + " shape " + format_shape(shape) +
                              " is larger than a checkpoint can hold");
            };
            check_shape(v.shape, "its");
            std::size_t rows = 0;
            for (const auto& js : jv.at("shards")) {
                SavedShard s;
                s.row_offset = json_integer<std::size_t>(js.at("row_offset"), "\"row_offset\"");
                s.shape = json_integers<std::size_t>(js.at("shape"), "\"shape\"");
                s.value = js.at("value").get<FileRecord>();
                for (const auto& [name, record] : js.at("slots").items()) s.slots[name] = record.get<FileRecord>();
                s.counters = json_counters(js.at("counters"));
                check_shape(s.shape, "shard " + std::to_string(v.shards.size()) + "'s");
                const bool fits = v.shape.empty()
                                      ? s.shape.empty() && s.row_offset == 0
                                      : s.shape.size() == v.shape.size() && s.row_offset == rows &&
                                            s.shape[0] <= v.shape[0] - rows &&
                                            std::equal(s.shape.begin() + 1, s.shape.end(), v.shape.begin() + 1);
                if (!fits)
                    throw bad("variable '" + v.name + "': shard " + std::to_string(v.shards.size()) + " (rows from " +
                              std::to_string(s.row_offset) + ", shape " + format_shape(s.shape) +
                              ") does not continue the shards before it in a variable of shape " + format_shape(v.shape));
                rows += v.shape.empty() ? 0 : s.shape[0];
                v.shards.push_back(std::move(s));
            }
            if (v.shards.empty() || (!v.shape.empty() && rows != v.shape[0]))
                throw bad("variable '" + v.name + "': its shards cover " + std::to_string(rows) + " rows of " +
                          format_shape(v.shape));
            index.variables.push_back(std::move(v));
        }
    } catch (const InvalidArgumentError&) {
        throw;
    } catch (const std::exception& e) {
        throw bad(std::string("is malformed (") + e.what() + ")");
    }
    return index;
}

/// Reads `dir/index.json`.
[[nodiscard]] inline CheckpointIndex read_index(const std::string& dir) {
    const std::string path = dir + "/index.json";
    return index_from_json(read_small_file(path), path);
}

/// Where rows [begin, end) of a variable come from: for each saved shard that holds some of them, its
/// index, the rows inside it, and where they go in the range.
struct RowPiece {
    std::size_t shard = 0;
    std::size_t from = 0, to = 0;  ///< rows of the saved shard
    std::size_t at = 0;            ///< first row of the piece in [begin, end)
};

[[nodiscard]] inline std::vector<RowPiece> pieces_of_rows(const SavedVariable& v, std::size_t begin, std::size_t end) {
    std::vector<RowPiece> out;
    if (v.shape.empty()) return {{0, 0, 0, 0}};
    for (std::size_t i = 0; i < v.shards.size(); ++i) {
        const auto& s = v.shards[i];
        const std::size_t lo = std::max(begin, s.row_offset), hi = std::min(end, s.row_offset + s.shape[0]);
        if (lo < hi) out.push_back({i, lo - s.row_offset, hi - s.row_offset, lo - begin});
    }
    return out;
}

/// Reads rows [begin, end) of a saved tensor (the value when `slot` is empty, else that slot) into
/// `out`, from whichever saved shards hold them. A scalar variable reads its one element.
inline void read_saved_rows(const std::string& dir, const SavedVariable& v, const std::string& slot, std::size_t begin,
                            std::size_t end, void* out) {
    const std::size_t row_bytes = row_elements(v.shape) * dtype_size(v.dtype);
    const std::size_t row_strings = v.dtype == DType::string ? row_elements(v.shape) : 0;
    for (const auto& piece : pieces_of_rows(v, begin, end)) {
        const auto& s = v.shards[piece.shard];
        const FileRecord* record = &s.value;
        if (!slot.empty()) {
            auto it = s.slots.find(slot);
            if (it == s.slots.end())
                throw InvalidArgumentError("pss: checkpoint: " + dir + ": variable '" + v.name + "' shard " +
                                           std::to_string(piece.shard) + " has no slot '" + slot + "'");
            record = &it->second;
        }
        if (v.shape.empty()) {
            read_npy_rows(dir, *record, v.dtype, s.shape, 0, 1, out);
        } else {
            void* at = row_strings != 0 ? static_cast<void*>(static_cast<std::string*>(out) + piece.at * row_strings)
                                        : static_cast<char*>(out) + piece.at * row_bytes;
            read_npy_rows(dir, *record, v.dtype, s.shape, piece.from, piece.to, at);
        }
    }
}

/// A file-name-safe form of a variable's name: "dense_1/kernel" gives "dense_1.kernel".
[[nodiscard]] inline std::string file_stem(std::string_view name) {
    std::string out;
    for (char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        out += ok ? c : (c == '/' ? '.' : '_');
    }
    return out.empty() ? std::string("variable") : out;
}

}  // namespace detail

PSS_NAMESPACE_END
