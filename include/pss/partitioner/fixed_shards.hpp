// pss/partitioner/fixed_shards.hpp: FixedShardsPartitioner, a fixed number of shards per variable.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

#include <pss/config.hpp>
#include <pss/detail/partitioner_support.hpp>
#include <pss/dtype.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A Partitioner that splits every variable into `num_shards` shards, or into shape[0] shards
/// when it has fewer rows: TensorFlow's `FixedShardsPartitioner`, `min(num_shards, shape[0])`.
///
/// One deviation: a variable with shape[0] == 0 gets 1 (empty) shard where TensorFlow answers 0.
/// @par Example
/// @code
/// pss::FixedShardsPartitioner p(8);
/// p(std::array<std::size_t, 2>{10, 3}, pss::DType::float32);  // 8
/// p(std::array<std::size_t, 1>{5}, pss::DType::float32);      // 5
/// @endcode
class FixedShardsPartitioner {
public:
    /// @brief One shard per variable, the same as NoPartitioner.
    constexpr FixedShardsPartitioner() noexcept = default;

    /// @throws InvalidArgumentError when `num_shards` < 1:
    /// `pss: FixedShardsPartitioner: num_shards is 0, but it must be at least 1 ...`
    constexpr explicit FixedShardsPartitioner(int num_shards) : num_shards_(num_shards) {
        if (num_shards < 1)
            detail::throw_partitioner_argument("FixedShardsPartitioner", "num_shards", num_shards,
                                               "at least 1 (the number of shards each variable is split into)");
    }

    /// @brief min(num_shards, shape[0]), and at least 1.
    [[nodiscard]] constexpr std::size_t operator()(std::span<const std::size_t> shape, DType /*dtype*/) const noexcept {
        if (shape.empty()) return 1;
        return std::max<std::size_t>(1, std::min(static_cast<std::size_t>(num_shards_), shape[0]));
    }

    [[nodiscard]] constexpr int num_shards() const noexcept { return num_shards_; }
    friend constexpr bool operator==(const FixedShardsPartitioner&, const FixedShardsPartitioner&) = default;

private:
    int num_shards_ = 1;
};

PSS_NAMESPACE_END
