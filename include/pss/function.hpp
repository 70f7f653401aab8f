// pss/function.hpp: functions registered by name, and the values that cross a wire as their arguments and results.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
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

#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
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

/// Writes values for a call: each one a tag byte, then its fields, little-endian as the host.
class ByteWriter {
public:
    void bytes(const void* data, std::size_t n) {
        const auto* p = static_cast<const std::byte*>(data);
        out_.insert(out_.end(), p, p + n);
    }
    template <class T>
        requires std::is_trivially_copyable_v<T>
    void raw(const T& value) {
        bytes(&value, sizeof value);
    }
    [[nodiscard]] std::vector<std::byte>& data() noexcept { return out_; }

private:
    std::vector<std::byte> out_;
};

/// Reads what ByteWriter wrote, from bytes a peer sent: every length is checked before it is used.
class ByteReader {
public:
    ByteReader(std::span<const std::byte> in, std::string what) : in_(in), what_(std::move(what)) {}
    void bytes(void* data, std::size_t n) {
        if (n > remaining()) fail("it ends early");
        if (n != 0) std::memcpy(data, in_.data() + at_, n);
        at_ += n;
    }
    template <class T>
        requires std::is_trivially_copyable_v<T>
    T raw() {
        T value;
        bytes(&value, sizeof value);
        return value;
    }
    /// A count of items of at least `item_bytes` each: more than the bytes left is a lie.
    std::size_t count(std::size_t item_bytes) {
        const auto n = raw<std::uint64_t>();
        if (item_bytes != 0 && n > remaining() / item_bytes) fail("a count of " + std::to_string(n) + " is too large");
        return static_cast<std::size_t>(n);
    }
    [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - at_; }
    [[noreturn]] void fail(const std::string& why) const {
        throw InvalidArgumentError("pss: " + what_ + ": the encoded values are malformed: " + why);
    }
    void expect(std::uint8_t tag, const char* type) {
        const auto got = raw<std::uint8_t>();
        if (got != tag)
            fail(std::string("expected ") + type + " (tag " + std::to_string(tag) + "), found tag " +
                 std::to_string(got) + "; is the function registered with the same signature in every process?");
    }
    [[nodiscard]] const std::string& what() const noexcept { return what_; }

private:
    std::span<const std::byte> in_;
    std::size_t at_ = 0;
    std::string what_;
};

namespace tag {
inline constexpr std::uint8_t string = 's', tensor = 't', vector = 'v', variable = 'V';
/// Arithmetic types: a letter for the kind, the size in the low bits, so that int and long differ.
template <class T>
inline constexpr std::uint8_t arithmetic =
    static_cast<std::uint8_t>((std::is_same_v<T, bool> ? 0x10 : std::is_floating_point_v<T> ? 0x20 : std::is_signed_v<T> ? 0x30 : 0x40) | sizeof(T));
}  // namespace tag

inline void encode_shape(ByteWriter& w, const Shape& shape) {
    w.raw(static_cast<std::uint8_t>(shape.size()));
    for (auto d : shape) w.raw(static_cast<std::uint64_t>(d));
}
inline Shape decode_shape(ByteReader& r) {
    const auto rank = r.raw<std::uint8_t>();
    if (rank > 32) r.fail("a rank of " + std::to_string(rank) + " is above 32");
    Shape shape(rank);
    for (auto& d : shape) d = static_cast<std::size_t>(r.raw<std::uint64_t>());
    return shape;
}
inline void encode_tensor(ByteWriter& w, const Tensor& t) {
    w.raw(tag::tensor);
    if (!t.has_value()) return w.raw(std::uint8_t{0});
    w.raw(static_cast<std::uint8_t>(t.dtype()));  // 1 to 4; 0 is the empty tensor
    encode_shape(w, t.shape());
    w.bytes(t.bytes(), t.nbytes());
}
inline Tensor decode_tensor(ByteReader& r) {
    r.expect(tag::tensor, "a tensor");
    const auto code = r.raw<std::uint8_t>();
    if (code == 0) return {};
    if (code > 4) r.fail("dtype code " + std::to_string(code) + " is unknown");
    const auto dtype = static_cast<DType>(code);
    const Shape shape = decode_shape(r);
    const std::int64_t elements = bounded_elements(shape, std::uint64_t{1} << 48);
    if (elements < 0) r.fail("shape " + format_shape(shape) + " has too many elements");
    if (static_cast<std::size_t>(elements) > r.remaining() / dtype_size(dtype))
        r.fail("shape " + format_shape(shape) + " is larger than the bytes sent");
    Tensor t = Tensor::uninitialized(dtype, shape);
    r.bytes(t.bytes(), t.nbytes());
    return t;
}

template <class T>
struct Codec;

template <class T>
    requires std::is_arithmetic_v<T>
struct Codec<T> {
    static void encode(ByteWriter& w, const T& v) {
        w.raw(tag::arithmetic<T>);
        w.raw(v);
    }
    static T decode(ByteReader& r, const CallContext&) {
        r.expect(tag::arithmetic<T>, "a number of this type");
        if constexpr (std::is_same_v<T, bool>) {  // a bool's byte other than 0 or 1 is not a bool
            const auto byte = r.raw<std::uint8_t>();
            if (byte > 1) r.fail("a bool is " + std::to_string(byte) + "; it is 0 or 1");
            return byte == 1;
        } else {
            return r.raw<T>();
        }
    }
};
template <>
struct Codec<std::string> {
    static void encode(ByteWriter& w, const std::string& s) {
        w.raw(tag::string);
        w.raw(static_cast<std::uint64_t>(s.size()));
        w.bytes(s.data(), s.size());
    }
    static std::string decode(ByteReader& r, const CallContext&) {
        r.expect(tag::string, "a string");
        std::string s(r.count(1), '\0');
        r.bytes(s.data(), s.size());
        return s;
    }
};
template <>
struct Codec<Tensor> {
    static void encode(ByteWriter& w, const Tensor& t) { encode_tensor(w, t); }
    static Tensor decode(ByteReader& r, const CallContext&) { return decode_tensor(r); }
};
template <Element T>
struct Codec<xt::xarray<T>> {
    static void encode(ByteWriter& w, const xt::xarray<T>& a) {
        w.raw(tag::tensor);
        w.raw(static_cast<std::uint8_t>(dtype_of<T>));
        encode_shape(w, Shape(a.shape().begin(), a.shape().end()));
        w.bytes(a.data(), a.size() * sizeof(T));
    }
    static xt::xarray<T> decode(ByteReader& r, const CallContext&) {
        Tensor t = decode_tensor(r);
        if (!t.has_value() || t.dtype() != dtype_of<T>)
            r.fail(std::string("expected an array of ") + std::string(dtype_name(dtype_of<T>)) + ", got " +
                   (t.has_value() ? std::string(dtype_name(t.dtype())) : std::string("an empty tensor")));
        return std::move(t.get<T>());
    }
};
template <class T>
struct Codec<std::vector<T>> {
    static void encode(ByteWriter& w, const std::vector<T>& v) {
        w.raw(tag::vector);
        w.raw(static_cast<std::uint64_t>(v.size()));
        for (const auto& e : v) Codec<T>::encode(w, e);
    }
    static std::vector<T> decode(ByteReader& r, const CallContext& c) {
        r.expect(tag::vector, "a vector");
        std::vector<T> v;
        const std::size_t n = r.count(2);  // every element takes at least a tag and a byte
        v.reserve(n);
        for (std::size_t i = 0; i < n; ++i) v.push_back(Codec<T>::decode(r, c));
        return v;
    }
};
/// A Variable crosses as its handle: id, name, dtype, shape and where each shard lives. The worker's
/// handle reaches the same shards through its own channel and never destroys them.
template <>
struct Codec<Variable> {
    /// How `v` reaches its shards (what a received handle needs in this process).
    static std::shared_ptr<Channel> channel_of(const Variable& v) { return v.info().channel; }
    static void encode(ByteWriter& w, const Variable& v) {
        const VariableInfo& info = v.info();
        w.raw(tag::variable);
        w.raw(info.id);
        Codec<std::string>::encode(w, info.name);
        w.raw(static_cast<std::uint8_t>(info.dtype));
        encode_shape(w, info.shape);
        w.raw(static_cast<std::uint64_t>(info.shards.size()));
        for (const auto& s : info.shards) {
            w.raw(s.index);
            w.raw(static_cast<std::int32_t>(s.task));
            w.raw(static_cast<std::uint64_t>(s.row_offset));
            w.raw(static_cast<std::uint64_t>(s.shape.empty() ? 0 : s.shape[0]));
        }
    }
    static Variable decode(ByteReader& r, const CallContext& c) {
        r.expect(tag::variable, "a Variable");
        if (!c.channel) r.fail("a Variable reached a process that has no cluster to reach its shards");
        auto info = std::make_shared<VariableInfo>();
        info->id = r.raw<std::uint64_t>();
        info->name = Codec<std::string>::decode(r, c);
        const auto dtype = r.raw<std::uint8_t>();
        if (dtype < 1 || dtype > 4) r.fail("dtype code " + std::to_string(dtype) + " is unknown");
        info->dtype = static_cast<DType>(dtype);
        info->shape = decode_shape(r);
        // Only a sane size is checked here; what the ps really holds is checked on every reply.
        if (bounded_elements(info->shape, std::uint64_t{1} << 48) < 0)
            r.fail("a Variable of shape " + format_shape(info->shape) + " has too many elements");
        const std::size_t shards = r.count(24);
        if (shards == 0 || (shards > 1 && (info->shape.empty() || shards > info->shape[0])))
            r.fail(std::to_string(shards) + " shards for shape " + format_shape(info->shape));
        std::size_t next_row = 0;
        for (std::size_t i = 0; i < shards; ++i) {
            ShardInfo s;
            s.index = r.raw<std::uint32_t>();
            s.task = r.raw<std::int32_t>();
            s.row_offset = static_cast<std::size_t>(r.raw<std::uint64_t>());
            const auto rows = static_cast<std::size_t>(r.raw<std::uint64_t>());
            s.shape = info->shape;
            if (!s.shape.empty()) s.shape[0] = rows;
            // The shards must split the rows as every strategy does (TensorFlow's rule): the handle finds
            // a row's shard by that rule.
            if (s.index != i || s.task < 0 || s.row_offset != next_row ||
                (!info->shape.empty() && rows != shard_rows(info->shape[0], shards, i)))
                r.fail("shard " + std::to_string(i) + " (index " + std::to_string(s.index) + ", task " +
                       std::to_string(s.task) + ", rows " + std::to_string(s.row_offset) + " + " + std::to_string(rows) +
                       ") is not how " + std::to_string(shards) + " shards split shape " + format_shape(info->shape));
            next_row += rows;
            info->shards.push_back(std::move(s));
        }
        info->channel = c.channel;
        info->borrowed = true;
        return Variable(std::move(info));
    }
};
template <class T>
struct Codec<PerWorkerValues<T>> {
    [[noreturn]] static void encode(ByteWriter&, const PerWorkerValues<T>&) {
        throw InvalidArgumentError(
            "pss: schedule: a PerWorkerValues cannot be sent to a worker in another process yet; create the "
            "worker's data inside the registered function from worker_index()");
    }
    [[noreturn]] static PerWorkerValues<T> decode(ByteReader& r, const CallContext&) {
        r.fail("a PerWorkerValues cannot be received");
    }
};

/// Values as the payload of a call: a 1-D int64 tensor holding the byte count, then the bytes.
inline Tensor to_blob(const std::vector<std::byte>& bytes) {
    xt::xarray<std::int64_t> blob = xt::zeros<std::int64_t>({1 + (bytes.size() + 7) / 8});
    blob(0) = static_cast<std::int64_t>(bytes.size());
    if (!bytes.empty()) std::memcpy(blob.data() + 1, bytes.data(), bytes.size());
    return Tensor(std::move(blob));
}
inline std::span<const std::byte> from_blob(const Tensor& blob, const std::string& what) {
    if (!blob.has_value() || blob.dtype() != DType::int64 || blob.shape().size() != 1 || blob.size() == 0)
        throw InvalidArgumentError("pss: " + what + ": the payload is not an encoded list of values");
    const auto n = blob.get<std::int64_t>()(0);
    if (n < 0 || static_cast<std::uint64_t>(n) > (blob.size() - 1) * 8)
        throw InvalidArgumentError("pss: " + what + ": the payload's byte count " + std::to_string(n) + " is wrong");
    return {blob.bytes() + 8, static_cast<std::size_t>(n)};
}

/// Encodes the arguments of a call.
template <class... Args>
Tensor encode_values(const Args&... args) {
    ByteWriter w;
    (Codec<std::remove_cvref_t<Args>>::encode(w, args), ...);
    return to_blob(w.data());
}

/// How a worker runs one registered function: decodes the arguments, calls, encodes the result.
using Invoker = std::function<void(ByteReader&, const CallContext&, ByteWriter&)>;

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

inline constexpr std::uint8_t call_succeeded = 0, call_failed = 1;

/// What a worker answers to a call, always as a value: a status byte, then the result, or the error's
/// code and message. Errors travel inside the answer so that an error reply can only mean that the
/// worker itself was not reached (the coordinator then runs the closure elsewhere).
inline Tensor run_call(const std::string& name, const Tensor& arguments, const CallContext& context) {
    ByteWriter out;
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
        const std::string what = "call of \"" + name + "\"";
        ByteReader reader(from_blob(arguments, what), what);
        out.raw(call_succeeded);
        invoke(reader, context, out);
    } catch (const std::exception& e) {
        const auto* error = dynamic_cast<const Error*>(&e);
        out = ByteWriter();
        out.raw(call_failed);
        out.raw(static_cast<std::int32_t>(error ? error->code() : ErrorCode::internal));
        Codec<std::string>::encode(out, error ? std::string(e.what()) : "pss: worker " + std::to_string(context.worker) +
                                                                         ": \"" + name + "\" threw: " + e.what());
    }
    return to_blob(out.data());
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
R decode_result(const Tensor& blob, const std::string& name) {
    const std::string what = "answer to the call of \"" + name + "\"";
    ByteReader reader(from_blob(blob, what), what);
    if (reader.raw<std::uint8_t>() == call_failed) {
        const auto code = reader.raw<std::int32_t>();
        std::string message = Codec<std::string>::decode(reader, CallContext{});
        throw_error(code > 0 && code <= static_cast<std::int32_t>(ErrorCode::internal) ? static_cast<ErrorCode>(code)
                                                                                        : ErrorCode::internal,
                    message);
    }
    if constexpr (!std::is_void_v<R>) return Codec<std::remove_cvref_t<R>>::decode(reader, CallContext{});
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
    detail::Invoker invoke = [fn](detail::ByteReader& reader, const detail::CallContext& context, detail::ByteWriter& out) {
        std::tuple<std::remove_cvref_t<Args>...> args{detail::Codec<std::remove_cvref_t<Args>>::decode(reader, context)...};
        if (reader.remaining() != 0) reader.fail(std::to_string(reader.remaining()) + " bytes are left over");
        if constexpr (std::is_void_v<R>) std::apply(fn, args);
        else detail::Codec<std::remove_cvref_t<R>>::encode(out, std::apply(fn, args));
    };
    auto& registry = detail::Registry::instance();
    std::lock_guard lock(registry.mutex);
    if (!registry.entries.emplace(name, detail::RegistryEntry{typeid(R(Args...)).name(), std::move(invoke)}).second)
        throw AlreadyExistsError("pss: register_function: a function named \"" + name +
                                 "\" is registered already; names must be unique in a process");
    return RegisteredFunction<R(Args...)>(std::move(name), fn);
}

PSS_NAMESPACE_END
