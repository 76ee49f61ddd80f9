// Portable micro-kernel: a 4 x 16 tile in plain C++ arrays, for CPUs without AVX2. The
// compiler vectorises the inner loop with whatever the baseline target offers (SSE2 on x86-64).
#include "core/cpu/gemm_driver.h"

namespace clustr::cpu {

namespace {

struct GenericKernel {
  static constexpr int MR = 4, NR = 16;

  // R rows (MR: this kernel has no narrower variants).
  template <int R>
  static void tile(int64_t kc, const gemm_impl::APanel& ap, const gemm_impl::BPanel& bp,
                   float* __restrict c, int64_t ldc, float alpha, float beta,
                   const gemm_impl::TileEpilogue& ep) {
    float acc[R][NR] = {};
    for (int64_t p = 0; p < kc; ++p) {
      const float* b = bp.b + p * bp.ld;
      for (int r = 0; r < R; ++r) {
        const float a = ap.a[r * ap.rs + p * ap.cs];
        for (int j = 0; j < NR; ++j) acc[r][j] += a * b[j];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NR; ++j) {
        float* out = c + r * ldc + j;
        float v = beta == 0.0f ? alpha * acc[r][j] : alpha * acc[r][j] + beta * *out;
        if (ep.bias) v += ep.bias[j];
        if (ep.relu) v = v < 0.0f ? 0.0f : v;
        if (ep.mask && !(ep.mask[r * ep.ldm + j] > 0.0f)) v = 0.0f;
        *out = v;
      }
  }
};

}  // namespace

void gemm_generic(const gemm_impl::Problem& g, int nthreads) {
  gemm_impl::gemm_blocked<GenericKernel>(g, nthreads);
}

void gemm_generic_many(const gemm_impl::Problem* g, int count, int nthreads) {
  gemm_impl::gemm_many_blocked<GenericKernel>(g, count, nthreads);
}

}  // namespace clustr::cpu
