// pss/compression.hpp: float32 values sent as 16 bits (bfloat16, float16), and the error feedback that keeps
// what rounding a push loses for the next push.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(PSS_NO_F16C)
#include <cpuid.h>
#include <immintrin.h>
#define PSS_F16C 1
#endif

#include <xtl/xhalf_float.hpp>

#include <pss/config.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief How the float32 values of a variable travel between workers and its ps tasks (as Horovod's
/// `Compression.fp16`, BytePS's compressors). Values are part of the wire format.
///
/// With `bfloat16` or `float16`, a float32 variable's gradients (`apply_gradient`,
/// `apply_sparse_gradient`) and its values read (`read_value`, `sparse_read`, `read_into`, a slice)
/// travel as 16-bit numbers: half the bytes. Reads return the ps's values rounded to the nearest 16-bit
/// number (ties to even); the ps keeps and updates its values in float32. A push rounds the gradient
/// plus what earlier pushes of the same worker lost to rounding (error feedback), and keeps the new
/// difference for the next push, so over steps nothing is lost: the sum of the gradients applied
/// differs from the sum computed by one rounding error at most. Everything else (assign, assign_add,
/// the scatters, checkpoints, the optimizer's slots) stays exact, and so do variables of other dtypes.
/// The numerics do not depend on the transport: the embedded cluster rounds as a wire does.
enum class Compression : std::uint8_t {
    none = 0,      ///< float32 as it is
    bfloat16 = 1,  ///< 8 significant bits and float32's range (Google's brain float)
    /// 11 significant bits, range ±65504: a value read beyond becomes ±infinity; a push saturates at
    /// ±65504 and error feedback carries the rest to the next pushes
    float16 = 2,
};

/// @brief "none", "bfloat16" or "float16".
[[nodiscard]] constexpr std::string_view compression_name(Compression c) noexcept {
    switch (c) {
        case Compression::none: return "none";
        case Compression::bfloat16: return "bfloat16";
        case Compression::float16: return "float16";
    }
    return "unknown";
}

/// @brief The Compression `text` names: "none" (or ""), "bfloat16" or "float16".
/// @throws InvalidArgumentError `pss: PSS_COMPRESSION is "fp16"; give none, bfloat16 or float16`
[[nodiscard]] inline Compression parse_compression(std::string_view text, std::string_view what = "PSS_COMPRESSION") {
    if (text.empty() || text == "none") return Compression::none;
    if (text == "bfloat16") return Compression::bfloat16;
    if (text == "float16") return Compression::float16;
    throw InvalidArgumentError("pss: " + std::string(what) + " is \"" + std::string(text) +
                               "\"; give none, bfloat16 or float16");
}

/// @brief PSS_COMPRESSION's Compression, `none` when it is not set: what a strategy starts with, so that
/// a program (a Keras fit) trains compressed without a change (see ParameterServerStrategy::set_compression).
/// @throws InvalidArgumentError when it names none of them
[[nodiscard]] inline Compression compression_from_environment() {
    const char* value = std::getenv("PSS_COMPRESSION");
    return value == nullptr ? Compression::none : parse_compression(value);
}

namespace detail {

/// float32 to bfloat16, rounded to nearest, ties to even (TensorFlow's rounding); a NaN stays a (quiet) NaN.
/// (Branch-free, so that loops over it vectorize.)
[[nodiscard]] inline std::uint16_t to_bfloat16(float value) noexcept {
    const auto bits = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    return static_cast<std::uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? (bits >> 16) | 0x40u : rounded);
}

[[nodiscard]] inline float from_bfloat16(std::uint16_t value) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(value) << 16);
}

#ifdef PSS_F16C
/// True when this CPU converts float16 in hardware (F16C, x86-64 since 2012; asked once).
[[nodiscard]] inline bool cpu_has_f16c() noexcept {
    static const bool has = [] {  // clang 14 knows no "f16c" for __builtin_cpu_supports: CPUID leaf 1 says
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    }();
    return has;
}

// Eight at a time; the last few through a block of eight on the stack.
__attribute__((target("f16c,avx"))) inline void narrow_float16_f16c(const float* in, std::uint16_t* out,
                                                                   std::size_t n) noexcept {
    const std::size_t whole = n - n % 8;
    for (std::size_t i = 0; i < whole; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    if (whole == n) return;
    float tail[8] = {};
    std::uint16_t narrowed[8];
    std::memcpy(tail, in + whole, (n - whole) * sizeof(float));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(narrowed), _mm256_cvtps_ph(_mm256_loadu_ps(tail), _MM_FROUND_TO_NEAREST_INT));
    std::memcpy(out + whole, narrowed, (n - whole) * sizeof(std::uint16_t));
}

__attribute__((target("f16c,avx"))) inline void widen_float16_f16c(const std::uint16_t* in, float* out,
                                                                  std::size_t n) noexcept {
    const std::size_t whole = n - n % 8;
    for (std::size_t i = 0; i < whole; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    if (whole == n) return;
    std::uint16_t tail[8] = {};
    float widened[8];
    std::memcpy(tail, in + whole, (n - whole) * sizeof(std::uint16_t));
    _mm256_storeu_ps(widened, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tail))));
    std::memcpy(out + whole, widened, (n - whole) * sizeof(float));
}
#endif

/// `n` float32 values to 16-bit numbers of `c` (not `none`), rounded to nearest, ties to even; a value
/// beyond float16's range becomes ±infinity. F16C where the CPU has it, else xtl's half_float.
inline void narrow(Compression c, const float* in, std::uint16_t* out, std::size_t n) noexcept {
    if (c == Compression::bfloat16) {
        for (std::size_t i = 0; i < n; ++i) out[i] = to_bfloat16(in[i]);
        return;
    }
#ifdef PSS_F16C
    if (cpu_has_f16c()) return narrow_float16_f16c(in, out, n);
#endif
    for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<std::uint16_t>(half_float::detail::float2half<std::round_to_nearest>(in[i]));
}

/// `n` 16-bit numbers of `c` to float32 (exact).
inline void widen(Compression c, const std::uint16_t* in, float* out, std::size_t n) noexcept {
    if (c == Compression::bfloat16) {
        for (std::size_t i = 0; i < n; ++i) out[i] = from_bfloat16(in[i]);
        return;
    }
#ifdef PSS_F16C
    if (cpu_has_f16c()) return widen_float16_f16c(in, out, n);
#endif
    for (std::size_t i = 0; i < n; ++i) out[i] = half_float::detail::half2float<float>(in[i]);
}

/// Elements converted at a time through a buffer on the stack (fits the L1 cache with its floats).
inline constexpr std::size_t compression_chunk = 1024;

/// Widens in place the `n` 16-bit numbers at the start of `values` (a buffer of `n` floats that received
/// them): from the end down, so that no number is overwritten before it is read.
inline void widen_in_place(Compression c, float* values, std::size_t n) noexcept {
    std::array<std::uint16_t, compression_chunk> staged;
    const auto* halves = reinterpret_cast<const std::byte*>(values);
    for (std::size_t end = n; end > 0;) {
        const std::size_t begin = end > compression_chunk ? end - compression_chunk : 0;
        std::memcpy(staged.data(), halves + 2 * begin, 2 * (end - begin));
        widen(c, staged.data(), values + begin, end - begin);  // writes bytes [4 begin, 4 end), at or past 2 begin
        end = begin;
    }
}

/// Rounds `values` to the nearest 16-bit numbers of `c`, as a read across a wire returns them (`none`:
/// leaves them).
inline void round_in_place(Compression c, std::span<float> values) noexcept {
    if (c == Compression::none) return;
    std::array<std::uint16_t, compression_chunk> staged;
    for (std::size_t begin = 0; begin < values.size(); begin += compression_chunk) {
        const std::size_t n = std::min(compression_chunk, values.size() - begin);
        narrow(c, values.data() + begin, staged.data(), n);
        widen(c, staged.data(), values.data() + begin, n);
    }
}

/// The largest finite number of `c`, where a push saturates.
[[nodiscard]] constexpr float largest_finite(Compression c) noexcept {
    return c == Compression::float16 ? 65504.0f : 3.3895313892515355e38f;  // bfloat16 0x7F7F
}

/// Rounds `values` (a push's gradient) with error feedback: each value plus its `residual` is rounded to
/// a 16-bit number of `c` (saturating at the largest finite one), and the residual becomes what that
/// rounding lost. A non-finite sum is left as it is (the ps refuses it by default) and clears its residual.
inline void round_with_feedback(Compression c, std::span<float> values, std::span<float> residual) noexcept {
    if (c == Compression::none) return;
    // On the bits, with masks for selects, so that the loops vectorize (GCC if-converts none of the
    // ternaries of floats): a sum that is not finite is kept as it is, one whose rounding overflowed
    // saturates at `top`.
    const auto top = std::bit_cast<std::uint32_t>(largest_finite(c));
    const auto settle = [top](float* value, float* owed, float sum, float rounded) {
        const auto s = std::bit_cast<std::uint32_t>(sum);
        const std::uint32_t finite = (s & 0x7FFFFFFFu) < 0x7F800000u ? ~0u : 0u;
        auto q = std::bit_cast<std::uint32_t>(rounded);
        const std::uint32_t over = (q & 0x7FFFFFFFu) >= 0x7F800000u ? ~0u : 0u;
        q = (over & ((s & 0x80000000u) | top)) | (~over & q);
        q = (finite & q) | (~finite & s);
        const float kept = std::bit_cast<float>(q);
        *owed = std::bit_cast<float>(std::bit_cast<std::uint32_t>(sum - kept) & finite);
        *value = kept;
    };
    float* const v = values.data();
    float* const r = residual.data();
    if (c == Compression::bfloat16) {  // rounded in registers, in one pass
        for (std::size_t i = 0; i < values.size(); ++i) {
            const float sum = v[i] + r[i];
            const auto s = std::bit_cast<std::uint32_t>(sum);
            settle(v + i, r + i, sum, std::bit_cast<float>((s + 0x7FFFu + ((s >> 16) & 1u)) & 0xFFFF0000u));
        }
        return;
    }
    std::array<std::uint16_t, compression_chunk> staged;
    std::array<float, compression_chunk> rounded;
    for (std::size_t begin = 0; begin < values.size(); begin += compression_chunk) {
        const std::size_t n = std::min(compression_chunk, values.size() - begin);
        for (std::size_t i = begin; i < begin + n; ++i) v[i] += r[i];
        narrow(c, v + begin, staged.data(), n);
        widen(c, staged.data(), rounded.data(), n);
        for (std::size_t i = 0; i < n; ++i) settle(v + begin + i, r + begin + i, v[begin + i], rounded[i]);
    }
}

/// What compressed pushes still owe the shards of this process's variables, per shard and per worker (each
/// worker, thread or process, keeps its own as a worker process does, so that the embedded cluster's
/// numbers are the cluster's). Dense residuals as large as the variable; a sparse push's by row, for
/// the rows it touched (4 bytes a float32 of each row a worker has pushed). A Channel holds one.
class ErrorFeedback {
public:
    /// Rounds a dense push's gradient for shard `shard` of variable `variable`, pushed by `worker`.
    void round_dense(std::uint64_t variable, std::uint32_t shard, int worker, Compression c, std::span<float> gradient) {
        const auto held = of(variable, shard, worker);
        Residuals& owed = *held;
        const std::lock_guard lock(owed.mutex);
        if (owed.dense.size() != gradient.size()) owed.dense.assign(gradient.size(), 0.0f);  // a new variable
        round_with_feedback(c, gradient, owed.dense);
    }

    /// Rounds a sparse push's rows (`ids.size()` rows of `width` values), row by row with each id's residual.
    void round_rows(std::uint64_t variable, std::uint32_t shard, int worker, Compression c,
                    std::span<const std::int64_t> ids, std::span<float> rows, std::size_t width) {
        const auto held = of(variable, shard, worker);
        Residuals& owed = *held;
        const std::lock_guard lock(owed.mutex);
        if (owed.width != width) {
            owed.row_at.clear();
            owed.rows.clear();
            owed.width = width;
        }
        for (std::size_t i = 0; i < ids.size(); ++i) {
            auto [at, added] = owed.row_at.try_emplace(ids[i], owed.rows.size());
            if (added) owed.rows.resize(owed.rows.size() + width, 0.0f);
            round_with_feedback(c, rows.subspan(i * width, width), std::span(owed.rows).subspan(at->second, width));
        }
    }

    /// Forgets what is owed to `variable` (destroyed).
    void forget(std::uint64_t variable) {
        const std::lock_guard lock(mutex_);
        for (auto it = owed_.lower_bound({variable, 0, std::numeric_limits<int>::min()});
             it != owed_.end() && std::get<0>(it->first) == variable;)
            it = owed_.erase(it);
    }

private:
    struct Residuals {
        std::mutex mutex;
        std::vector<float> dense;
        std::size_t width = 0;
        std::unordered_map<std::int64_t, std::size_t> row_at;  // where a row's residual is in `rows`
        std::vector<float> rows;
    };

    std::shared_ptr<Residuals> of(std::uint64_t variable, std::uint32_t shard, int worker) {
        const std::lock_guard lock(mutex_);
        auto& slot = owed_[{variable, shard, worker}];
        if (!slot) slot = std::make_shared<Residuals>();
        return slot;
    }

    std::mutex mutex_;
    std::map<std::tuple<std::uint64_t, std::uint32_t, int>, std::shared_ptr<Residuals>> owed_;
};

}  // namespace detail

PSS_NAMESPACE_END
