// pss/optimizer/adam.hpp: Adam, adaptive moment estimation, Keras 3's formula with a per-shard step count.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json_fwd.hpp>
#include <xsimd/xsimd.hpp>
#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/detail/optimizer_support.hpp>
#include <pss/dtype.hpp>
#include <pss/optimizer/schedules.hpp>

PSS_NAMESPACE_BEGIN

/// @brief An Optimizer: Adam, Keras' `Adam(learning_rate, beta_1, beta_2, epsilon)`.
///
/// Keras 3's formula, with the first and second moments `m`, `v` (zeros at first) and the shard's
/// step count `iterations` (0 at first):
/// - `t = iterations + 1`, `alpha = learning_rate * sqrt(1 - beta_2^t) / (1 - beta_1^t)`
/// - `m += (g - m) * (1 - beta_1)`
/// - `v += (g * g - v) * (1 - beta_2)`
/// - `w -= alpha * m / (sqrt(v) + epsilon)`, then `iterations = t`.
///
/// Three fused statements over each cache-sized block (xtensor writes one output per expression).
/// The step count is per shard and counts dense and sparse applies; a sparse apply updates only its
/// rows' m and v (LazyAdam), with the shard's t for the bias correction.
/// @par Example
/// @code
/// pss::Adam adam(0.001);
/// xt::xarray<float> w{1.0f}, g{0.5f};
/// auto slots = adam.make_slots(w);
/// adam.apply_dense(w, slots, g);  // w = 1 - 0.001 * 0.5 / (0.5 + 1e-7 / sqrt(0.001)) ~ 0.999
/// @endcode
class Adam : public detail::OptimizerLearningRate<Adam> {
public:
    static constexpr double default_learning_rate = 0.001;  ///< Keras'

    template <FloatingElement T>
    struct Slots {
        xt::xarray<T> m;               ///< first-moment estimate (Keras' "momentum"), shaped like the shard
        xt::xarray<T> v;               ///< second-moment estimate (Keras' "velocity"), shaped like the shard
        std::int64_t iterations = 0;   ///< applies so far to this shard, dense and sparse
        friend bool operator==(const Slots&, const Slots&) = default;
    };

    /// @brief Keras' defaults: learning rate 0.001, beta_1 0.9, beta_2 0.999, epsilon 1e-7.
    Adam() = default;

    /// @throws InvalidArgumentError when `learning_rate` or `epsilon` is negative or a beta is outside
    /// [0, 1): `pss: Adam: beta_1 is 1, but it must be in [0, 1) ...`
    explicit Adam(LearningRate learning_rate, double beta_1 = 0.9, double beta_2 = 0.999, double epsilon = 1e-7)
        : OptimizerLearningRate(std::move(learning_rate)), beta_1_(beta_1), beta_2_(beta_2), epsilon_(epsilon) {
        detail::check_hyperparameter(beta_1 >= 0 && beta_1 < 1, name(), "beta_1", beta_1,
                                     "in [0, 1) (the decay of the first-moment estimate; Keras' default is 0.9)");
        detail::check_hyperparameter(beta_2 >= 0 && beta_2 < 1, name(), "beta_2", beta_2,
                                     "in [0, 1) (the decay of the second-moment estimate; Keras' default is 0.999)");
        detail::check_hyperparameter(epsilon >= 0, name(), "epsilon", epsilon,
                                     "a finite number >= 0 (added to the denominator; Keras' default is 1e-07)");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "Adam"; }
    [[nodiscard]] double beta_1() const noexcept { return beta_1_; }
    [[nodiscard]] double beta_2() const noexcept { return beta_2_; }
    [[nodiscard]] double epsilon() const noexcept { return epsilon_; }

    /// @brief Keras 3's names of m and v: "momentum" and "velocity".
    [[nodiscard]] static constexpr std::array<std::string_view, 2> slot_names() noexcept {
        return {"momentum", "velocity"};
    }
    /// @brief Calls `f("momentum", slots.m)`, `f("velocity", slots.v)`, then `f("iterations", slots.iterations)`.
    template <class SlotsType, class F>
    static void for_each_slot(SlotsType& slots, F&& f) {
        f(std::string_view("momentum"), slots.m);
        f(std::string_view("velocity"), slots.v);
        f(std::string_view("iterations"), slots.iterations);
    }
    /// @brief `{"name": "Adam", "learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-07}`.
    template <class Json = nlohmann::json>
    [[nodiscard]] Json get_config() const {
        return Json{{"name", std::string(name())}, {"learning_rate", learning_rate().get_config()}, {"beta_1", beta_1_}, {"beta_2", beta_2_},
                    {"epsilon", epsilon_}};
    }

    /// @brief Zero moments shaped like `value`, and a step count of 0.
    template <FloatingElement T>
    [[nodiscard]] Slots<T> make_slots(const xt::xarray<T>& value) const {
        return {xt::xarray<T>(value.shape(), T(0)), xt::xarray<T>(value.shape(), T(0)), 0};
    }

    /// @throws InvalidArgumentError when `grad` does not have value's shape (the ps checks first).
    template <FloatingElement T>
    void apply_dense(xt::xarray<T>& value, Slots<T>& slots, const xt::xarray<T>& grad) const {
        detail::check_dense(name(), value, grad);
        const Step<T> step = next_step<T>(slots);
        detail::for_each_dense_block<T>(value.size(), [&](std::size_t at, std::size_t n) {
            update(value.data() + at, slots.m.data() + at, slots.v.data() + at, grad.data() + at, n, step);
        });
    }

    /// @pre `rows` unique and in range, `grad_rows` of shape (rows.size(), value.shape[1:]...); or, given
    /// `grad_positions`, row `rows[i]`'s gradient is row `grad_positions[i]` of `grad_rows` (Optimizer).
    template <FloatingElement T>
    void apply_sparse(xt::xarray<T>& value, Slots<T>& slots, std::span<const std::int64_t> rows,
                      const xt::xarray<T>& grad_rows,
                      std::span<const std::size_t> grad_positions = {}) const {
        const std::size_t width = detail::check_sparse(name(), value, rows, grad_rows, grad_positions);
        const Step<T> step = next_step<T>(slots);
        detail::for_each_sparse_block<T>(rows, grad_positions, width, [&](std::size_t at, std::size_t g_at, std::size_t n) {
            update(value.data() + at, slots.m.data() + at, slots.v.data() + at, grad_rows.data() + g_at, n, step);
        }, value.data(), slots.m.data(), slots.v.data());
    }

    friend bool operator==(const Adam&, const Adam&) = default;

private:
    /// The constants of one apply, in the shard's element type.
    template <class T>
    struct Step {
        T alpha, one_minus_beta_1, one_minus_beta_2, epsilon;
    };

    /// Counts the apply and computes its bias-corrected step size (in double, then rounded to T).
    template <class T>
    [[nodiscard]] Step<T> next_step(Slots<T>& slots) const {
        const double t = static_cast<double>(++slots.iterations);
        const double alpha = constant_learning_rate() * std::sqrt(1 - std::pow(beta_2_, t)) / (1 - std::pow(beta_1_, t));
        return {static_cast<T>(alpha), static_cast<T>(1 - beta_1_), static_cast<T>(1 - beta_2_),
                static_cast<T>(epsilon_)};
    }

    /// The update of one block, for dense and sparse applies alike: one pass, m, v and w of each SIMD
    /// batch while it is in registers (as three xtensor statements it read the block three times, 0.80
    /// to 0.87x a plain loop). xsimd's sqrt, since GCC vectorizes std::sqrt only without errno
    /// (-fno-math-errno), which a header cannot ask of its includer. The same operations in the same
    /// order as the statements were, so the same bits.
    template <class T>
    PSS_DETAIL_FLATTEN static void update(T* w, T* m, T* v, const T* g, std::size_t n, const Step<T>& s) {
        using Batch = xsimd::batch<T>;
        const Batch c1(s.one_minus_beta_1), c2(s.one_minus_beta_2), alpha(s.alpha), epsilon(s.epsilon);
        std::size_t i = 0;
        for (; i + Batch::size <= n; i += Batch::size) {
            const Batch gi = Batch::load_unaligned(g + i);
            Batch mi = Batch::load_unaligned(m + i), vi = Batch::load_unaligned(v + i);
            mi += (gi - mi) * c1;
            vi += (gi * gi - vi) * c2;
            const Batch wi = Batch::load_unaligned(w + i) - alpha * mi / (xsimd::sqrt(vi) + epsilon);
            mi.store_unaligned(m + i);
            vi.store_unaligned(v + i);
            wi.store_unaligned(w + i);
        }
        for (; i < n; ++i) {
            m[i] += (g[i] - m[i]) * s.one_minus_beta_1;
            v[i] += (g[i] * g[i] - v[i]) * s.one_minus_beta_2;
            w[i] -= s.alpha * m[i] / (std::sqrt(v[i]) + s.epsilon);
        }
    }

    double beta_1_ = 0.9;
    double beta_2_ = 0.999;
    double epsilon_ = 1e-7;
};

PSS_NAMESPACE_END
