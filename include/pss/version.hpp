// pss/version.hpp: the library's version; CMake and meson read it from here.
#pragma once

#define PSS_VERSION_MAJOR 0
#define PSS_VERSION_MINOR 1
#define PSS_VERSION_PATCH 0
