// The AVX512-BF16 kernel (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16): for CPUs
// with vdpbf16ps but no AMX (AMD Zen 4, Intel Cooper Lake).
//
// It reads the AMX tile layout of the packed operands (gemm_bf16_driver.h). A block of 32 x 32
// is done in strips of 8 rows x 32 columns: 16 accumulators of 16 floats. For each pair of k,
// one vector per colgroup holds the 16 columns' two values of op(B) (a row of the B tile), and
// each row's two values of op(A) are broadcast as one 32-bit word; vdpbf16ps adds both products
// into the 16 floats. The strip is finished in registers (alpha, beta C, bias, ReLU, mask:
// gemm_bf16_driver.h's finish16) and stored with masks at the edges of C.
#include <immintrin.h>

#include <cstdint>

#include "core/cpu/gemm_bf16_driver.h"

namespace clustr::cpu {

namespace {

using gemm_bf16_impl::ATiles;
using gemm_bf16_impl::BlockC;
using gemm_bf16_impl::kTileElems;

// Rows [r0, r0 + 8) of the block: a points at rowgroup r0 / 16, row r0 % 16 of its first tile;
// its rows are ld apart and its tiles ts apart.
template <int CG>
void strip(int64_t ktiles, const uint16_t* a, int64_t ld, int64_t ts, const uint16_t* b,
           int64_t group, int64_t r0, const BlockC& c) {
  __m512 acc[8][CG];
  // The lines of C that the strip stores at its end, fetched into L1 now, so that those stores
  // need not wait on misses. On Zen 4 a loop of one product of depth 192 with a C of 9 MB ran
  // 5-13% faster; bench_gemm's products gained 2% (median, -5% to +10% between runs;
  // docs/PERFORMANCE.md). Only for a C that is in memory (BlockC::fetch_c). A fetch for
  // writing (prefetchw, built with -mprfchw) measured the same.
  for (int64_t r = r0; c.fetch_c && r < r0 + 8 && r < c.rows; ++r) {
    if (c.c) {
      _mm_prefetch(reinterpret_cast<const char*>(c.c + r * c.ldc), _MM_HINT_T0);
      if (CG == 2) _mm_prefetch(reinterpret_cast<const char*>(c.c + r * c.ldc + 16), _MM_HINT_T0);
    } else {
      _mm_prefetch(reinterpret_cast<const char*>(c.cb + r * c.ldc), _MM_HINT_T0);
    }
  }
  for (int r = 0; r < 8; ++r)
    for (int q = 0; q < CG; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int64_t t = 0; t < ktiles; ++t) {
    const uint16_t* at = a + t * ts;
    const uint16_t* bt = b + t * kTileElems;
    for (int kp = 0; kp < 16; ++kp) {
      __m512bh bv[CG];
      for (int q = 0; q < CG; ++q)
        bv[q] = reinterpret_cast<__m512bh>(_mm512_load_si512(bt + q * group + kp * 32));
      for (int r = 0; r < 8; ++r) {
        int32_t word;
        __builtin_memcpy(&word, at + r * ld + 2 * kp, sizeof word);
        const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(word));
        for (int q = 0; q < CG; ++q) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], av, bv[q]);
      }
    }
  }
  // The results: stored from the registers as alpha P when nothing else applies (C f32, beta
  // 0, no bias, ReLU or mask: the scores and most products of full attention's tiles, whose
  // depth of 32 leaves the finishing a large part of the strip: a 128 x 128 x 32 product 15%
  // faster on Zen 4), else through finish16. Both loops are unrolled, so that each
  // accumulator is read from its register (a loop to a run-time bound indexes them, which
  // puts all 16 on the stack first).
  const int64_t rows = c.rows - r0 < 8 ? c.rows - r0 : 8;
  if (c.c && c.beta == 0.0f && !c.bias && !c.relu && !c.mask && !c.maskb) {
    const __m512 alpha = _mm512_set1_ps(c.alpha);
    const __mmask16 m[2] = {gemm_bf16_impl::mask16(c.cols),
                            CG == 2 ? gemm_bf16_impl::mask16(c.cols - 16) : __mmask16{0}};
    float* out = c.c + r0 * c.ldc;
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      if (r >= rows) break;
#pragma GCC unroll 2
      for (int q = 0; q < CG; ++q)
        _mm512_mask_storeu_ps(out + r * c.ldc + 16 * q, m[q], _mm512_mul_ps(alpha, acc[r][q]));
    }
    return;
  }
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    if (r >= rows) break;
#pragma GCC unroll 2
    for (int q = 0; q < CG; ++q) gemm_bf16_impl::finish16(c, r0 + r, 16 * q, acc[r][q]);
  }
}

struct Avx512Bf16Kernel {
  static void begin() {}
  static void end() {}

  template <int RG, int CG>
  static void block(int64_t ktiles, const ATiles& a, const uint16_t* b, const BlockC& c) {
    const int64_t group = ktiles * kTileElems;
    for (int64_t r0 = 0; r0 < 16 * RG && r0 < c.rows; r0 += 8)
      strip<CG>(ktiles, a.a + (r0 / 16) * a.gs + (r0 % 16) * a.ld, a.ld, a.ts, b, group, r0, c);
  }
};

}  // namespace

void gemm_bf16_avx512(const GemmBf16Call& g, int nthreads) {
  gemm_bf16_impl::gemm_blocked<Avx512Bf16Kernel>(g, nthreads);
}

void gemm_bf16_avx512_many(const GemmBf16Call* g, int count, int nthreads) {
  gemm_bf16_impl::gemm_many_blocked<Avx512Bf16Kernel>(g, count, nthreads);
}

}  // namespace clustr::cpu
