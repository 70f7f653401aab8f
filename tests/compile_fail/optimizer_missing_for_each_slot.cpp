// expect-error: optimizer_has_for_each_slot
// An optimizer written before checkpoints (no for_each_slot) is not an Optimizer: a checkpoint could not
// save or restore its slots, and the diagnostic names that missing requirement.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include <pss/concepts/optimizer.hpp>

struct SlotsHiddenSGD {
    template <class T>
    struct Slots {};
    static std::string_view name() { return "SlotsHiddenSGD"; }
    static std::array<std::string_view, 0> slot_names() { return {}; }
    nlohmann::json get_config() const { return nlohmann::json::object(); }
    template <class T>
    Slots<T> make_slots(const xt::xarray<T>&) const {
        return {};
    }
    template <class T>
    void apply_dense(xt::xarray<T>& value, Slots<T>&, const xt::xarray<T>& grad) const {
        value -= grad;
    }
    template <class T>
    void apply_sparse(xt::xarray<T>&, Slots<T>&, std::span<const std::int64_t>, const xt::xarray<T>&) const {}
};

template <pss::Optimizer OptimizerPolicy>
struct ParameterServerLike {
    OptimizerPolicy optimizer;
};

ParameterServerLike<SlotsHiddenSGD> server{};

int main() {}
