# cmake/compile_fail_selftest.cmake: the compile-fail harness must reject what it must reject.
#
#   cmake -DCXX=<compiler> -DFLAGS_FILE=<flags> -DHARNESS=<compile_fail.cmake> -DWORK_DIR=<dir> -P ...
#
# Checks: (1) the flags compile a correct pss TU; (2) a file with the right error passes the harness;
# the harness fails (3) on code that compiles, (4) on an error whose text does not match, and
# (5) on a file without the `// expect-error:` line.
cmake_minimum_required(VERSION 3.21)

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

file(WRITE "${WORK_DIR}/compiles.cpp" "#include <pss/config.hpp>\nPSS_NAMESPACE_BEGIN\nint selftest = 1;\nPSS_NAMESPACE_END\n")
file(WRITE "${WORK_DIR}/right_error.cpp"
  "// expect-error: pss: selftest marker [0-9]+\n#include <pss/config.hpp>\nstatic_assert(PSS_VERSION_MAJOR < 0, \"pss: selftest marker 42\");\n")
file(WRITE "${WORK_DIR}/good_code.cpp"
  "// expect-error: anything at all\n#include <pss/config.hpp>\nint main() { return PSS_VERSION_MAJOR * 0; }\n")
file(WRITE "${WORK_DIR}/wrong_error.cpp"
  "// expect-error: pss: the message we wanted\n#include <pss/config.hpp>\nstatic_assert(PSS_VERSION_MAJOR < 0, \"pss: some other message\");\n")
file(WRITE "${WORK_DIR}/no_regex.cpp"
  "#include <pss/config.hpp>\nstatic_assert(PSS_VERSION_MAJOR < 0, \"pss: selftest marker\");\n")

set(failures "")

file(STRINGS "${FLAGS_FILE}" flags)
execute_process(COMMAND "${CXX}" ${flags} -fsyntax-only "${WORK_DIR}/compiles.cpp"
                OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  string(APPEND failures "(1) the compile-fail flags do not compile a correct TU:\n${out}\n")
endif()

function(run_harness file expect_pass)
  execute_process(COMMAND "${CMAKE_COMMAND}" "-DCXX=${CXX}" "-DFLAGS_FILE=${FLAGS_FILE}"
                          "-DSOURCE=${WORK_DIR}/${file}" -P "${HARNESS}"
                  OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE result)
  if(expect_pass AND NOT result EQUAL 0)
    set(failures "${failures}the harness rejected ${file}, which fails as expected:\n${out}\n" PARENT_SCOPE)
  elseif(NOT expect_pass AND result EQUAL 0)
    set(failures "${failures}the harness ACCEPTED ${file}, which it must reject:\n${out}\n" PARENT_SCOPE)
  else()
    message(STATUS "ok: harness on ${file}: ${result}")
  endif()
endfunction()

run_harness(right_error.cpp TRUE)
run_harness(good_code.cpp FALSE)
run_harness(wrong_error.cpp FALSE)
run_harness(no_regex.cpp FALSE)

if(NOT failures STREQUAL "")
  message(FATAL_ERROR "compile-fail harness self-test failed:\n${failures}")
endif()
message(STATUS "compile-fail harness self-test: all 5 checks pass")
