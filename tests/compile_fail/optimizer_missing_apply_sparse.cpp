// expect-error: optimizer_has_apply_sparse
// An optimizer that only applies dense gradients is not an Optimizer: a ps must also apply sparse
// gradient rows (embeddings), and the diagnostic names that missing requirement.
#include <string_view>

#include <xtensor/xarray.hpp>

#include <pss/concepts/optimizer.hpp>

struct DenseOnlySGD {
    template <class T>
    struct Slots {};
    static std::string_view name() { return "DenseOnlySGD"; }
    template <class T>
    Slots<T> make_slots(const xt::xarray<T>&) const {
        return {};
    }
    template <class T>
    void apply_dense(xt::xarray<T>& value, Slots<T>&, const xt::xarray<T>& grad) const {
        value -= grad;
    }
};

template <pss::Optimizer OptimizerPolicy>
struct ParameterServerLike {
    OptimizerPolicy optimizer;
};

ParameterServerLike<DenseOnlySGD> server{};

int main() {}
