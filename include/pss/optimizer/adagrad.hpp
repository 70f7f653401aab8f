// pss/optimizer/adagrad.hpp: Adagrad, per-element learning rates from the sum of squared gradients.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json_fwd.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>

#include <pss/config.hpp>
#include <pss/detail/optimizer_support.hpp>
#include <pss/dtype.hpp>
#include <pss/optimizer/schedules.hpp>

PSS_NAMESPACE_BEGIN

/// @brief An Optimizer: Adagrad, Keras' `Adagrad(learning_rate, initial_accumulator_value, epsilon)`.
///
/// With the accumulator `acc` (slot "accumulator", filled with initial_accumulator_value at first):
/// - `acc += g * g`
/// - `w -= learning_rate * g / (sqrt(acc) + epsilon)` (TensorFlow's ApplyAdagradV2, tf.keras 2).
/// @par Example
/// @code
/// pss::Adagrad opt(0.1, 0.0, 0.0);
/// xt::xarray<double> w{1.0}, g{2.0};
/// auto slots = opt.make_slots(w);
/// opt.apply_dense(w, slots, g);  // acc = 4, w = 1 - 0.1 * 2 / 2 = 0.9
/// @endcode
class Adagrad : public detail::OptimizerLearningRate<Adagrad> {
public:
    static constexpr double default_learning_rate = 0.001;  ///< Keras'

    template <FloatingElement T>
    struct Slots {
        xt::xarray<T> accumulator;  ///< the sum of squared gradients, shaped like the shard
        friend bool operator==(const Slots&, const Slots&) = default;
    };

    /// @brief Keras' defaults: learning rate 0.001, initial accumulator 0.1, epsilon 1e-7.
    Adagrad() = default;

    /// @throws InvalidArgumentError when an argument is negative or not finite:
    /// `pss: Adagrad: initial_accumulator_value is -1, but it must be a finite number >= 0 ...`
    explicit Adagrad(LearningRate learning_rate, double initial_accumulator_value = 0.1, double epsilon = 1e-7)
        : OptimizerLearningRate(std::move(learning_rate)), initial_accumulator_value_(initial_accumulator_value), epsilon_(epsilon) {
        detail::check_hyperparameter(initial_accumulator_value >= 0, name(), "initial_accumulator_value",
                                     initial_accumulator_value,
                                     "a finite number >= 0 (the accumulator's first value; Keras' default is 0.1)");
        detail::check_hyperparameter(epsilon >= 0, name(), "epsilon", epsilon,
                                     "a finite number >= 0 (added to the denominator; Keras' default is 1e-07)");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "Adagrad"; }
    [[nodiscard]] double initial_accumulator_value() const noexcept { return initial_accumulator_value_; }

    /// @brief One slot tensor, Keras' "accumulator".
    [[nodiscard]] static constexpr std::array<std::string_view, 1> slot_names() noexcept { return {"accumulator"}; }
    /// @brief Calls `f("accumulator", slots.accumulator)`.
    template <class SlotsType, class F>
    static void for_each_slot(SlotsType& slots, F&& f) {
        f(std::string_view("accumulator"), slots.accumulator);
    }
    /// @brief `{"name": "Adagrad", "learning_rate": 0.001, "initial_accumulator_value": 0.1, "epsilon": 1e-07}`.
    template <class Json = nlohmann::json>
    [[nodiscard]] Json get_config() const {
        return Json{{"name", std::string(name())},
                    {"learning_rate", learning_rate().get_config()},
                    {"initial_accumulator_value", initial_accumulator_value_},
                    {"epsilon", epsilon_}};
    }
    [[nodiscard]] double epsilon() const noexcept { return epsilon_; }

    /// @brief An accumulator shaped like `value`, filled with initial_accumulator_value.
    template <FloatingElement T>
    [[nodiscard]] Slots<T> make_slots(const xt::xarray<T>& value) const {
        return {xt::xarray<T>(value.shape(), static_cast<T>(initial_accumulator_value_))};
    }

    /// @throws InvalidArgumentError when `grad` does not have value's shape (the ps checks first).
    template <FloatingElement T>
    void apply_dense(xt::xarray<T>& value, Slots<T>& slots, const xt::xarray<T>& grad) const {
        detail::check_dense(name(), value, grad);
        detail::for_each_dense_block<T>(value.size(), [&](std::size_t at, std::size_t n) {
            update(value.data() + at, slots.accumulator.data() + at, grad.data() + at, n);
        });
    }

    /// @pre `rows` unique and in range, `grad_rows` of shape (rows.size(), value.shape[1:]...); or, given
    /// `grad_positions`, row `rows[i]`'s gradient is row `grad_positions[i]` of `grad_rows` (Optimizer).
    template <FloatingElement T>
    void apply_sparse(xt::xarray<T>& value, Slots<T>& slots, std::span<const std::int64_t> rows,
                      const xt::xarray<T>& grad_rows,
                      std::span<const std::size_t> grad_positions = {}) const {
        const std::size_t width = detail::check_sparse(name(), value, rows, grad_rows, grad_positions);
        detail::for_each_sparse_block<T>(rows, grad_positions, width, [&](std::size_t at, std::size_t g_at, std::size_t n) {
            update(value.data() + at, slots.accumulator.data() + at, grad_rows.data() + g_at, n);
        }, value.data(), slots.accumulator.data());
    }

    friend bool operator==(const Adagrad&, const Adagrad&) = default;

private:
    /// The update of one block, for dense and sparse applies alike.
    template <class T>
    PSS_DETAIL_FLATTEN void update(T* w_data, T* acc_data, const T* g_data, std::size_t n) const {
        auto w = detail::adapt_block(w_data, n);
        auto acc = detail::adapt_block(acc_data, n);
        const auto g = detail::adapt_block(g_data, n);
        const T lr = static_cast<T>(constant_learning_rate());
        const T eps = static_cast<T>(epsilon_);
        xt::noalias(acc) += g * g;
        xt::noalias(w) -= lr * g / (xt::sqrt(acc) + eps);
    }

    double initial_accumulator_value_ = 0.1;
    double epsilon_ = 1e-7;
};

PSS_NAMESPACE_END
