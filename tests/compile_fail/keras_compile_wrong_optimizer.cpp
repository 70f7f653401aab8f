// expect-error: the optimizer must be the strategy's Optimizer policy type
// In pss the parameter servers apply the strategy's optimizer: compiling a model with another optimizer
// type is refused at compile time (another instance of the same type is checked when it runs).
#include <pss/keras.hpp>

int main() {
    pss::ParameterServerStrategy<> strategy;  // SGD on the ps tasks
    pss::Sequential model(strategy, {pss::Dense(1)});
    model.compile(pss::Adam(0.001), "mse");
}
