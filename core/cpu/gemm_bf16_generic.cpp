// The portable bf16 kernel (plain C++, any CPU): the same packed operands as the AMX and
// AVX512-BF16 kernels (gemm_bf16_driver.h), each pair of products added to a float32
// accumulator per element of C, the even k first, as vdpbf16ps describes it.
#include <cstdint>

#include "core/cpu/gemm_bf16_driver.h"

namespace clustr::cpu {

namespace {

using gemm_bf16_impl::ATiles;
using gemm_bf16_impl::BlockC;
using gemm_bf16_impl::from_bf16;
using gemm_bf16_impl::kTileElems;

struct GenericBf16Kernel {
  static void begin() {}
  static void end() {}

  template <int RG, int CG>
  static void block(int64_t ktiles, const ATiles& a, const uint16_t* b, const BlockC& c) {
    constexpr int R = 16 * RG, N = 16 * CG;
    const int64_t group = ktiles * kTileElems;
    float acc[R][N] = {};
    for (int64_t t = 0; t < ktiles; ++t)
      for (int kp = 0; kp < 16; ++kp) {
        float b0[N], b1[N];  // this pair of k for every column
        for (int j = 0; j < N; ++j) {
          const uint16_t* w = b + (j / 16) * group + t * kTileElems + kp * 32 + (j % 16) * 2;
          b0[j] = from_bf16(w[0]);
          b1[j] = from_bf16(w[1]);
        }
        for (int r = 0; r < R; ++r) {
          const uint16_t* w = a.a + (r / 16) * a.gs + t * a.ts + (r % 16) * a.ld + 2 * kp;
          const float a0 = from_bf16(w[0]), a1 = from_bf16(w[1]);
          for (int j = 0; j < N; ++j) {
            acc[r][j] += a0 * b0[j];
            acc[r][j] += a1 * b1[j];
          }
        }
      }
    gemm_bf16_impl::finish_block(&acc[0][0], N, c);
  }
};

}  // namespace

void gemm_bf16_generic(const GemmBf16Call& g, int nthreads) {
  gemm_bf16_impl::gemm_blocked<GenericBf16Kernel>(g, nthreads);
}

void gemm_bf16_generic_many(const GemmBf16Call* g, int count, int nthreads) {
  gemm_bf16_impl::gemm_many_blocked<GenericBf16Kernel>(g, count, nthreads);
}

}  // namespace clustr::cpu
