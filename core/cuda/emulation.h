// Device emulation: the CUDA backend built with the host compiler (configure with
// -DCLUSTR_CUDA=EMULATE), so that every kernel runs, and is tested, on a machine without a GPU.
// Included only through core/cuda/check.h, in place of the toolkit's headers, by core/cuda/*
// sources compiled with CLUSTR_CUDA_EMULATION. How it works (the device-memory arena that
// faults on host access, checked stream and event handles, the cuBLAS subset and its numerics,
// fibers for barriers and warp shuffles, schedules, ThreadSanitizer): docs/ARCHITECTURE.md,
// "Device emulation".
//
// Two parts:
// 1. The subset of the CUDA runtime and cuBLAS APIs that core/cuda/ calls, with the same names,
//    signatures and error codes, so that runtime.cu and blas.cu compile unchanged
//    (emulation.cpp, emulation_blas.cpp). CLUSTR_CUDA_EMULATION_DEVICES=0 in the environment
//    makes cudaGetDeviceCount report no device, to test the "no GPU" paths.
// 2. The launcher behind launch() of core/cuda/kernel.h (emulation_launch.cpp), ordered by
//    CLUSTR_EMULATION_SCHEDULE (forward, reverse, random:SEED) or set_schedule below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

// ---- the CUDA runtime subset ---------------------------------------------------------------------
// Values as in the toolkit's driver_types.h, so that messages read the same.
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
};
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);  // 0
// The attributes clustr asks for (values as in driver_types.h), with an H100's answers.
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();  // returns and clears this host thread's last error

// Streams and events: opaque handles, as in the toolkit (a null stream is the legacy default
// stream). The flag values are the toolkit's.
struct CUstream_st;
struct CUevent_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
constexpr unsigned cudaStreamNonBlocking = 0x01;
constexpr unsigned cudaEventDisableTiming = 0x02;
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
// Pinned (page-locked) host memory, each block its own pages. A copy from it to the device runs
// at once here, as every emulated copy does, but on a GPU it runs when its stream reaches it,
// after the call has returned: so until the host has waited for it (cudaEventSynchronize or a
// true cudaEventQuery of an event recorded after it on its stream, cudaStreamSynchronize of
// its stream, cudaDeviceSynchronize) the block is read-only, and a host write to it stops the
// process with a message naming the address and the missing wait. cudaFreeHost waits, as the
// toolkit's does.
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);

// Stream capture and graphs (emulation_graph.cpp). Work queued on a capturing stream is recorded
// instead of run: kernel launches (a copy of the kernel's arguments), cuBLAS products and copies
// between device buffers; cudaGraphLaunch runs the record in order. What a GPU refuses during
// capture fails here too and invalidates the capture (cudaErrorStreamCaptureUnsupported): a copy
// to or from host memory, synchronizing the stream or the device, events on the stream; the
// legacy default stream cannot capture. A message on stderr says which call it was.
struct CUgraph_st;
struct CUgraphExec_st;
typedef CUgraph_st* cudaGraph_t;
typedef CUgraphExec_st* cudaGraphExec_t;
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

// ---- the cuBLAS subset ---------------------------------------------------------------------------
// Values as in the toolkit's cublas_api.h.
struct cublasContext;
typedef cublasContext* cublasHandle_t;
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
// The element types of cublasGemmEx's matrices (the toolkit's library_types.h; typedef'd to
// cudaDataType there too). The emulation multiplies only 16BF and 32F (see above).
enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
};
typedef cudaDataType_t cudaDataType;
enum cublasComputeType_t {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 };
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
// Any stream value is accepted, as by cuBLAS; a GEMM on a stream that is not live fails.
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
// Column-major C(m, n) = alpha * op(A)(m, k) op(B)(k, n) + beta * C, as cuBLAS. An element of A
// or B (or of C with beta != 0) that holds the poison of fresh or freed memory fails
// the call with CUBLAS_STATUS_EXECUTION_FAILED and a message naming it: a GPU would compute with
// whatever was there.
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long stride_a, const float* B, int ldb,
                                         long long stride_b, const float* beta, float* C,
                                         int ldc, long long stride_c, int batch_count);
// Typed GEMM: A, B and C of the given element types, alpha and beta of the compute type's
// scalar type (float for CUBLAS_COMPUTE_32F). Column-major, as cublasSgemm.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long stride_a, const void* B,
                                          cudaDataType Btype, int ldb, long long stride_b,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long stride_c, int batch_count,
                                          cublasComputeType_t compute_type,
                                          cublasGemmAlgo_t algo);

// ---- the cuBLASLt subset -------------------------------------------------------------------------
// Values as in the toolkit's cublasLt.h. One column-major product per cublasLtMatmul (no
// batches), D = alpha op(A) op(B) + beta C with D the same matrix as C, A and B both float or
// both bf16, C float, with one of the epilogues below; descriptors carry only the attributes
// clustr sets (another attribute is CUBLAS_STATUS_INVALID_VALUE, with a message).
struct cublasLtContext;
typedef cublasLtContext* cublasLtHandle_t;
struct cublasLtMatmulDescEmulated;
typedef cublasLtMatmulDescEmulated* cublasLtMatmulDesc_t;
struct cublasLtMatrixLayoutEmulated;
typedef cublasLtMatrixLayoutEmulated* cublasLtMatrixLayout_t;
struct cublasLtMatmulPreferenceEmulated;
typedef cublasLtMatmulPreferenceEmulated* cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};
enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
};
enum cublasLtEpilogue_t {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_RELU_BIAS = 6,
  CUBLASLT_EPILOGUE_BGRADA = 256,
  CUBLASLT_EPILOGUE_BGRADB = 512,
};
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,
};
enum cublasLtReductionScheme_t { CUBLASLT_REDUCTION_SCHEME_NONE = 0 };
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size);
// One algorithm (workspace 0) for a combination the subset runs; none, and
// CUBLAS_STATUS_NOT_SUPPORTED, for another, or for every call while
// clustr::cuda::emulation::set_lt_algorithms(false) is in force.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned);
// The reference loop of cublasSgemm / cublasGemmEx (emulation_blas.cpp) for the product, then
// the epilogue on each element in float: BIAS adds bias[i] (the bias has D's rows), RELU_BIAS
// then clamps at 0; BGRADB stores in the bias pointer the sums over k of op(B)'s columns (D's
// columns), BGRADA those of op(A)'s rows, each in float in order of k.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- the launcher ------------------------------------------------------------------------------
namespace clustr::cuda::emulation {

// The threads of one block in barrier mode (defined in emulation.cpp).
class Fibers;

// Where a thread called t.sync(): every thread of a block must wait at the same call.
struct SyncSite {
  const char* file = "";
  unsigned line = 0;
};

// t.sync(): the calling thread waits until every thread of its block has arrived.
void block_sync(Fibers* block, SyncSite site);
// t.sync_warp(): the same for the 32 lanes of the caller's warp (__syncwarp).
void warp_sync(Fibers* block, SyncSite site);

// t.shfl_xor(v, m): the value v of lane (lane ^ m) of the caller's warp (32 consecutive
// threads), exchanged at a warp barrier that all 32 lanes reach at the same call (a block
// whose size is not a multiple of 32, or a lane missing, is an error naming the kernel). The
// value travels as its bits (any type of up to 8 bytes).
uint64_t warp_shfl_xor(Fibers* block, uint64_t v, unsigned lane_mask, SyncSite site);

// The order in which the launcher runs a grid's blocks and a block's threads (see the top of
// the file): forward (thread and block order), reverse, or a seeded pseudo-random order drawn
// afresh for every launch, block and barrier round. A correct kernel computes the same results
// under every schedule (up to the order of its atomic additions); a missing barrier shows up
// under some schedule as a read of poisoned (NaN) shared memory or of a value not yet written.
enum class Order { forward, reverse, random };
struct Schedule {
  Order order = Order::forward;
  uint64_t seed = 0;  // random only
};
// "forward", "reverse", "random" (seed 1) or "random:SEED"; throws clustr::Error otherwise.
Schedule parse_schedule(const char* text);
// The schedule of the next launches: initially CLUSTR_EMULATION_SCHEDULE's (forward when it is
// not set; a value parse_schedule refuses makes every launch throw that error).
Schedule current_schedule();
void set_schedule(Schedule s);  // for tests; not while kernels run on other host threads
const char* order_name(Order o);

// What the launcher hands to the kernel's trampoline for one thread.
struct ThreadState {
  unsigned thread[3], block[3], block_dim[3], grid_dim[3];
  unsigned char* shared;
  Fibers* fibers;  // null when the kernel declares no barrier
  const char* kernel_name;
};

// The most dynamic shared memory a launch may ask for: an H100's opt-in limit (227 KiB), which
// launch() of core/cuda/kernel.h opts a kernel into on a GPU when it asks for more than 48 KiB.
constexpr size_t kMaxSharedPerBlock = 227 * 1024;

struct Launch {
  const char* name = "";
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;  // checked: a launch on a stream that is not live does not run
  bool uses_barrier = false;
  const void* kernel = nullptr;
  void (*run)(const void* kernel, const ThreadState& s) = nullptr;
  // A heap copy of the kernel's arguments (for a launch recorded into a graph), which the
  // returned pointer owns.
  std::shared_ptr<const void> (*clone)(const void* kernel) = nullptr;
};

// Runs every thread of every block; a bad configuration or stream is recorded for
// cudaGetLastError (and nothing runs). A broken barrier or a failing body throws clustr::Error
// naming the kernel.
void launch(const Launch& l);

// t.sync() in a kernel that declared kUsesBarrier = false: throws clustr::Error.
[[noreturn]] void sync_without_barrier(const char* kernel);

// ---- warp matrix instructions and asynchronous copies (core/cuda/mma.h; emulation_mma.cpp) ----
// The emulated twins of ldmatrix, mma.sync and cp.async, for kernels that declare
// kUsesBarrier = true (a null block is an error naming the kernel).
//
// ldmatrix and mma are warp instructions: every lane of the warp calls the same one (the same
// site), and when all 32 have arrived the emulator runs it once for the whole warp, reading the
// lanes' operands (for ldmatrix, shared memory at that moment) and writing each lane's results,
// element by element as the PTX ISA lays the fragments out (core/cuda/mma.h lists them).
enum class MmaShape { m16n8k16_bf16, m16n8k8_tf32 };
// out: `matrices` (1, 2 or 4) registers; row: this lane's row address (lanes 8i .. 8i+7 give
// matrix i's rows; the others' are not read), 16-byte aligned inside the block's shared memory.
void ldmatrix(Fibers* block, const char* kernel, unsigned lane, uint32_t* out, const void* row,
              unsigned matrices, bool trans, SyncSite site);
// d (4 floats) += a b: a 4 registers, b 2, of the shape's operand type. The products are exact
// (bf16 and TF32 significands have at most 11 bits) and added to d's value in float, in order
// of k; TF32 operands are read as the hardware reads them, their low 13 mantissa bits ignored.
void mma(Fibers* block, const char* kernel, MmaShape shape, float* d, const uint32_t* a,
         const uint32_t* b, SyncSite site);
// This thread starts copying `bytes` (4, 8 or 16) from device memory at src to shared memory at
// dst (both aligned to bytes), reading only the first src_bytes and zero-filling the rest; dst
// holds NaN bytes until the copy's group is waited for. commit closes the thread's open group;
// wait(pending) finishes (copies in order) every committed group but the `pending` newest. A
// thread that ends with copies started and never waited for fails its block.
void cp_async(Fibers* block, const char* kernel, void* dst, const void* src, unsigned bytes,
              unsigned src_bytes);
void cp_async_commit(Fibers* block, const char* kernel);
void cp_async_wait(Fibers* block, const char* kernel, unsigned pending);

// atomicAdd on a float: a compare-and-swap loop on its bits (blocks may run in parallel).
float atomic_add_f32(float* p, float v);

// Whether the emulated cuBLASLt's heuristic offers an algorithm (true, the default) or none, as
// a GPU's cuBLASLt may for a combination it lacks: for tests of the callers' fall-back path.
// Each call starts a new generation (lt_generation), so that callers who keep the heuristic's
// answers ask again.
void set_lt_algorithms(bool available);
uint64_t lt_generation();

// How many bytes the emulated device holds in live cudaMalloc blocks.
size_t device_bytes_in_use();

// Fills bytes of device memory (inside one live allocation) with 0xff, as cudaMalloc does: the
// allocator of runtime.cu poisons a block when it is freed and when it hands it out again, so
// that a kernel reading memory it never wrote, or a graph replay reading a freed tensor's
// block, computes NaN (or -1 for integers) rather than the previous owner's values.
void poison(void* device_ptr, size_t bytes);

}  // namespace clustr::cuda::emulation
