// pss/keras/model.hpp: Sequential, a Keras-style model trained by scheduling steps on a strategy's workers (compile, fit, evaluate, predict).
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
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

#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/coordinator.hpp>
#include <pss/errors.hpp>
#include <pss/function.hpp>
#include <pss/keras/layers.hpp>
#include <pss/keras/losses.hpp>
#include <pss/tensor.hpp>
#include <pss/variable.hpp>

PSS_NAMESPACE_BEGIN

/// @brief What Sequential::fit returns (Keras' History): the epochs run and each one's mean loss.
struct History {
    std::vector<int> epoch;    ///< 0, 1, ... (Keras' `history.epoch`)
    std::vector<double> loss;  ///< the mean of the epoch's batch losses (Keras' `history.history["loss"]`)
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

/// Rows `order[begin, begin + count)` of `data` (batch axis first), as doubles.
inline xt::xarray<double> take_rows(const xt::xarray<double>& data, const std::vector<std::size_t>& order,
                                    std::size_t begin, std::size_t count) {
    Shape shape(data.shape().begin(), data.shape().end());
    const std::size_t width = shape.front() == 0 ? 0 : data.size() / shape.front();
    shape.front() = count;
    xt::xarray<double> out = xt::xarray<double>::from_shape(shape);
    for (std::size_t r = 0; r < count; ++r)
        std::copy_n(data.data() + order[begin + r] * width, width, out.data() + r * width);
    return out;
}

inline xt::xarray<double> widen(const xt::xarray<float>& data) {
    xt::xarray<double> out = xt::xarray<double>::from_shape(data.shape());
    std::transform(data.begin(), data.end(), out.begin(), [](float v) { return static_cast<double>(v); });
    return out;
}

/// Keras' per-epoch display. On a terminal: a bar redrawn with '\r' and the speed; elsewhere (a file,
/// a pipe, a golden-file test) only `4/4 - loss: 0.123456` at the end, without timings.
class ProgressLine {
public:
    ProgressLine(std::ostream& out, bool terminal, std::size_t total)
        : out_(out), terminal_(terminal), total_(total), start_(std::chrono::steady_clock::now()) {}

    void update(std::size_t done, double mean_loss) {
        if (!terminal_) return;
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
        constexpr std::size_t width = 30;
        const std::size_t filled = total_ == 0 ? width : done * width / total_;
        std::string bar(filled, '=');
        if (filled < width) {
            if (filled > 0) bar.back() = '>';
            bar.append(width - filled, '.');
        }
        const std::string count = std::to_string(total_);
        std::ostringstream line;
        line << std::setw(static_cast<int>(count.size())) << done << "/" << count << " [" << bar
             << "] - loss: " << std::fixed << std::setprecision(4) << mean_loss << " - " << std::setprecision(rate < 10 ? 1 : 0)
             << rate << " steps/s";
        std::string text = line.str();
        const std::size_t length = text.size();
        if (length < drawn_) text.append(drawn_ - length, ' ');  // wipe the end of a longer line
        drawn_ = length;
        out_ << '\r' << text << std::flush;
    }

    void finish(double mean_loss) {
        if (terminal_) {
            update(total_, mean_loss);
            out_ << "\n";
        } else {
            out_ << total_ << "/" << total_ << " - loss: " << std::fixed << std::setprecision(6) << mean_loss << "\n";
        }
        out_.flush();
    }

private:
    std::ostream& out_;
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

/// One training step: pull, forward, loss, backward, push. Returns the slice's loss (0 for an empty
/// slice, which still pulls and pushes: a synchronous step needs every worker).
inline double keras_train_step(std::vector<std::unique_ptr<Layer>>& layers, const Loss& loss,
                               const xt::xarray<double>& x, const xt::xarray<double>& y, std::uint64_t step,
                               double scale) {
    const StepProfile::Timer timer(StepProfile::Counter::step);  // times nothing unless a benchmark enabled it
    xt::xarray<double> predictions = x;
    for (auto& layer : layers) predictions = layer->forward(predictions, step);
    const bool empty = x.shape()[0] == 0;
    const double value = empty ? 0.0 : loss.value(y, predictions);
    xt::xarray<double> grad =
        empty ? xt::xarray<double>(xt::zeros<double>(predictions.shape())) : loss.gradient(y, predictions);
    if (scale != 1.0) grad *= scale;
    for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
        LayerGradients grads = (*it)->backward(grad);
        for (auto& g : grads.variables) {
            const DType dtype = g.variable.dtype();
            if (g.sparse)
                (void)g.variable.apply_sparse_gradient(std::span<const std::int64_t>(g.ids),
                                                       from_double(g.values, dtype), step);
            else
                (void)g.variable.apply_gradient(from_double(g.values, dtype), step);
        }
        grad = std::move(grads.inputs);
    }
    return value;
}

/// A model as a worker process rebuilds it from its description: layers bound to the coordinator's
/// variables, and the loss.
struct RemoteModel {
    std::vector<std::unique_ptr<Layer>> layers;
    std::shared_ptr<const Loss> loss;
};

/// The training step a worker process runs for Sequential::fit. The model arrives as its layers'
/// config() lines, each layer's weight count, the weights' handles and the loss's config(); the worker
/// keeps the rebuilt model for the next steps (a worker runs one call at a time; a few models at most).
inline double keras_remote_train_step(std::vector<std::string> layer_configs, std::vector<std::int64_t> weight_counts,
                                      std::vector<Variable> weights, std::string loss_config, xt::xarray<double> x,
                                      xt::xarray<double> y, std::uint64_t step, double scale) {
    static std::mutex mutex;
    static std::map<std::string, RemoteModel> models;
    std::string key = loss_config;
    for (const auto& c : layer_configs) key += "\n" + c;
    for (const auto& w : weights) key += "\n" + w.name() + "#" + std::to_string(w.id());
    std::lock_guard lock(mutex);
    auto it = models.find(key);
    if (it == models.end()) {
        if (weight_counts.size() != layer_configs.size())
            throw InvalidArgumentError("pss: Sequential::fit on a worker: " + std::to_string(layer_configs.size()) +
                                       " layers but " + std::to_string(weight_counts.size()) + " weight counts");
        RemoteModel model;
        std::size_t at = 0;
        for (std::size_t i = 0; i < layer_configs.size(); ++i) {
            const auto n = weight_counts[i];
            if (n < 0 || static_cast<std::size_t>(n) > weights.size() - at)
                throw InvalidArgumentError("pss: Sequential::fit on a worker: layer " + std::to_string(i) + " claims " +
                                           std::to_string(n) + " of the " + std::to_string(weights.size() - at) +
                                           " weights left");
            std::vector<Variable> own(weights.begin() + static_cast<std::ptrdiff_t>(at),
                                      weights.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(n)));
            at += static_cast<std::size_t>(n);
            model.layers.push_back(bind_layer_from_config(layer_configs[i], std::move(own)));
        }
        model.loss = loss_from_config(loss_config);
        if (models.size() >= 8) models.clear();
        it = models.emplace(std::move(key), std::move(model)).first;
    }
    return keras_train_step(it->second.layers, *it->second.loss, x, y, step, scale);
}

/// Registered in every program that includes this header, so that worker processes know it.
inline const RegisteredFunction<double(std::vector<std::string>, std::vector<std::int64_t>, std::vector<Variable>,
                                       std::string, xt::xarray<double>, xt::xarray<double>, std::uint64_t, double)>
    keras_remote_train_step_function = register_function("pss.keras.Sequential.train_step", &keras_remote_train_step);

}  // namespace detail

/// @brief A stack of layers trained on a parameter-server cluster (tf.keras.Sequential under
/// ParameterServerStrategy): compile, fit, evaluate, predict.
///
/// The model builds its layers on first use (or `build(input_shape)`), inside the strategy's scope, so
/// every variable lives on the ps tasks (and is sharded as the strategy's partitioner decides). Initial
/// values come from `std::mt19937(seed)`, layer after layer; shuffling from `std::mt19937(seed + 1)`:
/// the same seed gives the same numbers on every platform.
///
/// `fit` runs each step as a closure on a worker, through the ClusterCoordinator the model owns (one
/// thread per worker on the embedded cluster). Each worker computes with its own copy of the layers
/// (sharing the variables). A step pulls the weights it needs (whole dense weights, only the looked-up
/// rows of an embedding), runs forward and backward, and pushes the gradients; the ps tasks apply the
/// strategy's optimizer to them.
/// - Asynchronous strategy (TensorFlow's mode): one closure per batch, on whichever worker is free.
/// - Synchronous strategy (Strategy::synchronous): step k schedules one closure per worker, each on its
///   contiguous slice of the batch (the first slices one example longer when the batch does not divide),
///   pulling and pushing with step k. Each worker pushes its slice's mean gradient scaled by
///   num_workers * slice / batch; as the ps averages over workers, the update is exactly the batch's
///   mean gradient: the same as one worker on the whole batch.
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
class Sequential {
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
    /// @brief Every layer's variables, first layer first (Keras' `model.weights`).
    [[nodiscard]] std::vector<Variable> weights() const {
        std::vector<Variable> out;
        for (const auto& layer : layers_)
            for (auto& v : layer->weights()) out.push_back(std::move(v));
        return out;
    }
    /// @brief Every weight's value (Keras' `model.get_weights()`).
    [[nodiscard]] std::vector<Tensor> get_weights() const {
        std::vector<Tensor> out;
        for (const auto& v : weights()) out.push_back(v.read_value());
        return out;
    }
    /// @brief Assigns every weight, in the order of weights() (Keras' `model.set_weights()`).
    /// @throws InvalidArgumentError when the count or a shape differs.
    void set_weights(const std::vector<Tensor>& values) {
        const auto vars = weights();
        if (values.size() != vars.size())
            throw InvalidArgumentError("pss: Sequential::set_weights got " + std::to_string(values.size()) +
                                       " arrays, but the model has " + std::to_string(vars.size()) +
                                       " weights (see weights(); build the model first)");
        for (std::size_t i = 0; i < vars.size(); ++i)  // every shape first: a mismatch changes nothing
            if (values[i].shape() != vars[i].shape())
                throw InvalidArgumentError("pss: Sequential::set_weights: weight " + std::to_string(i) + " ('" +
                                           vars[i].name() + "') has shape " + format_shape(vars[i].shape()) +
                                           ", got " + format_shape(values[i].shape()));
        std::size_t at = 0;
        for (auto& layer : layers_) {
            const std::size_t n = layer->weights().size();
            layer->set_weights(std::vector<Tensor>(values.begin() + static_cast<std::ptrdiff_t>(at),
                                                   values.begin() + static_cast<std::ptrdiff_t>(at + n)));
            at += n;
        }
    }

    /// @brief Sets the loss and checks the optimizer (Keras' `compile(optimizer, loss)`).
    ///
    /// In pss the parameter servers apply the updates, with the strategy's Optimizer policy: the
    /// optimizer given here must be that policy's type (checked at compile time) and be configured as
    /// the strategy's. To train with another optimizer, construct the strategy with it.
    /// @param loss a pss::Loss (MeanSquaredError, ...) or a Keras name ("mse", ...)
    /// @throws InvalidArgumentError when `optimizer` differs from the strategy's:
    /// `pss: Sequential::compile: the optimizer is SGD(learning_rate=0.1), but the strategy's is
    /// SGD(learning_rate=0.01); ...`
    template <class OptimizerType, std::derived_from<Loss> LossType>
    void compile(const OptimizerType& optimizer, const LossType& loss) {
        check_optimizer(optimizer);
        loss_ = std::make_shared<LossType>(loss);
    }
    template <class OptimizerType>
    void compile(const OptimizerType& optimizer, std::string_view loss) {
        check_optimizer(optimizer);
        loss_ = make_loss(loss);
    }
    /// @brief Sets the loss; the ps tasks apply the strategy's optimizer.
    template <std::derived_from<Loss> LossType>
    void compile(const LossType& loss) {
        loss_ = std::make_shared<LossType>(loss);
    }
    void compile(std::string_view loss) { loss_ = make_loss(loss); }

    /// @brief The loss given to compile, or nullptr.
    [[nodiscard]] const Loss* loss() const noexcept { return loss_.get(); }

    /// @brief Trains for `epochs` epochs over (x, y) in batches of `batch_size` (Keras' `fit`).
    ///
    /// With `shuffle` the examples are visited in a new seeded permutation each epoch. An epoch's loss is
    /// the mean of its batch losses (what Keras prints). With `verbose`, prints `Epoch 1/5` and then,
    /// on a terminal, a progress bar with the loss and the speed, redrawn as steps finish; on anything
    /// else (a file, a pipe) one line `4/4 - loss: 0.123456`, without timings.
    /// @param x inputs, shape (examples, input_shape...); an Embedding's ids as floats
    /// @param y targets, batch axis first (class ids as floats for SparseCategoricalCrossentropy)
    /// @throws FailedPreconditionError before compile; InvalidArgumentError for data that does not fit
    /// the model (checked before any step runs); the first error a step raised.
    History fit(const xt::xarray<float>& x, const xt::xarray<float>& y, int epochs = 1, std::size_t batch_size = 32,
                bool shuffle = true, bool verbose = true, std::ostream& out = std::cout);

    /// @brief The loss over all of (x, y): the mean over the examples, computed in batches of
    /// `batch_size` on the calling thread (Keras' `evaluate`).
    [[nodiscard]] double evaluate(const xt::xarray<float>& x, const xt::xarray<float>& y, std::size_t batch_size = 32);

    /// @brief The model's outputs for `x`, shape (examples, output_shape...) (Keras' `predict`).
    [[nodiscard]] xt::xarray<float> predict(const xt::xarray<float>& x, std::size_t batch_size = 32);

private:
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

    /// Checks x (and y) against the model, building it from x's shape when needed; returns x as doubles.
    xt::xarray<double> prepare_inputs(const xt::xarray<float>& x, const char* what) {
        if (x.dimension() == 0 || x.shape()[0] == 0)
            throw InvalidArgumentError("pss: Sequential::" + std::string(what) + ": x has shape " +
                                       format_shape(Shape(x.shape().begin(), x.shape().end())) +
                                       "; give at least one example, batch axis first");
        if (!input_shape_) build(Shape(x.shape().begin() + 1, x.shape().end()));
        xt::xarray<double> xd = detail::widen(x);
        layers_.front()->check_inputs(xd);
        return xd;
    }
    xt::xarray<double> prepare_targets(const xt::xarray<float>& y, std::size_t examples, const char* what) const {
        const Shape got(y.shape().begin(), y.shape().end());
        if (got.empty() || got.front() != examples)
            throw InvalidArgumentError("pss: Sequential::" + std::string(what) + ": x has " + std::to_string(examples) +
                                       " examples but y has shape " + format_shape(got) +
                                       "; give one target row per example, batch axis first");
        xt::xarray<double> yd = detail::widen(y);
        loss_->check_targets(yd, *output_shape_);
        return yd;
    }

    static void check_batch_size(std::size_t batch_size, const char* what) {
        if (batch_size == 0)
            throw InvalidArgumentError("pss: Sequential::" + std::string(what) +
                                       ": batch_size is 0; it must be at least 1 (Keras' default is 32)");
    }

    /// Runs the layers forward, from the first.
    static xt::xarray<double> run_forward(std::vector<std::unique_ptr<Layer>>& layers, xt::xarray<double> x,
                                          std::uint64_t step) {
        for (auto& layer : layers) x = layer->forward(x, step);
        return x;
    }

    double train_step(Replica& replica, const xt::xarray<double>& x, const xt::xarray<double>& y, std::uint64_t step,
                      double scale) const {
        return detail::keras_train_step(replica.layers, *loss_, x, y, step, scale);
    }

    /// Schedules one step on a worker: as a closure on the embedded cluster, as the registered step
    /// with the model's description when the workers are other processes.
    RemoteValue<double> schedule_step(xt::xarray<double> xs, xt::xarray<double> ys, std::uint64_t step, double scale) {
        if (strategy_->remote_workers() != nullptr) {
            if (!description_) {
                Description d;
                for (const auto& layer : layers_) {
                    d.layer_configs.push_back(layer->config());
                    const auto w = layer->weights();
                    d.weight_counts.push_back(static_cast<std::int64_t>(w.size()));
                    d.weights.insert(d.weights.end(), w.begin(), w.end());
                }
                d.loss_config = loss_->config();
                description_ = std::move(d);
            }
            return coordinator_->schedule(detail::keras_remote_train_step_function, description_->layer_configs,
                                          description_->weight_counts, description_->weights, description_->loss_config,
                                          std::move(xs), std::move(ys), step, scale);
        }
        return coordinator_->schedule(
            [this, step, scale](Replica& replica, const xt::xarray<double>& x, const xt::xarray<double>& y) {
                return train_step(replica, x, y, step, scale);
            },
            *replicas_, std::move(xs), std::move(ys));
    }

    void ensure_workers() {
        if (!coordinator_) coordinator_ = std::make_unique<ClusterCoordinator>(*strategy_);
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
    std::uint64_t step_ = 0;  // synchronous steps run so far: the next is step_ + 1
    std::optional<PerWorkerValues<Replica>> replicas_;
    /// What a worker process needs to rebuild the model (made at the first remote step).
    struct Description {
        std::vector<std::string> layer_configs;
        std::vector<std::int64_t> weight_counts;
        std::vector<Variable> weights;
        std::string loss_config;
    };
    std::optional<Description> description_;
    std::unique_ptr<ClusterCoordinator> coordinator_;  // last: its threads stop before the rest goes
};

// ---------------------------------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------------------------------

template <class StrategyType>
History Sequential<StrategyType>::fit(const xt::xarray<float>& x, const xt::xarray<float>& y, int epochs,
                                      std::size_t batch_size, bool shuffle, bool verbose, std::ostream& out) {
    require_compiled("fit");
    check_batch_size(batch_size, "fit");
    if (epochs < 0)
        throw InvalidArgumentError("pss: Sequential::fit: epochs is " + std::to_string(epochs) +
                                   "; it must be 0 or more");
    const xt::xarray<double> xd = prepare_inputs(x, "fit");
    const std::size_t examples = xd.shape()[0];
    const xt::xarray<double> yd = prepare_targets(y, examples, "fit");
    ensure_workers();

    const std::size_t steps = (examples + batch_size - 1) / batch_size;
    const bool terminal = verbose && detail::is_terminal(out);
    const std::size_t workers = static_cast<std::size_t>(coordinator_->num_workers());
    std::vector<std::size_t> order(examples);
    History history;
    for (int epoch = 0; epoch < epochs; ++epoch) {
        std::iota(order.begin(), order.end(), std::size_t{0});
        if (shuffle)  // Fisher-Yates with an unbiased, portable draw (rejection of the uneven tail)
            for (std::size_t i = examples - 1; i > 0; --i) {
                const std::uint64_t range = i + 1;
                const std::uint64_t limit = (std::uint64_t{1} << 32) / range * range;
                std::uint64_t draw;
                do draw = shuffle_rng_();
                while (draw >= limit);
                std::swap(order[i], order[static_cast<std::size_t>(draw % range)]);
            }
        if (verbose) out << "Epoch " << epoch + 1 << "/" << epochs << "\n" << std::flush;
        detail::ProgressLine progress(out, terminal, steps);

        // One RemoteValue per closure with its weight; batch b's loss is the weighted sum of its closures'.
        std::vector<std::vector<std::pair<RemoteValue<double>, double>>> results(steps);
        for (std::size_t b = 0; b < steps; ++b) {
            const std::size_t begin = b * batch_size;
            const std::size_t count = std::min(batch_size, examples - begin);
            if constexpr (StrategyType::synchronous) {
                const std::uint64_t step = ++step_;
                for (std::size_t w = 0, at = begin; w < workers; ++w) {
                    const std::size_t slice = count / workers + (w < count % workers ? 1 : 0);
                    const double weight = static_cast<double>(slice) / static_cast<double>(count);
                    const double scale = static_cast<double>(workers) * weight;
                    // The slice's loss weighted by its share of the batch: their sum is the batch's loss.
                    results[b].push_back(
                        {schedule_step(detail::take_rows(xd, order, at, slice), detail::take_rows(yd, order, at, slice),
                                       step, scale),
                         weight});
                    at += slice;
                }
            } else {
                results[b].push_back(
                    {schedule_step(detail::take_rows(xd, order, begin, count), detail::take_rows(yd, order, begin, count),
                                   0, 1.0),
                     1.0});
            }
        }

        double sum = 0;
        try {
            for (std::size_t b = 0; b < steps; ++b) {
                double batch_loss = 0;
                for (const auto& [r, weight] : results[b]) batch_loss += weight * r.fetch();
                sum += batch_loss;
                progress.update(b + 1, sum / static_cast<double>(b + 1));
            }
            coordinator_->join();
        } catch (...) {
            if (terminal) out << "\n" << std::flush;
            coordinator_->join();  // raises the first error (and clears it); else rethrow what fetch raised
            throw;
        }
        const double epoch_loss = sum / static_cast<double>(steps);
        if (verbose) progress.finish(epoch_loss);
        history.epoch.push_back(epoch);
        history.loss.push_back(epoch_loss);
    }
    return history;
}

template <class StrategyType>
double Sequential<StrategyType>::evaluate(const xt::xarray<float>& x, const xt::xarray<float>& y,
                                          std::size_t batch_size) {
    require_compiled("evaluate");
    check_batch_size(batch_size, "evaluate");
    const xt::xarray<double> xd = prepare_inputs(x, "evaluate");
    const std::size_t examples = xd.shape()[0];
    const xt::xarray<double> yd = prepare_targets(y, examples, "evaluate");
    std::vector<std::size_t> order(examples);
    std::iota(order.begin(), order.end(), std::size_t{0});
    double total = 0;
    for (std::size_t begin = 0; begin < examples; begin += batch_size) {
        const std::size_t count = std::min(batch_size, examples - begin);
        const auto predictions = run_forward(layers_, detail::take_rows(xd, order, begin, count), 0);
        total += loss_->value(detail::take_rows(yd, order, begin, count), predictions) * static_cast<double>(count);
    }
    return total / static_cast<double>(examples);
}

template <class StrategyType>
xt::xarray<float> Sequential<StrategyType>::predict(const xt::xarray<float>& x, std::size_t batch_size) {
    check_batch_size(batch_size, "predict");
    const xt::xarray<double> xd = prepare_inputs(x, "predict");
    const std::size_t examples = xd.shape()[0];
    Shape shape = *output_shape_;
    shape.insert(shape.begin(), examples);
    xt::xarray<float> out = xt::xarray<float>::from_shape(shape);
    const std::size_t width = num_elements(*output_shape_);
    std::vector<std::size_t> order(examples);
    std::iota(order.begin(), order.end(), std::size_t{0});
    for (std::size_t begin = 0; begin < examples; begin += batch_size) {
        const std::size_t count = std::min(batch_size, examples - begin);
        const auto predictions = run_forward(layers_, detail::take_rows(xd, order, begin, count), 0);
        std::transform(predictions.begin(), predictions.end(), out.data() + begin * width,
                       [](double v) { return static_cast<float>(v); });
    }
    return out;
}

PSS_NAMESPACE_END
