// GEMM entry points: argument checks, the choice of micro-kernel for this CPU, threading
// decisions, and the strided-batched form.
#include "core/cpu/gemm.h"

#include <cstdlib>
#include <cstring>

#include "core/cpu/gemm_problem.h"
#include "core/gemm_args.h"
#include "core/parallel.h"

namespace clustr::cpu {

// Defined in the ISA-specific files.
void gemm_avx512(const gemm_impl::Problem& g, int nthreads);
void gemm_avx2(const gemm_impl::Problem& g, int nthreads);
void gemm_generic(const gemm_impl::Problem& g, int nthreads);

namespace gemm_impl {
void throw_out_of_memory(size_t bytes) {
  throw Error(detail::cat("gemm: out of memory allocating ", bytes, " bytes of packing buffers"));
}
}  // namespace gemm_impl

namespace {

using KernelFn = void (*)(const gemm_impl::Problem&, int);

struct Choice {
  KernelFn fn;
  const char* name;
};

bool cpu_has(const char* isa) {
  if (std::strcmp(isa, "avx512") == 0) return __builtin_cpu_supports("avx512f");
  if (std::strcmp(isa, "avx2") == 0)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return std::strcmp(isa, "generic") == 0;
}

Choice choose_kernel() {
  static const Choice table[] = {
      {gemm_avx512, "avx512"}, {gemm_avx2, "avx2"}, {gemm_generic, "generic"}};
  const char* forced = std::getenv("CLUSTR_GEMM_KERNEL");
  if (forced && *forced) {
    for (const Choice& c : table)
      if (std::strcmp(forced, c.name) == 0) {
        CLUSTR_CHECK(cpu_has(c.name), "gemm: CLUSTR_GEMM_KERNEL=", forced,
                     " but this CPU does not support it");
        return c;
      }
    throw Error(detail::cat("gemm: CLUSTR_GEMM_KERNEL=", forced,
                            " is not one of avx512, avx2, generic"));
  }
  for (const Choice& c : table)
    if (cpu_has(c.name)) return c;
  return table[2];
}

const Choice& kernel() {
  static const Choice choice = choose_kernel();
  return choice;
}

// Below this many flops a parallel region costs more than it saves.
constexpr double kParallelFlops = 2.0 * 64 * 64 * 64;

}  // namespace

const char* gemm_kernel_name() { return kernel().name; }

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  check_gemm_args("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  int threads = flops < kParallelFlops ? 1 : num_threads();
  kernel().fn({trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc}, threads);
}

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                          float alpha, const float* A, int64_t lda, int64_t stride_a,
                          const float* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                          int64_t ldc, int64_t stride_c, int64_t batch) {
  check_gemm_args("gemm_strided_batched", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  CLUSTR_CHECK(batch >= 0, "gemm_strided_batched: batch must be non-negative, got ", batch);
  KernelFn fn = kernel().fn;
  double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  int threads = num_threads();
  // Many small products (attention heads): one product per thread. Few large ones: each
  // product uses every thread. Either way each element is computed the same way.
  if (batch >= threads && flops < 64 * kParallelFlops) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < batch; ++b)
      fn({trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta,
          C + b * stride_c, ldc},
         1);
    return;
  }
  for (int64_t b = 0; b < batch; ++b)
    fn({trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta,
        C + b * stride_c, ldc},
       flops < kParallelFlops ? 1 : threads);
}

}  // namespace clustr::cpu
