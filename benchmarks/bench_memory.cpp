// Peak resident memory of a ps holding S bytes of float32 shards under Adam, beside 3S (value, m, v).
// The limit: peak <= 3S + 5% + a fixed few MB. Run as its own process so that nothing else
// counts in its peak. Usage: bench_memory [S in MiB, default 256].
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include <pss/pss.hpp>

#include "bench_support.hpp"

using pss_bench::status_kib;

int main(int argc, char** argv) {
    const std::size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
    constexpr std::size_t num_variables = 32;  // one gradient in flight is S/32: about 3% of S
    const std::size_t floats_per_variable = mib * (1 << 20) / sizeof(float) / num_variables;
    const double s_mib = static_cast<double>(floats_per_variable * num_variables * sizeof(float)) / (1 << 20);
    const long baseline_kib = status_kib("VmRSS");
    {
        pss::ParameterServerStrategy<pss::InProcessTransport, pss::NoPartitioner, pss::Adam,
                                     pss::LocalClusterResolver<1, 1>>
            strategy;
        auto scope = strategy.scope();
        std::vector<pss::Variable> variables;
        for (std::size_t i = 0; i < num_variables; ++i)
            variables.emplace_back(xt::xarray<float>(xt::zeros<float>({floats_per_variable})), std::to_string(i));
        for (int step = 0; step < 2; ++step)
            for (auto& v : variables) v.apply_gradient(xt::xarray<float>(xt::ones<float>({floats_per_variable})));
    }
    const double peak_mib = static_cast<double>(status_kib("VmHWM")) / 1024;
    const double base_mib = static_cast<double>(baseline_kib) / 1024;
    const double limit_mib = 3 * s_mib * 1.05 + base_mib + 16;
    std::printf("ps memory under Adam: S = %.0f MiB of float32 shards in %zu variables, 2 steps each\n", s_mib,
                num_variables);
    std::printf("%-34s %10s %10s %8s %8s\n", "figure", "pss", "3S", "ratio", "limit");
    std::printf("%-34s %6.0f MiB %6.0f MiB %8.3f %8s\n", "peak RSS", peak_mib, 3 * s_mib,
                peak_mib / (3 * s_mib), "");
    std::printf("peak %.0f MiB %s the limit 3S + 5%% + %.0f MiB at start + 16 MiB = %.0f MiB\n", peak_mib,
                peak_mib <= limit_mib ? "is within" : "EXCEEDS", base_mib, limit_mib);
    return 0;
}
