// pss/cluster/auto.hpp: AutoClusterResolver, which picks TF_CONFIG, Slurm, MPI or the in-process cluster.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/cluster/local.hpp>
#include <pss/cluster/mpi.hpp>
#include <pss/cluster/slurm.hpp>
#include <pss/cluster/tf_config.hpp>
#include <pss/config.hpp>
#include <pss/detail/resolved_task.hpp>
#include <pss/detail/environment.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The ClusterResolver that finds out how this program was started and asks the matching
/// resolver: one binary that runs under Kubeflow, Slurm, mpirun, pss-launch, or alone.
///
/// | checked | when                                                     | resolver                                                                  | `source()`  |
/// | ------- | -------------------------------------------------------- | ------------------------------------------------------------------------- | ----------- |
/// | 1       | `TF_CONFIG` is set and not `{}` or blank                 | `TFConfigClusterResolver` (Kubeflow TFJob, pss-launch, ...)               | "tf_config" |
/// | 2       | `SLURM_PROCID` is set                                    | `SlurmClusterResolver` with jobs chief 1, ps `num_ps`, worker the rest    | "slurm"     |
/// | 3       | one of `MpiClusterResolver::rank_variables` is set       | `MpiClusterResolver(num_ps, {}, port_base)`                               | "mpi"       |
/// | 4       | none of these                                            | the embedded cluster of `LocalClusterResolver<2, 2>`                      | "local"     |
///
/// Under Slurm and MPI the layout is the same: rank 0 is the chief, ranks 1 to `num_ps` the ps tasks,
/// the rest workers. `num_ps` is the constructor's argument, else `PSS_NUM_PS`, else 1; the first task
/// of each node listens on `PSS_PORT_BASE` (8888 when unset, as TensorFlow's), the next ones on the
/// next ports: `srun --export=ALL,PSS_NUM_PS=2,PSS_PORT_BASE=20000 -n 5 ./train`, or
/// `mpirun -x PSS_NUM_PS=2 -np 5 ./train`. Slurm comes before MPI because `srun --mpi=...` sets the PMI variables too. The
/// chosen resolver's errors are thrown as they are: a program started by srun with a bad Slurm
/// environment fails rather than running alone. The answers are copied from the chosen resolver when
/// the AutoClusterResolver is made.
///
/// @par Example
/// @code
/// pss::AutoClusterResolver resolver;
/// std::cout << "cluster from " << resolver.source() << ", I am " << resolver.task() << '\n';
/// @endcode
/// @see ClusterResolver, TFConfigClusterResolver, SlurmClusterResolver, MpiClusterResolver, LocalClusterResolver
class AutoClusterResolver : public detail::ResolvedTask {
public:
    /// @brief Looks up one environment variable; nullopt when unset.
    using EnvironmentLookup = detail::EnvironmentLookup;
    /// @brief The embedded cluster used when no launcher is found.
    using LocalResolver = LocalClusterResolver<2, 2>;

    /// @brief Looks at the process environment and resolves the cluster with the first match of the table.
    /// @param num_ps the ps tasks of the Slurm and MPI layouts, at least 1 (TF_CONFIG says its own; the local
    ///        cluster has 2)
    /// @throws Error whatever the chosen resolver throws, and InvalidArgumentError
    ///         `pss: AutoClusterResolver: the Slurm step has 2 tasks but 1 chief, 1 ps and at least 1 worker need 3;
    ///         run srun -n 3 or more, or give fewer ps tasks`, or naming a malformed `PSS_NUM_PS` or
    ///         `PSS_PORT_BASE`
    explicit AutoClusterResolver(int num_ps)
        : AutoClusterResolver(EnvironmentLookup(detail::process_environment), num_ps) {}
    /// @brief The same with `PSS_NUM_PS` ps tasks for the Slurm and MPI layouts (1 when unset).
    AutoClusterResolver() : AutoClusterResolver(EnvironmentLookup(detail::process_environment)) {}

    /// @brief The same, reading the variables through `environment` instead of the process environment.
    /// An empty function reads the process environment; no `num_ps` reads `PSS_NUM_PS` (1 when unset).
    explicit AutoClusterResolver(EnvironmentLookup environment, std::optional<int> ps_tasks = std::nullopt) {
        if (!environment) environment = detail::process_environment;
        if (ps_tasks && *ps_tasks < 1) {
            throw InvalidArgumentError("pss: AutoClusterResolver: num_ps is " + std::to_string(*ps_tasks) +
                                       " but a ParameterServerStrategy needs at least 1 ps task");
        }
        // Read only for the layouts that use them: a TF_CONFIG or the local cluster says its own.
        const auto num_ps = [&] {
            return ps_tasks ? *ps_tasks
                            : variable(environment, "PSS_NUM_PS", 1, 1, 1'000'000,
                                       "the number of ps tasks under Slurm or MPI");
        };
        const auto port_base = [&] {
            return variable(environment, "PSS_PORT_BASE", 8888, 1, 65535,
                            "the port of the first task on each node under Slurm or MPI");
        };
        std::optional<TFConfigClusterResolver> tf_config_resolver;
        if (const auto tf_config = environment("TF_CONFIG");
            tf_config && tf_config->find_first_not_of(" \t\r\n") != std::string::npos) {
            tf_config_resolver.emplace(*tf_config);
            // `{}` is TensorFlow's reading of no TF_CONFIG: another launcher may have started this process.
            if (tf_config_resolver->cluster_spec().as_dict().empty()) tf_config_resolver.reset();
        }
        if (tf_config_resolver) {
            const TFConfigClusterResolver& resolver = *tf_config_resolver;
            // Under TF_CONFIG each process is one task of a cluster of real addresses: without "task" it
            // would not know which, and would wait for tasks that never come.
            if (std::string_view(resolver.task_type()).empty())
                throw InvalidArgumentError(
                    "pss: TF_CONFIG has no \"task\": every process of a cluster must say which task it is, as in "
                    "{\"cluster\": {...}, \"task\": {\"type\": \"worker\", \"index\": 0}}; a program that runs the "
                    "whole cluster in one process needs no TF_CONFIG");
            take("tf_config", resolver);
        } else if (environment("SLURM_PROCID")) {
            const int port = port_base();
            take("slurm", SlurmClusterResolver(environment, slurm_jobs(environment, num_ps()), port));
        } else if (MpiClusterResolver::launched_by_mpi(environment)) {
            const int ps = num_ps();
            take("mpi", MpiClusterResolver(environment, ps, {}, port_base()));
        } else {
            take("local", LocalResolver{});
        }
    }

    /// @brief Which resolver answered: "tf_config", "slurm", "mpi" or "local".
    [[nodiscard]] const std::string& source() const noexcept { return source_; }

private:
    template <class Resolver>
    void take(std::string source, const Resolver& resolver) {
        source_ = std::move(source);
        cluster_spec_ = resolver.cluster_spec();
        task_type_ = resolver.task_type();
        task_id_ = resolver.task_id();
        rpc_layer_ = resolver.rpc_layer();
    }

    /// The whole number in variable `name` (`fallback` when unset), from `low` to `high`.
    static int variable(const EnvironmentLookup& environment, const char* name, int fallback, int low, int high,
                        const char* meaning) {
        const auto text = environment(name);
        if (!text) return fallback;
        const auto value = detail::parse_int(*text);
        if (!value || *value < low || *value > high)
            throw InvalidArgumentError(std::string("pss: AutoClusterResolver: ") + name + " is " + detail::quoted(*text) +
                                       " but must be a whole number from " + std::to_string(low) + " to " +
                                       std::to_string(high) + " (" + meaning + ")");
        return *value;
    }

    /// Chief 1, ps num_ps, worker the rest of the step; empty (so that SlurmClusterResolver reports the
    /// problem) when SLURM_STEP_NUM_TASKS is missing or not a number.
    static SlurmClusterResolver::Jobs slurm_jobs(const EnvironmentLookup& environment, int num_ps) {
        const auto text = environment("SLURM_STEP_NUM_TASKS");
        const auto tasks = text ? detail::parse_int(*text) : std::nullopt;
        if (!tasks || *tasks < 1) return {};
        if (static_cast<long long>(*tasks) < static_cast<long long>(num_ps) + 2) {
            const std::string need = std::to_string(static_cast<long long>(num_ps) + 2);
            throw InvalidArgumentError("pss: AutoClusterResolver: the Slurm step has " + std::to_string(*tasks) +
                                       " tasks but 1 chief, " + std::to_string(num_ps) + " ps and at least 1 worker need " +
                                       need + "; run srun -n " + need + " or more, or give fewer ps tasks");
        }
        return {{"chief", 1}, {"ps", num_ps}, {"worker", *tasks - 1 - num_ps}};
    }

    std::string source_;
};

PSS_NAMESPACE_END
