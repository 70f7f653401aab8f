// The README's example: a sharded embedding table on two parameter servers, a lookup, a sparse update.
#include <cstdint>
#include <iostream>
#include <vector>

#include <xtensor/xstrided_view.hpp>

#include <pss/pss.hpp>

int main() {
    // 2 ps and 2 workers in this process; tables split into shards of at least 16 bytes; Adagrad on the ps.
    using Strategy = pss::ParameterServerStrategy<pss::InProcessTransport, pss::MinSizePartitioner, pss::Adagrad>;
    Strategy strategy({}, pss::MinSizePartitioner(16, 2), pss::Adagrad(0.5));
    auto scope = strategy.scope();

    xt::xarray<float> rows = xt::reshape_view(xt::arange<float>(12), {6, 2});  // row i is [2i, 2i + 1]
    pss::Variable table(rows, "embedding");  // 48 bytes: 2 shards of 3 rows
    for (const auto& shard : table.shards()) std::cout << shard.name() << " on " << shard.device() << "\n";

    std::vector<std::int64_t> ids{4, 1, 4};  // rows from both shards, one repeated
    std::cout << "lookup: " << pss::format_values(pss::embedding_lookup(table, ids)) << "\n";

    // A sparse gradient: the rows of a repeated id are summed, then Adagrad updates only those rows.
    table.apply_sparse_gradient(ids, xt::xarray<float>(xt::ones<float>({3, 2})));
    std::cout << table << "\n";
}
