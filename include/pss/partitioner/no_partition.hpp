// pss/partitioner/no_partition.hpp: NoPartitioner, every variable is one shard.
#pragma once

#include <cstddef>
#include <span>

#include <pss/config.hpp>
#include <pss/dtype.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A Partitioner that never splits: every variable is one shard on one ps task.
///
/// What `ParameterServerStrategy` does when it is given no `variable_partitioner` (TensorFlow's
/// `variable_partitioner=None`). The strategy's default.
/// @par Example
/// @code
/// const std::array<std::size_t, 2> shape{1024, 1024};
/// pss::NoPartitioner{}(shape, pss::DType::float32);  // 1
/// @endcode
struct NoPartitioner {
    /// @brief Always 1.
    [[nodiscard]] constexpr std::size_t operator()(std::span<const std::size_t> /*shape*/,
                                                   DType /*dtype*/) const noexcept {
        return 1;
    }
    friend constexpr bool operator==(const NoPartitioner&, const NoPartitioner&) = default;
};

PSS_NAMESPACE_END
