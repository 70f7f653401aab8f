// tests/test_keras.cpp: the Keras-style API: layers' and losses' gradients against central differences,
// Sequential's fit (by hand, synchronous against one worker, asynchronous), compile, evaluate, predict;
// fit's options, metrics and callbacks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iomanip>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xsort.hpp>
#include <xtensor/xview.hpp>

#include <pss/keras.hpp>

#include "mutated_texts.hpp"

namespace {

// Central differences in double precision with h = 1e-6: the truncation error (h^2 f''' / 6) and the
// rounding error (1e-16 |f| / h) stay near 1e-10. Measured: every difference here is between 1e-10 and
// 1e-9; the checks allow |analytic - numeric| <= 1e-8 * max(1, |analytic|).
constexpr double fd_step = 1e-6;
constexpr double fd_tolerance = 1e-8;

double central_difference(double& parameter, const std::function<double()>& f) {
    const double old = parameter;
    parameter = old + fd_step;
    const double up = f();
    parameter = old - fd_step;
    const double down = f();
    parameter = old;
    return (up - down) / (2 * fd_step);
}

void check_close(double analytic, double numeric, const std::string& what) {
    INFO(what << ": analytic " << analytic << ", central difference " << numeric);
    CHECK(std::abs(analytic - numeric) <= fd_tolerance * std::max(1.0, std::abs(analytic)));
}

double weighted_sum(const xt::xarray<double>& r, const xt::xarray<double>& y) {
    REQUIRE(r.size() == y.size());
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += r.data()[i] * y.data()[i];
    return s;
}

/// A layer's or loss's float32 or float64 result as doubles, for checks.
xt::xarray<double> D(const pss::Tensor& t) { return pss::detail::to_double(t); }

double weighted_sum(const xt::xarray<double>& r, const pss::Tensor& y) { return weighted_sum(r, D(y)); }

xt::xarray<double> column(std::vector<double> values) {
    xt::xarray<double> out = xt::xarray<double>::from_shape({values.size(), std::size_t{1}});
    std::copy(values.begin(), values.end(), out.begin());
    return out;
}
xt::xarray<float> column_f(std::vector<float> values) {
    xt::xarray<float> out = xt::xarray<float>::from_shape({values.size(), std::size_t{1}});
    std::copy(values.begin(), values.end(), out.begin());
    return out;
}

bool close_relative(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(1e-12, std::abs(b)); }

/// The kernel check_dense_gradients sets: pre-activations stay at least 0.05 away from 0 (relu's kink)
/// for it and the inputs there.
const xt::xarray<double> dense_test_kernel = {{0.5, -0.3, 0.2}, {0.1, 0.4, -0.6}, {-0.2, 0.3, 0.7}, {0.6, -0.1, 0.25}};

/// The gradients (kernel, bias, inputs) of sum(r * forward(x)) + regularization_loss() of `dense`, a
/// float64 Dense of 3 units not built, against central differences; returns its regularization_loss()
/// at dense_test_kernel.
double check_dense_gradients(pss::Dense dense) {
    std::mt19937 rng(0);
    dense.build({4}, rng);
    xt::xarray<double> w = dense_test_kernel;
    xt::xarray<double> b = {0.1, -0.2, 0.05};
    xt::xarray<double> x = {{1.0, -0.5, 0.3, 0.8}, {-0.7, 0.2, 0.9, -0.4}};
    const xt::xarray<double> r = {{0.3, -1.2, 0.7}, {1.1, 0.4, -0.5}};
    auto f = [&] {
        dense.set_weights({w, b});
        const double data = weighted_sum(r, dense.forward(x));
        return data + dense.regularization_loss();
    };
    f();
    const pss::LayerGradients grads = dense.backward(r);
    REQUIRE(grads.variables.size() == 2);
    CHECK(grads.variables[0].variable.name() == dense.kernel().name());
    CHECK_FALSE(grads.variables[0].sparse);
    for (std::size_t i = 0; i < w.size(); ++i)
        check_close(D(grads.variables[0].values).data()[i], central_difference(w.data()[i], f), "kernel " + std::to_string(i));
    for (std::size_t i = 0; i < b.size(); ++i)
        check_close(D(grads.variables[1].values).data()[i], central_difference(b.data()[i], f), "bias " + std::to_string(i));
    for (std::size_t i = 0; i < x.size(); ++i)
        check_close(D(grads.inputs).data()[i], central_difference(x.data()[i], f), "input " + std::to_string(i));
    f();
    return dense.regularization_loss();
}

/// A loss's gradient against central differences, at predictions inside the clip range.
void check_loss_gradient(const pss::Loss& loss, const xt::xarray<double>& y_true, xt::xarray<double> y_pred) {
    const xt::xarray<double> g = D(loss.gradient(y_true, y_pred));
    REQUIRE(g.shape() == y_pred.shape());
    auto f = [&] { return loss.value(y_true, y_pred); };
    for (std::size_t i = 0; i < y_pred.size(); ++i)
        check_close(g.data()[i], central_difference(y_pred.data()[i], f),
                    std::string(loss.name()) + " prediction " + std::to_string(i));
}

}  // namespace

TEST_SUITE("keras/layers") {
    TEST_CASE("Dense: kernel, bias and input gradients match central differences for each activation (1e-8 relative)") {
        for (auto a : {pss::ActivationFunction::linear, pss::ActivationFunction::relu, pss::ActivationFunction::sigmoid, pss::ActivationFunction::tanh,
                       pss::ActivationFunction::softmax}) {
            CAPTURE(pss::activation_name(a));
            CHECK(check_dense_gradients(pss::Dense(3, a, true, pss::DType::float64)) == 0);
        }
    }

    TEST_CASE("Dense: relu with kernel [[1, 2], [3, 4]] and bias [0.5, -0.5] maps [[1, 1], [-1, 0]] to [[4.5, 5.5], [0, 0]]") {
        pss::Dense dense(2, "relu", true, pss::DType::float32);
        std::mt19937 rng(0);
        dense.build({2}, rng);
        dense.set_weights({xt::xarray<float>{{1, 2}, {3, 4}}, xt::xarray<float>{0.5f, -0.5f}});
        const auto y = D(dense.forward(xt::xarray<double>{{1.0, 1.0}, {-1.0, 0.0}}));
        CHECK(y == xt::xarray<double>{{4.5, 5.5}, {0.0, 0.0}});
    }

    TEST_CASE("float32: a float32 Dense, Embedding, pooling and each loss compute in float32 (outputs and gradients are float32) and agree with float64 to 1e-5 relative") {
        const xt::xarray<double> w = {{0.5, -0.3, 0.2}, {0.1, 0.4, -0.6}, {-0.2, 0.3, 0.7}, {0.6, -0.1, 0.25}};
        const xt::xarray<double> b = {0.1, -0.2, 0.05};
        const xt::xarray<double> x = {{1.0, -0.5, 0.3, 0.8}, {-0.7, 0.2, 0.9, -0.4}};
        const xt::xarray<double> r = {{0.3, -1.2, 0.7}, {1.1, 0.4, -0.5}};
        auto close = [](const xt::xarray<double>& a, const xt::xarray<double>& e) {
            REQUIRE(a.shape() == e.shape());
            for (std::size_t i = 0; i < a.size(); ++i) {
                CAPTURE(i);
                CHECK(std::abs(a.data()[i] - e.data()[i]) <= 1e-5 * std::max(1.0, std::abs(e.data()[i])));
            }
        };
        for (pss::ActivationFunction activation : {pss::ActivationFunction::linear, pss::ActivationFunction::relu, pss::ActivationFunction::sigmoid,
                                           pss::ActivationFunction::tanh, pss::ActivationFunction::softmax}) {
            CAPTURE(pss::activation_name(activation));
            pss::Dense d32(3, activation, true, pss::DType::float32), d64(3, activation, true, pss::DType::float64);
            std::mt19937 rng(0);
            d32.build({4}, rng);
            d64.build({4}, rng);
            d32.set_weights({w, b});
            d64.set_weights({w, b});
            const pss::Tensor y32 = d32.forward(xt::xarray<float>(xt::cast<float>(x)));
            CHECK(y32.dtype() == pss::DType::float32);
            close(D(y32), D(d64.forward(x)));
            const pss::LayerGradients g32 = d32.backward(xt::xarray<float>(xt::cast<float>(r)));
            const pss::LayerGradients g64 = d64.backward(r);
            CHECK(g32.inputs.dtype() == pss::DType::float32);
            CHECK(g32.variables[0].values.dtype() == pss::DType::float32);
            close(D(g32.inputs), D(g64.inputs));
            close(D(g32.variables[0].values), D(g64.variables[0].values));
            close(D(g32.variables[1].values), D(g64.variables[1].values));
        }
        // A float64 layer converts float32 inputs (a float data set) once, and computes in double.
        pss::Dense d64(3, "linear", true, pss::DType::float64);
        std::mt19937 rng(0);
        d64.build({4}, rng);
        CHECK(d64.forward(xt::xarray<float>(xt::cast<float>(x))).dtype() == pss::DType::float64);
        // An Embedding's rows, and pooling, in float32.
        pss::Embedding e32(4, 2);
        e32.build({3}, rng);
        const pss::Tensor rows = e32.forward(xt::xarray<float>{{1, 3, 1}, {0, 2, 3}});
        CHECK(rows.dtype() == pss::DType::float32);
        CHECK(e32.backward(xt::xarray<float>(xt::ones<float>({2, 3, 2}))).variables[0].values.dtype() == pss::DType::float32);
        pss::GlobalAveragePooling1D pool;
        pool.build({3, 2}, rng);
        CHECK(pool.forward(rows).dtype() == pss::DType::float32);
        // Losses on float32 predictions: float32 gradients, values within 1e-6 of float64's.
        const xt::xarray<double> y = column({1, 0, 1}), p = column({0.8, 0.3, 0.55});
        const xt::xarray<float> y32 = xt::cast<float>(y), p32 = xt::cast<float>(p);
        for (const auto& loss : std::vector<std::shared_ptr<const pss::Loss>>{
                 std::make_shared<pss::MeanSquaredError>(), std::make_shared<pss::BinaryCrossentropy>()}) {
            CAPTURE(loss->name());
            CHECK(loss->value(y32, p32) == doctest::Approx(loss->value(y, p)).epsilon(1e-6));
            CHECK(loss->gradient(y32, p32).dtype() == pss::DType::float32);
            close(D(loss->gradient(y32, p32)), D(loss->gradient(y, p)));
        }
        const pss::SparseCategoricalCrossentropy scce;
        const xt::xarray<double> probs = {{0.2, 0.7, 0.1}, {0.5, 0.25, 0.25}};
        const xt::xarray<float> probs32 = xt::cast<float>(probs);
        const xt::xarray<float> ids = {1, 0};
        CHECK(scce.value(ids, probs32) == doctest::Approx(scce.value(ids, probs)).epsilon(1e-6));
        CHECK(scce.gradient(ids, probs32).dtype() == pss::DType::float32);
        close(D(scce.gradient(ids, probs32)), D(scce.gradient(ids, probs)));
    }

    TEST_CASE("Dense: Glorot-uniform kernel within sqrt(6 / (4 + 3)), zero bias, names dense/kernel:0 and dense/bias:0") {
        pss::Dense dense(3);
        std::mt19937 rng(0);
        const pss::Shape out = dense.build({4}, rng);
        CHECK(out == pss::Shape{3});
        CHECK(dense.name() == "dense");
        CHECK(dense.kernel().name() == "dense/kernel:0");
        CHECK(dense.bias().name() == "dense/bias:0");
        const auto w = dense.kernel().read<float>();
        const double limit = std::sqrt(6.0 / 7.0);
        CHECK(std::all_of(w.begin(), w.end(), [&](float v) { return std::abs(v) < limit; }));
        CHECK(std::any_of(w.begin(), w.end(), [&](float v) { return std::abs(v) > 0.1 * limit; }));
        CHECK(dense.bias().read<float>() == xt::xarray<float>{0, 0, 0});
    }

    TEST_CASE("Dense: set_weights with a (2, 3) kernel for a (4, 3) layer throws naming both shapes") {
        pss::Dense dense(3);
        std::mt19937 rng(0);
        dense.build({4}, rng);
        CHECK_THROWS_WITH_AS(dense.set_weights({xt::xarray<float>(xt::zeros<float>({2, 3})), xt::xarray<float>{0, 0, 0}}),
                             "pss: Dense 'dense': set_weights: weight 0 ('dense/kernel:0') has shape (4, 3), got (2, 3)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(dense.set_weights({xt::xarray<float>(xt::zeros<float>({4, 3}))}),
                             "pss: Dense 'dense': set_weights got 1 arrays, but the layer has 2 weights (see weights(); "
                             "build the layer first)",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("Dense: an unknown activation name throws listing the known ones") {
        CHECK_THROWS_WITH_AS(pss::Dense(1, "gelu"),
                             "pss: activation \"gelu\" is not known; use \"linear\", \"relu\", \"sigmoid\", \"tanh\" or "
                             "\"softmax\"",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("Embedding: forward returns the rows of ids [[1, 3, 1], [0, 2, 3]]; gradients match central differences") {
        pss::Embedding embedding(4, 2, pss::DType::float64);
        std::mt19937 rng(0);
        CHECK(embedding.build({3}, rng) == pss::Shape{3, 2});
        xt::xarray<double> table = {{0.1, 0.2}, {0.3, 0.4}, {0.5, 0.6}, {0.7, 0.8}};
        const xt::xarray<double> ids = {{1, 3, 1}, {0, 2, 3}};
        const xt::xarray<double> r = {{{1.0, -2.0}, {0.5, 0.25}, {3.0, 1.0}}, {{-1.0, 0.5}, {2.0, -0.5}, {0.75, 1.5}}};
        auto f = [&] {
            embedding.set_weights({table});
            return weighted_sum(r, embedding.forward(ids));
        };
        embedding.set_weights({table});
        const auto y = D(embedding.forward(ids));
        CHECK(y == xt::xarray<double>{{{0.3, 0.4}, {0.7, 0.8}, {0.3, 0.4}}, {{0.1, 0.2}, {0.5, 0.6}, {0.7, 0.8}}});
        const pss::LayerGradients grads = embedding.backward(r);
        REQUIRE(grads.variables.size() == 1);
        const auto& g = grads.variables[0];
        CHECK(g.sparse);
        CHECK(g.ids == std::vector<std::int64_t>{1, 3, 1, 0, 2, 3});  // one row per id, repeats included
        CHECK(D(grads.inputs) == xt::xarray<double>(xt::zeros<double>({2, 3})));
        // The dense gradient the ps sees: the sparse rows added up by id.
        xt::xarray<double> dense = xt::zeros<double>({4, 2});
        for (std::size_t i = 0; i < g.ids.size(); ++i)
            for (std::size_t j = 0; j < 2; ++j) dense(static_cast<std::size_t>(g.ids[i]), j) += g.values.get<double>()(i, j);
        for (std::size_t i = 0; i < table.size(); ++i)
            check_close(dense.data()[i], central_difference(table.data()[i], f), "embeddings " + std::to_string(i));
    }

    TEST_CASE("Embedding: id 2.5 or 4 for input_dim 4 is rejected by check_inputs") {
        pss::Embedding embedding(4, 2);
        std::mt19937 rng(0);
        embedding.build({2}, rng);
        CHECK_NOTHROW(embedding.check_inputs(xt::xarray<float>{{0, 3}}));
        CHECK_THROWS_WITH_AS(embedding.check_inputs(xt::xarray<float>{{0, 2.5}}),
                             "pss: Embedding 'embedding': input 1 (in row-major order) is 2.500000, not an id; an "
                             "Embedding takes integer ids in [0, 4) stored as floats",
                             pss::InvalidArgumentError);
        CHECK_THROWS_AS(embedding.check_inputs(xt::xarray<float>{{4, 0}}), pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(embedding.check_inputs(xt::xarray<float>{0, 1}),
                             "pss: Embedding 'embedding': inputs of shape (2,), but the layer was built for inputs of "
                             "shape (batch, ...) = (2, 2)",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("GlobalAveragePooling1D and Flatten: (2, 3, 2) to (2, 2) and (2, 6); gradients match central differences") {
        std::mt19937 rng(0);
        xt::xarray<double> x = {{{1, 2}, {3, 4}, {5, 6}}, {{-1, 0}, {2, 2}, {0.5, 1}}};
        SUBCASE("GlobalAveragePooling1D") {
            pss::GlobalAveragePooling1D pool;
            CHECK(pool.build({3, 2}, rng) == pss::Shape{2});
            CHECK(pool.name() == "global_average_pooling1d");
            const auto y = D(pool.forward(x));
            CHECK(y == xt::xarray<double>{{3, 4}, {0.5, 1}});
            const xt::xarray<double> r = {{1, -2}, {0.5, 3}};
            const auto grads = pool.backward(r);
            for (std::size_t i = 0; i < x.size(); ++i)
                check_close(D(grads.inputs).data()[i], central_difference(x.data()[i], [&] { return weighted_sum(r, pool.forward(x)); }),
                            "input " + std::to_string(i));
        }
        SUBCASE("Flatten") {
            pss::Flatten flatten;
            CHECK(flatten.build({3, 2}, rng) == pss::Shape{6});
            const auto y = D(flatten.forward(x));
            CHECK(y.shape() == std::vector<std::size_t>{2, 6});
            CHECK(y(1, 4) == 0.5);
            const xt::xarray<double> r = {{1, 2, 3, 4, 5, 6}, {-1, -2, -3, -4, -5, -6}};
            const auto grads = flatten.backward(r);
            CHECK(grads.inputs.shape() == std::vector<std::size_t>{2, 3, 2});
            CHECK(D(grads.inputs)(1, 2, 0) == -5);
        }
    }
}

TEST_SUITE("keras/layers") {
    TEST_CASE("Dropout: a training step drops about rate of the values and scales the rest by 1 / (1 - rate); "
              "the same step the same mask, in backward too; inference is the identity; its config; a worker's copy "
              "drops the same values") {
        std::mt19937 rng(0);
        pss::Dropout dropout(0.25, 7);
        CHECK(dropout.build({100}, rng) == pss::Shape{100});
        const xt::xarray<double> x = xt::ones<double>({100, 100});
        const xt::xarray<double> y = D(dropout.forward(x, 1));
        std::size_t dropped = 0;
        for (const double v : y) {
            if (v == 0) ++dropped;
            else CHECK(v == 1 / (1 - 0.25));
        }
        CHECK(dropped > 2370);  // 10,000 values at rate 0.25: 2,500, three standard deviations (43) either way
        CHECK(dropped < 2630);
        CHECK(D(dropout.backward(x).inputs) == y);  // the gradient through the same mask
        CHECK(D(dropout.forward(x, 1)) == y);       // a step run again drops the same values
        CHECK_FALSE(D(dropout.forward(x, 2)) == y);
        CHECK(D(dropout.forward(x, 0)) == x);  // not training
        CHECK(D(dropout.backward(x).inputs) == x);
        CHECK(pss::serialize(dropout) ==
              nlohmann::json::parse(R"({"class_name": "Dropout", "config": {"name": "dropout", "rate": 0.25, "seed": 7,
                                         "batch_input_shape": [null, 100]}})"));
        auto copy = pss::detail::bind_layer_from_config(pss::serialize(dropout), {});
        CHECK(D(copy->forward(x, 1)) == y);
        // Without a seed, the model's generator gives one at build.
        pss::Dropout unseeded(0.5);
        std::mt19937 model_rng(3);
        (void)unseeded.build({4}, model_rng);
        CHECK(unseeded.seed() == std::mt19937(3)());
        CHECK_THROWS_WITH_AS((void)pss::Dropout(1), "pss: Dropout: rate is 1.0; it is in [0, 1) (the fraction of inputs dropped)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::detail::layer_from_config(nlohmann::json::parse(
                                 R"({"class_name":"Dropout","config":{"name":"d","rate":1.5,"seed":1}})")),
                             R"(pss: Dropout config {"name":"d","rate":1.5,"seed":1}: "rate" is 1.5; it is a number in [0, 1))",
                             pss::InvalidArgumentError);
    }
}

namespace {

// Defined with the config tests below; declared here for the layer tests that round-trip their configs.
std::unique_ptr<pss::Layer> check_rebuilt_layer(pss::Layer& original, const xt::xarray<double>& x,
                                                const xt::xarray<double>& grad_out);
void check_bad_layer_config(const std::string& text, const std::string& message);

/// What detail::uniform draws, written out again: lo + (hi - lo) * r / 2^32 for each output r of the
/// generator (Dense's and Embedding's draws before initializers existed).
double old_uniform(std::mt19937& rng, double lo, double hi) {
    return lo + (hi - lo) * (static_cast<double>(rng()) / 4294967296.0);
}

/// The mean and the (population) standard deviation of `values`.
std::pair<double, double> mean_stddev(const xt::xarray<double>& values) {
    double sum = 0;
    for (const double v : values) sum += v;
    const double mean = sum / static_cast<double>(values.size());
    double squares = 0;
    for (const double v : values) squares += (v - mean) * (v - mean);
    return {mean, std::sqrt(squares / static_cast<double>(values.size()))};
}

/// The standard deviation of N(0, 1) truncated at 2 (TensorFlow's truncated_normal): Keras' constant.
constexpr double truncated_stddev = 0.87962566103423978;

}  // namespace

TEST_SUITE("keras/layers") {
    TEST_CASE("initializers: Zeros, Ones and Constant(0.5) fill every value in float32 and float64 and draw nothing; "
              "\"zeros\", \"ones\" and \"constant\" (0) by name; other dtypes and values throw") {
        namespace init = pss::initializers;
        std::mt19937 rng(1);
        const std::mt19937 before = rng;
        for (const pss::DType dtype : {pss::DType::float32, pss::DType::float64}) {
            CAPTURE(pss::dtype_name(dtype));
            const pss::Tensor zeros = init::Zeros()({2, 3}, dtype, rng);
            CHECK(zeros.dtype() == dtype);
            CHECK(zeros.shape() == pss::Shape{2, 3});
            CHECK(D(zeros) == xt::xarray<double>(xt::zeros<double>({2, 3})));
            CHECK(D(init::Ones()({4}, dtype, rng)) == xt::xarray<double>{1, 1, 1, 1});
            CHECK(D(init::Constant(0.5)({3, 1}, dtype, rng)) == column({0.5, 0.5, 0.5}));
            CHECK(D(pss::AnyInitializer("zeros")({2}, dtype, rng)) == xt::xarray<double>{0, 0});
            CHECK(D(pss::AnyInitializer("ones")({2}, dtype, rng)) == xt::xarray<double>{1, 1});
            CHECK(D(pss::AnyInitializer("constant")({2}, dtype, rng)) == xt::xarray<double>{0, 0});
        }
        CHECK(rng == before);
        CHECK_THROWS_WITH_AS((void)init::Zeros()({2}, pss::DType::int32, rng),
                             "pss: Zeros: dtype int32; an initializer fills float32 or float64 weights",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)init::Constant(std::nan("")), "pss: Constant: value is nan; it is a finite number",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)init::RandomUniform(1, 0),
                             "pss: RandomUniform: minval is 1.0 and maxval 0.0; they are finite numbers with minval <= "
                             "maxval (and a finite difference)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)init::RandomNormal(0, -1),
                             "pss: RandomNormal: mean is 0.0 and stddev -1.0; they are finite numbers with stddev >= 0",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)init::VarianceScaling(1, "fan"),
                             "pss: VarianceScaling: mode is \"fan\"; it is \"fan_in\", \"fan_out\" or \"fan_avg\"",
                             pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)init::VarianceScaling(0), pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)init::VarianceScaling(1, "fan_in", "gamma"), pss::InvalidArgumentError);
    }

    TEST_CASE("initializers: RandomUniform(-0.05, 0.05) is minval + (maxval - minval) * r / 2^32 of each generator "
              "output r in row-major order; Embedding's default table is drawn on the ps from a seed the model's "
              "generator gives without being consumed") {
        std::mt19937 rng(5), copy(5);
        const xt::xarray<double> got = D(pss::initializers::RandomUniform()({3, 4}, pss::DType::float64, rng));
        REQUIRE(got.size() == 12);
        for (std::size_t i = 0; i < got.size(); ++i) CHECK(got.data()[i] == old_uniform(copy, -0.05, 0.05));
        CHECK(rng == copy);  // one generator output per value
        // float32: the double, rounded once.
        std::mt19937 rng32(5), copy32(5);
        const pss::Tensor f = pss::initializers::RandomUniform(-1, 3)({5}, pss::DType::float32, rng32);
        for (std::size_t i = 0; i < 5; ++i) CHECK(f.get<float>()(i) == static_cast<float>(old_uniform(copy32, -1, 3)));
        // Embedding(6, 3): its table drawn where it lives (pss::InitializerSpec), with a seed made from the
        // model generator's next two numbers and the variable's name; the generator is not advanced, so the
        // layers after it draw what they drew before.
        pss::Embedding embedding(6, 3);
        std::mt19937 model_rng(11), old(11);
        embedding.build({2}, model_rng);
        CHECK(embedding.embeddings_initializer()->class_name() == "RandomUniform");
        CHECK(model_rng == old);
        const std::uint64_t high = old(), low = old();
        const std::string variable = embedding.name() + "/embeddings";
        CAPTURE(variable);
        const std::uint64_t seed = pss::detail::mix64((high << 32 | low) ^ pss::detail::name_seed(variable));
        CHECK(pss::detail::variable_seed(std::mt19937(11), variable) == seed);
        const auto table = embedding.embeddings().read<float>();
        CHECK(table == pss::detail::initial_value(pss::InitializerSpec::random_uniform(-0.05, 0.05, seed),
                                                  pss::DType::float32, {6, 3})
                           .get<float>());
        CHECK(xt::amax(xt::abs(table))() < 0.05f);
        // A Keras initializer given straight to a Variable: its own seed, else one made from the name;
        // VarianceScaling's family resolved with the whole shape's fans.
        const auto uniform = [](double limit, std::uint64_t s) {
            return pss::detail::initial_value(pss::InitializerSpec::random_uniform(-limit, limit, s), pss::DType::float32, {6, 3});
        };
        CHECK(pss::Variable(pss::Shape{6, 3}, pss::DType::float32, pss::initializers::RandomUniform(), "direct").read<float>() ==
              uniform(0.05, pss::detail::name_seed("direct")).get<float>());
        CHECK(pss::Variable(pss::Shape{6, 3}, pss::DType::float32, pss::initializers::RandomUniform(-1, 1, 4), "x").read<float>() ==
              uniform(1, 4).get<float>());
        CHECK(pss::initializers::GlorotUniform(1).spec({6, 3}, 99) ==
              pss::InitializerSpec::random_uniform(-std::sqrt(6.0 / 9), std::sqrt(6.0 / 9), 1));
        CHECK(pss::initializers::HeNormal().spec({6, 3}, 99) ==
              pss::InitializerSpec::truncated_normal(0, std::sqrt(2.0 / 6) / truncated_stddev, 99));
        // Another name, another table from the same generator.
        pss::Embedding other(6, 3);
        other.set_name("other");
        std::mt19937 same(11);
        other.build({2}, same);
        CHECK(other.embeddings().read<float>() != table);
    }

    TEST_CASE("initializers: Dense's default GlorotUniform kernel has the bits of its old formula, U(-l, l) with l = "
              "sqrt(6 / (7 + 5)) row by row; HeUniform's limit is sqrt(6 / fan_in); a (2, 3, 4, 5) kernel has fans 24 and 30") {
        pss::Dense dense(5);
        std::mt19937 rng(3), old(3);
        dense.build({7}, rng);
        const double limit = std::sqrt(6.0 / static_cast<double>(7 + 5));
        const auto kernel = dense.kernel().read<float>();
        REQUIRE(kernel.size() == 35);
        for (std::size_t i = 0; i < kernel.size(); ++i) {
            CAPTURE(i);
            CHECK(kernel.data()[i] == static_cast<float>(old_uniform(old, -limit, limit)));
        }
        CHECK(rng == old);  // the zero bias draws nothing
        CHECK(dense.bias().read<float>() == xt::xarray<float>{0, 0, 0, 0, 0});

        std::mt19937 he(9), he_old(9);
        const xt::xarray<double> h = D(pss::AnyInitializer("he_uniform")({10, 4}, pss::DType::float64, he));
        const double he_limit = std::sqrt(6.0 / 10.0);
        for (std::size_t i = 0; i < h.size(); ++i) CHECK(h.data()[i] == old_uniform(he_old, -he_limit, he_limit));

        CHECK(pss::detail::compute_fans({2, 3, 4, 5}) == std::pair<double, double>{24, 30});
        CHECK(pss::detail::compute_fans({7}) == std::pair<double, double>{7, 7});
        CHECK(pss::detail::compute_fans({}) == std::pair<double, double>{1, 1});
        std::mt19937 conv(2), conv_old(2);
        const xt::xarray<double> c = D(pss::initializers::GlorotUniform()({2, 3, 4, 5}, pss::DType::float64, conv));
        const double conv_limit = std::sqrt(6.0 / (24.0 + 30.0));
        for (std::size_t i = 0; i < c.size(); ++i) CHECK(c.data()[i] == old_uniform(conv_old, -conv_limit, conv_limit));
    }

    TEST_CASE("initializers: 10,000 draws of RandomNormal(1, 2), TruncatedNormal(0, 0.05), he_normal, glorot_normal and "
              "an untruncated VarianceScaling have Keras' mean and stddev within 4 standard errors; a truncated normal "
              "never goes beyond 2 stddev") {
        namespace init = pss::initializers;
        std::mt19937 rng(123);
        // 4 standard errors of 10,000 draws: sigma / 100 for the mean, and sigma / sqrt(2 * 10,000) = sigma / 141
        // for the standard deviation of a normal (less for a truncated one, whose tails are lighter). A correct
        // draw fails a check with probability below 1e-4; a wrong stddev (say sqrt(2 / fan_avg) for sqrt(2 /
        // fan_in), or a missing 0.8796 correction, 12%) fails by far.
        auto check = [&](const pss::AnyInitializer& initializer, const pss::Shape& shape, double mean, double stddev,
                         double bound) {
            CAPTURE(initializer->class_name());
            const xt::xarray<double> v = D(initializer(shape, pss::DType::float64, rng));
            REQUIRE(v.size() == 10000);
            const std::pair<double, double> ms = mean_stddev(v);
            const double m = ms.first, s = ms.second;
            CAPTURE(m);
            CAPTURE(s);
            CHECK(std::abs(m - mean) < 4 * stddev / 100);
            CHECK(std::abs(s - stddev) < 4 * stddev / 141);
            double farthest = 0;
            for (const double x : v) farthest = std::max(farthest, std::abs(x - mean));
            CHECK(farthest <= bound);
            return farthest;
        };
        const double inf = std::numeric_limits<double>::infinity();
        CHECK(check(init::RandomNormal(1.0, 2.0), {100, 100}, 1.0, 2.0, inf) > 3 * 2.0);  // a normal's tails
        // TruncatedNormal(0, 0.05): its values' stddev is 0.05 * 0.8796, none beyond 0.1, some near it.
        CHECK(check(init::TruncatedNormal(0.0, 0.05), {10000}, 0.0, 0.05 * truncated_stddev, 2 * 0.05) > 1.9 * 0.05);
        // he_normal on fan_in 200: stddev sqrt(2 / 200) = 0.1 once the 0.8796 correction is undone by truncation.
        check("he_normal", {200, 50}, 0.0, 0.1, 2 * 0.1 / truncated_stddev);
        // glorot_normal on fans 100 and 100: sqrt(2 / 200) = 0.1 likewise.
        check("glorot_normal", {100, 100}, 0.0, 0.1, 2 * 0.1 / truncated_stddev);
        check(init::VarianceScaling(2.0, "fan_out", "untruncated_normal"), {50, 200}, 0.0, 0.1, inf);
        check(init::VarianceScaling(1.0, "fan_in", "normal"), {100, 100}, 0.0, 0.1, 2 * 0.1 / truncated_stddev);
    }

    TEST_CASE("initializers: a seeded initializer draws from std::mt19937(seed): the same values at every call, others "
              "for another seed, and the model's generator untouched; an unseeded one draws from the model's") {
        namespace init = pss::initializers;
        auto seeded = [](std::uint32_t seed) {
            return std::vector<pss::AnyInitializer>{init::RandomUniform(-1, 1, seed), init::RandomNormal(0, 1, seed),
                                                    init::TruncatedNormal(0, 1, seed),  init::GlorotUniform(seed),
                                                    init::GlorotNormal(seed),           init::HeNormal(seed),
                                                    init::HeUniform(seed),
                                                    init::VarianceScaling(1, "fan_avg", "untruncated_normal", seed)};
        };
        auto unseeded = std::vector<pss::AnyInitializer>{
            init::RandomUniform(-1, 1), init::RandomNormal(0, 1), init::TruncatedNormal(0, 1), init::GlorotUniform(),
            init::GlorotNormal(),       init::HeNormal(),         init::HeUniform(),
            init::VarianceScaling(1, "fan_avg", "untruncated_normal")};
        const auto a = seeded(42), b = seeded(43);
        std::mt19937 rng(0);
        const std::mt19937 before = rng;
        for (std::size_t i = 0; i < a.size(); ++i) {
            CAPTURE(a[i]->class_name());
            const xt::xarray<double> first = D(a[i]({4, 3}, pss::DType::float64, rng));
            CHECK(D(a[i]({4, 3}, pss::DType::float64, rng)) == first);
            CHECK_FALSE(D(b[i]({4, 3}, pss::DType::float64, rng)) == first);
            CHECK(rng == before);
            std::mt19937 model(42);  // the same draws as the unseeded twin's from a model seeded 42
            CHECK(D(unseeded[i]({4, 3}, pss::DType::float64, model)) == first);
            CHECK_FALSE(model == std::mt19937(42));
        }
    }

    TEST_CASE("initializers::get, serialize and from_config: Keras' names, class names and aliases; Keras' configs; each "
              "config rebuilds an initializer that draws the same; an unknown name or a bad config throws naming it") {
        namespace init = pss::initializers;
        using nlohmann::json;
        for (const auto& names : std::vector<std::pair<std::string, std::string>>{
                 {"glorot_uniform", "GlorotUniform"}, {"glorot_normal", "GlorotNormal"}, {"he_normal", "HeNormal"},
                 {"he_uniform", "HeUniform"}, {"zeros", "Zeros"}, {"ones", "Ones"}, {"constant", "Constant"},
                 {"random_normal", "RandomNormal"}, {"random_uniform", "RandomUniform"},
                 {"truncated_normal", "TruncatedNormal"}, {"variance_scaling", "VarianceScaling"}, {"zero", "Zeros"},
                 {"one", "Ones"}, {"normal", "RandomNormal"}, {"uniform", "RandomUniform"}}) {
            CHECK(init::get(names.first)->class_name() == names.second);
            CHECK(init::get(names.second)->class_name() == names.second);
        }
        CHECK(init::serialize(*init::get("glorot_uniform")) ==
              json::parse(R"({"class_name": "GlorotUniform", "config": {"seed": null}})"));
        CHECK(init::serialize(init::RandomNormal()) ==
              json::parse(R"({"class_name": "RandomNormal", "config": {"mean": 0.0, "stddev": 0.05, "seed": null}})"));
        CHECK(init::serialize(init::TruncatedNormal()) ==
              json::parse(R"({"class_name": "TruncatedNormal", "config": {"mean": 0.0, "stddev": 0.05, "seed": null}})"));
        CHECK(init::serialize(init::RandomUniform()) ==
              json::parse(R"({"class_name": "RandomUniform", "config": {"minval": -0.05, "maxval": 0.05, "seed": null}})"));
        CHECK(init::serialize(init::Constant()) == json::parse(R"({"class_name": "Constant", "config": {"value": 0.0}})"));
        CHECK(init::serialize(init::Zeros()) == json::parse(R"({"class_name": "Zeros", "config": {}})"));
        CHECK(init::serialize(init::HeNormal(5)) == json::parse(R"({"class_name": "HeNormal", "config": {"seed": 5}})"));
        CHECK(init::serialize(init::VarianceScaling(2.0, "fan_out", "uniform", 7)) ==
              json::parse(R"({"class_name": "VarianceScaling", "config": {"scale": 2.0, "mode": "fan_out",
                              "distribution": "uniform", "seed": 7}})"));
        for (const pss::AnyInitializer& initializer : std::vector<pss::AnyInitializer>{
                 "glorot_uniform", "glorot_normal", "he_normal", "he_uniform", "zeros", "ones", init::Constant(-2.5),
                 init::RandomNormal(1, 0.5, 4294967295U), init::RandomUniform(-3, 0.25), init::TruncatedNormal(0.5, 2, 0),
                 init::VarianceScaling(0.5, "fan_out", "uniform", 9), init::GlorotUniform(1)}) {
            const json config = json::parse(init::serialize(initializer.get()).dump());  // through text
            CAPTURE(config.dump());
            const auto rebuilt = init::from_config(config);
            CHECK(init::serialize(*rebuilt) == config);
            std::mt19937 r0(4), r1(4);
            CHECK(D(initializer({3, 5}, pss::DType::float64, r0)) == D((*rebuilt)({3, 5}, pss::DType::float64, r1)));
        }
        CHECK_THROWS_WITH_AS(pss::Dense(2, {.kernel_initializer = "xavier"}),
                             "pss: initializer \"xavier\" is not known; use \"glorot_uniform\", \"glorot_normal\", "
                             "\"he_normal\", \"he_uniform\", \"zeros\", \"ones\", \"constant\", \"random_normal\", "
                             "\"random_uniform\" (or \"uniform\"), \"truncated_normal\" or \"variance_scaling\", or pass a "
                             "pss::initializers object",
                             pss::InvalidArgumentError);
        auto bad = [](const std::string& text, const std::string& message) {
            CAPTURE(text);
            CHECK_THROWS_WITH_AS((void)init::from_config(json::parse(text)), message.c_str(), pss::InvalidArgumentError);
        };
        bad(R"({"class_name": "Orthogonal", "config": {}})",
            R"(pss: initializer {"class_name":"Orthogonal","config":{}}: "class_name" is "Orthogonal"; the initializers )"
            R"(are "GlorotUniform", "GlorotNormal", "HeNormal", "HeUniform", "Zeros", "Ones", "Constant", "RandomNormal", )"
            R"("RandomUniform", "TruncatedNormal" and "VarianceScaling")");
        bad(R"({"class_name": "RandomUniform", "config": {"minval": 1, "maxval": 0, "seed": null}})",
            R"(pss: initializer RandomUniform config {"maxval":0,"minval":1,"seed":null}: minval is 1.0 and maxval 0.0; )"
            R"(they are finite numbers with minval <= maxval (and a finite difference))");
        bad(R"({"class_name": "HeNormal", "config": {"seed": -1}})",
            R"(pss: initializer HeNormal config {"seed":-1}: "seed" is -1; it is null or a whole number in [0, 4294967295])");
        bad(R"({"class_name": "HeNormal", "config": {"seed": 4294967296}})",
            R"(pss: initializer HeNormal config {"seed":4294967296}: "seed" is 4294967296; it is null or a whole number in )"
            R"([0, 4294967295])");
        bad(R"({"class_name": "HeNormal", "config": {}})",
            R"(pss: initializer HeNormal config {}: the field "seed" is missing; it has seed)");
        bad(R"({"class_name": "Zeros", "config": {"seed": null}})",
            R"(pss: initializer Zeros config {"seed":null}: the field "seed" is not known; it has no fields)");
        bad(R"({"class_name": "RandomNormal", "config": {"mean": "0", "stddev": 1, "seed": null}})",
            R"(pss: initializer RandomNormal config {"mean":"0","seed":null,"stddev":1}: "mean" is "0", not a finite number)");
        bad(R"({"class_name": "VarianceScaling", "config": {"scale": 1, "mode": "fan", "distribution": "uniform", "seed": null}})",
            R"(pss: initializer VarianceScaling config {"distribution":"uniform","mode":"fan","scale":1,"seed":null}: )"
            R"(mode is "fan"; it is "fan_in", "fan_out" or "fan_avg")");
        bad(R"("glorot_uniform")", R"(pss: initializer "glorot_uniform": it is string, not an object with class_name and config)");
    }

    TEST_CASE("Dense: DenseOptions by name (relu, he_normal kernel, Constant(0.5) bias, L2(1e-4), float64); Keras' config "
              "with the initializers and the regularizer serialized; a worker's copy computes and regularizes the same") {
        pss::Dense dense(4, {.activation = "relu",
                             .kernel_initializer = "he_normal",
                             .bias_initializer = pss::initializers::Constant(0.5),
                             .kernel_regularizer = pss::L2(1e-4),
                             .dtype = pss::DType::float64});
        CHECK(dense.activation() == pss::ActivationFunction::relu);
        CHECK(dense.kernel_initializer()->class_name() == "HeNormal");
        REQUIRE(dense.kernel_regularizer().has_value());
        CHECK(dense.kernel_regularizer()->l2() == 1e-4);
        std::mt19937 rng(6), same(6);
        dense.build({3}, rng);
        // he_normal draws the (3, 4) kernel from the model's generator; the constant bias draws nothing.
        CHECK(D(dense.kernel().read_value()) == D(pss::initializers::HeNormal()({3, 4}, pss::DType::float64, same)));
        CHECK(rng == same);
        CHECK(D(dense.bias().read_value()) == xt::xarray<double>{0.5, 0.5, 0.5, 0.5});
        CHECK(dense.get_config() ==
              nlohmann::json::parse(R"({"name": "dense", "units": 4, "activation": "relu", "use_bias": true,
                  "kernel_initializer": {"class_name": "HeNormal", "config": {"seed": null}},
                  "bias_initializer": {"class_name": "Constant", "config": {"value": 0.5}},
                  "kernel_regularizer": {"class_name": "L2", "config": {"l2": 0.0001}},
                  "dtype": "float64", "batch_input_shape": [null, 3]})"));
        CHECK(dense.regularization_loss() == 0);  // no forward yet: no kernel pulled
        const xt::xarray<double> x = {{1, -2, 0.5}, {0.25, 1, -1}};
        const auto rebuilt = check_rebuilt_layer(dense, x, xt::ones<double>({2, 4}));
        const xt::xarray<double> k = D(dense.kernel().read_value());
        double squares = 0;
        for (const double v : k) squares += v * v;
        CHECK(dense.regularization_loss() == 1e-4 * squares);
        CHECK(rebuilt->regularization_loss() == dense.regularization_loss());
        // The defaults, as Keras writes them.
        CHECK(pss::Dense(2).get_config() ==
              nlohmann::json::parse(R"({"name": "", "units": 2, "activation": "linear", "use_bias": true,
                  "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}},
                  "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": null,
                  "dtype": "float32"})"));
        CHECK(pss::L2().get_config() == nlohmann::json{{"l2", 0.01}});
        CHECK_THROWS_WITH_AS((void)pss::L2(-1), "pss: L2: l2 is -1.0; it is a finite number >= 0 (Keras' default 0.01)",
                             pss::InvalidArgumentError);
        // A worker rejects a regularizer other than L2, or a bad factor, naming the field.
        nlohmann::json config = pss::serialize(dense);
        config["config"]["kernel_regularizer"] = {{"class_name", "L1"}, {"config", {{"l1", 0.01}}}};
        check_bad_layer_config(config.dump(), R"(pss: Dense "kernel_regularizer" {"class_name":"L1","config":{"l1":0.01}}: )"
                                              R"("class_name" is "L1"; the regularizer is "L2" (or null for none))");
        config["config"]["kernel_regularizer"] = {{"class_name", "L2"}, {"config", {{"l2", -1}}}};
        check_bad_layer_config(config.dump(), R"(pss: Dense "kernel_regularizer" L2 config {"l2":-1}: l2 is -1.0; it is a )"
                                              R"(finite number >= 0 (Keras' default 0.01))");
        config["config"]["kernel_regularizer"] = nullptr;
        config["config"]["kernel_initializer"] = {{"class_name", "Xavier"}, {"config", nlohmann::json::object()}};
        check_bad_layer_config(config.dump(), R"(pss: Dense "kernel_initializer" {"class_name":"Xavier","config":{}}: )"
                                              R"("class_name" is "Xavier"; the initializers are "GlorotUniform", )"
                                              R"("GlorotNormal", "HeNormal", "HeUniform", "Zeros", "Ones", "Constant", )"
                                              R"("RandomNormal", "RandomUniform", "TruncatedNormal" and "VarianceScaling")");
    }

    TEST_CASE("L2: Dense's kernel gradient with L2(0.5) is the data gradient plus 2 * 0.5 * kernel: central differences "
              "of sum(r * outputs) + regularization_loss() (1e-8 relative)") {
        const double penalty = check_dense_gradients(
            pss::Dense(3, {.activation = "tanh", .kernel_regularizer = pss::L2(0.5), .dtype = pss::DType::float64}));
        double squares = 0;
        for (const double v : dense_test_kernel) squares += v * v;
        CHECK(penalty == 0.5 * squares);
    }

    TEST_CASE("L2: fit's loss is the data loss + l2 * kernel^2 and one SGD step moves the kernel by lr * (data gradient + "
              "2 * l2 * kernel), exactly: asynchronous, and on 2 synchronous workers (also with an empty slice); "
              "evaluate's loss adds the penalty") {
        using SyncTwoWorkers = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                            pss::LocalClusterResolver<2, 2>, pss::Synchronous>;
        // Kernel 2, bias 1, l2 = lr = 0.125 on x = 1..n, y = 2x: every error is 1 and every number below is a
        // short binary fraction, exact in float32 and double whatever the order of the sums.
        const double k0 = 2, b0 = 1, l2 = 0.125, lr = 0.125;
        auto run = [&](auto& strategy, std::size_t n) {
            CAPTURE(n);
            xt::xarray<float> x = xt::xarray<float>::from_shape({n, std::size_t{1}});
            xt::xarray<float> y = xt::xarray<float>::from_shape({n, std::size_t{1}});
            double loss = 0, gk = 0, gb = 0;  // the data's mse and its gradient, by hand
            for (std::size_t i = 0; i < n; ++i) {
                const double xi = static_cast<double>(i + 1);
                x(i, 0) = static_cast<float>(xi);
                y(i, 0) = static_cast<float>(2 * xi);
                const double e = k0 * xi + b0 - 2 * xi;
                loss += e * e / static_cast<double>(n);
                gk += 2 * e * xi / static_cast<double>(n);
                gb += 2 * e / static_cast<double>(n);
            }
            pss::Sequential model(strategy, {pss::Dense(1, {.kernel_regularizer = pss::L2(l2)})});
            model.build({1});
            model.set_weights({column_f({static_cast<float>(k0)}), xt::xarray<float>{static_cast<float>(b0)}});
            model.compile("mse");
            const auto history = model.fit(x, y, {.batch_size = n, .epochs = 1, .verbose = 0, .shuffle = false});
            CHECK(history.loss == std::vector<double>{loss + l2 * k0 * k0});
            const auto w = model.get_weights();
            const double k = w[0].template get<float>()(0, 0);
            CHECK(k == k0 - lr * (gk + 2 * l2 * k0));
            CHECK(w[1].template get<float>()(0) == b0 - lr * gb);  // the bias is not regularized
            // evaluate in batches of 1: the mean of each batch's loss + penalty, so predict's mse + l2 k^2.
            const xt::xarray<float> p = model.predict(x);
            double data = 0;
            for (std::size_t i = 0; i < n; ++i)
                data += (p(i, 0) - y(i, 0)) * (p(i, 0) - y(i, 0)) / static_cast<double>(n);
            CHECK(model.evaluate(x, y, pss::EvaluateOptions{.batch_size = 1}).at("loss") == data + l2 * k * k);
            CHECK(data + l2 * k * k != data);
        };
        SUBCASE("asynchronous: one closure of 4 examples") {
            pss::ParameterServerStrategy<> strategy(pss::LocalClusterResolver<2, 2>{}, pss::NoPartitioner{}, pss::SGD(lr));
            run(strategy, 4);  // loss 1.5, kernel 2 - 0.125 * (5 + 0.5) = 1.3125
        }
        SUBCASE("synchronous: each worker pushes its slice's gradient and the whole penalty's; the ps averages") {
            SyncTwoWorkers strategy(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(1), pss::SGD(lr));
            run(strategy, 4);  // slices of 2 and 2
            run(strategy, 1);  // slices of 1 and 0: the empty slice pushes the penalty's gradient too
        }
    }

    TEST_CASE("Embedding: in a model its 2 shards are drawn on the ps tasks, the Dense after it draws what it would "
              "without it, and the model trains") {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner> strategy(
            {}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        pss::Sequential model(strategy, {pss::Embedding(50, 4), pss::GlobalAveragePooling1D(), pss::Dense(1)}, 7);
        model.compile(pss::SGD(0.1), "mse");
        model.build({3});
        const auto& table = dynamic_cast<const pss::Embedding&>(*model.layers()[0]).embeddings();
        CHECK(table.num_shards() == 2);
        CHECK(table.shape() == pss::Shape{50, 4});
        std::mt19937 fresh(7);
        CHECK(model.layers()[2]->get_weights()[0].get<float>() ==
              pss::initializers::GlorotUniform()({4, 1}, pss::DType::float32, fresh).get<float>());
        xt::xarray<float> x = xt::xarray<float>::from_shape({20, 3});
        xt::xarray<float> y = xt::xarray<float>::from_shape({20, 1});
        for (std::size_t i = 0; i < 20; ++i) {
            for (std::size_t j = 0; j < 3; ++j) x(i, j) = static_cast<float>((i * 7 + j * 13) % 50);
            y(i, 0) = static_cast<float>(i % 2);
        }
        const auto history = model.fit(x, y, 3, 4, true, false);  // 3 epochs of batches of 4
        REQUIRE(history.loss.size() == 3);
        for (const double loss : history.loss) CHECK(std::isfinite(loss));
        CHECK(history.loss.back() < history.loss.front());
        const xt::xarray<float> predicted = model.predict(x);
        CHECK(pss::Shape(predicted.shape().begin(), predicted.shape().end()) == pss::Shape{20, 1});
    }

    TEST_CASE("Embedding: embeddings_initializer by name (zeros) or as an object (a seeded RandomNormal); its config "
              "carries it; Embedding(5, 4, float64) still takes a dtype") {
        std::mt19937 rng(0);
        pss::Embedding zeros(5, 4, {.embeddings_initializer = "zeros"});
        zeros.build({3}, rng);
        CHECK(zeros.embeddings().read<float>() == xt::xarray<float>(xt::zeros<float>({5, 4})));
        pss::Embedding seeded(5, 4, {.embeddings_initializer = pss::initializers::RandomNormal(0, 1, 3),
                                     .dtype = pss::DType::float64});
        seeded.build({3}, rng);
        // Drawn on the ps from its own seed (not the model's): the same table every time.
        CHECK(seeded.embeddings().read<double>() ==
              pss::detail::initial_value(pss::InitializerSpec::random_normal(0, 1, 3), pss::DType::float64, {5, 4})
                  .get<double>());
        CHECK(pss::serialize(seeded)["config"]["embeddings_initializer"] ==
              nlohmann::json::parse(R"({"class_name": "RandomNormal", "config": {"mean": 0.0, "stddev": 1.0, "seed": 3}})"));
        const xt::xarray<double> ids = {{0, 4, 2}, {1, 1, 3}};
        (void)check_rebuilt_layer(seeded, ids, xt::ones<double>({2, 3, 4}));
        CHECK(pss::Embedding(5, 4, pss::DType::float64).dtype() == pss::DType::float64);
    }

    TEST_CASE("Activation: each function's outputs and input gradients are Dense's with an identity kernel and a zero "
              "bias, bit for bit; softmax over the last axis of (2, 2, 3); Keras' config; in a model, Dense(3) then "
              "Activation(\"softmax\") predicts as Dense(3, \"softmax\")") {
        const xt::xarray<double> z = {{0.5, -1.5, 2.0}, {-0.25, 0.75, 1.0}};
        const xt::xarray<double> g = {{1.0, -2.0, 0.5}, {0.25, 3.0, -1.0}};
        for (const auto& entry : pss::detail::activation_names) {
            const pss::ActivationFunction function = entry.first;
            const std::string_view name = entry.second;
            CAPTURE(name);
            std::mt19937 rng(0);
            pss::Activation layer(name);
            CHECK(layer.activation() == function);
            CHECK(layer.build({3}, rng) == pss::Shape{3});
            CHECK(layer.name() == "activation");
            CHECK(layer.weights().empty());
            pss::Dense dense(3, function, true, pss::DType::float64);
            dense.build({3}, rng);
            dense.set_weights({xt::xarray<double>(xt::eye<double>(3)), xt::xarray<double>(xt::zeros<double>({3}))});
            CHECK(D(layer.forward(z)) == D(dense.forward(z)));
            CHECK(D(layer.backward(g).inputs) == D(dense.backward(g).inputs));
            CHECK(layer.forward(xt::xarray<float>(xt::cast<float>(z))).dtype() == pss::DType::float32);
        }
        pss::Activation softmax("softmax");
        std::mt19937 rng(0);
        softmax.build({2, 3}, rng);
        const xt::xarray<double> x = {{{1, 2, 3}, {-1, 0, 4}}, {{0.5, 0.5, 0.5}, {10, -10, 0}}};
        const xt::xarray<double> y = D(softmax.forward(x));
        for (std::size_t i = 0; i < 2; ++i)
            for (std::size_t j = 0; j < 2; ++j) {
                double top = x(i, j, 0), sum = 0;
                for (std::size_t k = 1; k < 3; ++k) top = std::max(top, x(i, j, k));
                for (std::size_t k = 0; k < 3; ++k) sum += std::exp(x(i, j, k) - top);
                for (std::size_t k = 0; k < 3; ++k) CHECK(y(i, j, k) == doctest::Approx(std::exp(x(i, j, k) - top) / sum).epsilon(1e-15));
            }
        CHECK(pss::serialize(softmax) ==
              nlohmann::json::parse(R"({"class_name": "Activation", "config": {"name": "activation", "activation": "softmax",
                                        "batch_input_shape": [null, 2, 3]}})"));
        const xt::xarray<double> r = {{{1, -2, 0.5}, {0.25, 3, -1}}, {{2, 0, -1}, {1, 1, 1}}};
        (void)check_rebuilt_layer(softmax, x, r);
        (void)softmax.forward(x);
        const xt::xarray<double> gradient = D(softmax.backward(r).inputs);
        xt::xarray<double> xs = x;
        for (std::size_t i = 0; i < x.size(); ++i)
            check_close(gradient.data()[i],
                        central_difference(xs.data()[i], [&] { return weighted_sum(r, softmax.forward(xs)); }),
                        "input " + std::to_string(i));
        CHECK_THROWS_WITH_AS(pss::Activation("gelu"),
                             "pss: activation \"gelu\" is not known; use \"linear\", \"relu\", \"sigmoid\", \"tanh\" or "
                             "\"softmax\"",
                             pss::InvalidArgumentError);

        pss::ParameterServerStrategy<> strategy;
        pss::Sequential two(strategy, {pss::Dense(3), pss::Activation("softmax")}, 5);
        pss::Sequential one(strategy, {pss::Dense(3, "softmax")}, 5);
        two.build({2});
        one.build({2});
        const xt::xarray<float> inputs = {{1, 2}, {-1, 0.5f}, {0, 0}};
        CHECK(two.predict(inputs) == one.predict(inputs));
    }

    TEST_CASE("LayerNormalization: the row [1, 2, 3, 6] (mean 3, biased variance 3.5) with gamma [1, 2, 0.5, -1] and "
              "beta [0.1, 0, 0, 0.2] gives gamma * (x - 3) / sqrt(3.5 + 0.001) + beta; Keras' example [[0, 10], "
              "[20, 30], [40, 50]] gives -+5 / sqrt(25.001); gamma ones, beta zeros") {
        std::mt19937 rng(0);
        const std::mt19937 before = rng;
        pss::LayerNormalization norm({.dtype = pss::DType::float64});
        CHECK(norm.build({4}, rng) == pss::Shape{4});
        CHECK(rng == before);  // ones and zeros draw nothing
        CHECK(norm.name() == "layer_normalization");
        REQUIRE(norm.weights().size() == 2);
        CHECK(norm.gamma().name() == "layer_normalization/gamma:0");
        CHECK(norm.beta().name() == "layer_normalization/beta:0");
        CHECK(D(norm.gamma().read_value()) == xt::xarray<double>{1, 1, 1, 1});
        CHECK(D(norm.beta().read_value()) == xt::xarray<double>{0, 0, 0, 0});
        norm.set_weights({xt::xarray<double>{1, 2, 0.5, -1}, xt::xarray<double>{0.1, 0, 0, 0.2}});
        const xt::xarray<double> y = D(norm.forward(xt::xarray<double>{{1, 2, 3, 6}}));
        const double inverse = 1 / std::sqrt(3.5 + 0.001);
        const std::vector<double> expected = {1 * -2 * inverse + 0.1, 2 * -1 * inverse, 0.5 * 0 * inverse,
                                              -1 * 3 * inverse + 0.2};
        for (std::size_t j = 0; j < 4; ++j) CHECK(y(0, j) == doctest::Approx(expected[j]).epsilon(1e-15));

        pss::LayerNormalization keras({.axis = 1});  // Keras' docstring: axis 1 of (batch, 2) is the last
        keras.build({2}, rng);
        const pss::Tensor k = keras.forward(xt::xarray<float>{{0, 10}, {20, 30}, {40, 50}});
        CHECK(k.dtype() == pss::DType::float32);
        for (std::size_t r = 0; r < 3; ++r) {
            CHECK(D(k)(r, 0) == doctest::Approx(-5 / std::sqrt(25.001)).epsilon(1e-6));
            CHECK(D(k)(r, 1) == doctest::Approx(5 / std::sqrt(25.001)).epsilon(1e-6));
        }

        pss::LayerNormalization plain({.center = false, .scale = false, .dtype = pss::DType::float64});
        plain.build({3}, rng);
        CHECK(plain.weights().empty());
        const xt::xarray<double> p = D(plain.forward(xt::xarray<double>{{1, 2, 3}}));
        CHECK(p(0, 0) == doctest::Approx(-1 / std::sqrt(2.0 / 3 + 0.001)).epsilon(1e-15));
        CHECK(p(0, 1) == 0);
        CHECK(plain.backward(xt::xarray<double>{{1, 0, 0}}).variables.empty());
        pss::LayerNormalization scale_only({.center = false});
        scale_only.build({3}, rng);
        REQUIRE(scale_only.weights().size() == 1);
        CHECK(scale_only.weights()[0].name() == "layer_normalization/gamma:0");

        pss::LayerNormalization wrong({.axis = 1});
        CHECK_THROWS_WITH_AS(wrong.build({3, 4}, rng),
                             "pss: LayerNormalization 'layer_normalization': axis is 1 for input shape (3, 4) (batch axis "
                             "excluded); only the last axis is supported: -1 or 2 (counting the batch axis)",
                             pss::InvalidArgumentError);
        CHECK_FALSE(wrong.built());
        CHECK_THROWS_WITH_AS(pss::LayerNormalization({.epsilon = 0}),
                             "pss: LayerNormalization: epsilon is 0.0; it is a finite number > 0 (Keras' default 0.001)",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("LayerNormalization: input, gamma and beta gradients match central differences (float64, 1e-8 relative) "
              "for inputs (2, 4) and (2, 2, 3); float32 agrees with float64 to 1e-5 relative") {
        auto check = [](const pss::Shape& input_shape, xt::xarray<double> x, xt::xarray<double> gamma,
                        xt::xarray<double> beta, const xt::xarray<double>& r) {
            pss::LayerNormalization norm({.epsilon = 0.01, .dtype = pss::DType::float64});
            std::mt19937 rng(0);
            norm.build(input_shape, rng);
            auto f = [&] {
                norm.set_weights({gamma, beta});
                return weighted_sum(r, norm.forward(x));
            };
            f();
            const pss::LayerGradients grads = norm.backward(r);
            REQUIRE(grads.variables.size() == 2);
            CHECK(grads.variables[0].variable.name() == norm.gamma().name());
            for (std::size_t i = 0; i < gamma.size(); ++i)
                check_close(D(grads.variables[0].values).data()[i], central_difference(gamma.data()[i], f), "gamma " + std::to_string(i));
            for (std::size_t i = 0; i < beta.size(); ++i)
                check_close(D(grads.variables[1].values).data()[i], central_difference(beta.data()[i], f), "beta " + std::to_string(i));
            for (std::size_t i = 0; i < x.size(); ++i)
                check_close(D(grads.inputs).data()[i], central_difference(x.data()[i], f), "input " + std::to_string(i));
            // A float32 twin computes in float32, within 1e-5 of float64.
            pss::LayerNormalization n32({.epsilon = 0.01});
            n32.build(input_shape, rng);
            n32.set_weights({gamma, beta});
            const pss::Tensor y32 = n32.forward(xt::xarray<float>(xt::cast<float>(x)));
            CHECK(y32.dtype() == pss::DType::float32);
            const pss::LayerGradients g32 = n32.backward(xt::xarray<float>(xt::cast<float>(r)));
            const xt::xarray<double> y64 = D(norm.forward(x));
            const pss::LayerGradients g64 = norm.backward(r);
            for (std::size_t i = 0; i < y64.size(); ++i) {
                CHECK(std::abs(D(y32).data()[i] - y64.data()[i]) <= 1e-5 * std::max(1.0, std::abs(y64.data()[i])));
                CHECK(std::abs(D(g32.inputs).data()[i] - D(g64.inputs).data()[i]) <=
                      1e-5 * std::max(1.0, std::abs(D(g64.inputs).data()[i])));
            }
        };
        SUBCASE("(2, 4)") {
            check({4}, {{1.0, -0.5, 0.3, 0.8}, {-0.7, 0.2, 0.9, -0.4}}, {1.5, -0.5, 2, 0.25}, {0.1, -0.2, 0.3, 0},
                  {{0.3, -1.2, 0.7, 0.2}, {1.1, 0.4, -0.5, -0.9}});
        }
        SUBCASE("(2, 2, 3)") {
            check({2, 3}, {{{1, 2, 4}, {-1, 0.5, 0}}, {{0.2, 0.1, -0.3}, {3, -2, 1}}}, {0.5, 1.5, -1}, {0, 0.25, -0.5},
                  {{{1, -2, 0.5}, {0.25, 3, -1}}, {{2, 0, -1}, {1, 1, 1}}});
        }
    }

    TEST_CASE("serialize: LayerNormalization(epsilon 1e-5, center false) for (2, 3) is {\"class_name\": "
              "\"LayerNormalization\", \"config\": {\"axis\": -1, ...}}; rebuilt, bound, it computes the same; bad "
              "fields throw naming them") {
        pss::LayerNormalization norm({.epsilon = 1e-5, .center = false});
        std::mt19937 rng(0);
        norm.build({2, 3}, rng);
        norm.set_weights({xt::xarray<float>{0.5f, 2, -1}});
        CHECK(pss::serialize(norm) ==
              nlohmann::json::parse(R"({"class_name": "LayerNormalization", "config": {"name": "layer_normalization",
                  "axis": -1, "epsilon": 1e-05, "center": false, "scale": true, "dtype": "float32",
                  "batch_input_shape": [null, 2, 3]}})"));
        const xt::xarray<double> x = {{{1, 2, 4}, {-1, 0.5, 0}}, {{0.2, 0.1, -0.3}, {3, -2, 1}}};
        (void)check_rebuilt_layer(norm, x, xt::ones<double>({2, 2, 3}));
        const std::string fields = R"("batch_input_shape":[null,3],"center":true,"dtype":"float32",)";
        check_bad_layer_config(
            R"({"class_name":"LayerNormalization","config":{"axis":"x",)" + fields + R"("epsilon":0.001,"name":"n","scale":true}})",
            R"(pss: LayerNormalization config {"axis":"x",)" + fields + R"("epsilon":0.001,"name":"n","scale":true}: )"
            R"("axis" is "x"; it is -1 or the index of the last axis (counting the batch axis), a whole number up to 32)");
        check_bad_layer_config(
            R"({"class_name":"LayerNormalization","config":{"axis":-1,)" + fields + R"("epsilon":0,"name":"n","scale":true}})",
            R"(pss: LayerNormalization config {"axis":-1,)" + fields + R"("epsilon":0,"name":"n","scale":true}: )"
            R"(epsilon is 0.0; it is a finite number > 0 (Keras' default 0.001))");
        // An axis other than the last parses, and bind rejects it for the input shape.
        auto parsed = pss::detail::parse_layer_config(nlohmann::json::parse(
            R"({"class_name":"LayerNormalization","config":{"axis":1,)" + fields + R"("epsilon":0.001,"name":"n","scale":true}})"));
        CHECK_THROWS_AS((void)parsed.layer->bind({3, 2}, {}), pss::InvalidArgumentError);
    }
}

TEST_SUITE("keras/losses") {
    TEST_CASE("MeanSquaredError: targets [[1], [2]], predictions [[1.5], [1]] give 0.625; gradient [[0.5], [-1]] matches central differences") {
        pss::MeanSquaredError mse;
        const auto y = column({1, 2});
        const auto p = column({1.5, 1});
        CHECK(mse.value(y, p) == 0.625);
        CHECK(mse(y, p) == 0.625);
        CHECK(D(mse.gradient(y, p)) == column({0.5, -1}));
        check_loss_gradient(mse, column({1, 2, -3}), column({0.3, 2.5, -1}));
    }

    TEST_CASE("BinaryCrossentropy: Keras' clipped formula with epsilon 1e-7; gradient matches central differences") {
        pss::BinaryCrossentropy bce;
        const auto y = column({1, 0});
        const auto p = column({0.8, 0.4});
        const double e = 1e-7;
        const double expected = -(std::log(0.8 + e) + std::log(1 - 0.4 + e)) / 2;
        CHECK(bce.value(y, p) == doctest::Approx(expected).epsilon(1e-15));
        check_loss_gradient(bce, column({1, 0, 1, 0.3}), column({0.8, 0.4, 0.05, 0.6}));
        SUBCASE("a prediction of 0 for target 1 is clipped to 1e-7: loss -log(2e-7) = 15.424948..., gradient 0") {
            CHECK(bce.value(column({1}), column({0})) == doctest::Approx(-std::log(2e-7)).epsilon(1e-12));
            CHECK(D(bce.gradient(column({1}), column({0}))) == column({0}));
        }
    }

    TEST_CASE("SparseCategoricalCrossentropy: ids [1, 0] for [[0.2, 0.7, 0.1], [0.5, 0.25, 0.25]] give (-log 0.7 - log 0.5) / 2") {
        pss::SparseCategoricalCrossentropy scce;
        const xt::xarray<double> p = {{0.2, 0.7, 0.1}, {0.5, 0.25, 0.25}};
        const xt::xarray<double> y = {1, 0};
        CHECK(scce.value(y, p) == doctest::Approx((-std::log(0.7) - std::log(0.5)) / 2).epsilon(1e-14));
        // Off the simplex the log(sum) term of Keras' formula counts too; the gradient matches it.
        check_loss_gradient(scce, y, xt::xarray<double>{{0.2, 0.6, 0.1}, {0.5, 0.3, 0.25}});
        check_loss_gradient(scce, column({2, 0}), p);
        CHECK_THROWS_WITH_AS(scce.check_targets(xt::xarray<float>{1, 3}, pss::Shape{3}),
                             "pss: sparse_categorical_crossentropy: a target is 3.000000, not a class id; targets are "
                             "integers in [0, 3) stored as floats",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("make_loss: \"mse\" is MeanSquaredError, \"huber\" Huber; \"hinge\" throws listing the known names") {
        CHECK(pss::make_loss("mse")->name() == "mean_squared_error");
        CHECK(pss::make_loss("sparse_categorical_crossentropy")->name() == "sparse_categorical_crossentropy");
        CHECK(pss::make_loss("huber")->name() == "huber_loss");
        CHECK_THROWS_WITH_AS((void)pss::make_loss("hinge"),
                             "pss: loss \"hinge\" is not known; use \"mean_squared_error\" (or \"mse\"), "
                             "\"binary_crossentropy\", \"sparse_categorical_crossentropy\" or \"huber\", or pass a "
                             "pss::Loss object",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("from_logits: the crossentropies of logits are TensorFlow's exact formulas (no overflow at 1000); "
              "gradients match central differences; they agree with the probabilities' losses of the softmax or sigmoid") {
        const pss::BinaryCrossentropy bce(true);
        CHECK(bce.from_logits());
        // Logit 0 for target 1 costs log 2; logit 2 for target 0 costs 2 + log(1 + e^-2).
        CHECK(bce.value(column({1, 0}), column({0, 2})) ==
              doctest::Approx((std::log(2.0) + 2 + std::log1p(std::exp(-2.0))) / 2).epsilon(1e-14));
        CHECK(bce.value(column({1}), column({-1000})) == 1000);  // exact: no exp overflows, no clip
        const double sigmoid2 = 1 / (1 + std::exp(-2.0));
        const xt::xarray<double> g = D(bce.gradient(column({1, 0}), column({0, 2})));
        CHECK(g(0, 0) == (0.5 - 1) / 2);
        CHECK(g(1, 0) == doctest::Approx(sigmoid2 / 2).epsilon(1e-15));
        check_loss_gradient(bce, column({1, 0, 1, 0.3}), column({0.8, -0.4, 3, -2}));
        CHECK(bce.value(column({1, 0}), column({0.5, -1})) ==
              doctest::Approx(pss::BinaryCrossentropy().value(column({1, 0}), column({1 / (1 + std::exp(-0.5)),
                                                                                        1 / (1 + std::exp(1.0))})))
                  .epsilon(1e-6));

        const pss::SparseCategoricalCrossentropy scce(true);
        const xt::xarray<double> logits = {{1, 2, 3}, {0, 0, 0}};
        const xt::xarray<double> ids = {2, 1};
        CHECK(scce.value(ids, logits) ==
              doctest::Approx((std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3 + std::log(3.0)) / 2)
                  .epsilon(1e-14));
        check_loss_gradient(scce, ids, logits);
        check_loss_gradient(scce, xt::xarray<double>{0, 2}, xt::xarray<double>{{0.3, -1, 2}, {5, 4.5, -3}});
        CHECK(scce.value(xt::xarray<double>{0}, xt::xarray<double>{{1000, 0, -1000}}) == 0);
        const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0), sum = e1 + e2 + e3;
        CHECK(scce.value(ids, logits) == doctest::Approx(pss::SparseCategoricalCrossentropy().value(
                                                             ids, xt::xarray<double>{{e1 / sum, e2 / sum, e3 / sum},
                                                                                     {1.0 / 3, 1.0 / 3, 1.0 / 3}}))
                                             .epsilon(1e-6));
        // A worker rebuilds them from their configs, from_logits kept.
        const auto rebuilt = pss::detail::loss_from_config(pss::serialize(scce));
        CHECK(rebuilt->get_config().at("from_logits") == true);
        CHECK(rebuilt->value(ids, logits) == scce.value(ids, logits));
        CHECK(pss::detail::loss_from_config(pss::serialize(bce))->value(column({1}), column({-1000})) == 1000);
    }

    TEST_CASE("Huber: errors 0.5 and -3 with delta 1 cost (0.125 + 2.5) / 2; the gradient is the clipped error; "
              "central differences; its config; delta 0 is refused") {
        const pss::Huber huber;
        CHECK(huber.delta() == 1.0);
        CHECK(huber.value(column({1, 4}), column({1.5, 1})) == (0.125 + 2.5) / 2);
        CHECK(D(huber.gradient(column({1, 4}), column({1.5, 1}))) == column({0.25, -0.5}));
        const pss::Huber wide(2.5);
        check_loss_gradient(wide, column({1, 4, 0, -2}), column({1.5, -1, 0.3, 5}));  // inside and beyond delta
        CHECK(pss::serialize(wide) ==
              nlohmann::json::parse(R"({"class_name": "Huber", "config": {"delta": 2.5, "name": "huber_loss", "reduction": "auto"}})"));
        const auto rebuilt = pss::detail::loss_from_config(pss::serialize(wide));
        CHECK(rebuilt->value(column({4}), column({-1})) == 2.5 * (5 - 1.25));
        CHECK_THROWS_WITH_AS((void)pss::Huber(0), "pss: Huber: delta is 0.0; it is a finite number > 0 (Keras' default 1.0)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::detail::loss_from_config(nlohmann::json::parse(
                                 R"({"class_name":"Huber","config":{"delta":-1,"name":"huber_loss","reduction":"auto"}})")),
                             R"(pss: Huber config {"delta":-1,"name":"huber_loss","reduction":"auto"}: "delta" is -1; )"
                             R"(it is a finite number > 0)",
                             pss::InvalidArgumentError);
    }
}

namespace {

/// What the layers of FailsOnWorker share across the workers' copies: the step at which worker 1's copy
/// throws (0: none), and whether worker 0 ran that step's backward (so pushed every gradient of it).
struct FailPlan {
    std::atomic<std::uint64_t> step{0};
    std::atomic<bool> worker_0_pushed{false};
};

/// An identity layer without weights, first in its model: at the planned step, worker 1's copy throws
/// FailedPreconditionError once worker 0 pushed its part of the step (so that the step's weights are
/// the same in every run: worker 0's gradients, none of worker 1's).
class FailsOnWorker final : public pss::Layer {
public:
    explicit FailsOnWorker(std::shared_ptr<FailPlan> plan) : plan_(std::move(plan)) {}
    [[nodiscard]] std::unique_ptr<pss::Layer> clone() const override { return std::make_unique<FailsOnWorker>(*this); }
    [[nodiscard]] std::string_view class_name() const noexcept override { return "FailsOnWorker"; }
    pss::Tensor forward(pss::Tensor inputs, std::uint64_t step) override {
        step_ = step;
        if (step != 0 && step == plan_->step && pss::worker_index() == 1) {
            for (int i = 0; i < 10'000 && !plan_->worker_0_pushed; ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            throw pss::FailedPreconditionError("pss: test: worker 1 fails at step " + std::to_string(step));
        }
        return inputs;
    }
    pss::LayerGradients backward(const pss::Tensor& grad_outputs) override {
        // The first layer's backward comes after every later layer's gradients were pushed.
        if (step_ != 0 && step_ == plan_->step && pss::worker_index() == 0) plan_->worker_0_pushed = true;
        return {grad_outputs, {}};
    }

protected:
    pss::Shape do_build(const pss::Shape& input_shape, std::mt19937& /*rng*/) override { return input_shape; }
    pss::Shape do_bind(const pss::Shape& input_shape, std::vector<pss::Variable> weights) override {
        check_bind_weights(weights, {});
        return input_shape;
    }

private:
    std::shared_ptr<FailPlan> plan_;
    std::uint64_t step_ = 0;
};

/// Runs `call` on a thread of its own and returns its result; a call still running after `limit` ends
/// the test program with exit code 1: a step left waiting for ever fails the run instead of stalling it.
template <class F>
auto returns_within(std::chrono::seconds limit, const char* what, F call) {
    auto result = std::async(std::launch::async, std::move(call));
    if (result.wait_for(limit) != std::future_status::ready) {
        std::fprintf(stderr, "FAILED: %s did not return within %lld s\n", what, static_cast<long long>(limit.count()));
        std::fflush(nullptr);
        std::_Exit(1);
    }
    return result.get();
}

using SyncTwoWorkers = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                    pss::LocalClusterResolver<2, 2>, pss::Synchronous>;

/// 16 examples of 3 features and their targets, for the synchronous failure tests.
std::pair<xt::xarray<float>, xt::xarray<float>> failure_test_data() {
    xt::xarray<float> x = xt::xarray<float>::from_shape({16, 3});
    xt::xarray<float> y = xt::xarray<float>::from_shape({16, 1});
    for (std::size_t i = 0; i < 16; ++i) {
        for (std::size_t j = 0; j < 3; ++j) x(i, j) = static_cast<float>((i * (j + 3)) % 7) * 0.25f - 0.75f;
        y(i, 0) = x(i, 0) - 2 * x(i, 1) + 0.5f * x(i, 2) + 0.25f;
    }
    return {x, y};
}

/// A fit's losses, then every weight.
template <class M>
std::vector<double> losses_and_weights(const pss::History& history, const M& model) {
    std::vector<double> out(history.loss.begin(), history.loss.end());
    for (const auto& w : model.get_weights()) out.insert(out.end(), w.template get<float>().begin(), w.template get<float>().end());
    return out;
}

}  // namespace

TEST_SUITE("keras/model") {
    TEST_CASE("Sequential::summary: tf.keras 2's table of layers, output shapes and parameter counts, then each "
              "variable's ps tasks; before build, FailedPreconditionError") {
        pss::ParameterServerStrategy<> strategy;  // 2 ps, one shard per variable, placed round-robin
        pss::Sequential model(strategy, {pss::Dense(16, "relu"), pss::Dense(1)});
        CHECK_THROWS_AS(model.summary(), pss::FailedPreconditionError);
        model.build({3});
        std::ostringstream out;
        model.summary(out);
        CHECK(out.str() == "Model: \"sequential\"\n"
                           "_________________________________________________________________\n"
                           " Layer (type)                Output Shape              Param #   \n"
                           "=================================================================\n"
                           " dense (Dense)               (None, 16)                64        \n"
                           "                                                                 \n"
                           " dense_1 (Dense)             (None, 1)                 17        \n"
                           "                                                                 \n"
                           "=================================================================\n"
                           "Total params: 81\n"
                           "Trainable params: 81\n"
                           "Non-trainable params: 0\n"
                           "_________________________________________________________________\n"
                           " Variable                    Shape                     On ps     \n"
                           "=================================================================\n"
                           " dense/kernel:0              (3, 16)                   0         \n"
                           " dense/bias:0                (16,)                     1         \n"
                           " dense_1/kernel:0            (16, 1)                   0         \n"
                           " dense_1/bias:0              (1,)                      1         \n"
                           "=================================================================\n");
        // A field wider than its column goes on in the same column of the next lines.
        std::ostringstream wrapped;
        pss::detail::summary_row(wrapped, {"a_layer_name_of_thirty_letters", "(None, 1)", "0,1,0,1,0,1"}, {29, 55, 65});
        CHECK(wrapped.str() == " a_layer_name_of_thirty_let  (None, 1)                 0,1,0,1,0,\n"
                               " ters                                                  1         \n");
    }

    TEST_CASE("Sequential: seed_fit with kernel [[0.5]] and bias [0] gives the 5 losses of full-batch gradient descent by hand (1e-6 relative)") {
        pss::ParameterServerStrategy<> strategy;
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.build({1});
        model.layers().front()->set_weights({column_f({0.5f}), xt::xarray<float>{0.0f}});
        model.compile(pss::SGD(), pss::MeanSquaredError());
        const auto x = column_f({1, 2, 3, 4});
        const auto y = column_f({2, 4, 6, 8});
        const pss::History history = model.fit(x, y, 5, 32, true, false);
        REQUIRE(history.loss.size() == 5);
        CHECK(history.epoch == std::vector<int>{0, 1, 2, 3, 4});

        // By hand: batch_size 32 > 4 examples, so one full batch per epoch; the ps keeps float32 and
        // applies w -= 0.01f * float(g) (SGD's default learning rate).
        float w = 0.5f, b = 0.0f;
        for (int epoch = 0; epoch < 5; ++epoch) {
            double loss = 0, gw = 0, gb = 0;
            for (double xi : {1.0, 2.0, 3.0, 4.0}) {
                const double err = static_cast<double>(w) * xi + static_cast<double>(b) - 2 * xi;
                loss += err * err / 4;
                gw += 2 * err * xi / 4;
                gb += 2 * err / 4;
            }
            CAPTURE(epoch);
            CHECK(close_relative(history.loss[static_cast<std::size_t>(epoch)], loss, 1e-6));
            w -= 0.01f * static_cast<float>(gw);
            b -= 0.01f * static_cast<float>(gb);
        }
        CHECK(history.loss.front() == doctest::Approx(16.875).epsilon(1e-12));  // mean((0.5x - 2x)^2)
        CHECK(close_relative(model.layers().front()->get_weights()[0].get<float>()(0, 0), w, 1e-6));
    }

    TEST_CASE("Sequential: a 2-worker synchronous fit (batch 3 of 10 examples, one empty slice) gives a 1-worker fit's weights (1e-6 relative)") {
        using TwoWorkers = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                        pss::LocalClusterResolver<2, 2>, pss::Synchronous>;
        using OneWorker = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                       pss::LocalClusterResolver<1, 1>, pss::Synchronous>;
        xt::xarray<float> x = xt::xarray<float>::from_shape({10, 3});
        xt::xarray<float> y = xt::xarray<float>::from_shape({10, 1});
        for (std::size_t i = 0; i < 10; ++i) {
            x(i, 0) = static_cast<float>(i % 5);  // an id for the Embedding
            x(i, 1) = static_cast<float>((i * 7) % 5);
            x(i, 2) = static_cast<float>((i * 3) % 5);
            y(i, 0) = static_cast<float>(i) * 0.3f - 1.0f;
        }
        double moved = 0;  // the largest change of a weight: the fit must train
        auto train = [&](auto& strategy) {
            pss::Sequential model(strategy,
                                  {pss::Embedding(5, 4), pss::GlobalAveragePooling1D(), pss::Dense(3, "tanh"), pss::Dense(1)},
                                  7);
            model.compile(pss::SGD(0.1), "mse");
            model.build({3});
            const auto initial = model.get_weights();
            auto history = model.fit(x, y, 3, 3, true, false);
            std::vector<double> out(history.loss.begin(), history.loss.end());
            const auto final_weights = model.get_weights();
            for (std::size_t i = 0; i < final_weights.size(); ++i) {
                const auto& a = final_weights[i].template get<float>();
                const auto& a0 = initial[i].template get<float>();
                for (std::size_t j = 0; j < a.size(); ++j)
                    moved = std::max(moved, static_cast<double>(std::abs(a.data()[j] - a0.data()[j])));
                out.insert(out.end(), a.begin(), a.end());
            }
            return out;
        };
        TwoWorkers two(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        OneWorker one(pss::LocalClusterResolver<1, 1>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        const auto a = train(two);
        const auto b = train(one);
        REQUIRE(a.size() == b.size());
        REQUIRE(a.size() == 3 + 20 + 12 + 3 + 3 + 1);  // 3 losses, embeddings, kernel, bias, kernel, bias
        for (std::size_t i = 0; i < a.size(); ++i) {
            CAPTURE(i);
            CHECK(std::abs(a[i] - b[i]) <= 1e-6 * std::max(1.0, std::abs(b[i])));
        }
        CHECK(moved > 1e-2);
    }

    TEST_CASE("Sequential: a synchronous 2-worker fit whose worker 1 fails at a step raises its error, leaves that "
              "step applied with worker 0's gradients only, and the next fit runs at once as from those weights") {
        const auto data = failure_test_data();  // not a structured binding: clang 14 cannot capture one
        const xt::xarray<float>& x = data.first;
        const xt::xarray<float>& y = data.second;
        const pss::FitOptions batches_of_4{.batch_size = 4, .verbose = 0, .shuffle = false};
        auto new_strategy = [] {
            return std::make_unique<SyncTwoWorkers>(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2),
                                                       pss::SGD(0.1));
        };
        // The model of every run below: seed 7, so each starts from the same weights.
        auto make = [](SyncTwoWorkers& strategy, std::shared_ptr<FailPlan> plan) {
            auto model = std::make_unique<pss::Sequential<SyncTwoWorkers>>(
                strategy, std::initializer_list<pss::AnyLayer>{FailsOnWorker(std::move(plan)), pss::Dense(2, "tanh"), pss::Dense(1)},
                7);
            model->compile(pss::SGD(0.1), "mse");
            model->build({3});
            return model;
        };
        // The next fit of a model whose fit failed, bounded: without the failed step completed, its first pull
        // waits for ever. It gives the losses and weights of a fresh model given the weights the failure left.
        auto check_next_fit = [&](pss::Sequential<SyncTwoWorkers>& model) {
            pss::FitOptions two_epochs = batches_of_4;
            two_epochs.epochs = 2;
            const auto failed = model.get_weights();
            const auto next = returns_within(std::chrono::seconds(30), "the fit after the failed one",
                                             [&] { return losses_and_weights(model.fit(x, y, two_epochs), model); });
            const auto fresh_strategy = new_strategy();
            auto fresh = make(*fresh_strategy, std::make_shared<FailPlan>());
            fresh->set_weights(failed);
            CHECK(next == losses_and_weights(fresh->fit(x, y, two_epochs), *fresh));
        };
        SUBCASE("a layer of worker 1 throws at the last step: the weights are those of a fit whose worker 1 slice "
                "of that step weighs 0") {
            const auto strategy = new_strategy();
            const auto plan = std::make_shared<FailPlan>();
            plan->step = 4;  // batch 4 of 4: examples 12 and 13 on worker 0, 14 and 15 on worker 1
            auto model = make(*strategy, plan);
            CHECK_THROWS_WITH_AS(returns_within(std::chrono::seconds(30), "the failing fit",
                                                [&] { return model->fit(x, y, batches_of_4); }),
                                 "pss: test: worker 1 fails at step 4", pss::FailedPreconditionError);
            const auto reference_strategy = new_strategy();
            auto reference = make(*reference_strategy, std::make_shared<FailPlan>());
            pss::FitOptions weighed = batches_of_4;
            weighed.sample_weight.assign(16, 1.0);
            weighed.sample_weight[14] = weighed.sample_weight[15] = 0;
            (void)reference->fit(x, y, weighed);
            const auto failed = model->get_weights();
            const auto expected = reference->get_weights();
            REQUIRE(failed.size() == expected.size());
            for (std::size_t i = 0; i < failed.size(); ++i) {
                CAPTURE(i);
                CHECK(failed[i].get<float>() == expected[i].get<float>());
            }
            plan->step = 0;
            check_next_fit(*model);
        }
        SUBCASE("a non-finite target in worker 1's slice of step 2 of 4: the ps refuses its gradient; the steps "
                "scheduled after it are completed or dropped") {
            const auto strategy = new_strategy();
            auto model = make(*strategy, std::make_shared<FailPlan>());
            xt::xarray<float> bad_y = y;
            bad_y(7, 0) = std::numeric_limits<float>::quiet_NaN();  // batch 2: examples 4, 5 on worker 0, 6, 7 on worker 1
            CHECK_THROWS_WITH_AS(returns_within(std::chrono::seconds(30), "the failing fit",
                                                [&] { return model->fit(x, bad_y, batches_of_4); }),
                                 "pss: apply_gradient on variable 'dense_1/kernel/part_0': the gradient holds 1 "
                                 "non-finite value (NaN or infinity) of 1; nothing was applied "
                                 "(ServerOptions::refuse_non_finite_gradients)",
                                 pss::InvalidArgumentError);
            check_next_fit(*model);
        }
    }

    TEST_CASE("Sequential: an asynchronous fit of y = 3 x0 - 2 x1 + 1 on 2 workers brings the loss from 5.22 to below 1e-6") {
        pss::ParameterServerStrategy<> strategy(pss::LocalClusterResolver<2, 2>{}, pss::NoPartitioner{}, pss::SGD(0.05));
        xt::xarray<float> x = xt::xarray<float>::from_shape({64, 2});
        xt::xarray<float> y = xt::xarray<float>::from_shape({64, 1});
        for (std::size_t i = 0; i < 64; ++i) {
            x(i, 0) = static_cast<float>(i % 8) / 4.0f - 1.0f;
            x(i, 1) = static_cast<float>(i / 8) / 4.0f - 1.0f;
            y(i, 0) = 3 * x(i, 0) - 2 * x(i, 1) + 1;
        }
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.compile(pss::SGD(0.05), pss::MeanSquaredError());
        model.build({2});
        const double before = model.evaluate(x, y);
        const auto history = model.fit(x, y, 40, 8, true, false);
        const double after = model.evaluate(x, y);
        MESSAGE("loss before " << before << ", last epoch " << history.loss.back() << ", after " << after);
        CHECK(before == doctest::Approx(5.22314).epsilon(1e-5));  // the seed-0 initial weights
        // Measured over runs: 1.47e-9 to 1.61e-9 after 40 epochs (320 steps; float32 weights make ~1e-9 the
        // floor). The bound is 600 times that, room for any interleaving of the two workers.
        CHECK(after < 1e-6);
    }

    TEST_CASE("Sequential::compile: SGD(0.1) when the strategy has SGD(0.01) throws; the same SGD does not") {
        pss::ParameterServerStrategy<> strategy;
        pss::Sequential model(strategy, {pss::Dense(1)});
        CHECK_THROWS_WITH_AS(
            model.compile(pss::SGD(0.1), pss::MeanSquaredError()),
            "pss: Sequential::compile: the optimizer is SGD(learning_rate=0.1), but the strategy's is "
            "SGD(learning_rate=0.01); in pss the parameter servers apply the strategy's optimizer, so construct the "
            "strategy with this one (ParameterServerStrategy(resolver, partitioner, optimizer)), or call compile(loss)",
            pss::InvalidArgumentError);
        CHECK(model.loss() == nullptr);
        CHECK_NOTHROW(model.compile(pss::SGD(0.01), pss::MeanSquaredError()));
        CHECK(model.loss()->name() == "mean_squared_error");
    }

    TEST_CASE("Sequential: kernel [[2]], bias [1] predicts [[3], [5], [7], [9]] for x = [1, 2, 3, 4] and evaluates MSE 1 against 2x") {
        pss::ParameterServerStrategy<> strategy;
        pss::Sequential model(strategy);
        model.add(pss::Dense(1, "linear"));
        model.build({1});
        model.set_weights({column_f({2.0f}), xt::xarray<float>{1.0f}});
        const auto x = column_f({1, 2, 3, 4});
        const auto p = model.predict(x, 3);  // two batches: 3 + 1
        CHECK(p == column_f({3, 5, 7, 9}));
        model.compile("mse");
        CHECK(model.evaluate(x, column_f({2, 4, 6, 8}), 3) == 1.0);
    }

    TEST_CASE("Sequential::fit: verbose output to a stream (not a terminal) is `Epoch 1/2` then `1/1 - loss: 1.000000`") {
        pss::ParameterServerStrategy<> strategy;
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.build({1});
        model.set_weights({column_f({2.0f}), xt::xarray<float>{1.0f}});
        model.compile(pss::SGD(), pss::MeanSquaredError());
        std::ostringstream out;
        const auto history = model.fit(column_f({1, 2, 3, 4}), column_f({2, 4, 6, 8}), 2, 32, false, true, out);
        std::ostringstream expected;
        expected << "Epoch 1/2\n1/1 - loss: 1.000000\nEpoch 2/2\n1/1 - loss: " << std::fixed << std::setprecision(6)
                 << history.loss[1] << "\n";
        CHECK(out.str() == expected.str());
        CHECK(history.loss[1] < 1.0);
    }

    TEST_CASE("Sequential::fit: on a terminal, Keras' progress bar with the ETA and the time per step, and at the end "
              "the epoch's time; Keras' time formats") {
        std::ostringstream out;
        pss::detail::ProgressLine progress(out, /*verbose=*/1, /*terminal=*/true, 4);
        progress.update(0, {{"loss", 0.0}});
        progress.update(2, {{"loss", 0.5}, {"auc", 0.75}});
        progress.finish({{"loss", 0.25}, {"auc", 0.875}, {"val_loss", 0.0002}});
        std::vector<std::string> draws;
        std::istringstream text(out.str());
        for (std::string draw; std::getline(text, draw, '\r');) draws.push_back(draw);
        REQUIRE(draws.size() == 4);  // before the first \r, then three draws
        CHECK(draws[0].empty());
        CHECK(draws[1] == "0/4 [..............................] - ETA: ? - loss: 0.0000e+00");
        CHECK(draws[2].starts_with("2/4 [==============>...............] - ETA: 0s - loss: 0.5000 - auc: 0.7500 - "));
        CHECK(draws[2].ends_with("/step"));
        CHECK(draws[3].starts_with("4/4 [==============================] - 0s "));
        std::string last = draws[3];
        REQUIRE(last.ends_with("\n"));
        last.pop_back();
        CHECK(last.ends_with("/step - loss: 0.2500 - auc: 0.8750 - val_loss: 2.0000e-04"));
        // A shorter draw than the one before ends in spaces that wipe the rest of it.
        std::ostringstream wiped;
        pss::detail::ProgressLine shorter(wiped, 1, true, 4);
        shorter.update(1, {{"loss", 0.5}, {"auc", 0.75}});
        shorter.update(2, {{"loss", 0.5}});
        const std::string second = wiped.str().substr(wiped.str().rfind('\r') + 1);
        CHECK(second.size() == wiped.str().find('\r', 1) - 1);
        CHECK(second.ends_with("  "));

        // Keras' verbose=2: one line per epoch with its time; verbose=1 off a terminal: no time.
        std::ostringstream plain, timed;
        pss::detail::ProgressLine(plain, 1, false, 4).finish({{"loss", 0.25}, {"val_auc", 0.5}});
        CHECK(plain.str() == "4/4 - loss: 0.250000 - val_auc: 0.500000\n");
        pss::detail::ProgressLine(timed, 2, true, 4).finish({{"loss", 0.25}, {"val_auc", 0.5}});
        CHECK(timed.str().starts_with("4/4 - 0s - loss: 0.2500 - val_auc: 0.5000 - "));
        CHECK(timed.str().find("s/epoch - ") != std::string::npos);
        CHECK(timed.str().ends_with("s/step\n"));
        std::ostringstream silent;
        pss::detail::ProgressLine(silent, 0, true, 4).finish({{"loss", 0.25}});
        CHECK(silent.str().empty());

        using Line = pss::detail::ProgressLine;
        CHECK(Line::per_step(2.4) == "2s/step");
        CHECK(Line::per_step(0.045) == "45ms/step");
        CHECK(Line::per_step(0.000812) == "812us/step");
        CHECK(Line::per(1.5, "epoch") == "2s/epoch");
        CHECK(Line::duration(7.2) == "7s");
        CHECK(Line::duration(125) == "2:05");
        CHECK(Line::duration(3725) == "1:02:05");
    }

    TEST_CASE("Sequential: layers are named dense, dense_1; errors before compile and for mismatched data") {
        pss::ParameterServerStrategy<> strategy;
        pss::Sequential model(strategy, {pss::Dense(2, "relu"), pss::Dense(1)});
        CHECK(model.layers()[0]->name() == "dense");
        CHECK(model.layers()[1]->name() == "dense_1");
        const auto x = column_f({1, 2, 3});
        CHECK_THROWS_WITH_AS(model.fit(x, column_f({1, 2, 3}), 1),
                             "pss: Sequential::fit: the model is not compiled; call compile(loss) or compile(optimizer, "
                             "loss) first",
                             pss::FailedPreconditionError);
        model.compile(pss::MeanSquaredError());
        CHECK_THROWS_WITH_AS(model.fit(x, column_f({1, 2}), 1),
                             "pss: Sequential::fit: x has 3 examples but y has shape (2, 1); give one target row per "
                             "example, batch axis first",
                             pss::InvalidArgumentError);
        CHECK(model.built());  // built from x's shape (1,)
        CHECK(model.get_layer("dense_1").weights().front().name() == "dense_1/kernel:0");
        CHECK(model.weights().size() == 4);
        CHECK_THROWS_WITH_AS(model.set_weights({column_f({1.0f})}),
                             "pss: Sequential::set_weights got 1 arrays, but the model has 4 weights (see weights(); "
                             "build the model first)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_AS(model.add(pss::Dense(1)), pss::FailedPreconditionError);
        CHECK_THROWS_AS((void)model.get_layer("dense_2"), pss::NotFoundError);
    }
}

// ---------------------------------------------------------------------------------------------------
// Keras configs as JSON: a worker process rebuilds layers and losses from serialize(layer) and
// serialize(loss) and binds the layers to the coordinator's variables (detail::layer_from_config,
// Layer::bind); a model is sent to each worker once (pss.keras.Sequential.build) and kept by its id.
// ---------------------------------------------------------------------------------------------------

namespace {

using nlohmann::json;

// Two ps tasks, every variable split in 2 shards: the Embedding's table is sharded.
using ConfigStrategy = pss::ParameterServerStrategy<pss::InProcessTransport, pss::FixedShardsPartitioner, pss::SGD,
                                                    pss::LocalClusterResolver<2, 1>>;

/// Rebuilds `original` from serialize(original) and binds it to the original's variables, as a worker
/// process does; checks the rebuilt layer describes itself identically, and that forward on `x` and
/// backward of `grad_out` give exactly the original's values, gradients and variables.
std::unique_ptr<pss::Layer> check_rebuilt_layer(pss::Layer& original, const xt::xarray<double>& x,
                                                const xt::xarray<double>& grad_out) {
    // Through text, as it crosses the wire.
    const json config = json::parse(pss::serialize(original).dump());
    CAPTURE(config.dump());
    const pss::detail::LayerConfig parsed = pss::detail::parse_layer_config(config);
    REQUIRE(parsed.layer != nullptr);
    CHECK_FALSE(parsed.layer->built());
    CHECK(parsed.input_shape == original.input_shape());
    std::unique_ptr<pss::Layer> rebuilt = pss::detail::layer_from_config(config);
    CHECK_FALSE(rebuilt->built());
    CHECK(rebuilt->class_name() == original.class_name());
    CHECK(rebuilt->name() == original.name());
    CHECK(rebuilt->weights().empty());
    CHECK(rebuilt->bind(original.input_shape(), original.weights()) == original.output_shape());
    CHECK(rebuilt->built());
    CHECK(pss::serialize(*rebuilt) == config);
    const auto w0 = original.weights();
    const auto w1 = rebuilt->weights();
    REQUIRE(w0.size() == w1.size());
    for (std::size_t i = 0; i < w0.size(); ++i) CHECK(w1[i].name() == w0[i].name());

    const xt::xarray<double> y0 = D(original.forward(x));
    const xt::xarray<double> y1 = D(rebuilt->forward(x));
    CHECK(y1.shape() == y0.shape());
    CHECK(y1 == y0);
    const pss::LayerGradients g0 = original.backward(grad_out);
    const pss::LayerGradients g1 = rebuilt->backward(grad_out);
    CHECK(D(g1.inputs) == D(g0.inputs));
    REQUIRE(g1.variables.size() == g0.variables.size());
    for (std::size_t i = 0; i < g0.variables.size(); ++i) {
        CAPTURE(i);
        CHECK(g1.variables[i].variable.name() == g0.variables[i].variable.name());
        CHECK(g1.variables[i].values.shape() == g0.variables[i].values.shape());
        CHECK(D(g1.variables[i].values) == D(g0.variables[i].values));
        CHECK(g1.variables[i].ids == g0.variables[i].ids);
        CHECK(g1.variables[i].sparse == g0.variables[i].sparse);
    }
    return rebuilt;
}

/// Checks that the JSON `text` is rejected by layer_from_config with exactly `message`.
void check_bad_layer_config(const std::string& text, const std::string& message) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS((void)pss::detail::layer_from_config(json::parse(text)), message.c_str(), pss::InvalidArgumentError);
}

}  // namespace

namespace {

using AsyncTwoWorkers = pss::ParameterServerStrategy<>;

/// x = 1..n as a column, y = 2x: the data of the by-hand fits.
std::pair<xt::xarray<float>, xt::xarray<float>> line_data(std::size_t n) {
    std::vector<float> xs, ys;
    for (std::size_t i = 1; i <= n; ++i) {
        xs.push_back(static_cast<float>(i));
        ys.push_back(2.0f * static_cast<float>(i));
    }
    return {column_f(xs), column_f(ys)};
}

float scalar(const pss::Tensor& t) { return t.get<float>().data()[0]; }

/// Binary data for the metric tests: 64 examples of 2 features, labels from a fixed rule with noise.
std::pair<xt::xarray<float>, xt::xarray<float>> binary_data() {
    xt::xarray<float> x = xt::xarray<float>::from_shape({64, 2});
    xt::xarray<float> y = xt::xarray<float>::from_shape({64, 1});
    for (std::size_t i = 0; i < 64; ++i) {
        x(i, 0) = static_cast<float>(i % 8) / 4.0f - 1.0f;
        x(i, 1) = static_cast<float>(i / 8) / 4.0f - 1.0f;
        y(i, 0) = (x(i, 0) + 0.5f * x(i, 1) > 0.1f) != (i % 7 == 0) ? 1.0f : 0.0f;
    }
    return {x, y};
}

/// A ModelBase whose weights are one number, for driving callbacks by hand.
class FakeModel final : public pss::ModelBase {
public:
    [[nodiscard]] std::vector<pss::Tensor> get_weights() const override { return {xt::xarray<float>{value}}; }
    void set_weights(const std::vector<pss::Tensor>& values) override {
        value = values.at(0).get<float>().data()[0];
        ++assigned;
    }
    void save_weights(const std::string& path) const override { saved.push_back(path); }
    [[nodiscard]] pss::LearningRate learning_rate() const override { return rate; }
    void set_learning_rate(double r) override { rate = r; }
    pss::LearningRate rate = 0.1;
    float value = 0;
    int assigned = 0;
    mutable std::vector<std::string> saved;
};

}  // namespace

TEST_SUITE("keras/fit") {
    TEST_CASE("Sequential::fit: the lines of verbose 1 and 2 leave the stream's precision and flags as they were (0.359197 printed after fit is still 0.359197)") {
        for (int verbose : {1, 2}) {
            CAPTURE(verbose);
            pss::ParameterServerStrategy<> strategy;
            pss::Sequential model(strategy, {pss::Dense(1)});
            model.compile("mse");
            const auto [x, y] = line_data(4);
            std::ostringstream out;
            out << std::setprecision(3);
            const auto flags = out.flags();
            (void)model.fit(x, y, {.epochs = 1, .verbose = verbose, .out = &out});
            CHECK(out.precision() == 3);
            CHECK(out.flags() == flags);
            out.str("");
            out << 0.359197;
            CHECK(out.str() == "0.359");
        }
    }

    TEST_CASE("Dropout in a Sequential model: fit trains through it; evaluate and predict do not drop") {
        // A rate at which x up to 16 cannot diverge: at 0.05, whichever order the 2 workers' steps took,
        // a run could reach an infinite gradient (the ps refused it once in CI, clang build).
        pss::ParameterServerStrategy<> strategy(pss::LocalClusterResolver<2, 2>{}, pss::NoPartitioner{}, pss::SGD(0.001));
        pss::Sequential model(strategy, {pss::Dense(8, "relu"), pss::Dropout(0.5), pss::Dense(1)}, 5);
        model.compile("mse");
        const auto [x, y] = line_data(16);
        const auto history = model.fit(x, y, {.batch_size = 4, .epochs = 3, .verbose = 0});
        CHECK(history.loss.size() == 3);
        CHECK(std::isfinite(history.loss.back()));
        CHECK(model.evaluate(x, y, 4) == model.evaluate(x, y, 4));
        CHECK(model.predict(x) == model.predict(x));
    }

    TEST_CASE("fit: a learning-rate schedule on the ps follows fit's steps (Keras' iterations) across fit calls; "
              "a LearningRateScheduler sets each epoch's rate on the ps") {
        // One worker: the steps run in order. Rate 0.1 at iterations 0 and 1 (0.1 * 0^floor(i / 2)), then 0.
        using One = pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::SGD,
                                                 pss::LocalClusterResolver<1, 1>>;
        const auto [x, y] = line_data(4);
        const xt::xarray<float> x2 = xt::view(x, xt::range(0, 2)), y2 = xt::view(y, xt::range(0, 2));
        One scheduled({}, {}, pss::SGD(pss::ExponentialDecay(0.1, 2, 0.0, true)));
        One constant({}, {}, pss::SGD(0.1));
        pss::Sequential a(scheduled, {pss::Dense(1)}, 3), b(constant, {pss::Dense(1)}, 3);
        a.compile("mse");
        b.compile("mse");
        const pss::FitOptions in_order{.batch_size = 1, .epochs = 1, .verbose = 0, .shuffle = false};
        (void)a.fit(x, y, in_order);    // 4 steps, 2 of them at 0.1
        (void)b.fit(x2, y2, in_order);  // the same 2 steps at 0.1
        const auto trained = b.get_weights();
        CHECK(a.get_weights()[0].get<float>() == trained[0].get<float>());
        CHECK(a.get_weights()[1].get<float>() == trained[1].get<float>());
        CHECK_FALSE(trained[1].get<float>()(0) == 0.0f);
        (void)a.fit(x, y, in_order);  // steps 5 to 8: rate 0 (a schedule that restarted would train again)
        CHECK(a.get_weights()[0].get<float>() == trained[0].get<float>());
        CHECK(a.get_weights()[1].get<float>() == trained[1].get<float>());

        // A LearningRateScheduler: 0.1 in epoch 0, then 0: three epochs train as one.
        One first({}, {}, pss::SGD(0.1)), second({}, {}, pss::SGD(0.1));
        pss::Sequential c(first, {pss::Dense(1)}, 3), d(second, {pss::Dense(1)}, 3);
        c.compile("mse");
        d.compile("mse");
        pss::LearningRateScheduler stop_after_one([](int epoch, double rate) { return epoch == 0 ? rate : 0.0; });
        (void)c.fit(x, y, {.batch_size = 2, .epochs = 3, .verbose = 0, .callbacks = {stop_after_one}, .shuffle = false});
        (void)d.fit(x, y, {.batch_size = 2, .epochs = 1, .verbose = 0, .shuffle = false});
        CHECK(c.get_weights()[0].get<float>() == d.get_weights()[0].get<float>());
        CHECK(c.get_weights()[1].get<float>() == d.get_weights()[1].get<float>());
        CHECK(c.learning_rate() == 0.0);
        CHECK(first.learning_rate() == 0.0);
        CHECK(d.learning_rate() == 0.1);
    }

    TEST_CASE("fit: sample_weight [1, 0, 2, 0] gives loss 0.75 and moves kernel 2 -> 1.65, bias 1 -> 0.85 (the weighted gradient by hand); class_weight is the same weights") {
        const auto [x, y] = line_data(4);
        pss::ParameterServerStrategy<> strategy(pss::LocalClusterResolver<2, 2>{}, pss::NoPartitioner{}, pss::SGD(0.1));
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.build({1});
        model.set_weights({column_f({2.0f}), xt::xarray<float>{1.0f}});
        model.compile("mse");
        // Predictions 3, 5, 7, 9 against 2, 4, 6, 8: every error is 1, every example's loss 1. The loss is
        // (1 + 0 + 2 + 0) / 4; d/dp_i = 2 w_i / 4, so d/dk = 0.5 * 1 + 1 * 3 = 3.5 and d/db = 1.5.
        const auto history = model.fit(x, y, {.epochs = 1, .verbose = 0, .sample_weight = {1, 0, 2, 0}});
        CHECK(history.loss == std::vector<double>{0.75});
        const auto w = model.get_weights();
        CHECK(close_relative(scalar(w[0]), 1.65, 1e-6));
        CHECK(close_relative(scalar(w[1]), 0.85, 1e-6));
        // Now predictions 2.5, 4.15, 5.8, 7.45: squared errors 0.25, 0.0225, 0.04, 0.3025, weighted (0.25 + 0.08) / 4.
        CHECK(model.evaluate(x, y, pss::EvaluateOptions{.sample_weight = {1, 0, 2, 0}}).at("loss") ==
              doctest::Approx(0.0825).epsilon(1e-5));

        // class_weight {1: 3} on targets that are class ids is sample_weight 3 where y is 1: the same bits.
        const xt::xarray<float> ids = column_f({1, 0, 1, 1, 0, 0});
        const xt::xarray<float> xs = column_f({0.5f, -1, 2, 1.5f, 0, -0.5f});
        std::vector<std::vector<pss::Tensor>> results;
        for (int run = 0; run < 2; ++run) {
            pss::Sequential m(strategy, {pss::Dense(1)});
            m.build({1});
            m.set_weights({column_f({0.3f}), xt::xarray<float>{0.1f}});
            m.compile("mse");
            pss::FitOptions options{.epochs = 3, .verbose = 0};
            if (run == 0) options.class_weight = {{1, 3.0}};
            else options.sample_weight = {3, 1, 3, 3, 1, 1};
            (void)m.fit(xs, ids, options);
            results.push_back(m.get_weights());
        }
        CHECK(results[0][0].get<float>() == results[1][0].get<float>());
        CHECK(results[0][1].get<float>() == results[1][1].get<float>());
        CHECK_FALSE(scalar(results[0][0]) == 0.3f);
        // A validation split keeps its sample weights and not the class weights (Keras'): val_loss is the
        // last 2 rows' loss weighted 5 and 1, whatever class_weight says.
        pss::Sequential split(strategy, {pss::Dense(1)});
        split.compile("mse");
        const auto weighted = split.fit(xs, ids, {.verbose = 0, .validation_split = 0.3, .class_weight = {{0, 7.0}},
                                                  .sample_weight = {1, 1, 1, 1, 5, 1}});
        CHECK(weighted.history.at("val_loss").back() ==
              split.evaluate(column_f({0, -0.5f}), column_f({0, 0}), pss::EvaluateOptions{.sample_weight = {5, 1}}).at("loss"));

        CHECK_THROWS_WITH_AS((void)model.fit(x, y, {.verbose = 0, .sample_weight = {1, 2}}),
                             "pss: Sequential::fit: sample_weight has 2 weights for 4 examples; give one weight per example",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)model.fit(x, y, {.verbose = 0, .sample_weight = {1, -2, 1, 1}}),
                             "pss: Sequential::fit: a sample weight is -2.000000; weights are finite and not negative",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("fit: validation_split 0.2 of 10 examples trains on the first 8 (2 batches of 4) and val_loss is evaluate on the last 2; validation_data likewise") {
        const auto [x, y] = line_data(10);
        pss::ParameterServerStrategy<> strategy(pss::LocalClusterResolver<2, 2>{}, pss::NoPartitioner{}, pss::SGD(0.001));
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.compile("mse", {"mae"});
        std::vector<std::size_t> batches;
        pss::LambdaCallback count;
        count.on_batch_end_fn = [&](std::size_t b, const pss::Logs&) { batches.push_back(b); };
        const auto history = model.fit(x, y, {.batch_size = 4, .epochs = 2, .verbose = 0, .callbacks = {count},
                                              .validation_split = 0.2});
        CHECK(batches == std::vector<std::size_t>{0, 1, 0, 1});
        std::vector<std::string> names;
        for (const auto& [name, values] : history.history) {
            names.push_back(name);
            CHECK(values.size() == 2);
        }
        CHECK(names == std::vector<std::string>{"loss", "mean_absolute_error", "val_loss", "val_mean_absolute_error"});
        const xt::xarray<float> x_val = column_f({9, 10}), y_val = column_f({18, 20});
        const pss::Logs held_out = model.evaluate(x_val, y_val, pss::EvaluateOptions{});
        CHECK(history.history.at("val_loss").back() == held_out.at("loss"));
        CHECK(history.history.at("val_mean_absolute_error").back() == held_out.at("mean_absolute_error"));
        CHECK(history.loss == history.history.at("loss"));

        const auto with_data = model.fit(x, y, {.batch_size = 4, .verbose = 0,
                                                .validation_data = pss::ValidationData{x_val, y_val, {}}});
        CHECK(with_data.history.at("val_loss").back() == model.evaluate(x_val, y_val, 4));

        CHECK_THROWS_WITH_AS((void)model.fit(x, y, {.verbose = 0, .validation_split = 0.95}),
                             "pss: Sequential::fit: validation_split 0.950000 of 10 examples leaves 0 to train on and 10 "
                             "to validate on; each needs at least one",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)model.fit(x, y, {.verbose = 0, .validation_split = 1}),
                             "pss: Sequential::fit: validation_split is 1.000000; it is in [0, 1)", pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)model.fit(x, y, {.verbose = 0, .validation_data = pss::ValidationData{x_val, column_f({1}), {}}}),
                        pss::InvalidArgumentError);
    }

    TEST_CASE("fit and evaluate: accuracy and AUC computed by 2 workers over 8 batches equal the metrics of predict's outputs (the weights do not move at learning rate 0)") {
        const auto [x, y] = binary_data();
        pss::ParameterServerStrategy<> strategy(pss::LocalClusterResolver<2, 2>{}, pss::NoPartitioner{}, pss::SGD(0.0));
        pss::Sequential model(strategy, {pss::Dense(1, "sigmoid")}, 3);
        model.compile("binary_crossentropy", {"accuracy", pss::metrics::AUC(), pss::metrics::Precision()});
        model.build({2});
        const xt::xarray<float> kernel = column_f({2.0f, 1.0f});
        model.set_weights({kernel, xt::xarray<float>{-0.2f}});
        const auto history = model.fit(x, y, {.batch_size = 8, .epochs = 2, .verbose = 0});
        const xt::xarray<float> p = model.predict(x);
        double correct = 0;
        for (std::size_t i = 0; i < 64; ++i) correct += ((p(i, 0) > 0.5f) == (y(i, 0) == 1.0f)) ? 1 : 0;
        pss::metrics::AUC auc;
        auc.update_state(y, p);
        pss::metrics::Precision precision;
        precision.update_state(y, p);
        for (std::size_t e = 0; e < 2; ++e) {
            CHECK(history.history.at("accuracy")[e] == correct / 64);
            CHECK(history.history.at("auc")[e] == doctest::Approx(auc.result()).epsilon(1e-12));
            CHECK(history.history.at("precision")[e] == doctest::Approx(precision.result()).epsilon(1e-12));
        }
        CHECK(correct > 40);
        CHECK(auc.result() > 0.7);
        const pss::Logs logs = model.evaluate(x, y, pss::EvaluateOptions{.batch_size = 5});
        CHECK(logs.names() == "loss, accuracy, auc, precision");
        CHECK(logs.at("accuracy") == correct / 64);
        CHECK(logs.at("auc") == doctest::Approx(auc.result()).epsilon(1e-12));
        CHECK(logs.at("loss") == doctest::Approx(history.loss.back()).epsilon(1e-6));
        CHECK_THROWS_WITH_AS((void)logs.at("f1"), "pss: logs have no 'f1'; they have: loss, accuracy, auc, precision",
                             pss::NotFoundError);

        // "accuracy" for class probabilities is the sparse categorical one.
        pss::Sequential softmax(strategy, {pss::Dense(3, "softmax")}, 5);
        softmax.compile("sparse_categorical_crossentropy", {"accuracy"});
        const xt::xarray<float> ids = column_f({0, 1, 2, 1, 0, 2, 2, 1});
        const xt::xarray<float> features = xt::xarray<float>{{1, 0}, {0, 1}, {1, 1}, {0.5f, 2}, {2, 0.1f}, {-1, 1}, {0, -1}, {1, -1}};
        const xt::xarray<float> probs = softmax.predict(features);
        double hits = 0;
        for (std::size_t i = 0; i < 8; ++i) {
            std::size_t best = 0;
            for (std::size_t j = 1; j < 3; ++j)
                if (probs(i, j) > probs(i, best)) best = j;
            hits += static_cast<float>(best) == ids(i, 0) ? 1 : 0;
        }
        CHECK(softmax.evaluate(features, ids, pss::EvaluateOptions{}).at("accuracy") == hits / 8);

        pss::Sequential twice(strategy, {pss::Dense(1)});
        twice.compile("mse", {"mae", "mean_absolute_error"});
        CHECK_THROWS_WITH_AS((void)twice.fit(x, y, {.verbose = 0}),
                             "pss: Sequential::compile: two metrics are named 'mean_absolute_error' (or one is named "
                             "'loss'); name them apart",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("fit: callbacks are called in Keras' order with the epoch's logs; params give epochs and steps; initial_epoch and steps_per_epoch") {
        const auto [x, y] = line_data(12);
        pss::ParameterServerStrategy<> strategy(pss::LocalClusterResolver<2, 2>{}, pss::NoPartitioner{}, pss::SGD(0.001));
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.compile("mse", {"mae"});
        std::vector<std::string> events;
        std::vector<pss::Logs> epoch_logs;
        pss::LambdaCallback record;
        record.on_train_begin_fn = [&](const pss::Logs&) {
            events.push_back("train_begin " + std::to_string(record.params().epochs) + " " +
                             std::to_string(record.params().steps));
        };
        record.on_epoch_begin_fn = [&](int e, const pss::Logs&) { events.push_back("epoch_begin " + std::to_string(e)); };
        record.on_batch_end_fn = [&](std::size_t b, const pss::Logs& logs) {
            events.push_back("batch_end " + std::to_string(b) + " " + logs.names());
        };
        record.on_epoch_end_fn = [&](int e, const pss::Logs& logs) {
            events.push_back("epoch_end " + std::to_string(e) + " " + logs.names());
            epoch_logs.push_back(logs);
        };
        record.on_train_end_fn = [&](const pss::Logs& logs) { events.push_back("train_end " + logs.names()); };
        std::ostringstream out;
        const auto history = model.fit(x, y, {.batch_size = 3, .epochs = 3, .verbose = 1, .callbacks = {record},
                                              .validation_split = 0.25, .initial_epoch = 1, .steps_per_epoch = 2,
                                              .out = &out});
        CHECK(events == std::vector<std::string>{
                            "train_begin 3 2", "epoch_begin 1", "batch_end 0 loss, mean_absolute_error",
                            "batch_end 1 loss, mean_absolute_error",
                            "epoch_end 1 loss, mean_absolute_error, val_loss, val_mean_absolute_error", "epoch_begin 2",
                            "batch_end 0 loss, mean_absolute_error", "batch_end 1 loss, mean_absolute_error",
                            "epoch_end 2 loss, mean_absolute_error, val_loss, val_mean_absolute_error",
                            "train_end loss, mean_absolute_error, val_loss, val_mean_absolute_error"});
        CHECK(history.epoch == std::vector<int>{1, 2});
        REQUIRE(epoch_logs.size() == 2);
        for (std::size_t e = 0; e < 2; ++e)
            for (const auto& [name, value] : epoch_logs[e]) CHECK(history.history.at(name)[e] == value);
        // Untimed lines off a terminal: the same text in every run.
        std::ostringstream expected;
        expected << std::fixed << std::setprecision(6);
        for (std::size_t e = 0; e < 2; ++e) {
            expected << "Epoch " << e + 2 << "/3\n2/2";
            for (const auto& [name, value] : epoch_logs[e]) expected << " - " << name << ": " << value;
            expected << "\n";
        }
        CHECK(out.str() == expected.str());

        std::ostringstream timed;
        (void)model.fit(x, y, {.epochs = 1, .verbose = 2, .out = &timed});
        CHECK(timed.str().starts_with("Epoch 1/1\n1/1 - "));
        CHECK(timed.str().find("s - loss: ") != std::string::npos);
        CHECK(timed.str().find(" - mean_absolute_error: ") != std::string::npos);
        CHECK(timed.str().ends_with("s/step\n"));
        // The default, Keras' "auto": the bar on a terminal, and elsewhere verbose 2's line with its time.
        std::ostringstream automatic;
        (void)model.fit(x, y, {.epochs = 1, .out = &automatic});
        CHECK(automatic.str().starts_with("Epoch 1/1\n1/1 - "));
        CHECK(automatic.str().find("s - loss: ") != std::string::npos);
        CHECK(automatic.str().ends_with("s/step\n"));

        CHECK_THROWS_WITH_AS((void)model.fit(x, y, {.batch_size = 3, .verbose = 0, .steps_per_epoch = 5}),
                             "pss: Sequential::fit: steps_per_epoch is 5, but 12 examples make 4 batches of 3",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)model.fit(x, y, {.verbose = 3}),
                             "pss: Sequential::fit: verbose is 3; it is FitOptions::verbose_auto (-1: 1 on a terminal, "
                             "else 2), 0 (silent), 1 (a progress bar) or 2 (one line per epoch)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)model.fit(x, y, {.verbose = 0, .initial_epoch = -1}),
                             "pss: Sequential::fit: initial_epoch is -1; it must be 0 or more", pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)model.fit(x, y, {.verbose = 0, .callbacks = {pss::BackupAndRestore("a"), pss::BackupAndRestore("b")}}),
                             "pss: Sequential::fit: two BackupAndRestore callbacks (a and b); give one",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("LearningRateScheduler by hand: the rate of each epoch from schedule(epoch, rate), Keras' line; "
              "refused over an optimizer's schedule and for a negative rate") {
        FakeModel model;
        std::ostringstream out;
        pss::LearningRateScheduler halve([](int epoch, double rate) { return epoch < 1 ? rate : rate / 2; }, 1, &out);
        halve.set_model(model);
        halve.on_epoch_begin(0, {});
        CHECK(model.rate == 0.1);
        halve.on_epoch_begin(1, {});
        CHECK(model.rate == 0.05);
        halve.on_epoch_begin(2, {});
        CHECK(model.rate == 0.025);
        CHECK(out.str() == "\nEpoch 1: LearningRateScheduler setting learning rate to 0.1.\n"
                           "\nEpoch 2: LearningRateScheduler setting learning rate to 0.05.\n"
                           "\nEpoch 3: LearningRateScheduler setting learning rate to 0.025.\n");
        pss::LearningRateScheduler negative([](int, double) { return -1.0; });
        negative.set_model(model);
        CHECK_THROWS_WITH_AS(negative.on_epoch_begin(4, {}),
                             "pss: LearningRateScheduler: the schedule gave -1 for epoch 4; a learning rate must be a "
                             "finite number >= 0",
                             pss::InvalidArgumentError);
        CHECK(model.rate == 0.025);
        model.rate = pss::ExponentialDecay(0.1, 10, 0.5);
        CHECK_THROWS_WITH_AS(halve.on_epoch_begin(3, {}),
                             "pss: LearningRateScheduler: the optimizer's learning rate is a schedule (ExponentialDecay), "
                             "which sets the rate of each step; give the optimizer a constant rate to schedule it per "
                             "epoch (Keras refuses this too)",
                             pss::FailedPreconditionError);
        CHECK_THROWS_AS((void)pss::LearningRateScheduler(nullptr), pss::InvalidArgumentError);
    }

    TEST_CASE("EarlyStopping by hand: patience 2 over val_loss 1, 0.8, 0.9, 0.85, ... stops at epoch 3 and restores epoch 1's weights; Keras' baseline, min_delta, mode and start_from_epoch") {
        auto run = [](pss::EarlyStopping& early, const std::vector<double>& values, FakeModel& model) {
            early.set_model(model);
            model.stop_training = false;
            early.on_train_begin({});
            int epoch = 0;
            for (; epoch < static_cast<int>(values.size()) && !model.stop_training; ++epoch) {
                model.value = static_cast<float>(epoch);  // the weights at the end of `epoch`
                early.on_epoch_end(epoch, {{"loss", 0}, {"val_loss", values[static_cast<std::size_t>(epoch)]}});
            }
            early.on_train_end({});
            return epoch;  // epochs run
        };
        FakeModel model;
        pss::EarlyStopping early({.patience = 2, .restore_best_weights = true});
        CHECK(run(early, {1.0, 0.8, 0.9, 0.85, 0.7, 0.6}, model) == 4);
        CHECK(early.stopped_epoch == 3);
        CHECK(early.best_epoch == 1);
        CHECK(early.best == 0.8);
        CHECK(model.value == 1.0f);  // epoch 1's weights, restored
        CHECK(model.assigned == 1);

        FakeModel plain;
        pss::EarlyStopping no_restore({.patience = 2});
        CHECK(run(no_restore, {1.0, 0.8, 0.9, 0.85, 0.7}, plain) == 4);
        CHECK(plain.assigned == 0);
        CHECK(plain.value == 3.0f);

        // min_delta 0.15: 0.8 is not an improvement on 0.9 by more than 0.15; patience 0 stops at once.
        pss::EarlyStopping delta({.min_delta = 0.15});
        CHECK(run(delta, {0.9, 0.8, 0.5}, plain) == 2);
        CHECK(delta.stopped_epoch == 1);
        // A baseline not reached keeps counting over improvements: stops at epoch 2 of patience 2 (without
        // the baseline the wait restarts at each improvement, and it runs on).
        pss::EarlyStopping baseline({.patience = 2, .baseline = 0.5});
        CHECK(run(baseline, {0.9, 0.8, 0.85, 0.7}, plain) == 3);
        CHECK(baseline.stopped_epoch == 2);
        pss::EarlyStopping no_baseline({.patience = 2});
        CHECK(run(no_baseline, {0.9, 0.8, 0.85, 0.7}, plain) == 4);
        // "max" (and auto for accuracies): larger is better.
        pss::EarlyStopping larger({.patience = 1, .mode = "max"});
        CHECK(run(larger, {0.5, 0.6, 0.55, 0.7}, plain) == 3);
        // start_from_epoch 2: epochs 0 and 1 are not looked at.
        pss::EarlyStopping late({.start_from_epoch = 2});
        CHECK(run(late, {0.1, 0.9, 0.8, 0.85}, plain) == 4);
        CHECK(late.stopped_epoch == 3);

        pss::EarlyStopping missing({.monitor = "val_auc"});
        missing.set_model(plain);
        missing.on_train_begin({});
        CHECK_THROWS_WITH_AS(missing.on_epoch_end(0, {{"loss", 1}, {"auc", 0.5}}),
                             "pss: EarlyStopping: it monitors 'val_auc', which the epoch's logs do not have; they have: "
                             "loss, auc (val_ values need validation_split or validation_data)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::EarlyStopping({.monitor = "loss", .mode = "lowest"}),
                             "pss: EarlyStopping: mode is \"lowest\"; it is \"auto\", \"min\" or \"max\"",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::TerminateOnNaN().model(),
                             doctest::Contains("the callback is not attached to a model"), pss::FailedPreconditionError);
    }

    TEST_CASE("fit with EarlyStopping(loss, patience 1, restore_best_weights): a diverging fit stops at epoch 1 with epoch 0's weights on the ps") {
        const auto [x, y] = line_data(4);
        // Learning rate 0.5 against a curvature of 2 mean(x^2) = 15: each step multiplies the error by -6.5.
        pss::ParameterServerStrategy<> strategy(pss::LocalClusterResolver<2, 2>{}, pss::NoPartitioner{}, pss::SGD(0.5));
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.build({1});
        model.set_weights({column_f({0.5f}), xt::xarray<float>{0.0f}});
        model.compile("mse");
        std::vector<std::vector<pss::Tensor>> at_epoch_end;
        pss::LambdaCallback record;
        record.on_epoch_end_fn = [&](int, const pss::Logs&) { at_epoch_end.push_back(model.get_weights()); };
        pss::EarlyStopping early({.monitor = "loss", .patience = 1, .restore_best_weights = true});
        const auto history = model.fit(x, y, {.epochs = 10, .verbose = 0, .callbacks = {record, early}});
        CHECK(history.epoch == std::vector<int>{0, 1});
        CHECK(history.loss[1] > 10 * history.loss[0]);
        CHECK(early.stopped_epoch == 1);
        REQUIRE(at_epoch_end.size() == 2);
        const auto now = model.get_weights();
        CHECK(now[0].get<float>() == at_epoch_end[0][0].get<float>());
        CHECK(now[1].get<float>() == at_epoch_end[0][1].get<float>());
        CHECK_FALSE(now[0].get<float>() == at_epoch_end[1][0].get<float>());
    }

    TEST_CASE("ModelCheckpoint: weights.{epoch:02d}-{loss:.2f} saves w.01-16.88, w.02-..., each loads back as that epoch's weights; save_best_only on a diverging fit saves once") {
        const auto [x, y] = line_data(4);
        const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                          ("pss_model_checkpoint_" + std::to_string(::getpid()));
        std::filesystem::remove_all(dir);
        pss::ParameterServerStrategy<> strategy;  // SGD(0.01)
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.build({1});
        model.set_weights({column_f({0.5f}), xt::xarray<float>{0.0f}});
        model.compile("mse");
        std::vector<std::vector<pss::Tensor>> at_epoch_end;
        pss::LambdaCallback record;
        record.on_epoch_end_fn = [&](int, const pss::Logs&) { at_epoch_end.push_back(model.get_weights()); };
        pss::ModelCheckpoint checkpoint((dir / "w.{epoch:02d}-{loss:.2f}").string(), {.monitor = "loss"});
        const auto history = model.fit(x, y, {.epochs = 3, .verbose = 0, .callbacks = {record, checkpoint}});
        REQUIRE(checkpoint.saved.size() == 3);
        CHECK(checkpoint.saved[0] == (dir / "w.01-16.88").string());  // mean((0.5x - 2x)^2) = 16.875
        char second[32];
        std::snprintf(second, sizeof second, "w.02-%.2f", history.loss[1]);
        CHECK(checkpoint.saved[1] == (dir / second).string());
        for (std::size_t e = 0; e < 3; ++e) CHECK(std::filesystem::is_directory(checkpoint.saved[e]));
        model.load_weights(checkpoint.saved[1]);
        CHECK(model.get_weights()[0].get<float>() == at_epoch_end[1][0].get<float>());
        CHECK(model.get_weights()[1].get<float>() == at_epoch_end[1][1].get<float>());

        pss::ParameterServerStrategy<> fast(pss::LocalClusterResolver<2, 2>{}, pss::NoPartitioner{}, pss::SGD(0.5));
        pss::Sequential diverging(fast, {pss::Dense(1)});
        diverging.compile("mse");
        pss::ModelCheckpoint best((dir / "best").string(), {.monitor = "loss", .save_best_only = true});
        (void)diverging.fit(x, y, {.epochs = 3, .verbose = 0, .callbacks = {best}});
        CHECK(best.saved == std::vector<std::string>{(dir / "best").string()});

        CHECK(pss::detail::format_path("a{{b}}/{epoch}-{loss:.3e}-{epoch:03d}", 7, {{"loss", 0.5}}) ==
              "a{b}/7-5.000e-01-007");
        CHECK_THROWS_WITH_AS((void)pss::detail::format_path("w-{val_loss:.2f}", 1, {{"loss", 0.5}}),
                             "pss: ModelCheckpoint: the filepath \"w-{val_loss:.2f}\" names {val_loss}, which is neither "
                             "epoch nor in the logs: loss",
                             pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)pss::detail::format_path("w-{loss:>8}", 1, {{"loss", 0.5}}), pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)pss::detail::format_path("w-{loss", 1, {{"loss", 0.5}}), pss::InvalidArgumentError);
        std::filesystem::remove_all(dir);
    }

    TEST_CASE("CSVLogger writes epoch then the sorted names, values as Python prints them; append keeps the header; TerminateOnNaN stops at a NaN loss") {
        CHECK(pss::detail::python_repr(0.1) == "0.1");
        CHECK(pss::detail::python_repr(1.0) == "1.0");
        CHECK(pss::detail::python_repr(-0.0) == "-0.0");
        CHECK(pss::detail::python_repr(1e-05) == "1e-05");
        CHECK(pss::detail::python_repr(0.0001) == "0.0001");
        CHECK(pss::detail::python_repr(1e16) == "1e+16");
        CHECK(pss::detail::python_repr(1e15) == "1000000000000000.0");
        CHECK(pss::detail::python_repr(123.456) == "123.456");
        CHECK(pss::detail::python_repr(1.5e-7) == "1.5e-07");
        CHECK(pss::detail::python_repr(0.1 + 0.2) == "0.30000000000000004");
        CHECK(pss::detail::python_repr(std::nan("")) == "nan");

        const auto [x, y] = line_data(8);
        const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                           ("pss_csv_logger_" + std::to_string(::getpid()) + ".csv");
        pss::ParameterServerStrategy<> strategy;
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.compile("mse", {"mae"});
        const auto history = model.fit(x, y, {.batch_size = 4, .epochs = 2, .verbose = 0,
                                              .callbacks = {pss::CSVLogger(file.string())}, .validation_split = 0.25});
        (void)model.fit(x, y, {.batch_size = 4, .verbose = 0, .callbacks = {pss::CSVLogger(file.string(), ';', true)},
                               .validation_split = 0.25});
        std::ifstream in(file);
        std::vector<std::string> lines;
        for (std::string line; std::getline(in, line);) lines.push_back(line);
        REQUIRE(lines.size() == 4);
        CHECK(lines[0] == "epoch,loss,mean_absolute_error,val_loss,val_mean_absolute_error");
        for (std::size_t e = 0; e < 2; ++e) {
            std::string row = std::to_string(e);
            for (const char* name : {"loss", "mean_absolute_error", "val_loss", "val_mean_absolute_error"})
                row += "," + pss::detail::python_repr(history.history.at(name)[e]);
            CHECK(lines[1 + e] == row);
        }
        CHECK(lines[3].starts_with("0;"));
        std::filesystem::remove(file);

        // The ps refuses non-finite gradients by default (the fit would end with that error): apply them.
        ::setenv("PSS_NON_FINITE_GRADIENTS", "apply", 1);
        pss::ParameterServerStrategy<> applying;
        ::unsetenv("PSS_NON_FINITE_GRADIENTS");
        pss::Sequential nan_model(applying, {pss::Dense(1)});
        nan_model.compile("mse");
        xt::xarray<float> bad = x;
        bad(0, 0) = std::nanf("");
        const auto stopped = nan_model.fit(bad, y, {.batch_size = 8, .epochs = 3, .verbose = 0,
                                                .callbacks = {pss::TerminateOnNaN()}, .shuffle = false});
        CHECK(stopped.epoch == std::vector<int>{0});
        CHECK(std::isnan(stopped.loss[0]));
    }
}

TEST_SUITE("keras/config") {
    TEST_CASE("serialize: Dense(4, relu, no bias, float64) named dense_1 for (3) is {\"class_name\": \"Dense\", \"config\": {... \"units\": 4 ...}}; rebuilt, bound, it computes the same") {
        ConfigStrategy strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        pss::Dense dense(4, "relu", false, pss::DType::float64);
        dense.set_name("dense_1");
        std::mt19937 rng(0);
        {
            auto scope = strategy.scope();
            dense.build({3}, rng);
        }
        CHECK(pss::serialize(dense).dump() ==
              R"({"class_name":"Dense","config":{"activation":"relu","batch_input_shape":[null,3],"bias_initializer":{"class_name":"Zeros","config":{}},"dtype":"float64",)"
              R"("kernel_initializer":{"class_name":"GlorotUniform","config":{"seed":null}},"kernel_regularizer":null,"name":"dense_1","units":4,"use_bias":false}})");
        dense.set_weights({xt::xarray<double>{{1, -2, 0.5, 0}, {0.25, 1, -1, 2}, {-0.5, 0.5, 3, 1}}});
        const xt::xarray<double> x = {{1, 2, -1}, {0.5, -1, 2}};
        const auto rebuilt = check_rebuilt_layer(dense, x, xt::xarray<double>{{1, 2, 3, 4}, {-1, 0.5, 2, 1}});
        // x . kernel = [[2, -0.5, -4.5, 3], [-0.75, 0, 7.25, 0]], then relu.
        CHECK(D(rebuilt->forward(x)) == xt::xarray<double>{{2, 0, 0, 3}, {0, 0, 7.25, 0}});
    }

    TEST_CASE("serialize: Dense(3, sigmoid) for (2, 2) has batch_input_shape [null, 2, 2]; rebuilt, bound, it computes the same") {
        ConfigStrategy strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        pss::Dense dense(3, "sigmoid");
        std::mt19937 rng(0);
        {
            auto scope = strategy.scope();
            dense.build({2, 2}, rng);
        }
        CHECK(dense.get_config() == json{{"name", "dense"}, {"units", 3}, {"activation", "sigmoid"}, {"use_bias", true},
                                         {"kernel_initializer", {{"class_name", "GlorotUniform"}, {"config", {{"seed", nullptr}}}}},
                                         {"bias_initializer", {{"class_name", "Zeros"}, {"config", json::object()}}},
                                         {"kernel_regularizer", nullptr},
                                         {"dtype", "float32"}, {"batch_input_shape", {nullptr, 2, 2}}});
        CHECK(dense.kernel().num_shards() == 2);
        const xt::xarray<double> x = {{{1, 2}, {-1, 0.5}}, {{0, 1}, {2, -2}}};
        const auto rebuilt = check_rebuilt_layer(dense, x, xt::ones<double>({2, 2, 3}));
        // The rebuilt layer reads the variables, not a copy: a new bias shows in its outputs.
        dense.set_weights({xt::xarray<float>(xt::zeros<float>({2, 3})), xt::xarray<float>{0, 0, 0}});
        CHECK(D(rebuilt->forward(x)) == xt::xarray<double>(xt::ones<double>({2, 2, 3}) * 0.5));
    }

    TEST_CASE("serialize: Embedding(5, 4) over 2 shards for (3) is {\"class_name\": \"Embedding\", \"config\": {... \"input_dim\": 5, \"output_dim\": 4 ...}}; rebuilt, bound, same rows and sparse gradients") {
        ConfigStrategy strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        pss::Embedding embedding(5, 4);
        std::mt19937 rng(0);
        {
            auto scope = strategy.scope();
            embedding.build({3}, rng);
        }
        CHECK(embedding.embeddings().num_shards() == 2);
        CHECK(pss::serialize(embedding).dump() ==
              R"({"class_name":"Embedding","config":{"batch_input_shape":[null,3],"dtype":"float32",)"
              R"("embeddings_initializer":{"class_name":"RandomUniform","config":{"maxval":0.05,"minval":-0.05,"seed":null}},)"
              R"("input_dim":5,"name":"embedding","output_dim":4}})");
        const xt::xarray<double> ids = {{0, 4, 2}, {1, 1, 3}};
        xt::xarray<double> grad_out = xt::xarray<double>::from_shape({2, 3, 4});
        for (std::size_t i = 0; i < grad_out.size(); ++i) grad_out.data()[i] = static_cast<double>(i) - 7.5;
        const auto rebuilt = check_rebuilt_layer(embedding, ids, grad_out);
        CHECK(rebuilt->backward(grad_out).variables.front().ids == std::vector<std::int64_t>{0, 4, 2, 1, 1, 3});
        // check_inputs of the rebuilt layer knows input_dim.
        CHECK_THROWS_AS(rebuilt->check_inputs(xt::xarray<float>{{0, 5, 1}}), pss::InvalidArgumentError);
    }

    TEST_CASE("serialize: GlobalAveragePooling1D and Flatten for (3, 2) are {\"class_name\": ..., \"config\": {\"batch_input_shape\": [null, 3, 2], \"name\": ...}}") {
        const xt::xarray<double> x = {{{1, 2}, {3, 4}, {5, 6}}, {{-1, 0}, {2, 2}, {0.5, 1}}};
        std::mt19937 rng(0);
        SUBCASE("GlobalAveragePooling1D") {
            pss::GlobalAveragePooling1D pool;
            pool.build({3, 2}, rng);
            CHECK(pss::serialize(pool).dump() ==
                  R"({"class_name":"GlobalAveragePooling1D","config":{"batch_input_shape":[null,3,2],"name":"global_average_pooling1d"}})");
            const auto rebuilt = check_rebuilt_layer(pool, x, xt::xarray<double>{{1, -2}, {0.5, 3}});
            CHECK(D(rebuilt->forward(x)) == xt::xarray<double>{{3, 4}, {0.5, 1}});
        }
        SUBCASE("Flatten") {
            pss::Flatten flatten;
            flatten.build({3, 2}, rng);
            CHECK(pss::serialize(flatten).dump() ==
                  R"({"class_name":"Flatten","config":{"batch_input_shape":[null,3,2],"name":"flatten"}})");
            const auto rebuilt = check_rebuilt_layer(flatten, x, xt::xarray<double>{{1, 2, 3, 4, 5, 6}, {-1, -2, -3, -4, -5, -6}});
            CHECK(rebuilt->output_shape() == pss::Shape{6});
        }
        SUBCASE("Flatten of a scalar input shape: batch_input_shape [null], output (1)") {
            pss::Flatten flatten;
            flatten.build({}, rng);
            CHECK(flatten.get_config() == json{{"name", "flatten"}, {"batch_input_shape", {nullptr}}});
            const auto parsed = pss::detail::parse_layer_config(pss::serialize(flatten));
            CHECK(parsed.input_shape == pss::Shape{});
            CHECK(parsed.layer->bind(parsed.input_shape, {}) == pss::Shape{1});
        }
        SUBCASE("before build there is no batch_input_shape") {
            CHECK(pss::Flatten().get_config() == json{{"name", ""}});
        }
    }

    TEST_CASE("serialize: the name \"my layer\\\"%\\n\\u00e9\" is a JSON string and reads back exactly") {
        pss::Flatten flatten;
        flatten.set_name("my layer\"%\n\xc3\xa9");
        std::mt19937 rng(0);
        flatten.build({2}, rng);
        const std::string text = pss::serialize(flatten).dump();
        CHECK(text == "{\"class_name\":\"Flatten\",\"config\":{\"batch_input_shape\":[null,2],\"name\":\"my layer\\\"%\\n\xc3\xa9\"}}");
        CHECK(pss::detail::layer_from_config(json::parse(text))->name() == "my layer\"%\n\xc3\xa9");
    }

    TEST_CASE("detail::bind_layer_from_config: a Dense config and its 2 variables give a layer built for (3) with output (2)") {
        pss::Dense dense(2);
        std::mt19937 rng(0);
        dense.build({3}, rng);
        const auto layer = pss::detail::bind_layer_from_config(pss::serialize(dense), dense.weights());
        CHECK(layer->built());
        CHECK(layer->input_shape() == pss::Shape{3});
        CHECK(layer->output_shape() == pss::Shape{2});
        CHECK(layer->get_config() == dense.get_config());
        CHECK_THROWS_AS((void)pss::detail::bind_layer_from_config(pss::serialize(dense), {dense.kernel()}), pss::InvalidArgumentError);
    }

    TEST_CASE("Layer::bind: bind of a built layer throws FailedPreconditionError") {
        pss::Dense dense(2);
        std::mt19937 rng(0);
        dense.build({3}, rng);
        CHECK_THROWS_WITH_AS((void)dense.bind({3}, dense.weights()),
                             "pss: Dense 'dense': bind called on a built layer; a layer is built or bound once",
                             pss::FailedPreconditionError);
    }

    TEST_CASE("activation_name and activation_from_name read one table: each name round-trips; \"\" is linear") {
        for (pss::ActivationFunction a : {pss::ActivationFunction::linear, pss::ActivationFunction::relu, pss::ActivationFunction::sigmoid,
                                  pss::ActivationFunction::tanh, pss::ActivationFunction::softmax})
            CHECK(pss::activation_from_name(pss::activation_name(a)) == a);
        CHECK(pss::activation_from_name("") == pss::ActivationFunction::linear);
        CHECK(pss::activation_name(pss::ActivationFunction::tanh) == "tanh");
    }

    TEST_CASE("Layer::bind: Dense(4) for (3) rejects 1 variable, a (2, 4) kernel, a float64 bias, an empty handle and input shape (0); naming each") {
        std::mt19937 rng(0);
        pss::Dense dense(4);
        dense.build({3}, rng);
        pss::Dense other(4, "linear", true, pss::DType::float64);
        other.set_name("other");
        other.build({2}, rng);
        auto fresh = [] { return pss::Dense(4); };
        CHECK_THROWS_WITH_AS((void)fresh().bind({3}, {dense.kernel()}),
                             "pss: Dense 'dense': bind got 1 variables, but the layer has 2 weights (kernel (3, 4) "
                             "float32, bias (4,) float32), in the order of weights()",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)fresh().bind({3}, {other.kernel(), dense.bias()}),
                             "pss: Dense 'dense': bind: weight 0 (kernel) is 'other/kernel:0' of shape (2, 4), but the "
                             "layer needs (3, 4)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)fresh().bind({3}, {dense.kernel(), other.bias()}),
                             "pss: Dense 'dense': bind: weight 1 (bias) is 'other/bias:0' of dtype float64, but the "
                             "layer's dtype is float32",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)fresh().bind({3}, {dense.kernel(), pss::Variable()}),
                             "pss: Dense 'dense': bind: weight 1 (bias) is an empty Variable handle; give the variables "
                             "of weights()",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)fresh().bind({0}, dense.weights()),
                             "pss: Dense 'dense': input shape (0,); a Dense layer needs inputs with a last axis of at "
                             "least 1 feature",
                             pss::InvalidArgumentError);
        // Swapped order: the bias where the kernel goes.
        CHECK_THROWS_AS((void)fresh().bind({3}, {dense.bias(), dense.kernel()}), pss::InvalidArgumentError);
        // A failed bind leaves the layer unbuilt; a good one then succeeds.
        pss::Dense layer(4);
        CHECK_THROWS_AS((void)layer.bind({3}, {dense.bias(), dense.kernel()}), pss::InvalidArgumentError);
        CHECK_FALSE(layer.built());
        CHECK(layer.bind({3}, dense.weights()) == pss::Shape{4});
    }

    TEST_CASE("Layer::bind: Embedding(5, 4) rejects a (4, 4) table and a float64 one; GlobalAveragePooling1D and Flatten reject any variable") {
        std::mt19937 rng(0);
        pss::Embedding small(4, 4);
        small.build({2}, rng);
        pss::Embedding wide(5, 4, pss::DType::float64);
        wide.build({2}, rng);
        CHECK_THROWS_WITH_AS((void)pss::Embedding(5, 4).bind({2}, small.weights()),
                             "pss: Embedding 'embedding': bind: weight 0 (embeddings) is 'embedding/embeddings:0' of "
                             "shape (4, 4), but the layer needs (5, 4)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::Embedding(5, 4).bind({2}, wide.weights()),
                             "pss: Embedding 'embedding': bind: weight 0 (embeddings) is 'embedding/embeddings:0' of "
                             "dtype float64, but the layer's dtype is float32",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::GlobalAveragePooling1D().bind({3, 2}, small.weights()),
                             "pss: GlobalAveragePooling1D 'global_average_pooling1d': bind got 1 variables, but the layer "
                             "has 0 weights (none), in the order of weights()",
                             pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)pss::GlobalAveragePooling1D().bind({3}, {}), pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)pss::Flatten().bind({3}, small.weights()), pss::InvalidArgumentError);
    }

    TEST_CASE("detail::layer_from_config: a non-object, unknown class, missing, extra or mistyped field, bad numbers throw naming the field and its value") {
        check_bad_layer_config("[]", "pss: layer []: it is array, not an object with class_name and config");
        check_bad_layer_config(R"({"config": {}})",
                               R"(pss: layer {"config":{}}: the field "class_name" is missing; it has class_name and config)");
        check_bad_layer_config(R"({"class_name": "Conv2D", "config": {}})",
                               R"(pss: layer {"class_name":"Conv2D","config":{}}: "class_name" is "Conv2D"; the layers a )"
                               R"(worker rebuilds are "Dense", "Embedding", "GlobalAveragePooling1D", "Flatten", "Dropout", )"
                               R"("Activation", "LayerNormalization", "Concatenate" and "Add"; registered: "TestScale" )"
                               R"(and "Throwing")");  // registered by keras/registry's layers
        check_bad_layer_config(R"({"class_name": 7, "config": {}})",
                               R"(pss: layer {"class_name":7,"config":{}}: "class_name" is 7, not a string)");
        check_bad_layer_config(R"({"class_name": "Flatten", "config": {}, "x": 1})",
                               R"(pss: layer {"class_name":"Flatten","config":{},"x":1}: the field "x" is not known; it )"
                               R"(has class_name and config)");
        check_bad_layer_config(R"({"class_name": "Dense", "config": [1]})",
                               R"(pss: Dense config [1]: it is array, not an object with name, units, activation, )"
                               R"(use_bias, kernel_initializer, bias_initializer, kernel_regularizer, dtype and )"
                               R"(batch_input_shape)");
        // Keys print sorted: "activation", "batch_input_shape", "dtype", "name", "units", "use_bias".
        const std::string before = R"({"activation":"relu","batch_input_shape":[null,3],"dtype":"float32","name":"d")";
        auto dense = [&](const std::string& units, const std::string& more = "") {
            return R"({"class_name":"Dense","config":)" + before + units + R"(,"use_bias":true)" + more + "}}";
        };
        auto message = [&](const std::string& units, const std::string& problem, const std::string& more = "") {
            return "pss: Dense config " + before + units + R"(,"use_bias":true)" + more + "}: " + problem;
        };
        // "units" is read first: these configs need not have the fields read after it.
        check_bad_layer_config(dense(""), message("", "the field \"units\" is missing; it has name, units, activation, "
                                                      "use_bias, kernel_initializer, bias_initializer, kernel_regularizer, "
                                                      "dtype and batch_input_shape"));
        check_bad_layer_config(dense(R"(,"units":"four")"), message(R"(,"units":"four")", R"("units" is "four", not a whole number)"));
        check_bad_layer_config(dense(R"(,"units":0)"), message(R"(,"units":0)", R"("units" is 0; it is at least 1)"));
        check_bad_layer_config(dense(R"(,"units":-3)"), message(R"(,"units":-3)", R"("units" is -3; it is at least 1)"));
        check_bad_layer_config(dense(R"(,"units":1.5)"), message(R"(,"units":1.5)", R"("units" is 1.5, not a whole number)"));
        check_bad_layer_config(dense(R"(,"units":281474976710657)"),
                               message(R"(,"units":281474976710657)", R"("units" is 281474976710657, more than 2^48)"));
        // A complete config with one field too many (longer than the 200 bytes a message shows).
        const std::string complete =
            R"({"activation":"relu","batch_input_shape":[null,3],"bias_initializer":{"class_name":"Zeros","config":{}},)"
            R"("dtype":"float32","kernel_initializer":{"class_name":"GlorotUniform","config":{"seed":null}},)"
            R"("kernel_regularizer":null,"name":"d","seed":4,"units":1,"use_bias":true})";
        check_bad_layer_config(R"({"class_name":"Dense","config":)" + complete + "}",
                               "pss: Dense config " + pss::detail::json_text(json::parse(complete)) +
                                   R"(: the field "seed" is not known; it has name, units, activation, use_bias, )"
                                   R"(kernel_initializer, bias_initializer, kernel_regularizer, dtype and batch_input_shape)");
        CHECK(pss::detail::json_text(json::parse(complete)).find("the first 200 shown") != std::string::npos);
        check_bad_layer_config(R"({"class_name":"Dense","config":{"activation":"gelu","batch_input_shape":[null,3],"dtype":"float32","name":"d","units":1,"use_bias":true}})",
                               R"(pss: Dense config {"activation":"gelu","batch_input_shape":[null,3],"dtype":"float32","name":"d","units":1,"use_bias":true}: )"
                               R"("activation" is "gelu"; it is "linear", "relu", "sigmoid", "tanh" or "softmax")");
        check_bad_layer_config(R"({"class_name":"Flatten","config":{"batch_input_shape":[3],"name":"f"}})",
                               R"(pss: Flatten config {"batch_input_shape":[3],"name":"f"}: "batch_input_shape" is [3], not )"
                               R"(a batch input shape: a list whose first item (the batch axis) is null, such as [null, 3])");
        check_bad_layer_config(R"({"class_name":"Flatten","config":{"batch_input_shape":[null,65536,65536,65536,65536,65536],"name":"f"}})",
                               R"(pss: Flatten config {"batch_input_shape":[null,65536,65536,65536,65536,65536],"name":"f"}: )"
                               R"("batch_input_shape" is [null,65536,65536,65536,65536,65536], more than 2^62 elements)");
        check_bad_layer_config(R"({"class_name":"Flatten","config":{"batch_input_shape":[null,"2"],"name":"f"}})",
                               R"(pss: Flatten config {"batch_input_shape":[null,"2"],"name":"f"}: "batch_input_shape[1]" is "2", not a whole number)");
        const std::string long_name(1000, 'A');
        check_bad_layer_config(R"({"class_name":"Flatten","config":{"name":")" + long_name + R"("}})",
                               R"(pss: Flatten config {"name":")" + std::string(191, 'A') +
                                   R"(... (1011 bytes, the first 200 shown): the field "batch_input_shape" is missing; it has name and batch_input_shape)");
        // Each of these is rejected too (the cases above pin the wording).
        const std::string inits = R"("kernel_initializer":{"class_name":"GlorotUniform","config":{"seed":null}},)"
                                  R"("bias_initializer":{"class_name":"Zeros","config":{}},"kernel_regularizer":null,)";
        const std::string tail = R"("name":"d","activation":"relu","use_bias":true,)" + inits +
                                 R"("dtype":"float32","batch_input_shape":[null,3]})";
        const std::string table = R"("embeddings_initializer":{"class_name":"RandomUniform","config":{"maxval":0.05,"minval":-0.05,"seed":null}},)";
        for (const std::string& text : std::vector<std::string>{
                 R"(null)", R"(3)", R"("Dense")", R"({})", R"({"class_name":"Dense"})",
                 R"({"class_name":"Dense","config":{"units":true,)" + tail + "}",
                 R"({"class_name":"Dense","config":{"units":1e300,)" + tail + "}",
                 R"({"class_name":"Dense","config":{"units":18446744073709551615,)" + tail + "}",
                 R"({"class_name":"Dense","config":{"units":1,"name":"d","activation":"relu","use_bias":1,)" + inits + R"("dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Dense","config":{"units":1,"name":"d","activation":"relu","use_bias":true,)" + inits + R"("dtype":"int32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Dense","config":{"units":1,"name":"d","activation":"relu","use_bias":true,)" + inits + R"j("dtype":"float32","batch_input_shape":"(3)"}})j",
                 R"({"class_name":"Dense","config":{"units":1,"name":"d","activation":"relu","use_bias":true,)" + inits + R"("dtype":"float32","batch_input_shape":[]}})",
                 R"({"class_name":"Dense","config":{"units":1,"name":"d","activation":null,"use_bias":true,"dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Dense","config":{"units":1,"name":5,"activation":"relu","use_bias":true,)" + inits + R"("dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Dense","config":{"units":1,"name":"d","activation":"relu","use_bias":true,"kernel_initializer":"glorot_uniform","bias_initializer":{"class_name":"Zeros","config":{}},"kernel_regularizer":null,"dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Dense","config":{"units":1,"name":"d","activation":"relu","use_bias":true,"kernel_initializer":{"class_name":"GlorotUniform","config":{"seed":null}},"bias_initializer":{"class_name":"Zeros","config":{}},"kernel_regularizer":{"class_name":"L2","config":{"l2":"0.01"}},"dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Embedding","config":{"name":"e","input_dim":0,"output_dim":4,)" + table + R"("dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Embedding","config":{"name":"e","input_dim":5,)" + table + R"("dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Embedding","config":{"name":"e","input_dim":5,"output_dim":4,"dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Activation","config":{"name":"a","activation":"gelu","batch_input_shape":[null,3]}})",
                 R"({"class_name":"LayerNormalization","config":{"name":"n","axis":-2,"epsilon":0.001,"center":true,"scale":true,"dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"LayerNormalization","config":{"name":"n","axis":-1,"epsilon":0.001,"center":1,"scale":true,"dtype":"float32","batch_input_shape":[null,3]}})",
                 R"({"class_name":"Flatten","config":{"name":"f","batch_input_shape":[null,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}})",
                 R"({"class_name":"Flatten","config":{"name":"f","units":3,"batch_input_shape":[null,2]}})",
                 R"({"class_name":"Flatten","config":{"name":"f","batch_input_shape":[null,-2]}})"}) {
            CAPTURE(text);
            CHECK_THROWS_AS((void)pss::detail::layer_from_config(json::parse(text)), pss::InvalidArgumentError);
        }
    }

    TEST_CASE("detail::layer_from_config: 20000 mutated JSON texts give a layer (not built) or InvalidArgumentError, nothing else") {
        const std::vector<std::string> valid = {
            R"({"class_name":"Dense","config":{"activation":"relu","batch_input_shape":[null,3],"bias_initializer":{"class_name":"Zeros","config":{}},"dtype":"float32","kernel_initializer":{"class_name":"GlorotUniform","config":{"seed":null}},"kernel_regularizer":{"class_name":"L2","config":{"l2":0.01}},"name":"dense_1","units":4,"use_bias":true}})",
            R"({"class_name":"Dense","config":{"activation":"linear","batch_input_shape":[null,2],"bias_initializer":{"class_name":"Constant","config":{"value":0.5}},"dtype":"float64","kernel_initializer":{"class_name":"VarianceScaling","config":{"distribution":"uniform","mode":"fan_avg","scale":2.0,"seed":7}},"kernel_regularizer":null,"name":"d","units":2,"use_bias":false}})",
            R"({"class_name":"Embedding","config":{"batch_input_shape":[null,3,2],"dtype":"float64","embeddings_initializer":{"class_name":"RandomNormal","config":{"mean":0.0,"seed":null,"stddev":0.05}},"input_dim":5,"name":"embedding","output_dim":4}})",
            R"({"class_name":"Activation","config":{"activation":"tanh","batch_input_shape":[null,3],"name":"activation"}})",
            R"({"class_name":"LayerNormalization","config":{"axis":-1,"batch_input_shape":[null,3],"center":true,"dtype":"float32","epsilon":0.001,"name":"layer_normalization","scale":false}})",
            R"({"class_name":"GlobalAveragePooling1D","config":{"batch_input_shape":[null,3,2],"name":"global_average_pooling1d"}})",
            R"({"class_name":"Flatten","config":{"batch_input_shape":[null],"name":"f x"}})",
            R"({"class_name":"Dropout","config":{"batch_input_shape":[null,3],"name":"dropout","rate":0.5,"seed":7}})"};
        std::size_t accepted = 0, rejected = 0;
        auto attempt = [&](const std::string& text) {
            CAPTURE(text);
            try {  // as a worker: parse_config_text, then the config
                const json parsed = pss::detail::parse_config_text(text, "layer config");
                const auto layer = pss::detail::layer_from_config(parsed);
                CHECK_FALSE(layer->built());
                ++accepted;
            } catch (const pss::InvalidArgumentError&) {
                ++rejected;
            }
        };
        for (const auto& text : valid) CHECK_NOTHROW(attempt(text));
        pss_test::for_each_mutated_text(valid, "0123456789[]{},:\"-.e truefalsenull\xff", 42, attempt);
        MESSAGE(accepted << " texts gave a layer, " << rejected << " were rejected");
        CHECK(accepted + rejected == valid.size() + 20000);
        CHECK(accepted > valid.size());  // some edits keep a valid config (a digit for a digit)
        CHECK(rejected > 10000);
    }

    TEST_CASE("serialize(loss): {\"class_name\": \"MeanSquaredError\", \"config\": {\"name\": \"mean_squared_error\", \"reduction\": \"auto\"}}; detail::loss_from_config rebuilds each loss") {
        CHECK(pss::serialize(pss::MeanSquaredError()).dump() ==
              R"({"class_name":"MeanSquaredError","config":{"name":"mean_squared_error","reduction":"auto"}})");
        CHECK(pss::serialize(pss::BinaryCrossentropy()).dump() ==
              R"({"class_name":"BinaryCrossentropy","config":{"from_logits":false,"name":"binary_crossentropy","reduction":"auto"}})");
        CHECK(pss::serialize(pss::SparseCategoricalCrossentropy()).dump() ==
              R"({"class_name":"SparseCategoricalCrossentropy","config":{"from_logits":false,"name":"sparse_categorical_crossentropy","reduction":"auto"}})");
        const xt::xarray<double> y = column({1, 0, 1});
        const xt::xarray<double> p = column({0.8, 0.3, 0.55});
        for (const auto& loss : std::vector<std::shared_ptr<const pss::Loss>>{
                 std::make_shared<pss::MeanSquaredError>(), std::make_shared<pss::BinaryCrossentropy>()}) {
            const auto rebuilt = pss::detail::loss_from_config(json::parse(pss::serialize(*loss).dump()));
            CHECK(pss::serialize(*rebuilt) == pss::serialize(*loss));
            CHECK(rebuilt->value(y, p) == loss->value(y, p));
            CHECK(D(rebuilt->gradient(y, p)) == D(loss->gradient(y, p)));
        }
        const pss::SparseCategoricalCrossentropy scce;
        const auto rebuilt = pss::detail::loss_from_config(pss::serialize(scce));
        const xt::xarray<double> ids = {1, 0};
        const xt::xarray<double> probs = {{0.2, 0.7, 0.1}, {0.5, 0.25, 0.25}};
        CHECK(rebuilt->name() == "sparse_categorical_crossentropy");
        CHECK(rebuilt->value(ids, probs) == scce.value(ids, probs));
        CHECK(D(rebuilt->gradient(ids, probs)) == D(scce.gradient(ids, probs)));
        // Keras' other name of the default reduction is taken.
        CHECK(pss::detail::loss_from_config(json::parse(R"({"class_name":"MeanSquaredError","config":{"name":"mean_squared_error","reduction":"sum_over_batch_size"}})"))
                  ->name() == "mean_squared_error");
    }

    TEST_CASE("detail::loss_from_config: Hinge, from_logits not a bool, another name or reduction, a missing field throw naming the field and its value") {
        auto check_bad = [](const std::string& text, const std::string& message) {
            CAPTURE(text);
            CHECK_THROWS_WITH_AS((void)pss::detail::loss_from_config(json::parse(text)), message.c_str(), pss::InvalidArgumentError);
        };
        check_bad(R"({"class_name":"Hinge","config":{}})",
                  R"(pss: loss {"class_name":"Hinge","config":{}}: "class_name" is "Hinge"; the losses a worker rebuilds )"
                  R"(are "MeanSquaredError", "BinaryCrossentropy", "SparseCategoricalCrossentropy" and "Huber")");
        check_bad(R"({"class_name":"BinaryCrossentropy","config":{"from_logits":1,"name":"binary_crossentropy","reduction":"auto"}})",
                  R"(pss: BinaryCrossentropy config {"from_logits":1,"name":"binary_crossentropy","reduction":"auto"}: )"
                  R"("from_logits" is 1, not true or false)");
        check_bad(R"({"class_name":"MeanSquaredError","config":{"name":"mse","reduction":"auto"}})",
                  R"(pss: MeanSquaredError config {"name":"mse","reduction":"auto"}: "name" is "mse"; a MeanSquaredError )"
                  R"(is named "mean_squared_error")");
        check_bad(R"({"class_name":"MeanSquaredError","config":{"name":"mean_squared_error","reduction":"sum"}})",
                  R"(pss: MeanSquaredError config {"name":"mean_squared_error","reduction":"sum"}: "reduction" is "sum"; )"
                  R"(a loss reduces as "auto" (or "sum_over_batch_size", the same): the mean over the batch)");
        check_bad(R"({"class_name":"MeanSquaredError","config":{"name":"mean_squared_error"}})",
                  R"(pss: MeanSquaredError config {"name":"mean_squared_error"}: the field "reduction" is missing; it )"
                  R"(has name and reduction)");
        check_bad(R"({"class_name":"MeanSquaredError","config":{"name":"mean_squared_error","reduction":"auto","from_logits":false}})",
                  R"(pss: MeanSquaredError config {"from_logits":false,"name":"mean_squared_error","reduction":"auto"}: )"
                  R"(the field "from_logits" is not known; it has name and reduction)");
        for (const std::string& text : std::vector<std::string>{R"("mse")", R"([])", R"({"class_name":"MeanSquaredError"})",
                                                                R"({"class_name":"MeanSquaredError","config":null})"}) {
            CAPTURE(text);
            CHECK_THROWS_AS((void)pss::detail::loss_from_config(json::parse(text)), pss::InvalidArgumentError);
        }
        CHECK_THROWS_WITH_AS((void)pss::detail::parse_config_text("{\"class_name\":", "loss config"),
                             doctest::Contains("pss: loss config is not JSON: [json.exception.parse_error.101]"),
                             pss::InvalidArgumentError);
    }
}

namespace {

/// Worker tasks played in this process as if they were other processes: each call runs the registered
/// function by its name on the encoded arguments (detail::run_call), as a worker process does, so the
/// keras code takes its multi-process path. Worker `forget_worker` loses its models (a restart) just
/// before the call numbered `forget_at_call` (1, 2, ...).
class LoopbackWorkers final : public pss::detail::RemoteWorkers {
public:
    std::future<pss::Reply> call(int worker, pss::Request request) override {
        const int n = ++calls_;
        if (n == forget_at_call) pss::detail::testing_forget_remote_models(forget_worker);
        {
            std::lock_guard lock(mutex_);
            names_.push_back(request.name);
        }
        const pss::detail::ClosureContext context{worker};
        const pss::detail::ClosureContext::Guard current(context);  // as a worker process serving a call
        pss::Reply answer;
        answer.values = pss::detail::run_call(request.name, std::move(request.values), pss::detail::CallContext{channel, worker});
        std::promise<pss::Reply> reply;
        reply.set_value(std::move(answer));
        return reply.get_future();
    }
    std::future<pss::Reply> probe(int) override {
        std::promise<pss::Reply> reply;
        reply.set_value(pss::Reply{});
        return reply.get_future();
    }
    [[nodiscard]] const pss::Timeouts& timeouts() const noexcept override { return limits; }
    /// How many calls of `name` were made.
    int count(const std::string& name) {
        std::lock_guard lock(mutex_);
        return static_cast<int>(std::count(names_.begin(), names_.end(), name));
    }

    std::shared_ptr<pss::detail::Channel> channel;  // how received Variables reach the ps tasks
    pss::Timeouts limits;
    int forget_at_call = -1;
    int forget_worker = -1;

private:
    std::atomic<int> calls_{0};
    std::mutex mutex_;
    std::vector<std::string> names_;
};

/// An identity layer that counts where its forward runs: in a closure on a worker, or on the chief
/// (get_current_worker_index throws outside a closure).
class WorkerProbe final : public pss::Layer {
public:
    [[nodiscard]] std::unique_ptr<pss::Layer> clone() const override { return std::make_unique<WorkerProbe>(*this); }
    [[nodiscard]] std::string_view class_name() const noexcept override { return "WorkerProbe"; }
    [[nodiscard]] pss::Shape compute_output_shape(const pss::Shape& input_shape) const override { return input_shape; }
    pss::Tensor forward(pss::Tensor inputs, std::uint64_t) override {
        try {
            const int worker = pss::get_current_worker_index();
            if (worker == 0 || worker == 1) ++workers_;
        } catch (const pss::Error&) {
            ++chief_;
        }
        return inputs;
    }
    pss::LayerGradients backward(const pss::Tensor& grad_outputs) override { return {grad_outputs, {}}; }
    static void reset() { workers_ = chief_ = 0; }
    static int on_workers() { return workers_; }
    static int on_chief() { return chief_; }

protected:
    pss::Shape do_build(const pss::Shape& input_shape, std::mt19937&) override { return input_shape; }

private:
    static inline std::atomic<int> workers_{0}, chief_{0};
};

/// A ParameterServerStrategy whose workers are LoopbackWorkers.
template <class Inner>
class LoopbackStrategy final : public pss::Strategy {
public:
    using optimizer_type = typename Inner::optimizer_type;
    static constexpr bool synchronous = Inner::synchronous;
    template <class... A>
    explicit LoopbackStrategy(A&&... args) : inner_(std::forward<A>(args)...) {}
    [[nodiscard]] int num_replicas_in_sync() const override { return 1; }
    pss::Variable create_variable(pss::Tensor value, std::string name) override {
        return inner_.create_variable(std::move(value), std::move(name));
    }
    [[nodiscard]] int num_workers() const { return inner_.num_workers(); }
    [[nodiscard]] const optimizer_type& optimizer() const { return inner_.optimizer(); }
    [[nodiscard]] pss::detail::RemoteWorkers* remote_workers() noexcept override { return &workers; }
    Inner& inner() { return inner_; }

    LoopbackWorkers workers;

private:
    Inner inner_;
};

/// The data of the synchronous tests: ids for an Embedding, and targets.
std::pair<xt::xarray<float>, xt::xarray<float>> sync_data() {
    xt::xarray<float> x = xt::xarray<float>::from_shape({10, 3});
    xt::xarray<float> y = xt::xarray<float>::from_shape({10, 1});
    for (std::size_t i = 0; i < 10; ++i) {
        x(i, 0) = static_cast<float>(i % 5);
        x(i, 1) = static_cast<float>((i * 7) % 5);
        x(i, 2) = static_cast<float>((i * 3) % 5);
        y(i, 0) = static_cast<float>(i) * 0.3f - 1.0f;
    }
    return {x, y};
}

/// A synchronous fit of 3 epochs; its losses, then every weight.
template <class StrategyType, class BeforeFit = std::nullptr_t>
std::vector<double> train_sync(StrategyType& strategy, BeforeFit before_fit = nullptr) {
    const auto [x, y] = sync_data();
    pss::Sequential model(strategy,
                          {pss::Embedding(5, 4), pss::GlobalAveragePooling1D(), pss::Dense(3, "tanh"), pss::Dense(1)}, 7);
    model.compile(pss::SGD(0.1), "mse", {"mae", pss::metrics::MeanSquaredError()});
    model.build({3});
    if constexpr (!std::is_null_pointer_v<BeforeFit>) before_fit(model);
    const auto history = model.fit(x, y, 3, 3, true, false);
    std::vector<double> out(history.loss.begin(), history.loss.end());
    for (const char* name : {"mean_absolute_error", "mean_squared_error"}) {
        REQUIRE(history.history.at(name).size() == 3);
        out.insert(out.end(), history.history.at(name).begin(), history.history.at(name).end());
    }
    for (const auto& w : model.get_weights()) out.insert(out.end(), w.template get<float>().begin(), w.template get<float>().end());
    return out;
}

/// Trains with `train(strategy, before_fit)` (3 epochs of 4 synchronous batches) on in-process workers,
/// then on LoopbackWorkers (the worker-process path: the model sent as its description, each step a
/// registered call); checks the same bits and one build call per worker; returns the in-process result.
template <class Train>
std::vector<double> check_worker_processes_train_alike(Train train) {
    pss::detail::testing_forget_remote_models();
    SyncTwoWorkers local(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
    LoopbackStrategy<SyncTwoWorkers> remote(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
    const auto expected = train(local, nullptr);
    const auto got = train(remote, [&](auto& model) {
        remote.workers.channel = pss::detail::Codec<pss::Variable>::channel_of(model.weights().front());
    });
    CHECK(got == expected);
    CHECK(remote.workers.count("pss.keras.Sequential.build") == 2);
    CHECK(remote.workers.count("pss.keras.Sequential.step") == 3 * 4 * 2);  // epochs x batches x workers
    pss::detail::testing_forget_remote_models();
    return expected;
}

}  // namespace

TEST_SUITE("keras/remote") {
    TEST_CASE("Sequential on worker processes: the model is sent once per worker (2 build calls for 12 steps) and trains to the bits of in-process workers") {
        (void)check_worker_processes_train_alike([](auto& strategy, auto before_fit) { return train_sync(strategy, before_fit); });
    }

    TEST_CASE("Sequential on worker processes: a worker that loses the model mid-fit (a restart) gets it again, and the fit gives the same bits") {
        for (int forget_at : {3, 8, 17}) {
            CAPTURE(forget_at);
            pss::detail::testing_forget_remote_models();
            SyncTwoWorkers local(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
            LoopbackStrategy<SyncTwoWorkers> remote(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
            remote.workers.forget_at_call = forget_at;  // calls 1 and 2 are the build calls
            remote.workers.forget_worker = -1;  // every worker: the next step fails wherever it runs
            const auto expected = train_sync(local);
            const auto got = train_sync(remote, [&](auto& model) {
                remote.workers.channel = pss::detail::Codec<pss::Variable>::channel_of(model.weights().front());
            });
            CHECK(got == expected);
            // Once more to both workers; twice when the second worker's failure came after the first
            // recovery had started (the fit sends again at most 2 * workers + 2 times).
            const int builds = remote.workers.count("pss.keras.Sequential.build");
            CHECK((builds == 4 || builds == 6));
        }
        pss::detail::testing_forget_remote_models();
    }

    TEST_CASE("evaluate on worker processes: one registered test step per batch (4 for 10 examples in batches of 3) gives the bits of in-process workers; a worker that lost the model gets it again") {
        const auto data = sync_data();  // not a structured binding: clang before 16 refuses to capture one
        const xt::xarray<float>& x = data.first;
        const xt::xarray<float>& y = data.second;
        auto evaluate = [&](auto& strategy, auto before) {
            pss::Sequential model(strategy,
                                  {pss::Embedding(5, 4), pss::GlobalAveragePooling1D(), pss::Dense(3, "tanh"), pss::Dense(1)}, 7);
            model.compile(pss::SGD(0.1), "mse", {"mae"});
            model.build({3});
            before(model);
            const pss::Logs logs = model.evaluate(x, y, pss::EvaluateOptions{.batch_size = 3});
            return std::vector<double>{logs.at("loss"), logs.at("mean_absolute_error")};
        };
        pss::detail::testing_forget_remote_models();
        SyncTwoWorkers local(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        const auto expected = evaluate(local, [](auto&) {});
        for (int forget_at : {-1, 3, 4, 6}) {  // calls 1 and 2 are the build calls, 3 to 6 the test steps
            CAPTURE(forget_at);
            pss::detail::testing_forget_remote_models();
            LoopbackStrategy<SyncTwoWorkers> remote(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
            remote.workers.forget_at_call = forget_at;
            const auto got = evaluate(remote, [&](auto& model) {
                remote.workers.channel = pss::detail::Codec<pss::Variable>::channel_of(model.weights().front());
            });
            CHECK(got == expected);
            CHECK(remote.workers.count("pss.keras.Sequential.build") == (forget_at == -1 ? 2 : 4));
            if (forget_at == -1) CHECK(remote.workers.count("pss.keras.Sequential.test_step") == 4);
            else CHECK(remote.workers.count("pss.keras.Sequential.test_step") >= 5);
        }
        pss::detail::testing_forget_remote_models();
    }

    TEST_CASE("evaluate and fit's validation run their batches on the workers (each batch's forward on worker 0 or 1, none on the chief); predict on the chief") {
        WorkerProbe::reset();
        SyncTwoWorkers strategy(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
        const auto [x, y] = sync_data();
        pss::Sequential model(strategy, {pss::Embedding(5, 4), pss::GlobalAveragePooling1D(), WorkerProbe(), pss::Dense(1)}, 7);
        model.compile(pss::SGD(0.1), "mse");
        (void)model.evaluate(x, y, pss::EvaluateOptions{.batch_size = 2});  // 5 batches
        CHECK(WorkerProbe::on_workers() == 5);
        CHECK(WorkerProbe::on_chief() == 0);
        WorkerProbe::reset();
        // 8 training examples in batches of 4, each split between the 2 workers, then 2 validated: per epoch
        // 4 training forwards and 1 validation forward, all on the workers.
        (void)model.fit(x, y, {.batch_size = 4, .epochs = 2, .verbose = 0, .validation_split = 0.2, .shuffle = false});
        CHECK(WorkerProbe::on_workers() == 2 * (4 + 1));
        CHECK(WorkerProbe::on_chief() == 0);
        WorkerProbe::reset();
        (void)model.predict(x, 5);
        CHECK(WorkerProbe::on_workers() == 0);
        CHECK(WorkerProbe::on_chief() == 2);
    }

    TEST_CASE("pss.keras.Sequential.step for a model the worker does not have answers NotFoundError naming the worker and the model") {
        pss::detail::testing_forget_remote_models();
        const pss::detail::ClosureContext context{3};
        const pss::detail::ClosureContext::Guard current(context);
        const xt::xarray<float> one = column_f({1});
        const pss::Tensor no_weights(xt::xarray<double>::from_shape({0}));
        CHECK_THROWS_WITH_AS((void)pss::detail::keras_remote_step("0123456789abcdef", {pss::Tensor(one)}, one, no_weights, 0, 1.0),
                             "pss: Sequential: worker task 3 does not have the model \"0123456789abcdef\" (it restarted, "
                             "or evicted the model: a worker keeps the 16 models used last); the chief sends it again "
                             "with the call \"pss.keras.Sequential.build\"",
                             pss::NotFoundError);
        try {
            (void)pss::detail::keras_remote_step("x", {pss::Tensor(one)}, one, no_weights, 0, 1.0);
        } catch (const pss::NotFoundError& e) {
            CHECK(pss::detail::is_remote_model_unknown(e));
        }
        CHECK_FALSE(pss::detail::is_remote_model_unknown(pss::NotFoundError("pss: something else")));
    }

    TEST_CASE("pss.keras.Sequential.build: a worker keeps the 16 models used last; a description that is not one throws InvalidArgumentError naming the field") {
        pss::detail::testing_forget_remote_models();
        pss::ParameterServerStrategy<> strategy;
        pss::Sequential model(strategy, {pss::Dense(1)});
        model.build({2});
        model.compile("mse");
        const std::string description =
            json{{"class_name", "Sequential"}, {"config", model.get_config()},
                 {"loss", pss::serialize(pss::MeanSquaredError())}, {"metrics", json::array()},
                 {"weight_counts", {2}}}.dump();
        const pss::detail::ClosureContext context{0};
        const pss::detail::ClosureContext::Guard current(context);
        for (int i = 0; i < 17; ++i) pss::detail::keras_remote_build("m" + std::to_string(i), description, model.weights());
        const xt::xarray<float> x = xt::ones<float>({1, 2}), y = column_f({3});
        const pss::Tensor w(xt::xarray<double>::from_shape({0}));
        CHECK_THROWS_AS((void)pss::detail::keras_remote_step("m0", {pss::Tensor(x)}, y, w, 0, 1.0), pss::NotFoundError);  // evicted
        CHECK_NOTHROW((void)pss::detail::keras_remote_step("m1", {pss::Tensor(x)}, y, w, 0, 1.0));
        CHECK(pss::detail::keras_remote_step("m16", {pss::Tensor(x)}, y, w, 0, 1.0).size() == 1);  // the loss; no metrics
        CHECK_THROWS_WITH_AS((void)pss::detail::keras_remote_step("m16", {pss::Tensor(x)}, y, pss::Tensor(xt::xarray<double>{1.0, 2.0}), 0, 1.0),
                             "pss: Sequential: a step's sample weights are float64 of shape (2,); they are float64 of "
                             "shape (1,), or (0,) for none",
                             pss::InvalidArgumentError);

        CHECK_THROWS_WITH_AS(pss::detail::keras_remote_build("bad", description, {}),
                             doctest::Contains("\"weight_counts\"[0] is 2, but 0 of the 0 variables sent are left for layer 0"),
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::detail::keras_remote_build("bad", "{\"class_name\": \"Sequential\"", model.weights()),
                             doctest::Contains("pss: model description is not JSON: "), pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::detail::keras_remote_build("bad", "{\"class_name\": \"Model\"}", model.weights()),
                             doctest::Contains("\"class_name\" is \"Model\"; a worker builds \"Sequential\" and \"Functional\" models"),
                             pss::InvalidArgumentError);
        json no_layers = json::parse(description);
        no_layers["config"]["layers"] = json::array();
        CHECK_THROWS_WITH_AS(pss::detail::keras_remote_build("bad", no_layers.dump(), model.weights()),
                             doctest::Contains("\"layers\" is [], not a list of at least one layer"), pss::InvalidArgumentError);
        json bad_metric = json::parse(description);
        bad_metric["metrics"] = json::array({{{"class_name", "F1Score"}, {"config", json::object()}}});
        CHECK_THROWS_AS(pss::detail::keras_remote_build("bad", bad_metric.dump(), model.weights()), pss::InvalidArgumentError);
        bad_metric["metrics"] = 3;
        CHECK_THROWS_WITH_AS(pss::detail::keras_remote_build("bad", bad_metric.dump(), model.weights()),
                             doctest::Contains("\"metrics\" is 3, not a list"), pss::InvalidArgumentError);
        CHECK_THROWS_AS((void)pss::detail::keras_remote_step("bad", {pss::Tensor(x)}, y, w, 0, 1.0), pss::NotFoundError);
        pss::detail::testing_forget_remote_models();
    }
}

// ---------------------------------------------------------------------------------------------------
// The functional API: pss::Input, layers called on symbolic tensors, Concatenate and Add, pss::Model.
// ---------------------------------------------------------------------------------------------------

namespace {

xt::xarray<float> rows_f(std::size_t rows, std::size_t cols, std::vector<float> values) {
    xt::xarray<float> out = xt::xarray<float>::from_shape({rows, cols});
    REQUIRE(values.size() == rows * cols);
    std::copy(values.begin(), values.end(), out.begin());
    return out;
}

/// The functional model of the remote tests: ids through an Embedding and pooling, two dense features
/// through a Dense layer, joined, then one output; a synchronous fit of 3 epochs gives its losses and weights.
template <class StrategyType, class BeforeFit = std::nullptr_t>
std::vector<double> train_functional(StrategyType& strategy, BeforeFit before_fit = nullptr) {
    const auto [ids, y] = sync_data();
    xt::xarray<float> dense = xt::xarray<float>::from_shape({10, 2});
    for (std::size_t i = 0; i < 10; ++i) {
        dense(i, 0) = static_cast<float>(i) / 10.0f;
        dense(i, 1) = 1.0f - static_cast<float>(i % 3) / 2.0f;
    }
    const pss::KerasTensor id_input = pss::Input({3}, "ids"), dense_input = pss::Input({2});
    const pss::KerasTensor pooled = pss::GlobalAveragePooling1D()(pss::Embedding(5, 4)(id_input));
    const pss::KerasTensor joined = pss::Concatenate()({pooled, pss::Dense(3, "tanh")(dense_input)});
    pss::Model model(strategy, {id_input, dense_input}, pss::Dense(1)(joined), 7);
    model.compile("mse", {"mae"});
    if constexpr (!std::is_null_pointer_v<BeforeFit>) before_fit(model);
    const auto history = model.fit({ids, dense}, y, 3, 3, true, false);
    std::vector<double> out(history.loss.begin(), history.loss.end());
    out.insert(out.end(), history.history.at("mean_absolute_error").begin(), history.history.at("mean_absolute_error").end());
    for (const auto& w : model.get_weights()) out.insert(out.end(), w.template get<float>().begin(), w.template get<float>().end());
    return out;
}

}  // namespace

TEST_SUITE("keras/functional") {
    TEST_CASE("Model: two inputs through Dense and Concatenate: Keras' names, config and summary; predict is the layers by hand") {
        pss::ParameterServerStrategy<> strategy;
        const pss::KerasTensor a = pss::Input({2}), b = pss::Input({3}, "extra");
        const pss::KerasTensor h = pss::Dense(2, "relu")(a);
        CHECK(h.shape() == pss::Shape{2});
        const pss::KerasTensor joined = pss::Concatenate()({h, b});
        CHECK(joined.shape() == pss::Shape{5});
        pss::Model model(strategy, {a, b}, pss::Dense(1)(joined));
        CHECK(model.name() == "model");
        REQUIRE(model.layers().size() == 3);
        CHECK(model.layers()[0]->name() == "dense");
        CHECK(model.layers()[1]->name() == "concatenate");
        CHECK(model.layers()[2]->name() == "dense_1");
        CHECK(model.weights().size() == 4);  // built at once: the variables exist
        model.get_layer("dense").set_weights({rows_f(2, 2, {1, -1, 2, 0.5f}), xt::xarray<float>{0.5f, 0}});
        model.get_layer("dense_1").set_weights({column_f({1, 2, 3, 4, 5}), xt::xarray<float>{0.25f}});
        // h = relu([[1, 1], [-1, 0]] . kernel + bias) = [[3.5, 0], [0, 1]]; joined with x_b; . [1..5] + 0.25
        const xt::xarray<float> x_a = rows_f(2, 2, {1, 1, -1, 0});
        const xt::xarray<float> x_b = rows_f(2, 3, {1, 0, 0, 0, 1, 2});
        CHECK(model.predict({x_a, x_b}) == column_f({6.75f, 16.25f}));

        const json config = model.get_config();
        CHECK(config["name"] == "model");
        CHECK(config["input_layers"] == json::parse(R"([["input_1", 0, 0], ["extra", 0, 0]])"));
        CHECK(config["output_layers"] == json::parse(R"([["dense_1", 0, 0]])"));
        REQUIRE(config["layers"].size() == 5);
        CHECK(config["layers"][0] == json::parse(R"({"class_name": "InputLayer", "name": "input_1", "inbound_nodes": [],
            "config": {"batch_input_shape": [null, 2], "dtype": "float32", "name": "input_1"}})"));
        CHECK(config["layers"][3]["class_name"] == "Concatenate");
        CHECK(config["layers"][3]["config"] == json::parse(R"({"axis": -1, "name": "concatenate"})"));
        CHECK(config["layers"][3]["inbound_nodes"] == json::parse(R"([[["dense", 0, 0, {}], ["extra", 0, 0, {}]]])"));

        std::ostringstream summary;
        model.summary(summary);
        const std::string rule(98, '_');
        const std::string text = summary.str();
        CAPTURE(text);
        auto padded = [](std::string line) { return line + std::string(98 - line.size(), ' ') + "\n"; };
        CHECK(text.starts_with("Model: \"model\"\n" + rule + "\n" +
                               padded(" Layer (type)                   Output Shape         Param #     Connected to") +
                               std::string(98, '=') + "\n" +
                               padded(" input_1 (InputLayer)           [(None, 2)]          0           []")));
        // Keras breaks "Connected to" after each "',".
        CHECK(text.find(padded(" concatenate (Concatenate)      (None, 5)            0           ['dense[0][0]',") +
                        padded("                                                                  'extra[0][0]']")) !=
              std::string::npos);
        CHECK(text.find("Total params: 12\n") != std::string::npos);  // 2 x 2 + 2, 5 + 1
    }

    TEST_CASE("Concatenate and Add: values, shapes and gradients of each input; axis 1 of rank-3 inputs; float64 when one input is") {
        std::mt19937 rng(0);
        pss::Concatenate last;
        CHECK(last.build({{2}, {3}}) == pss::Shape{5});
        const pss::Tensor y = last.forward_list({pss::Tensor(rows_f(2, 2, {1, 2, 3, 4})), pss::Tensor(rows_f(2, 3, {5, 6, 7, 8, 9, 10}))});
        CHECK(y.get<float>() == rows_f(2, 5, {1, 2, 5, 6, 7, 3, 4, 8, 9, 10}));
        const auto grads = last.backward_list(rows_f(2, 5, {10, 20, 30, 40, 50, 60, 70, 80, 90, 100}));
        REQUIRE(grads.size() == 2);
        CHECK(grads[0].get<float>() == rows_f(2, 2, {10, 20, 60, 70}));
        CHECK(grads[1].get<float>() == rows_f(2, 3, {30, 40, 50, 80, 90, 100}));

        pss::Concatenate first(1);
        CHECK(first.build({{1, 2}, {2, 2}}) == pss::Shape{3, 2});
        xt::xarray<double> p = xt::xarray<double>::from_shape({2, 1, 2});
        xt::xarray<float> q = xt::xarray<float>::from_shape({2, 2, 2});
        std::iota(p.begin(), p.end(), 1.0);    // 1..4
        std::iota(q.begin(), q.end(), 10.0f);  // 10..17
        const pss::Tensor joined = first.forward_list({pss::Tensor(p), pss::Tensor(q)});
        REQUIRE(joined.dtype() == pss::DType::float64);
        CHECK(joined.shape() == pss::Shape{2, 3, 2});
        CHECK(D(joined) == xt::xarray<double>{{{1, 2}, {10, 11}, {12, 13}}, {{3, 4}, {14, 15}, {16, 17}}});
        const auto split = first.backward_list(joined);
        CHECK(split[0].dtype() == pss::DType::float64);
        CHECK(split[1].dtype() == pss::DType::float32);  // each input's gradient in its own dtype
        CHECK(D(split[0]) == D(pss::Tensor(p)));
        CHECK(D(split[1]) == D(pss::Tensor(q)));

        pss::Add add;
        CHECK(add.build({{2}, {2}, {2}}) == pss::Shape{2});
        const pss::Tensor sum = add.forward_list({pss::Tensor(rows_f(1, 2, {1, 2})), pss::Tensor(rows_f(1, 2, {10, 20})),
                                                  pss::Tensor(rows_f(1, 2, {100, 200}))});
        CHECK(sum.get<float>() == rows_f(1, 2, {111, 222}));
        const auto copies = add.backward_list(rows_f(1, 2, {0.5f, -1}));
        REQUIRE(copies.size() == 3);
        for (const auto& g : copies) CHECK(g.get<float>() == rows_f(1, 2, {0.5f, -1}));

        CHECK_THROWS_WITH_AS((void)last.forward(pss::Tensor(rows_f(2, 2, {1, 2, 3, 4}))),
                             "pss: Concatenate 'concatenate': forward of one input; a merge layer takes a list of inputs "
                             "(call it on a list of symbolic tensors, as pss::Model does)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)last.forward_list({pss::Tensor(rows_f(2, 2, {1, 2, 3, 4})), pss::Tensor(rows_f(2, 2, {1, 2, 3, 4}))}),
                             "pss: Concatenate 'concatenate': input 1 has shape (2, 2), but the layer was built for (2, 3)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::Concatenate(0), "pss: Concatenate: axis is 0, the batch axis; join along another (-1: the last)",
                             pss::InvalidArgumentError);
        (void)rng;
    }

    TEST_CASE("Model: one SGD step moves every weight by the central difference of evaluate's loss, through fan-out, Add, Concatenate, LayerNormalization, Activation and an L2 penalty (1e-7)") {
        ConfigStrategy strategy(pss::LocalClusterResolver<2, 1>{}, pss::FixedShardsPartitioner(1), pss::SGD(0.5));
        const auto f64 = pss::DType::float64;
        const pss::KerasTensor a = pss::Input({2}), b = pss::Input({2});
        // h is read by the two layers below it: its gradient is the sum of theirs.
        const pss::KerasTensor h = pss::LayerNormalization({.dtype = f64})(pss::Dense(3, "tanh", true, f64)(a));
        const pss::KerasTensor s = pss::Add()(
            {pss::Dense(2, "linear", true, f64)(h), pss::Activation("sigmoid")(pss::Dense(2, "linear", true, f64)(h))});
        const pss::KerasTensor out =
            pss::Dense(1, {.kernel_regularizer = pss::L2(0.05), .dtype = f64})(pss::Concatenate()({s, b}));
        pss::Model model(strategy, {a, b}, out, 3);
        model.compile("mse");
        const xt::xarray<float> x_a = rows_f(3, 2, {0.5f, -1, 1.5f, 0.25f, -0.75f, 2});
        const xt::xarray<float> x_b = rows_f(3, 2, {1, 0, -0.5f, 2, 0.25f, -1});
        const xt::xarray<float> y = column_f({1, -2, 0.5f});
        std::vector<pss::Tensor> weights = model.get_weights();
        REQUIRE(weights.size() == 10);
        std::vector<std::vector<double>> numeric;
        for (std::size_t v = 0; v < weights.size(); ++v) {
            numeric.emplace_back();
            auto& values = weights[v].get<double>();
            for (std::size_t i = 0; i < values.size(); ++i)
                numeric.back().push_back(central_difference(values.data()[i], [&] {
                    model.set_weights(weights);
                    return model.evaluate({x_a, x_b}, y, 3);
                }));
        }
        model.set_weights(weights);
        (void)model.fit({x_a, x_b}, y, {.batch_size = 3, .verbose = 0, .shuffle = false});
        const std::vector<pss::Tensor> after = model.get_weights();
        for (std::size_t v = 0; v < weights.size(); ++v)
            for (std::size_t i = 0; i < numeric[v].size(); ++i) {
                const double moved = (weights[v].get<double>().data()[i] - after[v].get<double>().data()[i]) / 0.5;
                INFO("weight " << v << " element " << i << ": moved " << moved << ", central difference " << numeric[v][i]);
                CHECK(std::abs(moved - numeric[v][i]) <= 1e-7 * std::max(1.0, std::abs(moved)));
            }
    }

    TEST_CASE("Model: Input, Dense, Dense gives a Sequential model's bits (same seed): initial weights, losses and final weights") {
        auto run = [](auto make) {
            SyncTwoWorkers strategy(pss::LocalClusterResolver<2, 2>{}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
            auto model = make(strategy);
            model->compile("mse");
            const auto [x, y] = line_data(10);
            std::vector<double> out;
            for (const auto& w : model->get_weights()) out.insert(out.end(), w.template get<float>().begin(), w.template get<float>().end());
            const auto history = model->fit(x / 10.0f, y / 10.0f, {.batch_size = 4, .epochs = 3, .verbose = 0});
            out.insert(out.end(), history.loss.begin(), history.loss.end());
            for (const auto& w : model->get_weights()) out.insert(out.end(), w.template get<float>().begin(), w.template get<float>().end());
            return out;
        };
        const auto sequential = run([](SyncTwoWorkers& s) {
            auto m = std::make_unique<pss::Sequential<SyncTwoWorkers>>(s, std::initializer_list<pss::AnyLayer>{pss::Dense(3, "tanh"), pss::Dense(1)}, 5);
            m->build({1});
            return m;
        });
        const auto functional = run([](SyncTwoWorkers& s) {
            const pss::KerasTensor x = pss::Input({1});
            return std::make_unique<pss::Model<SyncTwoWorkers>>(s, x, pss::Dense(1)(pss::Dense(3, "tanh")(x)), 5);
        });
        CHECK(sequential.size() == 3 + 3 + 3 + 1 + 3 + 3 + 3 + 3 + 1);
        CHECK(functional == sequential);
    }

    TEST_CASE("Model: a layer object called twice, an input missing or given twice, a merge on one tensor, shapes that do not join, and wrong data throw naming each") {
        pss::ParameterServerStrategy<> strategy;
        const pss::KerasTensor p = pss::Input({2}), q = pss::Input({2}, "q");
        pss::Dense shared(2);
        const pss::KerasTensor twice = shared(shared(p));
        CHECK_THROWS_WITH_AS(pss::Model(strategy, p, twice),
                             "pss: Model::Model: one Dense layer object is called twice; Keras would share its weights, "
                             "pss does not (make one layer object per call)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::Model(strategy, p, pss::Add()({p, q})),
                             "pss: Model::Model: the output needs the input 'q' of shape (2,), which is not among the "
                             "model's inputs",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::Model(strategy, {p, p}, pss::Dense(1)(p)), "pss: Model::Model: input 1 is given twice",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(pss::Model(strategy, {pss::Dense(1)(p)}, pss::Dense(1)(p)),
                             "pss: Model::Model: input 0 is the output of a Dense layer, not a pss::Input",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::Concatenate()(p),
                             "pss: Concatenate takes a list of at least 2 inputs, but it was called on 1",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::Dense(2)({p, q}),
                             "pss: Dense takes one input, but it was called on a list of 2 (join them first with "
                             "Concatenate or Add)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::Concatenate()({pss::Input({2, 3}), pss::Input({3, 3})}),
                             "pss: Concatenate: inputs of shapes (2, 3), (3, 3) (batch axis excluded) do not join along "
                             "axis -1; every other axis must be equal",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)pss::Add()({p, pss::Input({3})}),
                             "pss: Add: inputs of shapes (2,) and (3,) (batch axis excluded); Add takes inputs of one shape",
                             pss::InvalidArgumentError);
        pss::Dense named(1), same(1);
        named.set_name("same");
        same.set_name("same");
        CHECK_THROWS_WITH_AS(pss::Model(strategy, p, same(named(p))),
                             "pss: Model::Model: two layers or inputs are named 'same'; names are unique within a model",
                             pss::InvalidArgumentError);

        pss::Model model(strategy, {p, q}, pss::Dense(1)(pss::Add()({p, q})));
        model.compile("mse");
        const xt::xarray<float> two = xt::ones<float>({2, 2}), y = column_f({1, 2});
        CHECK_THROWS_WITH_AS((void)model.fit(two, y, {.verbose = 0}),
                             "pss: Model::fit: x is 1 arrays, but the model has 2 inputs; give one array per input, in the "
                             "order of the model's inputs",
                             pss::InvalidArgumentError);
        const xt::xarray<float> three_rows = xt::ones<float>({3, 2});
        CHECK_THROWS_WITH_AS((void)model.fit({two, three_rows}, y, {.verbose = 0}),
                             "pss: Model::fit: x[1] (input 'q') has shape (3, 2), but the input takes (2, 2) (examples "
                             "first, the same count in every input)",
                             pss::InvalidArgumentError);
        const xt::xarray<float> three_columns = xt::ones<float>({2, 3});
        CHECK_THROWS_WITH_AS((void)model.predict({two, three_columns}),
                             "pss: Model::predict: x[1] (input 'q') has shape (2, 3), but the input takes (2, 2) (examples "
                             "first, the same count in every input)",
                             pss::InvalidArgumentError);

        const pss::KerasTensor ids = pss::Input({2});
        pss::Model lookup(strategy, ids, pss::Dense(1)(pss::Flatten()(pss::Embedding(5, 2)(ids))));
        lookup.compile("mse");
        CHECK_THROWS_WITH_AS((void)lookup.predict(rows_f(1, 2, {1, 7})),
                             "pss: Embedding 'embedding': input 1 (in row-major order) is 7.000000, not an id; an "
                             "Embedding takes integer ids in [0, 5) stored as floats",
                             pss::InvalidArgumentError);
    }
}

TEST_SUITE("keras/remote") {
    TEST_CASE("Model on worker processes: workers rebuild a functional model from Keras' Functional config and train it to the bits of in-process workers") {
        (void)check_worker_processes_train_alike(
            [](auto& strategy, auto before_fit) { return train_functional(strategy, before_fit); });
    }

    TEST_CASE("pss.keras.Sequential.build: a Functional description with a bad reference, order, shape or count throws naming it; 20000 mutated texts give a model or InvalidArgumentError") {
        pss::detail::testing_forget_remote_models();
        pss::ParameterServerStrategy<> strategy;
        const pss::KerasTensor a = pss::Input({2}), b = pss::Input({3});
        pss::Model model(strategy, {a, b}, pss::Dense(1)(pss::Concatenate()({pss::Dense(2)(a), b})));
        model.compile("mse");
        const json valid{{"class_name", "Functional"}, {"config", model.get_config()},
                         {"loss", pss::serialize(pss::MeanSquaredError())}, {"metrics", json::array()},
                         {"weight_counts", {2, 0, 2}}};
        const pss::detail::ClosureContext context{0};
        const pss::detail::ClosureContext::Guard current(context);
        CHECK_NOTHROW(pss::detail::keras_remote_build("f", valid.dump(), model.weights()));
        // predictions 0 at zero weights: the loss of target 1 is 1
        model.set_weights({xt::xarray<float>(xt::zeros<float>({2, 2})), xt::xarray<float>(xt::zeros<float>({2})),
                           xt::xarray<float>(xt::zeros<float>({5, 1})), xt::xarray<float>(xt::zeros<float>({1}))});
        CHECK(pss::detail::keras_remote_step("f", {pss::Tensor(rows_f(1, 2, {1, 2})), pss::Tensor(rows_f(1, 3, {1, 0, 1}))},
                                             pss::Tensor(column_f({1})), pss::Tensor(xt::xarray<double>::from_shape({0})),
                                             0, 1.0) == std::vector<double>{1.0});
        auto rejects = [&](const std::function<void(json&)>& edit, const std::string& part) {
            json d = valid;
            edit(d);
            CAPTURE(part);
            CHECK_THROWS_WITH_AS(pss::detail::keras_remote_build("bad", d.dump(), model.weights()),
                                 doctest::Contains(part.c_str()), pss::InvalidArgumentError);
        };
        rejects([](json& d) { d["config"]["layers"][2]["inbound_nodes"][0][0][0] = "nowhere"; },
                "it is called on \"nowhere\", which is not an input or an earlier layer");
        rejects([](json& d) { std::swap(d["config"]["layers"][2], d["config"]["layers"][3]); },
                "which is not an input or an earlier layer");
        rejects([](json& d) { d["config"]["layers"][2]["config"]["batch_input_shape"] = json::array({nullptr, 5}); },
                "its batch_input_shape (5,) differs from its input's shape (2,)");
        rejects([](json& d) { d["weight_counts"] = json::array({2, 1, 1}); },
                "\"weight_counts\" gives 1 variables to \"concatenate\", a merge layer, which has none");
        rejects([](json& d) { d["config"]["output_layers"] = json::parse(R"([["dense", 0, 0]])"); },
                "it names the last layer, the one output");
        rejects([](json& d) { d["config"]["layers"][2]["inbound_nodes"][0][0][1] = 1; },
                "pss has no shared layers: node and tensor 0");
        rejects([](json& d) { d["config"]["input_layers"] = json::parse(R"([["input_1", 0, 0]])"); },
                "the InputLayer \"input_2\" is not in \"input_layers\"");
        std::size_t accepted = 0, rejected = 0;
        auto attempt = [&](const std::string& text) {
            try {
                pss::detail::keras_remote_build("m", text, model.weights());
                ++accepted;
            } catch (const pss::InvalidArgumentError&) {
                ++rejected;
            }
        };
        pss_test::for_each_mutated_text({valid.dump()}, "0123456789[]{},:\"-.e truefalsenull_inputdense\xff", 7, attempt);
        MESSAGE(accepted << " texts gave a model, " << rejected << " were rejected");
        CHECK(accepted + rejected == 20000);
        CHECK(rejected > 10000);
        pss::detail::testing_forget_remote_models();
    }
}

namespace {

/// A user's layer, as examples/custom_layer.cpp writes one: y = x * scale + offset per feature, scale
/// from ones and offset from zeros, in float32 or float64.
class TestScale final : public pss::Layer {
public:
    explicit TestScale(pss::DType dtype = pss::DType::float32) : dtype_(dtype) {}
    [[nodiscard]] std::unique_ptr<pss::Layer> clone() const override { return std::make_unique<TestScale>(*this); }
    [[nodiscard]] std::string_view class_name() const noexcept override { return "TestScale"; }
    [[nodiscard]] std::vector<pss::Variable> weights() const override {
        if (!built()) return {};
        return {scale_, offset_};
    }
    [[nodiscard]] pss::Shape compute_output_shape(const pss::Shape& input_shape) const override { return input_shape; }
    pss::Tensor forward(pss::Tensor inputs, std::uint64_t step) override {
        require_built("forward");
        return pss::detail::with_float_type(dtype_, [&]<class T>(std::type_identity<T>) {
            xt::xarray<T> x = pss::detail::take_as<T>(std::move(inputs));
            xt::xarray<T> scale, offset;
            scale_.read_into(scale, step);
            offset_.read_into(offset, step);
            xt::xarray<T> y = x * scale + offset;  // broadcast over the last axis
            inputs_ = pss::Tensor(std::move(x));
            scale_values_ = pss::Tensor(std::move(scale));
            return pss::Tensor(std::move(y));
        });
    }
    pss::LayerGradients backward(const pss::Tensor& grad_outputs) override {
        require_built("backward");
        return pss::detail::with_float_type(dtype_, [&]<class T>(std::type_identity<T>) {
            const xt::xarray<T>& x = inputs_.get<T>();
            const xt::xarray<T>& scale = scale_values_.get<T>();
            const xt::xarray<T> g = pss::detail::take_as<T>(pss::Tensor(grad_outputs));
            const std::size_t features = scale.size();
            const std::size_t rows = x.size() / features;
            xt::xarray<T> gx = g * scale;
            xt::xarray<T> gscale = xt::zeros<T>({features});
            xt::xarray<T> goffset = xt::zeros<T>({features});
            for (std::size_t r = 0; r < rows; ++r)
                for (std::size_t j = 0; j < features; ++j) {
                    gscale(j) += g.data()[r * features + j] * x.data()[r * features + j];
                    goffset(j) += g.data()[r * features + j];
                }
            pss::LayerGradients out;
            out.inputs = pss::Tensor(std::move(gx));
            out.variables.push_back({scale_, pss::Tensor(std::move(gscale)), {}, false});
            out.variables.push_back({offset_, pss::Tensor(std::move(goffset)), {}, false});
            return out;
        });
    }
    [[nodiscard]] json get_config() const override {
        json config = pss::Layer::get_config();
        config["dtype"] = std::string(pss::dtype_name(dtype_));
        return config;
    }
    static TestScale from_config(const json& config) {
        if (config.size() != 1) throw std::invalid_argument("TestScale's config has one field, dtype");
        return TestScale(config.at("dtype") == "float64" ? pss::DType::float64 : pss::DType::float32);
    }

protected:
    pss::Shape do_build(const pss::Shape& input_shape, std::mt19937& rng) override {
        const pss::Shape features{input_shape.back()};
        scale_ = pss::Variable(pss::initializers::Ones()(features, dtype_, rng), name() + "/scale");
        offset_ = pss::Variable(pss::initializers::Zeros()(features, dtype_, rng), name() + "/offset");
        return input_shape;
    }
    pss::Shape do_bind(const pss::Shape& input_shape, std::vector<pss::Variable> weights) override {
        const pss::Shape features{input_shape.back()};
        check_bind_weights(weights, {{"scale", features, dtype_}, {"offset", features, dtype_}});
        scale_ = std::move(weights[0]);
        offset_ = std::move(weights[1]);
        return input_shape;
    }

private:
    pss::DType dtype_;
    pss::Variable scale_, offset_;
    pss::Tensor inputs_, scale_values_;
};

/// A layer whose from_config throws what its config's "throw" asks for: "runtime" a std::runtime_error,
/// "pss" a pss::FailedPreconditionError, "int" an int; "null" gives a null pointer, "other" a layer of
/// another class; anything else a layer.
class Throwing final : public pss::Layer {
public:
    [[nodiscard]] std::unique_ptr<pss::Layer> clone() const override { return std::make_unique<Throwing>(*this); }
    [[nodiscard]] std::string_view class_name() const noexcept override { return "Throwing"; }
    pss::Tensor forward(pss::Tensor inputs, std::uint64_t /*step*/) override { return inputs; }
    pss::LayerGradients backward(const pss::Tensor& grad_outputs) override { return {grad_outputs, {}}; }
    static std::unique_ptr<pss::Layer> from_config(const json& config) {
        const std::string what = config.at("throw").get<std::string>();
        if (what == "runtime") throw std::runtime_error("no luck");
        if (what == "pss") throw pss::FailedPreconditionError("pss: not now");
        if (what == "int") throw 7;
        if (what == "null") return nullptr;
        if (what == "other") return std::make_unique<pss::Flatten>();
        return std::make_unique<Throwing>();
    }

protected:
    pss::Shape do_build(const pss::Shape& input_shape, std::mt19937& /*rng*/) override { return input_shape; }
    pss::Shape do_bind(const pss::Shape& input_shape, std::vector<pss::Variable> weights) override {
        check_bind_weights(weights, {});
        return input_shape;
    }
};

// Registered in this whole test program, as a user's program registers its classes: the unknown-class
// message of keras/config lists them.
const auto test_scale_registration = pss::register_layer<TestScale>("TestScale");
const auto throwing_registration = pss::register_layer<Throwing>();  // the name from Throwing().class_name()

/// A synchronous fit of 3 epochs of {TestScale, Dense(1)}; its losses, then every weight.
template <class StrategyType, class BeforeFit = std::nullptr_t>
std::vector<double> train_scale_sync(StrategyType& strategy, BeforeFit before_fit = nullptr) {
    xt::xarray<float> x = xt::xarray<float>::from_shape({12, 3});
    xt::xarray<float> y = xt::xarray<float>::from_shape({12, 1});
    for (std::size_t i = 0; i < 12; ++i) {
        for (std::size_t j = 0; j < 3; ++j) x(i, j) = static_cast<float>((i * (j + 2)) % 5) * 0.5f - 1.0f;
        y(i, 0) = 2 * x(i, 0) - x(i, 1) + 0.5f * x(i, 2) + 1;
    }
    pss::Sequential model(strategy, {TestScale(), pss::Dense(1)}, 7);
    model.compile(pss::SGD(0.1), "mse");
    model.build({3});
    if constexpr (!std::is_null_pointer_v<BeforeFit>) before_fit(model);
    const auto history = model.fit(x, y, 3, 3, true, false);
    std::vector<double> out(history.loss.begin(), history.loss.end());
    for (const auto& w : model.get_weights()) out.insert(out.end(), w.template get<float>().begin(), w.template get<float>().end());
    return out;
}

}  // namespace

TEST_SUITE("keras/registry") {
    TEST_CASE("register_layer: TestScale (float32 and float64) rebuilt from serialize(layer) through the registry computes the same values and gradients") {
        for (const pss::DType dtype : {pss::DType::float32, pss::DType::float64}) {
            CAPTURE(pss::dtype_name(dtype));
            ConfigStrategy strategy({}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
            TestScale scale(dtype);
            scale.set_name("scale_1");
            std::mt19937 rng(0);
            {
                auto scope = strategy.scope();
                (void)scale.build({2}, rng);
            }
            CHECK(pss::serialize(scale) ==
                  json{{"class_name", "TestScale"},
                       {"config", {{"name", "scale_1"}, {"batch_input_shape", {nullptr, 2}}, {"dtype", std::string(pss::dtype_name(dtype))}}}});
            scale.set_weights({xt::xarray<double>{2, -1}, xt::xarray<double>{0.5, 1}});
            const xt::xarray<double> x = {{1, 2}, {-1, 0.5}};
            const auto rebuilt = check_rebuilt_layer(scale, x, xt::xarray<double>{{1, -1}, {2, 0.5}});
            CHECK(rebuilt->weights().front().name() == "scale_1/scale:0");
            CHECK(D(rebuilt->forward(x)) == xt::xarray<double>{{2.5, -1}, {-1.5, 0.5}});
        }
        CHECK(test_scale_registration.class_name() == "TestScale");
        CHECK(throwing_registration.class_name() == "Throwing");
    }

    TEST_CASE("register_layer: a name registered already or a built-in class name throws AlreadyExistsError naming it") {
        CHECK_THROWS_WITH_AS((void)pss::register_layer<TestScale>("TestScale"),
                             "pss: register_layer: a layer class named \"TestScale\" is registered already; names "
                             "must be unique in a process",
                             pss::AlreadyExistsError);
        CHECK_THROWS_WITH_AS((void)pss::register_layer<TestScale>(),  // TestScale().class_name()
                             "pss: register_layer: a layer class named \"TestScale\" is registered already; names "
                             "must be unique in a process",
                             pss::AlreadyExistsError);
        for (const char* builtin : {"Dense", "Embedding", "GlobalAveragePooling1D", "Flatten", "Dropout", "Activation",
                                    "LayerNormalization", "Concatenate", "Add"}) {
            CAPTURE(builtin);
            CHECK_THROWS_WITH_AS((void)pss::register_layer<TestScale>(builtin),
                                 ("pss: register_layer: \"" + std::string(builtin) +
                                  "\" is a built-in layer class; a registered class needs a name of its own").c_str(),
                                 pss::AlreadyExistsError);
        }
        CHECK_THROWS_WITH_AS((void)pss::register_layer<TestScale>(""),
                             "pss: register_layer: the class name is empty; give the name L's class_name() returns",
                             pss::InvalidArgumentError);
        CHECK(pss::detail::registered_layer_classes() == std::vector<std::string>{"TestScale", "Throwing"});
    }

    TEST_CASE("register_layer: whatever from_config throws (std::runtime_error, a pss error, an int, a wrong field) is an InvalidArgumentError naming the class and the config") {
        auto config = [](const json& parameters) {
            json c = {{"name", "t"}, {"batch_input_shape", {nullptr, 2}}};
            c.update(parameters);
            return json{{"class_name", "Throwing"}, {"config", c}}.dump();
        };
        const std::string prefix = R"(pss: Throwing config {"batch_input_shape":[null,2],"name":"t",)";
        check_bad_layer_config(config({{"throw", "runtime"}}),
                               prefix + R"("throw":"runtime"}: the registered class's from_config threw: no luck)");
        check_bad_layer_config(config({{"throw", "pss"}}),
                               prefix + R"("throw":"pss"}: the registered class's from_config threw: pss: not now)");
        check_bad_layer_config(config({{"throw", "int"}}),
                               prefix + R"("throw":"int"}: the registered class's from_config threw something that )"
                                        R"(is not a std::exception)");
        check_bad_layer_config(config({{"throw", 3}}),  // nlohmann's type_error, from the class's own parsing
                               prefix + R"("throw":3}: the registered class's from_config threw: [json.exception.type_error.302] )"
                                        R"(type must be string, but is number)");
        check_bad_layer_config(config({{"throw", "null"}}),
                               prefix + R"("throw":"null"}: the registered class's from_config gave a null layer)");
        check_bad_layer_config(config({{"throw", "other"}}),
                               prefix + R"("throw":"other"}: the registered class's from_config gave a layer whose )"
                                        R"(class_name() is "Flatten"; register a class under the name its class_name() returns)");
        // Layer::get_config's fields are read by the rebuild itself, as for the built-in classes.
        check_bad_layer_config(R"({"class_name": "TestScale", "config": {"dtype": "float32", "batch_input_shape": [null, 2]}})",
                               R"(pss: TestScale config {"batch_input_shape":[null,2],"dtype":"float32"}: the field )"
                               R"("name" is missing; it has name, batch_input_shape and the parameters of its from_config)");
        check_bad_layer_config(R"({"class_name": "TestScale", "config": {"dtype": "float32", "name": "s", "batch_input_shape": [3]}})",
                               R"(pss: TestScale config {"batch_input_shape":[3],"dtype":"float32","name":"s"}: )"
                               R"("batch_input_shape" is [3], not a batch input shape: a list whose first item (the )"
                               R"(batch axis) is null, such as [null, 3])");
        const auto parsed = pss::detail::parse_layer_config(
            json::parse(R"({"class_name": "Throwing", "config": {"name": "t", "batch_input_shape": [null, 4], "throw": "no"}})"));
        CHECK(parsed.layer->class_name() == "Throwing");
        CHECK(parsed.layer->name() == "t");
        CHECK(parsed.input_shape == pss::Shape{4});
    }

    TEST_CASE("parse_layer_config: an unknown class's message lists the built-in classes, then the registered ones") {
        check_bad_layer_config(R"({"class_name": "Conv2D", "config": {}})",
                               R"(pss: layer {"class_name":"Conv2D","config":{}}: "class_name" is "Conv2D"; the layers a )"
                               R"(worker rebuilds are "Dense", "Embedding", "GlobalAveragePooling1D", "Flatten", "Dropout", )"
                               R"("Activation", "LayerNormalization", "Concatenate" and "Add"; registered: "TestScale" and )"
                               R"("Throwing")");
    }

    TEST_CASE("Sequential of a registered TestScale and Dense on worker processes trains to the bits of in-process workers") {
        const auto expected = check_worker_processes_train_alike(
            [](auto& strategy, auto before_fit) { return train_scale_sync(strategy, before_fit); });
        CHECK(expected.size() == 3 + 3 + 3 + 3 + 1);  // 3 losses; scale, offset, kernel (3, 1), bias
    }
}
