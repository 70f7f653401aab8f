// pss/cluster/simple.hpp: SimpleClusterResolver, a ClusterResolver holding values given in code.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/detail/resolved_task.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A ClusterResolver whose answers are given to its constructor, as
/// `tf.distribute.cluster_resolver.SimpleClusterResolver`: for a launcher that knows the cluster, for
/// tests, and to override what another resolver found.
///
/// Unlike TensorFlow's, the values cannot be changed after construction (the ClusterResolver rules
/// require stable answers), and they are checked when the resolver is made.
///
/// @par Example
/// @code
/// pss::SimpleClusterResolver resolver({{"ps", {"ps0:2222"}}, {"worker", {"w0:2222", "w1:2222"}}},
///                                     "worker", 1, "grpc");
/// resolver.task_type();  // "worker"
/// @endcode
/// @see ClusterResolver, TFConfigClusterResolver
class SimpleClusterResolver : public detail::ResolvedTask {
public:
    /// @brief A resolver answering with these values.
    /// @param cluster_spec every task's address
    /// @param task_type this task's job; "" when this process does not know its role
    /// @param task_id this task's index in its job
    /// @param rpc_layer the protocol of the addresses, "" when not said
    /// @throws InvalidArgumentError when the values break the ClusterResolver rules:
    ///   - `pss: SimpleClusterResolver: task_id is -1 but must not be negative`
    ///   - `pss: SimpleClusterResolver: task_type "ps" is not a job of the cluster spec; its jobs are worker`
    ///   - `pss: SimpleClusterResolver: task_id is 2 but job "worker" has 2 tasks`
    ///   - `pss: SimpleClusterResolver: task_id is 1 but task_type is empty; a task without a type has id 0`
    explicit SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type = "", int task_id = 0,
                                   std::string rpc_layer = "")
        : ResolvedTask(std::move(cluster_spec), std::move(task_type), task_id, std::move(rpc_layer)) {
        const std::string where = "pss: SimpleClusterResolver: ";
        if (task_id_ < 0) {
            throw InvalidArgumentError(where + "task_id is " + std::to_string(task_id_) + " but must not be negative");
        }
        if (task_type_.empty()) {
            if (task_id_ != 0) {
                throw InvalidArgumentError(where + "task_id is " + std::to_string(task_id_) +
                                           " but task_type is empty; a task without a type has id 0");
            }
            return;
        }
        if (!cluster_spec_.has_job(task_type_)) {
            if (task_type_ == "evaluator") return;  // an evaluator may run outside the cluster, as in TensorFlow
            std::string message = where + "task_type \"" + task_type_ + "\" is not a job of the cluster spec; ";
            const auto jobs = cluster_spec_.jobs();
            if (jobs.empty()) {
                message += "the spec has no jobs";
            } else {
                message += "its jobs are ";
                for (std::size_t i = 0; i < jobs.size(); ++i) message += (i == 0 ? "" : ", ") + jobs[i];
            }
            throw InvalidArgumentError(message);
        }
        const int count = cluster_spec_.num_tasks(task_type_);
        if (task_id_ >= count) {
            throw InvalidArgumentError(where + "task_id is " + std::to_string(task_id_) + " but job \"" + task_type_ +
                                       "\" has " + std::to_string(count) + " tasks");
        }
    }


private:
};

PSS_NAMESPACE_END
