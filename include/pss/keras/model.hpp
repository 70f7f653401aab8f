// pss/keras/model.hpp: Sequential, a Keras-style model trained by scheduling steps on a strategy's workers (compile, fit, evaluate, predict).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <initializer_list>
#include <iomanip>
#include <array>
#include <iostream>
#include <map>
#include <mutex>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_WIN32)
#include <io.h>
#else
#include <unistd.h>
#endif

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include <pss/checkpoint.hpp>
#include <pss/config.hpp>
#include <pss/coordinator.hpp>
#include <pss/detail/environment.hpp>
#include <pss/errors.hpp>
#include <pss/function.hpp>
#include <pss/message.hpp>
#include <pss/keras/callbacks.hpp>
#include <pss/keras/config.hpp>
#include <pss/keras/metrics.hpp>
#include <pss/keras/layers.hpp>
#include <pss/keras/losses.hpp>
#include <pss/tensor.hpp>
#include <pss/variable.hpp>

PSS_NAMESPACE_BEGIN

/// @brief What Sequential::fit returns (Keras' History): the epochs run and each one's logs.
struct History {
    std::vector<int> epoch;    ///< the epochs run, from 0 (Keras' `history.epoch`)
    std::vector<double> loss;  ///< each epoch's mean batch loss: the same as `history.at("loss")`
    /// Keras' `history.history`: every value of the epochs' logs by name (`loss`, the compiled metrics,
    /// and `val_loss` and `val_<metric>` when fit validates), one entry per epoch run.
    std::map<std::string, std::vector<double>> history;
};

/// @brief Data fit validates on at the end of every epoch (Keras' `validation_data`: `(x, y)` or `(x,
/// y, sample_weight)`).
struct ValidationData {
    xt::xarray<float> x{};
    xt::xarray<float> y{};
    std::vector<double> sample_weight{};  ///< empty, or one weight per example
};

/// @brief Keras' `fit` arguments, by name: `model.fit(x, y, {.epochs = 10, .validation_split = 0.2})`.
/// The fields are in Keras' order (designated initializers must keep it).
struct FitOptions {
    std::size_t batch_size = 32;
    int epochs = 1;
    /// Keras' `verbose="auto"`: 1 on a terminal, 2 elsewhere (as tf.keras under ParameterServerStrategy).
    static constexpr int verbose_auto = -1;
    /// verbose_auto (the default), or 0: silent. 1: `Epoch 1/5`, then on a terminal Keras' progress bar
    /// with ETA and time per step, and elsewhere one line per epoch without timings (`4/4 - loss:
    /// 0.123456`), so that two runs' logs compare equal. 2: one line per epoch with its time, as Keras'
    /// `verbose=2` (`4/4 - 0s - loss: 0.1234 - 12ms/epoch - 3ms/step`).
    int verbose = verbose_auto;
    std::vector<CallbackHandle> callbacks{};  ///< called in order; at most one BackupAndRestore
    /// The last fraction of (x, y), taken before shuffling, is held out and evaluated at each epoch's end
    /// (Keras' `validation_split`): in [0, 1). Ignored when validation_data is given.
    double validation_split = 0;
    std::optional<ValidationData> validation_data{};
    bool shuffle = true;  ///< a new seeded permutation of the training examples each epoch
    /// Keras' `class_weight`: a class id's weight (classes not listed weigh 1); targets must then be one
    /// class id per example. Multiplies sample_weight when both are given. Training only: the validation
    /// split keeps its sample weights, not the class weights (as Keras).
    std::map<int, double> class_weight{};
    /// One weight per example of x (Keras' `sample_weight`): an example's loss and metrics count that
    /// much (the loss is reduced as Keras': the sum of weighted losses over the batch size).
    std::vector<double> sample_weight{};
    int initial_epoch = 0;           ///< the epoch to start at (Keras' `initial_epoch`); epochs still ends it
    std::size_t steps_per_epoch = 0; ///< 0: every batch; N: the first N batches of each epoch's permutation
    std::ostream* out = nullptr;     ///< where progress goes; nullptr: std::cout
};

/// @brief Keras' `evaluate` arguments, by name: `model.evaluate(x, y, {.batch_size = 256})`.
struct EvaluateOptions {
    std::size_t batch_size = 32;
    std::vector<double> sample_weight{};  ///< empty, or one weight per example
};

/// @brief A metric of `compile`: a Keras name (`"accuracy"`, `"auc"`, `"mse"`, ...) or a
/// pss::metrics object (`pss::metrics::AUC(200, "PR")`). `"accuracy"` (or `"acc"`) becomes Keras'
/// choice for the model's outputs: BinaryAccuracy for one output per example, SparseCategoricalAccuracy
/// for class probabilities, named `accuracy` either way.
class AnyMetric {
public:
    AnyMetric(const char* name) : name_(name) {}          // NOLINT: implicit by design, as Keras' list
    AnyMetric(std::string name) : name_(std::move(name)) {}  // NOLINT
    AnyMetric(std::string_view name) : name_(name) {}     // NOLINT
    template <std::derived_from<metrics::Metric> M>
    AnyMetric(M metric) : metric_(std::make_shared<M>(std::move(metric))) {}  // NOLINT
    AnyMetric(std::shared_ptr<const metrics::Metric> metric) : metric_(std::move(metric)) {  // NOLINT
        if (!metric_) throw InvalidArgumentError("pss: compile: a metric is a null shared_ptr");
    }

    /// The metric for a model whose outputs per example are `output_shape` (batch axis excluded).
    [[nodiscard]] std::shared_ptr<const metrics::Metric> resolve(const Shape& output_shape) const {
        if (metric_) return metric_;
        if (name_ == "accuracy" || name_ == "acc") {
            if (output_shape.empty() || output_shape.back() == 1)
                return std::make_shared<metrics::BinaryAccuracy>("accuracy");
            return std::make_shared<metrics::SparseCategoricalAccuracy>("accuracy");
        }
        return metrics::get(name_);
    }

private:
    std::string name_;
    std::shared_ptr<const metrics::Metric> metric_;
};

/// @brief Any layer, held by value: the element of Sequential's list of layers, so that
/// `{pss::Dense(8, "relu"), pss::Dense(1)}` is a list.
class AnyLayer {
public:
    template <std::derived_from<Layer> L>
    AnyLayer(L layer) : layer_(std::make_unique<L>(std::move(layer))) {}  // NOLINT: implicit by design
    AnyLayer(const AnyLayer& other) : layer_(other.layer_->clone()) {}
    AnyLayer& operator=(const AnyLayer& other) {
        if (this != &other) layer_ = other.layer_->clone();
        return *this;
    }
    AnyLayer(AnyLayer&&) noexcept = default;
    AnyLayer& operator=(AnyLayer&&) noexcept = default;
    ~AnyLayer() = default;

    /// @brief A copy of the held layer.
    [[nodiscard]] std::unique_ptr<Layer> clone() const { return layer_->clone(); }

private:
    std::unique_ptr<Layer> layer_;
};

namespace detail {

/// A strategy a Sequential model can train on: ParameterServerStrategy, or anything with its members.
template <class S>
concept keras_strategy = std::derived_from<S, Strategy> && requires(const S& s) {
    typename S::optimizer_type;
    { S::synchronous } -> std::convertible_to<bool>;
    { s.num_workers() } -> std::convertible_to<int>;
    { s.optimizer() } -> std::convertible_to<const typename S::optimizer_type&>;
};

/// One row of Keras' summary table: each field from its column's start (after one space in the first),
/// cut to the column less two spaces (and one more but in the last column), the rest wrapped onto the
/// next lines, each line padded to the last position (tf.keras 2's print_row, without nesting).
inline void summary_row(std::ostream& out, std::array<std::string, 3> fields, const std::array<std::size_t, 3>& positions) {
    while (std::any_of(fields.begin(), fields.end(), [](const std::string& f) { return !f.empty(); })) {
        std::string line;
        for (std::size_t col = 0; col < fields.size(); ++col) {
            const bool last = col + 1 == fields.size();
            const std::size_t start = col == 0 ? 0 : positions[col - 1];
            const std::size_t space = last ? 0 : 2;
            const std::size_t cutoff = positions[col] - start - space - (last ? 0 : 1);
            if (col == 0) line += ' ';
            line += fields[col].substr(0, cutoff);
            line += std::string(space, ' ');
            fields[col].erase(0, std::min(cutoff, fields[col].size()));
            if (line.size() < positions[col]) line += std::string(positions[col] - line.size(), ' ');
        }
        out << line << "\n";
    }
}

/// An optimizer's hyperparameters as Keras would list them: `SGD(learning_rate=0.1)`.
template <class O>
std::string describe_optimizer(const O& o) {
    std::ostringstream out;
    out << O::name() << "(";
    const char* sep = "";
    auto field = [&](const char* key, auto value) {
        out << sep << key << "=" << value;
        sep = ", ";
    };
    if constexpr (requires { o.learning_rate(); }) field("learning_rate", o.learning_rate());
    if constexpr (requires { o.momentum(); }) field("momentum", o.momentum());
    if constexpr (requires { o.nesterov(); }) field("nesterov", o.nesterov() ? "true" : "false");
    if constexpr (requires { o.beta_1(); }) field("beta_1", o.beta_1());
    if constexpr (requires { o.beta_2(); }) field("beta_2", o.beta_2());
    if constexpr (requires { o.initial_accumulator_value(); })
        field("initial_accumulator_value", o.initial_accumulator_value());
    if constexpr (requires { o.epsilon(); }) field("epsilon", o.epsilon());
    out << ")";
    return out.str();
}

/// Two optimizers of one type configured alike: operator== when the type has it, else the name and
/// the hyperparameters describe_optimizer lists.
template <class O>
bool same_optimizer(const O& a, const O& b) {
    if constexpr (std::equality_comparable<O>)
        return a == b;
    else
        return describe_optimizer(a) == describe_optimizer(b);
}

/// Rows `order[begin, begin + count)` of `data` (batch axis first): one batch, copied when it is scheduled.
template <class T>
xt::xarray<T> take_rows(const xt::xarray<T>& data, const std::vector<std::size_t>& order, std::size_t begin,
                        std::size_t count) {
    Shape shape(data.shape().begin(), data.shape().end());
    const std::size_t width = shape.front() == 0 ? 0 : data.size() / shape.front();
    shape.front() = count;
    xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
    for (std::size_t r = 0; r < count; ++r)
        std::copy_n(data.data() + order[begin + r] * width, width, out.data() + r * width);
    return out;
}

/// Keras' per-epoch display (see FitOptions::verbose). On a terminal at verbose 1: a bar redrawn with
/// '\r', with the speed; elsewhere at verbose 1 only `4/4 - loss: 0.123456` at the end, without timings;
/// at verbose 2 one line at the end with the epoch's time.
class ProgressLine {
public:
    ProgressLine(std::ostream& out, int verbose, bool terminal, std::size_t total)
        : out_(out), verbose_(verbose), terminal_(verbose == 1 && terminal), total_(total),
          start_(std::chrono::steady_clock::now()) {}

    /// Keras' bar while an epoch runs: `12/43 [=======>......] - ETA: 3s - loss: 0.1234 - 45ms/step`.
    void update(std::size_t done, const Logs& logs) {
        if (!terminal_) return;
        const double seconds = elapsed();
        std::ostringstream line;
        line << std::setw(static_cast<int>(std::to_string(total_).size())) << done << "/" << total_ << " [" << bar(done)
             << "]";
        if (done < total_) {
            line << " - ETA: " << (done == 0 ? std::string("?") : duration(seconds / static_cast<double>(done) *
                                                                         static_cast<double>(total_ - done)));
            line << values(logs);
            if (done > 0) line << " - " << per_step(seconds / static_cast<double>(done));
        } else {  // Keras' last draw: the epoch's time and time per step, then the values
            line << " - " << std::fixed << std::setprecision(0) << seconds << "s "
                 << per_step(seconds / static_cast<double>(std::max<std::size_t>(total_, 1))) << values(logs);
        }
        std::string text = line.str();
        const std::size_t length = text.size();
        if (length < drawn_) text.append(drawn_ - length, ' ');  // wipe the end of a longer line
        drawn_ = length;
        out_ << '\r' << text << std::flush;
    }

    /// The epoch's last line, with its logs (validation's included).
    void finish(const Logs& logs) {
        if (verbose_ == 0) return;
        if (terminal_) {
            update(total_, logs);
            out_ << "\n";
        } else if (verbose_ == 2) {  // Keras' verbose=2: `4/4 - 0s - loss: 0.1234 - 12ms/epoch - 3ms/step`
            const double seconds = elapsed();
            out_ << total_ << "/" << total_ << " - " << std::fixed << std::setprecision(0) << seconds << "s"
                 << values(logs) << " - " << per(seconds, "epoch") << " - "
                 << per_step(seconds / static_cast<double>(std::max<std::size_t>(total_, 1))) << "\n";
        } else {
            out_ << total_ << "/" << total_;
            for (const auto& [name, value] : logs)
                out_ << " - " << name << ": " << std::fixed << std::setprecision(6) << value;
            out_ << "\n";
        }
        out_.flush();
    }

    /// Keras' values: ` - loss: 0.1234 - auc: 0.8765`, `%.4e` below 1e-3 as Keras prints them.
    [[nodiscard]] static std::string values(const Logs& logs) {
        std::ostringstream text;
        for (const auto& [name, value] : logs) {
            text << " - " << name << ": ";
            if (std::abs(value) > 1e-3) text << std::fixed << std::setprecision(4) << value;
            else text << std::scientific << std::setprecision(4) << value;
        }
        return text.str();
    }

    /// Keras' time per step: `2s/step`, `45ms/step` or `812us/step`.
    [[nodiscard]] static std::string per_step(double seconds) { return per(seconds, "step"); }

    /// Keras' time per `unit`: `2s/epoch`, `45ms/step` or `812us/step`.
    [[nodiscard]] static std::string per(double seconds, std::string_view unit) {
        std::ostringstream text;
        text << std::fixed << std::setprecision(0);
        if (seconds >= 1) text << seconds << "s/" << unit;
        else if (seconds >= 1e-3) text << seconds * 1e3 << "ms/" << unit;
        else text << seconds * 1e6 << "us/" << unit;
        return text.str();
    }

    /// Keras' ETA: `7s`, `2:05` or `1:02:05`.
    [[nodiscard]] static std::string duration(double seconds) {
        const auto s = static_cast<long long>(seconds + 0.5);
        char text[32];
        if (s >= 3600) std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
        else if (s >= 60) std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
        else std::snprintf(text, sizeof text, "%llds", s);
        return text;
    }

private:
    [[nodiscard]] double elapsed() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    [[nodiscard]] std::string bar(std::size_t done) const {
        constexpr std::size_t width = 30;
        const std::size_t filled = total_ == 0 ? width : std::min(done, total_) * width / total_;
        std::string text(filled, '=');
        if (filled < width) {
            if (filled > 0) text.back() = '>';
            text.append(width - filled, '.');
        }
        return text;
    }

    std::ostream& out_;
    int verbose_;
    bool terminal_;
    std::size_t total_;
    std::chrono::steady_clock::time_point start_;
    std::size_t drawn_ = 0;
};

/// True when `out` is this process's standard output and that is a terminal.
inline bool is_terminal(const std::ostream& out) {
    if (&out != &std::cout) return false;
#if defined(_WIN32)
    return _isatty(_fileno(stdout)) != 0;
#else
    return ::isatty(::fileno(stdout)) != 0;
#endif
}

}  // namespace detail

namespace detail {

/// Metrics as a step computes them: each metric's state, one after the other in one vector.
using MetricList = std::vector<std::shared_ptr<const metrics::Metric>>;

/// The size of all of `metrics`' states, one after the other.
inline std::size_t metric_state_size(const MetricList& metrics) {
    std::size_t size = 0;
    for (const auto& m : metrics) size += m->state_size();
    return size;
}

/// Adds the batch to `state` (metric_state_size(metrics) doubles).
inline void accumulate_metrics(const MetricList& metrics, std::span<double> state, const Tensor& y_true,
                               const Tensor& y_pred, std::span<const double> weights) {
    for (const auto& m : metrics) {
        m->accumulate(state.first(m->state_size()), y_true, y_pred, weights);
        state = state.subspan(m->state_size());
    }
}

/// Sets each metric's result in `logs`, as `prefix` + its name.
inline void metric_results(const MetricList& metrics, std::span<const double> state, Logs& logs,
                           std::string_view prefix = {}) {
    for (const auto& m : metrics) {
        logs.set(std::string(prefix) + m->name(), m->result(state.first(m->state_size())));
        state = state.subspan(m->state_size());
    }
}

/// The batch's weights as a step receives them: (count,) float64, or (0,) for none.
inline Tensor take_weights(const std::vector<double>& weights, const std::vector<std::size_t>& order,
                           std::size_t begin, std::size_t count) {
    xt::xarray<double> out = xt::xarray<double>::from_shape({weights.empty() ? std::size_t{0} : count});
    if (!weights.empty())
        for (std::size_t r = 0; r < count; ++r) out.data()[r] = weights[order[begin + r]];
    return Tensor(std::move(out));
}

/// The loss of a batch with per-example `weights` (none when empty), reduced as Keras reduces it: the
/// sum of the weighted losses over the batch size. With weights, `gradient` (the unweighted loss's, of
/// y_pred's shape) has each example's row scaled by its weight: a Loss is the mean of per-example
/// losses, each of its own row.
inline double weighted_loss(const Loss& loss, const Tensor& y_true, const Tensor& y_pred,
                            std::span<const double> weights, Tensor* gradient) {
    if (weights.empty()) {
        if (gradient != nullptr) *gradient = loss.gradient(y_true, y_pred);
        return loss.value(y_true, y_pred);
    }
    const std::vector<double> losses = loss.example_values(y_true, y_pred);
    double sum = 0;
    for (std::size_t i = 0; i < losses.size(); ++i) sum += weights[i] * losses[i];
    if (gradient != nullptr) {
        *gradient = loss.gradient(y_true, y_pred);
        gradient->visit_mut([&](auto& g) {
            using T = typename std::decay_t<decltype(g)>::value_type;
            const std::size_t width = g.size() / weights.size();
            for (std::size_t i = 0; i < weights.size(); ++i)
                for (std::size_t j = 0; j < width; ++j) g.data()[i * width + j] *= static_cast<T>(weights[i]);
        });
    }
    return sum / static_cast<double>(losses.size());
}

/// The per-example weights a step was sent (see take_weights), checked against the batch.
inline std::span<const double> step_weights(const Tensor& weights, std::size_t examples) {
    if (!weights.has_value() || weights.size() == 0) return {};
    if (weights.dtype() != DType::float64 || weights.rank() != 1 || weights.size() != examples)
        throw InvalidArgumentError("pss: Sequential: a step's sample weights are " +
                                   std::string(dtype_name(weights.dtype())) + " of shape " +
                                   format_shape(weights.shape()) + "; they are float64 of shape (" +
                                   std::to_string(examples) + ",), or (0,) for none");
    return {weights.get<double>().data(), examples};
}

/// One training step: pull, forward, loss, backward, push, each layer in its dtype. Returns the slice's
/// loss (0 for an empty slice, which still pulls and pushes: a synchronous step needs every worker),
/// then the metrics' states for the slice (see accumulate_metrics), computed on the step's predictions.
inline std::vector<double> keras_train_step(std::vector<std::unique_ptr<Layer>>& layers, const Loss& loss,
                                            const MetricList& metrics, Tensor x, Tensor y, const Tensor& weights,
                                            std::uint64_t step, double scale) {
    const StepProfile::Timer timer(StepProfile::Counter::step);  // times nothing unless a benchmark enabled it
    const std::size_t examples = x.rank() == 0 ? 0 : x.shape().front();
    const std::span<const double> w = step_weights(weights, examples);
    Tensor predictions = std::move(x);
    for (auto& layer : layers) predictions = layer->forward(std::move(predictions), step);
    std::vector<double> out(1 + metric_state_size(metrics), 0.0);
    Tensor grad;
    if (examples == 0) {
        grad = Tensor::zeros(predictions.dtype(), predictions.shape());
    } else {
        out[0] = weighted_loss(loss, y, predictions, w, &grad);
        for (const auto& layer : layers) out[0] += layer->regularization_loss();  // Keras' model.losses
        accumulate_metrics(metrics, std::span<double>(out).subspan(1), y, predictions, w);
    }
    if (scale != 1.0)
        grad.visit_mut([&](auto& g) { g *= static_cast<typename std::decay_t<decltype(g)>::value_type>(scale); });
    for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
        LayerGradients grads = (*it)->backward(grad);
        for (auto& g : grads.variables) {
            Tensor values = g.values.dtype() == g.variable.dtype() ? std::move(g.values)
                                                                   : convert_tensor(g.values, g.variable.dtype());
            if (g.sparse)
                (void)g.variable.apply_sparse_gradient(std::span<const std::int64_t>(g.ids), std::move(values), step);
            else
                (void)g.variable.apply_gradient(std::move(values), step);
        }
        grad = std::move(grads.inputs);
    }
    return out;
}

// ---------------------------------------------------------------------------------------------------
// A model trained by worker processes. The chief sends each worker the model's description once (the
// registered "build" call: JSON text of its layers' and loss's configs, and its variables' handles);
// the worker rebuilds the layers, binds them to those variables and keeps the model under its id. Each
// step then sends only the model id, the batch, the step and the scale. A worker that does not know
// the id (it restarted, or evicted the model) answers NotFoundError (remote_model_unknown), and the
// chief sends the build call again and reruns the steps that did not run.
// ---------------------------------------------------------------------------------------------------

/// A model as a worker process rebuilds it from its description: layers bound to the coordinator's
/// variables, and the loss. Its mutex serializes the steps that run on it (its layers keep per-step state).
struct RemoteModel {
    std::mutex mutex;
    std::string description;
    std::vector<std::unique_ptr<Layer>> layers;
    std::shared_ptr<const Loss> loss;
    MetricList metrics;
    std::uint64_t last_used = 0;
};

/// How many models a worker keeps: the 16 used last. A 17th evicts the one used longest ago; a step
/// for an evicted model is answered as for a model never built, and the chief builds it again.
inline constexpr std::size_t remote_models_per_worker = 16;

/// The models this process keeps, by worker task and model id (one worker per process, except in tests
/// that play several workers in one process).
struct RemoteModels {
    std::mutex mutex;
    std::map<std::pair<int, std::string>, std::shared_ptr<RemoteModel>> models;
    std::uint64_t clock = 0;
    static RemoteModels& instance() {
        static RemoteModels models;
        return models;
    }
};

/// The first words of the error a worker answers for a model id it does not know.
inline constexpr std::string_view remote_model_unknown = "pss: Sequential: worker task ";
inline constexpr std::string_view remote_model_unknown_tail = " does not have the model ";

/// True when `e` is what keras_remote_step answers for a model the worker does not have.
inline bool is_remote_model_unknown(const Error& e) {
    const std::string_view message = e.what();
    return e.code() == ErrorCode::not_found && message.starts_with(remote_model_unknown) &&
           message.find(remote_model_unknown_tail) != std::string_view::npos;
}

/// The worker that answered `e` (is_remote_model_unknown), as its message names it; nullopt when it
/// names none.
inline std::optional<int> remote_model_unknown_worker(const Error& e) {
    const std::string_view message = std::string_view(e.what()).substr(remote_model_unknown.size());
    return parse_int(message.substr(0, message.find(remote_model_unknown_tail)));
}

/// A model's description as Sequential sends it: `{"class_name": "Sequential", "config": {"name":
/// "sequential", "layers": [serialize(layer), ...]}, "loss": serialize(loss), "metrics": [serialize(metric),
/// ...], "weight_counts": [2, 0, 1]}` (how many of the variables sent with it each layer takes, in order).
[[nodiscard]] inline std::shared_ptr<RemoteModel> parse_model_description(const std::string& description,
                                                                         std::vector<Variable> weights) {
    const nlohmann::json json = parse_config_text(description, "Sequential model description");
    ConfigFields top("Sequential model description", json, "class_name, config, loss, metrics and weight_counts");
    if (top.take_string("class_name") != "Sequential")
        top.fail("\"class_name\" is " + json_text(json["class_name"]) + "; a worker builds \"Sequential\" models");
    const nlohmann::json& config = top.take("config");
    const nlohmann::json& loss = top.take("loss");
    const nlohmann::json& metric_list = top.take("metrics");
    const nlohmann::json& counts = top.take("weight_counts");
    top.finish();
    ConfigFields model("Sequential config", config, "name and layers");
    (void)model.take_string("name");
    const nlohmann::json& layers = model.take("layers");
    model.finish();
    if (!layers.is_array() || layers.empty())
        model.fail("\"layers\" is " + json_text(layers) + ", not a list of at least one layer");
    if (!counts.is_array() || counts.size() != layers.size())
        top.fail("\"weight_counts\" is " + json_text(counts) + "; it lists one count per layer (" +
                 std::to_string(layers.size()) + ")");
    auto out = std::make_shared<RemoteModel>();
    std::size_t at = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
        if (!counts[i].is_number_unsigned() || counts[i].get<std::uint64_t>() > weights.size() - at)
            top.fail("\"weight_counts\"[" + std::to_string(i) + "] is " + json_text(counts[i]) + ", but " +
                     std::to_string(weights.size() - at) + " of the " + std::to_string(weights.size()) +
                     " variables sent are left for layer " + std::to_string(i));
        const auto n = static_cast<std::size_t>(counts[i].get<std::uint64_t>());
        std::vector<Variable> own(weights.begin() + static_cast<std::ptrdiff_t>(at),
                                  weights.begin() + static_cast<std::ptrdiff_t>(at + n));
        at += n;
        out->layers.push_back(bind_layer_from_config(layers[i], std::move(own)));
    }
    if (at != weights.size())
        top.fail("\"weight_counts\" sum to " + std::to_string(at) + ", but " + std::to_string(weights.size()) +
                 " variables were sent");
    out->loss = loss_from_config(loss);
    if (!metric_list.is_array()) top.fail("\"metrics\" is " + json_text(metric_list) + ", not a list");
    for (const auto& m : metric_list) out->metrics.push_back(metrics::from_config(m));
    out->description = description;
    return out;
}

/// Testing hook: forgets the models of worker task `worker` (all workers' for -1), as a restart would.
inline void testing_forget_remote_models(int worker = -1) {
    auto& store = RemoteModels::instance();
    std::lock_guard lock(store.mutex);
    std::erase_if(store.models, [&](const auto& entry) { return worker == -1 || entry.first.first == worker; });
}

#if PSS_DEFINITIONS  // in the library only, under PSS_SEPARATE_COMPILATION: the registrations below reach every layer
/// The registered "build" call: rebuilds the model `description` describes over `weights` and keeps it
/// as `model_id` for this worker (replacing a model of that id), evicting the model used longest ago
/// beyond remote_models_per_worker.
/// @throws InvalidArgumentError for a description that is not one (it came from the network).
PSS_INLINE void keras_remote_build(std::string model_id, std::string description, std::vector<Variable> weights) {
    std::shared_ptr<RemoteModel> model = parse_model_description(description, std::move(weights));
    auto& store = RemoteModels::instance();
    const int worker = worker_index();
    std::lock_guard lock(store.mutex);
    model->last_used = ++store.clock;
    store.models[{worker, model_id}] = std::move(model);
    std::size_t kept = 0;
    auto oldest = store.models.end();
    for (auto it = store.models.begin(); it != store.models.end(); ++it)
        if (it->first.first == worker) {
            ++kept;
            if (oldest == store.models.end() || it->second->last_used < oldest->second->last_used) oldest = it;
        }
    if (kept > remote_models_per_worker) store.models.erase(oldest);
}

/// The registered step call: one training step of the model `model_id` (see keras_train_step).
/// @throws NotFoundError when this worker does not have the model (the chief builds it again):
/// `pss: Sequential: worker task 1 does not have the model 5f3a...; ...`
PSS_INLINE std::vector<double> keras_remote_step(std::string model_id, Tensor x, Tensor y, Tensor weights,
                                                std::uint64_t step, double scale) {
    std::shared_ptr<RemoteModel> model;
    {
        auto& store = RemoteModels::instance();
        std::lock_guard lock(store.mutex);
        const auto it = store.models.find({worker_index(), model_id});
        if (it == store.models.end())
            throw NotFoundError(std::string(remote_model_unknown) + std::to_string(worker_index()) +
                                std::string(remote_model_unknown_tail) + json_text(model_id) +
                                " (it restarted, or evicted the model: a worker keeps the " +
                                std::to_string(remote_models_per_worker) +
                                " models used last); the chief sends it again with the call "
                                "\"pss.keras.Sequential.build\"");
        model = it->second;
        model->last_used = ++store.clock;
    }
    std::lock_guard lock(model->mutex);
    return keras_train_step(model->layers, *model->loss, model->metrics, std::move(x), std::move(y), weights, step,
                            scale);
}
#else
void keras_remote_build(std::string model_id, std::string description, std::vector<Variable> weights);
std::vector<double> keras_remote_step(std::string model_id, Tensor x, Tensor y, Tensor weights, std::uint64_t step,
                                      double scale);
#endif

/// Registered in every program that includes this header, so that worker processes know them.
inline const RegisteredFunction<void(std::string, std::string, std::vector<Variable>)> keras_remote_build_function =
    register_function("pss.keras.Sequential.build", &keras_remote_build);
inline const RegisteredFunction<std::vector<double>(std::string, Tensor, Tensor, Tensor, std::uint64_t, double)>
    keras_remote_step_function =
    register_function("pss.keras.Sequential.step", &keras_remote_step);

/// FNV-1a of `text`, as 16 hex digits: a model's id, from its description and its variables.
inline std::string fnv1a_hex(std::string_view text) {
    std::uint64_t hash = 0xcbf29ce484222325ULL;
    for (char c : text) {
        hash ^= static_cast<std::uint8_t>(c);
        hash *= 0x100000001b3ULL;
    }
    constexpr char hex[] = "0123456789abcdef";
    std::string out(16, '0');
    for (int i = 15; i >= 0; --i, hash >>= 4) out[static_cast<std::size_t>(i)] = hex[hash & 0xf];
    return out;
}

}  // namespace detail

/// @brief A stack of layers trained on a parameter-server cluster (tf.keras.Sequential under
/// ParameterServerStrategy): compile, fit, evaluate, predict.
///
/// The model builds its layers on first use (or `build(input_shape)`), inside the strategy's scope, so
/// every variable lives on the ps tasks (and is sharded as the strategy's partitioner decides). Initial
/// values come from `std::mt19937(seed)`, layer after layer; shuffling from `std::mt19937(seed + 1)`:
/// the same seed gives the same numbers on every platform.
///
/// `fit` runs each step as a closure on a worker, through the strategy's ClusterCoordinator (the same as
/// the program's own, if it made one; one thread per worker on the embedded cluster). Each worker computes with its own copy of the layers
/// (sharing the variables). A step pulls the weights it needs (whole dense weights, only the looked-up
/// rows of an embedding), runs forward and backward, and pushes the gradients; the ps tasks apply the
/// strategy's optimizer to them.
/// - Asynchronous strategy (TensorFlow's mode): one closure per batch, on whichever worker is free.
/// - Synchronous strategy (Strategy::synchronous): step k schedules one closure on each worker, each on its
///   contiguous slice of the batch (the first slices one example longer when the batch does not divide),
///   pulling and pushing with step k. Each worker pushes its slice's mean gradient scaled by
///   num_workers * slice / batch; as the ps averages over workers, the update is exactly the batch's
///   mean gradient: the same as one worker on the whole batch.
///
/// When the workers are other processes (a cluster started by pss-launch, TF_CONFIG, Slurm, ...), the
/// first fit sends each worker the model once: its description (get_config() of the model and
/// serialize(loss), as JSON) and its variables' handles, in the registered call
/// "pss.keras.Sequential.build"; a worker rebuilds the layers over those variables and keeps the model
/// under an id (the 16 models used last). Each step ("pss.keras.Sequential.step") then carries only
/// that id, the batch, the step and the scale. A worker that does not have the model (it restarted)
/// answers NotFoundError; fit then sends the model to every worker again and reruns the steps that did
/// not run, so training goes on with the same numbers. compile() makes the model be sent anew.
///
/// `fit` keeps at most 2 * num_workers + 2 batches in flight, each copied from (x, y) when it is
/// scheduled: an epoch's batches are never all copied at once.
///
/// `evaluate` and `predict` run on the calling thread (the coordinator), reading the current weights.
/// A model is used from one thread at a time, and its strategy outlives it.
///
/// @tparam StrategyType a ParameterServerStrategy (any Strategy with its `optimizer_type`,
/// `synchronous`, `num_workers()` and `optimizer()`)
///
/// @par Example
/// @code
/// pss::ParameterServerStrategy<> strategy;
/// pss::Sequential model(strategy, {pss::Dense(1)});
/// model.compile(pss::SGD(), pss::MeanSquaredError());
/// auto history = model.fit(x, y, 5);  // history.loss: one mean loss per epoch
/// @endcode
template <class StrategyType>
class Sequential : public ModelBase {
    static_assert(detail::keras_strategy<StrategyType>,
                  "pss: Sequential<StrategyType>: StrategyType must be a ParameterServerStrategy (a pss::Strategy with "
                  "optimizer_type, synchronous, num_workers() and optimizer())");

public:
    using strategy_type = StrategyType;
    using optimizer_type = typename StrategyType::optimizer_type;

    /// @param strategy holds the variables and runs the steps; it must outlive the model
    /// @param layers the layers, first to last (copied); more can be added with add() before building
    /// @param seed the seed of initial values and shuffling (Keras' `set_random_seed`)
    explicit Sequential(StrategyType& strategy, std::initializer_list<AnyLayer> layers = {}, std::uint32_t seed = 0)
        : strategy_(&strategy), seed_(seed), shuffle_rng_(seed + 1u) {
        for (const auto& layer : layers) add_layer(layer.clone());
    }
    Sequential(const Sequential&) = delete;
    Sequential& operator=(const Sequential&) = delete;

    /// @brief Appends a layer (Keras' `model.add`).
    /// @throws FailedPreconditionError once the model is built.
    template <std::derived_from<Layer> L>
    void add(L layer) {
        add_layer(std::make_unique<L>(std::move(layer)));
    }

    /// @brief Creates every layer's variables, in the strategy's scope, for inputs of shape (batch,
    /// `input_shape`...) (Keras' `input_shape`, batch axis excluded). fit, evaluate and predict build
    /// from their data when this was not called.
    /// @throws FailedPreconditionError when built already or without layers; InvalidArgumentError
    /// when a layer cannot take its input shape.
    void build(const Shape& input_shape) {
        if (input_shape_)
            throw FailedPreconditionError("pss: Sequential::build: the model is built already, for inputs " +
                                          format_shape(*input_shape_) + " (batch axis excluded)");
        if (layers_.empty())
            throw FailedPreconditionError("pss: Sequential::build: the model has no layers; add() them first");
        auto scope = strategy_->scope();
        std::mt19937 rng(seed_);
        Shape shape = input_shape;
        for (auto& layer : layers_) shape = layer->build(shape, rng);
        input_shape_ = input_shape;
        output_shape_ = shape;
    }
    [[nodiscard]] bool built() const noexcept { return input_shape_.has_value(); }

    /// @brief The layers, first to last (Keras' `model.layers`).
    [[nodiscard]] const std::vector<std::unique_ptr<Layer>>& layers() const noexcept { return layers_; }
    /// @brief The layer named `name` (Keras' `get_layer`). @throws NotFoundError listing the names.
    [[nodiscard]] Layer& get_layer(std::string_view name) const {
        std::string names;
        for (const auto& layer : layers_) {
            if (layer->name() == name) return *layer;
            names += (names.empty() ? "" : ", ") + layer->name();
        }
        throw NotFoundError("pss: Sequential::get_layer: no layer is named '" + std::string(name) +
                            "'; the layers are: " + (names.empty() ? "(none)" : names));
    }
    /// @brief Keras' `get_config()`: `{"name": "sequential", "layers": [serialize(layer), ...]}`.
    [[nodiscard]] nlohmann::json get_config() const {
        nlohmann::json layers = nlohmann::json::array();
        for (const auto& layer : layers_) layers.push_back(serialize(*layer));
        return {{"name", "sequential"}, {"layers", std::move(layers)}};
    }

    /// @brief Keras' `model.summary()`: the layers with their output shapes and parameter counts, as
    /// tf.keras 2 prints a Sequential model (65 columns), then, beyond Keras, each variable with its shape
    /// and the ps tasks that hold its shards, in shard order.
    /// @throws FailedPreconditionError before the model is built (as Keras' ValueError)
    ///
    /// @code
    /// Model: "sequential"
    /// _________________________________________________________________
    ///  Layer (type)                Output Shape              Param #
    /// =================================================================
    ///  dense (Dense)               (None, 16)                64
    /// ...
    /// @endcode
    void summary(std::ostream& out = std::cout) const {
        require_built("summary");
        constexpr std::size_t width = 65;
        const std::array<std::size_t, 3> positions{29, 55, 65};  // Keras' [0.45, 0.85, 1.0] of 65
        const auto rule = [&](char c) { out << std::string(width, c) << "\n"; };
        const auto row = [&](const std::array<std::string, 3>& fields) { detail::summary_row(out, fields, positions); };
        const auto shape_text = [](const Shape& shape) {
            std::string text = "(None";
            for (const auto d : shape) text += ", " + std::to_string(d);
            return text + (shape.empty() ? ",)" : ")");
        };
        std::size_t total = 0;
        out << "Model: \"sequential\"\n";
        rule('_');
        row({"Layer (type)", "Output Shape", "Param #"});
        rule('=');
        for (const auto& layer : layers_) {
            std::size_t params = 0;
            for (const auto& v : layer->weights()) params += num_elements(v.shape());
            total += params;
            row({layer->name() + " (" + std::string(layer->class_name()) + ")", shape_text(layer->output_shape()),
                 std::to_string(params)});
            out << std::string(width, ' ') << "\n";
        }
        rule('=');
        out << "Total params: " << total << "\nTrainable params: " << total << "\nNon-trainable params: 0\n";
        rule('_');
        row({"Variable", "Shape", "On ps"});
        rule('=');
        for (const auto& v : weights()) {
            std::string tasks;
            for (const int task : v.shard_tasks()) tasks += (tasks.empty() ? "" : ",") + std::to_string(task);
            row({v.name(), format_shape(v.shape()), tasks});
        }
        rule('=');
        out << std::flush;
    }

    /// @brief Every layer's variables, first layer first (Keras' `model.weights`).
    [[nodiscard]] std::vector<Variable> weights() const {
        std::vector<Variable> out;
        for (const auto& layer : layers_)
            for (auto& v : layer->weights()) out.push_back(std::move(v));
        return out;
    }
    /// @brief Every weight's value (Keras' `model.get_weights()`).
    [[nodiscard]] std::vector<Tensor> get_weights() const override { return detail::read_weights(weights()); }
    /// @brief Assigns every weight, in the order of weights() (Keras' `model.set_weights()`).
    /// @throws InvalidArgumentError when the count or a shape differs, before any weight changes.
    void set_weights(const std::vector<Tensor>& values) override {
        detail::assign_weights(weights(), values, "Sequential::set_weights", "model");
    }

    /// @brief Saves every weight, with its optimizer slots, as a checkpoint in the directory `path`
    /// (Keras' `save_weights`; the format of pss::Checkpoint, which numpy reads), atomically. The
    /// model's config is in the index's metadata.
    /// @throws FailedPreconditionError before the model is built; what Checkpoint::write throws.
    void save_weights(const std::string& path) const override {
        require_built("save_weights");
        require_checkpoints("save_weights");
        if constexpr (detail::checkpointable_strategy<StrategyType>) {
            Checkpoint<StrategyType> checkpoint(*strategy_, weights());
            checkpoint.set_metadata({{"model", get_config()}});
            checkpoint.write(path);
        }
    }

    /// @brief The rate the ps tasks apply: the one set_learning_rate set, else the optimizer's (Keras'
    /// `model.optimizer.learning_rate`).
    [[nodiscard]] LearningRate learning_rate() const override {
        if constexpr (requires { strategy_->learning_rate(); })
            return strategy_->learning_rate();
        else
            return strategy_->optimizer().learning_rate();
    }

    /// @brief Sets the rate every ps task applies from now on (Keras' `model.optimizer.learning_rate =
    /// rate`; LearningRateScheduler calls it at each epoch's start).
    /// @throws FailedPreconditionError when the optimizer's rate is a schedule, or the strategy cannot set it
    void set_learning_rate(double rate) override {
        if constexpr (requires { strategy_->set_learning_rate(rate); })
            strategy_->set_learning_rate(rate);
        else
            throw FailedPreconditionError("pss: Sequential::set_learning_rate: this strategy has no set_learning_rate");
    }

    /// @brief Restores every weight, and its optimizer slots, from a checkpoint directory written by
    /// save_weights or pss::Checkpoint, into any shard layout (Keras' `load_weights`). Nothing changes
    /// when it throws.
    /// @throws FailedPreconditionError before the model is built; what Checkpoint::restore throws (a
    /// weight missing from the checkpoint, a shape that differs, a corrupt file, ...).
    void load_weights(const std::string& path, RestoreOptions options = {}) {
        require_built("load_weights");
        require_checkpoints("load_weights");
        if constexpr (detail::checkpointable_strategy<StrategyType>) {
            Checkpoint<StrategyType> checkpoint(*strategy_, weights());
            checkpoint.restore(path, options);
        }
    }

    /// @brief Sets the loss and the metrics, and checks the optimizer (Keras' `compile(optimizer, loss,
    /// metrics)`).
    ///
    /// In pss the parameter servers apply the updates, with the strategy's Optimizer policy: the
    /// optimizer given here must be that policy's type (checked at compile time) and be configured as
    /// the strategy's. To train with another optimizer, construct the strategy with it; `compile(loss,
    /// metrics)` is the usual form.
    /// @param loss a pss::Loss (MeanSquaredError, ...) or a Keras name ("mse", ...)
    /// @param metrics Keras names (`"accuracy"`, `"auc"`, ...) or pss::metrics objects: computed by the
    /// workers on each step's predictions, added up on the chief, and reported by fit and evaluate.
    /// @throws InvalidArgumentError when `optimizer` differs from the strategy's:
    /// `pss: Sequential::compile: the optimizer is SGD(learning_rate=0.1), but the strategy's is
    /// SGD(learning_rate=0.01); ...`; for a metric name that is not known.
    template <class OptimizerType, class LossType>
        requires(!std::convertible_to<OptimizerType, std::string_view> && !std::derived_from<OptimizerType, Loss> &&
                 (std::derived_from<LossType, Loss> || std::convertible_to<LossType, std::string_view>))
    void compile(const OptimizerType& optimizer, const LossType& loss, std::vector<AnyMetric> metrics = {}) {
        check_optimizer(optimizer);
        compile(loss, std::move(metrics));
    }
    /// @brief Sets the loss and the metrics; the ps tasks apply the strategy's optimizer.
    template <std::derived_from<Loss> LossType>
    void compile(const LossType& loss, std::vector<AnyMetric> metrics = {}) {
        set_compiled(std::make_shared<LossType>(loss), std::move(metrics));
    }
    void compile(std::string_view loss, std::vector<AnyMetric> metrics = {}) {
        set_compiled(make_loss(loss), std::move(metrics));
    }

    /// @brief The loss given to compile, or nullptr.
    [[nodiscard]] const Loss* loss() const noexcept { return loss_.get(); }

    /// @brief Trains over (x, y) as Keras' `fit`, with its arguments by name (see FitOptions):
    /// `model.fit(x, y, {.epochs = 10, .callbacks = {early}, .validation_split = 0.2})`.
    ///
    /// Each epoch visits the training examples in batches of `batch_size`, in a new seeded permutation
    /// when `shuffle`. An epoch's `loss` is the mean of its batch losses; each compiled metric is computed
    /// by the workers on every step's predictions (before the step's update, as Keras) and added up over
    /// the epoch on the chief. With validation, the held-out data is evaluated on the chief at each
    /// epoch's end (`val_loss`, `val_<metric>`). Callbacks are called on the calling thread: batch hooks
    /// as batches complete, in order (a few batches run ahead on the workers, at most 2 * num_workers + 2,
    /// so a callback that stops training stops it after those).
    /// @param x inputs, shape (examples, input_shape...); an Embedding's ids as floats
    /// @param y targets, batch axis first (class ids as floats for SparseCategoricalCrossentropy)
    /// @return every epoch's logs (History::history), the epochs this call ran
    /// @throws FailedPreconditionError before compile; InvalidArgumentError for options or data that do
    /// not fit (checked before any step runs); the first error a step raised; what a callback threw.
    History fit(const xt::xarray<float>& x, const xt::xarray<float>& y, const FitOptions& options);

    /// @brief fit with Keras' first positional arguments: `fit(x, y, epochs, batch_size)`. With `verbose`,
    /// FitOptions' verbose 1.
    History fit(const xt::xarray<float>& x, const xt::xarray<float>& y, int epochs = 1, std::size_t batch_size = 32,
                bool shuffle = true, bool verbose = true, std::ostream& out = std::cout) {
        return fit(x, y, {.batch_size = batch_size, .epochs = epochs, .verbose = verbose ? 1 : 0, .shuffle = shuffle,
                          .out = &out});
    }

    /// @brief fit with Keras' BackupAndRestore: when `backup.backup_dir` holds a backup, the weights,
    /// their slots and the shuffling are restored from it and training resumes after its last batch;
    /// each epoch (or every `backup.save_freq` batches) ends with a backup (the manager keeps one).
    /// History lists the epochs this call ran; the loss of an epoch resumed midway covers all its batches.
    /// In synchronous training, a resumed fit gives the bits of a fit that never stopped. The same as
    /// `fit(x, y, {..., .callbacks = {backup}})`.
    /// @throws what fit and Checkpoint::restore throw.
    History fit(const xt::xarray<float>& x, const xt::xarray<float>& y, int epochs, std::size_t batch_size,
                const BackupAndRestore& backup, bool shuffle = true, bool verbose = true, std::ostream& out = std::cout) {
        return fit(x, y, {.batch_size = batch_size, .epochs = epochs, .verbose = verbose ? 1 : 0, .callbacks = {backup},
                          .shuffle = shuffle, .out = &out});
    }

    /// @brief The loss over all of (x, y): the mean over the examples, computed in batches of
    /// `batch_size` on the calling thread (Keras' `evaluate` without metrics).
    [[nodiscard]] double evaluate(const xt::xarray<float>& x, const xt::xarray<float>& y, std::size_t batch_size = 32) {
        return evaluate(x, y, EvaluateOptions{.batch_size = batch_size}).at("loss");
    }
    /// @brief The loss and every compiled metric over all of (x, y), computed in batches on the calling
    /// thread (Keras' `evaluate(..., return_dict=True)`): `{"loss": ..., "auc": ...}`. With sample
    /// weights, the loss is the sum of the weighted losses over the examples.
    [[nodiscard]] Logs evaluate(const xt::xarray<float>& x, const xt::xarray<float>& y, const EvaluateOptions& options);

    /// @brief The model's outputs for `x`, shape (examples, output_shape...) (Keras' `predict`).
    [[nodiscard]] xt::xarray<float> predict(const xt::xarray<float>& x, std::size_t batch_size = 32);

private:
    /// Where a fit stands between two batches: the next batch of `epoch` is `batch`, the batches of it
    /// before summed `loss_sum`, and `shuffle_rng` is the generator's state when `epoch` began.
    struct FitPoint {
        int epoch = 0;
        std::size_t batch = 0;
        double loss_sum = 0;
        std::mt19937 shuffle_rng;
        std::vector<double> metric_state;  // the metrics' states over the epoch's batches before `batch`
    };
    /// What fit_epochs calls at a backup point (all batches before it applied): the point, every
    /// `every_batches` batches (0: at each epoch's end).
    struct FitBackup {
        std::size_t every_batches = 0;
        std::function<void(const FitPoint&)> save;
    };

    History fit_epochs(const xt::xarray<float>& x, const xt::xarray<float>& y, const FitOptions& options,
                       const FitPoint& start, const FitBackup& backup);

    /// Loss and metrics over rows [begin, end) of (x, y), on the calling thread, as `prefix` + name.
    Logs evaluate_rows(const xt::xarray<float>& x, const xt::xarray<float>& y, const std::vector<double>& weights,
                       std::size_t begin, std::size_t end, std::size_t batch_size, std::string_view prefix = {});

    /// Per-example weights from sample_weight and class_weight (empty when neither is given).
    std::vector<double> example_weights(const xt::xarray<float>& y, std::size_t examples,
                                        const std::vector<double>& sample_weight,
                                        const std::map<int, double>& class_weight, const char* what) const {
        if (!sample_weight.empty() && sample_weight.size() != examples)
            throw InvalidArgumentError("pss: Sequential::" + std::string(what) + ": sample_weight has " +
                                       std::to_string(sample_weight.size()) + " weights for " +
                                       std::to_string(examples) + " examples; give one weight per example");
        for (double w : sample_weight)
            if (!std::isfinite(w) || w < 0)
                throw InvalidArgumentError("pss: Sequential::" + std::string(what) + ": a sample weight is " +
                                           std::to_string(w) + "; weights are finite and not negative");
        if (class_weight.empty()) return sample_weight;
        if (y.size() != examples)
            throw InvalidArgumentError("pss: Sequential::" + std::string(what) + ": class_weight needs one class id "
                                       "per example, but y has shape " +
                                       format_shape(Shape(y.shape().begin(), y.shape().end())));
        for (const auto& [id, w] : class_weight)
            if (!std::isfinite(w) || w < 0)
                throw InvalidArgumentError("pss: Sequential::" + std::string(what) + ": class_weight of class " +
                                           std::to_string(id) + " is " + std::to_string(w) +
                                           "; weights are finite and not negative");
        std::vector<double> out = sample_weight.empty() ? std::vector<double>(examples, 1.0) : sample_weight;
        for (std::size_t i = 0; i < examples; ++i) {
            const float id = y.data()[i];
            const auto it = id == std::floor(id) && std::abs(id) < 1e9f ? class_weight.find(static_cast<int>(id))
                                                                       : class_weight.end();
            if (it != class_weight.end()) out[i] *= it->second;
        }
        return out;
    }

    void set_compiled(std::shared_ptr<const Loss> loss, std::vector<AnyMetric> metrics) {
        loss_ = std::move(loss);
        metric_specs_ = std::move(metrics);
        metrics_.reset();
        remote_.reset();
    }
    /// The compiled metrics, resolved for the model's outputs (the model is built).
    const detail::MetricList& resolved_metrics() {
        if (!metrics_) {
            detail::MetricList list;
            std::set<std::string> names{"loss"};
            for (const auto& spec : metric_specs_) {
                list.push_back(spec.resolve(*output_shape_));
                if (!names.insert(list.back()->name()).second)
                    throw InvalidArgumentError("pss: Sequential::compile: two metrics are named '" +
                                               list.back()->name() + "' (or one is named 'loss'); name them apart");
            }
            metrics_ = std::move(list);
        }
        return *metrics_;
    }

    /// @throws FailedPreconditionError for a strategy that cannot write checkpoints.
    static void require_checkpoints(const char* what) {
        if constexpr (!detail::checkpointable_strategy<StrategyType>)
            throw FailedPreconditionError(std::string("pss: Sequential::") + what +
                                          ": this strategy cannot write or read checkpoints (pss::Checkpoint takes a "
                                          "ParameterServerStrategy or ClusterStrategy)");
    }

    void require_built(const char* what) const {
        if (!built())
            throw FailedPreconditionError(std::string("pss: Sequential::") + what +
                                          ": the model is not built, so it has no weights yet; call build(input_shape) "
                                          "(or fit) first");
    }

    /// Each worker's own layers: clones of the model's, sharing the variables.
    struct Replica {
        std::vector<std::unique_ptr<Layer>> layers;
    };

    void add_layer(std::unique_ptr<Layer> layer) {
        if (input_shape_)
            throw FailedPreconditionError("pss: Sequential::add: the model is built already (its variables exist on "
                                          "the ps tasks); add every layer before build, fit, evaluate or predict");
        if (layer->name().empty()) {
            // Keras' names, per class within the model: "dense", "dense_1", ...; skipping names taken.
            const std::string base = detail::snake_case(layer->class_name());
            auto taken = [&](const std::string& name) {
                return std::any_of(layers_.begin(), layers_.end(), [&](const auto& l) { return l->name() == name; });
            };
            std::size_t n = static_cast<std::size_t>(std::count_if(
                layers_.begin(), layers_.end(), [&](const auto& l) { return l->class_name() == layer->class_name(); }));
            std::string name = n == 0 ? base : base + "_" + std::to_string(n);
            while (taken(name)) name = base + "_" + std::to_string(++n);
            layer->set_name(std::move(name));
        }
        layers_.push_back(std::move(layer));
        replicas_.reset();
    }

    template <class OptimizerType>
    void check_optimizer(const OptimizerType& optimizer) const {
        static_assert(std::is_same_v<OptimizerType, optimizer_type>,
                      "pss: Sequential::compile: the optimizer must be the strategy's Optimizer policy type: in pss "
                      "the parameter servers apply the strategy's optimizer to the variables they hold, so construct "
                      "ParameterServerStrategy with this optimizer (its OptimizerPolicy argument), or call "
                      "compile(loss)");
        if (!detail::same_optimizer(optimizer, strategy_->optimizer()))
            throw InvalidArgumentError(
                "pss: Sequential::compile: the optimizer is " + detail::describe_optimizer(optimizer) +
                ", but the strategy's is " + detail::describe_optimizer(strategy_->optimizer()) +
                "; in pss the parameter servers apply the strategy's optimizer, so construct the strategy with this "
                "one (ParameterServerStrategy(resolver, partitioner, optimizer)), or call compile(loss)");
    }

    void require_compiled(const char* what) const {
        if (!loss_)
            throw FailedPreconditionError("pss: Sequential::" + std::string(what) +
                                          ": the model is not compiled; call compile(loss) or compile(optimizer, "
                                          "loss) first");
    }

    /// Checks x against the model, building it from x's shape when needed.
    void prepare_inputs(const xt::xarray<float>& x, const char* what) {
        if (x.dimension() == 0 || x.shape()[0] == 0)
            throw InvalidArgumentError("pss: Sequential::" + std::string(what) + ": x has shape " +
                                       format_shape(Shape(x.shape().begin(), x.shape().end())) +
                                       "; give at least one example, batch axis first");
        if (!input_shape_) build(Shape(x.shape().begin() + 1, x.shape().end()));
        layers_.front()->check_inputs(x);
    }
    void prepare_targets(const xt::xarray<float>& y, std::size_t examples, const char* what) const {
        const Shape got(y.shape().begin(), y.shape().end());
        if (got.empty() || got.front() != examples)
            throw InvalidArgumentError("pss: Sequential::" + std::string(what) + ": x has " + std::to_string(examples) +
                                       " examples but y has shape " + format_shape(got) +
                                       "; give one target row per example, batch axis first");
        loss_->check_targets(y, *output_shape_);
    }

    static void check_batch_size(std::size_t batch_size, const char* what) {
        if (batch_size == 0)
            throw InvalidArgumentError("pss: Sequential::" + std::string(what) +
                                       ": batch_size is 0; it must be at least 1 (Keras' default is 32)");
    }

    /// Runs the layers forward, from the first.
    static Tensor run_forward(std::vector<std::unique_ptr<Layer>>& layers, Tensor x, std::uint64_t step) {
        for (auto& layer : layers) x = layer->forward(std::move(x), step);
        return x;
    }

    /// Schedules one step: as a closure on the embedded cluster, as the registered step with the model's
    /// id when the workers are other processes (which have the model: ensure_remote_model). A synchronous
    /// step goes to the given worker, so that each worker pushes once to it; an asynchronous one to
    /// whichever worker is free.
    RemoteValue<std::vector<double>> schedule_step(int worker, Tensor xs, Tensor ys, Tensor ws, std::uint64_t step,
                                                   double scale) {
        auto on_worker = [&](auto&&... args) {
            if constexpr (StrategyType::synchronous)
                return coordinator_->schedule_on(worker, std::forward<decltype(args)>(args)...);
            else
                return coordinator_->schedule(std::forward<decltype(args)>(args)...);
        };
        if (strategy_->remote_workers() != nullptr)
            return on_worker(detail::keras_remote_step_function, remote_->id, std::move(xs), std::move(ys), std::move(ws),
                             step, scale);
        return on_worker(
            [this, step, scale](Replica& replica, Tensor& x, Tensor& y, Tensor& w) {
                return detail::keras_train_step(replica.layers, *loss_, *metrics_, std::move(x), std::move(y), w, step,
                                                scale);
            },
            *replicas_, std::move(xs), std::move(ys), std::move(ws));
    }

    /// Worker processes: makes the model's description and id, and sends them to every worker once.
    void ensure_remote_model() {
        if (!remote_) {
            RemoteModelDescription d;
            nlohmann::json metric_list = nlohmann::json::array();
            for (const auto& m : resolved_metrics()) metric_list.push_back(metrics::serialize(*m));
            nlohmann::json description = {{"class_name", "Sequential"}, {"config", get_config()},
                                          {"loss", serialize(*loss_)}, {"metrics", std::move(metric_list)},
                                          {"weight_counts", nlohmann::json::array()}};
            for (const auto& layer : layers_) {
                const auto w = layer->weights();
                description["weight_counts"].push_back(w.size());
                d.weights.insert(d.weights.end(), w.begin(), w.end());
            }
            d.description = description.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
            // The id names this description over these variables: a worker never confuses two models.
            std::string key = d.description;
            for (const auto& w : d.weights) key += "\n" + w.name() + "#" + std::to_string(w.id());
            d.id = detail::fnv1a_hex(key);
            remote_ = std::move(d);
        }
        if (!remote_->sent) send_remote_model();
    }

    /// The registered build call to every worker task, at once; a worker that is lost is left to the
    /// coordinator (its steps run elsewhere).
    /// @throws the error a worker answered (an InvalidArgumentError for a description it rejects).
    /// Sends the model to every worker, or to worker `only`. A worker runs one call at a time: in
    /// synchronous training one still in a step waits for a step that another worker must run again,
    /// so after a loss the model goes only to the workers that say they lack it.
    void send_remote_model(std::optional<int> only = std::nullopt) {
        detail::RemoteWorkers& workers = *strategy_->remote_workers();
        const std::string& name = detail::keras_remote_build_function.name();
        const Values arguments = detail::encode_values(remote_->id, remote_->description, remote_->weights);
        std::vector<std::future<Reply>> replies;
        for (int w = 0; w < strategy_->num_workers(); ++w) {
            if (only && w != *only) continue;
            Request request;
            request.kind = RequestKind::call;
            request.name = name;
            request.values = arguments;
            replies.push_back(workers.call(w, std::move(request)));
        }
        for (auto& r : replies) {
            Reply reply = r.get();
            if (reply.code == ErrorCode::unavailable) continue;
            detail::decode_result<void>(reply.take_values(), name);
        }
        remote_->sent = true;
    }

    void ensure_workers() {
        if (!coordinator_) coordinator_.emplace(*strategy_);
        // Worker processes rebuild the layers themselves (schedule_step): only in-process workers get clones.
        if (!replicas_ && strategy_->remote_workers() == nullptr)
            replicas_.emplace(coordinator_->create_per_worker_dataset([this](int) {
                Replica replica;
                for (const auto& layer : layers_) replica.layers.push_back(layer->clone());
                return replica;
            }));
    }

    StrategyType* strategy_;
    std::uint32_t seed_;
    std::mt19937 shuffle_rng_;
    std::vector<std::unique_ptr<Layer>> layers_;
    std::optional<Shape> input_shape_, output_shape_;
    std::shared_ptr<const Loss> loss_;
    std::vector<AnyMetric> metric_specs_;
    std::optional<detail::MetricList> metrics_;  // metric_specs_ resolved once the model is built
    std::uint64_t step_ = 0;  // training steps run so far (Keras' optimizer.iterations): the next is step_ + 1
    std::optional<PerWorkerValues<Replica>> replicas_;
    /// What worker processes need to rebuild the model (made at the first remote fit, dropped by compile).
    struct RemoteModelDescription {
        std::string id;           // fnv1a_hex of the description and the variables' names and ids
        std::string description;  // JSON text: see detail::parse_model_description
        std::vector<Variable> weights;
        bool sent = false;  // every worker has it (as far as the chief knows)
    };
    std::optional<RemoteModelDescription> remote_;
    std::optional<ClusterCoordinator> coordinator_;  // last: released first (the strategy's; its last handle stops its threads)
};

// ---------------------------------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------------------------------

template <class StrategyType>
History Sequential<StrategyType>::fit(const xt::xarray<float>& x, const xt::xarray<float>& y,
                                      const FitOptions& options) {
    require_compiled("fit");
    const BackupAndRestore* backup = nullptr;
    for (const auto& c : options.callbacks)
        if (const auto* b = dynamic_cast<const BackupAndRestore*>(c.get())) {
            if (backup != nullptr)
                throw InvalidArgumentError("pss: Sequential::fit: two BackupAndRestore callbacks (" +
                                           backup->backup_dir + " and " + b->backup_dir + "); give one");
            backup = b;
        }
    if (options.initial_epoch < 0)
        throw InvalidArgumentError("pss: Sequential::fit: initial_epoch is " + std::to_string(options.initial_epoch) +
                                   "; it must be 0 or more");
    FitPoint start{options.initial_epoch, 0, 0, shuffle_rng_, {}};
    if (backup == nullptr) return fit_epochs(x, y, options, start, {});
    require_checkpoints("fit with BackupAndRestore");
    if constexpr (detail::checkpointable_strategy<StrategyType>) {

    std::ostream& out = options.out != nullptr ? *options.out : std::cout;
    prepare_inputs(x, "fit");  // builds the model: its weights must exist to be restored
    Checkpoint<StrategyType> checkpoint(*strategy_, weights());
    CheckpointManager<StrategyType> manager(checkpoint, backup->backup_dir, 1);
    if (manager.restore_or_initialize()) {
        const auto& meta = checkpoint.metadata();
        try {
            start.epoch = detail::json_integer<int>(meta.at("epoch"), "\"epoch\"");
            start.batch = meta.contains("batch") ? detail::json_integer<std::size_t>(meta.at("batch"), "\"batch\"") : 0;
            start.loss_sum = meta.value("loss_sum", 0.0);
            if (meta.contains("metric_state"))
                start.metric_state = meta.at("metric_state").template get<std::vector<double>>();
            std::istringstream state(meta.at("shuffle_rng").template get<std::string>());
            state >> start.shuffle_rng;
            if (!state) throw std::invalid_argument("\"shuffle_rng\" is no state of std::mt19937");
        } catch (const std::exception& e) {
            throw InvalidArgumentError("pss: Sequential::fit: the backup in " + backup->backup_dir +
                                       " is malformed: " + e.what());
        }
        // An asynchronous run continues its step count, so a learning-rate schedule goes on where it was. A
        // synchronous one numbers its steps from where the ps tasks' counts are (a restarted chief: 1 again).
        if constexpr (!StrategyType::synchronous) step_ = checkpoint.step();
        if (options.verbose != 0) {
            out << "Restored the backup of epoch " << start.epoch + (start.batch > 0 ? 1 : 0);
            if (start.batch > 0) out << ", batch " << start.batch;
            out << " from " << backup->backup_dir << "\n";
        }
    }
    History history = fit_epochs(x, y, options, start,
                                 {backup->save_freq, [&](const FitPoint& point) {
                                      std::ostringstream state;
                                      state << point.shuffle_rng;
                                      checkpoint.set_step(step_);
                                      checkpoint.set_metadata({{"epoch", point.epoch},
                                                               {"batch", point.batch},
                                                               {"loss_sum", point.loss_sum},
                                                               {"metric_state", point.metric_state},
                                                               {"shuffle_rng", state.str()},
                                                               {"model", get_config()}});
                                      manager.save();
                                  }});
    if (backup->delete_checkpoint) detail::remove_tree_quietly(backup->backup_dir);
    return history;
    } else {
        return {};
    }
}

template <class StrategyType>
History Sequential<StrategyType>::fit_epochs(const xt::xarray<float>& x, const xt::xarray<float>& y,
                                             const FitOptions& options, const FitPoint& start,
                                             const FitBackup& backup) {
    require_compiled("fit");
    check_batch_size(options.batch_size, "fit");
    const std::size_t batch_size = options.batch_size;
    const int epochs = options.epochs;
    if (epochs < 0)
        throw InvalidArgumentError("pss: Sequential::fit: epochs is " + std::to_string(epochs) +
                                   "; it must be 0 or more");
    if (options.verbose < FitOptions::verbose_auto || options.verbose > 2)
        throw InvalidArgumentError("pss: Sequential::fit: verbose is " + std::to_string(options.verbose) +
                                   "; it is FitOptions::verbose_auto (-1: 1 on a terminal, else 2), 0 (silent), 1 "
                                   "(a progress bar) or 2 (one line per epoch)");
    if (!(options.validation_split >= 0 && options.validation_split < 1))
        throw InvalidArgumentError("pss: Sequential::fit: validation_split is " +
                                   std::to_string(options.validation_split) + "; it is in [0, 1)");
    std::ostream& out = options.out != nullptr ? *options.out : std::cout;
    prepare_inputs(x, "fit");
    const std::size_t all_examples = x.shape()[0];
    prepare_targets(y, all_examples, "fit");
    const std::vector<double> weights =
        example_weights(y, all_examples, options.sample_weight, options.class_weight, "fit");
    // Keras' validation_split: the last rows, before shuffling.
    std::size_t examples = all_examples;
    if (options.validation_split > 0 && !options.validation_data) {
        examples = static_cast<std::size_t>(std::floor(static_cast<double>(all_examples) * (1 - options.validation_split)));
        if (examples == 0 || examples == all_examples)
            throw InvalidArgumentError("pss: Sequential::fit: validation_split " +
                                       std::to_string(options.validation_split) + " of " +
                                       std::to_string(all_examples) + " examples leaves " + std::to_string(examples) +
                                       " to train on and " + std::to_string(all_examples - examples) +
                                       " to validate on; each needs at least one");
    }
    std::vector<double> validation_weights;
    if (const auto& v = options.validation_data) {
        prepare_inputs(v->x, "fit (validation_data)");
        prepare_targets(v->y, v->x.shape()[0], "fit (validation_data)");
        validation_weights = example_weights(v->y, v->x.shape()[0], v->sample_weight, {}, "fit (validation_data)");
    }
    const bool validates = options.validation_data || examples < all_examples;
    const detail::MetricList& metric_list = resolved_metrics();
    const std::size_t state_size = detail::metric_state_size(metric_list);
    ensure_workers();

    const bool remote = strategy_->remote_workers() != nullptr;
    if (remote) ensure_remote_model();

    const std::size_t batches = (examples + batch_size - 1) / batch_size;
    if (options.steps_per_epoch > batches)
        throw InvalidArgumentError("pss: Sequential::fit: steps_per_epoch is " + std::to_string(options.steps_per_epoch) +
                                   ", but " + std::to_string(examples) + " examples make " + std::to_string(batches) +
                                   " batches of " + std::to_string(batch_size));
    const std::size_t steps = options.steps_per_epoch > 0 ? options.steps_per_epoch : batches;
    const int verbose =
        options.verbose == FitOptions::verbose_auto ? (detail::is_terminal(out) ? 1 : 2) : options.verbose;
    const bool terminal = verbose == 1 && detail::is_terminal(out);
    const std::size_t workers = static_cast<std::size_t>(coordinator_->num_workers());
    // Batches in flight: enough to keep every worker busy, few enough that an epoch is never copied.
    const std::size_t max_batches_in_flight = 2 * workers + 2;
    // Times the model is sent again to workers that lost it, in this fit, before its error is raised.
    std::size_t rebuilds_left = 2 * workers + 2;
    std::vector<std::size_t> order(examples);
    History history;
    if (start.batch >= steps && start.batch > 0)
        throw InvalidArgumentError("pss: Sequential::fit: the backup resumes at batch " + std::to_string(start.batch) +
                                   " of an epoch, but an epoch of this data has " + std::to_string(steps) +
                                   " batches; it was made with other data or another batch_size");
    if (start.batch > 0 && !start.metric_state.empty() && start.metric_state.size() != state_size)
        throw InvalidArgumentError("pss: Sequential::fit: the backup holds " + std::to_string(start.metric_state.size()) +
                                   " numbers of metric state, but the compiled metrics have " +
                                   std::to_string(state_size) + "; it was made with other metrics");

    std::vector<Callback*> callbacks;
    for (const auto& c : options.callbacks) {
        c->set_model(*this);
        c->set_params({epochs, steps, verbose});
        callbacks.push_back(c.get());
    }
    stop_training = false;
    Logs epoch_logs;
    for (Callback* c : callbacks) c->on_train_begin(epoch_logs);

    shuffle_rng_ = start.shuffle_rng;
    std::size_t batches_since_backup = 0;
    for (int epoch = start.epoch; epoch < epochs && !stop_training; ++epoch) {
        const bool resumed = epoch == start.epoch;
        const std::mt19937 epoch_rng = shuffle_rng_;
        std::iota(order.begin(), order.end(), std::size_t{0});
        if (options.shuffle)  // Fisher-Yates with an unbiased, portable draw (rejection of the uneven tail)
            for (std::size_t i = examples - 1; i > 0; --i) {
                const std::uint64_t range = i + 1;
                const std::uint64_t limit = (std::uint64_t{1} << 32) / range * range;
                std::uint64_t draw;
                do draw = shuffle_rng_();
                while (draw >= limit);
                std::swap(order[i], order[static_cast<std::size_t>(draw % range)]);
            }
        if (verbose > 0) out << "Epoch " << epoch + 1 << "/" << epochs << "\n" << std::flush;
        for (Callback* c : callbacks) c->on_epoch_begin(epoch, {});
        detail::ProgressLine progress(out, verbose, terminal, steps);

        // The closures scheduled and not yet counted, oldest first; batch b's loss is the sum of its
        // closures' losses, each weighted by its share of the batch; its metrics' states are their sum.
        struct Closure {
            int worker;  // a synchronous step's: each worker pushes once to its step
            std::size_t batch, begin, count;
            std::uint64_t step;
            double scale, weight;
            RemoteValue<std::vector<double>> value;
        };
        std::deque<Closure> window;
        auto schedule_rows = [&](const Closure& c) {
            return schedule_step(c.worker, detail::take_rows(x, order, c.begin, c.count),
                                 detail::take_rows(y, order, c.begin, c.count),
                                 detail::take_weights(weights, order, c.begin, c.count), c.step, c.scale);
        };
        // A worker process that lost the model: send the model again and rerun, in the window's order,
        // the closures that failed for it or were cancelled after it (a rerun's pushes to a step it
        // pushed to already change nothing). The error is cleared without waiting for the closures still
        // running: a synchronous step's closure on another worker may wait for one that is rerun here.
        // The model goes to the workers that said they lack it (`lost`, then each closure's), each once.
        auto recover = [&](std::optional<int> lost) {
            std::set<int> sent;
            const auto send_to = [&](std::optional<int> w) {
                if (!w) send_remote_model();
                else if (sent.insert(*w).second) send_remote_model(*w);
            };
            for (bool again = true; again;) {
                again = false;
                for (;;) {
                    try {
                        (void)coordinator_->done();
                        break;
                    } catch (const UnavailableError&) {
                        throw;
                    } catch (const Error&) {  // each closure's own error is looked at below
                    }
                }
                if (lost) send_to(lost);
                for (auto& c : window) {
                    try {
                        (void)c.value.fetch();
                        continue;
                    } catch (const CancelledError&) {
                    } catch (const NotFoundError& e) {
                        if (!detail::is_remote_model_unknown(e)) throw;
                        send_to(detail::remote_model_unknown_worker(e));
                    }
                    try {
                        c.value = schedule_rows(c);
                    } catch (const Error&) {  // a closure failed meanwhile: its own value says how, next round
                        if (rebuilds_left == 0) throw;
                        --rebuilds_left;
                        again = true;
                        break;
                    }
                }
            }
        };
        // A failed closure's error may also surface from schedule (TensorFlow's coordinator raises it
        // from the next schedule, join or fetch), so scheduling recovers the same way as counting.
        auto recover_or_throw = [&](const NotFoundError& e) {
            if (!remote || !detail::is_remote_model_unknown(e) || rebuilds_left == 0) throw e;
            --rebuilds_left;
            recover(detail::remote_model_unknown_worker(e));
        };
        auto schedule_closure = [&](Closure c) {
            for (;;) {
                try {
                    c.value = schedule_rows(c);
                    break;
                } catch (const NotFoundError& e) {
                    recover_or_throw(e);
                }
            }
            window.push_back(std::move(c));
        };
        double sum = resumed ? start.loss_sum : 0;
        std::size_t counted = resumed ? start.batch : 0;
        std::vector<double> state = resumed && start.batch > 0 && !start.metric_state.empty()
                                        ? start.metric_state
                                        : std::vector<double>(state_size, 0.0);
        // The running logs: the mean batch loss so far, and the metrics over the batches so far.
        auto running_logs = [&] {
            Logs logs{{"loss", counted == 0 ? 0.0 : sum / static_cast<double>(counted)}};
            detail::metric_results(metric_list, state, logs);
            return logs;
        };
        auto count_batch = [&] {  // the oldest batch's loss and metrics, once its closures are done
            for (;;) {
                try {
                    double batch_loss = 0;
                    std::vector<double> batch_state(state_size, 0.0);
                    std::size_t n = 0;
                    for (; n < window.size() && window[n].batch == counted; ++n) {
                        const std::vector<double>& result = window[n].value.fetch();
                        if (result.size() != 1 + state_size)
                            throw InternalError("pss: Sequential::fit: a step returned " + std::to_string(result.size()) +
                                                " numbers; the loss and " + std::to_string(state_size) +
                                                " of metric state were expected");
                        batch_loss += window[n].weight * result[0];
                        for (std::size_t i = 0; i < state_size; ++i) batch_state[i] += result[1 + i];
                    }
                    window.erase(window.begin(), window.begin() + static_cast<std::ptrdiff_t>(n));
                    sum += batch_loss;
                    for (std::size_t i = 0; i < state_size; ++i) state[i] += batch_state[i];
                    ++counted;
                    if (terminal || !callbacks.empty()) {
                        const Logs logs = running_logs();
                        progress.update(counted, logs);
                        for (Callback* c : callbacks) c->on_train_batch_end(counted - 1, logs);
                    }
                    return;
                } catch (const NotFoundError& e) {
                    recover_or_throw(e);
                } catch (const CancelledError&) {  // cancelled by another closure's failure: maybe a lost model
                    if (!remote || rebuilds_left == 0) throw;
                    --rebuilds_left;
                    recover(std::nullopt);
                }
            }
        };
        std::size_t scheduled = counted;
        try {
            for (std::size_t b = counted; b < steps && !stop_training; ++b) {
                for (Callback* c : callbacks) c->on_train_batch_begin(b, {});
                const std::size_t begin = b * batch_size;
                const std::size_t count = std::min(batch_size, examples - begin);
                if constexpr (StrategyType::synchronous) {
                    const std::uint64_t step = ++step_;
                    for (std::size_t w = 0, at = begin; w < workers; ++w) {
                        const std::size_t slice = count / workers + (w < count % workers ? 1 : 0);
                        const double weight = static_cast<double>(slice) / static_cast<double>(count);
                        const double scale = static_cast<double>(workers) * weight;
                        schedule_closure({static_cast<int>(w), b, at, slice, step, scale, weight, {}});
                        at += slice;
                    }
                } else {  // numbered too: a learning-rate schedule on the ps is evaluated at the step
                    schedule_closure({0, b, begin, count, ++step_, 1.0, 1.0, {}});
                }
                scheduled = b + 1;
                if (b + 1 - counted > max_batches_in_flight) count_batch();
                // A backup within the epoch: every batch up to b applied, then saved (one at its end waits
                // for the epoch's own).
                if (backup.save && backup.every_batches > 0 && ++batches_since_backup == backup.every_batches) {
                    batches_since_backup = 0;
                    if (b + 1 < steps) {
                        while (counted < b + 1) count_batch();
                        coordinator_->join();
                        backup.save({epoch, b + 1, sum, epoch_rng, state});
                    }
                }
            }
            while (counted < scheduled) count_batch();
            coordinator_->join();
        } catch (...) {
            if (terminal) out << "\n" << std::flush;
            coordinator_->join();  // raises the first error (and clears it); else rethrow what fetch raised
            throw;
        }
        epoch_logs = running_logs();
        if (validates) {
            const Logs val = options.validation_data
                                 ? evaluate_rows(options.validation_data->x, options.validation_data->y,
                                                 validation_weights, 0, options.validation_data->x.shape()[0],
                                                 batch_size, "val_")
                                 : evaluate_rows(x, y, options.sample_weight, examples, all_examples, batch_size,
                                                 "val_");  // as Keras: class_weight weighs training only
            for (const auto& [name, value] : val) epoch_logs.set(name, value);
        }
        progress.finish(epoch_logs);
        history.epoch.push_back(epoch);
        history.loss.push_back(epoch_logs.at("loss"));
        for (const auto& [name, value] : epoch_logs) history.history[name].push_back(value);
        if (backup.save && (backup.every_batches == 0 || batches_since_backup == 0) && counted == steps)
            backup.save({epoch + 1, 0, 0, shuffle_rng_, {}});
        for (Callback* c : callbacks) c->on_epoch_end(epoch, epoch_logs);
    }
    for (Callback* c : callbacks) c->on_train_end(epoch_logs);
    return history;
}

template <class StrategyType>
Logs Sequential<StrategyType>::evaluate_rows(const xt::xarray<float>& x, const xt::xarray<float>& y,
                                             const std::vector<double>& weights, std::size_t begin, std::size_t end,
                                             std::size_t batch_size, std::string_view prefix) {
    const detail::MetricList& metric_list = resolved_metrics();
    std::vector<double> state(detail::metric_state_size(metric_list), 0.0);
    std::vector<std::size_t> order(end - begin);
    std::iota(order.begin(), order.end(), begin);
    double total = 0;
    for (std::size_t at = 0; at < order.size(); at += batch_size) {
        const std::size_t count = std::min(batch_size, order.size() - at);
        const Tensor predictions = run_forward(layers_, detail::take_rows(x, order, at, count), 0);
        const Tensor targets(detail::take_rows(y, order, at, count));
        const Tensor w = detail::take_weights(weights, order, at, count);
        const std::span<const double> ws = detail::step_weights(w, count);
        double penalty = 0;  // the regularizers' (Keras' evaluate adds them to each batch's loss)
        for (const auto& layer : layers_) penalty += layer->regularization_loss();
        total += (detail::weighted_loss(*loss_, targets, predictions, ws, nullptr) + penalty) * static_cast<double>(count);
        detail::accumulate_metrics(metric_list, state, targets, predictions, ws);
    }
    Logs logs{{std::string(prefix) + "loss", total / static_cast<double>(order.size())}};
    detail::metric_results(metric_list, state, logs, prefix);
    return logs;
}

template <class StrategyType>
Logs Sequential<StrategyType>::evaluate(const xt::xarray<float>& x, const xt::xarray<float>& y,
                                        const EvaluateOptions& options) {
    require_compiled("evaluate");
    check_batch_size(options.batch_size, "evaluate");
    prepare_inputs(x, "evaluate");
    const std::size_t examples = x.shape()[0];
    prepare_targets(y, examples, "evaluate");
    const std::vector<double> weights = example_weights(y, examples, options.sample_weight, {}, "evaluate");
    return evaluate_rows(x, y, weights, 0, examples, options.batch_size);
}

template <class StrategyType>
xt::xarray<float> Sequential<StrategyType>::predict(const xt::xarray<float>& x, std::size_t batch_size) {
    check_batch_size(batch_size, "predict");
    prepare_inputs(x, "predict");
    const std::size_t examples = x.shape()[0];
    Shape shape = *output_shape_;
    shape.insert(shape.begin(), examples);
    xt::xarray<float> out = xt::xarray<float>::from_shape(shape);
    const std::size_t width = num_elements(*output_shape_);
    std::vector<std::size_t> order(examples);
    std::iota(order.begin(), order.end(), std::size_t{0});
    for (std::size_t begin = 0; begin < examples; begin += batch_size) {
        const std::size_t count = std::min(batch_size, examples - begin);
        const Tensor predictions = run_forward(layers_, detail::take_rows(x, order, begin, count), 0);
        predictions.visit(
            [&](const auto& p) {
                std::transform(p.begin(), p.end(), out.data() + begin * width, [](auto v) { return static_cast<float>(v); });
                return 0;
            },
            0);
    }
    return out;
}

PSS_NAMESPACE_END
