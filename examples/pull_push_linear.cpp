// The low-level API: 2 ps and 2 workers of an embedded cluster train a linear regression by explicit pull,
// compute, push steps. The weights live on the ps tasks; each worker thread pulls them, computes the
// mean-squared-error gradient of its half of a batch, and pushes it; the ps applies SGD.
// Each round is synchronous (both workers pull, then push in turn), so the printed losses are exact.
#include <barrier>
#include <cstddef>
#include <iomanip>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xview.hpp>

#include <pss/pss.hpp>

namespace {

constexpr std::size_t num_examples = 4096;
constexpr std::size_t num_features = 8;
constexpr std::size_t num_workers = 2;
constexpr std::size_t batch_per_worker = 64;
constexpr int epochs = 8;

struct Data {
    xt::xarray<float> x;
    xt::xarray<float> y;
};

Data make_data() {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    Data d{xt::xarray<float>::from_shape({num_examples, num_features}), xt::xarray<float>::from_shape({num_examples})};
    const float true_w[num_features] = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -0.5f, 3.0f, -2.0f};
    for (std::size_t i = 0; i < num_examples; ++i) {
        float target = 0.7f;  // the true bias
        for (std::size_t j = 0; j < num_features; ++j) {
            d.x(i, j) = uniform(rng);
            target += true_w[j] * d.x(i, j);
        }
        d.y(i) = target + 0.05f * uniform(rng);
    }
    return d;
}

float mean_squared_error(const xt::xarray<float>& x, const xt::xarray<float>& y, const xt::xarray<float>& w,
                         const xt::xarray<float>& b) {
    xt::xarray<float> err = xt::sum(x * w, {1}) + b(0) - y;
    return xt::mean(err * err)();
}

}  // namespace

int main() {
    const Data data = make_data();
    using Strategy = pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                                  pss::LocalClusterResolver<2, num_workers>>;
    Strategy strategy({}, {}, pss::SGD(0.1));
    auto scope = strategy.scope();
    pss::Variable w(xt::xarray<float>(xt::zeros<float>({num_features})), "weights");
    pss::Variable b(xt::xarray<float>(xt::zeros<float>({1})), "bias");
    std::cout << "weights on " << w.device() << ", bias on " << b.device() << "\n";

    const std::size_t steps_per_epoch = num_examples / (num_workers * batch_per_worker);
    int epoch = 0;
    auto end_of_epoch = [&]() noexcept {
        ++epoch;
        const float loss = mean_squared_error(data.x, data.y, w.read<float>(), b.read<float>());
        std::cout << "epoch " << epoch << "/" << epochs << "  loss " << std::fixed << std::setprecision(6) << loss
                  << "\n";
    };
    std::barrier epoch_done(static_cast<std::ptrdiff_t>(num_workers), end_of_epoch);
    std::barrier step_sync(static_cast<std::ptrdiff_t>(num_workers));

    auto worker = [&](std::size_t index) {
        xt::xarray<float> weights, bias;  // pulled values; their memory is reused every step
        for (int e = 0; e < epochs; ++e) {
            for (std::size_t step = 0; step < steps_per_epoch; ++step) {
                w.read_into(weights);  // pull
                b.read_into(bias);
                step_sync.arrive_and_wait();  // every worker has pulled this round's weights

                const std::size_t first = (step * num_workers + index) * batch_per_worker;
                auto x = xt::view(data.x, xt::range(first, first + batch_per_worker), xt::all());
                auto y = xt::view(data.y, xt::range(first, first + batch_per_worker));
                xt::xarray<float> err = xt::sum(x * weights, {1}) + bias(0) - y;  // compute
                // d(mean err^2)/dw, halved: the two workers' pushes add up to the whole batch's gradient.
                const float scale = 1.0f / static_cast<float>(batch_per_worker * num_workers);
                xt::xarray<float> grad_w = 2.0f * scale * xt::sum(x * xt::view(err, xt::all(), xt::newaxis()), {0});
                xt::xarray<float> grad_b = xt::xarray<float>({2.0f * scale * xt::sum(err)()});

                for (std::size_t turn = 0; turn < num_workers; ++turn) {  // push in worker order: exact sums
                    if (turn == index) {
                        w.apply_gradient(std::move(grad_w));
                        b.apply_gradient(std::move(grad_b));
                    }
                    step_sync.arrive_and_wait();
                }
            }
            epoch_done.arrive_and_wait();
        }
    };
    std::vector<std::jthread> workers;
    for (std::size_t i = 0; i < num_workers; ++i) workers.emplace_back(worker, i);
    workers.clear();  // join

    std::cout << "learned weights " << pss::format_values(w.read_value()) << " bias " << pss::format_values(b.read_value())
              << "\n";
}
