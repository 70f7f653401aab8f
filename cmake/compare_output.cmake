# cmake/compare_output.cmake: run a program and compare its stdout, byte for byte, with a golden file.
#
#   cmake -DPROGRAM=<exe> -DEXPECTED=<file.expected> [-DACTUAL=<file to keep stdout in>]
#         [-DARGS=<;-list>] [-DWORKING_DIRECTORY=<dir>] -P compare_output.cmake
#
# Fails when the program exits non-zero or when its stdout differs from EXPECTED; on a difference
# it prints the first differing line and, where `diff` exists, a unified diff.
cmake_minimum_required(VERSION 3.21)

include("${CMAKE_CURRENT_LIST_DIR}/script_args.cmake")
pss_require_script_args(compare_output.cmake PROGRAM EXPECTED)
if(NOT EXISTS "${EXPECTED}")
  message(FATAL_ERROR "compare_output.cmake: golden file ${EXPECTED} does not exist")
endif()
if(NOT DEFINED WORKING_DIRECTORY)
  set(WORKING_DIRECTORY ".")
endif()
if(NOT DEFINED ACTUAL)
  get_filename_component(_name "${EXPECTED}" NAME_WE)
  set(ACTUAL "${CMAKE_CURRENT_BINARY_DIR}/${_name}.actual")
endif()

execute_process(
  COMMAND "${PROGRAM}" ${ARGS}
  WORKING_DIRECTORY "${WORKING_DIRECTORY}"
  OUTPUT_VARIABLE actual
  ERROR_VARIABLE errors
  RESULT_VARIABLE result)
file(WRITE "${ACTUAL}" "${actual}")
if(NOT errors STREQUAL "")
  message("---- stderr of ${PROGRAM} ----\n${errors}---- end of stderr ----")
endif()
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} exited with ${result} (stdout kept in ${ACTUAL})")
endif()

file(READ "${EXPECTED}" expected)
if(actual STREQUAL expected)
  string(LENGTH "${actual}" n)
  message(STATUS "stdout matches ${EXPECTED} (${n} bytes)")
  return()
endif()

# Mismatch: say where, as a diff would.
string(REPLACE ";" "\\;" _e "${expected}")
string(REPLACE ";" "\\;" _a "${actual}")
string(REPLACE "\n" ";" _e "${_e}")
string(REPLACE "\n" ";" _a "${_a}")
list(LENGTH _e ne)
list(LENGTH _a na)
set(line 0)
set(first "")
while(line LESS ne OR line LESS na)
  set(le "<no line>")
  set(la "<no line>")
  if(line LESS ne)
    list(GET _e ${line} le)
  endif()
  if(line LESS na)
    list(GET _a ${line} la)
  endif()
  if(NOT le STREQUAL la)
    math(EXPR shown "${line} + 1")
    set(first "first difference at line ${shown}:\n  expected: \"${le}\"\n  actual:   \"${la}\"\n")
    break()
  endif()
  math(EXPR line "${line} + 1")
endwhile()
if(first STREQUAL "")
  set(first "the lines agree; the files differ in the final newline\n")
endif()

set(diff_text "")
find_program(PSS_DIFF diff)
if(PSS_DIFF)
  execute_process(COMMAND "${PSS_DIFF}" -u "${EXPECTED}" "${ACTUAL}" OUTPUT_VARIABLE diff_text)
endif()
# Plain message(): printed verbatim, where FATAL_ERROR would reflow the diff.
message("stdout of ${PROGRAM} differs from ${EXPECTED}\n${first}${diff_text}"
        "If the new output is right, copy ${ACTUAL} over ${EXPECTED}.")
message(FATAL_ERROR "stdout differs from ${EXPECTED}")
