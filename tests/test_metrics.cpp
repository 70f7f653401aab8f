// tests/test_metrics.cpp: pss::metrics against Keras' documented examples, hand computations and
// references computed here on seeded random data; additivity of states; configs; error messages.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>

#include <pss/keras/metrics.hpp>

#include "mutated_texts.hpp"

namespace {

using json = nlohmann::json;
namespace metrics = pss::metrics;

xt::xarray<float> column_f(const std::vector<float>& values) {
    xt::xarray<float> out = xt::xarray<float>::from_shape({values.size(), std::size_t{1}});
    std::copy(values.begin(), values.end(), out.begin());
    return out;
}
xt::xarray<double> column_d(const std::vector<double>& values) {
    xt::xarray<double> out = xt::xarray<double>::from_shape({values.size(), std::size_t{1}});
    std::copy(values.begin(), values.end(), out.begin());
    return out;
}
xt::xarray<std::int32_t> column_i(const std::vector<std::int32_t>& values) {
    xt::xarray<std::int32_t> out = xt::xarray<std::int32_t>::from_shape({values.size(), std::size_t{1}});
    std::copy(values.begin(), values.end(), out.begin());
    return out;
}

/// A fresh state of `metric` with the batch added.
std::vector<double> state_of(const metrics::Metric& metric, const pss::Tensor& y, const pss::Tensor& p,
                             const std::vector<double>& weights = {}) {
    std::vector<double> state(metric.state_size(), 0.0);
    metric.accumulate(state, y, p, weights);
    return state;
}

/// The metric's value for one batch.
double value_of(const metrics::Metric& metric, const pss::Tensor& y, const pss::Tensor& p,
                const std::vector<double>& weights = {}) {
    return metric.result(state_of(metric, y, p, weights));
}

bool close(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(1.0, std::abs(b)); }

/// Rows [begin, end) of a (batch, ...) array.
template <class T>
xt::xarray<T> rows(const xt::xarray<T>& a, std::size_t begin, std::size_t end) {
    pss::Shape shape(a.shape().begin(), a.shape().end());
    const std::size_t width = pss::detail::row_elements(shape);
    shape[0] = end - begin;
    xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
    std::copy(a.data() + begin * width, a.data() + end * width, out.data());
    return out;
}

/// Seeded random data for the references.
struct Random {
    std::mt19937 rng;
    explicit Random(unsigned seed) : rng(seed) {}
    double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
    int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
    std::vector<double> weights(std::size_t n) {
        std::vector<double> w(n);
        for (auto& x : w) x = uniform(0.1, 2.0);
        return w;
    }
    xt::xarray<float> labels(std::size_t n, double p_positive) {
        xt::xarray<float> out = xt::xarray<float>::from_shape({n});
        for (auto& y : out) y = uniform(0, 1) < p_positive ? 1.0f : 0.0f;
        return out;
    }
};

/// The exact (rank-based, Mann-Whitney) weighted ROC AUC: the weighted fraction of (positive,
/// negative) pairs ordered correctly, ties counting half.
double mann_whitney_auc(const std::vector<double>& p, const std::vector<float>& y, const std::vector<double>& w) {
    double pairs = 0, positives = 0, negatives = 0;
    for (std::size_t i = 0; i < p.size(); ++i) (y[i] != 0 ? positives : negatives) += w[i];
    for (std::size_t i = 0; i < p.size(); ++i) {
        if (y[i] == 0) continue;
        for (std::size_t j = 0; j < p.size(); ++j) {
            if (y[j] != 0) continue;
            if (p[i] > p[j]) pairs += w[i] * w[j];
            else if (p[i] == p[j]) pairs += 0.5 * w[i] * w[j];
        }
    }
    return pairs / (positives * negatives);
}

/// Every metric with a batch it can take (binary targets, or class ids for SparseCategoricalAccuracy).
struct Case {
    std::shared_ptr<const metrics::Metric> metric;
    xt::xarray<float> y;
    xt::xarray<float> p;
};

std::vector<Case> every_metric_with_a_batch(std::size_t n) {
    Random r(7);
    xt::xarray<float> y = xt::xarray<float>::from_shape({n, std::size_t{2}});
    xt::xarray<float> p = xt::xarray<float>::from_shape({n, std::size_t{2}});
    for (auto& v : y) v = r.uniform(0, 1) < 0.4 ? 1.0f : 0.0f;
    for (auto& v : p) v = static_cast<float>(r.uniform(0, 1));
    xt::xarray<float> exact_p = xt::xarray<float>::from_shape({n, std::size_t{2}});
    for (std::size_t i = 0; i < exact_p.size(); ++i) exact_p.data()[i] = r.uniform(0, 1) < 0.7 ? y.data()[i] : 0.5f;
    xt::xarray<float> ids = xt::xarray<float>::from_shape({n});
    xt::xarray<float> scores = xt::xarray<float>::from_shape({n, std::size_t{4}});
    for (auto& v : ids) v = static_cast<float>(r.integer(0, 3));
    for (auto& v : scores) v = static_cast<float>(r.uniform(0, 1));
    return {
        {std::make_shared<metrics::Accuracy>(), y, exact_p},
        {std::make_shared<metrics::BinaryAccuracy>(0.3), y, p},
        {std::make_shared<metrics::SparseCategoricalAccuracy>(), ids, scores},
        {std::make_shared<metrics::AUC>(), y, p},
        {std::make_shared<metrics::AUC>(50, "PR"), y, p},
        {std::make_shared<metrics::AUC>(30, "PR", "minoring", "auc_pr_min", false), y, p},
        {std::make_shared<metrics::AUC>(200, "ROC", "majoring", "auc_logits", true), y, p},
        {std::make_shared<metrics::Precision>(0.6), y, p},
        {std::make_shared<metrics::Recall>(), y, p},
        {std::make_shared<metrics::MeanSquaredError>(), y, p},
        {std::make_shared<metrics::MeanAbsoluteError>(), y, p},
    };
}

}  // namespace

TEST_SUITE("keras/metrics") {
    TEST_CASE("Accuracy: Keras' example, targets [[1], [2], [3], [4]] and predictions [[0], [2], [3], [4]], gives 0.75; weights [1, 1, 0, 0] give 0.5") {
        const metrics::Accuracy accuracy;
        const auto y = column_f({1, 2, 3, 4});
        const auto p = column_f({0, 2, 3, 4});
        CHECK(value_of(accuracy, y, p) == 0.75);
        CHECK(value_of(accuracy, y, p, {1, 1, 0, 0}) == 0.5);
        CHECK(state_of(accuracy, y, p, {1, 1, 0, 0}) == std::vector<double>{1, 2});
        CHECK(accuracy.name() == "accuracy");
        CHECK(accuracy.class_name() == "Accuracy");
    }

    TEST_CASE("Accuracy: an example's weight counts for each of its values: [[1, 2], [3, 4]] against [[1, 0], [3, 4]] with weights [1, 3] is 7 / 8") {
        const metrics::Accuracy accuracy;
        const xt::xarray<float> y = {{1, 2}, {3, 4}};
        const xt::xarray<float> p = {{1, 0}, {3, 4}};
        CHECK(state_of(accuracy, y, p, {1, 3}) == std::vector<double>{7, 8});
        CHECK(value_of(accuracy, y, p, {1, 3}) == 0.875);
        CHECK(value_of(accuracy, y, p) == 0.75);
        SUBCASE("targets (4,) for predictions (2, 2): one per value, the batch axis first") {
            CHECK(value_of(accuracy, xt::xarray<float>{1, 2, 3, 4}, p) == 0.75);
        }
    }

    TEST_CASE("Accuracy: values compare in float32 as Keras casts them: float64 1 + 1e-9 equals target 1, 1 + 1e-6 does not") {
        const metrics::Accuracy accuracy;
        CHECK(value_of(accuracy, column_f({1, 1}), column_d({1 + 1e-9, 1 + 1e-6})) == 0.5);
        CHECK(value_of(accuracy, column_d({2, 3}), column_d({2, 3})) == 1.0);
        CHECK(value_of(accuracy, column_i({2, 3}), column_f({2, 4})) == 0.5);
    }

    TEST_CASE("BinaryAccuracy: Keras' example, [[1], [1], [0], [0]] against [[0.98], [1], [0], [0.6]], gives 0.75; weights [1, 0, 0, 1] give 0.5; threshold 0.7 gives 1") {
        const metrics::BinaryAccuracy binary;
        const auto y = column_f({1, 1, 0, 0});
        const auto p = column_f({0.98f, 1, 0, 0.6f});
        CHECK(value_of(binary, y, p) == 0.75);
        CHECK(value_of(binary, y, p, {1, 0, 0, 1}) == 0.5);
        CHECK(value_of(metrics::BinaryAccuracy(0.7), y, p) == 1.0);
        CHECK(binary.name() == "binary_accuracy");
        CHECK(binary.threshold() == 0.5);
        SUBCASE("a prediction equal to the threshold is negative: 0.5 is not > 0.5; the threshold is cast to float32, so 0.3f is not > 0.3") {
            CHECK(value_of(binary, column_f({0, 0}), column_f({0.5f, 0.5f})) == 1.0);
            CHECK(value_of(metrics::BinaryAccuracy(0.3), column_f({0, 1}), column_f({0.3f, 0.3000001f})) == 1.0);
        }
        SUBCASE("(batch, 2): each example's mean over its last axis, then the weighted mean: (1 * 0.5 + 3 * 1) / 4") {
            const xt::xarray<float> y2 = {{1, 0}, {0, 1}};
            const xt::xarray<float> p2 = {{0.9f, 0.8f}, {0.1f, 0.6f}};
            CHECK(state_of(binary, y2, p2, {1, 3}) == std::vector<double>{3.5, 4});
            CHECK(value_of(binary, y2, p2, {1, 3}) == 0.875);
        }
        SUBCASE("Keras' own argument order: BinaryAccuracy(\"accuracy\") is named accuracy with threshold 0.5") {
            const metrics::BinaryAccuracy named("accuracy");
            CHECK(named.name() == "accuracy");
            CHECK(named.threshold() == 0.5);
            CHECK(metrics::BinaryAccuracy("acc", 0.25).threshold() == 0.25);
        }
    }

    TEST_CASE("SparseCategoricalAccuracy: Keras' example, ids [[2], [1]] for [[0.1, 0.6, 0.3], [0.05, 0.95, 0]], gives 0.5; weights [0.7, 0.3] give 0.3") {
        const metrics::SparseCategoricalAccuracy sca;
        const xt::xarray<float> p = {{0.1f, 0.6f, 0.3f}, {0.05f, 0.95f, 0.0f}};
        CHECK(value_of(sca, column_f({2, 1}), p) == 0.5);
        CHECK(value_of(sca, xt::xarray<float>{2, 1}, p) == 0.5);
        CHECK(value_of(sca, column_f({2, 1}), p, {0.7, 0.3}) == doctest::Approx(0.3).epsilon(1e-15));
        CHECK(state_of(sca, column_f({2, 1}), p, {0.7, 0.3}) == std::vector<double>{0.3, 0.7 + 0.3});
        CHECK(sca.name() == "sparse_categorical_accuracy");
        SUBCASE("a tie goes to the first class; an id that is not a whole number matches nothing") {
            const xt::xarray<float> tie = {{0.5f, 0.5f}, {0.25f, 0.25f}, {1, 0}};
            CHECK(state_of(sca, xt::xarray<float>{0, 0, 0.5f}, tie) == std::vector<double>{2, 3});
        }
        SUBCASE("(batch, 2, classes): one id per row of scores, each row weighted by its example") {
            const xt::xarray<float> p3 = {{{0.9f, 0.1f}, {0.2f, 0.8f}}, {{0.3f, 0.7f}, {0.6f, 0.4f}}};
            const xt::xarray<float> ids = {{0, 0}, {1, 0}};
            CHECK(state_of(sca, ids, p3, {2, 5}) == std::vector<double>{2 + 10, 14});
        }
    }

    TEST_CASE("Precision and Recall: Keras' examples, [0, 1, 1, 1] against [1, 0, 1, 1], give 2/3; weights [0, 0, 1, 0] give 1") {
        const metrics::Precision precision;
        const metrics::Recall recall;
        const xt::xarray<float> y = {0, 1, 1, 1};
        const xt::xarray<float> p = {1, 0, 1, 1};
        CHECK(state_of(precision, y, p) == std::vector<double>{2, 1});
        CHECK(state_of(recall, y, p) == std::vector<double>{2, 1});
        CHECK(value_of(precision, y, p) == doctest::Approx(2.0 / 3.0).epsilon(1e-15));
        CHECK(value_of(recall, y, p) == doctest::Approx(2.0 / 3.0).epsilon(1e-15));
        CHECK(value_of(precision, y, p, {0, 0, 1, 0}) == 1.0);
        CHECK(value_of(recall, y, p, {0, 0, 1, 0}) == 1.0);
        CHECK(precision.name() == "precision");
        CHECK(recall.name() == "recall");
        SUBCASE("threshold 0.5: predictions [0.5, 0.7, 0.2] for [1, 0, 1]: precision 0, recall 0; threshold 0.1: 2/3 and 1") {
            const xt::xarray<float> y3 = {1, 0, 1};
            const xt::xarray<float> p3 = {0.5f, 0.7f, 0.2f};
            CHECK(state_of(precision, y3, p3) == std::vector<double>{0, 1});
            CHECK(state_of(recall, y3, p3) == std::vector<double>{0, 2});
            CHECK(value_of(metrics::Precision(0.1), y3, p3) == doctest::Approx(2.0 / 3.0).epsilon(1e-15));
            CHECK(value_of(metrics::Recall(0.1), y3, p3) == 1.0);
        }
        SUBCASE("a target is positive when it is not 0 (Keras casts it to bool): 0.3 and 2 are positives") {
            CHECK(state_of(recall, xt::xarray<float>{0.3f, 2, 0}, xt::xarray<float>{0.9f, 0.1f, 0.9f}) ==
                  std::vector<double>{1, 1});
            CHECK(state_of(precision, xt::xarray<float>{0.3f, 2, 0}, xt::xarray<float>{0.9f, 0.9f, 0.9f}) ==
                  std::vector<double>{2, 1});
        }
        SUBCASE("the threshold is cast to float32 as Keras' thresholds are: 0.3f is not > Precision(0.3)'s threshold") {
            CHECK(state_of(metrics::Precision(0.3), xt::xarray<float>{1, 0}, xt::xarray<float>{0.3f, 0.3000001f}) ==
                  std::vector<double>{0, 1});
            CHECK(state_of(metrics::Recall(0.3), xt::xarray<float>{1, 1}, xt::xarray<float>{0.3f, 0.3000001f}) ==
                  std::vector<double>{1, 1});
        }
    }

    TEST_CASE("AUC: Keras' example (num_thresholds 3, targets [0, 0, 1, 1], predictions [0, 0.5, 0.3, 0.9]): tp [2, 1, 0], fp [2, 0, 0], tn [0, 2, 2], fn [0, 1, 2]; ROC 0.75; weights [1, 0, 0, 1] give 1") {
        const metrics::AUC auc(3);
        const xt::xarray<float> y = {0, 0, 1, 1};
        const xt::xarray<float> p = {0, 0.5f, 0.3f, 0.9f};
        CHECK(auc.thresholds() == std::vector<double>{-1e-7, 0.5, 1 + 1e-7});
        CHECK(state_of(auc, y, p) == std::vector<double>{2, 1, 0, 2, 0, 0, 0, 2, 2, 0, 1, 2});
        CHECK(value_of(auc, y, p) == 0.75);
        CHECK(value_of(auc, y, p, {1, 0, 0, 1}) == 1.0);
        CHECK(auc.name() == "auc");
        CHECK(auc.state_size() == 12);
    }

    TEST_CASE("AUC: on Keras' example, ROC minoring 0.5 and majoring 1; PR minoring 0.25, majoring 1, and interpolation 1/2 + (1 + 2/3 ln 4) / 6 by hand") {
        const xt::xarray<float> y = {0, 0, 1, 1};
        const xt::xarray<float> p = {0, 0.5f, 0.3f, 0.9f};
        // fpr = [1, 0, 0], tpr = recall = [1, 1/2, 0], precision = [1/2, 1, 0 (0/0)].
        CHECK(value_of(metrics::AUC(3, "ROC", "minoring"), y, p) == 0.5);   // 1 * min(1, 1/2) + 0
        CHECK(value_of(metrics::AUC(3, "ROC", "majoring"), y, p) == 1.0);   // 1 * max(1, 1/2) + 0
        CHECK(value_of(metrics::AUC(3, "PR", "minoring"), y, p) == 0.25);   // 1/2 min(1/2, 1) + 1/2 min(1, 0)
        CHECK(value_of(metrics::AUC(3, "PR", "majoring"), y, p) == 1.0);    // 1/2 max(1/2, 1) + 1/2 max(1, 0)
        // Interpolation: between thresholds 0 and 1, dTP = 1, P goes 4 -> 1, slope 1/3, intercept
        // 1 - 1/3 = 2/3, area slope (dTP + intercept ln(4 / 1)) / (tp + fn = 2); between 1 and 2, dTP = 1,
        // P 1 -> 0, slope 1, intercept 0, P_B = 0 makes the ratio 1: area 1 * 1 / 2.
        const double expected = (1.0 / 3.0) * (1.0 + (2.0 / 3.0) * std::log(4.0)) / 2.0 + 0.5;
        CHECK(value_of(metrics::AUC(3, "PR"), y, p) == doctest::Approx(expected).epsilon(1e-15));
        CHECK(expected == doctest::Approx(0.82070).epsilon(1e-5));
    }

    TEST_CASE("AUC: thresholds() for num_thresholds 5 is Keras' [-1e-7, 0.25, 0.5, 0.75, 1 + 1e-7]; 2 gives [-1e-7, 1 + 1e-7]") {
        CHECK(metrics::AUC(5).thresholds() == std::vector<double>{-1e-7, 0.25, 0.5, 0.75, 1 + 1e-7});
        CHECK(metrics::AUC(2).thresholds() == std::vector<double>{-1e-7, 1 + 1e-7});
        CHECK(metrics::AUC().thresholds().size() == 200);
        CHECK(metrics::AUC().thresholds()[1] == 1.0 / 199.0);
        SUBCASE("num_thresholds 2: every prediction is positive at -1e-7, none at 1 + 1e-7; ROC 0.5") {
            const metrics::AUC auc(2);
            const xt::xarray<float> y = {1, 0, 1};
            const xt::xarray<float> p = {0.2f, 0.9f, 1};
            CHECK(state_of(auc, y, p) == std::vector<double>{2, 0, 1, 0, 0, 1, 0, 2});
            CHECK(value_of(auc, y, p) == 0.5);
        }
    }

    TEST_CASE("AUC: predictions outside [0, 1] are clipped (Keras' clip_by_value) and nan is positive at no threshold") {
        const metrics::AUC auc(3);
        // -0.5 -> 0: bucket 0 (positive at -1e-7 only); 1.5 -> 1: bucket 1; nan: no bucket.
        const xt::xarray<double> p = {-0.5, 1.5, std::numeric_limits<double>::quiet_NaN()};
        const xt::xarray<float> y = {0, 1, 1};
        CHECK(state_of(auc, y, p) == std::vector<double>{1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 2});
    }

    TEST_CASE("AUC: ROC on 300 seeded examples, each in its own threshold bin of 1001, equals the Mann-Whitney AUC to 1e-9, weighted and unweighted, float32 and float64") {
        constexpr std::size_t n = 300, bins = 1000;
        Random r(42);
        std::vector<std::size_t> bin(bins);
        std::iota(bin.begin(), bin.end(), std::size_t{0});
        std::shuffle(bin.begin(), bin.end(), r.rng);
        std::vector<double> p(n);
        std::vector<float> y(n);
        for (std::size_t i = 0; i < n; ++i) {
            p[i] = (static_cast<double>(bin[i]) + 0.5) / static_cast<double>(bins);  // the middle of bin[i]
            y[i] = r.uniform(0, 1) < 0.4 ? 1.0f : 0.0f;
        }
        const std::vector<double> w = r.weights(n);
        const std::vector<double> ones(n, 1.0);
        xt::xarray<double> p64 = xt::xarray<double>::from_shape({n, std::size_t{1}});
        std::copy(p.begin(), p.end(), p64.begin());
        const xt::xarray<float> p32 = xt::cast<float>(p64);
        const xt::xarray<float> yt = column_f(y);
        const metrics::AUC auc(static_cast<int>(bins) + 1);
        const double unweighted = mann_whitney_auc(p, y, ones);
        const double weighted = mann_whitney_auc(p, y, w);
        CHECK(unweighted > 0.3);  // random data: near 0.5, and the two differ
        CHECK(std::abs(unweighted - weighted) > 1e-4);
        CHECK(std::abs(value_of(auc, yt, p64) - unweighted) < 1e-9);
        CHECK(std::abs(value_of(auc, yt, p32) - unweighted) < 1e-9);
        CHECK(std::abs(value_of(auc, yt, p64, w) - weighted) < 1e-9);
        CHECK(std::abs(value_of(auc, yt, p32, w) - weighted) < 1e-9);
        SUBCASE("predictions sorted by label (a perfect ranking) give 1, reversed 0") {
            std::vector<double> perfect(n);
            for (std::size_t i = 0; i < n; ++i) perfect[i] = y[i] != 0 ? 0.75 + 0.2 * p[i] : 0.05 + 0.2 * p[i];
            xt::xarray<double> good = xt::xarray<double>::from_shape({n, std::size_t{1}});
            std::copy(perfect.begin(), perfect.end(), good.begin());
            CHECK(value_of(auc, yt, good) == doctest::Approx(1.0).epsilon(1e-12));
            CHECK(value_of(auc, yt, xt::xarray<double>(1.0 - good)) == doctest::Approx(0.0).epsilon(1e-12));
        }
    }

    TEST_CASE("AUC: the state on 300 seeded uniform predictions equals tp, fp, tn and fn counted by comparing each prediction with each of Keras' thresholds (weighted)") {
        constexpr std::size_t n = 300;
        Random r(3);
        xt::xarray<float> p = xt::xarray<float>::from_shape({n});
        for (auto& v : p) v = static_cast<float>(r.uniform(0, 1));
        const xt::xarray<float> y = r.labels(n, 0.5);
        const std::vector<double> w = r.weights(n);
        for (int num_thresholds : {2, 3, 10, 200}) {
            CAPTURE(num_thresholds);
            const metrics::AUC auc(num_thresholds);
            const std::vector<double> t = auc.thresholds();
            const auto k = static_cast<std::size_t>(num_thresholds);
            std::vector<double> expected(4 * k, 0.0);
            for (std::size_t j = 0; j < k; ++j)
                for (std::size_t i = 0; i < n; ++i) {
                    const bool predicted = p(i) > static_cast<float>(t[j]);
                    const bool actual = y(i) != 0;
                    const std::size_t part = predicted ? (actual ? 0 : 1) : (actual ? 3 : 2);  // tp, fp, tn, fn
                    expected[part * k + j] += w[i];
                }
            const std::vector<double> got = state_of(auc, y, p, w);
            REQUIRE(got.size() == expected.size());
            for (std::size_t i = 0; i < got.size(); ++i) {
                CAPTURE(i);
                CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-12));
            }
        }
    }

    TEST_CASE("AUC: from_logits applies a sigmoid first: logits log(p / (1 - p)) give the state of the probabilities p") {
        const xt::xarray<double> probabilities = {0.013, 0.2, 0.41, 0.5625, 0.77, 0.987};
        const xt::xarray<double> logits = xt::log(probabilities / (1.0 - probabilities));
        const xt::xarray<float> y = {0, 1, 0, 1, 1, 0};
        const metrics::AUC plain(10);
        const metrics::AUC from_logits(10, "ROC", "interpolation", "auc", true);
        CHECK(from_logits.from_logits());
        CHECK(state_of(from_logits, y, logits) == state_of(plain, y, probabilities));
        CHECK(state_of(plain, y, logits) != state_of(plain, y, probabilities));
    }

    TEST_CASE("MeanSquaredError and MeanAbsoluteError: Keras' examples, [[0, 1], [0, 0]] against [[1, 1], [0, 0]], give 0.25; weights [1, 0] give 0.5") {
        const metrics::MeanSquaredError mse;
        const metrics::MeanAbsoluteError mae;
        const xt::xarray<float> y = {{0, 1}, {0, 0}};
        const xt::xarray<float> p = {{1, 1}, {0, 0}};
        CHECK(value_of(mse, y, p) == 0.25);
        CHECK(value_of(mae, y, p) == 0.25);
        CHECK(value_of(mse, y, p, {1, 0}) == 0.5);
        CHECK(value_of(mae, y, p, {1, 0}) == 0.5);
        CHECK(mse.name() == "mean_squared_error");
        CHECK(mae.name() == "mean_absolute_error");
        SUBCASE("targets (2,) for predictions (2, 1), and predictions (2,): errors [-2, 1] give 2.5 and 1.5") {
            CHECK(value_of(mse, xt::xarray<float>{3, 1}, column_f({1, 2})) == 2.5);
            CHECK(value_of(mae, xt::xarray<float>{3, 1}, xt::xarray<float>{1, 2}) == 1.5);
        }
    }

    TEST_CASE("mean metrics on 300 seeded examples equal references computed here, weighted and unweighted (1e-12 relative)") {
        constexpr std::size_t n = 300;
        Random r(11);
        const std::vector<double> w = r.weights(n);
        const std::vector<double> ones(n, 1.0);
        auto weighted_mean = [&](const std::vector<double>& per_example, const std::vector<double>& weights) {
            double total = 0, count = 0;
            for (std::size_t i = 0; i < n; ++i) {
                total += weights[i] * per_example[i];
                count += weights[i];
            }
            return total / count;
        };
        SUBCASE("MeanSquaredError and MeanAbsoluteError: (300, 3) float64 predictions, float32 targets") {
            xt::xarray<double> p = xt::xarray<double>::from_shape({n, std::size_t{3}});
            xt::xarray<float> y = xt::xarray<float>::from_shape({n, std::size_t{3}});
            for (auto& v : p) v = r.uniform(-2, 2);
            for (auto& v : y) v = static_cast<float>(r.uniform(-2, 2));
            std::vector<double> squared(n), absolute(n);
            for (std::size_t i = 0; i < n; ++i) {
                for (std::size_t j = 0; j < 3; ++j) {
                    const double d = p(i, j) - static_cast<double>(y(i, j));
                    squared[i] += d * d / 3;
                    absolute[i] += std::abs(d) / 3;
                }
            }
            for (const auto* weights : {&ones, &w}) {
                const std::vector<double> given = weights == &ones ? std::vector<double>{} : *weights;
                CHECK(close(value_of(metrics::MeanSquaredError(), y, p, given), weighted_mean(squared, *weights), 1e-12));
                CHECK(close(value_of(metrics::MeanAbsoluteError(), y, p, given), weighted_mean(absolute, *weights), 1e-12));
            }
        }
        SUBCASE("Accuracy: (300, 2) whole numbers 0 to 2; BinaryAccuracy(0.3): (300, 2) uniform predictions, 0/1 targets") {
            xt::xarray<float> y = xt::xarray<float>::from_shape({n, std::size_t{2}});
            xt::xarray<float> p = xt::xarray<float>::from_shape({n, std::size_t{2}});
            for (auto& v : y) v = static_cast<float>(r.integer(0, 2));
            for (auto& v : p) v = static_cast<float>(r.integer(0, 2));
            xt::xarray<float> labels = xt::xarray<float>::from_shape({n, std::size_t{2}});
            xt::xarray<float> scores = xt::xarray<float>::from_shape({n, std::size_t{2}});
            for (auto& v : labels) v = r.uniform(0, 1) < 0.5 ? 1.0f : 0.0f;
            for (auto& v : scores) v = static_cast<float>(r.uniform(0, 1));
            std::vector<double> equal(n), binary(n);
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t j = 0; j < 2; ++j) {
                    equal[i] += (p(i, j) == y(i, j)) ? 0.5 : 0.0;
                    binary[i] += ((scores(i, j) > 0.3f) == (labels(i, j) == 1.0f)) ? 0.5 : 0.0;
                }
            for (const auto* weights : {&ones, &w}) {
                const std::vector<double> given = weights == &ones ? std::vector<double>{} : *weights;
                CHECK(close(value_of(metrics::Accuracy(), y, p, given), weighted_mean(equal, *weights), 1e-12));
                CHECK(close(value_of(metrics::BinaryAccuracy(0.3), labels, scores, given), weighted_mean(binary, *weights),
                            1e-12));
            }
            CHECK(weighted_mean(equal, ones) > 0.2);
            CHECK(weighted_mean(equal, ones) < 0.5);
        }
        SUBCASE("SparseCategoricalAccuracy: (300, 4) uniform scores, ids (300,) and (300, 1)") {
            xt::xarray<float> scores = xt::xarray<float>::from_shape({n, std::size_t{4}});
            for (auto& v : scores) v = static_cast<float>(r.uniform(0, 1));
            std::vector<float> ids(n);
            for (auto& v : ids) v = static_cast<float>(r.integer(0, 3));
            // Make a third of the rows right, so that the value is far from 1/4 and from 1.
            for (std::size_t i = 0; i < n; i += 3) scores(i, static_cast<std::size_t>(ids[i])) = 2.0f;
            std::vector<double> right(n);
            for (std::size_t i = 0; i < n; ++i) {
                const float* row = &scores(i, 0);
                right[i] = std::max_element(row, row + 4) - row == static_cast<std::ptrdiff_t>(ids[i]) ? 1.0 : 0.0;
            }
            xt::xarray<float> flat = xt::xarray<float>::from_shape({n});
            std::copy(ids.begin(), ids.end(), flat.begin());
            for (const auto* weights : {&ones, &w}) {
                const std::vector<double> given = weights == &ones ? std::vector<double>{} : *weights;
                CHECK(close(value_of(metrics::SparseCategoricalAccuracy(), flat, scores, given),
                            weighted_mean(right, *weights), 1e-12));
                CHECK(close(value_of(metrics::SparseCategoricalAccuracy(), column_f(ids), scores, given),
                            weighted_mean(right, *weights), 1e-12));
            }
            CHECK(weighted_mean(right, ones) > 0.4);
        }
        SUBCASE("Precision(0.3) and Recall(0.3): (300,) uniform predictions, 0/1 targets") {
            xt::xarray<float> p = xt::xarray<float>::from_shape({n});
            for (auto& v : p) v = static_cast<float>(r.uniform(0, 1));
            const xt::xarray<float> y = r.labels(n, 0.5);
            for (const auto* weights : {&ones, &w}) {
                const std::vector<double> given = weights == &ones ? std::vector<double>{} : *weights;
                double tp = 0, fp = 0, fn = 0;
                for (std::size_t i = 0; i < n; ++i) {
                    const bool predicted = p(i) > 0.3f;
                    if (predicted && y(i) == 1) tp += (*weights)[i];
                    if (predicted && y(i) == 0) fp += (*weights)[i];
                    if (!predicted && y(i) == 1) fn += (*weights)[i];
                }
                CHECK(close(value_of(metrics::Precision(0.3), y, p, given), tp / (tp + fp), 1e-12));
                CHECK(close(value_of(metrics::Recall(0.3), y, p, given), tp / (tp + fn), 1e-12));
            }
        }
    }

    TEST_CASE("every metric: the states of the two halves of a 301-example batch, added, give the whole batch's state and result, weighted and unweighted") {
        constexpr std::size_t n = 301, half = 150;
        Random r(5);
        const std::vector<double> w = r.weights(n);
        for (const Case& c : every_metric_with_a_batch(n)) {
            const auto& [metric, y, p] = c;
            CAPTURE(metrics::serialize(*c.metric).dump());
            for (const bool weighted : {false, true}) {
                CAPTURE(weighted);
                const std::vector<double> all = weighted ? w : std::vector<double>{};
                const std::vector<double> first = weighted ? std::vector<double>(w.begin(), w.begin() + half) : all;
                const std::vector<double> second = weighted ? std::vector<double>(w.begin() + half, w.end()) : all;
                const std::vector<double> whole = state_of(*metric, y, p, all);
                std::vector<double> sum = state_of(*metric, rows(y, 0, half), rows(p, 0, half), first);
                metric->accumulate(sum, rows(y, half, n), rows(p, half, n), second);
                REQUIRE(sum.size() == whole.size());
                for (std::size_t i = 0; i < sum.size(); ++i) CHECK(close(sum[i], whole[i], 1e-12));
                const double value = metric->result(whole);
                CHECK(close(metric->result(sum), value, 1e-12));
                CHECK(value > 0.05);  // the batch counts: a value of 0 would hide a state that adds nothing
            }
        }
    }

    TEST_CASE("every metric: result of a zero state is 0 (Keras' divide_no_nan), and an empty batch (0, 2) adds nothing") {
        for (const Case& c : every_metric_with_a_batch(4)) {
            const auto& [metric, y, p] = c;
            CAPTURE(c.metric->name());
            const std::vector<double> zeros(metric->state_size(), 0.0);
            CHECK(metric->result(zeros) == 0.0);
            CHECK(state_of(*metric, rows(y, 0, 0), rows(p, 0, 0)) == zeros);
            CHECK(metric->result() == 0.0);
        }
    }

    TEST_CASE("Metric: update_state twice gives the state of both batches in one; result() is its value; reset_state gives 0; clone keeps config and state") {
        metrics::AUC auc(3);
        const xt::xarray<float> y = {0, 0, 1, 1};
        const xt::xarray<float> p = {0, 0.5f, 0.3f, 0.9f};
        CHECK(auc.result() == 0.0);
        auc.update_state(rows(y, 0, 2), rows(p, 0, 2));
        auc.update_state(rows(y, 2, 4), rows(p, 2, 4));
        CHECK(auc.result() == 0.75);
        const std::unique_ptr<metrics::Metric> copy = auc.clone();
        CHECK(copy->class_name() == "AUC");
        CHECK(metrics::serialize(*copy) == metrics::serialize(auc));
        CHECK(copy->result() == 0.75);
        auc.reset_state();
        CHECK(auc.result() == 0.0);
        CHECK(copy->result() == 0.75);
        auc.update_state(y, p, std::vector<double>{1, 0, 0, 1});
        CHECK(auc.result() == 1.0);
        SUBCASE("a batch that throws leaves the held state as it was") {
            CHECK_THROWS_AS(auc.update_state(y, p, std::vector<double>{1, 2}), pss::InvalidArgumentError);
            CHECK(auc.result() == 1.0);
        }
        SUBCASE("the same through a Metric&") {
            metrics::Metric& m = *copy;
            m.update_state(y, p);
            CHECK(m.result() == 0.75);
        }
    }

    TEST_CASE("serialize: each metric with its parameters is {\"class_name\": ..., \"config\": {\"name\": ..., Keras' keys}}; from_config rebuilds it with the same results") {
        const std::vector<std::pair<std::shared_ptr<const metrics::Metric>, json>> cases = {
            {std::make_shared<metrics::Accuracy>("acc"), R"({"class_name": "Accuracy", "config": {"name": "acc"}})"_json},
            {std::make_shared<metrics::BinaryAccuracy>(0.25, "bin"),
             R"({"class_name": "BinaryAccuracy", "config": {"name": "bin", "threshold": 0.25}})"_json},
            {std::make_shared<metrics::SparseCategoricalAccuracy>(),
             R"({"class_name": "SparseCategoricalAccuracy", "config": {"name": "sparse_categorical_accuracy"}})"_json},
            {std::make_shared<metrics::AUC>(),
             R"({"class_name": "AUC", "config": {"name": "auc", "num_thresholds": 200, "curve": "ROC",
                 "summation_method": "interpolation", "from_logits": false}})"_json},
            {std::make_shared<metrics::AUC>(50, "pr", "Majoring", "my auc", true),
             R"({"class_name": "AUC", "config": {"name": "my auc", "num_thresholds": 50, "curve": "PR",
                 "summation_method": "majoring", "from_logits": true}})"_json},
            {std::make_shared<metrics::Precision>(0.75, "p75"),
             R"({"class_name": "Precision", "config": {"name": "p75", "thresholds": 0.75}})"_json},
            {std::make_shared<metrics::Recall>(), R"({"class_name": "Recall", "config": {"name": "recall", "thresholds": 0.5}})"_json},
            {std::make_shared<metrics::MeanSquaredError>("mse"),
             R"({"class_name": "MeanSquaredError", "config": {"name": "mse"}})"_json},
            {std::make_shared<metrics::MeanAbsoluteError>(),
             R"({"class_name": "MeanAbsoluteError", "config": {"name": "mean_absolute_error"}})"_json},
        };
        const auto batches = every_metric_with_a_batch(40);
        for (const auto& named_case : cases) {
            const auto& [metric, expected] = named_case;
            CAPTURE(named_case.second.dump());
            const json serialized = metrics::serialize(*metric);
            CHECK(serialized == expected);
            // Through text, as a worker receives it.
            const std::unique_ptr<metrics::Metric> rebuilt = metrics::from_config(json::parse(serialized.dump()));
            CHECK(rebuilt->class_name() == metric->class_name());
            CHECK(rebuilt->name() == metric->name());
            CHECK(metrics::serialize(*rebuilt) == serialized);
            for (const auto& [other, y, p] : batches)
                if (other->class_name() == metric->class_name()) {
                    const double value = value_of(*metric, y, p);
                    CHECK(value_of(*rebuilt, y, p) == value);
                }
        }
    }

    TEST_CASE("from_config: a malformed config throws naming the field and its value") {
        const auto check = [](const std::string& text, const std::string& message) {
            CAPTURE(text);
            CHECK_THROWS_WITH_AS((void)metrics::from_config(json::parse(text)), message.c_str(), pss::InvalidArgumentError);
        };
        check(R"([1])", "pss: metric [1]: it is array, not an object with class_name and config");
        check(R"({"class_name": "F1", "config": {}})",
              "pss: metric {\"class_name\":\"F1\",\"config\":{}}: \"class_name\" is \"F1\"; the metrics are \"Accuracy\", "
              "\"BinaryAccuracy\", \"SparseCategoricalAccuracy\", \"AUC\", \"Precision\", \"Recall\", "
              "\"MeanSquaredError\" and \"MeanAbsoluteError\"");
        check(R"({"class_name": "Accuracy"})",
              "pss: metric {\"class_name\":\"Accuracy\"}: the field \"config\" is missing; it has class_name and config");
        check(R"({"class_name": "Accuracy", "config": {"name": "accuracy"}, "module": "keras.metrics"})",
              "pss: metric {\"class_name\":\"Accuracy\",\"config\":{\"name\":\"accuracy\"},\"module\":\"keras.metrics\"}: "
              "the field \"module\" is not known; it has class_name and config");
        check(R"({"class_name": "Accuracy", "config": {"name": "accuracy", "dtype": "float32"}})",
              "pss: Accuracy config {\"dtype\":\"float32\",\"name\":\"accuracy\"}: the field \"dtype\" is not known; it has name");
        check(R"({"class_name": "MeanSquaredError", "config": {"name": 3}})",
              "pss: MeanSquaredError config {\"name\":3}: \"name\" is 3, not a string");
        check(R"({"class_name": "BinaryAccuracy", "config": {"name": "b", "threshold": "0.5"}})",
              "pss: BinaryAccuracy config {\"name\":\"b\",\"threshold\":\"0.5\"}: \"threshold\" is \"0.5\", not a number");
        // JSON text cannot hold inf (the parser rejects 1e400), but a json value built in memory can.
        const json infinite = {{"class_name", "BinaryAccuracy"},
                               {"config", {{"name", "b"}, {"threshold", std::numeric_limits<double>::infinity()}}}};
        CHECK_THROWS_WITH_AS((void)metrics::from_config(infinite),
                             "pss: BinaryAccuracy config {\"name\":\"b\",\"threshold\":null}: \"threshold\" is inf; it is a "
                             "finite number (Keras' default 0.5)",
                             pss::InvalidArgumentError);
        check(R"({"class_name": "Precision", "config": {"name": "p", "thresholds": 1.5}})",
              "pss: Precision config {\"name\":\"p\",\"thresholds\":1.5}: \"thresholds\" is 1.5; a threshold is in [0, 1] "
              "(Keras' default 0.5)");
        check(R"({"class_name": "Recall", "config": {"name": "r", "thresholds": null}})",
              "pss: Recall config {\"name\":\"r\",\"thresholds\":null}: \"thresholds\" is null, not a number");
        const std::string auc = R"({"class_name": "AUC", "config": {"name": "auc", "num_thresholds": NT, "curve": "CURVE",
                                    "summation_method": "METHOD", "from_logits": LOGITS}})";
        const auto auc_config = [&](std::string nt, std::string curve, std::string method, std::string logits) {
            std::string text = auc;
            text.replace(text.find("NT"), 2, nt);
            text.replace(text.find("CURVE"), 5, curve);
            text.replace(text.find("METHOD"), 6, method);
            text.replace(text.find("LOGITS"), 6, logits);
            return text;
        };
        const auto auc_object = [](std::string nt, std::string curve, std::string method, std::string logits) {
            return "{\"curve\":\"" + curve + "\",\"from_logits\":" + logits + ",\"name\":\"auc\",\"num_thresholds\":" + nt +
                   ",\"summation_method\":\"" + method + "\"}";
        };
        check(auc_config("1", "ROC", "interpolation", "false"),
              "pss: AUC config " + auc_object("1", "ROC", "interpolation", "false") +
                  ": \"num_thresholds\" is 1; it is at least 2");
        check(auc_config("2.5", "ROC", "interpolation", "false"),
              "pss: AUC config " + auc_object("2.5", "ROC", "interpolation", "false") +
                  ": \"num_thresholds\" is 2.5, not a whole number");
        check(auc_config("1048577", "ROC", "interpolation", "false"),
              "pss: AUC config " + auc_object("1048577", "ROC", "interpolation", "false") +
                  ": \"num_thresholds\" is 1048577; an AUC has 2 to 1048576 thresholds (Keras' default 200)");
        check(auc_config("200", "XY", "interpolation", "false"),
              "pss: AUC config " + auc_object("200", "XY", "interpolation", "false") +
                  ": \"curve\" is \"XY\"; it is \"ROC\" or \"PR\"");
        check(auc_config("200", "PR", "trapezoid", "false"),
              "pss: AUC config " + auc_object("200", "PR", "trapezoid", "false") +
                  ": \"summation_method\" is \"trapezoid\"; it is \"interpolation\", \"minoring\" or \"majoring\"");
        check(auc_config("200", "PR", "minoring", "0"),
              "pss: AUC config " + auc_object("200", "PR", "minoring", "0") + ": \"from_logits\" is 0, not true or false");
        check(R"({"class_name": "AUC", "config": {"name": "auc", "num_thresholds": 200, "curve": "ROC", "summation_method": "interpolation"}})",
              "pss: AUC config {\"curve\":\"ROC\",\"name\":\"auc\",\"num_thresholds\":200,\"summation_method\":\"interpolation\"}: "
              "the field \"from_logits\" is missing; it has name, num_thresholds, curve, summation_method and from_logits");
        // Keras' lower-case spellings are taken, and written back canonical.
        CHECK(metrics::serialize(*metrics::from_config(json::parse(auc_config("7", "pr", "Minoring", "true")))) ==
              json::parse(auc_config("7", "PR", "minoring", "true")));
    }

    TEST_CASE("get: Keras' names and the class names give each metric with Keras' defaults; \"f1\" throws listing the names") {
        const std::vector<std::pair<std::string, std::string>> names = {
            {"accuracy", "Accuracy"},
            {"acc", "Accuracy"},
            {"binary_accuracy", "BinaryAccuracy"},
            {"sparse_categorical_accuracy", "SparseCategoricalAccuracy"},
            {"auc", "AUC"},
            {"precision", "Precision"},
            {"recall", "Recall"},
            {"mse", "MeanSquaredError"},
            {"mean_squared_error", "MeanSquaredError"},
            {"mae", "MeanAbsoluteError"},
            {"mean_absolute_error", "MeanAbsoluteError"},
            {"AUC", "AUC"},
            {"BinaryAccuracy", "BinaryAccuracy"},
        };
        for (const auto& entry : names) {
            CAPTURE(entry.first);
            CHECK(metrics::get(entry.first)->class_name() == entry.second);
        }
        CHECK(metrics::get("acc")->name() == "accuracy");
        CHECK(metrics::get("mse")->name() == "mean_squared_error");
        CHECK(metrics::serialize(*metrics::get("auc")) == metrics::serialize(metrics::AUC()));
        CHECK(metrics::serialize(*metrics::get("precision")) == metrics::serialize(metrics::Precision()));
        CHECK_THROWS_WITH_AS((void)metrics::get("f1"),
                             "pss: metric \"f1\" is not known; use \"accuracy\" (or \"acc\"), \"binary_accuracy\", "
                             "\"sparse_categorical_accuracy\", \"auc\", \"precision\", \"recall\", \"mean_squared_error\" "
                             "(or \"mse\") or \"mean_absolute_error\" (or \"mae\"), or pass a pss::metrics::Metric object",
                             pss::InvalidArgumentError);
    }

    TEST_CASE("constructors: an empty name gives Keras' default; bad parameters throw naming the parameter and its value") {
        CHECK(metrics::AUC(200, "ROC", "interpolation", "").name() == "auc");
        CHECK(metrics::MeanSquaredError("").name() == "mean_squared_error");
        CHECK(metrics::AUC(200, "roc", "Interpolation").curve() == "ROC");
        CHECK(metrics::AUC(200, "roc", "Interpolation").summation_method() == "interpolation");
        CHECK(metrics::AUC(1 << 20).num_thresholds() == std::size_t{1} << 20);
        CHECK_THROWS_WITH_AS((void)metrics::AUC(1),
                             "pss: AUC: \"num_thresholds\" is 1; an AUC has 2 to 1048576 thresholds (Keras' default 200)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)metrics::AUC((1 << 20) + 1),
                             "pss: AUC: \"num_thresholds\" is 1048577; an AUC has 2 to 1048576 thresholds (Keras' default 200)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)metrics::AUC(200, "Roc"), "pss: AUC: \"curve\" is \"Roc\"; it is \"ROC\" or \"PR\"",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)metrics::AUC(200, "PR", "riemann"),
                             "pss: AUC: \"summation_method\" is \"riemann\"; it is \"interpolation\", \"minoring\" or \"majoring\"",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)metrics::Precision(1.5),
                             "pss: Precision: \"thresholds\" is 1.5; a threshold is in [0, 1] (Keras' default 0.5)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)metrics::Recall(-0.25),
                             "pss: Recall: \"thresholds\" is -0.25; a threshold is in [0, 1] (Keras' default 0.5)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)metrics::Recall(std::nan("")),
                             "pss: Recall: \"thresholds\" is nan; a threshold is in [0, 1] (Keras' default 0.5)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)metrics::BinaryAccuracy(std::numeric_limits<double>::infinity()),
                             "pss: BinaryAccuracy: \"threshold\" is inf; it is a finite number (Keras' default 0.5)",
                             pss::InvalidArgumentError);
        CHECK_NOTHROW((void)metrics::Precision(0.0));
        CHECK_NOTHROW((void)metrics::Recall(1.0));
        CHECK_NOTHROW((void)metrics::BinaryAccuracy(-3.0));
    }

    TEST_CASE("accumulate: bad inputs throw naming the metric, what it expects and what it got") {
        const metrics::AUC auc;
        std::vector<double> state(auc.state_size(), 0.0);
        const xt::xarray<float> y = column_f({1, 0, 1, 0});
        const xt::xarray<float> p = column_f({0.9f, 0.2f, 0.6f, 0.4f});
        CHECK_THROWS_WITH_AS(auc.accumulate(state, y, column_i({1, 0, 1, 0})),
                             "pss: AUC \"auc\": predictions of dtype int32; a metric takes float32 or float64 predictions",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(auc.accumulate(state, pss::Tensor(), p), "pss: AUC \"auc\": an empty tensor of targets",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(auc.accumulate(state, y, pss::Tensor()), "pss: AUC \"auc\": an empty tensor of predictions",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(auc.accumulate(state, xt::xarray<std::string>{"1", "0", "1", "0"}, p),
                             "pss: AUC \"auc\": targets of dtype string; targets are numbers (float32, float64, int32 or int64)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(auc.accumulate(state, xt::xarray<float>{1, 0, 1}, p),
                             "pss: AUC \"auc\": 3 targets for predictions of shape (4, 1); give one target per prediction, "
                             "batch axis first",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(auc.accumulate(state, y, p, std::vector<double>{1, 2, 3}),
                             "pss: AUC \"auc\": 3 sample weights for a batch of 4 examples; give one weight per example, or none",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(auc.accumulate(std::span<double>(state).first(799), y, p),
                             "pss: AUC \"auc\": a state of 799 doubles; its state has 800 (state_size())",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS((void)auc.result(std::vector<double>(4, 0.0)),
                             "pss: AUC \"auc\": a state of 4 doubles; its state has 800 (state_size())",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(auc.accumulate(state, xt::xarray<float>(0.5f), xt::xarray<float>(0.5f)),
                             "pss: AUC \"auc\": predictions of shape (); give a batch axis first: (batch, ...)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(auc.accumulate(state, xt::xarray<float>::from_shape({0}),
                                            xt::xarray<float>::from_shape({3, 0})),
                             "pss: AUC \"auc\": predictions of shape (3, 0); give at least one value per example",
                             pss::InvalidArgumentError);
        CHECK(state == std::vector<double>(auc.state_size(), 0.0));  // nothing was added by the failed calls

        const metrics::SparseCategoricalAccuracy sca("top1");
        std::vector<double> two(2, 0.0);
        CHECK_THROWS_WITH_AS(sca.accumulate(two, xt::xarray<float>{1, 0, 2}, xt::xarray<float>{{0.1f, 0.9f}, {0.8f, 0.2f}}),
                             "pss: SparseCategoricalAccuracy \"top1\": 3 targets for predictions of shape (2, 2); give one "
                             "class id per row of class scores: (batch,) or (batch, 1) for predictions (batch, classes)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(sca.accumulate(two, xt::xarray<float>{1, 0}, xt::xarray<float>{0.1f, 0.9f}),
                             "pss: SparseCategoricalAccuracy \"top1\": predictions of shape (2,); give class scores, (batch, classes)",
                             pss::InvalidArgumentError);
        CHECK_THROWS_WITH_AS(metrics::MeanSquaredError().accumulate(two, column_f({1, 2}), column_f({1, 2, 3})),
                             "pss: MeanSquaredError \"mean_squared_error\": 2 targets for predictions of shape (3, 1); give "
                             "one target per prediction, batch axis first",
                             pss::InvalidArgumentError);
        CHECK(two == std::vector<double>{0, 0});
    }

    TEST_CASE("targets of any numeric dtype count as their values: int32, int64, float64 and float32 targets give one state") {
        const xt::xarray<float> p = column_f({0.9f, 0.2f, 0.6f, 0.4f, 0.7f});
        const std::vector<double> w = {1, 2, 0.5, 1, 3};
        for (const Case& c : every_metric_with_a_batch(1)) {
            const auto& metric = c.metric;
            if (metric->class_name() == "SparseCategoricalAccuracy") continue;
            CAPTURE(metric->name());
            const auto expected = state_of(*metric, column_f({1, 0, 0, 1, 1}), p, w);
            CHECK(state_of(*metric, column_i({1, 0, 0, 1, 1}), p, w) == expected);
            CHECK(state_of(*metric, xt::xarray<std::int64_t>{1, 0, 0, 1, 1}, p, w) == expected);
            CHECK(state_of(*metric, column_d({1, 0, 0, 1, 1}), p, w) == expected);
        }
    }

    TEST_CASE("metrics::from_config: 20000 mutated JSON texts, as a worker receives them, give a metric that counts a batch or InvalidArgumentError, nothing else") {
        std::vector<std::string> valid;
        for (const auto& m : std::vector<std::shared_ptr<metrics::Metric>>{
                 std::make_shared<metrics::AUC>(50, "PR", "majoring", "pr auc", true), std::make_shared<metrics::AUC>(),
                 std::make_shared<metrics::BinaryAccuracy>(0.25), std::make_shared<metrics::Precision>(0.7),
                 std::make_shared<metrics::Recall>(), std::make_shared<metrics::SparseCategoricalAccuracy>(),
                 std::make_shared<metrics::MeanAbsoluteError>("m a e")})
            valid.push_back(metrics::serialize(*m).dump());
        const xt::xarray<double> y_true = column_d({1, 0, 1});
        const xt::xarray<double> y_pred = column_d({0.8, 0.3, 0.4});
        std::size_t accepted = 0, rejected = 0;
        auto attempt = [&](const std::string& text) {
            CAPTURE(text);
            std::unique_ptr<metrics::Metric> metric;
            try {  // as a worker: the text, then the config
                metric = metrics::from_config(pss::detail::parse_config_text(text, "metric config"));
            } catch (const pss::InvalidArgumentError&) {
                ++rejected;
                return;
            }
            ++accepted;
            std::vector<double> state(metric->state_size(), 0.0);
            if (metric->class_name() == "SparseCategoricalAccuracy") return;  // takes class scores, not these
            metric->accumulate(state, y_true, y_pred);
            CHECK(std::isfinite(metric->result(state)));
        };
        for (const auto& text : valid) CHECK_NOTHROW(attempt(text));
        CHECK(accepted == valid.size());
        pss_test::for_each_mutated_text(valid, "0123456789[]{},:\"-.e truefalsenullROCPR\xff", 7, attempt);
        MESSAGE(accepted << " texts gave a metric, " << rejected << " were rejected");
        CHECK(accepted + rejected == valid.size() + 20000);
        CHECK(accepted > valid.size());  // some edits keep a valid config (a digit for a digit)
        CHECK(rejected > 10000);
    }
}
