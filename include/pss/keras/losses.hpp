// pss/keras/losses.hpp: Keras-style losses (MeanSquaredError, BinaryCrossentropy, SparseCategoricalCrossentropy), each with its gradient.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/errors.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

// ---------------------------------------------------------------------------------------------------
// Config texts: one line that describes a layer or a loss, sent to worker processes, which rebuild the
// object from it (detail::layer_from_config, detail::loss_from_config). The grammar:
//
//     config := class (' ' key '=' value)*        words are printable ASCII (0x21 to 0x7e)
//
// A text read from the network is hostile: every malformed text throws InvalidArgumentError quoting
// (at most 200 bytes of) the text and naming what is wrong; nothing else can happen.
// ---------------------------------------------------------------------------------------------------

/// The largest count (units, dimension, ...) a config text may give: 2^48, far above any real layer,
/// and low enough that sums and products of two of them cannot overflow.
inline constexpr std::uint64_t config_count_limit = std::uint64_t{1} << 48;
/// The largest number of elements a shape in a config text may have: 2^62.
inline constexpr std::uint64_t config_elements_limit = std::uint64_t{1} << 62;
/// The largest rank of a shape in a config text.
inline constexpr std::size_t config_rank_limit = 32;

/// `text` in double quotes for an error message: its first 200 bytes, bytes outside printable ASCII
/// and `"` and `\` as `\xNN`, and its length when it is longer.
inline std::string quote_config(std::string_view text) {
    constexpr std::size_t shown = 200;
    constexpr char hex[] = "0123456789abcdef";
    std::string out = "\"";
    for (std::size_t i = 0; i < text.size() && i < shown; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 0xf];
        } else {
            out += static_cast<char>(c);
        }
    }
    out += '"';
    if (text.size() > shown) out += " (" + std::to_string(text.size()) + " bytes, the first 200 shown)";
    return out;
}

/// Shape `(3,2)` as a config text writes it: no spaces, `(3)` for rank 1, `()` for a scalar.
inline std::string format_config_shape(const Shape& shape) {
    std::string out = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i > 0) out += ',';
        out += std::to_string(shape[i]);
    }
    return out + ")";
}

/// A config text split into its class (the first word) and its `key=value` fields. Fields are taken
/// by name; finish() rejects any field not taken. Views point into the text, which must outlive it.
class ConfigReader {
public:
    /// @param kind "layer" or "loss", for messages
    /// @throws InvalidArgumentError when the text is empty, holds a byte that is not printable ASCII or
    /// a space, a word after the first that is not `key=value`, or a key twice.
    ConfigReader(std::string_view kind, std::string_view text) : kind_(kind), text_(text) {
        for (std::size_t i = 0; i < text.size(); ++i) {
            const auto c = static_cast<unsigned char>(text[i]);
            if (c != ' ' && (c < 0x21 || c > 0x7e))
                fail("byte " + std::to_string(i) + " is " + quote_config(text.substr(i, 1)) +
                     ", not printable ASCII; a config is one line of printable words separated by spaces");
        }
        std::size_t at = 0;
        while (at < text.size()) {
            if (text[at] == ' ') {
                ++at;
                continue;
            }
            const std::size_t end = std::min(text.find(' ', at), text.size());
            const std::string_view word = text.substr(at, end - at);
            at = end;
            if (class_.empty()) {
                class_ = word;
                continue;
            }
            const std::size_t eq = word.find('=');
            if (eq == std::string_view::npos || eq == 0)
                fail("the word " + quote_config(word) + " is not a field key=value");
            Field field{word.substr(0, eq), word.substr(eq + 1), false};
            if (field.value.empty()) fail("the field " + quote_config(field.key) + " has no value");
            for (const auto& f : fields_)
                if (f.key == field.key) fail("the field " + quote_config(field.key) + " is given twice");
            fields_.push_back(field);
        }
        if (class_.empty()) fail("it is empty; a config starts with the class name");
    }

    [[nodiscard]] std::string_view class_name() const noexcept { return class_; }
    [[nodiscard]] std::string_view text() const noexcept { return text_; }

    /// The value of field `key`. @throws InvalidArgumentError when the text has no such field.
    [[nodiscard]] std::string_view take(std::string_view key) {
        for (auto& f : fields_)
            if (f.key == key) {
                f.taken = true;
                return f.value;
            }
        fail("the field \"" + std::string(key) + "\" is missing; a " + std::string(class_) + " config has " +
             expected_fields_);
    }

    /// Field `key` as a whole number in [min, config_count_limit].
    [[nodiscard]] std::uint64_t take_count(std::string_view key, std::uint64_t min) {
        return parse_count(key, take(key), min);
    }

    /// Field `key` as 0 or 1.
    [[nodiscard]] bool take_flag(std::string_view key) {
        const std::string_view value = take(key);
        if (value != "0" && value != "1")
            fail(std::string(key) + " is " + quote_config(value) + "; it is 0 or 1");
        return value == "1";
    }

    /// Field `key` as a shape `(d0,d1,...)`: at most 32 whole numbers up to 2^48, 2^62 elements in all.
    [[nodiscard]] Shape take_shape(std::string_view key) {
        const std::string_view value = take(key);
        if (value.size() < 2 || value.front() != '(' || value.back() != ')')
            fail(std::string(key) + " is " + quote_config(value) + ", not a shape such as (3,2), (3) or ()");
        std::string_view inner = value.substr(1, value.size() - 2);
        Shape shape;
        std::uint64_t elements = 1;
        while (!inner.empty()) {
            const std::size_t comma = std::min(inner.find(','), inner.size());
            if (shape.size() == config_rank_limit)
                fail(std::string(key) + " " + quote_config(value) + " has more than " +
                     std::to_string(config_rank_limit) + " axes");
            const std::uint64_t d = parse_count(key, inner.substr(0, comma), 0);
            if (d != 0 && elements > config_elements_limit / d)
                fail(std::string(key) + " " + quote_config(value) + " has more than 2^62 elements");
            elements *= d;
            shape.push_back(static_cast<std::size_t>(d));
            if (comma == inner.size()) break;
            inner.remove_prefix(comma + 1);
            if (inner.empty()) fail(std::string(key) + " " + quote_config(value) + " ends with a comma");
        }
        return shape;
    }

    /// The fields a complete config of this class has, for the message of a missing field.
    void expect(std::string fields) { expected_fields_ = std::move(fields); }

    /// @throws InvalidArgumentError naming the first field that was not taken.
    void finish() const {
        for (const auto& f : fields_)
            if (!f.taken)
                fail("the field " + quote_config(f.key) + " is not one of " + std::string(class_) + "'s; it has " +
                     expected_fields_);
    }

    /// @throws InvalidArgumentError `pss: <kind> config "<text>": <problem>`
    [[noreturn]] void fail(const std::string& problem) const {
        throw InvalidArgumentError("pss: " + std::string(kind_) + " config " + quote_config(text_) + ": " + problem);
    }

private:
    struct Field {
        std::string_view key, value;
        bool taken;
    };

    std::uint64_t parse_count(std::string_view key, std::string_view digits, std::uint64_t min) const {
        std::uint64_t n = 0;
        const char* end = digits.data() + digits.size();
        const auto [ptr, ec] = std::from_chars(digits.data(), end, n);
        if (digits.empty() || ptr != end || (ec != std::errc() && ec != std::errc::result_out_of_range))
            fail(std::string(key) + " is " + quote_config(digits) + ", not a whole number");
        if (ec == std::errc::result_out_of_range || n > config_count_limit)
            fail(std::string(key) + " is " + quote_config(digits) + ", more than 2^48");
        if (n < min) fail(std::string(key) + " is " + std::to_string(n) + "; it is at least " + std::to_string(min));
        return n;
    }

    std::string_view kind_;
    std::string_view text_;
    std::string_view class_;
    std::vector<Field> fields_;
    std::string expected_fields_ = "no other fields";
};

}  // namespace detail

/// @brief A loss of a pss::Sequential model (tf.keras.losses.Loss), reduced as Keras' default
/// (SUM_OVER_BATCH_SIZE): the mean over the batch of each example's loss.
///
/// Predictions have shape (batch, ...); targets are checked against them by check_targets. A loss
/// also gives its gradient with respect to the predictions: backward passes are written out, there is
/// no automatic differentiation. Losses are stateless, so one object serves every worker at once.
class Loss {
public:
    virtual ~Loss() = default;

    /// @brief Keras' function name: "mean_squared_error", "binary_crossentropy", ...
    [[nodiscard]] virtual std::string_view name() const noexcept = 0;

    /// @brief One line of text from which detail::loss_from_config rebuilds this loss exactly, for a
    /// worker process: its name(), then its parameters as `key=value` words. The losses here have no
    /// parameters, so it is their name: "mean_squared_error". A loss with parameters overrides it.
    [[nodiscard]] virtual std::string config() const { return std::string(name()); }

    /// @brief The loss of a batch (the mean over its examples).
    /// @pre check_targets(y_true, y_pred's shape without the batch axis) passed; the batch is not empty
    [[nodiscard]] virtual double value(const xt::xarray<double>& y_true, const xt::xarray<double>& y_pred) const = 0;
    /// @brief d value / d y_pred, of y_pred's shape.
    [[nodiscard]] virtual xt::xarray<double> gradient(const xt::xarray<double>& y_true,
                                                      const xt::xarray<double>& y_pred) const = 0;
    /// @brief The same as value(), as Keras' `loss(y_true, y_pred)`.
    [[nodiscard]] double operator()(const xt::xarray<double>& y_true, const xt::xarray<double>& y_pred) const {
        return value(y_true, y_pred);
    }

    /// @brief Checks targets for predictions of shape (batch, `output_shape`...) before training.
    /// @throws InvalidArgumentError naming the loss, what it expects and what it got.
    virtual void check_targets(const xt::xarray<double>& y_true, const Shape& output_shape) const = 0;

protected:
    Loss() = default;
    Loss(const Loss&) = default;
    Loss& operator=(const Loss&) = default;

    /// Elementwise losses take targets with one value per prediction: (batch, output_shape...), or the
    /// same values in any shape with the batch axis first ((batch,) for outputs (batch, 1), as Keras
    /// squeezes).
    void check_same_size(const xt::xarray<double>& y_true, const Shape& output_shape) const {
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
    static void check_value_count(const xt::xarray<double>& y_true, const xt::xarray<double>& y_pred, std::string_view loss) {
        if (y_true.size() != y_pred.size() || y_pred.size() == 0)
            throw InvalidArgumentError("pss: " + std::string(loss) + ": " + std::to_string(y_true.size()) +
                                       " targets for " + std::to_string(y_pred.size()) +
                                       " predictions; give one target per prediction (and at least one)");
    }
};

/// @brief Keras' `MeanSquaredError`: mean((y_pred - y_true)^2) over every prediction of the batch.
class MeanSquaredError final : public Loss {
public:
    [[nodiscard]] std::string_view name() const noexcept override { return "mean_squared_error"; }

    [[nodiscard]] double value(const xt::xarray<double>& y_true, const xt::xarray<double>& y_pred) const override {
        check_value_count(y_true, y_pred, name());
        double sum = 0;
        for (std::size_t i = 0; i < y_pred.size(); ++i) {
            const double d = y_pred.data()[i] - y_true.data()[i];
            sum += d * d;
        }
        return sum / static_cast<double>(y_pred.size());
    }
    [[nodiscard]] xt::xarray<double> gradient(const xt::xarray<double>& y_true,
                                              const xt::xarray<double>& y_pred) const override {
        check_value_count(y_true, y_pred, name());
        xt::xarray<double> out = xt::xarray<double>::from_shape(y_pred.shape());
        const double scale = 2.0 / static_cast<double>(y_pred.size());
        for (std::size_t i = 0; i < y_pred.size(); ++i) out.data()[i] = scale * (y_pred.data()[i] - y_true.data()[i]);
        return out;
    }
    void check_targets(const xt::xarray<double>& y_true, const Shape& output_shape) const override {
        check_same_size(y_true, output_shape);
    }
};

/// @brief Keras' `BinaryCrossentropy()` from probabilities (`from_logits=False`):
/// mean(-(y log(p + e) + (1 - y) log(1 - p + e))) with p = clip(y_pred, e, 1 - e) and e = 1e-7, Keras'
/// `epsilon()`, exactly as tf.keras.backend.binary_crossentropy computes it. Where y_pred is outside
/// [e, 1 - e] the gradient is 0 (the clip's). Predictions come from a sigmoid; targets are in [0, 1].
class BinaryCrossentropy final : public Loss {
public:
    /// @brief Keras' `backend.epsilon()`.
    static constexpr double epsilon = 1e-7;

    [[nodiscard]] std::string_view name() const noexcept override { return "binary_crossentropy"; }

    [[nodiscard]] double value(const xt::xarray<double>& y_true, const xt::xarray<double>& y_pred) const override {
        check_value_count(y_true, y_pred, name());
        double sum = 0;
        for (std::size_t i = 0; i < y_pred.size(); ++i) {
            const double p = std::clamp(y_pred.data()[i], epsilon, 1.0 - epsilon);
            const double y = y_true.data()[i];
            sum -= y * std::log(p + epsilon) + (1.0 - y) * std::log(1.0 - p + epsilon);
        }
        return sum / static_cast<double>(y_pred.size());
    }
    [[nodiscard]] xt::xarray<double> gradient(const xt::xarray<double>& y_true,
                                              const xt::xarray<double>& y_pred) const override {
        check_value_count(y_true, y_pred, name());
        xt::xarray<double> out = xt::xarray<double>::from_shape(y_pred.shape());
        const double scale = 1.0 / static_cast<double>(y_pred.size());
        for (std::size_t i = 0; i < y_pred.size(); ++i) {
            const double p = y_pred.data()[i];
            const double y = y_true.data()[i];
            out.data()[i] = (p < epsilon || p > 1.0 - epsilon)
                                ? 0.0
                                : -scale * (y / (p + epsilon) - (1.0 - y) / (1.0 - p + epsilon));
        }
        return out;
    }
    void check_targets(const xt::xarray<double>& y_true, const Shape& output_shape) const override {
        check_same_size(y_true, output_shape);
        for (double y : y_true)
            if (!(y >= 0.0 && y <= 1.0))
                throw InvalidArgumentError("pss: binary_crossentropy: a target is " + std::to_string(y) +
                                           "; targets are probabilities in [0, 1] (labels 0 and 1)");
    }
};

/// @brief Keras' `SparseCategoricalCrossentropy()` from probabilities (`from_logits=False`): targets
/// are class ids, predictions a distribution over the last axis (a softmax's output).
///
/// As tf.keras.backend.sparse_categorical_crossentropy: c = clip(y_pred, e, 1 - e) with e = 1e-7, and the
/// example's loss is the softmax cross-entropy of the logits log(c), i.e. -log(c[t]) + log(sum_j c[j])
/// (which is -log(y_pred[t]) for a softmax output no clip touched). The gradient is 0 where the clip
/// applies. Targets: class ids stored as floats (the model's data is `xt::xarray<float>`), shape (batch,)
/// or (batch, 1) for predictions (batch, classes); generally one id per row of classes.
class SparseCategoricalCrossentropy final : public Loss {
public:
    /// @brief Keras' `backend.epsilon()`.
    static constexpr double epsilon = 1e-7;

    [[nodiscard]] std::string_view name() const noexcept override { return "sparse_categorical_crossentropy"; }

    [[nodiscard]] double value(const xt::xarray<double>& y_true, const xt::xarray<double>& y_pred) const override {
        const std::size_t classes = check_counts(y_true, y_pred);
        const std::size_t rows = y_pred.size() / classes;
        double sum = 0;
        for (std::size_t r = 0; r < rows; ++r) {
            const double* p = y_pred.data() + r * classes;
            double total = 0;
            for (std::size_t j = 0; j < classes; ++j) total += std::clamp(p[j], epsilon, 1.0 - epsilon);
            const auto t = static_cast<std::size_t>(y_true.data()[r]);
            sum += -std::log(std::clamp(p[t], epsilon, 1.0 - epsilon)) + std::log(total);
        }
        return sum / static_cast<double>(rows);
    }
    [[nodiscard]] xt::xarray<double> gradient(const xt::xarray<double>& y_true,
                                              const xt::xarray<double>& y_pred) const override {
        const std::size_t classes = check_counts(y_true, y_pred);
        const std::size_t rows = y_pred.size() / classes;
        xt::xarray<double> out = xt::xarray<double>::from_shape(y_pred.shape());
        const double scale = 1.0 / static_cast<double>(rows);
        for (std::size_t r = 0; r < rows; ++r) {
            const double* p = y_pred.data() + r * classes;
            double* g = out.data() + r * classes;
            double total = 0;
            for (std::size_t j = 0; j < classes; ++j) total += std::clamp(p[j], epsilon, 1.0 - epsilon);
            const auto t = static_cast<std::size_t>(y_true.data()[r]);
            for (std::size_t j = 0; j < classes; ++j) {
                if (p[j] < epsilon || p[j] > 1.0 - epsilon) {
                    g[j] = 0.0;
                    continue;
                }
                g[j] = scale * (1.0 / total - (j == t ? 1.0 / p[j] : 0.0));
            }
        }
        return out;
    }
    void check_targets(const xt::xarray<double>& y_true, const Shape& output_shape) const override {
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
    std::size_t check_counts(const xt::xarray<double>& y_true, const xt::xarray<double>& y_pred) const {
        if (y_pred.dimension() == 0 || y_pred.size() == 0 || y_pred.shape().back() == 0 ||
            y_true.size() * y_pred.shape().back() != y_pred.size())
            throw InvalidArgumentError("pss: sparse_categorical_crossentropy: " + std::to_string(y_true.size()) +
                                       " targets for predictions of shape " +
                                       format_shape(Shape(y_pred.shape().begin(), y_pred.shape().end())) +
                                       "; give one class id per row of class probabilities");
        return y_pred.shape().back();
    }
};

/// @brief The loss Keras names `name`: "mean_squared_error" (or "mse"), "binary_crossentropy",
/// "sparse_categorical_crossentropy".
/// @throws InvalidArgumentError `pss: loss "hinge" is not known; use ...`
[[nodiscard]] inline std::shared_ptr<const Loss> make_loss(std::string_view name) {
    if (name == "mean_squared_error" || name == "mse" || name == "MeanSquaredError")
        return std::make_shared<MeanSquaredError>();
    if (name == "binary_crossentropy" || name == "BinaryCrossentropy") return std::make_shared<BinaryCrossentropy>();
    if (name == "sparse_categorical_crossentropy" || name == "SparseCategoricalCrossentropy")
        return std::make_shared<SparseCategoricalCrossentropy>();
    throw InvalidArgumentError("pss: loss \"" + std::string(name) +
                               "\" is not known; use \"mean_squared_error\" (or \"mse\"), \"binary_crossentropy\" or "
                               "\"sparse_categorical_crossentropy\", or pass a pss::Loss object");
}

namespace detail {

/// @brief The loss whose Loss::config() is `text` ("mean_squared_error", "binary_crossentropy",
/// "sparse_categorical_crossentropy"), as a worker process rebuilds a model's loss. Only these exact
/// names: Keras' aliases ("mse") are make_loss's business.
/// @throws InvalidArgumentError for any other text, quoting it (the text may come from the network):
/// `pss: loss config "hinge": the loss "hinge" is not known; ...`
[[nodiscard]] inline std::shared_ptr<const Loss> loss_from_config(std::string_view text) {
    ConfigReader reader("loss", text);
    const std::string_view name = reader.class_name();
    std::shared_ptr<const Loss> loss;
    if (name == "mean_squared_error") loss = std::make_shared<MeanSquaredError>();
    else if (name == "binary_crossentropy") loss = std::make_shared<BinaryCrossentropy>();
    else if (name == "sparse_categorical_crossentropy") loss = std::make_shared<SparseCategoricalCrossentropy>();
    else
        reader.fail("the loss " + quote_config(name) +
                    " is not known; the configs of pss's losses are \"mean_squared_error\", \"binary_crossentropy\" "
                    "and \"sparse_categorical_crossentropy\"");
    reader.expect("no fields");
    reader.finish();
    return loss;
}

}  // namespace detail

PSS_NAMESPACE_END
