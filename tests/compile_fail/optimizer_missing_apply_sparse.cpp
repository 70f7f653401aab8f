// expect-error: optimizer_has_apply_sparse
// An optimizer that only applies dense gradients is not an Optimizer: a ps must also apply sparse
// gradient rows (embeddings), and the diagnostic names that missing requirement.
#include <string_view>

#include "optimizer_parts.hpp"

struct DenseOnlySGD : DenseSGDPart, LearningRatePart<DenseOnlySGD> {
    static std::string_view name() { return "DenseOnlySGD"; }
};

ParameterServerLike<DenseOnlySGD> server{};

int main() {}
