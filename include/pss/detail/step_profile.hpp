// pss/detail/step_profile.hpp: process-wide counters of the time training steps spend in pulls, pushes and in all, for benchmarks.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>

#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief What StepProfile has counted since its last reset(), summed over every thread of the process.
///
/// Times are nanoseconds of wall clock. A step's pulls and pushes run inside it, so
/// `compute_ns() = step_ns - pull_ns - push_ns` is the time steps spent neither waiting on a pull nor on a
/// push (forward, loss, backward, and the local bookkeeping around requests).
struct StepProfileSnapshot {
    std::uint64_t pull_ns = 0;     ///< in exchanges whose requests read (Op::read, Op::gather)
    std::uint64_t pull_count = 0;  ///< such exchanges (one per Variable read, however many shards it asks)
    std::uint64_t push_ns = 0;     ///< in exchanges whose requests update (assign*, scatter*, apply_*)
    std::uint64_t push_count = 0;
    std::uint64_t step_ns = 0;     ///< in keras training steps (detail::keras_train_step), pulls and pushes included
    std::uint64_t step_count = 0;

    /// @brief step_ns - pull_ns - push_ns, or 0 when pulls and pushes outside steps make that negative.
    [[nodiscard]] std::uint64_t compute_ns() const noexcept {
        const std::uint64_t io = pull_ns + push_ns;
        return step_ns > io ? step_ns - io : 0;
    }
};

/// @brief Process-wide, lock-free profile of training steps: time waiting in pulls, in pushes, and in whole
/// steps. Off by default: nothing is timed (no clock is read) until a benchmark calls `set_enabled(true)`.
///
/// Counters are relaxed atomics: a snapshot taken while steps run is a consistent-enough sum, one taken
/// after they finished (after ClusterCoordinator::join or Sequential::fit) is exact.
///
/// @par Example
/// @code
/// auto& profile = pss::detail::StepProfile::instance();
/// profile.reset();
/// profile.set_enabled(true);
/// model.fit(x, y, 1, 256, false, false);
/// profile.set_enabled(false);
/// const auto s = profile.snapshot();  // s.pull_ns, s.push_ns, s.compute_ns(), s.step_ns
/// @endcode
struct StepProfile {
    enum class Counter { pull, push, step };

    /// @brief The one profile of this process.
    [[nodiscard]] static StepProfile& instance() noexcept {
        static StepProfile profile;
        return profile;
    }

    [[nodiscard]] bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
    void set_enabled(bool on) noexcept { enabled_.store(on, std::memory_order_relaxed); }

    /// @brief Sets every counter to 0 (leaves enabled() as it is).
    void reset() noexcept {
        for (auto* c : {&pull_ns_, &pull_count_, &push_ns_, &push_count_, &step_ns_, &step_count_})
            c->store(0, std::memory_order_relaxed);
    }

    [[nodiscard]] StepProfileSnapshot snapshot() const noexcept {
        return {pull_ns_.load(std::memory_order_relaxed),  pull_count_.load(std::memory_order_relaxed),
                push_ns_.load(std::memory_order_relaxed),  push_count_.load(std::memory_order_relaxed),
                step_ns_.load(std::memory_order_relaxed),  step_count_.load(std::memory_order_relaxed)};
    }

    /// @brief Adds one event of `ns` nanoseconds to `counter`.
    void add(Counter counter, std::uint64_t ns) noexcept {
        auto* time = &step_ns_;
        auto* count = &step_count_;
        if (counter == Counter::pull) {
            time = &pull_ns_;
            count = &pull_count_;
        } else if (counter == Counter::push) {
            time = &push_ns_;
            count = &push_count_;
        }
        time->fetch_add(ns, std::memory_order_relaxed);
        count->fetch_add(1, std::memory_order_relaxed);
    }

    /// @brief Adds the time from its construction to its destruction to `counter`, when `active` and the
    /// profile was enabled at construction; otherwise it reads no clock and adds nothing.
    class Timer {
    public:
        explicit Timer(Counter counter, bool active = true) noexcept
            : counter_(counter), active_(active && instance().enabled()) {
            if (active_) start_ = std::chrono::steady_clock::now();
        }
        Timer(const Timer&) = delete;
        Timer& operator=(const Timer&) = delete;
        ~Timer() {
            if (!active_) return;
            const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
            instance().add(counter_, static_cast<std::uint64_t>(ns.count()));
        }

    private:
        Counter counter_;
        bool active_;
        std::chrono::steady_clock::time_point start_{};
    };

private:
    StepProfile() = default;

    std::atomic<bool> enabled_{false};
    std::atomic<std::uint64_t> pull_ns_{0}, pull_count_{0}, push_ns_{0}, push_count_{0}, step_ns_{0}, step_count_{0};
};

}  // namespace detail

PSS_NAMESPACE_END
