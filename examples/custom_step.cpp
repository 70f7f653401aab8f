// A custom training step with ClusterCoordinator, as TensorFlow's custom training loop under
// ParameterServerStrategy: the chief creates a linear model's variables on the ps tasks and, each round,
// schedules one registered step on each worker; a step pulls the weights for its round, computes the mean
// squared error and its gradient on the worker's own batch, and pushes the gradient. Synchronous: the ps
// applies a round once, from the mean of the workers' gradients, so the printed losses are exact and the
// same whether the program runs alone (the embedded cluster) or as every task under pss-launch.
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

#include <pss/pss.hpp>

namespace {

using Strategy = pss::ClusterStrategy<pss::NoPartitioner, pss::SGD, pss::Synchronous>;

constexpr std::size_t features = 4;
constexpr std::size_t batch = 64;  // per worker and round
constexpr std::uint64_t rounds = 8;

/// Worker `worker`'s batch of round `round`, the same in any process: x uniform in [-1, 1), and
/// y = x . (1, -2, 3, 0.5) + 0.25. Drawn from std::mt19937 by hand (its output is specified; the
/// standard distributions' are not).
std::pair<xt::xarray<float>, xt::xarray<float>> batch_of(int worker, std::uint64_t round) {
    std::mt19937 rng(static_cast<std::uint32_t>(round * 1000 + static_cast<std::uint64_t>(worker)));
    const float truth[features] = {1.0f, -2.0f, 3.0f, 0.5f};
    xt::xarray<float> x = xt::xarray<float>::from_shape({batch, features});
    xt::xarray<float> y = xt::xarray<float>::from_shape({batch});
    for (std::size_t i = 0; i < batch; ++i) {
        float target = 0.25f;
        for (std::size_t j = 0; j < features; ++j) {
            x(i, j) = static_cast<float>(rng() >> 8) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
            target += truth[j] * x(i, j);
        }
        y(i) = target;
    }
    return {x, y};
}

/// One step on a worker: pull (for round `round`, which waits for the round before it to be applied),
/// forward, loss, gradient, push. Returns the batch's loss, computed before the push.
double train_step(pss::Variable kernel, pss::Variable bias, std::uint64_t round) {
    const auto [x, y] = batch_of(pss::get_current_worker_index(), round);
    const xt::xarray<float> w = kernel.read<float>(round);
    const float b = bias.read<float>(round)(0);
    xt::xarray<float> grad_w = xt::zeros<float>({features});
    float grad_b = 0;
    double loss = 0;
    for (std::size_t i = 0; i < batch; ++i) {
        float prediction = b;
        for (std::size_t j = 0; j < features; ++j) prediction += x(i, j) * w(j);
        const float error = prediction - y(i);
        loss += static_cast<double>(error) * error;
        grad_b += 2.0f * error / batch;
        for (std::size_t j = 0; j < features; ++j) grad_w(j) += 2.0f * error * x(i, j) / batch;
    }
    (void)kernel.apply_gradient(grad_w, round);
    (void)bias.apply_gradient(xt::xarray<float>{grad_b}, round);
    return loss / batch;
}
// Registered: a worker process runs the step by this name.
const auto step = pss::register_function("custom_step.train_step", &train_step);

}  // namespace

int main() {
    Strategy strategy({}, {}, pss::SGD(0.2));  // alone: 2 ps tasks, 2 workers
    if (!strategy.is_chief()) {
        strategy.join();  // a ps or worker process serves until the chief ends the cluster
        return 0;
    }
    pss::ClusterCoordinator coordinator(strategy);
    pss::Variable kernel, bias;
    {
        auto scope = strategy.scope();
        kernel = pss::Variable(xt::xarray<float>(xt::zeros<float>({features})), "kernel");
        bias = pss::Variable(xt::xarray<float>{0.0f}, "bias");
    }
    std::cout << std::fixed << std::setprecision(6);
    for (std::uint64_t round = 1; round <= rounds; ++round) {
        std::vector<pss::RemoteValue<double>> losses;
        for (int w = 0; w < coordinator.num_workers(); ++w) losses.push_back(coordinator.schedule_on(w, step, kernel, bias, round));
        double sum = 0;
        for (auto& loss : losses) sum += loss.fetch();
        std::cout << "round " << round << ": loss " << sum / static_cast<double>(losses.size()) << "\n";
    }
    const xt::xarray<float> w = kernel.read<float>(rounds + 1);
    std::cout << "kernel [" << w(0) << ", " << w(1) << ", " << w(2) << ", " << w(3) << "], bias "
              << bias.read<float>(rounds + 1)(0) << " (the data's: [1, -2, 3, 0.5], 0.25)\n";
    strategy.join();
}
