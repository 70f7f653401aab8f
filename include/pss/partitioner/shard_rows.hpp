// pss/partitioner/shard_rows.hpp: how the rows of axis 0 are divided among k shards (TensorFlow's rule).
#pragma once

#include <cstddef>
#include <vector>

#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

/// @brief Where a row of the whole variable lives: which shard, and which row inside that shard.
struct ShardRow {
    std::size_t shard = 0;      ///< index of the shard, 0 <= shard < k
    std::size_t local_row = 0;  ///< row inside that shard
    friend constexpr bool operator==(const ShardRow&, const ShardRow&) = default;
};

/// @brief Rows of shard `shard` when `dim0` rows are split into `num_shards` shards.
///
/// TensorFlow's rule (ShardedVariable, create_partitioned_variables): every shard gets
/// `dim0 / num_shards` rows and the first `dim0 % num_shards` shards one more, so 10 rows over 3 shards
/// are 4, 3, 3.
/// @pre 1 <= num_shards and shard < num_shards (0 is answered otherwise, never undefined behaviour)
[[nodiscard]] constexpr std::size_t shard_rows(std::size_t dim0, std::size_t num_shards, std::size_t shard) noexcept {
    if (num_shards == 0 || shard >= num_shards) return 0;
    return dim0 / num_shards + (shard < dim0 % num_shards ? 1 : 0);
}

/// @brief First row (in the whole variable) of shard `shard`; `shard_row_offset(dim0, k, k)` is dim0.
/// @pre 1 <= num_shards and shard <= num_shards (dim0 is answered for a larger shard)
[[nodiscard]] constexpr std::size_t shard_row_offset(std::size_t dim0, std::size_t num_shards,
                                                     std::size_t shard) noexcept {
    if (num_shards == 0 || shard >= num_shards) return dim0;
    const std::size_t extra = dim0 % num_shards;
    return shard * (dim0 / num_shards) + (shard < extra ? shard : extra);
}

/// @brief The row counts of all `num_shards` shards: `shard_row_counts(10, 3)` is [4, 3, 3].
/// (A vector, usable in constant expressions, rather than a view: clang 14 cannot compile libstdc++ 12's
/// `iota | transform`.)
[[nodiscard]] constexpr std::vector<std::size_t> shard_row_counts(std::size_t dim0, std::size_t num_shards) {
    std::vector<std::size_t> counts;  // filled by push_back: clang 14 cannot evaluate a sized vector's fill
    counts.reserve(num_shards);
    for (std::size_t i = 0; i < num_shards; ++i) counts.push_back(shard_rows(dim0, num_shards, i));
    return counts;
}

/// @brief shard_of_row() for the rows of one split, its divisions of `dim0` done once: an embedding
/// lookup places every id of a batch.
class RowSplit {
public:
    /// @pre 1 <= num_shards <= max(dim0, 1) (a split of 0 shards places every row in shard 0)
    constexpr RowSplit(std::size_t dim0, std::size_t num_shards) noexcept
        : num_shards_(num_shards),
          base_(num_shards == 0 ? 0 : dim0 / num_shards),
          extra_(num_shards == 0 ? 0 : dim0 % num_shards),
          boundary_(extra_ * (base_ + 1)),
          longer_(base_ + 1, dim0),
          shorter_(base_, dim0) {}

    /// @pre row < dim0
    [[nodiscard]] constexpr ShardRow operator()(std::size_t row) const noexcept {
        if (num_shards_ == 0) return {};
        if (row < boundary_) {
            const std::size_t shard = longer_.quotient(row);
            return {shard, row - shard * (base_ + 1)};
        }
        if (base_ == 0) return {num_shards_, 0};  // row >= dim0: outside every shard
        const std::size_t past = row - boundary_, shard = shorter_.quotient(past);
        return {extra_ + shard, past - shard * base_};
    }

private:
    /// n / d by one multiplication for n and d below 2^32 (Lemire, Kaser and Kurz, "Faster Remainder by
    /// Direct Computation", 2019: with M = floor((2^64 - 1) / d) + 1, n / d is the high word of M n): an
    /// embedding lookup places 4096 ids a batch, and a division costs tens of cycles. Larger tables divide.
    class Divisor {
    public:
        constexpr Divisor(std::size_t d, std::size_t dim0) noexcept
            : d_(d), m_(d > 1 && dim0 <= 0xFFFFFFFFu ? 0xFFFFFFFFFFFFFFFFu / d + 1 : 0) {}
        [[nodiscard]] constexpr std::size_t quotient(std::size_t n) const noexcept {
            __extension__ using wide = unsigned __int128;
            if (m_ == 0) return d_ == 1 ? n : n / d_;
            return static_cast<std::size_t>((static_cast<wide>(m_) * n) >> 64);
        }

    private:
        std::size_t d_;
        unsigned long long m_;
    };

    std::size_t num_shards_;
    std::size_t base_;      // rows of the shards without one more
    std::size_t extra_;     // shards with one row more, the first ones
    std::size_t boundary_;  // rows held by the shards with one row more
    Divisor longer_;        // by base_ + 1
    Divisor shorter_;       // by base_
};

/// @brief The shard holding row `row` of the whole variable, and the row's index inside it.
/// @pre 1 <= num_shards <= max(dim0, 1) and row < dim0
[[nodiscard]] constexpr ShardRow shard_of_row(std::size_t dim0, std::size_t num_shards, std::size_t row) noexcept {
    return RowSplit(dim0, num_shards)(row);
}

PSS_NAMESPACE_END
