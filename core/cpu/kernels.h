// CPU kernels: raw pointers, no validation (the front doors in core/ops.h did it), OpenMP
// inside. Every output is overwritten unless the comment says it is accumulated (+=).
#pragma once

#include <cstdint>

#include "core/ops.h"

namespace clustr::cpu {

// out[idx] = op(a[idx . a_strides], b[idx . b_strides]) over every index idx of out_shape
// (rank dims, row-major). A stride of 0 broadcasts that axis.
void binary(BinaryOp op, int rank, const int64_t* out_shape, const float* a,
            const int64_t* a_strides, const float* b, const int64_t* b_strides, float* out);
// out[i] = op(a[i], s), i < n.
void binary_scalar(BinaryOp op, const float* a, float s, float* out, int64_t n);
// y[i] = op(x[i]), i < n.
void unary(UnaryOp op, const float* x, float* y, int64_t n);
// dst[i] += alpha * src[i], i < n (accumulated).
void axpy(float alpha, const float* src, float* dst, int64_t n);

// x viewed as (outer, len, inner); y (outer, inner) = op over the middle axis.
void reduce(ReduceOp op, const float* x, float* y, int64_t outer, int64_t len, int64_t inner);
void argmax(const float* x, int32_t* y, int64_t outer, int64_t len, int64_t inner);
// *y = the number of i in [0, n) with b[i] != ignore and a[i] == b[i] (as a float; exact below
// 2^24).
void count_equal(const int32_t* a, const int32_t* b, int32_t ignore, int64_t n, float* y);

// x, y (rows, cols); per row over cols.
void softmax(const float* x, float* y, int64_t rows, int64_t cols);
void log_softmax(const float* x, float* y, int64_t rows, int64_t cols);
// y, dy, dx (rows, cols): the gradient of softmax / log-softmax (core/cpu/softmax.cpp).
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols);
void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows,
                          int64_t cols);

// y = x with axes permuted: y.shape[i] = in_shape[perm[i]]. Elements are 4-byte words, so the
// same kernel moves f32 and i32 data.
void permute(const uint32_t* x, uint32_t* y, int rank, const int64_t* in_shape, const int* perm);

// out (n, D) = table[index[i], :]; table (V, D). Indices are checked by the caller.
void gather_rows(const float* table, int64_t D, const int32_t* index, int64_t n,
                 const float* added, int64_t P, float* out);
// table[index[i], :] += src[i, :] (accumulated); table (V, D), src (n, D).
void scatter_add_rows(float* table, int64_t V, int64_t D, const int32_t* index, int64_t n,
                      const float* src);

}  // namespace clustr::cpu
