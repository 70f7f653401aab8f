# cmake/pssFindAsio.cmake: finds standalone Asio (header-only, no CMake package, no pkg-config file)
# and defines the imported INTERFACE target pss::asio. Used by pss's own CMakeLists.txt and by the
# installed pssConfig.cmake, so the installed package holds no absolute path to Asio.
#
# Input:  PSS_ASIO_INCLUDE_DIR (cache) may point at the directory that holds asio.hpp.
# Output: target pss::asio, pss_asio_FOUND, PSS_ASIO_VERSION (e.g. 1.22.1).
# No include_guard: a second find_package(pss) in another directory must see pss_asio_FOUND too.

find_path(PSS_ASIO_INCLUDE_DIR NAMES asio.hpp
  DOC "Directory holding standalone Asio's asio.hpp (Debian: libasio-dev)")
mark_as_advanced(PSS_ASIO_INCLUDE_DIR)

set(pss_asio_FOUND FALSE)
if(PSS_ASIO_INCLUDE_DIR AND EXISTS "${PSS_ASIO_INCLUDE_DIR}/asio/version.hpp")
  file(STRINGS "${PSS_ASIO_INCLUDE_DIR}/asio/version.hpp" _pss_asio_version_line
       REGEX "^#define ASIO_VERSION [0-9]+")
  if(_pss_asio_version_line MATCHES "ASIO_VERSION ([0-9]+)")
    math(EXPR _pss_asio_major "${CMAKE_MATCH_1} / 100000")
    math(EXPR _pss_asio_minor "${CMAKE_MATCH_1} / 100 % 1000")
    math(EXPR _pss_asio_patch "${CMAKE_MATCH_1} % 100")
    set(PSS_ASIO_VERSION "${_pss_asio_major}.${_pss_asio_minor}.${_pss_asio_patch}")
  endif()
  if(NOT TARGET pss::asio)
    # GLOBAL: pss::pss names this target in its link interface, and a consumer that takes pss by
    # add_subdirectory/FetchContent resolves that name from its own directory.
    add_library(pss::asio INTERFACE IMPORTED GLOBAL)
    set_target_properties(pss::asio PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${PSS_ASIO_INCLUDE_DIR}"
      # clang with libstdc++: Asio 1.22 leaves co_await support off unless told; g++ needs nothing.
      INTERFACE_COMPILE_DEFINITIONS "$<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_CO_AWAIT=1>")
  endif()
  set(pss_asio_FOUND TRUE)
endif()
