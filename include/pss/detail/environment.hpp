// pss/detail/environment.hpp: environment lookups the launcher-aware cluster resolvers read through.
#pragma once

#include <charconv>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

namespace detail {

/// @brief Looks up one environment variable: its value, or nullopt when it is not set. The Slurm, MPI and
/// auto resolvers take one so that tests (and programs that learn their place some other way) need not
/// touch the process environment.
using EnvironmentLookup = std::function<std::optional<std::string>(std::string_view)>;

/// @brief The process environment (`std::getenv`): the lookup the resolvers use by default.
inline std::optional<std::string> process_environment(std::string_view name) {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
}

/// @brief `text` as an int when it is exactly a decimal integer (an optional '-', digits) that fits;
/// nullopt otherwise ("", " 1", "1x", "1.0", "99999999999").
inline std::optional<int> parse_int(std::string_view text) noexcept {
    int value = 0;
    const char* first = text.data();
    const char* last = first + text.size();
    const auto [end, error] = std::from_chars(first, last, value);
    if (text.empty() || error != std::errc{} || end != last) return std::nullopt;
    return value;
}

/// @brief `text` in double quotes, as an error message shows a variable's value.
inline std::string quoted(std::string_view text) { return "\"" + std::string(text) + "\""; }

}  // namespace detail

PSS_NAMESPACE_END
