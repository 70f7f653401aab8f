// pss/detail/json_text.hpp: JSON that came from a peer or a file, written into an error message.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN
namespace detail {

/// `value` as JSON text for an error message, whatever its strings hold: invalid UTF-8 (which
/// nlohmann's `dump()` throws type_error 316 for, an internal error where the input was at fault) is
/// replaced by U+FFFD. Valid text comes out as `dump()` writes it.
[[nodiscard]] inline std::string dumped(const nlohmann::json& value) {
    return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace detail
PSS_NAMESPACE_END
