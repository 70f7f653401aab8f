// The library pss::compiled: pss's runtime compiled once, for programs built with
// PSS_SEPARATE_COMPILATION (see pss/config.hpp).
#define PSS_BUILD_LIBRARY
#include <pss/keras.hpp>
