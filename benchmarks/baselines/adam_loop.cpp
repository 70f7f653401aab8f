// benchmarks/baselines/adam_loop.cpp: bench_optimizers' hand-written Adam loop, in a translation unit of
// its own so that it alone is built with -fno-math-errno (benchmarks/CMakeLists.txt): GCC vectorizes its
// std::sqrt only then, and pss's Adam (which cannot ask its includer for that flag) is measured
// against the loop at its fastest.
#include <cmath>
#include <cstddef>

void adam_loop(float* w, float* m, float* v, const float* g, std::size_t n, float alpha, float one_minus_b1,
               float one_minus_b2, float eps) {
    for (std::size_t i = 0; i < n; ++i) {
        m[i] += (g[i] - m[i]) * one_minus_b1;
        v[i] += (g[i] * g[i] - v[i]) * one_minus_b2;
        w[i] -= alpha * m[i] / (std::sqrt(v[i]) + eps);
    }
}
