// bf16 GEMM entry points (core/cpu/gemm_bf16.h): argument checks, the choice of kernel for this
// CPU (with the operating system's permission for AMX tile data), threading decisions, the
// degenerate sizes, the strided-batched form and the reference.
#include "core/cpu/gemm_bf16.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "core/cpu/gemm_problem.h"
#include "core/error.h"
#include "core/gemm_args.h"
#include "core/parallel.h"

namespace clustr::cpu {

// Defined in the kernel files.
void gemm_bf16_amx(const GemmBf16Call& g, int nthreads);
void gemm_bf16_avx512(const GemmBf16Call& g, int nthreads);
void gemm_bf16_generic(const GemmBf16Call& g, int nthreads);
void gemm_bf16_amx_many(const GemmBf16Call* g, int count, int nthreads);
void gemm_bf16_avx512_many(const GemmBf16Call* g, int count, int nthreads);
void gemm_bf16_generic_many(const GemmBf16Call* g, int count, int nthreads);

namespace {

using KernelFn = void (*)(const GemmBf16Call&, int);
using ManyFn = void (*)(const GemmBf16Call*, int, int);

struct Choice {
  KernelFn fn;
  ManyFn many;
  const char* name;
};

const Choice kTable[] = {{gemm_bf16_amx, gemm_bf16_amx_many, "amx"},
                         {gemm_bf16_avx512, gemm_bf16_avx512_many, "avx512bf16"},
                         {gemm_bf16_generic, gemm_bf16_generic_many, "generic"}};

bool cpuid_bit(unsigned leaf, unsigned subleaf, int reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (!__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1u;
}
constexpr int kEax = 0, kEdx = 3;

// vdpbf16ps and the AVX-512 subsets the packing uses.
bool has_avx512bf16() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && cpuid_bit(7, 1, kEax, 5);
}

// AMX-TILE and AMX-BF16 in the CPU, the tile state enabled by the operating system (XCR0 bits
// 17 and 18), and this process's permission to use the tile data, which Linux grants on
// request (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; the permission covers every
// thread of the process). Asked once.
bool amx_usable() {
  static const bool usable = [] {
    if (!has_avx512bf16() || !cpuid_bit(7, 0, kEdx, 24) || !cpuid_bit(7, 0, kEdx, 22))
      return false;
    if (!cpuid_bit(1, 0, 2, 27)) return false;  // OSXSAVE: xgetbv is allowed
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (((lo >> 17) & 3u) != 3u) return false;
#ifdef SYS_arch_prctl
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return usable;
}

bool supported(const char* name) {
  if (std::strcmp(name, "amx") == 0) return amx_usable();
  if (std::strcmp(name, "avx512bf16") == 0) return has_avx512bf16();
  return std::strcmp(name, "generic") == 0;
}

const Choice* find(const char* name) {
  for (const Choice& c : kTable)
    if (std::strcmp(name, c.name) == 0) return &c;
  return nullptr;
}

const Choice* choose() {
  static const char* const names[] = {"amx", "avx512bf16", "generic"};
  if (const char* forced = gemm_impl::forced_kernel(names, 3)) {
    CLUSTR_CHECK(supported(forced), "gemm_bf16: CLUSTR_GEMM_KERNEL asks for ", forced,
                 " but this CPU", std::strcmp(forced, "amx") == 0 ? " (or operating system)" : "",
                 " does not support it");
    return find(forced);
  }
  for (const Choice& c : kTable)
    if (supported(c.name)) return &c;
  return &kTable[2];
}

const Choice* g_override = nullptr;  // set_gemm_bf16_kernel

const Choice& kernel() {
  if (g_override) return *g_override;
  static const Choice* const chosen = choose();
  return *chosen;
}

// Below this many flops a parallel region costs more than it saves (AMX makes small products
// cheaper still than the float32 kernel: a 64^3 product is about 0.3 us of tile work).
constexpr double kParallelFlops = 2.0 * 128 * 128 * 128;

double flops_of(const GemmBf16Call& g) {
  return 2.0 * static_cast<double>(g.M) * static_cast<double>(g.N) * static_cast<double>(g.K);
}

int64_t a_index(const GemmBf16Call& g, int64_t i, int64_t p) {
  return g.trans_a ? p * g.lda + i : i * g.lda + p;
}
int64_t b_index(const GemmBf16Call& g, int64_t p, int64_t j) {
  return g.trans_b ? j * g.ldb + p : p * g.ldb + j;
}

// Stored elements as double, for the row sums and the reference.
double stored(const void* base, Operand type, int64_t idx) {
  if (type == Operand::f32) return static_cast<const float*>(base)[idx];
  return bf16_to_float(static_cast<const uint16_t*>(base)[idx]);
}

// A subnormal (or zero) as the signed zero that the bf16 instructions read it as.
float flush_subnormal(float f) { return std::fpclassify(f) == FP_SUBNORMAL ? f * 0.0f : f; }

// The value the GEMM multiplies: an f32 operand rounded to bf16 as the packing does
// (vcvtne2ps2bf16 reads subnormals as zero), any bf16 subnormal read as zero.
double multiplied(const void* base, Operand type, int64_t idx) {
  if (type == Operand::f32)
    return bf16_to_float(float_to_bf16_ftz(static_cast<const float*>(base)[idx]));
  return flush_subnormal(bf16_to_float(static_cast<const uint16_t*>(base)[idx]));
}

// The epilogue of C's element (i, j) given v = alpha op(A) op(B) + beta C.
template <typename T>
T epilogue_value(const GemmBf16Call& g, int64_t i, int64_t j, T v) {
  const GemmEpilogue& e = g.epilogue;
  if (e.bias) v += e.bias[j];
  if (e.relu) v = v < T(0) ? T(0) : v;
  if (e.mask && !(e.mask[i * e.ldm + j] > 0.0f)) v = T(0);
  if (g.mask_bf16 && !(bf16_to_float(g.mask_bf16[i * e.ldm + j]) > 0.0f)) v = T(0);
  return v;
}

// Stores C's element (i, j): as it is, or rounded to a bf16 C as vcvtneps2bf16 rounds
// (subnormals to zero), which is how the kernels store it.
void store_c(const GemmBf16Call& g, int64_t i, int64_t j, float v) {
  if (g.C_bf16)
    g.C_bf16[i * g.ldc + j] = float_to_bf16_ftz(v);
  else
    g.C[i * g.ldc + j] = v;
}

// The epilogue's row sums of op(A): its stored values summed in double, in the order of k.
void row_sums(const GemmBf16Call& g) {
  for (int64_t i = 0; i < g.M; ++i) {
    double sum = 0.0;
    for (int64_t p = 0; p < g.K; ++p) sum += stored(g.A, g.a_type, a_index(g, i, p));
    g.epilogue.a_row_sums[i] = static_cast<float>(sum);
  }
}

// C = beta * C (+ the epilogue) and the row sums of op(A), when K == 0 or alpha == 0.
void scale_c(const GemmBf16Call& g) {
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.N; ++j)
      store_c(g, i, j,
              epilogue_value(g, i, j, g.beta == 0.0f ? 0.0f : g.beta * g.C[i * g.ldc + j]));
  if (g.epilogue.a_row_sums) row_sums(g);
}

void check_call(const GemmBf16Call& g) {
  check_gemm_args("gemm_bf16", g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, g.ldc);
  CLUSTR_CHECK(!(g.epilogue.mask || g.mask_bf16) || g.epilogue.ldm >= g.N,
               "gemm_bf16: the epilogue's mask row stride ldm=", g.epilogue.ldm,
               " is smaller than a row of C (", g.N, " elements)");
  CLUSTR_CHECK(!(g.epilogue.mask && g.mask_bf16),
               "gemm_bf16: give the epilogue's mask in float32 or in bf16, not both");
  CLUSTR_CHECK(!(g.C && g.C_bf16), "gemm_bf16: give C in float32 or in bf16 (C_bf16), not both");
  CLUSTR_CHECK(!g.C_bf16 || g.beta == 0.0f, "gemm_bf16: a bf16 C is written, never read: beta ",
               "must be 0, got ", g.beta);
  const bool product = g.M > 0 && g.N > 0 && g.K > 0;
  CLUSTR_CHECK(!product || (g.A && g.B), "gemm_bf16: null A or B for a ", g.M, " x ", g.N, " x ",
               g.K, " product");
  CLUSTR_CHECK(g.M == 0 || g.N == 0 || g.C || g.C_bf16, "gemm_bf16: null C for a ", g.M, " x ",
               g.N, " result");
}

// A bf16 C deeper than one depth block of the kernels, which would have to add the blocks'
// sums into a rounded C: run_deep computes it in float32 and rounds it once at the end.
bool deep_bf16(const GemmBf16Call& g) {
  return g.C_bf16 &&
         g.K > (g.trans_a ? gemm_impl::kBf16KcMaxTrans : gemm_impl::kBf16KcMaxRows);
}

void run(const GemmBf16Call& g, int threads);

void run_deep(const GemmBf16Call& g, int threads) {
  std::vector<float> c(static_cast<size_t>(g.M * g.N));
  GemmBf16Call f = g;
  f.C = c.data();
  f.ldc = g.N;
  f.C_bf16 = nullptr;
  run(f, threads);
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.N; ++j) store_c(g, i, j, c[static_cast<size_t>(i * g.N + j)]);
}

// Runs g (already checked) on `threads` threads.
void run(const GemmBf16Call& g, int threads) {
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0 || g.alpha == 0.0f) return scale_c(g);
  if (deep_bf16(g)) return run_deep(g, threads);
  kernel().fn(g, threads);
}

}  // namespace

const char* gemm_bf16_kernel_name() { return kernel().name; }

std::vector<const char*> gemm_bf16_kernels() {
  std::vector<const char*> names;
  for (const Choice& c : kTable)
    if (supported(c.name)) names.push_back(c.name);
  return names;
}

void set_gemm_bf16_kernel(const char* name) {
  if (!name || !*name) {
    g_override = nullptr;
    return;
  }
  const Choice* c = find(name);
  CLUSTR_CHECK(c, "set_gemm_bf16_kernel: unknown kernel '", name,
               "' (known: amx, avx512bf16, generic)");
  CLUSTR_CHECK(supported(c->name), "set_gemm_bf16_kernel: this CPU",
               std::strcmp(name, "amx") == 0 ? " (or operating system)" : "",
               " does not support the ", name, " kernel");
  g_override = c;
}

void gemm_bf16_call(const GemmBf16Call& g) {
  check_call(g);
  run(g, flops_of(g) < kParallelFlops ? 1 : num_threads());
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
               float* C, int64_t ldc) {
  gemm_bf16_call({trans_a, trans_b, M, N, K, alpha, A, Operand::bf16, lda, B, Operand::bf16, ldb,
                  beta, C, ldc, GemmEpilogue{}, nullptr, nullptr});
}

void gemm_bf16_many(const GemmBf16Call* calls, int count) {
  double flops = 0;
  bool all_products = true;
  for (int c = 0; c < count; ++c) {
    check_call(calls[c]);
    flops += flops_of(calls[c]);
    all_products = all_products && calls[c].M > 0 && calls[c].N > 0 && calls[c].K > 0 &&
                   calls[c].alpha != 0.0f && !deep_bf16(calls[c]);
  }
  const int threads = flops < kParallelFlops ? 1 : num_threads();
  if (!all_products) {  // the degenerate and deep bf16 ones on their own
    for (int c = 0; c < count; ++c) run(calls[c], threads);
    return;
  }
  kernel().many(calls, count, threads);
}

void gemm_bf16_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                               float alpha, const void* A, Operand a_type, int64_t lda,
                               int64_t stride_a, const void* B, Operand b_type, int64_t ldb,
                               int64_t stride_b, float beta, float* C, int64_t ldc,
                               int64_t stride_c, int64_t batch) {
  CLUSTR_CHECK(batch >= 0, "gemm_bf16_strided_batched: batch must be non-negative, got ", batch);
  const size_t a_size = a_type == Operand::f32 ? 4 : 2, b_size = b_type == Operand::f32 ? 4 : 2;
  auto call = [&](int64_t b) {
    return GemmBf16Call{trans_a, trans_b, M, N, K, alpha,
                        static_cast<const char*>(A) + b * stride_a * static_cast<int64_t>(a_size),
                        a_type, lda,
                        static_cast<const char*>(B) + b * stride_b * static_cast<int64_t>(b_size),
                        b_type, ldb, beta, C + b * stride_c, ldc, GemmEpilogue{}, nullptr, nullptr};
  };
  if (batch == 0) {
    check_gemm_args("gemm_bf16_strided_batched", trans_a, trans_b, M, N, K, lda, ldb, ldc);
    return;
  }
  check_call(call(0));
  kernel();  // chosen (or refused) here, not inside the parallel region
  const double flops = flops_of(call(0));
  const int threads = num_threads();
  // Many small products (attention heads): one product per thread. Few large ones: each
  // product uses every thread. Either way each element is computed the same way.
  if (batch >= threads && flops < 64 * kParallelFlops) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < batch; ++b) run(call(b), 1);
    return;
  }
  for (int64_t b = 0; b < batch; ++b) run(call(b), flops < kParallelFlops ? 1 : threads);
}

void gemm_bf16_reference(const GemmBf16Call& g) {
  check_call(g);
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.N; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < g.K; ++p)
        acc += multiplied(g.A, g.a_type, a_index(g, i, p)) *
               multiplied(g.B, g.b_type, b_index(g, p, j));
      double v = static_cast<double>(g.alpha) * acc;
      if (g.beta != 0.0f) v += static_cast<double>(g.beta) * g.C[i * g.ldc + j];
      store_c(g, i, j, static_cast<float>(epilogue_value(g, i, j, v)));
    }
  if (g.epilogue.a_row_sums) row_sums(g);
}

}  // namespace clustr::cpu
