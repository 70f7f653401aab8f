// pss/transport/simulated.hpp: SimulatedTransport, the embedded cluster on a seeded network that loses,
// repeats and delays messages and crashes tasks.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <stdexcept>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>
#include <pss/detail/closure_context.hpp>
#include <pss/errors.hpp>
#include <pss/message.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The faults a SimulatedNetwork injects. Each is drawn per message from the seed, the task the
/// message goes to and its number among that task's messages, so a seed gives each task's n-th message
/// the same fate in every run.
struct SimulatedFaults {
    std::uint64_t seed = 0;
    double drop_request = 0;  ///< a request lost before its task saw it: nothing ran, the reply is unavailable
    double drop_reply = 0;    ///< a reply lost after its task ran the request: its effect stands, the reply is unavailable
    double duplicate = 0;     ///< a request its task runs twice in a row (a duplicated message): the first reply comes back
    double delay = 0;         ///< a request held back before its task runs it: the other tasks' messages overtake it
    std::chrono::microseconds max_delay{200};  ///< a delayed request waits a drawn time up to this
    double crash = 0;         ///< the task crashes as the request reaches it: its state is lost, what it queued fails
    /// A crashed task starts again, empty, once this many requests found it down (0: it never does).
    int restart_after = 3;
    /// A worker lost as its closure sends a variable operation (drawn per worker and per message of its
    /// closures): the closure raises WorkerLostError and runs again on another worker, and the lost one
    /// takes no more closures (a worker thread of the embedded cluster does not come back; once every
    /// worker is lost, join raises), unless worker_back_after says when it starts again.
    double lose_worker = 0;
    /// A lost worker starts again after this, and takes closures again (as a worker process started
    /// again rejoins); none: it does not.
    std::optional<std::chrono::microseconds> worker_back_after = std::nullopt;
    /// The chief lost as it sends a variable operation of its own (not a closure's: creating, reading,
    /// saving or restoring; drawn per chief message): `send` throws SimulatedChiefCrash, which no pss
    /// code catches, so the program ends there as a killed chief would; a test then starts a chief again
    /// (a new strategy) that restores the latest checkpoint.
    double lose_chief = 0;
};

/// @brief What SimulatedTransport throws on the chief's thread when the network loses the chief
/// (SimulatedFaults::lose_chief). Not a pss::Error: nothing in pss takes it for a failure to recover from.
class SimulatedChiefCrash : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// @brief One fault a SimulatedNetwork injected: task `task`'s `message`-th message (from 0), what
/// happened to it, and the request's kind or operation.
struct SimulatedEvent {
    TaskId task;
    std::uint64_t message = 0;
    std::string what;  ///< "request lost", "reply lost", "run twice", "delayed 37 us", "crashed", "started again"
    std::string request;

    friend bool operator==(const SimulatedEvent&, const SimulatedEvent&) = default;
    [[nodiscard]] std::string to_string() const {
        return task.to_string() + " #" + std::to_string(message) + " " + what + " (" + request + ")";
    }
};

class SimulatedTransport;

/// @brief The network every SimulatedTransport constructed while it lives runs on: its faults, its
/// seed and the log of what it injected. One is installed per process at a time (the Transport concept
/// constructs a transport from the cluster spec alone, so the strategy's transport finds it here). It
/// must outlive the transports (and so the strategies) made while it was installed: they keep a
/// pointer to it. Declare it before the strategy.
///
/// @par Example
/// @code
/// pss::SimulatedNetwork network({.seed = 7, .drop_reply = 0.02, .crash = 0.005, .restart_after = 2});
/// pss::ParameterServerStrategy<pss::SimulatedTransport> strategy;  // its ps tasks on `network`
/// // ... train; network.events() lists each fault, the same for seed 7 in every run of one worker
/// @endcode
class SimulatedNetwork {
public:
    /// @throws FailedPreconditionError when another SimulatedNetwork is installed
    /// @throws InvalidArgumentError when a probability is not in [0, 1], or max_delay or restart_after is negative
    explicit SimulatedNetwork(SimulatedFaults faults = {}) : faults_(checked(faults)) {
        std::lock_guard lock(installed_mutex());
        if (installed() != nullptr)
            throw FailedPreconditionError("pss: SimulatedNetwork: another one is installed; one network at a time");
        installed() = this;
    }
    SimulatedNetwork(const SimulatedNetwork&) = delete;
    SimulatedNetwork& operator=(const SimulatedNetwork&) = delete;
    ~SimulatedNetwork() {
        std::lock_guard lock(installed_mutex());
        installed() = nullptr;
    }

    /// @brief Turns fault injection on or off (on at construction); messages are numbered either way.
    void inject(bool on) {
        std::lock_guard lock(mutex_);
        inject_ = on;
    }

    /// @brief Crashes `task` now, at a chosen point, as a drawn crash would (restart_after as configured).
    /// @throws InvalidArgumentError when no SimulatedTransport serves `task` on this network
    void crash(const TaskId& task);

    /// @brief What was injected so far, ordered by task and message number: with one sender at a time
    /// (a coordinator of one worker), the same seed gives the same list in every run.
    [[nodiscard]] std::vector<SimulatedEvent> events() const {
        std::lock_guard lock(mutex_);
        auto out = events_;
        std::sort(out.begin(), out.end(), [](const SimulatedEvent& a, const SimulatedEvent& b) {
            return std::tie(a.task, a.message) < std::tie(b.task, b.message);
        });
        return out;
    }

    [[nodiscard]] const SimulatedFaults& faults() const noexcept { return faults_; }

    /// @brief The network transports constructed now run on, or null.
    static SimulatedNetwork* current() {
        std::lock_guard lock(installed_mutex());
        return installed();
    }

private:
    friend class SimulatedTransport;

    /// A message's fate, drawn from (seed, task, number).
    struct Fate {
        bool crash = false, drop_request = false, duplicate = false, drop_reply = false;
        std::chrono::microseconds delay{0};
    };

    /// Numbers in [0, 1) drawn from (seed, task, message): splitmix64, a fixed sequence for each.
    struct Uniforms {
        std::uint64_t state;
        double operator()() {
            std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
        }
    };
    Uniforms uniforms(const TaskId& task, std::uint64_t message) const {
        return {faults_.seed ^ (std::hash<std::string>{}(task.type) * 0x9e3779b97f4a7c15ull) ^
                (static_cast<std::uint64_t>(task.index) << 48) ^ (message * 0xbf58476d1ce4e5b9ull)};
    }

    Fate draw(const TaskId& task, std::uint64_t message) const {
        Fate fate;
        std::lock_guard lock(mutex_);
        if (!inject_) return fate;
        auto uniform = uniforms(task, message);
        fate.crash = uniform() < faults_.crash;
        fate.drop_request = uniform() < faults_.drop_request;
        fate.duplicate = uniform() < faults_.duplicate;
        fate.drop_reply = uniform() < faults_.drop_reply;
        const double delayed = uniform(), how_long = uniform();
        if (delayed < faults_.delay)
            fate.delay = std::chrono::microseconds(static_cast<std::int64_t>(how_long * static_cast<double>(faults_.max_delay.count())));
        return fate;
    }

    /// Whether `task` (a worker whose closure sends, or the chief) is lost as it sends `request`, its next
    /// message (numbered per task, injecting or not); a loss is logged as the task's event "lost".
    bool lose_sender(const TaskId& task, double probability, const std::string& request) {
        std::lock_guard lock(mutex_);
        const std::uint64_t message = sender_messages_[task]++;
        if (!inject_ || !(uniforms(task, message)() < probability)) return false;
        events_.push_back({task, message, "lost", request});
        return true;
    }

    void record(const TaskId& task, std::uint64_t message, std::string what, std::string request) {
        std::lock_guard lock(mutex_);
        events_.push_back({task, message, std::move(what), std::move(request)});
    }

    void attach(SimulatedTransport* transport) {
        std::lock_guard lock(mutex_);
        transports_.push_back(transport);
    }
    void detach(SimulatedTransport* transport) {
        std::lock_guard lock(mutex_);
        std::erase(transports_, transport);
    }

    static SimulatedFaults checked(SimulatedFaults faults) {
        for (const auto& [name, p] : {std::pair{"drop_request", faults.drop_request}, std::pair{"drop_reply", faults.drop_reply},
                                      std::pair{"duplicate", faults.duplicate}, std::pair{"delay", faults.delay},
                                      std::pair{"crash", faults.crash}, std::pair{"lose_worker", faults.lose_worker},
                                      std::pair{"lose_chief", faults.lose_chief}})
            if (!(p >= 0 && p <= 1))
                throw InvalidArgumentError("pss: SimulatedFaults::" + std::string(name) + " is " + std::to_string(p) +
                                           "; a probability is in [0, 1]");
        if (faults.max_delay.count() < 0 || faults.restart_after < 0 ||
            (faults.worker_back_after && faults.worker_back_after->count() < 0))
            throw InvalidArgumentError(
                "pss: SimulatedFaults: max_delay, restart_after and worker_back_after must not be negative");
        return faults;
    }

    static std::mutex& installed_mutex() {
        static std::mutex m;
        return m;
    }
    static SimulatedNetwork*& installed() {
        static SimulatedNetwork* network = nullptr;
        return network;
    }

    SimulatedFaults faults_;
    mutable std::mutex mutex_;
    bool inject_ = true;
    std::vector<SimulatedEvent> events_;
    std::map<TaskId, std::uint64_t> sender_messages_;  // per worker or chief: the messages it sent
    std::vector<SimulatedTransport*> transports_;
};

/// @brief The embedded cluster (every task a thread of this process, as InProcessTransport) on the
/// installed SimulatedNetwork, which loses, repeats and delays requests and replies and crashes tasks,
/// each message's fate drawn from the network's seed. Without an installed network nothing is injected.
///
/// Each served task runs its requests one at a time, in the order they reached it, on its own thread;
/// the faults keep to what a real network and real processes do to pss: a lost message is an
/// `ErrorCode::unavailable` reply naming the task (a broken connection), a request run twice is a
/// duplicated message whose first reply counts, a delayed request lets the other tasks' messages overtake it. A crashed task
/// loses its state (the handler's owner is told, see on_crash), answers `unavailable` while down, and
/// starts again empty after `SimulatedFaults::restart_after` requests found it down. Models the
/// Transport concept; a ParameterServerStrategy over it is the whole cluster in one process.
class SimulatedTransport {
public:
    static constexpr bool shares_memory = true;

    explicit SimulatedTransport(const ClusterSpec& spec) : spec_(spec), network_(SimulatedNetwork::current()) {
        if (network_ != nullptr) network_->attach(this);
    }
    SimulatedTransport(const SimulatedTransport&) = delete;
    SimulatedTransport& operator=(const SimulatedTransport&) = delete;
    ~SimulatedTransport() {
        shutdown();
        if (network_ != nullptr) network_->detach(this);
    }

    /// @throws InvalidArgumentError when `task` is not in the cluster spec or is served already
    void serve(const TaskId& task, RequestHandler handler) {
        if (task.index < 0 || task.index >= spec_.num_tasks(task.type))
            throw InvalidArgumentError("pss: SimulatedTransport: task " + task.to_string() + " is not in the cluster spec");
        std::lock_guard lock(mutex_);
        auto& slot = tasks_[task];
        if (slot) throw InvalidArgumentError("pss: SimulatedTransport: task " + task.to_string() + " is served twice");
        slot = std::make_shared<Node>(task, std::move(handler), network_);
    }

    /// @brief `on_crash` runs on `task`'s thread each time it crashes: the state it serves is lost
    /// (a ParameterServer clears its shards and answers its held pulls).
    void on_crash(const TaskId& task, std::function<void()> on_crash) {
        if (auto node = find(task)) node->set_on_crash(std::move(on_crash));
    }

    /// @throws WorkerLostError when the network loses the worker whose closure sends `request` (a
    /// pull or a push; SimulatedFaults::lose_worker): the closure ends there, as on a worker process that
    /// died. SimulatedChiefCrash when it loses the chief as it sends an operation of its own.
    std::future<Reply> send(const TaskId& task, Request request) {
        if (network_ != nullptr && request.kind == RequestKind::operation) {
            const auto* closure = detail::ClosureContext::current();
            const auto& faults = network_->faults();
            if (closure != nullptr && closure->worker >= 0) {
                if (faults.lose_worker > 0 && (is_pull(request.op) || is_push(request.op)) &&
                    network_->lose_sender({"worker", closure->worker}, faults.lose_worker, describe(request)))
                {
                    const std::string what = "pss: worker " + std::to_string(closure->worker) +
                                             " was lost (simulated) as its closure sent " + describe(request) + " to " +
                                             task.to_string();
                    if (faults.worker_back_after) throw WorkerLostError(what, *faults.worker_back_after);
                    throw WorkerLostError(what);
                }
            } else if (faults.lose_chief > 0 && request.op != Op::destroy &&  // a destroy comes from a destructor
                       network_->lose_sender({"chief", 0}, faults.lose_chief, describe(request))) {
                throw SimulatedChiefCrash("pss: the chief was lost (simulated) as it sent " + describe(request) + " to " +
                                          task.to_string());
            }
        }
        auto node = find(task);
        if (node == nullptr) return ready(unavailable(task, "is not serving (never started, or shut down)"));
        return node->post(std::move(request));
    }

    void shutdown() {
        std::map<TaskId, std::shared_ptr<Node>> tasks;
        {
            std::lock_guard lock(mutex_);
            tasks.swap(tasks_);
        }
        for (auto& [task, node] : tasks) node->close();
    }

private:
    friend class SimulatedNetwork;

    static Reply unavailable(const TaskId& task, const std::string& why) {
        return Reply::error(ErrorCode::unavailable, "pss: task " + task.to_string() + " " + why);
    }
    static std::future<Reply> ready(Reply reply) {
        std::promise<Reply> p;
        p.set_value(std::move(reply));
        return p.get_future();
    }
    static std::string describe(const Request& r) {
        switch (r.kind) {
            case RequestKind::operation: return std::string(op_name(r.op));
            case RequestKind::call: return "call " + r.name;
            case RequestKind::heartbeat: return "heartbeat";
            default: return "shutdown";
        }
    }

    /// A task: its queue, its thread, whether it is down.
    class Node {
    public:
        Node(TaskId task, RequestHandler handler, SimulatedNetwork* network)
            : task_(std::move(task)), handler_(std::move(handler)), network_(network), thread_([this] { run(); }) {}
        ~Node() { close(); }

        void set_on_crash(std::function<void()> f) {
            std::lock_guard lock(mutex_);
            on_crash_ = std::move(f);
        }

        std::future<Reply> post(Request request) {
            std::promise<Reply> promise;
            auto future = promise.get_future();
            std::unique_lock lock(mutex_);
            if (closed_) {
                promise.set_value(unavailable(task_, "is not serving (shut down)"));
                return future;
            }
            const std::uint64_t number = next_message_++;
            if (down_) {
                promise.set_value(unavailable(
                    task_, "is down (a simulated crash; " +
                               (attempts_left_ == 0 ? std::string("it never starts again: SimulatedFaults::restart_after is 0")
                                                    : "it starts again after " + std::to_string(attempts_left_) +
                                                          (attempts_left_ == 1 ? " more request" : " more requests")) +
                               ")"));
                if (attempts_left_ > 0 && --attempts_left_ == 0) {
                    down_ = false;
                    lock.unlock();
                    if (network_) network_->record(task_, number, "started again", describe(request));
                }
                return future;
            }
            queue_.push_back({number, std::move(request), std::move(promise)});
            lock.unlock();
            ready_.notify_one();
            return future;
        }

        /// Crashes the task as its request `number` reaches it (its thread), or now (the network's crash()).
        void crash(std::optional<std::uint64_t> number, const std::string& request) {
            std::deque<Queued> lost;
            {
                std::lock_guard lock(mutex_);
                if (down_ || closed_) return;
                if (!number) number = next_message_;
                down_ = true;
                attempts_left_ = network_ ? network_->faults().restart_after : 0;
                lost.swap(queue_);
                crashed_ = true;  // its thread runs on_crash before its next request
            }
            if (network_) network_->record(task_, *number, "crashed", request);
            for (auto& q : lost) q.promise.set_value(unavailable(task_, "crashed before it ran this request (simulated)"));
            ready_.notify_all();
        }

        void close() {
            {
                std::lock_guard lock(mutex_);
                closed_ = true;
            }
            ready_.notify_all();
            std::lock_guard join_lock(join_mutex_);
            if (thread_.joinable()) thread_.join();
        }

    private:
        struct Queued {
            std::uint64_t number;
            Request request;
            std::promise<Reply> promise;
        };

        void run() {
            for (;;) {
                std::unique_lock lock(mutex_);
                ready_.wait(lock, [&] { return !queue_.empty() || closed_ || crashed_; });
                if (crashed_) {  // the state goes with the crash, on the thread that owns it
                    crashed_ = false;
                    auto on_crash = on_crash_;
                    lock.unlock();
                    if (on_crash) on_crash();
                    continue;
                }
                if (queue_.empty()) return;  // closed, and everything queued has been handled
                Queued q = std::move(queue_.front());
                queue_.pop_front();
                lock.unlock();
                handle(std::move(q));
            }
        }

        void handle(Queued&& q) {
            const SimulatedNetwork::Fate fate =
                network_ ? network_->draw(task_, q.number) : SimulatedNetwork::Fate{};
            const std::string what = describe(q.request);
            if (fate.crash) {
                q.promise.set_value(unavailable(task_, "crashed as this request reached it (simulated)"));
                return crash(q.number, what);
            }
            if (fate.drop_request) {
                network_->record(task_, q.number, "request lost", what);
                return q.promise.set_value(unavailable(task_, "did not get this request: it was lost (simulated)"));
            }
            if (fate.delay.count() > 0) {
                network_->record(task_, q.number, "delayed " + std::to_string(fate.delay.count()) + " us", what);
                std::this_thread::sleep_for(fate.delay);
            }
            std::optional<Request> copy;
            if (fate.duplicate) {
                network_->record(task_, q.number, "run twice", what);
                copy.emplace(q.request);
                keep_to_itself(*copy);
            }
            if (fate.drop_reply) network_->record(task_, q.number, "reply lost", what);
            handler_(std::move(q.request),
                     Responder([promise = std::move(q.promise), task = task_, lost = fate.drop_reply](Reply&& reply) mutable {
                         if (lost)
                             reply = unavailable(task, "ran this request, but its reply was lost (simulated)");
                         promise.set_value(std::move(reply));
                     }));
            if (copy) handler_(std::move(*copy), Responder([](Reply&&) {}));  // the first reply is the one taken
        }

        /// A duplicate runs after its sender may have had the first reply and gone on with its memory, as
        /// a duplicated frame reaches a ps in another process: it carries its own copy of the gradient rows
        /// its request points at in the sender's tensor, and a gather of it writes to a buffer of its own.
        static void keep_to_itself(Request& r) {
            auto& in = r.in_process;
            if (in.from) {
                r.payload = detail::take_rows(*in.from, in.from_rows);
                in.from.reset();
                in.from_rows.clear();
            }
            if (in.into && in.into->has_value())
                in.into = std::make_shared<Tensor>(Tensor::uninitialized(in.into->dtype(), in.into->shape()));
        }

        TaskId task_;
        RequestHandler handler_;
        SimulatedNetwork* network_;
        std::function<void()> on_crash_;
        std::mutex mutex_;
        std::condition_variable ready_;
        std::deque<Queued> queue_;
        std::uint64_t next_message_ = 0;
        bool down_ = false, crashed_ = false, closed_ = false;
        int attempts_left_ = 0;
        std::mutex join_mutex_;
        std::thread thread_;  // last: it starts after everything it uses exists
    };

    std::shared_ptr<Node> find(const TaskId& task) {
        std::lock_guard lock(mutex_);
        auto it = tasks_.find(task);
        return it == tasks_.end() ? nullptr : it->second;
    }

    ClusterSpec spec_;
    SimulatedNetwork* network_;
    std::mutex mutex_;
    std::map<TaskId, std::shared_ptr<Node>> tasks_;
};

inline void SimulatedNetwork::crash(const TaskId& task) {
    std::shared_ptr<SimulatedTransport::Node> node;
    {
        std::lock_guard lock(mutex_);  // a transport detaches under it before it goes
        for (auto* transport : transports_)
            if ((node = transport->find(task))) break;
    }
    if (node == nullptr)
        throw InvalidArgumentError("pss: SimulatedNetwork::crash: no SimulatedTransport serves task " + task.to_string() +
                                   " on this network");
    node->crash(std::nullopt, "crash()");
}

PSS_NAMESPACE_END
