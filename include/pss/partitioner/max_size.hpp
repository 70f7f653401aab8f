// pss/partitioner/max_size.hpp: MaxSizePartitioner, as few shards as keep each below max_shard_bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <pss/config.hpp>
#include <pss/detail/partitioner_support.hpp>
#include <pss/dtype.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A Partitioner that keeps each shard at most `max_shard_bytes` where splitting axis 0 allows
/// it, with as few shards as that takes: TensorFlow's `MaxSizePartitioner`.
///
/// TensorFlow's arithmetic (`variable_axis_size_partitioner`), computed exactly in integers:
/// - `bytes_per_slice = (num_elements / shape[0]) * dtype_size` (one row of axis 0; a string element
///   counts as `bytes_per_string` bytes, as TensorFlow counts it),
/// - `slices_per_shard = max(1, floor(max_shard_bytes / bytes_per_slice))`,
/// - `k = ceil(shape[0] / slices_per_shard)`, then `min(k, max_shards)` when `max_shards` is not 0.
///
/// A single row larger than `max_shard_bytes` cannot be split (only axis 0 is), so then every row is
/// its own shard and shards exceed the limit; `max_shards` also takes precedence over the limit.
/// A variable with shape[0] == 0 or with empty rows gets 1 shard (TensorFlow divides by zero there).
/// @par Example
/// @code
/// pss::MaxSizePartitioner p(4);                                // at most 4 bytes a shard
/// p(std::array<std::size_t, 2>{6, 1}, pss::DType::float32);   // 6
/// pss::MaxSizePartitioner(4, 2)(std::array<std::size_t, 2>{6, 1}, pss::DType::float32);  // 2
/// @endcode
class MaxSizePartitioner {
public:
    /// @param max_shard_bytes the most bytes a shard should hold (TensorFlow suggests (64 << 20) - 1)
    /// @param max_shards the most shards; 0 (the default) means no limit, TensorFlow's None
    /// @param bytes_per_string the size estimate of a string element (TensorFlow's default, 16)
    /// @throws InvalidArgumentError when max_shard_bytes or bytes_per_string is below 1 or max_shards is
    /// negative, e.g. `pss: MaxSizePartitioner: max_shard_bytes is 0, but it must be at least 1 ...`
    constexpr explicit MaxSizePartitioner(std::int64_t max_shard_bytes, std::int64_t max_shards = 0,
                                          std::int64_t bytes_per_string = 16)
        : max_shard_bytes_(max_shard_bytes), max_shards_(max_shards), bytes_per_string_(bytes_per_string) {
        if (max_shard_bytes < 1)
            detail::throw_partitioner_argument("MaxSizePartitioner", "max_shard_bytes", max_shard_bytes,
                                               "at least 1 (the most bytes a shard should hold, e.g. (64 << 20) - 1)");
        if (max_shards < 0)
            detail::throw_partitioner_argument("MaxSizePartitioner", "max_shards", max_shards,
                                               "at least 1, or 0 for no limit on the number of shards");
        detail::check_bytes_per_string("MaxSizePartitioner", bytes_per_string);
    }

    /// @brief ceil(shape[0] / max(1, floor(max_shard_bytes / bytes of one row))), capped by max_shards.
    [[nodiscard]] constexpr std::size_t operator()(std::span<const std::size_t> shape, DType dtype) const noexcept {
        if (shape.empty() || shape[0] == 0) return 1;
        const std::size_t bytes_per_slice = detail::saturating_mul(detail::product_from(shape, 1),
                                                                  detail::element_bytes(dtype, bytes_per_string_));
        if (bytes_per_slice == 0) return 1;
        const std::size_t slices_per_shard =
            std::max<std::size_t>(1, static_cast<std::size_t>(max_shard_bytes_) / bytes_per_slice);
        std::size_t shards = detail::ceil_div(shape[0], slices_per_shard);
        if (max_shards_ > 0) shards = std::min(shards, static_cast<std::size_t>(max_shards_));
        return shards;
    }

    [[nodiscard]] constexpr std::int64_t max_shard_bytes() const noexcept { return max_shard_bytes_; }
    /// @brief The most shards, 0 for no limit.
    [[nodiscard]] constexpr std::int64_t max_shards() const noexcept { return max_shards_; }
    [[nodiscard]] constexpr std::int64_t bytes_per_string() const noexcept { return bytes_per_string_; }
    friend constexpr bool operator==(const MaxSizePartitioner&, const MaxSizePartitioner&) = default;

private:
    std::int64_t max_shard_bytes_;
    std::int64_t max_shards_;
    std::int64_t bytes_per_string_;
};

PSS_NAMESPACE_END
