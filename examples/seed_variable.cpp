// The second example of TensorFlow's ParameterServerStrategy documentation, in C++: a variable created
// in the strategy's scope lives on a parameter-server task, and prints as tf.Variable does. The same
// binary runs alone (embedded cluster) or as every task of a cluster.
#include <cstdint>
#include <iostream>

#include <pss/pss.hpp>

int main() {
    pss::ClusterStrategy<> strategy;
    if (strategy.is_chief()) {
        auto scope = strategy.scope();
        pss::Variable weights(xt::xarray<std::int32_t>{1, 2, 3, 4, 5}, "weights");
        std::cout << weights << "\n";
    }
    strategy.join();  // ps and workers serve here until the chief ends the cluster
}
