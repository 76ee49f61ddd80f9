// AVX2 + FMA micro-kernel: a 6 x 16 tile of C in 12 ymm accumulators (the classic shape for 16
// vector registers). Compiled with -mavx2 -mfma (CMake).
#include <immintrin.h>

#include "core/cpu/gemm_driver.h"

namespace clustr::cpu {

namespace {

struct Avx2Kernel {
  static constexpr int MR = 6, NR = 16;

  // R rows: MR, or 2 or 4 for the edge of C.
  template <int R>
  static void tile(int64_t kc, const gemm_impl::APanel& ap, const gemm_impl::BPanel& bp,
                   float* __restrict c, int64_t ldc, float alpha, float beta,
                   const gemm_impl::TileEpilogue& ep) {
    __m256 acc[R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const float* __restrict b = bp.b;
    const int64_t ldb = bp.ld;
    if (ap.rs == 1) {  // packed, or A^T in place: a step's MR elements are consecutive
      const float* __restrict a = ap.a;
      const int64_t step = ap.cs;
#pragma GCC unroll 4
      for (int64_t p = 0; p < kc; ++p) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
          __m256 ar = _mm256_broadcast_ss(a + r);
          acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
        }
        a += step;
        b += ldb;
      }
    } else {  // R rows of A in place (cs = 1), as bases of three rows rs apart
      const int64_t rs = ap.rs;
      const float* base[2] = {ap.a, ap.a + 3 * rs};
#pragma GCC unroll 4
      for (int64_t p = 0; p < kc; ++p) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
          __m256 ar = _mm256_broadcast_ss(base[r / 3] + (r % 3) * rs + p);
          acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
        }
        b += ldb;
      }
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    const __m256 zero = _mm256_setzero_ps();
    __m256 bias0 = zero, bias1 = zero;
    if (ep.bias) bias0 = _mm256_loadu_ps(ep.bias), bias1 = _mm256_loadu_ps(ep.bias + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      float* row = c + r * ldc;
      __m256 lo = _mm256_mul_ps(va, acc[r][0]), hi = _mm256_mul_ps(va, acc[r][1]);
      if (beta != 0.0f) {
        lo = _mm256_fmadd_ps(vb, _mm256_loadu_ps(row), lo);
        hi = _mm256_fmadd_ps(vb, _mm256_loadu_ps(row + 8), hi);
      }
      if (ep.bias) lo = _mm256_add_ps(lo, bias0), hi = _mm256_add_ps(hi, bias1);
      // max(0, v) with v second: a NaN v passes, as math::relu.
      if (ep.relu) lo = _mm256_max_ps(zero, lo), hi = _mm256_max_ps(zero, hi);
      if (ep.mask) {
        const float* m = ep.mask + r * ep.ldm;
        lo = _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(m), zero, _CMP_GT_OQ), lo);
        hi = _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(m + 8), zero, _CMP_GT_OQ), hi);
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

void gemm_avx2_many(const gemm_impl::Problem* g, int count, int nthreads) {
  gemm_impl::gemm_many_blocked<Avx2Kernel>(g, count, nthreads);
}

}  // namespace clustr::cpu
