// bf16 GEMM on row-major matrices with float32 accumulation, BLAS-style, the mixed-precision
// twin of cpu::gemm (core/cpu/gemm.h), with the same arguments and meaning:
//   C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C        (C float32)
// Each operand is either bf16 (core/bf16.h) or float32 that the GEMM rounds to bf16 (nearest
// even) as it reads it: the precision policy's products (core/precision.h) pass their float32
// activations and weights as they are and never store a bf16 copy. Products of two bf16 values
// are exact in float32 and are summed in float32. As in the AMX and AVX512-BF16 instructions,
// bf16 subnormals count as zero (they are below 1.2e-38). beta == 0 overwrites C without
// reading it. The epilogue (GemmEpilogue) works as in gemm_fused; its row sums of op(A) add
// up the operand's stored values (an f32 operand's unrounded ones), in double.
// C may instead be stored in bf16 (GemmBf16Call::C_bf16, beta 0): each element is the float32
// result, epilogue included, rounded to nearest even as vcvtneps2bf16 does (subnormals to
// zero), so a tensor that only later products read costs half the bytes to write and to read.
// The epilogue's mask may be bf16 too (mask_bf16), read exactly.
//
// Kernels, chosen at run time from what the CPU supports (gemm_bf16_kernel_name()):
//   amx         AMX tiles (_tile_dpbf16ps, 16 x 16 float32 results per instruction), where the
//               CPU and the operating system allow them (Linux: arch_prctl permission for the
//               tile data, requested once per process)
//   avx512bf16  AVX-512 with vdpbf16ps (Intel from Cooper Lake, AMD Zen 4)
//   generic     portable C++
// All three read the same packed operands (docs/ARCHITECTURE.md, "The bf16 GEMM") and differ
// only in the order of their float32 additions. The result does not depend on the number of
// threads. The environment variable CLUSTR_GEMM_KERNEL (see gemm_kernel_name) forces one:
// "amx" or "avx512bf16" for this GEMM, "generic" for both GEMMs; a comma separates names,
// e.g. CLUSTR_GEMM_KERNEL=avx2,avx512bf16.
#pragma once

#include <cstdint>
#include <vector>

#include "core/cpu/gemm.h"

namespace clustr::cpu {

// What an operand's elements are. A plain enum and plain structs with no member functions, for
// the same reason as GemmEpilogue (the kernel files are compiled for wider instruction sets).
enum class Operand : uint8_t { bf16, f32 };

// The arguments of one bf16 product (for gemm_bf16_call and gemm_bf16_many). A and B point to
// uint16_t bf16 elements or float elements, as a_type and b_type say. The last two members are
// the bf16 forms of C and of the epilogue's mask, used instead of C and epilogue.mask (which
// are then null); an initializer that stops after the epilogue leaves them null.
struct GemmBf16Call {
  bool trans_a, trans_b;
  int64_t M, N, K;
  float alpha;
  const void* A;
  Operand a_type;
  int64_t lda;
  const void* B;
  Operand b_type;
  int64_t ldb;
  float beta;
  float* C;
  int64_t ldc;
  GemmEpilogue epilogue;
  uint16_t* C_bf16;             // C (M, N) in bf16, row stride ldc, or null; needs beta == 0
  const uint16_t* mask_bf16;    // the epilogue's mask in bf16 (row stride epilogue.ldm), or null
};

// bf16 operands.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
               float* C, int64_t ldc);
// Any operand types, with the epilogue.
void gemm_bf16_call(const GemmBf16Call& call);
// Independent products in one parallel region, as gemm_many.
void gemm_bf16_many(const GemmBf16Call* calls, int count);
// batch independent products; matrix b of each operand starts stride_x elements after b - 1.
void gemm_bf16_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                               float alpha, const void* A, Operand a_type, int64_t lda,
                               int64_t stride_a, const void* B, Operand b_type, int64_t ldb,
                               int64_t stride_b, float beta, float* C, int64_t ldc,
                               int64_t stride_c, int64_t batch);

// The test oracle, never used for speed: each operand element rounded to bf16 as the GEMM reads
// it (subnormals counting as zero), products and sums in double.
void gemm_bf16_reference(const GemmBf16Call& call);

// The kernel in use: "amx", "avx512bf16" or "generic".
const char* gemm_bf16_kernel_name();
// The kernels this CPU (and operating system) can run, best first.
std::vector<const char*> gemm_bf16_kernels();
// Makes every later bf16 GEMM of the process use `name` (one of gemm_bf16_kernels(); anything
// else throws), or, with null or "", the automatic choice again: for tests and benchmarks that
// compare the kernels in one run. Not thread-safe against GEMMs running at the same time.
void set_gemm_bf16_kernel(const char* name);

}  // namespace clustr::cpu
