// The AMX bf16 kernel (compiled with -mamx-tile -mamx-bf16 and AVX-512 for the packing).
//
// Eight tile registers of 16 rows x 64 bytes: tmm0-3 hold the 2 x 2 float32 tiles of a 32 x 32
// block of C, tmm4-5 the block's two rowgroups of op(A) for one depth tile (16 x 32 bf16),
// tmm6-7 its two colgroups of op(B) (16 pairs of k x 16 columns). One _tile_dpbf16ps
// multiplies a rowgroup by a colgroup over 32 values of k: 16 x 16 x 32 multiply-adds.
//
// Full blocks whose store is plain (alpha 1, no ReLU or mask) load and store C's tiles in place:
// C itself when beta is 1 (and in every later depth block), the bias row repeated down the
// tile (a load with row stride 0) when beta is 0 and there is a bias, zeros otherwise. Other
// blocks (edges of C, alpha != 1, the ReLU and the mask, a bf16 C) go through a 4 KiB scratch
// block and finish_block.
//
// The tile configuration is per thread: begin() loads it before a thread's rectangle, end()
// releases the tile state. The operating system must have granted this process the tile data
// (gemm_bf16.cpp asks before this kernel is first chosen).
#include <immintrin.h>

#include <cstdint>

#include "core/cpu/gemm_bf16_driver.h"

namespace clustr::cpu {

namespace {

using gemm_bf16_impl::ATiles;
using gemm_bf16_impl::BlockC;
using gemm_bf16_impl::kTileElems;

// The 64-byte operand of ldtilecfg (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of each tile
  uint8_t rows[16];
};

struct AmxKernel {
  static void begin() {
    TileConfig cfg{};
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
  }
  static void end() { _tile_release(); }

  template <int RG, int CG>
  static void block(int64_t ktiles, const ATiles& a, const uint16_t* b, const BlockC& c) {
    const int64_t group = ktiles * kTileElems;
    const int64_t a_stride = a.ld * static_cast<int64_t>(sizeof(uint16_t));
    const bool direct = c.rows == 16 * RG && c.cols == 16 * CG && c.alpha == 1.0f && !c.relu &&
                        !c.mask && !c.maskb && !c.cb &&
                        (c.beta == 0.0f || (c.beta == 1.0f && !c.bias));
    const int64_t ldc_bytes = c.ldc * static_cast<int64_t>(sizeof(float));
    float* c0 = direct ? c.c : nullptr;  // (a bf16 C has no float pointer to offset)
    float* c1 = direct ? c.c + 16 : nullptr;
    float* c2 = direct ? c.c + 16 * c.ldc : nullptr;
    float* c3 = direct ? c.c + 16 * c.ldc + 16 : nullptr;
    if (direct && c.beta == 1.0f) {
      _tile_loadd(0, c0, ldc_bytes);
      if constexpr (CG == 2) _tile_loadd(1, c1, ldc_bytes);
      if constexpr (RG == 2) _tile_loadd(2, c2, ldc_bytes);
      if constexpr (RG == 2 && CG == 2) _tile_loadd(3, c3, ldc_bytes);
    } else if (direct && c.bias) {  // every row of the tile is the bias
      _tile_loadd(0, c.bias, 0);
      if constexpr (CG == 2) _tile_loadd(1, c.bias + 16, 0);
      if constexpr (RG == 2) _tile_loadd(2, c.bias, 0);
      if constexpr (RG == 2 && CG == 2) _tile_loadd(3, c.bias + 16, 0);
    } else {
      _tile_zero(0);
      if constexpr (CG == 2) _tile_zero(1);
      if constexpr (RG == 2) _tile_zero(2);
      if constexpr (RG == 2 && CG == 2) _tile_zero(3);
    }
    for (int64_t t = 0; t < ktiles; ++t) {
      const int64_t off = t * kTileElems;
      const uint16_t* at = a.a + t * a.ts;
      _tile_loadd(4, at, a_stride);
      _tile_loadd(6, b + off, 64);
      if constexpr (CG == 2) _tile_loadd(7, b + group + off, 64);
      if constexpr (RG == 2) _tile_loadd(5, at + a.gs, a_stride);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (CG == 2) _tile_dpbf16ps(1, 4, 7);
      if constexpr (RG == 2) _tile_dpbf16ps(2, 5, 6);
      if constexpr (RG == 2 && CG == 2) _tile_dpbf16ps(3, 5, 7);
    }
    if (direct) {
      _tile_stored(0, c0, ldc_bytes);
      if constexpr (CG == 2) _tile_stored(1, c1, ldc_bytes);
      if constexpr (RG == 2) _tile_stored(2, c2, ldc_bytes);
      if constexpr (RG == 2 && CG == 2) _tile_stored(3, c3, ldc_bytes);
      return;
    }
    alignas(64) float scratch[32 * 32];
    constexpr int64_t kLd = 32 * sizeof(float);
    _tile_stored(0, scratch, kLd);
    if constexpr (CG == 2) _tile_stored(1, scratch + 16, kLd);
    if constexpr (RG == 2) _tile_stored(2, scratch + 16 * 32, kLd);
    if constexpr (RG == 2 && CG == 2) _tile_stored(3, scratch + 16 * 32 + 16, kLd);
    gemm_bf16_impl::finish_block(scratch, 32, c);
  }
};

}  // namespace

void gemm_bf16_amx(const GemmBf16Call& g, int nthreads) {
  gemm_bf16_impl::gemm_blocked<AmxKernel>(g, nthreads);
}

void gemm_bf16_amx_many(const GemmBf16Call* g, int count, int nthreads) {
  gemm_bf16_impl::gemm_many_blocked<AmxKernel>(g, count, nthreads);
}

}  // namespace clustr::cpu
