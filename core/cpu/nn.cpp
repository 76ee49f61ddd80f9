// CPU kernels of the nn ops (see core/cpu/nn.h for shapes): the unary derivatives,
// cross-entropy forward and backward, and dropout (softmax's backward is in
// core/cpu/softmax.cpp, layer norm in core/cpu/layer_norm.cpp). The per-element formulas live in
// core/math.h. Row sums are accumulated in double over 8 partial sums in a fixed order
// (row_sum.h), so a row's result is the same whichever thread computes it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/nn.h"
#include "core/cpu/row_sum.h"
#include "core/math.h"
#include "core/philox.h"

namespace clustr::cpu {

namespace {

constexpr int64_t kParallelMin = 16384;  // elements; below this a parallel region costs more

// NaN-propagating, so that a row holding a NaN gives NaN rather than passing as masked.
float row_max(const float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = math::Maximum{}(m, x[j]);
  return m;
}

// Calls fn(functor) with the derivative functor of op (core/math.h).
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
}

}  // namespace

UnaryGradInputs unary_grad_inputs(UnaryOp op) {
  UnaryGradInputs in;
  with_unary_grad(op, [&](auto f) {
    in.x = decltype(f)::kUsesX;
    in.y = decltype(f)::kUsesY;
  });
  return in;
}

void unary_backward(UnaryOp op, const float* x, const float* y, const float* dy, float* dx,
                    int64_t n) {
  with_unary_grad(op, [&](auto f) {
    using F = decltype(f);
    // The pointer that the formula does not read may be null; the branch is decided at
    // compile time, so it is never dereferenced.
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i)
      dx[i] = f(F::kUsesX ? x[i] : 0.0f, F::kUsesY ? y[i] : 0.0f, dy[i]);
  });
}

CrossEntropySums cross_entropy(const float* logits, const int32_t* target, const float* weight,
                               int32_t ignore_index, float* lse, int64_t R, int64_t V) {
  // Per-row terms, summed below in row order so the total does not depend on the threads.
  std::vector<double> row_loss(static_cast<size_t>(R)), row_weight(static_cast<size_t>(R));
#pragma omp parallel for schedule(static) if (R * V >= kParallelMin)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = logits + r * V;
    // logsumexp = m + log(sum exp(x - m)): every exp is <= 1, so logits of 1e4 do not overflow.
    const float m = row_max(xr, V);
    double log_s = 0;
    if (!math::fully_masked(m))
      log_s = std::log(row_sum(V, [&](int64_t j) { return double(math::exp(xr[j] - m)); }));
    lse[r] = math::cross_entropy_lse(m, log_s);
    const int32_t t = target[r];
    const double w = math::cross_entropy_weight(t, ignore_index, weight, r);
    row_weight[static_cast<size_t>(r)] = w;
    row_loss[static_cast<size_t>(r)] =
        w == 0.0 ? 0.0 : math::cross_entropy_row_loss(w, m, xr[t], log_s);
  }
  CrossEntropySums sums;
  for (int64_t r = 0; r < R; ++r) {
    sums.loss += row_loss[static_cast<size_t>(r)];
    sums.weight += row_weight[static_cast<size_t>(r)];
  }
  return sums;
}

void cross_entropy_backward(float scale, const float* logits, const int32_t* target,
                            const float* weight, const float* lse, int32_t ignore_index,
                            float* dlogits, int64_t R, int64_t V) {
#pragma omp parallel for schedule(static) if (R * V >= kParallelMin)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = logits + r * V;
    float* out = dlogits + r * V;
    const int32_t t = target[r];
    const float w = math::cross_entropy_weight(t, ignore_index, weight, r);
    if (w == 0.0f) {
      std::fill(out, out + V, 0.0f);
      continue;
    }
    const float sc = scale * w, l = lse[r];
    // The target column is redone after the loop, which then has no per-element test and
    // vectorises.
    for (int64_t j = 0; j < V; ++j) out[j] = math::cross_entropy_dlogit(xr[j], l, false, sc);
    out[t] = math::cross_entropy_dlogit(xr[t], l, true, sc);
  }
}

void dropout(const float* x, float p, uint64_t seed, uint64_t offset, float* y, int64_t n) {
  const int64_t blocks = (n + 3) / 4;
  const float scale = 1.0f / (1.0f - p);
  // Philox costs about as much as the rest together, so parallelise earlier than elsewhere.
#pragma omp parallel for schedule(static) if (n >= kParallelMin / 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 bits = philox4x32(seed, offset + static_cast<uint64_t>(b));
    const int64_t i0 = 4 * b, len = std::min<int64_t>(4, n - i0);
    for (int64_t k = 0; k < len; ++k)
      y[i0 + k] = math::dropout_value(x[i0 + k], bits.v[k], p, scale);
  }
}

}  // namespace clustr::cpu
