// pss/optimizer/schedules.hpp: learning rates that follow the training step (Keras' optimizers.schedules),
// and LearningRate, an optimizer's rate: a constant or a schedule.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <numbers>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <pss/config.hpp>
#include <pss/detail/optimizer_support.hpp>
#include <pss/errors.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A learning rate that changes with the training step: Keras' `LearningRateSchedule`.
///
/// `schedule(step)` is the rate of the apply made after `step` training steps (Keras' `optimizer.iterations`:
/// 0 for the first step). Each ps task evaluates it for the step a push names (see LearningRate), so a
/// schedule must be a pure function of the step: the same step gives the same rate on every task.
/// Derive from it for a schedule of your own; `get_config` names its parameters, and every task of a
/// cluster must build the same one (the tasks compare their optimizers' configs at start-up).
class LearningRateSchedule {
public:
    virtual ~LearningRateSchedule() = default;
    /// @brief The rate after `step` training steps (`step` >= 0).
    [[nodiscard]] virtual double operator()(std::int64_t step) const = 0;
    /// @brief Keras' class name: "ExponentialDecay".
    [[nodiscard]] virtual std::string class_name() const = 0;
    /// @brief The parameters by Keras' names: `{"initial_learning_rate": 0.1, "decay_steps": 100, ...}`.
    [[nodiscard]] virtual nlohmann::json get_config() const = 0;

protected:
    LearningRateSchedule() = default;
    LearningRateSchedule(const LearningRateSchedule&) = default;
    LearningRateSchedule& operator=(const LearningRateSchedule&) = default;
};

/// @brief Keras' `ExponentialDecay(initial_learning_rate, decay_steps, decay_rate, staircase=False)`:
/// `initial_learning_rate * decay_rate ^ (step / decay_steps)`, the exponent floored when `staircase`.
/// @par Example
/// @code
/// pss::SGD sgd(pss::ExponentialDecay(0.1, 1000, 0.96));  // 0.1 at step 0, 0.096 at step 1000
/// @endcode
class ExponentialDecay final : public LearningRateSchedule {
public:
    /// @throws InvalidArgumentError when a rate is negative or not finite, or decay_steps is not > 0:
    /// `pss: ExponentialDecay: decay_steps is 0, but it must be a finite number > 0 ...`
    ExponentialDecay(double initial_learning_rate, double decay_steps, double decay_rate, bool staircase = false)
        : initial_learning_rate_(initial_learning_rate), decay_steps_(decay_steps), decay_rate_(decay_rate),
          staircase_(staircase) {
        detail::check_hyperparameter(initial_learning_rate >= 0, "ExponentialDecay", "initial_learning_rate",
                                        initial_learning_rate, "a finite number >= 0 (the rate at step 0)");
        detail::check_hyperparameter(decay_steps > 0, "ExponentialDecay", "decay_steps", decay_steps,
                                        "a finite number > 0 (the steps over which the rate is multiplied by decay_rate)");
        detail::check_hyperparameter(decay_rate >= 0, "ExponentialDecay", "decay_rate", decay_rate,
                                        "a finite number >= 0 (the factor per decay_steps steps)");
    }
    [[nodiscard]] double operator()(std::int64_t step) const override {
        double p = static_cast<double>(step) / decay_steps_;
        if (staircase_) p = std::floor(p);
        return initial_learning_rate_ * std::pow(decay_rate_, p);
    }
    [[nodiscard]] std::string class_name() const override { return "ExponentialDecay"; }
    [[nodiscard]] nlohmann::json get_config() const override {
        return {{"initial_learning_rate", initial_learning_rate_}, {"decay_steps", decay_steps_},
                {"decay_rate", decay_rate_}, {"staircase", staircase_}};
    }

private:
    double initial_learning_rate_, decay_steps_, decay_rate_;
    bool staircase_;
};

/// @brief Keras' `PiecewiseConstantDecay(boundaries, values)`: `values[0]` while step <= boundaries[0],
/// `values[i]` while boundaries[i-1] < step <= boundaries[i], and the last value after the last boundary.
/// @par Example
/// @code
/// pss::SGD sgd(pss::PiecewiseConstantDecay({100000, 110000}, {1.0, 0.5, 0.1}));
/// @endcode
class PiecewiseConstantDecay final : public LearningRateSchedule {
public:
    /// @throws InvalidArgumentError when values is not one longer than boundaries, the boundaries do not
    /// increase, or a value is negative or not finite.
    PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<double> values)
        : boundaries_(std::move(boundaries)), values_(std::move(values)) {
        if (values_.size() != boundaries_.size() + 1)
            throw InvalidArgumentError("pss: PiecewiseConstantDecay: " + std::to_string(boundaries_.size()) +
                                       " boundaries and " + std::to_string(values_.size()) +
                                       " values; give one value more than boundaries (a value before the first "
                                       "boundary, one after each)");
        for (std::size_t i = 1; i < boundaries_.size(); ++i)
            if (boundaries_[i] <= boundaries_[i - 1])
                throw InvalidArgumentError("pss: PiecewiseConstantDecay: boundary " + std::to_string(i) + " (" +
                                           std::to_string(boundaries_[i]) + ") is not above boundary " +
                                           std::to_string(i - 1) + " (" + std::to_string(boundaries_[i - 1]) +
                                           "); the boundaries must increase");
        for (std::size_t i = 0; i < values_.size(); ++i)
            detail::check_hyperparameter(values_[i] >= 0, "PiecewiseConstantDecay",
                                            "value " + std::to_string(i), values_[i], "a finite number >= 0");
    }
    [[nodiscard]] double operator()(std::int64_t step) const override {
        // The first boundary not below the step: values_[i] covers (boundaries_[i-1], boundaries_[i]].
        const auto at = std::lower_bound(boundaries_.begin(), boundaries_.end(), step);
        return values_[static_cast<std::size_t>(at - boundaries_.begin())];
    }
    [[nodiscard]] std::string class_name() const override { return "PiecewiseConstantDecay"; }
    [[nodiscard]] nlohmann::json get_config() const override {
        return {{"boundaries", boundaries_}, {"values", values_}};
    }

private:
    std::vector<std::int64_t> boundaries_;
    std::vector<double> values_;
};

/// @brief Keras' `CosineDecay(initial_learning_rate, decay_steps, alpha=0, warmup_target=None,
/// warmup_steps=0)`: with a warm-up, the rate rises linearly from `initial_learning_rate` to
/// `warmup_target` over `warmup_steps`, then decays from it along a half cosine over `decay_steps` to
/// `alpha` times it, where it stays. Without a warm-up the decay starts from `initial_learning_rate`.
/// @par Example
/// @code
/// pss::Adam adam(pss::CosineDecay(0.0, 10000, 0.0, 0.001, 1000));  // 1000 steps of warm-up to 0.001
/// @endcode
class CosineDecay final : public LearningRateSchedule {
public:
    /// @throws InvalidArgumentError when a rate is negative, alpha is outside [0, 1], decay_steps is not
    /// > 0 or warmup_steps is negative.
    CosineDecay(double initial_learning_rate, double decay_steps, double alpha = 0.0,
                std::optional<double> warmup_target = std::nullopt, double warmup_steps = 0.0)
        : initial_learning_rate_(initial_learning_rate), decay_steps_(decay_steps), alpha_(alpha),
          warmup_target_(warmup_target), warmup_steps_(warmup_steps) {
        detail::check_hyperparameter(initial_learning_rate >= 0, "CosineDecay", "initial_learning_rate",
                                        initial_learning_rate, "a finite number >= 0");
        detail::check_hyperparameter(decay_steps > 0, "CosineDecay", "decay_steps", decay_steps,
                                        "a finite number > 0 (the steps of the cosine decay)");
        detail::check_hyperparameter(alpha >= 0 && alpha <= 1, "CosineDecay", "alpha", alpha,
                                        "in [0, 1] (the last rate as a fraction of the first)");
        if (warmup_target)
            detail::check_hyperparameter(*warmup_target >= 0, "CosineDecay", "warmup_target", *warmup_target,
                                            "a finite number >= 0 (the rate the warm-up reaches)");
        detail::check_hyperparameter(warmup_steps >= 0, "CosineDecay", "warmup_steps", warmup_steps,
                                        "a finite number >= 0");
    }
    [[nodiscard]] double operator()(std::int64_t step) const override {
        const double s = static_cast<double>(step);
        if (!warmup_target_) return decayed(std::min(s, decay_steps_), initial_learning_rate_);
        const double t = std::min(s, decay_steps_ + warmup_steps_);
        if (t < warmup_steps_)
            return (*warmup_target_ - initial_learning_rate_) * (t / warmup_steps_) + initial_learning_rate_;
        return decayed(t - warmup_steps_, *warmup_target_);
    }
    [[nodiscard]] std::string class_name() const override { return "CosineDecay"; }
    [[nodiscard]] nlohmann::json get_config() const override {
        return {{"initial_learning_rate", initial_learning_rate_},
                {"decay_steps", decay_steps_},
                {"alpha", alpha_},
                {"warmup_target", warmup_target_ ? nlohmann::json(*warmup_target_) : nlohmann::json(nullptr)},
                {"warmup_steps", warmup_steps_}};
    }

private:
    [[nodiscard]] double decayed(double step, double from) const {
        const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * step / decay_steps_));
        return from * ((1 - alpha_) * cosine + alpha_);
    }

    double initial_learning_rate_, decay_steps_, alpha_;
    std::optional<double> warmup_target_;
    double warmup_steps_;
};

/// @brief An optimizer's learning rate: a constant, or a LearningRateSchedule of the training step
/// (Keras' `learning_rate` argument, a float or a schedule). Converts from either, so `pss::SGD(0.1)` and
/// `pss::SGD(pss::ExponentialDecay(0.1, 1000, 0.96))` both work.
///
/// A schedule is evaluated on each ps task, for the step each push names: the ps makes the optimizer
/// for that step (`with_learning_rate(rate(step - 1))`) and applies with it, so the rate does not travel
/// and every shard of a step gets the same one. A schedule is shared between copies (it holds no state).
class LearningRate {
public:
    /// @brief A constant rate (checked by the optimizer that takes it).
    LearningRate(double constant) noexcept : constant_(constant) {}  // NOLINT(google-explicit-constructor): SGD(0.1)
    /// @brief A schedule, copied into the rate: `LearningRate(pss::ExponentialDecay(0.1, 1000, 0.96))`.
    template <class S>
        requires std::derived_from<std::decay_t<S>, LearningRateSchedule>
    LearningRate(S&& schedule)  // NOLINT(google-explicit-constructor, bugprone-forwarding-reference-overload)
        : schedule_(std::make_shared<const std::decay_t<S>>(std::forward<S>(schedule))) {}
    /// @brief A schedule shared with the caller. @throws InvalidArgumentError when it is null
    explicit LearningRate(std::shared_ptr<const LearningRateSchedule> schedule) : schedule_(std::move(schedule)) {
        if (!schedule_) throw InvalidArgumentError("pss: LearningRate: the schedule is null");
    }

    [[nodiscard]] bool is_schedule() const noexcept { return schedule_ != nullptr; }
    /// @brief The schedule, or null for a constant rate.
    [[nodiscard]] const LearningRateSchedule* schedule() const noexcept { return schedule_.get(); }

    /// @brief The rate after `step` training steps: the constant, or the schedule's value.
    [[nodiscard]] double operator()(std::int64_t step) const { return schedule_ ? (*schedule_)(step) : constant_; }

    /// @brief The constant rate, for an apply that was given no step.
    /// @throws FailedPreconditionError for a schedule, naming `optimizer`: a schedule needs the step.
    [[nodiscard]] double constant(std::string_view optimizer) const {
        if (!schedule_) return constant_;
        throw FailedPreconditionError(
            "pss: " + std::string(optimizer) + ": the learning rate is a schedule (" + schedule_->class_name() +
            "), whose value depends on the training step; apply through with_learning_rate(rate(step)), as a "
            "parameter server does for each push that names its step");
    }

    /// @brief Keras' serialization: the number, or `{"class_name": "ExponentialDecay", "config": {...}}`.
    [[nodiscard]] nlohmann::json get_config() const {
        if (!schedule_) return constant_;
        return {{"class_name", schedule_->class_name()}, {"config", schedule_->get_config()}};
    }

    /// @brief Equal constants, or schedules of one class and config.
    friend bool operator==(const LearningRate& a, const LearningRate& b) {
        if (a.is_schedule() != b.is_schedule()) return false;
        return a.is_schedule() ? a.get_config() == b.get_config() : a.constant_ == b.constant_;
    }

    /// @brief `0.1`, or `ExponentialDecay(initial_learning_rate=0.1, decay_steps=1000, ...)` (Keras' order
    /// of the config's fields is not kept: nlohmann's objects sort their keys).
    friend std::ostream& operator<<(std::ostream& out, const LearningRate& rate) {
        if (!rate.schedule_) return out << rate.constant_;
        out << rate.schedule_->class_name() << "(";
        const char* sep = "";
        const nlohmann::json config = rate.schedule_->get_config();  // kept: items() refers to it
        for (const auto& [key, value] : config.items()) {
            out << sep << key << "=" << value.dump();
            sep = ", ";
        }
        return out << ")";
    }

private:
    double constant_ = 0;
    std::shared_ptr<const LearningRateSchedule> schedule_;
};

namespace detail {

/// @brief Checks that `rate` may be set as `optimizer`'s rate for the run (what `who`, a
/// set_learning_rate, was asked).
/// @throws FailedPreconditionError when the optimizer's rate is a schedule (Keras refuses too);
/// InvalidArgumentError, naming the optimizer, when `rate` is negative or not finite
template <class O>
void check_settable_learning_rate(const O& optimizer, double rate, std::string_view who) {
    const LearningRate& own = optimizer.learning_rate();
    if (own.is_schedule())
        throw FailedPreconditionError("pss: " + std::string(who) + ": the optimizer's learning rate is a schedule (" +
                                      own.schedule()->class_name() +
                                      "), which gives the rate of each step; it cannot also be set (Keras refuses too)");
    (void)optimizer.with_learning_rate(rate);
}

/// @brief The learning rate of the built-in optimizers (a base of each): Keras' `learning_rate`, what the
/// Optimizer concept asks of it (`learning_rate()`, `with_learning_rate(rate)`), and its checks. Derived
/// names its Keras default `default_learning_rate`.
template <class Derived>
class OptimizerLearningRate {
public:
    /// @brief The rate: a constant, or a schedule of the training step (Keras' `optimizer.learning_rate`).
    [[nodiscard]] const LearningRate& learning_rate() const noexcept { return learning_rate_; }

    /// @brief This optimizer with the constant rate `rate`: how a ps applies a schedule's rate for one
    /// step, or a rate set by `set_learning_rate`.
    /// @throws InvalidArgumentError when `rate` is negative or not finite
    [[nodiscard]] Derived with_learning_rate(double rate) const {
        Derived at(static_cast<const Derived&>(*this));
        static_cast<OptimizerLearningRate&>(at).learning_rate_ = checked(rate);
        return at;
    }

    friend bool operator==(const OptimizerLearningRate&, const OptimizerLearningRate&) = default;

protected:
    OptimizerLearningRate() : learning_rate_(Derived::default_learning_rate) {}
    /// @throws InvalidArgumentError for a constant rate that is negative or not finite:
    /// `pss: SGD: learning_rate is -1, but it must be a finite number >= 0 ...` (a schedule checked its own)
    explicit OptimizerLearningRate(LearningRate rate) : learning_rate_(checked(std::move(rate))) {}

    /// @brief The rate of an apply: the constant. @throws FailedPreconditionError for a schedule (which
    /// needs the step: the ps applies through with_learning_rate)
    [[nodiscard]] double constant_learning_rate() const { return learning_rate_.constant(Derived::name()); }

private:
    static LearningRate checked(LearningRate rate) {
        if (!rate.is_schedule()) {
            const double r = rate(0);
            check_hyperparameter(r >= 0, Derived::name(), "learning_rate", r,
                                 "a finite number >= 0 (the step size; Keras' default is " +
                                     format_number(Derived::default_learning_rate) + ")");
        }
        return rate;
    }

    LearningRate learning_rate_;
};

}  // namespace detail

PSS_NAMESPACE_END
