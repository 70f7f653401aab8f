// pss/config.hpp: namespace macros and feature switches shared by every pss header.
#pragma once

#include <pss/version.hpp>

// An inline ABI namespace inside `pss`, as fmt and nlohmann/json do: two programs built against
// different major versions of pss do not link each other's symbols by accident.
#define PSS_NAMESPACE_BEGIN \
    namespace pss {         \
    inline namespace v0 {
#define PSS_NAMESPACE_END \
    }                     \
    }
