// pss/keras/metrics.hpp: Keras metrics (Accuracy, BinaryAccuracy, SparseCategoricalAccuracy, AUC, Precision, Recall, MeanSquaredError, MeanAbsoluteError) with additive states that workers' batches sum.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xoperation.hpp>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/keras/config.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// A number for a message: JSON's shortest text ("0.5", "1e-07"), or nan, inf and -inf (which JSON
/// would print as null).
[[nodiscard]] inline std::string metric_number_text(double value) {
    if (std::isnan(value)) return "nan";
    if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
    return nlohmann::json(value).dump();
}

/// The number in field `key` of a metric's config (any JSON number; JSON has no nan or inf).
/// @throws InvalidArgumentError `pss: <what> <object>: "threshold" is "0.5", not a number`
[[nodiscard]] inline double metric_config_number(ConfigFields& fields, const std::string& key) {
    const nlohmann::json& value = fields.take(key);
    if (!value.is_number()) fields.fail("\"" + key + "\" is " + json_text(value) + ", not a number");
    return value.get<double>();
}

/// Keras' `tf.math.divide_no_nan`: 0 where the denominator is 0.
[[nodiscard]] inline double divide_no_nan(double numerator, double denominator) noexcept {
    return denominator == 0 ? 0.0 : numerator / denominator;
}

/// One batch as a metric sees it: `examples` along the batch axis, `per_example` prediction values each,
/// and a weight per example (none: every weight is 1).
struct MetricBatch {
    std::size_t examples = 0;
    std::size_t per_example = 1;
    std::span<const double> weights;

    /// The weight of the example that holds the prediction value at flat index `element`.
    [[nodiscard]] double weight(std::size_t element) const noexcept {
        return weights.empty() ? 1.0 : weights[element / per_example];
    }
};

}  // namespace detail

namespace metrics {

/// @brief A Keras metric (tf.keras.metrics.Metric) as pss computes it across workers: a batch adds to
/// an additive state (sums and counts, state_size() doubles), the chief adds the workers' states
/// elementwise, and result() reduces a state to the metric's value.
///
/// A metric object is stateless through this interface (accumulate and result take the state), so one
/// object serves every worker at once. Keras' stateful use (update_state, result, reset_state) works on a
/// state the object holds. Every state is additive: the state of a whole batch is the elementwise sum of
/// the states of its parts, so a result does not depend on how batches were split between workers.
///
/// Predictions are float32 or float64 tensors of shape (batch, ...); targets are numbers (float32
/// usually), converted to the predictions' dtype as Loss::in_dtype does. Where Keras decides something
/// per value (equality, a threshold, an argmax), the values are compared in float32, as Keras' default
/// metric dtype does. Weights are one per example (Keras' `sample_weight` of shape (batch,)), broadcast
/// over that example's values.
///
/// @par Example
/// @code
/// pss::metrics::AUC auc;
/// auc.update_state(y_true, y_pred);
/// double value = auc.result();
/// @endcode
class Metric {
public:
    PSS_INLINE virtual ~Metric();  // the key function (see PSS_INLINE)

    /// @brief Keras' class name: "AUC", "BinaryAccuracy", ...
    [[nodiscard]] virtual std::string_view class_name() const noexcept = 0;

    /// @brief The metric's name, the key of its value in logs: Keras' default ("auc", "accuracy", ...)
    /// unless the constructor's `name` gave another (an empty name gives the default, as in Keras).
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    /// @brief The number of doubles of a state.
    [[nodiscard]] virtual std::size_t state_size() const = 0;

    /// @brief Adds the batch's contribution to `state` (state_size() doubles); `state` is unchanged when
    /// this throws.
    /// @param sample_weight an empty span (every example weighs 1), or one weight per example (batch axis)
    /// @throws InvalidArgumentError naming the metric for a state of another size, an empty tensor,
    /// predictions that are not float32 or float64 or have no batch axis, string targets, a number of
    /// targets that does not fit the predictions, or a number of weights other than the batch's:
    /// `pss: AUC "auc": 3 sample weights for a batch of 4 examples; give one weight per example, or none`
    virtual void accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                            std::span<const double> sample_weight = {}) const = 0;

    /// @brief The metric's value for `state`; 0 when nothing was counted (Keras' divide_no_nan).
    /// @throws InvalidArgumentError for a state whose size is not state_size().
    [[nodiscard]] virtual double result(std::span<const double> state) const = 0;

    /// @brief Keras' `get_config()`: `{"name": "auc"}` plus the metric's parameters under Keras' keys
    /// (`"num_thresholds"`, `"curve"`, ...). from_config rebuilds the metric from serialize(metric).
    [[nodiscard]] virtual nlohmann::json get_config() const { return {{"name", name_}}; }

    /// @brief A copy of the metric, of its dynamic type, with its held state.
    [[nodiscard]] virtual std::unique_ptr<Metric> clone() const = 0;

    /// @brief Keras' `update_state(y_true, y_pred, sample_weight)`: accumulate into the held state.
    /// @throws InvalidArgumentError as accumulate (the held state is unchanged then).
    void update_state(const Tensor& y_true, const Tensor& y_pred, std::span<const double> sample_weight = {}) {
        if (state_.size() != state_size()) state_.assign(state_size(), 0.0);
        accumulate(state_, y_true, y_pred, sample_weight);
    }
    /// @brief Keras' `result()`: the value of the held state (0 before any update).
    [[nodiscard]] double result() const {
        if (state_.size() == state_size()) return result(std::span<const double>(state_));
        const std::vector<double> zeros(state_size(), 0.0);
        return result(std::span<const double>(zeros));
    }
    /// @brief Keras' `reset_state()`: the held state back to zeros.
    void reset_state() { state_.assign(state_size(), 0.0); }

protected:
    /// @param name the constructor's name argument; empty gives `default_name`, as Keras names a
    /// metric constructed with `name=None`
    Metric(std::string name, std::string_view default_name)
        : name_(name.empty() ? std::string(default_name) : std::move(name)) {}
    Metric(const Metric&) = default;
    Metric(Metric&&) = default;
    Metric& operator=(const Metric&) = default;
    Metric& operator=(Metric&&) = default;

    /// @throws InvalidArgumentError `pss: <class_name> "<name>": <problem>`
    [[noreturn]] void fail(const std::string& problem) const {
        throw InvalidArgumentError("pss: " + std::string(class_name()) + " " + detail::json_text(name_) + ": " +
                                   problem);
    }

    /// @throws InvalidArgumentError unless `size` is state_size().
    void check_state(std::size_t size) const {
        if (size != state_size())
            fail("a state of " + std::to_string(size) + " doubles; its state has " + std::to_string(state_size()) +
                 " (state_size())");
    }

    /// Checks a batch and calls `f(y_true, y_pred, batch)` with two `xt::xarray<T>` of the predictions'
    /// dtype T (float or double): targets of another dtype are converted (a copy), as Loss::in_dtype does.
    /// Checked here: the state's size, empty tensors, the predictions' dtype and batch axis, at least one
    /// value per example, string targets, the number of weights. `f` checks the number of targets.
    template <class F>
    void with_batch(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                    std::span<const double> sample_weight, F&& f) const {
        check_state(state.size());
        if (!y_true.has_value() || !y_pred.has_value())
            fail(std::string("an empty tensor of ") + (y_true.has_value() ? "predictions" : "targets"));
        if (y_pred.dtype() != DType::float32 && y_pred.dtype() != DType::float64)
            fail("predictions of dtype " + std::string(dtype_name(y_pred.dtype())) +
                 "; a metric takes float32 or float64 predictions");
        if (y_true.dtype() == DType::string)
            fail("targets of dtype string; targets are numbers (float32, float64, int32 or int64)");
        const Shape shape = y_pred.shape();
        if (shape.empty()) fail("predictions of shape (); give a batch axis first: (batch, ...)");
        detail::MetricBatch batch{shape.front(), detail::row_elements(shape), sample_weight};
        if (batch.per_example == 0)
            fail("predictions of shape " + format_shape(shape) + "; give at least one value per example");
        if (!sample_weight.empty() && sample_weight.size() != batch.examples)
            fail(std::to_string(sample_weight.size()) + " sample weights for a batch of " +
                 std::to_string(batch.examples) + " examples; give one weight per example, or none");
        auto run = [&]<class T>(const xt::xarray<T>& p) {
            if (y_true.dtype() == dtype_of<T>) return f(y_true.get<T>(), p, batch);
            const xt::xarray<T> y =
                y_true.visit([](const auto& a) { return xt::xarray<T>(xt::cast<T>(a)); }, xt::xarray<T>());
            return f(y, p, batch);
        };
        if (y_pred.dtype() == DType::float32) return run(y_pred.get<float>());
        return run(y_pred.get<double>());
    }

    /// @throws InvalidArgumentError unless there is one target per prediction value.
    template <class T>
    void check_one_target_per_value(const xt::xarray<T>& y_true, const xt::xarray<T>& y_pred) const {
        if (y_true.size() != y_pred.size())
            fail(std::to_string(y_true.size()) + " targets for predictions of shape " +
                 format_shape(y_pred.shape()) + "; give one target per prediction, batch axis first");
    }

    /// The value of a mean metric's state {total, count}: total / count, 0 when count is 0.
    [[nodiscard]] double mean_result(std::span<const double> state) const {
        check_state(state.size());
        return detail::divide_no_nan(state[0], state[1]);
    }

private:
    std::string name_;
    std::vector<double> state_;  // for update_state/result/reset_state; sized on first use
};

/// @brief Keras' `Accuracy`: the weighted fraction of prediction values equal to their targets
/// (compared in float32, as Keras' float32 metric casts both). State {total, count}.
///
/// Targets: one per prediction value, in any shape with the batch axis first. A weight counts for each of
/// its example's values (Keras broadcasts it).
class Accuracy final : public Metric {
public:
    explicit Accuracy(std::string name = "accuracy") : Metric(std::move(name), "accuracy") {}

    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] std::size_t state_size() const override { return 2; }
    PSS_INLINE void accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                               std::span<const double> sample_weight = {}) const override;
    using Metric::result;
    [[nodiscard]] double result(std::span<const double> state) const override { return mean_result(state); }
    [[nodiscard]] std::unique_ptr<Metric> clone() const override { return std::make_unique<Accuracy>(*this); }
};

/// @brief Keras' `BinaryAccuracy`: for each example, the fraction of its values where
/// `(y_pred > threshold) == y_true` (in float32; targets are 0 or 1), then the weighted mean over examples.
/// State {total, count}.
class BinaryAccuracy final : public Metric {
public:
    /// @throws InvalidArgumentError `pss: BinaryAccuracy: "threshold" is nan; ...` for a threshold that is
    /// not a finite number (JSON could not carry it).
    explicit BinaryAccuracy(double threshold = 0.5, std::string name = "binary_accuracy")
        : Metric(std::move(name), "binary_accuracy"), threshold_(threshold) {
        if (!std::isfinite(threshold))
            throw InvalidArgumentError("pss: BinaryAccuracy: " + threshold_problem(threshold));
    }
    /// @brief Keras' own order, `BinaryAccuracy(name, dtype, threshold)` without the dtype:
    /// `BinaryAccuracy("accuracy")`.
    explicit BinaryAccuracy(std::string name, double threshold = 0.5) : BinaryAccuracy(threshold, std::move(name)) {}

    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] std::size_t state_size() const override { return 2; }
    PSS_INLINE void accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                               std::span<const double> sample_weight = {}) const override;
    using Metric::result;
    [[nodiscard]] double result(std::span<const double> state) const override { return mean_result(state); }
    /// @brief `{"name": "binary_accuracy", "threshold": 0.5}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Metric::get_config();
        config["threshold"] = threshold_;
        return config;
    }
    [[nodiscard]] std::unique_ptr<Metric> clone() const override { return std::make_unique<BinaryAccuracy>(*this); }

    [[nodiscard]] double threshold() const noexcept { return threshold_; }

    /// The message for a threshold that is not finite.
    [[nodiscard]] static std::string threshold_problem(double threshold) {
        return "\"threshold\" is " + detail::metric_number_text(threshold) +
               "; it is a finite number (Keras' default 0.5)";
    }

private:
    double threshold_;
};

/// @brief Keras' `SparseCategoricalAccuracy`: the weighted fraction of rows of class scores (the last
/// axis) whose argmax (the first maximum, in float32) equals the target class id. State {total, count}.
///
/// Targets: one class id per row, as floats: (batch,) or (batch, 1) for predictions (batch, classes).
/// An id that is not a whole number matches no row.
class SparseCategoricalAccuracy final : public Metric {
public:
    explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy")
        : Metric(std::move(name), "sparse_categorical_accuracy") {}

    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] std::size_t state_size() const override { return 2; }
    PSS_INLINE void accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                               std::span<const double> sample_weight = {}) const override;
    using Metric::result;
    [[nodiscard]] double result(std::span<const double> state) const override { return mean_result(state); }
    [[nodiscard]] std::unique_ptr<Metric> clone() const override {
        return std::make_unique<SparseCategoricalAccuracy>(*this);
    }
};

/// @brief Keras' `AUC`: the area under the ROC or the precision-recall curve, from a confusion matrix
/// at `num_thresholds` thresholds.
///
/// The thresholds are Keras': `[0 - 1e-7, i / (num_thresholds - 1) for i in 1 .. num_thresholds - 2,
/// 1 + 1e-7]`, and a prediction is positive at a threshold when it is greater. As Keras (which uses its
/// evenly-distributed-thresholds path for these), a prediction p (after a sigmoid when `from_logits`)
/// is cast to float32, clipped to [0, 1] (as tf_keras does; older tf.keras versions asserted 0 <= p <= 1
/// instead), and counted in bucket max(ceil(p (num_thresholds - 1)) - 1, 0); a nan prediction is positive
/// at no threshold. A target is positive when it is not 0 (Keras casts it to
/// bool). The state is tp, fp, tn and fn at each threshold (weighted), 4 num_thresholds doubles.
///
/// result(): "ROC" sums trapezoids over (fpr, tpr) with "interpolation", and rectangles of the lower
/// ("minoring") or the higher ("majoring") of each interval's ends otherwise; "PR" with "interpolation" is
/// Davis & Goadrich's interpolation as Keras' `interpolate_pr_auc`, and the Riemann sums over
/// (recall, precision) otherwise.
class AUC final : public Metric {
public:
    /// @brief The most thresholds an AUC takes (a pss limit: a config from a peer cannot make a worker
    /// allocate more than 32 MiB for one state).
    static constexpr std::size_t max_num_thresholds = std::size_t{1} << 20;

    /// @param curve "ROC" or "PR" (or "roc", "pr", as Keras takes)
    /// @param summation_method "interpolation", "minoring" or "majoring" (or capitalised, as Keras takes)
    /// @throws InvalidArgumentError `pss: AUC: "num_thresholds" is 1; ...`, and for an unknown curve or
    /// summation method, naming the value and the known ones.
    explicit AUC(int num_thresholds = 200, std::string curve = "ROC", std::string summation_method = "interpolation",
                 std::string name = "auc", bool from_logits = false)
        : Metric(std::move(name), "auc"), from_logits_(from_logits) {
        if (num_thresholds <= 1 || static_cast<std::size_t>(num_thresholds) > max_num_thresholds)
            throw InvalidArgumentError("pss: AUC: " + num_thresholds_problem(std::to_string(num_thresholds)));
        num_thresholds_ = static_cast<std::size_t>(num_thresholds);
        if (curve == "ROC" || curve == "roc") curve_ = "ROC";
        else if (curve == "PR" || curve == "pr") curve_ = "PR";
        else throw InvalidArgumentError("pss: AUC: " + curve_problem(curve));
        if (summation_method == "interpolation" || summation_method == "Interpolation") summation_ = "interpolation";
        else if (summation_method == "minoring" || summation_method == "Minoring") summation_ = "minoring";
        else if (summation_method == "majoring" || summation_method == "Majoring") summation_ = "majoring";
        else throw InvalidArgumentError("pss: AUC: " + summation_method_problem(summation_method));
    }

    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    /// @brief 4 num_thresholds: tp, then fp, tn and fn, each at every threshold.
    [[nodiscard]] std::size_t state_size() const override { return 4 * num_thresholds_; }
    PSS_INLINE void accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                               std::span<const double> sample_weight = {}) const override;
    using Metric::result;
    [[nodiscard]] PSS_INLINE double result(std::span<const double> state) const override;
    /// @brief `{"curve": "ROC", "from_logits": false, "name": "auc", "num_thresholds": 200,
    /// "summation_method": "interpolation"}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Metric::get_config();
        config["num_thresholds"] = num_thresholds_;
        config["curve"] = curve_;
        config["summation_method"] = summation_;
        config["from_logits"] = from_logits_;
        return config;
    }
    [[nodiscard]] std::unique_ptr<Metric> clone() const override { return std::make_unique<AUC>(*this); }

    [[nodiscard]] std::size_t num_thresholds() const noexcept { return num_thresholds_; }
    /// @brief "ROC" or "PR".
    [[nodiscard]] const std::string& curve() const noexcept { return curve_; }
    /// @brief "interpolation", "minoring" or "majoring".
    [[nodiscard]] const std::string& summation_method() const noexcept { return summation_; }
    [[nodiscard]] bool from_logits() const noexcept { return from_logits_; }
    /// @brief Keras' `thresholds`: `[-1e-7, 1 / (n - 1), ..., (n - 2) / (n - 1), 1 + 1e-7]`.
    [[nodiscard]] std::vector<double> thresholds() const {
        std::vector<double> out;
        out.reserve(num_thresholds_);
        out.push_back(0.0 - 1e-7);
        for (std::size_t i = 0; i + 2 < num_thresholds_; ++i)
            out.push_back(static_cast<double>(i + 1) * 1.0 / static_cast<double>(num_thresholds_ - 1));
        out.push_back(1.0 + 1e-7);
        return out;
    }

    /// The messages for a bad num_thresholds (given as text), curve or summation method.
    [[nodiscard]] static std::string num_thresholds_problem(const std::string& num_thresholds) {
        return "\"num_thresholds\" is " + num_thresholds + "; an AUC has 2 to " + std::to_string(max_num_thresholds) +
               " thresholds (Keras' default 200)";
    }
    [[nodiscard]] static std::string curve_problem(const std::string& curve) {
        return "\"curve\" is " + detail::json_text(curve) + "; it is \"ROC\" or \"PR\"";
    }
    [[nodiscard]] static std::string summation_method_problem(const std::string& method) {
        return "\"summation_method\" is " + detail::json_text(method) +
               "; it is \"interpolation\", \"minoring\" or \"majoring\"";
    }

private:
    /// Keras' `interpolate_pr_auc`.
    PSS_INLINE double interpolate_pr_auc(std::span<const double> state) const;

    std::size_t num_thresholds_ = 200;
    std::string curve_;
    std::string summation_;
    bool from_logits_ = false;
};

/// @brief What Precision and Recall share: one threshold (Keras' `thresholds`, one value here), a state
/// of two weighted counts {tp, other} and the result tp / (tp + other). A prediction value is positive
/// when it is greater than the threshold (in float32); a target is positive when it is not 0.
class ThresholdCounts : public Metric {
public:
    [[nodiscard]] std::size_t state_size() const override { return 2; }
    PSS_INLINE void accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                               std::span<const double> sample_weight = {}) const override;
    using Metric::result;
    [[nodiscard]] double result(std::span<const double> state) const override {
        check_state(state.size());
        return detail::divide_no_nan(state[0], state[0] + state[1]);
    }
    /// @brief `{"name": "precision", "thresholds": 0.5}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Metric::get_config();
        config["thresholds"] = threshold_;
        return config;
    }
    [[nodiscard]] double threshold() const noexcept { return threshold_; }

    /// The message for a threshold outside [0, 1].
    [[nodiscard]] static std::string thresholds_problem(double threshold) {
        return "\"thresholds\" is " + detail::metric_number_text(threshold) +
               "; a threshold is in [0, 1] (Keras' default 0.5)";
    }

protected:
    /// @param of_predicted true: the second count is the false positives (Precision), else the false
    /// negatives (Recall)
    /// @throws InvalidArgumentError `pss: Precision: "thresholds" is 1.5; ...`
    ThresholdCounts(std::string name, std::string_view default_name, std::string_view class_name, double threshold,
                    bool of_predicted)
        : Metric(std::move(name), default_name), threshold_(threshold), of_predicted_(of_predicted) {
        if (!(threshold >= 0 && threshold <= 1))
            throw InvalidArgumentError("pss: " + std::string(class_name) + ": " + thresholds_problem(threshold));
    }

private:
    double threshold_;
    bool of_predicted_;
};

/// @brief Keras' `Precision` with one threshold: tp / (tp + fp). State {tp, fp} (weighted).
class Precision final : public ThresholdCounts {
public:
    /// @param thresholds Keras' `thresholds` (one value here), in [0, 1]; Keras' `None` is 0.5
    /// @throws InvalidArgumentError `pss: Precision: "thresholds" is 1.5; ...`
    explicit Precision(double thresholds = 0.5, std::string name = "precision")
        : ThresholdCounts(std::move(name), "precision", "Precision", thresholds, true) {}
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] std::unique_ptr<Metric> clone() const override { return std::make_unique<Precision>(*this); }
};

/// @brief Keras' `Recall` with one threshold: tp / (tp + fn). State {tp, fn} (weighted).
class Recall final : public ThresholdCounts {
public:
    /// @param thresholds Keras' `thresholds` (one value here), in [0, 1]; Keras' `None` is 0.5
    /// @throws InvalidArgumentError `pss: Recall: "thresholds" is 1.5; ...`
    explicit Recall(double thresholds = 0.5, std::string name = "recall")
        : ThresholdCounts(std::move(name), "recall", "Recall", thresholds, false) {}
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] std::unique_ptr<Metric> clone() const override { return std::make_unique<Recall>(*this); }
};

/// @brief Keras' metric `MeanSquaredError`: each example's mean of (y_pred - y_true)^2 over the last
/// axis, then the weighted mean over examples (predictions (batch,) count as (batch, 1)). Computed in
/// double precision. State {total, count}.
class MeanSquaredError final : public Metric {
public:
    explicit MeanSquaredError(std::string name = "mean_squared_error") : Metric(std::move(name), "mean_squared_error") {}

    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] std::size_t state_size() const override { return 2; }
    PSS_INLINE void accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                               std::span<const double> sample_weight = {}) const override;
    using Metric::result;
    [[nodiscard]] double result(std::span<const double> state) const override { return mean_result(state); }
    [[nodiscard]] std::unique_ptr<Metric> clone() const override { return std::make_unique<MeanSquaredError>(*this); }
};

/// @brief Keras' metric `MeanAbsoluteError`: each example's mean of |y_pred - y_true| over the last
/// axis, then the weighted mean over examples, as MeanSquaredError. State {total, count}.
class MeanAbsoluteError final : public Metric {
public:
    explicit MeanAbsoluteError(std::string name = "mean_absolute_error")
        : Metric(std::move(name), "mean_absolute_error") {}

    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] std::size_t state_size() const override { return 2; }
    PSS_INLINE void accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                               std::span<const double> sample_weight = {}) const override;
    using Metric::result;
    [[nodiscard]] double result(std::span<const double> state) const override { return mean_result(state); }
    [[nodiscard]] std::unique_ptr<Metric> clone() const override {
        return std::make_unique<MeanAbsoluteError>(*this);
    }
};

/// @brief The metric Keras names `name`: "accuracy" (or "acc"), "binary_accuracy",
/// "sparse_categorical_accuracy", "auc", "precision", "recall", "mean_squared_error" (or "mse"),
/// "mean_absolute_error" (or "mae"), or a class name ("AUC", "BinaryAccuracy", ...), each with Keras'
/// defaults. ("accuracy" is Keras' Accuracy here; Sequential::compile picks Keras' binary or sparse
/// categorical accuracy for it from the model's outputs.)
/// @throws InvalidArgumentError `pss: metric "f1" is not known; use "accuracy" (or "acc"), ...`
[[nodiscard]] inline std::unique_ptr<Metric> get(std::string_view name) {
    if (name == "accuracy" || name == "acc" || name == "Accuracy") return std::make_unique<Accuracy>();
    if (name == "binary_accuracy" || name == "BinaryAccuracy") return std::make_unique<BinaryAccuracy>();
    if (name == "sparse_categorical_accuracy" || name == "SparseCategoricalAccuracy")
        return std::make_unique<SparseCategoricalAccuracy>();
    if (name == "auc" || name == "AUC") return std::make_unique<AUC>();
    if (name == "precision" || name == "Precision") return std::make_unique<Precision>();
    if (name == "recall" || name == "Recall") return std::make_unique<Recall>();
    if (name == "mean_squared_error" || name == "mse" || name == "MeanSquaredError")
        return std::make_unique<MeanSquaredError>();
    if (name == "mean_absolute_error" || name == "mae" || name == "MeanAbsoluteError")
        return std::make_unique<MeanAbsoluteError>();
    throw InvalidArgumentError("pss: metric " + detail::json_text(std::string(name)) +
                               " is not known; use \"accuracy\" (or \"acc\"), \"binary_accuracy\", "
                               "\"sparse_categorical_accuracy\", \"auc\", \"precision\", \"recall\", "
                               "\"mean_squared_error\" (or \"mse\") or \"mean_absolute_error\" (or \"mae\"), "
                               "or pass a pss::metrics::Metric object");
}

/// @brief Keras' `tf.keras.metrics.serialize(metric)`: `{"class_name": "AUC", "config": {"curve": "ROC",
/// "from_logits": false, "name": "auc", "num_thresholds": 200, "summation_method": "interpolation"}}`.
[[nodiscard]] inline nlohmann::json serialize(const Metric& metric) {
    return {{"class_name", std::string(metric.class_name())}, {"config", metric.get_config()}};
}

/// @brief The metric that serialize(metric) describes, as a worker process rebuilds a model's metrics.
/// Every field is checked (the config may come from the network): the config has exactly the fields
/// get_config() gives, each of its type and in its range.
/// @throws InvalidArgumentError naming the field and its value:
/// `pss: metric {"class_name":"F1","config":{}}: "class_name" is "F1"; the metrics are "Accuracy", ...`,
/// `pss: AUC config {...}: "curve" is "XY"; it is "ROC" or "PR"`
[[nodiscard]] inline std::unique_ptr<Metric> from_config(const nlohmann::json& serialized) {
    detail::ConfigFields outer("metric", serialized, "class_name and config");
    const std::string class_name = outer.take_string("class_name");
    const nlohmann::json& config = outer.take("config");
    outer.finish();
    const std::string what = class_name + " config";
    std::unique_ptr<Metric> metric;
    if (class_name == "Accuracy" || class_name == "SparseCategoricalAccuracy" || class_name == "MeanSquaredError" ||
        class_name == "MeanAbsoluteError") {
        detail::ConfigFields fields(what, config, "name");
        std::string name = fields.take_string("name");
        fields.finish();
        if (class_name == "Accuracy") metric = std::make_unique<Accuracy>(std::move(name));
        else if (class_name == "SparseCategoricalAccuracy")
            metric = std::make_unique<SparseCategoricalAccuracy>(std::move(name));
        else if (class_name == "MeanSquaredError") metric = std::make_unique<MeanSquaredError>(std::move(name));
        else metric = std::make_unique<MeanAbsoluteError>(std::move(name));
    } else if (class_name == "BinaryAccuracy") {
        detail::ConfigFields fields(what, config, "name and threshold");
        std::string name = fields.take_string("name");
        const double threshold = detail::metric_config_number(fields, "threshold");
        fields.finish();
        if (!std::isfinite(threshold)) fields.fail(BinaryAccuracy::threshold_problem(threshold));
        metric = std::make_unique<BinaryAccuracy>(threshold, std::move(name));
    } else if (class_name == "Precision" || class_name == "Recall") {
        detail::ConfigFields fields(what, config, "name and thresholds");
        std::string name = fields.take_string("name");
        const double threshold = detail::metric_config_number(fields, "thresholds");
        fields.finish();
        if (!(threshold >= 0 && threshold <= 1)) fields.fail(ThresholdCounts::thresholds_problem(threshold));
        if (class_name == "Precision") metric = std::make_unique<Precision>(threshold, std::move(name));
        else metric = std::make_unique<Recall>(threshold, std::move(name));
    } else if (class_name == "AUC") {
        detail::ConfigFields fields(what, config, "name, num_thresholds, curve, summation_method and from_logits");
        std::string name = fields.take_string("name");
        const std::uint64_t num_thresholds = fields.take_count("num_thresholds", 2);
        if (num_thresholds > AUC::max_num_thresholds)
            fields.fail(AUC::num_thresholds_problem(std::to_string(num_thresholds)));
        const std::string curve = fields.take_string("curve");
        if (curve != "ROC" && curve != "roc" && curve != "PR" && curve != "pr") fields.fail(AUC::curve_problem(curve));
        const std::string method = fields.take_string("summation_method");
        if (method != "interpolation" && method != "Interpolation" && method != "minoring" && method != "Minoring" &&
            method != "majoring" && method != "Majoring")
            fields.fail(AUC::summation_method_problem(method));
        const bool from_logits = fields.take_bool("from_logits");
        fields.finish();
        metric = std::make_unique<AUC>(static_cast<int>(num_thresholds), curve, method, std::move(name), from_logits);
    } else {
        outer.fail("\"class_name\" is " + detail::json_text(class_name) +
                   "; the metrics are \"Accuracy\", \"BinaryAccuracy\", \"SparseCategoricalAccuracy\", \"AUC\", "
                   "\"Precision\", \"Recall\", \"MeanSquaredError\" and \"MeanAbsoluteError\"");
    }
    return metric;
}

// ---- implementation ------------------------------------------------------------------------------

#if PSS_DEFINITIONS
PSS_INLINE std::string_view Accuracy::class_name() const noexcept { return "Accuracy"; }

PSS_INLINE void Accuracy::accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                                     std::span<const double> sample_weight) const {
    with_batch(state, y_true, y_pred, sample_weight,
               [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p, const detail::MetricBatch& batch) {
                   check_one_target_per_value(y, p);
                   double total = 0, count = 0;
                   for (std::size_t i = 0; i < p.size(); ++i) {
                       const double w = batch.weight(i);
                       if (static_cast<float>(p.data()[i]) == static_cast<float>(y.data()[i])) total += w;
                       count += w;
                   }
                   state[0] += total;
                   state[1] += count;
               });
}

PSS_INLINE std::string_view BinaryAccuracy::class_name() const noexcept { return "BinaryAccuracy"; }

PSS_INLINE void BinaryAccuracy::accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                                           std::span<const double> sample_weight) const {
    with_batch(state, y_true, y_pred, sample_weight,
               [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p, const detail::MetricBatch& batch) {
                   check_one_target_per_value(y, p);
                   // Keras: mean over the last axis of each example's values, then the weighted mean.
                   const std::size_t row = p.dimension() < 2 ? 1 : p.shape().back();
                   const float threshold = static_cast<float>(threshold_);
                   double total = 0, count = 0;
                   for (std::size_t start = 0; start < p.size(); start += row) {
                       std::size_t matches = 0;
                       for (std::size_t i = start; i < start + row; ++i) {
                           const float predicted = static_cast<float>(p.data()[i]) > threshold ? 1.0f : 0.0f;
                           if (predicted == static_cast<float>(y.data()[i])) ++matches;
                       }
                       const double w = batch.weight(start);
                       total += w * (static_cast<double>(matches) / static_cast<double>(row));
                       count += w;
                   }
                   state[0] += total;
                   state[1] += count;
               });
}

PSS_INLINE std::string_view SparseCategoricalAccuracy::class_name() const noexcept {
    return "SparseCategoricalAccuracy";
}

PSS_INLINE void SparseCategoricalAccuracy::accumulate(std::span<double> state, const Tensor& y_true,
                                                      const Tensor& y_pred,
                                                      std::span<const double> sample_weight) const {
    with_batch(state, y_true, y_pred, sample_weight,
               [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p, const detail::MetricBatch& batch) {
                   if (p.dimension() < 2)
                       fail("predictions of shape " + format_shape(p.shape()) +
                            "; give class scores, (batch, classes)");
                   const std::size_t classes = p.shape().back();
                   if (y.size() * classes != p.size())
                       fail(std::to_string(y.size()) + " targets for predictions of shape " + format_shape(p.shape()) +
                            "; give one class id per row of class scores: (batch,) or (batch, 1) for predictions "
                            "(batch, classes)");
                   double total = 0, count = 0;
                   for (std::size_t r = 0; r < y.size(); ++r) {
                       const T* scores = p.data() + r * classes;
                       std::size_t best = 0;
                       float best_score = static_cast<float>(scores[0]);
                       for (std::size_t j = 1; j < classes; ++j)
                           if (static_cast<float>(scores[j]) > best_score) {
                               best = j;
                               best_score = static_cast<float>(scores[j]);
                           }
                       const double w = batch.weight(r * classes);
                       if (static_cast<float>(y.data()[r]) == static_cast<float>(best)) total += w;
                       count += w;
                   }
                   state[0] += total;
                   state[1] += count;
               });
}

PSS_INLINE std::string_view AUC::class_name() const noexcept { return "AUC"; }

PSS_INLINE void AUC::accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                                std::span<const double> sample_weight) const {
    with_batch(state, y_true, y_pred, sample_weight,
               [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p, const detail::MetricBatch& batch) {
                   check_one_target_per_value(y, p);
                   const std::size_t n = num_thresholds_;
                   // Keras' _update_confusion_matrix_variables_optimized: the weight of each value goes to
                   // its bucket, and tp (fp) at threshold j is the sum over buckets >= j.
                   std::vector<double> tp_bucket(n, 0.0), fp_bucket(n, 0.0);
                   double positives = 0, negatives = 0;
                   const float scale = static_cast<float>(n - 1);
                   for (std::size_t i = 0; i < p.size(); ++i) {
                       const double w = batch.weight(i);
                       const bool positive = static_cast<float>(y.data()[i]) != 0.0f;
                       (positive ? positives : negatives) += w;
                       T value = p.data()[i];
                       if (from_logits_) value = T{1} / (T{1} + std::exp(-value));
                       float v = static_cast<float>(value);
                       if (std::isnan(v)) continue;  // positive at no threshold
                       v = std::clamp(v, 0.0f, 1.0f);
                       const float bucket = std::ceil(v * scale) - 1.0f;
                       const std::size_t b = bucket > 0 ? static_cast<std::size_t>(bucket) : 0;
                       (positive ? tp_bucket : fp_bucket)[b] += w;
                   }
                   double tp = 0, fp = 0;
                   for (std::size_t j = n; j-- > 0;) {
                       tp += tp_bucket[j];
                       fp += fp_bucket[j];
                       state[j] += tp;
                       state[n + j] += fp;
                       state[2 * n + j] += negatives - fp;
                       state[3 * n + j] += positives - tp;
                   }
               });
}

PSS_INLINE double AUC::result(std::span<const double> state) const {
    check_state(state.size());
    if (curve_ == "PR" && summation_ == "interpolation") return interpolate_pr_auc(state);
    const std::size_t n = num_thresholds_;
    const double* tp = state.data();
    const double* fp = tp + n;
    const double* tn = fp + n;
    const double* fn = tn + n;
    // x and y of the curve at threshold j.
    auto point = [&](std::size_t j) {
        const double recall = detail::divide_no_nan(tp[j], tp[j] + fn[j]);
        if (curve_ == "ROC") return std::pair{detail::divide_no_nan(fp[j], fp[j] + tn[j]), recall};
        return std::pair{recall, detail::divide_no_nan(tp[j], tp[j] + fp[j])};
    };
    double area = 0;
    for (std::size_t j = 0; j + 1 < n; ++j) {
        const auto [x0, y0] = point(j);
        const auto [x1, y1] = point(j + 1);
        const double height = summation_ == "interpolation" ? (y0 + y1) / 2.0
                              : summation_ == "minoring"    ? std::min(y0, y1)
                                                            : std::max(y0, y1);
        area += (x0 - x1) * height;
    }
    return area;
}

PSS_INLINE double AUC::interpolate_pr_auc(std::span<const double> state) const {
    const std::size_t n = num_thresholds_;
    const double* tp = state.data();
    const double* fp = tp + n;
    const double* fn = tp + 3 * n;
    double area = 0;
    for (std::size_t j = 0; j + 1 < n; ++j) {
        const double dtp = tp[j] - tp[j + 1];
        const double p0 = tp[j] + fp[j], p1 = tp[j + 1] + fp[j + 1];
        const double slope = detail::divide_no_nan(dtp, std::max(p0 - p1, 0.0));
        const double intercept = tp[j + 1] - slope * p1;
        const double ratio = p0 > 0 && p1 > 0 ? detail::divide_no_nan(p0, std::max(p1, 0.0)) : 1.0;
        area += detail::divide_no_nan(slope * (dtp + intercept * std::log(ratio)), std::max(tp[j + 1] + fn[j + 1], 0.0));
    }
    return area;
}

PSS_INLINE void ThresholdCounts::accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                                            std::span<const double> sample_weight) const {
    with_batch(state, y_true, y_pred, sample_weight,
               [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p, const detail::MetricBatch& batch) {
                   check_one_target_per_value(y, p);
                   const float threshold = static_cast<float>(threshold_);
                   double tp = 0, other = 0;  // other: fp (of the predicted positives) or fn (of the actual ones)
                   for (std::size_t i = 0; i < p.size(); ++i) {
                       const bool predicted = static_cast<float>(p.data()[i]) > threshold;
                       const bool actual = static_cast<float>(y.data()[i]) != 0.0f;
                       if (!(of_predicted_ ? predicted : actual)) continue;
                       (predicted && actual ? tp : other) += batch.weight(i);
                   }
                   state[0] += tp;
                   state[1] += other;
               });
}

PSS_INLINE std::string_view Precision::class_name() const noexcept { return "Precision"; }

PSS_INLINE std::string_view Recall::class_name() const noexcept { return "Recall"; }

PSS_INLINE std::string_view MeanSquaredError::class_name() const noexcept { return "MeanSquaredError"; }

PSS_INLINE void MeanSquaredError::accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                                             std::span<const double> sample_weight) const {
    with_batch(state, y_true, y_pred, sample_weight,
               [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p, const detail::MetricBatch& batch) {
                   check_one_target_per_value(y, p);
                   const std::size_t row = p.dimension() < 2 ? 1 : p.shape().back();
                   double total = 0, count = 0;
                   for (std::size_t start = 0; start < p.size(); start += row) {
                       double sum = 0;
                       for (std::size_t i = start; i < start + row; ++i) {
                           const double d = static_cast<double>(p.data()[i]) - static_cast<double>(y.data()[i]);
                           sum += d * d;
                       }
                       const double w = batch.weight(start);
                       total += w * (sum / static_cast<double>(row));
                       count += w;
                   }
                   state[0] += total;
                   state[1] += count;
               });
}

PSS_INLINE std::string_view MeanAbsoluteError::class_name() const noexcept { return "MeanAbsoluteError"; }

PSS_INLINE void MeanAbsoluteError::accumulate(std::span<double> state, const Tensor& y_true, const Tensor& y_pred,
                                              std::span<const double> sample_weight) const {
    with_batch(state, y_true, y_pred, sample_weight,
               [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p, const detail::MetricBatch& batch) {
                   check_one_target_per_value(y, p);
                   const std::size_t row = p.dimension() < 2 ? 1 : p.shape().back();
                   double total = 0, count = 0;
                   for (std::size_t start = 0; start < p.size(); start += row) {
                       double sum = 0;
                       for (std::size_t i = start; i < start + row; ++i)
                           sum += std::abs(static_cast<double>(p.data()[i]) - static_cast<double>(y.data()[i]));
                       const double w = batch.weight(start);
                       total += w * (sum / static_cast<double>(row));
                       count += w;
                   }
                   state[0] += total;
                   state[1] += count;
               });
}

// Metric's key function (see PSS_INLINE in pss/config.hpp).
PSS_INLINE Metric::~Metric() = default;
#endif

}  // namespace metrics

PSS_NAMESPACE_END
