// A DLRM-style click model (Naumov et al., 2019) with Keras' functional API: dense features through a
// bottom MLP, three categorical features each looked up in its own embedding table (the tables sharded
// over 2 ps tasks), all concatenated and passed through a top MLP. Trained synchronously by 2 workers;
// alone it runs the embedded cluster, under `pss-launch --ps 2 --workers 2` each task is a process, with
// the same output. (DLRM joins the vectors by their pairwise dot products; this model concatenates them.)
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <random>

#include <pss/keras.hpp>

namespace {

constexpr std::size_t dense_features = 4;
constexpr std::size_t table_rows[3] = {5000, 500, 50};  // user, ad, site

struct Data {
    xt::xarray<float> dense;                 // (n, 4)
    std::array<xt::xarray<float>, 3> ids;    // each (n, 1)
    xt::xarray<float> clicks;                // (n, 1)
};

/// A fixed pseudo-random effect in [-1, 1) of a key, from a hash: the same on every machine.
double effect(std::uint64_t key) {
    key = (key ^ (key >> 31)) * 0x7fb5d329728ea185ULL;
    key = (key ^ (key >> 27)) * 0x81dadef4bc2dd44dULL;
    return static_cast<double>(key >> 40) / static_cast<double>(1ULL << 23) - 1.0;
}

Data make_data(std::mt19937_64& rng, std::size_t n) {
    auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };  // portable, unlike <random>'s
    Data d{xt::xarray<float>::from_shape({n, dense_features}), {}, xt::xarray<float>::from_shape({n, 1})};
    for (auto& t : d.ids) t = xt::xarray<float>::from_shape({n, 1});
    for (std::size_t i = 0; i < n; ++i) {
        double logit = -0.3;
        for (std::size_t f = 0; f < dense_features; ++f) {
            const double v = 2 * uniform() - 1;
            d.dense(i, f) = static_cast<float>(v);
            logit += (f % 2 == 0 ? 0.8 : -0.6) * v;
        }
        for (std::size_t t = 0; t < 3; ++t) {
            const double u = uniform();
            const auto id = static_cast<std::uint64_t>(static_cast<double>(table_rows[t]) * u * u);  // skewed
            d.ids[t](i, 0) = static_cast<float>(id);
            logit += effect(t * 1000003 + id);
        }
        d.clicks(i, 0) = uniform() < 1 / (1 + std::exp(-logit)) ? 1.0f : 0.0f;
    }
    return d;
}

}  // namespace

int main() {
    pss::ClusterStrategy<pss::FixedShardsPartitioner, pss::Adagrad, pss::Synchronous> strategy(
        {}, pss::FixedShardsPartitioner(2), pss::Adagrad(0.1));
    if (!strategy.is_chief()) {
        strategy.join();  // a ps or worker process serves until the chief ends the cluster
        return 0;
    }

    const pss::KerasTensor dense = pss::Input({dense_features}, "dense");
    std::vector<pss::KerasTensor> inputs{dense}, joined{pss::Dense(4, "relu")(pss::Dense(16, "relu")(dense))};
    for (const char* name : {"user", "ad", "site"}) {
        const pss::KerasTensor id = pss::Input({1}, name);
        inputs.push_back(id);
        joined.push_back(pss::Flatten()(pss::Embedding(table_rows[inputs.size() - 2], 4)(id)));
    }
    const pss::KerasTensor top = pss::Dense(16, "relu")(pss::Concatenate()(joined));
    pss::Model model(strategy, inputs, pss::Dense(1, "sigmoid")(top), /*seed=*/3, "dlrm");
    model.compile("binary_crossentropy", {"auc"});
    for (const auto& layer : model.layers())
        if (layer->class_name() == "Embedding") {
            const pss::Variable table = layer->weights().front();
            std::cout << table.name() << " " << pss::format_shape(table.shape()) << " in " << table.num_shards()
                      << " shards on ps";
            for (int task : table.shard_tasks()) std::cout << " " << task;
            std::cout << "\n";
        }

    std::mt19937_64 rng(5);
    const Data train = make_data(rng, 12'000);
    const Data test = make_data(rng, 3'000);
    const pss::History history = model.fit({train.dense, train.ids[0], train.ids[1], train.ids[2]}, train.clicks,
                                           {.batch_size = 128, .epochs = 3, .verbose = 1});
    const pss::Logs held_out = model.evaluate({test.dense, test.ids[0], test.ids[1], test.ids[2]}, test.clicks,
                                              {.batch_size = 1024});
    std::cout << std::fixed << std::setprecision(4) << "after " << history.epoch.size() << " epochs: held-out loss "
              << held_out.at("loss") << ", AUC " << held_out.at("auc") << "\n";
    strategy.join();
}
