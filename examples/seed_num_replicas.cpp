// The first example of TensorFlow's ParameterServerStrategy documentation, in C++: create the strategy
// (an embedded cluster of 2 ps and 2 workers) and print how many replicas compute one step in lockstep.
#include <iostream>

#include <pss/pss.hpp>

int main() {
    pss::ParameterServerStrategy<> strategy;
    std::cout << strategy.num_replicas_in_sync() << "\n";
}
