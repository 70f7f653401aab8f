// expect-error: optimizer_has_for_each_slot
// An optimizer written before checkpoints (no for_each_slot) is not an Optimizer: a checkpoint could not
// save or restore its slots, and the diagnostic names that missing requirement.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include <nlohmann/json.hpp>

#include "optimizer_parts.hpp"

struct SlotsHiddenSGD : DenseSGDPart, LearningRatePart<SlotsHiddenSGD> {
    static std::string_view name() { return "SlotsHiddenSGD"; }
    static std::array<std::string_view, 0> slot_names() { return {}; }
    nlohmann::json get_config() const { return nlohmann::json::object(); }
    template <class T>
    void apply_sparse(xt::xarray<T>&, Slots<T>&, std::span<const std::int64_t>, const xt::xarray<T>&) const {}
};

ParameterServerLike<SlotsHiddenSGD> server{};

int main() {}
