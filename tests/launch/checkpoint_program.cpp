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
// `lose-worker` (under `pss-launch --restart-failed`, golden file sync_worker_loss.expected): worker 1 kills
// itself (SIGKILL) 40 ms into the fit; the launcher starts it again, it rejoins, and its steps, which waited
// for it, run on it. Every step must be applied on every shard (a read for the step after the last returns),
// and the weights must be those of the same fit never stopped (run in this process on the embedded
// cluster): the same bits, unless the worker died between two pushes of a step; then its step runs again
// on values that are one step newer where the step was complete (as an asynchronous step would see them),
// and the weights must be within 1e-2 (a learning rate; 1.3e-3 seen).
// `lose-ps` (under `pss-launch --restart-failed`, golden file sync_ps_recovery.expected): ps 1 kills itself
// (SIGKILL) as soon as the backup of epoch 2 is committed; the launcher starts it again, and the chief's
// fit (BackupAndRestore with recover_lost_ps) waits for it, restores every variable from the backup and
// goes on from it: the weights must be the bits of the same fit never stopped.
#include <algorithm>
#include <bit>
#include <cmath>
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
    vars.emplace_back(xt::xarray<std::string>{"the", "of", "and", "to", "in", "is"}, "vocabulary");
    return vars;
}

void train_step(std::vector<pss::Variable>& vars, int k) {
    const std::vector<std::int64_t> rows{1, 10, 4, 1};
    vars[0].apply_sparse_gradient(rows, pattern<float>({4, 4}, 10 + k));
    vars[0].apply_gradient(pattern<float>({12, 4}, 20 + k));
    vars[1].apply_gradient(pattern<double>({5}, 30 + k));
    vars[2].assign_add(xt::xarray<std::int64_t>{1, 1});
    vars[3].scatter_update(std::vector<std::int64_t>{k % 6}, xt::xarray<std::string>{"word" + std::to_string(k)});
}

void print(const std::vector<pss::Variable>& vars, const char* when) {
    std::cout << when << ":\n";
    for (const auto& v : vars) {
        std::cout << "  " << v.name() << " =";
        const pss::Tensor t = v.read_value();
        if (t.dtype() == pss::DType::string) {
            for (const auto& word : t.get<std::string>()) std::cout << " " << word;
            std::cout << "\n";
            continue;
        }
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

/// The data and model of `fit`: 512 examples of 4 features, a linear target; Dense(8, relu), Dense(1).
/// Returns the weights read for step `read_step` (0: as they are).
template <class S>
std::vector<pss::Tensor> fit_model(S& strategy, const std::filesystem::path& work, bool verbose,
                                   std::uint64_t read_step, bool recover_lost_ps = false) {
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
    std::ofstream(work / "go") << "go\n";
    pss::BackupAndRestore backup((work / "backup").string());
    backup.recover_lost_ps = recover_lost_ps;
    (void)model.fit(x, y, 4, 16, backup, true, verbose, std::cout);
    std::vector<pss::Tensor> weights;
    for (const auto& v : model.weights()) weights.push_back(v.read_value(read_step));
    return weights;
}

/// `fit DIR once|whole|lose-worker|lose-ps`: see the top of this file.
int run_fit(const std::string& dir, const std::string& mode) {
    pss::ClusterStrategy<pss::FixedShardsPartitioner, pss::Adam, pss::Synchronous> strategy(
        {}, pss::FixedShardsPartitioner(2), pss::Adam(0.01));
    const std::filesystem::path work(dir);
    std::filesystem::create_directories(work);
    if (mode == "lose-worker" && strategy.task() == pss::TaskId{"worker", 1} &&
        !std::filesystem::exists(work / "worker1_killed")) {
        std::thread([work] {
            const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
            while (!std::filesystem::exists(work / "go") && std::chrono::steady_clock::now() < give_up)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            std::this_thread::sleep_for(std::chrono::milliseconds(40));
            std::ofstream(work / "worker1_killed") << "1\n";
            std::raise(SIGKILL);
        }).detach();
    }
    // The kill waits for the backup that the chief writes when epoch 2 ends (the ps tasks write their
    // shards' files first, the chief the "latest" file last).
    const auto once_backup_of_epoch_2 = [work](std::string marker) {
        std::thread([work, marker] {
            const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
            while (std::chrono::steady_clock::now() < give_up) {
                std::ifstream latest(work / "backup" / "latest");
                const auto json = nlohmann::json::parse(latest, nullptr, false);
                if (!json.is_discarded() && json.value("latest", "") == "ckpt-2") {
                    std::ofstream(work / marker) << "1\n";
                    std::raise(SIGKILL);
                }
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        }).detach();
    };
    if (mode == "lose-ps" && strategy.task() == pss::TaskId{"ps", 1} && !std::filesystem::exists(work / "ps1_killed"))
        once_backup_of_epoch_2("ps1_killed");
    if (!strategy.is_chief()) {
        strategy.join();
        return 0;
    }
    if (mode == "lose-ps") {
        const auto weights = fit_model(strategy, work, false, 0, /*recover_lost_ps=*/true);
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::Adam,
                                     pss::LocalClusterResolver<2, 2>, pss::Synchronous>
            embedded({}, pss::FixedShardsPartitioner(2), pss::Adam(0.01));
        const auto reference = fit_model(embedded, work / "reference", false, 0);
        bool same_bits = weights.size() == reference.size();
        for (std::size_t i = 0; same_bits && i < weights.size(); ++i)
            same_bits = weights[i].get<float>() == reference[i].get<float>();
        std::cout << "ps 1 lost after the backup of epoch 2, restored, and the weights the bits of a fit never "
                     "stopped: "
                  << same_bits << std::endl;
        strategy.join();
        return 0;
    }
    if (mode == "once" && !std::filesystem::exists(work / "first_chief_died")) once_backup_of_epoch_2("first_chief_died");
    if (mode == "lose-worker") {
        // A step run again after its worker was lost may report the loss of the weights after it: only
        // the weights are compared.
        // 4 epochs of 32 steps: a read for step 129 waits until every step is applied on its shards.
        const auto weights = fit_model(strategy, work, false, 129);
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::Adam,
                                     pss::LocalClusterResolver<2, 2>, pss::Synchronous>
            embedded({}, pss::FixedShardsPartitioner(2), pss::Adam(0.01));
        const auto reference = fit_model(embedded, work / "reference", false, 129);
        bool same_bits = weights.size() == reference.size();
        float largest = 0;
        for (std::size_t i = 0; same_bits && i < weights.size(); ++i) {
            const auto& a = weights[i].get<float>();
            const auto& b = reference[i].get<float>();
            same_bits = a.shape() == b.shape();
            for (std::size_t k = 0; same_bits && k < a.size(); ++k)
                largest = std::max(largest, std::abs(a.data()[k] - b.data()[k]));
        }
        std::cerr << "checkpoint_program: the weights differ from a fit never stopped by at most " << largest
                  << (largest == 0 ? " (the same bits)" : " (worker 1 died between two pushes of a step)") << "\n";
        std::cout << "every step applied, the weights within 1e-2 of a fit never stopped: "
                  << (same_bits && largest <= 1e-2f) << std::endl;
        strategy.join();
        return 0;
    }
    std::string bits;
    for (const auto& w : fit_model(strategy, work, true, 0))
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
    if (argc == 4 && std::string(argv[1]) == "fit") return run_fit(argv[2], argv[3]);
    if (argc != 4) {
        std::cerr << "usage: checkpoint_program save|restore DIR SHARDS, or fit DIR once|whole|lose-worker|lose-ps\n";
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
