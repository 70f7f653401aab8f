// The main job (tools/demo.sh): a Keras-style model trained on the embedded cluster of 2 parameter
// servers and 2 workers. Its variables live on the ps tasks; fit() schedules each batch as a closure on
// a worker (pull, forward and backward, push), asynchronously as TensorFlow does, with Keras' progress
// bar on a terminal. The data: a noisy two-moons-like classification problem, generated from a seed.
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <random>

#include <pss/keras.hpp>

int main() {
    constexpr std::size_t examples = 20'000;
    std::mt19937_64 rng(1);
    auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
    xt::xarray<float> x = xt::xarray<float>::from_shape({examples, 2});
    xt::xarray<float> y = xt::xarray<float>::from_shape({examples, 1});
    for (std::size_t i = 0; i < examples; ++i) {
        const bool upper = i % 2 == 0;
        const double angle = 3.14159265358979 * uniform();
        x(i, 0) = static_cast<float>((upper ? std::cos(angle) : 1.0 - std::cos(angle)) + 0.9 * (uniform() - 0.5));
        x(i, 1) = static_cast<float>((upper ? std::sin(angle) : 0.5 - std::sin(angle)) + 0.9 * (uniform() - 0.5));
        y(i, 0) = upper ? 1.0f : 0.0f;
    }

    using Strategy = pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::Adam>;
    Strategy strategy({}, {}, pss::Adam(0.01));  // 2 ps, 2 workers, in this process
    pss::Sequential model(strategy, {pss::Dense(32, "relu"), pss::Dense(32, "relu"), pss::Dense(1, "sigmoid")});
    model.compile(pss::Adam(0.01), pss::BinaryCrossentropy());

    auto history = model.fit(x, y, /*epochs=*/10, /*batch_size=*/64);

    const auto predictions = model.predict(x);
    std::size_t correct = 0;
    for (std::size_t i = 0; i < examples; ++i) correct += (predictions(i, 0) > 0.5f) == (y(i, 0) > 0.5f);
    std::cout << "loss " << std::fixed << std::setprecision(4) << history.loss.front() << " -> " << history.loss.back()
              << ", accuracy " << std::setprecision(1) << 100.0 * static_cast<double>(correct) / examples << "%\n";
}
