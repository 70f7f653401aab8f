// Tests of tensors, the in-process transport, parameter servers, variables and the strategy.
#include <array>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xview.hpp>

#include <archetypes/cluster_resolver.hpp>
#include <archetypes/consistency.hpp>
#include <archetypes/optimizer.hpp>
#include <archetypes/partitioner.hpp>
#include <archetypes/transport.hpp>
#include <pss/pss.hpp>

namespace {

using Ids = std::vector<std::int64_t>;
using Fixed = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner>;

// A sharded [10, 2] float variable 0..19 over 3 ps: shards hold rows 0-3, 4-6 and 7-9.
struct ShardedFixture {
    pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                 pss::LocalClusterResolver<3, 1>>
        strategy{{}, pss::FixedShardsPartitioner(3), pss::SGD(0.5)};
    pss::Variable v = [&] {
        auto scope = strategy.scope();
        return pss::Variable(xt::xarray<float>(xt::reshape_view(xt::arange<float>(20), {10, 2})), "table");
    }();
};

/// A partitioner that answers whatever it is told to, for the strategy's validation.
struct AnswerPartitioner {
    std::size_t answer = 1;
    std::size_t operator()(std::span<const std::size_t>, pss::DType) const { return answer; }
};

}  // namespace

TEST_SUITE("Tensor") {
    TEST_CASE("Tensor: int32 [1, 2, 3] has shape (3,), 12 bytes and prints [1, 2, 3]") {
        pss::Tensor t(xt::xarray<std::int32_t>{1, 2, 3});
        CHECK(t.dtype() == pss::DType::int32);
        CHECK(t.shape() == pss::Shape{3});
        CHECK(t.nbytes() == 12);
        CHECK(pss::format_values(t) == "[1, 2, 3]");
        CHECK(pss::format_shape(t.shape()) == "(3,)");
    }
    TEST_CASE("Tensor: float64 [[1, 2.5], [3, 4]] prints [[1., 2.5], [3., 4.]]; a scalar prints bare") {
        CHECK(pss::format_values(pss::Tensor(xt::xarray<double>{{1, 2.5}, {3, 4}})) == "[[1., 2.5], [3., 4.]]");
        CHECK(pss::format_values(pss::Tensor(xt::xarray<std::int64_t>(7))) == "7");
        CHECK(pss::format_shape({}) == "()");
        CHECK(pss::format_shape({1024, 1024}) == "(1024, 1024)");
    }
    TEST_CASE("Tensor: more than 1000 elements print as numpy summarises them") {
        xt::xarray<std::int32_t> a = xt::arange<std::int32_t>(2000);
        CHECK(pss::format_values(pss::Tensor(a)) == "[0, 1, 2, ..., 1997, 1998, 1999]");
    }
    TEST_CASE("Tensor: get<T> of the wrong dtype throws naming both dtypes") {
        pss::Tensor t(xt::xarray<float>{1.0f});
        CHECK_THROWS_WITH_AS((void)t.get<std::int32_t>(), "pss: tensor holds dtype float32, not int32",
                             pss::InvalidArgumentError);
    }
    TEST_CASE("Tensor: a string tensor holds byte strings of any length, prints them as Python's bytes, and is "
              "refused where numbers are needed") {
        using namespace std::string_literals;
        pss::Tensor t(xt::xarray<std::string>{{"the"s, ""s}, {"it's"s, "\0\n\xff"s}});
        CHECK(t.dtype() == pss::DType::string);
        CHECK(pss::dtype_name(t.dtype()) == "string");
        CHECK(t.shape() == pss::Shape{2, 2});
        CHECK(t.size() == 4);
        CHECK(t.nbytes() == 0);  // its elements are no one block of bytes
        CHECK(t.bytes() == nullptr);
        CHECK(pss::format_values(t) == "[[b'the', b''], [b'it\\'s', b'\\x00\\n\\xff']]");
        CHECK(t.get<std::string>()(1, 0) == "it's");
        CHECK(pss::Tensor::zeros(pss::DType::string, {2}).get<std::string>() == xt::xarray<std::string>{"", ""});
        CHECK_THROWS_WITH_AS((void)t.get<float>(), "pss: tensor holds dtype string, not float32", pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(t.visit_mut([](auto&) {}),
                             doctest::Contains("pss: a string value was given where numbers are needed"),
                             pss::InvalidArgumentError);
    }
    TEST_CASE("Tensor: moving a tensor moves its buffer") {
        xt::xarray<float> a = xt::ones<float>({1000});
        const float* data = a.data();
        pss::Tensor t(std::move(a));
        pss::Tensor u(std::move(t));
        CHECK(u.get<float>().data() == data);
    }

    TEST_CASE("Tensor: rows taken by position are those rows, for every row of 4 to 1,100 bytes and for strings") {
        // Rows of the usual sizes (powers of two) are copied by a copy of that constant size, others by a
        // loop: every size, and the sizes beside each power of two, must give the same rows.
        const std::vector<std::size_t> positions{6, 0, 3, 3, 1};
        auto check_rows = [&]<class T>(std::size_t width) {
            xt::xarray<T> from = xt::xarray<T>::from_shape({7, width});
            for (std::size_t i = 0; i < from.size(); ++i) from.data()[i] = static_cast<T>(i * 7 + 1);
            const pss::Tensor taken = pss::detail::take_rows(pss::Tensor(from), positions);
            REQUIRE(taken.shape() == pss::Shape{positions.size(), width});
            const auto& out = taken.get<T>();
            for (std::size_t j = 0; j < positions.size(); ++j)
                for (std::size_t e = 0; e < width; ++e)
                    if (out(j, e) != from(positions[j], e))
                        FAIL_CHECK("row " << j << " element " << e << " of a row of " << width * sizeof(T) << " bytes");
        };
        for (std::size_t width = 1; width <= 275; ++width) check_rows.operator()<std::int32_t>(width);
        for (std::size_t width = 1; width <= 140; ++width) check_rows.operator()<double>(width);
        using namespace std::string_literals;
        const pss::Tensor words(xt::xarray<std::string>{{"a"s, "bb"s}, {"ccc"s, ""s}});
        const pss::Tensor taken = pss::detail::take_rows(words, std::vector<std::size_t>{1, 0, 1});
        CHECK(taken.get<std::string>() == xt::xarray<std::string>{{"ccc"s, ""s}, {"a"s, "bb"s}, {"ccc"s, ""s}});
    }
}

TEST_SUITE("InProcessTransport") {
    TEST_CASE("InProcessTransport: a request's payload reaches the task without a copy, and its reply comes back") {
        pss::ClusterSpec spec{{"ps", {"inproc:ps:0"}}, {"worker", {"inproc:worker:0"}}};
        pss::InProcessTransport transport(spec);
        std::atomic<const void*> seen{nullptr};
        std::thread::id handler_thread;
        transport.serve({"ps", 0}, pss::answer_at_once([&](pss::Request&& r) {
            seen = r.payload.bytes();
            handler_thread = std::this_thread::get_id();
            pss::Reply reply;
            reply.payload = std::move(r.payload);
            return reply;
        }));
        xt::xarray<float> value = xt::ones<float>({4096});
        const void* data = value.data();
        pss::Request request;
        request.payload = std::move(value);
        pss::Reply reply = transport.send({"ps", 0}, std::move(request)).get();
        CHECK(reply.ok());
        CHECK(seen.load() == data);
        CHECK(reply.payload.bytes() == data);
        CHECK(handler_thread == std::this_thread::get_id());  // a variable operation to an idle task: the sender runs it
        request = {};
        request.kind = pss::RequestKind::call;  // a call runs on the task's thread
        CHECK(transport.send({"ps", 0}, std::move(request)).get().ok());
        CHECK(handler_thread != std::this_thread::get_id());
    }
    TEST_CASE("InProcessTransport: an operation sent while its task is busy waits its turn on the task's thread, "
              "in the order sent") {
        pss::ClusterSpec spec{{"ps", {"inproc:ps:0"}}, {"worker", {"inproc:worker:0"}}};
        pss::InProcessTransport transport(spec);
        std::promise<void> release;
        std::shared_future<void> released = release.get_future().share();
        std::mutex mutex;
        std::vector<std::pair<std::uint64_t, bool>> ran;  // (step, on the sender's thread)
        const auto sender = std::this_thread::get_id();
        transport.serve({"ps", 0}, pss::answer_at_once([&](pss::Request&& r) {
            if (r.kind == pss::RequestKind::call) released.wait();
            std::lock_guard lock(mutex);
            ran.emplace_back(r.step, std::this_thread::get_id() == sender);
            return pss::Reply{};
        }));
        pss::Request blocking;
        blocking.kind = pss::RequestKind::call;
        blocking.step = 1;
        auto first = transport.send({"ps", 0}, std::move(blocking));
        std::vector<std::future<pss::Reply>> queued;
        for (std::uint64_t step = 2; step <= 4; ++step) {
            pss::Request r;
            r.op = pss::Op::gather;
            r.step = step;
            queued.push_back(transport.send({"ps", 0}, std::move(r)));
        }
        CHECK(queued.front().wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
        release.set_value();
        CHECK(first.get().ok());
        for (auto& f : queued) CHECK(f.get().ok());
        std::lock_guard lock(mutex);
        CHECK(ran == std::vector<std::pair<std::uint64_t, bool>>{{1, false}, {2, false}, {3, false}, {4, false}});
    }
    TEST_CASE("InProcessTransport: a task never served and a task after shutdown answer unavailable") {
        pss::ClusterSpec spec{{"ps", {"a:1", "b:1"}}, {"worker", {"c:1"}}};
        pss::InProcessTransport transport(spec);
        transport.serve({"ps", 0}, pss::answer_at_once([](pss::Request&&) { return pss::Reply{}; }));
        auto r1 = transport.send({"ps", 1}, {}).get();
        CHECK(r1.code == pss::ErrorCode::unavailable);
        CHECK(r1.message == "pss: task /job:ps/replica:0/task:1 is not serving (never started, or shut down)");
        CHECK(transport.send({"ps", 0}, {}).get().ok());
        transport.shutdown();
        CHECK(transport.send({"ps", 0}, {}).get().code == pss::ErrorCode::unavailable);
        CHECK_THROWS_AS(transport.serve({"ps", 5}, pss::answer_at_once([](pss::Request&&) { return pss::Reply{}; })),
                        pss::InvalidArgumentError);
    }
    TEST_CASE("InProcessTransport: requests to one task run one at a time, in order") {
        pss::ClusterSpec spec{{"ps", {"a:1"}}, {"worker", {"c:1"}}};
        pss::InProcessTransport transport(spec);
        std::vector<std::uint64_t> order;
        transport.serve({"ps", 0}, pss::answer_at_once([&](pss::Request&& r) {
            order.push_back(r.key.variable);
            return pss::Reply{};
        }));
        std::vector<std::future<pss::Reply>> futures;
        for (std::uint64_t i = 0; i < 100; ++i) {
            pss::Request r;
            r.key.variable = i;
            futures.push_back(transport.send({"ps", 0}, std::move(r)));
        }
        for (auto& f : futures) f.get();
        REQUIRE(order.size() == 100);
        for (std::uint64_t i = 0; i < 100; ++i) CHECK(order[i] == i);
    }
    TEST_CASE("InProcessTransport: a handler that keeps its Responder answers later; one dropped answers "
              "unavailable; the task goes on meanwhile") {
        pss::ClusterSpec spec{{"ps", {"a:1"}}, {"worker", {"c:1"}}};
        pss::InProcessTransport transport(spec);
        pss::Responder kept;  // the task's thread only
        transport.serve({"ps", 0}, [&](pss::Request&& r, pss::Responder respond) {
            if (r.key.variable == 1) return void(kept = std::move(respond));  // answered by request 2
            if (r.key.variable == 2) {
                pss::Reply late;
                late.message = "late";
                kept(std::move(late));
                pss::Reply now;
                now.message = "now";
                return respond(std::move(now));
            }
            // variable 3: the responder is dropped unanswered
        });
        pss::Request r1, r2, r3;
        r1.key.variable = 1;
        r2.key.variable = 2;
        r3.key.variable = 3;
        auto f1 = transport.send({"ps", 0}, std::move(r1));
        CHECK(f1.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
        auto f2 = transport.send({"ps", 0}, std::move(r2));
        CHECK(f1.get().message == "late");
        CHECK(f2.get().message == "now");
        pss::Reply dropped = transport.send({"ps", 0}, std::move(r3)).get();
        CHECK(dropped.code == pss::ErrorCode::unavailable);
        CHECK(dropped.message == "pss: the task dropped the request without answering it (it shut down, or its "
                                 "handler lost the responder)");
    }
}

TEST_SUITE("ParameterServer") {
    TEST_CASE("ParameterServer: a request that fails validation is an error reply and changes nothing") {
        pss::ParameterServer<pss::SGD> server;
        pss::Request create;
        create.op = pss::Op::create;
        create.key = {1, 0};
        create.name = "w";
        create.payload = xt::xarray<float>{1, 2, 3};
        REQUIRE(server.handle(std::move(create)).ok());

        pss::Request bad;
        bad.op = pss::Op::scatter_add;
        bad.key = {1, 0};
        bad.ids = {0, 3};
        bad.payload = xt::xarray<float>{10, 20};
        pss::Reply reply = server.handle(std::move(bad));
        CHECK(reply.code == pss::ErrorCode::invalid_argument);
        CHECK(reply.message ==
              "pss: scatter_add on variable 'w': id 3 is out of range for shape (3,); ids must be in [0, 3)");

        pss::Request wrong_dtype;
        wrong_dtype.op = pss::Op::assign;
        wrong_dtype.key = {1, 0};
        wrong_dtype.payload = xt::xarray<double>{1, 2, 3};
        reply = server.handle(std::move(wrong_dtype));
        CHECK(reply.code == pss::ErrorCode::invalid_argument);
        CHECK(reply.message == "pss: assign on variable 'w': expected shape (3,) dtype float32, got shape (3,) dtype float64");

        pss::Request missing;
        missing.op = pss::Op::read;
        missing.key = {9, 0};
        CHECK(server.handle(std::move(missing)).code == pss::ErrorCode::not_found);

        pss::Request read;
        read.op = pss::Op::read;
        read.key = {1, 0};
        pss::Tensor value = server.handle(std::move(read)).take();
        CHECK(value.get<float>() == xt::xarray<float>{1, 2, 3});
    }
    TEST_CASE("ParameterServer: a string shard is read, gathered, assigned and scatter_updated; arithmetic sent "
              "straight to it is refused and changes nothing") {
        pss::ParameterServer<pss::SGD> server;
        auto request = [](pss::Op op, pss::Tensor payload = {}, Ids ids = {}) {
            pss::Request r;
            r.op = op;
            r.key = {1, 0};
            r.name = "vocab";
            r.payload = std::move(payload);
            r.ids = std::move(ids);
            return r;
        };
        REQUIRE(server.handle(request(pss::Op::create, xt::xarray<std::string>{"a", "bb", "ccc"})).ok());
        REQUIRE(server.handle(request(pss::Op::scatter_update, xt::xarray<std::string>{"x", "yyyy"}, Ids{2, 0})).ok());
        CHECK(server.handle(request(pss::Op::gather, {}, Ids{0, 0, 2})).payload.get<std::string>() ==
              xt::xarray<std::string>{"yyyy", "yyyy", "x"});
        for (pss::Op op : {pss::Op::scatter_add, pss::Op::scatter_max, pss::Op::apply_sparse}) {
            const pss::Reply reply = server.handle(request(op, xt::xarray<std::string>{"z"}, Ids{1}));
            CHECK(reply.code == pss::ErrorCode::invalid_argument);
            CHECK(reply.message == "pss: " + std::string(pss::op_name(op)) +
                                       " on variable 'vocab': a string variable is read, assigned, gathered (sparse_read) "
                                       "and scatter_updated; " + std::string(pss::op_name(op)) + " computes with numbers");
        }
        const pss::Reply add = server.handle(request(pss::Op::assign_add, xt::xarray<std::string>{"1", "2", "3"}));
        CHECK(add.code == pss::ErrorCode::invalid_argument);
        CHECK(server.handle(request(pss::Op::read)).payload.get<std::string>() == xt::xarray<std::string>{"yyyy", "bb", "x"});
        REQUIRE(server.handle(request(pss::Op::assign, xt::xarray<std::string>{"", "a longer string than any", "q"})).ok());
        CHECK(server.handle(request(pss::Op::read)).payload.get<std::string>() ==
              xt::xarray<std::string>{"", "a longer string than any", "q"});
    }
    TEST_CASE("ParameterServer: a zero integer divisor sent straight to a ps is refused there too") {
        pss::ParameterServer<pss::SGD> server;
        pss::Request create;
        create.op = pss::Op::create;
        create.key = {1, 0};
        create.name = "n";
        create.payload = xt::xarray<std::int64_t>{{4, 8}, {6, 9}};
        REQUIRE(server.handle(std::move(create)).ok());
        pss::Request divide;
        divide.op = pss::Op::scatter_div;
        divide.key = {1, 0};
        divide.ids = {1, 0};
        divide.payload = xt::xarray<std::int64_t>{{3, 3}, {2, 0}};
        const pss::Reply refused = server.handle(std::move(divide));
        CHECK(refused.code == pss::ErrorCode::invalid_argument);
        CHECK(refused.message == "pss: scatter_div on variable 'n': row 1 of the divisor holds 0; an integer variable "
                                 "cannot be divided by zero, so nothing was changed");
        pss::Request read;
        read.op = pss::Op::read;
        read.key = {1, 0};
        pss::Reply value = server.handle(std::move(read));
        CHECK(value.take().get<std::int64_t>() == xt::xarray<std::int64_t>{{4, 8}, {6, 9}});
    }
    TEST_CASE("ParameterServer: a gradient holding NaN or infinity is refused with the variable's name and the "
              "count, and changes nothing; ServerOptions turns the check off") {
        auto make = [](pss::ServerOptions options) {
            auto server = std::make_unique<pss::ParameterServer<pss::SGD>>(pss::SGD(1.0), pss::SyncOptions{}, options);
            pss::Request create;
            create.op = pss::Op::create;
            create.key = {1, 0};
            create.name = "emb";
            create.payload = xt::xarray<double>{{1, 2}, {3, 4}, {5, 6}};
            REQUIRE(server->handle(std::move(create)).ok());
            return server;
        };
        auto push = [](pss::ParameterServer<pss::SGD>& server, pss::Op op, xt::xarray<double> g, Ids ids = {}) {
            pss::Request r;
            r.op = op;
            r.key = {1, 0};
            r.payload = std::move(g);
            r.ids = std::move(ids);
            return server.handle(std::move(r));
        };
        auto read = [](pss::ParameterServer<pss::SGD>& server) {
            pss::Request r;
            r.op = pss::Op::read;
            r.key = {1, 0};
            return server.handle(std::move(r)).take().get<double>();
        };
        const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
        auto server = make({});
        pss::Reply dense = push(*server, pss::Op::apply_dense, xt::xarray<double>{{1, nan}, {inf, 1}, {1, -inf}});
        CHECK(dense.code == pss::ErrorCode::invalid_argument);
        CHECK(dense.message == "pss: apply_gradient on variable 'emb': the gradient holds 3 non-finite values (NaN or "
                               "infinity) of 6; nothing was applied (ServerOptions::refuse_non_finite_gradients)");
        pss::Reply sparse = push(*server, pss::Op::apply_sparse, xt::xarray<double>{{1, 1}, {nan, 1}}, {0, 2});
        CHECK(sparse.message == "pss: apply_sparse_gradient on variable 'emb': the gradient holds 1 non-finite value "
                                "(NaN or infinity) of 4; nothing was applied "
                                "(ServerOptions::refuse_non_finite_gradients)");
        CHECK(read(*server) == xt::xarray<double>{{1, 2}, {3, 4}, {5, 6}});
        // assign and scatter are not gradients: a program may store infinity on purpose.
        CHECK(push(*server, pss::Op::scatter_update, xt::xarray<double>{{inf, 0}}, {1}).ok());
        CHECK(push(*server, pss::Op::apply_dense, xt::xarray<double>{{1, 1}, {0, 0}, {1, 1}}).ok());
        CHECK(read(*server) == xt::xarray<double>{{0, 1}, {inf, 0}, {4, 5}});

        auto environment = [](std::optional<std::string> value) {
            return [value](std::string_view name) {
                return name == "PSS_NON_FINITE_GRADIENTS" ? value : std::nullopt;
            };
        };
        CHECK(pss::ServerOptions::from_environment(environment(std::nullopt)).refuse_non_finite_gradients);
        CHECK(pss::ServerOptions::from_environment(environment("refuse")).refuse_non_finite_gradients);
        CHECK(!pss::ServerOptions::from_environment(environment("apply")).refuse_non_finite_gradients);
        CHECK_THROWS_WITH_AS((void)pss::ServerOptions::from_environment(environment("no")),
                             "pss: PSS_NON_FINITE_GRADIENTS is \"no\"; give \"refuse\" or \"apply\"",
                             pss::InvalidArgumentError);
        auto lenient = make(pss::ServerOptions::from_environment(environment("apply")));
        CHECK(push(*lenient, pss::Op::apply_dense, xt::xarray<double>{{0, 0}, {0, 0}, {0, inf}}).ok());
        CHECK(read(*lenient)(2, 1) == -inf);
    }
    TEST_CASE("ParameterServer: a synchronous push more than staleness + 2 steps ahead of the applied step is "
              "refused and kept nowhere; one within the window waits for its step") {
        for (std::uint64_t staleness : {0u, 3u}) {
            CAPTURE(staleness);
            pss::ParameterServer<pss::SGD> server(pss::SGD(1.0), pss::SyncOptions{true, 1, staleness});
            pss::Request create;
            create.op = pss::Op::create;
            create.key = {1, 0};
            create.name = "w";
            create.payload = xt::xarray<float>{10};
            REQUIRE(server.handle(std::move(create)).ok());
            auto push = [&](std::uint64_t step) {
                pss::Request r;
                r.op = pss::Op::apply_dense;
                r.key = {1, 0};
                r.step = step;
                r.payload = xt::xarray<float>{1};
                return server.handle(std::move(r));
            };
            const std::uint64_t last = 2 + staleness;  // the furthest a worker can be ahead of step 0
            pss::Reply far = push(last + 1);
            CHECK(far.code == pss::ErrorCode::invalid_argument);
            CHECK(far.message == "pss: apply_gradient on variable 'w': step " + std::to_string(last + 1) +
                                     " is too far ahead: step 0 is the last applied, and with staleness " +
                                     std::to_string(staleness) + " no worker can push beyond step " +
                                     std::to_string(last));
            CHECK(push(std::uint64_t{1} << 62).code == pss::ErrorCode::invalid_argument);
            CHECK(push(last).ok());  // kept until the steps before it are applied
            for (std::uint64_t step = 1; step < last; ++step) CHECK(push(step).ok());
            pss::Request read;
            read.op = pss::Op::read;
            read.key = {1, 0};
            CHECK(server.handle(std::move(read)).take().get<float>() == xt::xarray<float>{10.0f - static_cast<float>(last)});
            CHECK(push(2 * last + 1).code == pss::ErrorCode::invalid_argument);  // the window moved with the steps
            CHECK(push(2 * last).ok());
        }
    }
    TEST_CASE("ParameterServer: creating the same shard twice is AlreadyExistsError") {
        pss::ParameterServer<pss::SGD> server;
        for (int i = 0; i < 2; ++i) {
            pss::Request create;
            create.op = pss::Op::create;
            create.key = {1, 0};
            create.name = "w";
            create.payload = xt::xarray<float>{1};
            pss::Reply r = server.handle(std::move(create));
            CHECK(r.code == (i == 0 ? pss::ErrorCode::ok : pss::ErrorCode::already_exists));
        }
    }
    TEST_CASE("ParameterServer: a synchronous read for step 2 is held until both workers pushed step 1, then "
              "answered with the applied value") {
        pss::ParameterServer<pss::SGD> server(pss::SGD(1.0), pss::SyncOptions{true, 2, 0});
        auto handle = [&](pss::Request r) {
            std::promise<pss::Reply> p;
            auto f = p.get_future();
            server.handle(std::move(r), pss::Responder([p = std::move(p)](pss::Reply&& x) mutable {
                              p.set_value(std::move(x));
                          }));
            return f;
        };
        pss::Request create;
        create.op = pss::Op::create;
        create.key = {1, 0};
        create.name = "w";
        create.payload = xt::xarray<float>{1, 2};
        REQUIRE(handle(std::move(create)).get().ok());
        auto push = [&](float g) {
            pss::Request r;
            r.op = pss::Op::apply_dense;
            r.key = {1, 0};
            r.step = 1;
            r.payload = xt::xarray<float>{g, g};
            return handle(std::move(r));
        };
        auto pull = [&](pss::Op op, std::uint64_t step) {
            pss::Request r;
            r.op = op;
            r.key = {1, 0};
            r.step = step;
            if (op == pss::Op::gather) r.ids = {1};
            return handle(std::move(r));
        };
        auto read1 = pull(pss::Op::read, 1);  // step 1 needs nothing applied: answered at once
        REQUIRE(read1.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
        CHECK(read1.get().take().get<float>() == xt::xarray<float>{1, 2});
        auto read2 = pull(pss::Op::read, 2);
        auto gather2 = pull(pss::Op::gather, 2);
        CHECK(push(2).get().ok());
        CHECK(read2.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
        CHECK(gather2.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
        pss::Request not_held;  // the one-argument handle cannot hold: it answers not_ready
        not_held.op = pss::Op::read;
        not_held.key = {1, 0};
        not_held.step = 2;
        CHECK(server.handle(std::move(not_held)).code == pss::ErrorCode::not_ready);
        CHECK(push(4).get().ok());  // step 1 complete: the mean gradient 3 is applied
        REQUIRE(read2.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
        CHECK(read2.get().take().get<float>() == xt::xarray<float>{-2, -1});
        CHECK(gather2.get().take().get<float>() == xt::xarray<float>{-1});
    }
    TEST_CASE("ParameterServer: a held read is answered not_found when its variable is destroyed, unavailable "
              "when the server is") {
        std::future<pss::Reply> destroyed, shut_down;
        {
            pss::ParameterServer<pss::SGD> server(pss::SGD(1.0), pss::SyncOptions{true, 1, 0});
            for (std::uint64_t v : {1, 2}) {
                pss::Request create;
                create.op = pss::Op::create;
                create.key = {v, 0};
                create.name = "w" + std::to_string(v);
                create.payload = xt::xarray<float>{1};
                REQUIRE(server.handle(std::move(create)).ok());
            }
            auto held = [&](std::uint64_t v) {
                pss::Request r;
                r.op = pss::Op::read;
                r.key = {v, 0};
                r.step = 5;
                std::promise<pss::Reply> p;
                auto f = p.get_future();
                server.handle(std::move(r), pss::Responder([p = std::move(p)](pss::Reply&& x) mutable {
                                  p.set_value(std::move(x));
                              }));
                return f;
            };
            destroyed = held(1);
            shut_down = held(2);
            pss::Request destroy;
            destroy.op = pss::Op::destroy;
            destroy.key = {1, 0};
            CHECK(server.handle(std::move(destroy)).ok());
            REQUIRE(destroyed.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
            CHECK(shut_down.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
        }
        pss::Reply d = destroyed.get();
        CHECK(d.code == pss::ErrorCode::not_found);
        CHECK(d.message == "pss: read on variable 'w1' for step 5 was waiting when the variable was destroyed; the "
                           "step will not be applied");
        pss::Reply s = shut_down.get();
        CHECK(s.code == pss::ErrorCode::unavailable);
        CHECK(s.message == "pss: read on variable 'w2' for step 5 was waiting when the parameter server shut down; "
                           "the step will not be applied");
    }
    TEST_CASE("ParameterServer: clear (a new run) drops every shard, answers a held read not_found, and the "
              "same keys can be created again") {
        pss::ParameterServer<pss::SGD> server(pss::SGD(1.0), pss::SyncOptions{true, 1, 0});
        const auto create = [&](float value) {
            pss::Request r;
            r.op = pss::Op::create;
            r.key = {1, 0};
            r.name = "w";
            r.payload = xt::xarray<float>{value};
            return server.handle(std::move(r));
        };
        REQUIRE(create(1).ok());
        pss::Request r;
        r.op = pss::Op::read;
        r.key = {1, 0};
        r.step = 5;
        std::promise<pss::Reply> p;
        auto held = p.get_future();
        server.handle(std::move(r), pss::Responder([p = std::move(p)](pss::Reply&& x) mutable { p.set_value(std::move(x)); }));
        CHECK(create(2).code == pss::ErrorCode::already_exists);
        server.clear("a new chief began a new run");
        CHECK(server.num_shards() == 0);
        REQUIRE(held.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
        const pss::Reply answer = held.get();
        CHECK(answer.code == pss::ErrorCode::not_found);
        CHECK(answer.message == "pss: read on variable 'w' for step 5 was waiting when a new chief began a new run; "
                                "the step will not be applied");
        REQUIRE(create(3).ok());
        pss::Request read;
        read.op = pss::Op::read;
        read.key = {1, 0};
        CHECK(server.handle(std::move(read)).take().get<float>() == xt::xarray<float>{3});
    }
}

/// A near miss of Transport: its serve takes a handler that returns the Reply (no Responder).
struct ReplyNowTransport {
    explicit ReplyNowTransport(const pss::ClusterSpec&) {}
    void serve(const pss::TaskId&, std::function<pss::Reply(pss::Request&&)>) {}
    std::future<pss::Reply> send(const pss::TaskId&, pss::Request) { return {}; }
    void shutdown() {}
};

TEST_SUITE("ParameterServerStrategy") {
    TEST_CASE("ParameterServerStrategy: num_replicas_in_sync is 1 and the default cluster is 2 ps, 2 workers") {
        pss::ParameterServerStrategy<> strategy;
        CHECK(strategy.num_replicas_in_sync() == 1);
        CHECK(strategy.num_ps() == 2);
        CHECK(strategy.num_workers() == 2);
    }
    TEST_CASE("ParameterServerStrategy: get_strategy is the scoped strategy inside scope(), the default outside") {
        pss::ParameterServerStrategy<> strategy;
        pss::Strategy& outside = pss::get_strategy();
        CHECK_FALSE(pss::has_strategy());
        CHECK(&outside != &strategy);
        {
            auto scope = strategy.scope();
            CHECK(&pss::get_strategy() == &strategy);
            CHECK(pss::has_strategy());
            pss::ParameterServerStrategy<> inner;
            {
                auto inner_scope = inner.scope();
                CHECK(&pss::get_strategy() == &inner);
            }
            CHECK(&pss::get_strategy() == &strategy);
        }
        CHECK(&pss::get_strategy() == &outside);
        CHECK(outside.num_replicas_in_sync() == 1);
    }
    TEST_CASE("ParameterServerStrategy: a learning-rate schedule is evaluated on each ps at the step a push "
              "names; set_learning_rate sets one rate on every ps task") {
        // Rate 1.0 through iterations 2 (steps 1 to 3), then 0.1; one shard on each of the 2 ps tasks.
        Fixed strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(pss::PiecewiseConstantDecay({2}, {1.0, 0.1})));
        auto scope = strategy.scope();
        pss::Variable w(xt::xarray<float>{0, 0}, "w");
        (void)w.apply_gradient(xt::xarray<float>{1, 2}, 1);
        CHECK(w.read<float>() == xt::xarray<float>{-1, -2});
        (void)w.apply_gradient(xt::xarray<float>{1, 2}, 4);
        CHECK(w.read<float>() == xt::xarray<float>{-1 - 0.1f * 1, -2 - 0.1f * 2});
        (void)w.apply_sparse_gradient(Ids{1}, xt::xarray<float>{1}, 3);  // iterations 2: still 1.0
        CHECK(w.read<float>() == xt::xarray<float>{-1 - 0.1f * 1, -2 - 0.1f * 2 - 1});
        // A push that names no step cannot be given its rate: refused before anything changes.
        const xt::xarray<float> before = w.read<float>();
        CHECK_THROWS_WITH_AS((void)w.apply_gradient(xt::xarray<float>{1, 2}),
                             "pss: apply_gradient on variable 'w/part_0': the optimizer's learning rate is a schedule "
                             "(PiecewiseConstantDecay), so each push must name its training step (1, 2, ...) for the "
                             "schedule to be evaluated at: apply_gradient(gradient, step) (Sequential::fit does)",
                             pss::FailedPreconditionError);
        CHECK(w.read<float>() == before);
        CHECK(strategy.learning_rate() == strategy.optimizer().learning_rate());
        CHECK_THROWS_WITH_AS(strategy.set_learning_rate(0.5),
                             "pss: set_learning_rate: the optimizer's learning rate is a schedule "
                             "(PiecewiseConstantDecay), which gives the rate of each step; it cannot also be set "
                             "(Keras refuses too)",
                             pss::FailedPreconditionError);

        Fixed constant({}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        auto constant_scope = constant.scope();
        pss::Variable u(xt::xarray<float>{0, 0}, "u");
        constant.set_learning_rate(0.5);
        CHECK(constant.learning_rate() == 0.5);
        (void)u.apply_gradient(xt::xarray<float>{1, 2});
        (void)u.apply_sparse_gradient(Ids{1}, xt::xarray<float>{2});
        CHECK(u.read<float>() == xt::xarray<float>{-0.5f, -2});
        constant.set_learning_rate(std::nullopt);
        CHECK(constant.learning_rate() == 0.1);
        (void)u.apply_gradient(xt::xarray<float>{1, 2});
        CHECK(u.read<float>() == xt::xarray<float>{-0.5f - 0.1f * 1, -2 - 0.1f * 2});
        CHECK_THROWS_WITH_AS(constant.set_learning_rate(-1),
                             "pss: SGD: learning_rate is -1, but it must be a finite number >= 0 (the step size; "
                             "Keras' default is 0.01)",
                             pss::InvalidArgumentError);
        CHECK(constant.learning_rate() == 0.1);
        // What a peer may send a ps: only a float64 scalar is a rate.
        pss::ParameterServer<pss::SGD> ps(pss::SGD(0.1));
        pss::Request r;
        r.op = pss::Op::set_learning_rate;
        r.payload = xt::xarray<float>{0.5f};
        const pss::Reply reply = ps.handle(std::move(r));
        CHECK(reply.code == pss::ErrorCode::invalid_argument);
        CHECK(reply.message == "pss: set_learning_rate: the rate is a float64 scalar, but a float32 of shape (1,) was sent");
    }
    TEST_CASE("ParameterServerStrategy: in synchronous training a step's mean gradient is applied at the rate "
              "of that step") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<1, 2>, pss::Synchronous>
            strategy({}, {}, pss::SGD(pss::PiecewiseConstantDecay({0}, {1.0, 0.1})));
        auto scope = strategy.scope();
        pss::Variable s(xt::xarray<float>{0}, "s");
        for (const float g : {1.0f, 3.0f}) (void)s.apply_gradient(xt::xarray<float>{g}, 1);  // both workers' pushes
        CHECK(s.read<float>() == xt::xarray<float>{-2});  // mean 2 at rate 1.0
        for (const float g : {1.0f, 3.0f}) (void)s.apply_gradient(xt::xarray<float>{g}, 2);
        CHECK(s.read<float>() == xt::xarray<float>{-2 - 0.1f * 2});
    }
    TEST_CASE("ParameterServerStrategy: with 3 ps, four variables land on ps 0, 1, 2, 0") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<3, 1>>
            strategy;
        auto scope = strategy.scope();
        std::vector<int> tasks;
        for (int i = 0; i < 4; ++i) tasks.push_back(pss::Variable(xt::xarray<float>{1.0f}).shard_tasks().front());
        CHECK(tasks == std::vector<int>{0, 1, 2, 0});
        static_assert(decltype(strategy)::shard_placement<4>() == std::array{0, 1, 2, 0});
    }
    TEST_CASE("ParameterServerStrategy: 4 shards on 2 ps land on 0, 1, 0, 1 and are named name/part_i") {
        Fixed strategy({}, pss::FixedShardsPartitioner(4));
        auto scope = strategy.scope();
        pss::Variable v(xt::xarray<float>(xt::zeros<float>({10, 3})), "emb");
        CHECK(v.is_sharded());
        CHECK(v.shard_tasks() == std::vector<int>{0, 1, 0, 1});
        static_assert(Fixed::shard_placement<4>() == std::array{0, 1, 0, 1});
        auto shards = v.shards();
        REQUIRE(shards.size() == 4);
        CHECK(shards[0].name() == "emb/part_0:0");
        CHECK(shards[3].name() == "emb/part_3:0");
        // 10 rows over 4 shards: the first 10 % 4 = 2 shards get one extra row.
        CHECK(shards[0].shape() == pss::Shape{3, 3});
        CHECK(shards[1].shape() == pss::Shape{3, 3});
        CHECK(shards[2].shape() == pss::Shape{2, 3});
        CHECK(shards[3].shape() == pss::Shape{2, 3});
        CHECK(shards[1].device() == "/job:ps/replica:0/task:1/device:CPU:0");
        // The next variable continues the round-robin where the shards stopped.
        CHECK(pss::Variable(xt::xarray<float>{1.0f}).shard_tasks() == std::vector<int>{0});
    }
    TEST_CASE("ParameterServerStrategy: colocate_vars_with puts new variables whole on the variable's ps task, "
              "without advancing the round-robin, as TensorFlow's") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<3, 1>>
            strategy({}, pss::FixedShardsPartitioner(2));
        auto scope = strategy.scope();
        pss::Variable a(xt::xarray<float>{1, 2}, "a");        // shards on ps 0, 1
        pss::Variable b(xt::xarray<float>{3, 4, 5, 6}, "b");  // shards on ps 2, 0
        CHECK(b.shard_tasks() == std::vector<int>{2, 0});
        {
            auto beside_b = strategy.colocate_vars_with(b);
            pss::Variable c(xt::xarray<float>{7, 8, 9}, "c");
            CHECK(c.shard_tasks() == std::vector<int>{2});  // b's first shard's task, one shard
            CHECK(c.device() == "/job:ps/replica:0/task:2/device:CPU:0");
            CHECK(c.read<float>() == xt::xarray<float>{7, 8, 9});
            CHECK(strategy.variables().size() == 3);  // a colocated variable is the strategy's as any other
            {
                auto beside_a = strategy.colocate_vars_with(a);  // nested: the innermost wins
                CHECK(pss::Variable(xt::xarray<float>{1}, "d").shard_tasks() == std::vector<int>{0});
            }
            CHECK(pss::Variable(xt::xarray<float>{1}, "e").shard_tasks() == std::vector<int>{2});
        }
        // The round-robin goes on where b left it: ps 1, then 2.
        CHECK(pss::Variable(xt::xarray<float>{1, 2}, "f").shard_tasks() == std::vector<int>{1, 2});
        pss::ParameterServerStrategy<> other;
        pss::Variable foreign = [&] {
            auto other_scope = other.scope();
            return pss::Variable(xt::xarray<float>{1}, "foreign");
        }();
        CHECK_THROWS_WITH_AS((void)strategy.colocate_vars_with(foreign),
                             "pss: colocate_vars_with: variable 'foreign:0' lives on "
                             "/job:ps/replica:0/task:0/device:CPU:0 and was not created by this strategy; colocate "
                             "with one of its variables",
                             pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)strategy.colocate_vars_with(pss::Variable()), pss::FailedPreconditionError);
    }
    TEST_CASE("ParameterServerStrategy: a partitioner answering 0 is refused; more shards than rows are a shard "
              "per row, as TensorFlow's min(num_partitions, shape[0])") {
        using S = pss::ParameterServerStrategy<pss::InProcessTransport, AnswerPartitioner>;
        S zero({}, AnswerPartitioner{0});
        auto scope = zero.scope();
        CHECK_THROWS_WITH_AS(pss::Variable(xt::xarray<float>{1, 2, 3}, "w"),
                             "pss: variable 'w' of shape (3,): the partitioner answered 0 shards; it must answer at "
                             "least 1",
                             pss::InvalidArgumentError);
        S four({}, AnswerPartitioner{4});
        auto scope4 = four.scope();
        pss::Variable clamped(xt::xarray<float>{1, 2, 3}, "w");
        CHECK(clamped.num_shards() == 3);
        CHECK(clamped.shard_tasks() == std::vector<int>{0, 1, 0});
        CHECK(clamped.read<float>() == xt::xarray<float>{1, 2, 3});
        CHECK(clamped.shards()[2].shape() == pss::Shape{1});
        // No rows: one empty shard.
        CHECK(pss::Variable(xt::xarray<float>(xt::zeros<float>({0, 2})), "none").num_shards() == 1);
        // A scalar is never partitioned: the partitioner is not asked.
        CHECK(pss::Variable(xt::xarray<float>(2.0f), "s").num_shards() == 1);
    }
    TEST_CASE("ParameterServerStrategy: a cluster without ps or without workers is refused") {
        using S = pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                               pss::SimpleClusterResolver>;
        CHECK_THROWS_WITH_AS(S(pss::SimpleClusterResolver(pss::ClusterSpec{{"worker", {"w:1"}}})),
                             "pss: ParameterServerStrategy: the cluster has no \"ps\" job; ParameterServerStrategy "
                             "needs at least one ps task",
                             pss::InvalidArgumentError);
        CHECK_THROWS_AS(S(pss::SimpleClusterResolver(pss::ClusterSpec{{"ps", {"p:1"}}})), pss::InvalidArgumentError);
        // TF_CONFIG {} reads as TensorFlow's empty cluster; the strategy refuses it.
        using TF = pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                                pss::TFConfigClusterResolver>;
        CHECK_THROWS_WITH_AS(TF(pss::TFConfigClusterResolver("{}")),
                             "pss: ParameterServerStrategy: the cluster has no \"ps\" job; ParameterServerStrategy "
                             "needs at least one ps task",
                             pss::InvalidArgumentError);
    }
    TEST_CASE("ParameterServerStrategy: composes from the five archetypes, using nothing undocumented") {
        using S = pss::ParameterServerStrategy<pss::archetypes::TransportArchetype, pss::archetypes::PartitionerArchetype,
                                               pss::archetypes::OptimizerArchetype,
                                               pss::archetypes::ClusterResolverArchetype,
                                               pss::archetypes::ConsistencyArchetype>;
        static_assert(std::is_base_of_v<pss::Strategy, S>);
        static_assert(pss::Transport<pss::archetypes::TransportArchetype>);
        static_assert(pss::Transport<pss::InProcessTransport>);
        static_assert(!pss::Transport<ReplyNowTransport>);  // a near miss: its handler must return the Reply
        // The archetype transport runs requests on the caller's thread, so the whole path is exercised.
        S strategy(pss::archetypes::ClusterResolverArchetype{}, pss::archetypes::PartitionerArchetype(0),
                   pss::archetypes::OptimizerArchetype(0));
        auto scope = strategy.scope();
        pss::Variable v(xt::xarray<float>{1, 2}, "a");
        v.assign_add(xt::xarray<float>{1, 1});
        CHECK(v.read<float>() == xt::xarray<float>{2, 3});
    }
}

TEST_SUITE("InitializerSpec") {
    /// The whole value of a variable drawn by `init` in `shards` shards over 3 ps (1: unsharded).
    xt::xarray<float> drawn_in(std::size_t shards, const pss::InitializerSpec& init, const pss::Shape& shape) {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<3, 1>>
            strategy({}, pss::FixedShardsPartitioner(shards));
        auto scope = strategy.scope();
        pss::Variable v(shape, pss::DType::float32, init, "table");
        REQUIRE(v.num_shards() == std::min(shards, shape[0]));
        return v.read<float>();
    }

    TEST_CASE("InitializerSpec: each kind's first values for seed 42 are these exact float32 numbers") {
        const pss::Shape shape{2, 3};
        CHECK(drawn_in(1, pss::InitializerSpec::random_uniform(-1, 1, 42), shape) ==
              xt::xarray<float>{{0.19223775f, -0.276364267f, 0.903883278f}, {0.491105705f, -0.343751252f, -0.247585312f}});
        CHECK(drawn_in(1, pss::InitializerSpec::random_normal(0, 1, 42), shape) ==
              xt::xarray<float>{{0.543052673f, 0.929331958f, 0.294828206f}, {0.282097548f, -0.595020056f, -0.504970431f}});
        CHECK(drawn_in(1, pss::InitializerSpec::random_normal(1, 2, 42), shape) ==
              xt::xarray<float>{{2.08610535f, 2.85866404f, 1.58965635f}, {1.56419516f, -0.190040112f, -0.00994083006f}});
        CHECK(drawn_in(1, pss::InitializerSpec::constant(2.5), shape) == xt::xarray<float>(xt::ones<float>(shape) * 2.5f));
        CHECK(drawn_in(1, pss::InitializerSpec::ones(), shape) == xt::xarray<float>(xt::ones<float>(shape)));
        CHECK(drawn_in(1, pss::InitializerSpec::zeros(), shape) == xt::xarray<float>(xt::zeros<float>(shape)));
        // A truncated normal draws the normal's values, except where that is beyond 2 stddev: element 74
        // of seed 42 (-2.3423233) is drawn again.
        const xt::xarray<float> normal = drawn_in(1, pss::InitializerSpec::random_normal(0, 1, 42), {200});
        const xt::xarray<float> truncated = drawn_in(1, pss::InitializerSpec::truncated_normal(0, 1, 42), {200});
        CHECK(normal(74) == -2.3423233f);
        CHECK(truncated(74) == 0.203332663f);
        CHECK(truncated(125) == 0.716231942f);
        std::size_t redrawn = 0;
        for (std::size_t i = 0; i < 200; ++i) redrawn += normal(i) != truncated(i);
        CHECK(redrawn == 3);
        // Another seed, other values; float64 draws the same numbers, rounded once.
        CHECK(drawn_in(1, pss::InitializerSpec::random_uniform(-1, 1, 43), shape)(0, 0) != 0.19223775f);
        pss::ParameterServerStrategy<> strategy;
        auto scope = strategy.scope();
        const pss::Variable wide(pss::Shape{2}, pss::DType::float64, pss::InitializerSpec::random_uniform(-1, 1, 42), "wide");
        CHECK(wide.read<double>() == xt::xarray<double>{0.19223774366041524, -0.27636427521635154});
        const pss::Variable ints(pss::Shape{3}, pss::DType::int64, pss::InitializerSpec::constant(-3), "ints");
        CHECK(ints.read<std::int64_t>() == xt::xarray<std::int64_t>{-3, -3, -3});
    }

    TEST_CASE("InitializerSpec: a variable drawn in 1, 2, 3 or 7 shards, in or outside a scope, holds the same bits") {
        for (const auto& init : {pss::InitializerSpec::random_uniform(-0.05, 0.05, 7), pss::InitializerSpec::random_normal(0, 1, 7),
                                 pss::InitializerSpec::truncated_normal(0.5, 2, 7)}) {
            CAPTURE(pss::initializer_kind_name(init.kind));
            const xt::xarray<float> one = drawn_in(1, init, {7, 5});
            CHECK(drawn_in(2, init, {7, 5}) == one);
            CHECK(drawn_in(3, init, {7, 5}) == one);
            CHECK(drawn_in(7, init, {7, 5}) == one);
            // Outside any scope the coordinator draws the whole value itself, the same way.
            CHECK(pss::Variable(pss::Shape{7, 5}, pss::DType::float32, init, "local").read<float>() == one);
            // The rows of a taller variable continue the same sequence: row i is the same in both.
            const xt::xarray<float> taller = drawn_in(3, init, {9, 5});
            CHECK(xt::xarray<float>(xt::view(taller, xt::range(0, 7), xt::all())) == one);
        }
    }

    TEST_CASE("InitializerSpec: 100000 draws of seed 7 have the distribution's mean and stddev") {
        auto moments = [](const pss::InitializerSpec& init) {
            pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner> strategy(
                {}, pss::FixedShardsPartitioner(2));
            auto scope = strategy.scope();
            const auto x = pss::Variable(pss::Shape{100000}, pss::DType::float64, init, "x").read<double>();
            const double mean = xt::mean(x)();
            const double stddev = std::sqrt(xt::mean(xt::square(x - mean))());
            return std::array{mean, stddev, xt::amin(x)(), xt::amax(x)()};
        };
        const auto uniform = moments(pss::InitializerSpec::random_uniform(-1, 1, 7));
        CHECK(std::abs(uniform[0]) < 0.002);
        CHECK(std::abs(uniform[1] - 1 / std::sqrt(3.0)) < 0.001);
        CHECK(uniform[2] >= -1.0);
        CHECK(uniform[3] < 1.0);
        const auto normal = moments(pss::InitializerSpec::random_normal(0, 1, 7));
        CHECK(std::abs(normal[0]) < 0.005);
        CHECK(std::abs(normal[1] - 1) < 0.002);
        CHECK(normal[2] < -4.4);  // tails are there
        const auto truncated = moments(pss::InitializerSpec::truncated_normal(0, 1, 7));
        CHECK(std::abs(truncated[0]) < 0.005);
        CHECK(std::abs(truncated[1] - 0.87962566103423978) < 0.002);  // N(0, 1) truncated at 2
        CHECK(truncated[2] >= -2.0);
        CHECK(truncated[3] <= 2.0);
    }

    TEST_CASE("InitializerSpec: colocate_vars_with, recreate_shards and a wrong initializer, each as for a value") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<3, 1>>
            strategy({}, pss::FixedShardsPartitioner(2));
        auto scope = strategy.scope();
        const auto init = pss::InitializerSpec::random_uniform(-1, 1, 5);
        pss::Variable a(pss::Shape{4, 2}, pss::DType::float32, init, "a");
        CHECK(a.shard_tasks() == std::vector<int>{0, 1});
        {
            auto beside = strategy.colocate_vars_with(a);
            pss::Variable c(pss::Shape{4, 2}, pss::DType::float32, init, "c");
            CHECK(c.shard_tasks() == std::vector<int>{0});
            CHECK(c.read<float>() == a.read<float>());  // the layout does not change the values
        }
        // A lost ps task's shards come back as zeros, as any variable's.
        CHECK(strategy.recreate_shards(1) == 0);  // still held: nothing recreated
        CHECK_THROWS_WITH_AS(pss::Variable(pss::Shape{3}, pss::DType::int32, init, "n"),
                             "pss: variable 'n' of shape (3,) and dtype int32: random_uniform draws floats, but the "
                             "variable is int32; random initializers fill float32 or float64 variables",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::Variable(pss::Shape{3}, pss::DType::float32, pss::InitializerSpec::random_uniform(1, 0, 5), "u"),
                             "pss: variable 'u' of shape (3,) and dtype float32: random_uniform: minval is 1 and "
                             "maxval 0; they are finite numbers with minval <= maxval (and a finite difference)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::Variable(pss::Shape{3}, pss::DType::float32, pss::InitializerSpec::random_normal(0, -1, 5), "n"),
                             "pss: variable 'n' of shape (3,) and dtype float32: random_normal: mean is 0 and stddev -1; "
                             "they are finite numbers with stddev >= 0",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::Variable(pss::Shape{3}, pss::DType::string, pss::InitializerSpec::zeros(), "s"),
                             "pss: variable 's' of shape (3,) and dtype string: zeros cannot fill a string variable; "
                             "create it from its value",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::Variable(pss::Shape{3}, pss::DType::int32, pss::InitializerSpec::constant(0.5), "k"),
                             "pss: variable 'k' of shape (3,) and dtype int32: constant: value is 0.5, not a whole "
                             "number an int32 holds",
                             pss::InvalidArgumentError);
        pss::InitializerSpec unknown;
        unknown.kind = static_cast<pss::InitializerKind>(9);
        CHECK_THROWS_WITH_AS(pss::Variable(pss::Shape{3}, pss::DType::float32, unknown, "x"),
                             "pss: variable 'x' of shape (3,) and dtype float32: initializer kind 9 is unknown; kinds "
                             "are 1 (zeros) to 6 (truncated_normal)",
                             pss::InvalidArgumentError);
        CHECK(strategy.variables().size() == 1);  // a (c went with its handle); a refused variable was never created
    }

    TEST_CASE("ParameterServer: a create request with both a value and an initializer, or neither, is refused; "
              "one whose rows fall outside the variable too") {
        pss::ParameterServer<pss::SGD> server;
        pss::Request create;
        create.op = pss::Op::create;
        create.key = {1, 0};
        create.name = "w";
        create.payload = xt::xarray<float>{1};
        create.initializer = pss::ShardInitializer{pss::InitializerSpec::ones(), pss::DType::float32, {1}, 0, 1};
        pss::Reply both = server.handle(pss::Request(create));
        CHECK(both.message == "pss: create variable 'w': both an initial value and an initializer were sent; send one");
        create.payload = {};
        create.initializer.reset();
        CHECK(server.handle(pss::Request(create)).message ==
              "pss: create variable 'w': no initial value and no initializer were sent");
        create.initializer = pss::ShardInitializer{pss::InitializerSpec::ones(), pss::DType::float32, {4, 2}, 3, 2};
        CHECK(server.handle(pss::Request(create)).message ==
              "pss: create variable 'w': the shard's 2 rows from row 3 are not inside the variable's 4 rows");
        CHECK(server.num_shards() == 0);
        create.initializer->rows = 1;
        REQUIRE(server.handle(pss::Request(create)).ok());
        pss::Request read;
        read.op = pss::Op::read;
        read.key = {1, 0};
        CHECK(server.handle(std::move(read)).payload.get<float>() == xt::xarray<float>{{1, 1}});
    }
}

TEST_SUITE("Variable") {
    TEST_CASE("Variable: weights int32 [1, 2, 3, 4, 5] prints as TensorFlow prints it") {
        pss::ParameterServerStrategy<> strategy;
        auto scope = strategy.scope();
        pss::Variable weights(xt::xarray<std::int32_t>{1, 2, 3, 4, 5}, "weights");
        std::ostringstream os;
        os << weights;
        CHECK(os.str() == "<pss::Variable 'weights:0' shape=(5,) dtype=int32, value=[1, 2, 3, 4, 5]>");
        CHECK(weights.device() == "/job:ps/replica:0/task:0/device:CPU:0");
    }
    TEST_CASE("OneDeviceStrategy: variables on this process's CPU, with the scope, run, reduce and optimizer of "
              "every strategy, so that code written for pss::Strategy& switches strategies") {
        // One training step written once, for any strategy.
        auto train = [](pss::Strategy& strategy) {
            auto scope = strategy.scope();
            pss::Variable w(xt::xarray<float>{1, 2}, "w");
            CHECK(&pss::get_strategy() == &strategy);
            const float doubled = strategy.run([&](float x) { return 2 * x; }, 3.0f);
            w.apply_gradient(xt::xarray<float>{doubled, -doubled});
            return std::pair{w.read<float>(), w.device()};
        };
        pss::OneDeviceStrategy<> one("/cpu:0", pss::SGD(0.5));
        CHECK(one.num_replicas_in_sync() == 1);
        CHECK(one.device() == "/job:localhost/replica:0/task:0/device:CPU:0");
        const auto [on_one, device] = train(one);
        CHECK(on_one == xt::xarray<float>{-2, 5});  // 1 - 0.5 * 6, 2 + 0.5 * 6
        CHECK(device == "/job:localhost/replica:0/task:0/device:CPU:0");
        pss::ParameterServerStrategy<> ps({}, {}, pss::SGD(0.5));
        const auto [on_ps, ps_device] = train(ps);
        CHECK(on_ps == on_one);
        CHECK(ps_device == "/job:ps/replica:0/task:0/device:CPU:0");
        CHECK(pss::OneDeviceStrategy<>("/device:CPU:1").device() == "/job:localhost/replica:0/task:0/device:CPU:1");
        CHECK(pss::OneDeviceStrategy<>("/job:localhost/replica:0/task:0/device:CPU:0").device() == one.device());
        CHECK_THROWS_WITH_AS(pss::OneDeviceStrategy<>("/gpu:0"),
                             "pss: OneDeviceStrategy: device \"/gpu:0\" is not a CPU of this process; pss holds "
                             "variables in CPU memory: give \"/cpu:0\"",
                             pss::InvalidArgumentError);
    }
    TEST_CASE("Variable: outside any scope it lives on the coordinator") {
        pss::Variable v(xt::xarray<double>{1.5, 2.5}, "local");
        CHECK(v.device() == "/job:localhost/replica:0/task:0/device:CPU:0");
        v.assign_add(xt::xarray<double>{1, 1});
        CHECK(v.read<double>() == xt::xarray<double>{2.5, 3.5});
        CHECK(v.to_string() == "<pss::Variable 'local:0' shape=(2,) dtype=float64, value=[2.5, 3.5]>");
    }
    TEST_CASE_TEMPLATE("Variable: every element type round-trips through a ps", T, float, double, std::int32_t,
                       std::int64_t) {
        pss::ParameterServerStrategy<> strategy;
        auto scope = strategy.scope();
        pss::Variable v(xt::xarray<T>{{1, 2}, {3, 4}}, "v");
        CHECK(v.dtype() == pss::dtype_of<T>);
        CHECK(v.read<T>() == xt::xarray<T>{{1, 2}, {3, 4}});
        v.assign(xt::xarray<T>{{5, 6}, {7, 8}});
        v.assign_add(xt::xarray<T>{{1, 1}, {1, 1}});
        v.assign_sub(xt::xarray<T>{{2, 2}, {2, 2}});
        CHECK(v.read<T>() == xt::xarray<T>{{4, 5}, {6, 7}});
    }
    TEST_CASE("Variable: sharded read, assign and assign_add see the whole value") {
        ShardedFixture f;
        CHECK(f.v.num_shards() == 3);
        CHECK(f.v.shards()[0].shape() == pss::Shape{4, 2});
        CHECK(f.v.read<float>() == xt::reshape_view(xt::arange<float>(20), {10, 2}));
        f.v.assign_add(xt::xarray<float>(xt::ones<float>({10, 2})));
        CHECK(f.v.read<float>() == xt::reshape_view(xt::arange<float>(1, 21), {10, 2}));
        f.v.assign(xt::xarray<float>(xt::zeros<float>({10, 2})));
        CHECK(f.v.read<float>() == xt::xarray<float>(xt::zeros<float>({10, 2})));
    }
    TEST_CASE("Variable: slice reads rows across shard boundaries and cuts the other axes") {
        ShardedFixture f;  // rows 0-3 on shard 0, 4-6 on shard 1, 7-9 on shard 2; row r is (2r, 2r + 1)
        CHECK(f.v.slice({3}, {8}).get<float>() == xt::xarray<float>{{6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
        CHECK(f.v.slice({4}, {7}).get<float>() == xt::xarray<float>{{8, 9}, {10, 11}, {12, 13}});  // shard 1 alone
        xt::xarray<float> column = {3, 5, 7, 9, 11, 13, 15, 17};  // rows 1 to 8 of column 1
        column.reshape({8, 1});
        CHECK(f.v.slice({1, 1}, {9, 2}).get<float>() == column);
        CHECK(f.v.slice({}, {}).get<float>() == f.v.read<float>());
        CHECK(f.v.slice({2, 0}, {2, 2}).shape() == pss::Shape{0, 2});
        pss::ParameterServerStrategy<> strategy;
        auto scope = strategy.scope();
        const xt::xarray<std::int64_t> cube = xt::reshape_view(xt::arange<std::int64_t>(24), {2, 3, 4});
        pss::Variable v(cube, "cube");
        CHECK(v.slice({0, 1, 1}, {2, 3, 3}).get<std::int64_t>() ==
              xt::xarray<std::int64_t>(xt::view(cube, xt::all(), xt::range(1, 3), xt::range(1, 3))));
        CHECK(v.slice({1, 2}, {2, 3}).get<std::int64_t>() == xt::xarray<std::int64_t>{{{20, 21, 22, 23}}});
        const std::string prefix = "pss: slice of variable 'table:0' of shape (10, 2) from ";
        CHECK_THROWS_WITH_AS((void)f.v.slice({5}, {3}), (prefix + "(5,) to (3,): axis 0 begins at 5, after its end 3").c_str(),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)f.v.slice({0, 0}, {10, 3}),
                             (prefix + "(0, 0) to (10, 3): axis 1 ends at 3, beyond its size 2").c_str(),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)f.v.slice({0, 0, 0}, {1, 1, 1}),
                             (prefix + "(0, 0, 0) to (1, 1, 1): the variable has 2 axes, fewer than the 3 sliced").c_str(),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)f.v.slice({0}, {1, 2}),
                             (prefix + "(0,) to (1, 2): begin and end must have one entry per axis sliced").c_str(),
                             pss::InvalidArgumentError);
    }
    TEST_CASE("Variable: sparse_read gives rows in the order asked, across shards, repeats included") {
        ShardedFixture f;
        Ids ids{9, 0, 5, 0, 4};
        CHECK(f.v.sparse_read(ids).get<float>() == xt::xarray<float>{{18, 19}, {0, 1}, {10, 11}, {0, 1}, {8, 9}});
        CHECK(pss::embedding_lookup(f.v, Ids{3}).get<float>() == xt::xarray<float>{{6, 7}});
        CHECK(f.v.sparse_read(Ids{}).shape() == pss::Shape{0, 2});
    }
    TEST_CASE("embedding_lookup_sparse: each row combines its ids' embeddings by sum, mean or sqrtn, across shards") {
        ShardedFixture f;  // row r of the table is (2r, 2r + 1), in shards of 4, 3 and 3 rows
        using pss::Combiner;
        // Row 0: ids 1, 8; row 1: id 5; row 2: none; row 3: ids 9, 9, 0, 4.
        const pss::SparseIds sp{.rows = {0, 0, 1, 3, 3, 3, 3}, .ids = {1, 8, 5, 9, 9, 0, 4}, .batch_size = 4};
        CHECK(pss::embedding_lookup_sparse(f.v, sp, Combiner::sum).value.get<float>() ==
              xt::xarray<float>{{18, 20}, {10, 11}, {0, 0}, {44, 48}});
        CHECK(pss::embedding_lookup_sparse(f.v, sp).value.get<float>() ==  // mean, TensorFlow's default
              xt::xarray<float>{{9, 10}, {10, 11}, {0, 0}, {11, 12}});
        const pss::SparseIds four{.rows = {0, 3, 3, 3, 3}, .ids = {1, 9, 9, 0, 4}, .batch_size = 4};
        CHECK(pss::embedding_lookup_sparse(f.v, four, Combiner::sqrtn).value.get<float>() ==  // divided by sqrt(4)
              xt::xarray<float>{{2, 3}, {0, 0}, {0, 0}, {22, 24}});
        // Weighted: row 0 is 3 * e1 + 1 * e8, row 3 is 2 * (e9 + e9 + e0 + e4).
        const pss::SparseIds weighted{
            .rows = {0, 0, 3, 3, 3, 3}, .ids = {1, 8, 9, 9, 0, 4}, .weights = {3, 1, 2, 2, 2, 2}, .batch_size = 4};
        CHECK(pss::embedding_lookup_sparse(f.v, weighted, Combiner::sum).value.get<float>() ==
              xt::xarray<float>{{22, 26}, {0, 0}, {0, 0}, {88, 96}});
        CHECK(pss::embedding_lookup_sparse(f.v, weighted, Combiner::mean).value.get<float>() ==  // over 4 and 8
              xt::xarray<float>{{5.5, 6.5}, {0, 0}, {0, 0}, {11, 12}});
        const pss::SparseIds weighted_row3{.rows = {3, 3, 3, 3}, .ids = {9, 9, 0, 4}, .weights = {2, 2, 2, 2}, .batch_size = 4};
        CHECK(pss::embedding_lookup_sparse(f.v, weighted_row3, Combiner::sqrtn).value.get<float>() ==  // over sqrt(16)
              xt::xarray<float>{{0, 0}, {0, 0}, {0, 0}, {22, 24}});
    }
    TEST_CASE("embedding_lookup_sparse: the gradient flows to each id looked up as sparse rows, which train the table") {
        ShardedFixture f;  // SGD with learning rate 0.5
        const pss::SparseIds weighted{
            .rows = {0, 0, 3, 3, 3, 3}, .ids = {1, 8, 9, 9, 0, 4}, .weights = {3, 1, 2, 2, 2, 2}, .batch_size = 4};
        const pss::Tensor dy = xt::xarray<float>{{1, 2}, {5, 5}, {5, 5}, {4, 8}};
        auto sum = pss::embedding_lookup_sparse(f.v, weighted, pss::Combiner::sum).gradient(dy);
        CHECK(sum.ids == std::vector<std::int64_t>{1, 8, 9, 9, 0, 4});
        CHECK(sum.rows.get<float>() == xt::xarray<float>{{3, 6}, {1, 2}, {8, 16}, {8, 16}, {8, 16}, {8, 16}});
        auto mean = pss::embedding_lookup_sparse(f.v, weighted, pss::Combiner::mean).gradient(dy);
        CHECK(mean.rows.get<float>() ==
              xt::xarray<float>{{0.75, 1.5}, {0.25, 0.5}, {1, 2}, {1, 2}, {1, 2}, {1, 2}});  // 3/4, 1/4, 2/8
        f.v.apply_sparse_gradient(sum.ids, std::move(sum.rows));  // the ps sums id 9's two rows
        auto v = f.v.read<float>();
        CHECK(xt::view(v, 1) == xt::xarray<float>{0.5, 0});   // (2, 3) - 0.5 * (3, 6)
        CHECK(xt::view(v, 8) == xt::xarray<float>{15.5, 16});  // (16, 17) - 0.5 * (1, 2)
        CHECK(xt::view(v, 9) == xt::xarray<float>{10, 3});     // (18, 19) - 0.5 * (16, 32)
        CHECK(xt::view(v, 0) == xt::xarray<float>{-4, -7});    // (0, 1) - 0.5 * (8, 16)
        CHECK(xt::view(v, 5) == xt::xarray<float>{10, 11});    // untouched
        CHECK_THROWS_WITH_AS((void)pss::embedding_lookup_sparse(f.v, weighted).gradient(xt::xarray<float>{{1, 2}}),
                             "pss: the gradient of an embedding_lookup_sparse must have the shape (4, 2) and dtype "
                             "float32 of its value, got shape (1, 2) dtype float32",
                             pss::InvalidArgumentError);
    }
    TEST_CASE("safe_embedding_lookup_sparse: negative ids and weights not above 0 are pruned; an empty row is "
              "default_id's embedding, or zeros") {
        ShardedFixture f;
        // Row 0: id -1 (pruned), id 3; row 1: id 7 of weight 0 (pruned); row 2: id 2 of weight 2, id -5
        // (pruned); row 3: nothing.
        const pss::SparseIds sp{
            .rows = {0, 0, 1, 2, 2}, .ids = {-1, 3, 7, 2, -5}, .weights = {1, 1, 0, 2, 1}, .batch_size = 4};
        CHECK(pss::safe_embedding_lookup_sparse(f.v, sp).value.get<float>() ==
              xt::xarray<float>{{6, 7}, {0, 0}, {4, 5}, {0, 0}});
        auto with_default = pss::safe_embedding_lookup_sparse(f.v, sp, pss::Combiner::mean, 9);
        CHECK(with_default.value.get<float>() == xt::xarray<float>{{6, 7}, {18, 19}, {4, 5}, {18, 19}});
        auto g = with_default.gradient(xt::xarray<float>{{1, 1}, {2, 2}, {3, 3}, {4, 4}});
        CHECK(g.ids == std::vector<std::int64_t>{3, 2, 9, 9});  // the entries kept, then the defaults by row
        CHECK(g.rows.get<float>() == xt::xarray<float>{{1, 1}, {3, 3}, {2, 2}, {4, 4}});
        // The plain form prunes nothing: a negative id is out of range, as in TensorFlow.
        CHECK_THROWS_WITH_AS((void)pss::embedding_lookup_sparse(f.v, sp),
                             "pss: sparse_read on variable 'table:0': id -1 is out of range for shape (10, 2); ids "
                             "must be in [0, 10)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)pss::safe_embedding_lookup_sparse(f.v, {.rows = {0}, .ids = {10}, .batch_size = 1}),
                        pss::InvalidArgumentError);
    }
    TEST_CASE("embedding_lookup_sparse: malformed sparse ids are refused, naming what is wrong") {
        ShardedFixture f;
        const std::string where = "pss: embedding_lookup_sparse on variable 'table:0': ";
        CHECK_THROWS_WITH_AS((void)pss::embedding_lookup_sparse(f.v, {.rows = {0, 0}, .ids = {1}, .batch_size = 1}),
                             (where + "the sparse ids have 2 rows but 1 ids; give one row per id").c_str(),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(
            (void)pss::embedding_lookup_sparse(f.v, {.rows = {0}, .ids = {1}, .weights = {1, 2}, .batch_size = 1}),
            (where + "the sparse ids have 1 ids but 2 weights; give one weight per id, or none for weight 1").c_str(),
            pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::embedding_lookup_sparse(f.v, {.rows = {0, 2}, .ids = {1, 1}, .batch_size = 2}),
                             (where + "entry 1 is in row 2, outside the batch of 2 rows").c_str(),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::safe_embedding_lookup_sparse(f.v, {.batch_size = 1}, pss::Combiner::sum, -3),
                             "pss: safe_embedding_lookup_sparse on variable 'table:0': default_id is -3; it must be a "
                             "row of the variable",
                             pss::InvalidArgumentError);
        pss::ParameterServerStrategy<> strategy;
        auto scope = strategy.scope();
        pss::Variable counts(xt::xarray<std::int32_t>{1, 2}, "counts");
        CHECK_THROWS_WITH_AS((void)pss::embedding_lookup_sparse(counts, {.batch_size = 1}),
                             "pss: embedding_lookup_sparse on variable 'counts:0': the variable's dtype is int32; "
                             "embeddings are float32 or float64",
                             pss::InvalidArgumentError);
    }
    TEST_CASE("ShardedVariable from a list: the parts stay where they live and every operation sees their rows in "
              "order, uneven sizes included") {
        pss::ParameterServerStrategy<> strategy;  // 2 ps, no partitioner
        auto scope = strategy.scope();
        pss::Variable a(xt::xarray<float>{{0, 1}}, "a");                      // ps 0
        pss::Variable b(xt::xarray<float>{{2, 3}, {4, 5}, {6, 7}}, "b");      // ps 1
        pss::Variable c(xt::xarray<float>{{8, 9}, {10, 11}}, "c");            // ps 0
        pss::ShardedVariable s({a, b, c}, "s");
        CHECK(s.name() == "s:0");
        CHECK(s.shape() == pss::Shape{6, 2});
        CHECK(s.dtype() == pss::DType::float32);
        CHECK(s.shard_tasks() == std::vector<int>{0, 1, 0});
        CHECK(s.id() == 0);
        {
            const auto parts = s.shards();  // TensorFlow's s.variables: the parts themselves
            REQUIRE(parts.size() == 3);
            CHECK(parts[1].info_ptr() == b.info_ptr());
        }
        CHECK(s.read<float>() == xt::reshape_view(xt::arange<float>(12), {6, 2}));
        CHECK(s.shard_of_row(3) == pss::ShardRow{1, 2});
        CHECK(s.shard_of_row(4) == pss::ShardRow{2, 0});
        CHECK(s.sparse_read(Ids{5, 0, 3}).get<float>() == xt::xarray<float>{{10, 11}, {0, 1}, {6, 7}});
        CHECK(s.slice({1}, {4}).get<float>() == b.read<float>());
        s.scatter_add(Ids{0, 3, 4}, xt::xarray<float>{{100, 100}, {10, 10}, {1, 1}});
        s.assign_sub(xt::xarray<float>(xt::ones<float>({6, 2})));
        CHECK(a.read<float>() == xt::xarray<float>{{99, 100}});
        CHECK(b.read<float>() == xt::xarray<float>{{1, 2}, {3, 4}, {15, 16}});
        CHECK(c.read<float>() == xt::xarray<float>{{8, 9}, {9, 10}});
        // An id out of range changes no part.
        CHECK_THROWS_WITH_AS(s.scatter_add(Ids{5, 6}, xt::xarray<float>(xt::ones<float>({2, 2}))),
                             "pss: scatter_add on variable 's:0': id 6 is out of range for shape (6, 2); ids must be "
                             "in [0, 6)",
                             pss::InvalidArgumentError);
        CHECK(c.read<float>() == xt::xarray<float>{{8, 9}, {9, 10}});
        // The list keeps its parts alive: without any other handle they still serve it.
        const std::weak_ptr<const pss::detail::VariableInfo> held = a.info_ptr();
        a = pss::Variable();
        CHECK_FALSE(held.expired());
        CHECK(xt::view(s.read<float>(), 0) == xt::xarray<float>{99, 100});
        s = pss::Variable();
        CHECK(held.expired());
    }
    TEST_CASE("ShardedVariable from a list: a sharded part gives each of its shards, in order") {
        ShardedFixture f;  // 10 rows in shards of 4, 3 and 3
        auto scope = f.strategy.scope();
        pss::Variable extra(xt::xarray<float>{{20, 21}}, "extra");
        pss::ShardedVariable s({f.v, extra}, "joined");
        CHECK(s.num_shards() == 4);
        CHECK(s.shape() == pss::Shape{11, 2});
        CHECK(s.shards()[1].name() == "table/part_1:0");
        CHECK(s.read<float>() == xt::reshape_view(xt::arange<float>(22), {11, 2}));
        s.apply_sparse_gradient(Ids{10, 4}, xt::xarray<float>{{2, 2}, {4, 4}});  // SGD 0.5
        CHECK(extra.read<float>() == xt::xarray<float>{{19, 20}});
        CHECK(xt::view(f.v.read<float>(), 4) == xt::xarray<float>{6, 7});
    }
    TEST_CASE("ShardedVariable from a list: TensorFlow's checks, each naming what is wrong") {
        pss::ParameterServerStrategy<> strategy;
        auto scope = strategy.scope();
        CHECK_THROWS_WITH_AS(pss::ShardedVariable(std::vector<pss::Variable>{}, "s"),
                             "pss: ShardedVariable 's': the list of variables is empty; give a non-empty list of "
                             "variables",
                             pss::InvalidArgumentError);
        pss::Variable v(xt::xarray<std::int64_t>{0}, "v");
        CHECK_THROWS_WITH_AS(pss::ShardedVariable({v, pss::Variable()}, "s"),
                             "pss: ShardedVariable 's': element 1 of the list is an empty handle; every element must be "
                             "a variable",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::ShardedVariable({v, pss::Variable(xt::xarray<std::int32_t>{1})}, "s"),
                             "pss: ShardedVariable 's': all variables must have the same dtype; got dtypes [int64, "
                             "int32]",
                             pss::InvalidArgumentError);
        pss::Variable wide(xt::xarray<float>(xt::ones<float>({5, 10}))), wider(xt::xarray<float>(xt::ones<float>({5, 20})));
        CHECK_THROWS_WITH_AS(pss::ShardedVariable({wide, wider}, "s"),
                             "pss: ShardedVariable 's': all variables must have the same shape except for the first "
                             "axis; got shapes [(5, 10), (5, 20)]",
                             pss::InvalidArgumentError);
        pss::Variable scalar(xt::xarray<float>(3.0f), "k");
        CHECK_THROWS_WITH_AS(pss::ShardedVariable({scalar}, "s"),
                             "pss: ShardedVariable 's': element 0 ('k:0') is a scalar; the variables are joined along "
                             "axis 0",
                             pss::InvalidArgumentError);
        pss::ParameterServerStrategy<> other;
        const pss::Variable foreign = [&] {
            auto other_scope = other.scope();
            return pss::Variable(xt::xarray<float>(xt::ones<float>({1, 10})), "foreign");
        }();
        CHECK_THROWS_WITH_AS(pss::ShardedVariable({wide, foreign}, "s"),
                             "pss: ShardedVariable 's': element 1 ('foreign:0', on /job:ps/replica:0/task:0/device:CPU:0) "
                             "was created by another strategy than element 0 ('Variable:0'); the variables must share "
                             "one cluster",
                             pss::InvalidArgumentError);
    }
    TEST_CASE("Variable: scatter_add with a repeated id adds each row; scatter_update keeps the last") {
        ShardedFixture f;
        f.v.scatter_add(Ids{1, 8, 1}, xt::xarray<float>{{1, 1}, {2, 2}, {10, 10}});
        auto v = f.v.read<float>();
        CHECK(xt::view(v, 1) == xt::xarray<float>{13, 14});
        CHECK(xt::view(v, 8) == xt::xarray<float>{18, 19});
        f.v.scatter_sub(Ids{8}, xt::xarray<float>{{18, 19}});
        f.v.scatter_update(Ids{0, 0, 9}, xt::xarray<float>{{-1, -1}, {-2, -2}, {-3, -3}});
        v = f.v.read<float>();
        CHECK(xt::view(v, 0) == xt::xarray<float>{-2, -2});
        CHECK(xt::view(v, 8) == xt::xarray<float>{0, 0});
        CHECK(xt::view(v, 9) == xt::xarray<float>{-3, -3});
        CHECK(xt::view(v, 5) == xt::xarray<float>{10, 11});
    }
    TEST_CASE("Variable: scatter_mul, scatter_div, scatter_min and scatter_max combine each row in order, across "
              "uneven shards") {
        ShardedFixture f;  // rows 0-3 on shard 0, 4-6 on shard 1, 7-9 on shard 2; row r is (2r, 2r + 1)
        f.v.scatter_mul(Ids{1, 8, 1}, xt::xarray<float>{{2, 2}, {3, 3}, {10, 10}});
        f.v.scatter_div(Ids{9, 9}, xt::xarray<float>{{2, 2}, {-4, 4}});
        f.v.scatter_min(Ids{0, 5, 0}, xt::xarray<float>{{-1, 5}, {100, 0}, {3, -7}});
        f.v.scatter_max(Ids{4, 6}, xt::xarray<float>{{9, 0}, {0, 100}});
        CHECK(f.v.read<float>() == xt::xarray<float>{{-1, -7},      // min(0, -1, 3), min(1, 5, -7)
                                                     {40, 60},      // 2 * 2 * 10, 3 * 2 * 10
                                                     {4, 5},        // untouched
                                                     {6, 7},        // untouched
                                                     {9, 9},        // max(8, 9), max(9, 0)
                                                     {10, 0},       // min(10, 100), min(11, 0)
                                                     {12, 100},     // max(12, 0), max(13, 100)
                                                     {14, 15},      // untouched
                                                     {48, 51},      // 16 * 3, 17 * 3
                                                     {-2.25, 2.375}});  // 18 / 2 / -4, 19 / 2 / 4
        // A float divided by zero follows IEEE 754, as TensorFlow's does.
        f.v.scatter_div(Ids{2}, xt::xarray<float>{{0, 0}});
        CHECK(xt::view(f.v.read<float>(), 2) == xt::xarray<float>{std::numeric_limits<float>::infinity(),
                                                                 std::numeric_limits<float>::infinity()});
        CHECK_THROWS_WITH_AS(f.v.scatter_min(Ids{3}, xt::xarray<float>{{1, 1}, {2, 2}}),
                             "pss: scatter_min on variable 'table:0': expected shape (1, 2) dtype float32, got shape "
                             "(2, 2) dtype float32",
                             pss::InvalidArgumentError);
    }
    TEST_CASE("Variable: integer scatters divide toward zero and wrap around on overflow; a zero divisor changes "
              "no shard") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<2, 1>>
            strategy{{}, pss::FixedShardsPartitioner(2), pss::SGD(0.5)};
        auto scope = strategy.scope();
        constexpr std::int32_t low = std::numeric_limits<std::int32_t>::min();
        constexpr std::int32_t high = std::numeric_limits<std::int32_t>::max();
        pss::Variable v(xt::xarray<std::int32_t>{7, -7, high, low}, "counts");  // rows 0-1 and 2-3
        CHECK(v.num_shards() == 2);
        v.scatter_div(Ids{0, 1, 3}, xt::xarray<std::int32_t>{2, 2, -1});
        CHECK(v.read<std::int32_t>() == xt::xarray<std::int32_t>{3, -3, high, low});  // -low wraps to low
        v.scatter_mul(Ids{2}, xt::xarray<std::int32_t>{2});
        v.scatter_add(Ids{3}, xt::xarray<std::int32_t>{-1});
        CHECK(v.read<std::int32_t>() == xt::xarray<std::int32_t>{3, -3, -2, high});
        v.assign_add(xt::xarray<std::int32_t>{0, 0, 0, 1});
        v.assign_sub(xt::xarray<std::int32_t>{low, 0, 0, 0});
        CHECK(v.read<std::int32_t>() == xt::xarray<std::int32_t>{low + 3, -3, -2, low});
        CHECK_THROWS_WITH_AS(v.scatter_div(Ids{0, 2, 3}, xt::xarray<std::int32_t>{1, 2, 0}),
                             "pss: scatter_div on variable 'counts:0': row 2 of the divisor holds 0; an integer "
                             "variable cannot be divided by zero, so nothing was changed",
                             pss::InvalidArgumentError);
        CHECK(v.read<std::int32_t>() == xt::xarray<std::int32_t>{low + 3, -3, -2, low});
        v.scatter_min(Ids{1, 1}, xt::xarray<std::int32_t>{-5, 9});
        v.scatter_max(Ids{2}, xt::xarray<std::int32_t>{high});
        CHECK(v.read<std::int32_t>() == xt::xarray<std::int32_t>{low + 3, -5, high, low});
    }
    TEST_CASE("Variable: a string variable (a vocabulary) is sharded, read, gathered, sliced, scatter_updated and "
              "assigned across shards; arithmetic is refused before anything is sent") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                     pss::LocalClusterResolver<3, 1>>
            strategy{{}, pss::FixedShardsPartitioner(3), pss::SGD(0.5)};
        auto scope = strategy.scope();
        const xt::xarray<std::string> words{"the", "of", "and", "a", "to", "in", "is"};  // rows 0-2, 3-4, 5-6
        pss::Variable vocab(words, "vocab");
        CHECK(vocab.dtype() == pss::DType::string);
        CHECK(vocab.shard_tasks() == std::vector<int>{0, 1, 2});
        CHECK(vocab.read<std::string>() == words);
        CHECK(vocab.to_string() == "<pss::Variable 'vocab:0' shape=(7,) dtype=string, value=[b'the', b'of', b'and', "
                                   "b'a', b'to', b'in', b'is']>");
        CHECK(vocab.sparse_read(Ids{6, 0, 3, 6}).get<std::string>() == xt::xarray<std::string>{"is", "the", "a", "is"});
        CHECK(pss::embedding_lookup(vocab, Ids{4}).get<std::string>() == xt::xarray<std::string>{"to"});
        CHECK(vocab.slice({2}, {6}).get<std::string>() == xt::xarray<std::string>{"and", "a", "to", "in"});
        vocab.scatter_update(Ids{1, 5, 1}, xt::xarray<std::string>{"OF", "a much longer word than before", "Of"});
        CHECK(vocab.read<std::string>() ==
              xt::xarray<std::string>{"the", "Of", "and", "a", "to", "a much longer word than before", "is"});
        vocab.assign(xt::xarray<std::string>{"1", "22", "333", "", "55555", "6", "7777777"});
        CHECK(vocab.read<std::string>() == xt::xarray<std::string>{"1", "22", "333", "", "55555", "6", "7777777"});

        const std::string refused = "a string variable is read, assigned, gathered (sparse_read) and scatter_updated; ";
        CHECK_THROWS_WITH_AS(vocab.scatter_add(Ids{0}, xt::xarray<std::string>{"x"}),
                             ("pss: scatter_add on variable 'vocab:0': " + refused + "scatter_add computes with numbers").c_str(),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(vocab.assign_add(xt::xarray<std::string>(words)),
                             ("pss: assign_add on variable 'vocab:0': " + refused + "assign_add computes with numbers").c_str(),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(vocab.apply_gradient(xt::xarray<std::string>(words)),
                             ("pss: apply_gradient on variable 'vocab:0': " + refused + "apply_gradient computes with numbers").c_str(),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(vocab.scatter_update(Ids{7}, xt::xarray<std::string>{"x"}),
                             "pss: scatter_update on variable 'vocab:0': id 7 is out of range for shape (7,); ids must be "
                             "in [0, 7)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)vocab.read<float>(),
                             "pss: read of variable 'vocab:0' as float32: the variable's dtype is string",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(vocab.assign(xt::xarray<float>(xt::zeros<float>({7}))),
                             "pss: assign on variable 'vocab:0': expected shape (7,) dtype string, got shape (7,) dtype "
                             "float32",
                             pss::InvalidArgumentError);
        CHECK(vocab.read<std::string>() == xt::xarray<std::string>{"1", "22", "333", "", "55555", "6", "7777777"});

        // Rows of strings: a (3, 2) table split over 3 shards, cut along both axes.
        using namespace std::string_literals;  // {"a", "A"} alone would also be a std::string from two pointers
        pss::Variable pairs(xt::xarray<std::string>{{"a"s, "A"s}, {"b"s, "B"s}, {"c"s, "C"s}}, "pairs");
        xt::xarray<std::string> column{"B", "C"};
        column.reshape({2, 1});
        CHECK(pairs.slice({1, 1}, {3, 2}).get<std::string>() == column);
        CHECK(pairs.sparse_read(Ids{2, 0}).get<std::string>() == xt::xarray<std::string>{{"c"s, "C"s}, {"a"s, "A"s}});
    }
    TEST_CASE("Variable: apply_gradient and apply_sparse_gradient run the optimizer on the ps, summing repeated ids") {
        ShardedFixture f;  // SGD with learning rate 0.5
        f.v.apply_gradient(xt::xarray<float>(xt::ones<float>({10, 2}) * 2.0f));
        CHECK(f.v.read<float>() == xt::reshape_view(xt::arange<float>(20) - 1.0f, {10, 2}));
        f.v.apply_sparse_gradient(Ids{2, 7, 2}, xt::xarray<float>{{1, 1}, {4, 4}, {3, 3}});
        auto v = f.v.read<float>();
        CHECK(xt::view(v, 2) == xt::xarray<float>{1, 2});    // 3, 4 minus 0.5 * (1 + 3)
        CHECK(xt::view(v, 7) == xt::xarray<float>{11, 12});  // 13, 14 minus 0.5 * 4
        CHECK(xt::view(v, 3) == xt::xarray<float>{5, 6});
        // Many repeats over both shards (rows 0-4 and 5-9), more ids than the table has rows.
        Ids many;
        for (int i = 0; i < 40; ++i) many.push_back(std::vector<std::int64_t>{9, 0, 3, 5}[static_cast<std::size_t>(i % 4)]);
        f.v.apply_sparse_gradient(many, xt::xarray<float>(xt::ones<float>({40, 2}) * 0.25f));
        v = f.v.read<float>();
        CHECK(xt::view(v, 9) == xt::xarray<float>{15.75f, 16.75f});  // 17, 18 minus 0.5 * 10 * 0.25
        CHECK(xt::view(v, 0) == xt::xarray<float>{-2.25f, -1.25f});
        CHECK(xt::view(v, 3) == xt::xarray<float>{3.75f, 4.75f});
        CHECK(xt::view(v, 5) == xt::xarray<float>{7.75f, 8.75f});
        CHECK(xt::view(v, 2) == xt::xarray<float>{1, 2});
    }
    TEST_CASE("sum_duplicate_rows: a repeated id's rows are added into its first row in place, the repeats dropped") {
        // Rows where their ids are: positions are made only when an id repeats.
        Ids ids{5, 3, 5, 9, 3, 5};
        std::vector<std::size_t> positions;
        xt::xarray<float> rows{{1, 2}, {10, 20}, {3, 4}, {7, 7}, {30, 40}, {5, 6}};
        pss::detail::sum_duplicate_rows(ids, positions, rows.data(), 2);
        CHECK(ids == Ids{5, 3, 9});
        CHECK(positions == std::vector<std::size_t>{0, 1, 3});
        CHECK(rows == xt::xarray<float>{{9, 12}, {40, 60}, {3, 4}, {7, 7}, {30, 40}, {5, 6}});
        // No repeat: nothing changes, and no positions are made.
        Ids distinct{4, 1, 8};
        std::vector<std::size_t> none;
        xt::xarray<float> kept{{1, 1}, {2, 2}, {3, 3}};
        pss::detail::sum_duplicate_rows(distinct, none, kept.data(), 2);
        CHECK(distinct == Ids{4, 1, 8});
        CHECK(none.empty());
        CHECK(kept == xt::xarray<float>{{1, 1}, {2, 2}, {3, 3}});
        // Rows at positions of a larger buffer (a caller's, in this process): only those rows are read and
        // only first rows written; the sums keep the order given (1e8 + 1 - 1e8 is 0 in float32, not 1).
        Ids at_ids{2, 6, 2, 2};
        std::vector<std::size_t> at{7, 1, 4, 0};
        xt::xarray<float> buffer = xt::zeros<float>({8});  // 8 rows of one element
        buffer(7) = 1e8f;
        buffer(4) = 1.0f;
        buffer(0) = -1e8f;
        buffer(1) = 5.0f;
        buffer(3) = 42.0f;
        pss::detail::sum_duplicate_rows(at_ids, at, buffer.data(), 1);
        CHECK(at_ids == Ids{2, 6});
        CHECK(at == std::vector<std::size_t>{7, 1});
        CHECK(std::vector<float>(buffer.begin(), buffer.end()) == std::vector<float>{-1e8f, 5, 0, 42, 1, 0, 0, 0});
    }
    TEST_CASE("Variable: a sharded sparse gradient in this process is applied where its rows lie, each shard on its own") {
        ShardedFixture f;  // SGD 0.5; rows 0-3, 4-6 and 7-9 on 3 ps tasks in this process
        // Id 1 twice (shard 0), id 8 twice (shard 2) holding NaN and infinity: shard 2 refuses its rows (each
        // counted as it was sent, before the repeat is summed), shards 0 and 1 apply theirs.
        const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
        pss::Tensor spent;
        CHECK_THROWS_WITH_AS(spent = f.v.apply_sparse_gradient(
                                 Ids{1, 8, 5, 1, 8}, xt::xarray<float>{{2, 2}, {nan, 1}, {4, 4}, {6, 6}, {inf, 2}}),
                             "pss: apply_sparse_gradient on variable 'table/part_2': the gradient holds 2 non-finite "
                             "values (NaN or infinity) of 4; nothing was applied "
                             "(ServerOptions::refuse_non_finite_gradients)",
                             pss::InvalidArgumentError);
        auto v = f.v.read<float>();
        CHECK(xt::view(v, 1) == xt::xarray<float>{-2, -1});  // (2, 3) - 0.5 * (2 + 6)
        CHECK(xt::view(v, 5) == xt::xarray<float>{8, 9});    // (10, 11) - 0.5 * 4
        CHECK(xt::view(v, 8) == xt::xarray<float>{16, 17});  // refused: as it was
        // Every row is applied once and the buffer comes back with its shape, for the next step.
        spent = f.v.apply_sparse_gradient(Ids{9, 0, 4, 9}, xt::xarray<float>{{2, 2}, {4, 4}, {6, 6}, {8, 8}});
        CHECK(spent.shape() == pss::Shape{4, 2});
        v = f.v.read<float>();
        CHECK(xt::view(v, 9) == xt::xarray<float>{13, 14});  // (18, 19) - 0.5 * (2 + 8)
        CHECK(xt::view(v, 0) == xt::xarray<float>{-2, -1});
        CHECK(xt::view(v, 4) == xt::xarray<float>{5, 6});
        // In a Group the ps tasks may read the rows after the call returns: the buffer is not handed back.
        {
            pss::Group group;
            CHECK_FALSE(f.v.apply_sparse_gradient(Ids{2, 7}, xt::xarray<float>{{2, 2}, {2, 2}}).has_value());
            group.wait();
        }
        v = f.v.read<float>();
        CHECK(xt::view(v, 2) == xt::xarray<float>{3, 4});
        CHECK(xt::view(v, 7) == xt::xarray<float>{13, 14});
        // The scatters take their rows where they lie too, and leave them as they were; strings as well.
        const pss::Tensor added = f.v.scatter_add(Ids{0, 9, 0}, xt::xarray<float>{{1, 1}, {2, 2}, {3, 3}});
        CHECK(added.get<float>() == xt::xarray<float>{{1, 1}, {2, 2}, {3, 3}});
        v = f.v.read<float>();
        CHECK(xt::view(v, 0) == xt::xarray<float>{2, 3});    // (-2, -1) + 1 + 3
        CHECK(xt::view(v, 9) == xt::xarray<float>{15, 16});  // (13, 14) + 2
        auto scope = f.strategy.scope();
        using namespace std::string_literals;
        pss::Variable names(xt::xarray<std::string>(std::vector<std::size_t>{10, 1}, "-"s), "names");
        REQUIRE(names.num_shards() == 3);
        xt::xarray<std::string> updates = xt::xarray<std::string>(std::vector<std::size_t>{3, 1}, ""s);
        updates(0, 0) = "a";
        updates(1, 0) = "b";
        updates(2, 0) = "c";
        names.scatter_update(Ids{8, 1, 8}, updates);  // a repeated id's last row stays
        const auto read = names.sparse_read(Ids{8, 1, 2}).get<std::string>();
        CHECK(std::vector<std::string>(read.begin(), read.end()) == std::vector<std::string>{"c", "b", "-"});
    }
    TEST_CASE("Variable: an optimizer that takes no rows by position is given them gathered, repeats summed") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::archetypes::OptimizerArchetype,
                                     pss::LocalClusterResolver<3, 1>>
            strategy({}, pss::FixedShardsPartitioner(3), pss::archetypes::OptimizerArchetype(0));  // w -= g
        auto scope = strategy.scope();
        pss::Variable v(xt::xarray<float>(xt::reshape_view(xt::arange<float>(20), {10, 2})), "table");
        v.apply_sparse_gradient(Ids{8, 2, 8, 6, 2}, xt::xarray<float>{{1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}});
        const auto w = v.read<float>();
        CHECK(xt::view(w, 8) == xt::xarray<float>{12, 13});  // (16, 17) - (1 + 3)
        CHECK(xt::view(w, 2) == xt::xarray<float>{-3, -2});  // (4, 5) - (2 + 5)
        CHECK(xt::view(w, 6) == xt::xarray<float>{8, 9});    // (12, 13) - 4
        CHECK(xt::view(w, 3) == xt::xarray<float>{6, 7});
    }
    TEST_CASE("Variable: a wrong shape or dtype is refused with the variable's name, the expected and the given") {
        ShardedFixture f;
        CHECK_THROWS_WITH_AS(f.v.assign(xt::xarray<float>(xt::zeros<float>({9, 2}))),
                             "pss: assign on variable 'table:0': expected shape (10, 2) dtype float32, got shape (9, 2) "
                             "dtype float32",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(f.v.assign_add(xt::xarray<double>(xt::zeros<double>({10, 2}))),
                             "pss: assign_add on variable 'table:0': expected shape (10, 2) dtype float32, got shape "
                             "(10, 2) dtype float64",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(f.v.scatter_add(Ids{1, 2}, xt::xarray<float>{{1, 1}}),
                             "pss: scatter_add on variable 'table:0': expected shape (2, 2) dtype float32, got shape "
                             "(1, 2) dtype float32",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)f.v.read<double>(),
                             "pss: read of variable 'table:0' as float64: the variable's dtype is float32",
                             pss::InvalidArgumentError);
        CHECK(f.v.read<float>() == xt::reshape_view(xt::arange<float>(20), {10, 2}));
    }
    TEST_CASE("Variable: an id out of range on one shard changes no shard") {
        ShardedFixture f;
        CHECK_THROWS_WITH_AS(f.v.scatter_add(Ids{0, 5, 10}, xt::xarray<float>(xt::ones<float>({3, 2}))),
                             "pss: scatter_add on variable 'table:0': id 10 is out of range for shape (10, 2); ids "
                             "must be in [0, 10)",
                             pss::InvalidArgumentError);  // TensorFlow's type for an index out of range
        CHECK_THROWS_AS(f.v.apply_sparse_gradient(Ids{-1}, xt::xarray<float>{{1, 1}}), pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)f.v.sparse_read(Ids{3, 11}), pss::InvalidArgumentError);
        CHECK(f.v.read<float>() == xt::reshape_view(xt::arange<float>(20), {10, 2}));
    }
    TEST_CASE("Variable: a gradient to an integer variable is FailedPreconditionError") {
        pss::ParameterServerStrategy<> strategy;
        auto scope = strategy.scope();
        pss::Variable step(xt::xarray<std::int64_t>{0}, "step");
        CHECK_THROWS_WITH_AS(step.apply_gradient(xt::xarray<std::int64_t>{1}),
                             "pss: apply_gradient on variable 'step:0': a gradient cannot be applied to a variable of "
                             "dtype int64; only float32 and float64 variables train",
                             pss::FailedPreconditionError);
        CHECK(step.read<std::int64_t>() == xt::xarray<std::int64_t>{0});
    }
    TEST_CASE("Variable: read_into reuses the caller's buffer, and updates hand the payload buffer back") {
        pss::ParameterServerStrategy<> strategy;
        auto scope = strategy.scope();
        pss::Variable v(xt::xarray<float>(xt::ones<float>({4096})), "v");
        xt::xarray<float> out = xt::zeros<float>({4096});
        const float* data = out.data();
        v.read_into(out);
        CHECK(out.data() == data);
        CHECK(out(4095) == 1.0f);
        xt::xarray<float> delta = xt::ones<float>({4096});
        const float* delta_data = delta.data();
        pss::Tensor spent = v.assign_add(std::move(delta));
        CHECK(spent.get<float>().data() == delta_data);
        CHECK(v.read<float>()(0) == 2.0f);
    }
    TEST_CASE("Variable: 8 threads each adding 1 to a sharded variable 100 times give exactly 800") {
        ShardedFixture f;
        f.v.assign(xt::xarray<float>(xt::zeros<float>({10, 2})));
        std::vector<std::jthread> threads;
        for (int t = 0; t < 8; ++t)
            threads.emplace_back([&] {
                for (int i = 0; i < 100; ++i) f.v.assign_add(xt::xarray<float>(xt::ones<float>({10, 2})));
            });
        threads.clear();
        CHECK(f.v.read<float>() == xt::xarray<float>(xt::ones<float>({10, 2}) * 800.0f));
    }
    TEST_CASE("Variable: a variable that outlives its strategy throws UnavailableError") {
        pss::Variable v;
        {
            pss::ParameterServerStrategy<> strategy;
            auto scope = strategy.scope();
            v = pss::Variable(xt::xarray<float>{1}, "orphan");
        }
        CHECK_THROWS_AS((void)v.read_value(), pss::UnavailableError);
        CHECK_THROWS_AS((void)pss::Variable().read_value(), pss::FailedPreconditionError);
    }
}
