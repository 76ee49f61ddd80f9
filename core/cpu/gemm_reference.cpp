// The test oracle: the definition of GEMM as a triple loop, accumulated in double.
#include "core/cpu/gemm.h"
#include "core/gemm_args.h"

namespace clustr::cpu {

void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc) {
  check_gemm_args("gemm_reference", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < K; ++p) {
        double a = trans_a ? A[p * lda + i] : A[i * lda + p];
        double b = trans_b ? B[j * ldb + p] : B[p * ldb + j];
        acc += a * b;
      }
      float* c = C + i * ldc + j;
      double prior = beta == 0.0f ? 0.0 : static_cast<double>(beta) * *c;
      *c = static_cast<float>(alpha * acc + prior);
    }
}

}  // namespace clustr::cpu
