// The op front doors. Each checks ranks, shapes, dtypes and devices once (throwing a
// clustr::Error that names the op and the shapes), allocates the result on the inputs' device,
// and calls the device kernel with raw pointers (core/cpu/kernels.h, core/cuda/cuda.h).
// Results are new contiguous tensors unless the name ends in '_' (in place).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace clustr {

// ---- element-wise, with NumPy broadcasting ------------------------------------------------
enum class BinaryOp { add, sub, mul, div, maximum, minimum };
enum class UnaryOp { neg, exp, log, sqrt, abs, relu, gelu, tanh, sigmoid };

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// a op s, with a scalar on the right.
Tensor binary_scalar(BinaryOp op, const Tensor& a, float s);
Tensor add(const Tensor& a, float s);
Tensor mul(const Tensor& a, float s);

Tensor unary(UnaryOp op, const Tensor& x);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact erf form, PyTorch's default
Tensor tanh(const Tensor& x);

// dst += alpha * src (same shape); the gradient accumulation primitive.
void add_(Tensor& dst, const Tensor& src, float alpha = 1.0f);

// ---- reductions over one axis -------------------------------------------------------------
enum class ReduceOp { sum, mean, max, min };
Tensor reduce(ReduceOp op, const Tensor& x, int axis, bool keepdim = false);
Tensor sum(const Tensor& x, int axis, bool keepdim = false);
Tensor mean(const Tensor& x, int axis, bool keepdim = false);
Tensor max(const Tensor& x, int axis, bool keepdim = false);
Tensor argmax(const Tensor& x, int axis, bool keepdim = false);  // i32
Tensor sum_all(const Tensor& x);                                   // shape ()

// ---- softmax over the last axis -------------------------------------------------------------
// A row whose entries are all -inf (fully masked) gives softmax 0 and log-softmax -inf, not NaN.
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);

// ---- layout -----------------------------------------------------------------------------------
Tensor permute(const Tensor& x, const std::vector<int>& perm);  // out.shape[i] = x.shape[perm[i]]
Tensor transpose(const Tensor& x, int axis0, int axis1);

// Embedding lookup. table (V, D), index i32 of any shape -> (index.shape..., D).
Tensor gather_rows(const Tensor& table, const Tensor& index);
// table[index[i], :] += src[i, :]; src (index.shape..., D). Throws on an index outside [0, V).
void scatter_add_rows_(Tensor& table, const Tensor& index, const Tensor& src);

// ---- matrix products --------------------------------------------------------------------------
// C = alpha * op(A) op(B) + beta * C for matrices (rank 2) or batches of them (rank 3, the
// same batch size everywhere). op(X) is X, or X^T when the flag is set.
void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta,
          Tensor& C);
// op(A) op(B) as a new tensor; rank 2 x rank 2 or rank 3 x rank 3.
Tensor matmul(const Tensor& A, const Tensor& B, bool trans_a = false, bool trans_b = false);

}  // namespace clustr
