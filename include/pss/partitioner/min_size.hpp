// pss/partitioner/min_size.hpp: MinSizePartitioner, as many shards as keep each at least min_shard_bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <pss/config.hpp>
#include <pss/detail/partitioner_support.hpp>
#include <pss/dtype.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A Partitioner that gives each shard at least `min_shard_bytes`, with as many shards as that
/// allows up to `max_shards`: TensorFlow's `MinSizePartitioner`.
///
/// TensorFlow's arithmetic (`min_max_variable_partitioner`), computed exactly in integers:
/// `k = max(1, min(shape[0], max_shards, ceil(num_elements * dtype_size / min_shard_bytes)))`.
/// A [1024, 1024] float32 variable (4 MiB) with the default 256 KiB answers 16 when max_shards >= 16,
/// and max_shards otherwise.
///
/// `bytes_per_string` is TensorFlow's size estimate of a string element: a DType::string variable's
/// elements count as that many bytes each (as TensorFlow's `min_max_variable_partitioner` counts them).
/// @par Example
/// @code
/// pss::MinSizePartitioner p(256 << 10, 16);
/// p(std::array<std::size_t, 2>{1024, 1024}, pss::DType::float32);  // 16
/// @endcode
class MinSizePartitioner {
public:
    /// @brief TensorFlow's defaults: 256 KiB per shard, at most 1 shard, 16 bytes per string.
    constexpr MinSizePartitioner() noexcept = default;

    /// @throws InvalidArgumentError when an argument is below 1, e.g.
    /// `pss: MinSizePartitioner: max_shards is 0, but it must be at least 1 ...`
    constexpr explicit MinSizePartitioner(std::int64_t min_shard_bytes, std::int64_t max_shards = 1,
                                          std::int64_t bytes_per_string = 16)
        : min_shard_bytes_(min_shard_bytes), max_shards_(max_shards), bytes_per_string_(bytes_per_string) {
        if (min_shard_bytes < 1)
            detail::throw_partitioner_argument("MinSizePartitioner", "min_shard_bytes", min_shard_bytes,
                                               "at least 1 (the least size of a shard in bytes; TensorFlow's "
                                               "default is 262144, 256 KiB)");
        if (max_shards < 1)
            detail::throw_partitioner_argument("MinSizePartitioner", "max_shards", max_shards,
                                               "at least 1 (the upper bound on the number of shards)");
        detail::check_bytes_per_string("MinSizePartitioner", bytes_per_string);
    }

    /// @brief max(1, min(shape[0], max_shards, ceil(total bytes / min_shard_bytes))).
    [[nodiscard]] constexpr std::size_t operator()(std::span<const std::size_t> shape, DType dtype) const noexcept {
        if (shape.empty()) return 1;
        const std::size_t total_bytes = detail::saturating_mul(detail::product_from(shape, 0),
                                                              detail::element_bytes(dtype, bytes_per_string_));
        const std::size_t by_size = detail::ceil_div(total_bytes, static_cast<std::size_t>(min_shard_bytes_));
        return std::max<std::size_t>(1, std::min({shape[0], static_cast<std::size_t>(max_shards_), by_size}));
    }

    [[nodiscard]] constexpr std::int64_t min_shard_bytes() const noexcept { return min_shard_bytes_; }
    [[nodiscard]] constexpr std::int64_t max_shards() const noexcept { return max_shards_; }
    [[nodiscard]] constexpr std::int64_t bytes_per_string() const noexcept { return bytes_per_string_; }
    friend constexpr bool operator==(const MinSizePartitioner&, const MinSizePartitioner&) = default;

private:
    std::int64_t min_shard_bytes_ = 256 << 10;
    std::int64_t max_shards_ = 1;
    std::int64_t bytes_per_string_ = 16;
};

PSS_NAMESPACE_END
