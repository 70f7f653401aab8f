// pss/optimizer/momentum.hpp: Momentum, SGD with (optionally Nesterov) momentum, Keras' formula.
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
#include <xtensor/xnoalias.hpp>

#include <pss/config.hpp>
#include <pss/detail/optimizer_support.hpp>
#include <pss/dtype.hpp>
#include <pss/optimizer/schedules.hpp>

PSS_NAMESPACE_BEGIN

/// @brief An Optimizer: SGD with momentum, Keras' `SGD(learning_rate, momentum, nesterov)`.
///
/// Keras' formula, with the velocity `m` (slot "momentum", zeros at first):
/// - `m = momentum * m - learning_rate * g`
/// - `w += m`, or with Nesterov momentum `w += momentum * m - learning_rate * g` (with the new m).
/// @par Example
/// @code
/// pss::Momentum opt(0.1, 0.9);
/// xt::xarray<double> w{1.0}, g{1.0};
/// auto slots = opt.make_slots(w);
/// opt.apply_dense(w, slots, g);  // m = -0.1, w = 0.9
/// opt.apply_dense(w, slots, g);  // m = -0.19, w = 0.71
/// @endcode
class Momentum : public detail::OptimizerLearningRate<Momentum> {
public:
    static constexpr double default_learning_rate = 0.01;  ///< Keras'

    template <FloatingElement T>
    struct Slots {
        xt::xarray<T> momentum;  ///< the velocity m, shaped like the shard
        friend bool operator==(const Slots&, const Slots&) = default;
    };

    /// @brief Learning rate 0.01, momentum 0.9, no Nesterov.
    Momentum() = default;

    /// @throws InvalidArgumentError when `learning_rate` is negative or `momentum` is outside [0, 1]:
    /// `pss: Momentum: momentum is 1.5, but it must be in [0, 1] ...`
    explicit Momentum(LearningRate learning_rate, double momentum = 0.9, bool nesterov = false)
        : OptimizerLearningRate(std::move(learning_rate)), momentum_(momentum), nesterov_(nesterov) {
        detail::check_hyperparameter(momentum >= 0 && momentum <= 1, name(), "momentum", momentum,
                                     "in [0, 1] (the decay of the velocity; Keras' default is 0.9)");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "Momentum"; }
    [[nodiscard]] double momentum() const noexcept { return momentum_; }
    [[nodiscard]] bool nesterov() const noexcept { return nesterov_; }

    /// @brief One slot tensor, Keras 3's "momentum" (the velocity).
    [[nodiscard]] static constexpr std::array<std::string_view, 1> slot_names() noexcept { return {"momentum"}; }
    /// @brief Calls `f("momentum", slots.momentum)`.
    template <class SlotsType, class F>
    static void for_each_slot(SlotsType& slots, F&& f) {
        f(std::string_view("momentum"), slots.momentum);
    }
    /// @brief `{"name": "Momentum", "learning_rate": 0.01, "momentum": 0.9, "nesterov": false}`.
    template <class Json = nlohmann::json>
    [[nodiscard]] Json get_config() const {
        return Json{{"name", std::string(name())}, {"learning_rate", learning_rate().get_config()}, {"momentum", momentum_}, {"nesterov", nesterov_}};
    }

    /// @brief A zero velocity shaped like `value`.
    template <FloatingElement T>
    [[nodiscard]] Slots<T> make_slots(const xt::xarray<T>& value) const {
        return {xt::xarray<T>(value.shape(), T(0))};
    }

    /// @throws InvalidArgumentError when `grad` does not have value's shape (the ps checks first).
    template <FloatingElement T>
    void apply_dense(xt::xarray<T>& value, Slots<T>& slots, const xt::xarray<T>& grad) const {
        detail::check_dense(name(), value, grad);
        detail::for_each_dense_block<T>(value.size(), [&](std::size_t at, std::size_t n) {
            update(value.data() + at, slots.momentum.data() + at, grad.data() + at, n);
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
            update(value.data() + at, slots.momentum.data() + at, grad_rows.data() + g_at, n);
        }, value.data(), slots.momentum.data());
    }

    friend bool operator==(const Momentum&, const Momentum&) = default;

private:
    /// The update of one block, for dense and sparse applies alike.
    template <class T>
    PSS_DETAIL_FLATTEN void update(T* w_data, T* m_data, const T* g_data, std::size_t n) const {
        auto w = detail::adapt_block(w_data, n);
        auto m = detail::adapt_block(m_data, n);
        const auto g = detail::adapt_block(g_data, n);
        const T lr = static_cast<T>(constant_learning_rate());
        const T mu = static_cast<T>(momentum_);
        xt::noalias(m) = mu * m - lr * g;
        if (nesterov_)
            xt::noalias(w) += mu * m - lr * g;
        else
            xt::noalias(w) += m;
    }

    double momentum_ = 0.9;
    bool nesterov_ = false;
};

PSS_NAMESPACE_END
