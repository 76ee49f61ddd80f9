// AVX2 + FMA micro-kernel: a 6 x 16 tile of C in 12 ymm accumulators (the classic shape for 16
// vector registers). Compiled with -mavx2 -mfma (CMake).
#include <immintrin.h>

#include "core/cpu/gemm_driver.h"

namespace clustr::cpu {

namespace {

struct Avx2Kernel {
  static constexpr int MR = 6, NR = 16;

  static void tile(int64_t kc, const float* __restrict a, const float* __restrict b,
                   float* __restrict c, int64_t ldc, float alpha, float beta) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; ++p) {
      __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        __m256 ar = _mm256_broadcast_ss(a + r);
        acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
      }
      a += MR;
      b += NR;
    }
    __m256 va = _mm256_set1_ps(alpha);
    __m256 vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      float* row = c + r * ldc;
      __m256 lo = _mm256_mul_ps(va, acc[r][0]), hi = _mm256_mul_ps(va, acc[r][1]);
      if (beta != 0.0f) {
        lo = _mm256_fmadd_ps(vb, _mm256_loadu_ps(row), lo);
        hi = _mm256_fmadd_ps(vb, _mm256_loadu_ps(row + 8), hi);
      }
      _mm256_storeu_ps(row, lo);
      _mm256_storeu_ps(row + 8, hi);
    }
  }
};

}  // namespace

void gemm_avx2(const gemm_impl::Problem& g, int nthreads) {
  gemm_impl::gemm_blocked<Avx2Kernel>(g, nthreads);
}

}  // namespace clustr::cpu
