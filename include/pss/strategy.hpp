// pss/strategy.hpp: ParameterServerStrategy, the four policies composed into one type.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/cluster/local.hpp>
#include <pss/concepts/cluster_resolver.hpp>
#include <pss/concepts/optimizer.hpp>
#include <pss/concepts/partitioner.hpp>
#include <pss/concepts/transport.hpp>
#include <pss/config.hpp>
#include <pss/consistency.hpp>
#include <pss/errors.hpp>
#include <pss/optimizer/sgd.hpp>
#include <pss/partitioner/no_partition.hpp>
#include <pss/partitioner/shard_rows.hpp>
#include <pss/server.hpp>
#include <pss/transport/in_process.hpp>
#include <pss/variable.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The ps task of the `n`-th shard placed by a strategy: round-robin over `num_ps` tasks, each
/// shard counting as one variable (TensorFlow's placement). constexpr, so a cluster whose shape is a
/// compile-time constant has a placement table the compiler checks.
[[nodiscard]] constexpr int round_robin_task(std::uint64_t n, int num_ps) noexcept {
    return static_cast<int>(n % static_cast<std::uint64_t>(num_ps));
}

/// @brief The ps tasks of the first `K` shards created on a cluster of `NumPs` ps tasks.
template <std::size_t K, int NumPs>
[[nodiscard]] constexpr std::array<int, K> round_robin_placement() noexcept {
    static_assert(NumPs >= 1, "pss: a placement needs at least one ps task");
    std::array<int, K> table{};
    for (std::size_t i = 0; i < K; ++i) table[i] = round_robin_task(i, NumPs);
    return table;
}

namespace detail {

/// The in-process channel of a ParameterServerStrategy: its transport and the servers of its ps tasks.
template <Transport TransportPolicy, Optimizer OptimizerPolicy>
class TransportChannel final : public Channel {
public:
    TransportChannel(const ClusterSpec& spec, const OptimizerPolicy& optimizer, SyncOptions sync) : transport_(spec) {
        const int num_ps = spec.num_tasks("ps");
        servers_.reserve(static_cast<std::size_t>(num_ps));
        for (int i = 0; i < num_ps; ++i) {
            servers_.push_back(std::make_unique<ParameterServer<OptimizerPolicy>>(optimizer, sync));
            auto* server = servers_.back().get();
            transport_.serve(TaskId{"ps", i}, [server](Request&& r) { return server->handle(std::move(r)); });
        }
    }
    ~TransportChannel() override { transport_.shutdown(); }

    std::future<Reply> send(int task, Request request) override {
        return transport_.send(TaskId{"ps", task}, std::move(request));
    }
    [[nodiscard]] std::string device(int task) const override {
        return TaskId{"ps", task}.to_string() + "/device:CPU:0";
    }
    void shutdown() { transport_.shutdown(); }

private:
    TransportPolicy transport_;
    std::vector<std::unique_ptr<ParameterServer<OptimizerPolicy>>> servers_;  // outlive the transport's threads
};

}  // namespace detail

/// @brief Parameter-server training (tf.distribute.ParameterServerStrategy), its policies chosen at
/// compile time.
///
/// Variables created while `scope()` is active are split by the Partitioner along axis 0 (the first
/// `dim0 % k` shards get one extra row) and placed round-robin over the ps tasks, each shard counting
/// as one variable. Each ps task owns its shards and applies the Optimizer to them; every operation
/// reaches it through the Transport.
///
/// @tparam TransportPolicy how requests reach the ps tasks (InProcessTransport: threads of this process)
/// @tparam PartitionerPolicy how many shards a variable gets (NoPartitioner: one)
/// @tparam OptimizerPolicy how a ps applies gradients (SGD with learning rate 0.01)
/// @tparam ClusterResolverPolicy who is in the cluster (LocalClusterResolver<2, 2>: 2 ps, 2 workers, a chief)
/// @tparam ConsistencyPolicy when pushes are applied: Asynchronous (TensorFlow's mode), Synchronous, or
/// BoundedStaleness<S>; in the synchronous modes every push and pull names its step
///
/// @par Example
/// @code
/// pss::ParameterServerStrategy<pss::InProcessTransport, pss::MinSizePartitioner> strategy(
///     pss::LocalClusterResolver<2, 2>{}, pss::MinSizePartitioner(256 << 10, 2));
/// auto scope = strategy.scope();
/// pss::Variable w(xt::xarray<float>(xt::zeros<float>({1024, 1024})), "w");  // 2 shards, on ps 0 and 1
/// @endcode
template <Transport TransportPolicy = InProcessTransport, Partitioner PartitionerPolicy = NoPartitioner,
          Optimizer OptimizerPolicy = SGD, ClusterResolver ClusterResolverPolicy = LocalClusterResolver<>,
          Consistency ConsistencyPolicy = Asynchronous>
class ParameterServerStrategy final : public Strategy {
public:
    using consistency_type = ConsistencyPolicy;
    /// @brief True when pushes are applied per step from every worker (Synchronous, BoundedStaleness).
    static constexpr bool synchronous = ConsistencyPolicy::synchronous;

    using transport_type = TransportPolicy;
    using partitioner_type = PartitionerPolicy;
    using optimizer_type = OptimizerPolicy;
    using cluster_resolver_type = ClusterResolverPolicy;

    /// @throws InvalidArgumentError when the cluster has no ps or no worker task, more than one chief, or a
    /// job other than chief, worker, ps and evaluator (TensorFlow's rules).
    explicit ParameterServerStrategy(ClusterResolverPolicy cluster_resolver = {},
                                     PartitionerPolicy variable_partitioner = {}, OptimizerPolicy optimizer = {})
        : resolver_(std::move(cluster_resolver)),
          partitioner_(std::move(variable_partitioner)),
          optimizer_(std::move(optimizer)),
          spec_(validated(resolver_.cluster_spec())),
          channel_(std::make_shared<detail::TransportChannel<TransportPolicy, OptimizerPolicy>>(
              spec_, optimizer_,
              SyncOptions{ConsistencyPolicy::synchronous, static_cast<std::uint64_t>(spec_.num_tasks("worker")),
                          ConsistencyPolicy::staleness})) {}

    ~ParameterServerStrategy() override { channel_->shutdown(); }

    [[nodiscard]] int num_replicas_in_sync() const override { return 1; }

    /// @brief Splits `initial_value` with the partitioner and places the shards round-robin.
    /// @throws InvalidArgumentError when the partitioner answers 0 shards or more than shape[0].
    Variable create_variable(Tensor initial_value, std::string name) override {
        if (!initial_value.has_value())
            throw InvalidArgumentError("pss: variable '" + name + "': the initial value is empty");
        const Shape shape = initial_value.shape();
        std::size_t k = 1;
        if (!shape.empty()) {
            k = static_cast<std::size_t>(partitioner_(std::span<const std::size_t>(shape), initial_value.dtype()));
            if (k == 0 || (k > shape[0] && k > 1))
                throw InvalidArgumentError("pss: variable '" + name + "' of shape " + format_shape(shape) +
                                           ": the partitioner answered " + std::to_string(k) +
                                           " shards; it must answer between 1 and shape[0] = " +
                                           std::to_string(shape[0]));
        }
        std::vector<std::size_t> rows;
        std::vector<int> tasks;
        for (std::size_t i = 0; i < k; ++i) {
            rows.push_back(shape.empty() ? 0 : shard_rows(shape[0], k, i));
            tasks.push_back(round_robin_task(next_shard_.fetch_add(1), num_ps()));
        }
        return detail::create_sharded(channel_, next_id_.fetch_add(1), std::move(name), std::move(initial_value), rows,
                                      tasks);
    }

    [[nodiscard]] const ClusterSpec& cluster_spec() const noexcept { return spec_; }
    [[nodiscard]] const ClusterResolverPolicy& cluster_resolver() const noexcept { return resolver_; }
    [[nodiscard]] const PartitionerPolicy& variable_partitioner() const noexcept { return partitioner_; }
    [[nodiscard]] const OptimizerPolicy& optimizer() const noexcept { return optimizer_; }
    [[nodiscard]] int num_ps() const { return spec_.num_tasks("ps"); }
    [[nodiscard]] int num_workers() const { return spec_.num_tasks("worker"); }

    /// @brief The ps tasks of the first K shards this strategy will place, known at compile time when
    /// the resolver's cluster shape is (LocalClusterResolver<NumPs, NumWorkers>).
    template <std::size_t K>
        requires requires { ClusterResolverPolicy::num_ps; }
    [[nodiscard]] static constexpr std::array<int, K> shard_placement() noexcept {
        return round_robin_placement<K, ClusterResolverPolicy::num_ps>();
    }

private:
    static ClusterSpec validated(ClusterSpec spec) {
        detail::check_parameter_server_cluster(spec, "ParameterServerStrategy", "the cluster");
        return spec;
    }

    ClusterResolverPolicy resolver_;
    PartitionerPolicy partitioner_;
    OptimizerPolicy optimizer_;
    ClusterSpec spec_;
    std::shared_ptr<detail::TransportChannel<TransportPolicy, OptimizerPolicy>> channel_;
    std::atomic<std::uint64_t> next_shard_{0};
    std::atomic<std::uint64_t> next_id_{1};
};

PSS_NAMESPACE_END
