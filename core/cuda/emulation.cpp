// Device emulation (see core/cuda/emulation.h): the CUDA runtime and cuBLAS subset on the host,
// and the kernel launcher. Compiled only with -DCLUSTR_CUDA=EMULATE.
#include "core/cuda/emulation.h"

#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#include "core/bf16.h"
#include "core/error.h"

// ---- device memory -------------------------------------------------------------------------------

namespace {

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

struct DeviceMemory {
  std::mutex mu;
  std::map<uintptr_t, size_t> blocks;  // base address -> bytes, every live cudaMalloc block
  size_t in_use = 0;
  size_t capacity = 0;

  DeviceMemory() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    capacity = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page)
                                     : (size_t(16) << 30);
  }

  // True when [p, p + bytes) lies inside one live block (bytes == 0: p inside or at its end).
  bool contains_locked(const void* p, size_t bytes) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return false;
    --it;
    return a >= it->first && a - it->first <= it->second && bytes <= it->second - (a - it->first);
  }
  bool contains(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    return contains_locked(p, bytes);
  }
  // True when any byte of [p, p + bytes) is device memory.
  bool touches(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks.upper_bound(a + bytes - 1);
    if (it == blocks.begin()) return false;
    --it;
    return it->first + it->second > a;
  }
};

// Never destroyed: tensors freed during static destruction still find it.
DeviceMemory& device_memory() {
  static DeviceMemory* m = new DeviceMemory;
  return *m;
}

bool no_devices() {
  const char* v = std::getenv("CLUSTR_CUDA_EMULATION_DEVICES");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

// Streams and events are numbered handles, never dereferenced and never reused (see
// emulation.h). They share one numbering, so an event passed as a stream is refused too.
struct Handles {
  std::mutex mu;
  std::set<uintptr_t> streams, events;  // the live ones
  uintptr_t next = 0x1000;              // clear of the toolkit's special stream values (1, 2)

  uintptr_t add(std::set<uintptr_t>& to) {
    std::lock_guard<std::mutex> lock(mu);
    const uintptr_t id = next;
    next += 0x10;
    to.insert(id);
    return id;
  }
  bool remove(std::set<uintptr_t>& from, uintptr_t id) {
    std::lock_guard<std::mutex> lock(mu);
    return from.erase(id) == 1;
  }
  bool has(const std::set<uintptr_t>& in, uintptr_t id) {
    std::lock_guard<std::mutex> lock(mu);
    return in.count(id) == 1;
  }
};

// Never destroyed, like the device memory: a Stream held in a static object is destroyed
// during static destruction.
Handles& handles() {
  static Handles* h = new Handles;
  return *h;
}

uintptr_t id_of(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }

// The null stream is the legacy default stream, always there.
bool live_stream(cudaStream_t s) {
  return s == nullptr || handles().has(handles().streams, id_of(s));
}
bool live_event(cudaEvent_t e) { return e != nullptr && handles().has(handles().events, id_of(e)); }

}  // namespace

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (device emulation)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = no_devices() ? 0 : 1;
  return *count == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (no_devices()) return fail(cudaErrorNoDevice);
  if (bytes == 0) return cudaSuccess;
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  if (bytes > m.capacity - m.in_use) return fail(cudaErrorMemoryAllocation);
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  m.blocks[reinterpret_cast<uintptr_t>(p)] = bytes;
  m.in_use += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return no_devices() ? fail(cudaErrorNoDevice) : cudaSuccess;
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.blocks.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.blocks.end()) return fail(cudaErrorInvalidValue);
  m.in_use -= it->second;
  m.blocks.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!live_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  DeviceMemory& m = device_memory();
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_ok = dst_device ? m.contains(dst, bytes) : !m.touches(dst, bytes);
  const bool src_ok = src_device ? m.contains(src, bytes) : !m.touches(src, bytes);
  if (!dst_ok || !src_ok) {
    std::fprintf(stderr,
                 "clustr device emulation: cudaMemcpyAsync of %zu bytes (kind %d): the %s "
                 "pointer %p is not %s memory\n",
                 bytes, static_cast<int>(kind), dst_ok ? "source" : "destination",
                 dst_ok ? src : static_cast<const void*>(dst),
                 (dst_ok ? src_device : dst_device) ? "device" : "host");
    return fail(cudaErrorInvalidValue);
  }
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return fail(cudaErrorInvalidValue);
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  *total_bytes = m.capacity;
  *free_bytes = m.capacity - m.in_use;
  return cudaSuccess;
}

// Every emulated launch and copy completes before it returns: nothing is ever pending.
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

// ---- streams and events ------------------------------------------------------------------------
// Work has finished when its call returns, so only the handles need checking.

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0)
    return fail(cudaErrorInvalidValue);
  if (no_devices()) return fail(cudaErrorNoDevice);
  Handles& h = handles();
  *stream = reinterpret_cast<cudaStream_t>(h.add(h.streams));
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Handles& h = handles();
  if (stream == nullptr || !h.remove(h.streams, id_of(stream)))
    return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return live_stream(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  if (flags != 0) return fail(cudaErrorInvalidValue);  // cudaEventWaitDefault is all we know
  if (!live_stream(stream) || !live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  // The toolkit's flags: blocking sync 0x1, disable timing 0x2, interprocess 0x4.
  if (event == nullptr || (flags & ~0x7u) != 0) return fail(cudaErrorInvalidValue);
  if (no_devices()) return fail(cudaErrorNoDevice);
  Handles& h = handles();
  *event = reinterpret_cast<cudaEvent_t>(h.add(h.events));
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Handles& h = handles();
  if (event == nullptr || !h.remove(h.events, id_of(event)))
    return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!live_event(event) || !live_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  return live_event(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return live_event(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

// ---- cuBLAS ----------------------------------------------------------------------------------------

struct cublasContext {
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (no_devices()) return CUBLAS_STATUS_NOT_INITIALIZED;
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
  if (p != nullptr && device_memory().contains(p, bytes)) return true;
  std::fprintf(stderr,
               "clustr device emulation: %s: matrix %s (%lld x %lld column-major, ld %lld, %zu "
               "bytes at %p) is not inside one device allocation\n",
               call, name, static_cast<long long>(rows), static_cast<long long>(cols),
               static_cast<long long>(ld), bytes, p);
  return false;
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
      if (product)
        for (int64_t l = 0; l < k; ++l) {
          const float a = ta ? a_at(l + i * lda) : a_at(i + l * lda);
          const float b = tb ? b_at(j + l * ldb) : b_at(l + j * ldb);
          acc += a * b;
        }
      float& c = C[i + j * ldc];
      const float ab = product ? alpha * acc : 0.0f;
      c = beta == 0.0f ? ab : ab + beta * c;
    }
  }
}

// Strided batches of column-major products. A and B hold elements of `kind` (float32 for tf32
// too), C floats; strides are in elements. The arguments have been checked except the stream,
// the batch count and where the matrices lie.
cublasStatus_t gemm_batched(const char* call, cublasHandle_t handle, Operand kind,
                            cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, float alpha, const void* A, int lda, long long stride_a,
                            const void* B, int ldb, long long stride_b, float beta, float* C,
                            int ldc, long long stride_c, int batch) {
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (!live_stream(handle->stream)) {  // its kernels could not be launched
    std::fprintf(stderr, "clustr device emulation: %s on stream %p, which was destroyed or "
                 "never created\n", call, static_cast<const void*>(handle->stream));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
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

// ---- the launcher ----------------------------------------------------------------------------------

namespace clustr::cuda::emulation {

void sync_without_barrier(const char* kernel) {
  throw Error(detail::cat("kernel '", kernel, "' called t.sync() but declares kUsesBarrier = "
                          "false; set it to true (the emulator then runs the block's threads "
                          "concurrently)"));
}

float atomic_add_f32(float* p, float v) {
  float expected;
  __atomic_load(p, &expected, __ATOMIC_RELAXED);
  float desired;
  do {
    desired = expected + v;
  } while (!__atomic_compare_exchange(p, &expected, &desired, false, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED));
  return expected;
}

size_t device_bytes_in_use() {
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  return m.in_use;
}

namespace {

constexpr size_t kMaxSharedBytes = 48 * 1024;  // without the opt-in attribute, on every GPU

bool valid_config(const Launch& l) {
  const uint64_t threads = uint64_t(l.block[0]) * l.block[1] * l.block[2];
  return l.block[0] <= 1024 && l.block[1] <= 1024 && l.block[2] <= 64 && threads <= 1024 &&
         l.grid[0] <= 0x7fffffffu && l.grid[1] <= 65535 && l.grid[2] <= 65535 &&
         l.shared_bytes <= kMaxSharedBytes;
}

// Block number b (x fastest) as (x, y, z).
void block_coords(const Launch& l, uint64_t b, unsigned out[3]) {
  out[0] = static_cast<unsigned>(b % l.grid[0]);
  out[1] = static_cast<unsigned>(b / l.grid[0] % l.grid[1]);
  out[2] = static_cast<unsigned>(b / (uint64_t(l.grid[0]) * l.grid[1]));
}

ThreadState base_state(const Launch& l, unsigned char* shared, Fibers* fibers) {
  ThreadState s{};
  for (int d = 0; d < 3; ++d) {
    s.block_dim[d] = l.block[d];
    s.grid_dim[d] = l.grid[d];
  }
  s.shared = shared;
  s.fibers = fibers;
  s.kernel_name = l.name;
  return s;
}

// Fresh shared memory holds garbage on a GPU; here it holds NaN bytes, so that a kernel reading
// shared memory it never wrote computes NaN rather than a plausible 0.
std::vector<unsigned char> poisoned_shared(size_t bytes) {
  return std::vector<unsigned char>(bytes, 0xff);
}

// No barrier: each block's threads run one after another; blocks in parallel when OpenMP is on.
void run_sequential(const Launch& l, uint64_t blocks) {
  std::exception_ptr error;
  std::mutex error_mu;
#pragma omp parallel for schedule(dynamic, 1) if (blocks > 1)
  for (uint64_t b = 0; b < blocks; ++b) {
    try {
      std::vector<unsigned char> shared = poisoned_shared(l.shared_bytes);
      ThreadState s = base_state(l, shared.data(), nullptr);
      block_coords(l, b, s.block);
      for (unsigned z = 0; z < l.block[2]; ++z)
        for (unsigned y = 0; y < l.block[1]; ++y)
          for (unsigned x = 0; x < l.block[0]; ++x) {
            s.thread[0] = x;
            s.thread[1] = y;
            s.thread[2] = z;
            l.run(l.kernel, s);
          }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// ---- barrier mode: the threads of a block as fibers ----
//
// A Fibers object belongs to one host thread and runs blocks one at a time. Each CUDA thread of
// the block is a fiber (ucontext) with its own stack; run_block() resumes the fibers in thread
// order, each running until its next t.sync() or its end, and repeats these rounds: after a
// round every fiber is either waiting at a barrier (then all are resumed) or finished (the block
// is done); a mix of the two is a divergent barrier.

#if defined(__SANITIZE_ADDRESS__)
#define CLUSTR_ASAN_FIBERS 1
#endif

#if defined(CLUSTR_ASAN_FIBERS)
constexpr size_t kFiberStack = 256 * 1024;  // AddressSanitizer's redzones need more room
#else
constexpr size_t kFiberStack = 64 * 1024;
#endif

// Fiber stacks, kept per host thread for the next launch (allocating them is most of the cost
// of a short launch). malloc'ed and never touched beyond what a kernel uses, so the untouched
// pages of a stack cost no memory.
std::vector<std::unique_ptr<char[]>>& stack_cache() {
  thread_local std::vector<std::unique_ptr<char[]>> cache;
  return cache;
}

}  // namespace

class Fibers {
 public:
  Fibers(const Launch& l, unsigned n) : l_(l), fibers_(n), shared_(l.shared_bytes) {
    auto& cache = stack_cache();
    while (cache.size() < n) cache.emplace_back(new char[kFiberStack]);
    for (unsigned id = 0; id < n; ++id) {
      Fiber& f = fibers_[id];
      f.stack = cache[id].get();
      f.s = base_state(l, shared_.data(), this);
      f.s.thread[0] = id % l.block[0];
      f.s.thread[1] = id / l.block[0] % l.block[1];
      f.s.thread[2] = id / (l.block[0] * l.block[1]);
    }
  }

  // Runs block number b to its end; throws clustr::Error on a divergent barrier.
  void run_block(uint64_t b) {
    std::fill(shared_.begin(), shared_.end(), static_cast<unsigned char>(0xff));
    for (Fiber& f : fibers_) {
      block_coords(l_, b, f.s.block);
      f.state = kRunning;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack;
      f.ctx.uc_stack.ss_size = kFiberStack;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, &Fibers::entry, 0);
    }
    for (;;) {
      unsigned waiting = 0, done = 0;
      for (unsigned i = 0; i < fibers_.size(); ++i) {
        switch_to(i);
        if (fibers_[i].state == kFailed) std::rethrow_exception(error_);
        (fibers_[i].state == kWaiting ? waiting : done) += 1;
      }
      if (done == fibers_.size()) return;
      if (waiting != fibers_.size()) {
        unsigned c[3];
        block_coords(l_, b, c);
        throw Error(detail::cat("kernel '", l_.name, "': in block (", c[0], ", ", c[1], ", ",
                                c[2], ") some threads wait at t.sync() while others have "
                                "returned; every thread of a block must reach each barrier"));
      }
    }
  }

  // t.sync() of the running fiber: back to the scheduler until every fiber has arrived.
  void sync() {
    Fiber& f = fibers_[current_];
    f.state = kWaiting;
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_start_switch_fiber(&f.fake_stack, sched_bottom_, sched_size_);
#endif
    swapcontext(&f.ctx, &sched_);
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_finish_switch_fiber(f.fake_stack, &sched_bottom_, &sched_size_);
#endif
  }

 private:
  enum State { kRunning, kWaiting, kDone, kFailed };
  struct Fiber {
    ucontext_t ctx;
    char* stack = nullptr;
    State state = kRunning;
    ThreadState s;
    void* fake_stack = nullptr;
  };

  // The scheduler resumes fiber i and returns when it waits at a barrier or has finished.
  void switch_to(unsigned i) {
    current_ = i;
    fibers_[i].state = kRunning;
    entering() = this;
#if defined(CLUSTR_ASAN_FIBERS)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, fibers_[i].stack, kFiberStack);
#endif
    swapcontext(&sched_, &fibers_[i].ctx);
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  }

  // makecontext passes only int arguments: a fiber finds its Fibers through this.
  static Fibers*& entering() {
    thread_local Fibers* f = nullptr;
    return f;
  }

  static void entry() {
    Fibers* self = entering();
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_finish_switch_fiber(nullptr, &self->sched_bottom_, &self->sched_size_);
#endif
    Fiber& f = self->fibers_[self->current_];
    try {
      self->l_.run(self->l_.kernel, f.s);
      f.state = kDone;
    } catch (...) {
      if (!self->error_) self->error_ = std::current_exception();
      f.state = kFailed;
    }
#if defined(CLUSTR_ASAN_FIBERS)
    __sanitizer_start_switch_fiber(nullptr, self->sched_bottom_, self->sched_size_);
#endif
    setcontext(&self->sched_);  // a finished fiber is never resumed
  }

  const Launch& l_;
  std::vector<Fiber> fibers_;
  std::vector<unsigned char> shared_;
  ucontext_t sched_;
  unsigned current_ = 0;
  std::exception_ptr error_;
  const void* sched_bottom_ = nullptr;
  size_t sched_size_ = 0;
};

void block_sync(Fibers* block) { block->sync(); }

namespace {

void run_fibers(const Launch& l, uint64_t blocks) {
  const unsigned n = l.block[0] * l.block[1] * l.block[2];
  std::exception_ptr error;
  std::mutex error_mu;
  std::atomic<bool> failed{false};
  auto record = [&] {
    std::lock_guard<std::mutex> lock(error_mu);
    if (!error) error = std::current_exception();
    failed = true;
  };
#pragma omp parallel if (blocks > 1)
  {
    try {
      Fibers team(l, n);
#pragma omp for schedule(dynamic, 1)
      for (uint64_t b = 0; b < blocks; ++b) {
        try {
          if (!failed) team.run_block(b);  // after a failure the remaining blocks are skipped
        } catch (...) {
          record();
        }
      }
    } catch (...) {  // out of memory for the stacks
      record();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

void launch(const Launch& l) {
  for (int d = 0; d < 3; ++d)
    if (l.grid[d] == 0 || l.block[d] == 0) return;
  if (!valid_config(l)) {
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  if (!live_stream(l.stream)) {
    last_error = cudaErrorInvalidResourceHandle;
    return;
  }
  const uint64_t blocks = uint64_t(l.grid[0]) * l.grid[1] * l.grid[2];
  if (l.uses_barrier)
    run_fibers(l, blocks);
  else
    run_sequential(l, blocks);
}

}  // namespace clustr::cuda::emulation
