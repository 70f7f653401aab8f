// pss/keras/losses.hpp: Keras-style losses (MeanSquaredError, BinaryCrossentropy, SparseCategoricalCrossentropy, Huber), each with its gradient.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xreducer.hpp>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/keras/config.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

/// @brief A loss of a pss::Sequential model (tf.keras.losses.Loss), reduced as Keras' default
/// (SUM_OVER_BATCH_SIZE): the mean over the batch of each example's loss.
///
/// Predictions have shape (batch, ...); targets are checked against them by check_targets. A loss
/// also gives its gradient with respect to the predictions: backward passes are written out, there is
/// no automatic differentiation. Losses are stateless, so one object serves every worker at once.
class Loss {
public:
    PSS_INLINE virtual ~Loss();  // the key function (see PSS_INLINE)

    /// @brief Keras' function name: "mean_squared_error", "binary_crossentropy", ...
    [[nodiscard]] virtual std::string_view name() const noexcept = 0;

    /// @brief Keras' class name: "MeanSquaredError", "BinaryCrossentropy", ...
    [[nodiscard]] virtual std::string_view class_name() const noexcept = 0;

    /// @brief Keras' `get_config()`: `{"name": "mean_squared_error", "reduction": "auto"}`, and
    /// `"from_logits": false` for the crossentropies. detail::loss_from_config rebuilds the loss from
    /// serialize(loss), for a worker process.
    [[nodiscard]] virtual nlohmann::json get_config() const {
        return {{"name", std::string(name())}, {"reduction", "auto"}};
    }

    /// @brief The loss of a batch (the mean over its examples), computed in the predictions' dtype
    /// (float32 or float64; targets of another dtype are converted to it), returned as a double.
    /// @pre check_targets(y_true, y_pred's shape without the batch axis) passed; the batch is not empty
    [[nodiscard]] virtual double value(const Tensor& y_true, const Tensor& y_pred) const = 0;
    /// @brief d value / d y_pred, of y_pred's shape and dtype.
    [[nodiscard]] virtual Tensor gradient(const Tensor& y_true, const Tensor& y_pred) const = 0;
    /// @brief Each example's loss, batch axis first: value() is their mean (every Keras loss is the mean
    /// of per-example losses, each of its own rows), and fit's sample weights weigh them. The default
    /// computes value() on each example alone.
    [[nodiscard]] virtual std::vector<double> example_values(const Tensor& y_true, const Tensor& y_pred) const {
        const std::size_t rows = y_pred.rank() == 0 ? 0 : y_pred.shape().front();
        std::vector<double> out(rows);
        if (rows == 0) return out;
        auto row = [rows](const auto& a, std::size_t r) {
            using T = typename std::decay_t<decltype(a)>::value_type;
            Shape shape(a.shape().begin(), a.shape().end());
            const std::size_t width = a.size() / rows;
            if (shape.empty()) shape.push_back(1);
            shape.front() = 1;
            xt::xarray<T> one = xt::xarray<T>::from_shape(shape);
            std::copy_n(a.data() + r * width, width, one.data());
            return Tensor(std::move(one));
        };
        for (std::size_t r = 0; r < rows; ++r)
            out[r] = value(y_true.visit([&](const auto& y) { return row(y, r); }, Tensor()),
                           y_pred.visit([&](const auto& p) { return row(p, r); }, Tensor()));
        return out;
    }

    /// @brief The same as value(), as Keras' `loss(y_true, y_pred)`.
    [[nodiscard]] double operator()(const Tensor& y_true, const Tensor& y_pred) const { return value(y_true, y_pred); }

    /// @brief Checks targets for predictions of shape (batch, `output_shape`...) before training.
    /// @throws InvalidArgumentError naming the loss, what it expects and what it got.
    virtual void check_targets(const xt::xarray<float>& y_true, const Shape& output_shape) const = 0;

protected:
    Loss() = default;
    Loss(const Loss&) = default;
    Loss& operator=(const Loss&) = default;

    /// Calls `f(y_true, y_pred)` as two `xt::xarray<T>` of the predictions' dtype T (float or double):
    /// targets of another dtype are converted (a copy; fit gives float32 targets to a float32 model).
    /// @throws InvalidArgumentError for an empty tensor or predictions that are not float32 or float64.
    template <class F>
    decltype(auto) in_dtype(const Tensor& y_true, const Tensor& y_pred, F&& f) const {
        if (!y_true.has_value() || !y_pred.has_value())
            throw InvalidArgumentError("pss: " + std::string(name()) + ": an empty tensor of " +
                                       (y_true.has_value() ? "predictions" : "targets"));
        auto run = [&]<class T>(const xt::xarray<T>& p) -> decltype(auto) {
            if (y_true.dtype() == dtype_of<T>) return f(y_true.get<T>(), p);
            const xt::xarray<T> y = y_true.visit([](const auto& a) { return xt::xarray<T>(xt::cast<T>(a)); }, xt::xarray<T>());
            return f(y, p);
        };
        if (y_pred.dtype() == DType::float32) return run(y_pred.get<float>());
        if (y_pred.dtype() != DType::float64)
            throw InvalidArgumentError("pss: " + std::string(name()) + ": predictions of dtype " +
                                       std::string(dtype_name(y_pred.dtype())) + "; a loss takes float32 or float64");
        return run(y_pred.get<double>());
    }

    /// Elementwise losses take targets with one value per prediction: (batch, output_shape...), or the
    /// same values in any shape with the batch axis first ((batch,) for outputs (batch, 1), as Keras
    /// squeezes).
    void check_same_size(const xt::xarray<float>& y_true, const Shape& output_shape) const {
        const Shape got(y_true.shape().begin(), y_true.shape().end());
        const std::size_t batch = got.empty() ? 0 : got.front();
        if (got.empty() || y_true.size() != batch * num_elements(output_shape)) {
            Shape expected = output_shape;
            expected.insert(expected.begin(), batch);
            throw InvalidArgumentError("pss: " + std::string(name()) + ": targets of shape " + format_shape(got) +
                                       " for predictions of shape " + format_shape(expected) +
                                       "; give one target per prediction, batch axis first");
        }
    }
    /// @throws InvalidArgumentError unless there are as many targets as predictions, and some.
    template <class T>
    void check_value_count(const xt::xarray<T>& y_true, const xt::xarray<T>& y_pred) const {
        if (y_true.size() != y_pred.size() || y_pred.size() == 0)
            throw InvalidArgumentError("pss: " + std::string(name()) + ": " + std::to_string(y_true.size()) +
                                       " targets for " + std::to_string(y_pred.size()) +
                                       " predictions; give one target per prediction (and at least one)");
    }
    /// The targets in the predictions' shape (they may be (batch,) for predictions (batch, 1)).
    template <class T>
    static auto as_shape_of(const xt::xarray<T>& y_true, const xt::xarray<T>& y_pred) {
        return xt::reshape_view(y_true, Shape(y_pred.shape().begin(), y_pred.shape().end()));
    }
};

/// @brief Keras' `MeanSquaredError`: mean((y_pred - y_true)^2) over every prediction of the batch.
class MeanSquaredError final : public Loss {
public:
    [[nodiscard]] std::string_view name() const noexcept override { return "mean_squared_error"; }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function

    [[nodiscard]] PSS_INLINE double value(const Tensor& y_true, const Tensor& y_pred) const override;
    [[nodiscard]] PSS_INLINE Tensor gradient(const Tensor& y_true, const Tensor& y_pred) const override;
    void check_targets(const xt::xarray<float>& y_true, const Shape& output_shape) const override {
        check_same_size(y_true, output_shape);
    }
};

#if PSS_DEFINITIONS
PSS_INLINE std::string_view MeanSquaredError::class_name() const noexcept { return "MeanSquaredError"; }

PSS_INLINE double MeanSquaredError::value(const Tensor& y_true, const Tensor& y_pred) const {
    return in_dtype(y_true, y_pred, [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p) {
        check_value_count(y, p);
        return static_cast<double>(xt::mean(xt::square(p - as_shape_of(y, p)))());
    });
}

PSS_INLINE Tensor MeanSquaredError::gradient(const Tensor& y_true, const Tensor& y_pred) const {
    return in_dtype(y_true, y_pred, [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p) {
        check_value_count(y, p);
        const T scale = static_cast<T>(2.0 / static_cast<double>(p.size()));
        return Tensor(xt::xarray<T>(scale * (p - as_shape_of(y, p))));
    });
}
#endif

/// @brief Keras' `BinaryCrossentropy(from_logits=False)`.
///
/// From probabilities (the default): mean(-(y log(p + e) + (1 - y) log(1 - p + e))) with p = clip(y_pred,
/// e, 1 - e) and e = 1e-7, Keras' `epsilon()`, exactly as tf.keras.backend.binary_crossentropy computes
/// it. Where y_pred is outside [e, 1 - e] the gradient is 0 (the clip's). Predictions come from a sigmoid.
///
/// From logits (`BinaryCrossentropy(true)`, predictions x from a linear layer): TensorFlow's
/// sigmoid_cross_entropy_with_logits, mean(max(x, 0) - x y + log(1 + exp(-|x|))), exact for any x, with
/// the gradient (sigmoid(x) - y) / n. Targets are in [0, 1] either way.
class BinaryCrossentropy final : public Loss {
public:
    /// @brief Keras' `backend.epsilon()`.
    static constexpr double epsilon = 1e-7;

    explicit BinaryCrossentropy(bool from_logits = false) noexcept : from_logits_(from_logits) {}

    [[nodiscard]] std::string_view name() const noexcept override { return "binary_crossentropy"; }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] bool from_logits() const noexcept { return from_logits_; }
    /// @brief `{"from_logits": false, "name": "binary_crossentropy", "reduction": "auto"}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Loss::get_config();
        config["from_logits"] = from_logits_;
        return config;
    }

    [[nodiscard]] PSS_INLINE double value(const Tensor& y_true, const Tensor& y_pred) const override;
    [[nodiscard]] PSS_INLINE Tensor gradient(const Tensor& y_true, const Tensor& y_pred) const override;
    void check_targets(const xt::xarray<float>& y_true, const Shape& output_shape) const override {
        check_same_size(y_true, output_shape);
        for (float y : y_true)
            if (!(y >= 0.0 && y <= 1.0))
                throw InvalidArgumentError("pss: binary_crossentropy: a target is " + std::to_string(y) +
                                           "; targets are probabilities in [0, 1] (labels 0 and 1)");
    }

private:
    bool from_logits_;
};

#if PSS_DEFINITIONS
PSS_INLINE std::string_view BinaryCrossentropy::class_name() const noexcept { return "BinaryCrossentropy"; }

PSS_INLINE double BinaryCrossentropy::value(const Tensor& y_true, const Tensor& y_pred) const {
    return in_dtype(y_true, y_pred, [&]<class T>(const xt::xarray<T>& y_in, const xt::xarray<T>& p_in) {
        check_value_count(y_in, p_in);
        const T e = static_cast<T>(epsilon), one = T{1};
        const auto y = as_shape_of(y_in, p_in);
        if (from_logits_)
            return static_cast<double>(
                xt::mean(xt::maximum(p_in, T{0}) - p_in * y + xt::log1p(xt::exp(-xt::abs(p_in))))());
        const auto p = xt::clip(p_in, e, one - e);
        return -static_cast<double>(xt::mean(y * xt::log(p + e) + (one - y) * xt::log(one - p + e))());
    });
}

PSS_INLINE Tensor BinaryCrossentropy::gradient(const Tensor& y_true, const Tensor& y_pred) const {
    return in_dtype(y_true, y_pred, [&]<class T>(const xt::xarray<T>& y_in, const xt::xarray<T>& p) {
        check_value_count(y_in, p);
        const T e = static_cast<T>(epsilon), one = T{1};
        const T scale = static_cast<T>(1.0 / static_cast<double>(p.size()));
        const auto y = as_shape_of(y_in, p);
        if (from_logits_) return Tensor(xt::xarray<T>(scale * (one / (one + xt::exp(-p)) - y)));
        return Tensor(xt::xarray<T>(
            xt::where(p < e || p > one - e, T{0}, -scale * (y / (p + e) - (one - y) / (one - p + e)))));
    });
}
#endif

/// @brief Keras' `SparseCategoricalCrossentropy(from_logits=False)`: targets are class ids, predictions a
/// distribution over the last axis (a softmax's output), or with `from_logits` true its logits (a linear
/// layer's output): then the example's loss is log(sum_j exp(x[j])) - x[t], computed from the largest
/// logit so that no exp overflows, with the gradient softmax(x) - onehot(t) (over the batch size).
///
/// From probabilities:
/// As tf.keras.backend.sparse_categorical_crossentropy: c = clip(y_pred, e, 1 - e) with e = 1e-7, and the
/// example's loss is the softmax cross-entropy of the logits log(c), i.e. -log(c[t]) + log(sum_j c[j])
/// (which is -log(y_pred[t]) for a softmax output no clip touched). The gradient is 0 where the clip
/// applies. Targets: class ids stored as floats (the model's data is `xt::xarray<float>`), shape (batch,)
/// or (batch, 1) for predictions (batch, classes); generally one id per row of classes.
class SparseCategoricalCrossentropy final : public Loss {
public:
    /// @brief Keras' `backend.epsilon()`.
    static constexpr double epsilon = 1e-7;

    explicit SparseCategoricalCrossentropy(bool from_logits = false) noexcept : from_logits_(from_logits) {}

    [[nodiscard]] std::string_view name() const noexcept override { return "sparse_categorical_crossentropy"; }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] bool from_logits() const noexcept { return from_logits_; }
    /// @brief `{"from_logits": false, "name": "sparse_categorical_crossentropy", "reduction": "auto"}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Loss::get_config();
        config["from_logits"] = from_logits_;
        return config;
    }

    [[nodiscard]] PSS_INLINE double value(const Tensor& y_true, const Tensor& y_pred) const override;
    [[nodiscard]] PSS_INLINE Tensor gradient(const Tensor& y_true, const Tensor& y_pred) const override;
    void check_targets(const xt::xarray<float>& y_true, const Shape& output_shape) const override {
        const Shape got(y_true.shape().begin(), y_true.shape().end());
        if (output_shape.empty() || got.empty() ||
            y_true.size() * output_shape.back() != got.front() * num_elements(output_shape)) {
            Shape expected = output_shape;
            expected.insert(expected.begin(), got.empty() ? 0 : got.front());
            throw InvalidArgumentError("pss: sparse_categorical_crossentropy: targets of shape " + format_shape(got) +
                                       " for predictions of shape " + format_shape(expected) +
                                       "; give one class id per row of class probabilities: (batch,) or (batch, 1) "
                                       "for predictions (batch, classes)");
        }
        const double classes = static_cast<double>(output_shape.back());
        for (double y : y_true)
            if (!(y >= 0 && y < classes) || y != std::floor(y))
                throw InvalidArgumentError("pss: sparse_categorical_crossentropy: a target is " + std::to_string(y) +
                                           ", not a class id; targets are integers in [0, " +
                                           std::to_string(output_shape.back()) + ") stored as floats");
    }

private:
    template <class T>
    std::size_t check_counts(const xt::xarray<T>& y_true, const xt::xarray<T>& y_pred) const {
        if (y_pred.dimension() == 0 || y_pred.size() == 0 || y_pred.shape().back() == 0 ||
            y_true.size() * y_pred.shape().back() != y_pred.size())
            throw InvalidArgumentError("pss: sparse_categorical_crossentropy: " + std::to_string(y_true.size()) +
                                       " targets for predictions of shape " +
                                       format_shape(Shape(y_pred.shape().begin(), y_pred.shape().end())) +
                                       "; give one class id per row of class probabilities");
        return y_pred.shape().back();
    }

    /// The softmax of one row of logits into `out`; returns log(sum_j exp(x[j])).
    template <class T>
    static T softmax_row(const T* x, T* out, std::size_t classes) {
        const T top = *std::max_element(x, x + classes);
        T sum = 0;
        for (std::size_t j = 0; j < classes; ++j) sum += (out[j] = std::exp(x[j] - top));
        for (std::size_t j = 0; j < classes; ++j) out[j] /= sum;
        return top + std::log(sum);
    }

    bool from_logits_;
};

#if PSS_DEFINITIONS
PSS_INLINE std::string_view SparseCategoricalCrossentropy::class_name() const noexcept { return "SparseCategoricalCrossentropy"; }

PSS_INLINE double SparseCategoricalCrossentropy::value(const Tensor& y_true, const Tensor& y_pred) const {
    return in_dtype(y_true, y_pred, [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& probs) {
        const std::size_t classes = check_counts(y, probs);
        const std::size_t rows = probs.size() / classes;
        const T e = static_cast<T>(epsilon), high = T{1} - e;
        double sum = 0;
        if (from_logits_) {
            std::vector<T> softmax(classes);
            for (std::size_t r = 0; r < rows; ++r) {
                const T* x = probs.data() + r * classes;
                sum += static_cast<double>(softmax_row(x, softmax.data(), classes) -
                                           x[static_cast<std::size_t>(y.data()[r])]);
            }
            return sum / static_cast<double>(rows);
        }
        for (std::size_t r = 0; r < rows; ++r) {
            const T* p = probs.data() + r * classes;
            T total = 0;
            for (std::size_t j = 0; j < classes; ++j) total += std::clamp(p[j], e, high);
            const auto t = static_cast<std::size_t>(y.data()[r]);
            sum += static_cast<double>(-std::log(std::clamp(p[t], e, high)) + std::log(total));
        }
        return sum / static_cast<double>(rows);
    });
}

PSS_INLINE Tensor SparseCategoricalCrossentropy::gradient(const Tensor& y_true, const Tensor& y_pred) const {
    return in_dtype(y_true, y_pred, [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& probs) {
        const std::size_t classes = check_counts(y, probs);
        const std::size_t rows = probs.size() / classes;
        const T e = static_cast<T>(epsilon), high = T{1} - e;
        xt::xarray<T> out = xt::xarray<T>::from_shape(probs.shape());
        const T scale = static_cast<T>(1.0 / static_cast<double>(rows));
        if (from_logits_) {
            for (std::size_t r = 0; r < rows; ++r) {
                T* g = out.data() + r * classes;
                (void)softmax_row(probs.data() + r * classes, g, classes);
                g[static_cast<std::size_t>(y.data()[r])] -= T{1};
                for (std::size_t j = 0; j < classes; ++j) g[j] *= scale;
            }
            return Tensor(std::move(out));
        }
        for (std::size_t r = 0; r < rows; ++r) {
            const T* p = probs.data() + r * classes;
            T* g = out.data() + r * classes;
            T total = 0;
            for (std::size_t j = 0; j < classes; ++j) total += std::clamp(p[j], e, high);
            const auto t = static_cast<std::size_t>(y.data()[r]);
            for (std::size_t j = 0; j < classes; ++j)
                g[j] = (p[j] < e || p[j] > high) ? T{0} : scale * (T{1} / total - (j == t ? T{1} / p[j] : T{0}));
        }
        return Tensor(std::move(out));
    });
}
#endif

/// @brief Keras' `Huber(delta=1.0)`: each error e = y_pred - y_true costs e^2 / 2 where |e| <= delta and
/// delta (|e| - delta / 2) beyond, so that large errors count linearly (robust to outliers); the mean over
/// every prediction of the batch. The gradient is e clipped to [-delta, delta], over their count.
class Huber final : public Loss {
public:
    /// @throws InvalidArgumentError when delta is not a finite number > 0:
    /// `pss: Huber: delta is 0; it is a finite number > 0 (Keras' default 1.0)`
    explicit Huber(double delta = 1.0) : delta_(delta) {
        if (!(delta > 0) || !std::isfinite(delta))
            throw InvalidArgumentError("pss: Huber: delta is " + delta_text(delta) +
                                       "; it is a finite number > 0 (Keras' default 1.0)");
    }
    [[nodiscard]] std::string_view name() const noexcept override { return "huber_loss"; }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] double delta() const noexcept { return delta_; }
    /// @brief `{"delta": 1.0, "name": "huber_loss", "reduction": "auto"}`
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = Loss::get_config();
        config["delta"] = delta_;
        return config;
    }
    [[nodiscard]] PSS_INLINE double value(const Tensor& y_true, const Tensor& y_pred) const override;
    [[nodiscard]] PSS_INLINE Tensor gradient(const Tensor& y_true, const Tensor& y_pred) const override;
    void check_targets(const xt::xarray<float>& y_true, const Shape& output_shape) const override {
        check_same_size(y_true, output_shape);
    }

    /// `1.5`, as a message shows a delta.
    [[nodiscard]] static std::string delta_text(double delta) { return nlohmann::json(delta).dump(); }

private:
    double delta_;
};

#if PSS_DEFINITIONS
PSS_INLINE std::string_view Huber::class_name() const noexcept { return "Huber"; }

PSS_INLINE double Huber::value(const Tensor& y_true, const Tensor& y_pred) const {
    return in_dtype(y_true, y_pred, [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p) {
        check_value_count(y, p);
        const T d = static_cast<T>(delta_), half = T{0.5};
        const auto error = xt::abs(p - as_shape_of(y, p));
        return static_cast<double>(xt::mean(xt::where(error <= d, half * error * error, d * (error - half * d)))());
    });
}

PSS_INLINE Tensor Huber::gradient(const Tensor& y_true, const Tensor& y_pred) const {
    return in_dtype(y_true, y_pred, [&]<class T>(const xt::xarray<T>& y, const xt::xarray<T>& p) {
        check_value_count(y, p);
        const T d = static_cast<T>(delta_);
        const T scale = static_cast<T>(1.0 / static_cast<double>(p.size()));
        return Tensor(xt::xarray<T>(scale * xt::clip(p - as_shape_of(y, p), -d, d)));
    });
}
#endif

/// @brief The loss Keras names `name`: "mean_squared_error" (or "mse"), "binary_crossentropy",
/// "sparse_categorical_crossentropy", "huber" (delta 1).
/// @throws InvalidArgumentError `pss: loss "hinge" is not known; use ...`
[[nodiscard]] inline std::shared_ptr<const Loss> make_loss(std::string_view name) {
    if (name == "mean_squared_error" || name == "mse" || name == "MeanSquaredError")
        return std::make_shared<MeanSquaredError>();
    if (name == "binary_crossentropy" || name == "BinaryCrossentropy") return std::make_shared<BinaryCrossentropy>();
    if (name == "sparse_categorical_crossentropy" || name == "SparseCategoricalCrossentropy")
        return std::make_shared<SparseCategoricalCrossentropy>();
    if (name == "huber" || name == "huber_loss" || name == "Huber") return std::make_shared<Huber>();
    throw InvalidArgumentError("pss: loss \"" + std::string(name) +
                               "\" is not known; use \"mean_squared_error\" (or \"mse\"), \"binary_crossentropy\", "
                               "\"sparse_categorical_crossentropy\" or \"huber\", or pass a pss::Loss object");
}

/// @brief Keras' `tf.keras.losses.serialize(loss)`: `{"class_name": "MeanSquaredError", "config":
/// {"name": "mean_squared_error", "reduction": "auto"}}`.
[[nodiscard]] inline nlohmann::json serialize(const Loss& loss) {
    return {{"class_name", std::string(loss.class_name())}, {"config", loss.get_config()}};
}

namespace detail {

/// @brief The loss that serialize(loss) describes, as a worker process rebuilds a model's loss:
/// `{"class_name": "BinaryCrossentropy", "config": {"from_logits": false, "name": "binary_crossentropy",
/// "reduction": "auto"}}`. Keras' reductions "auto" and "sum_over_batch_size" (the same here) are taken.
/// @throws InvalidArgumentError for anything else, naming the field and its value (the config may come
/// from the network): `pss: loss {"class_name":"Hinge",...}: "class_name" is "Hinge"; the losses ...`
[[nodiscard]] inline std::shared_ptr<const Loss> loss_from_config(const nlohmann::json& serialized) {
    ConfigFields outer("loss", serialized, "class_name and config");
    const std::string class_name = outer.take_string("class_name");
    const nlohmann::json& config = outer.take("config");
    outer.finish();
    const bool logits = class_name == "BinaryCrossentropy" || class_name == "SparseCategoricalCrossentropy";
    const bool huber = class_name == "Huber";
    if (!logits && !huber && class_name != "MeanSquaredError")
        outer.fail("\"class_name\" is " + json_text(class_name) +
                   "; the losses a worker rebuilds are \"MeanSquaredError\", \"BinaryCrossentropy\", "
                   "\"SparseCategoricalCrossentropy\" and \"Huber\"");
    ConfigFields fields(class_name + " config", config,
                        logits ? "name, reduction and from_logits" : huber ? "name, reduction and delta" : "name and reduction");
    const std::string name = fields.take_string("name");
    const std::string reduction = fields.take_string("reduction");
    if (reduction != "auto" && reduction != "sum_over_batch_size")
        fields.fail("\"reduction\" is " + json_text(reduction) +
                    "; a loss reduces as \"auto\" (or \"sum_over_batch_size\", the same): the mean over the batch");
    std::shared_ptr<const Loss> loss;
    if (class_name == "BinaryCrossentropy") loss = std::make_shared<BinaryCrossentropy>(fields.take_bool("from_logits"));
    else if (logits) loss = std::make_shared<SparseCategoricalCrossentropy>(fields.take_bool("from_logits"));
    else if (huber) {
        const nlohmann::json& delta = fields.take("delta");
        if (!delta.is_number() || !(delta.get<double>() > 0) || !std::isfinite(delta.get<double>()))
            fields.fail("\"delta\" is " + delta.dump() + "; it is a finite number > 0");
        loss = std::make_shared<Huber>(delta.get<double>());
    } else {
        loss = std::make_shared<MeanSquaredError>();
    }
    if (name != loss->name())
        fields.fail("\"name\" is " + json_text(name) + "; a " + class_name + " is named \"" + std::string(loss->name()) + "\"");
    fields.finish();
    return loss;
}

}  // namespace detail

#if PSS_DEFINITIONS
// Loss's key function (see PSS_INLINE in pss/config.hpp).
PSS_INLINE Loss::~Loss() = default;
#endif

PSS_NAMESPACE_END
