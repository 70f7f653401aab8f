// pss/detail/resolved_task.hpp: what every ClusterResolver answers (the cluster, this task, the protocol), held once.
#pragma once

#include <string>
#include <string_view>
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

    /// @brief TensorFlow's `master()`: this task's address with the resolver's protocol,
    /// `grpc://host:port` (only `host:port` when the resolver names no protocol); "" when the source
    /// names no task (TensorFlow's None task).
    /// @throws NotFoundError or OutOfRangeError (ClusterSpec::task_address) when the task is not in the cluster
    [[nodiscard]] std::string master() const { return task_type_.empty() ? std::string() : master(task_type_, task_id_); }
    /// @brief TensorFlow's `master(task_type, task_id, rpc_layer)`: task `task_id` of job `task_type`'s
    /// address, with `rpc_layer` or, when that is "", the resolver's: `master("ps", 1, "grpc")` is
    /// `grpc://ps1:2222`.
    /// @throws NotFoundError or OutOfRangeError (ClusterSpec::task_address) when the task is not in the cluster
    [[nodiscard]] std::string master(std::string_view task_type, int task_id, std::string_view rpc_layer = "") const {
        const std::string& address = cluster_spec_.task_address(task_type, task_id);
        const std::string_view layer = rpc_layer.empty() ? std::string_view(rpc_layer_) : rpc_layer;
        return layer.empty() ? address : std::string(layer) + "://" + address;
    }

    /// @brief Overrides the task type read from the source, as TensorFlow's `task_type` setter (unchecked
    /// here, as there: a strategy built from the resolver checks its task).
    void set_task_type(std::string task_type) { task_type_ = std::move(task_type); }
    /// @brief Overrides the task index read from the source, as TensorFlow's `task_id` setter.
    void set_task_id(int task_id) noexcept { task_id_ = task_id; }
    /// @brief Overrides the protocol read from the source, as TensorFlow's `rpc_layer` setter.
    void set_rpc_layer(std::string rpc_layer) { rpc_layer_ = std::move(rpc_layer); }

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
