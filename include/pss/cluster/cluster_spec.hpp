// pss/cluster/cluster_spec.hpp: ClusterSpec (job name to task addresses) and TaskId, as tf.train.ClusterSpec.
#pragma once

#include <compare>
#include <cstddef>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <pss/config.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief One task of a cluster: its job name and its index in that job.
///
/// The TensorFlow device-name form is `to_string()`: `TaskId{"ps", 1}` is `/job:ps/replica:0/task:1`.
/// Ordered by job name, then index (the order `ClusterSpec::tasks()` lists them in).
struct TaskId {
    std::string type;  ///< the job name: "chief", "worker", "ps" or "evaluator" for a ParameterServerStrategy
    int index = 0;     ///< the task's position in its job, from 0

    friend auto operator<=>(const TaskId&, const TaskId&) = default;
    friend bool operator==(const TaskId&, const TaskId&) = default;

    /// @brief TensorFlow's device-name prefix of the task: `/job:<type>/replica:0/task:<index>`.
    [[nodiscard]] std::string to_string() const {
        return "/job:" + type + "/replica:0/task:" + std::to_string(index);
    }

    friend std::ostream& operator<<(std::ostream& os, const TaskId& task) { return os << task.to_string(); }
};

/// @brief The addresses of every task of a cluster, grouped by job: the counterpart of tf.train.ClusterSpec.
///
/// A job name maps to the ordered list of its tasks' addresses ("host:port"); task `i` of a job is the
/// i-th address. Jobs are kept sorted by name. A job name starts with a letter and has only letters,
/// digits and '_' (TensorFlow's device-name grammar, so that `/job:<name>` parses); an address is a
/// non-empty string. A job may have no tasks. The value is immutable after construction.
///
/// @par Example
/// @code
/// pss::ClusterSpec spec{{"ps", {"ps0:2222", "ps1:2222"}}, {"worker", {"w0:2222"}}};
/// spec.num_tasks("ps");          // 2
/// spec.task_address("ps", 1);    // "ps1:2222"
/// spec.num_tasks("evaluator");   // 0
/// @endcode
class ClusterSpec {
public:
    /// @brief The representation: job name to the ordered addresses of its tasks.
    using JobMap = std::map<std::string, std::vector<std::string>>;

    /// @brief An empty cluster (no jobs), as `tf.train.ClusterSpec({})`.
    ClusterSpec() = default;

    /// @brief A cluster from `{{"job", {"host:port", ...}}, ...}`.
    /// @throws InvalidArgumentError `pss: ClusterSpec: job "ps" is given twice` for a repeated job, or the
    ///         job-name and address errors listed at `from_json`.
    ClusterSpec(std::initializer_list<JobMap::value_type> jobs) {
        for (const auto& [job, addresses] : jobs) {
            if (jobs_.contains(job)) {
                throw InvalidArgumentError("pss: ClusterSpec: job \"" + job + "\" is given twice");
            }
            jobs_.emplace(job, addresses);
        }
        validate("ClusterSpec");
    }

    /// @brief A cluster from a map of job name to addresses.
    /// @throws InvalidArgumentError for an invalid job name or an empty address (see `from_json`).
    explicit ClusterSpec(JobMap jobs) : jobs_(std::move(jobs)) { validate("ClusterSpec"); }

    /// @brief A cluster from a JSON object `{"worker": ["host:port", ...], ...}`, as TF_CONFIG's "cluster".
    /// @param json the object
    /// @param what names the input in error messages, e.g. `TF_CONFIG: "cluster"`
    /// @throws InvalidArgumentError whose message names the input and the job:
    ///   - `pss: <what> must be an object of job name to list of "host:port" strings, got array`
    ///   - `pss: <what>: job "worker" must be a list of "host:port" strings, got string`
    ///   - `pss: <what>: job "worker" task 1 must be a "host:port" string, got number`
    ///   - `pss: <what>: job "worker" task 1 has an empty address; give it as "host:port"`
    ///   - `pss: <what>: job name "1x" is not valid; a job name starts with a letter and has only ...`
    /// (A template on the JSON type, nlohmann::json, so that this header needs only its declaration.)
    template <class Json>
    [[nodiscard]] static ClusterSpec from_json(const Json& json, std::string_view what = "ClusterSpec JSON") {
        const std::string where(what);
        if (!json.is_object()) {
            throw InvalidArgumentError("pss: " + where +
                                       " must be an object of job name to list of \"host:port\" strings, got " +
                                       json.type_name());
        }
        ClusterSpec spec;
        for (const auto& [job, tasks] : json.items()) {
            if (!tasks.is_array()) {
                throw InvalidArgumentError("pss: " + where + ": job \"" + job +
                                           "\" must be a list of \"host:port\" strings, got " + tasks.type_name());
            }
            std::vector<std::string> addresses;
            addresses.reserve(tasks.size());
            for (std::size_t i = 0; i < tasks.size(); ++i) {
                if (!tasks[i].is_string()) {
                    throw InvalidArgumentError("pss: " + where + ": job \"" + job + "\" task " + std::to_string(i) +
                                               " must be a \"host:port\" string, got " + tasks[i].type_name());
                }
                addresses.push_back(tasks[i].template get<std::string>());
            }
            spec.jobs_.emplace(job, std::move(addresses));
        }
        spec.validate(where);
        return spec;
    }

    /// @brief The JSON object `{"job": ["host:port", ...], ...}` that `from_json` reads back.
    template <class Json = nlohmann::json>
    [[nodiscard]] Json to_json() const {
        Json json = Json::object();
        for (const auto& [job, addresses] : jobs_) json[job] = addresses;
        return json;
    }

    /// @brief The job names, sorted.
    [[nodiscard]] std::vector<std::string> jobs() const {
        std::vector<std::string> names;
        names.reserve(jobs_.size());
        for (const auto& entry : jobs_) names.push_back(entry.first);
        return names;
    }

    /// @brief True when the cluster has a job of this name (even one with no tasks).
    [[nodiscard]] bool has_job(std::string_view job) const { return jobs_.contains(std::string(job)); }

    /// @brief The number of tasks of `job`; 0 when there is no such job.
    [[nodiscard]] int num_tasks(std::string_view job) const {
        const auto it = jobs_.find(std::string(job));
        return it == jobs_.end() ? 0 : static_cast<int>(it->second.size());
    }

    /// @brief True when the cluster has no jobs (TensorFlow's `bool(cluster_spec)` is false).
    [[nodiscard]] bool empty() const noexcept { return jobs_.empty(); }

    /// @brief The addresses of `job`'s tasks, in task order (TensorFlow's `job_tasks`).
    /// @throws NotFoundError `pss: ClusterSpec has no job "foo"; its jobs are ps, worker`
    [[nodiscard]] const std::vector<std::string>& job_tasks(std::string_view job) const {
        const auto it = jobs_.find(std::string(job));
        if (it == jobs_.end()) throw_no_job(job);
        return it->second;
    }

    /// @brief The address of task `index` of `job`.
    /// @throws NotFoundError `pss: ClusterSpec has no job "foo"; its jobs are ps, worker`
    /// @throws OutOfRangeError `pss: ClusterSpec: job "worker" has no task 2; it has 2 tasks, 0 to 1`
    [[nodiscard]] const std::string& task_address(std::string_view job, int index) const {
        const auto& addresses = job_tasks(job);
        if (index < 0 || static_cast<std::size_t>(index) >= addresses.size()) {
            std::string message = "pss: ClusterSpec: job \"" + std::string(job) + "\" has no task " +
                                  std::to_string(index) + "; it has " + std::to_string(addresses.size()) + " tasks";
            if (!addresses.empty()) message += ", 0 to " + std::to_string(addresses.size() - 1);
            throw OutOfRangeError(message);
        }
        return addresses[static_cast<std::size_t>(index)];
    }

    /// @brief The address of `task`; the same errors as `task_address(job, index)`.
    [[nodiscard]] const std::string& task_address(const TaskId& task) const {
        return task_address(task.type, task.index);
    }

    /// @brief Every task, ordered by job name and then index.
    [[nodiscard]] std::vector<TaskId> tasks() const {
        std::vector<TaskId> all;
        for (const auto& [job, addresses] : jobs_) {
            for (std::size_t i = 0; i < addresses.size(); ++i) all.push_back(TaskId{job, static_cast<int>(i)});
        }
        return all;
    }

    /// @brief The job map itself (TensorFlow's `as_dict`).
    [[nodiscard]] const JobMap& as_dict() const noexcept { return jobs_; }

    friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

    /// @brief nlohmann/json conversions, so that `nlohmann::json j = spec;` and `j.get<ClusterSpec>()` work.
    template <class Json>
    friend void to_json(Json& json, const ClusterSpec& spec) {
        json = spec.template to_json<Json>();
    }
    template <class Json>
    friend void from_json(const Json& json, ClusterSpec& spec) {
        spec = ClusterSpec::from_json(json);
    }

private:
    static bool is_valid_job_name(std::string_view name) noexcept {
        const auto is_letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
        const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
        if (name.empty() || !is_letter(name.front())) return false;
        for (const char c : name) {
            if (!is_letter(c) && !is_digit(c) && c != '_') return false;
        }
        return true;
    }

    void validate(const std::string& what) const {
        for (const auto& [job, addresses] : jobs_) {
            if (!is_valid_job_name(job)) {
                throw InvalidArgumentError("pss: " + what + ": job name \"" + job +
                                           "\" is not valid; a job name starts with a letter and has only "
                                           "letters, digits and '_' (as in \"/job:worker\")");
            }
            for (std::size_t i = 0; i < addresses.size(); ++i) {
                if (addresses[i].empty()) {
                    throw InvalidArgumentError("pss: " + what + ": job \"" + job + "\" task " + std::to_string(i) +
                                               " has an empty address; give it as \"host:port\"");
                }
            }
        }
    }

    [[noreturn]] void throw_no_job(std::string_view job) const {
        std::string message = "pss: ClusterSpec has no job \"" + std::string(job) + "\"; ";
        if (jobs_.empty()) {
            message += "it has no jobs";
        } else {
            message += "its jobs are ";
            bool first = true;
            for (const auto& entry : jobs_) {
                if (!first) message += ", ";
                message += entry.first;
                first = false;
            }
        }
        throw NotFoundError(message);
    }

    JobMap jobs_;
};

namespace detail {

/// @brief Checks the shape ParameterServerStrategy needs, as TensorFlow's
/// `multi_worker_util._validate_cluster_spec` and `ParameterServerStrategyV2._verify_args_and_config`:
/// jobs only chief, worker, ps, evaluator; at most one chief and one evaluator task; at least one ps
/// and one worker task.
/// @param source names the input, e.g. "TF_CONFIG"
/// @param cluster names the spec within it, e.g. "\"cluster\"" or "the cluster spec"
/// @throws InvalidArgumentError
///   - `pss: TF_CONFIG: job "foo" is not one of chief, worker, ps, evaluator`
///   - `pss: TF_CONFIG: job "chief" has 2 tasks but there may be at most one chief`
///   - `pss: TF_CONFIG: "cluster" has no "ps" job; ParameterServerStrategy needs at least one ps task`
///   - `pss: TF_CONFIG: job "ps" has no tasks; ParameterServerStrategy needs at least one ps task`
inline void check_parameter_server_cluster(const ClusterSpec& spec, std::string_view source, std::string_view cluster,
                                           bool need_ps_and_worker = true) {
    const std::string where = "pss: " + std::string(source) + ": ";
    for (const auto& [job, addresses] : spec.as_dict()) {
        if (job != "chief" && job != "worker" && job != "ps" && job != "evaluator") {
            throw InvalidArgumentError(where + "job \"" + job + "\" is not one of chief, worker, ps, evaluator");
        }
        if ((job == "chief" || job == "evaluator") && addresses.size() > 1) {
            throw InvalidArgumentError(where + "job \"" + job + "\" has " + std::to_string(addresses.size()) +
                                       " tasks but there may be at most one " + job);
        }
    }
    if (!need_ps_and_worker) return;
    for (const std::string_view job : {std::string_view("ps"), std::string_view("worker")}) {
        const std::string name(job);
        if (!spec.has_job(name)) {
            throw InvalidArgumentError(where + std::string(cluster) + " has no \"" + name +
                                       "\" job; ParameterServerStrategy needs at least one " + name + " task");
        }
        if (spec.num_tasks(name) == 0) {
            throw InvalidArgumentError(where + "job \"" + name +
                                       "\" has no tasks; ParameterServerStrategy needs at least one " + name + " task");
        }
    }
}

}  // namespace detail

PSS_NAMESPACE_END
