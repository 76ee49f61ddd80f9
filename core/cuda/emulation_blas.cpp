// Device emulation's cuBLAS subset (see core/cuda/emulation.h): handles with a math mode and a
// stream, and the GEMMs clustr calls (cublasSgemm, cublasSgemmStridedBatched, cublasGemmEx,
// cublasGemmStridedBatchedEx) as the reference column-major BLAS loop on the host, with the
// argument rules cuBLAS applies, every matrix checked to lie inside one device allocation, and
// every element a product reads checked to have been written.
// Compiled only with -DCLUSTR_CUDA=EMULATE.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "core/bf16.h"
#include "core/cuda/emulation.h"
#include "core/cuda/emulation_state.h"

using namespace clustr::cuda::emulation;

struct cublasContext {
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (state::no_devices()) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

bool valid_op(cublasOperation_t op) {
  return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

// The argument rules of cublasSgemm: sizes >= 0 and each leading dimension at least the number
// of rows of the stored (column-major) matrix: A is m x k (k x m when transposed), B k x n (n x k),
// C m x n.
cublasStatus_t check_gemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                          int m, int n, int k, const void* alpha, int lda, int ldb,
                          const void* beta, int ldc) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!valid_op(ta) || !valid_op(tb) || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// The device memory a column-major rows x cols matrix of `elem`-byte elements with leading
// dimension ld spans must be inside one allocation; a GPU would fault (or silently read a
// neighbour) otherwise.
bool matrix_in_device(const char* call, const char* name, const void* p, size_t elem,
                      int64_t rows, int64_t cols, int64_t ld) {
  if (rows == 0 || cols == 0) return true;
  const size_t bytes = static_cast<size_t>((cols - 1) * ld + rows) * elem;
  if (p != nullptr && state::in_one_allocation(p, bytes)) return true;
  std::fprintf(stderr,
               "clustr device emulation: %s: matrix %s (%lld x %lld column-major, ld %lld, %zu "
               "bytes at %p) is not inside one device allocation\n",
               call, name, static_cast<long long>(rows), static_cast<long long>(cols),
               static_cast<long long>(ld), bytes, p);
  return false;
}

// Every element a product reads must have been written: device memory never written holds the
// emulator's poison (all bits set: 0xffffffff as a float, 0xffff as a bf16; emulation.h), a bit
// pattern no arithmetic produces (a NaN that arithmetic makes has a zero payload), though it
// survives being copied or carried through as a NaN operand. A GPU's cuBLAS reads whatever
// happens to be there (compute-sanitizer's initcheck reports it); the emulator names the
// matrix and the element instead.
bool matrix_written(const char* call, const char* name, int batch, const void* p, size_t elem,
                    int64_t rows, int64_t cols, int64_t ld) {
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) {
      const unsigned char* e = bytes + static_cast<size_t>(i + j * ld) * elem;
      if (!std::all_of(e, e + elem, [](unsigned char b) { return b == 0xff; })) continue;
      std::fprintf(stderr,
                   "clustr device emulation: %s: matrix %s of batch entry %d reads element (%lld, "
                   "%lld) (column-major, ld %lld), which nothing wrote (it holds the poison of "
                   "fresh or freed device memory)\n",
                   call, name, batch, static_cast<long long>(i), static_cast<long long>(j),
                   static_cast<long long>(ld));
      return false;
    }
  return true;
}

// x rounded to TF32 as cvt.rna.tf32.f32 does: 10 explicit mantissa bits (the low 13 of 23 are
// cleared), to nearest with ties away from zero. Adding half of the dropped part to the bits
// rounds the magnitude half up, since the bit pattern of a float's magnitude is monotonic in
// it; a carry into the exponent is the correct result, and past the largest float it gives
// infinity. NaN and infinities are kept as they are.
float round_to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u = (u + 0x1000u) & ~0x1fffu;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

// How an operand's elements reach the multiplier: a float as it is, a float rounded to TF32
// (the math mode CUBLAS_TF32_TENSOR_OP_MATH), or a bf16 widened to float (exact).
enum class Operand { f32, tf32, bf16 };

template <Operand kind>
struct Load {
  const void* base;
  float operator()(int64_t i) const {
    if constexpr (kind == Operand::bf16)
      return clustr::bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    else if constexpr (kind == Operand::tf32)
      return round_to_tf32(static_cast<const float*>(base)[i]);
    else
      return static_cast<const float*>(base)[i];
  }
};

// One column-major product, the reference BLAS loop: C = alpha op(A) op(B) + beta C, C not read
// when beta == 0, A and B not read when alpha == 0 or k == 0. Each product is formed in float
// and the products are added in float in order of l: exact products for bf16 and TF32 operands
// (at most 11-bit significands), as a GPU's tensor cores form them, and float32 accumulation.
template <Operand kind>
void gemm_one(bool ta, bool tb, int m, int n, int k, float alpha, const void* A, int lda,
              const void* B, int ldb, float beta, float* C, int ldc) {
  const Load<kind> a_at{A}, b_at{B};
  const bool product = k > 0 && alpha != 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
#if defined(CLUSTR_EMULATION_GPU_NUMERICS)
      // GPU-like numerics: fused multiply-adds into four partial sums (l mod 4), added
      // pairwise at the end, as a GPU's kernels split the sum their own way.
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (product)
        for (int64_t l = 0; l < k; ++l) {
          const float a = ta ? a_at(l + i * lda) : a_at(i + l * lda);
          const float b = tb ? b_at(j + l * ldb) : b_at(l + j * ldb);
          part[l & 3] = std::fma(a, b, part[l & 3]);
        }
      acc = (part[0] + part[1]) + (part[2] + part[3]);
      float& c = C[i + j * ldc];
      const float ab = product ? alpha * acc : 0.0f;
      c = beta == 0.0f ? ab : std::fma(beta, c, ab);
#else
      if (product)
        for (int64_t l = 0; l < k; ++l) {
          const float a = ta ? a_at(l + i * lda) : a_at(i + l * lda);
          const float b = tb ? b_at(j + l * ldb) : b_at(l + j * ldb);
          acc += a * b;
        }
      float& c = C[i + j * ldc];
      const float ab = product ? alpha * acc : 0.0f;
      c = beta == 0.0f ? ab : ab + beta * c;
#endif
    }
  }
}

cublasStatus_t run_batched(const char* call, Operand kind, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, float alpha,
                           const void* A, int lda, long long stride_a, const void* B, int ldb,
                           long long stride_b, float beta, float* C, int ldc, long long stride_c,
                           int batch);

// Strided batches of column-major products. A and B hold elements of `kind` (float32 for tf32
// too), C floats; strides are in elements. The arguments have been checked except the stream,
// the batch count and where the matrices lie. On a capturing stream the call is recorded, and
// where its matrices lie is checked when it runs.
cublasStatus_t gemm_batched(const char* call, cublasHandle_t handle, Operand kind,
                            cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, float alpha, const void* A, int lda, long long stride_a,
                            const void* B, int ldb, long long stride_b, float beta, float* C,
                            int ldc, long long stride_c, int batch) {
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (!state::live_stream(handle->stream)) {  // its kernels could not be launched
    std::fprintf(stderr, "clustr device emulation: %s on stream %p, which was destroyed or "
                 "never created\n", call, static_cast<const void*>(handle->stream));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  if (state::capturing(handle->stream)) {  // recorded (its arguments as they are now), run later
    state::record(handle->stream, [=] {
      return run_batched(call, kind, transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb,
                         stride_b, beta, C, ldc, stride_c, batch) == CUBLAS_STATUS_SUCCESS;
    });
    return CUBLAS_STATUS_SUCCESS;
  }
  return run_batched(call, kind, transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb,
                     stride_b, beta, C, ldc, stride_c, batch);
}

// The products of a checked gemm_batched call, now.
cublasStatus_t run_batched(const char* call, Operand kind, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, float alpha,
                           const void* A, int lda, long long stride_a, const void* B, int ldb,
                           long long stride_b, float beta, float* C, int ldc, long long stride_c,
                           int batch) {
  const size_t elem = kind == Operand::bf16 ? sizeof(uint16_t) : sizeof(float);
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const bool reads_ab = k > 0 && alpha != 0.0f;
  auto* const one = kind == Operand::bf16   ? &gemm_one<Operand::bf16>
                    : kind == Operand::tf32 ? &gemm_one<Operand::tf32>
                                            : &gemm_one<Operand::f32>;
  for (int b = 0; b < batch; ++b) {
    const void* Ab = static_cast<const char*>(A) + b * stride_a * static_cast<long long>(elem);
    const void* Bb = static_cast<const char*>(B) + b * stride_b * static_cast<long long>(elem);
    float* Cb = C + b * stride_c;
    if (reads_ab && (!matrix_in_device(call, "A", Ab, elem, ta ? k : m, ta ? m : k, lda) ||
                     !matrix_in_device(call, "B", Bb, elem, tb ? n : k, tb ? k : n, ldb)))
      return CUBLAS_STATUS_EXECUTION_FAILED;
    if (!matrix_in_device(call, "C", Cb, sizeof(float), m, n, ldc))
      return CUBLAS_STATUS_EXECUTION_FAILED;
    state::DeviceAccess open;
    if (reads_ab && (!matrix_written(call, "A", b, Ab, elem, ta ? k : m, ta ? m : k, lda) ||
                     !matrix_written(call, "B", b, Bb, elem, tb ? n : k, tb ? k : n, ldb)))
      return CUBLAS_STATUS_EXECUTION_FAILED;
    if (beta != 0.0f && !matrix_written(call, "C", b, Cb, sizeof(float), m, n, ldc))
      return CUBLAS_STATUS_EXECUTION_FAILED;
    one(ta, tb, m, n, k, alpha, Ab, lda, Bb, ldb, beta, Cb, ldc);
  }
  return CUBLAS_STATUS_SUCCESS;
}

// Float32 operands are read as TF32 when the handle's math mode allows TF32 tensor cores (the
// low 4 bits are the mode; the higher ones are flags, as the toolkit's headers test them).
Operand f32_operand(cublasHandle_t handle) {
  return (static_cast<int>(handle->math) & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH ? Operand::tf32
                                                                               : Operand::f32;
}

cublasStatus_t sgemm_batched(const char* call, cublasHandle_t handle, cublasOperation_t transa,
                             cublasOperation_t transb, int m, int n, int k, const float* alpha,
                             const float* A, int lda, long long stride_a, const float* B,
                             int ldb, long long stride_b, const float* beta, float* C, int ldc,
                             long long stride_c, int batch) {
  const cublasStatus_t s = check_gemm(handle, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return gemm_batched(call, handle, f32_operand(handle), transa, transb, m, n, k, *alpha, A, lda,
                      stride_a, B, ldb, stride_b, *beta, C, ldc, stride_c, batch);
}

// cublasGemmEx for the combinations clustr uses (emulation.h): bf16 x bf16 -> float and
// float x float -> float, computed in float (CUBLAS_COMPUTE_32F, so alpha and beta are floats).
cublasStatus_t gemm_ex_batched(const char* call, cublasHandle_t handle, cublasOperation_t transa,
                               cublasOperation_t transb, int m, int n, int k, const void* alpha,
                               const void* A, cudaDataType a_type, int lda, long long stride_a,
                               const void* B, cudaDataType b_type, int ldb, long long stride_b,
                               const void* beta, void* C, cudaDataType c_type, int ldc,
                               long long stride_c, int batch, cublasComputeType_t compute,
                               cublasGemmAlgo_t algo) {
  const cublasStatus_t s = check_gemm(handle, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool bf16 = a_type == CUDA_R_16BF && b_type == CUDA_R_16BF;
  const bool f32 = a_type == CUDA_R_32F && b_type == CUDA_R_32F;
  if (!(bf16 || f32) || c_type != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F) {
    std::fprintf(stderr,
                 "clustr device emulation: %s: types A %d, B %d, C %d with compute type %d are "
                 "not emulated (only 16BF or 32F inputs, 32F output, CUBLAS_COMPUTE_32F)\n",
                 call, static_cast<int>(a_type), static_cast<int>(b_type),
                 static_cast<int>(c_type), static_cast<int>(compute));
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // A bf16 value is exact in TF32: the math mode changes nothing for bf16 operands.
  const Operand kind = bf16 ? Operand::bf16 : f32_operand(handle);
  return gemm_batched(call, handle, kind, transa, transb, m, n, k,
                      *static_cast<const float*>(alpha), A, lda, stride_a, B, ldb, stride_b,
                      *static_cast<const float*>(beta), static_cast<float*>(C), ldc, stride_c,
                      batch);
}

}  // namespace

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  return sgemm_batched("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb,
                       0, beta, C, ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long stride_a, const float* B, int ldb,
                                         long long stride_b, const float* beta, float* C,
                                         int ldc, long long stride_c, int batch_count) {
  return sgemm_batched("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A,
                       lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch_count);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo) {
  return gemm_ex_batched("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0,
                         B, Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, compute_type, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long stride_a, const void* B,
                                          cudaDataType Btype, int ldb, long long stride_b,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long stride_c, int batch_count,
                                          cublasComputeType_t compute_type,
                                          cublasGemmAlgo_t algo) {
  return gemm_ex_batched("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A,
                         Atype, lda, stride_a, B, Btype, ldb, stride_b, beta, C, Ctype, ldc,
                         stride_c, batch_count, compute_type, algo);
}


// ---- cuBLASLt ------------------------------------------------------------------------------------
// The subset of emulation.h: descriptors that hold the attributes clustr sets, a heuristic that
// offers one algorithm for what the subset runs, and cublasLtMatmul as the reference loop above
// plus the epilogue.

struct cublasLtContext {};

struct cublasLtMatmulDescEmulated {
  cublasComputeType_t compute;
  cudaDataType scale_type;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
};

struct cublasLtMatrixLayoutEmulated {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};

struct cublasLtMatmulPreferenceEmulated {
  uint64_t max_workspace = 0;
  uint32_t reduction_mask = 0x7;
};

namespace {

std::atomic<bool> lt_algorithms{true};
std::atomic<uint64_t> lt_generation_count{0};

template <typename T>
cublasStatus_t set_attribute(T& field, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t attribute_not_emulated(const char* call, int attr) {
  std::fprintf(stderr, "clustr device emulation: %s: attribute %d is not emulated\n", call, attr);
  return CUBLAS_STATUS_INVALID_VALUE;
}

bool lt_epilogue_known(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_RELU ||
         e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
         e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}

// The sizes of one product, read off its descriptors, or a message on stderr saying what the
// subset does not run (and false).
struct LtShape {
  int m, n, k;
  Operand kind;
};

bool lt_shape(const char* call, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
              cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
              LtShape* out) {
  auto refuse = [&](const char* why) {
    std::fprintf(stderr, "clustr device emulation: %s: %s\n", call, why);
    return false;
  };
  if (!d || !A || !B || !C || !D) return refuse("a null descriptor");
  if (!valid_op(d->transa) || !valid_op(d->transb)) return refuse("an unknown transpose");
  if (!lt_epilogue_known(d->epilogue)) return refuse("an epilogue the emulation lacks");
  const bool bf16 = A->type == CUDA_R_16BF && B->type == CUDA_R_16BF;
  const bool f32 = A->type == CUDA_R_32F && B->type == CUDA_R_32F;
  if (!(bf16 || f32) || C->type != CUDA_R_32F || D->type != CUDA_R_32F ||
      d->scale_type != CUDA_R_32F ||
      !(d->compute == CUBLAS_COMPUTE_32F || (f32 && d->compute == CUBLAS_COMPUTE_32F_FAST_TF32)))
    return refuse("types not emulated (16BF or 32F inputs, 32F output, 32F compute and scale)");
  const bool ta = d->transa != CUBLAS_OP_N, tb = d->transb != CUBLAS_OP_N;
  const uint64_t m = D->rows, n = D->cols, k = ta ? A->rows : A->cols;
  if ((ta ? A->cols : A->rows) != m || (tb ? B->rows : B->cols) != n ||
      (tb ? B->cols : B->rows) != k || C->rows != m || C->cols != n)
    return refuse("the layouts' sizes do not chain (op(A) m x k, op(B) k x n, C and D m x n)");
  for (const cublasLtMatrixLayoutEmulated* l : {A, B, C, D})
    if (l->ld < static_cast<int64_t>(std::max<uint64_t>(1, l->rows)) || l->rows > INT32_MAX ||
        l->cols > INT32_MAX)
      return refuse("a leading dimension below the rows, or a size past 32 bits");
  if (C->ld != D->ld) return refuse("C and D with different layouts (the subset runs D = C)");
  *out = {static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
          bf16                                          ? Operand::bf16
          : d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? Operand::tf32
                                                        : Operand::f32};
  return true;
}

// The epilogue of one product, after the product (D, column-major m x n, leading dimension ldd).
void lt_epilogue(uint32_t e, const LtShape& s, bool ta, bool tb, const void* A, int lda,
                 const void* B, int ldb, float* D, int ldd, float* vec) {
  const bool bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS;
  const bool relu = e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS;
  if (bias || relu)
    for (int64_t j = 0; j < s.n; ++j)
      for (int64_t i = 0; i < s.m; ++i) {
        float& v = D[i + j * ldd];
        if (bias) v += vec[i];
        if (relu) v = v < 0.0f ? 0.0f : v;
      }
  // Element (r, c) of op(X) (column-major, leading dimension ld), as stored (not TF32-rounded).
  auto op_at = [&](const void* X, bool trans, int ld, int64_t r, int64_t c) {
    const int64_t at = trans ? c + r * ld : r + c * ld;
    return s.kind == Operand::bf16 ? Load<Operand::bf16>{X}(at) : Load<Operand::f32>{X}(at);
  };
  if (e == CUBLASLT_EPILOGUE_BGRADA)  // the rows of op(A), m x k
    for (int64_t i = 0; i < s.m; ++i) {
      float acc = 0.0f;
      for (int64_t l = 0; l < s.k; ++l) acc += op_at(A, ta, lda, i, l);
      vec[i] = acc;
    }
  if (e == CUBLASLT_EPILOGUE_BGRADB)  // the columns of op(B), k x n
    for (int64_t j = 0; j < s.n; ++j) {
      float acc = 0.0f;
      for (int64_t l = 0; l < s.k; ++l) acc += op_at(B, tb, ldb, l, j);
      vec[j] = acc;
    }
}

// One checked product and its epilogue, now.
bool run_lt(const char* call, cublasLtMatmulDescEmulated d, LtShape s, float alpha,
            const void* A, int lda, const void* B, int ldb, float beta, float* D, int ldd) {
  const size_t elem = s.kind == Operand::bf16 ? sizeof(uint16_t) : sizeof(float);
  const bool ta = d.transa != CUBLAS_OP_N, tb = d.transb != CUBLAS_OP_N;
  const bool reads_ab = s.k > 0 && alpha != 0.0f;
  const uint32_t e = d.epilogue;
  const bool bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS;
  const bool grad = e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
  const int vec_len = e == CUBLASLT_EPILOGUE_BGRADB ? s.n : s.m;
  if (reads_ab && (!matrix_in_device(call, "A", A, elem, ta ? s.k : s.m, ta ? s.m : s.k, lda) ||
                   !matrix_in_device(call, "B", B, elem, tb ? s.n : s.k, tb ? s.k : s.n, ldb)))
    return false;
  if (!matrix_in_device(call, "D", D, sizeof(float), s.m, s.n, ldd)) return false;
  if ((bias || grad) && !matrix_in_device(call, "bias", d.bias, sizeof(float), vec_len, 1, vec_len))
    return false;
  if (grad && !reads_ab) {
    std::fprintf(stderr, "clustr device emulation: %s: a bias gradient of a product with k = 0 "
                 "or alpha = 0 is not emulated\n", call);
    return false;
  }
  state::DeviceAccess open;
  if (reads_ab && (!matrix_written(call, "A", 0, A, elem, ta ? s.k : s.m, ta ? s.m : s.k, lda) ||
                   !matrix_written(call, "B", 0, B, elem, tb ? s.n : s.k, tb ? s.k : s.n, ldb)))
    return false;
  if (beta != 0.0f && !matrix_written(call, "C", 0, D, sizeof(float), s.m, s.n, ldd)) return false;
  if (bias && !matrix_written(call, "bias", 0, d.bias, sizeof(float), s.m, 1, s.m)) return false;
  auto* const one = s.kind == Operand::bf16   ? &gemm_one<Operand::bf16>
                    : s.kind == Operand::tf32 ? &gemm_one<Operand::tf32>
                                              : &gemm_one<Operand::f32>;
  one(ta, tb, s.m, s.n, s.k, alpha, A, lda, B, ldb, beta, D, ldd);
  lt_epilogue(e, s, ta, tb, A, lda, B, ldb, D, ldd, static_cast<float*>(d.bias));
  return true;
}

}  // namespace

namespace clustr::cuda::emulation {
void set_lt_algorithms(bool available) {
  lt_algorithms.store(available);
  lt_generation_count.fetch_add(1);
}
uint64_t lt_generation() { return lt_generation_count.load(); }
}  // namespace clustr::cuda::emulation

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (state::no_devices()) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new cublasLtMatmulDescEmulated{compute, scale_type};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_attribute(desc->transa, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_attribute(desc->transb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attribute(desc->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attribute(desc->bias, buf, size);
  }
  return attribute_not_emulated("cublasLtMatmulDescSetAttribute", static_cast<int>(attr));
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutEmulated{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceEmulated;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set_attribute(pref->max_workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return set_attribute(pref->reduction_mask, buf, size);
  }
  return attribute_not_emulated("cublasLtMatmulPreferenceSetAttribute", static_cast<int>(attr));
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (pref == nullptr || requested < 1 || results == nullptr || returned == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  LtShape s;
  if (!lt_algorithms.load() ||
      !lt_shape("cublasLtMatmulAlgoGetHeuristic", desc, Adesc, Bdesc, Cdesc, Ddesc, &s))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = {};
  results[0].algo.data[0] = 1;  // the one emulated algorithm
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* call = "cublasLtMatmul";
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (alpha == nullptr || beta == nullptr || algo == nullptr || algo->data[0] != 1 ||
      (workspace_bytes > 0 && workspace == nullptr))
    return CUBLAS_STATUS_INVALID_VALUE;
  LtShape s;
  if (!lt_shape(call, desc, Adesc, Bdesc, Cdesc, Ddesc, &s))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (C != D) {
    std::fprintf(stderr, "clustr device emulation: %s: C and D are different matrices (the "
                 "subset runs D = C)\n", call);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!state::live_stream(stream)) {
    std::fprintf(stderr, "clustr device emulation: %s on stream %p, which was destroyed or "
                 "never created\n", call, static_cast<const void*>(stream));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (s.m == 0 || s.n == 0) return CUBLAS_STATUS_SUCCESS;
  const cublasLtMatmulDescEmulated d = *desc;  // as it is now: the caller may change it after
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const int lda = static_cast<int>(Adesc->ld), ldb = static_cast<int>(Bdesc->ld),
            ldd = static_cast<int>(Ddesc->ld);
  float* const out = static_cast<float*>(D);
  if (state::capturing(stream)) {
    state::record(stream, [=] { return run_lt(call, d, s, a, A, lda, B, ldb, b, out, ldd); });
    return CUBLAS_STATUS_SUCCESS;
  }
  return run_lt(call, d, s, a, A, lda, B, ldb, b, out, ldd) ? CUBLAS_STATUS_SUCCESS
                                                            : CUBLAS_STATUS_EXECUTION_FAILED;
}
