# cmake/run_consumer.cmake: build a consumer project of pss from scratch, run it, check its output.
#
#   cmake -DKIND=cmake|meson -DCONSUMER_DIR=<tests/consumers/way> -DWORK_DIR=<fresh dir>
#         -DPSS_SOURCE_DIR=<checkout> -DCONSUMER_SOURCE=<program.cpp> -DEXPECTED=<golden stdout>
#         [-DINSTALL_FROM=<pss build dir>: `cmake --install` it into WORK_DIR/prefix first]
#         [-DGENERATOR=<cmake generator>] [-DCXX=<compiler>] [-DMESON=<meson>] -P run_consumer.cmake
#
# The consumer project is copied to WORK_DIR/src with the program as main.cpp, so every consumer is
# a self-contained project as a user would write it. Nothing is downloaded. No optimisation flags:
# the consumer compiles fastest so, and its output does not depend on them.
cmake_minimum_required(VERSION 3.21)

foreach(var KIND CONSUMER_DIR WORK_DIR PSS_SOURCE_DIR CONSUMER_SOURCE EXPECTED)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run)
  string(REPLACE ";" " " shown "${ARGN}")
  message(STATUS "$ ${shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "command failed (${result}): ${shown}\n${out}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
file(COPY "${CONSUMER_DIR}/" DESTINATION "${WORK_DIR}/src")
file(COPY_FILE "${CONSUMER_SOURCE}" "${WORK_DIR}/src/main.cpp")

set(prefix "${WORK_DIR}/prefix")
if(DEFINED INSTALL_FROM AND NOT INSTALL_FROM STREQUAL "")
  run("${CMAKE_COMMAND}" --install "${INSTALL_FROM}" --prefix "${prefix}")
endif()

set(build "${WORK_DIR}/build")
if(KIND STREQUAL "cmake")
  set(args -S "${WORK_DIR}/src" -B "${build}" -DCMAKE_BUILD_TYPE= --no-warn-unused-cli
           "-DPSS_SOURCE_DIR=${PSS_SOURCE_DIR}"
           "-DCMAKE_PREFIX_PATH=${prefix}"
           "-DFETCHCONTENT_SOURCE_DIR_PSS=${PSS_SOURCE_DIR}"
           -DFETCHCONTENT_FULLY_DISCONNECTED=ON)
  if(DEFINED GENERATOR AND NOT GENERATOR STREQUAL "")
    list(APPEND args -G "${GENERATOR}")
  endif()
  if(DEFINED CXX AND NOT CXX STREQUAL "")
    list(APPEND args "-DCMAKE_CXX_COMPILER=${CXX}")
  endif()
  run("${CMAKE_COMMAND}" ${args})
  run("${CMAKE_COMMAND}" --build "${build}")
  set(program "${build}/consumer")
elseif(KIND STREQUAL "meson")
  if(NOT DEFINED MESON OR MESON STREQUAL "")
    set(MESON meson)
  endif()
  set(env "PKG_CONFIG_PATH=${prefix}/share/pkgconfig")
  if(DEFINED CXX AND NOT CXX STREQUAL "")
    list(APPEND env "CXX=${CXX}")
  endif()
  if(EXISTS "${WORK_DIR}/src/subprojects")
    # A meson subproject: the checkout itself, as a user would vendor it (a copy: meson refuses
    # subproject directories outside the consumer).
    file(COPY "${PSS_SOURCE_DIR}/meson.build" DESTINATION "${WORK_DIR}/src/subprojects/pss")
    file(COPY "${PSS_SOURCE_DIR}/include" DESTINATION "${WORK_DIR}/src/subprojects/pss")
    if(EXISTS "${PSS_SOURCE_DIR}/meson_options.txt")
      file(COPY "${PSS_SOURCE_DIR}/meson_options.txt" DESTINATION "${WORK_DIR}/src/subprojects/pss")
    endif()
  endif()
  run("${CMAKE_COMMAND}" -E env ${env} "${MESON}" setup --buildtype=plain "${build}" "${WORK_DIR}/src")
  run("${MESON}" compile -C "${build}")
  set(program "${build}/consumer")
else()
  message(FATAL_ERROR "run_consumer.cmake: KIND is \"${KIND}\"; use cmake or meson")
endif()

set(PROGRAM "${program}")
set(ACTUAL "${WORK_DIR}/stdout.actual")
include("${CMAKE_CURRENT_LIST_DIR}/compare_output.cmake")
