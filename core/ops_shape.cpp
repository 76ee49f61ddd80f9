// Front doors of the shape ops: broadcast_to and its gradient sum_to, slice and its gradient
// slice_add_, and concat. Kernels in core/cpu/shape_ops.cpp and core/cuda/shape_ops.cu.
//
// The axis ops view a tensor around `axis` as (outer, len, inner):
//   outer = prod(shape[:axis]), len = shape[axis], inner = prod(shape[axis+1:]).
#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu/shape_ops.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops_check.h"

namespace clustr {

using detail::check_defined;
using detail::check_f32;
using detail::check_same_device;

namespace {

bool on_cuda(const Tensor& t) { return t.device() == Device::cuda; }

// f32 or i32: the copies move 4-byte words (so not bf16's 2-byte ones).
void check_words(const char* op, const char* what, const Tensor& t) {
  check_defined(op, what, t);
  CLUSTR_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::i32, op, ": expected ", what,
               " to be f32 or i32, got ", describe(t), detail::dtype_hint(t));
}

struct AxisView {
  int axis = 0;
  int64_t outer = 1, len = 1, inner = 1;
};

AxisView axis_view(const Shape& s, int axis) {
  AxisView v;
  v.axis = axis;
  for (int i = 0; i < axis; ++i) v.outer *= s[i];
  v.len = s[axis];
  for (size_t i = static_cast<size_t>(axis) + 1; i < s.size(); ++i) v.inner *= s[i];
  return v;
}

// The axis of x that `axis` names; x must have at least one axis.
int axis_of(const char* op, const Tensor& x, int axis) {
  CLUSTR_CHECK(x.rank() >= 1, op, ": expected a tensor with at least one axis, got ",
               describe(x));
  return normalize_axis(axis, x.rank(), op);
}

}  // namespace

// x (s, aligned at the right of shape; each size equal or 1) -> shape.
Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  const char* op = "broadcast_to";
  check_words(op, "x", x);
  const Shape& s = x.shape();
  CLUSTR_CHECK(s.size() <= shape.size(), op, ": cannot broadcast x ", describe(x), " to ",
               to_string(shape), " of lower rank");
  const size_t lead = shape.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i)
    CLUSTR_CHECK(s[i] == shape[lead + i] || s[i] == 1, op, ": cannot broadcast x ", describe(x),
                 " to ", to_string(shape), " (axis ", lead + i, " of the result: ", s[i], " vs ",
                 shape[lead + i], ")");
  for (int64_t d : shape)
    CLUSTR_CHECK(d >= 0, op, ": negative size in target shape ", to_string(shape));
  // x read as the target: the axes it lacks or has with size 1 get stride 0.
  std::vector<int64_t> strides(shape.size(), 0);
  const std::vector<int64_t> st = contiguous_strides(s);
  for (size_t i = 0; i < s.size(); ++i) strides[lead + i] = s[i] == 1 ? 0 : st[i];
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  auto fn = on_cuda(x) ? cuda::broadcast_to : cpu::broadcast_to;
  if (out.numel() > 0)
    fn(static_cast<const uint32_t*>(x.raw()), strides.data(), static_cast<int>(shape.size()),
       shape.data(), static_cast<uint32_t*>(out.raw()));
  return out;
}

// x (xs) -> shape, where shape broadcasts to xs: summed over the leading axes that shape lacks
// and over the axes where shape has 1 and xs does not.
Tensor sum_to(const Tensor& x, const Shape& shape) {
  const char* op = "sum_to";
  check_f32(op, "x", x);
  const Shape& s = x.shape();
  CLUSTR_CHECK(shape.size() <= s.size(), op, ": target shape ", to_string(shape),
               " has a higher rank than x ", describe(x), " (it must broadcast to x's shape)");
  const size_t lead = s.size() - shape.size();
  std::vector<uint8_t> keep(s.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    CLUSTR_CHECK(shape[i] == s[lead + i] || shape[i] == 1, op, ": target shape ",
                 to_string(shape), " does not broadcast to x ", describe(x), " (axis ", lead + i,
                 " of x: ", shape[i], " vs ", s[lead + i], ")");
    keep[lead + i] = shape[i] == s[lead + i] ? 1 : 0;
  }
  Tensor y = Tensor::empty(shape, DType::f32, x.device());
  auto fn = on_cuda(x) ? cuda::sum_to : cpu::sum_to;
  if (y.numel() > 0) fn(x.f32(), x.rank(), s.data(), keep.data(), y.f32());
  return y;
}

// x (..., len, ...) -> (..., length, ...): elements [start, start + length) along axis.
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t length) {
  const char* op = "slice";
  check_words(op, "x", x);
  const AxisView v = axis_view(x.shape(), axis_of(op, x, axis));
  CLUSTR_CHECK(start >= 0 && length >= 0 && start + length <= v.len, op, ": elements [", start,
               ", ", start + length, ") along axis ", axis, " are not within [0, ", v.len,
               ") of x ", describe(x));
  Shape out_shape = x.shape();
  out_shape[v.axis] = length;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  auto fn = on_cuda(x) ? cuda::slice : cpu::slice;
  if (y.numel() > 0)
    fn(static_cast<const uint32_t*>(x.raw()), v.outer, v.len, v.inner, start, length,
       static_cast<uint32_t*>(y.raw()));
  return y;
}

// dst (..., len, ...)[..., start:start+length, ...] += src (..., length, ...).
void slice_add_(Tensor& dst, int axis, int64_t start, const Tensor& src) {
  const char* op = "slice_add_";
  check_f32(op, "dst", dst);
  check_f32(op, "src", src);
  check_same_device(op, dst, src);
  const AxisView v = axis_view(dst.shape(), axis_of(op, dst, axis));
  bool agree = src.rank() == dst.rank();
  for (int i = 0; agree && i < dst.rank(); ++i)
    agree = i == v.axis || src.shape()[i] == dst.shape()[i];
  CLUSTR_CHECK(agree, op, ": src ", describe(src), " and dst ", describe(dst),
               " must agree on every axis but axis ", axis);
  const int64_t length = src.shape()[v.axis];
  CLUSTR_CHECK(start >= 0 && start + length <= v.len, op, ": elements [", start, ", ",
               start + length, ") along axis ", axis, " (src ", describe(src),
               ") are not within [0, ", v.len, ") of dst ", describe(dst));
  auto fn = on_cuda(dst) ? cuda::slice_add : cpu::slice_add;
  if (src.numel() > 0) fn(dst.f32(), v.outer, v.len, v.inner, start, src.f32(), length);
}

// xs[k] (..., len_k, ...) -> (..., sum_k len_k, ...).
Tensor concat(const std::vector<Tensor>& xs, int axis) {
  const char* op = "concat";
  CLUSTR_CHECK(!xs.empty(), op, ": expected at least one tensor, got none");
  const Tensor& x0 = xs[0];
  check_words(op, "xs[0]", x0);
  const int a = axis_of(op, x0, axis);
  Shape out_shape = x0.shape();
  out_shape[a] = 0;
  std::vector<const uint32_t*> ptrs(xs.size());
  std::vector<int64_t> lens(xs.size());
  for (size_t k = 0; k < xs.size(); ++k) {
    const Tensor& x = xs[k];
    const std::string what = "xs[" + std::to_string(k) + "]";
    check_words(op, what.c_str(), x);
    CLUSTR_CHECK(x.dtype() == x0.dtype(), op, ": ", what, " ", describe(x),
                 " has a different dtype from xs[0] ", describe(x0));
    check_same_device(op, x0, x);
    bool agree = x.rank() == x0.rank();
    for (int i = 0; agree && i < x0.rank(); ++i) agree = i == a || x.shape()[i] == x0.shape()[i];
    CLUSTR_CHECK(agree, op, ": ", what, " ", describe(x), " and xs[0] ", describe(x0),
                 " must agree on every axis but axis ", axis);
    ptrs[k] = static_cast<const uint32_t*>(x.raw());
    lens[k] = x.shape()[a];
    out_shape[a] += lens[k];
  }
  Tensor y = Tensor::empty(out_shape, x0.dtype(), x0.device());
  if (y.numel() > 0) {
    const AxisView v = axis_view(out_shape, a);
    auto fn = on_cuda(x0) ? cuda::concat : cpu::concat;
    fn(static_cast<int>(xs.size()), ptrs.data(), lens.data(), v.outer, v.inner,
       static_cast<uint32_t*>(y.raw()));
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, int axis, const std::vector<int64_t>& lens,
                          const std::vector<bool>& wanted) {
  const char* op = "split";
  check_words(op, "x", x);
  const AxisView v = axis_view(x.shape(), axis_of(op, x, axis));
  CLUSTR_CHECK(wanted.empty() || wanted.size() == lens.size(), op, ": expected ", lens.size(),
               " wanted flags (one per piece), got ", wanted.size());
  int64_t total = 0;
  for (size_t k = 0; k < lens.size(); ++k) {
    CLUSTR_CHECK(lens[k] >= 0, op, ": piece ", k, " has a negative length ", lens[k]);
    total += lens[k];
  }
  CLUSTR_CHECK(total == v.len, op, ": the pieces' lengths sum to ", total, ", not to the ",
               v.len, " elements along axis ", axis, " of x ", describe(x));
  std::vector<Tensor> ys(lens.size());
  std::vector<uint32_t*> ptrs(lens.size(), nullptr);
  for (size_t k = 0; k < lens.size(); ++k) {
    if (!wanted.empty() && !wanted[k]) continue;
    Shape s = x.shape();
    s[v.axis] = lens[k];
    ys[k] = Tensor::empty(s, x.dtype(), x.device());
    if (ys[k].numel() > 0) ptrs[k] = static_cast<uint32_t*>(ys[k].raw());
  }
  if (x.numel() > 0) {
    auto fn = on_cuda(x) ? cuda::split : cpu::split;
    fn(static_cast<const uint32_t*>(x.raw()), v.outer, v.inner, static_cast<int>(lens.size()),
       lens.data(), ptrs.data());
  }
  return ys;
}

}  // namespace clustr
