// The third example of TensorFlow's ParameterServerStrategy documentation, in C++: a Keras model built
// in the strategy's scope (its variables on the ps tasks), compiled with SGD and mean squared error,
// and fitted for 5 epochs by steps scheduled on the workers.
#include <iomanip>
#include <iostream>

#include <pss/keras.hpp>

int main() {
    pss::ClusterStrategy<> strategy;  // alone: 2 ps tasks, 2 workers; SGD(learning_rate=0.01)
    if (!strategy.is_chief()) {
        strategy.join();  // under a launcher, a ps or worker process serves until the chief ends the cluster
        return 0;
    }

    pss::Sequential model(strategy, {pss::Dense(1)}, /*seed=*/0);
    model.build({1});  // input_shape (1,): the kernel (1, 1) and the bias (1,) are created on the ps tasks
    model.compile(pss::SGD(), pss::MeanSquaredError());

    xt::xarray<float> x = {1, 2, 3, 4};  // shape (4, 1): one feature per example
    x.reshape({4, 1});
    xt::xarray<float> y = {2, 4, 6, 8};
    y.reshape({4, 1});
    // 4 examples, batch_size 32: one step per epoch. Printed to a terminal, each epoch shows Keras'
    // progress bar; to a file or a pipe, the plain lines below (no timings).
    auto history = model.fit(x, y, /*epochs=*/5, /*batch_size=*/32);

    std::cout << "final loss: " << std::fixed << std::setprecision(6) << history.loss.back() << "\n";
    strategy.join();
}
