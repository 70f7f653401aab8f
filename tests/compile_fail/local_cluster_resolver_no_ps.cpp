// expect-error: pss: LocalClusterResolver needs at least one ps task
// An in-process cluster without parameter servers is rejected when the type is instantiated.
#include <pss/cluster/local.hpp>

int main() {
    const pss::LocalClusterResolver<0, 2> resolver;
    return resolver.task_id();
}
