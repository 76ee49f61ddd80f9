// The arguments of one row-major GEMM, as passed from gemm.cpp to the ISA-specific drivers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace clustr::cpu::gemm_impl {

struct Problem {
  bool trans_a, trans_b;
  int64_t M, N, K;
  float alpha;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float beta;
  float* C;
  int64_t ldc;
};

// Defined in gemm.cpp, outside the ISA-specific files, where exceptions are made.
[[noreturn]] void throw_out_of_memory(size_t bytes);

}  // namespace clustr::cpu::gemm_impl
