// pss/coordinator.hpp: ClusterCoordinator, RemoteValue and per-worker values: scheduling steps on workers.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <pss/config.hpp>
#include <pss/detail/closure_context.hpp>
#include <pss/detail/environment.hpp>
#include <pss/distribute.hpp>
#include <pss/errors.hpp>
#include <pss/function.hpp>
#include <pss/variable.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// The shared state of one RemoteValue: set once by the worker that ran the closure.
template <class R>
struct RemoteState {
    std::mutex mutex;
    std::condition_variable ready;
    bool done = false;
    std::conditional_t<std::is_void_v<R>, bool, std::optional<R>> value{};
    std::exception_ptr error;

    void set_error(std::exception_ptr e) {
        {
            std::lock_guard lock(mutex);
            error = std::move(e);
            done = true;
        }
        ready.notify_all();
    }
};

}  // namespace detail

/// @brief The result of a scheduled closure, kept on the coordinator once computed (tf RemoteValue).
template <class R>
class RemoteValue {
public:
    RemoteValue() = default;
    explicit RemoteValue(std::shared_ptr<detail::RemoteState<R>> state) : state_(std::move(state)) {}

    /// @brief Waits for the closure and returns its result.
    /// @throws the closure's exception; CancelledError when it was cancelled because an earlier closure
    /// failed ("reschedule it").
    decltype(auto) fetch() const {
        std::unique_lock lock(state().mutex);
        state().ready.wait(lock, [&] { return state().done; });
        if (state().error) std::rethrow_exception(state().error);
        if constexpr (!std::is_void_v<R>) return static_cast<const R&>(*state().value);
    }
    /// @brief Same as fetch() (tf RemoteValue.get()).
    decltype(auto) get() const { return fetch(); }

    /// @brief True once the closure has run (or failed, or was cancelled).
    [[nodiscard]] bool ready() const {
        std::lock_guard lock(state().mutex);
        return state().done;
    }

private:
    detail::RemoteState<R>& state() const {
        if (!state_) throw FailedPreconditionError("pss: this RemoteValue is empty: it was not returned by schedule()");
        return *state_;
    }
    std::shared_ptr<detail::RemoteState<R>> state_;
};

/// @brief Fetches every RemoteValue of a structure, as tf coordinator.fetch(): a RemoteValue, or a
/// std::vector, std::tuple or std::map of structures, nested as deep as wanted. The result has the
/// structure's shape, each RemoteValue replaced by its value.
template <class R>
[[nodiscard]] decltype(auto) fetch(const RemoteValue<R>& value) {
    return value.fetch();
}
template <class T>
[[nodiscard]] auto fetch(const std::vector<T>& values) {
    std::vector<std::decay_t<decltype(fetch(values.front()))>> out;
    out.reserve(values.size());
    for (const auto& v : values) out.push_back(fetch(v));
    return out;
}
template <class... T>
[[nodiscard]] auto fetch(const std::tuple<T...>& values) {
    return std::apply([](const auto&... v) { return std::tuple<std::decay_t<decltype(fetch(v))>...>(fetch(v)...); },
                      values);
}
template <class K, class T>
[[nodiscard]] auto fetch(const std::map<K, T>& values) {
    std::map<K, std::decay_t<decltype(fetch(values.begin()->second))>> out;
    for (const auto& [key, v] : values) out.emplace(key, fetch(v));
    return out;
}

namespace detail {
template <class T>
inline constexpr bool is_remote_value_v = false;
template <class R>
inline constexpr bool is_remote_value_v<RemoteValue<R>> = true;

inline constexpr std::string_view lambda_to_process =
    "pss: ClusterCoordinator::schedule: the workers of this cluster are other processes, and a lambda or "
    "function object cannot be sent to them; register the function with pss::register_function(name, "
    "&function) in every process and schedule what it returns";
}  // namespace detail

/// @brief A closure's input could not be made (TensorFlow's ClosureInputError): the per-worker value
/// of the worker that ran the closure failed when create_per_worker_dataset made it. The message
/// names the worker and gives the original error's. Raised by the closure, so by `join`, `done` and
/// the closure's RemoteValue; a per-worker value no closure uses raises nothing.
class ClosureInputError : public Error {
public:
    explicit ClosureInputError(const std::string& message) : Error(ErrorCode::invalid_argument, message) {}
};

/// @brief One value per worker (tf PerWorkerValues): a closure given one as an argument receives the
/// value of the worker that runs it.
template <class T>
class PerWorkerValues {
public:
    explicit PerWorkerValues(std::vector<std::shared_ptr<T>> values) : values_(std::move(values)) {}
    /// @brief Values some of which failed to be made: `errors[i]`, when set, is worker i's failure,
    /// raised as ClosureInputError by at(i) (so by a closure that uses it).
    PerWorkerValues(std::vector<std::shared_ptr<T>> values, std::vector<std::exception_ptr> errors)
        : values_(std::move(values)), errors_(std::move(errors)) {}
    [[nodiscard]] std::size_t size() const noexcept { return values_.size(); }
    /// @brief The value of worker `index`.
    /// @throws ClosureInputError when that value failed to be made
    [[nodiscard]] T& at(std::size_t index) const {
        if (index < errors_.size() && errors_[index]) {
            std::string why;
            try {
                std::rethrow_exception(errors_[index]);
            } catch (const std::exception& e) {
                why = e.what();
            } catch (...) {
                why = "an exception that is not a std::exception";
            }
            throw ClosureInputError("pss: ClosureInputError: the per-worker value of worker " + std::to_string(index) +
                                    " failed when it was made: " + why);
        }
        return *values_.at(index);
    }
    /// @brief Per-worker variables: every worker's value, in worker order (TensorFlow's `read_all()`).
    [[nodiscard]] std::vector<Tensor> read_all() const
        requires std::same_as<T, Variable>
    {
        std::vector<Tensor> out;
        for (const auto& v : values_) out.push_back(v->read_value());
        return out;
    }

private:
    std::vector<std::shared_ptr<T>> values_;
    std::vector<std::exception_ptr> errors_;  // empty, or one per worker: null where its value was made
};

namespace detail {

/// The ps tasks an UnavailableError names (TensorFlow tells a ps failure so, by its message); none for
/// any other error.
inline std::set<int> unavailable_ps_tasks(const std::exception_ptr& error) {
    std::string message;
    try {
        std::rethrow_exception(error);
    } catch (const UnavailableError& e) {
        message = e.what();
    } catch (...) {
        return {};
    }
    constexpr std::string_view prefix = "/job:ps/replica:0/task:";
    std::set<int> tasks;
    for (auto at = message.find(prefix); at != std::string::npos; at = message.find(prefix, at + 1)) {
        std::size_t end = at + prefix.size();
        while (end < message.size() && message[end] >= '0' && message[end] <= '9') ++end;
        if (const auto task = detail::parse_int(std::string_view(message).substr(at + prefix.size(), end - at - prefix.size())))
            tasks.insert(*task);
    }
    return tasks;
}

/// The workers' threads, queues and error state of a ClusterCoordinator: shared by every
/// ClusterCoordinator of one strategy.
class CoordinatorPool {
public:
    /// Starts one thread per worker of `strategy`.
    template <class StrategyType>
        requires requires(const StrategyType& s) {
            { s.num_workers() } -> std::convertible_to<int>;
        }
    CoordinatorPool(StrategyType& strategy, std::size_t max_queue)
        : max_queue_(max_queue),
          alive_(static_cast<std::size_t>(strategy.num_workers())),
          pinned_(static_cast<std::size_t>(strategy.num_workers())) {
        if constexpr (std::derived_from<StrategyType, Strategy>) {
            remote_ = strategy.remote_workers();
            strategy_ = &strategy;
        }
        if constexpr (requires { StrategyType::synchronous; })
            keep_pins_ = StrategyType::synchronous && remote_ != nullptr;
        if (max_queue_ == 0) throw InvalidArgumentError("pss: ClusterCoordinator: max_queue must be at least 1");
        if (const auto text = detail::process_environment(transient_ps_failures_variable)) {
            const auto n = detail::parse_int(*text);
            if (!n || *n < 0)
                throw InvalidArgumentError("pss: " + std::string(transient_ps_failures_variable) + " is \"" + *text +
                                           "\"; give a whole number from 0 (every ps failure is raised at once) up");
            transient_ps_failures_ = *n;
        }
        for (int i = 0; i < strategy.num_workers(); ++i) workers_.emplace_back([this, i] { run_worker(i); });
    }
    CoordinatorPool(const CoordinatorPool&) = delete;
    CoordinatorPool& operator=(const CoordinatorPool&) = delete;

    /// Finishes the queued closures, then stops the workers.
    ~CoordinatorPool() {
        std::deque<Closure> cancelled;
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
            if (error_) cancelled = take_queued();  // an error nobody raised: what is queued never runs
        }
        work_.notify_all();
        for (auto& w : workers_) w.join();
        for (auto& c : cancelled) c->fail(cancellation());
        for (auto& c : take_queued())  // left when every worker was lost
            c->fail(std::make_exception_ptr(
                UnavailableError("pss: this closure never ran: every worker was lost before the coordinator ended")));
    }

    [[nodiscard]] int num_workers() const noexcept { return static_cast<int>(workers_.size()); }
    [[nodiscard]] Strategy* strategy() const noexcept { return strategy_; }

    /// Set by ClusterCoordinator::recover_ps_from: makes lost ps task `task` serve this run again (or
    /// throws); an empty function raises ps failures again.
    void set_ps_recovery(std::function<void(int)> recover) {
        std::lock_guard lock(mutex_);
        ps_recovery_ = std::move(recover);
    }

    // The operations of ClusterCoordinator, which documents them.
    template <class F, class... Args>
    auto schedule(F&& fn, Args&&... args) {
        return enqueue(any_worker, std::forward<F>(fn), std::forward<Args>(args)...);
    }

    template <class F, class... Args>
    auto schedule_on(int worker, F&& fn, Args&&... args) {
        if (worker < 0 || worker >= num_workers())
            throw InvalidArgumentError("pss: ClusterCoordinator::schedule_on: worker " + std::to_string(worker) +
                                       " is not in [0, " + std::to_string(num_workers()) + ")");
        return enqueue(worker, std::forward<F>(fn), std::forward<Args>(args)...);
    }

private:
    struct TaskBase;
    using Closure = std::shared_ptr<TaskBase>;

    static constexpr int any_worker = -1;

    /// Queues a closure for `worker`, or for any worker (the shared queue).
    template <class F, class... Args>
    auto enqueue(int worker, F&& fn, Args&&... args) {
        using R = std::invoke_result_t<std::decay_t<F>&, decltype(resolve(std::declval<std::decay_t<Args>&>(), 0))...>;
        if constexpr (detail::is_registered_function_v<std::decay_t<F>>)
            static_assert((Transferable<std::decay_t<Args>> && ...),
                          "pss: schedule: every argument of a registered function must be Transferable (a number, "
                          "string, Tensor, xt::xarray, PerWorkerValues, or a std::vector of these)");
        if constexpr ((detail::is_remote_value_v<std::decay_t<Args>> || ...))
            throw InvalidArgumentError("pss: ClusterCoordinator::schedule: an argument is a RemoteValue; a closure "
                                       "takes values, not the results of other closures: fetch() it first");
        if constexpr (!detail::is_registered_function_v<std::decay_t<F>>)
            if (remote_ != nullptr) throw InvalidArgumentError(std::string(detail::lambda_to_process));
        // One allocation per closure: its function, its arguments and its result's state together.
        auto task = std::make_shared<Task<R, std::decay_t<F>, std::tuple<std::decay_t<Args>...>>>(
            std::forward<F>(fn), std::make_tuple(std::forward<Args>(args)...));
        std::unique_lock lock(mutex_);
        raise_pending_error(lock);
        for (;;) {
            space_.wait(lock, [&] { return queued_ < max_queue_ || error_ || alive_ == 0; });
            raise_pending_error(lock);
            if (queued_ < max_queue_) break;
            await_a_worker(lock);  // the queue is full and every worker is lost
        }
        // A lost worker's closures go to the others (at least once), but a synchronous step's wait for it.
        const bool pinned = worker != any_worker && (keep_pins_ || !pinned_[static_cast<std::size_t>(worker)].lost);
        (pinned ? pinned_[static_cast<std::size_t>(worker)].queue : queue_).push_back(task);
        ++queued_;
        ++unfinished_;
        lock.unlock();
        // One waiting worker would do for the shared queue, but only the pinned worker can take its own.
        if (pinned) work_.notify_all();
        else work_.notify_one();
        return RemoteValue<R>(std::shared_ptr<detail::RemoteState<R>>(std::move(task)));
    }

public:
    void join() {
        std::unique_lock lock(mutex_);
        for (;;) {
            finished_.wait(lock, [&] { return unfinished_ == 0 || error_ || (alive_ == 0 && queued_ != 0); });
            raise_pending_error(lock);
            if (unfinished_ == 0) return;
            await_a_worker(lock);
        }
    }

    [[nodiscard]] bool done() {
        std::unique_lock lock(mutex_);
        raise_pending_error(lock);
        return unfinished_ == 0;
    }

    template <class F>
    [[nodiscard]] auto create_per_worker_dataset(F&& fn) {
        auto make = [&fn](int worker) {
            // get_current_worker_index() answers inside the dataset function, as TensorFlow's does.
            detail::ClosureContext context;
            context.worker = worker;
            const detail::ClosureContext::Guard guard(context);
            if constexpr (std::invocable<F&, int>) return fn(worker);
            else return fn();
        };
        using T = std::decay_t<std::invoke_result_t<decltype(make)&, int>>;
        std::vector<std::shared_ptr<T>> values;
        std::vector<std::exception_ptr> errors;  // TensorFlow's: raised by the closures that use them
        for (int i = 0; i < num_workers(); ++i) {
            try {
                values.push_back(std::make_shared<T>(make(i)));
                errors.emplace_back();
            } catch (...) {
                values.emplace_back();
                errors.push_back(std::current_exception());
            }
        }
        return PerWorkerValues<T>(std::move(values), std::move(errors));
    }

private:
    struct TaskBase {
        virtual ~TaskBase() = default;
        virtual void run(int worker) = 0;
        virtual void run_remote(detail::RemoteWorkers& workers, int worker) = 0;
        virtual void fail(std::exception_ptr error) = 0;
    };

    /// A scheduled call and the state of its RemoteValue. The function and arguments are released as
    /// soon as it has run, so a RemoteValue kept for its result does not keep large arguments alive.
    template <class R, class F, class Tuple>
    struct Task final : detail::RemoteState<R>, TaskBase {
        Task(F f, Tuple a) : fn(std::move(f)), args(std::move(a)) {}
        void run(int worker) override {
            finish([&] {
                return std::apply([&](auto&... a) -> decltype(auto) { return std::invoke(*fn, resolve(a, worker)...); },
                                  *args);
            });
        }
        /// On a worker of another process: sends the function's name and encoded arguments, and waits.
        void run_remote(detail::RemoteWorkers& workers, int worker) override {
            if constexpr (detail::is_registered_function_v<F>) {
                Request request;
                request.kind = RequestKind::call;
                request.name = fn->name();
                // A PerWorkerValues argument travels as the value of the worker that runs the call.
                request.values =
                    std::apply([&](auto&... a) { return detail::encode_values(resolve(a, worker)...); }, *args);
                Reply reply = workers.call(worker, std::move(request)).get();
                if (reply.code == ErrorCode::unavailable)
                    throw WorkerLostError("pss: worker " + std::to_string(worker) + " was lost: " + reply.message);
                finish([&] { return detail::decode_result<R>(reply.take_values(), fn->name()); });
            } else {
                throw InvalidArgumentError(std::string(detail::lambda_to_process));  // schedule refused it already
            }
        }
        template <class Compute>
        void finish(Compute compute) {
            if constexpr (std::is_void_v<R>) {
                compute();
                std::lock_guard lock(this->mutex);
                this->done = true;
            } else {
                auto result = compute();
                std::lock_guard lock(this->mutex);
                this->value.emplace(std::move(result));
                this->done = true;
            }
            fn.reset();
            args.reset();
            this->ready.notify_all();
        }
        void fail(std::exception_ptr error) override {
            fn.reset();
            args.reset();
            this->set_error(std::move(error));
        }
        std::optional<F> fn;
        std::optional<Tuple> args;
    };

    template <class T>
    static T& resolve(PerWorkerValues<T>& values, int worker) {
        return values.at(static_cast<std::size_t>(worker));
    }
    template <class T>
    static T& resolve(T& value, int) {
        return value;
    }

    /// Every worker is lost and closures wait (under the lock): waits the start-up timeout for a worker
    /// process to come back, as a task waits for another to start. Workers of this process never come
    /// back: their waiting closures fail with the error raised.
    /// @throws UnavailableError when none comes back in time
    void await_a_worker(std::unique_lock<std::mutex>& lock) {
        const auto waiting = [&] { return alive_ == 0 && queued_ != 0 && !error_; };
        finished_.wait(lock, [&] { return !waiting() || restarting_ == 0; });  // a worker starting again
        if (remote_ != nullptr) {
            const auto limit = remote_->timeouts().startup;
            if (limit.count() == 0) finished_.wait(lock, [&] { return !waiting(); });
            else (void)finished_.wait_for(lock, limit, [&] { return !waiting(); });
        }
        if (!waiting()) return;
        std::string why;
        if (remote_ != nullptr)
            why = " (none came back within the start-up timeout of " + startup_timeout_text() +
                  "; PSS_STARTUP_TIMEOUT sets it)";
        const std::string message = "pss: ClusterCoordinator: every worker is lost and " + std::to_string(queued_) +
                                    " closures are waiting; no worker is left to run them" + why;
        if (remote_ == nullptr) {
            // Workers of this process never come back: the closures waiting for one fail with the error
            // (their fetch raises it), so that nothing waits for them for ever. Each its own copy of the
            // message: an exception's text is shared by its copies, and they end on other threads.
            std::deque<Closure> abandoned = take_queued();
            unfinished_ -= abandoned.size();
            lock.unlock();
            for (auto& c : abandoned) c->fail(std::make_exception_ptr(UnavailableError(std::string(message))));
            lock.lock();
            finished_.notify_all();
            space_.notify_all();
        }
        throw UnavailableError(message);
    }

    /// A lost worker of another process (without the lock): probes it every heartbeat interval until it
    /// answers (a process with its task identity started again: it rejoins) or the coordinator stops.
    /// In synchronous training its closures wait for it: when it is not back within the start-up timeout,
    /// they fail (the first error raised), and it is waited for on.
    /// @returns true when it is back
    bool await_rejoin(int index) {
        // max(): never (a time_point, not an optional: GCC 12 at -O3 warns that an optional's may be unset).
        auto give_up = std::chrono::steady_clock::time_point::max();
        if (keep_pins_ && remote_->timeouts().startup.count() > 0)
            give_up = std::chrono::steady_clock::now() + remote_->timeouts().startup;
        const auto gave_up = [&] {
            if (std::chrono::steady_clock::now() < give_up) return;
            give_up = std::chrono::steady_clock::time_point::max();
            fail_pinned(index);
        };
        const Timeouts& timeouts = remote_->timeouts();
        const auto interval = timeouts.heartbeat_interval.count() > 0 ? timeouts.heartbeat_interval
                                                                      : std::chrono::milliseconds(1000);
        // A probe that connects to a frozen process is answered by the heartbeat timeout; without
        // heartbeats it is given up after this long and asked again.
        const auto patience = std::max(timeouts.heartbeat_timeout, std::chrono::milliseconds(10'000));
        const auto stopped = [&](std::chrono::milliseconds wait) {
            std::unique_lock lock(mutex_);
            return work_.wait_for(lock, wait, [&] { return stopping_; });
        };
        for (;;) {
            auto answer = remote_->probe(index);
            const auto given_up = std::chrono::steady_clock::now() + patience;
            while (answer.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready &&
                   std::chrono::steady_clock::now() < given_up) {
                if (stopped(std::chrono::milliseconds(20))) return false;
            }
            if (answer.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready && answer.get().ok())
                return true;
            gave_up();
            if (stopped(interval)) return false;
        }
    }

    /// The start-up timeout of the workers of another process, as errors name it: "60 s", "300 ms".
    [[nodiscard]] std::string startup_timeout_text() const {
        const auto ms = remote_->timeouts().startup.count();
        return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
    }

    /// The closures pinned to lost worker `index` (a synchronous run's) fail: it did not come back within
    /// the start-up timeout, and no other worker may push for it.
    void fail_pinned(int index) {
        std::unique_lock lock(mutex_);
        auto& own = pinned_[static_cast<std::size_t>(index)].queue;
        if (own.empty()) return;
        auto e = std::make_exception_ptr(WorkerLostError(
            "pss: worker " + std::to_string(index) + " was lost and did not come back within the start-up timeout of " +
            startup_timeout_text() +
            " (PSS_STARTUP_TIMEOUT); in synchronous training its steps wait for it, since no other worker may push "
            "for it"));
        std::deque<Closure> failed;
        failed.swap(own);
        unfinished_ -= failed.size();
        std::deque<Closure> cancelled = record_failure(e);
        lock.unlock();
        for (auto& c : failed) c->fail(e);
        for (auto& c : cancelled) c->fail(cancellation());
        finished_.notify_all();
        space_.notify_all();
        work_.notify_all();
    }

    /// True when `tasks` (the ps tasks a failure named) is not empty and none of them has failed
    /// `transient_ps_failures_` times yet (counted here, under the lock). A closure whose ps task
    /// restarted or whose link broke for a moment so runs again.
    bool transient_ps_failure(const std::set<int>& tasks) {
        if (transient_ps_failures_ <= 0) return false;
        bool transient = !tasks.empty();
        for (const int task : tasks)
            if (++ps_failures_[task] >= transient_ps_failures_) transient = false;
        return transient;
    }

    /// With recover_ps_from (under the lock, by the worker thread whose closure found a ps lost): no
    /// closure starts and the running ones end (each failure put back), then each lost ps task is made
    /// to serve again and the closures put back run again. When a task cannot be recovered, its error is
    /// raised as a closure's would be.
    void recover_lost_ps(std::unique_lock<std::mutex>& lock) {
        recovering_ = true;
        idle_.wait(lock, [&] { return running_ == 0; });
        std::exception_ptr failed;
        while (!lost_ps_.empty() && !failed) {
            const int task = *lost_ps_.begin();
            lost_ps_.erase(lost_ps_.begin());
            const auto recover = ps_recovery_;
            lock.unlock();
            try {
                recover(task);
            } catch (...) {
                failed = std::current_exception();
            }
            lock.lock();
        }
        lost_ps_.clear();
        recovering_ = false;
        std::deque<Closure> cancelled;
        if (failed) cancelled = record_failure(failed);
        lock.unlock();
        for (auto& c : cancelled) c->fail(cancellation());
        work_.notify_all();
        finished_.notify_all();
        space_.notify_all();
        lock.lock();
    }

    static std::exception_ptr cancellation() {
        return std::make_exception_ptr(
            CancelledError("pss: this closure was cancelled because an earlier closure failed; reschedule it"));
    }

    void raise_pending_error(std::unique_lock<std::mutex>& lock) {
        if (!error_) return;
        // TensorFlow's order: the closures still running end first (their next variable operation raises
        // CancelledError), so that no error of theirs comes after this one is raised and cleared; then
        // what is queued is cancelled, and the error raised once. Scheduling works again afterwards.
        // A call running in a worker process cannot be cancelled from here (it may wait for a synchronous
        // step that will never complete): only the closures of this process's own threads are waited for.
        if (remote_ == nullptr) idle_.wait(lock, [&] { return running_ == 0; });
        if (!error_) return;  // another caller raised it meanwhile
        std::deque<Closure> cancelled = take_queued();
        unfinished_ -= cancelled.size();
        auto error = std::exchange(error_, nullptr);
        lock.unlock();
        space_.notify_all();
        work_.notify_all();  // the workers take closures again
        for (auto& c : cancelled) c->fail(cancellation());
        std::rethrow_exception(error);
    }

    /// A closure's failure (under the lock): `error` becomes the error to raise unless one is pending, the
    /// count of failures moves (running closures see the cancellation), and every queued closure is
    /// taken out, to be cancelled by the caller once the lock is released.
    std::deque<Closure> record_failure(std::exception_ptr error) {
        if (!error_) error_ = std::move(error);
        ++failures_;
        std::deque<Closure> cancelled = take_queued();
        unfinished_ -= cancelled.size();
        return cancelled;
    }

    /// Every queued closure, shared and pinned, taken out of the queues (under the lock).
    std::deque<Closure> take_queued() {
        std::deque<Closure> all;
        all.swap(queue_);
        for (auto& p : pinned_) {
            all.insert(all.end(), std::make_move_iterator(p.queue.begin()), std::make_move_iterator(p.queue.end()));
            p.queue.clear();
        }
        queued_ = 0;
        return all;
    }

    void run_worker(int index) {
        // Closures run under the strategy's scope, with the context their variable operations read.
        std::optional<Strategy::Scope> scope;
        if (strategy_ != nullptr) scope.emplace(*strategy_);
        detail::ClosureContext context{index, &failures_, 0};
        const detail::ClosureContext::Guard current(context);
        auto& pinned = pinned_[static_cast<std::size_t>(index)];
        auto& own = pinned.queue;
        std::unique_lock lock(mutex_);
        for (;;) {
            // After an error no new closure starts: the queued ones wait to be cancelled by the call
            // that raises the error (TensorFlow's semantics), and resume if it never comes to that.
            work_.wait(lock, [&] {
                return !recovering_ && (((!own.empty() || !queue_.empty()) && !error_) || stopping_);
            });
            if ((own.empty() && queue_.empty()) || error_) return;  // stopping
            const bool was_full = queued_ >= max_queue_;
            auto& from = own.empty() ? queue_ : own;  // its own closures first, in the order they came
            Closure closure = std::move(from.front());
            from.pop_front();
            --queued_;
            ++running_;
            lock.unlock();
            if (was_full) space_.notify_one();
            context.failures_seen = failures_.load();
            try {
                if (remote_ != nullptr) closure->run_remote(*remote_, index);
                else closure->run(index);
            } catch (const WorkerLostError& lost) {
                const auto back_after = lost.back_after();
                lock.lock();
                // At least once: another worker runs it, and the closures that were this worker's; unless
                // an error is pending, which cancels what has not run (as TensorFlow's put_back does).
                // In synchronous training this worker's closures wait for it to rejoin instead: each
                // pushes its worker's part of a step, which no other worker may push.
                const bool cancel = error_ != nullptr;
                if (cancel) {
                    closure->fail(cancellation());  // before it stops counting as running, as below
                    --unfinished_;
                } else {
                    (keep_pins_ ? from : queue_).push_front(closure);
                    ++queued_;
                }
                if (!keep_pins_) {
                    queue_.insert(queue_.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
                    own.clear();
                }
                pinned.lost = true;
                --alive_;
                // A worker process started again with the same task identity rejoins (TensorFlow's
                // workers reconnect after preemption); one of this process comes back only when the error
                // says when (a simulated network's), and meanwhile a coordinator whose every worker is
                // lost waits for it (await_a_worker).
                const bool restarts = remote_ == nullptr && back_after.has_value();
                if (restarts) ++restarting_;
                if (--running_ == 0) idle_.notify_all();
                // Dropped under the lock: whoever ends the closure later (and its error) does so after this.
                closure.reset();
                lock.unlock();
                work_.notify_all();
                finished_.notify_all();
                space_.notify_all();
                if (remote_ != nullptr) {
                    if (!await_rejoin(index)) return;
                    lock.lock();
                } else {
                    if (!restarts) return;
                    lock.lock();
                    const bool stopped = work_.wait_for(lock, *back_after, [&] { return stopping_; });
                    --restarting_;
                    if (stopped) {
                        finished_.notify_all();
                        return;
                    }
                }
                pinned.lost = false;
                ++alive_;
                finished_.notify_all();
                space_.notify_all();
                continue;
            } catch (...) {
                auto e = std::current_exception();
                const std::set<int> lost_ps = unavailable_ps_tasks(e);
                lock.lock();
                if (!error_ && ps_recovery_ && (recovering_ || !lost_ps.empty())) {
                    // recover_ps_from: the closure runs again once its ps serves again (and any failure
                    // meanwhile is the loss's: the variables are restored before anything runs again).
                    from.push_front(closure);
                    ++queued_;
                    lost_ps_.insert(lost_ps.begin(), lost_ps.end());
                    if (--running_ == 0) idle_.notify_all();
                    if (!recovering_) recover_lost_ps(lock);
                    continue;
                }
                if (!error_ && transient_ps_failure(lost_ps)) {
                    // TensorFlow's transient ps failure: the closure runs again (first, and on the worker
                    // it was scheduled on); the next failure of that ps task past the threshold is raised.
                    from.push_front(closure);
                    ++queued_;
                    --running_;
                    lock.unlock();
                    work_.notify_all();
                    lock.lock();
                    continue;
                }
                // The first error is raised; the closures running meanwhile are cancelled cooperatively
                // (their next variable operation raises CancelledError), and their errors are not raised.
                // The queued ones are cancelled now, so that a fetch of one does not wait for the call
                // that raises the error. The count of failures moves before this closure's RemoteValue
                // is set (once its fetch has raised, every closure still running sees the cancellation),
                // and the value is set before the closure stops counting as running (once join has
                // raised, every RemoteValue of the closures that ran is ready).
                std::deque<Closure> cancelled = record_failure(e);
                lock.unlock();
                closure->fail(e);
                for (auto& c : cancelled) c->fail(cancellation());
                lock.lock();
                --unfinished_;
                if (--running_ == 0) idle_.notify_all();
                finished_.notify_all();
                space_.notify_all();
                continue;
            }
            lock.lock();  // held into the next wait: one lock per closure
            if (--unfinished_ == 0) finished_.notify_all();
            if (--running_ == 0 && (error_ || recovering_)) idle_.notify_all();
        }
    }

    std::size_t max_queue_;
    detail::RemoteWorkers* remote_ = nullptr;  // set when the workers are other processes
    Strategy* strategy_ = nullptr;             // whose scope the closures run under
    std::mutex mutex_;
    std::condition_variable work_, space_, finished_, idle_;
    std::deque<Closure> queue_;                // for any worker
    std::size_t unfinished_ = 0;
    std::size_t running_ = 0;  // closures a worker thread runs now
    std::size_t alive_;
    std::size_t restarting_ = 0;  // lost workers of this process that start again (WorkerLostError::back_after)
    struct Pinned {
        std::deque<Closure> queue;
        bool lost = false;  // its worker is gone: closures for it go to queue_
    };
    std::vector<Pinned> pinned_;  // one per worker (schedule_on)
    bool keep_pins_ = false;      // synchronous, workers of other processes: a lost worker's closures wait for it
    std::size_t queued_ = 0;      // in queue_ and pinned_
    std::exception_ptr error_;
    static constexpr std::string_view transient_ps_failures_variable = "TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES";
    int transient_ps_failures_ = 3;  // TensorFlow's default
    std::map<int, int> ps_failures_;  // ps task -> its failures so far
    std::function<void(int)> ps_recovery_;  // recover_ps_from's
    bool recovering_ = false;               // no closure starts while lost ps tasks are recovered
    std::set<int> lost_ps_;                 // to recover
    std::atomic<std::uint64_t> failures_{0};
    bool stopping_ = false;
    std::vector<std::thread> workers_;  // last: started after everything they use
};

/// Makes the lost ps tasks `lost` serve this run again: waits for each to answer (the start-up timeout),
/// greets it, creates its shards again and restores every variable from `manager`'s latest checkpoint,
/// so that the model is the checkpoint's whole. A message lost meanwhile (to them or to another ps)
/// fails that attempt alone: it is made again, with every variable restored again, until the start-up
/// timeout; another ps task lost meanwhile is made to serve again in the same way. An attempt that
/// failed may have created shards whose replies were lost, so a restore always follows it. Prints one
/// line as it starts and one when done. Returns false when every task answered holding its shards
/// (its link broke for a moment) and `restore_anyway` is false: nothing was restored.
/// @throws UnavailableError when a task does not come back within the start-up timeout, or when the
/// manager holds no checkpoint; the handshake's and the restore's errors
template <class Manager>
bool recover_ps(Manager& manager, std::set<int> lost, bool restore_anyway = false) {
    std::string names;
    for (const int t : lost) names += (names.empty() ? "" : ", ") + ("/job:ps/replica:0/task:" + std::to_string(t));
    std::fprintf(stderr, "pss: %s was lost; waiting for it to start again, then restoring every variable from the "
                         "latest checkpoint in %s\n", names.c_str(), std::string(manager.directory()).c_str());
    auto& strategy = manager.checkpoint().strategy();
    const auto started = std::chrono::steady_clock::now();
    std::size_t created = 0;
    bool failed = false;
    std::optional<std::string> restored;
    for (;;) {
        try {
            for (const int t : lost) created += strategy.recreate_shards(t);
            if (created == 0 && !failed && !restore_anyway) {
                std::fprintf(stderr, "pss: %s answers again and kept its shards; its closures run again\n", names.c_str());
                return false;
            }
            restored = manager.restore_or_initialize();
            break;
        } catch (const UnavailableError&) {
            failed = true;
            const auto limit = strategy.timeouts().startup;
            if (limit.count() > 0 && std::chrono::steady_clock::now() - started >= limit) throw;
            const std::set<int> named = unavailable_ps_tasks(std::current_exception());
            lost.insert(named.begin(), named.end());
        }
    }
    if (!restored)
        throw UnavailableError("pss: " + names + " started again without its shards, and " +
                               std::string(manager.directory()) +
                               " holds no checkpoint to restore them from (CheckpointManager::save one before a loss)");
    std::fprintf(stderr, "pss: %s is back: %zu shard%s created again, every variable restored from %s; training goes on\n",
                 names.c_str(), created, created == 1 ? "" : "s", restored->c_str());
    return true;
}

}  // namespace detail

/// @brief Schedules closures (steps) on the workers of a strategy's cluster (tf ClusterCoordinator).
///
/// Workers take closures from one queue, so faster workers take more; `schedule_on` gives a closure to
/// one worker instead (a synchronous step's closures, one per worker). `schedule` returns a RemoteValue
/// at once, and blocks only while `max_queue` closures wait. The first error a closure
/// raises is raised again by the next `schedule`, `join` or `done`; before that, the closures still
/// queued are cancelled (their fetch throws CancelledError), and afterwards scheduling works again.
/// A closure whose worker is lost runs again on another worker: execution is at least once.
///
/// There is one coordinator per pss::Strategy, as in TensorFlow: a ClusterCoordinator constructed for a
/// strategy that has one already is a handle to it (it compares equal), so every handle schedules on the
/// same workers and sees the same errors (Sequential::fit uses it too). The last handle to go finishes
/// the queued closures and stops the workers.
///
/// On the embedded cluster each worker task is a thread of this process. When the workers are other
/// processes (a TCP cluster), each has a thread here that sends it one closure at a time; only a
/// RegisteredFunction can be sent, with Transferable arguments, and its errors come back as the same
/// Error types. A worker that cannot be reached is lost: its closure runs on another worker. A lost
/// worker is asked every heartbeat interval whether it is up again; a process started again with its task
/// identity (`pss-launch --restart-failed`, Kubernetes, Slurm) so rejoins and takes closures, as
/// TensorFlow's workers do after preemption. While every worker is lost, `join` and a `schedule` whose
/// queue is full wait the start-up timeout for one to come back.
///
/// @par Example
/// @code
/// pss::ClusterCoordinator coordinator(strategy);
/// auto v = [&] { auto s = strategy.scope(); return pss::Variable(xt::xarray<float>{0}, "v"); }();
/// for (int i = 0; i < 5; ++i) coordinator.schedule([&] { v.assign_add(xt::xarray<float>{2}); });
/// coordinator.join();  // v is 10
/// @endcode
class ClusterCoordinator {
public:
    /// @param strategy any strategy with `num_workers()`. For a pss::Strategy, the coordinator that
    /// exists for it already, if any (TensorFlow's ClusterCoordinator is one per strategy): one pool of
    /// worker threads and one error state, whoever schedules; `max_queue` is the first one's. Otherwise
    /// a new coordinator, with one thread per worker.
    template <class StrategyType>
        requires requires(const StrategyType& s) {
            { s.num_workers() } -> std::convertible_to<int>;
        }
    explicit ClusterCoordinator(StrategyType& strategy, std::size_t max_queue = 256 * 1024) {
        if constexpr (std::derived_from<StrategyType, Strategy>) {
            Strategy& base = strategy;
            std::lock_guard lock(base.coordinator_mutex_);
            pool_ = std::static_pointer_cast<detail::CoordinatorPool>(base.coordinator_.lock());
            if (pool_) return;
            pool_ = std::make_shared<detail::CoordinatorPool>(strategy, max_queue);
            base.coordinator_ = pool_;
        } else {
            pool_ = std::make_shared<detail::CoordinatorPool>(strategy, max_queue);
        }
    }

    [[nodiscard]] int num_workers() const noexcept { return pool_->num_workers(); }

    /// @brief Queues `fn(args...)` to run on some worker; returns its RemoteValue at once.
    ///
    /// An argument that is a PerWorkerValues<T> reaches `fn` as the T& of the worker that runs it.
    /// Pass a RegisteredFunction (see register_function) to schedule by a name every process knows,
    /// with arguments that can cross a wire; any callable works on the embedded cluster.
    /// @throws the first error of an earlier closure (see the class description).
    /// @throws InvalidArgumentError, from this call, for a RemoteValue argument (fetch it first, as
    /// TensorFlow requires), or a function that is not a RegisteredFunction when the workers are other
    /// processes
    template <class F, class... Args>
    auto schedule(F&& fn, Args&&... args) {
        return pool_->schedule(std::forward<F>(fn), std::forward<Args>(args)...);
    }

    /// @brief Queues `fn(args...)` to run on worker `worker` only, after the closures queued for it
    /// before; as schedule() otherwise.
    ///
    /// Synchronous training schedules a step as one closure per worker this way: each worker
    /// contributes one push to the step, which one queue for all would not ensure (a worker that ended
    /// its closure early could take the step's next one too). A closure whose worker is lost runs on
    /// another worker, as with schedule(); in synchronous training with workers of other processes it
    /// waits for its worker to rejoin instead (its push is that worker's part of the step, which the ps
    /// takes from no other), for the start-up timeout, after which it fails with WorkerLostError.
    /// @throws InvalidArgumentError when `worker` is not in [0, num_workers()); the errors of schedule()
    template <class F, class... Args>
    auto schedule_on(int worker, F&& fn, Args&&... args) {
        return pool_->schedule_on(worker, std::forward<F>(fn), std::forward<Args>(args)...);
    }

    /// @brief Waits until every scheduled closure has run.
    /// @throws the first error of a closure; UnavailableError when every worker is lost with closures waiting
    /// and none comes back within the start-up timeout (at once when the workers are threads of this process)
    void join() { pool_->join(); }

    /// @brief True when every scheduled closure has run. @throws the first error of a closure.
    [[nodiscard]] bool done() { return pool_->done(); }

    /// @brief Beyond TensorFlow: a lost ps task is waited for and restored from `manager`'s latest
    /// checkpoint, instead of raised.
    ///
    /// From this call on (for every handle of this coordinator, Sequential::fit's included), when a
    /// closure fails with an UnavailableError naming ps tasks: no closure starts, the running ones end
    /// (each failure put back to run again), and for each such task the chief waits for it to answer
    /// again (restarted with its task identity by `pss-launch --restart-failed`, Kubernetes or Slurm;
    /// for the start-up timeout), greets it as at start-up, creates its shards again and restores every
    /// variable of the strategy from the latest checkpoint, so that the model is the checkpoint's
    /// whole (not a mix of newer shards and restored ones); then the closures put back run again. The
    /// steps lost are those since the checkpoint. A task that answers again holding its shards (its
    /// link broke for a moment) is not restored: its closures run again. A closure that ran
    /// while a ps was lost runs again, so execution stays at least once. Each loss and recovery prints
    /// one line on stderr. Asynchronous training only: the restore takes a synchronous shard's count of
    /// applied steps back to the checkpoint's step, while the closures put back push later steps.
    /// @param manager of a Checkpoint of this coordinator's strategy; it must outlive the coordinator
    /// @throws InvalidArgumentError when the manager's strategy is not this coordinator's. Afterwards,
    /// `join`, `schedule` and `done` raise the recovery's error: UnavailableError naming the task when it
    /// does not come back within the start-up timeout, or when there is no checkpoint yet; the
    /// handshake's FailedPreconditionError when it came back with another configuration; a restore's
    /// errors.
    template <class Manager>
        requires requires(Manager& m, int task) {
            { m.checkpoint().strategy().recreate_shards(task) } -> std::convertible_to<std::size_t>;
            { m.checkpoint().strategy().timeouts().startup } -> std::convertible_to<std::chrono::milliseconds>;
            { m.restore_or_initialize() } -> std::same_as<std::optional<std::string>>;
            { m.directory() } -> std::convertible_to<std::string>;
        }
    void recover_ps_from(Manager& manager) {
        using StrategyType = std::remove_reference_t<decltype(manager.checkpoint().strategy())>;
        static_assert(!StrategyType::synchronous,
                      "pss: recover_ps_from: synchronous training cannot resume on restored shards (the restore takes "
                      "a shard's count of applied steps back to the checkpoint's, while the closures put back push "
                      "later steps); restart the cluster and restore instead");
        if (static_cast<Strategy*>(&manager.checkpoint().strategy()) != pool_->strategy())
            throw InvalidArgumentError("pss: ClusterCoordinator::recover_ps_from: the checkpoint manager's strategy "
                                       "is not this coordinator's");
        pool_->set_ps_recovery([&manager](int task) { (void)detail::recover_ps(manager, {task}); });
    }

    /// @brief TensorFlow's per-worker variable (`tf.Variable(..., per_worker_variable=True)` in a
    /// ParameterServerStrategy's scope): one variable per worker, each from `initial_value`, named
    /// `name/worker_<i>` and placed on the ps tasks as any other. A closure given it as an argument
    /// receives its worker's variable (a worker process too); `read_all()` reads every worker's.
    /// @throws FailedPreconditionError when the coordinator was not made for a pss::Strategy
    [[nodiscard]] PerWorkerValues<Variable> create_per_worker_variable(const Tensor& initial_value,
                                                                       const std::string& name = "Variable") {
        Strategy* strategy = pool_->strategy();
        if (strategy == nullptr)
            throw FailedPreconditionError("pss: create_per_worker_variable: this coordinator's strategy places no "
                                          "variables");
        const Strategy::Scope scope(*strategy);
        std::vector<std::shared_ptr<Variable>> variables;
        for (int i = 0; i < num_workers(); ++i)
            variables.push_back(std::make_shared<Variable>(Tensor(initial_value), name + "/worker_" + std::to_string(i)));
        return PerWorkerValues<Variable>(std::move(variables));
    }

    /// @brief One value per worker (tf create_per_worker_dataset), made by `fn(worker_index)` or by
    /// `fn()`, which may ask get_current_worker_index() as TensorFlow's dataset functions do. A worker's
    /// value whose making throws is not raised here: a closure that receives it raises ClosureInputError
    /// (from `join` and its RemoteValue), and one that does not use it runs, as in TensorFlow.
    template <class F>
    [[nodiscard]] auto create_per_worker_dataset(F&& fn) {
        return pool_->create_per_worker_dataset(std::forward<F>(fn));
    }

    /// @brief True when both are the same coordinator (made for the same strategy).
    [[nodiscard]] friend bool operator==(const ClusterCoordinator& a, const ClusterCoordinator& b) noexcept {
        return a.pool_ == b.pool_;
    }

    /// @brief Testing hook: called inside a closure, loses the worker running it. The closure is put
    /// back in the queue and runs again on another worker; this worker takes no more closures.
    [[noreturn]] static void testing_lose_current_worker() {
        throw WorkerLostError("pss: worker " + std::to_string(worker_index()) + " was lost (testing hook)");
    }

private:
    std::shared_ptr<detail::CoordinatorPool> pool_;  // the last handle's destructor finishes the queue
};

PSS_NAMESPACE_END
