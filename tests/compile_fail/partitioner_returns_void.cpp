// expect-error: partitioner_returns_shard_count
// A partitioner whose call answers nothing (void) is not a Partitioner: the diagnostic names the
// missing requirement, a shard count convertible to std::size_t.
#include <cstddef>
#include <span>

#include <pss/concepts/partitioner.hpp>
#include <pss/dtype.hpp>

struct LoggingPartitioner {
    void operator()(std::span<const std::size_t>, pss::DType) const {}
};

template <pss::Partitioner PartitionerPolicy>
std::size_t shard_count(const PartitionerPolicy& partitioner, std::span<const std::size_t> shape) {
    return partitioner(shape, pss::DType::float32);
}

int main() {
    const std::size_t shape[] = {4, 4};
    return static_cast<int>(shard_count(LoggingPartitioner{}, shape));
}
