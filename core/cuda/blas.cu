// Row-major GEMM on the GPU through cuBLAS: the CUDA twin of cpu::gemm and
// cpu::gemm_strided_batched (core/cpu/gemm.h), with the same arguments and meaning:
//   C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C        (C is overwritten when beta == 0)
// A is stored M x K (K x M with trans_a) with row stride lda; B is stored K x N (N x K with
// trans_b) with row stride ldb; C is stored M x N with row stride ldc. Two kinds of operands:
// float32 (gemm, gemm_strided_batched: cublasSgemm, cublasSgemmStridedBatched) and bf16
// (gemm_bf16, gemm_bf16_strided_batched: cublasGemmEx, cublasGemmStridedBatchedEx with
// CUDA_R_16BF A and B); C is float32 in both.
//
// Row-major vs cuBLAS's column-major: the bytes of a row-major r x c matrix X with row stride ld
// are exactly the column-major c x r matrix X^T with leading dimension ld. So the row-major
// product C = op(A) op(B) is, read column-major, C^T = op(B)^T op(A)^T: cuBLAS is asked for the
// N x M column-major product with the operands swapped and the transpose flags kept as they are,
//   cublasSgemm(handle, opB, opA, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc),
//   opX = trans_x ? CUBLAS_OP_T : CUBLAS_OP_N,
// and the same for cublasGemmEx. No data is copied or transposed. The leading-dimension rules
// cuBLAS applies to the swapped call (ldb >= max(1, rows of its first operand), ...) are exactly
// the row-major rules of check_gemm_args (ld >= max(1, row length of the stored matrix)).
//
// Sizes: the classic int API is used (available in every toolkit), so M, N, K, the leading
// dimensions and the batch count must each fit in int; larger values are rejected with a clear
// error rather than truncated. Batch strides are 64-bit in that API already (in elements, for
// bf16 as for float32).
//
// In device emulation the cuBLAS calls below go to a host GEMM with cuBLAS's column-major
// contract and the GPU's arithmetic (core/cuda/emulation.h), so this mapping is tested on
// machines without a GPU.
//
// Streams: every call runs on the calling host thread's current stream (cuda.h). The one cuBLAS
// handle is bound to that stream (cublasSetStream) right before each call, under a lock, so
// that host threads with different current streams do not move each other's calls.
//
// Precision. float32 GEMMs: by default the handle uses CUBLAS_DEFAULT_MATH, i.e. full FP32
// arithmetic with no TF32 tensor cores and no BF16x9 emulation, so results agree with the CPU to
// FP32 rounding. set_tf32(true) switches the handle to CUBLAS_TF32_TENSOR_OP_MATH: cuBLAS may
// then read each float32 operand with TF32's 10-bit mantissa (relative error up to 2^-11
// rounded, 2^-10 truncated) and multiply on tensor cores, accumulating in FP32; results then
// differ from the CPU's by about 1e-3 relative. The mode is changed under the lock that every
// call holds from binding the stream until it is queued, so a call runs entirely in one mode.
// bf16 GEMMs: cublasGemmEx with CUBLAS_COMPUTE_32F and CUBLAS_GEMM_DEFAULT, on tensor cores
// (sm_80 and later): a product of two bf16 values (8-bit significands) is exact in float32 and
// the sum is accumulated in FP32, so the result differs from the exact sum of the bf16 products
// by FP32 accumulation error only. The TF32 setting does not change them (a bf16 value is
// exact in TF32).
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/gemm_args.h"

#if !defined(CLUSTR_CUDA_EMULATION)
#include <type_traits>

#include "core/cuda/toolkit_library.h"
#endif

namespace clustr::cuda {

namespace {

// The cuBLAS entry points this file calls, in one table. On a GPU build the table is filled from
// libcublas opened with dlopen at the first product on the device, not linked: cuBLAS and
// cuBLASLt map more than 400 MB of address space when loaded, which a process that never uses
// the GPU (a CPU run under a memory limit, say) must not pay. In device emulation the table
// points at the emulated functions. (cublas_v2.h spells some names as macros, cublasSgemm for
// cublasSgemm_v2; decltype and the symbol names below go through the same macros.)
// (cublasGemmEx and cublasGemmStridedBatchedEx also have C++ overloads taking the compute
// type as a cudaDataType: these are the C functions.)
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                    int, int, const void*, const void*, cudaDataType, int,
                                    const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
using GemmStridedBatchedExFn = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
    const void*, cudaDataType, int, long long, const void*, cudaDataType, int, long long,
    const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t,
    cublasGemmAlgo_t);
struct CublasApi {
  decltype(&cublasCreate) create;
  decltype(&cublasDestroy) destroy;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm) sgemm;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
  GemmExFn gemm_ex;
  GemmStridedBatchedExFn gemm_strided_batched_ex;
  const char* (*status_string)(cublasStatus_t);
};

std::atomic<const CublasApi*> loaded_api{nullptr};

#if defined(CLUSTR_CUDA_EMULATION)
const char* emulated_status_string(cublasStatus_t) { return "emulated cuBLAS"; }

const CublasApi& cublas() {
  static const CublasApi api{&cublasCreate,     &cublasDestroy,
                             &cublasSetStream,  &cublasSetMathMode,
                             &cublasSgemm,      &cublasSgemmStridedBatched,
                             static_cast<GemmExFn>(&cublasGemmEx),
                             static_cast<GemmStridedBatchedExFn>(&cublasGemmStridedBatchedEx),
                             &emulated_status_string};
  loaded_api.store(&api);
  return api;
}
#else
#define CLUSTR_SYMBOL_NAME_(x) #x
#define CLUSTR_SYMBOL_NAME(x) CLUSTR_SYMBOL_NAME_(x)

// Opens libcublas (the toolkit's file that CMake found, then its soname on the loader's path)
// and resolves every entry point; throws naming what failed. Called once, under a static's
// initialisation (a failure leaves it to be tried again).
CublasApi load_cublas() {
  void* lib = open_toolkit_library({CLUSTR_CUBLAS_LIBRARY, CLUSTR_CUBLAS_SONAME},
                                   "cuBLAS (loaded for the first product on the GPU)");
  CublasApi api{};
  auto resolve = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    CLUSTR_CHECK(fn, "cuBLAS: the library has no ", symbol, " (a toolkit older than this build's?)");
  };
  resolve(api.create, CLUSTR_SYMBOL_NAME(cublasCreate));
  resolve(api.destroy, CLUSTR_SYMBOL_NAME(cublasDestroy));
  resolve(api.set_stream, CLUSTR_SYMBOL_NAME(cublasSetStream));
  resolve(api.set_math_mode, CLUSTR_SYMBOL_NAME(cublasSetMathMode));
  resolve(api.sgemm, CLUSTR_SYMBOL_NAME(cublasSgemm));
  resolve(api.sgemm_strided_batched, CLUSTR_SYMBOL_NAME(cublasSgemmStridedBatched));
  resolve(api.gemm_ex, CLUSTR_SYMBOL_NAME(cublasGemmEx));
  resolve(api.gemm_strided_batched_ex, CLUSTR_SYMBOL_NAME(cublasGemmStridedBatchedEx));
  resolve(api.status_string, "cublasGetStatusString");
  return api;
}

const CublasApi& cublas() {
  static const CublasApi api = load_cublas();
  loaded_api.store(&api);
  return api;
}
#endif

// Guards the handle's stream and math mode: held by every call from cublasSetStream until the
// call is queued (Bound), and by set_tf32 while it changes the math mode and the flag below.
std::mutex& blas_mutex() {
  static std::mutex m;
  return m;
}

// The TF32 setting (set_tf32), guarded by blas_mutex(). The handle is made with it.
bool tf32_on = false;

cublasMath_t math_mode(bool tf32) {
  return tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
}

// One handle for the process, made on first use (its creation is slow and allocates device
// memory), with blas_mutex() held. It is never destroyed: cublasDestroy during static
// destruction can run after the CUDA runtime has shut down. It is bound to the current device
// (device 0); its stream is set per call (Bound below), its math mode by set_tf32.
cublasHandle_t handle_locked() {
  static cublasHandle_t h = nullptr;
  if (h == nullptr) {
    cublasHandle_t made = nullptr;
    CLUSTR_CUBLAS_CHECK(cublas().create(&made));
    const cublasStatus_t s = cublas().set_math_mode(made, math_mode(tf32_on));
    if (s != CUBLAS_STATUS_SUCCESS) {
      cublas().destroy(made);
      checks::throw_cublas_error(s, "cublasSetMathMode(handle, mode)", __FILE__, __LINE__);
    }
    h = made;
  }
  return h;
}

// The handle, bound to the current stream, for one call. cublasSetStream is cuBLAS's documented
// way to move a handle between streams from one call to the next; it changes the handle for
// every host thread that shares it, so the lock is held from it until the call has been queued
// (cuBLAS calls return once their kernels are queued, so it is held briefly). The same lock
// keeps set_tf32 from changing the math mode in between.
class Bound {
 public:
  Bound() : lock_(blas_mutex()), h_(handle_locked()) {
    CLUSTR_CUBLAS_CHECK(cublas().set_stream(h_, current_stream()));
  }
  cublasHandle_t get() const { return h_; }

 private:
  std::lock_guard<std::mutex> lock_;
  cublasHandle_t h_;
};

cublasOperation_t op_of(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

void check_fits_int(const char* op, const char* name, int64_t v) {
  CLUSTR_CHECK(v <= INT_MAX, op, ": ", name, " = ", v, " exceeds cuBLAS's 32-bit limit (",
               INT_MAX, "); split the product into smaller ones");
}

// C = beta * C for `batch` M x N matrices (row stride ldc, stride_c apart), overwriting with
// zeros when beta == 0 so that NaN or garbage in C is not propagated (the BLAS rule). Used when
// K == 0 or alpha == 0, where BLAS reads neither A nor B: cuBLAS would too, but doing it here
// keeps that rule independent of cuBLAS's handling of degenerate sizes and of null A or B.
struct ScaleKernel {
  static constexpr bool kUsesBarrier = false;
  float* C;
  int64_t M, N, ldc, stride_c, batch;
  float beta;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t per = M * N, total = per * batch;
    for (int64_t i = global_x(t); i < total; i += grid_stride_x(t)) {
      const int64_t b = i / per, r = (i - b * per) / N, c = i - b * per - r * N;
      float* p = C + b * stride_c + r * ldc + c;
      *p = beta == 0.0f ? 0.0f : beta * *p;
    }
  }
};

void scale(float* C, int64_t M, int64_t N, int64_t ldc, int64_t stride_c, int64_t batch,
           float beta) {
  if (beta == 1.0f || M == 0 || N == 0 || batch == 0) return;
  launch("cuda::gemm (C = beta * C)", {elementwise_blocks(M * N * batch)}, {kElementwiseThreads},
         0, ScaleKernel{C, M, N, ldc, stride_c, batch, beta});
}

// What every GEMM here does before cuBLAS, whatever the operands' type; a single product is a
// batch of one with zero strides. The checks: the CPU GEMM's (core/gemm_args.h: sizes, and each
// leading dimension against the row length of its stored matrix, in the same words), then what
// only the GPU needs: pointers that will be touched, cuBLAS's int range, and for batches the
// count and strides. Then the cases cuBLAS is not asked to do: an empty C (nothing to do) and
// K == 0 or alpha == 0 (C = beta * C, A and B not read). Returns true when cuBLAS must run the
// product.
bool prepare(const char* op, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
             float alpha, const void* A, int64_t lda, int64_t stride_a, const void* B,
             int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
             int64_t batch) {
  ::clustr::check_gemm_args(op, trans_a, trans_b, M, N, K, lda, ldb, ldc);
  CLUSTR_CHECK(batch >= 0, op, ": negative batch count ", batch);
  const bool product = M > 0 && N > 0 && K > 0 && batch > 0;
  CLUSTR_CHECK(!product || (A != nullptr && B != nullptr), op, ": null A or B for a ", M, " x ",
               N, " x ", K, " product");
  CLUSTR_CHECK(M == 0 || N == 0 || batch == 0 || C != nullptr, op, ": null C for a ", M, " x ",
               N, " result");
  check_fits_int(op, "M", M);
  check_fits_int(op, "N", N);
  check_fits_int(op, "K", K);
  check_fits_int(op, "lda", lda);
  check_fits_int(op, "ldb", ldb);
  check_fits_int(op, "ldc", ldc);
  check_fits_int(op, "batch", batch);
  // Stride 0 for A or B is allowed (one matrix used by every product). Overlapping C matrices
  // would be written by several products at once, a race on the GPU, so they are refused.
  CLUSTR_CHECK(stride_a >= 0 && stride_b >= 0 && stride_c >= 0, op, ": negative stride (a ",
               stride_a, ", b ", stride_b, ", c ", stride_c, ")");
  CLUSTR_CHECK(batch <= 1 || M == 0 || N == 0 || stride_c >= (M - 1) * ldc + N, op,
               ": stride_c = ", stride_c, " makes the ", M, " x ", N, " C matrices (ldc ", ldc,
               ") of consecutive batch entries overlap; it must be at least ",
               (M - 1) * ldc + N);
  if (M == 0 || N == 0 || batch == 0) return false;  // an empty C: nothing to compute or scale
  require(op);
  if (K == 0 || alpha == 0.0f) {
    scale(C, M, N, ldc, stride_c, batch, beta);
    return false;
  }
  return true;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  if (!prepare("cuda::gemm", trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C,
               ldc, 0, 1))
    return;
  // Swapped operands: see the comment at the top of the file.
  const Bound h;
  counting::blas_call();
  CLUSTR_CUBLAS_CHECK(cublas().sgemm(h.get(), op_of(trans_b), op_of(trans_a), static_cast<int>(N),
                                  static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                  static_cast<int>(ldb), A, static_cast<int>(lda), &beta, C,
                                  static_cast<int>(ldc)));
}

void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                          float alpha, const float* A, int64_t lda, int64_t stride_a,
                          const float* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                          int64_t ldc, int64_t stride_c, int64_t batch) {
  if (!prepare("cuda::gemm_strided_batched", trans_a, trans_b, M, N, K, alpha, A, lda, stride_a,
               B, ldb, stride_b, beta, C, ldc, stride_c, batch))
    return;
  const Bound h;
  counting::blas_call();
  CLUSTR_CUBLAS_CHECK(cublas().sgemm_strided_batched(
      h.get(), op_of(trans_b), op_of(trans_a), static_cast<int>(N), static_cast<int>(M),
      static_cast<int>(K), &alpha, B, static_cast<int>(ldb), static_cast<long long>(stride_b), A,
      static_cast<int>(lda), static_cast<long long>(stride_a), &beta, C, static_cast<int>(ldc),
      static_cast<long long>(stride_c), static_cast<int>(batch)));
}

// bf16 A and B, float32 C, alpha and beta; CUBLAS_COMPUTE_32F: float32 products and
// accumulation (see Precision at the top of the file).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
               float* C, int64_t ldc) {
  if (!prepare("cuda::gemm_bf16", trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta,
               C, ldc, 0, 1))
    return;
  const Bound h;
  counting::blas_call();
  CLUSTR_CUBLAS_CHECK(cublas().gemm_ex(h.get(), op_of(trans_b), op_of(trans_a), static_cast<int>(N),
                                   static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                   CUDA_R_16BF, static_cast<int>(ldb), A, CUDA_R_16BF,
                                   static_cast<int>(lda), &beta, C, CUDA_R_32F,
                                   static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
}

void gemm_bf16_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                               float alpha, const uint16_t* A, int64_t lda, int64_t stride_a,
                               const uint16_t* B, int64_t ldb, int64_t stride_b, float beta,
                               float* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (!prepare("cuda::gemm_bf16_strided_batched", trans_a, trans_b, M, N, K, alpha, A, lda,
               stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch))
    return;
  const Bound h;
  counting::blas_call();
  CLUSTR_CUBLAS_CHECK(cublas().gemm_strided_batched_ex(
      h.get(), op_of(trans_b), op_of(trans_a), static_cast<int>(N), static_cast<int>(M),
      static_cast<int>(K), &alpha, B, CUDA_R_16BF, static_cast<int>(ldb),
      static_cast<long long>(stride_b), A, CUDA_R_16BF, static_cast<int>(lda),
      static_cast<long long>(stride_a), &beta, C, CUDA_R_32F, static_cast<int>(ldc),
      static_cast<long long>(stride_c), static_cast<int>(batch), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

// The math mode is changed on the shared handle under the lock every call holds while it binds
// the handle and queues its work, so each call sees one mode or the other, never a switch in
// between. Calls already queued keep the kernels they were given.
void set_tf32(bool on) {
  require("cuda::set_tf32");
  std::lock_guard<std::mutex> lock(blas_mutex());
  const cublasHandle_t h = handle_locked();  // made with the current setting
  CLUSTR_CUBLAS_CHECK(cublas().set_math_mode(h, math_mode(on)));
  tf32_on = on;
}

bool tf32() {
  std::lock_guard<std::mutex> lock(blas_mutex());
  return tf32_on;
}

namespace checks {
const char* cublas_status_string(cublasStatus_t s) {
  const CublasApi* api = loaded_api.load();
  return api ? api->status_string(s) : "cuBLAS not loaded";
}
}  // namespace checks

}  // namespace clustr::cuda
