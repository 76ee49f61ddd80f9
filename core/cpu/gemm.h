// Single-precision GEMM on row-major matrices, BLAS-style:
//   C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C
// op(A) is A (M x K, row stride lda) or, with trans_a, A^T where A is stored K x M; likewise B.
// beta == 0 overwrites C without reading it (so C may hold NaN or garbage). The result does not
// depend on the number of threads.
//
// The fast path is packed and register-blocked (gemm_driver.h) with micro-kernels for AVX-512,
// AVX2+FMA and portable C++, chosen at run time from what the CPU supports.
#pragma once

#include <cstdint>

namespace clustr::cpu {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

// batch independent GEMMs; matrix b of each operand starts stride_x elements after matrix b-1.
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                          float alpha, const float* A, int64_t lda, int64_t stride_a,
                          const float* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                          int64_t ldc, int64_t stride_c, int64_t batch);

// The plain triple loop (double accumulation): the test oracle, never used for speed.
void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc);

// Which micro-kernel gemm() uses on this CPU: "avx512", "avx2" or "generic". Setting the
// environment variable CLUSTR_GEMM_KERNEL to one of these (if supported) forces it.
const char* gemm_kernel_name();

}  // namespace clustr::cpu
