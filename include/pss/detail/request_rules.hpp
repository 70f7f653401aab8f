// pss/detail/request_rules.hpp: what makes a variable operation valid, and the row arithmetic it uses;
// shared by the client handle (Variable), which checks before sending, and the ps, which checks again.
#pragma once

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

/// Checks an operation's payload and ids against a shard (or variable) of `shape` and `dtype` before
/// anything changes. `what` names the variable in the message: "scatter_add on variable 'emb'".
inline void validate_request(Op op, const std::string& what, const Shape& shape, DType dtype, const Tensor& payload,
                             std::span<const std::int64_t> ids) {
    auto mismatch = [&](const Shape& expected_shape) {
        if (!payload.has_value())
            throw InvalidArgumentError("pss: " + what + ": expected a value of shape " + format_shape(expected_shape) +
                                       " dtype " + std::string(dtype_name(dtype)) + ", got none");
        if (payload.dtype() != dtype || payload.shape() != expected_shape)
            throw InvalidArgumentError("pss: " + what + ": expected shape " + format_shape(expected_shape) + " dtype " +
                                       std::string(dtype_name(dtype)) + ", got shape " +
                                       format_shape(payload.shape()) + " dtype " +
                                       std::string(dtype_name(payload.dtype())));
    };
    const bool sparse = op == Op::scatter_add || op == Op::scatter_sub || op == Op::scatter_update ||
                        op == Op::gather || op == Op::apply_sparse;
    if ((op == Op::apply_dense || op == Op::apply_sparse) && !is_floating(dtype))
        throw FailedPreconditionError("pss: " + what + ": a gradient cannot be applied to a variable of dtype " +
                                      std::string(dtype_name(dtype)) + "; only float32 and float64 variables train");
    if (sparse) {
        if (shape.empty())
            throw InvalidArgumentError("pss: " + what + ": row operations need a variable of rank 1 or more, got a scalar");
        for (std::int64_t id : ids)
            if (id < 0 || static_cast<std::uint64_t>(id) >= shape[0])
                throw InvalidArgumentError("pss: " + what + ": id " + std::to_string(id) + " is out of range for shape " +
                                           format_shape(shape) + "; ids must be in [0, " + std::to_string(shape[0]) +
                                           ")");  // TensorFlow's type for an index out of range
        if (op != Op::gather) mismatch(rows_shape(shape, ids.size()));
    } else if (op == Op::assign || op == Op::assign_add || op == Op::assign_sub || op == Op::apply_dense) {
        mismatch(shape);
    }
}

/// Copies rows [begin, begin + count) of `value` into a new tensor.
inline Tensor slice_rows(const Tensor& value, std::size_t begin, std::size_t count) {
    return value.visit(
        [&](const auto& a) {
            using T = typename std::decay_t<decltype(a)>::value_type;
            const Shape shape(a.shape().begin(), a.shape().end());
            const std::size_t width = row_elements(shape);
            xt::xarray<T> out = xt::xarray<T>::from_shape(rows_shape(shape, count));
            std::memcpy(out.data(), a.data() + begin * width, count * width * sizeof(T));
            return Tensor(std::move(out));
        },
        Tensor{});
}

}  // namespace detail

PSS_NAMESPACE_END
