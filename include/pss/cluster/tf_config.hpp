// pss/cluster/tf_config.hpp: TFConfigClusterResolver, the ClusterResolver that reads the TF_CONFIG variable.
#pragma once

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/cluster/cluster_spec_json.hpp>
#include <pss/config.hpp>
#include <pss/detail/resolved_task.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The ClusterResolver that reads the `TF_CONFIG` environment variable, as
/// `tf.distribute.cluster_resolver.TFConfigClusterResolver`: how Kubeflow's TFJob, Vertex AI and
/// other launchers tell each task of a TensorFlow cluster who is where and who it is.
///
/// `TF_CONFIG` is a JSON object:
/// @code{.json}
/// {"cluster": {"chief": ["tfjob-chief-0.ns.svc:2222"],
///              "ps": ["tfjob-ps-0.ns.svc:2222"],
///              "worker": ["tfjob-worker-0.ns.svc:2222", "tfjob-worker-1.ns.svc:2222"]},
///  "task": {"type": "worker", "index": 1},
///  "environment": "cloud"}
/// @endcode
/// | field         | meaning |
/// | ------------- | ------- |
/// | `cluster`     | required; job name to the list of its tasks' "host:port" addresses |
/// | `task.type`   | this task's job: chief, worker, ps or evaluator |
/// | `task.index`  | this task's index in its job: an integer, or a string of one ("1"), as TensorFlow's `int()` |
/// | `rpc_layer`   | optional string, e.g. "grpc"; `rpc_layer()` is "" without it |
/// | `environment` | optional string, e.g. "cloud"; kept in `environment()`, otherwise ignored |
///
/// Other top-level fields are ignored, as TensorFlow does. `task` may be left out (TensorFlow's `None`
/// task): `task_type()` is then "" and `task_id()` 0. If `task` is given it must have both `type` and
/// `index`.
///
/// The constructor checks everything TensorFlow's ParameterServerStrategy checks
/// (`multi_worker_util._validate_cluster_spec` and `_verify_args_and_config`), so a bad `TF_CONFIG`
/// fails at start-up with a message that names the field: jobs only chief, worker, ps and evaluator;
/// at least one ps and one worker task (not for an evaluator, which builds no strategy); at most one
/// chief and one evaluator; `task.type` one of those four and a job of the cluster (except "evaluator",
/// which may run outside the cluster, as in TensorFlow); `task.index` an integer, not negative and less
/// than the job's task count; and beyond TensorFlow, every address "host:port" with a port from 1 to
/// 65535 (a task at another could never be reached: `pss: TF_CONFIG: "cluster.ps[1]" is "p1:99999"; ...`).
///
/// `{}` (or `{"cluster": {}}`, without a task) is TensorFlow's empty cluster: `cluster_spec()` has no
/// jobs, `task_type()` is "" and `master()` is "", and a ParameterServerStrategy built from it refuses
/// it for want of ps tasks. Unset or empty `TF_CONFIG`: TensorFlow reads it as `{}`; pss throws
/// `NotFoundError` at once instead, with a message saying the variable is not set and showing its form,
/// since a parameter-server program can do nothing with an empty cluster (use `LocalClusterResolver`
/// for an in-process one).
///
/// @par Example
/// @code
/// pss::TFConfigClusterResolver resolver;  // reads TF_CONFIG
/// if (resolver.task_type() == "ps") { /* serve */ }
/// @endcode
/// @see ClusterResolver, SimpleClusterResolver, LocalClusterResolver
class TFConfigClusterResolver : public detail::ResolvedTask {
public:
    /// @brief Reads and checks the `TF_CONFIG` environment variable.
    /// @throws NotFoundError `pss: TF_CONFIG is not set; ...` when it is unset, `pss: TF_CONFIG is empty; ...`
    ///         when it is empty or blank
    /// @throws InvalidArgumentError for invalid contents; see `TFConfigClusterResolver(std::string_view)`
    TFConfigClusterResolver() {
        const char* text = std::getenv("TF_CONFIG");
        if (text == nullptr) {
            throw NotFoundError("pss: TF_CONFIG is not set; set it to JSON such as " + std::string(example) +
                                ", or use LocalClusterResolver for an in-process cluster");
        }
        load_text(text);
    }

    /// @brief Reads and checks `tf_config`, the text `TF_CONFIG` would hold (for tests and launchers).
    /// @throws NotFoundError `pss: TF_CONFIG is empty; ...` when `tf_config` is empty or blank
    /// @throws InvalidArgumentError naming the field, e.g.
    ///   - `pss: TF_CONFIG is not valid JSON: [json.exception.parse_error.101] ...`
    ///   - `pss: TF_CONFIG must be a JSON object with "cluster" and "task", got array`
    ///   - `pss: TF_CONFIG has no "cluster"; ...` (when it names a "task")
    ///   - `pss: TF_CONFIG: "cluster" must be an object of job name to list of "host:port" strings, got array`
    ///   - `pss: TF_CONFIG: job "foo" is not one of chief, worker, ps, evaluator`
    ///   - `pss: TF_CONFIG: job "chief" has 2 tasks but there may be at most one chief`
    ///   - `pss: TF_CONFIG: "cluster" has no "ps" job; ParameterServerStrategy needs at least one ps task`
    ///   - `pss: TF_CONFIG: "task" must be an object such as {"type": "worker", "index": 0}, got string`
    ///   - `pss: TF_CONFIG: "task" has no "type"; ...`, `pss: TF_CONFIG: "task" has no "index"; ...`
    ///   - `pss: TF_CONFIG: "task.type" is "foo" but must be one of chief, worker, ps, evaluator`
    ///   - `pss: TF_CONFIG: "task.type" is "chief" but "cluster" has no "chief" job`
    ///   - `pss: TF_CONFIG: "task.index" must be a non-negative integer or a string of one, such as 1 or "1"; got 1.5`
    ///   - `pss: TF_CONFIG: "task.index" is -1 but must not be negative`
    ///   - `pss: TF_CONFIG: "task.index" is 3 but job "worker" has 2 tasks`
    ///   - `pss: TF_CONFIG: "rpc_layer" must be a string such as "grpc", got number`
    ///   - `pss: TF_CONFIG: "environment" must be a string such as "cloud", got number`
    explicit TFConfigClusterResolver(std::string_view tf_config) { load_text(tf_config); }

    /// @brief The same as `TFConfigClusterResolver(tf_config)`.
    [[nodiscard]] static TFConfigClusterResolver from_json_string(std::string_view tf_config) {
        return TFConfigClusterResolver(tf_config);
    }

    /// @brief Reads and checks an already parsed `TF_CONFIG` object; the errors of the string constructor.
    [[nodiscard]] static TFConfigClusterResolver from_json(const nlohmann::json& tf_config) {
        TFConfigClusterResolver resolver(parsed_tag{});
        resolver.load(tf_config);
        return resolver;
    }

    /// @brief `environment` (e.g. "cloud"); "" when absent.
    [[nodiscard]] const std::string& environment() const noexcept { return environment_; }

private:
    static constexpr std::string_view example =
        R"({"cluster": {"ps": ["ps0:2222"], "worker": ["worker0:2222"]}, "task": {"type": "worker", "index": 0}})";

    struct parsed_tag {};
    explicit TFConfigClusterResolver(parsed_tag) {}

    void load_text(std::string_view text) {
        if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
            throw NotFoundError("pss: TF_CONFIG is empty; set it to JSON such as " + std::string(example) +
                                ", or use LocalClusterResolver for an in-process cluster");
        }
        nlohmann::json config;
        try {
            config = nlohmann::json::parse(text);
        } catch (const nlohmann::json::parse_error& error) {
            throw InvalidArgumentError(std::string("pss: TF_CONFIG is not valid JSON: ") + error.what());
        }
        load(config);
    }

    void load(const nlohmann::json& config) {
        const std::string where = "pss: TF_CONFIG: ";
        if (!config.is_object()) {
            throw InvalidArgumentError(std::string("pss: TF_CONFIG must be a JSON object with \"cluster\" and \"task\", got ") +
                                       config.type_name());
        }

        const auto cluster = config.find("cluster");
        const auto task = config.find("task");
        // TensorFlow's empty cluster: no task, and no cluster or an empty one (`{}`, TensorFlow's reading of
        // an unset TF_CONFIG). A strategy refuses it; a program may still read it (AutoClusterResolver
        // then looks for another launcher).
        const bool empty_cluster = task == config.end() &&
                                   (cluster == config.end() || (cluster->is_object() && cluster->empty()));
        if (!empty_cluster) {
            if (cluster == config.end()) {
                throw InvalidArgumentError(
                    "pss: TF_CONFIG has no \"cluster\"; ParameterServerStrategy needs one with at least one ps and "
                    "one worker task, as in " +
                    std::string(example));
            }
            cluster_spec_ = ClusterSpec::from_json(*cluster, "TF_CONFIG: \"cluster\"");
            // An evaluator reads the cluster to find what it evaluates: it needs no ps or worker (TensorFlow
            // validates a ParameterServerStrategy's cluster, which an evaluator does not build).
            const bool evaluator = task != config.end() && task->is_object() && task->contains("type") &&
                                   (*task)["type"] == "evaluator";
            detail::check_parameter_server_cluster(cluster_spec_, "TF_CONFIG", "\"cluster\"", !evaluator);
            check_ports();
        }

        if (const auto rpc_layer = config.find("rpc_layer"); rpc_layer != config.end()) {
            if (!rpc_layer->is_string()) {
                throw InvalidArgumentError(where + "\"rpc_layer\" must be a string such as \"grpc\", got " +
                                           rpc_layer->type_name());
            }
            rpc_layer_ = rpc_layer->get<std::string>();
        }
        if (const auto environment = config.find("environment"); environment != config.end()) {
            if (!environment->is_string()) {
                throw InvalidArgumentError(where + "\"environment\" must be a string such as \"cloud\", got " +
                                           environment->type_name());
            }
            environment_ = environment->get<std::string>();
        }

        if (task != config.end()) {  // else TensorFlow's None task: type "", id 0
            if (!task->is_object()) {
                throw InvalidArgumentError(where + "\"task\" must be an object such as {\"type\": \"worker\", \"index\": 0}, got " +
                                           task->type_name());
            }
            load_task_type(*task);
            load_task_index(*task);
        }
    }

    /// Every address is "host:port" with a port from 1 to 65535: a task cannot be reached at another.
    void check_ports() const {
        for (const auto& [job, addresses] : cluster_spec_.as_dict()) {
            for (std::size_t i = 0; i < addresses.size(); ++i) {
                const std::string& address = addresses[i];
                const auto colon = address.rfind(':');
                const std::string_view port =
                    colon == std::string::npos ? std::string_view() : std::string_view(address).substr(colon + 1);
                int value = 0;
                const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
                if (colon == 0 || port.empty() || error != std::errc{} || end != port.data() + port.size() ||
                    value < 1 || value > 65535)
                    throw InvalidArgumentError("pss: TF_CONFIG: \"cluster." + job + "[" + std::to_string(i) + "]\" is \"" +
                                               address + "\"; give it as \"host:port\" with a port from 1 to 65535");
            }
        }
    }

    void load_task_type(const nlohmann::json& task) {
        const std::string where = "pss: TF_CONFIG: ";
        const auto type = task.find("type");
        if (type == task.end()) {
            throw InvalidArgumentError(where + "\"task\" has no \"type\"; give this task's job, one of chief, worker, ps, "
                                               "evaluator, as in {\"type\": \"worker\", \"index\": 0}");
        }
        if (!type->is_string()) {
            throw InvalidArgumentError(where + "\"task.type\" must be a string, one of chief, worker, ps, evaluator; got " +
                                       std::string(type->type_name()));
        }
        task_type_ = type->get<std::string>();
        if (task_type_ != "chief" && task_type_ != "worker" && task_type_ != "ps" && task_type_ != "evaluator") {
            throw InvalidArgumentError(where + "\"task.type\" is \"" + task_type_ +
                                       "\" but must be one of chief, worker, ps, evaluator");
        }
        if (task_type_ != "evaluator" && !cluster_spec_.has_job(task_type_)) {
            throw InvalidArgumentError(where + "\"task.type\" is \"" + task_type_ + "\" but \"cluster\" has no \"" +
                                       task_type_ + "\" job");
        }
    }

    void load_task_index(const nlohmann::json& task) {
        const std::string where = "pss: TF_CONFIG: ";
        const auto index = task.find("index");
        if (index == task.end()) {
            throw InvalidArgumentError(where + "\"task\" has no \"index\"; give this task's position in job \"" +
                                       task_type_ + "\", from 0, as in {\"type\": \"" + task_type_ +
                                       "\", \"index\": 0}");
        }
        // The value as written, and whether it is an integer, negative, or beyond int.
        std::string text = index->is_string() ? index->get<std::string>() : index->dump();
        bool integral = false;
        bool negative = false;
        bool too_large = false;
        long long value = 0;
        if (index->is_number_unsigned()) {
            const auto v = index->get<std::uint64_t>();
            integral = true;
            too_large = v > static_cast<std::uint64_t>(INT_MAX);
            value = too_large ? 0 : static_cast<long long>(v);
        } else if (index->is_number_integer()) {
            const auto v = index->get<std::int64_t>();
            integral = true;
            negative = v < 0;
            too_large = v > INT_MAX;
            value = v;
        } else if (index->is_number_float()) {
            const double v = index->get<double>();
            integral = std::isfinite(v) && std::trunc(v) == v;
            if (integral) {
                negative = v < 0;
                too_large = v > INT_MAX;
                value = (negative || too_large) ? 0 : static_cast<long long>(v);
                if (!negative && !too_large) text = std::to_string(value);  // "1.0" is 1, as TensorFlow's int()
            }
        } else if (index->is_string()) {
            const char* first = text.data();
            const char* last = first + text.size();
            const auto [end, error] = std::from_chars(first, last, value);
            integral = !text.empty() && end == last && (error == std::errc{} || error == std::errc::result_out_of_range);
            if (integral) {
                const bool overflow = error == std::errc::result_out_of_range;
                negative = text.front() == '-' && (overflow || value < 0);  // "-0" is 0, as TensorFlow's int()
                too_large = !negative && (overflow || value > INT_MAX);
            }
        }
        if (!integral) {
            throw InvalidArgumentError(where +
                                       "\"task.index\" must be a non-negative integer or a string of one, such as 1 or "
                                       "\"1\"; got " +
                                       index->dump());
        }
        if (negative) throw InvalidArgumentError(where + "\"task.index\" is " + text + " but must not be negative");
        if (cluster_spec_.has_job(task_type_)) {
            const int count = cluster_spec_.num_tasks(task_type_);
            if (too_large || value >= count) {
                throw InvalidArgumentError(where + "\"task.index\" is " + text + " but job \"" + task_type_ + "\" has " +
                                           std::to_string(count) + (count == 1 ? " task" : " tasks"));
            }
        } else if (too_large) {
            throw InvalidArgumentError(where + "\"task.index\" is " + text + ", too large for a task index");
        }
        task_id_ = static_cast<int>(value);
    }

    std::string environment_;
};

PSS_NAMESPACE_END
