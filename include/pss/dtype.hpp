// pss/dtype.hpp: the element types a variable may hold, and their names as TensorFlow spells them.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <pss/config.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief Element type of a variable or tensor. The numeric values are part of the wire format.
/// `string` is TensorFlow's tf.string: each element a byte string of any length (vocabularies, keys).
enum class DType : std::uint8_t { float32 = 1, float64 = 2, int32 = 3, int64 = 4, string = 5 };

/// @brief True for the C++ types a pss variable may hold: float, double, std::int32_t, std::int64_t.
template <class T>
concept Element = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
                  std::same_as<T, std::int64_t>;

/// @brief True for every element type a Tensor or a variable may hold: an Element, or std::string
/// (DType::string). Strings are read, assigned, gathered, scatter-updated and saved; arithmetic and
/// gradients take Elements only.
template <class T>
concept TensorElement = Element<T> || std::same_as<T, std::string>;

/// @brief True for the element types an optimizer can update (gradients are real numbers).
template <class T>
concept FloatingElement = std::same_as<T, float> || std::same_as<T, double>;

/// @brief The DType of a C++ element type: `dtype_of<float>` is `DType::float32`.
template <TensorElement T>
inline constexpr DType dtype_of = std::same_as<T, float>          ? DType::float32
                                  : std::same_as<T, double>       ? DType::float64
                                  : std::same_as<T, std::int32_t> ? DType::int32
                                  : std::same_as<T, std::int64_t> ? DType::int64
                                                                  : DType::string;

/// @brief TensorFlow's name of a dtype: "float32", "float64", "int32", "int64", "string"; "unknown" otherwise.
[[nodiscard]] constexpr std::string_view dtype_name(DType dtype) noexcept {
    switch (dtype) {
        case DType::float32: return "float32";
        case DType::float64: return "float64";
        case DType::int32: return "int32";
        case DType::int64: return "int64";
        case DType::string: return "string";
    }
    return "unknown";
}

/// @brief Bytes per element of a dtype (TensorFlow's `dtype.size`); 0 for `string` (its elements
/// differ in length) and for a value outside the enum.
[[nodiscard]] constexpr std::size_t dtype_size(DType dtype) noexcept {
    switch (dtype) {
        case DType::float32:
        case DType::int32: return 4;
        case DType::float64:
        case DType::int64: return 8;
        case DType::string: return 0;
    }
    return 0;
}

/// @brief True when `dtype` is float32 or float64, the types a gradient may be applied to.
[[nodiscard]] constexpr bool is_floating(DType dtype) noexcept {
    return dtype == DType::float32 || dtype == DType::float64;
}

/// @brief True when the raw byte `value` names one of the five dtypes (used on untrusted input).
[[nodiscard]] constexpr bool is_valid_dtype(std::uint8_t value) noexcept { return value >= 1 && value <= 5; }

namespace detail {
[[noreturn]] inline void throw_not_numeric() {
    throw InvalidArgumentError(
        "pss: a string value was given where numbers are needed (float32, float64, int32 or int64); string "
        "variables are read, assigned, gathered (sparse_read) and scatter_updated, not computed with");
}
}  // namespace detail

/// @brief Calls `f(std::type_identity<T>{})` with the C++ element type of a numeric `dtype` (an Element).
/// @throws InvalidArgumentError for DType::string, which `visit_any_dtype` takes.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
    switch (dtype) {
        case DType::float32: return std::forward<F>(f)(std::type_identity<float>{});
        case DType::float64: return std::forward<F>(f)(std::type_identity<double>{});
        case DType::int32: return std::forward<F>(f)(std::type_identity<std::int32_t>{});
        case DType::int64: break;
        case DType::string: detail::throw_not_numeric();
    }
    return std::forward<F>(f)(std::type_identity<std::int64_t>{});
}

/// @brief Calls `f(std::type_identity<T>{})` with the C++ element type of any `dtype` (a TensorElement).
template <class F>
decltype(auto) visit_any_dtype(DType dtype, F&& f) {
    if (dtype == DType::string) return std::forward<F>(f)(std::type_identity<std::string>{});
    return visit_dtype(dtype, std::forward<F>(f));
}

PSS_NAMESPACE_END
