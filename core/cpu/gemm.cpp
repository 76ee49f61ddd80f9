// GEMM entry points: argument checks, the choice of micro-kernel for this CPU, threading
// decisions, and the strided-batched form.
#include "core/cpu/gemm.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/cpu/gemm_problem.h"
#include "core/gemm_args.h"
#include "core/parallel.h"

namespace clustr::cpu {

// Defined in the ISA-specific files.
void gemm_avx512(const gemm_impl::Problem& g, int nthreads);
void gemm_avx2(const gemm_impl::Problem& g, int nthreads);
void gemm_generic(const gemm_impl::Problem& g, int nthreads);
void gemm_avx512_many(const gemm_impl::Problem* g, int count, int nthreads);
void gemm_avx2_many(const gemm_impl::Problem* g, int count, int nthreads);
void gemm_generic_many(const gemm_impl::Problem* g, int count, int nthreads);

namespace gemm_impl {
void throw_out_of_memory(size_t bytes) {
  throw Error(detail::cat("gemm: out of memory allocating ", bytes, " bytes of packing buffers"));
}

const char* forced_kernel(const char* const* family, int count) {
  static const char* const known[] = {"avx512", "avx2", "generic", "amx", "avx512bf16"};
  const char* env = std::getenv("CLUSTR_GEMM_KERNEL");
  if (!env || !*env) return nullptr;
  const char* found = nullptr;
  for (const char* p = env; *p;) {
    const char* end = std::strchr(p, ',');
    const size_t len = end ? static_cast<size_t>(end - p) : std::strlen(p);
    const char* name = nullptr;
    for (const char* k : known)
      if (std::strlen(k) == len && std::strncmp(p, k, len) == 0) name = k;
    CLUSTR_CHECK(name, "gemm: CLUSTR_GEMM_KERNEL=", env, " names an unknown kernel '",
                 std::string(p, len), "' (known: avx512, avx2, generic for the float32 GEMM; ",
                 "amx, avx512bf16, generic for the bf16 GEMM)");
    for (int i = 0; i < count; ++i)
      if (!found && std::strcmp(name, family[i]) == 0) found = family[i];
    p = end ? end + 1 : p + len;
  }
  return found;
}
}  // namespace gemm_impl

namespace {

using KernelFn = void (*)(const gemm_impl::Problem&, int);
using ManyFn = void (*)(const gemm_impl::Problem*, int, int);

struct Choice {
  KernelFn fn;
  ManyFn many;
  const char* name;
};

bool cpu_has(const char* isa) {
  if (std::strcmp(isa, "avx512") == 0) return __builtin_cpu_supports("avx512f");
  if (std::strcmp(isa, "avx2") == 0)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return std::strcmp(isa, "generic") == 0;
}

Choice choose_kernel() {
  static const Choice table[] = {{gemm_avx512, gemm_avx512_many, "avx512"},
                                 {gemm_avx2, gemm_avx2_many, "avx2"},
                                 {gemm_generic, gemm_generic_many, "generic"}};
  static const char* const names[] = {"avx512", "avx2", "generic"};
  if (const char* forced = gemm_impl::forced_kernel(names, 3)) {
    for (const Choice& c : table)
      if (std::strcmp(forced, c.name) == 0) {
        CLUSTR_CHECK(cpu_has(c.name), "gemm: CLUSTR_GEMM_KERNEL asks for ", forced,
                     " but this CPU does not support it");
        return c;
      }
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

void gemm_fused(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                int64_t ldc, const GemmEpilogue& epilogue) {
  check_gemm_args("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  CLUSTR_CHECK(!epilogue.mask || epilogue.ldm >= N, "gemm: the epilogue's mask row stride ldm=",
               epilogue.ldm, " is smaller than a row of C (", N, " elements)");
  double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  int threads = flops < kParallelFlops ? 1 : num_threads();
  kernel().fn({trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue},
              threads);
}

void gemm_many(const GemmCall* calls, int count) {
  double flops = 0;
  for (int c = 0; c < count; ++c) {
    const GemmCall& g = calls[c];
    check_gemm_args("gemm", g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, g.ldc);
    CLUSTR_CHECK(!g.epilogue.mask || g.epilogue.ldm >= g.N, "gemm: the epilogue's mask row ",
                 "stride ldm=", g.epilogue.ldm, " is smaller than a row of C (", g.N,
                 " elements)");
    flops += 2.0 * static_cast<double>(g.M) * static_cast<double>(g.N) * static_cast<double>(g.K);
  }
  kernel().many(calls, count, flops < kParallelFlops ? 1 : num_threads());
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  gemm_fused(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, GemmEpilogue{});
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
          C + b * stride_c, ldc, GemmEpilogue{}},
         1);
    return;
  }
  for (int64_t b = 0; b < batch; ++b)
    fn({trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta,
        C + b * stride_c, ldc, GemmEpilogue{}},
       flops < kParallelFlops ? 1 : threads);
}

}  // namespace clustr::cpu
