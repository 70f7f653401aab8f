// pss/keras/model.hpp: Model (Keras' functional API) and Sequential, Keras-style models trained by scheduling steps on a strategy's workers (compile, fit, evaluate, predict).
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
#include <atomic>
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
#include <pss/data.hpp>
#include <pss/detail/closure_context.hpp>
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

/// @brief A model's input data: one array for a model of one input, or one array per input of a
/// functional model, in the order of its inputs (Keras' `x` as an array or a list of arrays), each with
/// the examples on its first axis. It refers to the arrays it is given as lvalues (no copy: they must
/// outlive the call it is given to) and keeps those moved in or converted (another element type, an
/// xtensor expression).
///
/// @code
/// model.fit(x, y);                      // one input
/// model.fit({wide_ids, deep_ids}, y);   // a Model of two inputs
/// @endcode
class ModelInputs {
public:
    ModelInputs(const xt::xarray<float>& x) { refer(x); }  // NOLINT: implicit by design, as Keras' x
    ModelInputs(xt::xarray<float>&& x) { keep(std::move(x)); }  // NOLINT
    /// @brief An array of another element type or an xtensor expression, converted to float.
    template <class E>
        requires(xt::is_xexpression<std::decay_t<E>>::value && !std::is_same_v<std::decay_t<E>, xt::xarray<float>>)
    ModelInputs(E&& x) {  // NOLINT
        keep(xt::xarray<float>(std::forward<E>(x)));
    }
    ModelInputs(const std::vector<xt::xarray<float>>& xs) {  // NOLINT
        for (const auto& x : xs) refer(x);
    }
    ModelInputs(std::vector<xt::xarray<float>>&& xs) {  // NOLINT
        for (auto& x : xs) keep(std::move(x));
    }
    ModelInputs(std::initializer_list<std::reference_wrapper<const xt::xarray<float>>> xs) {  // NOLINT
        for (const auto& x : xs) refer(x.get());
    }

    [[nodiscard]] std::size_t size() const noexcept { return arrays_.size(); }
    [[nodiscard]] const xt::xarray<float>& operator[](std::size_t i) const { return *arrays_.at(i); }
    /// @brief The number of examples: the first axis of the first array (0 for none or a scalar).
    [[nodiscard]] std::size_t examples() const {
        return arrays_.empty() || arrays_.front()->dimension() == 0 ? 0 : arrays_.front()->shape()[0];
    }
    /// @brief A copy that keeps every array (copying those it refers to).
    [[nodiscard]] ModelInputs kept() const {
        ModelInputs out(std::vector<xt::xarray<float>>{});
        for (const auto& a : arrays_) out.keep(xt::xarray<float>(*a));
        return out;
    }

private:
    void refer(const xt::xarray<float>& x) { arrays_.emplace_back(std::shared_ptr<const xt::xarray<float>>(), &x); }
    void keep(xt::xarray<float>&& x) { arrays_.push_back(std::make_shared<const xt::xarray<float>>(std::move(x))); }

    std::vector<std::shared_ptr<const xt::xarray<float>>> arrays_;
};

/// @brief Data fit validates on at the end of every epoch (Keras' `validation_data`: `(x, y)` or `(x,
/// y, sample_weight)`). It keeps copies of its arrays.
struct ValidationData {
    /// @param x one array, or one per input of a functional model
    /// @param sample_weight empty, or one weight per example
    ValidationData(const ModelInputs& x, xt::xarray<float> y, std::vector<double> sample_weight = {})
        : x(x.kept()), y(std::move(y)), sample_weight(std::move(sample_weight)) {}
    ModelInputs x;
    xt::xarray<float> y;
    std::vector<double> sample_weight;  ///< empty, or one weight per example
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
inline void summary_row(std::ostream& out, std::vector<std::string> fields, const std::vector<std::size_t>& positions) {
    while (std::any_of(fields.begin(), fields.end(), [](const std::string& f) { return !f.empty(); })) {
        std::string line;
        for (std::size_t col = 0; col < fields.size(); ++col) {
            const bool last = col + 1 == fields.size();
            const std::size_t start = col == 0 ? 0 : positions[col - 1];
            const std::size_t space = last ? 0 : 2;
            const std::size_t cutoff = positions[col] - start - space - (last ? 0 : 1);
            if (col == 0) line += ' ';
            std::string fit = fields[col].substr(0, cutoff);
            // As Keras: a long list breaks after the end of an item ("),", "},", "],", "',").
            std::size_t end = std::string::npos;
            for (const char* mark : {"),", "},", "],", "',"})
                if (const std::size_t at = fit.find(mark); at != std::string::npos) end = std::min(end, at + 2);
            if (end != std::string::npos) fit.resize(end);
            line += fit;
            line += std::string(space, ' ');
            fields[col].erase(0, fit.size());
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
        } else {  // formatted apart: the user's stream keeps its own precision and flags
            std::ostringstream line;
            if (verbose_ == 2) {  // Keras' verbose=2: `4/4 - 0s - loss: 0.1234 - 12ms/epoch - 3ms/step`
                const double seconds = elapsed();
                line << total_ << "/" << total_ << " - " << std::fixed << std::setprecision(0) << seconds << "s"
                     << values(logs) << " - " << per(seconds, "epoch") << " - "
                     << per_step(seconds / static_cast<double>(std::max<std::size_t>(total_, 1)));
            } else {
                line << total_ << "/" << total_;
                for (const auto& [name, value] : logs)
                    line << " - " << name << ": " << std::fixed << std::setprecision(6) << value;
            }
            out_ << line.str() << "\n";
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

/// A model's layers as a graph, each layer after the layers it takes inputs from; the last layer's
/// output is the model's. A source names where an input comes from: -1 - k for the model's input k,
/// i for layer i's output. A Sequential model is a chain (layer i takes source i - 1).
struct LayerGraph {
    std::vector<std::unique_ptr<Layer>> layers;
    std::vector<std::vector<int>> sources;  // each layer's inputs, in the order it was called on them
    std::size_t num_inputs = 1;

    void add(std::unique_ptr<Layer> layer, std::vector<int> from) {
        layers.push_back(std::move(layer));
        sources.push_back(std::move(from));
        last_reads.clear();
    }

    /// Copies sharing the variables, with their own per-step state: one per worker.
    [[nodiscard]] LayerGraph clone() const {
        LayerGraph out;
        for (const auto& layer : layers) out.layers.push_back(layer->clone());
        out.sources = sources;
        out.num_inputs = num_inputs;
        return out;
    }

    /// Every layer's variables, in the layers' order (Keras' `model.weights`).
    [[nodiscard]] std::vector<Variable> weights() const {
        std::vector<Variable> out;
        for (const auto& layer : layers)
            for (auto& v : layer->weights()) out.push_back(std::move(v));
        return out;
    }

    /// The layers' regularization penalties (Keras' `model.losses`), of the weights the last forward pulled.
    [[nodiscard]] double regularization_loss() const {
        double sum = 0;
        for (const auto& layer : layers) sum += layer->regularization_loss();
        return sum;
    }

    /// Runs the layers forward on one batch of each input; returns the last layer's output. A layer's
    /// output is moved to its last reader (a chain copies nothing) and copied to the others.
    Tensor forward(std::vector<Tensor> inputs, std::uint64_t step) {
        if (last_reads.empty()) find_last_reads();
        std::vector<Tensor> outputs(layers.size());
        auto read = [&](std::size_t i, std::size_t j) {
            const int from = sources[i][j];
            Tensor& t = from < 0 ? inputs[static_cast<std::size_t>(-1 - from)] : outputs[static_cast<std::size_t>(from)];
            return last_reads[i][j] ? std::move(t) : Tensor(t);
        };
        for (std::size_t i = 0; i < layers.size(); ++i) {
            if (auto* merge = dynamic_cast<Merge*>(layers[i].get())) {
                std::vector<Tensor> args;
                for (std::size_t j = 0; j < sources[i].size(); ++j) args.push_back(read(i, j));
                outputs[i] = merge->forward_list(std::move(args));
            } else {
                outputs[i] = layers[i]->forward(read(i, 0), step);
            }
        }
        return std::move(outputs.back());
    }

    /// Runs the layers backward from the gradient of the output, last layer first, calling `push` with
    /// each VariableGradient as its layer gives it. A layer read by several is given the sum of their
    /// gradients.
    template <class Push>
    void backward(Tensor grad_outputs, Push&& push) {
        std::vector<Tensor> grads(layers.size());
        grads.back() = std::move(grad_outputs);
        for (std::size_t i = layers.size(); i-- > 0;) {
            std::vector<Tensor> to_inputs;
            if (auto* merge = dynamic_cast<Merge*>(layers[i].get())) {
                to_inputs = merge->backward_list(grads[i]);
            } else {
                LayerGradients g = layers[i]->backward(grads[i]);
                for (auto& v : g.variables) push(v);
                to_inputs.push_back(std::move(g.inputs));
            }
            grads[i] = Tensor();
            for (std::size_t j = 0; j < sources[i].size() && j < to_inputs.size(); ++j) {
                const int from = sources[i][j];
                if (from < 0) continue;  // the data's gradient: not needed
                Tensor& sum = grads[static_cast<std::size_t>(from)];
                if (!sum.has_value()) {
                    sum = std::move(to_inputs[j]);
                } else {
                    sum.visit_mut([&](auto& a) {
                        using T = typename std::decay_t<decltype(a)>::value_type;
                        a += take_as<T>(std::move(to_inputs[j]));
                    });
                }
            }
        }
    }

private:
    // last_reads[i][j]: source j of layer i is read for the last time there (in forward's order).
    std::vector<std::vector<bool>> last_reads;

    void find_last_reads() {
        std::set<int> read_later;
        last_reads.assign(layers.size(), {});
        for (std::size_t i = layers.size(); i-- > 0;) {
            last_reads[i].assign(sources[i].size(), false);
            for (std::size_t j = sources[i].size(); j-- > 0;)
                last_reads[i][j] = read_later.insert(sources[i][j]).second;
        }
    }
};

/// The examples in a step's batches, after checking that there is one batch per model input.
inline std::size_t step_examples(const LayerGraph& graph, const std::vector<Tensor>& x, std::string_view what) {
    if (x.size() != graph.num_inputs)
        throw InvalidArgumentError("pss: a " + std::string(what) + " step got " + std::to_string(x.size()) +
                                   " input batches for a model of " + std::to_string(graph.num_inputs) + " inputs");
    return x.empty() || x.front().rank() == 0 ? 0 : x.front().shape().front();
}

/// True when `weights` train synchronously: each step completes at the ps once every worker pushed.
inline bool trains_synchronously(const std::vector<Variable>& weights) {
    return !weights.empty() && weights.front().info_ptr()->channel->synchronous();
}

/// Synchronous training: a worker's part of `step` for `weight` when the worker has no gradient for it
/// (its closure failed or never ran). An empty sparse gradient counts as the worker's push and adds
/// nothing, so the step completes with the other workers' gradients, scaled by 1 / workers as always,
/// and a step no worker gave a gradient leaves the weight and its optimizer slots as they were. A
/// scalar weight has no rows: it gets zeros, which a momentum or Adam slot still steps with.
inline void push_no_gradient(Variable weight, std::uint64_t step) {
    if (weight.shape().empty())
        (void)weight.apply_gradient(Tensor::zeros(weight.dtype(), {}), step);
    else
        (void)weight.apply_sparse_gradient({}, Tensor::zeros(weight.dtype(), rows_shape(weight.shape(), 0)), step);
}

/// Synchronous training: pushes this worker's part of `step` (push_no_gradient) to each of `weights`
/// whose id is not in `pushed`, so that the step completes at the ps tasks and no later pull waits for
/// it. Not cancelled by the coordinator (it completes a step others wait for), and quiet: the error of
/// the closure that gave up is the one raised; a push refused here is left to the step's pulls.
inline void push_rest_of_step(const std::vector<Variable>& weights, std::uint64_t step,
                              std::span<const std::uint64_t> pushed) {
    const ClosureContext uncancelled = ClosureContext::uncancelled();
    const ClosureContext::Guard guard(uncancelled);
    for (const Variable& weight : weights) {
        if (std::find(pushed.begin(), pushed.end(), weight.id()) != pushed.end()) continue;
        try {
            push_no_gradient(weight, step);
        } catch (...) {  // see above
        }
    }
}

/// One training step: pull, forward, loss, backward, push, each layer in its dtype. Returns the slice's
/// loss (0 for an empty slice, which still pulls and pushes: a synchronous step needs every worker),
/// then the metrics' states for the slice (see accumulate_metrics), computed on the step's predictions.
/// `x` holds one batch per model input.
///
/// Synchronous training never leaves the step half-pushed by this worker: the pushes, once begun, are
/// not cancelled by another closure's failure, and when the step fails (a layer throws, a ps refuses a
/// non-finite gradient, a pull is cancelled) the weights it did not push get push_no_gradient before
/// its error is raised. A weight whose push a ps refused gets it too; one sharded over several ps tasks
/// of which only some refused it gets it on all, and on those that took the push it is a second push
/// (refused once the step is applied, else it completes the step early). An UnavailableError (a lost
/// task) pushes nothing: the coordinator runs such a closure again.
inline std::vector<double> keras_train_step(LayerGraph& graph, const Loss& loss, const MetricList& metrics,
                                            std::vector<Tensor> x, Tensor y, const Tensor& weights, std::uint64_t step,
                                            double scale) {
    const StepProfile::Timer timer(StepProfile::Counter::step);  // times nothing unless a benchmark enabled it
    const std::vector<Variable> variables = graph.weights();
    const bool synchronous = step != 0 && trains_synchronously(variables);
    std::vector<std::uint64_t> pushed;  // the ids of the weights this step pushed
    try {
        const std::size_t examples = step_examples(graph, x, "training");
        const std::span<const double> w = step_weights(weights, examples);
        Tensor predictions = graph.forward(std::move(x), step);
        std::vector<double> out(1 + metric_state_size(metrics), 0.0);
        Tensor grad;
        if (examples == 0) {
            grad = Tensor::zeros(predictions.dtype(), predictions.shape());
        } else {
            out[0] = weighted_loss(loss, y, predictions, w, &grad);
            out[0] += graph.regularization_loss();  // Keras' model.losses
            accumulate_metrics(metrics, std::span<double>(out).subspan(1), y, predictions, w);
        }
        if (scale != 1.0)
            grad.visit_mut([&](auto& g) { g *= static_cast<typename std::decay_t<decltype(g)>::value_type>(scale); });
        const ClosureContext uncancelled = ClosureContext::uncancelled();
        std::optional<ClosureContext::Guard> pushing;  // see above
        if (synchronous && ClosureContext::current() != nullptr) pushing.emplace(uncancelled);
        // The step's pushes go as one Group, waited for once after the last. The variables whose push a
        // ps refused are not `pushed`: a synchronous step completes them with an empty push (below).
        Group pushes;
        const auto forget_refused = [&] {
            for (const std::uint64_t id : pushes.failed()) std::erase(pushed, id);
        };
        try {
            graph.backward(std::move(grad), [&](VariableGradient& g) {
                Tensor values = g.values.dtype() == g.variable.dtype() ? std::move(g.values)
                                                                       : convert_tensor(g.values, g.variable.dtype());
                if (g.sparse)
                    (void)g.variable.apply_sparse_gradient(std::span<const std::int64_t>(g.ids), std::move(values), step);
                else
                    (void)g.variable.apply_gradient(std::move(values), step);
                if (synchronous) pushed.push_back(g.variable.id());
            });
        } catch (...) {
            try {
                pushes.wait();  // what was sent: its refusals must be known too
            } catch (...) {
            }
            forget_refused();
            throw;
        }
        try {
            const StepProfile::Timer timer(StepProfile::Counter::push);
            pushes.wait();
        } catch (...) {
            forget_refused();
            throw;
        }
        return out;
    } catch (const UnavailableError&) {
        throw;  // a lost task: the coordinator runs the closure again (its pushes complete the step), or raises
    } catch (...) {
        if (synchronous) push_rest_of_step(variables, step, pushed);
        throw;
    }
}

/// One evaluation batch (Keras' test step, which evaluate schedules on the workers): a pull and a forward
/// outside training (no step: Dropout passes its inputs), nothing pushed. Returns the batch's loss with
/// the regularizers' penalty added (Keras' evaluate adds model.losses to each batch's loss), then the
/// metrics' states for the batch.
inline std::vector<double> keras_test_step(LayerGraph& graph, const Loss& loss, const MetricList& metrics,
                                           std::vector<Tensor> x, Tensor y, const Tensor& weights) {
    const std::span<const double> w = step_weights(weights, step_examples(graph, x, "test"));
    const Tensor predictions = graph.forward(std::move(x), 0);
    std::vector<double> out(1 + metric_state_size(metrics), 0.0);
    out[0] = weighted_loss(loss, y, predictions, w, nullptr) + graph.regularization_loss();
    accumulate_metrics(metrics, std::span<double>(out).subspan(1), y, predictions, w);
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
    LayerGraph graph;
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

/// The graph of a functional model's config (Model::get_config, Keras' "Functional" format), its layers
/// bound to `weights` as `counts` (one count per layer that is not an InputLayer) allot them.
inline LayerGraph parse_functional_config(const nlohmann::json& config, const nlohmann::json& counts,
                                          const std::vector<Variable>& weights, ConfigFields& top) {
    ConfigFields model("Functional config", config, "name, layers, input_layers and output_layers");
    (void)model.take_string("name");
    const nlohmann::json& layers = model.take("layers");
    const nlohmann::json& input_layers = model.take("input_layers");
    const nlohmann::json& output_layers = model.take("output_layers");
    model.finish();
    if (!layers.is_array() || layers.empty())
        model.fail("\"layers\" is " + json_text(layers) + ", not a list of at least one layer");
    if (!input_layers.is_array() || input_layers.empty())
        model.fail("\"input_layers\" is " + json_text(input_layers) + ", not a list of at least one input");
    // A reference to a layer's output: [name, 0, 0] (pss has no shared layers: node 0, tensor 0).
    auto reference = [&](const nlohmann::json& r, const std::string& where, std::size_t extra) {
        if (!r.is_array() || r.size() != 3 + extra || !r[0].is_string() || r[1] != 0 || r[2] != 0 ||
            (extra == 1 && !r[3].is_object()))
            model.fail(where + " is " + json_text(r) + ", not a reference [\"name\", 0, 0" +
                       (extra == 1 ? ", {}" : "") + "] (pss has no shared layers: node and tensor 0)");
        return r[0].get<std::string>();
    };
    std::map<std::string, int> input_index;
    for (std::size_t k = 0; k < input_layers.size(); ++k)
        if (!input_index.emplace(reference(input_layers[k], "\"input_layers\"[" + std::to_string(k) + "]", 0),
                                 -1 - static_cast<int>(k)).second)
            model.fail("\"input_layers\" names an input twice: " + json_text(input_layers));
    std::map<std::string, int> source_of;  // the inputs and layers seen so far, by name
    std::map<int, Shape> shape_of;         // by source
    LayerGraph graph;
    graph.num_inputs = input_layers.size();
    std::size_t layer_count = 0, at = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
        const std::string where = "\"layers\"[" + std::to_string(i) + "]";
        ConfigFields entry("Functional config " + where, layers[i], "class_name, config, name and inbound_nodes");
        const std::string cls = entry.take_string("class_name");
        const nlohmann::json& layer_config = entry.take("config");
        const std::string name = entry.take_string("name");
        const nlohmann::json& inbound = entry.take("inbound_nodes");
        entry.finish();
        if (source_of.contains(name)) entry.fail("the name " + json_text(name) + " is taken by an earlier layer");
        if (cls == "InputLayer") {
            ConfigFields fields("InputLayer config", layer_config, "name, batch_input_shape and dtype");
            if (fields.take_string("name") != name) fields.fail("\"name\" differs from the layer's " + json_text(name));
            Shape shape = fields.take_batch_input_shape("batch_input_shape");
            if (fields.take_string("dtype") != "float32") fields.fail("\"dtype\" is not \"float32\", a model input's");
            fields.finish();
            const auto k = input_index.find(name);
            if (k == input_index.end()) entry.fail("the InputLayer " + json_text(name) + " is not in \"input_layers\"");
            if (!inbound.is_array() || !inbound.empty()) entry.fail("\"inbound_nodes\" of an InputLayer is not []");
            source_of[name] = k->second;
            shape_of[k->second] = std::move(shape);
            continue;
        }
        LayerConfig parsed = parse_layer_config({{"class_name", cls}, {"config", layer_config}});
        if (parsed.layer->name() != name) entry.fail("\"name\" differs from its config's " + json_text(parsed.layer->name()));
        if (!inbound.is_array() || inbound.size() != 1 || !inbound[0].is_array() || inbound[0].empty())
            entry.fail("\"inbound_nodes\" is " + json_text(inbound) +
                       ", not one node of the layers it is called on ([[[\"name\", 0, 0, {}], ...]])");
        std::vector<int> from;
        std::vector<Shape> shapes;
        for (std::size_t j = 0; j < inbound[0].size(); ++j) {
            const std::string called_on =
                reference(inbound[0][j], where + "'s \"inbound_nodes\"[0][" + std::to_string(j) + "]", 1);
            const auto it = source_of.find(called_on);
            if (it == source_of.end())
                entry.fail("it is called on " + json_text(called_on) + ", which is not an input or an earlier layer");
            from.push_back(it->second);
            shapes.push_back(shape_of.at(it->second));
        }
        if (layer_count >= counts.size())
            top.fail("\"weight_counts\" is " + json_text(counts) + "; it lists one count per layer that is not an "
                     "InputLayer");
        const nlohmann::json& count = counts[layer_count++];
        if (!count.is_number_unsigned() || count.get<std::uint64_t>() > weights.size() - at)
            top.fail("\"weight_counts\"[" + std::to_string(layer_count - 1) + "] is " + json_text(count) + ", but " +
                     std::to_string(weights.size() - at) + " of the " + std::to_string(weights.size()) +
                     " variables sent are left for it");
        const auto n = static_cast<std::size_t>(count.get<std::uint64_t>());
        std::vector<Variable> own(weights.begin() + static_cast<std::ptrdiff_t>(at),
                                  weights.begin() + static_cast<std::ptrdiff_t>(at + n));
        at += n;
        Shape out;
        if (auto* merge = dynamic_cast<Merge*>(parsed.layer.get())) {
            if (n != 0) top.fail("\"weight_counts\" gives " + std::to_string(n) + " variables to " + json_text(name) +
                                 ", a merge layer, which has none");
            out = merge->build(shapes);
        } else {
            if (shapes.size() != 1) entry.fail("a " + cls + " layer is called on one input, not " + std::to_string(shapes.size()));
            if (parsed.input_shape != shapes.front())
                entry.fail("its batch_input_shape " + format_shape(parsed.input_shape) + " differs from its input's shape " +
                           format_shape(shapes.front()));
            out = parsed.layer->bind(shapes.front(), std::move(own));
        }
        source_of[name] = static_cast<int>(graph.layers.size());
        shape_of[static_cast<int>(graph.layers.size())] = std::move(out);
        graph.add(std::move(parsed.layer), std::move(from));
    }
    if (graph.layers.empty()) model.fail("\"layers\" has no layer but InputLayers");
    if (source_of.size() != graph.layers.size() + input_index.size())
        model.fail("\"input_layers\" names an input that \"layers\" does not have");
    if (!output_layers.is_array() || output_layers.size() != 1 ||
        reference(output_layers[0], "\"output_layers\"[0]", 0) != graph.layers.back()->name())
        model.fail("\"output_layers\" is " + json_text(output_layers) + "; it names the last layer, the one output");
    if (layer_count != counts.size() || at != weights.size())
        top.fail("\"weight_counts\" is " + json_text(counts) + " for " + std::to_string(layer_count) + " layers and " +
                 std::to_string(weights.size()) + " variables sent");
    return graph;
}

/// A model's description as the chief sends it: `{"class_name": "Sequential", "config": {"name":
/// "sequential", "layers": [serialize(layer), ...]}, "loss": serialize(loss), "metrics": [serialize(metric),
/// ...], "weight_counts": [2, 0, 1]}` (how many of the variables sent with it each layer takes, in order),
/// or the same with `"class_name": "Functional"` and Model::get_config's config.
[[nodiscard]] inline std::shared_ptr<RemoteModel> parse_model_description(const std::string& description,
                                                                         std::vector<Variable> weights) {
    const nlohmann::json json = parse_config_text(description, "model description");
    ConfigFields top("model description", json, "class_name, config, loss, metrics and weight_counts");
    const std::string cls = top.take_string("class_name");
    if (cls != "Sequential" && cls != "Functional")
        top.fail("\"class_name\" is " + json_text(cls) + "; a worker builds \"Sequential\" and \"Functional\" models");
    const nlohmann::json& config = top.take("config");
    const nlohmann::json& loss = top.take("loss");
    const nlohmann::json& metric_list = top.take("metrics");
    const nlohmann::json& counts = top.take("weight_counts");
    top.finish();
    if (!counts.is_array()) top.fail("\"weight_counts\" is " + json_text(counts) + ", not a list");
    auto out = std::make_shared<RemoteModel>();
    if (cls == "Functional") {
        out->graph = parse_functional_config(config, counts, weights, top);
    } else {
        ConfigFields model("Sequential config", config, "name and layers");
        (void)model.take_string("name");
        const nlohmann::json& layers = model.take("layers");
        model.finish();
        if (!layers.is_array() || layers.empty())
            model.fail("\"layers\" is " + json_text(layers) + ", not a list of at least one layer");
        if (counts.size() != layers.size())
            top.fail("\"weight_counts\" is " + json_text(counts) + "; it lists one count per layer (" +
                     std::to_string(layers.size()) + ")");
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
            out->graph.add(bind_layer_from_config(layers[i], std::move(own)), {static_cast<int>(i) - 1});
        }
        if (at != weights.size())
            top.fail("\"weight_counts\" sum to " + std::to_string(at) + ", but " + std::to_string(weights.size()) +
                     " variables were sent");
    }
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

/// This worker's model `model_id`, marked as used now.
/// @throws NotFoundError when this worker does not have the model (the chief builds it again):
/// `pss: Sequential: worker task 1 does not have the model 5f3a...; ...`
PSS_INLINE std::shared_ptr<RemoteModel> find_remote_model(const std::string& model_id) {
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
    it->second->last_used = ++store.clock;
    return it->second;
}

/// The registered step call: one training step of the model `model_id` (see keras_train_step).
/// @throws NotFoundError as find_remote_model
PSS_INLINE std::vector<double> keras_remote_step(std::string model_id, std::vector<Tensor> x, Tensor y,
                                                Tensor weights, std::uint64_t step, double scale) {
    const std::shared_ptr<RemoteModel> model = find_remote_model(model_id);
    std::lock_guard lock(model->mutex);
    return keras_train_step(model->graph, *model->loss, model->metrics, std::move(x), std::move(y), weights, step,
                            scale);
}

/// The registered test call: one evaluation batch of the model `model_id` (see keras_test_step).
/// @throws NotFoundError as find_remote_model
PSS_INLINE std::vector<double> keras_remote_test_step(std::string model_id, std::vector<Tensor> x, Tensor y,
                                                     Tensor weights) {
    const std::shared_ptr<RemoteModel> model = find_remote_model(model_id);
    std::lock_guard lock(model->mutex);
    return keras_test_step(model->graph, *model->loss, model->metrics, std::move(x), std::move(y), weights);
}
#else
void keras_remote_build(std::string model_id, std::string description, std::vector<Variable> weights);
std::vector<double> keras_remote_step(std::string model_id, std::vector<Tensor> x, Tensor y, Tensor weights,
                                      std::uint64_t step, double scale);
std::vector<double> keras_remote_test_step(std::string model_id, std::vector<Tensor> x, Tensor y, Tensor weights);
#endif

/// Registered in every program that includes this header, so that worker processes know them.
inline const RegisteredFunction<void(std::string, std::string, std::vector<Variable>)> keras_remote_build_function =
    register_function("pss.keras.Sequential.build", &keras_remote_build);
inline const RegisteredFunction<std::vector<double>(std::string, std::vector<Tensor>, Tensor, Tensor, std::uint64_t,
                                                   double)>
    keras_remote_step_function =
    register_function("pss.keras.Sequential.step", &keras_remote_step);
inline const RegisteredFunction<std::vector<double>(std::string, std::vector<Tensor>, Tensor, Tensor)>
    keras_remote_test_step_function = register_function("pss.keras.Sequential.test_step", &keras_remote_test_step);

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

/// @brief A Keras model trained on a parameter-server cluster (tf.keras.Model under
/// ParameterServerStrategy): the functional API's `pss::Model(strategy, inputs, outputs)`, and the base
/// of pss::Sequential. compile, fit, evaluate, predict.
///
/// A functional model is traced from symbolic tensors: `pss::Input(shape)` for each input, layers called
/// on them (`pss::Dense(8, "relu")(x)`, `pss::Concatenate()({a, b})`), and the output. The model takes
/// copies of the layers it traced and builds them at once in the strategy's scope, so every variable
/// lives on the ps tasks; unnamed inputs and layers are named as Keras names them (`input_1`, `dense`,
/// `dense_1`, ...). Its data is one array per input (pss::ModelInputs: `model.fit({wide, deep}, y)`).
/// Differences from Keras: one output (one loss); a layer object called twice is refused (Keras would
/// share its weights); two models traced from the same tensors have their own layers and weights.
///
/// Initial values come from `std::mt19937(seed)`, layer after layer; shuffling from `std::mt19937(seed +
/// 1)`: the same seed gives the same numbers on every platform.
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
///   A step whose closure fails (a layer throws, a ps refuses a non-finite gradient) leaves no step
///   waiting: fit raises that error, and the next fit runs at once. The failing worker's slice gives no
///   gradient: it pushes an empty one for each weight it had not pushed, so the step applies the other
///   workers' gradients scaled by 1 / num_workers, as if the slice's examples weighed 0. The chief pushes
///   the same for the closures cancelled before they ran, up to the last step a closure ran; the steps
///   after it are applied by no one (the next fit's first step follows it). A step to which no worker
///   gave a gradient changes neither the weights nor the optimizer's slots, so momentum and Adam do not
///   move on their slots alone, as they would on a pushed zero gradient. (TensorFlow trains
///   asynchronously only, where a failed step pushes nothing.)
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
/// `evaluate` (and fit's validation) runs its batches on the workers, as Keras' evaluate schedules its
/// test function on the ParameterServerStrategy's coordinator, and adds them up on the chief in batch
/// order; `predict` runs on the calling thread (the coordinator). Both read the current weights.
/// A model is used from one thread at a time, and its strategy outlives it.
///
/// @tparam StrategyType a ParameterServerStrategy (any Strategy with its `optimizer_type`,
/// `synchronous`, `num_workers()` and `optimizer()`)
///
/// @par Example
/// @code
/// pss::KerasTensor ids = pss::Input({4}), dense = pss::Input({3});
/// pss::KerasTensor deep = pss::Flatten()(pss::Embedding(1000, 8)(ids));
/// pss::KerasTensor joined = pss::Concatenate()({deep, dense});
/// pss::Model model(strategy, {ids, dense}, pss::Dense(1, "sigmoid")(joined));
/// model.compile("binary_crossentropy", {"auc"});
/// model.fit({x_ids, x_dense}, y, {.epochs = 5});
/// @endcode
template <class StrategyType>
class Model : public ModelBase {
    static_assert(detail::keras_strategy<StrategyType>,
                  "pss: Model<StrategyType>, Sequential<StrategyType>: StrategyType must be a ParameterServerStrategy "
                  "(a pss::Strategy with optimizer_type, synchronous, num_workers() and optimizer())");

public:
    using strategy_type = StrategyType;
    using optimizer_type = typename StrategyType::optimizer_type;

    /// @brief The functional model from `inputs` to `output` (Keras' `tf.keras.Model(inputs, outputs)`),
    /// built at once: its variables are created on the ps tasks.
    /// @param strategy holds the variables and runs the steps; it must outlive the model
    /// @param inputs the pss::Input tensors, in the order of the arrays given to fit
    /// @param output a tensor computed from them
    /// @param seed the seed of initial values and shuffling
    /// @throws InvalidArgumentError when the output needs an Input not among `inputs`, an input is given
    /// twice or is not a pss::Input, a layer object was called twice, two layers have one name, or a
    /// layer cannot take its input shape.
    Model(StrategyType& strategy, const std::vector<KerasTensor>& inputs, const KerasTensor& output,
          std::uint32_t seed = 0, std::string name = "model")
        : strategy_(&strategy), seed_(seed), shuffle_rng_(seed + 1u), sequential_(false), name_(std::move(name)) {
        trace(inputs, output);
    }
    /// @brief The functional model of one input.
    Model(StrategyType& strategy, const KerasTensor& input, const KerasTensor& output, std::uint32_t seed = 0,
          std::string name = "model")
        : Model(strategy, std::vector<KerasTensor>{input}, output, seed, std::move(name)) {}
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    [[nodiscard]] bool built() const noexcept { return input_shapes_.has_value(); }
    /// @brief The model's name (Keras' `model.name`): "model", or "sequential".
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    /// @brief The layers, each after those it takes inputs from (Keras' `model.layers`, without the
    /// InputLayers).
    [[nodiscard]] const std::vector<std::unique_ptr<Layer>>& layers() const noexcept { return graph_.layers; }
    /// @brief The layer named `name` (Keras' `get_layer`). @throws NotFoundError listing the names.
    [[nodiscard]] Layer& get_layer(std::string_view name) const {
        std::string names;
        for (const auto& layer : graph_.layers) {
            if (layer->name() == name) return *layer;
            names += (names.empty() ? "" : ", ") + layer->name();
        }
        throw NotFoundError(who("get_layer") + ": no layer is named '" + std::string(name) +
                            "'; the layers are: " + (names.empty() ? "(none)" : names));
    }
    /// @brief Keras' `get_config()`. A Sequential model's: `{"name": "sequential", "layers":
    /// [serialize(layer), ...]}`. A functional model's, as Keras' "Functional": `{"name": "model",
    /// "layers": [{"class_name": "InputLayer", "config": {...}, "name": "input_1", "inbound_nodes": []},
    /// {"class_name": "Dense", "config": {...}, "name": "dense", "inbound_nodes": [[["input_1", 0, 0,
    /// {}]]]}, ...], "input_layers": [["input_1", 0, 0]], "output_layers": [["dense", 0, 0]]}`.
    [[nodiscard]] nlohmann::json get_config() const {
        nlohmann::json layers = nlohmann::json::array();
        if (sequential_) {
            for (const auto& layer : graph_.layers) layers.push_back(serialize(*layer));
            return {{"name", name_}, {"layers", std::move(layers)}};
        }
        auto reference = [](const std::string& name) { return nlohmann::json::array({name, 0, 0}); };
        nlohmann::json inputs = nlohmann::json::array();
        for (std::size_t k = 0; k < input_names_.size(); ++k) {
            nlohmann::json shape = nlohmann::json::array({nullptr});
            for (auto d : (*input_shapes_)[k]) shape.push_back(d);
            layers.push_back({{"class_name", "InputLayer"},
                              {"config", {{"batch_input_shape", std::move(shape)}, {"dtype", "float32"},
                                          {"name", input_names_[k]}}},
                              {"name", input_names_[k]},
                              {"inbound_nodes", nlohmann::json::array()}});
            inputs.push_back(reference(input_names_[k]));
        }
        for (std::size_t i = 0; i < graph_.layers.size(); ++i) {
            nlohmann::json node = nlohmann::json::array();
            for (const int from : graph_.sources[i]) {
                nlohmann::json r = reference(source_name(from));
                r.push_back(nlohmann::json::object());
                node.push_back(std::move(r));
            }
            nlohmann::json entry = serialize(*graph_.layers[i]);
            entry["name"] = graph_.layers[i]->name();
            entry["inbound_nodes"] = nlohmann::json::array({std::move(node)});
            layers.push_back(std::move(entry));
        }
        return {{"name", name_},
                {"layers", std::move(layers)},
                {"input_layers", std::move(inputs)},
                {"output_layers", nlohmann::json::array({reference(graph_.layers.back()->name())})}};
    }

    /// @brief Keras' `model.summary()`: the layers with their output shapes and parameter counts, as
    /// tf.keras 2 prints them (a Sequential model in 65 columns; a functional one in 98, with its
    /// InputLayers and each layer's inputs, "Connected to"), then, beyond Keras, each variable with its
    /// shape and the ps tasks that hold its shards, in shard order.
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
        const std::size_t width = sequential_ ? 65 : 98;
        // Keras' column ends: [0.45, 0.85, 1.0] of 65; [0.33, 0.55, 0.67, 1.0] of 98.
        const std::vector<std::size_t> positions =
            sequential_ ? std::vector<std::size_t>{29, 55, 65} : std::vector<std::size_t>{32, 53, 65, 98};
        const auto rule = [&](char c) { out << std::string(width, c) << "\n"; };
        const auto row = [&](std::vector<std::string> fields) {
            fields.resize(positions.size());
            detail::summary_row(out, std::move(fields), positions);
        };
        const auto shape_text = [](const Shape& shape) {
            std::string text = "(None";
            for (const auto d : shape) text += ", " + std::to_string(d);
            return text + (shape.empty() ? ",)" : ")");
        };
        std::size_t total = 0;
        out << "Model: \"" << name_ << "\"\n";
        rule('_');
        if (sequential_) row({"Layer (type)", "Output Shape", "Param #"});
        else row({"Layer (type)", "Output Shape", "Param #", "Connected to"});
        rule('=');
        bool first = true;
        const auto separate = [&] {
            if (!first) {
                if (sequential_) out << std::string(width, ' ') << "\n";
                else rule('_');
            }
            first = false;
        };
        if (!sequential_)
            for (std::size_t k = 0; k < input_names_.size(); ++k) {
                separate();
                row({input_names_[k] + " (InputLayer)", "[" + shape_text((*input_shapes_)[k]) + "]", "0", "[]"});
            }
        for (std::size_t i = 0; i < graph_.layers.size(); ++i) {
            const Layer& layer = *graph_.layers[i];
            std::size_t params = 0;
            for (const auto& v : layer.weights()) params += num_elements(v.shape());
            total += params;
            separate();
            std::vector<std::string> fields{layer.name() + " (" + std::string(layer.class_name()) + ")",
                                            shape_text(layer.output_shape()), std::to_string(params)};
            if (!sequential_) {
                std::string connected;
                for (const int from : graph_.sources[i])
                    connected += (connected.empty() ? "" : ", ") + ("'" + source_name(from) + "[0][0]'");
                fields.push_back("[" + connected + "]");
            }
            row(std::move(fields));
            if (sequential_ && i + 1 == graph_.layers.size()) out << std::string(width, ' ') << "\n";
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

    /// @brief Every layer's variables, in the order of layers() (Keras' `model.weights`).
    [[nodiscard]] std::vector<Variable> weights() const { return graph_.weights(); }
    /// @brief Every weight's value (Keras' `model.get_weights()`).
    [[nodiscard]] std::vector<Tensor> get_weights() const override { return detail::read_weights(weights()); }
    /// @brief Assigns every weight, in the order of weights() (Keras' `model.set_weights()`).
    /// @throws InvalidArgumentError when the count or a shape differs, before any weight changes.
    void set_weights(const std::vector<Tensor>& values) override {
        detail::assign_weights(weights(), values, kind() + "::set_weights", "model");
    }

    /// @brief Saves every weight, with its optimizer slots, as a checkpoint in the directory `path`
    /// (Keras' `save_weights`; the format of pss::Checkpoint, which numpy reads), atomically. The
    /// model's config is in the index's metadata, its count of training steps in the index's step.
    /// @throws FailedPreconditionError before the model is built; what Checkpoint::write throws.
    void save_weights(const std::string& path) const override {
        require_built("save_weights");
        require_checkpoints("save_weights");
        if constexpr (detail::checkpointable_strategy<StrategyType>) {
            Checkpoint<StrategyType> checkpoint(*strategy_, weights());
            checkpoint.set_step(step_);
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
            throw FailedPreconditionError(who("set_learning_rate") + ": this strategy has no set_learning_rate");
    }

    /// @brief Restores every weight, and its optimizer slots, from a checkpoint directory written by
    /// save_weights or pss::Checkpoint, into any shard layout (Keras' `load_weights`), and the count of
    /// training steps saved with them (Keras' `optimizer.iterations`: the next fit numbers its steps, and
    /// evaluates a learning-rate schedule, from there; in synchronous training the restored shards count
    /// from there too). Nothing changes when it throws.
    /// @throws FailedPreconditionError before the model is built; what Checkpoint::restore throws (a
    /// weight missing from the checkpoint, a shape that differs, a corrupt file, ...).
    void load_weights(const std::string& path, RestoreOptions options = {}) {
        require_built("load_weights");
        require_checkpoints("load_weights");
        if constexpr (detail::checkpointable_strategy<StrategyType>) {
            Checkpoint<StrategyType> checkpoint(*strategy_, weights());
            checkpoint.restore(path, options);
            step_ = checkpoint.step();
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
    /// the epoch on the chief. With validation, the held-out data is evaluated (by the workers, as
    /// `evaluate`) at each epoch's end (`val_loss`, `val_<metric>`). Callbacks are called on the calling thread: batch hooks
    /// as batches complete, in order (a few batches run ahead on the workers, at most 2 * num_workers + 2,
    /// so a callback that stops training stops it after those).
    /// @param x inputs, shape (examples, input_shape...), or one such array per input of a functional
    /// model (ModelInputs); an Embedding's ids as floats
    /// @param y targets, batch axis first (class ids as floats for SparseCategoricalCrossentropy)
    /// @return every epoch's logs (History::history), the epochs this call ran
    /// @throws FailedPreconditionError before compile; InvalidArgumentError for options or data that do
    /// not fit (checked before any step runs); the first error a step raised; what a callback threw.
    History fit(const ModelInputs& x, const xt::xarray<float>& y, const FitOptions& options);

    /// @brief Trains on datasets each worker reads for itself, as Keras'
    /// `model.fit(DatasetCreator(dataset_fn), epochs=..., steps_per_epoch=...)` under
    /// ParameterServerStrategy: `creator` makes each worker's dataset once per call (InputContext: one
    /// input pipeline per worker), and each step's closure takes the next batch of the dataset of the
    /// worker that runs it. Synchronous strategies: step k is one batch of every worker's dataset (its
    /// closure pinned to that worker), each worker pushes its batch's mean gradient and the ps tasks
    /// average them; the step's loss is the mean of the workers' losses weighted by their batch sizes.
    /// Asynchronous: each step is one batch of whichever worker is free. An epoch is `steps_per_epoch`
    /// steps, and the datasets go on from one epoch to the next (give them repeat()). Callbacks,
    /// progress, metrics, History and `validation_data` as for arrays.
    ///
    /// `batch_size` and `shuffle` do not apply (the datasets batch and shuffle; as Keras, shuffle is
    /// ignored). The model must be built, of one input (a dataset's batch holds one x).
    /// @throws InvalidArgumentError for `steps_per_epoch` 0 (`pss: Sequential::fit: steps_per_epoch is 0;
    /// fit from a DatasetCreator needs it...`), a `validation_split`, `sample_weight` or `class_weight`
    /// (not for datasets), a BackupAndRestore callback, a model of several inputs;
    /// FailedPreconditionError before build or compile, or on workers that are other processes (the
    /// dataset function exists in this process only; not supported yet); OutOfRangeError when a
    /// worker's dataset ends before fit has taken its batches (naming the worker and the step); what
    /// reading a file threw (a bad row names its file and line), and the other errors of fit.
    History fit(const DatasetCreator& creator, const FitOptions& options);

    /// @brief fit with Keras' first positional arguments: `fit(x, y, epochs, batch_size)`. With `verbose`,
    /// FitOptions' verbose 1.
    History fit(const ModelInputs& x, const xt::xarray<float>& y, int epochs = 1, std::size_t batch_size = 32,
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
    History fit(const ModelInputs& x, const xt::xarray<float>& y, int epochs, std::size_t batch_size,
                const BackupAndRestore& backup, bool shuffle = true, bool verbose = true, std::ostream& out = std::cout) {
        return fit(x, y, {.batch_size = batch_size, .epochs = epochs, .verbose = verbose ? 1 : 0, .callbacks = {backup},
                          .shuffle = shuffle, .out = &out});
    }

    /// @brief The loss over all of (x, y): the mean over the examples, computed in batches of
    /// `batch_size` by the workers (Keras' `evaluate` without metrics).
    [[nodiscard]] double evaluate(const ModelInputs& x, const xt::xarray<float>& y, std::size_t batch_size = 32) {
        return evaluate(x, y, EvaluateOptions{.batch_size = batch_size}).at("loss");
    }
    /// @brief The loss and every compiled metric over all of (x, y), computed in batches by the workers
    /// and added up on the chief (Keras' `evaluate(..., return_dict=True)`): `{"loss": ..., "auc": ...}`. With sample
    /// weights, the loss is the sum of the weighted losses over the examples.
    [[nodiscard]] Logs evaluate(const ModelInputs& x, const xt::xarray<float>& y, const EvaluateOptions& options);

    /// @brief The model's outputs for `x`, shape (examples, output_shape...) (Keras' `predict`).
    [[nodiscard]] xt::xarray<float> predict(const ModelInputs& x, std::size_t batch_size = 32);

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

    /// Each worker's dataset in one fit(DatasetCreator), the steps the fit takes (for messages), and the
    /// first error a step met reading its batch.
    struct DatasetFeed {
        PerWorkerValues<data::Dataset> datasets;
        int first_epoch = 0, epochs = 0;  // the fit's initial_epoch and epochs
        std::size_t steps_per_epoch = 0;
        std::mutex mutex;
        std::exception_ptr error;  // set once; the steps after it read nothing
    };

    /// The loop of fit: epochs of batches from (x, y), or with `feed`, from the workers' datasets
    /// (x and y empty, options checked by fit(DatasetCreator)).
    History fit_epochs(const ModelInputs& x, const xt::xarray<float>& y, const FitOptions& options,
                       const FitPoint& start, const FitBackup& backup, DatasetFeed* feed = nullptr);

    /// One step of fit(DatasetCreator) (the model's `batch` of `epoch`, training step `step`): the worker
    /// that runs it trains on its dataset's next batch. Its result is keras_train_step's, then the
    /// batch's example count; or nothing once a step failed to read its batch (feed.error says how). The
    /// worker sets `started` when it begins the step.
    RemoteValue<std::vector<double>> schedule_dataset_step(DatasetFeed& feed, int worker, std::uint64_t step, int epoch,
                                                           std::size_t batch, std::shared_ptr<std::atomic<bool>> started);
    /// Said when a worker's dataset runs out at (epoch, batch): "... ended at step 4 of this fit (epoch 2,
    /// batch 1), which takes 6 steps (steps_per_epoch 3 * 2 epochs), ...". Built only then, not every step.
    OutOfRangeError dataset_ended(const DatasetFeed& feed, int epoch, std::size_t batch) const;

    /// Loss and metrics over rows [begin, end) of (x, y), batches run by the workers, as `prefix` + name.
    Logs evaluate_rows(const ModelInputs& x, const xt::xarray<float>& y, const std::vector<double>& weights,
                       std::size_t begin, std::size_t end, std::size_t batch_size, std::string_view prefix = {});

    /// Per-example weights from sample_weight and class_weight (empty when neither is given).
    std::vector<double> example_weights(const xt::xarray<float>& y, std::size_t examples,
                                        const std::vector<double>& sample_weight,
                                        const std::map<int, double>& class_weight, const char* what) const {
        if (!sample_weight.empty() && sample_weight.size() != examples)
            throw InvalidArgumentError(who(what) + ": sample_weight has " +
                                       std::to_string(sample_weight.size()) + " weights for " +
                                       std::to_string(examples) + " examples; give one weight per example");
        for (double w : sample_weight)
            if (!std::isfinite(w) || w < 0)
                throw InvalidArgumentError(who(what) + ": a sample weight is " +
                                           std::to_string(w) + "; weights are finite and not negative");
        if (class_weight.empty()) return sample_weight;
        if (y.size() != examples)
            throw InvalidArgumentError(who(what) + ": class_weight needs one class id "
                                       "per example, but y has shape " +
                                       format_shape(Shape(y.shape().begin(), y.shape().end())));
        for (const auto& [id, w] : class_weight)
            if (!std::isfinite(w) || w < 0)
                throw InvalidArgumentError(who(what) + ": class_weight of class " +
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
                    throw InvalidArgumentError(who("compile") + ": two metrics are named '" +
                                               list.back()->name() + "' (or one is named 'loss'); name them apart");
            }
            metrics_ = std::move(list);
        }
        return *metrics_;
    }

    /// @throws FailedPreconditionError for a strategy that cannot write checkpoints.
    void require_checkpoints(const char* what) const {
        if constexpr (!detail::checkpointable_strategy<StrategyType>)
            throw FailedPreconditionError(who(what) +
                                          ": this strategy cannot write or read checkpoints (pss::Checkpoint takes a "
                                          "ParameterServerStrategy or ClusterStrategy)");
    }

    void require_built(const char* what) const {
        if (!built())
            throw FailedPreconditionError(who(what) +
                                          ": the model is not built, so it has no weights yet; call build(input_shape) "
                                          "(or fit) first");
    }

    /// Each worker's own layers: clones of the model's, sharing the variables.
    struct Replica {
        detail::LayerGraph graph;
    };

protected:
    /// A Sequential model's start: no layers, not built.
    Model(StrategyType& strategy, std::uint32_t seed, std::string name)
        : strategy_(&strategy), seed_(seed), shuffle_rng_(seed + 1u), sequential_(true), name_(std::move(name)) {}

    /// "pss: Sequential::fit" or "pss: Model::fit", for messages.
    [[nodiscard]] std::string who(std::string_view what) const { return "pss: " + kind() + "::" + std::string(what); }
    [[nodiscard]] std::string kind() const { return sequential_ ? "Sequential" : "Model"; }

    /// Appends a layer to the graph, taking inputs `from` (a Sequential's: the layer before), named as
    /// Keras names it when unnamed.
    void add_layer(std::unique_ptr<Layer> layer, std::vector<int> from) {
        if (input_shapes_)
            throw FailedPreconditionError(who("add") + ": the model is built already (its variables exist on "
                                          "the ps tasks); add every layer before build, fit, evaluate or predict");
        const auto& layers = graph_.layers;
        if (layer->name().empty()) {
            // Keras' names, per class within the model: "dense", "dense_1", ...; skipping names taken.
            const std::string base = detail::snake_case(layer->class_name());
            auto taken = [&](const std::string& name) {
                return std::any_of(layers.begin(), layers.end(), [&](const auto& l) { return l->name() == name; }) ||
                       std::find(input_names_.begin(), input_names_.end(), name) != input_names_.end();
            };
            std::size_t n = static_cast<std::size_t>(std::count_if(
                layers.begin(), layers.end(), [&](const auto& l) { return l->class_name() == layer->class_name(); }));
            std::string name = n == 0 ? base : base + "_" + std::to_string(n);
            while (taken(name)) name = base + "_" + std::to_string(++n);
            layer->set_name(std::move(name));
        }
        graph_.add(std::move(layer), std::move(from));
        replicas_.reset();
    }

    /// Builds every layer for model inputs of `input_shapes`, in the strategy's scope.
    void build_graph(std::vector<Shape> input_shapes) {
        auto scope = strategy_->scope();
        std::mt19937 rng(seed_);
        std::vector<Shape> outputs;
        auto shape_of = [&](int from) -> const Shape& {
            return from < 0 ? input_shapes[static_cast<std::size_t>(-1 - from)] : outputs[static_cast<std::size_t>(from)];
        };
        for (std::size_t i = 0; i < graph_.layers.size(); ++i) {
            if (auto* merge = dynamic_cast<Merge*>(graph_.layers[i].get())) {
                std::vector<Shape> shapes;
                for (const int from : graph_.sources[i]) shapes.push_back(shape_of(from));
                outputs.push_back(merge->build(shapes));
            } else {
                outputs.push_back(graph_.layers[i]->build(shape_of(graph_.sources[i].front()), rng));
            }
        }
        graph_.num_inputs = input_shapes.size();
        output_shape_ = outputs.back();
        input_shapes_ = std::move(input_shapes);
    }

    /// A Sequential model's build: its chain of layers for inputs of `input_shape`.
    void build_chain(const Shape& input_shape) {
        if (built())
            throw FailedPreconditionError(who("build") + ": the model is built already, for inputs " +
                                          format_shape(input_shapes_->front()) + " (batch axis excluded)");
        if (graph_.layers.empty())
            throw FailedPreconditionError(who("build") + ": the model has no layers; add() them first");
        build_graph({input_shape});
    }

    /// The graph's layers so far (Sequential's build and add read them).
    [[nodiscard]] const detail::LayerGraph& graph() const noexcept { return graph_; }

private:
    /// A functional model's graph, from the symbolic tensors: the layers each output needs, in an order
    /// where each comes after its inputs (depth first, inputs in call order), copied, named and built.
    void trace(const std::vector<KerasTensor>& inputs, const KerasTensor& output) {
        if (inputs.empty()) throw InvalidArgumentError(who("Model") + ": no inputs; give the pss::Input tensors");
        if (!output) throw InvalidArgumentError(who("Model") + ": the output is an empty KerasTensor");
        std::map<const detail::SymbolicNode*, int> source;
        std::vector<Shape> input_shapes;
        for (std::size_t k = 0; k < inputs.size(); ++k) {
            const auto& node = inputs[k].node();
            if (!node || node->layer)
                throw InvalidArgumentError(who("Model") + ": input " + std::to_string(k) + " is " +
                                           (node ? "the output of a " + std::string(node->layer->class_name()) + " layer"
                                                 : std::string("empty")) +
                                           ", not a pss::Input");
            if (!source.emplace(node.get(), -1 - static_cast<int>(k)).second)
                throw InvalidArgumentError(who("Model") + ": input " + std::to_string(k) + " is given twice");
            input_shapes.push_back(node->shape);
            input_names_.push_back(node->name);
        }
        // Keras' names for unnamed inputs: input_1, input_2, ... (skipping names given).
        for (std::size_t k = 0, n = 0; k < input_names_.size(); ++k)
            while (input_names_[k].empty()) {
                const std::string name = "input_" + std::to_string(++n);
                if (std::find(input_names_.begin(), input_names_.end(), name) == input_names_.end()) input_names_[k] = name;
            }
        std::set<const void*> identities;
        const std::function<int(const detail::SymbolicNode&)> visit = [&](const detail::SymbolicNode& node) -> int {
            if (const auto it = source.find(&node); it != source.end()) return it->second;
            if (!node.layer)
                throw InvalidArgumentError(who("Model") + ": the output needs the input '" +
                                           (node.name.empty() ? std::string("(unnamed)") : node.name) + "' of shape " +
                                           format_shape(node.shape) + ", which is not among the model's inputs");
            if (!identities.insert(node.identity.get()).second)
                throw InvalidArgumentError(who("Model") + ": one " + std::string(node.layer->class_name()) +
                                           " layer object is called twice; Keras would share its weights, pss does not "
                                           "(make one layer object per call)");
            std::vector<int> from;
            for (const auto& input : node.inputs) from.push_back(visit(*input.node()));
            add_layer(node.layer->clone(), std::move(from));
            const int index = static_cast<int>(graph_.layers.size()) - 1;
            source.emplace(&node, index);
            return index;
        };
        (void)visit(*output.node());
        std::set<std::string> names(input_names_.begin(), input_names_.end());
        for (const auto& layer : graph_.layers)
            if (!names.insert(layer->name()).second)
                throw InvalidArgumentError(who("Model") + ": two layers or inputs are named '" + layer->name() +
                                           "'; names are unique within a model");
        if (names.size() != graph_.layers.size() + input_names_.size())
            throw InvalidArgumentError(who("Model") + ": two inputs have one name");
        build_graph(std::move(input_shapes));
    }

    /// The name of a source: an input's or a layer's.
    [[nodiscard]] std::string source_name(int from) const {
        return from < 0 ? input_names_[static_cast<std::size_t>(-1 - from)]
                        : graph_.layers[static_cast<std::size_t>(from)]->name();
    }

    template <class OptimizerType>
    void check_optimizer(const OptimizerType& optimizer) const {
        static_assert(std::is_same_v<OptimizerType, optimizer_type>,
                      "pss: Model::compile (Sequential::compile): the optimizer must be the strategy's Optimizer "
                      "policy type: in pss "
                      "the parameter servers apply the strategy's optimizer to the variables they hold, so construct "
                      "ParameterServerStrategy with this optimizer (its OptimizerPolicy argument), or call "
                      "compile(loss)");
        if (!detail::same_optimizer(optimizer, strategy_->optimizer()))
            throw InvalidArgumentError(
                who("compile") + ": the optimizer is " + detail::describe_optimizer(optimizer) +
                ", but the strategy's is " + detail::describe_optimizer(strategy_->optimizer()) +
                "; in pss the parameter servers apply the strategy's optimizer, so construct the strategy with this "
                "one (ParameterServerStrategy(resolver, partitioner, optimizer)), or call compile(loss)");
    }

    void require_compiled(const char* what) const {
        if (!loss_)
            throw FailedPreconditionError(who(what) +
                                          ": the model is not compiled; call compile(loss) or compile(optimizer, "
                                          "loss) first");
    }

    /// Checks x against the model, building it from x's shape when needed.
    /// Checks x against the model (a Sequential model is built from x's shape when needed): one array
    /// per input, each of the input's shape after the batch axis, the same number of examples, and the
    /// values the layers reading them take.
    void prepare_inputs(const ModelInputs& x, const char* what) {
        const auto shape_of = [](const xt::xarray<float>& a) { return Shape(a.shape().begin(), a.shape().end()); };
        const std::size_t inputs = built() ? input_shapes_->size() : 1;
        if (x.size() != inputs)
            throw InvalidArgumentError(who(what) + ": x is " + std::to_string(x.size()) + " arrays, but the model has " +
                                       std::to_string(inputs) + " input" + (inputs == 1 ? "" : "s") +
                                       "; give one array per input, in the order of the model's inputs");
        if (x[0].dimension() == 0 || x[0].shape()[0] == 0)
            throw InvalidArgumentError(who(what) + ": x" + (inputs == 1 ? "" : "[0]") + " has shape " +
                                       format_shape(shape_of(x[0])) + "; give at least one example, batch axis first");
        if (!built()) build_chain(Shape(x[0].shape().begin() + 1, x[0].shape().end()));
        for (std::size_t k = 0; k < inputs; ++k) {
            const Shape got = shape_of(x[k]);
            Shape expected = (*input_shapes_)[k];
            expected.insert(expected.begin(), x.examples());
            if (got != expected && sequential_) continue;  // the first layer names what it expected (below)
            if (got != expected)
                throw InvalidArgumentError(who(what) + ": x[" + std::to_string(k) + "] (input '" + input_names_[k] +
                                           "') has shape " + format_shape(got) + ", but the input takes " +
                                           format_shape(expected) + " (examples first, the same count in every input)");
        }
        check_layer_inputs(graph_, x);
    }

    /// Checks each input's values against the layers reading it (an Embedding's ids in range).
    static void check_layer_inputs(const detail::LayerGraph& graph, const ModelInputs& x) {
        for (std::size_t i = 0; i < graph.layers.size(); ++i)
            if (dynamic_cast<const Merge*>(graph.layers[i].get()) == nullptr && graph.sources[i].front() < 0)
                graph.layers[i]->check_inputs(x[static_cast<std::size_t>(-1 - graph.sources[i].front())]);
    }

    /// Checks a batch of a worker's dataset against the model, as prepare_inputs and prepare_targets check arrays.
    void check_dataset_batch(const Replica& replica, const data::Batch& batch) const {
        const Shape got(batch.x.shape().begin(), batch.x.shape().end());
        Shape expected = input_shapes_->front();
        expected.insert(expected.begin(), got.empty() ? 0 : got.front());
        if (got != expected)
            throw InvalidArgumentError(who("fit") + ": the dataset of worker " + std::to_string(worker_index()) +
                                       " gave a batch x of shape " + format_shape(got) + ", but the model's input takes " +
                                       format_shape(expected) + " (examples first)");
        check_layer_inputs(replica.graph, ModelInputs(batch.x));
        loss_->check_targets(batch.y, *output_shape_);
    }

    /// One batch of each input: rows `order[begin, begin + count)`.
    static std::vector<Tensor> take_input_rows(const ModelInputs& x, const std::vector<std::size_t>& order,
                                               std::size_t begin, std::size_t count) {
        std::vector<Tensor> out;
        out.reserve(x.size());
        for (std::size_t k = 0; k < x.size(); ++k) out.emplace_back(detail::take_rows(x[k], order, begin, count));
        return out;
    }
    void prepare_targets(const xt::xarray<float>& y, std::size_t examples, const char* what) const {
        const Shape got(y.shape().begin(), y.shape().end());
        if (got.empty() || got.front() != examples)
            throw InvalidArgumentError(who(what) + ": x has " + std::to_string(examples) +
                                       " examples but y has shape " + format_shape(got) +
                                       "; give one target row per example, batch axis first");
        loss_->check_targets(y, *output_shape_);
    }

    void check_batch_size(std::size_t batch_size, const char* what) const {
        if (batch_size == 0)
            throw InvalidArgumentError(who(what) +
                                       ": batch_size is 0; it must be at least 1 (Keras' default is 32)");
    }

    /// Schedules one step: as a closure on the embedded cluster, as the registered step with the model's
    /// id when the workers are other processes (which have the model: ensure_remote_model). A synchronous
    /// step goes to the given worker, so that each worker pushes once to it; an asynchronous one to
    /// whichever worker is free. An embedded worker sets `started` when it begins the step.
    RemoteValue<std::vector<double>> schedule_step(int worker, std::vector<Tensor> xs, Tensor ys, Tensor ws,
                                                   std::uint64_t step, double scale,
                                                   std::shared_ptr<std::atomic<bool>> started) {
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
            // The batch is copied, not moved, into the step: a closure that failed on a lost ps runs again
            // (TensorFlow's transient ps failures), with the same arguments.
            [this, step, scale, started](Replica& replica, const std::vector<Tensor>& x, const Tensor& y, const Tensor& w) {
                started->store(true);
                return detail::keras_train_step(replica.graph, *loss_, *metrics_, x, y, w, step, scale);
            },
            *replicas_, std::move(xs), std::move(ys), std::move(ws));
    }

    /// Schedules one evaluation batch (keras_test_step) on whichever worker is free: as a closure on the
    /// embedded cluster, as the registered test call when the workers are other processes.
    RemoteValue<std::vector<double>> schedule_test_step(std::vector<Tensor> xs, Tensor ys, Tensor ws) {
        if (strategy_->remote_workers() != nullptr)
            return coordinator_->schedule(detail::keras_remote_test_step_function, remote_->id, std::move(xs),
                                          std::move(ys), std::move(ws));
        return coordinator_->schedule(
            [this](Replica& replica, const std::vector<Tensor>& x, const Tensor& y, const Tensor& w) {
                return detail::keras_test_step(replica.graph, *loss_, *metrics_, x, y, w);  // copied: see schedule_step
            },
            *replicas_, std::move(xs), std::move(ys), std::move(ws));
    }

    /// Worker processes: makes the model's description and id, and sends them to every worker once.
    void ensure_remote_model() {
        if (!remote_) {
            RemoteModelDescription d;
            nlohmann::json metric_list = nlohmann::json::array();
            for (const auto& m : resolved_metrics()) metric_list.push_back(metrics::serialize(*m));
            nlohmann::json description = {{"class_name", sequential_ ? "Sequential" : "Functional"},
                                          {"config", get_config()},
                                          {"loss", serialize(*loss_)}, {"metrics", std::move(metric_list)},
                                          {"weight_counts", nlohmann::json::array()}};
            for (const auto& layer : graph_.layers) {
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
                return Replica{graph_.clone()};
            }));
    }

    StrategyType* strategy_;
    std::uint32_t seed_;
    std::mt19937 shuffle_rng_;
    bool sequential_;   // a Sequential model: built from the first data, configs in Keras' Sequential format
    std::string name_;  // "sequential", "model"
    detail::LayerGraph graph_;
    std::vector<std::string> input_names_;           // a functional model's
    std::optional<std::vector<Shape>> input_shapes_;  // set once built
    std::optional<Shape> output_shape_;
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
History Model<StrategyType>::fit(const ModelInputs& x, const xt::xarray<float>& y,
                                      const FitOptions& options) {
    require_compiled("fit");
    const BackupAndRestore* backup = nullptr;
    for (const auto& c : options.callbacks)
        if (const auto* b = dynamic_cast<const BackupAndRestore*>(c.get())) {
            if (backup != nullptr)
                throw InvalidArgumentError(who("fit") + ": two BackupAndRestore callbacks (" +
                                           backup->backup_dir + " and " + b->backup_dir + "); give one");
            backup = b;
        }
    if (options.initial_epoch < 0)
        throw InvalidArgumentError(who("fit") + ": initial_epoch is " + std::to_string(options.initial_epoch) +
                                   "; it must be 0 or more");
    FitPoint start{options.initial_epoch, 0, 0, shuffle_rng_, {}};
    if (backup == nullptr) return fit_epochs(x, y, options, start, {});
    require_checkpoints("fit with BackupAndRestore");
    if constexpr (detail::checkpointable_strategy<StrategyType>) {

    std::ostream& out = options.out != nullptr ? *options.out : std::cout;
    prepare_inputs(x, "fit");  // builds the model: its weights must exist to be restored
    Checkpoint<StrategyType> checkpoint(*strategy_, weights());
    CheckpointManager<StrategyType> manager(checkpoint, backup->backup_dir, 1);
    // Where the latest backup stands: the epoch and batch to go on from, the shuffling, the step count.
    const auto resume_from_backup = [&] {
        const auto& meta = checkpoint.metadata();
        try {
            start.epoch = detail::json_integer<int>(meta.at("epoch"), "\"epoch\"");
            start.batch = meta.contains("batch") ? detail::json_integer<std::size_t>(meta.at("batch"), "\"batch\"") : 0;
            start.loss_sum = meta.value("loss_sum", 0.0);
            start.metric_state.clear();
            if (meta.contains("metric_state"))
                start.metric_state = meta.at("metric_state").template get<std::vector<double>>();
            std::istringstream state(meta.at("shuffle_rng").template get<std::string>());
            state >> start.shuffle_rng;
            if (!state) throw std::invalid_argument("\"shuffle_rng\" is no state of std::mt19937");
        } catch (const std::exception& e) {
            throw InvalidArgumentError(who("fit") + ": the backup in " + backup->backup_dir +
                                       " is malformed: " + e.what());
        }
        // The run continues its step count (Keras restores optimizer.iterations), so a learning-rate
        // schedule goes on where it was; in synchronous training the restore set every shard's count of
        // applied steps to the same step, so the next step pushed is the one the ps tasks wait for.
        step_ = checkpoint.step();
        if (options.verbose != 0) {
            out << "Restored the backup of epoch " << start.epoch + (start.batch > 0 ? 1 : 0);
            if (start.batch > 0) out << ", batch " << start.batch;
            out << " from " << backup->backup_dir << "\n";
        }
    };
    if (manager.restore_or_initialize()) resume_from_backup();
    const auto save_backup = [&](const FitPoint& point) {
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
    };
    History history;
    for (;;) {
        try {
            history = fit_epochs(x, y, options, start, {backup->save_freq, save_backup});
            break;
        } catch (const UnavailableError&) {
            // recover_lost_ps: a lost ps task is waited for, made to serve again and every variable is
            // restored from the latest backup (the other tasks' shards too: in synchronous training their
            // steps in flight are dropped), and the fit goes on from the backup.
            if constexpr (requires(StrategyType& st) { st.recreate_shards(0); }) {
                if (!backup->recover_lost_ps) throw;
                const std::set<int> lost = detail::unavailable_ps_tasks(std::current_exception());
                if (lost.empty()) throw;
                (void)detail::recover_ps(manager, lost, /*restore_anyway=*/true);
                resume_from_backup();
            } else {
                throw;
            }
        }
    }
    if (backup->delete_checkpoint) detail::remove_tree_quietly(backup->backup_dir);
    return history;
    } else {
        return {};
    }
}

template <class StrategyType>
History Model<StrategyType>::fit(const DatasetCreator& creator, const FitOptions& options) {
    require_compiled("fit");
    require_built("fit");
    const auto refuse = [&](const std::string& why) { throw InvalidArgumentError(who("fit") + ": " + why); };
    if (options.steps_per_epoch == 0)
        refuse("steps_per_epoch is 0; fit from a DatasetCreator needs it, as Keras' does: a worker's dataset may "
               "repeat for ever, so an epoch is the steps_per_epoch steps it is given");
    if (options.validation_split != 0)
        refuse("validation_split is " + std::to_string(options.validation_split) +
               ", but the data of a DatasetCreator cannot be split (Keras refuses it for datasets too); give "
               "validation_data");
    if (!options.sample_weight.empty() || !options.class_weight.empty())
        refuse("sample_weight and class_weight do not apply to a DatasetCreator, whose batches carry no weights; "
               "give the examples as arrays to weigh them");
    for (const auto& c : options.callbacks)
        if (dynamic_cast<const BackupAndRestore*>(c.get()) != nullptr)
            refuse("BackupAndRestore cannot resume a fit from a DatasetCreator (the datasets' positions are not "
                   "saved); fit arrays to use it");
    if (options.initial_epoch < 0)
        refuse("initial_epoch is " + std::to_string(options.initial_epoch) + "; it must be 0 or more");
    if (input_shapes_->size() != 1)
        refuse("the model has " + std::to_string(input_shapes_->size()) +
               " inputs, but a dataset's batch holds one x; give fit the inputs as arrays");
    if (strategy_->remote_workers() != nullptr)
        throw FailedPreconditionError(who("fit") +
                                      ": the workers are other processes, which fit from a DatasetCreator does not "
                                      "support yet: its dataset function exists in this process only; give fit "
                                      "arrays, or run the workers in this process (the embedded cluster)");
    ensure_workers();
    const int workers = coordinator_->num_workers();
    DatasetFeed feed{coordinator_->create_per_worker_dataset(
                         [&](int worker) { return creator(InputContext{workers, worker}); }),
                     options.initial_epoch, options.epochs, options.steps_per_epoch, {}, {}};
    for (int w = 0; w < workers; ++w)  // a dataset function that threw: its ClosureInputError now, before any step
        (void)feed.datasets.at(static_cast<std::size_t>(w));
    FitOptions fit_options = options;
    fit_options.shuffle = false;  // the datasets shuffle; Keras ignores shuffle for datasets too
    return fit_epochs(ModelInputs(std::vector<xt::xarray<float>>{}), xt::xarray<float>(), fit_options,
                      {options.initial_epoch, 0, 0, shuffle_rng_, {}}, {}, &feed);
}

template <class StrategyType>
OutOfRangeError Model<StrategyType>::dataset_ended(const DatasetFeed& feed, int epoch, std::size_t batch) const {
    const std::size_t epochs = static_cast<std::size_t>(feed.epochs - feed.first_epoch);
    const std::size_t fit_step = static_cast<std::size_t>(epoch - feed.first_epoch) * feed.steps_per_epoch + batch + 1;
    return OutOfRangeError(who("fit") + ": the dataset of worker " + std::to_string(worker_index()) + " ended at step " +
                           std::to_string(fit_step) + " of this fit (epoch " + std::to_string(epoch + 1) + ", batch " +
                           std::to_string(batch + 1) + "), which takes " + std::to_string(epochs * feed.steps_per_epoch) +
                           " steps (steps_per_epoch " + std::to_string(feed.steps_per_epoch) + " * " +
                           std::to_string(epochs) + " epochs), each a batch of a worker's dataset; end the "
                           "DatasetCreator's dataset with repeat() so that it does not run out");
}

template <class StrategyType>
RemoteValue<std::vector<double>> Model<StrategyType>::schedule_dataset_step(DatasetFeed& feed, int worker,
                                                                                 std::uint64_t step, int epoch,
                                                                                 std::size_t batch,
                                                                                 std::shared_ptr<std::atomic<bool>> started) {
    // A step that cannot read its batch does not fail its closure: in synchronous training the other
    // workers' pushes of its step would then never be applied, and every later pull would wait for it
    // (the next fit's too). It keeps the error for the chief, which raises it when it counts the step,
    // and pushes an empty batch's zeros, as do the steps after it.
    auto train = [this, step, epoch, batch, &feed, started](Replica& replica, data::Dataset& dataset) {
        started->store(true);
        std::optional<data::Batch> next;
        const bool failed = [&] {
            const std::lock_guard lock(feed.mutex);
            return feed.error != nullptr;
        }();
        if (!failed) {
            try {
                next = dataset.next();
                if (!next) throw dataset_ended(feed, epoch, batch);
                check_dataset_batch(replica, *next);
            } catch (...) {
                next.reset();
                const std::lock_guard lock(feed.mutex);
                if (!feed.error) feed.error = std::current_exception();
            }
        }
        Shape input = input_shapes_->front();
        input.insert(input.begin(), next ? next->x.shape()[0] : 0);
        std::vector<Tensor> xs;
        xs.emplace_back(next ? std::move(next->x) : xt::xarray<float>::from_shape(input));
        Tensor y(next ? std::move(next->y) : xt::xarray<float>::from_shape({std::size_t{0}, std::size_t{1}}));
        const Tensor no_weights(xt::xarray<double>::from_shape({std::size_t{0}}));
        if (!next && !StrategyType::synchronous) return std::vector<double>{};
        // Scale 1: each worker pushes its batch's mean gradient and the ps tasks average them.
        std::vector<double> out =
            detail::keras_train_step(replica.graph, *loss_, *metrics_, std::move(xs), std::move(y), no_weights, step, 1.0);
        if (!next) return std::vector<double>{};
        out.push_back(static_cast<double>(input.front()));
        return out;
    };
    if constexpr (StrategyType::synchronous)
        return coordinator_->schedule_on(worker, std::move(train), *replicas_, feed.datasets);
    else
        return coordinator_->schedule(std::move(train), *replicas_, feed.datasets);
}

template <class StrategyType>
History Model<StrategyType>::fit_epochs(const ModelInputs& x, const xt::xarray<float>& y,
                                             const FitOptions& options, const FitPoint& start,
                                             const FitBackup& backup, DatasetFeed* feed) {
    require_compiled("fit");
    check_batch_size(options.batch_size, "fit");
    const std::size_t batch_size = options.batch_size;
    const int epochs = options.epochs;
    if (epochs < 0)
        throw InvalidArgumentError(who("fit") + ": epochs is " + std::to_string(epochs) +
                                   "; it must be 0 or more");
    if (options.verbose < FitOptions::verbose_auto || options.verbose > 2)
        throw InvalidArgumentError(who("fit") + ": verbose is " + std::to_string(options.verbose) +
                                   "; it is FitOptions::verbose_auto (-1: 1 on a terminal, else 2), 0 (silent), 1 "
                                   "(a progress bar) or 2 (one line per epoch)");
    if (!(options.validation_split >= 0 && options.validation_split < 1))
        throw InvalidArgumentError(who("fit") + ": validation_split is " +
                                   std::to_string(options.validation_split) + "; it is in [0, 1)");
    std::ostream& out = options.out != nullptr ? *options.out : std::cout;
    if (feed == nullptr) prepare_inputs(x, "fit");  // a feed's x is empty: its batches are the datasets'
    const std::size_t all_examples = x.examples();
    if (feed == nullptr) prepare_targets(y, all_examples, "fit");
    const std::vector<double> weights =
        example_weights(y, all_examples, options.sample_weight, options.class_weight, "fit");
    // Keras' validation_split: the last rows, before shuffling.
    std::size_t examples = all_examples;
    if (options.validation_split > 0 && !options.validation_data) {
        examples = static_cast<std::size_t>(std::floor(static_cast<double>(all_examples) * (1 - options.validation_split)));
        if (examples == 0 || examples == all_examples)
            throw InvalidArgumentError(who("fit") + ": validation_split " +
                                       std::to_string(options.validation_split) + " of " +
                                       std::to_string(all_examples) + " examples leaves " + std::to_string(examples) +
                                       " to train on and " + std::to_string(all_examples - examples) +
                                       " to validate on; each needs at least one");
    }
    std::vector<double> validation_weights;
    if (const auto& v = options.validation_data) {
        prepare_inputs(v->x, "fit (validation_data)");
        prepare_targets(v->y, v->x.examples(), "fit (validation_data)");
        validation_weights = example_weights(v->y, v->x.examples(), v->sample_weight, {}, "fit (validation_data)");
    }
    const bool validates = options.validation_data || examples < all_examples;
    const detail::MetricList& metric_list = resolved_metrics();
    const std::size_t state_size = detail::metric_state_size(metric_list);
    ensure_workers();

    const bool remote = strategy_->remote_workers() != nullptr;
    if (remote) ensure_remote_model();

    const std::size_t batches = (examples + batch_size - 1) / batch_size;
    if (feed == nullptr && options.steps_per_epoch > batches)
        throw InvalidArgumentError(who("fit") + ": steps_per_epoch is " + std::to_string(options.steps_per_epoch) +
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
        throw InvalidArgumentError(who("fit") + ": the backup resumes at batch " + std::to_string(start.batch) +
                                   " of an epoch, but an epoch of this data has " + std::to_string(steps) +
                                   " batches; it was made with other data or another batch_size");
    if (start.batch > 0 && !start.metric_state.empty() && start.metric_state.size() != state_size)
        throw InvalidArgumentError(who("fit") + ": the backup holds " + std::to_string(start.metric_state.size()) +
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
            std::shared_ptr<std::atomic<bool>> started;  // set by an embedded worker when it begins the step
        };
        std::deque<Closure> window;
        auto schedule_rows = [&](const Closure& c) {
            if (feed != nullptr) return schedule_dataset_step(*feed, c.worker, c.step, epoch, c.batch, c.started);
            return schedule_step(c.worker, take_input_rows(x, order, c.begin, c.count),
                                 detail::take_rows(y, order, c.begin, c.count),
                                 detail::take_weights(weights, order, c.begin, c.count), c.step, c.scale, c.started);
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
        std::uint64_t counted_step = step_;  // the step of the last batch counted: every step up to it is applied
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
                    // A dataset step's result ends with its example count, known only once it ran: its
                    // weight is its share of the batch's examples.
                    const std::size_t counts = feed != nullptr ? 1 : 0;
                    double batch_examples = 0;
                    std::size_t n = 0;
                    for (; n < window.size() && window[n].batch == counted; ++n) {
                        const std::vector<double>& result = window[n].value.fetch();
                        if (counts != 0 && result.empty()) std::rethrow_exception(feed->error);
                        if (result.size() != 1 + state_size + counts)
                            throw InternalError(who("fit") + ": a step returned " + std::to_string(result.size()) +
                                                " numbers; the loss and " + std::to_string(state_size) +
                                                " of metric state were expected" +
                                                (counts != 0 ? ", then the example count" : ""));
                        if (counts != 0) batch_examples += result.back();
                    }
                    for (std::size_t k = 0; k < n; ++k) {
                        const std::vector<double>& result = window[k].value.fetch();
                        const double weight = counts != 0 ? result.back() / batch_examples : window[k].weight;
                        batch_loss += weight * result[0];
                        for (std::size_t i = 0; i < state_size; ++i) batch_state[i] += result[1 + i];
                    }
                    counted_step = window[n - 1].step;
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
        // Synchronous training: a fit that fails leaves no step half-pushed, so that no later pull (the
        // next fit's) waits for one. A closure that failed or was cancelled while it ran pushed its part
        // of its step (keras_train_step); one cancelled before it ran, or never scheduled, pushed nothing,
        // and the chief pushes its part (push_no_gradient), step after step, up to the last step a
        // closure ran, each step's running closures waited for before the next step's parts are pushed.
        // No one pushed to the steps after that one: step_ goes back to it, the step the ps tasks applied.
        [[maybe_unused]] auto finish_steps = [&] {  // synchronous training only
            // Once join raised, a closure not done is running (the queued ones were cancelled); a closure
            // of a worker process is never cancelled while it runs, so a cancelled one never ran.
            const auto ran = [&](const Closure& c) {
                if (!remote) return c.started->load();
                if (!c.value.ready()) return true;
                try {
                    (void)c.value.fetch();
                } catch (const CancelledError&) {
                    return false;
                } catch (...) {  // its error was the fit's, or came after it
                }
                return true;
            };
            std::uint64_t last = counted_step;
            for (const Closure& c : window)
                if (ran(c)) last = std::max(last, c.step);
            const std::vector<Variable> variables = graph_.weights();
            for (std::uint64_t s = counted_step + 1; s <= last; ++s)
                for (int w = 0; w < static_cast<int>(workers); ++w) {
                    const auto c = std::find_if(window.begin(), window.end(),
                                                [&](const Closure& k) { return k.step == s && k.worker == w; });
                    if (c == window.end() || !ran(*c)) {
                        detail::push_rest_of_step(variables, s, {});
                        continue;
                    }
                    try {
                        (void)c->value.fetch();  // its pushes are done before the next step's are
                    } catch (...) {
                    }
                }
            step_ = last;
        };
        std::size_t scheduled = counted;
        try {
            for (std::size_t b = counted; b < steps && !stop_training; ++b) {
                for (Callback* c : callbacks) c->on_train_batch_begin(b, {});
                const std::size_t begin = b * batch_size;
                // A feed's closures read no rows (one slice a worker: its dataset's batch).
                const std::size_t count = feed != nullptr ? workers : std::min(batch_size, examples - begin);
                if constexpr (StrategyType::synchronous) {
                    const std::uint64_t step = ++step_;
                    for (std::size_t w = 0, at = begin; w < workers; ++w) {
                        const std::size_t slice = count / workers + (w < count % workers ? 1 : 0);
                        const double weight = static_cast<double>(slice) / static_cast<double>(count);
                        const double scale = static_cast<double>(workers) * weight;
                        schedule_closure({static_cast<int>(w), b, at, slice, step, scale, weight, {},
                                          std::make_shared<std::atomic<bool>>(false)});
                        at += slice;
                    }
                } else {  // numbered too: a learning-rate schedule on the ps is evaluated at the step
                    schedule_closure({0, b, begin, count, ++step_, 1.0, 1.0, {}, std::make_shared<std::atomic<bool>>(false)});
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
            if constexpr (StrategyType::synchronous) {
                std::exception_ptr first;
                try {
                    coordinator_->join();  // the first error (and clears it)
                } catch (...) {
                    first = std::current_exception();
                }
                finish_steps();
                if (first) std::rethrow_exception(first);
                throw;  // what fetch raised
            } else {
                coordinator_->join();  // raises the first error (and clears it); else rethrow what fetch raised
                throw;
            }
        }
        epoch_logs = running_logs();
        if (validates) {
            const Logs val = options.validation_data
                                 ? evaluate_rows(options.validation_data->x, options.validation_data->y,
                                                 validation_weights, 0, options.validation_data->x.examples(),
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
Logs Model<StrategyType>::evaluate_rows(const ModelInputs& x, const xt::xarray<float>& y,
                                             const std::vector<double>& weights, std::size_t begin, std::size_t end,
                                             std::size_t batch_size, std::string_view prefix) {
    const detail::MetricList& metric_list = resolved_metrics();
    const std::size_t state_size = detail::metric_state_size(metric_list);
    ensure_workers();
    const bool remote = strategy_->remote_workers() != nullptr;
    if (remote) ensure_remote_model();
    std::vector<std::size_t> order(end - begin);
    std::iota(order.begin(), order.end(), begin);
    const std::size_t batches = (order.size() + batch_size - 1) / batch_size;
    const auto workers = static_cast<std::size_t>(strategy_->num_workers());
    const std::size_t max_batches_in_flight = 2 * workers + 2;
    std::size_t rebuilds_left = 2 * workers + 2;

    // The batches run on the workers, a few ahead, and are added up here in their order, so the figures
    // are the same whichever worker ran which batch.
    std::deque<RemoteValue<std::vector<double>>> window;  // batches counted, counted + 1, ...
    std::size_t counted = 0, scheduled = 0;
    double total = 0;
    std::vector<double> state(state_size, 0.0);
    // A worker process that lost the model (it restarted): once no closure runs and the errors are
    // cleared, the model goes to every worker again and the batches not counted run again (a test step
    // changes nothing, so running one twice is harmless).
    auto rebuild = [&] {
        --rebuilds_left;
        for (;;) {
            try {
                coordinator_->join();
                break;
            } catch (const UnavailableError&) {
                throw;
            } catch (const Error&) {  // the lost model's errors, cleared one by one
            }
        }
        send_remote_model();
        window.clear();
        scheduled = counted;
    };
    try {
        while (counted < batches) {
            try {
                for (; scheduled < batches && scheduled - counted < max_batches_in_flight; ++scheduled) {
                    const std::size_t at = scheduled * batch_size, count = std::min(batch_size, order.size() - at);
                    window.push_back(schedule_test_step(take_input_rows(x, order, at, count),
                                                        detail::take_rows(y, order, at, count),
                                                        detail::take_weights(weights, order, at, count)));
                }
                const std::vector<double>& result = window.front().fetch();
                if (result.size() != 1 + state_size)
                    throw InternalError(who("evaluate") + ": a test step returned " + std::to_string(result.size()) +
                                        " numbers; the loss and " + std::to_string(state_size) +
                                        " of metric state were expected");
                const std::size_t count = std::min(batch_size, order.size() - counted * batch_size);
                total += result[0] * static_cast<double>(count);
                for (std::size_t i = 0; i < state_size; ++i) state[i] += result[1 + i];
                window.pop_front();
                ++counted;
            } catch (const NotFoundError& e) {
                if (!remote || !detail::is_remote_model_unknown(e) || rebuilds_left == 0) throw;
                rebuild();
            } catch (const CancelledError&) {  // cancelled by another closure's failure: maybe a lost model
                if (!remote || rebuilds_left == 0) throw;
                rebuild();
            }
        }
    } catch (...) {
        coordinator_->join();  // raises the first error (and clears it); else rethrow what fetch raised
        throw;
    }
    Logs logs{{std::string(prefix) + "loss", total / static_cast<double>(order.size())}};
    detail::metric_results(metric_list, state, logs, prefix);
    return logs;
}

template <class StrategyType>
Logs Model<StrategyType>::evaluate(const ModelInputs& x, const xt::xarray<float>& y,
                                        const EvaluateOptions& options) {
    require_compiled("evaluate");
    check_batch_size(options.batch_size, "evaluate");
    prepare_inputs(x, "evaluate");
    const std::size_t examples = x.examples();
    prepare_targets(y, examples, "evaluate");
    const std::vector<double> weights = example_weights(y, examples, options.sample_weight, {}, "evaluate");
    return evaluate_rows(x, y, weights, 0, examples, options.batch_size);
}

template <class StrategyType>
xt::xarray<float> Model<StrategyType>::predict(const ModelInputs& x, std::size_t batch_size) {
    check_batch_size(batch_size, "predict");
    prepare_inputs(x, "predict");
    const std::size_t examples = x.examples();
    Shape shape = *output_shape_;
    shape.insert(shape.begin(), examples);
    xt::xarray<float> out = xt::xarray<float>::from_shape(shape);
    const std::size_t width = num_elements(*output_shape_);
    std::vector<std::size_t> order(examples);
    std::iota(order.begin(), order.end(), std::size_t{0});
    for (std::size_t begin = 0; begin < examples; begin += batch_size) {
        const std::size_t count = std::min(batch_size, examples - begin);
        const Tensor predictions = graph_.forward(take_input_rows(x, order, begin, count), 0);
        predictions.visit(
            [&](const auto& p) {
                std::transform(p.begin(), p.end(), out.data() + begin * width, [](auto v) { return static_cast<float>(v); });
                return 0;
            },
            0);
    }
    return out;
}

/// @brief A stack of layers (tf.keras.Sequential): a Model whose layers each take the output of the
/// one before, built from the first data it is given (fit, evaluate, predict) or by build(input_shape).
/// Everything else is Model's: compile, fit, evaluate, predict, the weights, summary, callbacks.
///
/// @par Example
/// @code
/// pss::ParameterServerStrategy<> strategy;
/// pss::Sequential model(strategy, {pss::Dense(1)});
/// model.compile(pss::SGD(), pss::MeanSquaredError());
/// auto history = model.fit(x, y, 5);  // history.loss: one mean loss per epoch
/// @endcode
template <class StrategyType>
class Sequential : public Model<StrategyType> {
public:
    /// @param strategy holds the variables and runs the steps; it must outlive the model
    /// @param layers the layers, first to last (copied); more can be added with add() before building
    /// @param seed the seed of initial values and shuffling (Keras' `set_random_seed`)
    explicit Sequential(StrategyType& strategy, std::initializer_list<AnyLayer> layers = {}, std::uint32_t seed = 0)
        : Model<StrategyType>(strategy, seed, "sequential") {
        for (const auto& layer : layers) append(layer.clone());
    }

    /// @brief Appends a layer (Keras' `model.add`).
    /// @throws FailedPreconditionError once the model is built.
    template <std::derived_from<Layer> L>
    void add(L layer) {
        append(std::make_unique<L>(std::move(layer)));
    }

    /// @brief Creates every layer's variables, in the strategy's scope, for inputs of shape (batch,
    /// `input_shape`...) (Keras' `input_shape`, batch axis excluded). fit, evaluate and predict build
    /// from their data when this was not called.
    /// @throws FailedPreconditionError when built already or without layers; InvalidArgumentError
    /// when a layer cannot take its input shape.
    void build(const Shape& input_shape) { this->build_chain(input_shape); }

private:
    void append(std::unique_ptr<Layer> layer) {
        const int previous = static_cast<int>(this->graph().layers.size()) - 1;  // -1: the model's input
        this->add_layer(std::move(layer), {previous});
    }
};

PSS_NAMESPACE_END
