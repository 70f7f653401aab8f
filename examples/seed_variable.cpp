// The second example of TensorFlow's ParameterServerStrategy documentation, in C++: a variable created
// in the strategy's scope lives on a parameter-server task, and prints as tf.Variable does.
#include <cstdint>
#include <iostream>

#include <pss/pss.hpp>

int main() {
    pss::ParameterServerStrategy<> strategy;
    auto scope = strategy.scope();
    pss::Variable weights(xt::xarray<std::int32_t>{1, 2, 3, 4, 5}, "weights");
    std::cout << weights << "\n";
}
