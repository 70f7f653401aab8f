// pss/concepts/consistency.hpp: the Consistency concept, when a parameter server applies pushed gradients.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief Requirement 1 of Consistency: `C::synchronous`, a constant that says whether pushes are
/// gathered per step.
template <class C>
concept consistency_says_whether_synchronous = requires {
    { C::synchronous } -> std::convertible_to<bool>;
    typename std::bool_constant<static_cast<bool>(C::synchronous)>;  // a constant expression
};

/// @brief Requirement 2 of Consistency: `C::staleness`, a constant step count.
template <class C>
concept consistency_has_staleness_bound = requires {
    { C::staleness } -> std::convertible_to<std::uint64_t>;
    typename std::integral_constant<std::uint64_t, static_cast<std::uint64_t>(C::staleness)>;
};

}  // namespace detail

/// @brief Consistency: when a parameter server applies the gradients that workers push, and how far a
/// pull may run ahead of the applied steps.
///
/// @par Requirements
/// | expression | type | semantics |
/// | --- | --- | --- |
/// | `C::synchronous` | constant convertible to `bool` | false: each push is applied when it arrives and pulls never wait (TensorFlow's mode); true: the ps applies step k once, from the mean of every worker's step-k gradient, steps in order (fragment `consistency_says_whether_synchronous`) |
/// | `C::staleness` | constant convertible to `std::uint64_t` | when synchronous: a pull for step k waits until step k - 1 - staleness is applied; ignored otherwise (fragment `consistency_has_staleness_bound`) |
///
/// @par Rules the compiler cannot check
/// - When `C::synchronous`, every push and every pull names its step (1, 2, ...), and every worker
///   pushes to every trained variable at each step (Sequential::fit does).
///
/// @par Models
/// Asynchronous, BoundedStaleness<S>, Synchronous (= BoundedStaleness<0>), in consistency.hpp; the
/// least model is `pss::archetypes::ConsistencyArchetype` (tests/archetypes/consistency.hpp).
template <class C>
concept Consistency = detail::consistency_says_whether_synchronous<C> && detail::consistency_has_staleness_bound<C>;

PSS_NAMESPACE_END
