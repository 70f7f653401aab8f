// pss/keras/config.hpp: reading Keras configs (get_config() as JSON) that may come from a peer: every fault is an InvalidArgumentError naming the field and its value.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// The largest count (units, dimension, ...) a config may give: 2^48, far above any real layer, and
/// low enough that sums and products of two of them cannot overflow.
inline constexpr std::uint64_t config_count_limit = std::uint64_t{1} << 48;
/// The largest number of elements a shape in a config may have: 2^62.
inline constexpr std::uint64_t config_elements_limit = std::uint64_t{1} << 62;
/// The largest rank of a shape in a config.
inline constexpr std::size_t config_rank_limit = 32;

/// `value` as JSON text for an error message: ASCII only (other characters as \uXXXX, invalid UTF-8
/// replaced, so dumping never throws), at most 200 bytes, then its length.
inline std::string json_text(const nlohmann::json& value) {
    constexpr std::size_t shown = 200;
    std::string text = value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
    if (text.size() > shown) {
        const std::size_t size = text.size();
        text.resize(shown);
        text += "... (" + std::to_string(size) + " bytes, the first 200 shown)";
    }
    return text;
}

/// The fields of one JSON object of a config (a layer's or loss's `config`, or the object around it),
/// taken by name with their types checked; finish() rejects a field that was not taken. Every fault
/// throws `pss: <what> <the object as JSON>: <problem>`, the problem naming the field and its value.
class ConfigFields {
public:
    /// @param what names the object in messages: "Dense config", "layer"
    /// @param fields the fields a complete object has, for messages: "name, units and dtype"
    /// @throws InvalidArgumentError when `object` is not a JSON object.
    ConfigFields(std::string what, const nlohmann::json& object, std::string fields)
        : what_(std::move(what)), object_(object), fields_(std::move(fields)) {
        if (!object.is_object())
            fail("it is " + std::string(object.type_name()) + ", not an object with " + fields_);
    }

    /// The value of field `key`. @throws InvalidArgumentError when there is no such field.
    [[nodiscard]] const nlohmann::json& take(const std::string& key) {
        const auto it = object_.find(key);
        if (it == object_.end()) fail("the field \"" + key + "\" is missing; it has " + fields_);
        taken_.push_back(key);
        return *it;
    }

    [[nodiscard]] std::string take_string(const std::string& key) {
        const nlohmann::json& value = take(key);
        if (!value.is_string()) fail("\"" + key + "\" is " + json_text(value) + ", not a string");
        return value.get<std::string>();
    }

    [[nodiscard]] bool take_bool(const std::string& key) {
        const nlohmann::json& value = take(key);
        if (!value.is_boolean()) fail("\"" + key + "\" is " + json_text(value) + ", not true or false");
        return value.get<bool>();
    }

    /// A whole number in [min, 2^48].
    [[nodiscard]] std::uint64_t take_count(const std::string& key, std::uint64_t min) {
        return count(key, take(key), min);
    }

    /// "float32" or "float64": the dtypes a layer's weights can have.
    [[nodiscard]] DType take_float_dtype(const std::string& key) {
        const nlohmann::json& value = take(key);
        if (value == "float32") return DType::float32;
        if (value == "float64") return DType::float64;
        fail("\"" + key + "\" is " + json_text(value) + "; a layer's dtype is \"float32\" or \"float64\"");
    }

    /// Keras' `batch_input_shape`: `[null, 3]`, the batch axis first and unknown (null), then at most 32
    /// whole numbers up to 2^48 with at most 2^62 elements in all. Returns the shape without the batch axis.
    [[nodiscard]] Shape take_batch_input_shape(const std::string& key) {
        const nlohmann::json& value = take(key);
        if (!value.is_array() || value.empty() || !value.front().is_null())
            fail("\"" + key + "\" is " + json_text(value) +
                 ", not a batch input shape: a list whose first item (the batch axis) is null, such as [null, 3]");
        if (value.size() > config_rank_limit + 1)
            fail("\"" + key + "\" is " + json_text(value) + ", more than " + std::to_string(config_rank_limit) +
                 " axes after the batch axis");
        Shape shape;
        std::uint64_t elements = 1;
        for (std::size_t i = 1; i < value.size(); ++i) {
            const std::uint64_t d = count(key + "[" + std::to_string(i) + "]", value[i], 0);
            if (d != 0 && elements > config_elements_limit / d)
                fail("\"" + key + "\" is " + json_text(value) + ", more than 2^62 elements");
            elements *= d;
            shape.push_back(static_cast<std::size_t>(d));
        }
        return shape;
    }

    /// @throws InvalidArgumentError naming the first field that was not taken.
    void finish() const {
        for (const auto& [key, value] : object_.items())
            if (std::find(taken_.begin(), taken_.end(), key) == taken_.end())
                fail("the field " + json_text(key) + " is not known; it has " + fields_);
    }

    /// @throws InvalidArgumentError `pss: <what> <object>: <problem>`
    [[noreturn]] void fail(const std::string& problem) const {
        throw InvalidArgumentError("pss: " + what_ + " " + json_text(object_) + ": " + problem);
    }

private:
    std::uint64_t count(const std::string& key, const nlohmann::json& value, std::uint64_t min) const {
        if (value.is_number_unsigned()) {
            const auto n = value.get<std::uint64_t>();
            if (n > config_count_limit) fail("\"" + key + "\" is " + json_text(value) + ", more than 2^48");
            if (n < min) fail("\"" + key + "\" is " + json_text(value) + "; it is at least " + std::to_string(min));
            return n;
        }
        if (value.is_number_integer())  // signed: negative here
            fail("\"" + key + "\" is " + json_text(value) + "; it is at least " + std::to_string(min));
        fail("\"" + key + "\" is " + json_text(value) + ", not a whole number");
    }

    std::string what_;
    const nlohmann::json& object_;
    std::string fields_;
    std::vector<std::string> taken_;
};

/// Parses `text`, a config a peer sent, as JSON.
/// @throws InvalidArgumentError `pss: <what> is not JSON: <the parser's message>`
[[nodiscard]] inline nlohmann::json parse_config_text(std::string_view text, const std::string& what) {
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw InvalidArgumentError("pss: " + what + " is not JSON: " + e.what());
    }
}

}  // namespace detail

PSS_NAMESPACE_END
