// The CUDA backend's host-side interface. Always declared; implemented by core/cuda/*.cu when
// the toolkit is found at configure time, and by core/cuda/no_cuda.cpp otherwise (where every
// call that needs a GPU throws a clear clustr::Error).
//
// Raw pointers here are device pointers unless the name says host (h2d: host to device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/ops.h"
#include "core/tensor.h"

namespace clustr::cuda {

bool compiled();                 // built with the CUDA backend (a GPU build or device emulation)
bool emulated();                 // built with device emulation (-DCLUSTR_CUDA=EMULATE)
bool available();                // compiled, and a usable GPU is present
std::string unavailable_reason();  // why available() is false ("" when it is true)
void require(const char* what);  // throws, naming `what`, when no usable GPU is present

// Caching allocator: freed blocks are kept for reuse (by rounded size) instead of cudaFree.
void* alloc(size_t bytes);
void free(void* ptr, size_t bytes);
MemoryStats memory_stats();  // live/peak bytes of tensor storage on the device
void reset_peak();
void empty_cache();           // returns cached blocks to the driver
size_t cached_bytes();        // bytes held in the cache, not in use

void copy_h2d(void* dst, const void* src_host, size_t bytes);
void copy_d2h(void* dst_host, const void* src, size_t bytes);
void copy_d2d(void* dst, const void* src, size_t bytes);
void fill_f32(float* dst, float value, int64_t n);
void fill_i32(int32_t* dst, int32_t value, int64_t n);
void synchronize();

// Row-major GEMM on device memory, same arguments and meaning as cpu::gemm (core/cpu/gemm.h):
// C(M,N) = alpha * op(A) op(B) + beta * C, op(X) = X or X^T. Runs through cuBLAS.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                          float alpha, const float* A, int64_t lda, int64_t stride_a,
                          const float* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                          int64_t ldc, int64_t stride_c, int64_t batch);

// ---- kernels: the CUDA twins of core/cpu/kernels.h and core/cpu/nn.h, same arguments and
// meaning (device pointers). Every output is overwritten unless the comment says accumulated.

// out[idx] = op(a[idx . a_strides], b[idx . b_strides]) over every index idx of out_shape (rank
// dims, row-major). A stride of 0 broadcasts that axis. (core/cuda/elementwise.cu)
void binary(BinaryOp op, int rank, const int64_t* out_shape, const float* a,
            const int64_t* a_strides, const float* b, const int64_t* b_strides, float* out);
void binary_scalar(BinaryOp op, const float* a, float s, float* out, int64_t n);  // out = a op s
void unary(UnaryOp op, const float* x, float* y, int64_t n);                    // y = op(x)
void axpy(float alpha, const float* src, float* dst, int64_t n);  // dst += alpha src (accumulated)

// x viewed as (outer, len, inner); y (outer, inner) = op over the middle axis. len > 0 unless
// op is sum. (core/cuda/reduce.cu)
void reduce(ReduceOp op, const float* x, float* y, int64_t outer, int64_t len, int64_t inner);
// x, y (rows, cols); per row over cols.
void softmax(const float* x, float* y, int64_t rows, int64_t cols);
void log_softmax(const float* x, float* y, int64_t rows, int64_t cols);

// Inverted dropout with the Philox stream of core/ops.h's dropout_apply: x, y (n).
// (core/cuda/nn.cu)
void dropout(const float* x, float p, uint64_t seed, uint64_t offset, float* y, int64_t n);

}  // namespace clustr::cuda
