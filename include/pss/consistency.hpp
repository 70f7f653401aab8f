// pss/consistency.hpp: the models of Consistency: Asynchronous, BoundedStaleness<S> and Synchronous.
#pragma once

#include <cstdint>

#include <pss/concepts/consistency.hpp>
#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

/// @brief TensorFlow's only mode: each push is applied when it arrives; pulls never wait.
struct Asynchronous {
    static constexpr bool synchronous = false;
    static constexpr std::uint64_t staleness = 0;
};

/// @brief Stale-synchronous parallel (Petuum's SSP) with bound `Staleness`: the ps applies step k once,
/// from the mean of every worker's gradient for step k, steps in order; a pull for step k waits until
/// steps up to k - 1 - Staleness are applied, so a worker runs at most `Staleness` steps ahead of the
/// slowest. Every push and pull names its step (1, 2, ...).
template <std::uint64_t Staleness>
struct BoundedStaleness {
    static constexpr bool synchronous = true;
    static constexpr std::uint64_t staleness = Staleness;
};

/// @brief Synchronous training: step k's update is the mean of all workers' step-k gradients, and a
/// pull for step k + 1 sees it. The same as BoundedStaleness<0>.
using Synchronous = BoundedStaleness<0>;

static_assert(Consistency<Asynchronous> && Consistency<Synchronous> && Consistency<BoundedStaleness<3>>);

PSS_NAMESPACE_END
