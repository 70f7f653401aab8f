// pss/cluster_strategy.hpp: ClusterStrategy, the strategy of a program that runs unchanged alone and on a cluster.
#pragma once

#include <pss/cluster/auto.hpp>
#include <pss/concepts/optimizer.hpp>
#include <pss/concepts/partitioner.hpp>
#include <pss/config.hpp>
#include <pss/consistency.hpp>
#include <pss/optimizer/sgd.hpp>
#include <pss/partitioner/no_partition.hpp>
#include <pss/strategy.hpp>
#include <pss/transport/auto.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A ParameterServerStrategy whose cluster is found at run time (AutoClusterResolver: TF_CONFIG,
/// Slurm, MPI, else the embedded cluster of 2 ps and 2 workers) and whose tasks talk over TCP when they
/// are separate processes (AutoTransport: threads of this process for the embedded cluster). One binary runs alone on a laptop and as every task of a cluster:
///
/// @code
/// pss::ClusterStrategy<> strategy;
/// if (strategy.is_chief()) {
///     auto scope = strategy.scope();
///     pss::Variable weights(xt::xarray<std::int32_t>{1, 2, 3, 4, 5}, "weights");  // on ps 0
///     std::cout << weights << "\n";
/// }
/// strategy.join();  // ps and worker processes serve here until the chief's join() ends the cluster
/// @endcode
///
/// A worker process runs calls as soon as its strategy is constructed: register the functions, and set
/// up what they use, before (at namespace scope, or earlier in main).
template <Partitioner PartitionerPolicy = NoPartitioner, Optimizer OptimizerPolicy = SGD,
          Consistency ConsistencyPolicy = Asynchronous>
using ClusterStrategy =
    ParameterServerStrategy<AutoTransport, PartitionerPolicy, OptimizerPolicy, AutoClusterResolver, ConsistencyPolicy>;

PSS_NAMESPACE_END
