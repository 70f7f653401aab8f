// expect-error: optimizer_has_learning_rate
// An optimizer written before learning-rate schedules (no learning_rate(), no with_learning_rate) is not
// an Optimizer: a ps could not apply a schedule's rate for a step, and the diagnostic names that
// missing requirement.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include <nlohmann/json.hpp>

#include "optimizer_parts.hpp"

struct FixedRateSGD : DenseSGDPart {
    static std::string_view name() { return "FixedRateSGD"; }
    static std::array<std::string_view, 0> slot_names() { return {}; }
    template <class SlotsType, class F>
    static void for_each_slot(SlotsType&, F&&) {}
    nlohmann::json get_config() const { return nlohmann::json::object(); }
    template <class T>
    void apply_sparse(xt::xarray<T>&, Slots<T>&, std::span<const std::int64_t>, const xt::xarray<T>&) const {}
};

ParameterServerLike<FixedRateSGD> server{};

int main() {}
