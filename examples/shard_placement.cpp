// A 1024 x 1024 float32 variable (4 MiB) split by MinSizePartitioner(256 KiB, max_shards = 2) into two
// shards of 512 rows, placed round-robin on the two ps tasks: of the embedded cluster when run alone,
// of separate ps processes under pss-launch --ps 2.
#include <iostream>

#include <pss/pss.hpp>

int main() {
    pss::ClusterStrategy<pss::MinSizePartitioner> strategy({}, pss::MinSizePartitioner(256 << 10, 2));
    if (strategy.is_chief()) {
        auto scope = strategy.scope();
        pss::Variable embedding(xt::xarray<float>(xt::zeros<float>({1024, 1024})), "embedding");
        std::cout << "variable " << embedding.name() << " shape=" << pss::format_shape(embedding.shape())
                  << " dtype=" << pss::dtype_name(embedding.dtype()) << " shards=" << embedding.num_shards() << "\n";
        for (const pss::Variable& shard : embedding.shards())
            std::cout << "  " << shard.name() << " shape=" << pss::format_shape(shard.shape()) << " on "
                      << shard.device() << "\n";
    }
    strategy.join();
}
