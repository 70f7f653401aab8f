// archetypes/partitioner.hpp: PartitionerArchetype, the least type that meets pss::Partitioner.
#pragma once

#include <cstddef>
#include <span>

#include <pss/config.hpp>
#include <pss/concepts/partitioner.hpp>
#include <pss/dtype.hpp>

PSS_NAMESPACE_BEGIN

namespace archetypes {

/// @brief Only what the Partitioner concept asks: copyable, and a const call answering a shard count.
/// Not default constructible, not comparable, no noexcept, no constexpr: a strategy that needs more
/// than the concept documents fails to compile with it. Answers 1 (always valid).
class PartitionerArchetype {
public:
    explicit PartitionerArchetype(int /*tag*/) {}
    PartitionerArchetype(const PartitionerArchetype&) = default;
    PartitionerArchetype& operator=(const PartitionerArchetype&) = delete;

    std::size_t operator()(std::span<const std::size_t> /*shape*/, DType /*dtype*/) const { return 1; }
};

static_assert(Partitioner<PartitionerArchetype>);

}  // namespace archetypes

PSS_NAMESPACE_END
