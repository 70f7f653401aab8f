// bench_support.hpp: what several benchmarks need beside the ratio table: this process's memory as
// /proc/self/status reports it, and a scratch directory for their files.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

namespace pss_bench {

/// A /proc/self/status field in KiB: VmHWM is the peak resident size, VmRSS the current one; -1 when unknown.
inline long status_kib(const std::string& field) {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind(field + ":", 0) == 0) return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
    return -1;
}

/// `<PSS_BENCH_DIR, else the system's temporary directory>/<name>_<pid>` (not created).
inline std::string scratch_directory(const std::string& name) {
    const char* dir = std::getenv("PSS_BENCH_DIR");
    const std::filesystem::path base = dir != nullptr && *dir != '\0' ? std::filesystem::path(dir)
                                                                     : std::filesystem::temp_directory_path();
    return (base / (name + "_" + std::to_string(::getpid()))).string();
}

}  // namespace pss_bench
