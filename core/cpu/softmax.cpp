// CPU softmax and log-softmax over the last axis, forward and backward: x, y, dy, dx (rows,
// cols), one row per thread.
//
// Per row: the max m (so every exp(x - m) <= 1 and nothing overflows, even for x = 1e30);
// y = exp(x - m); s = sum(y); then y = y / s, or y = x - m - log(s). Each pass is a simple loop
// that vectorises (math::exp is branch-free), and y doubles as scratch for log-softmax. s is
// accumulated in double in a fixed lane order, so a row's result does not depend on the thread
// count.
//
// A fully masked row (every entry -inf) has m = -inf and would give (-inf) - (-inf) = NaN; it
// is written as softmax 0 and log-softmax -inf instead (see core/ops.h).
#include <cmath>

#include "core/cpu/kernels.h"
#include "core/cpu/row_sum.h"
#include "core/math.h"

namespace clustr::cpu {

namespace {

constexpr int64_t kParallelMin = 16384;  // elements; below this a parallel region costs more
constexpr int kLanes = 8;                // independent partial sums (ILP, SIMD)

// NaN-propagating, so that a row holding a NaN gives NaN rather than passing as masked.
float row_max(const float* x, int64_t cols) {
  float m[kLanes];
  for (int k = 0; k < kLanes; ++k) m[k] = -INFINITY;
  int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes)
    for (int k = 0; k < kLanes; ++k) m[k] = math::Maximum{}(m[k], x[j + k]);
  for (; j < cols; ++j) m[0] = math::Maximum{}(m[0], x[j]);
  for (int k = 1; k < kLanes; ++k) m[0] = math::Maximum{}(m[0], m[k]);
  return m[0];
}

// y = exp(x - m); returns sum(y) in double. m is finite or NaN.
double exp_shifted(const float* x, float m, float* y, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) y[j] = math::exp(x[j] - m);
  double acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += y[j + k];
  for (int k = 0; j < cols; ++j, ++k) acc[k] += y[j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

void softmax(const float* x, float* y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float m = row_max(xr, cols);
    if (math::fully_masked(m)) {
      for (int64_t j = 0; j < cols; ++j) yr[j] = 0.0f;
      continue;
    }
    const double s = exp_shifted(xr, m, yr, cols);
    const float inv = static_cast<float>(1.0 / s);  // s >= 1: the max itself contributes 1
    for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
  }
}

void log_softmax(const float* x, float* y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float m = row_max(xr, cols);
    if (math::fully_masked(m)) {
      for (int64_t j = 0; j < cols; ++j) yr[j] = -INFINITY;
      continue;
    }
    const float log_s = static_cast<float>(std::log(exp_shifted(xr, m, yr, cols)));
    for (int64_t j = 0; j < cols; ++j) yr[j] = math::log_softmax_value(xr[j], m, log_s);
  }
}

void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* gr = dy + r * cols;
    float* out = dx + r * cols;
    const float s =
        static_cast<float>(row_sum(cols, [&](int64_t j) { return double(gr[j]) * yr[j]; }));
    for (int64_t j = 0; j < cols; ++j) out[j] = math::softmax_dx(yr[j], gr[j], s);
  }
}

void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows,
                          int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* gr = dy + r * cols;
    float* out = dx + r * cols;
    const float s = static_cast<float>(row_sum(cols, [&](int64_t j) { return double(gr[j]); }));
    for (int64_t j = 0; j < cols; ++j) out[j] = math::log_softmax_dx(yr[j], gr[j], s);
  }
}

}  // namespace clustr::cpu
