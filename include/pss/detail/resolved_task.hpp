// pss/detail/resolved_task.hpp: what every ClusterResolver answers (the cluster, this task, the protocol), held once.
#pragma once

#include <string>
#include <utility>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief The ClusterResolver accessors over what a resolver found: each resolver derives from it and
/// fills the fields as it reads its source (its own class comment says how).
class ResolvedTask {
public:
    /// @brief The cluster: each job's task addresses.
    [[nodiscard]] const ClusterSpec& cluster_spec() const noexcept { return cluster_spec_; }
    /// @brief This task's job ("chief", "ps", "worker", ...); "" when the source names none.
    [[nodiscard]] const std::string& task_type() const noexcept { return task_type_; }
    /// @brief This task's index in its job.
    [[nodiscard]] int task_id() const noexcept { return task_id_; }
    /// @brief The protocol of the addresses ("grpc", "inproc"); "" when the source names none.
    [[nodiscard]] const std::string& rpc_layer() const noexcept { return rpc_layer_; }
    /// @brief This task as a TaskId, e.g. `TaskId{"worker", 1}`.
    [[nodiscard]] TaskId task() const { return TaskId{task_type_, task_id_}; }

protected:
    ResolvedTask() = default;
    ResolvedTask(ClusterSpec cluster_spec, std::string task_type, int task_id, std::string rpc_layer)
        : cluster_spec_(std::move(cluster_spec)),
          task_type_(std::move(task_type)),
          task_id_(task_id),
          rpc_layer_(std::move(rpc_layer)) {}

    ClusterSpec cluster_spec_;
    std::string task_type_;
    int task_id_ = 0;
    std::string rpc_layer_;
};

}  // namespace detail

PSS_NAMESPACE_END
