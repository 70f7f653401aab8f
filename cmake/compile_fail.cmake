# cmake/compile_fail.cmake: a compile-fail test. Passes only if SOURCE does NOT compile AND the
# compiler's output matches the regex on SOURCE's first line, `// expect-error: <regex>`.
# A plain WILL_FAIL test would pass on a typo; this one names what must go wrong.
#
#   cmake -DCXX=<compiler> -DFLAGS_FILE=<file, one flag a line> -DSOURCE=<file.cpp> -P compile_fail.cmake
#
# The regex is CMake's regex syntax (ERE-like: . * + ? [] () | ^ $), matched against the compiler's
# combined stdout and stderr; it should name our concept or static_assert text, not compiler wording.
cmake_minimum_required(VERSION 3.21)

include("${CMAKE_CURRENT_LIST_DIR}/script_args.cmake")
pss_require_script_args(compile_fail.cmake CXX FLAGS_FILE SOURCE)
if(NOT EXISTS "${SOURCE}")
  message(FATAL_ERROR "compile_fail.cmake: ${SOURCE} does not exist")
endif()

file(STRINGS "${SOURCE}" first_line LIMIT_COUNT 1)
if(NOT first_line MATCHES "^// expect-error: (.+)$")
  message(FATAL_ERROR "compile_fail.cmake: the first line of ${SOURCE} must be `// expect-error: <regex>`, "
                      "it is: \"${first_line}\"")
endif()
set(regex "${CMAKE_MATCH_1}")
string(STRIP "${regex}" regex)

file(STRINGS "${FLAGS_FILE}" flags)
execute_process(
  COMMAND "${CXX}" ${flags} -fsyntax-only "${SOURCE}"
  OUTPUT_VARIABLE out
  ERROR_VARIABLE out
  RESULT_VARIABLE result)

if(result EQUAL 0)
  message(FATAL_ERROR "compile-fail test ${SOURCE} COMPILED, but it must fail with an error matching:\n"
                      "  ${regex}\n${out}")
endif()
if(NOT out MATCHES "${regex}")
  message(FATAL_ERROR "compile-fail test ${SOURCE} failed to compile as it must, but no output matches:\n"
                      "  ${regex}\n---- compiler output ----\n${out}")
endif()
message(STATUS "${SOURCE} fails to compile, as it must, with output matching: ${regex}")
