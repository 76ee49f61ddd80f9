// Portable micro-kernel: a 4 x 16 tile in plain C++ arrays, for CPUs without AVX2. The
// compiler vectorises the inner loop with whatever the baseline target offers (SSE2 on x86-64).
#include "core/cpu/gemm_driver.h"

namespace clustr::cpu {

namespace {

struct GenericKernel {
  static constexpr int MR = 4, NR = 16;

  static void tile(int64_t kc, const float* __restrict a, const float* __restrict b,
                   float* __restrict c, int64_t ldc, float alpha, float beta) {
    float acc[MR][NR] = {};
    for (int64_t p = 0; p < kc; ++p) {
      for (int r = 0; r < MR; ++r)
        for (int j = 0; j < NR; ++j) acc[r][j] += a[r] * b[j];
      a += MR;
      b += NR;
    }
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) {
        float* out = c + r * ldc + j;
        *out = beta == 0.0f ? alpha * acc[r][j] : alpha * acc[r][j] + beta * *out;
      }
  }
};

}  // namespace

void gemm_generic(const gemm_impl::Problem& g, int nthreads) {
  gemm_impl::gemm_blocked<GenericKernel>(g, nthreads);
}

}  // namespace clustr::cpu
