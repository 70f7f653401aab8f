// pss/transport/auto.hpp: AutoTransport, in-process for the embedded cluster and TCP for a real one.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <utility>
#include <variant>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/message.hpp>
#include <pss/timeouts.hpp>
#include <pss/transport/in_process.hpp>
#include <pss/transport/tcp.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The Transport of a program that runs unchanged alone and as one task of a cluster (the
/// transport of ClusterStrategy).
///
/// Each kind of address names its link: the embedded cluster's addresses (`inproc:<job>:<index>`, as
/// LocalClusterResolver gives them, with rpc_layer "inproc") are threads of this process, reached by an
/// InProcessTransport; "host:port" addresses are reached by a TcpTransport. A cluster spec mixing both
/// is refused. Models Transport; `crosses_processes` is true, since its tasks may be other processes.
class AutoTransport {
public:
    static constexpr bool crosses_processes = true;

    /// @throws InvalidArgumentError when some addresses are embedded ones and others are not.
    explicit AutoTransport(const ClusterSpec& spec) {
        if (embedded(spec)) link_ = std::make_unique<InProcessTransport>(spec);
        else link_ = std::make_unique<TcpTransport>(spec);
    }
    /// @brief The transport of task `self` (a TcpTransport finds its TLS credentials in PSS_TLS_DIR so).
    AutoTransport(const ClusterSpec& spec, const TaskId& self) {
        if (embedded(spec)) link_ = std::make_unique<InProcessTransport>(spec);
        else link_ = std::make_unique<TcpTransport>(spec, self);
    }

    /// @brief The transport of task `self`, with `timeouts` (a TcpTransport's; the embedded cluster waits
    /// for no one), announcing lost and returning peers when `announce_peers`.
    AutoTransport(const ClusterSpec& spec, const TaskId& self, const Timeouts& timeouts, bool announce_peers) {
        if (embedded(spec)) link_ = std::make_unique<InProcessTransport>(spec);
        else link_ = std::make_unique<TcpTransport>(spec, self, timeouts, announce_peers);
    }

    void serve(const TaskId& task, RequestHandler handler) {
        std::visit([&](auto& link) { link->serve(task, std::move(handler)); }, link_);
    }
    std::future<Reply> send(const TaskId& task, Request request) {
        return std::visit([&](auto& link) { return link->send(task, std::move(request)); }, link_);
    }
    void shutdown() {
        std::visit([](auto& link) { link->shutdown(); }, link_);
    }

    /// @brief TcpTransport::chief_heard; empty for the embedded cluster (its chief is this process).
    [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> chief_heard() const {
        if (in_process()) return std::nullopt;
        return std::get<1>(link_)->chief_heard();
    }

    /// @brief True when the tasks are threads of this process.
    [[nodiscard]] bool in_process() const noexcept { return link_.index() == 0; }

private:
    static bool embedded(const ClusterSpec& spec) {
        int inproc = 0, total = 0;
        for (const auto& job : spec.jobs())
            for (int i = 0; i < spec.num_tasks(job); ++i, ++total)
                if (spec.task_address(TaskId{job, i}).starts_with("inproc:")) ++inproc;
        if (inproc != 0 && inproc != total)
            throw InvalidArgumentError("pss: AutoTransport: " + std::to_string(inproc) + " of the " +
                                       std::to_string(total) +
                                       " addresses of the cluster are embedded (\"inproc:...\") and the others are "
                                       "not; a cluster runs in one process or over the network, not both");
        return total != 0 && inproc == total;
    }

    std::variant<std::unique_ptr<InProcessTransport>, std::unique_ptr<TcpTransport>> link_;
};

PSS_NAMESPACE_END
