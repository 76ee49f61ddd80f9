// bfloat16: the upper 16 bits of an IEEE float32 (1 sign bit, 8 exponent bits, 7 mantissa
// bits). It has float32's range and about 3 significant decimal digits. clustr stores a bf16
// element as its bit pattern in a uint16_t; these are the conversions, written once for the
// CPU and the CUDA device (CLUSTR_HD), bit for bit the same on both.
//
// float -> bf16 rounds to nearest, ties to even, as CUDA's __float2bfloat16_rn and PyTorch's
// .to(torch.bfloat16) do for every number:
//   - a value whose rounding exceeds the largest bf16 (about 3.39e38) becomes +-inf;
//   - subnormal floats round like any other value (to a bf16 subnormal or to +-0); nothing is
//     flushed to zero (the AVX512-BF16 instruction vcvtne2ps2bf16 does flush them: the bf16
//     GEMM, which reads subnormals as zero anyway, packs with it; core/cpu/gemm_bf16.h);
//   - NaN stays NaN with its sign: the upper half of its payload is kept and the quiet bit is
//     set (as vcvtne2ps2bf16 does; PyTorch writes the canonical 0x7fc0 instead), so a NaN whose
//     payload lives in the lower 16 bits never turns into an infinity.
// bf16 -> float is exact (a shift).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/hostdevice.h"

namespace clustr {

CLUSTR_HD uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

CLUSTR_HD float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even: add 0x7fff plus the lowest kept bit, then drop the low 16 bits. A carry
// out of the mantissa moves to the next exponent (and past the largest finite value to inf),
// which is exactly the right answer.
CLUSTR_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

CLUSTR_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// float -> bf16 as the AVX512-BF16 conversions (vcvtneps2bf16, vcvtne2ps2bf16) do it, which is
// how the CPU's bf16 GEMM rounds the f32 operands it packs: float_to_bf16, except that zero and
// subnormal inputs give a signed zero (the bf16 GEMM's reference, core/cpu/gemm_bf16.cpp,
// rounds with it). Written with selects rather than branches on the value.
CLUSTR_HD uint16_t float_to_bf16_ftz(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t nan = (u >> 16) | 0x0040u;
  const uint32_t zero = (u >> 16) & 0x8000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t finite = (u & 0x7f800000u) == 0 ? zero : rounded;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : finite);
}

// f rounded to bf16 and back: the value a bf16 operand carries.
CLUSTR_HD float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace clustr
