// CUDA kernels of the nn ops; the twins of core/cpu/nn.cpp: the unary derivatives, softmax and
// log-softmax backward, and dropout. Layer norm is in core/cuda/layer_norm.cu, cross-entropy in
// core/cuda/cross_entropy.cu. Every per-element formula comes from core/math.h.
//
// Legend: n elements; rows, cols of a softmax.
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/math.h"
#include "core/philox.h"

namespace clustr::cuda {

namespace {

struct AddDouble {
  CLUSTR_HD double operator()(double a, double b) const { return a + b; }
};

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

// Per row r of y, dy, dx (rows, cols), one block per row: s = sum(dy * y) for softmax, sum(dy)
// for log-softmax, in double over a block_reduce (the CPU sums the same terms in double in
// another order), then dx = math::softmax_dx / math::log_softmax_dx per element.
struct SoftmaxBackwardKernel {
  static constexpr bool kUsesBarrier = true;
  const float* y;
  const float* dy;
  float* dx;
  int64_t rows, cols;
  bool as_log;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    for (int64_t r = t.block_idx().x; r < rows; r += t.grid_dim().x) {
      const float* yr = y + r * cols;
      const float* gr = dy + r * cols;
      float* out = dx + r * cols;
      double acc = 0.0;
      for (int64_t j = tid; j < cols; j += nt)
        acc += as_log ? double(gr[j]) : double(gr[j]) * yr[j];
      const float s = static_cast<float>(block_reduce(t, acc, t.shared<double>(), AddDouble{}));
      for (int64_t j = tid; j < cols; j += nt)
        out[j] =
            as_log ? math::log_softmax_dx(yr[j], gr[j], s) : math::softmax_dx(yr[j], gr[j], s);
    }
  }
};

void softmax_backward_like(const char* name, const float* y, const float* dy, float* dx,
                           int64_t rows, int64_t cols, bool as_log) {
  if (rows == 0 || cols == 0) return;
  require(name);
  const unsigned threads = row_threads(cols);
  launch(name, {row_blocks(rows)}, {threads}, threads * sizeof(double),
         SoftmaxBackwardKernel{y, dy, dx, rows, cols, as_log});
}

// Element i keeps with probability 1 - p from word i % 4 of Philox block offset + i / 4 of the
// stream `seed`, exactly as cpu::dropout: one thread per Philox block, so each block of four
// random words is computed once. The mask is integer arithmetic and one float compare, so it is
// the same bits on both devices.
struct DropoutKernel {
  static constexpr bool kUsesBarrier = false;
  const float* x;
  float p, scale;
  uint64_t seed, offset;
  float* y;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t blocks = (n + 3) / 4;
    for (int64_t b = global_x(t); b < blocks; b += grid_stride_x(t)) {
      const Philox4 bits = philox4x32(seed, offset + static_cast<uint64_t>(b));
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

// y, dy, dx (rows, cols).
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  softmax_backward_like("cuda::softmax_backward", y, dy, dx, rows, cols, false);
}
void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows,
                          int64_t cols) {
  softmax_backward_like("cuda::log_softmax_backward", y, dy, dx, rows, cols, true);
}

// x, y (n).
void dropout(const float* x, float p, uint64_t seed, uint64_t offset, float* y, int64_t n) {
  if (n == 0) return;
  require("cuda::dropout");
  const float scale = 1.0f / (1.0f - p);
  launch("cuda::dropout", {elementwise_blocks(n, 4)}, {kElementwiseThreads}, 0,
         DropoutKernel{x, p, scale, seed, offset, y, n});
}

}  // namespace clustr::cuda
