// pss/function.hpp: functions registered by name, and the values that cross a wire as their arguments and results.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/detail/json_text.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/partitioner/shard_rows.hpp>
#include <pss/tensor.hpp>
#include <pss/variable.hpp>

PSS_NAMESPACE_BEGIN

template <class T>
class PerWorkerValues;

namespace detail {
template <class T>
struct is_transferable : std::bool_constant<std::is_arithmetic_v<T> || std::same_as<T, std::string> ||
                                            std::same_as<T, Tensor> || std::same_as<T, Variable>> {};
template <Element T>
struct is_transferable<xt::xarray<T>> : std::true_type {};
template <class T>
struct is_transferable<std::vector<T>> : is_transferable<T> {};
template <class T>
struct is_transferable<PerWorkerValues<T>> : std::true_type {};  // each process holds its own worker's value
}  // namespace detail

/// @brief A value that can be an argument or result of a function scheduled on another process: a number,
/// a std::string, a Tensor, an xt::xarray of an Element type, a Variable (its handle: the worker reaches
/// the same shards), a PerWorkerValues (resolved on the worker; embedded cluster only for now), or a
/// std::vector of these.
template <class T>
concept Transferable = detail::is_transferable<std::remove_cvref_t<T>>::value;

namespace detail {

/// What decoding needs in the process that runs a call: how its Variables reach the ps tasks.
struct CallContext {
    std::shared_ptr<Channel> channel;
    int worker = -1;
};

/// Builds the Values of a call or of its answer: each value a CBOR item, each tensor a reference
/// (`{"tensor": i}`) to the i-th of `tensors`, which travel beside the CBOR, never inside it.
struct ValuesWriter {
    std::vector<Tensor> tensors;

    nlohmann::json tensor(Tensor t) {
        if (!t.has_value()) return {{"tensor", nullptr}};
        tensors.push_back(std::move(t));
        return {{"tensor", tensors.size() - 1}};
    }
    /// The Values of `items` (a CBOR array).
    Values finish(const nlohmann::json& items) {
        return Values{nlohmann::json::to_cbor(items), std::move(tensors)};
    }
};

/// Refuses CBOR nested deeper than `max_depth` before a tree is built: nlohmann's CBOR reader recurses
/// once per level, and a peer's 1 MiB of nested arrays would otherwise overflow the stack.
class CborDepthCheck final : public nlohmann::json_sax<nlohmann::json> {
public:
    static constexpr std::size_t max_depth = 64;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return ++depth_ <= max_depth; }
    bool key(string_t&) override { return true; }
    bool end_object() override { return --depth_, true; }
    bool start_array(std::size_t) override { return ++depth_ <= max_depth; }
    bool end_array() override { return --depth_, true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
        error_ = e.what();
        return false;
    }
    [[nodiscard]] bool too_deep() const noexcept { return depth_ > max_depth; }
    [[nodiscard]] const std::string& error() const noexcept { return error_; }

private:
    std::size_t depth_ = 0;
    std::string error_;
};

/// Reads Values a peer sent: the CBOR must be an array, each item of the type the function takes; each
/// tensor reference names a tensor that came with the values, once.
class ValuesReader {
public:
    ValuesReader(Values&& values, std::string what, CallContext context)
        : what_(std::move(what)), context_(std::move(context)), tensors_(std::move(values.tensors)), taken_(tensors_.size(), false) {
        CborDepthCheck check;
        const bool sound = nlohmann::json::sax_parse(values.cbor, &check, nlohmann::json::input_format_t::cbor);
        if (check.too_deep()) fail("they nest deeper than " + std::to_string(CborDepthCheck::max_depth) + " levels");
        if (!sound) fail("they are not CBOR (" + check.error() + ")");
        items_ = nlohmann::json::from_cbor(values.cbor);
        if (!items_.is_array()) fail(std::string("they are ") + items_.type_name() + ", not an array of values");
    }
    /// The next value; failing when there is none.
    const nlohmann::json& next(const char* expected) {
        if (at_ == items_.size())
            fail(std::string("they end early: ") + expected + " was expected after " + std::to_string(at_) + " values");
        return items_[at_++];
    }
    /// The tensor a `{"tensor": i}` item refers to (empty for `{"tensor": null}`).
    Tensor take_tensor(const nlohmann::json& item) {
        const nlohmann::json* ref = item.size() == 1 ? member(item, "tensor") : nullptr;
        if (ref == nullptr)
            fail(std::string("expected a tensor, found ") + describe(item) + "; " + same_signature);
        if (ref->is_null()) return {};
        if (!ref->is_number_unsigned() || ref->get<std::uint64_t>() >= tensors_.size() || taken_[ref->get<std::size_t>()])
            fail("a tensor reference " + dumped(*ref) + " names no tensor of the " + std::to_string(tensors_.size()) +
                 " sent, or one taken already");
        taken_[ref->get<std::size_t>()] = true;
        return std::move(tensors_[ref->get<std::size_t>()]);
    }
    /// Every value and every tensor must have been used.
    void finish() const {
        if (at_ != items_.size()) fail(std::to_string(items_.size() - at_) + " values are left over");
        for (std::size_t i = 0; i < taken_.size(); ++i)
            if (!taken_[i]) fail("tensor " + std::to_string(i) + " of the " + std::to_string(taken_.size()) + " sent is not used");
    }
    [[noreturn]] void fail(const std::string& why) const {
        throw InvalidArgumentError("pss: " + what_ + ": the encoded values are malformed: " + why);
    }
    [[nodiscard]] const CallContext& context() const noexcept { return context_; }
    /// The value of `key` in the object `j`, or null when `j` is not an object or has no `key`.
    [[nodiscard]] static const nlohmann::json* member(const nlohmann::json& j, const char* key) {
        if (!j.is_object()) return nullptr;
        const auto it = j.find(key);
        return it == j.end() ? nullptr : &*it;
    }
    [[nodiscard]] static std::string describe(const nlohmann::json& item) {
        return std::string(item.is_binary() ? "a byte string" : item.type_name());
    }
    static constexpr const char* same_signature =
        "is the function registered with the same signature in every process?";

private:
    std::string what_;
    CallContext context_;  // by value: a reader may outlive the call that made it (a copy is one shared_ptr)
    nlohmann::json items_;
    std::size_t at_ = 0;
    std::vector<Tensor> tensors_;
    std::vector<bool> taken_;
};

template <class T>
struct Codec;

template <class T>
    requires std::is_arithmetic_v<T>
struct Codec<T> {
    static nlohmann::json encode(ValuesWriter&, const T& v) {
        if constexpr (std::is_same_v<T, bool> || std::is_floating_point_v<T>) return v;
        else if constexpr (std::is_signed_v<T>) return static_cast<std::int64_t>(v);
        else return static_cast<std::uint64_t>(v);
    }
    static T decode(ValuesReader& r, const nlohmann::json& j) {
        auto wrong = [&](const std::string& why) {
            r.fail("expected " + label() + ", found " + why + "; " + ValuesReader::same_signature);
        };
        if constexpr (std::is_same_v<T, bool>) {
            if (!j.is_boolean()) wrong(ValuesReader::describe(j));
            return j.get<bool>();
        } else if constexpr (std::is_floating_point_v<T>) {
            if (!j.is_number_float()) wrong(ValuesReader::describe(j));
            return static_cast<T>(j.get<double>());
        } else {
            if (!j.is_number_integer()) wrong(ValuesReader::describe(j));
            if (j.is_number_unsigned()) {
                const auto u = j.get<std::uint64_t>();
                if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) wrong(std::to_string(u) + ", out of its range");
                return static_cast<T>(u);
            }
            const auto i = j.get<std::int64_t>();
            if (std::is_unsigned_v<T> || i < static_cast<std::int64_t>(std::numeric_limits<T>::min()))
                wrong(std::to_string(i) + ", out of its range");
            return static_cast<T>(i);
        }
    }
    static std::string label() {
        if constexpr (std::is_same_v<T, bool>) return "a bool";
        else if constexpr (std::is_floating_point_v<T>) return "a floating-point number";
        else return std::string("an integer of ") + std::to_string(sizeof(T) * 8) + " bits" +
                    (std::is_signed_v<T> ? "" : ", unsigned");
    }
};
/// A string crosses as a CBOR byte string: any bytes, not only UTF-8.
template <>
struct Codec<std::string> {
    static nlohmann::json encode(ValuesWriter&, const std::string& s) {
        return nlohmann::json::binary(std::vector<std::uint8_t>(s.begin(), s.end()));
    }
    static std::string decode(ValuesReader& r, const nlohmann::json& j) {
        if (!j.is_binary())
            r.fail("expected a string, found " + ValuesReader::describe(j) + "; " + ValuesReader::same_signature);
        const auto& bytes = j.get_binary();
        return std::string(bytes.begin(), bytes.end());
    }
};
template <>
struct Codec<Tensor> {
    static nlohmann::json encode(ValuesWriter& w, const Tensor& t) { return w.tensor(t); }
    static Tensor decode(ValuesReader& r, const nlohmann::json& j) { return r.take_tensor(j); }
};
template <TensorElement T>
struct Codec<xt::xarray<T>> {
    static nlohmann::json encode(ValuesWriter& w, const xt::xarray<T>& a) { return w.tensor(Tensor(a)); }
    static xt::xarray<T> decode(ValuesReader& r, const nlohmann::json& j) {
        Tensor t = r.take_tensor(j);
        if (!t.has_value() || t.dtype() != dtype_of<T>)
            r.fail(std::string("expected an array of ") + std::string(dtype_name(dtype_of<T>)) + ", got " +
                   (t.has_value() ? std::string(dtype_name(t.dtype())) : std::string("an empty tensor")));
        return std::move(t.get<T>());
    }
};
template <class T>
struct Codec<std::vector<T>> {
    static nlohmann::json encode(ValuesWriter& w, const std::vector<T>& v) {
        nlohmann::json items = nlohmann::json::array();
        for (const auto& e : v) items.push_back(Codec<T>::encode(w, e));
        return items;
    }
    static std::vector<T> decode(ValuesReader& r, const nlohmann::json& j) {
        if (!j.is_array()) r.fail("expected a vector, found " + ValuesReader::describe(j) + "; " + ValuesReader::same_signature);
        std::vector<T> v;
        v.reserve(j.size());
        for (const auto& e : j) v.push_back(Codec<T>::decode(r, e));
        return v;
    }
};
/// A Variable crosses as its handle: id, name, dtype, shape and where each shard lives (its index,
/// task, rows and the variable id its ps knows it by). The worker's handle reaches the same shards
/// through its own channel and never destroys them.
template <>
struct Codec<Variable> {
    /// How `v` reaches its shards (what a received handle needs in this process).
    static std::shared_ptr<Channel> channel_of(const Variable& v) { return v.info().channel; }
    static nlohmann::json encode(ValuesWriter&, const Variable& v) {
        const VariableInfo& info = v.info();
        nlohmann::json shards = nlohmann::json::array();
        for (const auto& s : info.shards)
            shards.push_back({s.index, s.task, s.row_offset, s.shape.empty() ? std::size_t{0} : s.shape[0], s.variable});
        nlohmann::json handle = {{"id", info.id}, {"name", info.name}, {"dtype", static_cast<int>(info.dtype)},
                                 {"shape", info.shape}, {"shards", std::move(shards)}};
        if (const Compression c = v.compression(); c != Compression::none) handle["compression"] = static_cast<int>(c);
        return {{"variable", std::move(handle)}};
    }
    static Variable decode(ValuesReader& r, const nlohmann::json& j) {
        const nlohmann::json* handle = j.size() == 1 ? ValuesReader::member(j, "variable") : nullptr;
        if (handle == nullptr)
            r.fail("expected a Variable, found " + ValuesReader::describe(j) + "; " + ValuesReader::same_signature);
        if (!r.context().channel) r.fail("a Variable reached a process that has no cluster to reach its shards");
        const nlohmann::json& h = *handle;
        auto field = [&](const char* key, bool (nlohmann::json::*is)() const noexcept, const char* type) -> const nlohmann::json& {
            const nlohmann::json* it = ValuesReader::member(h, key);
            if (it == nullptr || !(it->*is)())
                r.fail(std::string("a Variable handle's \"") + key + "\" is missing or not " + type);
            return *it;
        };
        auto unsigned_of = [&](const nlohmann::json& v, const char* what) -> std::uint64_t {
            if (!v.is_number_unsigned()) r.fail(std::string("a Variable handle's ") + what + " is not an unsigned integer");
            return v.get<std::uint64_t>();
        };
        const nlohmann::json* compression = h.is_object() ? ValuesReader::member(h, "compression") : nullptr;
        if (!h.is_object() || h.size() != (compression != nullptr ? 6u : 5u))
            r.fail("a Variable handle has other fields than id, name, dtype, shape, shards and compression");
        auto info = std::make_shared<VariableInfo>();
        info->id = unsigned_of(field("id", &nlohmann::json::is_number_unsigned, "an unsigned integer"), "id");
        const auto& name = field("name", &nlohmann::json::is_string, "a string");
        info->name = name.get<std::string>();
        const std::uint64_t dtype = unsigned_of(field("dtype", &nlohmann::json::is_number_unsigned, "a dtype code"), "dtype");
        if (dtype > 255 || !is_valid_dtype(static_cast<std::uint8_t>(dtype)))
            r.fail("dtype code " + std::to_string(dtype) + " is unknown");
        info->dtype = static_cast<DType>(dtype);
        if (compression != nullptr) {
            const std::uint64_t c = unsigned_of(*compression, "compression");
            if (c < 1 || c > 2 || info->dtype != DType::float32)
                r.fail("compression code " + std::to_string(c) + " is not 1 (bfloat16) or 2 (float16) of a float32 variable");
            info->compression = static_cast<Compression>(c);
        }
        const auto& shape = field("shape", &nlohmann::json::is_array, "an array");
        if (shape.size() > 32) r.fail("a rank of " + std::to_string(shape.size()) + " is above 32");
        for (const auto& extent : shape) info->shape.push_back(static_cast<std::size_t>(unsigned_of(extent, "shape extent")));
        // Only a sane size is checked here; what the ps really holds is checked on every reply.
        if (bounded_elements(info->shape, std::uint64_t{1} << 48) < 0)
            r.fail("a Variable of shape " + format_shape(info->shape) + " has too many elements");
        const auto& shards = field("shards", &nlohmann::json::is_array, "an array");
        if (shards.empty() || (shards.size() > 1 && info->shape.empty()))
            r.fail(std::to_string(shards.size()) + " shards for shape " + format_shape(info->shape));
        // A strategy's variable: its own id on every shard, indexes in order, rows by TensorFlow's rule
        // (the handle finds a row's shard by that rule). A variable built from a list: any parts, whose
        // rows follow each other and add up to the shape.
        bool from_list = false;
        for (std::size_t i = 0; i < shards.size(); ++i) {
            const auto& shard = shards[i];
            if (!shard.is_array() || shard.size() != 5 || !shard[1].is_number_integer())
                r.fail("shard " + std::to_string(i) + " is not [index, task, row offset, rows, variable]");
            from_list = from_list || unsigned_of(shard[4], "shard variable") != info->id ||
                        unsigned_of(shard[0], "shard index") != i;
        }
        std::size_t next_row = 0;
        for (std::size_t i = 0; i < shards.size(); ++i) {
            const auto& shard = shards[i];
            ShardInfo s;
            const std::uint64_t index = unsigned_of(shard[0], "shard index");
            const std::int64_t task = shard[1].get<std::int64_t>();
            s.row_offset = static_cast<std::size_t>(unsigned_of(shard[2], "row offset"));
            const auto rows = static_cast<std::size_t>(unsigned_of(shard[3], "row count"));
            s.variable = unsigned_of(shard[4], "shard variable");
            s.shape = info->shape;
            if (!s.shape.empty()) s.shape[0] = rows;
            const bool by_rule = info->shape.empty() || rows == shard_rows(info->shape[0], shards.size(), i);
            if (index > std::numeric_limits<std::uint32_t>::max() || task < 0 ||
                task > std::numeric_limits<std::int32_t>::max() || s.row_offset != next_row ||
                (info->shape.empty() ? rows != 0 : rows > info->shape[0] - next_row) || (!from_list && !by_rule))
                r.fail("shard " + std::to_string(i) + " (index " + std::to_string(index) + ", task " +
                       std::to_string(task) + ", rows " + std::to_string(s.row_offset) + " + " + std::to_string(rows) +
                       ") is not how " + std::to_string(shards.size()) + " shards split shape " + format_shape(info->shape));
            info->split_by_rule = info->split_by_rule && by_rule;
            s.index = static_cast<std::uint32_t>(index);
            s.task = static_cast<int>(task);
            next_row += rows;
            info->shards.push_back(std::move(s));
        }
        if (!info->shape.empty() && next_row != info->shape[0])
            r.fail("the shards hold " + std::to_string(next_row) + " rows of shape " + format_shape(info->shape));
        info->channel = r.context().channel;
        info->borrowed = true;
        return Variable(std::move(info));
    }
};
template <class T>
struct Codec<PerWorkerValues<T>> {
    [[noreturn]] static nlohmann::json encode(ValuesWriter&, const PerWorkerValues<T>&) {
        throw InvalidArgumentError(
            "pss: schedule: a PerWorkerValues inside another argument cannot be sent to a worker in another process; "
            "pass it as an argument of its own (each worker then receives its value)");
    }
    [[noreturn]] static PerWorkerValues<T> decode(ValuesReader& r, const nlohmann::json&) {
        r.fail("a PerWorkerValues cannot be received");
    }
};

/// Encodes the arguments of a call.
template <class... Args>
Values encode_values(const Args&... args) {
    ValuesWriter w;
    nlohmann::json items = nlohmann::json::array();
    (items.push_back(Codec<std::remove_cvref_t<Args>>::encode(w, args)), ...);
    return w.finish(items);
}

/// How a worker runs one registered function: decodes the arguments, calls, encodes the result (an
/// empty array for void).
using Invoker = std::function<nlohmann::json(ValuesReader&, ValuesWriter&)>;

struct RegistryEntry {
    std::string signature;
    Invoker invoke;
};

/// The functions registered in this process, by name.
struct Registry {
    std::mutex mutex;
    std::map<std::string, RegistryEntry, std::less<>> entries;
    static Registry& instance() {
        static Registry registry;
        return registry;
    }
};

inline constexpr int call_succeeded = 0, call_failed = 1;

/// What a worker answers to a call, always as values: `[0, result]` (`[0]` for void), or `[1, code,
/// message]`. Errors travel inside the answer so that an error reply can only mean that the worker
/// itself was not reached (the coordinator then runs the closure elsewhere).
inline Values run_call(const std::string& name, Values&& arguments, const CallContext& context) {
    ValuesWriter out;
    try {
        Invoker invoke;
        {
            auto& registry = Registry::instance();
            std::lock_guard lock(registry.mutex);
            auto it = registry.entries.find(name);
            if (it == registry.entries.end())
                throw NotFoundError("pss: worker " + std::to_string(context.worker) + ": no function is registered as \"" +
                                    name + "\" in this process; call register_function at start-up in every process");
            invoke = it->second.invoke;
        }
        ValuesReader reader(std::move(arguments), "call of \"" + name + "\"", context);
        nlohmann::json result = invoke(reader, out);
        reader.finish();
        nlohmann::json answer = nlohmann::json::array({call_succeeded});
        if (!result.is_discarded()) answer.push_back(std::move(result));
        return out.finish(answer);
    } catch (const std::exception& e) {
        const auto* error = dynamic_cast<const Error*>(&e);
        const std::string message =
            error ? std::string(e.what()) : "pss: worker " + std::to_string(context.worker) + ": \"" + name + "\" threw: " + e.what();
        return ValuesWriter{}.finish(
            {call_failed, static_cast<int>(error ? error->code() : ErrorCode::internal),
             nlohmann::json::binary(std::vector<std::uint8_t>(message.begin(), message.end()))});
    }
}

template <class T>
struct is_registered_function : std::false_type {};
template <class T>
inline constexpr bool is_registered_function_v = is_registered_function<std::remove_cvref_t<T>>::value;

}  // namespace detail

template <class Signature>
class RegisteredFunction;

/// @brief A function known by `name()` in every process of a cluster: what ClusterCoordinator::schedule
/// sends to a remote worker instead of code. Calling it calls the function.
template <class R, class... Args>
class RegisteredFunction<R(Args...)> {
public:
    using result_type = R;
    RegisteredFunction(std::string name, R (*fn)(Args...)) : name_(std::move(name)), fn_(fn) {}
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    template <class... A>
    R operator()(A&&... args) const {
        return fn_(std::forward<A>(args)...);
    }

private:
    std::string name_;
    R (*fn_)(Args...);
};

namespace detail {
template <class S>
struct is_registered_function<RegisteredFunction<S>> : std::true_type {};

/// Decodes what run_call answered: the result, or the worker's error thrown as its Error subclass.
template <class R>
R decode_result(Values&& answer, const std::string& name) {
    ValuesReader reader(std::move(answer), "answer to the call of \"" + name + "\"", CallContext{});
    const nlohmann::json& status = reader.next("a status");
    if (status == call_failed) {
        const nlohmann::json& code = reader.next("an error code");
        std::string message = Codec<std::string>::decode(reader, reader.next("an error message"));
        const auto c = code.is_number_integer() ? code.get<std::int64_t>() : 0;
        throw_error(c > 0 && c <= static_cast<std::int64_t>(ErrorCode::permission_denied) ? static_cast<ErrorCode>(c)
                                                                                          : ErrorCode::internal,
                    message);
    }
    if (status != call_succeeded) reader.fail("the status " + dumped(status) + " is neither 0 (ok) nor 1 (error)");
    if constexpr (std::is_void_v<R>) {
        reader.finish();
    } else {
        R result = Codec<std::remove_cvref_t<R>>::decode(reader, reader.next("the result"));
        reader.finish();
        return result;
    }
}
}  // namespace detail

/// @brief Registers `fn` under `name` (once per process; every process of the cluster registers the
/// same names at start-up, for example from a namespace-scope variable's initializer). Its parameters
/// and its result (or void) must be Transferable.
/// @throws AlreadyExistsError when `name` is registered already.
template <class R, class... Args>
RegisteredFunction<R(Args...)> register_function(std::string name, R (*fn)(Args...)) {
    static_assert(std::is_void_v<R> || Transferable<R>,
                  "pss: register_function: the result must be void or Transferable (a number, string, Tensor, "
                  "xt::xarray, Variable, or a std::vector of these)");
    static_assert((Transferable<Args> && ...),
                  "pss: register_function: every parameter must be Transferable (a number, string, Tensor, "
                  "xt::xarray, Variable, PerWorkerValues, or a std::vector of these)");
    detail::Invoker invoke = [fn](detail::ValuesReader& reader, detail::ValuesWriter& out) -> nlohmann::json {
        // Braces: the arguments are decoded in order.
        std::tuple<std::remove_cvref_t<Args>...> args{
            detail::Codec<std::remove_cvref_t<Args>>::decode(reader, reader.next("an argument"))...};
        if constexpr (std::is_void_v<R>) {
            std::apply(fn, args);
            return nlohmann::json(nlohmann::json::value_t::discarded);
        } else {
            return detail::Codec<std::remove_cvref_t<R>>::encode(out, std::apply(fn, args));
        }
    };
    auto& registry = detail::Registry::instance();
    std::lock_guard lock(registry.mutex);
    if (!registry.entries.emplace(name, detail::RegistryEntry{typeid(R(Args...)).name(), std::move(invoke)}).second)
        throw AlreadyExistsError("pss: register_function: a function named \"" + name +
                                 "\" is registered already; names must be unique in a process");
    return RegisteredFunction<R(Args...)>(std::move(name), fn);
}

PSS_NAMESPACE_END
