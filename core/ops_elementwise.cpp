// Front doors of the element-wise ops: binary ops with NumPy broadcasting, ops with a scalar,
// unary ops and the in-place add_. Each validates, allocates the result on the inputs' device
// and calls the kernel (core/cpu/elementwise.cpp).
#include <vector>

#include "core/cpu/kernels.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops_check.h"

namespace clustr {

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
  }
  throw Error(detail::cat("binary: unknown BinaryOp value ", static_cast<int>(op)));
}

const char* op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: return "neg";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::abs: return "abs";
    case UnaryOp::relu: return "relu";
    case UnaryOp::gelu: return "gelu";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
  }
  throw Error(detail::cat("unary: unknown UnaryOp value ", static_cast<int>(op)));
}

namespace {

// Strides of a tensor of shape s read as the rank-r broadcast result: s is aligned at the
// right, and an axis that s lacks or has with size 1 gets stride 0 (the same element repeats).
std::vector<int64_t> broadcast_strides(const Shape& s, size_t r) {
  std::vector<int64_t> out(r, 0);
  const std::vector<int64_t> st = contiguous_strides(s);
  const size_t lead = r - s.size();
  for (size_t i = 0; i < s.size(); ++i) out[lead + i] = s[i] == 1 ? 0 : st[i];
  return out;
}

}  // namespace

// a (shape_a), b (shape_b) -> out (broadcast_shapes(shape_a, shape_b)).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  detail::check_f32(name, "a", a);
  detail::check_f32(name, "b", b);
  detail::check_same_device(name, a, b);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, DType::f32, a.device());
  if (out.numel() == 0) return out;
  const std::vector<int64_t> sa = broadcast_strides(a.shape(), shape.size());
  const std::vector<int64_t> sb = broadcast_strides(b.shape(), shape.size());
  auto fn = a.device() == Device::cuda ? cuda::binary : cpu::binary;
  fn(op, static_cast<int>(shape.size()), shape.data(), a.f32(), sa.data(), b.f32(), sb.data(),
     out.f32());
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::minimum, a, b); }

// a (any shape) -> out (same shape), out = a op s.
Tensor binary_scalar(BinaryOp op, const Tensor& a, float s) {
  const char* name = op_name(op);
  detail::check_f32(name, "a", a);
  Tensor out = Tensor::empty(a.shape(), DType::f32, a.device());
  auto fn = a.device() == Device::cuda ? cuda::binary_scalar : cpu::binary_scalar;
  if (out.numel() > 0) fn(op, a.f32(), s, out.f32(), out.numel());
  return out;
}

Tensor add(const Tensor& a, float s) { return binary_scalar(BinaryOp::add, a, s); }
Tensor mul(const Tensor& a, float s) { return binary_scalar(BinaryOp::mul, a, s); }

// x (any shape) -> y (same shape).
Tensor unary(UnaryOp op, const Tensor& x) {
  const char* name = op_name(op);
  detail::check_f32(name, "x", x);
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  auto fn = x.device() == Device::cuda ? cuda::unary : cpu::unary;
  if (y.numel() > 0) fn(op, x.f32(), y.f32(), y.numel());
  return y;
}

Tensor neg(const Tensor& x) { return unary(UnaryOp::neg, x); }
Tensor exp(const Tensor& x) { return unary(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::sqrt, x); }
Tensor relu(const Tensor& x) { return unary(UnaryOp::relu, x); }
Tensor gelu(const Tensor& x) { return unary(UnaryOp::gelu, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::tanh, x); }

// dst (shape), src (shape): dst += alpha * src. No broadcasting: a gradient that arrives with
// the wrong shape is a bug upstream, and summing it in silently would hide it.
void add_(Tensor& dst, const Tensor& src, float alpha) {
  detail::check_f32("add_", "dst", dst);
  detail::check_f32("add_", "src", src);
  detail::check_same_device("add_", dst, src);
  CLUSTR_CHECK(dst.shape() == src.shape(), "add_: expected src of the same shape as dst ",
               to_string(dst.shape()), ", got src ", describe(src));
  auto fn = dst.device() == Device::cuda ? cuda::axpy : cpu::axpy;
  if (dst.numel() > 0) fn(alpha, src.f32(), dst.f32(), dst.numel());
}

}  // namespace clustr
