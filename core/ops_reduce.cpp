// Front doors of the reductions over one axis, sum_all, and softmax / log-softmax over the
// last axis. A reduction over axis a of x views x as (outer, len, inner):
//   outer = prod(shape[:a]), len = shape[a], inner = prod(shape[a+1:]),
// and the kernels (core/cpu/reduce.cpp, core/cpu/softmax.cpp) work on that view.
#include <cstdint>
#include <limits>

#include "core/cpu/kernels.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops_check.h"

namespace clustr {

namespace {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  throw Error(detail::cat("reduce: unknown ReduceOp value ", static_cast<int>(op)));
}

struct AxisView {
  int axis = 0;
  int64_t outer = 1, len = 1, inner = 1;
  Shape out_shape;  // x's shape without the axis, or with it set to 1 (keepdim)
};

// x (shape) viewed as (outer, len, inner) around `axis`. `needs_elements`: the op has no value
// for an empty axis (mean, max, min, argmax), unlike sum (0).
AxisView axis_view(const char* op, const Tensor& x, int axis, bool keepdim, bool needs_elements) {
  AxisView v;
  v.axis = normalize_axis(axis, x.rank(), op);
  const Shape& s = x.shape();
  for (int i = 0; i < v.axis; ++i) v.outer *= s[i];
  v.len = s[v.axis];
  for (int i = v.axis + 1; i < x.rank(); ++i) v.inner *= s[i];
  CLUSTR_CHECK(!needs_elements || v.len > 0, op, ": cannot reduce over axis ", axis,
               " of size 0 (x is ", describe(x), "); the result would have no value");
  for (int i = 0; i < x.rank(); ++i) {
    if (i != v.axis)
      v.out_shape.push_back(s[i]);
    else if (keepdim)
      v.out_shape.push_back(1);
  }
  return v;
}

}  // namespace

// x (..., len, ...) -> (..., ...) or, with keepdim, (..., 1, ...).
Tensor reduce(ReduceOp op, const Tensor& x, int axis, bool keepdim) {
  const char* name = op_name(op);
  detail::check_f32(name, "x", x);
  const AxisView v = axis_view(name, x, axis, keepdim, op != ReduceOp::sum);
  Tensor y = Tensor::empty(v.out_shape, DType::f32, x.device());
  auto fn = x.device() == Device::cuda ? cuda::reduce : cpu::reduce;
  if (y.numel() > 0) fn(op, x.f32(), y.f32(), v.outer, v.len, v.inner);
  return y;
}

Tensor sum(const Tensor& x, int axis, bool keepdim) {
  return reduce(ReduceOp::sum, x, axis, keepdim);
}
Tensor mean(const Tensor& x, int axis, bool keepdim) {
  return reduce(ReduceOp::mean, x, axis, keepdim);
}
Tensor max(const Tensor& x, int axis, bool keepdim) {
  return reduce(ReduceOp::max, x, axis, keepdim);
}

// x (..., len, ...) -> i32 (..., ...): the first index of the maximum along axis.
Tensor argmax(const Tensor& x, int axis, bool keepdim) {
  detail::check_f32("argmax", "x", x);
  const AxisView v = axis_view("argmax", x, axis, keepdim, true);
  CLUSTR_CHECK(v.len <= std::numeric_limits<int32_t>::max(), "argmax: axis ", axis, " of ",
               describe(x), " is too long for i32 indices");
  Tensor y = Tensor::empty(v.out_shape, DType::i32, x.device());
  auto fn = x.device() == Device::cuda ? cuda::argmax : cpu::argmax;
  if (y.numel() > 0) fn(x.f32(), y.i32(), v.outer, v.len, v.inner);
  return y;
}

// x (any shape) -> () : the sum of every element (0 for an empty tensor).
Tensor sum_all(const Tensor& x) {
  detail::check_f32("sum_all", "x", x);
  Tensor y = Tensor::empty({}, DType::f32, x.device());
  auto fn = x.device() == Device::cuda ? cuda::reduce : cpu::reduce;
  fn(ReduceOp::sum, x.f32(), y.f32(), 1, x.numel(), 1);
  return y;
}

// a, b (any shape, the same) i32 -> (): the positions with b != ignore and a == b.
Tensor count_equal(const Tensor& a, const Tensor& b, int32_t ignore) {
  const char* op = "count_equal";
  detail::check_dtype(op, "a", a, DType::i32);
  detail::check_dtype(op, "b", b, DType::i32);
  detail::check_same_device(op, a, b);
  CLUSTR_CHECK(a.shape() == b.shape(), op, ": expected a and b of one shape, got ", describe(a),
               " and ", describe(b));
  Tensor y = Tensor::empty({}, DType::f32, a.device());
  auto fn = a.device() == Device::cuda ? cuda::count_equal : cpu::count_equal;
  fn(a.i32(), b.i32(), ignore, a.numel(), y.f32());
  return y;
}

// ---- softmax over the last axis --------------------------------------------------------------

namespace {

// x (..., C) -> y (..., C), computed as rows (numel / C, C).
Tensor softmax_like(const char* op, const Tensor& x, bool log) {
  detail::check_f32(op, "x", x);
  CLUSTR_CHECK(x.rank() >= 1, op, ": expected a tensor with at least one axis (softmax runs ",
               "over the last), got ", describe(x));
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  if (y.numel() == 0) return y;
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  const bool cuda = x.device() == Device::cuda;
  if (log)
    (cuda ? cuda::log_softmax : cpu::log_softmax)(x.f32(), y.f32(), rows, cols);
  else
    (cuda ? cuda::softmax : cpu::softmax)(x.f32(), y.f32(), rows, cols);
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x) { return softmax_like("softmax", x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_like("log_softmax", x, true); }

}  // namespace clustr
