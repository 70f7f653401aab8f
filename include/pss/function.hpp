// pss/function.hpp: functions registered by name, and the argument types that can cross a wire.
#pragma once

#include <concepts>
#include <functional>
#include <typeinfo>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include <pss/config.hpp>
#include <pss/dtype.hpp>
#include <pss/errors.hpp>
#include <pss/tensor.hpp>

PSS_NAMESPACE_BEGIN

template <class T>
class PerWorkerValues;

namespace detail {
template <class T>
struct is_transferable : std::bool_constant<std::is_arithmetic_v<T> || std::same_as<T, std::string> ||
                                            std::same_as<T, Tensor>> {};
template <Element T>
struct is_transferable<xt::xarray<T>> : std::true_type {};
template <class T>
struct is_transferable<std::vector<T>> : is_transferable<T> {};
template <class T>
struct is_transferable<PerWorkerValues<T>> : std::true_type {};  // each process holds its own worker's value
}  // namespace detail

/// @brief A value that can be an argument or result of a function scheduled on another process:
/// a number, a std::string, a Tensor, an xt::xarray of an Element type, a PerWorkerValues (resolved on
/// the worker), or a std::vector of these.
template <class T>
concept Transferable = detail::is_transferable<std::remove_cvref_t<T>>::value;

template <class Signature>
class RegisteredFunction;

/// @brief A function known by `name()` in every process of a cluster: what ClusterCoordinator::schedule
/// sends to a remote worker instead of code. Calling it calls the function.
template <class R, class... Args>
class RegisteredFunction<R(Args...)> {
public:
    RegisteredFunction(std::string name, std::function<R(Args...)> fn) : name_(std::move(name)), fn_(std::move(fn)) {}
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    template <class... A>
    R operator()(A&&... args) const {
        return fn_(std::forward<A>(args)...);
    }

private:
    std::string name_;
    std::function<R(Args...)> fn_;
};

namespace detail {
template <class T>
struct is_registered_function : std::false_type {};
template <class S>
struct is_registered_function<RegisteredFunction<S>> : std::true_type {};
template <class T>
inline constexpr bool is_registered_function_v = is_registered_function<T>::value;

/// The names registered in this process, so that a name is registered once.
inline std::map<std::string, std::string, std::less<>>& registry(std::mutex*& lock) {
    static std::mutex mutex;
    static std::map<std::string, std::string, std::less<>> names;
    lock = &mutex;
    return names;
}
}  // namespace detail

/// @brief Registers `fn` under `name` (once per process; every process of the cluster registers the
/// same names at start-up). Its result must be void or Transferable; the arguments given to
/// ClusterCoordinator::schedule must be Transferable (checked there).
/// @throws AlreadyExistsError when `name` is registered already.
template <class R, class... Args>
RegisteredFunction<R(Args...)> register_function(std::string name, R (*fn)(Args...)) {
    static_assert(std::is_void_v<R> || Transferable<R>,
                  "pss: register_function: the result must be void or Transferable (a number, string, Tensor, "
                  "xt::xarray, or a std::vector of these)");
    std::mutex* mutex = nullptr;
    auto& names = detail::registry(mutex);
    std::lock_guard lock(*mutex);
    if (!names.emplace(name, typeid(R(Args...)).name()).second)
        throw AlreadyExistsError("pss: register_function: a function named \"" + name +
                                 "\" is registered already; names must be unique in a process");
    return RegisteredFunction<R(Args...)>(std::move(name), fn);
}

PSS_NAMESPACE_END
