// In-process push and pull of 1 MB and 64 MB through a ParameterServerStrategy, beside memcpy of the
// same bytes in the same run. The limit: at least 0.5x memcpy's bytes per second.
//
// A push is apply_gradient with SGD (the ps reads the gradient and the value, writes the value); a pull
// is read_into a reused buffer. Both reuse their buffers, as a training loop does, so neither pays for
// fresh pages (about 190 ms per 64 MB here, ../shared/STACK.md).
#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>

#include <pss/pss.hpp>

#include "ratio_report.hpp"

namespace {

std::size_t floats_of(std::int64_t bytes) { return static_cast<std::size_t>(bytes) / sizeof(float); }

void memcpy_baseline(benchmark::State& state) {
    std::vector<float> src(floats_of(state.range(0)), 1.0f), dst(src.size(), 0.0f);
    for (auto _ : state) {
        std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
        benchmark::DoNotOptimize(dst.data());
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * state.range(0));
}

void push(benchmark::State& state) {
    pss::ParameterServerStrategy<> strategy({}, {}, pss::SGD(1e-6));
    auto scope = strategy.scope();
    const std::size_t n = floats_of(state.range(0));
    pss::Variable v(xt::xarray<float>(xt::zeros<float>({n})), "v");
    pss::Tensor gradient(xt::xarray<float>(xt::ones<float>({n})));
    for (auto _ : state) gradient = v.apply_gradient(std::move(gradient));  // the spent buffer comes back
    state.SetBytesProcessed(state.iterations() * state.range(0));
}

void pull(benchmark::State& state) {
    pss::ParameterServerStrategy<> strategy;
    auto scope = strategy.scope();
    const std::size_t n = floats_of(state.range(0));
    pss::Variable v(xt::xarray<float>(xt::ones<float>({n})), "v");
    xt::xarray<float> out = xt::zeros<float>({n});
    for (auto _ : state) {
        v.read_into(out);
        benchmark::DoNotOptimize(out.data());
    }
    state.SetBytesProcessed(state.iterations() * state.range(0));
}

constexpr std::int64_t MB = 1 << 20;

}  // namespace

BENCHMARK(memcpy_baseline)->Arg(1 * MB)->Arg(64 * MB)->UseRealTime();
BENCHMARK(push)->Arg(1 * MB)->Arg(64 * MB)->UseRealTime();
BENCHMARK(pull)->Arg(1 * MB)->Arg(64 * MB)->UseRealTime();

int main(int argc, char** argv) {
    return pss_bench::run(argc, argv,
                          {
                              {"push 1 MB", "push/1048576/real_time", "memcpy_baseline/1048576/real_time", 0.5},
                              {"pull 1 MB", "pull/1048576/real_time", "memcpy_baseline/1048576/real_time", 0.5},
                              {"push 64 MB", "push/67108864/real_time", "memcpy_baseline/67108864/real_time", 0.5},
                              {"pull 64 MB", "pull/67108864/real_time", "memcpy_baseline/67108864/real_time", 0.5},
                          });
}
