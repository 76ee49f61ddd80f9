// CUDA kernels of the nn ops; the twins of core/cpu/nn.cpp: the unary derivatives and dropout.
// Softmax is in core/cuda/softmax.cu, layer norm in core/cuda/layer_norm.cu, cross-entropy in
// core/cuda/cross_entropy.cu. Every per-element formula comes from core/math.h.
//
// Legend: n elements.
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/math.h"
#include "core/philox.h"

namespace clustr::cuda {

namespace {

// Calls fn(functor) with the derivative functor of op (core/math.h), as core/cpu/nn.cpp does.
template <class Fn>
void with_unary_grad(UnaryOp op, Fn&& fn) {
  switch (op) {
    case UnaryOp::neg: return fn(math::NegGrad{});
    case UnaryOp::exp: return fn(math::ExpGrad{});
    case UnaryOp::log: return fn(math::LogGrad{});
    case UnaryOp::sqrt: return fn(math::SqrtGrad{});
    case UnaryOp::abs: return fn(math::AbsGrad{});
    case UnaryOp::relu: return fn(math::ReluGrad{});
    case UnaryOp::gelu: return fn(math::GeluGrad{});
    case UnaryOp::tanh: return fn(math::TanhGrad{});
    case UnaryOp::sigmoid: return fn(math::SigmoidGrad{});
  }
  throw Error(detail::cat("cuda::unary_backward: unknown UnaryOp value ", static_cast<int>(op)));
}

// dx = f(x, y, dy) per element. The pointer that the formula does not read may be null; the
// choice is made at compile time (F::kUsesX, F::kUsesY), so it is never dereferenced.
template <class F>
struct UnaryGradKernel {
  static constexpr bool kUsesBarrier = false;
  F f;
  const float* x;
  const float* y;
  const float* dy;
  float* dx;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t))
      dx[i] = f(F::kUsesX ? x[i] : 0.0f, F::kUsesY ? y[i] : 0.0f, dy[i]);
  }
};

// Element i keeps with probability 1 - p from word i % 4 of Philox block offset + i / 4 of the
// stream `seed`, exactly as cpu::dropout: one thread per Philox block, so each block of four
// random words is computed once. The mask is integer arithmetic and one float compare, so it is
// the same bits on both devices.
struct DropoutKernel {
  static constexpr bool kUsesBarrier = false;
  const float* x;
  float p, scale;
  uint64_t seed;
  PhiloxOffset offset;  // read once per thread (from device memory when `at`)
  float* y;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t blocks = (n + 3) / 4;
    const uint64_t first = offset.get();
    for (int64_t b = global_x(t); b < blocks; b += grid_stride_x(t)) {
      const Philox4 bits = philox4x32(seed, first + static_cast<uint64_t>(b));
      const int64_t i0 = 4 * b, len = n - i0 < 4 ? n - i0 : 4;
      for (int64_t k = 0; k < len; ++k)
        y[i0 + k] = math::dropout_value(x[i0 + k], bits.v[k], p, scale);
    }
  }
};

}  // namespace

// x, y, dy, dx (n); x or y may be null when the derivative does not read it.
void unary_backward(UnaryOp op, const float* x, const float* y, const float* dy, float* dx,
                    int64_t n) {
  if (n == 0) return;
  require("cuda::unary_backward");
  with_unary_grad(op, [&](auto f) {
    launch("cuda::unary_backward", {elementwise_blocks(n)}, {kElementwiseThreads}, 0,
           UnaryGradKernel<decltype(f)>{f, x, y, dy, dx, n});
  });
}

// x, y (n).
void dropout(const float* x, float p, uint64_t seed, PhiloxOffset offset, float* y, int64_t n) {
  if (n == 0) return;
  require("cuda::dropout");
  const float scale = 1.0f / (1.0f - p);
  launch("cuda::dropout", {elementwise_blocks(n, 4)}, {kElementwiseThreads}, 0,
         DropoutKernel{x, p, scale, seed, offset, y, n});
}

}  // namespace clustr::cuda
