// pss/detail/request_rules.hpp: what makes a variable operation valid, and the row arithmetic it uses;
// shared by the client handle (Variable), which checks before sending, and the ps, which checks again.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// An integer scatter_div by 0 has no value (and would end the process): refused before anything changes.
inline void check_no_zero_divisor(const std::string& what, const Tensor& divisor) {
    const std::size_t at = divisor.visit(
        [](const auto& a) {
            using T = typename std::decay_t<decltype(a)>::value_type;
            return static_cast<std::size_t>(std::find(a.data(), a.data() + a.size(), T{0}) - a.data());
        },
        std::size_t{0});
    if (at == divisor.size()) return;
    const std::size_t width = row_elements(divisor.shape());
    throw InvalidArgumentError("pss: " + what + ": row " + std::to_string(at / std::max<std::size_t>(width, 1)) +
                               " of the divisor holds 0; an integer variable cannot be divided by zero, so nothing "
                               "was changed");
}

/// The element arithmetic of the scatter family. Integers wrap around on overflow, as TensorFlow's
/// kernels do on every machine it runs on (where C++'s signed overflow is undefined): the ps does not
/// fault on what a peer sends. Floating values follow IEEE 754 (a division by zero gives infinity).
template <Op K, class T>
[[nodiscard]] constexpr T combine_elements(T a, T b) noexcept {
    static_assert(is_scatter(K));
    constexpr bool arithmetic = K == Op::scatter_add || K == Op::scatter_sub || K == Op::scatter_mul || K == Op::scatter_div;
    if constexpr (std::is_integral_v<T> && arithmetic) {
        using U = std::make_unsigned_t<T>;
        const U x = static_cast<U>(a), y = static_cast<U>(b);
        if constexpr (K == Op::scatter_add) return static_cast<T>(x + y);
        if constexpr (K == Op::scatter_sub) return static_cast<T>(x - y);
        if constexpr (K == Op::scatter_mul) return static_cast<T>(x * y);
        // b != 0 (check_no_zero_divisor); -1 negates, so that the lowest value wraps to itself
        if constexpr (K == Op::scatter_div) return b == T(-1) ? static_cast<T>(U{0} - x) : static_cast<T>(a / b);
    } else {
        if constexpr (K == Op::scatter_add) return a + b;
        if constexpr (K == Op::scatter_sub) return a - b;
        if constexpr (K == Op::scatter_mul) return a * b;
        if constexpr (K == Op::scatter_div) return a / b;
        if constexpr (K == Op::scatter_min) return b < a ? b : a;
        if constexpr (K == Op::scatter_max) return a < b ? b : a;
        if constexpr (K == Op::scatter_update) return b;
    }
}

/// Checks an operation's payload and ids against a shard (or variable) named `variable` + `suffix`
/// (a handle's ":0"), of `shape` and `dtype`, before anything changes. The messages name the operation
/// and the variable: "scatter_add on variable 'emb:0'" (built only when one is raised: this runs for
/// every request).
inline void validate_request(Op op, std::string_view variable, const Shape& shape, DType dtype, const Tensor& payload,
                             std::span<const std::int64_t> ids, std::string_view suffix = {}) {
    const auto what = [&] {
        return std::string(op_name(op)) + " on variable '" + std::string(variable) + std::string(suffix) + "'";
    };
    auto mismatch = [&](const Shape& expected_shape) {
        if (!payload.has_value())
            throw InvalidArgumentError("pss: " + what() + ": expected a value of shape " + format_shape(expected_shape) +
                                       " dtype " + std::string(dtype_name(dtype)) + ", got none");
        if (payload.dtype() != dtype || payload.shape() != expected_shape)
            throw InvalidArgumentError("pss: " + what() + ": expected shape " + format_shape(expected_shape) + " dtype " +
                                       std::string(dtype_name(dtype)) + ", got shape " +
                                       format_shape(payload.shape()) + " dtype " +
                                       std::string(dtype_name(payload.dtype())));
    };
    const bool sparse = is_scatter(op) || op == Op::gather || op == Op::apply_sparse;
    if (dtype == DType::string && !(op == Op::read || op == Op::gather || op == Op::assign || op == Op::scatter_update))
        throw InvalidArgumentError("pss: " + what() + ": a string variable is read, assigned, gathered (sparse_read) and "
                                   "scatter_updated; " + std::string(op_name(op)) + " computes with numbers");
    if ((op == Op::apply_dense || op == Op::apply_sparse) && !is_floating(dtype))
        throw FailedPreconditionError("pss: " + what() + ": a gradient cannot be applied to a variable of dtype " +
                                      std::string(dtype_name(dtype)) + "; only float32 and float64 variables train");
    if (sparse) {
        if (shape.empty())
            throw InvalidArgumentError("pss: " + what() + ": row operations need a variable of rank 1 or more, got a scalar");
        for (std::int64_t id : ids)
            if (id < 0 || static_cast<std::uint64_t>(id) >= shape[0])
                throw InvalidArgumentError("pss: " + what() + ": id " + std::to_string(id) + " is out of range for shape " +
                                           format_shape(shape) + "; ids must be in [0, " + std::to_string(shape[0]) +
                                           ")");  // TensorFlow's type for an index out of range
        if (op != Op::gather) mismatch(rows_shape(shape, ids.size()));
        if (op == Op::scatter_div && !is_floating(dtype)) check_no_zero_divisor(what(), payload);
    } else if (op == Op::assign || op == Op::assign_add || op == Op::assign_sub || op == Op::apply_dense) {
        mismatch(shape);
    }
}

/// Copies rows [begin, begin + count) of `value` into a new tensor.
inline Tensor slice_rows(const Tensor& value, std::size_t begin, std::size_t count) {
    if (!value.has_value()) return {};
    Tensor out = Tensor::uninitialized(value.dtype(), rows_shape(value.shape(), count));
    RowCopy(out, value)(0, begin, count);
    return out;
}

/// Copies the block [from[d], to[d]) of each axis d of `value` (from and to one entry per axis, within
/// the shape) into a new tensor: runs of the last axis at once (a memcpy for numbers), whatever the dtype.
inline Tensor slice_block(const Tensor& value, const Shape& from, const Shape& to) {
    return value.visit_any(
        [&](const auto& a) {
            using T = typename std::decay_t<decltype(a)>::value_type;
            const Shape shape(a.shape().begin(), a.shape().end());
            Shape out_shape(shape.size());
            for (std::size_t d = 0; d < shape.size(); ++d) out_shape[d] = to[d] - from[d];
            auto out = xt::xarray<T>::from_shape(out_shape);
            if (out.size() == 0) return Tensor(std::move(out));
            const std::size_t rank = shape.size();
            std::vector<std::size_t> stride(rank, 1);  // in elements
            for (std::size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
            const std::size_t run = out_shape[rank - 1];
            std::vector<std::size_t> at(rank, 0);  // the block's index of the run being copied (its last axis 0)
            for (T* target = out.data(); target != out.data() + out.size(); target += run) {
                std::size_t offset = 0;
                for (std::size_t d = 0; d < rank; ++d) offset += (from[d] + at[d]) * stride[d];
                std::copy_n(a.data() + offset, run, target);
                for (std::size_t d = rank - 1; d-- > 0;) {  // the next run: an odometer over every axis but the last
                    if (++at[d] < out_shape[d]) break;
                    at[d] = 0;
                }
            }
            return Tensor(std::move(out));
        },
        Tensor{});
}

}  // namespace detail

PSS_NAMESPACE_END
