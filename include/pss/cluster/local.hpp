// pss/cluster/local.hpp: LocalClusterResolver, the embedded in-process cluster of one chief, N ps and M workers.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The ClusterResolver of the embedded cluster: every task runs in this process, one chief
/// (this program, the coordinator), `NumPs` parameter servers and `NumWorkers` workers.
///
/// The shape is a compile-time constant, so the task counts are `constexpr` and tests can
/// `static_assert` placement computed from them. `task_type()`, `rpc_layer()` and `address()` are
/// `constexpr` too, and g++ 12 evaluates them at compile time; clang 14 with libstdc++ 12 cannot build a
/// short std::string in a constant expression, so portable code uses only the counts at compile time. Addresses are
/// `inproc:<job>:<index>` ("inproc:ps:0"), meaningful only to the `InProcess` transport; `rpc_layer()`
/// is "inproc".
///
/// @tparam NumPs the number of ps tasks, at least 1
/// @tparam NumWorkers the number of worker tasks, at least 1
///
/// @par Example
/// @code
/// using Cluster = pss::LocalClusterResolver<2, 4>;
/// static_assert(Cluster::num_tasks("worker") == 4);
/// Cluster{}.cluster_spec().task_address("ps", 1);  // "inproc:ps:1"
/// @endcode
/// @see ClusterResolver
template <int NumPs = 2, int NumWorkers = 2>
class LocalClusterResolver {
    static_assert(NumPs >= 1,
                  "pss: LocalClusterResolver needs at least one ps task; use LocalClusterResolver<1, NumWorkers> or more");
    static_assert(NumWorkers >= 1,
                  "pss: LocalClusterResolver needs at least one worker task; use LocalClusterResolver<NumPs, 1> or more");

public:
    static constexpr int num_ps = NumPs;            ///< the number of "ps" tasks
    static constexpr int num_workers = NumWorkers;  ///< the number of "worker" tasks
    static constexpr int num_chiefs = 1;            ///< the number of "chief" tasks: this program
    static constexpr int num_tasks_total = num_chiefs + num_ps + num_workers;  ///< every task

    /// @brief The cluster `{"chief": ["inproc:chief:0"], "ps": ["inproc:ps:0", ...], "worker": [...]}`.
    /// Built once per instantiation; the same object on every call.
    [[nodiscard]] const ClusterSpec& cluster_spec() const {
        static const ClusterSpec spec = make_cluster_spec();
        return spec;
    }

    /// @brief "chief": the program that owns a LocalClusterResolver is the coordinator.
    [[nodiscard]] constexpr std::string task_type() const { return "chief"; }
    /// @brief 0: there is one chief.
    [[nodiscard]] constexpr int task_id() const noexcept { return 0; }
    /// @brief "inproc": the addresses are meant for the InProcess transport.
    [[nodiscard]] constexpr std::string rpc_layer() const { return "inproc"; }
    /// @brief This task, `TaskId{"chief", 0}`.
    [[nodiscard]] TaskId task() const { return TaskId{task_type(), task_id()}; }

    /// @brief The number of tasks of `job`: 1 for "chief", NumPs for "ps", NumWorkers for "worker", else 0.
    [[nodiscard]] static constexpr int num_tasks(std::string_view job) noexcept {
        if (job == "chief") return num_chiefs;
        if (job == "ps") return num_ps;
        if (job == "worker") return num_workers;
        return 0;
    }

    /// @brief The address of task `index` of `job`: `inproc:<job>:<index>`, e.g. "inproc:worker:3".
    /// @throws NotFoundError `pss: LocalClusterResolver has no job "foo"; its jobs are chief, ps, worker`
    /// @throws OutOfRangeError `pss: LocalClusterResolver: job "ps" has no task 2; it has 2 tasks, 0 to 1`
    [[nodiscard]] static constexpr std::string address(std::string_view job, int index) {
        const int count = num_tasks(job);
        if (count == 0) {
            throw NotFoundError("pss: LocalClusterResolver has no job \"" + std::string(job) +
                                "\"; its jobs are chief, ps, worker");
        }
        if (index < 0 || index >= count) {
            throw OutOfRangeError("pss: LocalClusterResolver: job \"" + std::string(job) + "\" has no task " +
                                  decimal(index) + "; it has " + decimal(count) + " tasks, 0 to " +
                                  decimal(count - 1));
        }
        // Written into a buffer and turned into a string once: g++ 12 cannot evaluate appends to a short
        // (SSO) std::string in a constant expression.
        std::array<char, 64> text{};
        std::size_t size = 0;
        for (const char c : std::string_view("inproc:")) text[size++] = c;
        for (const char c : job) text[size++] = c;  // job is "chief", "ps" or "worker" here
        text[size++] = ':';
        std::array<char, 16> digits{};
        std::size_t count_digits = 0;
        for (int rest = index; count_digits == 0 || rest > 0; rest /= 10) {
            digits[count_digits++] = static_cast<char>('0' + rest % 10);
        }
        while (count_digits > 0) text[size++] = digits[--count_digits];
        return std::string(text.data(), size);
    }

private:
    // std::to_string is not constexpr in C++20; only used on the throwing paths.
    static std::string decimal(int value) { return std::to_string(value); }

    static ClusterSpec make_cluster_spec() {
        ClusterSpec::JobMap jobs;
        for (const std::string_view job : {std::string_view("chief"), std::string_view("ps"), std::string_view("worker")}) {
            auto& addresses = jobs[std::string(job)];
            for (int i = 0; i < num_tasks(job); ++i) addresses.push_back(address(job, i));
        }
        return ClusterSpec(std::move(jobs));
    }
};

PSS_NAMESPACE_END
