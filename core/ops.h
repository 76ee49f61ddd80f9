// The op front doors. Each checks ranks, shapes, dtypes and devices once (throwing a
// clustr::Error that names the op and the shapes), allocates the result on the inputs' device,
// and calls the device kernel with raw pointers (core/cpu/kernels.h, core/cuda/cuda.h).
// Results are new contiguous tensors unless the name ends in '_' (in place).
#pragma once

#include <vector>

#include "core/philox.h"
#include "core/precision.h"
#include "core/tensor.h"

namespace clustr {

// ---- element-wise, with NumPy broadcasting ------------------------------------------------
enum class BinaryOp { add, sub, mul, div, maximum, minimum };
enum class UnaryOp { neg, exp, log, sqrt, abs, relu, gelu, tanh, sigmoid };
const char* op_name(BinaryOp op);  // "add", "mul", ... for messages and node names
const char* op_name(UnaryOp op);

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
// a, b i32 of one shape -> f32 (): how many positions have b != ignore and a == b (e.g. the
// correct predictions a = argmax(logits) of targets b), counted on their device.
Tensor count_equal(const Tensor& a, const Tensor& b, int32_t ignore);

// ---- softmax over the last axis -------------------------------------------------------------
// A row whose entries are all -inf (fully masked) gives softmax 0 and log-softmax -inf, not NaN.
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);

// ---- layout -----------------------------------------------------------------------------------
Tensor permute(const Tensor& x, const std::vector<int>& perm);  // out.shape[i] = x.shape[perm[i]]
Tensor transpose(const Tensor& x, int axis0, int axis1);

// Embedding lookup. table (V, D), index i32 of any shape -> (index.shape..., D). With `added`
// (P, D), P the last size of index: added's rows are added to the rows looked up, broadcast over
// index's leading axes (a positional encoding added as the lookup writes: y[..., p, :] =
// table[index[..., p]] + added[p], the bits of gather_rows then add).
Tensor gather_rows(const Tensor& table, const Tensor& index, const Tensor& added = Tensor());
// table[index[i], :] += src[i, :]; src (index.shape..., D). Throws on an index outside [0, V).
void scatter_add_rows_(Tensor& table, const Tensor& index, const Tensor& src);
// A new table (V, D) of those sums from zero: row v the sum of src's rows whose index is v (0
// where none), the bits of zeros() then scatter_add_rows_ (an embedding's gradient).
Tensor scatter_sum_rows(int64_t V, const Tensor& index, const Tensor& src);

// ---- shape ops ----------------------------------------------------------------------------------
// x broadcast (NumPy rules) to `shape`, as a new contiguous tensor.
Tensor broadcast_to(const Tensor& x, const Shape& shape);
// The sum of x over the axes that broadcasting added or expanded, giving `shape`: the gradient
// of broadcast_to. `shape` must broadcast to x's shape.
Tensor sum_to(const Tensor& x, const Shape& shape);
// Elements [start, start + length) along `axis` (a copy). f32 or i32.
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t length);
// dst[..., start:start+src.size(axis), ...] += src along `axis` (accumulated): the gradient of
// slice. dst and src agree on every other axis.
void slice_add_(Tensor& dst, int axis, int64_t start, const Tensor& src);
// Tensors joined along `axis`; they agree on every other axis. f32 or i32.
Tensor concat(const std::vector<Tensor>& xs, int axis);
// The inverse of concat: x's consecutive pieces of lens[k] elements along `axis` (summing to
// its length there), in one pass; with `wanted` given, the pieces it marks false are left
// undefined. f32 or i32.
std::vector<Tensor> split(const Tensor& x, int axis, const std::vector<int64_t>& lens,
                          const std::vector<bool>& wanted = {});

// ---- backward kernels of the nn ops ---------------------------------------------------------
// dx = dy * f'(x) for y = unary(op, x). Each formula uses x or y, whichever is cheaper and
// stabler (exp and tanh use y, relu and gelu use x); only the one the formula reads must be
// defined, the other may be an undefined tensor (so a node saves just one).
Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy);
// Over the last axis. y is the forward output.
Tensor softmax_backward(const Tensor& y, const Tensor& dy);      // dx = y * (dy - sum(dy * y))
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy);  // dx = dy - exp(y) * sum(dy)

// Layer norm over the last axis (D): y = (x - mean) * rstd * gamma + beta, rstd = 1/sqrt(var +
// eps) with the biased variance (as PyTorch). x (..., D), gamma and beta (D); mean and rstd
// have x's shape without the last axis and are what backward needs.
struct LayerNormOutput {
  Tensor y, mean, rstd;
};
LayerNormOutput layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps);
struct LayerNormGrads {
  Tensor dx, dgamma, dbeta;
};
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& gamma);

// Cross-entropy of logits (R, V) against i32 targets (R): row r contributes
// w_r * (logsumexp(logits_r) - logits_r[target_r]), where w_r is weight[r] (f32 (R); an
// undefined tensor means 1) and 0 when target_r == ignore_index. Targets outside [0, V) (other
// than ignore_index) and negative weights are errors. mean divides by sum(w_r) (0 when every
// row is ignored, as there is nothing to learn); sum does not. Every output stays on the
// logits' device, so a device step reads nothing back (when the checks of the targets and
// weights are deferred, cuda.h's DeferredChecks, not even those).
enum class Reduction { mean, sum };
struct CrossEntropyOutput {
  Tensor loss;        // shape ()
  Tensor logsumexp;   // (R), saved for backward
  Tensor weight_sum;  // shape (): sum of w_r over the counted rows (the tokens, unweighted)
  Tensor loss_scale;  // shape (): d loss / d (sum of the row losses): 1 / weight_sum for mean
                      // (0 when weight_sum is 0), 1 for sum; saved for backward
  Tensor predictions;  // (R) i32 with `predict`: each row's argmax (the first largest logit, as
                       // argmax gives it), found as the row is read for the loss
};
CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                 int ignore_index, Reduction reduction, bool predict = false);
// The sums over the rows of a cross-entropy, in double, as the kernels (cpu::cross_entropy,
// cuda::cross_entropy) return them to the front door.
struct CrossEntropySums {
  double loss = 0;    // sum of w_r * (lse_r - logits[r, target_r]) over counted rows
  double weight = 0;  // sum of w_r over counted rows
};
// dlogits = dloss * loss_scale * w_r * (softmax(logits_r) - onehot(target_r)), 0 where
// loss_scale is 0; dloss and loss_scale (the forward's) are shape ().
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                              const Tensor& weight, const Tensor& logsumexp,
                              const Tensor& loss_scale, int ignore_index);

// Inverted dropout with a mask drawn from Philox counter blocks starting at `offset` of stream
// `seed` (element i keeps with probability 1 - p, from block offset + i/4, word i%4): y = x *
// keep / (1 - p). The same (seed, offset) gives the same mask, so backward applies this to dy.
// Reserve the blocks with Generator::reserve(dropout_blocks(numel)).
Tensor dropout_apply(const Tensor& x, float p, uint64_t seed, PhiloxOffset offset);
inline uint64_t dropout_blocks(int64_t numel) { return static_cast<uint64_t>((numel + 3) / 4); }

// ---- matrix products --------------------------------------------------------------------------
// C = alpha * op(A) op(B) + beta * C for matrices (rank 2) or batches of them (rank 3, the
// same batch size everywhere). op(X) is X, or X^T when the flag is set. C is f32; A and B are
// f32 or bf16. With Precision::bf16, or when either operand is bf16, the product reads its f32
// operands rounded to bf16 and accumulates in f32 (core/precision.h; the CPU's bf16 GEMM,
// core/cpu/gemm_bf16.h, rounds them as it packs them, the GPU converts them first for
// cuBLAS's bf16 GEMM); with Precision::fp32 and two f32 operands it is the f32 GEMM.
void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta,
          Tensor& C, Precision precision = Precision::fp32);
// op(A) op(B) as a new f32 tensor; rank 2 x rank 2 or rank 3 x rank 3.
Tensor matmul(const Tensor& A, const Tensor& B, bool trans_a = false, bool trans_b = false,
              Precision precision = Precision::fp32);

// ---- fused ops of the transformer layers (core/ops_fused.cpp) -----------------------------------
// Each does in one pass what a chain of the ops above would do in several, with the same
// result. On the CUDA device, whose GEMM (cuBLAS) has no epilogue, each is that chain of device
// ops (core/ops_fused.cpp). The tensors are f32; `precision` is that of their products (as in
// gemm above): the bias, ReLU and sums around them stay f32 either way.
//
// The linear layer's forward with the bias and the activation folded into the GEMM's store of
// each tile: x (R, in), W (out, in), b (out) or undefined -> y (R, out) = x W^T + b, then
// ReLU when `relu`. x may be bf16 (then the product is bf16). In the bf16 precision y may be
// asked for in bf16 (`out_dtype`): the f32 result rounded as it is stored, for a tensor that
// only products read (the feed-forward block's hidden layer): half the bytes to write, keep
// and read back.
Tensor linear_forward(const Tensor& x, const Tensor& W, const Tensor& b, bool relu = false,
                      Precision precision = Precision::fp32, DType out_dtype = DType::f32);
// The linear layer's gradients for y = x W^T + b, x (R, in), W (out, in), dy (R, out):
// dx = dy W (R, in), dW = dy^T x (out, in), db = the sums of dy's rows (out), each only when
// asked for (x is needed for dW, W for dx). db comes out of dW's GEMM, which reads dy anyway;
// dx and dW run in one parallel region (cpu::gemm_many). dy and x may be bf16 (as the
// feed-forward block's dP and H are in the bf16 precision). On another device than the cpu:
// the plain matmul and sum. With dx_sum (f32, R x in elements, e.g. the sum of the gradients
// that already reached x), dx is added into it by its product (beta = 1: the sum rounded once,
// as a separate addition would) and returned as dx.
struct LinearGrads {
  Tensor dx, dW, db;
};
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& W, bool need_dx,
                            bool need_dW, bool need_db, Precision precision = Precision::fp32,
                            const Tensor& dx_sum = Tensor());
// The backward of the ReLU feed-forward block y = relu(x W1^T + b1) W2^T + b2 (autograd
// feed_forward_relu), given dy (R, D_out), x (R, D), W1 (F, D), W2 (D_out, F) and the hidden
// activation H = relu(x W1^T + b1) (R, F), f32 or bf16: dW2 = dy^T H, db2, dP = (dy W2) *
// [H > 0], then dx = dP W1, dW1 = dP^T x, db1; each only when asked for. Two parallel regions:
// dW2 with dP, then dx with dW1. In the bf16 precision dP is stored in bf16 (only the two
// products read it), so db1, summed from it, adds up rounded values. dx_sum: as for
// linear_backward.
struct FeedForwardNeeds {
  bool dx = true, dW1 = true, db1 = true, dW2 = true, db2 = true;
};
struct FeedForwardGrads {
  Tensor dx, dW1, db1, dW2, db2;
};
FeedForwardGrads feed_forward_relu_backward(const Tensor& dy, const Tensor& x, const Tensor& W1,
                                            const Tensor& W2, const Tensor& H,
                                            const FeedForwardNeeds& need,
                                            Precision precision = Precision::fp32,
                                            const Tensor& dx_sum = Tensor());
// Layer norm of the sum a + b over the last axis (a, b (..., D)), the sum never stored: the
// post-norm transformer's x = norm(x + sublayer(x)). Backward returns dx, the gradient of both
// a and b, and recomputes the sum from them.
LayerNormOutput add_layer_norm(const Tensor& a, const Tensor& b, const Tensor& gamma,
                               const Tensor& beta, float eps);
LayerNormGrads add_layer_norm_backward(const Tensor& dy, const Tensor& a, const Tensor& b,
                                       const Tensor& mean, const Tensor& rstd,
                                       const Tensor& gamma);

}  // namespace clustr
