// pss/keras/layers.hpp: Keras-style layers (Dense, Embedding, GlobalAveragePooling1D, Flatten, Dropout, Activation, LayerNormalization, Concatenate, Add) whose weights are pss Variables, the functional API's symbolic tensors (Input), the layers' Keras configs (JSON), and register_layer for a user's layer classes.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xbroadcast.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xview.hpp>

#include <pss/config.hpp>
#include <pss/distribute.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/keras/config.hpp>
#include <pss/keras/initializers.hpp>
#include <pss/keras/losses.hpp>
#include <pss/tensor.hpp>
#include <pss/variable.hpp>

PSS_NAMESPACE_BEGIN

/// @brief The activation a Dense layer applies to `inputs · kernel + bias` (Keras' `activation=`), and
/// an Activation layer to its inputs. (Not `Activation`: that is the layer, as Keras' `layers.Activation`.)
enum class ActivationFunction {
    linear,   ///< y = z (Keras' default, `None`)
    relu,     ///< y = max(z, 0); its derivative at 0 is taken as 0, as TensorFlow does
    sigmoid,  ///< y = 1 / (1 + exp(-z))
    tanh,     ///< y = tanh(z)
    softmax,  ///< y = exp(z) / sum(exp(z)) over the last axis
};

namespace detail {
/// Every activation with Keras' name for it: the one list that both directions read.
inline constexpr std::array<std::pair<ActivationFunction, std::string_view>, 5> activation_names{{
    {ActivationFunction::linear, "linear"},
    {ActivationFunction::relu, "relu"},
    {ActivationFunction::sigmoid, "sigmoid"},
    {ActivationFunction::tanh, "tanh"},
    {ActivationFunction::softmax, "softmax"},
}};

/// The activation named `name`, if one is.
[[nodiscard]] constexpr std::optional<ActivationFunction> find_activation(std::string_view name) noexcept {
    for (const auto& [activation, known] : activation_names)
        if (name == known) return activation;
    return std::nullopt;
}

/// `"linear", "relu", "sigmoid", "tanh" or "softmax"`, for messages.
[[nodiscard]] inline std::string activation_list() {
    std::string out;
    for (std::size_t i = 0; i < activation_names.size(); ++i)
        out += std::string(i == 0 ? "" : i + 1 == activation_names.size() ? " or " : ", ") + "\"" +
               std::string(activation_names[i].second) + "\"";
    return out;
}
}  // namespace detail

/// @brief Keras' name of an activation: "linear", "relu", "sigmoid", "tanh", "softmax".
[[nodiscard]] constexpr std::string_view activation_name(ActivationFunction activation) noexcept {
    for (const auto& [a, name] : detail::activation_names)
        if (a == activation) return name;
    return "linear";
}

/// @brief The activation named `name` (Keras' names; "" means linear, as Keras' `None`).
/// @throws InvalidArgumentError `pss: activation "gelu" is not known; use "linear", "relu", "sigmoid",
/// "tanh" or "softmax"`
[[nodiscard]] inline ActivationFunction activation_from_name(std::string_view name) {
    if (name.empty()) return ActivationFunction::linear;
    if (const auto a = detail::find_activation(name)) return *a;
    throw InvalidArgumentError("pss: activation \"" + std::string(name) + "\" is not known; use " +
                               detail::activation_list());
}

namespace detail {

/// A tensor of dtype float32 or float64 holding `values`.
inline Tensor from_double(const xt::xarray<double>& values, DType dtype) {
    if (dtype == DType::float64) return Tensor(xt::xarray<double>(values));
    xt::xarray<float> out = xt::xarray<float>::from_shape(values.shape());
    std::transform(values.begin(), values.end(), out.begin(), [](double v) { return static_cast<float>(v); });
    return Tensor(std::move(out));
}

/// The elements of any tensor as doubles.
inline xt::xarray<double> to_double(const Tensor& tensor) {
    if (!tensor.has_value()) throw InvalidArgumentError("pss: an empty tensor was given where an array was expected");
    return tensor.visit(
        [](const auto& a) {
            xt::xarray<double> out = xt::xarray<double>::from_shape(a.shape());
            std::transform(a.begin(), a.end(), out.begin(), [](auto v) { return static_cast<double>(v); });
            return out;
        },
        xt::xarray<double>());
}

/// The array of `tensor` as `xt::xarray<T>`: moved out when its dtype is T, else converted (xt::cast).
/// @throws InvalidArgumentError for an empty tensor.
template <class T>
xt::xarray<T> take_as(Tensor&& tensor) {
    if (!tensor.has_value()) throw InvalidArgumentError("pss: an empty tensor was given where an array was expected");
    if (tensor.dtype() == dtype_of<T>) return std::move(tensor.get<T>());
    return tensor.visit([](const auto& a) { return xt::xarray<T>(xt::cast<T>(a)); }, xt::xarray<T>());
}

/// Calls `f(std::type_identity<T>{})` with T float for float32 and double for float64.
template <class F>
decltype(auto) with_float_type(DType dtype, F&& f) {
    if (dtype == DType::float64) return f(std::type_identity<double>{});
    return f(std::type_identity<float>{});
}

/// `value` converted to `dtype` (float32 or float64), as Keras' set_weights converts numpy arrays.
inline Tensor convert_tensor(const Tensor& value, DType dtype) {
    if (value.has_value() && value.dtype() == dtype) return value;
    return from_double(to_double(value), dtype);
}

/// Keras' snake_case of a class name: "Dense" gives "dense", "GlobalAveragePooling1D" gives
/// "global_average_pooling1d".
inline std::string snake_case(std::string_view name) {
    std::string out;
    for (std::size_t i = 0; i < name.size(); ++i) {
        const char c = name[i];
        auto lower = [](char ch) { return ch >= 'a' && ch <= 'z'; };
        if (c >= 'A' && c <= 'Z') {
            // As Keras' to_snake_case: a word starts at a capital after a lowercase letter, or at a
            // capital followed by a lowercase one ("Pooling1D" gives "pooling1d").
            if (i > 0 && (lower(name[i - 1]) || (i + 1 < name.size() && lower(name[i + 1])))) out += '_';
            out += static_cast<char>(c - 'A' + 'a');
        } else {
            out += c;
        }
    }
    return out;
}

/// Checks that a layer's variable dtype is one that trains.
inline void check_float_dtype(DType dtype, std::string_view layer) {
    if (dtype != DType::float32 && dtype != DType::float64)
        throw InvalidArgumentError("pss: " + std::string(layer) + ": dtype " + std::string(dtype_name(dtype)) +
                                   " cannot train; a layer's weights are float32 (the default) or float64");
}

}  // namespace detail

/// @brief The gradient of a loss with respect to one variable, as backward() computes it on a worker.
///
/// Dense (`ids` empty, `sparse` false): `values` has the variable's shape; the model pushes it with
/// Variable::apply_gradient. Sparse (tf.IndexedSlices): `values` holds one row per entry of `ids`
/// (repeated ids allowed: the parameter server sums their rows); the model pushes it with
/// Variable::apply_sparse_gradient, which reaches only the shards holding those rows.
struct VariableGradient {
    Variable variable;
    Tensor values;  ///< in the variable's dtype
    std::vector<std::int64_t> ids;
    bool sparse = false;
};

/// @brief What a layer's backward pass returns: the gradient with respect to its inputs, and one
/// VariableGradient per weight, in the order of Layer::weights().
struct LayerGradients {
    Tensor inputs;
    std::vector<VariableGradient> variables;
};

namespace detail {

/// Every weight's value, in order (Keras' `get_weights()`).
inline std::vector<Tensor> read_weights(const std::vector<Variable>& vars) {
    std::vector<Tensor> out;
    out.reserve(vars.size());
    for (const auto& v : vars) out.push_back(v.read_value());
    return out;
}

/// Assigns `values` to `vars` in order (Keras' `set_weights()`), each converted to its variable's dtype.
/// The count and every shape are checked first, so that a mismatch changes no weight. `who` names the
/// call in errors ("Dense 'dense': set_weights"), `owner` what holds the weights ("layer", "model").
inline void assign_weights(const std::vector<Variable>& vars, const std::vector<Tensor>& values, const std::string& who,
                           const char* owner) {
    if (values.size() != vars.size())
        throw InvalidArgumentError("pss: " + who + " got " + std::to_string(values.size()) + " arrays, but the " + owner +
                                   " has " + std::to_string(vars.size()) + " weights (see weights(); build the " +
                                   owner + " first)");
    for (std::size_t i = 0; i < vars.size(); ++i)
        if (values[i].shape() != vars[i].shape())
            throw InvalidArgumentError("pss: " + who + ": weight " + std::to_string(i) + " ('" + vars[i].name() +
                                       "') has shape " + format_shape(vars[i].shape()) + ", got " +
                                       format_shape(values[i].shape()));
    for (std::size_t i = 0; i < vars.size(); ++i) {
        Variable v = vars[i];
        (void)v.assign(convert_tensor(values[i], v.dtype()));
    }
}

}  // namespace detail

class Layer;
namespace detail {
struct SymbolicNode;
}  // namespace detail

/// @brief A symbolic tensor of the functional API (Keras' KerasTensor): what pss::Input returns, and
/// what a layer called on symbolic tensors returns. It holds no values: its shape (batch axis excluded)
/// and how it was made, which pss::Model(strategy, inputs, outputs) traces back to the inputs.
///
/// @par Example
/// @code
/// pss::KerasTensor x = pss::Input({3});
/// pss::KerasTensor h = pss::Dense(8, "relu")(x);   // h.shape() is (8)
/// @endcode
class KerasTensor {
public:
    /// @brief An empty tensor; calling a layer on it throws.
    KerasTensor() = default;
    /// @brief The shape of one example (batch axis excluded). @pre not empty
    [[nodiscard]] const Shape& shape() const;
    /// @brief An Input's name ("" until a Model names it) or the name of the layer whose output it is
    /// (given by the user; else "" until a Model names the layer). @pre not empty
    [[nodiscard]] const std::string& name() const;
    [[nodiscard]] explicit operator bool() const noexcept { return node_ != nullptr; }
    /// @brief What made it (the Model's tracing reads it).
    [[nodiscard]] const std::shared_ptr<const detail::SymbolicNode>& node() const noexcept { return node_; }
    /// @brief The tensor `node` makes (pss::Input and Layer's call make them).
    explicit KerasTensor(std::shared_ptr<const detail::SymbolicNode> node) : node_(std::move(node)) {}

private:
    std::shared_ptr<const detail::SymbolicNode> node_;
};

/// @brief The interface of a layer of a pss::Sequential model (tf.keras.layers.Layer).
///
/// A layer's weights are pss::Variables: `build` creates them through get_strategy(), so built inside
/// `strategy.scope()` they live on the parameter-server tasks (sharded as the strategy's partitioner
/// decides). A layer computes in its dtype, its weights' (Keras' `dtype`): float32 (the default) or
/// float64. Inputs of another dtype are converted once (a float32 data set fed to a float64 model);
/// layers without weights compute in their inputs' dtype. Gradients come back in the weights' dtype.
///
/// Shapes exclude the batch axis, as Keras' `input_shape`: a Dense layer built for `{3}` takes inputs
/// of shape (batch, 3). `forward(inputs, step)` pulls the weights (naming `step` in synchronous
/// training, 0 otherwise) and keeps what backward needs; `backward(grad_out)` uses it. One layer object
/// runs one step at a time: a model gives each worker its own `clone()` (clones share the variables).
///
/// To write a layer: derive, implement `clone`, `class_name`, `do_build`, `forward` and `backward`
/// (both on float32 and float64 tensors), and `weights` when it has any; override `check_input_values`
/// to reject inputs before training starts. For worker processes (a Sequential or Model whose workers
/// are separate processes, as under pss-launch), also override `get_config` (Layer::get_config plus
/// the class's own parameters) and `do_bind`, give the class Keras' `from_config`
/// (`static MyLayer from_config(const nlohmann::json& config)`, taking those parameters), and register
/// it in every process of the program with a namespace-scope variable:
/// `inline const auto my_layer_registration = pss::register_layer<MyLayer>("MyLayer");` (see
/// register_layer; examples/custom_layer.cpp is a complete one).
class Layer {
public:
    PSS_INLINE virtual ~Layer();  // the key function (see PSS_INLINE)

    /// @brief A copy sharing the variables (Variable handles), with its own per-step state.
    [[nodiscard]] virtual std::unique_ptr<Layer> clone() const = 0;
    /// @brief Keras' class name: "Dense", "Embedding".
    [[nodiscard]] virtual std::string_view class_name() const noexcept = 0;

    /// @brief The layer's name, the prefix of its variables' names ("dense_1" gives "dense_1/kernel").
    /// A Sequential model names unnamed layers as Keras does: "dense", "dense_1", ...
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    /// @throws FailedPreconditionError once built: the variables carry the name already.
    void set_name(std::string name) {
        if (built_)
            throw FailedPreconditionError("pss: " + std::string(class_name()) + " '" + name_ +
                                          "': set_name after build; its variables are named already, so name a "
                                          "layer before it is built");
        name_ = std::move(name);
    }

    [[nodiscard]] bool built() const noexcept { return built_; }

    /// @brief Calls the layer on a symbolic tensor (Keras' functional API): a tensor of the output
    /// shape, made by a copy of this layer (not built) that pss::Model builds. Calling one layer object
    /// twice would share its weights in Keras; pss::Model refuses such a graph (make one layer per call).
    /// @throws InvalidArgumentError when the layer cannot take inputs of that shape (or takes a list).
    KerasTensor operator()(const KerasTensor& input) const { return call({input}); }
    /// @brief Calls a layer that takes a list (Concatenate, Add) on symbolic tensors.
    KerasTensor operator()(const std::vector<KerasTensor>& inputs) const { return call(inputs); }

    /// @brief Keras' `compute_output_shape`: the output shape for inputs of `input_shape` (batch axis
    /// excluded), without building. Every pss layer has it; a user's layer overrides it to be called on
    /// symbolic tensors.
    /// @throws InvalidArgumentError when the layer cannot take such inputs; FailedPreconditionError when
    /// the class does not override it.
    [[nodiscard]] virtual Shape compute_output_shape(const Shape& /*input_shape*/) const {
        throw FailedPreconditionError("pss: " + describe() +
                                      ": compute_output_shape is not implemented by this class; override it to call "
                                      "the layer on symbolic tensors (pss::Input)");
    }

    /// @brief Keras' `get_config()`: the layer's constructor parameters, its name and, once built, the
    /// input shape it was built for: `{"name": "dense", "units": 4, "activation": "relu", "use_bias":
    /// true, "dtype": "float32", "batch_input_shape": [null, 3]}`. From serialize(layer), which wraps it
    /// with the class name, detail::layer_from_config rebuilds the layer in a worker process that has no
    /// model object. This gives `name` and `batch_input_shape` (when built); a layer class adds its own
    /// parameters; a user's class registers with register_layer so that detail::layer_from_config knows it.
    [[nodiscard]] virtual nlohmann::json get_config() const {
        nlohmann::json config = {{"name", name_}};
        if (built_) {
            nlohmann::json shape = nlohmann::json::array({nullptr});
            for (auto d : input_shape_) shape.push_back(d);
            config["batch_input_shape"] = std::move(shape);
        }
        return config;
    }

    /// @brief Marks the layer built for inputs of `input_shape` (batch axis excluded) over existing
    /// variables, in the order of weights(), instead of creating them: how a worker process rebuilds a
    /// layer from serialize(layer) and the handles of the coordinator's variables. No variable is created;
    /// afterwards forward, backward and weights() work as on the layer whose variables these are.
    /// Returns the output shape, as build.
    /// @throws FailedPreconditionError when built already (or the class does not override do_bind);
    /// InvalidArgumentError when the layer cannot take inputs of that shape, or `weights` are not what
    /// build would create (their count, shapes or dtypes):
    /// `pss: Dense 'dense': bind: weight 0 (kernel) is 'x/kernel:0' of shape (2, 4), but the layer needs (3, 4)`
    Shape bind(const Shape& input_shape, std::vector<Variable> weights) {
        if (built_)
            throw FailedPreconditionError("pss: " + describe() +
                                          ": bind called on a built layer; a layer is built or bound once");
        if (name_.empty()) name_ = default_name();
        output_shape_ = do_bind(input_shape, std::move(weights));
        input_shape_ = input_shape;
        built_ = true;
        return output_shape_;
    }

    /// @brief Creates the weights for inputs of `input_shape` (batch axis excluded), drawing initial
    /// values from `rng`; returns the output shape (batch axis excluded).
    /// @pre the strategy that should hold the variables has its scope active on this thread.
    /// @throws FailedPreconditionError when built already; InvalidArgumentError when the layer cannot
    /// take inputs of that shape.
    Shape build(const Shape& input_shape, std::mt19937& rng) {
        if (built_)
            throw FailedPreconditionError("pss: " + describe() +
                                          ": build called twice; a layer's variables are created once");
        if (name_.empty()) name_ = default_name();
        output_shape_ = do_build(input_shape, rng);
        input_shape_ = input_shape;
        built_ = true;
        return output_shape_;
    }
    /// @pre built()
    [[nodiscard]] const Shape& input_shape() const {
        require_built("input_shape");
        return input_shape_;
    }
    /// @pre built()
    [[nodiscard]] const Shape& output_shape() const {
        require_built("output_shape");
        return output_shape_;
    }

    /// @brief Checks a whole data set before any step runs (shapes, then check_input_values), so that a
    /// bad input fails on the coordinator, not in a closure on a worker.
    /// @throws InvalidArgumentError naming the layer, the shape expected and the shape given.
    void check_inputs(const xt::xarray<float>& inputs) const {
        require_built("check_inputs");
        const Shape got(inputs.shape().begin(), inputs.shape().end());
        const bool fits = got.size() == input_shape_.size() + 1 && std::equal(input_shape_.begin(), input_shape_.end(), got.begin() + 1);
        if (!fits) {
            Shape expected = input_shape_;
            expected.insert(expected.begin(), got.empty() ? 0 : got.front());
            throw InvalidArgumentError("pss: " + describe() + ": inputs of shape " + format_shape(got) +
                                       ", but the layer was built for inputs of shape (batch, ...) = " +
                                       format_shape(expected));
        }
        check_input_values(inputs);
    }

    /// @brief Computes the outputs of a batch (float32 or float64), pulling the weights; keeps what
    /// backward needs (taking `inputs` by value, it keeps them without a copy when they are moved in).
    /// @param step in synchronous training the step of this pull (1, 2, ...), else 0
    [[nodiscard]] virtual Tensor forward(Tensor inputs, std::uint64_t step = 0) = 0;
    /// @brief The gradients of the batch last given to forward, from the gradient of its outputs.
    [[nodiscard]] virtual LayerGradients backward(const Tensor& grad_outputs) = 0;

    /// @brief The layer's variables (Keras' `layer.weights`): Dense gives {kernel, bias}.
    [[nodiscard]] virtual std::vector<Variable> weights() const { return {}; }

    /// @brief The penalty of the layer's regularizers on the weights the last forward pulled (Keras'
    /// `layer.losses`): the model adds it to the loss. backward adds its gradient to the weights'.
    [[nodiscard]] virtual double regularization_loss() const { return 0; }

    /// @brief The weights' current values (Keras' `get_weights()`), in the order of weights().
    [[nodiscard]] std::vector<Tensor> get_weights() const { return detail::read_weights(weights()); }

    /// @brief Assigns every weight (Keras' `set_weights()`), converting each array to its variable's dtype.
    /// @throws InvalidArgumentError when the count or a shape differs, before any weight changes:
    /// `pss: Dense 'dense': set_weights: weight 0 ('dense/kernel:0') has shape (1, 1), got (2, 1)`
    void set_weights(const std::vector<Tensor>& values) {
        detail::assign_weights(weights(), values, describe() + ": set_weights", "layer");
    }

protected:
    Layer() = default;
    Layer(const Layer&) = default;
    Layer& operator=(const Layer&) = default;

    /// @brief Creates the variables; returns the output shape. Called once, with name() set.
    virtual Shape do_build(const Shape& input_shape, std::mt19937& rng) = 0;
    /// @brief Takes `weights` (checked with check_bind_weights) where do_build creates variables; returns
    /// the output shape. Called once, with name() set. The default throws: a class that can be rebuilt
    /// by a worker process overrides it.
    virtual Shape do_bind(const Shape& /*input_shape*/, std::vector<Variable> /*weights*/) {
        throw FailedPreconditionError("pss: " + describe() +
                                      ": bind is not implemented by this class; override do_bind() to let a layer "
                                      "take existing variables");
    }

    /// What do_build would create for one weight: for bind's checks.
    struct WeightSpec {
        std::string_view what;  ///< "kernel"
        Shape shape;
        DType dtype;
    };
    /// @throws InvalidArgumentError unless `weights` are non-empty handles matching `specs` one to one
    /// in shape and dtype.
    void check_bind_weights(const std::vector<Variable>& weights, const std::vector<WeightSpec>& specs) const {
        auto list = [&] {
            std::string out;
            for (std::size_t i = 0; i < specs.size(); ++i)
                out += (i == 0 ? "" : ", ") + std::string(specs[i].what) + " " + format_shape(specs[i].shape) + " " +
                       std::string(dtype_name(specs[i].dtype));
            return specs.empty() ? std::string("none") : out;
        };
        if (weights.size() != specs.size())
            throw InvalidArgumentError("pss: " + describe() + ": bind got " + std::to_string(weights.size()) +
                                       " variables, but the layer has " + std::to_string(specs.size()) +
                                       " weights (" + list() + "), in the order of weights()");
        for (std::size_t i = 0; i < specs.size(); ++i) {
            const std::string which = "bind: weight " + std::to_string(i) + " (" + std::string(specs[i].what) + ")";
            if (!weights[i])
                throw InvalidArgumentError("pss: " + describe() + ": " + which +
                                           " is an empty Variable handle; give the variables of weights()");
            if (weights[i].shape() != specs[i].shape)
                throw InvalidArgumentError("pss: " + describe() + ": " + which + " is '" + weights[i].name() +
                                           "' of shape " + format_shape(weights[i].shape()) +
                                           ", but the layer needs " + format_shape(specs[i].shape));
            if (weights[i].dtype() != specs[i].dtype)
                throw InvalidArgumentError("pss: " + describe() + ": " + which + " is '" + weights[i].name() +
                                           "' of dtype " + std::string(dtype_name(weights[i].dtype())) +
                                           ", but the layer's dtype is " + std::string(dtype_name(specs[i].dtype)));
        }
    }

    /// @brief Rejects input values the layer cannot take (Embedding: ids that are not row numbers).
    virtual void check_input_values(const xt::xarray<float>& /*inputs*/) const {}

    /// @brief The output shape for a list of input shapes (the functional API's call): one shape gives
    /// compute_output_shape; a layer that takes a list (Merge) overrides this.
    [[nodiscard]] virtual Shape output_shape_of(const std::vector<Shape>& input_shapes) const {
        if (input_shapes.size() != 1)
            throw InvalidArgumentError("pss: " + describe() + " takes one input, but it was called on a list of " +
                                       std::to_string(input_shapes.size()) +
                                       " (join them first with Concatenate or Add)");
        return compute_output_shape(input_shapes.front());
    }

    /// @brief Marks the layer built for `input_shape` with `output_shape`: for a class whose build is not
    /// Layer::build (a Merge's, over a list of shapes). Names the layer first, as build does.
    void mark_built(Shape input_shape, Shape output_shape) {
        if (built_)
            throw FailedPreconditionError("pss: " + describe() + ": built twice; a layer is built or bound once");
        if (name_.empty()) name_ = default_name();
        input_shape_ = std::move(input_shape);
        output_shape_ = std::move(output_shape);
        built_ = true;
    }

    /// "Dense 'dense_1'", for messages.
    [[nodiscard]] std::string describe() const {
        return std::string(class_name()) + (name_.empty() ? std::string() : " '" + name_ + "'");
    }
    void require_built(const char* what) const {
        if (!built_)
            throw FailedPreconditionError("pss: " + describe() + ": " + what +
                                          " before build; a layer is built by its model's build, fit, evaluate "
                                          "or predict, or by build(input_shape, rng)");
    }
    /// Keras' default name of the layer: its class name in snake_case.
    [[nodiscard]] std::string default_name() const { return detail::snake_case(class_name()); }

private:
    PSS_INLINE KerasTensor call(const std::vector<KerasTensor>& inputs) const;

    std::string name_;
    Shape input_shape_;
    Shape output_shape_;
    bool built_ = false;
    // Shared by the nodes this object made when called on symbolic tensors: how Model finds one layer
    // object called twice. Made at the first call, so copies made before it are other layers.
    mutable std::shared_ptr<const int> call_identity_;
};

namespace detail {

/// Applies `activation` in place to `z`, rows of `units` values (softmax works per row).
template <class T>
void activate(ActivationFunction activation, xt::xarray<T>& z, std::size_t units) {
    switch (activation) {
        case ActivationFunction::linear: return;
        case ActivationFunction::relu: xt::noalias(z) = xt::maximum(z, T{0}); return;
        case ActivationFunction::sigmoid: xt::noalias(z) = T{1} / (T{1} + xt::exp(-z)); return;
        case ActivationFunction::tanh: xt::noalias(z) = xt::tanh(z); return;
        case ActivationFunction::softmax: {
            T* p = z.data();
            for (std::size_t r = 0; r < z.size(); r += units) {
                T top = p[r];
                for (std::size_t j = 1; j < units; ++j) top = std::max(top, p[r + j]);
                T sum = 0;
                for (std::size_t j = 0; j < units; ++j) sum += (p[r + j] = std::exp(p[r + j] - top));
                for (std::size_t j = 0; j < units; ++j) p[r + j] /= sum;
            }
            return;
        }
    }
}

/// The gradient with respect to the pre-activation z, from the activation's output `y` and the gradient
/// `g` of y (same shape, rows of `units`).
template <class T>
xt::xarray<T> activation_gradient(ActivationFunction activation, const xt::xarray<T>& y, const xt::xarray<T>& g,
                                  std::size_t units) {
    switch (activation) {
        case ActivationFunction::linear: return g;
        case ActivationFunction::relu: return xt::where(y > T{0}, g, T{0});
        case ActivationFunction::sigmoid: return g * y * (T{1} - y);
        case ActivationFunction::tanh: return g * (T{1} - y * y);
        case ActivationFunction::softmax: break;
    }
    xt::xarray<T> out = xt::xarray<T>::from_shape(g.shape());
    const T* py = y.data();
    const T* pg = g.data();
    T* po = out.data();
    for (std::size_t r = 0; r < g.size(); r += units) {
        T dot = 0;
        for (std::size_t j = 0; j < units; ++j) dot += pg[r + j] * py[r + j];
        for (std::size_t j = 0; j < units; ++j) po[r + j] = py[r + j] * (pg[r + j] - dot);
    }
    return out;
}

inline void check_grad_shape(const Tensor& grad, const Shape& expected, const std::string& layer) {
    const Shape got = grad.shape();
    if (got != expected)
        throw InvalidArgumentError("pss: " + layer + ": backward got a gradient of shape " + format_shape(got) +
                                   ", but the last forward returned shape " + format_shape(expected));
}

}  // namespace detail

/// @brief Keras' `tf.keras.regularizers.L2(l2=0.01)`: the penalty `l2 * sum(w^2)` of a weight, added to
/// the loss, and its gradient `2 * l2 * w`, added to the weight's gradient.
///
/// In synchronous training each worker pushes its slice's share of the loss gradient plus the whole
/// penalty gradient; the ps averages the workers' pushes, so a step applies the batch's gradient plus the
/// penalty's once, as Keras does on one device.
class L2 {
public:
    /// @throws InvalidArgumentError `pss: L2: l2 is -1.0; it is a finite number >= 0 (Keras' default 0.01)`
    explicit L2(double l2 = 0.01) : l2_(l2) {
        if (auto problem = l2_problem(l2)) throw InvalidArgumentError("pss: L2: " + *problem);
    }
    [[nodiscard]] double l2() const noexcept { return l2_; }
    [[nodiscard]] static constexpr std::string_view class_name() noexcept { return "L2"; }
    /// @brief `{"l2": 0.01}`
    [[nodiscard]] nlohmann::json get_config() const { return {{"l2", l2_}}; }
    /// @brief `l2 * sum(w^2)`, summed in double.
    template <class T>
    [[nodiscard]] double operator()(const xt::xarray<T>& w) const {
        double sum = 0;
        for (const T v : w) sum += static_cast<double>(v) * static_cast<double>(v);
        return l2_ * sum;
    }
    /// What is wrong with a factor, if anything (for the constructor and the config parser).
    [[nodiscard]] static std::optional<std::string> l2_problem(double l2) {
        if (std::isfinite(l2) && l2 >= 0) return std::nullopt;
        return "l2 is " + detail::number_text(l2) + "; it is a finite number >= 0 (Keras' default 0.01)";
    }

private:
    double l2_;
};

/// @brief Dense's arguments by name, in Keras' order: `pss::Dense(16, {.activation = "relu",
/// .kernel_initializer = "he_normal", .kernel_regularizer = pss::L2(1e-4)})`.
struct DenseOptions {
    std::string activation = "linear";  ///< Keras' name: "linear", "relu", "sigmoid", "tanh" or "softmax"
    bool use_bias = true;
    AnyInitializer kernel_initializer = "glorot_uniform";
    AnyInitializer bias_initializer = "zeros";
    std::optional<L2> kernel_regularizer{};  ///< none by default, as Keras
    DType dtype = DType::float32;           ///< float32 (Keras') or float64
};

/// @brief A densely connected layer, Keras' `Dense(units, activation, use_bias, kernel_initializer,
/// bias_initializer, kernel_regularizer)`: `outputs = activation(inputs · kernel + bias)` over the last
/// axis of the inputs.
///
/// The kernel, shape (input features, units), starts as its initializer draws it, Glorot-uniform by
/// default: U(-l, l) with l = sqrt(6 / (fan_in + units)), drawn row by row from the model's generator (see
/// detail::uniform); the bias, shape (units,), starts at zero by default. Its variables are
/// `<name>/kernel` and `<name>/bias`. An L2 kernel regularizer adds `l2 * sum(kernel^2)` to the loss (see
/// regularization_loss) and `2 * l2 * kernel` to the kernel's gradient.
///
/// @par Example
/// @code
/// pss::Sequential model(strategy, {pss::Dense(16, "relu"), pss::Dense(1)});
/// pss::Dense hidden(16, {.activation = "relu", .kernel_initializer = "he_normal", .kernel_regularizer = pss::L2(1e-4)});
/// @endcode
class Dense final : public Layer {
public:
    /// @param units output features, at least 1
    /// @param activation Keras' name: "linear" (the default), "relu", "sigmoid", "tanh" or "softmax"
    /// @param use_bias whether to add a bias vector
    /// @param dtype the variables' dtype: float32 (the default, Keras') or float64
    /// @throws InvalidArgumentError for 0 units, an unknown activation or an integer dtype.
    explicit Dense(std::size_t units, std::string_view activation = "linear", bool use_bias = true,
                   DType dtype = DType::float32)
        : Dense(units, activation_from_name(activation), use_bias, dtype) {}
    Dense(std::size_t units, ActivationFunction activation, bool use_bias = true, DType dtype = DType::float32)
        : Dense(units, activation, use_bias, "glorot_uniform", "zeros", std::nullopt, dtype) {}
    /// @brief Keras' arguments by name (see DenseOptions).
    /// @throws InvalidArgumentError as the other constructors.
    Dense(std::size_t units, DenseOptions options)
        : Dense(units, activation_from_name(options.activation), options.use_bias, std::move(options.kernel_initializer),
                std::move(options.bias_initializer), options.kernel_regularizer, options.dtype) {}

    [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<Dense>(*this); }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function

    [[nodiscard]] std::size_t units() const noexcept { return units_; }
    [[nodiscard]] ActivationFunction activation() const noexcept { return activation_; }
    [[nodiscard]] bool use_bias() const noexcept { return use_bias_; }
    [[nodiscard]] DType dtype() const noexcept { return dtype_; }
    [[nodiscard]] const AnyInitializer& kernel_initializer() const noexcept { return kernel_initializer_; }
    [[nodiscard]] const AnyInitializer& bias_initializer() const noexcept { return bias_initializer_; }
    [[nodiscard]] const std::optional<L2>& kernel_regularizer() const noexcept { return kernel_regularizer_; }
    /// @pre built()
    [[nodiscard]] const Variable& kernel() const {
        require_built("kernel");
        return kernel_;
    }
    /// @pre built() and use_bias()
    [[nodiscard]] const Variable& bias() const {
        require_built("bias");
        return bias_;
    }

    [[nodiscard]] std::vector<Variable> weights() const override {
        if (!built()) return {};
        if (use_bias_) return {kernel_, bias_};
        return {kernel_};
    }
    /// @brief The input shape with its last axis `units`.
    [[nodiscard]] Shape compute_output_shape(const Shape& input_shape) const override {
        return output_shape_for(input_shape);
    }

    PSS_INLINE Tensor forward(Tensor inputs, std::uint64_t step = 0) override;

    PSS_INLINE LayerGradients backward(const Tensor& grad_outputs) override;

    /// @brief The kernel regularizer's penalty on the kernel the last forward pulled; 0 without one.
    [[nodiscard]] double regularization_loss() const override {
        if (!kernel_regularizer_) return 0;
        if (dtype_ == DType::float64) return (*kernel_regularizer_)(f64_.w);
        return (*kernel_regularizer_)(f32_.w);
    }

    /// @brief `{"activation": "relu", "batch_input_shape": [null, 3], "bias_initializer": {"class_name":
    /// "Zeros", "config": {}}, "dtype": "float32", "kernel_initializer": {"class_name": "GlorotUniform",
    /// "config": {"seed": null}}, "kernel_regularizer": null, "name": "dense", "units": 4, "use_bias": true}`
    /// (a regularizer is `{"class_name": "L2", "config": {"l2": 0.01}}`, as Keras serializes it)
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Layer::get_config();
        config["units"] = units_;
        config["activation"] = std::string(activation_name(activation_));
        config["use_bias"] = use_bias_;
        config["kernel_initializer"] = initializers::serialize(kernel_initializer_.get());
        config["bias_initializer"] = initializers::serialize(bias_initializer_.get());
        config["kernel_regularizer"] =
            kernel_regularizer_ ? nlohmann::json{{"class_name", std::string(L2::class_name())},
                                                 {"config", kernel_regularizer_->get_config()}}
                                : nlohmann::json(nullptr);
        config["dtype"] = std::string(dtype_name(dtype_));
        return config;
    }

protected:
    Shape do_build(const Shape& input_shape, std::mt19937& rng) override {
        Shape out = output_shape_for(input_shape);
        kernel_ = Variable(kernel_initializer_(Shape{input_shape.back(), units_}, dtype_, rng), name() + "/kernel");
        if (use_bias_) bias_ = Variable(bias_initializer_(Shape{units_}, dtype_, rng), name() + "/bias");
        return out;
    }

    Shape do_bind(const Shape& input_shape, std::vector<Variable> weights) override {
        Shape out = output_shape_for(input_shape);
        std::vector<WeightSpec> specs{{"kernel", {input_shape.back(), units_}, dtype_}};
        if (use_bias_) specs.push_back({"bias", {units_}, dtype_});
        check_bind_weights(weights, specs);
        kernel_ = std::move(weights[0]);
        if (use_bias_) bias_ = std::move(weights[1]);
        return out;
    }

private:
    Dense(std::size_t units, ActivationFunction activation, bool use_bias, AnyInitializer kernel_initializer,
          AnyInitializer bias_initializer, std::optional<L2> kernel_regularizer, DType dtype)
        : units_(units), activation_(activation), use_bias_(use_bias),
          kernel_initializer_(std::move(kernel_initializer)), bias_initializer_(std::move(bias_initializer)),
          kernel_regularizer_(kernel_regularizer), dtype_(dtype) {
        if (units == 0) throw InvalidArgumentError("pss: Dense: units is 0; a Dense layer needs at least 1 output unit");
        detail::check_float_dtype(dtype, "Dense");
    }

    Shape output_shape_for(const Shape& input_shape) const {
        if (input_shape.empty() || input_shape.back() == 0)
            throw InvalidArgumentError("pss: " + describe() + ": input shape " + format_shape(input_shape) +
                                       "; a Dense layer needs inputs with a last axis of at least 1 feature");
        Shape out = input_shape;
        out.back() = units_;
        return out;
    }

    std::size_t inputs_features() const { return input_shape().back(); }

    /// One step's state in the layer's dtype: the pulled weights, the inputs and the outputs.
    template <class T>
    struct State {
        xt::xarray<T> w, b, x, y;
    };
    template <class T>
    State<T>& state() {
        if constexpr (std::is_same_v<T, float>) return f32_;
        else return f64_;
    }

    template <class T>
    xt::xarray<T> forward_as(Tensor&& inputs, std::uint64_t step) {
        State<T>& s = state<T>();
        s.x = detail::take_as<T>(std::move(inputs));
        kernel_.read_into(s.w, step);  // into the buffer of the last step: no fresh pages
        if (use_bias_) bias_.read_into(s.b, step);
        const std::size_t in = inputs_features();
        const std::size_t rows = s.x.size() / in;
        Shape out_shape(s.x.shape().begin(), s.x.shape().end());
        out_shape.back() = units_;
        xt::xarray<T> out = xt::xarray<T>::from_shape(out_shape);
        const T* x = s.x.data();
        const T* w = s.w.data();
        T* y = out.data();
        for (std::size_t r = 0; r < rows; ++r) {
            T* yr = y + r * units_;
            for (std::size_t j = 0; j < units_; ++j) yr[j] = use_bias_ ? s.b.data()[j] : T{0};
            for (std::size_t i = 0; i < in; ++i) {
                const T xi = x[r * in + i];
                const T* wi = w + i * units_;
                for (std::size_t j = 0; j < units_; ++j) yr[j] += xi * wi[j];
            }
        }
        detail::activate(activation_, out, units_);
        s.y = out;
        return out;
    }

    template <class T>
    LayerGradients backward_as(const Tensor& grad_outputs) {
        State<T>& s = state<T>();
        const std::size_t in = inputs_features();
        const std::size_t rows = s.x.size() / in;
        const xt::xarray<T> gz = detail::activation_gradient(
            activation_, s.y, detail::take_as<T>(Tensor(grad_outputs)), units_);
        xt::xarray<T> gx = xt::xarray<T>::from_shape(s.x.shape());
        xt::xarray<T> gw = xt::zeros<T>({in, units_});
        xt::xarray<T> gb = xt::zeros<T>({units_});
        const T* x = s.x.data();
        const T* w = s.w.data();
        const T* g = gz.data();
        for (std::size_t r = 0; r < rows; ++r) {
            const T* gr = g + r * units_;
            for (std::size_t i = 0; i < in; ++i) {
                const T xi = x[r * in + i];
                const T* wi = w + i * units_;
                T* gwi = gw.data() + i * units_;
                T sum = 0;
                for (std::size_t j = 0; j < units_; ++j) {
                    gwi[j] += xi * gr[j];
                    sum += gr[j] * wi[j];
                }
                gx.data()[r * in + i] = sum;
            }
            for (std::size_t j = 0; j < units_; ++j) gb.data()[j] += gr[j];
        }
        if (kernel_regularizer_) {  // unscaled, also on an empty slice: see L2
            const T factor = static_cast<T>(2 * kernel_regularizer_->l2());
            for (std::size_t i = 0; i < gw.size(); ++i) gw.data()[i] += factor * w[i];
        }
        LayerGradients out;
        out.inputs = Tensor(std::move(gx));
        out.variables.push_back({kernel_, Tensor(std::move(gw)), {}, false});
        if (use_bias_) out.variables.push_back({bias_, Tensor(std::move(gb)), {}, false});
        return out;
    }

    std::size_t units_;
    ActivationFunction activation_;
    bool use_bias_;
    AnyInitializer kernel_initializer_, bias_initializer_;
    std::optional<L2> kernel_regularizer_;
    DType dtype_;
    Variable kernel_, bias_;
    // Per step, in the layer's dtype.
    State<float> f32_;
    State<double> f64_;
};

#if PSS_DEFINITIONS
PSS_INLINE std::string_view Dense::class_name() const noexcept { return "Dense"; }

PSS_INLINE Tensor Dense::forward(Tensor inputs, std::uint64_t step) {
    require_built("forward");
    const std::size_t in = inputs_features();
    if (inputs.rank() < 2 || inputs.shape().back() != in)
        throw InvalidArgumentError("pss: " + describe() + ": inputs of shape " + format_shape(inputs.shape()) +
                                   ", but the layer takes (batch, ..., " + std::to_string(in) + ")");
    return detail::with_float_type(dtype_, [&]<class T>(std::type_identity<T>) {
        return Tensor(forward_as<T>(std::move(inputs), step));
    });
}

PSS_INLINE LayerGradients Dense::backward(const Tensor& grad_outputs) {
    require_built("backward");
    return detail::with_float_type(dtype_, [&]<class T>(std::type_identity<T>) {
        detail::check_grad_shape(grad_outputs, Shape(state<T>().y.shape().begin(), state<T>().y.shape().end()),
                                 describe());
        return backward_as<T>(grad_outputs);
    });
}
#endif

/// @brief Embedding's arguments after input_dim and output_dim, by name.
struct EmbeddingOptions {
    AnyInitializer embeddings_initializer = "uniform";  ///< Keras' default: RandomUniform(-0.05, 0.05)
    DType dtype = DType::float32;                        ///< float32 (Keras') or float64
};

/// @brief A lookup table of `input_dim` rows of `output_dim` values (Keras' `Embedding(input_dim,
/// output_dim)`): each input id becomes its row.
///
/// The table, `<name>/embeddings` of shape (input_dim, output_dim), is split into shards as the
/// strategy's partitioner decides, and starts as its initializer draws it: U(-0.05, 0.05) by default
/// (Keras' "uniform", initializers::RandomUniform), drawn in the table's dtype by each ps task for its
/// own shards (the initializer's spec(), see pss::InitializerSpec), so the coordinator never holds the
/// table. An initializer without a seed draws with one made from the model's generator (read, not
/// consumed: the other layers' weights are as they would be without the table) and the variable's
/// name; a user's initializer that has no spec() is drawn on the coordinator. A step
/// pulls only the rows of the ids in its batch (Variable::sparse_read, each distinct id once) and pushes
/// a sparse gradient (Variable::apply_sparse_gradient: one row per input id, repeated ids included; the
/// parameter server sums them), so a worker never moves the whole table.
///
/// Inputs: ids stored as floats (the model's data is `xt::xarray<float>`, exact for ids below 2^24),
/// any shape (batch, ...); outputs have shape (batch, ..., output_dim). A value that is not an integer
/// in [0, input_dim) is rejected before training starts. The ids are not differentiable: backward's
/// input gradient is zero. Follow it with GlobalAveragePooling1D (mean over the ids of an example) or
/// Flatten (concatenation) before a Dense layer.
///
/// In synchronous training every push must follow a pull of the same step on each shard (the
/// parameter server rejects a push for a step whose predecessor is not applied), so a synchronous
/// step also pulls the first row of each shard its batch does not touch.
class Embedding final : public Layer {
public:
    /// @throws InvalidArgumentError when input_dim or output_dim is 0, or dtype is an integer dtype.
    Embedding(std::size_t input_dim, std::size_t output_dim, DType dtype = DType::float32)
        : Embedding(input_dim, output_dim, EmbeddingOptions{.dtype = dtype}) {}
    /// @brief Keras' other arguments by name: `pss::Embedding(1000, 8, {.embeddings_initializer = "zeros"})`.
    /// @throws InvalidArgumentError as the other constructor.
    Embedding(std::size_t input_dim, std::size_t output_dim, EmbeddingOptions options)
        : input_dim_(input_dim), output_dim_(output_dim),
          embeddings_initializer_(std::move(options.embeddings_initializer)), dtype_(options.dtype) {
        if (input_dim == 0 || output_dim == 0)
            throw InvalidArgumentError("pss: Embedding: input_dim is " + std::to_string(input_dim) +
                                       " and output_dim is " + std::to_string(output_dim) +
                                       "; both must be at least 1 (input_dim: the number of ids, output_dim: the "
                                       "length of each row)");
        detail::check_float_dtype(dtype_, "Embedding");
    }

    [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<Embedding>(*this); }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function

    [[nodiscard]] std::size_t input_dim() const noexcept { return input_dim_; }
    [[nodiscard]] std::size_t output_dim() const noexcept { return output_dim_; }
    [[nodiscard]] DType dtype() const noexcept { return dtype_; }
    [[nodiscard]] const AnyInitializer& embeddings_initializer() const noexcept { return embeddings_initializer_; }
    /// @pre built()
    [[nodiscard]] const Variable& embeddings() const {
        require_built("embeddings");
        return embeddings_;
    }
    [[nodiscard]] std::vector<Variable> weights() const override {
        if (!built()) return {};
        return {embeddings_};
    }
    /// @brief The input shape with one more axis, `output_dim`.
    [[nodiscard]] Shape compute_output_shape(const Shape& input_shape) const override {
        Shape out = input_shape;
        out.push_back(output_dim_);
        return out;
    }

    PSS_INLINE Tensor forward(Tensor inputs, std::uint64_t step = 0) override;

    PSS_INLINE LayerGradients backward(const Tensor& grad_outputs) override;

    /// @brief `{"batch_input_shape": [null, 3], "dtype": "float32", "embeddings_initializer": {"class_name":
    /// "RandomUniform", "config": {"maxval": 0.05, "minval": -0.05, "seed": null}}, "input_dim": 5, "name":
    /// "embedding", "output_dim": 4}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Layer::get_config();
        config["input_dim"] = input_dim_;
        config["output_dim"] = output_dim_;
        config["embeddings_initializer"] = initializers::serialize(embeddings_initializer_.get());
        config["dtype"] = std::string(dtype_name(dtype_));
        return config;
    }

protected:
    Shape do_build(const Shape& input_shape, std::mt19937& rng) override {
        // The table can be larger than the coordinator's memory: each ps task draws its shards.
        const Shape shape{input_dim_, output_dim_};
        std::string variable = name() + "/embeddings";
        if (auto spec = embeddings_initializer_->spec(shape, detail::variable_seed(rng, variable)))
            embeddings_ = Variable(shape, dtype_, *spec, std::move(variable));
        else
            embeddings_ = Variable(embeddings_initializer_(shape, dtype_, rng), std::move(variable));
        return compute_output_shape(input_shape);
    }

    Shape do_bind(const Shape& input_shape, std::vector<Variable> weights) override {
        check_bind_weights(weights, {{"embeddings", {input_dim_, output_dim_}, dtype_}});
        embeddings_ = std::move(weights[0]);
        return compute_output_shape(input_shape);
    }

    void check_input_values(const xt::xarray<float>& inputs) const override { check_ids(inputs); }

private:
    template <class T>
    void check_ids(const xt::xarray<T>& inputs) const {
        const T* p = inputs.data();
        for (std::size_t i = 0; i < inputs.size(); ++i)
            if (!(p[i] >= 0 && static_cast<double>(p[i]) < static_cast<double>(input_dim_)) || p[i] != std::floor(p[i]))
                throw InvalidArgumentError("pss: " + describe() + ": input " + std::to_string(i) + " (in row-major order) is " +
                                           std::to_string(p[i]) + ", not an id; an Embedding takes integer ids in [0, " +
                                           std::to_string(input_dim_) + ") stored as floats");
    }

    std::size_t input_dim_;
    std::size_t output_dim_;
    AnyInitializer embeddings_initializer_;
    DType dtype_;
    Variable embeddings_;
    // Per step: the ids of the batch and its input shape.
    std::vector<std::int64_t> ids_;
    Shape input_shape_seen_;
};

#if PSS_DEFINITIONS
PSS_INLINE std::string_view Embedding::class_name() const noexcept { return "Embedding"; }

PSS_INLINE Tensor Embedding::forward(Tensor inputs, std::uint64_t step) {
    require_built("forward");
    if (!inputs.has_value() || (inputs.dtype() != DType::float32 && inputs.dtype() != DType::float64))
        throw InvalidArgumentError("pss: " + describe() + ": inputs of dtype " +
                                   (inputs.has_value() ? std::string(dtype_name(inputs.dtype())) : "none") +
                                   "; an Embedding takes ids stored as float32 or float64");
    detail::with_float_type(inputs.dtype(), [&]<class T>(std::type_identity<T>) {
        const xt::xarray<T>& ids = inputs.get<T>();
        check_ids(ids);
        ids_.resize(ids.size());
        std::transform(ids.begin(), ids.end(), ids_.begin(), [](T v) { return static_cast<std::int64_t>(v); });
    });
    // Each distinct id is pulled once; slot_of[i] is the row of ids_[i] in what comes back.
    std::vector<std::int64_t> unique;
    std::vector<std::size_t> slot_of(ids_.size());
    std::unordered_map<std::int64_t, std::size_t> slot;
    for (std::size_t i = 0; i < ids_.size(); ++i) {
        auto [it, fresh] = slot.emplace(ids_[i], unique.size());
        if (fresh) unique.push_back(ids_[i]);
        slot_of[i] = it->second;
    }
    if (step != 0 && embeddings_.info_ptr()->channel->synchronous()) {  // touch every shard (see the class description)
        const std::size_t shards = embeddings_.num_shards();
        std::vector<bool> touched(shards, false);
        for (std::int64_t id : unique) touched[embeddings_.shard_of_row(static_cast<std::size_t>(id)).shard] = true;
        for (std::size_t s = 0; s < shards; ++s)
            if (!touched[s]) unique.push_back(static_cast<std::int64_t>(shard_row_offset(input_dim_, shards, s)));
    }
    input_shape_seen_ = inputs.shape();
    Shape out_shape = input_shape_seen_;
    out_shape.push_back(output_dim_);
    return detail::with_float_type(dtype_, [&]<class T>(std::type_identity<T>) {
        const Tensor pulled = unique.empty() ? Tensor(xt::xarray<T>(xt::zeros<T>({std::size_t{0}, output_dim_})))
                                             : embeddings_.sparse_read(std::span<const std::int64_t>(unique), step);
        const xt::xarray<T>& rows = pulled.get<T>();
        xt::xarray<T> out = xt::xarray<T>::from_shape(out_shape);
        for (std::size_t i = 0; i < ids_.size(); ++i)
            std::copy_n(rows.data() + slot_of[i] * output_dim_, output_dim_, out.data() + i * output_dim_);
        return Tensor(std::move(out));
    });
}

PSS_INLINE LayerGradients Embedding::backward(const Tensor& grad_outputs) {
    require_built("backward");
    Shape expected = input_shape_seen_;
    expected.push_back(output_dim_);
    detail::check_grad_shape(grad_outputs, expected, describe());
    return detail::with_float_type(dtype_, [&]<class T>(std::type_identity<T>) {
        LayerGradients out;
        out.inputs = Tensor(xt::xarray<T>(xt::zeros<T>(input_shape_seen_)));
        xt::xarray<T> rows = detail::take_as<T>(Tensor(grad_outputs));
        rows.reshape({ids_.size(), output_dim_});
        out.variables.push_back({embeddings_, Tensor(std::move(rows)), ids_, true});
        return out;
    });
}
#endif

/// @brief The mean over axis 1 (Keras' `GlobalAveragePooling1D`): (batch, steps, features) to
/// (batch, features). After an Embedding it averages the rows of an example's ids.
class GlobalAveragePooling1D final : public Layer {
public:
    GlobalAveragePooling1D() = default;
    [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<GlobalAveragePooling1D>(*this); }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function

    PSS_INLINE Tensor forward(Tensor inputs, std::uint64_t /*step*/ = 0) override;

    PSS_INLINE LayerGradients backward(const Tensor& grad_outputs) override;

    /// @brief (steps, features) to (features).
    [[nodiscard]] Shape compute_output_shape(const Shape& input_shape) const override {
        return output_shape_for(input_shape);
    }

protected:
    Shape do_build(const Shape& input_shape, std::mt19937& /*rng*/) override { return output_shape_for(input_shape); }
    Shape do_bind(const Shape& input_shape, std::vector<Variable> weights) override {
        check_bind_weights(weights, {});
        return output_shape_for(input_shape);
    }

private:
    Shape output_shape_for(const Shape& input_shape) const {
        if (input_shape.size() != 2)
            throw InvalidArgumentError("pss: " + describe() + ": input shape " + format_shape(input_shape) +
                                       "; it takes inputs of shape (batch, steps, features), so an input shape of "
                                       "rank 2 (steps, features)");
        return {input_shape[1]};
    }

    std::size_t batch_ = 0, steps_ = 0, features_ = 0;
    DType dtype_ = DType::float32;  // the last inputs'
};

#if PSS_DEFINITIONS
PSS_INLINE std::string_view GlobalAveragePooling1D::class_name() const noexcept { return "GlobalAveragePooling1D"; }

PSS_INLINE Tensor GlobalAveragePooling1D::forward(Tensor inputs, std::uint64_t /*step*/) {
    require_built("forward");
    if (inputs.rank() != 3)
        throw InvalidArgumentError("pss: " + describe() + ": inputs of shape " + format_shape(inputs.shape()) +
                                   "; it takes (batch, steps, features)");
    const Shape shape = inputs.shape();
    batch_ = shape[0];
    steps_ = shape[1];
    features_ = shape[2];
    dtype_ = inputs.dtype();
    return detail::with_float_type(dtype_, [&]<class T>(std::type_identity<T>) {
        const xt::xarray<T> x = detail::take_as<T>(std::move(inputs));
        if (steps_ == 0) return Tensor(xt::xarray<T>(xt::zeros<T>({batch_, features_})));
        return Tensor(xt::xarray<T>(xt::mean<T>(x, {1})));
    });
}

PSS_INLINE LayerGradients GlobalAveragePooling1D::backward(const Tensor& grad_outputs) {
    require_built("backward");
    detail::check_grad_shape(grad_outputs, Shape{batch_, features_}, describe());
    return detail::with_float_type(dtype_, [&]<class T>(std::type_identity<T>) {
        const xt::xarray<T> g = detail::take_as<T>(Tensor(grad_outputs));
        const T scale = steps_ == 0 ? T{0} : T{1} / static_cast<T>(steps_);
        LayerGradients out;
        out.inputs = Tensor(xt::xarray<T>(
            xt::broadcast(xt::view(g, xt::all(), xt::newaxis(), xt::all()) * scale, {batch_, steps_, features_})));
        return out;
    });
}
#endif

/// @brief Keras' `Dropout(rate, seed)`: in a training step each input value is dropped (set to 0) with
/// probability `rate` and the others are scaled by 1 / (1 - rate), so the expected output is the input;
/// outside training (evaluate, predict) the inputs pass unchanged.
///
/// A training step is a forward with a step number (> 0): Sequential::fit numbers every step, evaluate
/// and predict give 0. Each value's fate is a hash of the layer's seed, the step, the worker and the
/// value's position (splitmix64), not a generator's state: a step dropped again (rerun after a lost
/// worker, or resumed from a backup) drops the same values, every standard library draws the same, and
/// the workers of one synchronous step drop different values. Without a seed the layer takes one from
/// its model's generator when built, so the model's seed fixes it, and the config carries it to workers.
class Dropout final : public Layer {
public:
    /// @param rate the fraction dropped, in [0, 1)
    /// @param seed the masks' seed; by default drawn from the model's generator at build
    /// @throws InvalidArgumentError `pss: Dropout: rate is 1; it is in [0, 1) (the fraction of inputs dropped)`
    explicit Dropout(double rate, std::optional<std::uint64_t> seed = std::nullopt) : rate_(rate), seed_(seed) {
        if (!(rate >= 0 && rate < 1))
            throw InvalidArgumentError("pss: Dropout: rate is " + nlohmann::json(rate).dump() +
                                       "; it is in [0, 1) (the fraction of inputs dropped)");
    }
    [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<Dropout>(*this); }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] double rate() const noexcept { return rate_; }
    /// @brief The seed of the masks: the one given, or (once built) the one drawn.
    [[nodiscard]] std::optional<std::uint64_t> seed() const noexcept { return seed_; }

    PSS_INLINE Tensor forward(Tensor inputs, std::uint64_t step = 0) override;
    PSS_INLINE LayerGradients backward(const Tensor& grad_outputs) override;
    /// @brief The input shape.
    [[nodiscard]] Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }

    /// @brief `{"name": "dropout", "rate": 0.5, "seed": 42}` (the seed once built or given; else null)
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Layer::get_config();
        config["rate"] = rate_;
        config["seed"] = seed_ ? nlohmann::json(*seed_) : nlohmann::json(nullptr);
        return config;
    }

protected:
    Shape do_build(const Shape& input_shape, std::mt19937& rng) override {
        if (!seed_) seed_ = rng();
        return input_shape;
    }
    Shape do_bind(const Shape& input_shape, std::vector<Variable> weights) override {
        check_bind_weights(weights, {});
        if (!seed_) throw InvalidArgumentError("pss: " + describe() + ": bind needs the seed the built layer drew");
        return input_shape;
    }

private:
    /// Keep (true) or drop value `index` of step `step` on `worker`: splitmix64 of the four, as a
    /// uniform in [0, 1), against the rate.
    [[nodiscard]] bool keeps(std::uint64_t step, std::uint64_t worker, std::uint64_t index) const noexcept {
        auto mix = [](std::uint64_t z) {
            z += 0x9e3779b97f4a7c15ULL;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            return z ^ (z >> 31);
        };
        const std::uint64_t h = mix(mix(mix(mix(*seed_) ^ step) ^ worker) ^ index);
        return static_cast<double>(h >> 11) * 0x1.0p-53 >= rate_;
    }

    double rate_;
    std::optional<std::uint64_t> seed_;
    Tensor mask_;  // the last training forward's scale per value (0 or 1 / (1 - rate)); empty: none applied
    Shape seen_;
};

/// @brief Flattens each example (Keras' `Flatten`): (batch, d1, d2, ...) to (batch, d1 * d2 * ...).
class Flatten final : public Layer {
public:
    Flatten() = default;
    [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<Flatten>(*this); }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function

    Tensor forward(Tensor inputs, std::uint64_t /*step*/ = 0) override {
        require_built("forward");
        if (inputs.rank() == 0)
            throw InvalidArgumentError("pss: " + describe() + ": a scalar input; it takes (batch, ...)");
        seen_ = inputs.shape();
        const std::size_t batch = seen_.front();
        const std::size_t width = batch == 0 ? num_elements(output_shape()) : inputs.size() / batch;
        inputs.visit_mut([&](auto& a) { a.reshape({batch, width}); });  // in place: no copy
        return inputs;
    }

    LayerGradients backward(const Tensor& grad_outputs) override {
        require_built("backward");
        if (grad_outputs.size() != num_elements(seen_))
            throw InvalidArgumentError("pss: " + describe() + ": backward got a gradient of " +
                                       std::to_string(grad_outputs.size()) + " values for inputs of shape " +
                                       format_shape(seen_));
        LayerGradients out;
        out.inputs = grad_outputs;
        out.inputs.visit_mut([&](auto& a) { a.reshape(seen_); });
        return out;
    }

    /// @brief One axis of all the input's elements.
    [[nodiscard]] Shape compute_output_shape(const Shape& input_shape) const override {
        return {num_elements(input_shape)};
    }

protected:
    Shape do_build(const Shape& input_shape, std::mt19937& /*rng*/) override { return {num_elements(input_shape)}; }
    Shape do_bind(const Shape& input_shape, std::vector<Variable> weights) override {
        check_bind_weights(weights, {});
        return {num_elements(input_shape)};
    }

private:
    Shape seen_;
};

#if PSS_DEFINITIONS
PSS_INLINE std::string_view Dropout::class_name() const noexcept { return "Dropout"; }

PSS_INLINE Tensor Dropout::forward(Tensor inputs, std::uint64_t step) {
    require_built("forward");
    if (inputs.rank() == 0) throw InvalidArgumentError("pss: " + describe() + ": a scalar input; it takes (batch, ...)");
    seen_ = inputs.shape();
    mask_ = Tensor();
    if (step == 0 || rate_ == 0) return inputs;  // not training: the identity
    const auto worker = static_cast<std::uint64_t>(static_cast<std::int64_t>(worker_index()) + 1);
    return detail::with_float_type(inputs.dtype() == DType::float64 ? DType::float64 : DType::float32,
                                   [&]<class T>(std::type_identity<T>) {
        xt::xarray<T> x = detail::take_as<T>(std::move(inputs));
        xt::xarray<T> mask = xt::xarray<T>::from_shape(x.shape());
        const T scale = static_cast<T>(1.0 / (1.0 - rate_));
        for (std::size_t i = 0; i < x.size(); ++i) {
            mask.data()[i] = keeps(step, worker, i) ? scale : T{0};
            x.data()[i] *= mask.data()[i];
        }
        mask_ = Tensor(std::move(mask));
        return Tensor(std::move(x));
    });
}

PSS_INLINE LayerGradients Dropout::backward(const Tensor& grad_outputs) {
    require_built("backward");
    detail::check_grad_shape(grad_outputs, seen_, describe());
    LayerGradients out;
    if (!mask_.has_value()) {
        out.inputs = grad_outputs;
        return out;
    }
    out.inputs = mask_.visit(
        [&](const auto& mask) {
            using T = typename std::decay_t<decltype(mask)>::value_type;
            return Tensor(xt::xarray<T>(detail::take_as<T>(Tensor(grad_outputs)) * mask));
        },
        Tensor());
    return out;
}
#endif

/// @brief A layer that joins a list of at least 2 inputs into one output (Keras' `Merge`, the base of
/// Concatenate and Add), without weights. Its forward and backward take and give lists (forward_list,
/// backward_list); Layer's single-input forward and backward throw. pss::Model builds it over its
/// inputs' shapes. Inputs of float32 and float64 mixed are computed in float64.
class Merge : public Layer {
public:
    /// @throws InvalidArgumentError: a merge layer takes a list (forward_list)
    Tensor forward(Tensor /*inputs*/, std::uint64_t /*step*/ = 0) final { throw takes_list("forward"); }
    /// @throws InvalidArgumentError: a merge layer gives a list (backward_list)
    LayerGradients backward(const Tensor& /*grad_outputs*/) final { throw takes_list("backward"); }

    /// @brief The output for one batch of each input, in the order of the input shapes it was built for.
    /// @throws InvalidArgumentError naming the input whose shape differs from what the layer was built for.
    [[nodiscard]] virtual Tensor forward_list(std::vector<Tensor> inputs) = 0;
    /// @brief The gradient of each input of the last forward_list, from its output's gradient.
    [[nodiscard]] virtual std::vector<Tensor> backward_list(const Tensor& grad_outputs) = 0;

    /// @brief Builds the layer for inputs of `input_shapes` (batch axis excluded); returns the output shape.
    /// @throws FailedPreconditionError when built already; InvalidArgumentError when the shapes do not join.
    Shape build(const std::vector<Shape>& input_shapes) {
        Shape out = output_shape_of(input_shapes);
        mark_built({}, out);
        input_shapes_ = input_shapes;
        return out;
    }
    /// @pre built()
    [[nodiscard]] const std::vector<Shape>& input_shapes() const {
        require_built("input_shapes");
        return input_shapes_;
    }

    /// @throws InvalidArgumentError: a merge layer's output shape is of a list (output_shape_of)
    [[nodiscard]] Shape compute_output_shape(const Shape& /*input_shape*/) const final {
        throw takes_list("compute_output_shape");
    }
    /// @brief Keras' config without an input shape (a merge has several): `{"name": "concatenate"}`.
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Layer::get_config();
        config.erase("batch_input_shape");
        return config;
    }

protected:
    Merge() = default;
    [[nodiscard]] Shape output_shape_of(const std::vector<Shape>& input_shapes) const final {
        if (input_shapes.size() < 2)
            throw InvalidArgumentError("pss: " + describe() + " takes a list of at least 2 inputs, but it was called on " +
                                       std::to_string(input_shapes.size()));
        return merge_shape(input_shapes);
    }
    /// @brief The output shape of inputs of these shapes (at least 2).
    [[nodiscard]] virtual Shape merge_shape(const std::vector<Shape>& input_shapes) const = 0;

    Shape do_build(const Shape& /*input_shape*/, std::mt19937& /*rng*/) final { throw takes_list("build"); }
    Shape do_bind(const Shape& /*input_shape*/, std::vector<Variable> /*weights*/) final { throw takes_list("bind"); }

    /// Checks a batch against the shapes the layer was built for; returns the batch size.
    std::size_t check_batch(const std::vector<Tensor>& inputs) const {
        require_built("forward_list");
        if (inputs.size() != input_shapes_.size())
            throw InvalidArgumentError("pss: " + describe() + ": forward_list got " + std::to_string(inputs.size()) +
                                       " inputs, but the layer was built for " + std::to_string(input_shapes_.size()));
        const std::size_t batch = inputs.front().rank() == 0 ? 0 : inputs.front().shape().front();
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            Shape expected = input_shapes_[i];
            expected.insert(expected.begin(), batch);
            if (inputs[i].shape() != expected)
                throw InvalidArgumentError("pss: " + describe() + ": input " + std::to_string(i) + " has shape " +
                                           format_shape(inputs[i].shape()) + ", but the layer was built for " +
                                           format_shape(expected));
        }
        return batch;
    }
    /// The dtype a list is computed in: float64 when an input is, else float32.
    static DType common_dtype(const std::vector<Tensor>& inputs) {
        return std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.dtype() == DType::float64; })
                   ? DType::float64
                   : DType::float32;
    }

private:
    [[nodiscard]] InvalidArgumentError takes_list(const char* what) const {
        return InvalidArgumentError("pss: " + describe() + ": " + what +
                                    " of one input; a merge layer takes a list of inputs (call it on a list of "
                                    "symbolic tensors, as pss::Model does)");
    }

    std::vector<Shape> input_shapes_;
};

/// @brief Keras' `Concatenate(axis=-1)`: joins its inputs along `axis` (counted with the batch axis
/// as 0, negative from the end, as Keras), the other axes equal.
class Concatenate final : public Merge {
public:
    /// @param axis the axis joined, not the batch axis (0): -1 (the last) by default
    explicit Concatenate(int axis = -1) : axis_(axis) {
        if (axis == 0)
            throw InvalidArgumentError("pss: Concatenate: axis is 0, the batch axis; join along another (-1: the last)");
    }
    [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<Concatenate>(*this); }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] int axis() const noexcept { return axis_; }

    PSS_INLINE Tensor forward_list(std::vector<Tensor> inputs) override;
    PSS_INLINE std::vector<Tensor> backward_list(const Tensor& grad_outputs) override;

    /// @brief `{"axis": -1, "name": "concatenate"}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Merge::get_config();
        config["axis"] = axis_;
        return config;
    }

protected:
    [[nodiscard]] Shape merge_shape(const std::vector<Shape>& shapes) const override {
        const std::size_t rank = shapes.front().size();
        const int with_batch = static_cast<int>(rank) + 1;
        const int axis = axis_ < 0 ? axis_ + with_batch : axis_;
        auto list = [&] {
            std::string out;
            for (const auto& shape : shapes) out += (out.empty() ? "" : ", ") + format_shape(shape);
            return out;
        };
        if (axis < 1 || axis >= with_batch)
            throw InvalidArgumentError("pss: " + describe() + ": axis " + std::to_string(axis_) +
                                       " is not an axis after the batch axis of inputs of shapes " + list() +
                                       " (batch axis excluded)");
        const auto at = static_cast<std::size_t>(axis - 1);
        Shape out = shapes.front();
        out[at] = 0;
        for (const auto& shape : shapes) {
            bool fits = shape.size() == rank;
            for (std::size_t d = 0; fits && d < rank; ++d) fits = d == at || shape[d] == shapes.front()[d];
            if (!fits)
                throw InvalidArgumentError("pss: " + describe() + ": inputs of shapes " + list() +
                                           " (batch axis excluded) do not join along axis " + std::to_string(axis_) +
                                           "; every other axis must be equal");
            out[at] += shape[at];
        }
        return out;
    }

private:
    /// The elements of one input's block between two steps of the axes before the joined one.
    [[nodiscard]] std::size_t block(std::size_t input) const {
        const Shape& shape = input_shapes()[input];
        const std::size_t at = static_cast<std::size_t>((axis_ < 0 ? axis_ + static_cast<int>(shape.size()) + 1 : axis_) - 1);
        std::size_t n = 1;
        for (std::size_t d = at; d < shape.size(); ++d) n *= shape[d];
        return n;
    }

    int axis_;
    std::size_t batch_ = 0;
    std::vector<DType> dtypes_;  // the last inputs'
};

/// @brief Keras' `Add()`: the sum of its inputs, all of one shape.
class Add final : public Merge {
public:
    Add() = default;
    [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<Add>(*this); }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function

    PSS_INLINE Tensor forward_list(std::vector<Tensor> inputs) override;
    PSS_INLINE std::vector<Tensor> backward_list(const Tensor& grad_outputs) override;

protected:
    [[nodiscard]] Shape merge_shape(const std::vector<Shape>& shapes) const override {
        for (const auto& shape : shapes)
            if (shape != shapes.front())
                throw InvalidArgumentError("pss: " + describe() + ": inputs of shapes " + format_shape(shapes.front()) +
                                           " and " + format_shape(shape) +
                                           " (batch axis excluded); Add takes inputs of one shape");
        return shapes.front();
    }

private:
    std::vector<DType> dtypes_;  // the last inputs'
};

#if PSS_DEFINITIONS
PSS_INLINE std::string_view Concatenate::class_name() const noexcept { return "Concatenate"; }

PSS_INLINE Tensor Concatenate::forward_list(std::vector<Tensor> inputs) {
    batch_ = check_batch(inputs);
    dtypes_.clear();
    for (const auto& t : inputs) dtypes_.push_back(t.dtype());
    return detail::with_float_type(common_dtype(inputs), [&]<class T>(std::type_identity<T>) {
        Shape shape = output_shape();
        std::size_t width = 0;  // one row of the output: every input's block
        for (std::size_t i = 0; i < inputs.size(); ++i) width += block(i);
        const std::size_t rows = width == 0 ? 0 : batch_ * num_elements(shape) / width;
        shape.insert(shape.begin(), batch_);
        xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
        std::size_t offset = 0;
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            const xt::xarray<T> x = detail::take_as<T>(std::move(inputs[i]));
            const std::size_t n = block(i);
            for (std::size_t r = 0; r < rows; ++r) std::copy_n(x.data() + r * n, n, out.data() + r * width + offset);
            offset += n;
        }
        return Tensor(std::move(out));
    });
}

PSS_INLINE std::vector<Tensor> Concatenate::backward_list(const Tensor& grad_outputs) {
    require_built("backward_list");
    Shape expected = output_shape();
    expected.insert(expected.begin(), batch_);
    detail::check_grad_shape(grad_outputs, expected, describe());
    std::size_t width = 0;
    for (std::size_t i = 0; i < dtypes_.size(); ++i) width += block(i);
    const std::size_t rows = width == 0 ? 0 : grad_outputs.size() / width;
    std::vector<Tensor> out;
    std::size_t offset = 0;
    for (std::size_t i = 0; i < dtypes_.size(); ++i) {
        const std::size_t n = block(i);
        Shape shape = input_shapes()[i];
        shape.insert(shape.begin(), batch_);
        out.push_back(detail::with_float_type(dtypes_[i], [&]<class T>(std::type_identity<T>) {
            const xt::xarray<T> g = detail::take_as<T>(Tensor(grad_outputs));
            xt::xarray<T> gi = xt::xarray<T>::from_shape(shape);
            for (std::size_t r = 0; r < rows; ++r) std::copy_n(g.data() + r * width + offset, n, gi.data() + r * n);
            return Tensor(std::move(gi));
        }));
        offset += n;
    }
    return out;
}

PSS_INLINE std::string_view Add::class_name() const noexcept { return "Add"; }

PSS_INLINE Tensor Add::forward_list(std::vector<Tensor> inputs) {
    (void)check_batch(inputs);
    dtypes_.clear();
    for (const auto& t : inputs) dtypes_.push_back(t.dtype());
    return detail::with_float_type(common_dtype(inputs), [&]<class T>(std::type_identity<T>) {
        xt::xarray<T> sum = detail::take_as<T>(std::move(inputs.front()));
        for (std::size_t i = 1; i < inputs.size(); ++i) sum += detail::take_as<T>(std::move(inputs[i]));
        return Tensor(std::move(sum));
    });
}

PSS_INLINE std::vector<Tensor> Add::backward_list(const Tensor& grad_outputs) {
    require_built("backward_list");
    std::vector<Tensor> out;
    for (const DType dtype : dtypes_) out.push_back(detail::convert_tensor(grad_outputs, dtype));
    return out;
}
#endif

namespace detail {

/// What a layer called on symbolic tensors records (see KerasTensor).
struct SymbolicNode {
    std::unique_ptr<Layer> layer;     ///< a copy of the layer called, not built; null for an Input
    std::vector<KerasTensor> inputs;  ///< what it was called on
    Shape shape;                      ///< of its output, batch axis excluded
    std::string name;                 ///< an Input's name
    std::shared_ptr<const int> identity;  ///< the called layer object's
};

}  // namespace detail

/// @brief Keras' `tf.keras.Input(shape, name)`: an input of a functional model, examples of `shape`
/// (batch axis excluded). Unnamed inputs are named by their Model as Keras does: `input_1`, `input_2`,
/// ... in the order of the model's inputs.
[[nodiscard]] inline KerasTensor Input(Shape shape, std::string name = {}) {
    auto node = std::make_shared<detail::SymbolicNode>();
    node->shape = std::move(shape);
    node->name = std::move(name);
    return KerasTensor(std::move(node));
}

inline const Shape& KerasTensor::shape() const {
    if (!node_) throw FailedPreconditionError("pss: KerasTensor::shape of an empty tensor");
    return node_->shape;
}

inline const std::string& KerasTensor::name() const {
    if (!node_) throw FailedPreconditionError("pss: KerasTensor::name of an empty tensor");
    return node_->layer ? node_->layer->name() : node_->name;
}

#if PSS_DEFINITIONS
PSS_INLINE KerasTensor Layer::call(const std::vector<KerasTensor>& inputs) const {
    std::vector<Shape> shapes;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (!inputs[i])
            throw InvalidArgumentError("pss: " + describe() + " was called on an empty KerasTensor (input " +
                                       std::to_string(i) + "); call layers on pss::Input or on other layers' outputs");
        shapes.push_back(inputs[i].shape());
    }
    auto node = std::make_shared<detail::SymbolicNode>();
    node->shape = output_shape_of(shapes);
    node->layer = clone();
    node->inputs = inputs;
    if (!call_identity_) call_identity_ = std::make_shared<const int>(0);
    node->identity = call_identity_;
    return KerasTensor(std::move(node));
}
#endif

/// @brief Applies an activation to its inputs (Keras' `tf.keras.layers.Activation("relu")`): the
/// functions of Dense's `activation`, softmax over the last axis. No weights; it computes in its inputs'
/// dtype (float64 stays float64, any other becomes float32).
class Activation final : public Layer {
public:
    /// @throws InvalidArgumentError `pss: activation "gelu" is not known; use "linear", ...`
    explicit Activation(std::string_view activation) : activation_(activation_from_name(activation)) {}
    explicit Activation(ActivationFunction activation) : activation_(activation) {}
    [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<Activation>(*this); }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] ActivationFunction activation() const noexcept { return activation_; }
    /// @brief The input shape.
    [[nodiscard]] Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }

    PSS_INLINE Tensor forward(Tensor inputs, std::uint64_t step = 0) override;
    PSS_INLINE LayerGradients backward(const Tensor& grad_outputs) override;

    /// @brief `{"name": "activation", "activation": "relu", "batch_input_shape": [null, 3]}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Layer::get_config();
        config["activation"] = std::string(activation_name(activation_));
        return config;
    }

protected:
    Shape do_build(const Shape& input_shape, std::mt19937& /*rng*/) override { return input_shape; }
    Shape do_bind(const Shape& input_shape, std::vector<Variable> weights) override {
        check_bind_weights(weights, {});
        return input_shape;
    }

private:
    ActivationFunction activation_;
    Tensor outputs_;  // the last forward's, which the gradient is computed from
};

/// @brief LayerNormalization's arguments, by name and in Keras' order: `pss::LayerNormalization({.epsilon =
/// 1e-5})`.
struct LayerNormalizationOptions {
    int axis = -1;          ///< the last axis only: -1, or its index counting the batch axis
    double epsilon = 1e-3;  ///< added to the variance; a finite number > 0
    bool center = true;     ///< add the offset beta
    bool scale = true;      ///< multiply by gamma
    DType dtype = DType::float32;
};

/// @brief Keras' `LayerNormalization(axis=-1, epsilon=1e-3, center=True, scale=True)`: normalizes each
/// example over its last axis, `y = gamma * (x - mean) / sqrt(var + epsilon) + beta`, with the mean and
/// the biased variance (divided by the number of features, as Keras) of that row.
///
/// Its variables are `<name>/gamma` (ones; when `scale`) and `<name>/beta` (zeros; when `center`), of
/// shape (features,), in that order. Other axes than the last are not supported.
class LayerNormalization final : public Layer {
public:
    /// @throws InvalidArgumentError for an epsilon that is not a finite number > 0 or an integer dtype:
    /// `pss: LayerNormalization: epsilon is 0.0; it is a finite number > 0 (Keras' default 0.001)`
    explicit LayerNormalization(LayerNormalizationOptions options = {}) : options_(options) {
        if (auto problem = epsilon_problem(options.epsilon))
            throw InvalidArgumentError("pss: LayerNormalization: " + *problem);
        detail::check_float_dtype(options.dtype, "LayerNormalization");
    }
    [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<LayerNormalization>(*this); }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function

    [[nodiscard]] int axis() const noexcept { return options_.axis; }
    [[nodiscard]] double epsilon() const noexcept { return options_.epsilon; }
    [[nodiscard]] bool center() const noexcept { return options_.center; }
    [[nodiscard]] bool scale() const noexcept { return options_.scale; }
    [[nodiscard]] DType dtype() const noexcept { return options_.dtype; }
    /// @pre built() and scale()
    [[nodiscard]] const Variable& gamma() const {
        require_built("gamma");
        return gamma_;
    }
    /// @pre built() and center()
    [[nodiscard]] const Variable& beta() const {
        require_built("beta");
        return beta_;
    }
    [[nodiscard]] std::vector<Variable> weights() const override {
        std::vector<Variable> out;
        if (!built()) return out;
        if (options_.scale) out.push_back(gamma_);
        if (options_.center) out.push_back(beta_);
        return out;
    }

    PSS_INLINE Tensor forward(Tensor inputs, std::uint64_t step = 0) override;
    PSS_INLINE LayerGradients backward(const Tensor& grad_outputs) override;

    /// @brief `{"name": "layer_normalization", "axis": -1, "epsilon": 0.001, "center": true, "scale": true,
    /// "dtype": "float32", "batch_input_shape": [null, 3]}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Layer::get_config();
        config["axis"] = options_.axis;
        config["epsilon"] = options_.epsilon;
        config["center"] = options_.center;
        config["scale"] = options_.scale;
        config["dtype"] = std::string(dtype_name(options_.dtype));
        return config;
    }

    /// What is wrong with an epsilon, if anything (for the constructor and the config parser).
    [[nodiscard]] static std::optional<std::string> epsilon_problem(double epsilon) {
        if (epsilon > 0 && std::isfinite(epsilon)) return std::nullopt;
        return "epsilon is " + detail::number_text(epsilon) + "; it is a finite number > 0 (Keras' default 0.001)";
    }

    /// @brief The input shape (the last axis normalized).
    [[nodiscard]] Shape compute_output_shape(const Shape& input_shape) const override {
        check_input_shape(input_shape);
        return input_shape;
    }

protected:
    Shape do_build(const Shape& input_shape, std::mt19937& rng) override {
        check_input_shape(input_shape);
        const Shape features{input_shape.back()};
        if (options_.scale) gamma_ = Variable(initializers::Ones()(features, options_.dtype, rng), name() + "/gamma");
        if (options_.center) beta_ = Variable(initializers::Zeros()(features, options_.dtype, rng), name() + "/beta");
        return input_shape;
    }
    Shape do_bind(const Shape& input_shape, std::vector<Variable> weights) override {
        check_input_shape(input_shape);
        const Shape features{input_shape.back()};
        std::vector<WeightSpec> specs;
        if (options_.scale) specs.push_back({"gamma", features, options_.dtype});
        if (options_.center) specs.push_back({"beta", features, options_.dtype});
        check_bind_weights(weights, specs);
        std::size_t i = 0;
        if (options_.scale) gamma_ = std::move(weights[i++]);
        if (options_.center) beta_ = std::move(weights[i]);
        return input_shape;
    }

private:
    void check_input_shape(const Shape& input_shape) const {
        if (input_shape.empty() || input_shape.back() == 0)
            throw InvalidArgumentError("pss: " + describe() + ": input shape " + format_shape(input_shape) +
                                       "; a LayerNormalization layer needs inputs with a last axis of at least 1 "
                                       "feature");
        const int last = static_cast<int>(input_shape.size());  // counting the batch axis
        if (options_.axis != -1 && options_.axis != last)
            throw InvalidArgumentError("pss: " + describe() + ": axis is " + std::to_string(options_.axis) +
                                       " for input shape " + format_shape(input_shape) +
                                       " (batch axis excluded); only the last axis is supported: -1 or " +
                                       std::to_string(last) + " (counting the batch axis)");
    }

    /// One step's state in the layer's dtype: the pulled gamma, the normalized inputs and each row's
    /// 1 / sqrt(var + epsilon).
    template <class T>
    struct State {
        xt::xarray<T> gamma, beta, normalized, inverse_stddev;
    };
    template <class T>
    State<T>& state() {
        if constexpr (std::is_same_v<T, float>) return f32_;
        else return f64_;
    }

    template <class T>
    Tensor forward_as(Tensor&& inputs, std::uint64_t step);
    template <class T>
    LayerGradients backward_as(const Tensor& grad_outputs);

    LayerNormalizationOptions options_;
    Variable gamma_, beta_;
    State<float> f32_;
    State<double> f64_;
};

template <class T>
Tensor LayerNormalization::forward_as(Tensor&& inputs, std::uint64_t step) {
    State<T>& s = state<T>();
    s.normalized = detail::take_as<T>(std::move(inputs));  // normalized in place below
    if (options_.scale) gamma_.read_into(s.gamma, step);
    if (options_.center) beta_.read_into(s.beta, step);
    const std::size_t features = input_shape().back();
    const std::size_t rows = s.normalized.size() / features;
    s.inverse_stddev = xt::xarray<T>::from_shape({rows});
    xt::xarray<T> out = xt::xarray<T>::from_shape(s.normalized.shape());
    const T epsilon = static_cast<T>(options_.epsilon);
    const T n = static_cast<T>(features);
    for (std::size_t r = 0; r < rows; ++r) {
        T* x = s.normalized.data() + r * features;
        T* y = out.data() + r * features;
        T mean = 0;
        for (std::size_t j = 0; j < features; ++j) mean += x[j];
        mean /= n;
        T variance = 0;
        for (std::size_t j = 0; j < features; ++j) variance += (x[j] - mean) * (x[j] - mean);
        variance /= n;
        const T inverse = T{1} / std::sqrt(variance + epsilon);
        s.inverse_stddev.data()[r] = inverse;
        for (std::size_t j = 0; j < features; ++j) {
            x[j] = (x[j] - mean) * inverse;
            y[j] = (options_.scale ? s.gamma.data()[j] * x[j] : x[j]) + (options_.center ? s.beta.data()[j] : T{0});
        }
    }
    return Tensor(std::move(out));
}

template <class T>
LayerGradients LayerNormalization::backward_as(const Tensor& grad_outputs) {
    // With xhat = (x - mean) * inverse and d = dy * gamma, the gradient of x is
    // inverse * (d - mean(d) - xhat * mean(d * xhat)) per row: mean and variance depend on every x of it.
    State<T>& s = state<T>();
    const xt::xarray<T> g = detail::take_as<T>(Tensor(grad_outputs));
    const std::size_t features = input_shape().back();
    const std::size_t rows = s.normalized.size() / features;
    const T n = static_cast<T>(features);
    xt::xarray<T> gx = xt::xarray<T>::from_shape(s.normalized.shape());
    xt::xarray<T> ggamma = xt::zeros<T>({features});
    xt::xarray<T> gbeta = xt::zeros<T>({features});
    std::vector<T> d(features);
    for (std::size_t r = 0; r < rows; ++r) {
        const T* xhat = s.normalized.data() + r * features;
        const T* gr = g.data() + r * features;
        T mean_d = 0, mean_dx = 0;
        for (std::size_t j = 0; j < features; ++j) {
            ggamma.data()[j] += gr[j] * xhat[j];
            gbeta.data()[j] += gr[j];
            d[j] = options_.scale ? gr[j] * s.gamma.data()[j] : gr[j];
            mean_d += d[j];
            mean_dx += d[j] * xhat[j];
        }
        mean_d /= n;
        mean_dx /= n;
        const T inverse = s.inverse_stddev.data()[r];
        for (std::size_t j = 0; j < features; ++j)
            gx.data()[r * features + j] = inverse * (d[j] - mean_d - xhat[j] * mean_dx);
    }
    LayerGradients out;
    out.inputs = Tensor(std::move(gx));
    if (options_.scale) out.variables.push_back({gamma_, Tensor(std::move(ggamma)), {}, false});
    if (options_.center) out.variables.push_back({beta_, Tensor(std::move(gbeta)), {}, false});
    return out;
}

#if PSS_DEFINITIONS
PSS_INLINE std::string_view Activation::class_name() const noexcept { return "Activation"; }

PSS_INLINE Tensor Activation::forward(Tensor inputs, std::uint64_t /*step*/) {
    require_built("forward");
    if (inputs.rank() == 0) throw InvalidArgumentError("pss: " + describe() + ": a scalar input; it takes (batch, ...)");
    const std::size_t units = inputs.shape().back();
    return detail::with_float_type(inputs.dtype() == DType::float64 ? DType::float64 : DType::float32,
                                   [&]<class T>(std::type_identity<T>) {
        xt::xarray<T> y = detail::take_as<T>(std::move(inputs));
        detail::activate(activation_, y, units);
        outputs_ = Tensor(y);
        return Tensor(std::move(y));
    });
}

PSS_INLINE LayerGradients Activation::backward(const Tensor& grad_outputs) {
    require_built("backward");
    if (!outputs_.has_value())
        throw FailedPreconditionError("pss: " + describe() + ": backward before forward; it needs the outputs of a forward");
    detail::check_grad_shape(grad_outputs, outputs_.shape(), describe());
    LayerGradients out;
    out.inputs = outputs_.visit(
        [&](const auto& y) {
            using T = typename std::decay_t<decltype(y)>::value_type;
            const std::size_t units = y.dimension() == 0 ? 1 : y.shape().back();
            return Tensor(detail::activation_gradient(activation_, y, detail::take_as<T>(Tensor(grad_outputs)), units));
        },
        Tensor());
    return out;
}

PSS_INLINE std::string_view LayerNormalization::class_name() const noexcept { return "LayerNormalization"; }

PSS_INLINE Tensor LayerNormalization::forward(Tensor inputs, std::uint64_t step) {
    require_built("forward");
    const std::size_t features = input_shape().back();
    if (inputs.rank() < 2 || inputs.shape().back() != features)
        throw InvalidArgumentError("pss: " + describe() + ": inputs of shape " + format_shape(inputs.shape()) +
                                   ", but the layer takes (batch, ..., " + std::to_string(features) + ")");
    return detail::with_float_type(options_.dtype, [&]<class T>(std::type_identity<T>) {
        return forward_as<T>(std::move(inputs), step);
    });
}

PSS_INLINE LayerGradients LayerNormalization::backward(const Tensor& grad_outputs) {
    require_built("backward");
    return detail::with_float_type(options_.dtype, [&]<class T>(std::type_identity<T>) {
        const auto& shape = state<T>().normalized.shape();
        detail::check_grad_shape(grad_outputs, Shape(shape.begin(), shape.end()), describe());
        return backward_as<T>(grad_outputs);
    });
}
#endif

/// @brief Keras' `tf.keras.layers.serialize(layer)`: `{"class_name": "Dense", "config":
/// layer.get_config()}`.
[[nodiscard]] inline nlohmann::json serialize(const Layer& layer) {
    return {{"class_name", std::string(layer.class_name())}, {"config", layer.get_config()}};
}

/// @brief What register_layer gives: the class name under which worker processes rebuild the layer
/// class. Keep it in a namespace-scope variable, so that every process of the program registers it.
class RegisteredLayer {
public:
    /// @brief Made by register_layer.
    explicit RegisteredLayer(std::string class_name) : class_name_(std::move(class_name)) {}
    /// @brief The name serialize(layer) gives as "class_name": "Scale".
    [[nodiscard]] const std::string& class_name() const noexcept { return class_name_; }

private:
    std::string class_name_;
};

namespace detail {

/// The layer classes parse_layer_config knows without registration, in the order its message lists them.
inline constexpr std::array<std::string_view, 9> builtin_layer_classes{
    "Dense", "Embedding", "GlobalAveragePooling1D", "Flatten", "Dropout", "Activation", "LayerNormalization",
    "Concatenate", "Add"};

/// `"A", "B" and "C"`, for messages.
template <class Names>
[[nodiscard]] std::string quoted_list(const Names& names) {
    std::string out;
    std::size_t i = 0;
    const std::size_t n = std::size(names);
    for (const auto& name : names) {
        out += std::string(i == 0 ? "" : i + 1 == n ? " and " : ", ") + "\"" + std::string(name) + "\"";
        ++i;
    }
    return out;
}

/// Makes a registered class's layer from its own parameters (L::from_config, its result made a unique_ptr).
using LayerFactory = std::unique_ptr<Layer> (*)(const nlohmann::json& config);

/// The layer classes register_layer registered in this process, by class name.
struct LayerRegistry {
    std::mutex mutex;
    std::map<std::string, LayerFactory, std::less<>> factories;
    /// A function-local static: registering from another translation unit's static initialization is safe.
    static LayerRegistry& instance() {
        static LayerRegistry registry;
        return registry;
    }
};

/// The factory registered under `class_name`, if any.
[[nodiscard]] inline LayerFactory find_registered_layer(std::string_view class_name) {
    auto& registry = LayerRegistry::instance();
    std::lock_guard lock(registry.mutex);
    const auto it = registry.factories.find(class_name);
    return it == registry.factories.end() ? nullptr : it->second;
}

/// The registered class names, sorted.
[[nodiscard]] inline std::vector<std::string> registered_layer_classes() {
    auto& registry = LayerRegistry::instance();
    std::lock_guard lock(registry.mutex);
    std::vector<std::string> out;
    for (const auto& [name, factory] : registry.factories) out.push_back(name);
    return out;
}

/// L has Keras' from_config: a static member function taking the config's JSON object.
template <class L>
concept HasFromConfig = requires(const nlohmann::json& config) { L::from_config(config); };

/// L::from_config gives a layer: an object of a (move-constructible) Layer class, or a std::unique_ptr
/// to a Layer.
template <class L>
concept FromConfigGivesLayer =
    HasFromConfig<L> &&
    (std::convertible_to<decltype(L::from_config(std::declval<const nlohmann::json&>())), std::unique_ptr<Layer>> ||
     (std::derived_from<std::remove_cvref_t<decltype(L::from_config(std::declval<const nlohmann::json&>()))>, Layer> &&
      std::move_constructible<std::remove_cvref_t<decltype(L::from_config(std::declval<const nlohmann::json&>()))>>));

template <class L>
std::unique_ptr<Layer> make_layer_from_config(const nlohmann::json& config) {
    using Result = decltype(L::from_config(config));
    if constexpr (std::convertible_to<Result, std::unique_ptr<Layer>>) return L::from_config(config);
    else return std::make_unique<std::remove_cvref_t<Result>>(L::from_config(config));
}

}  // namespace detail

/// @brief Registers the layer class L under `class_name` (Keras' `register_keras_serializable`), so that
/// worker processes rebuild its layers: a Sequential or Model sends each layer's serialize(layer), and
/// a worker process that meets a class name which is not built in calls the registered
/// `L::from_config`. Register once per process, in every process of the cluster (the same program),
/// from a namespace-scope variable's initializer:
/// @code
/// class Scale : public pss::Layer {
///     ...  // clone, class_name() returning "Scale", do_build, do_bind, forward, backward, weights, get_config
///     static Scale from_config(const nlohmann::json& config);  // the parameters get_config adds
/// };
/// inline const auto scale_registration = pss::register_layer<Scale>("Scale");
/// @endcode
/// `from_config` gets the layer's config without "name" and "batch_input_shape" (Layer::get_config's
/// fields, which the rebuild reads and applies itself); it returns a layer that is not built, either an
/// object of a Layer class or a std::unique_ptr to one. Whatever it throws reaches the caller of the
/// rebuild as an InvalidArgumentError naming the class and the config (configs come from the network).
/// `class_name` must be what L's class_name() returns (the name serialize gives).
/// @throws AlreadyExistsError when `class_name` is a built-in class or registered already:
/// `pss: register_layer: a layer class named "Scale" is registered already; names must be unique in a
/// process`; InvalidArgumentError for an empty name. (Thrown from a namespace-scope initializer, either
/// ends the program before main, as for register_function.)
template <class L>
RegisteredLayer register_layer(std::string class_name) {
    static_assert(std::derived_from<L, Layer>, "pss: register_layer<L>: L must be a class derived from pss::Layer");
    static_assert(detail::HasFromConfig<L>,
                  "pss: register_layer<L>: L needs Keras' from_config, a static member function "
                  "`static L from_config(const nlohmann::json& config)` that makes the layer from the parameters "
                  "its get_config() adds");
    static_assert(detail::FromConfigGivesLayer<L>,
                  "pss: register_layer<L>: L::from_config must return a pss::Layer object (move-constructible) or "
                  "a std::unique_ptr to one");
    if (class_name.empty())
        throw InvalidArgumentError("pss: register_layer: the class name is empty; give the name L's class_name() "
                                   "returns");
    if (std::find(detail::builtin_layer_classes.begin(), detail::builtin_layer_classes.end(), class_name) !=
        detail::builtin_layer_classes.end())
        throw AlreadyExistsError("pss: register_layer: \"" + class_name +
                                 "\" is a built-in layer class; a registered class needs a name of its own");
    auto& registry = detail::LayerRegistry::instance();
    std::lock_guard lock(registry.mutex);
    if (!registry.factories.emplace(class_name, &detail::make_layer_from_config<L>).second)
        throw AlreadyExistsError("pss: register_layer: a layer class named \"" + class_name +
                                 "\" is registered already; names must be unique in a process");
    return RegisteredLayer(std::move(class_name));
}

/// @brief register_layer under the name L's class_name() returns, read from a default-constructed L.
template <class L>
RegisteredLayer register_layer() {
    static_assert(std::default_initializable<L>,
                  "pss: register_layer<L>(): without a class name L must be default-constructible (a default L's "
                  "class_name() names it); else give the name: register_layer<L>(\"L\")");
    return register_layer<L>(std::string(L().class_name()));
}

namespace detail {

/// What a layer's config gives: the layer, not built, and the input shape it was built for.
struct LayerConfig {
    std::unique_ptr<Layer> layer;
    Shape input_shape;
};

/// Parses serialize(layer) (see Layer::get_config) into a layer that is not built, with the same
/// class, name and parameters, and the input shape it was built for (`batch_input_shape` without its
/// batch axis).
/// @throws InvalidArgumentError naming the field and its value: not an object, an unknown class, a
/// missing, unknown or wrongly typed field, a number out of range, an unknown activation or initializer,
/// a dtype that is not float32 or float64; for a class registered with register_layer, whatever its
/// from_config throws. The config may come from the network: any JSON value gives a layer or this error.
[[nodiscard]] inline LayerConfig parse_layer_config(const nlohmann::json& serialized) {
    ConfigFields outer("layer", serialized, "class_name and config");
    const std::string cls = outer.take_string("class_name");
    const nlohmann::json& config = outer.take("config");
    outer.finish();
    LayerConfig out;
    auto fields_of = [&](std::string list) { return ConfigFields(cls + " config", config, std::move(list)); };
    auto finish = [&](ConfigFields& fields) {
        out.layer->set_name(fields.take_string("name"));
        out.input_shape = fields.take_batch_input_shape("batch_input_shape");
        fields.finish();
    };
    auto take_activation = [](ConfigFields& fields) {
        const std::string activation = fields.take_string("activation");
        const auto a = find_activation(activation);
        if (!a) fields.fail("\"activation\" is " + json_text(activation) + "; it is " + activation_list());
        return *a;
    };
    auto take_initializer = [&](ConfigFields& fields, const std::string& key) {
        return AnyInitializer(parse_initializer_config(fields.take(key), cls + " \"" + key + "\""));
    };
    if (cls == "Dense") {
        ConfigFields fields = fields_of("name, units, activation, use_bias, kernel_initializer, bias_initializer, "
                                        "kernel_regularizer, dtype and batch_input_shape");
        const std::uint64_t units = fields.take_count("units", 1);
        DenseOptions options;
        const ActivationFunction activation = take_activation(fields);
        options.use_bias = fields.take_bool("use_bias");
        options.kernel_initializer = take_initializer(fields, "kernel_initializer");
        options.bias_initializer = take_initializer(fields, "bias_initializer");
        if (const nlohmann::json& regularizer = fields.take("kernel_regularizer"); !regularizer.is_null()) {
            ConfigFields outer_l2("Dense \"kernel_regularizer\"", regularizer, "class_name and config");
            const std::string l2_class = outer_l2.take_string("class_name");
            if (l2_class != L2::class_name())
                outer_l2.fail("\"class_name\" is " + json_text(l2_class) + "; the regularizer is \"L2\" (or null for none)");
            ConfigFields l2_fields("Dense \"kernel_regularizer\" L2 config", outer_l2.take("config"), "l2");
            outer_l2.finish();
            const nlohmann::json& l2 = l2_fields.take("l2");
            l2_fields.finish();
            if (!l2.is_number()) l2_fields.fail("\"l2\" is " + json_text(l2) + ", not a number");
            if (auto problem = L2::l2_problem(l2.get<double>())) l2_fields.fail(*problem);
            options.kernel_regularizer = L2(l2.get<double>());
        }
        options.dtype = fields.take_float_dtype("dtype");
        options.activation = std::string(activation_name(activation));
        out.layer = std::make_unique<Dense>(static_cast<std::size_t>(units), std::move(options));
        finish(fields);
    } else if (cls == "Embedding") {
        ConfigFields fields =
            fields_of("name, input_dim, output_dim, embeddings_initializer, dtype and batch_input_shape");
        const std::uint64_t input_dim = fields.take_count("input_dim", 1);
        const std::uint64_t output_dim = fields.take_count("output_dim", 1);
        EmbeddingOptions options{.embeddings_initializer = take_initializer(fields, "embeddings_initializer"),
                                 .dtype = fields.take_float_dtype("dtype")};
        out.layer = std::make_unique<Embedding>(static_cast<std::size_t>(input_dim), static_cast<std::size_t>(output_dim),
                                                std::move(options));
        finish(fields);
    } else if (cls == "Activation") {
        ConfigFields fields = fields_of("name, activation and batch_input_shape");
        out.layer = std::make_unique<Activation>(take_activation(fields));
        finish(fields);
    } else if (cls == "LayerNormalization") {
        ConfigFields fields = fields_of("name, axis, epsilon, center, scale, dtype and batch_input_shape");
        LayerNormalizationOptions options;
        const nlohmann::json& axis = fields.take("axis");
        if (!(axis.is_number_unsigned() ? axis.get<std::uint64_t>() <= config_rank_limit
                                        : axis.is_number_integer() && axis.get<std::int64_t>() == -1))
            fields.fail("\"axis\" is " + json_text(axis) + "; it is -1 or the index of the last axis (counting the "
                        "batch axis), a whole number up to " + std::to_string(config_rank_limit));
        options.axis = static_cast<int>(axis.get<std::int64_t>());
        const nlohmann::json& epsilon = fields.take("epsilon");
        if (!epsilon.is_number()) fields.fail("\"epsilon\" is " + json_text(epsilon) + ", not a number");
        if (auto problem = LayerNormalization::epsilon_problem(epsilon.get<double>())) fields.fail(*problem);
        options.epsilon = epsilon.get<double>();
        options.center = fields.take_bool("center");
        options.scale = fields.take_bool("scale");
        options.dtype = fields.take_float_dtype("dtype");
        out.layer = std::make_unique<LayerNormalization>(options);
        finish(fields);
    } else if (cls == "Dropout") {
        ConfigFields fields = fields_of("name, rate, seed and batch_input_shape");
        const nlohmann::json& rate = fields.take("rate");
        if (!rate.is_number() || !(rate.get<double>() >= 0 && rate.get<double>() < 1))
            fields.fail("\"rate\" is " + json_text(rate) + "; it is a number in [0, 1)");
        const std::uint64_t seed = fields.take_count("seed", 0);
        out.layer = std::make_unique<Dropout>(rate.get<double>(), seed);
        finish(fields);
    } else if (cls == "GlobalAveragePooling1D" || cls == "Flatten") {
        ConfigFields fields = fields_of("name and batch_input_shape");
        if (cls == "Flatten") out.layer = std::make_unique<Flatten>();
        else out.layer = std::make_unique<GlobalAveragePooling1D>();
        finish(fields);
    } else if (cls == "Concatenate" || cls == "Add") {  // merges: their input shapes come from the model's graph
        ConfigFields fields = fields_of(cls == "Add" ? "name" : "name and axis");
        if (cls == "Add") {
            out.layer = std::make_unique<Add>();
        } else {
            const nlohmann::json& axis = fields.take("axis");
            const auto limit = static_cast<std::int64_t>(config_rank_limit);
            if (!axis.is_number_integer() || axis.get<std::int64_t>() == 0 || axis.get<std::int64_t>() > limit ||
                axis.get<std::int64_t>() < -limit - 1)
                fields.fail("\"axis\" is " + json_text(axis) + "; it is an integer axis other than 0 (the batch axis), "
                            "at most " + std::to_string(config_rank_limit) + " either way");
            out.layer = std::make_unique<Concatenate>(static_cast<int>(axis.get<std::int64_t>()));
        }
        out.layer->set_name(fields.take_string("name"));
        fields.finish();
    } else if (const LayerFactory factory = find_registered_layer(cls)) {
        ConfigFields fields = fields_of("name, batch_input_shape and the parameters of its from_config");
        const std::string name = fields.take_string("name");
        out.input_shape = fields.take_batch_input_shape("batch_input_shape");
        nlohmann::json parameters = config;
        parameters.erase("name");
        parameters.erase("batch_input_shape");
        try {
            out.layer = factory(parameters);
        } catch (const std::exception& e) {
            fields.fail("the registered class's from_config threw: " + std::string(e.what()));
        } catch (...) {
            fields.fail("the registered class's from_config threw something that is not a std::exception");
        }
        if (!out.layer) fields.fail("the registered class's from_config gave a null layer");
        if (out.layer->class_name() != cls)
            fields.fail("the registered class's from_config gave a layer whose class_name() is " +
                        json_text(std::string(out.layer->class_name())) +
                        "; register a class under the name its class_name() returns");
        if (out.layer->built())
            fields.fail("the registered class's from_config gave a built layer; it gives one that is not built "
                        "(the worker binds it to the model's variables)");
        out.layer->set_name(name);
    } else {
        const std::vector<std::string> registered = registered_layer_classes();
        outer.fail("\"class_name\" is " + json_text(cls) + "; the layers a worker rebuilds are " +
                   quoted_list(builtin_layer_classes) +
                   (registered.empty() ? std::string() : "; registered: " + quoted_list(registered)));
    }
    return out;
}

/// @brief The layer serialize(layer) describes, not built: same class, name and parameters. Bind it to
/// the original's variables with `bind(input_shape, weights)` (parse_layer_config gives the input shape,
/// bind_layer_from_config does both).
/// @throws InvalidArgumentError for any value that is not such a config (see parse_layer_config).
[[nodiscard]] inline std::unique_ptr<Layer> layer_from_config(const nlohmann::json& serialized) {
    return parse_layer_config(serialized).layer;
}

/// @brief What a worker process does with serialize(layer) and the layer's variables' handles: the
/// layer, bound to `weights` (in the order of weights()) for the input shape of the config. Creates no
/// variable.
/// @throws InvalidArgumentError for a value that is not a config, or weights bind rejects.
[[nodiscard]] inline std::unique_ptr<Layer> bind_layer_from_config(const nlohmann::json& serialized,
                                                                   std::vector<Variable> weights) {
    LayerConfig config = parse_layer_config(serialized);
    (void)config.layer->bind(config.input_shape, std::move(weights));
    return std::move(config.layer);
}

}  // namespace detail

#if PSS_DEFINITIONS
// Layer's and Flatten's key functions (each class's virtual table, with its virtual functions, is emitted
// where its key function is defined: see PSS_INLINE in pss/config.hpp).
PSS_INLINE Layer::~Layer() = default;
PSS_INLINE std::string_view Flatten::class_name() const noexcept { return "Flatten"; }
#endif

PSS_NAMESPACE_END
