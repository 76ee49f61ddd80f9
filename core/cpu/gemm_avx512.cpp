// AVX-512 micro-kernel: a 12 x 32 tile of C in 24 zmm accumulators. Per step p it loads two
// vectors of the packed B row and broadcasts 12 elements of the packed A column (folded into
// the FMA as a memory operand), 24 FMAs for 14 loads. Compiled with -mavx512f (CMake).
#include <immintrin.h>

#include "core/cpu/gemm_driver.h"

namespace clustr::cpu {

namespace {

struct Avx512Kernel {
  static constexpr int MR = 12, NR = 32;

  static void tile(int64_t kc, const float* __restrict a, const float* __restrict b,
                   float* __restrict c, int64_t ldc, float alpha, float beta) {
    __m512 acc[MR][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      // The C tile is needed only after the k loop; start fetching it now (2 lines a row).
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; ++p) {
      __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        __m512 ar = _mm512_set1_ps(a[r]);
        acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
      }
      a += MR;
      b += NR;
    }
    __m512 va = _mm512_set1_ps(alpha);
    if (beta == 0.0f) {
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        _mm512_storeu_ps(c + r * ldc, _mm512_mul_ps(va, acc[r][0]));
        _mm512_storeu_ps(c + r * ldc + 16, _mm512_mul_ps(va, acc[r][1]));
      }
    } else {
      __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        float* row = c + r * ldc;
        _mm512_storeu_ps(row, _mm512_fmadd_ps(vb, _mm512_loadu_ps(row), _mm512_mul_ps(va, acc[r][0])));
        _mm512_storeu_ps(row + 16,
                         _mm512_fmadd_ps(vb, _mm512_loadu_ps(row + 16), _mm512_mul_ps(va, acc[r][1])));
      }
    }
  }
};

}  // namespace

void gemm_avx512(const gemm_impl::Problem& g, int nthreads) {
  gemm_impl::gemm_blocked<Avx512Kernel>(g, nthreads);
}

}  // namespace clustr::cpu
