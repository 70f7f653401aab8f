# tests/launch/check_checkpoint.cmake: a checkpoint across clusters of separate processes. Saves under
# pss-launch (2 ps, 2 workers: each ps process writes its own shards), restores under pss-launch into 3
# shards and embedded into 1, and checks that all three print the same values after the save or restore
# and after one more step; then pss-ckpt verifies, lists and shows the checkpoint. Leaves the checkpoint in
# WORK_DIR/ckpts for the numpy test.
#   -DLAUNCH=<pss-launch> -DPROGRAM=<checkpoint_program> -DCKPT=<pss-ckpt> -DWORK_DIR=<scratch dir>
cmake_minimum_required(VERSION 3.21)
include("${CMAKE_CURRENT_LIST_DIR}/chief_lines.cmake")

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(dir "${WORK_DIR}/ckpts")

# Runs the program (launched or embedded) and sets ${name} to the chief's stdout lines.
function(run name mode what shards)
  if(mode STREQUAL "embedded")
    execute_process(COMMAND "${PROGRAM}" ${what} "${dir}" ${shards}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 150)
    set(chief "${out}")
  else()
    execute_process(COMMAND "${LAUNCH}" --ps 2 --workers 2 -- "${PROGRAM}" ${what} "${dir}" ${shards}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 150)
    pss_chief_lines(chief "${out}")
  endif()
  file(WRITE "${WORK_DIR}/${name}.stdout.txt" "${out}")
  file(WRITE "${WORK_DIR}/${name}.stderr.txt" "${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: ${mode} ${what} exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  set(${name} "${chief}" PARENT_SCOPE)
endfunction()

run(saved launched save 2)
run(restored3 launched restore 3)
run(restored1 embedded restore 1)

foreach(name saved restored3 restored1)
  string(FIND "${${name}}" "\n" eol)
  string(SUBSTRING "${${name}}" 0 ${eol} first)
  math(EXPR from "${eol} + 1")
  string(SUBSTRING "${${name}}" ${from} -1 body)
  set(${name}_first "${first}")
  set(${name}_body "${body}")
endforeach()
if(NOT saved_first STREQUAL "step 3, embedding in 2 shards" OR NOT restored3_first STREQUAL "step 3, embedding in 3 shards"
   OR NOT restored1_first STREQUAL "step 3, embedding in 1 shards")
  message(FATAL_ERROR "unexpected first lines: '${saved_first}', '${restored3_first}', '${restored1_first}'")
endif()
if(NOT saved_body MATCHES "saved values:\n  embedding/embeddings:0 = [-0-9]" OR NOT saved_body MATCHES "after one more step:")
  message(FATAL_ERROR "the save run printed no values:\n${saved}")
endif()
foreach(name restored3 restored1)
  if(NOT ${name}_body STREQUAL saved_body)
    message(FATAL_ERROR "${name} differs from the saved run\n--- saved\n${saved_body}\n--- ${name}\n${${name}_body}")
  endif()
endforeach()

# pss-ckpt on the manager's directory (its latest checkpoint).
execute_process(COMMAND "${CKPT}" verify "${dir}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "verified 16 files, [0-9]+ bytes: every size, header and checksum matches the index")
  message(FATAL_ERROR "pss-ckpt verify: ${rc}\n${out}${err}")
endif()
execute_process(COMMAND "${CKPT}" list "${dir}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(expected_line "embedding/embeddings: shape (12, 4) dtype float32 shards 2 (rows 6, 6) slots momentum, velocity counters iterations 6,6\n")
string(FIND "${out}" "${expected_line}" at)
if(NOT rc EQUAL 0 OR at EQUAL -1 OR NOT out MATCHES "step: 3\noptimizer: Adam {")
  message(FATAL_ERROR "pss-ckpt list: ${rc}\n${out}${err}\nexpected the line: ${expected_line}")
endif()
execute_process(COMMAND "${CKPT}" show "${dir}" embedding/embeddings --rows 5:7 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^embedding/embeddings rows 5:7 shape \\(2, 4\\) dtype float32\n[^\n]+ [^\n]+ [^\n]+ [^\n]+\n[^\n]+\n$")
  message(FATAL_ERROR "pss-ckpt show --rows 5:7: ${rc}\n${out}${err}")
endif()
message(STATUS "saved under pss-launch, restored under pss-launch into 3 shards and embedded into 1: same values; pss-ckpt verify, list and show agree")
