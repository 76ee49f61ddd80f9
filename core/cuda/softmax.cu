// CUDA softmax and log-softmax over the last axis, forward and backward; the twins of
// core/cpu/softmax.cpp (forward) and core/cpu/nn.cpp (backward). Each row is one block: its
// threads stride over the row and block_reduce (core/cuda/kernel.h) combines their partials in
// a fixed tree; sums accumulate in double, as on the CPU, so the two backends differ only in
// the order of double additions. Every per-element formula comes from core/math.h.
//
// Legend: rows, cols of x (the softmax runs over cols).
#include <cmath>
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/math.h"

namespace clustr::cuda {

namespace {

// Per row r of x (rows, cols): m = max, s = sum exp(x - m) (double); softmax exp(x - m) / s or
// log-softmax x - m - log(s). A fully masked row (m = -inf) gives 0 / -inf, as on the CPU;
// every thread sees the same m, so the branch is taken by the whole block.
struct SoftmaxKernel {
  static constexpr bool kUsesBarrier = true;
  const float* x;
  float* y;
  int64_t rows, cols;
  bool as_log;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    for (int64_t r = t.block_idx().x; r < rows; r += t.grid_dim().x) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      float m = -INFINITY;
      for (int64_t j = tid; j < cols; j += nt) m = math::Maximum{}(m, xr[j]);
      m = block_reduce(t, m, t.shared<float>(), math::Maximum{});
      if (math::fully_masked(m)) {
        for (int64_t j = tid; j < cols; j += nt) yr[j] = as_log ? -INFINITY : 0.0f;
        continue;
      }
      double acc = 0.0;
      for (int64_t j = tid; j < cols; j += nt) acc += math::exp(xr[j] - m);
      const double s = block_reduce(t, acc, t.shared<double>(), AddDouble{});
      if (as_log) {
        const float log_s = static_cast<float>(::log(s));
        for (int64_t j = tid; j < cols; j += nt) yr[j] = math::log_softmax_value(xr[j], m, log_s);
      } else {
        const float inv = static_cast<float>(1.0 / s);  // s >= 1: the max itself contributes 1
        for (int64_t j = tid; j < cols; j += nt) yr[j] = math::exp(xr[j] - m) * inv;
      }
    }
  }
};

void softmax_like(const char* name, const float* x, float* y, int64_t rows, int64_t cols,
                  bool as_log) {
  if (rows == 0 || cols == 0) return;
  require(name);
  const unsigned threads = row_threads(cols);
  launch(name, {row_blocks(rows)}, {threads}, threads * sizeof(double),
         SoftmaxKernel{x, y, rows, cols, as_log});
}

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

}  // namespace

void softmax(const float* x, float* y, int64_t rows, int64_t cols) {
  softmax_like("cuda::softmax", x, y, rows, cols, false);
}

void log_softmax(const float* x, float* y, int64_t rows, int64_t cols) {
  softmax_like("cuda::log_softmax", x, y, rows, cols, true);
}

// y, dy, dx (rows, cols).
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  softmax_backward_like("cuda::softmax_backward", y, dy, dx, rows, cols, false);
}
void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows,
                          int64_t cols) {
  softmax_backward_like("cuda::log_softmax_backward", y, dy, dx, rows, cols, true);
}

}  // namespace clustr::cuda
