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

// Separate compilation. By default pss is header-only: every translation unit that includes it compiles
// its runtime (a Keras program's takes about a minute). A program that defines PSS_SEPARATE_COMPILATION
// in every translation unit (the CMake target pss::compiled does) compiles that runtime once, in one
// source that also defines PSS_BUILD_LIBRARY (the library pss::compiled is that source), as Asio's
// ASIO_SEPARATE_COMPILATION and spdlog's SPDLOG_COMPILED_LIB do:
// - the default configurations' class templates (PSS_INSTANTIATE) are declared `extern` in the
//   program's translation units and instantiated once in the library;
// - the heavy virtual functions of the layers, losses and the default strategy's store are declared
//   PSS_INLINE and defined outside their classes under PSS_DEFINITIONS. Compiled, the first of them is
//   its class's key function, so the class's virtual table and virtual functions are emitted once, in the
//   library, and a program that constructs the class instantiates none of them. Header-only they are
//   inline, the class has no key function, and a translation unit emits them only where it uses the class;
// - the functions that the registered calls reach are defined in the library only (PSS_DEFINITIONS).
#if !defined(PSS_SEPARATE_COMPILATION)
#define PSS_DEFINITIONS 1
#define PSS_INLINE inline
#define PSS_INSTANTIATE(...)
#elif defined(PSS_BUILD_LIBRARY)
#define PSS_DEFINITIONS 1
#define PSS_INLINE
#define PSS_INSTANTIATE(...) template __VA_ARGS__;
#else
#define PSS_DEFINITIONS 0
#define PSS_INLINE
#define PSS_INSTANTIATE(...) extern template __VA_ARGS__;
#endif

// Under pss-launch a task's stdout is a pipe, which C's stdio buffers fully: the launcher sets
// PSS_LINE_BUFFERED=1 in every task, and every program that includes pss makes its stdout line-buffered
// before main (setvbuf must come before any output), so the task's lines arrive as they are printed.
#include <cstdio>
#include <cstdlib>
#include <cstring>

PSS_NAMESPACE_BEGIN
namespace detail {
inline const bool stdout_line_buffered = [] {
    const char* value = std::getenv("PSS_LINE_BUFFERED");
    return value != nullptr && std::strcmp(value, "1") == 0 && std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ) == 0;
}();
}  // namespace detail
PSS_NAMESPACE_END
