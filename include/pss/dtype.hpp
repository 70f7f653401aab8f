// pss/dtype.hpp: the element types a variable may hold, and their names as TensorFlow spells them.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

/// @brief Element type of a variable or tensor. The numeric values are part of the wire format.
enum class DType : std::uint8_t { float32 = 1, float64 = 2, int32 = 3, int64 = 4 };

/// @brief True for the C++ types a pss variable may hold: float, double, std::int32_t, std::int64_t.
template <class T>
concept Element = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
                  std::same_as<T, std::int64_t>;

/// @brief True for the element types an optimizer can update (gradients are real numbers).
template <class T>
concept FloatingElement = std::same_as<T, float> || std::same_as<T, double>;

/// @brief The DType of a C++ element type: `dtype_of<float>` is `DType::float32`.
template <Element T>
inline constexpr DType dtype_of = std::same_as<T, float>          ? DType::float32
                                  : std::same_as<T, double>       ? DType::float64
                                  : std::same_as<T, std::int32_t> ? DType::int32
                                                                  : DType::int64;

/// @brief TensorFlow's name of a dtype: "float32", "float64", "int32", "int64"; "unknown" otherwise.
[[nodiscard]] constexpr std::string_view dtype_name(DType dtype) noexcept {
    switch (dtype) {
        case DType::float32: return "float32";
        case DType::float64: return "float64";
        case DType::int32: return "int32";
        case DType::int64: return "int64";
    }
    return "unknown";
}

/// @brief Bytes per element of a dtype (TensorFlow's `dtype.size`); 0 for a value outside the enum.
[[nodiscard]] constexpr std::size_t dtype_size(DType dtype) noexcept {
    switch (dtype) {
        case DType::float32:
        case DType::int32: return 4;
        case DType::float64:
        case DType::int64: return 8;
    }
    return 0;
}

/// @brief True when `dtype` is float32 or float64, the types a gradient may be applied to.
[[nodiscard]] constexpr bool is_floating(DType dtype) noexcept {
    return dtype == DType::float32 || dtype == DType::float64;
}

/// @brief True when the raw byte `value` names one of the four dtypes (used on untrusted input).
[[nodiscard]] constexpr bool is_valid_dtype(std::uint8_t value) noexcept { return value >= 1 && value <= 4; }

/// @brief Calls `f(std::type_identity<T>{})` with the C++ element type of `dtype`.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
    switch (dtype) {
        case DType::float32: return std::forward<F>(f)(std::type_identity<float>{});
        case DType::float64: return std::forward<F>(f)(std::type_identity<double>{});
        case DType::int32: return std::forward<F>(f)(std::type_identity<std::int32_t>{});
        case DType::int64: break;
    }
    return std::forward<F>(f)(std::type_identity<std::int64_t>{});
}

PSS_NAMESPACE_END
