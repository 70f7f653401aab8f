// pss/concepts/partitioner.hpp: the Partitioner concept, how many shards a variable gets.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include <pss/config.hpp>
#include <pss/dtype.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief Requirement 1 of Partitioner: the strategy keeps its own copy of the policy.
template <class P>
concept partitioner_copy_constructible = std::copy_constructible<P>;

/// @brief Requirement 2 of Partitioner: a const partitioner, called with a variable's shape and dtype,
/// answers a number of shards along axis 0.
template <class P>
concept partitioner_returns_shard_count = requires(const P& p, std::span<const std::size_t> shape, DType dtype) {
    { p(shape, dtype) } -> std::convertible_to<std::size_t>;
};

}  // namespace detail

/// @brief Partitioner: decides how many shards a variable of a given shape and dtype is split into.
///
/// The counterpart of `tf.distribute.experimental.partitioners.Partitioner`. pss splits along axis 0
/// only (as TensorFlow's ParameterServerStrategy does), so a partitioner answers one number where
/// TensorFlow answers a list with 1 on every other axis.
///
/// @par Requirements
/// `p` is a `const P`, `shape` a `std::span<const std::size_t>` (the whole variable's shape, rank >= 1),
/// `dtype` a `pss::DType`.
///
/// | expression | type | semantics |
/// | --- | --- | --- |
/// | `P(p)` | `P` | copies the policy (the strategy keeps its own copy) |
/// | `p(shape, dtype)` | convertible to `std::size_t` | the number of shards k along axis 0 |
///
/// @par Rules the compiler cannot check
/// - 1 <= k <= shape[0] (for shape[0] == 0 the only valid answer is 1: one empty shard). The strategy
///   validates the answer and throws InvalidArgumentError naming the variable when it is 0 or larger
///   than shape[0].
/// - Only axis 0 is split; every other axis stays whole. Shard i gets shape[0] / k rows, and the first
///   shape[0] % k shards one row more (TensorFlow's rule; see shard_rows()).
/// - The answer depends on `shape` and `dtype` only (and the policy's own settings): the same call
///   answers the same k every time, on every task.
/// - It is never called for a rank-0 shape (a scalar variable is always one shard).
/// - A call may throw; the strategy lets the exception through and creates no shard.
///
/// @par Models
/// NoPartitioner, FixedShardsPartitioner, MinSizePartitioner, MaxSizePartitioner; the least model is
/// `pss::archetypes::PartitionerArchetype` (tests/archetypes/partitioner.hpp).
///
/// @par Example
/// @code
/// struct TwoShards {
///     std::size_t operator()(std::span<const std::size_t> shape, pss::DType) const {
///         return shape[0] >= 2 ? 2 : 1;
///     }
/// };
/// static_assert(pss::Partitioner<TwoShards>);
/// @endcode
template <class P>
concept Partitioner = detail::partitioner_copy_constructible<P> && detail::partitioner_returns_shard_count<P>;

PSS_NAMESPACE_END
