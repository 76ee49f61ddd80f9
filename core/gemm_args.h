// Argument checks shared by the CPU and CUDA GEMMs (row-major, BLAS-style; see
// core/cpu/gemm.h). Throws a clustr::Error naming `op` and the offending value.
#pragma once

#include <cstdint>

#include "core/error.h"

namespace clustr {

inline void check_gemm_args(const char* op, bool trans_a, bool trans_b, int64_t M, int64_t N,
                            int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
  CLUSTR_CHECK(M >= 0 && N >= 0 && K >= 0, op, ": sizes must be non-negative, got M=", M,
               " N=", N, " K=", K);
  // A stored row-major is M x K (or K x M when transposed): its rows hold K (or M) elements.
  int64_t a_row = trans_a ? M : K, b_row = trans_b ? K : N;
  CLUSTR_CHECK(lda >= a_row && lda >= 1, op, ": lda=", lda, " is smaller than a row of ",
               trans_a ? "A^T" : "A", " (", a_row, " elements)");
  CLUSTR_CHECK(ldb >= b_row && ldb >= 1, op, ": ldb=", ldb, " is smaller than a row of ",
               trans_b ? "B^T" : "B", " (", b_row, " elements)");
  CLUSTR_CHECK(ldc >= N && ldc >= 1, op, ": ldc=", ldc, " is smaller than a row of C (", N,
               " elements)");
}

}  // namespace clustr
