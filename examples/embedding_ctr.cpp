// Click-through-rate prediction on synthetic data: a 1,000,000 x 32 float32 embedding (128 MB) split by
// MinSizePartitioner(256 KiB, max_shards = 4) into 4 shards on 2 ps tasks, mean-pooled, under a small dense
// tower, trained with Adagrad by 2 workers, synchronously. Alone it runs the embedded cluster; under
// `pss-launch --ps 2 --workers 2` each task is a process, and the output (final weights included) is the same. Each step pulls only the embedding rows its batch looks up and
// pushes their gradients as sparse rows. The data is generated from a fixed seed: ids follow a skewed
// (power-law) distribution, as real categorical features do, and each id has a hidden effect on clicks.
// At the end, the model's AUC on held-out examples stands beside the AUC of the generator's own click
// probabilities: how much of what can be learned was.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <random>
#include <vector>

#include <pss/keras.hpp>

namespace {

constexpr std::size_t vocabulary = 1'000'000;
constexpr std::size_t fields = 4;  // categorical features per example (user, ad, site, device)
constexpr std::size_t examples = 40'000;
constexpr std::size_t held_out = 10'000;  // drawn after the training examples, from the same generator

struct Data {
    xt::xarray<float> ids;            // (examples, fields): ids as floats, exact below 2^24
    xt::xarray<float> clicks;         // (examples, 1): 0 or 1
    std::vector<double> probability;  // the generator's own click probability of each example
};

/// The hidden effect of an id on the click probability, from a hash: the same on every machine.
double effect(std::uint64_t id) {
    id = (id ^ (id >> 31)) * 0x7fb5d329728ea185ULL;
    id = (id ^ (id >> 27)) * 0x81dadef4bc2dd44dULL;
    return static_cast<double>(id >> 40) / static_cast<double>(1ULL << 24) * 4.0 - 2.0;  // in [-2, 2)
}

Data make_data(std::mt19937_64& rng, std::size_t n) {
    auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };  // portable, unlike <random>'s
    Data d{xt::xarray<float>::from_shape({n, fields}), xt::xarray<float>::from_shape({n, 1}), std::vector<double>(n)};
    for (std::size_t i = 0; i < n; ++i) {
        double logit = -0.5;
        for (std::size_t f = 0; f < fields; ++f) {
            const auto id = static_cast<std::uint64_t>(static_cast<double>(vocabulary) * std::pow(uniform(), 4.0));
            d.ids(i, f) = static_cast<float>(id);
            logit += effect(id);
        }
        d.probability[i] = 1.0 / (1.0 + std::exp(-logit));
        d.clicks(i, 0) = uniform() < d.probability[i] ? 1.0f : 0.0f;
    }
    return d;
}

/// The exact ROC AUC of `scores` against the 0/1 `labels` (Mann-Whitney: the chance that a random click
/// scores above a random non-click, ties counting half), from the scores' ranks.
double roc_auc(const std::vector<double>& scores, const xt::xarray<float>& labels) {
    const std::size_t n = labels.shape()[0];
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
    double positive_ranks = 0;
    std::size_t positives = 0;
    for (std::size_t i = 0; i < n;) {
        std::size_t j = i;
        while (j < n && scores[order[j]] == scores[order[i]]) ++j;
        const double rank = static_cast<double>(i + j + 1) / 2.0;  // the mean of the ranks i + 1 .. j
        for (std::size_t k = i; k < j; ++k)
            if (labels(order[k], 0) > 0.5f) {
                positive_ranks += rank;
                ++positives;
            }
        i = j;
    }
    const auto p = static_cast<double>(positives);
    return (positive_ranks - p * (p + 1) / 2) / (p * (static_cast<double>(n) - p));
}

/// FNV-1a of the bytes of `values`: equal fingerprints mean bit-identical weights.
std::uint64_t fingerprint(const std::vector<pss::Tensor>& values) {
    std::uint64_t hash = 0xcbf29ce484222325ULL;
    for (const auto& t : values)
        for (std::size_t i = 0; i < t.nbytes(); ++i) {
            hash ^= static_cast<std::uint8_t>(t.bytes()[i]);
            hash *= 0x100000001b3ULL;
        }
    return hash;
}

}  // namespace

int main() {
    // Synchronous: each step's update is the mean of both workers' gradients, so the losses printed are
    // the same on every run (asynchronous training, TensorFlow's mode, is one template argument away).
    pss::ClusterStrategy<pss::MinSizePartitioner, pss::Adagrad, pss::Synchronous> strategy(
        {}, pss::MinSizePartitioner(256 << 10, 4), pss::Adagrad(0.2));
    if (!strategy.is_chief()) {
        strategy.join();  // a ps or worker process serves until the chief ends the cluster
        return 0;
    }

    std::mt19937_64 rng(2024);
    const Data data = make_data(rng, examples);
    const Data test = make_data(rng, held_out);
    pss::Sequential model(strategy,
                          {pss::Embedding(vocabulary, 32), pss::GlobalAveragePooling1D(), pss::Dense(16, "relu"),
                           pss::Dense(1, "sigmoid")},
                          /*seed=*/7);
    model.build({fields});
    model.compile(pss::BinaryCrossentropy());  // the ps tasks apply the strategy's Adagrad(0.2)

    const pss::Variable embedding = model.layers().front()->weights().front();
    std::cout << "embedding " << pss::format_shape(embedding.shape()) << " in " << embedding.num_shards()
              << " shards on ps";
    for (int task : embedding.shard_tasks()) std::cout << " " << task;
    std::cout << "\n";

    auto history = model.fit(data.ids, data.clicks, /*epochs=*/5, /*batch_size=*/256, /*shuffle=*/true,
                             /*verbose=*/false);
    for (std::size_t e = 0; e < history.loss.size(); ++e)
        std::cout << "epoch " << e + 1 << " loss " << std::fixed << std::setprecision(4) << history.loss[e] << "\n";

    // How much the model learned: its AUC on examples it never saw, beside the AUC of the click
    // probabilities the generator drew the clicks from, the best any model can reach on this data.
    const xt::xarray<float> predicted = model.predict(test.ids, 1024);
    std::cout << "held-out AUC " << roc_auc(std::vector<double>(predicted.begin(), predicted.end()), test.clicks)
              << "; the generator's own click probabilities " << roc_auc(test.probability, test.clicks)
              << " (the best any model can reach)\n";

    // The final weights, as bytes: the dense tower's, and the embedding rows of the 1000 most frequent ids.
    std::vector<pss::Tensor> weights;
    for (const auto& layer : model.layers())
        if (layer->class_name() == "Dense")
            for (auto& w : layer->get_weights()) weights.push_back(std::move(w));
    std::vector<std::int64_t> frequent(1000);
    for (std::size_t i = 0; i < frequent.size(); ++i) frequent[i] = static_cast<std::int64_t>(i);
    weights.push_back(embedding.sparse_read(frequent));
    std::cout << "final weights fingerprint " << std::hex << fingerprint(weights) << "\n";
    strategy.join();
}
