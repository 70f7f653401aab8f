// pss/strategy.hpp: ParameterServerStrategy, the four policies composed into one type.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <condition_variable>
#include <deque>
#include <exception>
#include <thread>
#include <concepts>
#include <span>
#include <string>
#include <limits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/cluster/local.hpp>
#include <pss/concepts/cluster_resolver.hpp>
#include <pss/concepts/optimizer.hpp>
#include <pss/concepts/partitioner.hpp>
#include <pss/concepts/transport.hpp>
#include <pss/config.hpp>
#include <pss/consistency.hpp>
#include <pss/detail/json_text.hpp>
#include <pss/detail/closure_context.hpp>
#include <pss/distribute.hpp>
#include <pss/errors.hpp>
#include <pss/function.hpp>
#include <pss/optimizer/sgd.hpp>
#include <pss/partitioner/no_partition.hpp>
#include <pss/partitioner/shard_rows.hpp>
#include <pss/server.hpp>
#include <pss/timeouts.hpp>
#include <pss/transport/in_process.hpp>
#include <pss/variable.hpp>
#include <pss/version.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The ps task of the `n`-th shard placed by a strategy: round-robin over `num_ps` tasks, each
/// shard counting as one variable (TensorFlow's placement). constexpr, so a cluster whose shape is a
/// compile-time constant has a placement table the compiler checks.
[[nodiscard]] constexpr int round_robin_task(std::uint64_t n, int num_ps) noexcept {
    return static_cast<int>(n % static_cast<std::uint64_t>(num_ps));
}

/// @brief The ps tasks of the first `K` shards created on a cluster of `NumPs` ps tasks.
template <std::size_t K, int NumPs>
[[nodiscard]] constexpr std::array<int, K> round_robin_placement() noexcept {
    static_assert(NumPs >= 1, "pss: a placement needs at least one ps task");
    std::array<int, K> table{};
    for (std::size_t i = 0; i < K; ++i) table[i] = round_robin_task(i, NumPs);
    return table;
}

namespace detail {

/// What a ParameterServerStrategy talks through: a Channel to the ps tasks, and how the cluster ends.
class StrategyChannel : public Channel {
public:
    /// Stops this process's part of the cluster: on a served task, after the chief said so.
    virtual void join() {}
    virtual void shutdown() = 0;
    virtual RemoteWorkers* remote_workers() noexcept { return nullptr; }
    /// Waits for ps task `task`, lost and started again, to answer (the start-up timeout), and greets it
    /// as at start-up. Nothing to do when the ps tasks are threads of this process.
    virtual void greet_again(int /*task*/) {}
};

/// What a ps task started again after a loss answers an operation until the chief reaches it.
inline std::string started_again(const TaskId& ps) {
    return "pss: " + ps.to_string() + " started again and holds no shard of this run: the chief has not reached it since";
}

/// Asks `task` for a heartbeat through `send` every `interval` until it answers.
/// @throws UnavailableError naming the task when it does not answer within the start-up timeout
template <class Send>
void await_answer(const TaskId& task, const Timeouts& timeouts, std::chrono::milliseconds interval, Send&& send) {
    const auto started = std::chrono::steady_clock::now();
    for (;;) {
        Request probe;
        probe.kind = RequestKind::heartbeat;
        Reply answer = send(task, std::move(probe)).get();
        if (answer.ok()) return;
        if (timeouts.startup.count() > 0 && std::chrono::steady_clock::now() - started >= timeouts.startup)
            throw UnavailableError("pss: " + task.to_string() + " was lost and did not start again within " +
                                   format_seconds(timeouts.startup) + " (PSS_STARTUP_TIMEOUT); last: " + answer.message);
        std::this_thread::sleep_for(interval);
    }
}

/// The whole cluster in this process: its transport and the servers of every ps task.
template <Transport TransportPolicy, Optimizer OptimizerPolicy>
class TransportChannel final : public StrategyChannel {
public:
    TransportChannel(const ClusterSpec& spec, const OptimizerPolicy& optimizer, SyncOptions sync, const Timeouts& timeouts)
        : transport_(spec), synchronous_(sync.synchronous), timeouts_(timeouts),
          lost_(std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(spec.num_tasks("ps")))) {
        const int num_ps = spec.num_tasks("ps");
        servers_.reserve(static_cast<std::size_t>(num_ps));
        const ServerOptions options = ServerOptions::from_environment();
        for (int i = 0; i < num_ps; ++i) {
            servers_.push_back(std::make_unique<ParameterServer<OptimizerPolicy>>(optimizer, sync, options));
            auto* server = servers_.back().get();
            const TaskId task{"ps", i};
            transport_.serve(task, [this, server, task](Request&& r, Responder respond) {
                if (r.kind == RequestKind::operation && lost_[static_cast<std::size_t>(task.index)].load())
                    return respond(Reply::error(ErrorCode::unavailable, started_again(task)));
                server->handle(std::move(r), std::move(respond));
            });
            // A transport whose tasks can crash (SimulatedTransport) tells when one did: its shards are
            // lost, and it holds none of this run until greet_again (ClusterCoordinator::recover_ps_from).
            if constexpr (requires(std::function<void()> f) { transport_.on_crash(task, std::move(f)); })
                transport_.on_crash(task, [this, server, task] {
                    lost_[static_cast<std::size_t>(task.index)].store(true);
                    server->release_held();
                    server->clear("the task crashed");
                });
        }
    }
    ~TransportChannel() override { shutdown(); }

    std::future<Reply> send(int task, Request request) override {
        // A synchronous push from a closure names its worker, as TLS proves a worker process's: the ps
        // takes one push a step from it, so a closure run again after a lost reply (or a message its
        // transport delivered twice) does not count twice. The chief's own pushes name no one.
        if (synchronous_ && request.step != 0 && !request.sender)
            if (const auto* closure = ClosureContext::current(); closure != nullptr && closure->worker >= 0)
                request.sender = TaskId{"worker", closure->worker};
        return transport_.send(TaskId{"ps", task}, std::move(request));
    }
    [[nodiscard]] std::string device(int task) const override {
        return TaskId{"ps", task}.to_string() + "/device:CPU:0";
    }
    [[nodiscard]] bool synchronous() const noexcept override { return synchronous_; }
    [[nodiscard]] bool shares_memory() const noexcept override {
        if constexpr (requires { TransportPolicy::shares_memory; }) return TransportPolicy::shares_memory;
        return false;
    }
    void shutdown() override {
        transport_.shutdown();
        for (auto& server : servers_) server->release_held();  // a pull waiting for a step gets unavailable
    }

    /// A task that crashed (a transport that can crash them): waits for it to answer a heartbeat (asked
    /// every millisecond, for the start-up timeout), then takes its operations again; recreate_shards
    /// creates its shards next.
    void greet_again(int task) override {
        await_answer(TaskId{"ps", task}, timeouts_, std::chrono::milliseconds(1),
                     [this](const TaskId& to, Request r) { return transport_.send(to, std::move(r)); });
        lost_[static_cast<std::size_t>(task)].store(false);
    }

private:
    TransportPolicy transport_;
    bool synchronous_;
    Timeouts timeouts_;
    std::unique_ptr<std::atomic<bool>[]> lost_;  // per ps task: crashed, not greeted again since
    std::vector<std::unique_ptr<ParameterServer<OptimizerPolicy>>> servers_;  // outlive the transport's threads
};

/// A transport of task `self`: told its task (TcpTransport finds its TLS credentials so), the timeouts
/// and whether to announce lost peers, as far as it takes them.
template <class TransportPolicy>
std::unique_ptr<TransportPolicy> new_transport(const ClusterSpec& spec, const TaskId& self, const Timeouts& timeouts,
                                               bool announce_peers) {
    if constexpr (std::constructible_from<TransportPolicy, const ClusterSpec&, const TaskId&, const Timeouts&, bool>)
        return std::make_unique<TransportPolicy>(spec, self, timeouts, announce_peers);
    else if constexpr (std::constructible_from<TransportPolicy, const ClusterSpec&, const TaskId&>)
        return std::make_unique<TransportPolicy>(spec, self);
    else
        return std::make_unique<TransportPolicy>(spec);
}

/// One thread that runs a worker task's calls in order, so that the transport's threads stay free: a
/// call may run a step for an hour while the task still answers heartbeats.
class CallThread {
public:
    CallThread() : thread_([this] { run(); }) {}
    CallThread(const CallThread&) = delete;
    CallThread& operator=(const CallThread&) = delete;
    ~CallThread() { stop(); }

    void post(std::function<void()> call) {
        {
            std::lock_guard lock(mutex_);
            if (stopped_) return;  // dropped: its Responder answers unavailable
            calls_.push_back(std::move(call));
        }
        ready_.notify_one();
    }

    /// Finishes the call running, drops the others, joins the thread. Idempotent.
    void stop() {
        {
            std::lock_guard lock(mutex_);
            stopped_ = true;
        }
        ready_.notify_one();
        if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
        std::lock_guard lock(mutex_);
        calls_.clear();
    }

private:
    void run() {
        std::unique_lock lock(mutex_);
        for (;;) {
            ready_.wait(lock, [&] { return stopped_ || !calls_.empty(); });
            if (stopped_) return;
            auto call = std::move(calls_.front());
            calls_.pop_front();
            lock.unlock();
            call();
            lock.lock();
        }
    }

    std::mutex mutex_;
    std::condition_variable ready_;
    std::deque<std::function<void()>> calls_;
    bool stopped_ = false;
    std::thread thread_;  // last: started after the rest
};

/// What every task of a cluster must agree on: the optimizer a ps applies, the consistency a ps counts
/// pushes by and a worker numbers steps by, the cluster's shape, and the library's version. The
/// partitioner is not in it: only the chief partitions, and each variable's shard layout travels with it.
template <class OptimizerPolicy>
nlohmann::json cluster_fingerprint(const OptimizerPolicy& optimizer, const SyncOptions& sync, const ClusterSpec& spec) {
    nlohmann::json jobs = nlohmann::json::object();
    for (const auto& job : spec.jobs()) jobs[job] = spec.num_tasks(job);
    return {{"pss", std::to_string(PSS_VERSION_MAJOR) + "." + std::to_string(PSS_VERSION_MINOR) + "." +
                        std::to_string(PSS_VERSION_PATCH)},
            {"optimizer", {{"name", std::string(OptimizerPolicy::name())}, {"config", optimizer.get_config()}}},
            {"consistency", {{"synchronous", sync.synchronous}, {"staleness", sync.staleness}}},
            {"cluster", std::move(jobs)}};
}

/// The answer of a ps to a handshake `sent` (its CBOR, parsed): ok when the fingerprint the peer sent
/// is `ours`, else the differences, each part as both tasks run it.
inline Reply answer_handshake(const nlohmann::json& ours, const TaskId& self, const nlohmann::json& sent) {
    if (!sent.is_object() || !sent.contains("fingerprint") || !sent.contains("task") || !sent["task"].is_string())
        return Reply::error(ErrorCode::invalid_argument,
                            "pss: a handshake to " + self.to_string() + " must carry {\"task\", \"fingerprint\"}");
    const nlohmann::json& theirs = sent["fingerprint"];
    if (theirs == ours) return {};
    const std::string peer = sent["task"].get<std::string>();
    std::string differences;
    for (const auto& [part, value] : ours.items()) {
        const nlohmann::json other = theirs.is_object() && theirs.contains(part) ? theirs[part] : nlohmann::json();
        if (other == value) continue;
        differences += (differences.empty() ? "" : "; ") + part + " " + dumped(other) + " on " + peer + ", " +
                       dumped(value) + " on " + self.to_string();
    }
    return Reply::error(ErrorCode::failed_precondition,
                        "pss: " + peer + " and " + self.to_string() + " run different configurations: " + differences +
                            ". Every task of a cluster must run the same optimizer, consistency and cluster");
}

/// One task of a cluster whose tasks are separate processes. Every role sends through `client_`; a ps
/// or worker task also serves its own address through `server_`, a transport of its own, so that a
/// worker's call, which waits for replies from the ps tasks, never holds the threads those replies
/// arrive on.
template <Transport TransportPolicy, Optimizer OptimizerPolicy>
class ClusterTaskChannel final : public StrategyChannel,
                                 public RemoteWorkers,
                                 public std::enable_shared_from_this<ClusterTaskChannel<TransportPolicy, OptimizerPolicy>> {
public:
    ClusterTaskChannel(const ClusterSpec& spec, TaskId self, const OptimizerPolicy& optimizer, SyncOptions sync,
                       const Timeouts& timeouts)
        : spec_(spec),
          self_(std::move(self)),
          optimizer_(optimizer),
          sync_(sync),
          timeouts_(timeouts),
          fingerprint_(cluster_fingerprint(optimizer_, sync_, spec_)),
          client_(new_transport<TransportPolicy>(spec, self_, timeouts_, self_.type == "chief")) {}
    ~ClusterTaskChannel() override { shutdown(); }

    /// Serves this task's address when it is a ps or a worker (after construction: the handler needs
    /// shared_from_this).
    void start() {
        if (self_.type == "ps") {
            ps_ = std::make_unique<ParameterServer<OptimizerPolicy>>(optimizer_, sync_,
                                                                     ServerOptions::from_environment());
            draws_ = std::make_unique<CallThread>();
            server_ = new_transport<TransportPolicy>(spec_, self_, timeouts_, false);
            server_->serve(self_, [this](Request&& r, Responder respond) {
                if (r.kind == RequestKind::shutdown) return respond(stop_requested());
                if (r.kind == RequestKind::call && r.name == handshake_call) {
                    const auto sent = nlohmann::json::from_cbor(r.values.cbor, true, false);  // discarded: refused
                    Reply reply = answer_handshake(fingerprint_, self_, sent);
                    if (reply.ok()) begin_run(sent);
                    return respond(std::move(reply));
                }
                // Variables are created after the chief's greeting; before it, this task started again
                // after a loss, and a worker still working on the last run's shards is told so (it is the
                // ps's loss, not a missing variable; ClusterCoordinator::recover_ps_from waits for it).
                if (!ps_run_ && r.kind == RequestKind::operation)
                    return respond(Reply::error(ErrorCode::unavailable, started_again(self_)));
                // A shard drawn from its initializer is drawn on a thread of its own: a GiB takes seconds
                // (mostly page faults), and this strand answers the heartbeats that keep this task alive
                // in the chief's eyes. Nothing uses the shard before its create is answered.
                if (r.kind == RequestKind::operation && r.op == Op::create && r.initializer &&
                    !r.payload.has_value() && !r.initializer->problem(std::numeric_limits<std::uint64_t>::max())) {
                    auto job = std::make_shared<std::pair<Request, Responder>>(std::move(r), std::move(respond));
                    return draws_->post([this, job] {
                        auto& [request, responder] = *job;
                        try {
                            request.payload = detail::initial_shard(*request.initializer);
                            request.initializer.reset();
                        } catch (...) {  // out of memory: answered here, the strand never waits for a retry
                            return responder(Reply::of_current_exception());
                        }
                        std::lock_guard lock(ps_mutex_);
                        ps_->handle(std::move(request), std::move(responder));
                    });
                }
                std::lock_guard lock(ps_mutex_);
                ps_->handle(std::move(r), std::move(respond));
            });
        } else if (self_.type == "worker") {
            server_ = new_transport<TransportPolicy>(spec_, self_, timeouts_, false);
            calls_ = std::make_unique<CallThread>();
            std::weak_ptr<ClusterTaskChannel> weak = this->shared_from_this();
            server_->serve(self_, [this, weak](Request&& r, Responder respond) {
                if (r.kind == RequestKind::shutdown) return respond(stop_requested());
                if (r.kind != RequestKind::call)
                    return respond(Reply::error(ErrorCode::invalid_argument,
                                                "pss: a " + std::string(op_name(r.op)) + " request reached worker task " +
                                                    self_.to_string() +
                                                    ", which runs calls only (variables live on ps tasks)"));
                // On the call thread: the transport's thread goes on answering heartbeats meanwhile.
                calls_->post([this, weak, r = std::make_shared<Request>(std::move(r)),
                              respond = std::make_shared<Responder>(std::move(respond))] {
                    const ClosureContext context{self_.index};
                    const ClosureContext::Guard current(context);
                    try {
                        Reply reply;
                        reply.values = run_call(r->name, std::move(r->values), CallContext{weak.lock(), self_.index});
                        (*respond)(std::move(reply));
                    } catch (const std::exception& e) {  // run_call answers a function's errors itself
                        (*respond)(Reply::error(ErrorCode::internal, std::string("pss: worker call: ") + e.what()));
                    }
                });
            });
        }
    }

    /// A chief or worker checks that every ps runs its configuration (waiting for each to come up).
    /// @throws FailedPreconditionError naming each part that differs, as each task runs it
    void handshake() {
        if (self_.type == "ps") return;
        std::vector<std::future<Reply>> replies;
        for (int i = 0; i < spec_.num_tasks("ps"); ++i) replies.push_back(greet(i));
        for (auto& reply : replies) {
            // A worker the chief ends while it waits for a ps task that is not up (its address retried for
            // the start-up timeout) stops waiting at once: it starts as stopped, its join() returns, and
            // the transport's shutdown cancels the retries.
            if (self_.type == "worker" && !wait_unless_stopped(reply)) return;
            Reply r = reply.get();
            if (r.ok()) continue;
            // A worker the chief ended while it was greeting the ps tasks (a short program: the chief ends
            // the workers, then the ps tasks, which may go before this greeting reaches them): it was told
            // to stop, so it starts as stopped and its join() returns at once.
            if (self_.type == "worker" && stop_was_requested()) return;
            throw_error(r.code, r.message);
        }
    }

    /// Waits for `reply`; false when the chief asked this task to stop first.
    bool wait_unless_stopped(std::future<Reply>& reply) {
        while (reply.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready)
            if (stop_was_requested()) return false;
        return true;
    }

    /// The chief: waits for ps task `task` to answer a heartbeat (asked every heartbeat interval, for the
    /// start-up timeout), then greets it.
    /// @throws UnavailableError naming the task when it does not answer in time
    void greet_again(int task) override {
        const TaskId ps{"ps", task};
        await_answer(ps, timeouts_, std::max(timeouts_.heartbeat_interval, std::chrono::milliseconds(100)),
                     [this](const TaskId& to, Request r) { return client_->send(to, std::move(r)); });
        Reply r = greet(task).get();
        if (!r.ok()) throw_error(r.code, r.message);
    }

    std::future<Reply> send(int task, Request request) override {
        return client_->send(TaskId{"ps", task}, std::move(request));
    }
    [[nodiscard]] std::string device(int task) const override {
        return TaskId{"ps", task}.to_string() + "/device:CPU:0";
    }
    [[nodiscard]] bool synchronous() const noexcept override { return sync_.synchronous; }
    std::future<Reply> call(int worker, Request request) override {
        return client_->send(TaskId{"worker", worker}, std::move(request));
    }
    std::future<Reply> probe(int worker) override {
        Request request;
        request.kind = RequestKind::heartbeat;  // answered by its transport: a busy call thread does not matter
        return client_->send(TaskId{"worker", worker}, std::move(request));
    }
    [[nodiscard]] const Timeouts& timeouts() const noexcept override { return timeouts_; }
    RemoteWorkers* remote_workers() noexcept override { return self_.type == "chief" ? this : nullptr; }

    /// A ps or worker serves until the chief's shutdown request; the chief sends that request to every
    /// worker, then to every ps (the workers may still be pushing), and every task then closes. A task
    /// that has not heard from a chief for the chief timeout stops serving (Timeouts::chief).
    /// @throws UnavailableError `pss: /job:ps/replica:0/task:1: no chief was heard from for 600 s (PSS_CHIEF_TIMEOUT); ...`
    void join() override {
        if (server_) {
            std::unique_lock lock(mutex_);
            while (!stopped_.wait_for(lock, chief_check_interval(), [&] { return stop_; })) {
                if (!chief_gone()) continue;
                lock.unlock();
                shutdown();
                throw UnavailableError("pss: " + self_.to_string() + ": no chief was heard from for " +
                                       detail::format_seconds(timeouts_.chief) +
                                       " (PSS_CHIEF_TIMEOUT); this task stops serving. The chief ended without "
                                       "ending the cluster, or cannot reach this task");
            }
        } else if (self_.type == "chief") {
            end_cluster();
        }
        shutdown();
    }

    void shutdown() override {
        std::lock_guard lock(shutdown_mutex_);
        if (server_) server_->shutdown();
        if (draws_) draws_->stop();
        if (ps_) {
            std::lock_guard ps_lock(ps_mutex_);
            ps_->release_held();  // a pull waiting for a step gets unavailable
        }
        client_->shutdown();
        if (calls_) calls_->stop();  // after the client: a call waiting for a ps is answered first
    }

private:
    [[nodiscard]] std::chrono::milliseconds chief_check_interval() const {
        if (!timeouts_.chief_bounded()) return std::chrono::hours(1);
        return std::clamp<std::chrono::milliseconds>(timeouts_.chief / 8, std::chrono::milliseconds(10),
                                                     std::chrono::seconds(1));
    }

    /// True when this task serves a transport that tells when a chief was last heard, and no chief was
    /// heard from for the chief timeout since then (or since this task began serving).
    [[nodiscard]] bool chief_gone() const {
        if constexpr (requires(const TransportPolicy& t) { t.chief_heard(); }) {
            if (!timeouts_.chief_bounded()) return false;
            const auto heard = server_->chief_heard();
            return heard && std::chrono::steady_clock::now() - *heard >= timeouts_.chief;
        } else {
            return false;
        }
    }

    /// This task's handshake to ps task `task`: its configuration, and a chief's run.
    std::future<Reply> greet(int task) {
        nlohmann::json hello = {{"task", self_.to_string()}, {"fingerprint", fingerprint_}};
        if (self_.type == "chief") hello["run"] = run_;
        Request request;
        request.kind = RequestKind::call;
        request.name = std::string(handshake_call);
        request.values.cbor = nlohmann::json::to_cbor(hello);
        return client_->send(TaskId{"ps", task}, std::move(request));
    }

    /// A ps task: a chief's handshake names its run; a chief of another run than the last (the chief
    /// was started again while this task served on) begins a new run here: the last run's shards are
    /// dropped, so the new chief creates its variables again and restores them from its checkpoint.
    /// On the task's strand, as every request.
    void begin_run(const nlohmann::json& sent) {
        if (!sent.contains("run") || !sent["run"].is_number_unsigned()) return;  // a worker's
        const auto run = sent["run"].get<std::uint64_t>();
        if (ps_run_ && *ps_run_ != run) {
            std::lock_guard lock(ps_mutex_);
            const std::size_t dropped = ps_->num_shards();
            ps_->clear("a new chief began a new run");
            std::fprintf(stderr, "pss: %s: a new chief connected (a new run); dropped the last run's %zu shard%s\n",
                         self_.to_string().c_str(), dropped, dropped == 1 ? "" : "s");
        }
        ps_run_ = run;
    }

    /// A random id of this chief's run: a ps tells a restarted chief by it.
    static std::uint64_t new_run_id() {
        std::random_device device;
        return (static_cast<std::uint64_t>(device()) << 32) ^ device();
    }

    bool stop_was_requested() {
        std::lock_guard lock(mutex_);
        return stop_;
    }

    Reply stop_requested() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        stopped_.notify_all();
        return {};
    }

    void end_cluster() {
        for (const char* job : {"worker", "ps"}) {
            std::vector<std::future<Reply>> replies;
            for (int i = 0; i < spec_.num_tasks(job); ++i) {
                Request request;
                request.kind = RequestKind::shutdown;
                replies.push_back(client_->send(TaskId{job, i}, std::move(request)));
            }
            // A task already gone has ended anyway: a lost worker is not waited for (its address would
            // be retried for the whole connect timeout), the transport's shutdown answers its request.
            for (auto& r : replies) (void)r.wait_for(std::chrono::seconds(2));
        }
    }

    ClusterSpec spec_;
    TaskId self_;
    OptimizerPolicy optimizer_;
    SyncOptions sync_;
    Timeouts timeouts_;
    nlohmann::json fingerprint_;
    std::uint64_t run_ = new_run_id();          // a chief's
    std::optional<std::uint64_t> ps_run_;       // a ps task's: the run of the chief it serves
    std::unique_ptr<TransportPolicy> client_;
    std::unique_ptr<ParameterServer<OptimizerPolicy>> ps_;
    std::unique_ptr<CallThread> calls_;        // a worker's: stopped by shutdown, after the client
    std::unique_ptr<TransportPolicy> server_;  // after ps_: its threads stop before ps_ goes
    std::unique_ptr<CallThread> draws_;        // a ps's initial shards (see start); stops first
    std::mutex mutex_, shutdown_mutex_;
    std::mutex ps_mutex_;  // ps_ is used by the server's strand and by draws_
    std::condition_variable stopped_;
    bool stop_ = false;
};

/// The ps task that variables created on this thread go to while a colocate_vars_with guard lives.
struct Colocation {
    const void* strategy = nullptr;  // whose variables it places
    int task = -1;
    static Colocation& current() noexcept {
        thread_local Colocation colocation;
        return colocation;
    }
};

}  // namespace detail

/// @brief RAII guard of `ParameterServerStrategy::colocate_vars_with` (TensorFlow's `with
/// strategy.extended.colocate_vars_with(v):`): puts back the placement that was in effect.
class [[nodiscard]] ColocationScope {
public:
    ColocationScope(const void* strategy, int task) : previous_(detail::Colocation::current()) {
        detail::Colocation::current() = {strategy, task};
    }
    ColocationScope(const ColocationScope&) = delete;
    ColocationScope& operator=(const ColocationScope&) = delete;
    ~ColocationScope() { detail::Colocation::current() = previous_; }

private:
    detail::Colocation previous_;
};

/// @brief Parameter-server training (tf.distribute.ParameterServerStrategy), its policies chosen at
/// compile time.
///
/// Variables created while `scope()` is active are split by the Partitioner along axis 0 (the first
/// `dim0 % k` shards get one extra row) and placed round-robin over the ps tasks, each shard counting
/// as one variable. Each ps task owns its shards and applies the Optimizer to them; every operation
/// reaches it through the Transport.
///
/// @tparam TransportPolicy how requests reach the ps tasks (InProcessTransport: threads of this process)
/// @tparam PartitionerPolicy how many shards a variable gets (NoPartitioner: one)
/// @tparam OptimizerPolicy how a ps applies gradients (SGD with learning rate 0.01)
/// @tparam ClusterResolverPolicy who is in the cluster (LocalClusterResolver<2, 2>: 2 ps, 2 workers, a chief)
/// @tparam ConsistencyPolicy when pushes are applied: Asynchronous (TensorFlow's mode), Synchronous, or
/// BoundedStaleness<S>; in the synchronous modes every push and pull names its step
///
/// @par Example
/// @code
/// pss::ParameterServerStrategy<pss::InProcessTransport, pss::MinSizePartitioner> strategy(
///     pss::LocalClusterResolver<2, 2>{}, pss::MinSizePartitioner(256 << 10, 2));
/// auto scope = strategy.scope();
/// pss::Variable w(xt::xarray<float>(xt::zeros<float>({1024, 1024})), "w");  // 2 shards, on ps 0 and 1
/// @endcode
template <Transport TransportPolicy = InProcessTransport, Partitioner PartitionerPolicy = NoPartitioner,
          Optimizer OptimizerPolicy = SGD, ClusterResolver ClusterResolverPolicy = LocalClusterResolver<>,
          Consistency ConsistencyPolicy = Asynchronous>
class ParameterServerStrategy final : public Strategy {
public:
    using consistency_type = ConsistencyPolicy;
    /// @brief True when pushes are applied per step from every worker (Synchronous, BoundedStaleness).
    static constexpr bool synchronous = ConsistencyPolicy::synchronous;

    using transport_type = TransportPolicy;
    using partitioner_type = PartitionerPolicy;
    using optimizer_type = OptimizerPolicy;
    using cluster_resolver_type = ClusterResolverPolicy;

    /// @brief Resolves the cluster and takes this process's part in it.
    ///
    /// When the Transport crosses processes (TcpTransport, AutoTransport) and the resolver names this
    /// task with an rpc_layer other than "inproc", this process is that task alone: a ps task starts
    /// serving its shards, a worker starts serving calls, and the chief coordinates; ps and worker
    /// processes then call join(). Otherwise (rpc_layer "inproc", as LocalClusterResolver says, or no
    /// task named) the whole cluster runs in this process, through the Transport it was given.
    ///
    /// `timeouts` bound every wait for another process (Timeouts: start-up, heartbeats, request deadline,
    /// how long a ps or worker serves on without a chief); by default the environment's
    /// (`PSS_STARTUP_TIMEOUT`, `PSS_HEARTBEAT_INTERVAL`, `PSS_HEARTBEAT_TIMEOUT`, `PSS_REQUEST_TIMEOUT`,
    /// `PSS_CHIEF_TIMEOUT`), else TensorFlow's.
    /// @throws InvalidArgumentError when the cluster has no ps or no worker task, more than one chief, or a
    /// job other than chief, worker, ps and evaluator (TensorFlow's rules), or a PSS_*_TIMEOUT is not seconds,
    /// or PSS_COMPRESSION is not none, bfloat16 or float16.
    /// @throws UnavailableError naming the task when a ps task does not come up within the start-up timeout
    explicit ParameterServerStrategy(ClusterResolverPolicy cluster_resolver = {},
                                     PartitionerPolicy variable_partitioner = {}, OptimizerPolicy optimizer = {},
                                     Timeouts timeouts = Timeouts::from_environment());

    /// @brief A chief ends the cluster (as join() does); a ps or worker process stops serving at once.
    ~ParameterServerStrategy() override {
        (void)end_once(is_chief());  // a destructor does not throw; the tasks end when their connections close
    }

    /// @brief Where this process's part of the cluster ends.
    ///
    /// - ps or worker task of a multi-process cluster: serves until the chief ends the cluster, then
    ///   returns (TensorFlow's `server.join()`), or until no chief was heard from for the chief timeout
    ///   (Timeouts::chief, `PSS_CHIEF_TIMEOUT`, 600 s), then raises;
    /// - chief of a multi-process cluster: ends the cluster: every worker, then every ps, stops serving;
    /// - the whole cluster in this process: stops its tasks.
    ///
    /// Afterwards no variable operation reaches a task. Call it once the training is over; a chief's
    /// destructor ends the cluster when it was not called.
    /// @throws UnavailableError (a ps or worker task) `pss: /job:ps/replica:0/task:1: no chief was heard from for 600 s (PSS_CHIEF_TIMEOUT); ...`
    void join() {
        if (std::exception_ptr error = end_once(true)) std::rethrow_exception(error);
    }

    /// @brief This process's task: ("chief", 0) when the whole cluster runs here, else the resolver's.
    [[nodiscard]] const TaskId& task() const noexcept { return task_; }
    /// @brief True when this process runs the training program (creates variables, schedules steps):
    /// the chief, or the process that holds the whole cluster. A ps or worker process calls join().
    [[nodiscard]] bool is_chief() const noexcept { return task_.type == "chief"; }
    /// @brief True when the other tasks are other processes.
    [[nodiscard]] bool is_distributed() const noexcept { return distributed_; }

    [[nodiscard]] detail::RemoteWorkers* remote_workers() noexcept override { return channel_->remote_workers(); }

    [[nodiscard]] int num_replicas_in_sync() const override { return 1; }

    /// @brief Splits `initial_value` with the partitioner and places the shards round-robin. An answer above
    /// shape[0] is taken as shape[0] (a shard per row), as TensorFlow's `min(num_partitions, shape[0])`.
    /// @throws InvalidArgumentError when the partitioner answers 0 shards.
    Variable create_variable(Tensor initial_value, std::string name) override {
        if (!initial_value.has_value())
            throw InvalidArgumentError("pss: variable '" + name + "': the initial value is empty");
        const Placement placement = place(name, initial_value.shape(), initial_value.dtype());
        return created(detail::create_sharded(channel_, next_id_.fetch_add(1), std::move(name), std::move(initial_value),
                                              placement.rows, placement.tasks));
    }

    /// @brief As the other create_variable, each shard drawn from `initializer` by the ps task that owns
    /// it: this process sends a few words per shard and holds no value.
    using Strategy::create_variable;

    /// @brief TensorFlow's `strategy.extended.colocate_vars_with(v)`: the variables this thread creates
    /// while the returned guard lives go to `v`'s ps task (its first shard's), each whole: the
    /// partitioner is not asked and the round-robin placement does not advance, as in TensorFlow.
    /// @throws FailedPreconditionError for an empty handle
    /// @throws InvalidArgumentError when this strategy did not create `v`
    ///
    /// @par Example
    /// @code
    /// pss::Variable table(xt::xarray<float>(xt::zeros<float>({1000, 16})), "table");
    /// auto beside = strategy.colocate_vars_with(table);
    /// pss::Variable counts(xt::xarray<std::int64_t>(xt::zeros<std::int64_t>({1000})), "counts");  // table's ps
    /// @endcode
    [[nodiscard]] ColocationScope colocate_vars_with(const Variable& v) {
        const int task = v.shard_tasks().front();  // throws for an empty handle
        if (v.info_ptr()->channel.get() != static_cast<detail::Channel*>(channel_.get()))
            throw InvalidArgumentError("pss: colocate_vars_with: variable '" + v.name() + "' lives on " + v.device() +
                                       " and was not created by this strategy; colocate with one of its variables");
        return ColocationScope(this, task);
    }

    /// @brief Makes ps task `task`, lost and started again empty, hold its part of this run again: waits
    /// for it to answer (the start-up timeout), greets it as at start-up (its configuration must be this
    /// one), and creates on it, as zeros it draws itself (strings: sent empty), the shards of this
    /// strategy's variables it held. Returns how many
    /// it created: 0 when the task still held them (it was not restarted). Their values come from a
    /// checkpoint next: ClusterCoordinator::recover_ps_from does both.
    /// @throws UnavailableError naming the task when it does not come back in time; the errors of the
    /// handshake (FailedPreconditionError naming what differs) and of creating a variable
    std::size_t recreate_shards(int task) {
        if (task < 0 || task >= num_ps())
            throw InvalidArgumentError("pss: recreate_shards: ps task " + std::to_string(task) + " is not in [0, " +
                                       std::to_string(num_ps()) + ")");
        channel_->greet_again(task);
        std::vector<std::future<Reply>> replies;
        for (const Variable& v : variables()) {
            const detail::VariableInfo& info = *v.info_ptr();
            for (const auto& shard : info.shards) {
                if (shard.task != task) continue;
                Request request;
                request.op = Op::create;
                request.key = {shard.variable, shard.index};
                request.name = detail::shard_name(info, shard.index);
                // The task draws numbers' zeros itself: the chief holds no shard (of a table larger than it).
                if (info.dtype == DType::string)
                    request.payload = Tensor::zeros(info.dtype, shard.shape);
                else
                    request.initializer = ShardInitializer{InitializerSpec::zeros(), info.dtype, info.shape, shard.row_offset,
                                                           info.shape.empty() ? 0 : shard.shape[0]};
                replies.push_back(channel_->send(task, std::move(request)));
            }
        }
        std::optional<std::future<Reply>> rate_reply;  // the rate set for the run, which the restarted task lost
        if (const auto rate = learning_rate_set()) rate_reply = channel_->send(task, learning_rate_request(rate));
        std::size_t created = 0;
        std::optional<Reply> failed;
        for (auto& f : replies) {
            Reply r = f.get();
            if (r.ok()) ++created;
            else if (r.code != ErrorCode::already_exists && !failed) failed = std::move(r);
        }
        if (rate_reply)
            if (Reply r = rate_reply->get(); !r.ok() && !failed) failed = std::move(r);
        if (failed) throw_error(failed->code, failed->message);
        return created;
    }

    /// @brief Sets the learning rate every ps task applies from now on: Keras' `optimizer.learning_rate =
    /// rate`, what LearningRateScheduler does at each epoch's start. `std::nullopt` returns to the
    /// optimizer's own rate. Every ps task has it when this returns; pushes already applied keep theirs.
    /// A ps task started again (recreate_shards) is given it again.
    /// @throws FailedPreconditionError when the optimizer's rate is a schedule (it gives each step's rate;
    /// Keras refuses too), or this process is not the chief
    /// @throws InvalidArgumentError when `rate` is negative or not finite
    void set_learning_rate(std::optional<double> rate) {
        if (!is_chief())
            throw FailedPreconditionError("pss: set_learning_rate: this process is task " + task_.to_string() +
                                          "; the chief sets the learning rate");
        if (rate) detail::check_settable_learning_rate(optimizer_, *rate, "set_learning_rate");
        std::vector<std::future<Reply>> replies;
        for (int task = 0; task < num_ps(); ++task) replies.push_back(channel_->send(task, learning_rate_request(rate)));
        std::optional<Reply> failed;
        for (auto& f : replies)
            if (Reply r = f.get(); !r.ok() && !failed) failed = std::move(r);
        if (failed) throw_error(failed->code, failed->message);
        std::lock_guard lock(variables_mutex_);
        learning_rate_set_ = rate;
    }

    /// @brief The rate the ps tasks apply: the one set_learning_rate set, else the optimizer's (a constant
    /// or a schedule).
    [[nodiscard]] LearningRate learning_rate() const {
        if (const auto rate = learning_rate_set()) return *rate;
        return optimizer_.learning_rate();
    }

    /// @brief How the float32 variables this strategy creates from now on send their gradients and read
    /// their values: as bfloat16 or float16, half the bytes, with error feedback on pushes (Compression;
    /// the README's "Compression on the wire"). Variables created before keep theirs
    /// (Variable::set_compression changes one). Every float32 variable, Keras layers' included. A strategy
    /// starts with PSS_COMPRESSION's (none, bfloat16 or float16; `none` when unset).
    void set_compression(Compression c) noexcept { compression_.store(c, std::memory_order_relaxed); }
    /// @brief What set_compression set: `none` by default.
    [[nodiscard]] Compression compression() const noexcept { return compression_.load(std::memory_order_relaxed); }

    /// @brief The variables this strategy created that still have a handle, in creation order (what
    /// `Checkpoint(strategy)` saves).
    [[nodiscard]] std::vector<Variable> variables() const {
        std::lock_guard lock(variables_mutex_);
        std::vector<Variable> out;
        for (const auto& weak : variables_)
            if (auto info = weak.lock()) out.emplace_back(std::move(info));
        return out;
    }

    /// @brief Calls `hook` with each variable created from now on, once its shards hold their initial
    /// value and before create_variable returns; an exception from it fails the creation. An empty
    /// function removes the hook. Checkpoint::restore sets it for a deferred restoration (variables
    /// created after the restore take the checkpoint's values).
    void set_variable_created_hook(std::function<void(const Variable&)> hook) {
        std::lock_guard lock(variables_mutex_);
        created_hook_ = std::move(hook);
    }

    [[nodiscard]] const ClusterSpec& cluster_spec() const noexcept { return spec_; }
    /// @brief The timeouts this strategy was given (the embedded cluster uses the start-up timeout only:
    /// how long recreate_shards waits for a lost ps task to answer again).
    [[nodiscard]] const Timeouts& timeouts() const noexcept { return timeouts_; }
    [[nodiscard]] const ClusterResolverPolicy& cluster_resolver() const noexcept { return resolver_; }
    [[nodiscard]] const PartitionerPolicy& variable_partitioner() const noexcept { return partitioner_; }
    [[nodiscard]] const OptimizerPolicy& optimizer() const noexcept { return optimizer_; }
    [[nodiscard]] int num_ps() const { return spec_.num_tasks("ps"); }
    [[nodiscard]] int num_workers() const { return spec_.num_tasks("worker"); }

    /// @brief The ps tasks of the first K shards this strategy will place, known at compile time when
    /// the resolver's cluster shape is (LocalClusterResolver<NumPs, NumWorkers>).
    template <std::size_t K>
        requires requires { ClusterResolverPolicy::num_ps; }
    [[nodiscard]] static constexpr std::array<int, K> shard_placement() noexcept {
        return round_robin_placement<K, ClusterResolverPolicy::num_ps>();
    }

protected:
    Variable create_initialized_variable(const Shape& shape, DType dtype, const InitializerSpec& initializer,
                                         std::string name) override {
        detail::check_initializer(name, shape, dtype, initializer);
        const Placement placement = place(name, shape, dtype);
        return created(detail::create_sharded(channel_, next_id_.fetch_add(1), std::move(name), shape, dtype, initializer,
                                              placement.rows, placement.tasks));
    }

private:
    /// Each shard's rows and ps task.
    struct Placement {
        std::vector<std::size_t> rows;
        std::vector<int> tasks;
    };

    /// Where the shards of a new variable go: one shard beside the variable colocated with, else as the
    /// partitioner splits it, round-robin.
    Placement place(const std::string& name, const Shape& shape, DType dtype) {
        if (!is_chief())
            throw FailedPreconditionError("pss: variable '" + name + "': this process is task " + task_.to_string() +
                                          "; variables are created by the chief. A ps or worker process calls "
                                          "strategy.join() and serves until the chief ends the cluster");
        const detail::Colocation& colocation = detail::Colocation::current();
        if (colocation.strategy == this)  // one shard beside the variable colocated with, as TensorFlow's
            return {{shape.empty() ? 0 : shape[0]}, {colocation.task}};
        std::size_t k = 1;
        if (!shape.empty()) {
            k = static_cast<std::size_t>(partitioner_(std::span<const std::size_t>(shape), dtype));
            if (k == 0)
                throw InvalidArgumentError("pss: variable '" + name + "' of shape " + format_shape(shape) +
                                           ": the partitioner answered 0 shards; it must answer at least 1");
            k = std::min(k, std::max<std::size_t>(shape[0], 1));
        }
        Placement placement;
        for (std::size_t i = 0; i < k; ++i) {
            placement.rows.push_back(shape.empty() ? 0 : shard_rows(shape[0], k, i));
            placement.tasks.push_back(round_robin_task(next_shard_.fetch_add(1), num_ps()));
        }
        return placement;
    }

    static ClusterSpec validated(ClusterSpec spec) {
        detail::check_parameter_server_cluster(spec, "ParameterServerStrategy", "the cluster");
        return spec;
    }

    std::optional<double> learning_rate_set() const {
        std::lock_guard lock(variables_mutex_);
        return learning_rate_set_;
    }

    static Request learning_rate_request(std::optional<double> rate) {
        Request request;
        request.op = Op::set_learning_rate;
        if (rate) request.payload = xt::xarray<double>(*rate);
        return request;
    }

    /// Records a variable just created (what variables() lists) and runs the created hook on it.
    Variable created(Variable variable) {
        if (variable.dtype() == DType::float32) variable.set_compression(compression());
        std::function<void(const Variable&)> hook;
        {
            std::lock_guard lock(variables_mutex_);
            std::erase_if(variables_, [](const auto& weak) { return weak.expired(); });
            variables_.push_back(variable.info_ptr());
            hook = created_hook_;
        }
        if (hook) hook(variable);  // a deferred restore: if it throws, the new variable goes with `variable`
        return variable;
    }

    ClusterResolverPolicy resolver_;
    PartitionerPolicy partitioner_;
    OptimizerPolicy optimizer_;
    ClusterSpec spec_;
    TaskId task_;
    Timeouts timeouts_;
    bool distributed_ = false;
    std::shared_ptr<detail::StrategyChannel> channel_;
    std::once_flag joined_;

    /// Ends this process's part of the cluster, once (joining the channel first when `join`); returns
    /// what that threw. Nothing is thrown through std::call_once: after a call that threw, ThreadSanitizer's
    /// pthread_once (and libstdc++'s call_once on some targets, GCC PR 66146) hangs the next call.
    std::exception_ptr end_once(bool join) noexcept {
        std::exception_ptr error;
        std::call_once(joined_, [&] {
            try {
                if (join) channel_->join();
            } catch (...) {
                error = std::current_exception();
            }
            try {
                channel_->shutdown();
            } catch (...) {
                if (!error) error = std::current_exception();
            }
        });
        return error;
    }
    std::atomic<std::uint64_t> next_shard_{0};
    std::atomic<std::uint64_t> next_id_{1};
    mutable std::mutex variables_mutex_;
    std::vector<std::weak_ptr<const detail::VariableInfo>> variables_;
    std::function<void(const Variable&)> created_hook_;
    std::optional<double> learning_rate_set_;  // by set_learning_rate (under variables_mutex_)
    std::atomic<Compression> compression_{Compression::none};
};

// Defined outside the class: a member defined inside a class template is inline, and an extern template
// (PSS_SEPARATE_COMPILATION) does not keep a program from instantiating an inline member.
template <Transport TransportPolicy, Partitioner PartitionerPolicy, Optimizer OptimizerPolicy,
          ClusterResolver ClusterResolverPolicy, Consistency ConsistencyPolicy>
ParameterServerStrategy<TransportPolicy, PartitionerPolicy, OptimizerPolicy, ClusterResolverPolicy,
                        ConsistencyPolicy>::ParameterServerStrategy(ClusterResolverPolicy cluster_resolver,
                                                                    PartitionerPolicy variable_partitioner,
                                                                    OptimizerPolicy optimizer,
                                                                    Timeouts timeouts)
    : resolver_(std::move(cluster_resolver)),
      partitioner_(std::move(variable_partitioner)),
      optimizer_(std::move(optimizer)),
      spec_(validated(resolver_.cluster_spec())),
      task_{std::string(resolver_.task_type()), static_cast<int>(resolver_.task_id())},
      timeouts_(timeouts),
      compression_(compression_from_environment()) {
    const SyncOptions sync{ConsistencyPolicy::synchronous, static_cast<std::uint64_t>(spec_.num_tasks("worker")),
                           ConsistencyPolicy::staleness};
    // The resolver says whether the cluster is this process: rpc_layer "inproc" (the embedded
    // cluster), or no task named. Otherwise a Transport that crosses processes makes this process
    // the one task the resolver names.
    const bool whole_cluster_here = std::string(resolver_.rpc_layer()) == "inproc" || task_.type.empty();
    if constexpr (detail::transport_crosses_processes<TransportPolicy>) {
        if (!whole_cluster_here) {
            timeouts.validate();
            auto channel = std::make_shared<detail::ClusterTaskChannel<TransportPolicy, OptimizerPolicy>>(
                spec_, task_, optimizer_, sync, timeouts);
            channel->start();
            channel->handshake();
            channel_ = std::move(channel);
            distributed_ = true;
            detail::LocalDevice::set(task_.to_string() + "/device:CPU:0");  // variables outside any scope
            return;
        }
    }
    task_ = TaskId{"chief", 0};
    channel_ = std::make_shared<detail::TransportChannel<TransportPolicy, OptimizerPolicy>>(spec_, optimizer_, sync, timeouts_);
}


PSS_NAMESPACE_END
