// pss/cluster/slurm.hpp: SlurmClusterResolver, the ClusterResolver of a task started by Slurm's srun.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/cluster/cluster_spec_json.hpp>
#include <pss/config.hpp>
#include <pss/detail/resolved_task.hpp>
#include <pss/detail/environment.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The ClusterResolver of a task started by Slurm (`srun`), as
/// `tf.distribute.cluster_resolver.SlurmClusterResolver`: every task of the job step runs the same
/// program, and each learns the cluster and its own place from the variables srun sets.
///
/// | variable                    | example                  | meaning |
/// | --------------------------- | ------------------------ | ------- |
/// | `SLURM_PROCID`              | `3`                      | this task's rank in the step, 0 to n-1 |
/// | `SLURM_STEP_NUM_TASKS`      | `5`                      | n, the number of tasks of the step (`srun -n`) |
/// | `SLURM_STEP_NODELIST`       | `node[001-002],gpu7`     | the step's nodes, in Slurm's hostlist syntax (`expand_hostlist`) |
/// | `SLURM_STEP_TASKS_PER_NODE` | `2(x2),1`                | tasks on each node, in node order (`expand_tasks_per_node`); not read when `tasks_per_node` is given |
/// | `CUDA_VISIBLE_DEVICES`      | `0,1`                    | read only to count the GPUs of a node when `gpus_per_node` is not given |
///
/// How TensorFlow lays the cluster out, and pss with it:
/// - Task addresses: the nodes in order, each node's tasks with ports `port_base`, `port_base + 1`, ...
///   (`t02n13:8888`, `t02n13:8889`, `t02n41:8888`, ...). Slurm places ranks in this order (block
///   distribution), so rank r runs at the r-th address.
/// - Jobs take ranks in job-name order: with `{{"ps", 1}, {"worker", 4}}`, rank 0 is ps 0 and ranks
///   1 to 4 are workers 0 to 3; with a "chief" job it comes first (chief < ps < worker). The task
///   counts of the jobs must add up to the step's tasks. Without jobs every task is a worker, as in
///   TensorFlow: give jobs for a ParameterServerStrategy (or use AutoClusterResolver, which does).
///
/// Differences from TensorFlow: TensorFlow sorts the node names as strings before laying tasks out;
/// pss keeps Slurm's order, which is where the ranks actually run (sorted as strings, `node[9-10]`
/// would put node10 first). The two agree whenever Slurm's list is sorted as strings, as in all of
/// TensorFlow's tests. A node listed twice is an error. pss has no GPU code: the GPU arguments are
/// checked and kept as TensorFlow does, and `cuda_visible_devices()` gives the device list TensorFlow
/// would give this task, but pss never sets `CUDA_VISIBLE_DEVICES` itself, even with `auto_set_gpu`.
///
/// Everything is read and checked in the constructor; the accessors only return what it found.
///
/// @par Example
/// @code
/// // srun -N 3 -n 5 ./train      (SLURM_STEP_TASKS_PER_NODE=2(x2),1)
/// pss::SlurmClusterResolver resolver({{"chief", 1}, {"ps", 1}, {"worker", 3}});
/// resolver.cluster_spec();  // chief: n1:8888; ps: n1:8889; worker: n2:8888, n2:8889, n3:8888
/// @endcode
/// @see ClusterResolver, MpiClusterResolver, AutoClusterResolver
class SlurmClusterResolver : public detail::ResolvedTask {
public:
    /// @brief Looks up one environment variable; nullopt when unset.
    using EnvironmentLookup = detail::EnvironmentLookup;
    /// @brief Job name to its number of tasks, e.g. `{{"ps", 2}, {"worker", 8}}`.
    using Jobs = std::map<std::string, int>;

    /// @brief Reads the Slurm variables of the process environment and lays out the cluster.
    /// @param jobs job name to number of tasks; empty: every task of the step is a "worker" (TensorFlow's default)
    /// @param port_base the port of the first task on each node; the next tasks on the node take the next ports
    /// @param gpus_per_node GPUs on each node; by default the entries of `CUDA_VISIBLE_DEVICES`, 0 without it
    /// @param gpus_per_task GPUs for each task; by default `gpus_per_node` divided by the most tasks on a node
    /// @param tasks_per_node the same number of tasks on every node, in place of `SLURM_STEP_TASKS_PER_NODE`
    /// @param auto_set_gpu kept for `auto_set_gpu()`; pss itself never sets `CUDA_VISIBLE_DEVICES`
    /// @param rpc_layer the protocol of the addresses
    /// @throws NotFoundError `pss: SlurmClusterResolver: SLURM_PROCID is not set; this process is not running
    ///         inside a Slurm step (srun)`, and the same for each variable it needs
    /// @throws InvalidArgumentError for a malformed variable or argument, naming it, e.g.
    ///   - `pss: SlurmClusterResolver: SLURM_PROCID is "x" but must be a whole number (this task's rank in the step)`
    ///   - `pss: SlurmClusterResolver: the jobs ask for 4 tasks (ps 1, worker 3) but the Slurm step has 3
    ///      (SLURM_STEP_NUM_TASKS); the task counts must add up to the step's tasks: run srun -n 4, or ask for 3`
    ///   - `pss: SlurmClusterResolver: SLURM_STEP_NODELIST "n[1-" is not a valid Slurm hostlist: ...`
    ///   - `pss: SlurmClusterResolver: SLURM_STEP_TASKS_PER_NODE "1(x2)" gives 2 nodes but SLURM_STEP_NODELIST "n[1-3]" has 3`
    ///   - `pss: SlurmClusterResolver: SLURM_STEP_TASKS_PER_NODE "2(x2)" places 4 tasks but SLURM_STEP_NUM_TASKS is 3`
    ///   - `pss: SlurmClusterResolver: SLURM_PROCID is 3 but the step has 3 tasks, 0 to 2`
    ///   - `pss: SlurmClusterResolver: 2 tasks on a node with 2 GPUs each need 4 GPUs but gpus_per_node is 2`
    explicit SlurmClusterResolver(Jobs jobs = {}, int port_base = 8888, std::optional<int> gpus_per_node = std::nullopt,
                                  std::optional<int> gpus_per_task = std::nullopt,
                                  std::optional<int> tasks_per_node = std::nullopt, bool auto_set_gpu = true,
                                  std::string rpc_layer = "grpc")
        : SlurmClusterResolver(EnvironmentLookup(detail::process_environment), std::move(jobs), port_base, gpus_per_node,
                               gpus_per_task, tasks_per_node, auto_set_gpu, std::move(rpc_layer)) {}

    /// @brief The same, reading the variables through `environment` instead of the process environment
    /// (for tests, and for programs that learn the Slurm values some other way). An empty function reads
    /// the process environment.
    explicit SlurmClusterResolver(EnvironmentLookup environment, Jobs jobs = {}, int port_base = 8888,
                                  std::optional<int> gpus_per_node = std::nullopt,
                                  std::optional<int> gpus_per_task = std::nullopt,
                                  std::optional<int> tasks_per_node = std::nullopt, bool auto_set_gpu = true,
                                  std::string rpc_layer = "grpc")
        : port_base_(port_base), auto_set_gpu_(auto_set_gpu) {
        rpc_layer_ = std::move(rpc_layer);
        if (!environment) environment = detail::process_environment;
        resolve(environment, std::move(jobs), gpus_per_node, gpus_per_task, tasks_per_node);
    }

    /// @brief The hosts of a Slurm hostlist, in order and without removing repeats, as TensorFlow's
    /// `expand_hostlist`: `n[1-2],m5,o[3-4,6,7-9]` gives n1 n2 m5 o3 o4 o6 o7 o8 o9. Leading zeros are
    /// kept (the width of a range's first number): `node[001-003]` gives node001 node002 node003. Text
    /// may follow a range and a name may have several (`r[1-2]n[1-2]` gives r1n1 r1n2 r2n1 r2n2, as
    /// Slurm does). "" gives no hosts.
    /// @throws InvalidArgumentError `pss: SlurmClusterResolver: hostlist "n[1-" is not a valid Slurm hostlist:
    ///         '[' at position 1 is never closed; write it as Slurm does, e.g. "n[1-2],m5,o[3-4,6,7-9]"`; the
    ///         other reasons: an empty host name, ']' without '[', '[' inside a range, an empty range, a range
    ///         item that is not N or N-M, a range that goes down, more than 1048576 hosts.
    [[nodiscard]] static std::vector<std::string> expand_hostlist(std::string_view hostlist) {
        return expand_hostlist(hostlist, "hostlist");
    }

    /// @brief The task counts of a Slurm tasks-per-node list, in node order, as TensorFlow's
    /// `expand_tasks_per_node`: `3(x2),2,1` gives 3 3 2 1.
    /// @throws InvalidArgumentError `pss: SlurmClusterResolver: tasks-per-node list "3(2)" is not valid: "3(2)" is
    ///         not N or N(xR); write it as Slurm does, e.g. "3(x2),2,1"`, and the same for "" or more than
    ///         1048576 nodes.
    [[nodiscard]] static std::vector<int> expand_tasks_per_node(std::string_view tasks_per_node) {
        return expand_tasks_per_node(tasks_per_node, "tasks-per-node list");
    }


    /// @brief `SLURM_PROCID`: this task's rank in the step.
    [[nodiscard]] int rank() const noexcept { return rank_; }
    /// @brief The jobs laid out, given or TensorFlow's default `{{"worker", n}}`.
    [[nodiscard]] const Jobs& jobs() const noexcept { return jobs_; }
    /// @brief The step's nodes, in Slurm's order.
    [[nodiscard]] const std::vector<std::string>& hosts() const noexcept { return hosts_; }
    /// @brief The number of tasks on each node of `hosts()`.
    [[nodiscard]] const std::vector<int>& tasks_per_node() const noexcept { return tasks_per_node_; }
    /// @brief The port of the first task on each node.
    [[nodiscard]] int port_base() const noexcept { return port_base_; }
    /// @brief GPUs on each node, given or counted.
    [[nodiscard]] int gpus_per_node() const noexcept { return gpus_per_node_; }
    /// @brief GPUs for each task, given or computed (TensorFlow's `num_accelerators()["GPU"]`).
    [[nodiscard]] int gpus_per_task() const noexcept { return gpus_per_task_; }
    /// @brief The `auto_set_gpu` argument; pss does not act on it (see the class comment).
    [[nodiscard]] bool auto_set_gpu() const noexcept { return auto_set_gpu_; }
    /// @brief The GPUs of this task as TensorFlow would set `CUDA_VISIBLE_DEVICES`, e.g. "2,3"; "" without GPUs.
    [[nodiscard]] const std::string& cuda_visible_devices() const noexcept { return cuda_visible_devices_; }

private:
    static constexpr std::size_t max_expanded = std::size_t{1} << 20;  // hosts or nodes a list may expand to
    static constexpr std::string_view where = "pss: SlurmClusterResolver: ";

    [[noreturn]] static void throw_bad_hostlist(std::string_view what, std::string_view text, const std::string& reason) {
        throw InvalidArgumentError(std::string(where) + std::string(what) + " " + detail::quoted(text) +
                                   " is not a valid Slurm hostlist: " + reason +
                                   "; write it as Slurm does, e.g. \"n[1-2],m5,o[3-4,6,7-9]\"");
    }

    /// The numbers of one range `[...]`'s contents ("3-4,6"), each zero-padded to its item's first number.
    static std::vector<std::string> expand_range(std::string_view what, std::string_view text, std::string_view range,
                                                 std::size_t position) {
        std::vector<std::string> values;
        if (range.empty()) throw_bad_hostlist(what, text, "the range at position " + std::to_string(position) + " is empty");
        std::size_t start = 0;
        while (start <= range.size()) {
            const std::size_t comma = std::min(range.find(',', start), range.size());
            const std::string_view item = range.substr(start, comma - start);
            const std::size_t dash = item.find('-');
            const std::string_view low_text = item.substr(0, dash);
            const std::string_view high_text = dash == std::string_view::npos ? low_text : item.substr(dash + 1);
            const auto number = [](std::string_view digits) -> std::optional<unsigned long long> {
                if (digits.empty() || digits.size() > 18) return std::nullopt;
                unsigned long long value = 0;
                const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
                if (error != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
                return value;
            };
            const auto low = number(low_text);
            const auto high = number(high_text);
            if (!low || !high) {
                throw_bad_hostlist(what, text, "the range at position " + std::to_string(position) + " has " +
                                                   detail::quoted(item) + ", which is not N or N-M with N and M numbers");
            }
            if (*high < *low) {
                throw_bad_hostlist(what, text, "the range at position " + std::to_string(position) + " has " +
                                                   detail::quoted(item) + ", which goes down");
            }
            if (*high - *low >= max_expanded || values.size() + (*high - *low) >= max_expanded) {
                throw_bad_hostlist(what, text, "it has more than " + std::to_string(max_expanded) + " hosts");
            }
            for (unsigned long long value = *low; value <= *high; ++value) {
                std::string digits = std::to_string(value);
                if (digits.size() < low_text.size()) digits.insert(0, low_text.size() - digits.size(), '0');
                values.push_back(std::move(digits));
            }
            start = comma + 1;
        }
        return values;
    }

    static std::vector<std::string> expand_hostlist(std::string_view hostlist, std::string_view what) {
        std::vector<std::string> hosts;
        std::size_t start = 0;
        while (start < hostlist.size()) {
            // One host expression: up to a comma outside brackets. Its names are the product of its pieces.
            std::vector<std::string> names{""};
            std::size_t i = start;
            std::size_t literal_start = start;
            const auto append = [&names](std::string_view piece) {
                for (auto& name : names) name += piece;
            };
            for (; i < hostlist.size() && hostlist[i] != ','; ++i) {
                if (hostlist[i] == ']') {
                    throw_bad_hostlist(what, hostlist, "']' at position " + std::to_string(i) + " has no '['");
                }
                if (hostlist[i] != '[') continue;
                append(hostlist.substr(literal_start, i - literal_start));
                const std::size_t close = hostlist.find_first_of("[]", i + 1);
                if (close == std::string_view::npos) {
                    throw_bad_hostlist(what, hostlist, "'[' at position " + std::to_string(i) + " is never closed");
                }
                if (hostlist[close] == '[') {
                    throw_bad_hostlist(what, hostlist, "'[' at position " + std::to_string(close) + " is inside a range");
                }
                const auto values = expand_range(what, hostlist, hostlist.substr(i + 1, close - i - 1), i);
                if (names.size() * values.size() + hosts.size() > max_expanded) {
                    throw_bad_hostlist(what, hostlist, "it has more than " + std::to_string(max_expanded) + " hosts");
                }
                std::vector<std::string> product;
                product.reserve(names.size() * values.size());
                for (const auto& name : names) {
                    for (const auto& value : values) product.push_back(name + value);
                }
                names = std::move(product);
                i = close;
                literal_start = close + 1;
            }
            append(hostlist.substr(literal_start, i - literal_start));
            if (i == start) {
                throw_bad_hostlist(what, hostlist, "the host name at position " + std::to_string(start) +
                                                       " is empty (two commas in a row, or a comma at an end)");
            }
            hosts.insert(hosts.end(), names.begin(), names.end());
            if (i + 1 == hostlist.size()) {  // a trailing comma
                throw_bad_hostlist(what, hostlist, "the host name at position " + std::to_string(i + 1) +
                                                       " is empty (two commas in a row, or a comma at an end)");
            }
            start = i + 1;
        }
        return hosts;
    }

    static std::vector<int> expand_tasks_per_node(std::string_view text, std::string_view what) {
        const auto bad = [&](const std::string& reason) {
            return InvalidArgumentError(std::string(where) + std::string(what) + " " + detail::quoted(text) + " is not valid: " +
                                        reason + "; write it as Slurm does, e.g. \"3(x2),2,1\"");
        };
        const auto number = [](std::string_view digits) -> std::optional<int> {
            if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
            return detail::parse_int(digits);
        };
        std::vector<int> counts;
        std::size_t start = 0;
        while (true) {
            const std::size_t comma = std::min(text.find(',', start), text.size());
            const std::string_view part = text.substr(start, comma - start);
            std::optional<int> tasks;
            std::optional<int> repeat = 1;
            if (const std::size_t open = part.find("(x"); open != std::string_view::npos && part.back() == ')') {
                tasks = number(part.substr(0, open));
                repeat = number(part.substr(open + 2, part.size() - open - 3));
            } else {
                tasks = number(part);
            }
            if (!tasks || !repeat) throw bad(detail::quoted(part) + " is not N or N(xR)");
            if (counts.size() + static_cast<std::size_t>(*repeat) > max_expanded) {
                throw bad("it has more than " + std::to_string(max_expanded) + " nodes");
            }
            counts.insert(counts.end(), static_cast<std::size_t>(*repeat), *tasks);
            if (comma == text.size()) break;
            start = comma + 1;
        }
        return counts;
    }

    static std::string require(const EnvironmentLookup& environment, std::string_view name) {
        auto value = environment(name);
        if (!value) {
            throw NotFoundError(std::string(where) + std::string(name) +
                                " is not set; this process is not running inside a Slurm step (srun)");
        }
        return std::move(*value);
    }

    static int require_int(const EnvironmentLookup& environment, std::string_view name, std::string_view meaning) {
        const std::string text = require(environment, name);
        const auto value = detail::parse_int(text);
        if (!value || *value < 0) {
            throw InvalidArgumentError(std::string(where) + std::string(name) + " is " + detail::quoted(text) +
                                       " but must be a whole number (" + std::string(meaning) + ")");
        }
        return *value;
    }

    void resolve(const EnvironmentLookup& environment, Jobs jobs, std::optional<int> gpus_per_node,
                 std::optional<int> gpus_per_task, std::optional<int> tasks_per_node) {
        const std::string at(where);
        rank_ = require_int(environment, "SLURM_PROCID", "this task's rank in the step");
        const int step_tasks = require_int(environment, "SLURM_STEP_NUM_TASKS", "the number of tasks of the step");
        if (step_tasks == 0) throw InvalidArgumentError(at + "SLURM_STEP_NUM_TASKS is 0; a Slurm step has at least one task");

        // The jobs: given, or TensorFlow's default of one worker per task. Their counts must fill the step.
        if (jobs.empty()) jobs = {{"worker", step_tasks}};
        long long asked = 0;
        std::string asked_list;
        for (const auto& [job, count] : jobs) {
            if (count < 0) {
                throw InvalidArgumentError(at + "job " + detail::quoted(job) + " asks for " + std::to_string(count) +
                                           " tasks; give each job 0 tasks or more");
            }
            asked += count;
            asked_list += (asked_list.empty() ? "" : ", ") + job + " " + std::to_string(count);
        }
        if (asked != step_tasks) {
            throw InvalidArgumentError(at + "the jobs ask for " + std::to_string(asked) + " tasks (" + asked_list +
                                       ") but the Slurm step has " + std::to_string(step_tasks) +
                                       " (SLURM_STEP_NUM_TASKS); the task counts must add up to the step's tasks: run "
                                       "srun -n " + std::to_string(asked) + ", or ask for " + std::to_string(step_tasks));
        }
        jobs_ = std::move(jobs);
        if (rank_ >= step_tasks) {
            throw InvalidArgumentError(at + "SLURM_PROCID is " + std::to_string(rank_) + " but the step has " +
                                       std::to_string(step_tasks) + " tasks, 0 to " + std::to_string(step_tasks - 1));
        }

        // The nodes and their task counts.
        const std::string nodelist = require(environment, "SLURM_STEP_NODELIST");
        hosts_ = expand_hostlist(nodelist, "SLURM_STEP_NODELIST");
        if (hosts_.empty()) throw InvalidArgumentError(at + "SLURM_STEP_NODELIST is empty; a Slurm step has at least one node");
        std::set<std::string_view> seen;
        for (const auto& host : hosts_) {
            if (!seen.insert(host).second) {
                throw InvalidArgumentError(at + "SLURM_STEP_NODELIST " + detail::quoted(nodelist) + " lists node " +
                                           detail::quoted(host) + " twice; each node must appear once");
            }
        }
        std::string placement;  // says where the task counts came from, for the messages
        if (tasks_per_node) {
            if (*tasks_per_node < 1) {
                throw InvalidArgumentError(at + "tasks_per_node is " + std::to_string(*tasks_per_node) +
                                           " but must be at least 1");
            }
            tasks_per_node_.assign(hosts_.size(), *tasks_per_node);
            placement = "tasks_per_node " + std::to_string(*tasks_per_node) + " on " + std::to_string(hosts_.size()) +
                        (hosts_.size() == 1 ? " node" : " nodes");
        } else {
            const std::string text = require(environment, "SLURM_STEP_TASKS_PER_NODE");
            tasks_per_node_ = expand_tasks_per_node(text, "SLURM_STEP_TASKS_PER_NODE");
            if (tasks_per_node_.size() != hosts_.size()) {
                throw InvalidArgumentError(at + "SLURM_STEP_TASKS_PER_NODE " + detail::quoted(text) + " gives " +
                                           std::to_string(tasks_per_node_.size()) + " nodes but SLURM_STEP_NODELIST " +
                                           detail::quoted(nodelist) + " has " + std::to_string(hosts_.size()));
            }
            placement = "SLURM_STEP_TASKS_PER_NODE " + detail::quoted(text);
        }
        long long placed = 0;
        for (const int count : tasks_per_node_) placed += count;
        if (placed != step_tasks) {
            throw InvalidArgumentError(at + placement + " places " + std::to_string(placed) +
                                       " tasks but SLURM_STEP_NUM_TASKS is " + std::to_string(step_tasks));
        }
        const int most_on_a_node = *std::max_element(tasks_per_node_.begin(), tasks_per_node_.end());
        if (port_base_ < 1 || port_base_ > 65535 - (most_on_a_node - 1)) {
            throw InvalidArgumentError(at + "port_base is " + std::to_string(port_base_) + " but with " +
                                       std::to_string(most_on_a_node) +
                                       " tasks on a node the ports must stay within 1 to 65535");
        }

        // GPUs, as TensorFlow computes them.
        if (!gpus_per_node) {
            const auto visible = environment("CUDA_VISIBLE_DEVICES");
            gpus_per_node = (!visible || visible->empty())
                                ? 0
                                : static_cast<int>(std::count(visible->begin(), visible->end(), ',')) + 1;
        }
        if (*gpus_per_node < 0) {
            throw InvalidArgumentError(at + "gpus_per_node is " + std::to_string(*gpus_per_node) + " but must not be negative");
        }
        if (!gpus_per_task) gpus_per_task = *gpus_per_node / most_on_a_node;
        if (*gpus_per_task < 0) {
            throw InvalidArgumentError(at + "gpus_per_task is " + std::to_string(*gpus_per_task) + " but must not be negative");
        }
        gpus_per_node_ = *gpus_per_node;
        gpus_per_task_ = *gpus_per_task;
        if (static_cast<long long>(most_on_a_node) * gpus_per_task_ > gpus_per_node_) {
            throw InvalidArgumentError(at + std::to_string(most_on_a_node) + " tasks on a node with " +
                                       std::to_string(gpus_per_task_) + " GPUs each need " +
                                       std::to_string(static_cast<long long>(most_on_a_node) * gpus_per_task_) +
                                       " GPUs but gpus_per_node is " + std::to_string(gpus_per_node_));
        }

        // Addresses in rank order, then the jobs take consecutive ranks in name order (std::map is sorted).
        std::vector<std::string> addresses;
        addresses.reserve(static_cast<std::size_t>(step_tasks));
        for (std::size_t node = 0; node < hosts_.size(); ++node) {
            for (int local = 0; local < tasks_per_node_[node]; ++local) {
                if (static_cast<int>(addresses.size()) == rank_) {
                    for (int gpu = local * gpus_per_task_; gpu < (local + 1) * gpus_per_task_; ++gpu) {
                        // Appended piece by piece: GCC 12 at -O3 warns falsely (-Wrestrict) on "," + string&&.
                        if (!cuda_visible_devices_.empty()) cuda_visible_devices_.push_back(',');
                        cuda_visible_devices_.append(std::to_string(gpu));
                    }
                }
                addresses.push_back(hosts_[node] + ":" + std::to_string(port_base_ + local));
            }
        }
        nlohmann::json cluster = nlohmann::json::object();
        int first = 0;
        for (const auto& [job, count] : jobs_) {
            cluster[job] = std::vector<std::string>(addresses.begin() + first, addresses.begin() + first + count);
            if (rank_ >= first && rank_ < first + count) {
                task_type_ = job;
                task_id_ = rank_ - first;
            }
            first += count;
        }
        cluster_spec_ = ClusterSpec::from_json(cluster, "SlurmClusterResolver: jobs");
    }

    int port_base_;
    bool auto_set_gpu_;
    int rank_ = 0;
    Jobs jobs_;
    std::vector<std::string> hosts_;
    std::vector<int> tasks_per_node_;
    int gpus_per_node_ = 0;
    int gpus_per_task_ = 0;
    std::string cuda_visible_devices_;
};

PSS_NAMESPACE_END
