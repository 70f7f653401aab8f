// pss/concepts/cluster_resolver.hpp: the ClusterResolver concept: who is in the cluster and who this task is.
#pragma once

#include <concepts>
#include <string>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief Requirement 1 of ClusterResolver: `r.cluster_spec()` on a const resolver gives a ClusterSpec.
template <class R>
concept cluster_resolver_has_cluster_spec = requires(const R& r) {
    { r.cluster_spec() } -> std::convertible_to<ClusterSpec>;
};

/// @brief Requirement 2 of ClusterResolver: `r.task_type()` on a const resolver gives a job name string.
template <class R>
concept cluster_resolver_has_task_type = requires(const R& r) {
    { r.task_type() } -> std::convertible_to<std::string>;
};

/// @brief Requirement 3 of ClusterResolver: `r.task_id()` on a const resolver gives the task's int index.
template <class R>
concept cluster_resolver_has_task_id = requires(const R& r) {
    { r.task_id() } -> std::convertible_to<int>;
};

/// @brief Requirement 4 of ClusterResolver: `r.rpc_layer()` on a const resolver gives a protocol string.
template <class R>
concept cluster_resolver_has_rpc_layer = requires(const R& r) {
    { r.rpc_layer() } -> std::convertible_to<std::string>;
};

}  // namespace detail

/// @brief ClusterResolver: says who is in the cluster and which task this process is. The policy
/// `ParameterServerStrategy` takes as its fourth template argument, the counterpart of
/// `tf.distribute.cluster_resolver.ClusterResolver`.
///
/// The program is the same binary on every task; the resolver tells this copy its role. A
/// resolver is asked once at start-up, so it may read the environment or a file in its
/// constructor and report errors there.
///
/// @par Requirements
/// `r` is a value of type `const R&`.
///
/// | expression        | type                               | semantics |
/// | ----------------- | ---------------------------------- | --------- |
/// | `r.cluster_spec()`| convertible to `ClusterSpec`       | every task's address, by job (`detail::cluster_resolver_has_cluster_spec`) |
/// | `r.task_type()`   | convertible to `std::string`       | this task's job name: "chief", "worker", "ps", "evaluator", or "" when this process does not know its role (TensorFlow's `None`) (`detail::cluster_resolver_has_task_type`) |
/// | `r.task_id()`     | convertible to `int`               | this task's index in its job (`detail::cluster_resolver_has_task_id`) |
/// | `r.rpc_layer()`   | convertible to `std::string`       | the protocol the addresses are meant for: "grpc", "inproc", or "" when not said. "inproc" (the embedded cluster) keeps the whole cluster in one process; otherwise a Transport that crosses processes makes this process the task `task_type()`/`task_id()` names (`detail::cluster_resolver_has_rpc_layer`) |
///
/// Optional: `R::num_ps`, a `static constexpr int`, the number of ps tasks when the cluster's shape is a
/// compile-time constant (`LocalClusterResolver<NumPs, NumWorkers>`); with it,
/// `ParameterServerStrategy::shard_placement<K>()` is a constant expression.
///
/// @par Rules the compiler cannot check
/// 1. `cluster_spec()`, `task_type()`, `task_id()` and `rpc_layer()` return the same values on every
///    call over the resolver's life: the strategy may call them once and keep the result, or call them
///    again. A resolver that re-reads the environment on each call must still return what it first read.
/// 2. `task_type()` is empty or a job of `cluster_spec()`; the one exception is "evaluator", which may
///    be absent from the spec (an evaluator runs beside the cluster, as in TensorFlow).
/// 3. `task_id()` is not negative; when `task_type()` is a job of the spec it is less than
///    `cluster_spec().num_tasks(task_type())`; when `task_type()` is empty it is 0.
/// 4. The four calls do not throw and are safe to call from several threads at once; a resolver
///    validates its input when it is constructed.
/// 5. For a `ParameterServerStrategy` the spec must also have at least one "ps" task and one
///    "worker" task, at most one "chief" and one "evaluator", and no other jobs (TensorFlow's
///    `multi_worker_util._validate_cluster_spec`). `TFConfigClusterResolver` checks this when it is
///    constructed; for the other resolvers the strategy checks it.
///
/// @par Models
/// `LocalClusterResolver<NumPs, NumWorkers>` (the in-process cluster), `SimpleClusterResolver`,
/// `TFConfigClusterResolver`; `pss::archetypes::ClusterResolverArchetype` in the tests is the least type
/// that meets it.
///
/// @par Example
/// @code
/// template <pss::ClusterResolver ClusterResolverPolicy>
/// bool is_coordinator(const ClusterResolverPolicy& resolver) {
///     return std::string(resolver.task_type()) == "chief";
/// }
/// @endcode
template <class R>
concept ClusterResolver = detail::cluster_resolver_has_cluster_spec<R> && detail::cluster_resolver_has_task_type<R> &&
                          detail::cluster_resolver_has_task_id<R> && detail::cluster_resolver_has_rpc_layer<R>;

PSS_NAMESPACE_END
