// pss/detail/closure_context.hpp: what a closure's variable operations know about the closure running them.
#pragma once

#include <atomic>
#include <cstdint>

#include <pss/config.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief The closure running on this thread: set by whoever runs it (a ClusterCoordinator's worker
/// thread, or a worker process serving a call) for the duration of the call, read by worker_index()
/// and by a synchronous pull deciding whether to go on waiting.
struct ClosureContext {
    int worker = -1;  ///< the worker task running the closure
    /// Failures of the coordinator's closures: a synchronous pull gives up when the count moves past
    /// `failures_seen` (another closure failed, so the step it waits for may never complete).
    const std::atomic<std::uint64_t>* failures = nullptr;
    std::uint64_t failures_seen = 0;

    [[nodiscard]] bool cancelled() const noexcept {
        return failures != nullptr && failures->load(std::memory_order_relaxed) != failures_seen;
    }

    /// The context of the closure running on this thread, or nullptr.
    [[nodiscard]] static const ClosureContext*& current() noexcept {
        thread_local const ClosureContext* context = nullptr;
        return context;
    }

    /// The running closure's worker, never cancelled: what a closure finishing a synchronous step
    /// others wait for runs its pushes under (another closure's failure must not stop them part-way).
    [[nodiscard]] static ClosureContext uncancelled() noexcept {
        const ClosureContext* running = current();
        return {running != nullptr ? running->worker : -1, nullptr, 0};
    }

    /// Makes `context` current on this thread until the guard is destroyed.
    class [[nodiscard]] Guard {
    public:
        explicit Guard(const ClosureContext& context) : previous_(current()) { current() = &context; }
        Guard(const Guard&) = delete;
        Guard& operator=(const Guard&) = delete;
        ~Guard() { current() = previous_; }

    private:
        const ClosureContext* previous_;
    };
};

}  // namespace detail

/// @brief The index of the worker running the current closure, or -1 outside a closure (on the
/// coordinator). Use it to shard data by worker.
[[nodiscard]] inline int worker_index() noexcept {
    const auto* context = detail::ClosureContext::current();
    return context != nullptr ? context->worker : -1;
}

/// @brief TensorFlow's `tf.distribute.coordinator.experimental_get_current_worker_index()`: the index
/// of the worker running the current closure, or the dataset function of
/// `ClusterCoordinator::create_per_worker_dataset` for that worker.
/// @throws FailedPreconditionError on the coordinator, outside both, as TensorFlow raises there
[[nodiscard]] inline int get_current_worker_index() {
    const int worker = worker_index();
    if (worker < 0)
        throw FailedPreconditionError(
            "pss: get_current_worker_index() was called outside a worker: call it inside a function that "
            "ClusterCoordinator::schedule runs, or a dataset function of create_per_worker_dataset");
    return worker;
}

PSS_NAMESPACE_END
