// tests/launch/cluster_program.cpp: one program for every task of a cluster. Under pss-launch (or any
// TF_CONFIG) the chief creates variables on the ps processes and schedules registered functions on the
// worker processes; alone, it runs the same steps on the embedded cluster. Its stdout is the chief's and
// is the same both ways (golden file cluster_program.expected).
//
// `cluster_program --rejoin DIR` (under `pss-launch --restart-failed`, golden file rejoin.expected): worker 1
// kills itself (SIGKILL) in its third closure; the chief schedules on until the process the launcher
// started again in its place has rejoined and run closures, and checks that every closure ran.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <utility>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <pss/pss.hpp>

namespace {

using Strategy = pss::ClusterStrategy<>;

int add_to(pss::Variable v, float amount) {
    v.assign_add(xt::xarray<float>{amount});
    return pss::worker_index();
}
const auto add = pss::register_function("cluster_program.add", &add_to);

std::vector<double> scaled(const xt::xarray<double>& values, double factor, const std::string& label) {
    std::vector<double> out;
    for (double v : values) out.push_back(v * factor + static_cast<double>(label.size()));
    return out;
}
const auto scale = pss::register_function("cluster_program.scaled", &scaled);

double fails(int code) {
    if (code == 1) throw pss::OutOfRangeError("pss: cluster_program: id 7 is out of range");
    return 0;
}
const auto fail = pss::register_function("cluster_program.fails", &fails);

/// A step longer than the heartbeat timeout the launched test sets (PSS_HEARTBEAT_TIMEOUT=1): the worker
/// runs it on its call thread and goes on answering heartbeats, so it is not lost.
int long_step(double seconds) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    return 1;
}
const auto slow = pss::register_function("cluster_program.long_step", &long_step);

// Is each task its own process? Known before main: a worker serves calls as soon as its strategy exists.
const bool distributed = std::getenv("TF_CONFIG") != nullptr;

/// The first call loses its worker (the process ends, or the embedded cluster's test hook); the
/// coordinator runs it again on the other worker, where `lost` is 1 already.
int lose_first_worker(pss::Variable lost, pss::Variable runs) {
    runs.assign_add(xt::xarray<float>{1});
    if (lost.read<float>()(0) == 0) {
        lost.assign(xt::xarray<float>{1});
        if (distributed) std::_Exit(0);  // status 0: pss-launch lets the other tasks run on
        pss::ClusterCoordinator::testing_lose_current_worker();
    }
    return 7;
}
const auto lose = pss::register_function("cluster_program.lose_first_worker", &lose_first_worker);

/// Adds 1 to `count`; returns {worker index, process id}. Worker 1's first process dies in its third call
/// before it adds anything (kill -9 mid-training); `marker` says it did, so its successor lives on.
std::vector<int> tick(pss::Variable count, const std::string& marker) {
    static int calls = 0;
    if (pss::worker_index() == 1 && ++calls == 3 && !std::filesystem::exists(marker)) {
        std::ofstream(marker) << "killed\n";
        std::raise(SIGKILL);
    }
    count.assign_add(xt::xarray<float>{1});
    return {pss::worker_index(), static_cast<int>(::getpid())};
}
const auto tick_call = pss::register_function("cluster_program.tick", &tick);

/// The chief of `--rejoin DIR`: see the top of this file. Gives up after 120 s.
int run_rejoin(Strategy& strategy, const std::string& dir) {
    pss::ClusterCoordinator coordinator(strategy);
    pss::Variable count = [&] {
        auto scope = strategy.scope();
        return pss::Variable(xt::xarray<float>{0}, "count");
    }();
    const std::string marker = (std::filesystem::path(dir) / "worker1.killed").string();
    std::filesystem::remove(marker);
    std::map<int, std::vector<int>> processes;  // worker -> its process ids, in the order first seen
    std::map<int, int> ran;                     // process id -> closures it ran
    int scheduled = 0;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    const auto rejoined = [&] {
        const auto& ids = processes[1];
        return ids.size() == 2 && ran[ids[1]] >= 3;
    };
    while (!rejoined()) {
        if (std::chrono::steady_clock::now() > give_up) {
            std::cout << "worker 1 did not rejoin within 120 s (" << processes[1].size() << " processes seen)\n";
            return 1;
        }
        std::vector<pss::RemoteValue<std::vector<int>>> batch;
        for (int i = 0; i < 4; ++i) batch.push_back(coordinator.schedule(tick_call, count, marker));
        scheduled += 4;
        coordinator.join();
        for (auto& value : batch) {
            const auto who = value.fetch();
            auto& ids = processes[who[0]];
            if (std::find(ids.begin(), ids.end(), who[1]) == ids.end()) ids.push_back(who[1]);
            ++ran[who[1]];
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::cout << "worker 1 was killed: " << std::filesystem::exists(marker) << "\n";
    std::cout << "worker 1 ran closures in 2 processes, the second after it rejoined: " << rejoined() << "\n";
    std::cout << "worker 0 ran closures in 1 process: " << (processes[0].size() == 1) << "\n";
    std::cout << "every closure ran once (the lost one again elsewhere): "
              << (count.read<float>()(0) == static_cast<float>(scheduled)) << "\n";
    strategy.join();
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Strategy strategy;
    if (!strategy.is_chief()) {
        strategy.join();  // ps and workers serve until the chief ends the cluster
        return 0;
    }
    if (argc == 3 && std::string(argv[1]) == "--rejoin") return run_rejoin(strategy, argv[2]);
    pss::ClusterCoordinator coordinator(strategy);
    pss::Variable v = [&] {
        auto scope = strategy.scope();
        return pss::Variable(xt::xarray<float>{0}, "v");
    }();
    std::set<int> workers;
    std::vector<pss::RemoteValue<int>> results;
    for (int i = 0; i < 5; ++i) results.push_back(coordinator.schedule(add, v, 2.0f));
    coordinator.join();
    for (int w : pss::fetch(results)) workers.insert(w);
    std::cout << "after 5 closures: " << v.read<float>()(0) << "\n";
    for (int i = 0; i < 5; ++i) (void)coordinator.schedule(add, v, 2.0f);
    coordinator.join();
    coordinator.join();
    coordinator.join();
    std::cout << "after 10 closures: " << v.read<float>()(0) << ", done: " << coordinator.done() << "\n";
    std::cout << "worker indices in range: " << (!workers.empty() && *workers.begin() >= 0 && *workers.rbegin() < 2)
              << "\n";

    auto values = coordinator.schedule(scale, xt::xarray<double>{1.5, -2.0}, 2.0, std::string("abc")).fetch();
    std::cout << "scaled: " << values[0] << " " << values[1] << "\n";

    // Outside any scope a variable lives in this process, on the chief's device when the cluster is processes.
    const pss::Variable local(xt::xarray<float>{1}, "local");
    std::cout << "a variable outside any scope is on "
              << (local.device() == (distributed ? "/job:chief/replica:0/task:0/device:CPU:0"
                                                 : "/job:localhost/replica:0/task:0/device:CPU:0")
                      ? "this task's device"
                      : local.device())
              << "\n";
    std::cout << "a step of 2.5 s: " << coordinator.schedule(slow, 2.5).fetch() << "\n";

    auto failed = coordinator.schedule(fail, 1);
    try {
        coordinator.join();
        std::cout << "join did not raise\n";
    } catch (const pss::OutOfRangeError& e) {
        std::cout << "join raised OutOfRangeError: " << e.what() << "\n";
    }
    try {
        (void)failed.fetch();
    } catch (const pss::OutOfRangeError&) {
        std::cout << "fetch raised it too\n";
    }
    std::cout << "after the error, done: " << coordinator.done() << ", again: " << coordinator.schedule(fail, 0).fetch()
              << "\n";
    std::cout << "v = " << v << "\n";

    // At least once: a closure whose worker is lost runs again on another worker.
    auto [lost, runs] = [&] {
        auto scope = strategy.scope();
        return std::pair{pss::Variable(xt::xarray<float>{0}, "lost"), pss::Variable(xt::xarray<float>{0}, "runs")};
    }();
    const int answer = coordinator.schedule(lose, lost, runs).fetch();
    std::cout << "after losing a worker: " << answer << ", runs " << runs.read<float>()(0) << "\n";
    for (int i = 0; i < 4; ++i) (void)coordinator.schedule(add, v, 1.0f);
    coordinator.join();
    std::cout << "the other worker runs on: v = " << v.read<float>()(0) << "\n";
    strategy.join();
    return 0;
}
