// pss/pss.hpp: the library without its Keras-style layer (that is pss/keras.hpp); the root of the generated
// single header.
#pragma once

#include <pss/config.hpp>
#include <pss/version.hpp>

#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/initializer.hpp>
#include <pss/message.hpp>
#include <pss/tensor.hpp>

#include <pss/concepts/cluster_resolver.hpp>
#include <pss/concepts/consistency.hpp>
#include <pss/concepts/optimizer.hpp>
#include <pss/concepts/partitioner.hpp>
#include <pss/concepts/transport.hpp>

#include <pss/cluster/auto.hpp>
#include <pss/cluster/cluster_spec.hpp>
#include <pss/cluster/cluster_spec_json.hpp>
#include <pss/cluster/local.hpp>
#include <pss/cluster/mpi.hpp>
#include <pss/cluster/simple.hpp>
#include <pss/cluster/slurm.hpp>
#include <pss/cluster/tf_config.hpp>

#include <pss/optimizer/adagrad.hpp>
#include <pss/optimizer/adam.hpp>
#include <pss/optimizer/momentum.hpp>
#include <pss/optimizer/sgd.hpp>

#include <pss/partitioner/fixed_shards.hpp>
#include <pss/partitioner/max_size.hpp>
#include <pss/partitioner/min_size.hpp>
#include <pss/partitioner/no_partition.hpp>
#include <pss/partitioner/shard_rows.hpp>

#include <pss/transport/auto.hpp>
#include <pss/transport/in_process.hpp>
#include <pss/transport/simulated.hpp>
#include <pss/transport/tcp.hpp>

#include <pss/checkpoint.hpp>
#include <pss/compression.hpp>
#include <pss/cluster_strategy.hpp>
#include <pss/consistency.hpp>
#include <pss/coordinator.hpp>
#include <pss/distribute.hpp>
#include <pss/embedding.hpp>
#include <pss/function.hpp>
#include <pss/server.hpp>
#include <pss/strategy.hpp>
#include <pss/variable.hpp>
#include <pss/wire.hpp>

// The default configurations, instantiated once in the library under PSS_SEPARATE_COMPILATION.
PSS_NAMESPACE_BEGIN
PSS_INSTANTIATE(class ParameterServer<SGD>)
PSS_INSTANTIATE(class ParameterServerStrategy<>)  // the embedded cluster
PSS_INSTANTIATE(class ParameterServerStrategy<AutoTransport, NoPartitioner, SGD, AutoClusterResolver,
                                              Asynchronous>)  // ClusterStrategy<>
PSS_NAMESPACE_END
