// tests/launch/cluster_program.cpp: one program for every task of a cluster. Under pss-launch (or any
// TF_CONFIG) the chief creates variables on the ps processes and schedules registered functions on the
// worker processes; alone, it runs the same steps on the embedded cluster. Its stdout is the chief's and
// is the same both ways (golden file cluster_program.expected).
//
// `cluster_program --rejoin DIR` (under `pss-launch --restart-failed`, golden file rejoin.expected): worker 1
// kills itself (SIGKILL) in its third closure; the chief schedules on until the process the launcher
// started again in its place has rejoined and run closures, and checks that every closure ran.
//
// `cluster_program --ps-loss kill|stop DIR` (golden file ps_loss.expected): once the chief has run closures on
// a variable of ps 1, ps 1 kills (SIGKILL) or stops (SIGSTOP) itself; the chief's join must raise an
// UnavailableError naming ps 1 within the heartbeat timeout + 2 s (killed) or 3 heartbeat timeouts + 2 s
// (stopped: found by heartbeats), after the transient failures TensorFlow retries. `--ps-loss cut DIR`
// (check_link_cut.sh, each task in a network namespace of its own): ps 1 runs on, and the script cuts its
// link when DIR/go appears and notes the time in DIR/died; the chief's limit is that of a stopped ps.
//
// `cluster_program --ps-recovery DIR` (under `pss-launch --restart-failed`, golden file ps_recovery.expected):
// the chief recovers lost ps tasks from its checkpoints (ClusterCoordinator::recover_ps_from); it saves at 5
// closures, runs 3 more, and ps 1 kills itself; the launcher starts it again, the chief restores every
// variable from the checkpoint, and the 4 closures scheduled after the loss give 5 + 4 on both ps tasks.
//
// `cluster_program --long-step SECONDS` (golden file long_step.expected): one step of SECONDS (18 in the test,
// nine times its heartbeat timeout of 2 s) on a worker, while the other worker runs short closures; the step
// completes and no task is lost (liveness comes from heartbeats, not from deadlines).
//
// `cluster_program --chief-restart DIR` (check_chief_restart.sh, golden file chief_restart.expected): the
// first chief saves a checkpoint, trains on and kills itself; the ps and worker tasks serve on, and a chief
// started again with the same TF_CONFIG takes them over (the ps tasks drop the last run's shards), creates
// its variable again, restores the checkpoint and trains on.
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

/// Adds `amount` to both variables: one closure that needs both ps tasks.
int add_to_both(pss::Variable a, pss::Variable b, float amount) {
    a.assign_add(xt::xarray<float>{amount});
    b.assign_add(xt::xarray<float>{amount});
    return pss::worker_index();
}
const auto add_both = pss::register_function("cluster_program.add_to_both", &add_to_both);

/// TensorFlow's step shape, on whichever process runs the worker: strategy.run(replica_fn, args), then
/// strategy.reduce; gives y + 2y, or 100 more if the worker index were out of range.
float replica_step(pss::Variable v, float x) {
    pss::Strategy& strategy = pss::get_strategy();
    auto per_replica = strategy.run(
        [&](float y) {
            v.assign_add(xt::xarray<float>{y});
            return xt::xarray<float>{y, 2 * y};
        },
        x);
    const int worker = pss::get_current_worker_index();
    return strategy.reduce(pss::ReduceOp::sum, per_replica, 0)(0) + (worker == 0 || worker == 1 ? 0.0f : 100.0f);
}
const auto replica = pss::register_function("cluster_program.replica_step", &replica_step);

/// Adds `x` to this worker's per-worker variable.
void add_to_mine(pss::Variable mine, float x) { mine.assign_add(xt::xarray<float>{x}); }
const auto add_mine = pss::register_function("cluster_program.add_to_mine", &add_to_mine);

/// Wall-clock nanoseconds: the one clock two processes of this machine share.
long long wall_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/// Adds 1 to `count`; returns {worker index, process id}. Worker 1's first process dies in its third call
/// before it adds anything (kill -9 mid-training); `marker` says it did, so its successor lives on.
std::vector<int> tick(pss::Variable count, const std::string& marker) {
    static int calls = 0;
    if (pss::worker_index() == 1 && ++calls == 3 && !std::filesystem::exists(marker)) {
        std::ofstream(marker) << wall_ns() << "\n";
        std::raise(SIGKILL);
    }
    count.assign_add(xt::xarray<float>{1});
    return {pss::worker_index(), static_cast<int>(::getpid())};
}
const auto tick_call = pss::register_function("cluster_program.tick", &tick);

/// ps 1 of `--ps-loss`: waits (on a thread) for the chief's word in DIR/go, notes the time in DIR/died, and
/// kills or stops itself.
void arm_ps_loss(const std::string& how, const std::string& dir) {
    std::thread([how, dir] {
        const auto go = std::filesystem::path(dir) / "go";
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        while (!std::filesystem::exists(go) && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::ofstream(std::filesystem::path(dir) / "died") << wall_ns() << "\n";
        std::raise(how == "stop" ? SIGSTOP : SIGKILL);
    }).detach();
}

/// The chief of `--ps-loss kill|stop DIR`: see the top of this file.
int run_ps_loss(Strategy& strategy, const std::string& how, const std::string& dir, double heartbeat_timeout) {
    pss::ClusterCoordinator coordinator(strategy);
    auto [on_ps0, on_ps1] = [&] {
        auto scope = strategy.scope();
        return std::pair{pss::Variable(xt::xarray<float>{0}, "on_ps0"), pss::Variable(xt::xarray<float>{0}, "on_ps1")};
    }();
    std::cout << "the second variable is on ps 1: " << (on_ps1.device() == "/job:ps/replica:0/task:1/device:CPU:0")
              << "\n";
    for (int i = 0; i < 8; ++i) (void)coordinator.schedule(add, on_ps1, 1.0f);
    coordinator.join();
    std::cout << "before the loss: " << on_ps1.read<float>()(0) << "\n";
    std::ofstream(std::filesystem::path(dir) / "go") << "go\n";
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    std::string error;
    while (error.empty() && std::chrono::steady_clock::now() < give_up) {
        for (int i = 0; i < 4; ++i) (void)coordinator.schedule(add, on_ps1, 1.0f);
        try {
            coordinator.join();
        } catch (const pss::UnavailableError& e) {
            error = e.what();
        }
    }
    const long long raised = wall_ns();
    long long died = 0;
    std::ifstream(std::filesystem::path(dir) / "died") >> died;
    const double seconds = static_cast<double>(raised - died) * 1e-9;
    const double limit = (how == "kill" ? 1 : 3) * heartbeat_timeout + 2;
    const char* what = how == "kill" ? "killed" : how == "stop" ? "stopped" : "cut off";
    std::cerr << "cluster_program: ps 1 " << what << "; join raised after " << seconds
              << " s (limit " << limit << " s): " << error << "\n";
    std::cout << "join raised UnavailableError naming ps 1: "
              << (error.find("/job:ps/replica:0/task:1") != std::string::npos) << "\n";
    std::cout << "within the limit: " << (died > 0 && seconds < limit) << "\n";
    std::cout << "ps 0 still serves: " << (on_ps0.assign_add(xt::xarray<float>{5}), on_ps0.read<float>()(0)) << "\n";
    strategy.join();
    return 0;
}

/// The chief of `--ps-recovery DIR`: see the top of this file.
int run_ps_recovery(Strategy& strategy, const std::string& dir) {
    pss::Checkpoint checkpoint(strategy);
    pss::CheckpointManager manager(checkpoint, (std::filesystem::path(dir) / "ckpt").string(), 2);
    pss::ClusterCoordinator coordinator(strategy);
    coordinator.recover_ps_from(manager);
    // Named variables, not a structured binding: clang 14 cannot capture one in a lambda.
    auto both = [&] {
        auto scope = strategy.scope();
        return std::pair{pss::Variable(xt::xarray<float>{0}, "on_ps0"), pss::Variable(xt::xarray<float>{0}, "on_ps1")};
    }();
    pss::Variable& on_ps0 = both.first;
    pss::Variable& on_ps1 = both.second;
    std::cout << "the second variable is on ps 1: " << (on_ps1.device() == "/job:ps/replica:0/task:1/device:CPU:0")
              << "\n";
    const auto add_times = [&](int n) {
        for (int i = 0; i < n; ++i) (void)coordinator.schedule(add_both, on_ps0, on_ps1, 1.0f);
        coordinator.join();
    };
    add_times(5);
    (void)manager.save();
    add_times(3);
    std::cout << "before the loss: " << on_ps0.read<float>()(0) << " and " << on_ps1.read<float>()(0) << "\n";
    std::ofstream(std::filesystem::path(dir) / "go") << "go\n";
    const auto died_file = std::filesystem::path(dir) / "died";
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!std::filesystem::exists(died_file) && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its kill follows the file
    add_times(4);
    long long died = 0;
    std::ifstream(died_file) >> died;
    std::cerr << "cluster_program: ps 1 killed; 4 closures ran after its restart and restore, "
              << static_cast<double>(wall_ns() - died) * 1e-9 << " s after the kill\n";
    std::cout << "after ps 1 started again and every variable was restored, 4 more closures: "
              << on_ps0.read<float>()(0) << " and " << on_ps1.read<float>()(0) << "\n";
    strategy.join();
    return 0;
}

/// The chief of `--long-step SECONDS`: see the top of this file.
int run_long_step(Strategy& strategy, double seconds) {
    pss::ClusterCoordinator coordinator(strategy);
    pss::Variable v = [&] {
        auto scope = strategy.scope();
        return pss::Variable(xt::xarray<float>{0}, "v");
    }();
    const auto started = std::chrono::steady_clock::now();
    auto step = coordinator.schedule_on(0, slow, seconds);
    int short_ones = 0;
    while (std::chrono::steady_clock::now() - started < std::chrono::duration<double>(seconds / 2)) {
        (void)coordinator.schedule_on(1, add, v, 1.0f).fetch();
        ++short_ones;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    const int result = step.fetch();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    coordinator.join();
    std::cerr << "cluster_program: a step of " << seconds << " s took " << took << " s\n";
    std::cout << "the long step returned " << result << " after at least its length: " << (took >= seconds) << "\n";
    std::cout << "the other worker ran every short closure meanwhile: "
              << (short_ones > 0 && v.read<float>()(0) == static_cast<float>(short_ones)) << "\n";
    strategy.join();
    return 0;
}

/// The chief of `--chief-restart DIR`: see the top of this file.
int run_chief_restart(Strategy& strategy, const std::string& dir) {
    const auto first_life = std::filesystem::path(dir) / "first_chief_died";
    pss::Checkpoint checkpoint(strategy);
    pss::CheckpointManager manager(checkpoint, (std::filesystem::path(dir) / "ckpt").string(), 2);
    pss::ClusterCoordinator coordinator(strategy);
    pss::Variable v = [&] {
        auto scope = strategy.scope();
        return pss::Variable(xt::xarray<float>{0}, "v");
    }();
    const auto add_times = [&](int n) {
        for (int i = 0; i < n; ++i) (void)coordinator.schedule(add, v, 1.0f);
        coordinator.join();
        return v.read<float>()(0);
    };
    if (!std::filesystem::exists(first_life)) {
        const float saved = add_times(5);
        checkpoint.set_step(5);
        manager.save();
        const float last = add_times(3);
        std::cout << "first chief: v = " << saved << " at the checkpoint, " << last << " when it dies" << std::endl;
        std::ofstream(first_life) << "1\n";
        std::raise(SIGKILL);
    }
    const auto restored = manager.restore_or_initialize();
    std::cout << "second chief: restored " << (restored ? "the latest checkpoint" : "nothing") << ", v = "
              << v.read<float>()(0) << "\n";
    std::cout << "after 3 more closures: v = " << add_times(3) << "\n";
    strategy.join();
    return 0;
}

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
    long long rerun_seen = 0;  // when the batch with the lost closure had run (elsewhere)
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
        if (rerun_seen == 0 && std::filesystem::exists(marker)) rerun_seen = wall_ns();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    long long killed = 0;
    std::ifstream(marker) >> killed;
    std::cerr << "cluster_program: worker 1 killed; its closure had run on another worker "
              << static_cast<double>(rerun_seen - killed) * 1e-9 << " s later (at most)\n";
    std::cout << "worker 1 was killed: " << (killed > 0) << "\n";
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
    const bool ps_loss = argc == 4 && std::string(argv[1]) == "--ps-loss";
    const bool ps1_ends_itself = ps_loss && std::string(argv[2]) != "cut";  // a cut is the script's
    if (ps1_ends_itself && strategy.task() == pss::TaskId{"ps", 1}) arm_ps_loss(argv[2], argv[3]);
    // ps 1 of --ps-recovery kills itself once; the process started again in its place serves on.
    if (argc == 3 && std::string(argv[1]) == "--ps-recovery" && strategy.task() == pss::TaskId{"ps", 1} &&
        !std::filesystem::exists(std::filesystem::path(argv[2]) / "died"))
        arm_ps_loss("kill", argv[2]);
    if (!strategy.is_chief()) {
        strategy.join();  // ps and workers serve until the chief ends the cluster
        return 0;
    }
    if (argc == 3 && std::string(argv[1]) == "--rejoin") return run_rejoin(strategy, argv[2]);
    if (argc == 3 && std::string(argv[1]) == "--chief-restart") return run_chief_restart(strategy, argv[2]);
    if (argc == 3 && std::string(argv[1]) == "--ps-recovery") return run_ps_recovery(strategy, argv[2]);
    if (argc == 3 && std::string(argv[1]) == "--long-step") return run_long_step(strategy, std::stod(argv[2]));
    if (ps_loss)
        return run_ps_loss(strategy, argv[2], argv[3],
                           std::chrono::duration<double>(pss::Timeouts::from_environment().heartbeat_timeout).count());
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

    pss::Variable r = [&] {
        auto scope = strategy.scope();
        return pss::Variable(xt::xarray<float>{0}, "r");
    }();
    std::vector<pss::RemoteValue<float>> steps;
    for (float x : {1.0f, 2.0f}) steps.push_back(coordinator.schedule(replica, r, x));
    const std::vector<float> reduced = pss::fetch(steps);
    std::cout << "strategy.run on the workers: " << reduced[0] + reduced[1] << ", r = " << r.read<float>()(0) << "\n";
    auto mine = coordinator.create_per_worker_variable(xt::xarray<float>{0}, "mine");
    for (int w = 0; w < 2; ++w) (void)coordinator.schedule_on(w, add_mine, mine, static_cast<float>(w + 1));
    coordinator.join();
    const auto all = mine.read_all();
    std::cout << "per-worker variables: " << all[0].get<float>()(0) << " " << all[1].get<float>()(0) << "\n";

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

    // Keras' `optimizer.learning_rate = 0.5` (what LearningRateScheduler does): every ps task applies it
    // until the optimizer's own rate (SGD's 0.01) is asked for again.
    auto [rate0, rate1] = [&] {
        auto scope = strategy.scope();
        return std::pair{pss::Variable(xt::xarray<float>{0}, "rate0"), pss::Variable(xt::xarray<float>{0}, "rate1")};
    }();
    strategy.set_learning_rate(0.5);
    rate0.apply_gradient(xt::xarray<float>{1});
    rate1.apply_gradient(xt::xarray<float>{1});
    std::cout << "learning rate " << strategy.learning_rate() << " on two ps tasks ("
              << (rate0.device() != rate1.device()) << "): " << rate0.read<float>()(0) << " "
              << rate1.read<float>()(0);
    strategy.set_learning_rate(std::nullopt);
    rate0.apply_gradient(xt::xarray<float>{1});
    rate1.apply_gradient(xt::xarray<float>{1});
    std::cout << "; the optimizer's " << strategy.learning_rate() << " again: " << rate0.read<float>()(0) << " "
              << rate1.read<float>()(0) << "\n";

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
