// The differentiable ops: each computes its result with the core front doors (core/ops.h) and,
// when an input requires grad, records a Node whose backward is written by hand. Shapes and
// broadcasting follow the core ops; gradients of broadcast inputs are summed back to the
// input's shape.
#pragma once

#include <vector>

#include "autograd/variable.h"
#include "core/ops.h"
#include "core/random.h"

namespace clustr {

// ---- arithmetic, with NumPy broadcasting (autograd/ops_arith.cpp) ---------------------------
Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable div(const Variable& a, const Variable& b);
Variable neg(const Variable& x);
Variable add(const Variable& x, float s);  // x + s
Variable mul(const Variable& x, float s);  // x * s

inline Variable operator+(const Variable& a, const Variable& b) { return add(a, b); }
inline Variable operator-(const Variable& a, const Variable& b) { return sub(a, b); }
inline Variable operator*(const Variable& a, const Variable& b) { return mul(a, b); }
inline Variable operator/(const Variable& a, const Variable& b) { return div(a, b); }
inline Variable operator-(const Variable& x) { return neg(x); }
inline Variable operator+(const Variable& x, float s) { return add(x, s); }
inline Variable operator-(const Variable& x, float s) { return add(x, -s); }
inline Variable operator*(const Variable& x, float s) { return mul(x, s); }
inline Variable operator*(float s, const Variable& x) { return mul(x, s); }
inline Variable operator/(const Variable& x, float s) { return mul(x, 1.0f / s); }

// ---- matrix products and lookups (autograd/ops_matmul.cpp) ------------------------------------
// op(A) op(B) for matrices (rank 2) or batches (rank 3).
Variable matmul(const Variable& A, const Variable& B, bool trans_a = false, bool trans_b = false);
// x (..., in), weight (out, in), bias (out) or undefined -> (..., out) = x W^T + b.
Variable linear(const Variable& x, const Variable& weight, const Variable& bias);
// table (V, D), index i32 of any shape -> (index.shape..., D). The gradient of table is a
// scatter-add of the output gradient rows. With `added` (P, D), P index's last size, a constant
// (no gradient) whose rows are added as the rows are looked up, broadcast over index's leading
// axes (a fixed positional encoding: core gather_rows).
Variable embedding(const Variable& table, const Tensor& index, const Tensor& added = Tensor());

// ---- shapes and reductions (autograd/ops_shape.cpp) -------------------------------------------
Variable reshape(const Variable& x, const Shape& shape);
Variable permute(const Variable& x, const std::vector<int>& perm);
Variable transpose(const Variable& x, int axis0, int axis1);
Variable slice(const Variable& x, int axis, int64_t start, int64_t length);
// Along axis 0, pieces that lie side by side in one storage (Tensor::adjacent_rows, as a layer
// stacks its projections' weights) give a view of them, as reshape does, and their gradients
// are views of the output's gradient; otherwise a copy.
Variable concat(const std::vector<Variable>& xs, int axis);
Variable sum(const Variable& x, int axis, bool keepdim = false);
Variable mean(const Variable& x, int axis, bool keepdim = false);
Variable sum_all(const Variable& x);   // shape ()
Variable mean_all(const Variable& x);  // shape ()

// ---- activations and normalisation (autograd/ops_nn.cpp) -------------------------------------
Variable exp(const Variable& x);
Variable log(const Variable& x);
Variable sqrt(const Variable& x);
Variable relu(const Variable& x);
Variable gelu(const Variable& x);
Variable tanh(const Variable& x);
Variable sigmoid(const Variable& x);
Variable softmax(const Variable& x);      // over the last axis
Variable log_softmax(const Variable& x);  // over the last axis
// Over the last axis D; gamma and beta (D). Fused: saves mean and 1/std, not the normalised x.
Variable layer_norm(const Variable& x, const Variable& gamma, const Variable& beta,
                    float eps = 1e-5f);
// Inverted dropout: in training, each element is zeroed with probability p and the rest scaled
// by 1/(1-p); the mask comes from `gen` and is regenerated in backward rather than stored.
// Not training (or p == 0): x itself.
Variable dropout(const Variable& x, float p, Generator& gen, bool training = true);
// logits (..., V), target i32 (...) -> shape (). weight: per-position f32 (...) or undefined;
// positions whose target is ignore_index do not count. See core cross_entropy. predictions:
// where not null, set to each position's argmax over V, i32 (...), found in the same pass (the
// tensor argmax(logits, -1) gives).
Variable cross_entropy(const Variable& logits, const Tensor& target, const Tensor& weight = {},
                       int ignore_index = -100, Reduction reduction = Reduction::mean,
                       Tensor* predictions = nullptr);

// ---- fused ops of the transformer layers (autograd/ops_fused.cpp) -----------------------------
// The same results as the compositions named, in fewer passes over memory and with less saved.
// relu(x W1^T + b1) W2^T + b2: the position-wise feed-forward block with ReLU and no dropout.
// x (..., D), w1 (F, D), b1 (F), w2 (D_out, F), b2 (D_out) -> (..., D_out).
Variable feed_forward_relu(const Variable& x, const Variable& w1, const Variable& b1,
                           const Variable& w2, const Variable& b2);
// layer_norm(a + b, gamma, beta, eps) without storing a + b: the post-norm residual step.
// a, b (..., D), gamma, beta (D) -> (..., D).
Variable add_layer_norm(const Variable& a, const Variable& b, const Variable& gamma,
                        const Variable& beta, float eps = 1e-5f);

}  // namespace clustr
