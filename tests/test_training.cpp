// Tests of ClusterCoordinator, RemoteValue, registered functions and the consistency models.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <latch>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xview.hpp>

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
    TEST_CASE("ClusterCoordinator: when every worker is lost, join says so instead of waiting forever") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 1>>
            strategy;
        pss::ClusterCoordinator coordinator(strategy);
        coordinator.schedule([] { pss::ClusterCoordinator::testing_lose_current_worker(); });
        CHECK_THROWS_WITH_AS(coordinator.join(),
                             "pss: ClusterCoordinator: every worker is lost and 1 closures are waiting; no worker is "
                             "left to run them",
                             pss::UnavailableError);
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
        CHECK_THROWS_WITH_AS((void)waiting.fetch(),
                             "pss: read on variable 'w:0' for step 2 was abandoned: another closure failed, so the "
                             "step may never complete",
                             pss::CancelledError);
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
}
