// archetypes/cluster_resolver.hpp: ClusterResolverArchetype, the least type that meets pss::ClusterResolver.
#pragma once

#include <string>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/concepts/cluster_resolver.hpp>
#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

namespace archetypes {

/// @brief The least type that meets ClusterResolver: the four const calls and nothing more. Each call
/// returns a type that is only convertible to what the concept names (not a ClusterSpec, std::string or
/// int itself), so code that compiles against it converts the results before using them and relies on
/// nothing the concept does not promise.
///
/// Default-constructible and copyable only so that a strategy can be made from it in a test; the
/// concept requires neither. Its answers follow the concept's semantic rules: a cluster of one chief,
/// one ps and one worker, this task being the chief.
class ClusterResolverArchetype {
public:
    /// @brief Convertible to ClusterSpec, and nothing else.
    class ClusterSpecResult {
    public:
        operator ClusterSpec() const {  // NOLINT(google-explicit-constructor): the archetype's whole point
            return ClusterSpec{{"chief", {"archetype-chief-0:2222"}},
                               {"ps", {"archetype-ps-0:2222"}},
                               {"worker", {"archetype-worker-0:2222"}}};
        }
    };

    /// @brief Convertible to std::string, and nothing else.
    class StringResult {
    public:
        explicit StringResult(const char* value) : value_(value) {}
        operator std::string() const { return value_; }  // NOLINT(google-explicit-constructor)

    private:
        const char* value_;
    };

    /// @brief Convertible to int, and nothing else.
    class IntResult {
    public:
        explicit IntResult(int value) : value_(value) {}
        operator int() const { return value_; }  // NOLINT(google-explicit-constructor)

    private:
        int value_;
    };

    [[nodiscard]] ClusterSpecResult cluster_spec() const { return {}; }
    [[nodiscard]] StringResult task_type() const { return StringResult("chief"); }
    [[nodiscard]] IntResult task_id() const { return IntResult(0); }
    [[nodiscard]] StringResult rpc_layer() const { return StringResult(""); }
};

static_assert(ClusterResolver<ClusterResolverArchetype>,
              "pss: ClusterResolverArchetype must meet ClusterResolver (it defines the concept's least model)");

}  // namespace archetypes

PSS_NAMESPACE_END
