// expect-error: cluster_resolver_has_task_id
// A task_id() that returns a string ("1") is not a ClusterResolver: the diagnostic names the requirement.
#include <string>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/concepts/cluster_resolver.hpp>

namespace {

struct ResolverWithStringTaskId {
    [[nodiscard]] pss::ClusterSpec cluster_spec() const { return pss::ClusterSpec{{"ps", {"ps0:2222"}}, {"worker", {"w0:2222"}}}; }
    [[nodiscard]] std::string task_type() const { return "worker"; }
    [[nodiscard]] std::string task_id() const { return "0"; }
    [[nodiscard]] std::string rpc_layer() const { return ""; }
};

template <pss::ClusterResolver ClusterResolverPolicy>
int task_count(const ClusterResolverPolicy& resolver) {
    return static_cast<pss::ClusterSpec>(resolver.cluster_spec()).num_tasks("worker");
}

}  // namespace

int main() { return task_count(ResolverWithStringTaskId{}); }
