// pss/keras/initializers.hpp: Keras' weight initializers (GlorotUniform, HeNormal, RandomUniform, Zeros, ...), by name or as objects, drawing the same numbers with every standard library.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/initializer.hpp>
#include <pss/keras/config.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// A uniform double in [lo, hi) from one draw of a std::mt19937, whose output sequence the standard
/// fixes; std::uniform_real_distribution is not portable across standard libraries, this mapping is.
inline double uniform(std::mt19937& rng, double lo, double hi) {
    return lo + (hi - lo) * (static_cast<double>(rng()) / 4294967296.0);
}

/// A standard normal draw by Marsaglia's polar method on pairs of detail::uniform draws (pairs outside
/// the unit disc are drawn again): std::normal_distribution differs between standard libraries, this
/// needs only std::sqrt (exact) and std::log.
inline double standard_normal(std::mt19937& rng) {
    for (;;) {
        const double u = uniform(rng, -1.0, 1.0);
        const double v = uniform(rng, -1.0, 1.0);
        const double s = u * u + v * v;
        if (s > 0 && s < 1) return u * std::sqrt(-2.0 * std::log(s) / s);
    }
}

/// A standard normal draw redrawn while beyond 2 (TensorFlow's truncated_normal, in units of stddev).
inline double truncated_standard_normal(std::mt19937& rng) {
    for (;;) {
        const double z = standard_normal(rng);
        if (std::abs(z) <= 2.0) return z;
    }
}

/// A tensor of `shape` in `dtype` (float32 or float64) whose elements, in row-major order, are `draw()`
/// converted to the dtype: no table of doubles first (an embedding table can be most of the memory).
/// @throws InvalidArgumentError for another dtype, naming `who`.
template <class Draw>
Tensor fill_tensor(const Shape& shape, DType dtype, std::string_view who, Draw&& draw) {
    auto fill = [&]<class T>(std::type_identity<T>) {
        xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
        T* p = out.data();
        for (std::size_t i = 0; i < out.size(); ++i) p[i] = static_cast<T>(draw());
        return Tensor(std::move(out));
    };
    if (dtype == DType::float32) return fill(std::type_identity<float>{});
    if (dtype == DType::float64) return fill(std::type_identity<double>{});
    throw InvalidArgumentError("pss: " + std::string(who) + ": dtype " + std::string(dtype_name(dtype)) +
                               "; an initializer fills float32 or float64 weights");
}

/// Keras' fans of a weight's shape: a kernel (in, out) has fan_in `in` and fan_out `out`; a scalar 1 and
/// 1; a vector (n) n and n; a convolution kernel (..., in, out) multiplies both by its receptive field.
inline std::pair<double, double> compute_fans(const Shape& shape) {
    if (shape.empty()) return {1.0, 1.0};
    if (shape.size() == 1) return {static_cast<double>(shape[0]), static_cast<double>(shape[0])};
    double receptive_field = 1;
    for (std::size_t i = 0; i + 2 < shape.size(); ++i) receptive_field *= static_cast<double>(shape[i]);
    return {static_cast<double>(shape[shape.size() - 2]) * receptive_field,
            static_cast<double>(shape.back()) * receptive_field};
}

/// The seed of a layer's variable drawn on the ps tasks by an initializer without a seed: the next
/// two numbers of the model's generator, read from a copy (the model's stream is not consumed, so the
/// other weights keep the values they had), mixed with the variable's name (unique in a model, so two
/// tables built one after the other differ).
inline std::uint64_t variable_seed(const std::mt19937& rng, std::string_view variable) {
    std::mt19937 ahead = rng;
    const std::uint64_t high = ahead();
    return mix64((high << 32 | ahead()) ^ name_seed(variable));
}

/// An initializer's own seed, else `seed` (all 64 bits of it: optional<uint32_t>::value_or would cut it).
[[nodiscard]] inline std::uint64_t own_or(std::optional<std::uint32_t> own, std::uint64_t seed) noexcept {
    return own ? std::uint64_t{*own} : seed;
}

/// `1.5`, `nan`, `-inf`: a number for a message (JSON would print a NaN as null).
inline std::string number_text(double value) {
    if (std::isnan(value)) return "nan";
    if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
    return nlohmann::json(value).dump();
}

/// JSON null or the seed.
inline nlohmann::json seed_json(std::optional<std::uint32_t> seed) {
    return seed ? nlohmann::json(*seed) : nlohmann::json(nullptr);
}

}  // namespace detail

/// @brief Keras' initializers (tf.keras.initializers): the first values of a layer's weights.
///
/// An initializer without a seed draws from the generator it is given, the model's (so the model's seed
/// fixes every weight, and layers built one after another draw one after another); with a seed it draws
/// from a std::mt19937 seeded with it, afresh at each call, so it gives the same values every time, as a
/// seeded Keras initializer does. Uniform draws are detail::uniform's, normal ones are derived from them
/// (detail::standard_normal), never a std:: distribution, whose numbers differ between standard libraries.
///
/// Give a layer one by Keras' name or as an object: `pss::Dense(16, {.kernel_initializer = "he_normal"})`,
/// `{.kernel_initializer = pss::initializers::RandomNormal(0.0, 0.01, 42)}` (see pss::AnyInitializer).
namespace initializers {

/// @brief The interface of an initializer (tf.keras.initializers.Initializer). Initializers are immutable:
/// one object serves every layer that holds it.
class Initializer {
public:
    PSS_INLINE virtual ~Initializer();  // the key function (see PSS_INLINE)

    /// @brief Keras' class name: "GlorotUniform", "Zeros", ...
    [[nodiscard]] virtual std::string_view class_name() const noexcept = 0;
    /// @brief Keras' `get_config()`: `{"seed": null}`, `{"mean": 0.0, "stddev": 0.05, "seed": null}`, ...
    [[nodiscard]] virtual nlohmann::json get_config() const { return nlohmann::json::object(); }
    /// @brief Values of `shape` in `dtype` (float32 or float64), drawn from `rng` unless the initializer
    /// has a seed. @throws InvalidArgumentError for another dtype.
    [[nodiscard]] virtual Tensor operator()(const Shape& shape, DType dtype, std::mt19937& rng) const = 0;
    /// @brief The initializer as data for a variable of `shape`, which each ps task draws its shards from
    /// (see pss::InitializerSpec; the values differ from operator()'s): with the initializer's own seed
    /// when it has one, else `seed`. Nothing (the default, a user's class) when it cannot describe
    /// itself: then its variables are made from operator()'s value.
    [[nodiscard]] virtual std::optional<InitializerSpec> spec(const Shape& /*shape*/, std::uint64_t /*seed*/) const {
        return std::nullopt;
    }

protected:
    Initializer() = default;
    Initializer(const Initializer&) = default;
    Initializer& operator=(const Initializer&) = default;
};

/// @brief Keras' `Zeros()`: every value 0.
class Zeros final : public Initializer {
public:
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] Tensor operator()(const Shape& shape, DType dtype, std::mt19937& /*rng*/) const override {
        return detail::fill_tensor(shape, dtype, "Zeros", [] { return 0.0; });
    }
    [[nodiscard]] std::optional<InitializerSpec> spec(const Shape&, std::uint64_t) const override {
        return InitializerSpec::zeros();
    }
};

/// @brief Keras' `Ones()`: every value 1.
class Ones final : public Initializer {
public:
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] Tensor operator()(const Shape& shape, DType dtype, std::mt19937& /*rng*/) const override {
        return detail::fill_tensor(shape, dtype, "Ones", [] { return 1.0; });
    }
    [[nodiscard]] std::optional<InitializerSpec> spec(const Shape&, std::uint64_t) const override {
        return InitializerSpec::ones();
    }
};

/// @brief Keras' `Constant(value=0)`: every value `value`.
class Constant final : public Initializer {
public:
    /// @throws InvalidArgumentError `pss: Constant: value is nan; it is a finite number`
    explicit Constant(double value = 0.0) : value_(value) {
        if (!std::isfinite(value))
            throw InvalidArgumentError("pss: Constant: value is " + detail::number_text(value) + "; it is a finite number");
    }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] double value() const noexcept { return value_; }
    /// @brief `{"value": 0.0}`
    [[nodiscard]] nlohmann::json get_config() const override { return {{"value", value_}}; }
    [[nodiscard]] Tensor operator()(const Shape& shape, DType dtype, std::mt19937& /*rng*/) const override {
        return detail::fill_tensor(shape, dtype, "Constant", [&] { return value_; });
    }
    [[nodiscard]] std::optional<InitializerSpec> spec(const Shape&, std::uint64_t) const override {
        return InitializerSpec::constant(value_);
    }

private:
    double value_;
};

/// @brief Keras' `RandomUniform(minval=-0.05, maxval=0.05, seed=None)`: U(minval, maxval), each value
/// `minval + (maxval - minval) * u` of one detail::uniform draw. Keras' Embedding default ("uniform").
class RandomUniform final : public Initializer {
public:
    /// @throws InvalidArgumentError `pss: RandomUniform: minval is 1.0 and maxval 0.0; they are finite
    /// numbers with minval <= maxval (and a finite difference)`
    explicit RandomUniform(double minval = -0.05, double maxval = 0.05, std::optional<std::uint32_t> seed = std::nullopt)
        : minval_(minval), maxval_(maxval), seed_(seed) {
        if (auto problem = bounds_problem(minval, maxval)) throw InvalidArgumentError("pss: RandomUniform: " + *problem);
    }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] double minval() const noexcept { return minval_; }
    [[nodiscard]] double maxval() const noexcept { return maxval_; }
    [[nodiscard]] std::optional<std::uint32_t> seed() const noexcept { return seed_; }
    /// @brief `{"minval": -0.05, "maxval": 0.05, "seed": null}`
    [[nodiscard]] nlohmann::json get_config() const override {
        return {{"minval", minval_}, {"maxval", maxval_}, {"seed", detail::seed_json(seed_)}};
    }
    [[nodiscard]] PSS_INLINE Tensor operator()(const Shape& shape, DType dtype, std::mt19937& rng) const override;
    [[nodiscard]] std::optional<InitializerSpec> spec(const Shape&, std::uint64_t seed) const override {
        return InitializerSpec::random_uniform(minval_, maxval_, detail::own_or(seed_, seed));
    }

    /// What is wrong with these bounds, if anything (for the constructor and the config parser).
    [[nodiscard]] static std::optional<std::string> bounds_problem(double minval, double maxval) {
        if (std::isfinite(minval) && std::isfinite(maxval) && minval <= maxval && std::isfinite(maxval - minval))
            return std::nullopt;
        return "minval is " + detail::number_text(minval) + " and maxval " + detail::number_text(maxval) +
               "; they are finite numbers with minval <= maxval (and a finite difference)";
    }

private:
    double minval_, maxval_;
    std::optional<std::uint32_t> seed_;
};

/// @brief Keras' `RandomNormal(mean=0, stddev=0.05, seed=None)`: N(mean, stddev^2), from
/// detail::standard_normal.
class RandomNormal final : public Initializer {
public:
    /// @throws InvalidArgumentError `pss: RandomNormal: mean is 0.0 and stddev -1.0; they are finite
    /// numbers with stddev >= 0`
    explicit RandomNormal(double mean = 0.0, double stddev = 0.05, std::optional<std::uint32_t> seed = std::nullopt)
        : mean_(mean), stddev_(stddev), seed_(seed) {
        if (auto problem = normal_problem(mean, stddev)) throw InvalidArgumentError("pss: RandomNormal: " + *problem);
    }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] double mean() const noexcept { return mean_; }
    [[nodiscard]] double stddev() const noexcept { return stddev_; }
    [[nodiscard]] std::optional<std::uint32_t> seed() const noexcept { return seed_; }
    /// @brief `{"mean": 0.0, "stddev": 0.05, "seed": null}`
    [[nodiscard]] nlohmann::json get_config() const override {
        return {{"mean", mean_}, {"stddev", stddev_}, {"seed", detail::seed_json(seed_)}};
    }
    [[nodiscard]] PSS_INLINE Tensor operator()(const Shape& shape, DType dtype, std::mt19937& rng) const override;
    [[nodiscard]] std::optional<InitializerSpec> spec(const Shape&, std::uint64_t seed) const override {
        return InitializerSpec::random_normal(mean_, stddev_, detail::own_or(seed_, seed));
    }

    /// What is wrong with a mean and stddev, if anything (RandomNormal's and TruncatedNormal's).
    [[nodiscard]] static std::optional<std::string> normal_problem(double mean, double stddev) {
        if (std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0) return std::nullopt;
        return "mean is " + detail::number_text(mean) + " and stddev " + detail::number_text(stddev) +
               "; they are finite numbers with stddev >= 0";
    }

private:
    double mean_, stddev_;
    std::optional<std::uint32_t> seed_;
};

/// @brief Keras' `TruncatedNormal(mean=0, stddev=0.05, seed=None)`: N(mean, stddev^2) with the draws
/// beyond 2 stddev from the mean drawn again (TensorFlow's truncated_normal).
class TruncatedNormal final : public Initializer {
public:
    /// @throws InvalidArgumentError as RandomNormal: `pss: TruncatedNormal: mean is ...`
    explicit TruncatedNormal(double mean = 0.0, double stddev = 0.05, std::optional<std::uint32_t> seed = std::nullopt)
        : mean_(mean), stddev_(stddev), seed_(seed) {
        if (auto problem = RandomNormal::normal_problem(mean, stddev))
            throw InvalidArgumentError("pss: TruncatedNormal: " + *problem);
    }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] double mean() const noexcept { return mean_; }
    [[nodiscard]] double stddev() const noexcept { return stddev_; }
    [[nodiscard]] std::optional<std::uint32_t> seed() const noexcept { return seed_; }
    /// @brief `{"mean": 0.0, "stddev": 0.05, "seed": null}`
    [[nodiscard]] nlohmann::json get_config() const override {
        return {{"mean", mean_}, {"stddev", stddev_}, {"seed", detail::seed_json(seed_)}};
    }
    [[nodiscard]] PSS_INLINE Tensor operator()(const Shape& shape, DType dtype, std::mt19937& rng) const override;
    [[nodiscard]] std::optional<InitializerSpec> spec(const Shape&, std::uint64_t seed) const override {
        return InitializerSpec::truncated_normal(mean_, stddev_, detail::own_or(seed_, seed));
    }

private:
    double mean_, stddev_;
    std::optional<std::uint32_t> seed_;
};

/// @brief Keras' `VarianceScaling(scale=1, mode="fan_in", distribution="truncated_normal", seed=None)`:
/// with n the fan of `mode` (fan_in, fan_out, or their mean "fan_avg"; see detail::compute_fans), at least
/// 1, "uniform" draws U(-l, l) with l = sqrt(3 scale / n); "truncated_normal" a truncated normal of
/// stddev sqrt(scale / n) / 0.87962566103423978 (the stddev of N(0, 1) truncated at 2, so that the
/// values' variance is scale / n); "untruncated_normal" N(0, scale / n).
class VarianceScaling : public Initializer {
public:
    /// @throws InvalidArgumentError for a scale that is not a finite number > 0, a mode other than
    /// "fan_in", "fan_out" or "fan_avg", a distribution other than "truncated_normal", "untruncated_normal"
    /// or "uniform" ("normal" is Keras' old name of "truncated_normal"):
    /// `pss: VarianceScaling: mode is "fan"; it is "fan_in", "fan_out" or "fan_avg"`
    explicit VarianceScaling(double scale = 1.0, std::string_view mode = "fan_in",
                             std::string_view distribution = "truncated_normal",
                             std::optional<std::uint32_t> seed = std::nullopt)
        : scale_(scale), mode_(mode), distribution_(distribution == "normal" ? "truncated_normal" : distribution),
          seed_(seed) {
        if (auto problem = arguments_problem(scale, mode, distribution))
            throw InvalidArgumentError("pss: VarianceScaling: " + *problem);
    }
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    [[nodiscard]] double scale() const noexcept { return scale_; }
    [[nodiscard]] const std::string& mode() const noexcept { return mode_; }
    [[nodiscard]] const std::string& distribution() const noexcept { return distribution_; }
    [[nodiscard]] std::optional<std::uint32_t> seed() const noexcept { return seed_; }
    /// @brief `{"scale": 1.0, "mode": "fan_in", "distribution": "truncated_normal", "seed": null}`
    [[nodiscard]] nlohmann::json get_config() const override {
        return {{"scale", scale_}, {"mode", mode_}, {"distribution", distribution_}, {"seed", detail::seed_json(seed_)}};
    }
    [[nodiscard]] PSS_INLINE Tensor operator()(const Shape& shape, DType dtype, std::mt19937& rng) const override;
    /// @brief The distribution with its limit or stddev computed from the fans of the whole `shape`.
    [[nodiscard]] std::optional<InitializerSpec> spec(const Shape& shape, std::uint64_t seed) const override {
        InitializerSpec out = resolved(shape);
        out.seed = detail::own_or(seed_, seed);
        return out;
    }

    /// What is wrong with these arguments, if anything (for the constructor and the config parser).
    [[nodiscard]] static std::optional<std::string> arguments_problem(double scale, std::string_view mode,
                                                                      std::string_view distribution) {
        if (!(scale > 0) || !std::isfinite(scale))
            return "scale is " + detail::number_text(scale) + "; it is a finite number > 0";
        if (mode != "fan_in" && mode != "fan_out" && mode != "fan_avg")
            return "mode is " + detail::json_text(std::string(mode)) + "; it is \"fan_in\", \"fan_out\" or \"fan_avg\"";
        if (distribution != "truncated_normal" && distribution != "untruncated_normal" && distribution != "uniform" &&
            distribution != "normal")
            return "distribution is " + detail::json_text(std::string(distribution)) +
                   "; it is \"truncated_normal\", \"untruncated_normal\" or \"uniform\"";
        return std::nullopt;
    }

private:
    /// The distribution for `shape` (its seed unset): U(-l, l), N(0, s^2) or the truncated normal.
    [[nodiscard]] InitializerSpec resolved(const Shape& shape) const {
        const auto fans = detail::compute_fans(shape);
        const double n = std::max(1.0, mode_ == "fan_in"    ? fans.first
                                       : mode_ == "fan_out" ? fans.second
                                                            : (fans.first + fans.second) / 2.0);
        // (3 scale) / n in one rounding: GlorotUniform's limit is bit for bit sqrt(6 / (fan_in + fan_out)).
        if (distribution_ == "uniform") return InitializerSpec::random_uniform(-std::sqrt(3.0 * scale_ / n), std::sqrt(3.0 * scale_ / n), 0);
        if (distribution_ == "untruncated_normal") return InitializerSpec::random_normal(0.0, std::sqrt(scale_ / n), 0);
        return InitializerSpec::truncated_normal(0.0, std::sqrt(scale_ / n) / 0.87962566103423978, 0);
    }

    double scale_;
    std::string mode_, distribution_;
    std::optional<std::uint32_t> seed_;
};

/// @brief Keras' `GlorotUniform(seed=None)` ("glorot_uniform", Dense's default kernel): U(-l, l) with
/// l = sqrt(6 / (fan_in + fan_out)), VarianceScaling(1, "fan_avg", "uniform").
class GlorotUniform final : public VarianceScaling {
public:
    explicit GlorotUniform(std::optional<std::uint32_t> seed = std::nullopt)
        : VarianceScaling(1.0, "fan_avg", "uniform", seed) {}
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    /// @brief `{"seed": null}`
    [[nodiscard]] nlohmann::json get_config() const override { return {{"seed", detail::seed_json(seed())}}; }
};

/// @brief Keras' `GlorotNormal(seed=None)`: a truncated normal of stddev sqrt(2 / (fan_in + fan_out)) /
/// 0.87962566103423978, VarianceScaling(1, "fan_avg", "truncated_normal").
class GlorotNormal final : public VarianceScaling {
public:
    explicit GlorotNormal(std::optional<std::uint32_t> seed = std::nullopt)
        : VarianceScaling(1.0, "fan_avg", "truncated_normal", seed) {}
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    /// @brief `{"seed": null}`
    [[nodiscard]] nlohmann::json get_config() const override { return {{"seed", detail::seed_json(seed())}}; }
};

/// @brief Keras' `HeNormal(seed=None)`: a truncated normal of stddev sqrt(2 / fan_in) /
/// 0.87962566103423978, VarianceScaling(2, "fan_in", "truncated_normal").
class HeNormal final : public VarianceScaling {
public:
    explicit HeNormal(std::optional<std::uint32_t> seed = std::nullopt)
        : VarianceScaling(2.0, "fan_in", "truncated_normal", seed) {}
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    /// @brief `{"seed": null}`
    [[nodiscard]] nlohmann::json get_config() const override { return {{"seed", detail::seed_json(seed())}}; }
};

/// @brief Keras' `HeUniform(seed=None)`: U(-l, l) with l = sqrt(6 / fan_in), VarianceScaling(2, "fan_in",
/// "uniform").
class HeUniform final : public VarianceScaling {
public:
    explicit HeUniform(std::optional<std::uint32_t> seed = std::nullopt)
        : VarianceScaling(2.0, "fan_in", "uniform", seed) {}
    [[nodiscard]] PSS_INLINE std::string_view class_name() const noexcept override;  // the key function
    /// @brief `{"seed": null}`
    [[nodiscard]] nlohmann::json get_config() const override { return {{"seed", detail::seed_json(seed())}}; }
};

/// @brief The initializer Keras names `name`, with Keras' defaults: "glorot_uniform", "glorot_normal",
/// "he_normal", "he_uniform", "zeros" (or "zero"), "ones" (or "one"), "constant", "random_normal" (or
/// "normal"), "random_uniform" (or "uniform"), "truncated_normal", "variance_scaling", or a class name
/// ("GlorotUniform", ...).
/// @throws InvalidArgumentError `pss: initializer "xavier" is not known; use "glorot_uniform", ...`
[[nodiscard]] PSS_INLINE std::shared_ptr<const Initializer> get(std::string_view name);

/// @brief Keras' `tf.keras.initializers.serialize(initializer)`: `{"class_name": "GlorotUniform",
/// "config": {"seed": null}}`.
[[nodiscard]] inline nlohmann::json serialize(const Initializer& initializer) {
    return {{"class_name", std::string(initializer.class_name())}, {"config", initializer.get_config()}};
}

}  // namespace initializers

namespace detail {
/// Parses serialize(initializer); `where` names it in messages (`Dense "kernel_initializer"`).
/// @throws InvalidArgumentError naming the field and its value.
[[nodiscard]] PSS_INLINE std::shared_ptr<const initializers::Initializer> parse_initializer_config(
    const nlohmann::json& serialized, const std::string& where);
}  // namespace detail

namespace initializers {
/// @brief The initializer serialize(initializer) describes, as a worker process rebuilds a layer. Every
/// field is checked (the config may come from the network): exactly the fields get_config() gives, each
/// of its type and in its range; a seed is null or a whole number below 2^32.
/// @throws InvalidArgumentError naming the field and its value:
/// `pss: initializer {"class_name":"Xavier","config":{}}: "class_name" is "Xavier"; the initializers are ...`
[[nodiscard]] inline std::shared_ptr<const Initializer> from_config(const nlohmann::json& serialized) {
    return detail::parse_initializer_config(serialized, "initializer");
}
}  // namespace initializers

/// @brief An initializer of a layer's options: a Keras name (`"he_normal"`, resolved at once by
/// initializers::get) or any pss::initializers object (`pss::initializers::Constant(0.5)`), held by value
/// and shared by the copies of the layer.
class AnyInitializer {
public:
    /// @throws InvalidArgumentError for a name initializers::get does not know.
    AnyInitializer(const char* name) : AnyInitializer(std::string_view(name)) {}  // NOLINT: implicit by design
    AnyInitializer(const std::string& name) : AnyInitializer(std::string_view(name)) {}  // NOLINT
    AnyInitializer(std::string_view name) : initializer_(initializers::get(name)) {}  // NOLINT
    template <std::derived_from<initializers::Initializer> I>
    AnyInitializer(I initializer) : initializer_(std::make_shared<I>(std::move(initializer))) {}  // NOLINT
    /// @throws InvalidArgumentError for a null pointer.
    AnyInitializer(std::shared_ptr<const initializers::Initializer> initializer)  // NOLINT
        : initializer_(std::move(initializer)) {
        if (!initializer_) throw InvalidArgumentError("pss: an initializer is a null shared_ptr; give a name or an object");
    }

    [[nodiscard]] const initializers::Initializer& get() const noexcept { return *initializer_; }
    [[nodiscard]] const initializers::Initializer* operator->() const noexcept { return initializer_.get(); }
    /// @brief The initializer's values (see initializers::Initializer::operator()).
    [[nodiscard]] Tensor operator()(const Shape& shape, DType dtype, std::mt19937& rng) const {
        return (*initializer_)(shape, dtype, rng);
    }

private:
    std::shared_ptr<const initializers::Initializer> initializer_;
};

// ---- implementation ------------------------------------------------------------------------------

namespace detail {
/// Calls `f(generator)` with `rng`, or with a fresh std::mt19937(*seed) when there is a seed.
template <class F>
decltype(auto) with_generator(std::optional<std::uint32_t> seed, std::mt19937& rng, F&& f) {
    if (!seed) return f(rng);
    std::mt19937 own(*seed);
    return f(own);
}

/// Every name initializers::get knows with its class name, Keras' aliases last.
inline constexpr std::array<std::pair<std::string_view, std::string_view>, 15> initializer_names{{
    {"glorot_uniform", "GlorotUniform"},
    {"glorot_normal", "GlorotNormal"},
    {"he_normal", "HeNormal"},
    {"he_uniform", "HeUniform"},
    {"zeros", "Zeros"},
    {"ones", "Ones"},
    {"constant", "Constant"},
    {"random_normal", "RandomNormal"},
    {"random_uniform", "RandomUniform"},
    {"truncated_normal", "TruncatedNormal"},
    {"variance_scaling", "VarianceScaling"},
    {"zero", "Zeros"},
    {"one", "Ones"},
    {"normal", "RandomNormal"},
    {"uniform", "RandomUniform"},
}};

/// An initializer of class `class_name` with Keras' defaults, or null for another name.
inline std::shared_ptr<const initializers::Initializer> default_initializer(std::string_view class_name) {
    using namespace initializers;
    if (class_name == "GlorotUniform") return std::make_shared<GlorotUniform>();
    if (class_name == "GlorotNormal") return std::make_shared<GlorotNormal>();
    if (class_name == "HeNormal") return std::make_shared<HeNormal>();
    if (class_name == "HeUniform") return std::make_shared<HeUniform>();
    if (class_name == "Zeros") return std::make_shared<Zeros>();
    if (class_name == "Ones") return std::make_shared<Ones>();
    if (class_name == "Constant") return std::make_shared<Constant>();
    if (class_name == "RandomNormal") return std::make_shared<RandomNormal>();
    if (class_name == "RandomUniform") return std::make_shared<RandomUniform>();
    if (class_name == "TruncatedNormal") return std::make_shared<TruncatedNormal>();
    if (class_name == "VarianceScaling") return std::make_shared<VarianceScaling>();
    return nullptr;
}

/// A finite number field.
inline double take_finite_number(ConfigFields& fields, const std::string& key) {
    const nlohmann::json& value = fields.take(key);
    if (!value.is_number() || !std::isfinite(value.get<double>()))
        fields.fail("\"" + key + "\" is " + json_text(value) + ", not a finite number");
    return value.get<double>();
}

/// A seed field: null, or a whole number in [0, 2^32 - 1] (a std::mt19937's seed).
inline std::optional<std::uint32_t> take_seed(ConfigFields& fields, const std::string& key) {
    const nlohmann::json& value = fields.take(key);
    if (value.is_null()) return std::nullopt;
    if (!value.is_number_unsigned() || value.get<std::uint64_t>() > 0xffffffffULL)
        fields.fail("\"" + key + "\" is " + json_text(value) + "; it is null or a whole number in [0, 4294967295]");
    return static_cast<std::uint32_t>(value.get<std::uint64_t>());
}
}  // namespace detail

#if PSS_DEFINITIONS
PSS_INLINE initializers::Initializer::~Initializer() = default;

namespace initializers {
PSS_INLINE std::string_view Zeros::class_name() const noexcept { return "Zeros"; }
PSS_INLINE std::string_view Ones::class_name() const noexcept { return "Ones"; }
PSS_INLINE std::string_view Constant::class_name() const noexcept { return "Constant"; }
PSS_INLINE std::string_view RandomUniform::class_name() const noexcept { return "RandomUniform"; }
PSS_INLINE std::string_view RandomNormal::class_name() const noexcept { return "RandomNormal"; }
PSS_INLINE std::string_view TruncatedNormal::class_name() const noexcept { return "TruncatedNormal"; }
PSS_INLINE std::string_view VarianceScaling::class_name() const noexcept { return "VarianceScaling"; }
PSS_INLINE std::string_view GlorotUniform::class_name() const noexcept { return "GlorotUniform"; }
PSS_INLINE std::string_view GlorotNormal::class_name() const noexcept { return "GlorotNormal"; }
PSS_INLINE std::string_view HeNormal::class_name() const noexcept { return "HeNormal"; }
PSS_INLINE std::string_view HeUniform::class_name() const noexcept { return "HeUniform"; }

PSS_INLINE Tensor RandomUniform::operator()(const Shape& shape, DType dtype, std::mt19937& rng) const {
    return detail::with_generator(seed_, rng, [&](std::mt19937& g) {
        return detail::fill_tensor(shape, dtype, "RandomUniform", [&] { return detail::uniform(g, minval_, maxval_); });
    });
}

PSS_INLINE Tensor RandomNormal::operator()(const Shape& shape, DType dtype, std::mt19937& rng) const {
    return detail::with_generator(seed_, rng, [&](std::mt19937& g) {
        return detail::fill_tensor(shape, dtype, "RandomNormal",
                                   [&] { return mean_ + stddev_ * detail::standard_normal(g); });
    });
}

PSS_INLINE Tensor TruncatedNormal::operator()(const Shape& shape, DType dtype, std::mt19937& rng) const {
    return detail::with_generator(seed_, rng, [&](std::mt19937& g) {
        return detail::fill_tensor(shape, dtype, "TruncatedNormal",
                                   [&] { return mean_ + stddev_ * detail::truncated_standard_normal(g); });
    });
}

PSS_INLINE Tensor VarianceScaling::operator()(const Shape& shape, DType dtype, std::mt19937& rng) const {
    const InitializerSpec spec = resolved(shape);
    const std::string who(class_name());
    return detail::with_generator(seed_, rng, [&](std::mt19937& g) {
        if (spec.kind == InitializerKind::random_uniform)
            return detail::fill_tensor(shape, dtype, who, [&] { return detail::uniform(g, spec.first, spec.second); });
        if (spec.kind == InitializerKind::random_normal)
            return detail::fill_tensor(shape, dtype, who, [&] { return spec.second * detail::standard_normal(g); });
        return detail::fill_tensor(shape, dtype, who, [&] { return spec.second * detail::truncated_standard_normal(g); });
    });
}

PSS_INLINE std::shared_ptr<const Initializer> get(std::string_view name) {
    for (const auto& [snake, cls] : detail::initializer_names)
        if (name == snake || name == cls) return detail::default_initializer(cls);
    throw InvalidArgumentError("pss: initializer " + detail::json_text(std::string(name)) +
                               " is not known; use \"glorot_uniform\", \"glorot_normal\", \"he_normal\", "
                               "\"he_uniform\", \"zeros\", \"ones\", \"constant\", \"random_normal\", "
                               "\"random_uniform\" (or \"uniform\"), \"truncated_normal\" or \"variance_scaling\", "
                               "or pass a pss::initializers object");
}
}  // namespace initializers

namespace detail {
PSS_INLINE std::shared_ptr<const initializers::Initializer> parse_initializer_config(const nlohmann::json& serialized,
                                                                                     const std::string& where) {
    using namespace initializers;
    ConfigFields outer(where, serialized, "class_name and config");
    const std::string cls = outer.take_string("class_name");
    const nlohmann::json& config = outer.take("config");
    outer.finish();
    const std::string what = where + " " + cls + " config";
    std::shared_ptr<const Initializer> out;
    if (cls == "Zeros" || cls == "Ones") {
        ConfigFields fields(what, config, "no fields");
        fields.finish();
        out = default_initializer(cls);
    } else if (cls == "Constant") {
        ConfigFields fields(what, config, "value");
        const double value = take_finite_number(fields, "value");
        fields.finish();
        out = std::make_shared<Constant>(value);
    } else if (cls == "RandomUniform") {
        ConfigFields fields(what, config, "minval, maxval and seed");
        const double minval = take_finite_number(fields, "minval");
        const double maxval = take_finite_number(fields, "maxval");
        const auto seed = take_seed(fields, "seed");
        fields.finish();
        if (auto problem = RandomUniform::bounds_problem(minval, maxval)) fields.fail(*problem);
        out = std::make_shared<RandomUniform>(minval, maxval, seed);
    } else if (cls == "RandomNormal" || cls == "TruncatedNormal") {
        ConfigFields fields(what, config, "mean, stddev and seed");
        const double mean = take_finite_number(fields, "mean");
        const double stddev = take_finite_number(fields, "stddev");
        const auto seed = take_seed(fields, "seed");
        fields.finish();
        if (auto problem = RandomNormal::normal_problem(mean, stddev)) fields.fail(*problem);
        if (cls == "RandomNormal") out = std::make_shared<RandomNormal>(mean, stddev, seed);
        else out = std::make_shared<TruncatedNormal>(mean, stddev, seed);
    } else if (cls == "VarianceScaling") {
        ConfigFields fields(what, config, "scale, mode, distribution and seed");
        const double scale = take_finite_number(fields, "scale");
        const std::string mode = fields.take_string("mode");
        const std::string distribution = fields.take_string("distribution");
        const auto seed = take_seed(fields, "seed");
        fields.finish();
        if (auto problem = VarianceScaling::arguments_problem(scale, mode, distribution)) fields.fail(*problem);
        out = std::make_shared<VarianceScaling>(scale, mode, distribution, seed);
    } else if (cls == "GlorotUniform" || cls == "GlorotNormal" || cls == "HeNormal" || cls == "HeUniform") {
        ConfigFields fields(what, config, "seed");
        const auto seed = take_seed(fields, "seed");
        fields.finish();
        if (cls == "GlorotUniform") out = std::make_shared<GlorotUniform>(seed);
        else if (cls == "GlorotNormal") out = std::make_shared<GlorotNormal>(seed);
        else if (cls == "HeNormal") out = std::make_shared<HeNormal>(seed);
        else out = std::make_shared<HeUniform>(seed);
    } else {
        outer.fail("\"class_name\" is " + json_text(cls) +
                   "; the initializers are \"GlorotUniform\", \"GlorotNormal\", \"HeNormal\", \"HeUniform\", "
                   "\"Zeros\", \"Ones\", \"Constant\", \"RandomNormal\", \"RandomUniform\", \"TruncatedNormal\" "
                   "and \"VarianceScaling\"");
    }
    return out;
}
}  // namespace detail
#endif

PSS_NAMESPACE_END
