// Device emulation: the CUDA backend built with the host compiler (configure with
// -DCLUSTR_CUDA=EMULATE), so that every kernel runs, and is tested, on a machine without a GPU.
// Included only through core/cuda/check.h, in place of the toolkit's headers, by core/cuda/*
// sources compiled with CLUSTR_CUDA_EMULATION.
//
// Two parts: the runtime and cuBLAS subsets (emulation.cpp, emulation_blas.cpp) and the launcher
// (emulation_launch.cpp):
//
// 1. The subset of the CUDA runtime and cuBLAS APIs that core/cuda/ calls, with the same names,
//    signatures and error codes, so that runtime.cu and blas.cu compile unchanged:
//    - device memory is host memory, but in an arena of its own: address space reserved at the
//      first cudaMalloc (the host's physical memory in size, pages cost memory only once
//      written), carved into 256-byte aligned blocks with a 256-byte gap after each. The arena
//      is inaccessible (PROT_NONE) except while the emulator itself works on it (a launch, a
//      copy, a GEMM, a fill), so host code that reads or writes device memory directly faults;
//      a SIGSEGV handler names the address and prints a backtrace before the process ends.
//      Under AddressSanitizer everything in the arena outside live blocks is poisoned, so a
//      kernel running past its block or into a freed one is reported as on the heap. Every
//      allocation is registered, and cudaMemcpyAsync checks that each side of a copy is, or is
//      not, device memory as its direction says (a host pointer handed to the device is an
//      error); cudaMalloc fails with cudaErrorMemoryAllocation past the emulated device's
//      capacity (the host's physical memory). What the arena cannot catch: a kernel given a
//      host pointer reads host memory (kernels run on the host);
//    - streams and events: every launch, copy and GEMM has finished when its call returns, so
//      work is trivially ordered and synchronizing or querying returns at once. What is checked
//      is the handles: a stream or event is live from its create call to its destroy call, and
//      any call given one that is not (destroyed, never created, an event passed as a stream)
//      fails with cudaErrorInvalidResourceHandle; a kernel launched on such a stream is
//      reported by cudaGetLastError and does not run, and a GEMM on a handle bound to one fails
//      with CUBLAS_STATUS_EXECUTION_FAILED. Handles are numbers that are never reused, so a
//      destroyed one stays invalid (a driver may hand the same value out again);
//    - cublasSgemm and cublasSgemmStridedBatched are a plain host GEMM with cuBLAS's
//      column-major semantics: op N/T, m/n/k, lda/ldb/ldc and their validity rules
//      (CUBLAS_STATUS_INVALID_VALUE), alpha/beta with C not read when beta == 0 and A, B not
//      read when alpha == 0 or k == 0, strides and batch count. The matrices each call reads and
//      writes must lie inside device allocations, or the call fails (a GPU would fault), so a
//      wrong leading dimension in our row-major mapping is caught even where it stays in bounds
//      of the host heap.
//      cublasGemmEx and cublasGemmStridedBatchedEx follow the same contract for the type
//      combinations clustr uses, CUDA_R_16BF x CUDA_R_16BF -> CUDA_R_32F and CUDA_R_32F x
//      CUDA_R_32F -> CUDA_R_32F, both with CUBLAS_COMPUTE_32F (alpha and beta are floats), and
//      algorithm CUBLAS_GEMM_DEFAULT or CUBLAS_GEMM_DEFAULT_TENSOR_OP; any other combination is
//      CUBLAS_STATUS_NOT_SUPPORTED, any other algorithm CUBLAS_STATUS_INVALID_VALUE.
//      The arithmetic: each product of two operands is formed in float and the products are
//      added in float, in order of k (a GPU adds in another order, and fuses float32
//      multiply-adds; tests allow for that). A product of two bf16 values is exact in float
//      (8-bit significands), as on tensor cores, so for bf16 the only rounding is float32
//      accumulation, as on a GPU. With the handle's math mode
//      CUBLAS_TF32_TENSOR_OP_MATH, every float32 operand (of cublasSgemm, of
//      cublasSgemmStridedBatched, and of cublasGemmEx with float32 inputs) is first rounded to
//      TF32 as the cvt.rna.tf32.f32 instruction does: to 10 explicit mantissa bits, to nearest
//      with ties away from zero (NaN and infinities kept). A GPU's TF32 kernels may round
//      another way (or drop the low bits), so tests of TF32 on a GPU allow for that.
//      Built with -DCLUSTR_EMULATION_NUMERICS=gpu (GPU-like numerics), each product is instead
//      fused into one of four partial sums (k mod 4, fmaf), added pairwise at the end, and beta
//      C is fused in too: another summation order, as a GPU's GEMM has its own, so that tests
//      take the tolerance branches they take on a GPU (cuda::exact_numerics() is false);
//    - fresh device memory (and a block the allocator of runtime.cu hands out again) holds NaN
//      bytes (0xff), so a kernel reading memory it never wrote computes NaN, not a plausible 0;
//    - a device-to-device copy whose ranges overlap is refused (cudaErrorInvalidValue; its
//      result is undefined on a GPU);
//    - the environment variable CLUSTR_CUDA_EMULATION_DEVICES=0 makes cudaGetDeviceCount report
//      no device, to test the "no GPU" paths.
//
// 2. The launcher behind launch() of core/cuda/kernel.h. Blocks run in parallel over the
//    OpenMP threads (one after another without OpenMP); within a block:
//    - a kernel that declares kUsesBarrier = false has its threads run one after another, each
//      to its end (t.sync() is then an error);
//    - a kernel with kUsesBarrier = true runs each CUDA thread of the block as a fiber: an
//      execution context with its own stack (POSIX ucontext), all of the block's fibers on one
//      host thread. t.sync() is a real barrier: the fiber switches back to the block's
//      scheduler, which resumes the fibers only when every one of them has arrived. A fiber
//      switch costs well under a microsecond, where waking host threads at every barrier costs
//      tens of microseconds each, and the emulation stays deterministic. Threads that return
//      while others wait at a barrier, and threads waiting at different t.sync() calls (the
//      call's file and line), are reported as an error (on a GPU that is undefined behaviour,
//      often a hang). Under AddressSanitizer the switches are announced to it
//      (__sanitizer_start_switch_fiber), so it follows the fibers' stacks.
//    The schedule (CLUSTR_EMULATION_SCHEDULE, or set_schedule below) orders all of this: the
//    threads of a block without barriers, the fibers' resumption in every barrier round, and
//    the blocks each host thread takes. In thread order ("forward", the default) a missing
//    barrier goes unseen whenever the reader of a value has a higher index than its writer;
//    "reverse" and "random:SEED" (a permutation drawn afresh for every launch, block and round,
//    the same for a given seed) run readers first, which then see NaN shared memory.
//    Built with ThreadSanitizer (-DCLUSTR_TSAN=ON, no OpenMP), every CUDA thread is a fiber of
//    its own to it, kernels without barriers included, and it is told only the GPU's orderings
//    (host work before a launch, a block's threads before and after each t.sync(), the launch
//    before the host's next work): two threads touching the same byte between barriers, or two
//    blocks of a launch, without an atomic, are reported as a data race whatever the schedule.
//    Launch configurations a GPU rejects (more than 1024 threads per block, block or grid sizes
//    past CUDA's limits, more than 48 KiB of dynamic shared memory) are recorded as
//    cudaErrorInvalidConfiguration for cudaGetLastError, as the runtime does.
#pragma once

#include <cstddef>
#include <cstdint>

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
// Column-major C(m, n) = alpha * op(A)(m, k) op(B)(k, n) + beta * C, as cuBLAS.
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

// t.shfl_xor(v, m): the value v of lane (lane ^ m) of the caller's warp (32 consecutive
// threads), exchanged at a warp barrier that all 32 lanes reach at the same call (a block
// whose size is not a multiple of 32, or a lane missing, is an error naming the kernel).
float warp_shfl_xor(Fibers* block, float v, unsigned lane_mask, SyncSite site);

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

struct Launch {
  const char* name = "";
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;  // checked: a launch on a stream that is not live does not run
  bool uses_barrier = false;
  const void* kernel = nullptr;
  void (*run)(const void* kernel, const ThreadState& s) = nullptr;
};

// Runs every thread of every block; a bad configuration or stream is recorded for
// cudaGetLastError (and nothing runs). A broken barrier or a failing body throws clustr::Error
// naming the kernel.
void launch(const Launch& l);

// t.sync() in a kernel that declared kUsesBarrier = false: throws clustr::Error.
[[noreturn]] void sync_without_barrier(const char* kernel);

// atomicAdd on a float: a compare-and-swap loop on its bits (blocks may run in parallel).
float atomic_add_f32(float* p, float v);

// How many bytes the emulated device holds in live cudaMalloc blocks.
size_t device_bytes_in_use();

// Fills bytes of device memory (inside one live allocation) with 0xff, as cudaMalloc does: the
// allocator of runtime.cu poisons a block it hands out again, so that a kernel reading memory
// it never wrote computes NaN (or -1 for integers) rather than the previous owner's values.
void poison(void* device_ptr, size_t bytes);

}  // namespace clustr::cuda::emulation
