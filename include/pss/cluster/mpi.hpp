// pss/cluster/mpi.hpp: MpiClusterResolver, the ClusterResolver of a task started by mpirun or mpiexec.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/detail/resolved_task.hpp>
#include <pss/detail/environment.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The ClusterResolver of a task started by an MPI launcher (`mpirun -n 5 ./train`): the rank
/// and world size come from the variables the launcher sets, and the rank gives the role. pss does not
/// use MPI itself; only the launcher.
///
/// The variables, read in this order (the first launcher found wins):
/// | launcher                         | rank                    | size                    | local rank |
/// | -------------------------------- | ----------------------- | ----------------------- | ---------- |
/// | Open MPI (`mpirun`)              | `OMPI_COMM_WORLD_RANK`  | `OMPI_COMM_WORLD_SIZE`  | `OMPI_COMM_WORLD_LOCAL_RANK` |
/// | MPICH, Intel MPI, any PMI-1/2    | `PMI_RANK`              | `PMI_SIZE`              | `MPI_LOCALRANKID` |
/// | PMIx (e.g. `prterun`)            | `PMIX_RANK`             | `OMPI_COMM_WORLD_SIZE`  | `OMPI_COMM_WORLD_LOCAL_RANK` |
///
/// Roles by rank: rank 0 is the chief, ranks 1 to `num_ps` the ps tasks, the rest workers, so the
/// world needs at least `num_ps + 2` processes. This is the layout `SlurmClusterResolver` gives with
/// jobs `{{"chief", 1}, {"ps", num_ps}, {"worker", n - 1 - num_ps}}`.
///
/// Addresses: the MPI variables do not say where the other ranks run, so the hosts come from the
/// `hosts` argument, else from `PSS_MPI_HOSTS` (comma separated), else 127.0.0.1 (one machine). A
/// list holds one host per rank, or one host for every rank. Rank r listens on port `port_base + r`.
///
/// @par Example
/// @code
/// // mpirun -n 4 -x PSS_MPI_HOSTS=a,a,b,b ./train
/// pss::MpiClusterResolver resolver;        // one ps
/// resolver.cluster_spec();  // chief: a:8888; ps: a:8889; worker: b:8890, b:8891
/// @endcode
/// @see ClusterResolver, SlurmClusterResolver, AutoClusterResolver
class MpiClusterResolver : public detail::ResolvedTask {
public:
    /// @brief Looks up one environment variable; nullopt when unset.
    using EnvironmentLookup = detail::EnvironmentLookup;

    /// @brief The rank variables whose presence says this process was started by an MPI launcher, in the
    /// order they are checked.
    static constexpr std::array<std::string_view, 3> rank_variables{"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};

    /// @brief Reads the MPI launcher's variables from the process environment and lays out the cluster.
    /// @param num_ps the number of ps tasks (ranks 1 to num_ps), at least 1
    /// @param hosts one host per rank, or one for every rank; empty: `PSS_MPI_HOSTS`, else 127.0.0.1
    /// @param port_base the port of rank 0; rank r listens on `port_base + r`
    /// @param rpc_layer the protocol of the addresses
    /// @throws NotFoundError `pss: MpiClusterResolver: no MPI launcher variables were found (OMPI_COMM_WORLD_RANK,
    ///         PMI_RANK, PMIX_RANK); start this program with mpirun or mpiexec`, or
    ///         `pss: MpiClusterResolver: OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not; ...`
    /// @throws InvalidArgumentError for a malformed variable or argument, naming it, e.g.
    ///   - `pss: MpiClusterResolver: PMI_RANK is "x" but must be a whole number (this process's rank)`
    ///   - `pss: MpiClusterResolver: the MPI world has 2 processes but 1 chief, 1 ps and at least 1 worker
    ///      need 3; start more (mpirun -n 3) or give fewer ps tasks`
    ///   - `pss: MpiClusterResolver: PSS_MPI_HOSTS has 2 hosts but the MPI world has 4 processes; give one host
    ///      per rank, or one host for all`
    explicit MpiClusterResolver(int num_ps = 1, std::vector<std::string> hosts = {}, int port_base = 8888,
                                std::string rpc_layer = "grpc")
        : MpiClusterResolver(EnvironmentLookup(detail::process_environment), num_ps, std::move(hosts), port_base,
                             std::move(rpc_layer)) {}

    /// @brief The same, reading the variables through `environment` instead of the process environment.
    /// An empty function reads the process environment.
    explicit MpiClusterResolver(EnvironmentLookup environment, int num_ps = 1, std::vector<std::string> hosts = {},
                                int port_base = 8888, std::string rpc_layer = "grpc")
        : num_ps_(num_ps), port_base_(port_base) {
        rpc_layer_ = std::move(rpc_layer);
        if (!environment) environment = detail::process_environment;
        resolve(environment, std::move(hosts));
    }

    /// @brief True when `environment` has one of `rank_variables`: the process was started by an MPI launcher.
    [[nodiscard]] static bool launched_by_mpi(const EnvironmentLookup& environment) {
        for (const auto name : rank_variables) {
            if (environment(name)) return true;
        }
        return false;
    }


    /// @brief This process's rank in the MPI world.
    [[nodiscard]] int rank() const noexcept { return rank_; }
    /// @brief The number of processes in the MPI world.
    [[nodiscard]] int size() const noexcept { return size_; }
    /// @brief This process's rank among those on its node, when the launcher says it.
    [[nodiscard]] std::optional<int> local_rank() const noexcept { return local_rank_; }
    /// @brief The number of ps tasks.
    [[nodiscard]] int num_ps() const noexcept { return num_ps_; }
    /// @brief The port of rank 0.
    [[nodiscard]] int port_base() const noexcept { return port_base_; }
    /// @brief Which launcher's variables were read: "openmpi", "pmi" or "pmix".
    [[nodiscard]] const std::string& launcher() const noexcept { return launcher_; }
    /// @brief The host of each rank.
    [[nodiscard]] const std::vector<std::string>& hosts() const noexcept { return hosts_; }

private:
    static constexpr std::string_view where = "pss: MpiClusterResolver: ";

    static int to_int(std::string_view name, const std::string& text, std::string_view meaning) {
        const auto value = detail::parse_int(text);
        if (!value || *value < 0) {
            throw InvalidArgumentError(std::string(where) + std::string(name) + " is " + detail::quoted(text) +
                                       " but must be a whole number (" + std::string(meaning) + ")");
        }
        return *value;
    }

    void resolve(const EnvironmentLookup& environment, std::vector<std::string> hosts) {
        const std::string at(where);
        struct Launcher {
            std::string_view name, rank, size, local_rank;
        };
        static constexpr std::array<Launcher, 3> launchers{{
            {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
            {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
            {"pmix", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        }};
        const Launcher* found = nullptr;
        std::string rank_text;
        for (const auto& launcher : launchers) {
            if (auto value = environment(launcher.rank)) {
                found = &launcher;
                rank_text = std::move(*value);
                break;
            }
        }
        if (found == nullptr) {
            throw NotFoundError(at +
                                "no MPI launcher variables were found (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK); "
                                "start this program with mpirun or mpiexec");
        }
        launcher_ = std::string(found->name);
        rank_ = to_int(found->rank, rank_text, "this process's rank");
        const auto size_text = environment(found->size);
        if (!size_text) {
            throw NotFoundError(at + std::string(found->rank) + " is set but " + std::string(found->size) +
                                " is not; the MPI launcher must set both (the rank and the number of processes)");
        }
        size_ = to_int(found->size, *size_text, "the number of processes");
        if (const auto local = environment(found->local_rank)) {
            local_rank_ = to_int(found->local_rank, *local, "this process's rank on its node");
        }
        if (rank_ >= size_) {
            throw InvalidArgumentError(at + std::string(found->rank) + " is " + std::to_string(rank_) + " but " +
                                       std::string(found->size) + " is " + std::to_string(size_) +
                                       "; a rank is less than the number of processes");
        }
        if (num_ps_ < 1) {
            throw InvalidArgumentError(at + "num_ps is " + std::to_string(num_ps_) +
                                       " but a ParameterServerStrategy needs at least 1 ps task");
        }
        if (static_cast<long long>(size_) < static_cast<long long>(num_ps_) + 2) {
            const std::string need = std::to_string(static_cast<long long>(num_ps_) + 2);
            throw InvalidArgumentError(at + "the MPI world has " + std::to_string(size_) + " processes but 1 chief, " +
                                       std::to_string(num_ps_) + " ps and at least 1 worker need " + need +
                                       "; start more (mpirun -n " + need + ") or give fewer ps tasks");
        }
        if (port_base_ < 1 || port_base_ > 65535 - (size_ - 1)) {
            throw InvalidArgumentError(at + "port_base is " + std::to_string(port_base_) + " but with " +
                                       std::to_string(size_) + " ranks the ports must stay within 1 to 65535");
        }

        // Hosts: the argument, else PSS_MPI_HOSTS, else this machine.
        std::string source = "hosts";
        if (hosts.empty()) {
            if (auto list = environment("PSS_MPI_HOSTS"); list && !list->empty()) {
                source = "PSS_MPI_HOSTS";
                std::size_t start = 0;
                while (true) {
                    const std::size_t comma = std::min(list->find(',', start), list->size());
                    hosts.push_back(list->substr(start, comma - start));
                    if (comma == list->size()) break;
                    start = comma + 1;
                }
            } else {
                hosts = {"127.0.0.1"};
            }
        }
        for (std::size_t i = 0; i < hosts.size(); ++i) {
            if (hosts[i].empty()) {
                throw InvalidArgumentError(at + source + " has an empty host at position " + std::to_string(i) +
                                           "; give host names separated by commas, e.g. \"node1,node2\"");
            }
        }
        if (hosts.size() == 1) hosts.assign(static_cast<std::size_t>(size_), hosts.front());
        if (hosts.size() != static_cast<std::size_t>(size_)) {
            throw InvalidArgumentError(at + source + " has " + std::to_string(hosts.size()) +
                                       " hosts but the MPI world has " + std::to_string(size_) +
                                       " processes; give one host per rank, or one host for all");
        }
        hosts_ = std::move(hosts);

        ClusterSpec::JobMap jobs{{"chief", {}}, {"ps", {}}, {"worker", {}}};
        for (int rank = 0; rank < size_; ++rank) {
            const std::string job = rank == 0 ? "chief" : rank <= num_ps_ ? "ps" : "worker";
            auto& addresses = jobs[job];
            if (rank == rank_) {
                task_type_ = job;
                task_id_ = static_cast<int>(addresses.size());
            }
            addresses.push_back(hosts_[static_cast<std::size_t>(rank)] + ":" + std::to_string(port_base_ + rank));
        }
        cluster_spec_ = ClusterSpec(std::move(jobs));
    }

    int num_ps_;
    int port_base_;
    std::string launcher_;
    int rank_ = 0;
    int size_ = 0;
    std::optional<int> local_rank_;
    std::vector<std::string> hosts_;
};

PSS_NAMESPACE_END
