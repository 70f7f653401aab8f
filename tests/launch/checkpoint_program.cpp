// tests/launch/checkpoint_program.cpp: a checkpoint saved by one cluster and restored by another, each ps
// process writing and reading its own shards. `save DIR SHARDS` trains 3 steps, saves through a
// CheckpointManager in DIR, then trains one more; `restore DIR SHARDS` restores the latest checkpoint
// before the model exists (deferred), builds it, then trains the same one more step. Both print the same
// lines: the values after the save or restore, and after the next step.
//
// `fit DIR once|whole` (check_fit_restart.sh): a synchronous Sequential::fit of 4 epochs with
// BackupAndRestore in DIR/backup, then the weights' bits. `once`: a chief that finds no DIR/first_chief_died
// kills itself (SIGKILL) as soon as the backup of epoch 2 is committed, mid-fit; a chief started again
// resumes from that backup. `whole`: the same fit, never stopped (the bits the resumed one must give).
#include <bit>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <pss/keras.hpp>
#include <pss/pss.hpp>

namespace {

using Strategy = pss::ClusterStrategy<pss::FixedShardsPartitioner, pss::Adam>;

template <class T>
xt::xarray<T> pattern(const pss::Shape& shape, int seed) {
    xt::xarray<T> a = xt::xarray<T>::from_shape(shape);
    for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = static_cast<T>(static_cast<double>((i * 37 + seed * 11) % 23) / 7.0 - 1.5);
    return a;
}

std::vector<pss::Variable> build(Strategy& strategy) {
    auto scope = strategy.scope();
    std::vector<pss::Variable> vars;
    vars.emplace_back(pattern<float>({12, 4}, 1), "embedding/embeddings");
    vars.emplace_back(pattern<double>({5}, 2), "dense/bias");
    vars.emplace_back(xt::xarray<std::int64_t>{7, -3}, "step_counts");
    return vars;
}

void train_step(std::vector<pss::Variable>& vars, int k) {
    const std::vector<std::int64_t> rows{1, 10, 4, 1};
    vars[0].apply_sparse_gradient(rows, pattern<float>({4, 4}, 10 + k));
    vars[0].apply_gradient(pattern<float>({12, 4}, 20 + k));
    vars[1].apply_gradient(pattern<double>({5}, 30 + k));
    vars[2].assign_add(xt::xarray<std::int64_t>{1, 1});
}

void print(const std::vector<pss::Variable>& vars, const char* when) {
    std::cout << when << ":\n";
    for (const auto& v : vars) {
        std::cout << "  " << v.name() << " =";
        const pss::Tensor t = v.read_value();
        t.visit([](const auto& a) {
            for (auto x : a) {
                char buffer[40];
                std::snprintf(buffer, sizeof buffer, " %.9g", static_cast<double>(x));
                std::cout << buffer;
            }
            return 0;
        }, 0);
        std::cout << "\n";
    }
}

}  // namespace

/// `fit DIR once|whole`: see the top of this file.
int run_fit(const std::string& dir, bool die_once) {
    pss::ClusterStrategy<pss::FixedShardsPartitioner, pss::Adam, pss::Synchronous> strategy(
        {}, pss::FixedShardsPartitioner(2), pss::Adam(0.01));
    if (!strategy.is_chief()) {
        strategy.join();
        return 0;
    }
    const std::filesystem::path work(dir);
    if (die_once && !std::filesystem::exists(work / "first_chief_died")) {
        std::thread([work] {
            const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
            while (std::chrono::steady_clock::now() < give_up) {
                std::ifstream latest(work / "backup" / "latest");
                const auto json = nlohmann::json::parse(latest, nullptr, false);
                if (!json.is_discarded() && json.value("latest", "") == "ckpt-2") {
                    std::ofstream(work / "first_chief_died") << "1\n";
                    std::raise(SIGKILL);
                }
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        }).detach();
    }
    constexpr std::size_t examples = 512;
    xt::xarray<float> x = xt::xarray<float>::from_shape({examples, 4});
    xt::xarray<float> y = xt::xarray<float>::from_shape({examples, 1});
    for (std::size_t i = 0; i < examples; ++i) {
        float target = 0.5f;
        for (std::size_t j = 0; j < 4; ++j) {
            x(i, j) = static_cast<float>(static_cast<double>((i * 7 + j * 13) % 17) / 8.0 - 1.0);
            target += static_cast<float>(j + 1) * x(i, j);
        }
        y(i, 0) = target;
    }
    pss::Sequential model(strategy, {pss::Dense(8, "relu"), pss::Dense(1)}, /*seed=*/7);
    model.compile(pss::Adam(0.01), "mse");
    (void)model.fit(x, y, 4, 16, pss::BackupAndRestore{(work / "backup").string()}, true, true, std::cout);
    std::string bits;
    for (const auto& w : model.get_weights())
        for (const float v : w.get<float>()) {
            char word[10];
            std::snprintf(word, sizeof word, " %08x", std::bit_cast<std::uint32_t>(v));
            bits += word;
        }
    std::cout << "weights:" << bits << std::endl;
    strategy.join();
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 4 && std::string(argv[1]) == "fit") return run_fit(argv[2], std::string(argv[3]) == "once");
    if (argc != 4) {
        std::cerr << "usage: checkpoint_program save|restore DIR SHARDS, or fit DIR once|whole\n";
        return 2;
    }
    const std::string mode = argv[1], dir = argv[2];
    const int shards = std::atoi(argv[3]);
    Strategy strategy({}, pss::FixedShardsPartitioner(shards), pss::Adam(0.05));
    if (!strategy.is_chief()) {
        strategy.join();
        return 0;
    }
    pss::Checkpoint checkpoint(strategy);
    pss::CheckpointManager manager(checkpoint, dir, 2);
    std::vector<pss::Variable> vars;
    if (mode == "save") {
        vars = build(strategy);
        for (int k = 0; k < 3; ++k) train_step(vars, k);
        checkpoint.set_step(3);
        manager.save();
    } else {
        const auto restored = manager.restore_or_initialize();  // before the model exists: deferred
        if (!restored) {
            std::cerr << "no checkpoint in " << dir << "\n";
            return 1;
        }
        vars = build(strategy);
        checkpoint.assert_consumed();
    }
    std::cout << "step " << checkpoint.step() << ", embedding in " << vars[0].num_shards() << " shards\n";  // 1st line: per run
    print(vars, "saved values");
    train_step(vars, 3);
    print(vars, "after one more step");
    strategy.join();
    return 0;
}
