// The main job (tools/demo.sh): a Keras-style classifier of handwritten digits trained by fit() on the
// embedded cluster of 2 parameter servers and 2 workers. Its variables live on the ps tasks; fit()
// schedules each batch as a closure on a worker (pull, forward and backward, push), asynchronously as
// TensorFlow does, with Keras' progress bar on a terminal.
//
// The data is real and no one here made it: the UCI handwritten digits (8x8 pixels, 0 to 16), split by
// tools/digits.py into DIR/train.csv and DIR/test.csv, which also trains the reference printed beside
// this model's held-out accuracy. Run it as tools/demo.sh does: demo_train DIR
#include <iomanip>
#include <iostream>
#include <string>

#include <pss/keras.hpp>

namespace {

/// Every row of one CSV file (a header line, the pixels, the label last) as one batch, pixels / 16.
pss::data::Batch read_all(const std::string& file) {
    auto batch = pss::data::Dataset::csv({file}).batch(1 << 20).next();
    if (!batch) throw pss::InvalidArgumentError("demo_train: " + file + " holds no rows");
    batch->x /= 16.0f;
    return std::move(*batch);
}

}  // namespace

int main(int argc, char** argv) try {
    if (argc != 2) {
        std::cerr << "usage: demo_train DIR (DIR/train.csv and DIR/test.csv, written by tools/digits.py; "
                     "tools/demo.sh runs both)\n";
        return 2;
    }
    const std::string dir = argv[1];
    const pss::data::Batch train = read_all(dir + "/train.csv");
    const pss::data::Batch test = read_all(dir + "/test.csv");

    using Strategy = pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::Adam>;
    Strategy strategy({}, {}, pss::Adam(0.01));  // 2 ps, 2 workers, in this process
    pss::Sequential model(strategy, {pss::Dense(64, "relu"), pss::Dense(10, "softmax")}, /*seed=*/1);
    model.compile(pss::SparseCategoricalCrossentropy(), {"accuracy"});  // the ps tasks apply the strategy's Adam

    // Keras' fit by name: each epoch ends with the held-out images' loss and accuracy (val_loss,
    // val_accuracy), evaluated on the chief; the training accuracy is computed by the workers.
    constexpr int epochs = 30;
    const auto history = model.fit(train.x, train.y, {.epochs = epochs, .validation_data = pss::ValidationData{test.x, test.y}});
    const double accuracy = history.history.at("val_accuracy").back();

    std::cout << "pss, Dense(64, relu) then Dense(10, softmax) by fit() on 2 ps and 2 workers, " << epochs
              << " epochs: loss " << std::fixed << std::setprecision(3) << history.loss.front() << " -> "
              << history.loss.back() << ", held-out accuracy " << std::setprecision(1)
              << 100.0 * accuracy << "%\n";
} catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
}
