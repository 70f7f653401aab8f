// tests/engines/resolve_task.cpp: prints what pss::AutoClusterResolver finds in this process's
// environment, so that a script can check what a launcher (Kubeflow's TFJob, Slurm, mpirun) gives a task:
//
//   source tf_config
//   task ps 1
//   rpc_layer
//   cluster {"chief":["pss-train-chief-0.pss.svc:2222"],"ps":[...],"worker":[...]}
//
// Run: TF_CONFIG='{"cluster": ..., "task": {"type": "ps", "index": 1}}' ./resolve_task
// (tests/engines/check_kubernetes.py runs it once per replica of a TFJob manifest). On a pss::Error it
// prints "error <message>" to stderr and exits 1.
#include <iostream>

#include <pss/cluster/auto.hpp>
#include <pss/cluster/cluster_spec_json.hpp>
#include <pss/errors.hpp>

int main() {
    try {
        const pss::AutoClusterResolver resolver;
        std::cout << "source " << resolver.source() << '\n'
                  << "task " << resolver.task_type() << ' ' << resolver.task_id() << '\n'
                  << "rpc_layer " << resolver.rpc_layer() << '\n'
                  << "cluster " << resolver.cluster_spec() << '\n';  // one line: JSON, jobs in name order
    } catch (const pss::Error& error) {
        std::cerr << "error " << error.what() << '\n';
        return 1;
    }
    return 0;
}
