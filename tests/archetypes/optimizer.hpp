// archetypes/optimizer.hpp: OptimizerArchetype, the least type that meets pss::Optimizer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/concepts/optimizer.hpp>

PSS_NAMESPACE_BEGIN

namespace archetypes {

/// @brief Only what the Optimizer concept asks: copyable, a static name(), Slots<T>, const
/// make_slots / apply_dense / apply_sparse for float and double, and what a checkpoint reads: static
/// slot_names() and for_each_slot (here one counter, "applies", and no tensor), get_config(), and a
/// learning rate (1 unless made `with_learning_rate`). Not default constructible, not assignable, not
/// comparable; applies return void. Its update is `w -= rate * g` written as a plain loop, so the
/// conformance suite's semantic rules have something to check.
class OptimizerArchetype {
public:
    template <class T>
    struct Slots {
        std::int64_t applies = 0;
    };

    explicit OptimizerArchetype(int /*tag*/) {}
    OptimizerArchetype(const OptimizerArchetype&) = default;
    OptimizerArchetype& operator=(const OptimizerArchetype&) = delete;

    static std::string_view name() { return "OptimizerArchetype"; }

    static std::array<std::string_view, 0> slot_names() { return {}; }

    template <class SlotsType, class F>
    static void for_each_slot(SlotsType& slots, F&& f) {
        f(std::string_view("applies"), slots.applies);
    }

    nlohmann::json get_config() const { return nlohmann::json::object(); }

    const LearningRate& learning_rate() const { return rate_; }
    OptimizerArchetype with_learning_rate(double rate) const {
        OptimizerArchetype at(*this);
        at.rate_ = rate;
        return at;
    }

    template <class T>
    Slots<T> make_slots(const xt::xarray<T>& /*value*/) const {
        return {};
    }

    template <class T>
    void apply_dense(xt::xarray<T>& value, Slots<T>& slots, const xt::xarray<T>& grad) const {
        ++slots.applies;
        for (std::size_t i = 0; i < value.size(); ++i) value.data()[i] -= static_cast<T>(rate_(0)) * grad.data()[i];
    }

    template <class T>
    void apply_sparse(xt::xarray<T>& value, Slots<T>& slots, std::span<const std::int64_t> rows,
                      const xt::xarray<T>& grad_rows) const {
        ++slots.applies;
        const std::size_t width = rows.empty() ? 0 : grad_rows.size() / rows.size();
        for (std::size_t i = 0; i < rows.size(); ++i)
            for (std::size_t j = 0; j < width; ++j)
                value.data()[static_cast<std::size_t>(rows[i]) * width + j] -= static_cast<T>(rate_(0)) * grad_rows.data()[i * width + j];
    }

private:
    LearningRate rate_ = 1.0;
};

static_assert(Optimizer<OptimizerArchetype>);

}  // namespace archetypes

PSS_NAMESPACE_END
