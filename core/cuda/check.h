// Error checking for CUDA runtime and cuBLAS calls, for the CUDA backend's .cu files only
// (core/cuda/, optim/cuda/): it includes the toolkit's headers, or in device emulation their
// host stand-in core/cuda/emulation.h, so nothing outside the CUDA backend may include it.
//
//   CLUSTR_CUDA_CHECK(cudaMemcpyAsync(...));  throws clustr::Error unless cudaSuccess
//   CLUSTR_CUBLAS_CHECK(cublasSgemm(...));    throws clustr::Error unless CUBLAS_STATUS_SUCCESS
//   kernel<<<grid, block, 0, stream>>>(...); CLUSTR_CUDA_CHECK_LAUNCH();
//
// The message names the call as written, where it is, and the error's name and description:
//   "cudaMalloc(&p, n) failed at .../runtime.cu:88: cudaErrorMemoryAllocation (out of memory)"
// Kernel faults are reported asynchronously by whatever CUDA call comes next. Define
// CLUSTR_CUDA_DEBUG_SYNC when compiling to synchronize the current stream after every launch,
// so that a fault is reported at the launch that caused it (slow; for debugging only).
#pragma once

#if defined(CLUSTR_CUDA_EMULATION)
#include "core/cuda/emulation.h"  // the same API, implemented on the host
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

#include "core/cuda/cuda.h"  // current_stream()
#include "core/error.h"

namespace clustr::cuda::checks {

// cuBLAS has cublasGetStatusName since 11.4, but a switch of our own costs little and works with
// any toolkit; the longer description comes from cublasGetStatusString where it exists.
inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

// cuBLAS's description of a status (cublasGetStatusString, through the library that
// core/cuda/blas.cu loads on first use; a fixed text before it is loaded).
const char* cublas_status_string(cublasStatus_t s);

// The runtime also keeps a failed call's error as this thread's last error; it is reported
// here, so it is cleared, or the next launch check would report it again under the kernel's
// name. (A sticky error, a kernel fault, stays: every later call returns it.)
[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* expr, const char* file,
                                          int line) {
  cudaGetLastError();
  throw Error(::clustr::detail::cat(expr, " failed at ", file, ":", line, ": ",
                                    cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t s, const char* expr, const char* file,
                                            int line) {
  throw Error(::clustr::detail::cat(expr, " failed at ", file, ":", line, ": ",
                                    cublas_status_name(s), " (", cublas_status_string(s), ")"));
}

}  // namespace clustr::cuda::checks

#define CLUSTR_CUDA_CHECK(expr)                                                         \
  do {                                                                                  \
    cudaError_t clustr_cuda_err_ = (expr);                                              \
    if (clustr_cuda_err_ != cudaSuccess)                                                \
      ::clustr::cuda::checks::throw_cuda_error(clustr_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define CLUSTR_CUBLAS_CHECK(expr)                                                           \
  do {                                                                                      \
    cublasStatus_t clustr_cublas_st_ = (expr);                                              \
    if (clustr_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::clustr::cuda::checks::throw_cublas_error(clustr_cublas_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// A launch with a bad configuration (too many threads, too much shared memory, no kernel image
// for this GPU) fails without a return value; cudaGetLastError reports it and clears it.
#ifdef CLUSTR_CUDA_DEBUG_SYNC
#define CLUSTR_CUDA_CHECK_LAUNCH()                                                     \
  do {                                                                                 \
    CLUSTR_CUDA_CHECK_NAMED(cudaGetLastError(), "kernel launch");                      \
    CLUSTR_CUDA_CHECK_NAMED(cudaStreamSynchronize(::clustr::cuda::current_stream()),   \
                            "kernel execution");                                       \
  } while (0)
#else
#define CLUSTR_CUDA_CHECK_LAUNCH() CLUSTR_CUDA_CHECK_NAMED(cudaGetLastError(), "kernel launch")
#endif

// Like CLUSTR_CUDA_CHECK, with `what` in the message instead of the expression's text.
#define CLUSTR_CUDA_CHECK_NAMED(expr, what)                                              \
  do {                                                                                   \
    cudaError_t clustr_cuda_err_ = (expr);                                               \
    if (clustr_cuda_err_ != cudaSuccess)                                                 \
      ::clustr::cuda::checks::throw_cuda_error(clustr_cuda_err_, what, __FILE__, __LINE__); \
  } while (0)
