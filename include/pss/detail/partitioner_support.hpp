// pss/detail/partitioner_support.hpp: shape arithmetic and argument errors shared by the partitioners.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief a * b, or SIZE_MAX when the product does not fit (a shape's byte count never wraps around).
[[nodiscard]] constexpr std::size_t saturating_mul(std::size_t a, std::size_t b) noexcept {
    if (a != 0 && b > std::numeric_limits<std::size_t>::max() / a) return std::numeric_limits<std::size_t>::max();
    return a * b;
}

/// @brief Product of `shape[first:]` (1 for an empty range), saturating.
[[nodiscard]] constexpr std::size_t product_from(std::span<const std::size_t> shape, std::size_t first) noexcept {
    std::size_t n = 1;
    for (std::size_t i = first; i < shape.size(); ++i) n = saturating_mul(n, shape[i]);
    return n;
}

/// @brief ceil(a / b) for b > 0, without overflow.
[[nodiscard]] constexpr std::size_t ceil_div(std::size_t a, std::size_t b) noexcept {
    return a / b + (a % b != 0 ? 1 : 0);
}

/// @brief Throws InvalidArgumentError: "pss: <who>: <argument> is <value>, but it must be <rule>".
[[noreturn]] inline void throw_partitioner_argument(std::string_view who, std::string_view argument,
                                                    std::int64_t value, std::string_view rule) {
    throw InvalidArgumentError("pss: " + std::string(who) + ": " + std::string(argument) + " is " +
                               std::to_string(value) + ", but it must be " + std::string(rule));
}

/// @brief The check of a size partitioner's `bytes_per_string` (TensorFlow's default is 16).
constexpr void check_bytes_per_string(std::string_view who, std::int64_t bytes_per_string) {
    if (bytes_per_string < 1)
        throw_partitioner_argument(who, "bytes_per_string", bytes_per_string,
                                   "at least 1 (the size estimate of a string element; default 16)");
}

/// Bytes a size partitioner counts per element: the dtype's size, or `bytes_per_string` for a string.
[[nodiscard]] constexpr std::size_t element_bytes(DType dtype, std::int64_t bytes_per_string) noexcept {
    return dtype == DType::string ? static_cast<std::size_t>(bytes_per_string) : dtype_size(dtype);
}

}  // namespace detail

PSS_NAMESPACE_END
