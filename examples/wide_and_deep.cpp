// A wide-and-deep click model (Cheng et al., 2016) with Keras' functional API: a linear ("wide") part
// over sparse ids, joined with a deep tower over their embeddings and two numeric features, trained
// synchronously by 2 workers on a cluster of 2 ps tasks, with metrics, a validation split and early
// stopping. Alone it runs the embedded cluster; under `pss-launch --ps 2 --workers 2` each task is a
// process, and the output is the same. The data is synthetic, from a fixed seed: a click depends on the
// user's and the item's ids, on a user-group x category interaction the deep part must find, and on the
// price.
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <random>

#include <pss/keras.hpp>

namespace {

constexpr std::size_t users = 500, items = 200, categories = 20;
constexpr std::size_t vocabulary = users + items + categories;  // one id space: users, then items, then categories

struct Data {
    xt::xarray<float> ids;      // (n, 3): user, item and category ids in the shared vocabulary
    xt::xarray<float> numeric;  // (n, 2): price and age, scaled to about [-1, 1]
    xt::xarray<float> clicks;   // (n, 1): 0 or 1
};

/// A fixed pseudo-random effect in [-1, 1) of a key, from a hash: the same on every machine.
double effect(std::uint64_t key) {
    key = (key ^ (key >> 31)) * 0x7fb5d329728ea185ULL;
    key = (key ^ (key >> 27)) * 0x81dadef4bc2dd44dULL;
    return static_cast<double>(key >> 40) / static_cast<double>(1ULL << 23) - 1.0;
}

Data make_data(std::mt19937_64& rng, std::size_t n) {
    auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };  // portable, unlike <random>'s
    Data d{xt::xarray<float>::from_shape({n, 3}), xt::xarray<float>::from_shape({n, 2}),
           xt::xarray<float>::from_shape({n, 1})};
    for (std::size_t i = 0; i < n; ++i) {
        const auto user = static_cast<std::uint64_t>(static_cast<double>(users) * uniform() * uniform());
        const auto item = static_cast<std::uint64_t>(static_cast<double>(items) * uniform());
        const std::uint64_t category = item % categories;
        const double price = 2 * uniform() - 1, age = 2 * uniform() - 1;
        d.ids(i, 0) = static_cast<float>(user);
        d.ids(i, 1) = static_cast<float>(users + item);
        d.ids(i, 2) = static_cast<float>(users + items + category);
        d.numeric(i, 0) = static_cast<float>(price);
        d.numeric(i, 1) = static_cast<float>(age);
        const double logit = effect(user) + effect(100000 + item) + 1.5 * effect(200000 + (user % 8) * 64 + category) -
                             price + (age > 0 ? 0.5 : -0.5) * effect(300000 + category);
        d.clicks(i, 0) = uniform() < 1 / (1 + std::exp(-logit)) ? 1.0f : 0.0f;
    }
    return d;
}

}  // namespace

int main() {
    pss::ClusterStrategy<pss::FixedShardsPartitioner, pss::Adagrad, pss::Synchronous> strategy(
        {}, pss::FixedShardsPartitioner(2), pss::Adagrad(0.3));
    if (!strategy.is_chief()) {
        strategy.join();  // a ps or worker process serves until the chief ends the cluster
        return 0;
    }

    // The model: a few lines, as in Keras.
    const pss::KerasTensor ids = pss::Input({3}, "ids"), numeric = pss::Input({2}, "numeric");
    const pss::KerasTensor wide = pss::GlobalAveragePooling1D()(pss::Embedding(vocabulary, 1)(ids));
    pss::KerasTensor deep = pss::Concatenate()({pss::Flatten()(pss::Embedding(vocabulary, 8)(ids)), numeric});
    deep = pss::Dense(8, "relu")(pss::Dense(32, "relu")(deep));
    const pss::KerasTensor click = pss::Dense(1, "sigmoid")(pss::Concatenate()({wide, deep}));
    pss::Model model(strategy, {ids, numeric}, click, /*seed=*/11, "wide_and_deep");
    model.compile("binary_crossentropy", {"auc", "accuracy"});  // the ps tasks apply the strategy's Adagrad
    model.summary();

    std::mt19937_64 rng(7);
    const Data train = make_data(rng, 16'000);
    const Data test = make_data(rng, 4'000);
    pss::EarlyStopping early({.monitor = "val_auc", .patience = 1, .restore_best_weights = true});
    const pss::History history = model.fit({train.ids, train.numeric}, train.clicks,
                                           {.batch_size = 128, .epochs = 6, .verbose = 1, .callbacks = {early},
                                            .validation_split = 0.1});
    std::cout << "epochs run: " << history.epoch.size() << "\n";

    const pss::Logs held_out = model.evaluate({test.ids, test.numeric}, test.clicks, {.batch_size = 1024});
    std::cout << std::fixed << std::setprecision(4) << "held-out loss " << held_out.at("loss") << ", AUC "
              << held_out.at("auc") << ", accuracy " << held_out.at("accuracy") << "\n";
    strategy.join();
}
