// pss/optimizer/sgd.hpp: SGD, plain stochastic gradient descent (w -= lr * g).
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

/// @brief An Optimizer: stochastic gradient descent without momentum, Keras' `SGD(learning_rate)`.
///
/// `w -= learning_rate * g`. No slots. For momentum use pss::Momentum.
/// @par Example
/// @code
/// pss::SGD sgd(0.1);
/// xt::xarray<float> w{1.0f}, g{0.5f};
/// auto slots = sgd.make_slots(w);
/// sgd.apply_dense(w, slots, g);  // w is {0.95}
/// @endcode
class SGD : public detail::OptimizerLearningRate<SGD> {
public:
    static constexpr double default_learning_rate = 0.01;  ///< Keras'

    /// @brief No state: SGD keeps nothing beside the shard.
    template <FloatingElement T>
    struct Slots {
        friend bool operator==(const Slots&, const Slots&) = default;
    };

    /// @brief Learning rate 0.01, Keras' default.
    SGD() = default;

    /// @param learning_rate a constant, or a schedule: `SGD(pss::ExponentialDecay(0.1, 1000, 0.96))`
    /// @throws InvalidArgumentError when `learning_rate` is negative or not finite:
    /// `pss: SGD: learning_rate is -1, but it must be a finite number >= 0 ...`
    explicit SGD(LearningRate learning_rate) : OptimizerLearningRate(std::move(learning_rate)) {}

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "SGD"; }

    /// @brief No slot tensors: a checkpoint saves only the variables.
    [[nodiscard]] static constexpr std::array<std::string_view, 0> slot_names() noexcept { return {}; }
    /// @brief Nothing to visit.
    template <class SlotsType, class F>
    static void for_each_slot(SlotsType& /*slots*/, F&& /*f*/) {}
    /// @brief `{"name": "SGD", "learning_rate": 0.01}` (Keras' get_config; a template so that this
    /// header needs only nlohmann's declaration).
    template <class Json = nlohmann::json>
    [[nodiscard]] Json get_config() const {
        return Json{{"name", std::string(name())}, {"learning_rate", learning_rate().get_config()}};
    }

    template <FloatingElement T>
    [[nodiscard]] Slots<T> make_slots(const xt::xarray<T>& /*value*/) const {
        return {};
    }

    /// @throws InvalidArgumentError when `grad` does not have value's shape (the ps checks first).
    template <FloatingElement T>
    void apply_dense(xt::xarray<T>& value, Slots<T>& /*slots*/, const xt::xarray<T>& grad) const {
        detail::check_dense(name(), value, grad);
        const T lr = static_cast<T>(constant_learning_rate());
        detail::for_each_dense_block<T>(value.size(), [&](std::size_t at, std::size_t n) {
            update(value.data() + at, grad.data() + at, n, lr);
        });
    }

    /// @pre `rows` unique and in range, `grad_rows` of shape (rows.size(), value.shape[1:]...); or, given
    /// `grad_positions`, row `rows[i]`'s gradient is row `grad_positions[i]` of `grad_rows` (Optimizer).
    template <FloatingElement T>
    void apply_sparse(xt::xarray<T>& value, Slots<T>& /*slots*/, std::span<const std::int64_t> rows,
                      const xt::xarray<T>& grad_rows,
                      std::span<const std::size_t> grad_positions = {}) const {
        const std::size_t width = detail::check_sparse(name(), value, rows, grad_rows, grad_positions);
        const T lr = static_cast<T>(constant_learning_rate());
        detail::for_each_sparse_block<T>(rows, grad_positions, width, [&](std::size_t at, std::size_t g_at, std::size_t n) {
            update(value.data() + at, grad_rows.data() + g_at, n, lr);
        }, value.data());
    }

    friend bool operator==(const SGD&, const SGD&) = default;

private:
    /// The update of one block, for dense and sparse applies alike.
    template <class T>
    PSS_DETAIL_FLATTEN static void update(T* w_data, const T* g_data, std::size_t n, T lr) {
        auto w = detail::adapt_block(w_data, n);
        const auto g = detail::adapt_block(g_data, n);
        xt::noalias(w) -= lr * g;
    }

};

PSS_NAMESPACE_END
