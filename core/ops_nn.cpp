// Front doors of the nn kernels: the unary derivatives, softmax / log-softmax backward, layer
// norm, cross-entropy and dropout (core/ops.h documents each). Each validates dtypes, shapes,
// devices and values, allocates its results on the inputs' device and calls the kernel of that
// device (core/cpu/nn.cpp or core/cuda/nn.cu, layer_norm.cu, cross_entropy.cu).
//
// Legend: R rows, D layer-norm width, V classes.
#include <string>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/cpu/layer_norm.h"
#include "core/cpu/nn.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/math.h"
#include "core/ops.h"
#include "core/ops_check.h"
#include "core/random.h"

namespace clustr {

using detail::check_f32;

namespace {

bool on_cuda(const Tensor& t) { return t.device() == Device::cuda; }

// f32, on `like`'s device, of shape `shape`.
void check_arg(const char* op, const char* what, const Tensor& t, const Tensor& like,
               const Shape& shape) {
  check_f32(op, what, t);
  detail::check_same_device(op, like, t);
  CLUSTR_CHECK(t.shape() == shape, op, ": expected ", what, " of shape ", to_string(shape),
               ", got ", describe(t));
}

// x's shape without its last axis: the shape of per-row values.
Shape row_shape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

// The rank >= 1 input whose last axis is the one the op works over.
void check_rows(const char* op, const char* what, const Tensor& x) {
  check_f32(op, what, x);
  CLUSTR_CHECK(x.rank() >= 1, op, ": expected ", what, " with at least one axis (the op runs ",
               "over the last), got ", describe(x));
}

// Cross-entropy arguments: logits (R, V) with V >= 1, target i32 (R) with every value in
// [0, V) or ignore_index, weight undefined or f32 (R) (>= 0 when check_weight_values). The
// values are read on the host: from a copy when the tensors are on the device (R numbers, small
// next to the R x V logits), or, when the device's checks are deferred, checked by a kernel.
void check_cross_entropy(const char* op, const Tensor& logits, const Tensor& target,
                         const Tensor& weight, int ignore_index, bool check_weight_values) {
  check_f32(op, "logits", logits);
  CLUSTR_CHECK(logits.rank() == 2 && logits.size(1) >= 1, op,
               ": expected logits of shape (R, V) with V >= 1, got ", describe(logits));
  const int64_t R = logits.size(0), V = logits.size(1);
  detail::check_dtype(op, "target", target, DType::i32);
  detail::check_same_device(op, logits, target);
  CLUSTR_CHECK(target.shape() == Shape{R}, op, ": expected target of shape (", R,
               ",) to match logits ", describe(logits), ", got ", describe(target));
  const bool deferred = on_cuda(logits) && cuda::deferring_checks();
  if (deferred) {
    cuda::check_range_on_device(op, "target", target.i32(), R, 0, static_cast<int32_t>(V),
                                ignore_index);
    if (weight.defined()) check_arg(op, "weight", weight, logits, Shape{R});
    if (weight.defined() && check_weight_values)
      cuda::check_not_below_on_device(op, "weight", weight.f32(), R, 0.0f);
    return;
  }
  std::vector<int32_t> target_copy;
  const int32_t* t = detail::host_i32(target, target_copy);
  for (int64_t r = 0; r < R; ++r)
    CLUSTR_CHECK(t[r] == ignore_index || (t[r] >= 0 && t[r] < V), op, ": target[", r, "] = ",
                 t[r], " is outside [0, ", V, ") and is not ignore_index (", ignore_index, ")");
  if (!weight.defined()) return;
  check_arg(op, "weight", weight, logits, Shape{R});
  if (!check_weight_values) return;
  std::vector<float> weight_copy;
  const float* w = detail::host_f32(weight, weight_copy);
  for (int64_t r = 0; r < R; ++r)
    CLUSTR_CHECK(w[r] >= 0.0f, op, ": weight[", r, "] = ", w[r], " is not >= 0");
}

void check_reduction(const char* op, Reduction reduction) {
  CLUSTR_CHECK(reduction == Reduction::mean || reduction == Reduction::sum, op,
               ": unknown Reduction value ", static_cast<int>(reduction));
}

}  // namespace

// x, y, dy, dx (any shape, all the same). Only the one of x and y that the derivative reads
// must be defined (cpu::unary_grad_inputs); the other may be undefined.
Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy) {
  const std::string name_s = std::string(op_name(op)) + "_backward";
  const char* name = name_s.c_str();
  check_f32(name, "dy", dy);
  const cpu::UnaryGradInputs need = cpu::unary_grad_inputs(op);
  CLUSTR_CHECK(!need.x || x.defined(), name, ": x is an undefined tensor (the derivative of ",
               op_name(op), " is computed from x)");
  CLUSTR_CHECK(!need.y || y.defined(), name, ": y is an undefined tensor (the derivative of ",
               op_name(op), " is computed from y)");
  if (x.defined()) check_arg(name, "x", x, dy, dy.shape());
  if (y.defined()) check_arg(name, "y", y, dy, dy.shape());
  Tensor dx = Tensor::empty(dy.shape(), DType::f32, dy.device());
  auto fn = on_cuda(dy) ? cuda::unary_backward : cpu::unary_backward;
  if (dx.numel() > 0)
    fn(op, need.x ? x.f32() : nullptr, need.y ? y.f32() : nullptr, dy.f32(), dx.f32(),
       dx.numel());
  return dx;
}

namespace {

// y, dy, dx (..., C), computed as rows (numel / C, C).
Tensor softmax_backward_like(const char* op, const Tensor& y, const Tensor& dy, bool log) {
  check_rows(op, "y", y);
  check_arg(op, "dy", dy, y, y.shape());
  Tensor dx = Tensor::empty(y.shape(), DType::f32, y.device());
  if (dx.numel() == 0) return dx;
  const int64_t cols = y.shape().back(), rows = y.numel() / cols;
  auto fn = log ? (on_cuda(y) ? cuda::log_softmax_backward : cpu::log_softmax_backward)
                : (on_cuda(y) ? cuda::softmax_backward : cpu::softmax_backward);
  fn(y.f32(), dy.f32(), dx.f32(), rows, cols);
  return dx;
}

}  // namespace

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  return softmax_backward_like("softmax_backward", y, dy, false);
}
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) {
  return softmax_backward_like("log_softmax_backward", y, dy, true);
}

// x (..., D), gamma, beta (D) -> y (..., D), mean, rstd (...).
LayerNormOutput layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  const char* op = "layer_norm";
  check_rows(op, "x", x);
  const int64_t D = x.shape().back();
  CLUSTR_CHECK(D >= 1, op, ": the last axis of x is empty (", describe(x),
               "); there is nothing to normalise over");
  check_arg(op, "gamma", gamma, x, Shape{D});
  check_arg(op, "beta", beta, x, Shape{D});
  CLUSTR_CHECK(eps >= 0.0f, op, ": expected eps >= 0, got ", eps);
  LayerNormOutput out;
  out.y = Tensor::empty(x.shape(), DType::f32, x.device());
  out.mean = Tensor::empty(row_shape(x), DType::f32, x.device());
  out.rstd = Tensor::empty(row_shape(x), DType::f32, x.device());
  const int64_t R = x.numel() / D;
  auto fn = on_cuda(x) ? cuda::layer_norm : cpu::layer_norm;
  if (R > 0)
    fn(x.f32(), gamma.f32(), beta.f32(), eps, out.y.f32(), out.mean.f32(),
                    out.rstd.f32(), R, D);
  return out;
}

// dy, x (..., D), mean, rstd (...), gamma (D) -> dx (..., D), dgamma, dbeta (D).
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& gamma) {
  const char* op = "layer_norm_backward";
  check_rows(op, "x", x);
  const int64_t D = x.shape().back();
  CLUSTR_CHECK(D >= 1, op, ": the last axis of x is empty (", describe(x), ")");
  check_arg(op, "dy", dy, x, x.shape());
  check_arg(op, "mean", mean, x, row_shape(x));
  check_arg(op, "rstd", rstd, x, row_shape(x));
  check_arg(op, "gamma", gamma, x, Shape{D});
  LayerNormGrads g;
  g.dx = Tensor::empty(x.shape(), DType::f32, x.device());
  g.dgamma = Tensor::empty({D}, DType::f32, x.device());
  g.dbeta = Tensor::empty({D}, DType::f32, x.device());
  auto fn = on_cuda(x) ? cuda::layer_norm_backward : cpu::layer_norm_backward;
  fn(dy.f32(), x.f32(), mean.f32(), rstd.f32(), gamma.f32(), g.dx.f32(), g.dgamma.f32(),
     g.dbeta.f32(), x.numel() / D, D);
  return g;
}

// logits (R, V), target i32 (R), weight (R) or undefined -> loss (), logsumexp (R).
CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                 int ignore_index, Reduction reduction, bool predict) {
  const char* op = "cross_entropy";
  check_reduction(op, reduction);
  check_cross_entropy(op, logits, target, weight, ignore_index, true);
  const int64_t R = logits.size(0), V = logits.size(1);
  const bool mean = reduction == Reduction::mean;
  const float* w = weight.defined() ? weight.f32() : nullptr;
  CrossEntropyOutput out;
  out.logsumexp = Tensor::empty({R}, DType::f32, logits.device());
  if (predict) out.predictions = Tensor::empty({R}, DType::i32, logits.device());
  int32_t* predictions = predict ? out.predictions.i32() : nullptr;
  if (on_cuda(logits)) {  // the sums stay on the device
    out.loss = Tensor::empty({}, DType::f32, logits.device());
    out.weight_sum = Tensor::empty({}, DType::f32, logits.device());
    out.loss_scale = Tensor::empty({}, DType::f32, logits.device());
    cuda::cross_entropy(logits.f32(), target.i32(), w, ignore_index, out.logsumexp.f32(), R, V,
                        mean, out.loss.f32(), out.weight_sum.f32(), out.loss_scale.f32(),
                        predictions);
    return out;
  }
  const CrossEntropySums sums = cpu::cross_entropy(logits.f32(), target.i32(), w, ignore_index,
                                                   out.logsumexp.f32(), R, V, predictions);
  const math::CrossEntropyTotals t = math::cross_entropy_totals(sums.loss, sums.weight, mean);
  out.loss = Tensor::scalar(t.loss, logits.device());
  out.weight_sum = Tensor::scalar(t.weight_sum, logits.device());
  out.loss_scale = Tensor::scalar(t.loss_scale, logits.device());
  return out;
}

// dloss (), logits (R, V), target (R), weight (R) or undefined, logsumexp (R), loss_scale ()
// -> dlogits (R, V).
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                              const Tensor& weight, const Tensor& logsumexp,
                              const Tensor& loss_scale, int ignore_index) {
  const char* op = "cross_entropy_backward";
  check_cross_entropy(op, logits, target, weight, ignore_index, false);
  const int64_t R = logits.size(0), V = logits.size(1);
  check_arg(op, "dloss", dloss, logits, Shape{});
  check_arg(op, "logsumexp", logsumexp, logits, Shape{R});
  check_arg(op, "loss_scale", loss_scale, logits, Shape{});
  Tensor dlogits = Tensor::empty(logits.shape(), DType::f32, logits.device());
  const float* w = weight.defined() ? weight.f32() : nullptr;
  if (on_cuda(logits)) {  // the scale is read by the kernel, on the device
    cuda::cross_entropy_backward(dloss.f32(), loss_scale.f32(), logits.f32(), target.i32(), w,
                                 logsumexp.f32(), ignore_index, dlogits.f32(), R, V);
    return dlogits;
  }
  const float scale = math::cross_entropy_scale(dloss.item(), loss_scale.item());
  if (scale == 0.0f) return Tensor::zeros(logits.shape(), DType::f32, logits.device());
  cpu::cross_entropy_backward(scale, logits.f32(), target.i32(), w, logsumexp.f32(),
                              ignore_index, dlogits.f32(), R, V);
  return dlogits;
}

// x (any shape) -> y (same shape).
Tensor dropout_apply(const Tensor& x, float p, uint64_t seed, PhiloxOffset offset) {
  const char* op = "dropout";
  check_f32(op, "x", x);
  CLUSTR_CHECK(p >= 0.0f && p < 1.0f, op, ": expected a drop probability p in [0, 1), got ", p);
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  if (y.numel() == 0) return y;
  if (on_cuda(x))
    cuda::dropout(x.f32(), p, seed, offset, y.f32(), y.numel());
  else
    cpu::dropout(x.f32(), p, seed, host_offset(offset, op), y.f32(), y.numel());
  return y;
}

}  // namespace clustr
