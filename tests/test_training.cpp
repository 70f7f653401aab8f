// Tests of ClusterCoordinator, RemoteValue, registered functions and the consistency models.
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <future>
#include <initializer_list>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <stdlib.h>

#include <doctest/doctest.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xview.hpp>

#include <nlohmann/json.hpp>
#include <pss/data.hpp>
#include <pss/keras.hpp>
#include <pss/pss.hpp>

namespace {

pss::Variable make_counter(pss::Strategy& strategy) {
    auto scope = strategy.scope();
    return pss::Variable(xt::xarray<float>{0}, "counter");
}

std::int64_t times_two(std::int64_t x) { return 2 * x; }

template <class Consistency, int Workers>
using LinearStrategy = pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                                    pss::LocalClusterResolver<2, Workers>, Consistency>;

/// Gradient of the mean squared error of y = x . w over rows [first, first + count), by plain loops.
xt::xarray<double> mse_gradient(const xt::xarray<double>& x, const xt::xarray<double>& y, const xt::xarray<double>& w,
                                std::size_t first, std::size_t count) {
    xt::xarray<double> grad = xt::zeros<double>({w.size()});
    for (std::size_t i = first; i < first + count; ++i) {
        double err = -y(i);
        for (std::size_t j = 0; j < w.size(); ++j) err += x(i, j) * w(j);
        for (std::size_t j = 0; j < w.size(); ++j) grad(j) += 2.0 * err * x(i, j) / static_cast<double>(count);
    }
    return grad;
}

/// Trains y = x . w for `steps` steps of batch 8 on Workers workers, each on its slice of every batch.
template <class Consistency, int Workers>
xt::xarray<double> train_linear(int steps) {
    xt::xarray<double> x = xt::xarray<double>::from_shape({64, 3});
    xt::xarray<double> y = xt::xarray<double>::from_shape({64});
    for (std::size_t i = 0; i < 64; ++i) {
        for (std::size_t j = 0; j < 3; ++j)
            x(i, j) = std::sin(0.37 * static_cast<double>(i * (j + 1)) + static_cast<double>(j));
        y(i) = 1.5 * x(i, 0) - 2.0 * x(i, 1) + 0.5 * x(i, 2);
    }
    LinearStrategy<Consistency, Workers> strategy({}, {}, pss::SGD(0.1));
    pss::Variable w = [&] {
        auto scope = strategy.scope();
        return pss::Variable(xt::xarray<double>(xt::zeros<double>({3})), "w");
    }();
    std::vector<std::jthread> threads;
    for (int worker = 0; worker < Workers; ++worker)
        threads.emplace_back([&, worker] {
            constexpr std::size_t batch = 8;
            const std::size_t slice = batch / Workers;
            for (int step = 1; step <= steps; ++step) {
                const std::size_t first = (static_cast<std::size_t>(step - 1) * batch) % 64 + worker * slice;
                const auto s = Consistency::synchronous ? static_cast<std::uint64_t>(step) : 0;
                auto weights = w.read<double>(s);
                w.apply_gradient(mse_gradient(x, y, weights, first, slice), s);
            }
        });
    threads.clear();
    return w.read<double>();
}

}  // namespace

TEST_SUITE("ClusterCoordinator") {
    TEST_CASE("ClusterCoordinator: 5 closures adding 2 then join give 10; 5 more and 3 joins give 20, done") {
        pss::ParameterServerStrategy<> strategy;
        pss::ClusterCoordinator coordinator(strategy);
        pss::Variable v = make_counter(strategy);
        for (int i = 0; i < 5; ++i) coordinator.schedule([&] { v.assign_add(xt::xarray<float>{2}); });
        coordinator.join();
        CHECK(v.read<float>()(0) == 10.0f);
        for (int i = 0; i < 5; ++i) coordinator.schedule([&] { v.assign_add(xt::xarray<float>{2}); });
        coordinator.join();
        coordinator.join();
        coordinator.join();
        CHECK(v.read<float>()(0) == 20.0f);
        CHECK(coordinator.done());
    }
    TEST_CASE("strategy.run and strategy.reduce in a scheduled function: the replica function runs once per "
              "worker; get_current_worker_index() answers in closures and dataset functions") {
        pss::ParameterServerStrategy<> strategy;  // 2 workers
        pss::ClusterCoordinator coordinator(strategy);
        pss::Variable w = make_counter(strategy);
        // TensorFlow's step shape: per_replica = strategy.run(replica_fn, args); strategy.reduce(SUM, ...).
        auto step = [&](float x) {
            auto per_replica = strategy.run(
                [&](float y) {
                    w.assign_add(xt::xarray<float>{y});
                    return xt::xarray<float>{y, 2 * y};
                },
                x);
            const int worker = pss::get_current_worker_index();
            return strategy.reduce(pss::ReduceOp::sum, per_replica, 0)(0) + (worker == 0 || worker == 1 ? 0.0f : 100.0f);
        };
        std::vector<pss::RemoteValue<float>> results;
        for (int i = 1; i <= 4; ++i) results.push_back(coordinator.schedule(step, static_cast<float>(i)));
        CHECK(pss::fetch(results) == std::vector<float>{3, 6, 9, 12});  // y + 2y, each replica function once
        CHECK(w.read<float>()(0) == 10.0f);
        CHECK(strategy.num_replicas_in_sync() == 1);
        auto per_worker = coordinator.create_per_worker_dataset([] { return 10 * pss::get_current_worker_index(); });
        CHECK(per_worker.at(0) == 0);
        CHECK(per_worker.at(1) == 10);
        CHECK_THROWS_WITH_AS((void)pss::get_current_worker_index(),
                             "pss: get_current_worker_index() was called outside a worker: call it inside a function "
                             "that ClusterCoordinator::schedule runs, or a dataset function of "
                             "create_per_worker_dataset",
                             pss::FailedPreconditionError);
        // One replica: reduce gives the value; along an axis it sums or averages it.
        CHECK(strategy.reduce(pss::ReduceOp::mean, 2.5) == 2.5);
        const xt::xarray<double> m{{1, 2}, {3, 4}};
        CHECK(strategy.reduce(pss::ReduceOp::sum, m, 0) == xt::xarray<double>{4, 6});
        CHECK(strategy.reduce(pss::ReduceOp::mean, m, 1) == xt::xarray<double>{1.5, 3.5});
        CHECK(strategy.reduce(pss::ReduceOp::mean, xt::xarray<std::int32_t>{{1, 2}, {3, 4}}, 1) ==
              xt::xarray<std::int32_t>{1, 3});
        CHECK_THROWS_WITH_AS((void)strategy.reduce(pss::ReduceOp::sum, m, 2),
                             "pss: strategy.reduce along axis 2 of a value of 2 axes", pss::InvalidArgumentError);
    }
    TEST_CASE("ClusterCoordinator: per-worker variables: a closure receives its worker's; read_all() reads each "
              "worker's; fetch takes nested structures") {
        pss::ParameterServerStrategy<> strategy;  // 2 workers
        pss::ClusterCoordinator coordinator(strategy);
        auto counts = coordinator.create_per_worker_variable(xt::xarray<float>{0}, "count");
        REQUIRE(counts.size() == 2);
        CHECK(counts.at(1).name() == "count/worker_1:0");
        for (int i = 0; i < 6; ++i)
            (void)coordinator.schedule_on(
                i % 2, [](pss::Variable& mine, float x) { mine.assign_add(xt::xarray<float>{x}); }, counts,
                static_cast<float>(1 + i % 2));
        coordinator.join();
        const auto all = counts.read_all();
        CHECK(all[0].get<float>() == xt::xarray<float>{3});  // worker 0 added 1 three times
        CHECK(all[1].get<float>() == xt::xarray<float>{6});  // worker 1 added 2 three times
        auto one = coordinator.schedule([] { return 1; });
        auto two = coordinator.schedule([] { return 2; });
        auto three = coordinator.schedule([] { return 3; });
        const std::tuple nested{one, std::vector{two, three}};
        CHECK(pss::fetch(nested) == std::tuple{1, std::vector<int>{2, 3}});
        const std::map<std::string, std::vector<pss::RemoteValue<int>>> named{{"a", {one}}, {"b", {two, three}}};
        CHECK(pss::fetch(named) == std::map<std::string, std::vector<int>>{{"a", {1}}, {"b", {2, 3}}});
    }
    TEST_CASE("ClusterCoordinator: a per-worker value that failed raises ClosureInputError from join and fetch "
              "where a closure uses it, and nothing where none does (TensorFlow's testInputError, "
              "testErroredInputNotUsed)") {
        pss::ParameterServerStrategy<> strategy;  // 2 workers
        pss::ClusterCoordinator coordinator(strategy);
        auto data = coordinator.create_per_worker_dataset([](int worker) -> int {
            if (worker == 1) throw pss::InvalidArgumentError("pss: test: no data for worker 1");
            return 7;
        });
        auto unused = coordinator.schedule_on(1, [] { return 1; });
        coordinator.join();
        CHECK(unused.fetch() == 1);
        CHECK(coordinator.schedule_on(0, [](int& d) { return d; }, data).fetch() == 7);
        auto used = coordinator.schedule_on(1, [](int& d) { return d; }, data);
        CHECK_THROWS_WITH_AS(coordinator.join(),
                             "pss: ClosureInputError: the per-worker value of worker 1 failed when it was made: pss: "
                             "test: no data for worker 1",
                             pss::ClosureInputError);
        CHECK_THROWS_AS((void)used.fetch(), pss::ClosureInputError);
        CHECK(coordinator.schedule_on(0, [](int& d) { return d + 1; }, data).fetch() == 8);  // the error was raised once
    }
    TEST_CASE("ClusterCoordinator: fetch gives each closure's result; closures know their worker index") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 3>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy);
        CHECK(coordinator.num_workers() == 3);
        CHECK(pss::worker_index() == -1);
        std::vector<pss::RemoteValue<int>> values;
        for (int i = 0; i < 20; ++i) values.push_back(coordinator.schedule([i] { return i * i; }));
        auto index = coordinator.schedule([] { return pss::worker_index(); });
        std::vector<int> squares = pss::fetch(values);
        for (int i = 0; i < 20; ++i) CHECK(squares[static_cast<std::size_t>(i)] == i * i);
        CHECK(index.fetch() >= 0);
        CHECK(index.fetch() < 3);
        CHECK(values[3].ready());
        CHECK_THROWS_AS((void)pss::RemoteValue<int>().fetch(), pss::FailedPreconditionError);
    }
    TEST_CASE("ClusterCoordinator: a closure runs under its strategy's scope: its variables go to the ps tasks") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<3, 1>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy);
        CHECK(!pss::has_strategy());
        auto same = coordinator.schedule([&] { return &pss::get_strategy() == &strategy; });
        auto tasks = coordinator.schedule([] {
            pss::Variable a(xt::xarray<float>{1}, "a");
            pss::Variable b(xt::xarray<float>{2}, "b");
            return std::vector<int>{a.shard_tasks().front(), b.shard_tasks().front()};
        });
        CHECK(same.fetch());
        CHECK(tasks.fetch() == std::vector<int>{0, 1});  // round-robin over the ps tasks, not the coordinator (-1)
        CHECK(!pss::has_strategy());
    }
    TEST_CASE("ClusterCoordinator: an error is raised by the next join, queued closures are cancelled, then work resumes") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 1>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy);
        std::latch release(1);
        auto failing = coordinator.schedule([&]() -> int {
            release.wait();
            throw pss::InvalidArgumentError("pss: step failed");
        });
        std::vector<pss::RemoteValue<int>> queued;
        for (int i = 0; i < 3; ++i) queued.push_back(coordinator.schedule([] { return 1; }));
        release.count_down();
        CHECK_THROWS_WITH_AS(coordinator.join(), "pss: step failed", pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)failing.fetch(), "pss: step failed", pss::InvalidArgumentError);
        for (auto& q : queued)
            CHECK_THROWS_WITH_AS((void)q.fetch(),
                                 "pss: this closure was cancelled because an earlier closure failed; reschedule it",
                                 pss::CancelledError);
        auto after = coordinator.schedule([] { return 7; });
        coordinator.join();
        CHECK(after.fetch() == 7);
        CHECK(coordinator.done());
    }
    TEST_CASE("ClusterCoordinator: one per strategy: a second one is the first (one pool of workers, one error "
              "state); after the last handle, a new one") {
        pss::ParameterServerStrategy<> strategy;  // 2 workers
        std::optional<pss::ClusterCoordinator> first(std::in_place, strategy);
        pss::ClusterCoordinator second(strategy);
        CHECK(*first == second);
        // Both schedule on the same 2 worker threads: never more than 2 closures at once.
        std::atomic<int> running{0}, most{0};
        auto step = [&] {
            const int now = ++running;
            for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            --running;
        };
        for (int i = 0; i < 4; ++i) {
            first->schedule(step);
            second.schedule(step);
        }
        second.join();  // waits for the closures the first scheduled too
        CHECK(first->done());
        CHECK(most.load() <= 2);  // two pools would run up to 4
        // An error is raised once, by whichever handle asks first.
        first->schedule([]() -> int { throw pss::InvalidArgumentError("pss: test: failed"); });
        CHECK_THROWS_WITH_AS(second.join(), "pss: test: failed", pss::InvalidArgumentError);
        CHECK(first->done());
        first.reset();
        CHECK(second.schedule([] { return 5; }).fetch() == 5);  // the pool lives while one handle does
        pss::ParameterServerStrategy<> other;
        CHECK_FALSE(pss::ClusterCoordinator(other) == second);
    }
    TEST_CASE("ClusterCoordinator: closures queued when another fails are cancelled then, not at the next join: "
              "fetching one does not wait") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 1>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy);
        std::latch release(1);
        auto failing = coordinator.schedule([&]() -> int {
            release.wait();
            throw pss::InvalidArgumentError("pss: step failed");
        });
        auto queued = coordinator.schedule([] { return 1; });
        release.count_down();
        for (int i = 0; i < 1000 && !queued.ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        REQUIRE(queued.ready());
        CHECK_THROWS_WITH_AS((void)queued.fetch(),
                             "pss: this closure was cancelled because an earlier closure failed; reschedule it",
                             pss::CancelledError);
        CHECK_THROWS_WITH_AS(coordinator.join(), "pss: step failed", pss::InvalidArgumentError);
        CHECK(coordinator.done());
    }
    TEST_CASE("ClusterCoordinator: schedule blocks while the queue is full") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 1>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy, 1);
        std::latch release(1);
        coordinator.schedule([&] { release.wait(); });  // the worker holds this one
        std::atomic<int> returned{0};
        std::jthread producer([&] {
            for (int i = 0; i < 3; ++i) {
                coordinator.schedule([] {});
                ++returned;
            }
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        CHECK(returned.load() <= 1);  // one fits in the queue; the next waits for room
        release.count_down();
        producer.join();
        coordinator.join();
        CHECK(returned.load() == 3);
    }
    TEST_CASE("ClusterCoordinator: a closure whose worker is lost runs again on another worker") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 2>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy);
        std::atomic<int> attempts{0};
        std::mutex mutex;
        std::set<int> workers_seen;
        auto value = coordinator.schedule([&] {
            {
                std::lock_guard lock(mutex);
                workers_seen.insert(pss::worker_index());
            }
            if (attempts.fetch_add(1) == 0) pss::ClusterCoordinator::testing_lose_current_worker();
            return 42;
        });
        CHECK(value.fetch() == 42);
        CHECK(attempts.load() == 2);
        CHECK(workers_seen.size() == 2);
        // Every later closure runs on the worker that is left.
        auto where = coordinator.schedule([] { return pss::worker_index(); });
        coordinator.join();
        CHECK(workers_seen.count(where.fetch()) == 1);
    }
    TEST_CASE("ClusterCoordinator: schedule_on runs a closure on its worker only, in order, even while that "
              "worker is busy and another is idle") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 2>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy);
        std::latch release(1);
        auto held = coordinator.schedule_on(1, [&] {
            release.wait();
            return pss::worker_index();
        });
        std::mutex mutex;
        std::vector<int> order;  // worker 1's closures, in the order they ran
        std::vector<pss::RemoteValue<int>> on_1, on_0;
        for (int i = 0; i < 3; ++i)
            on_1.push_back(coordinator.schedule_on(1, [&, i] {
                std::lock_guard lock(mutex);
                order.push_back(i);
                return pss::worker_index();
            }));
        for (int i = 0; i < 3; ++i) on_0.push_back(coordinator.schedule_on(0, [] { return pss::worker_index(); }));
        // Worker 0 is idle once its own are done, and still leaves worker 1's closures to worker 1.
        CHECK(pss::fetch(on_0) == std::vector<int>{0, 0, 0});
        CHECK(!on_1.front().ready());
        release.count_down();
        coordinator.join();
        CHECK(held.fetch() == 1);
        CHECK(pss::fetch(on_1) == std::vector<int>{1, 1, 1});
        CHECK(order == std::vector<int>{0, 1, 2});
        CHECK_THROWS_WITH_AS(coordinator.schedule_on(2, [] {}), "pss: ClusterCoordinator::schedule_on: worker 2 is not in [0, 2)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(coordinator.schedule_on(-1, [] {}),
                             "pss: ClusterCoordinator::schedule_on: worker -1 is not in [0, 2)", pss::InvalidArgumentError);
    }
    TEST_CASE("ClusterCoordinator: the closures for a lost worker, queued and later, run on the worker left") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 2>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy);
        std::latch release(1);
        std::atomic<int> attempts{0};
        auto lost = coordinator.schedule_on(0, [&] {
            release.wait();
            if (attempts.fetch_add(1) == 0) pss::ClusterCoordinator::testing_lose_current_worker();
            return pss::worker_index();
        });
        auto queued = coordinator.schedule_on(0, [] { return pss::worker_index(); });
        release.count_down();
        CHECK(lost.fetch() == 1);
        CHECK(queued.fetch() == 1);
        CHECK(coordinator.schedule_on(0, [] { return pss::worker_index(); }).fetch() == 1);
        coordinator.join();
        CHECK(attempts.load() == 2);
    }
    TEST_CASE("ClusterCoordinator: when every worker is lost, join says so instead of waiting forever") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 1>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy);
        auto lost = coordinator.schedule([] { pss::ClusterCoordinator::testing_lose_current_worker(); });
        CHECK_THROWS_WITH_AS(coordinator.join(),
                             "pss: ClusterCoordinator: every worker is lost and 1 closures are waiting; no worker is "
                             "left to run them",
                             pss::UnavailableError);
        // A worker of this process never comes back: the closure failed with the error, and nothing waits.
        CHECK_THROWS_WITH_AS(lost.fetch(), doctest::Contains("every worker is lost"), pss::UnavailableError);
        CHECK(coordinator.done());
        coordinator.join();
    }
    TEST_CASE("ClusterCoordinator: a per-worker dataset gives each closure its own worker's value") {
        pss::ParameterServerStrategy<> strategy;
        pss::ClusterCoordinator coordinator(strategy);
        auto datasets = coordinator.create_per_worker_dataset([](int worker) { return std::vector<int>{worker, 100}; });
        CHECK(datasets.size() == 2);
        std::vector<pss::RemoteValue<bool>> checks;
        for (int i = 0; i < 10; ++i)
            checks.push_back(coordinator.schedule(
                [](std::vector<int>& data) { return data[0] == pss::worker_index() && data[1] == 100; }, datasets));
        for (bool ok : pss::fetch(checks)) CHECK(ok);
    }
    TEST_CASE("register_function: a registered function is scheduled by name; a name is registered once") {
        static const auto doubled = pss::register_function("test_training.times_two", &times_two);
        CHECK(doubled.name() == "test_training.times_two");
        CHECK_THROWS_WITH_AS(pss::register_function("test_training.times_two", &times_two),
                             "pss: register_function: a function named \"test_training.times_two\" is registered "
                             "already; names must be unique in a process",
                             pss::AlreadyExistsError);
        pss::ParameterServerStrategy<> strategy;
        pss::ClusterCoordinator coordinator(strategy);
        auto result = coordinator.schedule(doubled, std::int64_t{21});
        CHECK(result.fetch() == 42);
        static_assert(pss::Transferable<std::vector<xt::xarray<float>>>);
        static_assert(pss::Transferable<std::string>);
        static_assert(!pss::Transferable<std::mutex*>);
    }
}

namespace {
std::string describe_values(std::vector<std::int32_t> counts, std::string label, xt::xarray<double> values, bool flag) {
    double sum = 0;
    for (double v : values) sum += v;
    return label + ":" + std::to_string(counts.size()) + ":" + std::to_string(counts.empty() ? 0 : counts.back()) +
           ":" + std::to_string(sum) + ":" + (flag ? "yes" : "no");
}
double throws_out_of_range(double) { throw pss::OutOfRangeError("pss: test: id 9 is out of range"); }
double throws_std(double) { throw std::runtime_error("plain failure"); }
int worker_of_call() { return pss::worker_index(); }
float read_whole(pss::Variable v) { return xt::sum(v.read<float>())(); }
float read_into_buffer(pss::Variable v) {
    xt::xarray<float> out;
    v.read_into(out);
    return xt::sum(out)();
}
float gather_rows(pss::Variable v) { return xt::sum(v.sparse_read(std::vector<std::int64_t>{0, 2}).get<float>())(); }

/// A handle as a stranger would forge it: the id and tasks of `real`, but the shape `claimed`, its rows
/// split as `rows_of` says.
pss::Values forged_handle(const pss::Variable& real, const pss::Shape& claimed, const std::vector<std::size_t>& rows_of) {
    auto info = std::make_shared<pss::detail::VariableInfo>();
    info->name = "forged";
    info->id = real.id();
    info->dtype = real.dtype();
    info->shape = claimed;
    info->channel = pss::detail::Codec<pss::Variable>::channel_of(real);
    info->borrowed = true;
    std::size_t offset = 0;
    for (std::uint32_t i = 0; i < rows_of.size(); ++i) {
        pss::Shape shape = claimed;
        if (!shape.empty()) shape[0] = rows_of[i];
        info->shards.push_back({i, real.shard_tasks()[i], shape, offset, real.id()});
        offset += rows_of[i];
    }
    return pss::detail::encode_values(pss::Variable(std::move(info)));
}

/// Runs a registered function as a worker process would, on `arguments` encoded here.
template <class R>
R call_as_worker(const std::string& name, pss::Values arguments, std::shared_ptr<pss::detail::Channel> channel = {},
                 int worker = 1) {
    pss::Values answer = pss::detail::run_call(name, std::move(arguments), pss::detail::CallContext{std::move(channel), worker});
    return pss::detail::decode_result<R>(std::move(answer), name);
}

/// Values as a peer could send them: hand-written CBOR items and the tensors beside them.
pss::Values values_of(const nlohmann::json& items, std::vector<pss::Tensor> tensors = {}) {
    return pss::Values{nlohmann::json::to_cbor(items), std::move(tensors)};
}

/// `v` through a call's encoding and back, as one argument.
template <class T>
T round_trip(const T& v) {
    const pss::detail::CallContext none;
    pss::detail::ValuesReader reader(pss::detail::encode_values(v), "test", none);
    T back = pss::detail::Codec<T>::decode(reader, reader.next("a value"));
    reader.finish();
    return back;
}

/// The message of the InvalidArgumentError that decoding `values` as a T raises ("" when none).
template <class T>
std::string decode_error(pss::Values values) {
    const pss::detail::CallContext none;
    try {
        pss::detail::ValuesReader reader(std::move(values), "test", none);
        (void)pss::detail::Codec<T>::decode(reader, reader.next("a value"));
        reader.finish();
    } catch (const pss::InvalidArgumentError& e) {
        return e.what();
    }
    return "";
}

/// "127.0.0.1:port" of a port the system just gave and released, for a cluster spec whose addresses are
/// fixed before any task listens, as every process of a real cluster reads them.
std::string free_loopback_address() {
    asio::io_context io;
    asio::ip::tcp::acceptor probe(io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    return "127.0.0.1:" + std::to_string(probe.local_endpoint().port());
}

}  // namespace

TEST_SUITE("Remote calls") {
    TEST_CASE("Codec: numbers, strings, vectors, arrays and flags round-trip exactly through a call's values") {
        static const auto describe = pss::register_function("test_training.describe_values", &describe_values);
        const auto args = pss::detail::encode_values(std::vector<std::int32_t>{4, 5, -6}, std::string("label"),
                                                     xt::xarray<double>{{1.5, 2.25}, {-0.75, 4}}, true);
        CHECK(args.tensors.size() == 1);  // the array travels beside the CBOR, not inside it
        CHECK(call_as_worker<std::string>(describe.name(), args) == "label:3:-6:7.000000:yes");
        const auto array = round_trip(xt::xarray<float>{{1, 2, 3}});
        CHECK(array == xt::xarray<float>{{1, 2, 3}});
        CHECK(array.shape()[0] == 1);
        CHECK(round_trip(std::vector<std::string>{"a", "", "ccc", std::string("\xff\x00z", 3)}) ==
              std::vector<std::string>{"a", "", "ccc", std::string("\xff\x00z", 3)});  // any bytes, not only UTF-8
        CHECK(round_trip(std::uint64_t{1} << 60) == (std::uint64_t{1} << 60));
        CHECK(round_trip(std::int64_t{-(std::int64_t{1} << 62)}) == -(std::int64_t{1} << 62));
        CHECK(round_trip(std::int8_t{-128}) == -128);
        CHECK(round_trip(0.1f) == 0.1f);
        CHECK(round_trip(-0.0) == 0.0);
        CHECK(std::signbit(round_trip(-0.0)));
        CHECK(std::isnan(round_trip(std::numeric_limits<double>::quiet_NaN())));
        // Every dtype, an empty batch (0, 4) and an empty Tensor round-trip; an int64 array keeps its values.
        CHECK(round_trip(xt::xarray<std::int64_t>{-(1ll << 40), 3}) == xt::xarray<std::int64_t>{-(1ll << 40), 3});
        CHECK(round_trip(xt::xarray<std::int32_t>{7}) == xt::xarray<std::int32_t>{7});
        const auto empty = round_trip(xt::xarray<double>(xt::zeros<double>({0, 4})));
        CHECK(pss::Shape(empty.shape().begin(), empty.shape().end()) == pss::Shape{0, 4});
        CHECK(!round_trip(pss::Tensor()).has_value());
        CHECK(round_trip(std::vector<pss::Tensor>{pss::Tensor(xt::xarray<float>{1}), pss::Tensor(xt::xarray<float>{2})})[1]
                  .get<float>() == xt::xarray<float>{2});
    }
    TEST_CASE("Codec: a value of another type or out of range, a bad tensor reference, deep nesting, bytes that are "
              "not CBOR, a truncated list or extra values are an InvalidArgumentError") {
        const std::string malformed = "pss: test: the encoded values are malformed: ";
        const std::string hint = "; is the function registered with the same signature in every process?";
        CHECK(decode_error<bool>(values_of({2})) == malformed + "expected a bool, found number" + hint);
        CHECK(decode_error<std::int32_t>(values_of({std::int64_t{1} << 40})) ==
              malformed + "expected an integer of 32 bits, found 1099511627776, out of its range" + hint);
        CHECK(decode_error<std::uint8_t>(values_of({-1})) ==
              malformed + "expected an integer of 8 bits, unsigned, found -1, out of its range" + hint);
        CHECK(decode_error<std::int32_t>(values_of({1.5})) == malformed + "expected an integer of 32 bits, found number" + hint);
        CHECK(decode_error<double>(values_of({1})) == malformed + "expected a floating-point number, found number" + hint);
        CHECK(decode_error<std::string>(values_of({"text"})) == malformed + "expected a string, found string" + hint);
        CHECK(decode_error<std::vector<int>>(values_of({7})) == malformed + "expected a vector, found number" + hint);
        CHECK(decode_error<pss::Tensor>(values_of({{{"tensor", 1}}}, {pss::Tensor(xt::xarray<float>{1})})) ==
              malformed + "a tensor reference 1 names no tensor of the 1 sent, or one taken already");
        CHECK(decode_error<std::vector<pss::Tensor>>(
                  values_of({{{{"tensor", 0}}, {{"tensor", 0}}}}, {pss::Tensor(xt::xarray<float>{1})})) ==
              malformed + "a tensor reference 0 names no tensor of the 1 sent, or one taken already");
        CHECK(decode_error<pss::Tensor>(values_of({{{"tensor", -1}}}, {pss::Tensor(xt::xarray<float>{1})})) ==
              malformed + "a tensor reference -1 names no tensor of the 1 sent, or one taken already");
        // Text that is not UTF-8 (nlohmann's dump() throws for it) is named with U+FFFD in its place (found by
        // tools/fuzz.sh: it was an internal error).
        CHECK(decode_error<pss::Tensor>(values_of({{{"tensor", std::string("\xa1")}}}, {pss::Tensor(xt::xarray<float>{1})})) ==
              malformed + "a tensor reference \"\xef\xbf\xbd\" names no tensor of the 1 sent, or one taken already");
        CHECK(decode_error<pss::Tensor>(values_of({{{"tensor", 0}}}, {pss::Tensor(xt::xarray<float>{1}),
                                                                        pss::Tensor(xt::xarray<float>{2})})) ==
              malformed + "tensor 1 of the 2 sent is not used");
        CHECK(decode_error<xt::xarray<double>>(values_of({{{"tensor", 0}}}, {pss::Tensor(xt::xarray<float>{1})})) ==
              malformed + "expected an array of float64, got float32");
        CHECK(decode_error<int>(values_of({1, 2})) == malformed + "1 values are left over");
        CHECK(decode_error<int>(values_of(nlohmann::json::array())) ==
              malformed + "they end early: a value was expected after 0 values");
        CHECK(decode_error<int>(values_of({{"not", "an array"}})) == malformed + "they are object, not an array of values");
        std::vector<std::uint8_t> deep(100000, 0x81);  // 100,000 nested one-element arrays
        deep.push_back(0x01);
        CHECK(decode_error<int>(pss::Values{deep, {}}) == malformed + "they nest deeper than 64 levels");
        CHECK(decode_error<int>(pss::Values{{0xff, 0x00}, {}}).starts_with(malformed + "they are not CBOR ("));
        // Every prefix of a good encoding fails cleanly.
        static const auto describe = pss::register_function("test_training.describe_values_2", &describe_values);
        const auto full = pss::detail::encode_values(std::vector<std::int32_t>{1, 2}, std::string("xy"),
                                                     xt::xarray<double>{3}, false);
        CHECK(call_as_worker<std::string>(describe.name(), full) == "xy:2:2:3.000000:no");
        for (std::size_t n = 0; n < full.cbor.size(); ++n)
            CHECK_THROWS_AS(call_as_worker<std::string>(
                                describe.name(), pss::Values{{full.cbor.begin(), full.cbor.begin() + static_cast<std::ptrdiff_t>(n)},
                                                             full.tensors}),
                            pss::InvalidArgumentError);
        const std::string wrong_type = "pss: call of \"test_training.describe_values_2\": the encoded values are "
                                       "malformed: expected a vector, found number" + hint;
        CHECK_THROWS_WITH_AS(call_as_worker<std::string>(describe.name(), pss::detail::encode_values(7)),
                             wrong_type.c_str(), pss::InvalidArgumentError);
    }
    TEST_CASE("run_call: errors come back as their Error type with their message; an unknown name is NotFoundError") {
        static const auto range = pss::register_function("test_training.throws_out_of_range", &throws_out_of_range);
        static const auto plain = pss::register_function("test_training.throws_std", &throws_std);
        static const auto which = pss::register_function("test_training.worker_of_call", &worker_of_call);
        CHECK_THROWS_WITH_AS(call_as_worker<double>(range.name(), pss::detail::encode_values(1.0)),
                             "pss: test: id 9 is out of range", pss::OutOfRangeError);
        CHECK_THROWS_WITH_AS(call_as_worker<double>(plain.name(), pss::detail::encode_values(1.0)),
                             "pss: worker 1: \"test_training.throws_std\" threw: plain failure", pss::InternalError);
        CHECK_THROWS_WITH_AS(call_as_worker<double>("test_training.nobody", pss::detail::encode_values(1.0)),
                             "pss: worker 1: no function is registered as \"test_training.nobody\" in this process; "
                             "call register_function at start-up in every process",
                             pss::NotFoundError);
        CHECK(call_as_worker<int>(which.name(), pss::detail::encode_values(), {}, 1) == -1);  // set by the server, not here
    }
    TEST_CASE("Codec: a Variable crosses as a handle that reaches the same shards and never destroys them") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner> strategy(
            {}, pss::FixedShardsPartitioner(2));
        auto scope = strategy.scope();
        pss::Variable table(xt::xarray<float>{{1, 2}, {3, 4}, {5, 6}}, "table");
        const pss::Values handle = pss::detail::encode_values(table);
        std::shared_ptr<pss::detail::Channel> channel = pss::detail::Codec<pss::Variable>::channel_of(table);
        const pss::detail::CallContext context{channel, 0};
        auto decode = [&](pss::Values values, const pss::detail::CallContext& c) {
            pss::detail::ValuesReader r(std::move(values), "test", c);
            return pss::detail::Codec<pss::Variable>::decode(r, r.next("a Variable"));
        };
        {
            pss::Variable copy = decode(handle, context);
            CHECK(copy.name() == "table:0");
            CHECK(copy.shard_tasks() == std::vector<int>{0, 1});
            copy.scatter_add(std::vector<std::int64_t>{2}, xt::xarray<float>{{10, 10}});
        }  // the received handle is gone: the shards stay
        CHECK(table.read<float>() == xt::xarray<float>{{1, 2}, {3, 4}, {15, 16}});
        // Shards that do not tile the rows are refused before any handle exists.
        nlohmann::json items = nlohmann::json::from_cbor(handle.cbor);
        items[0]["variable"]["shards"][1][3] = 9;  // the last shard's row count
        CHECK_THROWS_WITH_AS(decode(values_of(items), context),
                             doctest::Contains("shard 1 (index 1, task 1, rows 2 + 9) is not how 2 shards split shape (3, 2)"),
                             pss::InvalidArgumentError);
        items[0]["variable"]["shards"][1][1] = -1;
        CHECK_THROWS_WITH_AS(decode(values_of(items), context), doctest::Contains("(index 1, task -1, rows 2 + 9)"),
                             pss::InvalidArgumentError);
        items[0]["variable"]["dtype"] = "float32";
        CHECK_THROWS_WITH_AS(decode(values_of(items), context),
                             doctest::Contains("a Variable handle's \"dtype\" is missing or not a dtype code"),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(decode(handle, pss::detail::CallContext{}),
                             doctest::Contains("a Variable reached a process that has no cluster"), pss::InvalidArgumentError);
        // Its compression crosses with it; a code that is not one, or on another dtype, is refused.
        table.set_compression(pss::Compression::float16);
        const pss::Values compressed = pss::detail::encode_values(table);
        CHECK(decode(compressed, context).compression() == pss::Compression::float16);
        CHECK(decode(handle, context).compression() == pss::Compression::none);
        nlohmann::json forged = nlohmann::json::from_cbor(compressed.cbor);
        forged[0]["variable"]["compression"] = 3;
        CHECK_THROWS_WITH_AS(decode(values_of(forged), context),
                             doctest::Contains("compression code 3 is not 1 (bfloat16) or 2 (float16) of a float32 variable"),
                             pss::InvalidArgumentError);
        forged[0]["variable"]["compression"] = 1;
        forged[0]["variable"]["dtype"] = static_cast<int>(pss::DType::float64);
        CHECK_THROWS_WITH_AS(decode(values_of(forged), context), doctest::Contains("compression code 1 is not"),
                             pss::InvalidArgumentError);
        forged[0]["variable"]["extra"] = 1;
        CHECK_THROWS_WITH_AS(decode(values_of(forged), context),
                             doctest::Contains("other fields than id, name, dtype, shape, shards and compression"),
                             pss::InvalidArgumentError);
    }
    TEST_CASE("Codec: a ShardedVariable built from a list crosses to a worker, which reaches its parts") {
        pss::ParameterServerStrategy<> strategy;
        auto scope = strategy.scope();
        pss::Variable a(xt::xarray<float>{{1, 2}}, "a");          // ps 0
        pss::Variable b(xt::xarray<float>{{3, 4}, {5, 6}}, "b");  // ps 1
        pss::ShardedVariable s({a, b}, "s");  // rows 1 and 2: not the partitioners' 2 and 1
        const pss::detail::CallContext context{pss::detail::Codec<pss::Variable>::channel_of(s), 0};
        pss::detail::ValuesReader reader(pss::detail::encode_values(s), "test", context);
        {
            pss::Variable copy = pss::detail::Codec<pss::Variable>::decode(reader, reader.next("a Variable"));
            CHECK(copy.shape() == pss::Shape{3, 2});
            CHECK(copy.shard_tasks() == std::vector<int>{0, 1});
            CHECK(copy.sparse_read(std::vector<std::int64_t>{2, 0}).get<float>() == xt::xarray<float>{{5, 6}, {1, 2}});
            copy.scatter_add(std::vector<std::int64_t>{1, 2}, xt::xarray<float>{{10, 10}, {20, 20}});
        }  // the worker's handle is gone: the parts stay
        CHECK(b.read<float>() == xt::xarray<float>{{13, 14}, {25, 26}});
        CHECK(a.read<float>() == xt::xarray<float>{{1, 2}});
    }
    TEST_CASE("Codec: a forged Variable handle whose shape lies is refused before any byte is copied by its shape "
              "(was a heap overflow on the worker)") {
        static const auto whole = pss::register_function("test_training.read_whole", &read_whole);
        static const auto into = pss::register_function("test_training.read_into_buffer", &read_into_buffer);
        static const auto gather = pss::register_function("test_training.gather_rows", &gather_rows);
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner> strategy(
            {}, pss::FixedShardsPartitioner(2));
        auto scope = strategy.scope();
        pss::Variable table(xt::xarray<float>{{1, 2}, {3, 4}, {5, 6}}, "table");  // shards of 2 and 1 rows
        const auto channel = pss::detail::Codec<pss::Variable>::channel_of(table);
        pss::ParameterServerStrategy<> unpartitioned;
        const pss::Variable single = [&] {
            auto unpartitioned_scope = unpartitioned.scope();
            return pss::Variable(xt::xarray<float>{1, 2, 3, 4}, "single");  // one shard
        }();
        const auto single_channel = pss::detail::Codec<pss::Variable>::channel_of(single);
        // The honest handle works.
        CHECK(call_as_worker<float>(whole.name(), forged_handle(table, {3, 2}, {2, 1}), channel) == 21.0f);
        CHECK(call_as_worker<float>(gather.name(), forged_handle(table, {3, 2}, {2, 1}), channel) == 14.0f);
        // Rows narrower than the real ones: the shards' bytes would overflow a buffer of 3 x 1 floats.
        CHECK_THROWS_WITH_AS(call_as_worker<float>(whole.name(), forged_handle(table, {3, 1}, {2, 1}), channel),
                             "pss: read on variable 'forged:0': shard 0 answered shape (2, 2) dtype float32 where shape "
                             "(2, 1) dtype float32 was asked for; this handle does not describe the variable its "
                             "parameter servers hold",
                             pss::InvalidArgumentError);
        // Rows wider than the real ones: copying rows of 64 floats would read past the reply.
        CHECK_THROWS_WITH_AS(call_as_worker<float>(gather.name(), forged_handle(table, {3, 64}, {2, 1}), channel),
                             doctest::Contains("sparse_read on variable 'forged:0': shard 0 answered shape (1, 2) dtype "
                                               "float32 where shape (1, 64) dtype float32 was asked for"),
                             pss::InvalidArgumentError);
        // Another split of the same rows than every strategy makes (TensorFlow's): refused when decoded.
        CHECK_THROWS_WITH_AS(call_as_worker<float>(whole.name(), forged_handle(table, {3, 2}, {1, 2}), channel),
                             doctest::Contains("shard 0 (index 0, task 0, rows 0 + 1) is not how 2 shards split shape (3, 2)"),
                             pss::InvalidArgumentError);
        // One shard, through read_into: the reply must have the claimed shape too.
        CHECK(call_as_worker<float>(into.name(), forged_handle(single, {4}, {4}), single_channel) == 10.0f);
        CHECK_THROWS_WITH_AS(call_as_worker<float>(into.name(), forged_handle(single, {2}, {2}), single_channel),
                             doctest::Contains("shard 0 answered shape (4,) dtype float32 where shape (2,) dtype "
                                               "float32 was asked for"),
                             pss::InvalidArgumentError);
        // A shape whose element count overflows is refused when the handle is decoded.
        CHECK_THROWS_WITH_AS(
            call_as_worker<float>(whole.name(), forged_handle(single, {std::size_t{1} << 32, std::size_t{1} << 32}, {std::size_t{1} << 32}), single_channel),
            doctest::Contains("a Variable of shape (4294967296, 4294967296) has too many elements"),
            pss::InvalidArgumentError);
        // Nothing changed.
        CHECK(table.read<float>() == xt::xarray<float>{{1, 2}, {3, 4}, {5, 6}});
        CHECK(single.read<float>() == xt::xarray<float>{1, 2, 3, 4});
    }
    TEST_CASE("ParameterServerStrategy: with TCP, a resolver naming no task keeps the cluster in this process; a ps "
              "task's process refuses to create variables" *
              doctest::timeout(30)) {
        const pss::ClusterSpec spec{{"chief", {"127.0.0.1:0"}}, {"ps", {"127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}};
        using S = pss::ParameterServerStrategy<pss::TcpTransport, pss::NoPartitioner, pss::SGD, pss::SimpleClusterResolver>;
        S whole{pss::SimpleClusterResolver(spec)};  // no task type: the whole cluster in this process
        CHECK(whole.is_chief());
        CHECK(!whole.is_distributed());
        CHECK(whole.task().to_string() == "/job:chief/replica:0/task:0");
        S ps{pss::SimpleClusterResolver(spec, "ps", 0)};
        CHECK(ps.is_distributed());
        CHECK(!ps.is_chief());
        auto scope = ps.scope();
        CHECK_THROWS_WITH_AS(pss::Variable(xt::xarray<float>{1}, "w"),
                             "pss: variable 'w': this process is task /job:ps/replica:0/task:0; variables are created by "
                             "the chief. A ps or worker process calls strategy.join() and serves until the chief ends "
                             "the cluster",
                             pss::FailedPreconditionError);
        // rpc_layer "inproc" keeps the whole cluster here even when the resolver names a task.
        S named_inproc{pss::SimpleClusterResolver(spec, "ps", 0, "inproc")};
        CHECK(named_inproc.is_chief());
        CHECK(!named_inproc.is_distributed());
    }
    TEST_CASE("ParameterServerStrategy: a chief or worker whose optimizer or consistency differs from a ps's is "
              "refused as it starts, with each part as both tasks run it" *
              doctest::timeout(60)) {
        const pss::ClusterSpec spec{{"chief", {free_loopback_address()}},
                                    {"ps", {free_loopback_address()}},
                                    {"worker", {free_loopback_address()}}};
        using S = pss::ParameterServerStrategy<pss::TcpTransport, pss::NoPartitioner, pss::SGD, pss::SimpleClusterResolver>;
        using Sync = pss::ParameterServerStrategy<pss::TcpTransport, pss::NoPartitioner, pss::SGD,
                                                  pss::SimpleClusterResolver, pss::Synchronous>;
        S ps{pss::SimpleClusterResolver(spec, "ps", 0), {}, pss::SGD(0.5)};
        CHECK_THROWS_WITH_AS(S(pss::SimpleClusterResolver(spec, "chief", 0), {}, pss::SGD(0.25)),
                             "pss: /job:chief/replica:0/task:0 and /job:ps/replica:0/task:0 run different "
                             "configurations: optimizer {\"config\":{\"learning_rate\":0.25,\"name\":\"SGD\"},"
                             "\"name\":\"SGD\"} on /job:chief/replica:0/task:0, {\"config\":{\"learning_rate\":0.5,"
                             "\"name\":\"SGD\"},\"name\":\"SGD\"} on /job:ps/replica:0/task:0. Every task of a "
                             "cluster must run the same optimizer, consistency and cluster",
                             pss::FailedPreconditionError);
        CHECK_THROWS_WITH_AS(Sync(pss::SimpleClusterResolver(spec, "worker", 0), {}, pss::SGD(0.5)),
                             "pss: /job:worker/replica:0/task:0 and /job:ps/replica:0/task:0 run different "
                             "configurations: consistency {\"staleness\":0,\"synchronous\":true} on "
                             "/job:worker/replica:0/task:0, {\"staleness\":0,\"synchronous\":false} on "
                             "/job:ps/replica:0/task:0. Every task of a cluster must run the same optimizer, "
                             "consistency and cluster",
                             pss::FailedPreconditionError);
        // The same configuration starts, and trains with the ps's optimizer as it always did.
        S chief{pss::SimpleClusterResolver(spec, "chief", 0), {}, pss::SGD(0.5)};
        auto scope = chief.scope();
        pss::Variable w(xt::xarray<float>{1, 2}, "w");
        w.apply_gradient(xt::xarray<float>{2, 2});
        CHECK(w.read<float>() == xt::xarray<float>{0, 1});
    }
    TEST_CASE("ParameterServerStrategy: a worker that the chief ends while it greets the ps tasks starts as "
              "stopped, and its join() returns at once" *
              doctest::timeout(60)) {
        const pss::ClusterSpec spec{{"chief", {free_loopback_address()}},
                                    {"ps", {free_loopback_address()}},
                                    {"worker", {free_loopback_address()}}};
        // A ps task as a short program's worker meets it: the chief ends this worker while its greeting is
        // at the ps, and the ps goes before it answers (here: it answers that greeting with the error a lost
        // connection gives).
        pss::TcpTransport chief(spec);
        pss::TcpTransport ps(spec);
        std::atomic<int> greetings{0};
        ps.serve({"ps", 0}, pss::answer_at_once([&](pss::Request&& r) {
            if (r.name != pss::detail::handshake_call) return pss::Reply{};
            ++greetings;
            pss::Request stop;
            stop.kind = pss::RequestKind::shutdown;
            CHECK(chief.send({"worker", 0}, std::move(stop)).get().ok());
            pss::Reply lost;
            lost.code = pss::ErrorCode::unavailable;
            lost.message = "the connection to /job:ps/replica:0/task:0 was lost";
            return lost;
        }));
        using S = pss::ParameterServerStrategy<pss::TcpTransport, pss::NoPartitioner, pss::SGD, pss::SimpleClusterResolver>;
        S worker{pss::SimpleClusterResolver(spec, "worker", 0)};  // threw that UnavailableError before
        CHECK(greetings == 1);
        CHECK(!worker.is_chief());
        CHECK(worker.is_distributed());
        worker.join();
    }
    TEST_CASE("AutoTransport: threads for the embedded cluster, TCP for host:port addresses, and never a mix" *
              doctest::timeout(30)) {
        pss::AutoTransport embedded(pss::LocalClusterResolver<2, 2>{}.cluster_spec());
        CHECK(embedded.in_process());
        pss::AutoTransport tcp(pss::ClusterSpec{{"ps", {"127.0.0.1:0"}}, {"worker", {"127.0.0.1:0"}}});
        CHECK(!tcp.in_process());
        CHECK_THROWS_WITH_AS(pss::AutoTransport(pss::ClusterSpec{{"ps", {"inproc:ps:0"}}, {"worker", {"127.0.0.1:0"}}}),
                             "pss: AutoTransport: 1 of the 2 addresses of the cluster are embedded (\"inproc:...\") "
                             "and the others are not; a cluster runs in one process or over the network, not both",
                             pss::InvalidArgumentError);
        // The strategy uses the Transport it is given: TcpTransport refuses the embedded addresses.
        using TcpLocal = pss::ParameterServerStrategy<pss::TcpTransport>;
        CHECK_THROWS_WITH_AS(TcpLocal{},
                             "pss: TcpTransport: task /job:ps/replica:0/task:0 has address \"inproc:ps:0\", an embedded "
                             "cluster's (threads of one process); TcpTransport reaches \"host:port\" addresses. Use "
                             "InProcessTransport for the embedded cluster, or AutoTransport (ClusterStrategy) for a "
                             "program that runs either way",
                             pss::InvalidArgumentError);
        static_assert(pss::detail::transport_crosses_processes<pss::TcpTransport>);
        static_assert(pss::detail::transport_crosses_processes<pss::AutoTransport>);
        static_assert(!pss::detail::transport_crosses_processes<pss::InProcessTransport>);
        pss::ClusterStrategy<> alone;  // no launcher in this test's environment: the embedded cluster
        CHECK(!alone.is_distributed());
        auto scope = alone.scope();
        pss::Variable v(xt::xarray<float>{1, 2}, "v");
        v.assign_add(xt::xarray<float>{1, 1});
        CHECK(v.read<float>() == xt::xarray<float>{2, 3});
    }
}

TEST_SUITE("Consistency") {
    TEST_CASE("Synchronous: 2 workers on half-batches give the weights of 1 worker on whole batches") {
        const auto one = train_linear<pss::Synchronous, 1>(24);
        const auto two = train_linear<pss::Synchronous, 2>(24);
        for (std::size_t i = 0; i < 3; ++i) CHECK(two(i) == doctest::Approx(one(i)).epsilon(1e-6));
        CHECK(one(0) != 0.0);
    }
    TEST_CASE("BoundedStaleness<1>: training converges to the same weights within 1e-3") {
        const auto sync = train_linear<pss::Synchronous, 2>(200);
        const auto stale = train_linear<pss::BoundedStaleness<1>, 2>(200);
        for (std::size_t i = 0; i < 3; ++i) CHECK(stale(i) == doctest::Approx(sync(i)).epsilon(1e-3));
        CHECK(sync(0) == doctest::Approx(1.5).epsilon(1e-3));
    }
    TEST_CASE("Synchronous: a pull for step 2 waits until every worker has pushed step 1") {
        LinearStrategy<pss::Synchronous, 2> strategy({}, {}, pss::SGD(1.0));
        pss::Variable w = [&] {
            auto scope = strategy.scope();
            return pss::Variable(xt::xarray<float>{0}, "w");
        }();
        w.apply_gradient(xt::xarray<float>{2}, 1);  // worker 0's step 1
        std::atomic<bool> pulled{false};
        std::jthread waiter([&] {
            CHECK(w.read<float>(2)(0) == -3.0f);  // (2 + 4) / 2 workers, times learning rate 1
            pulled = true;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK_FALSE(pulled.load());
        CHECK(w.read<float>(1)(0) == 0.0f);  // step 1's pull needs nothing applied
        w.apply_gradient(xt::xarray<float>{4}, 1);  // worker 1's step 1 completes the step
        waiter.join();
        CHECK(pulled.load());
    }
    TEST_CASE("BoundedStaleness<1>: a pull may run one step ahead of the applied steps, not two") {
        LinearStrategy<pss::BoundedStaleness<1>, 2> strategy({}, {}, pss::SGD(1.0));
        pss::Variable w = [&] {
            auto scope = strategy.scope();
            return pss::Variable(xt::xarray<float>{0}, "w");
        }();
        w.apply_gradient(xt::xarray<float>{2}, 1);
        CHECK(w.read<float>(2)(0) == 0.0f);  // step 1 not applied, allowed by staleness 1
        w.apply_gradient(xt::xarray<float>{2}, 2);  // the fast worker pushes step 2 already
        std::atomic<bool> pulled{false};
        std::jthread waiter([&] {
            CHECK(w.read<float>(3)(0) == -2.0f);
            pulled = true;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK_FALSE(pulled.load());
        w.apply_gradient(xt::xarray<float>{2}, 1);  // the slow worker's step 1: step 1 applies
        waiter.join();
        CHECK_THROWS_WITH_AS(w.apply_gradient(xt::xarray<float>{2}, 1),
                             "pss: apply_gradient on variable 'w': step 1 is applied already; a worker pushed twice, "
                             "or too late",
                             pss::InvalidArgumentError);
    }
    TEST_CASE("Synchronous: when one worker's step fails, another worker's wait for that step is abandoned") {
        LinearStrategy<pss::Synchronous, 2> strategy({}, {}, pss::SGD(1.0));
        pss::Variable w = [&] {
            auto scope = strategy.scope();
            return pss::Variable(xt::xarray<float>{0}, "w");
        }();
        pss::ClusterCoordinator coordinator(strategy);
        std::latch both_running(2);  // so that the two closures run on the two workers at once
        auto waiting = coordinator.schedule([&] {
            both_running.arrive_and_wait();
            w.apply_gradient(xt::xarray<float>{1}, 1);
            return w.read<float>(2)(0);  // step 1 never completes: the other worker fails before its push
        });
        auto failing = coordinator.schedule([&]() -> float {
            both_running.arrive_and_wait();
            throw pss::InvalidArgumentError("pss: worker step failed");
        });
        CHECK_THROWS_WITH_AS(coordinator.join(), "pss: worker step failed", pss::InvalidArgumentError);
        // Cancelled at its push or its pull (not sent), or in its pull (abandoned), whichever it had reached.
        std::string cancelled;
        try {
            (void)waiting.fetch();
        } catch (const pss::CancelledError& e) {
            cancelled = e.what();
        }
        INFO(cancelled);
        CHECK((cancelled == "pss: read on variable 'w:0' for step 2 was abandoned: another closure failed, so the "
                            "step may never complete" ||
               cancelled.starts_with("pss: apply_gradient on variable 'w:0' was not sent: another closure failed") ||
               cancelled.starts_with("pss: read on variable 'w:0' was not sent: another closure failed")));
    }
    TEST_CASE("Synchronous: a pull waiting for a step is answered UnavailableError when the strategy shuts down") {
        auto strategy = std::make_unique<LinearStrategy<pss::Synchronous, 2>>(pss::LocalClusterResolver<2, 2>{},
                                                                               pss::NoPartitioner{}, pss::SGD(1.0));
        pss::Variable w = [&] {
            auto scope = strategy->scope();
            return pss::Variable(xt::xarray<float>{0}, "w");
        }();
        w.apply_gradient(xt::xarray<float>{2}, 1);  // worker 1 never pushes step 1
        std::atomic<bool> answered{false};
        std::jthread waiter([&] {
            CHECK_THROWS_WITH_AS((void)w.read<float>(2),
                                 doctest::Contains("for step 2 was waiting when the parameter server shut down"),
                                 pss::UnavailableError);
            answered = true;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK_FALSE(answered.load());  // held at the ps, not refused
        strategy.reset();
        waiter.join();
        CHECK(answered.load());
    }
    TEST_CASE("Synchronous: a push without its step is refused") {
        LinearStrategy<pss::Synchronous, 2> strategy;
        auto scope = strategy.scope();
        pss::Variable w(xt::xarray<float>{0}, "w");
        CHECK_THROWS_WITH_AS(w.apply_gradient(xt::xarray<float>{1}),
                             "pss: apply_gradient on variable 'w': training is synchronous, so every push must name "
                             "its step (1, 2, ...)",
                             pss::FailedPreconditionError);
        CHECK(w.read<float>()(0) == 0.0f);
    }
    TEST_CASE("Synchronous: sparse pushes of a step are summed over workers, then averaged, on a sharded variable") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<2, 2>, pss::Synchronous>
            strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(1.0));
        auto scope = strategy.scope();
        pss::Variable table(xt::xarray<float>(xt::zeros<float>({4, 1})), "table");
        std::vector<std::int64_t> first{0, 0}, second{3};
        table.apply_sparse_gradient(first, xt::xarray<float>(xt::ones<float>({2, 1})), 1);  // worker 0: shard 0 rows
        table.apply_sparse_gradient(second, xt::xarray<float>(xt::ones<float>({1, 1}) * 4.0f), 1);  // worker 1: shard 1
        const auto got = table.read<float>(2);
        CHECK(got(0, 0) == -1.0f);  // (1 + 1) / 2 workers
        CHECK(got(1, 0) == 0.0f);
        CHECK(got(2, 0) == 0.0f);
        CHECK(got(3, 0) == -2.0f);  // 4 / 2 workers
    }
    TEST_CASE("Synchronous: a proven worker counts once a step; the chief's empty pushes each count (TLS, 3 workers)") {
        pss::ParameterServer<pss::SGD> ps(pss::SGD(1.0), {.synchronous = true, .workers = 3});
        auto push = [&](std::uint64_t step, pss::TaskId sender, float g) {
            pss::Request r;
            r.op = pss::Op::apply_dense;
            r.key = {1, 0};
            r.step = step;
            r.payload = xt::xarray<float>{g};
            r.sender = std::move(sender);
            return ps.handle(std::move(r));
        };
        auto value = [&] {
            pss::Request r;
            r.key = {1, 0};
            return ps.handle(std::move(r)).payload.get<float>()(0);
        };
        pss::Request create;
        create.op = pss::Op::create;
        create.key = {1, 0};
        create.name = "w";
        create.payload = xt::xarray<float>{0};
        REQUIRE(ps.handle(std::move(create)).ok());
        // Step 1: worker 0 pushes twice (a closure run again), so the step still waits for two more.
        CHECK(push(1, {"worker", 0}, 3).ok());
        CHECK(push(1, {"worker", 0}, 3).ok());
        CHECK(value() == 0.0f);
        // A failed fit: workers 1 and 2 never ran step 1, and the chief pushes nothing for each of them.
        CHECK(push(1, {"chief", 0}, 0).ok());
        CHECK(value() == 0.0f);
        CHECK(push(1, {"chief", 0}, 0).ok());
        CHECK(value() == -1.0f);  // SGD(1) of the mean (3 + 0 + 0) / 3
    }
}

// ---- TensorFlow's coordinator semantics --------------------------------------------------------------

namespace {

/// A strategy whose 2 workers are "other processes", down (each call and probe answered unavailable at
/// once, as for a process that is gone) until `up` is set; then each call runs its registered function.
struct RemoteWorkersStub final : pss::Strategy, pss::detail::RemoteWorkers {
    [[nodiscard]] int num_replicas_in_sync() const override { return 1; }
    [[nodiscard]] int num_workers() const { return 2; }
    pss::Variable create_variable(pss::Tensor, std::string) override {
        throw pss::FailedPreconditionError("pss: RemoteWorkersStub holds no variables");
    }
    [[nodiscard]] pss::detail::RemoteWorkers* remote_workers() noexcept override { return this; }
    std::future<pss::Reply> call(int worker, pss::Request request) override {
        {
            std::lock_guard lock(mutex);
            ++calls;
            names.push_back(request.name);
            if (up) ++calls_up[static_cast<std::size_t>(worker)];
        }
        std::promise<pss::Reply> reply;
        if (!up) {
            reply.set_value(pss::Reply::error(pss::ErrorCode::unavailable, "pss: stub: no worker process"));
        } else {
            pss::Reply answer;
            answer.values = pss::detail::run_call(request.name, std::move(request.values), pss::detail::CallContext{nullptr, worker});
            reply.set_value(std::move(answer));
        }
        return reply.get_future();
    }
    std::future<pss::Reply> probe(int worker) override {
        ++probes;
        if (up) answered_up[static_cast<std::size_t>(worker)] = true;
        std::promise<pss::Reply> reply;
        reply.set_value(up ? pss::Reply{} : pss::Reply::error(pss::ErrorCode::unavailable, "pss: stub: not up"));
        return reply.get_future();
    }
    [[nodiscard]] const pss::Timeouts& timeouts() const noexcept override { return limits; }
    pss::Timeouts limits{std::chrono::milliseconds(300), std::chrono::milliseconds(10), std::chrono::milliseconds(100),
                         std::chrono::milliseconds(0)};
    std::atomic<bool> up{false};
    std::atomic<int> probes{0};
    std::array<std::atomic<bool>, 2> answered_up{};  // a probe found the worker up: it rejoins
    std::mutex mutex;
    int calls = 0;
    std::array<int, 2> calls_up{};
    std::vector<std::string> names;
};

int plus_one(int x) { return x + 1; }
const auto plus_one_call = pss::register_function("test_training.plus_one", &plus_one);

/// Fails as a worker does when ps 1 is gone, the first `failures` times it runs.
std::atomic<int> ps_flaky_runs{0};
int ps_flaky(int failures) {
    if (ps_flaky_runs++ < failures)
        throw pss::UnavailableError("pss: TcpTransport: the connection to /job:ps/replica:0/task:1 at 127.0.0.1:9 "
                                    "was lost (End of file); a request in flight may or may not have been applied");
    return 7;
}
const auto ps_flaky_call = pss::register_function("test_training.ps_flaky", &ps_flaky);

}  // namespace

TEST_SUITE("ClusterCoordinator") {
    TEST_CASE("ClusterCoordinator: a RemoteValue as an argument is an InvalidArgumentError from that schedule; "
              "the coordinator goes on") {
        pss::ParameterServerStrategy<> strategy;
        pss::ClusterCoordinator coordinator(strategy);
        auto first = coordinator.schedule([] { return 4; });
        CHECK_THROWS_WITH_AS(coordinator.schedule([](const pss::RemoteValue<int>&) { return 0; }, first),
                             "pss: ClusterCoordinator::schedule: an argument is a RemoteValue; a closure takes "
                             "values, not the results of other closures: fetch() it first",
                             pss::InvalidArgumentError);
        CHECK(coordinator.schedule([](int x) { return x * 2; }, first.fetch()).fetch() == 8);
        coordinator.join();
        CHECK(coordinator.done());
    }

    TEST_CASE("ClusterCoordinator: a lambda on a cluster whose workers are other processes is refused by that "
              "schedule call, before anything is sent") {
        RemoteWorkersStub strategy;
        pss::ClusterCoordinator coordinator(strategy);
        CHECK_THROWS_WITH_AS(coordinator.schedule([] { return 1; }), std::string(pss::detail::lambda_to_process).c_str(),
                             pss::InvalidArgumentError);
        CHECK(coordinator.done());  // nothing was queued, no error waits for the next call
        CHECK(strategy.calls == 0);
        (void)coordinator.schedule(plus_one_call, 1);  // a registered function is sent
        CHECK_THROWS_AS(coordinator.join(), pss::UnavailableError);  // every stub worker is "lost"
        std::lock_guard lock(strategy.mutex);
        CHECK(strategy.calls == 2);  // once to each worker, each then lost
        CHECK(strategy.names.front() == "test_training.plus_one");
    }

    TEST_CASE("ClusterCoordinator: an UnavailableError naming a ps task is transient twice per ps task "
              "(TensorFlow's TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES, 3): the closure runs again; the third "
              "is raised") {
        RemoteWorkersStub strategy;
        strategy.up = true;
        pss::ClusterCoordinator coordinator(strategy);
        ps_flaky_runs = 0;
        auto value = coordinator.schedule(ps_flaky_call, 2);  // fails twice, then runs
        coordinator.join();
        CHECK(value.fetch() == 7);
        CHECK(ps_flaky_runs.load() == 3);
        // ps 1 has failed twice already: its next failure is raised, and the closure does not run again.
        ps_flaky_runs = 0;
        auto failed = coordinator.schedule(ps_flaky_call, 5);
        CHECK_THROWS_WITH_AS(coordinator.join(),
                             "pss: TcpTransport: the connection to /job:ps/replica:0/task:1 at 127.0.0.1:9 was lost "
                             "(End of file); a request in flight may or may not have been applied",
                             pss::UnavailableError);
        CHECK(ps_flaky_runs.load() == 1);
        CHECK_THROWS_AS(failed.fetch(), pss::UnavailableError);
        CHECK(coordinator.schedule(plus_one_call, 1).fetch() == 2);  // the coordinator goes on
    }

    TEST_CASE("ClusterCoordinator: a lost worker process that is up again rejoins and takes closures; with "
              "every worker lost, join waits the start-up timeout for one and then names it") {
        RemoteWorkersStub strategy;  // start-up timeout 0.3 s, probes every 10 ms
        pss::ClusterCoordinator coordinator(strategy);
        auto first = coordinator.schedule(plus_one_call, 1);
        const auto start = std::chrono::steady_clock::now();
        CHECK_THROWS_WITH_AS(coordinator.join(),
                             "pss: ClusterCoordinator: every worker is lost and 1 closures are waiting; no worker is "
                             "left to run them (none came back within the start-up timeout of 300 ms; "
                             "PSS_STARTUP_TIMEOUT sets it)",
                             pss::UnavailableError);
        CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(300));
        CHECK(!first.ready());  // still queued: it runs once a worker is back
        CHECK(strategy.probes.load() > 0);

        // The worker processes are up again: both rejoin, the waiting closure runs, and so do new ones.
        strategy.limits.startup = std::chrono::seconds(60);  // join waits for them now (they come at once)
        strategy.up = true;
        coordinator.join();
        CHECK(first.fetch() == 2);
        // Until a worker has rejoined, closures scheduled on it go to the other: wait for both.
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!(strategy.answered_up[0] && strategy.answered_up[1]) && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // from its probe's answer to taking work
        std::vector<pss::RemoteValue<int>> more;
        for (int i = 0; i < 40; ++i) more.push_back(coordinator.schedule_on(i % 2, plus_one_call, i));
        coordinator.join();
        CHECK(coordinator.done());
        for (int i = 0; i < 40; ++i) CHECK(more[static_cast<std::size_t>(i)].fetch() == i + 1);
        std::lock_guard lock(strategy.mutex);
        CHECK(strategy.calls_up[0] + strategy.calls_up[1] == 41);
        CHECK(strategy.calls_up[0] >= 20);  // each worker came back and took its closures
        CHECK(strategy.calls_up[1] >= 20);
    }
}

TEST_SUITE("ClusterCoordinator") {
    TEST_CASE("ClusterCoordinator: a closure running when another fails is cancelled at its next variable "
              "operation; join raises the first error once it has ended, and its own error never surfaces") {
        pss::ParameterServerStrategy<> strategy;  // 2 workers: the two closures run at once
        pss::ClusterCoordinator coordinator(strategy);
        pss::Variable v = make_counter(strategy);
        std::promise<void> b_running, a_failed;
        auto b_started = b_running.get_future().share();
        auto a_done = a_failed.get_future().share();
        auto a = coordinator.schedule([b_started] {
            b_started.wait();
            throw pss::InvalidArgumentError("pss: test: the first error");
        });
        auto b = coordinator.schedule([&v, &b_running, a_done] {
            b_running.set_value();
            a_done.wait();
            v.assign_add(xt::xarray<float>{1});  // cancelled: not applied
        });
        CHECK_THROWS_WITH_AS(a.fetch(), "pss: test: the first error", pss::InvalidArgumentError);
        a_failed.set_value();
        CHECK_THROWS_WITH_AS(coordinator.join(), "pss: test: the first error", pss::InvalidArgumentError);
        CHECK(b.ready());  // join raised only once b had ended
        CHECK_THROWS_WITH_AS(b.fetch(),
                             "pss: assign_add on variable 'counter:0' was not sent: another closure failed, and the "
                             "closures running meanwhile are cancelled (their RemoteValues give this error); "
                             "reschedule it",
                             pss::CancelledError);
        CHECK(coordinator.done());  // b's CancelledError is not raised after the first error was
        CHECK(v.read<float>()(0) == 0.0f);
        coordinator.schedule([&v] { v.assign_add(xt::xarray<float>{2}); });
        coordinator.join();
        CHECK(v.read<float>()(0) == 2.0f);
    }
}

// ---- datasets read from files (data.hpp) ---------------------------------------------------------------

namespace {

/// A fresh directory under /tmp, removed with what it holds.
struct DataDir {
    std::string path;
    DataDir() {
        std::string pattern = (std::filesystem::temp_directory_path() / "pss_data_XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        path = pattern;
    }
    DataDir(const DataDir&) = delete;
    DataDir& operator=(const DataDir&) = delete;
    ~DataDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string write(const std::string& name, const std::string& text) const {
        const std::string file = path + "/" + name;
        std::ofstream(file, std::ios::binary) << text;
        return file;
    }
};

/// Every batch of `dataset` until its end, as (x, y) pairs.
std::vector<pss::data::Batch> drain(pss::data::Dataset& dataset) {
    std::vector<pss::data::Batch> out;
    while (auto batch = dataset.next()) out.push_back(std::move(*batch));
    return out;
}
std::vector<pss::data::Batch> drain(pss::data::Dataset&& dataset) { return drain(dataset); }

/// A column (n, 1): `column({1})` alone is ambiguous.
xt::xarray<float> column(std::initializer_list<float> values) {
    xt::xarray<float> out = xt::xarray<float>::from_shape({values.size(), 1});
    std::copy(values.begin(), values.end(), out.begin());
    return out;
}

/// Row r of the fit(DatasetCreator) tests' data: three Embedding ids and a click.
std::array<int, 4> ctr_row(int r) { return {(r * 3) % 8, (r * 5 + 1) % 8, (r * 7 + 2) % 8, r % 3 == 0 ? 1 : 0}; }

/// Writes part-0.csv and part-1.csv for 2 workers and `steps` synchronous steps of 4 examples each:
/// step k of the array fit (batch 8, no shuffle) is rows [8k, 8k + 8), its first half worker 0's, so
/// worker w's file holds rows 8k + 4w .. 8k + 4w + 3 for every k.
void write_ctr_parts(const DataDir& dir, int steps) {
    for (int w = 0; w < 2; ++w) {
        std::string text = "a,b,c,click\n";
        for (int k = 0; k < steps; ++k)
            for (int r = 8 * k + 4 * w; r < 8 * k + 4 * w + 4; ++r) {
                const auto row = ctr_row(r);
                text += std::to_string(row[0]) + "," + std::to_string(row[1]) + "," + std::to_string(row[2]) + "," +
                        std::to_string(row[3]) + "\n";
            }
        dir.write("part-" + std::to_string(w) + ".csv", text);
    }
}

using SyncTwoWorkers = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                    pss::LocalClusterResolver<2, 2>, pss::Synchronous>;

/// The model of the fit(DatasetCreator) tests, built and compiled.
template <class StrategyType>
std::unique_ptr<pss::Sequential<StrategyType>> ctr_model(StrategyType& strategy) {
    auto model = std::make_unique<pss::Sequential<StrategyType>>(
        strategy,
        std::initializer_list<pss::AnyLayer>{pss::Embedding(8, 4), pss::GlobalAveragePooling1D(), pss::Dense(3, "tanh"),
                                             pss::Dense(1, "sigmoid")},
        7u);
    model->build({3});
    model->compile("binary_crossentropy", {"accuracy"});
    return model;
}

/// Each worker's batches of 4 from its own files (repeated when `repeat`), as fit(DatasetCreator) takes them.
pss::DatasetCreator ctr_creator(const std::string& directory, bool repeat = true) {
    return pss::DatasetCreator([directory, repeat](const pss::InputContext& context) {
        auto files = pss::data::shard_files(pss::data::list_files(directory, ".csv"), context.num_input_pipelines,
                                            context.input_pipeline_id);
        auto dataset = pss::data::Dataset::csv(files).batch(4).prefetch(2);
        if (repeat) dataset.repeat();
        return dataset;
    });
}

}  // namespace

TEST_SUITE("data.hpp") {
    TEST_CASE("data: list_files sorts a directory's files of one extension; shard_files gives worker i every "
              "file at i, i + workers, ... (TensorFlow's FILE auto-sharding)") {
        DataDir dir;
        for (const char* name : {"d.csv", "a.csv", "c.csv", "e.csv", "b.csv", "notes.txt"}) dir.write(name, "1\n");
        const auto files = pss::data::list_files(dir.path, ".csv");
        REQUIRE(files.size() == 5);
        CHECK(files.front() == dir.path + "/a.csv");
        CHECK(files.back() == dir.path + "/e.csv");
        CHECK(pss::data::shard_files(files, 2, 0) ==
              std::vector<std::string>{dir.path + "/a.csv", dir.path + "/c.csv", dir.path + "/e.csv"});
        CHECK(pss::data::shard_files(files, 2, 1) == std::vector<std::string>{dir.path + "/b.csv", dir.path + "/d.csv"});
        CHECK_THROWS_WITH_AS((void)pss::data::shard_files(files, 6, 0),
                             "pss: data: 5 files cannot be shared by 6 workers, each reading its own files; give at "
                             "least one file per worker",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::data::list_files(dir.path, ".npy"),
                             ("pss: data: " + dir.path + " holds no file ending in \".npy\"").c_str(), pss::NotFoundError);
        CHECK_THROWS_AS((void)pss::data::list_files(dir.path + "/missing", ".csv"), pss::NotFoundError);
    }
    TEST_CASE("data: CSV rows become batches of x (n, features) and y (n, 1), file after file; repeat and "
              "drop_remainder as tf.data") {
        DataDir dir;
        const auto one = dir.write("one.csv", "f0,f1,label\n1,2,0\n3, 4 ,1\r\n\n");
        const auto two = dir.write("two.csv", "f0,f1,label\n5,-6.5,+1\n");
        auto batches = drain(pss::data::Dataset::csv({one, two}).batch(2));  // on a temporary
        REQUIRE(batches.size() == 2);
        CHECK(batches[0].x == xt::xarray<float>{{1, 2}, {3, 4}});
        CHECK(batches[0].y == column({0, 1}));
        CHECK(batches[1].x == xt::xarray<float>{{5, -6.5f}});
        CHECK(batches[1].y == column({1}));

        pss::data::Dataset twice = pss::data::Dataset::csv({one, two}, {.label = 0});
        twice.batch(2, /*drop_remainder=*/true).repeat(2);  // on a dataset held in a variable
        batches = drain(twice);
        REQUIRE(batches.size() == 2);  // each pass's last, partial batch is dropped
        CHECK(batches[0].x == xt::xarray<float>{{2, 0}, {4, 1}});  // column 0 is the label
        CHECK(batches[1].y == column({1, 3}));
        CHECK_FALSE(twice.next().has_value());  // the end stays the end

        const auto bare = dir.write("bare.csv", "1;2\n3;4\n");
        batches = drain(pss::data::Dataset::csv({bare}, {.label = -2, .header = false, .delimiter = ';'}).batch(5));
        REQUIRE(batches.size() == 1);
        CHECK(batches[0].x == xt::xarray<float>{{1, 2}, {3, 4}});
        CHECK(batches[0].y.shape(1) == 0);
    }
    TEST_CASE("data: a shuffle buffer draws a seeded permutation, another each pass; the same seed, the same order") {
        DataDir dir;
        std::string text = "x,y\n";
        for (int i = 0; i < 20; ++i) text += std::to_string(i) + "," + std::to_string(i) + "\n";
        const auto file = dir.write("rows.csv", text);
        auto order = [&](std::uint64_t seed, std::size_t buffer) {
            auto ds = pss::data::Dataset::csv({file}).shuffle(buffer, seed).batch(7).repeat(2).prefetch(2);
            std::vector<int> seen;
            for (const auto& b : drain(ds))
                for (float v : b.y) seen.push_back(static_cast<int>(v));
            return seen;
        };
        const auto a = order(7, 20);
        REQUIRE(a.size() == 40);
        std::vector<int> first(a.begin(), a.begin() + 20), second(a.begin() + 20, a.end());
        CHECK(first != second);  // each pass reshuffled
        std::sort(first.begin(), first.end());
        std::sort(second.begin(), second.end());
        std::vector<int> all(20);
        for (int i = 0; i < 20; ++i) all[static_cast<std::size_t>(i)] = i;
        CHECK(first == all);  // every row once a pass
        CHECK(second == all);
        CHECK(order(7, 20) == a);
        CHECK(order(8, 20) != a);
        const auto kept = order(7, 1);  // a buffer of 1 keeps the files' order
        CHECK(std::vector<int>(kept.begin(), kept.begin() + 20) == all);
    }
    TEST_CASE("data: a bad row is an error naming the file and the line, after the batches before it; then the "
              "dataset ends") {
        DataDir dir;
        const auto good = dir.write("a.csv", "x,y\n1,1\n2,2\n");
        const auto bad = dir.write("b.csv", "x,y\n3,3\n4,four\n5,5\n");
        const auto short_row = dir.write("c.csv", "x,y\n6,6\n7\n");
        for (std::size_t prefetch : {0, 2}) {
            CAPTURE(prefetch);
            auto ds = pss::data::Dataset::csv({good, bad}).batch(1).prefetch(prefetch);
            CHECK(ds.next()->y == column({1}));
            CHECK(ds.next()->y == column({2}));
            CHECK_THROWS_WITH_AS((void)ds.next(), ("pss: data: " + bad + " line 3: column 1 is \"four\", not a number").c_str(),
                                 pss::InvalidArgumentError);
            CHECK_FALSE(ds.next().has_value());
        }
        auto ds = pss::data::Dataset::csv({short_row});
        CHECK_THROWS_WITH_AS((void)ds.next(),
                             ("pss: data: " + short_row + " line 3: 1 columns where 2 were expected").c_str(),
                             pss::InvalidArgumentError);
        auto missing = pss::data::Dataset::csv({dir.path + "/none.csv"});
        CHECK_THROWS_WITH_AS((void)missing.next(),
                             ("pss: data: cannot open " + dir.path + "/none.csv: No such file or directory").c_str(),
                             pss::NotFoundError);
        CHECK_THROWS_WITH_AS(pss::data::Dataset::csv({good}).batch(0), "pss: data: batch_size is 0; it must be at least 1",
                             pss::InvalidArgumentError);
    }
    TEST_CASE("data: .npy arrays of numbers read as rows, numpy's files as xtensor writes them") {
        DataDir dir;
        xt::dump_npy(dir.path + "/a.npy", xt::xarray<double>{{0.5, 1, 7}, {2, 3, 8}});
        xt::dump_npy(dir.path + "/b.npy", xt::xarray<std::int32_t>{{4, 5, 9}});
        auto batches = drain(pss::data::Dataset::npy(pss::data::list_files(dir.path, ".npy")).batch(3));
        REQUIRE(batches.size() == 1);
        CHECK(batches[0].x == xt::xarray<float>{{0.5f, 1}, {2, 3}, {4, 5}});
        CHECK(batches[0].y == column({7, 8, 9}));
        xt::dump_npy(dir.path + "/c.npy", xt::xarray<float>{1, 2, 3});
        auto flat = pss::data::Dataset::npy({dir.path + "/c.npy"});
        CHECK_THROWS_WITH_AS((void)flat.next(),
                             ("pss: data: " + dir.path + "/c.npy holds a float32 array of shape (3,); a dataset reads 2-D "
                              "arrays of numbers (rows, columns)").c_str(),
                             pss::InvalidArgumentError);
    }
    TEST_CASE("data: per-worker datasets: each worker reads its own files, and closures train on its batches") {
        DataDir dir;
        for (int f = 0; f < 4; ++f) {  // file f holds rows x = 10 f + r, y = 1
            std::string text = "x,y\n";
            for (int r = 0; r < 3; ++r) text += std::to_string(10 * f + r) + ",1\n";
            dir.write("part-" + std::to_string(f) + ".csv", text);
        }
        const auto files = pss::data::list_files(dir.path, ".csv");
        pss::ParameterServerStrategy<> strategy;  // 2 workers
        pss::ClusterCoordinator coordinator(strategy);
        auto datasets = coordinator.create_per_worker_dataset([&](int worker) {
            return pss::data::Dataset::csv(pss::data::shard_files(files, coordinator.num_workers(), worker))
                .batch(2)
                .prefetch(1);
        });
        pss::Variable seen = [&] {
            auto scope = strategy.scope();
            return pss::Variable(xt::xarray<float>(xt::zeros<float>({40})), "seen");
        }();
        // Each closure marks the rows of one batch of its worker's files; 6 rows a worker make 3 batches.
        std::vector<pss::RemoteValue<int>> workers;
        for (int i = 0; i < 2; ++i)
            for (int k = 0; k < 3; ++k)
                workers.push_back(coordinator.schedule_on(i, [seen](pss::data::Dataset& ds) mutable {
                    auto batch = ds.next();
                    std::vector<std::int64_t> rows;
                    for (float x : batch->x) rows.push_back(static_cast<std::int64_t>(x));
                    seen.scatter_add(rows, xt::xarray<float>(xt::ones<float>({rows.size()})));
                    return pss::get_current_worker_index();
                }, datasets));
        for (std::size_t i = 0; i < workers.size(); ++i) CHECK(workers[i].fetch() == static_cast<int>(i / 3));
        const auto marks = seen.read<float>();
        for (int x = 0; x < 40; ++x) {
            CAPTURE(x);
            CHECK(marks(x) == (x % 10 < 3 ? 1.0f : 0.0f));  // every row of every file once
        }
        CHECK_FALSE(datasets.at(0).next().has_value());
        CHECK_FALSE(datasets.at(1).next().has_value());
    }
    TEST_CASE("data: fit(DatasetCreator) on 2 synchronous workers, each reading its own CSV files, gives the "
              "weights, losses, metrics and validation of a fit on the same batches as arrays, bit for bit") {
        DataDir dir;
        write_ctr_parts(dir, 3);
        xt::xarray<float> x = xt::xarray<float>::from_shape({24, 3}), y = xt::xarray<float>::from_shape({24, 1});
        for (int r = 0; r < 24; ++r) {
            const auto row = ctr_row(r);
            for (std::size_t c = 0; c < 3; ++c) x(static_cast<std::size_t>(r), c) = static_cast<float>(row[c]);
            y(static_cast<std::size_t>(r), 0) = static_cast<float>(row[3]);
        }
        const xt::xarray<float> x_val = xt::view(x, xt::range(0, 6), xt::all()), y_val = xt::view(y, xt::range(0, 6), xt::all());
        auto run = [&](bool from_files) {
            SyncTwoWorkers strategy(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.5));
            auto model = ctr_model(strategy);
            const auto initial = model->get_weights();
            std::vector<std::pair<int, int>> contexts;
            const pss::DatasetCreator files([&](const pss::InputContext& context) {
                contexts.emplace_back(context.num_input_pipelines, context.input_pipeline_id);
                return ctr_creator(dir.path)(context);
            });
            // 2 epochs of 3 steps: the files' second pass (repeat) is the arrays' second epoch.
            const auto history =
                from_files ? model->fit(files, {.epochs = 2, .verbose = 0, .validation_data = pss::ValidationData(x_val, y_val),
                                                .steps_per_epoch = 3})
                           : model->fit(x, y, {.batch_size = 8, .epochs = 2, .verbose = 0,
                                               .validation_data = pss::ValidationData(x_val, y_val), .shuffle = false});
            CHECK(contexts == (from_files ? std::vector<std::pair<int, int>>{{2, 0}, {2, 1}} : std::vector<std::pair<int, int>>{}));
            CHECK(history.epoch == std::vector<int>{0, 1});
            CHECK(history.history.at("val_loss").size() == 2);
            std::vector<float> weights;
            bool moved = false;
            const auto final_weights = model->get_weights();
            for (std::size_t i = 0; i < final_weights.size(); ++i) {
                const auto& w = final_weights[i].get<float>();
                moved = moved || w != initial[i].get<float>();
                weights.insert(weights.end(), w.begin(), w.end());
            }
            CHECK(moved);
            return std::make_pair(history.history, weights);
        };
        const auto arrays = run(false);
        const auto files = run(true);
        CHECK(files.first == arrays.first);  // loss, accuracy, val_loss, val_accuracy of each epoch
        CHECK(files.second == arrays.second);
    }
    TEST_CASE("data: fit(DatasetCreator) refuses what does not apply to datasets; a dataset that runs out is an "
              "OutOfRangeError naming the worker and the step; a bad row is its file's error") {
        DataDir dir;
        write_ctr_parts(dir, 3);
        SyncTwoWorkers strategy(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.5));
        auto model = ctr_model(strategy);
        const auto creator = ctr_creator(dir.path);
        CHECK_THROWS_WITH_AS(model->fit(creator, {.epochs = 2, .verbose = 0}),
                             "pss: Sequential::fit: steps_per_epoch is 0; fit from a DatasetCreator needs it, as "
                             "Keras' does: a worker's dataset may repeat for ever, so an epoch is the steps_per_epoch "
                             "steps it is given",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(model->fit(creator, {.verbose = 0, .validation_split = 0.25, .steps_per_epoch = 3}),
                             "pss: Sequential::fit: validation_split is 0.250000, but the data of a DatasetCreator "
                             "cannot be split (Keras refuses it for datasets too); give validation_data",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(model->fit(creator, {.verbose = 0, .class_weight = {{1, 2.0}}, .steps_per_epoch = 3}),
                             "pss: Sequential::fit: sample_weight and class_weight do not apply to a DatasetCreator, "
                             "whose batches carry no weights; give the examples as arrays to weigh them",
                             pss::InvalidArgumentError);
        const pss::DatasetCreator throwing([&](const pss::InputContext& context) {
            if (context.input_pipeline_id == 1) throw pss::NotFoundError("pss: test: no files for worker 1");
            return ctr_creator(dir.path)(context);
        });
        CHECK_THROWS_WITH_AS(model->fit(throwing, {.verbose = 0, .steps_per_epoch = 3}),
                             "pss: ClosureInputError: the per-worker value of worker 1 failed when it was made: pss: "
                             "test: no files for worker 1",
                             pss::ClosureInputError);
        SUBCASE("worker 1's dataset, not repeated, ends after 3 batches: at the second epoch's first step") {
            const pss::DatasetCreator short_one([&](const pss::InputContext& context) {
                return ctr_creator(dir.path, /*repeat=*/context.input_pipeline_id == 0)(context);
            });
            CHECK_THROWS_WITH_AS(model->fit(short_one, {.epochs = 2, .verbose = 0, .steps_per_epoch = 3}),
                                 "pss: Sequential::fit: the dataset of worker 1 ended at step 4 of this fit (epoch 2, "
                                 "batch 1), which takes 6 steps (steps_per_epoch 3 * 2 epochs), each a batch of a "
                                 "worker's dataset; end the DatasetCreator's dataset with repeat() so that it does "
                                 "not run out",
                                 pss::OutOfRangeError);
            // No synchronous step was left waiting for the worker that ran out: the next fit runs.
            CHECK(model->fit(creator, {.epochs = 1, .verbose = 0, .steps_per_epoch = 3}).loss.size() == 1);
        }
        SUBCASE("a bad row in worker 1's file") {
            DataDir bad;
            bad.write("part-0.csv", "a,b,c,click\n1,2,3,1\n");
            const auto broken = bad.write("part-1.csv", "a,b,c,click\n1,2,3,0\n4,x,6,1\n");
            CHECK_THROWS_WITH_AS(model->fit(ctr_creator(bad.path), {.verbose = 0, .steps_per_epoch = 2}),
                                 ("pss: data: " + broken + " line 3: column 1 is \"x\", not a number").c_str(),
                                 pss::InvalidArgumentError);
            // No synchronous step was left waiting for the worker that failed: the next fit runs.
            CHECK(model->fit(creator, {.epochs = 1, .verbose = 0, .steps_per_epoch = 3}).loss.size() == 1);
        }
    }
    TEST_CASE("data: fit(DatasetCreator) on 2 asynchronous workers runs steps_per_epoch steps an epoch") {
        DataDir dir;
        write_ctr_parts(dir, 3);
        pss::ParameterServerStrategy<> strategy;  // 2 workers
        auto model = ctr_model(strategy);
        const auto history = model->fit(ctr_creator(dir.path), {.epochs = 3, .verbose = 0, .steps_per_epoch = 5});
        CHECK(history.epoch == std::vector<int>{0, 1, 2});
        for (double loss : history.loss) CHECK(std::isfinite(loss));
        CHECK(history.history.at("accuracy").size() == 3);
    }
}
