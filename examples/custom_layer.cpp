// A layer of the user's own on a cluster: Scale (y = x * scale + offset per feature, both trainable),
// written against pss::Layer, registered with pss::register_layer, and trained under a Dense layer by 2
// workers, synchronously. Alone it runs the embedded cluster; under `pss-launch --ps 2 --workers 2` each
// task is a process, and a worker process, which receives the model as Keras configs (serialize(layer)),
// rebuilds Scale through the registry: the output is the same.
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <pss/keras.hpp>

namespace {

/// y = x * scale + offset, one scale and one offset per feature (the last axis); scale starts at ones,
/// offset at zeros. Its weights are "<name>/scale" and "<name>/offset", in its dtype (float32 or float64).
class Scale final : public pss::Layer {
public:
    explicit Scale(pss::DType dtype = pss::DType::float32) : dtype_(dtype) {}

    // What every layer implements.
    [[nodiscard]] std::unique_ptr<pss::Layer> clone() const override { return std::make_unique<Scale>(*this); }
    [[nodiscard]] std::string_view class_name() const noexcept override { return "Scale"; }
    [[nodiscard]] std::vector<pss::Variable> weights() const override {
        if (!built()) return {};
        return {scale_, offset_};
    }
    [[nodiscard]] pss::Shape compute_output_shape(const pss::Shape& input_shape) const override {
        check_input_shape(input_shape);
        return input_shape;
    }
    pss::Tensor forward(pss::Tensor inputs, std::uint64_t step) override {
        require_built("forward");
        if (dtype_ == pss::DType::float64) return forward_as<double>(std::move(inputs), step);
        return forward_as<float>(std::move(inputs), step);
    }
    pss::LayerGradients backward(const pss::Tensor& grad_outputs) override {
        require_built("backward");
        if (dtype_ == pss::DType::float64) return backward_as<double>(grad_outputs);
        return backward_as<float>(grad_outputs);
    }

    // What a worker process needs: the layer's own parameters (Layer::get_config gives its name and
    // input shape), Keras' from_config reading them back, and do_bind taking the coordinator's variables.
    [[nodiscard]] nlohmann::json get_config() const override {
        nlohmann::json config = pss::Layer::get_config();
        config["dtype"] = std::string(pss::dtype_name(dtype_));
        return config;
    }
    /// @throws std::exception for a config that is not {"dtype": "float32" or "float64"}: the rebuild
    /// reports it as an InvalidArgumentError naming the class and the config.
    static Scale from_config(const nlohmann::json& config) {
        if (config.size() != 1) throw std::invalid_argument("Scale's config has one field, \"dtype\"");
        const std::string dtype = config.at("dtype").get<std::string>();
        if (dtype == "float32") return Scale(pss::DType::float32);
        if (dtype == "float64") return Scale(pss::DType::float64);
        throw std::invalid_argument("Scale's dtype is \"float32\" or \"float64\", not \"" + dtype + "\"");
    }

protected:
    pss::Shape do_build(const pss::Shape& input_shape, std::mt19937& rng) override {
        check_input_shape(input_shape);
        const pss::Shape features{input_shape.back()};
        scale_ = pss::Variable(pss::initializers::Ones()(features, dtype_, rng), name() + "/scale");
        offset_ = pss::Variable(pss::initializers::Zeros()(features, dtype_, rng), name() + "/offset");
        return input_shape;
    }
    pss::Shape do_bind(const pss::Shape& input_shape, std::vector<pss::Variable> weights) override {
        check_input_shape(input_shape);
        const pss::Shape features{input_shape.back()};
        check_bind_weights(weights, {{"scale", features, dtype_}, {"offset", features, dtype_}});
        scale_ = std::move(weights[0]);
        offset_ = std::move(weights[1]);
        return input_shape;
    }

private:
    void check_input_shape(const pss::Shape& input_shape) const {
        if (input_shape.empty() || input_shape.back() == 0)
            throw pss::InvalidArgumentError("pss: " + describe() + ": input shape " + pss::format_shape(input_shape) +
                                            "; a Scale layer needs a last axis of at least 1 feature");
    }

    template <class T>
    static xt::xarray<T> as(const pss::Tensor& tensor) {
        return tensor.visit([](const auto& a) { return xt::xarray<T>(xt::cast<T>(a)); }, xt::xarray<T>());
    }

    template <class T>
    pss::Tensor forward_as(pss::Tensor&& inputs, std::uint64_t step) {
        xt::xarray<T>& x = inputs_of<T>();
        x = as<T>(inputs);
        xt::xarray<T> scale, offset;
        scale_.read_into(scale, step);  // pulled from the ps tasks (naming the step when synchronous)
        offset_.read_into(offset, step);
        scale_values_of<T>() = scale;
        const std::size_t features = scale.size();
        xt::xarray<T> y = xt::xarray<T>::from_shape(x.shape());
        for (std::size_t i = 0; i < x.size(); ++i) y.data()[i] = x.data()[i] * scale(i % features) + offset(i % features);
        return pss::Tensor(std::move(y));
    }

    template <class T>
    pss::LayerGradients backward_as(const pss::Tensor& grad_outputs) {
        const xt::xarray<T>& x = inputs_of<T>();
        const xt::xarray<T>& scale = scale_values_of<T>();
        const xt::xarray<T> g = as<T>(grad_outputs);
        if (g.shape() != x.shape())
            throw pss::InvalidArgumentError("pss: " + describe() + ": the output gradient's shape differs from the outputs'");
        const std::size_t features = scale.size();
        xt::xarray<T> gx = xt::xarray<T>::from_shape(x.shape());
        xt::xarray<T> gscale = xt::zeros<T>({features});
        xt::xarray<T> goffset = xt::zeros<T>({features});
        for (std::size_t i = 0; i < x.size(); ++i) {
            const std::size_t j = i % features;
            gx.data()[i] = g.data()[i] * scale(j);
            gscale(j) += g.data()[i] * x.data()[i];
            goffset(j) += g.data()[i];
        }
        pss::LayerGradients out;
        out.inputs = pss::Tensor(std::move(gx));
        out.variables.push_back({scale_, pss::Tensor(std::move(gscale)), {}, false});
        out.variables.push_back({offset_, pss::Tensor(std::move(goffset)), {}, false});
        return out;
    }

    // What forward keeps for backward, in the layer's dtype.
    template <class T>
    xt::xarray<T>& inputs_of() {
        if constexpr (std::is_same_v<T, float>) return inputs32_;
        else return inputs64_;
    }
    template <class T>
    xt::xarray<T>& scale_values_of() {
        if constexpr (std::is_same_v<T, float>) return scale32_;
        else return scale64_;
    }

    pss::DType dtype_;
    pss::Variable scale_, offset_;
    xt::xarray<float> inputs32_, scale32_;
    xt::xarray<double> inputs64_, scale64_;
};

// Every process of the program registers Scale before main: worker processes rebuild it by this name.
const auto scale_registration = pss::register_layer<Scale>("Scale");

}  // namespace

int main() {
    // Synchronous: each step's update is the mean of both workers' gradients, so the output is the same
    // on every run, embedded or launched.
    pss::ClusterStrategy<pss::FixedShardsPartitioner, pss::SGD, pss::Synchronous> strategy(
        {}, pss::FixedShardsPartitioner(2), pss::SGD(0.1));
    if (!strategy.is_chief()) {
        strategy.join();  // a ps or worker process serves until the chief ends the cluster
        return 0;
    }

    // 32 examples of 3 features; the target is 2 x0 - x1 + 0.5 x2 + 1.
    xt::xarray<float> x = xt::xarray<float>::from_shape({32, 3});
    xt::xarray<float> y = xt::xarray<float>::from_shape({32, 1});
    for (std::size_t i = 0; i < 32; ++i) {
        x(i, 0) = static_cast<float>(i % 4) * 0.5f - 0.75f;
        x(i, 1) = static_cast<float>((i * 5) % 8) * 0.25f - 1.0f;
        x(i, 2) = static_cast<float>((i * 3) % 7) * 0.3f - 0.9f;
        y(i, 0) = 2 * x(i, 0) - x(i, 1) + 0.5f * x(i, 2) + 1;
    }

    pss::Sequential model(strategy, {Scale(), pss::Dense(1)}, /*seed=*/3);
    model.build({3});
    model.compile(pss::MeanSquaredError());  // the ps tasks apply the strategy's SGD(0.1)
    std::cout << "registered layer class " << scale_registration.class_name() << "\n";

    auto history = model.fit(x, y, /*epochs=*/6, /*batch_size=*/8, /*shuffle=*/true, /*verbose=*/false);
    for (std::size_t e = 0; e < history.loss.size(); ++e)
        std::cout << "epoch " << e + 1 << " loss " << std::fixed << std::setprecision(6) << history.loss[e] << "\n";

    for (const auto& layer : model.layers()) {
        const auto variables = layer->weights();
        const auto values = layer->get_weights();
        for (std::size_t i = 0; i < variables.size(); ++i) {
            std::cout << variables[i].name() << " " << pss::format_shape(variables[i].shape()) << ":";
            for (float v : values[i].get<float>()) std::cout << " " << std::setprecision(4) << v;
            std::cout << "\n";
        }
    }
    strategy.join();
}
