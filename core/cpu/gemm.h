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

// Element-wise work fused into the GEMM's store of C, done while each tile of C is still in
// cache (one pass over C saved per step; a layer's bias, ReLU and ReLU gradient):
//   C = relu?(alpha op(A) op(B) + beta C + bias[j]),  then C[i, j] = 0 where !(mask[i, j] > 0);
// and one more output read off op(A) while the kernel has it in cache: a_row_sums[i] = the sum
// over p of op(A)[i, p], in double (with op(A) = dY^T, a linear layer's bias gradient comes
// with its weight gradient dY^T X).
// Value-initialised (GemmEpilogue{}) it does nothing. The bias is added once, with the beta
// term; ReLU keeps NaN (as math::relu) and the mask test drops it (as math::ReluGrad). A plain
// aggregate with no member functions, so the micro-kernel files (compiled for wider
// instruction sets) emit no inline code that the linker could share with other files.
struct GemmEpilogue {
  const float* bias;  // (N), or null
  bool relu;
  const float* mask;  // (M, N) with row stride ldm, or null
  int64_t ldm;
  float* a_row_sums;  // (M) output, or null
};

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);
// gemm with the epilogue applied to C.
void gemm_fused(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                int64_t ldc, const GemmEpilogue& epilogue);

// The arguments of one gemm_fused call, for gemm_many.
struct GemmCall {
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
  GemmEpilogue epilogue;
};
// Independent products computed together, in one parallel region (one fork and join instead
// of one per product): the threads take the products' rectangles in turn. Each C is exactly
// what gemm_fused gives. No product may write what another reads.
void gemm_many(const GemmCall* calls, int count);

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
// environment variable CLUSTR_GEMM_KERNEL to one of these (if supported) forces it. The
// variable may also name the bf16 GEMM's kernel (core/cpu/gemm_bf16.h), alone or in a list
// separated by commas ("avx2,avx512bf16"); "generic" forces both.
const char* gemm_kernel_name();

}  // namespace clustr::cpu
