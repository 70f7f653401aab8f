// archetypes/consistency.hpp: ConsistencyArchetype, the least type that meets pss::Consistency.
#pragma once

#include <pss/concepts/consistency.hpp>
#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

namespace archetypes {

/// @brief Only the two constants the Consistency concept asks for, of the least types that convert:
/// not constructible, so a strategy that makes an object of its policy fails to compile with it.
struct ConsistencyArchetype {
    ConsistencyArchetype() = delete;
    static constexpr int synchronous = 0;     // convertible to bool
    static constexpr unsigned staleness = 0;  // convertible to std::uint64_t
};

static_assert(Consistency<ConsistencyArchetype>);

}  // namespace archetypes

PSS_NAMESPACE_END
