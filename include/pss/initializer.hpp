// pss/initializer.hpp: InitializerSpec, an initializer described as data that a ps task draws a shard from, and its counter-based generator.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/detail/optimizer_support.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The distributions an InitializerSpec draws from. Values are part of the wire format.
enum class InitializerKind : std::uint8_t {
    zeros = 1,
    ones = 2,
    constant = 3,          ///< every value `value`
    random_uniform = 4,    ///< U(minval, maxval)
    random_normal = 5,     ///< N(mean, stddev^2)
    truncated_normal = 6,  ///< N(mean, stddev^2), draws beyond 2 stddev from the mean drawn again
};

/// @brief An initializer as data: what a ps task needs to make the first values of the shards it owns,
/// so that the coordinator never holds a whole variable (see `Variable(shape, dtype, initializer, name)`).
///
/// Element i (in row-major order) of the whole variable is a function of `seed` and i alone: the bits
/// of its draws are SplitMix64's mix of a counter made of i and the draw's number. A shard computes its
/// elements from its first row's index, so the same variable split into 1, 2 or 4 shards, or saved and
/// restored onto another number of ps tasks, holds the same values bit for bit. Uniform values are
/// `minval + (maxval - minval) * u` with u of 53 bits; normal ones come from Box-Muller on two draws
/// (a truncated normal redraws with the next two); all computed in double, then rounded to the dtype.
/// No std:: distribution is used, so every standard library gives the same values (the normals use
/// std::log and std::cos, from the C library: a float64 variable's last bit may differ between C
/// libraries, a float32 one's practically never).
///
/// Keras' initializers (pss/keras/initializers.hpp) describe themselves as one: `initializer.spec(shape,
/// seed)`, VarianceScaling's family resolved with the fans of the whole shape.
struct InitializerSpec {
    InitializerKind kind = InitializerKind::zeros;
    /// constant: the value; random_uniform: minval; the normals: the mean
    double first = 0;
    /// random_uniform: maxval; the normals: the stddev; 0 otherwise
    double second = 0;
    std::uint64_t seed = 0;

    [[nodiscard]] static InitializerSpec zeros() { return {InitializerKind::zeros, 0, 0, 0}; }
    [[nodiscard]] static InitializerSpec ones() { return {InitializerKind::ones, 0, 0, 0}; }
    [[nodiscard]] static InitializerSpec constant(double value) { return {InitializerKind::constant, value, 0, 0}; }
    [[nodiscard]] static InitializerSpec random_uniform(double minval, double maxval, std::uint64_t seed) {
        return {InitializerKind::random_uniform, minval, maxval, seed};
    }
    [[nodiscard]] static InitializerSpec random_normal(double mean, double stddev, std::uint64_t seed) {
        return {InitializerKind::random_normal, mean, stddev, seed};
    }
    [[nodiscard]] static InitializerSpec truncated_normal(double mean, double stddev, std::uint64_t seed) {
        return {InitializerKind::truncated_normal, mean, stddev, seed};
    }

    /// @brief True for the kinds that draw random numbers (they need a float dtype).
    [[nodiscard]] bool is_random() const noexcept {
        return kind == InitializerKind::random_uniform || kind == InitializerKind::random_normal ||
               kind == InitializerKind::truncated_normal;
    }

    /// @brief What is wrong with this initializer for a variable of `dtype`, if anything:
    /// `random_uniform: minval is 1 and maxval 0; they are finite numbers with minval <= maxval`.
    [[nodiscard]] std::optional<std::string> problem(DType dtype) const;

    friend bool operator==(const InitializerSpec&, const InitializerSpec&) = default;
};

/// @brief The name of an InitializerKind, for messages: "random_uniform"; "unknown" outside the enum.
[[nodiscard]] constexpr std::string_view initializer_kind_name(InitializerKind kind) noexcept {
    switch (kind) {
        case InitializerKind::zeros: return "zeros";
        case InitializerKind::ones: return "ones";
        case InitializerKind::constant: return "constant";
        case InitializerKind::random_uniform: return "random_uniform";
        case InitializerKind::random_normal: return "random_normal";
        case InitializerKind::truncated_normal: return "truncated_normal";
    }
    return "unknown";
}

/// @brief What a create request without a payload makes its shard from (Op::create): the shard holds
/// rows [row_offset, row_offset + rows) of a variable of `dtype` and `variable_shape` drawn by
/// `initializer`.
struct ShardInitializer {
    InitializerSpec initializer;
    DType dtype = DType::float32;
    Shape variable_shape;     ///< the whole variable's
    std::size_t row_offset = 0;
    std::size_t rows = 0;     ///< the shard's extent on axis 0 (0 for a scalar)

    /// @brief The shard's shape: the variable's, with `rows` on axis 0.
    [[nodiscard]] Shape shard_shape() const {
        Shape shape = variable_shape;
        if (!shape.empty()) shape[0] = rows;
        return shape;
    }

    /// @brief What is wrong with it, if anything, the shard held to at most `max_bytes`: a bad
    /// initializer (InitializerSpec::problem), a string dtype, rows outside the variable, a shard too big.
    [[nodiscard]] std::optional<std::string> problem(std::uint64_t max_bytes) const;

    friend bool operator==(const ShardInitializer&, const ShardInitializer&) = default;
};

namespace detail {

/// SplitMix64's output function (Steele, Lea and Flood 2014): a bijection of 64-bit words whose every
/// output bit depends on every input bit.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

/// A seed from a variable's name (FNV-1a, then mixed): what an initializer without a seed draws with,
/// the same in every process and with every standard library.
[[nodiscard]] constexpr std::uint64_t name_seed(std::string_view name) noexcept {
    std::uint64_t h = 0xcbf29ce484222325u;
    for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3u;
    return mix64(h);
}

/// How many draws one element may take: a truncated normal redraws its pair at most 127 times
/// (each time with probability 0.046), then takes the mean.
inline constexpr std::uint64_t draws_per_element = 256;

/// The random bits of draw `draw` of element `index` under `seed`: SplitMix64's stream seeded with
/// mix64(seed), at position index * 256 + draw, so that no two draws of a variable share a position.
[[nodiscard]] constexpr std::uint64_t counter_bits(std::uint64_t mixed_seed, std::uint64_t index, std::uint64_t draw) noexcept {
    return mix64(mixed_seed + (index * draws_per_element + draw + 1) * 0x9E3779B97F4A7C15u);
}

/// A double in [0, 1) from the top 53 bits.
[[nodiscard]] constexpr double unit_interval(std::uint64_t bits) noexcept {
    return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

/// N(0, 1) by Box-Muller from draws 2k and 2k + 1 of element `index`.
[[nodiscard]] inline double counter_normal(std::uint64_t mixed_seed, std::uint64_t index, std::uint64_t k) noexcept {
    const double u1 = static_cast<double>((counter_bits(mixed_seed, index, 2 * k) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = unit_interval(counter_bits(mixed_seed, index, 2 * k + 1));
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

/// Element `index` of the variable `spec` draws, in double.
[[nodiscard]] inline double initial_element(const InitializerSpec& spec, std::uint64_t mixed_seed, std::uint64_t index) noexcept {
    switch (spec.kind) {
        case InitializerKind::zeros: return 0.0;
        case InitializerKind::ones: return 1.0;
        case InitializerKind::constant: return spec.first;
        case InitializerKind::random_uniform:
            return spec.first + (spec.second - spec.first) * unit_interval(counter_bits(mixed_seed, index, 0));
        case InitializerKind::random_normal: return spec.first + spec.second * counter_normal(mixed_seed, index, 0);
        case InitializerKind::truncated_normal:
            for (std::uint64_t k = 0; 2 * k + 1 < draws_per_element; ++k)
                if (const double z = counter_normal(mixed_seed, index, k); std::abs(z) <= 2.0) return spec.first + spec.second * z;
            return spec.first;
    }
    return 0.0;
}

/// The shard `shard` describes, drawn in place: element j of the shard is element
/// row_offset * row_elements + j of the whole variable. @pre `shard.problem(...)` is empty.
[[nodiscard]] inline Tensor initial_shard(const ShardInitializer& shard) {
    const InitializerSpec& spec = shard.initializer;
    const std::uint64_t mixed_seed = mix64(spec.seed);
    const std::uint64_t first = static_cast<std::uint64_t>(shard.row_offset) * row_elements(shard.variable_shape);
    return visit_dtype(shard.dtype, [&]<class T>(std::type_identity<T>) {
        xt::xarray<T> out = xt::xarray<T>::from_shape(shard.shard_shape());
        T* p = out.data();
        const std::size_t n = out.size();
        if constexpr (FloatingElement<T>) {
            if (spec.kind == InitializerKind::random_uniform) {
                // Rounding to a float32 may reach maxval: keep U's half-open interval.
                const T high = static_cast<T>(spec.second), low = static_cast<T>(spec.first);
                const T below = high > low ? std::nextafter(high, low) : low;
                for (std::size_t j = 0; j < n; ++j) {
                    const T v = static_cast<T>(initial_element(spec, mixed_seed, first + j));
                    p[j] = v < high ? v : below;
                }
                return Tensor(std::move(out));
            }
        }
        for (std::size_t j = 0; j < n; ++j) p[j] = static_cast<T>(initial_element(spec, mixed_seed, first + j));
        return Tensor(std::move(out));
    });
}

/// The whole variable `spec` draws: what a strategy that keeps variables in this process makes.
[[nodiscard]] inline Tensor initial_value(const InitializerSpec& spec, DType dtype, const Shape& shape) {
    return initial_shard(ShardInitializer{spec, dtype, shape, 0, shape.empty() ? 0 : shape[0]});
}

/// A ShardInitializer's words on the wire (the ids section of a create frame without payload):
/// kind | dtype << 8 | rank << 16, seed, the two parameters' IEEE bits, row offset, rows, the extents.
inline constexpr std::size_t shard_initializer_fixed_words = 6;

[[nodiscard]] inline std::vector<std::int64_t> encode_shard_initializer(const ShardInitializer& shard) {
    auto word = [](std::uint64_t bits) { return static_cast<std::int64_t>(bits); };
    auto double_bits = [](double x) {
        std::uint64_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        return bits;
    };
    std::vector<std::int64_t> words{
        word(static_cast<std::uint64_t>(shard.initializer.kind) | std::uint64_t{static_cast<std::uint8_t>(shard.dtype)} << 8 |
             std::uint64_t{shard.variable_shape.size()} << 16),
        word(shard.initializer.seed),
        word(double_bits(shard.initializer.first)),
        word(double_bits(shard.initializer.second)),
        word(shard.row_offset),
        word(shard.rows)};
    for (std::size_t extent : shard.variable_shape) words.push_back(word(extent));
    return words;
}

/// The ShardInitializer of `words`, or what is wrong with them (checked as a hostile peer's: every
/// field, and the shard's size against `max_bytes`).
[[nodiscard]] inline std::pair<std::optional<ShardInitializer>, std::string> decode_shard_initializer(
    std::span<const std::int64_t> words, std::uint64_t max_bytes) {
    auto fail = [](std::string why) { return std::pair{std::optional<ShardInitializer>{}, std::move(why)}; };
    auto bits = [&](std::size_t i) { return static_cast<std::uint64_t>(words[i]); };
    if (words.size() < shard_initializer_fixed_words)
        return fail("holds " + std::to_string(words.size()) + " words; it takes 6 and one per axis");
    const std::uint64_t head = bits(0);
    const auto kind = static_cast<std::uint8_t>(head & 0xFFu);
    const auto dtype = static_cast<std::uint8_t>((head >> 8) & 0xFFu);
    const std::uint64_t rank = head >> 16;
    if (kind < 1 || kind > 6)
        return fail("kind " + std::to_string(kind) + " is unknown; kinds are 1 (zeros) to 6 (truncated_normal)");
    if (!is_valid_dtype(dtype))
        return fail("dtype byte " + std::to_string(dtype) + " is not a dtype; expected 1 (float32) to 5 (string)");
    if (rank > 8) return fail("rank " + std::to_string(rank) + " exceeds the limit 8");
    if (words.size() != shard_initializer_fixed_words + rank)
        return fail("holds " + std::to_string(words.size()) + " words, but rank " + std::to_string(rank) + " takes " +
                    std::to_string(shard_initializer_fixed_words + rank));
    ShardInitializer shard;
    shard.initializer.kind = static_cast<InitializerKind>(kind);
    shard.initializer.seed = bits(1);
    const std::uint64_t first = bits(2), second = bits(3);
    std::memcpy(&shard.initializer.first, &first, sizeof first);
    std::memcpy(&shard.initializer.second, &second, sizeof second);
    shard.dtype = static_cast<DType>(dtype);
    shard.row_offset = static_cast<std::size_t>(bits(4));
    shard.rows = static_cast<std::size_t>(bits(5));
    for (std::size_t a = 0; a < rank; ++a) shard.variable_shape.push_back(static_cast<std::size_t>(bits(6 + a)));
    if (auto why = shard.problem(max_bytes)) return fail(std::move(*why));
    return {std::move(shard), {}};
}

}  // namespace detail

// ---- implementation ---------------------------------------------------------------------------------

inline std::optional<std::string> InitializerSpec::problem(DType dtype) const {
    const std::string name(initializer_kind_name(kind));
    if (name == "unknown")
        return "initializer kind " + std::to_string(static_cast<int>(kind)) +
               " is unknown; kinds are 1 (zeros) to 6 (truncated_normal)";
    if (dtype == DType::string)
        return name + " cannot fill a string variable; create it from its value";
    if (is_random() && !is_floating(dtype))
        return name + " draws floats, but the variable is " + std::string(dtype_name(dtype)) +
               "; random initializers fill float32 or float64 variables";
    using detail::format_number;
    switch (kind) {
        case InitializerKind::zeros:
        case InitializerKind::ones: break;
        case InitializerKind::constant: {
            if (!std::isfinite(first)) return "constant: value is " + format_number(first) + "; it is a finite number";
            const double limit = dtype == DType::int32 ? 0x1.0p31 : 0x1.0p63;
            if (!is_floating(dtype) && (first != std::trunc(first) || first < -limit || first >= limit))
                return "constant: value is " + format_number(first) + ", not a whole number an " +
                       std::string(dtype_name(dtype)) + " holds";
            break;
        }
        case InitializerKind::random_uniform:
            if (!(std::isfinite(first) && std::isfinite(second) && first <= second && std::isfinite(second - first)))
                return "random_uniform: minval is " + format_number(first) + " and maxval " + format_number(second) +
                       "; they are finite numbers with minval <= maxval (and a finite difference)";
            break;
        case InitializerKind::random_normal:
        case InitializerKind::truncated_normal:
            if (!(std::isfinite(first) && std::isfinite(second) && second >= 0))
                return name + ": mean is " + format_number(first) + " and stddev " + format_number(second) +
                       "; they are finite numbers with stddev >= 0";
            break;
    }
    if (kind != InitializerKind::constant && !is_random() && (first != 0 || second != 0))
        return name + " takes no parameters, but they are " + format_number(first) + " and " + format_number(second);
    return std::nullopt;
}

inline std::optional<std::string> ShardInitializer::problem(std::uint64_t max_bytes) const {
    if (auto why = initializer.problem(dtype)) return why;
    if (variable_shape.empty()) {
        if (row_offset != 0 || rows != 0)
            return "a scalar variable has no rows, but the shard's row offset is " + std::to_string(row_offset) +
                   " and its rows " + std::to_string(rows) + "; both are 0";
    } else if (row_offset > variable_shape[0] || rows > variable_shape[0] - row_offset) {
        return "the shard's " + std::to_string(rows) + " rows from row " + std::to_string(row_offset) +
               " are not inside the variable's " + std::to_string(variable_shape[0]) + " rows";
    }
    // The variable's other axes bound the flat index of every element; the shard's, its memory.
    Shape row = variable_shape;
    if (!row.empty()) row[0] = 1;
    const std::uint64_t size = dtype_size(dtype);
    if (detail::bounded_elements(row, max_bytes / size) < 0 || detail::bounded_elements(shard_shape(), max_bytes / size) < 0)
        return "the shard " + format_shape(shard_shape()) + " of " + std::string(dtype_name(dtype)) + " (variable " +
               format_shape(variable_shape) + ") exceeds the limit " + std::to_string(max_bytes) + " bytes";
    return std::nullopt;
}

PSS_NAMESPACE_END
