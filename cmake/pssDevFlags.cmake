# cmake/pssDevFlags.cmake: flags for pss's own tests, examples and benchmarks, never for pss::pss.
#   pss_target_warnings(<target>)    -Wall -Wextra -Wpedantic -Werror, C++20 without GNU extensions
#   pss_target_sanitizers(<target>)  the sanitizers named by PSS_SANITIZE
#   pss_dev_target(<target>)         both
include_guard(GLOBAL)

set(_pss_sanitize "${PSS_SANITIZE}")
string(REPLACE " " "" _pss_sanitize "${_pss_sanitize}")
if(_pss_sanitize STREQUAL "" OR _pss_sanitize STREQUAL "address,undefined" OR _pss_sanitize STREQUAL "undefined,address"
   OR _pss_sanitize STREQUAL "address" OR _pss_sanitize STREQUAL "undefined" OR _pss_sanitize STREQUAL "thread")
else()
  message(FATAL_ERROR "pss: PSS_SANITIZE is \"${PSS_SANITIZE}\"; use \"\" (none), \"address,undefined\" or \"thread\"")
endif()
if(NOT _pss_sanitize STREQUAL "")
  message(STATUS "pss: tests and examples built with -fsanitize=${_pss_sanitize}")
endif()

function(pss_target_warnings target)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror)
  elseif(MSVC)
    target_compile_options(${target} PRIVATE /W4 /WX /permissive-)
  endif()
endfunction()

function(pss_target_sanitizers target)
  if(_pss_sanitize STREQUAL "")
    return()
  endif()
  set(flags "-fsanitize=${_pss_sanitize}")
  if(_pss_sanitize MATCHES "address|undefined")
    # Stack traces that make sense, and undefined behaviour fails the test instead of printing.
    list(APPEND flags -fno-omit-frame-pointer -fno-sanitize-recover=all)
  endif()
  target_compile_options(${target} PRIVATE ${flags})
  target_link_options(${target} PRIVATE "-fsanitize=${_pss_sanitize}")
  if(_pss_sanitize STREQUAL "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # g++ 12 warns that TSan does not support std::atomic_thread_fence (Asio uses it).
    target_compile_options(${target} PRIVATE -Wno-tsan)
  endif()
  if(_pss_sanitize MATCHES "undefined" AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # clang's -fsanitize=function misfires on coroutine frames.
    target_compile_options(${target} PRIVATE -fno-sanitize=function)
  endif()
endfunction()

function(pss_dev_target target)
  pss_target_warnings(${target})
  pss_target_sanitizers(${target})
endfunction()

# Environment for every test process: make the sanitizers fail loudly and reproducibly.
set(PSS_TEST_ENVIRONMENT
  "ASAN_OPTIONS=check_initialization_order=1:strict_init_order=1"
  "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
  "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1")
