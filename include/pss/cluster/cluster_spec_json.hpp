// pss/cluster/cluster_spec_json.hpp: ClusterSpec printed as JSON; what needs nlohmann/json's full header.
#pragma once

#include <ostream>

#include <nlohmann/json.hpp>

#include <pss/cluster/cluster_spec.hpp>
#include <pss/config.hpp>

PSS_NAMESPACE_BEGIN

/// @brief Prints the JSON form, e.g. `{"ps":["ps0:2222"],"worker":["w0:2222"]}`.
inline std::ostream& operator<<(std::ostream& os, const ClusterSpec& spec) { return os << spec.to_json().dump(); }

PSS_NAMESPACE_END
