# cmake/check_meson_version.cmake: meson.build's project version equals include/pss/version.hpp's.
#   cmake -DMESON_BUILD=<meson.build> -DVERSION=<x.y.z> -P check_meson_version.cmake
cmake_minimum_required(VERSION 3.21)
file(READ "${MESON_BUILD}" text)
if(NOT text MATCHES "version *: *'([0-9]+\\.[0-9]+\\.[0-9]+)'")
  message(FATAL_ERROR "${MESON_BUILD}: no `version: 'x.y.z'` in project()")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL VERSION)
  message(FATAL_ERROR "meson.build says version ${CMAKE_MATCH_1} but include/pss/version.hpp says ${VERSION}: "
                      "update meson.build's project(version: ...)")
endif()
message(STATUS "meson.build version ${CMAKE_MATCH_1} = include/pss/version.hpp")
