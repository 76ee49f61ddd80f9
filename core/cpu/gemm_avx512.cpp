// AVX-512 micro-kernel: a 12 x 32 tile of C in 24 zmm accumulators. Per step p it loads two
// vectors of the B panel's row and broadcasts 12 elements of the A panel's column, 24 FMAs
// for 14 loads. The epilogue (bias, ReLU, mask) works on
// the registers before the store. Compiled with -mavx512f (CMake).
#include <immintrin.h>

#include "core/cpu/gemm_driver.h"

namespace clustr::cpu {

namespace {

struct Avx512Kernel {
  static constexpr int MR = 12, NR = 32;

  // R rows: MR, or 4 or 8 for the edge of C.
  template <int R>
  static void tile(int64_t kc, const gemm_impl::APanel& ap, const gemm_impl::BPanel& bp,
                   float* __restrict c, int64_t ldc, float alpha, float beta,
                   const gemm_impl::TileEpilogue& ep) {
    __m512 acc[R][2];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      // The C tile is needed only after the k loop; start fetching it now (2 lines a row),
      // and the mask's tile with it.
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
      if (ep.mask) {
        _mm_prefetch(reinterpret_cast<const char*>(ep.mask + r * ep.ldm), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(ep.mask + r * ep.ldm + 16), _MM_HINT_T0);
      }
    }
    const float* __restrict b = bp.b;
    const int64_t ldb = bp.ld;
    if (ap.rs == 1) {  // packed, or A^T in place: a step's MR elements are consecutive
      const float* __restrict a = ap.a;
      const int64_t step = ap.cs;
#pragma GCC unroll 4
      for (int64_t p = 0; p < kc; ++p) {
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          __m512 ar = _mm512_set1_ps(a[r]);
          acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
          acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
        }
        a += step;
        b += ldb;
      }
    } else {  // R rows of A in place (cs = 1), as bases of four rows rs apart, so that
              // every row is a base register plus a scaled index
      const int64_t rs = ap.rs;
      const float* base[3] = {ap.a, ap.a + 4 * rs, ap.a + 8 * rs};
#pragma GCC unroll 4
      for (int64_t p = 0; p < kc; ++p) {
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          __m512 ar = _mm512_set1_ps(base[r / 4][(r % 4) * rs + p]);
          acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
          acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
        }
        b += ldb;
      }
    }
    __m512 va = _mm512_set1_ps(alpha);
    if (beta == 0.0f && !ep.bias && !ep.relu && !ep.mask) {  // the plain product
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(c + r * ldc, _mm512_mul_ps(va, acc[r][0]));
        _mm512_storeu_ps(c + r * ldc + 16, _mm512_mul_ps(va, acc[r][1]));
      }
      return;
    }
    const __m512 vb = _mm512_set1_ps(beta), zero = _mm512_setzero_ps();
    __m512 bias0 = zero, bias1 = zero;
    if (ep.bias) bias0 = _mm512_loadu_ps(ep.bias), bias1 = _mm512_loadu_ps(ep.bias + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      float* row = c + r * ldc;
      __m512 v0 = _mm512_mul_ps(va, acc[r][0]), v1 = _mm512_mul_ps(va, acc[r][1]);
      if (beta != 0.0f) {
        v0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row), v0);
        v1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row + 16), v1);
      }
      if (ep.bias) v0 = _mm512_add_ps(v0, bias0), v1 = _mm512_add_ps(v1, bias1);
      if (ep.relu) {  // v < 0 ? 0 : v, as math::relu (NaN passes)
        v0 = _mm512_mask_mov_ps(v0, _mm512_cmp_ps_mask(v0, zero, _CMP_LT_OQ), zero);
        v1 = _mm512_mask_mov_ps(v1, _mm512_cmp_ps_mask(v1, zero, _CMP_LT_OQ), zero);
      }
      if (ep.mask) {
        const float* m = ep.mask + r * ep.ldm;
        v0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_loadu_ps(m), zero, _CMP_GT_OQ), v0);
        v1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_loadu_ps(m + 16), zero, _CMP_GT_OQ),
                                 v1);
      }
      _mm512_storeu_ps(row, v0);
      _mm512_storeu_ps(row + 16, v1);
    }
  }
};

}  // namespace

void gemm_avx512(const gemm_impl::Problem& g, int nthreads) {
  gemm_impl::gemm_blocked<Avx512Kernel>(g, nthreads);
}

void gemm_avx512_many(const gemm_impl::Problem* g, int count, int nthreads) {
  gemm_impl::gemm_many_blocked<Avx512Kernel>(g, count, nthreads);
}

}  // namespace clustr::cpu
