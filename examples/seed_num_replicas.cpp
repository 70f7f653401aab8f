// The first example of TensorFlow's ParameterServerStrategy documentation, in C++: create the strategy
// and print how many replicas compute one step in lockstep. Alone it runs the embedded cluster (2 ps,
// 2 workers); under pss-launch, TF_CONFIG, Slurm or mpirun every task runs this same binary.
#include <iostream>

#include <pss/pss.hpp>

int main() {
    pss::ClusterStrategy<> strategy;
    if (strategy.is_chief()) std::cout << strategy.num_replicas_in_sync() << "\n";
    strategy.join();  // ps and workers serve here until the chief ends the cluster
}
